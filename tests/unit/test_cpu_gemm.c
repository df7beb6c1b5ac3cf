/* test_cpu_gemm.c — the CPU backend's GEMMs give bits that depend neither on the thread count nor
 * on the rows and columns around an element (docs/engine.md, Determinism):
 *  - cpu_blas_sgemm: rows of op(A) computed alone equal the same rows inside a larger product,
 *    columns alone the same columns inside a wider one, over the four transposes, k not a multiple
 *    of 32, k over one K block (256) and over OpenBLAS's own (448), products on both sides of
 *    OpenBLAS's small-kernel bound (m n k <= 10^6), alpha and beta other than 1 and 0;
 *  - 1, 2 and 3 threads give the same bits (from serial code: one threaded call; and inside a
 *    parallel region: single-threaded);
 *  - through the backend (tdm_be_gemm, cross-entropy): the tiles are the default; the threaded
 *    calls (TANDEM_CPU_GEMM=blas with the OpenMP build of OpenBLAS, on a core whose kernels were
 *    measured) and the tiles give the same GEMM
 * bits, each at 1 and 3 threads; the cross-entropy's dH is summed in another order by the tiles
 * (vocabulary blocks) than by the threaded call, so there the two modes agree within float rounding
 * and each mode is bit-identical to itself at 1 and 3 threads. On OpenBLAS cores outside
 * cpu_blas_bits_measured (Haswell, Zen: rows and threads differ) the first two tests print their
 * counts and are skipped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/cpu/cpu_internal.h"
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

static int64_t ndiff(const float *x, int64_t ldx, const float *y, int64_t ldy, int64_t rows,
                     int64_t cols)
{
    int64_t d = 0;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++)
            d += memcmp(&x[i * ldx + j], &y[i * ldy + j], sizeof(float)) != 0;
    return d;
}

/* One product: op(A) (M, k), op(B) (k, n), C (M, n) from C0; A is (k, M) when ta, B (n, k) when
 * tb. */
typedef struct {
    bool ta, tb;
    int64_t M, n, k;
    float alpha, beta;
    float *a, *b, *c0;
} prod;

static prod prod_make(bool ta, bool tb, int64_t M, int64_t n, int64_t k, float alpha, float beta)
{
    prod p = {ta, tb, M, n, k, alpha, beta, rndf(M * k), rndf(k * n), rndf(M * n)};
    return p;
}

static void prod_free(prod *p)
{
    free(p->a), free(p->b), free(p->c0);
}

/* Rows [r0, r0+m) and columns [c0, c0+w) of the product, with nt threads, into c (ldc w). */
static void prod_run(const prod *p, int nt, int64_t r0, int64_t m, int64_t c0, int64_t w, float *c)
{
    for (int64_t i = 0; i < m; i++)
        memcpy(c + i * w, p->c0 + (r0 + i) * p->n + c0, (size_t)w * sizeof(float));
    const float *a = p->ta ? p->a + r0 : p->a + r0 * p->k;
    const float *b = p->tb ? p->b + c0 * p->k : p->b + c0;
    cpu_blas_sgemm(nt, p->ta, p->tb, m, w, p->k, p->alpha, a, p->ta ? p->M : p->k, b,
                   p->tb ? p->k : p->n, p->beta, c, w);
}

static void test_rows_and_columns(void **state)
{
    (void)state;
    tdm_rng_seed(&rng, 7);
    const int64_t ks[] = {1, 5, 31, 33, 100, 255, 256, 257, 300, 500, 700};
    const int64_t ns[] = {1, 3, 16, 37, 100};
    int64_t shapes = 0, small = 0, row_bad = 0, col_bad = 0;
    for (int t = 0; t < 4; t++)
        for (size_t ik = 0; ik < sizeof ks / sizeof *ks; ik++)
            for (size_t in = 0; in < sizeof ns / sizeof *ns; in++) {
                int64_t k = ks[ik], n = ns[in];
                /* M rows: a large product (over 10^6 multiply-adds per K block where it can be);
                 * its rows [5, 5+m) alone: few, so a small-kernel call */
                int64_t kb = k < 256 ? k : 256;
                int64_t M = 1000000 / (n * kb) + 40;
                if (M > 3000) M = 3000;
                int64_t m = 1 + (int64_t)(ik % 3);
                float alpha = in % 2 ? 0.37f : 1.0f, beta = ik % 3 == 0   ? 1.0f
                                                            : ik % 3 == 1 ? 0
                                                                          : 0.6f;
                prod p = prod_make(t & 1, t >> 1, M, n, k, alpha, beta);
                float *full = malloc((size_t)(M * n) * sizeof(float));
                float *rows = malloc((size_t)(m * n) * sizeof(float));
                prod_run(&p, 1, 0, M, 0, n, full);
                prod_run(&p, 1, 5, m, 0, n, rows);
                int64_t dr = ndiff(rows, n, full + 5 * n, n, m, n);
                int64_t dc = 0;
                if (n > 3) { /* columns [1, n-1) of all rows */
                    float *cols = malloc((size_t)(M * (n - 2)) * sizeof(float));
                    prod_run(&p, 1, 0, M, 1, n - 2, cols);
                    dc = ndiff(cols, n - 2, full + 1, n, M, n - 2);
                    free(cols);
                }
                if (dr || dc)
                    print_message("ta %d tb %d M %lld m %lld n %lld k %lld: %lld row values, %lld "
                                  "column values differ\n",
                                  t & 1, t >> 1, (long long)M, (long long)m, (long long)n,
                                  (long long)k, (long long)dr, (long long)dc);
                shapes++;
                small += (double)m * (double)n * (double)kb <= 1e6 && (double)M * n * kb > 1e6;
                row_bad += dr != 0, col_bad += dc != 0;
                free(full), free(rows);
                prod_free(&p);
            }
    print_message("%lld shapes (%lld with the rows alone a small-kernel call, the whole not): "
                  "%lld differ in rows alone, %lld in columns alone\n",
                  (long long)shapes, (long long)small, (long long)row_bad, (long long)col_bad);
    assert_true(small > shapes / 2);
    if (!cpu_blas_bits_measured()) {
        print_message("OpenBLAS core %s: not one whose bits were measured; the backend runs "
                      "tiles, whose rows are not claimed independent here\n",
                      openblas_get_corename());
        skip();
    }
    assert_int_equal(row_bad, 0);
    assert_int_equal(col_bad, 0);
}

static void test_thread_counts(void **state)
{
    (void)state;
    tdm_rng_seed(&rng, 11);
    /* above the 2^21 multiply-adds per thread and K block, so that 3 threads do share them */
    const int64_t shapes[][3] = {
        {300, 160, 300}, {257, 896, 33}, {512, 130, 700}, {64, 1024, 1000}};
    int64_t bad = 0, n_shapes = 0;
    for (int t = 0; t < 4; t++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            int64_t M = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
            prod p = prod_make(t & 1, t >> 1, M, n, k, 0.5f, 1.0f);
            float *c[4];
            for (int i = 0; i < 4; i++)
                c[i] = malloc((size_t)(M * n) * sizeof(float));
            prod_run(&p, 1, 0, M, 0, n, c[0]);
            prod_run(&p, 2, 0, M, 0, n, c[1]);
            prod_run(&p, 3, 0, M, 0, n, c[2]);
            /* inside a parallel region: single-threaded, whatever nt says */
#pragma omp parallel num_threads(2)
            {
#pragma omp single
                prod_run(&p, 3, 0, M, 0, n, c[3]);
            }
            for (int i = 1; i < 4; i++) {
                int64_t d = ndiff(c[i], n, c[0], n, M, n);
                if (d)
                    print_message("ta %d tb %d %lld x %lld x %lld: case %d differs from 1 thread "
                                  "in %lld values\n",
                                  t & 1, t >> 1, (long long)M, (long long)n, (long long)k, i,
                                  (long long)d);
                bad += d != 0;
            }
            n_shapes++;
            for (int i = 0; i < 4; i++)
                free(c[i]);
            prod_free(&p);
        }
    print_message("%lld shapes: 1 vs 2 vs 3 threads vs inside a parallel region: %lld differ\n",
                  (long long)n_shapes, (long long)bad);
    if (!cpu_blas_bits_measured()) { /* the backend makes no threaded calls there */
        print_message("OpenBLAS core %s: threaded calls not used by default\n",
                      openblas_get_corename());
        skip();
    }
    assert_int_equal(bad, 0);
}

/* ---- through the backend: the threaded calls and the tiles ---- */

typedef struct {
    float *gemm;      /* (m, n) */
    float *dh, *loss; /* cross-entropy: (m, d), (m) */
    bool blas_threaded;
} mode_out;

/* On the CPU backend device memory is host memory: filled and read with memcpy here. */
static void *dev(tdm_backend *be, int64_t numel)
{
    void *p = NULL;
    tdm_error err = {0};
    if (tdm_be_alloc(be, TDM_BE_F32, numel, &p, &err) != TDM_OK) fail_msg("alloc: %s", err.message);
    return p;
}

static mode_out run_mode(const char *mode, int n_threads)
{
    if (mode)
        setenv("TANDEM_CPU_GEMM", mode, 1);
    else
        unsetenv("TANDEM_CPU_GEMM");
    tdm_backend *be;
    tdm_error err = {0};
    tdm_backend_opts o = {.n_threads = n_threads};
    if (tdm_backend_create(&be, "cpu", &o, &err) != TDM_OK) fail_msg("backend: %s", err.message);
    unsetenv("TANDEM_CPU_GEMM");
    mode_out r = {.blas_threaded = cpu_of(be)->blas_threaded};
    tdm_rng_seed(&rng, 5);
    /* a GEMM over several tiles (128 rows) with k % 32 != 0 and over one K block */
    int64_t m = 300, n = 200, k = 301;
    float *a = rndf(m * k), *b = rndf(n * k), *c = rndf(m * n);
    float *da, *db, *dc;
    da = dev(be, m * k);
    db = dev(be, n * k);
    dc = dev(be, m * n);
    memcpy(da, a, (size_t)(m * k) * 4), memcpy(db, b, (size_t)(n * k) * 4);
    memcpy(dc, c, (size_t)(m * n) * 4);
    tdm_gemm_args g = {.trans_b = true,
                       .m = m,
                       .n = n,
                       .k = k,
                       .alpha = 0.5f,
                       .a = da,
                       .lda = k,
                       .b = db,
                       .ldb = k,
                       .beta = 1.0f,
                       .c = dc,
                       .ldc = n};
    if (tdm_be_gemm(be, &g, &err) != TDM_OK) fail_msg("gemm: %s", err.message);
    r.gemm = malloc((size_t)(m * n) * 4);
    memcpy(r.gemm, dc, (size_t)(m * n) * 4);
    /* cross-entropy over a vocabulary of two of the tiles' blocks (4096) and more */
    int64_t rows = 40, d = 48, V = 9000;
    float *h = rndf(rows * d), *w = rndf(V * d);
    int32_t *lab = malloc((size_t)rows * sizeof(int32_t));
    float *wt = malloc((size_t)rows * sizeof(float));
    for (int64_t i = 0; i < rows; i++)
        lab[i] = (int32_t)((i * 977) % V), wt[i] = 1.0f / (float)rows;
    float *dh_, *dw, *dwt, *dloss, *ddh;
    int32_t *dlab;
    dh_ = dev(be, rows * d);
    dw = dev(be, V * d);
    dwt = dev(be, rows);
    dloss = dev(be, rows);
    ddh = dev(be, rows * d);
    dlab = dev(be, rows); /* 4-byte elements, as f32 */
    memcpy(dh_, h, (size_t)(rows * d) * 4), memcpy(dw, w, (size_t)(V * d) * 4);
    memcpy(dwt, wt, (size_t)rows * 4), memcpy(dlab, lab, (size_t)rows * 4);
    tdm_be_weight wd = {.format = TDM_BE_W_F32, .rows = V, .cols = d, .data = dw};
    if (tdm_be_cross_entropy(be, dh_, &wd, dlab, dwt, rows, 16, dloss, ddh, &err) != TDM_OK)
        fail_msg("cross_entropy: %s", err.message);
    r.dh = malloc((size_t)(rows * d) * 4), r.loss = malloc((size_t)rows * 4);
    memcpy(r.dh, ddh, (size_t)(rows * d) * 4), memcpy(r.loss, dloss, (size_t)rows * 4);
    free(a), free(b), free(c), free(h), free(w), free(lab), free(wt);
    tdm_backend_free(be);
    return r;
}

static void mode_free(mode_out *r)
{
    free(r->gemm), free(r->dh), free(r->loss);
}

static double max_rel(const float *x, const float *y, int64_t n)
{
    double md = 0, my = 0;
    for (int64_t i = 0; i < n; i++) {
        md = fmax(md, fabs((double)x[i] - (double)y[i]));
        my = fmax(my, fabs((double)y[i]));
    }
    return md / (my > 0 ? my : 1);
}

static void test_backend_modes(void **state)
{
    (void)state;
    /* the threaded calls where their bits were measured thread-count independent (else the
     * tiles twice: the comparisons below then hold trivially) */
    const char *bm = cpu_blas_threaded() && cpu_blas_bits_measured() ? "blas" : "tiles";
    mode_out b1 = run_mode(bm, 1), b3 = run_mode(bm, 3);
    mode_out t1 = run_mode("tiles", 1), t3 = run_mode("tiles", 3), d1 = run_mode(NULL, 1);
    assert_false(t1.blas_threaded);
    assert_false(d1.blas_threaded); /* the default is the tiles */
    assert_int_equal(b1.blas_threaded, strcmp(bm, "blas") == 0);
    print_message("OpenBLAS %s (%s, core %s): compared %s with the tiles\n",
                  cpu_blas_threaded() ? "OpenMP build" : "not the OpenMP build",
                  openblas_get_config(), openblas_get_corename(),
                  b1.blas_threaded ? "threaded calls" : "the tiles");
    int64_t mn = 300 * 200, rd = 40 * 48;
    /* GEMM: the same bits in every mode and thread count */
    assert_int_equal(ndiff(b1.gemm, 0, b3.gemm, 0, 1, mn), 0);
    assert_int_equal(ndiff(t1.gemm, 0, t3.gemm, 0, 1, mn), 0);
    int64_t dbt = ndiff(b1.gemm, 0, t1.gemm, 0, 1, mn);
    print_message("gemm 300 x 200 x 301: threaded call vs tiles: %lld of %lld values differ\n",
                  (long long)dbt, (long long)mn);
    assert_int_equal(dbt, 0);
    /* cross-entropy: each mode the same at 1 and 3 threads; across modes within rounding */
    assert_int_equal(ndiff(b1.dh, 0, b3.dh, 0, 1, rd), 0);
    assert_int_equal(ndiff(b1.loss, 0, b3.loss, 0, 1, 40), 0);
    assert_int_equal(ndiff(t1.dh, 0, t3.dh, 0, 1, rd), 0);
    assert_int_equal(ndiff(t1.loss, 0, t3.loss, 0, 1, 40), 0);
    assert_int_equal(ndiff(b1.loss, 0, t1.loss, 0, 1, 40), 0); /* the logits are GEMMs */
    double rel = max_rel(b1.dh, t1.dh, rd);
    print_message("cross-entropy dH (V 9000): threaded call vs tiles: max rel diff %.3g\n", rel);
    assert_true(rel < 1e-5);
    mode_free(&b1), mode_free(&b3), mode_free(&t1), mode_free(&t3), mode_free(&d1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows_and_columns),
        cmocka_unit_test(test_thread_counts),
        cmocka_unit_test(test_backend_modes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
