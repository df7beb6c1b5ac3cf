/* attention.cuh — causal grouped-query attention over packed sequences, forward and backward
 * (kernels and their small host launchers; included by cuda_layers.cu and dev/cuda/attention.cu).
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
#include <cuda_runtime.h>
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

/* ============================================================================================
 * Variant 3: bf16 tensor cores (mma.sync m16n8k16, f32 accumulate), FlashAttention-2 structure,
 * head_dim 64 and 128 only (templates on D); other head dims use v2. sm_80+ (mma.sync bf16,
 * ldmatrix, cp.async); on older devices the callers keep v2 (att3_usable()).
 *
 * Fragment layouts (PTX ISA, mma.m16n8k16 .bf16; lane = 4 * g + t, g = lane >> 2, t = lane & 3):
 *   A 16x16 row-major, 4 regs of bf16x2: a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..],
 *     a3 = A[g+8][2t+8..];  B 16x8 (k x n), 2 regs: b0 = B[2t..2t+1][g], b1 = B[2t+8..][g];
 *   C 16x8 f32, 4 regs: c0,c1 = C[g][2t..2t+1], c2,c3 = C[g+8][2t..2t+1].
 * So a C tile pair covering 16 columns is, packed to bf16, directly the A fragment of the next
 * product (P of P V, dS of dS K): no shared-memory round trip for the probabilities.
 * Shared tiles are [rows][D + 8] bf16: the 16-byte pad makes the row stride an odd number of
 * 16-byte chunks, so the 8 row addresses of each ldmatrix 8x8 matrix hit 8 different bank groups.
 *
 * Kernels (4 warps, 64 rows per block, each warp 16 rows):
 *   att_fwd_v3   block = 64 queries of one (sequence, head); key tiles of 64 up to the diagonal
 *                (tiles past the block's last query are never visited); S = Q K^T, online softmax
 *                in the exp2 domain (row max / sum over the quad by shuffles), O += P V in f32
 *                registers; masking only on the diagonal tile (the only one that can hold a key
 *                after a query or past the sequence end). Writes out (bf16) and lse (f32, natural
 *                log). Heaviest query tiles are launched first (blockIdx.x reversed).
 *   att_bwd_dq_v3  block = 64 queries of one head; walks key tiles like the forward, recomputes
 *                P = exp(S - lse), dS = P (dO V^T - Di), dQ += dS K.
 *   att_bwd_dkv_v3 block = 64 keys of one KV head and a chunk of its group's query heads; walks
 *                the query tiles (BQ = 64 for D 64, 32 for D 128, to stay clear of register
 *                spills) from the key tile on: S^T = K Q^T, P^T, dP^T = V dO^T,
 *                dV += P^T dO, dK += dS^T Q. With split == 1 (one chunk = the whole group) it
 *                writes dk/dv in bf16; with split > 1 every chunk writes f32 partials to a
 *                workspace and att_bwd_dkv_reduce_v3 sums the chunks in a fixed order.
 * Everything is deterministic: each output element is written by one thread, no atomics.
 */
#define ATT3_ROWS 64  /* queries (fwd, dq) or keys (dkv) per block */
#define ATT3_KT 64    /* keys per tile (fwd, dq) */
#define ATT3_WARPS 4  /* each warp owns 16 rows */
#define ATT3_LOG2E 1.4426950408889634f
#define ATT3_LN2 0.6931471805599453f

/* true when v3 can run: D 64 or 128, device sm_80+, and every tensor 16-byte aligned (cp.async
 * reads 16-byte chunks; rows are D * heads bf16 long, a multiple of 8 elements). */
static inline bool att3_usable(int D, int cc_major, const void *const *ptrs, int n)
{
    if ((D != 64 && D != 128) || cc_major < 8) return false;
    for (int i = 0; i < n; i++)
        if (ptrs[i] && ((uintptr_t)ptrs[i] & 15u) != 0) return false;
    return true;
}

__device__ __forceinline__ void att3_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap();
#endif
}

__device__ __forceinline__ void att3_ldsm_x4(uint32_t r[4], const __nv_bfloat16 *p)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    uint32_t addr = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#else
    __trap();
#endif
}

__device__ __forceinline__ void att3_ldsm_x4_t(uint32_t r[4], const __nv_bfloat16 *p)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    uint32_t addr = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#else
    __trap();
#endif
}

/* 16-byte async copy global -> shared; bytes = 0 zero-fills the destination. */
__device__ __forceinline__ void att3_cp16(__nv_bfloat16 *dst, const __nv_bfloat16 *src, int bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    uint32_t addr = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(src),
                 "r"(bytes)
                 : "memory");
#else
    __trap();
#endif
}

__device__ __forceinline__ void att3_cp_commit(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int N> __device__ __forceinline__ void att3_cp_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

__device__ __forceinline__ uint32_t att3_pack(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); /* .x (lo) = low 16 bits = lower column */
    return *(uint32_t *)&v;
}

/* A fragment: rows [r0, r0+16) x cols [c0, c0+16) of a row-major [row][col] tile. */
template <int SD>
__device__ __forceinline__ void att3_ldA(uint32_t a[4], const __nv_bfloat16 *s, int r0, int c0,
                                         int lane)
{
    const int mi = lane >> 3; /* lanes 8mi..8mi+7 address the rows of matrix mi = a[mi] */
    att3_ldsm_x4(a, s + (r0 + (mi & 1) * 8 + (lane & 7)) * SD + c0 + (mi >> 1) * 8);
}

/* B fragments of two n-tiles (n0, n0+8) x k [k0, k0+16) from a tile stored [n][k] (e.g. K for
 * S = Q K^T): b[0], b[1] for n-tile n0, b[2], b[3] for n0 + 8. */
template <int SD>
__device__ __forceinline__ void att3_ldB_nk(uint32_t b[4], const __nv_bfloat16 *s, int n0, int k0,
                                            int lane)
{
    const int mi = lane >> 3;
    att3_ldsm_x4(b, s + (n0 + (mi >> 1) * 8 + (lane & 7)) * SD + k0 + (mi & 1) * 8);
}

/* Same from a tile stored [k][n] (e.g. V for O = P V), through ldmatrix.trans. */
template <int SD>
__device__ __forceinline__ void att3_ldB_kn(uint32_t b[4], const __nv_bfloat16 *s, int k0, int n0,
                                            int lane)
{
    const int mi = lane >> 3;
    att3_ldsm_x4_t(b, s + (k0 + (mi & 1) * 8 + (lane & 7)) * SD + n0 + (mi >> 1) * 8);
}

/* Async copy of rows [r0, r0 + n) (relative to g, row stride ld) x D columns into s ([n][D+8]);
 * rows at or beyond `limit` are zero-filled. Whole block; caller commits. */
template <int D>
__device__ __forceinline__ void att3_load(__nv_bfloat16 *s, const __nv_bfloat16 *g, int64_t ld,
                                          int64_t r0, int n, int64_t limit)
{
    constexpr int CH = D / 8; /* 16-byte chunks per row */
    for (int i = threadIdx.x; i < n * CH; i += blockDim.x) {
        const int r = i / CH, c = (i % CH) * 8;
        const bool ok = r0 + r < limit;
        att3_cp16(s + r * (D + 8) + c, g + (ok ? r0 + r : 0) * ld + c, ok ? 16 : 0);
    }
}

static inline size_t att3_fwd_smem(int D)
{
    return sizeof(__nv_bfloat16) * 3 * (size_t)ATT3_ROWS * (D + 8);
}
static inline size_t att3_dq_smem(int D)
{
    return sizeof(__nv_bfloat16) * 4 * (size_t)ATT3_ROWS * (D + 8);
}
static inline int att3_bq(int D) { return D <= 64 ? 64 : 32; }
static inline size_t att3_dkv_smem(int D)
{
    return sizeof(__nv_bfloat16) * (2 * (size_t)ATT3_ROWS + 2 * (size_t)att3_bq(D)) * (D + 8) +
           2 * (size_t)att3_bq(D) * sizeof(float);
}

/* grid (ceil(max_seqlen / 64), n_seqs, H), 128 threads, att3_fwd_smem(D) bytes. */
template <int D> __global__ void __launch_bounds__(ATT3_WARPS * 32) att_fwd_v3(att_args a)
{
    extern __shared__ __align__(16) unsigned char att_smem[];
    constexpr int SD = D + 8, NO = D / 8;
    __nv_bfloat16 *Qs = (__nv_bfloat16 *)att_smem, *Ks = Qs + ATT3_ROWS * SD,
                  *Vs = Ks + ATT3_KT * SD;
    const int seq = blockIdx.y, h = blockIdx.z, kvh = h / (a.H / a.KVH);
    const int64_t base = a.cu[seq], len = a.cu[seq + 1] - base;
    const int64_t q0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * ATT3_ROWS; /* heavy tiles first */
    if (q0 >= len) return;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    const int64_t qld = (int64_t)a.H * D, kld = (int64_t)a.KVH * D;
    const __nv_bfloat16 *qg = a.q + base * qld + (int64_t)h * D;
    const __nv_bfloat16 *kg = a.k + base * kld + (int64_t)kvh * D;
    const __nv_bfloat16 *vg = a.v + base * kld + (int64_t)kvh * D;
    att3_load<D>(Qs, qg, qld, q0, ATT3_ROWS, len);
    att3_cp_commit();
    att3_cp_wait<0>();
    __syncthreads();
    uint32_t qf[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) att3_ldA<SD>(qf[kk], Qs, warp * 16, kk * 16, lane);

    const float sl2 = a.scale * ATT3_LOG2E; /* scores in the log2 domain */
    float o[NO][4], mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < NO; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    const int64_t r0 = q0 + warp * 16 + g; /* this thread's rows: r0 and r0 + 8 */
    const int64_t kend = q0 + ATT3_ROWS < len ? q0 + ATT3_ROWS : len;
    for (int64_t k0 = 0; k0 < kend; k0 += ATT3_KT) {
        __syncthreads(); /* every warp is done with the previous K and V tiles */
        att3_load<D>(Ks, kg, kld, k0, ATT3_KT, len);
        att3_cp_commit();
        att3_load<D>(Vs, vg, kld, k0, ATT3_KT, len);
        att3_cp_commit();
        att3_cp_wait<1>(); /* K landed; V may still be in flight during Q K^T */
        __syncthreads();
        float s[ATT3_KT / 8][4];
#pragma unroll
        for (int n = 0; n < ATT3_KT / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
#pragma unroll
            for (int np = 0; np < ATT3_KT / 16; np++) {
                uint32_t b[4];
                att3_ldB_nk<SD>(b, Ks, np * 16, kk * 16, lane);
                att3_mma(s[2 * np], qf[kk], b[0], b[1]);
                att3_mma(s[2 * np + 1], qf[kk], b[2], b[3]);
            }
        if (k0 + ATT3_KT > q0) { /* diagonal tile: key j visible to row i iff j <= i, j < len */
#pragma unroll
            for (int n = 0; n < ATT3_KT / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int64_t j = k0 + n * 8 + 2 * t + (e & 1), i = r0 + (e >> 1) * 8;
                    if (j > i || j >= len) s[n][e] = -INFINITY;
                }
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = -INFINITY;
#pragma unroll
            for (int n = 0; n < ATT3_KT / 8; n++) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            /* key 0 of the sequence is visible to every row, so after the first tile mrow is
             * finite and no row ever computes -inf - -inf */
            const float mnew = fmaxf(mrow[r], mx * sl2);
            const float corr = exp2f(mrow[r] - mnew); /* 0 on the first tile */
            mrow[r] = mnew;
            float rs = 0.0f;
#pragma unroll
            for (int n = 0; n < ATT3_KT / 8; n++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float p = exp2f(s[n][2 * r + e] * sl2 - mnew); /* -inf -> 0 */
                    s[n][2 * r + e] = p;
                    rs += p;
                }
            lrow[r] = lrow[r] * corr + rs; /* this thread's columns; quad-summed at the end */
#pragma unroll
            for (int n = 0; n < NO; n++) o[n][2 * r] *= corr, o[n][2 * r + 1] *= corr;
        }
        att3_cp_wait<0>();
        __syncthreads();
#pragma unroll
        for (int j = 0; j < ATT3_KT / 16; j++) {
            uint32_t pa[4] = {att3_pack(s[2 * j][0], s[2 * j][1]), att3_pack(s[2 * j][2], s[2 * j][3]),
                              att3_pack(s[2 * j + 1][0], s[2 * j + 1][1]),
                              att3_pack(s[2 * j + 1][2], s[2 * j + 1][3])};
#pragma unroll
            for (int np = 0; np < NO / 2; np++) {
                uint32_t b[4];
                att3_ldB_kn<SD>(b, Vs, j * 16, np * 16, lane);
                att3_mma(o[2 * np], pa, b[0], b[1]);
                att3_mma(o[2 * np + 1], pa, b[2], b[3]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float l = lrow[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int64_t i = r0 + 8 * r;
        if (i >= len) continue;
        const float inv = 1.0f / l;
        __nv_bfloat16 *og = a.o + (base + i) * qld + (int64_t)h * D;
#pragma unroll
        for (int n = 0; n < NO; n++)
            *(__nv_bfloat162 *)(og + n * 8 + 2 * t) =
                __floats2bfloat162_rn(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
        if (t == 0) a.lse[(int64_t)h * a.m + base + i] = mrow[r] * ATT3_LN2 + logf(l);
    }
}

/* dq: grid (ceil(max_seqlen / 64), n_seqs, H), 128 threads, att3_dq_smem(D) bytes; needs Di. */
template <int D> __global__ void __launch_bounds__(ATT3_WARPS * 32) att_bwd_dq_v3(att_args a)
{
    extern __shared__ __align__(16) unsigned char att_smem[];
    constexpr int SD = D + 8, NO = D / 8;
    __nv_bfloat16 *Qs = (__nv_bfloat16 *)att_smem, *dOs = Qs + ATT3_ROWS * SD,
                  *Ks = dOs + ATT3_ROWS * SD, *Vs = Ks + ATT3_KT * SD;
    const int seq = blockIdx.y, h = blockIdx.z, kvh = h / (a.H / a.KVH);
    const int64_t base = a.cu[seq], len = a.cu[seq + 1] - base;
    const int64_t q0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * ATT3_ROWS;
    if (q0 >= len) return;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    const int64_t qld = (int64_t)a.H * D, kld = (int64_t)a.KVH * D;
    const __nv_bfloat16 *kg = a.k + base * kld + (int64_t)kvh * D;
    const __nv_bfloat16 *vg = a.v + base * kld + (int64_t)kvh * D;
    att3_load<D>(Qs, a.q + base * qld + (int64_t)h * D, qld, q0, ATT3_ROWS, len);
    att3_load<D>(dOs, a.dout + base * qld + (int64_t)h * D, qld, q0, ATT3_ROWS, len);
    att3_cp_commit();
    const float sl2 = a.scale * ATT3_LOG2E;
    const int64_t r0 = q0 + warp * 16 + g;
    float lse2[2], di[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t i = r0 + 8 * r;
        lse2[r] = i < len ? a.lse[(int64_t)h * a.m + base + i] * ATT3_LOG2E : 0.0f;
        di[r] = i < len ? a.Di[(int64_t)h * a.m + base + i] : 0.0f;
    }
    float dq[NO][4];
#pragma unroll
    for (int n = 0; n < NO; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
    const int64_t kend = q0 + ATT3_ROWS < len ? q0 + ATT3_ROWS : len;
    for (int64_t k0 = 0; k0 < kend; k0 += ATT3_KT) {
        __syncthreads();
        att3_load<D>(Ks, kg, kld, k0, ATT3_KT, len);
        att3_load<D>(Vs, vg, kld, k0, ATT3_KT, len);
        att3_cp_commit();
        att3_cp_wait<0>();
        __syncthreads();
        float s[ATT3_KT / 8][4], dp[ATT3_KT / 8][4];
#pragma unroll
        for (int n = 0; n < ATT3_KT / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t qa[4], da[4];
            att3_ldA<SD>(qa, Qs, warp * 16, kk * 16, lane);
            att3_ldA<SD>(da, dOs, warp * 16, kk * 16, lane);
#pragma unroll
            for (int np = 0; np < ATT3_KT / 16; np++) {
                uint32_t b[4];
                att3_ldB_nk<SD>(b, Ks, np * 16, kk * 16, lane);
                att3_mma(s[2 * np], qa, b[0], b[1]);
                att3_mma(s[2 * np + 1], qa, b[2], b[3]);
                att3_ldB_nk<SD>(b, Vs, np * 16, kk * 16, lane); /* dP = dO V^T */
                att3_mma(dp[2 * np], da, b[0], b[1]);
                att3_mma(dp[2 * np + 1], da, b[2], b[3]);
            }
        }
        const bool diag = k0 + ATT3_KT > q0;
#pragma unroll
        for (int n = 0; n < ATT3_KT / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1;
                const int64_t j = k0 + n * 8 + 2 * t + (e & 1), i = r0 + 8 * r;
                float p = exp2f(s[n][e] * sl2 - lse2[r]);
                if (diag && (j > i || j >= len)) p = 0.0f;
                s[n][e] = p * (dp[n][e] - di[r]); /* dS */
            }
#pragma unroll
        for (int j = 0; j < ATT3_KT / 16; j++) {
            uint32_t da[4] = {att3_pack(s[2 * j][0], s[2 * j][1]), att3_pack(s[2 * j][2], s[2 * j][3]),
                              att3_pack(s[2 * j + 1][0], s[2 * j + 1][1]),
                              att3_pack(s[2 * j + 1][2], s[2 * j + 1][3])};
#pragma unroll
            for (int np = 0; np < NO / 2; np++) {
                uint32_t b[4];
                att3_ldB_kn<SD>(b, Ks, j * 16, np * 16, lane); /* dQ += dS K */
                att3_mma(dq[2 * np], da, b[0], b[1]);
                att3_mma(dq[2 * np + 1], da, b[2], b[3]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t i = r0 + 8 * r;
        if (i >= len) continue;
        __nv_bfloat16 *og = a.o + (base + i) * qld + (int64_t)h * D;
#pragma unroll
        for (int n = 0; n < NO; n++)
            *(__nv_bfloat162 *)(og + n * 8 + 2 * t) =
                __floats2bfloat162_rn(a.scale * dq[n][2 * r], a.scale * dq[n][2 * r + 1]);
    }
}

/* dk, dv: grid (ceil(max_seqlen / 64), n_seqs, KVH * split), 128 threads, att3_dkv_smem(D)
 * bytes. blockIdx.z = kv head * split + chunk; the chunk covers query heads
 * [g * group + chunk * group / split, + group / split). split == 1: writes a.dk, a.dv (bf16);
 * else writes f32 partials ws[chunk][row][kvh * D + d] (dk, then dv after split * m * KVH * D
 * floats) for att_bwd_dkv_reduce_v3. */
template <int D, int BQ>
__global__ void __launch_bounds__(ATT3_WARPS * 32) att_bwd_dkv_v3(att_args a, int split, float *ws)
{
    extern __shared__ __align__(16) unsigned char att_smem[];
    constexpr int SD = D + 8, NO = D / 8, NS = BQ / 8;
    __nv_bfloat16 *Ks = (__nv_bfloat16 *)att_smem, *Vs = Ks + ATT3_ROWS * SD,
                  *Qs = Vs + ATT3_ROWS * SD, *dOs = Qs + BQ * SD;
    float *lse_s = (float *)(dOs + BQ * SD), *di_s = lse_s + BQ;
    const int seq = blockIdx.y, group = a.H / a.KVH, gk = blockIdx.z / split,
              chunk = blockIdx.z % split, hpc = group / split;
    const int64_t base = a.cu[seq], len = a.cu[seq + 1] - base;
    const int64_t k0 = (int64_t)blockIdx.x * ATT3_ROWS; /* tile 0 walks the most queries: first */
    if (k0 >= len) return;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    const int64_t qld = (int64_t)a.H * D, kld = (int64_t)a.KVH * D;
    att3_load<D>(Ks, a.k + base * kld + (int64_t)gk * D, kld, k0, ATT3_ROWS, len);
    att3_load<D>(Vs, a.v + base * kld + (int64_t)gk * D, kld, k0, ATT3_ROWS, len);
    att3_cp_commit();
    const float sl2 = a.scale * ATT3_LOG2E;
    const int64_t jr = k0 + warp * 16 + g; /* this thread's keys: jr and jr + 8 */
    float dk[NO][4], dv[NO][4];
#pragma unroll
    for (int n = 0; n < NO; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.0f;
    for (int hh = 0; hh < hpc; hh++) {
        const int h = gk * group + chunk * hpc + hh;
        const __nv_bfloat16 *qg = a.q + base * qld + (int64_t)h * D;
        const __nv_bfloat16 *dog = a.dout + base * qld + (int64_t)h * D;
        for (int64_t i0 = k0; i0 < len; i0 += BQ) {
            __syncthreads();
            att3_load<D>(Qs, qg, qld, i0, BQ, len);
            att3_load<D>(dOs, dog, qld, i0, BQ, len);
            att3_cp_commit();
            if (threadIdx.x < BQ) {
                const int64_t i = i0 + threadIdx.x;
                lse_s[threadIdx.x] = i < len ? a.lse[(int64_t)h * a.m + base + i] * ATT3_LOG2E : 0.0f;
                di_s[threadIdx.x] = i < len ? a.Di[(int64_t)h * a.m + base + i] : 0.0f;
            }
            att3_cp_wait<0>();
            __syncthreads();
            if (i0 + BQ <= k0 + warp * 16) continue; /* every query precedes this warp's keys */
            float s[NS][4], dp[NS][4];
#pragma unroll
            for (int n = 0; n < NS; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                uint32_t ka[4], va[4];
                att3_ldA<SD>(ka, Ks, warp * 16, kk * 16, lane);
                att3_ldA<SD>(va, Vs, warp * 16, kk * 16, lane);
#pragma unroll
                for (int np = 0; np < BQ / 16; np++) {
                    uint32_t b[4];
                    att3_ldB_nk<SD>(b, Qs, np * 16, kk * 16, lane); /* S^T = K Q^T */
                    att3_mma(s[2 * np], ka, b[0], b[1]);
                    att3_mma(s[2 * np + 1], ka, b[2], b[3]);
                    att3_ldB_nk<SD>(b, dOs, np * 16, kk * 16, lane); /* dP^T = V dO^T */
                    att3_mma(dp[2 * np], va, b[0], b[1]);
                    att3_mma(dp[2 * np + 1], va, b[2], b[3]);
                }
            }
            const bool edge = i0 < k0 + ATT3_ROWS || i0 + BQ > len;
#pragma unroll
            for (int n = 0; n < NS; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int c = n * 8 + 2 * t + (e & 1);
                    const int64_t i = i0 + c, j = jr + 8 * (e >> 1);
                    float p = exp2f(s[n][e] * sl2 - lse_s[c]);
                    if (edge && (i < j || i >= len)) p = 0.0f;
                    s[n][e] = p;
                    dp[n][e] = p * (dp[n][e] - di_s[c]); /* dS^T */
                }
#pragma unroll
            for (int jj = 0; jj < BQ / 16; jj++) {
                uint32_t pa[4] = {att3_pack(s[2 * jj][0], s[2 * jj][1]),
                                  att3_pack(s[2 * jj][2], s[2 * jj][3]),
                                  att3_pack(s[2 * jj + 1][0], s[2 * jj + 1][1]),
                                  att3_pack(s[2 * jj + 1][2], s[2 * jj + 1][3])};
                uint32_t da[4] = {att3_pack(dp[2 * jj][0], dp[2 * jj][1]),
                                  att3_pack(dp[2 * jj][2], dp[2 * jj][3]),
                                  att3_pack(dp[2 * jj + 1][0], dp[2 * jj + 1][1]),
                                  att3_pack(dp[2 * jj + 1][2], dp[2 * jj + 1][3])};
#pragma unroll
                for (int np = 0; np < NO / 2; np++) {
                    uint32_t b[4];
                    att3_ldB_kn<SD>(b, dOs, jj * 16, np * 16, lane); /* dV += P^T dO */
                    att3_mma(dv[2 * np], pa, b[0], b[1]);
                    att3_mma(dv[2 * np + 1], pa, b[2], b[3]);
                    att3_ldB_kn<SD>(b, Qs, jj * 16, np * 16, lane); /* dK += dS^T Q */
                    att3_mma(dk[2 * np], da, b[0], b[1]);
                    att3_mma(dk[2 * np + 1], da, b[2], b[3]);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t j = jr + 8 * r;
        if (j >= len) continue;
        const int64_t off = (base + j) * kld + (int64_t)gk * D;
        if (split == 1) {
#pragma unroll
            for (int n = 0; n < NO; n++) {
                *(__nv_bfloat162 *)(a.dk + off + n * 8 + 2 * t) =
                    __floats2bfloat162_rn(a.scale * dk[n][2 * r], a.scale * dk[n][2 * r + 1]);
                *(__nv_bfloat162 *)(a.dv + off + n * 8 + 2 * t) =
                    __floats2bfloat162_rn(dv[n][2 * r], dv[n][2 * r + 1]);
            }
        } else {
            float *wk = ws + (int64_t)chunk * a.m * kld + off;
            float *wv = wk + (int64_t)split * a.m * kld;
#pragma unroll
            for (int n = 0; n < NO; n++) {
                *(float2 *)(wk + n * 8 + 2 * t) =
                    make_float2(a.scale * dk[n][2 * r], a.scale * dk[n][2 * r + 1]);
                *(float2 *)(wv + n * 8 + 2 * t) = make_float2(dv[n][2 * r], dv[n][2 * r + 1]);
            }
        }
    }
}

/* dk, dv (m, KVH * D) bf16 = sum over chunks 0..split-1, in that order, of the f32 partials;
 * only rows [cu[0], cu[n_seqs]) (the rows the chunks wrote; rows outside every sequence are left
 * untouched, as the split == 1 path and v2 do). */
__global__ void att_bwd_dkv_reduce_v3(att_args a, int n_seqs, int split, const float *ws)
{
    const int64_t n = a.m * a.KVH * a.D, ld = (int64_t)a.KVH * a.D;
    const int64_t x0 = a.cu[0] * ld, x1 = a.cu[n_seqs] * ld;
    for (int64_t x = x0 + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; x < x1;
         x += (int64_t)gridDim.x * blockDim.x) {
        float sk = 0.0f, sv = 0.0f;
        for (int c = 0; c < split; c++) {
            sk += ws[c * n + x];
            sv += ws[(split + c) * n + x];
        }
        a.dk[x] = __float2bfloat16_rn(sk);
        a.dv[x] = __float2bfloat16_rn(sv);
    }
}

/* Chunks of the query-head group that the dk/dv kernel splits into: the smallest divisor of the
 * group giving at least two blocks per SM (the key tiles x sequences x KV heads alone are often
 * fewer than the SMs at sequence 512), as long as the f32 partials fit in max_ws bytes. */
static inline int att3_dkv_split(int group, int64_t blocks, int n_sms, int64_t m, int KVH, int D,
                                 size_t max_ws)
{
    int best = 1;
    for (int s = 2; s <= group; s++) {
        if (group % s) continue;
        if ((size_t)2 * s * m * KVH * D * sizeof(float) > max_ws) break;
        best = s;
        if (blocks * s >= 2 * (int64_t)n_sms) break;
    }
    if (blocks >= 2 * (int64_t)n_sms) best = 1;
    return best;
}
static inline size_t att3_ws_bytes(int split, int64_t m, int KVH, int D)
{
    return split > 1 ? (size_t)2 * split * m * KVH * D * sizeof(float) : 0;
}

/* Host launchers (shared by the backend and the dev program). Return the first CUDA error. */
template <int D>
static cudaError_t att3_fwd(const att_args &a, int n_seqs, int64_t max_seqlen, cudaStream_t st)
{
    const size_t sm = att3_fwd_smem(D);
    cudaError_t e = cudaFuncSetAttribute(att_fwd_v3<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)sm);
    if (e != cudaSuccess) return e;
    dim3 grid((unsigned)((max_seqlen + ATT3_ROWS - 1) / ATT3_ROWS), (unsigned)n_seqs,
              (unsigned)a.H);
    att_fwd_v3<D><<<grid, ATT3_WARPS * 32, sm, st>>>(a);
    return cudaGetLastError();
}

/* a.Di must hold rowsum(dout * out) (att_bwd_di) before this runs; ws: att3_ws_bytes(split, ...)
 * bytes (NULL when split == 1). */
template <int D>
static cudaError_t att3_bwd(const att_args &a, int n_seqs, int64_t max_seqlen, int split,
                            float *ws, cudaStream_t st)
{
    constexpr int BQ = D <= 64 ? 64 : 32;
    const size_t sq = att3_dq_smem(D), skv = att3_dkv_smem(D);
    cudaError_t e = cudaFuncSetAttribute(att_bwd_dq_v3<D>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sq);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(att_bwd_dkv_v3<D, BQ>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)skv);
    if (e != cudaSuccess) return e;
    const unsigned tiles = (unsigned)((max_seqlen + ATT3_ROWS - 1) / ATT3_ROWS);
    att_bwd_dq_v3<D><<<dim3(tiles, (unsigned)n_seqs, (unsigned)a.H), ATT3_WARPS * 32, sq, st>>>(a);
    att_bwd_dkv_v3<D, BQ><<<dim3(tiles, (unsigned)n_seqs, (unsigned)(a.KVH * split)),
                            ATT3_WARPS * 32, skv, st>>>(a, split, ws);
    if (split > 1) {
        int64_t n = a.m * a.KVH * a.D;
        int64_t b = (n + 255) / 256;
        att_bwd_dkv_reduce_v3<<<(unsigned)(b < (1 << 20) ? b : (1 << 20)), 256, 0, st>>>(
            a, n_seqs, split, ws);
    }
    return cudaGetLastError();
}

#endif
