/* format.c — format detection, validation and canonical content of dataset lines (see format.h). */
#include "data/format.h"

#include "tokenizer/tokenizer.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *tdm_data_format_name(tdm_data_format f)
{
    static const char *const names[TDM_DATA_FORMAT_COUNT] = {
        "alpaca", "instruct", "completion", "chat", "text", "tokens",
    };
    return (unsigned)f < TDM_DATA_FORMAT_COUNT ? names[f] : "?";
}

/* Keys each format owns; "instruction" and "system" are shared by alpaca and instruct. */
static const struct {
    const char *key;
    tdm_data_format format;
} owned[] = {
    {"output", TDM_DATA_ALPACA},
    {"input", TDM_DATA_ALPACA},
    {"response", TDM_DATA_INSTRUCT},
    {"prompt", TDM_DATA_COMPLETION},
    {"completion", TDM_DATA_COMPLETION},
    {"messages", TDM_DATA_CHAT},
    {"conversations", TDM_DATA_CHAT}, /* ShareGPT */
    {"text", TDM_DATA_TEXT},
    {"input_ids", TDM_DATA_TOKENS},
    {"labels", TDM_DATA_TOKENS},
    {"attention_mask", TDM_DATA_TOKENS},
};
enum { N_OWNED = sizeof owned / sizeof owned[0] };

static const char *json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "a list";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    case JSON_NULL:
        return "null";
    }
    return "?";
}

static tdm_status bad(tdm_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static tdm_status bad(tdm_error *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err) {
        err->status = TDM_ERR_PARSE;
        vsnprintf(err->message, sizeof err->message, fmt, ap);
    }
    va_end(ap);
    return TDM_ERR_PARSE;
}

/* A string field: required (absent or null is an error) or optional (absent/null gives NULL).
 * nonempty: "" is an error. */
static tdm_status get_string(const json_t *obj, const char *key, bool required, bool nonempty,
                             const char **s, size_t *len, tdm_error *err)
{
    const json_t *v = json_object_get(obj, key);
    *s = NULL;
    *len = 0;
    if (!v || json_is_null(v)) {
        if (required) return bad(err, "missing \"%s\"", key);
        return TDM_OK;
    }
    if (!json_is_string(v)) return bad(err, "\"%s\" must be a string, not %s", key, json_kind(v));
    *s = json_string_value(v);
    *len = json_string_length(v);
    if (nonempty && *len == 0) return bad(err, "\"%s\" is empty", key);
    return TDM_OK;
}

static tdm_status nomem(tdm_error *err)
{
    return tdm_fail(err, TDM_ERR_NOMEM, "out of memory reading a dataset line");
}

/* Reads an integer list; each value checked by the caller. */
static tdm_status get_int_list(const json_t *obj, const char *key, int32_t **out, size_t *n,
                               int64_t lo, int64_t hi, bool allow_ignore, tdm_error *err)
{
    const json_t *v = json_object_get(obj, key);
    if (!json_is_array(v) || json_array_size(v) == 0)
        return bad(err, "\"%s\" must be a non-empty list of integers", key);
    size_t len = json_array_size(v);
    int32_t *a = malloc(len * sizeof *a);
    if (!a) return nomem(err);
    for (size_t i = 0; i < len; i++) {
        const json_t *x = json_array_get(v, i);
        if (!json_is_integer(x)) {
            free(a);
            return bad(err, "%s[%zu] must be an integer, not %s", key, i, json_kind(x));
        }
        json_int_t val = json_integer_value(x);
        if (!(allow_ignore && val == -100) && (val < lo || val >= hi)) {
            free(a);
            if (allow_ignore)
                return bad(err, "%s[%zu] = %lld: must be -100 (ignored) or a token id in [0, %lld)",
                           key, i, (long long)val, (long long)hi);
            return bad(err, "%s[%zu] = %lld: must be a token id in [0, %lld) (the vocabulary size)",
                       key, i, (long long)val, (long long)hi);
        }
        a[i] = (int32_t)val;
    }
    *out = a;
    *n = len;
    return TDM_OK;
}

static tdm_status parse_tokens(const json_t *obj, int64_t vocab_size, tdm_data_fields *f,
                               tdm_error *err)
{
    if (!json_object_get(obj, "input_ids")) return bad(err, "missing \"input_ids\"");
    if (vocab_size > INT32_MAX) vocab_size = INT32_MAX;
    tdm_status st =
        get_int_list(obj, "input_ids", &f->input_ids, &f->n_tokens, 0, vocab_size, false, err);
    if (st != TDM_OK) return st;
    if (json_object_get(obj, "labels")) {
        size_t n;
        st = get_int_list(obj, "labels", &f->labels, &n, 0, vocab_size, true, err);
        if (st != TDM_OK) return st;
        if (n != f->n_tokens)
            return bad(err, "\"labels\" has %zu entries but \"input_ids\" has %zu", n, f->n_tokens);
    } else {
        if (!(f->labels = malloc(f->n_tokens * sizeof *f->labels))) return nomem(err);
        memcpy(f->labels, f->input_ids, f->n_tokens * sizeof *f->labels);
    }
    const json_t *am = json_object_get(obj, "attention_mask");
    if (am) {
        if (!json_is_array(am) || json_array_size(am) != f->n_tokens)
            return bad(err, "\"attention_mask\" must be a list as long as \"input_ids\" (%zu)",
                       f->n_tokens);
        for (size_t i = 0; i < f->n_tokens; i++) {
            const json_t *x = json_array_get(am, i);
            if (!json_is_integer(x) || (json_integer_value(x) != 0 && json_integer_value(x) != 1))
                return bad(err, "attention_mask[%zu] must be 0 or 1", i);
            if (json_integer_value(x) == 0)
                return bad(err,
                           "attention_mask[%zu] is 0: padded lines are not supported (remove "
                           "the padding; sequences are packed without it)",
                           i);
        }
    }
    return TDM_OK;
}

static void add_message(tdm_data_fields *f, const char *role, const char *content, size_t len)
{
    f->messages[f->n_messages++] = (tdm_chat_message){role, content, len};
}

/* The two shapes of chat lines: OpenAI's "messages" (role/content) and ShareGPT's
 * "conversations" (from/value, roles human/gpt/system). Both become the same messages, with the
 * roles system, user, assistant. */
typedef struct chat_shape {
    const char *list, *role, *content;
    const char *names[3]; /* what the line calls system, user, assistant */
} chat_shape;

static const chat_shape openai_shape = {"messages", "role", "content",
                                        {"system", "user", "assistant"}};
static const chat_shape sharegpt_shape = {"conversations", "from", "value",
                                          {"system", "human", "gpt"}};

static tdm_status parse_chat(const json_t *obj, tdm_data_fields *f, tdm_error *err)
{
    static const char *const canonical[3] = {"system", "user", "assistant"};
    if (json_object_get(obj, "messages") && json_object_get(obj, "conversations"))
        return bad(err, "has both \"messages\" and \"conversations\": give one");
    const chat_shape *sh = json_object_get(obj, "messages") ? &openai_shape : &sharegpt_shape;
    const json_t *msgs = json_object_get(obj, sh->list);
    if (!json_is_array(msgs))
        return bad(err, "\"%s\" must be a list, not %s", sh->list, json_kind(msgs));
    size_t n = json_array_size(msgs);
    if (n == 0) return bad(err, "\"%s\" is empty", sh->list);
    if (!(f->messages = calloc(n, sizeof *f->messages))) return nomem(err);
    bool assistant = false;
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(msgs, i);
        if (!json_is_object(m))
            return bad(err, "%s[%zu] must be an object, not %s", sh->list, i, json_kind(m));
        const json_t *role = json_object_get(m, sh->role),
                     *content = json_object_get(m, sh->content);
        if (!role) return bad(err, "%s[%zu] has no \"%s\"", sh->list, i, sh->role);
        if (!json_is_string(role))
            return bad(err, "%s[%zu].%s must be a string, not %s", sh->list, i, sh->role,
                       json_kind(role));
        const char *r = json_string_value(role);
        int k = 0;
        while (k < 3 && strcmp(r, sh->names[k]) != 0)
            k++;
        if (k == 3) {
            int shown = (int)tdm_utf8_valid_prefix(r, strlen(r) < 40 ? strlen(r) : 40);
            while (shown > 0 && shown < (int)strlen(r) && (r[shown] & 0xc0) == 0x80)
                shown--; /* do not cut a character */
            return bad(err, "%s[%zu].%s \"%.*s\" is not %s, %s or %s", sh->list, i, sh->role,
                       shown, r, sh->names[0], sh->names[1], sh->names[2]);
        }
        if (k == 0 && i != 0)
            return bad(err, "%s[%zu]: a system message may only come first", sh->list, i);
        if (!content) return bad(err, "%s[%zu] has no \"%s\"", sh->list, i, sh->content);
        if (!json_is_string(content))
            return bad(err, "%s[%zu].%s must be a string, not %s", sh->list, i, sh->content,
                       json_kind(content));
        if (k == 2) {
            if (json_string_length(content) == 0)
                return bad(err, "%s[%zu]: %s %s is empty", sh->list, i, sh->names[2],
                           sh->content);
            assistant = true;
        }
        add_message(f, canonical[k], json_string_value(content), json_string_length(content));
    }
    if (!assistant)
        return bad(err, "no %s message (nothing to learn)", sh->names[2]);
    return TDM_OK;
}

/* alpaca and instruct */
static tdm_status parse_instruction(const json_t *obj, tdm_data_fields *f, tdm_error *err)
{
    const char *sys, *ins, *inp = NULL, *out;
    size_t sys_len, ins_len, inp_len = 0, out_len;
    const char *out_key = f->format == TDM_DATA_ALPACA ? "output" : "response";
    tdm_status st;
    if ((st = get_string(obj, "instruction", true, true, &ins, &ins_len, err)) != TDM_OK ||
        (st = get_string(obj, out_key, true, true, &out, &out_len, err)) != TDM_OK ||
        (st = get_string(obj, "system", false, false, &sys, &sys_len, err)) != TDM_OK)
        return st;
    if (f->format == TDM_DATA_ALPACA &&
        (st = get_string(obj, "input", false, false, &inp, &inp_len, err)) != TDM_OK)
        return st;
    if (!(f->messages = calloc(3, sizeof *f->messages))) return nomem(err);
    if (sys && sys_len) add_message(f, "system", sys, sys_len);
    if (inp && inp_len) {
        if (!(f->user_buf = malloc(ins_len + 2 + inp_len + 1))) return nomem(err);
        memcpy(f->user_buf, ins, ins_len);
        memcpy(f->user_buf + ins_len, "\n\n", 2);
        memcpy(f->user_buf + ins_len + 2, inp, inp_len);
        f->user_buf[ins_len + 2 + inp_len] = 0;
        add_message(f, "user", f->user_buf, ins_len + 2 + inp_len);
    } else {
        add_message(f, "user", ins, ins_len);
    }
    add_message(f, "assistant", out, out_len);
    return TDM_OK;
}

static tdm_status detect(const json_t *obj, tdm_data_format *out, tdm_error *err)
{
    const char *first_key[TDM_DATA_FORMAT_COUNT] = {0};
    int n_formats = 0;
    tdm_data_format fmt = TDM_DATA_ALPACA;
    for (int i = 0; i < N_OWNED; i++) {
        if (!json_object_get(obj, owned[i].key)) continue;
        if (!first_key[owned[i].format]) {
            first_key[owned[i].format] = owned[i].key;
            n_formats++;
            fmt = owned[i].format;
        }
    }
    if (n_formats > 1) {
        const char *a = NULL, *b = NULL;
        tdm_data_format fa = 0, fb = 0;
        for (int k = 0; k < TDM_DATA_FORMAT_COUNT; k++) {
            if (!first_key[k]) continue;
            if (!a) {
                a = first_key[k];
                fa = (tdm_data_format)k;
            } else if (!b) {
                b = first_key[k];
                fb = (tdm_data_format)k;
            }
        }
        return bad(err, "mixes keys of two formats: \"%s\" (%s) and \"%s\" (%s)", a,
                   tdm_data_format_name(fa), b, tdm_data_format_name(fb));
    }
    bool has_ins = json_object_get(obj, "instruction") != NULL;
    bool has_sys = json_object_get(obj, "system") != NULL;
    if (n_formats == 0) {
        if (has_ins || has_sys)
            return bad(err, "\"%s\" without \"output\" (alpaca) or \"response\" (instruct)",
                       has_ins ? "instruction" : "system");
        if (json_object_size(obj) == 0) return bad(err, "empty object");
        return bad(err, "no known keys: expected \"messages\" (or ShareGPT's "
                        "\"conversations\"), \"text\", \"input_ids\", "
                        "\"prompt\"/\"completion\", or \"instruction\" with \"output\" or "
                        "\"response\" (see docs/datasets.md)");
    }
    if (fmt != TDM_DATA_ALPACA && fmt != TDM_DATA_INSTRUCT && (has_ins || has_sys))
        return bad(err, "mixes keys of two formats: \"%s\" (%s) and \"%s\" (alpaca/instruct)",
                   first_key[fmt], tdm_data_format_name(fmt), has_ins ? "instruction" : "system");
    *out = fmt;
    return TDM_OK;
}

tdm_status tdm_data_fields_parse(const json_t *obj, int64_t vocab_size, tdm_data_fields *f,
                                 tdm_error *err)
{
    memset(f, 0, sizeof *f);
    if (!json_is_object(obj)) return bad(err, "expected a JSON object, not %s", json_kind(obj));
    tdm_status st = detect(obj, &f->format, err);
    if (st != TDM_OK) return st;
    switch (f->format) {
    case TDM_DATA_ALPACA:
    case TDM_DATA_INSTRUCT:
        st = parse_instruction(obj, f, err);
        break;
    case TDM_DATA_CHAT:
        st = parse_chat(obj, f, err);
        break;
    case TDM_DATA_COMPLETION:
        if ((st = get_string(obj, "prompt", true, false, &f->prompt, &f->prompt_len, err)) ==
            TDM_OK)
            st = get_string(obj, "completion", true, true, &f->completion, &f->completion_len, err);
        break;
    case TDM_DATA_TEXT:
        st = get_string(obj, "text", true, true, &f->text, &f->text_len, err);
        break;
    case TDM_DATA_TOKENS:
        st = parse_tokens(obj, vocab_size, f, err);
        break;
    default:
        st = bad(err, "unknown format");
    }
    if (st != TDM_OK) tdm_data_fields_free(f);
    return st;
}

void tdm_data_fields_free(tdm_data_fields *f)
{
    free(f->messages);
    free(f->input_ids);
    free(f->labels);
    free(f->user_buf);
    memset(f, 0, sizeof *f);
}

/* json_object_set_new that tracks failure */
static bool set(json_t *o, const char *k, json_t *v)
{
    return v && json_object_set_new(o, k, v) == 0;
}

static json_t *int_list(const int32_t *a, size_t n)
{
    json_t *l = json_array();
    for (size_t i = 0; l && i < n; i++)
        if (json_array_append_new(l, json_integer(a[i])) != 0) {
            json_decref(l);
            return NULL;
        }
    return l;
}

tdm_status tdm_data_fields_canonical(const tdm_data_fields *f, char **out, size_t *len,
                                     tdm_error *err)
{
    json_t *o = json_object();
    bool ok = o != NULL;
    switch (f->format) {
    case TDM_DATA_ALPACA:
    case TDM_DATA_INSTRUCT:
    case TDM_DATA_CHAT: {
        json_t *l = json_array();
        ok = ok && set(o, "messages", l);
        for (size_t i = 0; ok && i < f->n_messages; i++) {
            json_t *m = json_object();
            ok =
                m && json_array_append_new(l, m) == 0 &&
                set(m, "role", json_string(f->messages[i].role)) &&
                set(m, "content", json_stringn(f->messages[i].content, f->messages[i].content_len));
        }
        break;
    }
    case TDM_DATA_COMPLETION:
        ok = ok && set(o, "prompt", json_stringn(f->prompt ? f->prompt : "", f->prompt_len)) &&
             set(o, "completion", json_stringn(f->completion, f->completion_len));
        break;
    case TDM_DATA_TEXT:
        ok = ok && set(o, "text", json_stringn(f->text, f->text_len));
        break;
    case TDM_DATA_TOKENS:
        ok = ok && set(o, "input_ids", int_list(f->input_ids, f->n_tokens)) &&
             set(o, "labels", int_list(f->labels, f->n_tokens));
        break;
    default:
        ok = false;
    }
    char *s = ok ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENSURE_ASCII) : NULL;
    json_decref(o);
    if (!s) return nomem(err);
    *out = s;
    *len = strlen(s);
    return TDM_OK;
}
