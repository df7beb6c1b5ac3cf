/* op_profile.h — where a training step's time goes, op by op (`tandem finetune --profile-ops`).
 *
 * When enabled on a backend (tdm_be_profile_enable), every op that goes through backend.c is
 * counted and timed twice:
 *   - host ms: wall-clock time spent inside the call on the host (argument checks, descriptor and
 *     algorithm selection, kernel launches; for download/synchronize also the wait for the device);
 *   - device ms: on a backend with its own clock (CUDA: an event pair around the op on its
 *     stream), the time between the op's first and last device work. A CPU backend's ops are
 *     synchronous, so there device ms = host ms.
 * Backends may also time parts of an op (sub-ops: the cuBLASLt matmul, the NF4 dequantization
 * of a weight tile, a dtype conversion; the CPU cross-entropy's logits GEMM, softmax and dH GEMM)
 * by calling tdm_op_profile_begin/end themselves; those rows are shown indented and are already
 * included in their op's row.
 * The device "window" is the time from the first to the last device event of each collection
 * batch: window - the sum of the top-level ops' device time = device idle (the host did not
 * issue work fast enough: launch-bound or host-bound steps).
 *
 * Profiling costs two event records per op (a few microseconds of host time each); the figures
 * are for finding the expensive ops, not for benchmarks (bench/ measures without it). */
#ifndef TANDEM_ENGINE_OP_PROFILE_H
#define TANDEM_ENGINE_OP_PROFILE_H
#include <stdint.h>
#include <stdio.h>

#include "engine/backend.h"

typedef enum tdm_op_id {
    TDM_OP_UPLOAD,
    TDM_OP_DOWNLOAD,
    TDM_OP_COPY,
    TDM_OP_SYNCHRONIZE,
    TDM_OP_FILL,
    TDM_OP_AXPY,
    TDM_OP_SCALE,
    TDM_OP_ADD_BIAS,
    TDM_OP_GEMM,
    TDM_OP_WEIGHT_ROWS,
    TDM_OP_LINEAR_FWD,
    TDM_OP_LINEAR_BWD,
    TDM_OP_EMBEDDING,
    TDM_OP_RMSNORM_FWD,
    TDM_OP_RMSNORM_BWD,
    TDM_OP_ROPE,
    TDM_OP_ATTENTION_FWD,
    TDM_OP_ATTENTION_BWD,
    TDM_OP_SWIGLU_FWD,
    TDM_OP_SWIGLU_BWD,
    TDM_OP_CROSS_ENTROPY,
    TDM_OP_LORA_FWD,
    TDM_OP_LORA_BWD,
    TDM_OP_SUMSQ,
    TDM_OP_CLIP_COEF,
    TDM_OP_ADAMW,
    TDM_OP_ATTENTION_KV,
    TDM_OP_N_TOP, /* the ops above are backend.h's; the ones below are parts of them */
    TDM_OP_SUB_MATMUL = TDM_OP_N_TOP, /* one cuBLASLt matmul (algorithm selection included) */
    TDM_OP_SUB_NF4_DEQUANT,           /* one NF4 tile dequantized */
    TDM_OP_SUB_CONVERT,               /* a dtype conversion around a GEMM */
    TDM_OP_SUB_CE_LOGITS,             /* CPU cross-entropy: a chunk's logits GEMM */
    TDM_OP_SUB_CE_SOFTMAX,            /* CPU cross-entropy: a chunk's loss and dlogits */
    TDM_OP_SUB_CE_DH,                 /* CPU cross-entropy: a chunk's dH GEMM and partial sums */
    TDM_OP_COUNT
} tdm_op_id;

const char *tdm_op_name(tdm_op_id id);

typedef struct tdm_op_stats {
    uint64_t calls;
    double host_ms;
    double device_ms;
} tdm_op_stats;

/* The profile a backend carries while profiling is on (backend_impl.h: tdm_backend.prof). */
typedef struct tdm_op_profile {
    tdm_op_stats op[TDM_OP_COUNT];
    double window_ms; /* device time covered by the collected events (busy + idle) */
    int depth;        /* nesting of begin/end: only depth-1 ops count as top level */
} tdm_op_profile;

/* Turns per-op profiling on (it starts empty) or off (the figures so far are dropped; err is
 * not used then, and may be NULL). tdm_backend_free turns it off. */
tdm_status tdm_be_profile_enable(tdm_backend *be, bool on, tdm_error *err);
/* Collects pending device timings and prints the table (ops by device time, calls, host ms,
 * device ms, share of the window, the idle time) to out. Nothing when profiling is off. */
void tdm_be_profile_report(tdm_backend *be, FILE *out);

/* For backend.c and backend implementations: brackets one op or sub-op. begin returns a token
 * for end (the backend's device timer slot, or -1). No-ops when profiling is off. */
int tdm_op_profile_begin(tdm_backend *be, int64_t *host_t0_ns);
void tdm_op_profile_end(tdm_backend *be, tdm_op_id id, int token, int64_t host_t0_ns);

#endif
