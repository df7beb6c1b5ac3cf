/* submit_run.c — place, stage and start the adapters of an adapters.toml on cluster nodes
 * (submit_run.h). Moved from `tandem submit` (src/cli/submit.c), which now parses and prints. */
#include "run/submit_run.h"

#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cluster/job.h"
#include "cluster/node_probe.h"
#include "cluster/registry.h"
#include "cluster/slurm.h"
#include "cluster/speed.h"
#include "cluster/stage.h"
#include "cluster/transport.h"
#include "model/config.h"
#include "util/atomic_dir.h"
#include "util/atomic_file.h"
#include "util/mkdir_p.h"
#include "util/timeutil.h"

static void note(const tdm_submit_hooks *h, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void note(const tdm_submit_hooks *h, const char *fmt, ...)
{
    if (!h || !h->note) return;
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    h->note(line, h->user);
}

/* A node's staging or launch failed: the user's input was fine, so never a usage error. */
static tdm_status node_fail(tdm_error *err, const char *node, const char *what)
{
    char msg[sizeof err->message];
    snprintf(msg, sizeof msg, "%s", err->message);
    tdm_status st =
        err->status == TDM_ERR_INVALID || err->status == TDM_OK ? TDM_ERR_IO : err->status;
    return tdm_fail(err, st, "%s: %s%s%s", node, what ? what : "", what ? ": " : "", msg);
}

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
                fprintf(f, "%s\"%s\"", k++ ? ", " : "", tdm_lora_target_name(b));
        fprintf(f, "]\n");
    }
    if (s->has_learning_rate) fprintf(f, "learning_rate = %.17g\n", s->learning_rate);
    if (s->has_epochs) fprintf(f, "epochs = %d\n", s->epochs);
    if (s->has_batch_size) fprintf(f, "batch_size = %d\n", s->batch_size);
    if (s->has_max_seq_len) fprintf(f, "max_seq_len = %d\n", s->max_seq_len);
    if (s->has_weight) toml_float(f, "weight", s->weight);
    if (s->has_lora_dropout) toml_float(f, "lora_dropout", s->lora_dropout);
    if (s->has_seed) fprintf(f, "seed = %" PRIu64 "\n", s->seed);
    if (s->has_grad_accum) fprintf(f, "grad_accum = %d\n", s->grad_accum);
    if (s->has_lr_schedule) fprintf(f, "lr_schedule = \"%s\"\n", tdm_lr_kind_name(s->lr_schedule));
    if (s->has_warmup_steps) fprintf(f, "warmup_steps = %" PRId64 "\n", s->warmup_steps);
    if (s->has_weight_decay) toml_float(f, "weight_decay", s->weight_decay);
    if (s->has_max_grad_norm) toml_float(f, "max_grad_norm", s->max_grad_norm);
    if (s->has_val_split) toml_float(f, "val_split", s->val_split);
    if (s->has_eval_every) fprintf(f, "eval_every = %" PRId64 "\n", s->eval_every);
    if (s->has_save_every) fprintf(f, "save_every = %" PRId64 "\n", s->save_every);
    if (s->has_save_total_limit) fprintf(f, "save_total_limit = %d\n", s->save_total_limit);
    if (s->has_log_every) fprintf(f, "log_every = %" PRId64 "\n", s->log_every);
    if (s->has_task) fprintf(f, "task = \"%s\"\n", s->task);
    if (s->has_chat_template)
        fprintf(f, "chat_template = \"%s\"\n", tdm_chat_template_name(s->chat_template));
    if (s->has_train_on_prompt)
        fprintf(f, "train_on_prompt = %s\n", s->train_on_prompt ? "true" : "false");
    if (s->has_skip_bad_lines)
        fprintf(f, "skip_bad_lines = %s\n", s->skip_bad_lines ? "true" : "false");
    if (s->has_no_shuffle) fprintf(f, "no_shuffle = %s\n", s->no_shuffle ? "true" : "false");
}

static char *resolve(const char *base_dir, const char *path)
{
    size_t n = strlen(base_dir) + strlen(path) + 2;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s/%s", base_dir, path);
    if (s && path[0] == '/') snprintf(s, n, "%s", path);
    return s;
}

/* Labels: the file's, else adapter-N (skipping names the file already uses). NULL when out of
 * memory. */
static char **make_labels(const tdm_adapters_config *ac)
{
    char **labels = calloc(ac->n_adapters ? ac->n_adapters : 1, sizeof *labels);
    for (size_t a = 0; labels && a < ac->n_adapters; a++) {
        if (ac->adapters[a].label) {
            labels[a] = strdup(ac->adapters[a].label);
            continue;
        }
        for (int k = (int)a + 1;; k++) {
            char l[32];
            snprintf(l, sizeof l, "adapter-%d", k);
            bool used = false;
            for (size_t b = 0; b < ac->n_adapters; b++)
                used |= ac->adapters[b].label && !strcmp(ac->adapters[b].label, l);
            if (!used) {
                labels[a] = strdup(l);
                break;
            }
        }
    }
    return labels;
}

/* Everything one submission holds; freed by submission_free. */
typedef struct submission {
    const tdm_submit_request *req;
    const tdm_cluster_config *cfg;
    tdm_adapters_config ac;
    tdm_model_config mc;
    bool have_ac;
    char **labels;
    tdm_run_budget budget;
    char regdir[4096];
    json_t *jobs;             /* the registry */
    tdm_node_state *state;    /* (n_nodes) probed */
    tdm_place_gpu **gpus;     /* (n_nodes) each (state[n].n_gpus) */
    tdm_place_node *pn;       /* (n_nodes) */
    char (*why_no_cuda)[240]; /* (n_nodes) set when a node has GPUs but its tandem has no CUDA */
    tdm_transport *tr;        /* (n_nodes) */
    tdm_place_plan plan;
} submission;

static void submission_free(submission *s)
{
    tdm_place_plan_free(&s->plan);
    for (size_t n = 0; s->state && n < s->cfg->n_nodes; n++)
        tdm_node_state_free(&s->state[n]);
    for (size_t n = 0; s->gpus && n < s->cfg->n_nodes; n++)
        free(s->gpus[n]);
    free(s->state);
    free(s->gpus);
    free(s->pn);
    free(s->why_no_cuda);
    free(s->tr);
    tdm_run_budget_free(&s->budget);
    for (size_t a = 0; s->labels && a < s->ac.n_adapters; a++)
        free(s->labels[a]);
    free(s->labels);
    json_decref(s->jobs);
    if (s->have_ac) tdm_adapters_config_free(&s->ac);
}

/* The adapters.toml and the model's config; init_adapter is refused (not staged yet). */
static tdm_status load_inputs(submission *s, tdm_error *err)
{
    const char *path = s->req->adapters_config;
    tdm_status st = tdm_adapters_config_load(path, &s->ac, err);
    if (st != TDM_OK) return st;
    s->have_ac = true;
    if ((st = tdm_model_config_load(&s->mc, s->req->model_dir, err)) != TDM_OK) return st;
    for (size_t a = 0; a < s->ac.n_adapters; a++)
        if (s->ac.adapters[a].init_adapter)
            return tdm_fail(err, TDM_ERR_INVALID,
                            "%s:%u: init_adapter is not supported by submit yet (copy the "
                            "adapter to the nodes and train there with `tandem finetune`)",
                            path, s->ac.adapters[a].key_line[TDM_ADAPTER_KEY_INIT_ADAPTER]);
    s->labels = make_labels(&s->ac);
    return s->labels ? TDM_OK : tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
}

/* Live state of node n, and what already runs there (the registry's running jobs). */
static void probe_node(submission *s, size_t n)
{
    const tdm_cluster_node *node = &s->cfg->nodes[n];
    tdm_node_state *st = &s->state[n];
    tdm_place_node *pn = &s->pn[n];
    tdm_error e = {0};
    if (tdm_transport_init(&s->tr[n], node, s->cfg->ssh_config, &e) != TDM_OK ||
        tdm_node_probe(&s->tr[n], 30000, st, &e) != TDM_OK) {
        memset(st, 0, sizeof *st);
        st->cuda = -1;
        snprintf(st->reason, sizeof st->reason, "%.500s", e.message);
    }
    if (st->cuda == 0) {
        snprintf(s->why_no_cuda[n], sizeof s->why_no_cuda[n],
                 "has GPUs, but its tandem (%.60s) was built without CUDA (features: %.40s); "
                 "rebuild it with CUDA or set tandem: to one that has it",
                 node->tandem, st->features);
        pn->why_no_cuda = s->why_no_cuda[n];
    }
    pn->name = node->name;
    pn->reachable = st->reachable && st->gpu_ok;
    pn->why_unreachable = st->reason[0] ? st->reason : "no GPU state";
    pn->max_adapters = node->max_adapters;
    pn->cpu_max_params = node->cpu_max_params;
    pn->ram_free_mb = st->ram_available_mb >= 0 ? st->ram_available_mb : node->ram_mb;
    tdm_place_gpu *gpus = s->gpus[n] = calloc(st->n_gpus ? st->n_gpus : 1, sizeof *gpus);
    for (size_t g = 0; gpus && g < st->n_gpus; g++) {
        double speed = 0;
        for (size_t k = 0; k < node->n_gpus; k++)
            if (!strcmp(node->gpus[k].uuid, st->gpus[g].uuid)) {
                speed = node->gpus[k].speed;
                if (!speed && node->gpus[k].type) speed = tdm_gpu_speed_factor(node->gpus[k].type);
            }
        gpus[g] =
            (tdm_place_gpu){.uuid = st->gpus[g].uuid,
                            .name = st->gpus[g].name,
                            .speed = speed > 0 ? speed : tdm_gpu_speed_factor(st->gpus[g].name),
                            .free_mb = st->gpus[g].free_mb};
    }
    pn->gpus = gpus;
    pn->n_gpus = gpus ? st->n_gpus : 0;
    size_t i;
    json_t *j;
    json_array_foreach(s->jobs, i, j)
    {
        const char *jn = json_string_value(json_object_get(json_object_get(j, "node"), "name"));
        const char *js = json_string_value(json_object_get(j, "state"));
        if (jn && js && !strcmp(jn, node->name) && !strcmp(js, "running"))
            pn->active_adapters += (int)json_array_size(json_object_get(j, "adapters"));
    }
}

/* The device of adapter a's process on its node: a GPU index, -1 the CPU. */
static int process_gpu(const submission *s, size_t a)
{
    return s->plan.gpu_of ? s->plan.gpu_of[a] : s->plan.device_of_node[s->plan.node_of[a]];
}

/* Adapters of group n on device g (process_gpu). */
static int process_adapters(const submission *s, size_t n, int g)
{
    int k = 0;
    for (size_t a = 0; a < s->ac.n_adapters; a++)
        k += s->plan.node_of[a] == (int)n && process_gpu(s, a) == g;
    return k;
}

/* Copies the model and the data of the adapters placed in group n (s->plan.node_of) on device g
 * (process_gpu) to node through tr, writes their adapters.toml to job_dir/adapters.toml on the
 * node; *rmodel: the model's path there (malloc'd), *jadapters: the registry's adapter list. */
static tdm_status stage_node(submission *s, const tdm_cluster_node *node, tdm_transport *tr,
                             size_t n, int g, const char *adir, const char *job_dir, char **rmodel,
                             json_t *jadapters, char *remote_toml, size_t cap,
                             tdm_submit_hooks *hooks, tdm_error *err)
{
    tdm_stage_stats ms = {0}, ds = {0};
    if (tdm_stage_model(tr, s->req->model_dir, rmodel, &ms, err) != TDM_OK)
        return node_fail(err, node->name, "copying the model");
    char tmp[64];
    snprintf(tmp, sizeof tmp, "/tmp/tandem-adapters-XXXXXX");
    int fd = mkstemp(tmp);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        if (fd >= 0) close(fd), unlink(tmp);
        return tdm_fail(err, TDM_ERR_IO, "cannot write a temporary file");
    }
    fprintf(f, "# written by tandem submit for node %s from %s\n", node->name,
            s->req->adapters_config);
    tdm_status st = TDM_OK;
    for (size_t a = 0; a < s->ac.n_adapters && st == TDM_OK; a++) {
        if (s->plan.node_of[a] != (int)n || process_gpu(s, a) != g) continue;
        const tdm_adapter_spec *sp = &s->ac.adapters[a];
        char *local = resolve(adir, sp->data), *rdata = NULL;
        char *rout = sp->output[0] == '/' ? strdup(sp->output) : resolve(node->workdir, sp->output);
        if (!local || !rout) {
            st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        } else if (tdm_stage_file(tr, local, &rdata, &ds, err) != TDM_OK) {
            char what[4200];
            snprintf(what, sizeof what, "copying %s", sp->data);
            st = node_fail(err, node->name, what);
        } else {
            write_adapter(f, sp, rdata, rout, s->labels[a]);
            json_array_append_new(jadapters,
                                  json_pack("{s:I,s:s,s:s,s:s,s:n,s:n}", "index", (json_int_t)a,
                                            "label", s->labels[a], "data", rdata, "output", rout,
                                            "metrics", "val_loss"));
        }
        free(local);
        free(rdata);
        free(rout);
    }
    fclose(f);
    note(hooks,
         "%s: model %zu file(s) copied, %zu already there; data %zu copied, %zu already there "
         "(compared by SHA-256)",
         node->name, ms.copied, ms.present, ds.copied, ds.present);
    snprintf(remote_toml, cap, "%s/adapters.toml", job_dir);
    if (st == TDM_OK && tdm_transport_push(tr, tmp, remote_toml, err) != TDM_OK)
        st = node_fail(err, node->name, NULL);
    unlink(tmp);
    return st;
}

/* Starts node n's finetune on device g (a GPU index, -1 the CPU) detached: env
 * CUDA_VISIBLE_DEVICES=UUID TANDEM finetune MODEL --adapters-config TOML --device D [passed
 * flags]; records the job. Takes jadapters. */
static tdm_status launch_node(submission *s, size_t n, int g, const char *id, const char *job_dir,
                              const char *rmodel, const char *remote_toml, json_t *jadapters,
                              const char *submission_id, const char *now, tdm_submit_hooks *hooks,
                              tdm_error *err)
{
    const tdm_cluster_node *node = &s->cfg->nodes[n];
    const char *fa[96];
    size_t k = 0;
    char cvd[160];
    int n_adapters = process_adapters(s, n, g);
    if (s->req->n_pass > 80) {
        json_decref(jadapters);
        return tdm_fail(err, TDM_ERR_INVALID, "too many finetune flags");
    }
    if (g >= 0) {
        snprintf(cvd, sizeof cvd, "CUDA_VISIBLE_DEVICES=%s", s->gpus[n][g].uuid);
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
    for (size_t i = 0; i < s->req->n_pass; i++)
        fa[k++] = s->req->pass_argv[i];
    long pid = 0;
    if (tdm_job_launch(&s->tr[n], job_dir, fa, k, &pid, err) != TDM_OK) {
        json_decref(jadapters);
        return node_fail(err, node->name, NULL);
    }
    json_t *av = json_array();
    for (size_t i = 0; i < k; i++)
        json_array_append_new(av, json_string(fa[i]));
    json_t *job = json_pack(
        "{s:i,s:s,s:s,s:s,s:s,s:s,s:o,s:s,s:I,s:o,s:s,s:n,s:o,s:s,s:s*}", "version", 1, "id", id,
        "submission", submission_id, "kind", "finetune", "submitted", now, "cluster_file",
        s->cfg->file, "node", tdm_node_to_json(node, s->cfg->ssh_config), "job_dir", job_dir, "pid",
        (json_int_t)pid, "argv", av, "state", "running", "exit_code", "adapters", jadapters,
        "model", rmodel, "device", g >= 0 ? s->gpus[n][g].uuid : NULL);
    tdm_status st = TDM_OK;
    if (!job)
        st = tdm_fail(err, TDM_ERR_NOMEM,
                      "job %s started (pid %ld on %s) but not recorded: out "
                      "of memory",
                      id, pid, node->name);
    else if (tdm_registry_save(s->regdir, job, err) != TDM_OK)
        st = tdm_fail(err, err->status, "job %s started (pid %ld on %s) but not recorded: %s", id,
                      pid, node->name, err->message);
    else {
        note(hooks, "%s: started job %s (pid %ld, %d adapter(s) on %s, log %s/log)", node->name, id,
             pid, n_adapters, g >= 0 ? s->gpus[n][g].uuid : "the CPU", job_dir);
        if (hooks->job) {
            tdm_submit_job j = {.id = id,
                                .submission = submission_id,
                                .node = node->name,
                                .job_dir = job_dir,
                                .device = g >= 0 ? s->gpus[n][g].uuid : NULL,
                                .pid = pid,
                                .n_adapters = n_adapters};
            hooks->job(&j, hooks->user);
        }
    }
    json_decref(job);
    return st;
}

/* The directory of the adapters.toml, which its relative data paths are relative to. */
static void adapters_dir(const submission *s, char *adir, size_t cap)
{
    const char *path = s->req->adapters_config;
    const char *slash = strrchr(path, '/');
    snprintf(adir, cap, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    if (slash == path) snprintf(adir, cap, "/");
}

/* Stage (and unless --stage-only, start) every node the plan uses. */
static tdm_status start_nodes(submission *s, tdm_submit_hooks *hooks, tdm_error *err)
{
    char adir[PATH_MAX];
    adapters_dir(s, adir, sizeof adir);
    char submission_id[128], now[32];
    tdm_registry_new_id(NULL, submission_id, sizeof submission_id);
    tdm_format_rfc3339(time(NULL), now, sizeof now);
    tdm_status st = TDM_OK;
    for (size_t n = 0; n < s->cfg->n_nodes && st == TDM_OK; n++) {
        if (!s->plan.adapters_on_node[n]) continue;
        const tdm_cluster_node *node = &s->cfg->nodes[n];
        /* one job per process: per GPU the plan uses on the node (the CPU: g = -1) */
        for (int g = -1; g < (int)s->pn[n].n_gpus && st == TDM_OK; g++) {
            if (!process_adapters(s, n, g)) continue;
            char id[128], job_dir[4096], remote_toml[4200];
            tdm_registry_new_id(node->name, id, sizeof id);
            snprintf(job_dir, sizeof job_dir, "%s/jobs/%s", node->workdir, id);
            char *rmodel = NULL;
            json_t *jadapters = json_array();
            if (!jadapters) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
            st = stage_node(s, node, &s->tr[n], n, g, adir, job_dir, &rmodel, jadapters,
                            remote_toml, sizeof remote_toml, hooks, err);
            if (st != TDM_OK || s->req->stage_only) {
                if (st == TDM_OK)
                    note(hooks, "%s: staged %s (not started: --stage-only)", node->name,
                         remote_toml);
                json_decref(jadapters);
            } else {
                st = launch_node(s, n, g, id, job_dir, rmodel, remote_toml, jadapters,
                                 submission_id, now, hooks, err);
            }
            free(rmodel);
        }
    }
    if (st == TDM_OK && !s->req->stage_only)
        snprintf(hooks->submission, sizeof hooks->submission, "%s", submission_id);
    return st;
}

/* `cluster pull` copies only from inside a node's workdir (tdm_transport_check_remote_path): say
 * so now for an output that will train elsewhere. */
static void note_unpullable(const submission *s, tdm_submit_hooks *hooks)
{
    for (size_t a = 0; a < s->ac.n_adapters; a++) {
        const tdm_cluster_node *node = &s->cfg->nodes[s->plan.node_of[a]];
        const char *o = s->ac.adapters[a].output;
        char *rout = o[0] == '/' ? strdup(o) : resolve(node->workdir, o);
        tdm_error e = {0};
        if (rout && tdm_transport_check_remote_path(node, rout, &e) != TDM_OK)
            note(hooks,
                 "note: adapter %zu (%s) writes %s on %s, outside its workdir %s: `tandem "
                 "cluster pull` will not copy it (copies stay inside the workdir)",
                 a + 1, s->labels[a], rout, node->name, node->workdir);
        free(rout);
    }
}

/* ---- scheduler: slurm ------------------------------------------------------------------------ */

/* Groups the adapters into Slurm jobs with the placement estimate: the most adapters k (at most
 * slurm.max_adapters) whose fused process fits gpu_vram_mb (GPU jobs) makes a job; CPU-only jobs
 * take max_adapters each and ask for their estimate as --mem. Adapters go round-robin over
 * ceil(n / k) jobs, so jobs differ by at most one adapter. Fills s->plan.node_of (the job of
 * each adapter) and adapters_on_node; *k_out: adapters per job at most. */
static tdm_status slurm_group(submission *s, const char *device, size_t *n_jobs, tdm_error *err)
{
    const tdm_slurm_config *sl = &s->cfg->slurm;
    size_t n = s->ac.n_adapters;
    bool gpu = !strcmp(device, "cuda");
    int64_t params = tdm_model_config_param_count(&s->mc);
    if (!gpu && params > sl->cpu_max_params)
        return tdm_fail(err, TDM_ERR_NEVER_FITS,
                        "%s:%u: the model has %lld parameters, more than slurm.cpu_max_params "
                        "(%lld) allows a CPU-only job; ask for GPUs (gpus_per_job: 1) or raise "
                        "cpu_max_params",
                        s->cfg->file, sl->line, (long long)params, (long long)sl->cpu_max_params);
    /* k: adapters per job; on GPUs, k_gpu per GPU (one fused process each: with gpus_per_job
     * > 1 the job's finetune --gpus all splits them) */
    size_t k = 0, per_job = (size_t)sl->max_adapters;
    for (size_t c = 1; c <= n && c <= per_job; c++)
        if (!gpu || s->budget.gpu_mb[c] <= sl->gpu_vram_mb) k = c;
    if (gpu && k && sl->gpus_per_job > 1) {
        k *= (size_t)sl->gpus_per_job;
        if (k > per_job) k = per_job;
        if (k > n) k = n;
    }
    if (!k)
        return tdm_fail(err, TDM_ERR_NEVER_FITS,
                        "one adapter needs %lld MiB of GPU memory (the --vram auto estimate), "
                        "more than slurm.gpu_vram_mb %lld of %s:%u; lower batch_size or "
                        "max_seq_len, pass --grad-checkpoint, or ask for larger GPUs",
                        (long long)s->budget.gpu_mb[1], (long long)sl->gpu_vram_mb, s->cfg->file,
                        sl->line);
    *n_jobs = (n + k - 1) / k;
    s->plan.n_adapters = n;
    s->plan.n_nodes = *n_jobs;
    s->plan.node_of = calloc(n ? n : 1, sizeof *s->plan.node_of);
    s->plan.adapters_on_node = calloc(*n_jobs ? *n_jobs : 1, sizeof *s->plan.adapters_on_node);
    s->plan.device_of_node = calloc(*n_jobs ? *n_jobs : 1, sizeof *s->plan.device_of_node);
    if (!s->plan.node_of || !s->plan.adapters_on_node || !s->plan.device_of_node)
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    for (size_t a = 0; a < n; a++) {
        s->plan.node_of[a] = (int)(a % *n_jobs);
        s->plan.adapters_on_node[a % *n_jobs]++;
    }
    for (size_t j = 0; j < *n_jobs; j++)
        s->plan.device_of_node[j] = gpu ? 0 : -1;
    return TDM_OK;
}

static void slurm_note_plan(const submission *s, size_t n_jobs, const char *device,
                            tdm_submit_hooks *hooks)
{
    const tdm_slurm_config *sl = &s->cfg->slurm;
    for (size_t j = 0; j < n_jobs; j++) {
        char names[1024];
        size_t used = 0;
        names[0] = 0;
        for (size_t a = 0; a < s->ac.n_adapters; a++)
            if (s->plan.node_of[a] == (int)j && used < sizeof names)
                used += (size_t)snprintf(names + used, sizeof names - used, "%s%s",
                                         used ? ", " : "", s->labels[a]);
        int k = s->plan.adapters_on_node[j];
        bool gpu = !strcmp(device, "cuda");
        int g = sl->gpus_per_job > 1 ? sl->gpus_per_job : 1;
        int per_gpu = (k + g - 1) / g; /* the most on one GPU when the split is even */
        if (gpu)
            note(hooks,
                 "slurm job %zu of %zu: %s (%d adapter(s), --device cuda%s, --gres=gpu:%s%s%d, "
                 "plan %lld MiB of gpu_vram_mb %lld%s)",
                 j + 1, n_jobs, names, k, g > 1 ? " --gpus all" : "",
                 sl->gpu_type ? sl->gpu_type : "", sl->gpu_type ? ":" : "", g,
                 (long long)s->budget.gpu_mb[per_gpu], (long long)sl->gpu_vram_mb,
                 g > 1 ? " per GPU" : "");
        else
            note(hooks, "slurm job %zu of %zu: %s (%d adapter(s), --device cpu%s, --mem=%lldM)",
                 j + 1, n_jobs, names, k, sl->gpus_per_job ? " on a GPU job (slurm.device cpu)" : "",
                 (long long)s->budget.cpu_mb[k]);
    }
}

/* The batch script's inputs for plan job j: a job array of array_n tasks when array_n > 0. */
static tdm_slurm_job slurm_job_of(const submission *s, size_t j, const char *id,
                                  const char *job_dir, const char *model, int array_n)
{
    const tdm_slurm_config *sl = &s->cfg->slurm;
    int k = s->plan.adapters_on_node[j];
    return (tdm_slurm_job){.id = id,
                           .job_dir = job_dir,
                           .model_dir = model,
                           .n_adapters = k,
                           .array_n = array_n,
                           .cpu_mem_mb = sl->gpus_per_job ? 0 : s->budget.cpu_mb[k],
                           .pass = s->req->pass_argv,
                           .n_pass = s->req->n_pass};
}

/* Which plan jobs go as one job array: those whose array scripts are the same text (so they
 * differ only by the task index; a CPU job of another adapter count asks for another --mem and
 * stays apart). group[j] = the first job of j's group; slurm.array false: each job alone. */
static tdm_status slurm_arrays(const submission *s, size_t n_jobs, size_t *group, tdm_error *err)
{
    char **text = calloc(n_jobs ? n_jobs : 1, sizeof *text);
    if (!text) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    tdm_status st = TDM_OK;
    for (size_t j = 0; j < n_jobs && st == TDM_OK; j++) {
        group[j] = j;
        if (!s->cfg->slurm.array) continue;
        tdm_slurm_job sj = slurm_job_of(s, j, "ID", "DIR", "MODEL", 2);
        st = tdm_slurm_script(&s->cfg->slurm, &sj, &text[j], err);
        for (size_t i = 0; i < j && st == TDM_OK; i++)
            if (group[i] == i && !strcmp(text[i], text[j])) {
                group[j] = i;
                break;
            }
    }
    for (size_t j = 0; j < n_jobs; j++)
        free(text[j]);
    free(text);
    return st;
}

static tdm_status slurm_record(const submission *s, const char *id, const char *job_dir,
                               const char *slurm_id, const char *rmodel, const char *script,
                               json_t *jadapters, const char *submission_id, const char *now,
                               tdm_error *err)
{
    const tdm_cluster_node *shared = &s->cfg->slurm.shared;
    json_t *job = json_pack(
        "{s:i,s:s,s:s,s:s,s:s,s:s,s:o,s:s,s:i,s:[ss],s:s,s:n,s:o,s:s,s:s,s:s,s:s}", "version", 1,
        "id", id, "submission", submission_id, "kind", "finetune", "submitted", now,
        "cluster_file", s->cfg->file, "node", tdm_node_to_json(shared, NULL), "job_dir", job_dir,
        "pid", 0, "argv", "sbatch", script, "state", "running", "exit_code", "adapters",
        jadapters, "model", rmodel, "scheduler", "slurm", "slurm_job_id", slurm_id,
        "slurm_state", "PENDING");
    if (!job)
        return tdm_fail(err, TDM_ERR_NOMEM, "slurm job %s submitted but not recorded: out of "
                        "memory", slurm_id);
    tdm_status st = tdm_registry_save(s->regdir, job, err);
    if (st != TDM_OK)
        st = tdm_fail(err, err->status, "slurm job %s submitted but not recorded: %s", slurm_id,
                      err->message);
    json_decref(job);
    return st;
}

/* One sbatch call: the plan jobs members[0..c) (c > 1: one job array, task i = members[i]).
 * Stages each job's adapters into its directory, writes the script, submits, records each job
 * (an array task: tandem job ID_i, Slurm job ARRAYID_i). */
static tdm_status slurm_submit_group(submission *s, tdm_transport *tr, const size_t *members,
                                     size_t c, const char *adir, const char *submission_id,
                                     const char *now, tdm_submit_hooks *hooks, tdm_error *err)
{
    const tdm_slurm_config *sl = &s->cfg->slurm;
    int array_n = c > 1 ? (int)c : 0;
    char id[128], dir[4096], script[4200], slurm_id[64];
    tdm_registry_new_id("slurm", id, sizeof id);
    snprintf(dir, sizeof dir, "%s/jobs/%s", sl->shared.workdir, id);
    snprintf(script, sizeof script, "%s/job.sh", dir);
    char *text = NULL;
    if (s->req->dry_run) {
        /* Nothing is copied or written: the script names where the model would be. */
        char model[4200];
        snprintf(model, sizeof model, "%s/models/<sha256 of %s>", sl->shared.workdir,
                 s->req->model_dir);
        tdm_slurm_job sj = slurm_job_of(s, members[0], id, dir, model, array_n);
        TDM_TRY(tdm_slurm_script(sl, &sj, &text, err));
        hooks->script(script, text, hooks->user);
        free(text);
        return TDM_OK;
    }
    char (*task_id)[160] = calloc(c, sizeof *task_id);
    char (*task_dir)[4200] = calloc(c, sizeof *task_dir);
    json_t **jad = calloc(c, sizeof *jad);
    char *rmodel = NULL;
    tdm_status st = task_id && task_dir && jad ? TDM_OK
                                               : tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < c && st == TDM_OK; i++) {
        char remote_toml[4300];
        snprintf(task_id[i], sizeof task_id[i], array_n ? "%s_%zu" : "%s", id, i);
        snprintf(task_dir[i], sizeof task_dir[i], array_n ? "%s_%zu" : "%s", dir, i);
        free(rmodel);
        rmodel = NULL;
        if (!(jad[i] = json_array())) st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        else
            st = stage_node(s, &sl->shared, tr, members[i], s->plan.device_of_node[members[i]],
                            adir, task_dir[i], &rmodel, jad[i], remote_toml, sizeof remote_toml,
                            hooks, err);
    }
    if (st == TDM_OK && array_n) st = tdm_mkdir_p(dir, 0755, err);
    if (st == TDM_OK) {
        tdm_slurm_job sj = slurm_job_of(s, members[0], id, dir, rmodel, array_n);
        st = tdm_slurm_script(sl, &sj, &text, err);
    }
    if (st == TDM_OK) st = tdm_atomic_write(script, text, strlen(text), 0755, err);
    if (st == TDM_OK && s->req->stage_only) {
        note(hooks, "slurm: staged %s (not submitted: --stage-only)", script);
    } else if (st == TDM_OK && (st = tdm_slurm_sbatch(script, sl->shared.workdir, slurm_id,
                                                      sizeof slurm_id, err)) != TDM_OK) {
        /* sbatch refused the script (a partition, account or time the cluster does not have):
         * nothing was queued, so nothing of this job is kept (the content-addressed model and
         * data stay for the next try), and the message points at the settings to fix */
        for (size_t i = 0; i < c; i++)
            tdm_atomic_dir_abort(task_dir[i]);
        if (array_n) tdm_atomic_dir_abort(dir);
        size_t l = strlen(err->message);
        snprintf(err->message + l, sizeof err->message - l,
                 "; nothing was queued: check the slurm: block of %s (line %u: partition, "
                 "account, qos, time, gpu_type, constraint, extra)",
                 s->cfg->file, sl->line);
    } else if (st == TDM_OK) {
        if (array_n)
            note(hooks, "slurm: jobs %s_0 to %s_%d went as one sbatch --array=0-%d: Slurm job "
                        "array %s (%s)",
                 id, id, array_n - 1, array_n - 1, slurm_id, script);
        for (size_t i = 0; i < c && st == TDM_OK; i++) {
            char sid[96];
            snprintf(sid, sizeof sid, array_n ? "%s_%zu" : "%s", slurm_id, i);
            st = slurm_record(s, task_id[i], task_dir[i], sid, rmodel, script, jad[i],
                              submission_id, now, err);
            jad[i] = NULL;
            if (st != TDM_OK) break;
            int k = s->plan.adapters_on_node[members[i]];
            note(hooks, "slurm: submitted job %s as Slurm job %s (%d adapter(s), log %s/log)",
                 task_id[i], sid, k, task_dir[i]);
            tdm_submit_job sj = {.id = task_id[i],
                                 .submission = submission_id,
                                 .node = "slurm",
                                 .job_dir = task_dir[i],
                                 .device = NULL,
                                 .pid = 0,
                                 .n_adapters = k};
            if (hooks->job) hooks->job(&sj, hooks->user);
        }
    }
    for (size_t i = 0; jad && i < c; i++)
        json_decref(jad[i]);
    free(jad);
    free(task_id);
    free(task_dir);
    free(text);
    free(rmodel);
    return st;
}

/* Stage into the shared workdir, write each job's adapters.toml and job.sh, sbatch each job, or
 * each job array of jobs whose scripts differ only by index. */
static tdm_status slurm_submit(submission *s, tdm_submit_hooks *hooks, tdm_error *err)
{
    const tdm_slurm_config *sl = &s->cfg->slurm;
    const char *device = tdm_slurm_job_device(sl);
    size_t n_jobs = 0;
    TDM_TRY(slurm_group(s, device, &n_jobs, err));
    slurm_note_plan(s, n_jobs, device, hooks);
    size_t *group = calloc(n_jobs ? n_jobs : 1, sizeof *group);
    size_t *members = calloc(n_jobs ? n_jobs : 1, sizeof *members);
    tdm_status st = group && members ? slurm_arrays(s, n_jobs, group, err)
                                     : tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    tdm_transport tr;
    bool tr_ok = false;
    if (st == TDM_OK && !(s->req->dry_run && !hooks->script)) {
        st = tdm_transport_init(&tr, &sl->shared, NULL, err);
        tr_ok = st == TDM_OK;
    }
    char adir[PATH_MAX];
    adapters_dir(s, adir, sizeof adir);
    char submission_id[128], now[32];
    tdm_registry_new_id(NULL, submission_id, sizeof submission_id);
    tdm_format_rfc3339(time(NULL), now, sizeof now);
    for (size_t g = 0; tr_ok && g < n_jobs && st == TDM_OK; g++) {
        if (group[g] != g) continue;
        size_t c = 0;
        for (size_t j = g; j < n_jobs; j++)
            if (group[j] == g) members[c++] = j;
        if (c > 1)
            note(hooks, "slurm jobs %zu to %zu of %zu: one job array of %zu tasks (their batch "
                        "scripts differ only by the task index)",
                 g + 1, members[c - 1] + 1, n_jobs, c);
        st = slurm_submit_group(s, &tr, members, c, adir, submission_id, now, hooks, err);
    }
    free(group);
    free(members);
    if (st == TDM_OK && tr_ok && !s->req->stage_only && !s->req->dry_run)
        snprintf(hooks->submission, sizeof hooks->submission, "%s", submission_id);
    return st;
}

tdm_status tdm_run_submit(const tdm_submit_request *req, tdm_submit_hooks *hooks, tdm_error *err)
{
    submission s = {.req = req, .cfg = req->cluster};
    hooks->submission[0] = 0;
    size_t nn = s.cfg->n_nodes;
    tdm_status st = load_inputs(&s, err);
    /* The memory each node's finetune process will reserve (the --vram auto estimate). */
    if (st == TDM_OK) st = tdm_run_placement_budget(&s.mc, req->opts, &s.ac, &s.budget, err);
    if (st == TDM_OK && ((st = tdm_registry_dir(s.regdir, sizeof s.regdir, err)) != TDM_OK ||
                         (st = tdm_registry_load(s.regdir, &s.jobs, err)) != TDM_OK))
        goto out;
    if (st != TDM_OK) goto out;
    if (s.cfg->scheduler == TDM_SCHEDULER_SLURM) {
        st = slurm_submit(&s, hooks, err);
        goto out;
    }
    s.state = calloc(nn ? nn : 1, sizeof *s.state);
    s.gpus = calloc(nn ? nn : 1, sizeof *s.gpus);
    s.pn = calloc(nn ? nn : 1, sizeof *s.pn);
    s.tr = calloc(nn ? nn : 1, sizeof *s.tr);
    s.why_no_cuda = calloc(nn ? nn : 1, sizeof *s.why_no_cuda);
    if (!s.state || !s.gpus || !s.pn || !s.tr || !s.why_no_cuda) {
        st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (size_t n = 0; n < nn; n++)
        probe_node(&s, n);
    st = tdm_place(s.pn, nn, s.ac.n_adapters, &s.budget.place, tdm_model_config_param_count(&s.mc),
                   &s.plan, err);
    if (s.plan.node_of && hooks->plan) {
        tdm_submit_plan view = {.cluster = s.cfg,
                                .nodes = s.pn,
                                .adapters = &s.ac,
                                .labels = s.labels,
                                .plan = &s.plan,
                                .budget = &s.budget,
                                .model_params = tdm_model_config_param_count(&s.mc)};
        hooks->plan(&view, hooks->user);
    }
    if (st == TDM_OK) note_unpullable(&s, hooks);
    if (st == TDM_OK && !req->dry_run) st = start_nodes(&s, hooks, err);
out:
    submission_free(&s);
    return st;
}
