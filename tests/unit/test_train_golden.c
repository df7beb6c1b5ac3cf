/* test_train_golden.c — the engine against PyTorch + transformers + PEFT in float64.
 *
 * Fixtures: tests/fixtures/train/golden/ (generator tests/fixtures/train/gen_golden.py, format
 * docs/golden-tests.md). For each case (a tiny random Llama or Qwen2 model, a PEFT adapter with
 * non-zero A and B, four pre-tokenized sequences with -100 labels) this test
 *   1. loads the model in "lora" mode (f32 base) and the adapter with tdm_peft_load, runs the
 *      four sequences packed as one batch of one adapter: the batch loss and each sequence's
 *      loss vs the float64 reference (1e-4 relative, the bar);
 *   2. backward: every LoRA tensor's gradient vs the reference (relative L2 error, max error
 *      relative to the tensor's largest element, cosine similarity);
 *   3. one epoch of AdamW exactly as the generator ran it (batch 1, file order, constant lr
 *      5e-3, betas 0.9/0.999, eps 1e-8, no clipping, no weight decay) through the backend's
 *      AdamW op on the adapter's device vectors (what the trainer does), checked bit for bit
 *      against the host reference tdm_adamw_step on the same gradients; each step's loss and
 *      the trained adapter vs the reference;
 *   4. "qlora" mode: decoder projections NF4 (blocksize 64, f32 absmax, no double
 *      quantization): the batch loss and per-sequence sums vs the reference's NF4 losses;
 *   5. fused: the cases of one base model (llama: 2, qwen2: 3 with different ranks, targets and
 *      rsLoRA) as adapters of one run, every step one pass over all their rows and one
 *      multi-tensor AdamW call: each adapter's losses, gradients and trained weights vs its own
 *      case's reference.
 * Every tensor prints a "TENSOR OK" line with its errors (llm.c's test_gpt2 habit), so the log
 * is the evidence (docs/golden-tests.md, "Results").
 *
 * Tolerances, from what f32 gives here (measured numbers in docs/golden-tests.md):
 *   - losses: 1e-4 relative (the bar); measured ~1e-7.
 *   - gradients: relative L2 error ||g - g_ref|| / ||g_ref|| < 1e-4 and cosine > 1 - 1e-8. The
 *     engine computes in f32 (rounding 6e-8) with double row reductions; a two-layer model's
 *     backward through attention, RMSNorm and the CE softmax accumulates a few hundred roundings
 *     at most, so ~1e-6 is expected and 1e-4 leaves two orders of margin while still catching
 *     any wrong term (a missing scale, a transposed product or a wrong shift gives O(1)).
 *   - trained adapter: Adam normalises each element's step (m / sqrt(v) is +-1 at step 1
 *     whatever |g| is), so the weights' error is not f32 rounding of the weights (~2e-8) but the
 *     gradients' ~1e-6 relative error carried through that normalisation: measured up to ~1e-6
 *     absolute on weights of size ~0.3, i.e. ~1e-4 of the distance Adam moves an element in the
 *     epoch (lr per step, 4 steps = 2e-2). Required: max |p - p_ref| < 1e-3 * lr * steps (an
 *     update missing or wrong in one step gives ~lr = 250x that) and rel L2 < 1e-5 (measured
 *     <= 5e-7). The backend's AdamW op must moreover equal the host reference tdm_adamw_step
 *     (torch's single-tensor AdamW op by op) bit for bit on the same gradients.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/model.h"
#include "model/safetensors.h"
#include "train/adamw.h"
#include "train/lora.h"
#include "train/peft_io.h"

#define GOLDEN TANDEM_SOURCE_DIR "/tests/fixtures/train/golden"
#define MAX_SEQS 8
#define MAX_ROWS 256

static tdm_backend *be;

#define OK(call)                                                                                   \
    do {                                                                                           \
        tdm_error err_ = {0};                                                                      \
        tdm_error *err = &err_;                                                                    \
        if ((call) != TDM_OK) fail_msg("%s: %s", #call, err_.message);                             \
    } while (0)

static int setup(void **state)
{
    (void)state;
    tdm_error err = {0};
    return tdm_backend_create(&be, "cpu", NULL, &err) == TDM_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    tdm_backend_free(be);
    return 0;
}

static json_t *load_json(const char *path)
{
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) fail_msg("%s:%d: %s", path, je.line, je.text);
    return j;
}

/* The four sequences of data.json, packed. */
typedef struct golden_data {
    int n_seqs;
    int64_t m;
    int32_t tokens[MAX_ROWS], labels[MAX_ROWS], cu[MAX_SEQS + 1];
} golden_data;

static void load_data(golden_data *d)
{
    json_t *j = load_json(GOLDEN "/data.json");
    json_t *seqs = json_object_get(j, "sequences");
    assert_true(json_is_array(seqs));
    d->n_seqs = (int)json_array_size(seqs);
    assert_true(d->n_seqs > 0 && d->n_seqs <= MAX_SEQS);
    d->m = 0;
    d->cu[0] = 0;
    for (int s = 0; s < d->n_seqs; s++) {
        json_t *ids = json_object_get(json_array_get(seqs, (size_t)s), "input_ids");
        json_t *lab = json_object_get(json_array_get(seqs, (size_t)s), "labels");
        assert_int_equal(json_array_size(ids), json_array_size(lab));
        for (size_t i = 0; i < json_array_size(ids); i++) {
            assert_true(d->m < MAX_ROWS);
            d->tokens[d->m] = (int32_t)json_integer_value(json_array_get(ids, i));
            d->labels[d->m] = (int32_t)json_integer_value(json_array_get(lab, i));
            d->m++;
        }
        d->cu[s + 1] = (int32_t)d->m;
    }
    json_decref(j);
}

/* A batch of sequences [s0, s1) of d, all rows belonging to adapter 0. The returned batch points
 * into *cu_buf and *seg. */
static tdm_batch sub_batch(const golden_data *d, int s0, int s1, int32_t *cu_buf,
                           tdm_batch_seg *seg)
{
    int32_t r0 = d->cu[s0];
    for (int s = s0; s <= s1; s++)
        cu_buf[s - s0] = d->cu[s] - r0;
    *seg = (tdm_batch_seg){0, 0, d->cu[s1] - r0};
    return (tdm_batch){d->cu[s1] - r0, d->tokens + r0, d->labels + r0, cu_buf, s1 - s0, seg, 1};
}

static double num(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v)) fail_msg("expected.json: %s is not a number", key);
    return json_number_value(v);
}

/* An F64 tensor of expected.safetensors as doubles (malloc'd), checking its element count. */
static double *f64_tensor(const tdm_st_file *f, const char *name, int64_t numel)
{
    const tdm_st_tensor *t = tdm_st_find(f, name);
    if (!t) fail_msg("expected.safetensors has no %s", name);
    assert_int_equal(t->dtype, TDM_DTYPE_F64);
    assert_int_equal(t->numel, numel);
    double *out = malloc((size_t)numel * sizeof(double));
    memcpy(out, t->data, (size_t)numel * sizeof(double));
    return out;
}

typedef struct cmp_stats {
    double rel_l2, max_abs, max_rel, cosine;
} cmp_stats;

/* x (f32) vs ref (f64): relative L2 error, max abs error, max abs error / max |ref|, cosine. */
static cmp_stats compare(const float *x, const double *ref, int64_t n)
{
    double dd = 0, rr = 0, xx = 0, xr = 0, mx = 0, mr = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)x[i] - ref[i];
        dd += d * d, rr += ref[i] * ref[i], xx += (double)x[i] * x[i], xr += (double)x[i] * ref[i];
        mx = fmax(mx, fabs(d)), mr = fmax(mr, fabs(ref[i]));
    }
    return (cmp_stats){sqrt(dd / rr), mx, mx / mr, xr / sqrt(xx * rr)};
}

static void check_loss(const char *what, double got, double ref, double tol, double *worst)
{
    double rel = fabs(got - ref) / fabs(ref);
    *worst = fmax(*worst, rel);
    printf("  %-44s %.10f ref %.10f rel err %.2e%s\n", what, got, ref, rel,
           rel < tol ? "" : "  FAIL");
    if (!(rel < tol))
        fail_msg("%s: loss %.10f vs reference %.10f (rel err %.3e >= %.0e)", what, got, ref, rel,
                 tol);
}

/* Adapter of PEFT layout l on the device (lora targets share tdm_adapter_target bit order). */
static tdm_lora *upload_adapter(tdm_model *m, const tdm_lora_params *l)
{
    tdm_lora *a;
    OK(tdm_lora_create(&a, m, l->rank, (float)l->scale, l->targets, err));
    for (size_t i = 0; i < l->n_modules; i++) {
        const tdm_lora_module *md = &l->modules[i];
        int64_t in, out;
        tdm_model_target_shape(m, (tdm_lora_target)md->target, &in, &out);
        assert_int_equal(in, md->in);
        assert_int_equal(out, md->out);
        OK(tdm_lora_set(a, md->layer, (tdm_lora_target)md->target, md->A, md->B, err));
    }
    return a;
}

/* Compares every module's A and B of the host f32 array p (adapter layout of a) with the
 * reference tensors "<prefix><PEFT name>"; rel-L2 must stay under tol_l2, max error relative to
 * the tensor's max |ref| under tol_max, max abs error under tol_abs, 1 - cosine under tol_cos.
 * Prints a TENSOR line each; returns the worst stats. */
static cmp_stats compare_adapter(const tdm_lora *a, const tdm_lora_params *l, const float *p,
                                 const tdm_st_file *ref, const char *prefix, double tol_l2,
                                 double tol_max, double tol_abs, double tol_cos)
{
    cmp_stats worst = {0, 0, 0, 1};
    for (size_t i = 0; i < l->n_modules; i++) {
        const tdm_lora_module *md = &l->modules[i];
        for (int is_b = 0; is_b < 2; is_b++) {
            char tname[256], full[300];
            assert_true(tdm_lora_params_tensor_name(md, is_b, tname, sizeof tname));
            snprintf(full, sizeof full, "%s%s", prefix, tname);
            int64_t n = l->rank * (is_b ? md->out : md->in);
            int64_t off = (is_b ? a->b_off : a->a_off)[md->layer * TDM_LORA_N_TARGETS + md->target];
            double *r = f64_tensor(ref, full, n);
            cmp_stats s = compare(p + off, r, n);
            bool ok = s.rel_l2 < tol_l2 && s.max_rel < tol_max && s.max_abs < tol_abs &&
                      s.cosine > 1 - tol_cos;
            printf("  TENSOR %s %slayers.%d.%s.lora_%c: rel L2 %.2e, maxdiff %.2e (%.2e of max "
                   "|ref|), "
                   "cosine 1-%.1e\n",
                   ok ? "OK  " : "FAIL", prefix, md->layer, tdm_lora_target_path(md->target),
                   is_b ? 'B' : 'A', s.rel_l2, s.max_abs, s.max_rel, 1 - s.cosine);
            if (!ok)
                fail_msg("%s: rel L2 %.3e (tol %.0e), max rel %.3e (tol %.0e), max abs %.3e (tol "
                         "%.1e), cosine 1-%.2e",
                         full, s.rel_l2, tol_l2, s.max_rel, tol_max, s.max_abs, tol_abs,
                         1 - s.cosine);
            worst.rel_l2 = fmax(worst.rel_l2, s.rel_l2);
            worst.max_abs = fmax(worst.max_abs, s.max_abs);
            worst.max_rel = fmax(worst.max_rel, s.max_rel);
            worst.cosine = fmin(worst.cosine, s.cosine);
            free(r);
        }
    }
    return worst;
}

/* Forward only of sequences [s0, s1): loss sum and counted tokens of adapter a (NULL = base). */
static void forward(tdm_model *m, tdm_lora *a, const golden_data *d, int s0, int s1, double *sum,
                    int64_t *tokens)
{
    int32_t cu[MAX_SEQS + 1];
    tdm_batch_seg seg;
    tdm_batch b = sub_batch(d, s0, s1, cu, &seg);
    OK(tdm_model_step(m, &a, 1, &b, false, NULL, sum, tokens, err));
}

static void run_case(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, GOLDEN "/%s/expected.json", name);
    json_t *ex = load_json(path);
    const char *model_name = json_string_value(json_object_get(ex, "model"));
    assert_non_null(model_name);
    snprintf(path, sizeof path, GOLDEN "/%s/expected.safetensors", name);
    tdm_st_file ref;
    OK(tdm_st_open(&ref, path, err));
    golden_data d;
    load_data(&d);
    printf("[%s] model %s, r %d, alpha %g, rslora %s, %d sequences (%lld rows)\n", name, model_name,
           (int)num(ex, "r"), num(ex, "lora_alpha"),
           json_is_true(json_object_get(ex, "use_rslora")) ? "yes" : "no", d.n_seqs,
           (long long)d.m);

    /* ---- lora mode: the f32 base ---- */
    snprintf(path, sizeof path, GOLDEN "/%s", model_name);
    tdm_model_opts o = {0};
    tdm_model *m;
    OK(tdm_model_load(&m, be, path, &o, err));
    const tdm_model_config *cfg = tdm_model_get_config(m);
    tdm_lora_params lp;
    snprintf(path, sizeof path, GOLDEN "/%s/adapter", name);
    OK(tdm_peft_load(path, cfg, &lp, NULL, err));
    assert_int_equal(lp.rank, (int)num(ex, "r"));
    assert_true(fabs(lp.scale - num(ex, "scale")) < 1e-12);
    tdm_lora *a = upload_adapter(m, &lp);
    double worst_loss = 0;

    /* 1. batch loss, per-sequence losses, base loss */
    int32_t cu[MAX_SEQS + 1];
    tdm_batch_seg seg;
    tdm_batch all = sub_batch(&d, 0, d.n_seqs, cu, &seg);
    double sum;
    int64_t tokens;
    OK(tdm_lora_zero_grad(a, err));
    OK(tdm_model_step(m, &a, 1, &all, true, NULL, &sum, &tokens, err));
    assert_int_equal(tokens, (int64_t)num(ex, "tokens"));
    check_loss("batch loss (lora, f32)", sum / (double)tokens, num(ex, "loss"), 1e-4, &worst_loss);
    json_t *per = json_object_get(ex, "per_sequence");
    assert_int_equal(json_array_size(per), d.n_seqs);
    for (int s = 0; s < d.n_seqs; s++) {
        double ss;
        int64_t nt;
        forward(m, a, &d, s, s + 1, &ss, &nt);
        json_t *ps = json_array_get(per, (size_t)s);
        assert_int_equal(nt, (int64_t)num(ps, "tokens"));
        char what[64];
        snprintf(what, sizeof what, "sequence %d loss", s);
        check_loss(what, ss / (double)nt, num(ps, "loss"), 1e-4, &worst_loss);
    }
    {
        double bs;
        int64_t bt;
        forward(m, NULL, &d, 0, d.n_seqs, &bs, &bt);
        check_loss("base loss (adapter off)", bs / (double)bt, num(ex, "base_loss"), 1e-4,
                   &worst_loss);
    }

    /* 2. gradients of the batch loss */
    int64_t np = a->n_params;
    float *g = malloc((size_t)np * sizeof(float));
    OK(tdm_be_download_f32(be, g, a->grads, TDM_BE_F32, np, err));
    cmp_stats gw = compare_adapter(a, &lp, g, &ref, "grad.", 1e-4, 1e-4, INFINITY, 1e-8);

    /* 3. one epoch of AdamW, batch 1, file order: device op, checked against the host reference
     * on the same gradients bit for bit */
    json_t *tr = json_object_get(ex, "train");
    json_t *betas = json_object_get(tr, "betas");
    assert_int_equal(num(tr, "batch_size"), 1);
    assert_int_equal(num(tr, "epochs"), 1);
    assert_true(num(tr, "weight_decay") == 0 && num(tr, "max_grad_norm") == 0);
    tdm_adamw_config hc = {json_number_value(json_array_get(betas, 0)),
                           json_number_value(json_array_get(betas, 1)), num(tr, "eps"), 0};
    double lr = num(tr, "lr");
    tdm_adamw_state hs;
    OK(tdm_adamw_state_init(&hs, np, err));
    float *hp = malloc((size_t)np * sizeof(float)), *dp = malloc((size_t)np * sizeof(float));
    OK(tdm_be_download_f32(be, hp, a->params, TDM_BE_F32, np, err));
    json_t *step_losses = json_object_get(tr, "step_losses");
    assert_int_equal(json_array_size(step_losses), d.n_seqs);
    for (int s = 0; s < d.n_seqs; s++) {
        tdm_batch_seg sg;
        int32_t c1[2];
        tdm_batch b1 = sub_batch(&d, s, s + 1, c1, &sg);
        double ls;
        int64_t nt;
        OK(tdm_lora_zero_grad(a, err));
        OK(tdm_model_step(m, &a, 1, &b1, true, NULL, &ls, &nt, err));
        char what[64];
        snprintf(what, sizeof what, "step %d loss (before its update)", s + 1);
        check_loss(what, ls / (double)nt, json_number_value(json_array_get(step_losses, (size_t)s)),
                   1e-4, &worst_loss);
        tdm_adamw_tensor t = {a->params, a->grads, a->adam_m, a->adam_v, np,  NULL,
                              lr,        hc.beta1, hc.beta2,  hc.eps,    0.0, s + 1};
        OK(tdm_be_adamw(be, &t, 1, err));
        OK(tdm_be_download_f32(be, g, a->grads, TDM_BE_F32, np, err));
        tdm_adamw_step(&hs, &hc, lr, hp, g);
        OK(tdm_be_download_f32(be, dp, a->params, TDM_BE_F32, np, err));
        int64_t diff = 0;
        for (int64_t i = 0; i < np; i++)
            diff += memcmp(&dp[i], &hp[i], sizeof(float)) != 0;
        printf("  step %d: backend AdamW vs host reference (torch's single-tensor AdamW op by "
               "op): %lld of %lld elements differ\n",
               s + 1, (long long)diff, (long long)np);
        if (diff) fail_msg("backend AdamW differs from tdm_adamw_step at step %d", s + 1);
    }
    /* The trained adapter: see the header comment for the tolerance. */
    cmp_stats tw =
        compare_adapter(a, &lp, dp, &ref, "trained.", 1e-5, INFINITY, 1e-3 * lr * d.n_seqs, 1e-9);

    /* ---- qlora mode: NF4 projections, no double quantization ---- */
    tdm_model_opts oq = {.nf4 = true, .double_quant = false};
    tdm_model *mq;
    snprintf(path, sizeof path, GOLDEN "/%s", model_name);
    OK(tdm_model_load(&mq, be, path, &oq, err));
    tdm_lora *aq = upload_adapter(mq, &lp);
    json_t *nf4 = json_object_get(ex, "nf4");
    assert_true(json_is_false(json_object_get(nf4, "double_quant")));
    assert_int_equal(num(nf4, "blocksize"), 64);
    forward(mq, aq, &d, 0, d.n_seqs, &sum, &tokens);
    check_loss("batch loss (qlora, NF4, no double quant)", sum / (double)tokens, num(nf4, "loss"),
               1e-4, &worst_loss);
    json_t *nps = json_object_get(nf4, "per_sequence_sum");
    for (int s = 0; s < d.n_seqs; s++) {
        double ss;
        int64_t nt;
        forward(mq, aq, &d, s, s + 1, &ss, &nt);
        char what[64];
        snprintf(what, sizeof what, "NF4 sequence %d CE sum", s);
        check_loss(what, ss, json_number_value(json_array_get(nps, (size_t)s)), 1e-4, &worst_loss);
    }

    printf("[%s] SUMMARY worst loss rel err %.2e; gradients: worst rel L2 %.2e, worst max rel "
           "%.2e, min cosine 1-%.1e; trained adapter: worst rel L2 %.2e, worst max abs %.2e (%.2e "
           "of max |ref|, %.2e of lr * "
           "steps)\n",
           name, worst_loss, gw.rel_l2, gw.max_rel, 1 - gw.cosine, tw.rel_l2, tw.max_abs,
           tw.max_rel, tw.max_abs / (lr * d.n_seqs));

    tdm_lora_free(aq);
    tdm_model_free(mq);
    tdm_adamw_state_free(&hs);
    free(g), free(hp), free(dp);
    tdm_lora_free(a);
    tdm_lora_params_free(&lp);
    tdm_model_free(m);
    tdm_st_close(&ref);
    json_decref(ex);
}

static void test_llama_all_r8(void **state)
{
    (void)state;
    run_case("llama_all_r8");
}
static void test_llama_qv_r4(void **state)
{
    (void)state;
    run_case("llama_qv_r4");
}
static void test_qwen2_all_r8(void **state)
{
    (void)state;
    run_case("qwen2_all_r8");
}
static void test_qwen2_qv_r4(void **state)
{
    (void)state;
    run_case("qwen2_qv_r4");
}
static void test_qwen2_qv_r4_rslora(void **state)
{
    (void)state;
    run_case("qwen2_qv_r4_rslora");
}

/* Fused: the cases of one base model as adapters of one run. Every step is one pass over the
 * rows of all of them (adapter k owns a copy of the same sequences), as the synchronized
 * schedule runs it; one multi-tensor AdamW call updates all. Each adapter must reproduce its own
 * case's reference (same tolerances as alone). */
#define MAX_FUSED 4

/* A fused batch of n adapters: adapter k owns a copy of sequences [s0, s1) of d. tok, lab
 * (n * MAX_ROWS), cu (n * MAX_SEQS + 1) and segs (n) are the storage the batch points into. */
static tdm_batch fused_batch(const golden_data *d, int n, int s0, int s1, int32_t *tok,
                             int32_t *lab, int32_t *cu, tdm_batch_seg *segs)
{
    int64_t rows = 0, ns = 0;
    cu[0] = 0;
    for (int k = 0; k < n; k++) {
        int64_t r0 = rows;
        for (int s = s0; s < s1; s++) {
            int32_t len = d->cu[s + 1] - d->cu[s];
            memcpy(tok + rows, d->tokens + d->cu[s], (size_t)len * sizeof(int32_t));
            memcpy(lab + rows, d->labels + d->cu[s], (size_t)len * sizeof(int32_t));
            rows += len;
            cu[++ns] = (int32_t)rows;
        }
        segs[k] = (tdm_batch_seg){k, r0, rows};
    }
    return (tdm_batch){rows, tok, lab, cu, ns, segs, n};
}
static void run_fused(const char *model_name, const char *const *cases, int n)
{
    assert_true(n <= MAX_FUSED);
    golden_data d;
    load_data(&d);
    char path[512];
    snprintf(path, sizeof path, GOLDEN "/%s", model_name);
    tdm_model *m;
    OK(tdm_model_load(&m, be, path, NULL, err));
    json_t *ex[MAX_FUSED];
    tdm_st_file ref[MAX_FUSED];
    tdm_lora_params lp[MAX_FUSED];
    tdm_lora *ad[MAX_FUSED];
    printf("[fused %s] %d adapters in one pass:", model_name, n);
    for (int k = 0; k < n; k++) {
        printf(" %s", cases[k]);
        snprintf(path, sizeof path, GOLDEN "/%s/expected.json", cases[k]);
        ex[k] = load_json(path);
        assert_string_equal(json_string_value(json_object_get(ex[k], "model")), model_name);
        snprintf(path, sizeof path, GOLDEN "/%s/expected.safetensors", cases[k]);
        OK(tdm_st_open(&ref[k], path, err));
        snprintf(path, sizeof path, GOLDEN "/%s/adapter", cases[k]);
        OK(tdm_peft_load(path, tdm_model_get_config(m), &lp[k], NULL, err));
        ad[k] = upload_adapter(m, &lp[k]);
        OK(tdm_lora_zero_grad(ad[k], err));
    }
    printf("\n");

    static int32_t tok[MAX_FUSED * MAX_ROWS], lab[MAX_FUSED * MAX_ROWS];
    int32_t cu[MAX_FUSED * MAX_SEQS + 1];
    tdm_batch_seg segs[MAX_FUSED];
    tdm_batch fb;
    double ls[MAX_FUSED], worst = 0;
    int64_t nt[MAX_FUSED];
    fb = fused_batch(&d, n, 0, d.n_seqs, tok, lab, cu, segs);
    OK(tdm_model_step(m, ad, n, &fb, true, NULL, ls, nt, err));
    cmp_stats gw = {0, 0, 0, 1};
    for (int k = 0; k < n; k++) {
        char what[96];
        snprintf(what, sizeof what, "fused batch loss of %s", cases[k]);
        check_loss(what, ls[k] / (double)nt[k], num(ex[k], "loss"), 1e-4, &worst);
        float *g = malloc((size_t)ad[k]->n_params * sizeof(float));
        OK(tdm_be_download_f32(be, g, ad[k]->grads, TDM_BE_F32, ad[k]->n_params, err));
        cmp_stats s =
            compare_adapter(ad[k], &lp[k], g, &ref[k], "grad.", 1e-4, 1e-4, INFINITY, 1e-8);
        gw.rel_l2 = fmax(gw.rel_l2, s.rel_l2);
        free(g);
    }
    /* one epoch: step s fuses sequence s of every adapter */
    json_t *tr = json_object_get(ex[0], "train");
    double lr = num(tr, "lr");
    for (int s = 0; s < d.n_seqs; s++) {
        tdm_adamw_tensor ts[MAX_FUSED];
        for (int k = 0; k < n; k++)
            OK(tdm_lora_zero_grad(ad[k], err));
        fb = fused_batch(&d, n, s, s + 1, tok, lab, cu, segs);
        OK(tdm_model_step(m, ad, n, &fb, true, NULL, ls, nt, err));
        for (int k = 0; k < n; k++) {
            json_t *trk = json_object_get(ex[k], "train");
            char what[96];
            snprintf(what, sizeof what, "fused step %d loss of %s", s + 1, cases[k]);
            check_loss(
                what, ls[k] / (double)nt[k],
                json_number_value(json_array_get(json_object_get(trk, "step_losses"), (size_t)s)),
                1e-4, &worst);
            json_t *betas = json_object_get(trk, "betas");
            ts[k] = (tdm_adamw_tensor){ad[k]->params,
                                       ad[k]->grads,
                                       ad[k]->adam_m,
                                       ad[k]->adam_v,
                                       ad[k]->n_params,
                                       NULL,
                                       num(trk, "lr"),
                                       json_number_value(json_array_get(betas, 0)),
                                       json_number_value(json_array_get(betas, 1)),
                                       num(trk, "eps"),
                                       0.0,
                                       s + 1};
        }
        OK(tdm_be_adamw(be, ts, n, err));
    }
    cmp_stats tw = {0, 0, 0, 1};
    for (int k = 0; k < n; k++) {
        float *p = malloc((size_t)ad[k]->n_params * sizeof(float));
        OK(tdm_be_download_f32(be, p, ad[k]->params, TDM_BE_F32, ad[k]->n_params, err));
        cmp_stats s = compare_adapter(ad[k], &lp[k], p, &ref[k], "trained.", 1e-5, INFINITY,
                                      1e-3 * lr * d.n_seqs, 1e-9);
        tw.rel_l2 = fmax(tw.rel_l2, s.rel_l2), tw.max_abs = fmax(tw.max_abs, s.max_abs);
        free(p);
        tdm_lora_free(ad[k]);
        tdm_lora_params_free(&lp[k]);
        tdm_st_close(&ref[k]);
        json_decref(ex[k]);
    }
    printf("[fused %s] SUMMARY worst loss rel err %.2e; gradients worst rel L2 %.2e; trained "
           "worst rel L2 %.2e, max abs %.2e\n",
           model_name, worst, gw.rel_l2, tw.rel_l2, tw.max_abs);
    tdm_model_free(m);
}

static void test_llama_fused(void **state)
{
    (void)state;
    const char *cases[2] = {"llama_all_r8", "llama_qv_r4"};
    run_fused("llama", cases, 2);
}
static void test_qwen2_fused(void **state)
{
    (void)state;
    const char *cases[3] = {"qwen2_all_r8", "qwen2_qv_r4", "qwen2_qv_r4_rslora"};
    run_fused("qwen2", cases, 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_all_r8),       cmocka_unit_test(test_llama_qv_r4),
        cmocka_unit_test(test_qwen2_all_r8),       cmocka_unit_test(test_qwen2_qv_r4),
        cmocka_unit_test(test_qwen2_qv_r4_rslora), cmocka_unit_test(test_llama_fused),
        cmocka_unit_test(test_qwen2_fused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
