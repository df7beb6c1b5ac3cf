/* Unit tests of model/safetensors and model/weights: round trips through the writer, every
 * hostile header we could think of, every truncation and random corruption of a valid file,
 * atomic writes under injected faults, and sharded models. Golden files written by the Python
 * safetensors library (tests/fixtures/model/, made by gen_fixtures.py) are read when present. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The fixtures gen_fixtures.py writes; TANDEM_MODEL_FIXTURES points elsewhere (a fresh run). */
static const char *fixtures_dir(void)
{
    const char *d = getenv("TANDEM_MODEL_FIXTURES");
    return d && *d ? d : TANDEM_SOURCE_DIR "/tests/fixtures/model";
}

#include "model/safetensors.h"
#include "model/weights.h"
#include "util/atomic_file.h"
#include "util/half.h"

static char tmpdir[256];

static int setup(void **state)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/tandem-test-st-XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    return 0;
}

static int teardown(void **state)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* A safetensors image: 8-byte length, header, data_len bytes of pattern. */
static uint8_t *make_image(const char *header, uint64_t hlen_field, size_t data_len, size_t *len)
{
    size_t hlen = strlen(header);
    *len = 8 + hlen + data_len;
    uint8_t *buf = malloc(*len ? *len : 1);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)(hlen_field >> (8 * i));
    memcpy(buf + 8, header, hlen);
    for (size_t i = 0; i < data_len; i++)
        buf[8 + hlen + i] = (uint8_t)(i * 7 + 1);
    return buf;
}

/* Parses header + data_len bytes; returns the status and leaves the message in err. */
static tdm_status parse_header(const char *header, size_t data_len, tdm_error *err)
{
    size_t len;
    uint8_t *buf = make_image(header, strlen(header), data_len, &len);
    tdm_st_file f;
    tdm_status st = tdm_st_parse(&f, buf, len, "test.safetensors", err);
    if (st == TDM_OK)
        tdm_st_close(&f);
    free(buf);
    return st;
}

static void expect_fail(const char *header, size_t data_len, tdm_status want, const char *needle)
{
    tdm_error err = {0};
    tdm_status st = parse_header(header, data_len, &err);
    if (st != want || !strstr(err.message, needle))
        fail_msg("header %s: got status %d message \"%s\", want %d containing \"%s\"", header, st,
                 err.message, want, needle);
    assert_non_null(strstr(err.message, "test.safetensors"));
}

static void test_minimal_valid(void **state)
{
    tdm_error err = {0};
    assert_int_equal(parse_header("{}", 0, &err), TDM_OK);
    assert_int_equal(
        parse_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}  ", 8, &err),
        TDM_OK);
}

static void test_hostile_headers(void **state)
{
    /* Offsets and sizes. */
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, TDM_ERR_CORRUPT,
                "run past the data section");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, TDM_ERR_CORRUPT,
                "needs 12 bytes");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, TDM_ERR_CORRUPT,
                "end before they begin");
    expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}",
                6, TDM_ERR_CORRUPT, "overlaps");
    expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
                4, TDM_ERR_CORRUPT, "overlaps");
    expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}", 6,
                TDM_ERR_CORRUPT, "unused bytes");
    expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 9,
                TDM_ERR_CORRUPT, "trailing");
    /* Integer overflow in the shape product and in product * dtype size. */
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],"
                "\"data_offsets\":[0,0]}}",
                0, TDM_ERR_CORRUPT, "overflows");
    expect_fail("{\"a\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],"
                "\"data_offsets\":[0,0]}}",
                0, TDM_ERR_CORRUPT, "overflows");
    expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,99999999999999999999]}}",
                1, TDM_ERR_PARSE, "header JSON");
    /* Offsets near 2^64 must not wrap. */
    expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[0],"
                "\"data_offsets\":[9223372036854775807,9223372036854775807]}}",
                0, TDM_ERR_CORRUPT, "run past");
    /* Fields. */
    expect_fail("{\"a\":{\"dtype\":\"F31\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                TDM_ERR_UNSUPPORTED, "unknown dtype \"F31\"");
    expect_fail("{\"a\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                TDM_ERR_UNSUPPORTED, "unknown dtype");
    expect_fail("{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, TDM_ERR_PARSE,
                "dtype");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
                TDM_ERR_PARSE, "shape[0]");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4,
                TDM_ERR_PARSE, "shape[0]");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":1,\"data_offsets\":[0,4]}}", 4, TDM_ERR_PARSE,
                "shape");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
                4, TDM_ERR_UNSUPPORTED, "rank 9");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, TDM_ERR_PARSE,
                "data_offsets");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4,
                TDM_ERR_PARSE, "data_offsets");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, TDM_ERR_PARSE, "data_offsets");
    expect_fail("{\"a\":[1,2]}", 0, TDM_ERR_PARSE, "not an object");
    expect_fail("{\"__metadata__\":{\"k\":1}}", 0, TDM_ERR_PARSE, "__metadata__");
    expect_fail("{\"__metadata__\":[]}", 0, TDM_ERR_PARSE, "__metadata__");
    expect_fail("{\"\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, TDM_ERR_PARSE,
                "empty name");
    /* JSON. */
    expect_fail("{\"a\":", 0, TDM_ERR_PARSE, "header JSON line 1");
    expect_fail("[1,2,3]", 0, TDM_ERR_PARSE, "not a JSON object");
    expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]},"
                "\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}",
                0, TDM_ERR_PARSE, "duplicate");
    expect_fail("{\"a\\u0000\":1}", 0, TDM_ERR_PARSE, "header JSON");
}

static void test_header_length_field(void **state)
{
    tdm_error err = {0};
    tdm_st_file f;
    size_t len;
    const char *h = "{}";
    uint8_t *buf = make_image(h, 1000, 0, &len); /* claims 1000 bytes, file has 10 */
    assert_int_equal(tdm_st_parse(&f, buf, len, "x", &err), TDM_ERR_CORRUPT);
    assert_non_null(strstr(err.message, "runs past the end of the file"));
    free(buf);
    buf = make_image(h, 100000001, 0, &len);
    assert_int_equal(tdm_st_parse(&f, buf, len, "x", &err), TDM_ERR_CORRUPT);
    assert_non_null(strstr(err.message, "limit"));
    free(buf);
    buf = make_image(h, UINT64_MAX, 0, &len);
    assert_int_equal(tdm_st_parse(&f, buf, len, "x", &err), TDM_ERR_CORRUPT);
    free(buf);
    buf = make_image(h, 0, 0, &len);
    assert_int_equal(tdm_st_parse(&f, buf, len, "x", &err), TDM_ERR_PARSE);
    free(buf);
    uint8_t tiny[5] = {2, 0, 0, 0, 0};
    assert_int_equal(tdm_st_parse(&f, tiny, sizeof tiny, "x", &err), TDM_ERR_CORRUPT);
    assert_non_null(strstr(err.message, "too short"));
    assert_int_equal(tdm_st_parse(&f, tiny, 0, "x", &err), TDM_ERR_CORRUPT);
}

/* Writes a file with one tensor of every dtype family (and an empty and a scalar one). */
static void write_sample(const char *path)
{
    float f32[6] = {1.0f, -2.5f, 3.25f, 0.0f, 1e-3f, -7.0f};
    uint16_t bf16[4], f16[4];
    float src[4] = {0.5f, -1.0f, 65504.0f, 1.0f / 3.0f};
    tdm_f32_to_bf16_n(src, bf16, 4);
    tdm_f32_to_f16_n(src, f16, 4);
    uint8_t u8[3] = {0, 128, 255};
    int8_t i8[3] = {-128, 0, 127};
    int32_t i32[2] = {-2147483647 - 1, 2147483647};
    int64_t i64[2] = {-5, (int64_t)1 << 40};
    double f64 = 2.0;
    tdm_st_spec specs[] = {
        {"w.f32", TDM_DTYPE_F32, 2, {2, 3}}, {"w.bf16", TDM_DTYPE_BF16, 1, {4}},
        {"w.f16", TDM_DTYPE_F16, 2, {2, 2}}, {"w.u8", TDM_DTYPE_U8, 1, {3}},
        {"w.i8", TDM_DTYPE_I8, 1, {3}},      {"w.i32", TDM_DTYPE_I32, 1, {2}},
        {"w.i64", TDM_DTYPE_I64, 1, {2}},    {"empty", TDM_DTYPE_F32, 2, {0, 5}},
        {"scalar", TDM_DTYPE_F64, 0, {0}},
    };
    const void *data[] = {f32, bf16, f16, u8, i8, i32, i64, NULL, &f64};
    const char *meta[] = {"format", "pt", "note", "tandem test"};
    tdm_error err = {0};
    assert_int_equal(tdm_st_save(path, specs, data, 9, meta, 2, &err), TDM_OK);
}

static void test_round_trip(void **state)
{
    char path[512];
    snprintf(path, sizeof path, "%s/rt.safetensors", tmpdir);
    write_sample(path);
    tdm_st_file f;
    tdm_error err = {0};
    assert_int_equal(tdm_st_open(&f, path, &err), TDM_OK);
    assert_int_equal(f.n_tensors, 9);
    assert_string_equal(tdm_st_metadata(&f, "format"), "pt");
    assert_string_equal(tdm_st_metadata(&f, "note"), "tandem test");
    assert_null(tdm_st_metadata(&f, "missing"));
    /* The data section starts 8-aligned. */
    assert_int_equal((f.data - (const uint8_t *)f.map) % 8, 0);

    const tdm_st_tensor *t = tdm_st_find(&f, "w.f32");
    assert_non_null(t);
    assert_int_equal(t->rank, 2);
    assert_int_equal(t->shape[1], 3);
    float out[6];
    assert_int_equal(tdm_st_tensor_to_f32(t, out, &err), TDM_OK);
    assert_true(out[1] == -2.5f && out[4] == 1e-3f);
    t = tdm_st_find(&f, "w.bf16");
    assert_int_equal(tdm_st_tensor_to_f32(t, out, &err), TDM_OK);
    assert_true(out[0] == 0.5f && out[1] == -1.0f && out[2] == 65536.0f);
    assert_true(out[3] == tdm_bf16_to_f32(tdm_f32_to_bf16(1.0f / 3.0f)));
    t = tdm_st_find(&f, "w.f16");
    assert_int_equal(tdm_st_tensor_to_f32(t, out, &err), TDM_OK);
    assert_true(out[2] == 65504.0f);
    t = tdm_st_find(&f, "w.i32");
    int32_t i32[2];
    memcpy(i32, t->data, 8);
    assert_int_equal(i32[0], -2147483647 - 1);
    assert_int_equal(tdm_st_tensor_to_f32(t, out, &err), TDM_ERR_UNSUPPORTED);
    t = tdm_st_find(&f, "w.i64");
    int64_t i64[2];
    memcpy(i64, t->data, 16);
    assert_true(i64[1] == (int64_t)1 << 40);
    t = tdm_st_find(&f, "w.i8");
    assert_int_equal(((const int8_t *)t->data)[0], -128);
    t = tdm_st_find(&f, "empty");
    assert_int_equal(t->numel, 0);
    assert_int_equal(t->nbytes, 0);
    t = tdm_st_find(&f, "scalar");
    assert_int_equal(t->rank, 0);
    assert_int_equal(t->numel, 1);
    assert_null(tdm_st_find(&f, "nope"));
    tdm_st_close(&f);
    tdm_st_close(&f); /* idempotent */
}

/* Every proper prefix of a valid file is rejected cleanly; so is every single-byte change that
 * breaks it (and none crashes: ASan watches). */
static void test_truncations_and_corruptions(void **state)
{
    char path[512];
    snprintf(path, sizeof path, "%s/tc.safetensors", tmpdir);
    write_sample(path);
    char *buf;
    size_t len;
    tdm_error err = {0};
    assert_int_equal(tdm_read_file(path, &buf, &len, &err), TDM_OK);
    for (size_t n = 0; n < len; n++) {
        uint8_t *copy = malloc(n ? n : 1); /* exact-size copy: ASan catches any overread */
        memcpy(copy, buf, n);
        tdm_st_file f;
        tdm_status st = tdm_st_parse(&f, copy, n, "trunc", &err);
        if (st == TDM_OK)
            fail_msg("prefix of %zu/%zu bytes accepted", n, len);
        assert_true(err.message[0] != '\0');
        free(copy);
    }
    uint64_t rng = 0x9e3779b97f4a7c15u;
    for (int round = 0; round < 3000; round++) {
        uint8_t *copy = malloc(len);
        memcpy(copy, buf, len);
        for (int k = 0; k < 1 + round % 3; k++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            size_t pos = (size_t)(rng % (len < 200 ? len : 200)); /* mostly the header */
            copy[pos] = (uint8_t)(rng >> 32);
        }
        tdm_st_file f;
        if (tdm_st_parse(&f, copy, len, "mut", &err) == TDM_OK) {
            /* Accepted: then every tensor must lie inside the buffer. */
            for (size_t i = 0; i < f.n_tensors; i++) {
                const uint8_t *p = f.tensors[i].data;
                assert_true(p >= copy && p + f.tensors[i].nbytes <= copy + len);
            }
            tdm_st_close(&f);
        }
        free(copy);
    }
    free(buf);
}

static void test_open_errors(void **state)
{
    tdm_st_file f;
    tdm_error err = {0};
    assert_int_equal(tdm_st_open(&f, "/nonexistent/m.safetensors", &err), TDM_ERR_NOT_FOUND);
    assert_non_null(strstr(err.message, "/nonexistent/m.safetensors"));
    /* not regular files: refused at once (a FIFO without a writer would block open and read) */
    assert_int_equal(tdm_st_open(&f, tmpdir, &err), TDM_ERR_IO);
    assert_non_null(strstr(err.message, "not a regular file (a directory)"));
    char path[512];
    snprintf(path, sizeof path, "%s/fifo.safetensors", tmpdir);
    assert_int_equal(mkfifo(path, 0600), 0);
    assert_int_equal(tdm_st_open(&f, path, &err), TDM_ERR_IO);
    assert_non_null(strstr(err.message, "fifo.safetensors: not a regular file (a FIFO)"));
    unlink(path);
    snprintf(path, sizeof path, "%s/empty.safetensors", tmpdir);
    assert_int_equal(tdm_atomic_write(path, "", 0, 0644, &err), TDM_OK);
    assert_int_equal(tdm_st_open(&f, path, &err), TDM_ERR_CORRUPT);
    assert_non_null(strstr(err.message, "too short"));
}

static void test_writer_checks_and_faults(void **state)
{
    char path[512], tmp[600];
    snprintf(path, sizeof path, "%s/w.safetensors", tmpdir);
    snprintf(tmp, sizeof tmp, "%s/.w.safetensors.tmp-%ld", tmpdir, (long)getpid());
    tdm_error err = {0};
    tdm_st_spec dup[] = {{"a", TDM_DTYPE_U8, 1, {1}}, {"a", TDM_DTYPE_U8, 1, {1}}};
    tdm_st_writer *w;
    assert_int_equal(tdm_st_writer_open(&w, path, dup, 2, NULL, 0, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.message, "twice"));
    tdm_st_spec reserved[] = {{"__metadata__", TDM_DTYPE_U8, 1, {1}}};
    assert_int_equal(tdm_st_writer_open(&w, path, reserved, 1, NULL, 0, &err), TDM_ERR_INVALID);
    tdm_st_spec neg[] = {{"a", TDM_DTYPE_U8, 1, {-1}}};
    assert_int_equal(tdm_st_writer_open(&w, path, neg, 1, NULL, 0, &err), TDM_ERR_INVALID);
    tdm_st_spec huge[] = {{"a", TDM_DTYPE_F32, 2, {INT64_MAX / 2, 4}}};
    assert_int_equal(tdm_st_writer_open(&w, path, huge, 1, NULL, 0, &err), TDM_ERR_INVALID);

    /* Old content survives a short write, an over-long write and each injected fault. */
    write_sample(path);
    char *before;
    size_t before_len;
    assert_int_equal(tdm_read_file(path, &before, &before_len, &err), TDM_OK);
    tdm_st_spec one[] = {{"x", TDM_DTYPE_F32, 1, {4}}};
    float v[4] = {1, 2, 3, 4};
    assert_int_equal(tdm_st_writer_open(&w, path, one, 1, NULL, 0, &err), TDM_OK);
    assert_int_equal(tdm_st_writer_write(w, v, 8, &err), TDM_OK);
    assert_int_equal(tdm_st_writer_remaining(w), 8);
    assert_int_equal(tdm_st_writer_write(w, v, 12, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_st_writer_commit(w, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.message, "never written"));
    assert_int_not_equal(access(tmp, F_OK), 0);
    const char *points[] = {"safetensors.write", "safetensors.fsync", "safetensors.rename"};
    for (int i = 0; i < 3; i++) {
        setenv("TANDEM_FAULT_INJECT", points[i], 1);
        const void *data[] = {v};
        assert_int_equal(tdm_st_save(path, one, data, 1, NULL, 0, &err), TDM_ERR_IO);
        unsetenv("TANDEM_FAULT_INJECT");
        assert_int_not_equal(access(tmp, F_OK), 0);
    }
    assert_int_equal(tdm_st_writer_open(&w, path, one, 1, NULL, 0, &err), TDM_OK);
    tdm_st_writer_abort(w);
    assert_int_not_equal(access(tmp, F_OK), 0);
    char *after;
    size_t after_len;
    assert_int_equal(tdm_read_file(path, &after, &after_len, &err), TDM_OK);
    assert_int_equal(after_len, before_len);
    assert_memory_equal(before, after, before_len);
    free(before);
    free(after);
}

/* A hard link planted at the writer's temp name (to make it truncate and rewrite another file) is
 * never written through: the open fails naming the temp file and the victim keeps its bytes and
 * mode. A stale temp file of ours (a regular file we own, one link) is replaced. */
static void test_writer_refuses_planted_temp(void **state)
{
    char path[512], tmp[600], victim[512];
    snprintf(path, sizeof path, "%s/planted.safetensors", tmpdir);
    snprintf(tmp, sizeof tmp, "%s/.planted.safetensors.tmp-%ld", tmpdir, (long)getpid());
    snprintf(victim, sizeof victim, "%s/victim.txt", tmpdir);
    tdm_error err = {0};
    assert_int_equal(tdm_atomic_write(victim, "precious\n", 9, 0600, &err), TDM_OK);
    assert_int_equal(link(victim, tmp), 0);
    tdm_st_spec one[] = {{"x", TDM_DTYPE_F32, 1, {4}}};
    float v[4] = {1, 2, 3, 4};
    const void *data[] = {v};
    assert_int_equal(tdm_st_save(path, one, data, 1, NULL, 0, &err), TDM_ERR_IO);
    assert_non_null(strstr(err.message, tmp));
    char *content;
    size_t len;
    assert_int_equal(tdm_read_file(victim, &content, &len, &err), TDM_OK);
    assert_int_equal(len, 9);
    assert_memory_equal(content, "precious\n", 9);
    free(content);
    struct stat st;
    assert_int_equal(stat(victim, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0600);
    assert_int_equal(unlink(tmp), 0);

    /* A leftover of ours at the name is no obstacle. */
    assert_int_equal(tdm_atomic_write(tmp, "stale", 5, 0644, &err), TDM_OK);
    assert_int_equal(tdm_st_save(path, one, data, 1, NULL, 0, &err), TDM_OK);
    assert_int_not_equal(access(tmp, F_OK), 0);
    unlink(path);
    unlink(victim);
}

/* Streaming: bytes given in odd-sized pieces straddling tensors give the same file as one call. */
static void test_streaming_pieces(void **state)
{
    enum { N = 100003 };
    static float a[N];
    static uint16_t b[777];
    for (int i = 0; i < N; i++)
        a[i] = (float)i * 0.5f;
    for (int i = 0; i < 777; i++)
        b[i] = (uint16_t)i;
    tdm_st_spec specs[] = {{"a", TDM_DTYPE_F32, 1, {N}}, {"b", TDM_DTYPE_BF16, 2, {7, 111}}};
    char p1[512], p2[512];
    snprintf(p1, sizeof p1, "%s/s1.safetensors", tmpdir);
    snprintf(p2, sizeof p2, "%s/s2.safetensors", tmpdir);
    tdm_error err = {0};
    const void *data[] = {a, b};
    assert_int_equal(tdm_st_save(p1, specs, data, 2, NULL, 0, &err), TDM_OK);
    uint8_t *all = malloc(sizeof a + sizeof b);
    memcpy(all, a, sizeof a);
    memcpy(all + sizeof a, b, sizeof b);
    tdm_st_writer *w;
    assert_int_equal(tdm_st_writer_open(&w, p2, specs, 2, NULL, 0, &err), TDM_OK);
    size_t at = 0, total = sizeof a + sizeof b, step = 1;
    while (at < total) {
        size_t n = step < total - at ? step : total - at;
        assert_int_equal(tdm_st_writer_write(w, all + at, n, &err), TDM_OK);
        at += n;
        step = step * 3 + 1;
    }
    assert_int_equal(tdm_st_writer_commit(w, &err), TDM_OK);
    char *x, *y;
    size_t xl, yl;
    assert_int_equal(tdm_read_file(p1, &x, &xl, &err), TDM_OK);
    assert_int_equal(tdm_read_file(p2, &y, &yl, &err), TDM_OK);
    assert_int_equal(xl, yl);
    assert_memory_equal(x, y, xl);
    free(x);
    free(y);
    free(all);
}

static void write_shard(const char *dir, const char *file, const char *t1, const char *t2)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    float v[2] = {1, 2};
    tdm_st_spec specs[] = {{t1, TDM_DTYPE_F32, 1, {2}}, {t2, TDM_DTYPE_F32, 1, {2}}};
    const void *data[] = {v, v};
    tdm_error err = {0};
    assert_int_equal(tdm_st_save(path, specs, data, t2 ? 2 : 1, NULL, 0, &err), TDM_OK);
}

static void write_index(const char *dir, const char *json)
{
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    tdm_error err = {0};
    assert_int_equal(tdm_atomic_write(path, json, strlen(json), 0644, &err), TDM_OK);
}

static void expect_weights_fail(const char *dir, tdm_status want, const char *needle)
{
    tdm_weights w;
    tdm_error err = {0};
    tdm_status st = tdm_weights_open(&w, dir, &err);
    if (st != want || !strstr(err.message, needle))
        fail_msg("got %d \"%s\", want %d with \"%s\"", st, err.message, want, needle);
}

static void test_sharded(void **state)
{
    char dir[400];
    snprintf(dir, sizeof dir, "%s/sharded", tmpdir);
    mkdir(dir, 0755);
    expect_weights_fail(dir, TDM_ERR_NOT_FOUND, "no model.safetensors");
    write_shard(dir, "model-00001-of-00002.safetensors", "a", "b");
    write_shard(dir, "model-00002-of-00002.safetensors", "c", NULL);
    write_index(dir, "{\"metadata\":{\"total_size\":24},\"weight_map\":{"
                     "\"a\":\"model-00001-of-00002.safetensors\","
                     "\"b\":\"model-00001-of-00002.safetensors\","
                     "\"c\":\"model-00002-of-00002.safetensors\"}}");
    tdm_weights w;
    tdm_error err = {0};
    assert_int_equal(tdm_weights_open(&w, dir, &err), TDM_OK);
    assert_int_equal(w.n_files, 2);
    assert_int_equal(w.n_tensors, 3);
    assert_non_null(tdm_weights_find(&w, "a"));
    assert_non_null(tdm_weights_find(&w, "c"));
    assert_null(tdm_weights_find(&w, "d"));
    assert_int_equal(tdm_weights_data_bytes(&w), 24);
    tdm_weights_close(&w);

    write_index(dir, "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                     "\"b\":\"model-00001-of-00002.safetensors\","
                     "\"c\":\"model-00001-of-00002.safetensors\"}}");
    expect_weights_fail(dir, TDM_ERR_CORRUPT, "\"c\" is indexed in");
    write_index(dir, "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                     "\"c\":\"model-00002-of-00002.safetensors\"}}");
    expect_weights_fail(dir, TDM_ERR_CORRUPT, "\"b\" of");
    write_index(dir, "{\"weight_map\":{\"a\":\"../x.safetensors\"}}");
    expect_weights_fail(dir, TDM_ERR_PARSE, "plain file name");
    write_index(dir, "{\"weight_map\":{\"a\":\"missing.safetensors\"}}");
    expect_weights_fail(dir, TDM_ERR_NOT_FOUND, "missing.safetensors");
    write_index(dir, "{\"weight_map\": 3}");
    expect_weights_fail(dir, TDM_ERR_PARSE, "weight_map");
    write_index(dir, "{\"weight_map\": {");
    expect_weights_fail(dir, TDM_ERR_PARSE, "model.safetensors.index.json:1:");
    /* A tensor in two shards. */
    write_shard(dir, "model-00002-of-00002.safetensors", "c", "a");
    write_index(dir, "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                     "\"b\":\"model-00001-of-00002.safetensors\","
                     "\"c\":\"model-00002-of-00002.safetensors\"}}");
    expect_weights_fail(dir, TDM_ERR_CORRUPT, "is in both");

    /* A single file and a plain directory. */
    char single[500];
    snprintf(single, sizeof single, "%s/single", tmpdir);
    mkdir(single, 0755);
    write_shard(single, "model.safetensors", "x", "y");
    assert_int_equal(tdm_weights_open(&w, single, &err), TDM_OK);
    assert_int_equal(w.n_tensors, 2);
    tdm_weights_close(&w);
    char file[600];
    snprintf(file, sizeof file, "%s/model.safetensors", single);
    assert_int_equal(tdm_weights_open(&w, file, &err), TDM_OK);
    assert_non_null(tdm_weights_find(&w, "y"));
    tdm_weights_close(&w);
}

/* Golden: a file the Python safetensors library wrote (gen_fixtures.py), with the expected
 * values in a JSON next to it. */
static void test_golden_python_file(void **state)
{
    const char *dir = fixtures_dir();
    char st_path[600], js_path[600];
    snprintf(st_path, sizeof st_path, "%s/dtypes.safetensors", dir);
    snprintf(js_path, sizeof js_path, "%s/dtypes.json", dir);
    if (access(st_path, F_OK) != 0 || access(js_path, F_OK) != 0) {
        print_message("SKIP: %s absent; run tests/fixtures/model/gen_fixtures.py on a machine "
                      "with torch + safetensors to make it\n",
                      st_path);
        skip();
    }
    tdm_st_file f;
    tdm_error err = {0};
    if (tdm_st_open(&f, st_path, &err) != TDM_OK)
        fail_msg("%s", err.message);
    json_error_t jerr;
    json_t *root = json_load_file(js_path, 0, &jerr);
    assert_non_null(root);
    json_t *tensors = json_object_get(root, "tensors");
    assert_int_equal(json_object_size(tensors), f.n_tensors);
    const char *name;
    json_t *exp;
    json_object_foreach(tensors, name, exp) {
        const tdm_st_tensor *t = tdm_st_find(&f, name);
        if (!t)
            fail_msg("tensor %s missing", name);
        assert_string_equal(tdm_dtype_name(t->dtype),
                            json_string_value(json_object_get(exp, "dtype")));
        json_t *shape = json_object_get(exp, "shape");
        assert_int_equal((size_t)t->rank, json_array_size(shape));
        for (int d = 0; d < t->rank; d++)
            assert_int_equal(t->shape[d], json_integer_value(json_array_get(shape, (size_t)d)));
        /* "values": the flattened elements as numbers (floats exactly representable). */
        json_t *values = json_object_get(exp, "values");
        assert_int_equal((size_t)t->numel, json_array_size(values));
        const uint8_t *p = t->data;
        for (int64_t i = 0; i < t->numel; i++) {
            double want = json_number_value(json_array_get(values, (size_t)i)), got = 0;
            switch (t->dtype) {
            case TDM_DTYPE_F32: {
                float v;
                memcpy(&v, p + 4 * i, 4);
                got = v;
                break;
            }
            case TDM_DTYPE_F16:
            case TDM_DTYPE_BF16: {
                float v[1];
                tdm_st_tensor one = *t;
                one.numel = 1;
                one.data = p + 2 * i;
                assert_int_equal(tdm_st_tensor_to_f32(&one, v, &err), TDM_OK);
                got = v[0];
                break;
            }
            case TDM_DTYPE_U8: got = p[i]; break;
            case TDM_DTYPE_I8: got = (int8_t)p[i]; break;
            case TDM_DTYPE_I32: {
                int32_t v;
                memcpy(&v, p + 4 * i, 4);
                got = v;
                break;
            }
            case TDM_DTYPE_I64: {
                int64_t v;
                memcpy(&v, p + 8 * i, 8);
                got = (double)v;
                break;
            }
            case TDM_DTYPE_F64: memcpy(&got, p + 8 * i, 8); break;
            default: fail_msg("unexpected dtype in fixture");
            }
            if (got != want)
                fail_msg("%s[%lld]: got %.9g want %.9g", name, (long long)i, got, want);
        }
    }
    json_t *meta = json_object_get(root, "metadata");
    json_t *mv;
    json_object_foreach(meta, name, mv) {
        assert_non_null(tdm_st_metadata(&f, name));
        assert_string_equal(tdm_st_metadata(&f, name), json_string_value(mv));
    }
    json_decref(root);
    tdm_st_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_minimal_valid),
        cmocka_unit_test(test_hostile_headers),
        cmocka_unit_test(test_header_length_field),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_truncations_and_corruptions),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_writer_checks_and_faults),
        cmocka_unit_test(test_writer_refuses_planted_temp),
        cmocka_unit_test(test_streaming_pieces),
        cmocka_unit_test(test_sharded),
        cmocka_unit_test(test_golden_python_file),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
