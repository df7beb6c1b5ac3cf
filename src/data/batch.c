/* batch.c — data cursors and packed multi-adapter batches (see batch.h). */
#include "data/batch.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/rng.h"

void tdm_data_cursor_init(tdm_data_cursor *c, uint32_t n, uint64_t seed, bool shuffle)
{
    memset(c, 0, sizeof *c);
    c->n = n;
    c->seed = seed;
    c->shuffle = shuffle;
}

void tdm_data_cursor_free(tdm_data_cursor *c)
{
    free(c->perm);
    memset(c, 0, sizeof *c);
}

/* Uniform in [0, bound] without modulo bias. */
static uint32_t uniform_upto(tdm_rng *r, uint32_t bound)
{
    uint64_t range = (uint64_t)bound + 1;
    uint64_t limit = UINT64_MAX - UINT64_MAX % range; // accept x < limit
    uint64_t x;
    do
        x = tdm_rng_next(r);
    while (x >= limit);
    return (uint32_t)(x % range);
}

static tdm_status ensure_perm(tdm_data_cursor *c, tdm_error *err)
{
    if (c->perm_valid && c->perm_epoch == c->epoch) return TDM_OK;
    if (!c->perm && !(c->perm = malloc((size_t)c->n * sizeof *c->perm)))
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory for a data order (%u samples)", c->n);
    for (uint32_t i = 0; i < c->n; i++)
        c->perm[i] = i;
    if (c->shuffle) {
        uint64_t s = c->seed ^ (c->epoch * 0x9e3779b97f4a7c15ULL);
        tdm_rng r;
        tdm_rng_seed(&r, tdm_splitmix64(&s));
        for (uint32_t i = c->n - 1; i > 0; i--) {
            uint32_t j = uniform_upto(&r, i);
            uint32_t t = c->perm[i];
            c->perm[i] = c->perm[j];
            c->perm[j] = t;
        }
    }
    c->perm_epoch = c->epoch;
    c->perm_valid = true;
    return TDM_OK;
}

tdm_status tdm_data_cursor_next(tdm_data_cursor *c, uint32_t *index, tdm_error *err)
{
    if (c->n == 0) return tdm_fail(err, TDM_ERR_INVALID, "no samples to draw from");
    tdm_status st = ensure_perm(c, err);
    if (st != TDM_OK) return st;
    *index = c->perm[c->position];
    if (++c->position == c->n) {
        c->position = 0;
        c->epoch++;
    }
    return TDM_OK;
}

tdm_status tdm_data_cursor_to_json(const tdm_data_cursor *c, char **out, tdm_error *err)
{
    char seed[32];
    snprintf(seed, sizeof seed, "%" PRIu64, c->seed);
    json_t *j = json_pack("{s:I, s:I, s:I, s:s, s:b}", "epoch", (json_int_t)c->epoch, "position",
                          (json_int_t)c->position, "samples", (json_int_t)c->n, "seed", seed,
                          "shuffle", (int)c->shuffle);
    *out = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(j);
    if (!*out) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory writing a data cursor");
    return TDM_OK;
}

tdm_status tdm_data_cursor_from_json(tdm_data_cursor *c, const char *json, uint32_t n,
                                     tdm_error *err)
{
    json_error_t je;
    json_t *j = json_loads(json, 0, &je);
    json_int_t epoch, position, samples;
    const char *seed;
    int shuffle;
    if (!j || json_unpack_ex(j, &je, JSON_STRICT, "{s:I, s:I, s:I, s:s, s:b}", "epoch", &epoch,
                             "position", &position, "samples", &samples, "seed", &seed, "shuffle",
                             &shuffle) != 0) {
        json_decref(j);
        return tdm_fail(err, TDM_ERR_PARSE, "data cursor: %s", je.text);
    }
    char *end;
    errno = 0;
    unsigned long long s = strtoull(seed, &end, 10);
    bool seed_ok = *seed >= '0' && *seed <= '9' && !*end && errno == 0;
    tdm_status st = TDM_OK;
    if (!seed_ok)
        st = tdm_fail(err, TDM_ERR_PARSE, "data cursor: seed \"%s\" is not a decimal number", seed);
    else if (samples != (json_int_t)n)
        st = tdm_fail(err, TDM_ERR_INVALID,
                      "data cursor: saved for %lld samples, but the data now has %u (the dataset "
                      "or its options changed)",
                      (long long)samples, n);
    else if (epoch < 0 || position < 0 || position >= (json_int_t)(n ? n : 1))
        st = tdm_fail(err, TDM_ERR_INVALID, "data cursor: epoch %lld position %lld out of range",
                      (long long)epoch, (long long)position);
    json_decref(j);
    if (st != TDM_OK) return st;
    tdm_data_cursor_free(c);
    tdm_data_cursor_init(c, n, (uint64_t)s, shuffle != 0);
    c->epoch = (uint64_t)epoch;
    c->position = (uint64_t)position;
    return TDM_OK;
}

void tdm_batch_free(tdm_batch *b)
{
    free(b->input_ids);
    free(b->labels);
    free(b->targets);
    free(b->positions);
    free(b->cu_seqlens);
    free(b->seq_adapter);
    free(b->seq_sample);
    free(b->seq_epoch);
    free(b->segs);
    free(b->counted);
    memset(b, 0, sizeof *b);
}

/* Reallocates *p to n elements of elem bytes (at least one). */
static bool grow(void **p, size_t elem, size_t n)
{
    void *q = realloc(*p, (n ? n : 1) * elem);
    if (!q) return false;
    *p = q;
    return true;
}

static tdm_status reserve(tdm_batch *b, int32_t rows, int32_t seqs, int32_t adapters,
                          tdm_error *err)
{
    bool ok = true;
    if (rows > b->cap_rows || !b->input_ids) {
        size_t n = (size_t)rows;
        ok = grow((void **)&b->input_ids, sizeof(int32_t), n) &&
             grow((void **)&b->labels, sizeof(int32_t), n) &&
             grow((void **)&b->targets, sizeof(int32_t), n) &&
             grow((void **)&b->positions, sizeof(int32_t), n);
        if (ok) b->cap_rows = rows;
    }
    if (ok && (seqs > b->cap_seqs || !b->cu_seqlens)) {
        size_t n = (size_t)seqs;
        ok = grow((void **)&b->cu_seqlens, sizeof(int32_t), n + 1) &&
             grow((void **)&b->seq_adapter, sizeof(int32_t), n) &&
             grow((void **)&b->seq_sample, sizeof(uint32_t), n) &&
             grow((void **)&b->seq_epoch, sizeof(uint64_t), n);
        if (ok) b->cap_seqs = seqs;
    }
    if (ok && (adapters > b->cap_adapters || !b->segs)) {
        size_t n = (size_t)adapters;
        ok = grow((void **)&b->segs, sizeof(tdm_batch_seg), n) &&
             grow((void **)&b->counted, sizeof(int64_t), n);
        if (ok) b->cap_adapters = adapters;
    }
    return ok ? TDM_OK : tdm_fail(err, TDM_ERR_NOMEM, "out of memory for a batch of %d rows", rows);
}

tdm_status tdm_batch_next(tdm_batch *b, const tdm_batch_source *src, tdm_data_cursor *cursors,
                          int32_t n_adapters, tdm_error *err)
{
    /* Validate and size first, on copies of the cursor positions, so an error changes nothing. */
    if (n_adapters < 0)
        return tdm_fail(err, TDM_ERR_INVALID, "negative adapter count %d", n_adapters);
    int64_t rows = 0, seqs = 0;
    for (int32_t a = 0; a < n_adapters; a++) {
        if (src[a].batch_size == 0) continue;
        if (src[a].n == 0)
            return tdm_fail(err, TDM_ERR_INVALID, "adapter %d has no samples to train on", a);
        if (cursors[a].n != src[a].n)
            return tdm_fail(err, TDM_ERR_INVALID,
                            "adapter %d: its data cursor walks %u samples, its data has %u", a,
                            cursors[a].n, src[a].n);
        seqs += src[a].batch_size;
    }
    if (seqs > INT32_MAX / 2)
        return tdm_fail(err, TDM_ERR_INVALID, "a step of %lld sequences is too many",
                        (long long)seqs);
    /* Draw the samples (advancing the real cursors; restored on error). */
    uint64_t *saved = malloc(2 * (size_t)(n_adapters ? n_adapters : 1) * sizeof *saved);
    uint32_t *picked = malloc((size_t)(seqs ? seqs : 1) * sizeof *picked);
    uint64_t *epochs = malloc((size_t)(seqs ? seqs : 1) * sizeof *epochs);
    tdm_status st = saved && picked && epochs
                        ? TDM_OK
                        : tdm_fail(err, TDM_ERR_NOMEM, "out of memory planning a batch");
    for (int32_t a = 0; st == TDM_OK && a < n_adapters; a++) {
        saved[2 * a] = cursors[a].epoch;
        saved[2 * a + 1] = cursors[a].position;
    }
    int64_t s = 0;
    for (int32_t a = 0; st == TDM_OK && a < n_adapters; a++)
        for (uint32_t k = 0; st == TDM_OK && k < src[a].batch_size; k++) {
            uint32_t idx;
            epochs[s] = cursors[a].epoch;
            if ((st = tdm_data_cursor_next(&cursors[a], &idx, err)) == TDM_OK) {
                picked[s++] = src[a].indices[idx];
                rows += src[a].ds->samples[src[a].indices[idx]].len;
            }
        }
    if (st == TDM_OK && rows > INT32_MAX)
        st = tdm_fail(err, TDM_ERR_INVALID, "a step of %lld tokens is too many", (long long)rows);
    if (st == TDM_OK) st = reserve(b, (int32_t)rows, (int32_t)seqs, n_adapters, err);
    if (st != TDM_OK) {
        if (saved)
            for (int32_t a = 0; a < n_adapters; a++) {
                cursors[a].epoch = saved[2 * a];
                cursors[a].position = saved[2 * a + 1];
            }
        free(saved);
        free(picked);
        free(epochs);
        return st;
    }

    b->n_adapters = n_adapters;
    b->n_rows = (int32_t)rows;
    b->n_seqs = (int32_t)seqs;
    b->n_segs = 0;
    b->cu_seqlens[0] = 0;
    int32_t r = 0;
    s = 0;
    for (int32_t a = 0; a < n_adapters; a++) {
        b->counted[a] = 0;
        if (src[a].batch_size == 0) continue;
        tdm_batch_seg *seg = &b->segs[b->n_segs++];
        seg->adapter = a;
        seg->row_begin = r;
        seg->seq_begin = (int32_t)s;
        const tdm_dataset *ds = src[a].ds;
        for (uint32_t k = 0; k < src[a].batch_size; k++, s++) {
            const tdm_data_sample *sm = &ds->samples[picked[s]];
            const int32_t *ids = ds->ids + sm->offset, *lab = ds->labels + sm->offset;
            for (uint32_t t = 0; t < sm->len; t++, r++) {
                b->input_ids[r] = ids[t];
                b->labels[r] = lab[t];
                b->positions[r] = (int32_t)t;
                b->targets[r] = t + 1 < sm->len ? lab[t + 1] : TDM_LABEL_IGNORE;
                b->counted[a] += b->targets[r] != TDM_LABEL_IGNORE;
            }
            b->cu_seqlens[s + 1] = r;
            b->seq_adapter[s] = a;
            b->seq_sample[s] = picked[s];
            b->seq_epoch[s] = epochs[s];
        }
        seg->row_end = r;
        seg->seq_end = (int32_t)s;
    }
    free(saved);
    free(picked);
    free(epochs);
    return TDM_OK;
}
