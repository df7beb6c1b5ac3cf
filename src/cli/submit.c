/* tandem submit — place the adapters of an adapters.toml on cluster nodes, copy what each node
 * lacks, and start one `tandem finetune` per node there (docs/cluster.md). */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/cluster_common.h"
#include "cluster/speed.h"
#include "run/submit_run.h"

static const char usage_text[] =
    "usage: tandem submit --cluster FILE --model MODEL_DIR --adapters-config FILE\n"
    "                     [--dry-run] [--stage-only] [--json] [finetune flags]\n"
    "\n"
    "Scores every node of cluster.yaml with its live GPU state, places each adapter on the best\n"
    "one (adapters on one node share one `tandem finetune` process), copies the model and data\n"
    "to nodes that lack them (compared by SHA-256), writes each node's adapters.toml and starts\n"
    "the jobs detached; they are recorded in the job registry for `tandem cluster watch`.\n"
    "  --dry-run       print the plan (every score, every excluded node and why) and stop\n"
    "  --stage-only    copy model and data and write the adapters.toml files, start nothing\n"
    "  --json          print one JSON document {submission, plan, jobs, error} on stdout (the\n"
    "                  progress lines go to stderr)\n"
    "Relative data paths resolve against the adapters.toml's directory; relative output paths\n"
    "resolve inside the node's workdir.\n";

/* usage_text, then the finetune flags submit passes on (from the option table). */
static void print_usage(FILE *out)
{
    fputs(usage_text, out);
    fputs("finetune flags passed on to every node (docs/finetune.md):\n ", out);
    size_t n_rows, col = 1;
    const tdm_run_option *rows = tdm_run_option_table(&n_rows);
    for (size_t i = 0; i < n_rows; i++) {
        if (!rows[i].submit_passes || !(rows[i].commands & TDM_CMD_FINETUNE)) continue;
        size_t len = strlen(rows[i].flag) + 3;
        if (col + len > 96) {
            fputs("\n ", out);
            col = 1;
        }
        fprintf(out, " --%s", rows[i].flag);
        col += len;
    }
    fputc('\n', out);
}

/* A progress line of the run (a node staged, a job started). */
static void print_line(const char *line, void *user)
{
    (void)user;
    printf("%s\n", line);
    fflush(stdout);
}

/* --dry-run under scheduler: slurm: the batch script that would go to sbatch. */
static void print_script(const char *path, const char *text, void *user)
{
    (void)user;
    printf("\n==> %s (not written: --dry-run) <==\n%s", path, text);
    fflush(stdout);
}

/* The finetune flags passed on to every node's `tandem finetune` are the rows of the option
 * table (src/run/run_options.c) marked submit_passes; submit parses them too, with the same
 * checks, for the placement estimate. --device is chosen by placement; --init-adapter is not
 * staged (refused). */
typedef struct pass_flags {
    const char *v[64];
    size_t n;
} pass_flags;

/* The plan hook: every adapter, every node's score or why it was excluded, one line per node. */
/* The device of adapter a's process on node n: a GPU index, -1 the CPU (Slurm jobs: the job's). */
static int process_gpu(const tdm_place_plan *plan, size_t a, size_t n)
{
    return plan->gpu_of ? plan->gpu_of[a] : plan->device_of_node[n];
}

/* The device of node n's next process after device after (start with -2): the CPU (-1) or the
 * next GPU index with adapters, in index order; -2 when there is none. */
static int next_process(const tdm_place_plan *plan, size_t n, size_t n_adapters, int after)
{
    int best = -2;
    for (size_t a = 0; a < n_adapters; a++) {
        if (plan->node_of[a] != (int)n) continue;
        int g = process_gpu(plan, a, n);
        if (g > after && (best == -2 || g < best)) best = g;
    }
    return best;
}

static void print_plan(const tdm_submit_plan *p, void *user)
{
    (void)user;
    const tdm_cluster_config *cfg = p->cluster;
    const tdm_place_node *pn = p->nodes;
    const tdm_adapters_config *ac = p->adapters;
    char *const *labels = p->labels;
    const tdm_place_plan *plan = p->plan;
    const tdm_run_budget *b = p->budget;
    int64_t params = p->model_params;
    int64_t second_gpu = b->n_adapters > 1 ? b->gpu_mb[2] - b->gpu_mb[1] : 0;
    int64_t second_cpu = b->n_adapters > 1 ? b->cpu_mb[2] - b->cpu_mb[1] : 0;
    printf("Model: %lld parameters; one adapter needs %lld MiB on a GPU (%lld MiB more for a\n"
           "second adapter in the same process), %lld MiB on a CPU (%lld more).\n",
           (long long)params, (long long)b->gpu_mb[1], (long long)second_gpu,
           (long long)b->cpu_mb[1], (long long)second_cpu);
    if (b->gpu_min_mb[b->n_adapters] < b->gpu_mb[b->n_adapters])
        printf("A GPU with less room takes a process whose smallest plan fits it (--vram auto: "
               "gradient checkpointing, micro-batches): %lld MiB for one adapter.\n",
               (long long)b->gpu_min_mb[1]);
    printf("score = (free / budget) x speed x 1/(1 + active adapters)\n");
    for (size_t a = 0; a < ac->n_adapters; a++) {
        int chosen = plan->node_of[a];
        int cg = chosen >= 0 ? process_gpu(plan, a, (size_t)chosen) : -1;
        const char *gpu = cg >= 0 && pn[chosen].gpus ? pn[chosen].gpus[cg].uuid : NULL;
        printf("\nadapter %zu (%s): %s%s%s%s\n", a + 1, labels[a],
               chosen >= 0 ? "-> " : "NOT PLACED", chosen >= 0 ? cfg->nodes[chosen].name : "",
               gpu ? " " : "", gpu ? gpu : "");
        for (size_t n = 0; n < cfg->n_nodes; n++) {
            const tdm_place_eval *e = &plan->evals[a * cfg->n_nodes + n];
            if (!e->eligible) {
                printf("    %-14s excluded: %s\n", cfg->nodes[n].name, e->why);
                continue;
            }
            const char *dev = e->gpu >= 0 ? pn[n].gpus[e->gpu].name : "CPU";
            double speed = e->gpu >= 0 ? pn[n].gpus[e->gpu].speed : TDM_SPEED_CPU;
            printf("    %-14s score %.4f  (%s, free %lld MiB, speed %.2f, %d active)%s\n",
                   cfg->nodes[n].name, e->score, dev, (long long)e->free_mb, speed,
                   pn[n].active_adapters, (int)n == chosen ? "  <- chosen" : "");
        }
    }
    printf("\nPlan:\n");
    for (size_t n = 0; n < cfg->n_nodes; n++) {
        if (!plan->adapters_on_node[n]) continue;
        for (int g = next_process(plan, n, ac->n_adapters, -2); g != -2;
             g = next_process(plan, n, ac->n_adapters, g)) {
            int k = 0;
            for (size_t a = 0; a < ac->n_adapters; a++)
                k += plan->node_of[a] == (int)n && process_gpu(plan, a, n) == g;
            printf("  %-14s one finetune process on %s with %d adapter(s):", cfg->nodes[n].name,
                   g >= 0 ? pn[n].gpus[g].uuid : "the CPU", k);
            for (size_t a = 0; a < ac->n_adapters; a++)
                if (plan->node_of[a] == (int)n && process_gpu(plan, a, n) == g)
                    printf(" %s", labels[a]);
            printf("\n");
        }
    }
    fflush(stdout);
}

/* --json: the plan and the jobs started, as one document (docs/cluster.md "submit --json"). */
typedef struct json_out {
    json_t *plan; /* NULL until placement is done */
    json_t *jobs;
} json_out;

static json_t *plan_json(const tdm_submit_plan *p)
{
    const tdm_cluster_config *cfg = p->cluster;
    const tdm_place_plan *plan = p->plan;
    const tdm_run_budget *b = p->budget;
    json_t *adapters = json_array();
    for (size_t a = 0; a < p->adapters->n_adapters; a++) {
        int chosen = plan->node_of[a];
        json_t *nodes = json_array();
        for (size_t n = 0; n < cfg->n_nodes; n++) {
            const tdm_place_eval *e = &plan->evals[a * cfg->n_nodes + n];
            json_t *o =
                json_pack("{s:s, s:b}", "node", cfg->nodes[n].name, "eligible", e->eligible);
            if (e->eligible) {
                json_object_set_new(o, "score", json_real(e->score));
                json_object_set_new(o, "device",
                                    e->gpu >= 0 ? json_string(p->nodes[n].gpus[e->gpu].uuid)
                                                : json_string("cpu"));
                json_object_set_new(o, "free_mb", json_integer(e->free_mb));
                json_object_set_new(o, "need_mb", json_integer(e->need_mb));
                json_object_set_new(o, "active_adapters",
                                    json_integer(p->nodes[n].active_adapters));
            } else {
                json_object_set_new(o, "why", json_string(e->why));
            }
            json_array_append_new(nodes, o);
        }
        int cg = chosen >= 0 ? process_gpu(plan, a, (size_t)chosen) : -1;
        json_t *device = chosen < 0 ? json_null()
                         : cg >= 0 && p->nodes[chosen].gpus
                             ? json_string(p->nodes[chosen].gpus[cg].uuid)
                             : json_string("cpu");
        json_array_append_new(
            adapters, json_pack("{s:I, s:s, s:o, s:o, s:o}", "index", (json_int_t)a + 1, "label",
                                p->labels[a], "node",
                                chosen >= 0 ? json_string(cfg->nodes[chosen].name) : json_null(),
                                "device", device, "nodes", nodes));
    }
    json_t *processes = json_array();
    size_t na = p->adapters->n_adapters;
    for (size_t n = 0; n < cfg->n_nodes; n++) {
        if (!plan->adapters_on_node[n]) continue;
        for (int g = next_process(plan, n, na, -2); g != -2; g = next_process(plan, n, na, g)) {
            json_t *labels = json_array();
            for (size_t a = 0; a < na; a++)
                if (plan->node_of[a] == (int)n && process_gpu(plan, a, n) == g)
                    json_array_append_new(labels, json_string(p->labels[a]));
            json_array_append_new(
                processes, json_pack("{s:s, s:s, s:o}", "node", cfg->nodes[n].name, "device",
                                     g >= 0 && p->nodes[n].gpus ? p->nodes[n].gpus[g].uuid : "cpu",
                                     "adapters", labels));
        }
    }
    int64_t second_gpu = b->n_adapters > 1 ? b->gpu_mb[2] - b->gpu_mb[1] : 0;
    int64_t second_cpu = b->n_adapters > 1 ? b->cpu_mb[2] - b->cpu_mb[1] : 0;
    return json_pack("{s:I, s:{s:I, s:I, s:I, s:I}, s:o, s:o}", "model_params",
                     (json_int_t)p->model_params, "budget_mb", "gpu_one", (json_int_t)b->gpu_mb[1],
                     "gpu_each_more", (json_int_t)second_gpu, "cpu_one", (json_int_t)b->cpu_mb[1],
                     "cpu_each_more", (json_int_t)second_cpu, "adapters", adapters, "processes",
                     processes);
}

static void plan_to_json(const tdm_submit_plan *p, void *user)
{
    json_out *o = user;
    json_decref(o->plan);
    o->plan = plan_json(p);
}

static void job_to_json(const tdm_submit_job *j, void *user)
{
    json_out *o = user;
    char log[4200];
    snprintf(log, sizeof log, "%s/log", j->job_dir);
    json_array_append_new(o->jobs,
                          json_pack("{s:s, s:s, s:s, s:s, s:I, s:i, s:s, s:s}", "id", j->id,
                                    "submission", j->submission, "node", j->node, "device",
                                    j->device ? j->device : "cpu", "pid", (json_int_t)j->pid,
                                    "adapters", j->n_adapters, "job_dir", j->job_dir, "log", log));
}

static void note_to_stderr(const char *line, void *user)
{
    (void)user;
    fprintf(stderr, "%s\n", line);
}

int tdm_cmd_submit(int argc, char **argv)
{
    /* Our own options, then one per passed-through finetune flag (codes 1000+). */
    static const struct option own[] = {
        {"cluster", required_argument, NULL, 'c'},
        {"model", required_argument, NULL, 'm'},
        {"adapters-config", required_argument, NULL, 'a'},
        {"dry-run", no_argument, NULL, 'd'},
        {"stage-only", no_argument, NULL, 's'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
    };
    enum { N_OWN = sizeof own / sizeof *own };
    size_t n_rows;
    const tdm_run_option *rows = tdm_run_option_table(&n_rows);
    struct option opts[N_OWN + 64 + 1];
    const tdm_run_option *passed[64];
    size_t n_opts = 0, n_passed = 0;
    for (size_t i = 0; i < N_OWN; i++)
        opts[n_opts++] = own[i];
    for (size_t i = 0; i < n_rows && n_passed < 64; i++) {
        if (!rows[i].submit_passes || !(rows[i].commands & TDM_CMD_FINETUNE)) continue;
        opts[n_opts++] =
            (struct option){rows[i].flag, rows[i].metavar ? required_argument : no_argument, NULL,
                            1000 + (int)n_passed};
        passed[n_passed++] = &rows[i];
    }
    opts[n_opts] = (struct option){NULL, 0, NULL, 0};
    const char *cluster = NULL, *model = NULL, *adapters_path = NULL;
    bool dry_run = false, stage_only = false, json = false;
    pass_flags pf = {0};
    static char flagbuf[64][32];
    tdm_run_opts ro; /* the passed flags as finetune will read them */
    tdm_run_opts_default(&ro, TDM_CMD_FINETUNE);
    tdm_error err = {0};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c >= 1000 && c < 1000 + (int)n_passed) {
            const tdm_run_option *row = passed[c - 1000];
            snprintf(flagbuf[c - 1000], sizeof flagbuf[0], "--%s", row->flag);
            if (pf.n + 2 >= sizeof pf.v / sizeof *pf.v)
                return tdm_cli_fail(TDM_EXIT_USAGE, "too many flags");
            pf.v[pf.n++] = flagbuf[c - 1000];
            if (row->metavar) pf.v[pf.n++] = optarg;
            if (tdm_run_option_set(&ro, row, row->metavar ? optarg : "", &err) != TDM_OK)
                return tdm_cli_fail(TDM_EXIT_USAGE, "%s", err.message);
            continue;
        }
        switch (c) {
        case 'c':
            cluster = optarg;
            break;
        case 'm':
            model = optarg;
            break;
        case 'a':
            adapters_path = optarg;
            break;
        case 'd':
            dry_run = true;
            break;
        case 's':
            stage_only = true;
            break;
        case 'j':
            json = true;
            break;
        case 'h':
            print_usage(stdout);
            return TDM_EXIT_OK;
        default:
            print_usage(stderr);
            return tdm_cli_fail(TDM_EXIT_USAGE, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return tdm_cli_fail(TDM_EXIT_USAGE, "unexpected argument '%s'", argv[optind]);
    if (!model || !adapters_path)
        return print_usage(stderr),
               tdm_cli_fail(TDM_EXIT_USAGE, "--model and --adapters-config are required");

    tdm_cluster_config cfg;
    int rc = tdm_cli_load_cluster(cluster, &cfg);
    if (rc) return rc;
    tdm_submit_request req = {.cluster = &cfg,
                              .model_dir = model,
                              .adapters_config = adapters_path,
                              .opts = &ro,
                              .pass_argv = pf.v,
                              .n_pass = pf.n,
                              .dry_run = dry_run,
                              .stage_only = stage_only};
    tdm_submit_hooks hooks = {
        .plan = print_plan, .note = print_line, .script = dry_run ? print_script : NULL};
    json_out jo = {0};
    if (json) {
        jo.jobs = json_array();
        hooks = (tdm_submit_hooks){
            .plan = plan_to_json, .note = note_to_stderr, .job = job_to_json, .user = &jo};
    }
    tdm_status st = tdm_run_submit(&req, &hooks, &err);
    if (json) {
        /* one document whatever happened: a script reads the plan and the ids from it */
        json_t *doc = json_pack("{s:o, s:b, s:b, s:o, s:O, s:o}", "submission",
                                hooks.submission[0] ? json_string(hooks.submission) : json_null(),
                                "dry_run", dry_run, "stage_only", stage_only, "plan",
                                jo.plan ? jo.plan : json_null(), "jobs", jo.jobs, "error",
                                st == TDM_OK ? json_null() : json_string(err.message));
        char *text = doc ? json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
        if (text) puts(text);
        free(text);
        json_decref(doc);
        json_decref(jo.jobs);
        if (st != TDM_OK) rc = tdm_cli_fail_err(&err);
    } else if (st != TDM_OK) {
        fflush(stdout);
        rc = tdm_cli_fail_err(&err);
    } else if (dry_run) {
        printf("\n(dry run: nothing copied, nothing started)\n");
    } else if (hooks.submission[0]) {
        printf("submission %s; follow it with `tandem cluster watch`\n", hooks.submission);
    }
    tdm_cluster_config_free(&cfg);
    return rc;
}
