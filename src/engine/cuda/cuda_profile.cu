/* cuda_profile.cu — device timing of ops for op_profile.h (`tandem finetune --profile-ops`).
 *
 * Every profiled op (and sub-op) records a start and an end event on the backend stream; the
 * pairs go into a pool of PROF_SLOTS slots. When the pool is full, and when the report is asked
 * for, the pending pairs are collected: one wait for the last end event, then the elapsed time of
 * each pair is added to its op. Top-level ops (depth 1) also give the window: from the first
 * start to the last end of the batch, so window - busy is the time the device sat idle between
 * ops. Events are created once (timing enabled, no blocking sync) and reused.
 * Failures of the event calls are not errors of the op: that op's timing is skipped.
 */
#include <stdlib.h>

#include "engine/cuda/cuda_internal.h"

#define PROF_SLOTS 8192

struct cuda_prof {
    cudaEvent_t start[PROF_SLOTS], end[PROF_SLOTS];
    int id[PROF_SLOTS];
    bool top[PROF_SLOTS];
    int n_created; /* events created so far (slots [0, n_created) usable) */
    int n;         /* pending pairs */
};

int cuda_prof_begin(tdm_backend *be)
{
    cuda_backend *cb = cuda_of(be);
    if (!cb->prof) {
        cb->prof = (cuda_prof *)calloc(1, sizeof *cb->prof);
        if (!cb->prof) return -1;
    }
    cuda_prof *p = cb->prof;
    if (p->n == PROF_SLOTS) cuda_prof_collect(be);
    int s = p->n;
    if (s == p->n_created) {
        if (cudaEventCreate(&p->start[s]) != cudaSuccess) goto fail;
        if (cudaEventCreate(&p->end[s]) != cudaSuccess) {
            cudaEventDestroy(p->start[s]);
            goto fail;
        }
        p->n_created++;
    }
    if (cudaEventRecord(p->start[s], cb->stream) != cudaSuccess) goto fail;
    p->id[s] = -1; /* set by end */
    p->top[s] = be->prof && be->prof->depth == 1;
    p->n++;
    return s;
fail:
    (void)cudaGetLastError();
    return -1;
}

void cuda_prof_end(tdm_backend *be, int slot, int id)
{
    cuda_prof *p = cuda_of(be)->prof;
    if (!p || slot < 0 || slot >= p->n) return;
    if (cudaEventRecord(p->end[slot], cuda_of(be)->stream) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    p->id[slot] = id;
}

void cuda_prof_collect(tdm_backend *be)
{
    cuda_prof *p = cuda_of(be)->prof;
    tdm_op_profile *op = be->prof;
    if (!p || p->n == 0) return;
    int first = -1, last = -1;
    for (int i = 0; i < p->n; i++) {
        if (p->id[i] < 0) continue;
        if (p->top[i] && first < 0) first = i;
        if (p->top[i]) last = i;
    }
    cudaStreamSynchronize(cuda_of(be)->stream); /* every recorded event has completed */
    for (int i = 0; op && i < p->n; i++) {
        float ms = 0;
        if (p->id[i] < 0 || p->id[i] >= TDM_OP_COUNT) continue;
        if (cudaEventElapsedTime(&ms, p->start[i], p->end[i]) == cudaSuccess)
            op->op[p->id[i]].device_ms += ms;
    }
    float win = 0;
    if (op && first >= 0 &&
        cudaEventElapsedTime(&win, p->start[first], p->end[last]) == cudaSuccess)
        op->window_ms += win;
    (void)cudaGetLastError();
    p->n = 0;
}

void cuda_prof_reset(tdm_backend *be)
{
    cuda_backend *cb = cuda_of(be);
    cuda_prof *p = cb->prof;
    if (!p) return;
    cudaStreamSynchronize(cb->stream);
    for (int i = 0; i < p->n_created; i++) {
        cudaEventDestroy(p->start[i]);
        cudaEventDestroy(p->end[i]);
    }
    (void)cudaGetLastError();
    free(p);
    cb->prof = NULL;
}
