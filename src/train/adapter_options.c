/* adapter_options.c — the rows of every per-adapter setting (adapter_options.h). A newcomer
 * looking for what an adapter may set, in adapters.toml or as a flag, reads this table. */
#include "train/adapter_options.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "train/adapters_config.h"

static tdm_status parse_targets(const char *arg, void *dst, tdm_error *err)
{
    return tdm_adapter_targets_parse(arg, (uint32_t *)dst, err);
}

#define PATH_ROW(accepts, help)                                                                    \
    {                                                                                              \
        TDM_OPT_PATH, 0, 0, false, false, false, NULL, "", accepts, help                           \
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
};

#undef PATH_ROW

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
