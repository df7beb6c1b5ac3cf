/* Runs every file of tests/fuzz/corpus/cotrain_msg/ (seeds and crash regressions) through the
 * fuzz target's checks in the normal build, so fuzz findings stay fixed (see tests/fuzz/). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>

#include "../fuzz/fuzz_cotrain_msg.c"
#include "../lib/corpus_replay.h"

static void test_corpus(void **state)
{
    /* at least the seed corpus */
    assert_true(tdm_replay_corpus("cotrain_msg", LLVMFuzzerTestOneInput) >= 10);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_corpus)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
