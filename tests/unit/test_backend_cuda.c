/* test_backend_cuda.c — every op of the CUDA backend against the CPU backend on the same random
 * inputs (never zero; inputs rounded to bf16 first so both backends see identical values), with
 * per-op tolerances: bf16 activations ~1e-2 relative (norm-wise: max |got - want| / max |want|),
 * f32-only ops (AdamW, sums of squares) 1e-5. Each check prints
 *     op                                   max_rel_err  (tol)
 * LoRA dropout: the op with dropout, the GPU's mask bit-identical to the CPU's (test_lora_dropout),
 * and a training step of the model with dropout (test_model_step_dropout).
 * Also: device-side errors (bad token id) surface at synchronize, an impossible allocation is
 * TDM_ERR_NOMEM naming cudaMalloc, determinism (two runs, same bits), and memory accounting.
 *
 * Without a GPU (or a build without CUDA) it checks that creating the "cuda" backend fails
 * cleanly with NOT_FOUND / UNSUPPORTED, then exits 77 (ctest: skipped).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "engine/backend.h"
#include "engine/dropout.h"
#include "engine/model.h"
#include "model/init_model.h"
#include "model/nf4.h"
#include "util/half.h"
#include "util/rng.h"

static tdm_backend *cpu, *gpu;
static tdm_rng rng;

#define OK(call)                                                                                   \
    do {                                                                                           \
        tdm_error err_ = {0};                                                                      \
        tdm_error *err = &err_;                                                                    \
        if ((call) != TDM_OK) fail_msg("%s: %s", #call, err_.message);                             \
    } while (0)

/* ---- host data ---- */

static float rnd1(void)
{
    double u = tdm_rng_uniform(&rng);
    double mag = 0.1 + 0.9 * tdm_rng_uniform(&rng);
    return (float)(u < 0.5 ? -mag : mag);
}

/* n random values (|x| in [0.1, 1] * scale), rounded to bf16. */
static float *rndb(int64_t n, float scale)
{
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        x[i] = tdm_bf16_to_f32(tdm_f32_to_bf16(scale * rnd1()));
    return x;
}

/* ---- device helpers: the same host data on a backend, as dtype ---- */

static void *put(tdm_backend *be, tdm_be_dtype dt, const float *host, int64_t n)
{
    void *p;
    OK(tdm_be_alloc(be, dt, n, &p, err));
    if (host) OK(tdm_be_upload_f32(be, p, dt, host, n, err));
    return p;
}

/* act-dtype buffer of the backend */
static void *put_act(tdm_backend *be, const float *host, int64_t n)
{
    return put(be, tdm_be_act_dtype(be), host, n);
}

static void *put_raw(tdm_backend *be, const void *host, size_t bytes)
{
    void *p;
    OK(tdm_be_alloc(be, TDM_BE_U8, (int64_t)bytes, &p, err));
    OK(tdm_be_upload(be, p, host, bytes, err));
    return p;
}

static float *get(tdm_backend *be, const void *dev, tdm_be_dtype dt, int64_t n)
{
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    OK(tdm_be_download_f32(be, h, dev, dt, n, err));
    return h;
}

/* Poisons an act buffer with NaN on the GPU so unwritten outputs show. */
static void poison(tdm_backend *be, void *dev, tdm_be_dtype dt, int64_t n)
{
    OK(tdm_be_fill(be, dev, dt, n, NAN, err));
}

/* ---- comparison ---- */

static double max_rel_err(const float *got, const float *want, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (!(d <= num)) num = d; /* NaN propagates */
        if (fabs(want[i]) > den) den = fabs(want[i]);
    }
    return den > 0 ? num / den : num;
}

static void check(const char *what, const float *got, const float *want, int64_t n, double tol)
{
    double e = max_rel_err(got, want, n);
    printf("  %-48s max_rel_err %.3e  (tol %.0e)\n", what, e, tol);
    fflush(stdout);
    if (!(e <= tol)) fail_msg("%s: max relative error %.3e above %.0e", what, e, tol);
}

/* Downloads the same buffer of both backends and compares. */
static void cmp(const char *what, const void *dg, const void *dc, tdm_be_dtype gdt,
                tdm_be_dtype cdt, int64_t n, double tol)
{
    float *g = get(gpu, dg, gdt, n), *c = get(cpu, dc, cdt, n);
    check(what, g, c, n, tol);
    free(g);
    free(c);
}

static void cmp_act(const char *what, const void *dg, const void *dc, int64_t n, double tol)
{
    cmp(what, dg, dc, tdm_be_act_dtype(gpu), tdm_be_act_dtype(cpu), n, tol);
}

#define BF_TOL 1e-2
#define F32_TOL 1e-5

/* ------------------------------------------------------------------ GEMM ---- */

static void gemm_case(bool ta, bool tb, int64_t m, int64_t n, int64_t k, tdm_be_dtype at,
                      tdm_be_dtype bt, tdm_be_dtype ct, float beta, int64_t batch)
{
    int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 1, ldc = n + 2;
    int64_t ra = ta ? k : m, rb = tb ? n : k;
    int64_t sa = ra * lda + 5, sb = rb * ldb + 7, sc = m * ldc + 1;
    int64_t na = batch * sa, nb = batch * sb, nc = batch * sc;
    float *A = rndb(na, 1), *B = rndb(nb, 1), *C = rndb(nc, 1);
    tdm_backend *bes[2] = {gpu, cpu};
    void *dc[2];
    for (int i = 0; i < 2; i++) {
        void *da = put(bes[i], at, A, na), *db = put(bes[i], bt, B, nb);
        dc[i] = put(bes[i], ct, C, nc);
        tdm_gemm_args g = {ta, tb, m,  n,   k,  0.75f, beta, da,  at, lda,
                           sa, db, bt, ldb, sb, dc[i], ct,   ldc, sc, batch};
        OK(tdm_be_gemm(bes[i], &g, err));
        tdm_be_free(bes[i], da);
        tdm_be_free(bes[i], db);
    }
    char name[128];
    snprintf(name, sizeof name, "gemm %c%c %lldx%lldx%lld %s*%s->%s beta %.1f batch %lld",
             ta ? 'T' : 'N', tb ? 'T' : 'N', (long long)m, (long long)n, (long long)k,
             tdm_be_dtype_name(at), tdm_be_dtype_name(bt), tdm_be_dtype_name(ct), beta,
             (long long)batch);
    cmp(name, dc[0], dc[1], ct, ct, nc, ct == TDM_BE_BF16 ? BF_TOL : 1e-4);
    tdm_be_free(gpu, dc[0]);
    tdm_be_free(cpu, dc[1]);
    free(A), free(B), free(C);
}

static void test_gemm(void **state)
{
    for (int t = 0; t < 4; t++)
        gemm_case(t & 1, t & 2, 37, 45, 70, TDM_BE_BF16, TDM_BE_BF16, TDM_BE_F32, 0.0f, 1);
    gemm_case(false, true, 64, 128, 96, TDM_BE_BF16, TDM_BE_BF16, TDM_BE_BF16, 0.5f, 1);
    gemm_case(true, false, 33, 17, 50, TDM_BE_F32, TDM_BE_F32, TDM_BE_F32, 1.0f, 1);
    gemm_case(false, false, 20, 30, 40, TDM_BE_F32, TDM_BE_BF16, TDM_BE_F32, 0.0f, 1);
    gemm_case(false, false, 20, 30, 40, TDM_BE_BF16, TDM_BE_F32, TDM_BE_BF16, 0.0f, 1);
    gemm_case(false, true, 16, 24, 32, TDM_BE_BF16, TDM_BE_BF16, TDM_BE_F32, 0.25f, 3);
    gemm_case(false, false, 5, 6, 0, TDM_BE_BF16, TDM_BE_BF16, TDM_BE_F32, 0.5f, 2);
}

/* ------------------------------------------------------ frozen weights ---- */

typedef struct wpair {
    tdm_be_weight w[2]; /* gpu, cpu */
    void *bufs[2][4];
} wpair;

static void weight_make(wpair *p, tdm_be_wformat fmt, int64_t rows, int64_t cols)
{
    memset(p, 0, sizeof *p);
    int64_t n = rows * cols;
    float *w = rndb(n, 0.5f);
    tdm_backend *bes[2] = {gpu, cpu};
    tdm_nf4 q = {0};
    if (fmt == TDM_BE_W_NF4 || fmt == TDM_BE_W_NF4_DQ)
        OK(tdm_nf4_quantize(w, n, fmt == TDM_BE_W_NF4_DQ, &q, err));
    for (int i = 0; i < 2; i++) {
        tdm_be_weight *x = &p->w[i];
        x->format = fmt;
        x->rows = rows;
        x->cols = cols;
        switch (fmt) {
        case TDM_BE_W_F32:
            x->data = p->bufs[i][0] = put(bes[i], TDM_BE_F32, w, n);
            break;
        case TDM_BE_W_BF16:
            x->data = p->bufs[i][0] = put(bes[i], TDM_BE_BF16, w, n);
            break;
        case TDM_BE_W_NF4:
            x->codes = p->bufs[i][0] = put_raw(bes[i], q.packed, (size_t)(n + 1) / 2);
            x->absmax = p->bufs[i][1] = put(bes[i], TDM_BE_F32, q.absmax, q.nblocks);
            break;
        case TDM_BE_W_NF4_DQ:
            x->codes = p->bufs[i][0] = put_raw(bes[i], q.packed, (size_t)(n + 1) / 2);
            x->absmax_q = p->bufs[i][1] = put_raw(bes[i], q.absmax_q, (size_t)q.nblocks);
            x->absmax2 = p->bufs[i][2] =
                put(bes[i], TDM_BE_F32, q.absmax2, (q.nblocks + 255) / 256);
            x->offset = q.offset;
            break;
        case TDM_BE_W_F32_PANELS: /* the CPU's own layout: not compared across backends */
            fail_msg("weight_make: F32_PANELS is not a CUDA format");
            break;
        }
    }
    tdm_nf4_free(&q);
    free(w);
}

static void weight_free(wpair *p)
{
    for (int i = 0; i < 4; i++) {
        tdm_be_free(gpu, p->bufs[0][i]);
        tdm_be_free(cpu, p->bufs[1][i]);
    }
}

static const char *fmt_name(tdm_be_wformat f)
{
    return f == TDM_BE_W_F32    ? "f32"
           : f == TDM_BE_W_BF16 ? "bf16"
           : f == TDM_BE_W_NF4  ? "nf4"
                                : "nf4-dq";
}

static void linear_case(tdm_be_wformat fmt, int64_t rows, int64_t cols, int64_t m, float beta)
{
    wpair w;
    weight_make(&w, fmt, rows, cols);
    char name[128];
    /* weight_rows at an odd start (not a multiple of 8 elements when cols is not) */
    int64_t r0 = 1, r1 = rows < 40 ? rows : 40;
    int64_t nr = (r1 - r0) * cols;
    void *og = put(gpu, TDM_BE_F32, NULL, nr), *oc = put(cpu, TDM_BE_F32, NULL, nr);
    poison(gpu, og, TDM_BE_F32, nr);
    OK(tdm_be_weight_rows(gpu, &w.w[0], r0, r1, og, TDM_BE_F32, err));
    OK(tdm_be_weight_rows(cpu, &w.w[1], r0, r1, oc, TDM_BE_F32, err));
    snprintf(name, sizeof name, "weight_rows %s (%lld, %lld) rows [%lld, %lld) f32", fmt_name(fmt),
             (long long)rows, (long long)cols, (long long)r0, (long long)r1);
    cmp(name, og, oc, TDM_BE_F32, TDM_BE_F32, nr, 1e-6); /* same f32 products */
    tdm_be_free(gpu, og);
    tdm_be_free(cpu, oc);

    float *X = rndb(m * cols, 1), *Y0 = rndb(m * rows, 1), *DY = rndb(m * rows, 1),
          *DX0 = rndb(m * cols, 1);
    void *xg = put_act(gpu, X, m * cols), *xc = put_act(cpu, X, m * cols);
    void *yg = put_act(gpu, Y0, m * rows), *yc = put_act(cpu, Y0, m * rows);
    OK(tdm_be_linear_fwd(gpu, &w.w[0], xg, m, yg, beta, err));
    OK(tdm_be_linear_fwd(cpu, &w.w[1], xc, m, yc, beta, err));
    snprintf(name, sizeof name, "linear_fwd %s (%lld, %lld) m %lld beta %.1f", fmt_name(fmt),
             (long long)rows, (long long)cols, (long long)m, beta);
    cmp_act(name, yg, yc, m * rows, BF_TOL);
    void *dyg = put_act(gpu, DY, m * rows), *dyc = put_act(cpu, DY, m * rows);
    void *dxg = put_act(gpu, DX0, m * cols), *dxc = put_act(cpu, DX0, m * cols);
    OK(tdm_be_linear_bwd(gpu, &w.w[0], dyg, m, dxg, beta, err));
    OK(tdm_be_linear_bwd(cpu, &w.w[1], dyc, m, dxc, beta, err));
    snprintf(name, sizeof name, "linear_bwd %s (%lld, %lld) m %lld beta %.1f", fmt_name(fmt),
             (long long)rows, (long long)cols, (long long)m, beta);
    cmp_act(name, dxg, dxc, m * cols, BF_TOL);
    void *ptrs[2][4] = {{xg, yg, dyg, dxg}, {xc, yc, dyc, dxc}};
    for (int i = 0; i < 4; i++) {
        tdm_be_free(gpu, ptrs[0][i]);
        tdm_be_free(cpu, ptrs[1][i]);
    }
    free(X), free(Y0), free(DY), free(DX0);
    weight_free(&w);
}

static void test_linear(void **state)
{
    tdm_be_wformat fmts[4] = {TDM_BE_W_F32, TDM_BE_W_BF16, TDM_BE_W_NF4, TDM_BE_W_NF4_DQ};
    for (int f = 0; f < 4; f++) {
        linear_case(fmts[f], 200, 96, 33, 0.0f);
        linear_case(fmts[f], 72, 100, 9, 0.5f);
    }
    /* more than one 32 Mi-element tile (cuda_memory_plan.h): forward by blocks of Y's columns,
     * backward by column slabs of W (cols a multiple of 64; f32 and NF4 weights) or, for cols
     * 1030, by tiles of rows accumulated in f32 */
    linear_case(TDM_BE_W_NF4_DQ, 9000, 4096, 12, 0.0f);
    linear_case(TDM_BE_W_NF4, 9000, 4096, 12, 0.5f);
    linear_case(TDM_BE_W_F32, 9000, 4096, 5, 0.5f);
    linear_case(TDM_BE_W_NF4, 33000, 1030, 7, 0.5f);
}

/* ---- --base-compute fp8 (src/engine/cuda/fp8.cuh) ----
 * The GPU's FP8 linear layers against an emulation on the host of exactly what they should
 * compute: each operand scaled by 448 / its tensor's amax, rounded to E4M3 (nearest even,
 * saturated at 448), multiplied in double, times the two scales, plus beta times the old output.
 * What is left between them is the output's rounding to bf16 (2^-9 of the largest value) and
 * the tensor cores' summation: measured 2.2e-3 .. 3.5e-3 on an H100, tolerance 6e-3. The plain
 * bf16 path misses the emulation by the FP8 rounding itself (2e-2 .. 3.5e-2 here), so the check
 * tells which path ran. The error against the exact f32 product (the CPU backend) is printed
 * too: what FP8 costs. */
#define FP8_TOL 6e-3

/* x rounded to E4M3 (1 sign, 4 exponent bits of bias 7, 3 mantissa bits; largest 448, smallest
 * subnormal 2^-9), nearest even, saturating. */
static double e4m3(float x)
{
    if (isnan(x)) return x;
    float a = fabsf(x);
    if (a == 0.0f) return 0.0;
    int e;
    frexpf(a, &e); /* a in [2^(e-1), 2^e) */
    int exp = e - 1 < -6 ? -6 : e - 1;
    float step = ldexpf(1.0f, exp - 3);
    float r = nearbyintf(a / step) * step;
    if (r > 448.0f) r = 448.0f;
    return x < 0 ? -(double)r : (double)r;
}

static float amax_of(const float *x, int64_t n)
{
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++)
        if (fabsf(x[i]) > m) m = fabsf(x[i]);
    return m;
}

/* out (m, n) = s_a s_b sum_k e4m3(a[i][k] * 448 / amax_a) e4m3(b[j][k] * 448 / amax_b) + beta
 * out0, with a (m, k) and b (n, k) row-major (b_t: b is (k, n)). */
static float *fp8_reference(const float *a, const float *b, bool b_t, int64_t m, int64_t n,
                            int64_t k, const float *out0, float beta)
{
    float amax_a = amax_of(a, m * k), amax_b = amax_of(b, n * k);
    float inv_a = 448.0f / amax_a, inv_b = 448.0f / amax_b;
    double scale = (double)(amax_a / 448.0f) * (double)(amax_b / 448.0f);
    double *qa = malloc((size_t)(m * k) * sizeof(double)), *qb = malloc((size_t)(n * k) * sizeof(double));
    for (int64_t i = 0; i < m * k; i++)
        qa[i] = e4m3(a[i] * inv_a);
    for (int64_t j = 0; j < n; j++)
        for (int64_t l = 0; l < k; l++)
            qb[j * k + l] = e4m3(b[b_t ? l * n + j : j * k + l] * inv_b);
    float *out = malloc((size_t)(m * n) * sizeof(float));
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double acc = 0;
            for (int64_t l = 0; l < k; l++)
                acc += qa[i * k + l] * qb[j * k + l];
            out[i * n + j] = (float)(scale * acc + (double)beta * out0[i * n + j]);
        }
    free(qa);
    free(qb);
    return out;
}

static void linear_fp8_case(tdm_backend *gpu8, tdm_be_wformat fmt, int64_t rows, int64_t cols,
                            int64_t m, float beta)
{
    wpair w;
    weight_make(&w, fmt, rows, cols);
    char name[160];
    float *wd = malloc((size_t)(rows * cols) * sizeof(float)); /* the f32 dequantized weight */
    void *wdc = put(cpu, TDM_BE_F32, NULL, rows * cols);
    OK(tdm_be_weight_rows(cpu, &w.w[1], 0, rows, wdc, TDM_BE_F32, err));
    OK(tdm_be_download_f32(cpu, wd, wdc, TDM_BE_F32, rows * cols, err));
    tdm_be_free(cpu, wdc);
    /* the 448 / amax scaling on both sides, with weights of a large magnitude */
    float *X = rndb(m * cols, 3), *Y0 = rndb(m * rows, 1), *DY = rndb(m * rows, 0.01f),
          *DX0 = rndb(m * cols, 1);
    void *xg = put_act(gpu, X, m * cols), *yg = put_act(gpu, Y0, m * rows);
    void *xc = put_act(cpu, X, m * cols), *yc = put_act(cpu, Y0, m * rows);
    OK(tdm_be_linear_fwd(gpu8, &w.w[0], xg, m, yg, beta, err));
    OK(tdm_be_synchronize(gpu8, err));
    OK(tdm_be_linear_fwd(cpu, &w.w[1], xc, m, yc, beta, err));
    float *want = fp8_reference(X, wd, false, m, rows, cols, Y0, beta);
    float *got = get(gpu, yg, TDM_BE_BF16, m * rows), *exact = get(cpu, yc, TDM_BE_F32, m * rows);
    snprintf(name, sizeof name, "fp8 linear_fwd %s (%lld, %lld) m %lld beta %.1f", fmt_name(fmt),
             (long long)rows, (long long)cols, (long long)m, beta);
    check(name, got, want, m * rows, FP8_TOL);
    check("  ... against the exact f32 product", got, exact, m * rows, 1e-1);
    free(want), free(got), free(exact);

    void *dyg = put_act(gpu, DY, m * rows), *dxg = put_act(gpu, DX0, m * cols);
    void *dyc = put_act(cpu, DY, m * rows), *dxc = put_act(cpu, DX0, m * cols);
    OK(tdm_be_linear_bwd(gpu8, &w.w[0], dyg, m, dxg, beta, err));
    OK(tdm_be_synchronize(gpu8, err));
    OK(tdm_be_linear_bwd(cpu, &w.w[1], dyc, m, dxc, beta, err));
    want = fp8_reference(DY, wd, true, m, cols, rows, DX0, beta);
    got = get(gpu, dxg, TDM_BE_BF16, m * cols), exact = get(cpu, dxc, TDM_BE_F32, m * cols);
    snprintf(name, sizeof name, "fp8 linear_bwd %s (%lld, %lld) m %lld beta %.1f", fmt_name(fmt),
             (long long)rows, (long long)cols, (long long)m, beta);
    check(name, got, want, m * cols, FP8_TOL);
    check("  ... against the exact f32 product", got, exact, m * cols, 1e-1);
    free(want), free(got), free(exact);
    void *ptrs[2][4] = {{xg, yg, dyg, dxg}, {xc, yc, dyc, dxc}};
    for (int i = 0; i < 4; i++) {
        tdm_be_free(gpu, ptrs[0][i]);
        tdm_be_free(cpu, ptrs[1][i]);
    }
    free(X), free(Y0), free(DY), free(DX0), free(wd);
    weight_free(&w);
}

static void test_linear_fp8(void **state)
{
    (void)state;
    tdm_backend *gpu8 = NULL;
    tdm_backend_opts o = {.base_fp8 = true};
    tdm_error e = {0};
    tdm_status st = tdm_backend_create(&gpu8, "cuda", &o, &e);
    if (st == TDM_ERR_UNSUPPORTED && strstr(e.message, "8.9")) {
        printf("  fp8: skipped on this GPU (%s)\n", e.message);
        return;
    }
    if (st != TDM_OK) fail_msg("creating the fp8 backend: %s", e.message);
    /* the weights live in gpu's allocations: one device, one context, valid in both backends */
    linear_fp8_case(gpu8, TDM_BE_W_NF4, 256, 192, 33, 0.0f);
    linear_fp8_case(gpu8, TDM_BE_W_NF4_DQ, 96, 128, 9, 0.5f);
    /* several forward tiles and backward slabs (more than 32 Mi elements) */
    linear_fp8_case(gpu8, TDM_BE_W_NF4_DQ, 9024, 4096, 12, 0.5f);
    /* linear_fwd_shared quantizes X once for both weights: the same bits as one call each */
    {
        wpair a, b;
        weight_make(&a, TDM_BE_W_NF4_DQ, 128, 256);
        weight_make(&b, TDM_BE_W_NF4_DQ, 64, 256);
        float *X = rndb(7 * 256, 2);
        void *xg = put_act(gpu, X, 7 * 256);
        void *ya = put_act(gpu, NULL, 7 * 128), *yb = put_act(gpu, NULL, 7 * 64);
        void *sa = put_act(gpu, NULL, 7 * 128), *sb = put_act(gpu, NULL, 7 * 64);
        OK(tdm_be_linear_fwd(gpu8, &a.w[0], xg, 7, ya, 0.0f, err));
        OK(tdm_be_linear_fwd(gpu8, &b.w[0], xg, 7, yb, 0.0f, err));
        const tdm_be_weight *ws[2] = {&a.w[0], &b.w[0]};
        void *const ys[2] = {sa, sb};
        OK(tdm_be_linear_fwd_shared(gpu8, ws, 2, xg, 7, ys, err));
        OK(tdm_be_synchronize(gpu8, err));
        float *g1 = get(gpu, ya, TDM_BE_BF16, 7 * 128), *g2 = get(gpu, sa, TDM_BE_BF16, 7 * 128);
        float *g3 = get(gpu, yb, TDM_BE_BF16, 7 * 64), *g4 = get(gpu, sb, TDM_BE_BF16, 7 * 64);
        assert_memory_equal(g1, g2, 7 * 128 * sizeof(float));
        assert_memory_equal(g3, g4, 7 * 64 * sizeof(float));
        printf("  fp8 linear_fwd_shared: the same bits as linear_fwd per weight\n");
        free(g1), free(g2), free(g3), free(g4), free(X);
        void *bufs[5] = {xg, ya, yb, sa, sb};
        for (int i = 0; i < 5; i++)
            tdm_be_free(gpu, bufs[i]);
        weight_free(&a);
        weight_free(&b);
    }
    /* shapes FP8 cannot take (cols not a multiple of 16: the bf16 path) still match the CPU */
    wpair w;
    weight_make(&w, TDM_BE_W_NF4, 72, 100);
    float *X = rndb(5 * 100, 1);
    void *xg = put_act(gpu, X, 5 * 100), *xc = put_act(cpu, X, 5 * 100);
    void *yg = put_act(gpu, NULL, 5 * 72), *yc = put_act(cpu, NULL, 5 * 72);
    OK(tdm_be_linear_fwd(gpu8, &w.w[0], xg, 5, yg, 0.0f, err));
    OK(tdm_be_synchronize(gpu8, err));
    OK(tdm_be_linear_fwd(cpu, &w.w[1], xc, 5, yc, 0.0f, err));
    cmp_act("fp8 backend, bf16 fallback linear_fwd (72, 100)", yg, yc, 5 * 72, BF_TOL);
    tdm_be_free(gpu, xg), tdm_be_free(gpu, yg), tdm_be_free(cpu, xc), tdm_be_free(cpu, yc);
    free(X);
    weight_free(&w);
    tdm_backend_free(gpu8);
}

/* The load's NF4 quantization on the GPU, bit for bit the host's (tdm_nf4_quantize) from the
 * tensor's bytes as stored: bf16, f16 and f32 sources; sizes with a partial last block and an
 * odd count (the padded low nibble); blocks of zeros, a NaN, an infinity, values exactly at the
 * midpoints between codes (fp32 ties) and at +-absmax. */
static void quantize_case(tdm_be_src_dtype kind, int64_t n)
{
    float *w = malloc((size_t)n * sizeof(float));
    uint16_t *h = malloc((size_t)n * sizeof(uint16_t));
    for (int64_t i = 0; i < n; i++) {
        double u = tdm_rng_uniform(&rng);
        w[i] = (float)((u - 0.5) * 0.1 * (1 + (i / 64) % 7));
    }
    for (int64_t i = 64; i < 128 && i < n; i++) /* block 1: zeros */
        w[i] = 0.0f;
    if (n > 300) w[300] = NAN;
    if (n > 700 && kind != TDM_BE_SRC_F16) w[700] = INFINITY;
    for (int64_t i = 1024, j = 0; i + 15 < n && j < 15; i++, j++) /* ties, block absmax 1 */
        w[i] = 0.5f * (tdm_nf4_code[j] + tdm_nf4_code[j + 1]);
    if (n > 1100) w[1100] = 1.0f, w[1101] = -1.0f;
    /* what the file holds, and the f32 values the host quantizes */
    const void *src = w;
    size_t elem = sizeof(float);
    if (kind != TDM_BE_SRC_F32) {
        for (int64_t i = 0; i < n; i++) {
            h[i] = kind == TDM_BE_SRC_BF16 ? tdm_f32_to_bf16(w[i]) : tdm_f32_to_f16(w[i]);
            w[i] = kind == TDM_BE_SRC_BF16 ? tdm_bf16_to_f32(h[i]) : tdm_f16_to_f32(h[i]);
        }
        src = h, elem = sizeof(uint16_t);
    }
    tdm_nf4 q;
    OK(tdm_nf4_quantize(w, n, false, &q, err));
    int64_t nb = q.nblocks, nc = (n + 1) / 2;
    void *d_src, *d_codes, *d_absmax;
    OK(tdm_be_alloc(gpu, TDM_BE_U8, n * (int64_t)elem, &d_src, err));
    OK(tdm_be_alloc(gpu, TDM_BE_U8, nc, &d_codes, err));
    OK(tdm_be_alloc(gpu, TDM_BE_F32, nb, &d_absmax, err));
    OK(tdm_be_upload(gpu, d_src, src, (size_t)n * elem, err));
    OK(tdm_be_quantize_nf4(gpu, d_src, kind, n, d_codes, d_absmax, err));
    uint8_t *codes = malloc((size_t)nc);
    float *absmax = malloc((size_t)nb * sizeof(float));
    OK(tdm_be_download(gpu, codes, d_codes, (size_t)nc, err));
    OK(tdm_be_download(gpu, absmax, d_absmax, (size_t)nb * sizeof(float), err));
    int64_t bad_codes = 0, bad_absmax = 0;
    for (int64_t i = 0; i < nc; i++)
        bad_codes += codes[i] != q.packed[i];
    for (int64_t b = 0; b < nb; b++)
        bad_absmax += memcmp(&absmax[b], &q.absmax[b], sizeof(float)) != 0;
    printf("  quantize_nf4 src %d n %lld: %lld of %lld code bytes, %lld of %lld absmax differ\n",
           (int)kind, (long long)n, (long long)bad_codes, (long long)nc, (long long)bad_absmax,
           (long long)nb);
    assert_int_equal(bad_codes, 0);
    assert_int_equal(bad_absmax, 0);
    tdm_be_free(gpu, d_src);
    tdm_be_free(gpu, d_codes);
    tdm_be_free(gpu, d_absmax);
    tdm_nf4_free(&q);
    free(codes);
    free(absmax);
    free(w);
    free(h);
}

static void test_quantize_nf4(void **state)
{
    (void)state;
    assert_true(tdm_be_has_quantize_nf4(gpu));
    assert_false(tdm_be_has_quantize_nf4(cpu));
    tdm_be_src_dtype kinds[3] = {TDM_BE_SRC_BF16, TDM_BE_SRC_F16, TDM_BE_SRC_F32};
    for (int k = 0; k < 3; k++) {
        quantize_case(kinds[k], 64 * 40);
        quantize_case(kinds[k], 64 * 37 + 29);       /* partial last block, odd count */
        quantize_case(kinds[k], 3584 * 1024 + 1);    /* many thread blocks */
    }
}

/* --------------------------------------------------------------- layers ---- */

static void test_embedding(void **state)
{
    tdm_be_wformat fmts[2] = {TDM_BE_W_BF16, TDM_BE_W_F32};
    for (int f = 0; f < 2; f++) {
        wpair w;
        weight_make(&w, fmts[f], 300, 40);
        int32_t ids[23];
        for (int i = 0; i < 23; i++)
            ids[i] = (int32_t)(tdm_rng_next(&rng) % 300);
        void *ig = put_raw(gpu, ids, sizeof ids), *ic = put_raw(cpu, ids, sizeof ids);
        void *og = put_act(gpu, NULL, 23 * 40), *oc = put_act(cpu, NULL, 23 * 40);
        poison(gpu, og, TDM_BE_BF16, 23 * 40);
        OK(tdm_be_embedding(gpu, &w.w[0], ig, 23, og, err));
        OK(tdm_be_embedding(cpu, &w.w[1], ic, 23, oc, err));
        cmp_act(f == 0 ? "embedding bf16 table" : "embedding f32 table", og, oc, 23 * 40, BF_TOL);
        tdm_be_free(gpu, ig), tdm_be_free(cpu, ic), tdm_be_free(gpu, og), tdm_be_free(cpu, oc);
        weight_free(&w);
    }
}

static void test_rmsnorm(void **state)
{
    /* 64, 896, 3000: the 8-wide kernels (d % 8 == 0); 1030: the scalar ones */
    int64_t dims[4] = {64, 896, 3000, 1030}, rows = 19;
    for (int t = 0; t < 4; t++) {
        int64_t d = dims[t], n = rows * d;
        float *X = rndb(n, 2), *W = rndb(d, 1), *DY = rndb(n, 1), *DX = rndb(n, 1);
        void *xg = put_act(gpu, X, n), *xc = put_act(cpu, X, n);
        float *wg = put(gpu, TDM_BE_F32, W, d), *wc = put(cpu, TDM_BE_F32, W, d);
        void *yg = put_act(gpu, NULL, n), *yc = put_act(cpu, NULL, n);
        float *rg = put(gpu, TDM_BE_F32, NULL, rows), *rc = put(cpu, TDM_BE_F32, NULL, rows);
        poison(gpu, yg, TDM_BE_BF16, n);
        OK(tdm_be_rmsnorm_fwd(gpu, xg, wg, rows, d, 1e-6f, yg, rg, err));
        OK(tdm_be_rmsnorm_fwd(cpu, xc, wc, rows, d, 1e-6f, yc, rc, err));
        char name[96];
        snprintf(name, sizeof name, "rmsnorm_fwd d %lld", (long long)d);
        cmp_act(name, yg, yc, n, BF_TOL);
        snprintf(name, sizeof name, "rmsnorm_fwd rstd d %lld", (long long)d);
        cmp(name, rg, rc, TDM_BE_F32, TDM_BE_F32, rows, 1e-5);
        for (int b = 0; b < 2; b++) {
            float beta = b ? 0.5f : 0.0f;
            void *dyg = put_act(gpu, DY, n), *dyc = put_act(cpu, DY, n);
            void *dxg = put_act(gpu, DX, n), *dxc = put_act(cpu, DX, n);
            OK(tdm_be_rmsnorm_bwd(gpu, dyg, xg, wg, rg, rows, d, dxg, beta, err));
            OK(tdm_be_rmsnorm_bwd(cpu, dyc, xc, wc, rc, rows, d, dxc, beta, err));
            snprintf(name, sizeof name, "rmsnorm_bwd d %lld beta %.1f", (long long)d, beta);
            cmp_act(name, dxg, dxc, n, BF_TOL);
            tdm_be_free(gpu, dyg), tdm_be_free(cpu, dyc), tdm_be_free(gpu, dxg),
                tdm_be_free(cpu, dxc);
        }
        /* in place */
        OK(tdm_be_rmsnorm_fwd(gpu, xg, wg, rows, d, 1e-6f, xg, NULL, err));
        snprintf(name, sizeof name, "rmsnorm_fwd in place d %lld", (long long)d);
        cmp_act(name, xg, yc, n, BF_TOL);
        tdm_be_free(gpu, xg), tdm_be_free(cpu, xc), tdm_be_free(gpu, wg), tdm_be_free(cpu, wc);
        tdm_be_free(gpu, yg), tdm_be_free(cpu, yc), tdm_be_free(gpu, rg), tdm_be_free(cpu, rc);
        free(X), free(W), free(DY), free(DX);
    }
}

static void test_rope(void **state)
{
    int64_t m = 21, H = 3, D = 64, ld = H * D + 8, n = m * ld;
    float *X = rndb(n, 1);
    int32_t pos[21];
    for (int i = 0; i < 21; i++)
        pos[i] = i < 10 ? i : 4000 + 37 * i; /* large angles too */
    float inv[32];
    for (int j = 0; j < 32; j++)
        inv[j] = 1.0f / powf(10000.0f, (float)(2 * j) / (float)D);
    for (int inverse = 0; inverse < 2; inverse++) {
        void *xg = put_act(gpu, X, n), *xc = put_act(cpu, X, n);
        void *pg = put_raw(gpu, pos, sizeof pos), *pc = put_raw(cpu, pos, sizeof pos);
        float *fg = put(gpu, TDM_BE_F32, inv, 32), *fc = put(cpu, TDM_BE_F32, inv, 32);
        OK(tdm_be_rope(gpu, xg, m, H, D, ld, pg, fg, inverse, err));
        OK(tdm_be_rope(cpu, xc, m, H, D, ld, pc, fc, inverse, err));
        cmp_act(inverse ? "rope inverse (ld > H*D, positions to 4777)"
                        : "rope (ld > H*D, positions to 4777)",
                xg, xc, n, BF_TOL);
        tdm_be_free(gpu, xg), tdm_be_free(cpu, xc), tdm_be_free(gpu, pg), tdm_be_free(cpu, pc);
        tdm_be_free(gpu, fg), tdm_be_free(cpu, fc);
    }
    free(X);
}

static void attention_case(const int32_t *lens, int n_seqs, int64_t H, int64_t KVH, int64_t D)
{
    int32_t cu[16];
    cu[0] = 0;
    int64_t maxlen = 0;
    for (int i = 0; i < n_seqs; i++) {
        cu[i + 1] = cu[i] + lens[i];
        if (lens[i] > maxlen) maxlen = lens[i];
    }
    int64_t m = cu[n_seqs], nq = m * H * D, nk = m * KVH * D;
    float scale = 1.0f / sqrtf((float)D);
    float *Q = rndb(nq, 1), *K = rndb(nk, 1), *V = rndb(nk, 1), *DO = rndb(nq, 1);
    tdm_backend *bes[2] = {gpu, cpu};
    void *o[2], *dq[2], *dk[2], *dv[2], *bufs[2][6];
    float *lse[2];
    for (int i = 0; i < 2; i++) {
        tdm_backend *be = bes[i];
        void *cud = put_raw(be, cu, (size_t)(n_seqs + 1) * sizeof(int32_t));
        tdm_be_seqs s = {cud, n_seqs, maxlen, m};
        void *q = put_act(be, Q, nq), *k = put_act(be, K, nk), *v = put_act(be, V, nk);
        void *dout = put_act(be, DO, nq);
        o[i] = put_act(be, NULL, nq);
        lse[i] = put(be, TDM_BE_F32, NULL, H * m);
        dq[i] = put_act(be, NULL, nq);
        dk[i] = put_act(be, NULL, nk);
        dv[i] = put_act(be, NULL, nk);
        if (be == gpu) {
            poison(be, o[i], TDM_BE_BF16, nq), poison(be, dq[i], TDM_BE_BF16, nq);
            poison(be, dk[i], TDM_BE_BF16, nk), poison(be, dv[i], TDM_BE_BF16, nk);
            poison(be, lse[i], TDM_BE_F32, H * m);
        }
        OK(tdm_be_attention_fwd(be, &s, q, k, v, H, KVH, D, scale, o[i], lse[i], err));
        OK(tdm_be_attention_bwd(be, &s, q, k, v, o[i], lse[i], dout, H, KVH, D, scale, dq[i], dk[i],
                                dv[i], err));
        void *b[6] = {cud, q, k, v, dout, NULL};
        memcpy(bufs[i], b, sizeof b);
    }
    char name[128];
    const char *parts[5] = {"out", "lse", "dq", "dk", "dv"};
    for (int p = 0; p < 5; p++) {
        snprintf(name, sizeof name, "attention %s (%d seqs, max %lld, H %lld KVH %lld D %lld)",
                 parts[p], n_seqs, (long long)maxlen, (long long)H, (long long)KVH, (long long)D);
        switch (p) {
        case 0:
            cmp_act(name, o[0], o[1], nq, BF_TOL);
            break;
        case 1:
            cmp(name, lse[0], lse[1], TDM_BE_F32, TDM_BE_F32, H * m, 1e-3);
            break;
        case 2:
            cmp_act(name, dq[0], dq[1], nq, 2e-2);
            break;
        case 3:
            cmp_act(name, dk[0], dk[1], nk, 2e-2);
            break;
        case 4:
            cmp_act(name, dv[0], dv[1], nk, 2e-2);
            break;
        }
    }
    for (int i = 0; i < 2; i++) {
        for (int j = 0; j < 5; j++)
            tdm_be_free(bes[i], bufs[i][j]);
        tdm_be_free(bes[i], o[i]), tdm_be_free(bes[i], lse[i]), tdm_be_free(bes[i], dq[i]);
        tdm_be_free(bes[i], dk[i]), tdm_be_free(bes[i], dv[i]);
    }
    free(Q), free(K), free(V), free(DO);
}

static void test_attention(void **state)
{
    int32_t a[4] = {37, 1, 70, 5};
    attention_case(a, 4, 4, 2, 64);
    int32_t b[2] = {100, 33};
    attention_case(b, 2, 2, 1, 128);
    int32_t c[3] = {9, 40, 64};
    attention_case(c, 3, 6, 6, 16);
    int32_t d[1] = {45};
    attention_case(d, 1, 2, 2, 80); /* head_dim not a multiple of 32 */
    /* the tensor-core kernels (v3, head_dim 64 and 128): lengths around the 64-row tiles,
     * length 1, GQA ratios 7 and 6, 4 KV heads, and no GQA (dk/dv without the group split) */
    int32_t e[5] = {1, 65, 128, 130, 3};
    attention_case(e, 5, 14, 2, 64);
    int32_t f[3] = {200, 1, 77};
    attention_case(f, 3, 12, 2, 128);
    int32_t g[2] = {150, 64};
    attention_case(g, 2, 28, 4, 128);
    int32_t h[2] = {70, 129};
    attention_case(h, 2, 2, 2, 128);
}

/* 17 x 300: the scalar kernels (5100 elements, not a multiple of 8); 16 x 304: the 8-wide ones */
/* Generation's decode attention over a KV cache: sequences with cached prefixes of different
 * lengths (0 included) in non-consecutive slots, one and several new rows; the output and the
 * cache after the append. */
static void attention_kv_case(int64_t H, int64_t KVH, int64_t D)
{
    const tdm_be_kv_seq seqs[3] = {{0, 1, 2, 40}, {1, 3, 0, 10}, {4, 1, 1, 0}};
    int64_t m = 5, n_slots = 3, cap = 80, nq = m * H * D, nk = m * KVH * D;
    int64_t nc = n_slots * cap * KVH * D;
    float scale = 1.0f / sqrtf((float)D);
    float *Q = rndb(nq, 1), *K = rndb(nk, 1), *V = rndb(nk, 1), *KC = rndb(nc, 1),
          *VC = rndb(nc, 1);
    tdm_backend *bes[2] = {gpu, cpu};
    void *o[2], *kc[2], *vc[2], *in[2][3];
    for (int i = 0; i < 2; i++) {
        tdm_backend *be = bes[i];
        in[i][0] = put_act(be, Q, nq), in[i][1] = put_act(be, K, nk), in[i][2] = put_act(be, V, nk);
        kc[i] = put_act(be, KC, nc), vc[i] = put_act(be, VC, nc);
        o[i] = put_act(be, NULL, nq);
        if (be == gpu) poison(be, o[i], TDM_BE_BF16, nq);
        OK(tdm_be_attention_kv(be, seqs, 3, m, in[i][0], in[i][1], in[i][2], kc[i], vc[i], n_slots,
                               cap, H, KVH, D, scale, o[i], err));
    }
    char name[128];
    snprintf(name, sizeof name, "attention_kv out (H %lld KVH %lld D %lld)", (long long)H,
             (long long)KVH, (long long)D);
    cmp_act(name, o[0], o[1], nq, BF_TOL);
    snprintf(name, sizeof name, "attention_kv cache k, v (H %lld KVH %lld D %lld)", (long long)H,
             (long long)KVH, (long long)D);
    cmp_act(name, kc[0], kc[1], nc, 0);
    cmp_act(name, vc[0], vc[1], nc, 0);
    for (int i = 0; i < 2; i++) {
        for (int j = 0; j < 3; j++)
            tdm_be_free(bes[i], in[i][j]);
        tdm_be_free(bes[i], o[i]), tdm_be_free(bes[i], kc[i]), tdm_be_free(bes[i], vc[i]);
    }
    free(Q), free(K), free(V), free(KC), free(VC);
}

static void test_attention_kv(void **state)
{
    attention_kv_case(14, 2, 64);
    attention_kv_case(4, 4, 128);
    attention_kv_case(6, 2, 80); /* head_dim not a multiple of 32 */
}

static void swiglu_case(int64_t m, int64_t n)
{
    int64_t t = m * n;
    printf("  swiglu %lld x %lld\n", (long long)m, (long long)n);
    float *G = rndb(t, 3), *U = rndb(t, 1), *DH = rndb(t, 1);
    void *gg = put_act(gpu, G, t), *gc = put_act(cpu, G, t);
    void *ug = put_act(gpu, U, t), *uc = put_act(cpu, U, t);
    void *hg = put_act(gpu, NULL, t), *hc = put_act(cpu, NULL, t);
    poison(gpu, hg, TDM_BE_BF16, t);
    OK(tdm_be_swiglu_fwd(gpu, gg, ug, m, n, hg, err));
    OK(tdm_be_swiglu_fwd(cpu, gc, uc, m, n, hc, err));
    cmp_act("swiglu_fwd", hg, hc, t, BF_TOL);
    void *dhg = put_act(gpu, DH, t), *dhc = put_act(cpu, DH, t);
    void *dgg = put_act(gpu, NULL, t), *dgc = put_act(cpu, NULL, t);
    /* du aliases dh (allowed) */
    OK(tdm_be_swiglu_bwd(gpu, gg, ug, dhg, m, n, dgg, dhg, err));
    OK(tdm_be_swiglu_bwd(cpu, gc, uc, dhc, m, n, dgc, dhc, err));
    cmp_act("swiglu_bwd dg", dgg, dgc, t, BF_TOL);
    cmp_act("swiglu_bwd du (aliasing dh)", dhg, dhc, t, BF_TOL);
    void *all[2][6] = {{gg, ug, hg, dhg, dgg, NULL}, {gc, uc, hc, dhc, dgc, NULL}};
    for (int i = 0; i < 5; i++)
        tdm_be_free(gpu, all[0][i]), tdm_be_free(cpu, all[1][i]);
    free(G), free(U), free(DH);
}

static void test_swiglu(void **state)
{
    swiglu_case(17, 300);
    swiglu_case(16, 304);
}

/* --------------------------------------------------------- cross-entropy ---- */

/* V 1000: the kernel's float4 path; V 1001: its scalar path (rows not 16-byte aligned) */
static void cross_entropy_case(int64_t V)
{
    int64_t d = 64, m = 50;
    wpair w;
    weight_make(&w, TDM_BE_W_BF16, V, d);
    float *H = rndb(m * d, 2);
    int32_t labels[50];
    float weight[50];
    for (int i = 0; i < 50; i++) {
        labels[i] = i % 7 == 3 ? -100 : (int32_t)(tdm_rng_next(&rng) % (uint64_t)V);
        weight[i] = labels[i] == -100 ? 0.0f : 1.0f / 43.0f;
    }
    void *hg = put_act(gpu, H, m * d), *hc = put_act(cpu, H, m * d);
    void *lg = put_raw(gpu, labels, sizeof labels), *lc = put_raw(cpu, labels, sizeof labels);
    float *wg = put(gpu, TDM_BE_F32, weight, m), *wc = put(cpu, TDM_BE_F32, weight, m);
    float *sg = put(gpu, TDM_BE_F32, NULL, m), *sc = put(cpu, TDM_BE_F32, NULL, m);
    void *dg = put_act(gpu, NULL, m * d), *dc = put_act(cpu, NULL, m * d);
    poison(gpu, sg, TDM_BE_F32, m);
    poison(gpu, dg, TDM_BE_BF16, m * d);
    OK(tdm_be_cross_entropy(gpu, hg, &w.w[0], lg, wg, m, 16, sg, dg, err));
    OK(tdm_be_cross_entropy(cpu, hc, &w.w[1], lc, wc, m, 16, sc, dc, err));
    char name[80];
    snprintf(name, sizeof name, "cross_entropy loss (V %lld, chunk 16, ignored rows)",
             (long long)V);
    cmp(name, sg, sc, TDM_BE_F32, TDM_BE_F32, m, BF_TOL);
    cmp_act("cross_entropy dh", dg, dc, m * d, BF_TOL);
    /* no dh: loss only */
    OK(tdm_be_cross_entropy(gpu, hg, &w.w[0], lg, wg, m, 64, sg, NULL, err));
    cmp("cross_entropy loss only (one chunk)", sg, sc, TDM_BE_F32, TDM_BE_F32, m, BF_TOL);
    void *all[2][5] = {{hg, lg, wg, sg, dg}, {hc, lc, wc, sc, dc}};
    for (int i = 0; i < 5; i++)
        tdm_be_free(gpu, all[0][i]), tdm_be_free(cpu, all[1][i]);
    free(H);
    weight_free(&w);
}

static void test_cross_entropy(void **state)
{
    (void)state;
    cross_entropy_case(1000);
    cross_entropy_case(1001);
}

/* ------------------------------------------------------------------ LoRA ---- */

/* A segment table for lora_case: rows [rb, re) with rank rk (0: no LoRA) and scale sc; rows in
 * no segment are left alone by the ops. */
#define LORA_CASE_MAX_SEGS 4
typedef struct lora_layout {
    const char *what; /* names the checks */
    int64_t m, in, out, u_ld;
    int n;
    int64_t rb[LORA_CASE_MAX_SEGS], re[LORA_CASE_MAX_SEGS], rk[LORA_CASE_MAX_SEGS];
    float sc[LORA_CASE_MAX_SEGS];
} lora_layout;

/* segments: rank 4 rows [0, 30), no LoRA [30, 41), gap [41, 45), rank 16 [45, 80), rank 32
 * [80, 90) */
static const lora_layout lora_small = {.what = "r 4/16/32, a no-LoRA run, a gap",
                                       .m = 90,
                                       .in = 96,
                                       .out = 80,
                                       .u_ld = 32,
                                       .n = 4,
                                       .rb = {0, 30, 45, 80},
                                       .re = {30, 41, 80, 90},
                                       .rk = {4, 0, 16, 32},
                                       .sc = {2.0f, 0, 0.5f, 1.25f}};

/* Segmented LoRA fwd + bwd on both backends over layout l; p[s] is segment s's LoRA dropout (all
 * 0: none). dX, dA and dB start from random values (the backward accumulates). */
static void lora_case(const lora_layout *l, const float *p, const char *tag)
{
    const int64_t m = l->m, in = l->in, out = l->out, u_ld = l->u_ld;
    const int64_t *rb = l->rb, *re = l->re, *rk = l->rk;
    const int n = l->n;
    float *X = rndb(m * in, 1), *Y = rndb(m * out, 1), *DY = rndb(m * out, 1),
          *DX = rndb(m * in, 1);
    float *A[LORA_CASE_MAX_SEGS], *B[LORA_CASE_MAX_SEGS], *DA0[LORA_CASE_MAX_SEGS],
        *DB0[LORA_CASE_MAX_SEGS];
    for (int s = 0; s < n; s++) {
        int64_t r = rk[s] ? rk[s] : 1;
        A[s] = rndb(r * in, 0.3f), B[s] = rndb(out * r, 0.3f);
        DA0[s] = rndb(r * in, 0.1f), DB0[s] = rndb(out * r, 0.1f);
    }
    tdm_backend *bes[2] = {gpu, cpu};
    void *x[2], *y[2], *dy[2], *dx[2];
    float *u[2], *a[2][LORA_CASE_MAX_SEGS], *b[2][LORA_CASE_MAX_SEGS], *da[2][LORA_CASE_MAX_SEGS],
        *db[2][LORA_CASE_MAX_SEGS];
    for (int i = 0; i < 2; i++) {
        tdm_backend *be = bes[i];
        x[i] = put_act(be, X, m * in), y[i] = put_act(be, Y, m * out);
        dy[i] = put_act(be, DY, m * out), dx[i] = put_act(be, DX, m * in);
        u[i] = put(be, TDM_BE_F32, NULL, m * u_ld);
        tdm_lora_seg segs[LORA_CASE_MAX_SEGS];
        for (int s = 0; s < n; s++) {
            int64_t r = rk[s] ? rk[s] : 1;
            a[i][s] = put(be, TDM_BE_F32, A[s], r * in),
            b[i][s] = put(be, TDM_BE_F32, B[s], out * r);
            da[i][s] = put(be, TDM_BE_F32, DA0[s], r * in);
            db[i][s] = put(be, TDM_BE_F32, DB0[s], out * r);
            tdm_lora_seg sg = {rb[s],   re[s],    r,        l->sc[s], rk[s] ? a[i][s] : NULL,
                               b[i][s], da[i][s], db[i][s], p[s],     0x5eed0000u + (uint64_t)s};
            segs[s] = sg;
        }
        OK(tdm_be_lora_fwd(be, segs, n, x[i], m, in, out, u[i], u_ld, y[i], err));
        OK(tdm_be_lora_bwd(be, segs, n, x[i], u[i], u_ld, dy[i], m, in, out, dx[i], err));
    }
    char name[128];
    snprintf(name, sizeof name, "lora_fwd y (%s)%s", l->what, tag);
    cmp_act(name, y[0], y[1], m * out, BF_TOL);
    /* u: compare only the columns each segment with LoRA writes (zero the rest on both sides) */
    float *ug = get(gpu, u[0], TDM_BE_F32, m * u_ld), *uc = get(cpu, u[1], TDM_BE_F32, m * u_ld);
    for (int64_t r = 0; r < m; r++) {
        int64_t rank = 0;
        for (int s = 0; s < n; s++)
            if (rb[s] <= r && r < re[s]) rank = rk[s];
        for (int64_t c = rank; c < u_ld; c++)
            ug[r * u_ld + c] = uc[r * u_ld + c] = 0;
    }
    snprintf(name, sizeof name, "lora_fwd u%s", tag);
    check(name, ug, uc, m * u_ld, BF_TOL);
    free(ug), free(uc);
    snprintf(name, sizeof name, "lora_bwd dx (accumulated)%s", tag);
    cmp_act(name, dx[0], dx[1], m * in, BF_TOL);
    for (int s = 0; s < n; s++) {
        if (!rk[s]) continue;
        snprintf(name, sizeof name, "lora_bwd dA rank %lld, %lld rows, p %.2f (accumulated)",
                 (long long)rk[s], (long long)(re[s] - rb[s]), (double)p[s]);
        cmp(name, da[0][s], da[1][s], TDM_BE_F32, TDM_BE_F32, rk[s] * in, BF_TOL);
        snprintf(name, sizeof name, "lora_bwd dB rank %lld, %lld rows, p %.2f (accumulated)",
                 (long long)rk[s], (long long)(re[s] - rb[s]), (double)p[s]);
        cmp(name, db[0][s], db[1][s], TDM_BE_F32, TDM_BE_F32, out * rk[s], BF_TOL);
    }
    for (int i = 0; i < 2; i++) {
        tdm_be_free(bes[i], x[i]), tdm_be_free(bes[i], y[i]), tdm_be_free(bes[i], dy[i]);
        tdm_be_free(bes[i], dx[i]), tdm_be_free(bes[i], u[i]);
        for (int s = 0; s < n; s++) {
            tdm_be_free(bes[i], a[i][s]), tdm_be_free(bes[i], b[i][s]);
            tdm_be_free(bes[i], da[i][s]), tdm_be_free(bes[i], db[i][s]);
        }
    }
    for (int s = 0; s < n; s++)
        free(A[s]), free(B[s]), free(DA0[s]), free(DB0[s]);
    free(X), free(Y), free(DY), free(DX);
}

static void test_lora(void **state)
{
    const float none[4] = {0, 0, 0, 0};
    lora_case(&lora_small, none, "");
}

/* LoRA dropout on the GPU: the same op comparison with p 0.1 / - / 0.5 / 0.3, then the mask
 * itself bit for bit: X = 1 and A = I make U = X D A^T = D exactly (one non-zero product per
 * element on both backends), so the GPU's U must equal the CPU's (and engine/dropout.h's) bits,
 * for a segment that does not start at row 0 (rows are counted from the segment's start). */
static void test_lora_dropout(void **state)
{
    const float p[4] = {0.1f, 0.2f, 0.5f, 0.3f};
    lora_case(&lora_small, p, " dropout");

    int64_t m = 150, in = 96, r = 96, out = 8, r0 = 21;
    float *X = malloc((size_t)(m * in) * sizeof(float)),
          *A = calloc((size_t)(r * in), sizeof(float));
    float *B = calloc((size_t)(out * r), sizeof(float));
    for (int64_t i = 0; i < m * in; i++)
        X[i] = 1.0f;
    for (int64_t k = 0; k < r; k++)
        A[k * in + k] = 1.0f;
    tdm_backend *bes[2] = {gpu, cpu};
    float *uh[2];
    const float pd = 0.1f;
    const uint64_t seed = 0xfeedfacecafebeefull;
    for (int i = 0; i < 2; i++) {
        void *x = put_act(bes[i], X, m * in), *y = put_act(bes[i], NULL, m * out);
        float *a = (float *)put(bes[i], TDM_BE_F32, A, r * in);
        float *b = (float *)put(bes[i], TDM_BE_F32, B, out * r);
        float *u = (float *)put(bes[i], TDM_BE_F32, NULL, m * r);
        tdm_lora_seg sg = {r0, m, r, 1.0f, a, b, a, b, pd, seed};
        OK(tdm_be_lora_fwd(bes[i], &sg, 1, x, m, in, out, u, r, y, err));
        uh[i] = get(bes[i], u, TDM_BE_F32, m * r);
        tdm_be_free(bes[i], x), tdm_be_free(bes[i], y), tdm_be_free(bes[i], a);
        tdm_be_free(bes[i], b), tdm_be_free(bes[i], u);
    }
    int64_t differ = 0, wrong = 0, kept = 0;
    uint32_t thr = tdm_dropout_threshold(pd);
    float ks = tdm_dropout_scale(pd);
    for (int64_t row = r0; row < m; row++)
        for (int64_t k = 0; k < in; k++) {
            bool keep = tdm_dropout_keep(seed, thr, (uint64_t)(row - r0), (uint64_t)k);
            kept += keep;
            differ += memcmp(&uh[0][row * r + k], &uh[1][row * r + k], sizeof(float)) != 0;
            wrong += uh[0][row * r + k] != (keep ? ks : 0.0f);
        }
    printf("  dropout mask p %.1f, %lld elements: gpu vs cpu %lld differ, gpu vs "
           "engine/dropout.h %lld differ, kept %.4f\n",
           (double)pd, (long long)((m - r0) * in), (long long)differ, (long long)wrong,
           (double)kept / (double)((m - r0) * in));
    assert_int_equal(differ, 0);
    assert_int_equal(wrong, 0);
    free(uh[0]), free(uh[1]), free(X), free(A), free(B);
}

/* Segments long enough for the backward's row-chunked reduction (cuda_memory_plan.h): 700 rows
 * = 3 chunks of 256, 5000 rows = 16 chunks of 320; y, u, dX, dA, dB against the CPU backend. */
static void test_lora_long_segments(void **state)
{
    static const lora_layout long_segs = {.what = "700 + 5000 rows",
                                          .m = 5700,
                                          .in = 96,
                                          .out = 80,
                                          .u_ld = 16,
                                          .n = 2,
                                          .rb = {0, 700},
                                          .re = {700, 5700},
                                          .rk = {16, 8},
                                          .sc = {2.0f, 0.5f}};
    const float none[2] = {0, 0};
    lora_case(&long_segs, none, "");
}

/* Wide modules (lora.cuh's down kernel splits K in slices of >= 512, cuda_memory_plan.h): in
 * 1030 (3 slices; not a multiple of 4, so the scalar loads and stores) and out 1300 (3 slices in
 * the backward, vector loads), rank 24 (two rank groups, the second partial) and the largest
 * rank 128 (8 groups), with dropout on the rank-24 segment. */
static void test_lora_wide_modules(void **state)
{
    static const lora_layout wide = {.what = "in 1030, out 1300, r 24/128",
                                     .m = 300,
                                     .in = 1030,
                                     .out = 1300,
                                     .u_ld = 128,
                                     .n = 3,
                                     .rb = {0, 37, 40},
                                     .re = {37, 40, 300},
                                     .rk = {24, 0, 128},
                                     .sc = {1.5f, 0, 0.125f}};
    const float p[3] = {0.2f, 0, 0};
    lora_case(&wide, p, " wide");
}

/* ------------------------------------------------------------- optimizer ---- */

static void test_sumsq_clip(void **state)
{
    int64_t ns[5] = {10, 20000, 3, 8192, 100};
    int groups[5] = {0, 1, 0, 2, 1};
    float *h[5];
    tdm_be_vec vg[5], vc[5];
    for (int i = 0; i < 5; i++) {
        h[i] = rndb(ns[i], 1);
        vg[i] = (tdm_be_vec){put(gpu, TDM_BE_F32, h[i], ns[i]), ns[i], groups[i]};
        vc[i] = (tdm_be_vec){put(cpu, TDM_BE_F32, h[i], ns[i]), ns[i], groups[i]};
    }
    float *og = put(gpu, TDM_BE_F32, NULL, 4), *oc = put(cpu, TDM_BE_F32, NULL, 4);
    OK(tdm_be_sumsq(gpu, vg, 5, 4, og, err));
    OK(tdm_be_sumsq(cpu, vc, 5, 4, oc, err));
    cmp("sumsq (4 groups, one empty)", og, oc, TDM_BE_F32, TDM_BE_F32, 4, F32_TOL);
    float maxn[4] = {1.0f, 1000.0f, 0.0f, 0.5f};
    float *cg = put(gpu, TDM_BE_F32, NULL, 4), *cc = put(cpu, TDM_BE_F32, NULL, 4);
    float *ng = put(gpu, TDM_BE_F32, NULL, 4), *nc = put(cpu, TDM_BE_F32, NULL, 4);
    OK(tdm_be_clip_coef(gpu, og, maxn, 4, cg, ng, err));
    OK(tdm_be_clip_coef(cpu, oc, maxn, 4, cc, nc, err));
    cmp("clip_coef", cg, cc, TDM_BE_F32, TDM_BE_F32, 4, F32_TOL);
    cmp("clip_coef norm", ng, nc, TDM_BE_F32, TDM_BE_F32, 4, F32_TOL);
    for (int i = 0; i < 5; i++) {
        tdm_be_free(gpu, (void *)vg[i].x), tdm_be_free(cpu, (void *)vc[i].x);
        free(h[i]);
    }
    tdm_be_free(gpu, og), tdm_be_free(cpu, oc), tdm_be_free(gpu, cg), tdm_be_free(cpu, cc);
    tdm_be_free(gpu, ng), tdm_be_free(cpu, nc);
}

static void test_adamw(void **state)
{
    int64_t ns[3] = {100, 10000, 7};
    float lrs[3] = {2e-4f, 1e-3f, 5e-2f}, wds[3] = {0.0f, 0.01f, 0.1f};
    tdm_backend *bes[2] = {gpu, cpu};
    float *p[2][3], *g[2][3], *mm[2][3], *vv[2][3], *coef[2];
    float *hp[3], *hg[3];
    for (int t = 0; t < 3; t++)
        hp[t] = rndb(ns[t], 1), hg[t] = rndb(ns[t], 0.1f);
    float c = 0.37f;
    for (int i = 0; i < 2; i++) {
        coef[i] = put(bes[i], TDM_BE_F32, &c, 1);
        for (int t = 0; t < 3; t++) {
            p[i][t] = put(bes[i], TDM_BE_F32, hp[t], ns[t]);
            g[i][t] = put(bes[i], TDM_BE_F32, hg[t], ns[t]);
            mm[i][t] = put(bes[i], TDM_BE_F32, NULL, ns[t]);
            vv[i][t] = put(bes[i], TDM_BE_F32, NULL, ns[t]);
        }
        for (int64_t step = 1; step <= 3; step++) {
            tdm_adamw_tensor ts[3];
            for (int t = 0; t < 3; t++)
                ts[t] = (tdm_adamw_tensor){
                    p[i][t], g[i][t], mm[i][t], vv[i][t], ns[t],  t == 1 ? coef[i] : NULL,
                    lrs[t],  0.9f,    0.999f,   1e-8f,    wds[t], step};
            OK(tdm_be_adamw(bes[i], ts, 3, err));
        }
    }
    for (int t = 0; t < 3; t++) {
        char name[64];
        snprintf(name, sizeof name, "adamw p (tensor %d, 3 steps)", t);
        cmp(name, p[0][t], p[1][t], TDM_BE_F32, TDM_BE_F32, ns[t], F32_TOL);
        snprintf(name, sizeof name, "adamw m (tensor %d)", t);
        cmp(name, mm[0][t], mm[1][t], TDM_BE_F32, TDM_BE_F32, ns[t], F32_TOL);
        snprintf(name, sizeof name, "adamw v (tensor %d)", t);
        cmp(name, vv[0][t], vv[1][t], TDM_BE_F32, TDM_BE_F32, ns[t], F32_TOL);
    }
    for (int i = 0; i < 2; i++) {
        tdm_be_free(bes[i], coef[i]);
        for (int t = 0; t < 3; t++) {
            tdm_be_free(bes[i], p[i][t]), tdm_be_free(bes[i], g[i][t]);
            tdm_be_free(bes[i], mm[i][t]), tdm_be_free(bes[i], vv[i][t]);
        }
    }
    for (int t = 0; t < 3; t++)
        free(hp[t]), free(hg[t]);
}

/* --------------------------------------------------------- elementwise ---- */

/* cols 77: the scalar kernels; cols 96: the 8-wide bf16 axpy and add_bias */
static void elementwise_case(int64_t rows, int64_t cols)
{
    int64_t n = rows * cols;
    printf("  elementwise %lld x %lld\n", (long long)rows, (long long)cols);
    float *X = rndb(n, 1), *Y = rndb(n, 1), *bias = rndb(cols, 1);
    tdm_backend *bes[2] = {gpu, cpu};
    void *x[2], *y[2], *f[2];
    float *b[2];
    for (int i = 0; i < 2; i++) {
        x[i] = put_act(bes[i], X, n), y[i] = put_act(bes[i], Y, n);
        f[i] = put(bes[i], TDM_BE_F32, Y, n);
        b[i] = put(bes[i], TDM_BE_F32, bias, cols);
        OK(tdm_be_axpy(bes[i], y[i], x[i], tdm_be_act_dtype(bes[i]), n, -0.5f, err));
        OK(tdm_be_scale(bes[i], y[i], tdm_be_act_dtype(bes[i]), n, 3.0f, err));
        OK(tdm_be_add_bias(bes[i], y[i], b[i], rows, cols, err));
        OK(tdm_be_axpy(bes[i], f[i], b[i], TDM_BE_F32, cols, 2.0f, err));
        OK(tdm_be_fill(bes[i], (float *)f[i] + cols, TDM_BE_F32, 5, 1.5f, err));
    }
    cmp_act("axpy + scale + add_bias (act)", y[0], y[1], n, BF_TOL);
    cmp("axpy + fill f32", f[0], f[1], TDM_BE_F32, TDM_BE_F32, n, F32_TOL);
    for (int i = 0; i < 2; i++)
        tdm_be_free(bes[i], x[i]), tdm_be_free(bes[i], y[i]), tdm_be_free(bes[i], f[i]),
            tdm_be_free(bes[i], b[i]);
    free(X), free(Y), free(bias);
}

static void test_elementwise(void **state)
{
    elementwise_case(13, 77);
    elementwise_case(13, 96);
}

/* ---------------------------------------------------- errors & memory ---- */

static void test_errors_and_memory(void **state)
{
    tdm_error e = {0};
    void *p = NULL;
    /* far beyond any GPU: a distinct out-of-memory status naming the call */
    tdm_status st = tdm_be_alloc(gpu, TDM_BE_F32, (int64_t)1 << 38, &p, &e);
    printf("  huge alloc -> %s: %s\n", tdm_status_str(st), e.message);
    assert_int_equal(st, TDM_ERR_NOMEM);
    assert_non_null(strstr(e.message, "cudaMalloc"));
    assert_non_null(strstr(e.message, "cuda_backend.cu:"));
    /* the backend still works after it */
    tdm_be_mem_info mi0, mi1;
    OK(tdm_be_memory(gpu, &mi0, err));
    void *q;
    OK(tdm_be_alloc(gpu, TDM_BE_F32, 1 << 20, &q, err));
    OK(tdm_be_memory(gpu, &mi1, err));
    assert_true(mi1.used_bytes >= mi0.used_bytes + (4u << 20));
    assert_true(mi1.peak_bytes >= mi1.used_bytes);
    assert_true(mi1.total_bytes > 0);
    tdm_be_free(gpu, q);
    /* a token id out of range is found on the GPU and reported by synchronize */
    wpair w;
    weight_make(&w, TDM_BE_W_BF16, 10, 8);
    int32_t ids[3] = {1, 10, 2};
    void *ig = put_raw(gpu, ids, sizeof ids), *og = put_act(gpu, NULL, 24);
    OK(tdm_be_embedding(gpu, &w.w[0], ig, 3, og, err));
    memset(&e, 0, sizeof e);
    st = tdm_be_synchronize(gpu, &e);
    printf("  bad token id -> %s: %s\n", tdm_status_str(st), e.message);
    assert_int_equal(st, TDM_ERR_INVALID);
    assert_non_null(strstr(e.message, "token id"));
    OK(tdm_be_synchronize(gpu, err)); /* reported once, then cleared */
    tdm_be_free(gpu, ig), tdm_be_free(gpu, og);
    weight_free(&w);
}

/* Same inputs twice: the same bits (no atomics in the reductions). */
static void test_determinism(void **state)
{
    int32_t lens[3] = {50, 64, 13};
    int32_t cu[4] = {0, 50, 114, 127};
    int64_t m = 127, H = 4, KVH = 2, D = 64, nq = m * H * D, nk = m * KVH * D;
    float *Q = rndb(nq, 1), *K = rndb(nk, 1), *V = rndb(nk, 1), *DO = rndb(nq, 1);
    (void)lens;
    void *cud = put_raw(gpu, cu, sizeof cu);
    tdm_be_seqs s = {cud, 3, 64, m};
    void *q = put_act(gpu, Q, nq), *k = put_act(gpu, K, nk), *v = put_act(gpu, V, nk);
    void *dout = put_act(gpu, DO, nq), *o = put_act(gpu, NULL, nq);
    float *lse = put(gpu, TDM_BE_F32, NULL, H * m);
    void *dk[2];
    for (int r = 0; r < 2; r++) {
        void *dq = put_act(gpu, NULL, nq), *dv = put_act(gpu, NULL, nk);
        dk[r] = put_act(gpu, NULL, nk);
        OK(tdm_be_attention_fwd(gpu, &s, q, k, v, H, KVH, D, 0.125f, o, lse, err));
        OK(tdm_be_attention_bwd(gpu, &s, q, k, v, o, lse, dout, H, KVH, D, 0.125f, dq, dk[r], dv,
                                err));
        tdm_be_free(gpu, dq), tdm_be_free(gpu, dv);
    }
    uint16_t *a = malloc((size_t)nk * 2), *b = malloc((size_t)nk * 2);
    OK(tdm_be_download(gpu, a, dk[0], (size_t)nk * 2, err));
    OK(tdm_be_download(gpu, b, dk[1], (size_t)nk * 2, err));
    assert_memory_equal(a, b, (size_t)nk * 2);
    printf("  attention_bwd twice: identical bits\n");
    free(a), free(b), free(Q), free(K), free(V), free(DO);
    void *all[8] = {cud, q, k, v, dout, o, lse, dk[0]};
    for (int i = 0; i < 8; i++)
        tdm_be_free(gpu, all[i]);
    tdm_be_free(gpu, dk[1]);
}

/* ------------------------------------------------------ the whole model ---- */

/* One fused step (forward + backward) of a random tiny model with one adapter on both backends:
 * loss within bf16 tolerance, LoRA gradients with cosine similarity > 0.999 (issue 6); with LoRA
 * dropout p when p > 0 (the same mask seed on both backends). */
static void model_case(const char *preset, bool nf4, unsigned targets, float p)
{
    char dir[] = "/tmp/tandem-cuda-model-XXXXXX";
    assert_non_null(mkdtemp(dir));
    tdm_init_model_opts io = {0};
    io.preset = preset;
    io.seed = 7;
    io.dtype = TDM_DTYPE_F32;
    tdm_model_config cfg;
    OK(tdm_init_model(dir, &io, &cfg, err));
    tdm_model_opts mo = {.nf4 = nf4};
    tdm_backend *bes[2] = {gpu, cpu};
    tdm_model *mdl[2];
    tdm_lora *ad[2];
    for (int i = 0; i < 2; i++) {
        OK(tdm_model_load(&mdl[i], bes[i], dir, &mo, err));
        OK(tdm_lora_create(&ad[i], mdl[i], 8, 2.0f, targets, err));
        ad[i]->dropout = p;
        ad[i]->dropout_seed = tdm_lora_dropout_seed(7, 3, 1);
    }
    for (int l = 0; l < cfg.num_layers; l++)
        for (int t = 0; t < TDM_LORA_N_TARGETS; t++) {
            if (!(targets & TDM_LORA_BIT(t))) continue;
            int64_t in, out;
            tdm_model_target_shape(mdl[0], (tdm_lora_target)t, &in, &out);
            float *A = rndb(8 * in, 0.05f), *B = rndb(out * 8, 0.05f);
            for (int i = 0; i < 2; i++)
                OK(tdm_lora_set(ad[i], l, (tdm_lora_target)t, A, B, err));
            free(A), free(B);
        }
    int32_t tokens[33], labels[33], cu[3] = {0, 20, 33};
    for (int i = 0; i < 33; i++) {
        tokens[i] = (int32_t)(tdm_rng_next(&rng) % (uint64_t)cfg.vocab_size);
        labels[i] = i % 9 == 4 ? -100 : tokens[i];
    }
    tdm_batch_seg seg = {0, 0, 33};
    tdm_batch b = {33, tokens, labels, cu, 2, &seg, 1};
    double loss[2];
    int64_t ntok[2];
    for (int i = 0; i < 2; i++)
        OK(tdm_model_step(mdl[i], &ad[i], 1, &b, true, NULL, &loss[i], &ntok[i], err));
    assert_int_equal(ntok[0], ntok[1]);
    double lg = loss[0] / (double)ntok[0], lc = loss[1] / (double)ntok[1];
    float *gg = get(gpu, ad[0]->grads, TDM_BE_F32, ad[0]->n_params);
    float *gc = get(cpu, ad[1]->grads, TDM_BE_F32, ad[1]->n_params);
    double dot = 0, ng = 0, nc = 0;
    for (int64_t i = 0; i < ad[0]->n_params; i++)
        dot += (double)gg[i] * gc[i], ng += (double)gg[i] * gg[i], nc += (double)gc[i] * gc[i];
    double cosv = dot / sqrt(ng * nc), rel = fabs(lg - lc) / fabs(lc);
    printf("  model %-12s %s targets 0x%02x dropout %.1f: loss gpu %.6f cpu %.6f rel %.2e; grad "
           "cosine %.6f\n",
           preset, nf4 ? "nf4 " : "f32 ", targets, (double)p, lg, lc, rel, cosv);
    assert_true(rel <= 1e-2);
    assert_true(cosv > 0.999);
    free(gg), free(gc);
    for (int i = 0; i < 2; i++)
        tdm_lora_free(ad[i]), tdm_model_free(mdl[i]);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_model_step(void **state)
{
    unsigned qv = TDM_LORA_BIT(TDM_LORA_Q) | TDM_LORA_BIT(TDM_LORA_V);
    model_case("tiny", false, qv, 0);
    model_case("tiny", true, qv, 0);
    model_case("tiny-llama", true, (1u << TDM_LORA_N_TARGETS) - 1, 0);
    model_case("tiny-qwen3", false, (1u << TDM_LORA_N_TARGETS) - 1, 0);
}

/* A whole training step with LoRA dropout on both backends (every module, so q/k/v, gate/up and
 * down all draw masks). */
static void test_model_step_dropout(void **state)
{
    model_case("tiny", true, (1u << TDM_LORA_N_TARGETS) - 1, 0.1f);
    model_case("tiny-qwen3", false, TDM_LORA_BIT(TDM_LORA_Q) | TDM_LORA_BIT(TDM_LORA_V), 0.3f);
}

/* Gradient checkpointing on the GPU, every recompute mode: the loss and every LoRA gradient
 * bit-identical to the step that keeps everything (the recompute runs the same kernels on the
 * same inputs), with LoRA dropout on every module. Again with the MLP in blocks of 16 rows
 * (cutting sequences and their masks): bit-identical across the modes, and within rounding of
 * the step without blocks. Again with activation offload (the layer inputs to page-locked host
 * memory on the copy queue and back): bit-identical to keeping them, in every mode. */
static void test_model_step_recompute(void **state)
{
    (void)state;
    const char *presets[2] = {"tiny", "tiny-qwen3"};
    for (int pi = 0; pi < 2; pi++) {
        char dir[] = "/tmp/tandem-cuda-recompute-XXXXXX";
        assert_non_null(mkdtemp(dir));
        tdm_init_model_opts io = {0};
        io.preset = presets[pi];
        io.seed = 11;
        io.dtype = TDM_DTYPE_F32;
        tdm_model_config cfg;
        OK(tdm_init_model(dir, &io, &cfg, err));
        int32_t tokens[45], labels[45], cu[4] = {0, 20, 33, 45};
        for (int i = 0; i < 45; i++) {
            tokens[i] = (int32_t)(tdm_rng_next(&rng) % (uint64_t)cfg.vocab_size);
            labels[i] = i % 7 == 3 ? -100 : tokens[i];
        }
        tdm_batch_seg seg = {0, 0, 45};
        tdm_batch b = {45, tokens, labels, cu, 3, &seg, 1};
        unsigned all = (1u << TDM_LORA_N_TARGETS) - 1;
        float *ref = NULL, *unblocked = NULL;
        double ref_loss = 0, unblocked_loss = 0;
        int64_t n = 0;
        for (int run = 0; run < 12; run++) {
            int mode = run % 4 - 1; /* -1: no checkpointing */
            int64_t block = run >= 4 && run < 8 ? 16 : 0;
            bool offload = run >= 8;
            tdm_model_opts mo = {.nf4 = pi == 0,
                                 .grad_checkpoint = mode >= 0,
                                 .recompute = mode >= 0 ? (tdm_recompute)mode : 0,
                                 .mlp_block_rows = block,
                                 .offload_activations = offload};
            tdm_model *m;
            tdm_lora *a;
            OK(tdm_model_load(&m, gpu, dir, &mo, err));
            OK(tdm_lora_create(&a, m, 8, 2.0f, all, err));
            a->dropout = 0.1f;
            a->dropout_seed = tdm_lora_dropout_seed(7, 3, 1);
            tdm_rng r;
            tdm_rng_seed(&r, 99);
            for (int l = 0; l < cfg.num_layers; l++)
                for (int t = 0; t < TDM_LORA_N_TARGETS; t++) {
                    int64_t in, out;
                    tdm_model_target_shape(m, (tdm_lora_target)t, &in, &out);
                    float *A = malloc((size_t)(8 * in) * sizeof *A);
                    float *B = malloc((size_t)(out * 8) * sizeof *B);
                    for (int64_t i = 0; i < 8 * in; i++)
                        A[i] = 0.05f * (2.0f * (float)tdm_rng_uniform(&r) - 1.0f);
                    for (int64_t i = 0; i < out * 8; i++)
                        B[i] = 0.05f * (2.0f * (float)tdm_rng_uniform(&r) - 1.0f);
                    OK(tdm_lora_set(a, l, (tdm_lora_target)t, A, B, err));
                    free(A), free(B);
                }
            OK(tdm_lora_zero_grad(a, err));
            double loss;
            int64_t ntok;
            OK(tdm_model_step(m, &a, 1, &b, true, NULL, &loss, &ntok, err));
            float *g = get(gpu, a->grads, TDM_BE_F32, a->n_params);
            if (mode < 0 && block > 0) { /* blocks against no blocks: to rounding */
                double dot = 0, ng = 0, nu = 0;
                for (int64_t i = 0; i < n; i++)
                    dot += (double)g[i] * unblocked[i], ng += (double)g[i] * g[i],
                        nu += (double)unblocked[i] * unblocked[i];
                double cosv = dot / sqrt(ng * nu), rel = fabs(loss - unblocked_loss) / loss;
                printf("  MLP in blocks of 16 %-10s: loss %.9g (no blocks %.9g, rel %.2e), "
                       "gradient cosine %.8f\n",
                       presets[pi], loss, unblocked_loss, rel, cosv);
                assert_true(rel <= 1e-4);
                assert_true(cosv > 0.99999);
            }
            if (mode < 0 && !offload) {
                if (ref && ref != unblocked) free(ref);
                ref = g, ref_loss = loss, n = a->n_params;
                if (block == 0) unblocked = g, unblocked_loss = loss;
            } else { /* the same bits as the step of the same blocks that keeps everything */
                const float *want = offload ? unblocked : ref;
                double want_loss = offload ? unblocked_loss : ref_loss;
                int64_t diff = 0;
                for (int64_t i = 0; i < n; i++)
                    diff += memcmp(&g[i], &want[i], sizeof *g) != 0;
                printf("  %srecompute %-5s %-10s MLP blocks %-2lld: loss %.9g (keeping "
                       "everything %.9g), %lld of %lld gradients differ; activations %.1f KiB\n",
                       offload ? "offload, " : "",
                       mode < 0 ? "none" : tdm_recompute_name((tdm_recompute)mode), presets[pi],
                       (long long)block, loss, want_loss, (long long)diff, (long long)n,
                       (double)tdm_model_activation_bytes(m) / 1024);
                assert_true(loss == want_loss);
                assert_int_equal(diff, 0);
                free(g);
            }
            tdm_lora_free(a);
            tdm_model_free(m);
        }
        if (ref != unblocked) free(ref);
        free(unblocked);
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        assert_int_equal(system(cmd), 0);
    }
}

static int setup(void **state)
{
    tdm_error err = {0};
    if (tdm_backend_create(&cpu, "cpu", NULL, &err) != TDM_OK) return -1;
    tdm_rng_seed(&rng, 20261129);
    return 0;
}

static int teardown(void **state)
{
    tdm_backend_free(cpu);
    tdm_backend_free(gpu);
    return 0;
}

int main(void)
{
    tdm_error err = {0};
    tdm_status st = tdm_backend_create(&gpu, "cuda", NULL, &err);
    if (st != TDM_OK) {
        /* the no-GPU path must be a clean, named failure that callers can fall back from */
        if ((st != TDM_ERR_NOT_FOUND && st != TDM_ERR_UNSUPPORTED) ||
            !strstr(err.message, "cuda")) {
            fprintf(stderr, "creating the cuda backend failed badly: %s: %s\n", tdm_status_str(st),
                    err.message);
            return 1;
        }
        printf("SKIP: no CUDA backend here (%s: %s)\n", tdm_status_str(st), err.message);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_attention_kv),
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_linear_fp8),
        cmocka_unit_test(test_quantize_nf4),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_lora),
        cmocka_unit_test(test_lora_dropout),
        cmocka_unit_test(test_lora_long_segments),
        cmocka_unit_test(test_lora_wide_modules),
        cmocka_unit_test(test_sumsq_clip),
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_errors_and_memory),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_model_step),
        cmocka_unit_test(test_model_step_dropout),
        cmocka_unit_test(test_model_step_recompute),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
