/* adapters_config.h — `tandem finetune --adapters-config adapters.toml`: the adapters to train
 * in one run, read into tdm_adapter_spec structs. The format is documented in
 * docs/adapters-toml.md; in short:
 *
 *     rank = 16                  # optional defaults for every adapter (or in a [defaults] table)
 *     [[adapter]]
 *     data = "data/support.jsonl"   # required
 *     output = "out/support"        # required
 *     label = "support"
 *     targets = ["q_proj", "v_proj"]   # or "q_proj,v_proj"
 *     learning_rate = 2e-4
 *     lora_dropout = 0.05
 *
 * Precedence, most specific first: a key in the [[adapter]] table, a default in the file, then
 * the command line / built-in defaults, which the caller applies to the fields left unset here.
 * The keys, their kinds, ranges and help are the rows of train/adapter_options.h.
 * Paths are kept exactly as written; the caller resolves relative ones (against the directory of
 * the file or the working directory, its choice). Every error names FILE:LINE:COL and what to do.
 */
#ifndef TANDEM_TRAIN_ADAPTERS_CONFIG_H
#define TANDEM_TRAIN_ADAPTERS_CONFIG_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/lora_targets.h"
#include "tokenizer/chat_template.h"
#include "train/adapter_options.h"
#include "train/lr_schedule.h"
#include "util/error.h"

/* The projection matrices a LoRA adapter can attach to, as a bit set: bit t is target t of
 * model/lora_targets.h (names: tdm_lora_target_name). */
typedef enum tdm_adapter_target {
    TDM_ADAPTER_TARGET_Q_PROJ = TDM_LORA_BIT(TDM_LORA_Q),
    TDM_ADAPTER_TARGET_K_PROJ = TDM_LORA_BIT(TDM_LORA_K),
    TDM_ADAPTER_TARGET_V_PROJ = TDM_LORA_BIT(TDM_LORA_V),
    TDM_ADAPTER_TARGET_O_PROJ = TDM_LORA_BIT(TDM_LORA_O),
    TDM_ADAPTER_TARGET_GATE_PROJ = TDM_LORA_BIT(TDM_LORA_GATE),
    TDM_ADAPTER_TARGET_UP_PROJ = TDM_LORA_BIT(TDM_LORA_UP),
    TDM_ADAPTER_TARGET_DOWN_PROJ = TDM_LORA_BIT(TDM_LORA_DOWN),
} tdm_adapter_target;
#define TDM_ADAPTER_TARGET_COUNT TDM_LORA_N_TARGETS
#define TDM_ADAPTER_TARGET_ALL TDM_LORA_ALL

/* Parses a comma-separated list such as "q_proj, v_proj" (spaces around names are ignored) into
 * a bit set. Unknown names (with a suggestion), duplicates and empty lists are TDM_ERR_INVALID;
 * the message has no location, so the caller prefixes one ("--targets: ..."). */
tdm_status tdm_adapter_targets_parse(const char *list, uint32_t *mask, tdm_error *err);

/* One adapter to train. Strings are owned by the spec (freed by tdm_adapters_config_free).
 * A has_* flag that is false means "not set in the file": the caller applies its default. */
typedef struct tdm_adapter_spec {
    char *data;         /* training data (JSONL), path as written; always set */
    char *output;       /* output directory, path as written; always set */
    char *label;        /* [A-Za-z0-9._-]{1,64}; NULL when unset */
    char *init_adapter; /* adapter directory to start from, as written; NULL when unset */

    bool has_rank;
    int rank; /* LoRA rank r, 1..TDM_ADAPTER_RANK_MAX */
    bool has_alpha;
    double alpha; /* LoRA scale numerator (scale = alpha / rank), finite, > 0 */
    bool has_targets;
    uint32_t targets; /* bit set of tdm_adapter_target, never 0 when set */
    bool has_learning_rate;
    double learning_rate; /* peak AdamW step size, 0 < lr <= 1 */
    bool has_epochs;
    int epochs; /* passes over the data, 1..TDM_ADAPTER_EPOCHS_MAX */
    bool has_batch_size;
    int batch_size; /* sequences per optimizer micro-batch, 1..TDM_ADAPTER_BATCH_SIZE_MAX */
    bool has_max_seq_len;
    int max_seq_len; /* tokens per sequence, 1..TDM_ADAPTER_MAX_SEQ_LEN_MAX */
    bool has_weight;
    double weight; /* relative share of training steps/loss, finite, > 0 */
    bool has_lora_dropout;
    double lora_dropout; /* LoRA dropout probability, 0 <= p < 1 */
    /* training options (tdm_trainer_adapter's; ranges as their flags) */
    bool has_seed;
    uint64_t seed; /* 0..2^63-1 (TOML integers) */
    bool has_grad_accum;
    int grad_accum; /* 1..TDM_ADAPTER_GRAD_ACCUM_MAX */
    bool has_lr_schedule;
    tdm_lr_kind lr_schedule;
    bool has_warmup_steps;
    int64_t warmup_steps; /* >= 0 */
    bool has_weight_decay;
    double weight_decay; /* >= 0 */
    bool has_max_grad_norm;
    double max_grad_norm; /* >= 0, 0 = off */
    bool has_val_split;
    double val_split; /* [0, 1) */
    bool has_eval_every;
    int64_t eval_every; /* >= 0 */
    bool has_save_every;
    int64_t save_every; /* >= 0 */
    bool has_save_total_limit;
    int save_total_limit; /* 0..TDM_ADAPTER_SAVE_TOTAL_LIMIT_MAX */
    bool has_log_every;
    int64_t log_every; /* >= 1 */
    /* how its data is read (tdm_trainer_adapter's task, chat_template, ...) */
    bool has_task;
    const char *task; /* "instruct" (a static string, not owned) */
    bool has_chat_template;
    tdm_chat_template chat_template; /* named: detection off */
    bool has_train_on_prompt;
    bool train_on_prompt;
    bool has_skip_bad_lines;
    bool skip_bad_lines;
    bool has_no_shuffle;
    bool no_shuffle; /* as written: true = file order every epoch (the trainer's shuffle off) */

    uint32_t line; /* line of this adapter's [[adapter]] header */
    /* Line of the value behind each key (0 when unset); for a value inherited from the file's
     * defaults, the default's line. Lets later checks say "adapters.toml:LINE: ...". */
    uint32_t key_line[TDM_ADAPTER_KEY_COUNT];
} tdm_adapter_spec;

typedef struct tdm_adapters_config {
    char *file;                 /* the file name given to parse/load (owned), for messages */
    tdm_adapter_spec *adapters; /* (n_adapters) in file order; at least one */
    size_t n_adapters;
} tdm_adapters_config;

/* Parses an adapters.toml held in text[0..len). filename is used in messages. On success *out
 * owns everything; on failure *out is zeroed and err says FILE:LINE[:COL] what is wrong and how
 * to fix it (TDM_ERR_PARSE for syntax, TDM_ERR_INVALID for meaning, TDM_ERR_NOMEM). Checks: the
 * TOML subset (util/toml.h), known keys only (unknown ones get a "did you mean"), types and
 * ranges, at least one [[adapter]], data and output in each, no two adapters writing the same
 * output directory (compared after removing "." components, doubled and trailing slashes;
 * ".." and symbolic links are not resolved), no two adapters with the same label. */
tdm_status tdm_adapters_config_parse(const char *text, size_t len, const char *filename,
                                     tdm_adapters_config *out, tdm_error *err);

/* Reads path and parses it (messages name path), then also refuses two outputs that lead to one
 * directory on the file system (util/path_identity.h: "..", symbolic links, an existing
 * directory's device and inode), relative outputs taken from path's directory. */
tdm_status tdm_adapters_config_load(const char *path, tdm_adapters_config *out, tdm_error *err);

/* Frees what parse/load filled in and zeroes *cfg. A zeroed config is allowed. */
void tdm_adapters_config_free(tdm_adapters_config *cfg);

#endif
