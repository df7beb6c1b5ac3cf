/* mps.h — opt-in CUDA MPS (Multi-Process Service) for jobs sharing one GPU.
 *
 * tandem never starts or stops an MPS control daemon and never changes a GPU's compute mode: a
 * daemon is shared by every CUDA program of its user on the machine, and under MPS a GPU fault in
 * any client kills every client on that GPU. Users opt in knowing that; tandem only
 *   1. checks that a control daemon answers, by connecting to $CUDA_MPS_PIPE_DIRECTORY/control
 *      (default /tmp/nvidia-mps/control) as a Unix SOCK_SEQPACKET socket with a short timeout, and
 *   2. gives the child, before it creates any CUDA context,
 *        CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=PCT
 *        CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=<GPU UUID>=<budget MiB>M
 *      so the ledger's reservation becomes a hard device-memory limit for that client.
 * A trainer under MPS checkpoints at least every TDM_MPS_MAX_CHECKPOINT_STEPS steps, since a
 * neighbour's fault can end it at any moment (tdm_run_context carries this to the trainer).
 */
#ifndef TANDEM_GPU_MPS_H
#define TANDEM_GPU_MPS_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

#define TDM_MPS_MAX_CHECKPOINT_STEPS 100
#define TDM_MPS_UNRELIABLE_BELOW_PCT 30

typedef struct tdm_mps_opts {
    bool enabled;
    int gpu_share_pct; /* 1..100: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE */
} tdm_mps_opts;

/* What a GPU program started by tandem must honour (the trainer reads it). */
typedef struct tdm_run_context {
    tdm_mps_opts mps;
    int max_checkpoint_interval_steps; /* 0 = no constraint; TDM_MPS_MAX_CHECKPOINT_STEPS under MPS */
} tdm_run_context;

tdm_run_context tdm_run_context_for(const tdm_mps_opts *mps);

/* The control socket path: $CUDA_MPS_PIPE_DIRECTORY/control, default /tmp/nvidia-mps/control. */
void tdm_mps_control_path(char *buf, size_t size);

/* TDM_OK when a control daemon accepts a connection within timeout_ms; otherwise
 * TDM_ERR_NOT_FOUND with a message that says how to start one and why tandem does not. */
tdm_status tdm_mps_detect(int timeout_ms, tdm_error *err);

/* The two environment entries for the child, NUL-separated "KEY=VALUE\0KEY=VALUE\0", into buf.
 * Returns the bytes written (both NULs included), or -1 when buf is too small. */
int tdm_mps_child_env(const tdm_mps_opts *mps, const char *gpu_uuid, int64_t budget_mb, char *buf,
                      size_t size);

#endif
