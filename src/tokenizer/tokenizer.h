/* tokenizer.h — byte-level BPE tokenizers read from a Hugging Face tokenizer.json (the Qwen2,
 * Qwen2.5, Qwen3 and Llama 3 families), giving exactly the ids of Hugging Face `tokenizers`
 * `encode(text, add_special_tokens=...)`.
 *
 * Encoding runs the same pipeline as Hugging Face:
 *   1. added tokens (special or not) with normalized=false are cut out of the raw text first
 *      (leftmost-longest match; lstrip/rstrip/single_word honoured);
 *   2. each remaining piece is normalized (NFC/NFD/NFKC/NFKD via utf8proc, when the file asks),
 *      then added tokens with normalized=true are cut out of it;
 *   3. each remaining piece is split by the pre-tokenizer: the file's own Split regex (run through
 *      PCRE2 with UTF+UCP, JIT-compiled when the platform allows, `\s` meaning Unicode White_Space
 *      as in Oniguruma) and/or the ByteLevel GPT-2 regex;
 *   4. each pre-token is written in the byte-level alphabet (byte_level.h) and BPE-encoded (bpe.h);
 *      a pre-token longer than TDM_TOKENIZER_MAX_WORD bytes is encoded as consecutive chunks of at
 *      most that many bytes, cut at character boundaries (see below);
 *   5. with add_special, the ids the post_processor's TemplateProcessing adds go around the result.
 * Anything in the file that this pipeline does not implement is refused at load time, naming the
 * setting (see docs/tokenizer.md).
 *
 * Input text must be valid UTF-8 (Hugging Face only accepts Python/Rust strings): invalid input is
 * TDM_ERR_INVALID with the byte offset of the first bad byte. NUL bytes are ordinary characters.
 * A tdm_tokenizer caches word encodings: use one from one thread at a time.
 */
#ifndef TANDEM_TOKENIZER_TOKENIZER_H
#define TANDEM_TOKENIZER_TOKENIZER_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/bpe.h"
#include "util/error.h"

typedef struct tdm_added_token {
    char *content; // UTF-8, NUL-terminated (content_len excludes it)
    size_t content_len;
    char *match; // what is searched for: content, or its normalized form when normalized
    size_t match_len;
    int32_t id;
    bool special, lstrip, rstrip, single_word, normalized;
} tdm_added_token;

typedef enum tdm_unicode_norm {
    TDM_NORM_NONE = 0,
    TDM_NORM_NFC,
    TDM_NORM_NFD,
    TDM_NORM_NFKC,
    TDM_NORM_NFKD,
} tdm_unicode_norm;

enum { TDM_TOKENIZER_MAX_SPLITS = 4, TDM_TOKENIZER_MAX_NORMS = 4, TDM_TOKENIZER_MAX_POST = 16 };

/* The longest pre-token (bytes of UTF-8 text) that is BPE-encoded in one piece. A pre-tokenizer
 * regex such as \p{L}+ or \s+ does not bound a word, and BPE over a word holds its byte-level copy
 * (1-2 bytes per byte), 12 bytes per symbol for the linked list and 12 per queued pair in the
 * merge heap (capacity 36 per symbol): one unbroken 50 MB ASCII word took 1.25 GB. Longer words are
 * cut into consecutive chunks of at most this many bytes, at character boundaries, and each chunk
 * is encoded alone, so a word needs at most about 8 MB whatever its length. Words of up to 64 KiB
 * (words of real text and code are far shorter; the golden HF fixtures pass unchanged) encode
 * exactly as before and as Hugging Face. For a longer word Hugging Face merges across the cut
 * points, so its ids may differ from ours next to each cut (both decode to the same text). */
enum { TDM_TOKENIZER_MAX_WORD = 1 << 16 };

typedef struct tdm_split_regex {
    void *code;       // pcre2_code_8 *
    void *match_data; // pcre2_match_data_8 *
    bool jit;         // JIT-compiled (else PCRE2's interpreter)
} tdm_split_regex;

typedef struct tdm_tokenizer {
    tdm_bpe bpe;
    tdm_unicode_norm norms[TDM_TOKENIZER_MAX_NORMS]; // applied in order
    int n_norms;
    tdm_split_regex splits[TDM_TOKENIZER_MAX_SPLITS]; // pre-tokenizer regexes, in order
    int n_splits;

    tdm_added_token *added; // (n_added), in file order
    size_t n_added;
    /* added[] indexes by first byte of `match`, longest first, for raw and normalized matching */
    int32_t *by_first_byte[2][256];
    int32_t by_first_count[2][256];
    bool has_normalized_added;

    /* id -> text (vocabulary strings in the byte-level alphabet, added tokens as content) */
    uint32_t *id_off, *id_len; // (n_ids); id_len UINT32_MAX = no such id
    uint8_t *id_flags;         // (n_ids) TDM_TOKFLAG_*
    char *id_arena;
    int32_t n_ids; // max id + 1

    /* post_processor TemplateProcessing "single": ids before and after the text */
    int32_t post_prefix[TDM_TOKENIZER_MAX_POST], post_suffix[TDM_TOKENIZER_MAX_POST];
    int n_post_prefix, n_post_suffix;

    char *scratch; // reusable buffer for normalized / byte-level text
    size_t scratch_cap;
} tdm_tokenizer;

enum { TDM_TOKFLAG_ADDED = 1, TDM_TOKFLAG_SPECIAL = 2 };

/* Loads `path`: a tokenizer.json file, or a directory holding one. On failure nothing needs
 * freeing; messages name the file and, for JSON errors, LINE:COL, and for unsupported settings
 * the JSON path of the setting (e.g. "model.byte_fallback: true is not supported"). */
tdm_status tdm_tokenizer_load(tdm_tokenizer *tok, const char *path, tdm_error *err);
/* Same, from a tokenizer.json already in memory; `name` is used in messages. */
tdm_status tdm_tokenizer_load_json(tdm_tokenizer *tok, const char *json, size_t len,
                                   const char *name, tdm_error *err);
void tdm_tokenizer_free(tdm_tokenizer *tok);

/* Appends the ids of text[0..len) to out: Hugging Face's encode(text, add_special_tokens =
 * add_special).ids. TDM_ERR_INVALID (with the byte offset) for invalid UTF-8. */
tdm_status tdm_tokenizer_encode(tdm_tokenizer *tok, const char *text, size_t len, bool add_special,
                                tdm_token_ids *out, tdm_error *err);

/* Appends the bytes ids stand for to *out (malloc'd, grown as needed, *out_len bytes used, not
 * NUL-terminated): byte-level tokens map back to their bytes, added tokens give their content;
 * special tokens are left out when skip_special. Unlike Hugging Face (which replaces invalid UTF-8
 * with U+FFFD), the raw bytes are returned, so a split multi-byte character survives
 * concatenation. TDM_ERR_INVALID for an id the tokenizer does not have. */
tdm_status tdm_tokenizer_decode(const tdm_tokenizer *tok, const int32_t *ids, size_t n,
                                bool skip_special, char **out, size_t *out_len, size_t *out_cap,
                                tdm_error *err);

/* Runs the file's normalizers over valid UTF-8 s[0..len) into a fresh malloc'd, NUL-terminated
 * *out (a plain copy when there are none). */
tdm_status tdm_tokenizer_normalize(const tdm_tokenizer *tok, const char *s, size_t len, char **out,
                                   size_t *out_len, tdm_error *err);

/* The id of a token by its text (added-token content, or a vocabulary string in the byte-level
 * alphabet); false when absent. */
bool tdm_tokenizer_token_id(const tdm_tokenizer *tok, const char *text, int32_t *id);
/* The text of an id (see above) and its length, or NULL when absent. */
const char *tdm_tokenizer_token_text(const tdm_tokenizer *tok, int32_t id, size_t *len);

/* Byte offset of the first byte of s[0..len) that is not part of valid UTF-8 (overlong forms,
 * surrogates and code points past U+10FFFF are invalid), or len when all of it is valid. */
size_t tdm_utf8_valid_prefix(const char *s, size_t len);

#endif
