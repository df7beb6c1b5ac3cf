/* test_cpu_panel_gemm.c — tandem's own kernels for the frozen projections (cpu_panel_gemm.c):
 *  - C = A B^T (forward) and C = A B (backward), beta 0 and 1, against a double reference, over
 *    shapes that end inside a kernel block in every dimension (m not a multiple of 6 or 12, n not
 *    of 16 or 32, k across the 256-long K blocks);
 *  - the bits of an element depend on nothing around it: rows computed alone (fewer than 64: W
 *    read in place, X packed per tile) equal the same rows inside a larger product (W and X laid
 *    out once), 1, 2 and 3 threads give the same bits, and so does the one-thread form the
 *    cross-entropy's tasks use (cpu_panel_gemm_1t, 512-row tiles: a last group of 2 rows once
 *    overran its block);
 *  - through the backend, rows at an offset alone == inside a 2100-row batch for the tiny model's
 *    projections and its cross-entropy (loss and dH: an adapter alone == co-trained);
 *  - an A too large to lay out (packed per tile, 512 rows at most) == the one-thread form;
 *  - the AVX-512 and AVX2 kernels give the same bits (where this CPU has AVX-512);
 *  - through the backend, tdm_be_linear_fwd / linear_bwd with f32 weights use them and equal them;
 *  - a weight laid out once in panels (tdm_be_lay_out_frozen) == the row-major weight, forward,
 *    backward and weight_rows, also read by the AVX2 kernel when laid out for AVX-512;
 *  - the lm_head laid out so == row-major: the cross-entropy's loss and dH, the logits, the
 *    embedding's rows;
 *  - an NF4 weight's products (tiles dequantized straight into panels) == the same values as a
 *    dense f32 weight, forward and backward;
 *  - a bf16 weight widened as its K blocks are packed == its f32 values: the one-thread products,
 *    the cross-entropy, the logits and the embedding (qlora's bf16 lm_head).
 * Skipped (77) on a CPU without AVX2 and FMA, where the backend uses OpenBLAS's tiles. */
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
#include "engine/cpu/cpu_internal.h"
#include "model/nf4.h"
#include "util/half.h"
#include "util/rng.h"

static tdm_rng rng;

static float *rndf(int64_t n)
{
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    assert_non_null(p);
    for (int64_t i = 0; i < n; i++)
        p[i] = (float)(tdm_rng_uniform(&rng) * 2.0 - 1.0);
    return p;
}

static cpu_backend *backend(int threads)
{
    tdm_backend *be;
    tdm_error err = {0};
    tdm_backend_opts o = {.n_threads = threads};
    if (tdm_backend_create(&be, "cpu", &o, &err) != TDM_OK) fail_msg("backend: %s", err.message);
    return cpu_of(be);
}

/* C (m x n) = A (m x k) op(B) + beta C0 through cpu_panel_gemm; returns C (caller frees). */
static float *panel(cpu_backend *cpu, bool tb, int64_t m, int64_t n, int64_t k, const float *a,
                    const float *b, float beta, const float *c0)
{
    float *c = malloc((size_t)(m * n > 0 ? m * n : 1) * sizeof(float));
    assert_non_null(c);
    memcpy(c, c0, (size_t)(m * n) * sizeof(float));
    assert_true(cpu_panel_gemm(cpu, tb, m, n, k, a, k, b, tb ? k : n, beta, c, n));
    return c;
}

static const int64_t ms[] = {1, 5, 13, 97, 130};
static const int64_t ns[] = {1, 15, 16, 17, 33, 64, 100};
static const int64_t ks[] = {1, 7, 256, 300, 600};

static void test_against_double(void **state)
{
    (void)state;
    cpu_backend *cpu = backend(2);
    int checked = 0;
    for (unsigned mi = 0; mi < 5; mi++)
        for (unsigned ni = 0; ni < 7; ni++)
            for (unsigned ki = 0; ki < 5; ki++)
                for (int tb = 0; tb < 2; tb++) {
                    int64_t m = ms[mi], n = ns[ni], k = ks[ki];
                    float beta = (mi + ni + ki) % 2 ? 1.0f : 0.0f;
                    float *a = rndf(m * k), *b = rndf(n * k), *c0 = rndf(m * n);
                    float *c = panel(cpu, tb, m, n, k, a, b, beta, c0);
                    double worst = 0;
                    for (int64_t i = 0; i < m; i++)
                        for (int64_t j = 0; j < n; j++) {
                            double ref = beta * (double)c0[i * n + j], mag = fabs(ref);
                            for (int64_t p = 0; p < k; p++) {
                                double bv = tb ? b[j * k + p] : b[p * n + j];
                                ref += (double)a[i * k + p] * bv;
                                mag += fabs((double)a[i * k + p] * bv);
                            }
                            double e = fabs((double)c[i * n + j] - ref) / (mag + 1e-30);
                            if (e > worst) worst = e;
                        }
                    /* k roundings of at most 2^-24 each, relative to the sum of magnitudes */
                    if (worst > 1.2e-7 * (double)(k + 1))
                        fail_msg("%s m %lld n %lld k %lld beta %g: relative error %.3g",
                                 tb ? "A B^T" : "A B", (long long)m, (long long)n, (long long)k,
                                 beta, worst);
                    checked++;
                    free(a), free(b), free(c0), free(c);
                }
    printf("%d products within k x 1.2e-7 of a double reference (%s kernel)\n", checked,
           cpu_panel_isa_name());
    tdm_backend_free(&cpu->base);
}

/* rows [r0, r0 + rn) alone, against the whole product, at `threads` threads */
static void rows_and_threads(const char *isa, float **whole_out)
{
    const int64_t m = 203, n = 150, k = 530, r0 = 37, rn = 29;
    tdm_rng_seed(&rng, 7);
    float *a = rndf(m * k), *b = rndf(n * k), *c0 = rndf(m * n);
    for (int tb = 0; tb < 2; tb++) {
        float *first = NULL;
        for (int threads = 1; threads <= 3; threads++) {
            cpu_backend *cpu = backend(threads);
            float *c = panel(cpu, tb, m, n, k, a, b, 1.0f, c0);
            float *part = panel(cpu, tb, rn, n, k, a + r0 * k, b, 1.0f, c0 + r0 * n);
            assert_memory_equal(part, c + r0 * n, (size_t)(rn * n) * sizeof(float));
            /* one thread, each K block of B packed as it is used (the cross-entropy's tasks) */
            float *one = malloc((size_t)(m * n) * sizeof(float));
            assert_non_null(one);
            memcpy(one, c0, (size_t)(m * n) * sizeof(float));
            assert_true(cpu_panel_gemm_1t(tb, m, n, k, a, k, b, tb ? k : n, 1.0f, one, n));
            assert_memory_equal(one, c, (size_t)(m * n) * sizeof(float));
            free(one);
            if (first)
                assert_memory_equal(first, c, (size_t)(m * n) * sizeof(float));
            else
                first = c, c = NULL;
            free(c), free(part);
            tdm_backend_free(&cpu->base);
        }
        if (whole_out)
            whole_out[tb] = first;
        else
            free(first);
    }
    printf("%s: rows alone == inside the product, 1 == 2 == 3 threads\n", isa);
    free(a), free(b), free(c0);
}

static void test_rows_threads_and_kernels(void **state)
{
    (void)state;
    float *avx2[2], *avx512[2];
    assert_true(cpu_panel_isa_use("avx2"));
    rows_and_threads("avx2", avx2);
    if (cpu_panel_isa_use("avx512")) {
        rows_and_threads("avx512", avx512);
        for (int tb = 0; tb < 2; tb++) {
            assert_memory_equal(avx2[tb], avx512[tb], (size_t)(203 * 150) * sizeof(float));
            free(avx512[tb]);
        }
        printf("avx512 == avx2, bit for bit\n");
    } else {
        printf("no AVX-512 on this CPU: the AVX-512 kernel is not run\n");
    }
    for (int tb = 0; tb < 2; tb++)
        free(avx2[tb]);
    assert_true(cpu_panel_isa_use(NULL));
}

/* A product whose A is too large to lay out (m x k over TDM_CPU_PANEL_MAX_FLOATS): each task
 * packs its rows per tile, in pieces of at most 512 rows, and must give the bits of the
 * one-thread form's 512-row tiles. */
static void test_tall_a_packed_per_tile(void **state)
{
    (void)state;
    const int64_t k = 4100, m = TDM_CPU_PANEL_MAX_FLOATS / k + 300, n = 20;
    assert_int_equal(tdm_cpu_panel_a_bytes(m, k), 0);
    tdm_rng_seed(&rng, 11);
    float *a = rndf(m * k), *b = rndf(n * k), *c0 = rndf(m * n);
    cpu_backend *cpu = backend(2);
    for (int tb = 0; tb < 2; tb++) {
        float *c = panel(cpu, tb, m, n, k, a, b, 0.0f, c0);
        float *one = malloc((size_t)(m * n) * sizeof(float));
        assert_non_null(one);
        assert_true(cpu_panel_gemm_1t(tb, m, n, k, a, k, b, tb ? k : n, 0.0f, one, n));
        assert_memory_equal(one, c, (size_t)(m * n) * sizeof(float));
        free(one), free(c);
    }
    printf("%lld x %lld x %lld, A packed per tile: == the one-thread form\n", (long long)m,
           (long long)n, (long long)k);
    tdm_backend_free(&cpu->base);
    free(a), free(b), free(c0);
}

static void test_backend_linears(void **state)
{
    (void)state;
    const int64_t m = 70, rows = 48, cols = 40;
    cpu_backend *cpu = backend(3);
    tdm_backend *be = &cpu->base;
    tdm_error err = {0};
    float *w = rndf(rows * cols), *x = rndf(m * cols), *dy = rndf(m * rows);
    tdm_be_weight wt = {.format = TDM_BE_W_F32, .rows = rows, .cols = cols, .data = w};
    float *y = calloc((size_t)(m * rows), sizeof(float)), *dx = calloc((size_t)(m * cols), 4);
    assert_int_equal(tdm_be_linear_fwd(be, &wt, x, m, y, 0.0f, &err), TDM_OK);
    assert_int_equal(tdm_be_linear_bwd(be, &wt, dy, m, dx, 0.0f, &err), TDM_OK);
    float *zy = calloc((size_t)(m * rows), 4), *zx = calloc((size_t)(m * cols), 4);
    float *py = panel(cpu, true, m, rows, cols, x, w, 0.0f, zy);
    float *px = panel(cpu, false, m, cols, rows, dy, w, 0.0f, zx);
    assert_memory_equal(y, py, (size_t)(m * rows) * sizeof(float));
    assert_memory_equal(dx, px, (size_t)(m * cols) * sizeof(float));
    free(w), free(x), free(dy), free(y), free(dx), free(zy), free(zx), free(py), free(px);
    tdm_backend_free(be);
}

/* linear_fwd, linear_bwd (beta 0 and 1) and weight_rows of w (rows x cols) laid out in panels
 * equal those of the row-major weight, bit for bit, at m rows. */
static void laid_equals_row_major(tdm_backend *be, const float *w, int64_t rows, int64_t cols,
                                  const float *laid, int pw, int64_t m)
{
    tdm_error err = {0};
    tdm_be_weight rm = {.format = TDM_BE_W_F32, .rows = rows, .cols = cols, .data = w};
    tdm_be_weight lw = {
        .format = TDM_BE_W_F32_PANELS, .rows = rows, .cols = cols, .data = laid, .panel = pw};
    float *x = rndf(m * cols), *dy = rndf(m * rows);
    for (int b = 0; b < 2; b++) {
        float *y1 = rndf(m * rows), *d1 = rndf(m * cols);
        float *y2 = malloc((size_t)(m * rows) * 4), *d2 = malloc((size_t)(m * cols) * 4);
        memcpy(y2, y1, (size_t)(m * rows) * 4), memcpy(d2, d1, (size_t)(m * cols) * 4);
        assert_int_equal(tdm_be_linear_fwd(be, &rm, x, m, y1, (float)b, &err), TDM_OK);
        assert_int_equal(tdm_be_linear_fwd(be, &lw, x, m, y2, (float)b, &err), TDM_OK);
        assert_int_equal(tdm_be_linear_bwd(be, &rm, dy, m, d1, (float)b, &err), TDM_OK);
        assert_int_equal(tdm_be_linear_bwd(be, &lw, dy, m, d2, (float)b, &err), TDM_OK);
        if (memcmp(y1, y2, (size_t)(m * rows) * 4) || memcmp(d1, d2, (size_t)(m * cols) * 4))
            fail_msg("laid out (%d-row panels) != row-major: %lld x %lld, m %lld, beta %d", pw,
                     (long long)rows, (long long)cols, (long long)m, b);
        free(y1), free(y2), free(d1), free(d2);
    }
    float *r = malloc((size_t)(rows * cols) * 4);
    assert_int_equal(tdm_be_weight_rows(be, &lw, 3, rows - 2, r, TDM_BE_F32, &err), TDM_OK);
    assert_memory_equal(r, w + 3 * cols, (size_t)((rows - 5) * cols) * 4);
    free(x), free(dy), free(r);
}

/* The laid-out cases run once with the kernel that laid the weight out and, on a CPU with
 * AVX-512, once more with the AVX2 kernel reading panels laid out for AVX-512. */
static int laid_out_passes(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") ? 2 : 1;
}

static float *copy_of(const float *p, int64_t n)
{
    float *c = malloc((size_t)n * sizeof(float));
    assert_non_null(c);
    memcpy(c, p, (size_t)n * sizeof(float));
    return c;
}

/* A frozen f32 weight laid out once in the forward's panels (tdm_be_lay_out_frozen: the model
 * does it at load) gives the bits of the row-major weight forward and backward, alone and in
 * co-trained batches' row counts, and reads back as its rows; with the AVX2 kernel reading
 * panels laid out for AVX-512 too (narrower kernel, panel read as rows 32 floats apart). A
 * shape the panels do not divide stays row-major. */
static void test_backend_laid_out(void **state)
{
    (void)state;
    const int64_t shapes[][2] = {{64, 40}, {96, 300}, {128, 17}, {32, 600}};
    const int64_t rows_m[] = {5, 70, 200};
    for (int pass = 0; pass < laid_out_passes(); pass++) {
        cpu_backend *cpu = backend(3);
        tdm_backend *be = &cpu->base;
        tdm_error err = {0};
        for (unsigned si = 0; si < 4; si++) {
            int64_t rows = shapes[si][0], cols = shapes[si][1];
            float *w = rndf(rows * cols), *laid = copy_of(w, rows * cols);
            tdm_be_weight lw = {.format = TDM_BE_W_F32, .rows = rows, .cols = cols, .data = laid};
            assert_int_equal(tdm_be_lay_out_frozen(be, &lw, TDM_BE_FROZEN_PROJECTION, &err), TDM_OK);
            assert_int_equal(lw.format, TDM_BE_W_F32_PANELS);
            if (pass == 1) assert_true(cpu_panel_isa_use("avx2")); /* laid out for AVX-512 */
            for (unsigned mi = 0; mi < 3; mi++)
                laid_equals_row_major(be, w, rows, cols, laid, lw.panel, rows_m[mi]);
            assert_true(cpu_panel_isa_use(NULL));
            free(w), free(laid);
        }
        /* 40 rows: not a whole number of 32-row panels (AVX-512) nor of 16-row ones (AVX2) */
        float *w = rndf(40 * 24);
        tdm_be_weight odd = {.format = TDM_BE_W_F32, .rows = 40, .cols = 24, .data = w};
        assert_int_equal(tdm_be_lay_out_frozen(be, &odd, TDM_BE_FROZEN_PROJECTION, &err), TDM_OK);
        assert_int_equal(odd.format, TDM_BE_W_F32);
        free(w);
        tdm_backend_free(be);
    }
}

/* Through the backend at the tiny model's shapes: rows [off, off + mm) computed alone equal the
 * same rows inside the 2100-row batch (an adapter alone == co-trained) for the four projection
 * shapes, forward and backward, and for the cross-entropy's loss and dH. */
static void test_backend_rows_alone(void **state)
{
    (void)state;
    cpu_backend *cpu = backend(2);
    tdm_backend *be = &cpu->base;
    tdm_error err = {0};
    const int64_t M = 2100, off = 130, mm = 1970;
    const int64_t shapes[][2] = {{256, 256}, {128, 256}, {688, 256}, {256, 688}};
    for (unsigned si = 0; si < 4; si++) {
        int64_t rows = shapes[si][0], cols = shapes[si][1];
        float *w = rndf(rows * cols), *x = rndf(M * cols), *dy = rndf(M * rows);
        tdm_be_weight wt = {.format = TDM_BE_W_F32, .rows = rows, .cols = cols, .data = w};
        float *y1 = calloc((size_t)(M * rows), 4), *y2 = calloc((size_t)(mm * rows), 4);
        float *d1 = calloc((size_t)(M * cols), 4), *d2 = calloc((size_t)(mm * cols), 4);
        assert_int_equal(tdm_be_linear_fwd(be, &wt, x, M, y1, 0.0f, &err), TDM_OK);
        assert_int_equal(tdm_be_linear_fwd(be, &wt, x + off * cols, mm, y2, 0.0f, &err), TDM_OK);
        assert_int_equal(tdm_be_linear_bwd(be, &wt, dy, M, d1, 0.0f, &err), TDM_OK);
        assert_int_equal(tdm_be_linear_bwd(be, &wt, dy + off * rows, mm, d2, 0.0f, &err), TDM_OK);
        assert_memory_equal(y1 + off * rows, y2, (size_t)(mm * rows) * sizeof(float));
        assert_memory_equal(d1 + off * cols, d2, (size_t)(mm * cols) * sizeof(float));
        free(w), free(x), free(dy), free(y1), free(y2), free(d1), free(d2);
    }
    {
        /* the logits' tile: 512 rows x 256 vocabulary rows, k 256, C rows 320 apart */
        float *hh = rndf(650 * 256), *ww = rndf(256 * 256);
        float *c1 = calloc(650 * 320, 4), *c2 = calloc(650 * 320, 4);
        assert_true(cpu_panel_gemm_1t(true, 512, 256, 256, hh, 256, ww, 256, 0.0f, c1, 320));
        assert_true(cpu_panel_gemm_1t(true, 512, 256, 256, hh + 130 * 256, 256, ww, 256, 0.0f, c2, 320));
        for (int64_t i = 0; i < 382; i++)
            if (memcmp(c1 + (130 + i) * 320, c2 + i * 320, 256 * 4))
                fail_msg("logits row %lld (full 130 + it) differs", (long long)i);
        free(hh), free(ww), free(c1), free(c2);
    }
    const int64_t V = 320, d = 256;
    float *W = rndf(V * d), *h = rndf(M * d), *wt = malloc((size_t)M * sizeof(float));
    int32_t *lab = malloc((size_t)M * sizeof(int32_t));
    for (int64_t i = 0; i < M; i++)
        lab[i] = (int32_t)(i % V), wt[i] = 1.0f;
    tdm_be_weight lw = {.format = TDM_BE_W_F32, .rows = V, .cols = d, .data = W};
    float *l1 = calloc((size_t)M, 4), *l2 = calloc((size_t)mm, 4);
    float *g1 = calloc((size_t)(M * d), 4), *g2 = calloc((size_t)(mm * d), 4);
    assert_int_equal(tdm_be_cross_entropy(be, h, &lw, lab, wt, M, 512, l1, g1, &err), TDM_OK);
    assert_int_equal(
        tdm_be_cross_entropy(be, h + off * d, &lw, lab + off, wt + off, mm, 512, l2, g2, &err),
        TDM_OK);
    assert_memory_equal(l1 + off, l2, (size_t)mm * sizeof(float));
    assert_memory_equal(g1 + off * d, g2, (size_t)(mm * d) * sizeof(float));
    free(W), free(h), free(wt), free(lab), free(l1), free(l2), free(g1), free(g2);
    tdm_backend_free(be);
}

/* The lm_head laid out in panels (tdm_be_lay_out_frozen, TDM_BE_FROZEN_LM_HEAD: the model does
 * it at load, the tied embedding table with it) gives the row-major weight's bits: the
 * cross-entropy's loss and dH (the logits one product over all threads, dH's vocabulary blocks
 * transposed back piece by piece; a last block of 32 rows, ignored labels, a last chunk of 44
 * rows, a hidden size that ends inside a panel), the logits of generation (linear_fwd, 1 and 70
 * rows) and the embedding's rows; with the AVX2 kernel reading panels laid out for AVX-512
 * too. A vocabulary the panels do not divide stays row-major. */
static void test_backend_lm_head_laid_out(void **state)
{
    (void)state;
    const int64_t shapes[][2] = {{2080, 200}, {320, 256}};
    const int64_t M = 300, chunk = 128;
    for (int pass = 0; pass < laid_out_passes(); pass++) {
        cpu_backend *cpu = backend(3);
        tdm_backend *be = &cpu->base;
        tdm_error err = {0};
        for (unsigned si = 0; si < 2; si++) {
            int64_t V = shapes[si][0], d = shapes[si][1];
            float *w = rndf(V * d), *laid = copy_of(w, V * d), *h = rndf(M * d);
            float *wt = malloc((size_t)M * 4);
            int32_t *lab = malloc((size_t)M * sizeof(int32_t));
            for (int64_t i = 0; i < M; i++) {
                lab[i] = i % 7 == 3 ? -100 : (int32_t)((i * 37) % V);
                wt[i] = lab[i] == -100 ? 0.0f : 1.0f / (float)(1 + i % 3);
            }
            tdm_be_weight rw = {.format = TDM_BE_W_F32, .rows = V, .cols = d, .data = w};
            tdm_be_weight lw = {.format = TDM_BE_W_F32, .rows = V, .cols = d, .data = laid};
            assert_int_equal(tdm_be_lay_out_frozen(be, &lw, TDM_BE_FROZEN_LM_HEAD, &err), TDM_OK);
            assert_int_equal(lw.format, TDM_BE_W_F32_PANELS);
            if (pass == 1) assert_true(cpu_panel_isa_use("avx2")); /* laid out for AVX-512 */
            float *l1 = calloc((size_t)M, 4), *l2 = calloc((size_t)M, 4);
            float *g1 = calloc((size_t)(M * d), 4), *g2 = calloc((size_t)(M * d), 4);
            assert_int_equal(tdm_be_cross_entropy(be, h, &rw, lab, wt, M, chunk, l1, g1, &err),
                             TDM_OK);
            assert_int_equal(tdm_be_cross_entropy(be, h, &lw, lab, wt, M, chunk, l2, g2, &err),
                             TDM_OK);
            assert_memory_equal(l1, l2, (size_t)M * 4);
            assert_memory_equal(g1, g2, (size_t)(M * d) * 4);
            const int64_t logit_rows[] = {1, 70};
            for (unsigned mi = 0; mi < 2; mi++) {
                int64_t m = logit_rows[mi];
                float *y1 = calloc((size_t)(m * V), 4), *y2 = calloc((size_t)(m * V), 4);
                assert_int_equal(tdm_be_linear_fwd(be, &rw, h, m, y1, 0.0f, &err), TDM_OK);
                assert_int_equal(tdm_be_linear_fwd(be, &lw, h, m, y2, 0.0f, &err), TDM_OK);
                assert_memory_equal(y1, y2, (size_t)(m * V) * 4);
                free(y1), free(y2);
            }
            int32_t ids[] = {0, 31, 32, (int32_t)V - 1, 5};
            float *e1 = malloc((size_t)(5 * d) * 4), *e2 = malloc((size_t)(5 * d) * 4);
            assert_int_equal(tdm_be_embedding(be, &rw, ids, 5, e1, &err), TDM_OK);
            assert_int_equal(tdm_be_embedding(be, &lw, ids, 5, e2, &err), TDM_OK);
            assert_memory_equal(e1, e2, (size_t)(5 * d) * 4);
            assert_true(cpu_panel_isa_use(NULL));
            free(w), free(laid), free(h), free(wt), free(lab), free(l1), free(l2), free(g1),
                free(g2), free(e1), free(e2);
        }
        /* 2072 rows: not a whole number of 32-row panels (AVX-512) nor of 16-row ones (AVX2) */
        float *w = rndf(2072 * 8);
        tdm_be_weight odd = {.format = TDM_BE_W_F32, .rows = 2072, .cols = 8, .data = w};
        assert_int_equal(tdm_be_lay_out_frozen(be, &odd, TDM_BE_FROZEN_LM_HEAD, &err), TDM_OK);
        assert_int_equal(odd.format, TDM_BE_W_F32);
        free(w);
        tdm_backend_free(be);
    }
}

/* A bf16 weight (qlora keeps the lm_head and the embedding table as a bf16 checkpoint stores
 * them, engine/model.c embed_dtype): cpu_panel_gemm_1t_bf16 widening B as it packs it gives the
 * bits of cpu_panel_gemm_1t on the widened f32 values, both directions, beta 0 and 1, over
 * the shape lists (n and k ending inside a group of 8 rows and a transpose block); and through
 * the backend the cross-entropy's loss and dH (logits tiles, dH's vocabulary blocks), the logits
 * of generation and the embedding's rows equal the f32 weight's, a vocabulary and a hidden size
 * that end inside a panel and inside a group of 8 (2075 x 203); with the AVX2 kernel too. */
static void test_bf16_weight(void **state)
{
    (void)state;
    tdm_rng_seed(&rng, 23);
    for (int pass = 0; pass < laid_out_passes(); pass++) {
        if (pass == 1) assert_true(cpu_panel_isa_use("avx2"));
        for (unsigned mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
            for (unsigned ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
                for (unsigned ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
                    for (int tb = 0; tb < 2; tb++) {
                        int64_t m = ms[mi], n = ns[ni], k = ks[ki];
                        float *a = rndf(m * k), *b = rndf(n * k), *c1 = rndf(m * n);
                        uint16_t *b16 = malloc((size_t)(n * k) * sizeof(uint16_t));
                        float *c2 = copy_of(c1, m * n);
                        assert_non_null(b16);
                        tdm_f32_to_bf16_n(b, b16, (size_t)(n * k));
                        tdm_bf16_to_f32_n(b16, b, (size_t)(n * k)); /* b holds the bf16 values */
                        float beta = (mi + ni + ki) % 2 ? 1.0f : 0.0f;
                        assert_true(cpu_panel_gemm_1t(tb, m, n, k, a, k, b, tb ? k : n, beta, c1, n));
                        assert_true(
                            cpu_panel_gemm_1t_bf16(tb, m, n, k, a, k, b16, tb ? k : n, beta, c2, n));
                        assert_memory_equal(c1, c2, (size_t)(m * n) * sizeof(float));
                        free(a), free(b), free(b16), free(c1), free(c2);
                    }
        cpu_backend *cpu = backend(3);
        tdm_backend *be = &cpu->base;
        tdm_error err = {0};
        const int64_t V = 2075, d = 203, M = 300, chunk = 128;
        float *w = rndf(V * d), *h = rndf(M * d), *wt = malloc((size_t)M * 4);
        uint16_t *w16 = malloc((size_t)(V * d) * sizeof(uint16_t));
        int32_t *lab = malloc((size_t)M * sizeof(int32_t));
        assert_non_null(wt), assert_non_null(w16), assert_non_null(lab);
        tdm_f32_to_bf16_n(w, w16, (size_t)(V * d));
        tdm_bf16_to_f32_n(w16, w, (size_t)(V * d));
        for (int64_t i = 0; i < M; i++) {
            lab[i] = i % 7 == 3 ? -100 : (int32_t)((i * 37) % V);
            wt[i] = lab[i] == -100 ? 0.0f : 1.0f / (float)(1 + i % 3);
        }
        tdm_be_weight fw = {.format = TDM_BE_W_F32, .rows = V, .cols = d, .data = w};
        tdm_be_weight bw = {.format = TDM_BE_W_BF16, .rows = V, .cols = d, .data = w16};
        float *l1 = calloc((size_t)M, 4), *l2 = calloc((size_t)M, 4);
        float *g1 = calloc((size_t)(M * d), 4), *g2 = calloc((size_t)(M * d), 4);
        assert_int_equal(tdm_be_cross_entropy(be, h, &fw, lab, wt, M, chunk, l1, g1, &err), TDM_OK);
        assert_int_equal(tdm_be_cross_entropy(be, h, &bw, lab, wt, M, chunk, l2, g2, &err), TDM_OK);
        assert_memory_equal(l1, l2, (size_t)M * 4);
        assert_memory_equal(g1, g2, (size_t)(M * d) * 4);
        float *y1 = calloc((size_t)(70 * V), 4), *y2 = calloc((size_t)(70 * V), 4);
        assert_int_equal(tdm_be_linear_fwd(be, &fw, h, 70, y1, 0.0f, &err), TDM_OK);
        assert_int_equal(tdm_be_linear_fwd(be, &bw, h, 70, y2, 0.0f, &err), TDM_OK);
        assert_memory_equal(y1, y2, (size_t)(70 * V) * 4);
        int32_t ids[] = {0, 31, 32, (int32_t)V - 1, 5};
        float *e1 = malloc((size_t)(5 * d) * 4), *e2 = malloc((size_t)(5 * d) * 4);
        assert_int_equal(tdm_be_embedding(be, &fw, ids, 5, e1, &err), TDM_OK);
        assert_int_equal(tdm_be_embedding(be, &bw, ids, 5, e2, &err), TDM_OK);
        assert_memory_equal(e1, e2, (size_t)(5 * d) * 4);
        free(w), free(w16), free(h), free(wt), free(lab), free(l1), free(l2), free(g1), free(g2),
            free(y1), free(y2), free(e1), free(e2);
        tdm_backend_free(be);
        assert_true(cpu_panel_isa_use(NULL));
    }
    printf("bf16 weights widened as packed == their f32 values, bit for bit\n");
}

/* An NF4 weight's products (--method qlora: each tile of W's rows dequantized straight into the
 * product's panels, cpu_nf4_tile_panels) give the bits of the same values as a dense f32
 * weight (its rows from tdm_be_weight_rows), forward and backward, beta 0 and 1: a 4864 x 896
 * weight of two tiles (the backward's K blocks summed across them), tile rows that end inside
 * a panel (200) and columns inside an NF4 block and a panel (72, 688); double quantization and
 * not; with the AVX2 kernel too. */
static void test_backend_nf4_panels(void **state)
{
    (void)state;
    const int64_t shapes[][2] = {{4864, 896}, {200, 72}, {96, 688}};
    const int64_t m = 70;
    for (int pass = 0; pass < laid_out_passes(); pass++) {
        cpu_backend *cpu = backend(3);
        tdm_backend *be = &cpu->base;
        tdm_error err = {0};
        if (pass == 1) assert_true(cpu_panel_isa_use("avx2"));
        for (unsigned si = 0; si < 3; si++) {
            int64_t rows = shapes[si][0], cols = shapes[si][1];
            float *host = rndf(rows * cols), *x = rndf(m * cols), *dy = rndf(m * rows);
            tdm_nf4 q;
            assert_int_equal(tdm_nf4_quantize(host, rows * cols, si != 1, &q, &err), TDM_OK);
            tdm_be_weight nw = {.rows = rows, .cols = cols, .codes = q.packed};
            if (q.double_quant)
                nw.format = TDM_BE_W_NF4_DQ, nw.absmax_q = q.absmax_q, nw.absmax2 = q.absmax2,
                nw.offset = q.offset;
            else
                nw.format = TDM_BE_W_NF4, nw.absmax = q.absmax;
            float *dense = malloc((size_t)(rows * cols) * 4);
            assert_int_equal(tdm_be_weight_rows(be, &nw, 0, rows, dense, TDM_BE_F32, &err),
                             TDM_OK);
            tdm_be_weight dw = {.format = TDM_BE_W_F32, .rows = rows, .cols = cols, .data = dense};
            for (int b = 0; b < 2; b++) {
                float beta = (float)b;
                float *y1 = rndf(m * rows), *y2 = copy_of(y1, m * rows);
                float *d1 = rndf(m * cols), *d2 = copy_of(d1, m * cols);
                assert_int_equal(tdm_be_linear_fwd(be, &dw, x, m, y1, beta, &err), TDM_OK);
                assert_int_equal(tdm_be_linear_fwd(be, &nw, x, m, y2, beta, &err), TDM_OK);
                assert_memory_equal(y1, y2, (size_t)(m * rows) * 4);
                assert_int_equal(tdm_be_linear_bwd(be, &dw, dy, m, d1, beta, &err), TDM_OK);
                assert_int_equal(tdm_be_linear_bwd(be, &nw, dy, m, d2, beta, &err), TDM_OK);
                assert_memory_equal(d1, d2, (size_t)(m * cols) * 4);
                free(y1), free(y2), free(d1), free(d2);
            }
            tdm_nf4_free(&q);
            free(host), free(x), free(dy), free(dense);
        }
        assert_true(cpu_panel_isa_use(NULL));
        tdm_backend_free(be);
    }
}

int main(void)
{
    tdm_rng_seed(&rng, 1);
    if (!cpu_panel_isa_name()) {
        printf("no AVX2 + FMA (or TANDEM_CPU_PANELS=0): the backend uses OpenBLAS's tiles\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_double),
        cmocka_unit_test(test_rows_threads_and_kernels),
        cmocka_unit_test(test_tall_a_packed_per_tile),
        cmocka_unit_test(test_backend_linears),
        cmocka_unit_test(test_backend_rows_alone),
        cmocka_unit_test(test_backend_laid_out),
        cmocka_unit_test(test_backend_lm_head_laid_out),
        cmocka_unit_test(test_backend_nf4_panels),
        cmocka_unit_test(test_bf16_weight),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
