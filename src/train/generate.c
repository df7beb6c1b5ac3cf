/* generate.c — greedy decoding over tdm_model_last_logits (see generate.h). */
#include "train/generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *tdm_generate_stop_name(tdm_generate_stop s)
{
    switch (s) {
    case TDM_GENERATE_STOP_TOKEN:
        return "stop_token";
    case TDM_GENERATE_MAX_TOKENS:
        return "max_tokens";
    case TDM_GENERATE_CONTEXT_FULL:
        return "context_full";
    }
    return "?";
}

/* The model's side of decoding: fed tokens, it gives the logits of the next one. Without a KV
 * cache it keeps the whole sequence and reruns the forward over it; a cached decoder keeps the
 * same two calls. */
typedef struct decoder {
    tdm_model *m;
    tdm_lora *adapter;
    int32_t *ids; /* (cap) the sequence so far: prompt, then the generated tokens */
    int64_t n, cap;
    float *logits; /* (vocab_size) of the last position */
} decoder;

static tdm_status decoder_feed(decoder *d, const int32_t *ids, int64_t n, tdm_error *err)
{
    if (d->n + n > d->cap) return tdm_fail(err, TDM_ERR_INVALID, "generate: sequence too long");
    memcpy(d->ids + d->n, ids, (size_t)n * sizeof *ids);
    d->n += n;
    int32_t cu[2] = {0, (int32_t)d->n};
    tdm_batch_seg seg = {.adapter = 0, .row_begin = 0, .row_end = d->n};
    tdm_batch b = {.m = d->n,
                   .tokens = d->ids,
                   .labels = NULL,
                   .cu_seqlens = cu,
                   .n_seqs = 1,
                   .segs = &seg,
                   .n_segs = 1};
    tdm_lora *slot[1] = {d->adapter};
    return tdm_model_last_logits(d->m, slot, 1, &b, d->logits, err);
}

/* The argmax of logits (V); the lowest id among equal maxima. */
static tdm_status argmax(const float *logits, int64_t V, int32_t *out, tdm_error *err)
{
    int64_t best = 0;
    for (int64_t v = 0; v < V; v++) {
        if (isnan(logits[v]))
            return tdm_fail(err, TDM_ERR_INVALID, "generate: logit %lld is NaN", (long long)v);
        if (logits[v] > logits[best]) best = v;
    }
    *out = (int32_t)best;
    return TDM_OK;
}

static bool is_stop(const tdm_generate_opts *o, int32_t id)
{
    for (int i = 0; i < o->n_stop; i++)
        if (o->stop_ids[i] == id) return true;
    return false;
}

tdm_status tdm_generate_greedy(tdm_model *m, tdm_lora *adapter, const int32_t *prompt,
                               int64_t n_prompt, const tdm_generate_opts *o, int32_t *out,
                               int64_t *n_out, tdm_generate_stop *why, tdm_error *err)
{
    *n_out = 0;
    *why = TDM_GENERATE_MAX_TOKENS;
    const tdm_model_config *c = tdm_model_get_config(m);
    if (n_prompt < 1) return tdm_fail(err, TDM_ERR_INVALID, "generate: empty prompt");
    if (o->max_new_tokens < 1)
        return tdm_fail(err, TDM_ERR_INVALID, "generate: max_new_tokens must be >= 1");
    int64_t ctx = c->max_position_embeddings;
    if (n_prompt >= ctx)
        return tdm_fail(err, TDM_ERR_INVALID,
                        "generate: the prompt has %lld tokens, the model's context is %lld",
                        (long long)n_prompt, (long long)ctx);
    int64_t cap = n_prompt + o->max_new_tokens;
    if (cap > ctx) cap = ctx;
    decoder d = {.m = m, .adapter = adapter, .cap = cap};
    d.ids = malloc((size_t)cap * sizeof *d.ids);
    d.logits = malloc((size_t)c->vocab_size * sizeof *d.logits);
    tdm_status st = TDM_OK;
    if (!d.ids || !d.logits) st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    if (st == TDM_OK) st = decoder_feed(&d, prompt, n_prompt, err);
    while (st == TDM_OK) {
        int32_t next;
        int64_t V = o->n_candidates > 0 && o->n_candidates < c->vocab_size ? o->n_candidates
                                                                           : c->vocab_size;
        if ((st = argmax(d.logits, V, &next, err)) != TDM_OK) break;
        if (is_stop(o, next)) {
            *why = TDM_GENERATE_STOP_TOKEN;
            break;
        }
        out[(*n_out)++] = next;
        if (*n_out == o->max_new_tokens) {
            *why = TDM_GENERATE_MAX_TOKENS;
            break;
        }
        if (d.n + 1 >= ctx) { /* the new token sits at position d.n, the last one there is */
            *why = TDM_GENERATE_CONTEXT_FULL;
            break;
        }
        st = decoder_feed(&d, &next, 1, err);
    }
    free(d.ids);
    free(d.logits);
    return st;
}
