/* device_open.h — the one path from "a run wants a device" to a backend, shared by `tandem
 * finetune` and `tandem eval` (and later generation and the co-training host):
 *
 *     inventory (NVML or TANDEM_FAKE_GPUS; no CUDA context yet)
 *       -> memory plan (the caller's estimate, or --vram GB)
 *       -> ledger reservation, waiting in the FIFO queue up to --timeout (or adopting the
 *          reservation of an enclosing `tandem gpu run`)
 *       -> CUDA_VISIBLE_DEVICES = the reserved GPU, the MPS client environment
 *       -> backend creation (the first CUDA call of the process)
 *       -> tdm_device_record_actual once the model is loaded, and at the end
 *       -> tdm_device_close: backend freed, reservation released.
 * --device auto falls back to the CPU when this build has no CUDA backend, no GPU is listed, or
 * CUDA cannot open the listed GPU (a simulated inventory, an old driver); the reservation is then
 * given back first. --device cuda never falls back.
 *
 * Library code: nothing is printed. What a person should see (the --vram auto breakdown, the
 * reservation, why the CPU is used, who holds the memory a waiting run needs) goes to the
 * request's note callback as one line without the "tandem: " prefix.
 */
#ifndef TANDEM_RUN_DEVICE_OPEN_H
#define TANDEM_RUN_DEVICE_OPEN_H
#include <stdbool.h>
#include <stdint.h>

#include "engine/backend.h"
#include "engine/model.h"
#include "gpu/inventory.h"
#include "gpu/lease_keeper.h"
#include "gpu/ledger.h"
#include "gpu/mps.h"
#include "gpu/reservation.h"
#include "util/error.h"

/* The CUDA context of a process (driver state, the module images of tandem and cuBLASLt) as NVML
 * counts it, which --vram auto adds to the engine's own estimate. Measured with
 * scripts/device/vram-estimate.sh (docs/verification.md): on the H200, driver 580, the process
 * held 666-789 MiB more than the backend allocated (context + allocation granularity). */
#define TDM_CUDA_CONTEXT_MIB 680

/* A one-line message for a person (no "tandem: " prefix, no newline). */
typedef void (*tdm_note_fn)(const char *line, void *user);

/* What a run asks of its device: the --device/--vram/--no-wait-gpu/--timeout/MPS flags. */
typedef struct tdm_device_request {
    const char *device; /* "auto", "cpu" or "cuda" */
    int threads;        /* --threads: CPU backend threads; 0 = the CPUs this process may use */
    double vram_gib;    /* --vram GB; 0 = auto: the caller's estimate (tdm_device_open's est) */
    bool no_wait;       /* --no-wait-gpu: fail at once when the memory is not free */
    double timeout_sec; /* --timeout: waiting limit, then TDM_ERR_TIMEOUT (exit 75) */
    tdm_mps_opts mps;   /* --experimental-mps --gpu-share */
    bool base_fp8;      /* --base-compute fp8: passed to the backend (tdm_backend_opts) */
    bool gpu_share_given;
    const char *task;       /* shown in `gpu status`: "finetune", "eval" */
    double wait_report_sec; /* how often a waiting run says why (0: every 60 s) */
    tdm_note_fn note;       /* may be NULL */
    void *note_user;
} tdm_device_request;

/* The simulated-GPU compute seam (tests, docs/gpu-inventory.md): with TANDEM_SIM_GPU_COMPUTE=cpu
 * and a simulated inventory (TANDEM_FAKE_GPUS set), a GPU run reserves on its simulated GPU in
 * the real ledger exactly as on a real one (plan, queue, growth, release) but computes on the CPU
 * backend: the only way to test what a GPU run does in the ledger on a machine without one.
 * *on: whether it applies. TDM_ERR_INVALID when the variable is set to anything but "cpu" or
 * without TANDEM_FAKE_GPUS (so a real run cannot compute on the CPU by a stray variable). */
#define TDM_SIM_GPU_COMPUTE_ENV "TANDEM_SIM_GPU_COMPUTE"
tdm_status tdm_device_sim_compute(bool *on, tdm_error *err);

/* The devices a run may get, in the order device open would pick them, found without reserving
 * (co-training: a joiner looks for a host on each before it opens a device). */
typedef struct tdm_device_candidates {
    bool cpu;                  /* the run trains on the CPU for certain (no GPU list) */
    char (*uuid)[96];          /* the GPUs (n of them), first the one it would take now */
    size_t n;
    const char *compute_dtype; /* "bf16" or "fp8" (CUDA; fp8 with --base-compute fp8) or "f32"
                                  (the CPU backend, the seam above) */
} tdm_device_candidates;

/* --device cpu: cpu. auto in a build without CUDA (and without the seam), or with no GPU listed:
 * cpu. Otherwise the GPUs the inventory lists (CUDA_VISIBLE_DEVICES applied): the one of the
 * enclosing `tandem gpu run` reservation (TANDEM_RESERVATION_ID) alone, else every GPU ordered
 * as the reservation chooses (the most memory admissible now first; ties in inventory order).
 * --device cuda with no usable GPU: no candidate and not cpu (device open reports why). auto
 * may still fall back to the CPU at open when CUDA cannot open the GPU it reserved. */
tdm_status tdm_device_candidates_list(const tdm_device_request *req, tdm_device_candidates *out,
                                      tdm_error *err);
void tdm_device_candidates_free(tdm_device_candidates *c);

/* An opened device. gpu is false on the CPU. */
typedef struct tdm_device {
    tdm_backend *be;
    bool gpu;
    int64_t budget_mb; /* what was reserved (for an adopted reservation: the plan, not known) */
    tdm_lease lease;   /* held when this process reserved (not when it adopted gpu run's) */
    tdm_lease_keeper *keeper;    /* renews lease and re-registers it after a quarantine, or NULL */
    tdm_run_context run_context; /* MPS constraints for the trainer (checkpoint interval) */
    bool simulated; /* the seam: a reservation on a simulated GPU, the CPU backend computing */
    bool base_fp8;  /* the backend was created with --base-compute fp8 */
} tdm_device;

/* The reservation --vram auto takes for a model memory plan (MiB): every owner rounded up to
 * MiB, plus the CUDA context. Pure arithmetic; the same figure `tandem submit` places with. */
int64_t tdm_device_reservation_mb(const tdm_model_mem *est);

/* What a CPU-only training process holds beyond the model's own buffers and the backend's kept
 * scratch (the program, OpenBLAS and OpenMP threads' buffers, the ops' per-call buffers, the
 * tokenizer, the datasets), MiB. */
#define TDM_CPU_PROCESS_MIB 200

/* The memory a run on the CPU backend needs (MiB) for an estimate made with f32 activations:
 * every owner together rounded up to MiB, plus TDM_CPU_PROCESS_MIB. The same figure `tandem
 * submit` places CPU processes with and `tandem finetune --device cpu` fits to the machine's
 * memory (tdm_device_cpu_memory_limit). */
int64_t tdm_device_cpu_need_mb(const tdm_model_mem *est);

/* The memory a CPU run may use: the machine's MemTotal from /proc/meminfo (TANDEM_MEMINFO=PATH:
 * that file instead, a test seam) or the tightest cgroup memory limit on this process
 * (util/cgroup.h), whichever is lower. */
typedef struct tdm_cpu_memory {
    int64_t limit_mb; /* MemTotal or the cgroup limit */
    int64_t avail_mb; /* MemAvailable, at most limit_mb */
    /* what binds, in words: "this machine's N MiB of memory (PATH)", "this process's cgroup
     * memory limit of N MiB" */
    char where[400];
} tdm_cpu_memory;

/* Reads *out (one read of meminfo and the cgroup files). TDM_ERR_IO (err says why) when meminfo
 * is unreadable. */
tdm_status tdm_device_cpu_memory_limit(tdm_cpu_memory *out, tdm_error *err);

/* The one line a CPU run of estimate est (f32 activations) prints before it loads, through
 * req->note: its need (tdm_device_cpu_need_mb, by owner) against m's MemAvailable, a warning
 * when more (the run goes on: other processes' memory may be freed, page cache is reclaimed);
 * m NULL (unknown, unknown_why): a note that nothing was checked. The need against the limit is
 * the plan fit's (finetune_run.c). */
void tdm_device_cpu_memory_note(const tdm_device_request *req, const tdm_cpu_memory *m,
                                const char *unknown_why, const tdm_model_mem *est);

/* The line a CPU run that trained prints at its end, beside the one above: the backend's peak
 * (weights, activations, adapters, kept scratch) and the process's peak resident size
 * (getrusage), which the plan's TDM_CPU_PROCESS_MIB for the process should cover. Nothing when
 * either cannot be read. */
void tdm_device_cpu_memory_end_note(const tdm_device_request *req, tdm_backend *be);

/* The budget a run can get (docs/finetune.md, "The budget a run can get"): on one GPU, the most
 * the ledger would admit once every live reservation on it has ended, while the memory held
 * outside the ledger stays held:
 *     min(reservable capacity, total - held outside the ledger)
 * held outside = the GPU's used memory - what the ledger's holders hold (their memory as the GPU
 * lists it, else their recorded actual use). Live reservations are not subtracted: a run waits
 * for them (in the FIFO queue) rather than shrink its plan for good. Pure; *outside_mb (may be
 * NULL) receives the memory held outside. */
int64_t tdm_device_alone_mb(const tdm_gpu *gpu, const tdm_ledger_state *ledger,
                            int64_t *outside_mb);

/* The most the reservation own_id (a co-training host's) can be on gpu now: tdm_device_alone_mb
 * minus what the other live reservations there hold (max of budget and recorded actual use, as
 * the guard counts them). Pure. */
int64_t tdm_device_growable_mb(const tdm_gpu *gpu, const tdm_ledger_state *ledger,
                               const char *own_id);

/* What --vram auto plans for, asked of the inventory and the ledger before any CUDA context. */
typedef struct tdm_device_budget {
    bool gpu;           /* the run would use a GPU; false: the CPU (nothing else is set) */
    bool adopted;       /* under tandem gpu run: budget_mb = capacity_mb = its reservation's */
    int64_t budget_mb;  /* the largest tdm_device_alone_mb over the candidate GPUs; -1 unknown */
    int64_t outside_mb; /* held outside the ledger on that GPU */
    char gpu_uuid[96], gpu_name[96]; /* the GPU budget_mb is on */
    int64_t capacity_mb;       /* the largest reservable capacity (more never fits); -1 unknown */
    int64_t capacity_total_mb; /* that GPU's total */
    double reserve_factor;     /* and its reserve factor */
    char capacity_gpu[200];    /* "UUID (name)" of that GPU */
} tdm_device_budget;

/* Fills *out for req (device "cpu", or no usable CUDA under "auto": gpu false). Errors: --device
 * cuda without a usable GPU (TDM_ERR_UNSUPPORTED, as tdm_device_open), the inventory's. */
tdm_status tdm_device_budget_query(const tdm_device_request *req, tdm_device_budget *out,
                                   tdm_error *err);

/* Every GPU a CUDA run could use here (the inventory, CUDA_VISIBLE_DEVICES applied) into *inv,
 * and (*budget_mb)[i], malloc'd, the budget a run alone can get on GPU i (tdm_device_alone_mb):
 * what `finetune --gpus` splits a run's adapters with. Errors: no usable CUDA backend (a build
 * without CUDA and without the simulated-GPU seam, no GPU listed): TDM_ERR_UNSUPPORTED; the
 * inventory's. Free both (tdm_inventory_free, free). */
tdm_status tdm_device_gpu_budgets(tdm_inventory *inv, int64_t **budget_mb, tdm_error *err);

/* Opens the device req asks for. est is the run's memory plan on the CUDA backend (NULL when the
 * caller cannot make one: then --vram auto reserves TDM_CUDA_CONTEXT_MIB only... so pass one).
 * On success *dev holds a backend (and maybe a lease, released at exit as well). Errors:
 * --device cuda without a usable GPU (TDM_ERR_UNSUPPORTED / the backend's error), the
 * reservation's (TDM_ERR_TIMEOUT: exit 75, TDM_ERR_NEVER_FITS, TDM_ERR_BUSY), the backend's. */
tdm_status tdm_device_open(tdm_device *dev, const tdm_device_request *req, const tdm_model_mem *est,
                           tdm_error *err);

/* Records the process's measured device memory in the ledger (NVML's figure for this process,
 * else the backend's figure plus the CUDA context). use_peak: the backend's peak rather than its
 * current use. Writes *process_mb (NVML, -1 unknown) and *backend_mb when not NULL. No-op on
 * the CPU. */
void tdm_device_record_actual(tdm_device *dev, bool use_peak, int64_t *process_mb,
                              int64_t *backend_mb);

/* The device as a base identity names it: the reserved GPU's UUID, or "cpu"; and the compute
 * dtype of its backend ("bf16" CUDA, "f32" the CPU backend). */
const char *tdm_device_name(const tdm_device *dev);
const char *tdm_device_compute_dtype(const tdm_device *dev);

/* Resizes the run's reservation to budget_mb (tdm_reservation_resize, under the lease keeper's
 * lock): call again with the same *ticket until *granted. On the CPU: granted at once. A run in
 * the reservation of `tandem gpu run` cannot grow it (TDM_ERR_BUSY naming it); a shrink there
 * is granted without a ledger change. dev->budget_mb follows. */
tdm_status tdm_device_resize(tdm_device *dev, int64_t budget_mb, bool wait, int64_t *ticket,
                             bool *granted, tdm_wait_report *report, tdm_error *err);
void tdm_device_resize_cancel(tdm_device *dev, int64_t *ticket);

/* For a co-training host's admission (tdm_memory_plan_admit): *growable_mb, the most its
 * reservation can be now (tdm_device_growable_mb on its GPU), and *capacity_mb, the most it can
 * ever be (the GPU's reservable capacity). Under tandem gpu run (an adopted reservation, which
 * cannot grow) *growable_mb is its budget and *capacity_mb -1; -1 both on the CPU or when the
 * inventory does not list the GPU. */
tdm_status tdm_device_growth_budget(const tdm_device *dev, int64_t *growable_mb,
                                    int64_t *capacity_mb, tdm_error *err);

/* Frees the backend and releases the reservation. A zeroed device is accepted. */
void tdm_device_close(tdm_device *dev);

/* The waiting message: what a run waits for, what is free on gpu, and who holds it (the ledger's
 * reservations and the processes the inventory lists outside the ledger, with pid, name, MiB).
 * Also says when the budget can only start after processes outside the ledger exit. Pure:
 * writes at most cap bytes of buf. */
void tdm_device_describe_wait(char *buf, size_t cap, int64_t budget_mb, double elapsed_sec,
                              const tdm_gpu *gpu, const tdm_ledger_state *ledger);

#endif
