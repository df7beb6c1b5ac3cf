/* test_run_options.c — the option table of finetune/eval (src/run/run_options.c): every
 * adapters.toml key has exactly one row, the defaults are the documented ones, values are
 * checked against their row's range, and parsing fills the row's destination. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <stdio.h>

#include "run/run_options.h"

static void test_every_toml_key_has_one_row(void **state)
{
    (void)state;
    size_t n;
    const tdm_run_option *t = tdm_run_option_table(&n);
    for (int k = 0; k < TDM_ADAPTER_KEY_COUNT; k++) {
        int rows = 0;
        for (size_t i = 0; i < n; i++)
            rows += tdm_run_option_key(&t[i]) == k;
        if (rows != 1) fail_msg("adapters.toml key %s has %d rows", tdm_adapter_key_name(k), rows);
    }
    for (size_t i = 0; i < n; i++) {
        assert_true(t[i].flag || t[i].adapter);
        /* a per-adapter setting lives in the adapter's options */
        if (t[i].adapter)
            assert_true(t[i].offset >= offsetof(tdm_run_opts, adapter) &&
                        t[i].offset <
                            offsetof(tdm_run_opts, adapter) + sizeof(tdm_trainer_adapter));
    }
}

static void test_defaults(void **state)
{
    (void)state;
    tdm_run_opts o;
    tdm_run_opts_default(&o, TDM_CMD_FINETUNE);
    assert_int_equal(o.adapter.rank, 16);
    assert_true(o.adapter.alpha == 32);
    assert_int_equal(o.adapter.targets, TDM_ADAPTER_TARGET_Q_PROJ | TDM_ADAPTER_TARGET_V_PROJ);
    assert_true(o.adapter.lr == 2e-4);
    assert_int_equal(o.adapter.epochs, 3);
    assert_int_equal(o.adapter.batch_size, 4);
    assert_int_equal(o.adapter.max_seq_len, 512);
    assert_true(o.adapter.weight == 1.0);
    assert_true(o.trainer.nf4 && o.trainer.double_quant && o.adapter.shuffle);
    assert_false(o.trainer.resume || o.trainer.grad_checkpoint || o.adapter.use_rslora);
    assert_int_equal(o.trainer.recompute, TDM_RECOMPUTE_LAYER);
    assert_true(o.adapter.val_split == 0.05);
    assert_int_equal(o.adapter.seed, 42);
    assert_int_equal(o.adapter.save_every, 500);
    assert_int_equal(o.adapter.log_every, 10);
    assert_true(o.adapter.max_grad_norm == 1.0);
    assert_false(o.adapter.chat_template_given);
    assert_string_equal(o.adapter.task, "instruct");
    assert_string_equal(o.device.device, "auto");
    assert_true(o.device.vram_gib == 0 && o.device.timeout_sec == 3600);
    assert_false(o.device.gpu_share_given);
    /* the trainer's own defaults agree with the table where both set a field */
    tdm_trainer_adapter t;
    memset(&t, 0, sizeof t);
    tdm_trainer_adapter_default(&t);
    assert_true(t.seed == o.adapter.seed && t.val_split == o.adapter.val_split &&
                t.save_every == o.adapter.save_every && t.log_every == o.adapter.log_every &&
                t.grad_accum == o.adapter.grad_accum && t.lr_kind == o.adapter.lr_kind &&
                t.max_grad_norm == o.adapter.max_grad_norm && t.shuffle == o.adapter.shuffle &&
                t.eval_every == o.adapter.eval_every && !strcmp(t.task, o.adapter.task));
    tdm_run_opts_default(&o, TDM_CMD_EVAL);
    assert_int_equal(o.eval_batch_size, 8);
    assert_int_equal(o.adapter.max_seq_len, 512);
}

static void test_parse(void **state)
{
    (void)state;
    char *argv[] = {
        "finetune",  "model",         "--rank", "8",   "--adapter", "a.jsonl:out/a", "--no-shuffle",
        "--targets", "q_proj,k_proj", "--vram", "2.5", "--adapter", "b.jsonl:out/b", "--gpu-share",
        "30",        "--recompute",   "attn",   NULL};
    int argc = (int)(sizeof argv / sizeof *argv) - 1;
    tdm_run_opts o;
    tdm_run_opts_default(&o, TDM_CMD_FINETUNE);
    char **pos = NULL;
    int npos = 0;
    tdm_error err = {0};
    assert_int_equal(tdm_run_opts_parse(&o, TDM_CMD_FINETUNE, argc, argv, &pos, &npos, &err),
                     TDM_OK);
    assert_int_equal(npos, 1);
    assert_string_equal(pos[0], "model");
    assert_int_equal(o.adapter.rank, 8);
    assert_false(o.adapter.shuffle);
    assert_int_equal(o.adapter.targets, TDM_ADAPTER_TARGET_Q_PROJ | TDM_ADAPTER_TARGET_K_PROJ);
    assert_true(o.device.vram_gib == 2.5);
    assert_int_equal(o.n_adapter_args, 2);
    assert_string_equal(o.adapter_args[1], "b.jsonl:out/b");
    assert_true(o.device.gpu_share_given && o.device.mps.gpu_share_pct == 30);
    assert_int_equal(o.trainer.recompute, TDM_RECOMPUTE_ATTN);
    free(pos);
    free(o.adapter_args);
}

/* --wait-gpu (the default, accepted because other tools' users type it) and --no-wait-gpu: the
 * last one wins, for finetune and eval. */
static void test_wait_gpu(void **state)
{
    (void)state;
    static const struct {
        const char *a, *b;
        bool no_wait;
    } cases[] = {
        {NULL, NULL, false}, /* the default: wait */
        {"--wait-gpu", NULL, false},
        {"--no-wait-gpu", NULL, true},
        {"--no-wait-gpu", "--wait-gpu", false},
        {"--wait-gpu", "--no-wait-gpu", true},
    };
    unsigned cmds[] = {TDM_CMD_FINETUNE, TDM_CMD_EVAL};
    for (size_t c = 0; c < 2; c++)
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
            char *argv[] = {"cmd", "model", (char *)cases[i].a, (char *)cases[i].b, NULL};
            int argc = cases[i].b ? 4 : cases[i].a ? 3 : 2;
            tdm_run_opts o;
            tdm_run_opts_default(&o, cmds[c]);
            char **pos = NULL;
            int npos = 0;
            tdm_error err = {0};
            assert_int_equal(tdm_run_opts_parse(&o, cmds[c], argc, argv, &pos, &npos, &err),
                             TDM_OK);
            if (o.device.no_wait != cases[i].no_wait)
                fail_msg("%s %s: no_wait %d", cases[i].a ? cases[i].a : "(none)",
                         cases[i].b ? cases[i].b : "", o.device.no_wait);
            free(pos);
            free(o.adapter_args);
        }
}

/* Each bad value names the flag and what it needs; a misspelled flag gets a suggestion. */
static void test_errors(void **state)
{
    (void)state;
    static const char *const cases[][3] = {
        {"--rank", "0", "--rank needs an integer 1..4096, not '0'"},
        {"--lr", "0", "--lr needs a number in (0, 1], not '0'"},
        {"--lora-dropout", "1", "--lora-dropout needs a probability in [0, 1), not '1'"},
        {"--vram", "-1", "--vram needs a positive number of GiB or 'auto', not '-1'"},
        {"--vram", "0x10", "--vram needs a positive number of GiB or 'auto', not '0x10'"},
        {"--vram", "inf", "--vram needs a positive number of GiB or 'auto', not 'inf'"},
        {"--vram", "2e6", "--vram: '2e6' GiB is too large: at most 1000000 GiB (more than any GPU has)"},
        {"--method", "full", "--method: 'full' is not qlora or lora"},
        {"--recompute", "all", "--recompute: 'all' is not layer, mlp or attn"},
        {"--seed", "-3", "--seed needs a non-negative integer, not '-3'"},
        {"--gpu-share", "0", "--gpu-share needs a percentage 1..100"},
        {"--task", "chat", "--task: unknown task 'chat' (use instruct, the only one)"},
        {"--chat-template", "jinja",
         "--chat-template: unknown chat template 'jinja' (use chatml, llama3 or none)"},
        {"--chat-template", "",
         "--chat-template: unknown chat template '' (use chatml, llama3 "
         "or none)"},
        {"--rnak", "3", "unknown or incomplete option '--rnak'; did you mean '--rank'?"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *argv[] = {"finetune", (char *)cases[i][0], (char *)cases[i][1], NULL};
        tdm_run_opts o;
        tdm_run_opts_default(&o, TDM_CMD_FINETUNE);
        char **pos = NULL;
        int npos = 0;
        tdm_error err = {0};
        assert_int_equal(tdm_run_opts_parse(&o, TDM_CMD_FINETUNE, 3, argv, &pos, &npos, &err),
                         TDM_ERR_INVALID);
        assert_string_equal(err.message, cases[i][2]);
        free(o.adapter_args);
    }
}

/* Whether adapters.toml takes "key = text" in an [[adapter]] table. */
static bool toml_takes(const char *key, const char *text)
{
    char doc[256];
    snprintf(doc, sizeof doc, "[[adapter]]\ndata = \"d.jsonl\"\noutput = \"out/a\"\n%s = %s\n", key,
             text);
    tdm_adapters_config cfg;
    tdm_error err = {0};
    tdm_status st = tdm_adapters_config_parse(doc, strlen(doc), "adapters.toml", &cfg, &err);
    if (st == TDM_OK) tdm_adapters_config_free(&cfg);
    return st == TDM_OK;
}

/* A per-adapter setting has one range: at each end of every numeric row, and just outside it,
 * the flag and the adapters.toml key accept or refuse alike. */
static void test_flag_and_key_share_ranges(void **state)
{
    (void)state;
    size_t n, checked = 0;
    const tdm_run_option *t = tdm_run_option_table(&n);
    for (size_t i = 0; i < n; i++) {
        const tdm_option_value *v = tdm_run_option_value(&t[i]);
        if (!t[i].adapter || (v->kind != TDM_OPT_INT && v->kind != TDM_OPT_FLOAT)) continue;
        assert_ptr_equal(v, &t[i].adapter->value);
        double probes[4] = {v->min, v->max, v->kind == TDM_OPT_INT ? v->min - 1 : -v->min - 1,
                            v->kind == TDM_OPT_INT ? v->max + 1 : nextafter(v->max, INFINITY)};
        for (int p = 0; p < 4; p++) {
            if (!isfinite(probes[p])) continue;
            char text[64];
            snprintf(text, sizeof text, v->kind == TDM_OPT_INT ? "%.0f" : "%.17g", probes[p]);
            tdm_run_opts o;
            tdm_run_opts_default(&o, TDM_CMD_FINETUNE);
            tdm_error err = {0};
            bool flag_ok = tdm_run_option_set(&o, &t[i], text, &err) == TDM_OK;
            bool key_ok = toml_takes(t[i].adapter->key, text);
            if (flag_ok != key_ok)
                fail_msg("%s = %s: the flag %s it, adapters.toml %s it", t[i].adapter->key, text,
                         flag_ok ? "takes" : "refuses", key_ok ? "takes" : "refuses");
            bool inside = p < 2 && !(p == 0 && v->min_open) && !(p == 1 && v->max_open);
            assert_true(flag_ok == inside);
            checked++;
        }
    }
    assert_true(checked >= 20); /* 4 integer and 4 number rows */
}

/* The word and boolean rows: the flag and the adapters.toml key take the same words (every word
 * of the row's "accepts", and nothing else), and a boolean key takes true or false only. */
static void test_flag_and_key_share_words(void **state)
{
    (void)state;
    size_t n, words = 0, bools = 0;
    const tdm_run_option *t = tdm_run_option_table(&n);
    for (size_t i = 0; i < n; i++) {
        const tdm_option_value *v = tdm_run_option_value(&t[i]);
        if (!t[i].adapter) continue;
        const char *key = t[i].adapter->key;
        if (v->kind == TDM_OPT_BOOL) {
            assert_true(toml_takes(key, "true") && toml_takes(key, "false"));
            assert_false(toml_takes(key, "1") || toml_takes(key, "'true'") ||
                         toml_takes(key, "'yes'"));
            bools++;
            continue;
        }
        if (v->kind != TDM_OPT_ENUM) continue;
        /* "a, b or c" -> a b c, then words that are not in it */
        char list[128], *save = NULL;
        snprintf(list, sizeof list, "%s", v->accepts);
        const char *probes[16];
        size_t np = 0;
        for (char *w = strtok_r(list, ", ", &save); w && np < 12; w = strtok_r(NULL, ", ", &save))
            if (strcmp(w, "or")) probes[np++] = w;
        size_t n_words = np;
        assert_true(n_words >= 1);
        probes[np++] = "bogus";
        probes[np++] = "";
        probes[np++] = "Chatml";
        for (size_t p = 0; p < np; p++) {
            tdm_run_opts o;
            tdm_run_opts_default(&o, TDM_CMD_FINETUNE);
            tdm_error err = {0};
            bool flag_ok = tdm_run_option_set(&o, &t[i], probes[p], &err) == TDM_OK;
            char text[64];
            snprintf(text, sizeof text, "'%s'", probes[p]);
            bool key_ok = toml_takes(key, text);
            if (flag_ok != key_ok || flag_ok != (p < n_words))
                fail_msg("%s = %s: the flag %s it, adapters.toml %s it", key, text,
                         flag_ok ? "takes" : "refuses", key_ok ? "takes" : "refuses");
            words++;
        }
    }
    assert_int_equal(bools, 3);  /* train_on_prompt, skip_bad_lines, no_shuffle */
    assert_true(words >= 3 * 4); /* lr_schedule, task, chat_template */
}

/* A word flag sets the field its key sets: --chat-template names the template (detection off),
 * --task and --lr-schedule theirs. */
static void test_word_flags_fill_the_adapter(void **state)
{
    (void)state;
    char *argv[] = {"finetune",         "--chat-template",
                    "llama3",           "--lr-schedule",
                    "linear",           "--task",
                    "instruct",         "--train-on-prompt",
                    "--skip-bad-lines", NULL};
    tdm_run_opts o;
    tdm_run_opts_default(&o, TDM_CMD_FINETUNE);
    assert_false(o.adapter.chat_template_given || o.adapter.train_on_prompt ||
                 o.adapter.skip_bad_lines);
    char **pos = NULL;
    int npos = 0;
    tdm_error err = {0};
    assert_int_equal(tdm_run_opts_parse(&o, TDM_CMD_FINETUNE, 9, argv, &pos, &npos, &err), TDM_OK);
    assert_true(o.adapter.chat_template_given && o.adapter.chat_template == TDM_CHAT_LLAMA3);
    assert_int_equal(o.adapter.lr_kind, TDM_LR_LINEAR);
    assert_string_equal(o.adapter.task, "instruct");
    assert_true(o.adapter.train_on_prompt && o.adapter.skip_bad_lines && o.adapter.shuffle);
    free(pos);
    free(o.adapter_args);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_toml_key_has_one_row),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_wait_gpu),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_flag_and_key_share_ranges),
        cmocka_unit_test(test_flag_and_key_share_words),
        cmocka_unit_test(test_word_flags_fill_the_adapter),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
