/* cpu_panel_gemm.c — the frozen projections' GEMMs with tandem's own kernels (cpu_internal.h).
 *
 * Why not OpenBLAS here: the backend's tiles call single-threaded OpenBLAS once per tile, and
 * each call packs its own copy of the weight's columns and of the activation rows, so a 1024-row
 * product with 8 row tiles packs every weight 8 times (docs/benchmarks.md, issue 20: about 25 %
 * slower per thread than one large call). Here the weight is laid out once per product, shared
 * by every thread, and a tile packs only its activation rows; a frozen f32 weight (a
 * projection, the lm_head) is laid out in the forward's panels once, at load
 * (cpu_panel_lay_out), and the backward's panels are made from those (the lm_head's, by the
 * cross-entropy's dH tasks, a K piece at a time); an NF4 tile is dequantized straight into its
 * product's panels (cpu_nf4_tile_panels).
 *
 * C (m x n) = A (m x k) op(B) + beta C, f32 row-major, beta 0 or 1:
 *   forward  Y = X W^T: op(B) = B^T, B (n x k) row-major (the weight);
 *   backward dX = dY W: op(B) = B, B (k x n) row-major (the weight, read as it is).
 * The kernel keeps an MR x NR block of C in registers (MR rows, NR columns in vector lanes):
 * per k it loads NR values of the B panel and broadcasts MR values of A, MR x NR / lanes FMAs.
 *   AVX-512: MR 12, NR 32 (24 accumulators of 16 lanes);  AVX2 + FMA: MR 6, NR 16 (12 of 8).
 * B panels: NR columns, for each k the NR values contiguous, zero-padded past n: one pass over
 * W per product by all threads (the forward transposes, the backward copies NR-float pieces of
 * its rows), shared by every tile.
 *
 * Bits: every element of C is one chain of FMAs over k = 0 .. k-1 in order, starting from 0
 * (beta 0) or from C (beta 1); K blocks reload the stored partial and go on with the same chain.
 * So an element's bits depend on neither the tiles, the thread count, the rows beside it (an
 * adapter alone == fused with others) nor K blocking, and the AVX-512 and AVX2 kernels, the same
 * chain of fused multiply-adds, give the same bits (tests/unit/test_cpu_panel_gemm.c checks them
 * against a double reference, across threads, row counts and the two kernels).
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cpu/cpu_internal.h"
#include "util/half.h"

#define KC 256 /* K block: a B panel's piece, KC x NR floats (32 KiB), stays in L1 */

typedef enum { PANEL_NONE, PANEL_AVX2, PANEL_AVX512 } panel_isa;

static panel_isa detect_isa(void)
{
    const char *v = getenv("TANDEM_CPU_PANELS");
    if (v && strcmp(v, "0") == 0) return PANEL_NONE;
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    bool avx512 = __builtin_cpu_supports("avx512f");
    if (v && strcmp(v, "avx2") == 0) return avx2 ? PANEL_AVX2 : PANEL_NONE;
    if (avx512) return PANEL_AVX512;
    return avx2 ? PANEL_AVX2 : PANEL_NONE;
}

static int isa_chosen = -1; /* panel_isa once detected (the backend's ops run on one thread) */

static panel_isa isa(void)
{
    if (isa_chosen < 0) isa_chosen = (int)detect_isa();
    return (panel_isa)isa_chosen;
}

bool cpu_panel_isa_use(const char *name)
{
    __builtin_cpu_init();
    if (!name) {
        isa_chosen = (int)detect_isa();
        return true;
    }
    if (!strcmp(name, "avx512") && __builtin_cpu_supports("avx512f"))
        isa_chosen = PANEL_AVX512;
    else if (!strcmp(name, "avx2") && __builtin_cpu_supports("avx2") &&
             __builtin_cpu_supports("fma"))
        isa_chosen = PANEL_AVX2;
    else if (!strcmp(name, "none"))
        isa_chosen = PANEL_NONE;
    else
        return false;
    return true;
}

const char *cpu_panel_isa_name(void)
{
    switch (isa()) {
    case PANEL_AVX512:
        return "avx512";
    case PANEL_AVX2:
        return "avx2";
    default:
        return NULL;
    }
}

static int panel_nr(void)
{
    return isa() == PANEL_AVX512 ? 32 : 16;
}

static int panel_mr(void)
{
    return isa() == PANEL_AVX512 ? 12 : 6;
}

/* ---- kernels: C[0..mr) x [0..nr) (+)= A panel (kc x MR) . B (kc x NR) ----
 * B comes one of three ways, every one the same values in the same FMA chain (the same bits):
 *   B_PACKED  a panel (kc x NR contiguous; bp advances NR a k);
 *   B_ROWS    B (k x n) in place: NR contiguous floats of row k (bp advances bs = ldb a k);
 *   B_GATHER  B (n x k) in place, transposed on the fly: lane j reads bp[j bs] (bp advances 1).
 * Lanes at or past nr are zeros (masked loads: they never touch memory). */
typedef enum { B_PACKED, B_ROWS, B_GATHER } b_access;

/* Each kernel names its accumulators (c<row><half>) one by one: an array of them, or pointers
 * to them, made GCC keep them in memory (0.05 against OpenBLAS's 0.12 TFLOP/s on two threads). */
#define ROWS12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define ROWS6(X) X(0) X(1) X(2) X(3) X(4) X(5)

#define Z512_DECL(i) __m512 c##i##0, c##i##1;
#define Z512_INIT(i)                                                                               \
    c##i##0 = load_c && i < mr ? _mm512_maskz_loadu_ps(m0, c + i * ldc) : _mm512_setzero_ps();    \
    c##i##1 = load_c && i < mr ? _mm512_maskz_loadu_ps(m1, c + i * ldc + 16) : _mm512_setzero_ps();
#define Z512_FMA(i)                                                                                \
    {                                                                                              \
        __m512 a_ = _mm512_set1_ps(ap[i]);                                                         \
        c##i##0 = _mm512_fmadd_ps(a_, b0, c##i##0);                                               \
        c##i##1 = _mm512_fmadd_ps(a_, b1, c##i##1);                                               \
    }
#define Z512_STORE(i)                                                                              \
    if (i < mr) {                                                                                  \
        _mm512_mask_storeu_ps(c + i * ldc, m0, c##i##0);                                          \
        if (m1) _mm512_mask_storeu_ps(c + i * ldc + 16, m1, c##i##1);                             \
    }
#define Z512_LOOP(LOAD_B, STEP)                                                                    \
    _Pragma("GCC unroll 4") for (int64_t p = 0; p < kc; p++) {                                                             \
        __m512 b0, b1;                                                                             \
        LOAD_B;                                                                                    \
        ROWS12(Z512_FMA)                                                                           \
        ap += 12, bp += STEP;                                                                      \
    }

__attribute__((target("avx512f,fma"))) static void
kernel_avx512(int64_t kc, const float *ap, const float *bp, b_access how, int64_t bs, float *c,
              int64_t ldc, int mr, int nr, bool load_c)
{
    __mmask16 m0 = nr >= 16 ? 0xFFFF : (__mmask16)((1u << nr) - 1);
    __mmask16 m1 = nr >= 32 ? 0xFFFF : nr <= 16 ? 0 : (__mmask16)((1u << (nr - 16)) - 1);
    ROWS12(Z512_DECL)
    ROWS12(Z512_INIT)
    switch (how) {
    case B_PACKED:
        Z512_LOOP((b0 = _mm512_loadu_ps(bp), b1 = _mm512_loadu_ps(bp + 16)), 32)
        break;
    case B_ROWS:
        Z512_LOOP((b0 = _mm512_maskz_loadu_ps(m0, bp), b1 = _mm512_maskz_loadu_ps(m1, bp + 16)),
                  bs)
        break;
    case B_GATHER: {
        __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        __m512i i0 = _mm512_mullo_epi32(lane, _mm512_set1_epi32((int)bs));
        __m512i i1 = _mm512_add_epi32(i0, _mm512_set1_epi32((int)(16 * bs)));
        __m512 z = _mm512_setzero_ps();
        Z512_LOOP((b0 = _mm512_mask_i32gather_ps(z, m0, i0, bp, 4),
                   b1 = _mm512_mask_i32gather_ps(z, m1, i1, bp, 4)),
                  1)
        break;
    }
    }
    ROWS12(Z512_STORE)
}

__attribute__((target("avx2,fma"))) static __m256i avx2_mask(int n)
{
    /* lane j on when j < n (n clamped to 0..8) */
    n = n < 0 ? 0 : n > 8 ? 8 : n;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

#define Y256_DECL(i) __m256 c##i##0, c##i##1;
#define Y256_INIT(i)                                                                               \
    c##i##0 = !load_c || i >= mr ? _mm256_setzero_ps()                                             \
              : full             ? _mm256_loadu_ps(c + i * ldc)                                    \
                                 : _mm256_maskload_ps(c + i * ldc, m0);                            \
    c##i##1 = !load_c || i >= mr || nr <= 8 ? _mm256_setzero_ps()                                  \
              : full                        ? _mm256_loadu_ps(c + i * ldc + 8)                     \
                                            : _mm256_maskload_ps(c + i * ldc + 8, m1);
#define Y256_FMA(i)                                                                                \
    {                                                                                              \
        __m256 a_ = _mm256_broadcast_ss(ap + i);                                                   \
        c##i##0 = _mm256_fmadd_ps(a_, b0, c##i##0);                                               \
        c##i##1 = _mm256_fmadd_ps(a_, b1, c##i##1);                                               \
    }
#define Y256_STORE(i)                                                                              \
    if (i < mr && full) {                                                                          \
        _mm256_storeu_ps(c + i * ldc, c##i##0);                                                    \
        _mm256_storeu_ps(c + i * ldc + 8, c##i##1);                                                \
    } else if (i < mr) {                                                                           \
        _mm256_maskstore_ps(c + i * ldc, m0, c##i##0);                                            \
        if (nr > 8) _mm256_maskstore_ps(c + i * ldc + 8, m1, c##i##1);                            \
    }
#define Y256_LOOP(LOAD_B, STEP)                                                                    \
    _Pragma("GCC unroll 4") for (int64_t p = 0; p < kc; p++) {                                                             \
        __m256 b0, b1;                                                                             \
        LOAD_B;                                                                                    \
        ROWS6(Y256_FMA)                                                                            \
        ap += 6, bp += STEP;                                                                       \
    }

__attribute__((target("avx2,fma"))) static void
kernel_avx2(int64_t kc, const float *ap, const float *bp, b_access how, int64_t bs, float *c,
            int64_t ldc, int mr, int nr, bool load_c)
{
    /* masked loads and stores only at a partial panel: vmaskmovps stores are microcoded on AMD
     * cores (tens of cycles each) */
    __m256i m0 = avx2_mask(nr), m1 = avx2_mask(nr - 8);
    bool full = nr == 16;
    ROWS6(Y256_DECL)
    ROWS6(Y256_INIT)
    switch (how) {
    case B_PACKED:
        Y256_LOOP((b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8)), 16)
        break;
    case B_ROWS:
        if (full)
            Y256_LOOP((b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8)), bs)
        else
            Y256_LOOP((b0 = _mm256_maskload_ps(bp, m0), b1 = _mm256_maskload_ps(bp + 8, m1)), bs)
        break;
    case B_GATHER: {
        __m256i i0 = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                        _mm256_set1_epi32((int)bs));
        __m256i i1 = _mm256_add_epi32(i0, _mm256_set1_epi32((int)(8 * bs)));
        __m256 z = _mm256_setzero_ps(), f0 = _mm256_castsi256_ps(m0),
               f1 = _mm256_castsi256_ps(m1);
        Y256_LOOP((b0 = _mm256_mask_i32gather_ps(z, bp, i0, f0, 4),
                   b1 = _mm256_mask_i32gather_ps(z, bp, i1, f1, 4)),
                  1)
        break;
    }
    }
    ROWS6(Y256_STORE)
}

/* ---- packing ---- */

/* Where element (p, j) of op(B) (k x n) lies in panels pw wide: panel j / pw holds, for each of
 * the k values of p, its pw columns contiguous. The layout of pack_bt / pack_b (pw = NR) and of
 * a weight laid out at load (TDM_BE_W_F32_PANELS: p a column of W, j a row). */
static inline int64_t panel_offset(int pw, int64_t k, int64_t p, int64_t j)
{
    return (j / pw) * pw * k + p * pw + j % pw;
}

/* B^T panels for the forward: panel j holds rows [j NR, j NR + NR) of B (n x k), for each of
 * the k columns the NR values contiguous; rows past n are zeros. All threads, one pass. */
static void pack_bt(int nt, int nr, int64_t n, int64_t k, const float *b, int64_t ldb, float *out)
{
    int64_t panels = (n + nr - 1) / nr;
#pragma omp parallel for schedule(static) num_threads(nt) if (n * k > TDM_CPU_PAR_MIN)
    for (int64_t j = 0; j < panels; j++) {
        float *o = out + j * nr * k;
        int64_t rows = n - j * nr < nr ? n - j * nr : nr;
        /* 16 columns of k at a time: the first k of a block brings the NR source rows' 64-byte
         * pieces into L1, and every k's NR values are then written contiguously (written with
         * a stride of NR floats instead, the forward's layout cost 4.5x the backward's: ~18 ms
         * for 4864 x 896 on one thread) */
        const float *src = b + j * nr * ldb;
        for (int64_t p0 = 0; p0 < k; p0 += 16) {
            int64_t pe = p0 + 16 < k ? p0 + 16 : k;
            for (int64_t p = p0; p < pe; p++) {
                float *op = o + p * nr;
                for (int64_t r = 0; r < rows; r++)
                    op[r] = src[r * ldb + p];
                for (int64_t r = rows; r < nr; r++)
                    op[r] = 0.0f;
            }
        }
    }
}

/* B (k x n) for the backward, in panels of NR of its columns, for each k the NR values
 * contiguous (columns past n zeros). Read in place, a panel's rows lie ldb floats apart: at
 * Qwen2.5-0.5B's strides (3,584 and 19,456 bytes) its 256 rows of a K block fall in 8 or 4 of
 * an L1's 64 sets and evict each other (the backward ran 15 % slower than the forward). */
static void pack_b(int nt, int nr, int64_t n, int64_t k, const float *b, int64_t ldb, float *out)
{
    int64_t panels = (n + nr - 1) / nr;
#pragma omp parallel for schedule(static) num_threads(nt) if (n * k > TDM_CPU_PAR_MIN)
    for (int64_t j = 0; j < panels; j++) {
        float *o = out + j * nr * k;
        int64_t cols = n - j * nr < nr ? n - j * nr : nr;
        for (int64_t p = 0; p < k; p++) {
            memcpy(o + p * nr, b + p * ldb + j * nr, (size_t)cols * sizeof(float));
            if (cols < nr) memset(o + p * nr + cols, 0, (size_t)(nr - cols) * sizeof(float));
        }
    }
}

/* dst (8 x 8, rows ld apart) = src (8 x 8, rows ls apart) transposed: the usual unpack /
 * shuffle / lane-swap sequence, 24 shuffles for 64 floats where element by element it was 64
 * loads and 64 stores (the backward's re-layout took longer than the forward's it replaced). */
__attribute__((target("avx2"))) static void transpose8(const float *src, int64_t ls, float *dst,
                                                       int64_t ld)
{
    __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + ls),
           r2 = _mm256_loadu_ps(src + 2 * ls), r3 = _mm256_loadu_ps(src + 3 * ls),
           r4 = _mm256_loadu_ps(src + 4 * ls), r5 = _mm256_loadu_ps(src + 5 * ls),
           r6 = _mm256_loadu_ps(src + 6 * ls), r7 = _mm256_loadu_ps(src + 7 * ls);
    __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1),
           t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3),
           t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
           t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE),
           s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE),
           s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE),
           s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    _mm256_storeu_ps(dst, _mm256_permute2f128_ps(s0, s4, 0x20));
    _mm256_storeu_ps(dst + ld, _mm256_permute2f128_ps(s1, s5, 0x20));
    _mm256_storeu_ps(dst + 2 * ld, _mm256_permute2f128_ps(s2, s6, 0x20));
    _mm256_storeu_ps(dst + 3 * ld, _mm256_permute2f128_ps(s3, s7, 0x20));
    _mm256_storeu_ps(dst + 4 * ld, _mm256_permute2f128_ps(s0, s4, 0x31));
    _mm256_storeu_ps(dst + 5 * ld, _mm256_permute2f128_ps(s1, s5, 0x31));
    _mm256_storeu_ps(dst + 6 * ld, _mm256_permute2f128_ps(s2, s6, 0x31));
    _mm256_storeu_ps(dst + 7 * ld, _mm256_permute2f128_ps(s3, s7, 0x31));
}

/* dst[c ldd + r] = src[r lds + c] for rows r < `rows` (a multiple of 8) and columns c < cols: 8 x
 * 8 transposes, the columns past the last whole 8 one element at a time. A block of a weight's
 * rows into its panel (at load; an NF4 tile's rows as they are dequantized), a forward panel's
 * columns into the backward's rows. */
static void transpose_rows(const float *src, int64_t lds, int rows, int64_t cols, float *dst,
                           int64_t ldd)
{
    int64_t c8 = cols / 8 * 8;
    for (int r0 = 0; r0 < rows; r0 += 8)
        for (int64_t c0 = 0; c0 < c8; c0 += 8)
            transpose8(src + r0 * lds + c0, lds, dst + c0 * ldd + r0, ldd);
    for (int64_t c = c8; c < cols; c++)
        for (int r = 0; r < rows; r++)
            dst[c * ldd + r] = src[r * lds + c];
}

/* The backward's panels (as pack_b makes of W (k x n) row-major) from a weight laid out in the
 * forward's panels of pw of its k rows (TDM_BE_W_F32_PANELS: row j, column c at
 * w[panel_offset(pw, n, c, j)]): each pw x NR block is pw contiguous floats per column c,
 * written as NR floats per row j, in 8 x 8 transposes (pw and NR are multiples of 16: the
 * layout exists only with tandem's kernels, which need AVX2). Columns past n are zeros. All
 * threads, one pass. */
static void pack_b_from_panels(int nt, int nr, int64_t n, int64_t k, const float *w, int pw,
                               float *out)
{
    int64_t panels = (n + nr - 1) / nr;
#pragma omp parallel for schedule(static) num_threads(nt) if (n * k > TDM_CPU_PAR_MIN)
    for (int64_t q = 0; q < panels; q++) {
        float *o = out + q * nr * k;
        int64_t cols = n - q * nr < nr ? n - q * nr : nr;
        for (int64_t j0 = 0; j0 < k; j0 += pw) {
            const float *src = w + panel_offset(pw, n, q * nr, j0); /* column q nr, row j0 */
            if (cols == nr) { /* nr columns of pw rows each -> pw rows of nr columns */
                transpose_rows(src, pw, nr, pw, o + j0 * nr, nr);
                continue;
            }
            for (int64_t l = 0; l < nr; l++)
                for (int r = 0; r < pw; r++)
                    o[(j0 + r) * nr + l] = l < cols ? src[l * pw + r] : 0.0f;
        }
    }
}

/* A block rows [i0, i0 + mb) x K [p0, p0 + kb) into MR-row panels (per k the MR values), rows
 * past mb zeros. */
static void pack_a(int mr, const float *a, int64_t lda, int64_t mb, int64_t kb, float *out)
{
    for (int64_t i0 = 0; i0 < mb; i0 += mr) {
        float *o = out + i0 * kb;
        int64_t rows = mb - i0 < mr ? mb - i0 : mr;
        for (int64_t r = 0; r < mr; r++) {
            if (r < rows) {
                const float *src = a + (i0 + r) * lda;
                for (int64_t p = 0; p < kb; p++)
                    o[p * mr + r] = src[p];
            } else {
                for (int64_t p = 0; p < kb; p++)
                    o[p * mr + r] = 0.0f;
            }
        }
    }
}

/* All of A (m x k) in row groups of mr rows, each group k-major (per k its mr values), rows past
 * m zeros: once per product, by all threads, for every tile to share. */
static void pack_a_all(int nt, int mr, int64_t m, int64_t k, const float *a, int64_t lda,
                       float *out)
{
    int64_t groups = (m + mr - 1) / mr;
#pragma omp parallel for schedule(static) num_threads(nt) if (m * k > TDM_CPU_PAR_MIN)
    for (int64_t g = 0; g < groups; g++) {
        float *o = out + g * mr * k;
        int64_t rows = m - g * mr < mr ? m - g * mr : mr;
        for (int64_t p0 = 0; p0 < k; p0 += 64) { /* 64 k at a time: mr source lines in L1 */
            int64_t pe = p0 + 64 < k ? p0 + 64 : k;
            for (int64_t p = p0; p < pe; p++)
                for (int r = 0; r < mr; r++)
                    o[p * mr + r] = r < rows ? a[(g * mr + r) * lda + p] : 0.0f;
        }
    }
}

/* ---- the driver ---- */

/* The thread's packed blocks: A, TILE_M_MAX x KC floats (512 KiB), and one K block of one B
 * panel, KC x 32 (32 KiB): allocated on a thread's first use and freed when it ends (inside
 * TDM_CPU_PROCESS_MIB at 16 threads: 9 MiB). Heap memory, not thread-local arrays: 544 KiB of
 * static TLS crashed OpenMP's worker threads (their thread pointer read 0 under gdb, in
 * integration.finetune_stop). */
#define TILE_M_MAX 512
/* rows of the A block: TILE_M_MAX rounded up to whole groups of the tallest MR (12). Without the
 * rounding a tile of 512 rows in groups of 6 wrote its last group past the block into B's, and
 * the cross-entropy's rows 510 and 511 of a chunk came out other bits than alone
 * (unit.cpu_panel_gemm, test_backend_rows_alone). */
#define APACK_ROWS ((TILE_M_MAX + 11) / 12 * 12)
/* Each thread's blocks hang off a pthread key whose destructor frees them when the thread ends
 * (OpenMP's pool shrinks when a backend with fewer threads runs). */
static pthread_key_t blocks_key;
static pthread_once_t blocks_once = PTHREAD_ONCE_INIT;
static bool blocks_key_ok;

static void blocks_key_create(void)
{
    blocks_key_ok = pthread_key_create(&blocks_key, free) == 0;
}

static float *blocks(void)
{
    pthread_once(&blocks_once, blocks_key_create);
    if (!blocks_key_ok) return NULL;
    float *p = pthread_getspecific(blocks_key);
    if (!p) {
        p = aligned_alloc(64, (size_t)(APACK_ROWS * KC + KC * 32) * sizeof(float));
        if (p && pthread_setspecific(blocks_key, p) != 0) free(p), p = NULL;
    }
    return p;
}

/* Where a tile's op(B) (k x n) comes from:
 *   panels   the whole product's NR-wide panels (pw wide: nr, or a multiple of it, a weight laid
 *            out for a wider kernel), read as they are;
 *   pack     else each K block of a panel is packed as it is used: from b (B^T when tb, B), or
 *            when laid_pw > 0 from rows [laid_row0, laid_row0 + k) of a weight laid out in the
 *            forward's panels of laid_pw rows (b its start, ldb its cols): B = those rows;
 *   neither  b read in place.
 * b16, when set, stands for b: the same matrix in bf16 (a weight kept as its checkpoint stores
 * it), always packed, each value widened to f32 exactly as it is packed. */
typedef struct {
    const float *b;
    const uint16_t *b16;
    int64_t ldb;
    bool tb;
    const float *panels;
    int pw;
    bool pack;
    int laid_pw;
    int64_t laid_row0;
} b_operand;

/* op(B)'s element (p, j) wherever B lies (the tile's no-memory fallback). */
static float b_at(const b_operand *B, int64_t k, int64_t p, int64_t j)
{
    if (B->panels) return B->panels[panel_offset(B->pw, k, p, j)];
    if (B->b16) return tdm_bf16_to_f32(B->tb ? B->b16[j * B->ldb + p] : B->b16[p * B->ldb + j]);
    if (B->laid_pw > 0) return B->b[panel_offset(B->laid_pw, B->ldb, j, B->laid_row0 + p)];
    return B->tb ? B->b[j * B->ldb + p] : B->b[p * B->ldb + j];
}

/* pack_b_piece of a bf16 B (widened by tdm_bf16_to_f32_n: exact).
 * op(B) = B^T (the logits' W^T): 8 of B's rows at a time widened into rows, then 8 x 8
 * transposes into the piece's columns; op(B) = B (dH's W): each of the kb rows widened in place. */
static void pack_b16_piece(float *bpack, const b_operand *B, int nr, int64_t j, int nrr, int64_t p0,
                           int64_t kb)
{
    const uint16_t *b = B->b16;
    int64_t ldb = B->ldb;
    if (!B->tb) {
        for (int64_t p = 0; p < kb; p++) {
            tdm_bf16_to_f32_n(b + (p0 + p) * ldb + j, bpack + p * nr, (size_t)nrr);
            if (nrr < nr) memset(bpack + p * nr + nrr, 0, (size_t)(nr - nrr) * sizeof(float));
        }
        return;
    }
    float rows[8 * KC]; /* 8 of B's rows, kb <= KC values each */
    for (int c0 = 0; c0 < nr; c0 += 8) {
        int nc = nrr - c0 < 8 ? nrr - c0 : 8; /* B's rows here; the rest of the 8 are zeros */
        for (int r = 0; r < 8; r++) {
            if (r < nc)
                tdm_bf16_to_f32_n(b + (j + c0 + r) * ldb + p0, rows + r * KC, (size_t)kb);
            else
                memset(rows + r * KC, 0, (size_t)kb * sizeof(float));
        }
        int64_t p = 0;
        for (; p + 8 <= kb; p += 8)
            transpose8(rows + p, KC, bpack + p * nr + c0, nr);
        for (; p < kb; p++)
            for (int r = 0; r < 8; r++)
                bpack[p * nr + c0 + r] = rows[r * KC + p];
    }
}

/* B's K block [p0, p0 + kb) of columns [j, j + nrr) into bpack, zero-padded to nr columns. */
static void pack_b_piece(float *bpack, const b_operand *B, int nr, int64_t j, int nrr, int64_t p0,
                         int64_t kb)
{
    const float *b = B->b;
    int64_t ldb = B->ldb;
    if (B->b16) {
        pack_b16_piece(bpack, B, nr, j, nrr, p0, kb);
    } else if (B->laid_pw > 0) { /* rows of a laid-out weight: column c's laid_pw rows are contiguous */
        int lp = B->laid_pw;
        int64_t r0 = B->laid_row0 + p0;
        int64_t p = 0;
        if (nrr == nr && r0 % 8 == 0)
            for (; p + 8 <= kb; p += 8)
                for (int c0 = 0; c0 < nr; c0 += 8)
                    transpose8(b + panel_offset(lp, ldb, j + c0, r0 + p), lp, bpack + p * nr + c0,
                               nr);
        for (; p < kb; p++)
            for (int jj = 0; jj < nr; jj++)
                bpack[p * nr + jj] = jj < nrr ? b[panel_offset(lp, ldb, j + jj, r0 + p)] : 0.0f;
    } else if (B->tb) {
        const float *src = b + j * ldb + p0;
        for (int64_t p = 0; p < kb; p++) {
            float *o = bpack + p * nr;
            for (int jj = 0; jj < nrr; jj++)
                o[jj] = src[jj * ldb + p];
            for (int jj = nrr; jj < nr; jj++)
                o[jj] = 0.0f;
        }
    } else {
        for (int64_t p = 0; p < kb; p++) {
            memcpy(bpack + p * nr, b + (p0 + p) * ldb + j, (size_t)nrr * sizeof(float));
            if (nrr < nr) memset(bpack + p * nr + nrr, 0, (size_t)(nr - nrr) * sizeof(float));
        }
    }
}

/* One tile of C: rows [0, mb <= TILE_M_MAX) of A and C, columns [j0, j0 + nb) of op(B) and C. A
 * is read from `a_groups` (its rows laid out by pack_a_all, the tile's first group) when given,
 * else packed here a K block at a time; B as *B says. */
static void panel_tile(panel_isa set, int64_t mb, int64_t j0, int64_t nb, int64_t k,
                       const float *a, int64_t lda, const float *a_groups, const b_operand *B,
                       float beta, float *c, int64_t ldc)
{
    int nr = panel_nr(), mr = panel_mr();
    float *apack = blocks();
    if (!apack) { /* no memory for the blocks: the same chain of FMAs, one element at a time */
        for (int64_t i = 0; i < mb; i++)
            for (int64_t j = j0; j < j0 + nb; j++) {
                float acc = beta == 1.0f ? c[i * ldc + j] : 0.0f;
                for (int64_t p = 0; p < k; p++)
                    acc = fmaf(a[i * lda + p], b_at(B, k, p, j), acc);
                c[i * ldc + j] = acc;
            }
        return;
    }
    float *bpack = apack + APACK_ROWS * KC;
    for (int64_t p0 = 0; p0 < k; p0 += KC) {
        int64_t kb = k - p0 < KC ? k - p0 : KC;
        bool load_c = p0 > 0 || beta == 1.0f;
        if (!a_groups) pack_a(mr, a + p0, lda, mb, kb, apack);
        for (int64_t j = j0; j < j0 + nb; j += nr) {
            int nrr = (int)(j0 + nb - j < nr ? j0 + nb - j : nr);
            const float *bp;
            b_access how = B_PACKED;
            int64_t bs = B->ldb;
            if (B->panels) { /* panels pw wide, pw a multiple of nr: a narrower kernel reads its
                              * columns of a panel as rows pw floats apart */
                bp = B->panels + panel_offset(B->pw, k, p0, j);
                if (B->pw != nr) how = B_ROWS, bs = B->pw;
            } else if (B->pack) {
                pack_b_piece(bpack, B, nr, j, nrr, p0, kb);
                bp = bpack;
            } else {
                bp = B->tb ? B->b + j * B->ldb + p0 : B->b + p0 * B->ldb + j;
                how = B->tb ? B_GATHER : B_ROWS;
            }
            for (int64_t i = 0; i < mb; i += mr) {
                int mrr = (int)(mb - i < mr ? mb - i : mr);
                float *cp = c + i * ldc + j;
                const float *ap = a_groups ? a_groups + i * k + p0 * mr : apack + i * kb;
                if (set == PANEL_AVX512)
                    kernel_avx512(kb, ap, bp, how, bs, cp, ldc, mrr, nrr, load_c);
                else
                    kernel_avx2(kb, ap, bp, how, bs, cp, ldc, mrr, nrr, load_c);
            }
        }
    }
}

/* The work split. The product is a grid of cells, MR rows (a group) by NR columns (a panel),
 * taken strip by strip (1 to 8 panels wide, the width that moves the fewest bytes), within a
 * strip group by group, within a group panel by panel. Each task is an equal run of that order
 * (to one cell), TASKS_PER_THREAD a thread, scheduled dynamically: tiles of 96 rows by a width
 * for ~8 a thread had 66 unequal tiles on 8 threads (1024 rows: 11 row tiles, the last of 64; 28
 * panels in pieces of 5 and 3), which a simulation of the schedule put at 0.96 of even work at 8
 * threads and 0.93 at 16. A task walks its run as rectangles (a partial group row, whole rows of
 * the strip, a partial row). Tiles never change bits here (every element is one FMA chain), so
 * the split may depend on the thread count. */
#define TASKS_PER_THREAD 4
#define STRIP_PANELS_MIN 1
#define STRIP_PANELS_MAX 8

typedef struct {
    panel_isa set;
    int mr, nr;
    int64_t m, n, k, lda, ldc;
    const float *a, *a_groups;
    b_operand B;
    float beta, *c;
    int64_t groups, panel_count; /* the grid: ceil(m / MR) x ceil(n / NR) cells */
    int64_t strip;               /* panels a strip */
} product;

/* One rectangle of cells, groups [g0, g0 + ng) by panels [p0, p0 + np), clipped to the product,
 * in pieces of at most TILE_M_MAX rows when A is packed per tile (no a_groups). */
static void product_rect(const product *p, int64_t g0, int64_t ng, int64_t p0, int64_t np)
{
    int64_t i0 = g0 * p->mr, i1 = (g0 + ng) * p->mr, j0 = p0 * p->nr, j1 = (p0 + np) * p->nr;
    if (i1 > p->m) i1 = p->m;
    if (j1 > p->n) j1 = p->n;
    int64_t step = p->a_groups ? i1 - i0 : TILE_M_MAX / p->mr * p->mr;
    for (int64_t i = i0; i < i1; i += step) {
        int64_t mb = i1 - i < step ? i1 - i : step;
        panel_tile(p->set, mb, j0, j1 - j0, p->k, p->a + i * p->lda, p->lda,
                   p->a_groups ? p->a_groups + i * p->k : NULL, &p->B, p->beta,
                   p->c + i * p->ldc, p->ldc);
    }
}

/* Cells [c0, c1) of the order above, as rectangles. */
static void product_cells(const product *p, int64_t c0, int64_t c1)
{
    int64_t per_strip = p->groups * p->strip; /* cells of a full strip */
    while (c0 < c1) {
        int64_t s = c0 / per_strip, first = s * p->strip;
        int64_t w = p->panel_count - first < p->strip ? p->panel_count - first : p->strip;
        int64_t in = c0 - s * per_strip, row = in / w, q = in % w;
        int64_t left = c1 - c0;
        if (q > 0 || left < w) { /* part of one group's row */
            int64_t np = w - q < left ? w - q : left;
            product_rect(p, row, 1, first + q, np);
            c0 += np;
        } else { /* whole rows of this strip */
            int64_t rows = left / w;
            if (rows > p->groups - row) rows = p->groups - row;
            product_rect(p, row, rows, first, w);
            c0 += rows * w;
        }
    }
}

/* B (op(B) k x n) into NR-wide panels for one product: from the forward's panels of a weight
 * laid out at load (b_pw > 0), from B^T (n x k, tb) or from B (k x n). */
static void lay_out_b(int nt, int nr, bool tb, int64_t n, int64_t k, const float *b, int64_t ldb,
                      int b_pw, float *out)
{
    if (b_pw > 0)
        pack_b_from_panels(nt, nr, n, k, b, b_pw, out);
    else if (tb)
        pack_bt(nt, nr, n, k, b, ldb, out);
    else
        pack_b(nt, nr, n, k, b, ldb, out);
}

/* MEASUREMENT AID (TANDEM_CPU_PANEL_CACHE=1, issue 20): a frozen f32 weight's panels kept after
 * its first product, keyed by its address and shape, so later products skip the layout pass;
 * dropped when the backend frees the weight (cpu_panel_cache_forget). Costs each weight's size
 * again per direction (counted in the backend's used / peak, not in the memory plan): it exists
 * to measure what laying W out per product costs on a many-core host (docs/benchmarks.md,
 * "Pairs"), not for use. */
typedef struct {
    cpu_backend *owner;
    const float *b;
    bool tb;
    int64_t n, k, ldb;
    float *panels;
    uint64_t bytes;
} panel_cache_entry;
#define PANEL_CACHE_MAX 1024
static panel_cache_entry panel_cache[PANEL_CACHE_MAX];
static int panel_cache_n = -1; /* -1: the environment not read yet; -2: off */

static float *panel_cache_get(cpu_backend *cpu, int nr, bool tb, int64_t n, int64_t k,
                              const float *b, int64_t ldb, int b_pw, uint64_t bytes)
{
    if (panel_cache_n == -1) {
        const char *v = getenv("TANDEM_CPU_PANEL_CACHE");
        panel_cache_n = v && strcmp(v, "1") == 0 ? 0 : -2;
    }
    if (panel_cache_n < 0) return NULL;
    for (int i = 0; i < panel_cache_n; i++)
        if (panel_cache[i].b == b && panel_cache[i].tb == tb && panel_cache[i].n == n &&
            panel_cache[i].k == k && panel_cache[i].ldb == ldb)
            return panel_cache[i].panels;
    if (panel_cache_n == PANEL_CACHE_MAX) return NULL;
    float *p = aligned_alloc(64, (size_t)(bytes + 63) / 64 * 64);
    if (!p) return NULL;
    lay_out_b(cpu->n_threads, nr, tb, n, k, b, ldb, b_pw, p);
    panel_cache[panel_cache_n++] = (panel_cache_entry){
        .owner = cpu, .b = b, .tb = tb, .n = n, .k = k, .ldb = ldb, .panels = p, .bytes = bytes};
    cpu->used += bytes;
    if (cpu->used > cpu->peak) cpu->peak = cpu->used;
    return p;
}

void cpu_panel_cache_forget(cpu_backend *cpu, const void *p, size_t bytes)
{
    for (int i = 0; i < panel_cache_n;) {
        const char *b = (const char *)panel_cache[i].b;
        if (panel_cache[i].owner == cpu && b >= (const char *)p && b < (const char *)p + bytes) {
            free(panel_cache[i].panels);
            cpu->used -= panel_cache[i].bytes;
            panel_cache[i] = panel_cache[--panel_cache_n];
        } else {
            i++;
        }
    }
}

/* b_pw > 0: B is a weight laid out in the forward's panels of b_pw rows (cpu_panel_lay_out):
 * the forward (tb) reads them as they are, the backward lays them out again for itself. */
static bool panel_gemm(cpu_backend *cpu, bool frozen, bool tb, int64_t m, int64_t n, int64_t k,
                       const float *a, int64_t lda, const float *b, int64_t ldb, int b_pw,
                       float beta, float *c, int64_t ldc)
{
    panel_isa set = isa();
    /* TANDEM_CPU_GEMM=blas asks for OpenBLAS's threaded calls everywhere */
    if (set == PANEL_NONE || cpu->blas_threaded || (beta != 0.0f && beta != 1.0f)) return false;
    int nt = cpu->n_threads, nr = panel_nr(), mr = panel_mr();
    /* a layout for a narrower kernel (a weight laid out before the ISA was switched) */
    if (b_pw > 0 && tb && b_pw % nr != 0) return false;
    if (m == 0 || n == 0) return true;
    /* B in panels when the rows repay the pass over it and the panels stay small, else read in
     * place (decoding a few rows; the lm_head when generating): the same bits either way */
    uint64_t bytes = tdm_cpu_panel_bytes(n, k), a_bytes = tdm_cpu_panel_a_bytes(m, k);
    if (b_pw > 0 && !tb && bytes == 0) return false; /* never laid out so (cpu_panel_lay_out) */
    /* B's panels: the weight's own (a forward of a weight laid out at load), the measurement
     * aid's, or laid out into the scratch here (b_here bytes); none: B read in place */
    const float *panels = NULL;
    int pw = nr;
    uint64_t b_here = 0;
    if (b_pw > 0 && tb) {
        panels = b, pw = b_pw;
    } else if ((m >= TDM_CPU_PANEL_MIN_ROWS || b_pw > 0) && bytes > 0) {
        panels = frozen ? panel_cache_get(cpu, nr, tb, n, k, b, ldb, b_pw, bytes) : NULL;
        if (!panels) b_here = bytes;
    }
    /* A in row groups once, not once per tile and K block (a tile of 160 columns, 16 threads,
     * 896 wide, packed one element of A per 160 multiply-adds), after B's panels if any */
    uint64_t a_here = panels || b_here ? a_bytes : 0;
    float *scratch = NULL, *a_groups = NULL;
    if (b_here + a_here > 0) {
        scratch = cpu_scratch(cpu, CPU_SCRATCH_PANELS, (size_t)(b_here + a_here));
        if (!scratch && b_here > 0) return false;
        if (!scratch) a_here = 0; /* A packed per tile: a laid-out forward never fails */
    }
    if (b_here > 0) {
        lay_out_b(nt, nr, tb, n, k, b, ldb, b_pw, scratch);
        panels = scratch;
    }
    if (a_here > 0) {
        a_groups = scratch + b_here / sizeof(float);
        pack_a_all(nt, mr, m, k, a, lda, a_groups);
    }
    if (k == 0) { /* C = beta C: nothing to multiply */
        if (beta == 0.0f)
            for (int64_t i = 0; i < m; i++)
                memset(c + i * ldc, 0, (size_t)n * sizeof(float));
        return true;
    }
    product p = {.set = set, .mr = mr, .nr = nr, .m = m, .n = n, .k = k, .lda = lda,
                 .ldc = ldc, .a = a, .a_groups = a_groups,
                 .B = {.b = b, .ldb = ldb, .tb = tb, .panels = panels, .pw = pw},
                 .beta = beta, .c = c, .groups = (m + mr - 1) / mr,
                 .panel_count = (n + nr - 1) / nr};
    int64_t cells = p.groups * p.panel_count;
    int64_t tasks = nt > 1 ? (int64_t)nt * TASKS_PER_THREAD : 1;
    if (tasks > cells) tasks = cells;
    /* The strip width that moves the fewest bytes: over a product, A's rows are read once per
     * strip (G MR k floats, P / s times) and B's panels once per rectangle's rows (P NR k
     * floats, G / r times); a task's rectangles hold area = r s cells, so the sum, G P k (MR / s
     * + NR s / area), is least at s = sqrt(MR area / NR). A fixed 24 groups tall cut the 8 and
     * 16-thread products of K 4864 into strips of 2 panels, reading A 14 times. */
    int64_t area = cells / tasks;
    p.strip = (int64_t)(sqrt((double)mr * (double)area / (double)nr) + 0.5);
    if (p.strip < STRIP_PANELS_MIN) p.strip = STRIP_PANELS_MIN;
    if (p.strip > STRIP_PANELS_MAX) p.strip = STRIP_PANELS_MAX;
    if (p.strip > p.panel_count) p.strip = p.panel_count;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)                                      \
    if (tasks > 1 && m * n * k > 64 * TDM_CPU_PAR_MIN)
    for (int64_t t = 0; t < tasks; t++)
        product_cells(&p, cells * t / tasks, cells * (t + 1) / tasks);
    return true;
}

bool cpu_panel_gemm(cpu_backend *cpu, bool tb, int64_t m, int64_t n, int64_t k, const float *a,
                    int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    return panel_gemm(cpu, false, tb, m, n, k, a, lda, b, ldb, 0, beta, c, ldc);
}

bool cpu_panel_reads_laid_out(const cpu_backend *cpu, const tdm_be_weight *w)
{
    return w->format == TDM_BE_W_F32_PANELS && isa() != PANEL_NONE && !cpu->blas_threaded &&
           w->panel % panel_nr() == 0;
}

bool cpu_panel_gemm_weight(cpu_backend *cpu, bool fwd, const tdm_be_weight *w, const float *a,
                           int64_t m, float beta, float *c)
{
    int b_pw = w->format == TDM_BE_W_F32_PANELS ? w->panel : 0;
    if (fwd) /* Y (m x rows) = X (m x cols) W^T */
        return panel_gemm(cpu, true, true, m, w->rows, w->cols, a, w->cols, w->data, w->cols,
                          b_pw, beta, c, w->rows);
    /* dX (m x cols) = dY (m x rows) W */
    return panel_gemm(cpu, true, false, m, w->cols, w->rows, a, w->rows, w->data, w->cols, b_pw,
                      beta, c, w->cols);
}

bool cpu_panel_lay_out(cpu_backend *cpu, int64_t rows, int64_t cols, float *w,
                       bool backward_panels, int32_t *pw)
{
    if (isa() == PANEL_NONE || cpu->blas_threaded || rows <= 0 || cols <= 0) return false;
    int nr = panel_nr(), nt = cpu->n_threads;
    /* exactly the weight's own bytes (no padding); for a projection also panels its backward
     * can lay out (the scratch's cap) */
    if (rows % nr != 0) return false;
    if (backward_panels &&
        (tdm_cpu_panel_bytes(rows, cols) == 0 || tdm_cpu_panel_bytes(cols, rows) == 0))
        return false;
    /* Panel p takes exactly the bytes of rows [p nr, p nr + nr): each is transposed where it
     * lies, through a copy of its rows (nr x cols floats a thread, taken before anything is
     * touched: W is never left half laid out). The whole weight copied once was a transient
     * of its size at load: 545 MB for Qwen2.5's 152K x 896 lm_head. */
    float *bufs = malloc((size_t)nt * (size_t)(nr * cols) * sizeof(float));
    if (!bufs) return false;
    int64_t panels = rows / nr;
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * cols > TDM_CPU_PAR_MIN)
    for (int64_t q = 0; q < panels; q++) {
        float *buf = bufs + (size_t)omp_get_thread_num() * (size_t)(nr * cols);
        float *panel = w + q * nr * cols;
        memcpy(buf, panel, (size_t)(nr * cols) * sizeof(float));
        transpose_rows(buf, cols, nr, cols, panel, nr);
    }
    free(bufs);
    *pw = nr;
    return true;
}

/* An NF4 block's worth of columns (64) at a time: the rows of a forward panel are dequantized
 * into a stack block of NR x 64 (8 KiB) and written out by 8 x 8 transposes, each column's NR
 * values contiguous (pack_bt's reason). */
#define NF4_COLS 64

bool cpu_nf4_tile_panels(cpu_backend *cpu, const tdm_be_weight *w, int64_t r0, int64_t r1,
                         bool fwd, float *out)
{
    if (isa() == PANEL_NONE || cpu->blas_threaded) return false;
    int nr = panel_nr(), nt = cpu->n_threads;
    int64_t cols = w->cols, rows = r1 - r0;
    if (fwd) { /* panel q: tile rows [q nr, q nr + nr), per column their nr values */
        /* tasks: a panel's 64 columns, not a whole panel: k_proj's 128 rows are 4 panels, which
         * kept 4 of 16 threads busy (the qlora forward 0.19 s a step over lora's at 16 threads,
         * 2026-12-07) */
        int64_t panels = (rows + nr - 1) / nr, blocks = (cols + NF4_COLS - 1) / NF4_COLS;
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * cols > TDM_CPU_PAR_MIN)
        for (int64_t t = 0; t < panels * blocks; t++) {
            float blk[32 * NF4_COLS] __attribute__((aligned(64)));
            int64_t q = t / blocks, c0 = (t % blocks) * NF4_COLS;
            float *o = out + q * nr * cols;
            int live = (int)(rows - q * nr < nr ? rows - q * nr : nr);
            int cw = (int)(cols - c0 < NF4_COLS ? cols - c0 : NF4_COLS);
            for (int r = 0; r < nr; r++) {
                float *row = blk + r * NF4_COLS;
                if (r < live) {
                    int64_t e = (r0 + q * nr + r) * cols + c0;
                    cpu_nf4_range(cpu, w, e, e + cw, row);
                } else {
                    memset(row, 0, (size_t)cw * sizeof(float));
                }
            }
            transpose_rows(blk, NF4_COLS, nr, cw, o + c0 * nr, nr);
        }
        return true;
    }
    /* the backward's: panel q holds columns [q nr, q nr + nr), per tile row their nr values:
     * each row dequantized 64 columns at a time and copied out in pieces of its panels */
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * cols > TDM_CPU_PAR_MIN)
    for (int64_t p = 0; p < rows; p++) {
        float blk[NF4_COLS] __attribute__((aligned(64)));
        for (int64_t c0 = 0; c0 < cols; c0 += NF4_COLS) {
            int cw = (int)(cols - c0 < NF4_COLS ? cols - c0 : NF4_COLS);
            int64_t e = (r0 + p) * cols + c0;
            cpu_nf4_range(cpu, w, e, e + cw, blk);
            for (int cc = 0; cc < cw;) {
                int64_t j = c0 + cc;
                int within = (int)(j % nr), len = nr - within < cw - cc ? nr - within : cw - cc;
                memcpy(out + panel_offset(nr, rows, p, j), blk + cc, (size_t)len * sizeof(float));
                cc += len;
            }
        }
        if (cols % nr) /* the last panel's columns past cols */
            memset(out + panel_offset(nr, rows, p, cols), 0,
                   (size_t)(nr - cols % nr) * sizeof(float));
    }
    return true;
}

bool cpu_panel_gemm_panels(cpu_backend *cpu, int64_t m, int64_t n, int64_t k, const float *a,
                           int64_t lda, const float *panels, float beta, float *c, int64_t ldc)
{
    /* panels of op(B) read as they are: the path of a forward product of a laid-out weight,
     * whose panels are op(B)'s too */
    return panel_gemm(cpu, false, true, m, n, k, a, lda, panels, k, panel_nr(), beta, c, ldc);
}

void cpu_panel_rows(const float *w, int pw, int64_t cols, int64_t r0, int64_t r1, float *out)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *src = w + panel_offset(pw, cols, 0, r);
        float *o = out + (r - r0) * cols;
        for (int64_t c = 0; c < cols; c++)
            o[c] = src[c * pw];
    }
}

/* cpu_panel_gemm_1t's body, B as *B says (packed a K block of a panel at a time). */
static bool panel_gemm_1t(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                          const b_operand *B, float beta, float *c, int64_t ldc)
{
    panel_isa set = isa();
    if (set == PANEL_NONE || (beta != 0.0f && beta != 1.0f)) return false;
    if (k == 0) {
        if (beta == 0.0f)
            for (int64_t i = 0; i < m; i++)
                memset(c + i * ldc, 0, (size_t)n * sizeof(float));
        return true;
    }
    /* row blocks as tall as the A buffer: each K block of each B panel is packed once a block */
    for (int64_t i0 = 0; i0 < m; i0 += TILE_M_MAX)
        panel_tile(set, m - i0 < TILE_M_MAX ? m - i0 : TILE_M_MAX, 0, n, k, a + i0 * lda, lda,
                   NULL, B, beta, c + i0 * ldc, ldc);
    return true;
}

bool cpu_panel_gemm_1t(bool tb, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                       const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    b_operand B = {.b = b, .ldb = ldb, .tb = tb, .pack = true};
    return panel_gemm_1t(m, n, k, a, lda, &B, beta, c, ldc);
}

bool cpu_panel_gemm_1t_bf16(bool tb, int64_t m, int64_t n, int64_t k, const float *a,
                            int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c,
                            int64_t ldc)
{
    b_operand B = {.b16 = b, .ldb = ldb, .tb = tb, .pack = true};
    return panel_gemm_1t(m, n, k, a, lda, &B, beta, c, ldc);
}

bool cpu_panel_gemm_wt_tiles(const cpu_backend *cpu, int64_t m, int64_t n, int64_t k,
                             const float *a, const float *b, const uint16_t *b16, float beta,
                             float *c)
{
    if (isa() == PANEL_NONE || cpu->blas_threaded || (beta != 0.0f && beta != 1.0f)) return false;
    int64_t tm = (m + CPU_WT_TILE_M - 1) / CPU_WT_TILE_M, tn = (n + CPU_WT_TILE_N - 1) / CPU_WT_TILE_N;
#pragma omp parallel for schedule(dynamic, 1) num_threads(cpu->n_threads) if (tm * tn > 1)
    for (int64_t t = 0; t < tm * tn; t++) {
        int64_t i0 = (t / tn) * CPU_WT_TILE_M, j0 = (t % tn) * CPU_WT_TILE_N;
        int64_t mb = m - i0 < CPU_WT_TILE_M ? m - i0 : CPU_WT_TILE_M;
        int64_t nb = n - j0 < CPU_WT_TILE_N ? n - j0 : CPU_WT_TILE_N;
        b_operand B = {.b = b ? b + j0 * k : NULL, .b16 = b16 ? b16 + j0 * k : NULL, .ldb = k,
                       .tb = true, .pack = true};
        panel_gemm_1t(mb, nb, k, a + i0 * k, k, &B, beta, c + i0 * n + j0, n);
    }
    return true;
}

bool cpu_panel_gemm_bf16_weight(const cpu_backend *cpu, const tdm_be_weight *w, const float *a,
                                int64_t m, float beta, float *c)
{
    return w->format == TDM_BE_W_BF16 &&
           cpu_panel_gemm_wt_tiles(cpu, m, w->rows, w->cols, a, NULL, w->data, beta, c);
}

bool cpu_panel_gemm_1t_rows(int64_t m, int64_t k, const float *a, int64_t lda,
                            const tdm_be_weight *w, int64_t row0, float beta, float *c,
                            int64_t ldc)
{
    if (w->format == TDM_BE_W_BF16)
        return cpu_panel_gemm_1t_bf16(false, m, w->cols, k, a, lda,
                                      (const uint16_t *)w->data + row0 * w->cols, w->cols, beta,
                                      c, ldc);
    if (w->format != TDM_BE_W_F32_PANELS) /* row-major: B = W's rows in place */
        return cpu_panel_gemm_1t(false, m, w->cols, k, a, lda,
                                 (const float *)w->data + row0 * w->cols, w->cols, beta, c, ldc);
    b_operand B = {.b = w->data, .ldb = w->cols, .pack = true, .laid_pw = w->panel,
                   .laid_row0 = row0};
    return panel_gemm_1t(m, w->cols, k, a, lda, &B, beta, c, ldc);
}
