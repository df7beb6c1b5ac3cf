/* memory_plan.c — the run's largest step and its memory (memory_plan.h). */
#include "train/memory_plan.h"

#include "train/lora.h"

int64_t tdm_plan_adapter_params(const tdm_model_config *c, const tdm_plan_adapter *a)
{
    int64_t per_layer = 0;
    for (unsigned t = 0; t < TDM_LORA_N_TARGETS; t++) {
        if (!(a->targets & TDM_LORA_BIT(t))) continue;
        int64_t d_in, d_out;
        tdm_lora_params_projection_dims(c, t, &d_in, &d_out);
        per_layer += (int64_t)a->rank * (d_in + d_out);
    }
    return per_layer * c->num_layers;
}

static int64_t batch_rows(const tdm_plan_adapter *a)
{
    int64_t cap = (int64_t)a->batch_size * a->max_seq_len;
    return a->largest_batch_rows > 0 && a->largest_batch_rows < cap ? a->largest_batch_rows : cap;
}

void tdm_memory_plan_build(const tdm_model_config *c, const tdm_plan_adapter *ads, int n,
                           bool synchronized, tdm_model_mem_plan *out)
{
    tdm_model_mem_plan p = {.backward = true};
    int64_t max_rows = 0, max_seqs = 0;
    for (int a = 0; a < n; a++) {
        int64_t rows = batch_rows(&ads[a]);
        p.rows += rows;
        p.n_seqs += ads[a].batch_size;
        if (rows > max_rows) max_rows = rows;
        if (ads[a].batch_size > max_seqs) max_seqs = ads[a].batch_size;
        if (ads[a].rank > p.max_rank) p.max_rank = ads[a].rank;
        p.targets |= ads[a].targets;
        p.lora_params += tdm_plan_adapter_params(c, &ads[a]);
    }
    if (!synchronized) {
        p.rows = max_rows;
        p.n_seqs = max_seqs;
    }
    /* the CUDA LoRA backward's partial sums are per module: the largest module's sum over
     * adapters */
    for (unsigned tg = 0; tg < TDM_LORA_N_TARGETS; tg++) {
        int64_t d_in, d_out, sum = 0;
        tdm_lora_params_projection_dims(c, tg, &d_in, &d_out);
        for (int a = 0; a < n; a++)
            if (ads[a].targets & TDM_LORA_BIT(tg)) sum += (int64_t)ads[a].rank * (d_in + d_out);
        if (sum > p.lora_module_params) p.lora_module_params = sum;
    }
    *out = p;
}

tdm_status tdm_run_memory_estimate(const tdm_model_config *c, const tdm_model_opts *o,
                                   tdm_be_dtype act, const tdm_plan_adapter *ads, int n,
                                   bool synchronized, tdm_model_mem *out, tdm_error *err)
{
    tdm_model_mem_plan p;
    tdm_memory_plan_build(c, ads, n, synchronized, &p);
    tdm_model_opts mo = *o;
    mo.double_quant = o->nf4 && o->double_quant;
    tdm_status st = tdm_model_memory_estimate(c, &mo, act, &p, out, err);
    if (st != TDM_OK) return st;
    double max_weight = 0;
    for (int a = 0; a < n; a++)
        if (ads[a].weight > max_weight) max_weight = ads[a].weight;
    /* the copy of the partial gradient of each adapter that spreads its batches
     * (tdm_trainer_attach) */
    for (int a = 0; synchronized && a < n; a++)
        if (ads[a].weight < max_weight)
            out->adapters += (uint64_t)tdm_plan_adapter_params(c, &ads[a]) * sizeof(float);
    return TDM_OK;
}
