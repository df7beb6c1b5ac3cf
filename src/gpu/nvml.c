/* nvml.c — see nvml.h. */
#include "gpu/nvml.h"

#include <ctype.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/meminfo.h"

#define DEFAULT_LIBRARY "libnvidia-ml.so.1"

/* The process-wide default NVML (see tdm_nvml_acquire). */
static pthread_mutex_t shared_lock = PTHREAD_MUTEX_INITIALIZER;
static tdm_nvml shared;
static bool shared_ready;

/* The first of two names the library defines (the newer one first), or NULL. */
static void *sym2(void *lib, const char *name, const char *fallback)
{
    void *f = dlsym(lib, name);
    if (!f && fallback) f = dlsym(lib, fallback);
    return f;
}

/* Casting dlsym's void * to a function pointer is what POSIX dlsym is for. */
#define LOAD(field, name, fallback)                                                                \
    api->field = (__typeof__(api->field))sym2(api->lib, name, fallback)

/* Fills api from library and runs nvmlInit. False, with why filled, when unusable. */
static bool load(tdm_nvml *api, const char *library, char *why, size_t why_cap)
{
    memset(api, 0, sizeof *api);
    dlerror();
    api->lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    if (!api->lib) {
        const char *detail = dlerror();
        snprintf(why, why_cap, "%s not found (no NVIDIA driver?)%s%s", library, detail ? ": " : "",
                 detail ? detail : "");
        return false;
    }
    LOAD(init, "nvmlInit_v2", "nvmlInit");
    LOAD(shutdown, "nvmlShutdown", NULL);
    LOAD(device_count, "nvmlDeviceGetCount_v2", "nvmlDeviceGetCount");
    LOAD(device_handle, "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex");
    LOAD(device_uuid, "nvmlDeviceGetUUID", NULL);
    LOAD(device_name, "nvmlDeviceGetName", NULL);
    LOAD(device_index, "nvmlDeviceGetIndex", NULL);
    LOAD(memory_v2, "nvmlDeviceGetMemoryInfo_v2", NULL);
    LOAD(memory_v1, "nvmlDeviceGetMemoryInfo", NULL);
    LOAD(compute_mode, "nvmlDeviceGetComputeMode", NULL);
    LOAD(processes_v3, "nvmlDeviceGetComputeRunningProcesses_v3", NULL);
    LOAD(processes_v2, "nvmlDeviceGetComputeRunningProcesses_v2", NULL);
    LOAD(processes_v1, "nvmlDeviceGetComputeRunningProcesses", NULL);
    LOAD(driver_version, "nvmlSystemGetDriverVersion", NULL);
    LOAD(error_string, "nvmlErrorString", NULL);

    const char *missing = !api->init                           ? "nvmlInit_v2"
                          : !api->shutdown                     ? "nvmlShutdown"
                          : !api->device_count                 ? "nvmlDeviceGetCount_v2"
                          : !api->device_handle                ? "nvmlDeviceGetHandleByIndex_v2"
                          : !api->device_uuid                  ? "nvmlDeviceGetUUID"
                          : !api->device_name                  ? "nvmlDeviceGetName"
                          : !api->error_string                 ? "nvmlErrorString"
                          : !api->memory_v2 && !api->memory_v1 ? "nvmlDeviceGetMemoryInfo"
                                                               : NULL;
    if (missing) {
        snprintf(why, why_cap, "%s lacks %s (driver too old?)", library, missing);
        dlclose(api->lib);
        api->lib = NULL;
        return false;
    }
    tdm_nvml_return r = api->init();
    if (r != TDM_NVML_SUCCESS) {
        snprintf(why, why_cap, "nvmlInit failed: %s", api->error_string(r));
        dlclose(api->lib);
        api->lib = NULL;
        return false;
    }
    return true;
}

const tdm_nvml *tdm_nvml_acquire(const char *library, char *why, size_t why_cap)
{
    if (library) {
        tdm_nvml *api = malloc(sizeof *api);
        if (!api) {
            snprintf(why, why_cap, "out of memory loading %s", library);
            return NULL;
        }
        if (!load(api, library, why, why_cap)) {
            free(api);
            return NULL;
        }
        return api;
    }
    pthread_mutex_lock(&shared_lock);
    /* A failure is not remembered: the driver may be loaded later, and a dlopen that finds
     * nothing costs microseconds. */
    if (!shared_ready) shared_ready = load(&shared, DEFAULT_LIBRARY, why, why_cap);
    bool ready = shared_ready;
    pthread_mutex_unlock(&shared_lock);
    return ready ? &shared : NULL;
}

void tdm_nvml_release(const tdm_nvml *nvml)
{
    if (!nvml || nvml == &shared) return;
    nvml->shutdown();
    dlclose(nvml->lib);
    free((tdm_nvml *)nvml);
}

bool tdm_gpu_name_is_unified(const char *name)
{
    /* Jetson modules (Xavier, Orin, Thor; NVML names them "Orin (nvgpu)" and the like), older
     * Tegra parts, and the GB10 superchip of DGX Spark all allocate from system RAM. */
    static const char *const words[] = {"jetson", "orin", "xavier", "thor", "tegra", "gb10"};
    for (size_t w = 0; w < sizeof words / sizeof words[0]; w++) {
        size_t len = strlen(words[w]);
        for (const char *p = name; *p; p++) {
            if (strncasecmp(p, words[w], len) != 0) continue;
            bool starts = p == name || !isalnum((unsigned char)p[-1]);
            bool ends = !isalnum((unsigned char)p[len]);
            if (starts && ends) return true;
        }
    }
    return false;
}

/* Appends a sentence to note (cap bytes), separated by "; ". */
static void note_add(char *note, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void note_add(char *note, size_t cap, const char *fmt, ...)
{
    size_t used = strnlen(note, cap);
    if (used + 3 >= cap) return;
    if (used) {
        memcpy(note + used, "; ", 3);
        used += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(note + used, cap - used, fmt, ap);
    va_end(ap);
}

static int64_t bytes_to_mb(unsigned long long bytes)
{
    return (int64_t)(bytes >> 20);
}

/* The compute processes NVML lists on dev, newest interface first. The list can grow between the
 * size query and the fill, so INSUFFICIENT_SIZE is retried with what NVML asked for plus room.
 * Errors leave the list empty: some GPUs and containers cannot list processes at all. */
static tdm_status list_processes(const tdm_nvml *api, tdm_nvml_device dev, tdm_gpu *g,
                                 tdm_error *err)
{
    for (int version = 3; version >= 1; version--) {
        if ((version == 3 && !api->processes_v3) || (version == 2 && !api->processes_v2) ||
            (version == 1 && !api->processes_v1))
            continue;
        size_t stride = version == 1 ? sizeof(tdm_nvml_process_v1) : sizeof(tdm_nvml_process_v2);
        unsigned int cap = 32;
        for (int attempt = 0; attempt < 6; attempt++) {
            void *buf = calloc(cap, stride);
            if (!buf) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory listing GPU processes");
            unsigned int count = cap;
            tdm_nvml_return r = version == 3   ? api->processes_v3(dev, &count, buf)
                                : version == 2 ? api->processes_v2(dev, &count, buf)
                                               : api->processes_v1(dev, &count, buf);
            if (r == TDM_NVML_ERROR_INSUFFICIENT_SIZE) {
                free(buf);
                cap = (count > cap ? count : cap * 2) + 16;
                continue;
            }
            if (r != TDM_NVML_SUCCESS || count == 0) {
                free(buf);
                if (r == TDM_NVML_SUCCESS) return TDM_OK; /* no processes */
                break; /* this interface failed: try the older one */
            }
            g->processes = calloc(count, sizeof *g->processes);
            if (!g->processes) {
                free(buf);
                return tdm_fail(err, TDM_ERR_NOMEM, "out of memory listing GPU processes");
            }
            for (unsigned int i = 0; i < count && i < cap; i++) {
                unsigned int pid;
                unsigned long long used;
                if (version == 1) {
                    pid = ((tdm_nvml_process_v1 *)buf)[i].pid;
                    used = ((tdm_nvml_process_v1 *)buf)[i].used_gpu_memory;
                } else {
                    pid = ((tdm_nvml_process_v2 *)buf)[i].pid;
                    used = ((tdm_nvml_process_v2 *)buf)[i].used_gpu_memory;
                }
                g->processes[g->n_processes++] = (tdm_gpu_process){
                    .pid = pid,
                    .used_mb = used == TDM_NVML_VALUE_NOT_AVAILABLE ? -1 : bytes_to_mb(used)};
            }
            free(buf);
            return TDM_OK;
        }
    }
    return TDM_OK;
}

/* Memory numbers for one GPU, in MiB. Returns the NVML status of the last call tried. */
static tdm_nvml_return query_memory(const tdm_nvml *api, tdm_nvml_device dev, int64_t *total,
                                    int64_t *used, int64_t *free_mb)
{
    tdm_nvml_return r = TDM_NVML_ERROR_FUNCTION_NOT_FOUND;
    if (api->memory_v2) {
        tdm_nvml_memory_v2 m = {.version = TDM_NVML_MEMORY_V2_VERSION};
        r = api->memory_v2(dev, &m);
        if (r == TDM_NVML_SUCCESS) {
            *total = bytes_to_mb(m.total);
            *used = bytes_to_mb(m.used);
            *free_mb = bytes_to_mb(m.free);
            return r;
        }
    }
    /* v2 is absent, or this driver refuses it (old driver, unknown version): ask v1. */
    if (api->memory_v1) {
        tdm_nvml_memory_v1 m = {0};
        r = api->memory_v1(dev, &m);
        if (r == TDM_NVML_SUCCESS) {
            *total = bytes_to_mb(m.total);
            *used = bytes_to_mb(m.used);
            *free_mb = bytes_to_mb(m.free);
        }
    }
    return r;
}

tdm_status tdm_nvml_list(const tdm_nvml *api, const char *meminfo_path, tdm_gpu **gpus,
                         size_t *n_gpus, char *driver_version, size_t driver_cap, char *note,
                         size_t note_cap, tdm_error *err)
{
    *gpus = NULL;
    *n_gpus = 0;
    if (driver_cap) driver_version[0] = '\0';
    if (api->driver_version) {
        char v[TDM_NVML_DRIVER_VERSION_BUFFER_SIZE] = "";
        if (api->driver_version(v, sizeof v) == TDM_NVML_SUCCESS)
            snprintf(driver_version, driver_cap, "%s", v);
    }
    unsigned int count = 0;
    tdm_nvml_return r = api->device_count(&count);
    if (r != TDM_NVML_SUCCESS)
        return tdm_fail(err, TDM_ERR_IO, "NVML: cannot count GPUs: %s", api->error_string(r));
    tdm_gpu *list = calloc(count ? count : 1, sizeof *list);
    if (!list) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory listing GPUs");
    size_t n = 0;
    tdm_status st = TDM_OK;
    for (unsigned int i = 0; i < count && st == TDM_OK; i++) {
        tdm_nvml_device dev;
        char uuid[TDM_NVML_UUID_BUFFER_SIZE] = "";
        r = api->device_handle(i, &dev);
        if (r == TDM_NVML_SUCCESS) r = api->device_uuid(dev, uuid, sizeof uuid);
        if (r != TDM_NVML_SUCCESS || uuid[0] == '\0') {
            note_add(note, note_cap, "NVML GPU %u skipped: %s", i,
                     r != TDM_NVML_SUCCESS ? api->error_string(r) : "no UUID");
            continue;
        }
        tdm_gpu *g = &list[n++];
        snprintf(g->uuid, sizeof g->uuid, "%s", uuid);
        char name[TDM_NVML_NAME_BUFFER_SIZE] = "";
        if (api->device_name(dev, name, sizeof name) != TDM_NVML_SUCCESS)
            snprintf(name, sizeof name, "NVIDIA GPU");
        snprintf(g->name, sizeof g->name, "%s", name);
        unsigned int index = i;
        if (api->device_index && api->device_index(dev, &index) != TDM_NVML_SUCCESS) index = i;
        g->index = (int)index;
        int mode = -1;
        if (!api->compute_mode || api->compute_mode(dev, &mode) != TDM_NVML_SUCCESS) mode = -1;
        g->compute_mode = mode;

        r = query_memory(api, dev, &g->total_mb, &g->used_mb, &g->free_mb);
        bool unified = tdm_gpu_name_is_unified(g->name) || r == TDM_NVML_ERROR_NOT_SUPPORTED ||
                       (r == TDM_NVML_SUCCESS && g->total_mb == 0);
        if (unified) {
            /* Shares system RAM: what it can still allocate is what the kernel can give. */
            g->memory_type = TDM_MEMORY_UNIFIED;
            int64_t total_mb, avail_mb;
            st = tdm_meminfo_read(meminfo_path, &total_mb, &avail_mb, err);
            if (st != TDM_OK) break;
            g->total_mb = total_mb;
            g->free_mb = avail_mb;
            g->used_mb = total_mb - avail_mb;
        } else if (r != TDM_NVML_SUCCESS) {
            /* Nothing is known, so nothing is offered: 0 free means no job is placed here. */
            g->memory_type = TDM_MEMORY_DISCRETE;
            g->total_mb = g->used_mb = g->free_mb = 0;
            note_add(note, note_cap, "%s: memory query failed: %s", g->uuid, api->error_string(r));
        } else {
            g->memory_type = TDM_MEMORY_DISCRETE;
        }
        st = list_processes(api, dev, g, err);
    }
    if (st != TDM_OK) {
        tdm_gpu_list_free(list, n);
        return st;
    }
    *gpus = list;
    *n_gpus = n;
    return TDM_OK;
}
