/* test_model.c — the whole decoder over the CPU backend:
 *   - finite-difference check of every LoRA gradient kind (A and B of all seven modules, a
 *     sample of elements) on tiny random Llama (llama3 RoPE, untied), Qwen2 (q/k/v biases,
 *     tied), Qwen3 (q/k norms, head_dim != hidden/heads) and Mistral models, in f32 ("lora")
 *     and NF4 ("qlora") modes, with packed sequences and -100 labels;
 *   - gradient checkpointing gives bit-identical losses and gradients;
 *   - fused equals alone: three adapters of different ranks and targets in one batch give each
 *     adapter the same loss and gradients as running it alone, to float rounding.
 *   - LoRA dropout: finite differences of the training loss with dropout on every module,
 *     checkpointing bit-equal with dropout (the recompute regenerates the masks), fused = alone
 *     with dropout, dropout 0 = the plain path whatever the mask seed, evaluation never drops.
 *   - tdm_model_last_logits agrees with the step's cross-entropy (fused, adapter and bare base),
 *     and greedy decoding (train/generate.h) follows the argmax, stops at a stop token, after
 *     max_new_tokens and at a full context.
 * The models are written by the test (config.json + model.safetensors with random weights,
 * random norm weights and biases), so nothing depends on fixtures. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/backend.h"
#include "engine/model.h"
#include "model/config.h"
#include "model/layout.h"
#include "model/presets.h"
#include "model/safetensors.h"
#include "train/generate.h"
#include "util/rng.h"

static tdm_backend *be;
static char tmpdir[256];

static int setup(void **state)
{
    tdm_error err = {0};
    if (tdm_backend_create(&be, "cpu", NULL, &err) != TDM_OK) return -1;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/tandem-test-model-XXXXXX");
    if (!mkdtemp(tmpdir)) return -1;
    return 0;
}

static int teardown(void **state)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    tdm_backend_free(be);
    return 0;
}

#define OK(call)                                                                                   \
    do {                                                                                           \
        tdm_error err_ = {0};                                                                      \
        tdm_error *err = &err_;                                                                    \
        if ((call) != TDM_OK) fail_msg("%s: %s", #call, err_.message);                             \
    } while (0)

static double unif(tdm_rng *r, double lo, double hi)
{
    return lo + (hi - lo) * tdm_rng_uniform(r);
}

/* Decoder layers of the models write_model writes (a test that needs more sets it around its
 * call, with a name of its own). */
static int model_layers = 2;

/* Writes a tiny model of the preset's architecture into tmpdir/<name>; returns its path. */
static const char *write_model(const char *preset, const char *name, uint64_t seed)
{
    static char dir[400];
    snprintf(dir, sizeof dir, "%s/%s", tmpdir, name);
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (access(path, F_OK) == 0) return dir;
    assert_int_equal(mkdir(dir, 0755), 0);
    tdm_model_config c;
    OK(tdm_preset_config(preset, &c, err));
    c.hidden_size = 16;
    c.intermediate_size = 24;
    c.num_layers = model_layers;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = c.qk_norm ? 8 : 4; /* Qwen3: q is 32 wide while hidden is 16 */
    c.vocab_size = 40;
    c.max_position_embeddings = 64;
    if (c.rope.type == TDM_ROPE_LLAMA3) c.rope.original_max_position_embeddings = 16;
    char *json;
    OK(tdm_model_config_to_json(&c, &json, err));
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(json, f);
    fclose(f);
    free(json);
    tdm_model_config back;
    OK(tdm_model_config_load(&back, dir, err)); /* round trip: what the loader will see */

    tdm_tensor_desc *lay;
    size_t n;
    OK(tdm_model_layout(&back, &lay, &n, err));
    tdm_st_spec *specs = calloc(n, sizeof *specs);
    const void **data = calloc(n, sizeof *data);
    tdm_rng r;
    tdm_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) {
        int64_t numel = lay[i].shape[0] * (lay[i].rank == 2 ? lay[i].shape[1] : 1);
        float *v = malloc((size_t)numel * sizeof(float));
        for (int64_t j = 0; j < numel; j++) {
            switch (lay[i].role) {
            case TDM_ROLE_NORM:
                v[j] = (float)unif(&r, 0.6, 1.4);
                break;
            case TDM_ROLE_BIAS:
                v[j] = (float)unif(&r, -0.3, 0.3);
                break;
            default: /* matrices: big enough that the model is far from linear */
                v[j] = (float)unif(&r, -0.5, 0.5);
            }
        }
        specs[i].name = lay[i].name;
        specs[i].dtype = TDM_DTYPE_F32;
        specs[i].rank = lay[i].rank;
        specs[i].shape[0] = lay[i].shape[0];
        specs[i].shape[1] = lay[i].shape[1];
        data[i] = v;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    OK(tdm_st_save(path, specs, data, n, NULL, 0, err));
    for (size_t i = 0; i < n; i++)
        free((void *)data[i]);
    free(specs), free(data), free(lay);
    return dir;
}

/* Random A and B for every targeted module of an adapter (B non-zero, unlike PEFT's init, so
 * that every gradient is exercised). */
static void randomize(tdm_lora *a, uint64_t seed)
{
    tdm_rng r;
    tdm_rng_seed(&r, seed);
    const tdm_model_config *c = tdm_model_get_config(a->model);
    for (int l = 0; l < c->num_layers; l++)
        for (int t = 0; t < TDM_LORA_N_TARGETS; t++) {
            if (!(a->targets & TDM_LORA_BIT(t))) continue;
            int64_t in, out;
            tdm_model_target_shape(a->model, (tdm_lora_target)t, &in, &out);
            float *A = malloc((size_t)(a->rank * in) * sizeof(float));
            float *B = malloc((size_t)(out * a->rank) * sizeof(float));
            for (int64_t i = 0; i < a->rank * in; i++)
                A[i] = (float)unif(&r, -0.4, 0.4);
            for (int64_t i = 0; i < out * a->rank; i++)
                B[i] = (float)unif(&r, -0.4, 0.4);
            OK(tdm_lora_set(a, l, (tdm_lora_target)t, A, B, err));
            free(A), free(B);
        }
}

/* A packed batch: sequences of the given lengths, tokens pseudo-random, some labels -100
 * (prompt-like prefix), segments of adapter indices per sequence group. */
typedef struct test_batch {
    int32_t tokens[64], labels[64], cu[16];
    tdm_batch_seg segs[8];
    tdm_batch b;
} test_batch;

static void make_batch(test_batch *t, const int *lens, int n_seqs, const int *seq_adapter,
                       uint64_t seed)
{
    tdm_rng r;
    tdm_rng_seed(&r, seed);
    int m = 0;
    t->cu[0] = 0;
    int n_segs = 0;
    for (int s = 0; s < n_seqs; s++) {
        for (int i = 0; i < lens[s]; i++) {
            t->tokens[m + i] = (int32_t)(tdm_rng_next(&r) % 40);
            t->labels[m + i] = i < 2 ? -100 : t->tokens[m + i];
        }
        m += lens[s];
        t->cu[s + 1] = m;
        if (n_segs > 0 && t->segs[n_segs - 1].adapter == seq_adapter[s])
            t->segs[n_segs - 1].row_end = m;
        else
            t->segs[n_segs++] = (tdm_batch_seg){seq_adapter[s], m - lens[s], m};
    }
    t->b = (tdm_batch){m, t->tokens, t->labels, t->cu, n_seqs, t->segs, n_segs};
}

/* L = sum over adapters of loss_sum / tokens (what the backward differentiates). */
static double total_loss(tdm_model *m, tdm_lora **ad, int n, const tdm_batch *b, bool backward)
{
    double ls[4];
    int64_t nt[4];
    OK(tdm_model_step(m, ad, n, b, backward, NULL, ls, nt, err));
    double L = 0;
    for (int i = 0; i < n; i++)
        if (nt[i] > 0) L += ls[i] / (double)nt[i];
    return L;
}

/* With dropout p > 0 the mask is fixed (one dropout_seed), so the loss is still a smooth function
 * of A and B; the finite differences then evaluate training steps (the only ones that drop). */
static void fd_check(const char *preset, bool nf4, float dropout)
{
    const char *dir = write_model(preset, preset, 7);
    tdm_model_opts o = {.nf4 = nf4, .double_quant = nf4};
    tdm_model *m;
    OK(tdm_model_load(&m, be, dir, &o, err));
    tdm_lora *a;
    OK(tdm_lora_create(&a, m, 3, 0.7f, (1u << TDM_LORA_N_TARGETS) - 1, err));
    randomize(a, 11);
    const uint64_t dseed = tdm_lora_dropout_seed(5, 2, 1);
    a->dropout = dropout;
    a->dropout_seed = dseed;
    bool fd_train = dropout > 0;
    test_batch tb;
    const int lens[3] = {6, 4, 7};
    const int ad[3] = {0, 0, 0};
    make_batch(&tb, lens, 3, ad, 5);
    OK(tdm_lora_zero_grad(a, err));
    double L0 = total_loss(m, &a, 1, &tb.b, true);
    int64_t np = a->n_params;
    float *grad = malloc((size_t)np * sizeof(float)), *p = malloc((size_t)np * sizeof(float));
    OK(tdm_be_download_f32(be, grad, a->grads, TDM_BE_F32, np, err));
    OK(tdm_be_download_f32(be, p, a->params, TDM_BE_F32, np, err));

    /* For each module's A and B: the 4 elements of largest |gradient| plus 2 others, central
     * differences with h = 1e-2 (the forward is f32; the error of the difference quotient is
     * dominated by f32 rounding of the loss, ~1e-6 / h). */
    const tdm_model_config *c = tdm_model_get_config(m);
    double worst = 0;
    int checked = 0;
    for (int l = 0; l < c->num_layers; l++)
        for (int t = 0; t < TDM_LORA_N_TARGETS; t++)
            for (int which = 0; which < 2; which++) {
                int64_t in, out;
                tdm_model_target_shape(m, (tdm_lora_target)t, &in, &out);
                int64_t off = which == 0 ? a->a_off[l * 7 + t] : a->b_off[l * 7 + t];
                int64_t n = a->rank * (which == 0 ? in : out);
                double gmax = 0;
                for (int64_t i = 0; i < n; i++)
                    gmax = fmax(gmax, fabs(grad[off + i]));
                int64_t picks[10];
                int np_ = 0;
                bool *used = calloc((size_t)(n > 0 ? n : 1), 1);
                for (int k = 0; k < 4 && k < n; k++) {
                    int64_t best = -1;
                    for (int64_t i = 0; i < n; i++)
                        if (!used[i] && (best < 0 || fabs(grad[off + i]) > fabs(grad[off + best])))
                            best = i;
                    used[best] = true;
                    picks[np_++] = best;
                }
                for (int k = 0; k < 2 && np_ < n; k++)
                    picks[np_++] = (k * 7919 + 13) % n;
                free(used);
                double err_max = 0;
                for (int k = 0; k < np_; k++) {
                    int64_t i = off + picks[k];
                    float orig = p[i], h = 1e-2f;
                    float v = orig + h;
                    OK(tdm_be_upload_f32(be, a->params + i, TDM_BE_F32, &v, 1, err));
                    double lp = total_loss(m, &a, 1, &tb.b, fd_train);
                    v = orig - h;
                    OK(tdm_be_upload_f32(be, a->params + i, TDM_BE_F32, &v, 1, err));
                    double lm = total_loss(m, &a, 1, &tb.b, fd_train);
                    OK(tdm_be_upload_f32(be, a->params + i, TDM_BE_F32, &orig, 1, err));
                    double fd = (lp - lm) / (2.0 * h);
                    err_max = fmax(err_max, fabs(fd - grad[i]));
                    checked++;
                }
                double rel = err_max / fmax(gmax, 1e-3);
                worst = fmax(worst, rel);
                if (rel > 1e-2)
                    fail_msg("%s%s dropout %.2f layer %d %s lora_%c: FD error %.3e relative to "
                             "max |grad| %.3e",
                             preset, nf4 ? " nf4" : "", (double)dropout, l, tdm_lora_target_name(t),
                             which ? 'B' : 'A', rel, gmax);
            }
    printf("  %-14s %-5s dropout %.2f loss %.6f  %d gradient elements vs finite differences: "
           "worst error %.2e of max |grad|\n",
           preset, nf4 ? "nf4" : "f32", (double)dropout, L0, checked, worst);
    if (dropout > 0) { /* the dropout acts: the loss without it (a forward-only step) differs */
        double Le = total_loss(m, &a, 1, &tb.b, false);
        assert_true(fabs(Le - L0) > 1e-4 * fabs(L0));
    }

    /* gradient checkpointing, every recompute mode: the same bits, and less kept */
    uint64_t kept_all = tdm_model_activation_bytes(m), kept_mode[3];
    for (int mode = 0; mode < 3; mode++) {
        tdm_model *mc;
        tdm_model_opts oc = o;
        oc.grad_checkpoint = true;
        oc.recompute = (tdm_recompute)mode;
        OK(tdm_model_load(&mc, be, dir, &oc, err));
        tdm_lora *ac;
        OK(tdm_lora_create(&ac, mc, 3, 0.7f, (1u << TDM_LORA_N_TARGETS) - 1, err));
        randomize(ac, 11);
        ac->dropout = dropout; /* the recompute regenerates the forward's masks */
        ac->dropout_seed = dseed;
        double Lc = total_loss(mc, &ac, 1, &tb.b, true);
        float *gc = malloc((size_t)np * sizeof(float));
        OK(tdm_be_download_f32(be, gc, ac->grads, TDM_BE_F32, np, err));
        assert_true(Lc == L0);
        assert_memory_equal(gc, grad, (size_t)np * sizeof(float));
        kept_mode[mode] = tdm_model_activation_bytes(mc);
        assert_true(kept_mode[mode] < kept_all);
        free(gc);
        tdm_lora_free(ac);
        tdm_model_free(mc);
    }

    /* the MLP in blocks of 5 rows (cutting the 6-, 4- and 7-row sequences and their dropout
     * masks), without checkpointing and in every recompute mode: loss and gradients to f32
     * rounding (GEMMs of 5 rows round otherwise than of 17; LoRA dA and dB add up block by
     * block; a mask cut wrongly would move the loss by ~1e-2), and less activation memory */
    double worst_block = 0, worst_block_loss = 0;
    for (int mode = -1; mode < 3; mode++) {
        tdm_model *mb;
        tdm_model_opts ob = o;
        ob.mlp_block_rows = 5;
        if (mode >= 0) ob.grad_checkpoint = true, ob.recompute = (tdm_recompute)mode;
        OK(tdm_model_load(&mb, be, dir, &ob, err));
        tdm_lora *ab;
        OK(tdm_lora_create(&ab, mb, 3, 0.7f, (1u << TDM_LORA_N_TARGETS) - 1, err));
        randomize(ab, 11);
        ab->dropout = dropout;
        ab->dropout_seed = dseed;
        double Lb = total_loss(mb, &ab, 1, &tb.b, true);
        float *gb = malloc((size_t)np * sizeof(float));
        OK(tdm_be_download_f32(be, gb, ab->grads, TDM_BE_F32, np, err));
        double gmax = 0, dmax = 0;
        for (int64_t i = 0; i < np; i++) {
            gmax = fmax(gmax, fabs((double)grad[i]));
            dmax = fmax(dmax, fabs((double)gb[i] - grad[i]));
        }
        double dl = fabs(Lb - L0) / fabs(L0);
        worst_block = fmax(worst_block, dmax / gmax), worst_block_loss = fmax(worst_block_loss, dl);
        if (dl > 1e-6 || dmax > 1e-5 * gmax)
            fail_msg("%s mlp blocks of 5, recompute %d: loss %.9g vs %.9g, gradient difference "
                     "%.3e of max |grad|",
                     preset, mode, Lb, L0, dmax / gmax);
        assert_true(tdm_model_activation_bytes(mb) < (mode < 0 ? kept_all : kept_mode[mode]));
        free(gb);
        tdm_lora_free(ab);
        tdm_model_free(mb);
    }
    printf("  %-14s %-5s dropout %.2f MLP in blocks of 5 rows: loss rel diff %.2e, gradients "
           "within %.2e of max |grad|\n",
           preset, nf4 ? "nf4" : "f32", (double)dropout, worst_block_loss, worst_block);

    free(grad), free(p);
    tdm_lora_free(a);
    tdm_model_free(m);
}

static void test_fd_llama(void **state)
{
    fd_check("tiny-llama", false, 0);
}
static void test_fd_qwen2(void **state)
{
    fd_check("tiny", false, 0);
}
static void test_fd_qwen3(void **state)
{
    fd_check("tiny-qwen3", false, 0);
}
static void test_fd_mistral(void **state)
{
    fd_check("tiny-mistral", false, 0);
}
static void test_fd_qwen2_nf4(void **state)
{
    fd_check("tiny", true, 0);
}
static void test_fd_llama_nf4(void **state)
{
    fd_check("tiny-llama", true, 0);
}
/* LoRA dropout on all seven modules: FD of the training loss, checkpointing bit-equal */
static void test_fd_dropout(void **state)
{
    fd_check("tiny-llama", false, 0.3f);
    fd_check("tiny-qwen3", false, 0.1f);
    fd_check("tiny", true, 0.5f);
}

/* Activation offload (--offload-activations) on 5 layers, without checkpointing and in every
 * recompute mode, with dropout on every module: the layer inputs travel to host memory and back
 * (on the CPU backend the copies run at once, so this checks the engine's schedule: which slot
 * holds which x when), giving the same loss and gradient bits as keeping them, in less
 * activation memory; a forward-only step after it gives the same loss as well. */
static void test_offload_activations(void **state)
{
    model_layers = 5;
    const char *dir = write_model("tiny-qwen3", "tiny-qwen3-5l", 9);
    model_layers = 2;
    test_batch tb;
    const int lens[3] = {6, 9, 5};
    const int ad[3] = {0, 0, 0};
    make_batch(&tb, lens, 3, ad, 8);
    for (int mode = -1; mode < 3; mode++) {
        double loss[2], eval[2];
        float *g[2];
        uint64_t act[2];
        int64_t np = 0;
        for (int off = 0; off < 2; off++) {
            tdm_model_opts o = {.grad_checkpoint = mode >= 0,
                                .recompute = mode >= 0 ? (tdm_recompute)mode : 0,
                                .offload_activations = off == 1};
            tdm_model *m;
            OK(tdm_model_load(&m, be, dir, &o, err));
            tdm_lora *a;
            OK(tdm_lora_create(&a, m, 3, 0.7f, (1u << TDM_LORA_N_TARGETS) - 1, err));
            randomize(a, 21);
            a->dropout = 0.2f;
            a->dropout_seed = tdm_lora_dropout_seed(3, 1, 0);
            OK(tdm_lora_zero_grad(a, err));
            loss[off] = total_loss(m, &a, 1, &tb.b, true);
            act[off] = tdm_model_activation_bytes(m);
            np = a->n_params;
            g[off] = malloc((size_t)np * sizeof(float));
            OK(tdm_be_download_f32(be, g[off], a->grads, TDM_BE_F32, np, err));
            eval[off] = total_loss(m, &a, 1, &tb.b, false);
            tdm_lora_free(a);
            tdm_model_free(m);
        }
        printf("  offload, recompute %-5s: loss %.9g (kept %.9g), eval %.9g; activations %.1f KiB "
               "(kept %.1f KiB)\n",
               mode < 0 ? "none" : tdm_recompute_name((tdm_recompute)mode), loss[1], loss[0],
               eval[1], (double)act[1] / 1024, (double)act[0] / 1024);
        assert_true(loss[1] == loss[0]);
        assert_true(eval[1] == eval[0]);
        assert_memory_equal(g[1], g[0], (size_t)np * sizeof(float));
        assert_true(act[1] < act[0]);
        free(g[0]), free(g[1]);
    }
}

/* Three adapters: ranks 2, 4, 3; targets {q, v}, all seven, {o, gate, down}; with dropout, each
 * its own p and mask seed (its rows sit at other rows of the fused batch than alone). */
static void fused_equals_alone(const float *dropout)
{
    const char *presets[2] = {"tiny", "tiny-qwen3"};
    for (int pi = 0; pi < 2; pi++) {
        const char *dir = write_model(presets[pi], presets[pi], 7);
        tdm_model *m;
        OK(tdm_model_load(&m, be, dir, NULL, err));
        const int64_t ranks[3] = {2, 4, 3};
        const unsigned tg[3] = {
            TDM_LORA_BIT(TDM_LORA_Q) | TDM_LORA_BIT(TDM_LORA_V), (1u << TDM_LORA_N_TARGETS) - 1,
            TDM_LORA_BIT(TDM_LORA_O) | TDM_LORA_BIT(TDM_LORA_GATE) | TDM_LORA_BIT(TDM_LORA_DOWN)};
        tdm_lora *ad[3];
        for (int i = 0; i < 3; i++) {
            OK(tdm_lora_create(&ad[i], m, ranks[i], 2.0f / (float)ranks[i], tg[i], err));
            randomize(ad[i], 100 + (uint64_t)i);
            ad[i]->dropout = dropout[i];
            ad[i]->dropout_seed = tdm_lora_dropout_seed(40 + (uint64_t)i, 3, 0);
            OK(tdm_lora_zero_grad(ad[i], err));
        }
        /* fused: 6 sequences, adapters 0 0 1 2 2 2 (different data lengths per adapter) */
        const int lens[6] = {5, 7, 9, 3, 6, 4};
        const int which[6] = {0, 0, 1, 2, 2, 2};
        test_batch fused;
        make_batch(&fused, lens, 6, which, 77);
        double ls[3];
        int64_t nt[3];
        OK(tdm_model_step(m, ad, 3, &fused.b, true, NULL, ls, nt, err));
        float *gf[3];
        for (int i = 0; i < 3; i++) {
            gf[i] = malloc((size_t)ad[i]->n_params * sizeof(float));
            OK(tdm_be_download_f32(be, gf[i], ad[i]->grads, TDM_BE_F32, ad[i]->n_params, err));
            OK(tdm_lora_zero_grad(ad[i], err));
        }
        /* alone: the same sequences of each adapter (same tokens), one adapter per step */
        double worst_loss = 0, worst_grad = 0;
        for (int i = 0; i < 3; i++) {
            test_batch alone;
            int al[6], aw[6], n = 0;
            for (int s = 0; s < 6; s++)
                if (which[s] == i) al[n] = lens[s], aw[n++] = 0;
            make_batch(&alone, al, n, aw, 1);
            /* copy the fused batch's tokens and labels of adapter i's rows */
            int64_t r0 = -1, r1 = 0;
            for (int g = 0; g < fused.b.n_segs; g++)
                if (fused.segs[g].adapter == i)
                    r0 = fused.segs[g].row_begin, r1 = fused.segs[g].row_end;
            assert_int_equal(r1 - r0, alone.b.m);
            memcpy(alone.tokens, fused.tokens + r0, (size_t)(r1 - r0) * sizeof(int32_t));
            memcpy(alone.labels, fused.labels + r0, (size_t)(r1 - r0) * sizeof(int32_t));
            double l1;
            int64_t n1;
            OK(tdm_model_step(m, &ad[i], 1, &alone.b, true, NULL, &l1, &n1, err));
            assert_int_equal(n1, nt[i]);
            double dl = fabs(l1 - ls[i]) / fabs(l1);
            worst_loss = fmax(worst_loss, dl);
            float *g1 = malloc((size_t)ad[i]->n_params * sizeof(float));
            OK(tdm_be_download_f32(be, g1, ad[i]->grads, TDM_BE_F32, ad[i]->n_params, err));
            double num = 0, den = 0;
            for (int64_t k = 0; k < ad[i]->n_params; k++) {
                num = fmax(num, fabs((double)g1[k] - gf[i][k]));
                den = fmax(den, fabs((double)g1[k]));
            }
            worst_grad = fmax(worst_grad, num / den);
            if (dl > 1e-6 || num / den > 1e-5)
                fail_msg("%s adapter %d: fused vs alone loss rel diff %.3e, grad rel diff %.3e",
                         presets[pi], i, dl, num / den);
            free(g1);
        }
        printf("  %-12s fused vs alone (3 adapters, ranks 2/4/3, dropout %.1f/%.1f/%.1f): loss "
               "rel diff %.2e, gradient rel diff %.2e\n",
               presets[pi], (double)dropout[0], (double)dropout[1], (double)dropout[2], worst_loss,
               worst_grad);
        for (int i = 0; i < 3; i++)
            free(gf[i]), tdm_lora_free(ad[i]);
        tdm_model_free(m);
    }
}

static void test_fused_equals_alone(void **state)
{
    const float none[3] = {0, 0, 0};
    fused_equals_alone(none);
}

static void test_fused_equals_alone_dropout(void **state)
{
    const float p[3] = {0.2f, 0.5f, 0.1f};
    fused_equals_alone(p);
}

/* Dropout 0 is the old code path: the mask seed is ignored (same bits whatever it is), and a
 * forward-only step (evaluation) with dropout > 0 gives the bits of dropout 0. */
static void test_dropout_zero_and_eval(void **state)
{
    const char *dir = write_model("tiny-llama", "tiny-llama", 7);
    tdm_model *m;
    OK(tdm_model_load(&m, be, dir, NULL, err));
    tdm_lora *a;
    OK(tdm_lora_create(&a, m, 4, 0.5f, (1u << TDM_LORA_N_TARGETS) - 1, err));
    randomize(a, 21);
    test_batch tb;
    const int lens[3] = {5, 8, 6}, ad[3] = {0, 0, 0};
    make_batch(&tb, lens, 3, ad, 9);
    int64_t np = a->n_params;
    float *g[3];
    double L[3];
    const uint64_t seeds[3] = {0, 12345, 0xffffffffffffull};
    for (int k = 0; k < 3; k++) { /* p = 0 with three mask seeds */
        a->dropout = 0;
        a->dropout_seed = seeds[k];
        OK(tdm_lora_zero_grad(a, err));
        L[k] = total_loss(m, &a, 1, &tb.b, true);
        g[k] = malloc((size_t)np * sizeof(float));
        OK(tdm_be_download_f32(be, g[k], a->grads, TDM_BE_F32, np, err));
    }
    assert_true(L[0] == L[1] && L[0] == L[2]);
    assert_memory_equal(g[0], g[1], (size_t)np * sizeof(float));
    assert_memory_equal(g[0], g[2], (size_t)np * sizeof(float));
    a->dropout = 0;
    double Le0 = total_loss(m, &a, 1, &tb.b, false);
    a->dropout = 0.4f;
    double Le = total_loss(m, &a, 1, &tb.b, false);
    assert_true(Le == Le0); /* evaluation never drops */
    OK(tdm_lora_zero_grad(a, err));
    double Lt = total_loss(m, &a, 1, &tb.b, true);
    assert_true(Lt != L[0]); /* training does */
    printf("  dropout 0: same bits for 3 mask seeds (loss %.6f); eval with dropout 0.4 = eval "
           "without; training loss with it %.6f\n",
           L[0], Lt);
    for (int k = 0; k < 3; k++)
        free(g[k]);
    tdm_lora_free(a);
    tdm_model_free(m);
}

static void test_batch_checks(void **state)
{
    const char *dir = write_model("tiny", "tiny", 7);
    tdm_model *m;
    OK(tdm_model_load(&m, be, dir, NULL, err));
    tdm_lora *a = NULL;
    test_batch tb;
    const int lens[2] = {4, 5}, ad[2] = {0, 0};
    make_batch(&tb, lens, 2, ad, 3);
    tdm_error e = {0};
    /* a segment boundary inside a sequence */
    tdm_batch_seg bad[2] = {{0, 0, 3}, {0, 3, 9}};
    tdm_batch b = tb.b;
    b.segs = bad, b.n_segs = 2;
    assert_int_equal(tdm_model_step(m, &a, 1, &b, false, NULL, NULL, NULL, &e), TDM_ERR_INVALID);
    assert_non_null(strstr(e.message, "inside a sequence"));
    /* a token outside the vocabulary */
    tb.tokens[3] = 40;
    assert_int_equal(tdm_model_step(m, &a, 1, &tb.b, false, NULL, NULL, NULL, &e), TDM_ERR_INVALID);
    /* the bare base (NULL adapter) evaluates: loss of a random model near log(40) */
    tb.tokens[3] = 1;
    double ls;
    int64_t n;
    OK(tdm_model_step(m, &a, 1, &tb.b, false, NULL, &ls, &n, err));
    assert_int_equal(n, (4 - 2) + (5 - 2)); /* rows 1.. of each sequence score labels 2.. */
    assert_true(ls / (double)n > 0.5 && ls / (double)n < 20);
    tdm_model_free(m);
}

/* The last row's logits of a sequence are those the step scores at that row when the sequence
 * goes on: for sequences S_s (length n_s) fused with adapters {a, bare}, the step's loss of batch
 * S_s + [t_s] with only t_s labelled equals logsumexp(z_s) - z_s[t_s], z_s the last logits of S_s.
 */
static void test_last_logits(void **state)
{
    const char *dir = write_model("tiny-qwen3", "tiny-qwen3", 5);
    tdm_model *m;
    OK(tdm_model_load(&m, be, dir, NULL, err));
    tdm_lora *a;
    OK(tdm_lora_create(&a, m, 4, 0.5f, (1u << TDM_LORA_N_TARGETS) - 1, err));
    randomize(a, 33);
    tdm_lora *slots[2] = {a, NULL};
    test_batch tb;
    const int lens[2] = {7, 5}, ad[2] = {0, 1};
    make_batch(&tb, lens, 2, ad, 17);
    const int32_t next[2] = {11, 29}; /* t_s */
    /* S_s: the batch as it is; S_s + [t_s]: each sequence one longer, only t_s labelled */
    int32_t tok2[64], lab2[64], cu2[3] = {0, 8, 14};
    tdm_batch_seg seg2[2] = {{0, 0, 8}, {1, 8, 14}};
    for (int s = 0, r = 0; s < 2; s++) {
        for (int i = tb.cu[s]; i < tb.cu[s + 1]; i++, r++)
            tok2[r] = tb.tokens[i], lab2[r] = -100;
        tok2[r] = next[s], lab2[r] = next[s], r++;
    }
    tdm_batch b2 = {14, tok2, lab2, cu2, 2, seg2, 2};
    float z[2 * 40];
    tdm_batch b1 = tb.b;
    b1.labels = NULL; /* not needed */
    OK(tdm_model_last_logits(m, slots, 2, &b1, z, err));
    double ls[2];
    int64_t nt[2];
    OK(tdm_model_step(m, slots, 2, &b2, false, NULL, ls, nt, err));
    for (int s = 0; s < 2; s++) {
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < 40; v++)
            mx = fmax(mx, z[s * 40 + v]);
        for (int v = 0; v < 40; v++)
            sum += exp(z[s * 40 + v] - mx);
        double ce = mx + log(sum) - z[s * 40 + next[s]];
        assert_int_equal(nt[s], 1);
        printf("  sequence %d (%s): cross-entropy from last logits %.6f, from the step %.6f\n", s,
               s ? "bare base" : "adapter", ce, ls[s]);
        assert_true(fabs(ce - ls[s]) < 1e-4 * fmax(1.0, fabs(ce)));
    }
    tdm_lora_free(a);
    tdm_model_free(m);
}

static int32_t argmax_of(const float *z, int n)
{
    int best = 0;
    for (int v = 1; v < n; v++)
        if (z[v] > z[best]) best = v;
    return best;
}

/* Greedy decoding: each token is the argmax of the last logits of the sequence so far (computed
 * here independently); a stop token ends it unemitted; max_new_tokens and the context bound it. */
static void test_generate_greedy(void **state)
{
    const char *dir = write_model("tiny", "tiny", 7);
    tdm_model *m;
    OK(tdm_model_load(&m, be, dir, NULL, err));
    tdm_lora *a;
    OK(tdm_lora_create(&a, m, 4, 0.5f, TDM_LORA_BIT(TDM_LORA_Q) | TDM_LORA_BIT(TDM_LORA_UP), err));
    randomize(a, 8);
    int32_t seq[64] = {3, 14, 15, 9, 26};
    int n = 5;
    int32_t out[64];
    int64_t n_out;
    tdm_generate_stop why;
    tdm_generate_opts o = {.max_new_tokens = 6};
    OK(tdm_generate_greedy(m, a, seq, n, &o, out, &n_out, &why, err));
    assert_int_equal(n_out, 6);
    assert_int_equal(why, TDM_GENERATE_MAX_TOKENS);
    for (int k = 0; k < 6; k++) {
        int32_t cu[2] = {0, n};
        tdm_batch_seg sg = {0, 0, n};
        tdm_batch b = {n, seq, NULL, cu, 1, &sg, 1};
        float z[40];
        OK(tdm_model_last_logits(m, &a, 1, &b, z, err));
        assert_int_equal(out[k], argmax_of(z, 40));
        seq[n++] = out[k];
    }
    int32_t again[64];
    int64_t n_again;
    OK(tdm_generate_greedy(m, a, seq, 5, &o, again, &n_again, &why, err));
    assert_memory_equal(out, again, sizeof(int32_t) * 6); /* deterministic */
    /* the base continues differently from the adapter (random B: a large LoRA term) */
    int32_t base[64];
    int64_t n_base;
    OK(tdm_generate_greedy(m, NULL, seq, 5, &o, base, &n_base, &why, err));
    assert_int_equal(n_base, 6);
    assert_true(memcmp(base, out, sizeof(int32_t) * 6) != 0);
    /* a stop token: the third token of the answer ends it, unemitted */
    int32_t stop = out[2];
    bool earlier = out[0] == stop || out[1] == stop;
    tdm_generate_opts os = {.max_new_tokens = 6, .stop_ids = &stop, .n_stop = 1};
    OK(tdm_generate_greedy(m, a, seq, 5, &os, again, &n_again, &why, err));
    assert_int_equal(why, TDM_GENERATE_STOP_TOKEN);
    if (!earlier) assert_int_equal(n_again, 2);
    /* n_candidates: only ids below it come out (a padded vocabulary) */
    int32_t low = out[0] > 0 ? out[0] : 1; /* the unrestricted first token is not a candidate */
    tdm_generate_opts oc = {.max_new_tokens = 6, .n_candidates = low};
    OK(tdm_generate_greedy(m, a, seq, 5, &oc, again, &n_again, &why, err));
    for (int64_t k = 0; k < n_again; k++)
        assert_true(again[k] < low);
    /* the context (max_position_embeddings 64): a 60-token prompt leaves 4 new tokens */
    int32_t longp[64];
    for (int i = 0; i < 60; i++)
        longp[i] = (i * 7) % 40;
    tdm_generate_opts ol = {.max_new_tokens = 10};
    OK(tdm_generate_greedy(m, a, longp, 60, &ol, out, &n_out, &why, err));
    assert_int_equal(n_out, 4);
    assert_int_equal(why, TDM_GENERATE_CONTEXT_FULL);
    tdm_error e = {0};
    assert_int_equal(tdm_generate_greedy(m, a, longp, 64, &ol, out, &n_out, &why, &e),
                     TDM_ERR_INVALID);
    assert_non_null(strstr(e.message, "context"));
    tdm_lora_free(a);
    tdm_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fd_llama),
        cmocka_unit_test(test_fd_qwen2),
        cmocka_unit_test(test_fd_qwen3),
        cmocka_unit_test(test_fd_mistral),
        cmocka_unit_test(test_fd_qwen2_nf4),
        cmocka_unit_test(test_fd_llama_nf4),
        cmocka_unit_test(test_fused_equals_alone),
        cmocka_unit_test(test_offload_activations),
        cmocka_unit_test(test_batch_checks),
        cmocka_unit_test(test_fd_dropout),
        cmocka_unit_test(test_fused_equals_alone_dropout),
        cmocka_unit_test(test_dropout_zero_and_eval),
        cmocka_unit_test(test_last_logits),
        cmocka_unit_test(test_generate_greedy),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
