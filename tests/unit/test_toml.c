/* Unit tests of src/util/toml: the accepted subset, the document tree, and every refusal with
 * its exact FILE:LINE:COL. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/toml.h"

static tdm_toml_doc *parse_ok(const char *text)
{
    tdm_toml_doc *doc = NULL;
    tdm_error err = {0};
    tdm_status st = tdm_toml_parse(text, strlen(text), "t.toml", &doc, &err);
    if (st != TDM_OK)
        fail_msg("expected success for <<%s>>, got: %s", text, err.message);
    assert_non_null(doc);
    return doc;
}

static void test_scalars(void **state)
{
    tdm_toml_doc *doc = parse_ok("# leading comment\n"
                                 "s = \"a\\tb\\n\\\"q\\\" \\\\ \\u00e9 \\U0001F600\" # trailing\n"
                                 "lit = 'C:\\path\\no\\escapes'\n"
                                 "i = +1_000\n"
                                 "neg = -42\n"
                                 "zero = 0\n"
                                 "mzero = -0\n"
                                 "max = 9223372036854775807\n"
                                 "min = -9223372036854775808\n"
                                 "f1 = 2e-4\n"
                                 "f2 = -3.5\n"
                                 "f3 = 1_0.2_5E+0_1\n"
                                 "f4 = 0.0\n"
                                 "f5 = 1e-400\n"
                                 "t = true\n"
                                 "f = false\n"
                                 "\"quoted key\" = 1\n"
                                 "'lit key' = 2\n"
                                 "\"\" = 3\n"
                                 "1234 = 'bare digits'\n"
                                 "true = 'bare true'\n"
                                 "a-b_C = 5\n");
    const tdm_toml_value *root = tdm_toml_root(doc);
    size_t len;
    assert_string_equal(tdm_toml_string(tdm_toml_get(root, "s"), &len),
                        "a\tb\n\"q\" \\ \xC3\xA9 \xF0\x9F\x98\x80");
    assert_int_equal(len, 17);
    assert_string_equal(tdm_toml_string(tdm_toml_get(root, "lit"), NULL),
                        "C:\\path\\no\\escapes");
    assert_int_equal(tdm_toml_int(tdm_toml_get(root, "i")), 1000);
    assert_int_equal(tdm_toml_int(tdm_toml_get(root, "neg")), -42);
    assert_int_equal(tdm_toml_int(tdm_toml_get(root, "zero")), 0);
    assert_int_equal(tdm_toml_int(tdm_toml_get(root, "mzero")), 0);
    assert_true(tdm_toml_int(tdm_toml_get(root, "max")) == INT64_MAX);
    assert_true(tdm_toml_int(tdm_toml_get(root, "min")) == INT64_MIN);
    assert_int_equal(tdm_toml_type_of(tdm_toml_get(root, "f1")), TDM_TOML_FLOAT);
    assert_true(tdm_toml_float(tdm_toml_get(root, "f1")) == 2e-4);
    assert_true(tdm_toml_float(tdm_toml_get(root, "f2")) == -3.5);
    assert_true(tdm_toml_float(tdm_toml_get(root, "f3")) == 102.5);
    assert_true(tdm_toml_float(tdm_toml_get(root, "f4")) == 0.0);
    assert_true(tdm_toml_float(tdm_toml_get(root, "f5")) == 0.0);
    assert_true(tdm_toml_bool(tdm_toml_get(root, "t")));
    assert_int_equal(tdm_toml_type_of(tdm_toml_get(root, "f")), TDM_TOML_BOOL);
    assert_false(tdm_toml_bool(tdm_toml_get(root, "f")));
    assert_int_equal(tdm_toml_int(tdm_toml_get(root, "quoted key")), 1);
    assert_int_equal(tdm_toml_int(tdm_toml_get(root, "lit key")), 2);
    assert_int_equal(tdm_toml_int(tdm_toml_get(root, "")), 3);
    assert_string_equal(tdm_toml_string(tdm_toml_get(root, "1234"), NULL), "bare digits");
    assert_string_equal(tdm_toml_string(tdm_toml_get(root, "true"), NULL), "bare true");
    assert_int_equal(tdm_toml_int(tdm_toml_get(root, "a-b_C")), 5);
    assert_null(tdm_toml_get(root, "missing"));
    /* Positions: line and column (in code points) of each value and key. */
    const tdm_toml_entry *e = tdm_toml_get_entry(root, "i");
    assert_int_equal(e->line, 4);
    assert_int_equal(e->col, 1);
    assert_int_equal(tdm_toml_line(e->value), 4);
    assert_int_equal(tdm_toml_col(e->value), 5);
    assert_string_equal(tdm_toml_file(e->value), "t.toml");
    /* Entries keep file order. */
    assert_string_equal(tdm_toml_entry_at(root, 0)->key, "s");
    assert_string_equal(tdm_toml_entry_at(root, 1)->key, "lit");
    assert_null(tdm_toml_entry_at(root, tdm_toml_len(root)));
    tdm_toml_free(doc);
}

static void test_arrays(void **state)
{
    tdm_toml_doc *doc = parse_ok("a = [1, 2, 3]\n"
                                 "empty = []\n"
                                 "multi = [\n"
                                 "  'q_proj', # comment inside\n"
                                 "\n"
                                 "  \"v_proj\",\n"
                                 "]\n"
                                 "nested = [[1, 2], ['x'], []]\n"
                                 "crlf = [1,\r\n 2]\r\n"
                                 "after = 'x'\n");
    const tdm_toml_value *root = tdm_toml_root(doc);
    const tdm_toml_value *a = tdm_toml_get(root, "a");
    assert_int_equal(tdm_toml_type_of(a), TDM_TOML_ARRAY);
    assert_false(tdm_toml_is_table_array(a));
    assert_int_equal(tdm_toml_len(a), 3);
    assert_int_equal(tdm_toml_int(tdm_toml_at(a, 2)), 3);
    assert_null(tdm_toml_at(a, 3));
    assert_int_equal(tdm_toml_len(tdm_toml_get(root, "empty")), 0);
    const tdm_toml_value *m = tdm_toml_get(root, "multi");
    assert_int_equal(tdm_toml_len(m), 2);
    assert_string_equal(tdm_toml_string(tdm_toml_at(m, 1), NULL), "v_proj");
    assert_int_equal(tdm_toml_line(tdm_toml_at(m, 1)), 6);
    assert_int_equal(tdm_toml_col(tdm_toml_at(m, 1)), 3);
    const tdm_toml_value *n = tdm_toml_get(root, "nested");
    assert_int_equal(tdm_toml_len(n), 3);
    assert_int_equal(tdm_toml_len(tdm_toml_at(n, 0)), 2);
    assert_int_equal(tdm_toml_len(tdm_toml_get(root, "crlf")), 2);
    assert_int_equal(tdm_toml_line(tdm_toml_get(root, "after")), 11);
    tdm_error err = {0};
    assert_int_equal(tdm_toml_as_array_of(m, TDM_TOML_STRING, "targets", &err), TDM_OK);
    assert_int_equal(tdm_toml_as_array_of(a, TDM_TOML_STRING, "targets", &err), TDM_ERR_INVALID);
    assert_string_equal(err.message, "t.toml:1:6: targets must be an array of strings, not of "
                                     "integers");
    tdm_toml_free(doc);
}

static void test_tables_tree(void **state)
{
    tdm_toml_doc *doc = parse_ok("\xEF\xBB\xBF"
                                 "top = 1\n"
                                 "[defaults]\n"
                                 "rank = 8\n"
                                 "\n"
                                 "[[adapter]]  # first\n"
                                 "data = 'a.jsonl'\n"
                                 "[ \"other\" ]\n"
                                 "x = 1\n"
                                 "[[adapter]]\n"
                                 "data = 'b.jsonl'\n"
                                 "[[adapter]]\n");
    const tdm_toml_value *root = tdm_toml_root(doc);
    assert_int_equal(tdm_toml_col(tdm_toml_get(root, "top")), 7); /* the BOM is not a column */
    assert_int_equal(tdm_toml_int(tdm_toml_get(tdm_toml_get(root, "defaults"), "rank")), 8);
    assert_int_equal(tdm_toml_int(tdm_toml_get(tdm_toml_get(root, "other"), "x")), 1);
    tdm_error err = {0};
    const tdm_toml_value *aot;
    assert_int_equal(tdm_toml_get_table_array(root, "adapter", &aot, &err), TDM_OK);
    assert_true(tdm_toml_is_table_array(aot));
    assert_int_equal(tdm_toml_len(aot), 3);
    const char *data;
    assert_int_equal(tdm_toml_get_string(tdm_toml_at(aot, 1), "data", &data, &err), TDM_OK);
    assert_string_equal(data, "b.jsonl");
    assert_int_equal(tdm_toml_line(tdm_toml_at(aot, 1)), 9);
    /* A missing key names the table and its header line. */
    assert_int_equal(tdm_toml_get_string(tdm_toml_at(aot, 2), "data", &data, &err),
                     TDM_ERR_NOT_FOUND);
    assert_string_equal(err.message, "t.toml:11: [[adapter]] #3 has no key 'data'");
    assert_int_equal(tdm_toml_get_string(root, "nope", &data, &err), TDM_ERR_NOT_FOUND);
    assert_string_equal(err.message, "t.toml: the top level has no key 'nope'");
    /* [defaults] is not a [[table]] list. */
    assert_int_equal(tdm_toml_get_table_array(root, "defaults", &aot, &err), TDM_ERR_INVALID);
    assert_string_equal(err.message, "t.toml:2:1: 'defaults' must be a list of [[defaults]] "
                                     "tables (double brackets), not a single [table]");
    /* Typed getters name the setting, the place and both types. */
    int64_t i;
    double d;
    bool b;
    assert_int_equal(tdm_toml_get_int(tdm_toml_at(aot, 0), "data", &i, &err), TDM_ERR_INVALID);
    assert_string_equal(err.message, "t.toml:6:8: data must be an integer, not a string");
    assert_int_equal(tdm_toml_get_number(root, "top", &d, &err), TDM_OK);
    assert_true(d == 1.0);
    assert_int_equal(tdm_toml_get_bool(root, "top", &b, &err), TDM_ERR_INVALID);
    assert_string_equal(err.message, "t.toml:1:7: top must be true or false, not an integer");
    assert_int_equal(tdm_toml_as_table(tdm_toml_get(root, "adapter"), "adapter", &err),
                     TDM_ERR_INVALID);
    assert_string_equal(err.message, "t.toml:5:1: adapter must be a table, not a [[table]] list");
    tdm_toml_fail_at(&err, TDM_ERR_INVALID, tdm_toml_get(tdm_toml_get(root, "defaults"), "rank"),
                     "rank must be at most %d", 4);
    assert_string_equal(err.message, "t.toml:3:8: rank must be at most 4");
    tdm_toml_free(doc);
}

/* Many keys in one table exercise the hash index (and stay linear time). */
static void test_many_keys(void **state)
{
    size_t n = 20000, cap = n * 24 + 1, len = 0;
    char *text = malloc(cap);
    assert_non_null(text);
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(text + len, cap - len, "k%zu = %zu\n", i, i);
    tdm_toml_doc *doc = NULL;
    tdm_error err = {0};
    assert_int_equal(tdm_toml_parse(text, len, "big.toml", &doc, &err), TDM_OK);
    const tdm_toml_value *root = tdm_toml_root(doc);
    assert_int_equal(tdm_toml_len(root), n);
    for (size_t i = 0; i < n; i += 997) {
        char key[32];
        snprintf(key, sizeof key, "k%zu", i);
        assert_int_equal(tdm_toml_int(tdm_toml_get(root, key)), (int64_t)i);
    }
    tdm_toml_free(doc);
    /* The same key twice at the end is still found. */
    len += (size_t)snprintf(text + len, cap - len, "k17 = 1\n");
    assert_int_equal(tdm_toml_parse(text, len, "big.toml", &doc, &err), TDM_ERR_PARSE);
    assert_null(doc);
    char want[128];
    snprintf(want, sizeof want, "big.toml:%zu:1: duplicate key 'k17' (first defined at line 18)",
             n + 1);
    assert_string_equal(err.message, want);
    free(text);
}

/* Input is taken by length: no NUL terminator is needed, and the empty document is valid. */
static void test_length_bounded(void **state)
{
    const char text[] = {'a', ' ', '=', ' ', '1', '2', '3'};
    tdm_toml_doc *doc = NULL;
    tdm_error err = {0};
    assert_int_equal(tdm_toml_parse(text, 5, NULL, &doc, &err), TDM_OK);
    assert_int_equal(tdm_toml_int(tdm_toml_get(tdm_toml_root(doc), "a")), 1);
    assert_string_equal(tdm_toml_filename(doc), "<input>");
    tdm_toml_free(doc);
    assert_int_equal(tdm_toml_parse(NULL, 0, "e.toml", &doc, &err), TDM_OK);
    assert_int_equal(tdm_toml_len(tdm_toml_root(doc)), 0);
    tdm_toml_free(doc);
    tdm_toml_free(NULL);
}

typedef struct bad_case {
    const char *text;
    size_t len; /* 0: strlen(text) */
    const char *where; /* "LINE:COL" */
    const char *says;  /* a substring of the message */
} bad_case;

static const bad_case bad_cases[] = {
    /* Refused features, by name. */
    {"a.b = 1\n", 0, "1:2", "dotted keys are not supported"},
    {"x = 1\n\"a\" . b = 1\n", 0, "2:5", "dotted keys"},
    {"[a.b]\n", 0, "1:3", "dotted keys"},
    {"s = \"\"\"\nx\n\"\"\"\n", 0, "1:5", "multi-line strings"},
    {"s = '''x'''\n", 0, "1:5", "multi-line strings"},
    {"t = { a = 1 }\n", 0, "1:5", "inline tables"},
    {"d = 1979-05-27\n", 0, "1:5", "dates and times are not supported"},
    {"d = 07:32:00\n", 0, "1:5", "dates and times"},
    {"h = 0xff\n", 0, "1:5", "hexadecimal"},
    {"h = 0o17\n", 0, "1:5", "hexadecimal, octal and binary"},
    {"x = inf\n", 0, "1:5", "inf and nan are not accepted"},
    {"x = -nan\n", 0, "1:5", "inf and nan"},
    {"x = +inf\n", 0, "1:5", "inf and nan"},
    /* Duplicates and redefinitions. */
    {"a = 1\nb = 2\na = 3\n", 0, "3:1", "duplicate key 'a' (first defined at line 1)"},
    {"[t]\nx = 1\n  x = 2\n", 0, "3:3", "duplicate key 'x'"},
    {"[t]\n[t]\n", 0, "2:1", "[t]: 't' is already defined as a table at line 1"},
    {"[t]\n[[t]]\n", 0, "2:1", "[[t]]: 't' is already defined as a table at line 1"},
    {"[[t]]\n[t]\n", 0, "2:1", "already defined as an array of tables"},
    {"t = 1\n[t]\n", 0, "2:1", "'t' is already defined as a key at line 1"},
    {"t = []\n[[t]]\n", 0, "2:1", "already defined as a key"},
    {"[t]\n'x' = 1\n\"x\" = 2\n", 0, "3:1", "duplicate key 'x'"},
    /* One key per line. */
    {"a = 1 b = 2\n", 0, "1:7", "expected the end of the line after the value, found 'b'"},
    {"a = 'x''y'\n", 0, "1:8", "expected the end of the line"},
    {"[t] x = 1\n", 0, "1:5", "after the table header"},
    {"a = true2\n", 0, "1:5", "expected a value"},
    {"a = hello\n", 0, "1:5", "strings need quotes"},
    {"a =\n", 0, "1:4", "missing value"},
    {"a = # c\n", 0, "1:5", "missing value"},
    {"a 1\n", 0, "1:3", "expected '=' after the key, found '1'"},
    {"a\n", 0, "1:2", "expected '=' after the key, found end of line"},
    {"= 1\n", 0, "1:1", "expected a key, found '='"},
    {"[]\n", 0, "1:2", "expected a table name, found ']'"},
    {"[a\n", 0, "1:3", "expected ']' to close the table header, found end of line"},
    {"[[a]\n", 0, "1:4", "expected ']]' to close the table header, found ']'"},
    {"[ [a]]\n", 0, "1:3", "expected a table name, found '['"},
    /* Strings and escapes. */
    {"s = \"abc\n", 0, "1:5", "unterminated string"},
    {"s = 'abc", 0, "1:5", "unterminated string"},
    {"s = \"a\\qb\"\n", 0, "1:7", "bad escape \\'q'"},
    {"s = \"a\\u12\"\n", 0, "1:7", "\\u needs exactly 4 hexadecimal digits"},
    {"s = \"\\U0011FFFF\"\n", 0, "1:6", "not a Unicode scalar value"},
    {"s = \"\\uD800\"\n", 0, "1:6", "not a Unicode scalar value"},
    {"s = \"\\u0000\"\n", 0, "1:6", "NUL (U+0000) is not allowed"},
    {"s = \"ab\\\n\"\n", 0, "1:8", "backslash at the end of a line"},
    {"s = \"a\x01\"\n", 0, "1:7", "control character U+0001 in a string"},
    {"s = 'a\x7f'\n", 0, "1:7", "control character U+007F"},
    {"s = \"caf\xC3\xA9\x02\"\n", 0, "1:10", "control character U+0002"},
    {"# ok\n# bad \x1b\n", 0, "2:7", "control character U+001B in a comment"},
    /* Numbers. */
    {"n = 007\n", 0, "1:5", "leading zeros are not allowed"},
    {"n = -01\n", 0, "1:5", "leading zeros"},
    {"n = 00.5\n", 0, "1:5", "leading zeros"},
    {"n = 1__0\n", 0, "1:6", "underscore in a number must sit between two digits"},
    {"n = _1\n", 0, "1:5", "expected a value"},
    {"n = 1_\n", 0, "1:6", "underscore"},
    {"n = 1_.5\n", 0, "1:6", "underscore"},
    {"n = 1._5\n", 0, "1:7", "decimal point must be followed by a digit"},
    {"n = 1.\n", 0, "1:7", "decimal point must be followed by a digit"},
    {"n = .5\n", 0, "1:5", "expected a value"},
    {"n = 1e\n", 0, "1:7", "exponent needs digits"},
    {"n = 1e+\n", 0, "1:8", "exponent needs digits"},
    {"n = 1.5.2\n", 0, "1:8", "at most one decimal point"},
    {"n = 12abc\n", 0, "1:7", "invalid character 'a' in a number"},
    {"n = +\n", 0, "1:6", "expected a digit"},
    {"n = 9223372036854775808\n", 0, "1:5", "does not fit in 64 bits"},
    {"n = -9223372036854775809\n", 0, "1:5", "does not fit in 64 bits"},
    {"n = 99999999999999999999999999999\n", 0, "1:5", "does not fit in 64 bits"},
    {"n = 1e309\n", 0, "1:5", "too large for a double"},
    {"n = -1.5e99999\n", 0, "1:5", "too large for a double"},
    /* Arrays. */
    {"a = [1, 'x']\n", 0, "1:9", "arrays must hold one type"},
    {"a = [1, 2.0]\n", 0, "1:9", "write every element as a float"},
    {"a = [\n  [1],\n  2,\n]\n", 0, "3:3", "the first (line 2) is an array"},
    {"a = [1 2]\n", 0, "1:8", "expected ',' or ']' in the array, found '2'"},
    {"a = [,]\n", 0, "1:6", "expected a value before ','"},
    {"a = [1,,2]\n", 0, "1:8", "expected a value before ','"},
    {"a = [1,\n2\n", 0, "1:5", "unterminated array"},
    {"a = [\n", 0, "1:5", "unterminated array"},
    {"a = [{x = 1}]\n", 0, "1:6", "inline tables"},
    {"a = [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]\n", 0, "1:37",
     "nested more than 32 deep"},
    /* Encoding. */
    {"a = 'x'\nb = 'caf\xC3'\n", 0, "2:9", "invalid UTF-8 (byte 0xC3)"},
    {"a = '\xC0\xAF'\n", 0, "1:6", "invalid UTF-8 (byte 0xC0)"},   /* overlong */
    {"a = '\xED\xA0\x80'\n", 0, "1:6", "invalid UTF-8 (byte 0xED)"}, /* surrogate */
    {"a = '\xF4\x90\x80\x80'\n", 0, "1:6", "invalid UTF-8"},          /* > U+10FFFF */
    {"\xC3\xA9\xC3\xA9 = 1\n\xFF", 0, "2:1", "invalid UTF-8"},
    {"a = 1\nb = 2\0\n", 12, "2:6", "NUL byte"},
    {"a = 1\rb = 2\n", 0, "1:6", "carriage return without a line feed"},
    {"a = 'x'\n  # \xC3\xA9\xC3\xA9 \x01\n", 0, "2:8", "U+0001 in a comment"},
};

static void test_bad_inputs(void **state)
{
    int failures = 0;
    for (size_t k = 0; k < sizeof bad_cases / sizeof bad_cases[0]; k++) {
        const bad_case *c = &bad_cases[k];
        size_t len = c->len ? c->len : strlen(c->text);
        tdm_toml_doc *doc = (tdm_toml_doc *)1;
        tdm_error err = {0};
        tdm_status st = tdm_toml_parse(c->text, len, "bad.toml", &doc, &err);
        char prefix[64];
        snprintf(prefix, sizeof prefix, "bad.toml:%s: ", c->where);
        if (st != TDM_ERR_PARSE || doc != NULL || strncmp(err.message, prefix, strlen(prefix)) ||
            !strstr(err.message, c->says))
        {
            print_error("case %zu <<%s>>: want %s...%s, got status %d: %s\n", k, c->text, prefix,
                        c->says, (int)st, err.message);
            failures++;
        }
    }
    assert_int_equal(failures, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scalars),        cmocka_unit_test(test_arrays),
        cmocka_unit_test(test_tables_tree),
        cmocka_unit_test(test_many_keys),      cmocka_unit_test(test_length_bounded),
        cmocka_unit_test(test_bad_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
