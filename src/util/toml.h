/* toml.h — a small, strict parser for the TOML subset tandem's config files use.
 *
 * The subset (docs/adapters-toml.md states it for users):
 *   - UTF-8 text (a leading BOM is skipped), LF or CRLF line ends, `#` comments.
 *   - `key = value` lines; keys are bare (A-Z a-z 0-9 _ -) or quoted ("..." or '...').
 *   - `[table]` and `[[array-of-tables]]` headers with one key each (all tables sit at the top).
 *   - values: basic strings "..." (escapes \" \\ \b \t \n \f \r \uXXXX \UXXXXXXXX), literal
 *     strings '...', 64-bit decimal integers (sign, `_` between digits, no leading zeros),
 *     finite decimal floats (fraction and/or exponent), true/false, arrays (may span lines,
 *     trailing comma allowed, all elements of one type, nested at most TDM_TOML_MAX_DEPTH deep).
 * Refused by name with "FILE:LINE:COL: message": dotted keys, multi-line strings, inline tables,
 * dates and times, hex/octal/binary integers, inf and nan, \u0000, duplicate keys, redefined
 * tables, anything after a value on its line, bad escapes, invalid UTF-8, NUL bytes, control
 * characters, integers that do not fit in 64 bits, floats that overflow a double.
 * Columns count Unicode code points from 1 (a tab counts as one).
 *
 * Ownership: tdm_toml_parse returns a document that owns every value, key and string in it.
 * Every pointer obtained from the accessors below is borrowed and stays valid until
 * tdm_toml_free(doc). The document is immutable after parsing, so concurrent readers are safe.
 *
 *     tdm_toml_doc *doc;
 *     if (tdm_toml_parse(text, len, "adapters.toml", &doc, &err) != TDM_OK) return err.status;
 *     const tdm_toml_value *aot;
 *     if (tdm_toml_get_table_array(tdm_toml_root(doc), "adapter", &aot, &err) == TDM_OK)
 *         for (size_t i = 0; i < tdm_toml_len(aot); i++) { const tdm_toml_value *t = tdm_toml_at(aot, i); ... }
 *     tdm_toml_free(doc);
 */
#ifndef TANDEM_UTIL_TOML_H
#define TANDEM_UTIL_TOML_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

/* Arrays nested deeper than this are refused (bounds the parser's recursion). */
#define TDM_TOML_MAX_DEPTH 32
/* Inputs larger than this are refused (keeps line and column numbers in 32 bits). */
#define TDM_TOML_MAX_INPUT ((size_t)1 << 30)

typedef enum tdm_toml_type {
    TDM_TOML_STRING,
    TDM_TOML_INTEGER,
    TDM_TOML_FLOAT,
    TDM_TOML_BOOL,
    TDM_TOML_ARRAY, /* a [ ... ] value, or the tables of one [[name]] (tdm_toml_is_table_array) */
    TDM_TOML_TABLE, /* the root, a [name] table, or one [[name]] element */
} tdm_toml_type;

typedef struct tdm_toml_doc tdm_toml_doc;
typedef struct tdm_toml_value tdm_toml_value;

/* One `key = value` of a table (or the name of a [table] / [[table]] under the root).
 * key is NUL-terminated and never contains NUL (\u0000 is refused). line and col locate the key. */
typedef struct tdm_toml_entry {
    const char *key;
    size_t key_len;
    uint32_t line, col;
    const tdm_toml_value *value;
} tdm_toml_entry;

/* Parses len bytes of text (need not be NUL-terminated; a NUL byte inside is an error). filename
 * is only used in messages and is copied ("<input>" when NULL). On success *out owns the tree;
 * on failure *out is NULL and err holds "FILE:LINE:COL: what is wrong" with status
 * TDM_ERR_PARSE (or TDM_ERR_NOMEM). */
tdm_status tdm_toml_parse(const char *text, size_t len, const char *filename, tdm_toml_doc **out,
                          tdm_error *err);

/* Frees the document and everything in it. NULL is allowed. */
void tdm_toml_free(tdm_toml_doc *doc);

/* The top-level table (line 1, column 1). */
const tdm_toml_value *tdm_toml_root(const tdm_toml_doc *doc);
/* The file name given to tdm_toml_parse (owned by the document). */
const char *tdm_toml_filename(const tdm_toml_doc *doc);

/* --- Inspecting values. All take a non-NULL value. --- */
tdm_toml_type tdm_toml_type_of(const tdm_toml_value *v);
/* "string", "integer", "float", "boolean", "array", "table". */
const char *tdm_toml_type_name(tdm_toml_type type);
/* Where the value starts: its first character; a table's `[` (the root: 1:1). */
uint32_t tdm_toml_line(const tdm_toml_value *v);
uint32_t tdm_toml_col(const tdm_toml_value *v);
/* The document's file name, for messages about this value. */
const char *tdm_toml_file(const tdm_toml_value *v);
/* True for the array that collects the tables of [[name]] headers. */
bool tdm_toml_is_table_array(const tdm_toml_value *v);

/* Elements of an array or entries of a table; 0 for scalars. */
size_t tdm_toml_len(const tdm_toml_value *v);
/* Element i of an array (NULL when v is not an array or i is out of range). */
const tdm_toml_value *tdm_toml_at(const tdm_toml_value *array, size_t i);
/* Entry i of a table, in the order it appeared (NULL when not a table or out of range). */
const tdm_toml_entry *tdm_toml_entry_at(const tdm_toml_value *table, size_t i);
/* The value of key in table, or NULL when absent (or when table is not a table). Constant time
 * on average. */
const tdm_toml_value *tdm_toml_get(const tdm_toml_value *table, const char *key);
/* Like tdm_toml_get, and also returns the entry (for the key's own line and column). */
const tdm_toml_entry *tdm_toml_get_entry(const tdm_toml_value *table, const char *key);

/* Unchecked scalar reads: each returns the value when v has that type, else 0/""/false.
 * tdm_toml_string's *len (when not NULL) receives the byte length. */
const char *tdm_toml_string(const tdm_toml_value *v, size_t *len);
int64_t tdm_toml_int(const tdm_toml_value *v);
double tdm_toml_float(const tdm_toml_value *v);
bool tdm_toml_bool(const tdm_toml_value *v);

/* --- Checked conversions for config readers. `what` names the setting in the message, e.g.
 * "FILE:LINE:COL: rank must be an integer, not a string". They return TDM_OK or
 * TDM_ERR_INVALID. --- */
tdm_status tdm_toml_as_string(const tdm_toml_value *v, const char *what, const char **out,
                              tdm_error *err);
tdm_status tdm_toml_as_int(const tdm_toml_value *v, const char *what, int64_t *out,
                           tdm_error *err);
/* Accepts an integer or a float (integers convert to the nearest double). */
tdm_status tdm_toml_as_number(const tdm_toml_value *v, const char *what, double *out,
                              tdm_error *err);
tdm_status tdm_toml_as_bool(const tdm_toml_value *v, const char *what, bool *out,
                            tdm_error *err);
tdm_status tdm_toml_as_table(const tdm_toml_value *v, const char *what, tdm_error *err);
/* An array whose elements all have type elem (an empty array passes). */
tdm_status tdm_toml_as_array_of(const tdm_toml_value *v, tdm_toml_type elem, const char *what,
                                tdm_error *err);

/* Key lookups with the same checks. Absent keys return TDM_ERR_NOT_FOUND with the message
 * "FILE:LINE: <table> has no key 'key'" located at the table's header, so a caller can either
 * report it (required keys) or ignore it (optional keys). */
tdm_status tdm_toml_get_string(const tdm_toml_value *table, const char *key, const char **out,
                               tdm_error *err);
tdm_status tdm_toml_get_int(const tdm_toml_value *table, const char *key, int64_t *out,
                            tdm_error *err);
tdm_status tdm_toml_get_number(const tdm_toml_value *table, const char *key, double *out,
                               tdm_error *err);
tdm_status tdm_toml_get_bool(const tdm_toml_value *table, const char *key, bool *out,
                             tdm_error *err);
/* The array of tables made by [[key]] headers. A key defined any other way (a [key] table,
 * key = [...]) is TDM_ERR_INVALID with a message that says to write [[key]]. */
tdm_status tdm_toml_get_table_array(const tdm_toml_value *table, const char *key,
                                    const tdm_toml_value **out, tdm_error *err);

/* Fills err with "FILE:LINE:COL: <formatted message>" located at v and returns status: for
 * semantic errors found after parsing ("rank must be a positive integer"). */
tdm_status tdm_toml_fail_at(tdm_error *err, tdm_status status, const tdm_toml_value *v,
                            const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* The same, located at an entry's key (for "unknown key" messages). */
tdm_status tdm_toml_fail_at_key(tdm_error *err, tdm_status status, const tdm_toml_value *table,
                                const tdm_toml_entry *entry, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#endif
