/* shell_quote.c — single-quote quoting for POSIX shells. */
#include "cluster/shell_quote.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

char *tdm_shell_quote(const char *s)
{
    size_t quotes = 0, n = strlen(s);
    for (size_t i = 0; i < n; i++)
        quotes += s[i] == '\'';
    char *out = malloc(n + quotes * 3 + 3);
    if (!out)
        return NULL;
    char *p = out;
    *p++ = '\'';
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\'') {
            memcpy(p, "'\\''", 4);
            p += 4;
        } else {
            *p++ = s[i];
        }
    }
    *p++ = '\'';
    *p = '\0';
    return out;
}

char *tdm_shell_word(const char *s)
{
    bool plain = *s && strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                 "0123456789-_./:=,+@") == strlen(s);
    return plain ? strdup(s) : tdm_shell_quote(s);
}

char *tdm_shell_join(const char *const *argv, size_t argc)
{
    size_t cap = 1, len = 0;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    out[0] = '\0';
    for (size_t i = 0; i < argc; i++) {
        char *q = tdm_shell_quote(argv[i]);
        if (!q) {
            free(out);
            return NULL;
        }
        size_t qn = strlen(q);
        char *grown = realloc(out, len + qn + 2);
        if (!grown) {
            free(q);
            free(out);
            return NULL;
        }
        out = grown;
        if (i)
            out[len++] = ' ';
        memcpy(out + len, q, qn + 1);
        len += qn;
        free(q);
    }
    return out;
}
