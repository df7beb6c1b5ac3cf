/* lora_v2.cuh — the segmented LoRA kernels shipped until 2026-12-01 (commit f794dce), kept for
 * dev/cuda/lora.cu only: the baseline the shipped kernels (src/engine/cuda/lora.cuh, v3) are
 * validated and timed against in the same run. Same math; per block 16 rows walking all of K in
 * 64-wide chunks with two barriers each (latency bound: 0.43 ms per 7B q_proj backward).
 * Everything is in namespace lora_v2 with macros prefixed V2_ so both versions build together.
 */
#ifndef TANDEM_DEV_CUDA_LORA_V2_CUH
#define TANDEM_DEV_CUDA_LORA_V2_CUH
#include <cuda_bf16.h>
#include <stdint.h>

#include "engine/cuda/cuda_memory_plan.h"
#include "engine/cuda/lora.cuh"
#include "engine/dropout.h"

namespace lora_v2 {
#define V2_LORA_MAX_SEGS 16 /* per launch; longer tables are split into several launches */
#define V2_LORA_MAX_RANK 128
#define V2_LORA_TM 16 /* rows per block (row kernels) */
#define V2_LORA_KC 64 /* K chunk staged in shared memory */
#define V2_LORA_THREADS 256
#define V2_LORA_RED_COLS 64
#define V2_LORA_RED_ROWS 32

/* The segment descriptor and the dropout factor are the shipped kernels' (the same fields and
 * mask); only the kernels and their parameters differ. */
using ::lora_drop;
using ::lora_seg_d;

struct lora_params {
    lora_seg_d seg[V2_LORA_MAX_SEGS];
    int n_segs, n_blocks;
    const __nv_bfloat16 *x; /* (m, in) */
    __nv_bfloat16 *y;       /* fwd: (m, out) */
    const __nv_bfloat16 *dy;
    __nv_bfloat16 *dx; /* may be NULL */
    float *u;          /* fwd: written; bwd: read. (m, u_ld) */
    float *du;         /* bwd: (m, u_ld) workspace */
    float *part;       /* bwd reduction: per-chunk partial sums of dA, dB */
    int64_t u_ld, in, out;
    int64_t n_elems; /* finish kernel: sum over segments of rank * (in + out) */
};

__device__ __forceinline__ int lora_find_seg(const lora_params &p, int block)
{
    int s = 0;
    while (s + 1 < p.n_segs && p.seg[s + 1].tile0 <= block)
        s++;
    return s;
}

/* Shared memory: Xs [TM][KC] f32, As [MAX_RANK][KC + 1] f32, Us [TM][MAX_RANK] f32. */
#define V2_LORA_FWD_SMEM                                                                              \
    (sizeof(float) * (V2_LORA_TM * V2_LORA_KC + V2_LORA_MAX_RANK * (V2_LORA_KC + 1) + V2_LORA_TM * V2_LORA_MAX_RANK))

__global__ void __launch_bounds__(V2_LORA_THREADS) lora_fwd_kernel(lora_params p)
{
    extern __shared__ __align__(16) float lora_smem[];
    float *Xs = lora_smem;
    float *As = Xs + V2_LORA_TM * V2_LORA_KC;
    float *Us = As + V2_LORA_MAX_RANK * (V2_LORA_KC + 1);
    const lora_seg_d sg = p.seg[lora_find_seg(p, blockIdx.x)];
    const int64_t r0 = sg.row_begin + (int64_t)(blockIdx.x - sg.tile0) * V2_LORA_TM;
    const int rows = (int)(sg.row_end - r0 < V2_LORA_TM ? sg.row_end - r0 : V2_LORA_TM);
    const int r = sg.rank, t = threadIdx.x;
    constexpr int PER = V2_LORA_TM * V2_LORA_MAX_RANK / V2_LORA_THREADS; /* 8 */
    float acc[PER];
#pragma unroll
    for (int q = 0; q < PER; q++)
        acc[q] = 0.0f;
    /* U = X A^T over K = in, in chunks */
    for (int64_t k0 = 0; k0 < p.in; k0 += V2_LORA_KC) {
        int kc = (int)(p.in - k0 < V2_LORA_KC ? p.in - k0 : V2_LORA_KC);
        __syncthreads();
        for (int i = t; i < V2_LORA_TM * V2_LORA_KC; i += V2_LORA_THREADS) {
            int rr = i / V2_LORA_KC, kk = i % V2_LORA_KC;
            float v = 0.0f;
            if (rr < rows && kk < kc) {
                v = __bfloat162float(p.x[(r0 + rr) * p.in + k0 + kk]);
                if (sg.drop) v *= lora_drop(sg, r0 + rr, k0 + kk);
            }
            Xs[i] = v;
        }
        for (int i = t; i < r * V2_LORA_KC; i += V2_LORA_THREADS) {
            int c = i / V2_LORA_KC, kk = i % V2_LORA_KC;
            As[c * (V2_LORA_KC + 1) + kk] = kk < kc ? sg.a[c * p.in + k0 + kk] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int q = 0; q < PER; q++) {
            int o = t + q * V2_LORA_THREADS, rr = o / r, c = o % r;
            if (o >= V2_LORA_TM * r) continue;
            const float *xr = Xs + rr * V2_LORA_KC, *ar = As + c * (V2_LORA_KC + 1);
            float s = acc[q];
            for (int kk = 0; kk < V2_LORA_KC; kk++)
                s = fmaf(xr[kk], ar[kk], s);
            acc[q] = s;
        }
    }
#pragma unroll
    for (int q = 0; q < PER; q++) {
        int o = t + q * V2_LORA_THREADS, rr = o / r, c = o % r;
        if (o >= V2_LORA_TM * r) continue;
        Us[rr * V2_LORA_MAX_RANK + c] = acc[q];
        if (rr < rows) p.u[(r0 + rr) * p.u_ld + c] = acc[q];
    }
    __syncthreads();
    /* Y += scale U B^T: thread = output column, all TM rows */
    for (int64_t c0 = 0; c0 < p.out; c0 += V2_LORA_THREADS) {
        int64_t col = c0 + t;
        if (col >= p.out) break;
        float ys[V2_LORA_TM];
#pragma unroll
        for (int rr = 0; rr < V2_LORA_TM; rr++)
            ys[rr] = 0.0f;
        const float *br = sg.b + col * r;
        for (int k = 0; k < r; k++) {
            float bk = br[k];
#pragma unroll
            for (int rr = 0; rr < V2_LORA_TM; rr++)
                ys[rr] = fmaf(Us[rr * V2_LORA_MAX_RANK + k], bk, ys[rr]);
        }
        for (int rr = 0; rr < rows; rr++) {
            __nv_bfloat16 *yp = p.y + (r0 + rr) * p.out + col;
            *yp = __float2bfloat16_rn(__bfloat162float(*yp) + sg.scale * ys[rr]);
        }
    }
}

/* Shared memory: dYs [TM][KC] f32, Bs [KC][MAX_RANK] f32, dUs [TM][MAX_RANK] f32. */
#define V2_LORA_BWD_ROWS_SMEM                                                                         \
    (sizeof(float) * (V2_LORA_TM * V2_LORA_KC + V2_LORA_KC * V2_LORA_MAX_RANK + V2_LORA_TM * V2_LORA_MAX_RANK))

__global__ void __launch_bounds__(V2_LORA_THREADS) lora_bwd_rows_kernel(lora_params p)
{
    extern __shared__ __align__(16) float lora_smem[];
    float *dYs = lora_smem;
    float *Bs = dYs + V2_LORA_TM * V2_LORA_KC;
    float *dUs = Bs + V2_LORA_KC * V2_LORA_MAX_RANK;
    const lora_seg_d sg = p.seg[lora_find_seg(p, blockIdx.x)];
    const int64_t r0 = sg.row_begin + (int64_t)(blockIdx.x - sg.tile0) * V2_LORA_TM;
    const int rows = (int)(sg.row_end - r0 < V2_LORA_TM ? sg.row_end - r0 : V2_LORA_TM);
    const int r = sg.rank, t = threadIdx.x;
    constexpr int PER = V2_LORA_TM * V2_LORA_MAX_RANK / V2_LORA_THREADS;
    float acc[PER];
#pragma unroll
    for (int q = 0; q < PER; q++)
        acc[q] = 0.0f;
    /* dU = scale dY B over K = out */
    for (int64_t k0 = 0; k0 < p.out; k0 += V2_LORA_KC) {
        int kc = (int)(p.out - k0 < V2_LORA_KC ? p.out - k0 : V2_LORA_KC);
        __syncthreads();
        for (int i = t; i < V2_LORA_TM * V2_LORA_KC; i += V2_LORA_THREADS) {
            int rr = i / V2_LORA_KC, kk = i % V2_LORA_KC;
            dYs[i] =
                rr < rows && kk < kc ? __bfloat162float(p.dy[(r0 + rr) * p.out + k0 + kk]) : 0.0f;
        }
        for (int i = t; i < V2_LORA_KC * r; i += V2_LORA_THREADS) {
            int kk = i / r, c = i % r;
            Bs[kk * V2_LORA_MAX_RANK + c] = kk < kc ? sg.b[(k0 + kk) * r + c] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int q = 0; q < PER; q++) {
            int o = t + q * V2_LORA_THREADS, rr = o / r, c = o % r;
            if (o >= V2_LORA_TM * r) continue;
            const float *dyr = dYs + rr * V2_LORA_KC;
            float s = acc[q];
            for (int kk = 0; kk < V2_LORA_KC; kk++)
                s = fmaf(dyr[kk], Bs[kk * V2_LORA_MAX_RANK + c], s);
            acc[q] = s;
        }
    }
#pragma unroll
    for (int q = 0; q < PER; q++) {
        int o = t + q * V2_LORA_THREADS, rr = o / r, c = o % r;
        if (o >= V2_LORA_TM * r) continue;
        float v = sg.scale * acc[q];
        dUs[rr * V2_LORA_MAX_RANK + c] = v;
        if (rr < rows) p.du[(r0 + rr) * p.u_ld + c] = v;
    }
    if (!p.dx) return;
    __syncthreads();
    /* dX += dU A: thread = input column, all TM rows */
    for (int64_t c0 = 0; c0 < p.in; c0 += V2_LORA_THREADS) {
        int64_t col = c0 + t;
        if (col >= p.in) break;
        float xs[V2_LORA_TM];
#pragma unroll
        for (int rr = 0; rr < V2_LORA_TM; rr++)
            xs[rr] = 0.0f;
        for (int k = 0; k < r; k++) {
            float ak = sg.a[k * p.in + col];
#pragma unroll
            for (int rr = 0; rr < V2_LORA_TM; rr++)
                xs[rr] = fmaf(dUs[rr * V2_LORA_MAX_RANK + k], ak, xs[rr]);
        }
        for (int rr = 0; rr < rows; rr++) {
            __nv_bfloat16 *xp = p.dx + (r0 + rr) * p.in + col;
            float v = xs[rr];
            if (sg.drop) v *= lora_drop(sg, r0 + rr, col);
            *xp = __float2bfloat16_rn(__bfloat162float(*xp) + v);
        }
    }
}

/* Reduction blocks: segment s owns n_chunks * (ceil(in/64) + ceil(out/64)) blocks from its tile0:
 * chunk-major, then the dA column tiles, then the dB ones. Shared memory: Ls [RED_ROWS][MAX_RANK]
 * f32, Rs [RED_ROWS][RED_COLS] f32. */
#define V2_LORA_RED_SMEM                                                                              \
    (sizeof(float) * (V2_LORA_RED_ROWS * V2_LORA_MAX_RANK + V2_LORA_RED_ROWS * V2_LORA_RED_COLS))

__global__ void __launch_bounds__(V2_LORA_THREADS) lora_bwd_red_kernel(lora_params p)
{
    extern __shared__ __align__(16) float lora_smem[];
    float *Ls = lora_smem;
    float *Rs = Ls + V2_LORA_RED_ROWS * V2_LORA_MAX_RANK;
    const lora_seg_d sg = p.seg[lora_find_seg(p, blockIdx.x)];
    const int r = sg.rank, t = threadIdx.x;
    const int a_tiles = (int)((p.in + V2_LORA_RED_COLS - 1) / V2_LORA_RED_COLS);
    const int tiles = a_tiles + (int)((p.out + V2_LORA_RED_COLS - 1) / V2_LORA_RED_COLS);
    const int local = blockIdx.x - sg.tile0, chunk = local / tiles;
    int tile = local % tiles;
    const bool is_a = tile < a_tiles;
    if (!is_a) tile -= a_tiles;
    const int64_t row_lo = sg.row_begin + chunk * sg.chunk_rows;
    const int64_t row_hi =
        row_lo + sg.chunk_rows < sg.row_end ? row_lo + sg.chunk_rows : sg.row_end;
    /* dA (r, in): L = dU (rows, r), R = X (rows, in). dB (out, r): L = U, R = dY (rows, out). */
    const float *L = is_a ? p.du : p.u;
    const __nv_bfloat16 *R = is_a ? p.x : p.dy;
    const int64_t rcols = is_a ? p.in : p.out;
    const int64_t col0 = (int64_t)tile * V2_LORA_RED_COLS;
    const int cl = t % V2_LORA_RED_COLS, cg = t / V2_LORA_RED_COLS;           /* 4 rank groups */
    constexpr int PER = V2_LORA_MAX_RANK / (V2_LORA_THREADS / V2_LORA_RED_COLS); /* 32 */
    float acc[PER];
#pragma unroll
    for (int q = 0; q < PER; q++)
        acc[q] = 0.0f;
    for (int64_t row0 = row_lo; row0 < row_hi; row0 += V2_LORA_RED_ROWS) {
        int nr = (int)(row_hi - row0 < V2_LORA_RED_ROWS ? row_hi - row0 : V2_LORA_RED_ROWS);
        __syncthreads();
        for (int i = t; i < V2_LORA_RED_ROWS * r; i += V2_LORA_THREADS) {
            int rr = i / r, c = i % r;
            Ls[rr * V2_LORA_MAX_RANK + c] = rr < nr ? L[(row0 + rr) * p.u_ld + c] : 0.0f;
        }
        for (int i = t; i < V2_LORA_RED_ROWS * V2_LORA_RED_COLS; i += V2_LORA_THREADS) {
            int rr = i / V2_LORA_RED_COLS, cc = i % V2_LORA_RED_COLS;
            float v = 0.0f;
            if (rr < nr && col0 + cc < rcols) {
                v = __bfloat162float(R[(row0 + rr) * rcols + col0 + cc]);
                if (is_a && sg.drop) v *= lora_drop(sg, row0 + rr, col0 + cc); /* dU^T Xd */
            }
            Rs[i] = v;
        }
        __syncthreads();
        for (int rr = 0; rr < nr; rr++) {
            float rv = Rs[rr * V2_LORA_RED_COLS + cl];
#pragma unroll
            for (int q = 0; q < PER; q++) {
                int c = cg + 4 * q;
                if (c < r) acc[q] = fmaf(Ls[rr * V2_LORA_MAX_RANK + c], rv, acc[q]);
            }
        }
    }
    const int64_t col = col0 + cl;
    if (col >= rcols) return;
    /* partials of this chunk: dA (r, in) then dB (out, r), the layouts of da and db */
    float *part = p.part + sg.part0 + (int64_t)chunk * r * (p.in + p.out);
#pragma unroll
    for (int q = 0; q < PER; q++) {
        int c = cg + 4 * q;
        if (c >= r) continue;
        if (is_a)
            part[c * p.in + col] = acc[q];
        else
            part[(int64_t)r * p.in + col * r + c] = acc[q];
    }
}

/* Host: lays out the reduction of p's segments (already packed with their row ranges): chunk
 * rows and count, each segment's first block, partial offset and element offset; sets
 * p->n_blocks and p->n_elems. Returns the floats of partials needed (p->part must hold them). */
static inline int64_t lora_plan_reduction(lora_params *p)
{
    const int tiles = (int)((p->in + V2_LORA_RED_COLS - 1) / V2_LORA_RED_COLS +
                            (p->out + V2_LORA_RED_COLS - 1) / V2_LORA_RED_COLS);
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
        blocks += d->n_chunks * tiles;
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

} /* namespace lora_v2 */

#endif
