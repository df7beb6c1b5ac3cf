/* Co-training groundwork: the wire protocol, the base identity, the socket directory
 * (advertisement, discovery, stale cleanup, modes), the peer check and the host/joiner pair,
 * with real processes (fork) over a real Unix socket. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cotrain/base_identity.h"
#include "cotrain/client.h"
#include "cotrain/endpoint.h"
#include "cotrain/host.h"
#include "cotrain/protocol.h"
#include "cotrain/trainer_bridge.h"
#include "gpu/proc_identity.h"
#include "model/base_identity.h"
#include "train/adapters_config.h"
#include "util/atomic_file.h"
#include "util/timeutil.h"

/* ---------------------------------------------------------------- helpers */

static char *make_tmpdir(void)
{
    char tmpl[] = "/tmp/tdm-cotrain-XXXXXX";
    char *d = mkdtemp(tmpl);
    assert_non_null(d);
    return strdup(d);
}

static void rm_rf(const char *dir)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void write_text(const char *dir, const char *name, const char *text)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    tdm_error err = {0};
    assert_int_equal(tdm_atomic_write(path, text, strlen(text), 0644, &err), TDM_OK);
}

/* A model directory: config.json, tokenizer.json and a safetensors file with two f32 tensors
 * ("a": 8 values, "b": 2x2), data value v0 as the first element of "b". */
static void make_model(const char *dir, const char *config, float v0)
{
    mkdir(dir, 0755);
    write_text(dir, "config.json", config);
    write_text(dir, "tokenizer.json", "{\"model\":{\"type\":\"BPE\"}}");
    const char *hdr = "{\"a\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[0,32]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[32,48]}}";
    size_t n = strlen(hdr);
    uint8_t buf[512];
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memcpy(buf + 8, hdr, n);
    float data[12];
    for (int i = 0; i < 12; i++)
        data[i] = 0.25f * (float)i;
    data[8] = v0;
    memcpy(buf + 8 + n, data, sizeof data);
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    tdm_error err = {0};
    assert_int_equal(tdm_atomic_write(path, buf, 8 + n + sizeof data, 0644, &err), TDM_OK);
}

#define CONFIG "{\"model_type\":\"llama\",\"hidden_size\":4}"

static tdm_base_identity identity_of(const char *model, bool nf4, const char *device)
{
    tdm_base_identity id;
    tdm_error err = {0};
    tdm_status st = tdm_base_identity_compute(model, nf4, true, "f32", device, &id, &err);
    if (st != TDM_OK) fail_msg("%s", err.message);
    return id;
}

/* A join message with every field set (strings point into static storage: do not free). */
static tdm_cotrain_adapter g_adapters[2];
static tdm_cotrain_msg sample_join(const char *identity)
{
    tdm_cotrain_msg m = {.type = TDM_COTRAIN_JOIN};
    tdm_cotrain_join *j = &m.u.join;
    j->pid = (int32_t)getpid();
    j->uid = (uint32_t)geteuid();
    j->user = (char *)"tester";
    j->identity = (char *)identity;
    j->opts.task = (char *)"instruct";
    j->opts.chat_template = TDM_CHAT_CHATML;
    j->opts.weight_decay = 0.01;
    j->opts.max_grad_norm = 1.0;
    j->opts.lr_kind = TDM_LR_LINEAR;
    j->opts.warmup_steps = 3;
    j->opts.grad_accum = 2;
    j->opts.seed = UINT64_MAX; /* beyond int64: travels as a string */
    j->opts.shuffle = true;
    j->opts.val_split = 0.1;
    j->opts.eval_every = 10;
    j->opts.save_every = 20;
    j->opts.log_every = 1;
    j->opts.schedule = TDM_SCHEDULE_ROUND_ROBIN;
    j->opts.no_wait = true;
    g_adapters[0] =
        (tdm_cotrain_adapter){.data = (char *)"/data/a.jsonl",
                              .output = (char *)"/out/a",
                              .label = (char *)"alpha-1",
                              .rank = 8,
                              .alpha = 16,
                              .targets = TDM_ADAPTER_TARGET_Q_PROJ | TDM_ADAPTER_TARGET_V_PROJ,
                              .lora_dropout = 0.05,
                              .lr = 2e-4,
                              .epochs = 3,
                              .batch_size = 4,
                              .max_seq_len = 512,
                              .weight = 1.5};
    g_adapters[1] = (tdm_cotrain_adapter){.data = (char *)"/data/b.jsonl",
                                          .output = (char *)"/out/b",
                                          .init_adapter = (char *)"/adapters/start",
                                          .rank = 4,
                                          .alpha = 0.1 + 0.2, /* not exact in binary */
                                          .use_rslora = true,
                                          .targets = TDM_ADAPTER_TARGET_ALL,
                                          .lr = 1,
                                          .epochs = 1,
                                          .batch_size = 1,
                                          .max_seq_len = 2048,
                                          .weight = 1};
    j->adapters = g_adapters;
    j->n_adapters = 2;
    return m;
}

#define SAMPLE_ID "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

static tdm_status parse_str(const char *s, tdm_cotrain_msg *m, tdm_error *err)
{
    return tdm_cotrain_msg_parse(s, strlen(s), m, err);
}

/* ---------------------------------------------------------------- protocol */

static void test_join_round_trip(void **state)
{
    tdm_cotrain_msg m = sample_join(SAMPLE_ID);
    char *line;
    size_t len;
    tdm_error err = {0};
    assert_int_equal(tdm_cotrain_msg_encode(&m, &line, &len, &err), TDM_OK);
    assert_true(len > 0 && line[len - 1] == '\n' && !memchr(line, '\n', len - 1));
    assert_true(strncmp(line, "{\"v\":1,\"type\":\"join\"", 20) == 0);
    tdm_cotrain_msg p;
    assert_int_equal(tdm_cotrain_msg_parse(line, len - 1, &p, &err), TDM_OK);
    assert_int_equal(p.type, TDM_COTRAIN_JOIN);
    const tdm_cotrain_join *a = &m.u.join, *b = &p.u.join;
    assert_int_equal(a->pid, b->pid);
    assert_int_equal(a->uid, b->uid);
    assert_string_equal(b->user, "tester");
    assert_string_equal(b->identity, SAMPLE_ID);
    assert_true(b->opts.seed == UINT64_MAX);
    char diff[256];
    assert_int_equal(tdm_cotrain_run_opts_diff(&a->opts, &b->opts, diff, sizeof diff), 0);
    assert_true(b->opts.no_wait && !b->opts.resume);
    assert_int_equal(b->n_adapters, 2);
    for (int i = 0; i < 2; i++) {
        const tdm_cotrain_adapter *x = &a->adapters[i], *y = &b->adapters[i];
        assert_string_equal(x->data, y->data);
        assert_string_equal(x->output, y->output);
        assert_true((x->label == NULL) == (y->label == NULL));
        assert_true((x->init_adapter == NULL) == (y->init_adapter == NULL));
        assert_int_equal(x->rank, y->rank);
        assert_true(x->alpha == y->alpha); /* bit-exact through %.17g */
        assert_int_equal(x->use_rslora, y->use_rslora);
        assert_int_equal(x->targets, y->targets);
        assert_true(x->lora_dropout == y->lora_dropout && x->lr == y->lr);
        assert_int_equal(x->epochs, y->epochs);
        assert_int_equal(x->batch_size, y->batch_size);
        assert_int_equal(x->max_seq_len, y->max_seq_len);
        assert_true(x->weight == y->weight);
    }
    /* Encoding the parsed message gives the same bytes. */
    char *again;
    size_t again_len;
    assert_int_equal(tdm_cotrain_msg_encode(&p, &again, &again_len, &err), TDM_OK);
    assert_int_equal(again_len, len);
    assert_memory_equal(again, line, len);
    free(again);
    free(line);
    tdm_cotrain_msg_free(&p);
}

static void test_every_host_message_round_trips(void **state)
{
    tdm_cotrain_msg msgs[7];
    memset(msgs, 0, sizeof msgs);
    msgs[0].type = TDM_COTRAIN_ADMITTED;
    msgs[0].u.admitted.host_pid = 42;
    msgs[0].u.admitted.n_adapters = 3;
    msgs[1].type = TDM_COTRAIN_REJECTED;
    msgs[1].u.rejected.status = TDM_ERR_PARSE;
    msgs[1].u.rejected.message = (char *)"/data/a.jsonl:7: expected \"messages\"";
    msgs[2].type = TDM_COTRAIN_WAITING;
    msgs[2].u.waiting.reason = (char *)"gpu-memory";
    msgs[2].u.waiting.need_mb = 2048;
    msgs[2].u.waiting.message = (char *)"waiting for 2048 MiB on GPU-sim-0";
    msgs[3].type = TDM_COTRAIN_PROGRESS;
    msgs[3].u.progress = (tdm_cotrain_progress_msg){.adapter = 1,
                                                    .event = TDM_TRAINER_EVENT_LOG,
                                                    .global_step = 9,
                                                    .step = 7,
                                                    .total_steps = 30,
                                                    .epoch = 0.7,
                                                    .epochs = 3,
                                                    .loss = 2.25,
                                                    .learning_rate = 1e-4,
                                                    .grad_norm = 0.5,
                                                    .val_loss = NAN,
                                                    .tokens_per_sec = 1234.5,
                                                    .eta_sec = 60};
    msgs[4].type = TDM_COTRAIN_DETACH;
    msgs[5].type = TDM_COTRAIN_DONE;
    msgs[5].u.done.adapter = 0;
    msgs[5].u.done.outcome = TDM_COTRAIN_DETACHED;
    msgs[5].u.done.step = 12;
    msgs[5].u.done.message = (char *)"checkpoint-12 written; --resume finishes it";
    msgs[6].type = TDM_COTRAIN_HEARTBEAT;
    msgs[6].u.heartbeat.global_step = 99;
    for (int i = 0; i < 7; i++) {
        char *line, *again;
        size_t len, again_len;
        tdm_error err = {0};
        assert_int_equal(tdm_cotrain_msg_encode(&msgs[i], &line, &len, &err), TDM_OK);
        tdm_cotrain_msg p;
        assert_int_equal(tdm_cotrain_msg_parse(line, len - 1, &p, &err), TDM_OK);
        assert_int_equal(p.type, msgs[i].type);
        assert_int_equal(tdm_cotrain_msg_encode(&p, &again, &again_len, &err), TDM_OK);
        assert_int_equal(again_len, len);
        assert_memory_equal(line, again, len);
        if (p.type == TDM_COTRAIN_PROGRESS) {
            assert_true(isnan(p.u.progress.val_loss));
            assert_true(p.u.progress.epoch == 0.7);
        }
        if (p.type == TDM_COTRAIN_REJECTED) assert_int_equal(p.u.rejected.status, TDM_ERR_PARSE);
        free(line);
        free(again);
        tdm_cotrain_msg_free(&p);
    }
}

static void expect_refused(const char *text, tdm_status want, const char *needle)
{
    tdm_cotrain_msg m;
    tdm_error err = {0};
    tdm_status st = parse_str(text, &m, &err);
    if (st != want || !strstr(err.message, needle))
        fail_msg("parse of %s: status %d, message \"%s\"; wanted %d with \"%s\"", text, st,
                 err.message, want, needle);
    assert_int_equal(m.type, 0);
    assert_null(m.u.join.adapters);
}

static void test_hostile_messages(void **state)
{
    expect_refused("", TDM_ERR_PARSE, "not JSON");
    expect_refused("{\"v\":1,\"type\":\"heartbeat\"", TDM_ERR_PARSE, "not JSON");
    expect_refused("[1,2]", TDM_ERR_INVALID, "not a JSON object");
    expect_refused("{\"type\":\"detach\"}", TDM_ERR_INVALID, "\"v\" is missing");
    expect_refused("{\"v\":2,\"type\":\"detach\"}", TDM_ERR_UNSUPPORTED, "version 2");
    expect_refused("{\"v\":\"1\",\"type\":\"detach\"}", TDM_ERR_INVALID, "\"v\" must be an int");
    expect_refused("{\"v\":1,\"type\":\"shutdown\"}", TDM_ERR_INVALID, "\"type\"");
    expect_refused("{\"v\":1,\"v\":1,\"type\":\"detach\"}", TDM_ERR_PARSE, "duplicate");
    expect_refused("{\"v\":1,\"type\":\"heartbeat\",\"global_step\":-1}", TDM_ERR_INVALID,
                   "out of range");
    expect_refused("{\"v\":1,\"type\":\"rejected\",\"status\":\"ok\",\"message\":\"x\"}",
                   TDM_ERR_INVALID, "cannot be ok");
    expect_refused("{\"v\":1,\"type\":\"progress\",\"adapter\":64}", TDM_ERR_INVALID,
                   "\"adapter\" is out of range");

    /* A valid join, then one field at a time made hostile. */
    tdm_cotrain_msg m = sample_join(SAMPLE_ID);
    char *line;
    size_t len;
    tdm_error err = {0};
    assert_int_equal(tdm_cotrain_msg_encode(&m, &line, &len, &err), TDM_OK);
    line[len - 1] = '\0';
    static const struct {
        const char *from, *to, *needle;
    } edits[] = {
        {"\"/data/a.jsonl\"", "\"data/a.jsonl\"", "\"data\" must be an absolute path"},
        {"\"/out/b\"", "\"/out/a\"", "same directory for two adapters"},
        {"\"rank\":8", "\"rank\":0", "\"rank\" is out of range"},
        {"\"rank\":8", "\"rank\":8.5", "\"rank\" must be an integer"},
        {"\"alpha-1\"", "\"al pha\"", "\"label\""},
        {"\"q_proj\"", "\"x_proj\"", "\"targets\""},
        {"\"q_proj\",\"v_proj\"", "\"v_proj\",\"v_proj\"", "\"targets\""},
        {"\"lora_dropout\":0.050000000000000003", "\"lora_dropout\":1", "\"lora_dropout\""},
        {"\"weight\":1.5", "\"weight\":-1.5", "\"weight\""},
        {"\"seed\":\"18446744073709551615\"", "\"seed\":\"18446744073709551616\"", "\"seed\""},
        {"\"seed\":\"18446744073709551615\"", "\"seed\":18", "\"seed\""},
        {"\"schedule\":\"round-robin\"", "\"schedule\":\"fifo\"", "\"schedule\""},
        {"\"grad_accum\":2", "\"grad_accum\":0", "\"grad_accum\""},
        {"\"save_total_limit\":0", "\"save_total_limit\":-1", "\"save_total_limit\""},
        /* an adapter's own training options are checked as the join's */
        {"\"opts\":null", "\"opts\":[1]", "\"opts\" must be an object"},
        {"\"opts\":null", "\"opts\":{\"task\":\"instruct\"}", "\"chat_template_given\""},
        {SAMPLE_ID, "sha256:0123", "\"identity\""},
        {"\"user\":\"tester\"", "\"user\":\"\"", "\"user\" is empty"},
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        char *at = strstr(line, edits[i].from);
        if (!at) fail_msg("edit %zu: %s not in %s", i, edits[i].from, line);
        char buf[8192];
        snprintf(buf, sizeof buf, "%.*s%s%s", (int)(at - line), line, edits[i].to,
                 at + strlen(edits[i].from));
        expect_refused(buf, TDM_ERR_INVALID, edits[i].needle);
    }
    free(line);

    /* Over the size limit, whatever it holds. */
    size_t big = TDM_COTRAIN_MSG_MAX + 1;
    char *huge = malloc(big);
    assert_non_null(huge);
    memset(huge, ' ', big);
    tdm_cotrain_msg p;
    assert_int_equal(tdm_cotrain_msg_parse(huge, big, &p, &err), TDM_ERR_INVALID);
    free(huge);
}

static void test_run_opts_diff(void **state)
{
    tdm_cotrain_msg a = sample_join(SAMPLE_ID);
    tdm_cotrain_run_opts x = a.u.join.opts, y = x;
    char buf[256];
    assert_int_equal(tdm_cotrain_run_opts_diff(&x, &y, buf, sizeof buf), 0);
    assert_string_equal(buf, "");
    y.seed = 7;
    y.grad_accum = 1;
    y.resume = true; /* the joiner's own: not a difference */
    assert_int_equal(tdm_cotrain_run_opts_diff(&x, &y, buf, sizeof buf), 2);
    assert_string_equal(buf, "grad-accum, seed");
}

/* ---------------------------------------------------------------- trainer bridge */

static void test_trainer_bridge(void **state)
{
    char *tmp = make_tmpdir();
    char old[1024];
    assert_non_null(getcwd(old, sizeof old));
    assert_int_equal(chdir(tmp), 0);
    char buf[4096], want[2048];
    tdm_error err = {0};
    assert_int_equal(tdm_cotrain_absolute_path("a/./b/../c", buf, sizeof buf, &err), TDM_OK);
    snprintf(want, sizeof want, "%s/a/c", tmp);
    assert_string_equal(buf, want);
    assert_int_equal(tdm_cotrain_absolute_path("/x//y/", buf, sizeof buf, &err), TDM_OK);
    assert_string_equal(buf, "/x/y");
    assert_int_equal(tdm_cotrain_absolute_path("/../..", buf, sizeof buf, &err), TDM_OK);
    assert_string_equal(buf, "/");
    assert_int_equal(tdm_cotrain_absolute_path("", buf, sizeof buf, &err), TDM_ERR_INVALID);

    tdm_trainer_opts o;
    tdm_trainer_opts_default(&o);
    tdm_trainer_adapter ads[2] = {
        {.data = "data/a.jsonl",
         .output = "out/a",
         .label = "a",
         .rank = 8,
         .alpha = 16,
         .targets = TDM_ADAPTER_TARGET_ALL,
         .lr = 1e-4,
         .epochs = 2,
         .batch_size = 4,
         .max_seq_len = 128,
         .weight = 2},
        {.data = "/abs/b.jsonl",
         .output = "../out/b",
         .init_adapter = "init",
         .rank = 4,
         .alpha = 4,
         .use_rslora = true,
         .targets = TDM_ADAPTER_TARGET_Q_PROJ,
         .lora_dropout = 0.1,
         .lr = 3e-4,
         .epochs = 1,
         .batch_size = 2,
         .max_seq_len = 64,
         .weight = 1},
    };
    for (int i = 0; i < 2; i++) {
        tdm_trainer_adapter_default(&ads[i]);
        ads[i].seed = 7;
        ads[i].grad_accum = 3;
        ads[i].lr_kind = TDM_LR_LINEAR;
    }
    tdm_cotrain_msg j;
    /* adapters with the same training options share the join's; one that differs (an
     * adapters.toml row of its own) carries its own, and keeps them through the wire */
    assert_int_equal(tdm_cotrain_join_from_trainer(&o, ads, 2, SAMPLE_ID, &j, &err), TDM_OK);
    assert_null(j.u.join.adapters[0].opts);
    assert_null(j.u.join.adapters[1].opts);
    tdm_cotrain_msg_free(&j);
    tdm_trainer_adapter own = ads[1];
    ads[1].seed = UINT64_MAX - 1;
    ads[1].grad_accum = 5;
    ads[1].lr_kind = TDM_LR_CONSTANT;
    ads[1].warmup_steps = 4;
    ads[1].weight_decay = 0.125;
    ads[1].max_grad_norm = 0.25;
    ads[1].val_split = 0.2;
    ads[1].eval_every = 3;
    ads[1].save_every = 6;
    ads[1].save_total_limit = 2;
    ads[1].log_every = 7;
    ads[1].shuffle = false;
    assert_int_equal(tdm_cotrain_join_from_trainer(&o, ads, 2, SAMPLE_ID, &j, &err), TDM_OK);
    assert_null(j.u.join.adapters[0].opts);
    assert_non_null(j.u.join.adapters[1].opts);
    {
        char *l1;
        size_t n1;
        tdm_cotrain_msg q;
        assert_int_equal(tdm_cotrain_msg_encode(&j, &l1, &n1, &err), TDM_OK);
        assert_int_equal(tdm_cotrain_msg_parse(l1, n1 - 1, &q, &err), TDM_OK);
        free(l1);
        tdm_trainer_adapter b2[2];
        tdm_cotrain_adapters_to_trainer(&q.u.join, b2);
        assert_true(b2[0].seed == 7 && b2[0].grad_accum == 3 && b2[0].lr_kind == TDM_LR_LINEAR);
        assert_true(b2[0].save_total_limit == 0 && b2[0].shuffle);
        assert_true(b2[1].seed == UINT64_MAX - 1 && b2[1].grad_accum == 5);
        assert_true(b2[1].lr_kind == TDM_LR_CONSTANT && b2[1].warmup_steps == 4);
        assert_true(b2[1].weight_decay == 0.125 && b2[1].max_grad_norm == 0.25);
        assert_true(b2[1].val_split == 0.2 && b2[1].eval_every == 3 && b2[1].save_every == 6);
        assert_true(b2[1].save_total_limit == 2 && b2[1].log_every == 7 && !b2[1].shuffle);
        assert_string_equal(b2[1].task, "instruct");
        assert_int_equal(b2[1].rank, ads[1].rank);
        tdm_cotrain_msg_free(&q);
    }
    tdm_cotrain_msg_free(&j);
    ads[1] = own;
    assert_int_equal(tdm_cotrain_join_from_trainer(&o, ads, 2, SAMPLE_ID, &j, &err), TDM_OK);
    /* Through the wire and back. */
    char *line;
    size_t len;
    assert_int_equal(tdm_cotrain_msg_encode(&j, &line, &len, &err), TDM_OK);
    tdm_cotrain_msg p;
    assert_int_equal(tdm_cotrain_msg_parse(line, len - 1, &p, &err), TDM_OK);
    free(line);
    assert_int_equal(p.u.join.pid, getpid());
    tdm_trainer_adapter back[2];
    tdm_cotrain_adapters_to_trainer(&p.u.join, back);
    snprintf(want, sizeof want, "%s/data/a.jsonl", tmp);
    assert_string_equal(back[0].data, want);
    snprintf(want, sizeof want, "%s/out/a", tmp);
    assert_string_equal(back[0].output, want);
    assert_string_equal(back[1].data, "/abs/b.jsonl");
    assert_string_equal(back[1].output, "/tmp/out/b"); /* tmp is /tmp/tdm-cotrain-XXXXXX */
    snprintf(want, sizeof want, "%s/init", tmp);
    assert_string_equal(back[1].init_adapter, want);
    assert_null(back[0].init_adapter);
    assert_null(back[1].label);
    for (int i = 0; i < 2; i++) { /* field by field: the structs have padding */
        assert_int_equal(back[i].rank, ads[i].rank);
        assert_true(back[i].alpha == ads[i].alpha);
        assert_int_equal(back[i].use_rslora, ads[i].use_rslora);
        assert_int_equal(back[i].targets, ads[i].targets);
        assert_true(back[i].lora_dropout == ads[i].lora_dropout && back[i].lr == ads[i].lr);
        assert_int_equal(back[i].epochs, ads[i].epochs);
        assert_int_equal(back[i].batch_size, ads[i].batch_size);
        assert_int_equal(back[i].max_seq_len, ads[i].max_seq_len);
        assert_true(back[i].weight == ads[i].weight);
        /* the training options arrive with every adapter */
        assert_true(back[i].seed == 7 && back[i].grad_accum == 3);
        assert_int_equal(back[i].lr_kind, TDM_LR_LINEAR);
        assert_true(back[i].val_split == ads[i].val_split && back[i].shuffle == ads[i].shuffle);
        assert_true(back[i].log_every == ads[i].log_every &&
                    back[i].save_every == ads[i].save_every);
        assert_string_equal(back[i].task, "instruct");
    }
    tdm_cotrain_run_opts mine;
    assert_int_equal(tdm_cotrain_run_opts_from_trainer(&o, &ads[0], &mine, &err), TDM_OK);
    char diff[256];
    assert_int_equal(tdm_cotrain_run_opts_diff(&mine, &p.u.join.opts, diff, sizeof diff), 0);
    tdm_cotrain_run_opts_free(&mine);
    /* a host with another seed still admits the join (each adapter keeps its own); another
     * schedule is the one run-wide difference */
    tdm_trainer_adapter host_ad = ads[0];
    host_ad.seed = 8;
    assert_int_equal(tdm_cotrain_run_opts_from_trainer(&o, &host_ad, &mine, &err), TDM_OK);
    assert_int_equal(tdm_cotrain_run_opts_diff(&mine, &p.u.join.opts, diff, sizeof diff), 1);
    assert_string_equal(diff, "seed");
    assert_int_equal(tdm_cotrain_run_wide_diff(&mine, &p.u.join.opts, diff, sizeof diff), 0);
    tdm_cotrain_run_opts_free(&mine);
    o.schedule = TDM_SCHEDULE_ROUND_ROBIN;
    assert_int_equal(tdm_cotrain_run_opts_from_trainer(&o, &host_ad, &mine, &err), TDM_OK);
    assert_int_equal(tdm_cotrain_run_wide_diff(&mine, &p.u.join.opts, diff, sizeof diff), 1);
    assert_string_equal(diff, "schedule");
    tdm_cotrain_run_opts_free(&mine);

    /* Progress both ways. */
    tdm_trainer_progress tp = {.event = TDM_TRAINER_EVENT_EVAL,
                               .adapter = 5,
                               .label = "x",
                               .global_step = 40,
                               .step = 20,
                               .total_steps = 30,
                               .epoch = 1.25,
                               .epochs = 2,
                               .loss = 1.5,
                               .learning_rate = 1e-4,
                               .grad_norm = 0.3,
                               .val_loss = 1.75,
                               .tokens_per_sec = 99,
                               .eta_sec = 12};
    tdm_cotrain_msg pm;
    tdm_cotrain_progress_from_trainer(&tp, 1, &pm);
    assert_int_equal(tdm_cotrain_msg_encode(&pm, &line, &len, &err), TDM_OK);
    tdm_cotrain_msg pp;
    assert_int_equal(tdm_cotrain_msg_parse(line, len - 1, &pp, &err), TDM_OK);
    free(line);
    tdm_trainer_progress tq;
    tdm_cotrain_progress_to_trainer(&pp.u.progress, "x", &tq);
    assert_int_equal(tq.adapter, 1); /* the joiner's own numbering */
    assert_int_equal(tq.event, tp.event);
    assert_string_equal(tq.label, "x");
    assert_true(tq.global_step == tp.global_step && tq.step == tp.step &&
                tq.total_steps == tp.total_steps && tq.epochs == tp.epochs);
    assert_true(tq.epoch == tp.epoch && tq.loss == tp.loss &&
                tq.learning_rate == tp.learning_rate && tq.grad_norm == tp.grad_norm &&
                tq.val_loss == tp.val_loss && tq.tokens_per_sec == tp.tokens_per_sec &&
                tq.eta_sec == tp.eta_sec);

    tdm_cotrain_msg_free(&p);
    tdm_cotrain_msg_free(&j);
    assert_int_equal(chdir(old), 0);
    rm_rf(tmp);
    free(tmp);
}

/* ---------------------------------------------------------------- base identity */

static void test_base_identity(void **state)
{
    char *tmp = make_tmpdir();
    char m1[512], m2[512], m3[512], m4[512];
    snprintf(m1, sizeof m1, "%s/model", tmp);
    snprintf(m2, sizeof m2, "%s/copy-elsewhere", tmp);
    snprintf(m3, sizeof m3, "%s/other-config", tmp);
    snprintf(m4, sizeof m4, "%s/merged", tmp);
    make_model(m1, CONFIG, 1.0f);
    make_model(m2, CONFIG, 1.0f); /* same content, another path */
    make_model(m3, "{\"model_type\":\"llama\",\"hidden_size\":8}", 1.0f);
    make_model(m4, CONFIG, 1.5f); /* same header and size, one weight differs */

    tdm_base_identity a = identity_of(m1, true, "GPU-sim-0");
    assert_true(strncmp(a.id, "sha256:", 7) == 0 && strlen(a.id) == 71);
    assert_string_equal(a.method, "qlora");
    assert_true(a.double_quant);
    tdm_base_identity b = identity_of(m2, true, "GPU-sim-0");
    assert_string_equal(a.id, b.id);
    assert_string_equal(tdm_base_identity_mismatch(&a, &b), "");

    tdm_base_identity c = identity_of(m3, true, "GPU-sim-0");
    assert_string_not_equal(a.id, c.id);
    assert_string_equal(tdm_base_identity_mismatch(&a, &c), "model");
    tdm_base_identity d = identity_of(m4, true, "GPU-sim-0");
    assert_string_not_equal(a.model, d.model);
    tdm_base_identity e = identity_of(m1, false, "GPU-sim-0");
    assert_string_equal(a.model, e.model);
    assert_string_equal(tdm_base_identity_mismatch(&a, &e), "method");
    assert_false(e.double_quant); /* lora ignores double quantization */
    tdm_base_identity f = identity_of(m1, true, "cpu");
    assert_string_equal(tdm_base_identity_mismatch(&a, &f), "device");
    tdm_base_identity g;
    tdm_error err = {0};
    assert_int_equal(tdm_base_identity_compute(m1, true, false, "f32", "GPU-sim-0", &g, &err),
                     TDM_OK);
    assert_string_equal(tdm_base_identity_mismatch(&a, &g), "double quantization");
    assert_int_equal(tdm_base_identity_compute(m1, true, true, "bf16", "GPU-sim-0", &g, &err),
                     TDM_OK);
    assert_string_equal(tdm_base_identity_mismatch(&a, &g), "compute dtype");
    /* seal recomputes the same id from the parts (what a sidecar reader does). */
    tdm_base_identity s = a;
    memset(s.id, 0, sizeof s.id);
    tdm_base_identity_seal(&s);
    assert_string_equal(s.id, a.id);

    /* A tokenizer change matters: the host tokenizes the joiner's data. */
    write_text(m2, "tokenizer.json", "{\"model\":{\"type\":\"Unigram\"}}");
    tdm_base_identity t = identity_of(m2, true, "GPU-sim-0");
    assert_string_not_equal(a.model, t.model);

    /* Errors name the file. */
    char missing[600];
    snprintf(missing, sizeof missing, "%s/none", tmp);
    mkdir(missing, 0755);
    assert_int_equal(tdm_base_identity_compute(missing, true, true, "f32", "cpu", &g, &err),
                     TDM_ERR_NOT_FOUND);
    assert_non_null(strstr(err.message, "config.json"));
    write_text(missing, "config.json", CONFIG);
    assert_int_equal(tdm_base_identity_compute(missing, true, true, "f32", "cpu", &g, &err),
                     TDM_ERR_NOT_FOUND);
    assert_non_null(strstr(err.message, ".safetensors"));
    /* A header whose length leaves the file is corrupt, not read past the end. */
    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors", missing);
    const char *hdr = "{\"a\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[0,32]}}";
    char buf[256];
    size_t n = strlen(hdr);
    for (int i = 0; i < 8; i++)
        buf[i] = (char)((uint64_t)(n + 4096) >> (8 * i));
    memcpy(buf + 8, hdr, n);
    assert_int_equal(tdm_atomic_write(path, buf, 8 + n + 32, 0644, &err), TDM_OK);
    assert_int_equal(tdm_base_identity_compute(missing, true, true, "f32", "cpu", &g, &err),
                     TDM_ERR_CORRUPT);
    assert_non_null(strstr(err.message, "model.safetensors"));
    /* The weights part is the identity metadata.json records (one definition of "the model"):
     * two directories whose weights identity differs never share a pass. */
    char w1[TDM_BASE_IDENTITY_LEN], w4[TDM_BASE_IDENTITY_LEN];
    assert_int_equal(tdm_base_model_identity(m1, w1, &err), TDM_OK);
    assert_int_equal(tdm_base_model_identity(m4, w4, &err), TDM_OK);
    assert_string_not_equal(w1, w4);
    rm_rf(tmp);
    free(tmp);
}

/* ---------------------------------------------------------------- processes */

/* A host in a child process: admits every join, sends one progress and one done per adapter
 * unless hold (then it keeps the joiner attached), reports each refusal on report_fd as a line.
 * It runs until killed. ready_fd gets one byte once it listens. */
static pid_t spawn_host(const char *dir, const tdm_base_identity *base, bool hold, int *report_rd)
{
    int ready[2], report[2];
    assert_int_equal(pipe(ready), 0);
    assert_int_equal(pipe(report), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* A failed assertion in the parent must not leave this host running. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(ready[0]);
        close(report[0]);
        tdm_cotrain_host *h;
        tdm_error err = {0};
        if (tdm_cotrain_host_start(&h, dir, base, "/models/test", &err) != TDM_OK) {
            fprintf(stderr, "host: %s\n", err.message);
            _exit(3);
        }
        if (write(ready[1], "r", 1) != 1) _exit(4);
        for (int64_t step = 1;; step++) {
            tdm_cotrain_request rq;
            while (tdm_cotrain_host_take(h, &rq)) {
                if (rq.kind == TDM_COTRAIN_REQ_REFUSED) {
                    char line[1100];
                    int n = snprintf(line, sizeof line, "%s\n", rq.reason);
                    if (write(report[1], line, (size_t)n) != n) _exit(5);
                } else if (rq.kind == TDM_COTRAIN_REQ_JOIN) {
                    tdm_cotrain_msg m = {.type = TDM_COTRAIN_ADMITTED};
                    m.u.admitted.host_pid = (int32_t)getpid();
                    m.u.admitted.n_adapters = rq.msg.u.join.n_adapters;
                    tdm_cotrain_host_send(h, rq.conn, &m, &err);
                    for (int a = 0; !hold && a < rq.msg.u.join.n_adapters; a++) {
                        tdm_cotrain_msg p = {.type = TDM_COTRAIN_PROGRESS};
                        p.u.progress = (tdm_cotrain_progress_msg){
                            .adapter = a,
                            .event = TDM_TRAINER_EVENT_STEP,
                            .global_step = step,
                            .step = 1,
                            .total_steps = 1,
                            .epoch = 1,
                            .epochs = rq.msg.u.join.adapters[a].epochs,
                            .loss = 2.5,
                            .learning_rate = rq.msg.u.join.adapters[a].lr,
                            .grad_norm = 1,
                            .val_loss = NAN,
                            .tokens_per_sec = 100,
                            .eta_sec = 0};
                        tdm_cotrain_host_send(h, rq.conn, &p, &err);
                        tdm_cotrain_msg d = {.type = TDM_COTRAIN_DONE};
                        d.u.done.adapter = a;
                        d.u.done.outcome = TDM_COTRAIN_FINISHED;
                        d.u.done.step = 1;
                        tdm_cotrain_host_send(h, rq.conn, &d, &err);
                    }
                    if (!hold) tdm_cotrain_host_close(h, rq.conn);
                }
                tdm_cotrain_request_free(&rq);
            }
            tdm_cotrain_host_set_step(h, step);
            tdm_sleep_ms(5); /* a "training step" */
        }
    }
    close(ready[1]);
    close(report[1]);
    char c;
    assert_int_equal(read(ready[0], &c, 1), 1);
    close(ready[0]);
    if (report_rd)
        *report_rd = report[0];
    else
        close(report[0]);
    return pid;
}

static void kill_wait(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static void join_host(tdm_cotrain_client *c, const char *dir, const tdm_base_identity *base)
{
    tdm_cotrain_advert ad;
    tdm_error err = {0};
    const char *why;
    if (tdm_cotrain_find_host(dir, base, &ad, &why, &err) != TDM_OK) fail_msg("%s", err.message);
    assert_int_equal(tdm_cotrain_client_connect(c, ad.socket_path, &err), TDM_OK);
    tdm_cotrain_msg j = sample_join(base->id);
    assert_int_equal(tdm_cotrain_client_send(c, &j, &err), TDM_OK);
}

static tdm_status next_msg(tdm_cotrain_client *c, tdm_cotrain_msg *m, tdm_error *err)
{
    return tdm_cotrain_client_next(c, 5000, m, err);
}

static void test_discover_and_join(void **state)
{
    char *tmp = make_tmpdir();
    char model[600];
    snprintf(model, sizeof model, "%s/model", tmp);
    make_model(model, CONFIG, 1.0f);
    tdm_base_identity base = identity_of(model, true, "GPU-sim-0");
    pid_t host = spawn_host(tmp, &base, false, NULL);

    /* The advertisement: our pid's start time, a private directory's modes. */
    tdm_cotrain_advert *hosts;
    size_t n;
    tdm_error err = {0};
    assert_int_equal(tdm_cotrain_discover(tmp, &hosts, &n, &err), TDM_OK);
    assert_int_equal(n, 1);
    assert_int_equal(hosts[0].pid, host);
    assert_true(hosts[0].start_time == tdm_proc_start_time(host));
    assert_string_equal(hosts[0].base.id, base.id);
    assert_string_equal(hosts[0].model_dir, "/models/test");
    struct stat st;
    assert_int_equal(stat(hosts[0].socket_path, &st), 0);
    assert_true(S_ISSOCK(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0600);
    free(hosts);

    /* Another device, method or model: no host. */
    tdm_cotrain_advert ad;
    const char *why;
    tdm_base_identity other = identity_of(model, true, "cpu");
    assert_int_equal(tdm_cotrain_find_host(tmp, &other, &ad, &why, &err), TDM_ERR_NOT_FOUND);
    assert_string_equal(why, "device");
    other = identity_of(model, false, "GPU-sim-0");
    assert_int_equal(tdm_cotrain_find_host(tmp, &other, &ad, &why, &err), TDM_ERR_NOT_FOUND);
    assert_string_equal(why, "method");

    /* Same identity: join, admitted, one progress and done per adapter, then the host closes. */
    tdm_cotrain_client c;
    join_host(&c, tmp, &base);
    tdm_cotrain_msg m;
    assert_int_equal(next_msg(&c, &m, &err), TDM_OK);
    assert_int_equal(m.type, TDM_COTRAIN_ADMITTED);
    assert_int_equal(m.u.admitted.host_pid, host);
    assert_int_equal(m.u.admitted.n_adapters, 2);
    tdm_cotrain_msg_free(&m);
    for (int a = 0; a < 2; a++) {
        assert_int_equal(next_msg(&c, &m, &err), TDM_OK);
        assert_int_equal(m.type, TDM_COTRAIN_PROGRESS);
        assert_int_equal(m.u.progress.adapter, a);
        assert_true(m.u.progress.learning_rate == g_adapters[a].lr);
        tdm_cotrain_msg_free(&m);
        assert_int_equal(next_msg(&c, &m, &err), TDM_OK);
        assert_int_equal(m.type, TDM_COTRAIN_DONE);
        assert_int_equal(m.u.done.outcome, TDM_COTRAIN_FINISHED);
        tdm_cotrain_msg_free(&m);
    }
    assert_int_equal(next_msg(&c, &m, &err), TDM_ERR_IO);
    assert_true(c.host_gone && c.eof);
    tdm_cotrain_client_close(&c);

    /* A join with another identity reaches the socket anyway: the host refuses it. */
    char sock[600];
    snprintf(sock, sizeof sock, "%s/cotrain-%d.sock", tmp, (int)host);
    assert_int_equal(tdm_cotrain_client_connect(&c, sock, &err), TDM_OK);
    tdm_cotrain_msg j = sample_join(other.id);
    assert_int_equal(tdm_cotrain_client_send(&c, &j, &err), TDM_OK);
    assert_int_equal(next_msg(&c, &m, &err), TDM_OK);
    assert_int_equal(m.type, TDM_COTRAIN_REJECTED);
    assert_non_null(strstr(m.u.rejected.message, "base identity"));
    assert_non_null(strstr(m.u.rejected.message, "--no-join"));
    tdm_cotrain_msg_free(&m);
    assert_int_equal(next_msg(&c, &m, &err), TDM_ERR_IO);
    tdm_cotrain_client_close(&c);
    kill_wait(host);
    rm_rf(tmp);
    free(tmp);
}

/* Sends raw bytes and expects "rejected" naming needle, then EOF. */
static void expect_socket_rejects(const char *sock, const char *bytes, size_t len,
                                  const char *needle)
{
    if (len == 0) len = strlen(bytes);
    tdm_cotrain_client c;
    tdm_error err = {0};
    assert_int_equal(tdm_cotrain_client_connect(&c, sock, &err), TDM_OK);
    size_t off = 0;
    while (off < len) {
        ssize_t w = send(c.fd, bytes + off, len - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EAGAIN) {
            tdm_sleep_ms(1);
            continue;
        }
        if (w <= 0) break; /* the host may close while we still send a huge line */
        off += (size_t)w;
    }
    tdm_cotrain_msg m;
    assert_int_equal(next_msg(&c, &m, &err), TDM_OK);
    assert_int_equal(m.type, TDM_COTRAIN_REJECTED);
    if (!strstr(m.u.rejected.message, needle))
        fail_msg("rejection \"%s\" does not say \"%s\"", m.u.rejected.message, needle);
    tdm_cotrain_msg_free(&m);
    assert_int_equal(next_msg(&c, &m, &err), TDM_ERR_IO);
    assert_true(c.eof);
    tdm_cotrain_client_close(&c);
}

static void test_hostile_peers(void **state)
{
    char *tmp = make_tmpdir();
    char model[600], sock[600];
    snprintf(model, sizeof model, "%s/model", tmp);
    make_model(model, CONFIG, 1.0f);
    tdm_base_identity base = identity_of(model, true, "cpu");
    int report;
    pid_t host = spawn_host(tmp, &base, true, &report);
    snprintf(sock, sizeof sock, "%s/cotrain-%d.sock", tmp, (int)host);

    expect_socket_rejects(sock, "garbage\n", 0, "not JSON");
    expect_socket_rejects(sock, "{\"v\":1,\"type\":\"admitted\",\"host_pid\":1,\"n_adapters\":1}\n",
                          0, "may not send");
    expect_socket_rejects(sock, "{\"v\":1,\"type\":\"detach\"}\n", 0, "detach before join");
    expect_socket_rejects(sock, "{\"v\":9,\"type\":\"join\"}\n", 0, "version 9");
    /* A join that lies about its pid. */
    tdm_cotrain_msg j = sample_join(base.id);
    j.u.join.pid = 1;
    char *line;
    size_t len;
    tdm_error err = {0};
    assert_int_equal(tdm_cotrain_msg_encode(&j, &line, &len, &err), TDM_OK);
    expect_socket_rejects(sock, line, len, "socket's peer is pid");
    free(line);
    /* One line over the limit, without a newline. */
    size_t big = TDM_COTRAIN_MSG_MAX + 4096;
    char *huge = malloc(big);
    assert_non_null(huge);
    memset(huge, 'x', big);
    expect_socket_rejects(sock, huge, big, "exceeds");
    free(huge);

    /* After all that the host still admits a proper join. */
    tdm_cotrain_client c;
    join_host(&c, tmp, &base);
    tdm_cotrain_msg m;
    assert_int_equal(next_msg(&c, &m, &err), TDM_OK);
    assert_int_equal(m.type, TDM_COTRAIN_ADMITTED);
    tdm_cotrain_msg_free(&m);
    tdm_cotrain_client_close(&c);

    /* The host saw each refusal (its log would show them). */
    tdm_sleep_ms(50);
    kill_wait(host);
    char buf[8192];
    ssize_t n = read(report, buf, sizeof buf - 1);
    assert_true(n > 0);
    buf[n] = '\0';
    int lines = 0;
    for (char *p = buf; (p = strchr(p, '\n')); p++)
        lines++;
    assert_int_equal(lines, 6);
    assert_non_null(strstr(buf, "refused pid"));
    close(report);
    rm_rf(tmp);
    free(tmp);
}

/* kill -9 of the host: the joiner hears EOF at once. SIGSTOP: silence, noticed within 1 s. */
static void test_host_death_noticed(void **state)
{
    char *tmp = make_tmpdir();
    char model[600];
    snprintf(model, sizeof model, "%s/model", tmp);
    make_model(model, CONFIG, 1.0f);
    tdm_base_identity base = identity_of(model, true, "cpu");
    tdm_error err = {0};
    for (int how = 0; how < 2; how++) {
        pid_t host = spawn_host(tmp, &base, true, NULL);
        tdm_cotrain_client c;
        join_host(&c, tmp, &base);
        tdm_cotrain_msg m;
        assert_int_equal(next_msg(&c, &m, &err), TDM_OK);
        assert_int_equal(m.type, TDM_COTRAIN_ADMITTED);
        tdm_cotrain_msg_free(&m);
        /* Attached and quiet for 1.5 s: heartbeats keep it alive (no false alarm). */
        assert_int_equal(tdm_cotrain_client_next(&c, 1500, &m, &err), TDM_ERR_TIMEOUT);
        assert_false(c.host_gone);
        int64_t t0 = tdm_now_mono_ns();
        kill(host, how == 0 ? SIGKILL : SIGSTOP);
        tdm_status st;
        do
            st = tdm_cotrain_client_next(&c, 100, &m, &err);
        while (st == TDM_ERR_TIMEOUT);
        double ms = (double)(tdm_now_mono_ns() - t0) / 1e6;
        assert_int_equal(st, TDM_ERR_IO);
        assert_true(c.host_gone);
        assert_int_equal(c.eof, how == 0);
        print_message("host %s noticed after %.1f ms\n", how == 0 ? "kill -9" : "SIGSTOP", ms);
        /* Silence is declared 1000 ms after the last byte, which came before the stop. */
        assert_true(ms < (how == 0 ? 200.0 : 1000.0 + 100.0));
        tdm_cotrain_client_close(&c);
        kill_wait(host);
    }
    /* The dead hosts' files are still there; the next discovery removes them. */
    char cmd[700];
    snprintf(cmd, sizeof cmd, "ls %s/cotrain-* >/dev/null 2>&1", tmp);
    assert_int_equal(system(cmd), 0);
    tdm_cotrain_advert *hosts;
    size_t n;
    assert_int_equal(tdm_cotrain_discover(tmp, &hosts, &n, &err), TDM_OK);
    assert_int_equal(n, 0);
    free(hosts);
    assert_int_not_equal(system(cmd), 0);
    rm_rf(tmp);
    free(tmp);
}

/* Stale files: a recycled pid (live process, other start time), a socket without advertisement
 * of a dead pid, an unparsable advertisement of a dead pid. Live and unrelated files stay. */
static void test_stale_cleanup(void **state)
{
    char *tmp = make_tmpdir();
    char model[600], path[700];
    snprintf(model, sizeof model, "%s/model", tmp);
    make_model(model, CONFIG, 1.0f);
    tdm_base_identity base = identity_of(model, true, "cpu");
    pid_t host = spawn_host(tmp, &base, true, NULL);
    pid_t dead = fork();
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);

    /* pid 1 is alive, but its start time is not the advertised one: recycled. */
    char text[2048];
    snprintf(text, sizeof text,
             "{\"v\":1,\"pid\":1,\"start_time\":%llu,\"uid\":0,\"user\":\"x\","
             "\"socket\":\"cotrain-1.sock\",\"started_at\":0,\"model_dir\":\"/m\","
             "\"base\":{\"id\":\"%s\",\"model\":\"%s\",\"method\":\"qlora\","
             "\"double_quant\":true,\"compute_dtype\":\"f32\",\"device\":\"cpu\"}}",
             (unsigned long long)tdm_proc_start_time(1) + 12345, base.id, base.model);
    write_text(tmp, "cotrain-1.json", text);
    snprintf(path, sizeof path, "cotrain-%d.sock", (int)dead);
    write_text(tmp, path, "");
    snprintf(path, sizeof path, "cotrain-%d.json", (int)dead);
    write_text(tmp, path, "{not json");
    write_text(tmp, "gpu-ledger.json", "{}");
    write_text(tmp, "cotrain-notapid.json", "{}");

    tdm_cotrain_advert *hosts;
    size_t n;
    tdm_error err = {0};
    assert_int_equal(tdm_cotrain_discover(tmp, &hosts, &n, &err), TDM_OK);
    assert_int_equal(n, 1);
    assert_int_equal(hosts[0].pid, host);
    free(hosts);
    struct stat st;
    snprintf(path, sizeof path, "%s/cotrain-1.json", tmp);
    assert_int_not_equal(stat(path, &st), 0);
    snprintf(path, sizeof path, "%s/cotrain-%d.sock", tmp, (int)dead);
    assert_int_not_equal(stat(path, &st), 0);
    snprintf(path, sizeof path, "%s/cotrain-%d.json", tmp, (int)dead);
    assert_int_not_equal(stat(path, &st), 0);
    snprintf(path, sizeof path, "%s/gpu-ledger.json", tmp);
    assert_int_equal(stat(path, &st), 0);
    snprintf(path, sizeof path, "%s/cotrain-notapid.json", tmp);
    assert_int_equal(stat(path, &st), 0);
    snprintf(path, sizeof path, "%s/cotrain-%d.sock", tmp, (int)host);
    assert_int_equal(stat(path, &st), 0);

    /* A host that stops cleanly removes its own files. */
    kill_wait(host);
    tdm_cotrain_host *h;
    assert_int_equal(tdm_cotrain_host_start(&h, tmp, &base, model, &err), TDM_OK);
    snprintf(path, sizeof path, "%s/cotrain-%d.json", tmp, (int)getpid());
    assert_int_equal(stat(path, &st), 0);
    tdm_cotrain_host_stop(h);
    assert_int_not_equal(stat(path, &st), 0);
    snprintf(path, sizeof path, "%s/cotrain-%d.sock", tmp, (int)getpid());
    assert_int_not_equal(stat(path, &st), 0);
    rm_rf(tmp);
    free(tmp);
}

/* A joined peer that floods the host with detach lines (and then with garbage) queues exactly one
 * detach, and the host keeps serving: heartbeats still reach another joiner. */
static void test_flood(void **state)
{
    char *tmp = make_tmpdir();
    char model[600];
    snprintf(model, sizeof model, "%s/model", tmp);
    make_model(model, CONFIG, 1.0f);
    tdm_base_identity base = identity_of(model, true, "cpu");
    int go[2];
    assert_int_equal(pipe(go), 0);
    pid_t kid = fork();
    assert_true(kid >= 0);
    if (kid == 0) {
        /* The flooding joiner, as a process of its own. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        char c;
        if (read(go[0], &c, 1) != 1) _exit(2);
        tdm_cotrain_client cl;
        tdm_error e = {0};
        char sock[600];
        snprintf(sock, sizeof sock, "%s/cotrain-%d.sock", tmp, (int)getppid());
        if (tdm_cotrain_client_connect(&cl, sock, &e) != TDM_OK) _exit(3);
        tdm_cotrain_msg j = sample_join(base.id);
        if (tdm_cotrain_client_send(&cl, &j, &e) != TDM_OK) _exit(4);
        int flags = fcntl(cl.fd, F_GETFL);
        fcntl(cl.fd, F_SETFL, flags & ~O_NONBLOCK);
        const char *line = "{\"v\":1,\"type\":\"detach\"}\n";
        for (int i = 0; i < 20000; i++)
            if (send(cl.fd, line, strlen(line), MSG_NOSIGNAL) <= 0) _exit(5);
        _exit(0);
    }
    tdm_cotrain_host *h;
    tdm_error err = {0};
    assert_int_equal(tdm_cotrain_host_start(&h, tmp, &base, model, &err), TDM_OK);
    assert_int_equal(write(go[1], "g", 1), 1);
    int status;
    assert_int_equal(waitpid(kid, &status, 0), kid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    /* Let the thread read everything, then count. */
    tdm_sleep_ms(300);
    int joins = 0, detaches = 0, gone = 0, other = 0;
    tdm_cotrain_request rq;
    while (tdm_cotrain_host_take(h, &rq)) {
        joins += rq.kind == TDM_COTRAIN_REQ_JOIN;
        detaches += rq.kind == TDM_COTRAIN_REQ_DETACH;
        gone += rq.kind == TDM_COTRAIN_REQ_GONE;
        other += rq.kind == TDM_COTRAIN_REQ_REFUSED;
        if (rq.kind == TDM_COTRAIN_REQ_JOIN) assert_int_equal(rq.peer.pid, kid);
        tdm_cotrain_request_free(&rq);
    }
    assert_int_equal(joins, 1);
    assert_int_equal(detaches, 1);
    assert_int_equal(gone, 1); /* the flooder exited */
    assert_int_equal(other, 0);
    tdm_cotrain_host_stop(h);
    rm_rf(tmp);
    free(tmp);
}

/* Four processes elect at once: exactly one becomes the host and the three others find it. */
static void test_election(void **state)
{
    char *tmp = make_tmpdir();
    char model[600];
    snprintf(model, sizeof model, "%s/model", tmp);
    make_model(model, CONFIG, 1.0f);
    tdm_base_identity base = identity_of(model, true, "cpu");
    enum { N = 4 };
    int gate[2], report[2];
    assert_int_equal(pipe(gate), 0);
    assert_int_equal(pipe(report), 0);
    pid_t kids[N];
    for (int i = 0; i < N; i++) {
        kids[i] = fork();
        assert_true(kids[i] >= 0);
        if (kids[i] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            close(gate[1]);
            char c;
            if (read(gate[0], &c, 1) != 0) /* EOF: the parent opened the gate */
                _exit(2);
            tdm_cotrain_host *h;
            tdm_cotrain_advert found;
            tdm_error err = {0};
            if (tdm_cotrain_elect(tmp, &base, model, &h, &found, NULL, &err) != TDM_OK) {
                fprintf(stderr, "elect: %s\n", err.message);
                _exit(3);
            }
            int32_t rec[2] = {h ? 1 : 0, h ? (int32_t)getpid() : found.pid};
            if (write(report[1], rec, sizeof rec) != sizeof rec) _exit(4);
            if (h) pause(); /* stay a host until killed */
            _exit(0);
        }
    }
    close(gate[0]);
    close(report[1]);
    close(gate[1]); /* all children read EOF at once */
    int hosts = 0;
    int32_t host_pid = 0, joined[N];
    int n_joined = 0;
    for (int i = 0; i < N; i++) {
        int32_t rec[2];
        assert_int_equal(read(report[0], rec, sizeof rec), (ssize_t)sizeof rec);
        if (rec[0]) {
            hosts++;
            host_pid = rec[1];
        } else {
            joined[n_joined++] = rec[1];
        }
    }
    assert_int_equal(hosts, 1);
    for (int i = 0; i < n_joined; i++)
        assert_int_equal(joined[i], host_pid);
    for (int i = 0; i < N; i++)
        kill_wait(kids[i]);
    close(report[0]);
    rm_rf(tmp);
    free(tmp);
}

/* ---------------------------------------------------------------- other users (root only) */

/* In a child: become uid/gid with the given supplementary groups, connect to sock and send a
 * join. Exit 0: admitted; 10: rejected by the host; 11: connect refused by the file mode;
 * other: error. */
static int join_as(const char *sock, const char *identity, uid_t uid, gid_t gid, gid_t *groups,
                   int n_groups)
{
    pid_t pid = fork();
    if (pid == 0) {
        if (setgroups((size_t)n_groups, groups) != 0 || setgid(gid) != 0 || setuid(uid) != 0)
            _exit(20);
        tdm_cotrain_client c;
        tdm_error err = {0};
        tdm_status st = tdm_cotrain_client_connect(&c, sock, &err);
        if (st != TDM_OK) _exit(strstr(err.message, "Permission denied") ? 11 : 21);
        tdm_cotrain_msg j = sample_join(identity);
        /* A refused peer may find the socket closed while sending: the answer is still there. */
        tdm_status sent = tdm_cotrain_client_send(&c, &j, &err);
        tdm_cotrain_msg m;
        if (tdm_cotrain_client_next(&c, 5000, &m, &err) != TDM_OK) _exit(sent == TDM_OK ? 23 : 22);
        int code = m.type == TDM_COTRAIN_ADMITTED ? 0 : m.type == TDM_COTRAIN_REJECTED ? 10 : 24;
        if (code == 10) fprintf(stderr, "joiner uid %u: %s\n", (unsigned)uid, m.u.rejected.message);
        _exit(code);
    }
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 100;
}

static void test_other_users(void **state)
{
    if (geteuid() != 0) {
        print_message("skipped: needs root to run joiners as other users (setuid)\n");
        skip();
    }
    char *tmp = make_tmpdir();
    char model[600], sock[600];
    snprintf(model, sizeof model, "%s/model", tmp);
    make_model(model, CONFIG, 1.0f);
    tdm_base_identity base = identity_of(model, true, "cpu");
    const uid_t OTHER = 64101;
    const gid_t SHARED = 64201, ELSE = 64202;

    /* Private directory (0700 by mkdtemp; opened up for traversal so only the socket's own mode
     * and the peer check stand in the way). */
    assert_int_equal(chmod(tmp, 0711), 0);
    pid_t host = spawn_host(tmp, &base, true, NULL);
    snprintf(sock, sizeof sock, "%s/cotrain-%d.sock", tmp, (int)host);
    gid_t none[1] = {ELSE};
    assert_int_equal(join_as(sock, base.id, OTHER, ELSE, none, 1), 11); /* socket 0600 */
    /* Were the socket's mode loosened, SO_PEERCRED still refuses another user. */
    assert_int_equal(chmod(sock, 0666), 0);
    assert_int_equal(join_as(sock, base.id, OTHER, ELSE, none, 1), 10);
    kill_wait(host);

    /* Group-shared directory (setgid, group-writable, group SHARED): socket 0660. */
    assert_int_equal(chown(tmp, 0, SHARED), 0);
    assert_int_equal(chmod(tmp, 02771), 0);
    host = spawn_host(tmp, &base, true, NULL);
    snprintf(sock, sizeof sock, "%s/cotrain-%d.sock", tmp, (int)host);
    struct stat st;
    assert_int_equal(stat(sock, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0660);
    assert_int_equal(st.st_gid, SHARED); /* inherited through the setgid directory */
    char adv[700];
    snprintf(adv, sizeof adv, "%s/cotrain-%d.json", tmp, (int)host);
    assert_int_equal(stat(adv, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0640);
    /* Member through a supplementary group, and through the primary group: admitted. */
    gid_t member[2] = {ELSE, SHARED};
    assert_int_equal(join_as(sock, base.id, OTHER, ELSE, member, 2), 0);
    assert_int_equal(join_as(sock, base.id, OTHER, SHARED, none, 1), 0);
    /* Not a member: the socket's mode refuses; loosened, the peer check refuses. */
    assert_int_equal(join_as(sock, base.id, OTHER, ELSE, none, 1), 11);
    assert_int_equal(chmod(sock, 0666), 0);
    assert_int_equal(join_as(sock, base.id, OTHER, ELSE, none, 1), 10);
    kill_wait(host);
    rm_rf(tmp);
    free(tmp);
}

static void test_socket_path_too_long(void **state)
{
    char *tmp = make_tmpdir();
    char dir[300];
    snprintf(dir, sizeof dir, "%s/%0120d", tmp, 0);
    assert_int_equal(mkdir(dir, 0700), 0);
    char model[600];
    snprintf(model, sizeof model, "%s/model", tmp);
    make_model(model, CONFIG, 1.0f);
    tdm_base_identity base = identity_of(model, true, "cpu");
    tdm_cotrain_host *h;
    tdm_error err = {0};
    assert_int_equal(tdm_cotrain_host_start(&h, dir, &base, model, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.message, "TANDEM_LEDGER_DIR"));
    rm_rf(tmp);
    free(tmp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_join_round_trip),
        cmocka_unit_test(test_every_host_message_round_trips),
        cmocka_unit_test(test_hostile_messages),
        cmocka_unit_test(test_run_opts_diff),
        cmocka_unit_test(test_trainer_bridge),
        cmocka_unit_test(test_base_identity),
        cmocka_unit_test(test_discover_and_join),
        cmocka_unit_test(test_hostile_peers),
        cmocka_unit_test(test_host_death_noticed),
        cmocka_unit_test(test_stale_cleanup),
        cmocka_unit_test(test_election),
        cmocka_unit_test(test_flood),
        cmocka_unit_test(test_other_users),
        cmocka_unit_test(test_socket_path_too_long),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
