/* generate.c — `tandem generate`: greedy text generation from a model, with or without a PEFT
 * adapter, on the CPU (docs/generate.md). The prompt is rendered as one user turn, the way the
 * instruct and chat dataset formats are rendered in training.
 */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "data/render.h"
#include "engine/model.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "train/generate.h"
#include "train/peft_io.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: tandem generate MODEL_DIR --prompt TEXT [--adapter DIR] [--max-new-tokens N]\n"
            "                       [--method qlora|lora] [--no-double-quant]\n"
            "                       [--chat-template chatml|llama3|none] [--json]\n\n"
            "Greedy decoding on the CPU: TEXT as one user turn, then the model's answer until its\n"
            "end-of-turn or EOS token, or N new tokens (default 64).\n"
            "  --adapter DIR   a PEFT LoRA adapter directory (default: the bare base model)\n"
            "  --method        qlora (NF4 base, the default) or lora (the base's precision)\n"
            "  --json          {\"text\": ..., \"tokens\": [...], \"prompt_tokens\": N,\n"
            "                   \"stop\": \"stop_token\"|\"max_tokens\"|\"context_full\"}\n");
}

enum { G_PROMPT = 1000, G_ADAPTER, G_MAXNEW, G_METHOD, G_NODQ, G_TMPL, G_JSON, G_HELP };

/* The adapter of a PEFT directory on the model's device. */
static tdm_status load_adapter(tdm_model *m, const char *dir, tdm_lora **out, tdm_error *err)
{
    tdm_lora_params lp = {0};
    tdm_status st = tdm_peft_load(dir, tdm_model_get_config(m), &lp, NULL, err);
    if (st == TDM_OK) st = tdm_lora_create(out, m, lp.rank, (float)lp.scale, lp.targets, err);
    if (st == TDM_OK && (*out)->n_params != lp.n_params)
        st = tdm_fail(err, TDM_ERR_INVALID, "%s: adapter layout disagrees with the model", dir);
    if (st == TDM_OK)
        st = tdm_be_upload(tdm_model_backend(m), (*out)->params, lp.params,
                           (size_t)lp.n_params * sizeof(float), err);
    tdm_lora_params_free(&lp);
    return st;
}

/* text[0..len) as valid UTF-8 (malloc'd, NUL-terminated): each byte that does not start a valid
 * character becomes U+FFFD, as Hugging Face's decode does; JSON strings must be UTF-8. */
static char *utf8_lossy(const char *text, size_t len)
{
    char *out = malloc(3 * len + 1), *o = out;
    if (!out) return NULL;
    while (len > 0) {
        size_t ok = tdm_utf8_valid_prefix(text, len);
        memcpy(o, text, ok);
        o += ok, text += ok, len -= ok;
        if (len > 0) {
            memcpy(o, "\xEF\xBF\xBD", 3);
            o += 3, text++, len--;
        }
    }
    *o = '\0';
    return out;
}

/* The tokens that end an answer: EOS and the template's end-of-turn token. */
static int stop_ids(const tdm_tokenizer *tok, const char *model_dir, tdm_chat_template t,
                    int32_t ids[2])
{
    int n = 0;
    int32_t eos = tdm_data_find_eos(tok, model_dir), id;
    if (eos >= 0) ids[n++] = eos;
    const char *eot = t == TDM_CHAT_CHATML   ? "<|im_end|>"
                      : t == TDM_CHAT_LLAMA3 ? "<|eot_id|>"
                                             : NULL;
    if (eot && tdm_tokenizer_token_id(tok, eot, &id) && id != eos) ids[n++] = id;
    return n;
}

int tdm_cmd_generate(int argc, char **argv)
{
    static const struct option longopts[] = {{"prompt", required_argument, NULL, G_PROMPT},
                                             {"adapter", required_argument, NULL, G_ADAPTER},
                                             {"max-new-tokens", required_argument, NULL, G_MAXNEW},
                                             {"method", required_argument, NULL, G_METHOD},
                                             {"no-double-quant", no_argument, NULL, G_NODQ},
                                             {"chat-template", required_argument, NULL, G_TMPL},
                                             {"json", no_argument, NULL, G_JSON},
                                             {"help", no_argument, NULL, G_HELP},
                                             {NULL, 0, NULL, 0}};
    const char *prompt = NULL, *adapter = NULL;
    bool nf4 = true, dq = true, json = false, tmpl_given = false;
    long max_new = 64;
    tdm_chat_template tmpl = TDM_CHAT_NONE;
    tdm_error err = {0};
    optind = 1;
    opterr = 0;
    int ch;
    while ((ch = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (ch) {
        case G_PROMPT:
            prompt = optarg;
            break;
        case G_ADAPTER:
            adapter = optarg;
            break;
        case G_MAXNEW:
            if (!tdm_cli_parse_long(optarg, &max_new) || max_new < 1 || max_new > (1L << 20))
                return tdm_cli_fail(TDM_EXIT_USAGE,
                                    "generate: --max-new-tokens needs an integer >= 1");
            break;
        case G_METHOD:
            if (!strcmp(optarg, "qlora"))
                nf4 = true;
            else if (!strcmp(optarg, "lora"))
                nf4 = false;
            else
                return tdm_cli_fail(TDM_EXIT_USAGE, "generate: --method: '%s' is not qlora or lora",
                                    optarg);
            break;
        case G_NODQ:
            dq = false;
            break;
        case G_TMPL:
            if (tdm_chat_template_parse(optarg, &tmpl, &err) != TDM_OK)
                return tdm_cli_fail(TDM_EXIT_USAGE, "generate: --chat-template: %s", err.message);
            tmpl_given = true;
            break;
        case G_JSON:
            json = true;
            break;
        case G_HELP:
        case 'h':
            usage(stdout);
            return TDM_EXIT_OK;
        default:
            usage(stderr);
            return tdm_cli_fail(TDM_EXIT_USAGE, "generate: unknown or incomplete option '%s'",
                                argv[optind - 1]);
        }
    }
    if (optind != argc - 1)
        return tdm_cli_fail(TDM_EXIT_USAGE, "generate: expected exactly one MODEL_DIR");
    if (!prompt) return tdm_cli_fail(TDM_EXIT_USAGE, "generate: --prompt TEXT is required");
    const char *model_dir = argv[optind];

    tdm_tokenizer tok;
    if (tdm_tokenizer_load(&tok, model_dir, &err) != TDM_OK) return tdm_cli_fail_err(&err);
    if (!tmpl_given) tmpl = tdm_chat_template_detect(&tok);
    int code = TDM_EXIT_OK;
    tdm_token_ids ids = {0};
    int32_t *out = NULL;
    char *text = NULL;
    size_t text_len = 0, text_cap = 0;
    tdm_backend *be = NULL;
    tdm_model *m = NULL;
    tdm_lora *lora = NULL;
    if (tdm_data_render_prompt(&tok, tmpl, prompt, strlen(prompt), &ids, &err) != TDM_OK) {
        code = tdm_cli_fail(TDM_EXIT_USAGE, "generate: --prompt: %s", err.message);
        goto out;
    }
    if (tdm_backend_create(&be, "cpu", NULL, &err) != TDM_OK) {
        code = tdm_cli_fail_err(&err);
        goto out;
    }
    tdm_model_opts mo = {.nf4 = nf4, .double_quant = nf4 && dq};
    if (tdm_model_load(&m, be, model_dir, &mo, &err) != TDM_OK ||
        (adapter && load_adapter(m, adapter, &lora, &err) != TDM_OK)) {
        code = tdm_cli_fail_err(&err);
        goto out;
    }
    int32_t stops[2];
    tdm_generate_opts go = {.max_new_tokens = max_new, .stop_ids = stops};
    go.n_stop = stop_ids(&tok, model_dir, tmpl, stops);
    go.n_candidates = tok.n_ids; /* never an id the tokenizer cannot decode */
    out = malloc((size_t)max_new * sizeof *out);
    if (!out) {
        code = tdm_cli_fail(TDM_EXIT_FAILURE, "out of memory");
        goto out;
    }
    int64_t n_out = 0;
    tdm_generate_stop why;
    if (tdm_generate_greedy(m, lora, ids.ids, (int64_t)ids.len, &go, out, &n_out, &why, &err) !=
            TDM_OK ||
        tdm_tokenizer_decode(&tok, out, (size_t)n_out, true, &text, &text_len, &text_cap, &err) !=
            TDM_OK) {
        code = tdm_cli_fail_err(&err);
        goto out;
    }
    if (json) {
        json_t *toks = json_array();
        for (int64_t i = 0; toks && i < n_out; i++)
            json_array_append_new(toks, json_integer(out[i]));
        char *valid = utf8_lossy(text ? text : "", text_len);
        json_t *j = valid ? json_pack("{s:s, s:o, s:I, s:s}", "text", valid, "tokens", toks,
                                      "prompt_tokens", (json_int_t)ids.len, "stop",
                                      tdm_generate_stop_name(why))
                          : NULL;
        char *s = j ? json_dumps(j, JSON_SORT_KEYS) : NULL;
        if (s)
            printf("%s\n", s);
        else
            code = tdm_cli_fail(TDM_EXIT_FAILURE, "out of memory");
        free(s);
        free(valid);
        json_decref(j);
    } else {
        if (text_len) fwrite(text, 1, text_len, stdout);
        putchar('\n');
    }
out:
    free(text);
    free(out);
    tdm_lora_free(lora);
    tdm_model_free(m);
    tdm_backend_free(be);
    tdm_token_ids_free(&ids);
    tdm_tokenizer_free(&tok);
    return code;
}
