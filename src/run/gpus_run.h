/* gpus_run.h — the plan of `tandem finetune --gpus all|N|UUID,UUID` (docs/finetune.md, "Several
 * GPUs"): which GPUs, and which adapters each GPU's process trains.
 *
 *     --gpus -> the GPUs (the inventory, CUDA_VISIBLE_DEVICES applied; each one's budget as a run
 *     alone can get it, tdm_device_alone_mb) -> the adapter list -> trainer create (every data
 *     file read and checked, as a finetune does; nothing written, no device) -> each adapter's
 *     estimated tokens (tdm_trainer_adapter_work) -> the split (run/gpu_split.h: LPT, each GPU's
 *     group checked with the memory plan that group's process would choose for that budget,
 *     tdm_trainer_memory_fit_subset; with --vram GB every process reserves GB)
 *
 * The plan depends only on the data, the options and the GPUs' budgets, not on what runs now, so
 * `--resume` with the same command finds the same groups (whose checkpoints are per group).
 * Library code: nothing is printed and nothing is started; src/cli/finetune_gpus.c runs it.
 */
#ifndef TANDEM_RUN_GPUS_RUN_H
#define TANDEM_RUN_GPUS_RUN_H
#include <stdint.h>

#include "run/gpu_split.h"
#include "run/run_options.h"
#include "util/error.h"

typedef struct tdm_gpus_gpu {
    char uuid[96], name[96];
    int index;         /* the inventory's (NVML) index, for display */
    int64_t budget_mb; /* what a run alone can get on it */
    double speed;      /* cluster/speed.h factor of its name */
} tdm_gpus_gpu;

typedef struct tdm_gpus_plan {
    tdm_gpus_gpu *gpus; /* (n_gpus) the GPUs --gpus names, in its order */
    int n_gpus;
    int n_adapters;
    char **labels;    /* (n_adapters) the adapter's label, else its OUT_DIR */
    char **data;      /* (n_adapters) its data file */
    double *work;     /* (n_adapters) estimated tokens */
    int64_t *n_train; /* (n_adapters) training samples */
    tdm_split_plan split;
} tdm_gpus_plan;

/* Parses a --gpus value against the GPUs of inv (budgets budget_mb, from tdm_device_gpu_budgets):
 * "all" every GPU; N (1..) the first N; otherwise a comma list of UUIDs (or NVML indices, or
 * UUID prefixes naming one GPU: tdm_inventory_find). Fills out->gpus / n_gpus. Errors
 * (TDM_ERR_INVALID): an empty or malformed value, N above the GPUs there are, an unknown or
 * repeated GPU, naming what `tandem gpu status` lists. Pure (no I/O). */
struct tdm_inventory;
tdm_status tdm_gpus_parse(const char *spec, const struct tdm_inventory *inv,
                          const int64_t *budget_mb, tdm_gpus_plan *out, tdm_error *err);

/* Makes the plan of o (o->gpus set, o->trainer.model_dir set): the steps of the header comment.
 * Errors: --device cpu with --gpus, the GPUs' (tdm_device_gpu_budgets, tdm_gpus_parse), the
 * adapter list's, the data's (TDM_ERR_PARSE with *bad_lines, as tdm_run_finetune), an adapter
 * that fits on no GPU (TDM_ERR_NEVER_FITS). o->adapter_args' strings are split in place. */
tdm_status tdm_gpus_plan_make(tdm_run_opts *o, tdm_gpus_plan *out, char **bad_lines,
                              tdm_error *err);
void tdm_gpus_plan_free(tdm_gpus_plan *p);

#endif
