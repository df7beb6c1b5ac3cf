#include "model/layout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

/* Appends one tensor: "model.layers.<layer>.<part>" inside a layer, else <part>; b == 0 means
 * a vector of a elements. */
static void add(tdm_tensor_desc *d, size_t *n, tdm_tensor_role role, int layer, int64_t a,
                int64_t b, const char *part)
{
    tdm_tensor_desc *t = &d[(*n)++];
    memset(t, 0, sizeof *t);
    if (layer >= 0)
        snprintf(t->name, sizeof t->name, "model.layers.%d.%s", layer, part);
    else
        snprintf(t->name, sizeof t->name, "%s", part);
    t->role = role;
    t->layer = layer;
    t->rank = b > 0 ? 2 : 1;
    t->shape[0] = a;
    t->shape[1] = b > 0 ? b : 0;
}

tdm_status tdm_model_layout(const tdm_model_config *c, tdm_tensor_desc **out, size_t *n,
                            tdm_error *err)
{
    size_t cap = 3 + (size_t)c->num_layers * 16;
    tdm_tensor_desc *d = calloc(cap, sizeof *d);
    if (!d)
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    size_t k = 0;
    int64_t H = c->hidden_size, I = c->intermediate_size, Q = c->num_heads * c->head_dim,
            K = c->num_kv_heads * c->head_dim, D = c->head_dim;
    add(d, &k, TDM_ROLE_EMBED, -1, c->vocab_size, H, "model.embed_tokens.weight");
    for (int l = 0; l < (int)c->num_layers; l++) {
        add(d, &k, TDM_ROLE_NORM, l, H, 0, "input_layernorm.weight");
        add(d, &k, TDM_ROLE_LINEAR, l, Q, H, "self_attn.q_proj.weight");
        if (c->qkv_bias)
            add(d, &k, TDM_ROLE_BIAS, l, Q, 0, "self_attn.q_proj.bias");
        add(d, &k, TDM_ROLE_LINEAR, l, K, H, "self_attn.k_proj.weight");
        if (c->qkv_bias)
            add(d, &k, TDM_ROLE_BIAS, l, K, 0, "self_attn.k_proj.bias");
        add(d, &k, TDM_ROLE_LINEAR, l, K, H, "self_attn.v_proj.weight");
        if (c->qkv_bias)
            add(d, &k, TDM_ROLE_BIAS, l, K, 0, "self_attn.v_proj.bias");
        add(d, &k, TDM_ROLE_LINEAR, l, H, Q, "self_attn.o_proj.weight");
        if (c->o_bias)
            add(d, &k, TDM_ROLE_BIAS, l, H, 0, "self_attn.o_proj.bias");
        if (c->qk_norm) {
            add(d, &k, TDM_ROLE_NORM, l, D, 0, "self_attn.q_norm.weight");
            add(d, &k, TDM_ROLE_NORM, l, D, 0, "self_attn.k_norm.weight");
        }
        add(d, &k, TDM_ROLE_NORM, l, H, 0, "post_attention_layernorm.weight");
        add(d, &k, TDM_ROLE_LINEAR, l, I, H, "mlp.gate_proj.weight");
        add(d, &k, TDM_ROLE_LINEAR, l, I, H, "mlp.up_proj.weight");
        add(d, &k, TDM_ROLE_LINEAR, l, H, I, "mlp.down_proj.weight");
    }
    add(d, &k, TDM_ROLE_NORM, -1, H, 0, "model.norm.weight");
    if (!c->tie_word_embeddings)
        add(d, &k, TDM_ROLE_LM_HEAD, -1, c->vocab_size, H, "lm_head.weight");
    *out = d;
    *n = k;
    return TDM_OK;
}

bool tdm_model_tensor_is_quantized(const char *name, int rank)
{
    static const char *suffixes[] = {
        ".self_attn.q_proj.weight", ".self_attn.k_proj.weight", ".self_attn.v_proj.weight",
        ".self_attn.o_proj.weight", ".mlp.gate_proj.weight",    ".mlp.up_proj.weight",
        ".mlp.down_proj.weight",
    };
    if (rank != 2 || strncmp(name, "model.layers.", 13) != 0)
        return false;
    const char *p = name + 13;
    if (*p < '0' || *p > '9')
        return false;
    while (*p >= '0' && *p <= '9')
        p++;
    for (size_t i = 0; i < sizeof suffixes / sizeof *suffixes; i++)
        if (!strcmp(p, suffixes[i]))
            return true;
    return false;
}

static void fmt_shape(const int64_t *s, int rank, char *buf, size_t size)
{
    if (rank == 1)
        snprintf(buf, size, "[%lld]", (long long)s[0]);
    else if (rank == 2)
        snprintf(buf, size, "[%lld, %lld]", (long long)s[0], (long long)s[1]);
    else
        snprintf(buf, size, "(rank %d)", rank);
}

/* The file that holds t (a shard of a sharded model), for messages. */
static const char *file_of(const tdm_weights *w, const tdm_st_tensor *t)
{
    for (size_t i = 0; i < w->n_tensors; i++)
        if (w->tensors[i] == t) return w->file_names[w->tensor_file[i]];
    return "?";
}

/* Where a missing tensor was looked for: the index of a sharded model, else its one file. */
static const char *weights_name(const tdm_weights *w)
{
    if (w->index_path) return w->index_path;
    return w->n_files > 0 ? w->file_names[0] : "the weights";
}

/* Layers the weights hold beyond the config's num_hidden_layers (model.layers.N with
 * N >= num_layers) are never loaded: the model trained would be a truncated one. Hugging Face
 * loads such a checkpoint with a warning; so does tandem (tdm_warn), naming both files. */
static void warn_extra_layers(const tdm_model_config *cfg, const tdm_weights *w)
{
    long long top = -1;
    for (size_t i = 0; i < w->n_tensors; i++) {
        const char *name = w->tensors[i]->name;
        if (strncmp(name, "model.layers.", 13) != 0) continue;
        char *end;
        long long layer = strtoll(name + 13, &end, 10);
        if (end != name + 13 && *end == '.' && layer > top) top = layer;
    }
    if (top >= cfg->num_layers)
        tdm_warn(
            "%s holds %lld layers but config.json has num_hidden_layers %lld: layers %lld..%lld "
            "are not used, the model trained is a truncated one (fix num_hidden_layers if "
            "that is not what you want)",
            weights_name(w), top + 1, (long long)cfg->num_layers, (long long)cfg->num_layers, top);
}

tdm_status tdm_model_check_weights(const tdm_model_config *cfg, const tdm_weights *w,
                                   size_t *n_unused, tdm_error *err)
{
    tdm_tensor_desc *d;
    size_t n;
    tdm_status st = tdm_model_layout(cfg, &d, &n, err);
    if (st != TDM_OK) return st;
    for (size_t i = 0; i < n && st == TDM_OK; i++) {
        const tdm_st_tensor *t = tdm_weights_find(w, d[i].name);
        char want[64], got[64];
        fmt_shape(d[i].shape, d[i].rank, want, sizeof want);
        if (!t) {
            st = tdm_fail(err, TDM_ERR_CORRUPT,
                          "%s: tensor \"%s\" %s is missing (%s with this config.json expects it)",
                          weights_name(w), d[i].name, want, cfg->architecture);
            break;
        }
        fmt_shape(t->shape, t->rank, got, sizeof got);
        if (t->rank != d[i].rank || t->shape[0] != d[i].shape[0] ||
            (d[i].rank == 2 && t->shape[1] != d[i].shape[1]))
            st = tdm_fail(err, TDM_ERR_CORRUPT,
                          "%s: tensor \"%s\" has shape %s but config.json implies %s",
                          file_of(w, t), d[i].name, got, want);
        else if (t->dtype != TDM_DTYPE_F32 && t->dtype != TDM_DTYPE_F16 &&
                 t->dtype != TDM_DTYPE_BF16)
            st = tdm_fail(err, TDM_ERR_UNSUPPORTED,
                          "%s: tensor \"%s\" is stored as %s; tandem reads F32, F16 and BF16 "
                          "weights",
                          file_of(w, t), d[i].name, tdm_dtype_name(t->dtype));
    }
    if (st == TDM_OK) warn_extra_layers(cfg, w);
    if (st == TDM_OK && n_unused) *n_unused = w->n_tensors >= n ? w->n_tensors - n : 0;
    free(d);
    return st;
}
