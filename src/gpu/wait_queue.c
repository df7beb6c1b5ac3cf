#include "gpu/wait_queue.h"

#include <stdint.h>
#include <string.h>

bool tdm_queue_targets(const tdm_ticket *t, const tdm_gpu *gpu)
{
    return t->gpu_uuid[0] == '\0' || strcmp(t->gpu_uuid, gpu->uuid) == 0;
}

int tdm_queue_ahead(const tdm_ledger_state *s, int64_t ticket, const tdm_gpu *gpu)
{
    int ahead = 0;
    for (size_t i = 0; i < s->n_queue; i++) {
        const tdm_ticket *t = &s->queue[i];
        if (t->ticket >= ticket)
            break; /* the queue is sorted by ticket */
        if (tdm_queue_targets(t, gpu) && tdm_guard_could_ever_fit(gpu, t->budget_mb))
            ahead++;
    }
    return ahead;
}

int tdm_queue_choose_gpu(const tdm_inventory *inv, const tdm_ledger_state *s, int64_t ticket,
                         const char *pinned_uuid, int64_t budget_mb)
{
    int best = -1;
    int64_t best_left = INT64_MIN;
    for (size_t i = 0; i < inv->n_gpus; i++) {
        const tdm_gpu *g = &inv->gpus[i];
        if (pinned_uuid && pinned_uuid[0] && strcmp(pinned_uuid, g->uuid) != 0)
            continue;
        if (tdm_queue_ahead(s, ticket, g) > 0)
            continue;
        tdm_guard_view v;
        tdm_guard_view_of(g, s, &v);
        if (!tdm_guard_fits(&v, budget_mb))
            continue;
        if (v.available_mb - budget_mb > best_left) {
            best_left = v.available_mb - budget_mb;
            best = (int)i;
        }
    }
    return best;
}
