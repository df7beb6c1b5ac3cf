/* fuzz_tokenizer_encode.c — libFuzzer target: any bytes as text for two small byte-level BPE
 * tokenizers built once. The plain one must give decode(encode(x)) == x for valid UTF-8 (and
 * refuse invalid UTF-8); the other (NFC, added tokens with lstrip/rstrip/single_word/normalized)
 * must just not crash. A failed property aborts, which libFuzzer reports. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"

static const char FUZZ_SPLIT[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
                                 "{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                                 "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static void fuzz_add_vocab(json_t *vocab, const char *plain, int id)
{
    char enc[64];
    size_t n = tdm_byte_level_encode((const uint8_t *)plain, strlen(plain), enc);
    enc[n] = 0;
    json_object_set_new(vocab, enc, json_integer(id));
}

static void fuzz_add_merge(json_t *merges, const char *a, const char *b)
{
    char ea[32], eb[32];
    size_t na = tdm_byte_level_encode((const uint8_t *)a, strlen(a), ea);
    size_t nb = tdm_byte_level_encode((const uint8_t *)b, strlen(b), eb);
    ea[na] = eb[nb] = 0;
    json_array_append_new(merges, json_pack("[s,s]", ea, eb));
}

static void fuzz_build(tdm_tokenizer *tok, bool fancy)
{
    json_t *vocab = json_object(), *merges = json_array(), *added = json_array();
    for (int b = 0; b < 256; b++) {
        char enc[4];
        uint8_t c = (uint8_t)b;
        size_t n = tdm_byte_level_encode(&c, 1, enc);
        enc[n] = 0;
        json_object_set_new(vocab, enc, json_integer(b));
    }
    const char *pairs[][2] = {{"t", "h"},   {"th", "e"}, {" ", "the"}, {"i", "n"},      {" ", " "},
                              {"  ", "  "}, {"1", "2"},  {"12", "3"},  {"\xc3", "\xa9"}};
    int id = 256;
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
        char joined[16];
        snprintf(joined, sizeof joined, "%s%s", pairs[i][0], pairs[i][1]);
        fuzz_add_vocab(vocab, joined, id++);
        fuzz_add_merge(merges, pairs[i][0], pairs[i][1]);
    }
    if (fancy) {
        const char *names[] = {"<|im_end|>", "<L>", "<R>", "the", "caf\xc3\xa9"};
        for (int i = 0; i < 5; i++)
            json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id",
                                                   id + i, "content", names[i], "single_word",
                                                   i == 3, "lstrip", i == 1, "rstrip", i == 2,
                                                   "normalized", i == 4, "special", i < 3));
    } else {
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id,
                                               "content", "<|im_end|>", "single_word", 0, "lstrip",
                                               0, "rstrip", 0, "normalized", 0, "special", 1));
    }
    json_t *root =
        json_pack("{s:o, s:o, s:{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b}]}, s:{s:s}, "
                  "s:{s:s, s:b, s:o, s:o}}",
                  "added_tokens", added, "normalizer",
                  fancy ? json_pack("{s:s}", "type", "NFC") : json_null(), "pre_tokenizer", "type",
                  "Sequence", "pretokenizers", "type", "Split", "pattern", "Regex", FUZZ_SPLIT,
                  "behavior", "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space", 0,
                  "use_regex", 0, "decoder", "type", "ByteLevel", "model", "type", "BPE",
                  "ignore_merges", 1, "vocab", vocab, "merges", merges);
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    tdm_error err = {0};
    if (!text || tdm_tokenizer_load_json(tok, text, strlen(text), "fuzz-encode", &err) != TDM_OK) {
        fprintf(stderr, "fuzz_tokenizer_encode: setup failed: %s\n", err.message);
        abort();
    }
    free(text);
}

static tdm_tokenizer fuzz_plain, fuzz_fancy;
static bool fuzz_ready;

static void fuzz_teardown(void)
{
    tdm_tokenizer_free(&fuzz_plain);
    tdm_tokenizer_free(&fuzz_fancy);
}

static int fuzz_tokenizer_encode_one(const uint8_t *data, size_t size)
{
    if (!fuzz_ready) {
        fuzz_build(&fuzz_plain, false);
        fuzz_build(&fuzz_fancy, true);
        fuzz_ready = true;
        atexit(fuzz_teardown);
    }
    const char *text = (const char *)data;
    bool valid = tdm_utf8_valid_prefix(text, size) == size;
    tdm_token_ids ids = {0};
    tdm_error err = {0};
    tdm_status st = tdm_tokenizer_encode(&fuzz_plain, text, size, false, &ids, &err);
    if ((st == TDM_OK) != valid) abort();
    if (st == TDM_OK) {
        char *out = NULL;
        size_t len = 0, cap = 0;
        if (tdm_tokenizer_decode(&fuzz_plain, ids.ids, ids.len, false, &out, &len, &cap, &err) !=
                TDM_OK ||
            len != size || (size && memcmp(out, text, size)))
            abort();
        free(out);
        ids.len = 0;
        (void)tdm_tokenizer_encode(&fuzz_fancy, text, size, true, &ids, &err);
    }
    tdm_token_ids_free(&ids);
    return 0;
}

#ifndef TANDEM_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fuzz_tokenizer_encode_one(data, size);
}
#endif
