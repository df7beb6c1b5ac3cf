/* hashmap.h — the two open-addressing hash tables the tokenizer needs.
 *
 * tdm_strmap maps byte strings (any bytes, NUL included) to int32 values: the vocabulary
 * (token text -> id) and the word cache (pre-token -> offset of its ids). Keys are copied into an
 * arena the map owns. tdm_pairmap maps a pair of token ids to (merge rank, merged id): the BPE
 * merge table. Both use linear probing over a power-of-two slot array kept at most half full, and
 * neither supports removal (only tdm_strmap_clear, which forgets everything).
 */
#ifndef TANDEM_TOKENIZER_HASHMAP_H
#define TANDEM_TOKENIZER_HASHMAP_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

typedef struct tdm_strmap {
    uint32_t *slots;   // (cap) entry index + 1; 0 = empty
    size_t cap;        // slots, a power of two
    uint32_t *key_off; // (count) offset of each key in `arena`
    uint32_t *key_len; // (count) bytes
    uint32_t *hash;    // (count) low 32 bits of the key's hash
    int32_t *value;    // (count)
    size_t count, entries_cap;
    char *arena; // all keys, back to back
    size_t arena_len, arena_cap;
} tdm_strmap;

/* Empty map; no allocation until the first put. */
void tdm_strmap_init(tdm_strmap *m);
void tdm_strmap_free(tdm_strmap *m);
/* Forgets every entry and key, keeping the allocations for reuse. */
void tdm_strmap_clear(tdm_strmap *m);
/* Sets key -> value (overwriting an existing value). *existed (when not NULL) tells whether the key
 * was already present. Fails only with TDM_ERR_NOMEM or TDM_ERR_INVALID (over 4 GiB of keys). */
tdm_status tdm_strmap_put(tdm_strmap *m, const char *key, size_t len, int32_t value, bool *existed,
                          tdm_error *err);
/* True and *value when key is present. */
bool tdm_strmap_get(const tdm_strmap *m, const char *key, size_t len, int32_t *value);

typedef struct tdm_pair_value {
    int32_t rank;   // merge priority: lower merges first
    int32_t merged; // id of the token the pair merges into
} tdm_pair_value;

typedef struct tdm_pairmap {
    uint64_t *keys;         // (cap) (left << 32 | right); UINT64_MAX = empty
    tdm_pair_value *values; // (cap)
    size_t cap, count;
} tdm_pairmap;

void tdm_pairmap_init(tdm_pairmap *m);
void tdm_pairmap_free(tdm_pairmap *m);
/* Sets (left, right) -> v, overwriting an existing entry (a pair listed twice keeps its last rank,
 * as Hugging Face tokenizers' map does). *existed tells whether it was present. Ids must be
 * non-negative. */
tdm_status tdm_pairmap_put(tdm_pairmap *m, int32_t left, int32_t right, tdm_pair_value v,
                           bool *existed, tdm_error *err);
/* Returns the value for (left, right), or NULL when the pair is not a merge. */
const tdm_pair_value *tdm_pairmap_get(const tdm_pairmap *m, int32_t left, int32_t right);

#endif
