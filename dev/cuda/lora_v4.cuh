/* lora_v4.cuh — the grad kernel of the segmented LoRA shipped from 2026-12-06 (2616aa7) until
 * its rows were split across warps (v5), kept for dev/cuda/lora.cu only: the baseline the shipped
 * grad kernel (src/engine/cuda/lora.cuh) is validated and timed against in the same run. Block =
 * 256 columns (4 warps x 64) x 16 ranks x one chunk of a segment's rows, each warp walking every
 * row of the chunk: 224 blocks of 4 warps on a 7B q_proj at 2048 rows, too few warps in flight
 * (49.5 us on an H100 against v3's 44.5). The down, up and finish kernels, the parameters and the
 * other planners are lora.cuh's (the same in v4 and v5).
 * Everything is in namespace lora_v4 with macros prefixed V4_ so both versions build together.
 */
#ifndef TANDEM_DEV_CUDA_LORA_V4_CUH
#define TANDEM_DEV_CUDA_LORA_V4_CUH
#include <cuda_bf16.h>
#include <stdint.h>

#include "engine/cuda/lora.cuh"

namespace lora_v4 {
#define V4_LORA_GRAD_THREADS 128
#define V4_LORA_GRAD_COLS 256 /* 4 warps x 64 columns */

__host__ __device__ __forceinline__ int v4_grad_col_tiles(const lora_params &p)
{
    return (int)((p.in + V4_LORA_GRAD_COLS - 1) / V4_LORA_GRAD_COLS +
                 (p.out + V4_LORA_GRAD_COLS - 1) / V4_LORA_GRAD_COLS);
}

/* Grad blocks: segment s owns n_chunks * groups * (ceil(in/256) + ceil(out/256)) blocks from its
 * tile0: chunk-major, then rank group, then the dA column tiles, then the dB ones.
 * dA^T (in x r) = Xd^T dU and dB (out x r) = s dY^T U are tf32 mma products with the chunk's
 * batch rows as K, 8 rows a step: warp w takes columns 64 w.. of the block's 256 as 4 m-tiles and
 * the group's 16 ranks as 2 n-tiles, over every row of the chunk. Lane (g, t) loads columns
 * 8g..8g+7 of the step's rows t and t + 4 (16 bytes each; m-tile i's "g" is column 8g + 2i, its
 * "g + 8" column 8g + 2i + 1) and ranks g and 8 + g of U / dU for the same rows. LoRA dropout
 * (dA) zeroes dropped elements of X and scales the sums by 1/(1-p) once, as the down kernel.
 * The chunk's sums go to f32 partials (scratch slot 7) in the layouts of dA (r, in) and dB
 * (out, r). */
__global__ void __launch_bounds__(V4_LORA_GRAD_THREADS) lora_grad_kernel(lora_params p)
{
    const lora_seg_d sg = p.seg[lora_find_seg(p, blockIdx.x)];
    const int r = sg.rank, groups = lora_rank_groups(r), t = threadIdx.x;
    const int warp = t / 32, lane = t % 32, qg = lane >> 2, qt = lane & 3;
    const int a_tiles = (int)((p.in + V4_LORA_GRAD_COLS - 1) / V4_LORA_GRAD_COLS);
    const int tiles = v4_grad_col_tiles(p);
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
    const int64_t col0 = (int64_t)tile * V4_LORA_GRAD_COLS + warp * 64;
    if (col0 >= rcols) return; /* no barriers in this kernel */
    const bool vec = rcols % 8 == 0 && (reinterpret_cast<uintptr_t>(R) & 15) == 0;
    const int64_t col = col0 + 8 * qg;
    const bool drop = is_a && sg.drop;
    const bool rank_lo = qg < rg, rank_hi = 8 + qg < rg, two = rg > 8;
    float acc[4][2][4] = {}; /* m-tiles x n-tiles x fragment */
#pragma unroll 2
    for (int64_t sub = row_lo; sub < row_hi; sub += 8) {
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
    const float s = drop ? sg.keep_scale : 1.0f;
    float *part = p.part + sg.part0 + (int64_t)chunk * r * (p.in + p.out);
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t n = col + 2 * i + h;
            if (n >= rcols) continue;
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int f = 0; f < 2; f++) {
                    const int c = nt * 8 + 2 * qt + f;
                    if (c >= rg) continue;
                    const int64_t rc = g * LORA_RG + c;
                    const float v = s * acc[i][nt][2 * h + f];
                    if (is_a)
                        part[rc * p.in + n] = v;
                    else
                        part[(int64_t)r * p.in + n * r + rc] = v;
                }
        }
}

static inline int64_t lora_plan_reduction(lora_params *p)
{
    return lora_plan_reduction_tiles(p, v4_grad_col_tiles(*p));
}

} /* namespace lora_v4 */

#endif
