/* tandem gpu status — GPUs, what NVML sees on them, the ledger's reservations and queue, and
 * the co-training hosts with their adapters; --watch repeats it. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cotrain/endpoint.h"
#include "cotrain/status.h"
#include "gpu/guard.h"
#include "gpu/inventory.h"
#include "gpu/ledger.h"
#include "gpu/proc_identity.h"
#include "gpu/wait_queue.h"
#include "util/build_features.h"
#include "util/timeutil.h"

static const char usage[] =
    "usage: tandem gpu status [--json] [--watch [--interval SEC]]\n"
    "\n"
    "Per GPU: UUID, name, memory type, reserve factor, total/used/free memory, the ledger's\n"
    "capacity/reserved/available, the processes NVML sees, each reservation and each queued job.\n"
    "Then each co-training host (a finetune others joined, or may join): its adapters, the\n"
    "joiner (pid, user) each belongs to, each one's step, epoch, loss and share.\n"
    "  --json           one JSON document in gpustat's shape, with `reservations` and `queue`\n"
    "                   per GPU and `cotrain_hosts`\n"
    "  --watch          repeat until Ctrl-C: a terminal is redrawn in place; otherwise one\n"
    "                   snapshot per interval (text: blank-line separated; --json: one line each)\n"
    "  --interval SEC   seconds between snapshots with --watch (default 2, at least 0.1)\n";

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

static void print_gpu(FILE *out, const tdm_gpu *g, const tdm_ledger_state *s)
{
    tdm_guard_view v;
    tdm_guard_view_of(g, s, &v);
    fprintf(out, "[%d] %s  %s  (%s, reserve factor %.2f%s%s)\n", g->index, g->uuid, g->name,
           tdm_memory_type_str(g->memory_type), v.reserve_factor,
           g->compute_mode >= 0 ? ", compute mode " : "",
           g->compute_mode >= 0 ? tdm_compute_mode_str(g->compute_mode) : "");
    fprintf(out, "    memory   total %lld MiB  used %lld MiB  free %lld MiB\n", (long long)g->total_mb,
           (long long)g->used_mb, (long long)g->free_mb);
    fprintf(out, "    ledger   capacity %lld MiB  reserved %lld MiB  available %lld MiB\n",
           (long long)v.capacity_mb, (long long)v.committed_mb, (long long)v.available_mb);
    if (g->n_processes) {
        fprintf(out, "    processes\n");
        for (size_t i = 0; i < g->n_processes; i++) {
            char cmd[64];
            process_command(g->processes[i].pid, cmd, sizeof cmd);
            if (g->processes[i].used_mb >= 0)
                fprintf(out, "      pid %-8u %-16s %lld MiB\n", g->processes[i].pid, cmd,
                       (long long)g->processes[i].used_mb);
            else
                fprintf(out, "      pid %-8u %-16s ? MiB\n", g->processes[i].pid, cmd);
        }
    }
    int shown = 0;
    for (size_t i = 0; i < s->n_reservations; i++) {
        const tdm_reservation *r = &s->reservations[i];
        if (strcmp(r->gpu_uuid, g->uuid) != 0)
            continue;
        if (!shown++)
            fprintf(out, "    reservations\n");
        char age[32], actual[32];
        format_age(r->started, age, sizeof age);
        if (r->actual_mb >= 0)
            snprintf(actual, sizeof actual, "%lld", (long long)r->actual_mb);
        else
            snprintf(actual, sizeof actual, "-");
        fprintf(out, "      pid %-8d budget %6lld MiB  actual %6s MiB  %-20s %-10s %s@%s\n",
               r->holders[r->n_holders - 1].pid, (long long)r->budget_mb, actual, r->task, age,
               r->user, r->host);
    }
    shown = 0;
    for (size_t i = 0; i < s->n_queue; i++) {
        const tdm_ticket *t = &s->queue[i];
        if (!tdm_queue_targets(t, g))
            continue;
        if (!shown++)
            fprintf(out, "    queue (arrival order)\n");
        char age[32];
        format_age(t->enqueued, age, sizeof age);
        fprintf(out, "      #%-4lld pid %-8d budget %6lld MiB  %-20s waiting %s%s\n",
               (long long)t->ticket, t->holders[0].pid, (long long)t->budget_mb, t->task, age,
               t->gpu_uuid[0] ? "" : "  (any GPU)");
    }
}

/* ------------------------------------------------------------ co-training hosts ---- */

static json_t *real_or_null(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

static json_t *cotrain_json(const tdm_cotrain_host_view *v, size_t n)
{
    json_t *hosts = json_array();
    int64_t now_ms = tdm_now_real_ns() / 1000000;
    for (size_t i = 0; i < n; i++) {
        const tdm_cotrain_advert *a = &v[i].advert;
        json_t *o = json_pack(
            "{s:i, s:s, s:I, s:I, s:s, s:s, s:{s:s, s:s, s:s, s:b, s:s}}", "pid", (int)a->pid,
            "user", a->user, "uid", (json_int_t)a->uid, "started_at", (json_int_t)a->started_at,
            "model_dir", a->model_dir, "device", a->base.device, "base", "id", a->base.id,
            "model", a->base.model, "method", a->base.method, "double_quant",
            a->base.double_quant, "compute_dtype", a->base.compute_dtype);
        if (!o) continue;
        json_object_set_new(o, "status", v[i].has_status ? tdm_cotrain_status_json(&v[i].status)
                                                         : json_null());
        json_object_set_new(o, "status_age_s",
                            v[i].has_status
                                ? real_or_null((double)(now_ms - v[i].status.updated_ms) / 1000)
                                : json_null());
        json_array_append_new(hosts, o);
    }
    return hosts;
}

/* v with the given decimals, or "-" when unknown (NaN). */
static void fmt_real(char *buf, size_t cap, int decimals, double v)
{
    if (isfinite(v))
        snprintf(buf, cap, "%.*f", decimals, v);
    else
        snprintf(buf, cap, "-");
}

static void print_cotrain(FILE *out, const tdm_cotrain_host_view *v, size_t n)
{
    if (!n) return;
    int64_t now_ms = tdm_now_real_ns() / 1000000;
    fprintf(out, "co-training hosts\n");
    for (size_t i = 0; i < n; i++) {
        const tdm_cotrain_advert *a = &v[i].advert;
        char age[32];
        format_age((time_t)a->started_at, age, sizeof age);
        fprintf(out, "  pid %-8d %-12s %s  %s %s  %s  up %s\n", (int)a->pid, a->user,
                a->base.device, a->base.method, a->base.compute_dtype, a->model_dir, age);
        if (!v[i].has_status) {
            fprintf(out, "    (no status published yet)\n");
            continue;
        }
        const tdm_cotrain_status *st = &v[i].status;
        char plan[96] = "";
        if (st->has_plan && st->grad_checkpoint)
            snprintf(plan, sizeof plan, "  plan checkpointing (recompute %s), split %d",
                     st->recompute, st->split);
        else if (st->has_plan)
            snprintf(plan, sizeof plan, "  plan no checkpointing, split %d", st->split);
        fprintf(out, "    global step %lld  schedule %s%s  updated %.1fs ago\n",
                (long long)st->global_step, st->schedule, plan,
                (double)(now_ms - st->updated_ms) / 1000);
        for (int k = 0; k < st->n_adapters; k++) {
            const tdm_cotrain_status_adapter *d = &st->adapters[k];
            char loss[32], share[32], who[128];
            fmt_real(loss, sizeof loss, 4, d->loss);
            fmt_real(share, sizeof share, 2, d->share);
            if (d->joiner_pid > 0)
                snprintf(who, sizeof who, "joiner pid %d (%s)", (int)d->joiner_pid,
                         d->joiner_user);
            else
                snprintf(who, sizeof who, "own");
            fprintf(out,
                    "    [%d] %-16.40s %-8s step %lld/%lld  epoch %.2f/%d  loss %s  share %s  "
                    "weight %g  %s\n",
                    d->index, d->label, tdm_cotrain_adapter_state_name(d->state),
                    (long long)d->step, (long long)d->total_steps, d->epoch, d->epochs, loss,
                    share, d->weight, who);
        }
    }
}

/* ------------------------------------------------------------------ one snapshot ---- */

/* Writes one status document to out: JSON with json_flags, or text. */
static tdm_status snapshot(FILE *out, bool json, size_t json_flags, tdm_error *err)
{
    tdm_inventory inv;
    if (tdm_inventory_query(&inv, err) != TDM_OK) return err->status;
    tdm_ledger ledger;
    tdm_ledger_state state;
    tdm_ledger_state_init(&state);
    if (inv.n_gpus > 0) {
        if (tdm_ledger_open(&ledger, NULL, err) != TDM_OK ||
            tdm_ledger_snapshot(&ledger, &state, err) != TDM_OK) {
            tdm_inventory_free(&inv);
            return err->status;
        }
    }
    /* co-training hosts advertise beside the ledger (docs/co-training.md) */
    tdm_cotrain_host_view *hosts = NULL;
    size_t n_hosts = 0;
    char dir[4096], cotrain_note[1100] = "";
    tdm_error cerr = {0};
    if (tdm_cotrain_dir(NULL, dir, sizeof dir, &cerr) != TDM_OK ||
        tdm_cotrain_status_list(dir, &hosts, &n_hosts, &cerr) != TDM_OK)
        snprintf(cotrain_note, sizeof cotrain_note, "co-training hosts not listed: %s",
                 cerr.message);
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
        json_object_set_new(root, "cotrain_hosts", cotrain_json(hosts, n_hosts));
        if (cotrain_note[0]) json_object_set_new(root, "cotrain_note", json_string(cotrain_note));
        char *text = json_dumps(root, json_flags | JSON_PRESERVE_ORDER);
        if (text) fprintf(out, "%s\n", text);
        free(text);
        json_decref(root);
    } else {
        if (inv.n_gpus == 0) {
            fprintf(out, "No GPU found%s%s.\n", inv.note[0] ? ": " : "", inv.note);
        } else {
            fprintf(out, "%s  %s  (%s)\n", tdm_host_name(), now, inv.source);
            for (size_t i = 0; i < inv.n_gpus; i++)
                print_gpu(out, &inv.gpus[i], &state);
        }
        print_cotrain(out, hosts, n_hosts);
        if (cotrain_note[0]) fprintf(out, "%s\n", cotrain_note);
    }
    tdm_cotrain_host_views_free(hosts, n_hosts);
    tdm_ledger_state_free(&state);
    tdm_inventory_free(&inv);
    return TDM_OK;
}

/* ----------------------------------------------------------------------- --watch ---- */

static volatile sig_atomic_t watch_stop;

static void on_watch_signal(int sig)
{
    (void)sig;
    watch_stop = 1;
}

/* Snapshots every interval_s until SIGINT/SIGTERM (exit 0). A terminal is redrawn in place
 * (cursor home, clear to the end); otherwise each snapshot is appended: text snapshots
 * separated by a blank line, JSON one compact document per line (JSON Lines). A failed
 * snapshot (the ledger locked for too long) is reported on stderr and the watch goes on. */
static int watch(bool json, double interval_s)
{
    struct sigaction sa = {0};
    sa.sa_handler = on_watch_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART: the sleep ends at once */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    bool tty = isatty(STDOUT_FILENO);
    watch_stop = 0;
    while (!watch_stop) {
        char *buf = NULL;
        size_t len = 0;
        FILE *m = open_memstream(&buf, &len);
        if (!m) return tdm_cli_fail(TDM_EXIT_FAILURE, "gpu status: out of memory");
        tdm_error err = {0};
        tdm_status st = snapshot(m, json, tty ? JSON_INDENT(2) : JSON_COMPACT, &err);
        fclose(m);
        if (st != TDM_OK) {
            fprintf(stderr, "tandem: gpu status: %s\n", err.message);
        } else if (!watch_stop) {
            if (tty) fputs("\033[H\033[J", stdout);
            fwrite(buf, 1, len, stdout);
            if (tty)
                printf("(every %gs; Ctrl-C to stop)\n", interval_s);
            else if (!json)
                putchar('\n');
            fflush(stdout);
        }
        free(buf);
        struct timespec ts = {.tv_sec = (time_t)interval_s,
                              .tv_nsec = (long)((interval_s - floor(interval_s)) * 1e9)};
        while (!watch_stop && nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
    return TDM_EXIT_OK;
}

int tdm_cmd_gpu_status(int argc, char **argv)
{
    static const struct option opts[] = {
        {"json", no_argument, NULL, 'j'},
        {"watch", no_argument, NULL, 'w'},
        {"interval", required_argument, NULL, 'i'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    bool json = false, watching = false, interval_given = false;
    double interval_s = 2.0;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'j': json = true; break;
        case 'w': watching = true; break;
        case 'i': {
            char *end;
            errno = 0;
            interval_s = strtod(optarg, &end);
            if (errno || end == optarg || *end || !(interval_s >= 0.1 && interval_s <= 86400))
                return tdm_cli_fail(TDM_EXIT_USAGE,
                                    "gpu status: --interval '%s': give seconds between 0.1 and "
                                    "86400 (e.g. 2 or 0.5)",
                                    optarg);
            interval_given = true;
            break;
        }
        case 'h': fputs(usage, stdout); return TDM_EXIT_OK;
        default:
            fputs(usage, stderr);
            return tdm_cli_fail(TDM_EXIT_USAGE, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return tdm_cli_fail(TDM_EXIT_USAGE, "unexpected argument '%s'", argv[optind]);
    if (interval_given && !watching)
        return tdm_cli_fail(TDM_EXIT_USAGE, "gpu status: --interval only applies with --watch");
    if (watching) return watch(json, interval_s);
    tdm_error err = {0};
    if (snapshot(stdout, json, JSON_INDENT(2), &err) != TDM_OK) return tdm_cli_fail_err(&err);
    return TDM_EXIT_OK;
}
