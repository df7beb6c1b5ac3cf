/* checkpoint.h — checkpoints for exact resume, best/, retention, and finding the latest one.
 *
 * Layout (all under an adapter's OUT_DIR; docs/checkpoints.md has every field):
 *   OUT_DIR/checkpoint-STEP/            STEP = the adapter's optimizer steps taken, decimal
 *       adapter_config.json             PEFT (train/peft_io.h)
 *       adapter_model.safetensors       PEFT, F32
 *       optimizer.safetensors           AdamW moments, F32, one pair per LoRA tensor:
 *                                       "<PEFT tensor name>.exp_avg", "<...>.exp_avg_sq", same
 *                                       shape as the tensor; __metadata__ {"format":
 *                                       "tandem-adamw", "version": "1", "step": "<t>"}
 *       grad_accum.safetensors          optional: the gradient accumulated so far of an
 *                                       optimizer batch in progress, F32, one tensor per LoRA
 *                                       tensor under its PEFT name; __metadata__ {"format":
 *                                       "tandem-grad-accum", "version": "1", "step": "<STEP>"}
 *       trainer_state.json              optional: the caller's Trainer-style state at this step
 *       tandem_state.json               written last: {"format": "tandem-checkpoint",
 *                                       "version": 2, "step", "epoch", "schedule": {...},
 *                                       "rng": {...}, "data_cursor": <caller's JSON>,
 *                                       "trainer": {tdm_trainer_ckpt, every key required},
 *                                       "trained_on": {tdm_checkpoint_trained_on},
 *                                       "files": [...]}
 *   OUT_DIR/best/                       PEFT adapter with the lowest validation loss so far,
 *                                       plus best.json {"step", "metric", "value"}
 *
 * Atomicity: a checkpoint is built in OUT_DIR/.checkpoint-STEP.tmp-PID, every file fsynced, the
 * directory fsynced, then renamed to checkpoint-STEP and OUT_DIR fsynced (util/atomic_dir.h).
 * So a directory named checkpoint-STEP is always complete; a crash leaves at most a scratch
 * directory, which tdm_atomic_dir_remove_stale(OUT_DIR) deletes. best/ is replaced the same way
 * (swapped in one rename). Retention deletes a checkpoint by renaming it to a scratch name first.
 *
 * The data layer's position is opaque here: the caller passes any JSON value as data_cursor and
 * gets it back on load.
 */
#ifndef TANDEM_TRAIN_CHECKPOINT_H
#define TANDEM_TRAIN_CHECKPOINT_H
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/config.h"
#include "train/adamw.h"
#include "train/lora.h"
#include "train/lr_schedule.h"
#include "train/peft_io.h"
#include "util/error.h"
#include "util/rng.h"
#include "util/sha256.h"

#define TDM_CHECKPOINT_PREFIX "checkpoint-"
#define TDM_CHECKPOINT_STATE_FILE "tandem_state.json"
#define TDM_CHECKPOINT_OPTIMIZER_FILE "optimizer.safetensors"
#define TDM_CHECKPOINT_GRAD_FILE "grad_accum.safetensors"
#define TDM_CHECKPOINT_TRAINER_STATE_FILE "trainer_state.json"
#define TDM_BEST_DIR "best"
#define TDM_BEST_FILE "best.json"

/* Version of tandem_state.json this tandem writes and reads (2: the trainer's state is the
 * typed "trainer" object, every key required). */
#define TDM_CHECKPOINT_VERSION 2

/* The trainer's own state of one adapter at a checkpoint: tandem_state.json's "trainer" object,
 * one key per field (docs/checkpoints.md). Loading requires every key with its JSON type:
 * integers, booleans, numbers; the fields marked "NaN: null" are written as null while unknown
 * (no validation yet, no step yet) and read back as NaN. */
typedef struct tdm_trainer_ckpt {
    int64_t global_step;    /* fused passes of the whole run when it was taken */
    int64_t rr_next;        /* round-robin: the adapter whose turn is next */
    bool done;              /* the adapter finished its epochs (a final checkpoint) */
    double credit;          /* synchronized, weight below the largest: sequences owed (NaN: null) */
    double last_val;        /* last validation loss (NaN: null) */
    double last_train_loss; /* last optimizer step's mean loss (NaN: null) */
    double last_grad_norm;  /* (NaN: null) */
    double last_lr;         /* (NaN: null) */
    int64_t tokens_seen, samples_seen;
    double epoch_loss_sum; /* loss sum of the epoch in progress (finite) */
    int64_t epoch_tokens;
    double last_epoch_loss; /* mean loss of the last full epoch (NaN: null) */
    double log_loss_sum;    /* loss sum since the last log line (finite) */
    int64_t log_tokens;
    bool log_due;            /* a --log-every point passed since its last log line */
    int64_t metrics_lines;   /* lines of metrics.jsonl written up to this checkpoint */
    int64_t eval_step;       /* the adapter's step at its latest validation, -1 before one */
    char train_schedule[32]; /* the run's --schedule name, for the warning when a resume differs */
    /* an optimizer batch in progress (its partial gradient is grad_accum.safetensors): "piece"
     * {"seqs_done", "loss_sum"}, or null */
    bool in_piece;
    int64_t piece_seqs_done;
    double piece_loss_sum;
} tdm_trainer_ckpt;

/* What an adapter trained on, saved with each checkpoint so that it describes itself and
 * --resume can refuse a run that would go on with other data or another base
 * (tandem_state.json's "trained_on" object; docs/checkpoints.md). Checkpoints written before
 * tandem recorded it lack the object: known is then false. */
typedef struct tdm_checkpoint_trained_on {
    bool known;
    char data_file[4096];                  /* the data file as its run named it (for messages) */
    char data_hash[TDM_SHA256_TAGGED_LEN]; /* "sha256:<hex>" of its bytes (dataset report) */
    bool nf4;                              /* --method qlora; false: lora */
    bool double_quant;                     /* qlora's double quantization; false with lora */
} tdm_checkpoint_trained_on;

/* The training position saved with the weights. */
typedef struct tdm_checkpoint_info {
    int64_t step;             /* the adapter's optimizer steps taken (= STEP in the name) */
    double epoch;             /* epochs done, fractional (Trainer's state.epoch) */
    tdm_lr_schedule schedule; /* the schedule in force (its position is `step`) */
    tdm_rng rng;              /* the adapter's RNG stream, exactly */
    json_t *data_cursor;      /* save: borrowed, required; load: a new reference */
    tdm_trainer_ckpt trainer; /* the trainer's own state, typed */
    tdm_checkpoint_trained_on trained_on; /* written only when known */
    float *grad_accum;        /* (n_params) f32, the partial gradient of an optimizer batch in
                                 progress, or NULL; save: borrowed; load: malloc'd or NULL */
} tdm_checkpoint_info;

/* Drops the references and the buffer load gave (safe on a zeroed info). */
void tdm_checkpoint_info_free(tdm_checkpoint_info *info);

/* Writes OUT_DIR/checkpoint-STEP atomically (see above). out_dir must exist. trainer_state may
 * be NULL. path (cap bytes, may be NULL) receives the checkpoint's path. A checkpoint of the same
 * step already there is replaced as a whole. opt->n must equal l->n_params. With
 * info->grad_accum (l->n_params values) grad_accum.safetensors is written and listed too. */
tdm_status tdm_checkpoint_save(const char *out_dir, const tdm_lora_params *l,
                               const tdm_peft_meta *meta, const tdm_adamw_state *opt,
                               const tdm_checkpoint_info *info, const json_t *trainer_state,
                               char *path, size_t cap, tdm_error *err);

/* Reads a checkpoint directory for a model with config cfg: the adapter (*l, *meta may be NULL),
 * the optimizer state (*opt, allocated here) and *info (info->grad_accum when the checkpoint
 * lists grad_accum.safetensors). Checks that the names, shapes and steps agree. On failure
 * nothing is left allocated. */
tdm_status tdm_checkpoint_load(const char *ckpt_dir, const tdm_model_config *cfg,
                               tdm_lora_params *l, tdm_peft_meta *meta, tdm_adamw_state *opt,
                               tdm_checkpoint_info *info, tdm_error *err);

/* Reads only ckpt_dir/tandem_state.json into *info (no data_cursor copy needed: freed by
 * tdm_checkpoint_info_free), with the same strict checks as tdm_checkpoint_load. */
tdm_status tdm_checkpoint_load_state(const char *ckpt_dir, tdm_checkpoint_info *info,
                                     tdm_error *err);

/* Steps of the directories named checkpoint-<decimal> in out_dir, ascending (malloc'd *steps,
 * NULL when none). Scratch entries and other names are ignored. */
tdm_status tdm_checkpoint_list(const char *out_dir, int64_t **steps, size_t *n, tdm_error *err);

/* Quick completeness check of a checkpoint directory: tandem_state.json parses, every file it
 * lists exists, and each .safetensors file validates (header, offsets, sizes). */
tdm_status tdm_checkpoint_verify(const char *ckpt_dir, tdm_error *err);

/* Whether ckpt_dir verifies (tdm_checkpoint_verify); when it does not, warns through tdm_warn
 * "skipping damaged checkpoint DIR: REASON" and leaves it in place. What --resume's discovery
 * asks of every checkpoint it considers, so each damaged one is named once. */
bool tdm_checkpoint_usable(const char *ckpt_dir);

/* The checkpoint with the highest step that is usable (a damaged one is skipped with
 * tdm_checkpoint_usable's warning). path receives its directory, *step its step.
 * TDM_ERR_NOT_FOUND when none. */
tdm_status tdm_checkpoint_find_latest(const char *out_dir, char *path, size_t cap, int64_t *step,
                                      tdm_error *err);

/* Whether dir is a PEFT adapter directory or a training run's OUT_DIR, which a command that
 * replaces whole directories (`tandem merge --force`) must leave alone: it holds
 * adapter_config.json, adapter_model.safetensors, a run record (metrics.jsonl, metadata.json,
 * trainer_state.json), tandem_state.json, a best/ directory or a checkpoint-N/ directory.
 * marker (cap bytes, may be NULL) receives "dir/ENTRY" of the first one found. False for a
 * directory that is missing or cannot be read. */
bool tdm_is_adapter_or_run_dir(const char *dir, char *marker, size_t cap);

/* Keeps the keep_last checkpoints with the highest steps and deletes the others (keep_last <= 0
 * keeps all). */
tdm_status tdm_checkpoint_prune(const char *out_dir, int keep_last, tdm_error *err);

/* Replaces OUT_DIR/best atomically with the adapter l and best.json {"step": step, "metric":
 * metric_name, "value": value}. */
tdm_status tdm_checkpoint_save_best(const char *out_dir, const tdm_lora_params *l,
                                    const tdm_peft_meta *meta, int64_t step,
                                    const char *metric_name, double value, tdm_error *err);

/* Reads OUT_DIR/best/best.json. TDM_ERR_NOT_FOUND when there is no best/ yet. */
tdm_status tdm_checkpoint_read_best(const char *out_dir, int64_t *step, double *value,
                                    tdm_error *err);

#endif
