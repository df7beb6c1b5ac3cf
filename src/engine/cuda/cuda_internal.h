/* cuda_internal.h — the CUDA backend's object and the helpers its op files share (CUDA C++).
 *
 * One device, one stream (cuda_backend.stream); every op is enqueued on it and nothing waits for
 * the device except upload/download/synchronize. Activations are bf16, LoRA weights, gradients and
 * optimizer state f32. Errors: every CUDA runtime and cuBLASLt call goes through CU()/LT(), which
 * return a tdm_status naming the call, file:line and the driver's reason; an allocation failure
 * is TDM_ERR_NOMEM (the trainer checkpoints and stops), anything else TDM_ERR_DEVICE. Kernels that
 * detect bad data (token ids, labels out of range) set a device-side error word that
 * download/synchronize turn into TDM_ERR_INVALID.
 */
#ifndef TANDEM_ENGINE_CUDA_INTERNAL_H
#define TANDEM_ENGINE_CUDA_INTERNAL_H
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <unordered_map>

#include "engine/cuda/bf16x8.cuh" /* the bf16 type */
#include "engine/cuda/cuda_memory_plan.h"
#include "engine/cuda/grid.cuh"

extern "C" {
#include "engine/backend_impl.h"
#include "engine/op_profile.h"
}

/* Codes of the device-side error word (the first failure wins). */
enum cuda_dev_error {
    CUDA_DEVERR_NONE = 0,
    CUDA_DEVERR_TOKEN_ID = 1, /* embedding: id outside [0, vocab) */
    CUDA_DEVERR_LABEL = 2,    /* cross_entropy: label outside [0, vocab) and not -100 */
};

/* A device buffer the backend grows on demand and reuses between ops (stream order makes reuse
 * safe: an op enqueued later runs after the ops that read the previous contents). */
struct cuda_scratch {
    void *ptr;
    size_t bytes;
};

typedef struct cuda_backend {
    struct tdm_backend base;
    int device;
    cudaStream_t stream;
    /* tdm_be_copy_behind's queue and its two markers, created by the first copy: ops_done (on
     * stream) starts a copy after the ops before it, copies_done (on copy_stream) makes the
     * ops after tdm_be_copies_join wait for the copies */
    cudaStream_t copy_stream;
    cudaEvent_t ops_done, copies_done;
    cublasLtHandle_t lt;
    void *lt_ws; /* cuBLASLt workspace */
    size_t lt_ws_bytes;
    int *dev_error; /* device i32: enum cuda_dev_error */
    /* Scratch: [0] NF4 weight tiles, [1] f32 accumulators / logits, [2] bf16 dlogits / converted
     * operands, [3] the LoRA down kernels' per-K-slice partials (and dU), [4] op tables (sumsq / AdamW / clip), [5] sumsq partials,
     * [6] f32 staging of a bf16 GEMM output, [7] LoRA backward partial sums, [8] the e4m3
     * activation or gradient operand and [9] its scale words (--base-compute fp8, fp8.cuh). */
    cuda_scratch scratch[TDM_CUDA_SCRATCH_SLOTS];
    std::unordered_map<void *, size_t> *allocs; /* user buffers -> bytes */
    uint64_t used, peak;                         /* user buffers + scratch + workspace */
    int n_sms;
    bool base_fp8;         /* tdm_backend_opts.base_fp8: NF4 projections' GEMMs in FP8 */
    /* --base-compute fp8: each NF4 weight's amax (its largest block absmax), found at its first
     * FP8 use and kept, keyed by its codes pointer (the base is frozen); a freed buffer's
     * entries are erased (cuda_free_buf), so a new weight at that address is measured afresh */
    std::unordered_map<const void *, float> *fp8_w_amax;
    size_t max_smem_optin; /* bytes of dynamic shared memory a block may opt in to */
    struct cuda_plan_cache *plans; /* cuBLASLt descriptors + algorithm per GEMM shape (NULL: off) */
    int lt_tune; /* TANDEM_CUDA_GEMM_TUNE: candidates a new plan times (<= 1: the heuristic's first) */
    struct cuda_prof *prof;        /* event pairs of op_profile.h (NULL until profiling starts) */
} cuda_backend;

static inline cuda_backend *cuda_of(tdm_backend *be)
{
    return (cuda_backend *)be;
}

/* Reports a failed CUDA runtime call: "cuda: CALL failed at FILE:LINE: NAME: reason". Clears a
 * non-sticky error so later calls are not poisoned. Returns NOMEM for allocation failures. */
tdm_status cuda_fail(tdm_error *err, cudaError_t e, const char *call, const char *file, int line);
tdm_status lt_fail(tdm_error *err, cublasStatus_t s, const char *call, const char *file, int line);

#define CU(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) return cuda_fail(err, e_, #call, __FILE__, __LINE__);               \
    } while (0)
#define LT(call)                                                                                   \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) return lt_fail(err, s_, #call, __FILE__, __LINE__);       \
    } while (0)
/* After a kernel launch: launch-configuration errors are reported at once, naming the kernel. */
#define CU_LAUNCHED(name)                                                                          \
    do {                                                                                           \
        cudaError_t e_ = cudaGetLastError();                                                       \
        if (e_ != cudaSuccess) return cuda_fail(err, e_, "launch " name, __FILE__, __LINE__);      \
    } while (0)

/* Scratch buffer `slot` with at least `bytes` (grown with cudaFree + cudaMalloc, which waits for
 * the device, so growth never races a kernel still reading the old buffer). */
tdm_status cuda_scratch_get(cuda_backend *cb, int slot, size_t bytes, void **out, tdm_error *err);

/* Copies a small host table into scratch slot 4 + its offset region, in stream order (pageable
 * source: staged at once, the host copy may be reused when this returns). */
tdm_status cuda_table_upload(cuda_backend *cb, const void *host, size_t bytes, void **dev,
                             tdm_error *err);

/* C (m, n) = alpha op(A) op(B) + beta C on the backend stream through cuBLASLt, row-major, with
 * the tdm_gemm_args conventions (backend.h). f32 x f32 uses CUBLAS_COMPUTE_32F (no TF32); bf16 x
 * bf16 accumulates in f32. Mixed operand types convert the bf16 one to f32 first. */
tdm_status cuda_gemm_rm(cuda_backend *cb, const tdm_gemm_args *g, tdm_error *err);

/* Dequantizes / converts rows [r0, r1) of w into out ((r1-r0), cols) of dtype (F32 or BF16). */
tdm_status cuda_weight_rows(cuda_backend *cb, const tdm_be_weight *w, int64_t r0, int64_t r1,
                            void *out, tdm_be_dtype dtype, tdm_error *err);

/* A bf16 view of a dense weight (rows of w): w->data when BF16; else rows converted into
 * scratch slot `slot`. */
tdm_status cuda_dense_bf16(cuda_backend *cb, const tdm_be_weight *w, int slot, const bf16 **out,
                           tdm_error *err);


/* Per-op profiling (cuda_profile.cu): the vtable's prof_* entries, and a scope that times a part
 * of an op (an op_profile.h sub-op) when profiling is on and costs one branch when it is off. */
int cuda_prof_begin(tdm_backend *be);
void cuda_prof_end(tdm_backend *be, int slot, int id);
void cuda_prof_collect(tdm_backend *be);
void cuda_prof_reset(tdm_backend *be);
struct cuda_prof_scope {
    tdm_backend *be;
    tdm_op_id id;
    int token;
    int64_t t0;
    cuda_prof_scope(cuda_backend *cb, tdm_op_id op) : be(&cb->base), id(op), token(-1), t0(0)
    {
        if (be->prof) token = tdm_op_profile_begin(be, &t0);
    }
    ~cuda_prof_scope()
    {
        if (be->prof) tdm_op_profile_end(be, id, token, t0);
    }
};

/* cuBLASLt plan cache (cuda_backend.cu): frees every cached plan. */
void cuda_plan_cache_free(cuda_backend *cb);

/* Op entry points (cuda_layers.cu, cuda_train.cu). */
tdm_status cuda_embedding(tdm_backend *be, const tdm_be_weight *w, const int32_t *ids, int64_t m,
                          void *out, tdm_error *err);
tdm_status cuda_rmsnorm_fwd(tdm_backend *be, const void *x, const float *w, int64_t rows,
                            int64_t d, float eps, void *y, float *rstd, tdm_error *err);
tdm_status cuda_rmsnorm_bwd(tdm_backend *be, const void *dy, const void *x, const float *w,
                            const float *rstd, int64_t rows, int64_t d, void *dx, float beta,
                            tdm_error *err);
tdm_status cuda_rope(tdm_backend *be, void *x, int64_t m, int64_t n_heads, int64_t head_dim,
                     int64_t ld, const int32_t *pos, const float *inv_freq, bool inverse,
                     tdm_error *err);
tdm_status cuda_attention_fwd(tdm_backend *be, const tdm_be_seqs *s, const void *q, const void *k,
                              const void *v, int64_t n_heads, int64_t n_kv_heads,
                              int64_t head_dim, float scale, void *out, float *lse,
                              tdm_error *err);
tdm_status cuda_attention_bwd(tdm_backend *be, const tdm_be_seqs *s, const void *q, const void *k,
                              const void *v, const void *out, const float *lse, const void *dout,
                              int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale,
                              void *dq, void *dk, void *dv, tdm_error *err);
tdm_status cuda_attention_kv(tdm_backend *be, const tdm_be_kv_seq *seqs, int64_t n_seqs, int64_t m,
                             const void *q, const void *k, const void *v, void *k_cache,
                             void *v_cache, int64_t n_slots, int64_t cap, int64_t n_heads,
                             int64_t n_kv_heads, int64_t head_dim, float scale, void *out,
                             tdm_error *err);
tdm_status cuda_swiglu_fwd(tdm_backend *be, const void *g, const void *u, int64_t m, int64_t n,
                           void *h, tdm_error *err);
tdm_status cuda_swiglu_bwd(tdm_backend *be, const void *g, const void *u, const void *dh,
                           int64_t m, int64_t n, void *dg, void *du, tdm_error *err);
tdm_status cuda_cross_entropy(tdm_backend *be, const void *h, const tdm_be_weight *w,
                              const int32_t *labels, const float *weight, int64_t m,
                              int64_t chunk_rows, float *loss, void *dh, tdm_error *err);
tdm_status cuda_lora_fwd(tdm_backend *be, const tdm_lora_seg *segs, int64_t n_segs, const void *x,
                         int64_t m, int64_t in, int64_t out, float *u, int64_t u_ld, void *y,
                         tdm_error *err);
tdm_status cuda_lora_bwd(tdm_backend *be, const tdm_lora_seg *segs, int64_t n_segs, const void *x,
                         const float *u, int64_t u_ld, const void *dy, int64_t m, int64_t in,
                         int64_t out, void *dx, tdm_error *err);
tdm_status cuda_sumsq(tdm_backend *be, const tdm_be_vec *vecs, int64_t n_vecs, int n_groups,
                      float *out, tdm_error *err);
tdm_status cuda_clip_coef(tdm_backend *be, const float *sumsq, const float *max_norm, int n_groups,
                          float *coef, float *norm, tdm_error *err);
tdm_status cuda_adamw(tdm_backend *be, const tdm_adamw_tensor *tensors, int64_t n_tensors,
                      tdm_error *err);

#endif
