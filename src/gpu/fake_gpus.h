/* fake_gpus.h — the TANDEM_FAKE_GPUS simulation seam: a GPU inventory described in text.
 *
 * It exists for tests and for GPU-less machines (demos, CI): with it set, NVML is never touched and
 * the inventory is exactly what the text says. Grammar (docs/gpu-inventory.md has the full story):
 *
 *   spec    := entry { (';' | '\n') entry }         blank entries are skipped
 *   entry   := field { ',' field } | '#' comment     a '#' comment runs to the end of the line
 *   field   := key '=' value                         spaces around keys and values are trimmed
 *   GPU     : uuid=S (required), total_mb=N (required, > 0), name=S, memory=discrete|unified,
 *             used_mb=N, compute_mode=default|exclusive_process|exclusive_thread|prohibited
 *   process : pid=N (required, > 0), gpu=UUID (required, a GPU of this spec), used_mb=N
 *
 * An entry with a pid key is a process, any other a GPU. A GPU without used_mb uses what its
 * processes use (their used_mb summed); free_mb = total_mb - used_mb. A process without used_mb
 * reports -1 ("NVML cannot tell"), as NVML does under some hypervisors. Numbers are decimal MiB.
 * Parsing is strict: anything else is TDM_ERR_INVALID naming the entry number (1-based, counting
 * non-blank entries) and, for the file form, FILE:LINE.
 */
#ifndef TANDEM_GPU_FAKE_GPUS_H
#define TANDEM_GPU_FAKE_GPUS_H
#include <stddef.h>

#include "gpu/inventory.h"
#include "util/error.h"

/* Parses spec into a malloc'd array of GPUs (index = position among the GPU entries, from 0), in
 * the order written. origin names the file the text came from (NULL: the environment variable) and
 * only shapes error messages. On error *gpus is NULL and *n_gpus 0. Free with tdm_gpu_list_free. */
tdm_status tdm_fake_gpus_parse(const char *spec, const char *origin, tdm_gpu **gpus, size_t *n_gpus,
                               tdm_error *err);

/* Takes the value of TANDEM_FAKE_GPUS: "@/path/file" reads that file now (every call reads it
 * again, so a test can change the simulated world while jobs run), anything else is the spec
 * itself. A missing file is TDM_ERR_NOT_FOUND, an unreadable one TDM_ERR_IO. */
tdm_status tdm_fake_gpus_load(const char *value, tdm_gpu **gpus, size_t *n_gpus, tdm_error *err);

#endif
