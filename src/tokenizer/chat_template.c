/* chat_template.c — ChatML and Llama 3 conversation rendering (see chat_template.h). */
#include "tokenizer/chat_template.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

tdm_status tdm_chat_template_parse(const char *name, tdm_chat_template *out, tdm_error *err)
{
    if (!strcmp(name, "chatml"))
        *out = TDM_CHAT_CHATML;
    else if (!strcmp(name, "llama3"))
        *out = TDM_CHAT_LLAMA3;
    else if (!strcmp(name, "none"))
        *out = TDM_CHAT_NONE;
    else
        return tdm_fail(err, TDM_ERR_INVALID,
                        "unknown chat template '%s' (use chatml, llama3 or none)", name);
    return TDM_OK;
}

const char *tdm_chat_template_name(tdm_chat_template t)
{
    switch (t) {
    case TDM_CHAT_CHATML:
        return "chatml";
    case TDM_CHAT_LLAMA3:
        return "llama3";
    case TDM_CHAT_NONE:
        break;
    }
    return "none";
}

tdm_chat_template tdm_chat_template_detect(const tdm_tokenizer *tok)
{
    int32_t id;
    if (tdm_tokenizer_token_id(tok, "<|start_header_id|>", &id) &&
        tdm_tokenizer_token_id(tok, "<|end_header_id|>", &id) &&
        tdm_tokenizer_token_id(tok, "<|eot_id|>", &id))
        return TDM_CHAT_LLAMA3;
    if (tdm_tokenizer_token_id(tok, "<|im_start|>", &id) &&
        tdm_tokenizer_token_id(tok, "<|im_end|>", &id))
        return TDM_CHAT_CHATML;
    return TDM_CHAT_NONE;
}

void tdm_chat_rendered_free(tdm_chat_rendered *r)
{
    free(r->text);
    free(r->segments);
    memset(r, 0, sizeof *r);
}

typedef struct builder {
    tdm_chat_rendered *r;
    size_t text_cap, seg_cap;
    bool failed;
} builder;

/* Appends bytes to the current segment, or starts a new one when the flag changes. */
static void put(builder *b, const char *s, size_t n, bool response)
{
    tdm_chat_rendered *r = b->r;
    if (b->failed || n == 0) return;
    if (r->len + n + 1 > b->text_cap) {
        size_t cap = b->text_cap ? b->text_cap : 256;
        while (cap < r->len + n + 1)
            cap *= 2;
        char *p = realloc(r->text, cap);
        if (!p) {
            b->failed = true;
            return;
        }
        r->text = p;
        b->text_cap = cap;
    }
    if (r->n_segments == 0 || r->segments[r->n_segments - 1].is_response != response) {
        if (r->n_segments == b->seg_cap) {
            size_t cap = b->seg_cap ? b->seg_cap * 2 : 16;
            tdm_chat_segment *p = realloc(r->segments, cap * sizeof *p);
            if (!p) {
                b->failed = true;
                return;
            }
            r->segments = p;
            b->seg_cap = cap;
        }
        r->segments[r->n_segments++] = (tdm_chat_segment){r->len, 0, response};
    }
    memcpy(r->text + r->len, s, n);
    r->len += n;
    r->text[r->len] = 0;
    r->segments[r->n_segments - 1].len += n;
}

static void puts_(builder *b, const char *s, bool response)
{
    put(b, s, strlen(s), response);
}

/* Python's str.isspace, which Jinja's trim uses: White_Space plus U+001C..U+001F. */
static bool py_space(int32_t c)
{
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

static void trim(const char **s, size_t *n)
{
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)*s;
    size_t a = 0, z = *n;
    while (a < z) {
        utf8proc_int32_t c;
        utf8proc_ssize_t l = utf8proc_iterate(p + a, (utf8proc_ssize_t)(z - a), &c);
        if (l <= 0 || !py_space(c)) break;
        a += (size_t)l;
    }
    while (z > a) {
        size_t k = z - 1;
        while (k > a && (p[k] & 0xc0) == 0x80)
            k--;
        utf8proc_int32_t c;
        utf8proc_ssize_t l = utf8proc_iterate(p + k, (utf8proc_ssize_t)(z - k), &c);
        if (l <= 0 || !py_space(c)) break;
        z = k;
    }
    *s += a;
    *n = z - a;
}

tdm_status tdm_chat_render(tdm_chat_template t, const tdm_chat_message *msgs, size_t n,
                           bool add_generation_prompt, tdm_chat_rendered *out, tdm_error *err)
{
    memset(out, 0, sizeof *out);
    builder b = {.r = out};
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].role[0])
            return tdm_fail(err, TDM_ERR_INVALID, "message %zu has no role", i);
    if (t == TDM_CHAT_LLAMA3) puts_(&b, "<|begin_of_text|>", false);
    for (size_t i = 0; i < n; i++) {
        const tdm_chat_message *m = &msgs[i];
        bool resp = !strcmp(m->role, "assistant");
        const char *c = m->content ? m->content : "";
        size_t cl = m->content ? m->content_len : 0;
        switch (t) {
        case TDM_CHAT_CHATML:
            puts_(&b, "<|im_start|>", false);
            puts_(&b, m->role, false);
            puts_(&b, "\n", false);
            put(&b, c, cl, resp);
            puts_(&b, "<|im_end|>", resp);
            puts_(&b, "\n", false);
            break;
        case TDM_CHAT_LLAMA3:
            puts_(&b, "<|start_header_id|>", false);
            puts_(&b, m->role, false);
            puts_(&b, "<|end_header_id|>\n\n", false);
            trim(&c, &cl);
            put(&b, c, cl, resp);
            puts_(&b, "<|eot_id|>", resp);
            break;
        case TDM_CHAT_NONE:
            put(&b, c, cl, resp);
            break;
        }
    }
    if (add_generation_prompt) {
        if (t == TDM_CHAT_CHATML)
            puts_(&b, "<|im_start|>assistant\n", false);
        else if (t == TDM_CHAT_LLAMA3)
            puts_(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n", false);
    }
    if (b.failed) {
        tdm_chat_rendered_free(out);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory rendering a conversation");
    }
    if (!out->text && !(out->text = calloc(1, 1)))
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory rendering a conversation");
    return TDM_OK;
}

tdm_status tdm_chat_encode(tdm_tokenizer *tok, const tdm_chat_rendered *r, tdm_token_ids *ids,
                           tdm_token_ids *mask, tdm_error *err)
{
    for (size_t i = 0; i < r->n_segments; i++) {
        const tdm_chat_segment *s = &r->segments[i];
        size_t before = ids->len;
        tdm_status st = tdm_tokenizer_encode(tok, r->text + s->offset, s->len, false, ids, err);
        if (st != TDM_OK) return st;
        int32_t flag = s->is_response;
        for (size_t k = before; k < ids->len; k++)
            if ((st = tdm_token_ids_append(mask, &flag, 1, err)) != TDM_OK) return st;
    }
    return TDM_OK;
}
