/* shell_quote.h — the one place where an argument is made safe for a POSIX shell.
 *
 * Everything tandem sends to a remote shell (ssh joins its arguments into one command line that
 * the login shell on the node parses) goes through tdm_shell_quote: the argument is wrapped in
 * single quotes, inside which no character is special, and every single quote in it becomes
 * '\'' (close, an escaped quote, reopen). The shell then hands the program exactly the original
 * bytes: spaces, newlines, $(...), backticks, ;, globs and quotes included.
 */
#ifndef TANDEM_CLUSTER_SHELL_QUOTE_H
#define TANDEM_CLUSTER_SHELL_QUOTE_H
#include <stddef.h>

/* A malloc'd single-quoted copy of s ("''" for the empty string); NULL when out of memory. */
char *tdm_shell_quote(const char *s);

/* s as a shell word for a human to copy: bare when it holds only characters no shell treats
 * specially (letters, digits, -_./:=,+@), else tdm_shell_quote's. malloc'd; NULL when out of
 * memory. */
char *tdm_shell_word(const char *s);

/* argv[0..argc) quoted one by one and joined with single spaces: a command line a POSIX shell
 * splits back into exactly argv. malloc'd; NULL when out of memory. */
char *tdm_shell_join(const char *const *argv, size_t argc);

#endif
