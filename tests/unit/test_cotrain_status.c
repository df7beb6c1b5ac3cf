/* A co-training host's live status (cotrain/status.h): encoding round trip, strict reading of
 * hostile files, and the listing `gpu status` shows, with a real host process (fork) that
 * publishes into its advertisement. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cotrain/endpoint.h"
#include "cotrain/host.h"
#include "cotrain/status.h"
#include "util/atomic_file.h"

static tdm_cotrain_status sample(tdm_cotrain_status_adapter ads[2])
{
    ads[0] = (tdm_cotrain_status_adapter){.index = 0,
                                          .label = "greet",
                                          .data = "data/greet.jsonl",
                                          .output = "out/greet",
                                          .state = TDM_COTRAIN_ADAPTER_FINISHED,
                                          .step = 24,
                                          .total_steps = 24,
                                          .epoch = 2,
                                          .epochs = 2,
                                          .loss = 0.123456789012345678,
                                          .tokens_per_sec = 812.5,
                                          .weight = 1,
                                          .share = NAN};
    ads[1] = (tdm_cotrain_status_adapter){.index = 3,
                                          .label = "add",
                                          .data = "/abs/add.jsonl",
                                          .output = "/abs/out/add",
                                          .joiner_pid = 4250,
                                          .state = TDM_COTRAIN_ADAPTER_TRAINING,
                                          .step = 3,
                                          .total_steps = 48,
                                          .epoch = 0.0625,
                                          .epochs = 2,
                                          .loss = NAN,
                                          .tokens_per_sec = NAN,
                                          .weight = 0.5,
                                          .share = 1};
    snprintf(ads[1].joiner_user, sizeof ads[1].joiner_user, "bob");
    tdm_cotrain_status s = {.updated_ms = 1764680012345,
                            .global_step = 42,
                            .has_plan = true,
                            .grad_checkpoint = true,
                            .split = 2,
                            .n_adapters = 2,
                            .adapters = ads};
    snprintf(s.schedule, sizeof s.schedule, "synchronized");
    snprintf(s.recompute, sizeof s.recompute, "attn");
    return s;
}

static void test_round_trip(void **state)
{
    (void)state;
    tdm_cotrain_status_adapter ads[2];
    tdm_cotrain_status s = sample(ads);
    json_t *j = tdm_cotrain_status_json(&s);
    assert_non_null(j);
    /* through text, as a reader gets it */
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    json_error_t jerr;
    j = json_loads(text, 0, &jerr);
    free(text);
    tdm_cotrain_status r;
    tdm_error err = {0};
    assert_int_equal(tdm_cotrain_status_parse(j, &r, &err), TDM_OK);
    json_decref(j);
    assert_int_equal(r.updated_ms, s.updated_ms);
    assert_int_equal(r.global_step, 42);
    assert_string_equal(r.schedule, "synchronized");
    assert_true(r.has_plan && r.grad_checkpoint);
    assert_string_equal(r.recompute, "attn");
    assert_int_equal(r.split, 2);
    assert_int_equal(r.n_adapters, 2);
    assert_int_equal(r.adapters[0].index, 0);
    assert_string_equal(r.adapters[0].label, "greet");
    assert_string_equal(r.adapters[0].data, "data/greet.jsonl");
    assert_int_equal(r.adapters[0].joiner_pid, 0);
    assert_int_equal(r.adapters[0].state, TDM_COTRAIN_ADAPTER_FINISHED);
    assert_true(r.adapters[0].loss == ads[0].loss); /* 17 significant digits: bit-exact */
    assert_true(isnan(r.adapters[0].share));
    assert_int_equal(r.adapters[1].index, 3);
    assert_string_equal(r.adapters[1].output, "/abs/out/add");
    assert_int_equal(r.adapters[1].joiner_pid, 4250);
    assert_string_equal(r.adapters[1].joiner_user, "bob");
    assert_int_equal(r.adapters[1].step, 3);
    assert_int_equal(r.adapters[1].total_steps, 48);
    assert_true(r.adapters[1].epoch == 0.0625);
    assert_true(isnan(r.adapters[1].loss) && isnan(r.adapters[1].tokens_per_sec));
    assert_true(r.adapters[1].weight == 0.5 && r.adapters[1].share == 1);
    tdm_cotrain_status_free(&r);

    /* no checkpointing: recompute is null; an older host's status without a plan reads too */
    s.grad_checkpoint = false, s.split = 1;
    j = tdm_cotrain_status_json(&s);
    assert_true(json_is_null(json_object_get(json_object_get(j, "plan"), "recompute")));
    assert_int_equal(tdm_cotrain_status_parse(j, &r, &err), TDM_OK);
    assert_true(r.has_plan && !r.grad_checkpoint && r.split == 1 && r.recompute[0] == 0);
    tdm_cotrain_status_free(&r);
    json_object_del(j, "plan");
    assert_int_equal(tdm_cotrain_status_parse(j, &r, &err), TDM_OK);
    assert_false(r.has_plan);
    tdm_cotrain_status_free(&r);
    json_decref(j);
}

/* One mutation of a valid status: the JSON path's object gets key set to value (JSON text;
 * NULL deletes it); the parse must fail with status want and a message naming field. */
typedef struct mutation {
    int adapter; /* -1: the status object itself */
    const char *key, *value;
    tdm_status want;
    const char *field;
} mutation;

static void test_hostile(void **state)
{
    (void)state;
    static const mutation cases[] = {
        {-1, "v", "2", TDM_ERR_UNSUPPORTED, "version 2"},
        {-1, "v", "\"1\"", TDM_ERR_PARSE, "v:"},
        {-1, "updated_ms", NULL, TDM_ERR_PARSE, "updated_ms"},
        {-1, "global_step", "-1", TDM_ERR_PARSE, "global_step"},
        {-1, "schedule", "7", TDM_ERR_PARSE, "schedule"},
        {-1, "adapters", "{}", TDM_ERR_PARSE, "adapters"},
        {-1, "plan", "[]", TDM_ERR_PARSE, "plan"},
        {-1, "plan", "{\"grad_checkpoint\": 1, \"recompute\": null, \"split\": 1}", TDM_ERR_PARSE,
         "plan.grad_checkpoint"},
        {-1, "plan", "{\"grad_checkpoint\": true, \"recompute\": \"all\", \"split\": 1}",
         TDM_ERR_PARSE, "plan.recompute"},
        {-1, "plan", "{\"grad_checkpoint\": false, \"recompute\": \"mlp\", \"split\": 1}",
         TDM_ERR_PARSE, "plan.recompute"},
        {-1, "plan", "{\"grad_checkpoint\": false, \"recompute\": null, \"split\": 0}",
         TDM_ERR_PARSE, "plan.split"},
        {0, "index", "-1", TDM_ERR_PARSE, "adapters[0].index"},
        {0, "label", NULL, TDM_ERR_PARSE, "adapters[0].label"},
        {1, "joiner", "{\"pid\": 0, \"user\": \"x\"}", TDM_ERR_PARSE, "adapters[1].joiner"},
        {1, "joiner", "{\"pid\": 5}", TDM_ERR_PARSE, "adapters[1].joiner"},
        {1, "joiner", "\"bob\"", TDM_ERR_PARSE, "adapters[1].joiner"},
        {1, "state", "\"paused\"", TDM_ERR_PARSE, "adapters[1].state"},
        {1, "step", "1.5", TDM_ERR_PARSE, "adapters[1].step"},
        {1, "epoch", "null", TDM_ERR_PARSE, "adapters[1].epoch"},
        {1, "epochs", "100001", TDM_ERR_PARSE, "adapters[1].epochs"},
        {1, "loss", "\"low\"", TDM_ERR_PARSE, "adapters[1].loss"},
        {1, "tokens_per_sec", "-1", TDM_ERR_PARSE, "adapters[1].tokens_per_sec"},
        {1, "weight", "null", TDM_ERR_PARSE, "adapters[1].weight"},
        {1, "share", "1.5", TDM_ERR_PARSE, "adapters[1].share"},
    };
    tdm_cotrain_status_adapter ads[2];
    tdm_cotrain_status s = sample(ads);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const mutation *m = &cases[i];
        json_t *j = tdm_cotrain_status_json(&s);
        json_t *o =
            m->adapter < 0 ? j : json_array_get(json_object_get(j, "adapters"), (size_t)m->adapter);
        if (m->value) {
            json_error_t jerr;
            json_object_set_new(o, m->key, json_loads(m->value, JSON_DECODE_ANY, &jerr));
        } else {
            json_object_del(o, m->key);
        }
        tdm_cotrain_status r;
        tdm_error err = {0};
        tdm_status st = tdm_cotrain_status_parse(j, &r, &err);
        json_decref(j);
        if (st != m->want || !strstr(err.message, m->field))
            fail_msg("case %zu (%s = %s): got %d \"%s\", want %d naming %s", i, m->key,
                     m->value ? m->value : "(deleted)", st, err.message, m->want, m->field);
        /* nothing is left allocated or half-filled */
        assert_int_equal(r.n_adapters, 0);
        assert_null(r.adapters);
    }
    /* too many adapters, and a label over its bound */
    json_t *j = tdm_cotrain_status_json(&s);
    json_t *list = json_object_get(j, "adapters");
    json_t *one = json_array_get(list, 0);
    while (json_array_size(list) <= TDM_COTRAIN_STATUS_MAX_ADAPTERS)
        json_array_append(list, one);
    tdm_cotrain_status r;
    tdm_error err = {0};
    assert_int_equal(tdm_cotrain_status_parse(j, &r, &err), TDM_ERR_PARSE);
    json_decref(j);
    char label[300];
    memset(label, 'x', sizeof label - 1);
    label[sizeof label - 1] = 0;
    ads[1].label = label;
    j = tdm_cotrain_status_json(&s);
    assert_int_equal(tdm_cotrain_status_parse(j, &r, &err), TDM_ERR_PARSE);
    assert_non_null(strstr(err.message, "adapters[1].label"));
    json_decref(j);
}

/* ---------------------------------------------------------------- a host process */

static char *make_tmpdir(void)
{
    char tmpl[] = "/tmp/tdm-cotrain-status-XXXXXX";
    char *d = mkdtemp(tmpl);
    assert_non_null(d);
    return strdup(d);
}

static tdm_base_identity sample_base(void)
{
    tdm_base_identity b;
    memset(&b, 0, sizeof b);
    snprintf(b.model, sizeof b.model, "sha256:%064d", 1);
    snprintf(b.method, sizeof b.method, "qlora");
    b.double_quant = true;
    snprintf(b.compute_dtype, sizeof b.compute_dtype, "f32");
    snprintf(b.device, sizeof b.device, "cpu");
    snprintf(b.id, sizeof b.id, "sha256:%064d", 2);
    return b;
}

static void expect_byte(int fd, char want)
{
    char c = 0;
    assert_int_equal(read(fd, &c, 1), 1);
    assert_int_equal(c, want);
}

/* The host: starts (byte 'r'), then on each byte 'p' from the parent publishes the sample status
 * with global_step = the count so far (answers 'd'), until killed. */
static pid_t spawn_host(const char *dir, int *to_host, int *from_host)
{
    int down[2], up[2];
    assert_int_equal(pipe(down), 0);
    assert_int_equal(pipe(up), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(down[1]);
        close(up[0]);
        tdm_base_identity base = sample_base();
        tdm_cotrain_host *h;
        tdm_error err = {0};
        if (tdm_cotrain_host_start(&h, dir, &base, "/models/test", &err) != TDM_OK) _exit(3);
        if (write(up[1], "r", 1) != 1) _exit(4);
        char c;
        for (int64_t n = 1; read(down[0], &c, 1) == 1; n++) {
            tdm_cotrain_status_adapter ads[2];
            tdm_cotrain_status s = sample(ads);
            s.global_step = n;
            json_t *j = tdm_cotrain_status_json(&s);
            if (tdm_cotrain_host_publish(h, j, &err) != TDM_OK) _exit(5);
            json_decref(j);
            if (write(up[1], "d", 1) != 1) _exit(6);
        }
        tdm_cotrain_host_stop(h);
        _exit(0);
    }
    close(down[0]);
    close(up[1]);
    *to_host = down[1];
    *from_host = up[0];
    expect_byte(*from_host, 'r');
    return pid;
}

static void test_listing(void **state)
{
    (void)state;
    char *dir = make_tmpdir();
    int to_host, from_host;
    pid_t host = spawn_host(dir, &to_host, &from_host);
    tdm_cotrain_host_view *v;
    size_t n;
    tdm_error err = {0};

    /* before the first publication: listed, without a status */
    assert_int_equal(tdm_cotrain_status_list(dir, &v, &n, &err), TDM_OK);
    assert_int_equal(n, 1);
    assert_int_equal(v[0].advert.pid, host);
    assert_false(v[0].has_status);
    tdm_cotrain_host_views_free(v, n);

    /* published twice: the latest is read, and the advertisement still finds the host */
    for (int k = 0; k < 2; k++) {
        assert_int_equal(write(to_host, "p", 1), 1);
        expect_byte(from_host, 'd');
    }
    assert_int_equal(tdm_cotrain_status_list(dir, &v, &n, &err), TDM_OK);
    assert_int_equal(n, 1);
    assert_true(v[0].has_status);
    assert_int_equal(v[0].status.global_step, 2);
    assert_int_equal(v[0].status.n_adapters, 2);
    assert_int_equal(v[0].status.adapters[1].joiner_pid, 4250);
    assert_string_equal(v[0].advert.model_dir, "/models/test");
    tdm_cotrain_host_views_free(v, n);
    tdm_base_identity base = sample_base();
    tdm_cotrain_advert found;
    const char *why;
    assert_int_equal(tdm_cotrain_find_host(dir, &base, &found, &why, &err), TDM_OK);
    assert_int_equal(found.pid, host);
    char path[4200];
    assert_int_equal(tdm_cotrain_advert_path(path, sizeof path, dir, host), 0);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600); /* a private directory */

    /* a forged status (anyone who can write the directory): the host is still listed, without
     * it; a joiner still finds the host */
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(tdm_read_file(path, &text, &len, &err), TDM_OK);
    json_error_t jerr;
    json_t *adv = json_loadb(text, len, 0, &jerr);
    free(text);
    json_object_set_new(json_object_get(adv, "status"), "global_step", json_string("many"));
    char *forged = json_dumps(adv, 0);
    json_decref(adv);
    assert_int_equal(tdm_atomic_write(path, forged, strlen(forged), 0600, &err), TDM_OK);
    free(forged);
    assert_int_equal(tdm_cotrain_status_list(dir, &v, &n, &err), TDM_OK);
    assert_int_equal(n, 1);
    assert_false(v[0].has_status);
    tdm_cotrain_host_views_free(v, n);
    assert_int_equal(tdm_cotrain_find_host(dir, &base, &found, &why, &err), TDM_OK);

    /* a clean stop removes it; so does a dead host's next listing */
    close(to_host);
    int ws;
    assert_int_equal(waitpid(host, &ws, 0), host);
    assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    assert_int_equal(tdm_cotrain_status_list(dir, &v, &n, &err), TDM_OK);
    assert_int_equal(n, 0);
    assert_null(v);
    close(from_host);
    host = spawn_host(dir, &to_host, &from_host);
    assert_int_equal(write(to_host, "p", 1), 1);
    expect_byte(from_host, 'd');
    kill(host, SIGKILL);
    waitpid(host, NULL, 0);
    assert_int_equal(tdm_cotrain_status_list(dir, &v, &n, &err), TDM_OK);
    assert_int_equal(n, 0);
    assert_int_equal(tdm_cotrain_advert_path(path, sizeof path, dir, host), 0);
    assert_int_not_equal(stat(path, &st), 0);
    close(to_host);
    close(from_host);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_hostile),
        cmocka_unit_test(test_listing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
