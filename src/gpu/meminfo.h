/* meminfo.h — system memory from /proc/meminfo, the truth for unified-memory GPUs.
 *
 * A unified-memory GPU (Jetson/Orin/Tegra, GB10) has no VRAM of its own: it allocates from system
 * RAM, so what it can still get is what the kernel says is available. /proc/meminfo lines look like
 *     MemTotal:       16093724 kB
 *     MemAvailable:    9876543 kB
 * (the kernel's "kB" is KiB). We read MemTotal and MemAvailable; on kernels older than 3.14, which
 * lack MemAvailable, MemFree stands in (smaller, so the estimate errs on the safe side).
 */
#ifndef TANDEM_GPU_MEMINFO_H
#define TANDEM_GPU_MEMINFO_H
#include <stdint.h>

#include "util/error.h"

/* Parses the text of /proc/meminfo. On success total_mb gets MemTotal and available_mb gets
 * MemAvailable (or MemFree when absent), both in MiB rounded down. A missing MemTotal, a missing
 * MemAvailable *and* MemFree, a value that is not a number or a unit other than "kB" is
 * TDM_ERR_PARSE naming "origin:LINE" (origin is a file name for messages, may be NULL). */
tdm_status tdm_meminfo_parse(const char *text, const char *origin, int64_t *total_mb,
                             int64_t *available_mb, tdm_error *err);

/* Reads and parses the file at path (NULL: "/proc/meminfo"). Tests pass their own file. */
tdm_status tdm_meminfo_read(const char *path, int64_t *total_mb, int64_t *available_mb,
                            tdm_error *err);

#endif
