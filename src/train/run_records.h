/* run_records.h — the per-adapter run records in OUT_DIR (docs/run-records.md):
 *
 *   trainer_state.json   as Hugging Face Trainer writes it (json.dumps(indent=2, sort_keys=True)
 *                        of TrainerState): best_global_step, best_metric, best_model_checkpoint,
 *                        epoch, eval_steps, global_step, is_hyper_param_search,
 *                        is_local_process_zero, is_world_process_zero, log_history, logging_steps,
 *                        max_steps, num_input_tokens_seen, num_train_epochs, save_steps,
 *                        stateful_callbacks, total_flos, train_batch_size, trial_name,
 *                        trial_params. log_history entries are Trainer's:
 *                          train: {"epoch", "grad_norm", "learning_rate", "loss", "step"}
 *                                 (loss rounded to 4 decimals, as Trainer does)
 *                          eval:  {"epoch", "eval_loss", "eval_runtime",
 *                                  "eval_samples_per_second", "eval_steps_per_second", "step"}
 *                          end:   {"epoch", "step", "total_flos", "train_loss", "train_runtime",
 *                                  "train_samples_per_second", "train_steps_per_second"}
 *   metadata.json        summary for the cluster coordinator (tdm_run_metadata)
 *   metrics.jsonl        one JSON object per logged step, appended
 *
 * trainer_state.json and metadata.json are replaced atomically (temp file, fsync, rename).
 * metrics.jsonl is append-only: each line goes out in one write() on an O_APPEND descriptor and
 * is fsynced, so a crash can leave at most one torn last line; tdm_metrics_truncate_after, run on
 * resume, rewrites the file atomically keeping only whole lines with step <= the resumed step.
 */
#ifndef TANDEM_TRAIN_RUN_RECORDS_H
#define TANDEM_TRAIN_RUN_RECORDS_H
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "util/error.h"

#define TDM_TRAINER_STATE_FILE "trainer_state.json"
#define TDM_METADATA_FILE "metadata.json"
#define TDM_METRICS_FILE "metrics.jsonl"

typedef struct tdm_trainer_state {
    int64_t global_step;
    double epoch;
    int64_t max_steps;
    int64_t num_train_epochs;
    int64_t logging_steps, eval_steps, save_steps;
    int64_t train_batch_size;
    int64_t num_input_tokens_seen;
    double total_flos;
    bool has_best;      /* false: best_* are written as null */
    double best_metric; /* lowest eval_loss */
    int64_t best_global_step;
    char best_model_checkpoint[1024]; /* path of best/ */
    json_t *log_history;              /* array, owned */
} tdm_trainer_state;

/* Zeroes ts and creates an empty log_history. */
tdm_status tdm_trainer_state_init(tdm_trainer_state *ts, tdm_error *err);
void tdm_trainer_state_free(tdm_trainer_state *ts);

/* Appends a training log entry at ts->global_step / ts->epoch. */
void tdm_trainer_state_log_train(tdm_trainer_state *ts, double loss, double learning_rate,
                                 double grad_norm);
/* Appends an evaluation entry and updates best_* when eval_loss is lower than best_metric
 * (best_model_checkpoint = best_dir). Returns true when it became the best. */
bool tdm_trainer_state_log_eval(tdm_trainer_state *ts, double eval_loss, double runtime_s,
                                double samples_per_s, double steps_per_s, const char *best_dir);
/* Appends the end-of-training summary entry. */
void tdm_trainer_state_log_end(tdm_trainer_state *ts, double train_loss, double runtime_s,
                               double samples_per_s, double steps_per_s);

/* The document (new reference). */
json_t *tdm_trainer_state_to_json(const tdm_trainer_state *ts);
/* Writes it atomically to path (keys sorted, indent 2, like Trainer). */
tdm_status tdm_trainer_state_save(const tdm_trainer_state *ts, const char *path, tdm_error *err);
/* Reads a trainer_state.json (tandem's or Trainer's) back into *ts (for resume). */
tdm_status tdm_trainer_state_load(tdm_trainer_state *ts, const char *path, tdm_error *err);

typedef struct tdm_run_metadata {
    const char *task;       /* what was trained, e.g. the adapter's label or data file stem */
    const char *label;      /* may be NULL: written as null */
    int adapter_index;      /* position in the run's adapter list, from 0 */
    double epoch;           /* epochs done */
    double train_loss;      /* mean training loss of the last epoch */
    double val_loss;        /* NaN when there is no validation split: null */
    double learning_rate;   /* current */
    double epoch_time_ms;   /* wall time of the last epoch */
    double samples_per_sec; /* training sequences per second */
    int lora_rank;
    double lora_alpha;
    const char *data_hash; /* "sha256:<64 hex>" of the training data file */
    /* "sha256:<64 hex>" of the base model (model/base_identity.h), or NULL: written as
     * base_model_identity; eval --adapter refuses another base */
    const char *base_model_identity;
    /* How the base was held while training, which `tandem merge` needs to rebuild the weights the
     * adapter saw: "qlora" (projections NF4, blocks of TDM_NF4_BLOCK, double_quant as given) or
     * "lora" (the base in its own precision). NULL: the three keys are not written. */
    const char *method;
    bool double_quant;
} tdm_run_metadata;

/* metadata.json: the fields above plus train_perplexity = exp(train_loss) and val_perplexity =
 * exp(val_loss) (null when val_loss is NaN). Non-finite numbers are written as null. */
json_t *tdm_run_metadata_to_json(const tdm_run_metadata *m);
tdm_status tdm_run_metadata_save(const tdm_run_metadata *m, const char *path, tdm_error *err);

/* The run record (metadata.json) of the adapter in adapter_dir: adapter_dir/metadata.json, or,
 * when adapter_dir is OUT_DIR/best or OUT_DIR/checkpoint-N, OUT_DIR/metadata.json. NULL when
 * there is none (an adapter made elsewhere, e.g. by PEFT) or it is not a JSON object; path (cap
 * bytes, may be NULL) receives the file found. The caller owns the reference. */
json_t *tdm_adapter_run_record(const char *adapter_dir, char *path, size_t cap);

/* Refuses (TDM_ERR_UNSUPPORTED) an adapter whose run record names another base_model_identity
 * than model_dir's (model/base_identity.h), with a message naming both and the record; TDM_OK
 * when they agree or the adapter has no record. */
tdm_status tdm_adapter_check_base(const char *adapter_dir, const char *model_dir, tdm_error *err);

/* One metrics.jsonl line. NaN fields are left out. */
typedef struct tdm_metrics_line {
    int64_t step;
    double epoch;
    double loss;
    double learning_rate;
    double grad_norm;
    int64_t tokens; /* counted tokens since the previous line */
    double tokens_per_sec;
    double elapsed_ms; /* since training started */
    double val_loss;   /* NaN unless evaluated at this step */
    int adapter_index;
    const char *label; /* may be NULL */
} tdm_metrics_line;

json_t *tdm_metrics_line_to_json(const tdm_metrics_line *m);
/* Appends the line (compact JSON + '\n') to path and fsyncs. When a write or the fsync fails
 * (a full disk writes part of the line, then fails with ENOSPC), the file is cut back to its
 * size before the call, so it still ends with a whole line, and the error names path and the
 * real errno ("No space left on device"). */
tdm_status tdm_metrics_append(const char *path, const tdm_metrics_line *m, tdm_error *err);
/* Keeps the whole, parseable lines whose "step" <= step (atomic rewrite). A missing file is
 * fine. *kept (optional) receives the number of lines kept. */
tdm_status tdm_metrics_truncate_after(const char *path, int64_t step, int64_t *kept,
                                      tdm_error *err);
/* The same, keeping at most the first max_lines of those lines (max_lines < 0: all). A resume
 * passes the count its checkpoint recorded: an adapter that did not step between the checkpoint
 * and a crash may have written lines of the same step after the checkpoint (an evaluation). */
tdm_status tdm_metrics_truncate_lines(const char *path, int64_t step, int64_t max_lines,
                                      int64_t *kept, tdm_error *err);

#endif
