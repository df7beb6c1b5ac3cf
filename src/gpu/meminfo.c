/* meminfo.c — see meminfo.h. */
#include "gpu/meminfo.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "util/atomic_file.h"

/* Parses the value part of one line ("   16093724 kB") into KiB. */
static int parse_kib(const char *p, const char *end, int64_t *kib)
{
    while (p < end && (*p == ' ' || *p == '\t'))
        p++;
    if (p == end || *p < '0' || *p > '9') return -1;
    int64_t v = 0;
    while (p < end && *p >= '0' && *p <= '9') {
        if (v > (INT64_MAX - 9) / 10) return -1;
        v = v * 10 + (*p - '0');
        p++;
    }
    while (p < end && (*p == ' ' || *p == '\t'))
        p++;
    if ((size_t)(end - p) != 2 || memcmp(p, "kB", 2) != 0) return -1;
    *kib = v;
    return 0;
}

tdm_status tdm_meminfo_parse(const char *text, const char *origin, int64_t *total_mb,
                             int64_t *available_mb, tdm_error *err)
{
    const char *where = origin ? origin : "meminfo";
    int64_t total_kib = -1, avail_kib = -1, free_kib = -1;
    int line = 0;
    for (const char *p = text; *p;) {
        line++;
        const char *eol = strchr(p, '\n');
        const char *end = eol ? eol : p + strlen(p);
        const char *colon = memchr(p, ':', (size_t)(end - p));
        /* Only the three keys we use are checked; the rest of the file is none of our business
         * (its format varies between kernels, e.g. HugePages_Total has no unit). */
        int64_t *slot = NULL;
        if (colon) {
            size_t klen = (size_t)(colon - p);
            if (klen == 8 && memcmp(p, "MemTotal", 8) == 0)
                slot = &total_kib;
            else if (klen == 12 && memcmp(p, "MemAvailable", 12) == 0)
                slot = &avail_kib;
            else if (klen == 7 && memcmp(p, "MemFree", 7) == 0)
                slot = &free_kib;
        }
        if (slot && parse_kib(colon + 1, end, slot) != 0)
            return tdm_fail(err, TDM_ERR_PARSE, "%s:%d: expected '<number> kB' after '%.*s'", where,
                            line, (int)(colon - p + 1), p);
        p = eol ? eol + 1 : end;
    }
    if (total_kib < 0) return tdm_fail(err, TDM_ERR_PARSE, "%s: no MemTotal line", where);
    if (avail_kib < 0)
        avail_kib = free_kib; /* pre-3.14 kernel: MemFree underestimates, which is safe */
    if (avail_kib < 0)
        return tdm_fail(err, TDM_ERR_PARSE, "%s: neither MemAvailable nor MemFree", where);
    *total_mb = total_kib / 1024;
    *available_mb = avail_kib / 1024;
    return TDM_OK;
}

tdm_status tdm_meminfo_read(const char *path, int64_t *total_mb, int64_t *available_mb,
                            tdm_error *err)
{
    if (!path) path = "/proc/meminfo";
    char *text;
    size_t len;
    tdm_status st = tdm_read_file(path, &text, &len, err);
    if (st != TDM_OK) return st;
    st = tdm_meminfo_parse(text, path, total_mb, available_mb, err);
    free(text);
    return st;
}
