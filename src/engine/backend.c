/* backend.c — argument checks shared by every backend, then dispatch through the function table.
 * See backend.h for the contracts. */
#include "engine/backend.h"

#include <string.h>

#include "engine/backend_impl.h"
#include "engine/op_profile.h"

size_t tdm_be_dtype_size(tdm_be_dtype dtype)
{
    switch (dtype) {
    case TDM_BE_F32:
    case TDM_BE_I32:
        return 4;
    case TDM_BE_BF16:
        return 2;
    case TDM_BE_U8:
        return 1;
    }
    return 0;
}

const char *tdm_be_dtype_name(tdm_be_dtype dtype)
{
    switch (dtype) {
    case TDM_BE_F32:
        return "f32";
    case TDM_BE_BF16:
        return "bf16";
    case TDM_BE_U8:
        return "u8";
    case TDM_BE_I32:
        return "i32";
    }
    return "?";
}

tdm_status tdm_backend_create(tdm_backend **out, const char *name, const tdm_backend_opts *opts,
                              tdm_error *err)
{
    *out = NULL;
    tdm_backend_opts defaults = {0};
    if (!opts) opts = &defaults;
    if (strcmp(name, "cpu") == 0) return tdm_backend_cpu_create(out, opts, err);
    if (strcmp(name, "cuda") == 0) {
#ifdef TANDEM_HAVE_CUDA
        return tdm_backend_cuda_create(out, opts, err);
#else
        return tdm_fail(err, TDM_ERR_UNSUPPORTED,
                        "backend cuda: this build of tandem has no CUDA support (rebuild where "
                        "the CUDA toolkit is installed)");
#endif
    }
    return tdm_fail(err, TDM_ERR_NOT_FOUND, "backend '%s': unknown (known: cpu, cuda)", name);
}

void tdm_backend_free(tdm_backend *be)
{
    if (!be) return;
    (void)tdm_be_profile_enable(be, false, NULL); /* the profile and its device marks */
    be->vt->destroy(be);
}

const char *tdm_be_name(const tdm_backend *be)
{
    return be->name;
}

tdm_be_dtype tdm_be_act_dtype(const tdm_backend *be)
{
    return be->act_dtype;
}

/* ---- dispatch ---- */

/* Calls the backend's implementation; with per-op profiling on (op_profile.h), timed. */
#define DISPATCH(id, call)                                                                         \
    do {                                                                                           \
        if (!be->prof) return (call);                                                              \
        int64_t t0_;                                                                               \
        int tok_ = tdm_op_profile_begin(be, &t0_);                                                 \
        tdm_status st_ = (call);                                                                   \
        tdm_op_profile_end(be, (id), tok_, t0_);                                                   \
        return st_;                                                                                \
    } while (0)

/* ---- checks ---- */

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) return tdm_fail(err, TDM_ERR_INVALID, __VA_ARGS__);                           \
    } while (0)

static bool is_float(tdm_be_dtype d)
{
    return d == TDM_BE_F32 || d == TDM_BE_BF16;
}

/* Largest element count we accept: products of shapes stay far from int64 overflow. */
#define MAX_DIM ((int64_t)1 << 40)

static bool dim_ok(int64_t d)
{
    return d >= 0 && d <= MAX_DIM;
}

tdm_status tdm_be_alloc(tdm_backend *be, tdm_be_dtype dtype, int64_t numel, void **out,
                        tdm_error *err)
{
    *out = NULL;
    CHECK(dim_ok(numel), "alloc: bad element count %lld", (long long)numel);
    return be->vt->alloc(be, (size_t)numel * tdm_be_dtype_size(dtype), out, err);
}

void tdm_be_free(tdm_backend *be, void *ptr)
{
    if (ptr) be->vt->free(be, ptr);
}

tdm_status tdm_be_upload(tdm_backend *be, void *dst, const void *src, size_t bytes, tdm_error *err)
{
    if (bytes == 0) return TDM_OK;
    CHECK(dst && src, "upload: NULL pointer");
    DISPATCH(TDM_OP_UPLOAD, be->vt->upload(be, dst, src, bytes, err));
}

tdm_status tdm_be_download(tdm_backend *be, void *dst, const void *src, size_t bytes,
                           tdm_error *err)
{
    if (bytes == 0) return TDM_OK;
    CHECK(dst && src, "download: NULL pointer");
    DISPATCH(TDM_OP_DOWNLOAD, be->vt->download(be, dst, src, bytes, err));
}

tdm_status tdm_be_upload_f32(tdm_backend *be, void *dst, tdm_be_dtype dtype, const float *src,
                             int64_t n, tdm_error *err)
{
    CHECK(is_float(dtype), "upload_f32: destination dtype %s is not f32/bf16",
          tdm_be_dtype_name(dtype));
    CHECK(dim_ok(n), "upload_f32: bad count");
    if (n == 0) return TDM_OK;
    CHECK(dst && src, "upload_f32: NULL pointer");
    DISPATCH(TDM_OP_UPLOAD, be->vt->upload_f32(be, dst, dtype, src, n, err));
}

tdm_status tdm_be_download_f32(tdm_backend *be, float *dst, const void *src, tdm_be_dtype dtype,
                               int64_t n, tdm_error *err)
{
    CHECK(is_float(dtype), "download_f32: source dtype %s is not f32/bf16",
          tdm_be_dtype_name(dtype));
    CHECK(dim_ok(n), "download_f32: bad count");
    if (n == 0) return TDM_OK;
    CHECK(dst && src, "download_f32: NULL pointer");
    DISPATCH(TDM_OP_DOWNLOAD, be->vt->download_f32(be, dst, src, dtype, n, err));
}

/* The arguments of a copy of bytes > 0: both sides given, not overlapping. */
static tdm_status copy_args(const char *op, void *dst, const void *src, size_t bytes,
                            tdm_error *err)
{
    CHECK(dst && src, "%s: NULL pointer", op);
    const char *d = dst, *s = src;
    CHECK(d + bytes <= s || s + bytes <= d, "%s: overlapping regions", op);
    return TDM_OK;
}

tdm_status tdm_be_copy(tdm_backend *be, void *dst, const void *src, size_t bytes, tdm_error *err)
{
    if (bytes == 0) return TDM_OK;
    TDM_TRY(copy_args("copy", dst, src, bytes, err));
    DISPATCH(TDM_OP_COPY, be->vt->copy(be, dst, src, bytes, err));
}

tdm_status tdm_be_memory(tdm_backend *be, tdm_be_mem_info *info, tdm_error *err)
{
    memset(info, 0, sizeof *info);
    return be->vt->memory(be, info, err);
}

tdm_status tdm_be_reserve_scratch(tdm_backend *be, const tdm_be_step_shape *shape,
                                  tdm_error *err)
{
    CHECK(shape, "reserve_scratch: NULL shape");
    return be->vt->reserve_scratch ? be->vt->reserve_scratch(be, shape, err) : TDM_OK;
}

void tdm_be_reset_peak(tdm_backend *be)
{
    be->vt->reset_peak(be);
}

tdm_status tdm_be_synchronize(tdm_backend *be, tdm_error *err)
{
    DISPATCH(TDM_OP_SYNCHRONIZE, be->vt->synchronize(be, err));
}

tdm_status tdm_be_host_alloc(tdm_backend *be, size_t bytes, void **out, tdm_error *err)
{
    *out = NULL;
    if (!be->vt->host_alloc)
        return tdm_fail(err, TDM_ERR_UNSUPPORTED, "backend %s: no host memory for offload",
                        be->name);
    CHECK(bytes > 0, "host_alloc: zero bytes");
    return be->vt->host_alloc(be, bytes, out, err);
}

void tdm_be_host_free(tdm_backend *be, void *ptr)
{
    if (ptr && be->vt->host_free) be->vt->host_free(be, ptr);
}

/* Not profiled: the copy runs beside the ops, and the join is a marker on the queue. */
tdm_status tdm_be_copy_behind(tdm_backend *be, void *dst, const void *src, size_t bytes,
                              tdm_error *err)
{
    if (!be->vt->copy_behind)
        return tdm_fail(err, TDM_ERR_UNSUPPORTED, "backend %s: no copies behind the ops",
                        be->name);
    if (bytes == 0) return TDM_OK;
    TDM_TRY(copy_args("copy_behind", dst, src, bytes, err));
    return be->vt->copy_behind(be, dst, src, bytes, err);
}

tdm_status tdm_be_copies_join(tdm_backend *be, tdm_error *err)
{
    if (!be->vt->copies_join)
        return tdm_fail(err, TDM_ERR_UNSUPPORTED, "backend %s: no copies behind the ops",
                        be->name);
    return be->vt->copies_join(be, err);
}

tdm_status tdm_be_fill(tdm_backend *be, void *x, tdm_be_dtype dtype, int64_t n, float value,
                       tdm_error *err)
{
    CHECK(dim_ok(n), "fill: bad count");
    if (n == 0) return TDM_OK;
    CHECK(x, "fill: NULL pointer");
    DISPATCH(TDM_OP_FILL, be->vt->fill(be, x, dtype, n, value, err));
}

tdm_status tdm_be_axpy(tdm_backend *be, void *y, const void *x, tdm_be_dtype dtype, int64_t n,
                       float alpha, tdm_error *err)
{
    CHECK(is_float(dtype), "axpy: dtype %s is not f32/bf16", tdm_be_dtype_name(dtype));
    CHECK(dim_ok(n), "axpy: bad count");
    if (n == 0) return TDM_OK;
    CHECK(x && y, "axpy: NULL pointer");
    DISPATCH(TDM_OP_AXPY, be->vt->axpy(be, y, x, dtype, n, alpha, err));
}

tdm_status tdm_be_scale(tdm_backend *be, void *x, tdm_be_dtype dtype, int64_t n, float alpha,
                        tdm_error *err)
{
    CHECK(is_float(dtype), "scale: dtype %s is not f32/bf16", tdm_be_dtype_name(dtype));
    CHECK(dim_ok(n), "scale: bad count");
    if (n == 0) return TDM_OK;
    CHECK(x, "scale: NULL pointer");
    DISPATCH(TDM_OP_SCALE, be->vt->scale(be, x, dtype, n, alpha, err));
}

tdm_status tdm_be_add_bias(tdm_backend *be, void *y, const float *bias, int64_t rows, int64_t cols,
                           tdm_error *err)
{
    CHECK(dim_ok(rows) && dim_ok(cols), "add_bias: bad shape");
    if (rows == 0 || cols == 0) return TDM_OK;
    CHECK(y && bias, "add_bias: NULL pointer");
    DISPATCH(TDM_OP_ADD_BIAS, be->vt->add_bias(be, y, bias, rows, cols, err));
}

tdm_status tdm_be_gemm(tdm_backend *be, const tdm_gemm_args *g, tdm_error *err)
{
    CHECK(dim_ok(g->m) && dim_ok(g->n) && dim_ok(g->k) && g->batch >= 0,
          "gemm: bad shape m %lld n %lld k %lld", (long long)g->m, (long long)g->n,
          (long long)g->k);
    CHECK(is_float(g->a_dtype) && is_float(g->b_dtype) && is_float(g->c_dtype),
          "gemm: operands must be f32 or bf16");
    if (g->m == 0 || g->n == 0) return TDM_OK;
    CHECK(g->c, "gemm: NULL C");
    CHECK(g->k == 0 || (g->a && g->b), "gemm: NULL A or B");
    int64_t a_cols = g->trans_a ? g->m : g->k;
    int64_t b_cols = g->trans_b ? g->k : g->n;
    CHECK(g->lda >= (a_cols > 0 ? a_cols : 1), "gemm: lda %lld < %lld", (long long)g->lda,
          (long long)a_cols);
    CHECK(g->ldb >= (b_cols > 0 ? b_cols : 1), "gemm: ldb %lld < %lld", (long long)g->ldb,
          (long long)b_cols);
    CHECK(g->ldc >= g->n, "gemm: ldc %lld < n %lld", (long long)g->ldc, (long long)g->n);
    if (g->batch > 1)
        CHECK(g->stride_a >= 0 && g->stride_b >= 0 && g->stride_c >= 0,
              "gemm: negative batch stride");
    DISPATCH(TDM_OP_GEMM, be->vt->gemm(be, g, err));
}

static tdm_status check_weight(const tdm_be_weight *w, const char *op, tdm_error *err)
{
    CHECK(w, "%s: NULL weight", op);
    CHECK(dim_ok(w->rows) && dim_ok(w->cols) && w->rows > 0 && w->cols > 0,
          "%s: bad weight shape (%lld, %lld)", op, (long long)w->rows, (long long)w->cols);
    switch (w->format) {
    case TDM_BE_W_F32:
    case TDM_BE_W_BF16:
        CHECK(w->data, "%s: dense weight without data", op);
        break;
    case TDM_BE_W_NF4:
        CHECK(w->codes && w->absmax, "%s: NF4 weight without codes/absmax", op);
        break;
    case TDM_BE_W_NF4_DQ:
        CHECK(w->codes && w->absmax_q && w->absmax2,
              "%s: double-quantized NF4 weight without codes/absmax_q/absmax2", op);
        break;
    case TDM_BE_W_F32_PANELS:
        CHECK(w->data && w->panel > 0 && w->rows % w->panel == 0,
              "%s: panel weight without data or with %d-row panels for %lld rows", op,
              (int)w->panel, (long long)w->rows);
        break;
    default:
        return tdm_fail(err, TDM_ERR_INVALID, "%s: unknown weight format %d", op, (int)w->format);
    }
    return TDM_OK;
}

tdm_status tdm_be_lay_out_frozen(tdm_backend *be, tdm_be_weight *w, tdm_be_frozen_use use,
                                 tdm_error *err)
{
    TDM_TRY(check_weight(w, "lay_out_frozen", err));
    if (!be->vt->lay_out_frozen || w->format != TDM_BE_W_F32) return TDM_OK;
    return be->vt->lay_out_frozen(be, w, use, err);
}

tdm_status tdm_be_weight_rows(tdm_backend *be, const tdm_be_weight *w, int64_t row_begin,
                              int64_t row_end, void *out, tdm_be_dtype out_dtype, tdm_error *err)
{
    TDM_TRY(check_weight(w, "weight_rows", err));
    CHECK(0 <= row_begin && row_begin <= row_end && row_end <= w->rows,
          "weight_rows: rows [%lld, %lld) outside [0, %lld)", (long long)row_begin,
          (long long)row_end, (long long)w->rows);
    CHECK(is_float(out_dtype), "weight_rows: output dtype must be f32 or bf16");
    if (row_begin == row_end) return TDM_OK;
    CHECK(out, "weight_rows: NULL output");
    DISPATCH(TDM_OP_WEIGHT_ROWS,
             be->vt->weight_rows(be, w, row_begin, row_end, out, out_dtype, err));
}

tdm_status tdm_be_linear_fwd(tdm_backend *be, const tdm_be_weight *w, const void *x, int64_t m,
                             void *y, float beta, tdm_error *err)
{
    TDM_TRY(check_weight(w, "linear_fwd", err));
    CHECK(dim_ok(m), "linear_fwd: bad row count");
    if (m == 0) return TDM_OK;
    CHECK(x && y, "linear_fwd: NULL pointer");
    DISPATCH(TDM_OP_LINEAR_FWD, be->vt->linear_fwd(be, w, x, m, y, beta, err));
}

tdm_status tdm_be_linear_fwd_shared(tdm_backend *be, const tdm_be_weight *const *ws, int n,
                                    const void *x, int64_t m, void *const *ys, tdm_error *err)
{
    CHECK(ws && ys && n >= 1 && n <= TDM_BE_SHARED_MAX, "linear_fwd_shared: bad weight count");
    for (int i = 0; i < n; i++) {
        TDM_TRY(check_weight(ws[i], "linear_fwd_shared", err));
        CHECK(ws[i]->cols == ws[0]->cols, "linear_fwd_shared: weights of different in-features");
    }
    CHECK(dim_ok(m), "linear_fwd_shared: bad row count");
    if (m == 0) return TDM_OK;
    CHECK(x, "linear_fwd_shared: NULL pointer");
    for (int i = 0; i < n; i++)
        CHECK(ys[i], "linear_fwd_shared: NULL pointer");
    if (!be->vt->linear_fwd_shared) {
        for (int i = 0; i < n; i++)
            TDM_TRY(tdm_be_linear_fwd(be, ws[i], x, m, ys[i], 0.0f, err));
        return TDM_OK;
    }
    DISPATCH(TDM_OP_LINEAR_FWD, be->vt->linear_fwd_shared(be, ws, n, x, m, ys, err));
}

tdm_status tdm_be_linear_bwd(tdm_backend *be, const tdm_be_weight *w, const void *dy, int64_t m,
                             void *dx, float beta, tdm_error *err)
{
    TDM_TRY(check_weight(w, "linear_bwd", err));
    CHECK(dim_ok(m), "linear_bwd: bad row count");
    if (m == 0) return TDM_OK;
    CHECK(dy && dx, "linear_bwd: NULL pointer");
    DISPATCH(TDM_OP_LINEAR_BWD, be->vt->linear_bwd(be, w, dy, m, dx, beta, err));
}

tdm_status tdm_be_embedding(tdm_backend *be, const tdm_be_weight *w, const int32_t *ids, int64_t m,
                            void *out, tdm_error *err)
{
    TDM_TRY(check_weight(w, "embedding", err));
    CHECK(w->format == TDM_BE_W_F32 || w->format == TDM_BE_W_BF16 ||
              w->format == TDM_BE_W_F32_PANELS,
          "embedding: the table must be dense");
    CHECK(dim_ok(m), "embedding: bad row count");
    if (m == 0) return TDM_OK;
    CHECK(ids && out, "embedding: NULL pointer");
    DISPATCH(TDM_OP_EMBEDDING, be->vt->embedding(be, w, ids, m, out, err));
}

tdm_status tdm_be_rmsnorm_fwd(tdm_backend *be, const void *x, const float *w, int64_t rows,
                              int64_t d, float eps, void *y, float *rstd, tdm_error *err)
{
    CHECK(dim_ok(rows) && d > 0 && dim_ok(d), "rmsnorm_fwd: bad shape");
    CHECK(eps >= 0, "rmsnorm_fwd: negative eps");
    if (rows == 0) return TDM_OK;
    CHECK(x && w && y, "rmsnorm_fwd: NULL pointer");
    DISPATCH(TDM_OP_RMSNORM_FWD, be->vt->rmsnorm_fwd(be, x, w, rows, d, eps, y, rstd, err));
}

tdm_status tdm_be_rmsnorm_bwd(tdm_backend *be, const void *dy, const void *x, const float *w,
                              const float *rstd, int64_t rows, int64_t d, void *dx, float beta,
                              tdm_error *err)
{
    CHECK(dim_ok(rows) && d > 0 && dim_ok(d), "rmsnorm_bwd: bad shape");
    if (rows == 0) return TDM_OK;
    CHECK(dy && x && w && rstd && dx, "rmsnorm_bwd: NULL pointer");
    CHECK(beta == 0 || dx != dy, "rmsnorm_bwd: dx aliases dy with beta != 0");
    DISPATCH(TDM_OP_RMSNORM_BWD, be->vt->rmsnorm_bwd(be, dy, x, w, rstd, rows, d, dx, beta, err));
}

tdm_status tdm_be_rope(tdm_backend *be, void *x, int64_t m, int64_t n_heads, int64_t head_dim,
                       int64_t ld, const int32_t *pos, const float *inv_freq, bool inverse,
                       tdm_error *err)
{
    CHECK(dim_ok(m) && n_heads > 0 && head_dim > 0 && head_dim % 2 == 0,
          "rope: bad shape (head_dim %lld must be even)", (long long)head_dim);
    CHECK(ld >= n_heads * head_dim, "rope: ld %lld < n_heads * head_dim", (long long)ld);
    if (m == 0) return TDM_OK;
    CHECK(x && pos && inv_freq, "rope: NULL pointer");
    DISPATCH(TDM_OP_ROPE,
             be->vt->rope(be, x, m, n_heads, head_dim, ld, pos, inv_freq, inverse, err));
}

static tdm_status check_attention(const tdm_be_seqs *s, int64_t n_heads, int64_t n_kv_heads,
                                  int64_t head_dim, const char *op, tdm_error *err)
{
    CHECK(s && s->cu_seqlens, "%s: no sequences", op);
    CHECK(s->n_seqs >= 0 && dim_ok(s->m) && s->max_seqlen >= 0, "%s: bad sequence table", op);
    CHECK(n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0,
          "%s: n_heads %lld not a multiple of n_kv_heads %lld", op, (long long)n_heads,
          (long long)n_kv_heads);
    CHECK(head_dim > 0, "%s: bad head_dim", op);
    return TDM_OK;
}

tdm_status tdm_be_attention_fwd(tdm_backend *be, const tdm_be_seqs *s, const void *q, const void *k,
                                const void *v, int64_t n_heads, int64_t n_kv_heads,
                                int64_t head_dim, float scale, void *out, float *lse,
                                tdm_error *err)
{
    TDM_TRY(check_attention(s, n_heads, n_kv_heads, head_dim, "attention_fwd", err));
    if (s->m == 0) return TDM_OK;
    CHECK(q && k && v && out && lse, "attention_fwd: NULL pointer");
    DISPATCH(TDM_OP_ATTENTION_FWD, be->vt->attention_fwd(be, s, q, k, v, n_heads, n_kv_heads,
                                                         head_dim, scale, out, lse, err));
}

tdm_status tdm_be_attention_bwd(tdm_backend *be, const tdm_be_seqs *s, const void *q, const void *k,
                                const void *v, const void *out, const float *lse, const void *dout,
                                int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale,
                                void *dq, void *dk, void *dv, tdm_error *err)
{
    TDM_TRY(check_attention(s, n_heads, n_kv_heads, head_dim, "attention_bwd", err));
    if (s->m == 0) return TDM_OK;
    CHECK(q && k && v && out && lse && dout && dq && dk && dv, "attention_bwd: NULL pointer");
    DISPATCH(TDM_OP_ATTENTION_BWD,
             be->vt->attention_bwd(be, s, q, k, v, out, lse, dout, n_heads, n_kv_heads, head_dim,
                                   scale, dq, dk, dv, err));
}

bool tdm_be_has_quantize_nf4(const tdm_backend *be)
{
    return be->vt->quantize_nf4 != NULL;
}

tdm_status tdm_be_quantize_nf4(tdm_backend *be, const void *src, tdm_be_src_dtype src_dtype,
                               int64_t n, uint8_t *codes, float *absmax, tdm_error *err)
{
    if (!be->vt->quantize_nf4)
        return tdm_fail(err, TDM_ERR_UNSUPPORTED, "backend %s: no NF4 quantization", be->name);
    CHECK(n > 0 && src && codes && absmax, "quantize_nf4: bad arguments");
    CHECK(src_dtype == TDM_BE_SRC_F32 || src_dtype == TDM_BE_SRC_BF16 ||
              src_dtype == TDM_BE_SRC_F16,
          "quantize_nf4: unknown source type %d", (int)src_dtype);
    return be->vt->quantize_nf4(be, src, src_dtype, n, codes, absmax, err);
}

bool tdm_be_has_attention_kv(const tdm_backend *be)
{
    return be->vt->attention_kv != NULL;
}

tdm_status tdm_be_attention_kv(tdm_backend *be, const tdm_be_kv_seq *seqs, int64_t n_seqs,
                               int64_t m, const void *q, const void *k, const void *v,
                               void *k_cache, void *v_cache, int64_t n_slots, int64_t cap,
                               int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale,
                               void *out, tdm_error *err)
{
    CHECK(n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0,
          "attention_kv: n_heads %lld not a multiple of n_kv_heads %lld", (long long)n_heads,
          (long long)n_kv_heads);
    CHECK(head_dim > 0 && dim_ok(m) && n_seqs >= 0 && n_slots > 0 && cap > 0,
          "attention_kv: bad shape");
    if (n_seqs == 0 || m == 0) return TDM_OK;
    CHECK(seqs && q && k && v && k_cache && v_cache && out, "attention_kv: NULL pointer");
    for (int64_t i = 0; i < n_seqs; i++) {
        const tdm_be_kv_seq *s = &seqs[i];
        CHECK(s->row_begin >= 0 && s->n_new >= 0 && s->row_begin + s->n_new <= m,
              "attention_kv: sequence %lld rows outside [0, %lld)", (long long)i, (long long)m);
        CHECK(s->slot >= 0 && s->slot < n_slots, "attention_kv: sequence %lld slot %lld outside "
              "[0, %lld)", (long long)i, (long long)s->slot, (long long)n_slots);
        CHECK(s->start >= 0 && s->start + s->n_new <= cap,
              "attention_kv: sequence %lld needs %lld positions, the cache holds %lld",
              (long long)i, (long long)(s->start + s->n_new), (long long)cap);
    }
    if (!be->vt->attention_kv)
        return tdm_fail(err, TDM_ERR_UNSUPPORTED, "attention_kv: not implemented by the %s backend",
                        be->name);
    DISPATCH(TDM_OP_ATTENTION_KV,
             be->vt->attention_kv(be, seqs, n_seqs, m, q, k, v, k_cache, v_cache, n_slots, cap,
                                  n_heads, n_kv_heads, head_dim, scale, out, err));
}

tdm_status tdm_be_swiglu_fwd(tdm_backend *be, const void *g, const void *u, int64_t m, int64_t n,
                             void *h, tdm_error *err)
{
    CHECK(dim_ok(m) && dim_ok(n), "swiglu_fwd: bad shape");
    if (m == 0 || n == 0) return TDM_OK;
    CHECK(g && u && h, "swiglu_fwd: NULL pointer");
    DISPATCH(TDM_OP_SWIGLU_FWD, be->vt->swiglu_fwd(be, g, u, m, n, h, err));
}

tdm_status tdm_be_swiglu_bwd(tdm_backend *be, const void *g, const void *u, const void *dh,
                             int64_t m, int64_t n, void *dg, void *du, tdm_error *err)
{
    CHECK(dim_ok(m) && dim_ok(n), "swiglu_bwd: bad shape");
    if (m == 0 || n == 0) return TDM_OK;
    CHECK(g && u && dh && dg && du, "swiglu_bwd: NULL pointer");
    CHECK(dg != du, "swiglu_bwd: dg and du alias");
    DISPATCH(TDM_OP_SWIGLU_BWD, be->vt->swiglu_bwd(be, g, u, dh, m, n, dg, du, err));
}

tdm_status tdm_be_cross_entropy(tdm_backend *be, const void *h, const tdm_be_weight *w,
                                const int32_t *labels, const float *weight, int64_t m,
                                int64_t chunk_rows, float *loss, void *dh, tdm_error *err)
{
    TDM_TRY(check_weight(w, "cross_entropy", err));
    CHECK(w->format == TDM_BE_W_F32 || w->format == TDM_BE_W_BF16 ||
              w->format == TDM_BE_W_F32_PANELS,
          "cross_entropy: lm_head must be dense");
    CHECK(dim_ok(m) && chunk_rows > 0, "cross_entropy: bad shape or chunk size");
    if (m == 0) return TDM_OK;
    CHECK(h && labels && weight && loss, "cross_entropy: NULL pointer");
    DISPATCH(TDM_OP_CROSS_ENTROPY,
             be->vt->cross_entropy(be, h, w, labels, weight, m, chunk_rows, loss, dh, err));
}

static tdm_status check_segs(const tdm_lora_seg *segs, int64_t n_segs, int64_t m, int64_t in,
                             int64_t u_ld, bool bwd, const char *op, tdm_error *err)
{
    CHECK(n_segs >= 0 && (n_segs == 0 || segs), "%s: bad segment table", op);
    int64_t prev_end = 0;
    for (int64_t i = 0; i < n_segs; i++) {
        const tdm_lora_seg *s = &segs[i];
        CHECK(0 <= s->row_begin && s->row_begin <= s->row_end && s->row_end <= m,
              "%s: segment %lld rows [%lld, %lld) outside [0, %lld)", op, (long long)i,
              (long long)s->row_begin, (long long)s->row_end, (long long)m);
        CHECK(s->row_begin >= prev_end, "%s: segment %lld overlaps or is out of order", op,
              (long long)i);
        prev_end = s->row_end;
        if (!s->a) continue;
        CHECK(s->b, "%s: segment %lld has A but no B", op, (long long)i);
        CHECK(s->rank >= 1 && s->rank <= u_ld, "%s: segment %lld rank %lld not in [1, u_ld %lld]",
              op, (long long)i, (long long)s->rank, (long long)u_ld);
        if (bwd)
            CHECK(s->da && s->db, "%s: segment %lld has no gradient buffers", op, (long long)i);
        CHECK(s->dropout >= 0.0f && s->dropout < 1.0f, "%s: segment %lld dropout %g not in [0, 1)",
              op, (long long)i, (double)s->dropout);
        /* the mask counter (engine/dropout.h) packs row and column into 32 bits each */
        CHECK(s->dropout == 0.0f || (s->row_end - s->row_begin <= UINT32_MAX && in <= UINT32_MAX),
              "%s: segment %lld too large for the dropout mask", op, (long long)i);
    }
    return TDM_OK;
}

tdm_status tdm_be_lora_fwd(tdm_backend *be, const tdm_lora_seg *segs, int64_t n_segs, const void *x,
                           int64_t m, int64_t in, int64_t out, float *u, int64_t u_ld, void *y,
                           tdm_error *err)
{
    CHECK(dim_ok(m) && in > 0 && out > 0 && dim_ok(in) && dim_ok(out), "lora_fwd: bad shape");
    TDM_TRY(check_segs(segs, n_segs, m, in, u_ld, false, "lora_fwd", err));
    if (m == 0 || n_segs == 0) return TDM_OK;
    CHECK(x && u && y, "lora_fwd: NULL pointer");
    DISPATCH(TDM_OP_LORA_FWD, be->vt->lora_fwd(be, segs, n_segs, x, m, in, out, u, u_ld, y, err));
}

tdm_status tdm_be_lora_bwd(tdm_backend *be, const tdm_lora_seg *segs, int64_t n_segs, const void *x,
                           const float *u, int64_t u_ld, const void *dy, int64_t m, int64_t in,
                           int64_t out, void *dx, tdm_error *err)
{
    CHECK(dim_ok(m) && in > 0 && out > 0 && dim_ok(in) && dim_ok(out), "lora_bwd: bad shape");
    TDM_TRY(check_segs(segs, n_segs, m, in, u_ld, true, "lora_bwd", err));
    if (m == 0 || n_segs == 0) return TDM_OK;
    CHECK(x && u && dy, "lora_bwd: NULL pointer");
    DISPATCH(TDM_OP_LORA_BWD,
             be->vt->lora_bwd(be, segs, n_segs, x, u, u_ld, dy, m, in, out, dx, err));
}

tdm_status tdm_be_sumsq(tdm_backend *be, const tdm_be_vec *vecs, int64_t n_vecs, int n_groups,
                        float *out, tdm_error *err)
{
    CHECK(n_groups >= 0 && n_vecs >= 0 && (n_vecs == 0 || vecs), "sumsq: bad arguments");
    if (n_groups == 0) return TDM_OK;
    CHECK(out, "sumsq: NULL output");
    for (int64_t i = 0; i < n_vecs; i++) {
        CHECK(vecs[i].group >= 0 && vecs[i].group < n_groups,
              "sumsq: vector %lld group %d outside [0, %d)", (long long)i, vecs[i].group, n_groups);
        CHECK(dim_ok(vecs[i].n) && (vecs[i].n == 0 || vecs[i].x), "sumsq: vector %lld bad",
              (long long)i);
    }
    DISPATCH(TDM_OP_SUMSQ, be->vt->sumsq(be, vecs, n_vecs, n_groups, out, err));
}

tdm_status tdm_be_clip_coef(tdm_backend *be, const float *sumsq, const float *max_norm,
                            int n_groups, float *coef, float *norm, tdm_error *err)
{
    CHECK(n_groups >= 0, "clip_coef: bad group count");
    if (n_groups == 0) return TDM_OK;
    CHECK(sumsq && max_norm && coef, "clip_coef: NULL pointer");
    DISPATCH(TDM_OP_CLIP_COEF, be->vt->clip_coef(be, sumsq, max_norm, n_groups, coef, norm, err));
}

tdm_status tdm_be_adamw(tdm_backend *be, const tdm_adamw_tensor *tensors, int64_t n_tensors,
                        tdm_error *err)
{
    CHECK(n_tensors >= 0 && (n_tensors == 0 || tensors), "adamw: bad tensor list");
    for (int64_t i = 0; i < n_tensors; i++) {
        const tdm_adamw_tensor *t = &tensors[i];
        CHECK(dim_ok(t->n), "adamw: tensor %lld bad size", (long long)i);
        CHECK(t->n == 0 || (t->p && t->g && t->m && t->v), "adamw: tensor %lld NULL pointer",
              (long long)i);
        CHECK(t->step >= 1, "adamw: tensor %lld step %lld < 1", (long long)i, (long long)t->step);
        CHECK(t->beta1 >= 0 && t->beta1 < 1 && t->beta2 >= 0 && t->beta2 < 1,
              "adamw: tensor %lld betas outside [0, 1)", (long long)i);
    }
    if (n_tensors == 0) return TDM_OK;
    DISPATCH(TDM_OP_ADAMW, be->vt->adamw(be, tensors, n_tensors, err));
}
