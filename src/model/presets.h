/* presets.h — model shapes `tandem init-model --preset NAME` can build with random weights.
 *
 * The real models' config.json sizes (hidden, intermediate, layers, heads, KV heads, head_dim,
 * vocab, RoPE, norms, tying), so memory and speed measured on a random model hold for the real
 * one; and tiny variants of each family (a few million parameters) for tests and laptops:
 *   tiny          Qwen2ForCausalLM, hidden 256, 4 layers, 4 heads / 2 KV heads, vocab 320
 *   tiny-llama    LlamaForCausalLM with llama3 RoPE scaling, untied lm_head
 *   tiny-qwen3    Qwen3ForCausalLM (q/k norms, head_dim 64)
 *   tiny-mistral  MistralForCausalLM
 *   qwen2.5-0.5b, qwen2.5-1.5b, qwen2.5-7b, qwen3-0.6b, llama3.2-1b
 */
#ifndef TANDEM_MODEL_PRESETS_H
#define TANDEM_MODEL_PRESETS_H
#include <stddef.h>

#include "model/config.h"
#include "util/error.h"

typedef struct tdm_preset_info {
    const char *name;
    const char *summary;
} tdm_preset_info;

/* The table of presets (n entries). */
const tdm_preset_info *tdm_presets(size_t *n);

/* Fills cfg for the named preset; TDM_ERR_NOT_FOUND (naming the known ones) otherwise. */
tdm_status tdm_preset_config(const char *name, tdm_model_config *cfg, tdm_error *err);

#endif
