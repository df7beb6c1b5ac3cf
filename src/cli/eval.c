/* eval.c — `tandem eval`: the token-weighted mean cross-entropy and perplexity of a model, with
 * or without a PEFT adapter, over every usable sample of a JSONL file (docs/finetune.md).
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "data/data_model.h"
#include "data/dataset.h"
#include "engine/model.h"
#include "train/peft_io.h"
#include "run/device_open.h"
#include "run/run_options.h"
#include "train/lora.h"
#include "train/run_records.h"
#include "train/trainer.h"

static void print_note(const char *line, void *user)
{
    (void)user;
    fprintf(stderr, "tandem: %s\n", line);
}

static void usage(FILE *out)
{
    fprintf(out, "usage: tandem eval MODEL_DIR --data FILE\n");
    tdm_run_options_usage(out, TDM_CMD_EVAL, (const char *const[]){"data", NULL});
    fprintf(out,
            "\nPrints the token-weighted mean loss (cross-entropy over the tokens the data format\n"
            "labels, as in training) and the perplexity exp(loss) over every sample of FILE.\n");
}

int tdm_cmd_eval(int argc, char **argv)
{
    tdm_run_opts ro;
    tdm_run_opts_default(&ro, TDM_CMD_EVAL);
    tdm_error err = {0};
    char **pos = NULL;
    int n_pos = 0;
    if (tdm_run_opts_parse(&ro, TDM_CMD_EVAL, argc, argv, &pos, &n_pos, &err) != TDM_OK) {
        if (strstr(err.message, "unknown or incomplete option")) usage(stderr);
        return tdm_cli_fail(TDM_EXIT_USAGE, "eval: %s", err.message);
    }
    if (ro.help || ro.list_options) {
        free(pos);
        if (ro.list_options)
            tdm_run_options_list(stdout, TDM_CMD_EVAL);
        else
            usage(stdout);
        return TDM_EXIT_OK;
    }
    const char *model_dir = n_pos == 1 ? pos[0] : NULL;
    free(pos);
    if (!model_dir) return tdm_cli_fail(TDM_EXIT_USAGE, "eval: expected exactly one MODEL_DIR");
    const char *data = ro.eval_data, *adapter = ro.eval_adapter;
    if (!data) return tdm_cli_fail(TDM_EXIT_USAGE, "eval: --data FILE is required");
    bool nf4 = ro.trainer.nf4, dq = ro.trainer.double_quant, json = ro.json;
    bool tmpl_given = ro.adapter.chat_template_given;
    tdm_chat_template tmpl = ro.adapter.chat_template;
    long seqlen = ro.adapter.max_seq_len, batch = ro.eval_batch_size;

    tdm_model_config cfg;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    if (tdm_model_config_load(&cfg, path, &err) != TDM_OK) return tdm_cli_fail_err(&err);
    tdm_dataset_opts o;
    tdm_dataset_opts_default(&o);
    if (tmpl_given) o.chat_template = tmpl;
    /* as finetune reads it: ids below config.json's vocab_size, tokenizer only when needed */
    tdm_data_model dm;
    if (tdm_data_model_open(&dm, model_dir, cfg.vocab_size, tmpl_given, &o, &err) != TDM_OK)
        return tdm_cli_fail_err(&err);
    o.max_seq_len = (int32_t)seqlen;
    o.val_split = 0;
    if (seqlen > cfg.max_position_embeddings)
        fprintf(stderr,
                "tandem: warning: --max-seq-len %ld is above %s's max_position_embeddings %lld: "
                "positions beyond it were never trained\n",
                seqlen, path, (long long)cfg.max_position_embeddings);
    tdm_dataset ds;
    tdm_data_report rep;
    tdm_status st = tdm_dataset_load(&ds, data, tdm_data_model_tokenizer(&dm), &o, &rep, &err);
    tdm_data_model_close(&dm);
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
    tdm_device dev = {0};
    tdm_model *m = NULL;
    if (ds.n_samples == 0) {
        code = tdm_cli_fail(TDM_EXIT_FAILURE, "eval: %s has no sample with a counted token", data);
        goto out;
    }
    /* an adapter whose run recorded another base model (train/run_records.h) is refused; one
     * without that record (made elsewhere) is evaluated as it is */
    if (adapter && tdm_adapter_check_base(adapter, model_dir, &err) != TDM_OK) {
        code = tdm_cli_fail(TDM_EXIT_FAILURE, "eval: %s", err.message);
        goto out;
    }
    if (adapter && tdm_peft_load(adapter, &cfg, &lp, NULL, &err) != TDM_OK) {
        code = tdm_cli_fail_err(&err);
        goto out;
    }
    tdm_model_opts mo = {.nf4 = nf4, .double_quant = nf4 && dq};
    /* The device as finetune opens it (src/run/device_open.c): the reservation covers the
     * weights, the adapter and the forward pass of the largest batch. */
    tdm_model_mem est;
    tdm_model_mem_plan plan = {.rows = (int64_t)batch * seqlen, .n_seqs = batch};
    if (adapter) {
        plan.max_rank = lp.rank;
        plan.targets = lp.targets;
        plan.lora_params = lp.n_params;
        for (unsigned tg = 0; tg < TDM_LORA_N_TARGETS; tg++) {
            int64_t d_in, d_out;
            tdm_lora_params_projection_dims(&cfg, tg, &d_in, &d_out);
            if ((lp.targets & TDM_LORA_BIT(tg)) &&
                lp.rank * (d_in + d_out) > plan.lora_module_params)
                plan.lora_module_params = lp.rank * (d_in + d_out);
        }
    }
    ro.device.task = "eval";
    ro.device.note = print_note;
    bool cpu = !strcmp(ro.device.device, "cpu");
    if ((!cpu && tdm_model_memory_estimate(&cfg, &mo, TDM_BE_BF16, &plan, &est, &err) != TDM_OK) ||
        tdm_device_open(&dev, &ro.device, cpu ? NULL : &est, &err) != TDM_OK) {
        code = tdm_cli_fail_err(&err);
        goto out;
    }
    be = dev.be;
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
    tdm_device_record_actual(&dev, false, NULL, NULL);
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
    tdm_device_close(&dev);
    tdm_lora_params_free(&lp);
    tdm_dataset_free(&ds);
    return code;
}
