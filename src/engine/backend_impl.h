/* backend_impl.h — what a backend implementation provides: the function table behind backend.h.
 *
 * Only backend implementations (engine/cpu/, later engine/cuda/) include this. backend.c checks
 * every argument that can be checked without touching device memory (shapes, dtypes, NULLs,
 * leading dimensions, segment tables) and then calls the table; so an implementation may assume
 * valid arguments and only reports its own failures (allocation, library calls, device errors,
 * out-of-range ids it happens to see).
 */
#ifndef TANDEM_ENGINE_BACKEND_IMPL_H
#define TANDEM_ENGINE_BACKEND_IMPL_H
#include "engine/backend.h"

typedef struct tdm_backend_vtable {
    void (*destroy)(tdm_backend *be);
    tdm_status (*alloc)(tdm_backend *be, size_t bytes, void **out, tdm_error *err);
    void (*free)(tdm_backend *be, void *ptr);
    tdm_status (*upload)(tdm_backend *be, void *dst, const void *src, size_t bytes, tdm_error *err);
    tdm_status (*download)(tdm_backend *be, void *dst, const void *src, size_t bytes,
                           tdm_error *err);
    tdm_status (*upload_f32)(tdm_backend *be, void *dst, tdm_be_dtype dtype, const float *src,
                             int64_t n, tdm_error *err);
    tdm_status (*download_f32)(tdm_backend *be, float *dst, const void *src, tdm_be_dtype dtype,
                               int64_t n, tdm_error *err);
    tdm_status (*copy)(tdm_backend *be, void *dst, const void *src, size_t bytes, tdm_error *err);
    tdm_status (*memory)(tdm_backend *be, tdm_be_mem_info *info, tdm_error *err);
    void (*reset_peak)(tdm_backend *be);
    tdm_status (*synchronize)(tdm_backend *be, tdm_error *err);

    tdm_status (*fill)(tdm_backend *be, void *x, tdm_be_dtype dtype, int64_t n, float value,
                       tdm_error *err);
    tdm_status (*axpy)(tdm_backend *be, void *y, const void *x, tdm_be_dtype dtype, int64_t n,
                       float alpha, tdm_error *err);
    tdm_status (*scale)(tdm_backend *be, void *x, tdm_be_dtype dtype, int64_t n, float alpha,
                        tdm_error *err);
    tdm_status (*add_bias)(tdm_backend *be, void *y, const float *bias, int64_t rows, int64_t cols,
                           tdm_error *err);
    tdm_status (*gemm)(tdm_backend *be, const tdm_gemm_args *g, tdm_error *err);
    tdm_status (*weight_rows)(tdm_backend *be, const tdm_be_weight *w, int64_t row_begin,
                              int64_t row_end, void *out, tdm_be_dtype out_dtype, tdm_error *err);
    tdm_status (*linear_fwd)(tdm_backend *be, const tdm_be_weight *w, const void *x, int64_t m,
                             void *y, float beta, tdm_error *err);
    tdm_status (*linear_bwd)(tdm_backend *be, const tdm_be_weight *w, const void *dy, int64_t m,
                             void *dx, float beta, tdm_error *err);
    tdm_status (*embedding)(tdm_backend *be, const tdm_be_weight *w, const int32_t *ids, int64_t m,
                            void *out, tdm_error *err);
    tdm_status (*rmsnorm_fwd)(tdm_backend *be, const void *x, const float *w, int64_t rows,
                              int64_t d, float eps, void *y, float *rstd, tdm_error *err);
    tdm_status (*rmsnorm_bwd)(tdm_backend *be, const void *dy, const void *x, const float *w,
                              const float *rstd, int64_t rows, int64_t d, void *dx, float beta,
                              tdm_error *err);
    tdm_status (*rope)(tdm_backend *be, void *x, int64_t m, int64_t n_heads, int64_t head_dim,
                       int64_t ld, const int32_t *pos, const float *inv_freq, bool inverse,
                       tdm_error *err);
    tdm_status (*attention_fwd)(tdm_backend *be, const tdm_be_seqs *s, const void *q, const void *k,
                                const void *v, int64_t n_heads, int64_t n_kv_heads,
                                int64_t head_dim, float scale, void *out, float *lse,
                                tdm_error *err);
    tdm_status (*attention_bwd)(tdm_backend *be, const tdm_be_seqs *s, const void *q, const void *k,
                                const void *v, const void *out, const float *lse, const void *dout,
                                int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale,
                                void *dq, void *dk, void *dv, tdm_error *err);
    tdm_status (*swiglu_fwd)(tdm_backend *be, const void *g, const void *u, int64_t m, int64_t n,
                             void *h, tdm_error *err);
    tdm_status (*swiglu_bwd)(tdm_backend *be, const void *g, const void *u, const void *dh,
                             int64_t m, int64_t n, void *dg, void *du, tdm_error *err);
    tdm_status (*cross_entropy)(tdm_backend *be, const void *h, const tdm_be_weight *w,
                                const int32_t *labels, const float *weight, int64_t m,
                                int64_t chunk_rows, float *loss, void *dh, tdm_error *err);
    tdm_status (*lora_fwd)(tdm_backend *be, const tdm_lora_seg *segs, int64_t n_segs, const void *x,
                           int64_t m, int64_t in, int64_t out, float *u, int64_t u_ld, void *y,
                           tdm_error *err);
    tdm_status (*lora_bwd)(tdm_backend *be, const tdm_lora_seg *segs, int64_t n_segs, const void *x,
                           const float *u, int64_t u_ld, const void *dy, int64_t m, int64_t in,
                           int64_t out, void *dx, tdm_error *err);
    tdm_status (*sumsq)(tdm_backend *be, const tdm_be_vec *vecs, int64_t n_vecs, int n_groups,
                        float *out, tdm_error *err);
    tdm_status (*clip_coef)(tdm_backend *be, const float *sumsq, const float *max_norm,
                            int n_groups, float *coef, float *norm, tdm_error *err);
    tdm_status (*adamw)(tdm_backend *be, const tdm_adamw_tensor *tensors, int64_t n_tensors,
                        tdm_error *err);

    /* Optional device timing for op_profile.h (NULL: the backend is synchronous and host time is
     * its device time). prof_begin records a start mark on the stream and returns a slot (or -1
     * when it cannot); prof_end records the end mark of that slot for op `id`; prof_collect waits
     * for the marks recorded so far and adds their times to be->prof (it may also be called by
     * the backend itself when its slots run out); prof_reset drops pending marks. */
    int (*prof_begin)(tdm_backend *be);
    void (*prof_end)(tdm_backend *be, int slot, int id);
    void (*prof_collect)(tdm_backend *be);
    void (*prof_reset)(tdm_backend *be);

    /* Optional (NULL: the backend keeps no scratch of its own): grows the backend's scratch now
     * to what steps of that shape will ask for (tdm_be_reserve_scratch). */
    tdm_status (*reserve_scratch)(tdm_backend *be, const tdm_be_step_shape *shape,
                                  tdm_error *err);

    /* Optional (NULL: TDM_ERR_UNSUPPORTED): tdm_be_attention_kv. The optional entries come
     * last in the table so that positional initializers of older backends stay valid. */
    tdm_status (*attention_kv)(tdm_backend *be, const tdm_be_kv_seq *seqs, int64_t n_seqs,
                               int64_t m, const void *q, const void *k, const void *v,
                               void *k_cache, void *v_cache, int64_t n_slots, int64_t cap,
                               int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale,
                               void *out, tdm_error *err);

    /* Optional (NULL: quantized on the host): tdm_be_quantize_nf4. */
    tdm_status (*quantize_nf4)(tdm_backend *be, const void *src, tdm_be_src_dtype src_dtype,
                               int64_t n, uint8_t *codes, float *absmax, tdm_error *err);

    /* Optional, all four or none (NULL: TDM_ERR_UNSUPPORTED): tdm_be_host_alloc, host_free,
     * copy_behind, copies_join. */
    tdm_status (*host_alloc)(tdm_backend *be, size_t bytes, void **out, tdm_error *err);
    void (*host_free)(tdm_backend *be, void *ptr);
    tdm_status (*copy_behind)(tdm_backend *be, void *dst, const void *src, size_t bytes,
                              tdm_error *err);
    tdm_status (*copies_join)(tdm_backend *be, tdm_error *err);

    /* Optional (NULL: one linear_fwd per weight): tdm_be_linear_fwd_shared. */
    tdm_status (*linear_fwd_shared)(tdm_backend *be, const tdm_be_weight *const *ws, int n,
                                    const void *x, int64_t m, void *const *ys, tdm_error *err);

    /* Optional (NULL: nothing to do): tdm_be_lay_out_frozen. Last: CUDA's table is positional. */
    tdm_status (*lay_out_frozen)(tdm_backend *be, tdm_be_weight *w, tdm_be_frozen_use use,
                                 tdm_error *err);
} tdm_backend_vtable;

/* The common head of every backend object; implementations embed it first. */
struct tdm_backend {
    const tdm_backend_vtable *vt;
    const char *name;
    tdm_be_dtype act_dtype;
    struct tdm_op_profile *prof; /* per-op timing (op_profile.h), NULL unless enabled */
};

/* Constructors of the compiled-in backends (backend.c picks by name). */
tdm_status tdm_backend_cpu_create(tdm_backend **out, const tdm_backend_opts *opts, tdm_error *err);
/* engine/cuda/: TDM_ERR_NOT_FOUND when no usable CUDA device is present (no driver, no GPU,
 * ordinal out of range), so callers can fall back to the CPU backend. */
tdm_status tdm_backend_cuda_create(tdm_backend **out, const tdm_backend_opts *opts,
                                   tdm_error *err);

#endif
