/* generate.c — batched decoding with a KV cache over tdm_model_decode (see generate.h). */
#include "train/generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/peft_io.h"
#include "util/rng.h"
#include "util/timeutil.h"

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

void tdm_generate_result_free(tdm_generate_result *r)
{
    if (!r) return;
    free(r->tokens);
    free(r->top_ids);
    free(r->top_logits);
    memset(r, 0, sizeof *r);
}

/* ------------------------------------------------------------- picking ---- */

typedef struct cand {
    double z; /* logit / temperature */
    int32_t id;
} cand;

/* Most likely first; equal values by id, so the order (and the draw) is fully determined. */
static int cand_cmp(const void *pa, const void *pb)
{
    const cand *a = pa, *b = pb;
    if (a->z != b->z) return a->z > b->z ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

tdm_status tdm_generate_pick(const float *logits, int64_t V, const tdm_sampling *s,
                             struct tdm_rng *r, int32_t *out, tdm_error *err)
{
    int64_t best = 0;
    for (int64_t v = 0; v < V; v++) {
        if (isnan(logits[v]))
            return tdm_fail(err, TDM_ERR_INVALID, "generate: logit %lld is NaN", (long long)v);
        if (logits[v] > logits[best]) best = v;
    }
    if (!s || s->temperature <= 0) {
        *out = (int32_t)best;
        return TDM_OK;
    }
    cand *c = malloc((size_t)V * sizeof *c);
    if (!c) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    for (int64_t v = 0; v < V; v++)
        c[v] = (cand){(double)logits[v] / s->temperature, (int32_t)v};
    int64_t n = V;
    bool sorted = (s->top_k > 0 && s->top_k < V) || (s->top_p > 0 && s->top_p < 1);
    if (sorted) qsort(c, (size_t)V, sizeof *c, cand_cmp);
    /* top-k: every id at least as likely as the k-th (transformers keeps ties too) */
    if (s->top_k > 0 && s->top_k < V)
        for (n = s->top_k; n < V && c[n].z == c[s->top_k - 1].z; n++) {
        }
    double mx = sorted ? c[0].z : (double)logits[best] / s->temperature, total = 0;
    for (int64_t i = 0; i < n; i++)
        total += exp(c[i].z - mx);
    /* top-p: drop the least likely ids while the mass dropped stays <= 1 - top_p (transformers'
     * TopPLogitsWarper), keeping at least the most likely one */
    if (s->top_p > 0 && s->top_p < 1) {
        double dropped = 0;
        while (n > 1) {
            double p = exp(c[n - 1].z - mx) / total;
            if (dropped + p > 1 - s->top_p) break;
            dropped += p;
            n--;
        }
        total = 0;
        for (int64_t i = 0; i < n; i++)
            total += exp(c[i].z - mx);
    }
    double u = tdm_rng_uniform(r) * total, acc = 0;
    int32_t pick = c[n - 1].id;
    for (int64_t i = 0; i < n; i++) {
        acc += exp(c[i].z - mx);
        if (acc > u) {
            pick = c[i].id;
            break;
        }
    }
    free(c);
    *out = pick;
    return TDM_OK;
}

/* The n largest of logits[0..V) into ids / vals, largest first, equal values by id. */
static tdm_status top_logits(const float *logits, int64_t V, int64_t n, int32_t *ids, float *vals,
                             tdm_error *err)
{
    cand *c = malloc((size_t)V * sizeof *c);
    if (!c) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    for (int64_t v = 0; v < V; v++)
        c[v] = (cand){logits[v], (int32_t)v};
    qsort(c, (size_t)V, sizeof *c, cand_cmp);
    for (int64_t i = 0; i < n; i++)
        ids[i] = c[i].id, vals[i] = (float)c[i].z;
    free(c);
    return TDM_OK;
}

/* ------------------------------------------------------------ decoding ---- */

/* One request of the batch being decoded. */
typedef struct seq {
    int64_t req;  /* index into reqs / res */
    int adapter;  /* reqs[req].adapter */
    int64_t slot; /* its KV cache slot: its position in the batch */
    int32_t *ids; /* (cap) prompt, then the generated tokens */
    int64_t n;    /* tokens in ids */
    tdm_rng rng;
    bool done;
} seq;

static bool is_stop(const tdm_generate_opts *o, int32_t id)
{
    for (int i = 0; i < o->n_stop; i++)
        if (o->stop_ids[i] == id) return true;
    return false;
}

/* The batch of the unfinished sequences: with the cache their last token only (or, for the
 * prefill, the prompts), without it every token so far. Rows of one adapter are contiguous
 * because the sequences are sorted by adapter. Returns the number of sequences fed. */
typedef struct feed {
    int32_t *tokens, *cu;
    tdm_batch_seg *segs;
    int64_t *slots;
    seq **who;
} feed;

static int64_t build_feed(feed *f, seq *s, int64_t n_s, bool whole, tdm_batch *b)
{
    int64_t rows = 0, k = 0, n_segs = 0;
    f->cu[0] = 0;
    for (int64_t i = 0; i < n_s; i++) {
        if (s[i].done) continue;
        int64_t from = whole ? 0 : s[i].n - 1;
        memcpy(f->tokens + rows, s[i].ids + from, (size_t)(s[i].n - from) * sizeof(int32_t));
        int a = s[i].adapter;
        if (n_segs > 0 && f->segs[n_segs - 1].adapter == a)
            f->segs[n_segs - 1].row_end = rows + (s[i].n - from);
        else
            f->segs[n_segs++] = (tdm_batch_seg){a, rows, rows + (s[i].n - from)};
        rows += s[i].n - from;
        f->cu[k + 1] = (int32_t)rows;
        f->slots[k] = s[i].slot;
        f->who[k++] = &s[i];
    }
    *b = (tdm_batch){.m = rows,
                     .tokens = f->tokens,
                     .cu_seqlens = f->cu,
                     .n_seqs = k,
                     .segs = f->segs,
                     .n_segs = n_segs};
    return k;
}

static int cmp_by_adapter(const void *pa, const void *pb)
{
    const seq *a = pa, *b = pb;
    if (a->adapter != b->adapter) return a->adapter < b->adapter ? -1 : 1;
    return (a->req > b->req) - (a->req < b->req); /* stable: request order */
}

/* Decodes requests [first, first + n_s) as one batch. */
static tdm_status decode_batch(tdm_model *m, tdm_lora *const *adapters, int n_adapters,
                               const tdm_generate_request *reqs, int64_t first, int64_t n_s,
                               const tdm_generate_opts *o, tdm_kv_cache *kv,
                               tdm_generate_result *res, tdm_error *err)
{
    const tdm_model_config *c = tdm_model_get_config(m);
    int64_t V = c->vocab_size, ctx = c->max_position_embeddings;
    int64_t n_cand = o->n_candidates > 0 && o->n_candidates < V ? o->n_candidates : V;
    int64_t n_top = o->n_top < n_cand ? o->n_top : n_cand;
    seq *s = calloc((size_t)n_s, sizeof *s);
    float *logits = malloc((size_t)(n_s * V) * sizeof *logits);
    int64_t rows_cap = 0;
    for (int64_t i = 0; i < n_s; i++)
        rows_cap += reqs[first + i].n_prompt + o->max_new_tokens;
    feed f = {malloc((size_t)rows_cap * sizeof(int32_t)),
              malloc((size_t)(n_s + 1) * sizeof(int32_t)),
              malloc((size_t)n_s * sizeof(tdm_batch_seg)), malloc((size_t)n_s * sizeof(int64_t)),
              malloc((size_t)n_s * sizeof(seq *))};
    tdm_status st = TDM_OK;
    if (!s || !logits || !f.tokens || !f.cu || !f.segs || !f.slots || !f.who) {
        st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int64_t i = 0; i < n_s && st == TDM_OK; i++) {
        const tdm_generate_request *q = &reqs[first + i];
        s[i].req = first + i;
        s[i].adapter = q->adapter;
        s[i].ids = malloc((size_t)(q->n_prompt + o->max_new_tokens) * sizeof(int32_t));
        res[first + i].tokens = malloc((size_t)o->max_new_tokens * sizeof(int32_t));
        res[first + i].n_top = n_top;
        if (n_top > 0) {
            size_t steps = (size_t)(o->max_new_tokens + 1) * (size_t)n_top;
            res[first + i].top_ids = malloc(steps * sizeof(int32_t));
            res[first + i].top_logits = malloc(steps * sizeof(float));
        }
        if (!s[i].ids || !res[first + i].tokens ||
            (n_top > 0 && (!res[first + i].top_ids || !res[first + i].top_logits))) {
            st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
            break;
        }
        memcpy(s[i].ids, q->prompt, (size_t)q->n_prompt * sizeof(int32_t));
        s[i].n = q->n_prompt;
        /* a stream of its own: the same seed gives the same draws whatever the batch */
        uint64_t k = o->sampling.seed ^ 0x67656e6572617465ull; /* "generate" */
        tdm_rng_seed(&s[i].rng, tdm_splitmix64(&k) ^ (q->stream * 0x9e3779b97f4a7c15ull));
    }
    if (st != TDM_OK) goto done;
    qsort(s, (size_t)n_s, sizeof *s, cmp_by_adapter);
    for (int64_t i = 0; i < n_s; i++)
        s[i].slot = i;
    if (kv) tdm_kv_cache_reset(kv);
    int64_t t0 = tdm_now_mono_ns(), t_prefill = 0;
    for (bool first_step = true;; first_step = false) {
        tdm_batch b;
        int64_t k = build_feed(&f, s, n_s, !kv || first_step, &b);
        if (k == 0) break;
        st = kv ? tdm_model_decode(m, adapters, n_adapters, &b, kv, f.slots, logits, err)
                : tdm_model_last_logits(m, adapters, n_adapters, &b, logits, err);
        if (st != TDM_OK) break;
        if (first_step) t_prefill = tdm_now_mono_ns();
        for (int64_t j = 0; j < k && st == TDM_OK; j++) {
            seq *q = f.who[j];
            tdm_generate_result *r = &res[q->req];
            int32_t next;
            if ((st = tdm_generate_pick(logits + j * V, n_cand, &o->sampling, &q->rng, &next,
                                        err)) != TDM_OK)
                break;
            if (n_top > 0) {
                size_t at = (size_t)(r->n_steps++ * n_top);
                st = top_logits(logits + j * V, n_cand, n_top, r->top_ids + at, r->top_logits + at,
                                err);
                if (st != TDM_OK) break;
            }
            if (is_stop(o, next)) {
                r->why = TDM_GENERATE_STOP_TOKEN, q->done = true;
                continue;
            }
            r->tokens[r->n_tokens++] = next;
            q->ids[q->n++] = next;
            if (r->n_tokens == o->max_new_tokens)
                r->why = TDM_GENERATE_MAX_TOKENS, q->done = true;
            else if (q->n >= ctx) /* the next token would sit past the last position */
                r->why = TDM_GENERATE_CONTEXT_FULL, q->done = true;
        }
        if (st != TDM_OK) break;
    }
    int64_t t1 = tdm_now_mono_ns();
    for (int64_t i = 0; i < n_s; i++) {
        tdm_generate_result *r = &res[first + i];
        r->kv_cache = kv != NULL;
        r->batch_size = n_s;
        r->prefill_sec = (double)(t_prefill - t0) * 1e-9;
        r->decode_sec = (double)(t1 - t_prefill) * 1e-9;
    }
done:
    for (int64_t i = 0; s && i < n_s; i++)
        free(s[i].ids);
    free(s), free(logits);
    free(f.tokens), free(f.cu), free(f.segs), free(f.slots), free(f.who);
    return st;
}

tdm_status tdm_generate(tdm_model *m, tdm_lora *const *adapters, int n_adapters,
                        const tdm_generate_request *reqs, int64_t n_reqs,
                        const tdm_generate_opts *o, tdm_generate_result *res, tdm_error *err)
{
    memset(res, 0, (size_t)n_reqs * sizeof *res);
    const tdm_model_config *c = tdm_model_get_config(m);
    int64_t ctx = c->max_position_embeddings;
    if (o->max_new_tokens < 1)
        return tdm_fail(err, TDM_ERR_INVALID, "generate: max_new_tokens must be >= 1");
    const tdm_sampling *sp = &o->sampling;
    if (o->n_top < 0) return tdm_fail(err, TDM_ERR_INVALID, "generate: n_top must be >= 0");
    if (!(sp->temperature >= 0) || sp->top_k < 0 || !(sp->top_p >= 0 && sp->top_p <= 1))
        return tdm_fail(err, TDM_ERR_INVALID,
                        "generate: temperature must be >= 0, top_k >= 0, top_p in (0, 1]");
    if (n_adapters < 1 || !adapters)
        return tdm_fail(err, TDM_ERR_INVALID, "generate: no adapter slots");
    int64_t cap = 0;
    for (int64_t i = 0; i < n_reqs; i++) {
        const tdm_generate_request *q = &reqs[i];
        if (q->n_prompt < 1)
            return tdm_fail(err, TDM_ERR_INVALID, "generate: prompt %lld is empty", (long long)i);
        if (q->n_prompt >= ctx)
            return tdm_fail(err, TDM_ERR_INVALID,
                            "generate: prompt %lld has %lld tokens, the model's context is %lld",
                            (long long)i, (long long)q->n_prompt, (long long)ctx);
        if (q->adapter < 0 || q->adapter >= n_adapters)
            return tdm_fail(err, TDM_ERR_INVALID,
                            "generate: prompt %lld: adapter %d outside [0, %d)", (long long)i,
                            q->adapter, n_adapters);
        int64_t need = q->n_prompt + o->max_new_tokens;
        if (need > ctx) need = ctx;
        if (need > cap) cap = need;
    }
    if (n_reqs == 0) return TDM_OK;
    int64_t B = o->max_batch > 0 ? o->max_batch : 16;
    if (B > n_reqs) B = n_reqs;
    tdm_kv_cache *kv = NULL;
    bool cached = !o->no_cache && tdm_be_has_attention_kv(tdm_model_backend(m));
    tdm_status st = cached ? tdm_kv_cache_create(&kv, m, B, cap, err) : TDM_OK;
    for (int64_t first = 0; st == TDM_OK && first < n_reqs; first += B) {
        int64_t n = n_reqs - first < B ? n_reqs - first : B;
        st = decode_batch(m, adapters, n_adapters, reqs, first, n, o, kv, res, err);
    }
    tdm_kv_cache_free(kv);
    if (st != TDM_OK)
        for (int64_t i = 0; i < n_reqs; i++)
            tdm_generate_result_free(&res[i]);
    return st;
}

tdm_status tdm_generate_greedy(tdm_model *m, tdm_lora *adapter, const int32_t *prompt,
                               int64_t n_prompt, const tdm_generate_opts *o, int32_t *out,
                               int64_t *n_out, tdm_generate_stop *why, tdm_error *err)
{
    *n_out = 0;
    *why = TDM_GENERATE_MAX_TOKENS;
    tdm_generate_request q = {.prompt = prompt, .n_prompt = n_prompt};
    tdm_generate_result r;
    TDM_TRY(tdm_generate(m, &adapter, 1, &q, 1, o, &r, err));
    memcpy(out, r.tokens, (size_t)r.n_tokens * sizeof *out);
    *n_out = r.n_tokens;
    *why = r.why;
    tdm_generate_result_free(&r);
    return TDM_OK;
}

tdm_status tdm_generate_load_adapter(tdm_model *m, const char *dir, tdm_lora **out, tdm_error *err)
{
    *out = NULL;
    tdm_lora_params lp = {0};
    tdm_status st = tdm_peft_load(dir, tdm_model_get_config(m), &lp, NULL, err);
    if (st == TDM_OK) st = tdm_lora_create(out, m, lp.rank, (float)lp.scale, lp.targets, err);
    if (st == TDM_OK && (*out)->n_params != lp.n_params)
        st = tdm_fail(err, TDM_ERR_INVALID, "%s: adapter layout disagrees with the model", dir);
    if (st == TDM_OK)
        st = tdm_be_upload(tdm_model_backend(m), (*out)->params, lp.params,
                           (size_t)lp.n_params * sizeof(float), err);
    tdm_lora_params_free(&lp);
    if (st != TDM_OK) {
        tdm_lora_free(*out);
        *out = NULL;
    }
    return st;
}
