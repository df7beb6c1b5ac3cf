/* Unit tests of the ledger (format, pruning, protocol), the guard's arithmetic and queue order. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <glob.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu/guard.h"
#include "gpu/ledger.h"
#include "gpu/wait_queue.h"
#include "util/atomic_file.h"

static char dir[256];

static int setup(void **state)
{
    snprintf(dir, sizeof dir, "/tmp/tandem-test-ledger-XXXXXX");
    assert_non_null(mkdtemp(dir));
    return 0;
}

static int teardown(void **state)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static tdm_reservation make_res(const char *id, const char *gpu, int64_t budget, int64_t actual,
                                pid_t pid)
{
    tdm_reservation r = {0};
    snprintf(r.id, sizeof r.id, "%s", id);
    r.holders[0] = tdm_holder_of(pid);
    r.n_holders = 1;
    snprintf(r.user, sizeof r.user, "u");
    snprintf(r.host, sizeof r.host, "%s", tdm_host_name());
    snprintf(r.gpu_uuid, sizeof r.gpu_uuid, "%s", gpu);
    r.budget_mb = budget;
    r.actual_mb = actual;
    snprintf(r.task, sizeof r.task, "t-%s", id);
    r.started = time(NULL);
    r.lease_expires = time(NULL) + 3600;
    return r;
}

static tdm_ticket make_ticket(int64_t n, const char *gpu, int64_t budget)
{
    tdm_ticket t = {0};
    t.ticket = n;
    t.holders[0] = tdm_holder_of(getpid());
    t.n_holders = 1;
    snprintf(t.user, sizeof t.user, "u");
    snprintf(t.host, sizeof t.host, "%s", tdm_host_name());
    snprintf(t.gpu_uuid, sizeof t.gpu_uuid, "%s", gpu);
    t.budget_mb = budget;
    t.enqueued = time(NULL);
    t.lease_expires = time(NULL) + 3600;
    return t;
}

static tdm_gpu make_gpu(const char *uuid, int64_t total, int64_t used, tdm_memory_type type)
{
    tdm_gpu g = {0};
    snprintf(g.uuid, sizeof g.uuid, "%s", uuid);
    snprintf(g.name, sizeof g.name, "sim");
    g.total_mb = total;
    g.used_mb = used;
    g.free_mb = total - used;
    g.memory_type = type;
    g.compute_mode = -1;
    return g;
}

static void test_json_roundtrip(void **state)
{
    tdm_ledger_state s, back;
    tdm_error err = {0};
    tdm_ledger_state_init(&s);
    tdm_reservation r = make_res("r1", "GPU-a", 8192, -1, getpid());
    assert_int_equal(tdm_ledger_state_add_reservation(&s, &r, &err), TDM_OK);
    r = make_res("r2", "GPU-a", 1024, 900, getpid());
    assert_int_equal(tdm_ledger_state_add_reservation(&s, &r, &err), TDM_OK);
    tdm_ticket t = make_ticket(5, "", 4096);
    assert_int_equal(tdm_ledger_state_add_ticket(&s, &t, &err), TDM_OK);
    t = make_ticket(3, "GPU-a", 2048);
    assert_int_equal(tdm_ledger_state_add_ticket(&s, &t, &err), TDM_OK);
    assert_int_equal(s.queue[0].ticket, 3); /* kept sorted */
    assert_int_equal(s.next_ticket, 6);
    char *json = tdm_ledger_state_to_json(&s);
    assert_non_null(json);
    assert_int_equal(tdm_ledger_state_from_json(json, strlen(json), &back, &err), TDM_OK);
    assert_int_equal(back.n_reservations, 2);
    assert_int_equal(back.n_queue, 2);
    assert_string_equal(back.reservations[0].id, "r1");
    assert_int_equal(back.reservations[0].actual_mb, -1);
    assert_int_equal(back.reservations[1].actual_mb, 900);
    assert_int_equal(back.reservations[0].holders[0].start_time, r.holders[0].start_time);
    assert_string_equal(back.queue[1].gpu_uuid, "");
    assert_int_equal(back.next_ticket, 6);
    assert_int_equal(back.reservations[0].lease_expires, s.reservations[0].lease_expires);
    free(json);
    tdm_ledger_state_free(&s);
    tdm_ledger_state_free(&back);
}

static void test_json_rejects_malformed(void **state)
{
    const char *bad[] = {
        "{",
        "[]",
        "{\"version\": 2, \"next_ticket\": 1, \"reservations\": [], \"queue\": []}",
        "{\"version\": 1, \"next_ticket\": 1, \"reservations\": {}, \"queue\": []}",
        "{\"version\": 1, \"next_ticket\": 1, \"reservations\": [{\"id\": 3}], \"queue\": []}",
        "{\"version\": 1, \"version\": 1, \"next_ticket\": 1, \"reservations\": [], \"queue\": []}",
        "{\"version\": 1, \"next_ticket\": 1, \"reservations\": [], \"queue\": [{\"ticket\": 4, "
        "\"holders\": [{\"pid\": 1, \"start_time\": 1}], \"user\": \"u\", \"host\": \"h\", "
        "\"gpu_uuid\": null, \"budget_mb\": 1, \"task\": \"t\", \"enqueued\": "
        "\"2026-01-01T00:00:00Z\", \"lease_expires\": \"2026-01-01T00:00:00Z\"}]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        tdm_ledger_state s;
        tdm_error err = {0};
        assert_int_equal(tdm_ledger_state_from_json(bad[i], strlen(bad[i]), &s, &err),
                         TDM_ERR_CORRUPT);
        assert_true(strlen(err.message) > 0);
        tdm_ledger_state_free(&s);
    }
    tdm_ledger_state s;
    tdm_error err = {0};
    tdm_ledger_state_from_json("{\n  \"version\": 1,\n  oops\n}", 26, &s, &err);
    assert_non_null(strstr(err.message, "line 3"));
}

/* A pid that has exited, a pid whose start time does not match (recycled) and an expired lease are
 * pruned; a live holder and another host's unexpired entry are kept. */
static void test_prune(void **state)
{
    pid_t child = fork();
    if (child == 0)
        _exit(0);
    tdm_holder dead = tdm_holder_of(child); /* taken while it may still be a zombie */
    waitpid(child, NULL, 0);
    dead.start_time = dead.start_time ? dead.start_time : 1;

    tdm_ledger_state s;
    tdm_error err = {0};
    tdm_ledger_state_init(&s);
    tdm_reservation live = make_res("live", "GPU-a", 1, -1, getpid());
    tdm_reservation gone = make_res("dead", "GPU-a", 1, -1, getpid());
    gone.holders[0] = dead;
    tdm_reservation recycled = make_res("recycled", "GPU-a", 1, -1, getpid());
    recycled.holders[0].start_time += 12345; /* same pid, another process */
    tdm_reservation expired = make_res("expired", "GPU-a", 1, -1, getpid());
    expired.lease_expires = time(NULL) - 1;
    tdm_reservation remote = make_res("remote", "GPU-a", 1, -1, getpid());
    snprintf(remote.host, sizeof remote.host, "another-host");
    remote.holders[0].start_time += 1; /* its pids mean nothing here */
    tdm_reservation two = make_res("two-holders", "GPU-a", 1, -1, getpid());
    two.holders[1] = dead;
    two.n_holders = 2;
    tdm_reservation all[] = {live, gone, recycled, expired, remote, two};
    for (size_t i = 0; i < 6; i++)
        assert_int_equal(tdm_ledger_state_add_reservation(&s, &all[i], &err), TDM_OK);
    tdm_ticket t = make_ticket(1, "", 1);
    t.holders[0] = dead;
    tdm_ledger_state_add_ticket(&s, &t, &err);
    t = make_ticket(2, "", 1);
    tdm_ledger_state_add_ticket(&s, &t, &err);

    assert_int_equal(tdm_ledger_state_prune(&s, time(NULL), tdm_host_name()), 4);
    assert_int_equal(s.n_reservations, 3);
    assert_string_equal(s.reservations[0].id, "live");
    assert_string_equal(s.reservations[1].id, "remote");
    assert_string_equal(s.reservations[2].id, "two-holders");
    assert_int_equal(s.n_queue, 1);
    assert_int_equal(s.queue[0].ticket, 2);
    tdm_ledger_state_free(&s);
}

static void test_guard_arithmetic(void **state)
{
    unsetenv("TANDEM_RESERVE_FACTOR");
    tdm_gpu g = make_gpu("GPU-a", 24564, 0, TDM_MEMORY_DISCRETE);
    tdm_ledger_state s;
    tdm_error err = {0};
    tdm_ledger_state_init(&s);
    tdm_guard_view v;
    tdm_guard_view_of(&g, &s, &v);
    assert_int_equal(v.capacity_mb, 20879); /* floor(24564 * 0.85) */
    assert_true(tdm_guard_fits(&v, 20879));
    assert_false(tdm_guard_fits(&v, 20880));
    assert_true(tdm_guard_could_ever_fit(&g, 20879));
    assert_false(tdm_guard_could_ever_fit(&g, 20880));

    /* max(budget, actual): an over-budget job counts at its actual size. */
    tdm_reservation r = make_res("a", "GPU-a", 8000, 10000, getpid());
    tdm_ledger_state_add_reservation(&s, &r, &err);
    r = make_res("b", "GPU-a", 4000, -1, getpid());
    tdm_ledger_state_add_reservation(&s, &r, &err);
    r = make_res("other-gpu", "GPU-b", 9999, -1, getpid());
    tdm_ledger_state_add_reservation(&s, &r, &err);
    g.used_mb = 10000; /* the over-budget job's memory is really used */
    g.free_mb = g.total_mb - g.used_mb;
    tdm_guard_view_of(&g, &s, &v);
    assert_int_equal(v.committed_mb, 14000);
    assert_int_equal(v.pending_mb, 4000); /* b has not allocated yet; a has more than its budget */
    assert_int_equal(v.available_mb, 20879 - 14000);
    assert_true(tdm_guard_fits(&v, 6879));
    assert_false(tdm_guard_fits(&v, 6880));

    /* Memory held by a program that never asked the ledger limits admission. */
    g.used_mb = 18000;
    g.free_mb = g.total_mb - g.used_mb; /* 6564 free, 4000 pending -> 2564 */
    tdm_guard_view_of(&g, &s, &v);
    assert_int_equal(v.available_mb, 2564);
    assert_true(tdm_guard_fits(&v, 2564));
    assert_false(tdm_guard_fits(&v, 2565));

    /* Unified memory and the override. */
    tdm_gpu u = make_gpu("GPU-u", 8192, 0, TDM_MEMORY_UNIFIED);
    tdm_ledger_state empty;
    tdm_ledger_state_init(&empty);
    tdm_guard_view_of(&u, &empty, &v);
    assert_int_equal(v.capacity_mb, 4915); /* floor(8192 * 0.60) */
    setenv("TANDEM_RESERVE_FACTOR", "0.5", 1);
    tdm_guard_view_of(&u, &empty, &v);
    assert_int_equal(v.capacity_mb, 4096);
    setenv("TANDEM_RESERVE_FACTOR", "1.5", 1); /* out of range: ignored */
    tdm_guard_view_of(&u, &empty, &v);
    assert_int_equal(v.capacity_mb, 4915);
    unsetenv("TANDEM_RESERVE_FACTOR");
    tdm_ledger_state_free(&s);
}

static void test_queue_order(void **state)
{
    tdm_gpu gpus[2] = {make_gpu("GPU-a", 10000, 0, TDM_MEMORY_DISCRETE),
                       make_gpu("GPU-b", 4000, 0, TDM_MEMORY_DISCRETE)};
    gpus[1].index = 1;
    tdm_inventory inv = {.gpus = gpus, .n_gpus = 2, .source = "fake"};
    tdm_ledger_state s;
    tdm_error err = {0};
    tdm_ledger_state_init(&s);
    /* GPU-a is 8000 MiB committed: 500 MiB left (capacity 8500). */
    tdm_reservation r = make_res("big", "GPU-a", 8000, -1, getpid());
    tdm_ledger_state_add_reservation(&s, &r, &err);
    /* Ticket 1 waits for 6000 on any GPU: only GPU-a could ever hold it. */
    tdm_ticket t = make_ticket(1, "", 6000);
    tdm_ledger_state_add_ticket(&s, &t, &err);
    /* A newcomer of 100 MiB must not jump ahead on GPU-a, but may use GPU-b (not in line there,
     * since ticket 1 could never fit on GPU-b). */
    assert_int_equal(tdm_queue_ahead(&s, INT64_MAX, &gpus[0]), 1);
    assert_int_equal(tdm_queue_ahead(&s, INT64_MAX, &gpus[1]), 0);
    assert_int_equal(tdm_queue_choose_gpu(&inv, &s, INT64_MAX, NULL, 100), 1);
    assert_int_equal(tdm_queue_choose_gpu(&inv, &s, INT64_MAX, "GPU-a", 100), -1);
    /* Ticket 1 itself is at the head but does not fit yet. */
    assert_int_equal(tdm_queue_ahead(&s, 1, &gpus[0]), 0);
    assert_int_equal(tdm_queue_choose_gpu(&inv, &s, 1, NULL, 6000), -1);
    /* Once "big" is released it fits on GPU-a. */
    tdm_ledger_state_remove_reservation(&s, "big");
    assert_int_equal(tdm_queue_choose_gpu(&inv, &s, 1, NULL, 6000), 0);
    /* Pinned tickets hold only their own GPU's line. */
    t = make_ticket(2, "GPU-b", 100);
    tdm_ledger_state_add_ticket(&s, &t, &err);
    assert_int_equal(tdm_queue_ahead(&s, INT64_MAX, &gpus[0]), 1);
    assert_int_equal(tdm_queue_ahead(&s, INT64_MAX, &gpus[1]), 1);
    assert_int_equal(tdm_queue_ahead(&s, 2, &gpus[1]), 0);
    /* The choice prefers the GPU with the most room left. */
    tdm_ledger_state_free(&s);
    tdm_ledger_state_init(&s);
    assert_int_equal(tdm_queue_choose_gpu(&inv, &s, INT64_MAX, NULL, 100), 0);
    tdm_ledger_state_free(&s);
}

static tdm_status add_one(tdm_ledger_state *s, bool *changed, void *user, tdm_error *err)
{
    tdm_reservation r = make_res((const char *)user, "GPU-a", 1, -1, getpid());
    *changed = true;
    return tdm_ledger_state_add_reservation(s, &r, err);
}

/* Concurrent writers through the real protocol: 8 processes x 25 transactions, all holders alive
 * until the end; every single reservation must be in the final ledger (no lost update). */
static void test_no_lost_updates_under_contention(void **state)
{
    char d[300];
    snprintf(d, sizeof d, "%s/contention", dir);
    enum { PROCS = 8, EACH = 25 };
    int go[2];
    assert_int_equal(pipe(go), 0);
    pid_t kids[PROCS];
    for (int p = 0; p < PROCS; p++) {
        kids[p] = fork();
        if (kids[p] == 0) {
            close(go[1]);
            char c;
            if (read(go[0], &c, 1) != 0)
                _exit(3);
            tdm_ledger l;
            tdm_error err = {0};
            if (tdm_ledger_open(&l, d, &err) != TDM_OK)
                _exit(1);
            for (int i = 0; i < EACH; i++) {
                char id[64];
                snprintf(id, sizeof id, "p%d-%d", p, i);
                if (tdm_ledger_transact(&l, add_one, id, &err) != TDM_OK)
                    _exit(2);
            }
            pause(); /* stay alive so the reservations are not pruned */
            _exit(0);
        }
    }
    close(go[0]);
    close(go[1]); /* all start together */
    /* Wait until every child has done its work: poll the ledger's size. */
    tdm_ledger l;
    tdm_error err = {0};
    assert_int_equal(tdm_ledger_open(&l, d, &err), TDM_OK);
    tdm_ledger_state s;
    size_t n = 0;
    for (int tries = 0; tries < 600 && n < PROCS * EACH; tries++) {
        usleep(50000);
        tdm_ledger_state_init(&s);
        assert_int_equal(tdm_ledger_snapshot(&l, &s, &err), TDM_OK);
        n = s.n_reservations;
        tdm_ledger_state_free(&s);
    }
    assert_int_equal(n, PROCS * EACH);
    for (int p = 0; p < PROCS; p++) {
        kill(kids[p], SIGKILL);
        waitpid(kids[p], NULL, 0);
    }
    /* Now every holder is dead: one transaction prunes them all. */
    assert_int_equal(tdm_ledger_transact(&l, NULL, NULL, &err), TDM_OK);
    tdm_ledger_state_init(&s);
    assert_int_equal(tdm_ledger_snapshot(&l, &s, &err), TDM_OK);
    assert_int_equal(s.n_reservations, 0);
    tdm_ledger_state_free(&s);
}

static void capture_warning(const char *msg, void *user)
{
    snprintf((char *)user, 1024, "%s", msg);
}

static void test_corrupt_ledger_moved_aside(void **state)
{
    char d[300], path[400];
    snprintf(d, sizeof d, "%s/corrupt", dir);
    tdm_ledger l;
    tdm_error err = {0};
    assert_int_equal(tdm_ledger_open(&l, d, &err), TDM_OK);
    snprintf(path, sizeof path, "%s/gpu-ledger.json", d);
    assert_int_equal(tdm_atomic_write(path, "{\"version\": 1, garbage", 22, 0600, &err), TDM_OK);
    char warning[1024] = "";
    tdm_set_warn_sink(capture_warning, warning);
    assert_int_equal(tdm_ledger_transact(&l, add_one, "after-corruption", &err), TDM_OK);
    tdm_set_warn_sink(NULL, NULL);
    assert_non_null(strstr(warning, "moved aside"));
    char pattern[450];
    snprintf(pattern, sizeof pattern, "%s.corrupt-*", path);
    glob_t g;
    assert_int_equal(glob(pattern, 0, NULL, &g), 0);
    assert_int_equal(g.gl_pathc, 1);
    char *kept;
    assert_int_equal(tdm_read_file(g.gl_pathv[0], &kept, NULL, &err), TDM_OK);
    assert_string_equal(kept, "{\"version\": 1, garbage"); /* nothing lost */
    assert_non_null(strstr(warning, g.gl_pathv[0]));
    free(kept);
    globfree(&g);
    tdm_ledger_state s;
    assert_int_equal(tdm_ledger_snapshot(&l, &s, &err), TDM_OK);
    assert_int_equal(s.n_reservations, 1);
    tdm_ledger_state_free(&s);
}

static void test_failing_write_keeps_ledger(void **state)
{
    char d[300];
    snprintf(d, sizeof d, "%s/failwrite", dir);
    tdm_ledger l;
    tdm_error err = {0};
    assert_int_equal(tdm_ledger_open(&l, d, &err), TDM_OK);
    assert_int_equal(tdm_ledger_transact(&l, add_one, "first", &err), TDM_OK);
    setenv("TANDEM_FAULT_INJECT", "atomic_write.fsync", 1);
    assert_int_equal(tdm_ledger_transact(&l, add_one, "second", &err), TDM_ERR_IO);
    unsetenv("TANDEM_FAULT_INJECT");
    assert_non_null(strstr(err.message, "cannot update the GPU ledger"));
    tdm_ledger_state s;
    assert_int_equal(tdm_ledger_snapshot(&l, &s, &err), TDM_OK);
    assert_int_equal(s.n_reservations, 1);
    assert_string_equal(s.reservations[0].id, "first");
    tdm_ledger_state_free(&s);
}

static void test_symlinks_refused_and_dir_mode(void **state)
{
    char d[300], link[300];
    snprintf(d, sizeof d, "%s/fresh/nested", dir);
    tdm_ledger l;
    tdm_error err = {0};
    assert_int_equal(tdm_ledger_open(&l, d, &err), TDM_OK);
    struct stat st;
    assert_int_equal(stat(d, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    snprintf(link, sizeof link, "%s/link", dir);
    assert_int_equal(symlink(d, link), 0);
    assert_int_equal(tdm_ledger_open(&l, link, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.message, "symbolic link"));
    /* A symlinked data file is refused too. */
    char data[400];
    snprintf(data, sizeof data, "%s/gpu-ledger.json", d);
    assert_int_equal(symlink("/etc/passwd", data), 0);
    assert_int_equal(tdm_ledger_open(&l, d, &err), TDM_ERR_INVALID);
}

/* Item 5 of issue 13: a crafted ledger's numbers are bounded on read and summed with saturation.
 * Two budgets of 2^62, fully allocated, used to wrap the committed total negative and admit. */
static void test_hostile_budgets_cannot_wrap(void **state)
{
    unsetenv("TANDEM_RESERVE_FACTOR");
    char json[2048];
    const char *lease = "2999-01-01T00:00:00Z";
    snprintf(json, sizeof json,
             "{\"version\": 1, \"next_ticket\": 1, \"queue\": [], \"reservations\": ["
             "{\"id\": \"a\", \"holders\": [{\"pid\": %d, \"start_time\": 1}], \"user\": \"u\", "
             "\"host\": \"h\", \"gpu_uuid\": \"GPU-a\", \"budget_mb\": 4611686018427387904, "
             "\"actual_mb\": 4611686018427387904, \"task\": \"t\", \"started\": \"%s\", "
             "\"lease_expires\": \"%s\"}]}",
             (int)getpid(), lease, lease);
    tdm_ledger_state s;
    tdm_error err = {0};
    assert_int_equal(tdm_ledger_state_from_json(json, strlen(json), &s, &err), TDM_OK);
    assert_int_equal(s.reservations[0].budget_mb, TDM_LEDGER_MAX_MB);
    assert_int_equal(s.reservations[0].actual_mb, TDM_LEDGER_MAX_MB);
    tdm_ledger_state_free(&s);

    /* The guard on its own (a state built in memory, not read): each value counts as at most the
     * GPU's total, the sums saturate, nothing fits. */
    tdm_ledger_state_init(&s);
    for (int i = 0; i < 3; i++) {
        tdm_reservation r =
            make_res(i ? "b" : "a", "GPU-a", INT64_MAX / 2 + 1, INT64_MAX / 2 + 1, getpid());
        assert_int_equal(tdm_ledger_state_add_reservation(&s, &r, &err), TDM_OK);
    }
    tdm_gpu g = make_gpu("GPU-a", 10000, 0, TDM_MEMORY_DISCRETE);
    tdm_guard_view v;
    tdm_guard_view_of(&g, &s, &v);
    assert_int_equal(v.committed_mb, 30000);
    assert_int_equal(v.available_mb, 0);
    assert_false(tdm_guard_fits(&v, 1));
    assert_false(tdm_guard_fits(&v, INT64_MAX));
    tdm_ledger_state_free(&s);
}

/* Ticket numbers stay below 2^53: next_ticket 2^63-1 is refused on read (it used to be accepted,
 * and the next waiter wrote a ledger its own parser rejected); at the limit the numbers restart
 * when the queue is empty; whatever a writer produces parses again. */
static void test_ticket_bounds(void **state)
{
    tdm_ledger_state s, back;
    tdm_error err = {0};
    const char *huge = "{\"version\": 1, \"next_ticket\": 9223372036854775807, \"queue\": [], "
                       "\"reservations\": []}";
    assert_int_equal(tdm_ledger_state_from_json(huge, strlen(huge), &s, &err), TDM_ERR_CORRUPT);
    assert_non_null(strstr(err.message, "next_ticket"));
    tdm_ledger_state_free(&s);

    tdm_ledger_state_init(&s);
    s.next_ticket = TDM_LEDGER_TICKET_LIMIT - 1;
    tdm_ticket t = make_ticket(0, "", 1);
    assert_int_equal(tdm_ledger_state_take_ticket(&s, &t.ticket, &err), TDM_OK);
    assert_int_equal(t.ticket, TDM_LEDGER_TICKET_LIMIT - 1);
    assert_int_equal(tdm_ledger_state_add_ticket(&s, &t, &err), TDM_OK);
    char *json = tdm_ledger_state_to_json(&s);
    assert_non_null(json);
    assert_int_equal(tdm_ledger_state_from_json(json, strlen(json), &back, &err), TDM_OK);
    assert_int_equal(back.next_ticket, TDM_LEDGER_TICKET_LIMIT);
    free(json);
    /* Exhausted with a waiter queued: an error, never a wrapped number. */
    int64_t n = 0;
    assert_int_equal(tdm_ledger_state_take_ticket(&back, &n, &err), TDM_ERR_CORRUPT);
    assert_non_null(strstr(err.message, "exhausted"));
    /* Exhausted with an empty queue: numbers restart at 1. */
    assert_true(tdm_ledger_state_remove_ticket(&back, TDM_LEDGER_TICKET_LIMIT - 1));
    assert_int_equal(tdm_ledger_state_take_ticket(&back, &n, &err), TDM_OK);
    assert_int_equal(n, 1);
    tdm_ledger_state_free(&back);
    tdm_ledger_state_free(&s);

    const char *big_ticket =
        "{\"version\": 1, \"next_ticket\": 9007199254740992, \"reservations\": [], \"queue\": ["
        "{\"ticket\": 9007199254740992, \"holders\": [{\"pid\": 1, \"start_time\": 1}], "
        "\"user\": \"u\", \"host\": \"h\", \"gpu_uuid\": null, \"budget_mb\": 1, \"task\": \"t\", "
        "\"enqueued\": \"2026-01-01T00:00:00Z\", \"lease_expires\": \"2026-01-01T00:00:00Z\"}]}";
    assert_int_equal(tdm_ledger_state_from_json(big_ticket, strlen(big_ticket), &s, &err),
                     TDM_ERR_CORRUPT);
    tdm_ledger_state_free(&s);
}

/* A lease of another host ending after now + lease length (+ clock skew) counts as expired; one of
 * this host is cut to now + lease length (its holders' liveness still decides). */
static void test_lease_bounds(void **state)
{
    unsetenv("TANDEM_LEASE_SEC");
    time_t now = time(NULL);
    int64_t lease = tdm_ledger_lease_sec();
    const time_t year9999 = (time_t)253402300799LL; /* 9999-12-31T23:59:59Z */
    tdm_ledger_state s;
    tdm_error err = {0};
    tdm_ledger_state_init(&s);
    tdm_reservation far = make_res("foreign-far", "GPU-a", 1, -1, getpid());
    snprintf(far.host, sizeof far.host, "another-host");
    far.lease_expires = year9999;
    tdm_reservation near = make_res("foreign-near", "GPU-a", 1, -1, getpid());
    snprintf(near.host, sizeof near.host, "another-host");
    near.lease_expires = now + lease + 60; /* a clock a minute ahead */
    tdm_reservation local = make_res("local-far", "GPU-a", 1, -1, getpid());
    local.lease_expires = year9999;
    tdm_reservation all[] = {far, near, local};
    for (int i = 0; i < 3; i++)
        assert_int_equal(tdm_ledger_state_add_reservation(&s, &all[i], &err), TDM_OK);
    tdm_ticket t = make_ticket(1, "", 1);
    snprintf(t.host, sizeof t.host, "another-host");
    t.lease_expires = year9999;
    assert_int_equal(tdm_ledger_state_add_ticket(&s, &t, &err), TDM_OK);

    assert_int_equal(tdm_ledger_state_prune(&s, now, tdm_host_name()), 2);
    assert_int_equal(s.n_reservations, 2);
    assert_string_equal(s.reservations[0].id, "foreign-near");
    assert_string_equal(s.reservations[1].id, "local-far");
    assert_int_equal(s.reservations[1].lease_expires, now + lease);
    assert_int_equal(s.n_queue, 0);
    tdm_ledger_state_free(&s);
}

/* After a ledger is moved aside: the fresh ledger is marked recovering (also when gpu status moved
 * it), nothing is admitted during the re-registration grace, and the guard counts the memory the
 * GPU reports in use by processes as committed until the mark expires. */
static void test_recovery_after_corruption(void **state)
{
    unsetenv("TANDEM_RESERVE_FACTOR");
    unsetenv("TANDEM_RENEW_SEC");
    char d[300], path[400];
    snprintf(d, sizeof d, "%s/recovery", dir);
    tdm_ledger l;
    tdm_error err = {0};
    assert_int_equal(tdm_ledger_open(&l, d, &err), TDM_OK);
    snprintf(path, sizeof path, "%s/gpu-ledger.json", d);
    assert_int_equal(tdm_atomic_write(path, "garbage", 7, 0600, &err), TDM_OK);
    tdm_set_warn_sink(capture_warning, (char[1024]){0});
    tdm_ledger_state s;
    time_t before = time(NULL);
    assert_int_equal(tdm_ledger_snapshot(&l, &s, &err), TDM_OK);
    tdm_set_warn_sink(NULL, NULL);
    time_t after = time(NULL);
    assert_true(s.recovering_until >= before + tdm_ledger_recovery_sec());
    assert_true(s.recovering_until <= after + tdm_ledger_recovery_sec());
    assert_true(tdm_ledger_state_settling(&s, after));
    assert_false(tdm_ledger_state_settling(&s, after + TDM_LEDGER_REREGISTER_GRACE_SEC + 1));
    tdm_ledger_state_free(&s);
    /* The snapshot wrote the fresh, marked ledger: the next reader sees the mark. */
    char *text;
    assert_int_equal(tdm_read_file(path, &text, NULL, &err), TDM_OK);
    assert_non_null(strstr(text, "\"recovering_until\""));
    free(text);
    assert_int_equal(tdm_ledger_snapshot(&l, &s, &err), TDM_OK);
    assert_true(s.recovering_until > 0);

    /* 6000 MiB in use by a process that is in no reservation, 4000 MiB free, capacity 8500. */
    tdm_gpu g = make_gpu("GPU-a", 10000, 6000, TDM_MEMORY_DISCRETE);
    tdm_gpu_process p = {.pid = 4242, .used_mb = 6000};
    g.processes = &p;
    g.n_processes = 1;
    tdm_guard_view v;
    tdm_guard_view_of(&g, &s, &v);
    assert_true(v.recovering);
    assert_int_equal(v.committed_mb, 6000);
    assert_true(tdm_guard_fits(&v, 2500));
    assert_false(tdm_guard_fits(&v, 2501)); /* reality alone would allow 4000 */
    p.used_mb = -1;                         /* NVML cannot tell: the GPU's used memory counts */
    g.used_mb = 7000;
    tdm_guard_view_of(&g, &s, &v);
    assert_int_equal(v.committed_mb, 7000);
    /* Once the mark has expired (prune clears it), only the ledger counts again. */
    tdm_ledger_state_prune(&s, s.recovering_until, tdm_host_name());
    assert_int_equal(s.recovering_until, 0);
    tdm_guard_view_of(&g, &s, &v);
    assert_false(v.recovering);
    assert_int_equal(v.committed_mb, 0);
    tdm_ledger_state_free(&s);
}

/* Temp files of writers killed between create and rename: removed by the next transaction when
 * their pid is dead or recycled (the process started after the file was written); kept otherwise.
 */
static void test_stale_temp_files_removed(void **state)
{
    char d[300], p_dead[400], p_recycled[400], p_live[400];
    snprintf(d, sizeof d, "%s/temps", dir);
    tdm_ledger l;
    tdm_error err = {0};
    assert_int_equal(tdm_ledger_open(&l, d, &err), TDM_OK);
    pid_t child = fork();
    if (child == 0)
        _exit(0);
    waitpid(child, NULL, 0);
    snprintf(p_dead, sizeof p_dead, "%s/.gpu-ledger.json.tmp-%ld", d, (long)child);
    snprintf(p_recycled, sizeof p_recycled, "%s/.gpu-ledger.json.tmp-1", d);
    snprintf(p_live, sizeof p_live, "%s/.gpu-ledger.json.tmp-%ld", d, (long)getppid());
    const char *paths[] = {p_dead, p_recycled, p_live};
    for (int i = 0; i < 3; i++) {
        FILE *f = fopen(paths[i], "w");
        assert_non_null(f);
        fputs("{\"version\": 1, \"ne", f);
        fclose(f);
    }
    struct timespec old[2] = {{.tv_sec = 978307200}, {.tv_sec = 978307200}}; /* 2001 */
    assert_int_equal(utimensat(AT_FDCWD, p_recycled, old, 0), 0); /* pid 1 started after that */
    assert_int_equal(tdm_ledger_transact(&l, NULL, NULL, &err), TDM_OK);
    assert_int_equal(access(p_dead, F_OK), -1);
    assert_int_equal(access(p_recycled, F_OK), -1);
    assert_int_equal(access(p_live, F_OK), 0); /* our parent is alive and older than the file */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_roundtrip),
        cmocka_unit_test(test_json_rejects_malformed),
        cmocka_unit_test(test_prune),
        cmocka_unit_test(test_guard_arithmetic),
        cmocka_unit_test(test_queue_order),
        cmocka_unit_test(test_no_lost_updates_under_contention),
        cmocka_unit_test(test_corrupt_ledger_moved_aside),
        cmocka_unit_test(test_failing_write_keeps_ledger),
        cmocka_unit_test(test_symlinks_refused_and_dir_mode),
        cmocka_unit_test(test_hostile_budgets_cannot_wrap),
        cmocka_unit_test(test_ticket_bounds),
        cmocka_unit_test(test_lease_bounds),
        cmocka_unit_test(test_recovery_after_corruption),
        cmocka_unit_test(test_stale_temp_files_removed),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
