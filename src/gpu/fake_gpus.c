/* fake_gpus.c — see fake_gpus.h for the grammar.
 *
 * Two passes: the first splits the text into entries and parses each on its own (GPU or process);
 * the second attaches processes to their GPUs, which lets a process entry come before its GPU.
 */
#include "gpu/fake_gpus.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/atomic_file.h"

/* Largest accepted MiB value: 2^40 MiB (an exabyte) is beyond any machine, and keeps every sum of
 * a few thousand of them far from int64 overflow. */
#define FAKE_MAX_MB ((int64_t)1 << 40)

/* A piece of the spec text: not NUL-terminated. */
typedef struct span {
    const char *p;
    size_t len;
} span;

typedef struct fake_entry {
    int number; /* 1-based among non-blank entries, for messages */
    int line;   /* 1-based line of the spec text, for messages */
    bool is_process;
    tdm_gpu gpu;   /* GPU entries (processes attached in pass two) */
    bool has_used; /* GPU entry gave used_mb */
    uint32_t pid;  /* process entries */
    char gpu_uuid[sizeof(((tdm_gpu *)0)->uuid)];
    int64_t used_mb; /* process entries: -1 when not given */
} fake_entry;

/* Where an entry sits, prefixed to every message: "FILE:LINE: TANDEM_FAKE_GPUS entry N: ". */
typedef struct where {
    const char *origin;
    int line;
    int number;
} where;

static tdm_status entry_fail(tdm_error *err, const where *w, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static tdm_status entry_fail(tdm_error *err, const where *w, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (w->origin)
        return tdm_fail(err, TDM_ERR_INVALID, "%s:%d: TANDEM_FAKE_GPUS entry %d: %s", w->origin,
                        w->line, w->number, msg);
    return tdm_fail(err, TDM_ERR_INVALID, "TANDEM_FAKE_GPUS entry %d: %s", w->number, msg);
}

static span trim(span s)
{
    while (s.len && (s.p[0] == ' ' || s.p[0] == '\t' || s.p[0] == '\r'))
        s.p++, s.len--;
    while (s.len && (s.p[s.len - 1] == ' ' || s.p[s.len - 1] == '\t' || s.p[s.len - 1] == '\r'))
        s.len--;
    return s;
}

static bool span_is(span s, const char *word)
{
    return s.len == strlen(word) && memcmp(s.p, word, s.len) == 0;
}

/* Decimal digits only (no sign, no spaces), at most max. Returns false otherwise. */
static bool parse_count(span s, int64_t max, int64_t *out)
{
    if (s.len == 0) return false;
    int64_t v = 0;
    for (size_t i = 0; i < s.len; i++) {
        if (s.p[i] < '0' || s.p[i] > '9') return false;
        v = v * 10 + (s.p[i] - '0');
        if (v > max) return false;
    }
    *out = v;
    return true;
}

/* Copies s into a fixed buffer of size cap; false when it does not fit. */
static bool copy_span(char *dst, size_t cap, span s)
{
    if (s.len >= cap) return false;
    memcpy(dst, s.p, s.len);
    dst[s.len] = '\0';
    return true;
}

static const char *const GPU_KEYS = "uuid, name, total_mb, memory, used_mb, compute_mode";
static const char *const PROCESS_KEYS = "pid, gpu, used_mb";

/* Parses one GPU or process entry (already trimmed, non-blank, not a comment) into e. */
static tdm_status parse_entry(span text, const where *w, fake_entry *e, tdm_error *err)
{
    /* The kind decides which keys are legal, so look for a pid key first. */
    e->is_process = false;
    for (size_t i = 0; i < text.len;) {
        size_t j = i;
        while (j < text.len && text.p[j] != ',')
            j++;
        span f = trim((span){text.p + i, j - i});
        const char *eq = memchr(f.p, '=', f.len);
        if (eq && span_is(trim((span){f.p, (size_t)(eq - f.p)}), "pid")) e->is_process = true;
        i = j + 1;
    }

    e->gpu.index = -1;
    e->gpu.compute_mode = TDM_COMPUTE_DEFAULT;
    e->gpu.memory_type = TDM_MEMORY_DISCRETE;
    e->used_mb = -1;
    bool seen_uuid = false, seen_name = false, seen_total = false, seen_memory = false,
         seen_used = false, seen_mode = false, seen_pid = false, seen_gpu = false;

    for (size_t i = 0; i <= text.len;) {
        size_t j = i;
        while (j < text.len && text.p[j] != ',')
            j++;
        span f = trim((span){text.p + i, j - i});
        i = j + 1;
        if (f.len == 0) return entry_fail(err, w, "empty field (a stray ',')");
        const char *eq = memchr(f.p, '=', f.len);
        if (!eq) return entry_fail(err, w, "field '%.*s' is not key=value", (int)f.len, f.p);
        span key = trim((span){f.p, (size_t)(eq - f.p)});
        span val = trim((span){eq + 1, f.len - (size_t)(eq + 1 - f.p)});
        bool *seen = NULL;
        if (e->is_process) {
            if (span_is(key, "pid"))
                seen = &seen_pid;
            else if (span_is(key, "gpu"))
                seen = &seen_gpu;
            else if (span_is(key, "used_mb"))
                seen = &seen_used;
        } else {
            if (span_is(key, "uuid"))
                seen = &seen_uuid;
            else if (span_is(key, "name"))
                seen = &seen_name;
            else if (span_is(key, "total_mb"))
                seen = &seen_total;
            else if (span_is(key, "memory"))
                seen = &seen_memory;
            else if (span_is(key, "used_mb"))
                seen = &seen_used;
            else if (span_is(key, "compute_mode"))
                seen = &seen_mode;
        }
        if (!seen)
            return entry_fail(err, w, "unknown key '%.*s' (a %s entry takes %s)", (int)key.len,
                              key.p, e->is_process ? "process" : "GPU",
                              e->is_process ? PROCESS_KEYS : GPU_KEYS);
        if (*seen) return entry_fail(err, w, "duplicate key '%.*s'", (int)key.len, key.p);
        *seen = true;

        int64_t n;
        if (seen == &seen_uuid) {
            if (val.len == 0) return entry_fail(err, w, "empty uuid");
            if (!copy_span(e->gpu.uuid, sizeof e->gpu.uuid, val))
                return entry_fail(err, w, "uuid longer than %zu characters",
                                  sizeof e->gpu.uuid - 1);
        } else if (seen == &seen_name) {
            if (!copy_span(e->gpu.name, sizeof e->gpu.name, val))
                return entry_fail(err, w, "name longer than %zu characters",
                                  sizeof e->gpu.name - 1);
        } else if (seen == &seen_total) {
            if (!parse_count(val, FAKE_MAX_MB, &n) || n == 0)
                return entry_fail(err, w, "total_mb '%.*s' is not a positive whole number of MiB",
                                  (int)val.len, val.p);
            e->gpu.total_mb = n;
        } else if (seen == &seen_used) {
            if (!parse_count(val, FAKE_MAX_MB, &n))
                return entry_fail(err, w, "used_mb '%.*s' is not a whole number of MiB",
                                  (int)val.len, val.p);
            if (e->is_process)
                e->used_mb = n;
            else
                e->gpu.used_mb = n;
        } else if (seen == &seen_memory) {
            if (span_is(val, "discrete"))
                e->gpu.memory_type = TDM_MEMORY_DISCRETE;
            else if (span_is(val, "unified"))
                e->gpu.memory_type = TDM_MEMORY_UNIFIED;
            else
                return entry_fail(err, w, "memory '%.*s' must be discrete or unified", (int)val.len,
                                  val.p);
        } else if (seen == &seen_mode) {
            static const int modes[] = {TDM_COMPUTE_DEFAULT, TDM_COMPUTE_EXCLUSIVE_PROCESS,
                                        TDM_COMPUTE_EXCLUSIVE_THREAD, TDM_COMPUTE_PROHIBITED};
            bool ok = false;
            for (size_t m = 0; m < sizeof modes / sizeof modes[0] && !ok; m++)
                if (span_is(val, tdm_compute_mode_str(modes[m]))) {
                    e->gpu.compute_mode = modes[m];
                    ok = true;
                }
            if (!ok)
                return entry_fail(err, w,
                                  "compute_mode '%.*s' must be default, exclusive_process, "
                                  "exclusive_thread or prohibited",
                                  (int)val.len, val.p);
        } else if (seen == &seen_pid) {
            if (!parse_count(val, UINT32_MAX, &n) || n == 0)
                return entry_fail(err, w, "pid '%.*s' is not a positive whole number", (int)val.len,
                                  val.p);
            e->pid = (uint32_t)n;
        } else if (seen == &seen_gpu) {
            if (val.len == 0) return entry_fail(err, w, "empty gpu");
            if (!copy_span(e->gpu_uuid, sizeof e->gpu_uuid, val))
                return entry_fail(err, w, "gpu longer than %zu characters", sizeof e->gpu_uuid - 1);
        }
    }

    if (e->is_process) {
        if (!seen_gpu) return entry_fail(err, w, "process entry without gpu=UUID");
        return TDM_OK;
    }
    if (!seen_uuid) return entry_fail(err, w, "GPU entry without uuid");
    if (!seen_total) return entry_fail(err, w, "GPU entry without total_mb");
    if (!seen_name) snprintf(e->gpu.name, sizeof e->gpu.name, "Simulated GPU");
    e->has_used = seen_used;
    if (seen_used && e->gpu.used_mb > e->gpu.total_mb)
        return entry_fail(err, w, "used_mb %lld exceeds total_mb %lld", (long long)e->gpu.used_mb,
                          (long long)e->gpu.total_mb);
    return TDM_OK;
}

void tdm_gpu_list_free(tdm_gpu *gpus, size_t n_gpus)
{
    for (size_t i = 0; gpus && i < n_gpus; i++)
        free(gpus[i].processes);
    free(gpus);
}

/* Pass two: attach every process to its GPU, derive used/free, move the GPUs out. */
static tdm_status resolve(fake_entry *entries, size_t n, const char *origin, tdm_gpu **gpus,
                          size_t *n_gpus, tdm_error *err)
{
    size_t count = 0;
    for (size_t i = 0; i < n; i++)
        if (!entries[i].is_process) {
            for (size_t j = 0; j < i; j++)
                if (!entries[j].is_process && strcmp(entries[j].gpu.uuid, entries[i].gpu.uuid) == 0)
                    return entry_fail(err, &(where){origin, entries[i].line, entries[i].number},
                                      "duplicate uuid '%s' (also entry %d)", entries[i].gpu.uuid,
                                      entries[j].number);
            entries[i].gpu.index = (int)count++;
        }

    for (size_t i = 0; i < n; i++) {
        fake_entry *p = &entries[i];
        if (!p->is_process) continue;
        where w = {origin, p->line, p->number};
        fake_entry *g = NULL;
        for (size_t j = 0; j < n && !g; j++)
            if (!entries[j].is_process && strcmp(entries[j].gpu.uuid, p->gpu_uuid) == 0)
                g = &entries[j];
        if (!g) return entry_fail(err, &w, "process on unknown gpu '%s'", p->gpu_uuid);
        tdm_gpu_process *procs = g->gpu.processes;
        for (size_t k = 0; k < g->gpu.n_processes; k++)
            if (procs[k].pid == p->pid)
                return entry_fail(err, &w, "pid %u is listed twice on gpu '%s'", p->pid,
                                  p->gpu_uuid);
        procs = realloc(procs, (g->gpu.n_processes + 1) * sizeof *procs);
        if (!procs) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory parsing TANDEM_FAKE_GPUS");
        g->gpu.processes = procs;
        procs[g->gpu.n_processes++] = (tdm_gpu_process){.pid = p->pid, .used_mb = p->used_mb};
        if (!g->has_used && p->used_mb > 0) {
            g->gpu.used_mb += p->used_mb;
            if (g->gpu.used_mb > g->gpu.total_mb)
                return entry_fail(
                    err, &w, "processes on gpu '%s' use %lld MiB, more than its total_mb %lld",
                    p->gpu_uuid, (long long)g->gpu.used_mb, (long long)g->gpu.total_mb);
        }
    }

    /* An explicit used_mb covers at least what the GPU's own processes use, as NVML's does. */
    for (size_t i = 0; i < n; i++) {
        tdm_gpu *g = &entries[i].gpu;
        if (entries[i].is_process || !entries[i].has_used) continue;
        int64_t sum = 0;
        for (size_t k = 0; k < g->n_processes; k++)
            if (g->processes[k].used_mb > 0) sum += g->processes[k].used_mb;
        if (sum > g->used_mb)
            return entry_fail(err, &(where){origin, entries[i].line, entries[i].number},
                              "used_mb %lld is less than the %lld MiB its processes use",
                              (long long)g->used_mb, (long long)sum);
    }

    tdm_gpu *out = calloc(count ? count : 1, sizeof *out);
    if (!out) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory parsing TANDEM_FAKE_GPUS");
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!entries[i].is_process) {
            out[k] = entries[i].gpu;
            out[k].free_mb = out[k].total_mb - out[k].used_mb;
            entries[i].gpu.processes = NULL; /* ownership moved to out */
            entries[i].gpu.n_processes = 0;
            k++;
        }
    *gpus = out;
    *n_gpus = count;
    return TDM_OK;
}

tdm_status tdm_fake_gpus_parse(const char *spec, const char *origin, tdm_gpu **gpus, size_t *n_gpus,
                               tdm_error *err)
{
    *gpus = NULL;
    *n_gpus = 0;
    fake_entry *entries = NULL;
    size_t n = 0, cap = 0;
    tdm_status st = TDM_OK;
    int line = 1, number = 0;

    for (const char *p = spec; *p && st == TDM_OK;) {
        /* One entry runs up to ';' or '\n' (so never spans lines); a comment to the line's end. */
        size_t len = strcspn(p, ";\n");
        span s = trim((span){p, len});
        if (s.len && s.p[0] == '#') {
            len = strcspn(p, "\n");
        } else if (s.len) {
            number++;
            if (n == cap) {
                size_t ncap = cap ? cap * 2 : 8;
                fake_entry *ne = realloc(entries, ncap * sizeof *ne);
                if (!ne) {
                    st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory parsing TANDEM_FAKE_GPUS");
                    break;
                }
                entries = ne;
                cap = ncap;
            }
            fake_entry *e = &entries[n++];
            memset(e, 0, sizeof *e);
            e->number = number;
            e->line = line;
            st = parse_entry(s, &(where){origin, line, number}, e, err);
        }
        p += len;
        if (*p == '\n') line++;
        if (*p) p++;
    }

    if (st == TDM_OK) st = resolve(entries, n, origin, gpus, n_gpus, err);
    for (size_t i = 0; i < n; i++)
        free(entries[i].gpu.processes);
    free(entries);
    return st;
}

tdm_status tdm_fake_gpus_load(const char *value, tdm_gpu **gpus, size_t *n_gpus, tdm_error *err)
{
    *gpus = NULL;
    *n_gpus = 0;
    if (value[0] != '@') return tdm_fake_gpus_parse(value, NULL, gpus, n_gpus, err);
    const char *path = value + 1;
    char *text;
    tdm_status st = tdm_read_file(path, &text, NULL, err);
    if (st != TDM_OK) return tdm_error_prefix(err, "TANDEM_FAKE_GPUS=@%s", path);
    st = tdm_fake_gpus_parse(text, path, gpus, n_gpus, err);
    free(text);
    return st;
}
