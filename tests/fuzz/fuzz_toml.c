/* fuzz_toml.c — libFuzzer target for util/toml and train/adapters_config.
 *
 * For every input it checks, beyond "no crash, no leak, no undefined behaviour":
 *   - a failure leaves *out NULL and a message that starts with the file name;
 *   - an accepted document is well formed (positions >= 1, strings hold no NUL, arrays hold one
 *     type, every key is found again by tdm_toml_get);
 *   - round trip: the document written back as TOML parses again to an equal document;
 *   - adapters_config either fails with a located message or returns specs that satisfy its
 *     documented invariants.
 * The corpus test (tests/unit/test_fuzz_corpus_toml.c) includes this file and runs every file of
 * tests/fuzz/corpus/toml/ through LLVMFuzzerTestOneInput in the normal build.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/adapters_config.h"
#include "util/toml.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz_toml: check failed at %s:%d: %s\n", __FILE__, __LINE__, #cond);  \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* ---- A growable output buffer for the round trip. ---- */
typedef struct out_buf {
    char *p;
    size_t len, cap;
} out_buf;

static void put(out_buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        b->p = realloc(b->p, cap);
        CHECK(b->p);
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void puts_(out_buf *b, const char *s)
{
    put(b, s, strlen(s));
}

static void put_quoted(out_buf *b, const char *s, size_t n)
{
    puts_(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\', esc[1] = (char)c, esc[2] = 0;
            puts_(b, esc);
        } else if (c < 0x20 || c == 0x7F) {
            snprintf(esc, sizeof esc, "\\u%04X", c);
            puts_(b, esc);
        } else {
            put(b, (const char *)&s[i], 1);
        }
    }
    puts_(b, "\"");
}

static void emit_value(out_buf *b, const tdm_toml_value *v)
{
    char num[64];
    switch (tdm_toml_type_of(v)) {
    case TDM_TOML_STRING: {
        size_t n;
        const char *s = tdm_toml_string(v, &n);
        put_quoted(b, s, n);
        break;
    }
    case TDM_TOML_INTEGER:
        snprintf(num, sizeof num, "%lld", (long long)tdm_toml_int(v));
        puts_(b, num);
        break;
    case TDM_TOML_FLOAT:
        snprintf(num, sizeof num, "%.17g", tdm_toml_float(v));
        if (!strpbrk(num, ".e"))
            strcat(num, ".0");
        puts_(b, num);
        break;
    case TDM_TOML_BOOL: puts_(b, tdm_toml_bool(v) ? "true" : "false"); break;
    case TDM_TOML_ARRAY:
        puts_(b, "[");
        for (size_t i = 0; i < tdm_toml_len(v); i++) {
            if (i)
                puts_(b, ",\n  ");
            emit_value(b, tdm_toml_at(v, i));
        }
        puts_(b, "]");
        break;
    case TDM_TOML_TABLE: CHECK(!"tables cannot be values"); break;
    }
}

/* The scalar and array keys of t (tables are written by emit_doc). */
static void emit_keys(out_buf *b, const tdm_toml_value *t)
{
    for (size_t i = 0; i < tdm_toml_len(t); i++) {
        const tdm_toml_entry *e = tdm_toml_entry_at(t, i);
        if (tdm_toml_type_of(e->value) == TDM_TOML_TABLE || tdm_toml_is_table_array(e->value))
            continue;
        put_quoted(b, e->key, e->key_len);
        puts_(b, " = ");
        emit_value(b, e->value);
        puts_(b, "\n");
    }
}

static void emit_doc(out_buf *b, const tdm_toml_value *root)
{
    emit_keys(b, root);
    for (size_t i = 0; i < tdm_toml_len(root); i++) {
        const tdm_toml_entry *e = tdm_toml_entry_at(root, i);
        if (tdm_toml_type_of(e->value) == TDM_TOML_TABLE) {
            puts_(b, "[");
            put_quoted(b, e->key, e->key_len);
            puts_(b, "]\n");
            emit_keys(b, e->value);
        } else if (tdm_toml_is_table_array(e->value)) {
            for (size_t j = 0; j < tdm_toml_len(e->value); j++) {
                puts_(b, "[[");
                put_quoted(b, e->key, e->key_len);
                puts_(b, "]]\n");
                emit_keys(b, tdm_toml_at(e->value, j));
            }
        }
    }
}

/* ---- Structural checks. ---- */
static void check_value(const tdm_toml_value *v, int depth)
{
    CHECK(depth <= TDM_TOML_MAX_DEPTH + 2);
    CHECK(tdm_toml_line(v) >= 1 && tdm_toml_col(v) >= 1);
    CHECK(strcmp(tdm_toml_type_name(tdm_toml_type_of(v)), "unknown") != 0);
    switch (tdm_toml_type_of(v)) {
    case TDM_TOML_STRING: {
        size_t n;
        const char *s = tdm_toml_string(v, &n);
        CHECK(strlen(s) == n);
        break;
    }
    case TDM_TOML_FLOAT: CHECK(isfinite(tdm_toml_float(v))); break;
    case TDM_TOML_ARRAY:
        for (size_t i = 0; i < tdm_toml_len(v); i++) {
            const tdm_toml_value *e = tdm_toml_at(v, i);
            CHECK(e);
            CHECK(tdm_toml_type_of(e) == tdm_toml_type_of(tdm_toml_at(v, 0)));
            CHECK(tdm_toml_is_table_array(v) == (tdm_toml_type_of(e) == TDM_TOML_TABLE));
            check_value(e, depth + 1);
        }
        CHECK(tdm_toml_at(v, tdm_toml_len(v)) == NULL);
        break;
    case TDM_TOML_TABLE:
        for (size_t i = 0; i < tdm_toml_len(v); i++) {
            const tdm_toml_entry *e = tdm_toml_entry_at(v, i);
            CHECK(e && e->key && strlen(e->key) == e->key_len);
            CHECK(e->line >= 1 && e->col >= 1);
            CHECK(tdm_toml_get_entry(v, e->key) == e);
            if (depth > 0) /* only the root holds tables */
                CHECK(tdm_toml_type_of(e->value) != TDM_TOML_TABLE &&
                      !tdm_toml_is_table_array(e->value));
            check_value(e->value, depth + 1);
        }
        break;
    default: break;
    }
}

/* Equal content, ignoring positions and the order of a table's entries. */
static void check_equal(const tdm_toml_value *a, const tdm_toml_value *b)
{
    CHECK(tdm_toml_type_of(a) == tdm_toml_type_of(b));
    CHECK(tdm_toml_len(a) == tdm_toml_len(b));
    switch (tdm_toml_type_of(a)) {
    case TDM_TOML_STRING: {
        size_t na, nb;
        const char *sa = tdm_toml_string(a, &na), *sb = tdm_toml_string(b, &nb);
        CHECK(na == nb && memcmp(sa, sb, na) == 0);
        break;
    }
    case TDM_TOML_INTEGER: CHECK(tdm_toml_int(a) == tdm_toml_int(b)); break;
    case TDM_TOML_FLOAT:
        CHECK(tdm_toml_float(a) == tdm_toml_float(b) &&
              signbit(tdm_toml_float(a)) == signbit(tdm_toml_float(b)));
        break;
    case TDM_TOML_BOOL: CHECK(tdm_toml_bool(a) == tdm_toml_bool(b)); break;
    case TDM_TOML_ARRAY:
        CHECK(tdm_toml_is_table_array(a) == tdm_toml_is_table_array(b));
        for (size_t i = 0; i < tdm_toml_len(a); i++)
            check_equal(tdm_toml_at(a, i), tdm_toml_at(b, i));
        break;
    case TDM_TOML_TABLE:
        for (size_t i = 0; i < tdm_toml_len(a); i++) {
            const tdm_toml_entry *e = tdm_toml_entry_at(a, i);
            const tdm_toml_value *other = tdm_toml_get(b, e->key);
            CHECK(other);
            check_equal(e->value, other);
        }
        break;
    }
}

static void check_adapters(const uint8_t *data, size_t size)
{
    tdm_adapters_config cfg;
    tdm_error err = {0};
    tdm_status st = tdm_adapters_config_parse((const char *)data, size, "fuzz.toml", &cfg, &err);
    if (st != TDM_OK) {
        CHECK(cfg.adapters == NULL && cfg.file == NULL && cfg.n_adapters == 0);
        CHECK(strncmp(err.message, "fuzz.toml", 9) == 0 || st == TDM_ERR_NOMEM);
        return;
    }
    CHECK(cfg.n_adapters >= 1);
    for (size_t i = 0; i < cfg.n_adapters; i++) {
        const tdm_adapter_spec *s = &cfg.adapters[i];
        CHECK(s->data && *s->data && s->output && *s->output);
        CHECK(s->line >= 1);
        CHECK(!s->has_rank || (s->rank >= 1 && s->rank <= TDM_ADAPTER_RANK_MAX));
        CHECK(!s->has_alpha || (isfinite(s->alpha) && s->alpha > 0));
        CHECK(!s->has_targets || (s->targets && !(s->targets & ~TDM_ADAPTER_TARGET_ALL)));
        CHECK(!s->has_learning_rate || (s->learning_rate > 0 && s->learning_rate <= 1));
        CHECK(!s->has_epochs || (s->epochs >= 1 && s->epochs <= TDM_ADAPTER_EPOCHS_MAX));
        CHECK(!s->has_weight || (isfinite(s->weight) && s->weight > 0));
        CHECK(s->has_rank == (s->key_line[TDM_ADAPTER_KEY_RANK] != 0));
        CHECK(!s->has_task || !strcmp(s->task, "instruct"));
        CHECK(!s->has_chat_template || (unsigned)s->chat_template <= TDM_CHAT_LLAMA3);
        CHECK(s->has_no_shuffle == (s->key_line[TDM_ADAPTER_KEY_NO_SHUFFLE] != 0));
        CHECK(!s->label || (strlen(s->label) >= 1 && strlen(s->label) <= TDM_ADAPTER_LABEL_MAX));
        for (size_t j = 0; j < i; j++)
            CHECK(!s->label || !cfg.adapters[j].label || strcmp(s->label, cfg.adapters[j].label));
    }
    tdm_adapters_config_free(&cfg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tdm_toml_doc *doc = (tdm_toml_doc *)&doc;
    tdm_error err = {0};
    tdm_status st = tdm_toml_parse((const char *)data, size, "fuzz.toml", &doc, &err);
    if (st != TDM_OK) {
        CHECK(doc == NULL);
        CHECK(st == TDM_ERR_PARSE || st == TDM_ERR_NOMEM);
        CHECK(strncmp(err.message, "fuzz.toml", 9) == 0 || st == TDM_ERR_NOMEM);
        CHECK(strlen(err.message) < sizeof err.message);
    } else {
        const tdm_toml_value *root = tdm_toml_root(doc);
        check_value(root, 0);
        out_buf b = {0};
        puts_(&b, "");
        emit_doc(&b, root);
        tdm_toml_doc *again = NULL;
        st = tdm_toml_parse(b.p, b.len, "again.toml", &again, &err);
        if (st != TDM_OK) {
            fprintf(stderr, "fuzz_toml: re-parse failed: %s\n--- emitted ---\n%s\n", err.message,
                    b.p);
            abort();
        }
        check_equal(root, tdm_toml_root(again));
        check_equal(tdm_toml_root(again), root);
        tdm_toml_free(again);
        free(b.p);
        tdm_toml_free(doc);
    }
    check_adapters(data, size);
    return 0;
}
