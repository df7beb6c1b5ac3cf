/* visible_devices.c — see visible_devices.h. */
#include "gpu/visible_devices.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* Position in gpus of the GPU one entry names, or -1 when it names none or several. */
static long match_entry(const char *e, size_t len, const tdm_gpu *gpus, size_t n)
{
    if (len == 0) return -1;
    bool digits = true;
    for (size_t i = 0; i < len; i++)
        digits = digits && e[i] >= '0' && e[i] <= '9';
    if (digits) {
        long value = 0;
        for (size_t i = 0; i < len && value <= 1000000; i++)
            value = value * 10 + (e[i] - '0');
        for (size_t k = 0; k < n; k++)
            if (gpus[k].index == value) return (long)k;
        return -1;
    }
    /* A UUID: an exact match wins, else the prefix must be unique. CUDA itself only knows
     * "GPU-..." UUIDs; simulated GPUs may be named anything, so any non-numeric entry is tried. */
    long found = -1;
    int matches = 0;
    for (size_t k = 0; k < n; k++) {
        if (strlen(gpus[k].uuid) == len && memcmp(gpus[k].uuid, e, len) == 0) return (long)k;
        if (strncmp(gpus[k].uuid, e, len) == 0) {
            found = (long)k;
            matches++;
        }
    }
    return matches == 1 ? found : -1;
}

void tdm_visible_devices_select(const char *spec, const tdm_gpu *gpus, size_t n, size_t *picked,
                                size_t *n_picked, char *note, size_t note_cap)
{
    if (note && note_cap) note[0] = '\0';
    *n_picked = 0;
    if (!spec) {
        for (size_t k = 0; k < n; k++)
            picked[(*n_picked)++] = k;
        return;
    }
    if (spec[0] == '\0') {
        if (n > 0 && note && note_cap)
            snprintf(note, note_cap, "CUDA_VISIBLE_DEVICES is empty: every GPU is hidden");
        return;
    }
    const char *p = spec;
    for (int number = 1;; number++) {
        size_t len = strcspn(p, ",");
        const char *e = p;
        size_t elen = len;
        while (elen && (*e == ' ' || *e == '\t'))
            e++, elen--;
        while (elen && (e[elen - 1] == ' ' || e[elen - 1] == '\t'))
            elen--;
        long k = match_entry(e, elen, gpus, n);
        for (size_t i = 0; k >= 0 && i < *n_picked; i++)
            if (picked[i] == (size_t)k) k = -1; /* a repeat is invalid for CUDA too */
        if (k < 0) {
            if (note && note_cap)
                snprintf(note, note_cap,
                         "CUDA_VISIBLE_DEVICES entry %d ('%.*s') names no GPU (or one already "
                         "listed); it and the entries after it are ignored, as CUDA does",
                         number, (int)elen, e);
            return;
        }
        picked[(*n_picked)++] = (size_t)k;
        if (p[len] == '\0') return;
        p += len + 1; /* past the comma; a trailing comma makes an empty, invalid entry */
    }
}
