/* test_micro_batch.c — the memory plan's micro-batches (tdm_trainer_set_memory_plan, issue 15
 * behaviour 8) leave training unchanged: batch_size B with grad_accum G trained as micro-batches
 * of ceil(B / k) in up to G x k passes per step ends where the plain run ends, to float rounding
 * (the fused == alone bound of unit.trainer, 1e-3), with the same loss and counted tokens at
 * every step, the same validation losses (validation runs in micro-batches too), the same steps
 * and checkpoints; and every pass really holds at most the micro-batch. On the tiny random
 * model (CPU), two adapters fused, one of weight 0.5 (it spreads its batches over global steps).
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

#include <jansson.h>

#include "model/config.h"
#include "train/peft_io.h"
#include "train/trainer.h"

static char dir[256], model[512];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/tandem-microbatch-XXXXXX");
    if (!mkdtemp(dir)) return -1;
    snprintf(model, sizeof model, "%s/tiny", dir);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' init-model '%s' --preset tiny >/dev/null", getenv("TANDEM"),
             model);
    if (system(cmd) != 0) return -1;
    /* samples of different lengths: pieces of a batch differ in rows */
    for (int d = 0; d < 2; d++) {
        char p[600];
        snprintf(p, sizeof p, "%s/d%d.jsonl", dir, d);
        FILE *f = fopen(p, "w");
        if (!f) return -1;
        for (int i = 0; i < 14 - 3 * d; i++)
            fprintf(f, "{\"instruction\": \"count to %d\", \"response\": \"%.*s\"}\n", i % 9 + 1,
                    2 * (i % 9 + 1), "1 2 3 4 5 6 7 8 9 ");
        fclose(f);
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

typedef struct pass_seen {
    int max_seqs[2];
    int passes;
    int64_t last_global;
} pass_seen;

static void on_pass(const tdm_trainer_pass *p, void *user)
{
    pass_seen *s = user;
    for (int a = 0; a < p->n_adapters && a < 2; a++)
        if (p->seqs[a] > s->max_seqs[a]) s->max_seqs[a] = p->seqs[a];
    s->passes++;
    s->last_global = p->global_step;
}

static char outs[4][2][600];

/* Trains both adapters at split k into outs[k]. */
static void train_split(int k, pass_seen *seen)
{
    tdm_trainer_opts o;
    tdm_trainer_opts_default(&o);
    o.model_dir = model;
    o.on_pass = on_pass;
    o.on_pass_user = seen;
    tdm_trainer_adapter ads[2] = {0};
    for (int a = 0; a < 2; a++) {
        snprintf(outs[k][a], sizeof outs[k][a], "%s/k%d-%d", dir, k, a);
        static char data[2][600];
        snprintf(data[a], sizeof data[a], "%s/d%d.jsonl", dir, a);
        tdm_trainer_adapter_default(&ads[a]);
        ads[a].data = data[a];
        ads[a].output = outs[k][a];
        ads[a].rank = 4 + 4 * a;
        ads[a].alpha = 16;
        ads[a].targets = a ? 0x70u : 0x05u;
        ads[a].lr = 5e-3;
        ads[a].epochs = 2;
        ads[a].batch_size = 3;
        ads[a].max_seq_len = 64;
        ads[a].weight = a ? 0.5 : 1;
        ads[a].val_split = 0.2;
        ads[a].eval_every = 2;
        ads[a].save_every = 2;
        ads[a].log_every = 1;
        ads[a].grad_accum = 2;
        ads[a].seed = 5;
        ads[a].warmup_steps = 1;
    }
    tdm_trainer *t = NULL;
    tdm_error err = {0};
    if (tdm_trainer_create(&t, &o, ads, 2, NULL, &err) != TDM_OK) fail_msg("%s", err.message);
    if (tdm_trainer_set_memory_plan(t, false, TDM_RECOMPUTE_LAYER, k, &err) != TDM_OK)
        fail_msg("%s", err.message);
    tdm_backend *be = NULL;
    assert_int_equal(tdm_backend_create(&be, "cpu", NULL, &err), TDM_OK);
    tdm_status st = tdm_trainer_attach(t, be, &err);
    if (st == TDM_OK) st = tdm_trainer_run(t, &err);
    if (st != TDM_OK) fail_msg("split %d: %s", k, err.message);
    tdm_trainer_free(t);
    tdm_backend_free(be);
}

/* The largest relative difference of x from y over the adapters' parameters. */
static double weights_diff(const char *x, const char *y)
{
    tdm_model_config cfg;
    tdm_error err = {0};
    char p[600];
    snprintf(p, sizeof p, "%s/config.json", model);
    assert_int_equal(tdm_model_config_load(&cfg, p, &err), TDM_OK);
    tdm_lora_params lx = {0}, ly = {0};
    assert_int_equal(tdm_peft_load(x, &cfg, &lx, NULL, &err), TDM_OK);
    assert_int_equal(tdm_peft_load(y, &cfg, &ly, NULL, &err), TDM_OK);
    assert_int_equal(lx.n_params, ly.n_params);
    double d = 0, m = 0;
    for (int64_t i = 0; i < lx.n_params; i++) {
        d = fmax(d, fabs((double)lx.params[i] - ly.params[i]));
        m = fmax(m, fabs((double)ly.params[i]));
    }
    tdm_lora_params_free(&lx);
    tdm_lora_params_free(&ly);
    assert_true(m > 1e-4); /* training moved it */
    return d / (1e-3 + m);
}

/* metrics.jsonl of x against y, line by line: the same steps and counted tokens, the largest
 * relative difference of the losses and validation losses; *n_val: validation lines. */
static double metrics_diff(const char *x, const char *y, int *n_val)
{
    char px[700], py[700];
    snprintf(px, sizeof px, "%s/metrics.jsonl", x);
    snprintf(py, sizeof py, "%s/metrics.jsonl", y);
    json_error_t je;
    FILE *fx = fopen(px, "r"), *fy = fopen(py, "r");
    assert_non_null(fx);
    assert_non_null(fy);
    double md = 0;
    *n_val = 0;
    for (;;) {
        json_t *jx = json_loadf(fx, JSON_DISABLE_EOF_CHECK, &je);
        json_t *jy = json_loadf(fy, JSON_DISABLE_EOF_CHECK, &je);
        assert_int_equal(jx == NULL, jy == NULL);
        if (!jx) break;
        assert_int_equal(json_integer_value(json_object_get(jx, "step")),
                         json_integer_value(json_object_get(jy, "step")));
        assert_int_equal(json_integer_value(json_object_get(jx, "tokens")),
                         json_integer_value(json_object_get(jy, "tokens")));
        const char *keys[2] = {"loss", "val_loss"};
        for (int k = 0; k < 2; k++) {
            json_t *vx = json_object_get(jx, keys[k]), *vy = json_object_get(jy, keys[k]);
            assert_int_equal(json_is_number(vx), json_is_number(vy));
            if (!json_is_number(vx)) continue;
            md = fmax(md, fabs(json_number_value(vx) - json_number_value(vy)) /
                              fabs(json_number_value(vy)));
            *n_val += k;
        }
        json_decref(jx);
        json_decref(jy);
    }
    fclose(fx);
    fclose(fy);
    return md;
}

static void test_micro_batches_equal_whole(void **state)
{
    (void)state;
    pass_seen seen[4] = {{{0}, 0, 0}};
    for (int k = 1; k <= 3; k++)
        train_split(k, &seen[k]);
    /* the micro-batches were used: batch 3 -> at most 2 (k = 2: pieces cross the micro-batches
     * of 3) and 1 sequence per pass, more passes for the same global steps */
    assert_int_equal(seen[1].max_seqs[0], 3);
    assert_int_equal(seen[2].max_seqs[0], 2);
    assert_int_equal(seen[3].max_seqs[0], 1);
    assert_int_equal(seen[3].max_seqs[1], 1);
    assert_true(seen[2].passes > seen[1].passes && seen[3].passes > seen[2].passes);
    assert_int_equal(seen[2].last_global, seen[1].last_global);
    assert_int_equal(seen[3].last_global, seen[1].last_global);
    for (int k = 2; k <= 3; k++)
        for (int a = 0; a < 2; a++) {
            int n_val;
            double dl = metrics_diff(outs[k][a], outs[1][a], &n_val);
            double dw = weights_diff(outs[k][a], outs[1][a]);
            print_message("adapter %d (weight %s): micro-batch %d x accumulation %d vs batch 3 x "
                          "2: losses %.3g (%d validations), weights %.3g\n",
                          a, a ? "0.5" : "1", (3 + k - 1) / k, 2 * k, dl, n_val, dw);
            assert_true(n_val > 0);
            assert_true(dl < 1e-6);
            assert_true(dw < 1e-3);
            for (int step = 2; step <= 8; step += 2) { /* save_every 2: the same checkpoints */
                char px[700], py[700];
                snprintf(px, sizeof px, "%s/checkpoint-%d", outs[k][a], step);
                snprintf(py, sizeof py, "%s/checkpoint-%d", outs[1][a], step);
                assert_int_equal(access(px, F_OK), access(py, F_OK));
            }
        }
}

static void test_split_range(void **state)
{
    (void)state;
    tdm_trainer_opts o;
    tdm_trainer_opts_default(&o);
    o.model_dir = model;
    char data[600], out[600];
    snprintf(data, sizeof data, "%s/d0.jsonl", dir);
    snprintf(out, sizeof out, "%s/range", dir);
    tdm_trainer_adapter ad = {0};
    tdm_trainer_adapter_default(&ad);
    ad.data = data;
    ad.output = out;
    ad.rank = 4;
    ad.alpha = 8;
    ad.targets = 0x05u;
    ad.lr = 1e-3;
    ad.epochs = 1;
    ad.batch_size = 4;
    ad.max_seq_len = 64;
    ad.weight = 1;
    ad.val_split = 0;
    tdm_trainer *t = NULL;
    tdm_error err = {0};
    assert_int_equal(tdm_trainer_create(&t, &o, &ad, 1, NULL, &err), TDM_OK);
    assert_int_equal(tdm_trainer_set_memory_plan(t, false, TDM_RECOMPUTE_LAYER, 0, &err),
                     TDM_ERR_INVALID);
    assert_int_equal(tdm_trainer_split(t), 1);
    /* the estimate follows the plan: smaller with checkpointing, smaller again with split 4 */
    tdm_model_mem whole, gc, micro;
    assert_int_equal(tdm_trainer_memory_estimate(t, &whole, &err), TDM_OK);
    assert_int_equal(tdm_trainer_set_memory_plan(t, true, TDM_RECOMPUTE_LAYER, 1, &err), TDM_OK);
    assert_int_equal(tdm_trainer_memory_estimate(t, &gc, &err), TDM_OK);
    assert_int_equal(tdm_trainer_set_memory_plan(t, true, TDM_RECOMPUTE_LAYER, 4, &err), TDM_OK);
    assert_int_equal(tdm_trainer_memory_estimate(t, &micro, &err), TDM_OK);
    assert_true(gc.activations < whole.activations);
    assert_true(micro.activations < gc.activations);
    assert_int_equal(tdm_trainer_split(t), 4);
    tdm_trainer_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_micro_batches_equal_whole),
        cmocka_unit_test(test_split_range),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
