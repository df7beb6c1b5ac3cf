/* test_trainer_join.c — adapters that join a running trainer and leave it (co-training's trainer
 * half, docs/co-training.md), through the trainer API on the tiny random model:
 *   - an adapter added at a step boundary of a running trainer (global step 2) ends equal to
 *     training it alone, within the fused == alone tolerance of test_trainer.c, with the same
 *     checkpoints (its save points count from its join) and the same number of log lines; the
 *     host's own adapter is not disturbed (equal to alone too);
 *   - a join whose data has a bad line fails with FILE:LINE in the report and changes nothing: the
 *     running adapter trains on to the same result;
 *   - an adapter detached mid-run is checkpointed and left alone by the trainer; --resume of it
 *     alone finishes equal to an uninterrupted run;
 *   - added with resume (tdm_trainer_add_adapters_resume) to another running trainer, the same
 *     detached adapter continues from its checkpoint and ends equal to the uninterrupted run, with
 *     its save points; a finished adapter added with resume is added done and not retrained; the
 *     host's own adapter is not disturbed.
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
#include "train/checkpoint.h"
#include "train/memory_plan.h"
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
    snprintf(dir, sizeof dir, "/tmp/tandem-trainer-join-XXXXXX");
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
    snprintf(p, sizeof p, "%s/bad.jsonl", dir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fprintf(f, "{\"instruction\": \"add 1 2\", \"response\": \"3\"}\n{\"instruction\": \n");
    fclose(f);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static char paths[4][512];
static char outs[64][512];
static int n_outs;

/* Adapter k (0, 1, 2: different data, ranks, targets, learning rates, epochs; 3: bad data). */
static tdm_trainer_adapter spec(int k, const char *out_name)
{
    static const int ranks[4] = {4, 2, 8, 4};
    static const uint32_t targets[4] = {0x05 /* q,v */, 0x0F /* q,k,v,o */, 0x70 /* mlp */, 0x05};
    static const double lrs[4] = {5e-3, 1e-2, 3e-3, 5e-3};
    static const int epochs[4] = {2, 3, 2, 1};
    static const char *files[4] = {"a", "b", "c", "bad"};
    snprintf(paths[k], sizeof paths[k], "%s/%s.jsonl", dir, files[k]);
    snprintf(outs[n_outs], sizeof outs[0], "%s/%s", dir, out_name);
    tdm_trainer_adapter a = {.data = paths[k],
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
    a.val_split = 0;
    a.save_every = 2;
    a.log_every = 3;
    a.grad_accum = 2;
    a.lr_kind = TDM_LR_COSINE;
    a.warmup_steps = 1;
    a.seed = 3;
    return a;
}

/* What the step-boundary hook does: at global step join_at, add join[0..n_join) (expecting
 * join_status); at detach_at, detach adapter detach_idx. */
typedef struct plan {
    int64_t join_at;
    const tdm_trainer_adapter *join;
    int n_join;
    tdm_status join_status;
    bool resume;  /* tdm_trainer_add_adapters_resume */
    char *report; /* the failed join's FILE:LINE lines */
    int64_t detach_at;
    int detach_idx;
    int joined_first;
    int boundaries;
    int64_t join2_at; /* a second join (one adapter), with the same resume flag */
    const tdm_trainer_adapter *join2;
    int64_t joined_step[2]; /* the joined adapters' positions right after their joins */
    bool joined_done[2];
    tdm_train_schedule schedule;
    /* two_phase: join through prepare / estimate / commit, recording the plan without and with
     * the joiner and after the commit; the detach is followed by tdm_trainer_shrink, recording
     * the backend's memory and the plan before and after */
    bool two_phase;
    uint64_t est_without, est_with, est_joined, est_left;
    uint64_t used_before_shrink, used_after_shrink;
    /* replan: at join_at, before the join, tdm_trainer_set_memory_plan(gc, split), recording
     * the backend's memory before and after */
    bool replan, replan_gc;
    int replan_split;
    uint64_t used_before_replan, used_after_replan;
    /* back_at: after the detach, what a co-training host does once adapters left
     * (tdm_trainer_shrink, tdm_trainer_leave_replan within a reservation that holds anything,
     * the faster plan applied), recording the answer and the backend's memory around it */
    int64_t back_at;
    tdm_leave_replan back;
    uint64_t used_before_back, used_after_back;
} plan;

static tdm_backend *run_be; /* the backend of the run in progress */

static uint64_t est_total(const tdm_trainer *t, const tdm_trainer_join *j)
{
    tdm_model_mem m;
    tdm_error e = {0};
    if (tdm_trainer_join_estimate(t, j, TDM_BE_BF16, &m, &e) != TDM_OK)
        fail_msg("estimate: %s", e.message);
    return m.weights + m.activations + m.adapters + m.backend_scratch;
}

static uint64_t be_used(void)
{
    tdm_be_mem_info mi;
    tdm_error e = {0};
    if (tdm_be_memory(run_be, &mi, &e) != TDM_OK) fail_msg("memory: %s", e.message);
    return mi.used_bytes;
}

static tdm_status add(tdm_trainer *t, const plan *p, const tdm_trainer_adapter *ads, int n,
                      int *first, char **report, tdm_error *err)
{
    return p->resume ? tdm_trainer_add_adapters_resume(t, ads, n, first, report, err)
                     : tdm_trainer_add_adapters(t, ads, n, first, report, err);
}

static tdm_status at_boundary(tdm_trainer *t, void *user, tdm_error *err)
{
    plan *p = user;
    p->boundaries++;
    int64_t g = tdm_trainer_global_step(t);
    if (p->replan && g == p->join_at) {
        p->used_before_replan = be_used();
        TDM_TRY(tdm_trainer_set_memory_plan(t, p->replan_gc, TDM_RECOMPUTE_LAYER, p->replan_split, err));
        p->used_after_replan = be_used();
        assert_int_equal(tdm_trainer_grad_checkpoint(t), p->replan_gc);
        assert_int_equal(tdm_trainer_split(t), p->replan_split);
    }
    if (p->n_join > 0 && g == p->join_at && p->two_phase) {
        tdm_error e = {0};
        tdm_trainer_join *j = NULL;
        if (tdm_trainer_join_prepare(t, p->join, p->n_join, p->resume, &j, NULL, &e) != TDM_OK)
            fail_msg("prepare: %s", e.message);
        assert_int_equal(tdm_trainer_adapter_count(t), 1); /* prepared, not in the trainer */
        p->est_without = est_total(t, NULL);
        p->est_with = est_total(t, j);
        if (tdm_trainer_join_commit(t, j, &p->joined_first, &e) != TDM_OK)
            fail_msg("commit: %s", e.message);
        p->est_joined = est_total(t, NULL);
    } else if (p->n_join > 0 && g == p->join_at) {
        tdm_error e = {0};
        tdm_status st = add(t, p, p->join, p->n_join, &p->joined_first, &p->report, &e);
        if (st != p->join_status)
            fail_msg("join at %lld: status %d, want %d: %s", (long long)g, st, p->join_status,
                     e.message);
        if (st != TDM_OK) assert_int_equal(tdm_trainer_adapter_count(t), 1); /* nothing changed */
        if (st == TDM_OK)
            tdm_trainer_adapter_position(t, p->joined_first, &p->joined_step[0],
                                         &p->joined_done[0]);
    }
    if (p->join2 && g == p->join2_at) {
        int first = -1;
        TDM_TRY(add(t, p, p->join2, 1, &first, NULL, err));
        tdm_trainer_adapter_position(t, first, &p->joined_step[1], &p->joined_done[1]);
    }
    if (p->detach_at > 0 && g == p->detach_at) {
        tdm_status st = tdm_trainer_detach_adapter(t, p->detach_idx, err);
        if (st != TDM_OK) return st;
        assert_true(tdm_trainer_adapter_detached(t, p->detach_idx));
        if (p->two_phase) {
            p->used_before_shrink = be_used();
            if ((st = tdm_trainer_shrink(t, err)) != TDM_OK) return st;
            p->used_after_shrink = be_used();
            p->est_left = est_total(t, NULL);
        }
    }
    if (p->back_at > 0 && g == p->back_at) {
        TDM_TRY(tdm_trainer_shrink(t, err));
        p->used_before_back = be_used();
        tdm_leave_replan_request rq = {.reservation_mb = 1 << 20, .plan_mb = 1 << 20};
        rq.fit.act = TDM_BE_BF16;
        TDM_TRY(tdm_trainer_leave_replan(t, &rq, &p->back, err));
        if (p->back.faster)
            TDM_TRY(tdm_trainer_set_memory_plan(t, p->back.plan.grad_checkpoint,
                                                p->back.plan.recompute, p->back.plan.split, err));
        p->used_after_back = be_used();
    }
    return TDM_OK;
}

static tdm_status run(const tdm_trainer_adapter *ads, int n, plan *p, bool resume, tdm_error *err)
{
    tdm_trainer_opts o;
    tdm_trainer_opts_default(&o);
    char model[512];
    snprintf(model, sizeof model, "%s/tiny", dir);
    o.model_dir = model;
    o.schedule = p ? p->schedule : TDM_SCHEDULE_SYNCHRONIZED;
    o.resume = resume;
    if (p) {
        o.at_step_boundary = at_boundary;
        o.at_step_boundary_user = p;
    }
    tdm_trainer *t = NULL;
    tdm_status st = tdm_trainer_create(&t, &o, ads, n, NULL, err);
    if (st != TDM_OK) fail_msg("create: %s", err->message);
    tdm_backend *be = NULL;
    assert_int_equal(tdm_backend_create(&be, "cpu", NULL, err), TDM_OK);
    run_be = be;
    st = tdm_trainer_attach(t, be, err);
    if (st == TDM_OK) st = tdm_trainer_run(t, err);
    tdm_trainer_free(t);
    tdm_backend_free(be);
    return st;
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

/* max |x - y| / (1e-3 + max |y|) over the parameters (test_trainer.c's measure) */
static double rel_diff(const char *x_dir, const char *y_dir)
{
    tdm_lora_params x = {0}, y = {0};
    load(x_dir, &x);
    load(y_dir, &y);
    assert_int_equal(x.n_params, y.n_params);
    double md = 0, mx = 0;
    for (int64_t i = 0; i < x.n_params; i++) {
        double d = fabs((double)x.params[i] - (double)y.params[i]);
        if (d > md) md = d;
        if (fabs(y.params[i]) > mx) mx = fabs(y.params[i]);
    }
    tdm_lora_params_free(&x);
    tdm_lora_params_free(&y);
    return md / (1e-3 + mx);
}

/* "checkpoint-2,checkpoint-4," style list of OUT's checkpoints */
static void checkpoints_of(const char *out, char *buf, size_t cap)
{
    int64_t *steps = NULL;
    size_t n = 0;
    tdm_error err = {0};
    buf[0] = 0;
    if (tdm_checkpoint_list(out, &steps, &n, &err) != TDM_OK) return;
    for (size_t i = 0; i < n; i++)
        snprintf(buf + strlen(buf), cap - strlen(buf), "%lld,", (long long)steps[i]);
    free(steps);
}

static int count_lines(const char *out, const char *file)
{
    char p[700];
    snprintf(p, sizeof p, "%s/%s", out, file);
    FILE *f = fopen(p, "r");
    if (!f) return -1;
    int n = 0, c;
    while ((c = fgetc(f)) != EOF)
        n += c == '\n';
    fclose(f);
    return n;
}

static void test_join_equals_alone(void **state)
{
    (void)state;
    tdm_error err = {0};
    tdm_trainer_adapter alone0 = spec(0, "alone0"), alone1 = spec(1, "alone1");
    assert_int_equal(run(&alone0, 1, NULL, false, &err), TDM_OK);
    assert_int_equal(run(&alone1, 1, NULL, false, &err), TDM_OK);

    /* a bad join at step 1 changes nothing; a good one at step 2 trains along */
    tdm_trainer_adapter host = spec(0, "host0");
    tdm_trainer_adapter bad = spec(3, "bad");
    plan pb = {.join_at = 1, .join = &bad, .n_join = 1, .join_status = TDM_ERR_PARSE};
    tdm_trainer_adapter host_b = spec(0, "host_b");
    assert_int_equal(run(&host_b, 1, &pb, false, &err), TDM_OK);
    assert_non_null(pb.report);
    print_message("bad join report: %s", pb.report);
    assert_non_null(strstr(pb.report, "bad.jsonl:2"));
    free(pb.report);
    assert_true(rel_diff(host_b.output, alone0.output) == 0); /* undisturbed: the same bits */

    tdm_trainer_adapter joiner = spec(1, "joined1");
    plan pj = {.join_at = 2, .join = &joiner, .n_join = 1, .join_status = TDM_OK};
    assert_int_equal(run(&host, 1, &pj, false, &err), TDM_OK);
    assert_int_equal(pj.joined_first, 1);
    double dh = rel_diff(host.output, alone0.output), dj = rel_diff(joiner.output, alone1.output);
    print_message("host vs alone %.3g, joined at global step 2 vs alone %.3g\n", dh, dj);
    /* the fused == alone tolerance of test_trainer.c (well below the learning rate's scale) */
    assert_true(dh < 1e-3);
    assert_true(dj < 1e-3);
    /* the joined adapter's records are those of its alone run: its save points and log points
     * count from its join (global step 2), not from the host's start */
    char ca[512], cj[512];
    checkpoints_of(alone1.output, ca, sizeof ca);
    checkpoints_of(joiner.output, cj, sizeof cj);
    print_message("checkpoints alone %s joined %s\n", ca, cj);
    assert_string_equal(ca, cj);
    assert_int_equal(count_lines(joiner.output, "metrics.jsonl"),
                     count_lines(alone1.output, "metrics.jsonl"));
    assert_true(count_lines(joiner.output, "metrics.jsonl") > 0);
}

/* A host re-planned at a step boundary for a join (what co-training's admission does:
 * gradient checkpointing switched on in the loaded model, the split raised to 2, the workspace
 * given back), then the join: the host's adapter and the joined one both end equal to training
 * each alone as asked (checkpointing recomputes the same forward; micro-batches sum the same
 * gradient), with the alone runs' checkpoints. */
static void test_join_replanned(void **state)
{
    (void)state;
    tdm_error err = {0};
    tdm_trainer_adapter alone0 = spec(0, "rp_alone0"), alone1 = spec(1, "rp_alone1");
    assert_int_equal(run(&alone0, 1, NULL, false, &err), TDM_OK);
    assert_int_equal(run(&alone1, 1, NULL, false, &err), TDM_OK);
    tdm_trainer_adapter host = spec(0, "rp_host"), joiner = spec(1, "rp_joined");
    plan p = {.join_at = 2,
              .join = &joiner,
              .n_join = 1,
              .join_status = TDM_OK,
              .replan = true,
              .replan_gc = true,
              .replan_split = 2};
    assert_int_equal(run(&host, 1, &p, false, &err), TDM_OK);
    double dh = rel_diff(host.output, alone0.output), dj = rel_diff(joiner.output, alone1.output);
    print_message("re-planned (checkpointing, split 2) at global step 2: host vs alone %.3g, "
                  "joined vs alone %.3g; backend memory %llu -> %llu bytes\n",
                  dh, dj, (unsigned long long)p.used_before_replan,
                  (unsigned long long)p.used_after_replan);
    assert_true(dh < 1e-3);
    assert_true(dj < 1e-3);
    /* the workspace shrank: one layer's activations instead of all, half the rows */
    assert_true(p.used_after_replan < p.used_before_replan);
    char ca[512], cj[512];
    checkpoints_of(alone1.output, ca, sizeof ca);
    checkpoints_of(joiner.output, cj, sizeof cj);
    assert_string_equal(ca, cj);
}

/* Back again: the host re-planned for a join at global step 1 (checkpointing, split 2); the
 * joined adapter is handed back at step 2 and the host's plan goes back to the plan as asked
 * (tdm_trainer_leave_replan: checkpointing off, split 1; the workspace grows again) for its
 * last two of four steps: the host's adapter, trained as asked, then re-planned, then as asked
 * again, ends equal to training it alone. */
static void test_replan_back_after_leave(void **state)
{
    (void)state;
    tdm_error err = {0};
    tdm_trainer_adapter alone0 = spec(0, "bk_alone0");
    assert_int_equal(run(&alone0, 1, NULL, false, &err), TDM_OK);
    tdm_trainer_adapter host = spec(0, "bk_host"), joiner = spec(1, "bk_joined");
    plan p = {.join_at = 1,
              .join = &joiner,
              .n_join = 1,
              .join_status = TDM_OK,
              .replan = true,
              .replan_gc = true,
              .replan_split = 2,
              .detach_at = 2,
              .detach_idx = 1,
              .back_at = 2};
    assert_int_equal(run(&host, 1, &p, false, &err), TDM_OK);
    double dh = rel_diff(host.output, alone0.output);
    char was[256], now[256];
    tdm_memory_plan_describe(&p.back.current, was, sizeof was);
    tdm_memory_plan_describe(&p.back.plan, now, sizeof now);
    print_message("re-planned at step 1, joiner left at 2, back from %s to %s: host vs alone "
                  "%.3g; backend memory %llu -> %llu bytes\n",
                  was, now, dh, (unsigned long long)p.used_before_back,
                  (unsigned long long)p.used_after_back);
    assert_true(p.back.faster);
    assert_int_equal(p.back.plan.rung, TDM_PLAN_AS_ASKED);
    assert_false(p.back.plan.grad_checkpoint);
    assert_int_equal(p.back.plan.split, 1);
    assert_true(p.back.current.grad_checkpoint);
    assert_int_equal(p.back.current.split, 2);
    /* the workspace of the plan as asked: all layers' activations, whole batches */
    assert_true(p.used_after_back > p.used_before_back);
    assert_true(dh < 1e-3);
}

/* An adapter whose training options all differ from the host's (seed: its LoRA init, data
 * order and dropout masks; grad accumulation; LR schedule and warmup; weight decay, clipping;
 * a validation split; its save, log and eval points) joins at global step 2 and ends equal to
 * training it alone with those options, with the checkpoints and records of its alone run
 * (test_join_equals_alone checks the host's adapter). Under synchronized and
 * priority-val-loss (which evaluates a joined adapter first); integration.cotrain_options runs
 * round-robin too. */
static void test_join_own_options(void **state)
{
    (void)state;
    tdm_error err = {0};
    tdm_trainer_adapter own = spec(1, "own_alone");
    own.seed = 11;
    own.grad_accum = 3;
    own.lr_kind = TDM_LR_LINEAR;
    own.warmup_steps = 2;
    own.weight_decay = 0.01;
    own.max_grad_norm = 0.5;
    own.lora_dropout = 0.1;
    own.val_split = 0.3;
    own.eval_every = 1;
    own.save_every = 1;
    own.log_every = 1;
    own.batch_size = 1;
    assert_int_equal(run(&own, 1, NULL, false, &err), TDM_OK);
    char ca[512];
    checkpoints_of(own.output, ca, sizeof ca);

    static const tdm_train_schedule scheds[2] = {TDM_SCHEDULE_SYNCHRONIZED,
                                                 TDM_SCHEDULE_PRIORITY_VAL_LOSS};
    static const char *names[2] = {"sync", "prio"};
    for (int k = 0; k < 2; k++) {
        char hn[64], jn[64];
        snprintf(hn, sizeof hn, "own_host_%s", names[k]);
        snprintf(jn, sizeof jn, "own_joined_%s", names[k]);
        tdm_trainer_adapter host = spec(0, hn);
        tdm_trainer_adapter joiner = own;
        joiner.output = spec(1, jn).output;
        plan pj = {.join_at = 2,
                   .join = &joiner,
                   .n_join = 1,
                   .join_status = TDM_OK,
                   .schedule = scheds[k]};
        assert_int_equal(run(&host, 1, &pj, false, &err), TDM_OK);
        double dj = rel_diff(joiner.output, own.output);
        print_message("%s: joined with its own seed, grad-accum 3, linear schedule, warmup 2 vs "
                      "alone %.3g\n",
                      names[k], dj);
        assert_true(dj < 1e-3);
        if (scheds[k] != TDM_SCHEDULE_SYNCHRONIZED) continue;
        /* its own save_every 1 and log_every 1, counted from its join (the host saves every 2,
         * logs every 3); priority-val-loss interleaves the host's steps, so the records are
         * checked only here */
        char cj[512];
        checkpoints_of(joiner.output, cj, sizeof cj);
        print_message("checkpoints alone %s joined %s\n", ca, cj);
        assert_string_equal(ca, cj);
        assert_int_equal(count_lines(joiner.output, "metrics.jsonl"),
                         count_lines(own.output, "metrics.jsonl"));
    }
}

static void test_detach_then_resume(void **state)
{
    (void)state;
    tdm_error err = {0};
    tdm_trainer_adapter alone2 = spec(2, "alone2");
    assert_int_equal(run(&alone2, 1, NULL, false, &err), TDM_OK);

    /* adapter 2 joins at global step 1 and is detached at global step 4 (3 of its own steps,
     * an odd one: not a save point) */
    tdm_trainer_adapter host = spec(0, "dhost0");
    tdm_trainer_adapter joiner = spec(2, "detached2");
    plan p = {.join_at = 1,
              .join = &joiner,
              .n_join = 1,
              .join_status = TDM_OK,
              .detach_at = 4,
              .detach_idx = 1,
              .two_phase = true};
    assert_int_equal(run(&host, 1, &p, false, &err), TDM_OK);
    /* the plan with the joiner is the trainer's after the commit, larger than without; after the
     * joiner left, the plan and the backend's memory fall back (its LoRA and the workspace of the
     * larger fused step given back) */
    print_message("plan without %llu with %llu joined %llu left %llu; backend %llu -> %llu bytes\n",
                  (unsigned long long)p.est_without, (unsigned long long)p.est_with,
                  (unsigned long long)p.est_joined, (unsigned long long)p.est_left,
                  (unsigned long long)p.used_before_shrink,
                  (unsigned long long)p.used_after_shrink);
    assert_true(p.est_with > p.est_without);
    assert_true(p.est_joined == p.est_with);
    assert_true(p.est_left <= p.est_without); /* the host adapter may be done by then too */
    assert_true(p.used_after_shrink < p.used_before_shrink);
    char cj[512];
    checkpoints_of(joiner.output, cj, sizeof cj);
    print_message("detached adapter's checkpoints: %s\n", cj);
    assert_non_null(strstr(cj, "3,"));
    /* a copy for test_resume_inside_host */
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cp -a '%s' '%s/moved2'", joiner.output, dir);
    assert_int_equal(system(cmd), 0);
    /* and two for test_resume_starts_over */
    snprintf(cmd, sizeof cmd, "cp -a '%s' '%s/over2'; cp -a '%s' '%s/over2b'", joiner.output, dir,
             joiner.output, dir);
    assert_int_equal(system(cmd), 0);
    char peft[700];
    snprintf(peft, sizeof peft, "%s/adapter_model.safetensors", joiner.output);
    assert_int_not_equal(access(peft, F_OK), 0); /* not finished */

    /* --resume of it alone finishes it equal to the uninterrupted run */
    tdm_trainer_adapter again = joiner;
    assert_int_equal(run(&again, 1, NULL, true, &err), TDM_OK);
    double d = rel_diff(again.output, alone2.output);
    print_message("detached at its step 3, resumed alone vs alone %.3g\n", d);
    assert_true(d < 1e-3);
}

/* The takeover's trainer half: a detached adapter resumes inside another running trainer.
 * Uses test_join_equals_alone's and test_detach_then_resume's outputs (run before it). */
static void test_resume_inside_host(void **state)
{
    (void)state;
    tdm_error err = {0};
    tdm_trainer_adapter alone0 = spec(0, "alone0"), alone1 = spec(1, "alone1"),
                        alone2 = spec(2, "alone2"), moved = spec(2, "moved2");
    char fin[700];
    snprintf(fin, sizeof fin, "%s/adapter_model.safetensors", alone1.output);
    FILE *f = fopen(fin, "rb");
    assert_non_null(f);
    char before[65536];
    size_t n_before = fread(before, 1, sizeof before, f);
    fclose(f);

    /* another host, at its global step 2, takes the adapter detached at its own step 3 with
     * resume (the trainer's global step and its own differ the other way round than for a fresh
     * join); at step 3 a finished adapter joins with resume */
    tdm_trainer_adapter host = spec(0, "rhost0");
    plan p = {.join_at = 2,
              .join = &moved,
              .n_join = 1,
              .join_status = TDM_OK,
              .resume = true,
              .join2_at = 3,
              .join2 = &alone1};
    assert_int_equal(run(&host, 1, &p, false, &err), TDM_OK);
    print_message("resumed at step %lld (done %d); finished one at step %lld (done %d)\n",
                  (long long)p.joined_step[0], p.joined_done[0], (long long)p.joined_step[1],
                  p.joined_done[1]);
    assert_int_equal(p.joined_step[0], 3);
    assert_false(p.joined_done[0]);
    assert_true(p.joined_done[1]);
    double dm = rel_diff(moved.output, alone2.output), dh = rel_diff(host.output, alone0.output);
    print_message("resumed inside a host vs alone %.3g; that host vs alone %.3g\n", dm, dh);
    assert_true(dm < 1e-3);
    assert_true(dh < 1e-3);
    /* the finished one was not trained again: its file is untouched */
    f = fopen(fin, "rb");
    assert_non_null(f);
    char after[65536];
    size_t n_after = fread(after, 1, sizeof after, f);
    fclose(f);
    assert_true(n_before == n_after && memcmp(before, after, n_after) == 0);
    /* its save points are those of the uninterrupted run, plus the detach's checkpoint-3 */
    char ca[512], cm[512];
    checkpoints_of(alone2.output, ca, sizeof ca);
    checkpoints_of(moved.output, cm, sizeof cm);
    print_message("checkpoints alone %s resumed %s\n", ca, cm);
    for (char *tok = strtok(ca, ","); tok; tok = strtok(NULL, ",")) {
        char want[32], have[520];
        snprintf(want, sizeof want, ",%s,", tok);
        snprintf(have, sizeof have, ",%s", cm);
        if (!strstr(have, want)) fail_msg("checkpoint-%s of the alone run is missing", tok);
    }
    assert_int_equal(count_lines(moved.output, "metrics.jsonl"),
                     count_lines(alone2.output, "metrics.jsonl"));
}

/* Resume of adapters one of which had saved no checkpoint yet (a host killed before its first
 * save): it starts over from step 0 while the other resumes, instead of the refusal "no global
 * step that every adapter saved"; both end equal to alone. Through tdm_trainer_run (--resume of
 * the command, or an orphan that hosts) and added with resume to a running trainer (an orphan
 * that joins the new host). Uses test_detach_then_resume's copies (checkpoints 2 and 3). */
static void test_resume_starts_over(void **state)
{
    (void)state;
    tdm_error err = {0};
    tdm_trainer_adapter alone1 = spec(1, "alone1"), alone2 = spec(2, "alone2");
    tdm_trainer_adapter pair[2] = {spec(2, "over2"), spec(1, "over1")};
    assert_int_equal(run(pair, 2, NULL, true, &err), TDM_OK);
    double d2 = rel_diff(pair[0].output, alone2.output), d1 = rel_diff(pair[1].output, alone1.output);
    print_message("--resume: resumed vs alone %.3g, started over vs alone %.3g\n", d2, d1);
    assert_true(d2 < 1e-3 && d1 < 1e-3);
    char c1[512], ca[512];
    checkpoints_of(pair[1].output, c1, sizeof c1);
    checkpoints_of(alone1.output, ca, sizeof ca);
    /* its save points fall on the resumed adapter's global steps (so a later --resume finds a
     * step both saved), not on its own alone run's; its final checkpoint is the same */
    print_message("started over: checkpoints %s (alone %s)\n", c1, ca);
    assert_non_null(strstr(c1, "6,"));
    assert_non_null(strstr(ca, "6,"));

    tdm_trainer_adapter host = spec(0, "ohost0");
    tdm_trainer_adapter join[2] = {spec(2, "over2b"), spec(1, "over1b")};
    plan p = {.join_at = 2, .join = join, .n_join = 2, .join_status = TDM_OK, .resume = true};
    assert_int_equal(run(&host, 1, &p, false, &err), TDM_OK);
    d2 = rel_diff(join[0].output, alone2.output);
    d1 = rel_diff(join[1].output, alone1.output);
    print_message("added with resume: resumed vs alone %.3g, started over vs alone %.3g\n", d2, d1);
    assert_true(d2 < 1e-3 && d1 < 1e-3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_join_equals_alone),
        cmocka_unit_test(test_join_own_options),
        cmocka_unit_test(test_join_replanned),
        cmocka_unit_test(test_replan_back_after_leave),
        cmocka_unit_test(test_detach_then_resume),
        cmocka_unit_test(test_resume_inside_host),
        cmocka_unit_test(test_resume_starts_over),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
