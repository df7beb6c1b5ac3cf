/* lora_targets.c — the one table of LoRA target projections (see lora_targets.h). */
#include "model/lora_targets.h"

#include <stdio.h>
#include <string.h>

const char *const tdm_lora_target_names[TDM_LORA_N_TARGETS] = {
    [TDM_LORA_Q] = "q_proj",       [TDM_LORA_K] = "k_proj",       [TDM_LORA_V] = "v_proj",
    [TDM_LORA_O] = "o_proj",       [TDM_LORA_GATE] = "gate_proj", [TDM_LORA_UP] = "up_proj",
    [TDM_LORA_DOWN] = "down_proj",
};

/* The module that holds each projection inside a decoder layer. */
static const char *const target_paths[TDM_LORA_N_TARGETS] = {
    [TDM_LORA_Q] = "self_attn.q_proj", [TDM_LORA_K] = "self_attn.k_proj",
    [TDM_LORA_V] = "self_attn.v_proj", [TDM_LORA_O] = "self_attn.o_proj",
    [TDM_LORA_GATE] = "mlp.gate_proj", [TDM_LORA_UP] = "mlp.up_proj",
    [TDM_LORA_DOWN] = "mlp.down_proj",
};

const char *tdm_lora_target_name(unsigned target)
{
    return target < TDM_LORA_N_TARGETS ? tdm_lora_target_names[target] : NULL;
}

const char *tdm_lora_target_path(unsigned target)
{
    return target < TDM_LORA_N_TARGETS ? target_paths[target] : NULL;
}

void tdm_lora_targets_format(unsigned mask, char *buf, size_t cap)
{
    size_t used = 0;
    if (cap) buf[0] = '\0';
    for (unsigned t = 0; t < TDM_LORA_N_TARGETS; t++) {
        if (!(mask & TDM_LORA_BIT(t)) || used >= cap) continue;
        int w = snprintf(buf + used, cap - used, "%s%s", used ? "," : "", tdm_lora_target_names[t]);
        if (w > 0) used += (size_t)w;
    }
}

bool tdm_lora_target_parse_n(const char *name, size_t len, tdm_lora_target *out)
{
    for (unsigned t = 0; t < TDM_LORA_N_TARGETS; t++)
        if (strlen(tdm_lora_target_names[t]) == len &&
            !memcmp(tdm_lora_target_names[t], name, len)) {
            *out = (tdm_lora_target)t;
            return true;
        }
    return false;
}

bool tdm_lora_target_parse(const char *name, tdm_lora_target *out)
{
    return name && tdm_lora_target_parse_n(name, strlen(name), out);
}
