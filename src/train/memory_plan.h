/* memory_plan.h — the largest step of a run and the device memory it needs, from the adapters'
 * settings alone: pure arithmetic, no data, no device, no CUDA. One estimate for everyone who
 * sizes a run:
 *
 *   tandem finetune --vram auto   tdm_trainer_memory_estimate: each adapter's largest batch
 *                                 measured on its data (largest_batch_rows)
 *   tandem submit (placement)     tdm_run_placement_budget (run/placement_budget.h): the worst
 *                                 case, every sample max_seq_len tokens long (largest_batch_rows
 *                                 0), since the data is not read on the submitting host
 *
 * Both call tdm_run_memory_estimate, so a run whose samples all reach max_seq_len reserves
 * exactly what submit placed it with (tests/unit/test_memory_plan.c).
 */
#ifndef TANDEM_TRAIN_MEMORY_PLAN_H
#define TANDEM_TRAIN_MEMORY_PLAN_H
#include <stdbool.h>
#include <stdint.h>

#include "engine/model.h"
#include "model/config.h"
#include "util/error.h"

/* One adapter as the memory plan sees it. */
typedef struct tdm_plan_adapter {
    int rank;
    uint32_t targets; /* tdm_adapter_target bits (the same order as TDM_LORA_BIT) */
    int batch_size;   /* sequences per micro-batch */
    int max_seq_len;  /* tokens per sequence at most */
    double weight;    /* the synchronized schedule's weight (> 0) */
    /* rows of its largest batch (its batch_size longest samples, measured on the data); 0: the
     * worst case batch_size x max_seq_len */
    int64_t largest_batch_rows;
} tdm_plan_adapter;

/* LoRA parameters of one adapter: num_layers x sum over its targets of rank x (in + out). */
int64_t tdm_plan_adapter_params(const tdm_model_config *c, const tdm_plan_adapter *a);

/* The largest fused step of a run training ads[0..n): under the synchronized schedule every
 * adapter's largest batch in one pass (rows and sequences add up); otherwise one adapter per
 * step (the largest). */
void tdm_memory_plan_build(const tdm_model_config *c, const tdm_plan_adapter *ads, int n,
                           bool synchronized, tdm_model_mem_plan *out);

/* Device bytes by owner of that run (tdm_model_memory_estimate over tdm_memory_plan_build), plus
 * the partial-gradient copy (n_params f32) of each adapter that spreads its batches over global
 * steps: under synchronized, one weighted below the largest. act: the backend's activation dtype
 * (bf16 on CUDA, f32 on the CPU). The CUDA context is not included. */
tdm_status tdm_run_memory_estimate(const tdm_model_config *c, const tdm_model_opts *o,
                                   tdm_be_dtype act, const tdm_plan_adapter *ads, int n,
                                   bool synchronized, tdm_model_mem *out, tdm_error *err);

#endif
