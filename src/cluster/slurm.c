/* slurm.c — batch scripts, sbatch, scontrol/sacct and scancel (slurm.h). */
#include "cluster/slurm.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/shell_quote.h"
#include "cluster/spawn.h"

#define SLURM_CMD_TIMEOUT_MS 60000

const char *tdm_slurm_job_device(const tdm_slurm_config *sl)
{
    if (sl->device == TDM_SLURM_DEVICE_CPU) return "cpu";
    if (sl->device == TDM_SLURM_DEVICE_CUDA) return "cuda";
    return sl->gpus_per_job > 0 ? "cuda" : "cpu";
}

/* ---- the batch script ----------------------------------------------------------------------- */

typedef struct text {
    char *buf;
    size_t len, cap;
    bool nomem;
} text;

static void add(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(text *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || t->nomem) return;
    if (t->len + (size_t)n + 1 > t->cap) {
        size_t cap = (t->cap ? t->cap * 2 : 4096) + (size_t)n;
        char *b = realloc(t->buf, cap);
        if (!b) {
            t->nomem = true;
            return;
        }
        t->buf = b;
        t->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    t->len += (size_t)n;
}

/* A shell-quoted copy kept for the script (freed with the list). */
static const char *q(char **keep, size_t *n, const char *s)
{
    char *r = tdm_shell_quote(s);
    if (r) keep[(*n)++] = r;
    return r ? r : "''";
}

tdm_status tdm_slurm_script(const tdm_slurm_config *sl, const tdm_slurm_job *j, char **out,
                            tdm_error *err)
{
    *out = NULL;
    text t = {0};
    const char *dev = tdm_slurm_job_device(sl);
    add(&t, "#!/bin/sh\n");
    /* several GPUs: `finetune --gpus all` runs one fused process per GPU of the job (the GPUs
     * Slurm gave it: CUDA_VISIBLE_DEVICES), its adapters split by estimated tokens */
    bool multi = sl->gpus_per_job > 1 && !strcmp(dev, "cuda");
    const char *how = multi ? "one fused `tandem finetune` process per GPU (--gpus all)"
                            : "one fused `tandem finetune` process";
    if (j->array_n > 0) {
        add(&t, "# Written by `tandem submit` (docs/cluster.md, \"Slurm\"): tandem jobs %s_0 to "
                "%s_%d as one job array;\n",
            j->id, j->id, j->array_n - 1);
        add(&t, "# task N runs the adapters of %s_N/adapters.toml in %s.\n", j->job_dir, how);
        add(&t, "# Resubmit task N by hand with: sbatch --array=N %s/job.sh\n", j->job_dir);
    } else {
        add(&t, "# Written by `tandem submit` (docs/cluster.md, \"Slurm\"): tandem job %s, %d "
                "adapter(s)\n",
            j->id, j->n_adapters);
        add(&t, "# in %s. Resubmit by hand with: sbatch %s/job.sh\n", how, j->job_dir);
    }
    /* #SBATCH lines are read by sbatch, not the shell: paths go unquoted (the workdir holds no
     * newline; config.c checks), names are Slurm words (checked on parsing). */
    add(&t, "#SBATCH --job-name=tandem-%s\n", j->id);
    if (j->array_n > 0) {
        add(&t, "#SBATCH --array=0-%d\n", j->array_n - 1);
        add(&t, "#SBATCH --output=%s_%%a/log\n", j->job_dir);
    } else {
        add(&t, "#SBATCH --output=%s/log\n", j->job_dir);
    }
    add(&t, "#SBATCH --open-mode=append\n");
    add(&t, "#SBATCH --chdir=%s\n", sl->shared.workdir);
    add(&t, "#SBATCH --requeue\n");
    add(&t, "#SBATCH --signal=B:USR1@%d\n", sl->signal_grace_s);
    add(&t, "#SBATCH --nodes=1\n");
    add(&t, "#SBATCH --ntasks=1\n");
    if (sl->partition) add(&t, "#SBATCH --partition=%s\n", sl->partition);
    if (sl->account) add(&t, "#SBATCH --account=%s\n", sl->account);
    if (sl->qos) add(&t, "#SBATCH --qos=%s\n", sl->qos);
    if (sl->time) add(&t, "#SBATCH --time=%s\n", sl->time);
    if (sl->constraint) add(&t, "#SBATCH --constraint=%s\n", sl->constraint);
    if (sl->gpus_per_job > 0) {
        if (sl->gpu_type) add(&t, "#SBATCH --gres=gpu:%s:%d\n", sl->gpu_type, sl->gpus_per_job);
        else add(&t, "#SBATCH --gres=gpu:%d\n", sl->gpus_per_job);
        if (sl->cpus_per_gpu) add(&t, "#SBATCH --cpus-per-gpu=%d\n", sl->cpus_per_gpu);
        if (sl->mem_per_gpu) add(&t, "#SBATCH --mem-per-gpu=%s\n", sl->mem_per_gpu);
    } else if (j->cpu_mem_mb > 0) {
        add(&t, "#SBATCH --mem=%lldM\n", (long long)j->cpu_mem_mb);
    }
    for (size_t e = 0; e < sl->n_extra; e++)
        add(&t, "#SBATCH %s\n", sl->extra[e]);

    char *keep[128];
    size_t nk = 0;
    const char *jd = q(keep, &nk, j->job_dir);
    if (j->array_n > 0) add(&t, "\nset -u\njob_dir=%s_\"$SLURM_ARRAY_TASK_ID\"\n", jd);
    else add(&t, "\nset -u\njob_dir=%s\n", jd);
    /* an array task's own id: its SLURM_JOB_ID may be the whole array's */
    add(&t, "slurm_id=${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID:-}}\n"
            "slurm_id=${slurm_id:-$SLURM_JOB_ID}\n");
    for (size_t e = 0; e < sl->shared.n_env && nk < 100; e++) {
        const char *kv = sl->shared.env[e];
        const char *eq = strchr(kv, '=');
        add(&t, "export %.*s=%s\n", (int)(eq - kv), kv, q(keep, &nk, eq + 1));
    }
    add(&t, "echo \"== $(date -u +%%Y-%%m-%%dT%%H:%%M:%%SZ) slurm job $slurm_id on "
            "$(hostname), restart ${SLURM_RESTART_COUNT:-0}, CUDA_VISIBLE_DEVICES="
            "${CUDA_VISIBLE_DEVICES:-}\"\n");
    /* --no-join: Slurm gave this job its GPU and memory; joining another job's process would
     * train outside this job's allocation and die with that job. */
    add(&t, "%s finetune %s --adapters-config \"$job_dir/adapters.toml\" --device %s --no-join "
            "--resume%s",
        q(keep, &nk, sl->shared.tandem), q(keep, &nk, j->model_dir), dev,
        multi ? " --gpus all" : "");
    for (size_t i = 0; i < j->n_pass && nk < 126; i++)
        add(&t, " %s", q(keep, &nk, j->pass[i]));
    add(&t, " &\n");
    add(&t,
        "child=$!\n"
        "stopping=0\n"
        "trap 'stopping=1; kill -USR1 \"$child\" 2>/dev/null' USR1\n"
        "trap 'kill -TERM \"$child\" 2>/dev/null' TERM\n"
        "# A trapped signal interrupts wait (status > 128) while the child still exists\n"
        "# (running, or a zombie not yet reaped): wait again for its own status.\n"
        "while :; do\n"
        "    wait \"$child\"; rc=$?\n"
        "    [ \"$rc\" -gt 128 ] && kill -0 \"$child\" 2>/dev/null && continue\n"
        "    break\n"
        "done\n"
        "# `tandem cluster cancel` writes this job's id into $job_dir/cancel before its USR1; a\n"
        "# marker naming another id was left by a cancelled run this script was resubmitted after\n"
        "cancelled=0\n"
        "[ \"$(cat \"$job_dir/cancel\" 2>/dev/null)\" = \"$slurm_id\" ] && cancelled=1\n"
        "if [ \"$stopping\" = 1 ] && [ \"$cancelled\" = 0 ] && [ \"$rc\" = 0 ]; then\n"
        "    echo \"== checkpointed after USR1; requeueing job $slurm_id\"\n"
        "    scontrol requeue \"$slurm_id\" && exit 0\n"
        "    echo \"== scontrol requeue failed; resubmit $job_dir/job.sh to resume\"\n"
        "fi\n"
        "# stopped by `tandem cluster cancel` (after its checkpoint): 143, as a SIGTERM'd finetune\n"
        "if [ \"$stopping\" = 1 ] && [ \"$cancelled\" = 1 ] && [ \"$rc\" = 0 ]; then rc=143; fi\n"
        "echo \"$rc\" >\"$job_dir/exit_code.tmp\" && mv \"$job_dir/exit_code.tmp\" "
        "\"$job_dir/exit_code\"\n"
        "exit \"$rc\"\n");
    for (size_t i = 0; i < nk; i++)
        free(keep[i]);
    if (t.nomem) {
        free(t.buf);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    }
    *out = t.buf;
    return TDM_OK;
}

/* ---- Slurm's commands ----------------------------------------------------------------------- */

static tdm_status run_cmd(const char *const *argv, tdm_spawn_result *res, tdm_error *err)
{
    TDM_TRY(tdm_spawn_run(argv, NULL, 0, SLURM_CMD_TIMEOUT_MS, res, err));
    if (res->exit_code == 127) {
        tdm_spawn_result_free(res);
        return tdm_fail(err, TDM_ERR_UNSUPPORTED,
                        "%s is not on PATH: scheduler: slurm needs Slurm's client commands "
                        "(sbatch, squeue, scontrol, scancel) on this machine",
                        argv[0]);
    }
    return TDM_OK;
}

static void chomp(char *s)
{
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' '))
        s[--n] = 0;
}

tdm_status tdm_slurm_sbatch(const char *script, const char *workdir, char *slurm_id, size_t cap,
                            tdm_error *err)
{
    char chdir_opt[4200];
    snprintf(chdir_opt, sizeof chdir_opt, "--chdir=%s", workdir);
    const char *argv[] = {"sbatch", "--parsable", chdir_opt, script, NULL};
    tdm_spawn_result res;
    TDM_TRY(run_cmd(argv, &res, err));
    tdm_status st = TDM_OK;
    chomp(res.out);
    char *semi = strchr(res.out, ';');
    if (semi) *semi = 0;
    size_t n = strlen(res.out);
    if (res.exit_code != 0 || !n || strspn(res.out, "0123456789") != n || n >= cap) {
        chomp(res.err);
        for (char *c = res.err; *c; c++) /* sbatch's lines, as one message line */
            if (*c == '\n') *c = ' ';
        st = tdm_fail(err, TDM_ERR_IO, "sbatch refused %s (exit %d): %.600s", script,
                      res.exit_code, res.err[0] ? res.err : res.out);
    } else {
        memcpy(slurm_id, res.out, n + 1);
    }
    tdm_spawn_result_free(&res);
    return st;
}

/* The value of KEY= in scontrol's one-line output ("" when absent). */
static void field(const char *line, const char *key, char *out, size_t cap)
{
    out[0] = 0;
    size_t kl = strlen(key);
    for (const char *p = line; (p = strstr(p, key)); p += kl) {
        if ((p != line && p[-1] != ' ') || p[kl] != '=') continue;
        const char *v = p + kl + 1;
        size_t n = strcspn(v, " \n");
        snprintf(out, cap, "%.*s", (int)n, v);
        return;
    }
}

tdm_status tdm_slurm_query(const char *slurm_id, tdm_slurm_state *out, tdm_error *err)
{
    memset(out, 0, sizeof *out);
    out->exit_code = -1;
    const char *argv[] = {"scontrol", "show", "job", "-o", slurm_id, NULL};
    tdm_spawn_result res;
    TDM_TRY(run_cmd(argv, &res, err));
    char v[128];
    if (res.exit_code == 0) {
        field(res.out, "JobState", out->state, sizeof out->state);
        field(res.out, "Reason", out->reason, sizeof out->reason);
        if (!strcmp(out->reason, "None")) out->reason[0] = 0;
        field(res.out, "ExitCode", v, sizeof v);
        if (v[0]) out->exit_code = atoi(v);
        field(res.out, "Restarts", v, sizeof v);
        out->restarts = atoi(v);
        out->known = out->state[0] != 0;
        out->source = "scontrol";
    }
    tdm_spawn_result_free(&res);
    if (out->known) return TDM_OK;
    /* Gone from slurmctld's memory (MinJobAge): accounting, or the jobcomp file, may know. */
    const char *sacct[] = {"sacct", "-n", "-P", "-X", "-j", slurm_id, "-o", "State,ExitCode", NULL};
    if (tdm_spawn_run(sacct, NULL, 0, SLURM_CMD_TIMEOUT_MS, &res, err) != TDM_OK) return TDM_OK;
    if (res.exit_code == 0 && res.out[0]) {
        char *nl = strchr(res.out, '\n');
        if (nl) *nl = 0;
        char *bar = strchr(res.out, '|');
        if (bar) {
            *bar = 0;
            /* "CANCELLED by 0" -> CANCELLED */
            snprintf(out->state, sizeof out->state, "%.*s", (int)strcspn(res.out, " "), res.out);
            out->exit_code = atoi(bar + 1);
            out->known = out->state[0] != 0;
            out->source = "sacct";
        }
    }
    tdm_spawn_result_free(&res);
    return TDM_OK;
}

const char *tdm_slurm_state_to_job_state(const char *s)
{
    static const char *const running[] = {"PENDING",     "RUNNING",    "REQUEUED",
                                          "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING",
                                          "COMPLETING",  "SUSPENDED",  "RESIZING",
                                          "SIGNALING",   "STAGE_OUT",  "RESV_DEL_HOLD"};
    for (size_t i = 0; i < sizeof running / sizeof *running; i++)
        if (!strcmp(s, running[i])) return "running";
    return strcmp(s, "COMPLETED") ? "failed" : "finished";
}

tdm_status tdm_slurm_cancel(const char *slurm_id, const char *sig, tdm_error *err)
{
    char sig_opt[64];
    const char *argv[6];
    size_t k = 0;
    argv[k++] = "scancel";
    if (sig) {
        snprintf(sig_opt, sizeof sig_opt, "--signal=%s", sig);
        argv[k++] = sig_opt;
        argv[k++] = "--batch";
    }
    argv[k++] = slurm_id;
    argv[k] = NULL;
    tdm_spawn_result res;
    TDM_TRY(run_cmd(argv, &res, err));
    tdm_status st = TDM_OK;
    if (res.exit_code != 0) {
        chomp(res.err);
        st = tdm_fail(err, TDM_ERR_IO, "scancel %s failed (exit %d): %.400s", slurm_id,
                      res.exit_code, res.err);
    }
    tdm_spawn_result_free(&res);
    return st;
}
