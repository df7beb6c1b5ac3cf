/* lora.h — one LoRA adapter's parameters on the host, in fp32.
 *
 * For every decoder layer l (0..num_layers) and every targeted projection t (in the order
 * q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, i.e. tdm_adapter_target bit
 * order) the adapter holds
 *     A  (r, in)   f32 row-major     "lora_A.weight" in PEFT
 *     B  (out, r)  f32 row-major     "lora_B.weight" in PEFT
 * and the projection computes  y = x W^T + b + scale * (x A^T) B^T  with
 *     scale = alpha / r            (PEFT default)
 *     scale = alpha / sqrt(r)      (use_rslora)
 * Projection sizes (H hidden, I intermediate, Q = heads*head_dim, K = kv_heads*head_dim):
 *     q (in H, out Q)  k, v (in H, out K)  o (in Q, out H)  gate, up (in H, out I)  down (in I, out
 * H)
 *
 * Memory (llm.c style): all parameters live in ONE allocation, `params` (n_params floats). The
 * modules are laid out layer-major, then target order, and within a module A then B:
 *     params = [ L0.q.A | L0.q.B | L0.k.A | L0.k.B | ... | L0.down.B | L1.q.A | ... ]
 * Each module records its offsets, so a gradient or optimizer-state array of n_params floats has
 * the same layout (the flat view the optimizer and the backends use).
 *
 * PEFT initialisation (tdm_lora_params_init_peft): B = 0 and every A element drawn as
 *     A[i] = (float)((2 u - 1) * bound),  u = tdm_rng_uniform(rng) in [0, 1),  bound = 1/sqrt(in)
 * which is kaiming_uniform_(a = sqrt(5)) on a (r, in) tensor: gain sqrt(2 / (1 + 5)),
 * bound = gain * sqrt(3 / fan_in) = 1 / sqrt(in). Draw order: modules in the layout order above,
 * each A row-major (element [j][k] is draw number offset + j*in + k); B draws nothing. So the
 * same seed and the same (config, rank, targets) give the same bits everywhere, and the stream
 * position after init is fixed (n_A draws), which resume relies on.
 */
#ifndef TANDEM_TRAIN_LORA_H
#define TANDEM_TRAIN_LORA_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/config.h"
#include "train/adapters_config.h"
#include "util/error.h"
#include "util/rng.h"

typedef struct tdm_lora_module {
    int layer;        /* decoder layer index */
    unsigned target;  /* bit index 0..6 of tdm_adapter_target (tdm_lora_target_name) */
    int64_t in, out;  /* the projection's in_features, out_features */
    int64_t a_offset; /* offset of A in the flat parameter array, (r, in) */
    int64_t b_offset; /* offset of B, (out, r) */
    float *A;         /* = params + a_offset */
    float *B;         /* = params + b_offset */
} tdm_lora_module;

typedef struct tdm_lora_params {
    int rank;         /* r */
    double alpha;     /* lora_alpha */
    bool use_rslora;  /* scale = alpha / sqrt(r) instead of alpha / r */
    double scale;     /* alpha / r or alpha / sqrt(r), computed in double */
    uint32_t targets; /* bit set of tdm_adapter_target */
    int num_layers;
    tdm_lora_module *modules; /* (n_modules) layer-major, target order */
    size_t n_modules;
    float *params; /* (n_params) f32: every A and B, the one allocation */
    int64_t n_params;
} tdm_lora_params;

/* in/out features of projection `target` (bit index) of a model with config cfg. */
void tdm_lora_params_projection_dims(const tdm_model_config *cfg, unsigned target, int64_t *in,
                              int64_t *out);

/* Lays out and allocates an adapter for cfg with the given rank (1..TDM_ADAPTER_RANK_MAX),
 * alpha (finite, > 0), rslora flag and targets (non-empty subset of TDM_ADAPTER_TARGET_ALL).
 * Parameters start at zero. TDM_ERR_INVALID for bad arguments, TDM_ERR_NOMEM. On failure l is
 * zeroed. */
tdm_status tdm_lora_params_init(tdm_lora_params *l, const tdm_model_config *cfg, int rank, double alpha,
                         bool use_rslora, uint32_t targets, tdm_error *err);

/* Frees l's memory and zeroes it; a zeroed l is fine. */
void tdm_lora_params_free(tdm_lora_params *l);

/* PEFT's initialisation (see the header comment): A ~ U(-1/sqrt(in), 1/sqrt(in)), B = 0, drawing
 * from rng in the documented order. */
void tdm_lora_params_init_peft(tdm_lora_params *l, tdm_rng *rng);

/* The module of (layer, target bit), or NULL when the adapter does not target it. */
const tdm_lora_module *tdm_lora_params_find(const tdm_lora_params *l, int layer, unsigned target);

/* PEFT tensor name of a module's A (is_b false) or B:
 * "base_model.model.model.layers.{layer}.{path}.lora_{A|B}.weight". Returns false when it does
 * not fit in cap bytes. */
bool tdm_lora_params_tensor_name(const tdm_lora_module *m, bool is_b, char *buf, size_t cap);

/* Copies src's parameters into dst; both must have the same layout (TDM_ERR_INVALID if not). */
tdm_status tdm_lora_params_copy(tdm_lora_params *dst, const tdm_lora_params *src, tdm_error *err);

#endif
