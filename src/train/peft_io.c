#include "train/peft_io.h"

#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/safetensors.h"
#include "train/checkpoint.h"
#include "util/atomic_dir.h"
#include "util/atomic_file.h"
#include "util/json_file.h"

#define NAME_CAP 192

tdm_status tdm_peft_config_json(const tdm_lora_params *l, const tdm_peft_meta *meta, char **out,
                                tdm_error *err)
{
    *out = NULL;
    json_t *o = json_object();
    json_t *targets = json_array();
    for (unsigned t = 0; t < TDM_ADAPTER_TARGET_COUNT; t++)
        if (l->targets & (1u << t))
            json_array_append_new(targets, json_string(tdm_lora_target_name(t)));
    /* lora_alpha as an integer when it is one (PEFT configs usually carry ints). */
    json_t *alpha = (l->alpha == floor(l->alpha) && fabs(l->alpha) < 1e15)
                        ? json_integer((json_int_t)l->alpha)
                        : json_real(l->alpha);
    json_object_set_new(o, "alpha_pattern", json_object());
    json_object_set_new(o, "auto_mapping", json_null());
    json_object_set_new(o, "base_model_name_or_path",
                        json_string(meta ? meta->base_model_name_or_path : ""));
    json_object_set_new(o, "bias", json_string("none"));
    json_object_set_new(o, "fan_in_fan_out", json_false());
    json_object_set_new(o, "inference_mode", json_true());
    json_object_set_new(o, "init_lora_weights", json_true());
    json_object_set_new(o, "layer_replication", json_null());
    json_object_set_new(o, "layers_pattern", json_null());
    json_object_set_new(o, "layers_to_transform", json_null());
    json_object_set_new(o, "loftq_config", json_object());
    json_object_set_new(o, "lora_alpha", alpha);
    json_object_set_new(o, "lora_dropout", json_real(meta ? meta->lora_dropout : 0.0));
    json_object_set_new(o, "megatron_config", json_null());
    json_object_set_new(o, "megatron_core", json_string("megatron.core"));
    json_object_set_new(o, "modules_to_save", json_null());
    json_object_set_new(o, "peft_type", json_string("LORA"));
    json_object_set_new(o, "r", json_integer(l->rank));
    json_object_set_new(o, "rank_pattern", json_object());
    json_object_set_new(o, "revision", json_null());
    json_object_set_new(o, "target_modules", targets);
    json_object_set_new(o, "task_type", json_string("CAUSAL_LM"));
    json_object_set_new(o, "use_dora", json_false());
    json_object_set_new(o, "use_rslora", json_boolean(l->use_rslora));
    char *withnl = tdm_json_dumps_line(o, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(o);
    if (!withnl) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory writing adapter_config.json");
    *out = withnl;
    return TDM_OK;
}

tdm_status tdm_peft_write_files(const char *dir, const tdm_lora_params *l, const tdm_peft_meta *meta,
                                tdm_error *err)
{
    char path[PATH_MAX];
    size_t nt = 2 * l->n_modules;
    tdm_st_spec *specs = calloc(nt, sizeof *specs);
    const void **data = calloc(nt, sizeof *data);
    char *names = calloc(nt, NAME_CAP);
    if (!specs || !data || !names) {
        free(specs);
        free(data);
        free(names);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory saving adapter %s", dir);
    }
    for (size_t i = 0; i < l->n_modules; i++) {
        const tdm_lora_module *m = &l->modules[i];
        for (int b = 0; b < 2; b++) {
            size_t k = 2 * i + (size_t)b;
            char *nm = names + k * NAME_CAP;
            tdm_lora_params_tensor_name(m, b, nm, NAME_CAP);
            specs[k].name = nm;
            specs[k].dtype = TDM_DTYPE_F32;
            specs[k].rank = 2;
            specs[k].shape[0] = b ? m->out : l->rank;
            specs[k].shape[1] = b ? l->rank : m->in;
            data[k] = b ? m->B : m->A;
        }
    }
    static const char *const meta_kv[] = {"format", "pt"};
    snprintf(path, sizeof path, "%s/%s", dir, TDM_PEFT_WEIGHTS_FILE);
    tdm_status st = tdm_st_save(path, specs, data, nt, meta_kv, 1, err);
    free(specs);
    free(data);
    free(names);
    if (st != TDM_OK) return st;
    char *text;
    st = tdm_peft_config_json(l, meta, &text, err);
    if (st != TDM_OK) return st;
    snprintf(path, sizeof path, "%s/%s", dir, TDM_PEFT_CONFIG_FILE);
    st = tdm_atomic_write(path, text, strlen(text), 0644, err);
    free(text);
    return st;
}

tdm_status tdm_peft_save(const char *dir, const tdm_lora_params *l, const tdm_peft_meta *meta,
                         tdm_error *err)
{
    char tmp[PATH_MAX];
    tdm_status st = tdm_atomic_dir_begin(dir, tmp, sizeof tmp, err);
    if (st != TDM_OK) return st;
    st = tdm_peft_write_files(tmp, l, meta, err);
    if (st != TDM_OK) {
        tdm_atomic_dir_abort(tmp);
        return st;
    }
    return tdm_atomic_dir_commit(tmp, dir, err);
}

/* ---- reading ---- */

static bool is_null_or_empty(const json_t *v)
{
    if (!v || json_is_null(v)) return true;
    if (json_is_object(v)) return json_object_size(v) == 0;
    if (json_is_array(v)) return json_array_size(v) == 0;
    return false;
}

tdm_status tdm_peft_config_parse(const char *text, size_t len, const char *name, int *rank,
                                 double *alpha, uint32_t *targets, bool *use_rslora,
                                 tdm_peft_meta *meta, tdm_error *err)
{
    json_error_t je;
    json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!o) return tdm_fail(err, TDM_ERR_PARSE, "%s:%d:%d: %s", name, je.line, je.column, je.text);
    tdm_status st = TDM_OK;
#define BAD(status, ...)                                                                           \
    do {                                                                                           \
        st = tdm_fail(err, status, __VA_ARGS__);                                                   \
        goto done;                                                                                 \
    } while (0)
    if (!json_is_object(o)) BAD(TDM_ERR_PARSE, "%s: the top level must be a JSON object", name);
    json_t *v = json_object_get(o, "peft_type");
    if (!json_is_string(v))
        BAD(TDM_ERR_PARSE, "%s: \"peft_type\" is missing (expected \"LORA\")", name);
    if (strcmp(json_string_value(v), "LORA") != 0)
        BAD(TDM_ERR_UNSUPPORTED, "%s: peft_type \"%s\" is not supported (tandem trains LORA)", name,
            json_string_value(v));
    v = json_object_get(o, "r");
    if (!json_is_integer(v) || json_integer_value(v) < 1 ||
        json_integer_value(v) > TDM_ADAPTER_RANK_MAX)
        BAD(TDM_ERR_PARSE, "%s: \"r\" must be an integer in 1..%d", name, TDM_ADAPTER_RANK_MAX);
    *rank = (int)json_integer_value(v);
    v = json_object_get(o, "lora_alpha");
    *alpha = 8.0; /* PEFT's default */
    if (v) {
        if (!json_is_number(v) || !(json_number_value(v) > 0) || !isfinite(json_number_value(v)))
            BAD(TDM_ERR_PARSE, "%s: \"lora_alpha\" must be a number > 0", name);
        *alpha = json_number_value(v);
    }
    v = json_object_get(o, "use_rslora");
    *use_rslora = false;
    if (v && !json_is_null(v)) {
        if (!json_is_boolean(v))
            BAD(TDM_ERR_PARSE, "%s: \"use_rslora\" must be true or false", name);
        *use_rslora = json_is_true(v);
    }
    double dropout = 0;
    v = json_object_get(o, "lora_dropout");
    if (v && !json_is_null(v)) {
        if (!json_is_number(v) || json_number_value(v) < 0 || json_number_value(v) >= 1)
            BAD(TDM_ERR_PARSE, "%s: \"lora_dropout\" must be a number in [0, 1)", name);
        dropout = json_number_value(v);
    }
    v = json_object_get(o, "target_modules");
    if (json_is_string(v))
        BAD(TDM_ERR_UNSUPPORTED,
            "%s: target_modules \"%s\" is a regular expression; tandem reads only a list of "
            "projection names (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)",
            name, json_string_value(v));
    if (!json_is_array(v) || json_array_size(v) == 0)
        BAD(TDM_ERR_PARSE, "%s: \"target_modules\" must be a non-empty list of names", name);
    uint32_t mask = 0;
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e)
    {
        if (!json_is_string(e))
            BAD(TDM_ERR_PARSE, "%s: target_modules[%zu] is not a string", name, i);
        const char *s = json_string_value(e);
        tdm_lora_target t;
        if (!tdm_lora_target_parse(s, &t))
            BAD(TDM_ERR_UNSUPPORTED,
                "%s: target module \"%s\" is not supported (tandem adapts q_proj, k_proj, v_proj, "
                "o_proj, gate_proj, up_proj, down_proj)",
                name, s);
        mask |= TDM_LORA_BIT(t);
    }
    *targets = mask;
    v = json_object_get(o, "bias");
    if (v && !json_is_null(v) && !(json_is_string(v) && strcmp(json_string_value(v), "none") == 0))
        BAD(TDM_ERR_UNSUPPORTED, "%s: bias must be \"none\" (tandem trains no biases)", name);
    static const char *const must_be_false[] = {"use_dora", "fan_in_fan_out", "lora_bias"};
    for (size_t k = 0; k < sizeof must_be_false / sizeof *must_be_false; k++) {
        v = json_object_get(o, must_be_false[k]);
        if (v && !json_is_null(v) && !json_is_false(v))
            BAD(TDM_ERR_UNSUPPORTED, "%s: \"%s\" must be false (tandem does not support it)", name,
                must_be_false[k]);
    }
    static const char *const must_be_empty[] = {"rank_pattern",        "alpha_pattern",
                                                "layers_to_transform", "layer_replication",
                                                "modules_to_save",     "layers_pattern"};
    for (size_t k = 0; k < sizeof must_be_empty / sizeof *must_be_empty; k++) {
        v = json_object_get(o, must_be_empty[k]);
        if (!is_null_or_empty(v))
            BAD(TDM_ERR_UNSUPPORTED,
                "%s: \"%s\" must be null or empty (tandem does not support it)", name,
                must_be_empty[k]);
    }
    if (meta) {
        memset(meta, 0, sizeof *meta);
        meta->lora_dropout = dropout;
        v = json_object_get(o, "base_model_name_or_path");
        if (json_is_string(v))
            snprintf(meta->base_model_name_or_path, sizeof meta->base_model_name_or_path, "%s",
                     json_string_value(v));
    }
done:
#undef BAD
    json_decref(o);
    return st;
}

/* dir has no adapter_config.json. When it holds checkpoint-N directories it is the OUT_DIR of a
 * run that has not finished (the final adapter is written at the end): the message names the
 * latest checkpoint to pass instead, or --resume to finish the run. */
static tdm_status no_config(const char *dir, tdm_error *err)
{
    int64_t *steps = NULL;
    size_t n = 0;
    tdm_error lerr = {0};
    if (tdm_checkpoint_list(dir, &steps, &n, &lerr) != TDM_OK || !n) {
        free(steps);
        return tdm_fail(err, TDM_ERR_NOT_FOUND, "%s has no %s: not a PEFT adapter directory",
                        dir, TDM_PEFT_CONFIG_FILE);
    }
    int64_t latest = steps[n - 1];
    free(steps);
    size_t dl = strlen(dir);
    while (dl > 1 && dir[dl - 1] == '/')
        dl--;
    return tdm_fail(err, TDM_ERR_NOT_FOUND,
                    "%s has no %s: not a PEFT adapter directory; it is the OUT_DIR of an "
                    "unfinished run: pass its latest checkpoint, %.*s/" TDM_CHECKPOINT_PREFIX
                    "%" PRId64 ", or finish the run with `tandem finetune ... --resume`",
                    dir, TDM_PEFT_CONFIG_FILE, (int)dl, dir, latest);
}

tdm_status tdm_peft_load(const char *dir, const tdm_model_config *cfg, tdm_lora_params *l,
                         tdm_peft_meta *meta, tdm_error *err)
{
    memset(l, 0, sizeof *l);
    char path[PATH_MAX], name[NAME_CAP];
    snprintf(path, sizeof path, "%s/%s", dir, TDM_PEFT_CONFIG_FILE);
    char *text;
    size_t len;
    tdm_status st = tdm_read_file(path, &text, &len, err);
    if (st == TDM_ERR_NOT_FOUND) return no_config(dir, err);
    if (st != TDM_OK) return st;
    int rank;
    double alpha;
    uint32_t targets;
    bool rslora;
    st = tdm_peft_config_parse(text, len, path, &rank, &alpha, &targets, &rslora, meta, err);
    free(text);
    if (st != TDM_OK) return st;
    st = tdm_lora_params_init(l, cfg, rank, alpha, rslora, targets, err);
    if (st != TDM_OK) return tdm_error_prefix(err, "%s", path);

    snprintf(path, sizeof path, "%s/%s", dir, TDM_PEFT_WEIGHTS_FILE);
    tdm_st_file f = {0};
    st = tdm_st_open(&f, path, err);
    if (st != TDM_OK) {
        tdm_lora_params_free(l);
        if (st == TDM_ERR_NOT_FOUND)
            return tdm_fail(err, st,
                            "%s has no %s (adapter_model.bin is not read: re-save with "
                            "safe_serialization=True)",
                            dir, TDM_PEFT_WEIGHTS_FILE);
        return st;
    }
    size_t used = 0;
    for (size_t i = 0; i < l->n_modules && st == TDM_OK; i++) {
        const tdm_lora_module *m = &l->modules[i];
        for (int b = 0; b < 2 && st == TDM_OK; b++) {
            tdm_lora_params_tensor_name(m, b, name, sizeof name);
            const tdm_st_tensor *t = tdm_st_find(&f, name);
            int64_t r0 = b ? m->out : rank, r1 = b ? rank : m->in;
            if (!t) {
                st = tdm_fail(err, TDM_ERR_INVALID,
                              "%s: tensor %s is missing (the config "
                              "targets %s on every layer)",
                              path, name, tdm_lora_target_name(m->target));
            } else if (t->rank != 2 || t->shape[0] != r0 || t->shape[1] != r1) {
                st = tdm_fail(err, TDM_ERR_INVALID,
                              "%s: tensor %s has shape [%lld%s%lld], expected [%lld, %lld] "
                              "(r = %d and the model's projection size): the adapter does not "
                              "belong to this model",
                              path, name, t->rank > 0 ? (long long)t->shape[0] : 0LL,
                              t->rank > 1 ? ", " : "", t->rank > 1 ? (long long)t->shape[1] : 0LL,
                              (long long)r0, (long long)r1, rank);
            } else if (t->dtype != TDM_DTYPE_F32 && t->dtype != TDM_DTYPE_F16 &&
                       t->dtype != TDM_DTYPE_BF16) {
                st = tdm_fail(err, TDM_ERR_UNSUPPORTED,
                              "%s: tensor %s has dtype %s (F32, F16 "
                              "or BF16 expected)",
                              path, name, tdm_dtype_name(t->dtype));
            } else {
                st = tdm_st_tensor_to_f32(t, b ? m->B : m->A, err);
                used++;
            }
        }
    }
    if (st == TDM_OK && used != f.n_tensors) {
        for (size_t i = 0; i < f.n_tensors; i++) {
            const char *tn = f.tensors[i].name;
            bool expected = false;
            for (size_t k = 0; k < l->n_modules && !expected; k++)
                for (int b = 0; b < 2 && !expected; b++) {
                    tdm_lora_params_tensor_name(&l->modules[k], b, name, sizeof name);
                    expected = strcmp(name, tn) == 0;
                }
            if (!expected) {
                st = tdm_fail(err, TDM_ERR_INVALID,
                              "%s: unexpected tensor %s (the model has %d layers and the config "
                              "names the targets; is this the adapter of another model?)",
                              path, tn, l->num_layers);
                break;
            }
        }
    }
    tdm_st_close(&f);
    if (st != TDM_OK) tdm_lora_params_free(l);
    return st;
}
