/* test_memory_estimate.c — tdm_model_memory_estimate (what --vram auto reserves) against what
 * the engine really allocates: for tiny Llama-style and Qwen3 models, f32 and NF4 bases (with
 * and without double quantization), with and without gradient checkpointing, two adapters of
 * different ranks and targets, the estimated weight, activation and adapter bytes must EQUAL
 * the bytes the model allocated after loading and one training step of the planned shape; a
 * smaller batch must not grow the workspace beyond the estimate; tdm_model_reserve holds the
 * estimated workspace and the backend's scratch before the first step, and the plan's steps
 * allocate nothing more. The CPU backend's scratch (engine/cpu/cpu_memory_plan.h) must equal what
 * its ops kept after the steps, but for attention's kept P and dS, which the estimate bounds by
 * m x the longest sequence (it does not know how the other rows split into sequences). From a
 * bf16 checkpoint, qlora's embedding table and lm_head are bf16 on the CPU (2 bytes an element
 * fewer than with dense_embed), counted so by the estimate. The CUDA
 * backend's scratch part is checked on a GPU by scripts/device/vram-estimate.sh
 * (docs/verification.md). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/cuda/cuda_memory_plan.h"
#include "engine/model.h"
#include "model/config.h"
#include "model/init_model.h"

static tdm_backend *be;
static char tmpdir[256];

static int setup(void **state)
{
    (void)state;
    tdm_error err = {0};
    if (tdm_backend_create(&be, "cpu", NULL, &err) != TDM_OK) return -1;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/tandem-test-memest-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
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

/* A batch of n_seqs sequences of the given lengths; the first `split` belong to adapter 0, the
 * rest to adapter 1. Tokens are small ids every preset's vocabulary has. */
typedef struct owned_batch {
    int32_t tokens[256], labels[256], cu[17];
    tdm_batch_seg segs[2];
    tdm_batch b;
} owned_batch;

static void make_batch(owned_batch *o, const int *lens, int n_seqs, int split)
{
    int64_t m = 0;
    o->cu[0] = 0;
    for (int s = 0; s < n_seqs; s++) {
        for (int i = 0; i < lens[s]; i++, m++)
            o->tokens[m] = o->labels[m] = (int32_t)(1 + (m * 7 + s) % 50);
        o->cu[s + 1] = (int32_t)m;
    }
    o->segs[0] = (tdm_batch_seg){0, 0, o->cu[split]};
    o->segs[1] = (tdm_batch_seg){1, o->cu[split], m};
    o->b = (tdm_batch){.m = m,
                       .tokens = o->tokens,
                       .labels = o->labels,
                       .cu_seqlens = o->cu,
                       .n_seqs = n_seqs,
                       .segs = o->segs,
                       .n_segs = 2};
}

/* One case: a model of the preset loaded on the CPU backend, two adapters of different ranks and
 * targets, the planned batch of five sequences and a smaller one of two, the plan and its
 * estimate. dir_suffix keeps the model directories of the cases apart. */
typedef struct mem_case {
    tdm_model_config cfg;
    tdm_model_opts mo;
    tdm_model *m;
    tdm_lora *ad[2];
    owned_batch big, small;
    tdm_model_mem_plan plan;
    tdm_model_mem est;
} mem_case;

/* ckpt: 0 no gradient checkpointing, else 1 + the tdm_recompute mode; | OFFLOAD: with
 * --offload-activations */
#define OFFLOAD 16
static tdm_dtype ckpt_dtype = TDM_DTYPE_F32; /* the checkpoints case_open writes */

static void case_open(mem_case *k, const char *preset, const char *dir_suffix, bool nf4, bool dq,
                      int ckpt)
{
    char dir[400];
    snprintf(dir, sizeof dir, "%s/%s%s%s", tmpdir, preset, dir_suffix,
             ckpt_dtype == TDM_DTYPE_BF16 ? "-bf16" : "");
    tdm_init_model_opts io = {.preset = preset, .seed = 5, .dtype = ckpt_dtype};
    OK(tdm_init_model(dir, &io, &k->cfg, err));
    k->mo = (tdm_model_opts){.nf4 = nf4,
                             .double_quant = dq,
                             .grad_checkpoint = (ckpt & ~OFFLOAD) > 0,
                             .recompute = (ckpt & ~OFFLOAD) > 0
                                              ? (tdm_recompute)((ckpt & ~OFFLOAD) - 1)
                                              : 0,
                             .offload_activations = (ckpt & OFFLOAD) != 0};
    OK(tdm_model_load(&k->m, be, dir, &k->mo, err));
    const unsigned t0 = TDM_LORA_BIT(TDM_LORA_Q) | TDM_LORA_BIT(TDM_LORA_V);
    const unsigned t1 = TDM_LORA_BIT(TDM_LORA_O) | TDM_LORA_BIT(TDM_LORA_DOWN);
    OK(tdm_lora_create(&k->ad[0], k->m, 4, 2.0f, t0, err));
    OK(tdm_lora_create(&k->ad[1], k->m, 8, 2.0f, t1, err));
    const int lens[5] = {17, 9, 30, 12, 21};
    make_batch(&k->big, lens, 5, 2);
    make_batch(&k->small, lens, 2, 1);
    k->plan = (tdm_model_mem_plan){.rows = k->big.b.m,
                                   .n_seqs = 5,
                                   .max_seq = 30,
                                   .max_rank = 8,
                                   .targets = t0 | t1,
                                   .lora_params = k->ad[0]->n_params + k->ad[1]->n_params,
                                   .backward = true};
    OK(tdm_model_memory_estimate(&k->cfg, &k->mo, tdm_be_act_dtype(be), &k->plan, &k->est, err));
}

/* a smaller step first (the workspace must not need to grow past the plan), then the planned
 * one */
static void case_steps(mem_case *k)
{
    OK(tdm_be_synchronize(be, err));
    OK(tdm_model_step(k->m, k->ad, 2, &k->small.b, true, NULL, NULL, NULL, err));
    OK(tdm_model_step(k->m, k->ad, 2, &k->big.b, true, NULL, NULL, NULL, err));
}

static void case_close(mem_case *k)
{
    tdm_lora_free(k->ad[0]);
    tdm_lora_free(k->ad[1]);
    tdm_model_free(k->m);
}

static void check(const char *preset, bool nf4, bool dq, int ckpt)
{
    /* a backend of its own: scratch kept by an earlier case's steps would hide this one's */
    tdm_backend *shared = be;
    OK(tdm_backend_create(&be, "cpu", NULL, err));
    mem_case k;
    case_open(&k, preset, "", nf4, dq, ckpt);
    tdm_be_mem_info before, after;
    OK(tdm_be_memory(be, &before, err));
    case_steps(&k);
    OK(tdm_be_memory(be, &after, err));
    /* what the steps added through the backend: the workspace and the kept scratch */
    uint64_t scratch = after.used_bytes - before.used_bytes - tdm_model_activation_bytes(k.m);
    uint64_t adapters = (uint64_t)(k.ad[0]->n_params + k.ad[1]->n_params) * 16;
    printf("  %-10s nf4=%d dq=%d ckpt=%d: weights %llu / %llu, activations %llu / %llu, "
           "adapters %llu / %llu (estimated / allocated bytes)\n",
           preset, nf4, dq, ckpt, (unsigned long long)k.est.weights,
           (unsigned long long)tdm_model_weight_bytes(k.m), (unsigned long long)k.est.activations,
           (unsigned long long)tdm_model_activation_bytes(k.m), (unsigned long long)k.est.adapters,
           (unsigned long long)adapters);
    assert_int_equal(k.est.weights, tdm_model_weight_bytes(k.m));
    assert_int_equal(k.est.activations, tdm_model_activation_bytes(k.m));
    assert_int_equal(k.est.adapters, adapters);
    /* the CPU backend's scratch: the estimate's, but for attention's kept P and dS: the batch's
     * sum of len^2 (1855 for lengths 17, 9, 30, 12, 21) where the estimate takes m x the
     * longest (30) */
    uint64_t att_bound = (uint64_t)(k.big.b.m * 30) * 2 * (uint64_t)k.cfg.num_heads * 4;
    uint64_t att_kept = (uint64_t)1855 * 2 * (uint64_t)k.cfg.num_heads * 4;
    printf("  %-10s scratch %llu estimated, %llu kept by the steps (bytes)\n", preset,
           (unsigned long long)k.est.backend_scratch, (unsigned long long)scratch);
    assert_int_equal(scratch, k.est.backend_scratch - att_bound + att_kept);
    /* offload: (L - 1) layer inputs of the planned rows in host memory, as allocated */
    uint64_t host = (ckpt & OFFLOAD) ? (uint64_t)(k.cfg.num_layers - 1) *
                                           (uint64_t)(k.plan.rows * k.cfg.hidden_size) * 4
                                     : 0;
    assert_int_equal(k.est.host_activations, host);
    assert_int_equal(tdm_model_host_activation_bytes(k.m), host);
    case_close(&k);
    tdm_backend_free(be);
    be = shared;
}

/* tdm_model_reserve allocates the plan's workspace before any step, exactly the estimate's
 * activation bytes; the steps of the plan (a smaller one, then the planned one) then allocate
 * nothing more through the backend: its peak stays at what was held after the reserve. */
static void check_reserve(const char *preset, bool nf4, int ckpt)
{
    mem_case k;
    case_open(&k, preset, "-reserve", nf4, false, ckpt);
    assert_int_equal(tdm_model_activation_bytes(k.m), 0); /* nothing before the reserve */
    OK(tdm_model_reserve(k.m, &k.plan, err));
    assert_int_equal(tdm_model_activation_bytes(k.m), k.est.activations);
    tdm_be_mem_info held, after;
    OK(tdm_be_memory(be, &held, err));
    tdm_be_reset_peak(be);
    case_steps(&k);
    OK(tdm_be_memory(be, &after, err));
    printf("  %-10s nf4=%d ckpt=%d reserve: activations %llu held before step 1; backend "
           "used %llu, peak over the steps %llu bytes\n",
           preset, nf4, ckpt, (unsigned long long)tdm_model_activation_bytes(k.m),
           (unsigned long long)held.used_bytes, (unsigned long long)after.peak_bytes);
    assert_int_equal(tdm_model_activation_bytes(k.m), k.est.activations);
    assert_int_equal(after.used_bytes, held.used_bytes);
    assert_int_equal(after.peak_bytes, held.used_bytes);
    /* a plan of no rows (an empty run) holds nothing more */
    tdm_model_mem_plan none = {0};
    OK(tdm_model_reserve(k.m, &none, err));
    assert_int_equal(tdm_model_activation_bytes(k.m), k.est.activations);
    case_close(&k);
}

static void test_reserve_holds_the_plan(void **state)
{
    (void)state;
    check_reserve("tiny-llama", false, 0);
    check_reserve("tiny", true, 1);
    check_reserve("tiny", true, 1 + TDM_RECOMPUTE_MLP);
    check_reserve("tiny-llama", false, 1 + TDM_RECOMPUTE_ATTN);
    check_reserve("tiny", true, 1 | OFFLOAD);
}

static void test_llama_dense(void **state)
{
    (void)state;
    check("tiny-llama", false, false, 0);
    check("tiny-llama", false, false, 1);
    check("tiny-llama", false, false, 1 + TDM_RECOMPUTE_MLP);
    check("tiny-llama", false, false, 1 + TDM_RECOMPUTE_ATTN);
    check("tiny-llama", false, false, 1 | OFFLOAD);
}

static void test_qwen3_nf4(void **state)
{
    (void)state;
    check("tiny-qwen3", true, false, 0);
    check("tiny-qwen3", true, true, 1);
    check("tiny-qwen3", true, true, 1 + TDM_RECOMPUTE_MLP);
    check("tiny-qwen3", true, false, 1 + TDM_RECOMPUTE_ATTN);
    check("tiny-qwen3", true, true, 0 | OFFLOAD);
}

static void test_qwen2_nf4_dq(void **state)
{
    (void)state;
    check("tiny", true, true, 0);
}

/* qlora on the CPU with a bf16 checkpoint keeps the embedding table and lm_head in bf16
 * (engine/model.c, embed_dtype): the estimate still equals what is allocated, weights and
 * scratch (the cross-entropy reads the table as it is: no f32 copy in CE_WEIGHT), and the
 * weights are smaller than with dense_embed (generation's f32 table) by exactly 2 bytes an
 * element of the table(s); lora, and an f32 checkpoint, keep f32. */
static void test_bf16_table(void **state)
{
    (void)state;
    ckpt_dtype = TDM_DTYPE_BF16;
    check("tiny", true, true, 0);
    check("tiny-qwen3", true, false, 1);
    const char *presets[] = {"tiny", "tiny-llama"};
    for (int i = 0; i < 2; i++) {
        char dir[400];
        snprintf(dir, sizeof dir, "%s/%s-table", tmpdir, presets[i]);
        tdm_model_config cfg;
        tdm_init_model_opts io = {.preset = presets[i], .seed = 5, .dtype = TDM_DTYPE_BF16};
        OK(tdm_init_model(dir, &io, &cfg, err));
        uint64_t table = (uint64_t)(cfg.vocab_size * cfg.hidden_size) *
                         (cfg.tie_word_embeddings ? 1 : 2);
        uint64_t bytes[3];
        const tdm_model_opts opts[3] = {{.nf4 = true, .double_quant = true},
                                        {.nf4 = true, .double_quant = true, .dense_embed = true},
                                        {.nf4 = false}};
        for (int o = 0; o < 3; o++) {
            tdm_model *m;
            OK(tdm_model_load(&m, be, dir, &opts[o], err));
            bytes[o] = tdm_model_weight_bytes(m);
            tdm_model_free(m);
        }
        printf("  %-10s bf16 checkpoint, weights: qlora %llu, qlora dense_embed %llu, lora %llu "
               "bytes (table %llu elements)\n",
               presets[i], (unsigned long long)bytes[0], (unsigned long long)bytes[1],
               (unsigned long long)bytes[2], (unsigned long long)table);
        assert_int_equal(bytes[1] - bytes[0], table * 2);
        /* lora: the projections and the table in f32 */
        assert_true(bytes[2] > bytes[1]);
    }
    ckpt_dtype = TDM_DTYPE_F32;
}

/* The backend's scratch grows with the batch (activation-sized slots) and the NF4 tile only
 * exists for a quantized base. */
static void test_scratch_shape(void **state)
{
    (void)state;
    tdm_be_step_shape s = {.m = 2048,
                           .hidden = 896,
                           .inter = 4864,
                           .q_dim = 896,
                           .kv_dim = 128,
                           .heads = 14,
                           .vocab = 151936,
                           .ce_chunk = 110,
                           .max_rank = 16,
                           .nf4 = false,
                           .backward = true,
                           .lora_params = 1000000};
    uint64_t dense = tdm_cuda_scratch_bytes(&s);
    s.nf4 = true;
    uint64_t q = tdm_cuda_scratch_bytes(&s);
    assert_true(q > dense);
    /* the NF4 tile (at most 16 MiB plus headroom) is the difference here */
    assert_true(q - dense <= (uint64_t)20 << 20);
    s.m = 4096;
    assert_true(tdm_cuda_scratch_bytes(&s) > q);
    s.backward = false;
    assert_true(tdm_cuda_scratch_bytes(&s) < q);
    /* the tensor-core attention backward's dk/dv partials (head_dim 64 / 128 only) outgrow the
     * logits chunk in slot 2 for a large batch: 2 * 7 * 16384 * 2 * 64 f32 = 117 MB > 33 MB */
    s.backward = true;
    s.m = 16384;
    s.kv_heads = 2;
    s.head_dim = 80;
    uint64_t no_split = tdm_cuda_scratch_bytes(&s);
    s.head_dim = 64;
    uint64_t split = tdm_cuda_scratch_bytes(&s);
    assert_int_equal(split - no_split, (2 * 7 * 16384 * 2 * 64 * 4 - 110 * 151936 * 2) * 5 / 4);
    /* 32 Mi elements per tile: a 0.5B gate_proj and a 7B q_proj fit whole; a 7B gate_proj
     * takes 3 forward tiles of 6336 rows (the last 6272) and 3 backward slabs of 1216 columns;
     * its down_proj 3 tiles of 1216 rows and 3 slabs of 6336 columns */
    assert_int_equal(tdm_cuda_tile_rows(4864, 896), 4864);
    assert_int_equal(tdm_cuda_tile_rows(3584, 3584), 3584);
    assert_int_equal(tdm_cuda_slab_cols(3584, 3584), 3584);
    assert_int_equal(tdm_cuda_tile_rows(18944, 3584), 6336);
    assert_int_equal(tdm_cuda_slab_cols(18944, 3584), 1216);
    assert_int_equal(tdm_cuda_tile_rows(3584, 18944), 1216);
    assert_int_equal(tdm_cuda_slab_cols(3584, 18944), 6336);
    /* no slabs when cols is not a multiple of 64 (the backward then tiles rows into f32) */
    assert_int_equal(tdm_cuda_slab_cols(33000, 1030), 0);
    /* the benchmark knob: 68 Mi elements take a 7B MLP weight whole, and the plan's slot 0 (the
     * largest tile, bf16) follows it; a value out of range is ignored */
    uint64_t slots32[TDM_CUDA_SCRATCH_SLOTS], slots68[TDM_CUDA_SCRATCH_SLOTS];
    tdm_be_step_shape s7 = s;
    s7.nf4 = true, s7.hidden = 3584, s7.inter = 18944, s7.q_dim = 3584, s7.kv_dim = 512;
    tdm_cuda_scratch_requests(&s7, slots32);
    assert_int_equal(slots32[0], (uint64_t)1216 * 18944 * 2); /* down_proj's forward tile */
    setenv("TANDEM_CUDA_DEQUANT_TILE_MI", "68", 1);
    assert_int_equal(tdm_cuda_dequant_tile_elems(), (int64_t)68 << 20);
    assert_int_equal(tdm_cuda_tile_rows(18944, 3584), 18944);
    assert_int_equal(tdm_cuda_slab_cols(18944, 3584), 3584);
    assert_int_equal(tdm_cuda_tile_rows(3584, 18944), 3584);
    tdm_cuda_scratch_requests(&s7, slots68);
    assert_int_equal(slots68[0], (uint64_t)18944 * 3584 * 2);
    setenv("TANDEM_CUDA_DEQUANT_TILE_MI", "16x", 1);
    assert_int_equal(tdm_cuda_dequant_tile_elems(), TDM_CUDA_DEQUANT_TILE_ELEMS);
    setenv("TANDEM_CUDA_DEQUANT_TILE_MI", "0", 1);
    assert_int_equal(tdm_cuda_tile_rows(18944, 3584), 6336);
    unsetenv("TANDEM_CUDA_DEQUANT_TILE_MI");
    /* the LoRA backward's partials (slot 7): min(16, ceil(m / 256)) chunks of every adapter's
     * parameters of the largest module, 4 bytes each, plus the slot's headroom */
    s.m = 2048;
    s.head_dim = 80;
    s.lora_module_params = 0;
    uint64_t no_lora_part = tdm_cuda_scratch_bytes(&s);
    s.lora_module_params = 3 * 16 * (896 + 896);
    assert_int_equal(tdm_cuda_scratch_bytes(&s) - no_lora_part, 8 * 3 * 16 * 1792 * 4 * 5 / 4);
    /* the per-slot requests the backend reserves add up, with each slot's headroom and the
     * cuBLASLt workspace, to the estimate */
    uint64_t req[TDM_CUDA_SCRATCH_SLOTS], total = TDM_CUDA_LT_WORKSPACE_BYTES;
    tdm_cuda_scratch_requests(&s, req);
    for (int i = 0; i < TDM_CUDA_SCRATCH_SLOTS; i++)
        total += req[i] + req[i] / TDM_CUDA_SCRATCH_HEADROOM_DIV;
    assert_int_equal(total, tdm_cuda_scratch_bytes(&s));
    assert_int_equal(req[7], 8 * 3 * 16 * 1792 * 4);
    assert_int_equal(req[6], 0); /* the mixed-dtype GEMM staging: never in a training step */
    /* --base-compute fp8: the e4m3 copy of the widest operand (m x inter bytes, here the MLP's
     * 4864) in slot 8 and the scale words in slot 9, NF4 only */
    assert_int_equal(req[8], 0);
    assert_int_equal(req[9], 0);
    uint64_t bf16_total = tdm_cuda_scratch_bytes(&s);
    s.base_fp8 = true;
    tdm_cuda_scratch_requests(&s, req);
    assert_int_equal(req[8], 2048 * 4864);
    assert_int_equal(req[9], TDM_CUDA_FP8_SCALE_BYTES);
    assert_int_equal(tdm_cuda_scratch_bytes(&s) - bf16_total,
                     (2048 * 4864 + TDM_CUDA_FP8_SCALE_BYTES) * 5 / 4);
    s.nf4 = false; /* a bf16 base never takes the FP8 path */
    tdm_cuda_scratch_requests(&s, req);
    assert_int_equal(req[8], 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_dense),
        cmocka_unit_test(test_qwen3_nf4),
        cmocka_unit_test(test_qwen2_nf4_dq),
        cmocka_unit_test(test_bf16_table),
        cmocka_unit_test(test_scratch_shape),
        cmocka_unit_test(test_reserve_holds_the_plan),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
