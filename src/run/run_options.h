/* run_options.h — every option of `tandem finetune` and `tandem eval`, declared once.
 *
 * One row of tdm_run_option_table() per option: its flag, kind, destination (a field of
 * tdm_run_opts, by offsetof), range, default, one-line help, the adapters.toml key that may set it
 * per adapter, and whether `tandem submit` passes it on to the nodes. From this table come the
 * getopt_long table and the usage text of both commands, submit's pass-through list, the
 * defaults (tdm_run_opts_default, which `tandem data check` shares) and `finetune
 * --list-options`, which the test docs_options.sh compares with docs/finetune.md and
 * docs/adapters-toml.md. A newcomer looking for an option reads src/run/run_options.c.
 */
#ifndef TANDEM_RUN_RUN_OPTIONS_H
#define TANDEM_RUN_RUN_OPTIONS_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "run/device_open.h"
#include "train/adapters_config.h"
#include "train/trainer.h"
#include "util/error.h"

/* What `tandem finetune` or `tandem eval` was asked to do, once parsed. */
typedef struct tdm_run_opts {
    tdm_trainer_opts trainer;    /* run-wide training options */
    tdm_trainer_adapter adapter; /* every adapter's settings (training options included)
                                    unless adapters.toml sets them */
    tdm_device_request device;   /* --device, --vram, waiting, MPS */
    const char **adapter_args;   /* (n_adapter_args) --adapter DATA:OUT as given (argv strings) */
    size_t n_adapter_args;
    const char *adapters_config; /* --adapters-config FILE or NULL */
    bool profile_ops;            /* --profile-ops */
    bool join_require;           /* --join require: fail when no host is found */
    bool no_join;                /* --no-join: neither join a host nor serve as one */
    bool list_options;           /* --list-options (hidden): print the table, for the docs test */
    bool help;
    /* eval only */
    const char *eval_data;    /* --data FILE */
    const char *eval_adapter; /* --adapter DIR (a PEFT adapter) or NULL */
    int eval_batch_size;      /* sequences per forward pass */
    bool json;
} tdm_run_opts;

typedef enum tdm_run_option_kind {
    TDM_OPT_INT,   /* whole number in [min, max] */
    TDM_OPT_FLOAT, /* finite number in the range (open ends marked) */
    TDM_OPT_SIZE,  /* GiB (> 0) or "auto" (stored as 0) */
    TDM_OPT_ENUM,  /* one of a few words */
    TDM_OPT_BOOL,  /* a flag without value: stores bool_value */
    TDM_OPT_PATH,  /* a file or directory name */
    TDM_OPT_LIST,  /* comma-separated names, or a repeatable flag */
} tdm_run_option_kind;

/* Commands a row applies to. */
enum { TDM_CMD_FINETUNE = 1u << 0, TDM_CMD_EVAL = 1u << 1 };

/* adapters.toml keys that exist only in the file (no flag) use flag == NULL. */
typedef struct tdm_run_option {
    const char *flag;    /* without "--"; NULL for an adapters.toml-only key */
    const char *metavar; /* "N", "X", ...; NULL for a flag without value */
    tdm_run_option_kind kind;
    unsigned commands; /* TDM_CMD_* */
    size_t offset;     /* destination: offsetof(tdm_run_opts, ...) */
    size_t size;       /* sizeof the destination (int, int64_t, double, bool, pointer) */
    double min, max;   /* INT, FLOAT: inclusive range unless min_open/max_open */
    bool min_open, max_open;
    bool bool_value; /* BOOL: what the flag stores */
    /* ENUM, LIST and special values: parses arg into the destination (NULL: generic) */
    tdm_status (*parse)(const char *arg, void *dst, tdm_error *err);
    const char *default_text; /* "" when none; parsed into the destination by the defaults */
    const char *accepts;      /* for messages: "--rank needs <accepts>, not 'x'" */
    const char *help;         /* one line for --help */
    int toml_key;             /* tdm_adapter_key adapters.toml may set per adapter, or -1 */
    bool submit_passes;       /* `tandem submit` passes the flag on to every node */
} tdm_run_option;

/* The table (n rows). */
const tdm_run_option *tdm_run_option_table(size_t *n);

/* The row of a flag for a command, or NULL. */
const tdm_run_option *tdm_run_option_find(const char *flag, unsigned command);

/* The defaults of the command (each row's default_text, over tdm_trainer_opts_default). */
void tdm_run_opts_default(tdm_run_opts *o, unsigned command);

/* Parses argv[1..argc) of `tandem finetune` or `tandem eval` (argv[0] is the command name).
 * Options are checked against their row (kind, range); positional arguments are returned in
 * order in *positional (malloc'd, n in *n_positional, the caller frees it and o->adapter_args).
 * Errors are TDM_ERR_INVALID with "--flag needs ..., not 'x'" or "unknown option"; a
 * close misspelling gets a "did you mean". */
tdm_status tdm_run_opts_parse(tdm_run_opts *o, unsigned command, int argc, char **argv,
                              char ***positional, int *n_positional, tdm_error *err);

/* Parses one option's value into o (used by parse, and by submit for the flags it reads). */
tdm_status tdm_run_option_set(tdm_run_opts *o, const tdm_run_option *row, const char *arg,
                              tdm_error *err);

/* The options part of the usage text: "[--flag METAVAR]" lines wrapped at 96 columns, then one
 * help line per option. */
void tdm_run_options_usage(FILE *out, unsigned command);

/* One line per row: "flag<TAB>toml_key<TAB>submit" ("-" when none), for the docs test. */
void tdm_run_options_list(FILE *out, unsigned command);

#endif
