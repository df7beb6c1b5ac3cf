/* test_memory_plan.c — one memory estimate for `tandem finetune --vram auto` and `tandem submit`
 * (train/memory_plan.h, run/placement_budget.h): for the same flags and adapters.toml, the MiB
 * submit places a process of k adapters with equals what that finetune process reserves
 * (tdm_trainer_memory_estimate + the CUDA context, device_open's --vram auto) when every sample
 * reaches max_seq_len, and the MiB it places a CPU-only node's process with equals what that
 * `tandem finetune --device cpu` checks the machine's memory against; and --grad-checkpoint,
 * which shrinks the activations, shrinks both.
 * The plan that fits a budget (tdm_memory_plan_fit), on the real shapes of Qwen2.5-7B and a
 * 24 GiB card: the order as asked -> gradient checkpointing -> micro-batches, the smallest plan
 * when nothing fits, and the trainer's fit equal to what its estimate then reserves. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "model/init_model.h"
#include "model/presets.h"
#include "run/device_open.h"
#include "run/placement_budget.h"
#include "train/memory_plan.h"

static char dir[] = "/tmp/tandem-test-memplan-XXXXXX";
static char model[512], data[512], toml[512], outs[4][512];

static int setup(void **state)
{
    (void)state;
    if (!mkdtemp(dir)) return -1;
    snprintf(model, sizeof model, "%s/tiny", dir);
    snprintf(data, sizeof data, "%s/long.jsonl", dir);
    tdm_init_model_opts io = {.preset = "tiny", .seed = 1, .dtype = TDM_DTYPE_BF16};
    tdm_error err = {0};
    if (tdm_init_model(model, &io, NULL, &err) != TDM_OK) return -1;
    /* every sample far longer than max_seq_len: each batch is batch_size x max_seq_len rows,
     * the worst case submit assumes */
    FILE *f = fopen(data, "w");
    if (!f) return -1;
    for (int i = 0; i < 8; i++) {
        fprintf(f, "{\"text\": \"");
        for (int k = 0; k < 40; k++)
            fprintf(f, "sample %d word %d ", i, k);
        fprintf(f, "\"}\n");
    }
    fclose(f);
    for (int a = 0; a < 4; a++)
        snprintf(outs[a], sizeof outs[a], "%s/out%d", dir, a);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* The finetune options of `flags` (as `tandem finetune` and `tandem submit` parse them). */
static void parse_flags(tdm_run_opts *ro, const char *const *flags)
{
    tdm_run_opts_default(ro, TDM_CMD_FINETUNE);
    ro->trainer.model_dir = model;
    ro->adapter.val_split = 0;
    tdm_error err = {0};
    for (int i = 0; flags[i]; i += 2) {
        const tdm_run_option *row = tdm_run_option_find(flags[i], TDM_CMD_FINETUNE);
        assert_non_null(row);
        if (tdm_run_option_set(ro, row, flags[i + 1] ? flags[i + 1] : "", &err) != TDM_OK)
            fail_msg("--%s: %s", flags[i], err.message);
        if (!flags[i + 1]) break;
    }
}

/* What `tandem finetune --adapters-config` of n alike adapters reserves under --vram auto, or
 * with cpu what `--device cpu` checks the machine's memory against. */
static int64_t finetune_need_mb(const tdm_run_opts *ro, int n, bool cpu)
{
    tdm_trainer_adapter ads[4];
    for (int a = 0; a < n; a++) {
        ads[a] = ro->adapter;
        ads[a].data = data;
        ads[a].output = outs[a];
    }
    tdm_trainer *t = NULL;
    tdm_error err = {0};
    if (tdm_trainer_create(&t, &ro->trainer, ads, n, NULL, &err) != TDM_OK)
        fail_msg("create: %s", err.message);
    tdm_model_mem est;
    if ((cpu ? tdm_trainer_cpu_memory_estimate(t, &est, &err)
             : tdm_trainer_memory_estimate(t, &est, &err)) != TDM_OK)
        fail_msg("%s", err.message);
    tdm_trainer_free(t);
    return cpu ? tdm_device_cpu_need_mb(&est) : tdm_device_reservation_mb(&est);
}

/* What `tandem submit` places a process of k of the adapters of an n-adapter file with. */
static void submit_budget(const tdm_run_opts *ro, int n, tdm_run_budget *b)
{
    FILE *f = fopen(toml, "w");
    assert_non_null(f);
    for (int a = 0; a < n; a++)
        fprintf(f, "[[adapter]]\ndata = \"long.jsonl\"\noutput = \"out%d\"\n", a);
    fclose(f);
    tdm_adapters_config ac;
    tdm_model_config mc;
    tdm_error err = {0};
    if (tdm_adapters_config_load(toml, &ac, &err) != TDM_OK) fail_msg("%s", err.message);
    if (tdm_model_config_load(&mc, model, &err) != TDM_OK) fail_msg("%s", err.message);
    if (tdm_run_placement_budget(&mc, ro, &ac, b, &err) != TDM_OK) fail_msg("%s", err.message);
    tdm_adapters_config_free(&ac);
}

static void check_equal(const char *const *flags, int64_t *one_adapter_mb)
{
    tdm_run_opts ro;
    parse_flags(&ro, flags);
    tdm_run_budget b;
    submit_budget(&ro, 3, &b);
    for (int k = 1; k <= 3; k++) {
        int64_t reserved = finetune_need_mb(&ro, k, false);
        if (b.gpu_mb[k] != reserved)
            fail_msg("%s ...: %d adapter(s): submit places with %lld MiB, finetune reserves %lld",
                     flags[0], k, (long long)b.gpu_mb[k], (long long)reserved);
        assert_true(k == 1 || b.gpu_mb[k] > b.gpu_mb[k - 1]);
        /* the smallest plan a GPU too small for this one may still take */
        assert_true(b.gpu_min_mb[k] <= b.gpu_mb[k]);
        assert_true(k == 1 || b.gpu_min_mb[k] > b.gpu_min_mb[k - 1]);
        /* on a CPU-only node: what that finetune checks the machine's memory against */
        int64_t cpu_need = finetune_need_mb(&ro, k, true);
        if (b.cpu_mb[k] != cpu_need)
            fail_msg("%s ...: %d adapter(s): submit places on a CPU with %lld MiB, finetune "
                     "--device cpu needs %lld",
                     flags[0], k, (long long)b.cpu_mb[k], (long long)cpu_need);
        assert_true(b.cpu_mb[k] > TDM_CPU_PROCESS_MIB);
    }
    if (one_adapter_mb) *one_adapter_mb = b.gpu_mb[1];
    tdm_run_budget_free(&b);
}

/* The plan's longest sequence (what the CPU backend's kept attention is bounded by): each
 * adapter's longest sample when the data was measured, else its max_seq_len; the largest. */
static void test_plan_longest_sequence(void **state)
{
    (void)state;
    tdm_model_config c;
    tdm_error err = {0};
    assert_int_equal(tdm_preset_config("tiny", &c, &err), TDM_OK);
    const int32_t measured[] = {40, 30, 12};
    tdm_plan_adapter ads[2] = {
        {.rank = 4, .targets = 1, .batch_size = 2, .max_seq_len = 64, .weight = 1},
        {.rank = 4, .targets = 1, .batch_size = 3, .max_seq_len = 128, .weight = 1}};
    tdm_model_mem_plan p;
    tdm_memory_plan_build(&c, ads, 2, true, &p);
    assert_int_equal(p.max_seq, 128);
    assert_int_equal(p.rows, 2 * 64 + 3 * 128);
    ads[1].longest = measured, ads[1].n_longest = 3;
    tdm_memory_plan_build(&c, ads, 2, true, &p);
    assert_int_equal(p.max_seq, 64);
    assert_int_equal(p.rows, 2 * 64 + 40 + 30 + 12);
    ads[0].max_seq_len = 16; /* a sample is cut to max_seq_len */
    tdm_memory_plan_build(&c, ads, 2, true, &p);
    assert_int_equal(p.max_seq, 40);
}

static void test_submit_places_with_what_finetune_reserves(void **state)
{
    (void)state;
    snprintf(toml, sizeof toml, "%s/adapters.toml", dir);
    static const char *const plain[] = {"max-seq-len", "96", "batch-size", "2", NULL};
    static const char *const ckpt[] = {"max-seq-len",     "96", "batch-size", "2",
                                       "grad-checkpoint", NULL};
    static const char *const rr[] = {"max-seq-len", "64",     "schedule", "round-robin", "rank",
                                     "16",          "method", "lora",     NULL};
    int64_t plain_mb, ckpt_mb;
    check_equal(plain, &plain_mb);
    check_equal(ckpt, &ckpt_mb);
    check_equal(rr, NULL);
    /* placement honours --grad-checkpoint (it used to ignore it) */
    assert_true(ckpt_mb < plain_mb);
}

/* An explicit --vram is each process's budget whatever its number of adapters. */
static void test_explicit_vram(void **state)
{
    (void)state;
    static const char *const flags[] = {"vram", "3", NULL};
    tdm_run_opts ro;
    parse_flags(&ro, flags);
    tdm_run_budget b;
    submit_budget(&ro, 2, &b);
    assert_int_equal(b.gpu_mb[0], 0);
    assert_int_equal(b.gpu_mb[1], 3072);
    assert_int_equal(b.gpu_mb[2], 3072);
    assert_int_equal(b.gpu_min_mb[1], 3072); /* --vram GB: no smaller plan */
    tdm_run_budget_free(&b);
}

/* ---- the plan that fits ------------------------------------------------------------------ */

/* 7B QLoRA adapters with finetune's defaults and flags, every sample max_seq_len long. */
static tdm_memory_fit fit_7b(const char *const *flags, int n, int64_t budget_mb,
                             tdm_plan_adapter *ads, tdm_memory_fit_request *req)
{
    static tdm_model_config cfg;
    tdm_error err = {0};
    if (tdm_preset_config("qwen2.5-7b", &cfg, &err) != TDM_OK) fail_msg("%s", err.message);
    tdm_run_opts ro;
    parse_flags(&ro, flags);
    for (int a = 0; a < n; a++)
        ads[a] = (tdm_plan_adapter){.rank = ro.adapter.rank,
                                    .targets = ro.adapter.targets,
                                    .batch_size = ro.adapter.batch_size,
                                    .max_seq_len = ro.adapter.max_seq_len,
                                    .weight = 1};
    *req =
        (tdm_memory_fit_request){.config = &cfg,
                                 .opts = {.nf4 = ro.trainer.nf4,
                                          .double_quant = ro.trainer.double_quant,
                                          .grad_checkpoint = ro.trainer.grad_checkpoint,
                                          .recompute = ro.trainer.recompute},
                                 .act = TDM_BE_BF16,
                                 .adapters = ads,
                                 .n_adapters = n,
                                 .synchronized = ro.trainer.schedule == TDM_SCHEDULE_SYNCHRONIZED,
                                 .grad_accum = ro.adapter.grad_accum,
                                 .context_mb = TDM_CUDA_CONTEXT_MIB,
                                 .budget_mb = budget_mb};
    tdm_memory_fit f;
    if (tdm_memory_plan_fit(req, &f, &err) != TDM_OK) fail_msg("fit: %s", err.message);
    return f;
}

#define CARD_24G_MIB 24576

/* The aim: three 7B QLoRA jobs, B4, max-seq-len 512, on a 24 GiB card. One alone fits
 * as asked; the three fused do not, and gradient checkpointing makes them fit; at max-seq-len
 * 2048 one alone needs more than the card and fits by the same rungs. */
static void test_fit_7b_on_24g(void **state)
{
    (void)state;
    static const char *const b4[] = {"max-seq-len", "512", "batch-size", "4", NULL};
    static const char *const s2048[] = {"max-seq-len", "2048", "batch-size", "4", NULL};
    tdm_plan_adapter ads[3];
    tdm_memory_fit_request req;
    tdm_memory_fit one = fit_7b(b4, 1, CARD_24G_MIB, ads, &req);
    tdm_memory_fit three = fit_7b(b4, 3, CARD_24G_MIB, ads, &req);
    char what[256];
    tdm_memory_plan_describe(&three.chosen, what, sizeof what);
    print_message("7B B4x512: one adapter %lld MiB as asked; three %lld MiB as asked, %s: %lld "
                  "MiB; smallest %lld MiB\n",
                  (long long)one.asked.mb, (long long)three.asked.mb, what,
                  (long long)three.chosen.mb, (long long)three.smallest.mb);
    assert_true(one.fits);
    assert_int_equal(one.chosen.rung, TDM_PLAN_AS_ASKED);
    assert_false(one.chosen.grad_checkpoint);
    assert_int_equal(one.chosen.split, 1);
    assert_true(three.asked.mb > CARD_24G_MIB);
    assert_true(three.fits);
    assert_true(three.chosen.rung == TDM_PLAN_RECOMPUTE_ATTN ||
                three.chosen.rung == TDM_PLAN_GRAD_CHECKPOINT);
    assert_true(three.chosen.grad_checkpoint && three.chosen.split == 1);
    assert_true(three.chosen.mb <= CARD_24G_MIB);
    /* the weights are counted once: three adapters cost far less than three processes */
    assert_true(three.chosen.mb < 2 * one.asked.mb);
    tdm_memory_fit longer = fit_7b(s2048, 1, CARD_24G_MIB, ads, &req);
    tdm_memory_plan_describe(&longer.chosen, what, sizeof what);
    print_message("7B B4x2048: %lld MiB as asked, %s: %lld MiB\n", (long long)longer.asked.mb, what,
                  (long long)longer.chosen.mb);
    assert_true(longer.asked.mb > CARD_24G_MIB);
    assert_true(longer.fits);
    assert_true(longer.chosen.rung != TDM_PLAN_AS_ASKED);
    assert_true(longer.chosen.mb <= CARD_24G_MIB);
}

/* The order, each rung chosen exactly when the ones before do not fit: budgets just below each
 * rung's MiB walk down as asked -> checkpointing recomputing only norms and q/k/v -> checkpointing
 * -> micro-batch 2 x 2 -> micro-batch 1 x 4 -> nothing (the smallest reported). With
 * --grad-checkpoint the checkpointing rungs are the plan as asked and the next is micro-batching;
 * with --recompute attn (no --grad-checkpoint) the checkpointing rung is that mode's. */
static void test_fit_order(void **state)
{
    (void)state;
    static const char *const b4[] = {"max-seq-len", "512", "batch-size", "4", NULL};
    tdm_plan_adapter ads[3];
    tdm_memory_fit_request req;
    tdm_memory_fit f = fit_7b(b4, 3, INT64_MAX / 2, ads, &req);
    assert_true(f.fits);
    assert_int_equal(f.chosen.rung, TDM_PLAN_AS_ASKED);
    int64_t asked = f.chosen.mb;
    assert_int_equal(f.smallest.split, 4);
    assert_int_equal(f.smallest.micro_batch, 1);
    assert_true(f.smallest.grad_checkpoint);
    f = fit_7b(b4, 3, asked - 1, ads, &req);
    assert_true(f.fits);
    assert_int_equal(f.chosen.rung, TDM_PLAN_RECOMPUTE_ATTN);
    assert_true(f.chosen.grad_checkpoint);
    assert_int_equal(f.chosen.recompute, TDM_RECOMPUTE_ATTN);
    assert_int_equal(f.chosen.split, 1);
    char what[256];
    tdm_memory_plan_describe(&f.chosen, what, sizeof what);
    assert_string_equal(what, "gradient checkpointing (--recompute attn)");
    int64_t attn = f.chosen.mb;
    assert_true(attn < asked);
    f = fit_7b(b4, 3, attn - 1, ads, &req);
    assert_true(f.fits);
    assert_int_equal(f.chosen.rung, TDM_PLAN_GRAD_CHECKPOINT);
    assert_true(f.chosen.grad_checkpoint);
    assert_int_equal(f.chosen.recompute, TDM_RECOMPUTE_LAYER);
    assert_int_equal(f.chosen.split, 1);
    assert_int_equal(f.chosen.grad_accum, 1);
    tdm_memory_plan_describe(&f.chosen, what, sizeof what);
    assert_string_equal(what, "gradient checkpointing");
    int64_t gc = f.chosen.mb;
    assert_true(gc < attn);
    f = fit_7b(b4, 3, gc - 1, ads, &req);
    assert_true(f.fits);
    assert_int_equal(f.chosen.rung, TDM_PLAN_MICRO_BATCH);
    assert_true(f.chosen.grad_checkpoint);
    assert_int_equal(f.chosen.split, 2);
    assert_int_equal(f.chosen.micro_batch, 2);
    assert_int_equal(f.chosen.grad_accum, 2);
    tdm_memory_plan_describe(&f.chosen, what, sizeof what);
    assert_string_equal(what, "gradient checkpointing and micro-batch 2 x accumulation 2 "
                              "(optimizer batch 4 x 1 unchanged)");
    int64_t k2 = f.chosen.mb;
    assert_true(k2 < gc);
    f = fit_7b(b4, 3, k2 - 1, ads, &req);
    assert_true(f.fits);
    assert_int_equal(f.chosen.split, 4); /* k = 3 gives micro-batch 2 again: skipped */
    assert_int_equal(f.chosen.micro_batch, 1);
    assert_int_equal(f.chosen.grad_accum, 4);
    int64_t k4 = f.chosen.mb;
    assert_true(k4 < k2);
    assert_int_equal(k4, f.smallest.mb);
    f = fit_7b(b4, 3, k4 - 1, ads, &req);
    assert_false(f.fits);
    assert_int_equal(f.smallest.mb, k4);
    assert_int_equal(f.chosen.mb, k4); /* the smallest, for a run that waits for it */
    print_message("7B, three adapters B4x512: as asked %lld, checkpointing --recompute attn %lld, "
                  "checkpointing %lld, micro-batch 2 %lld, micro-batch 1 %lld MiB\n",
                  (long long)asked, (long long)attn, (long long)gc, (long long)k2, (long long)k4);
    /* --grad-checkpoint given: no checkpointing rung, micro-batches next */
    static const char *const b4gc[] = {"max-seq-len",     "512", "batch-size", "4",
                                       "grad-checkpoint", NULL};
    f = fit_7b(b4gc, 3, gc, ads, &req);
    assert_int_equal(f.chosen.rung, TDM_PLAN_AS_ASKED);
    assert_int_equal(f.chosen.mb, gc);
    tdm_memory_plan_describe(&f.chosen, what, sizeof what);
    assert_string_equal(what, "the plan as asked (--grad-checkpoint)");
    f = fit_7b(b4gc, 3, gc - 1, ads, &req);
    assert_int_equal(f.chosen.rung, TDM_PLAN_MICRO_BATCH);
    assert_int_equal(f.chosen.mb, k2);
    static const char *const b4attn[] = {"max-seq-len", "512",  "batch-size", "4",
                                         "recompute",   "attn", NULL};
    f = fit_7b(b4attn, 3, asked - 1, ads, &req);
    assert_int_equal(f.chosen.rung, TDM_PLAN_GRAD_CHECKPOINT);
    assert_int_equal(f.chosen.recompute, TDM_RECOMPUTE_ATTN);
    assert_int_equal(f.chosen.mb, attn);
    f = fit_7b(b4attn, 3, attn - 1, ads, &req);
    assert_int_equal(f.chosen.rung, TDM_PLAN_MICRO_BATCH);
    assert_int_equal(f.chosen.recompute, TDM_RECOMPUTE_ATTN);
    assert_true(f.chosen.mb > k2); /* micro-batches keep attn's tensors */
    /* adapters of different batch sizes share the split */
    f = fit_7b(b4, 2, 0, ads, &req);
    ads[1].batch_size = 6;
    tdm_error err = {0};
    assert_int_equal(tdm_memory_plan_fit(&req, &f, &err), TDM_OK);
    assert_false(f.fits);
    assert_int_equal(f.smallest.split, 6); /* micro-batch 1 for both */
    tdm_memory_plan_describe(&f.smallest, what, sizeof what);
    assert_string_equal(what, "gradient checkpointing and micro-batches of batch_size / 6 x "
                              "accumulation 6 (optimizer batches unchanged)");
}

/* The trainer's fit is made of its data (each adapter's longest samples), and what its estimate
 * reserves after tdm_trainer_set_memory_plan is the chosen plan's MiB: one estimate. */
static void test_trainer_fit_is_what_it_reserves(void **state)
{
    (void)state;
    tdm_run_opts ro;
    static const char *const flags[] = {"max-seq-len", "96", "batch-size", "4", NULL};
    parse_flags(&ro, flags);
    tdm_trainer_adapter ad = ro.adapter;
    ad.data = data;
    ad.output = outs[0];
    tdm_trainer *t = NULL;
    tdm_error err = {0};
    if (tdm_trainer_create(&t, &ro.trainer, &ad, 1, NULL, &err) != TDM_OK)
        fail_msg("create: %s", err.message);
    tdm_memory_fit big, f;
    assert_int_equal(
        tdm_trainer_memory_fit(t, TDM_BE_BF16, INT64_MAX / 2, TDM_CUDA_CONTEXT_MIB, &big, &err),
        TDM_OK);
    tdm_model_mem est;
    assert_int_equal(tdm_trainer_memory_estimate(t, &est, &err), TDM_OK);
    assert_int_equal(tdm_device_reservation_mb(&est), big.asked.mb);
    /* a budget below the plan as asked and both checkpointing ones: micro-batches */
    assert_int_equal(
        tdm_trainer_memory_fit(t, TDM_BE_BF16, big.asked.mb - 1, TDM_CUDA_CONTEXT_MIB, &f, &err),
        TDM_OK);
    assert_int_equal(f.chosen.rung, TDM_PLAN_RECOMPUTE_ATTN);
    assert_int_equal(
        tdm_trainer_memory_fit(t, TDM_BE_BF16, f.chosen.mb - 1, TDM_CUDA_CONTEXT_MIB, &f, &err),
        TDM_OK);
    assert_int_equal(f.chosen.rung, TDM_PLAN_GRAD_CHECKPOINT);
    int64_t gc_mb = f.chosen.mb;
    assert_int_equal(
        tdm_trainer_memory_fit(t, TDM_BE_BF16, gc_mb - 1, TDM_CUDA_CONTEXT_MIB, &f, &err), TDM_OK);
    assert_true(f.fits);
    assert_int_equal(f.chosen.rung, TDM_PLAN_MICRO_BATCH);
    assert_int_equal(tdm_trainer_set_memory_plan(t, f.chosen.grad_checkpoint, f.chosen.recompute,
                                                 f.chosen.split, &err),
                     TDM_OK);
    assert_int_equal(tdm_trainer_split(t), f.chosen.split);
    assert_int_equal(tdm_trainer_memory_estimate(t, &est, &err), TDM_OK);
    assert_int_equal(tdm_device_reservation_mb(&est), f.chosen.mb);
    assert_true(f.chosen.mb < gc_mb);
    /* after adapters left (tdm_trainer_leave_replan) the rungs start from the user's flags, not
     * from the plan in use: re-planned to --recompute attn with split 2, a reservation that holds
     * checkpointing in the user's mode (layer) goes back to that, one that holds the plan as
     * asked to it */
    assert_int_equal(tdm_trainer_set_memory_plan(t, true, TDM_RECOMPUTE_ATTN, 2, &err), TDM_OK);
    tdm_leave_replan_request lq = {.reservation_mb = gc_mb, .plan_mb = gc_mb};
    lq.fit.context_mb = TDM_CUDA_CONTEXT_MIB;
    lq.fit.act = TDM_BE_BF16;
    tdm_leave_replan lr;
    assert_int_equal(tdm_trainer_leave_replan(t, &lq, &lr, &err), TDM_OK);
    assert_true(lr.faster);
    assert_int_equal(lr.plan.rung, TDM_PLAN_GRAD_CHECKPOINT);
    assert_int_equal(lr.plan.recompute, TDM_RECOMPUTE_LAYER);
    assert_int_equal(lr.plan.split, 1);
    assert_int_equal(lr.plan.mb, gc_mb);
    assert_int_equal(lr.current.split, 2);
    assert_int_equal(lr.current.recompute, TDM_RECOMPUTE_ATTN);
    lq.reservation_mb = lq.plan_mb = big.asked.mb;
    assert_int_equal(tdm_trainer_leave_replan(t, &lq, &lr, &err), TDM_OK);
    assert_true(lr.faster);
    assert_int_equal(lr.plan.rung, TDM_PLAN_AS_ASKED);
    assert_false(lr.plan.grad_checkpoint);
    assert_int_equal(lr.plan.mb, big.asked.mb);
    tdm_trainer_free(t);
}

/* A join's admission (tdm_memory_plan_admit) on the 24 GiB card, 7B QLoRA adapters B4 x
 * 512: a host of one adapter admits a second as asked (its reservation grows to the plan of
 * two); a host of two admits a third with gradient checkpointing, its reservation then less
 * than before; with other reservations in the way it waits for the smallest plan; a GPU too
 * small for the smallest refuses (never fits); --vram GB keeps its slack; a running host's
 * scratch counts at its size held. */
static void test_join_admission(void **state)
{
    (void)state;
    static const char *const b4[] = {"max-seq-len", "512", "batch-size", "4", NULL};
    tdm_plan_adapter ads[3];
    tdm_memory_fit_request req;
    tdm_memory_fit one = fit_7b(b4, 1, INT64_MAX / 2, ads, &req);
    tdm_memory_fit two = fit_7b(b4, 2, INT64_MAX / 2, ads, &req);
    tdm_memory_fit three = fit_7b(b4, 3, INT64_MAX / 2, ads, &req);
    tdm_error err = {0};
    tdm_join_admission a;
    /* one adapter trains, a second joins: the two fit as asked */
    (void)fit_7b(b4, 2, 0, ads, &req);
    tdm_join_admit_request r = {.fit = req,
                                .reservation_mb = one.asked.mb,
                                .plan_mb = one.asked.mb,
                                .growable_mb = CARD_24G_MIB,
                                .capacity_mb = CARD_24G_MIB};
    assert_int_equal(tdm_memory_plan_admit(&r, &a, &err), TDM_OK);
    assert_int_equal(a.kind, TDM_JOIN_ADMIT);
    assert_int_equal(a.plan.rung, TDM_PLAN_AS_ASKED);
    assert_int_equal(a.target_mb, two.asked.mb);
    assert_int_equal(a.budget_mb, CARD_24G_MIB);
    /* two train, a third joins: as asked it needs more than the card; the first checkpointing
     * rung that fits is --recompute attn (keeps the most, costs least), under the card */
    (void)fit_7b(b4, 3, 0, ads, &req);
    r.fit = req;
    r.reservation_mb = r.plan_mb = two.asked.mb;
    assert_int_equal(tdm_memory_plan_admit(&r, &a, &err), TDM_OK);
    print_message("join admission, 7B B4x512 on 24 GiB: 1 -> 2 as asked %lld MiB; 2 (%lld) -> 3 "
                  "%lld MiB as asked, checkpointing %lld MiB\n",
                  (long long)two.asked.mb, (long long)two.asked.mb, (long long)a.fit.asked.mb,
                  (long long)a.target_mb);
    assert_true(three.asked.mb > CARD_24G_MIB);
    assert_int_equal(a.kind, TDM_JOIN_ADMIT);
    assert_int_equal(a.plan.rung, TDM_PLAN_RECOMPUTE_ATTN);
    assert_true(a.plan.grad_checkpoint);
    assert_int_equal(a.plan.split, 1);
    tdm_memory_fit three_gc = fit_7b(b4, 3, three.asked.mb - 1, ads, &req);
    assert_int_equal(a.target_mb, three_gc.chosen.mb);
    assert_true(a.target_mb <= CARD_24G_MIB);
    assert_int_equal(a.need_mb, three.smallest.mb);
    /* others hold all but the smallest plan's MiB minus one: it waits for the smallest */
    r.growable_mb = three.smallest.mb - 1;
    assert_int_equal(tdm_memory_plan_admit(&r, &a, &err), TDM_OK);
    assert_int_equal(a.kind, TDM_JOIN_WAIT);
    assert_int_equal(a.target_mb, three.smallest.mb);
    assert_int_equal(a.plan.split, 4);
    tdm_join_admission b;
    r.growable_mb = three.smallest.mb;
    assert_int_equal(tdm_memory_plan_admit(&r, &b, &err), TDM_OK);
    assert_int_equal(b.kind, TDM_JOIN_ADMIT);
    assert_int_equal(b.target_mb, three.smallest.mb);
    /* a GPU that can never hold the smallest: refused, naming the MiB it needs */
    r.capacity_mb = three.smallest.mb - 1;
    assert_int_equal(tdm_memory_plan_admit(&r, &a, &err), TDM_OK);
    assert_int_equal(a.kind, TDM_JOIN_NEVER_FITS);
    assert_int_equal(a.need_mb, three.smallest.mb);
    /* unknown growth (no limit): the plan as asked */
    r.capacity_mb = -1;
    r.growable_mb = -1;
    assert_int_equal(tdm_memory_plan_admit(&r, &a, &err), TDM_OK);
    assert_int_equal(a.kind, TDM_JOIN_ADMIT);
    assert_int_equal(a.plan.rung, TDM_PLAN_AS_ASKED);
    assert_int_equal(a.budget_mb, -1);
    /* --vram GB: 1000 MiB over its plan; the slack stays and leaves the plan less room */
    r.reservation_mb = two.asked.mb + 1000;
    r.growable_mb = CARD_24G_MIB;
    r.capacity_mb = CARD_24G_MIB;
    assert_int_equal(tdm_memory_plan_admit(&r, &a, &err), TDM_OK);
    assert_int_equal(a.budget_mb, CARD_24G_MIB - 1000);
    assert_int_equal(a.kind, TDM_JOIN_ADMIT);
    assert_int_equal(a.target_mb, a.plan.mb + 1000);
    assert_true(a.plan.mb <= CARD_24G_MIB - 1000);
    /* the scratch a running host holds counts in every plan (it never shrinks) */
    r.reservation_mb = two.asked.mb;
    r.growable_mb = -1;
    r.fit.scratch_floor = a.fit.asked.est.backend_scratch + (100u << 20);
    assert_int_equal(tdm_memory_plan_admit(&r, &b, &err), TDM_OK);
    assert_int_equal(b.plan.mb, three.asked.mb + 100);
    assert_int_equal(b.fit.smallest.est.backend_scratch, r.fit.scratch_floor);
}

/* After adapters left (tdm_memory_plan_after_leave), 7B QLoRA B4 x 512 on the 24 GiB card: the
 * host of three re-planned to --recompute attn; one leaves: the two go back to the plan as asked,
 * which the reservation held covers, and the rest is released. The host of three with the whole
 * layer recomputed (9,626 MiB) keeps checkpointing for one (13,553 MiB as asked is more than it
 * holds) but takes the first rung that fits; micro-batches go back to a lower split; a split
 * whose micro-batches are the plan in use's is not faster; --grad-checkpoint is never switched
 * off (never faster than the user's flags); --vram GB keeps its slack; a reservation that holds
 * nothing faster keeps the plan. */
static void test_after_leave(void **state)
{
    (void)state;
    static const char *const b4[] = {"max-seq-len", "512", "batch-size", "4", NULL};
    static const char *const b4gc[] = {"max-seq-len", "512", "batch-size", "4",
                                       "grad-checkpoint", NULL};
    tdm_plan_adapter ads[3];
    tdm_memory_fit_request req;
    tdm_memory_fit two = fit_7b(b4, 2, INT64_MAX / 2, ads, &req);
    tdm_memory_fit three_attn = fit_7b(b4, 3, CARD_24G_MIB, ads, &req);
    assert_int_equal(three_attn.chosen.rung, TDM_PLAN_RECOMPUTE_ATTN);
    tdm_error err = {0};
    tdm_leave_replan lr;
    /* three at --recompute attn, one left */
    (void)fit_7b(b4, 2, 0, ads, &req);
    tdm_leave_replan_request r = {.fit = req,
                                  .reservation_mb = three_attn.chosen.mb,
                                  .plan_mb = three_attn.chosen.mb,
                                  .grad_checkpoint = true,
                                  .recompute = TDM_RECOMPUTE_ATTN,
                                  .split = 1};
    assert_int_equal(tdm_memory_plan_after_leave(&r, &lr, &err), TDM_OK);
    print_message("after leave, 7B B4x512: three at --recompute attn %lld MiB, one left: %s, "
                  "the plan as asked %lld MiB instead of %lld\n",
                  (long long)three_attn.chosen.mb, lr.faster ? "faster" : "kept",
                  (long long)lr.plan.mb, (long long)lr.current.mb);
    assert_true(lr.faster);
    assert_int_equal(lr.plan.rung, TDM_PLAN_AS_ASKED);
    assert_false(lr.plan.grad_checkpoint);
    assert_int_equal(lr.plan.mb, two.asked.mb);
    assert_int_equal(lr.target_mb, two.asked.mb);
    assert_int_equal(lr.budget_mb, three_attn.chosen.mb);
    assert_int_equal(lr.current.rung, TDM_PLAN_RECOMPUTE_ATTN);
    assert_true(lr.current.mb < lr.plan.mb);
    /* --vram GB: 1000 MiB over the plan: the slack stays */
    r.reservation_mb = three_attn.chosen.mb + 1000;
    assert_int_equal(tdm_memory_plan_after_leave(&r, &lr, &err), TDM_OK);
    assert_true(lr.faster);
    assert_int_equal(lr.budget_mb, three_attn.chosen.mb);
    assert_int_equal(lr.target_mb, two.asked.mb + 1000);
    /* a reservation of exactly the current plan of the two holds nothing faster: kept */
    r.reservation_mb = r.plan_mb = lr.current.mb;
    assert_int_equal(tdm_memory_plan_after_leave(&r, &lr, &err), TDM_OK);
    assert_false(lr.faster);
    assert_int_equal(lr.target_mb, lr.current.mb);

    /* three with the whole layer recomputed, two left: one adapter as asked needs more than
     * that, so it keeps checkpointing, on the first rung that fits (here --recompute attn) */
    tdm_memory_fit one = fit_7b(b4, 1, INT64_MAX / 2, ads, &req);
    tdm_memory_fit three_gc = fit_7b(b4, 3, three_attn.chosen.mb - 1, ads, &req);
    assert_int_equal(three_gc.chosen.rung, TDM_PLAN_GRAD_CHECKPOINT);
    tdm_memory_fit one_in = fit_7b(b4, 1, three_gc.chosen.mb, ads, &req);
    r = (tdm_leave_replan_request){.fit = req,
                                   .reservation_mb = three_gc.chosen.mb,
                                   .plan_mb = three_gc.chosen.mb,
                                   .grad_checkpoint = true,
                                   .recompute = TDM_RECOMPUTE_LAYER,
                                   .split = 1};
    assert_int_equal(tdm_memory_plan_after_leave(&r, &lr, &err), TDM_OK);
    print_message("three with checkpointing %lld MiB, two left: one as asked %lld MiB; %s, rung "
                  "%d, %lld MiB\n",
                  (long long)three_gc.chosen.mb, (long long)one.asked.mb,
                  lr.faster ? "faster" : "kept", (int)lr.plan.rung, (long long)lr.plan.mb);
    assert_true(one.asked.mb > three_gc.chosen.mb);
    assert_true(lr.plan.grad_checkpoint);
    assert_int_equal(lr.plan.rung, one_in.chosen.rung);
    assert_int_equal(lr.plan.mb, one_in.chosen.mb);
    assert_int_equal(lr.faster, one_in.chosen.rung == TDM_PLAN_RECOMPUTE_ATTN);

    /* micro-batches: three at split 4 (micro-batch 1, the smallest), two left: a lower split */
    tdm_memory_fit three_s = fit_7b(b4, 3, 0, ads, &req);
    assert_int_equal(three_s.smallest.split, 4);
    tdm_memory_fit one_s = fit_7b(b4, 1, three_s.smallest.mb, ads, &req);
    r = (tdm_leave_replan_request){.fit = req,
                                   .reservation_mb = three_s.smallest.mb,
                                   .plan_mb = three_s.smallest.mb,
                                   .grad_checkpoint = true,
                                   .recompute = TDM_RECOMPUTE_LAYER,
                                   .split = 4};
    assert_int_equal(tdm_memory_plan_after_leave(&r, &lr, &err), TDM_OK);
    assert_true(lr.faster);
    assert_true(lr.plan.split < 4 || !lr.plan.grad_checkpoint);
    assert_int_equal(lr.plan.mb, one_s.chosen.mb);
    /* split 3 gives batch 4 the micro-batch 2 of split 2: nothing to switch for */
    r = (tdm_leave_replan_request){.fit = req,
                                   .reservation_mb = 0,
                                   .plan_mb = 0,
                                   .grad_checkpoint = true,
                                   .recompute = TDM_RECOMPUTE_LAYER,
                                   .split = 3};
    /* a budget that only split 2's MiB fits (the plans before need more) */
    tdm_memory_fit s2 = fit_7b(b4, 1, 0, ads, &req);
    for (int b = (int)s2.smallest.mb; b < (int)one.asked.mb; b++) {
        tdm_memory_fit f;
        req.budget_mb = b;
        assert_int_equal(tdm_memory_plan_fit(&req, &f, &err), TDM_OK);
        if (f.chosen.split == 2) {
            r.reservation_mb = r.plan_mb = b;
            break;
        }
    }
    assert_true(r.plan_mb > 0);
    assert_int_equal(tdm_memory_plan_after_leave(&r, &lr, &err), TDM_OK);
    assert_int_equal(lr.plan.split, 2);
    assert_false(lr.faster);

    /* --grad-checkpoint: the plan as asked checkpoints; never switched off however much is held */
    tdm_memory_fit one_gc = fit_7b(b4gc, 1, INT64_MAX / 2, ads, &req);
    r = (tdm_leave_replan_request){.fit = req,
                                   .reservation_mb = 100000,
                                   .plan_mb = 100000,
                                   .grad_checkpoint = true,
                                   .recompute = TDM_RECOMPUTE_LAYER,
                                   .split = 1};
    assert_int_equal(tdm_memory_plan_after_leave(&r, &lr, &err), TDM_OK);
    assert_false(lr.faster);
    assert_true(lr.plan.grad_checkpoint);
    assert_int_equal(lr.current.rung, TDM_PLAN_AS_ASKED);
    r.split = 4; /* from micro-batches: back to the plan as asked, with checkpointing */
    assert_int_equal(tdm_memory_plan_after_leave(&r, &lr, &err), TDM_OK);
    assert_true(lr.faster);
    assert_true(lr.plan.grad_checkpoint);
    assert_int_equal(lr.plan.split, 1);
    assert_int_equal(lr.plan.mb, one_gc.asked.mb);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_longest_sequence),
        cmocka_unit_test(test_fit_7b_on_24g),
        cmocka_unit_test(test_fit_order),
        cmocka_unit_test(test_trainer_fit_is_what_it_reserves),
        cmocka_unit_test(test_join_admission),
        cmocka_unit_test(test_after_leave),
        cmocka_unit_test(test_submit_places_with_what_finetune_reserves),
        cmocka_unit_test(test_explicit_vram),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
