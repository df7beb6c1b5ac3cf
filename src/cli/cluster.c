/* tandem cluster status|run|watch|pull (logs|cancel: cluster_jobs.c) — the nodes of cluster.yaml and the jobs on them. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli/cli.h"
#include "cli/cluster_common.h"
#include "cluster/cluster_config.h"
#include "cluster/coordinator.h"
#include "cluster/job.h"
#include "cluster/node_probe.h"
#include "cluster/registry.h"
#include "cluster/transport.h"
#include "util/timeutil.h"

int tdm_cli_load_cluster(const char *path, tdm_cluster_config *cfg)
{
    char def[4096];
    if (!path) {
        if (!tdm_cluster_config_default_path(def, sizeof def))
            return tdm_cli_fail(TDM_EXIT_USAGE, "no --cluster FILE and no HOME to find one");
        path = def;
    }
    tdm_error err = {0};
    if (tdm_cluster_config_load(path, cfg, &err) != TDM_OK)
        return tdm_cli_fail(err.status == TDM_ERR_NOMEM || err.status == TDM_ERR_IO
                                ? TDM_EXIT_FAILURE
                                : TDM_EXIT_USAGE,
                            "%s", err.message);
    return TDM_EXIT_OK;
}

int tdm_cli_check_cluster(const char *path)
{
    if (!path) return TDM_EXIT_OK;
    tdm_cluster_config cfg;
    int rc = tdm_cli_load_cluster(path, &cfg);
    if (rc == TDM_EXIT_OK) tdm_cluster_config_free(&cfg);
    return rc;
}

json_t *tdm_cli_filter_jobs(json_t *jobs, const char *submission)
{
    json_t *out = json_array();
    size_t i;
    json_t *j;
    json_array_foreach(jobs, i, j)
    {
        const char *s = json_string_value(json_object_get(j, "submission"));
        if (!submission || (s && !strcmp(s, submission)))
            json_array_append(out, j);
    }
    return out;
}

static const char *str(json_t *o, const char *key, const char *dflt)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : dflt;
}

void tdm_cli_print_jobs(FILE *out, json_t *jobs, const char *submission)
{
    size_t i;
    json_t *j;
    int shown = 0;
    json_array_foreach(jobs, i, j)
    {
        const char *s = str(j, "submission", "");
        if (submission && strcmp(s, submission))
            continue;
        if (!shown++)
            fprintf(out, "%-40s %-12s %-9s %-8s %s\n", "JOB", "NODE", "STATE", "ADAPTERS",
                    "NOTE");
        json_t *ec = json_object_get(j, "exit_code");
        char note[700] = "";
        if (json_is_string(json_object_get(j, "unreachable")))
            snprintf(note, sizeof note, "node unreachable: %.600s", str(j, "unreachable", ""));
        else if (json_is_string(json_object_get(j, "why")))
            snprintf(note, sizeof note, "%.600s", str(j, "why", ""));
        else if (json_is_integer(ec))
            snprintf(note, sizeof note, "exit code %lld", (long long)json_integer_value(ec));
        fprintf(out, "%-40s %-12s %-9s %-8zu %s\n", str(j, "id", "?"),
                str(json_object_get(j, "node"), "name", "?"), str(j, "state", "?"),
                json_array_size(json_object_get(j, "adapters")), note);
        if (!strcmp(str(j, "state", ""), "failed") && json_is_string(json_object_get(j, "log_tail"))) {
            fprintf(out, "    log (last lines of %s/log on the node):\n", str(j, "job_dir", "?"));
            const char *t = str(j, "log_tail", "");
            while (*t) {
                size_t n = strcspn(t, "\n");
                fprintf(out, "      | %.*s\n", (int)n, t);
                t += n + (t[n] == '\n');
            }
        }
    }
    if (!shown)
        fprintf(out, "No jobs.\n");
}

/* prec < 0: %g */
static void print_num(FILE *out, json_t *v, int prec, int width)
{
    if (json_is_number(v)) {
        char buf[64];
        if (prec < 0)
            snprintf(buf, sizeof buf, "%g", json_number_value(v));
        else
            snprintf(buf, sizeof buf, "%.*f", prec, json_number_value(v));
        fprintf(out, " %*s", width, buf);
    } else {
        fprintf(out, " %*s", width, "-");
    }
}

void tdm_cli_print_leaderboard(FILE *out, json_t *board)
{
    if (!json_array_size(board))
        return;
    fprintf(out, "\nLeaderboard (validation loss, lower is better)\n");
    fprintf(out, "%3s %-20s %-12s %-9s %6s %9s %10s %8s  %s\n", "#", "LABEL", "NODE", "STATE",
            "EPOCH", "VAL_LOSS", "TRAIN_LOSS", "VAL_PPL", "OUTPUT");
    size_t i;
    json_t *r;
    json_array_foreach(board, i, r)
    {
        char label[32];
        if (json_is_string(json_object_get(r, "label")))
            snprintf(label, sizeof label, "%.20s", str(r, "label", ""));
        else
            snprintf(label, sizeof label, "#%lld",
                     (long long)json_integer_value(json_object_get(r, "index")) + 1);
        fprintf(out, "%3lld %-20s %-12s %-9s", (long long)json_integer_value(json_object_get(r, "rank")),
                label, str(r, "node", "?"), str(r, "state", "?"));
        print_num(out, json_object_get(r, "epoch"), -1, 6);
        print_num(out, json_object_get(r, "val_loss"), 4, 9);
        print_num(out, json_object_get(r, "train_loss"), 4, 10);
        print_num(out, json_object_get(r, "val_perplexity"), 3, 8);
        fprintf(out, "  %s\n", str(r, "output", ""));
    }
}

/* ---------------------------------------------------------------- status */

static const char status_usage[] =
    "usage: tandem cluster status [--cluster FILE] [--json]\n"
    "\n"
    "Per node of cluster.yaml: reachable or not (and why), tandem version, live GPU state (the\n"
    "node's `tandem gpu status --json`), CPU cores, RAM, jobs; then the leaderboard of the latest\n"
    "submission. An unreachable node is reported, never fatal.\n"
    "  --cluster FILE  default ${XDG_CONFIG_HOME:-~/.config}/tandem/cluster.yaml\n"
    "  --json          {\"nodes\": [...], \"jobs\": [...], \"leaderboard\": [...]}\n";

static json_t *node_json(const tdm_cluster_node *n, const tdm_node_state *s, json_t *jobs)
{
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(n->name));
    json_object_set_new(o, "transport", json_string(tdm_transport_kind_str(n->transport)));
    json_object_set_new(o, "host", n->host ? json_string(n->host) : json_null());
    json_object_set_new(o, "reachable", json_boolean(s->reachable));
    json_object_set_new(o, "reason", s->reason[0] ? json_string(s->reason) : json_null());
    json_object_set_new(o, "tandem_version", s->version[0] ? json_string(s->version) : json_null());
    json_object_set_new(o, "tandem_features",
                        s->features[0] ? json_string(s->features) : json_null());
    json_object_set_new(o, "cpu_cores", s->cpu_cores ? json_integer(s->cpu_cores)
                                        : n->cpu_cores ? json_integer(n->cpu_cores)
                                                       : json_null());
    json_object_set_new(o, "ram_total_mb",
                        s->ram_total_mb >= 0 ? json_integer(s->ram_total_mb)
                        : n->ram_mb          ? json_integer(n->ram_mb)
                                             : json_null());
    json_object_set_new(o, "ram_available_mb",
                        s->ram_available_mb >= 0 ? json_integer(s->ram_available_mb) : json_null());
    json_object_set_new(o, "max_adapters", json_integer(n->max_adapters));
    json_object_set_new(o, "gpu_status", s->gpu_status ? json_incref(s->gpu_status) : json_null());
    json_t *ids = json_array();
    size_t i;
    json_t *j;
    json_array_foreach(jobs, i, j)
    {
        if (!strcmp(str(json_object_get(j, "node"), "name", ""), n->name) &&
            !strcmp(str(j, "state", ""), "running"))
            json_array_append(ids, json_object_get(j, "id"));
    }
    json_object_set_new(o, "running_jobs", ids);
    return o;
}

static void print_node(const tdm_cluster_node *n, const tdm_node_state *s, json_t *nj)
{
    tdm_transport t = {.node = n};
    char where[300];
    tdm_transport_describe(&t, where, sizeof where);
    if (!s->reachable) {
        printf("%s  (%s)  UNREACHABLE: %s\n", n->name, where, s->reason);
        return;
    }
    printf("%s  (%s)  reachable  tandem %s", n->name, where, s->version[0] ? s->version : "?");
    if (s->features[0])
        printf(" (%s)", s->features);
    json_t *cores = json_object_get(nj, "cpu_cores");
    if (json_is_integer(cores))
        printf("  %lld cores", (long long)json_integer_value(cores));
    if (s->ram_available_mb >= 0)
        printf("  RAM %lld of %lld MiB available", (long long)s->ram_available_mb,
               (long long)s->ram_total_mb);
    printf("\n");
    if (!s->gpu_ok)
        printf("    GPU state unknown: %s\n", s->reason);
    else if (s->n_gpus == 0)
        printf("    no GPU (CPU-only node)\n");
    for (size_t g = 0; g < s->n_gpus; g++) {
        const tdm_node_gpu *d = &s->gpus[g];
        printf("    %s  %s  (%s)  free %lld of %lld MiB", d->uuid, d->name,
               tdm_memory_type_str(d->memory_type), (long long)d->memory_free_mb,
               (long long)d->total_mb);
        if (d->ledger_avail_mb >= 0)
            printf(", ledger available %lld MiB, %d reservation%s", (long long)d->ledger_avail_mb,
                   d->n_reservations, d->n_reservations == 1 ? "" : "s");
        printf("\n");
    }
    json_t *ids = json_object_get(nj, "running_jobs");
    size_t i;
    json_t *id;
    json_array_foreach(ids, i, id) printf("    running job %s\n", json_string_value(id));
}

/* Loads the registry and refreshes jobs that are not finished (saving what changed). */
static int load_jobs(json_t **jobs, char *dir, size_t dir_size, bool refresh)
{
    tdm_error err = {0};
    if (tdm_registry_dir(dir, dir_size, &err) != TDM_OK ||
        tdm_registry_load(dir, jobs, &err) != TDM_OK)
        return tdm_cli_fail_err(&err);
    if (!refresh)
        return TDM_EXIT_OK;
    size_t i;
    json_t *j;
    json_array_foreach(*jobs, i, j)
    {
        bool changed = false;
        tdm_error e = {0};
        if (tdm_coord_refresh(j, &changed, &e) != TDM_OK)
            fprintf(stderr, "tandem: job %s: %s\n", str(j, "id", "?"), e.message);
        else if (changed && tdm_registry_save(dir, j, &e) != TDM_OK)
            fprintf(stderr, "tandem: job %s: %s\n", str(j, "id", "?"), e.message);
    }
    return TDM_EXIT_OK;
}

static int cmd_status(int argc, char **argv)
{
    static const struct option opts[] = {
        TDM_CLI_CLUSTER_OPTION,
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *cluster = NULL;
    bool json = false;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'c': cluster = optarg; break;
        case 'j': json = true; break;
        case 'h': fputs(status_usage, stdout); return TDM_EXIT_OK;
        default:
            fputs(status_usage, stderr);
            return tdm_cli_fail(TDM_EXIT_USAGE, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return tdm_cli_fail(TDM_EXIT_USAGE, "unexpected argument '%s'", argv[optind]);
    tdm_cluster_config cfg;
    int rc = tdm_cli_load_cluster(cluster, &cfg);
    if (rc)
        return rc;
    json_t *jobs = NULL;
    char dir[4096];
    rc = load_jobs(&jobs, dir, sizeof dir, true);
    if (rc) {
        tdm_cluster_config_free(&cfg);
        return rc;
    }
    json_t *nodes = json_array();
    for (size_t i = 0; i < cfg.n_nodes && !rc; i++) {
        tdm_transport t;
        tdm_node_state s;
        tdm_error err = {0};
        if (tdm_transport_init(&t, &cfg.nodes[i], cfg.ssh_config, &err) != TDM_OK ||
            tdm_node_probe(&t, 30000, &s, &err) != TDM_OK) {
            if (err.status == TDM_ERR_NOMEM) {
                rc = tdm_cli_fail_err(&err);
                break;
            }
            memset(&s, 0, sizeof s);
            s.cuda = -1;
            snprintf(s.reason, sizeof s.reason, "%.500s", err.message);
            s.ram_total_mb = s.ram_available_mb = -1;
        }
        json_t *nj = node_json(&cfg.nodes[i], &s, jobs);
        if (!json)
            print_node(&cfg.nodes[i], &s, nj);
        json_array_append_new(nodes, nj);
        tdm_node_state_free(&s);
    }
    const char *latest = tdm_coord_latest_submission(jobs);
    json_t *board = tdm_coord_leaderboard(jobs, latest);
    if (!rc && json) {
        json_t *root = json_pack("{s:o,s:O,s:o}", "nodes", nodes, "jobs", jobs, "leaderboard",
                                 board);
        char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        puts(text);
        free(text);
        json_decref(root);
    } else {
        if (!rc) {
            printf("\n");
            tdm_cli_print_jobs(stdout, jobs, NULL);
            tdm_cli_print_leaderboard(stdout, board);
        }
        json_decref(nodes);
        json_decref(board);
    }
    json_decref(jobs);
    tdm_cluster_config_free(&cfg);
    return rc;
}

/* ---------------------------------------------------------------- run */

static const char run_usage[] =
    "usage: tandem cluster run [--cluster FILE] --node NAME [--json] -- CMD [ARGS...]\n"
    "\n"
    "Starts CMD detached on the node (in its workdir; log and pid kept in WORKDIR/jobs/ID) and\n"
    "records it in the job registry, where `cluster watch` follows it like a training job.\n";

static int cmd_run(int argc, char **argv)
{
    static const struct option opts[] = {
        TDM_CLI_CLUSTER_OPTION,
        {"node", required_argument, NULL, 'n'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *cluster = NULL, *node_name = NULL;
    bool json = false;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
        switch (c) {
        case 'c': cluster = optarg; break;
        case 'n': node_name = optarg; break;
        case 'j': json = true; break;
        case 'h': fputs(run_usage, stdout); return TDM_EXIT_OK;
        default:
            fputs(run_usage, stderr);
            return tdm_cli_fail(TDM_EXIT_USAGE, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (!node_name || optind >= argc)
        return fputs(run_usage, stderr), TDM_EXIT_USAGE;
    tdm_cluster_config cfg;
    int rc = tdm_cli_load_cluster(cluster, &cfg);
    if (rc)
        return rc;
    const tdm_cluster_node *node = tdm_cluster_config_find(&cfg, node_name);
    if (!node) {
        char names[1024] = "";
        size_t len = 0;
        for (size_t i = 0; i < cfg.n_nodes && len < sizeof names; i++)
            len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", i ? ", " : "",
                                    cfg.nodes[i].name);
        rc = cfg.n_nodes ? tdm_cli_fail(TDM_EXIT_USAGE, "no node '%s' in %s; its nodes: %s",
                                        node_name, cfg.file, names)
                         : tdm_cli_fail(TDM_EXIT_USAGE, "no node '%s' in %s: it defines no nodes",
                                        node_name, cfg.file);
        tdm_cluster_config_free(&cfg);
        return rc;
    }
    tdm_error err = {0};
    char dir[4096], id[128], sub[128], job_dir[4096], now[32];
    tdm_registry_new_id(node->name, id, sizeof id);
    tdm_registry_new_id(NULL, sub, sizeof sub);
    snprintf(job_dir, sizeof job_dir, "%s/jobs/%s", node->workdir, id);
    tdm_format_rfc3339(time(NULL), now, sizeof now);
    tdm_transport t;
    long pid = 0;
    if (tdm_registry_dir(dir, sizeof dir, &err) != TDM_OK ||
        tdm_transport_init(&t, node, cfg.ssh_config, &err) != TDM_OK ||
        tdm_job_launch(&t, job_dir, (const char *const *)argv + optind, (size_t)(argc - optind),
                       &pid, &err) != TDM_OK) {
        tdm_cluster_config_free(&cfg);
        return tdm_cli_fail(TDM_EXIT_FAILURE, "%s", err.message);
    }
    json_t *av = json_array();
    for (int i = optind; i < argc; i++)
        json_array_append_new(av, json_string(argv[i]));
    json_t *job = json_pack("{s:i,s:s,s:s,s:s,s:s,s:s,s:o,s:s,s:I,s:o,s:s,s:n,s:[]}", "version", 1,
                            "id", id, "submission", sub, "kind", "command", "submitted", now,
                            "cluster_file", cfg.file, "node",
                            tdm_node_to_json(node, cfg.ssh_config), "job_dir", job_dir, "pid",
                            (json_int_t)pid, "argv", av, "state", "running", "exit_code",
                            "adapters");
    rc = TDM_EXIT_OK;
    if (!job || tdm_registry_save(dir, job, &err) != TDM_OK)
        rc = tdm_cli_fail(TDM_EXIT_FAILURE, "%s", job ? err.message : "out of memory");
    else if (json)
        printf("{\"id\": \"%s\", \"node\": \"%s\", \"pid\": %ld}\n", id, node->name, pid);
    else
        printf("%s\n", id);
    json_decref(job);
    tdm_cluster_config_free(&cfg);
    return rc;
}

/* ---------------------------------------------------------------- watch */

static const char watch_usage[] =
    "usage: tandem cluster watch [--interval SEC] [--until-done] [--once]\n"
    "                            [--submission ID|all] [--json]\n"
    "\n"
    "Polls every job (its pid, exit code, log, and each adapter's metadata.json and\n"
    "trainer_state.json) every SEC seconds (default 300) and prints the jobs and the leaderboard\n"
    "by validation loss. A job whose process is gone without an exit code, or that exits non-zero,\n"
    "is marked failed with the tail of its log.\n"
    "  --until-done      return when every job has finished: exit 0, or 1 if any failed\n"
    "  --once            poll once and return (exit 1 if any job failed)\n"
    "  --submission ID   only that submission's jobs (default: the latest submission; 'all')\n"
    "  --json            each round as one JSON document {\"jobs\": [...], \"leaderboard\": [...]}\n";

static volatile sig_atomic_t stop_watch = 0;
static void on_stop(int sig)
{
    (void)sig;
    stop_watch = 1;
}

static int cmd_watch(int argc, char **argv)
{
    static const struct option opts[] = {
        TDM_CLI_CLUSTER_OPTION,
        {"interval", required_argument, NULL, 'i'},
        {"until-done", no_argument, NULL, 'u'},
        {"once", no_argument, NULL, 'o'},
        {"submission", required_argument, NULL, 's'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    double interval = 300;
    bool until_done = false, once = false, json = false;
    const char *submission = NULL;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'c': break; /* jobs carry their node's settings; accepted for symmetry */
        case 'i':
            if (!tdm_cli_parse_double(optarg, &interval) || interval < 0.05 || interval > 86400)
                return tdm_cli_fail(TDM_EXIT_USAGE, "--interval takes seconds (0.05 to 86400)");
            break;
        case 'u': until_done = true; break;
        case 'o': once = true; break;
        case 's': submission = optarg; break;
        case 'j': json = true; break;
        case 'h': fputs(watch_usage, stdout); return TDM_EXIT_OK;
        default:
            fputs(watch_usage, stderr);
            return tdm_cli_fail(TDM_EXIT_USAGE, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return tdm_cli_fail(TDM_EXIT_USAGE, "unexpected argument '%s'", argv[optind]);
    signal(SIGINT, on_stop);
    signal(SIGTERM, on_stop);
    for (;;) {
        json_t *jobs;
        char dir[4096];
        int rc = load_jobs(&jobs, dir, sizeof dir, true);
        if (rc)
            return rc;
        const char *sub = submission && !strcmp(submission, "all") ? NULL
                          : submission                             ? submission
                                                                   : tdm_coord_latest_submission(jobs);
        char *sub_copy = sub ? strdup(sub) : NULL;
        json_t *mine = tdm_cli_filter_jobs(jobs, sub_copy);
        json_t *board = tdm_coord_leaderboard(mine, NULL);
        int running = 0, failed = 0;
        size_t i;
        json_t *j;
        json_array_foreach(mine, i, j)
        {
            const char *s = str(j, "state", "");
            running += strcmp(s, "finished") && strcmp(s, "failed");
            failed += !strcmp(s, "failed");
        }
        if (json) {
            json_t *root = json_pack("{s:O,s:O}", "jobs", mine, "leaderboard", board);
            char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
            puts(text);
            free(text);
            json_decref(root);
        } else {
            char now[32];
            tdm_format_rfc3339(time(NULL), now, sizeof now);
            printf("== %s  %d running, %d failed, %zu job(s)\n", now, running, failed,
                   json_array_size(mine));
            tdm_cli_print_jobs(stdout, mine, NULL);
            tdm_cli_print_leaderboard(stdout, board);
        }
        fflush(stdout);
        json_decref(board);
        json_decref(mine);
        json_decref(jobs);
        free(sub_copy);
        if (once || (until_done && running == 0))
            return failed ? TDM_EXIT_FAILURE : TDM_EXIT_OK;
        for (int64_t slept = 0; slept < (int64_t)(interval * 1000) && !stop_watch; slept += 50)
            tdm_sleep_ms(50);
        if (stop_watch)
            return TDM_EXIT_FAILURE;
    }
}

/* ---------------------------------------------------------------- pull */

static const char pull_usage[] =
    "usage: tandem cluster pull [--best | --all] [--submission ID|all] DEST\n"
    "\n"
    "Fetches adapters of finished jobs into DEST/<label> (label, or adapter-N when unlabeled).\n"
    "  --best   the one with the lowest validation loss (default)\n"
    "  --all    every adapter of every finished job\n"
    "  --submission ID   default: the latest submission; 'all' for every job\n";

/* The adapter of job whose submission-wide "index" is index. A job holds only the adapters placed
 * on its node, so its array position is not the submission index (adapter 3 of a submission can
 * be the only one, position 0, of its node's job). NULL when the job has none with that index. */
static json_t *job_adapter(json_t *job, json_t *index)
{
    if (!json_is_integer(index))
        return NULL;
    size_t k;
    json_t *a;
    json_array_foreach(json_object_get(job, "adapters"), k, a)
    {
        json_t *i = json_object_get(a, "index");
        if (json_is_integer(i) && json_integer_value(i) == json_integer_value(index))
            return a;
    }
    return NULL;
}

static int pull_one(json_t *job, json_t *adapter, const char *dest)
{
    const char *output = json_string_value(json_object_get(adapter, "output"));
    if (!output)
        return tdm_cli_fail(TDM_EXIT_FAILURE,
                            "job %s: an adapter without an output path in the job registry "
                            "(damaged record?); nothing copied",
                            str(job, "id", "?"));
    tdm_cluster_node node;
    char *ssh_config;
    tdm_error err = {0};
    if (tdm_node_from_json(json_object_get(job, "node"), &node, &ssh_config, &err) != TDM_OK)
        return tdm_cli_fail_err(&err);
    char name[128], local[4096];
    if (json_is_string(json_object_get(adapter, "label")))
        snprintf(name, sizeof name, "%s", str(adapter, "label", ""));
    else
        snprintf(name, sizeof name, "adapter-%lld",
                 (long long)json_integer_value(json_object_get(adapter, "index")) + 1);
    snprintf(local, sizeof local, "%s/%s", dest, name);
    struct stat st;
    int rc = TDM_EXIT_OK;
    tdm_transport t;
    if (stat(local, &st) == 0) {
        rc = tdm_cli_fail(TDM_EXIT_FAILURE, "%s already exists; choose another DEST", local);
    } else if (tdm_transport_init(&t, &node, ssh_config, &err) != TDM_OK ||
               tdm_transport_pull(&t, output, local, &err) != TDM_OK) {
        rc = tdm_cli_fail(TDM_EXIT_FAILURE, "%s: %s", node.name, err.message);
    } else {
        printf("%s  <-  %s:%s\n", local, node.name, output);
    }
    tdm_cluster_node_free(&node);
    free(ssh_config);
    return rc;
}

static int cmd_pull(int argc, char **argv)
{
    static const struct option opts[] = {
        TDM_CLI_CLUSTER_OPTION,
        {"best", no_argument, NULL, 'b'},
        {"all", no_argument, NULL, 'a'},
        {"submission", required_argument, NULL, 's'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    bool all = false, best = false;
    const char *submission = NULL;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'c': break;
        case 'b': best = true; break;
        case 'a': all = true; break;
        case 's': submission = optarg; break;
        case 'h': fputs(pull_usage, stdout); return TDM_EXIT_OK;
        default:
            fputs(pull_usage, stderr);
            return tdm_cli_fail(TDM_EXIT_USAGE, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (all && best)
        return tdm_cli_fail(TDM_EXIT_USAGE, "--best and --all exclude each other");
    if (optind + 1 != argc)
        return fputs(pull_usage, stderr), TDM_EXIT_USAGE;
    const char *dest = argv[optind];
    if (mkdir(dest, 0755) != 0 && errno != EEXIST)
        return tdm_cli_fail(TDM_EXIT_FAILURE, "mkdir %s: %s", dest, strerror(errno));
    json_t *jobs;
    char dir[4096];
    int rc = load_jobs(&jobs, dir, sizeof dir, true);
    if (rc)
        return rc;
    const char *sub = submission && !strcmp(submission, "all") ? NULL
                      : submission                             ? submission
                                                               : tdm_coord_latest_submission(jobs);
    json_t *mine = tdm_cli_filter_jobs(jobs, sub);
    int pulled = 0;
    if (all) {
        size_t i;
        json_t *j;
        json_array_foreach(mine, i, j)
        {
            if (strcmp(str(j, "state", ""), "finished"))
                continue;
            size_t k;
            json_t *a;
            json_array_foreach(json_object_get(j, "adapters"), k, a)
            {
                int r = pull_one(j, a, dest);
                rc = rc ? rc : r;
                pulled += r == 0;
            }
        }
    } else {
        json_t *board = tdm_coord_leaderboard(mine, NULL);
        size_t i;
        json_t *row;
        json_array_foreach(board, i, row)
        {
            if (!json_is_number(json_object_get(row, "val_loss")) ||
                strcmp(str(row, "state", ""), "finished"))
                continue;
            size_t k;
            json_t *j;
            json_array_foreach(mine, k, j)
            {
                if (strcmp(str(j, "id", ""), str(row, "job", "")))
                    continue;
                json_t *a = job_adapter(j, json_object_get(row, "index"));
                if (!a) {
                    rc = tdm_cli_fail(TDM_EXIT_FAILURE,
                                      "job %s has no adapter #%lld (damaged registry record?); "
                                      "nothing copied",
                                      str(j, "id", "?"),
                                      (long long)json_integer_value(json_object_get(row, "index")) +
                                          1);
                    break;
                }
                rc = pull_one(j, a, dest);
                pulled += rc == 0;
                printf("best: %s (validation loss %.6g, node %s)\n", str(row, "label", "?"),
                       json_number_value(json_object_get(row, "val_loss")), str(row, "node", "?"));
            }
            break;
        }
        json_decref(board);
    }
    if (!pulled && !rc)
        rc = tdm_cli_fail(TDM_EXIT_FAILURE,
                          "nothing to pull: no finished adapter%s in %s",
                          all ? "" : " with a validation loss", sub ? sub : "the registry");
    json_decref(mine);
    json_decref(jobs);
    return rc;
}

static const tdm_command cluster_commands[] = {
    {"status", cmd_status, "nodes, live GPU state, jobs and the leaderboard"},
    {"run", cmd_run, "start any command detached on a node, tracked as a job"},
    {"watch", cmd_watch, "poll jobs, mark dead ones failed, print the leaderboard"},
    {"pull", cmd_pull, "fetch the best (or all) finished adapters"},
    {"logs", tdm_cmd_cluster_logs, "print a job's log; --follow it while it runs"},
    {"cancel", tdm_cmd_cluster_cancel, "stop a job gracefully (a finetune checkpoints first)"},
    {NULL, NULL, NULL},
};

int tdm_cmd_cluster(int argc, char **argv)
{
    return tdm_cli_dispatch("tandem cluster", cluster_commands, argc - 1, argv + 1);
}
