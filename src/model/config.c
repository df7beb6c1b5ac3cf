#include "model/config.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util/atomic_file.h"

static const struct {
    const char *architecture;
    const char *model_type;
    tdm_arch arch;
    int64_t default_max_pos;
} archs[] = {
    {"LlamaForCausalLM", "llama", TDM_ARCH_LLAMA, 2048},
    {"MistralForCausalLM", "mistral", TDM_ARCH_MISTRAL, 131072},
    {"Qwen2ForCausalLM", "qwen2", TDM_ARCH_QWEN2, 32768},
    {"Qwen3ForCausalLM", "qwen3", TDM_ARCH_QWEN3, 32768},
};

const char *tdm_rope_type_name(tdm_rope_type type)
{
    switch (type) {
    case TDM_ROPE_DEFAULT: return "default";
    case TDM_ROPE_LINEAR: return "linear";
    case TDM_ROPE_LLAMA3: return "llama3";
    }
    return "?";
}

/* A positive integer field; absent gives def (or an error when def < 0). */
static tdm_status get_int(json_t *root, const char *key, int64_t def, int64_t *out,
                          const char *name, tdm_error *err)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        if (def < 0)
            return tdm_fail(err, TDM_ERR_PARSE, "%s: missing \"%s\"", name, key);
        *out = def;
        return TDM_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) <= 0 ||
        json_integer_value(v) > (json_int_t)1 << 40)
        return tdm_fail(err, TDM_ERR_PARSE, "%s: \"%s\" must be a positive integer", name, key);
    *out = json_integer_value(v);
    return TDM_OK;
}

static tdm_status get_num(json_t *obj, const char *key, double def, double *out,
                          const char *name, const char *where, tdm_error *err)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (isnan(def))
            return tdm_fail(err, TDM_ERR_PARSE, "%s: missing \"%s\"%s", name, key, where);
        *out = def;
        return TDM_OK;
    }
    if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) <= 0)
        return tdm_fail(err, TDM_ERR_PARSE, "%s: \"%s\"%s must be a positive number", name, key,
                        where);
    *out = json_number_value(v);
    return TDM_OK;
}

static tdm_status get_bool(json_t *root, const char *key, bool def, bool *out, const char *name,
                           tdm_error *err)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return TDM_OK;
    }
    if (!json_is_boolean(v))
        return tdm_fail(err, TDM_ERR_PARSE, "%s: \"%s\" must be true or false", name, key);
    *out = json_is_true(v);
    return TDM_OK;
}

static int64_t get_token_id(json_t *root, const char *key)
{
    json_t *v = json_object_get(root, key);
    if (json_is_array(v))
        v = json_array_get(v, 0);
    return json_is_integer(v) && json_integer_value(v) >= 0 ? json_integer_value(v) : -1;
}

static tdm_status parse_rope(tdm_model_config *cfg, json_t *root, const char *name,
                             tdm_error *err)
{
    tdm_rope *r = &cfg->rope;
    memset(r, 0, sizeof *r);
    r->factor = 1.0;
    tdm_status st = get_num(root, "rope_theta", 10000.0, &r->theta, name, "", err);
    if (st != TDM_OK)
        return st;
    json_t *params = json_object_get(root, "rope_parameters");
    const char *where = " in rope_parameters";
    if (!params || json_is_null(params)) {
        params = json_object_get(root, "rope_scaling");
        where = " in rope_scaling";
    } else if (json_is_object(params) && json_object_get(params, "rope_theta")) {
        st = get_num(params, "rope_theta", NAN, &r->theta, name, where, err);
        if (st != TDM_OK)
            return st;
    }
    if (!params || json_is_null(params))
        return TDM_OK;
    if (!json_is_object(params))
        return tdm_fail(err, TDM_ERR_PARSE, "%s: \"%s\" must be an object or null", name,
                        where + 4);
    json_t *type = json_object_get(params, "rope_type");
    if (!type)
        type = json_object_get(params, "type");
    if (!type || json_is_null(type))
        return TDM_OK;
    if (!json_is_string(type))
        return tdm_fail(err, TDM_ERR_PARSE, "%s: rope_type%s must be a string", name, where);
    const char *t = json_string_value(type);
    if (!strcmp(t, "default"))
        return TDM_OK;
    if (!strcmp(t, "linear")) {
        r->type = TDM_ROPE_LINEAR;
        return get_num(params, "factor", NAN, &r->factor, name, where, err);
    }
    if (!strcmp(t, "llama3")) {
        r->type = TDM_ROPE_LLAMA3;
        if ((st = get_num(params, "factor", NAN, &r->factor, name, where, err)) != TDM_OK ||
            (st = get_num(params, "low_freq_factor", NAN, &r->low_freq_factor, name, where,
                          err)) != TDM_OK ||
            (st = get_num(params, "high_freq_factor", NAN, &r->high_freq_factor, name, where,
                          err)) != TDM_OK)
            return st;
        if ((st = get_int(params, "original_max_position_embeddings", -1,
                          &r->original_max_position_embeddings, name, err)) != TDM_OK)
            return tdm_error_prefix(err, "rope scaling");
        if (r->high_freq_factor <= r->low_freq_factor)
            return tdm_fail(err, TDM_ERR_PARSE,
                            "%s: llama3 rope scaling needs high_freq_factor (%g) > "
                            "low_freq_factor (%g)",
                            name, r->high_freq_factor, r->low_freq_factor);
        return TDM_OK;
    }
    return tdm_fail(err, TDM_ERR_UNSUPPORTED,
                    "%s: RoPE scaling type \"%s\" is not supported (supported: default, linear, "
                    "llama3)",
                    name, t);
}

static tdm_status refuse_unsupported(const tdm_model_config *cfg, json_t *root, const char *name,
                                     tdm_error *err)
{
    static const char *moe_keys[] = {"num_experts", "num_local_experts", "n_routed_experts"};
    for (size_t i = 0; i < sizeof moe_keys / sizeof *moe_keys; i++) {
        json_t *v = json_object_get(root, moe_keys[i]);
        if (json_is_integer(v) && json_integer_value(v) > 0)
            return tdm_fail(err, TDM_ERR_UNSUPPORTED,
                            "%s: mixture of experts (%s = %lld) is not supported", name,
                            moe_keys[i], (long long)json_integer_value(v));
    }
    json_t *q = json_object_get(root, "quantization_config");
    if (q && !json_is_null(q)) {
        json_t *m = json_object_get(q, "quant_method");
        return tdm_fail(err, TDM_ERR_UNSUPPORTED,
                        "%s: pre-quantized checkpoint (quantization_config, method %s) is not "
                        "supported: give tandem the full-precision model, it quantizes itself",
                        name, json_is_string(m) ? json_string_value(m) : "unknown");
    }
    json_t *act = json_object_get(root, "hidden_act");
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0))
        return tdm_fail(err, TDM_ERR_UNSUPPORTED,
                        "%s: hidden_act \"%s\" is not supported (only silu)", name,
                        json_is_string(act) ? json_string_value(act) : "?");
    json_t *mlp_bias = json_object_get(root, "mlp_bias");
    if (json_is_true(mlp_bias))
        return tdm_fail(err, TDM_ERR_UNSUPPORTED, "%s: mlp_bias true is not supported", name);
    if (json_is_true(json_object_get(root, "use_sliding_window")))
        return tdm_fail(err, TDM_ERR_UNSUPPORTED,
                        "%s: sliding-window attention (use_sliding_window true) is not supported",
                        name);
    json_t *types = json_object_get(root, "layer_types");
    size_t i;
    json_t *lt;
    json_array_foreach(types, i, lt) {
        if (json_is_string(lt) && strcmp(json_string_value(lt), "full_attention") != 0)
            return tdm_fail(err, TDM_ERR_UNSUPPORTED,
                            "%s: layer_types[%zu] is \"%s\": only full attention is supported",
                            name, i, json_string_value(lt));
    }
    if (cfg->arch == TDM_ARCH_MISTRAL) {
        json_t *sw = json_object_get(root, "sliding_window");
        if (json_is_integer(sw) && json_integer_value(sw) < cfg->max_position_embeddings)
            return tdm_fail(err, TDM_ERR_UNSUPPORTED,
                            "%s: sliding_window %lld is below max_position_embeddings %lld: "
                            "sliding-window attention is not supported",
                            name, (long long)json_integer_value(sw),
                            (long long)cfg->max_position_embeddings);
    }
    return TDM_OK;
}

static tdm_status parse_root(tdm_model_config *cfg, json_t *root, const char *name,
                             tdm_error *err)
{
    memset(cfg, 0, sizeof *cfg);
    if (!json_is_object(root))
        return tdm_fail(err, TDM_ERR_PARSE, "%s: not a JSON object", name);
    json_t *archs_json = json_object_get(root, "architectures");
    json_t *a0 = json_array_get(archs_json, 0);
    if (!json_is_string(a0))
        return tdm_fail(err, TDM_ERR_PARSE,
                        "%s: missing \"architectures\" (a list naming e.g. Qwen2ForCausalLM)",
                        name);
    const char *arch = json_string_value(a0);
    size_t k;
    for (k = 0; k < sizeof archs / sizeof *archs; k++)
        if (!strcmp(archs[k].architecture, arch))
            break;
    if (k == sizeof archs / sizeof *archs)
        return tdm_fail(err, TDM_ERR_UNSUPPORTED,
                        "%s: architecture \"%s\" is not supported (supported: LlamaForCausalLM, "
                        "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)",
                        name, arch);
    cfg->arch = archs[k].arch;
    snprintf(cfg->architecture, sizeof cfg->architecture, "%s", archs[k].architecture);
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", archs[k].model_type);
    json_t *mt = json_object_get(root, "model_type");
    if (json_is_string(mt) && strcmp(json_string_value(mt), archs[k].model_type) != 0)
        return tdm_fail(err, TDM_ERR_PARSE,
                        "%s: model_type \"%s\" does not match architecture %s (expects \"%s\")",
                        name, json_string_value(mt), arch, archs[k].model_type);

    tdm_status st;
    if ((st = get_int(root, "hidden_size", -1, &cfg->hidden_size, name, err)) ||
        (st = get_int(root, "intermediate_size", -1, &cfg->intermediate_size, name, err)) ||
        (st = get_int(root, "num_hidden_layers", -1, &cfg->num_layers, name, err)) ||
        (st = get_int(root, "num_attention_heads", -1, &cfg->num_heads, name, err)) ||
        (st = get_int(root, "num_key_value_heads", cfg->num_heads, &cfg->num_kv_heads, name,
                      err)) ||
        (st = get_int(root, "vocab_size", -1, &cfg->vocab_size, name, err)) ||
        (st = get_int(root, "max_position_embeddings", archs[k].default_max_pos,
                      &cfg->max_position_embeddings, name, err)))
        return st;
    if (cfg->hidden_size % cfg->num_heads != 0 && !json_object_get(root, "head_dim"))
        return tdm_fail(err, TDM_ERR_PARSE,
                        "%s: hidden_size %lld is not a multiple of num_attention_heads %lld and "
                        "no head_dim is given",
                        name, (long long)cfg->hidden_size, (long long)cfg->num_heads);
    if ((st = get_int(root, "head_dim", cfg->hidden_size / cfg->num_heads, &cfg->head_dim, name,
                      err)))
        return st;
    /* Bounds far above any real model that keep every size product within int64. */
    static const struct {
        const char *name;
        size_t off;
        int64_t max;
    } limits[] = {
        {"hidden_size", offsetof(tdm_model_config, hidden_size), (int64_t)1 << 20},
        {"intermediate_size", offsetof(tdm_model_config, intermediate_size), (int64_t)1 << 20},
        {"num_hidden_layers", offsetof(tdm_model_config, num_layers), (int64_t)1 << 12},
        {"num_attention_heads", offsetof(tdm_model_config, num_heads), (int64_t)1 << 14},
        {"head_dim", offsetof(tdm_model_config, head_dim), (int64_t)1 << 14},
        {"vocab_size", offsetof(tdm_model_config, vocab_size), (int64_t)1 << 24},
    };
    for (size_t i = 0; i < sizeof limits / sizeof *limits; i++) {
        int64_t v = *(const int64_t *)((const char *)cfg + limits[i].off);
        if (v > limits[i].max)
            return tdm_fail(err, TDM_ERR_UNSUPPORTED, "%s: %s %lld exceeds tandem's limit %lld",
                            name, limits[i].name, (long long)v, (long long)limits[i].max);
    }
    if (cfg->num_heads * cfg->head_dim > (int64_t)1 << 20)
        return tdm_fail(err, TDM_ERR_UNSUPPORTED,
                        "%s: num_attention_heads * head_dim = %lld exceeds tandem's limit %lld",
                        name, (long long)(cfg->num_heads * cfg->head_dim), (long long)1 << 20);
    if (cfg->num_heads % cfg->num_kv_heads != 0)
        return tdm_fail(err, TDM_ERR_PARSE,
                        "%s: num_attention_heads %lld is not a multiple of num_key_value_heads "
                        "%lld",
                        name, (long long)cfg->num_heads, (long long)cfg->num_kv_heads);
    if (cfg->head_dim % 2 != 0)
        return tdm_fail(err, TDM_ERR_PARSE, "%s: head_dim %lld is odd (RoPE needs pairs)", name,
                        (long long)cfg->head_dim);
    if ((st = get_num(root, "rms_norm_eps", 1e-6, &cfg->rms_norm_eps, name, "", err)) ||
        (st = get_bool(root, "tie_word_embeddings", false, &cfg->tie_word_embeddings, name,
                       err)))
        return st;
    bool attention_bias = false;
    if ((st = get_bool(root, "attention_bias", false, &attention_bias, name, err)))
        return st;
    switch (cfg->arch) {
    case TDM_ARCH_LLAMA:
    case TDM_ARCH_QWEN3:
        cfg->qkv_bias = cfg->o_bias = attention_bias;
        break;
    case TDM_ARCH_MISTRAL:
        break;
    case TDM_ARCH_QWEN2:
        cfg->qkv_bias = true;
        break;
    }
    cfg->qk_norm = cfg->arch == TDM_ARCH_QWEN3;
    if ((st = parse_rope(cfg, root, name, err)))
        return st;
    json_t *dt = json_object_get(root, "torch_dtype");
    if (!json_is_string(dt))
        dt = json_object_get(root, "dtype");
    if (json_is_string(dt))
        snprintf(cfg->torch_dtype, sizeof cfg->torch_dtype, "%s", json_string_value(dt));
    cfg->bos_token_id = get_token_id(root, "bos_token_id");
    cfg->eos_token_id = get_token_id(root, "eos_token_id");
    return refuse_unsupported(cfg, root, name, err);
}

tdm_status tdm_model_config_parse(tdm_model_config *cfg, const char *text, size_t len,
                                  const char *name, tdm_error *err)
{
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        memset(cfg, 0, sizeof *cfg);
        return tdm_fail(err, TDM_ERR_PARSE, "%s:%d:%d: %s", name, jerr.line, jerr.column,
                        jerr.text);
    }
    tdm_status st = parse_root(cfg, root, name, err);
    json_decref(root);
    return st;
}

tdm_status tdm_model_config_load(tdm_model_config *cfg, const char *path, tdm_error *err)
{
    char file[PATH_MAX];
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        if (snprintf(file, sizeof file, "%s/config.json", path) >= (int)sizeof file)
            return tdm_fail(err, TDM_ERR_INVALID, "path too long: %s", path);
    } else if (snprintf(file, sizeof file, "%s", path) >= (int)sizeof file)
        return tdm_fail(err, TDM_ERR_INVALID, "path too long: %s", path);
    char *text;
    size_t len;
    tdm_status st = tdm_read_file(file, &text, &len, err);
    if (st != TDM_OK)
        return st;
    st = tdm_model_config_parse(cfg, text, len, file, err);
    free(text);
    return st;
}

int64_t tdm_model_config_param_count(const tdm_model_config *c)
{
    int64_t h = c->hidden_size, q = c->num_heads * c->head_dim, kv = c->num_kv_heads * c->head_dim;
    int64_t layer = h * q + 2 * h * kv + q * h + 3 * h * c->intermediate_size + 2 * h;
    if (c->qkv_bias)
        layer += q + 2 * kv;
    if (c->o_bias)
        layer += h;
    if (c->qk_norm)
        layer += 2 * c->head_dim;
    int64_t total = c->vocab_size * h + c->num_layers * layer + h;
    if (!c->tie_word_embeddings)
        total += c->vocab_size * h;
    return total;
}

tdm_status tdm_model_config_to_json(const tdm_model_config *c, char **out, tdm_error *err)
{
    json_t *r = json_object();
    json_t *archs_json = json_array();
    json_array_append_new(archs_json, json_string(c->architecture));
    json_object_set_new(r, "architectures", archs_json);
    json_object_set_new(r, "model_type", json_string(c->model_type));
    json_object_set_new(r, "hidden_size", json_integer(c->hidden_size));
    json_object_set_new(r, "intermediate_size", json_integer(c->intermediate_size));
    json_object_set_new(r, "num_hidden_layers", json_integer(c->num_layers));
    json_object_set_new(r, "num_attention_heads", json_integer(c->num_heads));
    json_object_set_new(r, "num_key_value_heads", json_integer(c->num_kv_heads));
    json_object_set_new(r, "head_dim", json_integer(c->head_dim));
    json_object_set_new(r, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(r, "max_position_embeddings", json_integer(c->max_position_embeddings));
    json_object_set_new(r, "rms_norm_eps", json_real(c->rms_norm_eps));
    json_object_set_new(r, "tie_word_embeddings", json_boolean(c->tie_word_embeddings));
    json_object_set_new(r, "hidden_act", json_string("silu"));
    json_object_set_new(r, "initializer_range", json_real(0.02));
    if (c->arch == TDM_ARCH_LLAMA || c->arch == TDM_ARCH_QWEN3) {
        json_object_set_new(r, "attention_bias", json_boolean(c->qkv_bias));
        json_object_set_new(r, "attention_dropout", json_real(0.0));
    }
    if (c->arch == TDM_ARCH_LLAMA)
        json_object_set_new(r, "mlp_bias", json_false());
    if (c->arch == TDM_ARCH_QWEN2 || c->arch == TDM_ARCH_QWEN3)
        json_object_set_new(r, "use_sliding_window", json_false());
    if (c->arch == TDM_ARCH_MISTRAL)
        json_object_set_new(r, "sliding_window", json_null());
    json_object_set_new(r, "rope_theta", json_real(c->rope.theta));
    if (c->rope.type == TDM_ROPE_DEFAULT) {
        json_object_set_new(r, "rope_scaling", json_null());
    } else {
        json_t *s = json_object();
        json_object_set_new(s, "rope_type", json_string(tdm_rope_type_name(c->rope.type)));
        json_object_set_new(s, "factor", json_real(c->rope.factor));
        if (c->rope.type == TDM_ROPE_LLAMA3) {
            json_object_set_new(s, "low_freq_factor", json_real(c->rope.low_freq_factor));
            json_object_set_new(s, "high_freq_factor", json_real(c->rope.high_freq_factor));
            json_object_set_new(s, "original_max_position_embeddings",
                                json_integer(c->rope.original_max_position_embeddings));
        }
        json_object_set_new(r, "rope_scaling", s);
    }
    if (c->torch_dtype[0])
        json_object_set_new(r, "torch_dtype", json_string(c->torch_dtype));
    if (c->bos_token_id >= 0)
        json_object_set_new(r, "bos_token_id", json_integer(c->bos_token_id));
    if (c->eos_token_id >= 0)
        json_object_set_new(r, "eos_token_id", json_integer(c->eos_token_id));
    json_object_set_new(r, "use_cache", json_true());
    *out = json_dumps(r, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
    json_decref(r);
    if (!*out)
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory encoding config.json");
    return TDM_OK;
}
