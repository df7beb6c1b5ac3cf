/* data_model.h — what a model contributes to reading a dataset, read the same way by
 * `tandem finetune`, `tandem eval` and `tandem data check`:
 *   - vocab_size: config.json's (docs/datasets.md: ids of the `tokens` format must be below it);
 *     a lone tokenizer.json (data check only) uses the tokenizer's size;
 *   - the tokenizer, only when one exists: a model directory without tokenizer.json still reads
 *     pre-tokenized `tokens` data, and the first sample needing a tokenizer fails naming the
 *     missing file (tdm_dataset_load);
 *   - the chat template (detected from the tokenizer unless the caller gives one) and the EOS id.
 */
#ifndef TANDEM_DATA_DATA_MODEL_H
#define TANDEM_DATA_DATA_MODEL_H
#include <stdbool.h>
#include <stdint.h>

#include "data/dataset.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

typedef struct tdm_data_model {
    tdm_tokenizer tok;         // valid when have_tokenizer
    bool have_tokenizer;       // false: MODEL_DIR/tokenizer.json does not exist
    char tokenizer_path[4096]; // MODEL_DIR/tokenizer.json, or the tokenizer file given
} tdm_data_model;

/* Opens the model side of data reading. path: a model directory or (config_vocab_size <= 0) a
 * tokenizer.json file. config_vocab_size: config.json's vocab_size, or <= 0 when there is no
 * config (then the tokenizer's size bounds the ids, and the tokenizer is required). Fills o's
 * vocab_size, eos_id, tokenizer_path, and chat_template unless template_given. A tokenizer.json
 * that exists but cannot be read or parsed fails (its loader's error). Free with
 * tdm_data_model_close. */
tdm_status tdm_data_model_open(tdm_data_model *m, const char *path, int64_t config_vocab_size,
                               bool template_given, tdm_dataset_opts *o, tdm_error *err);

/* The tokenizer, or NULL when the model has none (pass it to tdm_dataset_load as it is). */
tdm_tokenizer *tdm_data_model_tokenizer(tdm_data_model *m);

void tdm_data_model_close(tdm_data_model *m);

#endif
