/* chat_template.h — rendering a conversation into text segments for training.
 *
 * Two fixed formats (no Jinja): ChatML, as Qwen2/2.5/3 use it, and Llama 3. The format is chosen
 * from the tokenizer's special tokens (tdm_chat_template_detect) or named by the user
 * (`--chat-template chatml|llama3|none`). Rendering yields text segments, each flagged
 * is_response when it is assistant output the model should learn (the content and the end-of-turn
 * token that closes it); everything else (headers, system and user turns) is prompt, which the
 * datasets code masks out of the loss.
 *
 *   chatml:  per message  "<|im_start|>" ROLE "\n"  | CONTENT "<|im_end|>" |  "\n"
 *   llama3:  "<|begin_of_text|>", then per message
 *            "<|start_header_id|>" ROLE "<|end_header_id|>\n\n" | TRIM(CONTENT) "<|eot_id|>"
 *   none:    the contents back to back
 * ("|" marks segment boundaries; the middle part is is_response for role "assistant".) With
 * add_generation_prompt, the header of an assistant turn is appended as a prompt segment.
 * TRIM strips leading and trailing white space as Jinja's `trim` (Python str.strip) does.
 * docs/chat-templates.md compares these with the models' own Jinja templates.
 */
#ifndef TANDEM_TOKENIZER_CHAT_TEMPLATE_H
#define TANDEM_TOKENIZER_CHAT_TEMPLATE_H
#include <stdbool.h>
#include <stddef.h>

#include "tokenizer/tokenizer.h"
#include "util/error.h"

typedef enum tdm_chat_template {
    TDM_CHAT_NONE = 0,
    TDM_CHAT_CHATML,
    TDM_CHAT_LLAMA3,
} tdm_chat_template;

typedef struct tdm_chat_message {
    const char *role;    // "system", "user", "assistant", "tool", ... (NUL-terminated)
    const char *content; // UTF-8, content_len bytes
    size_t content_len;
} tdm_chat_message;

typedef struct tdm_chat_segment {
    size_t offset, len; // bytes of tdm_chat_render's text
    bool is_response;   // assistant output: kept in the loss
} tdm_chat_segment;

typedef struct tdm_chat_rendered {
    char *text; // all segments back to back (malloc'd, NUL-terminated)
    size_t len;
    tdm_chat_segment *segments; // (n_segments), in order, covering text exactly
    size_t n_segments;
} tdm_chat_rendered;

/* "chatml", "llama3" or "none" -> *out; TDM_ERR_INVALID naming the accepted values otherwise. */
tdm_status tdm_chat_template_parse(const char *name, tdm_chat_template *out, tdm_error *err);
const char *tdm_chat_template_name(tdm_chat_template t);
/* llama3 when the tokenizer has <|start_header_id|>, <|end_header_id|> and <|eot_id|>; chatml when
 * it has <|im_start|> and <|im_end|>; none otherwise. */
tdm_chat_template tdm_chat_template_detect(const tdm_tokenizer *tok);

/* Renders msgs[0..n) (see the header comment) into *out, which the caller frees with
 * tdm_chat_rendered_free. TDM_ERR_INVALID for an empty role. */
tdm_status tdm_chat_render(tdm_chat_template t, const tdm_chat_message *msgs, size_t n,
                           bool add_generation_prompt, tdm_chat_rendered *out, tdm_error *err);
void tdm_chat_rendered_free(tdm_chat_rendered *r);

/* Encodes a rendering segment by segment (add_special false, as the special tokens are in the
 * text) and appends the ids to ids and, per id, 1 (response) or 0 (prompt) to mask (same
 * length as ids afterwards). Segment boundaries always fall next to a special token or a
 * header's newline, so this equals encoding the whole text except when a response starts with a
 * newline that would have merged with the header's (documented in docs/chat-templates.md). */
tdm_status tdm_chat_encode(tdm_tokenizer *tok, const tdm_chat_rendered *r, tdm_token_ids *ids,
                           tdm_token_ids *mask, tdm_error *err);

#endif
