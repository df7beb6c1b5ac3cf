/* node_probe.h — what a node has right now: reachable or not (and why), its tandem version, live
 * GPU state from `tandem gpu status --json` run on it, CPU cores and memory.
 *
 * One remote command per probe (a fixed sh script; the tandem path and env are quoted
 * arguments): `TANDEM --version` (version and build features: a tandem without CUDA cannot
 * train on the node's GPUs), `TANDEM gpu status --json`, `getconf _NPROCESSORS_ONLN`,
 * MemTotal/MemAvailable from /proc/meminfo, separated by "@@" marker lines.
 */
#ifndef TANDEM_CLUSTER_NODE_PROBE_H
#define TANDEM_CLUSTER_NODE_PROBE_H
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cluster/transport.h"
#include "gpu/inventory.h"
#include "util/error.h"

typedef struct tdm_node_gpu {
    char uuid[96];
    char name[96];
    tdm_memory_type memory_type;
    int64_t total_mb;        /* MiB, -1 unknown */
    int64_t memory_free_mb;  /* what the driver reports free, -1 unknown */
    int64_t ledger_avail_mb; /* the node's ledger: capacity - reservations, -1 unknown */
    int64_t free_mb;         /* min of the two known ones: what a new job can count on */
    int n_reservations;
} tdm_node_gpu;

typedef struct tdm_node_state {
    bool reachable;
    char reason[512];  /* why not reachable, or why the GPU state is missing */
    char version[64];  /* "0.1.0"; "" when unknown */
    char features[64]; /* the "features:" line of `tandem --version` ("cuda", "cpu-only"); ""
                        * when the node's tandem prints none (a build older than that line) */
    int cuda;          /* 1 its tandem has the CUDA backend, 0 it has not, -1 unknown */
    bool gpu_ok;       /* gpu status answered with valid JSON */
    tdm_node_gpu *gpus;
    size_t n_gpus;
    json_t *gpu_status; /* the node's `gpu status --json` document (owned), NULL when missing */
    int cpu_cores;      /* live, 0 unknown */
    int64_t ram_total_mb, ram_available_mb; /* live, -1 unknown */
} tdm_node_state;

/* Probes node over t within timeout_ms. An unreachable node or a failing remote command is not
 * an error: it is recorded in *out (reachable false / gpu_ok false, with the reason). */
tdm_status tdm_node_probe(tdm_transport *t, int64_t timeout_ms, tdm_node_state *out,
                          tdm_error *err);

/* Reads version, features and cuda out of the output of `tandem --version` (exposed for tests):
 * "tandem VERSION" on the first line, "features: WORD[ WORD...]" on a later one; cuda is 1 when
 * a word is "cuda", 0 when the line is there without it, -1 when there is no such line. */
void tdm_node_parse_version(const char *text, tdm_node_state *out);

/* Reads the GPUs out of a `gpu status --json` document (exposed for tests). */
tdm_status tdm_node_parse_gpu_status(const char *json_text, tdm_node_state *out, tdm_error *err);

void tdm_node_state_free(tdm_node_state *s);

#endif
