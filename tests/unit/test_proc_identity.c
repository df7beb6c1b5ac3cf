/* Holders' identity: start times, liveness (dead, zombie, recycled), and process trees. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu/proc_identity.h"

static void test_self_is_alive(void **state)
{
    tdm_holder me = tdm_holder_of(getpid());
    assert_true(me.start_time > 0);
    assert_true(tdm_holder_alive(&me));
    tdm_holder other = me;
    other.start_time++; /* the same pid with another start time: a recycled pid */
    assert_false(tdm_holder_alive(&other));
    tdm_holder none = {.pid = 0, .start_time = 1};
    assert_false(tdm_holder_alive(&none));
}

static void test_zombie_and_dead(void **state)
{
    pid_t child = fork();
    if (child == 0)
        _exit(0);
    tdm_holder h = {.pid = child, .start_time = 0};
    /* Until reaped the child is a zombie: not alive, start time 0. */
    for (int i = 0; i < 200 && tdm_proc_start_time(child) != 0; i++)
        usleep(5000);
    assert_int_equal(tdm_proc_start_time(child), 0);
    waitpid(child, NULL, 0);
    assert_int_equal(tdm_proc_start_time(child), 0);
    assert_false(tdm_holder_alive(&h));
}

/* root -> child -> grandchild: the tree holds all three, and a bounded buffer still counts all. */
static void test_process_tree(void **state)
{
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    pid_t child = fork();
    if (child == 0) {
        pid_t grandchild = fork();
        if (grandchild == 0) {
            ssize_t w = write(ready[1], "g", 1);
            (void)w;
            pause();
            _exit(0);
        }
        pause();
        _exit(0);
    }
    char c;
    assert_int_equal(read(ready[0], &c, 1), 1);
    pid_t pids[16], mine[1];
    size_t n = tdm_proc_tree(child, pids, 16);
    size_t from_us = tdm_proc_tree(getpid(), mine, 1); /* us, child, grandchild: 3, one stored */
    pid_t grandchild = n >= 2 ? pids[1] : -1;
    /* Clean up before asserting: a failed assertion must not leave paused processes behind. */
    if (grandchild > 0)
        kill(grandchild, SIGKILL);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    assert_int_equal(n, 2);
    assert_int_equal(pids[0], child);
    assert_true(grandchild != child && grandchild > 0);
    assert_true(from_us >= 3);
    assert_int_equal(mine[0], getpid());
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_self_is_alive),
        cmocka_unit_test(test_zombie_and_dead),
        cmocka_unit_test(test_process_tree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
