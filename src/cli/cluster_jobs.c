/* tandem cluster logs|cancel — one job of the registry: its log (followed while it runs), and
 * stopping it through the graceful signal, so a finetune checkpoints first (docs/cluster.md). */
#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "cli/cluster_common.h"
#include "cluster/cluster_config.h"
#include "cluster/coordinator.h"
#include "cluster/job.h"
#include "cluster/registry.h"
#include "cluster/slurm.h"
#include "cluster/transport.h"
#include "util/atomic_file.h"
#include "util/timeutil.h"

/* The registry record of job id (a new reference) and its node, connected; an exit code other
 * than 0 (printed) when there is none or the node's settings are damaged. */
typedef struct job_ref {
    json_t *job;
    char dir[4096]; /* the registry */
    tdm_cluster_node node;
    char *ssh_config;
    tdm_transport t;
    const char *job_dir;
} job_ref;

static int job_open(const char *id, job_ref *r)
{
    memset(r, 0, sizeof *r);
    tdm_error err = {0};
    json_t *jobs = NULL;
    if (tdm_registry_dir(r->dir, sizeof r->dir, &err) != TDM_OK ||
        tdm_registry_load(r->dir, &jobs, &err) != TDM_OK)
        return tdm_cli_fail_err(&err);
    size_t i;
    json_t *j;
    json_array_foreach(jobs, i, j)
    {
        const char *jid = json_string_value(json_object_get(j, "id"));
        if (jid && !strcmp(jid, id)) r->job = json_incref(j);
    }
    json_decref(jobs);
    if (!r->job)
        return tdm_cli_fail(TDM_EXIT_USAGE,
                            "no job '%s' in the registry %s (`tandem cluster status` lists the "
                            "jobs; `tandem submit --json` prints the ids it starts)",
                            id, r->dir);
    r->job_dir = json_string_value(json_object_get(r->job, "job_dir"));
    if (!r->job_dir ||
        tdm_node_from_json(json_object_get(r->job, "node"), &r->node, &r->ssh_config, &err) !=
            TDM_OK ||
        tdm_transport_init(&r->t, &r->node, r->ssh_config, &err) != TDM_OK) {
        int rc = tdm_cli_fail(TDM_EXIT_FAILURE, "job %s: %s", id,
                              r->job_dir ? err.message : "record without job_dir");
        json_decref(r->job);
        r->job = NULL;
        return rc;
    }
    return TDM_EXIT_OK;
}

static void job_close(job_ref *r)
{
    if (!r->job) return;
    tdm_cluster_node_free(&r->node);
    free(r->ssh_config);
    json_decref(r->job);
    r->job = NULL;
}

/* Polls the job once and saves what changed in the registry (as `cluster watch` does). */
static void job_refresh(job_ref *r)
{
    bool changed = false;
    tdm_error e = {0};
    if (tdm_coord_refresh(r->job, &changed, &e) != TDM_OK)
        fprintf(stderr, "tandem: job %s: %s\n", json_string_value(json_object_get(r->job, "id")),
                e.message);
    else if (changed && tdm_registry_save(r->dir, r->job, &e) != TDM_OK)
        fprintf(stderr, "tandem: job %s: %s\n", json_string_value(json_object_get(r->job, "id")),
                e.message);
}

static volatile sig_atomic_t interrupted;

static void on_interrupt(int sig)
{
    (void)sig;
    interrupted = 1;
}

static void sleep_interruptible(double seconds)
{
    for (int64_t slept = 0; slept < (int64_t)(seconds * 1000) && !interrupted; slept += 50)
        tdm_sleep_ms(50);
}

/* ---------------------------------------------------------------- logs */

static const char logs_usage[] =
    "usage: tandem cluster logs [--cluster FILE] JOB [--follow] [--interval SEC]\n"
    "\n"
    "Prints the log (stdout and stderr) of a job of the registry, read from its node.\n"
    "  --cluster FILE    checked, as every cluster command does; the job's record names its node\n"
    "  --follow          keep printing what the job writes until it ends (or Ctrl-C)\n"
    "  --interval SEC    how often --follow reads (default 1)\n";

int tdm_cmd_cluster_logs(int argc, char **argv)
{
    static const struct option opts[] = {
        TDM_CLI_CLUSTER_OPTION,
        {"follow", no_argument, NULL, 'f'},
        {"interval", required_argument, NULL, 'i'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    bool follow = false;
    double interval = 1;
    const char *cluster = NULL;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "fh", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            cluster = optarg;
            break;
        case 'f':
            follow = true;
            break;
        case 'i':
            if (!tdm_cli_parse_double(optarg, &interval) || interval < 0.05 || interval > 3600)
                return tdm_cli_fail(TDM_EXIT_USAGE, "--interval takes seconds (0.05 to 3600)");
            break;
        case 'h':
            fputs(logs_usage, stdout);
            return TDM_EXIT_OK;
        default:
            fputs(logs_usage, stderr);
            return tdm_cli_fail(TDM_EXIT_USAGE, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind + 1 != argc) return fputs(logs_usage, stderr), TDM_EXIT_USAGE;
    int rc = tdm_cli_check_cluster(cluster);
    if (rc) return rc;
    job_ref r;
    rc = job_open(argv[optind], &r);
    if (rc) return rc;
    interrupted = 0;
    signal(SIGINT, on_interrupt);
    signal(SIGTERM, on_interrupt);
    int64_t offset = 0;
    for (;;) {
        char *text;
        size_t len;
        bool alive;
        tdm_error err = {0};
        if (tdm_job_log_read(&r.t, r.job_dir, offset, &text, &len, &alive, &err) != TDM_OK) {
            if (!follow || offset == 0) {
                rc = tdm_cli_fail(TDM_EXIT_FAILURE, "job %s: %s", argv[optind], err.message);
                break;
            }
            fprintf(stderr, "tandem: %s (retrying)\n", err.message); /* a node that blinked */
            sleep_interruptible(interval);
            if (interrupted) break;
            continue;
        }
        fwrite(text, 1, len, stdout);
        fflush(stdout);
        free(text);
        offset += (int64_t)len;
        if (len == TDM_JOB_LOG_CHUNK) continue; /* more is there already */
        if (!follow || !alive || interrupted) break;
        sleep_interruptible(interval);
        if (interrupted) break;
    }
    if (rc == TDM_EXIT_OK && follow) job_refresh(&r); /* it may have ended: record how */
    job_close(&r);
    return rc;
}

/* ---------------------------------------------------------------- cancel */

static const char cancel_usage[] =
    "usage: tandem cluster cancel [--cluster FILE] JOB [--timeout SEC]\n"
    "\n"
    "Stops a running job of the registry gracefully: SIGTERM to its command, which for\n"
    "`tandem finetune` checkpoints every adapter and exits 143; waits up to SEC seconds\n"
    "(default 300) for it to end, records it and prints its last log lines (the finetune's\n"
    "resume command among them).\n"
    "  --cluster FILE    checked, as every cluster command does; the job's record names its node\n";

/* A Slurm job: the batch script passes USR1 to its finetune (a checkpoint of every adapter) and,
 * seeing the job directory's `cancel` file name its Slurm id, ends instead of requeueing (exit
 * 143; a run resubmitted by hand has another id and ignores the old file). A pending job
 * has nothing to checkpoint and is cancelled outright; so is one still running after timeout.
 * slurm_id is the job's own (ARRAYID_i for a task of an array): scancel touches that task only.
 * Slurm is asked first, as the registry's state may be old (a job pending then may run now). */
static int cancel_slurm(job_ref *r, const char *id, const char *slurm_id, double timeout)
{
    tdm_error err = {0};
    job_refresh(r);
    const char *now = json_string_value(json_object_get(r->job, "state"));
    if (now && strcmp(now, "running")) {
        printf("job %s already ended (%s)\n", id, now);
        return TDM_EXIT_OK;
    }
    char marker[4200], text[128];
    snprintf(marker, sizeof marker, "%s/cancel", r->job_dir);
    int len = snprintf(text, sizeof text, "%s\n", slurm_id);
    if (len < 0 || (size_t)len >= sizeof text)
        return tdm_cli_fail(TDM_EXIT_FAILURE, "job %s: Slurm job id '%.40s...' is too long", id,
                            slurm_id);
    if (tdm_atomic_write(marker, text, (size_t)len, 0644, &err) != TDM_OK)
        return tdm_cli_fail_err(&err);
    const char *sstate = json_string_value(json_object_get(r->job, "slurm_state"));
    bool pending = sstate && !strcmp(sstate, "PENDING");
    if (tdm_slurm_cancel(slurm_id, pending ? NULL : "USR1", &err) != TDM_OK)
        return tdm_cli_fail_err(&err);
    if (pending)
        printf("job %s: Slurm job %s was pending: cancelled (nothing had trained)\n", id, slurm_id);
    else
        printf("job %s: USR1 sent to Slurm job %s; waiting for its finetune to checkpoint and "
               "end\n",
               id, slurm_id);
    fflush(stdout);
    int64_t deadline = tdm_now_mono_ns() + (int64_t)(timeout * 1e9);
    for (;;) {
        job_refresh(r);
        const char *state = json_string_value(json_object_get(r->job, "state"));
        if (state && strcmp(state, "running")) break;
        if (tdm_now_mono_ns() > deadline) {
            if (tdm_slurm_cancel(slurm_id, NULL, &err) != TDM_OK) return tdm_cli_fail_err(&err);
            printf("job %s: still running %.0f s after USR1: cancelled outright (scancel %s); "
                   "its last checkpoints are what --resume continues from\n",
                   id, timeout, slurm_id);
            timeout = 1e9;
            deadline = tdm_now_mono_ns() + (int64_t)30e9;
        }
        tdm_sleep_ms(250);
    }
    const char *tail = json_string_value(json_object_get(r->job, "log_tail"));
    printf("job %s ended (%s, slurm %s)\n", id, json_string_value(json_object_get(r->job, "state")),
           json_string_value(json_object_get(r->job, "slurm_state")));
    if (tail && *tail) printf("last lines of its log:\n%s\n", tail);
    return TDM_EXIT_OK;
}

int tdm_cmd_cluster_cancel(int argc, char **argv)
{
    static const struct option opts[] = {
        TDM_CLI_CLUSTER_OPTION,
        {"timeout", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    double timeout = 300;
    const char *cluster = NULL;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            cluster = optarg;
            break;
        case 't':
            if (!tdm_cli_parse_double(optarg, &timeout) || timeout < 0 || timeout > 86400)
                return tdm_cli_fail(TDM_EXIT_USAGE, "--timeout takes seconds (0 to 86400)");
            break;
        case 'h':
            fputs(cancel_usage, stdout);
            return TDM_EXIT_OK;
        default:
            fputs(cancel_usage, stderr);
            return tdm_cli_fail(TDM_EXIT_USAGE, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind + 1 != argc) return fputs(cancel_usage, stderr), TDM_EXIT_USAGE;
    const char *id = argv[optind];
    int rc = tdm_cli_check_cluster(cluster);
    if (rc) return rc;
    job_ref r;
    rc = job_open(id, &r);
    if (rc) return rc;
    const char *state = json_string_value(json_object_get(r.job, "state"));
    if (state && (!strcmp(state, "finished") || !strcmp(state, "failed"))) {
        printf("job %s already ended (%s)\n", id, state);
        job_close(&r);
        return TDM_EXIT_OK;
    }
    const char *slurm_id = json_string_value(json_object_get(r.job, "slurm_job_id"));
    if (slurm_id) {
        rc = cancel_slurm(&r, id, slurm_id, timeout);
        job_close(&r);
        return rc;
    }
    tdm_error err = {0};
    char pids[256];
    tdm_status st = tdm_job_signal(&r.t, r.job_dir, "TERM", pids, sizeof pids, &err);
    if (st == TDM_ERR_NOT_FOUND) {
        job_refresh(&r);
        printf("job %s is not running any more (%s)\n", id,
               json_string_value(json_object_get(r.job, "state")));
        job_close(&r);
        return TDM_EXIT_OK;
    }
    if (st != TDM_OK) {
        rc = tdm_cli_fail(TDM_EXIT_FAILURE, "job %s: %s", id, err.message);
        job_close(&r);
        return rc;
    }
    printf("job %s: SIGTERM sent to pid %s on %s; waiting for it to end (a finetune writes a "
           "checkpoint of every adapter first)\n",
           id, pids, r.node.name);
    fflush(stdout);
    int64_t deadline = tdm_now_mono_ns() + (int64_t)(timeout * 1e9);
    for (;;) {
        tdm_job_poll p;
        if (tdm_job_poll_once(&r.t, r.job_dir, NULL, 0, &p, &err) != TDM_OK)
            fprintf(stderr, "tandem: %s (retrying)\n", err.message);
        bool running = p.state == TDM_JOB_RUNNING || p.state == TDM_JOB_UNKNOWN;
        tdm_job_poll_free(&p);
        if (!running) break;
        if (tdm_now_mono_ns() > deadline) {
            job_close(&r);
            return tdm_cli_fail(TDM_EXIT_FAILURE,
                                "job %s still runs %.0f s after SIGTERM (its checkpoint may still "
                                "be writing): wait and run `tandem cluster cancel %s` again, or "
                                "kill pid %s on %s",
                                id, timeout, id, pids, r.node.name);
        }
        tdm_sleep_ms(250);
    }
    job_refresh(&r);
    const char *tail = json_string_value(json_object_get(r.job, "log_tail"));
    json_t *code = json_object_get(r.job, "exit_code");
    char how[64] = "";
    if (json_is_integer(code))
        snprintf(how, sizeof how, ", exit code %lld", (long long)json_integer_value(code));
    printf("job %s ended (%s%s)\n", id, json_string_value(json_object_get(r.job, "state")), how);
    if (tail && *tail) printf("last lines of its log:\n%s\n", tail);
    job_close(&r);
    return TDM_EXIT_OK;
}
