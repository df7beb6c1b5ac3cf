/* coordinator.h — keeping the job registry in step with the nodes, and the leaderboard.
 *
 * A finetune job's adapters each write OUTPUT/metadata.json (the latest epoch's record: task,
 * epoch, train_loss, val_loss, train/val perplexity, learning_rate, epoch_time_ms,
 * samples_per_sec, lora_rank, lora_alpha, data_hash, adapter_index, label) and
 * OUTPUT/trainer_state.json (as the Hugging Face Trainer writes it: log_history entries with
 * eval_loss, best_metric). The validation loss an adapter is ranked by is metadata.json's
 * val_loss, else the last eval_loss in trainer_state.json's log_history, else best_metric.
 */
#ifndef TANDEM_CLUSTER_COORDINATOR_H
#define TANDEM_CLUSTER_COORDINATOR_H
#include <jansson.h>
#include <stdbool.h>

#include "util/error.h"

/* Polls the job's node once and updates job in place: state, exit_code, why, log_tail,
 * updated, and each adapter's metrics / val_loss. A job already finished or failed is left
 * alone. An unreachable node leaves the state as it was and sets "unreachable" to the reason.
 * *changed tells whether anything worth saving changed. */
tdm_status tdm_coord_refresh(json_t *job, bool *changed, tdm_error *err);

/* The validation loss of an adapter from its metadata.json / trainer_state.json texts (either
 * may be NULL); false when neither has one. Exposed for tests. */
bool tdm_coord_val_loss(const char *metadata_json, const char *trainer_state_json, double *out);

/* A new array of the adapters of jobs (all or only those of one submission; NULL for all), each
 * {"rank", "job", "node", "state", "label", "output", "val_loss", "epoch", "train_loss",
 * "val_perplexity"}, sorted by val_loss (adapters without one last, then by job and index). */
json_t *tdm_coord_leaderboard(json_t *jobs, const char *submission);

/* The submission id of the most recently submitted job, NULL when there is none (borrowed). */
const char *tdm_coord_latest_submission(json_t *jobs);

#endif
