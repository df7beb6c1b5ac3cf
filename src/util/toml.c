/* toml.c — the strict TOML-subset parser described in toml.h.
 *
 * One pass over the bytes after a UTF-8/NUL check of the whole input. The parser keeps the
 * current line number and the byte offset of the line start; columns are counted in code points
 * on demand (with a cache so that a long line is walked once, not once per value). Every node is
 * malloc'd and attached to its parent as soon as it is complete, so an error at any point frees
 * the partial tree with one tdm_toml_free.
 */
#include "util/toml.h"

#include <errno.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct toml_table {
    tdm_toml_entry *entries; /* (len) in order of appearance; values are owned */
    size_t len, cap;
    uint32_t *index; /* (index_cap) open-addressing hash: entry index + 1, 0 = empty; NULL if small */
    size_t index_cap;
    const char *name; /* header key (borrowed from the root's entry); NULL for the root */
    size_t array_pos; /* 1-based position within its [[name]] array; 0 for [name] and the root */
} toml_table;

typedef struct toml_array {
    tdm_toml_value **items; /* (len) owned */
    size_t len, cap;
    bool of_tables; /* made by [[name]] headers */
} toml_array;

struct tdm_toml_value {
    tdm_toml_type type;
    uint32_t line, col;
    const char *file; /* the document's file name (borrowed) */
    union {
        struct {
            char *ptr; /* NUL-terminated, owned */
            size_t len;
        } str;
        int64_t i;
        double f;
        bool b;
        toml_array arr;
        toml_table tab;
    } u;
};

struct tdm_toml_doc {
    char *filename;
    tdm_toml_value *root;
};

/* Tables with at least this many entries get a hash index. */
enum { INDEX_MIN = 8 };

/* ------------------------------------------------------------------------------------------ */
/* Values                                                                                      */

static void value_free(tdm_toml_value *v)
{
    if (!v)
        return;
    switch (v->type) {
    case TDM_TOML_STRING: free(v->u.str.ptr); break;
    case TDM_TOML_ARRAY:
        for (size_t i = 0; i < v->u.arr.len; i++)
            value_free(v->u.arr.items[i]);
        free(v->u.arr.items);
        break;
    case TDM_TOML_TABLE:
        for (size_t i = 0; i < v->u.tab.len; i++) {
            free((char *)v->u.tab.entries[i].key);
            value_free((tdm_toml_value *)v->u.tab.entries[i].value);
        }
        free(v->u.tab.entries);
        free(v->u.tab.index);
        break;
    default: break;
    }
    free(v);
}

static tdm_toml_value *value_new(tdm_toml_type type, uint32_t line, uint32_t col, const char *file)
{
    tdm_toml_value *v = calloc(1, sizeof *v);
    if (v) {
        v->type = type;
        v->line = line;
        v->col = col;
        v->file = file;
    }
    return v;
}

/* Grows *items (of elem_size bytes each) so that it holds at least len + 1; false on overflow
 * or allocation failure (the old block stays valid). */
static bool grow(void **items, size_t *cap, size_t len, size_t elem_size)
{
    if (len < *cap)
        return true;
    size_t ncap = *cap ? *cap : 4;
    while (ncap <= len) {
        if (ncap > SIZE_MAX / 2)
            return false;
        ncap *= 2;
    }
    if (ncap > SIZE_MAX / elem_size)
        return false;
    void *p = realloc(*items, ncap * elem_size);
    if (!p)
        return false;
    *items = p;
    *cap = ncap;
    return true;
}

static bool array_push(tdm_toml_value *arr, tdm_toml_value *item)
{
    toml_array *a = &arr->u.arr;
    if (!grow((void **)&a->items, &a->cap, a->len, sizeof *a->items))
        return false;
    a->items[a->len++] = item;
    return true;
}

/* FNV-1a. */
static uint64_t key_hash(const char *key, size_t len)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)key[i];
        h *= 1099511628211ull;
    }
    return h;
}

static void index_insert(toml_table *t, size_t entry)
{
    size_t mask = t->index_cap - 1;
    size_t slot = (size_t)key_hash(t->entries[entry].key, t->entries[entry].key_len) & mask;
    while (t->index[slot])
        slot = (slot + 1) & mask;
    t->index[slot] = (uint32_t)(entry + 1);
}

/* Keeps the index at most half full; false on allocation failure. */
static bool index_reserve(toml_table *t, size_t want_len)
{
    if (want_len < INDEX_MIN || (t->index && want_len * 2 <= t->index_cap))
        return true;
    /* Entry numbers are stored in 32 bits; a table this large cannot come from a 1 GiB input. */
    if (want_len >= UINT32_MAX / 2)
        return false;
    size_t cap = 16;
    while (cap < want_len * 2)
        cap *= 2;
    uint32_t *index = calloc(cap, sizeof *index);
    if (!index)
        return false;
    free(t->index);
    t->index = index;
    t->index_cap = cap;
    for (size_t i = 0; i < t->len; i++)
        index_insert(t, i);
    return true;
}

static tdm_toml_entry *table_find(const toml_table *t, const char *key, size_t len)
{
    if (t->index) {
        size_t mask = t->index_cap - 1;
        for (size_t slot = (size_t)key_hash(key, len) & mask; t->index[slot];
             slot = (slot + 1) & mask) {
            tdm_toml_entry *e = &t->entries[t->index[slot] - 1];
            if (e->key_len == len && memcmp(e->key, key, len) == 0)
                return e;
        }
        return NULL;
    }
    for (size_t i = 0; i < t->len; i++)
        if (t->entries[i].key_len == len && memcmp(t->entries[i].key, key, len) == 0)
            return &t->entries[i];
    return NULL;
}

/* Appends key -> value, taking ownership of both (even on failure, when it frees them). The
 * caller has checked that the key is new. */
static bool table_add(tdm_toml_value *table, char *key, size_t key_len, uint32_t line,
                      uint32_t col, tdm_toml_value *value)
{
    toml_table *t = &table->u.tab;
    if (!grow((void **)&t->entries, &t->cap, t->len, sizeof *t->entries) ||
        !index_reserve(t, t->len + 1)) {
        free(key);
        value_free(value);
        return false;
    }
    t->entries[t->len] = (tdm_toml_entry){key, key_len, line, col, value};
    t->len++;
    if (t->index)
        index_insert(t, t->len - 1);
    return true;
}

/* ------------------------------------------------------------------------------------------ */
/* Parser state and errors                                                                     */

typedef struct parser {
    const char *s;
    size_t len, pos;
    uint32_t line;     /* 1-based line of pos */
    size_t line_start; /* byte offset where that line starts */
    size_t col_pos;    /* column cache: byte offset col_pos on line col_line_start ... */
    size_t col_line_start;
    uint32_t col_val; /* ... is at column col_val */
    const char *file;
    tdm_toml_value *root;
    tdm_toml_value *cur; /* the table that `key = value` lines go into */
    tdm_error *err;
} parser;

/* Column (1-based, in code points) of byte offset pos on the current line. */
static uint32_t col_of(parser *p, size_t pos)
{
    if (p->col_line_start != p->line_start || pos < p->col_pos) {
        p->col_line_start = p->line_start;
        p->col_pos = p->line_start;
        p->col_val = 1;
    }
    for (; p->col_pos < pos; p->col_pos++)
        if (((unsigned char)p->s[p->col_pos] & 0xC0) != 0x80)
            p->col_val++;
    return p->col_val;
}

__attribute__((format(printf, 6, 0))) static tdm_status vfail_at(tdm_error *err, tdm_status status, const char *file, uint32_t line,
                           uint32_t col, const char *fmt, va_list ap)
{
    if (!err)
        return status;
    int n = col ? snprintf(err->message, sizeof err->message, "%s:%u:%u: ", file, line, col)
                : snprintf(err->message, sizeof err->message, "%s:%u: ", file, line);
    if (n >= 0 && (size_t)n < sizeof err->message)
        vsnprintf(err->message + n, sizeof err->message - (size_t)n, fmt, ap);
    err->status = status;
    return status;
}

__attribute__((format(printf, 4, 5))) static tdm_status
fail_pos(parser *p, uint32_t line, uint32_t col, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail_at(p->err, TDM_ERR_PARSE, p->file, line, col, fmt, ap);
    va_end(ap);
    return TDM_ERR_PARSE;
}

/* An error at byte offset pos of the current line. */
__attribute__((format(printf, 3, 4))) static tdm_status fail_at(parser *p, size_t pos,
                                                                const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail_at(p->err, TDM_ERR_PARSE, p->file, p->line, col_of(p, pos), fmt, ap);
    va_end(ap);
    return TDM_ERR_PARSE;
}

static tdm_status fail_nomem(parser *p)
{
    return tdm_fail(p->err, TDM_ERR_NOMEM, "%s:%u: out of memory while parsing", p->file,
                    p->line);
}

/* Describes the character at pos for messages: 'x', "end of file", "end of line", U+XXXX. */
static const char *describe(parser *p, size_t pos, char *buf, size_t size)
{
    if (pos >= p->len)
        return "end of file";
    unsigned char c = (unsigned char)p->s[pos];
    if (c == '\n' || c == '\r')
        return "end of line";
    if (c >= 0x21 && c < 0x7F)
        snprintf(buf, size, "'%c'", c);
    else if (c == ' ')
        snprintf(buf, size, "a space");
    else if (c == '\t')
        snprintf(buf, size, "a tab");
    else if (c < 0x80)
        snprintf(buf, size, "control character U+%04X", c);
    else {
        /* Input is valid UTF-8 here; decode for the message. */
        uint32_t cp;
        int n = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
        cp = c & (0x3Fu >> n);
        for (int k = 1; k <= n && pos + (size_t)k < p->len; k++)
            cp = (cp << 6) | ((unsigned char)p->s[pos + (size_t)k] & 0x3F);
        snprintf(buf, size, "U+%04X", (unsigned)cp);
    }
    return buf;
}
#define DESCRIBE(p, pos) describe((p), (pos), (char[32]){0}, 32)

static int peek(const parser *p)
{
    return p->pos < p->len ? (unsigned char)p->s[p->pos] : -1;
}

static int peek_at(const parser *p, size_t off)
{
    return p->pos + off < p->len ? (unsigned char)p->s[p->pos + off] : -1;
}

static void skip_ws(parser *p)
{
    while (p->pos < p->len && (p->s[p->pos] == ' ' || p->s[p->pos] == '\t'))
        p->pos++;
}


static tdm_status eat_newline(parser *p)
{
    if (peek(p) == '\r') {
        if (peek_at(p, 1) != '\n')
            return fail_at(p, p->pos, "carriage return without a line feed (use LF or CRLF line "
                                      "ends)");
        p->pos++;
    }
    p->pos++; /* the '\n' */
    p->line++;
    p->line_start = p->pos;
    return TDM_OK;
}

/* A character that may not appear raw in comments and strings: controls except tab, and DEL. */
static bool is_forbidden_control(unsigned char c)
{
    return (c < 0x20 && c != '\t') || c == 0x7F;
}

/* From '#' to the end of the line (not consuming the newline). */
static tdm_status skip_comment(parser *p)
{
    p->pos++;
    while (p->pos < p->len && p->s[p->pos] != '\n') {
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c == '\r' && peek_at(p, 1) == '\n')
            break;
        if (is_forbidden_control(c))
            return fail_at(p, p->pos, "control character U+%04X in a comment", c);
        p->pos++;
    }
    return TDM_OK;
}

/* Whitespace, comments and newlines (inside arrays). */
static tdm_status skip_ws_comments_newlines(parser *p)
{
    for (;;) {
        skip_ws(p);
        int c = peek(p);
        if (c == '#') {
            tdm_status st = skip_comment(p);
            if (st != TDM_OK)
                return st;
        } else if (c == '\n' || c == '\r') {
            tdm_status st = eat_newline(p);
            if (st != TDM_OK)
                return st;
        } else {
            return TDM_OK;
        }
    }
}

/* After a key/value or a header: spaces, an optional comment, then a newline or the end. */
static tdm_status expect_line_end(parser *p, const char *after)
{
    skip_ws(p);
    int c = peek(p);
    if (c == '#') {
        tdm_status st = skip_comment(p);
        if (st != TDM_OK)
            return st;
        c = peek(p);
    }
    if (c == -1)
        return TDM_OK;
    if (c == '\n' || c == '\r')
        return eat_newline(p);
    return fail_at(p, p->pos,
                   "expected the end of the line after the %s, found %s (put each key = value "
                   "on its own line)",
                   after, DESCRIBE(p, p->pos));
}

/* ------------------------------------------------------------------------------------------ */
/* UTF-8 and NUL check of the whole input                                                      */

/* Length of the valid UTF-8 sequence at s[0..n), or 0 when it is invalid (overlong forms,
 * surrogates, code points above U+10FFFF, truncated sequences). */
static size_t utf8_seq_len(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    size_t need;
    uint32_t min, cp;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 2, min = 0x80, cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3, min = 0x800, cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4, min = 0x10000, cp = c & 0x07;
    } else {
        return 0;
    }
    if (n < need)
        return 0;
    for (size_t k = 1; k < need; k++) {
        if ((s[k] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return need;
}

/* Checks from p->pos (after a BOM) to the end. */
static tdm_status check_encoding(parser *p)
{
    const unsigned char *s = (const unsigned char *)p->s;
    uint32_t line = 1, col = 1;
    for (size_t i = p->pos; i < p->len;) {
        if (s[i] == 0)
            return fail_pos(p, line, col, "NUL byte in the file (is it a text file?)");
        size_t n = utf8_seq_len(s + i, p->len - i);
        if (n == 0)
            return fail_pos(p, line, col, "invalid UTF-8 (byte 0x%02X); save the file as UTF-8",
                            s[i]);
        if (s[i] == '\n')
            line++, col = 1;
        else
            col++;
        i += n;
    }
    return TDM_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Strings and keys                                                                            */

typedef struct strbuf {
    char *p;
    size_t len, cap;
} strbuf;

static bool sb_put(strbuf *b, const char *s, size_t n)
{
    if (n > SIZE_MAX - b->len - 1)
        return false;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 32;
        while (cap < b->len + n + 1) {
            if (cap > SIZE_MAX / 2) {
                cap = b->len + n + 1;
                break;
            }
            cap *= 2;
        }
        char *q = realloc(b->p, cap);
        if (!q)
            return false;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return true;
}

static size_t utf8_encode(uint32_t cp, char out[4])
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static int hex_val(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Parses "..." or '...' at pos into a malloc'd NUL-terminated string (*out, *out_len). */
static tdm_status parse_string(parser *p, char **out, size_t *out_len)
{
    const char quote = p->s[p->pos];
    const bool basic = quote == '"';
    if (peek_at(p, 1) == quote && peek_at(p, 2) == quote)
        return fail_at(p, p->pos,
                       "multi-line strings (%c%c%c) are not supported; write the value on one "
                       "line%s",
                       quote, quote, quote, basic ? " and use \\n for line breaks" : "");
    const size_t open = p->pos;
    p->pos++;
    strbuf b = {0};
    if (!sb_put(&b, "", 0))
        return fail_nomem(p);
    for (;;) {
        if (p->pos >= p->len || p->s[p->pos] == '\n' ||
            (p->s[p->pos] == '\r' && peek_at(p, 1) == '\n')) {
            free(b.p);
            return fail_at(p, open,
                           "unterminated string: the closing %c is missing on this line "
                           "(multi-line strings are not supported)",
                           quote);
        }
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c == (unsigned char)quote) {
            p->pos++;
            break;
        }
        if (is_forbidden_control(c)) {
            free(b.p);
            return fail_at(p, p->pos,
                           "control character U+%04X in a string (write it as an escape such "
                           "as \\t or \\u%04X)",
                           c, c);
        }
        if (c == '\\' && basic) {
            size_t esc = p->pos;
            int e = peek_at(p, 1);
            const char *simple = NULL;
            switch (e) {
            case '"': simple = "\""; break;
            case '\\': simple = "\\"; break;
            case 'b': simple = "\b"; break;
            case 't': simple = "\t"; break;
            case 'n': simple = "\n"; break;
            case 'f': simple = "\f"; break;
            case 'r': simple = "\r"; break;
            default: break;
            }
            if (simple) {
                if (!sb_put(&b, simple, 1)) {
                    free(b.p);
                    return fail_nomem(p);
                }
                p->pos += 2;
                continue;
            }
            if (e == 'u' || e == 'U') {
                int digits = e == 'u' ? 4 : 8;
                uint32_t cp = 0;
                for (int k = 0; k < digits; k++) {
                    int h = hex_val(peek_at(p, 2 + (size_t)k));
                    if (h < 0) {
                        free(b.p);
                        return fail_at(p, esc,
                                       "bad escape: \\%c needs exactly %d hexadecimal digits",
                                       e, digits);
                    }
                    cp = (cp << 4) | (uint32_t)h;
                }
                if (cp == 0) {
                    free(b.p);
                    return fail_at(p, esc, "\\%c escape of NUL (U+0000) is not allowed", e);
                }
                if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
                    free(b.p);
                    return fail_at(p, esc,
                                   "bad escape: U+%X is not a Unicode scalar value (surrogates "
                                   "and values above U+10FFFF are not allowed)",
                                   (unsigned)cp);
                }
                char enc[4];
                size_t n = utf8_encode(cp, enc);
                if (!sb_put(&b, enc, n)) {
                    free(b.p);
                    return fail_nomem(p);
                }
                p->pos += 2 + (size_t)digits;
                continue;
            }
            free(b.p);
            if (e == -1 || e == '\n' || e == '\r')
                return fail_at(p, esc,
                               "a backslash at the end of a line (line continuations belong to "
                               "multi-line strings, which are not supported)");
            return fail_at(p, esc,
                           "bad escape \\%s (allowed: \\\" \\\\ \\b \\t \\n \\f \\r \\uXXXX "
                           "\\UXXXXXXXX; use '...' for backslashes taken literally)",
                           DESCRIBE(p, esc + 1));
        }
        /* A plain character: copy its whole UTF-8 sequence (input is validated). */
        size_t start = p->pos;
        p->pos++;
        while (p->pos < p->len && ((unsigned char)p->s[p->pos] & 0xC0) == 0x80)
            p->pos++;
        if (!sb_put(&b, p->s + start, p->pos - start)) {
            free(b.p);
            return fail_nomem(p);
        }
    }
    *out = b.p;
    *out_len = b.len;
    return TDM_OK;
}

static bool is_bare_key_char(int c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '-';
}

/* A bare or quoted key at pos; refuses dotted keys (what = "key" or "table name"). */
static tdm_status parse_key(parser *p, const char *what, char **out, size_t *out_len)
{
    int c = peek(p);
    tdm_status st;
    if (c == '"' || c == '\'') {
        st = parse_string(p, out, out_len);
        if (st != TDM_OK)
            return st;
    } else if (is_bare_key_char(c)) {
        size_t start = p->pos;
        while (is_bare_key_char(peek(p)))
            p->pos++;
        size_t n = p->pos - start;
        char *k = malloc(n + 1);
        if (!k)
            return fail_nomem(p);
        memcpy(k, p->s + start, n);
        k[n] = '\0';
        *out = k;
        *out_len = n;
    } else {
        return fail_at(p, p->pos,
                       "expected a %s, found %s (bare keys use A-Z a-z 0-9 _ -; quote others)",
                       what, DESCRIBE(p, p->pos));
    }
    size_t after = p->pos;
    skip_ws(p);
    if (peek(p) == '.') {
        free(*out);
        *out = NULL;
        return fail_at(p, p->pos,
                       "dotted keys are not supported: write a [table] header instead of "
                       "a.b = ..., and quote a key that contains a dot");
    }
    p->pos = after;
    return TDM_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Numbers                                                                                     */

static bool is_digit(int c)
{
    return c >= '0' && c <= '9';
}

/* Characters that can continue a number-like token (so "12abc" is one bad token). */
static bool is_token_char(int c)
{
    return is_bare_key_char(c) || c == '+' || c == '.' || c == ':';
}

static locale_t c_locale;
static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;
static void c_locale_init(void)
{
    c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
}

/* Scans digits with single underscores between them starting at *i within tok[0..n); appends
 * the digits to digits (when not NULL). Returns the number of digits, or -1 (with *i at the
 * offending character) for a misplaced underscore. */
static long scan_digits(const char *tok, size_t n, size_t *i, strbuf *digits, bool *nomem)
{
    long count = 0;
    while (*i < n) {
        char c = tok[*i];
        if (is_digit(c)) {
            if (digits && !sb_put(digits, &c, 1)) {
                *nomem = true;
                return -1;
            }
            count++;
            (*i)++;
        } else if (c == '_') {
            if (count == 0 || *i + 1 >= n || !is_digit(tok[*i + 1]))
                return -1;
            (*i)++;
        } else {
            break;
        }
    }
    return count;
}

static tdm_status parse_number(parser *p, tdm_toml_value **out, uint32_t line, uint32_t col)
{
    const size_t start = p->pos;
    size_t end = start;
    while (end < p->len && is_token_char((unsigned char)p->s[end]))
        end++;
    const char *tok = p->s + start;
    const size_t n = end - start;

    /* Things that look like numbers but are refused by name. */
    size_t lead = 0;
    while (lead < n && is_digit(tok[lead]))
        lead++;
    if ((lead == 4 && n > 4 && tok[4] == '-') || (lead == 2 && n > 2 && tok[2] == ':'))
        return fail_at(p, start, "dates and times are not supported; write the value as a "
                                 "string");
    size_t i = 0;
    bool neg = false;
    if (tok[0] == '+' || tok[0] == '-') {
        neg = tok[0] == '-';
        i = 1;
    }
    if (n - i == 3 && (!strncmp(tok + i, "inf", 3) || !strncmp(tok + i, "nan", 3)))
        return fail_at(p, start, "inf and nan are not accepted: tandem's settings must be finite "
                                 "numbers");
    if (i < n && tok[i] == '0' && i + 1 < n &&
        (tok[i + 1] == 'x' || tok[i + 1] == 'o' || tok[i + 1] == 'b'))
        return fail_at(p, start, "hexadecimal, octal and binary integers are not supported; "
                                 "write the number in decimal");
    if (i >= n || !is_digit(tok[i]))
        return fail_at(p, start + i, "expected a digit, found %s", DESCRIBE(p, start + i));

    strbuf digits = {0};
    bool nomem = false;
    tdm_status st = TDM_OK;
    if (neg && !sb_put(&digits, "-", 1)) {
        nomem = true;
        goto done;
    }
    size_t int_start = i;
    long nint = scan_digits(tok, n, &i, &digits, &nomem);
    if (nint < 0)
        goto bad_underscore;
    if (tok[int_start] == '0' && nint > 1) {
        st = fail_at(p, start, "leading zeros are not allowed in numbers (found %.*s%s)",
                     (int)(n > 40 ? 40 : n), tok, n > 40 ? "..." : "");
        goto done;
    }
    bool is_float = false;
    if (i < n && tok[i] == '.') {
        is_float = true;
        if (!sb_put(&digits, ".", 1)) {
            nomem = true;
            goto done;
        }
        i++;
        if (i >= n || !is_digit(tok[i])) {
            st = fail_at(p, start + i, "a decimal point must be followed by a digit (write 1.0, "
                                       "not 1.)");
            goto done;
        }
        if (scan_digits(tok, n, &i, &digits, &nomem) < 0)
            goto bad_underscore;
    }
    if (i < n && (tok[i] == 'e' || tok[i] == 'E')) {
        is_float = true;
        if (!sb_put(&digits, "e", 1)) {
            nomem = true;
            goto done;
        }
        i++;
        if (i < n && (tok[i] == '+' || tok[i] == '-')) {
            if (!sb_put(&digits, &tok[i], 1)) {
                nomem = true;
                goto done;
            }
            i++;
        }
        if (i >= n || !is_digit(tok[i])) {
            st = fail_at(p, start + i, "an exponent needs digits (write 2e-4)");
            goto done;
        }
        if (scan_digits(tok, n, &i, &digits, &nomem) < 0)
            goto bad_underscore;
    }
    if (i < n) {
        if (tok[i] == '.' && is_float)
            st = fail_at(p, start + i, "a number has at most one decimal point");
        else
            st = fail_at(p, start + i, "invalid character %s in a number",
                         DESCRIBE(p, start + i));
        goto done;
    }

    tdm_toml_value *v = value_new(is_float ? TDM_TOML_FLOAT : TDM_TOML_INTEGER, line, col, p->file);
    if (!v) {
        nomem = true;
        goto done;
    }
    if (is_float) {
        pthread_once(&c_locale_once, c_locale_init);
        if (!c_locale) {
            value_free(v);
            nomem = true;
            goto done;
        }
        errno = 0;
        char *endp;
        double d = strtod_l(digits.p, &endp, c_locale);
        if (*endp != '\0' || isnan(d)) { /* cannot happen after the grammar check above */
            value_free(v);
            st = fail_at(p, start, "invalid float");
            goto done;
        }
        if (isinf(d)) {
            value_free(v);
            st = fail_at(p, start, "float %.*s%s is too large for a double", (int)(n > 40 ? 40 : n),
                         tok, n > 40 ? "..." : "");
            goto done;
        }
        v->u.f = d; /* underflow rounds towards zero, as strtod does */
    } else {
        /* Magnitude limit: 2^63 - 1, or 2^63 for negative numbers. */
        const uint64_t limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
        uint64_t mag = 0;
        for (const char *d = digits.p + (neg ? 1 : 0); *d; d++) {
            unsigned dv = (unsigned)(*d - '0');
            if (mag > (limit - dv) / 10) {
                value_free(v);
                st = fail_at(p, start, "integer %.*s%s does not fit in 64 bits",
                             (int)(n > 40 ? 40 : n), tok, n > 40 ? "..." : "");
                goto done;
            }
            mag = mag * 10 + dv;
        }
        v->u.i = neg ? (mag == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)mag) : (int64_t)mag;
    }
    p->pos = end;
    *out = v;
    goto done;

bad_underscore:
    if (!nomem)
        st = fail_at(p, start + i, "an underscore in a number must sit between two digits");
done:
    free(digits.p);
    if (nomem)
        return fail_nomem(p);
    return st;
}

/* ------------------------------------------------------------------------------------------ */
/* Values                                                                                      */

static const char *article(tdm_toml_type t)
{
    return t == TDM_TOML_INTEGER || t == TDM_TOML_ARRAY ? "an" : "a";
}

static tdm_status parse_value(parser *p, tdm_toml_value **out, int depth);

static tdm_status parse_array(parser *p, tdm_toml_value **out, int depth, uint32_t line,
                              uint32_t col)
{
    if (depth >= TDM_TOML_MAX_DEPTH)
        return fail_at(p, p->pos, "arrays nested more than %d deep", TDM_TOML_MAX_DEPTH);
    tdm_toml_value *arr = value_new(TDM_TOML_ARRAY, line, col, p->file);
    if (!arr)
        return fail_nomem(p);
    p->pos++; /* '[' */
    tdm_status st;
    for (;;) {
        if ((st = skip_ws_comments_newlines(p)) != TDM_OK)
            goto fail;
        if (peek(p) == ']') {
            p->pos++;
            break;
        }
        tdm_toml_value *item = NULL;
        if (peek(p) == ',') {
            st = fail_at(p, p->pos, "expected a value before ','");
            goto fail;
        }
        if (peek(p) == -1) {
            st = fail_pos(p, line, col, "unterminated array: the closing ']' is missing");
            goto fail;
        }
        if ((st = parse_value(p, &item, depth + 1)) != TDM_OK)
            goto fail;
        if (arr->u.arr.len > 0 && item->type != arr->u.arr.items[0]->type) {
            const tdm_toml_value *first = arr->u.arr.items[0];
            st = fail_pos(p, item->line, item->col,
                          "arrays must hold one type: this element is %s %s but the first "
                          "(line %u) is %s %s%s",
                          article(item->type), tdm_toml_type_name(item->type), first->line,
                          article(first->type),
                          tdm_toml_type_name(first->type),
                          (item->type == TDM_TOML_FLOAT && first->type == TDM_TOML_INTEGER) ||
                                  (item->type == TDM_TOML_INTEGER &&
                                   first->type == TDM_TOML_FLOAT)
                              ? " (write every element as a float, e.g. 1.0)"
                              : "");
            value_free(item);
            goto fail;
        }
        if (!array_push(arr, item)) {
            value_free(item);
            st = fail_nomem(p);
            goto fail;
        }
        if ((st = skip_ws_comments_newlines(p)) != TDM_OK)
            goto fail;
        int c = peek(p);
        if (c == ',') {
            p->pos++;
        } else if (c == ']') {
            p->pos++;
            break;
        } else if (c == -1) {
            st = fail_pos(p, line, col, "unterminated array: the closing ']' is missing");
            goto fail;
        } else {
            st = fail_at(p, p->pos, "expected ',' or ']' in the array, found %s",
                         DESCRIBE(p, p->pos));
            goto fail;
        }
    }
    *out = arr;
    return TDM_OK;
fail:
    value_free(arr);
    return st;
}

/* Does the bare word w start at pos and end at a delimiter? */
static bool at_word(const parser *p, const char *w)
{
    size_t n = strlen(w);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, w, n) != 0)
        return false;
    return p->pos + n >= p->len || !is_token_char((unsigned char)p->s[p->pos + n]);
}

static tdm_status parse_value(parser *p, tdm_toml_value **out, int depth)
{
    const uint32_t line = p->line, col = col_of(p, p->pos);
    int c = peek(p);
    tdm_status st;
    switch (c) {
    case '"':
    case '\'': {
        char *s;
        size_t n;
        if ((st = parse_string(p, &s, &n)) != TDM_OK)
            return st;
        tdm_toml_value *v = value_new(TDM_TOML_STRING, line, col, p->file);
        if (!v) {
            free(s);
            return fail_nomem(p);
        }
        v->u.str.ptr = s;
        v->u.str.len = n;
        *out = v;
        return TDM_OK;
    }
    case '[': return parse_array(p, out, depth, line, col);
    case '{':
        return fail_at(p, p->pos, "inline tables ({ ... }) are not supported; use a [table] "
                                  "header");
    case 't':
    case 'f': {
        bool b = c == 't';
        if (at_word(p, b ? "true" : "false")) {
            tdm_toml_value *v = value_new(TDM_TOML_BOOL, line, col, p->file);
            if (!v)
                return fail_nomem(p);
            v->u.b = b;
            p->pos += b ? 4 : 5;
            *out = v;
            return TDM_OK;
        }
        break;
    }
    case 'i':
    case 'n':
        if (at_word(p, "inf") || at_word(p, "nan"))
            return fail_at(p, p->pos, "inf and nan are not accepted: tandem's settings must be "
                                      "finite numbers");
        break;
    default:
        if (c == '+' || c == '-' || is_digit(c))
            return parse_number(p, out, line, col);
        break;
    }
    if (c == -1 || c == '\n' || c == '\r' || c == '#')
        return fail_at(p, p->pos, "missing value after '='");
    return fail_at(p, p->pos,
                   "expected a value (a \"string\", a number, true/false or an [array]), found "
                   "%s%s",
                   DESCRIBE(p, p->pos),
                   is_bare_key_char(c) ? " (strings need quotes)" : "");
}

/* ------------------------------------------------------------------------------------------ */
/* Lines                                                                                       */

static const char *kind_of_entry(const tdm_toml_value *v)
{
    if (v->type == TDM_TOML_TABLE)
        return "a table";
    if (tdm_toml_is_table_array(v))
        return "an array of tables";
    return "a key";
}

static tdm_status parse_header(parser *p)
{
    const uint32_t line = p->line, col = col_of(p, p->pos);
    const bool aot = peek_at(p, 1) == '[';
    p->pos += aot ? 2 : 1;
    skip_ws(p);
    char *key;
    size_t key_len;
    const size_t key_pos = p->pos;
    tdm_status st = parse_key(p, "table name", &key, &key_len);
    if (st != TDM_OK)
        return st;
    const uint32_t key_col = col_of(p, key_pos);
    skip_ws(p);
    if (peek(p) != ']' || (aot && peek_at(p, 1) != ']')) {
        free(key);
        return fail_at(p, p->pos, "expected '%s' to close the table header, found %s",
                       aot ? "]]" : "]", DESCRIBE(p, p->pos));
    }
    p->pos += aot ? 2 : 1;

    tdm_toml_entry *existing = table_find(&p->root->u.tab, key, key_len);
    if (existing) {
        tdm_toml_value *ev = (tdm_toml_value *)existing->value;
        if (aot && tdm_toml_is_table_array(ev)) {
            tdm_toml_value *t = value_new(TDM_TOML_TABLE, line, col, p->file);
            if (!t || !array_push(ev, t)) {
                free(t);
                free(key);
                return fail_nomem(p);
            }
            t->u.tab.name = existing->key;
            t->u.tab.array_pos = ev->u.arr.len;
            free(key);
            p->cur = t;
            return expect_line_end(p, "table header");
        }
        const bool was_table = ev->type == TDM_TOML_TABLE;
        tdm_status r = fail_pos(
            p, line, col, "%s%s%s: '%s' is already defined as %s at line %u%s", aot ? "[[" : "[",
            key, aot ? "]]" : "]", key, kind_of_entry(ev), existing->line,
            !aot && was_table ? " (a [table] may appear once; use [[name]] for a list of tables)"
                              : "");
        free(key);
        return r;
    }
    tdm_toml_value *t = value_new(TDM_TOML_TABLE, line, col, p->file);
    if (!t) {
        free(key);
        return fail_nomem(p);
    }
    tdm_toml_value *entry_value = t;
    if (aot) {
        tdm_toml_value *arr = value_new(TDM_TOML_ARRAY, line, col, p->file);
        if (!arr || !array_push(arr, t)) {
            free(arr);
            free(t);
            free(key);
            return fail_nomem(p);
        }
        arr->u.arr.of_tables = true;
        t->u.tab.array_pos = 1;
        entry_value = arr;
    }
    if (!table_add(p->root, key, key_len, line, key_col, entry_value))
        return fail_nomem(p);
    t->u.tab.name = p->root->u.tab.entries[p->root->u.tab.len - 1].key;
    p->cur = t;
    return expect_line_end(p, "table header");
}

static tdm_status parse_keyval(parser *p)
{
    const uint32_t line = p->line;
    const size_t key_pos = p->pos;
    const uint32_t key_col = col_of(p, key_pos);
    char *key;
    size_t key_len;
    tdm_status st = parse_key(p, "key", &key, &key_len);
    if (st != TDM_OK)
        return st;
    skip_ws(p);
    if (peek(p) != '=') {
        free(key);
        return fail_at(p, p->pos, "expected '=' after the key, found %s", DESCRIBE(p, p->pos));
    }
    p->pos++;
    skip_ws(p);
    const tdm_toml_entry *dup = table_find(&p->cur->u.tab, key, key_len);
    if (dup) {
        tdm_status r =
            fail_pos(p, line, key_col, "duplicate key '%s' (first defined at line %u)", key,
                     dup->line);
        free(key);
        return r;
    }
    tdm_toml_value *v = NULL;
    if ((st = parse_value(p, &v, 0)) != TDM_OK) {
        free(key);
        return st;
    }
    if (!table_add(p->cur, key, key_len, line, key_col, v))
        return fail_nomem(p);
    return expect_line_end(p, "value");
}

tdm_status tdm_toml_parse(const char *text, size_t len, const char *filename, tdm_toml_doc **out,
                          tdm_error *err)
{
    *out = NULL;
    if (!text && len)
        return tdm_fail(err, TDM_ERR_INVALID, "tdm_toml_parse: NULL text");
    tdm_toml_doc *doc = calloc(1, sizeof *doc);
    if (!doc)
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    doc->filename = strdup(filename ? filename : "<input>");
    if (!doc->filename) {
        free(doc);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    }
    parser p = {.s = text ? text : "", .len = len, .line = 1, .file = doc->filename, .err = err};
    p.col_val = 1;
    tdm_status st;
    if (len > TDM_TOML_MAX_INPUT) {
        st = tdm_fail(err, TDM_ERR_PARSE, "%s: file is larger than %zu bytes", doc->filename,
                      TDM_TOML_MAX_INPUT);
        goto fail;
    }
    doc->root = value_new(TDM_TOML_TABLE, 1, 1, doc->filename);
    if (!doc->root) {
        st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    p.root = p.cur = doc->root;
    if (len >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3))
        p.pos = p.line_start = 3; /* the BOM is not a column */
    if ((st = check_encoding(&p)) != TDM_OK)
        goto fail;

    while (p.pos < p.len) {
        skip_ws(&p);
        int c = peek(&p);
        if (c == -1)
            break;
        if (c == '#') {
            if ((st = skip_comment(&p)) != TDM_OK)
                goto fail;
        } else if (c == '\n' || c == '\r') {
            if ((st = eat_newline(&p)) != TDM_OK)
                goto fail;
        } else if (c == '[') {
            if ((st = parse_header(&p)) != TDM_OK)
                goto fail;
        } else {
            if ((st = parse_keyval(&p)) != TDM_OK)
                goto fail;
        }
    }
    *out = doc;
    return TDM_OK;
fail:
    tdm_toml_free(doc);
    return st;
}

void tdm_toml_free(tdm_toml_doc *doc)
{
    if (!doc)
        return;
    value_free(doc->root);
    free(doc->filename);
    free(doc);
}

/* ------------------------------------------------------------------------------------------ */
/* Accessors                                                                                   */

const tdm_toml_value *tdm_toml_root(const tdm_toml_doc *doc)
{
    return doc->root;
}

const char *tdm_toml_filename(const tdm_toml_doc *doc)
{
    return doc->filename;
}

tdm_toml_type tdm_toml_type_of(const tdm_toml_value *v)
{
    return v->type;
}

const char *tdm_toml_type_name(tdm_toml_type type)
{
    switch (type) {
    case TDM_TOML_STRING: return "string";
    case TDM_TOML_INTEGER: return "integer";
    case TDM_TOML_FLOAT: return "float";
    case TDM_TOML_BOOL: return "boolean";
    case TDM_TOML_ARRAY: return "array";
    case TDM_TOML_TABLE: return "table";
    }
    return "unknown";
}

uint32_t tdm_toml_line(const tdm_toml_value *v)
{
    return v->line;
}

uint32_t tdm_toml_col(const tdm_toml_value *v)
{
    return v->col;
}

const char *tdm_toml_file(const tdm_toml_value *v)
{
    return v->file;
}

bool tdm_toml_is_table_array(const tdm_toml_value *v)
{
    return v->type == TDM_TOML_ARRAY && v->u.arr.of_tables;
}

size_t tdm_toml_len(const tdm_toml_value *v)
{
    if (v->type == TDM_TOML_ARRAY)
        return v->u.arr.len;
    if (v->type == TDM_TOML_TABLE)
        return v->u.tab.len;
    return 0;
}

const tdm_toml_value *tdm_toml_at(const tdm_toml_value *array, size_t i)
{
    if (array->type != TDM_TOML_ARRAY || i >= array->u.arr.len)
        return NULL;
    return array->u.arr.items[i];
}

const tdm_toml_entry *tdm_toml_entry_at(const tdm_toml_value *table, size_t i)
{
    if (table->type != TDM_TOML_TABLE || i >= table->u.tab.len)
        return NULL;
    return &table->u.tab.entries[i];
}

const tdm_toml_entry *tdm_toml_get_entry(const tdm_toml_value *table, const char *key)
{
    if (table->type != TDM_TOML_TABLE)
        return NULL;
    return table_find(&table->u.tab, key, strlen(key));
}

const tdm_toml_value *tdm_toml_get(const tdm_toml_value *table, const char *key)
{
    const tdm_toml_entry *e = tdm_toml_get_entry(table, key);
    return e ? e->value : NULL;
}

const char *tdm_toml_string(const tdm_toml_value *v, size_t *len)
{
    bool ok = v->type == TDM_TOML_STRING;
    if (len)
        *len = ok ? v->u.str.len : 0;
    return ok ? v->u.str.ptr : "";
}

int64_t tdm_toml_int(const tdm_toml_value *v)
{
    return v->type == TDM_TOML_INTEGER ? v->u.i : 0;
}

double tdm_toml_float(const tdm_toml_value *v)
{
    return v->type == TDM_TOML_FLOAT ? v->u.f : 0.0;
}

bool tdm_toml_bool(const tdm_toml_value *v)
{
    return v->type == TDM_TOML_BOOL && v->u.b;
}

/* ------------------------------------------------------------------------------------------ */
/* Checked conversions                                                                         */

tdm_status tdm_toml_fail_at(tdm_error *err, tdm_status status, const tdm_toml_value *v,
                            const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail_at(err, status, v->file, v->line, v->col, fmt, ap);
    va_end(ap);
    return status;
}

tdm_status tdm_toml_fail_at_key(tdm_error *err, tdm_status status, const tdm_toml_value *table,
                                const tdm_toml_entry *entry, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail_at(err, status, table->file, entry->line, entry->col, fmt, ap);
    va_end(ap);
    return status;
}

static tdm_status wrong_type(const tdm_toml_value *v, const char *what, const char *want,
                             tdm_error *err)
{
    const char *shown = tdm_toml_is_table_array(v) ? "[[table]] list" : tdm_toml_type_name(v->type);
    return tdm_toml_fail_at(err, TDM_ERR_INVALID, v, "%s must be %s, not %s %s", what, want,
                            tdm_toml_is_table_array(v) ? "a" : article(v->type), shown);
}

tdm_status tdm_toml_as_string(const tdm_toml_value *v, const char *what, const char **out,
                              tdm_error *err)
{
    if (v->type != TDM_TOML_STRING)
        return wrong_type(v, what, "a string (in quotes)", err);
    *out = v->u.str.ptr;
    return TDM_OK;
}

tdm_status tdm_toml_as_int(const tdm_toml_value *v, const char *what, int64_t *out,
                           tdm_error *err)
{
    if (v->type != TDM_TOML_INTEGER)
        return wrong_type(v, what, "an integer", err);
    *out = v->u.i;
    return TDM_OK;
}

tdm_status tdm_toml_as_number(const tdm_toml_value *v, const char *what, double *out,
                              tdm_error *err)
{
    if (v->type == TDM_TOML_FLOAT)
        *out = v->u.f;
    else if (v->type == TDM_TOML_INTEGER)
        *out = (double)v->u.i;
    else
        return wrong_type(v, what, "a number", err);
    return TDM_OK;
}

tdm_status tdm_toml_as_bool(const tdm_toml_value *v, const char *what, bool *out,
                            tdm_error *err)
{
    if (v->type != TDM_TOML_BOOL)
        return wrong_type(v, what, "true or false", err);
    *out = v->u.b;
    return TDM_OK;
}

tdm_status tdm_toml_as_table(const tdm_toml_value *v, const char *what, tdm_error *err)
{
    if (v->type != TDM_TOML_TABLE)
        return wrong_type(v, what, "a table", err);
    return TDM_OK;
}

tdm_status tdm_toml_as_array_of(const tdm_toml_value *v, tdm_toml_type elem, const char *what,
                                tdm_error *err)
{
    if (v->type != TDM_TOML_ARRAY || v->u.arr.of_tables) {
        char want[64];
        snprintf(want, sizeof want, "an array of %ss", tdm_toml_type_name(elem));
        return wrong_type(v, what, want, err);
    }
    if (v->u.arr.len > 0 && v->u.arr.items[0]->type != elem)
        return tdm_toml_fail_at(err, TDM_ERR_INVALID, v->u.arr.items[0],
                                "%s must be an array of %ss, not of %ss", what,
                                tdm_toml_type_name(elem),
                                tdm_toml_type_name(v->u.arr.items[0]->type));
    return TDM_OK;
}

/* "[[adapter]] #2", "[defaults]", "the top level". */
static void table_label(const tdm_toml_value *t, char *buf, size_t size)
{
    if (!t->u.tab.name)
        snprintf(buf, size, "the top level");
    else if (t->u.tab.array_pos)
        snprintf(buf, size, "[[%s]] #%zu", t->u.tab.name, t->u.tab.array_pos);
    else
        snprintf(buf, size, "[%s]", t->u.tab.name);
}

static tdm_status lookup(const tdm_toml_value *table, const char *key, const tdm_toml_value **v,
                         tdm_error *err)
{
    *v = NULL; /* set on every path: -O3 cannot tell that the failure returns are never TDM_OK */
    if (table->type != TDM_TOML_TABLE)
        return tdm_toml_fail_at(err, TDM_ERR_INVALID, table, "expected a table");
    *v = tdm_toml_get(table, key);
    if (*v)
        return TDM_OK;
    char label[128];
    table_label(table, label, sizeof label);
    if (err) {
        if (table->u.tab.name)
            tdm_fail(err, TDM_ERR_NOT_FOUND, "%s:%u: %s has no key '%s'", table->file,
                     table->line, label, key);
        else
            tdm_fail(err, TDM_ERR_NOT_FOUND, "%s: %s has no key '%s'", table->file, label, key);
    }
    return TDM_ERR_NOT_FOUND;
}

tdm_status tdm_toml_get_string(const tdm_toml_value *table, const char *key, const char **out,
                               tdm_error *err)
{
    const tdm_toml_value *v;
    tdm_status st = lookup(table, key, &v, err);
    return st != TDM_OK ? st : tdm_toml_as_string(v, key, out, err);
}

tdm_status tdm_toml_get_int(const tdm_toml_value *table, const char *key, int64_t *out,
                            tdm_error *err)
{
    const tdm_toml_value *v;
    tdm_status st = lookup(table, key, &v, err);
    return st != TDM_OK ? st : tdm_toml_as_int(v, key, out, err);
}

tdm_status tdm_toml_get_number(const tdm_toml_value *table, const char *key, double *out,
                               tdm_error *err)
{
    const tdm_toml_value *v;
    tdm_status st = lookup(table, key, &v, err);
    return st != TDM_OK ? st : tdm_toml_as_number(v, key, out, err);
}

tdm_status tdm_toml_get_bool(const tdm_toml_value *table, const char *key, bool *out,
                             tdm_error *err)
{
    const tdm_toml_value *v;
    tdm_status st = lookup(table, key, &v, err);
    return st != TDM_OK ? st : tdm_toml_as_bool(v, key, out, err);
}

tdm_status tdm_toml_get_table_array(const tdm_toml_value *table, const char *key,
                                    const tdm_toml_value **out, tdm_error *err)
{
    const tdm_toml_value *v;
    tdm_status st = lookup(table, key, &v, err);
    if (st != TDM_OK)
        return st;
    if (!tdm_toml_is_table_array(v))
        return tdm_toml_fail_at(err, TDM_ERR_INVALID, v,
                                "'%s' must be a list of [[%s]] tables (double brackets), not %s "
                                "%s",
                                key, key, v->type == TDM_TOML_TABLE ? "a single" : article(v->type),
                                v->type == TDM_TOML_TABLE ? "[table]" : tdm_toml_type_name(v->type));
    *out = v;
    return TDM_OK;
}
