/* inventory.h — which GPUs this machine has and how much memory each has free right now.
 *
 * Sources, in order:
 *   1. TANDEM_FAKE_GPUS (a simulation seam for tests and GPU-less machines; NVML is not touched).
 *      Entries are separated by ';' or newlines, each a comma list of key=value:
 *        uuid=GPU-sim-0,name=RTX 4090,total_mb=24564,memory=discrete[,used_mb=N][,compute_mode=M]
 *        pid=1234,gpu=GPU-sim-0,used_mb=900      (a process the simulated GPU "sees")
 *      A value of the form "@/path/file" reads the spec from that file at every query, so a test
 *      can change the simulated world while jobs run (a foreign program taking memory, a process's
 *      usage growing). Unified-memory entries take total/free from the spec, not /proc/meminfo.
 *   2. NVML, loaded at run time with dlopen("libnvidia-ml.so.1"): no link-time dependency, no CUDA
 *      context, no device memory used.
 *   3. Nothing: an empty inventory (not an error).
 * CUDA_VISIBLE_DEVICES (indices or UUIDs, comma separated) filters the list; GPUs are always
 * identified by UUID, never by index.
 */
#ifndef TANDEM_GPU_INVENTORY_H
#define TANDEM_GPU_INVENTORY_H
#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

typedef enum tdm_memory_type {
    TDM_MEMORY_DISCRETE = 0, /* own VRAM: NVML's numbers are the truth */
    TDM_MEMORY_UNIFIED = 1,  /* shares system RAM (Jetson/Orin/Tegra, GB10): /proc/meminfo */
} tdm_memory_type;

/* NVML compute modes; -1 when unknown. */
enum { TDM_COMPUTE_DEFAULT = 0, TDM_COMPUTE_EXCLUSIVE_THREAD = 1, TDM_COMPUTE_PROHIBITED = 2,
       TDM_COMPUTE_EXCLUSIVE_PROCESS = 3 };

typedef struct tdm_gpu_process {
    uint32_t pid;
    int64_t used_mb; /* MiB, -1 when NVML cannot tell (e.g. under some hypervisors) */
} tdm_gpu_process;

typedef struct tdm_gpu {
    char uuid[96];   /* "GPU-8c2e..." — the key everywhere */
    char name[96];   /* "NVIDIA H200" */
    int index;       /* NVML index (or position in the fake list); display only */
    tdm_memory_type memory_type;
    int64_t total_mb; /* MiB; unified: MemTotal */
    int64_t used_mb;  /* MiB; unified: MemTotal - MemAvailable */
    int64_t free_mb;  /* MiB; unified: MemAvailable */
    int compute_mode; /* TDM_COMPUTE_*, -1 unknown */
    tdm_gpu_process *processes; /* running compute processes NVML reports */
    size_t n_processes;
} tdm_gpu;

typedef struct tdm_inventory {
    tdm_gpu *gpus;
    size_t n_gpus;
    const char *source;  /* "fake", "nvml" or "none" (static string) */
    char driver_version[32]; /* "" when unknown */
    char note[256];      /* why the inventory is empty, e.g. "libnvidia-ml.so.1 not found" */
} tdm_inventory;

/* Fills inv (zeroed by the caller or not: it is overwritten). An absent NVML is not an error (an
 * empty inventory with a note); a malformed TANDEM_FAKE_GPUS is TDM_ERR_INVALID naming the entry.
 * Each call asks the source afresh (the "@file" form re-reads its file). On error inv is still an
 * empty inventory that tdm_inventory_free accepts. docs/gpu-inventory.md has the details. */
tdm_status tdm_inventory_query(tdm_inventory *inv, tdm_error *err);
void tdm_inventory_free(tdm_inventory *inv);

/* Seams for tests; every NULL field means the real thing. */
typedef struct tdm_inventory_options {
    const char *meminfo_path; /* where unified-memory GPUs read MemTotal/MemAvailable; NULL:
                                 /proc/meminfo */
    const char *nvml_library; /* NULL: libnvidia-ml.so.1 (loaded once per process); a test names
                                 one that does not exist to see the no-NVML path */
} tdm_inventory_options;

/* tdm_inventory_query with seams; opts NULL is the same as tdm_inventory_query. */
tdm_status tdm_inventory_query_with(tdm_inventory *inv, const tdm_inventory_options *opts,
                                    tdm_error *err);

/* Frees an array of n_gpus GPUs and their process lists (what the sources hand out). */
void tdm_gpu_list_free(tdm_gpu *gpus, size_t n_gpus);

/* Finds a GPU by UUID (exact or unique prefix) or by index ("0"); NULL when none matches.
 * An index is compared with tdm_gpu.index, the number `gpu status` shows (NVML's index), not the
 * position CUDA gives a GPU after CUDA_VISIBLE_DEVICES renumbering. An ambiguous prefix is NULL. */
const tdm_gpu *tdm_inventory_find(const tdm_inventory *inv, const char *uuid_or_index);

/* Memory used on gpu by the process pid (MiB), or -1 when the GPU does not list it. */
int64_t tdm_gpu_process_used_mb(const tdm_gpu *gpu, uint32_t pid);

const char *tdm_memory_type_str(tdm_memory_type t);
const char *tdm_compute_mode_str(int compute_mode);

#endif
