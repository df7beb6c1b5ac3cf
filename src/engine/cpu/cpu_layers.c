/* cpu_layers.c — the CPU backend's layer ops: embedding, RMSNorm, RoPE, attention, SwiGLU.
 * Row reductions accumulate in double, sequentially within a row; rows are spread over threads,
 * so every output is computed by one thread in a fixed order (thread-count independent). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cpu/cpu_internal.h"
#include "engine/cpu/cpu_math.h"

tdm_status cpu_embedding(tdm_backend *be, const tdm_be_weight *w, const int32_t *ids, int64_t m,
                         void *out, tdm_error *err)
{
    cpu_backend *cpu = cpu_of(be);
    for (int64_t i = 0; i < m; i++)
        if (ids[i] < 0 || ids[i] >= w->rows)
            return tdm_fail(err, TDM_ERR_INVALID,
                            "embedding: token id %d at row %lld outside [0, %lld)", ids[i],
                            (long long)i, (long long)w->rows);
    float *o = out;
    int nt = cpu->n_threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (m * w->cols > TDM_CPU_PAR_MIN)
    for (int64_t i = 0; i < m; i++)
        cpu_weight_rows_f32(cpu, w, ids[i], ids[i] + 1, o + i * w->cols);
    return TDM_OK;
}

tdm_status cpu_rmsnorm_fwd(tdm_backend *be, const void *xv, const float *w, int64_t rows, int64_t d,
                           float eps, void *yv, float *rstd, tdm_error *err)
{
    const float *x = xv;
    float *y = yv;
    int nt = cpu_of(be)->n_threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * d > TDM_CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d;
        float *yr = y + r * d;
        double ss = 0;
        for (int64_t j = 0; j < d; j++)
            ss += (double)xr[j] * xr[j];
        float var = (float)(ss / (double)d);
        float rs = 1.0f / sqrtf(var + eps);
        for (int64_t j = 0; j < d; j++)
            yr[j] = w[j] * (xr[j] * rs);
        if (rstd) rstd[r] = rs;
    }
    return TDM_OK;
}

/* y_j = w_j x_j r, r = (mean(x^2) + eps)^(-1/2):
 * dx_j = r w_j dy_j - x_j r^3 / d * sum_k w_k dy_k x_k. */
tdm_status cpu_rmsnorm_bwd(tdm_backend *be, const void *dyv, const void *xv, const float *w,
                           const float *rstd, int64_t rows, int64_t d, void *dxv, float beta,
                           tdm_error *err)
{
    const float *dy = dyv, *x = xv;
    float *dx = dxv;
    int nt = cpu_of(be)->n_threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * d > TDM_CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *dyr = dy + r * d, *xr = x + r * d;
        float *dxr = dx + r * d;
        double dot = 0;
        for (int64_t j = 0; j < d; j++)
            dot += (double)w[j] * dyr[j] * xr[j];
        double rs = rstd[r];
        double c = dot * rs * rs * rs / (double)d;
        for (int64_t j = 0; j < d; j++) {
            float g = (float)(rs * w[j] * dyr[j] - c * xr[j]);
            dxr[j] = beta == 0.0f ? g : beta * dxr[j] + g;
        }
    }
    return TDM_OK;
}

tdm_status cpu_rope(tdm_backend *be, void *xv, int64_t m, int64_t n_heads, int64_t head_dim,
                    int64_t ld, const int32_t *pos, const float *inv_freq, bool inverse,
                    tdm_error *err)
{
    float *x = xv;
    int64_t half = head_dim / 2;
    int nt = cpu_of(be)->n_threads;
#pragma omp parallel for schedule(static)                                                          \
    num_threads(nt) if (m * n_heads * head_dim > TDM_CPU_PAR_MIN)
    for (int64_t i = 0; i < m; i++) {
        float *row = x + i * ld;
        float p = (float)pos[i];
        for (int64_t j = 0; j < half; j++) {
            float ang = p * inv_freq[j];
            float c = cosf(ang), s = sinf(ang);
            if (inverse) s = -s;
            for (int64_t h = 0; h < n_heads; h++) {
                float *hx = row + h * head_dim;
                float a = hx[j], b = hx[j + half];
                hx[j] = a * c - b * s;
                hx[j + half] = b * c + a * s;
            }
        }
    }
    return TDM_OK;
}

static double dotf(const float *a, const float *b, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

/* One query row qi (D) against keys k0[j * kld] and values v0[j * kld], j < n_keys: scores,
 * max, exp-sum (double), output oi (D) = softmax-weighted values; returns the log-sum-exp. p
 * (n_keys) and acc (D) are the caller's scratch (attention_kv's decode rows). */
static double attend_row(const float *qi, const float *k0, const float *v0, int64_t kld,
                         int64_t n_keys, int64_t D, float scale, double *p, double *acc, float *oi)
{
    double mx = -INFINITY;
    for (int64_t j = 0; j < n_keys; j++) {
        p[j] = (double)scale * dotf(qi, k0 + j * kld, D);
        if (p[j] > mx) mx = p[j];
    }
    double sum = 0;
    for (int64_t j = 0; j < n_keys; j++)
        sum += exp(p[j] - mx);
    double l = mx + log(sum);
    memset(acc, 0, (size_t)D * sizeof(double));
    for (int64_t j = 0; j < n_keys; j++) {
        double pj = exp(p[j] - l);
        const float *vj = v0 + j * kld;
        for (int64_t e = 0; e < D; e++)
            acc[e] += pj * vj[e];
    }
    for (int64_t e = 0; e < D; e++)
        oi[e] = (float)acc[e];
    return l;
}

/* ---- attention over whole sequences (training forward and backward) ----
 * Blocks of ATT_BLOCK query rows (forward, dq) or key rows (dk, dv) are the tasks, so a batch of
 * 4 sequences of 256 tokens and 14 heads gives the threads 224 forward tasks, not 56 (one per
 * sequence and head) nor, in the backward, 8 (one per sequence and KV head). Within a task the
 * scores, the probabilities and their products with V, dO, K and Q are single-threaded GEMMs
 * (att_gemm) over the block, with the masked part of the last block set to 0; every output
 * element is written by one task in a fixed order, so results do not depend on the thread
 * count. Softmax: max and exp-sum in double per row, P = exp(s - lse) in float. */
#define ATT_BLOCK 64

static void att_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                     int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    cpu_blas_sgemm_1t(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

static tdm_status check_seqs(const tdm_be_seqs *s, const char *op, tdm_error *err)
{
    const int32_t *cu = s->cu_seqlens;
    if (cu[0] != 0 || cu[s->n_seqs] != s->m)
        return tdm_fail(err, TDM_ERR_INVALID, "%s: cu_seqlens must run from 0 to m", op);
    for (int64_t i = 0; i < s->n_seqs; i++)
        if (cu[i + 1] < cu[i] || cu[i + 1] - cu[i] > s->max_seqlen)
            return tdm_fail(err, TDM_ERR_INVALID,
                            "%s: sequence %lld length invalid or above max_seqlen", op,
                            (long long)i);
    return TDM_OK;
}

/* The blocks of ATT_BLOCK rows of every sequence: (*blocks)[2b] = sequence, [2b+1] = first row
 * within it. Returns the count, or -1 when out of memory. */
static int64_t att_blocks(const tdm_be_seqs *s, int64_t **blocks)
{
    const int32_t *cu = s->cu_seqlens;
    int64_t n = 0;
    for (int64_t q = 0; q < s->n_seqs; q++)
        n += (cu[q + 1] - cu[q] + ATT_BLOCK - 1) / ATT_BLOCK;
    *blocks = malloc((size_t)(2 * n + 1) * sizeof(int64_t));
    if (!*blocks) return -1;
    int64_t b = 0;
    for (int64_t q = 0; q < s->n_seqs; q++)
        for (int64_t r = 0; r < cu[q + 1] - cu[q]; r += ATT_BLOCK)
            (*blocks)[2 * b] = q, (*blocks)[2 * b + 1] = r, b++;
    return n;
}

/* The blocks [b0, b1) of blk in the order the threads should take them, the costliest first (a
 * block's tasks take time in proportion to its keys, i0 + rows, in the forward and the dq pass,
 * and to its query rows after j0, len - j0, in the dk, dv pass): with dynamic scheduling the
 * last tasks to start are then the short ones, where the sequences' order (each one's blocks
 * ascending) left the longest for last. Which thread computes a task never changes its bits. */
typedef struct {
    int64_t cost, b;
} att_task;

static int att_task_cmp(const void *x, const void *y)
{
    const att_task *a = x, *b = y;
    if (a->cost != b->cost) return a->cost > b->cost ? -1 : 1;
    return a->b < b->b ? -1 : a->b > b->b;
}

static void att_order(const int32_t *cu, const int64_t *blk, int64_t b0, int64_t b1, bool by_keys,
                      att_task *order)
{
    for (int64_t b = b0; b < b1; b++) {
        int64_t len = cu[blk[2 * b] + 1] - cu[blk[2 * b]], r0 = blk[2 * b + 1];
        int64_t rows = len - r0 < ATT_BLOCK ? len - r0 : ATT_BLOCK;
        order[b - b0] = (att_task){by_keys ? r0 + rows : len - r0, b};
    }
    qsort(order, (size_t)(b1 - b0), sizeof *order, att_task_cmp);
}

/* P (rows x n_keys, ld ld) from scores, in place: row r is query i0 + r, key j of the block
 * is j0 + j; keys after the query are masked to 0. lse: the row's log-sum-exp when computing
 * (lse_out; max, then the sum of exp(s - max) in double by cpu_sum_f64), else read from lse_in;
 * then P = exp(s - lse) with lse in float, so the backward recomputes exactly the forward's P.
 * SIMD loops through cpu_expf (cpu_math.h): libm's exp, in double, and expf were a call per
 * element, about 170M a B4 x 256 step of Qwen2.5-0.5B. */
static void att_probs(float *p, int64_t ld, int64_t rows, int64_t n_keys, int64_t i0, int64_t j0,
                      float *lse_out, const float *lse_in)
{
    for (int64_t r = 0; r < rows; r++) {
        float *pr = p + r * ld;
        int64_t vis = i0 + r - j0 + 1; /* keys j0 .. i0 + r */
        if (vis > n_keys) vis = n_keys;
        if (vis < 0) vis = 0;
        float l;
        if (lse_out) {
            float mx = cpu_max_f32(pr, vis);
            l = (float)((double)mx + log(cpu_sum_f64(pr, vis, true, mx)));
            lse_out[r] = l;
        } else {
            l = lse_in[r];
        }
#pragma omp simd
        for (int64_t j = 0; j < vis; j++)
            pr[j] = cpu_expf(pr[j] - l);
        for (int64_t j = vis; j < n_keys; j++)
            pr[j] = 0.0f;
    }
}

/* dS = P (dP - Di) in place of dP (rows x n_keys, both ld ld), Di (rows): the row's
 * dout . out. */
static void att_dscores(const float *p, float *dp, int64_t ld, int64_t rows, int64_t n_keys,
                        const float *di)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *pr = p + r * ld;
        float *dpr = dp + r * ld, dr = di[r];
#pragma omp simd
        for (int64_t j = 0; j < n_keys; j++)
            dpr[j] = pr[j] * (dpr[j] - dr);
    }
}

tdm_status cpu_attention_fwd(tdm_backend *be, const tdm_be_seqs *s, const void *qv, const void *kv,
                             const void *vv, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                             float scale, void *outv, float *lse, tdm_error *err)
{
    TDM_TRY(check_seqs(s, "attention_fwd", err));
    const int32_t *cu = s->cu_seqlens;
    const float *q = qv, *k = kv, *v = vv;
    float *out = outv;
    int64_t D = head_dim, qld = n_heads * D, kld = n_kv_heads * D, group = n_heads / n_kv_heads;
    int64_t maxlen = s->max_seqlen > 0 ? s->max_seqlen : 1;
    int64_t *blk;
    int64_t nb = att_blocks(s, &blk);
    att_task *order = nb >= 0 ? malloc((size_t)(nb + 1) * sizeof *order) : NULL;
    if (nb < 0 || !order) {
        free(blk), free(order);
        return tdm_fail(err, TDM_ERR_NOMEM, "attention_fwd: out of memory");
    }
    att_order(cu, blk, 0, nb, true, order);
    int64_t n_tasks = nb * n_heads;
    int nt = cpu_of(be)->n_threads;
    bool oom = false;
#pragma omp parallel num_threads(nt) if (s->m * maxlen * n_heads * head_dim > TDM_CPU_PAR_MIN)
    {
        float *p = malloc((size_t)(ATT_BLOCK * maxlen) * sizeof(float));
        float *l = malloc((size_t)ATT_BLOCK * sizeof(float));
        if (!p || !l) {
#pragma omp atomic write
            oom = true;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < n_tasks; t++) {
            if (!p || !l) continue;
            int64_t b = order[t / n_heads].b, h = t % n_heads, kvh = h / group;
            int64_t sq = blk[2 * b], i0 = blk[2 * b + 1], base = cu[sq];
            int64_t len = cu[sq + 1] - base;
            int64_t rows = len - i0 < ATT_BLOCK ? len - i0 : ATT_BLOCK, nk = i0 + rows;
            const float *qb = q + (base + i0) * qld + h * D;
            const float *kb = k + base * kld + kvh * D, *vb = v + base * kld + kvh * D;
            att_gemm(false, true, rows, nk, D, scale, qb, qld, kb, kld, 0.0f, p, nk);
            att_probs(p, nk, rows, nk, i0, 0, l, NULL);
            att_gemm(false, false, rows, D, nk, 1.0f, p, nk, vb, kld, 0.0f,
                     out + (base + i0) * qld + h * D, qld);
            for (int64_t r = 0; r < rows; r++)
                lse[h * s->m + base + i0 + r] = l[r];
        }
        free(p);
        free(l);
    }
    free(blk), free(order);
    if (oom) return tdm_fail(err, TDM_ERR_NOMEM, "attention_fwd: out of memory");
    return TDM_OK;
}

/* The new keys and values go into their slots first; then one task per (sequence, query head)
 * computes each new row with attend_row (dot products and the softmax in double, one row at a
 * time: a decode step has one new row per sequence, too few for GEMMs). cpu_attention_fwd
 * computes the same values with float GEMMs over blocks, so the two agree within f32 rounding,
 * not bit for bit. */
tdm_status cpu_attention_kv(tdm_backend *be, const tdm_be_kv_seq *seqs, int64_t n_seqs, int64_t m,
                            const void *qv, const void *kv, const void *vv, void *kcv, void *vcv,
                            int64_t n_slots, int64_t cap, int64_t n_heads, int64_t n_kv_heads,
                            int64_t head_dim, float scale, void *outv, tdm_error *err)
{
    (void)m, (void)n_slots;
    const float *q = qv, *k = kv, *v = vv;
    float *kc = kcv, *vc = vcv, *out = outv;
    int64_t D = head_dim, qld = n_heads * D, kld = n_kv_heads * D, group = n_heads / n_kv_heads;
    int64_t maxlen = 1, work = 0;
    for (int64_t i = 0; i < n_seqs; i++) {
        const tdm_be_kv_seq *s = &seqs[i];
        size_t bytes = (size_t)(s->n_new * kld) * sizeof(float);
        int64_t dst = s->slot * cap + s->start;
        if (bytes) {
            memcpy(kc + dst * kld, k + s->row_begin * kld, bytes);
            memcpy(vc + dst * kld, v + s->row_begin * kld, bytes);
        }
        if (s->start + s->n_new > maxlen) maxlen = s->start + s->n_new;
        work += s->n_new * (s->start + s->n_new);
    }
    int64_t n_tasks = n_seqs * n_heads;
    int nt = cpu_of(be)->n_threads;
    bool oom = false;
#pragma omp parallel num_threads(nt) if (work * n_heads * head_dim > TDM_CPU_PAR_MIN)
    {
        double *p = malloc((size_t)maxlen * sizeof(double));
        double *acc = malloc((size_t)D * sizeof(double));
        if (!p || !acc) {
#pragma omp atomic write
            oom = true;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < n_tasks; t++) {
            if (!p || !acc) continue;
            const tdm_be_kv_seq *s = &seqs[t / n_heads];
            int64_t h = t % n_heads, kvh = h / group;
            const float *ks = kc + s->slot * cap * kld, *vs = vc + s->slot * cap * kld;
            for (int64_t r = 0; r < s->n_new; r++) /* position start + r: keys 0..start + r */
                attend_row(q + (s->row_begin + r) * qld + h * D, ks + kvh * D, vs + kvh * D, kld,
                           s->start + r + 1, D, scale, p, acc,
                           out + (s->row_begin + r) * qld + h * D);
        }
        free(p);
        free(acc);
    }
    if (oom) return tdm_fail(err, TDM_ERR_NOMEM, "attention_kv: out of memory");
    return TDM_OK;
}

/* With P_ij = exp(scale q_i.k_j - lse_i), Di = dout_i . out_i, dS_ij = P_ij (dout_i . v_j - Di):
 *   dq_i = scale sum_j dS_ij k_j,  dk_j = scale sum_i dS_ij q_i,  dv_j = sum_i P_ij dout_i
 * in two passes so that each output has one owner: tasks (query block, head) compute P and dS of
 * their rows against keys 0..end of the block and write dq; tasks (key block, KV head) sum dk
 * and dv over the group's query heads in head order, for the rows from the block's first key on.
 * The second pass reads the first pass's P and dS, kept (len x len per sequence and head), when
 * a sequence's fit the backend's cap (cpu->att_keep_bytes: 64 MiB unless TANDEM_CPU_ATT_KEEP_KIB
 * says otherwise; 29 MB for 4 x 256 tokens and 14 heads): 5 products a block and head, one
 * exponential per score. Sequences are taken in rounds whose P and dS fit together; one whose P
 * and dS alone do not has them recomputed in the second pass (7 products, 2x the exponentials).
 * The choice is a function of the sequence alone, so its bits are the same beside any other
 * sequences. Before, with the recomputation always (2-thread development VM, B4 x 256,
 * Qwen2.5-0.5B): attention_bwd 0.60 s a step, 0.49 s after. */

/* What both passes read. With keep, a round's P is at keep + h hstride + off[sq] (sequence sq's
 * len x len, ld len, from the round's start; hstride = the round's sum of len^2) and its dS
 * n_heads hstride floats after it; without, each thread's p and dp hold one block's. */
typedef struct {
    const int32_t *cu;
    const int64_t *blk;
    const float *q, *k, *v, *dout, *lse, *Di;
    float *dq, *dk, *dv;
    int64_t m, D, qld, kld, group, n_heads, n_kv_heads;
    float scale;
    float *keep;        /* NULL: recompute in the dk, dv pass */
    const int64_t *off; /* keep offset of each sequence in its round (floats) */
    int64_t hstride;    /* keep floats per head */
} att_bwd_args;

/* The dq pass for block b of head h: dq = scale dS K for rows [i0, i0 + rows) against keys
 * [0, i0 + rows). */
static void att_bwd_dq(const att_bwd_args *a, int64_t b, int64_t h, float *p, float *dp)
{
    int64_t kvh = h / a->group, D = a->D, qld = a->qld, kld = a->kld, m = a->m;
    int64_t sq = a->blk[2 * b], i0 = a->blk[2 * b + 1], base = a->cu[sq];
    int64_t len = a->cu[sq + 1] - base;
    int64_t rows = len - i0 < ATT_BLOCK ? len - i0 : ATT_BLOCK, nk = i0 + rows, ld = nk;
    const float *qb = a->q + (base + i0) * qld + h * D, *dob = a->dout + (base + i0) * qld + h * D;
    const float *kb = a->k + base * kld + kvh * D, *vb = a->v + base * kld + kvh * D;
    if (a->keep) {
        p = a->keep + h * a->hstride + a->off[sq] + i0 * len, ld = len;
        dp = p + a->hstride * a->n_heads;
    }
    att_gemm(false, true, rows, nk, D, a->scale, qb, qld, kb, kld, 0.0f, p, ld);
    att_probs(p, ld, rows, nk, i0, 0, NULL, a->lse + h * m + base + i0);
    att_gemm(false, true, rows, nk, D, 1.0f, dob, qld, vb, kld, 0.0f, dp, ld);
    att_dscores(p, dp, ld, rows, nk, a->Di + h * m + base + i0);
    att_gemm(false, false, rows, D, nk, a->scale, dp, ld, kb, kld, 0.0f,
             a->dq + (base + i0) * qld + h * D, qld);
}

/* The dk, dv pass for block b (keys [j0, j0 + cols)) of KV head kvh against rows [j0, len), every
 * query head of the group: dv = sum P^T dO, dk = scale sum dS^T Q, P and dS kept or recomputed. */
static void att_bwd_dkv(const att_bwd_args *a, int64_t b, int64_t kvh, float *p, float *dp)
{
    int64_t D = a->D, qld = a->qld, kld = a->kld, m = a->m;
    int64_t sq = a->blk[2 * b], j0 = a->blk[2 * b + 1], base = a->cu[sq];
    int64_t len = a->cu[sq + 1] - base;
    int64_t cols = len - j0 < ATT_BLOCK ? len - j0 : ATT_BLOCK, rows = len - j0, ld = cols;
    const float *kb = a->k + (base + j0) * kld + kvh * D, *vb = a->v + (base + j0) * kld + kvh * D;
    float *dkb = a->dk + (base + j0) * kld + kvh * D, *dvb = a->dv + (base + j0) * kld + kvh * D;
    for (int64_t h = kvh * a->group; h < (kvh + 1) * a->group; h++) {
        const float *qb = a->q + (base + j0) * qld + h * D;
        const float *dob = a->dout + (base + j0) * qld + h * D;
        float beta = h == kvh * a->group ? 0.0f : 1.0f;
        if (a->keep) { /* rows [j0, len), columns [j0, j0 + cols) of the kept P and dS */
            p = a->keep + h * a->hstride + a->off[sq] + j0 * len + j0, ld = len;
            dp = p + a->hstride * a->n_heads;
        } else {
            att_gemm(false, true, rows, cols, D, a->scale, qb, qld, kb, kld, 0.0f, p, ld);
            att_probs(p, ld, rows, cols, j0, j0, NULL, a->lse + h * m + base + j0);
            att_gemm(false, true, rows, cols, D, 1.0f, dob, qld, vb, kld, 0.0f, dp, ld);
        }
        /* dv += P^T dO */
        att_gemm(true, false, cols, D, rows, 1.0f, p, ld, dob, qld, beta, dvb, kld);
        if (!a->keep) att_dscores(p, dp, ld, rows, cols, a->Di + h * m + base + j0);
        /* dk += scale dS^T Q */
        att_gemm(true, false, cols, D, rows, a->scale, dp, ld, qb, qld, beta, dkb, kld);
    }
}

tdm_status cpu_attention_bwd(tdm_backend *be, const tdm_be_seqs *s, const void *qv, const void *kv,
                             const void *vv, const void *outv, const float *lse, const void *doutv,
                             int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale,
                             void *dqv, void *dkv, void *dvv, tdm_error *err)
{
    TDM_TRY(check_seqs(s, "attention_bwd", err));
    cpu_backend *cpu = cpu_of(be);
    const int32_t *cu = s->cu_seqlens;
    int64_t D = head_dim, qld = n_heads * D, m = s->m;
    att_bwd_args a = {.cu = cu,
                      .q = qv,
                      .k = kv,
                      .v = vv,
                      .dout = doutv,
                      .lse = lse,
                      .dq = dqv,
                      .dk = dkv,
                      .dv = dvv,
                      .m = m,
                      .D = D,
                      .qld = qld,
                      .kld = n_kv_heads * D,
                      .group = n_heads / n_kv_heads,
                      .n_heads = n_heads,
                      .n_kv_heads = n_kv_heads,
                      .scale = scale};
    const float *out = outv;
    int64_t maxlen = s->max_seqlen > 0 ? s->max_seqlen : 1;
    int64_t *blk, *off = malloc((size_t)(s->n_seqs + 1) * sizeof(int64_t));
    int64_t nb = att_blocks(s, &blk);
    float *Di = malloc((size_t)(m * n_heads > 0 ? m * n_heads : 1) * sizeof(float));
    att_task *ord_q = nb >= 0 ? malloc((size_t)(2 * nb + 1) * sizeof *ord_q) : NULL;
    if (nb < 0 || !Di || !off || !ord_q) {
        free(blk), free(Di), free(off), free(ord_q);
        return tdm_fail(err, TDM_ERR_NOMEM, "attention_bwd: out of memory");
    }
    att_task *ord_k = ord_q + nb;
    a.blk = blk, a.Di = Di, a.off = off;
    int nt = cpu->n_threads;
    bool par = s->m * maxlen * n_heads * head_dim > TDM_CPU_PAR_MIN;
#pragma omp parallel for schedule(static) num_threads(nt) if (par)
    for (int64_t i = 0; i < m; i++)
        for (int64_t h = 0; h < n_heads; h++)
            Di[h * m + i] = (float)dotf(a.dout + i * qld + h * D, out + i * qld + h * D, D);
    bool oom = false;
    int64_t cap = cpu->att_keep_bytes;
    /* rounds of whole sequences [q0, q1), blocks [b0, b1) */
    /* bytes of P and dS for len^2 floats a head */
    const int64_t per_sq = 2 * n_heads * (int64_t)sizeof(float);
    for (int64_t q0 = 0, b0 = 0; q0 < s->n_seqs && !oom;) {
        int64_t q1 = q0, b1 = b0, sq_sum = 0; /* the round's sum of len^2 */
        while (q1 < s->n_seqs) {
            int64_t len = cu[q1 + 1] - cu[q1];
            if (q1 > q0 && (sq_sum + len * len) * per_sq > cap) break;
            off[q1] = sq_sum;
            sq_sum += len * len, b1 += (len + ATT_BLOCK - 1) / ATT_BLOCK, q1++;
            if (sq_sum * per_sq > cap) break; /* alone, recomputed */
        }
        a.keep = NULL, a.hstride = sq_sum;
        if (sq_sum > 0 && sq_sum * per_sq <= cap) {
            a.keep = cpu_scratch(cpu, CPU_SCRATCH_ATT_KEEP, (size_t)(sq_sum * per_sq));
            if (!a.keep) {
                oom = true;
                break;
            }
        }
        int64_t n_dq = (b1 - b0) * n_heads, n_dkv = (b1 - b0) * n_kv_heads;
        att_order(cu, blk, b0, b1, true, ord_q);
        att_order(cu, blk, b0, b1, false, ord_k);
#pragma omp parallel num_threads(nt) if (par)
        {
            /* the thread's P and dP when they are recomputed */
            float *p = a.keep ? NULL : malloc((size_t)(ATT_BLOCK * maxlen) * sizeof(float));
            float *dp = a.keep ? NULL : malloc((size_t)(ATT_BLOCK * maxlen) * sizeof(float));
            bool ok = a.keep || (p && dp);
            if (!ok) {
#pragma omp atomic write
                oom = true;
            }
#pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < n_dq; t++) {
                if (ok) att_bwd_dq(&a, ord_q[t / n_heads].b, t % n_heads, p, dp);
            }
            /* (the loop's barrier: the dk, dv pass reads the kept P and dS of every block) */
#pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < n_dkv; t++)
                if (ok) att_bwd_dkv(&a, ord_k[t / n_kv_heads].b, t % n_kv_heads, p, dp);
            free(p);
            free(dp);
        }
        q0 = q1, b0 = b1;
    }
    free(blk);
    free(Di);
    free(off);
    free(ord_q);
    if (oom) return tdm_fail(err, TDM_ERR_NOMEM, "attention_bwd: out of memory");
    return TDM_OK;
}

/* SwiGLU, h = silu(g) u with silu(g) = g sigmoid(g), elementwise over m x n (1024 x 4864 a
 * layer at a B4 x 256 step of Qwen2.5-0.5B): SIMD loops through cpu_expf (cpu_math.h), where
 * libm's expf made them a call per element (148 ms a 16-thread step, 0.6 s at 2 threads). */
static inline float sigmoidf(float x)
{
    return 1.0f / (1.0f + cpu_expf(-x));
}

tdm_status cpu_swiglu_fwd(tdm_backend *be, const void *gv, const void *uv, int64_t m, int64_t n,
                          void *hv, tdm_error *err)
{
    const float *g = gv, *u = uv;
    float *h = hv;
    int64_t total = m * n;
    int nt = cpu_of(be)->n_threads;
#pragma omp parallel for simd schedule(static) num_threads(nt) if (total > TDM_CPU_PAR_MIN)
    for (int64_t i = 0; i < total; i++)
        h[i] = g[i] * sigmoidf(g[i]) * u[i];
    return TDM_OK;
}

/* dg may be dh (the engine reuses the buffer): every element is read before it is written, in
 * the same iteration, so SIMD needs no other ordering. */
tdm_status cpu_swiglu_bwd(tdm_backend *be, const void *gv, const void *uv, const void *dhv,
                          int64_t m, int64_t n, void *dgv, void *duv, tdm_error *err)
{
    const float *g = gv, *u = uv, *dh = dhv;
    float *dg = dgv, *du = duv;
    int64_t total = m * n;
    int nt = cpu_of(be)->n_threads;
#pragma omp parallel for simd schedule(static) num_threads(nt) if (total > TDM_CPU_PAR_MIN)
    for (int64_t i = 0; i < total; i++) {
        float gi = g[i], ui = u[i], d = dh[i];
        float sg = sigmoidf(gi);
        float silu = gi * sg;
        dg[i] = d * ui * sg * (1.0f + gi * (1.0f - sg));
        du[i] = d * silu;
    }
    return TDM_OK;
}
