/* swiglu.cuh — the SwiGLU forward h = silu(g) * u and backward (dg, du) elementwise kernels,
 * scalar (v1) and 8-wide (v2) (device code and their launches; included by cuda_layers.cu and
 * dev/cuda/swiglu.cu, which validates both against a double reference and times them).
 *
 * Shapes: g, u, h, dh, dg, du: n bf16 elements each (m rows x the intermediate size, flat).
 */
#ifndef TANDEM_ENGINE_CUDA_SWIGLU_CUH
#define TANDEM_ENGINE_CUDA_SWIGLU_CUH
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "engine/cuda/bf16x8.cuh"
#include "engine/cuda/grid.cuh"

#define SWIGLU_THREADS 256

/* h = silu(g) u and its gradients, one element: the scalar and the 8-wide kernels share these so
 * they write the same bits. */
__device__ __forceinline__ float swiglu_h(float g, float u)
{
    float sg = 1.0f / (1.0f + expf(-g));
    return g * sg * u;
}
__device__ __forceinline__ void swiglu_grad(float g, float u, float d, float *dg, float *du)
{
    float sg = 1.0f / (1.0f + expf(-g));
    *dg = d * u * sg * (1.0f + g * (1.0f - sg));
    *du = d * g * sg;
}

__global__ void swiglu_fwd_kernel(const bf16 *g, const bf16 *u, int64_t n, bf16 *h)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        h[i] = __float2bfloat16_rn(swiglu_h(__bfloat162float(g[i]), __bfloat162float(u[i])));
}

__global__ void swiglu_bwd_kernel(const bf16 *g, const bf16 *u, const bf16 *dh, int64_t n, bf16 *dg,
                                  bf16 *du)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        /* read everything before writing: dg or du may alias dh */
        float dgv, duv;
        swiglu_grad(__bfloat162float(g[i]), __bfloat162float(u[i]), __bfloat162float(dh[i]), &dgv,
                    &duv);
        dg[i] = __float2bfloat16_rn(dgv);
        du[i] = __float2bfloat16_rn(duv);
    }
}

/* 8 elements per thread and access (n8 = n / 8 groups, every pointer 16-byte aligned) */
__global__ void swiglu_fwd_v8_kernel(const bf16 *g, const bf16 *u, int64_t n8, bf16 *h)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8;
         i += (int64_t)gridDim.x * blockDim.x) {
        float gv[8], uv[8];
        bf16x8_load(g + 8 * i, gv);
        bf16x8_load(u + 8 * i, uv);
#pragma unroll
        for (int k = 0; k < 8; k++)
            gv[k] = swiglu_h(gv[k], uv[k]);
        bf16x8_store(h + 8 * i, gv);
    }
}

__global__ void swiglu_bwd_v8_kernel(const bf16 *g, const bf16 *u, const bf16 *dh, int64_t n8,
                                     bf16 *dg, bf16 *du)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8;
         i += (int64_t)gridDim.x * blockDim.x) {
        float gv[8], uv[8], dv[8], dgv[8], duv[8];
        bf16x8_load(g + 8 * i, gv);
        bf16x8_load(u + 8 * i, uv);
        bf16x8_load(dh + 8 * i, dv);
#pragma unroll
        for (int k = 0; k < 8; k++)
            swiglu_grad(gv[k], uv[k], dv[k], &dgv[k], &duv[k]);
        bf16x8_store(dg + 8 * i, dgv);
        bf16x8_store(du + 8 * i, duv);
    }
}

/* The launches. v8: the 8-wide kernels, which need n % 8 == 0 and every pointer 16-byte aligned
 * (bf16x8_ok); the backend takes them whenever that holds. In the backward dg or du may alias
 * dh (each element is read before it is written). */
static inline void swiglu_fwd_launch(bool v8, const bf16 *g, const bf16 *u, int64_t n, bf16 *h,
                                     cudaStream_t stream)
{
    if (v8)
        swiglu_fwd_v8_kernel<<<cuda_blocks(n / 8, SWIGLU_THREADS), SWIGLU_THREADS, 0, stream>>>(
            g, u, n / 8, h);
    else
        swiglu_fwd_kernel<<<cuda_blocks(n, SWIGLU_THREADS * 4), SWIGLU_THREADS, 0, stream>>>(g, u,
                                                                                             n, h);
}

static inline void swiglu_bwd_launch(bool v8, const bf16 *g, const bf16 *u, const bf16 *dh,
                                     int64_t n, bf16 *dg, bf16 *du, cudaStream_t stream)
{
    if (v8)
        swiglu_bwd_v8_kernel<<<cuda_blocks(n / 8, SWIGLU_THREADS), SWIGLU_THREADS, 0, stream>>>(
            g, u, dh, n / 8, dg, du);
    else
        swiglu_bwd_kernel<<<cuda_blocks(n, SWIGLU_THREADS * 4), SWIGLU_THREADS, 0, stream>>>(
            g, u, dh, n, dg, du);
}

#endif
