/* render.h — turning a validated dataset line into token ids and labels.
 *
 * Labels follow Hugging Face: labels[t] is aligned with ids[t] (the loss shifts by one, so the
 * token at t is predicted from ids[0..t)); -100 (TDM_LABEL_IGNORE) keeps a token out of the loss.
 *
 * alpaca, instruct, chat: the conversation goes through the chat template.
 *   chatml, llama3: tdm_chat_render + tdm_chat_encode (tokenizer/chat_template.h): assistant
 *     content and the end-of-turn token that closes it (<|im_end|>, <|eot_id|>) are labelled,
 *     everything else is -100. No extra EOS: the end-of-turn token is what the model learns to
 *     stop on.
 *   none: PREFIX, then per message: system/user CONTENT "\n\n" (prompt); assistant CONTENT EOS
 *     (labelled). PREFIX = the ids the tokenizer's post_processor puts before a text (e.g.
 *     <|begin_of_text|> for Meta's Llama 3.1 files; nothing for Qwen), as prompt.
 * completion: PREFIX prompt (prompt) completion EOS (labelled); prompt and completion are
 *   encoded separately (as TRL does), never through the chat template.
 * text: PREFIX text EOS, all labelled.
 * tokens: ids and labels as given (train_on_prompt does not apply).
 * With train_on_prompt every token of the text formats is labelled.
 * EOS is opts->eos_id; with eos_id < 0 nothing is appended (see tdm_data_find_eos).
 */
#ifndef TANDEM_DATA_RENDER_H
#define TANDEM_DATA_RENDER_H
#include <stdbool.h>
#include <stdint.h>

#include "data/format.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

enum { TDM_LABEL_IGNORE = -100 };

typedef struct tdm_render_opts {
    tdm_chat_template chat_template; // for alpaca, instruct, chat
    bool train_on_prompt;            // label prompt tokens too
    int32_t eos_id;                  // appended after responses / texts (-1: none)
} tdm_render_opts;

/* Appends the ids of f and their labels (same count) to ids and labels. Errors: TDM_ERR_INVALID
 * from the tokenizer (text that is not valid UTF-8), TDM_ERR_NOMEM. */
tdm_status tdm_data_render(tdm_tokenizer *tok, const tdm_data_fields *f,
                           const tdm_render_opts *opts, tdm_token_ids *ids, tdm_token_ids *labels,
                           tdm_error *err);

/* Appends the ids of a prompt for generation: one user turn of text[0..len), rendered as the
 * instruct and chat formats render it in training, followed by what comes before an answer
 * (chatml/llama3: the assistant header, as add_generation_prompt; none: PREFIX TEXT "\n\n").
 * So a model trained on {"instruction": TEXT, ...} is asked exactly what it learned from. */
tdm_status tdm_data_render_prompt(tdm_tokenizer *tok, tdm_chat_template chat_template,
                                  const char *text, size_t len, tdm_token_ids *ids, tdm_error *err);

/* The same for a conversation msgs[0..n) (the last message normally the user's): rendered as the
 * chat format renders it in training, then the assistant header (chatml/llama3), or with none
 * PREFIX and each message's CONTENT followed by "\n\n" (system, user) or by eos_id (assistant;
 * nothing when eos_id < 0). */
tdm_status tdm_data_render_messages_prompt(tdm_tokenizer *tok, tdm_chat_template chat_template,
                                           const tdm_chat_message *msgs, size_t n, int32_t eos_id,
                                           tdm_token_ids *ids, tdm_error *err);

/* The EOS id for a tokenizer: the "eos_token" of tokenizer_config.json in model_dir (a string or
 * {"content": ...}), else config.json's "eos_token_id" (an integer, or the first of a list), else
 * the first of <|endoftext|>, <|end_of_text|>, <|eot_id|>, <|im_end|> the tokenizer has, else -1.
 * model_dir may be NULL or a tokenizer.json path (then only the token names are tried). Never
 * fails: unreadable files are skipped. */
int32_t tdm_data_find_eos(const tdm_tokenizer *tok, const char *model_dir);

#endif
