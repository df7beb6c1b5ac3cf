/* Unit tests of model/nf4: the code table (rebuilt here from normal quantiles as bitsandbytes
 * builds it), the dynamic 8-bit map, packing order, nearest-code choice, per-block error bounds,
 * double quantization, thread-count independence, and (when gen_fixtures.py has been run) exact
 * agreement with a NumPy reimplementation of bitsandbytes' quantize_4bit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The fixtures gen_fixtures.py writes; TANDEM_MODEL_FIXTURES points elsewhere (a fresh run). */
static const char *fixtures_dir(void)
{
    const char *d = getenv("TANDEM_MODEL_FIXTURES");
    return d && *d ? d : TANDEM_SOURCE_DIR "/tests/fixtures/model";
}

#include "model/nf4.h"
#include "model/safetensors.h"
#include "util/rng.h"

/* Standard normal quantile by bisection on erfc (double precision is ample here). */
static double norm_ppf(double p)
{
    double lo = -10, hi = 10;
    for (int i = 0; i < 200; i++) {
        double mid = (lo + hi) / 2;
        if (0.5 * erfc(-mid / sqrt(2.0)) < p)
            lo = mid;
        else
            hi = mid;
    }
    return (lo + hi) / 2;
}

/* torch.linspace in fp32 (first half up from start, second half down from end). */
static float lin(float start, float end, int steps, int i)
{
    float step = (end - start) / (float)(steps - 1);
    return i < steps / 2 ? start + step * (float)i : end - step * (float)(steps - i - 1);
}

/* bitsandbytes create_normal_map(offset=0.9677083, use_extra_value=True): 8 positive quantiles
 * of linspace(offset, 0.5, 9)[:-1], 7 negative of linspace(offset, 0.5, 8)[:-1], and 0, divided
 * by the largest. */
static void test_code_table_is_normal_quantiles(void **state)
{
    const float offset = 0.9677083f;
    float v[16];
    int k = 0;
    for (int i = 0; i < 8; i++)
        v[k++] = (float)norm_ppf(lin(offset, 0.5f, 9, i));
    for (int i = 0; i < 7; i++)
        v[k++] = (float)-norm_ppf(lin(offset, 0.5f, 8, i));
    v[k++] = 0.0f;
    float max = v[0];
    for (int i = 0; i < 16; i++)
        for (int j = i + 1; j < 16; j++)
            if (v[j] < v[i]) {
                float t = v[i];
                v[i] = v[j];
                v[j] = t;
            }
    for (int i = 0; i < 16; i++) {
        float want = v[i] / max;
        if (fabsf(want - tdm_nf4_code[i]) > 2e-7f)
            fail_msg("code[%d] = %.9g, normal quantile gives %.9g", i, tdm_nf4_code[i], want);
    }
    assert_true(tdm_nf4_code[7] == 0.0f && tdm_nf4_code[0] == -1.0f && tdm_nf4_code[15] == 1.0f);
}

static void test_dynamic_map(void **state)
{
    float m[256];
    tdm_nf4_dynamic_map(m);
    int pos = 0, neg = 0, zero = 0;
    for (int i = 0; i < 256; i++) {
        if (i)
            assert_true(m[i] > m[i - 1]);
        pos += m[i] > 0;
        neg += m[i] < 0;
        zero += m[i] == 0;
    }
    assert_int_equal(pos, 128);
    assert_int_equal(neg, 127);
    assert_int_equal(zero, 1);
    assert_true(m[255] == 1.0f);
    /* Largest fraction value: 10^0 * mean of the last two points of linspace(0.1, 1, 65). */
    assert_true(fabsf(m[254] - 0.99296875f) < 1e-6f);
    assert_true(fabsf(m[0] + 0.99296875f) < 1e-6f);
    /* Smallest magnitude: 10^-6 * (0.1 + 1) / 2. */
    assert_true(fabsf(m[128] - 5.5e-7f) < 1e-12f);
}

static void test_packing_order(void **state)
{
    /* Elements exactly on code values (times absmax 2): codes 3, 12, 15, 0, 7. */
    const int codes[5] = {3, 12, 15, 0, 7};
    float w[5], out[5];
    for (int i = 0; i < 5; i++)
        w[i] = tdm_nf4_code[codes[i]] * 2.0f;
    tdm_nf4 q;
    tdm_error err = {0};
    assert_int_equal(tdm_nf4_quantize(w, 5, false, &q, &err), TDM_OK);
    assert_int_equal(q.nblocks, 1);
    assert_true(q.absmax[0] == 2.0f);
    assert_int_equal(q.packed[0], 0x3c); /* first element in the high nibble */
    assert_int_equal(q.packed[1], 0xf0);
    assert_int_equal(q.packed[2], 0x77); /* odd tail: padded with the code of 0.0 */
    tdm_nf4_dequantize(&q, out);
    for (int i = 0; i < 5; i++)
        assert_true(out[i] == w[i]);
    tdm_nf4_free(&q);
    assert_int_equal(tdm_nf4_quantize(w, 0, false, &q, &err), TDM_ERR_INVALID);
}

static void test_nearest_choice(void **state)
{
    for (int i = 0; i + 1 < 16; i++) {
        float a = tdm_nf4_code[i], b = tdm_nf4_code[i + 1];
        float mid = (a + b) / 2;
        assert_int_equal(tdm_nf4_quantize_value(nextafterf(mid, a)), i);
        assert_int_equal(tdm_nf4_quantize_value(nextafterf(mid, b)), i + 1);
        assert_int_equal(tdm_nf4_quantize_value(a), i);
    }
    assert_int_equal(tdm_nf4_quantize_value(-5.0f), 0);
    assert_int_equal(tdm_nf4_quantize_value(5.0f), 15);
    assert_int_equal(tdm_nf4_quantize_value(0.0f), 7);
    assert_int_equal(tdm_nf4_quantize_value(-0.0f), 7);
    /* Brute-force agreement on a fine sweep. */
    for (float x = -1.1f; x <= 1.1f; x += 1.0f / 4096) {
        int best = 0;
        for (int j = 1; j < 16; j++)
            if (fabsf(x - tdm_nf4_code[j]) < fabsf(x - tdm_nf4_code[best]))
                best = j;
        assert_int_equal(tdm_nf4_quantize_value(x), best);
    }
}

static float *random_weights(int64_t n, uint64_t seed, double scale)
{
    float *w = malloc((size_t)n * sizeof *w);
    tdm_rng r;
    tdm_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++)
        w[i] = (float)(tdm_rng_normal(&r) * scale);
    return w;
}

static void test_error_bounds(void **state)
{
    const int64_t n = 64 * 300 + 17;
    float *w = random_weights(n, 1, 0.02);
    w[5] = 0.5f; /* one outlier block */
    float *out = malloc((size_t)n * sizeof *out);
    tdm_nf4 q;
    tdm_error err = {0};
    assert_int_equal(tdm_nf4_quantize(w, n, false, &q, &err), TDM_OK);
    assert_int_equal(q.nblocks, 301);
    tdm_nf4_dequantize(&q, out);
    float max_half_gap = 0;
    for (int i = 0; i + 1 < 16; i++)
        max_half_gap = fmaxf(max_half_gap, (tdm_nf4_code[i + 1] - tdm_nf4_code[i]) / 2);
    for (int64_t b = 0; b < q.nblocks; b++) {
        float amax = 0;
        for (int64_t i = b * 64; i < n && i < (b + 1) * 64; i++)
            amax = fmaxf(amax, fabsf(w[i]));
        assert_true(q.absmax[b] == amax);
        for (int64_t i = b * 64; i < n && i < (b + 1) * 64; i++) {
            if (fabsf(w[i] - out[i]) > amax * max_half_gap * (1 + 1e-6f))
                fail_msg("element %lld: %g -> %g exceeds the block bound", (long long)i, w[i],
                         out[i]);
            /* And the chosen code is the nearest to the normalized value. */
            float x = w[i] * (1.0f / amax);
            uint8_t c = (uint8_t)((i & 1) ? q.packed[i / 2] & 15 : q.packed[i / 2] >> 4);
            for (int j = 0; j < 16; j++)
                assert_true(fabsf(x - tdm_nf4_code[c]) <= fabsf(x - tdm_nf4_code[j]));
        }
    }
    /* The element equal to its block's absmax is reproduced exactly (code 15 or 0). */
    assert_true(out[5] == 0.5f);
    tdm_nf4_free(&q);
    free(w);
    free(out);
}

/* The block quantizer (15 compare-and-select passes over a block) picks, element by element,
 * the code tdm_nf4_quantize_value (a binary search) picks, on the inputs where the two could
 * part: values on the midpoints between codes (ties go to the lower code), one ulp either side,
 * +-0, NaN (code 0), the codes themselves. Every block holds a 1.0, so it scales by exactly 1;
 * the count is odd, so the last block is short and its last byte padded. */
static void test_block_codes_match_scalar(void **state)
{
    (void)state;
    const int64_t n = 64 * 40 + 23;
    float *w = malloc((size_t)n * sizeof *w);
    for (int64_t i = 0; i < n; i++) {
        int j = (int)(i % 15), kind = (int)(i / 15 % 7);
        float mid = (tdm_nf4_code[j] + tdm_nf4_code[j + 1]) / 2;
        float v = kind == 0   ? mid
                  : kind == 1 ? nextafterf(mid, -2.0f)
                  : kind == 2 ? nextafterf(mid, 2.0f)
                  : kind == 3 ? tdm_nf4_code[j]
                  : kind == 4 ? (i & 1 ? -0.0f : 0.0f)
                  : kind == 5 ? (i % 3 ? mid : NAN)
                              : -mid;
        w[i] = v;
    }
    for (int64_t b = 0; b * 64 < n; b++)
        w[b * 64 + 5 < n ? b * 64 + 5 : n - 1] = 1.0f;
    tdm_nf4 q;
    tdm_error err = {0};
    assert_int_equal(tdm_nf4_quantize(w, n, false, &q, &err), TDM_OK);
    for (int64_t i = 0; i < n; i++) {
        assert_true(q.absmax[i / 64] == 1.0f);
        uint8_t c = (uint8_t)((i & 1) ? q.packed[i / 2] & 15 : q.packed[i / 2] >> 4);
        if (c != tdm_nf4_quantize_value(w[i]))
            fail_msg("element %lld (%.9g): block code %d, scalar code %d", (long long)i, w[i], c,
                     tdm_nf4_quantize_value(w[i]));
    }
    assert_int_equal(q.packed[n / 2] & 15, 7); /* the odd count's pad: code 7 (0.0) */
    tdm_nf4_free(&q);
    free(w);
}

static void test_double_quant(void **state)
{
    const int64_t n = 64 * 256 * 3 + 100; /* 770 blocks: 4 second-level blocks, last short */
    float *w = random_weights(n, 2, 0.05);
    float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
    tdm_nf4 plain, dq;
    tdm_error err = {0};
    assert_int_equal(tdm_nf4_quantize(w, n, false, &plain, &err), TDM_OK);
    assert_int_equal(tdm_nf4_quantize(w, n, true, &dq, &err), TDM_OK);
    assert_int_equal(dq.nblocks, 770);
    assert_null(dq.absmax);
    /* Same 4-bit codes either way: double quantization only touches the scales. */
    assert_memory_equal(plain.packed, dq.packed, (size_t)(n + 1) / 2);
    double mean = 0;
    for (int64_t i = 0; i < plain.nblocks; i++)
        mean += plain.absmax[i];
    assert_true(dq.offset == (float)(mean / (double)plain.nblocks));
    float m[256];
    tdm_nf4_dynamic_map(m);
    float max_gap = 0;
    for (int i = 0; i + 1 < 256; i++)
        max_gap = fmaxf(max_gap, m[i + 1] - m[i]);
    for (int64_t i = 0; i < dq.nblocks; i++) {
        float amax2 = dq.absmax2[i / 256];
        float rec = tdm_nf4_block_absmax(&dq, i);
        if (fabsf(rec - plain.absmax[i]) > amax2 * max_gap / 2 * 1.0001f + 1e-7f)
            fail_msg("block %lld: absmax %g reconstructed as %g (absmax2 %g)", (long long)i,
                     plain.absmax[i], rec, amax2);
    }
    /* absmax2 is the largest |absmax - offset| of its 256 blocks. */
    for (int64_t j = 0; j < 4; j++) {
        float want = 0;
        for (int64_t i = j * 256; i < dq.nblocks && i < (j + 1) * 256; i++)
            want = fmaxf(want, fabsf(plain.absmax[i] - dq.offset));
        assert_true(dq.absmax2[j] == want);
    }
    tdm_nf4_dequantize(&plain, a);
    tdm_nf4_dequantize(&dq, b);
    double err_sum = 0, err_dq = 0;
    for (int64_t i = 0; i < n; i++) {
        err_sum += fabs((double)a[i] - w[i]);
        err_dq += fabs((double)b[i] - w[i]);
        assert_true(fabsf(a[i] - b[i]) <= fabsf(a[i]) * 0.05f + 1e-6f);
    }
    /* Double quantization costs little accuracy. */
    assert_true(err_dq < err_sum * 1.05);
    assert_int_equal(tdm_nf4_bytes(n, true), (uint64_t)(n + 1) / 2 + 770 + 4 * 4 + 4);
    assert_int_equal(tdm_nf4_bytes(n, false), (uint64_t)(n + 1) / 2 + 770 * 4);
    tdm_nf4_free(&plain);
    tdm_nf4_free(&dq);
    free(w);
    free(a);
    free(b);
}

static void test_zero_block_and_threads(void **state)
{
    const int64_t n = 64 * 200;
    float *w = random_weights(n, 3, 1.0);
    memset(w + 64, 0, 64 * sizeof *w); /* block 1 all zero */
    tdm_nf4 q1, q4;
    tdm_error err = {0};
    omp_set_num_threads(1);
    assert_int_equal(tdm_nf4_quantize(w, n, true, &q1, &err), TDM_OK);
    omp_set_num_threads(4);
    assert_int_equal(tdm_nf4_quantize(w, n, true, &q4, &err), TDM_OK);
    assert_memory_equal(q1.packed, q4.packed, (size_t)n / 2);
    assert_memory_equal(q1.absmax_q, q4.absmax_q, (size_t)q1.nblocks);
    assert_memory_equal(q1.absmax2, q4.absmax2, sizeof(float));
    assert_true(q1.offset == q4.offset);
    for (int i = 32; i < 64; i++)
        assert_int_equal(q1.packed[i], 0x77);
    float *out = malloc((size_t)n * sizeof *out);
    tdm_nf4_dequantize(&q1, out);
    for (int i = 64; i < 128; i++)
        assert_true(out[i] == 0.0f);
    tdm_nf4_free(&q1);
    tdm_nf4_free(&q4);
    free(w);
    free(out);
}

/* Golden: tests/fixtures/model/nf4_golden.safetensors, written by gen_fixtures.py from a NumPy
 * implementation of bitsandbytes' algorithm: "nf4_code" [16], "dynamic_map" [256], and per case
 * "<case>.input" (F32), "<case>.packed" (U8) and either "<case>.absmax" (F32) or
 * "<case>.absmax_q" (U8), "<case>.absmax2" (F32), "<case>.offset" (F32 [1]). */
static void test_golden_reference(void **state)
{
    char path[600];
    snprintf(path, sizeof path, "%s/nf4_golden.safetensors", fixtures_dir());
    if (access(path, F_OK) != 0) {
        print_message("SKIP: %s absent; run tests/fixtures/model/gen_fixtures.py to make it\n",
                      path);
        skip();
    }
    tdm_st_file f;
    tdm_error err = {0};
    if (tdm_st_open(&f, path, &err) != TDM_OK)
        fail_msg("%s", err.message);
    const tdm_st_tensor *t = tdm_st_find(&f, "nf4_code");
    assert_non_null(t);
    float code[16];
    assert_int_equal(tdm_st_tensor_to_f32(t, code, &err), TDM_OK);
    for (int i = 0; i < 16; i++)
        if (code[i] != tdm_nf4_code[i])
            fail_msg("code[%d]: reference %.9g, tandem %.9g", i, code[i], tdm_nf4_code[i]);
    float map[256], ref_map[256];
    tdm_nf4_dynamic_map(map);
    assert_int_equal(tdm_st_tensor_to_f32(tdm_st_find(&f, "dynamic_map"), ref_map, &err), TDM_OK);
    /* torch.linspace's vectorized path may round a point differently from its scalar formula
     * (which tandem follows), so allow one ulp here; the codes below must still agree. */
    for (int i = 0; i < 256; i++)
        if (map[i] != ref_map[i] && nextafterf(map[i], ref_map[i]) != ref_map[i])
            fail_msg("dynamic_map[%d]: reference %.9g, tandem %.9g", i, ref_map[i], map[i]);
    int cases = 0;
    for (size_t k = 0; k < f.n_tensors; k++) {
        const char *name = f.tensors[k].name;
        const char *dot = strstr(name, ".input");
        if (!dot || dot[6])
            continue;
        char prefix[128], key[160];
        snprintf(prefix, sizeof prefix, "%.*s", (int)(dot - name), name);
        const tdm_st_tensor *in = &f.tensors[k];
        float *w = malloc((size_t)in->numel * sizeof *w);
        assert_int_equal(tdm_st_tensor_to_f32(in, w, &err), TDM_OK);
        snprintf(key, sizeof key, "%s.absmax", prefix);
        const tdm_st_tensor *absmax = tdm_st_find(&f, key);
        tdm_nf4 q;
        assert_int_equal(tdm_nf4_quantize(w, in->numel, absmax == NULL, &q, &err), TDM_OK);
        snprintf(key, sizeof key, "%s.packed", prefix);
        const tdm_st_tensor *packed = tdm_st_find(&f, key);
        assert_non_null(packed);
        assert_int_equal(packed->numel, (in->numel + 1) / 2);
        for (int64_t i = 0; i < packed->numel; i++)
            if (((const uint8_t *)packed->data)[i] != q.packed[i])
                fail_msg("%s: packed byte %lld: reference 0x%02x, tandem 0x%02x", prefix,
                         (long long)i, ((const uint8_t *)packed->data)[i], q.packed[i]);
        if (absmax) {
            float *ref = malloc((size_t)absmax->numel * sizeof *ref);
            assert_int_equal(tdm_st_tensor_to_f32(absmax, ref, &err), TDM_OK);
            assert_int_equal(absmax->numel, q.nblocks);
            for (int64_t b = 0; b < q.nblocks; b++)
                assert_true(ref[b] == q.absmax[b]);
            free(ref);
        } else {
            snprintf(key, sizeof key, "%s.absmax_q", prefix);
            const tdm_st_tensor *aq = tdm_st_find(&f, key);
            assert_non_null(aq);
            assert_int_equal(aq->numel, q.nblocks);
            for (int64_t b = 0; b < q.nblocks; b++)
                if (((const uint8_t *)aq->data)[b] != q.absmax_q[b])
                    fail_msg("%s: absmax_q[%lld]: reference %u, tandem %u", prefix,
                             (long long)b, ((const uint8_t *)aq->data)[b], q.absmax_q[b]);
            snprintf(key, sizeof key, "%s.absmax2", prefix);
            const tdm_st_tensor *a2 = tdm_st_find(&f, key);
            float a2v[64];
            assert_true(a2->numel <= 64);
            assert_int_equal(tdm_st_tensor_to_f32(a2, a2v, &err), TDM_OK);
            for (int64_t j = 0; j < a2->numel; j++)
                assert_true(a2v[j] == q.absmax2[j]);
            snprintf(key, sizeof key, "%s.offset", prefix);
            float off;
            assert_int_equal(tdm_st_tensor_to_f32(tdm_st_find(&f, key), &off, &err), TDM_OK);
            assert_true(off == q.offset);
        }
        /* The reference's dequantized values, when given, match too. */
        snprintf(key, sizeof key, "%s.dequant", prefix);
        const tdm_st_tensor *dq = tdm_st_find(&f, key);
        if (dq) {
            float *ref = malloc((size_t)dq->numel * sizeof *ref);
            float *out = malloc((size_t)dq->numel * sizeof *out);
            assert_int_equal(tdm_st_tensor_to_f32(dq, ref, &err), TDM_OK);
            tdm_nf4_dequantize(&q, out);
            for (int64_t i = 0; i < dq->numel; i++)
                if (fabsf(ref[i] - out[i]) > 1e-6f * fabsf(ref[i]))
                    fail_msg("%s: dequant[%lld]: reference %.9g, tandem %.9g", prefix,
                             (long long)i, ref[i], out[i]);
            free(ref);
            free(out);
        }
        tdm_nf4_free(&q);
        free(w);
        cases++;
    }
    assert_true(cases >= 3);
    tdm_st_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_code_table_is_normal_quantiles),
        cmocka_unit_test(test_dynamic_map),
        cmocka_unit_test(test_packing_order),
        cmocka_unit_test(test_nearest_choice),
        cmocka_unit_test(test_error_bounds),
        cmocka_unit_test(test_block_codes_match_scalar),
        cmocka_unit_test(test_double_quant),
        cmocka_unit_test(test_zero_block_and_threads),
        cmocka_unit_test(test_golden_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
