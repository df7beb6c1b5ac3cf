/* lora_v3.cuh — the down, up and grad kernels of the segmented LoRA shipped from 2026-12-01 (d058f69)
 * to 2026-12-05, kept for dev/cuda/lora.cu only: the baseline the shipped tensor-core kernels
 * (src/engine/cuda/lora.cuh, v4) are validated and timed against in the same run. CUDA-core f32
 * FMAs: down = 32 rows (8 warps x 4 rows) x 16 ranks x one K slice per block, the warp's 4 x 16
 * sums folded by a reduce-scatter butterfly (178 registers: one block per SM); up = 32 rows x
 * 256 columns, lane l on columns 4l..4l+3 and 128+4l..+3; grad = 128 columns x 16 ranks x a row
 * chunk per block, 4 warps taking every 4th row, added up in warp order. The finish kernel, the
 * parameters and lora_plan_up are lora.cuh's (the same in both versions); the 4-wide load and
 * dropout helpers only v3 uses live here.
 * Everything is in namespace lora_v3 with macros prefixed V3_ so both versions build together.
 */
#ifndef TANDEM_DEV_CUDA_LORA_V3_CUH
#define TANDEM_DEV_CUDA_LORA_V3_CUH
#include <cuda_bf16.h>
#include <stdint.h>

#include "engine/cuda/cuda_memory_plan.h"
#include "engine/cuda/lora.cuh"
#include "engine/dropout.h"

namespace lora_v3 {
#define V3_LORA_THREADS 256
#define V3_LORA_DOWN_ROWS 32  /* 8 warps x 4 rows */
#define V3_LORA_DOWN_KSUB 512 /* K staged in shared memory at a time */
#define V3_LORA_DOWN_LD (V3_LORA_DOWN_KSUB + 4)
#define V3_LORA_UP_ROWS 32 /* 8 warps x 4 rows */
#define V3_LORA_UP_COLS 256
#define V3_LORA_UP_LD (V3_LORA_UP_COLS + 4)
#define V3_LORA_GRAD_THREADS 128
#define V3_LORA_GRAD_COLS 128 /* 32 lanes x 4 columns */
#define V3_LORA_GRAD_SUB 256  /* rows of U / dU staged at a time */

/* v[j] *= the dropout factor of (row, k + j) for the columns below kmax (4 consecutive elements
 * of a row of X, or of dU A before it is added into dX). */
__device__ __forceinline__ void lora_drop4(const lora_seg_d &sg, int64_t row, int64_t k,
                                           int64_t kmax, float v[4])
{
#pragma unroll
    for (int j = 0; j < 4; j++)
        if (k + j < kmax) v[j] *= lora_drop(sg, row, k + j);
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

template <bool BWD> __global__ void __launch_bounds__(V3_LORA_THREADS) lora_down_kernel(lora_params p)
{
    __shared__ __align__(16) float Ws[LORA_RG * V3_LORA_DOWN_LD]; /* [rank][k] of the slice */
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
    const int64_t row0 = sg.row_begin + (int64_t)tile * V3_LORA_DOWN_ROWS + warp * 4;
    float acc[4 * LORA_RG]; /* [row][rank] */
#pragma unroll
    for (int i = 0; i < 4 * LORA_RG; i++)
        acc[i] = 0.0f;
    for (int64_t kb = k_lo; kb < k_hi; kb += V3_LORA_DOWN_KSUB) {
        const int kl = (int)(k_hi - kb < V3_LORA_DOWN_KSUB ? k_hi - kb : V3_LORA_DOWN_KSUB);
        __syncthreads();
        /* W(c, k): A[c][k] (fwd, rows of A contiguous) or B[k][c] (bwd, rows of B contiguous) */
        for (int i = t; i < LORA_RG * V3_LORA_DOWN_KSUB; i += V3_LORA_THREADS) {
            int c, kk;
            if (BWD)
                kk = i / LORA_RG, c = i % LORA_RG;
            else
                c = i / V3_LORA_DOWN_KSUB, kk = i % V3_LORA_DOWN_KSUB;
            float w = 0.0f;
            if (c < rg && kk < kl)
                w = BWD ? sg.b[(kb + kk) * r + g * LORA_RG + c]
                        : sg.a[(int64_t)(g * LORA_RG + c) * K + kb + kk];
            Ws[c * V3_LORA_DOWN_LD + kk] = w;
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
                    *reinterpret_cast<const float4 *>(&Ws[c * V3_LORA_DOWN_LD + k0 + lane * 4]);
                const float4 w1 = *reinterpret_cast<const float4 *>(
                    &Ws[c * V3_LORA_DOWN_LD + k0 + 128 + lane * 4]);
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

template <bool BWD> __global__ void __launch_bounds__(V3_LORA_THREADS) lora_up_kernel(lora_params p)
{
    __shared__ __align__(16) float Ls[LORA_MAX_RANK * V3_LORA_UP_ROWS]; /* [rank][row] */
    __shared__ __align__(16) float Ws[LORA_RG * V3_LORA_UP_LD];         /* [rank][col] */
    const lora_seg_d sg = p.seg[lora_find_seg(p, blockIdx.x)];
    const int r = sg.rank, t = threadIdx.x, warp = t / 32, lane = t % 32;
    const int ctiles = lora_up_col_tiles(p, BWD);
    const int local = blockIdx.x - sg.tile0, tile = local / ctiles, ct = local % ctiles;
    const int64_t r0 = sg.row_begin + (int64_t)tile * V3_LORA_UP_ROWS;
    const int rows = (int)(sg.row_end - r0 < V3_LORA_UP_ROWS ? sg.row_end - r0 : V3_LORA_UP_ROWS);
    /* L = (the down slices' partials summed in slice order) x (s in the bwd: dU = s dY B) */
    float *l_out = BWD ? p.du : p.u;
    const int64_t slice_stride = p.m * p.u_ld;
    for (int i = t; i < r * V3_LORA_UP_ROWS; i += V3_LORA_THREADS) {
        const int rr = i / r, c = i % r;
        float v = 0.0f;
        if (rr < rows) {
            const float *src = p.ws + (r0 + rr) * p.u_ld + c;
            for (int s = 0; s < p.k_slices; s++)
                v += src[s * slice_stride];
            if (BWD) v *= sg.scale;
            if (ct == 0) l_out[(r0 + rr) * p.u_ld + c] = v;
        }
        Ls[c * V3_LORA_UP_ROWS + rr] = v;
    }
    __nv_bfloat16 *O = BWD ? p.dx : p.y;
    const int64_t N = BWD ? p.in : p.out;
    if (!O || N == 0) return;
    const float oscale = BWD ? 1.0f : sg.scale;
    const int64_t n0 = (int64_t)ct * V3_LORA_UP_COLS;
    float acc[4][8]; /* rows 4 warp + 0..3 x columns (4 lane + 0..3, 128 + 4 lane + 0..3) */
#pragma unroll
    for (int rr = 0; rr < 4; rr++)
#pragma unroll
        for (int j = 0; j < 8; j++)
            acc[rr][j] = 0.0f;
    for (int c0 = 0; c0 < r; c0 += LORA_RG) {
        __syncthreads();
        /* W(c, n): B[n][c] (fwd: Y += s U B^T) or A[c][n] (bwd: dX += dU A) */
        for (int i = t; i < LORA_RG * V3_LORA_UP_COLS; i += V3_LORA_THREADS) {
            int c, nn;
            if (BWD)
                c = i / V3_LORA_UP_COLS, nn = i % V3_LORA_UP_COLS;
            else
                nn = i / LORA_RG, c = i % LORA_RG;
            float w = 0.0f;
            if (c0 + c < r && n0 + nn < N)
                w = BWD ? sg.a[(int64_t)(c0 + c) * N + n0 + nn] : sg.b[(n0 + nn) * r + c0 + c];
            Ws[c * V3_LORA_UP_LD + nn] = w;
        }
        __syncthreads();
        const int cn = r - c0 < LORA_RG ? r - c0 : LORA_RG;
#pragma unroll 4
        for (int c = 0; c < cn; c++) {
            const float4 l =
                *reinterpret_cast<const float4 *>(&Ls[(c0 + c) * V3_LORA_UP_ROWS + warp * 4]);
            const float4 w0 = *reinterpret_cast<const float4 *>(&Ws[c * V3_LORA_UP_LD + lane * 4]);
            const float4 w1 =
                *reinterpret_cast<const float4 *>(&Ws[c * V3_LORA_UP_LD + 128 + lane * 4]);
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

static inline void lora_plan_down(lora_params *p, bool bwd)
{
    ::lora_plan_down_rows(p, bwd, V3_LORA_DOWN_ROWS);
}
__host__ __device__ __forceinline__ int v3_grad_col_tiles(const lora_params &p)
{
    return (int)((p.in + V3_LORA_GRAD_COLS - 1) / V3_LORA_GRAD_COLS +
                 (p.out + V3_LORA_GRAD_COLS - 1) / V3_LORA_GRAD_COLS);
}

/* Grad blocks: segment s owns n_chunks * groups * (ceil(in/128) + ceil(out/128)) blocks from its
 * tile0: chunk-major, then rank group, then the dA column tiles, then the dB ones. */
__global__ void __launch_bounds__(V3_LORA_GRAD_THREADS) lora_grad_kernel(lora_params p)
{
    __shared__ __align__(16) float Ls[V3_LORA_GRAD_SUB * LORA_RG]; /* [row][rank] */
    __shared__ float Red[(V3_LORA_GRAD_THREADS / 32 - 1) * 4 * LORA_RG * 32]; /* warps 1.. */
    const lora_seg_d sg = p.seg[lora_find_seg(p, blockIdx.x)];
    const int r = sg.rank, groups = lora_rank_groups(r), t = threadIdx.x;
    const int warp = t / 32, lane = t % 32;
    const int a_tiles = (int)((p.in + V3_LORA_GRAD_COLS - 1) / V3_LORA_GRAD_COLS);
    const int tiles = v3_grad_col_tiles(p);
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
    const int64_t col = (int64_t)tile * V3_LORA_GRAD_COLS + lane * 4;
    float acc[LORA_RG * 4]; /* [rank][column] */
#pragma unroll
    for (int i = 0; i < LORA_RG * 4; i++)
        acc[i] = 0.0f;
    for (int64_t sub = row_lo; sub < row_hi; sub += V3_LORA_GRAD_SUB) {
        const int ns = (int)(row_hi - sub < V3_LORA_GRAD_SUB ? row_hi - sub : V3_LORA_GRAD_SUB);
        __syncthreads();
        for (int i = t; i < V3_LORA_GRAD_SUB * LORA_RG; i += V3_LORA_GRAD_THREADS) {
            const int rr = i / LORA_RG, c = i % LORA_RG;
            Ls[i] = rr < ns && c < rg ? L[(sub + rr) * p.u_ld + g * LORA_RG + c] : 0.0f;
        }
        __syncthreads();
        if (col >= rcols) continue;
#pragma unroll 2
        for (int rr = warp; rr < ns; rr += V3_LORA_GRAD_THREADS / 32) {
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
    for (int w = 0; w < V3_LORA_GRAD_THREADS / 32 - 1; w++)
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

static inline int64_t lora_plan_reduction(lora_params *p)
{
    return ::lora_plan_reduction_tiles(p, v3_grad_col_tiles(*p));
}

} /* namespace lora_v3 */

#endif
