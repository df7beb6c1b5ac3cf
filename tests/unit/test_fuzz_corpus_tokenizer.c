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
#include "util/atomic_file.h"

static int run_corpus(const char *target, int (*one)(const uint8_t *, size_t))
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus/%s", TANDEM_SOURCE_DIR, target);
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[2048];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        char *data;
        size_t len;
        tdm_error err = {0};
        assert_int_equal(tdm_read_file(path, &data, &len, &err), TDM_OK);
        one((const uint8_t *)data, len);
        free(data);
        n++;
    }
    closedir(d);
    return n;
}

static void test_json_corpus(void **state)
{
    assert_true(run_corpus("fuzz_tokenizer_json", fuzz_tokenizer_json_one) > 0);
}

static void test_encode_corpus(void **state)
{
    assert_true(run_corpus("fuzz_tokenizer_encode", fuzz_tokenizer_encode_one) > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_corpus),
        cmocka_unit_test(test_encode_corpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
