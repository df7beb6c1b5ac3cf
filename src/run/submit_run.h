/* submit_run.h — one `tandem submit` as one library call (docs/cluster.md):
 *
 *     adapters.toml + model config -> labels -> placement budget (placement_budget.h, the
 *     --vram auto estimate) -> every node probed (GPUs, free memory, RAM) and its running jobs
 *     from the registry -> tdm_place -> the plan hook -> (--dry-run stops) -> per node with
 *     adapters: model and data staged (SHA-256 compared), its adapters.toml written
 *     (--stage-only stops) -> one detached `tandem finetune` per node, recorded in the registry.
 *
 * Nothing is printed: the plan goes to the plan hook, one line per node's progress to note.
 */
#ifndef TANDEM_RUN_SUBMIT_RUN_H
#define TANDEM_RUN_SUBMIT_RUN_H
#include <stdbool.h>
#include <stddef.h>

#include "cluster/cluster_config.h"
#include "cluster/placement.h"
#include "run/device_open.h"
#include "run/placement_budget.h"
#include "run/run_options.h"
#include "train/adapters_config.h"
#include "util/error.h"

typedef struct tdm_submit_request {
    const tdm_cluster_config *cluster;
    const char *model_dir;
    const char *adapters_config;  /* adapters.toml path */
    const tdm_run_opts *opts;     /* the passed finetune flags as finetune reads them */
    const char *const *pass_argv; /* (n_pass) the same flags as given, for every node's finetune */
    size_t n_pass;
    bool dry_run;    /* place and stop */
    bool stage_only; /* copy and write adapters.toml files, start nothing */
} tdm_submit_request;

/* The placement, as the plan hook sees it (valid during the call only). */
typedef struct tdm_submit_plan {
    const tdm_cluster_config *cluster;
    const tdm_place_node *nodes; /* (cluster->n_nodes) as scored */
    const tdm_adapters_config *adapters;
    char *const *labels; /* (adapters->n_adapters) the file's label, else adapter-N */
    const tdm_place_plan *plan;
    const tdm_run_budget *budget;
    int64_t model_params;
} tdm_submit_plan;

/* A job submit started (valid during the job hook only). */
typedef struct tdm_submit_job {
    const char *id, *submission, *node, *job_dir;
    const char *device; /* the GPU's UUID, or NULL: the CPU */
    long pid;           /* of its wrapper on the node */
    int n_adapters;
} tdm_submit_job;

typedef struct tdm_submit_hooks {
    /* Called once placement is done, also when an adapter fits nowhere (then the call returns
     * TDM_ERR_NEVER_FITS after it). */
    void (*plan)(const tdm_submit_plan *p, void *user);
    tdm_note_fn note; /* "NODE: model N file(s) copied ...", "NODE: started job ID ..." */
    /* scheduler: slurm with --dry-run: each batch script that would be submitted (its path and
     * text); NULL: the plan only. */
    void (*script)(const char *path, const char *text, void *user);
    /* May be NULL: called for each job started and recorded in the registry. */
    void (*job)(const tdm_submit_job *j, void *user);
    void *user;
    /* the submission id (when jobs were started), for the caller's closing line */
    char submission[128];
} tdm_submit_hooks;

/* Places, stages and starts (see the header comment). Errors: TDM_ERR_INVALID for a wrong
 * adapters.toml or a key submit does not support (exit 2); TDM_ERR_NEVER_FITS when an adapter
 * fits on no node (each node's reason in the message); a node's staging or launch failure
 * (never TDM_ERR_INVALID: the user's input was fine), named with the node. */
tdm_status tdm_run_submit(const tdm_submit_request *req, tdm_submit_hooks *hooks, tdm_error *err);

#endif
