/* Unit tests of src/util/sha256: the FIPS 180-2 example vectors, incremental updates split at
 * every position, padding edge lengths and whole files checked against coreutils sha256sum. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/sha256.h"

static void hex_of(const void *data, size_t len, char out[TDM_SHA256_TAGGED_LEN])
{
    uint8_t d[TDM_SHA256_DIGEST_LEN];
    tdm_sha256_buf(data, len, d);
    tdm_sha256_tagged(d, out);
}

static void test_fips_vectors(void **state)
{
    char out[TDM_SHA256_TAGGED_LEN];
    hex_of("abc", 3, out);
    assert_string_equal(out,
                        "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    hex_of("", 0, out);
    assert_string_equal(out,
                        "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    hex_of(two, strlen(two), out);
    assert_string_equal(out,
                        "sha256:248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    const char *four = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmno"
                       "ijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
    hex_of(four, strlen(four), out);
    assert_string_equal(out,
                        "sha256:cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
    /* one million 'a', fed 1000 bytes at a time */
    char a[1000];
    memset(a, 'a', sizeof a);
    tdm_sha256 s;
    tdm_sha256_init(&s);
    for (int i = 0; i < 1000; i++)
        tdm_sha256_update(&s, a, sizeof a);
    uint8_t d[TDM_SHA256_DIGEST_LEN];
    tdm_sha256_final(&s, d);
    tdm_sha256_tagged(d, out);
    assert_string_equal(out,
                        "sha256:cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

/* Feeding a message in two or three pieces at any split points gives the one-shot digest. */
static void test_incremental_splits(void **state)
{
    uint8_t msg[200];
    for (size_t i = 0; i < sizeof msg; i++)
        msg[i] = (uint8_t)(i * 131 + 7);
    uint8_t want[TDM_SHA256_DIGEST_LEN], got[TDM_SHA256_DIGEST_LEN];
    tdm_sha256_buf(msg, sizeof msg, want);
    for (size_t i = 0; i <= sizeof msg; i++)
        for (size_t j = i; j <= sizeof msg; j += 7) {
            tdm_sha256 s;
            tdm_sha256_init(&s);
            tdm_sha256_update(&s, msg, i);
            tdm_sha256_update(&s, msg + i, j - i);
            tdm_sha256_update(&s, msg + j, sizeof msg - j);
            tdm_sha256_final(&s, got);
            assert_memory_equal(got, want, sizeof want);
        }
}

/* Every length 0..150 (all padding cases: 55, 56, 63, 64, ...) through tdm_sha256_file equals
 * coreutils sha256sum, an independent implementation. */
static void test_against_sha256sum(void **state)
{
    if (system("command -v sha256sum >/dev/null 2>&1") != 0) {
        fprintf(stderr, "SKIP: no sha256sum\n");
        skip();
    }
    char path[] = "/tmp/tandem-test-sha256-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    for (int len = 0; len <= 150; len++) {
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        for (int i = 0; i < len; i++)
            fputc((i * 37 + len) & 0xff, f);
        fclose(f);
        char cmd[256], line[256] = {0};
        snprintf(cmd, sizeof cmd, "sha256sum %s", path);
        FILE *p = popen(cmd, "r");
        assert_non_null(p);
        assert_non_null(fgets(line, sizeof line, p));
        pclose(p);
        char out[TDM_SHA256_TAGGED_LEN];
        tdm_error err = {0};
        assert_int_equal(tdm_sha256_file(path, out, &err), TDM_OK);
        assert_memory_equal(out + 7, line, 64);
    }
    unlink(path);
    char out[TDM_SHA256_TAGGED_LEN];
    tdm_error err = {0};
    assert_int_equal(tdm_sha256_file(path, out, &err), TDM_ERR_NOT_FOUND);
    assert_non_null(strstr(err.message, path));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fips_vectors),
        cmocka_unit_test(test_incremental_splits),
        cmocka_unit_test(test_against_sha256sum),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
