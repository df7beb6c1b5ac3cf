/* train/tfevents.h and util/crc32c.h: CRC-32C against RFC 3720's vectors, the TFRecord framing
 * byte by byte, and a full disk in the middle of an event record (the record is taken back, the
 * error names the file and ENOSPC). The files' content is checked end to end by an independent
 * reader in integration.tensorboard. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "train/tfevents.h"
#include "util/crc32c.h"

static char tmpdir[256];

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/tandem-tfevents-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_crc32c_vectors(void **state)
{
    (void)state;
    unsigned char b[32];
    assert_int_equal(tdm_crc32c("123456789", 9), 0xE3069283u);
    memset(b, 0, sizeof b);
    assert_int_equal(tdm_crc32c(b, 32), 0x8A9136AAu);
    memset(b, 0xFF, sizeof b);
    assert_int_equal(tdm_crc32c(b, 32), 0x62A8AB43u);
    for (int i = 0; i < 32; i++)
        b[i] = (unsigned char)i;
    assert_int_equal(tdm_crc32c(b, 32), 0x46DD794Eu);
    for (int i = 0; i < 32; i++)
        b[i] = (unsigned char)(31 - i);
    assert_int_equal(tdm_crc32c(b, 32), 0x113FDB5Cu);
    assert_int_equal(tdm_crc32c(b, 0), 0);
}

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void test_frame(void **state)
{
    (void)state;
    unsigned char out[32];
    assert_int_equal(tdm_tfrecord_frame("abc", 3, out), 19);
    assert_int_equal(out[0], 3);
    for (int i = 1; i < 8; i++)
        assert_int_equal(out[i], 0);
    uint32_t c = tdm_crc32c(out, 8);
    assert_int_equal(le32(out + 8), ((c >> 15) | (c << 17)) + 0xA282EAD8u);
    assert_memory_equal(out + 12, "abc", 3);
    c = tdm_crc32c("abc", 3);
    assert_int_equal(le32(out + 15), ((c >> 15) | (c << 17)) + 0xA282EAD8u);
}

static off_t file_size(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? sb.st_size : -1;
}

/* Walks the records: true when the file is a whole number of records. */
static bool whole_records(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    unsigned char h[12];
    bool ok = true;
    for (;;) {
        size_t got = fread(h, 1, 12, f);
        if (got == 0) break;
        uint64_t n = 0;
        for (int i = 7; i >= 0; i--)
            n = n << 8 | h[i];
        if (got != 12 || fseek(f, (long)n + 4, SEEK_CUR) != 0) {
            ok = false;
            break;
        }
        long pos = ftell(f);
        fseek(f, 0, SEEK_END);
        if (ftell(f) < pos) {
            ok = false;
            break;
        }
        fseek(f, pos, SEEK_SET);
    }
    fclose(f);
    return ok;
}

static void test_enospc(void **state)
{
    (void)state;
    tdm_error err = {0};
    tdm_tfevents w;
    assert_int_equal(tdm_tfevents_open(&w, tmpdir, 1, &err), TDM_OK);
    assert_non_null(strstr(w.path, "/runs/events.out.tfevents."));
    tdm_tfevents_value v[] = {{"train/loss", 2.5}, {"train/grad_norm", 0.5}, {"eval/loss", NAN}};
    assert_int_equal(tdm_tfevents_write(&w, 1, 1e9, v, 3, &err), TDM_OK);
    off_t before = file_size(w.path);
    setenv("TANDEM_FAULT_INJECT", "tfevents.enospc", 1);
    tdm_status st = tdm_tfevents_write(&w, 2, 1e9, v, 3, &err);
    unsetenv("TANDEM_FAULT_INJECT");
    assert_int_equal(st, TDM_ERR_IO);
    assert_non_null(strstr(err.message, "No space left on device"));
    assert_non_null(strstr(err.message, w.path));
    assert_int_equal(file_size(w.path), before);
    assert_true(whole_records(w.path));
    /* space freed: the file continues */
    assert_int_equal(tdm_tfevents_write(&w, 3, 1e9, v, 3, &err), TDM_OK);
    assert_true(file_size(w.path) > before);
    assert_true(whole_records(w.path));
    /* only NaN: nothing written */
    off_t now = file_size(w.path);
    tdm_tfevents_value nan1[] = {{"eval/loss", NAN}};
    assert_int_equal(tdm_tfevents_write(&w, 4, 1e9, nan1, 1, &err), TDM_OK);
    assert_int_equal(file_size(w.path), now);
    /* a second open in the same second gets a name of its own; remove takes both */
    tdm_tfevents w2;
    assert_int_equal(tdm_tfevents_open(&w2, tmpdir, 4, &err), TDM_OK);
    assert_string_not_equal(w.path, w2.path);
    assert_int_equal(tdm_tfevents_remove(tmpdir, &err), TDM_OK);
    assert_int_equal(file_size(w.path), -1);
    assert_int_equal(file_size(w2.path), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c_vectors),
        cmocka_unit_test(test_frame),
        cmocka_unit_test(test_enospc),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
