/* json_file.h — a jansson document as file text: the one place that encodes a document, adds
 * the trailing newline where the file has one, and writes it atomically (util/atomic_file.h).
 * flags are jansson's json_dumps flags, passed through unchanged, so a caller keeps its exact
 * bytes (indentation, key order, real precision). */
#ifndef TANDEM_UTIL_JSON_FILE_H
#define TANDEM_UTIL_JSON_FILE_H
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "util/error.h"

/* json_dumps(doc, flags) followed by "\n": malloc'd (free()), NULL when doc is NULL or out of
 * memory. */
char *tdm_json_dumps_line(const json_t *doc, size_t flags);

/* Writes json_dumps(doc, flags), then "\n" when newline, to path atomically with mode (the
 * file is replaced whole or not at all). doc is not consumed; a NULL doc (a failed build of
 * it) is TDM_ERR_NOMEM naming path. */
tdm_status tdm_atomic_write_json(const char *path, const json_t *doc, size_t flags, bool newline,
                                 mode_t mode, tdm_error *err);

#endif
