/* render.c — dataset lines to ids and labels (see render.h). */
#include "data/render.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util/atomic_file.h"

/* Appends n copies of the label rule for ids[from..): labelled (label = id) or ignored. */
static tdm_status label_range(tdm_token_ids *ids, size_t from, bool labelled, tdm_token_ids *labels,
                              tdm_error *err)
{
    for (size_t i = from; i < ids->len; i++) {
        int32_t l = labelled ? ids->ids[i] : TDM_LABEL_IGNORE;
        tdm_status st = tdm_token_ids_append(labels, &l, 1, err);
        if (st != TDM_OK) return st;
    }
    return TDM_OK;
}

static tdm_status put_text(tdm_tokenizer *tok, const char *s, size_t n, bool labelled,
                           tdm_token_ids *ids, tdm_token_ids *labels, tdm_error *err)
{
    size_t from = ids->len;
    tdm_status st = tdm_tokenizer_encode(tok, s, n, false, ids, err);
    if (st != TDM_OK) return st;
    return label_range(ids, from, labelled, labels, err);
}

static tdm_status put_ids(const int32_t *a, size_t n, bool labelled, tdm_token_ids *ids,
                          tdm_token_ids *labels, tdm_error *err)
{
    size_t from = ids->len;
    tdm_status st = tdm_token_ids_append(ids, a, n, err);
    if (st != TDM_OK) return st;
    return label_range(ids, from, labelled, labels, err);
}

static tdm_status put_prefix(const tdm_tokenizer *tok, bool labelled, tdm_token_ids *ids,
                             tdm_token_ids *labels, tdm_error *err)
{
    return put_ids(tok->post_prefix, (size_t)tok->n_post_prefix, labelled, ids, labels, err);
}

static tdm_status put_eos(const tdm_render_opts *o, tdm_token_ids *ids, tdm_token_ids *labels,
                          tdm_error *err)
{
    if (o->eos_id < 0) return TDM_OK;
    return put_ids(&o->eos_id, 1, true, ids, labels, err);
}

static tdm_status render_conversation(tdm_tokenizer *tok, const tdm_data_fields *f,
                                      const tdm_render_opts *o, tdm_token_ids *ids,
                                      tdm_token_ids *labels, tdm_error *err)
{
    tdm_status st;
    bool all = o->train_on_prompt;
    if (o->chat_template == TDM_CHAT_NONE) {
        if ((st = put_prefix(tok, all, ids, labels, err)) != TDM_OK) return st;
        for (size_t i = 0; i < f->n_messages; i++) {
            const tdm_chat_message *m = &f->messages[i];
            if (!strcmp(m->role, "assistant")) {
                if ((st = put_text(tok, m->content, m->content_len, true, ids, labels, err)) !=
                        TDM_OK ||
                    (st = put_eos(o, ids, labels, err)) != TDM_OK)
                    return st;
            } else {
                if ((st = put_text(tok, m->content, m->content_len, all, ids, labels, err)) !=
                        TDM_OK ||
                    (st = put_text(tok, "\n\n", 2, all, ids, labels, err)) != TDM_OK)
                    return st;
            }
        }
        return TDM_OK;
    }
    tdm_chat_rendered r;
    if ((st = tdm_chat_render(o->chat_template, f->messages, f->n_messages, false, &r, err)) !=
        TDM_OK)
        return st;
    tdm_token_ids mask = {0};
    size_t from = ids->len;
    st = tdm_chat_encode(tok, &r, ids, &mask, err);
    tdm_chat_rendered_free(&r);
    for (size_t i = from; st == TDM_OK && i < ids->len; i++) {
        int32_t l = all || mask.ids[i - from] ? ids->ids[i] : TDM_LABEL_IGNORE;
        st = tdm_token_ids_append(labels, &l, 1, err);
    }
    tdm_token_ids_free(&mask);
    return st;
}

tdm_status tdm_data_render(tdm_tokenizer *tok, const tdm_data_fields *f,
                           const tdm_render_opts *opts, tdm_token_ids *ids, tdm_token_ids *labels,
                           tdm_error *err)
{
    tdm_status st;
    bool all = opts->train_on_prompt;
    switch (f->format) {
    case TDM_DATA_ALPACA:
    case TDM_DATA_INSTRUCT:
    case TDM_DATA_CHAT:
        return render_conversation(tok, f, opts, ids, labels, err);
    case TDM_DATA_COMPLETION:
        if ((st = put_prefix(tok, all, ids, labels, err)) != TDM_OK ||
            (st = put_text(tok, f->prompt ? f->prompt : "", f->prompt_len, all, ids, labels,
                           err)) != TDM_OK ||
            (st = put_text(tok, f->completion, f->completion_len, true, ids, labels, err)) !=
                TDM_OK)
            return st;
        return put_eos(opts, ids, labels, err);
    case TDM_DATA_TEXT:
        if ((st = put_prefix(tok, true, ids, labels, err)) != TDM_OK ||
            (st = put_text(tok, f->text, f->text_len, true, ids, labels, err)) != TDM_OK)
            return st;
        return put_eos(opts, ids, labels, err);
    case TDM_DATA_TOKENS:
        if ((st = tdm_token_ids_append(ids, f->input_ids, f->n_tokens, err)) != TDM_OK) return st;
        return tdm_token_ids_append(labels, f->labels, f->n_tokens, err);
    default:
        return tdm_fail(err, TDM_ERR_INVALID, "unknown dataset format %d", (int)f->format);
    }
}

tdm_status tdm_data_render_prompt(tdm_tokenizer *tok, tdm_chat_template chat_template,
                                  const char *text, size_t len, tdm_token_ids *ids, tdm_error *err)
{
    tdm_chat_message user = {.role = "user", .content = text, .content_len = len};
    return tdm_data_render_messages_prompt(tok, chat_template, &user, 1, -1, ids, err);
}

tdm_status tdm_data_render_messages_prompt(tdm_tokenizer *tok, tdm_chat_template chat_template,
                                           const tdm_chat_message *msgs, size_t n, int32_t eos_id,
                                           tdm_token_ids *ids, tdm_error *err)
{
    tdm_token_ids labels = {0}; /* the renderers write both; the prompt needs none */
    tdm_status st;
    if (chat_template == TDM_CHAT_NONE) {
        tdm_render_opts o = {.chat_template = TDM_CHAT_NONE, .eos_id = eos_id};
        st = put_prefix(tok, false, ids, &labels, err);
        for (size_t i = 0; st == TDM_OK && i < n; i++) {
            bool answer = !strcmp(msgs[i].role, "assistant");
            st = put_text(tok, msgs[i].content, msgs[i].content_len, false, ids, &labels, err);
            if (st == TDM_OK)
                st = answer ? put_eos(&o, ids, &labels, err)
                            : put_text(tok, "\n\n", 2, false, ids, &labels, err);
        }
        tdm_token_ids_free(&labels);
        return st;
    }
    tdm_chat_rendered r;
    if ((st = tdm_chat_render(chat_template, msgs, n, true, &r, err)) != TDM_OK) return st;
    st = tdm_chat_encode(tok, &r, ids, &labels, err);
    tdm_chat_rendered_free(&r);
    tdm_token_ids_free(&labels);
    return st;
}

/* The content of a special-token entry: "text" or {"content": "text"}. */
static const char *token_content(const json_t *v)
{
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_object(v) && json_is_string(json_object_get(v, "content")))
        return json_string_value(json_object_get(v, "content"));
    return NULL;
}

/* An optional JSON file of the model directory, or NULL when it is absent, unreadable, not a
 * regular file (a FIFO must not block the run: tdm_read_file refuses it) or not JSON. */
static json_t *load_optional_json(const char *path)
{
    char *text;
    size_t len;
    if (tdm_read_file(path, &text, &len, NULL) != TDM_OK) return NULL;
    json_t *j = json_loadb(text, len, 0, NULL);
    free(text);
    return j;
}

int32_t tdm_data_find_eos(const tdm_tokenizer *tok, const char *model_dir)
{
    int32_t id;
    struct stat sb;
    if (model_dir && stat(model_dir, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        char path[4096];
        snprintf(path, sizeof path, "%s/tokenizer_config.json", model_dir);
        json_t *cfg = load_optional_json(path);
        const char *eos = token_content(json_object_get(cfg, "eos_token"));
        bool found = eos && tdm_tokenizer_token_id(tok, eos, &id);
        json_decref(cfg);
        if (found) return id;
        snprintf(path, sizeof path, "%s/config.json", model_dir);
        cfg = load_optional_json(path);
        const json_t *e = json_object_get(cfg, "eos_token_id");
        if (json_is_array(e)) e = json_array_get(e, 0);
        json_int_t v = json_is_integer(e) ? json_integer_value(e) : -1;
        json_decref(cfg);
        if (v >= 0 && v < tok->n_ids && tdm_tokenizer_token_text(tok, (int32_t)v, NULL))
            return (int32_t)v;
    }
    static const char *const names[] = {"<|endoftext|>", "<|end_of_text|>", "<|eot_id|>",
                                        "<|im_end|>"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (tdm_tokenizer_token_id(tok, names[i], &id)) return id;
    return -1;
}
