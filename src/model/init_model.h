/* init_model.h — write a Hugging Face model directory with random weights in a real
 * architecture's shapes (tandem init-model): config.json, model.safetensors and a tokenizer.
 *
 * Weights (as Hugging Face's _init_weights with initializer_range 0.02): every matrix
 * (embedding, projections, lm_head) ~ normal(0, 0.02), biases 0, RMSNorm weights 1. init_std
 * replaces 0.02 (config.json keeps "initializer_range": 0.02): with tied embeddings of std 0.02 a
 * 256-wide model's logits stay within about +-5, so a LoRA on it learns a toy task slowly; the
 * make run demo uses 0.1 (docs/model-config.md).
 * Determinism: tensor t draws from xoshiro256** (util/rng.h) seeded with
 *   splitmix64-mix(seed ^ fnv1a64(t.name)) + chunk index
 * for each chunk of 65536 consecutive elements, so the bytes depend only on --seed, the preset
 * and the dtype (not on thread count or tensor order). bf16 values are the f32 draws rounded to
 * nearest even.
 * Memory: tensors are generated and written a few MB at a time through the streaming
 * safetensors writer, so a 7B model never sits in RAM; each file is written atomically (temp
 * file, fsync, rename).
 *
 * Tokenizer: without a tokenizer path, a self-contained byte-level BPE tokenizer is written
 * (docs/model-config.md): tokenizer.json with the 256 byte tokens (id = byte value, spelled with
 * GPT-2's byte-to-unicode mapping), no merges, a ByteLevel pre-tokenizer and decoder, and the
 * special tokens <|endoftext|> (256), <|im_start|> (257), <|im_end|> (258); tokenizer_config.json
 * with a ChatML chat_template, eos <|im_end|>, pad <|endoftext|>. With a tokenizer path (a
 * tokenizer.json or a directory holding one) tokenizer.json and tokenizer_config.json (when
 * present) are copied, and the vocabulary is widened to the next multiple of 64 when the
 * tokenizer's largest id does not fit the preset's vocab_size.
 */
#ifndef TANDEM_MODEL_INIT_MODEL_H
#define TANDEM_MODEL_INIT_MODEL_H
#include <stdint.h>

#include "model/config.h"
#include "model/dtype.h"
#include "util/error.h"

/* The most decoder layers tdm_init_model_opts.layers may ask for. */
#define TDM_INIT_MODEL_MAX_LAYERS 1024

typedef struct tdm_init_model_opts {
    const char *preset; /* see presets.h */
    uint64_t seed;
    tdm_dtype dtype;       /* TDM_DTYPE_BF16 or TDM_DTYPE_F32 */
    const char *tokenizer; /* NULL: the built-in byte-level tokenizer */
    double init_std;       /* std of the matrices; 0 means 0.02 */
    /* decoder layers; 0: the preset's. Layer i's tensors are the full model's layer i (seeds
     * follow the tensor names): a model of fewer layers in a real model's shapes, for measuring
     * what one layer costs (memory, time) without writing or loading all of it. */
    int64_t layers;
    /* Called after each written piece (may be NULL): bytes of tensor data done / total. */
    void (*progress)(uint64_t done, uint64_t total, void *user);
    void *user;
} tdm_init_model_opts;

/* Creates out_dir if needed (its parent must exist) and writes the model. cfg_out (optional)
 * receives the config written. Existing files of the same names are replaced. */
tdm_status tdm_init_model(const char *out_dir, const tdm_init_model_opts *opts,
                          tdm_model_config *cfg_out, tdm_error *err);

/* The seed of chunk `chunk` of tensor `name` (exposed for tests). */
uint64_t tdm_init_model_chunk_seed(uint64_t seed, const char *name, uint64_t chunk);

#endif
