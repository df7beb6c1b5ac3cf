/* adapter_options.c — the rows of every per-adapter setting (adapter_options.h). A newcomer
 * looking for what an adapter may set, in adapters.toml or as a flag, reads this table. */
#include "train/adapter_options.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "train/adapters_config.h"
#include "train/lr_schedule.h"
#include "train/trainer.h"

static tdm_status parse_targets(const char *arg, void *dst, tdm_error *err)
{
    return tdm_adapter_targets_parse(arg, (uint32_t *)dst, err);
}

/* a uint64 (the flag); adapters.toml's integers stop at 2^63 - 1 */
static tdm_status parse_seed(const char *arg, void *dst, tdm_error *err)
{
    char *end;
    errno = 0;
    unsigned long long s = strtoull(arg, &end, 10);
    if (errno || !*arg || *end || *arg == '-')
        return tdm_fail(err, TDM_ERR_INVALID, "needs a non-negative integer, not '%s'", arg);
    *(uint64_t *)dst = s;
    return TDM_OK;
}

/* The words: dst is the whole tdm_trainer_adapter, each parser sets its own field(s). */
static tdm_status parse_lr_schedule(const char *arg, void *dst, tdm_error *err)
{
    return tdm_lr_kind_parse(arg, &((tdm_trainer_adapter *)dst)->lr_kind, err);
}

static tdm_status parse_task(const char *arg, void *dst, tdm_error *err)
{
    if (strcmp(arg, "instruct"))
        return tdm_fail(err, TDM_ERR_INVALID, "unknown task '%.64s' (use instruct, the only one)",
                        arg);
    ((tdm_trainer_adapter *)dst)->task = "instruct"; /* static: outlives a TOML document */
    return TDM_OK;
}

/* a named template (else the default: detected from the base model's tokenizer) */
static tdm_status parse_chat_template(const char *arg, void *dst, tdm_error *err)
{
    tdm_trainer_adapter *t = dst;
    TDM_TRY(tdm_chat_template_parse(arg, &t->chat_template, err));
    t->chat_template_given = true;
    return TDM_OK;
}

#define PATH_ROW(accepts, help)                                                                    \
    {                                                                                              \
        TDM_OPT_PATH, 0, 0, false, false, false, NULL, "", accepts, help                           \
    }
/* a flag that stores flag_value; the key: true or false */
#define BOOL_ROW(flag_value, help)                                                                 \
    {                                                                                              \
        TDM_OPT_BOOL, 0, 0, false, false, flag_value, NULL, "", "true or false", help              \
    }

/* Columns: key, {kind, min, max, min_open, max_open, bool_value, parse, default, accepts, help},
 * defaultable, example, range hint. */
const tdm_adapter_option tdm_adapter_options[TDM_ADAPTER_KEY_COUNT] = {
    [TDM_ADAPTER_KEY_DATA] = {"data", PATH_ROW("a path", "training data (JSONL)"), false,
                              "data = \"data/train.jsonl\"", NULL},
    [TDM_ADAPTER_KEY_OUTPUT] = {"output", PATH_ROW("a path", "output directory"), false,
                                "output = \"out/my-adapter\"", NULL},
    [TDM_ADAPTER_KEY_LABEL] = {"label",
                               {TDM_OPT_LABEL, 0, 0, false, false, false, NULL, "", "a label",
                                "name in logs and status"},
                               false,
                               "label = \"support-bot\"",
                               NULL},
    [TDM_ADAPTER_KEY_RANK] = {"rank",
                              {TDM_OPT_INT, 1, TDM_ADAPTER_RANK_MAX, false, false, false, NULL,
                               "16", "an integer 1..4096", "LoRA rank r"},
                              true,
                              "rank = 16",
                              NULL},
    [TDM_ADAPTER_KEY_ALPHA] = {"alpha",
                               {TDM_OPT_FLOAT, 0, INFINITY, true, false, false, NULL, "32",
                                "a positive number", "LoRA scale numerator (scale = alpha / r)"},
                               true,
                               "alpha = 32",
                               NULL},
    [TDM_ADAPTER_KEY_TARGETS] = {"targets",
                                 {TDM_OPT_LIST, 0, 0, false, false, false, parse_targets,
                                  "q_proj,v_proj", "a list",
                                  "projections to adapt: q,k,v,o,gate,up,down _proj"},
                                 true,
                                 "targets = [\"q_proj\", \"v_proj\"]",
                                 NULL},
    [TDM_ADAPTER_KEY_LEARNING_RATE] = {"learning_rate",
                                       {TDM_OPT_FLOAT, 0, 1, true, false, false, NULL, "2e-4",
                                        "a number in (0, 1]", "peak learning rate (AdamW)"},
                                       true,
                                       "learning_rate = 2e-4",
                                       "typical LoRA rates are 1e-5 to 1e-3"},
    [TDM_ADAPTER_KEY_EPOCHS] = {"epochs",
                                {TDM_OPT_INT, 1, TDM_ADAPTER_EPOCHS_MAX, false, false, false, NULL,
                                 "3", "an integer 1..100000",
                                 "passes over the adapter's training split"},
                                true,
                                "epochs = 3",
                                NULL},
    [TDM_ADAPTER_KEY_BATCH_SIZE] = {"batch_size",
                                    {TDM_OPT_INT, 1, TDM_ADAPTER_BATCH_SIZE_MAX, false, false,
                                     false, NULL, "4", "an integer 1..65536",
                                     "sequences per adapter per micro-batch"},
                                    true,
                                    "batch_size = 8",
                                    NULL},
    [TDM_ADAPTER_KEY_MAX_SEQ_LEN] = {"max_seq_len",
                                     {TDM_OPT_INT, 2, TDM_ADAPTER_MAX_SEQ_LEN_MAX, false, false,
                                      false, NULL, "512", "an integer 2..1048576",
                                      "longer samples keep their first N tokens"},
                                     true,
                                     "max_seq_len = 1024",
                                     NULL},
    [TDM_ADAPTER_KEY_INIT_ADAPTER] = {"init_adapter",
                                      PATH_ROW("a directory", "start from a PEFT adapter (its "
                                                              "rank, alpha, targets apply)"),
                                      false, "init_adapter = \"out/previous\"", NULL},
    [TDM_ADAPTER_KEY_WEIGHT] = {"weight",
                                {TDM_OPT_FLOAT, 0, INFINITY, true, false, false, NULL, "1",
                                 "a positive number",
                                 "share of each fused pass (synchronized schedule)"},
                                true,
                                "weight = 1.0",
                                NULL},
    [TDM_ADAPTER_KEY_LORA_DROPOUT] = {"lora_dropout",
                                      {TDM_OPT_FLOAT, 0, 1, false, true, false, NULL, "0",
                                       "a probability in [0, 1)",
                                       "LoRA dropout on each targeted module's input (training "
                                       "only)"},
                                      true,
                                      "lora_dropout = 0.05",
                                      NULL},
    [TDM_ADAPTER_KEY_SEED] = {"seed",
                              {TDM_OPT_INT, 0, INFINITY, false, false, false, parse_seed, "42",
                               "a non-negative integer",
                               "LoRA init, shuffling and the train/validation split"},
                              true,
                              "seed = 42",
                              NULL},
    [TDM_ADAPTER_KEY_GRAD_ACCUM] = {"grad_accum",
                                    {TDM_OPT_INT, 1, TDM_ADAPTER_GRAD_ACCUM_MAX, false, false,
                                     false, NULL, "1", "an integer 1..64",
                                     "micro-batches per optimizer step"},
                                    true,
                                    "grad_accum = 2",
                                    NULL},
    [TDM_ADAPTER_KEY_LR_SCHEDULE] = {"lr_schedule",
                                     {TDM_OPT_ENUM, 0, 0, false, false, false, parse_lr_schedule,
                                      "cosine", "cosine, linear or constant",
                                      "learning-rate schedule"},
                                     true,
                                     "lr_schedule = \"linear\"",
                                     NULL},
    [TDM_ADAPTER_KEY_WARMUP_STEPS] = {"warmup_steps",
                                      {TDM_OPT_INT, 0, TDM_ADAPTER_STEPS_MAX, false, false, false,
                                       NULL, "0", "an integer >= 0",
                                       "linear warmup over the adapter's first N steps"},
                                      true,
                                      "warmup_steps = 10",
                                      NULL},
    [TDM_ADAPTER_KEY_WEIGHT_DECAY] = {"weight_decay",
                                      {TDM_OPT_FLOAT, 0, INFINITY, false, false, false, NULL, "0",
                                       "a number >= 0", "decoupled weight decay"},
                                      true,
                                      "weight_decay = 0.01",
                                      NULL},
    [TDM_ADAPTER_KEY_MAX_GRAD_NORM] = {"max_grad_norm",
                                       {TDM_OPT_FLOAT, 0, INFINITY, false, false, false, NULL, "1",
                                        "a number >= 0 (0 = off)",
                                        "per-adapter gradient clipping; 0 = off"},
                                       true,
                                       "max_grad_norm = 1.0",
                                       NULL},
    [TDM_ADAPTER_KEY_VAL_SPLIT] = {"val_split",
                                   {TDM_OPT_FLOAT, 0, 1, false, true, false, NULL, "0.05",
                                    "a fraction in [0, 1)", "fraction held out for validation"},
                                   true,
                                   "val_split = 0.1",
                                   NULL},
    [TDM_ADAPTER_KEY_EVAL_EVERY] = {"eval_every",
                                    {TDM_OPT_INT, 0, TDM_ADAPTER_STEPS_MAX, false, false, false,
                                     NULL, "0", "an integer >= 0",
                                     "validate every N global steps (0: at the end)"},
                                    true,
                                    "eval_every = 100",
                                    NULL},
    [TDM_ADAPTER_KEY_SAVE_EVERY] = {"save_every",
                                    {TDM_OPT_INT, 0, TDM_ADAPTER_STEPS_MAX, false, false, false,
                                     NULL, "500", "an integer >= 0",
                                     "checkpoint every N global steps (0: at the end)"},
                                    true,
                                    "save_every = 500",
                                    NULL},
    [TDM_ADAPTER_KEY_SAVE_TOTAL_LIMIT] = {"save_total_limit",
                                          {TDM_OPT_INT, 0, TDM_ADAPTER_SAVE_TOTAL_LIMIT_MAX, false,
                                           false, false, NULL, "0", "an integer >= 0",
                                           "keep the adapter's last N checkpoints, plus best/ (0: "
                                           "all)"},
                                          true,
                                          "save_total_limit = 3",
                                          NULL},
    [TDM_ADAPTER_KEY_LOG_EVERY] = {"log_every",
                                   {TDM_OPT_INT, 1, TDM_ADAPTER_STEPS_MAX, false, false, false,
                                    NULL, "10", "an integer >= 1",
                                    "one log line per adapter per N global steps"},
                                   true,
                                   "log_every = 10",
                                   NULL},
    [TDM_ADAPTER_KEY_TASK] = {"task",
                              {TDM_OPT_ENUM, 0, 0, false, false, false, parse_task, "instruct",
                               "instruct", "the only task today"},
                              true,
                              "task = \"instruct\"",
                              NULL},
    [TDM_ADAPTER_KEY_CHAT_TEMPLATE] = {"chat_template",
                                       {TDM_OPT_ENUM, 0, 0, false, false, false,
                                        parse_chat_template, "", "chatml, llama3 or none",
                                        "chat template (default: detected)"},
                                       true,
                                       "chat_template = \"chatml\"",
                                       NULL},
    [TDM_ADAPTER_KEY_TRAIN_ON_PROMPT] = {"train_on_prompt",
                                         BOOL_ROW(true,
                                                  "count the prompt's tokens in the loss too"),
                                         true, "train_on_prompt = true", NULL},
    [TDM_ADAPTER_KEY_SKIP_BAD_LINES] = {"skip_bad_lines",
                                        BOOL_ROW(true, "train on the good lines of a file with "
                                                       "bad ones"),
                                        true, "skip_bad_lines = true", NULL},
    [TDM_ADAPTER_KEY_NO_SHUFFLE] = {"no_shuffle", BOOL_ROW(false, "file order every epoch"), true,
                                    "no_shuffle = true", NULL},
};

#undef PATH_ROW
#undef BOOL_ROW

const char *tdm_adapter_key_name(tdm_adapter_key key)
{
    return (unsigned)key < TDM_ADAPTER_KEY_COUNT ? tdm_adapter_options[key].key : NULL;
}

int tdm_adapter_key_find(const char *name)
{
    for (int k = 0; k < TDM_ADAPTER_KEY_COUNT; k++)
        if (!strcmp(tdm_adapter_options[k].key, name)) return k;
    return -1;
}

size_t tdm_adapter_key_names(const char **names, bool defaultable_only)
{
    size_t n = 0;
    for (int k = 0; k < TDM_ADAPTER_KEY_COUNT; k++)
        if (!defaultable_only || tdm_adapter_options[k].defaultable)
            names[n++] = tdm_adapter_options[k].key;
    return n;
}
