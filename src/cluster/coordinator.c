/* coordinator.c — job refresh through job.h, and the validation-loss leaderboard. */
#include "cluster/coordinator.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cluster/job.h"
#include "cluster/registry.h"
#include "cluster/slurm.h"
#include "cluster/transport.h"
#include "util/timeutil.h"

static bool number(json_t *v, double *out)
{
    if (!json_is_number(v))
        return false;
    double d = json_number_value(v);
    if (!isfinite(d))
        return false;
    *out = d;
    return true;
}

bool tdm_coord_val_loss(const char *metadata_json, const char *trainer_state_json, double *out)
{
    bool found = false;
    if (metadata_json) {
        json_t *m = json_loads(metadata_json, 0, NULL);
        found = m && number(json_object_get(m, "val_loss"), out);
        json_decref(m);
    }
    if (!found && trainer_state_json) {
        json_t *t = json_loads(trainer_state_json, 0, NULL);
        json_t *hist = json_object_get(t, "log_history");
        for (size_t i = json_array_size(hist); i > 0 && !found; i--)
            found = number(json_object_get(json_array_get(hist, i - 1), "eval_loss"), out);
        if (!found)
            found = number(json_object_get(t, "best_metric"), out);
        json_decref(t);
    }
    return found;
}

static void set_str(json_t *o, const char *key, const char *value, bool *changed)
{
    const char *old = json_string_value(json_object_get(o, key));
    if (value && old && !strcmp(old, value))
        return;
    if (!value && json_is_null(json_object_get(o, key)))
        return;
    json_object_set_new(o, key, value ? json_string(value) : json_null());
    *changed = true;
}

/* A Slurm job's state comes from Slurm (scontrol, else sacct), not from a pid on a node: the poll
 * read its files (log, exit_code, the adapters' records, the `cancel` marker) from the shared
 * workdir only. Once Slurm has forgotten the job, the exit_code file the batch script leaves is
 * the record. A job that failed with its marker present was stopped by `tandem cluster cancel`
 * (exit 143 after its checkpoint, or CANCELLED by a plain scancel): `cancelled` and its why say so. */
static tdm_status slurm_state(json_t *job, const char *slurm_id, bool marker, tdm_job_poll *p,
                              bool *changed, tdm_error *err)
{
    tdm_slurm_state ss;
    TDM_TRY(tdm_slurm_query(slurm_id, &ss, err));
    p->why[0] = 0;
    if (ss.known) {
        p->state = tdm_job_state_parse(tdm_slurm_state_to_job_state(ss.state));
        if (ss.reason[0] && strcmp(ss.state, "COMPLETED"))
            snprintf(p->why, sizeof p->why, "slurm %s: %s", ss.state, ss.reason);
        else if (p->state == TDM_JOB_FAILED)
            snprintf(p->why, sizeof p->why, "slurm %s (exit %d)", ss.state, ss.exit_code);
        if (p->exit_code < 0 && p->state != TDM_JOB_RUNNING) p->exit_code = ss.exit_code;
        set_str(job, "slurm_state", ss.state, changed);
        set_str(job, "state_source", ss.source, changed);
        json_t *rc = json_integer(ss.restarts);
        if (!json_equal(rc, json_object_get(job, "slurm_restarts"))) *changed = true;
        json_object_set_new(job, "slurm_restarts", rc);
    } else if (p->exit_code >= 0) {
        p->state = p->exit_code == 0 ? TDM_JOB_FINISHED : TDM_JOB_FAILED;
        if (p->exit_code) snprintf(p->why, sizeof p->why, "exit %d", p->exit_code);
        set_str(job, "state_source", "exit_code file", changed);
    } else {
        p->state = TDM_JOB_FAILED;
        snprintf(p->why, sizeof p->why,
                 "Slurm no longer knows job %s and it left no exit_code: it was killed before "
                 "its batch script ended (see its log)",
                 slurm_id);
        set_str(job, "state_source", "none", changed);
    }
    if (marker && p->state == TDM_JOB_FAILED) {
        char why[sizeof p->why];
        snprintf(why, sizeof why, "cancelled by `tandem cluster cancel` (%.460s)",
                 p->why[0] ? p->why : "slurm");
        memcpy(p->why, why, sizeof why);
        if (!json_is_true(json_object_get(job, "cancelled"))) *changed = true;
        json_object_set_new(job, "cancelled", json_true());
    }
    return TDM_OK;
}

tdm_status tdm_coord_refresh(json_t *job, bool *changed, tdm_error *err)
{
    *changed = false;
    tdm_job_state state = tdm_job_state_parse(json_string_value(json_object_get(job, "state")));
    if (state == TDM_JOB_FINISHED || state == TDM_JOB_FAILED)
        return TDM_OK;
    const char *job_dir = json_string_value(json_object_get(job, "job_dir"));
    if (!job_dir)
        return tdm_fail(err, TDM_ERR_CORRUPT, "job record without job_dir");
    tdm_cluster_node node;
    char *ssh_config;
    tdm_status st = tdm_node_from_json(json_object_get(job, "node"), &node, &ssh_config, err);
    if (st != TDM_OK)
        return st;
    json_t *adapters = json_object_get(job, "adapters");
    size_t n = json_array_size(adapters);
    const char **files = calloc(2 * n + 1, sizeof *files);
    char **owned = calloc(2 * n + 1, sizeof *owned);
    tdm_transport t;
    if (!files || !owned) {
        st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const char *output = json_string_value(json_object_get(json_array_get(adapters, i), "output"));
        for (int k = 0; k < 2; k++) {
            size_t len = strlen(output ? output : "") + 32;
            owned[2 * i + k] = malloc(len);
            if (!owned[2 * i + k]) {
                st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
                goto out;
            }
            snprintf(owned[2 * i + k], len, "%s/%s", output ? output : "",
                     k ? "trainer_state.json" : "metadata.json");
            files[2 * i + k] = owned[2 * i + k];
        }
    }
    st = tdm_transport_init(&t, &node, ssh_config, err);
    if (st != TDM_OK)
        goto out;
    const char *slurm_id = json_string_value(json_object_get(job, "slurm_job_id"));
    size_t n_files = 2 * n;
    if (slurm_id) {
        size_t len = strlen(job_dir) + 8;
        if (!(owned[n_files] = malloc(len))) {
            st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
            goto out;
        }
        snprintf(owned[n_files], len, "%s/cancel", job_dir);
        files[n_files] = owned[n_files];
        n_files++;
    }
    tdm_job_poll p;
    st = tdm_job_poll_once(&t, job_dir, files, n_files, &p, err);
    if (st != TDM_OK)
        goto out;
    /* the marker names the Slurm job it cancelled (an older run's is stale) */
    const char *mark = slurm_id ? p.files[2 * n] : NULL;
    bool cancelled = mark && !strncmp(mark, slurm_id, strlen(slurm_id)) &&
                     (!mark[strlen(slurm_id)] || mark[strlen(slurm_id)] == '\n');
    if (slurm_id && (st = slurm_state(job, slurm_id, cancelled, &p, changed, err)) != TDM_OK) {
        tdm_job_poll_free(&p);
        goto out;
    }
    char now[32];
    tdm_format_rfc3339(time(NULL), now, sizeof now);
    if (p.state == TDM_JOB_UNKNOWN) {
        set_str(job, "unreachable", p.why, changed);
    } else {
        set_str(job, "unreachable", NULL, changed);
        set_str(job, "state", tdm_job_state_str(p.state), changed);
        set_str(job, "why", p.why[0] ? p.why : NULL, changed);
        set_str(job, "log_tail", p.log_tail, changed);
        json_t *ec = p.exit_code >= 0 ? json_integer(p.exit_code) : json_null();
        if (!json_equal(ec, json_object_get(job, "exit_code")))
            *changed = true;
        json_object_set_new(job, "exit_code", ec);
        for (size_t i = 0; i < n; i++) {
            json_t *a = json_array_get(adapters, i);
            const char *meta = p.files[2 * i], *ts = p.files[2 * i + 1];
            json_t *m = meta ? json_loads(meta, 0, NULL) : NULL;
            if (m && json_is_object(m)) {
                if (!json_equal(m, json_object_get(a, "metrics")))
                    *changed = true;
                json_object_set_new(a, "metrics", m);
            } else {
                json_decref(m);
            }
            double vl;
            if (tdm_coord_val_loss(meta, ts, &vl)) {
                json_t *old = json_object_get(a, "val_loss");
                if (!json_is_number(old) || json_number_value(old) != vl)
                    *changed = true;
                json_object_set_new(a, "val_loss", json_real(vl));
            }
        }
    }
    json_object_set_new(job, "updated", json_string(now));
    tdm_job_poll_free(&p);
out:
    if (owned)
        for (size_t i = 0; i < 2 * n + 1; i++)
            free(owned[i]);
    free(owned);
    free(files);
    tdm_cluster_node_free(&node);
    free(ssh_config);
    return st;
}

const char *tdm_coord_latest_submission(json_t *jobs)
{
    size_t n = json_array_size(jobs);
    if (!n)
        return NULL;
    return json_string_value(json_object_get(json_array_get(jobs, n - 1), "submission"));
}

static int by_loss(const void *a, const void *b)
{
    json_t *x = *(json_t *const *)a, *y = *(json_t *const *)b;
    json_t *lx = json_object_get(x, "val_loss"), *ly = json_object_get(y, "val_loss");
    if (json_is_number(lx) != json_is_number(ly))
        return json_is_number(lx) ? -1 : 1;
    if (json_is_number(lx)) {
        double dx = json_number_value(lx), dy = json_number_value(ly);
        if (dx != dy)
            return dx < dy ? -1 : 1;
    }
    int c = strcmp(json_string_value(json_object_get(x, "job")),
                   json_string_value(json_object_get(y, "job")));
    if (c)
        return c;
    return (int)(json_integer_value(json_object_get(x, "index")) -
                 json_integer_value(json_object_get(y, "index")));
}

json_t *tdm_coord_leaderboard(json_t *jobs, const char *submission)
{
    size_t cap = 0, n = 0;
    json_t **rows = NULL;
    size_t i;
    json_t *job;
    json_array_foreach(jobs, i, job)
    {
        const char *sub = json_string_value(json_object_get(job, "submission"));
        if (submission && (!sub || strcmp(sub, submission)))
            continue;
        json_t *adapters = json_object_get(job, "adapters");
        size_t j;
        json_t *a;
        json_array_foreach(adapters, j, a)
        {
            json_t *m = json_object_get(a, "metrics");
            json_t *row = json_object();
            json_object_set(row, "job", json_object_get(job, "id"));
            json_object_set(row, "node", json_object_get(json_object_get(job, "node"), "name"));
            json_object_set(row, "state", json_object_get(job, "state"));
            json_object_set(row, "index", json_object_get(a, "index"));
            json_object_set(row, "label", json_object_get(a, "label"));
            json_object_set(row, "output", json_object_get(a, "output"));
            json_t *vl = json_object_get(a, "val_loss");
            json_object_set_new(row, "val_loss", vl ? json_copy(vl) : json_null());
            json_t *e = json_object_get(m, "epoch"), *tl = json_object_get(m, "train_loss");
            json_t *vp = json_object_get(m, "val_perplexity");
            json_object_set_new(row, "epoch", e ? json_copy(e) : json_null());
            json_object_set_new(row, "train_loss", tl ? json_copy(tl) : json_null());
            json_object_set_new(row, "val_perplexity", vp ? json_copy(vp) : json_null());
            if (n == cap) {
                cap = cap ? cap * 2 : 16;
                json_t **g = realloc(rows, cap * sizeof *rows);
                if (!g) {
                    json_decref(row);
                    break;
                }
                rows = g;
            }
            rows[n++] = row;
        }
    }
    if (n)
        qsort(rows, n, sizeof *rows, by_loss);
    json_t *out = json_array();
    for (size_t k = 0; k < n; k++) {
        json_object_set_new(rows[k], "rank", json_integer((json_int_t)k + 1));
        json_array_append_new(out, rows[k]);
    }
    free(rows);
    return out;
}
