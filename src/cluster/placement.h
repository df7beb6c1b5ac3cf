/* placement.h — which node trains which adapter (pure functions: no I/O, unit-tested).
 *
 * Every adapter goes to the node with the highest score
 *
 *     score = (free / budget) x speed x 1 / (1 + active_adapters)
 *
 * free:    the device's free memory right now (MiB; a GPU's live free memory, which the node's
 *          ledger lowers by its reservations; a CPU-only node's available RAM) minus what this
 *          plan already put on it;
 * budget:  the memory one adapter trained alone needs on that kind of device, base model
 *          included (tdm_place_budget); the same for every node, so scores compare;
 * speed:   the GPU's factor (speed.h), 0.01 for a CPU;
 * active_adapters: adapters already running on the node (from the job registry) plus those this
 *          plan already placed there.
 * Adapters are placed one at a time in file order. A node runs one finetune process per GPU it
 * uses (each with its own base in memory, as `finetune --gpus` does): an adapter is scored on
 * each GPU of the node, where it either starts a process (room for base + adapter) or joins the
 * process the plan already put there (room for one adapter more), and takes the best; a
 * CPU-only node runs one process (with --vram auto, a GPU too small for the plan as
 * asked but large enough for the smallest plan counts as having room: tdm_place_budget). Excluded,
 * with the reason kept: unreachable nodes, nodes with GPUs whose tandem was built without CUDA
 * (why_no_cuda), nodes at max_adapters, devices without room, CPU-only nodes when the model has
 * more parameters than cpu_max_params. A node with GPUs never trains on its CPU.
 */
#ifndef TANDEM_CLUSTER_PLACEMENT_H
#define TANDEM_CLUSTER_PLACEMENT_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

typedef struct tdm_place_gpu {
    const char *uuid;
    const char *name;
    double speed;    /* factor, > 0 */
    int64_t free_mb; /* live free memory, MiB */
} tdm_place_gpu;

typedef struct tdm_place_node {
    const char *name;
    bool reachable;
    const char *why_unreachable; /* when !reachable */
    const tdm_place_gpu *gpus;   /* (n_gpus); none: a CPU-only node */
    size_t n_gpus;
    int64_t ram_free_mb; /* CPU-only nodes: available RAM, MiB */
    int max_adapters;
    int active_adapters;    /* running on the node already */
    int64_t cpu_max_params; /* CPU-only nodes: largest model they train */
    const char *why_no_cuda; /* NULL when the node's tandem can use its GPUs (or that is not
                              * known); else why it cannot (a build without CUDA): a node with
                              * GPUs is then excluded with this reason */
} tdm_place_node;

/* Memory a process needs, MiB, by the number of adapters it trains (all alike): [k] for k
 * adapters, [0] = 0, up to the number of adapters placed. The placed adapter needs [1] on a
 * device the plan has not used yet and [k+1] - [k] where the plan already put k. Made by
 * tdm_run_placement_budget (run/placement_budget.h) from the same estimate `tandem finetune
 * --vram auto` reserves with. */
typedef struct tdm_place_budget {
    const int64_t *gpu_mb; /* (n_adapters + 1) on a GPU, the CUDA context included */
    const int64_t *cpu_mb; /* (n_adapters + 1) on a CPU-only node */
    /* May be NULL. (n_adapters + 1) the smallest plan of a process of k adapters on a GPU (what
     * --vram auto may shrink to: gradient checkpointing, micro-batch 1; <= gpu_mb[k]). A GPU
     * whose free memory is below gpu_mb[k] but at least gpu_min_mb[k] still takes the process:
     * its finetune fits its plan to it (docs/finetune.md, "Plans that fit"). */
    const int64_t *gpu_min_mb;
} tdm_place_budget;

/* One node's standing when one adapter was placed. */
typedef struct tdm_place_eval {
    bool eligible;
    double score;    /* when eligible */
    int gpu;         /* chosen GPU index, -1 for the CPU */
    int64_t free_mb; /* free memory the score used */
    int64_t need_mb; /* what this adapter needs there */
    char why[256];   /* when !eligible: why the node was excluded */
} tdm_place_eval;

typedef struct tdm_place_plan {
    size_t n_adapters, n_nodes;
    int *node_of;          /* (n_adapters) chosen node, -1 when none could take it */
    int *gpu_of;           /* (n_adapters) GPU index on that node (its process), -1 the CPU;
                              NULL: device_of_node says (Slurm jobs) */
    int *device_of_node;   /* (n_nodes) GPU index of the node's first adapter, -1 CPU, -2
                              unused */
    int *adapters_on_node; /* (n_nodes) how many adapters the plan puts there */
    tdm_place_eval *evals; /* (n_adapters x n_nodes) row-major: evals[a * n_nodes + n] */
} tdm_place_plan;

/* Places n_adapters adapters (all alike: budget b) on nodes[0..n_nodes) and fills *plan. When an
 * adapter fits nowhere it stays -1 and the status is TDM_ERR_NEVER_FITS with a message naming
 * the adapter (1-based) and each node's reason; the plan is still filled for printing. */
tdm_status tdm_place(const tdm_place_node *nodes, size_t n_nodes, size_t n_adapters,
                     const tdm_place_budget *b, int64_t model_params, tdm_place_plan *plan,
                     tdm_error *err);

void tdm_place_plan_free(tdm_place_plan *plan);

#endif
