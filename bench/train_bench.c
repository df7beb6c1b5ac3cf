/* train_bench.c — training throughput and memory of the engine under each gradient-checkpointing
 * mode, on one model load (bench/recompute, scripts/device/recompute-bench.sh).
 *
 *     bench_train MODEL_DIR [--device cpu|cuda] [--batch 4] [--len var|N] [--median 245]
 *                 [--max-len 2048] [--steps 10] [--warmup 3] [--rank 16] [--method qlora|lora]
 *                 [--modes none,layer,mlp,attn] [--seed 1] [--matmul N]
 *                 [--base-compute bf16|fp8] [--profile] [--plan-layers N]
 *     bench_train --matmul N [--device cuda]       the bf16 matmul rate only
 *
 * One adapter on q_proj,v_proj (rank r, alpha 2r, PEFT init with the same seed in every mode),
 * batches of `batch` sequences of random ids: every sequence N tokens, or with `--len var` a
 * log-normal length (median --median, sigma 0.9, clipped to [8, --max-len]; the same lengths in
 * every mode). Each step is a fused forward + backward, the gradient norm, clipping and AdamW, as
 * the trainer runs it. Per mode (`none`: no checkpointing; layer, mlp, attn: --grad-checkpoint
 * --recompute MODE) the workspace is reserved for the largest batch first (tdm_model_reserve),
 * then warm-up steps, then timed steps. One line per mode:
 *   mode tok/s ratio-to-the-first-mode MFU step-ms act-MiB est-act-MiB peak-MiB est-MiB loss same
 * act: the activation workspace allocated; est-act: tdm_model_memory_estimate's activations for
 * the same plan; peak: the backend's peak bytes over the mode's steps; est: the estimate's
 * weights + activations + adapters + backend scratch; loss: adapter 0's mean loss summed over
 * the timed steps; same: whether every step's loss equals the first mode's bit for bit; MFU:
 * model FLOPs per second over the bf16 matmul rate measured first in the same process (--matmul N,
 * default 8192; 0: not measured): Y = X W^T of bf16 N x N matrices through tdm_be_linear_fwd (on
 * CUDA one cuBLASLt matmul, the engine's own GEMM path), 3 untimed then 10 timed one by one
 * between synchronizations, the median, 2 N^3 FLOPs each. Model FLOPs per token
 * (docs/benchmarks.md, "MFU"): 4 x the frozen linear parameters (q, k, v, o, gate, up, down of
 * every layer and the lm_head: 2 forward + 2 for the input gradient, no weight gradient) plus
 * attention, 6 x layers x heads x head_dim x sum(S^2) / sum(S) over the timed sequences (QK^T
 * and PV, 4 S d forward per token halved by the causal mask, backward twice the forward).
 * Recomputation is not counted: MFU counts the model's work, not the implementation's.
 * --base-compute fp8: the backend and model run the NF4 projections' GEMMs in FP8 (as
 * `tandem finetune --base-compute fp8`); MFU stays against the bf16 matmul rate.
 * --profile: after each mode's timed steps, `--steps` more steps with per-op device timing
 * (op_profile.h, as `tandem finetune --profile-ops`), its table printed with every line
 * prefixed "# "; the timed figures above it are not affected.
 * --plan-layers N: after each mode's line, "# MODE at N layers: est-MiB X, host MiB Y": the same
 * estimate for the model with N decoder layers (the adapter's parameters scaled by N / layers),
 * for a model written with `tandem init-model --layers` to measure a step that all of the real
 * model's layers would make too long for one call (scripts/device/long-context.sh, LAYERS).
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/backend.h"
#include "engine/model.h"
#include "engine/op_profile.h"
#include "util/rng.h"

#define MIB (1024.0 * 1024.0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int die(const char *what, const tdm_error *err)
{
    fprintf(stderr, "bench_train: %s: %s\n", what, err->message);
    return 1;
}

/* The adapter of every mode: PEFT's init (A uniform in +-1/sqrt(in), B zero) from one seed. */
static tdm_status make_adapter(tdm_model *m, int rank, uint64_t seed, tdm_lora **out,
                               tdm_error *err)
{
    const tdm_model_config *c = tdm_model_get_config(m);
    unsigned targets = TDM_LORA_BIT(TDM_LORA_Q) | TDM_LORA_BIT(TDM_LORA_V);
    TDM_TRY(tdm_lora_create(out, m, rank, 2.0f, targets, err));
    tdm_rng rng;
    tdm_rng_seed(&rng, seed);
    for (int l = 0; l < c->num_layers; l++)
        for (int t = 0; t < TDM_LORA_N_TARGETS; t++) {
            if (!(targets & TDM_LORA_BIT(t))) continue;
            int64_t in, o;
            tdm_model_target_shape(m, (tdm_lora_target)t, &in, &o);
            float *A = malloc((size_t)(rank * in) * sizeof(float));
            if (!A) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
            double bound = 1.0 / sqrt((double)in);
            for (int64_t i = 0; i < rank * in; i++)
                A[i] = (float)((2 * tdm_rng_uniform(&rng) - 1) * bound);
            tdm_status st = tdm_lora_set(*out, l, (tdm_lora_target)t, A, NULL, err);
            free(A);
            TDM_TRY(st);
        }
    return TDM_OK;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median TFLOP/s of Y = X W^T, bf16 n x n, through the backend's frozen-linear GEMM. */
static tdm_status matmul_rate(tdm_backend *be, int64_t n, double *tflops, tdm_error *err)
{
    *tflops = 0;
    tdm_be_dtype act = tdm_be_act_dtype(be);
    void *w = NULL, *x = NULL, *y = NULL;
    tdm_status st = tdm_be_alloc(be, act, n * n, &w, err);
    if (st == TDM_OK) st = tdm_be_alloc(be, act, n * n, &x, err);
    if (st == TDM_OK) st = tdm_be_alloc(be, act, n * n, &y, err);
    if (st == TDM_OK) st = tdm_be_fill(be, w, act, n * n, 0.01f, err);
    if (st == TDM_OK) st = tdm_be_fill(be, x, act, n * n, 0.5f, err);
    tdm_be_weight wt = {.format = act == TDM_BE_F32 ? TDM_BE_W_F32 : TDM_BE_W_BF16,
                        .rows = n,
                        .cols = n,
                        .data = w};
    double t[10];
    for (int i = 0; st == TDM_OK && i < 13; i++) {
        double t0 = now_s();
        st = tdm_be_linear_fwd(be, &wt, x, n, y, 0.0f, err);
        if (st == TDM_OK) st = tdm_be_synchronize(be, err);
        if (i >= 3) t[i - 3] = now_s() - t0;
    }
    if (st == TDM_OK) {
        qsort(t, 10, sizeof *t, cmp_double);
        *tflops = 2.0 * (double)n * (double)n * (double)n / (0.5 * (t[4] + t[5])) / 1e12;
    }
    tdm_be_free(be, w), tdm_be_free(be, x), tdm_be_free(be, y);
    return st;
}

/* One training step as the trainer runs it: zero the gradients, the fused forward + backward of
 * one batch (`rows` tokens of `batch` sequences, boundaries cu), the gradient norm, clipping
 * and AdamW (step number t); *mean: the batch's mean loss. */
static tdm_status train_step(tdm_backend *be, tdm_model *m, tdm_lora *a, int64_t rows,
                             int32_t *tok, int32_t *cu, int batch, int t, float *sumsq,
                             float *coef, double *mean, tdm_error *err)
{
    tdm_batch_seg seg = {0, 0, rows};
    tdm_batch b = {rows, tok, tok, cu, batch, &seg, 1};
    double loss;
    int64_t ntok;
    TDM_TRY(tdm_lora_zero_grad(a, err));
    TDM_TRY(tdm_model_step(m, &a, 1, &b, true, NULL, &loss, &ntok, err));
    tdm_be_vec vec = {a->grads, a->n_params, 0};
    float max_norm = 1.0f;
    tdm_adamw_tensor ts = {a->params, a->grads, a->adam_m, a->adam_v, a->n_params, coef,
                           2e-4,      0.9,      0.999,     1e-8,      0.0,         t};
    TDM_TRY(tdm_be_sumsq(be, &vec, 1, 1, sumsq, err));
    TDM_TRY(tdm_be_clip_coef(be, sumsq, &max_norm, 1, coef, NULL, err));
    TDM_TRY(tdm_be_adamw(be, &ts, 1, err));
    *mean = loss / (double)ntok;
    return TDM_OK;
}

/* --profile: the timed steps' batches again under per-op device timing; the table to stdout,
 * each line prefixed "# ". */
static tdm_status profile_steps(tdm_backend *be, tdm_model *m, tdm_lora *a, int64_t *rows,
                                int32_t **tok, int32_t **cu, int batch, int warmup, int steps,
                                float *sumsq, float *coef, tdm_error *err)
{
    TDM_TRY(tdm_be_synchronize(be, err));
    TDM_TRY(tdm_be_profile_enable(be, true, err));
    tdm_status st = TDM_OK;
    for (int s = warmup; s < warmup + steps && st == TDM_OK; s++) {
        double mean;
        st = train_step(be, m, a, rows[s], tok[s], cu[s], batch, warmup + steps + s + 1, sumsq,
                        coef, &mean, err);
    }
    if (st == TDM_OK) st = tdm_be_synchronize(be, err);
    if (st == TDM_OK) {
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        if (f) {
            printf("# profile of %d steps (--profile):\n", steps);
            tdm_be_profile_report(be, f);
            fclose(f);
            for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
                 line = strtok_r(NULL, "\n", &save))
                printf("# %s\n", line);
            free(text);
        }
    }
    tdm_be_profile_enable(be, false, NULL);
    return st;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr,
                "usage: %s MODEL_DIR [--device cpu|cuda] [--batch B] [--len var|N] [--median N] "
                "[--max-len N] [--steps S] [--warmup W] [--rank R] [--method qlora|lora] "
                "[--modes none,layer,mlp,attn[+offload],...] [--seed S] "
                "[--base-compute bf16|fp8] [--profile]\n",
                argv[0]);
        return 2;
    }
    const char *dir = argv[1], *device = "cpu", *method = "qlora", *len = "var";
    const char *modes = "none,layer,mlp,attn", *base_compute = "bf16";
    int batch = 4, steps = 10, warmup = 3, rank = 16, median = 245, max_len = 2048;
    int64_t mm = 8192, plan_layers = 0;
    uint64_t seed = 1;
    bool only_matmul = !strcmp(argv[1], "--matmul"), profile = false;
    for (int i = only_matmul ? 1 : 2; i < argc; i += 2) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(k, "--profile")) {
            profile = true;
            i--; /* takes no value */
        } else if (!strcmp(k, "--device"))
            device = v;
        else if (!strcmp(k, "--method"))
            method = v;
        else if (!strcmp(k, "--len"))
            len = v;
        else if (!strcmp(k, "--modes"))
            modes = v;
        else if (!strcmp(k, "--batch"))
            batch = atoi(v);
        else if (!strcmp(k, "--steps"))
            steps = atoi(v);
        else if (!strcmp(k, "--warmup"))
            warmup = atoi(v);
        else if (!strcmp(k, "--rank"))
            rank = atoi(v);
        else if (!strcmp(k, "--median"))
            median = atoi(v);
        else if (!strcmp(k, "--max-len"))
            max_len = atoi(v);
        else if (!strcmp(k, "--seed"))
            seed = strtoull(v, NULL, 10);
        else if (!strcmp(k, "--matmul"))
            mm = atoll(v);
        else if (!strcmp(k, "--base-compute"))
            base_compute = v;
        else if (!strcmp(k, "--plan-layers"))
            plan_layers = atoll(v);
        else {
            fprintf(stderr, "bench_train: unknown option %s\n", k);
            return 2;
        }
    }
    int fixed = strcmp(len, "var") ? atoi(len) : 0;
    if (batch < 1 || steps < 1 || warmup < 0 || rank < 1 || median < 2 || max_len < 8 ||
        plan_layers < 0 ||
        (strcmp(len, "var") && fixed < 2) || (strcmp(method, "qlora") && strcmp(method, "lora")) ||
        (strcmp(base_compute, "bf16") && strcmp(base_compute, "fp8"))) {
        fprintf(stderr, "bench_train: bad arguments\n");
        return 2;
    }
    tdm_error err = {0};
    tdm_backend *be;
    tdm_backend_opts bo = {.base_fp8 = !strcmp(base_compute, "fp8")};
    if (tdm_backend_create(&be, device, &bo, &err) != TDM_OK) return die("backend", &err);
    double rate = 0;
    if (mm > 0) {
        if (matmul_rate(be, mm, &rate, &err) != TDM_OK) return die("matmul", &err);
        printf("# matmul %s %lld^3 through tdm_be_linear_fwd: %.2f TFLOP/s (median of 10)\n",
               tdm_be_act_dtype(be) == TDM_BE_BF16 ? "bf16" : "f32", (long long)mm, rate);
        fflush(stdout);
    }
    if (only_matmul) {
        tdm_backend_free(be);
        return 0;
    }
    bool nf4 = !strcmp(method, "qlora");
    tdm_model_opts mo = {.nf4 = nf4, .double_quant = nf4, .base_fp8 = nf4 && bo.base_fp8};
    tdm_model *m;
    double t0 = now_s();
    if (tdm_model_load(&m, be, dir, &mo, &err) != TDM_OK) return die(dir, &err);
    double load_s = now_s() - t0;
    const tdm_model_config *c = tdm_model_get_config(m);

    /* every step's batch, the same in every mode */
    int n_steps = warmup + steps;
    tdm_rng rng;
    tdm_rng_seed(&rng, seed);
    int32_t **tok = calloc((size_t)n_steps, sizeof *tok),
            **cu = calloc((size_t)n_steps, sizeof *cu);
    int64_t *rows = calloc((size_t)n_steps, sizeof *rows), max_rows = 0, timed_tokens = 0,
            max_seq = 0;
    if (!tok || !cu || !rows) return 1;
    for (int s = 0; s < n_steps; s++) {
        if (!(cu[s] = malloc((size_t)(batch + 1) * sizeof(int32_t)))) return 1;
        cu[s][0] = 0;
        for (int q = 0; q < batch; q++) {
            int n = fixed;
            if (!fixed) {
                double z = tdm_rng_normal(&rng);
                n = (int)lround(exp(log((double)median) + 0.9 * z));
                n = n < 8 ? 8 : n > max_len ? max_len : n;
            }
            cu[s][q + 1] = cu[s][q] + n;
            if (n > max_seq) max_seq = n;
        }
        rows[s] = cu[s][batch];
        if (rows[s] > max_rows) max_rows = rows[s];
        if (s >= warmup) timed_tokens += rows[s];
        if (!(tok[s] = malloc((size_t)rows[s] * sizeof(int32_t)))) return 1;
        for (int64_t i = 0; i < rows[s]; i++)
            tok[s][i] = (int32_t)(tdm_rng_next(&rng) % (uint64_t)c->vocab_size);
    }
    double sq = 0; /* sum of S^2 over the timed sequences */
    for (int s = warmup; s < n_steps; s++)
        for (int q = 0; q < batch; q++)
            sq += (double)(cu[s][q + 1] - cu[s][q]) * (double)(cu[s][q + 1] - cu[s][q]);
    double H = (double)c->hidden_size, I = (double)c->intermediate_size;
    double Qd = (double)(c->num_heads * c->head_dim), Kd = (double)(c->num_kv_heads * c->head_dim);
    double linear =
        (double)c->num_layers * (2 * H * Qd + 2 * H * Kd + 3 * H * I) + H * (double)c->vocab_size;
    double flops_tok = 4 * linear + 6 * (double)c->num_layers * Qd * sq / (double)timed_tokens;
    printf("# %s on %s, %s, load %.1f s; batch %d, %s; %d warm-up + %d timed steps, %" PRId64
           " timed tokens, largest batch %" PRId64 " rows; rank %d q_proj,v_proj\n",
           dir, device, method, load_s, batch, fixed ? len : "variable length", warmup, steps,
           timed_tokens, max_rows, rank);
    printf("# model FLOPs per token %.4g (frozen linear %.4g params)\n", flops_tok, linear);
    printf("%-6s %10s %6s %6s %9s %9s %11s %9s %9s %12s %s\n", "mode", "tok/s", "ratio", "MFU",
           "step-ms", "act-MiB", "est-act-MiB", "peak-MiB", "est-MiB", "loss", "same");

    float *sumsq = NULL, *coef = NULL;
    if (tdm_be_alloc(be, TDM_BE_F32, 1, (void **)&sumsq, &err) != TDM_OK ||
        tdm_be_alloc(be, TDM_BE_F32, 1, (void **)&coef, &err) != TDM_OK)
        return die("alloc", &err);
    double *first_loss = calloc((size_t)n_steps, sizeof(double)), first_tok_s = 0;
    int n_mode = 0;
    char list[256];
    snprintf(list, sizeof list, "%s", modes);
    for (char *save = NULL, *name = strtok_r(list, ",", &save); name;
         name = strtok_r(NULL, ",", &save), n_mode++) {
        tdm_recompute rc = TDM_RECOMPUTE_LAYER;
        /* MODE+offload: the same with --offload-activations */
        char *plus = strchr(name, '+');
        bool offload = plus && !strcmp(plus, "+offload");
        if (plus && !offload) {
            fprintf(stderr, "bench_train: mode %s: only +offload may follow a mode\n", name);
            return 2;
        }
        char base_mode[32];
        snprintf(base_mode, sizeof base_mode, "%.*s", plus ? (int)(plus - name) : 31, name);
        bool gc = strcmp(base_mode, "none") != 0;
        if (gc && !tdm_recompute_parse(base_mode, &rc)) {
            fprintf(stderr, "bench_train: mode %s is not none, layer, mlp or attn\n", name);
            return 2;
        }
        tdm_model_set_recompute(m, gc, rc);
        tdm_model_set_offload_activations(m, offload);
        tdm_lora *a;
        if (make_adapter(m, rank, seed, &a, &err) != TDM_OK) return die("lora", &err);
        int64_t per_module = 0;
        for (int t = 0; t < TDM_LORA_N_TARGETS; t++) {
            int64_t in, o;
            tdm_model_target_shape(m, (tdm_lora_target)t, &in, &o);
            if ((a->targets & TDM_LORA_BIT(t)) && rank * (in + o) > per_module)
                per_module = rank * (in + o);
        }
        tdm_model_mem_plan plan = {.rows = max_rows,
                                   .max_seq = max_seq,
                                   .n_seqs = batch,
                                   .max_rank = rank,
                                   .targets = a->targets,
                                   .lora_params = a->n_params,
                                   .lora_module_params = per_module,
                                   .backward = true};
        tdm_model_opts eo = {.nf4 = nf4,
                             .double_quant = nf4,
                             .grad_checkpoint = gc,
                             .recompute = rc,
                             .offload_activations = offload,
                             .base_fp8 = mo.base_fp8};
        tdm_model_mem est;
        if (tdm_model_memory_estimate(c, &eo, tdm_be_act_dtype(be), &plan, &est, &err) != TDM_OK ||
            tdm_model_reserve(m, &plan, &err) != TDM_OK)
            return die("reserve", &err);
        tdm_be_reset_peak(be);
        double t_start = now_s(), loss_sum = 0;
        bool same = true;
        for (int s = 0; s < n_steps; s++) {
            if (s == warmup) {
                if (tdm_be_synchronize(be, &err) != TDM_OK) return die("sync", &err);
                t_start = now_s();
            }
            double mean;
            if (train_step(be, m, a, rows[s], tok[s], cu[s], batch, s + 1, sumsq, coef, &mean,
                           &err) != TDM_OK)
                return die("step", &err);
            if (n_mode == 0) first_loss[s] = mean;
            same &= mean == first_loss[s];
            if (s >= warmup) loss_sum += mean;
        }
        if (tdm_be_synchronize(be, &err) != TDM_OK) return die("sync", &err);
        double el = now_s() - t_start, tok_s = (double)timed_tokens / el;
        if (profile && profile_steps(be, m, a, rows, tok, cu, batch, warmup, steps, sumsq, coef,
                                     &err) != TDM_OK)
            return die("profile", &err);
        if (n_mode == 0) first_tok_s = tok_s;
        tdm_be_mem_info mi;
        if (tdm_be_memory(be, &mi, &err) != TDM_OK) return die("memory", &err);
        uint64_t est_all = est.weights + est.activations + est.adapters + est.backend_scratch;
        char mfu[16] = "-";
        if (rate > 0) snprintf(mfu, sizeof mfu, "%.1f%%", 100 * tok_s * flops_tok / (rate * 1e12));
        if (offload)
            printf("# %s: %.1f MiB of layer inputs in page-locked host memory\n", name,
                   (double)est.host_activations / MIB);
        printf("%-6s %10.1f %5.2fx %6s %9.1f %9.1f %11.1f %9.1f %9.1f %12.6f %s\n", name, tok_s,
               tok_s / first_tok_s, mfu, 1000 * el / steps,
               (double)tdm_model_activation_bytes(m) / MIB, (double)est.activations / MIB,
               (double)mi.peak_bytes / MIB, (double)est_all / MIB, loss_sum, same ? "yes" : "NO");
        if (plan_layers > 0) {
            tdm_model_config pc = *c;
            pc.num_layers = plan_layers;
            tdm_model_mem_plan pp = plan;
            pp.lora_params = a->n_params / c->num_layers * plan_layers;
            tdm_model_mem pe;
            if (tdm_model_memory_estimate(&pc, &eo, tdm_be_act_dtype(be), &pp, &pe, &err) != TDM_OK)
                return die("estimate", &err);
            printf("# %s at %" PRId64 " layers: est-MiB %.1f, host MiB %.1f\n", name, plan_layers,
                   (double)(pe.weights + pe.activations + pe.adapters + pe.backend_scratch) / MIB,
                   (double)pe.host_activations / MIB);
        }
        fflush(stdout);
        tdm_lora_free(a);
    }
    for (int s = 0; s < n_steps; s++)
        free(tok[s]), free(cu[s]);
    free(tok), free(cu), free(rows), free(first_loss);
    tdm_be_free(be, sumsq);
    tdm_be_free(be, coef);
    tdm_model_free(m);
    tdm_backend_free(be);
    return 0;
}
