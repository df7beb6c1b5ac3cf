/* placement_budget.c — submit's memory budget from the run's estimate (placement_budget.h). */
#include "run/placement_budget.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "run/device_open.h"
#include "train/memory_plan.h"

/* The alike adapter: the largest settings of the file over the flags' values. */
static tdm_plan_adapter alike_adapter(const tdm_run_opts *ro, const tdm_adapters_config *ac,
                                      bool *weights_differ)
{
    const tdm_trainer_adapter *d = &ro->adapter;
    tdm_plan_adapter p = {.rank = d->rank,
                          .targets = d->targets,
                          .batch_size = d->batch_size,
                          .max_seq_len = d->max_seq_len,
                          .weight = 1.0};
    bool any_target = false;
    *weights_differ = false;
    for (size_t a = 0; a < ac->n_adapters; a++) {
        const tdm_adapter_spec *s = &ac->adapters[a];
        int rank = s->has_rank ? s->rank : d->rank;
        int batch = s->has_batch_size ? s->batch_size : d->batch_size;
        int seq = s->has_max_seq_len ? s->max_seq_len : d->max_seq_len;
        uint32_t targets = s->has_targets ? s->targets : d->targets;
        double w = s->has_weight ? s->weight : d->weight;
        double w0 = ac->adapters[0].has_weight ? ac->adapters[0].weight : d->weight;
        if (rank > p.rank) p.rank = rank;
        if (batch > p.batch_size) p.batch_size = batch;
        if (seq > p.max_seq_len) p.max_seq_len = seq;
        p.targets = any_target ? p.targets | targets : targets;
        any_target = true;
        if (w != w0) *weights_differ = true;
    }
    return p;
}

tdm_status tdm_run_placement_budget(const tdm_model_config *mc, const tdm_run_opts *ro,
                                    const tdm_adapters_config *ac, tdm_run_budget *out,
                                    tdm_error *err)
{
    memset(out, 0, sizeof *out);
    size_t n = ac->n_adapters;
    out->n_adapters = n;
    out->gpu_mb = calloc(n + 1, sizeof *out->gpu_mb);
    out->cpu_mb = calloc(n + 1, sizeof *out->cpu_mb);
    out->gpu_min_mb = calloc(n + 1, sizeof *out->gpu_min_mb);
    tdm_plan_adapter *ads = calloc(n ? n : 1, sizeof *ads);
    if (!out->gpu_mb || !out->cpu_mb || !out->gpu_min_mb || !ads) {
        free(ads);
        tdm_run_budget_free(out);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    }
    bool weights_differ;
    tdm_plan_adapter alike = alike_adapter(ro, ac, &weights_differ);
    for (size_t a = 0; a < n; a++) {
        ads[a] = alike;
        /* different weights: every adapter but the heaviest spreads its batches */
        if (weights_differ && a > 0) ads[a].weight = 0.5;
    }
    const tdm_trainer_opts *t = &ro->trainer;
    tdm_model_opts mo = {.nf4 = t->nf4,
                         .double_quant = t->double_quant,
                         .grad_checkpoint = t->grad_checkpoint,
                         .recompute = t->recompute,
                         .base_fp8 = t->nf4 && t->base_fp8};
    bool sync = t->schedule == TDM_SCHEDULE_SYNCHRONIZED;
    tdm_status st = TDM_OK;
    for (size_t k = 1; k <= n && st == TDM_OK; k++) {
        tdm_model_mem gpu, cpu;
        if ((st = tdm_run_memory_estimate(mc, &mo, TDM_BE_BF16, ads, (int)k, sync, &gpu, err)) !=
                TDM_OK ||
            (st = tdm_run_memory_estimate(mc, &mo, TDM_BE_F32, ads, (int)k, sync, &cpu, err)) !=
                TDM_OK)
            break;
        out->gpu_mb[k] = ro->device.vram_gib > 0 ? (int64_t)ceil(ro->device.vram_gib * 1024.0)
                                                 : tdm_device_reservation_mb(&gpu);
        out->cpu_mb[k] = tdm_device_cpu_need_mb(&cpu);
        out->gpu_min_mb[k] = out->gpu_mb[k];
        if (ro->device.vram_gib > 0) continue;
        /* the smallest plan --vram auto may take on a GPU too small for this one */
        tdm_memory_fit_request req = {.config = mc,
                                      .opts = mo,
                                      .act = TDM_BE_BF16,
                                      .adapters = ads,
                                      .n_adapters = (int)k,
                                      .synchronized = sync,
                                      .grad_accum = ro->adapter.grad_accum,
                                      .context_mb = TDM_CUDA_CONTEXT_MIB,
                                      .budget_mb = 0};
        tdm_memory_fit fit;
        if ((st = tdm_memory_plan_fit(&req, &fit, err)) != TDM_OK) break;
        out->gpu_min_mb[k] = fit.smallest.mb;
    }
    free(ads);
    if (st != TDM_OK) {
        tdm_run_budget_free(out);
        return st;
    }
    out->place = (tdm_place_budget){
        .gpu_mb = out->gpu_mb, .cpu_mb = out->cpu_mb, .gpu_min_mb = out->gpu_min_mb};
    return TDM_OK;
}

void tdm_run_budget_free(tdm_run_budget *b)
{
    free(b->gpu_mb);
    free(b->cpu_mb);
    free(b->gpu_min_mb);
    memset(b, 0, sizeof *b);
}
