#include "train/lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tdm_lora_params_projection_dims(const tdm_model_config *cfg, unsigned target, int64_t *in,
                              int64_t *out)
{
    int64_t h = cfg->hidden_size, inter = cfg->intermediate_size;
    int64_t q = cfg->num_heads * cfg->head_dim, kv = cfg->num_kv_heads * cfg->head_dim;
    switch (target) {
    case 0:
        *in = h;
        *out = q;
        break;
    case 1:
    case 2:
        *in = h;
        *out = kv;
        break;
    case 3:
        *in = q;
        *out = h;
        break;
    case 4:
    case 5:
        *in = h;
        *out = inter;
        break;
    default:
        *in = inter;
        *out = h;
        break;
    }
}

tdm_status tdm_lora_params_init(tdm_lora_params *l, const tdm_model_config *cfg, int rank, double alpha,
                         bool use_rslora, uint32_t targets, tdm_error *err)
{
    memset(l, 0, sizeof *l);
    if (rank < 1 || rank > TDM_ADAPTER_RANK_MAX)
        return tdm_fail(err, TDM_ERR_INVALID, "LoRA rank %d is out of range 1..%d", rank,
                        TDM_ADAPTER_RANK_MAX);
    if (!(alpha > 0) || !isfinite(alpha))
        return tdm_fail(err, TDM_ERR_INVALID, "LoRA alpha %g must be finite and > 0", alpha);
    if (targets == 0 || (targets & ~TDM_ADAPTER_TARGET_ALL))
        return tdm_fail(err, TDM_ERR_INVALID,
                        "LoRA targets 0x%x are not a non-empty subset of "
                        "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
                        targets);
    if (cfg->num_layers < 1 || cfg->num_layers > 100000)
        return tdm_fail(err, TDM_ERR_INVALID, "model has %lld layers", (long long)cfg->num_layers);
    int n_t = __builtin_popcount(targets);
    size_t n_mod = (size_t)cfg->num_layers * (size_t)n_t;
    tdm_lora_module *mods = calloc(n_mod, sizeof *mods);
    if (!mods) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory for %zu LoRA modules", n_mod);
    int64_t off = 0;
    size_t k = 0;
    for (int layer = 0; layer < cfg->num_layers; layer++) {
        for (unsigned t = 0; t < TDM_ADAPTER_TARGET_COUNT; t++) {
            if (!(targets & (1u << t))) continue;
            tdm_lora_module *m = &mods[k++];
            m->layer = layer;
            m->target = t;
            tdm_lora_params_projection_dims(cfg, t, &m->in, &m->out);
            if (m->in < 1 || m->out < 1 || m->in > INT64_MAX / 4 / rank ||
                m->out > INT64_MAX / 4 / rank) {
                long long o = (long long)m->out, i = (long long)m->in;
                free(mods);
                return tdm_fail(err, TDM_ERR_INVALID, "bad projection size %lld x %lld", o, i);
            }
            m->a_offset = off;
            off += (int64_t)rank * m->in;
            m->b_offset = off;
            off += m->out * (int64_t)rank;
            if (off > ((int64_t)1 << 40)) {
                free(mods);
                return tdm_fail(err, TDM_ERR_INVALID, "LoRA adapter too large");
            }
        }
    }
    float *p = calloc((size_t)off, sizeof(float));
    if (!p) {
        free(mods);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory for %lld LoRA parameters",
                        (long long)off);
    }
    for (size_t i = 0; i < n_mod; i++) {
        mods[i].A = p + mods[i].a_offset;
        mods[i].B = p + mods[i].b_offset;
    }
    l->rank = rank;
    l->alpha = alpha;
    l->use_rslora = use_rslora;
    l->scale = use_rslora ? alpha / sqrt((double)rank) : alpha / (double)rank;
    l->targets = targets;
    l->num_layers = (int)cfg->num_layers;
    l->modules = mods;
    l->n_modules = n_mod;
    l->params = p;
    l->n_params = off;
    return TDM_OK;
}

void tdm_lora_params_free(tdm_lora_params *l)
{
    free(l->modules);
    free(l->params);
    memset(l, 0, sizeof *l);
}

void tdm_lora_params_init_peft(tdm_lora_params *l, tdm_rng *rng)
{
    for (size_t i = 0; i < l->n_modules; i++) {
        tdm_lora_module *m = &l->modules[i];
        double bound = 1.0 / sqrt((double)m->in);
        int64_t na = (int64_t)l->rank * m->in;
        for (int64_t j = 0; j < na; j++)
            m->A[j] = (float)((2.0 * tdm_rng_uniform(rng) - 1.0) * bound);
        memset(m->B, 0, (size_t)(m->out * l->rank) * sizeof(float));
    }
}

const tdm_lora_module *tdm_lora_params_find(const tdm_lora_params *l, int layer, unsigned target)
{
    if (layer < 0 || layer >= l->num_layers || target >= TDM_ADAPTER_TARGET_COUNT ||
        !(l->targets & (1u << target)))
        return NULL;
    int n_t = __builtin_popcount(l->targets);
    int before = __builtin_popcount(l->targets & ((1u << target) - 1u));
    return &l->modules[(size_t)layer * (size_t)n_t + (size_t)before];
}

bool tdm_lora_params_tensor_name(const tdm_lora_module *m, bool is_b, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "base_model.model.model.layers.%d.%s.lora_%c.weight", m->layer,
                     tdm_lora_target_path(m->target), is_b ? 'B' : 'A');
    return n > 0 && (size_t)n < cap;
}

tdm_status tdm_lora_params_copy(tdm_lora_params *dst, const tdm_lora_params *src, tdm_error *err)
{
    if (dst->n_params != src->n_params || dst->rank != src->rank || dst->targets != src->targets ||
        dst->num_layers != src->num_layers)
        return tdm_fail(err, TDM_ERR_INVALID, "LoRA adapters have different layouts");
    memcpy(dst->params, src->params, (size_t)src->n_params * sizeof(float));
    return TDM_OK;
}
