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
 *     "next_ticket": 42,                       next queue ticket number (arrival order), < 2^53
 *     "recovering_until": "…",                 only after a moved-aside ledger (see below)
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
 * gpu-ledger.json.corrupt-<UTC timestamp>-<pid>, a warning names it, and the transaction continues
 * from an empty ledger marked "recovering_until": now + tdm_ledger_recovery_sec() (written at once,
 * by gpu status too). Live holders watch the directory (inotify) and re-register as soon as the
 * data file leaves its name (reservation.h). Nothing is admitted during the first
 * TDM_LEDGER_REREGISTER_GRACE_SEC, and until the mark expires the guard also counts the memory
 * the GPU reports in use by processes (guard.h).
 *
 * Temp files ".gpu-ledger.json.tmp-PID" (util/atomic_file.h) left by a killed writer are removed by
 * the next transaction when PID is dead or recycled.
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

/* Bounds applied to every number read from the ledger file, which any user of a shared directory
 * (or a crash, or a disk error) may have changed. MiB values are clamped to TDM_LEDGER_MAX_MB
 * (2^40 MiB, an exabyte: sums of millions stay far from int64 overflow); the guard further counts
 * a budget as at most its GPU's total. Ticket numbers stay below 2^53 (exact in a double, so any
 * JSON reader handles them); next_ticket may equal it only when no ticket can be issued. */
#define TDM_LEDGER_MAX_MB ((int64_t)1 << 40)
#define TDM_LEDGER_TICKET_LIMIT ((int64_t)1 << 53)
/* Clock difference tolerated between hosts sharing a ledger directory (s): a foreign-host lease
 * ending later than now + lease length + this is treated as expired. */
#define TDM_LEDGER_CLOCK_SKEW_SEC 300

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
    /* 0, or until when (Unix time) the ledger is recovering from being moved aside: live holders
     * are re-registering, so the ledger alone under-counts and the guard also counts the memory
     * the GPU reports in use by processes (guard.h). */
    time_t recovering_until;
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

/* Issues the next ticket number into *ticket (advancing next_ticket). When the numbers are
 * exhausted (a hostile next_ticket) and the queue is empty they restart at 1; with a queue,
 * TDM_ERR_CORRUPT naming the limit. */
tdm_status tdm_ledger_state_take_ticket(tdm_ledger_state *s, int64_t *ticket, tdm_error *err);

/* True during the first TDM_LEDGER_REREGISTER_GRACE_SEC seconds after the ledger was moved aside:
 * live holders, woken by the move, are writing their reservations back, so nothing is admitted
 * yet (a holder that has not allocated its memory shows in no GPU figure). */
#define TDM_LEDGER_REREGISTER_GRACE_SEC 2
bool tdm_ledger_state_settling(const tdm_ledger_state *s, time_t now);

/* Removes dead/recycled holders' entries and expired leases as of `now`, and bounds the times:
 * a lease of this host ending after now + lease length is cut to that; a lease of another host
 * ending after now + lease length + TDM_LEDGER_CLOCK_SKEW_SEC counts as expired (a crafted lease in
 * year 9999 would otherwise hold the memory forever); recovering_until is cut to now + recovery
 * length and cleared once past. Returns how many entries were removed. */
size_t tdm_ledger_state_prune(tdm_ledger_state *s, time_t now, const char *this_host);

/* JSON (de)serialisation. Parse errors carry "line L, column C" from jansson. */
tdm_status tdm_ledger_state_from_json(const char *text, size_t len, tdm_ledger_state *s,
                                      tdm_error *err);
char *tdm_ledger_state_to_json(const tdm_ledger_state *s); /* malloc'd; NULL when out of memory */

/* Lease length in seconds: TANDEM_LEASE_SEC when set (tests), else 24 h. */
int64_t tdm_ledger_lease_sec(void);

/* How long a ledger stays "recovering" after it was moved aside (s): the renewal period
 * (TANDEM_RENEW_SEC, default 300), the longest a live holder that missed the wake-up takes to
 * re-register. */
int64_t tdm_ledger_recovery_sec(void);

#endif
