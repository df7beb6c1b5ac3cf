/* backend.h — the compute interface the training engine runs on (CPU and CUDA backends).
 *
 * A backend owns device memory and executes ops in issue order on one stream. The engine (model
 * forward/backward, trainer) orchestrates: it allocates device buffers, uploads weights and the
 * step's batch once, then issues ops whose operands are DEVICE pointers, and downloads only the
 * few numbers it needs per step (per-row losses, gradient norms). No op reads device memory back
 * to the host, so a CUDA backend can run the whole step asynchronously (and capture it in a
 * graph where shapes repeat).
 *
 * Memory model
 *   - tdm_be_alloc returns a device address. Pointer arithmetic on it is allowed (a view of a
 *     sub-range is `(float *)p + offset`), exactly as with CUDA device pointers. On the CPU
 *     backend device == host, but engine code must still never dereference device pointers.
 *   - Every pointer argument named in the op contracts below is a device pointer, unless the
 *     contract says "host". Host arrays passed to an op (segment tables, AdamW tensor lists,
 *     per-group max norms) are read during the call only: the backend copies what it needs, so
 *     the caller may reuse them as soon as the call returns.
 *   - Ops run in issue order. Upload and download are synchronous with respect to the host
 *     (the host buffer may be reused / read when they return); copy/fill and all ops are
 *     asynchronous. tdm_be_synchronize waits for everything issued.
 *
 * Element types
 *   f32 everywhere for: LoRA weights A/B, their gradients, AdamW moments, norm weights, RMSNorm
 *   rstd, attention log-sum-exp, per-row loss and loss weights, inv_freq, gradient norms.
 *   "act" = tdm_be_act_dtype(be): activations and activation gradients (residual stream, q/k/v,
 *   MLP intermediates, dY/dX). The CPU backend uses F32; a CUDA backend may use BF16. Engine code
 *   allocates activations with the act dtype and never assumes its size.
 *   Frozen weights are described by tdm_be_weight: dense f32 / bf16, or NF4 (see model/nf4.h).
 *   Integers (token ids, labels, positions, cu_seqlens) are i32.
 *
 * Shapes are written (rows, cols), row-major, contiguous unless an ld ("leading dimension",
 * elements between consecutive rows) is given. M = number of token rows of the fused batch.
 *
 * Errors: every call returns a tdm_status and fills err with a message naming the op and the
 * reason ("gemm: lda 12 < k 16", later "cuBLASLt failed: ..."). Argument checks common to all
 * backends are done once in backend.c before dispatch. An asynchronous device failure may be
 * reported by a later call (at the latest by tdm_be_synchronize).
 *
 * Determinism: for fixed inputs and shapes, every op of every backend returns the same bits on
 * every run. The CPU backend also returns the same bits whatever the OpenMP thread count
 * (docs/engine.md says how).
 */
#ifndef TANDEM_ENGINE_BACKEND_H
#define TANDEM_ENGINE_BACKEND_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

typedef struct tdm_backend tdm_backend;

typedef enum tdm_be_dtype {
    TDM_BE_F32,
    TDM_BE_BF16,
    TDM_BE_U8, /* NF4 codes, 8-bit absmax */
    TDM_BE_I32,
} tdm_be_dtype;

/* Bytes per element. */
size_t tdm_be_dtype_size(tdm_be_dtype dtype);
const char *tdm_be_dtype_name(tdm_be_dtype dtype);

typedef struct tdm_backend_opts {
    int n_threads; /* CPU: OpenMP threads (0 = OpenMP default); results do not depend on it */
    int device;    /* CUDA: device ordinal */
    /* --base-compute fp8: the frozen NF4 projections' GEMMs in FP8 E4M3 with per-tensor scales
     * (docs/cuda-backend.md, "FP8 base compute"). CUDA on compute capability 8.9+ only: the
     * CPU backend and older GPUs fail to create with TDM_ERR_UNSUPPORTED. */
    bool base_fp8;
} tdm_backend_opts;

/* Creates the backend named "cpu" (always available) or "cuda" (when built with it).
 * TDM_ERR_NOT_FOUND for an unknown name, TDM_ERR_UNSUPPORTED when not compiled in. opts may be
 * NULL (defaults). */
tdm_status tdm_backend_create(tdm_backend **out, const char *name, const tdm_backend_opts *opts,
                              tdm_error *err);
/* Frees the backend and every buffer still allocated from it. NULL is fine. */
void tdm_backend_free(tdm_backend *be);

const char *tdm_be_name(const tdm_backend *be);

/* How the CPU backend runs its GEMMs (TANDEM_CPU_GEMM, OpenBLAS's build and kernel set), in words
 * for the thread note printed at start: "GEMMs: ...; OpenBLAS core ...". A static buffer. */
const char *tdm_cpu_gemm_mode(void);

/* The element type of activations and activation gradients on this backend. */
tdm_be_dtype tdm_be_act_dtype(const tdm_backend *be);

/* ---------------------------------------------------------------- memory ---- */

/* Allocates numel elements of dtype (zero-filled), 64-byte aligned; *out receives the device
 * address. numel 0 gives a valid unique pointer. */
tdm_status tdm_be_alloc(tdm_backend *be, tdm_be_dtype dtype, int64_t numel, void **out,
                        tdm_error *err);
/* Frees a pointer returned by tdm_be_alloc (not a view into it). NULL is fine. */
void tdm_be_free(tdm_backend *be, void *ptr);

/* Copies bytes host -> device (dst device, src host). Synchronous. */
tdm_status tdm_be_upload(tdm_backend *be, void *dst, const void *src, size_t bytes, tdm_error *err);
/* Copies bytes device -> host (waits for the ops issued before). */
tdm_status tdm_be_download(tdm_backend *be, void *dst, const void *src, size_t bytes,
                           tdm_error *err);
/* Uploads n host f32 values into a device array of dtype F32 or BF16 (converted, round to
 * nearest even). */
tdm_status tdm_be_upload_f32(tdm_backend *be, void *dst, tdm_be_dtype dtype, const float *src,
                             int64_t n, tdm_error *err);
/* Downloads n values of a device F32 or BF16 array into host f32. */
tdm_status tdm_be_download_f32(tdm_backend *be, float *dst, const void *src, tdm_be_dtype dtype,
                               int64_t n, tdm_error *err);
/* Device -> device copy of bytes (asynchronous; regions must not overlap). */
tdm_status tdm_be_copy(tdm_backend *be, void *dst, const void *src, size_t bytes, tdm_error *err);

typedef struct tdm_be_mem_info {
    uint64_t used_bytes;  /* currently allocated through this backend (buffers + workspace) */
    uint64_t peak_bytes;  /* highest used_bytes since creation or the last reset */
    uint64_t total_bytes; /* device capacity (CPU: physical RAM) */
    uint64_t free_bytes;  /* device free memory as the driver reports it (CPU: MemAvailable) */
} tdm_be_mem_info;
tdm_status tdm_be_memory(tdm_backend *be, tdm_be_mem_info *info, tdm_error *err);

/* The largest step a run will take, as the engine will ask a backend for it (sizes in
 * elements): what a backend with scratch of its own sizes it by (CUDA:
 * engine/cuda/cuda_memory_plan.h). */
typedef struct tdm_be_step_shape {
    int64_t m;        /* rows of the largest fused batch */
    int64_t max_seq;  /* rows of its longest sequence (0: unknown, taken as m) */
    int64_t hidden;   /* H */
    int64_t inter;    /* I */
    int64_t q_dim;    /* heads * head_dim */
    int64_t kv_dim;   /* kv_heads * head_dim */
    int64_t heads;    /* query heads */
    int64_t kv_heads; /* key/value heads */
    int64_t head_dim;
    int64_t vocab;       /* V */
    int64_t ce_chunk;    /* rows of logits per cross-entropy chunk */
    int64_t max_rank;    /* largest LoRA rank (0: no adapter) */
    bool nf4;            /* decoder projections quantized (dequantized tile by tile) */
    bool lm_head_bf16;   /* the lm_head in bf16 under f32 activations (the CPU's qlora, model.c) */
    bool base_fp8;       /* with nf4: their GEMMs in FP8 (tdm_backend_opts.base_fp8) */
    bool backward;       /* training (false: evaluation only) */
    int64_t lora_params; /* all adapters' parameters together (table sizes) */
    /* the largest, over the targeted modules, of sum over adapters of rank * (in + out): one
     * module's LoRA parameters of every adapter (the LoRA backward's partial sums) */
    int64_t lora_module_params;
} tdm_be_step_shape;

/* Grows the backend's own scratch (CUDA: the slots of engine/cuda/cuda_memory_plan.h) now to
 * what steps of that shape will ask for, so that a run holds its device memory from its start
 * rather than from the first step that needs it. A backend without scratch does nothing. */
tdm_status tdm_be_reserve_scratch(tdm_backend *be, const tdm_be_step_shape *shape, tdm_error *err);
void tdm_be_reset_peak(tdm_backend *be);

/* Waits until every issued op has completed; reports a pending asynchronous failure. */
tdm_status tdm_be_synchronize(tdm_backend *be, tdm_error *err);

/* ------------------------------------------ host memory and copies behind the ops ---- */
/* For activation offload (docs/engine.md, "Activation offload"). Host memory the device copies
 * to and from while it computes: page-locked on CUDA (cudaHostAlloc), plain on the CPU backend.
 * TDM_ERR_UNSUPPORTED on a backend without it. Not counted in tdm_be_memory. */
tdm_status tdm_be_host_alloc(tdm_backend *be, size_t bytes, void **out, tdm_error *err);
void tdm_be_host_free(tdm_backend *be, void *ptr);
/* Copies bytes between device memory and host memory of tdm_be_host_alloc (either way) on a
 * second queue: it starts after every op issued before it and runs beside the ops issued
 * after it, until tdm_be_copies_join. The CPU backend copies at once. Regions must not
 * overlap; neither side may be written by ops issued before the join. */
tdm_status tdm_be_copy_behind(tdm_backend *be, void *dst, const void *src, size_t bytes,
                              tdm_error *err);
/* The ops issued after this wait for every tdm_be_copy_behind issued before it (the host does
 * not wait). */
tdm_status tdm_be_copies_join(tdm_backend *be, tdm_error *err);

/* ------------------------------------------------------ small elementwise ---- */

/* x[0..n) = value, x of dtype F32 or BF16 (or I32, value converted; or U8). */
tdm_status tdm_be_fill(tdm_backend *be, void *x, tdm_be_dtype dtype, int64_t n, float value,
                       tdm_error *err);
/* y[i] = y[i] + alpha * x[i], n elements, both of dtype (F32 or BF16; BF16 computed in f32). */
tdm_status tdm_be_axpy(tdm_backend *be, void *y, const void *x, tdm_be_dtype dtype, int64_t n,
                       float alpha, tdm_error *err);
/* x[i] *= alpha. */
tdm_status tdm_be_scale(tdm_backend *be, void *x, tdm_be_dtype dtype, int64_t n, float alpha,
                        tdm_error *err);
/* y (rows, cols) act += bias (cols) f32 broadcast over rows. */
tdm_status tdm_be_add_bias(tdm_backend *be, void *y, const float *bias, int64_t rows, int64_t cols,
                           tdm_error *err);

/* ----------------------------------------------------------------- GEMM ---- */

/* C = alpha * op(A) op(B) + beta * C, row-major, for batch independent problems.
 * op(A) is (m, k): A is stored (m, k) with ld lda >= k, or when trans_a (k, m) with lda >= m.
 * op(B) is (k, n): B is stored (k, n) with ldb >= n, or when trans_b (n, k) with ldb >= k.
 * C is (m, n) with ldc >= n. stride_* are elements between consecutive problems of the batch
 * (ignored when batch == 1). A/B dtypes F32 or BF16, C F32 or BF16; products accumulate in f32.
 * beta == 0 means C is not read (may hold NaN). The CPU backend accepts BF16 operands
 * (converted to f32 first). */
typedef struct tdm_gemm_args {
    bool trans_a, trans_b;
    int64_t m, n, k;
    float alpha, beta;
    const void *a;
    tdm_be_dtype a_dtype;
    int64_t lda, stride_a;
    const void *b;
    tdm_be_dtype b_dtype;
    int64_t ldb, stride_b;
    void *c;
    tdm_be_dtype c_dtype;
    int64_t ldc, stride_c;
    int64_t batch; /* 0 counts as 1 */
} tdm_gemm_args;
tdm_status tdm_be_gemm(tdm_backend *be, const tdm_gemm_args *g, tdm_error *err);

/* ------------------------------------------------------- frozen weights ---- */

typedef enum tdm_be_wformat {
    TDM_BE_W_F32,    /* data: (rows, cols) f32 */
    TDM_BE_W_BF16,   /* data: (rows, cols) bf16 */
    TDM_BE_W_NF4,    /* codes + absmax (f32 per 64-block), model/nf4.h layout */
    TDM_BE_W_NF4_DQ, /* codes + absmax_q (u8 per block) + absmax2 (f32 per 256 blocks) + offset */
    /* data: f32 in panels of `panel` rows (rows a multiple of it): panel p holds W's rows
     * [p panel, p panel + panel) transposed, (cols, panel) row-major, so W[p panel + r][c] is at
     * data[(p cols + c) panel + r]. What tdm_be_lay_out_frozen makes of an F32 weight on a
     * backend whose GEMMs read W^T so (the CPU's own kernels); no other op takes it. */
    TDM_BE_W_F32_PANELS,
} tdm_be_wformat;

/* A frozen weight matrix W (rows = out_features, cols = in_features), as nn.Linear stores it.
 * NF4: the row-major flattened W in blocks of 64 (model/nf4.h): codes ((rows*cols+1)/2 bytes,
 * first element in the high nibble), dequantized w = nf4_code[q] * absmax[block], with
 * absmax[b] = dmap[absmax_q[b]] * absmax2[b / 256] + offset for NF4_DQ (dmap: the signed dynamic
 * 8-bit map, known to every backend). All pointers are device pointers. */
typedef struct tdm_be_weight {
    tdm_be_wformat format;
    int64_t rows, cols;
    const void *data;        /* dense formats */
    const uint8_t *codes;    /* NF4 */
    const float *absmax;     /* NF4: ceil(rows*cols/64) f32 */
    const uint8_t *absmax_q; /* NF4_DQ: ceil(rows*cols/64) u8 */
    const float *absmax2;    /* NF4_DQ: ceil(nblocks/256) f32 */
    float offset;            /* NF4_DQ */
    int32_t panel;           /* F32_PANELS: rows a panel */
} tdm_be_weight;

/* Element types of tdm_be_quantize_nf4's source: a safetensors tensor's bytes as stored. */
typedef enum tdm_be_src_dtype {
    TDM_BE_SRC_F32,
    TDM_BE_SRC_BF16,
    TDM_BE_SRC_F16,
} tdm_be_src_dtype;

/* Optional (a backend without it: false, and the model quantizes on the host): NF4-quantizes n
 * elements of src (device memory holding a tensor's bytes as stored) into codes ((n + 1) / 2
 * bytes, model/nf4.h layout) and absmax (ceil(n / 64) f32), bit for bit what tdm_nf4_quantize
 * computes on the host from the same values widened to f32. Double quantization of absmax
 * stays on the host (tdm_nf4_double_quantize: ceil(n / 64) values). Why: a 7B base's load is
 * what a co-training joiner waits for, and widening and quantizing 6.5e9 elements on the host
 * was most of it (src/engine/cuda/nf4_quantize.cuh). */
bool tdm_be_has_quantize_nf4(const tdm_backend *be);
tdm_status tdm_be_quantize_nf4(tdm_backend *be, const void *src, tdm_be_src_dtype src_dtype,
                               int64_t n, uint8_t *codes, float *absmax, tdm_error *err);

/* What a frozen weight laid out by tdm_be_lay_out_frozen is used for: a decoder projection
 * (linear_fwd / linear_bwd / linear_fwd_shared / weight_rows read it), or the lm_head (also
 * the embedding table when the two are tied: cross_entropy, linear_fwd for logits, embedding
 * and weight_rows read it). */
typedef enum tdm_be_frozen_use {
    TDM_BE_FROZEN_PROJECTION,
    TDM_BE_FROZEN_LM_HEAD,
} tdm_be_frozen_use;

/* Lays a frozen F32 weight out in place the way the backend's frozen GEMMs read it (the same
 * values in the same buffer; w->format and w->panel may change): the CPU backend's own kernels
 * take W^T in panels (TDM_BE_W_F32_PANELS), which they otherwise lay out again for every
 * forward product (the lm_head: for every logits tile of every chunk). A no-op where the
 * backend has no such layout, for other formats, and where the shape does not fit it. Only
 * for weights the ops named under `use` read. */
tdm_status tdm_be_lay_out_frozen(tdm_backend *be, tdm_be_weight *w, tdm_be_frozen_use use,
                                 tdm_error *err);

/* Dequantizes rows [row_begin, row_end) of an NF4 / NF4_DQ weight into out
 * ((row_end - row_begin), cols) of dtype F32 or BF16 (a tile for a GEMM). Dense weights are
 * converted/copied. */
tdm_status tdm_be_weight_rows(tdm_backend *be, const tdm_be_weight *w, int64_t row_begin,
                              int64_t row_end, void *out, tdm_be_dtype out_dtype, tdm_error *err);

/* Y (m, w.rows) act = X (m, w.cols) act · W^T  + beta * Y. The frozen-projection forward
 * (nn.Linear without bias). NF4 weights are dequantized tile by tile into backend workspace
 * (never a full-precision copy of W kept). */
tdm_status tdm_be_linear_fwd(tdm_backend *be, const tdm_be_weight *w, const void *x, int64_t m,
                             void *y, float beta, tdm_error *err);
/* The forward of n <= TDM_BE_SHARED_MAX projections of one input (q, k, v; gate, up): ys[i]
 * (m, ws[i].rows) = X (m, in) · ws[i]^T, every ws[i] with the same cols. The same results as n
 * tdm_be_linear_fwd calls with beta 0, for which it stands where a backend can prepare X once
 * (CUDA's --base-compute fp8 quantizes X once for all of them: fp8.cuh). */
#define TDM_BE_SHARED_MAX 4
tdm_status tdm_be_linear_fwd_shared(tdm_backend *be, const tdm_be_weight *const *ws, int n,
                                    const void *x, int64_t m, void *const *ys, tdm_error *err);
/* dX (m, w.cols) act = dY (m, w.rows) act · W + beta * dX. The frozen-projection backward
 * (no dW: the base is frozen). */
tdm_status tdm_be_linear_bwd(tdm_backend *be, const tdm_be_weight *w, const void *dy, int64_t m,
                             void *dx, float beta, tdm_error *err);

/* --------------------------------------------------------- model layers ---- */

/* Gathers rows of a frozen embedding table: out (m, w.cols) act = W[ids[i]] for i < m, W a dense
 * weight (rows = vocab). ids (m) i32; an id outside [0, rows) is an error (reported at the
 * latest by synchronize; the CPU backend reports it in the call). */
tdm_status tdm_be_embedding(tdm_backend *be, const tdm_be_weight *w, const int32_t *ids, int64_t m,
                            void *out, tdm_error *err);

/* RMSNorm over rows: y (rows, d) act = x * rstd * w, rstd (rows) f32 = 1/sqrt(mean(x^2) + eps),
 * computed in f32 (Hugging Face: x.float(), variance, rsqrt, then weight * x.to(dtype)).
 * w (d) f32. rstd may be NULL (no backward needed). y may equal x (in place). */
tdm_status tdm_be_rmsnorm_fwd(tdm_backend *be, const void *x, const float *w, int64_t rows,
                              int64_t d, float eps, void *y, float *rstd, tdm_error *err);
/* dX (rows, d) act = beta * dX + d/dx of RMSNorm given dY, x and rstd from the forward.
 * (No dw: norm weights are frozen.) dx may not alias dy unless beta == 0. */
tdm_status tdm_be_rmsnorm_bwd(tdm_backend *be, const void *dy, const void *x, const float *w,
                              const float *rstd, int64_t rows, int64_t d, void *dx, float beta,
                              tdm_error *err);

/* RoPE in place, Hugging Face rotate-half convention, over x (m, n_heads * head_dim) act with
 * row stride ld (elements, >= n_heads * head_dim). Row i uses position pos[i] (i32, device);
 * angle_j = f32(pos) * inv_freq[j] (f32 product), j < head_dim/2; for each head:
 *   x'[j] = x[j] cos - x[j + d/2] sin,  x'[j + d/2] = x[j + d/2] cos + x[j] sin.
 * inverse = true applies the transposed rotation (angle -> -angle): the backward of RoPE, used
 * on dq/dk in place. inv_freq (head_dim/2) f32, scaling already applied (engine/rope.h). */
tdm_status tdm_be_rope(tdm_backend *be, void *x, int64_t m, int64_t n_heads, int64_t head_dim,
                       int64_t ld, const int32_t *pos, const float *inv_freq, bool inverse,
                       tdm_error *err);

/* Packed sequences for attention: n_seqs sequences back to back over m rows; cu_seqlens
 * (n_seqs + 1) i32 device, cu_seqlens[0] = 0, non-decreasing, cu_seqlens[n_seqs] = m.
 * max_seqlen (host) >= the longest sequence (sizes kernel grids). */
typedef struct tdm_be_seqs {
    const int32_t *cu_seqlens;
    int64_t n_seqs;
    int64_t max_seqlen;
    int64_t m;
} tdm_be_seqs;

/* Causal grouped-query attention inside each packed sequence (never across a boundary).
 * q (m, n_heads*head_dim), k, v (m, n_kv_heads*head_dim), out (m, n_heads*head_dim): act;
 * query head h uses KV head h / (n_heads / n_kv_heads). scale is usually 1/sqrt(head_dim).
 * lse (n_heads, m) f32 receives each query's log-sum-exp of the scaled scores (natural log),
 * kept for the backward (probabilities are recomputed there, flash-attention style). */
tdm_status tdm_be_attention_fwd(tdm_backend *be, const tdm_be_seqs *s, const void *q, const void *k,
                                const void *v, int64_t n_heads, int64_t n_kv_heads,
                                int64_t head_dim, float scale, void *out, float *lse,
                                tdm_error *err);
/* Backward of the above: given dout and the forward's q, k, v, out and lse, OVERWRITES
 * dq (m, n_heads*head_dim), dk, dv (m, n_kv_heads*head_dim), act. */
tdm_status tdm_be_attention_bwd(tdm_backend *be, const tdm_be_seqs *s, const void *q, const void *k,
                                const void *v, const void *out, const float *lse, const void *dout,
                                int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale,
                                void *dq, void *dk, void *dv, tdm_error *err);

/* A KV cache of one layer as the decode path keeps it: n_slots slots of cap positions each,
 * k_cache and v_cache (n_slots * cap, n_kv_heads * head_dim) act, slot s owning rows
 * [s * cap, (s + 1) * cap); the key of position p of slot s (after RoPE) is row s * cap + p. */
typedef struct tdm_be_kv_seq {
    int64_t row_begin, n_new; /* the sequence's new rows [row_begin, row_begin + n_new) of q/k/v */
    int64_t slot;             /* its cache slot, in [0, n_slots) */
    int64_t start;            /* positions already cached (0..start); new row j has start + j */
} tdm_be_kv_seq;

/* Attention of new rows against the cache (generation's decode step; no backward, no lse).
 * For every sequence of seqs (host, n_seqs entries, disjoint row ranges; the backend copies it):
 * first writes the new keys and values k, v (m, n_kv_heads*head_dim) act into cache rows
 * slot * cap + start + j, then computes for each new row j the causal attention of its query
 * (q (m, n_heads*head_dim) act) over cached positions 0..start + j of its slot, into out
 * (m, n_heads*head_dim) act. Same GQA mapping and scale as tdm_be_attention_fwd; the CPU
 * backend computes each row exactly as its attention_fwd computes the same row. Rows outside
 * every sequence are not touched. start + n_new <= cap. */
tdm_status tdm_be_attention_kv(tdm_backend *be, const tdm_be_kv_seq *seqs, int64_t n_seqs,
                               int64_t m, const void *q, const void *k, const void *v,
                               void *k_cache, void *v_cache, int64_t n_slots, int64_t cap,
                               int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale,
                               void *out, tdm_error *err);
/* Whether the backend implements tdm_be_attention_kv (otherwise it is TDM_ERR_UNSUPPORTED). */
bool tdm_be_has_attention_kv(const tdm_backend *be);

/* SwiGLU: h (m, n) act = silu(g) * u, silu(g) = g / (1 + exp(-g)); g, u (m, n) act. */
tdm_status tdm_be_swiglu_fwd(tdm_backend *be, const void *g, const void *u, int64_t m, int64_t n,
                             void *h, tdm_error *err);
/* dg = dh * u * silu'(g), du = dh * silu(g) (both overwritten), all (m, n) act, with
 * silu'(g) = s (1 + g (1 - s)), s = sigmoid(g). dg and du must not alias each other; either
 * may alias dh (elementwise). */
tdm_status tdm_be_swiglu_bwd(tdm_backend *be, const void *g, const void *u, const void *dh,
                             int64_t m, int64_t n, void *dg, void *du, tdm_error *err);

/* Cross-entropy over lm_head without materializing the logits of all rows.
 * h (m, d) act: final hidden states (after the final norm); w: lm_head (rows = vocab, cols = d,
 * dense). labels (m) i32: the target of each row (already shifted: the token that follows), or
 * -100 (ignored). weight (m) f32: the factor of each row's loss in the total, normally 1/N_a for
 * the rows of adapter a (N_a = its counted tokens); ignored rows must have weight 0 or -100.
 * For chunks of chunk_rows rows: logits = h W^T (f32), per-row loss_i = logsumexp - logit[label]
 * (f32, written into loss (m) f32, 0 for ignored rows), and when dh is not NULL
 * dh_i = weight_i * (softmax_i - onehot(label_i)) W (act, OVERWRITTEN; 0 for ignored rows).
 * The trainer forms L_a = sum over a's rows of weight_i * loss_i after downloading loss once. */
tdm_status tdm_be_cross_entropy(tdm_backend *be, const void *h, const tdm_be_weight *w,
                                const int32_t *labels, const float *weight, int64_t m,
                                int64_t chunk_rows, float *loss, void *dh, tdm_error *err);

/* ------------------------------------------------------------- LoRA ---- */

/* One contiguous run of rows of the fused batch belonging to one adapter, with that adapter's
 * LoRA matrices for the module at hand (A NULL: the adapter does not target this module, the
 * rows get no LoRA term). All matrix pointers are device pointers; the table itself is host.
 *
 * LoRA dropout (PEFT's lora_dropout): with dropout p in (0, 1) the segment's LoRA branch reads
 * Xd = X * D instead of X, D[i][k] = keep(mask_seed, i - row_begin, k) / (1 - p) or 0, where keep
 * is the counter-based mask of engine/dropout.h (the row counted from the segment's start). The
 * mask is never stored: the forward and the backward regenerate it from (mask_seed, row, col),
 * so the backward must get the forward's mask_seed. p = 0 is the exact no-dropout code path. */
typedef struct tdm_lora_seg {
    int64_t row_begin, row_end; /* [row_begin, row_end) of the batch */
    int64_t rank;               /* r >= 1 (ignored when a is NULL) */
    float scale;                /* alpha / r, or alpha / sqrt(r) with rsLoRA */
    const float *a;             /* (r, in) f32 */
    const float *b;             /* (out, r) f32 */
    float *da;                  /* (r, in) f32, accumulated (+=) by the backward */
    float *db;                  /* (out, r) f32, accumulated (+=) by the backward */
    float dropout;              /* p in [0, 1): LoRA dropout of this segment's input (0: none) */
    uint64_t mask_seed;         /* the mask's seed (engine/dropout.h), used when dropout > 0 */
} tdm_lora_seg;

/* For every segment: U[rows] = Xd[rows] A^T (written into u, (m, u_ld) f32, the first r columns
 * of each row; u_ld >= the largest rank), and Y[rows] += scale * U B^T, with Xd = X, or X * D
 * with dropout (see tdm_lora_seg). x (m, in) act, y (m, out) act. Segments must not overlap;
 * rows outside every segment are not touched. One call covers all segments (one launch on a GPU).
 */
tdm_status tdm_be_lora_fwd(tdm_backend *be, const tdm_lora_seg *segs, int64_t n_segs, const void *x,
                           int64_t m, int64_t in, int64_t out, float *u, int64_t u_ld, void *y,
                           tdm_error *err);
/* For every segment with dY (m, out) act, X and U from the forward:
 *   dB += scale * dY^T U,  dU = scale * dY B,  dA += dU^T Xd,  dX += (dU A) * D
 * (without dropout Xd = X and D = 1; with it the forward's mask, regenerated from the same
 * segment table). dx (m, in) act is ACCUMULATED (it normally already holds dY W from
 * tdm_be_linear_bwd); dx may be NULL when the input gradient is not needed. */
tdm_status tdm_be_lora_bwd(tdm_backend *be, const tdm_lora_seg *segs, int64_t n_segs, const void *x,
                           const float *u, int64_t u_ld, const void *dy, int64_t m, int64_t in,
                           int64_t out, void *dx, tdm_error *err);

/* --------------------------------------------------------- optimizer ---- */

/* One f32 vector of a group, for gradient norms: group is the adapter index. */
typedef struct tdm_be_vec {
    const float *x;
    int64_t n;
    int group;
} tdm_be_vec;

/* out[g] (n_groups f32, device) = sum of x^2 over every vector of group g (overwritten; 0 for a
 * group without vectors). Accumulated in f32 per fixed-size block and combined in a fixed order
 * (docs/engine.md), so the result does not depend on threads. */
tdm_status tdm_be_sumsq(tdm_backend *be, const tdm_be_vec *vecs, int64_t n_vecs, int n_groups,
                        float *out, tdm_error *err);

/* Gradient-clipping coefficients as torch.nn.utils.clip_grad_norm_: for each group g,
 * coef[g] = min(1, max_norm[g] / (sqrt(sumsq[g]) + 1e-6)), or 1 when max_norm[g] <= 0.
 * sumsq, coef: n_groups f32 device; max_norm: n_groups f32 HOST. Optional norm (device,
 * n_groups f32, may be NULL) receives sqrt(sumsq). */
tdm_status tdm_be_clip_coef(tdm_backend *be, const float *sumsq, const float *max_norm,
                            int n_groups, float *coef, float *norm, tdm_error *err);

/* One parameter tensor of the multi-tensor AdamW, with its own hyper-parameters. */
typedef struct tdm_adamw_tensor {
    float *p;       /* (n) f32 parameter (updated) */
    const float *g; /* (n) f32 gradient */
    float *m, *v;   /* (n) f32 moments (updated; start at 0) */
    int64_t n;
    const float *grad_scale; /* device f32 scalar multiplying g first (clip coef), or NULL */
    /* double, as torch holds them (Python floats): the f32 constants of the update (1 - b1,
     * b2, 1 - b2, eps, -lr / bc1, ...) are derived from these exactly as torch derives them, so
     * the result is torch's bits (train/adamw.h); passing 0.9f instead of 0.9 changes them. */
    double lr, beta1, beta2, eps, weight_decay;
    int64_t step; /* t >= 1: this update's step number, for the bias corrections */
} tdm_adamw_tensor;

/* torch.optim.AdamW (single-tensor path) on every tensor of the list, in f32:
 *   g = g * grad_scale;  p *= 1 - lr*wd;  m = m + (1-b1)(g - m);  v = v*b2 + (1-b2) g g;
 *   p += -(lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 * (bias corrections in double, then applied as f32 scalars). The list is host memory. */
tdm_status tdm_be_adamw(tdm_backend *be, const tdm_adamw_tensor *tensors, int64_t n_tensors,
                        tdm_error *err);

#endif
