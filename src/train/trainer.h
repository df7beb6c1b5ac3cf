/* trainer.h — the multi-adapter training loop behind `tandem finetune` (docs/finetune.md).
 *
 * One process loads the frozen base once (NF4 projections for qlora, the base precision for
 * lora) and trains N LoRA adapters, each with its own data, hyper-parameters, AdamW state, LR
 * schedule, clipping, step counter, data cursor and RNG. Per global step the schedule picks the
 * adapters that train:
 *   synchronized       every active adapter, fused into up to G passes (one model step
 *                      each; G: the largest grad_accum among the adapters at the largest
 *                      weight), each adapter with a share of weight / max weight (among the active
 *                      adapters) of its optimizer batch per global step: the max-weight adapters
 *                      put one micro-batch in each pass (in the first grad_accum of them: their
 *                      own) and step every global step; a lighter
 *                      adapter draws its whole batch at once, puts a credit-based piece of it in
 *                      each pass (credit += share * batch_size per pass, the whole part taken),
 *                      accumulates the gradient over global steps and steps when the batch is
 *                      done, so its trajectory is that of training alone (to float rounding)
 *   round-robin        one adapter per step, in turn
 *   priority-val-loss  the adapter with the highest latest validation loss (one not yet
 *                      evaluated first; without validation data its latest training loss)
 * One optimizer step of an adapter = up to grad_accum micro-batches of batch_size sequences,
 * never crossing an epoch boundary (the last batch and the last step of an epoch are short, as
 * with Hugging Face's DataLoader); the gradient is that of the summed token losses divided by the
 * counted tokens of the whole step. steps_per_epoch = ceil(ceil(n_train / batch_size) /
 * grad_accum); an adapter stops after epochs * steps_per_epoch steps and the others go on.
 *
 * Phases: tdm_trainer_create reads and validates every data file and the base model and writes
 * nothing; tdm_trainer_run writes OUT_DIRs (checkpoints, best/, records, final adapter).
 */
#ifndef TANDEM_TRAIN_TRAINER_H
#define TANDEM_TRAIN_TRAINER_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/backend.h"
#include "engine/model.h"
#include "tokenizer/chat_template.h"
#include "train/lora.h"
#include "train/lr_schedule.h"
#include "util/error.h"

typedef enum tdm_train_schedule {
    TDM_SCHEDULE_SYNCHRONIZED,
    TDM_SCHEDULE_ROUND_ROBIN,
    TDM_SCHEDULE_PRIORITY_VAL_LOSS,
} tdm_train_schedule;

/* "synchronized", "round-robin", "priority-val-loss"; parse returns false for other names. */
const char *tdm_train_schedule_name(tdm_train_schedule s);
bool tdm_train_schedule_parse(const char *name, tdm_train_schedule *out);

/* One adapter to train; every field resolved (command-line defaults already applied). */
typedef struct tdm_trainer_adapter {
    const char *data;         /* JSONL training data */
    const char *data_origin;  /* may be NULL: where data was named ("adapters.toml:7"), the
                                 prefix of an error reading it (not of its bad lines) */
    const char *output;       /* OUT_DIR (created when missing) */
    const char *label;        /* may be NULL: the data file's stem is used as task name */
    const char *init_adapter; /* PEFT dir to start from (its rank, alpha, targets and
                                 lora_dropout apply) or NULL */
    int rank;
    double alpha;
    bool use_rslora;
    uint32_t targets; /* tdm_adapter_target bits */
    /* LoRA dropout p in [0, 1) on every targeted module's input, training steps only (PEFT's
     * lora_dropout; 0: none). The mask of the piece of optimizer step k that follows the
     * batch's first d sequences is drawn from tdm_lora_dropout_seed(seed, k, d): a pure
     * function, so fused = alone and --resume repeat it without any stored state (and two
     * adapters at the same step and position draw the same masks, over their own data).
     * Recorded in adapter_config.json. */
    double lora_dropout;
    double lr;
    int epochs;
    int batch_size;
    int max_seq_len;
    double weight; /* > 0, synchronized schedule's share of each pass (relative to the largest) */
    /* Training options an adapter holds for itself (a finetune command gives all its adapters
     * the same; a joined adapter keeps its own command's, so it trains exactly as it would
     * alone). Defaults: tdm_trainer_adapter_default. */
    const char *task;         /* "instruct" */
    bool chat_template_given; /* false: detected from the base model's tokenizer */
    tdm_chat_template chat_template;
    bool train_on_prompt;
    bool skip_bad_lines;
    uint64_t seed;    /* LoRA init, data order, train/validation split, dropout masks */
    bool shuffle;     /* false: file order every epoch */
    double val_split; /* [0, 1) */
    int grad_accum;   /* micro-batches per optimizer step, 1..64 */
    double weight_decay;
    double max_grad_norm; /* 0 = no clipping */
    tdm_lr_kind lr_kind;
    int64_t warmup_steps;
    /* counted in the adapter's own global steps (from the boundary where it joined) */
    int64_t eval_every; /* 0 = only when it finishes */
    int64_t save_every; /* 0 = only when it finishes (capped by opts.max_checkpoint_interval) */
    int64_t log_every;  /* >= 1 */
    int save_total_limit; /* > 0: keep its last N checkpoints (best/ apart); 0: all */
} tdm_trainer_adapter;

/* The defaults of `tandem finetune` for the training options above (docs/finetune.md); the
 * other fields are left as they are. */
void tdm_trainer_adapter_default(tdm_trainer_adapter *a);

/* What the trainer reports to its caller (the CLI draws progress from it). */
typedef enum tdm_trainer_event {
    TDM_TRAINER_EVENT_STEP,    /* the adapter took an optimizer step */
    TDM_TRAINER_EVENT_LOG,     /* a --log-every point: loss is the mean since the previous log */
    TDM_TRAINER_EVENT_EVAL,    /* val_loss was measured */
    TDM_TRAINER_EVENT_DONE,    /* the adapter finished; its final adapter is written */
    TDM_TRAINER_EVENT_RESUMED, /* --resume: the adapter starts from checkpoint (already done
                                  when its checkpoint is its final one) */
} tdm_trainer_event;

typedef struct tdm_trainer_progress {
    tdm_trainer_event event;
    int adapter;
    const char *label;
    int64_t global_step;
    int64_t step, total_steps; /* the adapter's optimizer steps */
    double epoch;              /* fractional epochs done */
    int epochs;
    double loss;            /* latest step's (STEP) or mean since the last log (LOG) */
    double learning_rate;   /* used by the latest step */
    double grad_norm;       /* latest, before clipping */
    double val_loss;        /* latest, NaN before the first evaluation */
    double tokens_per_sec;  /* the adapter's counted tokens per second of training so far */
    double eta_sec;         /* estimated seconds until this adapter finishes */
    const char *checkpoint; /* RESUMED: the checkpoint directory loaded, else NULL */
    bool done;              /* the adapter has finished (RESUMED: finished before this run) */
} tdm_trainer_progress;

typedef void (*tdm_trainer_progress_fn)(const tdm_trainer_progress *p, void *user);

/* One fused forward + backward pass of a global step, as the on_pass hook sees it (tests check
 * the synchronized schedule's shares with it). */
typedef struct tdm_trainer_pass {
    int64_t global_step; /* the global step the pass belongs to, from 1 */
    int pass;            /* index within the global step, from 0 (at most G passes, above) */
    int n_adapters;
    const int *seqs;     /* (n_adapters) sequences each adapter put in the pass */
    const int64_t *rows; /* (n_adapters) rows (tokens) each adapter put in the pass */
} tdm_trainer_pass;

typedef void (*tdm_trainer_pass_fn)(const tdm_trainer_pass *p, void *user);

struct tdm_trainer;

typedef struct tdm_trainer_opts {
    /* run-wide: what one fused trainer cannot hold per adapter (the per-adapter training
     * options are in tdm_trainer_adapter) */
    const char *model_dir;
    bool nf4;          /* --method qlora */
    bool double_quant; /* with nf4 */
    bool grad_checkpoint;
    tdm_recompute recompute;  /* --recompute: what checkpointing recomputes */
    bool offload_activations; /* --offload-activations: layer inputs in host memory */
    bool base_fp8;            /* --base-compute fp8: the NF4 projections' GEMMs in FP8 */
    tdm_train_schedule schedule;
    bool resume;
    int max_checkpoint_interval; /* > 0: save_every is capped to it (MPS: 100) */
    tdm_trainer_progress_fn progress;
    void *progress_user;
    tdm_trainer_pass_fn on_pass; /* may be NULL: called after each fused training pass */
    void *on_pass_user;
    /* May be NULL. Asked before each global step (never inside one): true stops the run there
     * with a checkpoint of every unfinished adapter (tdm_trainer_run returns TDM_ERR_STOPPED).
     * The CLI answers from a flag its SIGINT/SIGTERM/SIGUSR1 handlers set. */
    bool (*stop_requested)(void *user);
    void *stop_requested_user;
    /* May be NULL. Called by tdm_trainer_run at every step boundary (before the first step and
     * between two global steps, never inside one), where the caller may add adapters
     * (tdm_trainer_add_adapters) and detach them (tdm_trainer_detach_adapter): co-training's
     * host takes its joiners' requests here. A non-OK return ends the run with that error. */
    tdm_status (*at_step_boundary)(struct tdm_trainer *t, void *user, tdm_error *err);
    void *at_step_boundary_user;
} tdm_trainer_opts;

/* The defaults of `tandem finetune` (docs/finetune.md). */
void tdm_trainer_opts_default(tdm_trainer_opts *o);

typedef struct tdm_trainer tdm_trainer;

/* Validates options, reads config.json and every adapter's data file completely (tokenized,
 * split; bad lines fail the whole call unless skip_bad_lines) and resolves --init-adapter
 * configs. Writes nothing and touches no device. On TDM_ERR_PARSE from the data, *report (when
 * not NULL) receives the malloc'd "FILE:LINE[:COL]: reason" lines of every file with bad lines
 * (the caller frees it). Strings of opts and adapters must outlive the trainer. */
tdm_status tdm_trainer_create(tdm_trainer **out, const tdm_trainer_opts *opts,
                              const tdm_trainer_adapter *adapters, int n_adapters, char **report,
                              tdm_error *err);

/* The device memory training will use on the CUDA backend (bf16 activations), by owner,
 * computed before any device exists (tdm_model_memory_estimate): the frozen weights (NF4 or
 * dense), every adapter's params + grads + AdamW moments (+ a partial-gradient copy for each
 * adapter weighted below the largest under the synchronized schedule), the workspace of the largest
 * fused step (per adapter its batch_size longest samples, at most batch_size * max_seq_len rows;
 * all adapters together under the synchronized schedule; one layer's worth with grad_checkpoint)
 * and the backend's scratch. The CUDA context is not included. */
tdm_status tdm_trainer_memory_estimate(const tdm_trainer *t, tdm_model_mem *out, tdm_error *err);
/* The same on the CPU backend (f32 activations, its own kept scratch:
 * engine/cpu/cpu_memory_plan.h). */
tdm_status tdm_trainer_cpu_memory_estimate(const tdm_trainer *t, tdm_model_mem *out,
                                           tdm_error *err);

/* The memory plan (train/memory_plan.h) that fits budget_mb (MiB, context_mb included), for this
 * trainer's adapters measured on their data, its options (--grad-checkpoint as the user gave it)
 * and its --grad-accum, with activations of act (TDM_BE_BF16 for the CUDA backend, TDM_BE_F32
 * for the CPU's): tdm_memory_plan_fit. Call it before tdm_trainer_set_memory_plan. */
struct tdm_memory_fit;
tdm_status tdm_trainer_memory_fit(const tdm_trainer *t, tdm_be_dtype act, int64_t budget_mb,
                                  int64_t context_mb, struct tdm_memory_fit *out, tdm_error *err);

/* tdm_trainer_memory_fit for the adapters subset[0..n_subset) of t alone (indices into t's
 * adapters): the plan a process training only them would choose (`finetune --gpus` asks it of
 * each GPU's group, run/gpu_split.h). */
tdm_status tdm_trainer_memory_fit_subset(const tdm_trainer *t, const int *subset, int n_subset,
                                         int64_t budget_mb, int64_t context_mb,
                                         struct tdm_memory_fit *out, tdm_error *err);

/* Adapter a's estimated work in tokens: its training samples x epochs x their mean length
 * (tokens after truncation to max_seq_len), i.e. the sum of its training samples' lengths x
 * epochs. */
double tdm_trainer_adapter_work(const tdm_trainer *t, int a);

/* Applies a memory plan: gradient checkpointing and its recompute mode, and split k >= 1: every
 * adapter's pass takes at most ceil(batch_size / k) sequences of its optimizer batch, in up to
 * grad_accum x k passes per global step (training and
 * validation). The optimizer batches, the data order, the steps, the schedule, the checkpoints
 * and records are those of k = 1; the gradient of a batch is the same sum over its tokens, so
 * the result equals k = 1 to float rounding (with LoRA dropout the masks of the pieces differ:
 * each piece draws from its position in the batch). tdm_trainer_memory_estimate and the
 * workspace attach reserves follow the plan. After attach (a co-training host re-planning for a
 * join, between two steps: at_step_boundary) the model switches checkpointing
 * (tdm_model_set_grad_checkpoint) and the activation workspace is fitted to the unfinished
 * adapters' largest step under the new plan: given back when smaller, allocated at once when
 * larger (TDM_ERR_NOMEM then, with the plan before restored). TDM_ERR_INVALID for k out of
 * range. */
tdm_status tdm_trainer_set_memory_plan(tdm_trainer *t, bool grad_checkpoint,
                                       tdm_recompute recompute, int split, tdm_error *err);
/* Whether the plan in use checkpoints gradients. */
bool tdm_trainer_grad_checkpoint(const tdm_trainer *t);
/* Its recompute mode (meaningful with checkpointing). */
tdm_recompute tdm_trainer_recompute(const tdm_trainer *t);
/* The split in use (1 unless tdm_trainer_set_memory_plan chose another). */
int tdm_trainer_split(const tdm_trainer *t);

/* Loads the frozen base onto be (which must outlive the trainer) and allocates every adapter's
 * device state. The first call that allocates device memory. */
tdm_status tdm_trainer_attach(tdm_trainer *t, tdm_backend *be, tdm_error *err);
void tdm_trainer_free(tdm_trainer *t);
/* The base attach loaded (NULL before), e.g. for tdm_model_get_load_times. */
const struct tdm_model *tdm_trainer_model(const tdm_trainer *t);

/* Per-adapter numbers known after create: training / validation samples and optimizer steps. */
void tdm_trainer_adapter_info(const tdm_trainer *t, int a, int64_t *n_train, int64_t *n_val,
                              int64_t *total_steps);

/* Adapter a's optimizer steps taken so far and whether it has finished. */
void tdm_trainer_adapter_position(const tdm_trainer *t, int a, int64_t *step, bool *done);

/* The global steps taken (the run's position, for messages). */
int64_t tdm_trainer_global_step(const tdm_trainer *t);

/* Trains to the end (or, with opts.resume, from the latest checkpoint that every adapter has,
 * or from scratch when there is none; each adapter's checkpoint is reported as a RESUMED event
 * first). OUT_DIRs are created; a fresh run refuses an OUT_DIR that already holds checkpoints
 * (TDM_ERR_INVALID: resume or remove them), and --resume refuses a checkpoint trained with
 * another rank, targets, LoRA dropout or learning-rate schedule (peak lr, kind, warmup, total
 * steps). When opts.stop_requested answers true before a global step, every unfinished
 * adapter's checkpoint is written at its current position (unless no step was taken since the
 * start or the resume point, whose checkpoints already hold it) and TDM_ERR_STOPPED returned:
 * --resume continues exactly as if the run had not stopped. */
tdm_status tdm_trainer_run(tdm_trainer *t, tdm_error *err);

/* Adds adapters to an attached trainer (from opts.at_step_boundary, or before tdm_trainer_run).
 * They are validated and their data read exactly as tdm_trainer_create does (on TDM_ERR_PARSE,
 * *report receives the "FILE:LINE[:COL]: reason" lines), their OUT_DIRs prepared (one holding
 * checkpoints is refused: they start fresh) and their device state allocated; any error leaves
 * the running adapters untouched. Each then trains exactly as it would alone: its own data
 * order, epochs, schedule position from 0, optimizer, dropout masks, checkpoints, records and
 * PEFT output; its log/eval/save points and the global step its checkpoints record count from
 * the boundary where it joined, so --resume of it alone continues it. Their indices are
 * *first.. *first + n_adapters - 1; they keep their own training options (seed, grad_accum, LR
 * schedule, ...: tdm_trainer_adapter), run-wide ones (opts) are the trainer's. The activation
 * workspace grows to the larger fused step (tdm_model_reserve): TDM_ERR_NOMEM when that does
 * not fit (the new adapters are then detached, untrained). */
tdm_status tdm_trainer_add_adapters(tdm_trainer *t, const tdm_trainer_adapter *adapters,
                                    int n_adapters, int *first, char **report, tdm_error *err);

/* As tdm_trainer_add_adapters, but each adapter continues from its latest checkpoint, as
 * `--resume` of a command of these adapters alone would: the latest global step (of their own)
 * that all of them saved, each checkpoint checked against its adapter (rank, targets, dropout,
 * schedule) and reported as a RESUMED event; their own global step continues from there, so
 * their later checkpoints are those of the uninterrupted run. No checkpoint at all: they start
 * fresh. One whose checkpoint is its final one is added done (it trains no more). */
tdm_status tdm_trainer_add_adapters_resume(tdm_trainer *t, const tdm_trainer_adapter *adapters,
                                           int n_adapters, int *first, char **report,
                                           tdm_error *err);

/* tdm_trainer_add_adapters in two halves, for a caller that must make room for the adapters in
 * between (a co-training host growing its ledger reservation):
 *   prepare   validates them and reads their data (no device, nothing written, the running
 *             adapters untouched): the errors and *report of add_adapters; resume records that
 *             commit continues them as tdm_trainer_add_adapters_resume does;
 *   estimate  the memory estimate (tdm_trainer_memory_estimate's plan, with activations of
 *             act: TDM_BE_BF16 on a GPU, TDM_BE_F32 on the CPU) of the unfinished adapters of t
 *             together with j's (j NULL: without them), so the difference of the two is what the
 *             join adds;
 *   commit    the rest of add_adapters (device state, OUT_DIRs, into the trainer) or, with
 *             resume, of add_adapters_resume (their checkpoints loaded, RESUMED reported);
 *             always frees j. */
typedef struct tdm_trainer_join tdm_trainer_join;
tdm_status tdm_trainer_join_prepare(const tdm_trainer *t, const tdm_trainer_adapter *adapters,
                                    int n_adapters, bool resume, tdm_trainer_join **out,
                                    char **report, tdm_error *err);
tdm_status tdm_trainer_join_estimate(const tdm_trainer *t, const tdm_trainer_join *j,
                                     tdm_be_dtype act, tdm_model_mem *out, tdm_error *err);
/* The memory admission of j (tdm_memory_plan_admit, train/memory_plan.h): the fit of the
 * unfinished adapters of t together with j's, measured on their data, under t's options with
 * --grad-checkpoint as the user gave it; req's reservation, plan, growable and capacity MiB and
 * its fit's act (TDM_BE_BF16 on a GPU, TDM_BE_F32 on the CPU), context_mb and scratch_floor are
 * the caller's (the rest of req->fit is ignored).
 * Apply the answer's plan with tdm_trainer_set_memory_plan before the commit. */
struct tdm_join_admit_request;
struct tdm_join_admission;
tdm_status tdm_trainer_join_admit(const tdm_trainer *t, const tdm_trainer_join *j,
                                  const struct tdm_join_admit_request *req,
                                  struct tdm_join_admission *out, tdm_error *err);
tdm_status tdm_trainer_join_commit(tdm_trainer *t, tdm_trainer_join *j, int *first,
                                   tdm_error *err);

/* After adapters left: whether the plan of t's unfinished adapters goes back to a faster one
 * within the reservation held (tdm_memory_plan_after_leave, train/memory_plan.h), measured on
 * their data, with --grad-checkpoint and --recompute as the user gave them and the plan in use
 * (the rest of req is the caller's: reservation_mb, plan_mb, fit.act, fit.context_mb,
 * fit.scratch_floor). Apply a faster answer with tdm_trainer_set_memory_plan. TDM_ERR_INVALID
 * when no adapter is training. */
struct tdm_leave_replan_request;
struct tdm_leave_replan;
tdm_status tdm_trainer_leave_replan(const tdm_trainer *t,
                                    const struct tdm_leave_replan_request *req,
                                    struct tdm_leave_replan *out, tdm_error *err);
void tdm_trainer_join_free(tdm_trainer_join *j);

/* Gives back the device memory of adapters that left (finished or detached): their device
 * state, and the part of the activation workspace beyond the largest step of the adapters still
 * training (tdm_model_fit; the backend's scratch stays). Call between steps (at_step_boundary). */
tdm_status tdm_trainer_shrink(tdm_trainer *t, tdm_error *err);

/* Checkpoints adapter a at its position (what a stop writes: --resume continues it exactly) and
 * stops training it; its device state is freed. It counts as done from then on
 * (tdm_trainer_adapter_position) and tdm_trainer_adapter_detached tells it apart from a finished
 * one. Nothing happens to an adapter already done or detached. */
tdm_status tdm_trainer_detach_adapter(tdm_trainer *t, int a, tdm_error *err);
bool tdm_trainer_adapter_detached(const tdm_trainer *t, int a);

/* Adapters in the trainer, joined and detached ones included. */
int tdm_trainer_adapter_count(const tdm_trainer *t);

/* Token-weighted mean cross-entropy of samples idx[0..n) of a dataset loaded for the model, with
 * the adapter params (NULL: the bare base), batch_size sequences per forward. */
struct tdm_dataset;
struct tdm_model;
tdm_status tdm_trainer_evaluate(struct tdm_model *m, const tdm_lora_params *params,
                                const struct tdm_dataset *ds, const uint32_t *idx, uint32_t n,
                                int batch_size, double *loss_sum, int64_t *tokens, tdm_error *err);

#endif
