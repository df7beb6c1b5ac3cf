/* guard.h — admission: may a reservation of budget_mb start on this GPU now?
 *
 * Two conditions, both required (all MiB):
 *   ledger:  committed + budget <= capacity, where capacity = floor(total * reserve_factor) and
 *            committed = sum over live reservations on the GPU of max(budget, actual)
 *   reality: free - pending >= budget, where free is the GPU's real free memory (NVML or the
 *            simulated inventory) and pending = sum over live reservations of what they reserved
 *            but have not allocated yet, max(0, budget - actual) (all of budget while actual is
 *            unknown). This is what protects memory held by programs that never asked the ledger.
 * Ledger values are bounded: each budget and actual counts as at most the GPU's total, and sums
 * saturate, so crafted budgets of 2^62 block the GPU instead of wrapping to a negative total.
 * While the ledger is recovering from being moved aside (ledger.h), committed is at least what the
 * GPU reports in use by processes (their sum; the GPU's used memory when NVML cannot tell a
 * process's share), since live holders may not have re-registered yet.
 * A budget above capacity can never be admitted: TDM_ERR_NEVER_FITS, not an endless wait.
 * Reserve factor: 0.85 discrete, 0.60 unified; TANDEM_RESERVE_FACTOR overrides both (0 < f <= 1).
 */
#ifndef TANDEM_GPU_GUARD_H
#define TANDEM_GPU_GUARD_H
#include <stdbool.h>
#include <stdint.h>

#include "gpu/inventory.h"
#include "gpu/ledger.h"

typedef struct tdm_guard_view {
    double reserve_factor;
    int64_t capacity_mb;  /* floor(total * reserve_factor) */
    int64_t committed_mb; /* sum of max(budget, actual) of live reservations */
    int64_t pending_mb;   /* reserved but not yet allocated */
    int64_t free_mb;      /* real free memory */
    int64_t
        available_mb; /* the largest budget admissible now: min(cap - committed, free - pending) */
    int n_reservations;
    bool recovering;   /* the ledger was just moved aside (ledger.h recovering_until) */
    int64_t in_use_mb; /* recovering only: what the GPU reports in use by processes */
} tdm_guard_view;

double tdm_guard_reserve_factor(tdm_memory_type type);

/* Computes the view of gpu given the (pruned) ledger state. */
void tdm_guard_view_of(const tdm_gpu *gpu, const tdm_ledger_state *state, tdm_guard_view *view);

/* True when budget_mb is admissible now on a GPU with this view. */
bool tdm_guard_fits(const tdm_guard_view *view, int64_t budget_mb);

/* True when budget_mb could be admitted on gpu at all (an empty ledger, all memory free). */
bool tdm_guard_could_ever_fit(const tdm_gpu *gpu, int64_t budget_mb);

#endif
