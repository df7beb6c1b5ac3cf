/* test_memory_plan.c — one memory estimate for `tandem finetune --vram auto` and `tandem submit`
 * (train/memory_plan.h, run/placement_budget.h): for the same flags and adapters.toml, the MiB
 * submit places a process of k adapters with equals what that finetune process reserves
 * (tdm_trainer_memory_estimate + the CUDA context, device_open's --vram auto) when every sample
 * reaches max_seq_len; and --grad-checkpoint, which shrinks the activations, shrinks both. */
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

/* What `tandem finetune --adapters-config` of n alike adapters reserves under --vram auto. */
static int64_t finetune_reservation_mb(const tdm_run_opts *ro, int n)
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
    if (tdm_trainer_memory_estimate(t, &est, &err) != TDM_OK) fail_msg("%s", err.message);
    tdm_trainer_free(t);
    return tdm_device_reservation_mb(&est);
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
        int64_t reserved = finetune_reservation_mb(&ro, k);
        if (b.gpu_mb[k] != reserved)
            fail_msg("%s ...: %d adapter(s): submit places with %lld MiB, finetune reserves %lld",
                     flags[0], k, (long long)b.gpu_mb[k], (long long)reserved);
        assert_true(k == 1 || b.gpu_mb[k] > b.gpu_mb[k - 1]);
        assert_true(b.cpu_mb[k] > TDM_CPU_PROCESS_MIB);
    }
    if (one_adapter_mb) *one_adapter_mb = b.gpu_mb[1];
    tdm_run_budget_free(&b);
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
    tdm_run_budget_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_submit_places_with_what_finetune_reserves),
        cmocka_unit_test(test_explicit_vram),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
