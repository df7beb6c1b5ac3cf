/* spawn.h — run a program from an argv (never through system()), feed it stdin, collect its
 * stdout and stderr, bound its run time.
 *
 * The child is started with posix_spawnp; stdout and stderr are read until the child has exited
 * and the pipes are drained. Reading stops at the child's exit rather than at end of file, so a
 * grandchild that keeps a copy of the pipe (ssh's ControlPersist master, a detached job) cannot
 * hang the caller.
 */
#ifndef TANDEM_CLUSTER_SPAWN_H
#define TANDEM_CLUSTER_SPAWN_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

/* Output kept per stream; more is read and dropped (out_truncated / err_truncated say so). */
#define TDM_SPAWN_OUTPUT_MAX ((size_t)64 << 20)

typedef struct tdm_spawn_result {
    int exit_code;   /* the exit status, 128 + N when killed by signal N, 127 when not found */
    bool timed_out;  /* killed (SIGKILL) because timeout_ms passed */
    char *out;       /* stdout, NUL-terminated (out_len excludes the NUL) */
    size_t out_len;
    char *err;       /* stderr, NUL-terminated */
    size_t err_len;
    bool out_truncated, err_truncated;
} tdm_spawn_result;

/* Runs argv[0] (searched on PATH) with argv, the caller's environment, stdin from
 * stdin_data[0..stdin_len) (empty when NULL), and waits at most timeout_ms (<= 0: no limit).
 * A program that cannot be started is exit_code 127 with the reason in res->err, not an error;
 * the status is not TDM_OK only when tandem itself fails (pipes, memory). Free with
 * tdm_spawn_result_free. */
tdm_status tdm_spawn_run(const char *const *argv, const char *stdin_data, size_t stdin_len,
                         int64_t timeout_ms, tdm_spawn_result *res, tdm_error *err);

void tdm_spawn_result_free(tdm_spawn_result *res);

/* The last max_lines lines of text[0..len) (a pointer into text). */
const char *tdm_text_tail(const char *text, size_t len, int max_lines);

#endif
