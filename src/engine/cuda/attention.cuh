/* attention.cuh — causal grouped-query attention over packed sequences, forward and backward
 * (device code only; included by cuda_layers.cu and dev/cuda/attention.cu).
 *
 * Layouts (backend.h): q, out, dq (m, H*D) bf16; k, v, dk, dv (m, KVH*D) bf16; lse, Di (H, m) f32;
 * cu (n_seqs + 1) i32. Query head h reads KV head h / (H / KVH). Scores are scaled by `scale`;
 * the softmax runs flash-style (online max and sum in f32), and the forward keeps
 * lse = max + log(sum) per query for the backward, which recomputes the probabilities.
 *
 * Work split (variant 2 of dev/cuda/attention.cu, CUDA cores, f32 math, bf16 tiles in shared
 * memory): a block of 8 warps takes 32 rows of one sequence and one head; each warp owns 4 rows.
 * Forward and dq: rows are queries, the block walks key tiles of 32 up to the causal limit, lane
 * j of a warp scores key j of the tile, and the weighted sum over the tile is accumulated with
 * each lane owning head dimensions lane, lane+32, ... (NT = ceil(D/32) of them). dk/dv: rows are
 * keys of one KV head; the block walks the query tiles from the diagonal on, over every query
 * head of the group. Every output element is written by one thread, so results are deterministic
 * (no atomics). Shared-memory rows that lanes read in parallel are padded by one bf16 pair so the
 * 32 lanes hit 32 different banks.
 */
#ifndef TANDEM_ENGINE_CUDA_ATTENTION_CUH
#define TANDEM_ENGINE_CUDA_ATTENTION_CUH
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

#define ATT_ROWS 32   /* rows (queries or keys) per block */
#define ATT_TILE 32   /* keys or queries per inner tile (= warp size) */
#define ATT_WARPS 8   /* warps per block; each owns ATT_ROWS / ATT_WARPS rows */
#define ATT_RPW (ATT_ROWS / ATT_WARPS)

struct att_args {
    const int32_t *cu;
    const __nv_bfloat16 *q, *k, *v, *out, *dout;
    float *lse;       /* fwd: written; bwd: read */
    const float *Di;  /* bwd: rowsum(dout * out) */
    __nv_bfloat16 *o; /* fwd: out; bwd dq kernel: dq */
    __nv_bfloat16 *dk, *dv;
    int64_t m;
    int H, KVH, D;
    float scale;
};

__device__ __forceinline__ float att_warp_max(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

__device__ __forceinline__ float att_warp_sum(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

/* dot of two bf16 rows of length D (even) in shared memory, f32 accumulation */
__device__ __forceinline__ float att_dot(const __nv_bfloat16 *a, const __nv_bfloat16 *b, int D)
{
    const __nv_bfloat162 *a2 = (const __nv_bfloat162 *)a, *b2 = (const __nv_bfloat162 *)b;
    float s = 0.0f;
    for (int d = 0; d < D / 2; d++) {
        float2 x = __bfloat1622float2(a2[d]), y = __bfloat1622float2(b2[d]);
        s = fmaf(x.x, y.x, s);
        s = fmaf(x.y, y.y, s);
    }
    return s;
}

/* Copies rows [r0, r0 + n) of a (rows, ld) bf16 matrix, columns [c0, c0 + D), into shared
 * memory rows of stride `sld`; rows at or beyond `limit` are zero-filled. Whole block. */
__device__ __forceinline__ void att_load_rows(__nv_bfloat16 *dst, int sld,
                                              const __nv_bfloat16 *src, int64_t ld, int64_t r0,
                                              int n, int64_t limit, int64_t c0, int D)
{
    const int pairs = D / 2;
    for (int i = threadIdx.x; i < n * pairs; i += blockDim.x) {
        int r = i / pairs, c = (i % pairs) * 2;
        __nv_bfloat162 v;
        if (r0 + r < limit)
            v = *(const __nv_bfloat162 *)(src + (r0 + r) * ld + c0 + c);
        else
            v = __floats2bfloat162_rn(0.0f, 0.0f);
        *(__nv_bfloat162 *)(dst + r * sld + c) = v;
    }
}

/* Shared memory of each kernel (bytes), for the launcher. */
static inline size_t att_fwd_smem(int D)
{
    return sizeof(__nv_bfloat16) * ((size_t)ATT_ROWS * D + (size_t)ATT_TILE * (D + 2) +
                                    (size_t)ATT_TILE * D);
}
static inline size_t att_dq_smem(int D)
{
    return sizeof(__nv_bfloat16) * (2 * (size_t)ATT_ROWS * D + 2 * (size_t)ATT_TILE * (D + 2));
}
static inline size_t att_dkv_smem(int D)
{
    return sizeof(__nv_bfloat16) * (2 * (size_t)ATT_ROWS * D + 2 * (size_t)ATT_TILE * (D + 2)) +
           2 * ATT_TILE * sizeof(float);
}

/* grid (ceil(max_seqlen / 32), n_seqs, H), ATT_WARPS * 32 threads, att_fwd_smem(D) bytes. */
template <int NT> __global__ void __launch_bounds__(ATT_WARPS * 32) att_fwd_v2(att_args a)
{
    extern __shared__ __align__(16) unsigned char att_smem[];
    const int D = a.D;
    __nv_bfloat16 *Qs = (__nv_bfloat16 *)att_smem;       /* [ROWS][D] */
    __nv_bfloat16 *Ks = Qs + ATT_ROWS * D;                /* [TILE][D+2] */
    __nv_bfloat16 *Vs = Ks + ATT_TILE * (D + 2);          /* [TILE][D] */
    const int seq = blockIdx.y, h = blockIdx.z, kvh = h / (a.H / a.KVH);
    const int64_t base = a.cu[seq], len = a.cu[seq + 1] - base;
    const int64_t q0 = (int64_t)blockIdx.x * ATT_ROWS;
    if (q0 >= len) return;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t qld = (int64_t)a.H * D, kld = (int64_t)a.KVH * D;
    att_load_rows(Qs, D, a.q + base * qld, qld, q0, ATT_ROWS, len - 0, (int64_t)h * D, D);

    float mx[ATT_RPW], sum[ATT_RPW], acc[ATT_RPW][NT];
#pragma unroll
    for (int w = 0; w < ATT_RPW; w++) {
        mx[w] = -INFINITY;
        sum[w] = 0.0f;
#pragma unroll
        for (int t = 0; t < NT; t++) acc[w][t] = 0.0f;
    }
    int64_t kend = q0 + ATT_ROWS < len ? q0 + ATT_ROWS : len;
    for (int64_t k0 = 0; k0 < kend; k0 += ATT_TILE) {
        __syncthreads();
        att_load_rows(Ks, D + 2, a.k + base * kld, kld, k0, ATT_TILE, len, (int64_t)kvh * D, D);
        att_load_rows(Vs, D, a.v + base * kld, kld, k0, ATT_TILE, len, (int64_t)kvh * D, D);
        __syncthreads();
#pragma unroll
        for (int w = 0; w < ATT_RPW; w++) {
            const int r = warp * ATT_RPW + w;
            const int64_t i = q0 + r;
            if (i >= len || i < k0) continue; /* warp-uniform */
            const int64_t j = k0 + lane;
            float s = j <= i ? a.scale * att_dot(Qs + r * D, Ks + lane * (D + 2), D) : -INFINITY;
            float mt = att_warp_max(s);
            float mnew = fmaxf(mx[w], mt);
            float corr = expf(mx[w] - mnew); /* exp(-inf) = 0 on the first tile */
            float p = j <= i ? expf(s - mnew) : 0.0f;
            sum[w] = sum[w] * corr + att_warp_sum(p);
#pragma unroll
            for (int t = 0; t < NT; t++) acc[w][t] *= corr;
            int nj = (int)(i - k0 + 1 < ATT_TILE ? i - k0 + 1 : ATT_TILE);
            for (int jj = 0; jj < nj; jj++) {
                float pj = __shfl_sync(0xffffffffu, p, jj);
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    int d = lane + 32 * t;
                    if (d < D) acc[w][t] = fmaf(pj, __bfloat162float(Vs[jj * D + d]), acc[w][t]);
                }
            }
            mx[w] = mnew;
        }
    }
#pragma unroll
    for (int w = 0; w < ATT_RPW; w++) {
        const int64_t i = q0 + warp * ATT_RPW + w;
        if (i >= len) continue;
        float inv = 1.0f / sum[w];
        __nv_bfloat16 *o = a.o + (base + i) * qld + (int64_t)h * D;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            int d = lane + 32 * t;
            if (d < D) o[d] = __float2bfloat16_rn(acc[w][t] * inv);
        }
        if (lane == 0) a.lse[(int64_t)h * a.m + base + i] = mx[w] + logf(sum[w]);
    }
}

/* Di[h, i] = sum_d dout[i, h, d] * out[i, h, d] (f32). One warp per (row, head). */
__global__ void att_bwd_di(att_args a, float *Di)
{
    const int lane = threadIdx.x % 32;
    const int64_t nwarps = (int64_t)gridDim.x * blockDim.x / 32;
    for (int64_t wid = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; wid < a.m * a.H;
         wid += nwarps) {
        int64_t i = wid / a.H;
        int h = (int)(wid % a.H);
        const int64_t off = i * (int64_t)a.H * a.D + (int64_t)h * a.D;
        float s = 0.0f;
        for (int d = lane; d < a.D; d += 32)
            s = fmaf(__bfloat162float(a.dout[off + d]), __bfloat162float(a.out[off + d]), s);
        s = att_warp_sum(s);
        if (lane == 0) Di[(int64_t)h * a.m + i] = s;
    }
}

/* dq: grid (ceil(max_seqlen / 32), n_seqs, H), att_dq_smem(D) bytes.
 * dq_i = scale * sum_j P_ij (dout_i . v_j - Di_i) k_j, P_ij = exp(scale q_i . k_j - lse_i). */
template <int NT> __global__ void __launch_bounds__(ATT_WARPS * 32) att_bwd_dq_v2(att_args a)
{
    extern __shared__ __align__(16) unsigned char att_smem[];
    const int D = a.D;
    __nv_bfloat16 *Qs = (__nv_bfloat16 *)att_smem; /* [ROWS][D] */
    __nv_bfloat16 *dOs = Qs + ATT_ROWS * D;        /* [ROWS][D] */
    __nv_bfloat16 *Ks = dOs + ATT_ROWS * D;        /* [TILE][D+2] */
    __nv_bfloat16 *Vs = Ks + ATT_TILE * (D + 2);   /* [TILE][D+2] */
    const int seq = blockIdx.y, h = blockIdx.z, kvh = h / (a.H / a.KVH);
    const int64_t base = a.cu[seq], len = a.cu[seq + 1] - base;
    const int64_t q0 = (int64_t)blockIdx.x * ATT_ROWS;
    if (q0 >= len) return;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t qld = (int64_t)a.H * D, kld = (int64_t)a.KVH * D;
    att_load_rows(Qs, D, a.q + base * qld, qld, q0, ATT_ROWS, len, (int64_t)h * D, D);
    att_load_rows(dOs, D, a.dout + base * qld, qld, q0, ATT_ROWS, len, (int64_t)h * D, D);
    float lse[ATT_RPW], di[ATT_RPW], acc[ATT_RPW][NT];
#pragma unroll
    for (int w = 0; w < ATT_RPW; w++) {
        int64_t i = q0 + warp * ATT_RPW + w;
        lse[w] = i < len ? a.lse[(int64_t)h * a.m + base + i] : 0.0f;
        di[w] = i < len ? a.Di[(int64_t)h * a.m + base + i] : 0.0f;
#pragma unroll
        for (int t = 0; t < NT; t++) acc[w][t] = 0.0f;
    }
    int64_t kend = q0 + ATT_ROWS < len ? q0 + ATT_ROWS : len;
    for (int64_t k0 = 0; k0 < kend; k0 += ATT_TILE) {
        __syncthreads();
        att_load_rows(Ks, D + 2, a.k + base * kld, kld, k0, ATT_TILE, len, (int64_t)kvh * D, D);
        att_load_rows(Vs, D + 2, a.v + base * kld, kld, k0, ATT_TILE, len, (int64_t)kvh * D, D);
        __syncthreads();
#pragma unroll
        for (int w = 0; w < ATT_RPW; w++) {
            const int r = warp * ATT_RPW + w;
            const int64_t i = q0 + r;
            if (i >= len || i < k0) continue;
            const int64_t j = k0 + lane;
            float ds = 0.0f;
            if (j <= i) {
                float s = a.scale * att_dot(Qs + r * D, Ks + lane * (D + 2), D);
                float p = expf(s - lse[w]);
                float dp = att_dot(dOs + r * D, Vs + lane * (D + 2), D);
                ds = p * (dp - di[w]);
            }
            int nj = (int)(i - k0 + 1 < ATT_TILE ? i - k0 + 1 : ATT_TILE);
            for (int jj = 0; jj < nj; jj++) {
                float dsj = __shfl_sync(0xffffffffu, ds, jj);
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    int d = lane + 32 * t;
                    if (d < D)
                        acc[w][t] = fmaf(dsj, __bfloat162float(Ks[jj * (D + 2) + d]), acc[w][t]);
                }
            }
        }
    }
#pragma unroll
    for (int w = 0; w < ATT_RPW; w++) {
        const int64_t i = q0 + warp * ATT_RPW + w;
        if (i >= len) continue;
        __nv_bfloat16 *o = a.o + (base + i) * qld + (int64_t)h * D;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            int d = lane + 32 * t;
            if (d < D) o[d] = __float2bfloat16_rn(a.scale * acc[w][t]);
        }
    }
}

/* dk, dv: grid (ceil(max_seqlen / 32), n_seqs, KVH), att_dkv_smem(D) bytes. For key j of KV
 * head g, over the query heads h of g and the queries i >= j of the sequence:
 *   dv_j = sum P_ij dout_i,   dk_j = scale * sum P_ij (dout_i . v_j - Di_i) q_i. */
template <int NT> __global__ void __launch_bounds__(ATT_WARPS * 32) att_bwd_dkv_v2(att_args a)
{
    extern __shared__ __align__(16) unsigned char att_smem[];
    const int D = a.D;
    __nv_bfloat16 *Kr = (__nv_bfloat16 *)att_smem; /* [ROWS][D] this block's keys */
    __nv_bfloat16 *Vr = Kr + ATT_ROWS * D;         /* [ROWS][D] */
    __nv_bfloat16 *Qs = Vr + ATT_ROWS * D;         /* [TILE][D+2] */
    __nv_bfloat16 *dOs = Qs + ATT_TILE * (D + 2);  /* [TILE][D+2] */
    float *lse_s = (float *)(dOs + ATT_TILE * (D + 2));
    float *di_s = lse_s + ATT_TILE;
    const int seq = blockIdx.y, g = blockIdx.z, group = a.H / a.KVH;
    const int64_t base = a.cu[seq], len = a.cu[seq + 1] - base;
    const int64_t k0 = (int64_t)blockIdx.x * ATT_ROWS;
    if (k0 >= len) return;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t qld = (int64_t)a.H * D, kld = (int64_t)a.KVH * D;
    att_load_rows(Kr, D, a.k + base * kld, kld, k0, ATT_ROWS, len, (int64_t)g * D, D);
    att_load_rows(Vr, D, a.v + base * kld, kld, k0, ATT_ROWS, len, (int64_t)g * D, D);
    float dk[ATT_RPW][NT], dv[ATT_RPW][NT];
#pragma unroll
    for (int w = 0; w < ATT_RPW; w++)
#pragma unroll
        for (int t = 0; t < NT; t++) dk[w][t] = dv[w][t] = 0.0f;
    for (int hh = 0; hh < group; hh++) {
        const int h = g * group + hh;
        for (int64_t i0 = k0; i0 < len; i0 += ATT_TILE) {
            __syncthreads();
            att_load_rows(Qs, D + 2, a.q + base * qld, qld, i0, ATT_TILE, len, (int64_t)h * D, D);
            att_load_rows(dOs, D + 2, a.dout + base * qld, qld, i0, ATT_TILE, len,
                          (int64_t)h * D, D);
            if (threadIdx.x < ATT_TILE) {
                int64_t i = i0 + threadIdx.x;
                lse_s[threadIdx.x] = i < len ? a.lse[(int64_t)h * a.m + base + i] : 0.0f;
                di_s[threadIdx.x] = i < len ? a.Di[(int64_t)h * a.m + base + i] : 0.0f;
            }
            __syncthreads();
#pragma unroll
            for (int w = 0; w < ATT_RPW; w++) {
                const int r = warp * ATT_RPW + w;
                const int64_t j = k0 + r;
                if (j >= len || j >= i0 + ATT_TILE) continue; /* no query of the tile sees j */
                const int64_t i = i0 + lane;
                float p = 0.0f, ds = 0.0f;
                if (i >= j && i < len) {
                    float s = a.scale * att_dot(Qs + lane * (D + 2), Kr + r * D, D);
                    p = expf(s - lse_s[lane]);
                    float dp = att_dot(dOs + lane * (D + 2), Vr + r * D, D);
                    ds = p * (dp - di_s[lane]);
                }
                for (int ii = 0; ii < ATT_TILE; ii++) {
                    float pi = __shfl_sync(0xffffffffu, p, ii);
                    float dsi = __shfl_sync(0xffffffffu, ds, ii);
#pragma unroll
                    for (int t = 0; t < NT; t++) {
                        int d = lane + 32 * t;
                        if (d < D) {
                            dv[w][t] = fmaf(pi, __bfloat162float(dOs[ii * (D + 2) + d]), dv[w][t]);
                            dk[w][t] = fmaf(dsi, __bfloat162float(Qs[ii * (D + 2) + d]), dk[w][t]);
                        }
                    }
                }
            }
        }
    }
#pragma unroll
    for (int w = 0; w < ATT_RPW; w++) {
        const int64_t j = k0 + warp * ATT_RPW + w;
        if (j >= len) continue;
        __nv_bfloat16 *dko = a.dk + (base + j) * kld + (int64_t)g * D;
        __nv_bfloat16 *dvo = a.dv + (base + j) * kld + (int64_t)g * D;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            int d = lane + 32 * t;
            if (d < D) {
                dko[d] = __float2bfloat16_rn(a.scale * dk[w][t]);
                dvo[d] = __float2bfloat16_rn(dv[w][t]);
            }
        }
    }
}

#endif
