/* cli.h — what the command-line front end shares: exit codes, the git-style command table, and the
 * entry points of each subcommand (one file per subcommand under src/cli/).
 *
 * Only this layer prints for humans and picks exit codes; the library below returns tdm_status.
 */
#ifndef TANDEM_CLI_H
#define TANDEM_CLI_H
#include <stdbool.h>
#include <stdio.h>

#include "util/error.h"

enum {
    TDM_EXIT_OK = 0,
    TDM_EXIT_FAILURE = 1, /* runtime failure */
    TDM_EXIT_USAGE = 2,   /* the command line is wrong */
    TDM_EXIT_TIMEOUT = 75 /* EX_TEMPFAIL: timed out waiting for GPU memory */
};

typedef struct tdm_command {
    const char *name;
    int (*run)(int argc, char **argv); /* argv[0] is the command's own name */
    const char *summary;
} tdm_command;

/* Runs the command named by argv[0] of a table ending with a {NULL} entry. `prefix` is the words
 * before it ("tandem", "tandem gpu") for messages and help. Handles --help/-h/help and unknown
 * names (usage error). */
int tdm_cli_dispatch(const char *prefix, const tdm_command *commands, int argc, char **argv);
void tdm_cli_print_commands(FILE *out, const char *prefix, const tdm_command *commands);

/* "tandem: <message>" on stderr, then returns code. */
int tdm_cli_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Maps a library status to an exit code and prints err->message. */
int tdm_cli_fail_err(const tdm_error *err);

/* The program as it was started (main's argv[0]) when that is a path ("/opt/x/tandem",
 * "./tandem"), else "tandem" (found on PATH): the first word of the commands the "to continue,
 * run:" hints print, so they run the same binary (a cluster node's configured `tandem:` path). */
extern const char *tdm_cli_program;

/* What a tandem command line lacks to continue the run it started: " --resume", or "" when it
 * has that flag already (the "to continue, run:" hints). */
const char *tdm_cli_resume_suffix(const char *cmdline);

/* Strict number parsing for flags: the whole string must be a number in range. */
bool tdm_cli_parse_double(const char *s, double *out);
bool tdm_cli_parse_long(const char *s, long *out);

/* Subcommands. */
int tdm_cmd_gpu(int argc, char **argv);
int tdm_cmd_gpu_status(int argc, char **argv);
int tdm_cmd_gpu_run(int argc, char **argv);
int tdm_cmd_tokenize(int argc, char **argv);
int tdm_cmd_inspect(int argc, char **argv);
int tdm_cmd_init_model(int argc, char **argv);
int tdm_cmd_cluster(int argc, char **argv);
int tdm_cmd_submit(int argc, char **argv);
int tdm_cmd_data(int argc, char **argv);
int tdm_cmd_finetune(int argc, char **argv);
/* finetune --gpus: the parent of one finetune per GPU (finetune_gpus.c). args[0..argc): the
 * command's arguments as given (args[0] "finetune"), cmdline: them as one line for hints. */
struct tdm_run_opts;
int tdm_cmd_finetune_gpus(struct tdm_run_opts *ro, int argc, char **args, const char *cmdline);
int tdm_cmd_eval(int argc, char **argv);
int tdm_cmd_generate(int argc, char **argv);
int tdm_cmd_report(int argc, char **argv);
int tdm_cmd_merge(int argc, char **argv);

#endif
