/* cpu_layers.c — the CPU backend's layer ops: embedding, RMSNorm, RoPE, attention, SwiGLU.
 * Row reductions accumulate in double, sequentially within a row; rows are spread over threads,
 * so every output is computed by one thread in a fixed order (thread-count independent). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cpu/cpu_internal.h"

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
 * (n_keys) and acc (D) are the caller's scratch. attention_fwd and attention_kv both run it, so a
 * decode step computes a row exactly as the full forward does. */
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

/* One task per (sequence, query head); each query row of the task is computed in full by the
 * task's thread: scores against keys 0..i of its sequence, max, exp-sum (double), lse, output. */
tdm_status cpu_attention_fwd(tdm_backend *be, const tdm_be_seqs *s, const void *qv, const void *kv,
                             const void *vv, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                             float scale, void *outv, float *lse, tdm_error *err)
{
    const int32_t *cu = s->cu_seqlens;
    if (cu[0] != 0 || cu[s->n_seqs] != s->m)
        return tdm_fail(err, TDM_ERR_INVALID, "attention_fwd: cu_seqlens must run from 0 to m");
    for (int64_t i = 0; i < s->n_seqs; i++)
        if (cu[i + 1] < cu[i] || cu[i + 1] - cu[i] > s->max_seqlen)
            return tdm_fail(err, TDM_ERR_INVALID,
                            "attention_fwd: sequence %lld length invalid or above max_seqlen",
                            (long long)i);
    const float *q = qv, *k = kv, *v = vv;
    float *out = outv;
    int64_t D = head_dim, qld = n_heads * D, kld = n_kv_heads * D, group = n_heads / n_kv_heads;
    int64_t n_tasks = s->n_seqs * n_heads;
    int64_t maxlen = s->max_seqlen > 0 ? s->max_seqlen : 1;
    int nt = cpu_of(be)->n_threads;
    bool oom = false;
#pragma omp parallel num_threads(nt) if (s->m * maxlen * n_heads * head_dim > TDM_CPU_PAR_MIN)
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
            int64_t sq = t / n_heads, h = t % n_heads, kvh = h / group;
            int64_t base = cu[sq], len = cu[sq + 1] - cu[sq];
            for (int64_t i = 0; i < len; i++)
                lse[h * s->m + base + i] =
                    (float)attend_row(q + (base + i) * qld + h * D, k + base * kld + kvh * D,
                                      v + base * kld + kvh * D, kld, i + 1, D, scale, p, acc,
                                      out + (base + i) * qld + h * D);
        }
        free(p);
        free(acc);
    }
    if (oom) return tdm_fail(err, TDM_ERR_NOMEM, "attention_fwd: out of memory");
    return TDM_OK;
}

/* The new keys and values go into their slots first; then one task per (sequence, query head)
 * computes each new row with attend_row, as cpu_attention_fwd computes the row at that position,
 * so a decode step gives the bits the full forward gives when the cached keys and values are the
 * same. */
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

/* One task per (sequence, KV head): it owns dk/dv of that head's rows in that sequence and dq of
 * the query heads of its group, so no two threads write the same element. With
 * P_ij = exp(scale q_i.k_j - lse_i), Di = dout_i . out_i, dS_ij = P_ij (dout_i . v_j - Di):
 *   dq_i = scale sum_j dS_ij k_j,  dk_j = scale sum_i dS_ij q_i,  dv_j = sum_i P_ij dout_i
 * (the last two summed over the group's query heads in head order, then i order). */
tdm_status cpu_attention_bwd(tdm_backend *be, const tdm_be_seqs *s, const void *qv, const void *kv,
                             const void *vv, const void *outv, const float *lse, const void *doutv,
                             int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale,
                             void *dqv, void *dkv, void *dvv, tdm_error *err)
{
    const int32_t *cu = s->cu_seqlens;
    if (cu[0] != 0 || cu[s->n_seqs] != s->m)
        return tdm_fail(err, TDM_ERR_INVALID, "attention_bwd: cu_seqlens must run from 0 to m");
    for (int64_t i = 0; i < s->n_seqs; i++)
        if (cu[i + 1] < cu[i] || cu[i + 1] - cu[i] > s->max_seqlen)
            return tdm_fail(err, TDM_ERR_INVALID,
                            "attention_bwd: sequence %lld length invalid or above max_seqlen",
                            (long long)i);
    const float *q = qv, *k = kv, *v = vv, *out = outv, *dout = doutv;
    float *dq = dqv, *dk = dkv, *dv = dvv;
    int64_t D = head_dim, qld = n_heads * D, kld = n_kv_heads * D, group = n_heads / n_kv_heads;
    int64_t n_tasks = s->n_seqs * n_kv_heads;
    int64_t maxlen = s->max_seqlen > 0 ? s->max_seqlen : 1;
    int nt = cpu_of(be)->n_threads;
    bool oom = false;
#pragma omp parallel num_threads(nt) if (s->m * maxlen * n_heads * head_dim > TDM_CPU_PAR_MIN)
    {
        double *dka = malloc((size_t)(maxlen * D) * sizeof(double));
        double *dva = malloc((size_t)(maxlen * D) * sizeof(double));
        double *dqa = malloc((size_t)D * sizeof(double));
        if (!dka || !dva || !dqa) {
#pragma omp atomic write
            oom = true;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < n_tasks; t++) {
            if (!dka || !dva || !dqa) continue;
            int64_t sq = t / n_kv_heads, kvh = t % n_kv_heads;
            int64_t base = cu[sq], len = cu[sq + 1] - cu[sq];
            memset(dka, 0, (size_t)(len * D) * sizeof(double));
            memset(dva, 0, (size_t)(len * D) * sizeof(double));
            for (int64_t h = kvh * group; h < (kvh + 1) * group; h++) {
                for (int64_t i = 0; i < len; i++) {
                    const float *qi = q + (base + i) * qld + h * D;
                    const float *oi = out + (base + i) * qld + h * D;
                    const float *doi = dout + (base + i) * qld + h * D;
                    double Di = dotf(doi, oi, D);
                    double l = lse[h * s->m + base + i];
                    memset(dqa, 0, (size_t)D * sizeof(double));
                    for (int64_t j = 0; j <= i; j++) {
                        const float *kj = k + (base + j) * kld + kvh * D;
                        const float *vj = v + (base + j) * kld + kvh * D;
                        double pij = exp((double)scale * dotf(qi, kj, D) - l);
                        double ds = pij * (dotf(doi, vj, D) - Di);
                        double *dkj = dka + j * D, *dvj = dva + j * D;
                        for (int64_t e = 0; e < D; e++) {
                            dqa[e] += ds * kj[e];
                            dkj[e] += ds * qi[e];
                            dvj[e] += pij * doi[e];
                        }
                    }
                    float *dqi = dq + (base + i) * qld + h * D;
                    for (int64_t e = 0; e < D; e++)
                        dqi[e] = (float)(scale * dqa[e]);
                }
            }
            for (int64_t j = 0; j < len; j++) {
                float *dkj = dk + (base + j) * kld + kvh * D;
                float *dvj = dv + (base + j) * kld + kvh * D;
                for (int64_t e = 0; e < D; e++) {
                    dkj[e] = (float)(scale * dka[j * D + e]);
                    dvj[e] = (float)dva[j * D + e];
                }
            }
        }
        free(dka);
        free(dva);
        free(dqa);
    }
    if (oom) return tdm_fail(err, TDM_ERR_NOMEM, "attention_bwd: out of memory");
    return TDM_OK;
}

tdm_status cpu_swiglu_fwd(tdm_backend *be, const void *gv, const void *uv, int64_t m, int64_t n,
                          void *hv, tdm_error *err)
{
    const float *g = gv, *u = uv;
    float *h = hv;
    int64_t total = m * n;
    int nt = cpu_of(be)->n_threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (total > TDM_CPU_PAR_MIN)
    for (int64_t i = 0; i < total; i++) {
        float sg = 1.0f / (1.0f + expf(-g[i]));
        h[i] = g[i] * sg * u[i];
    }
    return TDM_OK;
}

tdm_status cpu_swiglu_bwd(tdm_backend *be, const void *gv, const void *uv, const void *dhv,
                          int64_t m, int64_t n, void *dgv, void *duv, tdm_error *err)
{
    const float *g = gv, *u = uv, *dh = dhv;
    float *dg = dgv, *du = duv;
    int64_t total = m * n;
    int nt = cpu_of(be)->n_threads;
#pragma omp parallel for schedule(static) num_threads(nt) if (total > TDM_CPU_PAR_MIN)
    for (int64_t i = 0; i < total; i++) {
        float gi = g[i], ui = u[i], d = dh[i];
        float sg = 1.0f / (1.0f + expf(-gi));
        float silu = gi * sg;
        dg[i] = d * ui * sg * (1.0f + gi * (1.0f - sg));
        du[i] = d * silu;
    }
    return TDM_OK;
}
