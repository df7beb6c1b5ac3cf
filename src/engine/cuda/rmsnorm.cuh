/* rmsnorm.cuh — the RMSNorm forward and backward row kernels, scalar (v1) and 8-wide (v2)
 * (device code and their launches; included by cuda_layers.cu and dev/cuda/rmsnorm.cu, which
 * validates both against a double reference and times them).
 *
 * Shapes: x, y, dy, dx (rows, d) bf16 row-major; w (d) f32; rstd (rows) f32. One block per row;
 * the row's sum is reduced in a fixed order, so results do not depend on timing.
 */
#ifndef TANDEM_ENGINE_CUDA_RMSNORM_CUH
#define TANDEM_ENGINE_CUDA_RMSNORM_CUH
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "engine/cuda/bf16x8.cuh"

/* Sum of x over the block (blockDim.x a multiple of 32, <= 1024); every thread gets it. */
static __device__ float block_sum(float x, float *shared32)
{
    for (int o = 16; o > 0; o >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    __syncthreads(); /* shared32 may still be read from a previous call */
    if (lane == 0) shared32[warp] = x;
    __syncthreads();
    float s = 0.0f;
    for (int i = 0; i < nw; i++)
        s += shared32[i]; /* same order in every thread */
    return s;
}

/* One block per row: rstd = 1/sqrt(mean(x^2) + eps), y = w * (x * rstd). In place allowed. */
__global__ void rmsnorm_fwd_kernel(const bf16 *x, const float *w, int64_t d, float eps, bf16 *y,
                                   float *rstd)
{
    __shared__ float red[32];
    const int64_t r = blockIdx.x;
    const bf16 *xr = x + r * d;
    float ss = 0.0f;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
        float v = __bfloat162float(xr[j]);
        ss = fmaf(v, v, ss);
    }
    ss = block_sum(ss, red);
    float rs = rsqrtf(ss / (float)d + eps);
    bf16 *yr = y + r * d;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
        yr[j] = __float2bfloat16_rn(w[j] * (__bfloat162float(xr[j]) * rs));
    if (rstd && threadIdx.x == 0) rstd[r] = rs;
}

/* dx_j = r w_j dy_j - x_j r^3 / d * sum_k w_k dy_k x_k, then dx = beta dx + that. */
__global__ void rmsnorm_bwd_kernel(const bf16 *dy, const bf16 *x, const float *w, const float *rstd,
                                   int64_t d, bf16 *dx, float beta)
{
    __shared__ float red[32];
    const int64_t r = blockIdx.x;
    const bf16 *dyr = dy + r * d, *xr = x + r * d;
    float dot = 0.0f;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
        dot = fmaf(w[j] * __bfloat162float(dyr[j]), __bfloat162float(xr[j]), dot);
    dot = block_sum(dot, red);
    float rs = rstd[r];
    float c = dot * rs * rs * rs / (float)d;
    bf16 *dxr = dx + r * d;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
        float g = rs * w[j] * __bfloat162float(dyr[j]) - c * __bfloat162float(xr[j]);
        if (beta != 0.0f) g += beta * __bfloat162float(dxr[j]);
        dxr[j] = __float2bfloat16_rn(g);
    }
}

/* The same two kernels 8 elements at a time (d % 8 == 0, rows and w 16-byte aligned): thread j
 * takes elements 8j.. of every 8 * blockDim.x. The per-thread partial sums cover other elements
 * than the scalar kernels', so the sums (and results) may differ from theirs in the last bit. */
__global__ void rmsnorm_fwd_v8_kernel(const bf16 *x, const float *w, int64_t d, float eps, bf16 *y,
                                      float *rstd)
{
    __shared__ float red[32];
    const int64_t r = blockIdx.x;
    const bf16 *xr = x + r * d;
    float ss = 0.0f;
    for (int64_t j = 8 * threadIdx.x; j < d; j += 8 * blockDim.x) {
        float v[8];
        bf16x8_load(xr + j, v);
#pragma unroll
        for (int k = 0; k < 8; k++)
            ss = fmaf(v[k], v[k], ss);
    }
    ss = block_sum(ss, red);
    float rs = rsqrtf(ss / (float)d + eps);
    bf16 *yr = y + r * d;
    for (int64_t j = 8 * threadIdx.x; j < d; j += 8 * blockDim.x) {
        float v[8], wv[8];
        bf16x8_load(xr + j, v);
        f32x8_load(w + j, wv);
#pragma unroll
        for (int k = 0; k < 8; k++)
            v[k] = wv[k] * (v[k] * rs);
        bf16x8_store(yr + j, v);
    }
    if (rstd && threadIdx.x == 0) rstd[r] = rs;
}

__global__ void rmsnorm_bwd_v8_kernel(const bf16 *dy, const bf16 *x, const float *w,
                                      const float *rstd, int64_t d, bf16 *dx, float beta)
{
    __shared__ float red[32];
    const int64_t r = blockIdx.x;
    const bf16 *dyr = dy + r * d, *xr = x + r * d;
    float dot = 0.0f;
    for (int64_t j = 8 * threadIdx.x; j < d; j += 8 * blockDim.x) {
        float g[8], xv[8], wv[8];
        bf16x8_load(dyr + j, g);
        bf16x8_load(xr + j, xv);
        f32x8_load(w + j, wv);
#pragma unroll
        for (int k = 0; k < 8; k++)
            dot = fmaf(wv[k] * g[k], xv[k], dot);
    }
    dot = block_sum(dot, red);
    float rs = rstd[r];
    float c = dot * rs * rs * rs / (float)d;
    bf16 *dxr = dx + r * d;
    for (int64_t j = 8 * threadIdx.x; j < d; j += 8 * blockDim.x) {
        float g[8], xv[8], wv[8], old[8];
        bf16x8_load(dyr + j, g);
        bf16x8_load(xr + j, xv);
        f32x8_load(w + j, wv);
        if (beta != 0.0f) bf16x8_load(dxr + j, old);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            g[k] = rs * wv[k] * g[k] - c * xv[k];
            if (beta != 0.0f) g[k] += beta * old[k];
        }
        bf16x8_store(dxr + j, g);
    }
}

static inline unsigned row_threads(int64_t d)
{
    return d >= 1024 ? 256 : d >= 256 ? 128 : 64;
}

/* Threads of the 8-wide row kernels: about two 8-element groups per thread or more. */
static inline unsigned row_threads_v8(int64_t d)
{
    return d >= 8 * 512 ? 256 : d >= 8 * 128 ? 128 : 64;
}

/* The launches. v8: the 8-wide kernels, which need d % 8 == 0 and every row and w 16-byte
 * aligned (bf16x8_ok); the backend takes them whenever that holds. rows < 2^31. */
static inline void rmsnorm_fwd_launch(bool v8, const bf16 *x, const float *w, int64_t rows,
                                      int64_t d, float eps, bf16 *y, float *rstd,
                                      cudaStream_t stream)
{
    if (v8)
        rmsnorm_fwd_v8_kernel<<<(unsigned)rows, row_threads_v8(d), 0, stream>>>(x, w, d, eps, y,
                                                                                rstd);
    else
        rmsnorm_fwd_kernel<<<(unsigned)rows, row_threads(d), 0, stream>>>(x, w, d, eps, y, rstd);
}

static inline void rmsnorm_bwd_launch(bool v8, const bf16 *dy, const bf16 *x, const float *w,
                                      const float *rstd, int64_t rows, int64_t d, bf16 *dx,
                                      float beta, cudaStream_t stream)
{
    if (v8)
        rmsnorm_bwd_v8_kernel<<<(unsigned)rows, row_threads_v8(d), 0, stream>>>(dy, x, w, rstd, d,
                                                                                dx, beta);
    else
        rmsnorm_bwd_kernel<<<(unsigned)rows, row_threads(d), 0, stream>>>(dy, x, w, rstd, d, dx,
                                                                          beta);
}

#endif
