/* inventory.c — which GPUs this machine has; see inventory.h for the sources and their order. */
#include "gpu/inventory.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/fake_gpus.h"
#include "gpu/nvml.h"
#include "gpu/visible_devices.h"

/* Appends a sentence to inv->note, separated by "; ". */
static void add_note(tdm_inventory *inv, const char *text)
{
    if (!text[0]) return;
    size_t used = strlen(inv->note);
    snprintf(inv->note + used, sizeof inv->note - used, "%s%s", used ? "; " : "", text);
}

/* Keeps only the GPUs CUDA_VISIBLE_DEVICES lets through, in its order; frees the others. */
static tdm_status apply_visible_devices(tdm_inventory *inv, tdm_gpu *all, size_t n_all,
                                        tdm_error *err)
{
    size_t *picked = malloc((n_all ? n_all : 1) * sizeof *picked);
    tdm_gpu *kept = calloc(n_all ? n_all : 1, sizeof *kept);
    if (!picked || !kept) {
        free(picked);
        free(kept);
        tdm_gpu_list_free(all, n_all);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory filtering GPUs");
    }
    size_t n_picked = 0;
    char note[sizeof inv->note];
    tdm_visible_devices_select(getenv("CUDA_VISIBLE_DEVICES"), all, n_all, picked, &n_picked, note,
                               sizeof note);
    add_note(inv, note);
    for (size_t i = 0; i < n_picked; i++) {
        kept[i] = all[picked[i]];
        all[picked[i]].processes = NULL; /* moved into kept */
        all[picked[i]].n_processes = 0;
    }
    tdm_gpu_list_free(all, n_all);
    free(picked);
    inv->gpus = kept;
    inv->n_gpus = n_picked;
    return TDM_OK;
}

tdm_status tdm_inventory_query_with(tdm_inventory *inv, const tdm_inventory_options *opts,
                                    tdm_error *err)
{
    static const tdm_inventory_options defaults = {0};
    if (!opts) opts = &defaults;
    memset(inv, 0, sizeof *inv);
    inv->source = "none";

    tdm_gpu *all = NULL;
    size_t n_all = 0;
    tdm_status st;
    const char *fake = getenv("TANDEM_FAKE_GPUS");
    if (fake) {
        /* The simulation seam: NVML is not touched at all. */
        st = tdm_fake_gpus_load(fake, &all, &n_all, err);
        if (st != TDM_OK) return st;
        inv->source = "fake";
        if (n_all == 0) add_note(inv, "TANDEM_FAKE_GPUS lists no GPU");
    } else {
        char why[sizeof inv->note] = "";
        const tdm_nvml *nvml = tdm_nvml_acquire(opts->nvml_library, why, sizeof why);
        if (!nvml) {
            add_note(inv, why); /* no NVML: an empty inventory, not an error */
            return TDM_OK;
        }
        st = tdm_nvml_list(nvml, opts->meminfo_path, &all, &n_all, inv->driver_version,
                           sizeof inv->driver_version, inv->note, sizeof inv->note, err);
        tdm_nvml_release(nvml);
        if (st != TDM_OK) return st;
        inv->source = "nvml";
        if (n_all == 0) add_note(inv, "NVML reports no GPU");
    }
    return apply_visible_devices(inv, all, n_all, err);
}

tdm_status tdm_inventory_query(tdm_inventory *inv, tdm_error *err)
{
    return tdm_inventory_query_with(inv, NULL, err);
}

void tdm_inventory_free(tdm_inventory *inv)
{
    if (!inv) return;
    tdm_gpu_list_free(inv->gpus, inv->n_gpus);
    inv->gpus = NULL;
    inv->n_gpus = 0;
}

const tdm_gpu *tdm_inventory_find(const tdm_inventory *inv, const char *uuid_or_index)
{
    const char *s = uuid_or_index;
    if (!s || !s[0]) return NULL;
    size_t len = strlen(s);
    if (strspn(s, "0123456789") == len && len <= 9) {
        int index = atoi(s);
        for (size_t i = 0; i < inv->n_gpus; i++)
            if (inv->gpus[i].index == index) return &inv->gpus[i];
    }
    const tdm_gpu *prefix_match = NULL;
    int prefix_matches = 0;
    for (size_t i = 0; i < inv->n_gpus; i++) {
        if (strcmp(inv->gpus[i].uuid, s) == 0) return &inv->gpus[i];
        if (strncmp(inv->gpus[i].uuid, s, len) == 0) {
            prefix_match = &inv->gpus[i];
            prefix_matches++;
        }
    }
    return prefix_matches == 1 ? prefix_match : NULL;
}

int64_t tdm_gpu_process_used_mb(const tdm_gpu *gpu, uint32_t pid)
{
    for (size_t i = 0; i < gpu->n_processes; i++)
        if (gpu->processes[i].pid == pid) return gpu->processes[i].used_mb;
    return -1;
}

const char *tdm_memory_type_str(tdm_memory_type t)
{
    return t == TDM_MEMORY_UNIFIED ? "unified" : "discrete";
}

const char *tdm_compute_mode_str(int compute_mode)
{
    switch (compute_mode) {
    case TDM_COMPUTE_DEFAULT:
        return "default";
    case TDM_COMPUTE_EXCLUSIVE_THREAD:
        return "exclusive_thread";
    case TDM_COMPUTE_PROHIBITED:
        return "prohibited";
    case TDM_COMPUTE_EXCLUSIVE_PROCESS:
        return "exclusive_process";
    }
    return "unknown";
}
