/* finetune_run.h — one `tandem finetune` run as one library call:
 *
 *     options (run_options.h) -> the adapter list (flags, or adapters.toml with paths relative
 *     to the file) -> trainer create (every data file read; nothing written) -> device open
 *     (device_open.h) -> trainer attach -> the run -> outputs (each OUT_DIR, trainer.h)
 *
 * Nothing is printed: notes go to the device request's note callback, progress to the trainer
 * options' progress callback, and `started` tells the caller what is about to be trained.
 */
#ifndef TANDEM_RUN_FINETUNE_RUN_H
#define TANDEM_RUN_FINETUNE_RUN_H
#include <stdio.h>

#include "run/run_options.h"
#include "train/adapters_config.h"

/* One adapter about to be trained. */
typedef struct tdm_run_adapter_info {
    const char *data, *output;
    int64_t n_train, n_val, total_steps;
} tdm_run_adapter_info;

typedef struct tdm_finetune_hooks {
    /* Called once the device is open, before the first step. */
    void (*started)(const tdm_run_adapter_info *adapters, int n, void *user);
    void *user;
    FILE *profile_out; /* --profile-ops: where the per-op table goes at the end */
} tdm_finetune_hooks;

/* The adapters of a run: from --adapter flags (split at their first ':' in place) or the
 * adapters.toml of --adapters-config (its paths relative to the file, its keys over the flags).
 * Errors: TDM_ERR_INVALID for a wrong list or file (TDM_ERR_IO: a file that cannot be read). */
typedef struct tdm_run_adapters {
    tdm_trainer_adapter *ads; /* (n) */
    int n;
    tdm_adapters_config acfg; /* --adapters-config: the file, whose strings ads borrow */
    char **owned;             /* (n_owned) paths made for ads, freed with the list */
    size_t n_owned, cap_owned;
} tdm_run_adapters;
tdm_status tdm_run_adapters_load(tdm_run_opts *o, tdm_run_adapters *out, tdm_error *err);
void tdm_run_adapters_free(tdm_run_adapters *l);

/* Trains the adapters of o (o->trainer.model_dir set by the caller). Errors: TDM_ERR_INVALID
 * for a wrong adapter list or adapters.toml (exit 2), TDM_ERR_PARSE with *bad_lines (malloc'd
 * "FILE:LINE: reason" lines; the caller frees it) when a data file has bad lines and nothing was
 * written, the device's errors (device_open.h), the trainer's. o->adapter_args' strings are
 * split at their first ':' in place. */
tdm_status tdm_run_finetune(tdm_run_opts *o, const tdm_finetune_hooks *hooks, char **bad_lines,
                            tdm_error *err);

#endif
