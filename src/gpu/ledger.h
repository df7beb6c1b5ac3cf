/* ledger.h — the per-host VRAM ledger: who reserved how much memory on which GPU, and who waits.
 *
 * Files, in one directory ($TANDEM_LEDGER_DIR, else ${XDG_CACHE_HOME:-$HOME/.cache}/tandem):
 *   gpu-ledger.lock  flock() target. Never renamed, never written: the lock must stay on the same
 *                    inode for every process, which is why the data file itself is never locked
 *                    (a waiter blocked on a data file that is then replaced by rename would wake on
 *                    the old inode and overwrite the other writer's reservation: lost update).
 *   gpu-ledger.json  the data, replaced atomically (temp, fsync, rename, fsync dir).
 *
 * gpu-ledger.json (version 1), all sizes in MiB, times RFC 3339 UTC:
 *   { "version": 1,
 *     "next_ticket": 42,                       next queue ticket number (arrival order)
 *     "reservations": [ { "id": "r-host-1234-5f3a", "holders": [ {"pid": 1234, "start_time": 98765} ],
 *                         "user": "ana", "host": "ws1", "gpu_uuid": "GPU-…", "budget_mb": 8192,
 *                         "actual_mb": null | 7800, "task": "qlora-7b",
 *                         "started": "…", "lease_expires": "…" } ],
 *     "queue": [ { "ticket": 41, "holders": [...], "user": "…", "host": "…",
 *                  "gpu_uuid": "GPU-…" | null (any GPU), "budget_mb": 4096, "task": "…",
 *                  "enqueued": "…", "lease_expires": "…" } ] }
 *
 * Every mutation follows one sequence (tdm_ledger_transact): lock (bounded wait) -> read -> prune ->
 * decide (a callback) -> write temp (0600, or 0660 in a group-shared directory) -> fsync -> rename
 * -> fsync dir -> unlock. Readers that only display (gpu status) take the lock too, so they never
 * see a half-pruned state.
 *
 * Pruning: an entry whose holders on this host are all dead or recycled (proc_identity.h), or whose
 * lease has expired (the only rule for entries of other hosts sharing the directory), is removed.
 *
 * A ledger that does not parse is never silently dropped: it is renamed to
 * gpu-ledger.json.corrupt-<UTC timestamp>, a warning names it, and the transaction continues from an
 * empty ledger (admission then rests on the real free-memory check).
 */
#ifndef TANDEM_GPU_LEDGER_H
#define TANDEM_GPU_LEDGER_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "gpu/proc_identity.h"
#include "util/error.h"

#define TDM_MAX_HOLDERS 4 /* gpu run: the wrapper and its child; the trainer: itself */

typedef struct tdm_reservation {
    char id[96];
    tdm_holder holders[TDM_MAX_HOLDERS];
    int n_holders;
    char user[64];
    char host[256];
    char gpu_uuid[96];
    int64_t budget_mb;
    int64_t actual_mb; /* -1 until measured (null in JSON) */
    char task[128];
    time_t started;
    time_t lease_expires;
} tdm_reservation;

typedef struct tdm_ticket {
    int64_t ticket; /* arrival order; smaller is earlier */
    tdm_holder holders[TDM_MAX_HOLDERS];
    int n_holders;
    char user[64];
    char host[256];
    char gpu_uuid[96]; /* "" = any GPU */
    int64_t budget_mb;
    char task[128];
    time_t enqueued;
    time_t lease_expires;
} tdm_ticket;

typedef struct tdm_ledger_state {
    int64_t next_ticket;
    tdm_reservation *reservations;
    size_t n_reservations, cap_reservations;
    tdm_ticket *queue; /* kept sorted by ticket */
    size_t n_queue, cap_queue;
} tdm_ledger_state;

typedef struct tdm_ledger {
    char dir[4096];
    char data_path[4200];
    char lock_path[4200];
    int lock_fd; /* -1 when not locked */
    int64_t lock_timeout_ms;
} tdm_ledger;

/* Opens (creating 0700 when absent) the ledger directory: dir, or the default when dir is NULL.
 * Refuses a directory or ledger file that is a symbolic link. Does not lock. */
tdm_status tdm_ledger_open(tdm_ledger *ledger, const char *dir, tdm_error *err);

/* The default directory: $TANDEM_LEDGER_DIR, else ${XDG_CACHE_HOME:-$HOME/.cache}/tandem. */
tdm_status tdm_ledger_default_dir(char *buf, size_t size, tdm_error *err);

/* A decision inside a transaction. It may change state; it returns TDM_OK to commit (the state is
 * written when `*changed` is true) or an error to abort without writing (the error is returned by
 * tdm_ledger_transact). */
typedef tdm_status (*tdm_ledger_decide_fn)(tdm_ledger_state *state, bool *changed, void *user,
                                           tdm_error *err);

/* The one mutation sequence: lock -> read -> prune -> decide -> write -> unlock. Pruning alone also
 * causes a write. `decide` may be NULL (prune only). */
tdm_status tdm_ledger_transact(tdm_ledger *ledger, tdm_ledger_decide_fn decide, void *user,
                               tdm_error *err);

/* Reads a consistent snapshot under the lock (pruned in memory, nothing written). */
tdm_status tdm_ledger_snapshot(tdm_ledger *ledger, tdm_ledger_state *out, tdm_error *err);

/* State helpers. */
void tdm_ledger_state_init(tdm_ledger_state *s);
void tdm_ledger_state_free(tdm_ledger_state *s);
tdm_status tdm_ledger_state_add_reservation(tdm_ledger_state *s, const tdm_reservation *r,
                                            tdm_error *err);
tdm_status tdm_ledger_state_add_ticket(tdm_ledger_state *s, const tdm_ticket *t, tdm_error *err);
tdm_reservation *tdm_ledger_state_find_reservation(tdm_ledger_state *s, const char *id);
tdm_ticket *tdm_ledger_state_find_ticket(tdm_ledger_state *s, int64_t ticket);
bool tdm_ledger_state_remove_reservation(tdm_ledger_state *s, const char *id);
bool tdm_ledger_state_remove_ticket(tdm_ledger_state *s, int64_t ticket);

/* Removes dead/recycled holders' entries and expired leases as of `now`. Returns how many. */
size_t tdm_ledger_state_prune(tdm_ledger_state *s, time_t now, const char *this_host);

/* JSON (de)serialisation. Parse errors carry "line L, column C" from jansson. */
tdm_status tdm_ledger_state_from_json(const char *text, size_t len, tdm_ledger_state *s,
                                      tdm_error *err);
char *tdm_ledger_state_to_json(const tdm_ledger_state *s); /* malloc'd; NULL when out of memory */

/* Lease length in seconds: TANDEM_LEASE_SEC when set (tests), else 24 h. */
int64_t tdm_ledger_lease_sec(void);

#endif
