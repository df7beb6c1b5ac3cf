/* Runs every file of tests/fuzz/corpus/cluster_yaml/ (seeds and crash regressions) through the fuzz
 * target's checks in the normal build, so fuzz findings stay fixed (see tests/fuzz/). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../fuzz/fuzz_cluster_yaml.c"
#include "util/atomic_file.h"

static void test_corpus(void **state)
{
    const char *dir = TANDEM_SOURCE_DIR "/tests/fuzz/corpus/cluster_yaml";
    DIR *d = opendir(dir);
    assert_non_null(d);
    size_t files = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char path[4096];
        int n = snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        assert_true(n > 0 && (size_t)n < sizeof path);
        char *buf;
        size_t len;
        tdm_error err = {0};
        if (tdm_read_file(path, &buf, &len, &err) != TDM_OK)
            fail_msg("%s", err.message);
        /* Aborts (failing the test) when a check of the fuzz target does not hold. */
        LLVMFuzzerTestOneInput((const uint8_t *)buf, len);
        free(buf);
        files++;
    }
    closedir(d);
    assert_true(files >= 10); /* the seed corpus is there */
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_corpus)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
