/* bpe.h — the BPE model of a Hugging Face tokenizer.json ("model": {"type": "BPE", ...}):
 * a vocabulary (token text -> id), a ranked merge table, and the word encoder.
 *
 * A word (one pre-token, already in the byte-level alphabet) is encoded as Hugging Face does:
 * with ignore_merges set and the whole word in the vocabulary, its id alone; otherwise one symbol
 * per character (characters missing from the vocabulary are dropped, as HF does without an
 * unk_token), then repeatedly the adjacent pair with the lowest merge rank (leftmost on ties) is
 * replaced by its merged token until no adjacent pair is a merge. A min-heap of candidate pairs
 * over a linked list of symbols makes this O(n log n) in the word length. Results for words of at
 * most TDM_BPE_CACHE_MAX_WORD bytes are cached, so a tdm_bpe must not be used by two threads at
 * once. Working memory grows with the word (about 48 bytes per symbol): tokenizer.c bounds the
 * words it passes by TDM_TOKENIZER_MAX_WORD.
 */
#ifndef TANDEM_TOKENIZER_BPE_H
#define TANDEM_TOKENIZER_BPE_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/hashmap.h"
#include "util/error.h"

/* A growable list of token ids. */
typedef struct tdm_token_ids {
    int32_t *ids; // (len)
    size_t len, cap;
} tdm_token_ids;

void tdm_token_ids_free(tdm_token_ids *v);
/* Appends n ids. TDM_ERR_NOMEM on allocation failure. */
tdm_status tdm_token_ids_append(tdm_token_ids *v, const int32_t *ids, size_t n, tdm_error *err);

enum { TDM_BPE_CACHE_MAX_WORD = 256, TDM_BPE_CACHE_MAX_ENTRIES = 1 << 17 };

typedef struct tdm_bpe_heap_item {
    int32_t rank;   // merge rank (lower first)
    int32_t pos;    // index of the left symbol
    int32_t merged; // id the pair merged into when it was queued (stale check)
} tdm_bpe_heap_item;

typedef struct tdm_bpe {
    tdm_strmap vocab;   // token text (byte-level alphabet, UTF-8) -> id
    tdm_pairmap merges; // (left id, right id) -> (rank, merged id)
    bool ignore_merges; // a word that is itself in the vocabulary is emitted whole

    tdm_strmap cache;   // word -> offset into cache_ids, where [count, ids...] is stored
    int32_t *cache_ids; // (cache_len)
    size_t cache_len, cache_cap;

    /* scratch for one word */
    int32_t *sym_id, *sym_prev, *sym_next; // (scratch_cap) per symbol; sym_id -1 = merged away
    tdm_bpe_heap_item *heap;               // (heap_cap)
    size_t scratch_cap, heap_cap;
} tdm_bpe;

void tdm_bpe_init(tdm_bpe *bpe);
void tdm_bpe_free(tdm_bpe *bpe);
/* Adds a vocabulary entry (text in the byte-level alphabet). */
tdm_status tdm_bpe_add_token(tdm_bpe *bpe, const char *text, size_t len, int32_t id,
                             tdm_error *err);
/* Looks up a vocabulary entry; false when absent. */
bool tdm_bpe_token_id(const tdm_bpe *bpe, const char *text, size_t len, int32_t *id);
/* Adds merge number `rank` of "left right": both halves and their concatenation must be in the
 * vocabulary (TDM_ERR_PARSE naming the missing piece otherwise). */
tdm_status tdm_bpe_add_merge(tdm_bpe *bpe, const char *left, size_t left_len, const char *right,
                             size_t right_len, int32_t rank, tdm_error *err);
/* Encodes one word (see the header comment) and appends its ids to out. */
tdm_status tdm_bpe_encode_word(tdm_bpe *bpe, const char *word, size_t len, tdm_token_ids *out,
                               tdm_error *err);

#endif
