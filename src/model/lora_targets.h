/* lora_targets.h — the projections of a decoder layer that LoRA can target: the one table of
 * their index, PEFT module name ("q_proj") and Hugging Face path inside a layer
 * ("self_attn.q_proj"). Every other place (engine, trainer, adapters.toml, PEFT files, the
 * co-training protocol) takes names and paths from here. Bit t of a target mask is target t. */
#ifndef TANDEM_MODEL_LORA_TARGETS_H
#define TANDEM_MODEL_LORA_TARGETS_H
#include <stdbool.h>
#include <stddef.h>

typedef enum tdm_lora_target {
    TDM_LORA_Q,    /* self_attn.q_proj  in H, out heads*head_dim */
    TDM_LORA_K,    /* self_attn.k_proj  in H, out kv_heads*head_dim */
    TDM_LORA_V,    /* self_attn.v_proj  in H, out kv_heads*head_dim */
    TDM_LORA_O,    /* self_attn.o_proj  in heads*head_dim, out H */
    TDM_LORA_GATE, /* mlp.gate_proj     in H, out I */
    TDM_LORA_UP,   /* mlp.up_proj       in H, out I */
    TDM_LORA_DOWN, /* mlp.down_proj     in I, out H */
    TDM_LORA_N_TARGETS
} tdm_lora_target;
#define TDM_LORA_BIT(t) (1u << (t))
#define TDM_LORA_ALL ((1u << TDM_LORA_N_TARGETS) - 1u)

/* The PEFT module names in target order ("q_proj" ... "down_proj"), e.g. for tdm_suggest. */
extern const char *const tdm_lora_target_names[TDM_LORA_N_TARGETS];

/* "q_proj" for target 0 ... "down_proj" for target 6; NULL outside 0..TDM_LORA_N_TARGETS-1. */
const char *tdm_lora_target_name(unsigned target);
/* "self_attn.q_proj" ... "mlp.down_proj"; NULL outside 0..TDM_LORA_N_TARGETS-1. */
const char *tdm_lora_target_path(unsigned target);
/* The targets of mask, comma-separated in target order as --targets takes them
 * ("q_proj,v_proj"), into buf[cap] (cut to fit; 64 bytes hold all seven). */
void tdm_lora_targets_format(unsigned mask, char *buf, size_t cap);
/* The target named name[0..len) ("q_proj" etc.); false when unknown. */
bool tdm_lora_target_parse_n(const char *name, size_t len, tdm_lora_target *out);
/* Same for a NUL-terminated name; false when unknown or NULL. */
bool tdm_lora_target_parse(const char *name, tdm_lora_target *out);

#endif
