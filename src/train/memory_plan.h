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
#include <stddef.h>
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
    /* May be NULL. Its longest samples' lengths in tokens, longest first (n_longest of them, at
     * most batch_size: the data's samples when fewer): the rows of a micro-batch of m sequences
     * are then the sum of the first m, at most m x max_seq_len. NULL: min(largest_batch_rows,
     * m x max_seq_len), the worst case when largest_batch_rows is 0. */
    const int32_t *longest;
    int n_longest;
    /* sequences per pass (the micro-batch), 1..batch_size; 0: batch_size. tdm_memory_plan_fit
     * sets it to ceil(batch_size / split). */
    int micro_batch;
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

/* The MiB a run of memory e reserves: every owner rounded up to MiB, plus context_mb (the CUDA
 * context, TDM_CUDA_CONTEXT_MIB in run/device_open.h: tdm_device_reservation_mb). */
int64_t tdm_memory_plan_mb(const tdm_model_mem *e, int64_t context_mb);

/* ---- a plan that fits a budget (--vram auto; co-training's admission) ----------------------
 *
 * A run's plans, in the order tdm_memory_plan_fit tries them:
 *   1. as asked: grad checkpointing as the options say, every adapter's micro-batch its
 *      batch_size;
 *   2. gradient checkpointing recomputing only the norms and q/k/v (TDM_RECOMPUTE_ATTN; skipped
 *      when the options ask for checkpointing or for that mode);
 *   3. gradient checkpointing in the options' recompute mode (skipped when the options already
 *      ask for it);
 *   4. gradient checkpointing (the options' mode) and split k = 2, 3, ...: every adapter's
 *      micro-batch ceil(batch_size / k), and up to grad_accum x k passes per optimizer step, so each
 *      optimizer batch (batch_size x grad_accum sequences) is the same, only computed in smaller
 *      pieces (the trainer's result is equal to float rounding; with LoRA dropout the masks
 *      differ); a k whose micro-batches equal the previous k's is skipped, down to k =
 *      max batch_size (micro-batch 1 everywhere): the smallest plan.
 * The first whose MiB (tdm_memory_plan_mb) is at most budget_mb is chosen. */
typedef enum tdm_plan_rung {
    TDM_PLAN_AS_ASKED = 0,
    TDM_PLAN_GRAD_CHECKPOINT = 1,
    TDM_PLAN_MICRO_BATCH = 2,
    TDM_PLAN_RECOMPUTE_ATTN = 3, /* checkpointing that recomputes only norms and q/k/v */
} tdm_plan_rung;

typedef struct tdm_memory_fit_request {
    const tdm_model_config *config;
    tdm_model_opts opts; /* nf4, double_quant; grad_checkpoint: the user's (--grad-checkpoint) */
    tdm_be_dtype act;    /* TDM_BE_BF16 on CUDA */
    const tdm_plan_adapter *adapters; /* their micro_batch is ignored */
    int n_adapters;
    bool synchronized;
    int grad_accum;     /* the run's --grad-accum (>= 1) */
    int64_t context_mb; /* added to every plan (TDM_CUDA_CONTEXT_MIB on a GPU) */
    int64_t budget_mb;  /* what the run can get */
    /* every plan's backend scratch is counted at least this (a running co-training host's
     * scratch only grows: tdm_be_reserve_scratch never gives it back); 0 for a new run */
    uint64_t scratch_floor;
} tdm_memory_fit_request;

typedef struct tdm_memory_plan_choice {
    tdm_plan_rung rung;
    bool grad_checkpoint;
    tdm_recompute recompute; /* with grad_checkpoint: what is recomputed */
    int split;               /* k: every micro-batch is ceil(batch_size / k); 1: none */
    int micro_batch;         /* adapter 0's micro-batch, ceil(batch_size / split) */
    int batch_size;          /* adapter 0's batch_size */
    bool alike;              /* every adapter has that batch_size */
    int grad_accum;          /* passes per optimizer step at most: the run's grad_accum x split */
    int64_t mb;              /* tdm_memory_plan_mb of est */
    tdm_model_mem est;
} tdm_memory_plan_choice;

typedef struct tdm_memory_fit {
    bool fits;                       /* a plan of at most budget_mb exists: chosen is it */
    tdm_memory_plan_choice chosen;   /* fits: the first that fits; else the smallest */
    tdm_memory_plan_choice asked;    /* the plan as asked (rung 0) */
    tdm_memory_plan_choice smallest; /* grad checkpointing, micro-batch 1: the least it needs */
    int n_tried;                     /* plans whose MiB was computed */
} tdm_memory_fit;

/* Chooses the plan (above) for req->budget_mb. Pure arithmetic, no device: the co-training host
 * calls it with its adapters and a joiner's for admission. Errors: the estimate's
 * (TDM_ERR_INVALID for impossible shapes); a budget that nothing fits is not an error (fits
 * false, smallest.mb the budget it would need). */
tdm_status tdm_memory_plan_fit(const tdm_memory_fit_request *req, tdm_memory_fit *out,
                               tdm_error *err);

/* ---- a join's admission (the co-training host, docs/co-training.md "Memory admission") ------
 *
 * A host trains a plan of plan_mb MiB in a reservation of reservation_mb (equal under --vram
 * auto; --vram GB adds its slack, reservation - plan, which stays). A join asks for the plan of
 * the host's unfinished adapters together with the joiner's: the first of tdm_memory_plan_fit's
 * plans whose reservation fits growable_mb (the most the reservation can be now: what the ledger
 * may reserve on the GPU while the memory held outside it stays held, minus the other
 * reservations there), else the smallest. That plan's reservation, target_mb = reservation_mb +
 * plan.mb - plan_mb, is what the host resizes to (through the ledger, FIFO, before anything is
 * allocated); it may be less than reservation_mb (the host's own adapters re-planned with
 * gradient checkpointing). */
typedef struct tdm_join_admit_request {
    tdm_memory_fit_request fit; /* the host's unfinished adapters then the joiner's; its budget_mb
                                   is set from growable_mb */
    int64_t reservation_mb; /* the host's reservation now */
    int64_t plan_mb;        /* the MiB of the plan the host trains now */
    int64_t growable_mb;    /* the most the reservation can be now; < 0: unknown (no limit) */
    int64_t capacity_mb;    /* the most it can ever be: the GPU's reservable capacity; < 0: unknown */
} tdm_join_admit_request;

typedef enum tdm_join_admit_kind {
    TDM_JOIN_ADMIT = 0,      /* plan (the first that fits growable_mb): resize to target_mb */
    TDM_JOIN_WAIT = 1,       /* nothing fits now: plan is the smallest, resize to target_mb and
                                wait for the ledger (memory others hold must be freed) */
    TDM_JOIN_NEVER_FITS = 2, /* even the smallest needs more than capacity_mb (need_mb) */
} tdm_join_admit_kind;

typedef struct tdm_join_admission {
    tdm_join_admit_kind kind;
    tdm_memory_fit fit;
    tdm_memory_plan_choice plan; /* ADMIT: fit.chosen; WAIT, NEVER_FITS: fit.smallest */
    int64_t target_mb;           /* the reservation plan needs (>= 1) */
    int64_t need_mb;             /* the least reservation the join needs (the smallest plan's) */
    int64_t budget_mb;           /* the plan budget the fit was given (-1: no limit) */
} tdm_join_admission;

/* Decides a join's admission (above). Pure arithmetic, no device, no ledger. Errors: the fit's. */
tdm_status tdm_memory_plan_admit(const tdm_join_admit_request *req, tdm_join_admission *out,
                                 tdm_error *err);

/* ---- back to a faster plan after adapters left (the co-training host, docs/co-training.md
 * "Memory admission") -------------------------------------------------------------------------
 *
 * A host that re-planned for a join (checkpointing, a --recompute rung, micro-batches) trains
 * that plan, of plan_mb MiB, in a reservation of reservation_mb (their difference: --vram GB's
 * slack, which stays). When adapters leave, the plan of those still training may be faster
 * within what the reservation holds now, before anything is released: the first of
 * tdm_memory_plan_fit's plans (fit: the adapters still training, --grad-checkpoint and
 * --recompute as the user gave them: never a plan faster than the user's flags ask for) of at
 * most reservation_mb - slack = plan_mb MiB. It is taken only when it comes before the plan in
 * use (grad_checkpoint, recompute, split) in that order and changes what a step computes (a
 * split whose micro-batches are the plan in use's is not faster); its reservation is target_mb =
 * plan.mb + slack, and the host releases the rest. */
typedef struct tdm_leave_replan_request {
    tdm_memory_fit_request fit; /* the adapters still training; its budget_mb is set here */
    int64_t reservation_mb;     /* the host's reservation now, nothing released yet */
    int64_t plan_mb;            /* the MiB of the plan in use, with the adapters that left */
    bool grad_checkpoint;       /* the plan in use */
    tdm_recompute recompute;
    int split;
} tdm_leave_replan_request;

typedef struct tdm_leave_replan {
    bool faster; /* plan is faster than the plan in use and fits: switch to it */
    tdm_memory_plan_choice plan;    /* the first that fits (fits false: the smallest) */
    tdm_memory_plan_choice current; /* the plan in use, for the adapters still training */
    tdm_memory_fit fit;
    int64_t budget_mb; /* the plan budget the fit was given: reservation_mb - slack */
    int64_t target_mb; /* the reservation plan needs (faster), else current's */
} tdm_leave_replan;

/* Decides whether the plan goes back (above). Pure arithmetic. Errors: the fit's;
 * TDM_ERR_INVALID for a split < 1. */
tdm_status tdm_memory_plan_after_leave(const tdm_leave_replan_request *req,
                                       tdm_leave_replan *out, tdm_error *err);

/* A phrase for one line of output, written to buf (cap bytes): "the plan as asked", "gradient
 * checkpointing", "gradient checkpointing and micro-batch 2 x accumulation 4 (optimizer batch 4
 * x 2 unchanged)" (adapters of different batch sizes: "micro-batches of batch_size / 2"). */
void tdm_memory_plan_describe(const tdm_memory_plan_choice *c, char *buf, size_t cap);

#endif
