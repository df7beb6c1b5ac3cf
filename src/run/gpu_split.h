/* gpu_split.h — which GPU of this host trains which adapter of a `tandem finetune --gpus` run
 * (pure: no I/O, no device; tests/unit/test_gpu_split.c).
 *
 * One fused trainer process per GPU (a base per GPU), so the adapters are split into one group
 * per GPU, by longest-processing-time first (LPT) on the estimated work:
 *
 *   work(adapter) = estimated tokens = training samples x epochs x mean sample length (tokens,
 *                   after truncation to max_seq_len), measured on its data by the parent;
 *   finish(gpu)   = (work already on the GPU + work of the adapter) / speed(gpu);
 *
 * the adapters are taken from the most work to the least (ties: file order), and each goes to the
 * GPU where it would finish first among those whose group with it still fits (ties: the first
 * GPU of the list). "Fits" is the caller's answer (the memory plan, train/memory_plan.h: the
 * group's plan tdm_memory_plan_fit finds for the GPU's budget). An adapter no GPU can take fails
 * the plan with TDM_ERR_NEVER_FITS naming it. GPUs left without adapters start no process.
 * LPT makes the longest GPU at most 4/3 of the optimum on equal GPUs (Graham, 1969).
 */
#ifndef TANDEM_RUN_GPU_SPLIT_H
#define TANDEM_RUN_GPU_SPLIT_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

typedef struct tdm_split_gpu {
    const char *uuid;  /* for messages */
    double speed;      /* > 0: relative speed (cluster/speed.h); equal GPUs: 1 */
    int64_t budget_mb; /* what a run can get on it (for messages; the fit callback decides) */
} tdm_split_gpu;

/* Whether adapters[0..n) trained together in one process fit GPU gpu; *mb (may be NULL) gets
 * the MiB of that group's plan (for the printed plan and messages). */
typedef bool (*tdm_split_fits_fn)(const int *adapters, int n, int gpu, void *user, int64_t *mb,
                                  tdm_error *err);

typedef struct tdm_split_plan {
    int n_adapters, n_gpus;
    int *gpu_of;    /* (n_adapters) the GPU (index into the list) of each adapter */
    double *work;   /* (n_gpus) estimated tokens on each GPU */
    double *finish; /* (n_gpus) work / speed */
    int64_t *mb;    /* (n_gpus) the group's plan MiB (0: no adapters) */
    int *n_on;      /* (n_gpus) adapters on each GPU */
} tdm_split_plan;

/* Splits adapters with work[0..n_adapters) (>= 0) over gpus[0..n_gpus) as described above.
 * labels[a] (may be NULL) names adapter a in the message of one that fits nowhere. The fit
 * callback's error (status not TDM_ERR_NEVER_FITS) stops the plan. Free with tdm_split_plan_free
 * (also after an error). */
tdm_status tdm_split_plan_make(const double *work, int n_adapters, const tdm_split_gpu *gpus,
                               int n_gpus, tdm_split_fits_fn fits, void *user,
                               const char *const *labels, tdm_split_plan *out, tdm_error *err);
void tdm_split_plan_free(tdm_split_plan *p);

/* The adapters of GPU gpu in file order, as "I,J,K" (0-based) into buf (cap bytes); their
 * count. */
int tdm_split_plan_list(const tdm_split_plan *p, int gpu, char *buf, size_t cap);

#endif
