/* config.h — the Hugging Face config.json of the decoder-only models tandem trains.
 *
 * Supported architectures (config "architectures"[0]):
 *   LlamaForCausalLM    (model_type "llama";   attention_bias puts biases on q, k, v and o)
 *   MistralForCausalLM  (model_type "mistral"; no biases; a sliding window in use is refused)
 *   Qwen2ForCausalLM    (model_type "qwen2";   biases on q, k, v, none on o)
 *   Qwen3ForCausalLM    (model_type "qwen3";   RMSNorm over head_dim on q and k, explicit head_dim)
 * Fields read (HF defaults when absent in brackets): hidden_size, intermediate_size,
 * num_hidden_layers, num_attention_heads, num_key_value_heads [= num_attention_heads],
 * head_dim [hidden_size / num_attention_heads; null counts as absent], vocab_size,
 * max_position_embeddings [2048 llama, 131072 mistral, 32768 qwen], rms_norm_eps [1e-6],
 * tie_word_embeddings [false], attention_bias [false], mlp_bias [false], hidden_act ["silu"],
 * torch_dtype or dtype, bos_token_id, eos_token_id (the first one when a list).
 * RoPE: theta from rope_parameters.rope_theta (transformers >= 5) or the top-level rope_theta
 * [10000]; scaling from rope_parameters or rope_scaling, key "rope_type" (or the older "type"):
 * "default", "linear" (factor) and "llama3" (factor, low_freq_factor, high_freq_factor,
 * original_max_position_embeddings). Refused by name: other architectures, other RoPE types,
 * sliding-window attention in use (use_sliding_window true, a "sliding_attention" layer type,
 * or Mistral's sliding_window below max_position_embeddings), mixture of experts (num_experts,
 * num_local_experts, n_routed_experts > 0), mlp_bias, hidden_act other than silu, and
 * pre-quantized checkpoints (quantization_config).
 */
#ifndef TANDEM_MODEL_CONFIG_H
#define TANDEM_MODEL_CONFIG_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

typedef enum tdm_arch {
    TDM_ARCH_LLAMA,
    TDM_ARCH_MISTRAL,
    TDM_ARCH_QWEN2,
    TDM_ARCH_QWEN3,
} tdm_arch;

typedef enum tdm_rope_type {
    TDM_ROPE_DEFAULT,
    TDM_ROPE_LINEAR, /* inv_freq / factor */
    TDM_ROPE_LLAMA3, /* wavelength-band rescaling of inv_freq (ENGINE.md) */
} tdm_rope_type;

typedef struct tdm_rope {
    tdm_rope_type type;
    double theta;                             /* base of inv_freq[i] = theta^(-2i/head_dim) */
    double factor;                            /* linear, llama3 (1 for default) */
    double low_freq_factor, high_freq_factor; /* llama3 */
    int64_t original_max_position_embeddings; /* llama3 */
} tdm_rope;

typedef struct tdm_model_config {
    tdm_arch arch;
    char architecture[64]; /* "Qwen2ForCausalLM" */
    char model_type[32];   /* "qwen2" */
    int64_t hidden_size;
    int64_t intermediate_size;
    int64_t num_layers;
    int64_t num_heads;
    int64_t num_kv_heads; /* GQA: query head h uses KV head h / (num_heads / num_kv_heads) */
    int64_t head_dim;
    int64_t vocab_size;
    int64_t max_position_embeddings;
    double rms_norm_eps;
    bool tie_word_embeddings; /* lm_head.weight absent: the output uses embed_tokens.weight */
    bool qkv_bias;            /* q_proj, k_proj, v_proj have .bias */
    bool o_bias;              /* o_proj has .bias */
    bool qk_norm;             /* self_attn.q_norm / k_norm (Qwen3) */
    tdm_rope rope;
    char torch_dtype[16]; /* "bfloat16", "" when absent */
    int64_t bos_token_id; /* -1 when absent */
    int64_t eos_token_id; /* -1 when absent */
} tdm_model_config;

/* Loads PATH/config.json when path is a directory, else path itself. Errors name the file (and
 * LINE:COLUMN for JSON syntax errors) and the field: TDM_ERR_NOT_FOUND, TDM_ERR_PARSE (malformed
 * or missing field), TDM_ERR_INVALID (inconsistent sizes), TDM_ERR_UNSUPPORTED (see above). */
tdm_status tdm_model_config_load(tdm_model_config *cfg, const char *path, tdm_error *err);

/* Same from text in memory; name is used in messages. */
tdm_status tdm_model_config_parse(tdm_model_config *cfg, const char *text, size_t len,
                                  const char *name, tdm_error *err);

/* Writes cfg as a config.json document a Hugging Face loader accepts (malloc'd string). */
tdm_status tdm_model_config_to_json(const tdm_model_config *cfg, char **out, tdm_error *err);

/* Number of parameters the architecture has with these sizes (tied lm_head counted once). */
int64_t tdm_model_config_param_count(const tdm_model_config *cfg);

const char *tdm_rope_type_name(tdm_rope_type type);

#endif
