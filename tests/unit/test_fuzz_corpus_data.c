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
#include "util/atomic_file.h"

static void test_data_jsonl_corpus(void **state)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus/fuzz_data_jsonl", TANDEM_SOURCE_DIR);
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
        if (len == 0) continue;
        /* a spread of option bytes with this file */
        for (int opt = 0; opt < 256; opt += 17) {
            data[0] = (char)opt;
            fuzz_data_jsonl_one((const uint8_t *)data, len);
        }
        free(data);
        n++;
    }
    closedir(d);
    assert_true(n > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_data_jsonl_corpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
