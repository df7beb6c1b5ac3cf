/* adapter_options.h — the settings one adapter may have (rank, learning rate, data, output, ...),
 * declared once.
 *
 * One row of tdm_adapter_options[] per adapters.toml key: its name, the value's kind and range,
 * its default, what it accepts (for messages), its one-line help, whether a file-wide default
 * may set it, and an example line. train/adapters_config.c validates adapters.toml with these
 * rows (unknown-key suggestions and the "known:" lists included), and the per-adapter rows of
 * the command-line option table (run/run_options.c: --rank, --lr, ...) point at them for their
 * kind, range, default and help. So a flag and its adapters.toml key cannot drift apart, and
 * this layer does not depend on run/.
 */
#ifndef TANDEM_TRAIN_ADAPTER_OPTIONS_H
#define TANDEM_TRAIN_ADAPTER_OPTIONS_H
#include <stdbool.h>
#include <stddef.h>

#include "util/error.h"

/* What an option's value is. */
typedef enum tdm_option_kind {
    TDM_OPT_INT,   /* whole number in [min, max] */
    TDM_OPT_FLOAT, /* number in the range (open ends marked); the command line wants it finite */
    TDM_OPT_SIZE,  /* GiB (> 0) or "auto" (stored as 0) */
    TDM_OPT_ENUM,  /* one of a few words; an adapter row's parser sets its field of the
                      tdm_trainer_adapter given as destination */
    TDM_OPT_BOOL,  /* a flag without value: stores bool_value; as an adapters.toml key, true
                      or false: true does what the flag does, false the opposite */
    TDM_OPT_PATH,  /* a file or directory name */
    TDM_OPT_LABEL, /* an adapter's name: [A-Za-z0-9._-]{1,TDM_ADAPTER_LABEL_MAX} */
    TDM_OPT_LIST,  /* comma-separated names, or a repeatable flag */
} tdm_option_kind;

/* How a value is checked and described. */
typedef struct tdm_option_value {
    tdm_option_kind kind;
    double min, max; /* INT, FLOAT: inclusive range unless min_open/max_open */
    bool min_open, max_open;
    bool bool_value; /* BOOL: what the flag stores */
    /* ENUM, LIST and special values: parses arg into the destination (NULL: generic) */
    tdm_status (*parse)(const char *arg, void *dst, tdm_error *err);
    const char *default_text; /* "" when none */
    const char *accepts;      /* for messages: "--rank needs <accepts>, not 'x'" */
    const char *help;         /* one line for --help and the docs */
} tdm_option_value;

/* The keys of an [[adapter]] table, in the order of the rows. */
typedef enum tdm_adapter_key {
    TDM_ADAPTER_KEY_DATA,
    TDM_ADAPTER_KEY_OUTPUT,
    TDM_ADAPTER_KEY_LABEL,
    TDM_ADAPTER_KEY_RANK,
    TDM_ADAPTER_KEY_ALPHA,
    TDM_ADAPTER_KEY_TARGETS,
    TDM_ADAPTER_KEY_LEARNING_RATE,
    TDM_ADAPTER_KEY_EPOCHS,
    TDM_ADAPTER_KEY_BATCH_SIZE,
    TDM_ADAPTER_KEY_MAX_SEQ_LEN,
    TDM_ADAPTER_KEY_INIT_ADAPTER,
    TDM_ADAPTER_KEY_WEIGHT,
    TDM_ADAPTER_KEY_LORA_DROPOUT,
    /* training options (tdm_trainer_adapter holds them per adapter) */
    TDM_ADAPTER_KEY_SEED,
    TDM_ADAPTER_KEY_GRAD_ACCUM,
    TDM_ADAPTER_KEY_LR_SCHEDULE,
    TDM_ADAPTER_KEY_WARMUP_STEPS,
    TDM_ADAPTER_KEY_WEIGHT_DECAY,
    TDM_ADAPTER_KEY_MAX_GRAD_NORM,
    TDM_ADAPTER_KEY_VAL_SPLIT,
    TDM_ADAPTER_KEY_EVAL_EVERY,
    TDM_ADAPTER_KEY_SAVE_EVERY,
    TDM_ADAPTER_KEY_SAVE_TOTAL_LIMIT,
    TDM_ADAPTER_KEY_LOG_EVERY,
    /* how its data is read (words and booleans) */
    TDM_ADAPTER_KEY_TASK,
    TDM_ADAPTER_KEY_CHAT_TEMPLATE,
    TDM_ADAPTER_KEY_TRAIN_ON_PROMPT,
    TDM_ADAPTER_KEY_SKIP_BAD_LINES,
    TDM_ADAPTER_KEY_NO_SHUFFLE,
    TDM_ADAPTER_KEY_COUNT
} tdm_adapter_key;

/* Validated ranges (inclusive), of the file and the command line alike. */
#define TDM_ADAPTER_RANK_MAX 4096
#define TDM_ADAPTER_EPOCHS_MAX 100000
#define TDM_ADAPTER_BATCH_SIZE_MAX 65536
#define TDM_ADAPTER_MAX_SEQ_LEN_MAX 1048576
#define TDM_ADAPTER_LABEL_MAX 64
#define TDM_ADAPTER_GRAD_ACCUM_MAX 64
#define TDM_ADAPTER_STEPS_MAX 1099511627776.0 /* 2^40: "no upper bound" for step counts */
#define TDM_ADAPTER_SAVE_TOTAL_LIMIT_MAX 1000000

typedef struct tdm_adapter_option {
    const char *key; /* as written in adapters.toml */
    tdm_option_value value;
    bool defaultable;       /* may appear at the top level of the file or in [defaults] */
    const char *example;    /* a line of adapters.toml setting it, for "add a line such as" */
    const char *range_hint; /* appended to the file's out-of-range message, or NULL */
} tdm_adapter_option;

/* The rows, indexed by tdm_adapter_key. */
extern const tdm_adapter_option tdm_adapter_options[TDM_ADAPTER_KEY_COUNT];

/* "data", "output", ... as written in the file; NULL when key is out of range. */
const char *tdm_adapter_key_name(tdm_adapter_key key);

/* The key named name, or -1. */
int tdm_adapter_key_find(const char *name);

/* Fills names[] with the key names (all of them, or only the defaultable ones), in row order;
 * returns how many (at most TDM_ADAPTER_KEY_COUNT). */
size_t tdm_adapter_key_names(const char **names, bool defaultable_only);

#endif
