/* status.c — a co-training host's live status: encoding, strict reading, and the listing
 * `gpu status` shows (contract in status.h). */
#include "cotrain/status.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model.h"
#include "util/atomic_file.h"

static const char *const state_names[] = {"training", "finished", "detached"};

const char *tdm_cotrain_adapter_state_name(tdm_cotrain_adapter_state s)
{
    return (unsigned)s < 3 ? state_names[s] : "?";
}

static json_t *real_or_null(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

json_t *tdm_cotrain_status_json(const tdm_cotrain_status *s)
{
    json_t *ads = json_array();
    for (int i = 0; ads && i < s->n_adapters; i++) {
        const tdm_cotrain_status_adapter *a = &s->adapters[i];
        json_t *joiner = a->joiner_pid > 0 ? json_pack("{s:i, s:s}", "pid", (int)a->joiner_pid,
                                                       "user", a->joiner_user)
                                           : json_null();
        json_t *o = json_pack(
            "{s:i, s:s, s:s, s:s, s:o, s:s, s:I, s:I, s:f, s:i, s:o, s:o, s:f, s:o}", "index",
            a->index, "label", a->label ? a->label : "", "data", a->data ? a->data : "", "output",
            a->output ? a->output : "", "joiner", joiner, "state",
            tdm_cotrain_adapter_state_name(a->state), "step", (json_int_t)a->step, "total_steps",
            (json_int_t)a->total_steps, "epoch", a->epoch, "epochs", a->epochs, "loss",
            real_or_null(a->loss), "tokens_per_sec", real_or_null(a->tokens_per_sec), "weight",
            a->weight, "share", real_or_null(a->share));
        if (!o || json_array_append_new(ads, o) != 0) {
            json_decref(ads);
            return NULL;
        }
    }
    if (!ads) return NULL;
    json_t *o = json_pack("{s:i, s:I, s:I, s:s, s:o}", "v", TDM_COTRAIN_STATUS_VERSION,
                          "updated_ms", (json_int_t)s->updated_ms, "global_step",
                          (json_int_t)s->global_step, "schedule", s->schedule, "adapters", ads);
    if (o && s->has_plan) {
        json_t *plan = json_pack("{s:b, s:o, s:i}", "grad_checkpoint", s->grad_checkpoint,
                                 "recompute",
                                 s->grad_checkpoint ? json_string(s->recompute) : json_null(),
                                 "split", s->split);
        if (!plan || json_object_set_new(o, "plan", plan) != 0) {
            json_decref(o);
            return NULL;
        }
    }
    return o;
}

/* ---------------------------------------------------------------------- reading ---- */

static tdm_status bad(tdm_error *err, const char *field, int index)
{
    if (index >= 0)
        return tdm_fail(err, TDM_ERR_PARSE,
                        "co-training status: adapters[%d].%s: missing or "
                        "out of range",
                        index, field);
    return tdm_fail(err, TDM_ERR_PARSE, "co-training status: %s: missing or out of range", field);
}

static bool get_int(const json_t *o, const char *k, int64_t lo, int64_t hi, int64_t *out)
{
    json_t *v = json_object_get(o, k);
    if (!json_is_integer(v)) return false;
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi) return false;
    *out = x;
    return true;
}

/* A finite number in [lo, hi], or null (NaN) when nullable. */
static bool get_real(const json_t *o, const char *k, double lo, double hi, bool nullable,
                     double *out)
{
    json_t *v = json_object_get(o, k);
    if (nullable && json_is_null(v)) {
        *out = NAN;
        return true;
    }
    if (!json_is_number(v)) return false;
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) return false;
    *out = x;
    return true;
}

static bool get_str(const json_t *o, const char *k, size_t max, char **out)
{
    const char *s = json_string_value(json_object_get(o, k));
    if (!s || strlen(s) > max) return false;
    return (*out = strdup(s)) != NULL;
}

static tdm_status parse_adapter(const json_t *o, int i, tdm_cotrain_status_adapter *a,
                                tdm_error *err)
{
    int64_t x;
    if (!json_is_object(o)) return bad(err, "(object)", i);
    if (!get_int(o, "index", 0, 1 << 20, &x)) return bad(err, "index", i);
    a->index = (int)x;
    if (!get_str(o, "label", 256, &a->label)) return bad(err, "label", i);
    if (!get_str(o, "data", 4096, &a->data)) return bad(err, "data", i);
    if (!get_str(o, "output", 4096, &a->output)) return bad(err, "output", i);
    json_t *j = json_object_get(o, "joiner");
    if (json_is_object(j)) {
        const char *user = json_string_value(json_object_get(j, "user"));
        if (!get_int(j, "pid", 1, INT32_MAX, &x) || !user || strlen(user) >= sizeof a->joiner_user)
            return bad(err, "joiner", i);
        a->joiner_pid = (int32_t)x;
        memcpy(a->joiner_user, user, strlen(user) + 1);
    } else if (!json_is_null(j)) {
        return bad(err, "joiner", i);
    }
    const char *state = json_string_value(json_object_get(o, "state"));
    int k = 0;
    while (state && k < 3 && strcmp(state, state_names[k]) != 0)
        k++;
    if (!state || k == 3) return bad(err, "state", i);
    a->state = (tdm_cotrain_adapter_state)k;
    if (!get_int(o, "step", 0, INT64_MAX / 2, &a->step)) return bad(err, "step", i);
    if (!get_int(o, "total_steps", 0, INT64_MAX / 2, &a->total_steps))
        return bad(err, "total_steps", i);
    if (!get_real(o, "epoch", 0, 1e9, false, &a->epoch)) return bad(err, "epoch", i);
    if (!get_int(o, "epochs", 0, 100000, &x)) return bad(err, "epochs", i);
    a->epochs = (int)x;
    if (!get_real(o, "loss", -1e300, 1e300, true, &a->loss)) return bad(err, "loss", i);
    if (!get_real(o, "tokens_per_sec", 0, 1e300, true, &a->tokens_per_sec))
        return bad(err, "tokens_per_sec", i);
    if (!get_real(o, "weight", 0, 1e300, false, &a->weight)) return bad(err, "weight", i);
    if (!get_real(o, "share", 0, 1, true, &a->share)) return bad(err, "share", i);
    return TDM_OK;
}

/* The optional "plan" object into out (has_plan stays false when absent). */
static tdm_status parse_plan(const json_t *plan, tdm_cotrain_status *out, tdm_error *err)
{
    if (!plan) return TDM_OK;
    if (!json_is_object(plan)) return bad(err, "plan", -1);
    json_t *gc = json_object_get(plan, "grad_checkpoint");
    if (!json_is_boolean(gc)) return bad(err, "plan.grad_checkpoint", -1);
    out->grad_checkpoint = json_is_true(gc);
    json_t *rc = json_object_get(plan, "recompute");
    if (out->grad_checkpoint) {
        const char *r = json_string_value(rc);
        tdm_recompute mode;
        if (!r || !tdm_recompute_parse(r, &mode)) return bad(err, "plan.recompute", -1);
        snprintf(out->recompute, sizeof out->recompute, "%s", r);
    } else if (!json_is_null(rc)) {
        return bad(err, "plan.recompute", -1);
    }
    int64_t split;
    if (!get_int(plan, "split", 1, 1 << 20, &split)) return bad(err, "plan.split", -1);
    out->split = (int)split;
    out->has_plan = true;
    return TDM_OK;
}

tdm_status tdm_cotrain_status_parse(const json_t *o, tdm_cotrain_status *out, tdm_error *err)
{
    memset(out, 0, sizeof *out);
    if (!json_is_object(o)) return bad(err, "status", -1);
    int64_t v;
    if (!get_int(o, "v", 0, INT32_MAX, &v)) return bad(err, "v", -1);
    if (v != TDM_COTRAIN_STATUS_VERSION)
        return tdm_fail(err, TDM_ERR_UNSUPPORTED,
                        "co-training status version %lld (this tandem reads version %d)",
                        (long long)v, TDM_COTRAIN_STATUS_VERSION);
    if (!get_int(o, "updated_ms", 0, INT64_MAX / 2, &out->updated_ms))
        return bad(err, "updated_ms", -1);
    if (!get_int(o, "global_step", 0, INT64_MAX / 2, &out->global_step))
        return bad(err, "global_step", -1);
    const char *sched = json_string_value(json_object_get(o, "schedule"));
    if (!sched || strlen(sched) >= sizeof out->schedule) return bad(err, "schedule", -1);
    memcpy(out->schedule, sched, strlen(sched) + 1);
    TDM_TRY(parse_plan(json_object_get(o, "plan"), out, err));
    json_t *ads = json_object_get(o, "adapters");
    if (!json_is_array(ads) || json_array_size(ads) > TDM_COTRAIN_STATUS_MAX_ADAPTERS)
        return bad(err, "adapters", -1);
    size_t n = json_array_size(ads);
    if (n) {
        out->adapters = calloc(n, sizeof *out->adapters);
        if (!out->adapters) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        out->n_adapters = (int)i + 1; /* so that free() releases what was read */
        tdm_status st = parse_adapter(json_array_get(ads, i), (int)i, &out->adapters[i], err);
        if (st != TDM_OK) {
            tdm_cotrain_status_free(out);
            return st;
        }
    }
    return TDM_OK;
}

void tdm_cotrain_status_free(tdm_cotrain_status *s)
{
    if (!s) return;
    for (int i = 0; i < s->n_adapters; i++) {
        free(s->adapters[i].label);
        free(s->adapters[i].data);
        free(s->adapters[i].output);
    }
    free(s->adapters);
    memset(s, 0, sizeof *s);
}

/* ---------------------------------------------------------------------- listing ---- */

/* The status field of host pid's advertisement in dir; false when there is none this version
 * reads (not yet published, replaced meanwhile by the host's exit, another version). */
static bool read_status(const char *dir, int32_t pid, tdm_cotrain_status *out)
{
    char path[4200];
    if (tdm_cotrain_advert_path(path, sizeof path, dir, pid) != 0) return false;
    char *text = NULL;
    size_t len = 0;
    tdm_error e = {0};
    if (tdm_read_file(path, &text, &len, &e) != TDM_OK) return false;
    json_error_t jerr;
    json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    json_t *s = json_object_get(o, "status");
    bool ok = s && tdm_cotrain_status_parse(s, out, &e) == TDM_OK;
    json_decref(o);
    return ok;
}

tdm_status tdm_cotrain_status_list(const char *dir, tdm_cotrain_host_view **out, size_t *n,
                                   tdm_error *err)
{
    *out = NULL;
    *n = 0;
    tdm_cotrain_advert *hosts = NULL;
    size_t nh = 0;
    tdm_status st = tdm_cotrain_discover(dir, &hosts, &nh, err);
    if (st != TDM_OK) return st;
    if (nh == 0) return TDM_OK;
    tdm_cotrain_host_view *v = calloc(nh, sizeof *v);
    if (!v) {
        free(hosts);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < nh; i++) {
        v[i].advert = hosts[i];
        v[i].has_status = read_status(dir, hosts[i].pid, &v[i].status);
    }
    free(hosts);
    *out = v;
    *n = nh;
    return TDM_OK;
}

void tdm_cotrain_host_views_free(tdm_cotrain_host_view *v, size_t n)
{
    for (size_t i = 0; v && i < n; i++)
        tdm_cotrain_status_free(&v[i].status);
    free(v);
}
