/* tandem gpu status — GPUs, what NVML sees on them, and the ledger's reservations and queue. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "gpu/guard.h"
#include "gpu/inventory.h"
#include "gpu/ledger.h"
#include "gpu/proc_identity.h"
#include "gpu/wait_queue.h"
#include "util/build_features.h"
#include "util/timeutil.h"

static const char usage[] =
    "usage: tandem gpu status [--json]\n"
    "\n"
    "Per GPU: UUID, name, memory type, reserve factor, total/used/free memory, the ledger's\n"
    "capacity/reserved/available, the processes NVML sees, each reservation and each queued job.\n"
    "  --json   one JSON document in gpustat's shape, with `reservations` and `queue` per GPU\n";

static void format_age(time_t since, char *buf, size_t size)
{
    long s = (long)(time(NULL) - since);
    if (s < 0)
        s = 0;
    if (s < 120)
        snprintf(buf, size, "%lds", s);
    else if (s < 7200)
        snprintf(buf, size, "%ldm", s / 60);
    else
        snprintf(buf, size, "%ldh%02ldm", s / 3600, (s % 3600) / 60);
}

static void process_command(uint32_t pid, char *buf, size_t size)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%u/comm", pid);
    FILE *f = fopen(path, "r");
    buf[0] = '\0';
    if (f) {
        if (fgets(buf, (int)size, f))
            buf[strcspn(buf, "\n")] = '\0';
        fclose(f);
    }
    if (!buf[0])
        snprintf(buf, size, "?");
}

static json_t *int_or_null(int64_t v)
{
    return v >= 0 ? json_integer(v) : json_null();
}

static json_t *gpu_json(const tdm_gpu *g, const tdm_ledger_state *s)
{
    tdm_guard_view v;
    tdm_guard_view_of(g, s, &v);
    json_t *o = json_object();
    json_object_set_new(o, "index", json_integer(g->index));
    json_object_set_new(o, "uuid", json_string(g->uuid));
    json_object_set_new(o, "name", json_string(g->name));
    json_object_set_new(o, "memory.total", int_or_null(g->total_mb));
    json_object_set_new(o, "memory.used", int_or_null(g->used_mb));
    json_object_set_new(o, "memory.free", int_or_null(g->free_mb));
    json_object_set_new(o, "memory_type", json_string(tdm_memory_type_str(g->memory_type)));
    json_object_set_new(o, "compute_mode", g->compute_mode >= 0
                                               ? json_string(tdm_compute_mode_str(g->compute_mode))
                                               : json_null());
    json_object_set_new(o, "reserve_factor", json_real(v.reserve_factor));
    json_object_set_new(o, "ledger", json_pack("{s:I,s:I,s:I}", "capacity_mb",
                                               (json_int_t)v.capacity_mb, "reserved_mb",
                                               (json_int_t)v.committed_mb, "available_mb",
                                               (json_int_t)v.available_mb));
    json_t *procs = json_array();
    for (size_t i = 0; i < g->n_processes; i++) {
        char cmd[64];
        process_command(g->processes[i].pid, cmd, sizeof cmd);
        json_array_append_new(procs, json_pack("{s:i,s:s,s:o}", "pid", (int)g->processes[i].pid,
                                               "command", cmd, "gpu_memory_usage",
                                               int_or_null(g->processes[i].used_mb)));
    }
    json_object_set_new(o, "processes", procs);
    json_t *res = json_array();
    for (size_t i = 0; i < s->n_reservations; i++) {
        const tdm_reservation *r = &s->reservations[i];
        if (strcmp(r->gpu_uuid, g->uuid) != 0)
            continue;
        json_t *pids = json_array();
        for (int h = 0; h < r->n_holders; h++)
            json_array_append_new(pids, json_integer(r->holders[h].pid));
        char started[32];
        tdm_format_rfc3339(r->started, started, sizeof started);
        json_array_append_new(
            res, json_pack("{s:s,s:o,s:s,s:s,s:I,s:o,s:s,s:s,s:I}", "id", r->id, "pids", pids,
                           "user", r->user, "host", r->host, "budget_mb", (json_int_t)r->budget_mb,
                           "actual_mb", int_or_null(r->actual_mb), "task", r->task, "started",
                           started, "age_s", (json_int_t)(time(NULL) - r->started)));
    }
    json_object_set_new(o, "reservations", res);
    json_t *queue = json_array();
    for (size_t i = 0; i < s->n_queue; i++) {
        const tdm_ticket *t = &s->queue[i];
        if (!tdm_queue_targets(t, g))
            continue;
        char enq[32];
        tdm_format_rfc3339(t->enqueued, enq, sizeof enq);
        json_array_append_new(
            queue, json_pack("{s:I,s:i,s:s,s:I,s:s,s:b,s:s,s:I}", "ticket", (json_int_t)t->ticket,
                             "pid", (int)t->holders[0].pid, "user", t->user, "budget_mb",
                             (json_int_t)t->budget_mb, "task", t->task, "any_gpu",
                             t->gpu_uuid[0] == '\0', "enqueued", enq, "waiting_s",
                             (json_int_t)(time(NULL) - t->enqueued)));
    }
    json_object_set_new(o, "queue", queue);
    return o;
}

static void print_gpu(const tdm_gpu *g, const tdm_ledger_state *s)
{
    tdm_guard_view v;
    tdm_guard_view_of(g, s, &v);
    printf("[%d] %s  %s  (%s, reserve factor %.2f%s%s)\n", g->index, g->uuid, g->name,
           tdm_memory_type_str(g->memory_type), v.reserve_factor,
           g->compute_mode >= 0 ? ", compute mode " : "",
           g->compute_mode >= 0 ? tdm_compute_mode_str(g->compute_mode) : "");
    printf("    memory   total %lld MiB  used %lld MiB  free %lld MiB\n", (long long)g->total_mb,
           (long long)g->used_mb, (long long)g->free_mb);
    printf("    ledger   capacity %lld MiB  reserved %lld MiB  available %lld MiB\n",
           (long long)v.capacity_mb, (long long)v.committed_mb, (long long)v.available_mb);
    if (g->n_processes) {
        printf("    processes\n");
        for (size_t i = 0; i < g->n_processes; i++) {
            char cmd[64];
            process_command(g->processes[i].pid, cmd, sizeof cmd);
            if (g->processes[i].used_mb >= 0)
                printf("      pid %-8u %-16s %lld MiB\n", g->processes[i].pid, cmd,
                       (long long)g->processes[i].used_mb);
            else
                printf("      pid %-8u %-16s ? MiB\n", g->processes[i].pid, cmd);
        }
    }
    int shown = 0;
    for (size_t i = 0; i < s->n_reservations; i++) {
        const tdm_reservation *r = &s->reservations[i];
        if (strcmp(r->gpu_uuid, g->uuid) != 0)
            continue;
        if (!shown++)
            printf("    reservations\n");
        char age[32], actual[32];
        format_age(r->started, age, sizeof age);
        if (r->actual_mb >= 0)
            snprintf(actual, sizeof actual, "%lld", (long long)r->actual_mb);
        else
            snprintf(actual, sizeof actual, "-");
        printf("      pid %-8d budget %6lld MiB  actual %6s MiB  %-20s %-10s %s@%s\n",
               r->holders[r->n_holders - 1].pid, (long long)r->budget_mb, actual, r->task, age,
               r->user, r->host);
    }
    shown = 0;
    for (size_t i = 0; i < s->n_queue; i++) {
        const tdm_ticket *t = &s->queue[i];
        if (!tdm_queue_targets(t, g))
            continue;
        if (!shown++)
            printf("    queue (arrival order)\n");
        char age[32];
        format_age(t->enqueued, age, sizeof age);
        printf("      #%-4lld pid %-8d budget %6lld MiB  %-20s waiting %s%s\n",
               (long long)t->ticket, t->holders[0].pid, (long long)t->budget_mb, t->task, age,
               t->gpu_uuid[0] ? "" : "  (any GPU)");
    }
}

int tdm_cmd_gpu_status(int argc, char **argv)
{
    static const struct option opts[] = {
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    bool json = false;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'j': json = true; break;
        case 'h': fputs(usage, stdout); return TDM_EXIT_OK;
        default:
            fputs(usage, stderr);
            return tdm_cli_fail(TDM_EXIT_USAGE, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return tdm_cli_fail(TDM_EXIT_USAGE, "unexpected argument '%s'", argv[optind]);

    tdm_error err = {0};
    tdm_inventory inv;
    if (tdm_inventory_query(&inv, &err) != TDM_OK)
        return tdm_cli_fail_err(&err);
    tdm_ledger ledger;
    tdm_ledger_state state;
    tdm_ledger_state_init(&state);
    if (inv.n_gpus > 0) {
        if (tdm_ledger_open(&ledger, NULL, &err) != TDM_OK ||
            tdm_ledger_snapshot(&ledger, &state, &err) != TDM_OK) {
            tdm_inventory_free(&inv);
            return tdm_cli_fail_err(&err);
        }
    }
    char now[32];
    tdm_format_rfc3339(time(NULL), now, sizeof now);
    if (json) {
        json_t *root = json_object();
        json_object_set_new(root, "hostname", json_string(tdm_host_name()));
        json_object_set_new(root, "query_time", json_string(now));
        json_object_set_new(root, "driver_version", inv.driver_version[0]
                                                        ? json_string(inv.driver_version)
                                                        : json_null());
        json_object_set_new(root, "source", json_string(inv.source));
        json_object_set_new(root, "features", json_string(tdm_build_features()));
        json_t *gpus = json_array();
        for (size_t i = 0; i < inv.n_gpus; i++)
            json_array_append_new(gpus, gpu_json(&inv.gpus[i], &state));
        json_object_set_new(root, "gpus", gpus);
        if (inv.n_gpus == 0)
            json_object_set_new(root, "note", json_string(inv.note[0] ? inv.note : "no GPU"));
        char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        puts(text);
        free(text);
        json_decref(root);
    } else if (inv.n_gpus == 0) {
        printf("No GPU found%s%s.\n", inv.note[0] ? ": " : "", inv.note);
    } else {
        printf("%s  %s  (%s)\n", tdm_host_name(), now, inv.source);
        for (size_t i = 0; i < inv.n_gpus; i++)
            print_gpu(&inv.gpus[i], &state);
    }
    tdm_ledger_state_free(&state);
    tdm_inventory_free(&inv);
    return TDM_EXIT_OK;
}
