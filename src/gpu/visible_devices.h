/* visible_devices.h — CUDA_VISIBLE_DEVICES, interpreted the way the CUDA runtime does.
 *
 * The value is a comma list; each entry is either a decimal index or a GPU UUID, whole or a prefix
 * that names exactly one GPU ("GPU-8c2e"). The GPUs come out in the order listed. The first entry
 * that is invalid (empty, out of range, no or several UUID matches, a repeat, "-1") ends the list:
 * it and everything after it are ignored, the entries before it stay, exactly as CUDA behaves
 * (so CUDA_VISIBLE_DEVICES=-1 hides every GPU). An empty value hides every GPU; an unset one
 * hides none.
 *
 * Indices are matched against tdm_gpu.index (NVML's index, the PCI bus order). CUDA numbers GPUs
 * fastest-first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, so on a machine with different GPU models an
 * index may name a different GPU for CUDA: prefer UUIDs there.
 */
#ifndef TANDEM_GPU_VISIBLE_DEVICES_H
#define TANDEM_GPU_VISIBLE_DEVICES_H
#include <stddef.h>

#include "gpu/inventory.h"

/* Selects from gpus[0..n) the ones spec lets through. spec NULL means the variable is unset
 * (every GPU, in order). picked (room for n) receives positions into gpus in the spec's order and
 * *n_picked their count. When an entry ends the list early, or nothing is visible, note (cap
 * bytes, may be NULL) gets a sentence saying why; otherwise it is set to "". */
void tdm_visible_devices_select(const char *spec, const tdm_gpu *gpus, size_t n, size_t *picked,
                                size_t *n_picked, char *note, size_t note_cap);

#endif
