#include "util/suggest.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static size_t min3(size_t a, size_t b, size_t c)
{
    size_t m = a < b ? a : b;
    return m < c ? m : c;
}

size_t tdm_edit_distance(const char *a, size_t alen, const char *b, size_t blen)
{
    if (blen == SIZE_MAX || blen + 1 > SIZE_MAX / (3 * sizeof(size_t)))
        return SIZE_MAX;
    /* Three rows: i-2, i-1, i. */
    size_t *rows = malloc(3 * (blen + 1) * sizeof *rows);
    if (!rows)
        return SIZE_MAX;
    size_t *pp = rows, *prev = rows + (blen + 1), *cur = rows + 2 * (blen + 1);
    for (size_t j = 0; j <= blen; j++)
        prev[j] = j;
    for (size_t i = 1; i <= alen; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= blen; j++) {
            size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
            size_t d = min3(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost);
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && pp[j - 2] + 1 < d)
                d = pp[j - 2] + 1;
            cur[j] = d;
        }
        size_t *t = pp;
        pp = prev;
        prev = cur;
        cur = t;
    }
    size_t result = prev[blen];
    free(rows);
    return result;
}

const char *tdm_suggest(const char *word, const char *const *candidates, size_t n)
{
    size_t wlen = strlen(word);
    size_t limit = wlen <= 4 ? 1 : wlen <= 8 ? 2 : 3;
    const char *best = NULL;
    size_t best_d = SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        size_t clen = strlen(candidates[i]);
        /* The distance is at least the length difference: skip hopeless candidates cheaply
         * (this also keeps a huge word from costing more than a length compare). */
        size_t diff = wlen > clen ? wlen - clen : clen - wlen;
        if (diff > limit)
            continue;
        size_t d = tdm_edit_distance(word, wlen, candidates[i], clen);
        if (d <= limit && d < best_d) {
            best = candidates[i];
            best_d = d;
        }
    }
    return best;
}
