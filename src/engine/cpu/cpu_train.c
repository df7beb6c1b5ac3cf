/* cpu_train.c — the CPU backend's chunked cross-entropy, segmented LoRA, gradient norms and
 * multi-tensor AdamW. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cpu/cpu_internal.h"
#include "engine/cpu/cpu_math.h"
#include "engine/dropout.h"
#include "engine/grad_clip.h"
#include "engine/op_profile.h"

#define IGNORE_INDEX (-100)

/* dH (c, d) = dlogits (c, V) W (V, d) with V (the vocabulary, ~152K) the long side. With the
 * OpenMP build of OpenBLAS: cpu_blas_sgemm's threaded calls, one per 256 vocabulary rows (each
 * cuts C's rows and columns over the threads; W streams once per chunk). Otherwise a tiled GEMM
 * would cut only c and d, and every tile would stream its own copy of W; so K is split instead:
 * fixed blocks of vocabulary rows (tdm_cpu_ce_vblock), one task each computing its partial
 * product (c, d) into its own slice of part; then dH = the partials summed in block order. Fixed blocks and a
 * fixed order: the same bits whatever the thread count (other bits than the one call's, within f32
 * rounding). */
#define CE_ROWS 256


static void ce_dh(const cpu_backend *cpu, const float *logits, const tdm_be_weight *w,
                  const float *W, int64_t c, float *part, float *dh)
{
    int nt = cpu->n_threads;
    int64_t V = w->rows, d = w->cols;
    if (cpu->blas_threaded) { /* threaded calls: OpenBLAS cuts M and N, cpu_blas_sgemm K */
        cpu_blas_sgemm(nt, false, false, c, d, V, 1.0f, logits, V, W, d, 0.0f, dh, d);
        return;
    }
    int64_t vb = tdm_cpu_ce_vblock(V), nb = tdm_cpu_ce_vblock_count(V);
    /* tasks: a vocabulary block x CE_ROWS rows of it. Blocks alone were 38 tasks at a 152K
     * vocabulary, 3 rounds of 16 threads with the last 3/8 full; rows of a product are computed
     * alone (cpu_blas_sgemm), so the cut changes no bits and re-packs the block's W once more
     * per CE_ROWS rows. */
    int64_t nr = (c + CE_ROWS - 1) / CE_ROWS;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nb * nr > 1)
    for (int64_t t = 0; t < nb * nr; t++) {
        int64_t b = t / nr, i0 = (t % nr) * CE_ROWS;
        int64_t rows = c - i0 < CE_ROWS ? c - i0 : CE_ROWS;
        int64_t v0 = b * vb, kb = V - v0 < vb ? V - v0 : vb;
        /* one call per task (no tiles: they would re-pack the block's W rows per tile); W's
         * rows as they lie, transposed back from the lm_head's panels, or widened from bf16
         * (W NULL: the last two) */
        const float *lt = logits + i0 * V + v0;
        float *pt = part + b * c * d + i0 * d;
        if (!cpu_panel_gemm_1t_rows(rows, kb, lt, V, w, v0, 0.0f, pt, d))
            cpu_blas_sgemm(1, false, false, rows, d, kb, 1.0f, lt, V, W + v0 * d, d, 0.0f, pt, d);
    }
#pragma omp parallel for schedule(static) num_threads(nt) if (c * d > TDM_CPU_PAR_MIN)
    for (int64_t i = 0; i < c * d; i++) {
        float s = part[i];
        for (int64_t b = 1; b < nb; b++)
            s += part[b * c * d + i];
        dh[(i / d) * d + i % d] = s;
    }
}

/* logits (c, V) = H (c, d) W^T. An f32 lm_head laid out in panels (W NULL): one product of
 * tandem's kernels over all threads, H laid out once and the panels read as they are. Else in
 * the tiles of cpu_panel_gemm_wt_tiles, each packing its slice of W (f32 rows, or the bf16
 * weight itself when W is NULL) a K block at a time, when this CPU has tandem's kernels; else
 * OpenBLAS's tiles of the same shape (f32 only: cpu_cross_entropy gives W then). */
static void ce_logits(cpu_backend *cpu, const float *h, const tdm_be_weight *w, const float *W,
                      int64_t c, float *logits)
{
    int64_t V = w->rows, d = w->cols;
    if (!W && w->format != TDM_BE_W_BF16) {
        cpu_panel_gemm_weight(cpu, true, w, h, c, 0.0f, logits); /* cannot fail: laid */
        return;
    }
    if (cpu_panel_gemm_wt_tiles(cpu, c, V, d, h, W, W ? NULL : (const uint16_t *)w->data, 0.0f,
                                logits))
        return;
    cpu_sgemm_tiles(cpu, c < CPU_WT_TILE_M ? c : CPU_WT_TILE_M, CPU_WT_TILE_N, false, true, c, V,
                    d, 1.0f, h, d, W, d, 0.0f, logits, V);
}

/* Per chunk of rows: logits (c, V) = H W^T in one GEMM, then per row (one thread each) max,
 * exp-sum (float exponentials by cpu_expf in SIMD loops, summed in double by cpu_sum_f64),
 * loss, and the logits buffer overwritten with dlogits; then dH (c, d) = dlogits W (ce_dh).
 * Extra memory, kept between calls (cpu_scratch):
 * chunk_rows * V floats, the lm_head in f32 unless it is stored so, and chunk_rows * d floats
 * per tdm_cpu_ce_vblock vocabulary rows for dH's partial products. */
tdm_status cpu_cross_entropy(tdm_backend *be, const void *hv, const tdm_be_weight *w,
                             const int32_t *labels, const float *weight, int64_t m,
                             int64_t chunk_rows, float *loss, void *dhv, tdm_error *err)
{
    cpu_backend *cpu = cpu_of(be);
    int64_t V = w->rows, d = w->cols;
    for (int64_t i = 0; i < m; i++)
        if (labels[i] != IGNORE_INDEX && (labels[i] < 0 || labels[i] >= V))
            return tdm_fail(err, TDM_ERR_INVALID,
                            "cross_entropy: label %d at row %lld outside [0, %lld) and not -100",
                            labels[i], (long long)i, (long long)V);
    if (chunk_rows > m) chunk_rows = m;
    /* kept buffers (cpu_scratch), not malloc per call: fresh pages fault one by one */
    /* the lm_head's f32 rows, or NULL when the kernels read it as it is (its panels, or its
     * bf16 rows widened as each tile packs them: cpu_ce_widens_bf16): the weight's own rows, or
     * a copy in the CE_WEIGHT scratch (another format, or panels the kernels cannot read now) */
    bool laid = cpu_panel_reads_laid_out(cpu, w) ||
                (w->format == TDM_BE_W_BF16 && cpu_ce_widens_bf16(cpu->blas_threaded));
    const float *W = laid ? NULL : cpu_dense_f32(cpu, w);
    float *logits =
        cpu_scratch(cpu, CPU_SCRATCH_CE_LOGITS, (size_t)(chunk_rows * V) * sizeof(float));
    int64_t nvb = tdm_cpu_ce_vblock_count(V);
    float *part = dhv && !cpu->blas_threaded
                      ? cpu_scratch(cpu, CPU_SCRATCH_CE_PARTIAL,
                                    (size_t)(nvb * chunk_rows * d) * sizeof(float))
                      : NULL;
    if ((!laid && !W) || !logits || (dhv && !cpu->blas_threaded && !part))
        return tdm_fail(err, TDM_ERR_NOMEM, "cross_entropy: out of memory for %lld x %lld logits",
                        (long long)chunk_rows, (long long)V);
    const float *h = hv;
    float *dh = dhv;
    int nt = cpu->n_threads;
    for (int64_t r0 = 0; r0 < m; r0 += chunk_rows) {
        int64_t c = r0 + chunk_rows <= m ? chunk_rows : m - r0;
        int64_t t0;
        int tok = tdm_op_profile_begin(be, &t0);
        ce_logits(cpu, h + r0 * d, w, W, c, logits);
        tdm_op_profile_end(be, TDM_OP_SUB_CE_LOGITS, tok, t0);
        tok = tdm_op_profile_begin(be, &t0);
#pragma omp parallel for schedule(static) num_threads(nt) if (c * V > TDM_CPU_PAR_MIN)
        for (int64_t i = 0; i < c; i++) {
            float *l = logits + i * V;
            int32_t lab = labels[r0 + i];
            if (lab == IGNORE_INDEX) {
                loss[r0 + i] = 0.0f;
                memset(l, 0, (size_t)V * sizeof(float));
                continue;
            }
            float mx = cpu_max_f32(l, V);
            float target = l[lab];
            /* e_j = exp(l_j - max) in place, then dlogits = wt e_j / sum - wt [j = label]: one
             * exponential per logit (two before, with exp(l_j - lse) for the softmax) */
#pragma omp simd
            for (int64_t j = 0; j < V; j++)
                l[j] = cpu_expf(l[j] - mx);
            double sum = cpu_sum_f64(l, V, false, 0.0f);
            double lse = (double)mx + log(sum);
            loss[r0 + i] = (float)(lse - (double)target);
            float wt = weight[r0 + i], scale = (float)((double)wt / sum);
#pragma omp simd
            for (int64_t j = 0; j < V; j++)
                l[j] *= scale;
            l[lab] -= wt;
        }
        tdm_op_profile_end(be, TDM_OP_SUB_CE_SOFTMAX, tok, t0);
        if (dh) {
            tok = tdm_op_profile_begin(be, &t0);
            ce_dh(cpu, logits, w, W, c, part, dh + r0 * d);
            tdm_op_profile_end(be, TDM_OP_SUB_CE_DH, tok, t0);
        }
    }
    return TDM_OK;
}

/* LoRA dropout on the CPU: the segment's masked input Xd = X * D (engine/dropout.h, rows counted
 * from the segment's start) is formed in a per-segment scratch copy (R, in) f32, regenerated in
 * the backward; every element is independent, so the result does not depend on the threads.
 * dst = src * D, or dst += src * D when accumulate (dX += (dU A) * D in the backward). */
static void drop_apply(int nt, const tdm_lora_seg *s, const float *src, int64_t in, float *dst,
                       bool accumulate)
{
    int64_t R = s->row_end - s->row_begin;
    uint32_t thr = tdm_dropout_threshold(s->dropout);
    float ks = tdm_dropout_scale(s->dropout);
#pragma omp parallel for schedule(static) num_threads(nt) if (R * in > TDM_CPU_PAR_MIN)
    for (int64_t i = 0; i < R; i++)
        for (int64_t k = 0; k < in; k++) {
            float v = src[i * in + k] *
                      (tdm_dropout_keep(s->mask_seed, thr, (uint64_t)i, (uint64_t)k) ? ks : 0.0f);
            dst[i * in + k] = accumulate ? dst[i * in + k] + v : v;
        }
}

/* The scratch a call needs for dropout: the most rows of a segment with dropout, times in
 * (0: no segment has dropout). */
static int64_t drop_scratch(const tdm_lora_seg *segs, int64_t n_segs, int64_t in)
{
    int64_t rows = 0;
    for (int64_t i = 0; i < n_segs; i++)
        if (segs[i].a && segs[i].dropout > 0 && segs[i].row_end - segs[i].row_begin > rows)
            rows = segs[i].row_end - segs[i].row_begin;
    return rows * in;
}

/* The rank-sized products: one side of C is the rank (16), so cpu_sgemm's tiles (128 rows by a
 * width from n) gave them 4-8 tiles, at most 8 of 16 threads busy (the LoRA ops took ~125 ms of
 * a 2.5 s 0.5B step at 16 threads, ~9 GFLOP). They take tiles of LORA_CHUNK_ROWS rows of C
 * instead (dA, r x in: LORA_CHUNK_COLS columns): functions of the shape alone, and the products
 * are per segment, so the bits depend neither on the thread count nor on the other segments.
 * Every LoRA product goes through cpu_sgemm_segment: OpenBLAS's own kernels for a tile's shape,
 * where cpu_blas_sgemm's copies for small calls (every tile here is one) had taken two thirds of
 * the LoRA ops' time (2-thread VM, B4 x 256: 0.30 -> 0.10 s a step). */
#define LORA_CHUNK_ROWS 32
#define LORA_CHUNK_COLS 64

/* Segment by segment, as plain GEMMs on the segment's rows (the CPU gains nothing from one
 * grouped launch). */
tdm_status cpu_lora_fwd(tdm_backend *be, const tdm_lora_seg *segs, int64_t n_segs, const void *xv,
                        int64_t m, int64_t in, int64_t out, float *u, int64_t u_ld, void *yv,
                        tdm_error *err)
{
    const float *x = xv;
    float *y = yv;
    const cpu_backend *cpu = cpu_of(be);
    int nt = cpu->n_threads;
    int64_t nd = drop_scratch(segs, n_segs, in);
    float *xd = nd > 0 ? malloc((size_t)nd * sizeof(float)) : NULL;
    if (nd > 0 && !xd) return tdm_fail(err, TDM_ERR_NOMEM, "lora_fwd: out of memory (dropout)");
    for (int64_t i = 0; i < n_segs; i++) {
        const tdm_lora_seg *s = &segs[i];
        int64_t R = s->row_end - s->row_begin;
        if (!s->a || R == 0) continue;
        float *us = u + s->row_begin * u_ld;
        const float *xs = x + s->row_begin * in;
        if (s->dropout > 0) {
            drop_apply(nt, s, xs, in, xd, false);
            xs = xd;
        }
        cpu_sgemm_segment(cpu, LORA_CHUNK_ROWS, s->rank, false, true, R, s->rank, in, 1.0f, xs, in,
                          s->a, in, 0.0f, us, u_ld);
        cpu_sgemm_segment(cpu, 0, 0, false, true, R, out, s->rank, s->scale, us, u_ld, s->b,
                          s->rank, 1.0f, y + s->row_begin * out, out);
    }
    free(xd);
    return TDM_OK;
}

tdm_status cpu_lora_bwd(tdm_backend *be, const tdm_lora_seg *segs, int64_t n_segs, const void *xv,
                        const float *u, int64_t u_ld, const void *dyv, int64_t m, int64_t in,
                        int64_t out, void *dxv, tdm_error *err)
{
    const float *x = xv, *dy = dyv;
    float *dx = dxv;
    const cpu_backend *cpu = cpu_of(be);
    int nt = cpu->n_threads;
    int64_t max_r = 0, max_rows = 0;
    for (int64_t i = 0; i < n_segs; i++) {
        if (!segs[i].a) continue;
        if (segs[i].rank > max_r) max_r = segs[i].rank;
        if (segs[i].row_end - segs[i].row_begin > max_rows)
            max_rows = segs[i].row_end - segs[i].row_begin;
    }
    if (max_r == 0 || max_rows == 0) return TDM_OK;
    int64_t nd = drop_scratch(segs, n_segs, in);
    float *du = malloc((size_t)(max_rows * max_r) * sizeof(float));
    float *xd = nd > 0 ? malloc((size_t)nd * sizeof(float)) : NULL;
    if (!du || (nd > 0 && !xd)) {
        free(du), free(xd);
        return tdm_fail(err, TDM_ERR_NOMEM, "lora_bwd: out of memory");
    }
    for (int64_t i = 0; i < n_segs; i++) {
        const tdm_lora_seg *s = &segs[i];
        int64_t R = s->row_end - s->row_begin, r = s->rank;
        if (!s->a || R == 0) continue;
        const float *dys = dy + s->row_begin * out, *xs = x + s->row_begin * in;
        const float *us = u + s->row_begin * u_ld;
        bool drop = s->dropout > 0;
        if (drop) { /* the forward's Xd, regenerated */
            drop_apply(nt, s, xs, in, xd, false);
            xs = xd;
        }
        /* dB (out, r) += scale dY^T U */
        cpu_sgemm_segment(cpu, LORA_CHUNK_ROWS, r, true, false, out, r, R, s->scale, dys, out, us,
                          u_ld, 1.0f, s->db, r);
        /* dU (R, r) = scale dY B */
        cpu_sgemm_segment(cpu, LORA_CHUNK_ROWS, r, false, false, R, r, out, s->scale, dys, out,
                          s->b, r, 0.0f, du, r);
        /* dA (r, in) += dU^T Xd */
        cpu_sgemm_segment(cpu, r, LORA_CHUNK_COLS, true, false, r, in, R, 1.0f, du, r, xs, in, 1.0f,
                          s->da, in);
        /* dX (R, in) += dU A, times the mask with dropout (T = dU A in the scratch first) */
        if (dx && !drop)
            cpu_sgemm_segment(cpu, 0, 0, false, false, R, in, r, 1.0f, du, r, s->a, in, 1.0f,
                              dx + s->row_begin * in, in);
        else if (dx) {
            cpu_sgemm_segment(cpu, 0, 0, false, false, R, in, r, 1.0f, du, r, s->a, in, 0.0f, xd,
                              in);
            drop_apply(nt, s, xd, in, dx + s->row_begin * in, true);
        }
    }
    free(du);
    free(xd);
    return TDM_OK;
}

/* Sum of squares: each vector is cut into blocks of SUMSQ_BLOCK elements; each block is summed
 * in double by one thread, the blocks are added in index order and the vectors in list order. */
#define SUMSQ_BLOCK 4096

tdm_status cpu_sumsq(tdm_backend *be, const tdm_be_vec *vecs, int64_t n_vecs, int n_groups,
                     float *out, tdm_error *err)
{
    int nt = cpu_of(be)->n_threads;
    double *acc = calloc((size_t)n_groups, sizeof(double));
    if (!acc) return tdm_fail(err, TDM_ERR_NOMEM, "sumsq: out of memory");
    for (int64_t v = 0; v < n_vecs; v++) {
        int64_t n = vecs[v].n, nb = (n + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK;
        if (nb == 0) continue;
        double *part = malloc((size_t)nb * sizeof(double));
        if (!part) {
            free(acc);
            return tdm_fail(err, TDM_ERR_NOMEM, "sumsq: out of memory");
        }
        const float *x = vecs[v].x;
#pragma omp parallel for schedule(static) num_threads(nt) if (n > TDM_CPU_PAR_MIN)
        for (int64_t b = 0; b < nb; b++) {
            int64_t lo = b * SUMSQ_BLOCK, hi = lo + SUMSQ_BLOCK < n ? lo + SUMSQ_BLOCK : n;
            double s = 0;
            for (int64_t i = lo; i < hi; i++)
                s += (double)x[i] * x[i];
            part[b] = s;
        }
        for (int64_t b = 0; b < nb; b++)
            acc[vecs[v].group] += part[b];
        free(part);
    }
    for (int g = 0; g < n_groups; g++)
        out[g] = (float)acc[g];
    free(acc);
    return TDM_OK;
}

tdm_status cpu_clip_coef(tdm_backend *be, const float *sumsq, const float *max_norm, int n_groups,
                         float *coef, float *norm, tdm_error *err)
{
    for (int g = 0; g < n_groups; g++) {
        float nrm = tdm_grad_norm(sumsq[g]);
        coef[g] = tdm_grad_clip_coef(nrm, max_norm[g]);
        if (norm) norm[g] = nrm;
    }
    return TDM_OK;
}

/* torch.optim.AdamW, single-tensor path, operation by operation in f32 with the scalar factors
 * computed in double and rounded to f32 as torch does for Python-scalar arguments. */
tdm_status cpu_adamw(tdm_backend *be, const tdm_adamw_tensor *tensors, int64_t n_tensors,
                     tdm_error *err)
{
    int nt = cpu_of(be)->n_threads;
    for (int64_t ti = 0; ti < n_tensors; ti++) {
        const tdm_adamw_tensor *t = &tensors[ti];
        double lr = t->lr, b1 = t->beta1, b2 = t->beta2;
        double bc1 = 1.0 - pow(b1, (double)t->step);
        double bc2_sqrt = sqrt(1.0 - pow(b2, (double)t->step));
        float decay = (float)(1.0 - lr * (double)t->weight_decay);
        float w1 = (float)(1.0 - b1); /* lerp weight */
        float fb2 = (float)b2, w2 = (float)(1.0 - b2);
        float neg_step = (float)(-(lr / bc1));
        float fbc2 = (float)bc2_sqrt, feps = (float)t->eps;
        bool scaled = t->grad_scale != NULL;
        float gs = scaled ? *t->grad_scale : 1.0f;
        bool wd = t->weight_decay != 0.0;
        float *p = t->p, *m = t->m, *v = t->v;
        const float *gp = t->g;
#pragma omp parallel for schedule(static) num_threads(nt) if (t->n > TDM_CPU_PAR_MIN)
        for (int64_t i = 0; i < t->n; i++) {
            float g = scaled ? gp[i] * gs : gp[i];
            float pi = p[i];
            if (wd) pi = pi * decay;
            float mi = m[i];
            /* torch lerp: weight < 0.5 -> self + weight * (end - self) */
            mi = w1 < 0.5f ? mi + w1 * (g - mi) : g - (g - mi) * (1.0f - w1);
            float vi = v[i] * fb2;
            vi = vi + w2 * g * g;
            float denom = sqrtf(vi) / fbc2 + feps;
            pi = pi + neg_step * mi / denom;
            p[i] = pi;
            m[i] = mi;
            v[i] = vi;
        }
    }
    return TDM_OK;
}
