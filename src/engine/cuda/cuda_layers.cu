/* cuda_layers.cu — the CUDA backend's layer ops: embedding, RMSNorm, RoPE, attention, SwiGLU.
 * bf16 in and out, f32 arithmetic; row reductions are done by one block in a fixed order. The
 * RMSNorm, RoPE, SwiGLU and attention kernels live in their own headers (rmsnorm.cuh, rope.cuh,
 * swiglu.cuh, attention.cuh), which dev/cuda's programs include to validate and time them. */
#include "engine/cuda/attention.cuh"
#include "engine/cuda/bf16x8.cuh"
#include "engine/cuda/cuda_internal.h"
#include "engine/cuda/cuda_memory_plan.h"
#include "engine/cuda/rmsnorm.cuh"
#include "engine/cuda/rope.cuh"
#include "engine/cuda/swiglu.cuh"

#define EW_THREADS 256

/* ---------------------------------------------------------------- embedding ---- */

template <typename W>
__global__ void embedding_kernel(const W *table, int64_t vocab, int64_t d, const int32_t *ids,
                                 int64_t m, bf16 *out, int *dev_error)
{
    int64_t n = m * d;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / d, c = i % d;
        int32_t id = ids[r];
        if (id < 0 || id >= vocab) {
            if (c == 0) atomicCAS(dev_error, 0, CUDA_DEVERR_TOKEN_ID);
            out[i] = __float2bfloat16_rn(0.0f);
            continue;
        }
        out[i] = __float2bfloat16_rn((float)table[id * d + c]);
    }
}

tdm_status cuda_embedding(tdm_backend *be, const tdm_be_weight *w, const int32_t *ids, int64_t m,
                          void *out, tdm_error *err)
{
    cuda_backend *cb = cuda_of(be);
    unsigned blocks = cuda_blocks(m * w->cols, EW_THREADS * 4);
    if (w->format == TDM_BE_W_BF16)
        embedding_kernel<bf16><<<blocks, EW_THREADS, 0, cb->stream>>>(
            (const bf16 *)w->data, w->rows, w->cols, ids, m, (bf16 *)out, cb->dev_error);
    else
        embedding_kernel<float><<<blocks, EW_THREADS, 0, cb->stream>>>(
            (const float *)w->data, w->rows, w->cols, ids, m, (bf16 *)out, cb->dev_error);
    CU_LAUNCHED("embedding_kernel");
    return TDM_OK;
}

/* ------------------------------------------------------------------ RMSNorm ---- */

tdm_status cuda_rmsnorm_fwd(tdm_backend *be, const void *x, const float *w, int64_t rows,
                            int64_t d, float eps, void *y, float *rstd, tdm_error *err)
{
    cuda_backend *cb = cuda_of(be);
    if (rows > 0x7fffffff) return tdm_fail(err, TDM_ERR_UNSUPPORTED, "rmsnorm_fwd: too many rows");
    rmsnorm_fwd_launch(bf16x8_ok(d, x, w, y), (const bf16 *)x, w, rows, d, eps, (bf16 *)y, rstd,
                       cb->stream);
    CU_LAUNCHED("rmsnorm_fwd_v8_kernel / rmsnorm_fwd_kernel");
    return TDM_OK;
}

tdm_status cuda_rmsnorm_bwd(tdm_backend *be, const void *dy, const void *x, const float *w,
                            const float *rstd, int64_t rows, int64_t d, void *dx, float beta,
                            tdm_error *err)
{
    cuda_backend *cb = cuda_of(be);
    if (rows > 0x7fffffff) return tdm_fail(err, TDM_ERR_UNSUPPORTED, "rmsnorm_bwd: too many rows");
    rmsnorm_bwd_launch(bf16x8_ok(d, dy, x, w, dx), (const bf16 *)dy, (const bf16 *)x, w, rstd, rows,
                       d, (bf16 *)dx, beta, cb->stream);
    CU_LAUNCHED("rmsnorm_bwd_v8_kernel / rmsnorm_bwd_kernel");
    return TDM_OK;
}

/* --------------------------------------------------------------------- RoPE ---- */

tdm_status cuda_rope(tdm_backend *be, void *x, int64_t m, int64_t n_heads, int64_t head_dim,
                     int64_t ld, const int32_t *pos, const float *inv_freq, bool inverse,
                     tdm_error *err)
{
    cuda_backend *cb = cuda_of(be);
    rope_launch((bf16 *)x, m, n_heads, head_dim, ld, pos, inv_freq, inverse, cb->stream);
    CU_LAUNCHED("rope_kernel");
    return TDM_OK;
}

/* ---------------------------------------------------------------- attention ---- */

static tdm_status att_check(const tdm_be_seqs *s, int64_t head_dim, const char *op,
                            tdm_error *err)
{
    if (head_dim % 2 != 0 || head_dim > 256)
        return tdm_fail(err, TDM_ERR_UNSUPPORTED,
                        "%s: head_dim %lld not supported on CUDA (even, at most 256)", op,
                        (long long)head_dim);
    if (s->n_seqs > 65535)
        return tdm_fail(err, TDM_ERR_UNSUPPORTED, "%s: more than 65535 sequences in one batch",
                        op);
    return TDM_OK;
}

/* Sets the dynamic shared-memory limit of a kernel when it needs more than the default 48 KB. */
template <typename K>
static tdm_status att_smem(cuda_backend *cb, K kernel, size_t bytes, const char *op,
                           tdm_error *err)
{
    if (bytes > cb->max_smem_optin)
        return tdm_fail(err, TDM_ERR_UNSUPPORTED, "%s: needs %zu bytes of shared memory, device "
                        "allows %zu", op, bytes, cb->max_smem_optin);
    if (bytes > 48 * 1024)
        CU(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    return TDM_OK;
}

/* Compute capability major of the backend's device (v3 needs sm_80: mma.sync bf16, cp.async). */
static int att_cc_major(cuda_backend *cb)
{
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, cb->device) != cudaSuccess)
        return 0;
    return major;
}

#define ATT_DISPATCH(NTV, CALL)                                                                    \
    switch (NTV) {                                                                                 \
    case 1: CALL(1); break;                                                                        \
    case 2: CALL(2); break;                                                                        \
    case 3: CALL(3); break;                                                                        \
    case 4: CALL(4); break;                                                                        \
    case 5: CALL(5); break;                                                                        \
    case 6: CALL(6); break;                                                                        \
    case 7: CALL(7); break;                                                                        \
    default: CALL(8); break;                                                                       \
    }

tdm_status cuda_attention_fwd(tdm_backend *be, const tdm_be_seqs *s, const void *q, const void *k,
                              const void *v, int64_t n_heads, int64_t n_kv_heads,
                              int64_t head_dim, float scale, void *out, float *lse,
                              tdm_error *err)
{
    cuda_backend *cb = cuda_of(be);
    TDM_TRY(att_check(s, head_dim, "attention_fwd", err));
    if (s->n_seqs == 0 || s->max_seqlen == 0) return TDM_OK;
    att_args a = {};
    a.cu = s->cu_seqlens;
    a.q = (const bf16 *)q;
    a.k = (const bf16 *)k;
    a.v = (const bf16 *)v;
    a.o = (bf16 *)out;
    a.lse = lse;
    a.m = s->m;
    a.H = (int)n_heads;
    a.KVH = (int)n_kv_heads;
    a.D = (int)head_dim;
    a.scale = scale;
    const void *ptrs[5] = {q, k, v, out, NULL};
    if (att3_usable(a.D, att_cc_major(cb), ptrs, 4) && att3_fwd_smem(a.D) <= cb->max_smem_optin) {
        /* tensor cores (v3), head_dim 64 / 128; the launcher opts in to its shared memory */
        CU(a.D == 64 ? att3_fwd<64>(a, (int)s->n_seqs, s->max_seqlen, cb->stream)
                     : att3_fwd<128>(a, (int)s->n_seqs, s->max_seqlen, cb->stream));
        return TDM_OK;
    }
    dim3 grid((unsigned)((s->max_seqlen + ATT_ROWS - 1) / ATT_ROWS), (unsigned)s->n_seqs,
              (unsigned)n_heads);
    size_t smem = att_fwd_smem(a.D);
    int nt = (a.D + 31) / 32;
#define FWD(N)                                                                                     \
    do {                                                                                           \
        TDM_TRY(att_smem(cb, att_fwd_v2<N>, smem, "attention_fwd", err));                          \
        att_fwd_v2<N><<<grid, ATT_WARPS * 32, smem, cb->stream>>>(a);                              \
    } while (0)
    ATT_DISPATCH(nt, FWD)
#undef FWD
    CU_LAUNCHED("att_fwd_v2");
    return TDM_OK;
}

tdm_status cuda_attention_bwd(tdm_backend *be, const tdm_be_seqs *s, const void *q, const void *k,
                              const void *v, const void *out, const float *lse, const void *dout,
                              int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale,
                              void *dq, void *dk, void *dv, tdm_error *err)
{
    cuda_backend *cb = cuda_of(be);
    TDM_TRY(att_check(s, head_dim, "attention_bwd", err));
    if (s->n_seqs == 0 || s->max_seqlen == 0) return TDM_OK;
    void *di;
    TDM_TRY(cuda_scratch_get(cb, 1, (size_t)(n_heads * s->m) * sizeof(float), &di, err));
    att_args a = {};
    a.cu = s->cu_seqlens;
    a.q = (const bf16 *)q;
    a.k = (const bf16 *)k;
    a.v = (const bf16 *)v;
    a.out = (const bf16 *)out;
    a.dout = (const bf16 *)dout;
    a.lse = (float *)lse;
    a.Di = (const float *)di;
    a.o = (bf16 *)dq;
    a.dk = (bf16 *)dk;
    a.dv = (bf16 *)dv;
    a.m = s->m;
    a.H = (int)n_heads;
    a.KVH = (int)n_kv_heads;
    a.D = (int)head_dim;
    a.scale = scale;
    att_bwd_di<<<cuda_blocks(s->m * n_heads * 32, 256), 256, 0, cb->stream>>>(a, (float *)di);
    CU_LAUNCHED("att_bwd_di");
    const void *ptrs[8] = {q, k, v, out, dout, dq, dk, dv};
    if (att3_usable(a.D, att_cc_major(cb), ptrs, 8) && att3_dq_smem(a.D) <= cb->max_smem_optin &&
        att3_dkv_smem(a.D) <= cb->max_smem_optin) { /* tensor cores (v3), head_dim 64 / 128 */
        /* dk/dv split over the GQA group when key tiles x sequences x KV heads are fewer than
         * two blocks per SM; f32 partials (at most 256 MiB) in scratch slot 2 */
        const int64_t tiles3 = (s->max_seqlen + ATT3_ROWS - 1) / ATT3_ROWS;
        const int split = att3_dkv_split((int)(n_heads / n_kv_heads), tiles3 * s->n_seqs * n_kv_heads,
                                         cb->n_sms, s->m, a.KVH, a.D, (size_t)TDM_CUDA_ATT_SPLIT_MAX_BYTES);
        void *ws = NULL;
        if (split > 1)
            TDM_TRY(cuda_scratch_get(cb, 2, att3_ws_bytes(split, s->m, a.KVH, a.D), &ws, err));
        CU(a.D == 64 ? att3_bwd<64>(a, (int)s->n_seqs, s->max_seqlen, split, (float *)ws, cb->stream)
                     : att3_bwd<128>(a, (int)s->n_seqs, s->max_seqlen, split, (float *)ws,
                                     cb->stream));
        return TDM_OK;
    }
    unsigned tiles = (unsigned)((s->max_seqlen + ATT_ROWS - 1) / ATT_ROWS);
    dim3 gq(tiles, (unsigned)s->n_seqs, (unsigned)n_heads);
    dim3 gkv(tiles, (unsigned)s->n_seqs, (unsigned)n_kv_heads);
    size_t sq = att_dq_smem(a.D), skv = att_dkv_smem(a.D);
    int nt = (a.D + 31) / 32;
#define BWD(N)                                                                                     \
    do {                                                                                           \
        TDM_TRY(att_smem(cb, att_bwd_dq_v2<N>, sq, "attention_bwd", err));                         \
        TDM_TRY(att_smem(cb, att_bwd_dkv_v2<N>, skv, "attention_bwd", err));                       \
        att_bwd_dq_v2<N><<<gq, ATT_WARPS * 32, sq, cb->stream>>>(a);                               \
        att_bwd_dkv_v2<N><<<gkv, ATT_WARPS * 32, skv, cb->stream>>>(a);                            \
    } while (0)
    ATT_DISPATCH(nt, BWD)
#undef BWD
    CU_LAUNCHED("att_bwd_dq_v2 / att_bwd_dkv_v2");
    return TDM_OK;
}

/* ------------------------------------------------------------------- SwiGLU ---- */

tdm_status cuda_swiglu_fwd(tdm_backend *be, const void *g, const void *u, int64_t m, int64_t n,
                           void *h, tdm_error *err)
{
    cuda_backend *cb = cuda_of(be);
    swiglu_fwd_launch(bf16x8_ok(m * n, g, u, h), (const bf16 *)g, (const bf16 *)u, m * n,
                      (bf16 *)h, cb->stream);
    CU_LAUNCHED("swiglu_fwd_v8_kernel / swiglu_fwd_kernel");
    return TDM_OK;
}

tdm_status cuda_swiglu_bwd(tdm_backend *be, const void *g, const void *u, const void *dh,
                           int64_t m, int64_t n, void *dg, void *du, tdm_error *err)
{
    cuda_backend *cb = cuda_of(be);
    swiglu_bwd_launch(bf16x8_ok(m * n, g, u, dh, dg) && bf16x8_ok(m * n, du), (const bf16 *)g,
                      (const bf16 *)u, (const bf16 *)dh, m * n, (bf16 *)dg, (bf16 *)du, cb->stream);
    CU_LAUNCHED("swiglu_bwd_v8_kernel / swiglu_bwd_kernel");
    return TDM_OK;
}

/* ------------------------------------------------------- attention over a KV cache ---- */

/* The sequence table of tdm_be_attention_kv as the kernels read it. */
struct kv_seq_dev {
    int32_t row_begin, n_new, slot, start;
};

#define KV_MAX_D 256 /* head_dim: 8 f32 accumulators per lane */
#define KV_WARPS 4

/* The new keys and values of every sequence into its slot: block = one sequence. */
__global__ void kv_append_kernel(const kv_seq_dev *tab, const bf16 *k, const bf16 *v, bf16 *kc,
                                 bf16 *vc, int64_t cap, int64_t kld)
{
    kv_seq_dev s = tab[blockIdx.x];
    int64_t n = (int64_t)s.n_new * kld, src = (int64_t)s.row_begin * kld;
    int64_t dst = ((int64_t)s.slot * cap + s.start) * kld;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        kc[dst + i] = k[src + i];
        vc[dst + i] = v[src + i];
    }
}

/* One block per (sequence, query head, new row): each warp runs an online softmax over every
 * KV_WARPS-th cached key (the dot product split over lanes, f32), then the warps' partial sums
 * are combined in warp order. Decoding reads each key once per query head: memory bound, as a
 * decode step is. */
__global__ void kv_attention_kernel(const kv_seq_dev *tab, const bf16 *q, const bf16 *kc,
                                    const bf16 *vc, bf16 *out, int64_t cap, int nh, int nkv, int D,
                                    float scale)
{
    int si = blockIdx.x / nh, h = blockIdx.x % nh, r = blockIdx.y;
    kv_seq_dev s = tab[si];
    if (r >= s.n_new) return;
    int kvh = h / (nh / nkv), lane = threadIdx.x % 32, w = threadIdx.x / 32;
    int64_t qld = (int64_t)nh * D, kld = (int64_t)nkv * D;
    int pos = s.start + r; /* keys 0..pos */
    __shared__ float qs[KV_MAX_D], wm[KV_WARPS], wl[KV_WARPS], wacc[KV_WARPS][KV_MAX_D];
    const bf16 *qi = q + ((int64_t)s.row_begin + r) * qld + (int64_t)h * D;
    for (int e = threadIdx.x; e < D; e += blockDim.x)
        qs[e] = __bfloat162float(qi[e]);
    __syncthreads();
    float m = -INFINITY, l = 0, acc[KV_MAX_D / 32];
    for (int t = 0; t < KV_MAX_D / 32; t++)
        acc[t] = 0;
    const bf16 *ks = kc + (int64_t)s.slot * cap * kld + (int64_t)kvh * D;
    const bf16 *vs = vc + (int64_t)s.slot * cap * kld + (int64_t)kvh * D;
    for (int j = w; j <= pos; j += KV_WARPS) {
        const bf16 *kj = ks + (int64_t)j * kld, *vj = vs + (int64_t)j * kld;
        float d = 0;
        for (int e = lane; e < D; e += 32)
            d += qs[e] * __bfloat162float(kj[e]);
        for (int o = 16; o > 0; o /= 2)
            d += __shfl_xor_sync(0xffffffffu, d, o);
        float sc = d * scale, mn = fmaxf(m, sc), corr = expf(m - mn), p = expf(sc - mn);
        l = l * corr + p;
        for (int t = 0, e = lane; e < D; t++, e += 32)
            acc[t] = acc[t] * corr + p * __bfloat162float(vj[e]);
        m = mn;
    }
    if (lane == 0) wm[w] = m, wl[w] = l;
    for (int t = 0, e = lane; e < D; t++, e += 32)
        wacc[w][e] = acc[t];
    __syncthreads();
    float M = -INFINITY;
    for (int i = 0; i < KV_WARPS; i++)
        M = fmaxf(M, wm[i]);
    float L = 0;
    for (int i = 0; i < KV_WARPS; i++)
        L += wl[i] * expf(wm[i] - M); /* a warp without keys: l 0, m -inf: adds 0 */
    bf16 *oi = out + ((int64_t)s.row_begin + r) * qld + (int64_t)h * D;
    for (int e = threadIdx.x; e < D; e += blockDim.x) {
        float o = 0;
        for (int i = 0; i < KV_WARPS; i++)
            o += wm[i] == -INFINITY ? 0.0f : wacc[i][e] * expf(wm[i] - M);
        oi[e] = __float2bfloat16_rn(o / L);
    }
}

tdm_status cuda_attention_kv(tdm_backend *be, const tdm_be_kv_seq *seqs, int64_t n_seqs, int64_t m,
                             const void *q, const void *k, const void *v, void *k_cache,
                             void *v_cache, int64_t n_slots, int64_t cap, int64_t n_heads,
                             int64_t n_kv_heads, int64_t head_dim, float scale, void *out,
                             tdm_error *err)
{
    (void)m, (void)n_slots;
    cuda_backend *cb = cuda_of(be);
    if (head_dim > KV_MAX_D)
        return tdm_fail(err, TDM_ERR_UNSUPPORTED, "attention_kv: head_dim %lld > %d",
                        (long long)head_dim, KV_MAX_D);
    kv_seq_dev *host = (kv_seq_dev *)calloc((size_t)n_seqs, sizeof *host);
    if (!host) return tdm_fail(err, TDM_ERR_NOMEM, "attention_kv: out of memory");
    int64_t max_new = 0;
    for (int64_t i = 0; i < n_seqs; i++) {
        host[i] = {(int32_t)seqs[i].row_begin, (int32_t)seqs[i].n_new, (int32_t)seqs[i].slot,
                   (int32_t)seqs[i].start};
        if (seqs[i].n_new > max_new) max_new = seqs[i].n_new;
    }
    void *tab = NULL;
    tdm_status st = cuda_table_upload(cb, host, (size_t)n_seqs * sizeof *host, &tab, err);
    free(host);
    TDM_TRY(st);
    if (max_new == 0) return TDM_OK;
    int64_t kld = n_kv_heads * head_dim;
    kv_append_kernel<<<(unsigned)n_seqs, EW_THREADS, 0, cb->stream>>>(
        (const kv_seq_dev *)tab, (const bf16 *)k, (const bf16 *)v, (bf16 *)k_cache,
        (bf16 *)v_cache, cap, kld);
    CU_LAUNCHED("kv_append_kernel");
    dim3 grid((unsigned)(n_seqs * n_heads), (unsigned)max_new);
    kv_attention_kernel<<<grid, 32 * KV_WARPS, 0, cb->stream>>>(
        (const kv_seq_dev *)tab, (const bf16 *)q, (const bf16 *)k_cache, (const bf16 *)v_cache,
        (bf16 *)out, cap, (int)n_heads, (int)n_kv_heads, (int)head_dim, scale);
    CU_LAUNCHED("kv_attention_kernel");
    return TDM_OK;
}
