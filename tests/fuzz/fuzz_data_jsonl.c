/* fuzz_data_jsonl.c — libFuzzer target: any bytes as a JSONL dataset file, loaded with a built-in
 * byte-level tokenizer (ids 0..255 = bytes, <|im_start|> 256, <|im_end|> 257) and ChatML. The
 * first byte picks options (max_seq_len, skip_bad_lines, train_on_prompt, template); the rest is
 * the file. Properties (abort on violation): the status is TDM_OK or TDM_ERR_PARSE (bad lines);
 * every line is exactly one of blank, bad, dropped or kept; samples lie back to back, each within
 * max_seq_len with at least one counted token; train + validation = samples; a few batches over
 * the train set keep their invariants. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/batch.h"
#include "tokenizer/byte_level.h"

static tdm_tokenizer fuzz_data_tok;
static bool fuzz_data_ready;
static char fuzz_data_path[64];

static void fuzz_data_teardown(void)
{
    tdm_tokenizer_free(&fuzz_data_tok);
    if (fuzz_data_path[0]) unlink(fuzz_data_path);
}

static void fuzz_data_setup(void)
{
    json_t *vocab = json_object(), *added = json_array();
    for (int b = 0; b < 256; b++) {
        char enc[4];
        uint8_t c = (uint8_t)b;
        size_t n = tdm_byte_level_encode(&c, 1, enc);
        enc[n] = 0;
        json_object_set_new(vocab, enc, json_integer(b));
    }
    const char *names[] = {"<|im_start|>", "<|im_end|>"};
    for (int i = 0; i < 2; i++)
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", 256 + i,
                                               "content", names[i], "single_word", 0, "lstrip", 0,
                                               "rstrip", 0, "normalized", 0, "special", 1));
    json_t *root = json_pack("{s:o, s:n, s:{s:s, s:b, s:b}, s:{s:s}, s:{s:s, s:o, s:[]}}",
                             "added_tokens", added, "normalizer", "pre_tokenizer", "type",
                             "ByteLevel", "add_prefix_space", 0, "use_regex", 0, "decoder", "type",
                             "ByteLevel", "model", "type", "BPE", "vocab", vocab, "merges");
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    tdm_error err = {0};
    if (!text ||
        tdm_tokenizer_load_json(&fuzz_data_tok, text, strlen(text), "fuzz-data", &err) != TDM_OK) {
        fprintf(stderr, "fuzz_data_jsonl: setup failed: %s\n", err.message);
        abort();
    }
    free(text);
    snprintf(fuzz_data_path, sizeof fuzz_data_path, "/tmp/tandem-fuzz-data-XXXXXX");
    int fd = mkstemp(fuzz_data_path);
    if (fd < 0) abort();
    close(fd);
    fuzz_data_ready = true;
    atexit(fuzz_data_teardown);
}

#define FUZZ_CHECK(c)                                                                              \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "fuzz_data_jsonl: %s failed\n", #c);                                   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static int fuzz_data_jsonl_one(const uint8_t *data, size_t size)
{
    if (!fuzz_data_ready) fuzz_data_setup();
    uint8_t opt = size ? data[0] : 0;
    if (size) {
        data++;
        size--;
    }
    FILE *f = fopen(fuzz_data_path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) abort();

    tdm_dataset_opts o;
    tdm_dataset_opts_default(&o);
    o.max_seq_len = 1 + (opt & 31);
    o.skip_bad_lines = opt & 32;
    o.train_on_prompt = opt & 64;
    o.chat_template = opt & 128 ? TDM_CHAT_CHATML : TDM_CHAT_NONE;
    o.eos_id = 257;
    o.vocab_size = 300;
    o.val_split = 0.25;
    tdm_dataset ds;
    tdm_data_report rep;
    tdm_error err = {0};
    tdm_status st = tdm_dataset_load(&ds, fuzz_data_path, &fuzz_data_tok, &o, &rep, &err);
    FUZZ_CHECK(st == TDM_OK || st == TDM_ERR_PARSE);
    FUZZ_CHECK(rep.lines == rep.blank_lines + rep.bad_lines + rep.samples + rep.dropped_no_loss);
    char *text = tdm_data_report_bad_text(&rep, "f");
    FUZZ_CHECK(text != NULL);
    free(text);
    if (st != TDM_OK) {
        FUZZ_CHECK(rep.bad_lines > 0 && !o.skip_bad_lines);
        return 0;
    }
    FUZZ_CHECK(ds.n_samples == rep.samples && ds.n_train + ds.n_val == ds.n_samples);
    uint64_t off = 0;
    int64_t per_format = 0;
    for (int k = 0; k < TDM_DATA_FORMAT_COUNT; k++)
        per_format += rep.per_format[k];
    FUZZ_CHECK(per_format == rep.samples);
    for (uint32_t i = 0; i < ds.n_samples; i++) {
        const tdm_data_sample *s = &ds.samples[i];
        FUZZ_CHECK(s->offset == off && s->len >= 2 && s->len <= (uint32_t)o.max_seq_len);
        uint32_t counted = 0;
        for (uint32_t t = 0; t < s->len; t++) {
            FUZZ_CHECK(ds.ids[off + t] >= 0 && ds.ids[off + t] < 300);
            if (t) counted += ds.labels[off + t] != TDM_LABEL_IGNORE;
        }
        FUZZ_CHECK(counted == s->counted && counted > 0);
        off += s->len;
    }
    FUZZ_CHECK(off == ds.n_tokens);
    if (ds.n_train) {
        tdm_batch_source src = {&ds, ds.train, ds.n_train, 3};
        tdm_data_cursor cur;
        tdm_data_cursor_init(&cur, ds.n_train, opt, true);
        tdm_batch b = {0};
        for (int step = 0; step < 3; step++) {
            FUZZ_CHECK(tdm_batch_next(&b, &src, &cur, 1, &err) == TDM_OK);
            FUZZ_CHECK(b.n_segs == 1 && b.segs[0].row_end == b.n_rows && b.n_seqs == 3);
            int64_t counted = 0;
            for (int32_t s = 0; s < b.n_seqs; s++) {
                FUZZ_CHECK(b.positions[b.cu_seqlens[s]] == 0);
                counted += ds.samples[b.seq_sample[s]].counted;
            }
            FUZZ_CHECK(counted == b.counted[0]);
        }
        tdm_batch_free(&b);
        tdm_data_cursor_free(&cur);
    }
    tdm_dataset_free(&ds);
    return 0;
}

#ifndef TANDEM_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fuzz_data_jsonl_one(data, size);
}
#endif
