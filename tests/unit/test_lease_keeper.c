/* test_lease_keeper — the background keeper of a run's reservation (src/gpu/lease_keeper.c):
 * after the ledger is quarantined as corrupt, the reservation is back within seconds (not at the
 * next renewal, 300 s later), and the lease is renewed while the run lasts. A simulated GPU
 * (TANDEM_FAKE_GPUS) and a private ledger directory; the keeper's real thread and inotify. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "gpu/lease_keeper.h"
#include "gpu/ledger.h"
#include "gpu/reservation.h"
#include "util/atomic_file.h"
#include "util/error.h"

static char root[] = "/tmp/tandem-lease-keeper-XXXXXX";
static char dir[300]; /* this test's ledger directory: a quarantine holds admissions for a while */

static void use_dir(const char *name)
{
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    setenv("TANDEM_LEDGER_DIR", dir, 1);
}

static void quiet(const char *msg, void *user)
{
    (void)msg;
    (void)user;
}

/* Our reservation as the ledger holds it now; false when it is not there. */
static bool our_reservation(tdm_reservation *out)
{
    tdm_ledger l;
    tdm_ledger_state s;
    tdm_error err = {0};
    if (tdm_ledger_open(&l, dir, &err) != TDM_OK) return false;
    if (tdm_ledger_snapshot(&l, &s, &err) != TDM_OK) return false;
    bool found = false;
    for (size_t r = 0; r < s.n_reservations && !found; r++)
        for (int h = 0; h < s.reservations[r].n_holders; h++)
            if ((pid_t)s.reservations[r].holders[h].pid == getpid()) {
                *out = s.reservations[r];
                found = true;
            }
    tdm_ledger_state_free(&s);
    return found;
}

static tdm_lease take_lease(void)
{
    tdm_lease lease;
    tdm_acquire_opts o = tdm_acquire_defaults();
    o.budget_mb = 1000;
    o.task = "keeper-test";
    o.wait = false;
    tdm_error err = {0};
    assert_int_equal(tdm_reservation_acquire(&lease, &o, &err), TDM_OK);
    return lease;
}

/* Seconds (at most limit) until our reservation is in the ledger again; -1 if never. */
static double wait_back(double limit)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    tdm_reservation r;
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        double s = (double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) / 1e9;
        if (s > limit) return -1;
        if (our_reservation(&r)) return s;
        usleep(50 * 1000);
    }
}

static void corrupt_ledger(void)
{
    char path[400];
    snprintf(path, sizeof path, "%s/gpu-ledger.json", dir);
    tdm_error err = {0};
    assert_int_equal(tdm_atomic_write(path, "garbage", 7, 0600, &err), TDM_OK);
    /* the next reader quarantines it and writes a fresh ledger without us */
    tdm_reservation r;
    tdm_set_warn_sink(quiet, NULL);
    assert_false(our_reservation(&r));
    tdm_set_warn_sink(NULL, NULL);
}

static void test_reregisters_after_quarantine(void **state)
{
    (void)state;
    use_dir("reregister");
    unsetenv("TANDEM_RENEW_SEC");
    tdm_lease lease = take_lease();
    tdm_lease_keeper *k = NULL;
    tdm_error err = {0};
    assert_int_equal(tdm_lease_keeper_start(&k, &lease, &err), TDM_OK);
    tdm_reservation r;
    assert_true(our_reservation(&r));
    corrupt_ledger();
    double s = wait_back(5.0);
    assert_true(s >= 0); /* without the keeper: back only at the renewal, 300 s later */
    assert_true(our_reservation(&r));
    assert_int_equal(r.budget_mb, 1000);
    assert_int_equal(tdm_lease_keeper_update_actual(k, 640, &err), TDM_OK);
    assert_true(our_reservation(&r));
    assert_int_equal(r.actual_mb, 640);
    tdm_lease_keeper_stop(k);
    assert_int_equal(tdm_reservation_release(&lease, &err), TDM_OK);
    assert_false(our_reservation(&r));
}

/* Without a keeper the same quarantine leaves the ledger without us: the test above can fail. */
static void test_without_keeper_stays_forgotten(void **state)
{
    (void)state;
    use_dir("no-keeper");
    unsetenv("TANDEM_RENEW_SEC");
    tdm_lease lease = take_lease();
    corrupt_ledger();
    assert_true(wait_back(1.5) < 0);
    tdm_error err = {0};
    assert_int_equal(tdm_reservation_release(&lease, &err), TDM_OK);
}

static void test_renews_while_running(void **state)
{
    (void)state;
    use_dir("renew");
    setenv("TANDEM_RENEW_SEC", "1", 1);
    tdm_lease lease = take_lease();
    tdm_reservation before, after;
    assert_true(our_reservation(&before));
    tdm_lease_keeper *k = NULL;
    tdm_error err = {0};
    assert_int_equal(tdm_lease_keeper_start(&k, &lease, &err), TDM_OK);
    sleep(3);
    assert_true(our_reservation(&after));
    assert_true(after.lease_expires > before.lease_expires);
    tdm_lease_keeper_stop(k);
    assert_int_equal(tdm_reservation_release(&lease, &err), TDM_OK);
    unsetenv("TANDEM_RENEW_SEC");
}

static int setup(void **state)
{
    (void)state;
    if (!mkdtemp(root)) return -1;
    setenv("TANDEM_FAKE_GPUS", "uuid=GPU-keeper-0,name=Sim,total_mb=10000,memory=discrete", 1);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reregisters_after_quarantine),
        cmocka_unit_test(test_without_keeper_stays_forgotten),
        cmocka_unit_test(test_renews_while_running),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
