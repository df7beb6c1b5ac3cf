/* tandem submit — place the adapters of an adapters.toml on cluster nodes, copy what each node
 * lacks, and start one `tandem finetune` per node there (docs/cluster.md). */
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/cluster_common.h"
#include "cluster/cluster_config.h"
#include "cluster/job.h"
#include "cluster/node_probe.h"
#include "cluster/placement.h"
#include "cluster/registry.h"
#include "cluster/speed.h"
#include "cluster/stage.h"
#include "cluster/transport.h"
#include "model/config.h"
#include "run/placement_budget.h"
#include "run/run_options.h"
#include "train/adapters_config.h"
#include "util/atomic_file.h"
#include "util/timeutil.h"

static const char usage_text[] =
    "usage: tandem submit --cluster FILE --model MODEL_DIR --adapters-config FILE\n"
    "                     [--dry-run] [--stage-only] [finetune flags]\n"
    "\n"
    "Scores every node of cluster.yaml with its live GPU state, places each adapter on the best\n"
    "one (adapters on one node share one `tandem finetune` process), copies the model and data\n"
    "to nodes that lack them (compared by SHA-256), writes each node's adapters.toml and starts\n"
    "the jobs detached; they are recorded in the job registry for `tandem cluster watch`.\n"
    "  --dry-run       print the plan (every score, every excluded node and why) and stop\n"
    "  --stage-only    copy model and data and write the adapters.toml files, start nothing\n"
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

/* The finetune flags passed on to every node's `tandem finetune` are the rows of the option
 * table (src/run/run_options.c) marked submit_passes; submit parses them too, with the same
 * checks, for the placement estimate. --device is chosen by placement; --init-adapter is not
 * staged (refused). */
typedef struct pass_flags {
    const char *v[64];
    size_t n;
} pass_flags;

/* TOML basic string. */
static void toml_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20 || *p == 0x7F)
            fprintf(f, "\\u%04X", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

/* key = v as a TOML float: 17 significant digits, and ".0" when %g printed an integer */
static void toml_float(FILE *f, const char *key, double v)
{
    char w[64];
    snprintf(w, sizeof w, "%.17g", v);
    fprintf(f, "%s = %s%s\n", key, w, strpbrk(w, ".e") ? "" : ".0");
}

static void write_adapter(FILE *f, const tdm_adapter_spec *s, const char *data, const char *output,
                          const char *label)
{
    fprintf(f, "\n[[adapter]]\ndata = ");
    toml_str(f, data);
    fprintf(f, "\noutput = ");
    toml_str(f, output);
    fprintf(f, "\nlabel = ");
    toml_str(f, label);
    fprintf(f, "\n");
    if (s->has_rank) fprintf(f, "rank = %d\n", s->rank);
    if (s->has_alpha) fprintf(f, "alpha = %.17g\n", s->alpha);
    if (s->has_targets) {
        fprintf(f, "targets = [");
        int k = 0;
        for (unsigned b = 0; b < TDM_ADAPTER_TARGET_COUNT; b++)
            if (s->targets & (1u << b))
                fprintf(f, "%s\"%s\"", k++ ? ", " : "", tdm_adapter_target_name(b));
        fprintf(f, "]\n");
    }
    if (s->has_learning_rate) fprintf(f, "learning_rate = %.17g\n", s->learning_rate);
    if (s->has_epochs) fprintf(f, "epochs = %d\n", s->epochs);
    if (s->has_batch_size) fprintf(f, "batch_size = %d\n", s->batch_size);
    if (s->has_max_seq_len) fprintf(f, "max_seq_len = %d\n", s->max_seq_len);
    if (s->has_weight) toml_float(f, "weight", s->weight);
    if (s->has_lora_dropout) toml_float(f, "lora_dropout", s->lora_dropout);
}

static char *resolve(const char *base_dir, const char *path)
{
    size_t n = strlen(base_dir) + strlen(path) + 2;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s/%s", base_dir, path);
    if (s && path[0] == '/') snprintf(s, n, "%s", path);
    return s;
}

typedef struct node_info {
    tdm_node_state state;
    tdm_place_gpu *gpus;
    bool probed;
    char why_no_cuda[240]; /* set when the node has GPUs but its tandem has no CUDA backend */
} node_info;

static void print_plan(const tdm_cluster_config *cfg, const tdm_place_node *pn, node_info *info,
                       const tdm_adapters_config *ac, char **labels, const tdm_place_plan *plan,
                       const tdm_run_budget *b, int64_t params)
{
    int64_t second_gpu = b->n_adapters > 1 ? b->gpu_mb[2] - b->gpu_mb[1] : 0;
    int64_t second_cpu = b->n_adapters > 1 ? b->cpu_mb[2] - b->cpu_mb[1] : 0;
    printf("Model: %lld parameters; one adapter needs %lld MiB on a GPU (%lld MiB more for a\n"
           "second adapter in the same process), %lld MiB on a CPU (%lld more).\n",
           (long long)params, (long long)b->gpu_mb[1], (long long)second_gpu,
           (long long)b->cpu_mb[1], (long long)second_cpu);
    printf("score = (free / budget) x speed x 1/(1 + active adapters)\n");
    for (size_t a = 0; a < ac->n_adapters; a++) {
        int chosen = plan->node_of[a];
        printf("\nadapter %zu (%s): %s%s\n", a + 1, labels[a], chosen >= 0 ? "-> " : "NOT PLACED",
               chosen >= 0 ? cfg->nodes[chosen].name : "");
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
    (void)info;
    printf("\nPlan:\n");
    for (size_t n = 0; n < cfg->n_nodes; n++) {
        if (!plan->adapters_on_node[n]) continue;
        int g = plan->device_of_node[n];
        printf("  %-14s one finetune process on %s with %d adapter(s):", cfg->nodes[n].name,
               g >= 0 ? pn[n].gpus[g].uuid : "the CPU", plan->adapters_on_node[n]);
        for (size_t a = 0; a < ac->n_adapters; a++)
            if (plan->node_of[a] == (int)n) printf(" %s", labels[a]);
        printf("\n");
    }
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
    bool dry_run = false, stage_only = false;
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
    tdm_adapters_config ac;
    tdm_model_config mc;
    if (tdm_adapters_config_load(adapters_path, &ac, &err) != TDM_OK) {
        tdm_cluster_config_free(&cfg);
        return tdm_cli_fail_err(&err);
    }
    if (tdm_model_config_load(&mc, model, &err) != TDM_OK) {
        tdm_adapters_config_free(&ac);
        tdm_cluster_config_free(&cfg);
        return tdm_cli_fail_err(&err);
    }
    for (size_t a = 0; a < ac.n_adapters; a++)
        if (ac.adapters[a].init_adapter) {
            rc = tdm_cli_fail(TDM_EXIT_USAGE,
                              "%s:%u: init_adapter is not supported by submit yet (copy the "
                              "adapter to the nodes and train there with `tandem finetune`)",
                              adapters_path, ac.adapters[a].key_line[TDM_ADAPTER_KEY_INIT_ADAPTER]);
            tdm_adapters_config_free(&ac);
            tdm_cluster_config_free(&cfg);
            return rc;
        }

    /* Labels: the file's, else adapter-N (skipping names the file already uses). */
    char **labels = calloc(ac.n_adapters, sizeof *labels);
    for (size_t a = 0; labels && a < ac.n_adapters; a++) {
        if (ac.adapters[a].label) {
            labels[a] = strdup(ac.adapters[a].label);
            continue;
        }
        for (int k = (int)a + 1;; k++) {
            char l[32];
            snprintf(l, sizeof l, "adapter-%d", k);
            bool used = false;
            for (size_t b = 0; b < ac.n_adapters; b++)
                used |= ac.adapters[b].label && !strcmp(ac.adapters[b].label, l);
            if (!used) {
                labels[a] = strdup(l);
                break;
            }
        }
    }

    /* The memory each node's finetune process will reserve (the --vram auto estimate). */
    int64_t params = tdm_model_config_param_count(&mc);
    tdm_run_budget budget;
    if (tdm_run_placement_budget(&mc, &ro, &ac, &budget, &err) != TDM_OK) {
        rc = tdm_cli_fail_err(&err);
        goto out_early;
    }

    /* Live state of every node, and what already runs there. */
    char regdir[4096];
    json_t *jobs = NULL;
    if (tdm_registry_dir(regdir, sizeof regdir, &err) != TDM_OK ||
        tdm_registry_load(regdir, &jobs, &err) != TDM_OK) {
        rc = tdm_cli_fail_err(&err);
        goto out_early;
    }
    node_info *info = calloc(cfg.n_nodes, sizeof *info);
    tdm_place_node *pn = calloc(cfg.n_nodes, sizeof *pn);
    tdm_transport *tr = calloc(cfg.n_nodes, sizeof *tr);
    if (!info || !pn || !tr || !labels) {
        rc = tdm_cli_fail(TDM_EXIT_FAILURE, "out of memory");
        goto out;
    }
    for (size_t n = 0; n < cfg.n_nodes; n++) {
        const tdm_cluster_node *node = &cfg.nodes[n];
        tdm_node_state *s = &info[n].state;
        tdm_error e = {0};
        if (tdm_transport_init(&tr[n], node, cfg.ssh_config, &e) != TDM_OK ||
            tdm_node_probe(&tr[n], 30000, s, &e) != TDM_OK) {
            memset(s, 0, sizeof *s);
            s->cuda = -1;
            snprintf(s->reason, sizeof s->reason, "%.500s", e.message);
        }
        info[n].probed = true;
        if (s->cuda == 0) {
            snprintf(info[n].why_no_cuda, sizeof info[n].why_no_cuda,
                     "has GPUs, but its tandem (%.60s) was built without CUDA (features: %.40s); "
                     "rebuild it with CUDA or set tandem: to one that has it",
                     node->tandem, s->features);
            pn[n].why_no_cuda = info[n].why_no_cuda;
        }
        pn[n].name = node->name;
        pn[n].reachable = s->reachable && s->gpu_ok;
        pn[n].why_unreachable = s->reason[0] ? s->reason : "no GPU state";
        pn[n].max_adapters = node->max_adapters;
        pn[n].cpu_max_params = node->cpu_max_params;
        pn[n].ram_free_mb = s->ram_available_mb >= 0 ? s->ram_available_mb : node->ram_mb;
        info[n].gpus = calloc(s->n_gpus ? s->n_gpus : 1, sizeof *info[n].gpus);
        for (size_t g = 0; info[n].gpus && g < s->n_gpus; g++) {
            double speed = 0;
            for (size_t k = 0; k < node->n_gpus; k++)
                if (!strcmp(node->gpus[k].uuid, s->gpus[g].uuid)) {
                    speed = node->gpus[k].speed;
                    if (!speed && node->gpus[k].type)
                        speed = tdm_gpu_speed_factor(node->gpus[k].type);
                }
            info[n].gpus[g] =
                (tdm_place_gpu){.uuid = s->gpus[g].uuid,
                                .name = s->gpus[g].name,
                                .speed = speed > 0 ? speed : tdm_gpu_speed_factor(s->gpus[g].name),
                                .free_mb = s->gpus[g].free_mb};
        }
        pn[n].gpus = info[n].gpus;
        pn[n].n_gpus = s->n_gpus;
        size_t i;
        json_t *j;
        json_array_foreach(jobs, i, j)
        {
            const char *jn = json_string_value(json_object_get(json_object_get(j, "node"), "name"));
            const char *js = json_string_value(json_object_get(j, "state"));
            if (jn && js && !strcmp(jn, node->name) && !strcmp(js, "running"))
                pn[n].active_adapters += (int)json_array_size(json_object_get(j, "adapters"));
        }
    }
    tdm_place_plan plan;
    tdm_status pst = tdm_place(pn, cfg.n_nodes, ac.n_adapters, &budget.place, params, &plan, &err);
    if (plan.node_of) print_plan(&cfg, pn, info, &ac, labels, &plan, &budget, params);
    if (pst != TDM_OK) {
        rc = tdm_cli_fail(TDM_EXIT_FAILURE, "%s", err.message);
        goto out_plan;
    }
    /* `cluster pull` copies only from inside a node's workdir (tdm_transport_check_remote_path):
     * say so now for an output that will train elsewhere. */
    for (size_t a = 0; a < ac.n_adapters; a++) {
        const tdm_cluster_node *node = &cfg.nodes[plan.node_of[a]];
        const char *o = ac.adapters[a].output;
        char *rout = o[0] == '/' ? strdup(o) : resolve(node->workdir, o);
        tdm_error e = {0};
        if (rout && tdm_transport_check_remote_path(node, rout, &e) != TDM_OK)
            printf("\nnote: adapter %zu (%s) writes %s on %s, outside its workdir %s: `tandem "
                   "cluster pull` will not copy it (copies stay inside the workdir)\n",
                   a + 1, labels[a], rout, node->name, node->workdir);
        free(rout);
    }
    if (dry_run) {
        printf("\n(dry run: nothing copied, nothing started)\n");
        goto out_plan;
    }
    fflush(stdout);

    /* Stage, write adapters.toml, launch, record. */
    char adir[PATH_MAX];
    {
        const char *slash = strrchr(adapters_path, '/');
        snprintf(adir, sizeof adir, "%.*s", slash ? (int)(slash - adapters_path) : 1,
                 slash ? adapters_path : ".");
        if (slash == adapters_path) snprintf(adir, sizeof adir, "/");
    }
    char submission[128], now[32];
    tdm_registry_new_id(NULL, submission, sizeof submission);
    tdm_format_rfc3339(time(NULL), now, sizeof now);
    for (size_t n = 0; n < cfg.n_nodes && !rc; n++) {
        if (!plan.adapters_on_node[n]) continue;
        const tdm_cluster_node *node = &cfg.nodes[n];
        tdm_stage_stats ms = {0}, ds = {0};
        char *rmodel = NULL;
        if (tdm_stage_model(&tr[n], model, &rmodel, &ms, &err) != TDM_OK) {
            rc = tdm_cli_fail(TDM_EXIT_FAILURE, "%s: copying the model: %s", node->name,
                              err.message);
            break;
        }
        char id[128], job_dir[4096], tmp[64];
        tdm_registry_new_id(node->name, id, sizeof id);
        snprintf(job_dir, sizeof job_dir, "%s/jobs/%s", node->workdir, id);
        snprintf(tmp, sizeof tmp, "/tmp/tandem-adapters-XXXXXX");
        int fd = mkstemp(tmp);
        FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
        if (!f) {
            free(rmodel);
            rc = tdm_cli_fail(TDM_EXIT_FAILURE, "cannot write a temporary file");
            break;
        }
        fprintf(f, "# written by tandem submit for node %s from %s\n", node->name, adapters_path);
        json_t *jadapters = json_array();
        for (size_t a = 0; a < ac.n_adapters && !rc; a++) {
            if (plan.node_of[a] != (int)n) continue;
            const tdm_adapter_spec *s = &ac.adapters[a];
            char *local = resolve(adir, s->data), *rdata = NULL;
            char *rout =
                s->output[0] == '/' ? strdup(s->output) : resolve(node->workdir, s->output);
            if (!local || !rout || tdm_stage_file(&tr[n], local, &rdata, &ds, &err) != TDM_OK) {
                rc = tdm_cli_fail(TDM_EXIT_FAILURE, "%s: copying %s: %s", node->name, s->data,
                                  err.message);
            } else {
                write_adapter(f, s, rdata, rout, labels[a]);
                json_array_append_new(jadapters,
                                      json_pack("{s:I,s:s,s:s,s:s,s:n,s:n}", "index", (json_int_t)a,
                                                "label", labels[a], "data", rdata, "output", rout,
                                                "metrics", "val_loss"));
            }
            free(local);
            free(rdata);
            free(rout);
        }
        fclose(f);
        printf("%s: model %zu file(s) copied, %zu already there; data %zu copied, %zu already "
               "there (compared by SHA-256)\n",
               node->name, ms.copied, ms.present, ds.copied, ds.present);
        char remote_toml[4200];
        snprintf(remote_toml, sizeof remote_toml, "%s/adapters.toml", job_dir);
        if (!rc && tdm_transport_push(&tr[n], tmp, remote_toml, &err) != TDM_OK)
            rc = tdm_cli_fail(TDM_EXIT_FAILURE, "%s: %s", node->name, err.message);
        unlink(tmp);
        if (rc || stage_only) {
            if (!rc) printf("%s: staged %s (not started: --stage-only)\n", node->name, remote_toml);
            json_decref(jadapters);
            free(rmodel);
            continue;
        }
        /* env CUDA_VISIBLE_DEVICES=UUID TANDEM finetune MODEL --adapters-config TOML --device D */
        const char *fa[96];
        size_t k = 0;
        char cvd[160];
        int g = plan.device_of_node[n];
        if (g >= 0) {
            snprintf(cvd, sizeof cvd, "CUDA_VISIBLE_DEVICES=%s", info[n].gpus[g].uuid);
            fa[k++] = "env";
            fa[k++] = cvd;
        }
        fa[k++] = node->tandem;
        fa[k++] = "finetune";
        fa[k++] = rmodel;
        fa[k++] = "--adapters-config";
        fa[k++] = remote_toml;
        fa[k++] = "--device";
        fa[k++] = g >= 0 ? "cuda" : "cpu";
        for (size_t i = 0; i < pf.n; i++)
            fa[k++] = pf.v[i];
        long pid = 0;
        if (tdm_job_launch(&tr[n], job_dir, fa, k, &pid, &err) != TDM_OK) {
            rc = tdm_cli_fail(TDM_EXIT_FAILURE, "%s", err.message);
            json_decref(jadapters);
            free(rmodel);
            break;
        }
        json_t *av = json_array();
        for (size_t i = 0; i < k; i++)
            json_array_append_new(av, json_string(fa[i]));
        json_t *job = json_pack(
            "{s:i,s:s,s:s,s:s,s:s,s:s,s:o,s:s,s:I,s:o,s:s,s:n,s:o,s:s,s:s*}", "version", 1, "id",
            id, "submission", submission, "kind", "finetune", "submitted", now, "cluster_file",
            cfg.file, "node", tdm_node_to_json(node, cfg.ssh_config), "job_dir", job_dir, "pid",
            (json_int_t)pid, "argv", av, "state", "running", "exit_code", "adapters", jadapters,
            "model", rmodel, "device", g >= 0 ? info[n].gpus[g].uuid : NULL);
        if (!job || tdm_registry_save(regdir, job, &err) != TDM_OK)
            rc = tdm_cli_fail(TDM_EXIT_FAILURE,
                              "job %s started (pid %ld on %s) but not recorded: %s", id, pid,
                              node->name, job ? err.message : "out of memory");
        else
            printf("%s: started job %s (pid %ld, %d adapter(s), log %s/log)\n", node->name, id, pid,
                   plan.adapters_on_node[n], job_dir);
        json_decref(job);
        free(rmodel);
    }
    if (!rc && !stage_only)
        printf("submission %s; follow it with `tandem cluster watch`\n", submission);
out_plan:
    tdm_place_plan_free(&plan);
out:
    for (size_t n = 0; info && n < cfg.n_nodes; n++) {
        tdm_node_state_free(&info[n].state);
        free(info[n].gpus);
    }
    free(info);
    free(pn);
    free(tr);
out_early:
    tdm_run_budget_free(&budget);
    for (size_t a = 0; labels && a < ac.n_adapters; a++)
        free(labels[a]);
    free(labels);
    json_decref(jobs);
    tdm_adapters_config_free(&ac);
    tdm_cluster_config_free(&cfg);
    return rc;
}
