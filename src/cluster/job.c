/* job.c — the detached-launch wrapper and the poll script (fixed sh text; every variable part
 * arrives as a quoted positional argument). */
#include "cluster/job.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* $1 job dir, $2 workdir, then the command. The inner wrapper records "PID STARTTIME", runs the
 * command as its child and records the exit code (temp file + mv, so readers never see half). */
static const char launch_script[] =
    "d=$1; w=$2; shift 2\n"
    "[ -e \"$d/pid\" ] && { echo \"job directory $d is already in use\" >&2; exit 90; }\n"
    "mkdir -p -- \"$d\" || exit 91\n"
    "cd -- \"$w\" || exit 92\n"
    "setsid sh -c '"
    "d=$1; shift; "
    "echo \"$$ $(cut -d\" \" -f22 /proc/$$/stat)\" > \"$d/pid.tmp\" && mv -f -- \"$d/pid.tmp\" "
    "\"$d/pid\"; "
    "\"$@\"; c=$?; "
    "echo \"$c\" > \"$d/exit_code.tmp\" && mv -f -- \"$d/exit_code.tmp\" \"$d/exit_code\"; "
    "exit \"$c\"' tandem-job \"$d\" \"$@\" < /dev/null > \"$d/log\" 2>&1 &\n"
    "i=0\n"
    "while [ ! -s \"$d/pid\" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done\n"
    "[ -s \"$d/pid\" ] || { echo \"the job did not start (no pid file)\" >&2; exit 93; }\n"
    "cut -d' ' -f1 \"$d/pid\"\n";

/* $1 job dir, then files to print. Alive is decided before the exit code is read: a job that
 * ends between the two reads is seen as ended with its code. */
static const char poll_script[] =
    "d=$1; shift\n"
    "alive=0; p=0\n"
    "if [ -r \"$d/pid\" ]; then read p s < \"$d/pid\"\n"
    "  if [ -r /proc/$p/stat ] && [ \"$(cut -d' ' -f22 /proc/$p/stat 2>/dev/null)\" = \"$s\" ]; "
    "then alive=1; fi\n"
    "fi\n"
    "echo \"pid=$p\"; echo \"alive=$alive\"\n"
    "if [ -r \"$d/exit_code\" ]; then echo \"exit_code=$(cat \"$d/exit_code\")\"; fi\n"
    "echo @@log; tail -n " "20" " -- \"$d/log\" 2>/dev/null | tr -d '\\000'; echo; echo @@endlog\n"
    "for f in \"$@\"; do if [ -r \"$f\" ]; then echo @@file; tr -d '\\000' < \"$f\"; echo; "
    "else echo @@nofile; fi; done\n"
    "echo @@end\n";

const char *tdm_job_state_str(tdm_job_state s)
{
    switch (s) {
    case TDM_JOB_RUNNING: return "running";
    case TDM_JOB_FINISHED: return "finished";
    case TDM_JOB_FAILED: return "failed";
    default: return "unknown";
    }
}

tdm_job_state tdm_job_state_parse(const char *s)
{
    if (!s)
        return TDM_JOB_UNKNOWN;
    if (!strcmp(s, "running"))
        return TDM_JOB_RUNNING;
    if (!strcmp(s, "finished"))
        return TDM_JOB_FINISHED;
    if (!strcmp(s, "failed"))
        return TDM_JOB_FAILED;
    return TDM_JOB_UNKNOWN;
}

tdm_status tdm_job_launch(tdm_transport *t, const char *job_dir, const char *const *argv,
                          size_t argc, long *pid, tdm_error *err)
{
    *pid = 0;
    const char **full = calloc(argc + 6, sizeof *full);
    if (!full)
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    full[0] = "sh";
    full[1] = "-c";
    full[2] = launch_script;
    full[3] = "tandem-launch";
    full[4] = job_dir;
    full[5] = t->node->workdir;
    memcpy(full + 6, argv, argc * sizeof *argv);
    tdm_spawn_result res;
    tdm_status st = tdm_transport_run(t, full, argc + 6, NULL, 0, 60000, &res, err);
    free(full);
    if (st != TDM_OK)
        return st;
    char why[512];
    if (tdm_transport_unreachable(t, &res, why, sizeof why)) {
        st = tdm_fail(err, TDM_ERR_IO, "node %s is unreachable: %s", t->node->name, why);
    } else if (res.exit_code != 0) {
        const char *tail = tdm_text_tail(res.err, res.err_len, 3);
        st = tdm_fail(err, TDM_ERR_IO, "starting the job on %s failed (exit %d): %.400s",
                      t->node->name, res.exit_code, tail);
    } else {
        *pid = atol(res.out);
        if (*pid <= 0)
            st = tdm_fail(err, TDM_ERR_IO, "starting the job on %s gave no pid", t->node->name);
    }
    tdm_spawn_result_free(&res);
    return st;
}

static char *between(const char *start, const char *end)
{
    return strndup(start, (size_t)(end - start));
}

tdm_status tdm_job_poll_once(tdm_transport *t, const char *job_dir, const char *const *files,
                             size_t n_files, tdm_job_poll *out, tdm_error *err)
{
    memset(out, 0, sizeof *out);
    out->exit_code = -1;
    out->state = TDM_JOB_UNKNOWN;
    out->files = calloc(n_files ? n_files : 1, sizeof *out->files);
    if (!out->files)
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    out->n_files = n_files;
    const char **full = calloc(n_files + 5, sizeof *full);
    if (!full)
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    full[0] = "sh";
    full[1] = "-c";
    full[2] = poll_script;
    full[3] = "tandem-poll";
    full[4] = job_dir;
    if (n_files) memcpy(full + 5, files, n_files * sizeof *files); /* files may be NULL */
    tdm_spawn_result res;
    tdm_status st = tdm_transport_run(t, full, n_files + 5, NULL, 0, 60000, &res, err);
    free(full);
    if (st != TDM_OK)
        return st;
    if (tdm_transport_unreachable(t, &res, out->why, sizeof out->why)) {
        tdm_spawn_result_free(&res);
        return TDM_OK;
    }
    const char *log = strstr(res.out, "@@log\n");
    const char *endlog = log ? strstr(log, "\n@@endlog\n") : NULL;
    /* The end marker is searched after the log block: "\n@@end" is also a prefix of
     * "\n@@endlog", and taking that one would silently drop every file. */
    const char *end = endlog ? strstr(endlog + 1, "\n@@end\n") : NULL;
    if (!end || !log || !endlog) {
        snprintf(out->why, sizeof out->why, "the node's answer was incomplete (exit %d): %.300s",
                 res.exit_code, tdm_text_tail(res.err, res.err_len, 1));
        tdm_spawn_result_free(&res);
        return TDM_OK;
    }
    bool alive = strstr(res.out, "alive=1\n") != NULL;
    const char *pid = strstr(res.out, "pid=");
    out->pid = pid ? atol(pid + 4) : 0;
    const char *ec = strstr(res.out, "exit_code=");
    if (ec && ec < log)
        out->exit_code = atoi(ec + 10);
    out->log_tail = between(log + 6, endlog);
    /* the "echo" after tail added one newline; drop it */
    size_t ll = out->log_tail ? strlen(out->log_tail) : 0;
    if (ll && out->log_tail[ll - 1] == '\n')
        out->log_tail[ll - 1] = '\0';
    const char *p = endlog + strlen("\n@@endlog\n");
    for (size_t i = 0; i < n_files && p < end; i++) {
        if (!strncmp(p, "@@nofile\n", 9)) {
            p += 9;
            continue;
        }
        if (strncmp(p, "@@file\n", 7) != 0)
            break;
        p += 7;
        const char *next = strstr(p, "\n@@");
        if (!next)
            break;
        out->files[i] = between(p, next);
        p = next + 1;
    }
    if (ec && ec < log) {
        out->state = out->exit_code == 0 ? TDM_JOB_FINISHED : TDM_JOB_FAILED;
        if (out->exit_code != 0)
            snprintf(out->why, sizeof out->why, "exited with code %d", out->exit_code);
    } else if (alive) {
        out->state = TDM_JOB_RUNNING;
    } else {
        out->state = TDM_JOB_FAILED;
        if (out->pid)
            snprintf(out->why, sizeof out->why,
                     "process %ld is gone and left no exit code (killed?)", out->pid);
        else
            snprintf(out->why, sizeof out->why, "the job never started (no pid file)");
    }
    tdm_spawn_result_free(&res);
    return TDM_OK;
}

void tdm_job_poll_free(tdm_job_poll *p)
{
    free(p->log_tail);
    for (size_t i = 0; i < p->n_files; i++)
        free(p->files[i]);
    free(p->files);
    memset(p, 0, sizeof *p);
}

/* $1 job dir, $2 byte offset. Liveness first, then the log from the offset (at most
 * TDM_JOB_LOG_CHUNK bytes): a job seen ended has written everything it will. */
static const char log_script[] =
    "d=$1; off=$2\n"
    "[ -d \"$d\" ] || { echo \"no job directory $d\" >&2; exit 3; }\n"
    "alive=0\n"
    "if [ -r \"$d/pid\" ]; then read p s < \"$d/pid\"\n"
    "  if [ -r /proc/$p/stat ] && [ \"$(cut -d' ' -f22 /proc/$p/stat 2>/dev/null)\" = \"$s\" ]; "
    "then alive=1; fi\n"
    "fi\n"
    "echo \"$alive\"\n"
    "[ -e \"$d/log\" ] || exit 0\n"
    "tail -c +$((off + 1)) -- \"$d/log\" | head -c " TDM_JOB_LOG_CHUNK_TEXT "\n";

/* $1 job dir, $2 signal name. Signals the wrapper's children (the job's command), never the
 * wrapper itself: it stays to record the command's exit code. */
static const char signal_script[] =
    "d=$1; sig=$2\n"
    "[ -r \"$d/pid\" ] || { echo \"no pid file in $d: the job never started\" >&2; exit 3; }\n"
    "read p s < \"$d/pid\"\n"
    "[ \"$(cut -d' ' -f22 /proc/$p/stat 2>/dev/null)\" = \"$s\" ] || exit 4\n"
    "kids=$(cat /proc/[0-9]*/stat 2>/dev/null | "
    "awk -v p=\"$p\" '{ pid = $1; sub(/^.*\\) /, \"\"); if ($2 == p) print pid }')\n"
    "[ -n \"$kids\" ] || { echo \"no command process under the job's wrapper $p\" >&2; exit 5; }\n"
    "kill -s \"$sig\" $kids || exit 6\n"
    "echo $kids\n";

/* Runs script with its positional arguments (at most 4) on the node; an unreachable node is an
 * error naming it; the script's own exit code is the caller's to read in *res. */
static tdm_status run_script(tdm_transport *t, const char *script, const char *name,
                             const char *const *args, size_t n_args, tdm_spawn_result *res,
                             tdm_error *err)
{
    const char *full[8];
    full[0] = "sh";
    full[1] = "-c";
    full[2] = script;
    full[3] = name;
    for (size_t i = 0; i < n_args && i < 4; i++)
        full[4 + i] = args[i];
    tdm_status st = tdm_transport_run(t, full, 4 + n_args, NULL, 0, 60000, res, err);
    if (st != TDM_OK) return st;
    char why[512];
    if (tdm_transport_unreachable(t, res, why, sizeof why)) {
        tdm_spawn_result_free(res);
        return tdm_fail(err, TDM_ERR_IO, "node %s is unreachable: %s", t->node->name, why);
    }
    return TDM_OK;
}

tdm_status tdm_job_log_read(tdm_transport *t, const char *job_dir, int64_t offset, char **out,
                            size_t *len, bool *alive, tdm_error *err)
{
    *out = NULL;
    *len = 0;
    *alive = false;
    char off[32];
    snprintf(off, sizeof off, "%lld", (long long)(offset > 0 ? offset : 0));
    const char *args[] = {job_dir, off};
    tdm_spawn_result res;
    tdm_status st = run_script(t, log_script, "tandem-log", args, 2, &res, err);
    if (st != TDM_OK) return st;
    const char *nl = memchr(res.out, '\n', res.out_len);
    if (res.exit_code != 0 || !nl) {
        st = tdm_fail(err, TDM_ERR_IO, "reading the log of %s on %s failed (exit %d): %.300s",
                      job_dir, t->node->name, res.exit_code,
                      tdm_text_tail(res.err, res.err_len, 1));
    } else {
        *alive = res.out[0] == '1';
        size_t n = res.out_len - (size_t)(nl + 1 - res.out);
        *out = malloc(n + 1);
        if (!*out) {
            st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        } else {
            memcpy(*out, nl + 1, n);
            (*out)[n] = 0;
            *len = n;
        }
    }
    tdm_spawn_result_free(&res);
    return st;
}

tdm_status tdm_job_signal(tdm_transport *t, const char *job_dir, const char *sig, char *pids,
                          size_t pids_size, tdm_error *err)
{
    if (pids_size) pids[0] = 0;
    const char *args[] = {job_dir, sig};
    tdm_spawn_result res;
    tdm_status st = run_script(t, signal_script, "tandem-signal", args, 2, &res, err);
    if (st != TDM_OK) return st;
    if (res.exit_code == 4) {
        st = tdm_fail(err, TDM_ERR_NOT_FOUND, "the job in %s on %s is not running", job_dir,
                      t->node->name);
    } else if (res.exit_code != 0) {
        st = tdm_fail(err, TDM_ERR_IO, "signalling the job in %s on %s failed (exit %d): %.300s",
                      job_dir, t->node->name, res.exit_code,
                      tdm_text_tail(res.err, res.err_len, 1));
    } else if (pids_size) {
        snprintf(pids, pids_size, "%.*s", (int)strcspn(res.out, "\n"), res.out);
    }
    tdm_spawn_result_free(&res);
    return st;
}
