/* test_trainer.c — the trainer's multi-adapter guarantees, through its API on the tiny random
 * model (written by `tandem init-model`):
 *   - fused equals alone: three adapters with different ranks, targets, learning rates, data
 *     sizes and epochs trained fused (synchronized) end with the same weights, to float rounding,
 *     as each trained alone (one with weight 0.5, so it spreads each optimizer batch over two
 *     global steps); the round-robin and priority-val-loss schedules give exactly alone's bits
 *     (an adapter's trajectory never depends on the schedule or the others);
 *   - weights are shares of every fused pass: with weights 1, 0.5 and 0.3 (and 2, 1, 0.6 with
 *     two passes per global step) the sequences each adapter puts in each pass, seen through the
 *     on_pass hook, are 4, 2 and floor(1.2 * passes so far) minus the ones before; the weighted
 *     adapters end where training alone ends, to float rounding;
 *   - resume in the middle of a weighted adapter's optimizer batch (from a save round, and after
 *     an out-of-memory that spoiled its partial gradient) gives the uninterrupted run's bytes;
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

#include <jansson.h>

#include "model/config.h"
#include "train/checkpoint.h"
#include "train/peft_io.h"
#include "train/trainer.h"
#include "util/atomic_file.h"

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
    /* samples of one length (one digit in, one out): rows are proportional to sequences */
    snprintf(p, sizeof p, "%s/n16.jsonl", dir);
    write_data(p, 16, 2);
    snprintf(p, sizeof p, "%s/n12.jsonl", dir);
    write_data(p, 12, 2);
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
    tdm_trainer_adapter_default(&a);
    return a;
}

typedef struct run_cfg {
    tdm_train_schedule sched;
    int grad_accum;
    int64_t save_every, log_every;
    bool resume;
    tdm_trainer_pass_fn on_pass;
    void *on_pass_user;
} run_cfg;

static tdm_status run(const tdm_trainer_adapter *ads, int n, const run_cfg *r, tdm_error *err)
{
    tdm_trainer_opts o;
    tdm_trainer_opts_default(&o);
    char model[512];
    snprintf(model, sizeof model, "%s/tiny", dir);
    o.model_dir = model;
    o.schedule = r->sched;
    o.resume = r->resume;
    o.on_pass = r->on_pass;
    o.on_pass_user = r->on_pass_user;
    tdm_trainer_adapter with[8];
    assert_true(n <= 8);
    for (int a = 0; a < n; a++) { /* the training options of this run, for every adapter */
        with[a] = ads[a];
        with[a].val_split = 0;
        with[a].save_every = r->save_every;
        with[a].log_every = r->log_every > 0 ? r->log_every : 1000;
        with[a].grad_accum = r->grad_accum;
        with[a].lr_kind = TDM_LR_COSINE;
        with[a].warmup_steps = 1;
        with[a].seed = 3;
    }
    tdm_trainer *t = NULL;
    tdm_status st = tdm_trainer_create(&t, &o, with, n, NULL, err);
    if (st != TDM_OK) fail_msg("create: %s", err->message);
    tdm_backend *be = NULL;
    assert_int_equal(tdm_backend_create(&be, "cpu", NULL, err), TDM_OK);
    st = tdm_trainer_attach(t, be, err);
    if (st == TDM_OK) st = tdm_trainer_run(t, err);
    tdm_trainer_free(t);
    tdm_backend_free(be);
    return st;
}

static void train(const tdm_trainer_adapter *ads, int n, tdm_train_schedule sched)
{
    run_cfg r = {.sched = sched, .grad_accum = 2};
    tdm_error err = {0};
    if (run(ads, n, &r, &err) != TDM_OK) fail_msg("train: %s", err.message);
}

/* The PEFT adapter in OUT, and its adapter_config.json's metadata when meta is not NULL. */
static void load_meta(const char *out, tdm_lora_params *l, tdm_peft_meta *meta)
{
    tdm_model_config cfg;
    tdm_error err = {0};
    char p[600];
    snprintf(p, sizeof p, "%s/tiny/config.json", dir);
    assert_int_equal(tdm_model_config_load(&cfg, p, &err), TDM_OK);
    tdm_status st = tdm_peft_load(out, &cfg, l, meta, &err);
    if (st != TDM_OK) fail_msg("load %s: %s", out, err.message);
}

static void load(const char *out, tdm_lora_params *l)
{
    load_meta(out, l, NULL);
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
    fused[2].weight = 0.5; /* half a batch per global step: steps every other one */
    train(fused, 3, TDM_SCHEDULE_SYNCHRONIZED);
    tdm_trainer_adapter pr[3] = {spec(0, "p0"), spec(1, "p1"), spec(2, "p2")};
    train(pr, 3, TDM_SCHEDULE_PRIORITY_VAL_LOSS);
    tdm_trainer_adapter rr[3] = {spec(0, "r0"), spec(1, "r1"), spec(2, "r2")};
    train(rr, 3, TDM_SCHEDULE_ROUND_ROBIN);
    for (int k = 0; k < 3; k++) {
        char name[16];
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

/* ------------------------------------------------------ weights are shares ---- */

#define MAX_PASSES 128

typedef struct pass_log {
    int n;
    int64_t global_step[MAX_PASSES];
    int seqs[MAX_PASSES][3];
    int64_t rows[MAX_PASSES][3];
} pass_log;

static void record_pass(const tdm_trainer_pass *p, void *user)
{
    pass_log *l = user;
    if (l->n >= MAX_PASSES || p->n_adapters != 3) return;
    l->global_step[l->n] = p->global_step;
    for (int a = 0; a < 3; a++) {
        l->seqs[l->n][a] = p->seqs[a];
        l->rows[l->n][a] = p->rows[a];
    }
    l->n++;
}

/* Three adapters on data of one sample length, batch 4: x (16 samples, 3 epochs), y and z (12
 * samples, 1 epoch), weights wx, wy, wz. */
static void weighted(tdm_trainer_adapter ads[3], const char *prefix, double wx, double wy,
                     double wz)
{
    static char data[2][512];
    snprintf(data[0], sizeof data[0], "%s/n16.jsonl", dir);
    snprintf(data[1], sizeof data[1], "%s/n12.jsonl", dir);
    const double w[3] = {wx, wy, wz};
    for (int k = 0; k < 3; k++) {
        char name[32];
        snprintf(name, sizeof name, "%s%c", prefix, "xyz"[k]);
        ads[k] = spec(k, name);
        ads[k].data = data[k == 0 ? 0 : 1];
        ads[k].batch_size = 4;
        ads[k].epochs = k == 0 ? 3 : 1;
        ads[k].weight = w[k];
    }
}

/* max |x - y| / |y| over the training lines of two metrics.jsonl files, which must log the same
 * steps with the same counted tokens (the same samples in every optimizer batch) */
static double loss_diff(const char *out_x, const char *out_y)
{
    char px[600], py[600], lx[4096], ly[4096];
    snprintf(px, sizeof px, "%s/metrics.jsonl", out_x);
    snprintf(py, sizeof py, "%s/metrics.jsonl", out_y);
    FILE *fx = fopen(px, "r"), *fy = fopen(py, "r");
    assert_non_null(fx);
    assert_non_null(fy);
    double md = 0;
    int lines = 0;
    for (;;) {
        bool gx = fgets(lx, sizeof lx, fx) != NULL, gy = fgets(ly, sizeof ly, fy) != NULL;
        assert_int_equal(gx, gy);
        if (!gx) break;
        json_t *jx = json_loads(lx, 0, NULL), *jy = json_loads(ly, 0, NULL);
        assert_non_null(jx);
        assert_non_null(jy);
        assert_int_equal(json_integer_value(json_object_get(jx, "step")),
                         json_integer_value(json_object_get(jy, "step")));
        assert_int_equal(json_integer_value(json_object_get(jx, "tokens")),
                         json_integer_value(json_object_get(jy, "tokens")));
        double x = json_number_value(json_object_get(jx, "loss"));
        double y = json_number_value(json_object_get(jy, "loss"));
        md = fmax(md, fabs(x - y) / fabs(y));
        lines++;
        json_decref(jx);
        json_decref(jy);
    }
    fclose(fx);
    fclose(fy);
    assert_true(lines > 1);
    return md;
}

/* ||x - y|| / ||y|| over the parameters */
static double rel_l2(const tdm_lora_params *x, const tdm_lora_params *y)
{
    assert_int_equal(x->n_params, y->n_params);
    double num = 0, den = 0;
    for (int64_t i = 0; i < x->n_params; i++) {
        double d = (double)x->params[i] - (double)y->params[i];
        num += d * d;
        den += (double)y->params[i] * y->params[i];
    }
    return sqrt(num / den);
}

/* The weighted adapters y, z of a run follow the trajectory of each trained alone, to float
 * rounding: every optimizer step's loss to 1e-6 (relative) with the same counted tokens. The
 * final weights differ a little more: every fused adapter's do, weight 1 included (the base
 * products over more rows round differently, and AdamW's m / sqrt(v) turns rounding-level
 * differences of near-cancelling gradient components into differences of up to lr per step;
 * test_fused_equals_alone), about 3e-6 in L2 and 2e-4 at worst per element here, against
 * 0.1 and 0.4 when a piece's gradient is lost. */
static void check_alone(const tdm_trainer_adapter ads[3], int grad_accum, const char *prefix)
{
    for (int k = 1; k < 3; k++) {
        char name[32];
        snprintf(name, sizeof name, "%salone%d", prefix, k);
        tdm_trainer_adapter alone = ads[k];
        snprintf(outs[n_outs], sizeof outs[0], "%s/%s", dir, name);
        alone.output = outs[n_outs++];
        alone.weight = 1;
        run_cfg r = {.sched = TDM_SCHEDULE_SYNCHRONIZED, .grad_accum = grad_accum, .log_every = 1};
        tdm_error err = {0};
        if (run(&alone, 1, &r, &err) != TDM_OK) fail_msg("alone: %s", err.message);
        tdm_lora_params f = {0}, a = {0};
        load(ads[k].output, &f);
        load(alone.output, &a);
        double dl = loss_diff(ads[k].output, alone.output), d2 = rel_l2(&f, &a),
               dm = rel_diff(&f, &a);
        print_message("weight %g of %g, grad_accum %d: weighted vs alone: losses %.3g, weights "
                      "%.3g (L2), %.3g (max)\n",
                      ads[k].weight, ads[0].weight, grad_accum, dl, d2, dm);
        assert_true(dl < 1e-6);
        assert_true(d2 < 1e-4);
        assert_true(dm < 1e-3);
        tdm_lora_params_free(&f);
        tdm_lora_params_free(&a);
    }
}

/* Every pass holds the same number of rows per sequence (one sample length): the rows of each
 * adapter, hence the tokens of the pass, split exactly as its sequences. */
static void check_rows(const pass_log *l)
{
    int64_t len = l->rows[0][0] / l->seqs[0][0];
    assert_true(len > 2);
    for (int i = 0; i < l->n; i++)
        for (int a = 0; a < 3; a++)
            assert_int_equal(l->rows[i][a], len * l->seqs[i][a]);
}

static void test_weights_share_each_pass(void **state)
{
    (void)state;
    /* one pass per global step: x puts a micro-batch of 4 in every pass, y (0.5) 2 and z (0.3)
     * 1.2 on average: the sequences z has put in after p passes are floor(1.2 p), so every pass
     * holds 1 or 2 of them (its batches of 4 end exactly on such counts: 4, 8, 12) */
    tdm_trainer_adapter ads[3];
    weighted(ads, "s1", 1, 0.5, 0.3);
    pass_log l1 = {0};
    run_cfg r1 = {.sched = TDM_SCHEDULE_SYNCHRONIZED,
                  .grad_accum = 1,
                  .log_every = 1,
                  .on_pass = record_pass,
                  .on_pass_user = &l1};
    tdm_error err = {0};
    if (run(ads, 3, &r1, &err) != TDM_OK) fail_msg("train: %s", err.message);
    assert_int_equal(l1.n, 12); /* x: 3 epochs of 4 batches */
    for (int p = 1; p <= l1.n; p++) {
        const int *sq = l1.seqs[p - 1];
        assert_int_equal(l1.global_step[p - 1], p);
        assert_int_equal(sq[0], 4);
        assert_int_equal(sq[1], p <= 6 ? 2 : 0); /* 12 samples, 2 a pass */
        int want = p <= 10 ? (int)floor(1.2 * p + 1e-9) - (int)floor(1.2 * (p - 1) + 1e-9) : 0;
        print_message("pass %d: x %d y %d z %d (rows %lld %lld %lld)\n", p, sq[0], sq[1], sq[2],
                      (long long)l1.rows[p - 1][0], (long long)l1.rows[p - 1][1],
                      (long long)l1.rows[p - 1][2]);
        assert_int_equal(sq[2], want);
    }
    check_rows(&l1);
    check_alone(ads, 1, "s1");

    /* two passes per global step (grad_accum 2: optimizer batches of 8); weights are relative:
     * 2, 1, 0.6 are shares 1, 0.5, 0.3 again. y's 12 samples: a batch of 8, then the epoch's
     * short batch of 4. z: credit 1.2 a pass; a piece never crosses its batch's end, and the
     * optimizer step waits for the global step's end, so z is idle in the pass after a batch
     * completes: */
    static const int z2[12] = {1, 1, /* g1 */ 1, 1, /* g2 */ 2, 1, /* g3 */ 1, 0, /* g4: 8 done */
                               1, 1, /* g5 */ 2, 0 /* g6: 4 done */};
    weighted(ads, "s2", 2, 1, 0.6);
    pass_log l2 = {0};
    run_cfg r2 = {.sched = TDM_SCHEDULE_SYNCHRONIZED,
                  .grad_accum = 2,
                  .log_every = 1,
                  .on_pass = record_pass,
                  .on_pass_user = &l2};
    if (run(ads, 3, &r2, &err) != TDM_OK) fail_msg("train: %s", err.message);
    assert_int_equal(l2.n, 12); /* x: 3 epochs of 2 steps of 2 micro-batches */
    for (int i = 0; i < l2.n; i++) {
        const int *sq = l2.seqs[i];
        assert_int_equal(l2.global_step[i], i / 2 + 1);
        assert_int_equal(sq[0], 4);
        assert_int_equal(sq[1], i < 6 ? 2 : 0);
        assert_int_equal(sq[2], z2[i]);
    }
    check_rows(&l2);
    check_alone(ads, 2, "s2");
}

/* ------------------------------------------------- resume in the middle of a batch ---- */

static bool same_file(const char *x, const char *y)
{
    char *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    tdm_error err = {0};
    bool same = tdm_read_file(x, &a, &na, &err) == TDM_OK &&
                tdm_read_file(y, &b, &nb, &err) == TDM_OK && na == nb && memcmp(a, b, na) == 0;
    free(a);
    free(b);
    return same;
}

/* "[step, loss]" of every training line of OUT/metrics.jsonl, in order. */
static json_t *logged_losses(const char *out)
{
    char p[600], line[4096];
    snprintf(p, sizeof p, "%s/metrics.jsonl", out);
    FILE *f = fopen(p, "r");
    assert_non_null(f);
    json_t *arr = json_array();
    while (fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        assert_non_null(j);
        if (json_object_get(j, "loss"))
            json_array_append_new(
                arr, json_pack("[O, O]", json_object_get(j, "step"), json_object_get(j, "loss")));
        json_decref(j);
    }
    fclose(f);
    return arr;
}

/* trainer.global_step and whether a piece of a batch is saved, of OUT/checkpoint-STEP */
static int64_t ckpt_global(const char *out, int64_t step, bool *piece)
{
    char p[700];
    snprintf(p, sizeof p, "%s/checkpoint-%lld/tandem_state.json", out, (long long)step);
    json_t *j = json_load_file(p, 0, NULL);
    assert_non_null(j);
    json_t *ex = json_object_get(j, "trainer");
    int64_t g = json_integer_value(json_object_get(ex, "global_step"));
    *piece = json_is_object(json_object_get(ex, "piece"));
    json_decref(j);
    if (*piece) {
        snprintf(p, sizeof p, "%s/checkpoint-%lld/%s", out, (long long)step,
                 TDM_CHECKPOINT_GRAD_FILE);
        assert_int_equal(access(p, R_OK), 0);
    }
    return g;
}

/* What a kill -9 right after the save round of global step g leaves: the checkpoints up to g,
 * no final adapter. Returns how many of them hold a piece of a batch. */
static int cut_after(const char *out, int64_t g)
{
    int64_t *steps = NULL;
    size_t n = 0;
    tdm_error err = {0};
    assert_int_equal(tdm_checkpoint_list(out, &steps, &n, &err), TDM_OK);
    int pieces = 0;
    for (size_t i = 0; i < n; i++) {
        bool piece;
        int64_t cg = ckpt_global(out, steps[i], &piece);
        if (cg <= g) {
            pieces += piece;
            continue;
        }
        char cmd[800];
        snprintf(cmd, sizeof cmd, "rm -rf '%s/checkpoint-%lld'", out, (long long)steps[i]);
        assert_int_equal(system(cmd), 0);
    }
    free(steps);
    char p[600];
    snprintf(p, sizeof p, "%s/adapter_model.safetensors", out);
    unlink(p);
    return pieces;
}

static void check_same_run(const tdm_trainer_adapter *x, const tdm_trainer_adapter *y)
{
    for (int k = 0; k < 3; k++) {
        char a[600], b[600];
        snprintf(a, sizeof a, "%s/adapter_model.safetensors", x[k].output);
        snprintf(b, sizeof b, "%s/adapter_model.safetensors", y[k].output);
        if (!same_file(a, b)) fail_msg("%s differs from %s", b, a);
        json_t *la = logged_losses(x[k].output), *lb = logged_losses(y[k].output);
        assert_true(json_array_size(la) > 0);
        assert_true(json_equal(la, lb));
        json_decref(la);
        json_decref(lb);
    }
}

static void test_resume_mid_batch(void **state)
{
    (void)state;
    tdm_error err = {0};
    /* shares 1, 0.5, 0.3, one pass per global step (test_weights_share_each_pass): after global
     * step 3 y has 2 of its second batch of 4 done and z 3 of its first; killed right after
     * that save round, then resumed */
    run_cfg r = {
        .sched = TDM_SCHEDULE_SYNCHRONIZED, .grad_accum = 1, .save_every = 3, .log_every = 1};
    tdm_trainer_adapter whole[3], cut[3];
    weighted(whole, "rw", 1, 0.5, 0.3);
    if (run(whole, 3, &r, &err) != TDM_OK) fail_msg("train: %s", err.message);
    weighted(cut, "rc", 1, 0.5, 0.3);
    if (run(cut, 3, &r, &err) != TDM_OK) fail_msg("train: %s", err.message);
    assert_int_equal(cut_after(cut[0].output, 3), 0);
    assert_int_equal(cut_after(cut[1].output, 3), 1); /* y and z saved pieces of a batch */
    assert_int_equal(cut_after(cut[2].output, 3), 1);
    r.resume = true;
    if (run(cut, 3, &r, &err) != TDM_OK) fail_msg("resume: %s", err.message);
    check_same_run(whole, cut);

    /* two passes per global step: after global step 2 z has 4 of its batch of 8 done (y has
     * just stepped); an out-of-memory after the first pass of step 3, which added to z's partial
     * gradient and drew y's next batch: the checkpoints hold the state before that step */
    tdm_trainer_adapter whole2[3], oom[3];
    run_cfg r2 = {.sched = TDM_SCHEDULE_SYNCHRONIZED, .grad_accum = 2, .log_every = 1};
    weighted(whole2, "rv", 2, 1, 0.6);
    if (run(whole2, 3, &r2, &err) != TDM_OK) fail_msg("train: %s", err.message);
    weighted(oom, "ro", 2, 1, 0.6);
    setenv("TANDEM_FAULT_INJECT", "trainer.pass_oom", 1);
    tdm_status st = run(oom, 3, &r2, &err);
    unsetenv("TANDEM_FAULT_INJECT");
    assert_int_equal(st, TDM_ERR_NOMEM);
    assert_non_null(strstr(err.message, "global step 3"));
    bool piece;
    assert_int_equal(ckpt_global(oom[1].output, 1, &piece), 2);
    assert_false(piece);
    assert_int_equal(ckpt_global(oom[2].output, 0, &piece), 2);
    assert_true(piece);
    r2.resume = true;
    if (run(oom, 3, &r2, &err) != TDM_OK) fail_msg("resume: %s", err.message);
    check_same_run(whole2, oom);
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
        tdm_peft_meta meta;
        load_meta(alone.output, &a, &meta);
        load(rr[k].output, &r);
        load(nodrop.output, &n);
        double df = rel_diff(&f, &a), dr = rel_diff(&r, &a), dn = rel_diff(&n, &a);
        print_message("dropout 0.2 adapter %d: fused vs alone %.3g, round-robin %.3g; "
                      "without dropout %.3g\n",
                      k, df, dr, dn);
        assert_true(dr == 0);
        assert_true(df < 1e-3);
        assert_true(dn > 1e-2);
        /* the value used is recorded for PEFT (adapter_config.json) */
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
        cmocka_unit_test(test_weights_share_each_pass),
        cmocka_unit_test(test_resume_mid_batch),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
