#include "train/run_records.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/base_identity.h"
#include "model/nf4.h"
#include "util/append_file.h"
#include "util/atomic_file.h"
#include "util/json_file.h"

static json_t *num_or_null(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

static tdm_status save_doc(const json_t *doc, const char *path, size_t flags, tdm_error *err)
{
    return tdm_atomic_write_json(path, doc, flags, true, 0644, err);
}

tdm_status tdm_trainer_state_init(tdm_trainer_state *ts, tdm_error *err)
{
    memset(ts, 0, sizeof *ts);
    ts->log_history = json_array();
    if (!ts->log_history) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    return TDM_OK;
}

void tdm_trainer_state_free(tdm_trainer_state *ts)
{
    json_decref(ts->log_history);
    memset(ts, 0, sizeof *ts);
}

void tdm_trainer_state_log_train(tdm_trainer_state *ts, double loss, double learning_rate,
                                 double grad_norm)
{
    json_t *e = json_object();
    json_object_set_new(e, "epoch", json_real(ts->epoch));
    json_object_set_new(e, "grad_norm", num_or_null(grad_norm));
    json_object_set_new(e, "learning_rate", num_or_null(learning_rate));
    json_object_set_new(e, "loss", num_or_null(round(loss * 1e4) / 1e4));
    json_object_set_new(e, "step", json_integer(ts->global_step));
    json_array_append_new(ts->log_history, e);
}

bool tdm_trainer_state_log_eval(tdm_trainer_state *ts, double eval_loss, double runtime_s,
                                double samples_per_s, double steps_per_s, const char *best_dir)
{
    json_t *e = json_object();
    json_object_set_new(e, "epoch", json_real(ts->epoch));
    json_object_set_new(e, "eval_loss", num_or_null(eval_loss));
    json_object_set_new(e, "eval_runtime", num_or_null(round(runtime_s * 1e4) / 1e4));
    json_object_set_new(e, "eval_samples_per_second",
                        num_or_null(round(samples_per_s * 1e3) / 1e3));
    json_object_set_new(e, "eval_steps_per_second", num_or_null(round(steps_per_s * 1e3) / 1e3));
    json_object_set_new(e, "step", json_integer(ts->global_step));
    json_array_append_new(ts->log_history, e);
    if (isfinite(eval_loss) && (!ts->has_best || eval_loss < ts->best_metric)) {
        ts->has_best = true;
        ts->best_metric = eval_loss;
        ts->best_global_step = ts->global_step;
        snprintf(ts->best_model_checkpoint, sizeof ts->best_model_checkpoint, "%s",
                 best_dir ? best_dir : "");
        return true;
    }
    return false;
}

void tdm_trainer_state_log_end(tdm_trainer_state *ts, double train_loss, double runtime_s,
                               double samples_per_s, double steps_per_s)
{
    json_t *e = json_object();
    json_object_set_new(e, "epoch", json_real(ts->epoch));
    json_object_set_new(e, "step", json_integer(ts->global_step));
    json_object_set_new(e, "total_flos", json_real(ts->total_flos));
    json_object_set_new(e, "train_loss", num_or_null(train_loss));
    json_object_set_new(e, "train_runtime", num_or_null(round(runtime_s * 1e4) / 1e4));
    json_object_set_new(e, "train_samples_per_second",
                        num_or_null(round(samples_per_s * 1e3) / 1e3));
    json_object_set_new(e, "train_steps_per_second", num_or_null(round(steps_per_s * 1e3) / 1e3));
    json_array_append_new(ts->log_history, e);
}

json_t *tdm_trainer_state_to_json(const tdm_trainer_state *ts)
{
    json_t *o = json_object();
    json_object_set_new(o, "best_global_step",
                        ts->has_best ? json_integer(ts->best_global_step) : json_null());
    json_object_set_new(o, "best_metric", ts->has_best ? json_real(ts->best_metric) : json_null());
    json_object_set_new(o, "best_model_checkpoint",
                        ts->has_best && ts->best_model_checkpoint[0]
                            ? json_string(ts->best_model_checkpoint)
                            : json_null());
    json_object_set_new(o, "epoch", json_real(ts->epoch));
    json_object_set_new(o, "eval_steps", json_integer(ts->eval_steps));
    json_object_set_new(o, "global_step", json_integer(ts->global_step));
    json_object_set_new(o, "is_hyper_param_search", json_false());
    json_object_set_new(o, "is_local_process_zero", json_true());
    json_object_set_new(o, "is_world_process_zero", json_true());
    json_object_set_new(o, "log_history", json_deep_copy(ts->log_history));
    json_object_set_new(o, "logging_steps", json_integer(ts->logging_steps));
    json_object_set_new(o, "max_steps", json_integer(ts->max_steps));
    json_object_set_new(o, "num_input_tokens_seen", json_integer(ts->num_input_tokens_seen));
    json_object_set_new(o, "num_train_epochs", json_integer(ts->num_train_epochs));
    json_object_set_new(o, "save_steps", json_integer(ts->save_steps));
    json_object_set_new(o, "stateful_callbacks", json_object());
    json_object_set_new(o, "total_flos", json_real(ts->total_flos));
    json_object_set_new(o, "train_batch_size", json_integer(ts->train_batch_size));
    json_object_set_new(o, "trial_name", json_null());
    json_object_set_new(o, "trial_params", json_null());
    return o;
}

tdm_status tdm_trainer_state_save(const tdm_trainer_state *ts, const char *path, tdm_error *err)
{
    json_t *o = tdm_trainer_state_to_json(ts);
    tdm_status st = save_doc(o, path, JSON_INDENT(2) | JSON_SORT_KEYS, err);
    json_decref(o);
    return st;
}

static int64_t get_int(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? json_integer_value(v) : 0;
}

tdm_status tdm_trainer_state_load(tdm_trainer_state *ts, const char *path, tdm_error *err)
{
    memset(ts, 0, sizeof *ts);
    char *text;
    size_t len;
    tdm_status st = tdm_read_file(path, &text, &len, err);
    if (st != TDM_OK) return st;
    json_error_t je;
    json_t *o = json_loadb(text, len, 0, &je);
    free(text);
    if (!o) return tdm_fail(err, TDM_ERR_PARSE, "%s:%d:%d: %s", path, je.line, je.column, je.text);
    const json_t *lh = json_object_get(o, "log_history");
    const json_t *ep = json_object_get(o, "epoch");
    if (!json_is_object(o) || !json_is_array(lh) ||
        !json_is_integer(json_object_get(o, "global_step"))) {
        json_decref(o);
        return tdm_fail(err, TDM_ERR_PARSE, "%s: global_step or log_history missing", path);
    }
    ts->global_step = get_int(o, "global_step");
    ts->epoch = json_is_number(ep) ? json_number_value(ep) : 0;
    ts->max_steps = get_int(o, "max_steps");
    ts->num_train_epochs = get_int(o, "num_train_epochs");
    ts->logging_steps = get_int(o, "logging_steps");
    ts->eval_steps = get_int(o, "eval_steps");
    ts->save_steps = get_int(o, "save_steps");
    ts->train_batch_size = get_int(o, "train_batch_size");
    ts->num_input_tokens_seen = get_int(o, "num_input_tokens_seen");
    const json_t *tf = json_object_get(o, "total_flos");
    ts->total_flos = json_is_number(tf) ? json_number_value(tf) : 0;
    const json_t *bm = json_object_get(o, "best_metric");
    if (json_is_number(bm)) {
        ts->has_best = true;
        ts->best_metric = json_number_value(bm);
        ts->best_global_step = get_int(o, "best_global_step");
        const json_t *bc = json_object_get(o, "best_model_checkpoint");
        if (json_is_string(bc))
            snprintf(ts->best_model_checkpoint, sizeof ts->best_model_checkpoint, "%s",
                     json_string_value(bc));
    }
    ts->log_history = json_deep_copy(lh);
    json_decref(o);
    return TDM_OK;
}

json_t *tdm_run_metadata_to_json(const tdm_run_metadata *m)
{
    json_t *o = json_object();
    json_object_set_new(o, "task", json_string(m->task ? m->task : ""));
    json_object_set_new(o, "epoch", num_or_null(m->epoch));
    json_object_set_new(o, "train_loss", num_or_null(m->train_loss));
    json_object_set_new(o, "val_loss", num_or_null(m->val_loss));
    json_object_set_new(o, "train_perplexity", num_or_null(exp(m->train_loss)));
    json_object_set_new(o, "val_perplexity", num_or_null(exp(m->val_loss)));
    json_object_set_new(o, "learning_rate", num_or_null(m->learning_rate));
    json_object_set_new(o, "epoch_time_ms", num_or_null(m->epoch_time_ms));
    json_object_set_new(o, "samples_per_sec", num_or_null(m->samples_per_sec));
    json_object_set_new(o, "lora_rank", json_integer(m->lora_rank));
    json_object_set_new(o, "lora_alpha", num_or_null(m->lora_alpha));
    json_object_set_new(o, "data_hash", m->data_hash ? json_string(m->data_hash) : json_null());
    json_object_set_new(o, "base_model_identity",
                        m->base_model_identity ? json_string(m->base_model_identity)
                                               : json_null());
    json_object_set_new(o, "adapter_index", json_integer(m->adapter_index));
    json_object_set_new(o, "label", m->label ? json_string(m->label) : json_null());
    if (m->method) {
        bool nf4 = !strcmp(m->method, "qlora");
        json_object_set_new(o, "method", json_string(m->method));
        json_object_set_new(o, "double_quant", json_boolean(nf4 && m->double_quant));
        json_object_set_new(o, "nf4_block_size", nf4 ? json_integer(TDM_NF4_BLOCK) : json_null());
    }
    return o;
}

tdm_status tdm_run_metadata_save(const tdm_run_metadata *m, const char *path, tdm_error *err)
{
    json_t *o = tdm_run_metadata_to_json(m);
    tdm_status st = save_doc(o, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER, err);
    json_decref(o);
    return st;
}

json_t *tdm_metrics_line_to_json(const tdm_metrics_line *m)
{
    json_t *o = json_object();
    json_object_set_new(o, "step", json_integer(m->step));
    json_object_set_new(o, "epoch", num_or_null(m->epoch));
    if (!isnan(m->loss)) json_object_set_new(o, "loss", num_or_null(m->loss));
    if (!isnan(m->val_loss)) json_object_set_new(o, "val_loss", num_or_null(m->val_loss));
    if (!isnan(m->learning_rate))
        json_object_set_new(o, "learning_rate", num_or_null(m->learning_rate));
    if (!isnan(m->grad_norm)) json_object_set_new(o, "grad_norm", num_or_null(m->grad_norm));
    json_object_set_new(o, "tokens", json_integer(m->tokens));
    if (!isnan(m->tokens_per_sec))
        json_object_set_new(o, "tokens_per_sec", num_or_null(m->tokens_per_sec));
    if (!isnan(m->elapsed_ms)) json_object_set_new(o, "elapsed_ms", num_or_null(m->elapsed_ms));
    json_object_set_new(o, "adapter_index", json_integer(m->adapter_index));
    json_object_set_new(o, "label", m->label ? json_string(m->label) : json_null());
    return o;
}

tdm_status tdm_metrics_append(const char *path, const tdm_metrics_line *m, tdm_error *err)
{
    json_t *o = tdm_metrics_line_to_json(m);
    char *line = tdm_json_dumps_line(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!line) return tdm_fail(err, TDM_ERR_NOMEM, "cannot encode a metrics line");
    tdm_status st = tdm_append_whole(path, line, strlen(line), "metrics", err);
    free(line);
    return st;
}

tdm_status tdm_metrics_truncate_after(const char *path, int64_t step, int64_t *kept, tdm_error *err)
{
    return tdm_metrics_truncate_lines(path, step, -1, kept, err);
}

tdm_status tdm_metrics_truncate_lines(const char *path, int64_t step, int64_t max_lines,
                                      int64_t *kept, tdm_error *err)
{
    if (kept) *kept = 0;
    char *text;
    size_t len;
    tdm_status st = tdm_read_file(path, &text, &len, err);
    if (st == TDM_ERR_NOT_FOUND) return TDM_OK;
    if (st != TDM_OK) return st;
    char *out = malloc(len + 1);
    if (!out) {
        free(text);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory reading %s", path);
    }
    size_t on = 0;
    int64_t k = 0;
    for (char *p = text; p < text + len;) {
        char *nl = memchr(p, '\n', (size_t)(text + len - p));
        if (!nl) break; /* a torn last line */
        json_t *o = json_loadb(p, (size_t)(nl - p), 0, NULL);
        const json_t *s = o ? json_object_get(o, "step") : NULL;
        if (json_is_integer(s) && json_integer_value(s) <= step &&
            (max_lines < 0 || k < max_lines)) {
            memcpy(out + on, p, (size_t)(nl - p) + 1);
            on += (size_t)(nl - p) + 1;
            k++;
        }
        json_decref(o);
        p = nl + 1;
    }
    free(text);
    st = tdm_atomic_write(path, out, on, 0644, err);
    free(out);
    if (st == TDM_OK && kept) *kept = k;
    return st;
}

json_t *tdm_adapter_run_record(const char *adapter_dir, char *path, size_t cap)
{
    char buf[4200];
    snprintf(buf, sizeof buf, "%s/%s", adapter_dir, TDM_METADATA_FILE);
    json_t *md = json_load_file(buf, 0, NULL);
    if (!md) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", adapter_dir);
        size_t l = strlen(dir);
        while (l > 1 && dir[l - 1] == '/')
            dir[--l] = 0;
        char *slash = strrchr(dir, '/');
        const char *leaf = slash ? slash + 1 : dir;
        if (!strcmp(leaf, "best") || !strncmp(leaf, "checkpoint-", 11)) {
            if (slash)
                *slash = 0;
            else
                snprintf(dir, sizeof dir, ".");
            snprintf(buf, sizeof buf, "%s/%s", dir, TDM_METADATA_FILE);
            md = json_load_file(buf, 0, NULL);
        }
    }
    if (md && !json_is_object(md)) {
        json_decref(md);
        md = NULL;
    }
    if (md && path && cap) snprintf(path, cap, "%s", buf);
    return md;
}

tdm_status tdm_adapter_check_base(const char *adapter_dir, const char *model_dir, tdm_error *err)
{
    char path[4200];
    json_t *md = tdm_adapter_run_record(adapter_dir, path, sizeof path);
    const char *want = json_string_value(json_object_get(md, "base_model_identity"));
    tdm_status st = TDM_OK;
    char have[TDM_BASE_IDENTITY_LEN];
    if (want && (st = tdm_base_model_identity(model_dir, have, err)) == TDM_OK && strcmp(have, want))
        st = tdm_fail(err, TDM_ERR_UNSUPPORTED,
                      "%s was trained on another base model than %s (%s records "
                      "base_model_identity %.19s..., this model is %.19s...); use it with the "
                      "model it was trained on",
                      adapter_dir, model_dir, path, want, have);
    json_decref(md);
    return st;
}
