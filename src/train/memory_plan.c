/* memory_plan.c — the run's largest step and its memory (memory_plan.h). */
#include "train/memory_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Sequences of the adapter's largest pass: its micro-batch. */
static int64_t pass_seqs(const tdm_plan_adapter *a)
{
    return a->micro_batch > 0 && a->micro_batch < a->batch_size ? a->micro_batch : a->batch_size;
}

/* Rows of the adapter's largest pass: its micro-batch's longest samples. */
static int64_t batch_rows(const tdm_plan_adapter *a)
{
    int64_t m = pass_seqs(a);
    int64_t cap = m * a->max_seq_len;
    if (a->longest) {
        int64_t rows = 0;
        for (int i = 0; i < a->n_longest && i < m; i++)
            rows += a->longest[i];
        return rows < cap ? rows : cap;
    }
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
        p.n_seqs += pass_seqs(&ads[a]);
        if (rows > max_rows) max_rows = rows;
        int64_t longest = ads[a].longest && ads[a].n_longest > 0 ? ads[a].longest[0]
                                                                   : ads[a].max_seq_len;
        if (longest > ads[a].max_seq_len) longest = ads[a].max_seq_len;
        if (longest > p.max_seq) p.max_seq = longest;
        if (pass_seqs(&ads[a]) > max_seqs) max_seqs = pass_seqs(&ads[a]);
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

int64_t tdm_memory_plan_mb(const tdm_model_mem *e, int64_t context_mb)
{
    uint64_t bytes = e->weights + e->activations + e->adapters + e->backend_scratch;
    return (int64_t)((bytes + (1u << 20) - 1) >> 20) + context_mb;
}

/* ---- the plan that fits ------------------------------------------------------------------ */

static int micro_of(int batch_size, int split)
{
    return (batch_size + split - 1) / split;
}

/* The estimate of one plan: grad checkpointing gc recomputing rc, every adapter's micro-batch at
 * split k. */
static tdm_status plan_at(const tdm_memory_fit_request *req, tdm_plan_adapter *ads, bool gc,
                          tdm_recompute rc, int split, tdm_plan_rung rung,
                          tdm_memory_plan_choice *out, tdm_error *err)
{
    for (int a = 0; a < req->n_adapters; a++)
        ads[a].micro_batch = micro_of(ads[a].batch_size, split);
    tdm_model_opts mo = req->opts;
    mo.grad_checkpoint = gc;
    mo.recompute = rc;
    memset(out, 0, sizeof *out);
    TDM_TRY(tdm_run_memory_estimate(req->config, &mo, req->act, ads, req->n_adapters,
                                    req->synchronized, &out->est, err));
    if (out->est.backend_scratch < req->scratch_floor) out->est.backend_scratch = req->scratch_floor;
    out->rung = rung;
    out->grad_checkpoint = gc;
    out->recompute = rc;
    out->split = split;
    out->micro_batch = ads[0].micro_batch;
    out->batch_size = ads[0].batch_size;
    out->alike = true;
    for (int a = 1; a < req->n_adapters; a++)
        out->alike = out->alike && ads[a].batch_size == ads[0].batch_size;
    out->grad_accum = req->grad_accum * split;
    out->mb = tdm_memory_plan_mb(&out->est, req->context_mb);
    return TDM_OK;
}

tdm_status tdm_memory_plan_fit(const tdm_memory_fit_request *req, tdm_memory_fit *out,
                               tdm_error *err)
{
    memset(out, 0, sizeof *out);
    if (req->n_adapters < 1 || !req->adapters || req->grad_accum < 1)
        return tdm_fail(err, TDM_ERR_INVALID, "memory plan: no adapter, or grad_accum < 1");
    tdm_plan_adapter *ads = malloc((size_t)req->n_adapters * sizeof *ads);
    if (!ads) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    memcpy(ads, req->adapters, (size_t)req->n_adapters * sizeof *ads);
    int max_batch = 1;
    for (int a = 0; a < req->n_adapters; a++)
        if (ads[a].batch_size > max_batch) max_batch = ads[a].batch_size;
    tdm_status st;
    tdm_memory_plan_choice c;
    bool user_gc = req->opts.grad_checkpoint;
    tdm_recompute rc = req->opts.recompute;
    /* 1. as asked */
    if ((st = plan_at(req, ads, user_gc, rc, 1, TDM_PLAN_AS_ASKED, &c, err)) != TDM_OK) goto done;
    out->asked = c;
    out->n_tried = 1;
    if (c.mb <= req->budget_mb) {
        out->fits = true;
        out->chosen = c;
    }
    /* 2. checkpointing that recomputes only the norms and q/k/v (a few percent of a step), when
     * the run's own mode is another */
    if (!user_gc && rc != TDM_RECOMPUTE_ATTN) {
        if ((st = plan_at(req, ads, true, TDM_RECOMPUTE_ATTN, 1, TDM_PLAN_RECOMPUTE_ATTN, &c,
                          err)) != TDM_OK)
            goto done;
        out->n_tried++;
        if (!out->fits && c.mb <= req->budget_mb) {
            out->fits = true;
            out->chosen = c;
        }
    }
    /* 3. gradient checkpointing as --recompute says (default: the whole layer) */
    if (!user_gc) {
        if ((st = plan_at(req, ads, true, rc, 1, TDM_PLAN_GRAD_CHECKPOINT, &c, err)) != TDM_OK)
            goto done;
        out->n_tried++;
        if (!out->fits && c.mb <= req->budget_mb) {
            out->fits = true;
            out->chosen = c;
        }
    }
    /* 4. micro-batches, down to 1 sequence each; the smallest plan is the last one (always
     * computed: it is what an admission that does not fit reports) */
    for (int k = 2; k <= max_batch; k++) {
        bool same = true; /* k - 1 gave the same micro-batches */
        for (int a = 0; a < req->n_adapters && same; a++)
            same = micro_of(ads[a].batch_size, k) == micro_of(ads[a].batch_size, k - 1);
        if (same) continue;
        if (out->fits && k < max_batch) {
            /* jump to the smallest plan: nothing between matters any more */
            k = max_batch - 1;
            continue;
        }
        if ((st = plan_at(req, ads, true, rc, k, TDM_PLAN_MICRO_BATCH, &c, err)) != TDM_OK)
            goto done;
        out->n_tried++;
        if (!out->fits && c.mb <= req->budget_mb) {
            out->fits = true;
            out->chosen = c;
        }
    }
    out->smallest = c;
    if (!out->fits) out->chosen = out->smallest;
    st = TDM_OK;
done:
    free(ads);
    return st;
}

tdm_status tdm_memory_plan_admit(const tdm_join_admit_request *req, tdm_join_admission *out,
                                 tdm_error *err)
{
    memset(out, 0, sizeof *out);
    tdm_memory_fit_request fr = req->fit;
    int64_t slack = req->reservation_mb - req->plan_mb; /* --vram GB over (or under) its plan */
    fr.budget_mb = req->growable_mb >= 0 ? req->growable_mb - slack : INT64_MAX / 4;
    out->budget_mb = req->growable_mb >= 0 ? fr.budget_mb : -1;
    TDM_TRY(tdm_memory_plan_fit(&fr, &out->fit, err));
    out->need_mb = out->fit.smallest.mb + slack;
    if (req->capacity_mb >= 0 && out->need_mb > req->capacity_mb) {
        out->kind = TDM_JOIN_NEVER_FITS;
        out->plan = out->fit.smallest;
    } else {
        out->kind = out->fit.fits ? TDM_JOIN_ADMIT : TDM_JOIN_WAIT;
        out->plan = out->fit.chosen; /* the smallest when nothing fits */
    }
    out->target_mb = out->plan.mb + slack;
    if (out->target_mb < 1) out->target_mb = 1;
    if (out->need_mb < 1) out->need_mb = 1;
    return TDM_OK;
}

/* The place of the plan (gc, rc, split) in tdm_memory_plan_fit's order for a run whose options
 * ask for (user_gc, user_rc): 0 as asked, 1 checkpointing with --recompute attn, 2 checkpointing
 * in another mode, 1 + k micro-batches at split k. Smaller is faster. */
static int plan_place(bool user_gc, tdm_recompute user_rc, bool gc, tdm_recompute rc, int split,
                      tdm_plan_rung *rung)
{
    if (split > 1) {
        *rung = TDM_PLAN_MICRO_BATCH;
        return 1 + split;
    }
    if (gc == user_gc && (!gc || rc == user_rc)) {
        *rung = TDM_PLAN_AS_ASKED;
        return 0;
    }
    if (gc && rc == TDM_RECOMPUTE_ATTN) {
        *rung = TDM_PLAN_RECOMPUTE_ATTN;
        return 1;
    }
    *rung = TDM_PLAN_GRAD_CHECKPOINT;
    return 2;
}

tdm_status tdm_memory_plan_after_leave(const tdm_leave_replan_request *req,
                                       tdm_leave_replan *out, tdm_error *err)
{
    memset(out, 0, sizeof *out);
    const tdm_memory_fit_request *f = &req->fit;
    if (req->split < 1)
        return tdm_fail(err, TDM_ERR_INVALID, "memory plan: split %d < 1", req->split);
    if (f->n_adapters < 1 || !f->adapters)
        return tdm_fail(err, TDM_ERR_INVALID, "memory plan: no adapter");
    tdm_memory_fit_request fr = *f;
    fr.budget_mb = req->plan_mb; /* the reservation held, less its slack */
    out->budget_mb = fr.budget_mb;
    TDM_TRY(tdm_memory_plan_fit(&fr, &out->fit, err));
    out->plan = out->fit.chosen;
    /* the plan in use, for the adapters still training */
    tdm_plan_adapter *ads = malloc((size_t)f->n_adapters * sizeof *ads);
    if (!ads) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    memcpy(ads, f->adapters, (size_t)f->n_adapters * sizeof *ads);
    bool ugc = f->opts.grad_checkpoint;
    tdm_recompute urc = f->opts.recompute;
    tdm_plan_rung rung;
    int cur = plan_place(ugc, urc, req->grad_checkpoint, req->recompute, req->split, &rung);
    tdm_status st = plan_at(&fr, ads, req->grad_checkpoint, req->recompute, req->split, rung,
                            &out->current, err);
    free(ads);
    if (st != TDM_OK) return st;
    const tdm_memory_plan_choice *p = &out->plan, *c = &out->current;
    int at = plan_place(ugc, urc, p->grad_checkpoint, p->recompute, p->split, &rung);
    /* what a step computes changes: checkpointing, its mode, or some adapter's micro-batch */
    bool differs = p->grad_checkpoint != c->grad_checkpoint ||
                   (p->grad_checkpoint && p->recompute != c->recompute);
    for (int a = 0; a < f->n_adapters && !differs; a++)
        differs = micro_of(f->adapters[a].batch_size, p->split) !=
                  micro_of(f->adapters[a].batch_size, c->split);
    out->faster = out->fit.fits && at < cur && differs;
    int64_t slack = req->reservation_mb - req->plan_mb;
    out->target_mb = (out->faster ? p->mb : c->mb) + slack;
    if (out->target_mb < 1) out->target_mb = 1;
    return TDM_OK;
}

void tdm_memory_plan_describe(const tdm_memory_plan_choice *c, char *buf, size_t cap)
{
    if (!cap) return;
    char mode[40] = "";
    if (c->grad_checkpoint && c->recompute != TDM_RECOMPUTE_LAYER)
        snprintf(mode, sizeof mode, " --recompute %s", tdm_recompute_name(c->recompute));
    if (c->rung == TDM_PLAN_AS_ASKED) {
        snprintf(buf, cap, "the plan as asked%s%s%s",
                 c->grad_checkpoint ? " (--grad-checkpoint" : "", mode,
                 c->grad_checkpoint ? ")" : "");
        return;
    }
    if (c->split <= 1) {
        snprintf(buf, cap, "gradient checkpointing%s%s%s", *mode ? " (" : "", *mode ? mode + 1 : "",
                 *mode ? ")" : "");
        return;
    }
    if (c->alike)
        snprintf(buf, cap,
                 "gradient checkpointing and micro-batch %d x accumulation %d (optimizer batch %d "
                 "x %d unchanged)",
                 c->micro_batch, c->grad_accum, c->batch_size, c->grad_accum / c->split);
    else
        snprintf(buf, cap,
                 "gradient checkpointing and micro-batches of batch_size / %d x accumulation %d "
                 "(optimizer batches unchanged)",
                 c->split, c->grad_accum);
}
