/* Unit tests of src/train/adapters_config: every key, defaults and precedence, and each error
 * message with its FILE:LINE[:COL]. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/adapters_config.h"
#include "util/suggest.h"

static void parse_ok(const char *text, tdm_adapters_config *cfg)
{
    tdm_error err = {0};
    if (tdm_adapters_config_parse(text, strlen(text), "adapters.toml", cfg, &err) != TDM_OK)
        fail_msg("expected success, got: %s", err.message);
}

static void test_full_example(void **state)
{
    tdm_adapters_config cfg;
    parse_ok("# two adapters on one base model\n"
             "rank = 16\n"
             "learning_rate = 1e-4\n"
             "\n"
             "[[adapter]]\n"
             "label = \"support\"\n"
             "data = \"data/support.jsonl\"\n"
             "output = \"out/support\"\n"
             "rank = 8\n"
             "alpha = 16\n"
             "targets = [\"q_proj\", \"v_proj\", \"down_proj\"]\n"
             "learning_rate = 2e-4\n"
             "epochs = 3\n"
             "batch_size = 4\n"
             "max_seq_len = 1024\n"
             "init_adapter = '../prev/support'\n"
             "weight = 2\n"
             "lora_dropout = 0.05\n"
             "\n"
             "[[adapter]]\n"
             "data = 'data/sql.jsonl'\n"
             "output = 'out/sql'\n"
             "alpha = 32.5\n"
             "targets = \"q_proj, k_proj,v_proj ,o_proj\"\n",
             &cfg);
    assert_string_equal(cfg.file, "adapters.toml");
    assert_int_equal(cfg.n_adapters, 2);
    const tdm_adapter_spec *a = &cfg.adapters[0], *b = &cfg.adapters[1];
    assert_string_equal(a->label, "support");
    assert_string_equal(a->data, "data/support.jsonl");
    assert_string_equal(a->output, "out/support");
    assert_string_equal(a->init_adapter, "../prev/support"); /* kept as written */
    assert_true(a->has_rank && a->rank == 8);                /* adapter beats the default */
    assert_true(a->has_alpha && a->alpha == 16.0);           /* integer accepted for alpha */
    assert_true(a->has_targets);
    assert_int_equal(a->targets, TDM_ADAPTER_TARGET_Q_PROJ | TDM_ADAPTER_TARGET_V_PROJ |
                                     TDM_ADAPTER_TARGET_DOWN_PROJ);
    assert_true(a->has_learning_rate && a->learning_rate == 2e-4);
    assert_true(a->has_epochs && a->epochs == 3);
    assert_true(a->has_batch_size && a->batch_size == 4);
    assert_true(a->has_max_seq_len && a->max_seq_len == 1024);
    assert_true(a->has_weight && a->weight == 2.0);
    assert_true(a->has_lora_dropout && a->lora_dropout == 0.05);
    assert_int_equal(a->line, 5);
    assert_int_equal(a->key_line[TDM_ADAPTER_KEY_DATA], 7);
    assert_int_equal(a->key_line[TDM_ADAPTER_KEY_RANK], 9);

    assert_null(b->label);
    assert_null(b->init_adapter);
    assert_true(b->has_rank && b->rank == 16); /* from the top-level default */
    assert_int_equal(b->key_line[TDM_ADAPTER_KEY_RANK], 2);
    assert_true(b->has_learning_rate && b->learning_rate == 1e-4);
    assert_true(b->alpha == 32.5);
    assert_int_equal(b->targets, 0xF);
    /* Unset stays unset, for the command line's defaults. */
    assert_false(b->has_epochs);
    assert_false(b->has_batch_size);
    assert_false(b->has_max_seq_len);
    assert_false(b->has_weight);
    assert_false(b->has_lora_dropout);
    assert_int_equal(b->key_line[TDM_ADAPTER_KEY_EPOCHS], 0);
    assert_int_equal(b->line, 20);
    tdm_adapters_config_free(&cfg);
    assert_null(cfg.adapters);
    tdm_adapters_config_free(&cfg); /* a zeroed config is allowed */
}

/* The training options: per adapter, and as file-wide defaults. */
static void test_training_options(void **state)
{
    tdm_adapters_config cfg;
    parse_ok("grad_accum = 2\n"
             "lr_schedule = 'linear'\n"
             "[[adapter]]\n"
             "data = 'a.jsonl'\n"
             "output = 'a'\n"
             "seed = 9223372036854775807\n"
             "warmup_steps = 3\n"
             "weight_decay = 0.01\n"
             "max_grad_norm = 0\n"
             "val_split = 0.25\n"
             "eval_every = 4\n"
             "save_every = 0\n"
             "save_total_limit = 2\n"
             "log_every = 5\n"
             "[[adapter]]\n"
             "data = 'b.jsonl'\n"
             "output = 'b'\n"
             "grad_accum = 4\n"
             "lr_schedule = \"constant\"\n",
             &cfg);
    const tdm_adapter_spec *a = &cfg.adapters[0], *b = &cfg.adapters[1];
    assert_true(a->has_seed && a->seed == INT64_MAX);
    assert_true(a->has_grad_accum && a->grad_accum == 2); /* the default */
    assert_int_equal(a->key_line[TDM_ADAPTER_KEY_GRAD_ACCUM], 1);
    assert_true(a->has_lr_schedule && a->lr_schedule == TDM_LR_LINEAR);
    assert_true(a->has_warmup_steps && a->warmup_steps == 3);
    assert_true(a->has_weight_decay && a->weight_decay == 0.01);
    assert_true(a->has_max_grad_norm && a->max_grad_norm == 0);
    assert_true(a->has_val_split && a->val_split == 0.25);
    assert_true(a->has_eval_every && a->eval_every == 4);
    assert_true(a->has_save_every && a->save_every == 0);
    assert_true(a->has_save_total_limit && a->save_total_limit == 2);
    assert_true(a->has_log_every && a->log_every == 5);
    assert_true(b->grad_accum == 4 && b->lr_schedule == TDM_LR_CONSTANT); /* beat the defaults */
    assert_false(b->has_seed || b->has_save_every || b->has_save_total_limit);
    tdm_adapters_config_free(&cfg);
}

/* How an adapter's data is read: words and booleans, per adapter and as file-wide defaults. */
static void test_data_options(void **state)
{
    tdm_adapters_config cfg;
    parse_ok("train_on_prompt = true\n"
             "chat_template = 'none'\n"
             "[[adapter]]\n"
             "data = 'a.jsonl'\n"
             "output = 'a'\n"
             "task = \"instruct\"\n"
             "chat_template = 'llama3'\n"
             "skip_bad_lines = true\n"
             "no_shuffle = true\n"
             "[[adapter]]\n"
             "data = 'b.jsonl'\n"
             "output = 'b'\n"
             "train_on_prompt = false\n"
             "no_shuffle = false\n",
             &cfg);
    const tdm_adapter_spec *a = &cfg.adapters[0], *b = &cfg.adapters[1];
    assert_true(a->has_task && !strcmp(a->task, "instruct"));
    assert_int_equal(a->key_line[TDM_ADAPTER_KEY_TASK], 6);
    assert_true(a->has_chat_template && a->chat_template == TDM_CHAT_LLAMA3);
    assert_true(a->has_train_on_prompt && a->train_on_prompt); /* the default */
    assert_int_equal(a->key_line[TDM_ADAPTER_KEY_TRAIN_ON_PROMPT], 1);
    assert_true(a->has_skip_bad_lines && a->skip_bad_lines);
    assert_true(a->has_no_shuffle && a->no_shuffle);
    assert_false(b->has_task || b->has_skip_bad_lines);
    assert_true(b->has_chat_template && b->chat_template == TDM_CHAT_NONE); /* the default */
    assert_int_equal(b->key_line[TDM_ADAPTER_KEY_CHAT_TEMPLATE], 2);
    assert_true(b->has_train_on_prompt && !b->train_on_prompt); /* false beats the default */
    assert_int_equal(b->key_line[TDM_ADAPTER_KEY_TRAIN_ON_PROMPT], 13);
    assert_true(b->has_no_shuffle && !b->no_shuffle);
    tdm_adapters_config_free(&cfg);
}

static void test_defaults_table(void **state)
{
    tdm_adapters_config cfg;
    parse_ok("[defaults]\n"
             "epochs = 2\n"
             "targets = 'gate_proj,up_proj,down_proj'\n"
             "lora_dropout = 0.1\n"
             "[[adapter]]\n"
             "data = 'a.jsonl'\n"
             "output = 'a'\n"
             "[[adapter]]\n"
             "data = 'b.jsonl'\n"
             "output = 'b'\n"
             "epochs = 5\n"
             "lora_dropout = 0\n",
             &cfg);
    assert_int_equal(cfg.n_adapters, 2);
    assert_int_equal(cfg.adapters[0].epochs, 2);
    assert_int_equal(cfg.adapters[0].key_line[TDM_ADAPTER_KEY_EPOCHS], 2);
    assert_int_equal(cfg.adapters[1].epochs, 5);
    assert_true(cfg.adapters[0].has_lora_dropout && cfg.adapters[0].lora_dropout == 0.1);
    assert_int_equal(cfg.adapters[0].key_line[TDM_ADAPTER_KEY_LORA_DROPOUT], 4);
    assert_true(cfg.adapters[1].has_lora_dropout && cfg.adapters[1].lora_dropout == 0.0);
    assert_int_equal(cfg.adapters[1].targets, TDM_ADAPTER_TARGET_GATE_PROJ |
                                                  TDM_ADAPTER_TARGET_UP_PROJ |
                                                  TDM_ADAPTER_TARGET_DOWN_PROJ);
    tdm_adapters_config_free(&cfg);
}

static void test_targets_list(void **state)
{
    tdm_error err = {0};
    uint32_t m = 0;
    assert_int_equal(tdm_adapter_targets_parse("q_proj", &m, &err), TDM_OK);
    assert_int_equal(m, TDM_ADAPTER_TARGET_Q_PROJ);
    assert_int_equal(tdm_adapter_targets_parse(" o_proj ,\tk_proj", &m, &err), TDM_OK);
    assert_int_equal(m, TDM_ADAPTER_TARGET_O_PROJ | TDM_ADAPTER_TARGET_K_PROJ);
    m = 99;
    assert_int_equal(tdm_adapter_targets_parse("q_prj", &m, &err), TDM_ERR_INVALID);
    assert_int_equal(m, 99); /* untouched on failure */
    assert_non_null(strstr(err.message, "unknown target 'q_prj'; did you mean 'q_proj'?"));
    assert_int_equal(tdm_adapter_targets_parse("", &m, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.message, "the target list is empty"));
    assert_int_equal(tdm_adapter_targets_parse("q_proj,,v_proj", &m, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.message, "empty name"));
    assert_int_equal(tdm_adapter_targets_parse("q_proj,", &m, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_adapter_targets_parse("v_proj,v_proj", &m, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.message, "'v_proj' is listed twice"));
    for (unsigned i = 0; i < TDM_ADAPTER_TARGET_COUNT; i++)
        assert_non_null(tdm_lora_target_name(i));
    assert_null(tdm_lora_target_name(TDM_ADAPTER_TARGET_COUNT));
    assert_string_equal(tdm_adapter_key_name(TDM_ADAPTER_KEY_MAX_SEQ_LEN), "max_seq_len");
}

static void test_suggest(void **state)
{
    assert_int_equal(tdm_edit_distance("rnak", 4, "rank", 4), 1); /* a swap costs 1 */
    assert_int_equal(tdm_edit_distance("kitten", 6, "sitting", 7), 3);
    assert_int_equal(tdm_edit_distance("", 0, "abc", 3), 3);
    const char *c[] = {"rank", "alpha", "learning_rate"};
    assert_string_equal(tdm_suggest("learnig_rate", c, 3), "learning_rate");
    assert_string_equal(tdm_suggest("ranks", c, 3), "rank");
    assert_null(tdm_suggest("zzzz", c, 3));
    assert_null(tdm_suggest("r", c, 3));
}

typedef struct bad_case {
    const char *text;
    const char *where; /* "adapters.toml:LINE[:COL]: " prefix after the file name */
    const char *says;
} bad_case;

#define ADAPTER "[[adapter]]\ndata = 'd.jsonl'\noutput = 'o'\n"

static const bad_case bad_cases[] = {
    /* Syntax errors come through with the parser's location. */
    {ADAPTER "rank = 08\n", "4:8", "leading zeros"},
    {ADAPTER "a.b = 1\n", "4:2", "dotted keys"},
    /* Structure. */
    {"rank = 4\n", "", "no [[adapter]] tables"},
    {"", "", "no [[adapter]] tables"},
    {"[adapter]\ndata = 'x'\n", "1:1", "must be a list of [[adapter]] tables (double brackets)"},
    {"adapter = 1\n", "1:11", "must be a list of [[adapter]] tables"},
    {"[[adapters]]\n", "1:3", "unknown table 'adapters'; did you mean [[adapter]]?"},
    {"[defualts]\n", "1:2", "unknown table 'defualts'; did you mean [defaults]?"},
    {"[[defaults]]\n", "1:3", "defaults must be a single [defaults] table"},
    {"[[adapter]]\noutput = 'o'\n", "1", "[[adapter]] #1 has no data; add a line such as data = "},
    {ADAPTER "[[adapter]]\ndata = 'x'\n", "4", "[[adapter]] #2 has no output"},
    /* Unknown keys, with suggestions. */
    {ADAPTER "rnak = 4\n", "4:1", "unknown key 'rnak' in [[adapter]] #1; did you mean 'rank'?"},
    {ADAPTER "learnig_rate = 1e-4\n", "4:1", "did you mean 'learning_rate'?"},
    {ADAPTER "max_seq_length = 512\n", "4:1", "did you mean 'max_seq_len'?"},
    {ADAPTER "colour = 'red'\n", "4:1",
     "unknown key 'colour' in [[adapter]] #1 (known: data, output, label, rank, alpha, targets, "
     "learning_rate, epochs, batch_size, max_seq_len, init_adapter, weight, lora_dropout, seed, "
     "grad_accum, lr_schedule, warmup_steps, weight_decay, max_grad_norm, val_split, eval_every, "
     "save_every, save_total_limit, log_every, task, chat_template, train_on_prompt, "
     "skip_bad_lines, no_shuffle)"},
    {"epoch = 3\n" ADAPTER, "1:1",
     "unknown key 'epoch'; did you mean 'epochs'? (defaults may set: rank, alpha, targets, "
     "learning_rate, epochs, batch_size, max_seq_len, weight, lora_dropout, seed, grad_accum, "
     "lr_schedule, warmup_steps, weight_decay, max_grad_norm, val_split, eval_every, save_every, "
     "save_total_limit, log_every, task, chat_template, train_on_prompt, skip_bad_lines, "
     "no_shuffle)"},
    {"[defaults]\nbatchsize = 3\n" ADAPTER, "2:1", "did you mean 'batch_size'?"},
    {"data = 'x'\n" ADAPTER, "1:1", "data cannot be a default"},
    {"[defaults]\nlabel = 'x'\n" ADAPTER, "2:1", "label cannot be a default"},
    {"rank = 4\n[defaults]\nrank = 8\n" ADAPTER, "3:1", "default rank is already set at line 1"},
    /* Types and ranges. */
    {ADAPTER "rank = 0\n", "4:8", "rank must be a positive integer no larger than 4096 (got 0)"},
    /* training options */
    {ADAPTER "lr_schedule = 'cosin'\n", "4:15", "lr_schedule: "},
    {ADAPTER "lr_schedule = 1\n", "4:15", "lr_schedule"},
    {ADAPTER "seed = -1\n", "4:8", "seed must be an integer >= 0 (got -1)"},
    {ADAPTER "grad_accum = 65\n", "4:14",
     "grad_accum must be a positive integer no larger than 64"},
    {ADAPTER "val_split = 1\n", "4:13", "val_split must be a probability in [0, 1) (got 1)"},
    {ADAPTER "save_total_limit = -1\n", "4:20", "save_total_limit must be an integer 0..1000000"},
    {ADAPTER "log_every = 0\n", "4:13", "log_every must be an integer >= 1 (got 0)"},
    /* how the data is read: the accepted words, or true/false */
    {ADAPTER "task = 'chat'\n", "4:8", "task: unknown task 'chat' (use instruct, the only one)"},
    {ADAPTER "task = 1\n", "4:8", "task must be a string (in quotes), not an integer"},
    {ADAPTER "chat_template = 'chatm'\n", "4:17",
     "chat_template: unknown chat template 'chatm' (use chatml, llama3 or none)"},
    {ADAPTER "chat_template = ''\n", "4:17", "(use chatml, llama3 or none)"},
    {ADAPTER "chat_template = true\n", "4:17",
     "chat_template must be a string (in quotes), not "
     "a boolean"},
    {ADAPTER "train_on_prompt = 'yes'\n", "4:19",
     "train_on_prompt must be true or false, not a string"},
    {ADAPTER "skip_bad_lines = 1\n", "4:18",
     "skip_bad_lines must be true or false, not an "
     "integer"},
    {ADAPTER "no_shuffle = \"true\"\n", "4:14", "no_shuffle must be true or false, not a string"},
    {ADAPTER "shuffle = false\n", "4:1",
     "unknown key 'shuffle' in [[adapter]] #1; did you mean "
     "'no_shuffle'?"},
    {"[defaults]\nskip_bad_line = true\n" ADAPTER, "2:1", "did you mean 'skip_bad_lines'?"},
    {ADAPTER "rank = -3\n", "4:8", "(got -3)"},
    {ADAPTER "rank = 4097\n", "4:8", "no larger than 4096"},
    {ADAPTER "rank = 8.0\n", "4:8", "rank must be an integer, not a float"},
    {ADAPTER "rank = '8'\n", "4:8", "rank must be an integer, not a string"},
    {ADAPTER "epochs = 0\n", "4:10", "epochs must be a positive integer"},
    {ADAPTER "batch_size = 65537\n", "4:14",
     "batch_size must be a positive integer no larger "
     "than 65536"},
    {ADAPTER "max_seq_len = true\n", "4:15", "max_seq_len must be an integer, not a boolean"},
    {ADAPTER "max_seq_len = 1\n", "4:15", "max_seq_len must be an integer 2..1048576 (got 1)"},
    {ADAPTER "alpha = 0\n", "4:9", "alpha must be greater than 0"},
    {ADAPTER "alpha = 'big'\n", "4:9", "alpha must be a number, not a string"},
    {ADAPTER "learning_rate = -1e-4\n", "4:17", "learning_rate must be greater than 0"},
    {ADAPTER "learning_rate = 2\n", "4:17",
     "learning_rate must be at most 1 (got 2); typical LoRA rates are 1e-5 to 1e-3"},
    {ADAPTER "weight = 0.0\n", "4:10", "weight must be greater than 0"},
    {ADAPTER "weight = [1.0]\n", "4:10", "weight must be a number, not an array"},
    {ADAPTER "lora_dropout = 1.0\n", "4:16",
     "lora_dropout must be a probability in [0, 1) (got 1)"},
    {ADAPTER "lora_dropout = -0.1\n", "4:16", "lora_dropout must be a probability in [0, 1)"},
    {ADAPTER "lora_dropout = '0.1'\n", "4:16", "lora_dropout must be a number, not a string"},
    {ADAPTER "lora_droput = 0.1\n", "4:1", "did you mean 'lora_dropout'?"},
    {"[[adapter]]\ndata = 5\noutput = 'o'\n", "2:8",
     "data must be a string (in quotes), not an "
     "integer"},
    {"[[adapter]]\ndata = ''\noutput = 'o'\n", "2:8", "data must not be empty"},
    {"[[adapter]]\ndata = 'd'\noutput = \"a\\nb\"\n", "3:10",
     "output contains a control "
     "character (U+000A)"},
    {ADAPTER "init_adapter = ''\n", "4:16", "init_adapter must not be empty"},
    {ADAPTER "label = 'has space'\n", "4:9", "label must be 1 to 64 characters of A-Z a-z"},
    {ADAPTER "label = ''\n", "4:9", "label must be 1 to 64"},
    {ADAPTER "label = 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'\n", "4:9",
     "label must be 1 to 64"},
    /* Targets. */
    {ADAPTER "targets = ['q_proj', 'vproj']\n", "4:22",
     "targets: unknown target 'vproj'; did you mean 'v_proj'?"},
    {ADAPTER "targets = 'q_proj,lm_head'\n", "4:11", "targets: unknown target 'lm_head' (known:"},
    {ADAPTER "targets = ['q_proj', 'q_proj']\n", "4:22", "'q_proj' is listed twice"},
    {ADAPTER "targets = []\n", "4:11", "targets is empty"},
    {ADAPTER "targets = ''\n", "4:11", "target list is empty"},
    {ADAPTER "targets = [1, 2]\n", "4:12", "targets must be an array of strings, not of integers"},
    {ADAPTER "targets = 7\n", "4:11",
     "targets must be an array of names or a comma-separated "
     "string"},
    /* Cross-adapter checks. */
    {"[[adapter]]\ndata = 'a'\noutput = 'out/x'\n"
     "[[adapter]]\ndata = 'b'\noutput = 'out/y'\n"
     "[[adapter]]\ndata = 'c'\noutput = './out//x/'\n",
     "9",
     "[[adapter]] #3 writes to output './out//x/', the same directory as [[adapter]] #1 "
     "(line 3)"},
    {"[[adapter]]\ndata = 'a'\noutput = '/abs/o'\n"
     "[[adapter]]\ndata = 'b'\noutput = '/abs/o/.'\n",
     "6", "the same directory as [[adapter]] #1"},
    {"[[adapter]]\nlabel = 'x'\ndata = 'a'\noutput = 'a'\n"
     "[[adapter]]\nlabel = 'x'\ndata = 'b'\noutput = 'b'\n",
     "6", "[[adapter]] #2 has label 'x', already used by [[adapter]] #1 (line 2)"},
};

static void test_bad_configs(void **state)
{
    int failures = 0;
    for (size_t k = 0; k < sizeof bad_cases / sizeof bad_cases[0]; k++) {
        const bad_case *c = &bad_cases[k];
        tdm_adapters_config cfg;
        tdm_error err = {0};
        tdm_status st =
            tdm_adapters_config_parse(c->text, strlen(c->text), "adapters.toml", &cfg, &err);
        char prefix[64];
        snprintf(prefix, sizeof prefix, "adapters.toml:%s%s ", c->where, *c->where ? ":" : "");
        if (st == TDM_OK || cfg.adapters != NULL || cfg.file != NULL ||
            strncmp(err.message, prefix, strlen(prefix)) || !strstr(err.message, c->says)) {
            print_error("case %zu <<%s>>: want '%s...%s', got status %d: %s\n", k, c->text,
                        prefix, c->says, (int)st, err.message);
            failures++;
        }
        if (st == TDM_OK)
            tdm_adapters_config_free(&cfg);
    }
    assert_int_equal(failures, 0);
}

static void test_load_file(void **state)
{
    char path[] = "/tmp/tandem-test-adapters-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char text[] = "[[adapter]]\ndata = 'a.jsonl'\noutput = 'out/a'\n";
    assert_int_equal(write(fd, text, sizeof text - 1), (ssize_t)(sizeof text - 1));
    close(fd);
    tdm_adapters_config cfg;
    tdm_error err = {0};
    assert_int_equal(tdm_adapters_config_load(path, &cfg, &err), TDM_OK);
    assert_string_equal(cfg.file, path);
    assert_int_equal(cfg.n_adapters, 1);
    assert_string_equal(cfg.adapters[0].output, "out/a");
    tdm_adapters_config_free(&cfg);
    unlink(path);
    assert_int_equal(tdm_adapters_config_load(path, &cfg, &err), TDM_ERR_NOT_FOUND);
    assert_non_null(strstr(err.message, path));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_example), cmocka_unit_test(test_training_options),
        cmocka_unit_test(test_data_options), cmocka_unit_test(test_defaults_table),
        cmocka_unit_test(test_targets_list), cmocka_unit_test(test_suggest),
        cmocka_unit_test(test_bad_configs),  cmocka_unit_test(test_load_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
