/* Unit tests of src/util/path_identity (issue 13 item 2): spellings of one directory give one
 * key, existing or not (./, trailing and doubled slashes, "..", a symbolic link, a relative path
 * against its base directory), and different directories give different keys. Real files in a
 * scratch directory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/path_identity.h"

static char scratch[256];

static void key(const char *base, const char *path, char out[TDM_PATH_IDENTITY_MAX])
{
    tdm_error err = {0};
    assert_int_equal(tdm_path_identity(base, path, out, TDM_PATH_IDENTITY_MAX, &err), TDM_OK);
}

static int setup(void **state)
{
    (void)state;
    snprintf(scratch, sizeof scratch, "/tmp/tandem-pathid-XXXXXX");
    if (!mkdtemp(scratch) || chdir(scratch) != 0) return -1;
    if (mkdir("exists", 0777) != 0 || mkdir("exists/a", 0777) != 0) return -1;
    if (symlink("exists", "link") != 0) return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", scratch);
    return system(cmd);
}

static void test_missing_directory_spellings(void **state)
{
    (void)state;
    char k0[TDM_PATH_IDENTITY_MAX], k1[TDM_PATH_IDENTITY_MAX];
    key(NULL, "out/a", k0);
    const char *same[] = {"./out/a", "out/a/", "out//a", "out/x/../a", "./out/./a/"};
    for (size_t i = 0; i < sizeof same / sizeof *same; i++) {
        key("", same[i], k1);
        assert_string_equal(k0, k1);
    }
    char abs[512];
    snprintf(abs, sizeof abs, "%s/out/a", scratch);
    key(NULL, abs, k1);
    assert_string_equal(k0, k1);
    key(NULL, "out/b", k1);
    assert_string_not_equal(k0, k1);
    /* a missing directory below a symbolic link: the link's target decides */
    key(NULL, "exists/new", k0);
    key(NULL, "link/new", k1);
    assert_string_equal(k0, k1);
}

static void test_existing_directory(void **state)
{
    (void)state;
    char k0[TDM_PATH_IDENTITY_MAX], k1[TDM_PATH_IDENTITY_MAX];
    key(NULL, "exists/a", k0);
    assert_int_equal(k0[0], '@'); /* device and inode */
    key(NULL, "link/a/", k1);
    assert_string_equal(k0, k1);
    key(NULL, "exists/../exists/a", k1);
    assert_string_equal(k0, k1);
    key(NULL, "exists", k1);
    assert_string_not_equal(k0, k1);
}

static void test_relative_to_base(void **state)
{
    (void)state;
    char k0[TDM_PATH_IDENTITY_MAX], k1[TDM_PATH_IDENTITY_MAX];
    key("cfg", "../out/a", k0); /* adapters.toml in cfg/ naming ../out/a */
    key(NULL, "out/a", k1);
    assert_string_equal(k0, k1);
    key(scratch, "out/a", k0);
    assert_string_equal(k0, k1);
}

/* Nesting: a path inside a directory is found whatever its spelling, through a symbolic link,
 * existing or not; siblings sharing a name prefix, and a directory and itself, are not nested. */
static void test_within(void **state)
{
    (void)state;
    char a[TDM_PATH_IDENTITY_MAX], b[TDM_PATH_IDENTITY_MAX], c[TDM_PATH_IDENTITY_MAX];
    tdm_error err = {0};
    assert_int_equal(tdm_path_resolve(NULL, "exists", a, sizeof a, &err), TDM_OK);
    assert_int_equal(tdm_path_resolve(NULL, "link/a/best", b, sizeof b, &err), TDM_OK);
    assert_true(tdm_path_within(b, a));
    assert_false(tdm_path_within(a, b));
    assert_int_equal(tdm_path_resolve(NULL, "./new//x/../y", c, sizeof c, &err), TDM_OK);
    char want[TDM_PATH_IDENTITY_MAX];
    assert_int_equal(tdm_path_resolve(NULL, "new", want, sizeof want, &err), TDM_OK);
    assert_true(tdm_path_within(c, want));
    assert_int_equal(tdm_path_resolve(NULL, "exists2/a", c, sizeof c, &err), TDM_OK);
    assert_false(tdm_path_within(c, a)); /* "exists2" is not inside "exists" */
    assert_false(tdm_path_within(a, a));
    assert_true(tdm_path_within(a, "/"));
    assert_false(tdm_path_within("/", "/"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_missing_directory_spellings),
        cmocka_unit_test(test_existing_directory),
        cmocka_unit_test(test_relative_to_base),
        cmocka_unit_test(test_within),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
