/* cpu_train.c — CPU training throughput of the engine (tokens/s), used by bench/cpu_train_bench.sh.
 *
 *     bench_cpu_train MODEL_DIR N_ADAPTERS [--seq 256] [--rank 16] [--batch 2] [--steps 3]
 *                     [--warmup 1] [--method qlora|lora] [--threads 0] [--profile 0|1]
 *
 * Loads MODEL_DIR (e.g. written by `tandem init-model --preset tiny`), creates N_ADAPTERS LoRA
 * adapters on q_proj,v_proj (rank r, alpha 2r, PEFT init: A uniform, B zero), and times full
 * training steps exactly as the synchronized schedule runs them: one fused forward + backward
 * over batch x N_ADAPTERS sequences of SEQ tokens (random ids, every label counted), then the
 * per-adapter gradient norms, clip coefficients (max norm 1) and one multi-tensor AdamW update.
 * Prints one line: tokens/s = N_ADAPTERS * batch * seq * steps / time of the timed steps (the
 * warm-up steps are not timed: they grow the activation buffers). Library calls only; the
 * `finetune` CLI adds data loading and logging on top. --profile 1 times every backend op of the
 * timed steps (engine/op_profile.h) and prints the table to stderr (it costs a little time).
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

#define MAX_ADAPTERS 16

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int die(const char *what, const tdm_error *err)
{
    fprintf(stderr, "bench_cpu_train: %s: %s\n", what, err->message);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr,
                "usage: %s MODEL_DIR N_ADAPTERS [--seq N] [--rank R] [--batch B] "
                "[--steps S] [--warmup W] [--method qlora|lora] [--threads T] [--profile 0|1]\n",
                argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    int n_ad = atoi(argv[2]);
    int seq = 256, rank = 16, batch = 2, steps = 3, warmup = 1, threads = 0, profile = 0;
    const char *method = "qlora";
    for (int i = 3; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--seq"))
            seq = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rank"))
            rank = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch"))
            batch = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps"))
            steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--warmup"))
            warmup = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--method"))
            method = argv[i + 1];
        else if (!strcmp(argv[i], "--threads"))
            threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--profile"))
            profile = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "bench_cpu_train: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (n_ad < 1 || n_ad > MAX_ADAPTERS || seq < 2 || rank < 1 || batch < 1 || steps < 1 ||
        warmup < 0 || (strcmp(method, "qlora") && strcmp(method, "lora"))) {
        fprintf(stderr, "bench_cpu_train: bad arguments\n");
        return 2;
    }
    tdm_error err = {0};
    tdm_backend *be;
    tdm_backend_opts bo = {.n_threads = threads};
    if (tdm_backend_create(&be, "cpu", &bo, &err) != TDM_OK) return die("backend", &err);
    tdm_model_opts mo = {.nf4 = !strcmp(method, "qlora"), .double_quant = !strcmp(method, "qlora")};
    tdm_model *m;
    double t0 = now_s();
    if (tdm_model_load(&m, be, dir, &mo, &err) != TDM_OK) return die(dir, &err);
    double load_s = now_s() - t0;
    const tdm_model_config *c = tdm_model_get_config(m);

    tdm_lora *ad[MAX_ADAPTERS];
    tdm_rng rng;
    tdm_rng_seed(&rng, 1);
    unsigned targets = TDM_LORA_BIT(TDM_LORA_Q) | TDM_LORA_BIT(TDM_LORA_V);
    for (int a = 0; a < n_ad; a++) {
        if (tdm_lora_create(&ad[a], m, rank, 2.0f, targets, &err) != TDM_OK)
            return die("lora", &err);
        for (int l = 0; l < c->num_layers; l++)
            for (int t = 0; t < TDM_LORA_N_TARGETS; t++) {
                if (!(targets & TDM_LORA_BIT(t))) continue;
                int64_t in, out;
                tdm_model_target_shape(m, (tdm_lora_target)t, &in, &out);
                float *A = malloc((size_t)(rank * in) * sizeof(float));
                double bound = 1.0 / sqrt((double)in);
                for (int64_t i = 0; i < rank * in; i++)
                    A[i] = (float)((2 * tdm_rng_uniform(&rng) - 1) * bound);
                if (tdm_lora_set(ad[a], l, (tdm_lora_target)t, A, NULL, &err) != TDM_OK)
                    return die("lora_set", &err);
                free(A);
            }
    }

    /* the fused batch: adapter a owns sequences [a*batch, (a+1)*batch) */
    int64_t n_seqs = (int64_t)n_ad * batch, rows = n_seqs * seq;
    int32_t *tok = malloc((size_t)rows * sizeof(int32_t)),
            *lab = malloc((size_t)rows * sizeof(int32_t));
    int32_t *cu = malloc((size_t)(n_seqs + 1) * sizeof(int32_t));
    tdm_batch_seg segs[MAX_ADAPTERS];
    for (int64_t i = 0; i < rows; i++)
        tok[i] = lab[i] = (int32_t)(tdm_rng_next(&rng) % (uint64_t)c->vocab_size);
    for (int64_t s = 0; s <= n_seqs; s++)
        cu[s] = (int32_t)(s * seq);
    for (int a = 0; a < n_ad; a++)
        segs[a] = (tdm_batch_seg){a, (int64_t)a * batch * seq, (int64_t)(a + 1) * batch * seq};
    tdm_batch b = {rows, tok, lab, cu, n_seqs, segs, n_ad};

    float *sumsq = NULL, *coef = NULL;
    if (tdm_be_alloc(be, TDM_BE_F32, n_ad, (void **)&sumsq, &err) != TDM_OK ||
        tdm_be_alloc(be, TDM_BE_F32, n_ad, (void **)&coef, &err) != TDM_OK)
        return die("alloc", &err);
    float max_norm[MAX_ADAPTERS];
    tdm_be_vec vecs[MAX_ADAPTERS];
    tdm_adamw_tensor ts[MAX_ADAPTERS];
    double loss[MAX_ADAPTERS];
    int64_t ntok[MAX_ADAPTERS];
    double t_start = 0;
    for (int step = 0; step < warmup + steps; step++) {
        if (step == warmup) {
            if (profile && tdm_be_profile_enable(be, true, &err) != TDM_OK)
                return die("profile", &err);
            t_start = now_s();
        }
        for (int a = 0; a < n_ad; a++)
            if (tdm_lora_zero_grad(ad[a], &err) != TDM_OK) return die("zero_grad", &err);
        if (tdm_model_step(m, ad, n_ad, &b, true, NULL, loss, ntok, &err) != TDM_OK)
            return die("step", &err);
        for (int a = 0; a < n_ad; a++) {
            vecs[a] = (tdm_be_vec){ad[a]->grads, ad[a]->n_params, a};
            max_norm[a] = 1.0f;
            ts[a] = (tdm_adamw_tensor){ad[a]->params,   ad[a]->grads, ad[a]->adam_m, ad[a]->adam_v,
                                       ad[a]->n_params, coef + a,     2e-4,          0.9,
                                       0.999,           1e-8,         0.0,           step + 1};
        }
        if (tdm_be_sumsq(be, vecs, n_ad, n_ad, sumsq, &err) != TDM_OK ||
            tdm_be_clip_coef(be, sumsq, max_norm, n_ad, coef, NULL, &err) != TDM_OK ||
            tdm_be_adamw(be, ts, n_ad, &err) != TDM_OK || tdm_be_synchronize(be, &err) != TDM_OK)
            return die("optimizer", &err);
    }
    double el = now_s() - t_start;
    if (profile) tdm_be_profile_report(be, stderr);
    double toks = (double)rows * steps;
    printf("model %s method %s adapters %d seq %d batch/adapter %d rank %d: load %.2f s, "
           "%d timed steps %.3f s/step, %.1f tokens/s (loss of adapter 0 %.4f)\n",
           dir, method, n_ad, seq, batch, rank, load_s, steps, el / steps, toks / el,
           loss[0] / (double)ntok[0]);
    free(tok), free(lab), free(cu);
    tdm_be_free(be, sumsq);
    tdm_be_free(be, coef);
    for (int a = 0; a < n_ad; a++)
        tdm_lora_free(ad[a]);
    tdm_model_free(m);
    tdm_backend_free(be);
    return 0;
}
