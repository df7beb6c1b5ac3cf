/* Unit tests of src/obs/trace and src/obs/obs: the written Chrome trace parsed back with jansson
 * (fields, units, order, nesting), zero cost when off, unfinished spans, the event cap, write
 * failures, a trace closed after SIGTERM, and the combined profiler+trace calls. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "obs/clock.h"
#include "obs/obs.h"
#include "obs/profile.h"
#include "obs/trace.h"
#include "util/error.h"

static char tmpdir[256];
static char path[512];
static _Atomic int64_t reads;
static _Atomic int64_t fake_now;

/* Counts reads; advances 1000 ns (1 us) per read. */
static int64_t counting_clock(void)
{
    atomic_fetch_add(&reads, 1);
    return atomic_fetch_add(&fake_now, 1000) + 1000;
}

static char warned[1024];
static void capture_warning(const char *message, void *user)
{
    snprintf(warned, sizeof warned, "%s", message);
}

static int setup(void **state)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/tandem-test-trace-XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    snprintf(path, sizeof path, "%s/run.json", tmpdir);
    atomic_store(&reads, 0);
    atomic_store(&fake_now, 5000000000LL);
    warned[0] = '\0';
    tdm_set_warn_sink(capture_warning, NULL);
    tdm_obs_set_clock(NULL);
    tdm_profile_enable(false);
    tdm_profile_reset();
    return 0;
}

static int teardown(void **state)
{
    tdm_error err = {0};
    tdm_trace_close(&err);
    tdm_obs_set_clock(NULL);
    tdm_profile_enable(false);
    tdm_profile_reset();
    unsetenv("TANDEM_FAULT_INJECT");
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static json_t *load_trace(void)
{
    json_error_t jerr;
    json_t *doc = json_load_file(path, 0, &jerr);
    if (!doc)
        fail_msg("%s:%d: %s", path, jerr.line, jerr.text);
    assert_true(json_is_object(doc));
    assert_true(json_is_array(json_object_get(doc, "traceEvents")));
    return doc;
}

/* The complete ("X") events, in file order, checking the fields every event must have. */
static size_t complete_events(json_t *doc, json_t **out, size_t max)
{
    json_t *list = json_object_get(doc, "traceEvents");
    size_t n = 0, i;
    json_t *e;
    double last_ts = -1;
    json_array_foreach(list, i, e) {
        const char *ph = json_string_value(json_object_get(e, "ph"));
        assert_non_null(ph);
        assert_true(json_is_integer(json_object_get(e, "pid")));
        assert_true(json_is_integer(json_object_get(e, "tid")));
        if (strcmp(ph, "M") == 0)
            continue;
        assert_string_equal(ph, "X");
        assert_non_null(json_string_value(json_object_get(e, "name")));
        assert_non_null(json_string_value(json_object_get(e, "cat")));
        assert_true(json_is_number(json_object_get(e, "ts")));
        assert_true(json_is_number(json_object_get(e, "dur")));
        assert_int_equal(json_integer_value(json_object_get(e, "pid")), getpid());
        double ts = json_number_value(json_object_get(e, "ts"));
        assert_true(ts >= last_ts); /* sorted */
        assert_true(json_number_value(json_object_get(e, "dur")) >= 0);
        last_ts = ts;
        if (n < max)
            out[n] = e;
        n++;
    }
    return n;
}

static const char *ev_name(json_t *e)
{
    return json_string_value(json_object_get(e, "name"));
}

static double ev_ts(json_t *e)
{
    return json_number_value(json_object_get(e, "ts"));
}

static double ev_end(json_t *e)
{
    return ev_ts(e) + json_number_value(json_object_get(e, "dur"));
}

static json_t *ev_arg(json_t *e, const char *key)
{
    return json_object_get(json_object_get(e, "args"), key);
}

static void test_nested_and_sequential_spans(void **state)
{
    tdm_obs_set_clock(counting_clock);
    tdm_error err = {0};
    assert_int_equal(tdm_trace_open(path, &err), TDM_OK);
    assert_true(tdm_trace_active());
    tdm_trace_set_label("finetune-a");
    tdm_trace_span outer = tdm_trace_span_begin("LedgerReserve", "gpu"); /* t = 5000001 us */
    tdm_trace_span q = tdm_trace_span_begin("VramQuery", "gpu");        /* 5000002 */
    tdm_trace_span_end(&q, TDM_TRACE_ARGS(TDM_TRACE_STR("gpu", "GPU-sim-0"),
                                          TDM_TRACE_INT("free_mb", 20480))); /* 5000003 */
    tdm_trace_span_end(&outer,
                       TDM_TRACE_ARGS(TDM_TRACE_INT("budget_mb", 4096),
                                      TDM_TRACE_STR("gpu", "GPU-sim-0"),
                                      TDM_TRACE_STR("outcome", "granted"))); /* 5000004 */
    tdm_trace_span rel = tdm_trace_span_begin("LedgerRelease", "gpu");       /* 5000005 */
    tdm_trace_span_end(&rel, 0, NULL);                                       /* 5000006 */
    assert_int_equal(tdm_trace_close(&err), TDM_OK);
    assert_false(tdm_trace_active());

    json_t *doc = load_trace();
    json_t *ev[8];
    assert_int_equal(complete_events(doc, ev, 8), 3);
    /* Parent before the child it encloses, then the later span. */
    assert_string_equal(ev_name(ev[0]), "LedgerReserve");
    assert_string_equal(ev_name(ev[1]), "VramQuery");
    assert_string_equal(ev_name(ev[2]), "LedgerRelease");
    /* Microseconds of CLOCK_MONOTONIC: the fake clock reads 5000001000 ns first. */
    assert_true(ev_ts(ev[0]) == 5000001.0);
    assert_true(json_number_value(json_object_get(ev[0], "dur")) == 3.0);
    assert_true(ev_ts(ev[1]) == 5000002.0);
    assert_true(json_number_value(json_object_get(ev[1], "dur")) == 1.0);
    assert_true(ev_ts(ev[1]) >= ev_ts(ev[0]) && ev_end(ev[1]) <= ev_end(ev[0]));
    assert_true(ev_ts(ev[2]) >= ev_end(ev[0]));
    assert_string_equal(json_string_value(json_object_get(ev[0], "cat")), "gpu");
    assert_int_equal(json_integer_value(ev_arg(ev[0], "budget_mb")), 4096);
    assert_string_equal(json_string_value(ev_arg(ev[0], "gpu")), "GPU-sim-0");
    assert_string_equal(json_string_value(ev_arg(ev[0], "outcome")), "granted");
    assert_int_equal(json_integer_value(ev_arg(ev[1], "free_mb")), 20480);
    assert_null(json_object_get(ev[2], "args"));
    assert_int_equal(json_integer_value(json_object_get(ev[0], "tid")), gettid());
    /* Metadata and trailer. */
    json_t *meta = json_array_get(json_object_get(doc, "traceEvents"), 0);
    assert_string_equal(json_string_value(json_object_get(meta, "ph")), "M");
    assert_string_equal(json_string_value(json_object_get(meta, "name")), "process_name");
    assert_string_equal(json_string_value(ev_arg(meta, "name")), "tandem: finetune-a");
    json_t *other = json_object_get(doc, "otherData");
    assert_string_equal(json_string_value(json_object_get(other, "tool")), "tandem");
    assert_int_equal(json_integer_value(json_object_get(other, "dropped_events")), 0);
    assert_string_equal(json_string_value(json_object_get(doc, "displayTimeUnit")), "ms");
    json_decref(doc);
    /* 6 span reads + 1 at close. */
    assert_int_equal(atomic_load(&reads), 7);
}

static void test_real_clock_spans_are_ordered(void **state)
{
    tdm_error err = {0};
    assert_int_equal(tdm_trace_open(path, &err), TDM_OK);
    for (int i = 0; i < 50; i++) {
        tdm_trace_span a = tdm_trace_span_begin("WaitPoll", "gpu");
        tdm_trace_span b = tdm_trace_span_begin("LedgerCleanup", "gpu");
        tdm_trace_span_end(&b, TDM_TRACE_ARGS(TDM_TRACE_INT("pruned", i)));
        tdm_trace_span_end(&a, 0, NULL);
    }
    assert_int_equal(tdm_trace_close(&err), TDM_OK);
    json_t *doc = load_trace();
    json_t *ev[100];
    assert_int_equal(complete_events(doc, ev, 100), 100); /* checks sorted ts, dur >= 0 */
    for (int i = 0; i < 100; i += 2) {
        assert_string_equal(ev_name(ev[i]), "WaitPoll");
        assert_string_equal(ev_name(ev[i + 1]), "LedgerCleanup");
        assert_true(ev_ts(ev[i + 1]) >= ev_ts(ev[i]) && ev_end(ev[i + 1]) <= ev_end(ev[i]));
    }
    json_decref(doc);
}

static void test_off_reads_no_clock_and_writes_nothing(void **state)
{
    tdm_obs_set_clock(counting_clock);
    assert_false(tdm_trace_active());
    for (int i = 0; i < 1000; i++) {
        tdm_trace_span s = tdm_trace_span_begin("LedgerReserve", "gpu");
        tdm_trace_span_end(&s, TDM_TRACE_ARGS(TDM_TRACE_INT("budget_mb", 1)));
    }
    assert_int_equal(atomic_load(&reads), 0);
    tdm_error err = {0};
    assert_int_equal(tdm_trace_close(&err), TDM_OK); /* no trace open: a no-op */
    struct stat st;
    assert_int_not_equal(stat(path, &st), 0);
}

static void test_unfinished_span_and_span_ended_after_close(void **state)
{
    tdm_error err = {0};
    assert_int_equal(tdm_trace_open(path, &err), TDM_OK);
    tdm_trace_span done = tdm_trace_span_begin("LedgerReserve", "gpu");
    tdm_trace_span_end(&done, 0, NULL);
    tdm_trace_span wait = tdm_trace_span_begin("WaitPoll", "gpu");
    tdm_trace_span old = wait; /* a copy of a handle of the trace about to close */
    assert_int_equal(tdm_trace_close(&err), TDM_OK);
    /* Ending it now, and again after a new trace opened, records nothing anywhere. */
    tdm_trace_span_end(&wait, 0, NULL);
    json_t *doc = load_trace();
    json_t *ev[4];
    assert_int_equal(complete_events(doc, ev, 4), 2);
    assert_string_equal(ev_name(ev[1]), "WaitPoll");
    assert_true(json_is_true(ev_arg(ev[1], "unfinished")));
    assert_null(ev_arg(ev[0], "unfinished"));
    json_decref(doc);

    assert_int_not_equal(old.session, 0);
    assert_int_equal(tdm_trace_open(path, &err), TDM_OK);
    tdm_trace_span_end(&old, 0, NULL);
    assert_int_equal(tdm_trace_close(&err), TDM_OK);
    doc = load_trace();
    assert_int_equal(complete_events(doc, ev, 4), 0);
    json_decref(doc);
}

static void test_open_errors(void **state)
{
    tdm_error err = {0};
    assert_int_equal(tdm_trace_open("", &err), TDM_ERR_INVALID);
    char bad[600];
    snprintf(bad, sizeof bad, "%s/no/such/dir/t.json", tmpdir);
    assert_int_equal(tdm_trace_open(bad, &err), TDM_ERR_IO);
    assert_non_null(strstr(err.message, "no/such/dir"));
    assert_false(tdm_trace_active());
    assert_int_equal(tdm_trace_open(path, &err), TDM_OK);
    assert_int_equal(tdm_trace_open(path, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.message, "already open"));
    assert_int_equal(tdm_trace_close(&err), TDM_OK);
}

static void test_write_failure_leaves_no_file_and_resets(void **state)
{
    tdm_error err = {0};
    assert_int_equal(tdm_trace_open(path, &err), TDM_OK);
    tdm_trace_span s = tdm_trace_span_begin("LedgerReserve", "gpu");
    tdm_trace_span_end(&s, 0, NULL);
    setenv("TANDEM_FAULT_INJECT", "atomic_write.rename", 1);
    assert_int_equal(tdm_trace_close(&err), TDM_ERR_IO);
    unsetenv("TANDEM_FAULT_INJECT");
    struct stat st;
    assert_int_not_equal(stat(path, &st), 0);
    assert_false(tdm_trace_active());
    assert_int_equal(tdm_trace_open(path, &err), TDM_OK); /* usable again */
    assert_int_equal(tdm_trace_close(&err), TDM_OK);
}

static void test_args_edge_cases(void **state)
{
    tdm_error err = {0};
    assert_int_equal(tdm_trace_open(path, &err), TDM_OK);
    tdm_trace_set_label("bad\xff");
    tdm_trace_span s = tdm_trace_span_begin("LedgerReserve", "gpu");
    tdm_trace_span_end(&s, TDM_TRACE_ARGS(TDM_TRACE_STR("gpu", NULL),
                                          TDM_TRACE_STR("task", "caf\xc3"), /* bad UTF-8 */
                                          TDM_TRACE_INT("big", INT64_MAX),
                                          TDM_TRACE_STR("quote", "a\"b\\c\n")));
    assert_int_equal(tdm_trace_close(&err), TDM_OK);
    json_t *doc = load_trace();
    json_t *ev[2];
    assert_int_equal(complete_events(doc, ev, 2), 1);
    assert_true(json_is_null(ev_arg(ev[0], "gpu")));
    assert_string_equal(json_string_value(ev_arg(ev[0], "task")), "(invalid UTF-8)");
    assert_true(json_integer_value(ev_arg(ev[0], "big")) == INT64_MAX);
    assert_string_equal(json_string_value(ev_arg(ev[0], "quote")), "a\"b\\c\n");
    json_t *meta = json_array_get(json_object_get(doc, "traceEvents"), 0);
    assert_string_equal(json_string_value(ev_arg(meta, "name")), "tandem");
    json_decref(doc);
}

static void test_event_cap_counts_drops(void **state)
{
    tdm_error err = {0};
    assert_int_equal(tdm_trace_open(path, &err), TDM_OK);
    for (int i = 0; i < TDM_TRACE_MAX_EVENTS + 10; i++) {
        tdm_trace_span s = tdm_trace_span_begin("VramQuery", "gpu");
        tdm_trace_span_end(&s, 0, NULL);
    }
    assert_int_equal(tdm_trace_close(&err), TDM_OK);
    json_t *doc = load_trace();
    assert_int_equal(json_array_size(json_object_get(doc, "traceEvents")),
                     TDM_TRACE_MAX_EVENTS + 1); /* + the metadata event */
    json_t *other = json_object_get(doc, "otherData");
    assert_int_equal(json_integer_value(json_object_get(other, "dropped_events")), 10);
    assert_non_null(strstr(warned, "10 events dropped"));
    json_decref(doc);
}

#define THREADS 4
#define PER_THREAD 500

static void *span_worker(void *arg)
{
    for (int i = 0; i < PER_THREAD; i++) {
        tdm_trace_span s = tdm_trace_span_begin("LedgerReserve", "gpu");
        tdm_trace_span_end(&s, TDM_TRACE_ARGS(TDM_TRACE_INT("i", i)));
    }
    *(pid_t *)arg = gettid();
    return NULL;
}

static void test_threads(void **state)
{
    tdm_error err = {0};
    assert_int_equal(tdm_trace_open(path, &err), TDM_OK);
    pthread_t th[THREADS];
    pid_t tids[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, span_worker, &tids[i]), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(tdm_trace_close(&err), TDM_OK);
    json_t *doc = load_trace();
    static json_t *ev[THREADS * PER_THREAD];
    assert_int_equal(complete_events(doc, ev, THREADS * PER_THREAD), THREADS * PER_THREAD);
    int per[THREADS] = {0};
    for (int k = 0; k < THREADS * PER_THREAD; k++)
        for (int i = 0; i < THREADS; i++)
            if (json_integer_value(json_object_get(ev[k], "tid")) == tids[i])
                per[i]++;
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(per[i], PER_THREAD);
    json_decref(doc);
}

/* A child process tracing a wait when SIGTERM arrives: its handler only sets a flag, the main
 * path closes the trace, and the file is valid JSON holding the interrupted span. */
static volatile sig_atomic_t stop;
static void on_term(int sig)
{
    stop = 1;
}

static void test_trace_valid_after_sigterm(void **state)
{
    /* Cache this thread's tid in the tracer first, so the child inherits a stale cache. */
    tdm_error perr = {0};
    assert_int_equal(tdm_trace_open(path, &perr), TDM_OK);
    tdm_trace_span warm = tdm_trace_span_begin("Warm", "gpu");
    tdm_trace_span_end(&warm, 0, NULL);
    assert_int_equal(tdm_trace_close(&perr), TDM_OK);
    assert_int_equal(unlink(path), 0);

    int ready[2];
    assert_int_equal(pipe(ready), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct sigaction sa = {0};
        sa.sa_handler = on_term;
        sigaction(SIGTERM, &sa, NULL);
        tdm_error err = {0};
        if (tdm_trace_open(path, &err) != TDM_OK)
            _exit(3);
        tdm_trace_span r = tdm_trace_span_begin("LedgerReserve", "gpu");
        tdm_trace_span_end(&r, TDM_TRACE_ARGS(TDM_TRACE_STR("outcome", "wait")));
        tdm_trace_span w = tdm_trace_span_begin("WaitPoll", "gpu");
        (void)w;
        if (write(ready[1], "r", 1) != 1)
            _exit(4);
        while (!stop)
            usleep(1000);
        _exit(tdm_trace_close(&err) == TDM_OK ? 0 : 5);
    }
    char c;
    assert_int_equal(read(ready[0], &c, 1), 1);
    close(ready[0]);
    close(ready[1]);
    struct stat st;
    assert_int_not_equal(stat(path, &st), 0); /* nothing written before the close */
    kill(pid, SIGTERM);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    json_t *doc = load_trace();
    json_t *list = json_object_get(doc, "traceEvents");
    size_t i;
    json_t *e;
    int found = 0;
    json_array_foreach(list, i, e) {
        assert_int_equal(json_integer_value(json_object_get(e, "pid")), pid);
        /* The child is single-threaded: its tid is its pid, not the cached tid of the parent. */
        assert_int_equal(json_integer_value(json_object_get(e, "tid")), pid);
        const char *name = ev_name(e);
        if (strcmp(name, "WaitPoll") == 0 && json_is_true(ev_arg(e, "unfinished")))
            found++;
    }
    assert_int_equal(found, 1);
    json_decref(doc);
}

/* obs.h: one pair of calls for both; the clock is read twice per pair or never. */
static void test_obs_combined_costs(void **state)
{
    tdm_obs_set_clock(counting_clock);
    for (int i = 0; i < 1000; i++) {
        tdm_obs_span o = tdm_obs_begin(TDM_PHASE_LOCK_ACQ);
        tdm_obs_end(&o, 0, NULL);
    }
    assert_int_equal(atomic_load(&reads), 0);

    tdm_profile_enable(true);
    for (int i = 0; i < 1000; i++) {
        tdm_obs_span o = tdm_obs_begin(TDM_PHASE_LOCK_ACQ);
        tdm_obs_end(&o, 0, NULL);
    }
    assert_int_equal(atomic_load(&reads), 2000);

    tdm_error err = {0};
    assert_int_equal(tdm_trace_open(path, &err), TDM_OK);
    for (int i = 0; i < 1000; i++) {
        tdm_obs_span o = tdm_obs_begin(TDM_PHASE_VRAM_QRY);
        tdm_obs_end(&o, TDM_TRACE_ARGS(TDM_TRACE_STR("gpu", "GPU-sim-0")));
    }
    assert_int_equal(atomic_load(&reads), 4000); /* still two per pair with both on */
    tdm_profile_enable(false);
    tdm_obs_span o = tdm_obs_begin(TDM_PHASE_LEDGER_WR); /* trace only */
    tdm_obs_end(&o, 0, NULL);
    assert_int_equal(atomic_load(&reads), 4002);
    assert_int_equal(tdm_trace_close(&err), TDM_OK);

    tdm_phase_stats s[TDM_PHASE_COUNT];
    tdm_profile_snapshot(s);
    assert_int_equal(s[TDM_PHASE_LOCK_ACQ].count, 1000);
    assert_int_equal(s[TDM_PHASE_VRAM_QRY].count, 1000);
    assert_int_equal(s[TDM_PHASE_VRAM_QRY].total_ns, 1000 * 1000);
    assert_int_equal(s[TDM_PHASE_LEDGER_WR].count, 0);

    json_t *doc = load_trace();
    static json_t *ev[1001];
    assert_int_equal(complete_events(doc, ev, 1001), 1001);
    assert_string_equal(ev_name(ev[0]), "VramQuery");
    assert_string_equal(json_string_value(json_object_get(ev[0], "cat")), "phase");
    assert_true(json_number_value(json_object_get(ev[0], "dur")) == 1.0);
    assert_string_equal(json_string_value(ev_arg(ev[0], "gpu")), "GPU-sim-0");
    assert_string_equal(ev_name(ev[1000]), "LedgerWrite");
    json_decref(doc);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_nested_and_sequential_spans),
        T(test_real_clock_spans_are_ordered),
        T(test_off_reads_no_clock_and_writes_nothing),
        T(test_unfinished_span_and_span_ended_after_close),
        T(test_open_errors),
        T(test_write_failure_leaves_no_file_and_resets),
        T(test_args_edge_cases),
        T(test_event_cap_counts_drops),
        T(test_threads),
        T(test_trace_valid_after_sigterm),
        T(test_obs_combined_costs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
