/* test_cpu_math.c — the CPU backend's SIMD exp and row sum (src/engine/cpu/cpu_math.h):
 *  - cpu_expf within 1 ulp of e^x (double, rounded to float) over [-104, 89], on every 389th
 *    float of the range (5.8M values; the whole range, 2.24e9 floats, was checked once: also at
 *    most 1 ulp, the figures are in cpu_math.h), and what expf gives at the edges: 0 below
 *    -103.97 and for -inf, +inf above 88.72 and for +inf, NaN for NaN, 1 at +-0;
 *  - the backend's SwiGLU (SIMD loops over several threads, a length that leaves a scalar tail)
 *    equals the scalar formula with cpu_expf bit for bit, so a result does not depend on where
 *    the vector loop or a thread's share begins;
 *  - cpu_sum_f64 sums in its documented lane order (the same bits at any offset in memory). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/cpu/cpu_math.h"

/* Distance in units in the last place between two finite floats (or infinities). */
static int64_t ulp_distance(float a, float b)
{
    int64_t ia = (int32_t)cpu_f32_bits(a), ib = (int32_t)cpu_f32_bits(b);
    if (ia < 0) ia = INT32_MIN - ia; /* order negative floats below the positive ones */
    if (ib < 0) ib = INT32_MIN - ib;
    return ia > ib ? ia - ib : ib - ia;
}

static void test_expf_accuracy(void **state)
{
    (void)state;
    const uint32_t stride = 389; /* odd, so the low mantissa bits all occur */
    int64_t worst = 0, n = 0;
    float worst_x = 0;
    /* negative floats down to -104, then positive up to 89, by bit pattern */
    const uint32_t ends[2][2] = {{0x80000000u, cpu_f32_bits(-104.0f)}, {0u, cpu_f32_bits(89.0f)}};
    for (int side = 0; side < 2; side++)
        for (uint32_t u = ends[side][0]; u <= ends[side][1]; u += stride) {
            float x = cpu_f32_from_bits(u);
            float want = (float)exp((double)x);
            int64_t d = ulp_distance(cpu_expf(x), want);
            if (d > worst) worst = d, worst_x = x;
            n++;
        }
    printf("  cpu_expf: %lld values in [-104, 89], worst %lld ulp (at %a)\n", (long long)n,
           (long long)worst, (double)worst_x);
    assert_true(worst <= 1);
}

static void test_expf_edges(void **state)
{
    (void)state;
    const float xs[] = {-INFINITY, -1000.0f, -104.0f, -103.98f, -103.9f, -87.5f, -1e-30f, -0.0f,
                        0.0f, 1e-30f, 1.0f, 88.72f, 88.73f, 89.0f, 1000.0f, INFINITY};
    for (size_t i = 0; i < sizeof xs / sizeof *xs; i++) {
        float got = cpu_expf(xs[i]), want = expf(xs[i]);
        if (ulp_distance(got, want) > 1)
            fail_msg("cpu_expf(%a) = %a, expf gives %a", (double)xs[i], (double)got, (double)want);
    }
    assert_true(cpu_expf(-INFINITY) == 0.0f && cpu_expf(-104.0f) == 0.0f);
    assert_true(isinf(cpu_expf(89.0f)) && isinf(cpu_expf(INFINITY)));
    assert_true(cpu_expf(0.0f) == 1.0f && cpu_expf(-0.0f) == 1.0f);
    assert_true(isnan(cpu_expf(NAN)) && isnan(cpu_expf(-NAN)));
}

static void test_swiglu_simd_equals_scalar(void **state)
{
    (void)state;
    tdm_backend *be;
    tdm_error err = {0};
    tdm_backend_opts opts = {.n_threads = 3};
    assert_int_equal(tdm_backend_create(&be, "cpu", &opts, &err), TDM_OK);
    int64_t m = 7, n = 14293, N = m * n; /* over the parallel threshold, odd: scalar tails */
    float *g = malloc((size_t)N * sizeof(float)), *u = malloc((size_t)N * sizeof(float));
    float *h = malloc((size_t)N * sizeof(float));
    for (int64_t i = 0; i < N; i++) { /* gates over [-120, 120]: both saturations */
        g[i] = (float)(240.0 * (double)((i * 7919) % N) / (double)N - 120.0);
        u[i] = (float)((i % 13) - 6) * 0.37f;
    }
    g[5] = NAN, g[N - 1] = INFINITY, g[N - 2] = -INFINITY;
    void *dg, *du, *dh;
    assert_int_equal(tdm_be_alloc(be, TDM_BE_F32, N, &dg, &err), TDM_OK);
    assert_int_equal(tdm_be_alloc(be, TDM_BE_F32, N, &du, &err), TDM_OK);
    assert_int_equal(tdm_be_alloc(be, TDM_BE_F32, N, &dh, &err), TDM_OK);
    assert_int_equal(tdm_be_upload_f32(be, dg, TDM_BE_F32, g, N, &err), TDM_OK);
    assert_int_equal(tdm_be_upload_f32(be, du, TDM_BE_F32, u, N, &err), TDM_OK);
    assert_int_equal(tdm_be_swiglu_fwd(be, dg, du, m, n, dh, &err), TDM_OK);
    assert_int_equal(tdm_be_download_f32(be, h, dh, TDM_BE_F32, N, &err), TDM_OK);
    int64_t differ = 0;
    for (int64_t i = 0; i < N; i++) {
        float want = g[i] * (1.0f / (1.0f + cpu_expf(-g[i]))) * u[i];
        if (memcmp(&want, &h[i], sizeof want) != 0 && !(isnan(want) && isnan(h[i]))) differ++;
    }
    printf("  swiglu_fwd over %lld elements, 3 threads: %lld differ from the scalar formula\n",
           (long long)N, (long long)differ);
    assert_int_equal(differ, 0);
    tdm_be_free(be, dg), tdm_be_free(be, du), tdm_be_free(be, dh);
    tdm_backend_free(be);
    free(g), free(u), free(h);
}

static void test_sum_lanes(void **state)
{
    (void)state;
    enum { N = 1003 };
    float *buf = malloc((N + 8) * sizeof(float));
    for (int i = 0; i < N; i++)
        buf[i] = (float)(i % 17) * 1e-3f + (i % 3 ? 1e7f : -1e7f);
    /* the documented order, written out */
    double lane[CPU_SUM_LANES] = {0}, want = 0;
    int full = N / CPU_SUM_LANES * CPU_SUM_LANES;
    for (int j = 0; j < full; j++)
        lane[j % CPU_SUM_LANES] += (double)buf[j];
    for (int k = 0; k < CPU_SUM_LANES; k++)
        want += lane[k];
    for (int j = full; j < N; j++)
        want += (double)buf[j];
    for (int off = 0; off < 8; off++) { /* the same row at every alignment */
        memmove(buf + off, off ? buf + off - 1 : buf, N * sizeof(float));
        double got = cpu_sum_f64(buf + off, N, false, 0.0f);
        assert_memory_equal(&got, &want, sizeof got);
    }
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expf_accuracy),
        cmocka_unit_test(test_expf_edges),
        cmocka_unit_test(test_swiglu_simd_equals_scalar),
        cmocka_unit_test(test_sum_lanes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
