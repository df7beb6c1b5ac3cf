/* Replays the committed fuzz corpora of the model parsers (tests/fuzz/corpus/safetensors and
 * model_config) through the fuzz target bodies in the ordinary (and ASan) build, so every fuzz
 * finding saved there stays a regression test. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>

#include "../fuzz/model_targets.h"
#include "../lib/corpus_replay.h"

static void test_safetensors_corpus(void **state)
{
    assert_true(tdm_replay_corpus("safetensors", fuzz_safetensors_one) >= 5);
}

static void test_model_config_corpus(void **state)
{
    assert_true(tdm_replay_corpus("model_config", fuzz_model_config_one) >= 4);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_safetensors_corpus),
        cmocka_unit_test(test_model_config_corpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
