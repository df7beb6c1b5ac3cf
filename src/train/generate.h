/* generate.h — text generation with a model and any number of LoRA adapters side by side.
 *
 * Token ids in, token ids out: the caller renders the prompts (data/render.h,
 * tdm_data_render_prompt) and decodes the answers with the tokenizer (docs/generate.md).
 *
 * Requests are decoded in batches of up to max_batch sequences. A batch starts with one prefill
 * (tdm_model_decode over all its prompts packed: the training forward, keys and values kept in
 * a KV cache), then runs one decode step per new token with one row per unfinished sequence.
 * Each request names its adapter (an index into the adapters array; a NULL entry is the bare
 * base); the rows of different adapters go through one base pass as in training (segmented
 * LoRA), so comparing adapters costs one base.
 *
 * Each new token is the argmax of the last position's logits (temperature 0; ties go to the
 * lowest id, as torch.argmax), or a draw from them (temperature > 0, then top-k, then top-p, as
 * transformers' sampling applies them) with a generator of its own per request, seeded by
 * (seed, stream): the same seed gives the same tokens on every run. Decoding stops at a stop
 * token (EOS, end-of-turn; not part of the output), after max_new_tokens, or when the sequence
 * fills the model's max_position_embeddings.
 *
 * no_cache reruns the whole forward over every sequence at every token (tdm_model_last_logits,
 * O(n^2) rows): the reference the cached path is tested against, and what a backend without
 * tdm_be_attention_kv falls back to.
 */
#ifndef TANDEM_TRAIN_GENERATE_H
#define TANDEM_TRAIN_GENERATE_H
#include <stdbool.h>
#include <stdint.h>

#include "engine/model.h"
#include "util/error.h"

typedef struct tdm_sampling {
    double temperature; /* 0: greedy; > 0: logits / temperature, then a draw */
    int64_t top_k;      /* > 0: only the k most likely ids are drawn from (0: all) */
    double top_p;       /* in (0, 1]: the smallest most-likely set of mass >= top_p (1: all) */
    uint64_t seed;
} tdm_sampling;

typedef struct tdm_generate_opts {
    int64_t max_new_tokens;  /* >= 1: the most tokens appended after a prompt */
    const int32_t *stop_ids; /* (n_stop) tokens that end an answer (not emitted) */
    int n_stop;
    /* only ids below it are candidates (0: the whole vocabulary): the tokenizer's size when the
     * model's embedding is padded past it, as the tiny presets' 320 rows for 259 tokens are */
    int64_t n_candidates;
    tdm_sampling sampling; /* zero: greedy */
    int64_t max_batch;     /* sequences decoded together (0: 16) */
    bool no_cache;         /* recompute the whole sequence at every token (the reference) */
    /* > 0: keep the n_top largest candidate logits of every step (tdm_generate_result's top_*),
     * for comparing with another implementation's scores (a sort of the candidates per token) */
    int64_t n_top;
} tdm_generate_opts;

typedef enum tdm_generate_stop {
    TDM_GENERATE_STOP_TOKEN,   /* produced one of stop_ids */
    TDM_GENERATE_MAX_TOKENS,   /* produced max_new_tokens */
    TDM_GENERATE_CONTEXT_FULL, /* prompt + answer reached max_position_embeddings */
} tdm_generate_stop;

/* "stop_token", "max_tokens", "context_full". */
const char *tdm_generate_stop_name(tdm_generate_stop s);

typedef struct tdm_generate_request {
    const int32_t *prompt; /* (n_prompt) ids in [0, vocab_size) */
    int64_t n_prompt;      /* 1 .. max_position_embeddings - 1 */
    int adapter;           /* index into the adapters array */
    uint64_t stream;       /* the sampling stream (e.g. the request's index) */
} tdm_generate_request;

typedef struct tdm_generate_result {
    int32_t *tokens; /* (n_tokens) malloc'd: tdm_generate_result_free */
    int64_t n_tokens;
    tdm_generate_stop why;
    bool kv_cache;      /* decoded with the KV cache (false: recomputed) */
    int64_t batch_size; /* sequences in the batch it ran in */
    double prefill_sec; /* that batch's prefill (the first token's logits) */
    double decode_sec;  /* that batch's decode steps (every later token), wall time */
    /* with n_top > 0: for each step (n_steps: n_tokens, one more when a stop token ended the
     * answer) the n_top largest logits, largest first (equal ones by id), and their ids;
     * (n_steps, n_top) malloc'd, row-major; n_top is the options' (at most the candidates) */
    int64_t n_steps, n_top;
    int32_t *top_ids;
    float *top_logits;
} tdm_generate_result;

/* Generates answers to reqs[0..n_reqs) into res[0..n_reqs) (zeroed first). TDM_ERR_INVALID for
 * bad options, an adapter index outside [0, n_adapters) or a prompt that fills the context
 * (the message names the request); backend errors as they come. On failure the results are
 * freed. */
tdm_status tdm_generate(tdm_model *m, tdm_lora *const *adapters, int n_adapters,
                        const tdm_generate_request *reqs, int64_t n_reqs,
                        const tdm_generate_opts *o, tdm_generate_result *res, tdm_error *err);
void tdm_generate_result_free(tdm_generate_result *r);

/* One prompt under one adapter (NULL: the bare base): writes the new tokens into out (capacity
 * o->max_new_tokens), their count into *n_out and why it stopped into *why. */
tdm_status tdm_generate_greedy(tdm_model *m, tdm_lora *adapter, const int32_t *prompt,
                               int64_t n_prompt, const tdm_generate_opts *o, int32_t *out,
                               int64_t *n_out, tdm_generate_stop *why, tdm_error *err);

/* Loads the PEFT LoRA adapter of directory dir (tdm_peft_load) onto the model's device. */
tdm_status tdm_generate_load_adapter(tdm_model *m, const char *dir, tdm_lora **out, tdm_error *err);

/* The next token from logits[0..V) (the candidates): greedy (temperature 0) or a draw with r as
 * described above. TDM_ERR_INVALID for a NaN logit. Exposed for tests. */
struct tdm_rng;
tdm_status tdm_generate_pick(const float *logits, int64_t V, const tdm_sampling *s,
                             struct tdm_rng *r, int32_t *out, tdm_error *err);

#endif
