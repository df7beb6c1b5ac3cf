/* bpe.c — BPE word encoding with a merge heap and a word cache (see bpe.h). */
#include "tokenizer/bpe.h"

#include <stdlib.h>
#include <string.h>

#include "util/fault.h"

void tdm_token_ids_free(tdm_token_ids *v)
{
    free(v->ids);
    memset(v, 0, sizeof *v);
}

tdm_status tdm_token_ids_append(tdm_token_ids *v, const int32_t *ids, size_t n, tdm_error *err)
{
    if (v->len + n > v->cap) {
        size_t cap = v->cap ? v->cap : 64;
        while (cap < v->len + n)
            cap *= 2;
        int32_t *p = tdm_fault("token_ids.grow") ? NULL : realloc(v->ids, cap * sizeof *p);
        if (!p) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory for %zu token ids", cap);
        v->ids = p;
        v->cap = cap;
    }
    if (n) memcpy(v->ids + v->len, ids, n * sizeof *ids);
    v->len += n;
    return TDM_OK;
}

void tdm_bpe_init(tdm_bpe *bpe)
{
    memset(bpe, 0, sizeof *bpe);
    tdm_strmap_init(&bpe->vocab);
    tdm_pairmap_init(&bpe->merges);
    tdm_strmap_init(&bpe->cache);
}

void tdm_bpe_free(tdm_bpe *bpe)
{
    tdm_strmap_free(&bpe->vocab);
    tdm_pairmap_free(&bpe->merges);
    tdm_strmap_free(&bpe->cache);
    free(bpe->cache_ids);
    free(bpe->sym_id);
    free(bpe->sym_prev);
    free(bpe->sym_next);
    free(bpe->heap);
    memset(bpe, 0, sizeof *bpe);
}

tdm_status tdm_bpe_add_token(tdm_bpe *bpe, const char *text, size_t len, int32_t id, tdm_error *err)
{
    return tdm_strmap_put(&bpe->vocab, text, len, id, NULL, err);
}

bool tdm_bpe_token_id(const tdm_bpe *bpe, const char *text, size_t len, int32_t *id)
{
    return tdm_strmap_get(&bpe->vocab, text, len, id);
}

tdm_status tdm_bpe_add_merge(tdm_bpe *bpe, const char *left, size_t left_len, const char *right,
                             size_t right_len, int32_t rank, tdm_error *err)
{
    int32_t a, b, m;
    if (!tdm_strmap_get(&bpe->vocab, left, left_len, &a))
        return tdm_fail(err, TDM_ERR_PARSE, "merge %d: \"%.*s\" is not in the vocabulary", rank,
                        (int)left_len, left);
    if (!tdm_strmap_get(&bpe->vocab, right, right_len, &b))
        return tdm_fail(err, TDM_ERR_PARSE, "merge %d: \"%.*s\" is not in the vocabulary", rank,
                        (int)right_len, right);
    char stack[512];
    char *joined = left_len + right_len <= sizeof stack ? stack : malloc(left_len + right_len);
    if (!joined) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    memcpy(joined, left, left_len);
    memcpy(joined + left_len, right, right_len);
    bool found = tdm_strmap_get(&bpe->vocab, joined, left_len + right_len, &m);
    if (joined != stack) free(joined);
    if (!found)
        return tdm_fail(err, TDM_ERR_PARSE,
                        "merge %d: \"%.*s%.*s\" (the merged token) is not in the vocabulary", rank,
                        (int)left_len, left, (int)right_len, right);
    return tdm_pairmap_put(&bpe->merges, a, b, (tdm_pair_value){rank, m}, NULL, err);
}

static bool heap_less(const tdm_bpe_heap_item *x, const tdm_bpe_heap_item *y)
{
    return x->rank < y->rank || (x->rank == y->rank && x->pos < y->pos);
}

static void heap_push(tdm_bpe *bpe, size_t *n, tdm_bpe_heap_item it)
{
    size_t i = (*n)++;
    tdm_bpe_heap_item *h = bpe->heap;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&it, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = it;
}

static tdm_bpe_heap_item heap_pop(tdm_bpe *bpe, size_t *n)
{
    tdm_bpe_heap_item *h = bpe->heap;
    tdm_bpe_heap_item top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(&h[c + 1], &h[c])) c++;
        if (!heap_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static size_t utf8_char_len(unsigned char c)
{
    if (c < 0x80) return 1;
    if ((c & 0xe0) == 0xc0) return 2;
    if ((c & 0xf0) == 0xe0) return 3;
    if ((c & 0xf8) == 0xf0) return 4;
    return 1; /* stray continuation byte: one symbol, as good as any */
}

static tdm_status ensure_scratch(tdm_bpe *bpe, size_t n, tdm_error *err)
{
    if (n > bpe->scratch_cap) {
        size_t cap = bpe->scratch_cap ? bpe->scratch_cap : 64;
        while (cap < n)
            cap *= 2;
        int32_t *a = realloc(bpe->sym_id, cap * sizeof *a);
        if (a) bpe->sym_id = a;
        int32_t *b = realloc(bpe->sym_prev, cap * sizeof *b);
        if (b) bpe->sym_prev = b;
        int32_t *c = realloc(bpe->sym_next, cap * sizeof *c);
        if (c) bpe->sym_next = c;
        if (!a || !b || !c)
            return tdm_fail(err, TDM_ERR_NOMEM, "out of memory for a %zu-symbol word", n);
        bpe->scratch_cap = cap;
    }
    /* each merge queues at most two new pairs; n initial pairs */
    size_t heap_need = 3 * n + 4;
    if (heap_need > bpe->heap_cap) {
        size_t cap = bpe->heap_cap ? bpe->heap_cap : 256;
        while (cap < heap_need)
            cap *= 2;
        tdm_bpe_heap_item *h = realloc(bpe->heap, cap * sizeof *h);
        if (!h) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory for a %zu-symbol word", n);
        bpe->heap = h;
        bpe->heap_cap = cap;
    }
    return TDM_OK;
}

static void queue_pair(tdm_bpe *bpe, size_t *hn, int32_t left)
{
    int32_t right = bpe->sym_next[left];
    if (right < 0) return;
    const tdm_pair_value *pv = tdm_pairmap_get(&bpe->merges, bpe->sym_id[left], bpe->sym_id[right]);
    if (pv) heap_push(bpe, hn, (tdm_bpe_heap_item){pv->rank, left, pv->merged});
}

/* The merge loop proper: appends the ids of word to out. */
static tdm_status merge_word(tdm_bpe *bpe, const char *word, size_t len, tdm_token_ids *out,
                             tdm_error *err)
{
    tdm_status st = ensure_scratch(bpe, len, err);
    if (st != TDM_OK) return st;
    int32_t n = 0;
    for (size_t i = 0; i < len;) {
        size_t cl = utf8_char_len((unsigned char)word[i]);
        if (cl > len - i) cl = len - i;
        int32_t id;
        if (tdm_strmap_get(&bpe->vocab, word + i, cl, &id)) {
            bpe->sym_id[n] = id;
            bpe->sym_prev[n] = n - 1;
            bpe->sym_next[n] = -1;
            if (n > 0) bpe->sym_next[n - 1] = n;
            n++;
        }
        i += cl;
    }
    size_t hn = 0;
    for (int32_t i = 0; i + 1 < n; i++)
        queue_pair(bpe, &hn, i);
    while (hn) {
        tdm_bpe_heap_item top = heap_pop(bpe, &hn);
        int32_t l = top.pos;
        if (bpe->sym_id[l] < 0) continue; /* merged into its left neighbour since */
        int32_t r = bpe->sym_next[l];
        if (r < 0) continue;
        const tdm_pair_value *pv = tdm_pairmap_get(&bpe->merges, bpe->sym_id[l], bpe->sym_id[r]);
        if (!pv || pv->merged != top.merged)
            continue; /* stale: one side changed since it was queued */
        bpe->sym_id[l] = top.merged;
        bpe->sym_id[r] = -1;
        bpe->sym_next[l] = bpe->sym_next[r];
        if (bpe->sym_next[r] >= 0) bpe->sym_prev[bpe->sym_next[r]] = l;
        if (bpe->sym_prev[l] >= 0) queue_pair(bpe, &hn, bpe->sym_prev[l]);
        queue_pair(bpe, &hn, l);
    }
    size_t start = out->len;
    for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = bpe->sym_next[i]) {
        st = tdm_token_ids_append(out, &bpe->sym_id[i], 1, err);
        if (st != TDM_OK) return st;
    }
    (void)start;
    return TDM_OK;
}

tdm_status tdm_bpe_encode_word(tdm_bpe *bpe, const char *word, size_t len, tdm_token_ids *out,
                               tdm_error *err)
{
    int32_t id;
    if (bpe->ignore_merges && tdm_strmap_get(&bpe->vocab, word, len, &id))
        return tdm_token_ids_append(out, &id, 1, err);
    bool cacheable = len <= TDM_BPE_CACHE_MAX_WORD;
    int32_t off;
    if (cacheable && tdm_strmap_get(&bpe->cache, word, len, &off))
        return tdm_token_ids_append(out, bpe->cache_ids + off + 1, (size_t)bpe->cache_ids[off],
                                    err);
    size_t before = out->len;
    tdm_status st = merge_word(bpe, word, len, out, err);
    if (st != TDM_OK || !cacheable) return st;
    size_t count = out->len - before;
    if (bpe->cache.count >= TDM_BPE_CACHE_MAX_ENTRIES || bpe->cache_len + count + 1 > INT32_MAX) {
        tdm_strmap_clear(&bpe->cache);
        bpe->cache_len = 0;
    }
    if (bpe->cache_len + count + 1 > bpe->cache_cap) {
        size_t cap = bpe->cache_cap ? bpe->cache_cap : 4096;
        while (cap < bpe->cache_len + count + 1)
            cap *= 2;
        int32_t *p = realloc(bpe->cache_ids, cap * sizeof *p);
        if (!p) return TDM_OK; /* the cache is an optimisation: skip it when memory is short */
        bpe->cache_ids = p;
        bpe->cache_cap = cap;
    }
    off = (int32_t)bpe->cache_len;
    bpe->cache_ids[off] = (int32_t)count;
    memcpy(bpe->cache_ids + off + 1, out->ids + before, count * sizeof(int32_t));
    if (tdm_strmap_put(&bpe->cache, word, len, off, NULL, NULL) == TDM_OK)
        bpe->cache_len += count + 1;
    return TDM_OK;
}
