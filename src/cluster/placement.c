/* placement.c — greedy, adapter by adapter, highest score wins (ties: the earlier node). */
#include "cluster/placement.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/speed.h"

void tdm_place_plan_free(tdm_place_plan *plan)
{
    free(plan->node_of);
    free(plan->gpu_of);
    free(plan->device_of_node);
    free(plan->adapters_on_node);
    free(plan->evals);
    memset(plan, 0, sizeof *plan);
}

/* What a process of k adapters reserves on a GPU with avail MiB free: the plan as asked, else
 * the smallest plan --vram auto may choose; -1 when neither fits. */
static int64_t gpu_plan_mb(const tdm_place_budget *b, int k, int64_t avail)
{
    if (k == 0) return 0;
    if (b->gpu_mb[k] <= avail) return b->gpu_mb[k];
    if (b->gpu_min_mb && b->gpu_min_mb[k] <= avail) return b->gpu_min_mb[k];
    return -1;
}

/* Memory the plan already took on node n's CPU. */
static int64_t planned_cpu_mb(const tdm_place_plan *p, size_t n, const tdm_place_budget *b)
{
    return b->cpu_mb[p->adapters_on_node[n]];
}

/* Adapters the plan put on GPU g of node n before adapter a (one process per GPU). */
static int planned_on_gpu(const tdm_place_plan *p, size_t n, int g, size_t a)
{
    int k = 0;
    for (size_t i = 0; i < a; i++)
        k += p->node_of[i] == (int)n && p->gpu_of[i] == g;
    return k;
}

static void evaluate(const tdm_place_node *node, size_t n, size_t a, const tdm_place_plan *p,
                     const tdm_place_budget *b, int64_t model_params, tdm_place_eval *e)
{
    memset(e, 0, sizeof *e);
    e->gpu = -1;
    int planned = p->adapters_on_node[n];
    if (!node->reachable) {
        snprintf(e->why, sizeof e->why, "unreachable: %s",
                 node->why_unreachable ? node->why_unreachable : "?");
        return;
    }
    if (node->n_gpus > 0 && node->why_no_cuda) {
        snprintf(e->why, sizeof e->why, "%s", node->why_no_cuda);
        return;
    }
    if (node->active_adapters + planned >= node->max_adapters) {
        snprintf(e->why, sizeof e->why, "max_adapters %d reached (%d running, %d planned)",
                 node->max_adapters, node->active_adapters, planned);
        return;
    }
    double share = 1.0 / (1.0 + node->active_adapters + planned);
    if (node->n_gpus == 0) {
        if (model_params > node->cpu_max_params) {
            snprintf(e->why, sizeof e->why,
                     "CPU-only, and the model's %lld parameters exceed cpu_max_params %lld",
                     (long long)model_params, (long long)node->cpu_max_params);
            return;
        }
        int64_t free_mb = node->ram_free_mb - planned_cpu_mb(p, n, b);
        int64_t need = b->cpu_mb[planned + 1] - b->cpu_mb[planned];
        e->free_mb = free_mb;
        e->need_mb = need;
        if (free_mb < need) {
            snprintf(e->why, sizeof e->why, "CPU-only with %lld MiB RAM free, needs %lld MiB",
                     (long long)free_mb, (long long)need);
            return;
        }
        e->eligible = true;
        e->score = (double)free_mb / (double)b->cpu_mb[1] * TDM_SPEED_CPU * share;
        return;
    }
    /* one process per GPU: an adapter joins the process the plan already has on a GPU, or
     * starts one on a GPU the plan has not used */
    int best = -1;
    double best_score = -1;
    int64_t best_free = -1, most_free = -1, best_need = 0, most_free_need = 0;
    int most_free_k = 0;
    for (size_t g = 0; g < node->n_gpus; g++) {
        int k = planned_on_gpu(p, n, (int)g, a);
        int64_t avail = node->gpus[g].free_mb;
        int64_t before = gpu_plan_mb(b, k, avail), after = gpu_plan_mb(b, k + 1, avail);
        if (before < 0) before = b->gpu_mb[k];
        int64_t free_mb = avail - before;
        if (free_mb > most_free) {
            most_free = free_mb;
            most_free_need = b->gpu_mb[k + 1] - b->gpu_mb[k];
            most_free_k = k;
        }
        if (after < 0) continue;
        int64_t need_g = after - before > 0 ? after - before : 0;
        double s = (double)free_mb / (double)b->gpu_mb[1] * node->gpus[g].speed * share;
        if (s > best_score) {
            best_score = s;
            best = (int)g;
            best_free = free_mb;
            best_need = need_g;
        }
    }
    e->need_mb = best < 0 ? most_free_need : best_need;
    if (best < 0) {
        e->free_mb = most_free;
        int w = snprintf(e->why, sizeof e->why,
                         "no GPU has room: the best has %lld MiB free, "
                         "needs %lld MiB",
                         (long long)most_free, (long long)most_free_need);
        if (b->gpu_min_mb && w > 0 && (size_t)w < sizeof e->why)
            snprintf(e->why + w, sizeof e->why - (size_t)w,
                     " (a process of %d adapter(s) at its smallest plan: %lld MiB)",
                     most_free_k + 1, (long long)b->gpu_min_mb[most_free_k + 1]);
        return;
    }
    e->eligible = true;
    e->gpu = best;
    e->free_mb = best_free;
    e->score = best_score;
}

tdm_status tdm_place(const tdm_place_node *nodes, size_t n_nodes, size_t n_adapters,
                     const tdm_place_budget *b, int64_t model_params, tdm_place_plan *plan,
                     tdm_error *err)
{
    memset(plan, 0, sizeof *plan);
    plan->n_adapters = n_adapters;
    plan->n_nodes = n_nodes;
    plan->node_of = calloc(n_adapters ? n_adapters : 1, sizeof *plan->node_of);
    plan->gpu_of = calloc(n_adapters ? n_adapters : 1, sizeof *plan->gpu_of);
    plan->device_of_node = calloc(n_nodes ? n_nodes : 1, sizeof *plan->device_of_node);
    plan->adapters_on_node = calloc(n_nodes ? n_nodes : 1, sizeof *plan->adapters_on_node);
    plan->evals =
        calloc((n_adapters * n_nodes) > 0 ? n_adapters * n_nodes : 1, sizeof *plan->evals);
    if (!plan->node_of || !plan->gpu_of || !plan->device_of_node || !plan->adapters_on_node ||
        !plan->evals) {
        tdm_place_plan_free(plan);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    }
    for (size_t n = 0; n < n_nodes; n++)
        plan->device_of_node[n] = -2;
    tdm_status st = TDM_OK;
    for (size_t a = 0; a < n_adapters; a++) {
        int best = -1;
        for (size_t n = 0; n < n_nodes; n++) {
            tdm_place_eval *e = &plan->evals[a * n_nodes + n];
            evaluate(&nodes[n], n, a, plan, b, model_params, e);
            if (e->eligible && (best < 0 || e->score > plan->evals[a * n_nodes + best].score))
                best = (int)n;
        }
        plan->node_of[a] = best;
        plan->gpu_of[a] = best >= 0 ? plan->evals[a * n_nodes + best].gpu : -1;
        if (best < 0) {
            if (st == TDM_OK) {
                char reasons[700] = "";
                for (size_t n = 0; n < n_nodes; n++) {
                    size_t used = strlen(reasons);
                    snprintf(reasons + used, sizeof reasons - used, "%s%s: %s", n ? "; " : "",
                             nodes[n].name, plan->evals[a * n_nodes + n].why);
                }
                st = tdm_fail(err, TDM_ERR_NEVER_FITS, "adapter %zu fits on no node (%s)", a + 1,
                              reasons);
            }
            continue;
        }
        if (plan->adapters_on_node[best] == 0)
            plan->device_of_node[best] = plan->evals[a * n_nodes + best].gpu;
        plan->adapters_on_node[best]++;
    }
    return st;
}
