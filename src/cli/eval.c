/* eval.c — `tandem eval`: the token-weighted mean cross-entropy and perplexity of a model, with
 * or without a PEFT adapter, over every usable sample of a JSONL file (docs/finetune.md).
 */
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "data/dataset.h"
#include "data/render.h"
#include "engine/model.h"
#include "tokenizer/tokenizer.h"
#include "train/peft_io.h"
#include "train/trainer.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: tandem eval MODEL_DIR --data FILE [--adapter DIR] [--method qlora|lora]\n"
            "                   [--no-double-quant] [--max-seq-len N] [--batch-size N]\n"
            "                   [--chat-template chatml|llama3|none] [--json]\n\n"
            "Prints the token-weighted mean loss (cross-entropy over the tokens the data format\n"
            "labels, as in training) and the perplexity exp(loss) over every sample of FILE.\n"
            "  --adapter DIR   a PEFT LoRA adapter directory (default: the bare base model)\n"
            "  --method        qlora (NF4 base, the default) or lora (the base's precision)\n"
            "  --json          {\"loss\": ..., \"tokens\": ..., \"perplexity\": ...}\n");
}

enum { E_DATA = 1000, E_ADAPTER, E_METHOD, E_NODQ, E_SEQ, E_BATCH, E_TMPL, E_JSON, E_HELP };

int tdm_cmd_eval(int argc, char **argv)
{
    static const struct option longopts[] = {{"data", required_argument, NULL, E_DATA},
                                             {"adapter", required_argument, NULL, E_ADAPTER},
                                             {"method", required_argument, NULL, E_METHOD},
                                             {"no-double-quant", no_argument, NULL, E_NODQ},
                                             {"max-seq-len", required_argument, NULL, E_SEQ},
                                             {"batch-size", required_argument, NULL, E_BATCH},
                                             {"chat-template", required_argument, NULL, E_TMPL},
                                             {"json", no_argument, NULL, E_JSON},
                                             {"help", no_argument, NULL, E_HELP},
                                             {NULL, 0, NULL, 0}};
    const char *data = NULL, *adapter = NULL;
    bool nf4 = true, dq = true, json = false, tmpl_given = false;
    long seqlen = 512, batch = 8;
    tdm_chat_template tmpl = TDM_CHAT_NONE;
    tdm_error err = {0};
    optind = 1;
    opterr = 0;
    int ch;
    while ((ch = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (ch) {
        case E_DATA:
            data = optarg;
            break;
        case E_ADAPTER:
            adapter = optarg;
            break;
        case E_METHOD:
            if (!strcmp(optarg, "qlora"))
                nf4 = true;
            else if (!strcmp(optarg, "lora"))
                nf4 = false;
            else
                return tdm_cli_fail(TDM_EXIT_USAGE, "eval: --method: '%s' is not qlora or lora",
                                    optarg);
            break;
        case E_NODQ:
            dq = false;
            break;
        case E_SEQ:
            if (!tdm_cli_parse_long(optarg, &seqlen) || seqlen < 2 || seqlen > (1L << 20))
                return tdm_cli_fail(TDM_EXIT_USAGE, "eval: --max-seq-len needs an integer >= 2");
            break;
        case E_BATCH:
            if (!tdm_cli_parse_long(optarg, &batch) || batch < 1 || batch > 65536)
                return tdm_cli_fail(TDM_EXIT_USAGE, "eval: --batch-size needs an integer >= 1");
            break;
        case E_TMPL:
            if (tdm_chat_template_parse(optarg, &tmpl, &err) != TDM_OK)
                return tdm_cli_fail(TDM_EXIT_USAGE, "eval: --chat-template: %s", err.message);
            tmpl_given = true;
            break;
        case E_JSON:
            json = true;
            break;
        case E_HELP:
        case 'h':
            usage(stdout);
            return TDM_EXIT_OK;
        default:
            usage(stderr);
            return tdm_cli_fail(TDM_EXIT_USAGE, "eval: unknown or incomplete option '%s'",
                                argv[optind - 1]);
        }
    }
    if (optind != argc - 1)
        return tdm_cli_fail(TDM_EXIT_USAGE, "eval: expected exactly one MODEL_DIR");
    if (!data) return tdm_cli_fail(TDM_EXIT_USAGE, "eval: --data FILE is required");
    const char *model_dir = argv[optind];

    tdm_model_config cfg;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    if (tdm_model_config_load(&cfg, path, &err) != TDM_OK) return tdm_cli_fail_err(&err);
    tdm_tokenizer tok;
    if (tdm_tokenizer_load(&tok, model_dir, &err) != TDM_OK) return tdm_cli_fail_err(&err);
    tdm_dataset_opts o;
    tdm_dataset_opts_default(&o);
    o.chat_template = tmpl_given ? tmpl : tdm_chat_template_detect(&tok);
    o.eos_id = tdm_data_find_eos(&tok, model_dir);
    o.vocab_size = cfg.vocab_size < tok.n_ids ? cfg.vocab_size : tok.n_ids;
    o.max_seq_len = (int32_t)seqlen;
    o.val_split = 0;
    tdm_dataset ds;
    tdm_data_report rep;
    tdm_status st = tdm_dataset_load(&ds, data, &tok, &o, &rep, &err);
    tdm_tokenizer_free(&tok);
    if (st == TDM_ERR_PARSE) {
        char *txt = tdm_data_report_bad_text(&rep, data);
        if (txt) fputs(txt, stderr);
        free(txt);
        return tdm_cli_fail(TDM_EXIT_FAILURE, "eval: bad lines in %s", data);
    }
    if (st != TDM_OK) return tdm_cli_fail_err(&err);
    int code = TDM_EXIT_OK;
    tdm_lora_params lp = {0};
    tdm_backend *be = NULL;
    tdm_model *m = NULL;
    if (ds.n_samples == 0) {
        code = tdm_cli_fail(TDM_EXIT_FAILURE, "eval: %s has no sample with a counted token", data);
        goto out;
    }
    if (adapter && tdm_peft_load(adapter, &cfg, &lp, NULL, &err) != TDM_OK) {
        code = tdm_cli_fail_err(&err);
        goto out;
    }
    if (tdm_backend_create(&be, "cpu", NULL, &err) != TDM_OK) {
        code = tdm_cli_fail_err(&err);
        goto out;
    }
    tdm_model_opts mo = {.nf4 = nf4, .double_quant = nf4 && dq};
    if (tdm_model_load(&m, be, model_dir, &mo, &err) != TDM_OK) {
        code = tdm_cli_fail_err(&err);
        goto out;
    }
    uint32_t *idx = malloc((size_t)ds.n_samples * sizeof *idx);
    if (!idx) {
        code = tdm_cli_fail(TDM_EXIT_FAILURE, "out of memory");
        goto out;
    }
    for (uint32_t i = 0; i < ds.n_samples; i++)
        idx[i] = i;
    double sum = 0;
    int64_t tokens = 0;
    st = tdm_trainer_evaluate(m, adapter ? &lp : NULL, &ds, idx, ds.n_samples, (int)batch, &sum,
                              &tokens, &err);
    free(idx);
    if (st != TDM_OK) {
        code = tdm_cli_fail_err(&err);
        goto out;
    }
    double loss = tokens > 0 ? sum / (double)tokens : NAN;
    if (json) {
        json_t *j = json_pack("{s:f, s:I, s:f}", "loss", loss, "tokens", (json_int_t)tokens,
                              "perplexity", exp(loss));
        char *s = j ? json_dumps(j, JSON_SORT_KEYS | JSON_REAL_PRECISION(17)) : NULL;
        if (s) printf("%s\n", s);
        free(s);
        json_decref(j);
    } else {
        printf("%s%s%s: loss %.6f over %lld tokens, perplexity %.4f\n", data,
               adapter ? " with " : "", adapter ? adapter : "", loss, (long long)tokens, exp(loss));
    }
out:
    tdm_model_free(m);
    tdm_backend_free(be);
    tdm_lora_params_free(&lp);
    tdm_dataset_free(&ds);
    return code;
}
