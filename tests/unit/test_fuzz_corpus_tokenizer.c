/* Runs every input under tests/fuzz/corpus/fuzz_tokenizer_{json,encode}/ through the fuzz
 * targets' bodies in the normal build, so fuzz findings saved there stay regression tests. */
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
#include "../fuzz/fuzz_tokenizer_encode.c"
#include "../fuzz/fuzz_tokenizer_json.c"
#include "../lib/corpus_replay.h"

static void test_json_corpus(void **state)
{
    assert_true(tdm_replay_corpus("fuzz_tokenizer_json", fuzz_tokenizer_json_one) > 0);
}

static void test_encode_corpus(void **state)
{
    assert_true(tdm_replay_corpus("fuzz_tokenizer_encode", fuzz_tokenizer_encode_one) > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_corpus),
        cmocka_unit_test(test_encode_corpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
