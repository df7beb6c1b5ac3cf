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
#include "util/atomic_file.h"

static int replay(const char *name, int (*fn)(const uint8_t *, size_t))
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus/%s", TANDEM_SOURCE_DIR, name);
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[800];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        char *buf;
        size_t len;
        tdm_error err = {0};
        assert_int_equal(tdm_read_file(path, &buf, &len, &err), TDM_OK);
        fn((const uint8_t *)buf, len);
        free(buf);
        n++;
    }
    closedir(d);
    return n;
}

static void test_safetensors_corpus(void **state)
{
    assert_true(replay("safetensors", fuzz_safetensors_one) >= 5);
}

static void test_model_config_corpus(void **state)
{
    assert_true(replay("model_config", fuzz_model_config_one) >= 4);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_safetensors_corpus),
        cmocka_unit_test(test_model_config_corpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
