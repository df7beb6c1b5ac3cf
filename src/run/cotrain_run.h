/* cotrain_run.h — co-training in a finetune run (docs/co-training.md): before any weights are
 * loaded, a run elects itself host of its base identity and device or joins the host there is.
 *
 *     tdm_cotrain_run_start   --no-join: nothing. Otherwise the base identity (of the device the
 *                             run would use) and the election: a host is found -> this process
 *                             joins it (*joined; the whole run happens there and the outcome is
 *                             returned); none -> this process hosts (*srv). A --resume run joins
 *                             with resume (the host resumes its adapters). When the host dies,
 *                             the joiner takes over: --resume from then on, elect again, and
 *                             either join the orphan that won or host (*srv) itself.
 *     tdm_cotrain_serve_hook  a host wires its trainer options: the step-boundary hook takes the
 *                             joiners' join / detach requests; joined adapters' progress goes to
 *                             their joiners (and, with the joiner's pid and user, to the host's
 *                             own output); the live status is published for `gpu status`.
 *     tdm_cotrain_serve_end   after the run: outcomes to the joiners still attached, the host
 *                             stopped (advertisement removed, connections closed).
 *
 * On the CPU the election happens at start. A GPU run first looks for a host on each GPU it
 * could get (tdm_device_candidates_list, nothing reserved), and when there is none elects after
 * device open on the GPU it reserved (tdm_cotrain_serve_open); so does a GPU joiner taking
 * over from a dead host.
 */
#ifndef TANDEM_RUN_COTRAIN_RUN_H
#define TANDEM_RUN_COTRAIN_RUN_H
#include <stdbool.h>

#include "run/device_open.h"
#include "run/finetune_run.h"
#include "run/run_options.h"
#include "train/trainer.h"
#include "util/error.h"

typedef struct tdm_cotrain_serving tdm_cotrain_serving;

/* Elects or joins (see above). On a join, returns the joined adapters' outcome: TDM_OK when all
 * finished; TDM_ERR_STOPPED when the joiner's stop_requested asked for them back (they are
 * checkpointed); the host's refusal (TDM_ERR_PARSE with *bad_lines for bad data lines); an error
 * when the host died and could not be taken over (after a stop request, or 8 host deaths). After
 * a takeover o->trainer.resume is true, and a run that ends up hosting (*srv, not *joined) resumes
 * its adapters itself. The joiner's progress goes to o->trainer.progress and hooks->started
 * (called again on each new admission). */
tdm_status tdm_cotrain_run_start(tdm_run_opts *o, const tdm_trainer_adapter *ads, int n,
                                 const tdm_finetune_hooks *hooks, tdm_cotrain_serving **srv,
                                 bool *joined, char **bad_lines, tdm_error *err);

/* After device open (dev must outlive srv; NULL srv allowed): a GPU run that found no host
 * before elects now on the GPU it reserved (its UUID and compute dtype in the identity) and
 * hosts; *join_instead when a host of that identity appeared meanwhile: the caller frees its
 * trainer, closes the device (the reservation goes back) and calls tdm_cotrain_serve_join,
 * which returns the joined adapters' outcome as tdm_cotrain_run_start does; *take_over when
 * that host died after admitting them (o->trainer.resume is then true; at most 8 times) or
 * ended before admitting them (at most 3 times): the caller runs again from
 * tdm_cotrain_run_start, which joins another host (an orphan) or reserves anew and hosts.
 * A host's memory admission grows and shrinks dev's reservation (docs/co-training.md). */
tdm_status tdm_cotrain_serve_open(tdm_cotrain_serving *srv, tdm_device *dev, bool *join_instead,
                                  tdm_error *err);
tdm_status tdm_cotrain_serve_join(tdm_cotrain_serving *srv, tdm_run_opts *o,
                                  const tdm_trainer_adapter *ads, int n,
                                  const tdm_finetune_hooks *hooks, bool *take_over,
                                  char **bad_lines, tdm_error *err);

/* Points opts' step-boundary hook, progress callback and pass hook at the host's service (own:
 * the host's own adapters, indices 0..n_own-1, borrowed until tdm_cotrain_serve_end). Joined
 * adapters' progress goes to their joiner and, labelled "LABEL (pid P, USER)", to the host's
 * own progress callback too; at each step boundary the host's live status is published for
 * `gpu status` (cotrain/status.h). Call before the trainer is created. */
void tdm_cotrain_serve_hook(tdm_cotrain_serving *srv, tdm_trainer_opts *opts,
                            const tdm_trainer_adapter *own, int n_own);

/* Ends the service after the run returned run_status (err its error): tells the joiners still
 * attached how their adapters ended, stops the host, frees srv. NULL allowed. */
void tdm_cotrain_serve_end(tdm_cotrain_serving *srv, tdm_status run_status, const tdm_error *err);

#endif
