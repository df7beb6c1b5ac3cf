/* placement_budget.h — the memory `tandem submit` places adapters with, from the same estimate
 * `tandem finetune --vram auto` reserves with (train/memory_plan.h):
 *
 *   GPU: for a process training k adapters, tdm_device_reservation_mb of
 *        tdm_run_memory_estimate(bf16 activations) = every owner rounded up to MiB + the CUDA
 *        context; with --vram GB, GB x 1024 whatever k (what each node's process reserves).
 *   CPU: tdm_device_cpu_need_mb of the same estimate with f32 activations and the CPU backend's
 *        scratch (engine/cpu/cpu_memory_plan.h): + TDM_CPU_PROCESS_MIB.
 *
 * The adapters are taken alike, each with the largest rank, batch size and max_seq_len of the
 * file (over the flags), the union of their targets, and a partial-gradient copy for all but one
 * when their weights differ; every sample is taken max_seq_len tokens long (submit does not read
 * the data). A process whose adapters are alike and whose samples reach max_seq_len therefore
 * reserves exactly [k]. gpu_min_mb[k] is the smallest plan --vram auto may shrink that process to
 * (tdm_memory_plan_fit: gradient checkpointing, micro-batch 1), so placement also takes a GPU too
 * small for [k] as asked; with --vram GB it is [k]. */
#ifndef TANDEM_RUN_PLACEMENT_BUDGET_H
#define TANDEM_RUN_PLACEMENT_BUDGET_H
#include <stddef.h>
#include <stdint.h>

#include "cluster/placement.h"
#include "model/config.h"
#include "run/run_options.h"
#include "train/adapters_config.h"
#include "util/error.h"

typedef struct tdm_run_budget {
    int64_t *gpu_mb, *cpu_mb; /* (n_adapters + 1): [k] for a process training k adapters */
    int64_t *gpu_min_mb;      /* (n_adapters + 1): [k], the smallest plan */
    size_t n_adapters;
    tdm_place_budget place; /* views of gpu_mb, cpu_mb, gpu_min_mb for tdm_place */
} tdm_run_budget;

/* Fills *out for the adapters of ac trained with the options ro (the flags submit passes on)
 * on a model with config mc. Errors: the estimate's, TDM_ERR_NOMEM. */
tdm_status tdm_run_placement_budget(const tdm_model_config *mc, const tdm_run_opts *ro,
                                    const tdm_adapters_config *ac, tdm_run_budget *out,
                                    tdm_error *err);
void tdm_run_budget_free(tdm_run_budget *b);

#endif
