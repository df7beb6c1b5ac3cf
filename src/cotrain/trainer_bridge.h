/* trainer_bridge.h — conversions between the trainer's structs and the co-training messages, so
 * that wiring finetune to co-training is a few calls:
 *
 *   joiner:  tdm_cotrain_join_from_trainer(&opts, adapters, n, identity, &msg)  -> send
 *   host:    tdm_cotrain_adapters_to_trainer(&msg.u.join, out)  -> add to the trainer
 *            tdm_cotrain_run_opts_from_trainer(&host_opts, &host_adapter, &mine);
 *            tdm_cotrain_run_wide_diff(&mine, &msg.u.join.opts, ...): the schedule must agree
 *            tdm_cotrain_progress_from_trainer(progress, joiner_index, &msg) -> send
 *   joiner:  tdm_cotrain_progress_to_trainer(&msg.u.progress, label, &p) -> its own progress bar
 */
#ifndef TANDEM_COTRAIN_TRAINER_BRIDGE_H
#define TANDEM_COTRAIN_TRAINER_BRIDGE_H
#include "cotrain/protocol.h"
#include "train/trainer.h"
#include "util/error.h"

/* The options of a join: the run-wide ones of o, the training options of adapter a (strings
 * copied: free with tdm_cotrain_run_opts_free). */
tdm_status tdm_cotrain_run_opts_from_trainer(const tdm_trainer_opts *o,
                                             const tdm_trainer_adapter *a,
                                             tdm_cotrain_run_opts *out, tdm_error *err);
void tdm_cotrain_run_opts_free(tdm_cotrain_run_opts *o);

/* A join message for adapters[0..n) trained with o, from this process (pid, euid, user name).
 * Relative data, output and init_adapter paths are made absolute against the working directory
 * (lexically: "." and ".." components and doubled slashes removed, links not resolved, so an
 * output that does not exist yet is fine). The message owns its strings (tdm_cotrain_msg_free).
 * The join's opts hold adapters[0]'s training options; each other adapter whose training options
 * differ from them carries its own (tdm_cotrain_adapter.opts). TDM_ERR_INVALID when n is outside
 * 1..TDM_COTRAIN_MAX_ADAPTERS or a path is too long. */
tdm_status tdm_cotrain_join_from_trainer(const tdm_trainer_opts *o,
                                         const tdm_trainer_adapter *adapters, int n,
                                         const char *identity, tdm_cotrain_msg *out,
                                         tdm_error *err);

/* The join's adapters as trainer adapters, each with its own training options or else the
 * join's (strings borrowed from j: j must outlive them). */
void tdm_cotrain_adapters_to_trainer(const tdm_cotrain_join *j, tdm_trainer_adapter *out);

/* A progress message for a trainer event of the joiner's adapter number adapter. */
void tdm_cotrain_progress_from_trainer(const tdm_trainer_progress *p, int adapter,
                                       tdm_cotrain_msg *out);
/* The joiner's view: a trainer progress event (label borrowed) for its own progress output. */
void tdm_cotrain_progress_to_trainer(const tdm_cotrain_progress_msg *m, const char *label,
                                     tdm_trainer_progress *out);

/* Writes the absolute, lexically normalized form of path (relative to cwd) into buf. */
tdm_status tdm_cotrain_absolute_path(const char *path, char *buf, size_t size, tdm_error *err);

#endif
