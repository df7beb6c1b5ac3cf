/* nvml.h — NVIDIA's management library, loaded at run time.
 *
 * tandem never links against NVML and never includes nvml.h (it may be absent): this file declares
 * the few NVML types it uses, with the layouts of NVML's public header, and nvml.c finds the
 * functions in libnvidia-ml.so.1 with dlopen/dlsym. NVML reads the driver's bookkeeping; it creates
 * no CUDA context and takes no device memory, so querying it is safe on a GPU others are using.
 *
 * All NVML sizes are in bytes; everything this module hands out is in MiB (bytes >> 20, rounded
 * down, as nvidia-smi does).
 */
#ifndef TANDEM_GPU_NVML_H
#define TANDEM_GPU_NVML_H
#include <stdbool.h>
#include <stddef.h>

#include "gpu/inventory.h"
#include "util/error.h"

/* nvmlReturn_t: an enum in NVML, passed as int. Only the values tandem looks at. */
typedef int tdm_nvml_return;
enum {
    TDM_NVML_SUCCESS = 0,
    TDM_NVML_ERROR_NOT_SUPPORTED = 3,
    TDM_NVML_ERROR_INSUFFICIENT_SIZE = 7,
    TDM_NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    TDM_NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
};

/* nvmlDevice_t: an opaque handle. */
typedef struct tdm_nvml_device_st *tdm_nvml_device;

/* NVML_VALUE_NOT_AVAILABLE, as it appears in an unsigned long long field (e.g. a process's memory
 * when the driver cannot attribute it, under some hypervisors and on unified-memory GPUs). */
#define TDM_NVML_VALUE_NOT_AVAILABLE (~0ULL)

/* Buffer sizes NVML guarantees to be enough (the *_V2_BUFFER_SIZE constants). */
#define TDM_NVML_UUID_BUFFER_SIZE 96
#define TDM_NVML_NAME_BUFFER_SIZE 96
#define TDM_NVML_DRIVER_VERSION_BUFFER_SIZE 80

/* nvmlMemory_t, filled by nvmlDeviceGetMemoryInfo. Bytes; used includes driver-reserved memory. */
typedef struct tdm_nvml_memory_v1 {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} tdm_nvml_memory_v1;

/* nvmlMemory_v2_t, filled by nvmlDeviceGetMemoryInfo_v2. Bytes; reserved (driver/firmware) is
 * split out of used, so used + reserved + free = total. version must be set before the call. */
typedef struct tdm_nvml_memory_v2 {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} tdm_nvml_memory_v2;

/* NVML_STRUCT_VERSION(Memory, 2): the struct's size in the low bits, the version in bits 24+. */
#define TDM_NVML_MEMORY_V2_VERSION ((unsigned int)(sizeof(tdm_nvml_memory_v2) | (2u << 24)))

/* nvmlProcessInfo_v1_t, for nvmlDeviceGetComputeRunningProcesses (the unversioned one). */
typedef struct tdm_nvml_process_v1 {
    unsigned int pid;
    unsigned long long used_gpu_memory; /* bytes, or TDM_NVML_VALUE_NOT_AVAILABLE */
} tdm_nvml_process_v1;

/* nvmlProcessInfo_t (= nvmlProcessInfo_v2_t), for the _v2 and _v3 process queries. */
typedef struct tdm_nvml_process_v2 {
    unsigned int pid;
    unsigned long long used_gpu_memory; /* bytes, or TDM_NVML_VALUE_NOT_AVAILABLE */
    unsigned int gpu_instance_id;       /* MIG only; 0xFFFFFFFF otherwise */
    unsigned int compute_instance_id;
} tdm_nvml_process_v2;

/* The entry points tandem uses. Optional ones are NULL when this driver lacks them. */
typedef struct tdm_nvml {
    void *lib;                                            /* dlopen handle */
    tdm_nvml_return (*init)(void);                        /* nvmlInit_v2, else nvmlInit */
    tdm_nvml_return (*shutdown)(void);                    /* nvmlShutdown */
    tdm_nvml_return (*device_count)(unsigned int *count); /* nvmlDeviceGetCount_v2, else v1 */
    tdm_nvml_return (*device_handle)(unsigned int index, tdm_nvml_device *device);
    tdm_nvml_return (*device_uuid)(tdm_nvml_device, char *uuid, unsigned int length);
    tdm_nvml_return (*device_name)(tdm_nvml_device, char *name, unsigned int length);
    tdm_nvml_return (*device_index)(tdm_nvml_device, unsigned int *index); /* optional */
    tdm_nvml_return (*memory_v2)(tdm_nvml_device, tdm_nvml_memory_v2 *);   /* optional */
    tdm_nvml_return (*memory_v1)(tdm_nvml_device, tdm_nvml_memory_v1 *);   /* optional */
    tdm_nvml_return (*compute_mode)(tdm_nvml_device, int *mode);           /* optional */
    /* nvmlDeviceGetComputeRunningProcesses_v3 / _v2 / (v1); all optional. On
     * TDM_NVML_ERROR_INSUFFICIENT_SIZE, *count is set to the size needed. */
    tdm_nvml_return (*processes_v3)(tdm_nvml_device, unsigned int *count, tdm_nvml_process_v2 *);
    tdm_nvml_return (*processes_v2)(tdm_nvml_device, unsigned int *count, tdm_nvml_process_v2 *);
    tdm_nvml_return (*processes_v1)(tdm_nvml_device, unsigned int *count, tdm_nvml_process_v1 *);
    tdm_nvml_return (*driver_version)(char *version, unsigned int length); /* optional */
    const char *(*error_string)(tdm_nvml_return);
} tdm_nvml;

/* Loads and initializes NVML. library NULL means "libnvidia-ml.so.1", loaded and initialized once
 * per process and kept (nvmlInit can take a second per GPU when no persistence daemon holds the
 * driver, and the guard asks often); any other name is a test seam, loaded afresh. Returns NULL
 * when NVML is unusable, with a one-line reason in why (cap bytes), e.g. "libnvidia-ml.so.1 not
 * found (no NVIDIA driver)". Thread-safe. Pair every success with tdm_nvml_release.
 * The kept NVML belongs to the process that loaded it: a forked child should exec before it
 * queries (NVML makes no promise about state inherited through fork). */
const tdm_nvml *tdm_nvml_acquire(const char *library, char *why, size_t why_cap);

/* Releases what tdm_nvml_acquire gave (the shared default stays loaded). NULL is allowed. */
void tdm_nvml_release(const tdm_nvml *nvml);

/* Lists every GPU NVML sees, in NVML index order, into a malloc'd array (free with
 * tdm_gpu_list_free). Unified-memory GPUs (tdm_gpu_name_is_unified, or NVML answering
 * NOT_SUPPORTED or a total of 0 for memory) take their numbers from meminfo_path (NULL:
 * /proc/meminfo). A GPU NVML cannot describe (it fell off the bus) is skipped and one whose memory
 * query fails gets 0 MiB everywhere; both are explained in note (cap bytes, appended to).
 * driver_version (cap bytes) gets the driver's version or "". A failing device count is TDM_ERR_IO;
 * an unreadable meminfo for a unified GPU is that read's error. */
tdm_status tdm_nvml_list(const tdm_nvml *nvml, const char *meminfo_path, tdm_gpu **gpus,
                         size_t *n_gpus, char *driver_version, size_t driver_cap, char *note,
                         size_t note_cap, tdm_error *err);

/* True when a GPU's name says it shares system memory: it contains, as a whole word and ignoring
 * case, Jetson, Orin, Xavier, Thor, Tegra or GB10 (DGX Spark). "GB100" or "GB200" do not match. */
bool tdm_gpu_name_is_unified(const char *name);

#endif
