/* lora.cuh — segmented LoRA over the fused multi-adapter batch (device code only; included by
 * cuda_train.cu and dev/cuda/lora.cu).
 *
 * The batch's rows are cut into segments, one per adapter, each with its own A (r, in), B (out, r)
 * f32 and scale s. The segment table travels by value in the kernel parameters (no upload, no
 * host synchronization), and every launch covers all segments (<= LORA_MAX_SEGS per launch).
 *
 * Four kernels (v3, dev/cuda/lora.cu; v2, which walked all of K in one block per 16 rows, was
 * latency bound at 0.43 ms per 7B q_proj backward):
 *   lora_down_kernel<BWD>  the product down to the rank: U = Xd A^T (fwd) or dU = dY B (bwd),
 *                          K = in or out. Block = 32 rows (8 warps x 4 rows) x 16 ranks x one K
 *                          slice (tdm_cuda_lora_k_slice, cuda_memory_plan.h: <= 16 slices of
 *                          >= 512); the slice's W staged in shared memory; lane l covers
 *                          k = 4l..4l+3 and 128+4l..+3 of every 256 (8-byte X loads, conflict-free
 *                          float4 W loads), 4 x 16 sums per lane, folded across the warp by a
 *                          reduce-scatter butterfly (62 shuffles for 64 sums). Each slice's sums
 *                          go to its own f32 (m, u_ld) block of p.ws.
 *   lora_up_kernel<BWD>    the product up from the rank: Y += s U B^T (fwd) or dX += dU A
 *                          (bwd). Block = 32 rows x 256 columns; first the slices' partials of
 *                          its rows are added in slice order (x s in the bwd), and the blocks of
 *                          column tile 0 write the result to u (fwd) / du (bwd); then lane l
 *                          covers columns 4l..4l+3 and 128+4l..+3 of 4 rows over all ranks.
 *   lora_grad_kernel       dA = dU^T Xd (r, in) and dB = s (dY^T U) (out, r): block = 128
 *                          columns x 16 ranks x one chunk of a segment's rows
 *                          (tdm_cuda_lora_red_chunk_rows: <= 16 chunks of >= 256 rows); the 4
 *                          warps take every 4th row, then add up in warp order; the chunk's
 *                          sums go to f32 partials (scratch slot 7).
 *   lora_red_finish_kernel per element of dA / dB: the chunks' partials added in chunk order,
 *                          then dA += sum, dB += s sum.
 * Every output element has one owner thread and a fixed summation order: no atomics, the same
 * bits on every run. X, Y, dY, dX are bf16 (act), everything else f32; products accumulate in
 * f32. fwd = down<false> + up<false>; bwd = down<true> + up<true> + grad + finish.
 * LoRA dropout (a segment with drop set): the mask of engine/dropout.h is applied where X is
 * loaded, as x * (keep ? 1/(1-p) : 0) with the row counted from the segment's start (down<false>
 * and grad's dA), and to dU A before it is added into dX (up<true>); nothing is stored, no copy
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
#define LORA_THREADS 256
#define LORA_DOWN_ROWS 32  /* 8 warps x 4 rows */
#define LORA_DOWN_KSUB 512 /* K staged in shared memory at a time */
#define LORA_DOWN_LD (LORA_DOWN_KSUB + 4)
#define LORA_UP_ROWS 32 /* 8 warps x 4 rows */
#define LORA_UP_COLS 256
#define LORA_UP_LD (LORA_UP_COLS + 4)
#define LORA_GRAD_THREADS 128
#define LORA_GRAD_COLS 128 /* 32 lanes x 4 columns */
#define LORA_GRAD_SUB 256  /* rows of U / dU staged at a time */

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

/* v[j] *= the dropout factor of (row, k + j) for the columns below kmax (4 consecutive elements
 * of a row of X, or of dU A before it is added into dX). */
__device__ __forceinline__ void lora_drop4(const lora_seg_d &sg, int64_t row, int64_t k,
                                           int64_t kmax, float v[4])
{
#pragma unroll
    for (int j = 0; j < 4; j++)
        if (k + j < kmax) v[j] *= lora_drop(sg, row, k + j);
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

/* 4 consecutive bf16 of a row as f32, zero at and past kmax; vec: 8-byte aligned (one load). */
__device__ __forceinline__ void lora_load4(const __nv_bfloat16 *row, int64_t k, int64_t kmax,
                                           bool vec, float v[4])
{
    if (vec && k + 4 <= kmax) {
        uint2 q = *reinterpret_cast<const uint2 *>(row + k);
        float2 lo = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&q.x));
        float2 hi = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&q.y));
        v[0] = lo.x, v[1] = lo.y, v[2] = hi.x, v[3] = hi.y;
        return;
    }
#pragma unroll
    for (int j = 0; j < 4; j++)
        v[j] = k + j < kmax ? __bfloat162float(row[k + j]) : 0.0f;
}

/* row[k..k+3] += v (bf16, rounded once), only the columns below kmax. */
__device__ __forceinline__ void lora_add4(__nv_bfloat16 *row, int64_t k, int64_t kmax, bool vec,
                                          const float v[4])
{
    if (vec && k + 4 <= kmax) {
        uint2 q = *reinterpret_cast<uint2 *>(row + k);
        float2 lo = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&q.x));
        float2 hi = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&q.y));
        __nv_bfloat162 a = __floats2bfloat162_rn(lo.x + v[0], lo.y + v[1]);
        __nv_bfloat162 b = __floats2bfloat162_rn(hi.x + v[2], hi.y + v[3]);
        q.x = *reinterpret_cast<uint32_t *>(&a);
        q.y = *reinterpret_cast<uint32_t *>(&b);
        *reinterpret_cast<uint2 *>(row + k) = q;
        return;
    }
#pragma unroll
    for (int j = 0; j < 4; j++)
        if (k + j < kmax) row[k + j] = __float2bfloat16_rn(__bfloat162float(row[k + j]) + v[j]);
}

/* One level of the warp's reduce-scatter: the lanes with bit o set keep the upper half of their
 * N sums, the others the lower half, each adding its partner's copy of the half it keeps. After
 * the levels o = 16, 8, 4, 2, 1 over N = 64, lane l holds the warp's totals of sums 2l and 2l+1.
 */
template <int N> __device__ __forceinline__ void lora_halve(float *v, int lane, int o)
{
    const bool up = lane & o;
#pragma unroll
    for (int i = 0; i < N / 2; i++) {
        float send = up ? v[i] : v[i + N / 2];
        float keep = up ? v[i + N / 2] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
    }
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

template <bool BWD> __global__ void __launch_bounds__(LORA_THREADS) lora_down_kernel(lora_params p)
{
    __shared__ __align__(16) float Ws[LORA_RG * LORA_DOWN_LD]; /* [rank][k] of the slice */
    const lora_seg_d sg = p.seg[lora_find_seg(p, blockIdx.x)];
    const int r = sg.rank, groups = lora_rank_groups(r), t = threadIdx.x;
    const int warp = t / 32, lane = t % 32;
    const int local = blockIdx.x - sg.tile0, g = local % groups;
    const int slice = (local / groups) % p.k_slices, tile = local / groups / p.k_slices;
    const int rg = r - g * LORA_RG < LORA_RG ? r - g * LORA_RG : LORA_RG; /* ranks in the group */
    const int64_t K = BWD ? p.out : p.in;
    const __nv_bfloat16 *M = BWD ? p.dy : p.x;
    const bool vec = K % 4 == 0 && (reinterpret_cast<uintptr_t>(M) & 7) == 0;
    const int64_t k_lo = (int64_t)slice * p.k_slice;
    const int64_t k_hi = k_lo + p.k_slice < K ? k_lo + p.k_slice : K;
    const int64_t row0 = sg.row_begin + (int64_t)tile * LORA_DOWN_ROWS + warp * 4;
    float acc[4 * LORA_RG]; /* [row][rank] */
#pragma unroll
    for (int i = 0; i < 4 * LORA_RG; i++)
        acc[i] = 0.0f;
    for (int64_t kb = k_lo; kb < k_hi; kb += LORA_DOWN_KSUB) {
        const int kl = (int)(k_hi - kb < LORA_DOWN_KSUB ? k_hi - kb : LORA_DOWN_KSUB);
        __syncthreads();
        /* W(c, k): A[c][k] (fwd, rows of A contiguous) or B[k][c] (bwd, rows of B contiguous) */
        for (int i = t; i < LORA_RG * LORA_DOWN_KSUB; i += LORA_THREADS) {
            int c, kk;
            if (BWD)
                kk = i / LORA_RG, c = i % LORA_RG;
            else
                c = i / LORA_DOWN_KSUB, kk = i % LORA_DOWN_KSUB;
            float w = 0.0f;
            if (c < rg && kk < kl)
                w = BWD ? sg.b[(kb + kk) * r + g * LORA_RG + c]
                        : sg.a[(int64_t)(g * LORA_RG + c) * K + kb + kk];
            Ws[c * LORA_DOWN_LD + kk] = w;
        }
        __syncthreads();
        for (int k0 = 0; k0 < kl; k0 += 256) {
            float xv[4][8]; /* 4 rows x (k0 + 4 lane + 0..3, k0 + 128 + 4 lane + 0..3) */
#pragma unroll
            for (int rr = 0; rr < 4; rr++) {
                const int64_t row = row0 + rr;
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int64_t k = kb + k0 + h * 128 + lane * 4;
                    if (row < sg.row_end)
                        lora_load4(M + row * K, k, k_hi, vec, &xv[rr][4 * h]);
                    else
                        xv[rr][4 * h] = xv[rr][4 * h + 1] = xv[rr][4 * h + 2] =
                            xv[rr][4 * h + 3] = 0.0f;
                    if (!BWD && sg.drop && row < sg.row_end)
                        lora_drop4(sg, row, k, k_hi, &xv[rr][4 * h]);
                }
            }
#pragma unroll
            for (int c = 0; c < LORA_RG; c++) {
                const float4 w0 =
                    *reinterpret_cast<const float4 *>(&Ws[c * LORA_DOWN_LD + k0 + lane * 4]);
                const float4 w1 = *reinterpret_cast<const float4 *>(
                    &Ws[c * LORA_DOWN_LD + k0 + 128 + lane * 4]);
#pragma unroll
                for (int rr = 0; rr < 4; rr++) {
                    float s = acc[rr * LORA_RG + c];
                    s = fmaf(xv[rr][0], w0.x, s);
                    s = fmaf(xv[rr][1], w0.y, s);
                    s = fmaf(xv[rr][2], w0.z, s);
                    s = fmaf(xv[rr][3], w0.w, s);
                    s = fmaf(xv[rr][4], w1.x, s);
                    s = fmaf(xv[rr][5], w1.y, s);
                    s = fmaf(xv[rr][6], w1.z, s);
                    s = fmaf(xv[rr][7], w1.w, s);
                    acc[rr * LORA_RG + c] = s;
                }
            }
        }
    }
    lora_halve<64>(acc, lane, 16);
    lora_halve<32>(acc, lane, 8);
    lora_halve<16>(acc, lane, 4);
    lora_halve<8>(acc, lane, 2);
    lora_halve<4>(acc, lane, 1);
    /* lane holds sums 2 lane, 2 lane + 1: row lane / 8, ranks 2 (lane % 8) + 0, 1 */
    const int64_t row = row0 + lane / 8;
    if (row >= sg.row_end) return;
    float *dst = p.ws + (int64_t)slice * p.m * p.u_ld + row * p.u_ld + g * LORA_RG;
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int c = 2 * (lane % 8) + j;
        if (c < rg) dst[c] = acc[j];
    }
}

template <bool BWD> __global__ void __launch_bounds__(LORA_THREADS) lora_up_kernel(lora_params p)
{
    __shared__ __align__(16) float Ls[LORA_MAX_RANK * LORA_UP_ROWS]; /* [rank][row] */
    __shared__ __align__(16) float Ws[LORA_RG * LORA_UP_LD];         /* [rank][col] */
    const lora_seg_d sg = p.seg[lora_find_seg(p, blockIdx.x)];
    const int r = sg.rank, t = threadIdx.x, warp = t / 32, lane = t % 32;
    const int ctiles = lora_up_col_tiles(p, BWD);
    const int local = blockIdx.x - sg.tile0, tile = local / ctiles, ct = local % ctiles;
    const int64_t r0 = sg.row_begin + (int64_t)tile * LORA_UP_ROWS;
    const int rows = (int)(sg.row_end - r0 < LORA_UP_ROWS ? sg.row_end - r0 : LORA_UP_ROWS);
    /* L = (the down slices' partials summed in slice order) x (s in the bwd: dU = s dY B) */
    float *l_out = BWD ? p.du : p.u;
    const int64_t slice_stride = p.m * p.u_ld;
    for (int i = t; i < r * LORA_UP_ROWS; i += LORA_THREADS) {
        const int rr = i / r, c = i % r;
        float v = 0.0f;
        if (rr < rows) {
            const float *src = p.ws + (r0 + rr) * p.u_ld + c;
            for (int s = 0; s < p.k_slices; s++)
                v += src[s * slice_stride];
            if (BWD) v *= sg.scale;
            if (ct == 0) l_out[(r0 + rr) * p.u_ld + c] = v;
        }
        Ls[c * LORA_UP_ROWS + rr] = v;
    }
    __nv_bfloat16 *O = BWD ? p.dx : p.y;
    const int64_t N = BWD ? p.in : p.out;
    if (!O || N == 0) return;
    const float oscale = BWD ? 1.0f : sg.scale;
    const int64_t n0 = (int64_t)ct * LORA_UP_COLS;
    float acc[4][8]; /* rows 4 warp + 0..3 x columns (4 lane + 0..3, 128 + 4 lane + 0..3) */
#pragma unroll
    for (int rr = 0; rr < 4; rr++)
#pragma unroll
        for (int j = 0; j < 8; j++)
            acc[rr][j] = 0.0f;
    for (int c0 = 0; c0 < r; c0 += LORA_RG) {
        __syncthreads();
        /* W(c, n): B[n][c] (fwd: Y += s U B^T) or A[c][n] (bwd: dX += dU A) */
        for (int i = t; i < LORA_RG * LORA_UP_COLS; i += LORA_THREADS) {
            int c, nn;
            if (BWD)
                c = i / LORA_UP_COLS, nn = i % LORA_UP_COLS;
            else
                nn = i / LORA_RG, c = i % LORA_RG;
            float w = 0.0f;
            if (c0 + c < r && n0 + nn < N)
                w = BWD ? sg.a[(int64_t)(c0 + c) * N + n0 + nn] : sg.b[(n0 + nn) * r + c0 + c];
            Ws[c * LORA_UP_LD + nn] = w;
        }
        __syncthreads();
        const int cn = r - c0 < LORA_RG ? r - c0 : LORA_RG;
#pragma unroll 4
        for (int c = 0; c < cn; c++) {
            const float4 l =
                *reinterpret_cast<const float4 *>(&Ls[(c0 + c) * LORA_UP_ROWS + warp * 4]);
            const float4 w0 = *reinterpret_cast<const float4 *>(&Ws[c * LORA_UP_LD + lane * 4]);
            const float4 w1 =
                *reinterpret_cast<const float4 *>(&Ws[c * LORA_UP_LD + 128 + lane * 4]);
            const float lr[4] = {l.x, l.y, l.z, l.w};
#pragma unroll
            for (int rr = 0; rr < 4; rr++) {
                acc[rr][0] = fmaf(lr[rr], w0.x, acc[rr][0]);
                acc[rr][1] = fmaf(lr[rr], w0.y, acc[rr][1]);
                acc[rr][2] = fmaf(lr[rr], w0.z, acc[rr][2]);
                acc[rr][3] = fmaf(lr[rr], w0.w, acc[rr][3]);
                acc[rr][4] = fmaf(lr[rr], w1.x, acc[rr][4]);
                acc[rr][5] = fmaf(lr[rr], w1.y, acc[rr][5]);
                acc[rr][6] = fmaf(lr[rr], w1.z, acc[rr][6]);
                acc[rr][7] = fmaf(lr[rr], w1.w, acc[rr][7]);
            }
        }
    }
    const bool vec = N % 4 == 0 && (reinterpret_cast<uintptr_t>(O) & 7) == 0;
#pragma unroll
    for (int rr = 0; rr < 4; rr++) {
        if (warp * 4 + rr >= rows) break;
        const int64_t row = r0 + warp * 4 + rr;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t n = n0 + h * 128 + lane * 4;
            if (n >= N) continue;
            float v[4];
#pragma unroll
            for (int j = 0; j < 4; j++)
                v[j] = oscale * acc[rr][4 * h + j];
            if (BWD && sg.drop) lora_drop4(sg, row, n, N, v);
            lora_add4(O + row * N, n, N, vec, v);
        }
    }
}

/* Grad blocks: segment s owns n_chunks * groups * (ceil(in/128) + ceil(out/128)) blocks from its
 * tile0: chunk-major, then rank group, then the dA column tiles, then the dB ones. */
__global__ void __launch_bounds__(LORA_GRAD_THREADS) lora_grad_kernel(lora_params p)
{
    __shared__ __align__(16) float Ls[LORA_GRAD_SUB * LORA_RG]; /* [row][rank] */
    __shared__ float Red[(LORA_GRAD_THREADS / 32 - 1) * 4 * LORA_RG * 32]; /* warps 1.. */
    const lora_seg_d sg = p.seg[lora_find_seg(p, blockIdx.x)];
    const int r = sg.rank, groups = lora_rank_groups(r), t = threadIdx.x;
    const int warp = t / 32, lane = t % 32;
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
    /* dA (r, in): L = dU (rows, r), R = Xd (rows, in). dB (out, r): L = U, R = dY (rows, out). */
    const float *L = is_a ? p.du : p.u;
    const __nv_bfloat16 *R = is_a ? p.x : p.dy;
    const int64_t rcols = is_a ? p.in : p.out;
    const bool vec = rcols % 4 == 0 && (reinterpret_cast<uintptr_t>(R) & 7) == 0;
    const int64_t col = (int64_t)tile * LORA_GRAD_COLS + lane * 4;
    float acc[LORA_RG * 4]; /* [rank][column] */
#pragma unroll
    for (int i = 0; i < LORA_RG * 4; i++)
        acc[i] = 0.0f;
    for (int64_t sub = row_lo; sub < row_hi; sub += LORA_GRAD_SUB) {
        const int ns = (int)(row_hi - sub < LORA_GRAD_SUB ? row_hi - sub : LORA_GRAD_SUB);
        __syncthreads();
        for (int i = t; i < LORA_GRAD_SUB * LORA_RG; i += LORA_GRAD_THREADS) {
            const int rr = i / LORA_RG, c = i % LORA_RG;
            Ls[i] = rr < ns && c < rg ? L[(sub + rr) * p.u_ld + g * LORA_RG + c] : 0.0f;
        }
        __syncthreads();
        if (col >= rcols) continue;
#pragma unroll 2
        for (int rr = warp; rr < ns; rr += LORA_GRAD_THREADS / 32) {
            const int64_t row = sub + rr;
            float rv[4];
            lora_load4(R + row * rcols, col, rcols, vec, rv);
            if (is_a && sg.drop) lora_drop4(sg, row, col, rcols, rv);
#pragma unroll
            for (int c4 = 0; c4 < LORA_RG / 4; c4++) {
                const float4 l = *reinterpret_cast<const float4 *>(&Ls[rr * LORA_RG + 4 * c4]);
                const float lc[4] = {l.x, l.y, l.z, l.w};
#pragma unroll
                for (int q = 0; q < 4; q++)
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        acc[(4 * c4 + q) * 4 + j] = fmaf(lc[q], rv[j], acc[(4 * c4 + q) * 4 + j]);
            }
        }
    }
    /* the warps' sums added in warp order by warp 0 */
    if (warp > 0)
#pragma unroll
        for (int i = 0; i < LORA_RG * 4; i++)
            Red[((warp - 1) * LORA_RG * 4 + i) * 32 + lane] = acc[i];
    __syncthreads();
    if (warp > 0 || col >= rcols) return;
    for (int w = 0; w < LORA_GRAD_THREADS / 32 - 1; w++)
#pragma unroll
        for (int i = 0; i < LORA_RG * 4; i++)
            acc[i] += Red[(w * LORA_RG * 4 + i) * 32 + lane];
    /* partials of this chunk: dA (r, in) then dB (out, r), the layouts of da and db */
    float *part = p.part + sg.part0 + (int64_t)chunk * r * (p.in + p.out);
    for (int c = 0; c < rg; c++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int64_t n = col + j;
            if (n >= rcols) break;
            const int64_t rc = g * LORA_RG + c;
            if (is_a)
                part[rc * p.in + n] = acc[c * 4 + j];
            else
                part[(int64_t)r * p.in + n * r + rc] = acc[c * 4 + j];
        }
}

/* Host: the launch layouts of p's segments (already packed with their row ranges): each sets
 * every segment's tile0 and p->n_blocks for one kernel. */
static inline void lora_plan_down(lora_params *p, bool bwd)
{
    const int64_t K = bwd ? p->out : p->in;
    p->k_slice = tdm_cuda_lora_k_slice(K);
    p->k_slices = (int)tdm_cuda_lora_k_slices(K);
    int blocks = 0;
    for (int i = 0; i < p->n_segs; i++) {
        lora_seg_d *d = &p->seg[i];
        d->tile0 = blocks;
        int64_t tiles = (d->row_end - d->row_begin + LORA_DOWN_ROWS - 1) / LORA_DOWN_ROWS;
        blocks += (int)(tiles * p->k_slices * lora_rank_groups(d->rank));
    }
    p->n_blocks = blocks;
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
/* The grad kernel's layout, plus chunk rows and count, partial offset and element offset of
 * each segment; sets p->n_elems. Returns the floats of partials needed (p->part must hold them). */
static inline int64_t lora_plan_reduction(lora_params *p)
{
    const int tiles = lora_grad_col_tiles(*p);
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
