/* test_trainer.c — the trainer's multi-adapter guarantees, through its API on the tiny random
 * model (written by `tandem init-model`):
 *   - fused equals alone: three adapters with different ranks, targets, learning rates, data
 *     sizes and epochs trained fused (synchronized) end with the same weights, to float rounding,
 *     as each trained alone (one with weight 0.5, so it steps every other global step); the
 *     round-robin and priority-val-loss schedules give exactly alone's bits (an adapter's
 *     trajectory never depends on the schedule or the others);
 *   - with LoRA dropout the same holds (round-robin = alone bit for bit, fused = alone to float
 *     rounding), dropout changes the result, adapter_config.json records it, and p >= 1 is
 *     refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/config.h"
#include "train/peft_io.h"
#include "train/trainer.h"

static char dir[256];

static void write_data(const char *path, int n, int kind)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < n; i++) {
        int a = (i * 7 + 3) % 10, b = (i * 3 + 1) % 10;
        if (kind == 0)
            fprintf(f, "{\"instruction\": \"add %d %d\", \"response\": \"%d\"}\n", a, b, a + b);
        else if (kind == 1)
            fprintf(f, "{\"instruction\": \"twice %d\", \"response\": \"%d%d\"}\n", a, a, a);
        else
            fprintf(f, "{\"instruction\": \"next %d\", \"response\": \"%d\"}\n", a, (a + 1) % 10);
    }
    fclose(f);
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/tandem-trainer-XXXXXX");
    assert_non_null(mkdtemp(dir));
    const char *tandem = getenv("TANDEM");
    assert_non_null(tandem);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' init-model '%s/tiny' --preset tiny >/dev/null", tandem, dir);
    assert_int_equal(system(cmd), 0);
    char p[512];
    snprintf(p, sizeof p, "%s/a.jsonl", dir);
    write_data(p, 12, 0);
    snprintf(p, sizeof p, "%s/b.jsonl", dir);
    write_data(p, 7, 1);
    snprintf(p, sizeof p, "%s/c.jsonl", dir);
    write_data(p, 10, 2);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static char paths[3][2][512];
static char outs[64][512];
static int n_outs;

static tdm_trainer_adapter spec(int k, const char *out_name)
{
    static const int ranks[3] = {4, 2, 8};
    static const uint32_t targets[3] = {0x05 /* q,v */, 0x0F /* q,k,v,o */, 0x70 /* mlp */};
    static const double lrs[3] = {5e-3, 1e-2, 3e-3};
    static const int epochs[3] = {2, 3, 1};
    static const char *files[3] = {"a", "b", "c"};
    snprintf(paths[k][0], sizeof paths[k][0], "%s/%s.jsonl", dir, files[k]);
    snprintf(outs[n_outs], sizeof outs[0], "%s/%s", dir, out_name);
    tdm_trainer_adapter a = {.data = paths[k][0],
                             .output = outs[n_outs++],
                             .rank = ranks[k],
                             .alpha = 16,
                             .targets = targets[k],
                             .lr = lrs[k],
                             .epochs = epochs[k],
                             .batch_size = 3,
                             .max_seq_len = 64,
                             .weight = 1};
    return a;
}

static void train(const tdm_trainer_adapter *ads, int n, tdm_train_schedule sched)
{
    tdm_trainer_opts o;
    tdm_trainer_opts_default(&o);
    char model[512];
    snprintf(model, sizeof model, "%s/tiny", dir);
    o.model_dir = model;
    o.schedule = sched;
    o.val_split = 0;
    o.save_every = 0;
    o.log_every = 1000;
    o.grad_accum = 2;
    o.lr_kind = TDM_LR_COSINE;
    o.warmup_steps = 1;
    o.seed = 3;
    tdm_trainer *t = NULL;
    tdm_error err = {0};
    tdm_status st = tdm_trainer_create(&t, &o, ads, n, NULL, &err);
    if (st != TDM_OK) fail_msg("create: %s", err.message);
    tdm_backend *be = NULL;
    assert_int_equal(tdm_backend_create(&be, "cpu", NULL, &err), TDM_OK);
    st = tdm_trainer_attach(t, be, &err);
    if (st == TDM_OK) st = tdm_trainer_run(t, &err);
    if (st != TDM_OK) fail_msg("train: %s", err.message);
    tdm_trainer_free(t);
    tdm_backend_free(be);
}

static void load(const char *out, tdm_lora_params *l)
{
    tdm_model_config cfg;
    tdm_error err = {0};
    char p[600];
    snprintf(p, sizeof p, "%s/tiny/config.json", dir);
    assert_int_equal(tdm_model_config_load(&cfg, p, &err), TDM_OK);
    tdm_status st = tdm_peft_load(out, &cfg, l, NULL, &err);
    if (st != TDM_OK) fail_msg("load %s: %s", out, err.message);
}

/* max |x - y| / (1e-3 + max |y|) over the parameters */
static double rel_diff(const tdm_lora_params *x, const tdm_lora_params *y)
{
    assert_int_equal(x->n_params, y->n_params);
    double md = 0, mx = 0;
    for (int64_t i = 0; i < x->n_params; i++) {
        double d = fabs((double)x->params[i] - (double)y->params[i]);
        if (d > md) md = d;
        if (fabs(y->params[i]) > mx) mx = fabs(y->params[i]);
    }
    return md / (1e-3 + mx);
}

static void test_fused_equals_alone(void **state)
{
    (void)state;
    tdm_trainer_adapter fused[3] = {spec(0, "f0"), spec(1, "f1"), spec(2, "f2")};
    fused[2].weight = 0.5; /* steps every other global step: pacing only */
    train(fused, 3, TDM_SCHEDULE_SYNCHRONIZED);
    tdm_trainer_adapter pr[3] = {spec(0, "p0"), spec(1, "p1"), spec(2, "p2")};
    train(pr, 3, TDM_SCHEDULE_PRIORITY_VAL_LOSS);
    tdm_trainer_adapter rr[3] = {spec(0, "r0"), spec(1, "r1"), spec(2, "r2")};
    train(rr, 3, TDM_SCHEDULE_ROUND_ROBIN);
    for (int k = 0; k < 3; k++) {
        char name[8];
        snprintf(name, sizeof name, "a%d", k);
        tdm_trainer_adapter alone = spec(k, name);
        train(&alone, 1, TDM_SCHEDULE_SYNCHRONIZED);
        tdm_lora_params f = {0}, a = {0}, r = {0}, p = {0};
        load(fused[k].output, &f);
        load(alone.output, &a);
        load(rr[k].output, &r);
        load(pr[k].output, &p);
        double df = rel_diff(&f, &a), dr = rel_diff(&r, &a), dp = rel_diff(&p, &a);
        print_message("adapter %d: fused vs alone %.3g, round-robin %.3g, priority %.3g\n", k, df,
                      dr, dp);
        assert_true(dp == 0);
        /* Alone and round-robin run the very same shapes: identical bits. Fused, the base GEMMs
         * run over more rows and may round differently; AdamW's g / sqrt(v) turns rounding-level
         * differences of near-zero gradient components into differences of up to lr per step,
         * so "to float rounding" here means well below the learning rate's scale. */
        assert_true(dr == 0);
        assert_true(df < 1e-3);
        /* and training moved the adapter: B started at zero */
        double bmax = 0;
        for (size_t m = 0; m < a.n_modules; m++)
            for (int64_t i = 0; i < a.modules[m].out * a.rank; i++)
                bmax = fmax(bmax, fabs(a.modules[m].B[i]));
        assert_true(bmax > 1e-4);
        tdm_lora_params_free(&f);
        tdm_lora_params_free(&a);
        tdm_lora_params_free(&r);
        tdm_lora_params_free(&p);
    }
}

/* LoRA dropout: each adapter's masks come from its own seed, step and micro-batch only, so with
 * dropout 0.2 everywhere round-robin still equals alone bit for bit and fused equals alone to
 * float rounding (a mask tied to the batch rows or to the global step would break both); the
 * dropout acts (the weights differ from a run without it); adapter_config.json records it. */
static void test_dropout(void **state)
{
    (void)state;
    tdm_trainer_adapter fused[3] = {spec(0, "df0"), spec(1, "df1"), spec(2, "df2")};
    tdm_trainer_adapter rr[3] = {spec(0, "dr0"), spec(1, "dr1"), spec(2, "dr2")};
    for (int k = 0; k < 3; k++)
        fused[k].lora_dropout = rr[k].lora_dropout = 0.2;
    train(fused, 3, TDM_SCHEDULE_SYNCHRONIZED);
    train(rr, 3, TDM_SCHEDULE_ROUND_ROBIN);
    for (int k = 0; k < 3; k++) {
        char name[16];
        snprintf(name, sizeof name, "da%d", k);
        tdm_trainer_adapter alone = spec(k, name);
        alone.lora_dropout = 0.2;
        train(&alone, 1, TDM_SCHEDULE_SYNCHRONIZED);
        snprintf(name, sizeof name, "dn%d", k);
        tdm_trainer_adapter nodrop = spec(k, name);
        train(&nodrop, 1, TDM_SCHEDULE_SYNCHRONIZED);
        tdm_lora_params f = {0}, a = {0}, r = {0}, n = {0};
        load(fused[k].output, &f);
        load(alone.output, &a);
        load(rr[k].output, &r);
        load(nodrop.output, &n);
        double df = rel_diff(&f, &a), dr = rel_diff(&r, &a), dn = rel_diff(&n, &a);
        print_message("dropout 0.2 adapter %d: fused vs alone %.3g, round-robin %.3g; "
                      "without dropout %.3g\n",
                      k, df, dr, dn);
        assert_true(dr == 0);
        assert_true(df < 1e-3);
        assert_true(dn > 1e-2);
        /* the value used is recorded for PEFT */
        char cfgp[600];
        snprintf(cfgp, sizeof cfgp, "%s/adapter_config.json", alone.output);
        FILE *cf = fopen(cfgp, "r");
        assert_non_null(cf);
        char text[8192];
        size_t len = fread(text, 1, sizeof text - 1, cf);
        fclose(cf);
        text[len] = 0;
        int rank;
        double alpha;
        uint32_t tg;
        bool rs;
        tdm_peft_meta meta;
        tdm_error err = {0};
        assert_int_equal(
            tdm_peft_config_parse(text, len, cfgp, &rank, &alpha, &tg, &rs, &meta, &err), TDM_OK);
        assert_true(meta.lora_dropout == 0.2);
        tdm_lora_params_free(&f);
        tdm_lora_params_free(&a);
        tdm_lora_params_free(&r);
        tdm_lora_params_free(&n);
    }
}

static void test_dropout_range(void **state)
{
    (void)state;
    tdm_trainer_adapter a = spec(0, "d0");
    tdm_trainer_opts o;
    tdm_trainer_opts_default(&o);
    char model[512];
    snprintf(model, sizeof model, "%s/tiny", dir);
    o.model_dir = model;
    a.lora_dropout = 1.0;
    tdm_trainer *t = NULL;
    tdm_error err = {0};
    assert_int_equal(tdm_trainer_create(&t, &o, &a, 1, NULL, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.message, "dropout"));
    assert_null(t);
    assert_int_equal(access(a.output, F_OK), -1); /* nothing written */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fused_equals_alone),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_dropout_range),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
