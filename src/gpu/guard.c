#include "gpu/guard.h"

#include <math.h>
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

void tdm_guard_view_of(const tdm_gpu *gpu, const tdm_ledger_state *state, tdm_guard_view *view)
{
    memset(view, 0, sizeof *view);
    view->reserve_factor = tdm_guard_reserve_factor(gpu->memory_type);
    view->capacity_mb = capacity_of(gpu, view->reserve_factor);
    view->free_mb = gpu->free_mb;
    for (size_t i = 0; i < state->n_reservations; i++) {
        const tdm_reservation *r = &state->reservations[i];
        if (strcmp(r->gpu_uuid, gpu->uuid) != 0)
            continue;
        int64_t actual = r->actual_mb >= 0 ? r->actual_mb : 0;
        view->committed_mb += r->budget_mb > actual ? r->budget_mb : actual;
        view->pending_mb += r->budget_mb > actual ? r->budget_mb - actual : 0;
        view->n_reservations++;
    }
    int64_t by_ledger = view->capacity_mb - view->committed_mb;
    int64_t by_reality = view->free_mb - view->pending_mb;
    view->available_mb = by_ledger < by_reality ? by_ledger : by_reality;
    if (view->available_mb < 0)
        view->available_mb = 0;
}

bool tdm_guard_fits(const tdm_guard_view *view, int64_t budget_mb)
{
    return view->committed_mb + budget_mb <= view->capacity_mb &&
           view->free_mb - view->pending_mb >= budget_mb;
}

bool tdm_guard_could_ever_fit(const tdm_gpu *gpu, int64_t budget_mb)
{
    return budget_mb <= capacity_of(gpu, tdm_guard_reserve_factor(gpu->memory_type));
}
