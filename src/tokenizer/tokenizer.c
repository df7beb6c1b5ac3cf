/* tokenizer.c — the encode and decode pipelines of a loaded tokenizer (see tokenizer.h). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/tokenizer.h"

#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/byte_level.h"

size_t tdm_utf8_valid_prefix(const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        uint32_t cp, min;
        if (c >= 0xc2 && c <= 0xdf) {
            n = 2;
            cp = c & 0x1f;
            min = 0x80;
        } else if ((c & 0xf0) == 0xe0) {
            n = 3;
            cp = c & 0x0f;
            min = 0x800;
        } else if (c >= 0xf0 && c <= 0xf4) {
            n = 4;
            cp = c & 0x07;
            min = 0x10000;
        } else {
            return i;
        }
        if (len - i < n) return i;
        for (size_t k = 1; k < n; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return i;
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
        i += n;
    }
    return len;
}

/* One code point from valid UTF-8 at s (n bytes available); its length in *cl. */
static uint32_t utf8_decode(const unsigned char *s, size_t n, size_t *cl)
{
    utf8proc_int32_t cp = 0;
    utf8proc_ssize_t r = utf8proc_iterate(s, (utf8proc_ssize_t)n, &cp);
    *cl = r > 0 ? (size_t)r : 1;
    return r > 0 ? (uint32_t)cp : 0xfffd;
}

/* Unicode White_Space: what Rust's regex `\s` (used by HF for lstrip/rstrip) matches. */
static bool is_white_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0d) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
           c == 0x205f || c == 0x3000;
}

/* Approximates Rust's regex `\w` (Alphabetic, marks, decimal digits, connector punctuation,
 * join controls) by general category. Used only by single_word added tokens. */
static bool is_word_char(uint32_t c)
{
    if (c == 0x200c || c == 0x200d) return true;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
        return true;
    default:
        return false;
    }
}

/* Start of the code point that ends at s[end] (end > 0). */
static size_t prev_char_start(const char *s, size_t end)
{
    size_t i = end - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xc0) == 0x80)
        i--;
    return i;
}

static tdm_status ensure_scratch(tdm_tokenizer *tok, size_t need, tdm_error *err)
{
    if (need <= tok->scratch_cap) return TDM_OK;
    size_t cap = tok->scratch_cap ? tok->scratch_cap : 1024;
    while (cap < need)
        cap *= 2;
    char *p = realloc(tok->scratch, cap);
    if (!p) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory for a %zu-byte word", need);
    tok->scratch = p;
    tok->scratch_cap = cap;
    return TDM_OK;
}

/* At most TDM_TOKENIZER_MAX_WORD bytes of a pre-token: byte-level alphabet, then BPE. */
static tdm_status encode_chunk(tdm_tokenizer *tok, const char *s, size_t len, tdm_token_ids *out,
                               tdm_error *err)
{
    tdm_status st = ensure_scratch(tok, 2 * len + 1, err);
    if (st != TDM_OK) return st;
    size_t n = tdm_byte_level_encode((const uint8_t *)s, len, tok->scratch);
    return tdm_bpe_encode_word(&tok->bpe, tok->scratch, n, out, err);
}

/* A pre-token. One longer than TDM_TOKENIZER_MAX_WORD bytes is encoded in chunks of at most that
 * many bytes, each cut before a UTF-8 lead byte, so that working memory stays bounded (see
 * tokenizer.h for the bound and how it departs from Hugging Face). */
static tdm_status encode_word(tdm_tokenizer *tok, const char *s, size_t len, tdm_token_ids *out,
                              tdm_error *err)
{
    while (len > TDM_TOKENIZER_MAX_WORD) {
        size_t cut = TDM_TOKENIZER_MAX_WORD;
        while (((unsigned char)s[cut] & 0xc0) == 0x80) /* valid UTF-8: a lead byte within 3 */
            cut--;
        tdm_status st = encode_chunk(tok, s, cut, out, err);
        if (st != TDM_OK) return st;
        s += cut;
        len -= cut;
    }
    return encode_chunk(tok, s, len, out, err);
}

/* Pre-tokenizer step `step` over s: the Split regexes in order ("Isolated": every match and every
 * gap between matches is a piece), then each final piece is a word. */
static tdm_status pre_tokenize(tdm_tokenizer *tok, int step, const char *s, size_t len,
                               tdm_token_ids *out, tdm_error *err)
{
    if (len == 0) return TDM_OK;
    if (step == tok->n_splits) return encode_word(tok, s, len, out, err);
    tdm_split_regex *re = &tok->splits[step];
    pcre2_match_data *md = re->match_data;
    size_t pos = 0, piece = 0;
    tdm_status st;
    while (pos < len) {
        int rc = pcre2_match(re->code, (PCRE2_SPTR)s, len, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return tdm_fail(err, TDM_ERR_INVALID, "pre-tokenizer regex failed: %s",
                            (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* empty match: no piece; move past one character */
            size_t cl;
            utf8_decode((const unsigned char *)s + me, len - me, &cl);
            pos = me + cl;
            continue;
        }
        if (ms > piece && (st = pre_tokenize(tok, step + 1, s + piece, ms - piece, out, err)))
            return st;
        if ((st = pre_tokenize(tok, step + 1, s + ms, me - ms, out, err))) return st;
        piece = pos = me;
    }
    if (piece < len) return pre_tokenize(tok, step + 1, s + piece, len - piece, out, err);
    return TDM_OK;
}

static tdm_status encode_gap(tdm_tokenizer *tok, int set, const char *s, size_t len,
                             tdm_token_ids *out, tdm_error *err);

/* Finds the added tokens of `set` (0: matched on raw text, 1: on normalized text) in s,
 * leftmost-longest, as HF's AddedVocabulary::find_matches does; appends their ids and hands the
 * gaps on to encode_gap. */
static tdm_status split_added(tdm_tokenizer *tok, int set, const char *s, size_t len,
                              tdm_token_ids *out, tdm_error *err)
{
    size_t done = 0; /* everything before this is emitted */
    size_t p = 0;
    tdm_status st;
    while (p < len) {
        unsigned char fb = (unsigned char)s[p];
        int32_t cnt = tok->by_first_count[set][fb];
        const tdm_added_token *hit = NULL;
        for (int32_t k = 0; k < cnt; k++) {
            const tdm_added_token *a = &tok->added[tok->by_first_byte[set][fb][k]];
            if (a->match_len <= len - p && !memcmp(s + p, a->match, a->match_len)) {
                hit = a;
                break;
            }
        }
        if (!hit) {
            p++;
            continue;
        }
        size_t start = p, stop = p + hit->match_len;
        if (hit->single_word) {
            size_t cl;
            bool word_before =
                start > 0 &&
                is_word_char(utf8_decode((const unsigned char *)s + prev_char_start(s, start),
                                         start - prev_char_start(s, start), &cl));
            bool word_after =
                stop < len &&
                is_word_char(utf8_decode((const unsigned char *)s + stop, len - stop, &cl));
            if (word_before || word_after) {
                p = stop; /* discarded; matching resumes after it, as aho-corasick's iterator */
                continue;
            }
        }
        if (hit->lstrip) {
            size_t ns = start;
            while (ns > done) {
                size_t ps = prev_char_start(s, ns), cl;
                if (!is_white_space(utf8_decode((const unsigned char *)s + ps, ns - ps, &cl)))
                    break;
                ns = ps;
            }
            start = ns;
        }
        if (hit->rstrip) {
            while (stop < len) {
                size_t cl;
                if (!is_white_space(utf8_decode((const unsigned char *)s + stop, len - stop, &cl)))
                    break;
                stop += cl;
            }
        }
        if (start > done && (st = encode_gap(tok, set, s + done, start - done, out, err)))
            return st;
        if ((st = tdm_token_ids_append(out, &hit->id, 1, err))) return st;
        done = p = stop;
    }
    if (done < len) return encode_gap(tok, set, s + done, len - done, out, err);
    return TDM_OK;
}

/* Text between added tokens: after the raw pass, normalize and look for normalized added tokens;
 * after that pass, pre-tokenize. */
static tdm_status encode_gap(tdm_tokenizer *tok, int set, const char *s, size_t len,
                             tdm_token_ids *out, tdm_error *err)
{
    if (set == 1 || (!tok->n_norms && !tok->has_normalized_added))
        return pre_tokenize(tok, 0, s, len, out, err);
    if (!tok->n_norms) return split_added(tok, 1, s, len, out, err);
    char *norm;
    size_t nlen;
    tdm_status st = tdm_tokenizer_normalize(tok, s, len, &norm, &nlen, err);
    if (st == TDM_OK)
        st = tok->has_normalized_added ? split_added(tok, 1, norm, nlen, out, err)
                                       : pre_tokenize(tok, 0, norm, nlen, out, err);
    free(norm);
    return st;
}

tdm_status tdm_tokenizer_encode(tdm_tokenizer *tok, const char *text, size_t len, bool add_special,
                                tdm_token_ids *out, tdm_error *err)
{
    size_t bad = tdm_utf8_valid_prefix(text, len);
    if (bad != len)
        return tdm_fail(err, TDM_ERR_INVALID,
                        "text is not valid UTF-8 (byte offset %zu, byte 0x%02x)", bad,
                        (unsigned char)text[bad]);
    size_t before = out->len;
    tdm_status st = TDM_OK;
    if (add_special)
        st = tdm_token_ids_append(out, tok->post_prefix, (size_t)tok->n_post_prefix, err);
    if (st == TDM_OK) st = split_added(tok, 0, text, len, out, err);
    if (st == TDM_OK && add_special)
        st = tdm_token_ids_append(out, tok->post_suffix, (size_t)tok->n_post_suffix, err);
    if (st != TDM_OK) out->len = before;
    return st;
}

tdm_status tdm_tokenizer_decode(const tdm_tokenizer *tok, const int32_t *ids, size_t n,
                                bool skip_special, char **out, size_t *out_len, size_t *out_cap,
                                tdm_error *err)
{
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= tok->n_ids || tok->id_len[id] == UINT32_MAX)
            return tdm_fail(err, TDM_ERR_INVALID,
                            "decode: id %d (position %zu) is not in the "
                            "tokenizer",
                            id, i);
        if (skip_special && (tok->id_flags[id] & TDM_TOKFLAG_SPECIAL)) continue;
        size_t tl = tok->id_len[id];
        const char *t = tok->id_arena + tok->id_off[id];
        if (*out_len + tl > *out_cap) {
            size_t cap = *out_cap ? *out_cap : 256;
            while (cap < *out_len + tl)
                cap *= 2;
            char *p = realloc(*out, cap);
            if (!p) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory for decoded text");
            *out = p;
            *out_cap = cap;
        }
        /* As HF's ByteLevel decoder: a token whose characters are all in the byte alphabet
         * becomes those bytes; any other token (e.g. an added token with a space) stays as is. */
        long b = tdm_byte_level_decode(t, tl, (uint8_t *)*out + *out_len);
        if (b < 0) {
            memcpy(*out + *out_len, t, tl);
            b = (long)tl;
        }
        *out_len += (size_t)b;
    }
    return TDM_OK;
}

bool tdm_tokenizer_token_id(const tdm_tokenizer *tok, const char *text, int32_t *id)
{
    size_t len = strlen(text);
    for (size_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].content_len == len && !memcmp(tok->added[i].content, text, len)) {
            *id = tok->added[i].id;
            return true;
        }
    return tdm_bpe_token_id(&tok->bpe, text, len, id);
}

const char *tdm_tokenizer_token_text(const tdm_tokenizer *tok, int32_t id, size_t *len)
{
    if (id < 0 || id >= tok->n_ids || tok->id_len[id] == UINT32_MAX) return NULL;
    if (len) *len = tok->id_len[id];
    return tok->id_arena + tok->id_off[id];
}
