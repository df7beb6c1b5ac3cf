/* tandem data — dataset commands. `tandem data check FILE --model DIR [...]` reads, validates,
 * tokenizes and splits a JSONL dataset exactly as training will, and prints the summary (or the
 * bad lines, exit 1). See docs/datasets.md. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "data/data_model.h"
#include "data/dataset.h"
#include "model/config.h"
#include "run/run_options.h"

/* The options that decide how data is read default to finetune's, taken from its option table
 * (src/run/run_options.c), so that the summary is what finetune trains on. */
static void data_defaults(tdm_dataset_opts *o)
{
    tdm_run_opts ro;
    tdm_run_opts_default(&ro, TDM_CMD_FINETUNE);
    tdm_dataset_opts_default(o);
    o->max_seq_len = ro.adapter.max_seq_len;
    o->val_split = ro.adapter.val_split;
    o->seed = ro.adapter.seed;
}

static void check_usage(FILE *out)
{
    tdm_dataset_opts d;
    data_defaults(&d);
    fprintf(
        out,
        "usage: tandem data check FILE --model DIR [--max-seq-len N] "
        "[--chat-template chatml|llama3|none]\n"
        "                       [--val-split F] [--seed S] [--train-on-prompt] "
        "[--skip-bad-lines] [--json]\n"
        "\n"
        "Reads the JSONL dataset FILE as training would and prints a summary: samples per\n"
        "format, tokens, truncated samples, tokens counted in the loss, train/validation sizes,\n"
        "and the data hash. Bad lines are listed as FILE:LINE: reason (the first 20) and the\n"
        "command exits 1, unless --skip-bad-lines.\n"
        "  --model DIR          model directory (config.json for the vocabulary size;\n"
        "                       tokenizer.json, needed unless the data is pre-tokenized), or\n"
        "                       a tokenizer.json\n"
        "  --max-seq-len N      longer samples keep their first N tokens (default %d)\n"
        "  --chat-template NAME chatml, llama3 or none (default: from the tokenizer)\n"
        "  --val-split F        fraction for validation, in [0, 1) (default %g)\n"
        "  --seed S             split seed (default %llu)\n"
        "  --train-on-prompt    count prompt tokens in the loss too\n"
        "  --skip-bad-lines     leave bad lines out (listed on stderr) instead of failing\n"
        "  --json               print the summary as one JSON object\n",
        d.max_seq_len, d.val_split, (unsigned long long)d.seed);
}

static json_t *report_json(const tdm_data_report *r, const char *file, const char *tmpl,
                           const char *eos, int32_t eos_id, const tdm_dataset_opts *o)
{
    json_t *fmt = json_object();
    for (int f = 0; f < TDM_DATA_FORMAT_COUNT; f++)
        if (r->per_format[f])
            json_object_set_new(fmt, tdm_data_format_name((tdm_data_format)f),
                                json_integer(r->per_format[f]));
    json_t *dropped = json_array();
    for (int64_t i = 0; i < r->dropped_no_loss && i < TDM_DATA_MAX_DROPPED_REPORTED; i++)
        json_array_append_new(dropped, json_integer(r->dropped_lines[i]));
    json_t *bad = json_array();
    for (int64_t i = 0; i < r->bad_lines && i < TDM_DATA_MAX_BAD_REPORTED; i++)
        json_array_append_new(bad,
                              json_pack("{s:I, s:i, s:s}", "line", (json_int_t)r->bad[i].line,
                                        "column", r->bad[i].column, "reason", r->bad[i].reason));
    return json_pack(
        "{s:s, s:s, s:I, s:I, s:I, s:o, s:I, s:o, s:s, s:s?, s:i, s:i, s:b, s:I, s:I, s:I, s:I, "
        "s:I, s:I, s:o, s:f, s:I, s:{s:I, s:I, s:I}, s:{s:I, s:I, s:I}}",
        "file", file, "data_hash", r->data_hash, "lines", (json_int_t)r->lines, "blank_lines",
        (json_int_t)r->blank_lines, "bad_lines", (json_int_t)r->bad_lines, "bad", bad, "samples",
        (json_int_t)r->samples, "formats", fmt, "chat_template", tmpl, "eos_token", eos, "eos_id",
        (int)eos_id, "max_seq_len", (int)o->max_seq_len, "train_on_prompt", (int)o->train_on_prompt,
        "tokens", (json_int_t)r->tokens, "counted_tokens", (json_int_t)r->counted, "truncated",
        (json_int_t)r->truncated, "tokens_cut", (json_int_t)r->tokens_cut, "longest",
        (json_int_t)r->longest, "dropped_no_loss", (json_int_t)r->dropped_no_loss, "dropped_lines",
        dropped, "val_split", o->val_split, "seed", (json_int_t)o->seed, "train", "samples",
        (json_int_t)r->train_samples, "tokens", (json_int_t)r->train_tokens, "counted",
        (json_int_t)r->train_counted, "validation", "samples", (json_int_t)r->val_samples, "tokens",
        (json_int_t)r->val_tokens, "counted", (json_int_t)r->val_counted);
}

static void print_report(FILE *out, const tdm_data_report *r, const char *file, const char *tmpl,
                         const char *eos, int32_t eos_id, const tdm_dataset_opts *o)
{
    fprintf(out, "%s: %lld lines (%lld blank, %lld bad)\n", file, (long long)r->lines,
            (long long)r->blank_lines, (long long)r->bad_lines);
    fprintf(out, "samples: %lld", (long long)r->samples);
    const char *sep = " (";
    for (int f = 0; f < TDM_DATA_FORMAT_COUNT; f++)
        if (r->per_format[f]) {
            fprintf(out, "%s%s %lld", sep, tdm_data_format_name((tdm_data_format)f),
                    (long long)r->per_format[f]);
            sep = ", ";
        }
    fprintf(out, "%s\n", r->samples ? ")" : "");
    if (eos)
        fprintf(out, "chat template: %s; eos: %s (%d)\n", tmpl, eos, eos_id);
    else
        fprintf(out,
                "chat template: %s; eos: none (the model will not learn to stop after a "
                "text or a completion)\n",
                tmpl);
    fprintf(out, "tokens: %lld (counted in the loss: %lld%s)\n", (long long)r->tokens,
            (long long)r->counted, o->train_on_prompt ? ", prompts included" : "");
    fprintf(out, "truncated: %lld samples longer than %d tokens (%lld tokens cut); longest %lld\n",
            (long long)r->truncated, o->max_seq_len, (long long)r->tokens_cut,
            (long long)r->longest);
    if (r->dropped_no_loss) {
        fprintf(out, "dropped: %lld samples with no token counted in the loss (lines",
                (long long)r->dropped_no_loss);
        for (int64_t i = 0; i < r->dropped_no_loss && i < TDM_DATA_MAX_DROPPED_REPORTED; i++)
            fprintf(out, " %lld", (long long)r->dropped_lines[i]);
        fprintf(out, "%s)\n", r->dropped_no_loss > TDM_DATA_MAX_DROPPED_REPORTED ? " ..." : "");
    }
    fprintf(out,
            "split (val_split %g, seed %llu): train %lld samples, %lld tokens, %lld counted; "
            "validation %lld samples, %lld tokens, %lld counted\n",
            o->val_split, (unsigned long long)o->seed, (long long)r->train_samples,
            (long long)r->train_tokens, (long long)r->train_counted, (long long)r->val_samples,
            (long long)r->val_tokens, (long long)r->val_counted);
    fprintf(out, "data hash: %s\n", r->data_hash);
}

static int cmd_check(int argc, char **argv)
{
    const char *file = NULL, *model = NULL, *tmpl_name = NULL;
    bool json = false;
    tdm_dataset_opts o;
    data_defaults(&o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            check_usage(stdout);
            return TDM_EXIT_OK;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--train-on-prompt")) {
            o.train_on_prompt = true;
        } else if (!strcmp(a, "--skip-bad-lines")) {
            o.skip_bad_lines = true;
        } else if (!strcmp(a, "--model") || !strcmp(a, "--max-seq-len") ||
                   !strcmp(a, "--chat-template") || !strcmp(a, "--val-split") ||
                   !strcmp(a, "--seed")) {
            if (i + 1 >= argc)
                return tdm_cli_fail(TDM_EXIT_USAGE, "data check: %s needs a value", a);
            const char *v = argv[++i];
            long n;
            double d;
            if (!strcmp(a, "--model")) {
                model = v;
            } else if (!strcmp(a, "--chat-template")) {
                tdm_error perr = {0};
                if (tdm_chat_template_parse(v, &o.chat_template, &perr) != TDM_OK)
                    return tdm_cli_fail(TDM_EXIT_USAGE, "data check: --chat-template: %s",
                                        perr.message);
                tmpl_name = v;
            } else if (!strcmp(a, "--max-seq-len")) {
                if (!tdm_cli_parse_long(v, &n) || n <= 0 || n > INT32_MAX)
                    return tdm_cli_fail(TDM_EXIT_USAGE,
                                        "data check: --max-seq-len must be a positive integer");
                o.max_seq_len = (int32_t)n;
            } else if (!strcmp(a, "--seed")) {
                if (!tdm_cli_parse_long(v, &n) || n < 0)
                    return tdm_cli_fail(TDM_EXIT_USAGE,
                                        "data check: --seed must be a non-negative integer");
                o.seed = (uint64_t)n;
            } else {
                if (!tdm_cli_parse_double(v, &d) || !(d >= 0 && d < 1))
                    return tdm_cli_fail(TDM_EXIT_USAGE,
                                        "data check: --val-split must be a number in [0, 1)");
                o.val_split = d;
            }
        } else if (a[0] == '-' && a[1]) {
            tdm_cli_fail(TDM_EXIT_USAGE, "data check: unknown option '%s'", a);
            check_usage(stderr);
            return TDM_EXIT_USAGE;
        } else if (!file) {
            file = a;
        } else {
            return tdm_cli_fail(TDM_EXIT_USAGE, "data check: unexpected argument '%s'", a);
        }
    }
    if (!file || !model) {
        if (file)
            tdm_cli_fail(TDM_EXIT_USAGE,
                         "data check: --model MODEL_DIR is required: the samples are tokenized "
                         "with its tokenizer, as training does (a tokenizer.json will do)");
        check_usage(stderr);
        return TDM_EXIT_USAGE;
    }

    /* the model side exactly as finetune reads it (data_model.h) */
    tdm_error err = {0};
    int64_t config_vocab = 0;
    struct stat sb;
    char cfg_path[4096];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", model);
    if (stat(model, &sb) == 0 && S_ISDIR(sb.st_mode) && stat(cfg_path, &sb) == 0) {
        tdm_model_config cfg;
        if (tdm_model_config_load(&cfg, model, &err) != TDM_OK) return tdm_cli_fail_err(&err);
        config_vocab = cfg.vocab_size;
    }
    tdm_data_model dm;
    if (tdm_data_model_open(&dm, model, config_vocab, tmpl_name != NULL, &o, &err) != TDM_OK)
        return tdm_cli_fail_err(&err);
    tdm_tokenizer *tok = tdm_data_model_tokenizer(&dm);
    const char *eos = o.eos_id >= 0 ? tdm_tokenizer_token_text(tok, o.eos_id, NULL) : NULL;
    char *eos_copy = eos ? strdup(eos) : NULL;

    tdm_dataset ds;
    tdm_data_report rep;
    tdm_status st = tdm_dataset_load(&ds, file, tok, &o, &rep, &err);
    tdm_data_model_close(&dm);
    int rc = TDM_EXIT_OK;
    if (rep.bad_lines > 0) {
        char *text = tdm_data_report_bad_text(&rep, file);
        if (text) fputs(text, stderr);
        free(text);
    }
    const char *tmpl = tdm_chat_template_name(o.chat_template);
    if (st == TDM_ERR_PARSE) {
        fprintf(stderr,
                "tandem: %s: %lld bad lines; nothing was loaded (--skip-bad-lines leaves "
                "them out)\n",
                file, (long long)rep.bad_lines);
        rc = TDM_EXIT_FAILURE;
    } else if (st != TDM_OK) {
        rc = tdm_cli_fail_err(&err);
    } else {
        if (json) {
            json_t *j = report_json(&rep, file, tmpl, eos_copy, o.eos_id, &o);
            char *s = j ? json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(12)) : NULL;
            if (s)
                puts(s);
            else
                rc = tdm_cli_fail(TDM_EXIT_FAILURE, "out of memory writing the summary");
            free(s);
            json_decref(j);
        } else {
            print_report(stdout, &rep, file, tmpl, eos_copy, o.eos_id, &o);
        }
        if (rc == TDM_EXIT_OK && rep.train_samples == 0) {
            tdm_data_no_train_sample(&rep, file, &o, &err);
            rc = tdm_cli_fail_err(&err);
        }
        tdm_dataset_free(&ds);
    }
    free(eos_copy);
    return rc;
}

static const tdm_command data_commands[] = {
    {"check", cmd_check, "validate a JSONL dataset and print its summary"},
    {NULL, NULL, NULL},
};

int tdm_cmd_data(int argc, char **argv)
{
    return tdm_cli_dispatch("tandem data", data_commands, argc - 1, argv + 1);
}
