/* Runs every input under tests/fuzz/corpus/fuzz_data_jsonl/ through the fuzz target's body in the
 * normal build, so fuzz findings saved there stay regression tests. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TANDEM_FUZZ_NO_ENTRY
#include "../fuzz/fuzz_data_jsonl.c"
#include "../lib/corpus_replay.h"

/* Each corpus file with a spread of option bytes (the target reads its options from byte 0). */
static int with_option_spread(const uint8_t *data, size_t len)
{
    if (len == 0)
        return 0;
    uint8_t *copy = malloc(len);
    assert_non_null(copy);
    memcpy(copy, data, len);
    for (int opt = 0; opt < 256; opt += 17) {
        copy[0] = (uint8_t)opt;
        fuzz_data_jsonl_one(copy, len);
    }
    free(copy);
    return 0;
}

static void test_data_jsonl_corpus(void **state)
{
    assert_true(tdm_replay_corpus("fuzz_data_jsonl", with_option_spread) > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_data_jsonl_corpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
