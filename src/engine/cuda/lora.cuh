/* lora.cuh — segmented LoRA over the fused multi-adapter batch (device code only; included by
 * cuda_train.cu and dev/cuda/lora.cu).
 *
 * The batch's rows are cut into segments, one per adapter, each with its own A (r, in), B (out, r)
 * f32 and scale s. The segment table travels by value in the kernel parameters (no upload, no
 * host synchronization), and every launch covers all segments (<= LORA_MAX_SEGS per launch).
 *
 * Four kernels (v4 down and up, v5 grad; dev/cuda/lora.cu validates and times them against v3,
 * dev/cuda/lora_v3.cuh, whose CUDA-core down kernel held 178 registers a thread and one block
 * per SM and ran at ~0.36 TB/s on a 7B q_proj, and against v4's grad kernel,
 * dev/cuda/lora_v4.cuh; v2 walked all of K in one block per 16 rows):
 *   lora_down_kernel<BWD>  the product down to the rank: U = Xd A^T (fwd) or dU = dY B (bwd),
 *                          K = in or out, on tensor cores (tf32 mma, below). Block = 64 rows
 *                          (4 warps x one 16-row tile) x 16 ranks x one K slice
 *                          (tdm_cuda_lora_k_slice, cuda_memory_plan.h: <= 16 slices of >= 512);
 *                          the slice's W staged in shared memory as tf32 in chunks of 512 k.
 *                          Each slice's sums go to its own f32 (m, u_ld) block of p.ws.
 *   lora_up_kernel<BWD>    the product up from the rank: Y += s U B^T (fwd) or dX += dU A
 *                          (bwd), tf32 mma. Block = 32 rows x 256 columns; first the slices'
 *                          partials of its rows are added in slice order (x s in the bwd), and
 *                          the blocks of column tile 0 write the result (f32) to u (fwd) / du
 *                          (bwd); then each warp multiplies 16 rows by 64 columns of W' over all
 *                          ranks, 16 ranks at a time.
 *   lora_grad_kernel       dA = dU^T Xd (r, in) and dB = s (dY^T U) (out, r), tf32 mma with
 *                          the batch rows as K: block = 64 columns x 16 ranks x one chunk of a
 *                          segment's rows (tdm_cuda_lora_red_chunk_rows: <= 16 chunks of >= 256
 *                          rows), the chunk's rows split over 4 warps and their sums added in
 *                          warp order (v5; v4 gave each warp 64 of 256 columns over all the
 *                          rows, dev/cuda/lora_v4.cuh); the chunk's sums go to f32 partials
 *                          (scratch slot 7).
 *   lora_red_finish_kernel per element of dA / dB: the chunks' partials added in chunk order,
 *                          then dA += sum, dB += s sum.
 * Every output element has one owner thread and a fixed summation order: no atomics, the same
 * bits on every run (an mma's output element depends only on its own row and column). X, Y,
 * dY, dX are bf16 (act), everything else f32; products accumulate in f32 (the down and up
 * products' f32 operands rounded to tf32). fwd = down<false> + up<false>; bwd = down<true> + up<true> + grad + finish.
 * LoRA dropout (a segment with drop set): the mask of engine/dropout.h is applied where X is
 * loaded, as x * (keep ? 1/(1-p) : 0) with the row counted from the segment's start (grad's dA;
 * down<false> zeroes the dropped elements and multiplies its sums by 1/(1-p) once, so X enters
 * the tf32 product exactly), and to dU A before it is added into dX (up<true>); nothing is stored, no copy
 * of X is made, and the mask is bit-identical to the CPU backend's.
 */
#ifndef TANDEM_ENGINE_CUDA_LORA_CUH
#define TANDEM_ENGINE_CUDA_LORA_CUH
#include <cuda_bf16.h>
#include <stdint.h>

#include "engine/cuda/cuda_memory_plan.h"
#include "engine/dropout.h"

#define LORA_MAX_SEGS 16 /* per launch; longer tables are split into several launches */
#define LORA_MAX_RANK 128
#define LORA_RG 16 /* ranks per rank group (down and grad kernels) */
#define LORA_DOWN_THREADS 128
#define LORA_DOWN_ROWS 64  /* 4 warps x 16 rows (one mma row tile each) */
#define LORA_DOWN_KSUB 512 /* K staged in shared memory at a time */
#define LORA_DOWN_LD (LORA_DOWN_KSUB + 4)
#define LORA_UP_THREADS 256
#define LORA_UP_ROWS 32 /* 2 row tiles of 16 x 4 column chunks of 64: 8 warps */
#define LORA_UP_COLS 256
#define LORA_UP_LD (LORA_UP_COLS + 8)
#define LORA_UP_LS_LD (LORA_MAX_RANK + 4)
#define LORA_GRAD_WARPS 4 /* split the chunk's rows; their sums added in warp order */
#define LORA_GRAD_THREADS (32 * LORA_GRAD_WARPS)
#define LORA_GRAD_COLS 64 /* 4 m-tiles of 16 columns */

struct lora_seg_d {
    int64_t row_begin, row_end;
    const float *a, *b;
    float *da, *db;
    float scale;
    int rank;
    int tile0;          /* first block of this segment in the current launch */
    int drop;           /* LoRA dropout on this segment's input */
    uint32_t keep_thr;  /* tdm_dropout_threshold(p) */
    float keep_scale;   /* tdm_dropout_scale(p) = 1 / (1 - p) */
    uint64_t mask_seed; /* the segment's mask seed */
    /* grad kernel only: rows per chunk, chunks, and where the segment's partials start in
     * lora_params.part (floats; n_chunks blocks of rank * (in + out) each) and its elements
     * start in the finish kernel's index space */
    int64_t chunk_rows;
    int n_chunks;
    int64_t part0, elem0;
};

/* The dropout factor of element (row, col) of X (row: of the batch): 1/(1-p) or 0. */
__device__ __forceinline__ float lora_drop(const lora_seg_d &sg, int64_t row, int64_t col)
{
    return tdm_dropout_keep(sg.mask_seed, sg.keep_thr, (uint64_t)(row - sg.row_begin),
                            (uint64_t)col)
               ? sg.keep_scale
               : 0.0f;
}

struct lora_params {
    lora_seg_d seg[LORA_MAX_SEGS];
    int n_segs, n_blocks;
    const __nv_bfloat16 *x; /* (m, in) */
    __nv_bfloat16 *y;       /* fwd: (m, out) */
    const __nv_bfloat16 *dy;
    __nv_bfloat16 *dx; /* may be NULL */
    float *u;          /* fwd: written; bwd: read. (m, u_ld) */
    float *du;         /* bwd: (m, u_ld), written by up<true> */
    float *ws;         /* down partials: k_slices blocks of (m, u_ld) */
    float *part;       /* grad: per-chunk partial sums of dA, dB */
    int64_t m, u_ld, in, out;
    int64_t k_slice; /* down: K per slice (a multiple of 256) */
    int k_slices;
    int64_t n_elems; /* finish kernel: sum over segments of rank * (in + out) */
};

__device__ __forceinline__ int lora_find_seg(const lora_params &p, int block)
{
    int s = 0;
    while (s + 1 < p.n_segs && p.seg[s + 1].tile0 <= block)
        s++;
    return s;
}

/* Blocks per segment of rows R and rank r in each kernel (host and device agree on them). */
__host__ __device__ __forceinline__ int lora_rank_groups(int r)
{
    return (r + LORA_RG - 1) / LORA_RG;
}
__host__ __device__ __forceinline__ int lora_up_col_tiles(const lora_params &p, bool bwd)
{
    int64_t n = bwd ? p.in : p.out;
    bool has_out = bwd ? p.dx != NULL : p.y != NULL;
    return has_out && n > 0 ? (int)((n + LORA_UP_COLS - 1) / LORA_UP_COLS) : 1;
}
__host__ __device__ __forceinline__ int lora_grad_col_tiles(const lora_params &p)
{
    return (int)((p.in + LORA_GRAD_COLS - 1) / LORA_GRAD_COLS +
                 (p.out + LORA_GRAD_COLS - 1) / LORA_GRAD_COLS);
}

/* ---- tensor-core products (v4): mma.sync m16n8k8, tf32 operands, f32 accumulation ----
 * Fragment layouts (PTX ISA, mma.m16n8k8 .tf32; lane = 4 g + t, g = lane >> 2, t = lane & 3):
 *   A (16 x 8, row): a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4)
 *   B (8 x 8, col):  b0 (k t, n g), b1 (k t + 4, n g)
 *   C (16 x 8):      c0 (g, 2t), c1 (g, 2t + 1), c2 (g + 8, 2t), c3 (g + 8, 2t + 1)
 * A product's K order is free as long as A and B agree, and so is the order of C's columns, so
 * the kernels relabel both to make every lane's global accesses 16-byte vectors (see each
 * kernel). tf32 keeps 10 mantissa bits: bf16 activations enter exactly; the f32 adapter weights
 * and the rank-r intermediates are rounded to nearest (relative error <= 2^-11), well inside
 * the bf16 tolerance the LoRA ops are held to (test_backend_cuda: ~1e-2). */

/* f32 -> tf32 bits, rounded to nearest (ties away from zero). */
__device__ __forceinline__ uint32_t lora_tf32(float x)
{
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

/* c += a b over one 16 x 8 x 8 tile. */
__device__ __forceinline__ void lora_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* 8 consecutive bf16 of a row as f32, zero at and past kmax; vec: 16-byte aligned (one load). */
__device__ __forceinline__ void lora_load8(const __nv_bfloat16 *row, int64_t k, int64_t kmax,
                                           bool vec, float v[8])
{
    if (vec && k + 8 <= kmax) {
        uint4 q = *reinterpret_cast<const uint4 *>(row + k);
        const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&q);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float2 f = __bfloat1622float2(h[j]);
            v[2 * j] = f.x, v[2 * j + 1] = f.y;
        }
        return;
    }
#pragma unroll
    for (int j = 0; j < 8; j++)
        v[j] = k + j < kmax ? __bfloat162float(row[k + j]) : 0.0f;
}

/* Elements k..k+7 of row `row` of M (ld columns) as the tf32 products take them: zeros for a
 * row outside the segment (in false) and at and past kmax; with drop, LoRA dropout's dropped
 * elements zeroed and the kept ones left unscaled (the kernels multiply their sums by
 * 1/(1-p) once, so x enters the product exactly). */
__device__ __forceinline__ void lora_load_masked8(const lora_seg_d &sg, const __nv_bfloat16 *M,
                                                  int64_t ld, int64_t row, bool in, int64_t k,
                                                  int64_t kmax, bool vec, bool drop, float v[8])
{
    if (!in) {
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = 0.0f;
        return;
    }
    lora_load8(M + row * ld, k, kmax, vec, v);
    if (drop)
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (lora_drop(sg, row, k + j) == 0.0f) v[j] = 0.0f;
}

/* row[n..n+7] += v (bf16, rounded once), only the columns below nmax. */
__device__ __forceinline__ void lora_add8(__nv_bfloat16 *row, int64_t n, int64_t nmax, bool vec,
                                          const float v[8])
{
    if (vec && n + 8 <= nmax) {
        uint4 q = *reinterpret_cast<uint4 *>(row + n);
        __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&q);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float2 f = __bfloat1622float2(h[j]);
            h[j] = __floats2bfloat162_rn(f.x + v[2 * j], f.y + v[2 * j + 1]);
        }
        *reinterpret_cast<uint4 *>(row + n) = q;
        return;
    }
#pragma unroll
    for (int j = 0; j < 8; j++)
        if (n + j < nmax) row[n + j] = __float2bfloat16_rn(__bfloat162float(row[n + j]) + v[j]);
}

/* Down: this block's 64 rows (4 warps x 16) of one K slice times one rank group's 16 columns of
 * W, into the slice's f32 block of p.ws. K runs in chunks of 32: lane (g, t) loads k = 8t..8t+7
 * of rows g and g + 8 (one 16-byte load each) and the same k of W's ranks g and g + 8 (two float4
 * from shared memory, conflict-free with the row stride of 516 floats); mma step j (0..3) takes
 * k 8t + 2j as its "t" and 8t + 2j + 1 as its "t + 4". LoRA dropout (fwd) zeroes dropped
 * elements of X and multiplies the sums by 1/(1-p) once at the end, so X stays exact in tf32. */
template <bool BWD> __global__ void __launch_bounds__(LORA_DOWN_THREADS) lora_down_kernel(lora_params p)
{
    __shared__ __align__(16) uint32_t Ws[LORA_RG * LORA_DOWN_LD]; /* [rank][k], tf32 bits */
    const lora_seg_d sg = p.seg[lora_find_seg(p, blockIdx.x)];
    const int r = sg.rank, groups = lora_rank_groups(r), t = threadIdx.x;
    const int warp = t / 32, lane = t % 32, qg = lane >> 2, qt = lane & 3;
    const int local = blockIdx.x - sg.tile0, g = local % groups;
    const int slice = (local / groups) % p.k_slices, tile = local / groups / p.k_slices;
    const int rg = r - g * LORA_RG < LORA_RG ? r - g * LORA_RG : LORA_RG; /* ranks in the group */
    const int64_t K = BWD ? p.out : p.in;
    const __nv_bfloat16 *M = BWD ? p.dy : p.x;
    const bool vec = K % 8 == 0 && (reinterpret_cast<uintptr_t>(M) & 15) == 0;
    const int64_t k_lo = (int64_t)slice * p.k_slice;
    const int64_t k_hi = k_lo + p.k_slice < K ? k_lo + p.k_slice : K;
    const int64_t row_a = sg.row_begin + (int64_t)tile * LORA_DOWN_ROWS + warp * 16 + qg;
    const int64_t row_b = row_a + 8;
    const bool in_a = row_a < sg.row_end, in_b = row_b < sg.row_end;
    const bool drop = !BWD && sg.drop;
    const bool two = rg > 8; /* the second n-tile has ranks (the same for the whole block) */
    float acc[2][4] = {}; /* n-tiles: ranks 0..7 and 8..15 of the group */
    for (int64_t kb = k_lo; kb < k_hi; kb += LORA_DOWN_KSUB) {
        const int kl = (int)(k_hi - kb < LORA_DOWN_KSUB ? k_hi - kb : LORA_DOWN_KSUB);
        __syncthreads();
        /* W(c, k): A[c][k] (fwd, rows of A contiguous) or B[k][c] (bwd, rows of B contiguous) */
        for (int i = t; i < LORA_RG * LORA_DOWN_KSUB; i += LORA_DOWN_THREADS) {
            int c, kk;
            if (BWD)
                kk = i / LORA_RG, c = i % LORA_RG;
            else
                c = i / LORA_DOWN_KSUB, kk = i % LORA_DOWN_KSUB;
            float w = 0.0f;
            if (c < rg && kk < kl)
                w = BWD ? sg.b[(kb + kk) * r + g * LORA_RG + c]
                        : sg.a[(int64_t)(g * LORA_RG + c) * K + kb + kk];
            Ws[c * LORA_DOWN_LD + kk] = lora_tf32(w);
        }
        __syncthreads();
#pragma unroll 2
        for (int k0 = 0; k0 < kl; k0 += 32) {
            const int64_t k = kb + k0 + 8 * qt;
            float xa[8], xb[8];
            lora_load_masked8(sg, M, K, row_a, in_a, k, k_hi, vec, drop, xa);
            lora_load_masked8(sg, M, K, row_b, in_b, k, k_hi, vec, drop, xb);
            const uint4 *w0 = reinterpret_cast<const uint4 *>(&Ws[qg * LORA_DOWN_LD + k0 + 8 * qt]);
            const uint4 *w1 =
                reinterpret_cast<const uint4 *>(&Ws[(qg + 8) * LORA_DOWN_LD + k0 + 8 * qt]);
            const uint4 wa0 = w0[0], wa1 = w0[1], wb0 = w1[0], wb1 = w1[1];
            const uint32_t wa[8] = {wa0.x, wa0.y, wa0.z, wa0.w, wa1.x, wa1.y, wa1.z, wa1.w};
            const uint32_t wb[8] = {wb0.x, wb0.y, wb0.z, wb0.w, wb1.x, wb1.y, wb1.z, wb1.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                /* bf16 values are exact tf32: their f32 bits are the operand */
                const uint32_t a[4] = {__float_as_uint(xa[2 * j]), __float_as_uint(xb[2 * j]),
                                       __float_as_uint(xa[2 * j + 1]),
                                       __float_as_uint(xb[2 * j + 1])};
                lora_mma(acc[0], a, wa[2 * j], wa[2 * j + 1]);
                if (two) lora_mma(acc[1], a, wb[2 * j], wb[2 * j + 1]);
            }
        }
    }
    const float s = drop ? sg.keep_scale : 1.0f;
    float *blk = p.ws + (int64_t)slice * p.m * p.u_ld + g * LORA_RG;
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int c = nt * 8 + 2 * qt + e;
            if (c >= rg) continue;
            if (in_a) blk[row_a * p.u_ld + c] = s * acc[nt][e];
            if (in_b) blk[row_b * p.u_ld + c] = s * acc[nt][2 + e];
        }
}

/* Up: 32 rows x 256 columns per block; warp w takes rows 16 (w / 4).. and columns 64 (w % 4)..
 * as 8 n-tiles. C's column 2t + e of n-tile j is output column 16t + 2j + e, so lane (g, t)
 * owns the 16 contiguous columns 16t..16t+15 of rows g and g + 8 (two 16-byte read-modify-writes
 * each); W' is staged in that relabelled order (column 16t' + 2j + e at j * 8 + 2t' + e of its
 * warp's 64), which makes the B-fragment reads conflict-free (row stride 264). L (rows x rank,
 * the slices summed) is staged as tf32 with row stride 132, conflict-free for the A fragments. */
template <bool BWD> __global__ void __launch_bounds__(LORA_UP_THREADS) lora_up_kernel(lora_params p)
{
    __shared__ __align__(16) uint32_t Ls[LORA_UP_ROWS * LORA_UP_LS_LD]; /* [row][rank] tf32 */
    __shared__ __align__(16) uint32_t Ws[LORA_RG * LORA_UP_LD];         /* [rank][col'] tf32 */
    const lora_seg_d sg = p.seg[lora_find_seg(p, blockIdx.x)];
    const int r = sg.rank, t = threadIdx.x, warp = t / 32, lane = t % 32;
    const int qg = lane >> 2, qt = lane & 3;
    const int ctiles = lora_up_col_tiles(p, BWD);
    const int local = blockIdx.x - sg.tile0, tile = local / ctiles, ct = local % ctiles;
    const int64_t r0 = sg.row_begin + (int64_t)tile * LORA_UP_ROWS;
    const int rows = (int)(sg.row_end - r0 < LORA_UP_ROWS ? sg.row_end - r0 : LORA_UP_ROWS);
    const int r_pad = (r + LORA_RG - 1) / LORA_RG * LORA_RG;
    /* L = (the down slices' partials summed in slice order) x (s in the bwd: dU = s dY B) */
    float *l_out = BWD ? p.du : p.u;
    const int64_t slice_stride = p.m * p.u_ld;
    for (int i = t; i < r_pad * LORA_UP_ROWS; i += LORA_UP_THREADS) {
        const int rr = i / r_pad, c = i % r_pad;
        float v = 0.0f;
        if (rr < rows && c < r) {
            const float *src = p.ws + (r0 + rr) * p.u_ld + c;
            for (int s = 0; s < p.k_slices; s++)
                v += src[s * slice_stride];
            if (BWD) v *= sg.scale;
            if (ct == 0) l_out[(r0 + rr) * p.u_ld + c] = v;
        }
        Ls[rr * LORA_UP_LS_LD + c] = lora_tf32(v);
    }
    __nv_bfloat16 *O = BWD ? p.dx : p.y;
    const int64_t N = BWD ? p.in : p.out;
    if (!O || N == 0) return;
    const float oscale = BWD ? 1.0f : sg.scale;
    const int64_t n0 = (int64_t)ct * LORA_UP_COLS;
    const int rh = warp / 4, wc = warp % 4; /* row half, 64-column chunk */
    float acc[8][4] = {};
    for (int c0 = 0; c0 < r; c0 += LORA_RG) {
        __syncthreads();
        /* W'(c, n): B[n][c] (fwd: Y += s U B^T) or A[c][n] (bwd: dX += dU A), n relabelled */
        for (int i = t; i < LORA_RG * LORA_UP_COLS; i += LORA_UP_THREADS) {
            int c, nn;
            if (BWD)
                c = i / LORA_UP_COLS, nn = i % LORA_UP_COLS;
            else
                nn = i / LORA_RG, c = i % LORA_RG;
            float w = 0.0f;
            if (c0 + c < r && n0 + nn < N)
                w = BWD ? sg.a[(int64_t)(c0 + c) * N + n0 + nn] : sg.b[(n0 + nn) * r + c0 + c];
            const int q = nn % 64, tt = q / 16, j = q % 16 / 2, e = q % 2;
            Ws[c * LORA_UP_LD + nn - q + j * 8 + 2 * tt + e] = lora_tf32(w);
        }
        __syncthreads();
        const int steps = r - c0 > 8 ? 2 : 1;
        for (int ks = 0; ks < steps; ks++) {
            const int kc = c0 + ks * 8 + qt;
            const uint32_t *la = &Ls[(rh * 16 + qg) * LORA_UP_LS_LD + kc];
            const uint32_t a[4] = {la[0], la[8 * LORA_UP_LS_LD], la[4], la[8 * LORA_UP_LS_LD + 4]};
            const uint32_t *wb = &Ws[(ks * 8 + qt) * LORA_UP_LD + wc * 64 + qg];
#pragma unroll
            for (int j = 0; j < 8; j++)
                lora_mma(acc[j], a, wb[j * 8], wb[4 * LORA_UP_LD + j * 8]);
        }
    }
    const bool vec = N % 8 == 0 && (reinterpret_cast<uintptr_t>(O) & 15) == 0;
    const int64_t n = n0 + wc * 64 + 16 * qt;
    if (n >= N) return;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int rr = rh * 16 + qg + 8 * h;
        if (rr >= rows) continue;
        const int64_t row = r0 + rr;
        float v[16];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            v[2 * j] = oscale * acc[j][2 * h];
            v[2 * j + 1] = oscale * acc[j][2 * h + 1];
        }
        if (BWD && sg.drop)
#pragma unroll
            for (int j = 0; j < 16; j++)
                if (n + j < N) v[j] *= lora_drop(sg, row, n + j);
        lora_add8(O + row * N, n, N, vec, v);
        lora_add8(O + row * N, n + 8, N, vec, v + 8);
    }
}

/* Grad blocks: segment s owns n_chunks * groups * (ceil(in/64) + ceil(out/64)) blocks from its
 * tile0: chunk-major, then rank group, then the dA column tiles, then the dB ones.
 * dA^T (in x r) = Xd^T dU and dB (out x r) = s dY^T U are tf32 mma products with the chunk's
 * batch rows as K, 8 rows a step: the block's 64 columns as 4 m-tiles and the group's 16 ranks
 * as 2 n-tiles; its 4 warps take every 4th step of the chunk's rows (warp w: steps w, w + 4, ...),
 * so a 2048-row segment of a 3584-wide module runs 3,584 warps (v4: 896 warps walking all the
 * chunk's rows), and then add their sums through shared memory in warp order (warp i adds m-tile
 * i of all four). Lane (g, t) loads columns 8g..8g+7 of the step's rows t and t + 4 (16 bytes
 * each; m-tile i's "g" is column 8g + 2i, its "g + 8" column 8g + 2i + 1) and ranks g and 8 + g
 * of U / dU for the same rows. LoRA dropout (dA) zeroes dropped elements of X and scales the sums
 * by 1/(1-p) once, as the down kernel. The chunk's sums go to f32 partials (scratch slot 7) in
 * the layouts of dA (r, in) and dB (out, r). The summation order is a function of the row's
 * offset in its segment alone (fused == alone). */
/* 4 blocks an SM: at most 128 registers (no spills; left alone nvcc 13 takes 152, 3 blocks). */
__global__ void __launch_bounds__(LORA_GRAD_THREADS, 4) lora_grad_kernel(lora_params p)
{
    /* [warp][m-tile][n-tile x fragment][lane]: conflict-free stores and loads */
    __shared__ float sums[LORA_GRAD_WARPS][4][8][32];
    const lora_seg_d sg = p.seg[lora_find_seg(p, blockIdx.x)];
    const int r = sg.rank, groups = lora_rank_groups(r), t = threadIdx.x;
    const int warp = t / 32, lane = t % 32, qg = lane >> 2, qt = lane & 3;
    const int a_tiles = (int)((p.in + LORA_GRAD_COLS - 1) / LORA_GRAD_COLS);
    const int tiles = lora_grad_col_tiles(p);
    const int local = blockIdx.x - sg.tile0, chunk = local / (groups * tiles);
    const int g = local / tiles % groups;
    int tile = local % tiles;
    const bool is_a = tile < a_tiles;
    if (!is_a) tile -= a_tiles;
    const int rg = r - g * LORA_RG < LORA_RG ? r - g * LORA_RG : LORA_RG;
    const int64_t row_lo = sg.row_begin + chunk * sg.chunk_rows;
    const int64_t row_hi =
        row_lo + sg.chunk_rows < sg.row_end ? row_lo + sg.chunk_rows : sg.row_end;
    /* dA: L = dU (rows, r), R = Xd (rows, in). dB: L = U, R = dY (rows, out). */
    const float *L = (is_a ? p.du : p.u) + g * LORA_RG;
    const __nv_bfloat16 *R = is_a ? p.x : p.dy;
    const int64_t rcols = is_a ? p.in : p.out;
    const bool vec = rcols % 8 == 0 && (reinterpret_cast<uintptr_t>(R) & 15) == 0;
    const int64_t col = (int64_t)tile * LORA_GRAD_COLS + 8 * qg;
    const bool drop = is_a && sg.drop;
    const bool rank_lo = qg < rg, rank_hi = 8 + qg < rg, two = rg > 8;
    float acc[4][2][4] = {}; /* m-tiles x n-tiles x fragment */
#pragma unroll 2
    for (int64_t sub = row_lo + 8 * warp; sub < row_hi; sub += 8 * LORA_GRAD_WARPS) {
        const int64_t ra = sub + qt, rb = sub + qt + 4;
        const bool in_a = ra < row_hi, in_b = rb < row_hi;
        float xa[8], xb[8];
        lora_load_masked8(sg, R, rcols, ra, in_a, col, rcols, vec, drop, xa);
        lora_load_masked8(sg, R, rcols, rb, in_b, col, rcols, vec, drop, xb);
        const uint32_t la0 = in_a && rank_lo ? lora_tf32(L[ra * p.u_ld + qg]) : 0u;
        const uint32_t lb0 = in_b && rank_lo ? lora_tf32(L[rb * p.u_ld + qg]) : 0u;
        const uint32_t la1 = in_a && rank_hi ? lora_tf32(L[ra * p.u_ld + 8 + qg]) : 0u;
        const uint32_t lb1 = in_b && rank_hi ? lora_tf32(L[rb * p.u_ld + 8 + qg]) : 0u;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            /* bf16 values are exact tf32: their f32 bits are the operand */
            const uint32_t a[4] = {__float_as_uint(xa[2 * i]), __float_as_uint(xa[2 * i + 1]),
                                   __float_as_uint(xb[2 * i]), __float_as_uint(xb[2 * i + 1])};
            lora_mma(acc[i][0], a, la0, lb0);
            if (two) lora_mma(acc[i][1], a, la1, lb1);
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int e = 0; e < 8; e++)
            sums[warp][i][e][lane] = acc[i][e / 4][e % 4];
    __syncthreads();
    /* warp w finishes m-tile w: columns col + 2w and col + 2w + 1 */
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; e++) {
        v[e] = sums[0][warp][e][lane];
#pragma unroll
        for (int w = 1; w < LORA_GRAD_WARPS; w++)
            v[e] += sums[w][warp][e][lane];
    }
    const float s = drop ? sg.keep_scale : 1.0f;
    float *part = p.part + sg.part0 + (int64_t)chunk * r * (p.in + p.out);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int64_t n = col + 2 * warp + h;
        if (n >= rcols) continue;
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int f = 0; f < 2; f++) {
                const int c = nt * 8 + 2 * qt + f;
                if (c >= rg) continue;
                const int64_t rc = g * LORA_RG + c;
                const float o = s * v[nt * 4 + 2 * h + f];
                if (is_a)
                    part[rc * p.in + n] = o;
                else
                    part[(int64_t)r * p.in + n * r + rc] = o;
            }
    }
}

/* Host: the launch layouts of p's segments (already packed with their row ranges): each sets
 * every segment's tile0 and p->n_blocks for one kernel (lora_plan_down_rows: row tiles of `rows`;
 * lora_plan_down: this version's). */
static inline void lora_plan_down_rows(lora_params *p, bool bwd, int rows)
{
    const int64_t K = bwd ? p->out : p->in;
    p->k_slice = tdm_cuda_lora_k_slice(K);
    p->k_slices = (int)tdm_cuda_lora_k_slices(K);
    int blocks = 0;
    for (int i = 0; i < p->n_segs; i++) {
        lora_seg_d *d = &p->seg[i];
        d->tile0 = blocks;
        int64_t tiles = (d->row_end - d->row_begin + rows - 1) / rows;
        blocks += (int)(tiles * p->k_slices * lora_rank_groups(d->rank));
    }
    p->n_blocks = blocks;
}
static inline void lora_plan_down(lora_params *p, bool bwd)
{
    lora_plan_down_rows(p, bwd, LORA_DOWN_ROWS);
}
static inline void lora_plan_up(lora_params *p, bool bwd)
{
    const int ctiles = lora_up_col_tiles(*p, bwd);
    int blocks = 0;
    for (int i = 0; i < p->n_segs; i++) {
        lora_seg_d *d = &p->seg[i];
        d->tile0 = blocks;
        blocks += (int)((d->row_end - d->row_begin + LORA_UP_ROWS - 1) / LORA_UP_ROWS) * ctiles;
    }
    p->n_blocks = blocks;
}
/* The grad kernel's layout (tiles column tiles per rank group and chunk), plus chunk rows and
 * count, partial offset and element offset of each segment; sets p->n_elems. Returns the floats
 * of partials needed (p->part must hold them). lora_plan_reduction: this version's tiles. */
static inline int64_t lora_plan_reduction_tiles(lora_params *p, int tiles)
{
    int64_t part = 0, elems = 0;
    int blocks = 0;
    for (int i = 0; i < p->n_segs; i++) {
        lora_seg_d *d = &p->seg[i];
        int64_t R = d->row_end - d->row_begin;
        d->chunk_rows = tdm_cuda_lora_red_chunk_rows(R);
        d->n_chunks = (int)tdm_cuda_lora_red_chunks(R);
        d->part0 = part;
        d->elem0 = elems;
        d->tile0 = blocks;
        part += d->n_chunks * (int64_t)d->rank * (p->in + p->out);
        elems += (int64_t)d->rank * (p->in + p->out);
        blocks += d->n_chunks * lora_rank_groups(d->rank) * tiles;
    }
    p->n_blocks = blocks;
    p->n_elems = elems;
    return part;
}
static inline int64_t lora_plan_reduction(lora_params *p)
{
    return lora_plan_reduction_tiles(p, lora_grad_col_tiles(*p));
}

/* One thread per element of every segment's dA and dB (p.n_elems): the chunks' partials summed in
 * chunk order, then accumulated into da / db (dB scaled). */
__global__ void lora_red_finish_kernel(lora_params p)
{
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < p.n_elems;
         e += (int64_t)gridDim.x * blockDim.x) {
        int s = 0;
        while (s + 1 < p.n_segs && p.seg[s + 1].elem0 <= e)
            s++;
        const lora_seg_d &sg = p.seg[s];
        const int64_t i = e - sg.elem0, stride = (int64_t)sg.rank * (p.in + p.out);
        const float *part = p.part + sg.part0 + i;
        float sum = 0.0f;
        for (int c = 0; c < sg.n_chunks; c++)
            sum += part[c * stride];
        const int64_t na = (int64_t)sg.rank * p.in;
        if (i < na)
            sg.da[i] += sum;
        else
            sg.db[i - na] += sg.scale * sum;
    }
}

#endif
