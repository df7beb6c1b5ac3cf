/* lease_keeper.h — keeps a held lease alive from a background thread, for programs whose main
 * thread is busy for hours (tandem finetune, eval): `gpu run` does the same from its own poll loop.
 *
 * The keeper thread (signals blocked, so the CLI's handlers run on the main thread):
 *   - renews the lease whenever it is due (tdm_reservation_renew_due: every TANDEM_RENEW_SEC), so
 *     a run longer than one lease keeps its memory;
 *   - re-registers the reservation at once when the ledger's data file is moved aside or deleted
 *     (tdm_reservation_watch_open / _handle: inotify), so a quarantined ledger does not forget
 *     this run until its next renewal (issue 13, item 6).
 * The main thread reaches the lease only through tdm_lease_keeper_update_actual while the keeper
 * runs; tdm_lease_keeper_stop joins the thread and leaves the lease held for the caller to
 * release.
 *
 *     tdm_lease_keeper *k = NULL;
 *     tdm_lease_keeper_start(&k, &lease, &err);
 *     ... tdm_lease_keeper_update_actual(k, mb);
 *     tdm_lease_keeper_stop(k);  tdm_reservation_release(&lease, &err);
 */
#ifndef TANDEM_GPU_LEASE_KEEPER_H
#define TANDEM_GPU_LEASE_KEEPER_H
#include <stdbool.h>
#include <stdint.h>

#include "gpu/reservation.h"
#include "util/error.h"

typedef struct tdm_lease_keeper tdm_lease_keeper;

/* Starts the keeper of a held lease (which must outlive it). TDM_ERR_NOMEM / TDM_ERR_IO when the
 * thread cannot start; the lease is untouched then. */
tdm_status tdm_lease_keeper_start(tdm_lease_keeper **out, tdm_lease *lease, tdm_error *err);

/* Records the measured memory (MiB) under the keeper's lock. */
tdm_status tdm_lease_keeper_update_actual(tdm_lease_keeper *k, int64_t actual_mb, tdm_error *err);

/* tdm_reservation_resize of the kept lease under the keeper's lock. */
tdm_status tdm_lease_keeper_resize(tdm_lease_keeper *k, int64_t budget_mb, bool wait,
                                   int64_t *ticket, bool *granted, tdm_wait_report *report,
                                   tdm_error *err);

void tdm_lease_keeper_resize_cancel(tdm_lease_keeper *k, int64_t *ticket);

/* Stops and frees the keeper (NULL accepted); the lease stays held. */
void tdm_lease_keeper_stop(tdm_lease_keeper *k);

#endif
