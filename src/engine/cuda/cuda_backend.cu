/* cuda_backend.cu — the CUDA backend: device selection, memory, errors, elementwise ops, GEMM
 * through cuBLASLt, NF4 dequantization and the frozen linear layers. Layer ops are in
 * cuda_layers.cu, loss / LoRA / optimizer in cuda_train.cu. docs/cuda-backend.md describes it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <iterator>
#include <new>

#include "engine/cuda/bf16x8.cuh"
#include "engine/cuda/cuda_internal.h"
#include "engine/cuda/cuda_memory_plan.h"
#include "engine/cuda/fp8.cuh"
#include "engine/cuda/nf4_dequant.cuh"
#include "engine/cuda/nf4_quantize.cuh"

extern "C" {
#include "model/nf4.h"
#include "util/half.h"
}

/* ------------------------------------------------------------------ errors ---- */

tdm_status cuda_fail(tdm_error *err, cudaError_t e, const char *call, const char *file, int line)
{
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    bool oom = e == cudaErrorMemoryAllocation;
    (void)cudaGetLastError(); /* clear a non-sticky error */
    return tdm_fail(err, oom ? TDM_ERR_NOMEM : TDM_ERR_DEVICE, "cuda: %s failed at %s:%d: %s: %s%s",
                    call, base, line, cudaGetErrorName(e), cudaGetErrorString(e),
                    oom ? " (GPU out of memory)" : "");
}

tdm_status lt_fail(tdm_error *err, cublasStatus_t s, const char *call, const char *file, int line)
{
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    bool oom = s == CUBLAS_STATUS_ALLOC_FAILED;
    return tdm_fail(err, oom ? TDM_ERR_NOMEM : TDM_ERR_DEVICE,
                    "cublasLt: %s failed at %s:%d: %s: %s", call, base, line,
                    cublasLtGetStatusName(s), cublasLtGetStatusString(s));
}

/* Turns the device error word into a status (after the stream has been synchronized). */
static tdm_status check_dev_error(cuda_backend *cb, tdm_error *err)
{
    int code = 0;
    CU(cudaMemcpyAsync(&code, cb->dev_error, sizeof code, cudaMemcpyDeviceToHost, cb->stream));
    CU(cudaStreamSynchronize(cb->stream));
    if (code == CUDA_DEVERR_NONE) return TDM_OK;
    CU(cudaMemsetAsync(cb->dev_error, 0, sizeof(int), cb->stream));
    CU(cudaStreamSynchronize(cb->stream));
    switch (code) {
    case CUDA_DEVERR_TOKEN_ID:
        return tdm_fail(err, TDM_ERR_INVALID,
                        "embedding: a token id outside [0, vocab) (found on the GPU)");
    case CUDA_DEVERR_LABEL:
        return tdm_fail(
            err, TDM_ERR_INVALID,
            "cross_entropy: a label outside [0, vocab) and not -100 (found on the GPU)");
    }
    return tdm_fail(err, TDM_ERR_DEVICE, "cuda: unknown device error code %d", code);
}

/* ------------------------------------------------------------------ memory ---- */

static void account(cuda_backend *cb, int64_t delta)
{
    cb->used = (uint64_t)((int64_t)cb->used + delta);
    if (cb->used > cb->peak) cb->peak = cb->used;
}

static tdm_status device_malloc(cuda_backend *cb, size_t bytes, void **out, tdm_error *err)
{
    cudaError_t e = cudaMalloc(out, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        (void)cudaGetLastError();
        (void)cudaMemGetInfo(&free_b, &total_b);
        *out = NULL;
        bool oom = e == cudaErrorMemoryAllocation;
        return tdm_fail(err, oom ? TDM_ERR_NOMEM : TDM_ERR_DEVICE,
                        "cuda: cudaMalloc(%zu bytes) failed at %s:%d: %s: %s (device %d: %zu MiB "
                        "free of %zu MiB; this backend holds %llu MiB)",
                        bytes, "cuda_backend.cu", __LINE__, cudaGetErrorName(e),
                        cudaGetErrorString(e), cb->device, free_b >> 20, total_b >> 20,
                        (unsigned long long)(cb->used >> 20));
    }
    return TDM_OK;
}

tdm_status cuda_scratch_get(cuda_backend *cb, int slot, size_t bytes, void **out, tdm_error *err)
{
    cuda_scratch *s = &cb->scratch[slot];
    if (s->bytes < bytes) {
        if (s->ptr) {
            CU(cudaFree(s->ptr)); /* implicit device synchronization: no reader left */
            account(cb, -(int64_t)s->bytes);
            s->ptr = NULL;
            s->bytes = 0;
        }
        size_t want = bytes + bytes / TDM_CUDA_SCRATCH_HEADROOM_DIV; /* headroom against regrowth */
        TDM_TRY(device_malloc(cb, want, &s->ptr, err));
        s->bytes = want;
        account(cb, (int64_t)want);
    }
    *out = s->ptr;
    return TDM_OK;
}

/* The largest request of every slot for that shape, now (cuda_memory_plan.c computes them with
 * the rules the ops allocate by, so later requests of a run within that shape find the slot big
 * enough and allocate nothing). */
static tdm_status cuda_reserve_scratch(tdm_backend *be, const tdm_be_step_shape *shape,
                                       tdm_error *err)
{
    cuda_backend *cb = cuda_of(be);
    uint64_t request[TDM_CUDA_SCRATCH_SLOTS];
    tdm_cuda_scratch_requests(shape, request);
    for (int i = 0; i < TDM_CUDA_SCRATCH_SLOTS; i++) {
        void *p;
        if (request[i]) TDM_TRY(cuda_scratch_get(cb, i, (size_t)request[i], &p, err));
    }
    return TDM_OK;
}

tdm_status cuda_table_upload(cuda_backend *cb, const void *host, size_t bytes, void **dev,
                             tdm_error *err)
{
    TDM_TRY(cuda_scratch_get(cb, 4, bytes, dev, err));
    CU(cudaMemcpyAsync(*dev, host, bytes, cudaMemcpyHostToDevice, cb->stream));
    return TDM_OK;
}

static tdm_status cuda_alloc(tdm_backend *be, size_t bytes, void **out, tdm_error *err)
{
    cuda_backend *cb = cuda_of(be);
    TDM_TRY(device_malloc(cb, bytes, out, err));
    cudaError_t e = cudaMemsetAsync(*out, 0, bytes ? bytes : 1, cb->stream);
    if (e != cudaSuccess) {
        cudaFree(*out);
        *out = NULL;
        return cuda_fail(err, e, "cudaMemsetAsync(new buffer)", __FILE__, __LINE__);
    }
    (*cb->allocs)[*out] = bytes;
    account(cb, (int64_t)bytes);
    return TDM_OK;
}

static void cuda_free_buf(tdm_backend *be, void *ptr)
{
    cuda_backend *cb = cuda_of(be);
    auto it = cb->allocs->find(ptr);
    if (it == cb->allocs->end()) return; /* not ours: ignore rather than corrupt the heap */
    account(cb, -(int64_t)it->second);
    if (cb->fp8_w_amax) { /* a weight that lived in it: a new one there is measured afresh */
        const char *lo = (const char *)ptr, *hi = lo + it->second;
        for (auto e = cb->fp8_w_amax->begin(); e != cb->fp8_w_amax->end();) {
            const char *k = (const char *)e->first;
            e = k >= lo && k < hi ? cb->fp8_w_amax->erase(e) : std::next(e);
        }
    }
    cb->allocs->erase(it);
    cudaFree(ptr); /* an error here would be a pending asynchronous one: synchronize reports it */
}

static void cuda_destroy(tdm_backend *be)
{
    cuda_backend *cb = cuda_of(be);
    cudaStreamSynchronize(cb->stream);
    if (cb->copy_stream) {
        cudaStreamSynchronize(cb->copy_stream);
        cudaStreamDestroy(cb->copy_stream);
        cudaEventDestroy(cb->ops_done);
        cudaEventDestroy(cb->copies_done);
    }
    delete cb->fp8_w_amax;
    cuda_plan_cache_free(cb);
    for (auto &kv : *cb->allocs)
        cudaFree(kv.first);
    delete cb->allocs;
    for (auto &s : cb->scratch)
        if (s.ptr) cudaFree(s.ptr);
    if (cb->lt_ws) cudaFree(cb->lt_ws);
    if (cb->dev_error) cudaFree(cb->dev_error);
    if (cb->lt) cublasLtDestroy(cb->lt);
    if (cb->stream) cudaStreamDestroy(cb->stream);
    free(cb);
}

static tdm_status cuda_upload(tdm_backend *be, void *dst, const void *src, size_t bytes,
                              tdm_error *err)
{
    cuda_backend *cb = cuda_of(be);
    CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cb->stream));
    CU(cudaStreamSynchronize(cb->stream));
    return TDM_OK;
}

static tdm_status cuda_download(tdm_backend *be, void *dst, const void *src, size_t bytes,
                                tdm_error *err)
{
    cuda_backend *cb = cuda_of(be);
    CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cb->stream));
    CU(cudaStreamSynchronize(cb->stream));
    return check_dev_error(cb, err);
}

static tdm_status cuda_copy(tdm_backend *be, void *dst, const void *src, size_t bytes,
                            tdm_error *err)
{
    cuda_backend *cb = cuda_of(be);
    CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cb->stream));
    return TDM_OK;
}

static tdm_status cuda_upload_f32(tdm_backend *be, void *dst, tdm_be_dtype dtype, const float *src,
                                  int64_t n, tdm_error *err)
{
    if (dtype == TDM_BE_F32) return cuda_upload(be, dst, src, (size_t)n * sizeof(float), err);
    uint16_t *tmp = (uint16_t *)malloc((size_t)n * sizeof(uint16_t));
    if (!tmp) return tdm_fail(err, TDM_ERR_NOMEM, "upload_f32: out of host memory");
    tdm_f32_to_bf16_n(src, tmp, (size_t)n);
    tdm_status st = cuda_upload(be, dst, tmp, (size_t)n * sizeof(uint16_t), err);
    free(tmp);
    return st;
}

static tdm_status cuda_download_f32(tdm_backend *be, float *dst, const void *src,
                                    tdm_be_dtype dtype, int64_t n, tdm_error *err)
{
    if (dtype == TDM_BE_F32) return cuda_download(be, dst, src, (size_t)n * sizeof(float), err);
    uint16_t *tmp = (uint16_t *)malloc((size_t)n * sizeof(uint16_t));
    if (!tmp) return tdm_fail(err, TDM_ERR_NOMEM, "download_f32: out of host memory");
    tdm_status st = cuda_download(be, tmp, src, (size_t)n * sizeof(uint16_t), err);
    if (st == TDM_OK) tdm_bf16_to_f32_n(tmp, dst, (size_t)n);
    free(tmp);
    return st;
}

static tdm_status cuda_quantize_nf4(tdm_backend *be, const void *src, tdm_be_src_dtype src_dtype,
                                    int64_t n, uint8_t *codes, float *absmax, tdm_error *err)
{
    cuda_backend *cb = cuda_of(be);
    int kind = src_dtype == TDM_BE_SRC_F32 ? NF4Q_F32 : src_dtype == TDM_BE_SRC_BF16 ? NF4Q_BF16
                                                                                      : NF4Q_F16;
    int64_t nblocks = (n + 63) / 64;
    const int threads = 128;
    nf4_quantize_kernel<<<(unsigned)((nblocks + threads - 1) / threads), threads, 0,
                          cb->stream>>>(src, kind, n, codes, absmax);
    CU_LAUNCHED("nf4_quantize_kernel");
    return TDM_OK;
}

static tdm_status cuda_memory(tdm_backend *be, tdm_be_mem_info *info, tdm_error *err)
{
    cuda_backend *cb = cuda_of(be);
    size_t free_b = 0, total_b = 0;
    CU(cudaMemGetInfo(&free_b, &total_b));
    info->used_bytes = cb->used;
    info->peak_bytes = cb->peak;
    info->total_bytes = total_b;
    info->free_bytes = free_b;
    return TDM_OK;
}

static void cuda_reset_peak(tdm_backend *be)
{
    cuda_backend *cb = cuda_of(be);
    cb->peak = cb->used;
}

static tdm_status cuda_synchronize(tdm_backend *be, tdm_error *err)
{
    cuda_backend *cb = cuda_of(be);
    CU(cudaStreamSynchronize(cb->stream));
    if (cb->copy_stream) CU(cudaStreamSynchronize(cb->copy_stream));
    return check_dev_error(cb, err);
}

/* ------------------------------------------------- offload: host memory, copies behind ---- */

static tdm_status cuda_host_alloc(tdm_backend *be, size_t bytes, void **out, tdm_error *err)
{
    (void)be;
    cudaError_t e = cudaHostAlloc(out, bytes, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        *out = NULL;
        (void)cudaGetLastError();
        return tdm_fail(err, TDM_ERR_NOMEM, "page-locked host memory for offload (%.1f MiB): %s",
                        (double)bytes / (1 << 20), cudaGetErrorString(e));
    }
    return TDM_OK;
}

static void cuda_host_free(tdm_backend *be, void *ptr)
{
    cuda_backend *cb = cuda_of(be);
    /* a copy may still read or write it: let the queues drain first */
    cudaStreamSynchronize(cb->stream);
    if (cb->copy_stream) cudaStreamSynchronize(cb->copy_stream);
    cudaFreeHost(ptr);
}

static tdm_status cuda_copy_behind(tdm_backend *be, void *dst, const void *src, size_t bytes,
                                   tdm_error *err)
{
    cuda_backend *cb = cuda_of(be);
    if (!cb->copy_stream) {
        CU(cudaStreamCreateWithFlags(&cb->copy_stream, cudaStreamNonBlocking));
        CU(cudaEventCreateWithFlags(&cb->ops_done, cudaEventDisableTiming));
        CU(cudaEventCreateWithFlags(&cb->copies_done, cudaEventDisableTiming));
    }
    CU(cudaEventRecord(cb->ops_done, cb->stream));
    CU(cudaStreamWaitEvent(cb->copy_stream, cb->ops_done, 0));
    CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cb->copy_stream));
    return TDM_OK;
}

static tdm_status cuda_copies_join(tdm_backend *be, tdm_error *err)
{
    cuda_backend *cb = cuda_of(be);
    if (!cb->copy_stream) return TDM_OK;
    CU(cudaEventRecord(cb->copies_done, cb->copy_stream));
    CU(cudaStreamWaitEvent(cb->stream, cb->copies_done, 0));
    return TDM_OK;
}

/* ------------------------------------------------------------- elementwise ---- */

template <typename T> __global__ void fill_kernel(T *x, int64_t n, T v)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] = v;
}

template <typename T> __global__ void axpy_kernel(T *y, const T *x, int64_t n, float alpha)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = (T)((float)y[i] + alpha * (float)x[i]);
}

template <typename T> __global__ void scale_kernel(T *x, int64_t n, float alpha)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] = (T)((float)x[i] * alpha);
}

/* bf16 y += alpha x, 8 elements per thread and access (n8 groups, 16-byte aligned) */
__global__ void axpy_bf16_v8_kernel(bf16 *y, const bf16 *x, int64_t n8, float alpha)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8;
         i += (int64_t)gridDim.x * blockDim.x) {
        float yv[8], xv[8];
        bf16x8_load(y + 8 * i, yv);
        bf16x8_load(x + 8 * i, xv);
#pragma unroll
        for (int k = 0; k < 8; k++)
            yv[k] = yv[k] + alpha * xv[k];
        bf16x8_store(y + 8 * i, yv);
    }
}

/* y (rows, cols) += bias per column, 8 at a time (cols % 8 == 0, so a group never wraps a row) */
__global__ void add_bias_v8_kernel(bf16 *y, const float *bias, int64_t n8, int64_t cols)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8;
         i += (int64_t)gridDim.x * blockDim.x) {
        float yv[8], bv[8];
        bf16x8_load(y + 8 * i, yv);
        f32x8_load(bias + (8 * i) % cols, bv);
#pragma unroll
        for (int k = 0; k < 8; k++)
            yv[k] = yv[k] + bv[k];
        bf16x8_store(y + 8 * i, yv);
    }
}

__global__ void add_bias_kernel(bf16 *y, const float *bias, int64_t rows, int64_t cols)
{
    int64_t n = rows * cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16_rn(__bfloat162float(y[i]) + bias[i % cols]);
}

#define EW_THREADS 256
#define EW_BLOCKS(n) cuda_blocks((n), EW_THREADS * 4)

static tdm_status cuda_fill(tdm_backend *be, void *x, tdm_be_dtype dtype, int64_t n, float value,
                            tdm_error *err)
{
    cudaStream_t st = cuda_of(be)->stream;
    switch (dtype) {
    case TDM_BE_F32:
        fill_kernel<float><<<EW_BLOCKS(n), EW_THREADS, 0, st>>>((float *)x, n, value);
        break;
    case TDM_BE_BF16:
        fill_kernel<bf16>
            <<<EW_BLOCKS(n), EW_THREADS, 0, st>>>((bf16 *)x, n, __float2bfloat16_rn(value));
        break;
    case TDM_BE_I32:
        fill_kernel<int32_t><<<EW_BLOCKS(n), EW_THREADS, 0, st>>>((int32_t *)x, n, (int32_t)value);
        break;
    case TDM_BE_U8:
        CU(cudaMemsetAsync(x, (int)(uint8_t)value, (size_t)n, st));
        return TDM_OK;
    }
    CU_LAUNCHED("fill_kernel");
    return TDM_OK;
}

static tdm_status cuda_axpy(tdm_backend *be, void *y, const void *x, tdm_be_dtype dtype, int64_t n,
                            float alpha, tdm_error *err)
{
    cudaStream_t st = cuda_of(be)->stream;
    if (dtype == TDM_BE_F32)
        axpy_kernel<float>
            <<<EW_BLOCKS(n), EW_THREADS, 0, st>>>((float *)y, (const float *)x, n, alpha);
    else if (bf16x8_ok(n, y, x))
        axpy_bf16_v8_kernel<<<cuda_blocks(n / 8, EW_THREADS), EW_THREADS, 0, st>>>(
            (bf16 *)y, (const bf16 *)x, n / 8, alpha);
    else
        axpy_kernel<bf16>
            <<<EW_BLOCKS(n), EW_THREADS, 0, st>>>((bf16 *)y, (const bf16 *)x, n, alpha);
    CU_LAUNCHED("axpy_kernel");
    return TDM_OK;
}

static tdm_status cuda_scale(tdm_backend *be, void *x, tdm_be_dtype dtype, int64_t n, float alpha,
                             tdm_error *err)
{
    cudaStream_t st = cuda_of(be)->stream;
    if (dtype == TDM_BE_F32)
        scale_kernel<float><<<EW_BLOCKS(n), EW_THREADS, 0, st>>>((float *)x, n, alpha);
    else
        scale_kernel<bf16><<<EW_BLOCKS(n), EW_THREADS, 0, st>>>((bf16 *)x, n, alpha);
    CU_LAUNCHED("scale_kernel");
    return TDM_OK;
}

static tdm_status cuda_add_bias(tdm_backend *be, void *y, const float *bias, int64_t rows,
                                int64_t cols, tdm_error *err)
{
    cudaStream_t st = cuda_of(be)->stream;
    if (bf16x8_ok(cols, y, bias)) {
        add_bias_v8_kernel<<<cuda_blocks(rows * cols / 8, EW_THREADS), EW_THREADS, 0, st>>>(
            (bf16 *)y, bias, rows * cols / 8, cols);
        CU_LAUNCHED("add_bias_v8_kernel");
        return TDM_OK;
    }
    add_bias_kernel<<<EW_BLOCKS(rows * cols), EW_THREADS, 0, st>>>((bf16 *)y, bias, rows, cols);
    CU_LAUNCHED("add_bias_kernel");
    return TDM_OK;
}

/* ------------------------------------------------------------------- GEMM ---- */

/* C (m, n) = beta C for k == 0 (beta == 0: zeros, C not read), batch of strided matrices. */
template <typename T>
__global__ void scale_c_kernel(T *c, int64_t m, int64_t n, int64_t ldc, int64_t stride,
                               int64_t batch, float beta)
{
    int64_t total = batch * m * n;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t b = i / (m * n), r = (i / n) % m, col = i % n;
        T *p = c + b * stride + r * ldc + col;
        *p = beta == 0.0f ? (T)0.0f : (T)(beta * (float)*p);
    }
}

static int64_t align_of(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    int64_t al = 256;
    while (al > 1 && (a % (uintptr_t)al) != 0)
        al /= 2;
    return al;
}

static cudaDataType_t lt_type(tdm_be_dtype d)
{
    return d == TDM_BE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* RAII-free cleanup of the descriptors of one matmul. */
struct lt_descs {
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t a = NULL, b = NULL, c = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    ~lt_descs()
    {
        if (pref) cublasLtMatmulPreferenceDestroy(pref);
        if (c) cublasLtMatrixLayoutDestroy(c);
        if (b) cublasLtMatrixLayoutDestroy(b);
        if (a) cublasLtMatrixLayoutDestroy(a);
        if (op) cublasLtMatmulDescDestroy(op);
    }
};

static tdm_status layout(cublasLtMatrixLayout_t *l, cudaDataType_t t, int64_t rows, int64_t cols,
                         int64_t ld, int64_t batch, int64_t stride, tdm_error *err)
{
    LT(cublasLtMatrixLayoutCreate(l, t, (uint64_t)rows, (uint64_t)cols, ld));
    if (batch > 1) {
        int32_t bc = (int32_t)batch;
        LT(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc,
                                            sizeof bc));
        LT(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                            &stride, sizeof stride));
    }
    return TDM_OK;
}

/* ---- cuBLASLt plans ----
 * Creating the matmul and layout descriptors and asking cublasLtMatmulAlgoGetHeuristic for an
 * algorithm costs tens of microseconds of host time per GEMM, about as much as a small GEMM runs
 * on the device; a training step repeats the same few dozen shapes hundreds of times. So each
 * (types, transposes, m, n, k, leading dimensions, batch, strides, alignments) is planned once
 * and the descriptors and algorithm are kept (cleared when more than PLAN_CACHE_MAX accumulate).
 * TANDEM_CUDA_NO_PLAN_CACHE=1 at backend creation turns the cache off (the benchmark's A/B).
 *
 * TANDEM_CUDA_GEMM_TUNE=N (2..LT_TUNE_MAX; a benchmark knob, off by default): a new plan whose
 * call overwrites C (beta 0) asks the heuristic for N algorithms and times each on the call's
 * own operands (one warm-up, LT_TUNE_RUNS timed, CUDA events), keeping the fastest; the call
 * itself then runs with it. Off by default because the choice follows timing, and algorithms
 * differ in summation order, so two runs could differ in their last bits; scripts/device/
 * gemm-cut-ab.sh measures what it would be worth (dev/cuda/gemm_algos.cu per shape). */
#define PLAN_CACHE_MAX 4096
#define LT_TUNE_MAX 16
#define LT_TUNE_RUNS 3

struct lt_plan_key { /* all int64: no padding, so memcmp/byte hashing are exact */
    int64_t ab, ct, opa, opb, m, n, k, lda, ldb, ldc, batch, sa, sb, sc, al_a, al_b, al_c;
    int64_t scales; /* bit 0: scale_a set, bit 1: scale_b set */
    bool operator==(const lt_plan_key &o) const
    {
        return memcmp(this, &o, sizeof o) == 0;
    }
};
struct lt_plan_hash {
    size_t operator()(const lt_plan_key &k) const
    {
        const unsigned char *p = (const unsigned char *)&k;
        uint64_t h = 1469598103934665603ull; /* FNV-1a */
        for (size_t i = 0; i < sizeof k; i++)
            h = (h ^ p[i]) * 1099511628211ull;
        return (size_t)h;
    }
};
struct lt_plan {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
};
struct cuda_plan_cache {
    std::unordered_map<lt_plan_key, lt_plan, lt_plan_hash> map;
};

static void plan_destroy(lt_plan *p)
{
    cublasLtMatrixLayoutDestroy(p->c);
    cublasLtMatrixLayoutDestroy(p->b);
    cublasLtMatrixLayoutDestroy(p->a);
    cublasLtMatmulDescDestroy(p->op);
}

static void plan_cache_clear(cuda_plan_cache *c)
{
    for (auto &kv : c->map)
        plan_destroy(&kv.second);
    c->map.clear();
}

void cuda_plan_cache_free(cuda_backend *cb)
{
    if (!cb->plans) return;
    plan_cache_clear(cb->plans);
    delete cb->plans;
    cb->plans = NULL;
}

/* One cuBLASLt matmul in its own column-major terms: D (m, n) = alpha op(A) op(B) + beta C,
 * with C = D; op(A) is (m, k), op(B) (k, n). scale_a / scale_b: device f32 scales of FP8
 * operands (NULL: none). Plans are cached by everything but the pointers. */
struct lt_call {
    cudaDataType_t ab, ct; /* operand and output types */
    cublasOperation_t opa, opb;
    int64_t m, n, k, lda, ldb, ldc, batch, sa, sb, sc;
    const void *a, *b;
    void *c;
    float alpha, beta;
    const float *scale_a, *scale_b;
};

/* Index of the fastest of `n` heuristic results for the call q (descriptors d), each timed
 * LT_TUNE_RUNS times after one warm-up; an algorithm that fails to launch is skipped. Writes C. */
static tdm_status lt_tune_pick(cuda_backend *cb, const lt_descs &d, const lt_call *q,
                               const cublasLtMatmulHeuristicResult_t *h, int n, int *pick,
                               tdm_error *err)
{
    cudaEvent_t ev[2];
    CU(cudaEventCreate(&ev[0]));
    if (cudaEventCreate(&ev[1]) != cudaSuccess) {
        cudaEventDestroy(ev[0]);
        return tdm_fail(err, TDM_ERR_DEVICE, "cuda: cudaEventCreate failed");
    }
    float best = 0.0f;
    bool have = false;
    *pick = 0;
    cudaError_t ce = cudaSuccess;
    for (int i = 0; i < n && ce == cudaSuccess; i++) {
        bool ok = true;
        for (int r = 0; r <= LT_TUNE_RUNS && ok; r++) {
            if (r == 1) ce = cudaEventRecord(ev[0], cb->stream);
            ok = ce == cudaSuccess &&
                 cublasLtMatmul(cb->lt, d.op, &q->alpha, q->a, d.a, q->b, d.b, &q->beta, q->c,
                                d.c, q->c, d.c, &h[i].algo, cb->lt_ws, cb->lt_ws_bytes,
                                cb->stream) == CUBLAS_STATUS_SUCCESS;
        }
        if (!ok) continue;
        float ms = 0.0f;
        if (ce == cudaSuccess) ce = cudaEventRecord(ev[1], cb->stream);
        if (ce == cudaSuccess) ce = cudaEventSynchronize(ev[1]);
        if (ce == cudaSuccess) ce = cudaEventElapsedTime(&ms, ev[0], ev[1]);
        if (ce == cudaSuccess && (!have || ms < best)) best = ms, *pick = i, have = true;
    }
    cudaEventDestroy(ev[1]);
    cudaEventDestroy(ev[0]);
    if (ce != cudaSuccess)
        return tdm_fail(err, TDM_ERR_DEVICE, "cuda: timing cuBLASLt algorithms: %s",
                        cudaGetErrorString(ce));
    return TDM_OK;
}

static tdm_status lt_matmul(cuda_backend *cb, const lt_call *q, tdm_error *err)
{
    cuda_prof_scope prof(cb, TDM_OP_SUB_MATMUL);
    uint32_t al_a = (uint32_t)align_of(q->a), al_b = (uint32_t)align_of(q->b);
    uint32_t al_c = (uint32_t)align_of(q->c);
    lt_plan_key key;
    memset(&key, 0, sizeof key);
    key.ab = q->ab, key.ct = q->ct, key.opa = q->opa, key.opb = q->opb, key.m = q->m;
    key.n = q->n, key.k = q->k, key.lda = q->lda, key.ldb = q->ldb, key.ldc = q->ldc;
    key.batch = q->batch;
    if (q->batch > 1) key.sa = q->sa, key.sb = q->sb, key.sc = q->sc;
    key.al_a = al_a, key.al_b = al_b, key.al_c = al_c;
    key.scales = (q->scale_a ? 1 : 0) | (q->scale_b ? 2 : 0);
    if (cb->plans) {
        auto it = cb->plans->map.find(key);
        if (it != cb->plans->map.end()) {
            lt_plan *p = &it->second;
            if (q->scale_a)
                LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                  &q->scale_a, sizeof q->scale_a));
            if (q->scale_b)
                LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                  &q->scale_b, sizeof q->scale_b));
            LT(cublasLtMatmul(cb->lt, p->op, &q->alpha, q->a, p->a, q->b, p->b, &q->beta, q->c,
                              p->c, q->c, p->c, &p->algo, cb->lt_ws, cb->lt_ws_bytes,
                              cb->stream));
            return TDM_OK;
        }
    }
    lt_descs d;
    LT(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &q->opa, sizeof q->opa));
    LT(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &q->opb, sizeof q->opb));
    if (q->scale_a)
        LT(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &q->scale_a,
                                          sizeof q->scale_a));
    if (q->scale_b)
        LT(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &q->scale_b,
                                          sizeof q->scale_b));
    bool ta = q->opa == CUBLAS_OP_T, tb = q->opb == CUBLAS_OP_T;
    TDM_TRY(layout(&d.a, q->ab, ta ? q->k : q->m, ta ? q->m : q->k, q->lda, q->batch, q->sa, err));
    TDM_TRY(layout(&d.b, q->ab, tb ? q->n : q->k, tb ? q->k : q->n, q->ldb, q->batch, q->sb, err));
    TDM_TRY(layout(&d.c, q->ct, q->m, q->n, q->ldc, q->batch, q->sc, err));
    LT(cublasLtMatmulPreferenceCreate(&d.pref));
    LT(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                            &cb->lt_ws_bytes, sizeof cb->lt_ws_bytes));
    LT(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                            &al_a, sizeof al_a));
    LT(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                            &al_b, sizeof al_b));
    LT(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                            &al_c, sizeof al_c));
    LT(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                            &al_c, sizeof al_c));
    cublasLtMatmulHeuristicResult_t heurs[LT_TUNE_MAX];
    int want = cb->plans && cb->lt_tune > 1 && q->beta == 0.0f ? cb->lt_tune : 1, found = 0, pick = 0;
    LT(cublasLtMatmulAlgoGetHeuristic(cb->lt, d.op, d.a, d.b, d.c, d.c, d.pref, want, heurs,
                                      &found));
    if (found < 1)
        return tdm_fail(err, TDM_ERR_DEVICE,
                        "cublasLt: no algorithm for a %s matmul (column-major m %lld n %lld k %lld, "
                        "op %c%c, lda %lld ldb %lld ldc %lld, batch %lld)",
                        q->ab == CUDA_R_8F_E4M3 ? "fp8" : q->ab == CUDA_R_16BF ? "bf16" : "f32",
                        (long long)q->m, (long long)q->n, (long long)q->k, ta ? 'T' : 'N',
                        tb ? 'T' : 'N', (long long)q->lda, (long long)q->ldb, (long long)q->ldc,
                        (long long)q->batch);
    if (found > 1) TDM_TRY(lt_tune_pick(cb, d, q, heurs, found, &pick, err));
    const cublasLtMatmulHeuristicResult_t &heur = heurs[pick];
    LT(cublasLtMatmul(cb->lt, d.op, &q->alpha, q->a, d.a, q->b, d.b, &q->beta, q->c, d.c, q->c,
                      d.c, &heur.algo, cb->lt_ws, cb->lt_ws_bytes, cb->stream));
    if (cb->plans) {
        if (cb->plans->map.size() >= PLAN_CACHE_MAX) plan_cache_clear(cb->plans);
        lt_plan p = {d.op, d.a, d.b, d.c, heur.algo};
        try {
            cb->plans->map.emplace(key, p);
            d.op = NULL, d.a = d.b = d.c = NULL; /* owned by the cache now */
        } catch (...) {                          /* out of host memory: run uncached */
        }
    }
    return TDM_OK;
}

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLASLt's first operand is
 * our B (its memory read column-major is B^T when B is not transposed), the second our A. */
static tdm_status gemm_same_types(cuda_backend *cb, const tdm_gemm_args *g, tdm_error *err)
{
    lt_call q = {};
    q.ab = lt_type(g->a_dtype), q.ct = lt_type(g->c_dtype);
    q.opa = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    q.opb = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    q.m = g->n, q.n = g->m, q.k = g->k;
    q.a = g->b, q.lda = g->ldb, q.sa = g->stride_b;
    q.b = g->a, q.ldb = g->lda, q.sb = g->stride_a;
    q.c = g->c, q.ldc = g->ldc, q.sc = g->stride_c;
    q.batch = g->batch > 0 ? g->batch : 1;
    q.alpha = g->alpha, q.beta = g->beta;
    return lt_matmul(cb, &q, err);
}

static int64_t span(int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride)
{
    if (rows == 0 || cols == 0) return 0;
    return (batch - 1) * stride + (rows - 1) * ld + cols;
}

/* f32 x f32 -> bf16, which cuBLASLt does not offer (CUBLAS_STATUS_NOT_SUPPORTED on sm_90): C's
 * whole span is widened into scratch slot 6 (so beta and the gaps between rows round-trip
 * exactly), multiplied there in f32, and narrowed back. */
static tdm_status gemm_f32_into_bf16(cuda_backend *cb, tdm_gemm_args *h, int64_t batch,
                                     tdm_error *err)
{
    int64_t n = span(h->m, h->n, h->ldc, batch, h->stride_c);
    void *wide;
    TDM_TRY(cuda_scratch_get(cb, 6, (size_t)n * sizeof(float), &wide, err));
    {
        cuda_prof_scope prof(cb, TDM_OP_SUB_CONVERT);
        convert_kernel<bf16, float>
            <<<EW_BLOCKS(n), EW_THREADS, 0, cb->stream>>>((const bf16 *)h->c, (float *)wide, n);
        CU_LAUNCHED("convert_kernel");
    }
    void *c = h->c;
    h->c = wide;
    h->c_dtype = TDM_BE_F32;
    TDM_TRY(gemm_same_types(cb, h, err));
    cuda_prof_scope prof(cb, TDM_OP_SUB_CONVERT);
    convert_kernel<float, bf16>
        <<<EW_BLOCKS(n), EW_THREADS, 0, cb->stream>>>((const float *)wide, (bf16 *)c, n);
    CU_LAUNCHED("convert_kernel");
    return TDM_OK;
}

tdm_status cuda_gemm_rm(cuda_backend *cb, const tdm_gemm_args *g, tdm_error *err)
{
    int64_t batch = g->batch > 0 ? g->batch : 1;
    if (g->m == 0 || g->n == 0) return TDM_OK;
    if (g->k == 0) {
        int64_t total = batch * g->m * g->n;
        if (g->c_dtype == TDM_BE_F32)
            scale_c_kernel<float><<<EW_BLOCKS(total), EW_THREADS, 0, cb->stream>>>(
                (float *)g->c, g->m, g->n, g->ldc, g->stride_c, batch, g->beta);
        else
            scale_c_kernel<bf16><<<EW_BLOCKS(total), EW_THREADS, 0, cb->stream>>>(
                (bf16 *)g->c, g->m, g->n, g->ldc, g->stride_c, batch, g->beta);
        CU_LAUNCHED("scale_c_kernel");
        return TDM_OK;
    }
    if (g->a_dtype == g->b_dtype && !(g->a_dtype == TDM_BE_F32 && g->c_dtype == TDM_BE_BF16))
        return gemm_same_types(cb, g, err);
    tdm_gemm_args h = *g;
    if (g->a_dtype == g->b_dtype) return gemm_f32_into_bf16(cb, &h, batch, err);
    /* Mixed f32 / bf16 operands: widen the bf16 one into scratch slot 2 (same ld and strides). */
    bool a_bf = g->a_dtype == TDM_BE_BF16;
    int64_t n =
        a_bf ? span(g->trans_a ? g->k : g->m, g->trans_a ? g->m : g->k, g->lda, batch, g->stride_a)
             : span(g->trans_b ? g->n : g->k, g->trans_b ? g->k : g->n, g->ldb, batch, g->stride_b);
    void *tmp;
    TDM_TRY(cuda_scratch_get(cb, 2, (size_t)n * sizeof(float), &tmp, err));
    {
        cuda_prof_scope prof(cb, TDM_OP_SUB_CONVERT);
        convert_kernel<bf16, float><<<EW_BLOCKS(n), EW_THREADS, 0, cb->stream>>>(
            (const bf16 *)(a_bf ? g->a : g->b), (float *)tmp, n);
        CU_LAUNCHED("convert_kernel");
    }
    if (a_bf) {
        h.a = tmp;
        h.a_dtype = TDM_BE_F32;
    } else {
        h.b = tmp;
        h.b_dtype = TDM_BE_F32;
    }
    if (h.c_dtype == TDM_BE_BF16) return gemm_f32_into_bf16(cb, &h, batch, err);
    return gemm_same_types(cb, &h, err);
}

static tdm_status cuda_gemm(tdm_backend *be, const tdm_gemm_args *g, tdm_error *err)
{
    return cuda_gemm_rm(cuda_of(be), g, err);
}

/* -------------------------------------------------------- frozen weights ---- */

/* The dequantization kernels' view of an NF4 weight: n elements from element e0, contiguous. */
static nf4_args nf4_args_of(const tdm_be_weight *w, int64_t e0, int64_t n)
{
    nf4_args a;
    a.codes = w->codes;
    a.absmax = w->format == TDM_BE_W_NF4 ? w->absmax : NULL;
    a.absmax_q = w->absmax_q;
    a.absmax2 = w->absmax2;
    a.offset = w->offset;
    a.e0 = e0;
    a.n = n;
    a.width = a.ld = 0;
    return a;
}

tdm_status cuda_weight_rows(cuda_backend *cb, const tdm_be_weight *w, int64_t r0, int64_t r1,
                            void *out, tdm_be_dtype dtype, tdm_error *err)
{
    int64_t n = (r1 - r0) * w->cols, e0 = r0 * w->cols;
    cudaStream_t st = cb->stream;
    bool f32 = dtype == TDM_BE_F32;
    switch (w->format) {
    case TDM_BE_W_F32:
        if (f32) {
            CU(cudaMemcpyAsync(out, (const float *)w->data + e0, (size_t)n * sizeof(float),
                               cudaMemcpyDeviceToDevice, st));
            return TDM_OK;
        }
        convert_kernel<float, bf16>
            <<<EW_BLOCKS(n), EW_THREADS, 0, st>>>((const float *)w->data + e0, (bf16 *)out, n);
        CU_LAUNCHED("convert_kernel");
        return TDM_OK;
    case TDM_BE_W_BF16:
        if (!f32) {
            CU(cudaMemcpyAsync(out, (const bf16 *)w->data + e0, (size_t)n * sizeof(bf16),
                               cudaMemcpyDeviceToDevice, st));
            return TDM_OK;
        }
        convert_kernel<bf16, float>
            <<<EW_BLOCKS(n), EW_THREADS, 0, st>>>((const bf16 *)w->data + e0, (float *)out, n);
        CU_LAUNCHED("convert_kernel");
        return TDM_OK;
    case TDM_BE_W_F32_PANELS: /* the CPU backend's layout (tdm_be_lay_out_frozen) */
        return tdm_fail(err, TDM_ERR_UNSUPPORTED, "weight_rows: a CPU panel weight on CUDA");
    case TDM_BE_W_NF4:
    case TDM_BE_W_NF4_DQ:
        break;
    }
    cuda_prof_scope prof(cb, TDM_OP_SUB_NF4_DEQUANT);
    nf4_args a = nf4_args_of(w, e0, n);
    if (!f32 && e0 % 8 == 0 && (uintptr_t)out % 16 == 0) {
        nf4_dequant_v5<<<nf4_dequant_v5_blocks(n), 256, 0, st>>>(a, (bf16 *)out);
        CU_LAUNCHED("nf4_dequant_v5");
    } else if (e0 % 8 == 0) {
        unsigned blocks = cuda_blocks(n / 8 > 0 ? n / 8 : 1, 256);
        if (f32)
            nf4_dequant_v2<float><<<blocks, 256, 0, st>>>(a, (float *)out);
        else
            nf4_dequant_v2<bf16><<<blocks, 256, 0, st>>>(a, (bf16 *)out);
        CU_LAUNCHED("nf4_dequant_v2");
    } else {
        if (f32)
            nf4_dequant_v1<float><<<EW_BLOCKS(n), EW_THREADS, 0, st>>>(a, (float *)out);
        else
            nf4_dequant_v1<bf16><<<EW_BLOCKS(n), EW_THREADS, 0, st>>>(a, (bf16 *)out);
        CU_LAUNCHED("nf4_dequant_v1");
    }
    return TDM_OK;
}

static tdm_status cuda_weight_rows_op(tdm_backend *be, const tdm_be_weight *w, int64_t row_begin,
                                      int64_t row_end, void *out, tdm_be_dtype out_dtype,
                                      tdm_error *err)
{
    return cuda_weight_rows(cuda_of(be), w, row_begin, row_end, out, out_dtype, err);
}

tdm_status cuda_dense_bf16(cuda_backend *cb, const tdm_be_weight *w, int slot, const bf16 **out,
                           tdm_error *err)
{
    if (w->format == TDM_BE_W_BF16) {
        *out = (const bf16 *)w->data;
        return TDM_OK;
    }
    void *tmp;
    TDM_TRY(cuda_scratch_get(cb, slot, (size_t)(w->rows * w->cols) * sizeof(bf16), &tmp, err));
    TDM_TRY(cuda_weight_rows(cb, w, 0, w->rows, tmp, TDM_BE_BF16, err));
    *out = (const bf16 *)tmp;
    return TDM_OK;
}

/* Rows of W per forward tile (cuda_memory_plan.h). */
static int64_t tile_rows(const tdm_be_weight *w)
{
    return tdm_cuda_tile_rows(w->rows, w->cols);
}

/* Columns [c0, c1) of every row of W into out (rows, c1 - c0) bf16: the backward's slab. Needs
 * c0, c1 and cols multiples of 16 for NF4 (tdm_cuda_slab_cols gives multiples of 64). All the
 * columns are the whole weight, contiguous: cuda_weight_rows's kernel. */
static tdm_status cuda_weight_cols(cuda_backend *cb, const tdm_be_weight *w, int64_t c0, int64_t c1,
                                   bf16 *out, tdm_error *err)
{
    if (c0 == 0 && c1 == w->cols) return cuda_weight_rows(cb, w, 0, w->rows, out, TDM_BE_BF16, err);
    cuda_prof_scope prof(cb, TDM_OP_SUB_NF4_DEQUANT);
    int64_t width = c1 - c0, n = w->rows * width;
    cudaStream_t st = cb->stream;
    if (w->format == TDM_BE_W_F32 || w->format == TDM_BE_W_BF16) {
        if (w->format == TDM_BE_W_F32)
            convert_slab_kernel<float, bf16><<<EW_BLOCKS(n), EW_THREADS, 0, st>>>(
                (const float *)w->data + c0, w->cols, width, w->rows, out);
        else
            convert_slab_kernel<bf16, bf16><<<EW_BLOCKS(n), EW_THREADS, 0, st>>>(
                (const bf16 *)w->data + c0, w->cols, width, w->rows, out);
        CU_LAUNCHED("convert_slab_kernel");
        return TDM_OK;
    }
    nf4_args a = nf4_args_of(w, c0, n);
    a.width = width;
    a.ld = w->cols;
    nf4_dequant_v4<<<cuda_blocks(n / 16 > 0 ? n / 16 : 1, 256), 256, 0, st>>>(a, out);
    CU_LAUNCHED("nf4_dequant_v4 (slab)");
    return TDM_OK;
}

/* ------------------------------------------------ FP8 base compute (fp8.cuh) ---- */

static bool is_nf4(const tdm_be_weight *w)
{
    return w->format == TDM_BE_W_NF4 || w->format == TDM_BE_W_NF4_DQ;
}

/* Whether W's forward runs in FP8: --base-compute fp8, an NF4 weight, and what cuBLASLt's FP8
 * kernels need (K = cols and the output features a multiple of 16, 16-byte aligned rows of X).
 * Other weights take the bf16 path. */
static bool fp8_fwd(const cuda_backend *cb, const tdm_be_weight *w, const void *x)
{
    return cb->base_fp8 && is_nf4(w) && w->cols % 16 == 0 && w->rows % 16 == 0 &&
           (uintptr_t)x % 16 == 0;
}

/* The backward's transposed slabs also need cols (and so every slab) a multiple of 64. */
static bool fp8_bwd(const cuda_backend *cb, const tdm_be_weight *w, const void *dy)
{
    return fp8_fwd(cb, w, dy) && w->cols % 64 == 0 && tdm_cuda_slab_cols(w->rows, w->cols) > 0;
}

static_assert(sizeof(fp8_scales) <= TDM_CUDA_FP8_SCALE_BYTES,
              "cuda_memory_plan.h's TDM_CUDA_FP8_SCALE_BYTES must hold fp8.cuh's fp8_scales");

/* The e4m3 copy of n contiguous bf16 values (X or dY) in scratch slot 8 and its scale in
 * f->scale_act, in stream order: two kernels (fp8.cuh: per-block maxima, then their maximum
 * and the conversion). */
static tdm_status fp8_quantize(cuda_backend *cb, const void *act, int64_t n, uint8_t **act8,
                               fp8_scales **f, tdm_error *err)
{
    void *s, *buf;
    TDM_TRY(cuda_scratch_get(cb, 9, sizeof(fp8_scales), &s, err));
    TDM_TRY(cuda_scratch_get(cb, 8, (size_t)n, &buf, err));
    *f = (fp8_scales *)s;
    *act8 = (uint8_t *)buf;
    cudaStream_t st = cb->stream;
    cuda_prof_scope prof(cb, TDM_OP_SUB_CONVERT);
    unsigned blocks = fp8_blocks(n / 8);
    fp8_amax_bf16<<<blocks, 256, 0, st>>>((const bf16 *)act, n, (*f)->amax_part);
    CU_LAUNCHED("fp8_amax_bf16");
    fp8_quantize_bf16<<<blocks, 256, 0, st>>>((const bf16 *)act, n, (*f)->amax_part,
                                              &(*f)->scale_act, *act8);
    CU_LAUNCHED("fp8_quantize_bf16");
    return TDM_OK;
}

/* The weight's amax (its largest block absmax): measured on the device at the weight's first
 * FP8 use (one reduction and a wait for it, once per weight: the base is frozen), then from
 * cb->fp8_w_amax. */
static tdm_status fp8_weight_amax(cuda_backend *cb, const tdm_be_weight *w, float *amax,
                                  tdm_error *err)
{
    if (!cb->fp8_w_amax) {
        cb->fp8_w_amax = new (std::nothrow) std::unordered_map<const void *, float>();
        if (!cb->fp8_w_amax) return tdm_fail(err, TDM_ERR_NOMEM, "backend cuda: out of memory");
    }
    auto it = cb->fp8_w_amax->find(w->codes);
    if (it != cb->fp8_w_amax->end()) {
        *amax = it->second;
        return TDM_OK;
    }
    void *s;
    TDM_TRY(cuda_scratch_get(cb, 9, sizeof(fp8_scales), &s, err));
    fp8_scales *f = (fp8_scales *)s;
    cudaStream_t st = cb->stream;
    CU(cudaMemsetAsync(&f->amax_w, 0, sizeof(unsigned), st));
    int64_t nblk = (w->rows * w->cols + 63) / 64;
    fp8_nf4_amax<<<fp8_blocks(nblk), 256, 0, st>>>(nf4_args_of(w, 0, 0), nblk, &f->amax_w);
    CU_LAUNCHED("fp8_nf4_amax");
    unsigned bits;
    CU(cudaMemcpyAsync(&bits, &f->amax_w, sizeof bits, cudaMemcpyDeviceToHost, st));
    CU(cudaStreamSynchronize(st));
    memcpy(amax, &bits, sizeof bits);
    try {
        cb->fp8_w_amax->emplace(w->codes, *amax);
    } catch (...) { /* out of host memory: measured again next time */
    }
    return TDM_OK;
}

/* The FP8 matmul both directions make, in cuBLASLt's column-major terms: D (rows of the weight
 * tile or slab, n) = A^T B with A the weight's e4m3 piece and B = b8 (X or dY), both K-major
 * with leading dimension k ("TN", cuBLASLt's only FP8 layout), D bf16 with leading dimension
 * ldc. The activation's scale is read on the device (f->scale_act); the weight's is the host
 * value amax_w / 448, passed as alpha. The caller sets m, a and c per piece. */
static lt_call fp8_tn_call(int64_t n, int64_t k, int64_t ldc, const uint8_t *b8, float beta,
                           fp8_scales *f, float amax_w)
{
    lt_call q = {};
    q.ab = CUDA_R_8F_E4M3, q.ct = CUDA_R_16BF;
    q.opa = CUBLAS_OP_T, q.opb = CUBLAS_OP_N;
    q.n = n, q.k = k, q.lda = k, q.ldb = k, q.ldc = ldc, q.batch = 1;
    q.b = b8, q.alpha = fp8_scale_of(amax_w), q.beta = beta;
    q.scale_b = &f->scale_act;
    return q;
}

/* Y (m, rows) = X W^T + beta Y in FP8 from X's e4m3 copy x8 (scale in f): W's row tiles as e4m3
 * in slot 0, each one TN matmul (column-major Y^T block (r1 - r0, m) = W8_tile (K = cols major)
 * x X8). */
static tdm_status fp8_fwd_tiles(cuda_backend *cb, const tdm_be_weight *w, const uint8_t *x8,
                                fp8_scales *f, int64_t m, void *y, float beta, tdm_error *err)
{
    float amax_w;
    TDM_TRY(fp8_weight_amax(cb, w, &amax_w, err));
    const float inv = fp8_inv_scale(amax_w);
    int64_t tile = tile_rows(w);
    void *buf;
    TDM_TRY(cuda_scratch_get(cb, 0, (size_t)(tile * w->cols), &buf, err));
    lt_call q = fp8_tn_call(m, w->cols, w->rows, x8, beta, f, amax_w);
    for (int64_t r0 = 0; r0 < w->rows; r0 += tile) {
        int64_t r1 = r0 + tile < w->rows ? r0 + tile : w->rows;
        {
            cuda_prof_scope prof(cb, TDM_OP_SUB_NF4_DEQUANT);
            int64_t n = (r1 - r0) * w->cols;
            fp8_nf4_rows<<<fp8_blocks(n / 32), 256, 0, cb->stream>>>(
                nf4_args_of(w, r0 * w->cols, n), inv, (uint8_t *)buf);
            CU_LAUNCHED("fp8_nf4_rows");
        }
        q.m = r1 - r0, q.a = buf, q.c = (bf16 *)y + r0;
        TDM_TRY(lt_matmul(cb, &q, err));
    }
    return TDM_OK;
}

static tdm_status fp8_linear_fwd(cuda_backend *cb, const tdm_be_weight *w, const void *x,
                                 int64_t m, void *y, float beta, tdm_error *err)
{
    uint8_t *x8;
    fp8_scales *f;
    TDM_TRY(fp8_quantize(cb, x, m * w->cols, &x8, &f, err));
    return fp8_fwd_tiles(cb, w, x8, f, m, y, beta, err);
}

/* dX (m, cols) = dY W + beta dX in FP8: W's column slabs transposed to (width, rows) e4m3 in
 * slot 0, each one TN matmul (column-major dX^T block (width, m) = W8T_slab (K = rows major) x
 * dY8), so every slab gives its own block of dX's columns, rounded to bf16 once. */
static tdm_status fp8_linear_bwd(cuda_backend *cb, const tdm_be_weight *w, const void *dy,
                                 int64_t m, void *dx, float beta, tdm_error *err)
{
    uint8_t *dy8;
    fp8_scales *f;
    TDM_TRY(fp8_quantize(cb, dy, m * w->rows, &dy8, &f, err));
    float amax_w;
    TDM_TRY(fp8_weight_amax(cb, w, &amax_w, err));
    const float inv = fp8_inv_scale(amax_w);
    int64_t slab = tdm_cuda_slab_cols(w->rows, w->cols);
    void *buf;
    TDM_TRY(cuda_scratch_get(cb, 0, (size_t)(w->rows * slab), &buf, err));
    lt_call q = fp8_tn_call(m, w->rows, w->cols, dy8, beta, f, amax_w);
    nf4_args a = nf4_args_of(w, 0, 0);
    a.ld = w->cols;
    for (int64_t c0 = 0; c0 < w->cols; c0 += slab) {
        int64_t c1 = c0 + slab < w->cols ? c0 + slab : w->cols;
        {
            cuda_prof_scope prof(cb, TDM_OP_SUB_NF4_DEQUANT);
            int64_t tiles = (w->rows + FP8_T_TILE - 1) / FP8_T_TILE * ((c1 - c0) / FP8_T_TILE);
            unsigned blocks = (unsigned)(tiles < 8 * cb->n_sms ? tiles : 8 * cb->n_sms);
            fp8_nf4_cols_t<<<blocks, 256, 0, cb->stream>>>(a, w->rows, c0, c1 - c0, inv,
                                                           (uint8_t *)buf);
            CU_LAUNCHED("fp8_nf4_cols_t");
        }
        q.m = c1 - c0, q.a = buf, q.c = (bf16 *)dx + c0;
        TDM_TRY(lt_matmul(cb, &q, err));
    }
    return TDM_OK;
}

/* Y (m, rows) = X (m, cols) W^T + beta Y. A bf16 weight is one GEMM; others (NF4, f32) are
 * dequantized to bf16 a tile of rows at a time into workspace, each tile producing a block of
 * Y's columns. */
static tdm_status cuda_linear_fwd(tdm_backend *be, const tdm_be_weight *w, const void *x, int64_t m,
                                  void *y, float beta, tdm_error *err)
{
    cuda_backend *cb = cuda_of(be);
    tdm_gemm_args g = {};
    g.trans_a = false;
    g.trans_b = true;
    g.m = m;
    g.k = w->cols;
    g.alpha = 1.0f;
    g.beta = beta;
    g.a = x;
    g.a_dtype = TDM_BE_BF16;
    g.lda = w->cols;
    g.b_dtype = TDM_BE_BF16;
    g.ldb = w->cols;
    g.c_dtype = TDM_BE_BF16;
    g.ldc = w->rows;
    g.batch = 1;
    if (w->format == TDM_BE_W_BF16) {
        g.n = w->rows;
        g.b = w->data;
        g.c = y;
        return cuda_gemm_rm(cb, &g, err);
    }
    if (m > 0 && fp8_fwd(cb, w, x)) return fp8_linear_fwd(cb, w, x, m, y, beta, err);
    int64_t tile = tile_rows(w);
    void *buf;
    TDM_TRY(cuda_scratch_get(cb, 0, (size_t)(tile * w->cols) * sizeof(bf16), &buf, err));
    for (int64_t r0 = 0; r0 < w->rows; r0 += tile) {
        int64_t r1 = r0 + tile < w->rows ? r0 + tile : w->rows;
        TDM_TRY(cuda_weight_rows(cb, w, r0, r1, buf, TDM_BE_BF16, err));
        g.n = r1 - r0;
        g.b = buf;
        g.c = (bf16 *)y + r0;
        TDM_TRY(cuda_gemm_rm(cb, &g, err));
    }
    return TDM_OK;
}

/* tdm_be_linear_fwd_shared: with --base-compute fp8 and every weight on the FP8 path, X is
 * quantized once for all of them; otherwise one cuda_linear_fwd each. */
static tdm_status cuda_linear_fwd_shared(tdm_backend *be, const tdm_be_weight *const *ws, int n,
                                         const void *x, int64_t m, void *const *ys,
                                         tdm_error *err)
{
    cuda_backend *cb = cuda_of(be);
    bool fp8 = true;
    for (int i = 0; i < n; i++)
        fp8 = fp8 && fp8_fwd(cb, ws[i], x);
    if (!fp8) {
        for (int i = 0; i < n; i++)
            TDM_TRY(cuda_linear_fwd(be, ws[i], x, m, ys[i], 0.0f, err));
        return TDM_OK;
    }
    uint8_t *x8;
    fp8_scales *f;
    TDM_TRY(fp8_quantize(cb, x, m * ws[0]->cols, &x8, &f, err));
    for (int i = 0; i < n; i++)
        TDM_TRY(fp8_fwd_tiles(cb, ws[i], x8, f, m, ys[i], 0.0f, err));
    return TDM_OK;
}

/* dst (n) bf16 = beta * dst + acc (n) f32 */
__global__ void finish_acc_kernel(bf16 *dst, const float *acc, int64_t n, float beta)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float v = acc[i];
        if (beta != 0.0f) v += beta * __bfloat162float(dst[i]);
        dst[i] = __float2bfloat16_rn(v);
    }
}

/* dX (m, cols) = dY (m, rows) W + beta dX. A bf16 weight, or one that fits a tile, is one GEMM.
 * Larger ones are cut in column slabs of W (all rows, tdm_cuda_slab_cols columns): each slab
 * gives its own block of dX's columns, rounded to bf16 once, as the single GEMM would. Weights
 * whose cols are not a multiple of 64 fall back to tiles of rows (W's rows are the K
 * dimension): the tile products accumulate in an f32 workspace, rounded once into dX. */
static tdm_status cuda_linear_bwd(tdm_backend *be, const tdm_be_weight *w, const void *dy,
                                  int64_t m, void *dx, float beta, tdm_error *err)
{
    cuda_backend *cb = cuda_of(be);
    tdm_gemm_args g = {};
    g.m = m;
    g.n = w->cols;
    g.alpha = 1.0f;
    g.a_dtype = TDM_BE_BF16;
    g.lda = w->rows;
    g.b_dtype = TDM_BE_BF16;
    g.ldb = w->cols;
    g.ldc = w->cols;
    g.batch = 1;
    if (w->format == TDM_BE_W_BF16) {
        g.k = w->rows;
        g.a = dy;
        g.b = w->data;
        g.c = dx;
        g.c_dtype = TDM_BE_BF16;
        g.beta = beta;
        return cuda_gemm_rm(cb, &g, err);
    }
    if (m > 0 && fp8_bwd(cb, w, dy)) return fp8_linear_bwd(cb, w, dy, m, dx, beta, err);
    int64_t slab = tdm_cuda_slab_cols(w->rows, w->cols);
    if (slab > 0) {
        void *buf;
        TDM_TRY(cuda_scratch_get(cb, 0, (size_t)(w->rows * slab) * sizeof(bf16), &buf, err));
        g.k = w->rows;
        g.a = dy;
        g.b = buf;
        g.c_dtype = TDM_BE_BF16;
        g.beta = beta;
        for (int64_t c0 = 0; c0 < w->cols; c0 += slab) {
            int64_t c1 = c0 + slab < w->cols ? c0 + slab : w->cols;
            TDM_TRY(cuda_weight_cols(cb, w, c0, c1, (bf16 *)buf, err));
            g.n = c1 - c0;
            g.ldb = c1 - c0;
            g.c = (bf16 *)dx + c0;
            TDM_TRY(cuda_gemm_rm(cb, &g, err));
        }
        return TDM_OK;
    }
    int64_t tile = tile_rows(w);
    void *buf;
    TDM_TRY(cuda_scratch_get(cb, 0, (size_t)(tile * w->cols) * sizeof(bf16), &buf, err));
    bool single = tile >= w->rows;
    void *acc = NULL;
    if (!single) TDM_TRY(cuda_scratch_get(cb, 1, (size_t)(m * w->cols) * sizeof(float), &acc, err));
    for (int64_t r0 = 0; r0 < w->rows; r0 += tile) {
        int64_t r1 = r0 + tile < w->rows ? r0 + tile : w->rows;
        TDM_TRY(cuda_weight_rows(cb, w, r0, r1, buf, TDM_BE_BF16, err));
        g.k = r1 - r0;
        g.a = (const bf16 *)dy + r0;
        g.b = buf;
        if (single) {
            g.c = dx;
            g.c_dtype = TDM_BE_BF16;
            g.beta = beta;
        } else {
            g.c = acc;
            g.c_dtype = TDM_BE_F32;
            g.beta = r0 == 0 ? 0.0f : 1.0f;
        }
        TDM_TRY(cuda_gemm_rm(cb, &g, err));
    }
    if (!single) {
        int64_t n = m * w->cols;
        finish_acc_kernel<<<EW_BLOCKS(n), EW_THREADS, 0, cb->stream>>>((bf16 *)dx,
                                                                       (const float *)acc, n, beta);
        CU_LAUNCHED("finish_acc_kernel");
    }
    return TDM_OK;
}

/* ---------------------------------------------------------------- create ---- */

static const tdm_backend_vtable cuda_vtable = {
    cuda_destroy,        cuda_alloc,       cuda_free_buf,     cuda_upload,
    cuda_download,       cuda_upload_f32,  cuda_download_f32, cuda_copy,
    cuda_memory,         cuda_reset_peak,  cuda_synchronize,  cuda_fill,
    cuda_axpy,           cuda_scale,       cuda_add_bias,     cuda_gemm,
    cuda_weight_rows_op, cuda_linear_fwd,  cuda_linear_bwd,   cuda_embedding,
    cuda_rmsnorm_fwd,    cuda_rmsnorm_bwd, cuda_rope,         cuda_attention_fwd,
    cuda_attention_bwd,  cuda_swiglu_fwd,  cuda_swiglu_bwd,   cuda_cross_entropy,
    cuda_lora_fwd,       cuda_lora_bwd,    cuda_sumsq,        cuda_clip_coef,
    cuda_adamw,          cuda_prof_begin,  cuda_prof_end,     cuda_prof_collect,
    cuda_prof_reset,     cuda_reserve_scratch, cuda_attention_kv,
    cuda_quantize_nf4,   cuda_host_alloc,  cuda_host_free,    cuda_copy_behind,
    cuda_copies_join,    cuda_linear_fwd_shared,
    NULL, /* lay_out_frozen: cuBLASLt reads W as the model stores it */
};

static tdm_status init_device(cuda_backend *cb, const tdm_backend_opts *opts, tdm_error *err)
{
    CU(cudaSetDevice(cb->device));
    cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, cb->device));
    if (prop.major < 8)
        return tdm_fail(err, TDM_ERR_UNSUPPORTED,
                        "backend cuda: device %d (%s) has compute capability %d.%d; tandem needs "
                        "8.0 or newer (bf16)",
                        cb->device, prop.name, prop.major, prop.minor);
    if (opts->base_fp8 && prop.major * 10 + prop.minor < 89)
        return tdm_fail(err, TDM_ERR_UNSUPPORTED,
                        "--base-compute fp8: device %d (%s) has compute capability %d.%d; FP8 "
                        "tensor cores need 8.9 or newer (Ada, Hopper): leave the option out",
                        cb->device, prop.name, prop.major, prop.minor);
    cb->base_fp8 = opts->base_fp8;
    cb->n_sms = prop.multiProcessorCount;
    const char *no_cache = getenv("TANDEM_CUDA_NO_PLAN_CACHE");
    if (!(no_cache && *no_cache && strcmp(no_cache, "0") != 0)) {
        cb->plans = new (std::nothrow) cuda_plan_cache();
        if (!cb->plans) return tdm_fail(err, TDM_ERR_NOMEM, "backend cuda: out of memory");
    }
    const char *tune = getenv("TANDEM_CUDA_GEMM_TUNE");
    cb->lt_tune = tune ? atoi(tune) : 0;
    if (cb->lt_tune > LT_TUNE_MAX) cb->lt_tune = LT_TUNE_MAX;
    cb->max_smem_optin = prop.sharedMemPerBlockOptin;
    CU(cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking));
    LT(cublasLtCreate(&cb->lt));
    cb->lt_ws_bytes = (size_t)TDM_CUDA_LT_WORKSPACE_BYTES;
    TDM_TRY(device_malloc(cb, cb->lt_ws_bytes, &cb->lt_ws, err));
    account(cb, (int64_t)cb->lt_ws_bytes);
    TDM_TRY(device_malloc(cb, sizeof(int), (void **)&cb->dev_error, err));
    CU(cudaMemsetAsync(cb->dev_error, 0, sizeof(int), cb->stream));
    float dmap[256];
    tdm_nf4_dynamic_map(dmap);
    CU(cudaMemcpyToSymbol(nf4_code_c, tdm_nf4_code, sizeof(float) * 16));
    CU(cudaMemcpyToSymbol(nf4_dmap_c, dmap, sizeof dmap));
    CU(cudaStreamSynchronize(cb->stream));
    return TDM_OK;
}

extern "C" tdm_status tdm_backend_cuda_create(tdm_backend **out, const tdm_backend_opts *opts,
                                              tdm_error *err)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return tdm_fail(err, TDM_ERR_NOT_FOUND, "backend cuda: no usable CUDA device (%s: %s)",
                        cudaGetErrorName(e), cudaGetErrorString(e));
    }
    if (count == 0) return tdm_fail(err, TDM_ERR_NOT_FOUND, "backend cuda: no CUDA device found");
    if (opts->device < 0 || opts->device >= count)
        return tdm_fail(err, TDM_ERR_NOT_FOUND, "backend cuda: device %d not in [0, %d)",
                        opts->device, count);
    cuda_backend *cb = (cuda_backend *)calloc(1, sizeof *cb);
    if (!cb) return tdm_fail(err, TDM_ERR_NOMEM, "backend cuda: out of memory");
    cb->base.vt = &cuda_vtable;
    cb->base.name = "cuda";
    cb->base.act_dtype = TDM_BE_BF16;
    cb->device = opts->device;
    cb->allocs = new (std::nothrow) std::unordered_map<void *, size_t>();
    tdm_status st = cb->allocs ? init_device(cb, opts, err)
                               : tdm_fail(err, TDM_ERR_NOMEM, "backend cuda: out of memory");
    if (st != TDM_OK) {
        if (cb->allocs)
            cuda_destroy(&cb->base);
        else
            free(cb);
        return st;
    }
    *out = &cb->base;
    return TDM_OK;
}
