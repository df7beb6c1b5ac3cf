/* run_options.h — every option of `tandem finetune` and `tandem eval`, declared once.
 *
 * One row of tdm_run_option_table() per option: its flag, destination (a field of tdm_run_opts,
 * by offsetof), kind, range, default, one-line help, and whether `tandem submit` passes it on to
 * the nodes. The rows of per-adapter settings (those adapters.toml may set per adapter) take
 * kind, range, default and help from train/adapter_options.h, the table adapters.toml is checked
 * with, so the flag and the key cannot disagree. From this table come the
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
#include "train/adapter_options.h"
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
    int cotrain_takeovers;       /* no flag: host deaths this run survived (co-training) */
    int cotrain_rejoins;         /* no flag: hosts found at device open that ended unjoined */
    const char *gpus;            /* --gpus all|N|UUID,UUID: one process per GPU, or NULL */
    const char *adapter_subset;  /* --adapter-subset I,J (hidden): a --gpus parent's child
                                    trains only these adapters (0-based) */
    bool list_options;           /* --list-options (hidden): print the table, for the docs test */
    bool help;
    /* eval only */
    const char *eval_data;    /* --data FILE */
    const char *eval_adapter; /* --adapter DIR (a PEFT adapter) or NULL */
    int eval_batch_size;      /* sequences per forward pass */
    bool json;
} tdm_run_opts;

/* Commands a row applies to. */
enum { TDM_CMD_FINETUNE = 1u << 0, TDM_CMD_EVAL = 1u << 1 };

/* One option. A per-adapter setting (one adapters.toml may set per adapter: --rank, --lr, and
 * data, output, label, weight, which have no flag) points at its row of
 * train/adapter_options.c for kind, range, default, accepts and help; its own value is unused.
 * Read both through tdm_run_option_value. */
typedef struct tdm_run_option {
    const char *flag;       /* without "--"; NULL for an adapters.toml-only key */
    const char *metavar;    /* "N", "X", ...; NULL for a flag without value */
    unsigned commands;      /* TDM_CMD_* */
    size_t offset;          /* destination: offsetof(tdm_run_opts, ...) */
    size_t size;            /* sizeof the destination (int, int64_t, double, bool, pointer) */
    tdm_option_value value; /* kind, range, parser, default, accepts, help */
    const tdm_adapter_option *adapter; /* a per-adapter setting's row, or NULL */
    bool submit_passes;                /* `tandem submit` passes the flag on to every node */
} tdm_run_option;

/* The value description of a row: its adapter row's when it has one, else its own. */
const tdm_option_value *tdm_run_option_value(const tdm_run_option *r);

/* The tdm_adapter_key of a per-adapter row, or -1. */
int tdm_run_option_key(const tdm_run_option *r);

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
 * help line per option. named (NULL-terminated, may be NULL): flags the caller's usage line
 * already shows (eval's "--data FILE"), left out of the bracketed list, still given a help line. */
void tdm_run_options_usage(FILE *out, unsigned command, const char *const *named);

/* One line per row: "flag<TAB>toml_key<TAB>submit" ("-" when none), for the docs test. */
void tdm_run_options_list(FILE *out, unsigned command);

#endif
