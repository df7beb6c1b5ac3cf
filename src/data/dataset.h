/* dataset.h — a JSONL training file read, validated, tokenized and split, all before training.
 *
 * tdm_dataset_load reads the whole file. Each line is, in order:
 *   - blank (only spaces, tabs, \r): skipped and counted (summary.blank_lines);
 *   - invalid UTF-8: bad ("invalid UTF-8", column = byte offset + 1);
 *   - invalid JSON, or a repeated key: bad (jansson's message and column);
 *   - otherwise a sample in one of the formats of format.h (any line may use any format; the
 *     summary counts samples per format), validated there (bad with the reason when not);
 *   - rendered to ids + labels (render.h) and truncated to max_seq_len tokens, keeping the
 *     beginning (summary.truncated, summary.tokens_cut);
 *   - dropped when no label is counted after the shift by one (labels[t] != -100 for some
 *     t >= 1), e.g. a response cut off by truncation (summary.dropped_no_loss and its lines);
 *   - assigned to train or validation by split.h.
 * A UTF-8 byte order mark at the start of the file is skipped.
 * With bad lines and !skip_bad_lines, loading fails (TDM_ERR_PARSE) and nothing is kept; the
 * report holds the first TDM_DATA_MAX_BAD_REPORTED bad lines and their count. With
 * skip_bad_lines they are left out and counted.
 *
 * Memory: 8 bytes per token kept (ids and labels, int32), plus about 40 bytes per sample.
 */
#ifndef TANDEM_DATA_DATASET_H
#define TANDEM_DATA_DATASET_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data/format.h"
#include "data/render.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/sha256.h"

enum { TDM_DATA_MAX_BAD_REPORTED = 20, TDM_DATA_MAX_DROPPED_REPORTED = 20 };

typedef struct tdm_dataset_opts {
    tdm_chat_template chat_template; // resolved by the caller (tdm_chat_template_detect or a flag)
    bool train_on_prompt;
    int32_t eos_id;      // tdm_data_find_eos, or -1 for none
    int32_t max_seq_len; // > 0: longer samples are cut to their first max_seq_len tokens
    int64_t vocab_size;  // token ids of the tokens format must be below it (> 0)
    double val_split;    // [0, 1): fraction for validation (default 0.05)
    uint64_t seed;       // split seed
    bool skip_bad_lines;
    const char *tokenizer_path; // with no tokenizer: the tokenizer.json not found (for messages)
} tdm_dataset_opts;

/* Defaults: chat_template none, eos_id -1, max_seq_len 2048, vocab_size INT32_MAX, val_split
 * 0.05, seed 0, train_on_prompt and skip_bad_lines off. */
void tdm_dataset_opts_default(tdm_dataset_opts *o);

typedef struct tdm_data_bad_line {
    int64_t line;   // 1-based
    int32_t column; // 1-based, 0 when the reason has no column
    char reason[240];
} tdm_data_bad_line;

typedef struct tdm_data_report {
    int64_t lines;       // lines in the file (a last line without \n counts)
    int64_t blank_lines; // skipped
    int64_t bad_lines;   // all of them (skipped or fatal)
    tdm_data_bad_line bad[TDM_DATA_MAX_BAD_REPORTED]; // the first ones, in line order
    int64_t samples;                                  // kept (train + validation)
    int64_t per_format[TDM_DATA_FORMAT_COUNT];        // kept samples per format
    int64_t tokens;                                   // kept tokens, after truncation
    int64_t counted;         // tokens with a label after the shift (the loss's N)
    int64_t truncated;       // samples longer than max_seq_len (kept or dropped)
    int64_t tokens_cut;      // tokens removed by truncation
    int64_t longest;         // longest sample before truncation, in tokens
    int64_t dropped_no_loss; // samples with no counted token (after truncation)
    int64_t dropped_cut;     // of them, those truncation left with none (uncut they had some)
    int64_t dropped_lines[TDM_DATA_MAX_DROPPED_REPORTED]; // the first of their line numbers
    int64_t train_samples, val_samples;
    int64_t train_tokens, val_tokens;
    int64_t train_counted, val_counted;
    char data_hash[TDM_SHA256_TAGGED_LEN]; // "sha256:<hex>" of the file's bytes
} tdm_data_report;

typedef struct tdm_data_sample {
    uint64_t offset;  // first token in the dataset's ids/labels arrays
    uint32_t len;     // tokens (1..max_seq_len)
    uint32_t counted; // labels != -100 at positions 1..len-1
    int64_t line;     // 1-based line in the file
    uint8_t format;   // tdm_data_format
    bool is_val;
} tdm_data_sample;

typedef struct tdm_dataset {
    int32_t *ids;    // (n_tokens) all kept samples back to back
    int32_t *labels; // (n_tokens) aligned with ids, -100 = ignored
    uint64_t n_tokens;
    tdm_data_sample *samples; // (n_samples), in file order
    uint32_t n_samples;
    uint32_t *train, *val; // indices into samples, in file order (n_train, n_val)
    uint32_t n_train, n_val;
    tdm_data_report report;
} tdm_dataset;

/* Reads path (see the header comment). report (may be NULL) receives the report whether or not
 * loading succeeds, so the caller can print bad lines. tok may be NULL (a model without
 * tokenizer.json): pre-tokenized `tokens` samples load, and the first sample that needs
 * tokenizing fails the load (TDM_ERR_NOT_FOUND, "PATH:LINE: a FORMAT sample needs a tokenizer
 * and <opts->tokenizer_path> does not exist ..."). Errors: TDM_ERR_NOT_FOUND/TDM_ERR_IO for the
 * file, TDM_ERR_INVALID for bad options, TDM_ERR_PARSE when there are bad lines and
 * !skip_bad_lines (message: the first one and the count), TDM_ERR_CORRUPT when the tokenizer
 * makes an id at or above vocab_size (tokenizer and model do not match), TDM_ERR_NOMEM. On error
 * nothing needs freeing. A file with no usable sample loads (n_samples 0): the caller decides. */
tdm_status tdm_dataset_load(tdm_dataset *ds, const char *path, tdm_tokenizer *tok,
                            const tdm_dataset_opts *opts, tdm_data_report *report, tdm_error *err);
void tdm_dataset_free(tdm_dataset *ds);

/* The text for humans of the report's bad lines (malloc'd): one "PATH:LINE[:COL]: reason" line
 * per reported bad line, then "... and N more bad lines" when there were more. NULL on no memory.
 */
char *tdm_data_report_bad_text(const tdm_data_report *r, const char *path);

/* For a file that loaded with no training sample (r->train_samples == 0): fills err with
 * TDM_ERR_NOT_FOUND and "PATH: no training sample (S samples, V for validation): " then each
 * cause with what to change: no sample in the file; samples whose counted tokens were all cut by
 * truncation (raise --max-seq-len); samples with no counted token even uncut; every sample left
 * went to validation (lower --val-split). o: the options the file was loaded with. */
tdm_status tdm_data_no_train_sample(const tdm_data_report *r, const char *path,
                                    const tdm_dataset_opts *o, tdm_error *err);

#endif
