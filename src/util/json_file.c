/* json_file.c — encode a jansson document and write it atomically (see json_file.h). */
#include "util/json_file.h"

#include <stdlib.h>
#include <string.h>

#include "util/atomic_file.h"

char *tdm_json_dumps_line(const json_t *doc, size_t flags)
{
    char *text = doc ? json_dumps(doc, flags) : NULL;
    if (!text) return NULL;
    /* jansson allocates with malloc by default, so the buffer can grow by the newline. */
    size_t n = strlen(text);
    char *line = realloc(text, n + 2);
    if (!line) {
        free(text);
        return NULL;
    }
    line[n] = '\n';
    line[n + 1] = '\0';
    return line;
}

tdm_status tdm_atomic_write_json(const char *path, const json_t *doc, size_t flags, bool newline,
                                 mode_t mode, tdm_error *err)
{
    char *text = newline ? tdm_json_dumps_line(doc, flags) : doc ? json_dumps(doc, flags) : NULL;
    if (!text) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory encoding %s", path);
    tdm_status st = tdm_atomic_write(path, text, strlen(text), mode, err);
    free(text);
    return st;
}
