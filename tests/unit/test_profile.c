/* Unit tests of src/obs/profile: zero cost when off (counted clock reads), statistics, the
 * overhead share and its 5 % flag, the text and JSON reports, and concurrent recording. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obs/clock.h"
#include "obs/profile.h"

/* A clock that counts its reads and advances by `step` ns on each. */
static _Atomic int64_t reads;
static _Atomic int64_t fake_now;
static int64_t step = 10;

static int64_t counting_clock(void)
{
    atomic_fetch_add(&reads, 1);
    return atomic_fetch_add(&fake_now, step) + step;
}

static int setup(void **state)
{
    atomic_store(&reads, 0);
    atomic_store(&fake_now, 1000000);
    step = 10;
    tdm_obs_set_clock(counting_clock);
    tdm_profile_enable(false);
    tdm_profile_reset();
    return 0;
}

static int teardown(void **state)
{
    tdm_profile_enable(false);
    tdm_profile_reset();
    tdm_obs_set_clock(NULL);
    return 0;
}

static void test_disabled_reads_no_clock(void **state)
{
    for (int i = 0; i < 1000; i++) {
        tdm_prof_t t = tdm_profile_begin(TDM_PHASE_LOCK_ACQ);
        assert_true(t == TDM_PROF_OFF);
        tdm_profile_end(TDM_PHASE_LOCK_ACQ, t);
        tdm_profile_add(TDM_PHASE_LEDGER_WR, 5);
    }
    assert_int_equal(atomic_load(&reads), 0);
    tdm_phase_stats s[TDM_PHASE_COUNT];
    tdm_profile_snapshot(s);
    for (int i = 0; i < TDM_PHASE_COUNT; i++)
        assert_int_equal(s[i].count, 0);
}

static void test_enabled_reads_two_per_phase(void **state)
{
    tdm_profile_enable(true);
    for (int i = 0; i < 1000; i++) {
        tdm_prof_t t = tdm_profile_begin(TDM_PHASE_LOCK_ACQ);
        tdm_profile_end(TDM_PHASE_LOCK_ACQ, t);
    }
    assert_int_equal(atomic_load(&reads), 2000);
    tdm_phase_stats s[TDM_PHASE_COUNT];
    tdm_profile_snapshot(s);
    assert_int_equal(s[TDM_PHASE_LOCK_ACQ].count, 1000);
    assert_int_equal(s[TDM_PHASE_LOCK_ACQ].total_ns, 1000 * 10);
    assert_int_equal(s[TDM_PHASE_LOCK_ACQ].mean_ns, 10);
    assert_int_equal(s[TDM_PHASE_LOCK_ACQ].max_ns, 10);
    assert_int_equal(s[TDM_PHASE_LEDGER_RD].count, 0);
}

static void test_mean_and_max(void **state)
{
    tdm_profile_enable(true);
    int64_t durs[] = {100, 700, 200};
    for (size_t i = 0; i < 3; i++) {
        step = durs[i];
        tdm_prof_t t = tdm_profile_begin(TDM_PHASE_VRAM_QRY);
        tdm_profile_end(TDM_PHASE_VRAM_QRY, t);
    }
    tdm_phase_stats s[TDM_PHASE_COUNT];
    tdm_profile_snapshot(s);
    assert_int_equal(s[TDM_PHASE_VRAM_QRY].count, 3);
    assert_int_equal(s[TDM_PHASE_VRAM_QRY].total_ns, 1000);
    assert_int_equal(s[TDM_PHASE_VRAM_QRY].mean_ns, 333);
    assert_int_equal(s[TDM_PHASE_VRAM_QRY].max_ns, 700);
    tdm_profile_reset();
    tdm_profile_snapshot(s);
    assert_int_equal(s[TDM_PHASE_VRAM_QRY].count, 0);
    assert_int_equal(s[TDM_PHASE_VRAM_QRY].max_ns, 0);
}

static void test_toggle_between_begin_and_end(void **state)
{
    /* Off at begin, on at end: nothing recorded, no clock read. */
    tdm_prof_t t = tdm_profile_begin(TDM_PHASE_LOCK_REL);
    tdm_profile_enable(true);
    tdm_profile_end(TDM_PHASE_LOCK_REL, t);
    assert_int_equal(atomic_load(&reads), 0);
    /* On at begin, off at end: nothing recorded, only the begin read. */
    t = tdm_profile_begin(TDM_PHASE_LOCK_REL);
    tdm_profile_enable(false);
    tdm_profile_end(TDM_PHASE_LOCK_REL, t);
    assert_int_equal(atomic_load(&reads), 1);
    tdm_phase_stats s[TDM_PHASE_COUNT];
    tdm_profile_snapshot(s);
    assert_int_equal(s[TDM_PHASE_LOCK_REL].count, 0);
    /* Out-of-range phases are ignored. */
    tdm_profile_enable(true);
    assert_true(tdm_profile_begin((tdm_phase)99) == TDM_PROF_OFF);
    tdm_profile_add((tdm_phase)-1, 5);
    assert_string_equal(tdm_phase_name((tdm_phase)99), "?");
}

static void test_phase_table(void **state)
{
    assert_int_equal(TDM_PHASE_COUNT, 6);
    const char *want[] = {"lock_acq", "ledger_rd", "vram_qry", "ledger_wr", "lock_rel", "wait_poll"};
    for (int i = 0; i < TDM_PHASE_COUNT; i++) {
        assert_string_equal(tdm_phase_name((tdm_phase)i), want[i]);
        assert_true(strlen(tdm_phase_span_name((tdm_phase)i)) > 0);
        tdm_phase_kind k = tdm_phase_kind_of((tdm_phase)i);
        assert_int_equal(k, i == TDM_PHASE_WAIT_POLL ? TDM_PHASE_WAIT : TDM_PHASE_SHARING);
    }
    assert_string_equal(tdm_phase_span_name(TDM_PHASE_VRAM_QRY), "VramQuery");
    assert_string_equal(tdm_phase_span_name(TDM_PHASE_WAIT_POLL), "WaitPoll");
}

static void test_overhead_excludes_wait_and_flags_above_limit(void **state)
{
    tdm_profile_enable(true);
    const int64_t wall = 1000000000; /* 1 s */
    tdm_profile_add(TDM_PHASE_LOCK_ACQ, 20000000);  /* 20 ms */
    tdm_profile_add(TDM_PHASE_LEDGER_RD, 10000000); /* 10 ms */
    tdm_profile_add(TDM_PHASE_WAIT_POLL, 800000000); /* 800 ms of waiting: not overhead */
    tdm_profile_summary sum;
    tdm_profile_summarize(wall, &sum);
    assert_int_equal(sum.overhead_ns, 30000000);
    assert_int_equal(sum.wait_ns, 800000000);
    assert_true(sum.overhead_share > 0.0299 && sum.overhead_share < 0.0301);
    assert_false(sum.over_limit);
    /* Exactly 5 % is not above the limit; 5 % + 1 ns is. */
    tdm_profile_add(TDM_PHASE_LEDGER_WR, 20000000);
    tdm_profile_summarize(wall, &sum);
    assert_int_equal(sum.overhead_ns, 50000000);
    assert_false(sum.over_limit);
    tdm_profile_add(TDM_PHASE_LOCK_REL, 1);
    tdm_profile_summarize(wall, &sum);
    assert_true(sum.over_limit);
    /* No wall time: no share, no flag. */
    tdm_profile_summarize(0, &sum);
    assert_true(sum.overhead_share == 0.0);
    assert_false(sum.over_limit);
}

static char *report_text(int64_t wall)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    tdm_error err = {0};
    assert_int_equal(tdm_profile_report(f, wall, &err), TDM_OK);
    fclose(f);
    return buf;
}

static void test_report_text(void **state)
{
    tdm_profile_enable(true);
    tdm_profile_add(TDM_PHASE_LOCK_ACQ, 1000000);  /* 1 ms */
    tdm_profile_add(TDM_PHASE_LOCK_ACQ, 3000000);  /* 3 ms */
    tdm_profile_add(TDM_PHASE_WAIT_POLL, 5000000); /* 5 ms */
    char *text = report_text(1000000000);
    assert_non_null(strstr(text, "job wall time 1.000 s"));
    assert_non_null(strstr(text, "lock_acq            2        4.000     2000.000     3000.000"));
    assert_non_null(strstr(text, "waiting for memory, not overhead"));
    assert_non_null(strstr(text, "sharing overhead: 4.000 ms = 0.400 % of wall time (limit 5 %)\n"));
    assert_null(strstr(text, "ABOVE"));
    free(text);

    text = report_text(50000000); /* 4 ms of 50 ms = 8 % */
    assert_non_null(strstr(text, "= 8.000 % of wall time (limit 5 %): ABOVE the limit\n"));
    free(text);

    text = report_text(0);
    assert_non_null(strstr(text, "n/a"));
    free(text);

    /* A stream that cannot be written is an I/O error, not a silent loss. */
    FILE *ro = fopen("/dev/null", "r");
    assert_non_null(ro);
    tdm_error err = {0};
    assert_int_equal(tdm_profile_report(ro, 1, &err), TDM_ERR_IO);
    fclose(ro);
}

static void test_report_json(void **state)
{
    tdm_profile_enable(true);
    tdm_profile_add(TDM_PHASE_VRAM_QRY, 300);
    tdm_profile_add(TDM_PHASE_VRAM_QRY, 100);
    json_t *j = tdm_profile_report_json(10000);
    assert_non_null(j);
    assert_int_equal(json_integer_value(json_object_get(j, "job_wall_ns")), 10000);
    assert_int_equal(json_integer_value(json_object_get(j, "overhead_ns")), 400);
    assert_true(json_is_false(json_object_get(j, "over_limit"))); /* 4 % */
    double share = json_real_value(json_object_get(j, "overhead_share"));
    assert_true(share > 0.0399 && share < 0.0401);
    assert_true(json_real_value(json_object_get(j, "overhead_limit")) == 0.05);
    json_t *phases = json_object_get(j, "phases");
    assert_int_equal(json_array_size(phases), TDM_PHASE_COUNT);
    json_t *q = json_array_get(phases, TDM_PHASE_VRAM_QRY);
    assert_string_equal(json_string_value(json_object_get(q, "name")), "vram_qry");
    assert_string_equal(json_string_value(json_object_get(q, "kind")), "sharing");
    assert_int_equal(json_integer_value(json_object_get(q, "count")), 2);
    assert_int_equal(json_integer_value(json_object_get(q, "mean_ns")), 200);
    assert_int_equal(json_integer_value(json_object_get(q, "max_ns")), 300);
    json_t *w = json_array_get(phases, TDM_PHASE_WAIT_POLL);
    assert_string_equal(json_string_value(json_object_get(w, "kind")), "wait");
    json_decref(j);
    j = tdm_profile_report_json(5000); /* 8 % */
    assert_true(json_is_true(json_object_get(j, "over_limit")));
    json_decref(j);
}

#define THREADS 4
#define PER_THREAD 20000

static void *worker(void *arg)
{
    (void)arg;
    for (int i = 0; i < PER_THREAD; i++) {
        tdm_prof_t t = tdm_profile_begin(TDM_PHASE_LEDGER_RD);
        tdm_profile_end(TDM_PHASE_LEDGER_RD, t);
        tdm_profile_add(TDM_PHASE_LEDGER_WR, i % 97);
    }
    return NULL;
}

static void test_concurrent_recording_loses_nothing(void **state)
{
    tdm_profile_enable(true);
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, worker, NULL), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    tdm_phase_stats s[TDM_PHASE_COUNT];
    tdm_profile_snapshot(s);
    assert_int_equal(s[TDM_PHASE_LEDGER_RD].count, THREADS * PER_THREAD);
    assert_int_equal(atomic_load(&reads), 2 * THREADS * PER_THREAD);
    int64_t want = 0;
    for (int i = 0; i < PER_THREAD; i++)
        want += i % 97;
    assert_int_equal(s[TDM_PHASE_LEDGER_WR].count, THREADS * PER_THREAD);
    assert_int_equal(s[TDM_PHASE_LEDGER_WR].total_ns, THREADS * want);
    assert_int_equal(s[TDM_PHASE_LEDGER_WR].max_ns, 96);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_disabled_reads_no_clock, setup, teardown),
        cmocka_unit_test_setup_teardown(test_enabled_reads_two_per_phase, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mean_and_max, setup, teardown),
        cmocka_unit_test_setup_teardown(test_toggle_between_begin_and_end, setup, teardown),
        cmocka_unit_test_setup_teardown(test_phase_table, setup, teardown),
        cmocka_unit_test_setup_teardown(test_overhead_excludes_wait_and_flags_above_limit, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_report_text, setup, teardown),
        cmocka_unit_test_setup_teardown(test_report_json, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_recording_loses_nothing, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
