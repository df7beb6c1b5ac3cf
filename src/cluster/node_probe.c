/* node_probe.c — one round trip per node for version, GPUs, cores and memory. */
#include "cluster/node_probe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char probe_script[] =
    "\"$@\" --version; echo \"@@version $?\"\n"
    "\"$@\" gpu status --json; echo \"@@gpu $?\"\n"
    "getconf _NPROCESSORS_ONLN; grep -E '^(MemTotal|MemAvailable):' /proc/meminfo; echo @@end\n";

static int64_t json_mb(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
}

tdm_status tdm_node_parse_gpu_status(const char *json_text, tdm_node_state *out, tdm_error *err)
{
    json_error_t je;
    json_t *root = json_loads(json_text, 0, &je);
    if (!root)
        return tdm_fail(err, TDM_ERR_PARSE, "gpu status --json: line %d: %s", je.line, je.text);
    json_t *gpus = json_object_get(root, "gpus");
    if (!json_is_array(gpus)) {
        json_decref(root);
        return tdm_fail(err, TDM_ERR_PARSE, "gpu status --json: no \"gpus\" list");
    }
    size_t n = json_array_size(gpus);
    out->gpus = calloc(n ? n : 1, sizeof *out->gpus);
    if (!out->gpus) {
        json_decref(root);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        json_t *g = json_array_get(gpus, i);
        tdm_node_gpu *d = &out->gpus[out->n_gpus];
        const char *uuid = json_string_value(json_object_get(g, "uuid"));
        if (!uuid)
            continue;
        snprintf(d->uuid, sizeof d->uuid, "%s", uuid);
        const char *name = json_string_value(json_object_get(g, "name"));
        snprintf(d->name, sizeof d->name, "%s", name ? name : "");
        const char *mt = json_string_value(json_object_get(g, "memory_type"));
        d->memory_type = mt && !strcmp(mt, "unified") ? TDM_MEMORY_UNIFIED : TDM_MEMORY_DISCRETE;
        d->total_mb = json_mb(g, "memory.total");
        d->memory_free_mb = json_mb(g, "memory.free");
        d->ledger_avail_mb = json_mb(json_object_get(g, "ledger"), "available_mb");
        d->free_mb = d->memory_free_mb;
        if (d->ledger_avail_mb >= 0 && (d->free_mb < 0 || d->ledger_avail_mb < d->free_mb))
            d->free_mb = d->ledger_avail_mb;
        if (d->free_mb < 0)
            d->free_mb = 0;
        d->n_reservations = (int)json_array_size(json_object_get(g, "reservations"));
        out->n_gpus++;
    }
    out->gpu_status = root;
    out->gpu_ok = true;
    return TDM_OK;
}

void tdm_node_parse_version(const char *text, tdm_node_state *out)
{
    out->version[0] = out->features[0] = '\0';
    out->cuda = -1;
    size_t n = strcspn(text, "\r\n");
    const char *v = strncmp(text, "tandem ", 7) == 0 ? text + 7 : text;
    if (v > text + n) v = text + n;
    snprintf(out->version, sizeof out->version, "%.*s", (int)(text + n - v), v);
    for (const char *line = text; *line;) {
        size_t len = strcspn(line, "\n");
        if (len >= 9 && !strncmp(line, "features:", 9)) {
            const char *f = line + 9;
            size_t flen = len - 9;
            while (flen && (*f == ' ' || *f == '\t'))
                f++, flen--;
            while (flen && (f[flen - 1] == '\r' || f[flen - 1] == ' '))
                flen--;
            snprintf(out->features, sizeof out->features, "%.*s", (int)flen, f);
            out->cuda = 0;
            /* Words separated by spaces or commas; one of them "cuda". */
            for (const char *w = f; w < f + flen;) {
                size_t wl = strcspn(w, " ,\t\r\n");
                if (w + wl > f + flen) wl = (size_t)(f + flen - w);
                if (wl == 4 && !strncmp(w, "cuda", 4)) out->cuda = 1;
                w += wl ? wl : 1;
            }
            break;
        }
        line += len + (line[len] == '\n');
    }
}

/* The text between the line after `after` (or the start) and the line starting with marker. */
static char *section(const char *text, const char *start, const char *marker, const char **next,
                     int *code)
{
    const char *m = strstr(start, marker);
    *code = -1;
    if (!m)
        return NULL;
    size_t len = (size_t)(m - start);
    char *s = strndup(start, len);
    const char *rest = m + strlen(marker);
    if (*rest == ' ')
        *code = atoi(rest + 1);
    const char *nl = strchr(rest, '\n');
    *next = nl ? nl + 1 : rest + strlen(rest);
    (void)text;
    return s;
}

tdm_status tdm_node_probe(tdm_transport *t, int64_t timeout_ms, tdm_node_state *out,
                          tdm_error *err)
{
    memset(out, 0, sizeof *out);
    out->ram_total_mb = out->ram_available_mb = -1;
    out->cuda = -1;
    const char *argv[] = {"sh", "-c", probe_script, "tandem-probe", t->node->tandem};
    tdm_spawn_result res;
    tdm_status st = tdm_transport_run(t, argv, 5, NULL, 0, timeout_ms, &res, err);
    if (st != TDM_OK)
        return st;
    if (tdm_transport_unreachable(t, &res, out->reason, sizeof out->reason)) {
        tdm_spawn_result_free(&res);
        return TDM_OK;
    }
    if (!strstr(res.out, "@@end")) {
        const char *tail = tdm_text_tail(res.err, res.err_len, 1);
        snprintf(out->reason, sizeof out->reason, "the probe did not finish (exit %d): %s",
                 res.exit_code, tail);
        out->reason[strcspn(out->reason, "\n")] = '\0';
        tdm_spawn_result_free(&res);
        return TDM_OK;
    }
    out->reachable = true;
    const char *p = res.out;
    int code;
    char *ver = section(res.out, p, "@@version", &p, &code);
    if (ver && code == 0) {
        tdm_node_parse_version(ver, out);
    } else {
        snprintf(out->reason, sizeof out->reason, "'%s --version' failed on the node (exit %d): %s",
                 t->node->tandem, code, tdm_text_tail(res.err, res.err_len, 1));
        out->reason[strcspn(out->reason, "\n")] = '\0';
    }
    free(ver);
    char *gpu = section(res.out, p, "@@gpu", &p, &code);
    if (gpu && code == 0) {
        tdm_error e = {0};
        if (tdm_node_parse_gpu_status(gpu, out, &e) != TDM_OK) {
            if (e.status == TDM_ERR_NOMEM) {
                free(gpu);
                tdm_spawn_result_free(&res);
                return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
            }
            snprintf(out->reason, sizeof out->reason, "%.500s", e.message);
        }
    } else if (!out->reason[0]) {
        snprintf(out->reason, sizeof out->reason, "'%s gpu status --json' failed (exit %d)",
                 t->node->tandem, code);
    }
    free(gpu);
    char *sys = section(res.out, p, "@@end", &p, &code);
    if (sys) {
        char *save = NULL;
        for (char *line = strtok_r(sys, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
            long long kb;
            if (sscanf(line, "MemTotal: %lld kB", &kb) == 1)
                out->ram_total_mb = kb / 1024;
            else if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1)
                out->ram_available_mb = kb / 1024;
            else if (line[0] >= '0' && line[0] <= '9')
                out->cpu_cores = atoi(line);
        }
    }
    free(sys);
    tdm_spawn_result_free(&res);
    return TDM_OK;
}

void tdm_node_state_free(tdm_node_state *s)
{
    free(s->gpus);
    if (s->gpu_status)
        json_decref(s->gpu_status);
    memset(s, 0, sizeof *s);
}
