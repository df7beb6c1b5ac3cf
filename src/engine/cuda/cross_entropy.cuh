/* cross_entropy.cuh — the cross-entropy row kernel over a chunk of f32 logits (device code only;
 * included by cuda_train.cu and dev/cuda/cross_entropy.cu, which validates and times it against
 * the first variant).
 * The device error word's label code is CE_DEVERR_LABEL (cuda_internal.h's CUDA_DEVERR_LABEL).
 */
#ifndef TANDEM_ENGINE_CUDA_CROSS_ENTROPY_CUH
#define TANDEM_ENGINE_CUDA_CROSS_ENTROPY_CUH
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#define IGNORE_INDEX (-100)
#define CE_DEVERR_LABEL 2

/* One block per row of a chunk of logits (c, V) f32: online max / sum of exp in f32 per thread,
 * combined over the block in a fixed order; loss = lse - logit[label]; when dlog is not NULL it
 * receives weight * (softmax - onehot) in bf16 (zeros for ignored rows).
 * VEC = 4 (V a multiple of 4, so every row starts 16-byte aligned): float4 loads and 8-byte bf16
 * stores; VEC = 1 otherwise. CE_THREADS threads per row: a row of a 152K vocabulary is 600 KB
 * read twice, and the loads must be wide and many in flight to come near the memory rate. */
#define CE_THREADS 512
__device__ __forceinline__ void ce_online(float v, float &mx, float &s)
{
    if (v > mx) {
        s = s * expf(mx - v) + 1.0f;
        mx = v;
    } else {
        s += expf(v - mx);
    }
}

template <int VEC>
__global__ void __launch_bounds__(CE_THREADS)
    ce_rows_kernel(const float *logits, int64_t V, const int32_t *labels, const float *weight,
                   float *loss, __nv_bfloat16 *dlog, int *dev_error)
{
    __shared__ float sm[32], ss[32];
    const int64_t i = blockIdx.x;
    const float *l = logits + i * V;
    const int32_t lab = labels[i];
    const bool bad = lab != IGNORE_INDEX && (lab < 0 || lab >= V);
    if (lab == IGNORE_INDEX || bad) {
        if (bad && threadIdx.x == 0) atomicCAS(dev_error, 0, CE_DEVERR_LABEL);
        if (threadIdx.x == 0) loss[i] = 0.0f;
        if (dlog)
            for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
                dlog[i * V + j] = __float2bfloat16_rn(0.0f);
        return;
    }
    float mx = -INFINITY, s = 0.0f;
    if (VEC == 4) {
        const float4 *l4 = (const float4 *)l;
        for (int64_t j = threadIdx.x; j < V / 4; j += blockDim.x) {
            float4 v = l4[j];
            ce_online(v.x, mx, s);
            ce_online(v.y, mx, s);
            ce_online(v.z, mx, s);
            ce_online(v.w, mx, s);
        }
    } else {
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
            ce_online(l[j], mx, s);
    }
    /* combine (mx, s) over the warp, then over warps in order */
    for (int o = 16; o > 0; o >>= 1) {
        float om = __shfl_xor_sync(0xffffffffu, mx, o), os = __shfl_xor_sync(0xffffffffu, s, o);
        float nm = fmaxf(mx, om);
        s = (mx == -INFINITY ? 0.0f : s * expf(mx - nm)) +
            (om == -INFINITY ? 0.0f : os * expf(om - nm));
        mx = nm;
    }
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    if (lane == 0) {
        sm[warp] = mx;
        ss[warp] = s;
    }
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < nw; w++)
        M = fmaxf(M, sm[w]);
    float S = 0.0f;
    for (int w = 0; w < nw; w++)
        if (sm[w] != -INFINITY) S += ss[w] * expf(sm[w] - M);
    const float lse = M + logf(S);
    if (threadIdx.x == 0) loss[i] = lse - l[lab];
    if (!dlog) return;
    const float wt = weight[i];
    if (VEC == 4) {
        const float4 *l4 = (const float4 *)l;
        uint2 *d4 = (uint2 *)(dlog + i * V);
        for (int64_t j = threadIdx.x; j < V / 4; j += blockDim.x) {
            float4 v = l4[j];
            int64_t e = 4 * j;
            __nv_bfloat162 lo =
                __floats2bfloat162_rn(wt * (expf(v.x - lse) - (e == lab ? 1.0f : 0.0f)),
                                      wt * (expf(v.y - lse) - (e + 1 == lab ? 1.0f : 0.0f)));
            __nv_bfloat162 hi =
                __floats2bfloat162_rn(wt * (expf(v.z - lse) - (e + 2 == lab ? 1.0f : 0.0f)),
                                      wt * (expf(v.w - lse) - (e + 3 == lab ? 1.0f : 0.0f)));
            uint2 pk;
            pk.x = *(const unsigned *)&lo;
            pk.y = *(const unsigned *)&hi;
            d4[j] = pk;
        }
    } else {
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
            float p = expf(l[j] - lse) - (j == lab ? 1.0f : 0.0f);
            dlog[i * V + j] = __float2bfloat16_rn(wt * p);
        }
    }
}

/* The shipped launch over a chunk of c rows: the float4 path when V % 4 == 0 (cuda_train.cu and
 * the dev program's "v2" both call this, so the dev program times what ships). */
static inline void ce_rows_launch(int64_t c, const float *logits, int64_t V, const int32_t *labels,
                                  const float *weight, float *loss, __nv_bfloat16 *dlog,
                                  int *dev_error, cudaStream_t stream)
{
    if (V % 4 == 0)
        ce_rows_kernel<4><<<(unsigned)c, CE_THREADS, 0, stream>>>(logits, V, labels, weight, loss,
                                                                  dlog, dev_error);
    else
        ce_rows_kernel<1><<<(unsigned)c, CE_THREADS, 0, stream>>>(logits, V, labels, weight, loss,
                                                                  dlog, dev_error);
}

#endif
