/* hashmap.c — open-addressing tables for the tokenizer (see hashmap.h). */
#include "tokenizer/hashmap.h"

#include <stdlib.h>
#include <string.h>

/* FNV-1a, 64 bit, folded: keys are short token strings, so a simple byte loop is fast enough. */
static uint64_t hash_bytes(const char *p, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 1099511628211ULL;
    }
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

void tdm_strmap_init(tdm_strmap *m)
{
    memset(m, 0, sizeof *m);
}

void tdm_strmap_free(tdm_strmap *m)
{
    free(m->slots);
    free(m->key_off);
    free(m->key_len);
    free(m->hash);
    free(m->value);
    free(m->arena);
    memset(m, 0, sizeof *m);
}

void tdm_strmap_clear(tdm_strmap *m)
{
    if (m->slots) memset(m->slots, 0, m->cap * sizeof *m->slots);
    m->count = 0;
    m->arena_len = 0;
}

static tdm_status strmap_grow_slots(tdm_strmap *m, tdm_error *err)
{
    size_t cap = m->cap ? m->cap * 2 : 64;
    uint32_t *slots = calloc(cap, sizeof *slots);
    if (!slots) return tdm_fail(err, TDM_ERR_NOMEM, "hash map: out of memory for %zu slots", cap);
    for (size_t e = 0; e < m->count; e++) {
        size_t i = m->hash[e] & (cap - 1);
        while (slots[i])
            i = (i + 1) & (cap - 1);
        slots[i] = (uint32_t)(e + 1);
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return TDM_OK;
}

static bool grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return true;
    size_t n = *cap ? *cap : 64;
    while (n < need)
        n *= 2;
    void *q = realloc(*p, n * elem);
    if (!q) return false;
    *p = q;
    *cap = n;
    return true;
}

static long strmap_find(const tdm_strmap *m, const char *key, size_t len, uint32_t h)
{
    if (!m->cap) return -1;
    size_t i = h & (m->cap - 1);
    for (;;) {
        uint32_t s = m->slots[i];
        if (!s) return -(long)i - 2; /* empty slot i, encoded */
        size_t e = s - 1;
        if (m->hash[e] == h && m->key_len[e] == len &&
            (len == 0 || !memcmp(m->arena + m->key_off[e], key, len)))
            return (long)e;
        i = (i + 1) & (m->cap - 1);
    }
}

tdm_status tdm_strmap_put(tdm_strmap *m, const char *key, size_t len, int32_t value, bool *existed,
                          tdm_error *err)
{
    uint32_t h = (uint32_t)hash_bytes(key, len);
    long f = strmap_find(m, key, len, h);
    if (f >= 0) {
        m->value[f] = value;
        if (existed) *existed = true;
        return TDM_OK;
    }
    if (existed) *existed = false;
    if (len > UINT32_MAX || m->arena_len + len > UINT32_MAX || m->count + 1 >= UINT32_MAX)
        return tdm_fail(err, TDM_ERR_INVALID, "hash map: more than 4 GiB of keys");
    if ((m->count + 1) * 2 > m->cap) {
        tdm_status st = strmap_grow_slots(m, err);
        if (st != TDM_OK) return st;
        f = strmap_find(m, key, len, h);
    }
    if (m->count + 1 > m->entries_cap) {
        size_t n = m->entries_cap ? m->entries_cap * 2 : 64;
        uint32_t *ko = realloc(m->key_off, n * sizeof *ko);
        if (ko) m->key_off = ko;
        uint32_t *kl = realloc(m->key_len, n * sizeof *kl);
        if (kl) m->key_len = kl;
        uint32_t *hs = realloc(m->hash, n * sizeof *hs);
        if (hs) m->hash = hs;
        int32_t *vs = realloc(m->value, n * sizeof *vs);
        if (vs) m->value = vs;
        if (!ko || !kl || !hs || !vs)
            return tdm_fail(err, TDM_ERR_NOMEM, "hash map: out of memory for entries");
        m->entries_cap = n;
    }
    if (!grow((void **)&m->arena, &m->arena_cap, m->arena_len + len + 1, 1))
        return tdm_fail(err, TDM_ERR_NOMEM, "hash map: out of memory for keys");
    size_t e = m->count++;
    if (len) memcpy(m->arena + m->arena_len, key, len);
    m->key_off[e] = (uint32_t)m->arena_len;
    m->key_len[e] = (uint32_t)len;
    m->hash[e] = h;
    m->value[e] = value;
    m->arena_len += len;
    m->slots[-f - 2] = (uint32_t)(e + 1);
    return TDM_OK;
}

bool tdm_strmap_get(const tdm_strmap *m, const char *key, size_t len, int32_t *value)
{
    long f = strmap_find(m, key, len, (uint32_t)hash_bytes(key, len));
    if (f < 0) return false;
    *value = m->value[f];
    return true;
}

void tdm_pairmap_init(tdm_pairmap *m)
{
    memset(m, 0, sizeof *m);
}

void tdm_pairmap_free(tdm_pairmap *m)
{
    free(m->keys);
    free(m->values);
    memset(m, 0, sizeof *m);
}

static size_t pair_slot(const tdm_pairmap *m, uint64_t key)
{
    size_t i = hash_u64(key) & (m->cap - 1);
    while (m->keys[i] != UINT64_MAX && m->keys[i] != key)
        i = (i + 1) & (m->cap - 1);
    return i;
}

tdm_status tdm_pairmap_put(tdm_pairmap *m, int32_t left, int32_t right, tdm_pair_value v,
                           bool *existed, tdm_error *err)
{
    if (left < 0 || right < 0) return tdm_fail(err, TDM_ERR_INVALID, "pair map: negative id");
    if ((m->count + 1) * 2 > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 1024;
        uint64_t *keys = malloc(cap * sizeof *keys);
        tdm_pair_value *values = malloc(cap * sizeof *values);
        if (!keys || !values) {
            free(keys);
            free(values);
            return tdm_fail(err, TDM_ERR_NOMEM, "pair map: out of memory for %zu slots", cap);
        }
        memset(keys, 0xff, cap * sizeof *keys);
        tdm_pairmap old = *m;
        m->keys = keys;
        m->values = values;
        m->cap = cap;
        for (size_t i = 0; i < old.cap; i++) {
            if (old.keys[i] == UINT64_MAX) continue;
            size_t s = pair_slot(m, old.keys[i]);
            m->keys[s] = old.keys[i];
            m->values[s] = old.values[i];
        }
        free(old.keys);
        free(old.values);
    }
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    size_t s = pair_slot(m, key);
    bool was = m->keys[s] == key;
    if (existed) *existed = was;
    if (!was) {
        m->keys[s] = key;
        m->count++;
    }
    m->values[s] = v;
    return TDM_OK;
}

const tdm_pair_value *tdm_pairmap_get(const tdm_pairmap *m, int32_t left, int32_t right)
{
    if (!m->cap) return NULL;
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    size_t s = pair_slot(m, key);
    return m->keys[s] == key ? &m->values[s] : NULL;
}
