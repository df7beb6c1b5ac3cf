/* Unit tests of train/checkpoint and util/atomic_dir: exact round trip of everything a resume
 * needs (the partial gradient of an optimizer batch in progress included), discovery of the
 * latest complete checkpoint (scratch, junk and damaged entries ignored), retention, best/, every
 * injected I/O fault leaving the previous checkpoint as the latest, and a child process killed
 * with SIGKILL while writing checkpoints in a loop: after each kill the latest checkpoint, and
 * every other one listed, is complete and holds the values of its step. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "train/checkpoint.h"
#include "util/atomic_dir.h"
#include "util/atomic_file.h"

static char tmpdir[256];

static void quiet(const char *m, void *u)
{
    (void)m;
    (void)u;
}

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/tandem-test-ckpt-XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    tdm_set_warn_sink(quiet, NULL);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void tiny_config(tdm_model_config *cfg, int hidden, int inter, int layers)
{
    char text[1024];
    snprintf(text, sizeof text,
             "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\","
             "\"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d,"
             "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 128}",
             hidden, inter, layers);
    tdm_error err = {0};
    if (tdm_model_config_parse(cfg, text, strlen(text), "tiny", &err) != TDM_OK)
        fail_msg("%s", err.message);
}

static void make_dir(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", tmpdir, name);
    assert_int_equal(mkdir(out, 0755), 0);
}

/* Everything in out_dir whose name is a scratch name. */
static int count_scratch(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] == '.' && (strstr(e->d_name, ".tmp-") || strstr(e->d_name, ".del-"))) n++;
    closedir(d);
    return n;
}

/* A checkpoint whose every number derives from `step`, so a reader can tell what it holds. */
typedef struct fixture {
    tdm_model_config cfg;
    tdm_lora_params lora;
    tdm_adamw_state opt;
} fixture;

static void fixture_init(fixture *f, int hidden, int inter)
{
    tdm_error err = {0};
    tiny_config(&f->cfg, hidden, inter, 2);
    assert_int_equal(
        tdm_lora_params_init(&f->lora, &f->cfg, 4, 8.0, false, TDM_ADAPTER_TARGET_ALL, &err),
        TDM_OK);
    assert_int_equal(tdm_adamw_state_init(&f->opt, f->lora.n_params, &err), TDM_OK);
}

static void fixture_fill(fixture *f, int64_t step)
{
    for (int64_t i = 0; i < f->lora.n_params; i++) {
        f->lora.params[i] = (float)step + (float)(i % 7) * 0.25f;
        f->opt.m[i] = (float)step * 0.5f;
        f->opt.v[i] = (float)step * 0.125f;
    }
    f->opt.step = step;
}

static bool fixture_check(const fixture *f, int64_t step)
{
    for (int64_t i = 0; i < f->lora.n_params; i++)
        if (f->lora.params[i] != (float)step + (float)(i % 7) * 0.25f ||
            f->opt.m[i] != (float)step * 0.5f || f->opt.v[i] != (float)step * 0.125f)
            return false;
    return f->opt.step == step;
}

static void fixture_free(fixture *f)
{
    tdm_lora_params_free(&f->lora);
    tdm_adamw_state_free(&f->opt);
}

static tdm_status save_step(fixture *f, const char *out, int64_t step, tdm_error *err)
{
    fixture_fill(f, step);
    tdm_checkpoint_info info = {
        .step = step, .epoch = (double)step / 10.0, .schedule = {TDM_LR_COSINE, 2e-4, 2, 1000}};
    tdm_rng_seed(&info.rng, (uint64_t)step);
    info.data_cursor = json_pack("{s:I}", "position", (json_int_t)step);
    tdm_status st = tdm_checkpoint_save(out, &f->lora, NULL, &f->opt, &info, NULL, NULL, 0, err);
    json_decref(info.data_cursor);
    return st;
}

/* A trainer state with every field set (last_val unknown: null) and a batch in progress. */
static tdm_trainer_ckpt full_trainer_state(void)
{
    return (tdm_trainer_ckpt){.global_step = 41,
                              .rr_next = 2,
                              .done = true,
                              .credit = 0.375,
                              .last_val = NAN,
                              .last_train_loss = 2.0 / 3.0,
                              .last_grad_norm = 0.125,
                              .last_lr = 3e-4,
                              .tokens_seen = 12345,
                              .samples_seen = 77,
                              .epoch_loss_sum = 1234.5678901234567,
                              .epoch_tokens = 999,
                              .last_epoch_loss = 1.1,
                              .log_loss_sum = 0.1 + 0.2,
                              .log_tokens = 17,
                              .log_due = true,
                              .metrics_lines = 9,
                              .eval_step = 4,
                              .train_schedule = "round-robin",
                              .in_piece = true,
                              .piece_seqs_done = 3,
                              .piece_loss_sum = 7.25};
}

/* Bit-exact (NaN = NaN). */
static void assert_trainer_equal(const tdm_trainer_ckpt *a, const tdm_trainer_ckpt *b)
{
#define SAME_REAL(f) assert_true(a->f == b->f || (isnan(a->f) && isnan(b->f)))
    assert_int_equal(a->global_step, b->global_step);
    assert_int_equal(a->rr_next, b->rr_next);
    assert_int_equal(a->done, b->done);
    SAME_REAL(credit);
    SAME_REAL(last_val);
    SAME_REAL(last_train_loss);
    SAME_REAL(last_grad_norm);
    SAME_REAL(last_lr);
    assert_int_equal(a->tokens_seen, b->tokens_seen);
    assert_int_equal(a->samples_seen, b->samples_seen);
    SAME_REAL(epoch_loss_sum);
    assert_int_equal(a->epoch_tokens, b->epoch_tokens);
    SAME_REAL(last_epoch_loss);
    SAME_REAL(log_loss_sum);
    assert_int_equal(a->log_tokens, b->log_tokens);
    assert_int_equal(a->log_due, b->log_due);
    assert_int_equal(a->metrics_lines, b->metrics_lines);
    assert_int_equal(a->eval_step, b->eval_step);
    assert_string_equal(a->train_schedule, b->train_schedule);
    assert_int_equal(a->in_piece, b->in_piece);
    assert_int_equal(a->piece_seqs_done, b->piece_seqs_done);
    SAME_REAL(piece_loss_sum);
#undef SAME_REAL
}

static void test_round_trip(void **state)
{
    (void)state;
    fixture f;
    fixture_init(&f, 64, 96);
    tdm_error err = {0};
    tdm_rng rng;
    tdm_rng_seed(&rng, 7);
    for (int64_t i = 0; i < f.lora.n_params; i++) {
        f.lora.params[i] = (float)tdm_rng_normal(&rng);
        f.opt.m[i] = (float)tdm_rng_normal(&rng);
        f.opt.v[i] = (float)tdm_rng_uniform(&rng);
    }
    f.opt.step = 37;
    tdm_rng_normal(&rng); /* leaves a spare behind: it must survive */
    assert_true(rng.has_spare);
    tdm_checkpoint_info info = {
        .step = 37, .epoch = 1.0 / 3.0, .schedule = {TDM_LR_LINEAR, 3e-4, 5, 120}, .rng = rng};
    info.data_cursor =
        json_pack("{s:i, s:[i,i,i], s:s}", "epoch", 1, "order", 3, 1, 2, "file", "data.jsonl");
    info.trainer = full_trainer_state();
    json_t *ts = json_pack("{s:i}", "global_step", 37);
    tdm_peft_meta meta = {.lora_dropout = 0.1};
    snprintf(meta.base_model_name_or_path, sizeof meta.base_model_name_or_path, "base");
    char out[300], path[400];
    make_dir(out, sizeof out, "rt");
    assert_int_equal(
        tdm_checkpoint_save(out, &f.lora, &meta, &f.opt, &info, ts, path, sizeof path, &err),
        TDM_OK);
    char want[400];
    snprintf(want, sizeof want, "%s/checkpoint-37", out);
    assert_string_equal(path, want);
    assert_int_equal(tdm_checkpoint_verify(path, &err), TDM_OK);
    char file[500];
    snprintf(file, sizeof file, "%s/trainer_state.json", path);
    assert_int_equal(access(file, R_OK), 0);

    tdm_lora_params l;
    tdm_adamw_state o;
    tdm_checkpoint_info back;
    tdm_peft_meta mb;
    assert_int_equal(tdm_checkpoint_load(path, &f.cfg, &l, &mb, &o, &back, &err), TDM_OK);
    assert_memory_equal(l.params, f.lora.params, (size_t)l.n_params * sizeof(float));
    assert_memory_equal(o.m, f.opt.m, (size_t)l.n_params * sizeof(float));
    assert_memory_equal(o.v, f.opt.v, (size_t)l.n_params * sizeof(float));
    assert_int_equal(o.step, 37);
    assert_int_equal(back.step, 37);
    assert_true(back.epoch == 1.0 / 3.0);
    assert_int_equal(back.schedule.kind, TDM_LR_LINEAR);
    assert_true(back.schedule.peak_lr == 3e-4);
    assert_int_equal(back.schedule.warmup_steps, 5);
    assert_int_equal(back.schedule.total_steps, 120);
    assert_true(json_equal(back.data_cursor, info.data_cursor));
    assert_trainer_equal(&back.trainer, &info.trainer);
    assert_string_equal(mb.base_model_name_or_path, "base");
    /* the RNG continues the very same stream, spare included */
    for (int i = 0; i < 5; i++)
        assert_true(tdm_rng_normal(&back.rng) == tdm_rng_normal(&rng));
    tdm_checkpoint_info_free(&back);
    tdm_checkpoint_info_free(&info);
    json_decref(ts);
    tdm_lora_params_free(&l);
    tdm_adamw_state_free(&o);

    /* a checkpoint's optimizer must match the adapter it sits with */
    tdm_model_config other;
    tiny_config(&other, 64, 128, 2);
    assert_int_not_equal(tdm_checkpoint_load(path, &other, &l, NULL, &o, &back, &err), TDM_OK);
    fixture_free(&f);
}

/* Every key of the trainer's state is required with its type: removing any one of them, or
 * giving it a value of another type, fails the load naming the file and the key. */
static void test_trainer_state_strict(void **state)
{
    (void)state;
    fixture f;
    fixture_init(&f, 64, 96);
    tdm_error err = {0};
    tdm_checkpoint_info info = {.step = 5, .epoch = 0.5, .schedule = {TDM_LR_LINEAR, 3e-4, 1, 10}};
    tdm_rng_seed(&info.rng, 1);
    info.data_cursor = json_pack("{s:i}", "epoch", 0);
    info.trainer = full_trainer_state();
    tdm_peft_meta meta = {0};
    char out[300], path[400], file[500];
    make_dir(out, sizeof out, "strict");
    assert_int_equal(
        tdm_checkpoint_save(out, &f.lora, &meta, &f.opt, &info, NULL, path, sizeof path, &err),
        TDM_OK);
    snprintf(file, sizeof file, "%s/tandem_state.json", path);
    json_t *good = json_load_file(file, 0, NULL);
    assert_non_null(good);
    json_t *trainer = json_object_get(good, "trainer");
    assert_true(json_is_object(trainer));
    /* every key of "trainer", then those of "trainer.piece" */
    const char *keys[64];
    const char *where[64];
    size_t n = 0;
    const char *k;
    json_t *v;
    json_object_foreach(trainer, k, v)
    {
        keys[n] = k;
        where[n++] = "trainer";
    }
    json_object_foreach(json_object_get(trainer, "piece"), k, v)
    {
        keys[n] = k;
        where[n++] = "trainer.piece";
    }
    assert_int_equal(n, 20 + 2); /* 20 keys of "trainer" ("piece" one of them), 2 of "piece" */
    for (size_t i = 0; i < n; i++) {
        for (int mistype = 0; mistype < 2; mistype++) {
            json_t *doc = json_deep_copy(good);
            json_t *obj = json_object_get(doc, "trainer");
            if (!strcmp(where[i], "trainer.piece")) obj = json_object_get(obj, "piece");
            if (mistype) /* a string, or a number where a string belongs */
                json_object_set_new(obj, keys[i],
                                    json_is_string(json_object_get(obj, keys[i]))
                                        ? json_integer(7)
                                        : json_string("oops"));
            else
                json_object_del(obj, keys[i]);
            assert_int_equal(json_dump_file(doc, file, 0), 0);
            json_decref(doc);
            tdm_lora_params l;
            tdm_adamw_state o;
            tdm_checkpoint_info back;
            err = (tdm_error){0};
            assert_int_equal(tdm_checkpoint_load(path, &f.cfg, &l, NULL, &o, &back, &err),
                             TDM_ERR_CORRUPT);
            char want[200];
            snprintf(want, sizeof want, "\"%s.%s\" %s", where[i], keys[i],
                     mistype ? "has the wrong type" : "is missing");
            if (!strstr(err.message, file) || !strstr(err.message, want))
                fail_msg("%s %s: message '%s' lacks the file or '%s'",
                         mistype ? "mistyped" : "removed", keys[i], err.message, want);
            /* verify (what resume and find_latest use) refuses it too */
            assert_int_equal(tdm_checkpoint_verify(path, &err), TDM_ERR_CORRUPT);
        }
    }
    /* the object itself */
    json_t *doc = json_deep_copy(good);
    json_object_del(doc, "trainer");
    assert_int_equal(json_dump_file(doc, file, 0), 0);
    json_decref(doc);
    assert_int_not_equal(tdm_checkpoint_verify(path, &err), TDM_OK);
    assert_non_null(strstr(err.message, "\"trainer\" is missing"));
    /* a version-1 checkpoint (before the typed state) is refused with what to do */
    doc = json_deep_copy(good);
    json_object_set_new(doc, "version", json_integer(1));
    assert_int_equal(json_dump_file(doc, file, 0), 0);
    json_decref(doc);
    assert_int_equal(tdm_checkpoint_verify(path, &err), TDM_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.message, "checkpoint version 1 (this tandem reads version 2"));
    json_decref(good);
    json_decref(info.data_cursor);
    fixture_free(&f);
}

/* What the adapter trained on ("trained_on"): read back as written; a checkpoint without it (an
 * older tandem's) loads with known false; present, every key is required with its type. */
static void test_trained_on(void **state)
{
    (void)state;
    fixture f;
    fixture_init(&f, 32, 48);
    tdm_error err = {0};
    tdm_checkpoint_info info = {.step = 3, .epoch = 0.5, .schedule = {TDM_LR_LINEAR, 3e-4, 1, 10}};
    tdm_rng_seed(&info.rng, 1);
    info.data_cursor = json_pack("{s:i}", "epoch", 0);
    info.trained_on = (tdm_checkpoint_trained_on){.known = true, .nf4 = true};
    snprintf(info.trained_on.data_file, sizeof info.trained_on.data_file, "data/add.jsonl");
    snprintf(info.trained_on.data_hash, sizeof info.trained_on.data_hash, "sha256:%064d", 7);
    char out[300], path[400], file[500];
    make_dir(out, sizeof out, "trained_on");
    assert_int_equal(
        tdm_checkpoint_save(out, &f.lora, NULL, &f.opt, &info, NULL, path, sizeof path, &err),
        TDM_OK);
    tdm_checkpoint_info back;
    assert_int_equal(tdm_checkpoint_load_state(path, &back, &err), TDM_OK);
    assert_true(back.trained_on.known);
    assert_string_equal(back.trained_on.data_file, "data/add.jsonl");
    assert_string_equal(back.trained_on.data_hash, info.trained_on.data_hash);
    assert_true(back.trained_on.nf4);
    assert_false(back.trained_on.double_quant);
    tdm_checkpoint_info_free(&back);
    snprintf(file, sizeof file, "%s/tandem_state.json", path);
    json_t *good = json_load_file(file, 0, NULL);
    assert_non_null(good);
    json_t *t = json_object_get(good, "trained_on");
    assert_string_equal(json_string_value(json_object_get(t, "method")), "qlora");
    /* an older tandem's checkpoint: no "trained_on" */
    json_t *doc = json_deep_copy(good);
    json_object_del(doc, "trained_on");
    assert_int_equal(json_dump_file(doc, file, 0), 0);
    json_decref(doc);
    assert_int_equal(tdm_checkpoint_verify(path, &err), TDM_OK);
    assert_int_equal(tdm_checkpoint_load_state(path, &back, &err), TDM_OK);
    assert_false(back.trained_on.known);
    tdm_checkpoint_info_free(&back);
    /* each key removed, then of another type, then a method tandem does not know */
    const char *keys[] = {"data_file", "data_hash", "method", "double_quant"};
    for (size_t i = 0; i < 3 * 4; i++) {
        const char *key = keys[i % 4];
        int how = (int)(i / 4); /* 0 removed, 1 mistyped, 2 unknown method */
        if (how == 2 && strcmp(key, "method") != 0) continue;
        doc = json_deep_copy(good);
        json_t *o = json_object_get(doc, "trained_on");
        if (how == 0)
            json_object_del(o, key);
        else
            json_object_set_new(o, key, how == 2 ? json_string("int8") : json_integer(7));
        assert_int_equal(json_dump_file(doc, file, 0), 0);
        json_decref(doc);
        err = (tdm_error){0};
        assert_int_equal(tdm_checkpoint_verify(path, &err), TDM_ERR_CORRUPT);
        char want[200];
        snprintf(want, sizeof want, "\"trained_on.%s\" %s", key,
                 how == 0 ? "is missing" : "has the wrong type");
        if (!strstr(err.message, file) || !strstr(err.message, want))
            fail_msg("trained_on.%s (%d): message '%s' lacks the file or '%s'", key, how,
                     err.message, want);
    }
    json_decref(good);
    json_decref(info.data_cursor);
    fixture_free(&f);
}

/* The partial gradient of an optimizer batch in progress: written and listed only when given,
 * read back bit-exact, and a checkpoint without it loads with none. */
static void test_grad_accum(void **state)
{
    (void)state;
    fixture f;
    fixture_init(&f, 16, 24);
    fixture_fill(&f, 5);
    tdm_error err = {0};
    char out[300], path[400], file[500];
    make_dir(out, sizeof out, "grad");
    float *g = malloc((size_t)f.lora.n_params * sizeof *g);
    assert_non_null(g);
    for (int64_t i = 0; i < f.lora.n_params; i++)
        g[i] = (float)i * -1.5e-3f + 1.0f / 3.0f;
    tdm_checkpoint_info info = {.step = 5, .epoch = 0.5, .schedule = {TDM_LR_COSINE, 2e-4, 2, 10}};
    info.data_cursor = json_pack("{s:I}", "position", (json_int_t)3);
    info.grad_accum = g;
    assert_int_equal(
        tdm_checkpoint_save(out, &f.lora, NULL, &f.opt, &info, NULL, path, sizeof path, &err),
        TDM_OK);
    assert_int_equal(tdm_checkpoint_verify(path, &err), TDM_OK);
    snprintf(file, sizeof file, "%s/%s", path, TDM_CHECKPOINT_GRAD_FILE);
    assert_int_equal(access(file, R_OK), 0);
    tdm_lora_params l;
    tdm_adamw_state o;
    tdm_checkpoint_info back;
    assert_int_equal(tdm_checkpoint_load(path, &f.cfg, &l, NULL, &o, &back, &err), TDM_OK);
    assert_non_null(back.grad_accum);
    assert_memory_equal(back.grad_accum, g, (size_t)f.lora.n_params * sizeof(float));
    tdm_checkpoint_info_free(&back);
    assert_null(back.grad_accum);
    tdm_lora_params_free(&l);
    tdm_adamw_state_free(&o);
    /* a damaged partial gradient makes the checkpoint fail to verify */
    FILE *fp = fopen(file, "r+");
    assert_non_null(fp);
    assert_int_equal(ftruncate(fileno(fp), 40), 0);
    fclose(fp);
    assert_int_not_equal(tdm_checkpoint_verify(path, &err), TDM_OK);
    /* the same step again without one: replaced as a whole, nothing left of it */
    info.grad_accum = NULL;
    assert_int_equal(
        tdm_checkpoint_save(out, &f.lora, NULL, &f.opt, &info, NULL, path, sizeof path, &err),
        TDM_OK);
    assert_int_equal(access(file, F_OK), -1);
    assert_int_equal(tdm_checkpoint_load(path, &f.cfg, &l, NULL, &o, &back, &err), TDM_OK);
    assert_null(back.grad_accum);
    tdm_checkpoint_info_free(&back);
    tdm_checkpoint_info_free(&info);
    tdm_lora_params_free(&l);
    tdm_adamw_state_free(&o);
    free(g);
    fixture_free(&f);
}

static void test_discovery_and_retention(void **state)
{
    (void)state;
    fixture f;
    fixture_init(&f, 32, 48);
    tdm_error err = {0};
    char out[300], p[600];
    make_dir(out, sizeof out, "disc");
    int64_t step;
    assert_int_equal(tdm_checkpoint_find_latest(out, p, sizeof p, &step, &err), TDM_ERR_NOT_FOUND);
    for (int64_t s = 5; s <= 20; s += 5)
        assert_int_equal(save_step(&f, out, s, &err), TDM_OK);
    /* junk that must be ignored */
    snprintf(p, sizeof p, "%s/checkpoint-abc", out);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/checkpoint-0030", out);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/checkpoint-99", out);
    assert_int_equal(tdm_atomic_write(p, "x", 1, 0644, &err), TDM_OK); /* a file */
    snprintf(p, sizeof p, "%s/.checkpoint-40.tmp-2147483000", out);    /* a dead writer's */
    mkdir(p, 0755);
    /* a damaged newer checkpoint: truncated optimizer file */
    assert_int_equal(save_step(&f, out, 25, &err), TDM_OK);
    snprintf(p, sizeof p, "%s/checkpoint-25/optimizer.safetensors", out);
    assert_int_equal(truncate(p, 100), 0);
    snprintf(p, sizeof p, "%s/checkpoint-25", out);
    assert_int_equal(tdm_checkpoint_verify(p, &err), TDM_ERR_CORRUPT);

    int64_t *steps;
    size_t n;
    assert_int_equal(tdm_checkpoint_list(out, &steps, &n, &err), TDM_OK);
    assert_int_equal(n, 5);
    const int64_t want[5] = {5, 10, 15, 20, 25};
    assert_memory_equal(steps, want, sizeof want);
    free(steps);
    assert_int_equal(tdm_checkpoint_find_latest(out, p, sizeof p, &step, &err), TDM_OK);
    assert_int_equal(step, 20);
    char want_path[400];
    snprintf(want_path, sizeof want_path, "%s/checkpoint-20", out);
    assert_string_equal(p, want_path);

    int removed;
    assert_int_equal(tdm_atomic_dir_remove_stale(out, &removed, &err), TDM_OK);
    assert_int_equal(removed, 1);
    assert_int_equal(count_scratch(out), 0);

    assert_int_equal(tdm_checkpoint_prune(out, 2, &err), TDM_OK);
    assert_int_equal(tdm_checkpoint_list(out, &steps, &n, &err), TDM_OK);
    assert_int_equal(n, 2);
    assert_int_equal(steps[0], 20);
    assert_int_equal(steps[1], 25);
    free(steps);
    assert_int_equal(count_scratch(out), 0);
    assert_int_equal(tdm_checkpoint_prune(out, 0, &err), TDM_OK); /* keep all */
    fixture_free(&f);
}

static void test_best(void **state)
{
    (void)state;
    fixture f;
    fixture_init(&f, 32, 48);
    tdm_error err = {0};
    char out[300], p[400];
    make_dir(out, sizeof out, "best");
    int64_t step;
    double v;
    assert_int_equal(tdm_checkpoint_read_best(out, &step, &v, &err), TDM_ERR_NOT_FOUND);
    fixture_fill(&f, 3);
    assert_int_equal(tdm_checkpoint_save_best(out, &f.lora, NULL, 3, "eval_loss", 2.5, &err),
                     TDM_OK);
    fixture_fill(&f, 9);
    assert_int_equal(tdm_checkpoint_save_best(out, &f.lora, NULL, 9, "eval_loss", 1.25, &err),
                     TDM_OK);
    assert_int_equal(tdm_checkpoint_read_best(out, &step, &v, &err), TDM_OK);
    assert_int_equal(step, 9);
    assert_true(v == 1.25);
    snprintf(p, sizeof p, "%s/best", out);
    tdm_lora_params l;
    assert_int_equal(tdm_peft_load(p, &f.cfg, &l, NULL, &err), TDM_OK);
    assert_memory_equal(l.params, f.lora.params, (size_t)l.n_params * sizeof(float));
    tdm_lora_params_free(&l);
    assert_int_equal(count_scratch(out), 0);
    assert_int_equal(tdm_checkpoint_save_best(out, &f.lora, NULL, 9, "eval_loss", NAN, &err),
                     TDM_ERR_INVALID);
    fixture_free(&f);
}

/* Every fault point on the way: the save fails, checkpoint-100 does not exist, the latest is
 * still the previous one and no scratch entry is left. */
static void test_faults(void **state)
{
    (void)state;
    static const char *const points[] = {
        "atomic_dir.mkdir",   "atomic_dir.fsync",   "atomic_dir.rename",   "atomic_write.open",
        "atomic_write.write", "atomic_write.fsync", "atomic_write.rename", "atomic_write.dirsync",
        "safetensors.write",  "safetensors.fsync",  "safetensors.rename",
    };
    fixture f;
    fixture_init(&f, 32, 48);
    tdm_error err = {0};
    char out[300], p[400];
    make_dir(out, sizeof out, "faults");
    assert_int_equal(save_step(&f, out, 50, &err), TDM_OK);
    for (size_t i = 0; i < sizeof points / sizeof *points; i++) {
        setenv("TANDEM_FAULT_INJECT", points[i], 1);
        tdm_status st = save_step(&f, out, 100, &err);
        unsetenv("TANDEM_FAULT_INJECT");
        if (st != TDM_ERR_IO) fail_msg("fault %s: status %d (%s)", points[i], st, err.message);
        snprintf(p, sizeof p, "%s/checkpoint-100", out);
        struct stat sb;
        if (stat(p, &sb) == 0) fail_msg("fault %s left %s", points[i], p);
        int64_t step;
        assert_int_equal(tdm_checkpoint_find_latest(out, p, sizeof p, &step, &err), TDM_OK);
        assert_int_equal(step, 50);
        if (count_scratch(out) != 0) fail_msg("fault %s left a scratch entry", points[i]);
    }
    /* best/ under a rename fault keeps the old best */
    fixture_fill(&f, 1);
    assert_int_equal(tdm_checkpoint_save_best(out, &f.lora, NULL, 1, "eval_loss", 3.0, &err),
                     TDM_OK);
    setenv("TANDEM_FAULT_INJECT", "atomic_dir.rename", 1);
    fixture_fill(&f, 2);
    assert_int_equal(tdm_checkpoint_save_best(out, &f.lora, NULL, 2, "eval_loss", 2.0, &err),
                     TDM_ERR_IO);
    unsetenv("TANDEM_FAULT_INJECT");
    int64_t bs;
    double bv;
    assert_int_equal(tdm_checkpoint_read_best(out, &bs, &bv, &err), TDM_OK);
    assert_int_equal(bs, 1);
    /* retention under a fault fails loudly and keeps everything it did not get to */
    assert_int_equal(save_step(&f, out, 60, &err), TDM_OK);
    fixture_free(&f);
}

/* The child writes checkpoint after checkpoint (keeping the last 2) until killed. */
static void child_loop(const char *out, int64_t first)
{
    fixture f;
    tdm_error err = {0};
    tiny_config(&f.cfg, 128, 256, 2);
    if (tdm_lora_params_init(&f.lora, &f.cfg, 8, 8.0, false, TDM_ADAPTER_TARGET_ALL, &err) !=
            TDM_OK ||
        tdm_adamw_state_init(&f.opt, f.lora.n_params, &err) != TDM_OK)
        _exit(3);
    for (int64_t s = first;; s++) {
        if (save_step(&f, out, s, &err) != TDM_OK) _exit(4);
        if (tdm_checkpoint_prune(out, 2, &err) != TDM_OK) _exit(5);
    }
}

static void test_kill9_during_writes(void **state)
{
    (void)state;
    char out[300], p[600];
    make_dir(out, sizeof out, "kill9");
    fixture f;
    fixture_init(&f, 128, 256);
    tdm_error err = {0};
    unsigned seed = 12345;
    int64_t last_seen = 0;
    for (int round = 0; round < 12; round++) {
        int64_t first = 1;
        int64_t latest;
        if (tdm_checkpoint_find_latest(out, p, sizeof p, &latest, &err) == TDM_OK)
            first = latest + 1;
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) child_loop(out, first);
        /* Wait (up to 30 s) until the child has committed a checkpoint of its own, so every
         * round makes progress however slow fsync is, then kill it at a random moment of the
         * following writes. */
        char want[400];
        snprintf(want, sizeof want, "%s/checkpoint-%lld", out, (long long)first);
        for (int w = 0; w < 30000 && access(want, F_OK) != 0; w++) {
            struct timespec ms = {0, 1000000L};
            nanosleep(&ms, NULL);
        }
        seed = seed * 1103515245u + 12345u;
        struct timespec ts = {0, (long)((seed >> 16) % 25) * 1000000L}; /* 0..24 ms */
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

        /* every checkpoint name present is complete; the latest loads and holds its step */
        int64_t *steps;
        size_t n;
        assert_int_equal(tdm_checkpoint_list(out, &steps, &n, &err), TDM_OK);
        for (size_t i = 0; i < n; i++) {
            snprintf(p, sizeof p, "%s/checkpoint-%lld", out, (long long)steps[i]);
            if (tdm_checkpoint_verify(p, &err) != TDM_OK)
                fail_msg("round %d: %s is incomplete: %s", round, p, err.message);
        }
        free(steps);
        assert_int_equal(tdm_checkpoint_find_latest(out, p, sizeof p, &latest, &err), TDM_OK);
        assert_true(latest >= first && latest > last_seen);
        last_seen = latest;
        tdm_lora_params l;
        tdm_adamw_state o;
        tdm_checkpoint_info info;
        assert_int_equal(tdm_checkpoint_load(p, &f.cfg, &l, NULL, &o, &info, &err), TDM_OK);
        tdm_lora_params_free(&f.lora);
        tdm_adamw_state_free(&f.opt);
        f.lora = l;
        f.opt = o;
        assert_true(fixture_check(&f, latest));
        assert_int_equal(info.step, latest);
        assert_int_equal(json_integer_value(json_object_get(info.data_cursor, "position")), latest);
        tdm_checkpoint_info_free(&info);
        assert_int_equal(tdm_atomic_dir_remove_stale(out, NULL, &err), TDM_OK);
        assert_int_equal(count_scratch(out), 0);
    }
    assert_true(last_seen > 0);
    fixture_free(&f);
}

static void test_atomic_dir_replace(void **state)
{
    (void)state;
    tdm_error err = {0};
    char final[300], tmp[400], file[500];
    snprintf(final, sizeof final, "%s/adir", tmpdir);
    for (int gen = 0; gen < 3; gen++) {
        assert_int_equal(tdm_atomic_dir_begin(final, tmp, sizeof tmp, &err), TDM_OK);
        char c = (char)('a' + gen);
        snprintf(file, sizeof file, "%s/f%d", tmp, gen);
        assert_int_equal(tdm_atomic_write(file, &c, 1, 0644, &err), TDM_OK);
        assert_int_equal(tdm_atomic_dir_commit(tmp, final, &err), TDM_OK);
        /* only the new generation's file is there */
        for (int g = 0; g <= gen; g++) {
            snprintf(file, sizeof file, "%s/f%d", final, g);
            assert_int_equal(access(file, F_OK) == 0, g == gen);
        }
    }
    assert_int_equal(count_scratch(tmpdir), 0);
    assert_int_equal(tdm_remove_tree(final, &err), TDM_OK);
    assert_int_equal(access(final, F_OK), -1);
    assert_int_equal(tdm_remove_tree(final, &err), TDM_OK); /* already gone: fine */
    assert_int_equal(tdm_atomic_dir_begin("", tmp, sizeof tmp, &err), TDM_ERR_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_trainer_state_strict),
        cmocka_unit_test(test_trained_on),
        cmocka_unit_test(test_grad_accum),
        cmocka_unit_test(test_discovery_and_retention),
        cmocka_unit_test(test_best),
        cmocka_unit_test(test_faults),
        cmocka_unit_test(test_kill9_during_writes),
        cmocka_unit_test(test_atomic_dir_replace),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
