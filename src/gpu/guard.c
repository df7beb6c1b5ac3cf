#include "gpu/guard.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

double tdm_guard_reserve_factor(tdm_memory_type type)
{
    const char *s = getenv("TANDEM_RESERVE_FACTOR");
    if (s && *s) {
        char *end;
        double f = strtod(s, &end);
        if (!*end && f > 0.0 && f <= 1.0)
            return f;
    }
    return type == TDM_MEMORY_UNIFIED ? 0.60 : 0.85;
}

static int64_t capacity_of(const tdm_gpu *gpu, double factor)
{
    return (int64_t)floor((double)gpu->total_mb * factor);
}

/* a + b for a, b >= 0, saturated at INT64_MAX. */
static int64_t add_sat(int64_t a, int64_t b)
{
    return a > INT64_MAX - b ? INT64_MAX : a + b;
}

/* v within [0, max]: a ledger value (possibly crafted) counted as at most the GPU's total. */
static int64_t clamp_mb(int64_t v, int64_t max)
{
    return v < 0 ? 0 : v > max ? max : v;
}

/* Memory the GPU reports in use by its processes (MiB); the GPU's whole used memory when NVML
 * cannot tell some process's share. */
static int64_t used_by_processes(const tdm_gpu *gpu)
{
    int64_t sum = 0;
    for (size_t i = 0; i < gpu->n_processes; i++) {
        if (gpu->processes[i].used_mb < 0)
            return gpu->used_mb > 0 ? gpu->used_mb : 0;
        sum = add_sat(sum, gpu->processes[i].used_mb);
    }
    return sum;
}

void tdm_guard_view_of(const tdm_gpu *gpu, const tdm_ledger_state *state, tdm_guard_view *view)
{
    memset(view, 0, sizeof *view);
    view->reserve_factor = tdm_guard_reserve_factor(gpu->memory_type);
    view->capacity_mb = capacity_of(gpu, view->reserve_factor);
    view->free_mb = gpu->free_mb;
    int64_t total = gpu->total_mb > 0 ? gpu->total_mb : 0;
    for (size_t i = 0; i < state->n_reservations; i++) {
        const tdm_reservation *r = &state->reservations[i];
        if (strcmp(r->gpu_uuid, gpu->uuid) != 0)
            continue;
        int64_t budget = clamp_mb(r->budget_mb, total);
        int64_t actual = clamp_mb(r->actual_mb, total);
        view->committed_mb = add_sat(view->committed_mb, budget > actual ? budget : actual);
        view->pending_mb = add_sat(view->pending_mb, budget > actual ? budget - actual : 0);
        view->n_reservations++;
    }
    if (state->recovering_until > 0) {
        /* Holders are re-registering after the ledger was moved aside: what they already use is
         * committed even where the ledger does not list them yet. */
        view->recovering = true;
        view->in_use_mb = used_by_processes(gpu);
        if (view->in_use_mb > view->committed_mb)
            view->committed_mb = view->in_use_mb;
    }
    int64_t by_ledger = view->capacity_mb - view->committed_mb;
    int64_t by_reality = view->free_mb - view->pending_mb;
    view->available_mb = by_ledger < by_reality ? by_ledger : by_reality;
    if (view->available_mb < 0)
        view->available_mb = 0;
}

bool tdm_guard_fits(const tdm_guard_view *view, int64_t budget_mb)
{
    /* Subtractions, not sums: committed and budget may each be near INT64_MAX. */
    return budget_mb <= view->capacity_mb - view->committed_mb &&
           view->free_mb - view->pending_mb >= budget_mb;
}

bool tdm_guard_could_ever_fit(const tdm_gpu *gpu, int64_t budget_mb)
{
    return budget_mb <= capacity_of(gpu, tdm_guard_reserve_factor(gpu->memory_type));
}
