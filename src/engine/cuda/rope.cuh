/* rope.cuh — the rotary position embedding kernel, in place on the q or k rows (device code
 * and its launch; included by cuda_layers.cu and dev/cuda/rope.cu, which validates it against a
 * double reference and times it).
 *
 * Shapes: x (m, ld) bf16, of which the first n_heads * head_dim columns are rotated; pos (m)
 * int32 positions; inv_freq (head_dim / 2) f32 (engine/rope.h). inverse rotates by -angle (the
 * backward).
 */
#ifndef TANDEM_ENGINE_CUDA_ROPE_CUH
#define TANDEM_ENGINE_CUDA_ROPE_CUH
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "engine/cuda/bf16x8.cuh" /* the bf16 type */
#include "engine/cuda/grid.cuh"

#define ROPE_THREADS 256

/* One thread per (row, j < half): angle = f32(pos) * inv_freq[j] (accurate sincosf, angles reach
 * thousands of radians), rotating pair (j, j + half) of every head. */
__global__ void rope_kernel(bf16 *x, int64_t m, int n_heads, int head_dim, int64_t ld,
                            const int32_t *pos, const float *inv_freq, bool inverse)
{
    const int half = head_dim / 2;
    int64_t n = m * half;
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < n;
         t += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = t / half;
        int j = (int)(t % half);
        float ang = (float)pos[i] * inv_freq[j];
        float s, c;
        sincosf(ang, &s, &c);
        if (inverse) s = -s;
        bf16 *row = x + i * ld;
        for (int h = 0; h < n_heads; h++) {
            bf16 *hx = row + (int64_t)h * head_dim;
            float a = __bfloat162float(hx[j]), b = __bfloat162float(hx[j + half]);
            hx[j] = __float2bfloat16_rn(a * c - b * s);
            hx[j + half] = __float2bfloat16_rn(b * c + a * s);
        }
    }
}

static inline void rope_launch(bf16 *x, int64_t m, int64_t n_heads, int64_t head_dim, int64_t ld,
                               const int32_t *pos, const float *inv_freq, bool inverse,
                               cudaStream_t stream)
{
    rope_kernel<<<cuda_blocks(m * head_dim / 2, ROPE_THREADS), ROPE_THREADS, 0, stream>>>(
        x, m, (int)n_heads, (int)head_dim, ld, pos, inv_freq, inverse);
}

#endif
