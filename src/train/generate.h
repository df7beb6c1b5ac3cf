/* generate.h — greedy text generation with a model and (optionally) one LoRA adapter.
 *
 * Token ids in, token ids out: the caller renders the prompt (data/render.h,
 * tdm_data_render_prompt) and decodes the answer with the tokenizer. Each new token is the argmax
 * of the logits of the last position (ties go to the lowest id, as torch.argmax does); decoding
 * stops at a stop token (EOS, end-of-turn; not included in the output), after max_new_tokens, or
 * when the sequence fills the model's max_position_embeddings.
 *
 * Cost: there is no KV cache yet. Every step runs the model's forward over the whole sequence so
 * far (tdm_model_last_logits), O(n^2) rows for n tokens, fine for the short answers of a demo or
 * a test. The decoding loop talks to the model only through a `decoder` (generate.c) that is fed
 * the new tokens and returns the next-token logits, which is where a KV cache slots in: it would
 * keep each layer's keys and values and run the forward over the new rows only, with no change to
 * this interface.
 */
#ifndef TANDEM_TRAIN_GENERATE_H
#define TANDEM_TRAIN_GENERATE_H
#include <stdbool.h>
#include <stdint.h>

#include "engine/model.h"
#include "util/error.h"

typedef struct tdm_generate_opts {
    int64_t max_new_tokens;  /* >= 1: the most tokens appended after the prompt */
    const int32_t *stop_ids; /* (n_stop) tokens that end the answer (not emitted) */
    int n_stop;
    /* only ids below it are candidates (0: the whole vocabulary): the tokenizer's size when the
     * model's embedding is padded past it, as the tiny presets' 320 rows for 259 tokens are */
    int64_t n_candidates;
} tdm_generate_opts;

typedef enum tdm_generate_stop {
    TDM_GENERATE_STOP_TOKEN,   /* produced one of stop_ids */
    TDM_GENERATE_MAX_TOKENS,   /* produced max_new_tokens */
    TDM_GENERATE_CONTEXT_FULL, /* prompt + answer reached max_position_embeddings */
} tdm_generate_stop;

/* "stop_token", "max_tokens", "context_full". */
const char *tdm_generate_stop_name(tdm_generate_stop s);

/* Greedy decoding of prompt[0..n_prompt) (n_prompt >= 1, ids in [0, vocab_size)) with adapter
 * (NULL: the bare base). Writes the new tokens into out (capacity o->max_new_tokens), their count
 * into *n_out and why it stopped into *why. TDM_ERR_INVALID for bad arguments or a prompt that
 * already fills the context; backend errors as they come. */
tdm_status tdm_generate_greedy(tdm_model *m, tdm_lora *adapter, const int32_t *prompt,
                               int64_t n_prompt, const tdm_generate_opts *o, int32_t *out,
                               int64_t *n_out, tdm_generate_stop *why, tdm_error *err);

#endif
