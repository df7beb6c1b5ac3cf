/* format.h — the JSONL dataset formats: detecting a line's format from its keys, validating its
 * fields, and the canonical content that the train/validation split hashes.
 *
 * One JSON object per line. The format comes from the keys present (other keys, such as "id" or
 * "source", are ignored):
 *
 *   alpaca       {"instruction", "input"?, "output", "system"?}
 *   instruct     {"instruction", "response", "system"?}
 *   completion   {"prompt", "completion"}
 *   chat         {"messages": [{"role": "system"|"user"|"assistant", "content"}, ...]}
 *   text         {"text"}
 *   tokens       {"input_ids": [...], "labels"?: [...], "attention_mask"?: [...]}
 *
 * Each format owns some keys (alpaca: output, input; instruct: response; completion: prompt,
 * completion; chat: messages; text: text; tokens: input_ids, labels, attention_mask); "instruction"
 * and "system" are shared by alpaca and instruct. A line whose owned keys belong to two formats, or
 * that has a shared key with a format that does not take it, is bad ("mixes keys ..."), as is a
 * line with none of these keys. docs/datasets.md lists every rule and reason.
 *
 * The message-based formats (alpaca, instruct, chat) are turned into a conversation:
 *   alpaca:   [system,] user = instruction (+ "\n\n" + input when input is not empty), assistant =
 * output instruct: [system,] user = instruction, assistant = response
 */
#ifndef TANDEM_DATA_FORMAT_H
#define TANDEM_DATA_FORMAT_H
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/chat_template.h"
#include "util/error.h"

typedef enum tdm_data_format {
    TDM_DATA_ALPACA = 0,
    TDM_DATA_INSTRUCT,
    TDM_DATA_COMPLETION,
    TDM_DATA_CHAT,
    TDM_DATA_TEXT,
    TDM_DATA_TOKENS,
    TDM_DATA_FORMAT_COUNT
} tdm_data_format;

/* "alpaca", "instruct", "completion", "chat", "text", "tokens". */
const char *tdm_data_format_name(tdm_data_format f);

/* A validated line. Strings point into the JSON object it was parsed from (keep it alive) or into
 * user_buf; free with tdm_data_fields_free. */
typedef struct tdm_data_fields {
    tdm_data_format format;
    /* alpaca, instruct, chat: the conversation (roles "system", "user", "assistant") */
    tdm_chat_message *messages; // (n_messages), malloc'd
    size_t n_messages;
    /* completion */
    const char *prompt, *completion;
    size_t prompt_len, completion_len;
    /* text */
    const char *text;
    size_t text_len;
    /* tokens: ids and labels (labels = input_ids when the line has none) */
    int32_t *input_ids, *labels; // (n_tokens), malloc'd
    size_t n_tokens;
    char *user_buf; // alpaca: instruction + "\n\n" + input
} tdm_data_fields;

/* Detects the format of a parsed line and validates it. vocab_size bounds token ids of the tokens
 * format (ids must be in [0, vocab_size)). TDM_OK: *f is filled. TDM_ERR_PARSE: the line is bad and
 * err->message is the reason (without FILE:LINE). TDM_ERR_NOMEM otherwise. On error nothing needs
 * freeing. */
tdm_status tdm_data_fields_parse(const json_t *obj, int64_t vocab_size, tdm_data_fields *f,
                                 tdm_error *err);
void tdm_data_fields_free(tdm_data_fields *f);

/* The canonical content of a sample as compact JSON with sorted keys and ASCII escapes (malloc'd,
 * NUL-terminated): {"messages":[{"content":..,"role":..},..]} for alpaca/instruct/chat (so the same
 * conversation written in two formats is the same sample), {"completion":..,"prompt":..},
 * {"text":..}, {"input_ids":[..],"labels":[..]}. Keys the format ignores, key order and
 * whitespace do not change it. */
tdm_status tdm_data_fields_canonical(const tdm_data_fields *f, char **out, size_t *len,
                                     tdm_error *err);

#endif
