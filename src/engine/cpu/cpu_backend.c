/* cpu_backend.c — the CPU backend: memory, elementwise ops, GEMM and frozen linear layers.
 * Layer ops are in cpu_layers.c, loss / LoRA / optimizer in cpu_train.c. */
#include <cblas.h>
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engine/cpu/blas_core.h"
#include "engine/cpu/cpu_internal.h"
#include "model/nf4.h"
#include "util/half.h"

/* Each allocation carries a 64-byte header (its size and the links of the backend's list of live
 * allocations, so destroy frees what is left), and the pointer handed out stays 64-byte aligned. */
#define HDR 64

typedef struct alloc_hdr {
    size_t bytes;
    struct alloc_hdr *prev, *next;
} alloc_hdr;

/* Buffers of at least HUGE_PAGE bytes start on a 2 MiB boundary and are marked for transparent
 * huge pages (MADV_HUGEPAGE; Debian's default THP mode, "madvise", gives them to no one else):
 * a 0.5B model's weights, activations and scratch fault in 2 MiB at a time instead of 4 KiB
 * (a 0.5B lora run on the 2-core VM: 1.12 M faults -> 0.20 M, load 3.2x faster, each fault a
 * trap to the hypervisor there; docs/benchmarks.md). Where THP is off the advice is ignored:
 * the same memory, 4 KiB pages. */
#define HUGE_PAGE ((size_t)2 << 20)

void *cpu_big_alloc(size_t align, size_t bytes)
{
    bool huge = bytes >= HUGE_PAGE;
    void *p = NULL;
    if (posix_memalign(&p, huge ? HUGE_PAGE : align, bytes) != 0) return NULL;
    /* only the whole huge pages inside the buffer: its tail stays in 4 KiB pages, so the
     * resident size is the buffer's (a tail rounded up to 2 MiB was +304 MiB, +8 %, resident
     * for a 0.5B lora run on 2026-12-07: ~250 buffers of at least 2 MiB) */
    if (huge) (void)madvise(p, bytes / HUGE_PAGE * HUGE_PAGE, MADV_HUGEPAGE); /* advice only */
    return p;
}

static tdm_status cpu_alloc(tdm_backend *be, size_t bytes, void **out, tdm_error *err)
{
    cpu_backend *cpu = cpu_of(be);
    size_t total = HDR + ((bytes + HDR - 1) / HDR) * HDR;
    if (total < bytes) return tdm_fail(err, TDM_ERR_NOMEM, "alloc: size overflow");
    char *p = cpu_big_alloc(HDR, total);
    if (!p) return tdm_fail(err, TDM_ERR_NOMEM, "alloc: out of host memory (%zu bytes)", bytes);
    memset(p + HDR, 0, total - HDR);
    alloc_hdr *h = (alloc_hdr *)p;
    h->bytes = bytes;
    h->prev = NULL;
    h->next = cpu->allocs;
    if (cpu->allocs) cpu->allocs->prev = h;
    cpu->allocs = h;
    cpu->used += bytes;
    if (cpu->used > cpu->peak) cpu->peak = cpu->used;
    *out = p + HDR;
    return TDM_OK;
}

static void cpu_free(tdm_backend *be, void *ptr)
{
    cpu_backend *cpu = cpu_of(be);
    alloc_hdr *h = (alloc_hdr *)((char *)ptr - HDR);
    if (h->prev)
        h->prev->next = h->next;
    else
        cpu->allocs = h->next;
    if (h->next) h->next->prev = h->prev;
    cpu->used -= h->bytes;
    cpu_panel_cache_forget(cpu, ptr, h->bytes);
    free(h);
}

static void cpu_destroy(tdm_backend *be)
{
    cpu_backend *cpu = cpu_of(be);
    while (cpu->allocs)
        cpu_free(be, (char *)cpu->allocs + HDR);
    for (int i = 0; i < CPU_SCRATCH_N; i++)
        free(cpu->scratch[i].p);
    free(cpu);
}

static tdm_status cpu_upload(tdm_backend *be, void *dst, const void *src, size_t bytes,
                             tdm_error *err)
{
    memcpy(dst, src, bytes);
    return TDM_OK;
}

static tdm_status cpu_upload_f32(tdm_backend *be, void *dst, tdm_be_dtype dtype, const float *src,
                                 int64_t n, tdm_error *err)
{
    if (dtype == TDM_BE_F32)
        memcpy(dst, src, (size_t)n * sizeof(float));
    else
        tdm_f32_to_bf16_n(src, dst, (size_t)n);
    return TDM_OK;
}

static tdm_status cpu_download_f32(tdm_backend *be, float *dst, const void *src, tdm_be_dtype dtype,
                                   int64_t n, tdm_error *err)
{
    if (dtype == TDM_BE_F32)
        memcpy(dst, src, (size_t)n * sizeof(float));
    else
        tdm_bf16_to_f32_n(src, dst, (size_t)n);
    return TDM_OK;
}

static tdm_status cpu_memory(tdm_backend *be, tdm_be_mem_info *info, tdm_error *err)
{
    cpu_backend *cpu = cpu_of(be);
    info->used_bytes = cpu->used;
    info->peak_bytes = cpu->peak;
    long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES);
    long page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) info->total_bytes = (uint64_t)pages * (uint64_t)page;
    if (avail > 0 && page > 0) info->free_bytes = (uint64_t)avail * (uint64_t)page;
    return TDM_OK;
}

static void cpu_reset_peak(tdm_backend *be)
{
    cpu_backend *cpu = cpu_of(be);
    cpu->peak = cpu->used;
}

static tdm_status cpu_synchronize(tdm_backend *be, tdm_error *err)
{
    return TDM_OK;
}

/* ---- elementwise ---- */

static tdm_status cpu_fill(tdm_backend *be, void *x, tdm_be_dtype dtype, int64_t n, float value,
                           tdm_error *err)
{
    int nt = cpu_of(be)->n_threads;
    switch (dtype) {
    case TDM_BE_F32: {
        float *f = x;
#pragma omp parallel for schedule(static) num_threads(nt) if (n > TDM_CPU_PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            f[i] = value;
        break;
    }
    case TDM_BE_BF16: {
        uint16_t h = tdm_f32_to_bf16(value), *p = x;
        for (int64_t i = 0; i < n; i++)
            p[i] = h;
        break;
    }
    case TDM_BE_I32: {
        int32_t v = (int32_t)value, *p = x;
        for (int64_t i = 0; i < n; i++)
            p[i] = v;
        break;
    }
    case TDM_BE_U8:
        memset(x, (int)(uint8_t)value, (size_t)n);
        break;
    }
    return TDM_OK;
}

static tdm_status cpu_axpy(tdm_backend *be, void *y, const void *x, tdm_be_dtype dtype, int64_t n,
                           float alpha, tdm_error *err)
{
    int nt = cpu_of(be)->n_threads;
    if (dtype == TDM_BE_F32) {
        float *fy = y;
        const float *fx = x;
#pragma omp parallel for schedule(static) num_threads(nt) if (n > TDM_CPU_PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            fy[i] += alpha * fx[i];
    } else {
        uint16_t *hy = y;
        const uint16_t *hx = x;
        for (int64_t i = 0; i < n; i++)
            hy[i] = tdm_f32_to_bf16(tdm_bf16_to_f32(hy[i]) + alpha * tdm_bf16_to_f32(hx[i]));
    }
    return TDM_OK;
}

static tdm_status cpu_scale(tdm_backend *be, void *x, tdm_be_dtype dtype, int64_t n, float alpha,
                            tdm_error *err)
{
    int nt = cpu_of(be)->n_threads;
    if (dtype == TDM_BE_F32) {
        float *f = x;
#pragma omp parallel for schedule(static) num_threads(nt) if (n > TDM_CPU_PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            f[i] *= alpha;
    } else {
        uint16_t *h = x;
        for (int64_t i = 0; i < n; i++)
            h[i] = tdm_f32_to_bf16(tdm_bf16_to_f32(h[i]) * alpha);
    }
    return TDM_OK;
}

static tdm_status cpu_add_bias(tdm_backend *be, void *y, const float *bias, int64_t rows,
                               int64_t cols, tdm_error *err)
{
    int nt = cpu_of(be)->n_threads;
    float *f = y;
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * cols > TDM_CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            f[r * cols + c] += bias[c];
    return TDM_OK;
}

/* ---- GEMM ----
 *
 * Every product must give the same bits whatever the thread count, and an element of C the same
 * bits whatever the rows and columns around it (rows are tokens: an adapter co-trained beside
 * others must get the bits it gets alone; columns: a tile is a sub-block). OpenBLAS (0.3.21,
 * measured with tests/unit/test_backend_ops.c over random shapes) keeps both within one K block
 * of its regular kernels, where an element is fma(alpha, sum, beta C) with the sum over k in a
 * fixed order. It breaks them in two ways, which cpu_blas_sgemm steers around:
 *  - K longer than its block GEMM_Q (448 on SkylakeX) is cut in blocks, and its single-threaded
 *    and threaded drivers cut the last two blocks differently (1 and 2 threads differ); so K is
 *    cut here, in blocks of BLAS_KB (under GEMM_Q on every x86 kernel), one call each, the
 *    blocks after the first adding into C (beta 1): one K block per call in both drivers;
 *  - a call of m n k <= 10^6 takes its "small matrix" kernels, which sum in another order for
 *    some shapes (on SkylakeX: op(A) not transposed, n not a multiple of 16): a row in a product
 *    of few rows would differ from the same row in a large product. Such a call is made with A
 *    transposed into a scratch copy (the small kernels of that form sum like the regular ones),
 *    alpha 1 and beta 0 into a scratch C, and C = fma(alpha, scratch, beta C) here: the regular
 *    kernels' result. The copies are m k + m n floats, at most the call's own multiply-adds.
 * By default cpu_sgemm cuts C into tiles that OpenMP threads share, OpenBLAS single-threaded on
 * each (gemm_mode below says why). With TANDEM_CPU_GEMM=blas and the OpenMP build of OpenBLAS
 * (its threads are OpenMP's one pool) a product is instead one threaded call per K block from
 * the backend's serial code; called inside one of our parallel regions it runs single-threaded.
 * A tile is a sub-block, so both ways give the same bits. */
#define BLAS_SMALL_MNK 1e6
#define BLAS_KB 256
#define BLAS_MNK_PER_THREAD 4194304.0

static void blas_call(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                      const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                      float *c, int64_t ldc)
{
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (blasint)m, (blasint)n, (blasint)k, alpha, a, (blasint)lda, b, (blasint)ldb, beta,
                c, (blasint)ldc);
}

/* One K block (k <= BLAS_KB) with the regular kernels' bits (see above). Returns false when a
 * small call's scratch cannot be allocated: the call is then made as it is (right, only
 * possibly other bits). */
static bool blas_block(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                       float *c, int64_t ldc)
{
    if ((double)m * (double)n * (double)k > BLAS_SMALL_MNK) {
        blas_call(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return true;
    }
    /* calloc, not malloc: GCC 12 at -O3 (-Wmaybe-uninitialized) cannot see that the copy below
     * fills all of `at` before cblas_sgemm reads it through a const pointer; the zeroing is m k
     * floats, a small call's own size */
    float *at = ta ? NULL : calloc((size_t)(m * k), sizeof(float));
    float *t = malloc((size_t)(m * n) * sizeof(float));
    if ((!ta && !at) || !t) {
        free(at), free(t);
        blas_call(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return false;
    }
    if (!ta) /* op(A) = A (m, k) into A^T (k, m) */
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < k; j++)
                at[j * m + i] = a[i * lda + j];
    blas_call(true, tb, m, n, k, 1.0f, ta ? a : at, ta ? lda : m, b, ldb, 0.0f, t, n);
    /* C = fma(alpha, T, beta C). With alpha 1 and beta 0 or 1 (a product's first K block and the
     * ones after it: the common calls) that is exactly T + 0 (-0 becomes +0, as in the fma) or
     * T + C; written so, the loops vectorize instead of calling fmaf per element (a libm call on
     * the baseline x86-64 ISA) */
    for (int64_t i = 0; i < m; i++) {
        float *ci = c + i * ldc;
        const float *ti = t + i * n;
        if (alpha == 1.0f && beta == 0.0f)
            for (int64_t j = 0; j < n; j++)
                ci[j] = ti[j] + 0.0f;
        else if (alpha == 1.0f && beta == 1.0f)
            for (int64_t j = 0; j < n; j++)
                ci[j] = ti[j] + ci[j];
        else
            for (int64_t j = 0; j < n; j++)
                ci[j] = fmaf(alpha, ti[j], beta == 0.0f ? 0.0f : beta * ci[j]);
    }
    free(at), free(t);
    return true;
}

void cpu_blas_sgemm(int nt, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                    const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                    int64_t ldc)
{
    if (m == 0 || n == 0) return;
    if (k == 0) {
        /* BLAS would scale C by beta; beta == 0 must not read C (it may hold NaN). */
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++)
                c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
        return;
    }
    /* OpenBLAS's OpenMP build takes its thread count from the ICV (and 1 inside a parallel
     * region); the pthread and serial builds were set to 1 thread at backend creation. A thread
     * gets at least BLAS_MNK_PER_THREAD (2^22, ~0.1 ms) multiply-adds of a K block: OpenBLAS
     * threads from 2^18, where its threads wait on each other more than they work (on 2 loaded
     * cores, the tiny-model tests ran 1.5x longer). The count never changes the bits. */
    double per_block = (double)m * (double)n * (double)(k < BLAS_KB ? k : BLAS_KB);
    if (per_block < BLAS_MNK_PER_THREAD * nt) {
        int fit = (int)(per_block / BLAS_MNK_PER_THREAD);
        nt = fit < 1 ? 1 : fit;
    }
    int prev = omp_in_parallel() ? nt : omp_get_max_threads();
    if (prev != nt) omp_set_num_threads(nt);
    for (int64_t k0 = 0; k0 < k; k0 += BLAS_KB) {
        int64_t kb = k - k0 < BLAS_KB ? k - k0 : BLAS_KB;
        blas_block(ta, tb, m, n, kb, alpha, ta ? a + k0 * lda : a + k0, lda,
                   tb ? b + k0 : b + k0 * ldb, ldb, k0 == 0 ? beta : 1.0f, c, ldc);
    }
    if (prev != nt) omp_set_num_threads(prev);
}

void cpu_blas_sgemm_1t(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                       float *c, int64_t ldc)
{
    if (m == 0 || n == 0) return;
    if (k == 0) {
        cpu_blas_sgemm(1, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    /* the OpenMP build runs one thread inside a parallel region; outside, its count is the ICV */
    int prev = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (prev != 1) omp_set_num_threads(1);
    blas_call(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    if (prev != 1) omp_set_num_threads(prev);
}

bool cpu_blas_bits_measured(void)
{
    /* the cores whose kernels unit.cpu_gemm has measured (its VMs' SkylakeX; Cooperlake by
     * OPENBLAS_CORETYPE). Haswell and Zen (AMD hosts, AVX2-only Intel) differ 1 vs 3 threads. */
    static const char *const measured[] = {"skylakex", "cooperlake", "sapphirerapids"};
    const char *core = openblas_get_corename();
    for (size_t i = 0; core && i < sizeof measured / sizeof *measured; i++)
        if (strcasecmp(core, measured[i]) == 0) return true;
    return false;
}

bool cpu_blas_threaded(void)
{
    return openblas_get_parallel() == 2; /* 0 serial, 1 pthread, 2 OpenMP build */
}

/* Tiles for a BLAS that is not OpenMP's: GEMM_TILE_M rows (fixed: a function of n alone, not of
 * the rows) by a width that cuts n in a multiple of GEMM_COL_TILES_MIN column tiles of at most
 * GEMM_TILE_N (a multiple of 16, not under 64). A multiple, so that a product of a multiple of
 * 4 x 128 rows (B4 x 256 tokens: 8 row tiles) gives every one of 2, 4, 8 or 16 threads the same
 * count of tiles: n = 4864 (Qwen2.5-0.5B's MLP) took 5 columns of 1024 before, 40 tiles, 3
 * rounds of 16 threads with the last half idle; now 8 of 608, 64 tiles, 4 rounds of tiles 0.6x
 * the size. Each tile re-packs its block of A and of B.
 * TANDEM_CPU_TILE_ROWS=N (a multiple of 16, 16 to 4096) replaces GEMM_TILE_M: a benchmark's knob
 * (the height trades re-packing B per row tile against tiles to share; docs/benchmarks.md). It is
 * a constant for the process, so a row's bits still do not depend on the thread count. */
#define GEMM_TILE_M 128
#define GEMM_TILE_N 1024
#define GEMM_COL_TILES_MIN 4

static int64_t round16(int64_t x)
{
    return (x + 15) / 16 * 16;
}

/* The tile of C (mb rows x nb columns) for an m x n product: a function of n only. */
static void gemm_tiles(int64_t m, int64_t n, int64_t tile_m, int64_t *mb, int64_t *nb)
{
    int64_t cols = (n + GEMM_TILE_N - 1) / GEMM_TILE_N;
    cols = (cols + GEMM_COL_TILES_MIN - 1) / GEMM_COL_TILES_MIN * GEMM_COL_TILES_MIN;
    int64_t tn = round16((n + cols - 1) / cols);
    *mb = m < tile_m ? m : tile_m, *nb = tn < 64 ? (n < 64 ? n : 64) : tn;
}

/* GEMM_TILE_M, or TANDEM_CPU_TILE_ROWS when set (above). */
static tdm_status gemm_tile_rows(int64_t *out, tdm_error *err)
{
    const char *v = getenv("TANDEM_CPU_TILE_ROWS");
    *out = GEMM_TILE_M;
    if (!v || !*v) return TDM_OK;
    char *end;
    long n = strtol(v, &end, 10);
    if (*end || n < 16 || n > 4096 || n % 16)
        return tdm_fail(err, TDM_ERR_INVALID,
                        "TANDEM_CPU_TILE_ROWS=%s: want a multiple of 16 from 16 to 4096, or unset "
                        "for %d",
                        v, GEMM_TILE_M);
    *out = n;
    return TDM_OK;
}

void cpu_sgemm(const cpu_backend *cpu, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
               float alpha, const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
               float *c, int64_t ldc)
{
    int64_t TM, TN;
    gemm_tiles(m, n, cpu->tile_m, &TM, &TN);
    cpu_sgemm_tiles(cpu, TM, TN, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* C in tiles of TM x TN shared by the threads, each tile one call of `call` (1 thread). */
typedef void (*tile_call)(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                          const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                          float *c, int64_t ldc);

static void blas_sgemm_1thread(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                               const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                               float *c, int64_t ldc)
{
    cpu_blas_sgemm(1, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

static void sgemm_tiled(const cpu_backend *cpu, tile_call call, int64_t TM, int64_t TN, bool ta,
                        bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                        int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    int nt = cpu->n_threads;
    int64_t tm = (m + TM - 1) / TM, tn = (n + TN - 1) / TN;
    int64_t tiles = tm * tn;
#pragma omp parallel for schedule(dynamic, 1)                                                      \
    num_threads(nt) if (tiles > 1 && m * n * k > 64 * TDM_CPU_PAR_MIN)
    for (int64_t t = 0; t < tiles; t++) {
        int64_t i0 = (t / tn) * TM, j0 = (t % tn) * TN;
        int64_t mb = m - i0 < TM ? m - i0 : TM;
        int64_t nb = n - j0 < TN ? n - j0 : TN;
        const float *at = ta ? a + i0 : a + i0 * lda;
        const float *bt = tb ? b + j0 * ldb : b + j0;
        call(ta, tb, mb, nb, k, alpha, at, lda, bt, ldb, beta, c + i0 * ldc + j0, ldc);
    }
}

void cpu_sgemm_tiles(const cpu_backend *cpu, int64_t TM, int64_t TN, bool ta, bool tb, int64_t m,
                     int64_t n, int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                     int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (cpu->blas_threaded || m == 0 || n == 0 || k == 0) {
        cpu_blas_sgemm(cpu->n_threads, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    sgemm_tiled(cpu, blas_sgemm_1thread, TM, TN, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c,
                ldc);
}

void cpu_sgemm_segment(const cpu_backend *cpu, int64_t TM, int64_t TN, bool ta, bool tb, int64_t m,
                       int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                       const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (TM <= 0 || TN <= 0) gemm_tiles(m, n, cpu->tile_m, &TM, &TN);
    if (m == 0 || n == 0) return;
    sgemm_tiled(cpu, cpu_blas_sgemm_1t, TM, TN, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c,
                ldc);
}

/* Elements spanned by a batch of row-major matrices of `rows` rows, `cols` cols, ld, stride. */
static int64_t span(int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride)
{
    if (rows == 0 || cols == 0) return 0;
    return (batch - 1) * stride + (rows - 1) * ld + cols;
}

/* bf16 <-> f32 of n elements, in blocks over the threads (exact: no rounding order involved). */
#define CONVERT_BLOCK ((int64_t)1 << 16)

static void convert(int nt, const void *src, void *dst, int64_t n, bool to_f32)
{
    int64_t nb = (n + CONVERT_BLOCK - 1) / CONVERT_BLOCK;
#pragma omp parallel for schedule(static) num_threads(nt) if (n > TDM_CPU_PAR_MIN)
    for (int64_t b = 0; b < nb; b++) {
        int64_t i = b * CONVERT_BLOCK, len = n - i < CONVERT_BLOCK ? n - i : CONVERT_BLOCK;
        if (to_f32)
            tdm_bf16_to_f32_n((const uint16_t *)src + i, (float *)dst + i, (size_t)len);
        else
            tdm_f32_to_bf16_n((const float *)src + i, (uint16_t *)dst + i, (size_t)len);
    }
}

/* bf16 operands of gemm (the CPU backend's own activations and weights are f32; this serves
 * callers with bf16 buffers): converted once per call, in parallel. */
static float *to_f32_copy(int nt, const void *p, int64_t n)
{
    float *out = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (out) convert(nt, p, out, n, true);
    return out;
}

static tdm_status cpu_gemm(tdm_backend *be, const tdm_gemm_args *g, tdm_error *err)
{
    int nt = cpu_of(be)->n_threads;
    int64_t batch = g->batch > 0 ? g->batch : 1;
    float *ta = NULL, *tb = NULL, *tc = NULL;
    const float *a = g->a, *b = g->b;
    float *c = g->c;
    int64_t a_rows = g->trans_a ? g->k : g->m, a_cols = g->trans_a ? g->m : g->k;
    int64_t b_rows = g->trans_b ? g->n : g->k, b_cols = g->trans_b ? g->k : g->n;
    int64_t c_span = span(g->m, g->n, g->ldc, batch, g->stride_c);
    if (g->a_dtype == TDM_BE_BF16 && g->k > 0)
        a = ta = to_f32_copy(nt, g->a, span(a_rows, a_cols, g->lda, batch, g->stride_a));
    if (g->b_dtype == TDM_BE_BF16 && g->k > 0)
        b = tb = to_f32_copy(nt, g->b, span(b_rows, b_cols, g->ldb, batch, g->stride_b));
    if (g->c_dtype == TDM_BE_BF16) c = tc = to_f32_copy(nt, g->c, c_span);
    if ((g->a_dtype == TDM_BE_BF16 && g->k > 0 && !ta) ||
        (g->b_dtype == TDM_BE_BF16 && g->k > 0 && !tb) || (g->c_dtype == TDM_BE_BF16 && !tc)) {
        free(ta), free(tb), free(tc);
        return tdm_fail(err, TDM_ERR_NOMEM, "gemm: out of memory converting bf16 operands");
    }
    for (int64_t i = 0; i < batch; i++)
        cpu_sgemm(cpu_of(be), g->trans_a, g->trans_b, g->m, g->n, g->k, g->alpha,
                  a ? a + i * g->stride_a : NULL, g->lda, b ? b + i * g->stride_b : NULL, g->ldb,
                  g->beta, c + i * g->stride_c, g->ldc);
    if (tc) convert(nt, tc, g->c, c_span, false);
    free(ta), free(tb), free(tc);
    return TDM_OK;
}

/* ---- frozen weights ---- */

/* The scale of NF4 block blk of w: absmax, or with double quantization its 8-bit code through
 * the dynamic map times the block's second-level scale, plus the offset. */
static inline float nf4_block_absmax(const cpu_backend *cpu, const tdm_be_weight *w, int64_t blk)
{
    if (w->format == TDM_BE_W_NF4) return w->absmax[blk];
    return cpu->dmap[w->absmax_q[blk]] * w->absmax2[blk / TDM_NF4_DQ_BLOCK] + w->offset;
}

/* A whole 64-value NF4 block with AVX-512: the block's 16 values (code * amax, the products
 * tdm_nf4_dequantize_block forms: the same bits) in one register, each element's picked by a
 * lane permute, 16 at a time, where the scalar loop loads them one by one (qlora dequantizes
 * every frozen weight twice a step). packed: the block's 32 bytes, first element in the high
 * nibble. */
__attribute__((target("avx512f"))) static void nf4_block_avx512(const uint8_t *packed, float amax,
                                                               float *out)
{
    __m512 table = _mm512_mul_ps(_mm512_loadu_ps(tdm_nf4_code), _mm512_set1_ps(amax));
    /* lane i of the result from lane idx[i] of (hi, lo): hi0, lo0, hi1, lo1, ... */
    const __m512i first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i second =
        _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    const __m512i low4 = _mm512_set1_epi32(0x0f);
    for (int h = 0; h < 2; h++) { /* 16 bytes: 32 elements */
        __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(packed + 16 * h)));
        __m512i hi = _mm512_srli_epi32(bytes, 4), lo = _mm512_and_epi32(bytes, low4);
        _mm512_storeu_ps(out + 32 * h,
                         _mm512_permutexvar_ps(_mm512_permutex2var_epi32(hi, first, lo), table));
        _mm512_storeu_ps(out + 32 * h + 16,
                         _mm512_permutexvar_ps(_mm512_permutex2var_epi32(hi, second, lo), table));
    }
}

void cpu_nf4_range(const cpu_backend *cpu, const tdm_be_weight *w, int64_t e0, int64_t e1,
                   float *out)
{
    for (int64_t e = e0; e < e1;) {
        int64_t blk = e / TDM_NF4_BLOCK, stop = (blk + 1) * TDM_NF4_BLOCK;
        if (stop > e1) stop = e1;
        if (cpu->nf4_avx512 && e % TDM_NF4_BLOCK == 0 && stop - e == TDM_NF4_BLOCK)
            nf4_block_avx512(w->codes + e / 2, nf4_block_absmax(cpu, w, blk), out);
        else
            tdm_nf4_dequantize_block(w->codes, e, stop, nf4_block_absmax(cpu, w, blk), out);
        out += stop - e;
        e = stop;
    }
}

void cpu_weight_rows_f32(cpu_backend *cpu, const tdm_be_weight *w, int64_t r0, int64_t r1,
                         float *out)
{
    int64_t cols = w->cols;
    int nt = cpu->n_threads;
    switch (w->format) {
    case TDM_BE_W_F32:
        memcpy(out, (const float *)w->data + r0 * cols, (size_t)((r1 - r0) * cols) * sizeof(float));
        return;
    case TDM_BE_W_BF16:
        /* threaded like the NF4 case below: serial, this was a whole pass over every bf16 weight
         * per forward and per backward (and the lm_head per cross-entropy call) on one thread
         * while the others waited */
        convert(nt, (const uint16_t *)w->data + r0 * cols, out, (r1 - r0) * cols, true);
        return;
    case TDM_BE_W_F32_PANELS:
#pragma omp parallel for schedule(static) num_threads(nt) if ((r1 - r0) * cols > TDM_CPU_PAR_MIN)
        for (int64_t r = r0; r < r1; r++)
            cpu_panel_rows(w->data, w->panel, cols, r, r + 1, out + (r - r0) * cols);
        return;
    case TDM_BE_W_NF4:
    case TDM_BE_W_NF4_DQ:
        break;
    }
#pragma omp parallel for schedule(static) num_threads(nt) if ((r1 - r0) * cols > TDM_CPU_PAR_MIN)
    for (int64_t r = r0; r < r1; r++)
        cpu_nf4_range(cpu, w, r * cols, (r + 1) * cols, out + (r - r0) * cols);
}

/* Counted in used/peak like the caller's buffers: the memory plan predicts it
 * (cpu_memory_plan.h) and the CPU placement budget counts it. */
void *cpu_scratch(cpu_backend *cpu, cpu_scratch_slot slot, size_t bytes)
{
    if (cpu->scratch[slot].p && cpu->scratch[slot].bytes >= bytes) return cpu->scratch[slot].p;
    free(cpu->scratch[slot].p); /* the contents need not survive: no realloc copy */
    cpu->used -= cpu->scratch[slot].bytes;
    cpu->scratch[slot].p = cpu_big_alloc(64, bytes ? bytes : 1);
    cpu->scratch[slot].bytes = cpu->scratch[slot].p ? bytes : 0;
    cpu->used += cpu->scratch[slot].bytes;
    if (cpu->used > cpu->peak) cpu->peak = cpu->used;
    return cpu->scratch[slot].p;
}

/* Every slot grown now to what steps of that shape ask for (cpu_memory_plan.c computes them
 * with the ops' own rules), so a run holds its memory from the start. */
static tdm_status cpu_reserve_scratch(tdm_backend *be, const tdm_be_step_shape *shape,
                                      tdm_error *err)
{
    cpu_backend *cpu = cpu_of(be);
    uint64_t request[CPU_SCRATCH_N];
    tdm_cpu_scratch_requests(shape, cpu->att_keep_bytes, request);
    if (cpu->blas_threaded) request[CPU_SCRATCH_CE_PARTIAL] = 0; /* dH in threaded calls */
    if (shape->lm_head_bf16 && !cpu_ce_widens_bf16(cpu->blas_threaded))
        request[CPU_SCRATCH_CE_WEIGHT] = (uint64_t)(shape->vocab * shape->hidden) * 4;
    for (int i = 0; i < CPU_SCRATCH_N; i++)
        if (request[i] && !cpu_scratch(cpu, (cpu_scratch_slot)i, (size_t)request[i]))
            return tdm_fail(err, TDM_ERR_NOMEM,
                            "reserve: out of host memory for %.1f MiB of scratch",
                            (double)request[i] / (1 << 20));
    return TDM_OK;
}

const float *cpu_dense_f32(cpu_backend *cpu, const tdm_be_weight *w)
{
    if (w->format == TDM_BE_W_F32) return w->data;
    float *f = cpu_scratch(cpu, CPU_SCRATCH_CE_WEIGHT, (size_t)(w->rows * w->cols) * sizeof(float));
    if (f) cpu_weight_rows_f32(cpu, w, 0, w->rows, f);
    return f;
}

static tdm_status cpu_weight_rows(tdm_backend *be, const tdm_be_weight *w, int64_t row_begin,
                                  int64_t row_end, void *out, tdm_be_dtype out_dtype,
                                  tdm_error *err)
{
    cpu_backend *cpu = cpu_of(be);
    if (out_dtype == TDM_BE_F32) {
        cpu_weight_rows_f32(cpu, w, row_begin, row_end, out);
        return TDM_OK;
    }
    int64_t n = (row_end - row_begin) * w->cols;
    float *tmp = malloc((size_t)n * sizeof(float));
    if (!tmp) return tdm_fail(err, TDM_ERR_NOMEM, "weight_rows: out of memory");
    cpu_weight_rows_f32(cpu, w, row_begin, row_end, tmp);
    tdm_f32_to_bf16_n(tmp, out, (size_t)n);
    free(tmp);
    return TDM_OK;
}

/* A frozen f32 weight laid out in place in the forward's panels, so no forward product lays it
 * out again (docs/benchmarks.md, "Pairs": laying W out per product, both directions, was 12 %
 * of the frozen GEMMs at 16 threads). A projection only where its backward's panels fit the
 * scratch; the lm_head whatever its size (its backward, the cross-entropy's dH, transposes a
 * vocabulary block's K pieces back as it uses them). */
static tdm_status cpu_lay_out_frozen(tdm_backend *be, tdm_be_weight *w, tdm_be_frozen_use use,
                                     tdm_error *err)
{
    (void)err;
    int32_t pw;
    if (cpu_panel_lay_out(cpu_of(be), w->rows, w->cols, (float *)w->data,
                          use == TDM_BE_FROZEN_PROJECTION, &pw)) {
        w->format = TDM_BE_W_F32_PANELS;
        w->panel = pw;
    }
    return TDM_OK;
}

/* Whether an NF4 weight's tiles are dequantized straight into the panels tandem's kernels read
 * (cpu_nf4_tile_panels): with those kernels on, beta 0 or 1, and a tile's panels within the
 * scratch's cap; the product then cannot fail (its panels are given). Else a tile is
 * dequantized into rows and multiplied as a dense weight. */
static bool nf4_in_panels(const cpu_backend *cpu, const tdm_be_weight *w, float beta)
{
    if (w->format != TDM_BE_W_NF4 && w->format != TDM_BE_W_NF4_DQ) return false;
    if (beta != 0.0f && beta != 1.0f) return false;
    if (!cpu_panel_isa_name() || cpu->blas_threaded) return false;
    int64_t tile = tdm_cpu_weight_tile_rows(w->rows, w->cols);
    return tdm_cpu_panel_bytes(tile, w->cols) > 0 && tdm_cpu_panel_bytes(w->cols, tile) > 0;
}

/* Y (m, rows) = X (m, cols) W^T + beta Y. Dense f32 weights go to one GEMM; others are
 * dequantized a tile of rows at a time, each tile giving a block of Y's columns. */
static tdm_status cpu_linear_fwd(tdm_backend *be, const tdm_be_weight *w, const void *x, int64_t m,
                                 void *y, float beta, tdm_error *err)
{
    cpu_backend *cpu = cpu_of(be);
    if (w->format == TDM_BE_W_F32 || w->format == TDM_BE_W_F32_PANELS) {
        if (cpu_panel_gemm_weight(cpu, true, w, x, m, beta, y)) return TDM_OK;
        if (w->format == TDM_BE_W_F32) {
            cpu_sgemm(cpu, false, true, m, w->rows, w->cols, 1.0f, x, w->cols, w->data, w->cols,
                      beta, y, w->rows);
            return TDM_OK;
        } /* panels the kernels cannot read now: a tile of rows at a time below */
    }
    /* a bf16 weight (qlora's lm_head, tdm_model_last_logits) widened as each tile packs it, not
     * converted into f32 tiles and then packed again (with those, a 0.5B model's decoded token
     * took ~1.7x the time of the f32 table's on the 2-core VM; generation now keeps f32) */
    if (cpu_panel_gemm_bf16_weight(cpu, w, x, m, beta, y)) return TDM_OK;
    int64_t tile = tdm_cpu_weight_tile_rows(w->rows, w->cols);
    if (nf4_in_panels(cpu, w, beta)) { /* each tile dequantized straight into its panels */
        float *panels = cpu_scratch(cpu, CPU_SCRATCH_WEIGHT_TILE,
                                    (size_t)tdm_cpu_panel_bytes(tile, w->cols));
        if (!panels)
            return tdm_fail(err, TDM_ERR_NOMEM, "linear_fwd: out of memory for a weight tile");
        for (int64_t r0 = 0; r0 < w->rows; r0 += tile) {
            int64_t r1 = r0 + tile < w->rows ? r0 + tile : w->rows;
            if (!cpu_nf4_tile_panels(cpu, w, r0, r1, true, panels) ||
                !cpu_panel_gemm_panels(cpu, m, r1 - r0, w->cols, x, w->cols, panels, beta,
                                       (float *)y + r0, w->rows))
                return tdm_fail(err, TDM_ERR_UNSUPPORTED, "linear_fwd: NF4 panels refused");
        }
        return TDM_OK;
    }
    float *buf =
        cpu_scratch(cpu, CPU_SCRATCH_WEIGHT_TILE, (size_t)(tile * w->cols) * sizeof(float));
    if (!buf) return tdm_fail(err, TDM_ERR_NOMEM, "linear_fwd: out of memory for a weight tile");
    for (int64_t r0 = 0; r0 < w->rows; r0 += tile) {
        int64_t r1 = r0 + tile < w->rows ? r0 + tile : w->rows;
        cpu_weight_rows_f32(cpu, w, r0, r1, buf);
        if (!cpu_panel_gemm(cpu, true, m, r1 - r0, w->cols, x, w->cols, buf, w->cols, beta,
                            (float *)y + r0, w->rows))
            cpu_sgemm(cpu, false, true, m, r1 - r0, w->cols, 1.0f, x, w->cols, buf, w->cols, beta,
                      (float *)y + r0, w->rows);
    }
    return TDM_OK;
}

/* dX (m, cols) = dY (m, rows) W + beta dX; tiles of W's rows are the K dimension here, so the
 * tiles' products are summed into dX in tile order (fixed, thread-independent). */
static tdm_status cpu_linear_bwd(tdm_backend *be, const tdm_be_weight *w, const void *dy, int64_t m,
                                 void *dx, float beta, tdm_error *err)
{
    cpu_backend *cpu = cpu_of(be);
    if (w->format == TDM_BE_W_F32 || w->format == TDM_BE_W_F32_PANELS) {
        if (cpu_panel_gemm_weight(cpu, false, w, dy, m, beta, dx)) return TDM_OK;
        if (w->format == TDM_BE_W_F32) {
            cpu_sgemm(cpu, false, false, m, w->cols, w->rows, 1.0f, dy, w->rows, w->data, w->cols,
                      beta, dx, w->cols);
            return TDM_OK;
        } /* panels the kernels cannot read now: a tile of rows at a time below */
    }
    int64_t tile = tdm_cpu_weight_tile_rows(w->rows, w->cols);
    if (nf4_in_panels(cpu, w, beta)) { /* each tile (a K block) dequantized into its panels */
        float *panels = cpu_scratch(cpu, CPU_SCRATCH_WEIGHT_TILE,
                                    (size_t)tdm_cpu_panel_bytes(w->cols, tile));
        if (!panels)
            return tdm_fail(err, TDM_ERR_NOMEM, "linear_bwd: out of memory for a weight tile");
        for (int64_t r0 = 0; r0 < w->rows; r0 += tile) {
            int64_t r1 = r0 + tile < w->rows ? r0 + tile : w->rows;
            if (!cpu_nf4_tile_panels(cpu, w, r0, r1, false, panels) ||
                !cpu_panel_gemm_panels(cpu, m, w->cols, r1 - r0, (const float *)dy + r0, w->rows,
                                       panels, r0 == 0 ? beta : 1.0f, dx, w->cols))
                return tdm_fail(err, TDM_ERR_UNSUPPORTED, "linear_bwd: NF4 panels refused");
        }
        return TDM_OK;
    }
    float *buf =
        cpu_scratch(cpu, CPU_SCRATCH_WEIGHT_TILE, (size_t)(tile * w->cols) * sizeof(float));
    if (!buf) return tdm_fail(err, TDM_ERR_NOMEM, "linear_bwd: out of memory for a weight tile");
    for (int64_t r0 = 0; r0 < w->rows; r0 += tile) {
        int64_t r1 = r0 + tile < w->rows ? r0 + tile : w->rows;
        cpu_weight_rows_f32(cpu, w, r0, r1, buf);
        float b = r0 == 0 ? beta : 1.0f;
        if (!cpu_panel_gemm(cpu, false, m, w->cols, r1 - r0, (const float *)dy + r0, w->rows, buf,
                            w->cols, b, dx, w->cols))
            cpu_sgemm(cpu, false, false, m, w->cols, r1 - r0, 1.0f, (const float *)dy + r0,
                      w->rows, buf, w->cols, b, dx, w->cols);
    }
    return TDM_OK;
}

/* Offload on the CPU backend: "device" and host memory are the same memory, so the host side is
 * malloc'd and a copy behind the ops is a copy now (the engine's offload logic runs unchanged,
 * which is what the CPU tests exercise). */
static tdm_status cpu_host_alloc(tdm_backend *be, size_t bytes, void **out, tdm_error *err)
{
    (void)be;
    *out = malloc(bytes);
    if (!*out)
        return tdm_fail(err, TDM_ERR_NOMEM, "host memory for offload: out of memory (%.1f MiB)",
                        (double)bytes / (1 << 20));
    return TDM_OK;
}

static void cpu_host_free(tdm_backend *be, void *ptr)
{
    (void)be;
    free(ptr);
}

static tdm_status cpu_copies_join(tdm_backend *be, tdm_error *err)
{
    (void)be, (void)err;
    return TDM_OK;
}

static const tdm_backend_vtable cpu_vtable = {
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_upload,
    .download = cpu_upload, /* host memory both sides: the same memcpy */
    .upload_f32 = cpu_upload_f32,
    .download_f32 = cpu_download_f32,
    .copy = cpu_upload,
    .memory = cpu_memory,
    .reset_peak = cpu_reset_peak,
    .reserve_scratch = cpu_reserve_scratch,
    .synchronize = cpu_synchronize,
    .fill = cpu_fill,
    .axpy = cpu_axpy,
    .scale = cpu_scale,
    .add_bias = cpu_add_bias,
    .gemm = cpu_gemm,
    .weight_rows = cpu_weight_rows,
    .lay_out_frozen = cpu_lay_out_frozen,
    .linear_fwd = cpu_linear_fwd,
    .linear_bwd = cpu_linear_bwd,
    .embedding = cpu_embedding,
    .rmsnorm_fwd = cpu_rmsnorm_fwd,
    .rmsnorm_bwd = cpu_rmsnorm_bwd,
    .rope = cpu_rope,
    .attention_fwd = cpu_attention_fwd,
    .attention_bwd = cpu_attention_bwd,
    .swiglu_fwd = cpu_swiglu_fwd,
    .swiglu_bwd = cpu_swiglu_bwd,
    .cross_entropy = cpu_cross_entropy,
    .lora_fwd = cpu_lora_fwd,
    .lora_bwd = cpu_lora_bwd,
    .sumsq = cpu_sumsq,
    .clip_coef = cpu_clip_coef,
    .adamw = cpu_adamw,
    .attention_kv = cpu_attention_kv,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
    .copy_behind = cpu_upload,
    .copies_join = cpu_copies_join,
};

/* OpenBLAS's OpenMP build on a core whose kernels were measured: threaded calls (cpu_blas_sgemm).
 * Any other build or core runs single-threaded on tiles (cpu_sgemm): the pthread build's own pool
 * would only compete with OpenMP's, and on other cores (Haswell, Zen) the threaded calls' bits
 * change with the thread count; TANDEM_CPU_GEMM=blas takes the threaded calls there anyway.
 * TANDEM_CPU_GEMM=tiles takes the tiles with the OpenMP build too (the same GEMM bits; the
 * cross-entropy's dH sums in another order: docs/engine.md): a comparison, and a way around a BLAS
 * that misbehaves. */
/* Tiles by default: on the 16-core host of the GPU machine (AVX-512, 2026-12-03) they trained
 * 1.36x faster than the threaded calls at 16 threads, and on the 2-core VM 1.5x at 2 threads
 * (docs/benchmarks.md); the threaded calls win only at 1 thread. TANDEM_CPU_GEMM=blas asks for
 * the threaded calls (OpenMP build only). */
static tdm_status gemm_mode(bool *tiles, tdm_error *err)
{
    const char *mode = getenv("TANDEM_CPU_GEMM");
    if (mode && *mode && strcmp(mode, "tiles") != 0 && strcmp(mode, "blas") != 0)
        return tdm_fail(err, TDM_ERR_INVALID,
                        "TANDEM_CPU_GEMM=%s: unknown mode (tiles, blas, or unset for tiles)", mode);
    *tiles = !cpu_blas_threaded() || !mode || strcmp(mode, "blas") != 0;
    return TDM_OK;
}

/* The GEMM mode in words, without the kernel set. */
static const char *gemm_mode_words(void)
{
    bool tiles;
    tdm_error e = {0};
    if (gemm_mode(&tiles, &e) != TDM_OK) return "GEMMs: TANDEM_CPU_GEMM unknown";
    if (!tiles)
        return cpu_blas_bits_measured()
                   ? "GEMMs: threaded OpenBLAS calls (TANDEM_CPU_GEMM=blas)"
                   : "GEMMs: threaded OpenBLAS calls (TANDEM_CPU_GEMM=blas; on this core their "
                     "bits may change with the thread count)";
    const char *mode = getenv("TANDEM_CPU_GEMM");
    if (mode && strcmp(mode, "blas") == 0)
        return "GEMMs: single-threaded OpenBLAS on tiles (TANDEM_CPU_GEMM=blas needs OpenBLAS's "
               "OpenMP build)";
    return "GEMMs: single-threaded OpenBLAS on tiles";
}

const char *tdm_cpu_gemm_mode(void)
{
    static char buf[400];
    const char *words = gemm_mode_words(), *panels = cpu_panel_isa_name();
    bool tiles;
    tdm_error e = {0};
    if (panels && gemm_mode(&tiles, &e) == TDM_OK && tiles && strncmp(words, "GEMMs: ", 7) == 0)
        snprintf(buf, sizeof buf, "GEMMs: the frozen projections on tandem's %s kernels, the rest %s; %s",
                 panels, words + 7, tdm_blas_core_note());
    else
        snprintf(buf, sizeof buf, "%s; %s", words, tdm_blas_core_note());
    return buf;
}

tdm_status tdm_backend_cpu_create(tdm_backend **out, const tdm_backend_opts *opts, tdm_error *err)
{
    if (opts->base_fp8)
        return tdm_fail(err, TDM_ERR_UNSUPPORTED,
                        "--base-compute fp8 needs a CUDA GPU of compute capability 8.9 or newer "
                        "(Ada, Hopper); the CPU backend computes in f32: leave the option out");
    cpu_backend *cpu = calloc(1, sizeof *cpu);
    if (!cpu) return tdm_fail(err, TDM_ERR_NOMEM, "backend cpu: out of memory");
    cpu->base.vt = &cpu_vtable;
    cpu->base.name = "cpu";
    cpu->base.act_dtype = TDM_BE_F32;
    cpu->n_threads = opts->n_threads > 0 ? opts->n_threads : omp_get_max_threads();
    if (cpu->n_threads < 1) cpu->n_threads = 1;
    /* One pool for everything: the OpenMP loops outside the backend (NF4 quantization while the
     * model loads) get the same count. */
    if (opts->n_threads > 0) omp_set_num_threads(cpu->n_threads);
    bool tiles;
    tdm_status st = gemm_mode(&tiles, err);
    if (st == TDM_OK) st = gemm_tile_rows(&cpu->tile_m, err);
    if (st == TDM_OK) st = tdm_cpu_att_keep_cap(&cpu->att_keep_bytes, err);
    if (st != TDM_OK) {
        free(cpu);
        return st;
    }
    cpu->blas_threaded = !tiles;
    if (!cpu_blas_threaded()) openblas_set_num_threads(1);
    tdm_nf4_dynamic_map(cpu->dmap);
    __builtin_cpu_init();
    cpu->nf4_avx512 = __builtin_cpu_supports("avx512f");
    *out = &cpu->base;
    return TDM_OK;
}
