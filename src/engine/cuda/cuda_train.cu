/* cuda_train.cu — the CUDA backend's chunked cross-entropy, segmented LoRA, gradient norms and
 * multi-tensor AdamW. */
#include <math.h>
#include <string.h>

#include <vector>

#include "engine/cuda/cuda_internal.h"
#include "engine/cuda/lora.cuh"
#include "engine/cuda/multi_tensor.cuh"

#define IGNORE_INDEX (-100)

/* ------------------------------------------------------------ cross-entropy ---- */

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
                   float *loss, bf16 *dlog, int *dev_error)
{
    __shared__ float sm[32], ss[32];
    const int64_t i = blockIdx.x;
    const float *l = logits + i * V;
    const int32_t lab = labels[i];
    const bool bad = lab != IGNORE_INDEX && (lab < 0 || lab >= V);
    if (lab == IGNORE_INDEX || bad) {
        if (bad && threadIdx.x == 0) atomicCAS(dev_error, 0, CUDA_DEVERR_LABEL);
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

tdm_status cuda_cross_entropy(tdm_backend *be, const void *h, const tdm_be_weight *w,
                              const int32_t *labels, const float *weight, int64_t m,
                              int64_t chunk_rows, float *loss, void *dh, tdm_error *err)
{
    cuda_backend *cb = cuda_of(be);
    const int64_t V = w->rows, d = w->cols;
    if (chunk_rows > m) chunk_rows = m;
    const bf16 *W;
    TRY(cuda_dense_bf16(cb, w, 0, &W, err));
    void *logits, *dlog = NULL;
    TRY(cuda_scratch_get(cb, 1, (size_t)(chunk_rows * V) * sizeof(float), &logits, err));
    if (dh) TRY(cuda_scratch_get(cb, 2, (size_t)(chunk_rows * V) * sizeof(bf16), &dlog, err));
    for (int64_t r0 = 0; r0 < m; r0 += chunk_rows) {
        int64_t c = r0 + chunk_rows <= m ? chunk_rows : m - r0;
        tdm_gemm_args g = {};
        g.trans_b = true;
        g.m = c;
        g.n = V;
        g.k = d;
        g.alpha = 1.0f;
        g.a = (const bf16 *)h + r0 * d;
        g.a_dtype = TDM_BE_BF16;
        g.lda = d;
        g.b = W;
        g.b_dtype = TDM_BE_BF16;
        g.ldb = d;
        g.c = logits;
        g.c_dtype = TDM_BE_F32;
        g.ldc = V;
        g.batch = 1;
        TRY(cuda_gemm_rm(cb, &g, err));
        if (V % 4 == 0)
            ce_rows_kernel<4><<<(unsigned)c, CE_THREADS, 0, cb->stream>>>(
                (const float *)logits, V, labels + r0, weight + r0, loss + r0, (bf16 *)dlog,
                cb->dev_error);
        else
            ce_rows_kernel<1><<<(unsigned)c, CE_THREADS, 0, cb->stream>>>(
                (const float *)logits, V, labels + r0, weight + r0, loss + r0, (bf16 *)dlog,
                cb->dev_error);
        CU_LAUNCHED("ce_rows_kernel");
        if (!dh) continue;
        tdm_gemm_args b = {};
        b.m = c;
        b.n = d;
        b.k = V;
        b.alpha = 1.0f;
        b.a = dlog;
        b.a_dtype = TDM_BE_BF16;
        b.lda = V;
        b.b = W;
        b.b_dtype = TDM_BE_BF16;
        b.ldb = d;
        b.c = (bf16 *)dh + r0 * d;
        b.c_dtype = TDM_BE_BF16;
        b.ldc = d;
        b.batch = 1;
        TRY(cuda_gemm_rm(cb, &b, err));
    }
    return TDM_OK;
}

/* --------------------------------------------------------------------- LoRA ---- */

static tdm_status lora_check(const tdm_lora_seg *segs, int64_t n_segs, const char *op,
                             tdm_error *err)
{
    for (int64_t i = 0; i < n_segs; i++)
        if (segs[i].a && segs[i].rank > LORA_MAX_RANK)
            return tdm_fail(err, TDM_ERR_UNSUPPORTED, "%s: rank %lld above the CUDA limit %d", op,
                            (long long)segs[i].rank, LORA_MAX_RANK);
    return TDM_OK;
}

/* Fills p.seg with up to LORA_MAX_SEGS active segments from segs[*next...], assigning blocks
 * (tiles of `rows_per_block` rows, or `blocks_per_seg` fixed blocks when > 0). */
static void lora_pack(lora_params *p, const tdm_lora_seg *segs, int64_t n_segs, int64_t *next,
                      int rows_per_block, int blocks_per_seg)
{
    p->n_segs = 0;
    p->n_blocks = 0;
    while (*next < n_segs && p->n_segs < LORA_MAX_SEGS) {
        const tdm_lora_seg *s = &segs[(*next)++];
        int64_t R = s->row_end - s->row_begin;
        if (!s->a || R == 0) continue;
        lora_seg_d *d = &p->seg[p->n_segs++];
        d->row_begin = s->row_begin;
        d->row_end = s->row_end;
        d->a = s->a;
        d->b = s->b;
        d->da = s->da;
        d->db = s->db;
        d->scale = s->scale;
        d->rank = (int)s->rank;
        d->tile0 = p->n_blocks;
        d->drop = s->dropout > 0;
        d->keep_thr = tdm_dropout_threshold(s->dropout);
        d->keep_scale = tdm_dropout_scale(s->dropout);
        d->mask_seed = s->mask_seed;
        p->n_blocks +=
            blocks_per_seg > 0 ? blocks_per_seg : (int)((R + rows_per_block - 1) / rows_per_block);
    }
}

tdm_status cuda_lora_fwd(tdm_backend *be, const tdm_lora_seg *segs, int64_t n_segs, const void *x,
                         int64_t m, int64_t in, int64_t out, float *u, int64_t u_ld, void *y,
                         tdm_error *err)
{
    cuda_backend *cb = cuda_of(be);
    TRY(lora_check(segs, n_segs, "lora_fwd", err));
    lora_params p;
    memset(&p, 0, sizeof p);
    p.x = (const bf16 *)x;
    p.y = (bf16 *)y;
    p.u = u;
    p.u_ld = u_ld;
    p.in = in;
    p.out = out;
    int64_t next = 0;
    while (next < n_segs) {
        lora_pack(&p, segs, n_segs, &next, LORA_TM, 0);
        if (p.n_blocks == 0) continue;
        lora_fwd_kernel<<<p.n_blocks, LORA_THREADS, LORA_FWD_SMEM, cb->stream>>>(p);
        CU_LAUNCHED("lora_fwd_kernel");
    }
    return TDM_OK;
}

tdm_status cuda_lora_bwd(tdm_backend *be, const tdm_lora_seg *segs, int64_t n_segs, const void *x,
                         const float *u, int64_t u_ld, const void *dy, int64_t m, int64_t in,
                         int64_t out, void *dx, tdm_error *err)
{
    cuda_backend *cb = cuda_of(be);
    TRY(lora_check(segs, n_segs, "lora_bwd", err));
    void *du;
    TRY(cuda_scratch_get(cb, 3, (size_t)(m * u_ld) * sizeof(float), &du, err));
    lora_params p;
    memset(&p, 0, sizeof p);
    p.x = (const bf16 *)x;
    p.dy = (const bf16 *)dy;
    p.dx = (bf16 *)dx;
    p.u = (float *)u;
    p.du = (float *)du;
    p.u_ld = u_ld;
    p.in = in;
    p.out = out;
    int64_t next = 0;
    while (next < n_segs) {
        int64_t start = next;
        lora_pack(&p, segs, n_segs, &next, LORA_TM, 0);
        if (p.n_blocks == 0) continue;
        lora_bwd_rows_kernel<<<p.n_blocks, LORA_THREADS, LORA_BWD_ROWS_SMEM, cb->stream>>>(p);
        CU_LAUNCHED("lora_bwd_rows_kernel");
        /* reduction: each segment's rows in chunks, partials in scratch slot 7 */
        next = start;
        lora_pack(&p, segs, n_segs, &next, LORA_TM, 0);
        int64_t part = lora_plan_reduction(&p), elems = p.n_elems;
        void *pbuf;
        TRY(cuda_scratch_get(cb, 7, (size_t)part * sizeof(float), &pbuf, err));
        p.part = (float *)pbuf;
        lora_bwd_red_kernel<<<p.n_blocks, LORA_THREADS, LORA_RED_SMEM, cb->stream>>>(p);
        CU_LAUNCHED("lora_bwd_red_kernel");
        lora_red_finish_kernel<<<cuda_blocks(elems, 256), 256, 0, cb->stream>>>(p);
        CU_LAUNCHED("lora_red_finish_kernel");
    }
    return TDM_OK;
}

/* ------------------------------------------------------------- grad norms ---- */

tdm_status cuda_sumsq(tdm_backend *be, const tdm_be_vec *vecs, int64_t n_vecs, int n_groups,
                      float *out, tdm_error *err)
{
    cuda_backend *cb = cuda_of(be);
    std::vector<mt_chunk> chunks;
    for (int64_t v = 0; v < n_vecs; v++)
        for (int64_t off = 0; off < vecs[v].n; off += MT_SUMSQ_CHUNK) {
            mt_chunk c;
            c.x = vecs[v].x;
            c.off = off;
            c.n = vecs[v].n - off < MT_SUMSQ_CHUNK ? vecs[v].n - off : MT_SUMSQ_CHUNK;
            c.tensor = vecs[v].group;
            chunks.push_back(c);
        }
    int64_t nc = (int64_t)chunks.size();
    void *table, *partial = NULL;
    if (nc > 0) {
        TRY(cuda_table_upload(cb, chunks.data(), (size_t)nc * sizeof(mt_chunk), &table, err));
        TRY(cuda_scratch_get(cb, 5, (size_t)nc * sizeof(float), &partial, err));
        sumsq_chunks_kernel<<<cuda_blocks(nc, 1), MT_THREADS, 0, cb->stream>>>(
            (const mt_chunk *)table, nc, (float *)partial);
        CU_LAUNCHED("sumsq_chunks_kernel");
    } else {
        table = NULL;
    }
    sumsq_groups_kernel<<<(n_groups + 63) / 64, 64, 0, cb->stream>>>(
        (const mt_chunk *)table, (const float *)partial, nc, n_groups, out);
    CU_LAUNCHED("sumsq_groups_kernel");
    return TDM_OK;
}

tdm_status cuda_clip_coef(tdm_backend *be, const float *sumsq, const float *max_norm, int n_groups,
                          float *coef, float *norm, tdm_error *err)
{
    cuda_backend *cb = cuda_of(be);
    void *mn;
    TRY(cuda_table_upload(cb, max_norm, (size_t)n_groups * sizeof(float), &mn, err));
    clip_coef_kernel<<<(n_groups + 63) / 64, 64, 0, cb->stream>>>(sumsq, (const float *)mn,
                                                                  n_groups, coef, norm);
    CU_LAUNCHED("clip_coef_kernel");
    return TDM_OK;
}

/* ------------------------------------------------------------------ AdamW ---- */

tdm_status cuda_adamw(tdm_backend *be, const tdm_adamw_tensor *tensors, int64_t n_tensors,
                      tdm_error *err)
{
    cuda_backend *cb = cuda_of(be);
    std::vector<adamw_desc> descs((size_t)n_tensors);
    std::vector<mt_chunk> chunks;
    for (int64_t i = 0; i < n_tensors; i++) {
        const tdm_adamw_tensor *t = &tensors[i];
        adamw_desc_fill(&descs[(size_t)i], t->p, t->g, t->m, t->v, t->grad_scale, t->lr, t->beta1,
                        t->beta2, t->eps, t->weight_decay, t->step);
        for (int64_t off = 0; off < t->n; off += MT_ADAMW_CHUNK) {
            mt_chunk c;
            c.x = NULL;
            c.off = off;
            c.n = t->n - off < MT_ADAMW_CHUNK ? t->n - off : MT_ADAMW_CHUNK;
            c.tensor = (int)i;
            chunks.push_back(c);
        }
    }
    int64_t nc = (int64_t)chunks.size();
    if (nc == 0) return TDM_OK;
    /* one table: descriptors, then chunks (both 8-byte aligned structs) */
    size_t dbytes = descs.size() * sizeof(adamw_desc), cbytes = (size_t)nc * sizeof(mt_chunk);
    std::vector<unsigned char> host(dbytes + cbytes);
    memcpy(host.data(), descs.data(), dbytes);
    memcpy(host.data() + dbytes, chunks.data(), cbytes);
    void *table;
    TRY(cuda_table_upload(cb, host.data(), host.size(), &table, err));
    adamw_kernel<<<cuda_blocks(nc, 1), MT_THREADS, 0, cb->stream>>>(
        (const adamw_desc *)table, (const mt_chunk *)((unsigned char *)table + dbytes), nc);
    CU_LAUNCHED("adamw_kernel");
    return TDM_OK;
}
