/* multi_tensor.cuh — one launch over many f32 tensors: gradient sums of squares and AdamW
 * (device code only; included by cuda_train.cu and dev/cuda/adamw.cu).
 *
 * The host cuts every tensor into fixed-size chunks and uploads a chunk table (tensor, offset,
 * length); block b of the launch (grid-stride) processes chunk b. AdamW updates each element
 * exactly as the CPU backend does (torch.optim.AdamW single-tensor arithmetic in f32, scalar
 * factors from double). Sums of squares: each chunk is summed in f32 by one block in a fixed
 * order, then the chunks of a group are added in table order in double: the result does not
 * depend on the launch configuration.
 */
#ifndef TANDEM_ENGINE_CUDA_MULTI_TENSOR_CUH
#define TANDEM_ENGINE_CUDA_MULTI_TENSOR_CUH
#include <math.h>
#include <stdint.h>

#include "engine/grad_clip.h"

#define MT_THREADS 256
#define MT_SUMSQ_CHUNK 8192
#define MT_ADAMW_CHUNK 4096

struct mt_chunk {
    const float *x; /* sumsq: the vector; AdamW: unused */
    int64_t off, n;
    int tensor; /* sumsq: group; AdamW: descriptor index */
    int pad_;
};

struct adamw_desc {
    float *p;
    const float *g;
    float *m, *v;
    const float *grad_scale; /* or NULL */
    float decay, w1, b2, w2, neg_step, bc2_sqrt, eps;
    int wd;
};

/* Scalars exactly as cpu_adamw computes them (double, rounded to f32). */
static inline void adamw_desc_fill(adamw_desc *d, float *p, const float *g, float *m, float *v,
                                   const float *grad_scale, double lr, double beta1, double beta2,
                                   double eps, double weight_decay, int64_t step)
{
    double dlr = lr, b1 = beta1, b2 = beta2;
    double bc1 = 1.0 - pow(b1, (double)step);
    d->p = p;
    d->g = g;
    d->m = m;
    d->v = v;
    d->grad_scale = grad_scale;
    d->decay = (float)(1.0 - dlr * (double)weight_decay);
    d->w1 = (float)(1.0 - b1);
    d->b2 = (float)b2;
    d->w2 = (float)(1.0 - b2);
    d->neg_step = (float)(-(dlr / bc1));
    d->bc2_sqrt = (float)sqrt(1.0 - pow(b2, (double)step));
    d->eps = (float)eps;
    d->wd = weight_decay != 0.0f;
}

__global__ void adamw_kernel(const adamw_desc *descs, const mt_chunk *chunks, int64_t n_chunks)
{
    for (int64_t ci = blockIdx.x; ci < n_chunks; ci += gridDim.x) {
        const mt_chunk c = chunks[ci];
        const adamw_desc d = descs[c.tensor];
        const float gs = d.grad_scale ? *d.grad_scale : 1.0f;
        for (int64_t k = threadIdx.x; k < c.n; k += blockDim.x) {
            int64_t i = c.off + k;
            float g = d.grad_scale ? d.g[i] * gs : d.g[i];
            float pi = d.p[i];
            if (d.wd) pi = pi * d.decay;
            float mi = d.m[i];
            mi = d.w1 < 0.5f ? mi + d.w1 * (g - mi) : g - (g - mi) * (1.0f - d.w1);
            float vi = d.v[i] * d.b2;
            vi = vi + d.w2 * g * g;
            float denom = sqrtf(vi) / d.bc2_sqrt + d.eps;
            pi = pi + d.neg_step * mi / denom;
            d.p[i] = pi;
            d.m[i] = mi;
            d.v[i] = vi;
        }
    }
}

__global__ void sumsq_chunks_kernel(const mt_chunk *chunks, int64_t n_chunks, float *partial)
{
    __shared__ float red[MT_THREADS / 32];
    for (int64_t ci = blockIdx.x; ci < n_chunks; ci += gridDim.x) {
        const mt_chunk c = chunks[ci];
        float s = 0.0f;
        for (int64_t k = threadIdx.x; k < c.n; k += blockDim.x) {
            float x = c.x[c.off + k];
            s = fmaf(x, x, s);
        }
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        __syncthreads();
        if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = s;
        __syncthreads();
        if (threadIdx.x == 0) {
            float t = 0.0f;
            for (int w = 0; w < MT_THREADS / 32; w++) t += red[w];
            partial[ci] = t;
        }
    }
}

/* out[g] = sum over chunks of group g, in table order, in double. */
__global__ void sumsq_groups_kernel(const mt_chunk *chunks, const float *partial, int64_t n_chunks,
                                    int n_groups, float *out)
{
    int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= n_groups) return;
    double s = 0.0;
    for (int64_t c = 0; c < n_chunks; c++)
        if (chunks[c].tensor == g) s += (double)partial[c];
    out[g] = (float)s;
}

/* torch.nn.utils.clip_grad_norm_ per group (engine/grad_clip.h, the CPU backend's formula). */
__global__ void clip_coef_kernel(const float *sumsq, const float *max_norm, int n_groups,
                                 float *coef, float *norm)
{
    int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= n_groups) return;
    float nrm = tdm_grad_norm(sumsq[g]);
    coef[g] = tdm_grad_clip_coef(nrm, max_norm[g]);
    if (norm) norm[g] = nrm;
}

#endif
