/* model.h — the decoder (Llama / Mistral / Qwen2 / Qwen3) over the backend interface: a frozen
 * base loaded once, any number of LoRA adapters, and one fused forward + backward over a batch
 * whose rows belong to different adapters (docs/engine.md, /work/shared/ENGINE.md).
 *
 * Typical use (a golden test, or one trainer step):
 *     tdm_model *m;   tdm_model_load(&m, be, "models/tiny", &opts, &err);
 *     tdm_lora *a;    tdm_lora_create(&a, m, rank, alpha / rank, TDM_LORA_BIT(TDM_LORA_Q) | ...,
 * &err); tdm_lora_set(a, layer, TDM_LORA_Q, host_A, host_B, &err);        // e.g. from a PEFT file
 *     tdm_lora_zero_grad(a, &err);
 *     tdm_model_step(m, &a, 1, &batch, true, NULL, loss_sum, tokens, &err);
 *     tdm_lora_get_grad(a, layer, TDM_LORA_Q, host_dA, host_dB, &err);
 *
 * Math (Hugging Face transformers + PEFT): embeddings; per layer
 *   xn = RMSNorm(x); q,k,v = xn W^T (+ bias) (+ LoRA); [Qwen3: per-head RMSNorm of q, k];
 *   RoPE(q, k); a = causal GQA attention per packed sequence; x += a Wo^T (+ bias) (+ LoRA);
 *   xn = RMSNorm(x); x += (silu(xn Wg^T) * (xn Wu^T)) Wd^T (each with its LoRA);
 * final RMSNorm, lm_head (tied or not), cross-entropy of each row against the NEXT row's label
 * of the same sequence (labels shifted inside, per sequence; -100 ignored).
 * LoRA of one module: y += scale * (x A^T) B^T, A (r, in), B (out, r).
 */
#ifndef TANDEM_ENGINE_MODEL_H
#define TANDEM_ENGINE_MODEL_H
#include <stdbool.h>
#include <stdint.h>

#include "engine/backend.h"
#include "model/config.h"
#include "model/lora_targets.h"
#include "util/error.h"

/* What gradient checkpointing recomputes in backward (docs/engine.md, "Recompute"). */
typedef enum tdm_recompute {
    TDM_RECOMPUTE_LAYER = 0, /* keep only each layer's input; recompute the whole layer */
    TDM_RECOMPUTE_MLP,       /* keep q/k/v, attention output, x_mid; recompute the norms,
                              * gate_proj and up_proj */
    TDM_RECOMPUTE_ATTN,      /* keep gate/up outputs, attention output, x_mid; recompute the
                              * norms and q/k/v projections */
} tdm_recompute;

/* "layer", "mlp" or "attn"; false for anything else. */
bool tdm_recompute_parse(const char *s, tdm_recompute *out);
const char *tdm_recompute_name(tdm_recompute r);

typedef struct tdm_model_opts {
    bool nf4;          /* "qlora": decoder projections stored in NF4 and dequantized on the fly */
    bool double_quant; /* with nf4: 8-bit absmax (QLoRA's double quantization) */
    bool grad_checkpoint;    /* keep fewer activations; recompute the rest in backward */
    tdm_recompute recompute; /* with grad_checkpoint: what is recomputed */
    int64_t mlp_block_rows;  /* rows of one MLP block; 0: TDM_MLP_BLOCK_ROWS */
    /* --offload-activations: between a training step's forward and backward, each layer's
     * input x lives in host memory (tdm_be_host_alloc), copied there and back beside the
     * compute; the device holds two of them (docs/engine.md, "Activation offload") */
    bool offload_activations;
    /* --base-compute fp8 (with nf4): the decoder projections' GEMMs in FP8 on the CUDA backend
     * (the backend's own choice, tdm_backend_opts.base_fp8); here for the memory plan only */
    bool base_fp8;
    /* keep the embedding table and the lm_head in the dense dtype even where qlora would keep a
     * bf16 checkpoint's as stored (the CPU backend; model.c, embed_dtype). `tandem generate`
     * sets it: a decoded token's logits are a product of a row or a few, where widening the
     * whole bf16 table per token cost more than it saves (0.5B, 2 threads: ~1.3-1.6x the time
     * of a token); training's products have hundreds of rows and do not notice it. */
    bool dense_embed;
} tdm_model_opts;

/* The MLP (gate/up, SwiGLU, down and their backward) runs in blocks of at most this many rows,
 * so its (rows, intermediate) buffers (gate and up outputs when a step does not keep them, the
 * SwiGLU output and the two backward ones) hold one block, not the step: at 7B and 32,768 rows
 * 5 x 1,184 MiB shrink to 5 x 296 MiB. Steps of at most this many rows run as one block, as
 * before; the 8192 rows of a block keep the GEMMs large (7B: 8192 x 18944 x 3584). docs/engine.md,
 * "MLP in row blocks". */
#define TDM_MLP_BLOCK_ROWS 8192

typedef struct tdm_model tdm_model;

/* Loads config.json and the safetensors weights of a Hugging Face model directory onto the
 * backend (projections quantized to NF4 when opts->nf4; everything else f32, or the backend's
 * act dtype for dense projections and embeddings when it is not f32). The backend must outlive
 * the model. Errors name the file / tensor. */
tdm_status tdm_model_load(tdm_model **out, tdm_backend *be, const char *dir,
                          const tdm_model_opts *opts, tdm_error *err);
void tdm_model_free(tdm_model *m);
const tdm_model_config *tdm_model_get_config(const tdm_model *m);

/* Where tdm_model_load spent its wall time, in seconds: reading the safetensors (page faults of
 * the mapped file included) and converting to f32, NF4 quantization, device allocation and upload
 * (the host-side bf16 conversion included); total covers everything, the config and the layout
 * too. For the "base loaded" line a run prints: a 7B base's load is what a co-training joiner
 * waits for before its first step. */
typedef struct tdm_model_load_times {
    double read_s, quantize_s, upload_s, total_s;
} tdm_model_load_times;
const tdm_model_load_times *tdm_model_get_load_times(const tdm_model *m);
tdm_backend *tdm_model_backend(const tdm_model *m);
/* in / out features of a target module. */
void tdm_model_target_shape(const tdm_model *m, tdm_lora_target t, int64_t *in, int64_t *out);

/* ---------------------------------------------------------------- adapters ---- */

/* One adapter's LoRA weights on the device, as one parameter vector (so one AdamW tensor and
 * one gradient-norm vector cover the adapter). Layout of params / grads / adam_m / adam_v:
 * for layer 0..L-1, for each targeted module in tdm_lora_target order: A (rank, in) row-major,
 * then B (out, rank). a_off/b_off give the offsets (-1 for a module not targeted). */
typedef struct tdm_lora {
    tdm_model *model;
    int64_t rank;
    float scale;      /* alpha / rank, or alpha / sqrt(rank) with rsLoRA */
    unsigned targets; /* TDM_LORA_BIT set */
    int64_t n_params;
    float *params;          /* (n_params) f32 device, zero after create */
    float *grads;           /* (n_params) f32 device: tdm_model_step ACCUMULATES into it */
    float *adam_m, *adam_v; /* (n_params) f32 device, zero after create: the trainer's AdamW */
    int64_t *a_off, *b_off; /* (num_layers * TDM_LORA_N_TARGETS) host, indexed l * 7 + t */
    /* LoRA dropout (PEFT's lora_dropout) on the input of every targeted module, in training steps
     * only (tdm_model_step with backward true; evaluation never drops): p in [0, 1), 0 after
     * create. Module t of layer l uses the mask seed tdm_lora_dropout_module_seed(dropout_seed,
     * l, t) = tdm_dropout_derive(tdm_dropout_derive(dropout_seed, l), t) (engine/dropout.h), with
     * rows counted from the adapter's segment, so the mask depends on the adapter, its step and
     * the piece's position in the step's batch, the layer and the module only: fused = alone, q/k/v
     * get independent masks, and the backward and a gradient-checkpointing recompute regenerate it.
     */
    float dropout;
    uint64_t dropout_seed; /* the caller sets it before each training step: tdm_lora_dropout_seed */
} tdm_lora;

/* The dropout mask seed of an adapter's piece of a step: a pure function of the adapter's seed,
 * its optimizer step (the number of steps taken before) and `micro`, the piece's position in the
 * step's batch (the trainer passes the sequences of the batch done before it), so a run resumed
 * from a checkpoint draws the same masks without storing any state. */
uint64_t tdm_lora_dropout_seed(uint64_t seed, int64_t step, int64_t micro);
/* The mask seed of module t of layer l for an adapter whose dropout_seed is step_seed (what
 * tdm_model_step puts into the segment table). */
uint64_t tdm_lora_dropout_module_seed(uint64_t step_seed, int layer, tdm_lora_target t);

/* Allocates an adapter of rank r for the targets (all zero: the caller initializes A). */
tdm_status tdm_lora_create(tdm_lora **out, tdm_model *m, int64_t rank, float scale,
                           unsigned targets, tdm_error *err);
void tdm_lora_free(tdm_lora *a);
/* Uploads A (rank, in) and B (out, rank) host f32 of one module (either may be NULL: kept). */
tdm_status tdm_lora_set(tdm_lora *a, int layer, tdm_lora_target t, const float *A, const float *B,
                        tdm_error *err);
/* Downloads the module's A, B (either may be NULL). */
tdm_status tdm_lora_get(tdm_lora *a, int layer, tdm_lora_target t, float *A, float *B,
                        tdm_error *err);
/* Downloads the module's accumulated gradients dA (rank, in), dB (out, rank). */
tdm_status tdm_lora_get_grad(tdm_lora *a, int layer, tdm_lora_target t, float *dA, float *dB,
                             tdm_error *err);
tdm_status tdm_lora_zero_grad(tdm_lora *a, tdm_error *err);

/* ------------------------------------------------------------------- a step ---- */

/* A contiguous run of rows (whole sequences) that belong to one adapter. A NULL entry of the
 * adapters array means the bare base model (no LoRA), e.g. for evaluation without an adapter. */
typedef struct tdm_batch_seg {
    int adapter; /* index into the adapters array of tdm_model_step */
    int64_t row_begin, row_end;
} tdm_batch_seg;

/* The fused batch, host memory: m rows of packed sequences (no padding). */
typedef struct tdm_batch {
    int64_t m;
    const int32_t *tokens;     /* (m) input ids */
    const int32_t *labels;     /* (m) Hugging Face style, NOT shifted (labels = ids, -100 off) */
    const int32_t *cu_seqlens; /* (n_seqs + 1): 0 = c[0] < c[1] < ... < c[n_seqs] = m */
    int64_t n_seqs;
    const tdm_batch_seg *segs; /* cover [0, m) in order, boundaries on sequence boundaries */
    int64_t n_segs;
} tdm_batch;

/* Runs the forward (and, when backward, the backward) of the fused batch. A training step
 * (backward) applies each adapter's dropout (tdm_lora.dropout, with its dropout_seed); a
 * forward-only step (evaluation) never does.
 * Loss: row i of a sequence is scored against labels[i + 1] of the same sequence (the last row
 * of a sequence and labels of -100 are not counted). For adapter index a: tokens_out[a] = its
 * counted tokens N_a, loss_sum_out[a] = sum of their cross-entropies (double). The gradient is
 * that of sum_a w_a * loss_sum_a with w_a = loss_weight[a], or 1 / N_a when loss_weight is NULL
 * (the mean over the adapter's counted tokens, as transformers computes it), ACCUMULATED into
 * each adapter's grads (a NULL adapter has none). Both output arrays may be NULL.
 * Memory: activations are sized for m and kept between calls (grown when m grows). */
tdm_status tdm_model_step(tdm_model *m, tdm_lora *const *adapters, int n_adapters,
                          const tdm_batch *b, bool backward, const double *loss_weight,
                          double *loss_sum_out, int64_t *tokens_out, tdm_error *err);

/* Forward only, no labels and no loss: for each sequence s of the batch, the logits of its LAST
 * row (the distribution of the token that would follow it) into logits[s * vocab_size ..]
 * (host, f32, (n_seqs, vocab_size); with bf16 activations the lm_head's f32 accumulators, not
 * rounded to bf16). b->labels may be NULL. No dropout. Every call starts the
 * sequences afresh (position 0): generation without a cache, the reference the KV-cached decode
 * (tdm_model_decode) is tested against. */
tdm_status tdm_model_last_logits(tdm_model *m, tdm_lora *const *adapters, int n_adapters,
                                 const tdm_batch *b, float *logits, tdm_error *err);

/* ----------------------------------------------------------- KV cache ---- */

/* Each layer's keys (after RoPE) and values of up to n_slots sequences of up to cap positions,
 * on the model's backend: 2 * num_layers * n_slots * cap * num_kv_heads * head_dim elements of
 * the act dtype (tdm_kv_cache_bytes), allocated at once. A slot holds one sequence; its length
 * (host) grows as tdm_model_decode feeds it. */
typedef struct tdm_kv_cache tdm_kv_cache;

tdm_status tdm_kv_cache_create(tdm_kv_cache **out, tdm_model *m, int64_t n_slots, int64_t cap,
                               tdm_error *err);
void tdm_kv_cache_free(tdm_kv_cache *kv);
/* Empties every slot (the memory is kept). */
void tdm_kv_cache_reset(tdm_kv_cache *kv);
/* Positions cached in a slot. */
int64_t tdm_kv_cache_len(const tdm_kv_cache *kv, int64_t slot);
/* Device bytes of a cache of that shape. */
uint64_t tdm_kv_cache_bytes(const tdm_model_config *c, tdm_be_dtype act, int64_t n_slots,
                            int64_t cap);

/* Continues cached sequences: sequence s of b (its rows are new tokens, b->labels may be NULL)
 * extends slot slots[s] (host, distinct), its rows taking positions len .. len + n - 1 where len
 * is the slot's length, which grows by n. Writes the logits of each sequence's last row as
 * tdm_model_last_logits does. When every slot fed is empty (the prompts: prefill) the layers run
 * the training forward (tdm_be_attention_fwd over the packed prompts) and their keys and values
 * are copied into the cache; otherwise (a decode step, typically one row per sequence)
 * attention reads the cache (tdm_be_attention_kv, TDM_ERR_UNSUPPORTED on a backend without it).
 * Adapters apply by segment as in tdm_model_step: several adapters in one call share the base.
 * TDM_ERR_INVALID when a slot would pass cap. */
tdm_status tdm_model_decode(tdm_model *m, tdm_lora *const *adapters, int n_adapters,
                            const tdm_batch *b, tdm_kv_cache *kv, const int64_t *slots,
                            float *logits, tdm_error *err);

/* ------------------------------------------------------ memory estimate ---- */

/* The largest step a run will take: what its device memory is sized by. */
typedef struct tdm_model_mem_plan {
    int64_t rows;        /* rows of the largest fused batch */
    int64_t n_seqs;      /* most sequences in one batch */
    int64_t max_seq;     /* rows of the longest sequence (0: unknown, taken as rows) */
    int64_t max_rank;    /* largest LoRA rank (0: no adapter) */
    unsigned targets;    /* union of the adapters' TDM_LORA_BIT sets */
    int64_t lora_params; /* all adapters' parameters together */
    /* the largest over the seven projections of sum over adapters of rank * (in + out) (the
     * CUDA LoRA backward's partial sums are per module) */
    int64_t lora_module_params;
    bool backward; /* training (false: evaluation only) */
} tdm_model_mem_plan;

/* Device bytes by owner. weights, activations and adapters are exactly what tdm_model_load,
 * the step's workspace and tdm_lora_create allocate; backend_scratch is the backend's own:
 * the CUDA backend's cuBLASLt workspace and grown scratch slots (engine/cuda/cuda_memory_plan.h),
 * or the CPU backend's kept scratch buffers (engine/cpu/cpu_memory_plan.h). The CUDA context
 * itself is not included: it is a property of the device and driver. */
typedef struct tdm_model_mem {
    uint64_t weights, activations, adapters, backend_scratch; /* device bytes */
    uint64_t host_activations; /* page-locked host bytes of --offload-activations (not device) */
} tdm_model_mem;

/* Computes the estimate from the config alone (no backend, no device): what --vram auto
 * reserves before a CUDA context exists. act: the backend's activation dtype, which also names
 * the backend whose scratch is counted: bf16 the CUDA backend's (engine/cuda/cuda_memory_plan.h),
 * f32 the CPU backend's (engine/cpu/cpu_memory_plan.h). */
tdm_status tdm_model_memory_estimate(const tdm_model_config *c, const tdm_model_opts *o,
                                     tdm_be_dtype act, const tdm_model_mem_plan *p,
                                     tdm_model_mem *out, tdm_error *err);

/* Allocates now what the plan's largest step needs: the activation workspace and the backend's
 * scratch (tdm_be_reserve_scratch), exactly the parts tdm_model_memory_estimate counts. A run
 * then holds its device memory from the start: a program that does not use the ledger cannot
 * take what a later, longer batch needs, and a plan that does not fit fails here, before any
 * step, instead of at its first long batch. Steps within the plan allocate no activations or
 * scratch; a larger step still grows them. */
tdm_status tdm_model_reserve(tdm_model *m, const tdm_model_mem_plan *p, tdm_error *err);

/* Gives back what the activation workspace holds beyond the plan's largest step (a co-training
 * host after adapters left): when the workspace is larger than that step needs, it is freed and
 * allocated again for exactly the plan (nothing at all for a plan of 0 rows). Call between steps
 * only. The backend's scratch is kept (it only grows). */
tdm_status tdm_model_fit(tdm_model *m, const tdm_model_mem_plan *p, tdm_error *err);

/* Switches gradient checkpointing and its recompute mode between two steps (a co-training host
 * re-planning for a join): the workspace holds nothing from one step to the next, so only its
 * size follows, at the next tdm_model_fit (smaller) or tdm_model_reserve / step (larger). A
 * step's result is the same either way (backward recomputes what the mode did not keep). */
void tdm_model_set_grad_checkpoint(tdm_model *m, bool on, tdm_recompute recompute);
bool tdm_model_grad_checkpoint(const tdm_model *m);
tdm_recompute tdm_model_recompute(const tdm_model *m);
/* The same, and the activation workspace freed at once, allocated again by the next step or
 * tdm_model_reserve (a benchmark measuring every mode on one load: bench/train_bench.c). */
void tdm_model_set_recompute(tdm_model *m, bool grad_checkpoint, tdm_recompute recompute);
/* Turns tdm_model_opts.offload_activations on or off, freeing the workspace the same way. */
void tdm_model_set_offload_activations(tdm_model *m, bool on);

/* Bytes of device memory the base weights take, and the activations of the last step. */
uint64_t tdm_model_weight_bytes(const tdm_model *m);
uint64_t tdm_model_activation_bytes(const tdm_model *m);
/* Page-locked host bytes of the offloaded layer inputs (--offload-activations), 0 without. */
uint64_t tdm_model_host_activation_bytes(const tdm_model *m);

#endif
