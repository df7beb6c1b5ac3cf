/* layout.h — the tensors a supported architecture stores, with their Hugging Face names and
 * shapes, and which of them tandem quantizes to NF4.
 *
 * Per model (V = vocab, H = hidden, I = intermediate, Q = heads * head_dim, K = kv_heads *
 * head_dim, D = head_dim), all row-major [out, in]:
 *   model.embed_tokens.weight                  [V, H]   full precision
 *   model.layers.N.input_layernorm.weight      [H]      full precision
 *   model.layers.N.self_attn.q_proj.weight     [Q, H]   NF4      (.bias [Q] when qkv_bias)
 *   model.layers.N.self_attn.k_proj.weight     [K, H]   NF4      (.bias [K] when qkv_bias)
 *   model.layers.N.self_attn.v_proj.weight     [K, H]   NF4      (.bias [K] when qkv_bias)
 *   model.layers.N.self_attn.o_proj.weight     [H, Q]   NF4      (.bias [H] when o_bias)
 *   model.layers.N.self_attn.q_norm.weight     [D]      Qwen3 only
 *   model.layers.N.self_attn.k_norm.weight     [D]      Qwen3 only
 *   model.layers.N.post_attention_layernorm.weight [H]
 *   model.layers.N.mlp.gate_proj.weight        [I, H]   NF4
 *   model.layers.N.mlp.up_proj.weight          [I, H]   NF4
 *   model.layers.N.mlp.down_proj.weight        [H, I]   NF4
 *   model.norm.weight                          [H]
 *   lm_head.weight                             [V, H]   absent when tie_word_embeddings
 */
#ifndef TANDEM_MODEL_LAYOUT_H
#define TANDEM_MODEL_LAYOUT_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/config.h"
#include "model/weights.h"
#include "util/error.h"

typedef enum tdm_tensor_role {
    TDM_ROLE_EMBED,
    TDM_ROLE_NORM,
    TDM_ROLE_LINEAR, /* a decoder-layer projection weight: quantized to NF4 */
    TDM_ROLE_BIAS,
    TDM_ROLE_LM_HEAD,
} tdm_tensor_role;

typedef struct tdm_tensor_desc {
    char name[96];
    int rank;
    int64_t shape[2];
    tdm_tensor_role role;
    int layer; /* -1 outside the decoder layers */
} tdm_tensor_desc;

/* Fills a malloc'd array with every tensor the config implies, in a fixed order (embedding,
 * then layer by layer, then final norm and lm_head). */
tdm_status tdm_model_layout(const tdm_model_config *cfg, tdm_tensor_desc **out, size_t *n,
                            tdm_error *err);

/* True for the names tandem quantizes: model.layers.N.{self_attn.{q,k,v,o}_proj,
 * mlp.{gate,up,down}_proj}.weight of rank 2. Used where no config is at hand. */
bool tdm_model_tensor_is_quantized(const char *name, int rank);

/* Checks that w holds every tensor of the layout with its exact shape and a float dtype (F32,
 * F16, BF16). On failure the message names the file (the shard holding the tensor, or the
 * index / single file a missing one was looked for in), the tensor, the expected and the found
 * shape or dtype. Weights holding more layers than num_hidden_layers pass with a tdm_warn (the
 * extra layers are not used).
 * n_unused (optional) receives how many tensors of w the layout does not use (a tied lm_head,
 * rotary inv_freq buffers and the like are tolerated). */
tdm_status tdm_model_check_weights(const tdm_model_config *cfg, const tdm_weights *w,
                                   size_t *n_unused, tdm_error *err);

#endif
