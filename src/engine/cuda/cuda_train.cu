/* cuda_train.cu — the CUDA backend's chunked cross-entropy, segmented LoRA, gradient norms and
 * multi-tensor AdamW. */
#include <math.h>
#include <string.h>

#include <vector>

#include "engine/cuda/cross_entropy.cuh"
#include "engine/cuda/cuda_internal.h"
#include "engine/cuda/lora.cuh"
#include "engine/cuda/multi_tensor.cuh"

/* ------------------------------------------------------------ cross-entropy ---- */

static_assert(CE_DEVERR_LABEL == CUDA_DEVERR_LABEL, "cross_entropy.cuh's label error code");

tdm_status cuda_cross_entropy(tdm_backend *be, const void *h, const tdm_be_weight *w,
                              const int32_t *labels, const float *weight, int64_t m,
                              int64_t chunk_rows, float *loss, void *dh, tdm_error *err)
{
    cuda_backend *cb = cuda_of(be);
    const int64_t V = w->rows, d = w->cols;
    if (chunk_rows > m) chunk_rows = m;
    const bf16 *W;
    TDM_TRY(cuda_dense_bf16(cb, w, 0, &W, err));
    void *logits, *dlog = NULL;
    TDM_TRY(cuda_scratch_get(cb, 1, (size_t)(chunk_rows * V) * sizeof(float), &logits, err));
    if (dh) TDM_TRY(cuda_scratch_get(cb, 2, (size_t)(chunk_rows * V) * sizeof(bf16), &dlog, err));
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
        TDM_TRY(cuda_gemm_rm(cb, &g, err));
        ce_rows_launch(c, (const float *)logits, V, labels + r0, weight + r0, loss + r0,
                       (bf16 *)dlog, cb->dev_error, cb->stream);
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
        TDM_TRY(cuda_gemm_rm(cb, &b, err));
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

/* Fills p.seg with up to LORA_MAX_SEGS active segments from segs[*next...]; sets p->n_segs (the
 * lora_plan_* functions then lay out each kernel's blocks). */
static void lora_pack(lora_params *p, const tdm_lora_seg *segs, int64_t n_segs, int64_t *next)
{
    p->n_segs = 0;
    p->n_blocks = 0;
    while (*next < n_segs && p->n_segs < LORA_MAX_SEGS) {
        const tdm_lora_seg *s = &segs[(*next)++];
        if (!s->a || s->row_end == s->row_begin) continue;
        lora_seg_d *d = &p->seg[p->n_segs++];
        d->row_begin = s->row_begin;
        d->row_end = s->row_end;
        d->a = s->a;
        d->b = s->b;
        d->da = s->da;
        d->db = s->db;
        d->scale = s->scale;
        d->rank = (int)s->rank;
        d->drop = s->dropout > 0;
        d->keep_thr = tdm_dropout_threshold(s->dropout);
        d->keep_scale = tdm_dropout_scale(s->dropout);
        d->mask_seed = s->mask_seed;
    }
}

/* The down-projection's per-K-slice partials (scratch slot 3, cuda_memory_plan.c): k_slices
 * blocks of (m, u_ld) f32, then, when `du`, dU (m, u_ld). */
static tdm_status lora_workspace(cuda_backend *cb, lora_params *p, int64_t K, bool du,
                                 tdm_error *err)
{
    int64_t block = p->m * p->u_ld, blocks = tdm_cuda_lora_k_slices(K) + (du ? 1 : 0);
    void *ws;
    TDM_TRY(cuda_scratch_get(cb, 3, (size_t)(blocks * block) * sizeof(float), &ws, err));
    p->ws = (float *)ws;
    if (du) p->du = p->ws + (blocks - 1) * block;
    return TDM_OK;
}

tdm_status cuda_lora_fwd(tdm_backend *be, const tdm_lora_seg *segs, int64_t n_segs, const void *x,
                         int64_t m, int64_t in, int64_t out, float *u, int64_t u_ld, void *y,
                         tdm_error *err)
{
    cuda_backend *cb = cuda_of(be);
    TDM_TRY(lora_check(segs, n_segs, "lora_fwd", err));
    lora_params p;
    memset(&p, 0, sizeof p);
    p.x = (const bf16 *)x;
    p.y = (bf16 *)y;
    p.u = u;
    p.m = m;
    p.u_ld = u_ld;
    p.in = in;
    p.out = out;
    TDM_TRY(lora_workspace(cb, &p, in, false, err));
    int64_t next = 0;
    while (next < n_segs) {
        lora_pack(&p, segs, n_segs, &next);
        if (p.n_segs == 0) continue;
        lora_plan_down(&p, false);
        lora_down_kernel<false><<<p.n_blocks, LORA_DOWN_THREADS, 0, cb->stream>>>(p);
        CU_LAUNCHED("lora_down_kernel<fwd>");
        lora_plan_up(&p, false);
        lora_up_kernel<false><<<p.n_blocks, LORA_UP_THREADS, 0, cb->stream>>>(p);
        CU_LAUNCHED("lora_up_kernel<fwd>");
    }
    return TDM_OK;
}

tdm_status cuda_lora_bwd(tdm_backend *be, const tdm_lora_seg *segs, int64_t n_segs, const void *x,
                         const float *u, int64_t u_ld, const void *dy, int64_t m, int64_t in,
                         int64_t out, void *dx, tdm_error *err)
{
    cuda_backend *cb = cuda_of(be);
    TDM_TRY(lora_check(segs, n_segs, "lora_bwd", err));
    lora_params p;
    memset(&p, 0, sizeof p);
    p.x = (const bf16 *)x;
    p.dy = (const bf16 *)dy;
    p.dx = (bf16 *)dx;
    p.u = (float *)u;
    p.m = m;
    p.u_ld = u_ld;
    p.in = in;
    p.out = out;
    TDM_TRY(lora_workspace(cb, &p, out, true, err));
    int64_t next = 0;
    while (next < n_segs) {
        lora_pack(&p, segs, n_segs, &next);
        if (p.n_segs == 0) continue;
        /* dU = s dY B (slices' partials), then dU summed into du with dX += dU A */
        lora_plan_down(&p, true);
        lora_down_kernel<true><<<p.n_blocks, LORA_DOWN_THREADS, 0, cb->stream>>>(p);
        CU_LAUNCHED("lora_down_kernel<bwd>");
        lora_plan_up(&p, true);
        lora_up_kernel<true><<<p.n_blocks, LORA_UP_THREADS, 0, cb->stream>>>(p);
        CU_LAUNCHED("lora_up_kernel<bwd>");
        /* dA, dB over each segment's rows in chunks, partials in scratch slot 7 */
        int64_t part = lora_plan_reduction(&p), elems = p.n_elems;
        void *pbuf;
        TDM_TRY(cuda_scratch_get(cb, 7, (size_t)part * sizeof(float), &pbuf, err));
        p.part = (float *)pbuf;
        lora_grad_kernel<<<p.n_blocks, LORA_GRAD_THREADS, 0, cb->stream>>>(p);
        CU_LAUNCHED("lora_grad_kernel");
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
        TDM_TRY(cuda_table_upload(cb, chunks.data(), (size_t)nc * sizeof(mt_chunk), &table, err));
        TDM_TRY(cuda_scratch_get(cb, 5, (size_t)nc * sizeof(float), &partial, err));
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
    TDM_TRY(cuda_table_upload(cb, max_norm, (size_t)n_groups * sizeof(float), &mn, err));
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
    TDM_TRY(cuda_table_upload(cb, host.data(), host.size(), &table, err));
    adamw_kernel<<<cuda_blocks(nc, 1), MT_THREADS, 0, cb->stream>>>(
        (const adamw_desc *)table, (const mt_chunk *)((unsigned char *)table + dbytes), nc);
    CU_LAUNCHED("adamw_kernel");
    return TDM_OK;
}
