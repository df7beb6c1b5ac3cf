/* bf16x8.cuh — 8 bf16 (one 16-byte access) as 8 floats, for the elementwise and row kernels
 * (device code only).
 *
 * Why: the scalar bf16 kernels moved 2 bytes per thread per access and reached about 1.5 TB/s on
 * an H200 (7B SwiGLU forward 156 us for 233 MB, RMSNorm forward 22 us for 29 MB, 2026-12-01
 * profile); one 16-byte access per thread is what lets HBM run near its rate. Conversions are
 * exact (bf16 -> f32) and round to nearest even (f32 -> bf16), element by element, so a vector
 * kernel writes the same bits as the scalar one from the same float expression.
 */
#ifndef TANDEM_ENGINE_CUDA_BF16X8_CUH
#define TANDEM_ENGINE_CUDA_BF16X8_CUH
#include <cuda_bf16.h>
#include <stdint.h>

typedef __nv_bfloat16 bf16; /* the one definition every CUDA file of the backend uses */

__device__ __forceinline__ void bf16x8_load(const __nv_bfloat16 *p, float v[8])
{
    uint4 q = *reinterpret_cast<const uint4 *>(p);
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&q);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float2 f = __bfloat1622float2(h[j]);
        v[2 * j] = f.x, v[2 * j + 1] = f.y;
    }
}

__device__ __forceinline__ void bf16x8_store(__nv_bfloat16 *p, const float v[8])
{
    uint4 q;
    __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&q);
#pragma unroll
    for (int j = 0; j < 4; j++)
        h[j] = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
    *reinterpret_cast<uint4 *>(p) = q;
}

/* 8 consecutive f32 (32-byte aligned not required: two 16-byte loads) */
__device__ __forceinline__ void f32x8_load(const float *p, float v[8])
{
    float4 a = *reinterpret_cast<const float4 *>(p), b = *reinterpret_cast<const float4 *>(p + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

/* Whether n elements from every pointer can go 8 at a time (n % 8 == 0, 16-byte aligned). */
static inline bool bf16x8_ok(int64_t n, const void *a, const void *b = 0, const void *c = 0,
                             const void *d = 0)
{
    uintptr_t m = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d;
    return n % 8 == 0 && (m & 15) == 0;
}

#endif
