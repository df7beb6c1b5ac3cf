/* tokenizer_json.c — reading a Hugging Face tokenizer.json into a tdm_tokenizer (see tokenizer.h
 * and docs/tokenizer.md for what is supported). Every setting the encoder does not implement is
 * refused here by its JSON path, so a loaded tokenizer always encodes as Hugging Face would.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"
#include "util/atomic_file.h"

/* The GPT-2 regex that ByteLevel(use_regex=true) splits with. */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static tdm_status unsupported(tdm_error *err, const char *where, const char *what)
{
    return tdm_fail(err, TDM_ERR_UNSUPPORTED, "%s: %s is not supported by tandem's tokenizer",
                    where, what);
}

static bool is_null_or_absent(const json_t *v)
{
    return !v || json_is_null(v);
}

static bool key_true(const json_t *obj, const char *key)
{
    return json_is_true(json_object_get(obj, key));
}

/* Oniguruma (which Hugging Face uses) reads \s as Unicode White_Space; PCRE2 with UCP adds
 * U+180E. Rewrites \s and \S to the White_Space property so both agree; everything else is
 * passed through. Returns a malloc'd pattern or NULL on allocation failure. */
static char *onig_to_pcre2(const char *pat, size_t len, size_t *out_len)
{
    static const char WS[] = "\\p{White_Space}", NWS[] = "\\P{White_Space}";
    char *out = malloc(len * (sizeof WS) + 1);
    if (!out) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        if (pat[i] == '\\' && i + 1 < len) {
            if (pat[i + 1] == 's' || pat[i + 1] == 'S') {
                const char *rep = pat[i + 1] == 's' ? WS : NWS;
                memcpy(out + o, rep, sizeof WS - 1);
                o += sizeof WS - 1;
            } else {
                out[o++] = pat[i];
                out[o++] = pat[i + 1];
            }
            i++;
            continue;
        }
        out[o++] = pat[i];
    }
    out[o] = 0;
    *out_len = o;
    return out;
}

static tdm_status add_split(tdm_tokenizer *tok, const char *pat, size_t len, bool literal,
                            const char *where, tdm_error *err)
{
    if (tok->n_splits >= TDM_TOKENIZER_MAX_SPLITS)
        return unsupported(err, where, "more than 4 Split pre-tokenizers");
    size_t plen = len;
    char *p = literal ? NULL : onig_to_pcre2(pat, len, &plen);
    if (!literal && !p) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    int ec;
    PCRE2_SIZE eo;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)(literal ? pat : p), plen, opts, &ec, &eo, NULL);
    free(p);
    if (!code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return tdm_fail(err, TDM_ERR_PARSE, "%s: regex does not compile: %s", where,
                        (const char *)msg);
    }
    tdm_split_regex *s = &tok->splits[tok->n_splits];
    s->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0; /* else the interpreter runs it */
    s->match_data = pcre2_match_data_create_from_pattern(code, NULL);
    if (!s->match_data) {
        pcre2_code_free(code);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    }
    s->code = code;
    tok->n_splits++;
    return TDM_OK;
}

static tdm_status load_normalizer(tdm_tokenizer *tok, const json_t *n, const char *where,
                                  tdm_error *err)
{
    if (is_null_or_absent(n)) return TDM_OK;
    const char *type = json_string_value(json_object_get(n, "type"));
    if (!type) return tdm_fail(err, TDM_ERR_PARSE, "%s: no \"type\"", where);
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(n, "normalizers");
        if (!json_is_array(list))
            return tdm_fail(err, TDM_ERR_PARSE, "%s.normalizers: not a list", where);
        size_t i;
        const json_t *item;
        json_array_foreach(list, i, item)
        {
            char sub[128];
            snprintf(sub, sizeof sub, "%s.normalizers[%zu]", where, i);
            tdm_status st = load_normalizer(tok, item, sub, err);
            if (st != TDM_OK) return st;
        }
        return TDM_OK;
    }
    tdm_unicode_norm kind = !strcmp(type, "NFC")    ? TDM_NORM_NFC
                            : !strcmp(type, "NFD")  ? TDM_NORM_NFD
                            : !strcmp(type, "NFKC") ? TDM_NORM_NFKC
                            : !strcmp(type, "NFKD") ? TDM_NORM_NFKD
                                                    : TDM_NORM_NONE;
    if (kind == TDM_NORM_NONE) {
        char what[160];
        snprintf(what, sizeof what, "normalizer type \"%.100s\"", type);
        return unsupported(err, where, what);
    }
    if (tok->n_norms >= TDM_TOKENIZER_MAX_NORMS)
        return unsupported(err, where, "more than 4 normalizers");
    tok->norms[tok->n_norms++] = kind;
    return TDM_OK;
}

/* pre_tokenizer: Split (Isolated, not inverted), ByteLevel (no prefix space), or a Sequence of
 * those. *byte_level is set when a ByteLevel step was seen (it must be: the model is byte-level).
 */
static tdm_status load_pre_tokenizer(tdm_tokenizer *tok, const json_t *p, const char *where,
                                     bool *byte_level, tdm_error *err)
{
    if (is_null_or_absent(p)) return TDM_OK;
    const char *type = json_string_value(json_object_get(p, "type"));
    if (!type) return tdm_fail(err, TDM_ERR_PARSE, "%s: no \"type\"", where);
    if (*byte_level) return unsupported(err, where, "a pre-tokenizer after ByteLevel");
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(p, "pretokenizers");
        if (!json_is_array(list))
            return tdm_fail(err, TDM_ERR_PARSE, "%s.pretokenizers: not a list", where);
        size_t i;
        const json_t *item;
        json_array_foreach(list, i, item)
        {
            char sub[128];
            snprintf(sub, sizeof sub, "%s.pretokenizers[%zu]", where, i);
            tdm_status st = load_pre_tokenizer(tok, item, sub, byte_level, err);
            if (st != TDM_OK) return st;
        }
        return TDM_OK;
    }
    if (!strcmp(type, "Split")) {
        const char *behavior = json_string_value(json_object_get(p, "behavior"));
        if (!behavior || strcmp(behavior, "Isolated")) {
            char what[160];
            snprintf(what, sizeof what, "Split behavior \"%.100s\" (only Isolated is)",
                     behavior ? behavior : "(missing)");
            return unsupported(err, where, what);
        }
        if (key_true(p, "invert")) return unsupported(err, where, "Split invert: true");
        const json_t *pat = json_object_get(p, "pattern");
        const json_t *re = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
        char sub[160];
        snprintf(sub, sizeof sub, "%s.pattern", where);
        if (json_is_string(re))
            return add_split(tok, json_string_value(re), json_string_length(re), false, sub, err);
        if (json_is_string(lit))
            return add_split(tok, json_string_value(lit), json_string_length(lit), true, sub, err);
        return tdm_fail(err, TDM_ERR_PARSE, "%s: neither {\"Regex\": ...} nor {\"String\": ...}",
                        sub);
    }
    if (!strcmp(type, "ByteLevel")) {
        if (key_true(p, "add_prefix_space"))
            return unsupported(err, where, "ByteLevel add_prefix_space: true");
        const json_t *use_regex = json_object_get(p, "use_regex");
        if (!use_regex || json_is_true(use_regex)) { /* HF's default is true */
            tdm_status st = add_split(tok, GPT2_PATTERN, strlen(GPT2_PATTERN), false, where, err);
            if (st != TDM_OK) return st;
        }
        *byte_level = true;
        return TDM_OK;
    }
    char what[160];
    snprintf(what, sizeof what, "pre_tokenizer type \"%.100s\"", type);
    return unsupported(err, where, what);
}

/* post_processor: ByteLevel (changes only offsets), TemplateProcessing (its "single" template),
 * or a Sequence of those. */
static tdm_status load_post_processor(tdm_tokenizer *tok, const json_t *p, const char *where,
                                      tdm_error *err)
{
    if (is_null_or_absent(p)) return TDM_OK;
    const char *type = json_string_value(json_object_get(p, "type"));
    if (!type) return tdm_fail(err, TDM_ERR_PARSE, "%s: no \"type\"", where);
    if (!strcmp(type, "ByteLevel")) return TDM_OK;
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(p, "processors");
        if (!json_is_array(list))
            return tdm_fail(err, TDM_ERR_PARSE, "%s.processors: not a list", where);
        size_t i;
        const json_t *item;
        json_array_foreach(list, i, item)
        {
            char sub[128];
            snprintf(sub, sizeof sub, "%s.processors[%zu]", where, i);
            tdm_status st = load_post_processor(tok, item, sub, err);
            if (st != TDM_OK) return st;
        }
        return TDM_OK;
    }
    if (strcmp(type, "TemplateProcessing")) {
        char what[160];
        snprintf(what, sizeof what, "post_processor type \"%.100s\"", type);
        return unsupported(err, where, what);
    }
    if (tok->n_post_prefix || tok->n_post_suffix)
        return unsupported(err, where, "two TemplateProcessing post-processors");
    const json_t *single = json_object_get(p, "single");
    const json_t *specials = json_object_get(p, "special_tokens");
    if (!json_is_array(single)) return tdm_fail(err, TDM_ERR_PARSE, "%s.single: not a list", where);
    bool seen_seq = false;
    size_t i;
    const json_t *piece;
    json_array_foreach(single, i, piece)
    {
        const json_t *seq = json_object_get(piece, "Sequence");
        const json_t *sp = json_object_get(piece, "SpecialToken");
        if (seq) {
            const char *sid = json_string_value(json_object_get(seq, "id"));
            if (!sid || strcmp(sid, "A") || seen_seq)
                return unsupported(err, where, "a single template other than one $A sequence");
            seen_seq = true;
            continue;
        }
        const char *name = json_string_value(json_object_get(sp, "id"));
        if (!name)
            return tdm_fail(err, TDM_ERR_PARSE, "%s.single[%zu]: neither Sequence nor SpecialToken",
                            where, i);
        const json_t *ids = json_object_get(json_object_get(specials, name), "ids");
        if (!json_is_array(ids))
            return tdm_fail(err, TDM_ERR_PARSE, "%s.special_tokens: \"%s\" has no ids", where,
                            name);
        size_t j;
        const json_t *idv;
        json_array_foreach(ids, j, idv)
        {
            json_int_t id = json_integer_value(idv);
            if (!json_is_integer(idv) || id < 0 || id > INT32_MAX)
                return tdm_fail(err, TDM_ERR_PARSE, "%s.special_tokens.%s: bad id", where, name);
            int32_t *arr = seen_seq ? tok->post_suffix : tok->post_prefix;
            int *n = seen_seq ? &tok->n_post_suffix : &tok->n_post_prefix;
            if (*n >= TDM_TOKENIZER_MAX_POST)
                return unsupported(err, where, "more than 16 template ids on one side");
            arr[(*n)++] = (int32_t)id;
        }
    }
    if (!seen_seq) return tdm_fail(err, TDM_ERR_PARSE, "%s.single: no $A sequence", where);
    return TDM_OK;
}

static tdm_status load_decoder(const json_t *d, const char *where, tdm_error *err)
{
    if (is_null_or_absent(d)) return TDM_OK;
    const char *type = json_string_value(json_object_get(d, "type"));
    if (!type) return tdm_fail(err, TDM_ERR_PARSE, "%s: no \"type\"", where);
    if (!strcmp(type, "ByteLevel")) return TDM_OK;
    char what[160];
    snprintf(what, sizeof what, "decoder type \"%.100s\"", type);
    return unsupported(err, where, what);
}

static tdm_status set_id_text(tdm_tokenizer *tok, int32_t id, const char *text, size_t len,
                              size_t *arena_len, size_t *arena_cap, tdm_error *err)
{
    if (id < 0 || id >= tok->n_ids) return tdm_fail(err, TDM_ERR_PARSE, "id %d out of range", id);
    if (*arena_len + len + 1 > *arena_cap) {
        size_t cap = *arena_cap ? *arena_cap : 1 << 20;
        while (cap < *arena_len + len + 1)
            cap *= 2;
        char *p = realloc(tok->id_arena, cap);
        if (!p) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory for token texts");
        tok->id_arena = p;
        *arena_cap = cap;
    }
    if (*arena_len + len > UINT32_MAX - 1)
        return tdm_fail(err, TDM_ERR_INVALID, "token texts exceed 4 GiB");
    memcpy(tok->id_arena + *arena_len, text, len);
    tok->id_arena[*arena_len + len] = 0;
    tok->id_off[id] = (uint32_t)*arena_len;
    tok->id_len[id] = (uint32_t)len;
    *arena_len += len + 1;
    return TDM_OK;
}

static tdm_status load_model(tdm_tokenizer *tok, const json_t *model, tdm_error *err)
{
    if (!json_is_object(model)) return tdm_fail(err, TDM_ERR_PARSE, "model: missing");
    const char *type = json_string_value(json_object_get(model, "type"));
    if (type && strcmp(type, "BPE")) {
        char what[160];
        snprintf(what, sizeof what, "model type \"%.100s\" (only BPE is)", type);
        return unsupported(err, "model.type", what);
    }
    if (!is_null_or_absent(json_object_get(model, "dropout")))
        return unsupported(err, "model.dropout", "BPE dropout");
    if (!is_null_or_absent(json_object_get(model, "unk_token")))
        return unsupported(err, "model.unk_token", "an unknown token (byte-level BPE needs none)");
    if (key_true(model, "byte_fallback")) return unsupported(err, "model.byte_fallback", "true");
    const char *pre = json_string_value(json_object_get(model, "continuing_subword_prefix"));
    if (pre && *pre)
        return unsupported(err, "model.continuing_subword_prefix", "a non-empty prefix");
    const char *suf = json_string_value(json_object_get(model, "end_of_word_suffix"));
    if (suf && *suf) return unsupported(err, "model.end_of_word_suffix", "a non-empty suffix");
    tok->bpe.ignore_merges = key_true(model, "ignore_merges");

    const json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab)) return tdm_fail(err, TDM_ERR_PARSE, "model.vocab: not an object");
    const char *key;
    size_t key_len;
    const json_t *v;
    json_object_keylen_foreach((json_t *)vocab, key, key_len, v)
    {
        json_int_t id = json_integer_value(v);
        if (!json_is_integer(v) || id < 0 || id >= INT32_MAX / 2)
            return tdm_fail(err, TDM_ERR_PARSE,
                            "model.vocab.\"%.*s\": id is not an integer in [0, 2^30)",
                            (int)(key_len > 100 ? 100 : key_len), key);
        tdm_status st = tdm_bpe_add_token(&tok->bpe, key, key_len, (int32_t)id, err);
        if (st != TDM_OK) return st;
        if (id + 1 > tok->n_ids) tok->n_ids = (int32_t)id + 1;
    }

    const json_t *merges = json_object_get(model, "merges");
    if (!json_is_array(merges)) return tdm_fail(err, TDM_ERR_PARSE, "model.merges: not a list");
    if (json_array_size(merges) >= INT32_MAX)
        return tdm_fail(err, TDM_ERR_PARSE, "model.merges: too many");
    size_t i;
    const json_t *m;
    json_array_foreach(merges, i, m)
    {
        const char *a, *b;
        size_t alen, blen;
        if (json_is_string(m)) {
            const char *s = json_string_value(m);
            size_t n = json_string_length(m);
            const char *sp = memchr(s, ' ', n);
            if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - s)))
                return tdm_fail(
                    err, TDM_ERR_PARSE,
                    "model.merges[%zu]: \"%.*s\" is not two tokens separated by one space", i,
                    (int)(n > 100 ? 100 : n), s);
            a = s;
            alen = (size_t)(sp - s);
            b = sp + 1;
            blen = n - alen - 1;
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            alen = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            blen = json_string_length(json_array_get(m, 1));
        } else {
            return tdm_fail(err, TDM_ERR_PARSE,
                            "model.merges[%zu]: neither \"a b\" nor [\"a\", \"b\"]", i);
        }
        tdm_status st = tdm_bpe_add_merge(&tok->bpe, a, alen, b, blen, (int32_t)i, err);
        if (st != TDM_OK) return tdm_error_prefix(err, "model.merges[%zu]", i);
    }
    return TDM_OK;
}

static int cmp_by_len_desc(const void *x, const void *y, void *ctx)
{
    const tdm_tokenizer *tok = ctx;
    size_t a = tok->added[*(const int32_t *)x].match_len,
           b = tok->added[*(const int32_t *)y].match_len;
    if (a != b) return a > b ? -1 : 1;
    /* ties (same length, same first byte): file order, like aho-corasick's pattern order */
    return *(const int32_t *)x - *(const int32_t *)y;
}

static tdm_status load_added_tokens(tdm_tokenizer *tok, const json_t *list, tdm_error *err)
{
    if (is_null_or_absent(list)) return TDM_OK;
    if (!json_is_array(list)) return tdm_fail(err, TDM_ERR_PARSE, "added_tokens: not a list");
    size_t n = json_array_size(list);
    tok->added = calloc(n ? n : 1, sizeof *tok->added);
    if (!tok->added) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    size_t i;
    const json_t *t;
    json_array_foreach(list, i, t)
    {
        const json_t *content = json_object_get(t, "content");
        const json_t *idv = json_object_get(t, "id");
        json_int_t id = json_integer_value(idv);
        if (!json_is_string(content) || !json_is_integer(idv) || id < 0 || id >= INT32_MAX / 2)
            return tdm_fail(err, TDM_ERR_PARSE,
                            "added_tokens[%zu]: needs a string \"content\" and an integer \"id\"",
                            i);
        tdm_added_token *a = &tok->added[tok->n_added];
        a->content_len = json_string_length(content);
        if (a->content_len == 0) continue; /* HF ignores empty added tokens */
        a->content = malloc(a->content_len + 1);
        if (!a->content) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        memcpy(a->content, json_string_value(content), a->content_len + 1);
        tok->n_added++;
        a->id = (int32_t)id;
        a->special = key_true(t, "special");
        a->lstrip = key_true(t, "lstrip");
        a->rstrip = key_true(t, "rstrip");
        a->single_word = key_true(t, "single_word");
        /* HF's AddedToken default for normalized is !special */
        const json_t *norm = json_object_get(t, "normalized");
        a->normalized = norm ? json_is_true(norm) : !a->special;
        if (id + 1 > tok->n_ids) tok->n_ids = (int32_t)id + 1;
    }
    return TDM_OK;
}

/* Second pass over added tokens once the normalizer is known: match strings and the per-first-byte
 * index (raw and normalized sets). */
static tdm_status index_added_tokens(tdm_tokenizer *tok, tdm_error *err)
{
    for (size_t i = 0; i < tok->n_added; i++) {
        tdm_added_token *a = &tok->added[i];
        if (a->normalized && tok->n_norms) {
            tdm_status st = tdm_tokenizer_normalize(tok, a->content, a->content_len, &a->match,
                                                    &a->match_len, err);
            if (st != TDM_OK) return tdm_error_prefix(err, "added_tokens[%zu]", i);
        } else {
            a->match = a->content;
            a->match_len = a->content_len;
        }
        if (a->match_len == 0) continue;
        tok->has_normalized_added |= a->normalized;
        int set = a->normalized ? 1 : 0;
        unsigned char fb = (unsigned char)a->match[0];
        int32_t *p = realloc(tok->by_first_byte[set][fb],
                             (size_t)(tok->by_first_count[set][fb] + 1) * sizeof *p);
        if (!p) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        p[tok->by_first_count[set][fb]++] = (int32_t)i;
        tok->by_first_byte[set][fb] = p;
    }
    for (int set = 0; set < 2; set++)
        for (int b = 0; b < 256; b++)
            if (tok->by_first_count[set][b] > 1)
                qsort_r(tok->by_first_byte[set][b], (size_t)tok->by_first_count[set][b],
                        sizeof(int32_t), cmp_by_len_desc, tok);
    return TDM_OK;
}

/* Quotes a token text for a message: at most 60 bytes. */
#define TOKEN_FMT "\"%.*s\""
#define TOKEN_ARG(s, n) (int)((n) > 60 ? 60 : (n)), (s)

/* The byte-level vocabulary must hold every one of the 256 byte symbols: a byte with no symbol is
 * dropped from the text without a word (HF does the same without an unk_token), so a vocabulary
 * lacking one would silently lose data. */
static tdm_status check_byte_symbols(const tdm_tokenizer *tok, tdm_error *err)
{
    if (tok->bpe.vocab.count == 0)
        return tdm_fail(err, TDM_ERR_PARSE,
                        "model.vocab: empty (a byte-level BPE vocabulary holds at least the 256 "
                        "byte symbols)");
    for (int b = 0; b < 256; b++) {
        char sym[4];
        uint8_t byte = (uint8_t)b;
        size_t n = tdm_byte_level_encode(&byte, 1, sym);
        int32_t id;
        if (!tdm_bpe_token_id(&tok->bpe, sym, n, &id))
            return tdm_fail(err, TDM_ERR_PARSE,
                            "model.vocab: no token for byte 0x%02x (byte-level symbol \"%.*s\", "
                            "U+%04X); a byte-level BPE vocabulary must hold all 256 byte "
                            "symbols, or text with that byte would be dropped",
                            b, (int)n, sym, (unsigned)tdm_byte_level_char(byte));
    }
    return TDM_OK;
}

/* Ids must number the tokens without duplicates or holes: model.vocab's V entries take 0..V-1,
 * and the added tokens that are not vocabulary entries take V..V+A-1 (as in every Qwen2/2.5/3
 * and Llama 3 tokenizer.json). An added token may repeat a vocabulary entry with the same text and
 * id (GPT-2's "<|endoftext|>" is in both). This also bounds n_ids by the size of the file, so a
 * hostile id such as 2^30 - 1 cannot make the id table allocate gigabytes. On success n_ids is
 * V + A. Template ids of the post_processor must be tokens. */
static tdm_status check_ids(tdm_tokenizer *tok, tdm_error *err)
{
    const tdm_strmap *v = &tok->bpe.vocab;
    size_t nv = v->count, na = 0;
    for (size_t i = 0; i < tok->n_added; i++)
        na += tok->added[i].id >= (int32_t)nv;
    uint8_t *seen = calloc(nv + na + 1, 1); /* (nv + na) 1 when an id is taken */
    if (!seen) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory checking %zu ids", nv + na);
    tdm_status st = TDM_OK;
    for (size_t e = 0; st == TDM_OK && e < nv; e++) {
        int32_t id = v->value[e];
        const char *text = v->arena + v->key_off[e];
        if ((size_t)id >= nv)
            st = tdm_fail(err, TDM_ERR_PARSE,
                          "model.vocab." TOKEN_FMT ": id %d is beyond the vocabulary's %zu "
                          "entries (ids must run 0..%zu without holes)",
                          TOKEN_ARG(text, v->key_len[e]), id, nv, nv - 1);
        else if (seen[id])
            st = tdm_fail(err, TDM_ERR_PARSE,
                          "model.vocab." TOKEN_FMT ": id %d is already another token's",
                          TOKEN_ARG(text, v->key_len[e]), id);
        else
            seen[id] = 1;
    }
    /* nv entries, none >= nv, no duplicate: 0..nv-1 are all taken */
    for (size_t i = 0; st == TDM_OK && i < tok->n_added; i++) {
        const tdm_added_token *a = &tok->added[i];
        int32_t vid;
        if ((size_t)a->id < nv) {
            if (!tdm_bpe_token_id(&tok->bpe, a->content, a->content_len, &vid) || vid != a->id)
                st = tdm_fail(err, TDM_ERR_PARSE,
                              "added_tokens " TOKEN_FMT ": id %d is already a model.vocab token "
                              "with another text",
                              TOKEN_ARG(a->content, a->content_len), a->id);
        } else if ((size_t)a->id >= nv + na)
            st = tdm_fail(err, TDM_ERR_PARSE,
                          "added_tokens " TOKEN_FMT ": id %d leaves a hole (the vocabulary's %zu "
                          "ids and the %zu added tokens must number 0..%zu)",
                          TOKEN_ARG(a->content, a->content_len), a->id, nv, na, nv + na - 1);
        else if (seen[a->id])
            st = tdm_fail(err, TDM_ERR_PARSE,
                          "added_tokens " TOKEN_FMT ": id %d is already another added token's",
                          TOKEN_ARG(a->content, a->content_len), a->id);
        else
            seen[a->id] = 1;
    }
    free(seen);
    if (st != TDM_OK) return st;
    tok->n_ids = (int32_t)(nv + na);
    for (int side = 0; side < 2; side++) {
        const int32_t *ids = side ? tok->post_suffix : tok->post_prefix;
        int n = side ? tok->n_post_suffix : tok->n_post_prefix;
        for (int k = 0; k < n; k++)
            if (ids[k] >= tok->n_ids)
                return tdm_fail(err, TDM_ERR_PARSE,
                                "post_processor: template id %d is not a token (ids end at %d)",
                                ids[k], tok->n_ids - 1);
    }
    return TDM_OK;
}

static tdm_status build_id_table(tdm_tokenizer *tok, tdm_error *err)
{
    size_t n = (size_t)tok->n_ids;
    tok->id_off = calloc(n ? n : 1, sizeof *tok->id_off);
    tok->id_len = malloc((n ? n : 1) * sizeof *tok->id_len);
    tok->id_flags = calloc(n ? n : 1, 1);
    if (!tok->id_off || !tok->id_len || !tok->id_flags)
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory for %zu ids", n);
    memset(tok->id_len, 0xff, n * sizeof *tok->id_len);
    size_t alen = 0, acap = 0;
    const tdm_strmap *v = &tok->bpe.vocab;
    for (size_t e = 0; e < v->count; e++) {
        tdm_status st = set_id_text(tok, v->value[e], v->arena + v->key_off[e], v->key_len[e],
                                    &alen, &acap, err);
        if (st != TDM_OK) return st;
    }
    for (size_t i = 0; i < tok->n_added; i++) {
        const tdm_added_token *a = &tok->added[i];
        tdm_status st = set_id_text(tok, a->id, a->content, a->content_len, &alen, &acap, err);
        if (st != TDM_OK) return st;
        tok->id_flags[a->id] = TDM_TOKFLAG_ADDED | (a->special ? TDM_TOKFLAG_SPECIAL : 0);
    }
    return TDM_OK;
}

tdm_status tdm_tokenizer_load_json(tdm_tokenizer *tok, const char *text, size_t len,
                                   const char *name, tdm_error *err)
{
    memset(tok, 0, sizeof *tok);
    tdm_bpe_init(&tok->bpe);
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        tdm_tokenizer_free(tok);
        return tdm_fail(err, TDM_ERR_PARSE, "%s:%d:%d: %s", name, je.line, je.column, je.text);
    }
    tdm_status st = TDM_OK;
    bool byte_level = false;
    if (!json_is_object(root))
        st = tdm_fail(err, TDM_ERR_PARSE, "not a JSON object");
    else if (!is_null_or_absent(json_object_get(root, "truncation")))
        st = unsupported(err, "truncation", "truncation (set it to null)");
    else if (!is_null_or_absent(json_object_get(root, "padding")))
        st = unsupported(err, "padding", "padding (set it to null)");
    if (st == TDM_OK) st = load_model(tok, json_object_get(root, "model"), err);
    if (st == TDM_OK) st = load_added_tokens(tok, json_object_get(root, "added_tokens"), err);
    if (st == TDM_OK)
        st = load_normalizer(tok, json_object_get(root, "normalizer"), "normalizer", err);
    if (st == TDM_OK)
        st = load_pre_tokenizer(tok, json_object_get(root, "pre_tokenizer"), "pre_tokenizer",
                                &byte_level, err);
    if (st == TDM_OK && !byte_level)
        st = unsupported(err, "pre_tokenizer", "a tokenizer without a ByteLevel pre-tokenizer");
    if (st == TDM_OK)
        st = load_post_processor(tok, json_object_get(root, "post_processor"), "post_processor",
                                 err);
    if (st == TDM_OK) st = load_decoder(json_object_get(root, "decoder"), "decoder", err);
    if (st == TDM_OK) st = check_byte_symbols(tok, err);
    if (st == TDM_OK) st = check_ids(tok, err);
    if (st == TDM_OK) st = index_added_tokens(tok, err);
    if (st == TDM_OK) st = build_id_table(tok, err);
    json_decref(root);
    if (st != TDM_OK) {
        tdm_error_prefix(err, "%s", name);
        tdm_tokenizer_free(tok);
    }
    return st;
}

tdm_status tdm_tokenizer_load(tdm_tokenizer *tok, const char *path, tdm_error *err)
{
    struct stat sb;
    char file[4096];
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        snprintf(file, sizeof file, "%s/tokenizer.json", path);
    else
        snprintf(file, sizeof file, "%s", path);
    char *text;
    size_t len;
    tdm_status st = tdm_read_file(file, &text, &len, err);
    if (st != TDM_OK) return st;
    st = tdm_tokenizer_load_json(tok, text, len, file, err);
    free(text);
    return st;
}

void tdm_tokenizer_free(tdm_tokenizer *tok)
{
    tdm_bpe_free(&tok->bpe);
    for (int i = 0; i < tok->n_splits; i++) {
        pcre2_match_data_free(tok->splits[i].match_data);
        pcre2_code_free(tok->splits[i].code);
    }
    for (size_t i = 0; i < tok->n_added; i++) {
        if (tok->added[i].match != tok->added[i].content) free(tok->added[i].match);
        free(tok->added[i].content);
    }
    free(tok->added);
    for (int set = 0; set < 2; set++)
        for (int b = 0; b < 256; b++)
            free(tok->by_first_byte[set][b]);
    free(tok->id_off);
    free(tok->id_len);
    free(tok->id_flags);
    free(tok->id_arena);
    free(tok->scratch);
    memset(tok, 0, sizeof *tok);
}

tdm_status tdm_tokenizer_normalize(const tdm_tokenizer *tok, const char *s, size_t len, char **out,
                                   size_t *out_len, tdm_error *err)
{
    char *cur = malloc(len + 1);
    if (!cur) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    memcpy(cur, s, len);
    cur[len] = 0;
    size_t cur_len = len;
    for (int i = 0; i < tok->n_norms; i++) {
        utf8proc_option_t opt = UTF8PROC_STABLE;
        switch (tok->norms[i]) {
        case TDM_NORM_NFC:
            opt |= UTF8PROC_COMPOSE;
            break;
        case TDM_NORM_NFD:
            opt |= UTF8PROC_DECOMPOSE;
            break;
        case TDM_NORM_NFKC:
            opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
            break;
        case TDM_NORM_NFKD:
            opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
            break;
        case TDM_NORM_NONE:
            continue;
        }
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t n =
            utf8proc_map((const utf8proc_uint8_t *)cur, (utf8proc_ssize_t)cur_len, &dst, opt);
        free(cur);
        if (n < 0)
            return tdm_fail(err, TDM_ERR_INVALID, "normalization failed: %s", utf8proc_errmsg(n));
        cur = (char *)dst;
        cur_len = (size_t)n;
    }
    *out = cur;
    *out_len = cur_len;
    return TDM_OK;
}
