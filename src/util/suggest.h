/* suggest.h — "did you mean ...?" for misspelled names (config keys, subcommands, flags). */
#ifndef TANDEM_UTIL_SUGGEST_H
#define TANDEM_UTIL_SUGGEST_H
#include <stddef.h>

/* Optimal-string-alignment distance between a[0..alen) and b[0..blen): insertions, deletions,
 * substitutions and swaps of two neighbouring bytes each cost 1 ("rnak" is 1 from "rank").
 * Returns SIZE_MAX when memory for the (blen + 1)-wide rows cannot be allocated. */
size_t tdm_edit_distance(const char *a, size_t alen, const char *b, size_t blen);

/* The candidate closest to word when it is close enough to be a likely typo (distance at most
 * 1 for words of up to 4 bytes, 2 up to 8, 3 beyond); the first of equals wins. NULL when none
 * is. candidates has n NUL-terminated entries. */
const char *tdm_suggest(const char *word, const char *const *candidates, size_t n);

#endif
