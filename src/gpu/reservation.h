/* reservation.h — the library API a GPU program (tandem finetune, tandem gpu run) calls before it
 * allocates device memory: acquire (waiting in the FIFO queue if needed), report the measured
 * usage, renew the lease, release. Calling sequence:
 *
 *     tdm_lease lease;
 *     tdm_acquire_opts o = tdm_acquire_defaults();
 *     o.budget_mb = 8192; o.task = "qlora-7b";
 *     if (tdm_reservation_acquire(&lease, &o, &err) != TDM_OK) ...;  // TDM_ERR_TIMEOUT -> exit 75
 *     tdm_reservation_release_at_exit(&lease);     // released even on exit() paths
 *     ... cudaSetDevice(the GPU whose UUID is lease.gpu_uuid); allocate ...
 *     tdm_reservation_update_actual(&lease, measured_mb, &err);
 *     every few minutes: tdm_reservation_renew(&lease, &err);   (tdm_reservation_renew_due tells)
 *     and whenever tdm_reservation_watch_open's descriptor is readable:
 * tdm_reservation_watch_handle tdm_reservation_release(&lease, &err);
 *
 * A process killed with SIGKILL releases nothing itself: the next ledger transaction of any tandem
 * process prunes its reservation, because its holders are dead (ledger.h).
 */
#ifndef TANDEM_GPU_RESERVATION_H
#define TANDEM_GPU_RESERVATION_H
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "gpu/ledger.h"
#include "util/error.h"

typedef struct tdm_wait_report {
    int position;         /* 1-based place in the best GPU's line (1 = next) */
    int64_t needed_mb;
    int64_t available_mb; /* the most any candidate GPU could admit now */
    double elapsed_sec;
    char gpu_uuid[96];    /* the candidate GPU the figures refer to */
} tdm_wait_report;

typedef void (*tdm_wait_report_fn)(const tdm_wait_report *report, void *user);

typedef struct tdm_acquire_opts {
    int64_t budget_mb;          /* required, > 0 */
    const char *gpu;            /* UUID, UUID prefix or index; NULL = the GPU with most room */
    const char *task;           /* shown in gpu status */
    bool wait;                  /* false: fail with TDM_ERR_BUSY instead of queueing */
    double timeout_sec;         /* waiting limit; then TDM_ERR_TIMEOUT */
    double report_interval_sec; /* how often `report` is called while waiting */
    tdm_wait_report_fn report;
    void *report_user;
    volatile sig_atomic_t *cancel; /* set non-zero (from a signal handler) to stop waiting */
    const char *ledger_dir;        /* NULL: the default directory */
    pid_t extra_holder;            /* > 0: a second holder recorded atomically with the caller
                                      (gpu run's child, forked and held back until admission) */
} tdm_acquire_opts;

typedef struct tdm_lease {
    tdm_ledger ledger;
    char id[96];
    char gpu_uuid[96];
    char gpu_name[96];
    int gpu_index;
    int64_t budget_mb;
    int64_t actual_mb;
    char task[128];
    tdm_holder holders[TDM_MAX_HOLDERS];
    int n_holders;
    time_t started;
    int64_t renewed_mono_ns;
    bool held;
} tdm_lease;

tdm_acquire_opts tdm_acquire_defaults(void);

/* Reserves opts->budget_mb on a GPU, queueing in arrival order when it does not fit now (unless
 * !opts->wait). Errors: TDM_ERR_NEVER_FITS (larger than any candidate's capacity), TDM_ERR_BUSY
 * (no wait, or cancelled), TDM_ERR_TIMEOUT, TDM_ERR_NOT_FOUND (no such GPU / no GPU at all),
 * I/O errors of the ledger. On error no ticket or reservation of this call remains. */
tdm_status tdm_reservation_acquire(tdm_lease *lease, const tdm_acquire_opts *opts,
                                   tdm_error *err);

/* Adds pid (e.g. gpu run's child) as a holder: the reservation lives while any holder lives. */
tdm_status tdm_reservation_add_holder(tdm_lease *lease, pid_t pid, tdm_error *err);

/* Records the measured device memory (MiB). */
tdm_status tdm_reservation_update_actual(tdm_lease *lease, int64_t actual_mb, tdm_error *err);

/* Pushes lease_expires to now + lease length. If the reservation vanished from the ledger (moved
 * aside as corrupt, say) it is written back: the memory is still in use. */
tdm_status tdm_reservation_renew(tdm_lease *lease, tdm_error *err);
/* True when the lease is due for renewal (every TANDEM_RENEW_SEC, default 300 s). */
bool tdm_reservation_renew_due(const tdm_lease *lease);

/* Re-registration after the ledger was moved aside (ledger.h). A holder polls the descriptor from
 * tdm_reservation_watch_open (an inotify watch of the ledger directory; -1 when inotify is
 * unavailable, leaving only the periodic renewal) and calls tdm_reservation_watch_handle when it is
 * readable: when the data file was moved away or deleted, the reservation is written back at once
 * (as tdm_reservation_renew does), instead of up to TANDEM_RENEW_SEC later; *reregistered tells. */
int tdm_reservation_watch_open(const tdm_lease *lease);
tdm_status tdm_reservation_watch_handle(tdm_lease *lease, int fd, bool *reregistered,
                                        tdm_error *err);

/* Resizing a held reservation (a co-training host whose adapters join and leave), one ledger
 * transaction per call, never blocking:
 *   budget_mb <= the lease's budget: the reservation shrinks to it at once (*granted);
 *   larger: the growth (budget_mb minus the current budget) is admitted on the lease's GPU by the
 *   rules of a new reservation of that size pinned to it (guard.h, wait_queue.h): in arrival
 *   order with every other waiter. When it is not admissible now and wait is true, a ticket of
 *   the growth's size joins the queue (*ticket, kept between calls: call again, e.g. at every
 *   training step, with the same *ticket, until *granted) and *report says where it stands;
 *   when wait is false, TDM_ERR_BUSY. TDM_ERR_NEVER_FITS when budget_mb can never fit the GPU.
 * The lease's budget follows the ledger. On an error, no ticket of this resize remains.
 * tdm_reservation_resize_cancel drops a waiting ticket (the join went away). */
tdm_status tdm_reservation_resize(tdm_lease *lease, int64_t budget_mb, bool wait, int64_t *ticket,
                                  bool *granted, tdm_wait_report *report, tdm_error *err);
void tdm_reservation_resize_cancel(tdm_lease *lease, int64_t *ticket);

tdm_status tdm_reservation_release(tdm_lease *lease, tdm_error *err);

/* Registers lease to be released by an atexit handler (at most 8 leases per process). The lease
 * must stay valid until it is released (tdm_reservation_release unregisters it) or the process
 * exits. */
void tdm_reservation_release_at_exit(tdm_lease *lease);

/* The most --vram takes, GiB: more than any GPU has, and its MiB stay far inside an int64. */
#define TDM_VRAM_MAX_GIB 1e6

/* --vram GB of gpu run, finetune and eval: a positive decimal number of GiB (fractions allowed)
 * up to TDM_VRAM_MAX_GIB; with allow_auto, "auto" too (stored as 0). Hex, inf and nan, which
 * strtod would read, are refused. TDM_ERR_INVALID, err's message "needs a positive number ..."
 * or "'X' GiB is too large: ...", to follow the flag's name. */
tdm_status tdm_vram_gib_parse(const char *s, bool allow_auto, double *gib, tdm_error *err);

#endif
