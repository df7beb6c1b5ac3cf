/* generate.c — `tandem generate`: text from a model and any number of PEFT adapters side by side,
 * with a KV cache, batched, greedy or sampled, on the CPU or CUDA (docs/generate.md). Prompts are
 * rendered the way the instruct and chat dataset formats are rendered in training.
 */
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "data/render.h"
#include "engine/model.h"
#include "run/device_open.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "train/generate.h"
#include "train/run_records.h"
#include "util/atomic_file.h"

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: tandem generate MODEL_DIR (--prompt TEXT | --messages FILE.json | --file F.jsonl)\n"
        "                       [--adapter [NAME=]DIR|base ...] [--max-new-tokens N]\n"
        "                       [--temperature T] [--top-p P] [--top-k K] [--seed S]\n"
        "                       [--batch-size N] [--device auto|cpu|cuda] [--threads N]\n"
        "                       [--method qlora|lora] [--no-double-quant]\n"
        "                       [--chat-template chatml|llama3|none]\n"
        "                       [--no-cache] [--json] [--top-logits N]\n\n"
        "Continues each prompt (one user turn, or a conversation) until the model's end-of-turn\n"
        "or EOS token, or N new tokens (default 64), under each adapter given (the bare base\n"
        "when none is, or with --adapter base); a --file line may name its own adapter.\n"
        "  --temperature   0 (the default) is greedy; > 0 samples, seeded by --seed (default 0)\n"
        "  --top-p, --top-k  keep the most likely ids only (with --temperature > 0)\n"
        "  --batch-size    sequences decoded together (default 16)\n"
        "  --threads       CPU backend threads (default 0: the CPUs this process may use)\n"
        "  --method        qlora (NF4 base, the default) or lora (the base's precision)\n"
        "  --no-cache      recompute the whole sequence at every token (the reference)\n"
        "  --json          one JSON object per prompt and adapter: prompt, adapter, text,\n"
        "                  tokens, prompt_tokens, stop, timing (docs/generate.md)\n"
        "  --top-logits N  with --json: each step's N largest logits ([id, logit] pairs)\n"
        "A --file line is {\"prompt\": TEXT}, {\"messages\": [...]} or {\"ids\": [ID, ...]}\n"
        "(token ids used as they are, no template), with an optional \"adapter\": NAME.\n");
}

enum {
    G_PROMPT = 1000,
    G_MESSAGES,
    G_FILE,
    G_ADAPTER,
    G_MAXNEW,
    G_TEMP,
    G_TOPP,
    G_TOPK,
    G_SEED,
    G_BATCH,
    G_DEVICE,
    G_THREADS,
    G_METHOD,
    G_NODQ,
    G_TMPL,
    G_NOCACHE,
    G_JSON,
    G_TOPLOGITS,
    G_HELP
};

/* An adapter slot: NULL dir is the bare base. */
typedef struct slot {
    const char *name, *dir;
    tdm_lora *lora;
    bool named_only; /* added for the lines that name "base": not for the others */
} slot;

/* One prompt: a text (one user turn) or a conversation, and maybe the adapter it names. */
typedef struct prompt {
    json_t *messages; /* array of {"role", "content"}, or NULL */
    char *text;       /* one user turn, or NULL */
    char *adapter;    /* the slot it runs under (NULL: every slot) */
    char *where;      /* "FILE:LINE" or "--prompt", for messages */
    bool given_ids;   /* "ids": the prompt is ids, used as they are (no template) */
    tdm_token_ids ids;
} prompt;

static void print_note(const char *line, void *user)
{
    (void)user;
    fprintf(stderr, "tandem: %s\n", line);
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

/* The tokens that end an answer: EOS and the template's end-of-turn token. Warns when the
 * template ends a turn with a token that is not the EOS (both stop generation then), or when
 * there is no stop token at all (answers run to --max-new-tokens). */
static int stop_ids(const tdm_tokenizer *tok, const char *model_dir, tdm_chat_template t,
                    int32_t ids[2], int32_t *eos_out)
{
    int n = 0;
    int32_t eos = tdm_data_find_eos(tok, model_dir), id;
    *eos_out = eos;
    if (eos >= 0) ids[n++] = eos;
    const char *eot = t == TDM_CHAT_CHATML   ? "<|im_end|>"
                      : t == TDM_CHAT_LLAMA3 ? "<|eot_id|>"
                                             : NULL;
    if (eot && !tdm_tokenizer_token_id(tok, eot, &id)) {
        fprintf(stderr,
                "tandem: warning: the %s template ends a turn with %s, which %s's tokenizer does "
                "not have; only EOS stops an answer\n",
                tdm_chat_template_name(t), eot, model_dir);
    } else if (eot && id != eos) {
        size_t nl = 0;
        const char *name = eos >= 0 ? tdm_tokenizer_token_text(tok, eos, &nl) : NULL;
        fprintf(stderr,
                "tandem: warning: the %s template ends a turn with %s (id %d) but the tokenizer's "
                "EOS is %.*s (id %d): generation stops at either\n",
                tdm_chat_template_name(t), eot, id, name ? (int)nl : 4, name ? name : "none", eos);
        ids[n++] = id;
    }
    if (n == 0)
        fprintf(stderr,
                "tandem: warning: %s has no EOS token and the template no end-of-turn token: "
                "every answer runs to --max-new-tokens\n",
                model_dir);
    return n;
}

/* The messages of a JSON value: an array of {"role": STR, "content": STR} (or an object with
 * "messages"). Returns NULL with a message into why. */
static json_t *messages_of(json_t *v, char *why, size_t cap)
{
    if (json_is_object(v) && json_object_get(v, "messages")) v = json_object_get(v, "messages");
    if (!json_is_array(v) || json_array_size(v) == 0) {
        snprintf(why, cap, "expected a non-empty array of {\"role\", \"content\"} messages");
        return NULL;
    }
    size_t i;
    json_t *m;
    json_array_foreach(v, i, m)
    {
        if (!json_is_string(json_object_get(m, "role")) ||
            !json_is_string(json_object_get(m, "content"))) {
            snprintf(why, cap, "message %zu needs string \"role\" and \"content\"", i);
            return NULL;
        }
    }
    return json_incref(v);
}

/* A --file line's "ids": a non-empty array of integers >= 0 (the model's vocabulary is checked
 * once the config is read), kept in q->ids as they are. */
static int read_ids(json_t *ids, prompt *q, const char *path, int line)
{
    if (!json_is_array(ids) || json_array_size(ids) == 0)
        return tdm_cli_fail(TDM_EXIT_USAGE, "%s:%d: \"ids\" must be a non-empty array of token ids",
                            path, line);
    size_t i;
    json_t *v;
    tdm_error err = {0};
    json_array_foreach(ids, i, v)
    {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return tdm_cli_fail(TDM_EXIT_USAGE, "%s:%d: \"ids\"[%zu] is not a token id", path, line,
                                i);
        int32_t id = (int32_t)json_integer_value(v);
        if (tdm_token_ids_append(&q->ids, &id, 1, &err) != TDM_OK) return tdm_cli_fail_err(&err);
    }
    q->given_ids = true;
    return 0;
}

/* Reads --file: one JSON object per line with "prompt" (a user turn), "messages" or "ids", and
 * an optional "adapter". Returns 0 or an exit code after printing the error. */
static int read_prompt_file(const char *path, prompt **out, size_t *n_out)
{
    char *text;
    size_t len;
    tdm_error err = {0};
    if (tdm_read_file(path, &text, &len, &err) != TDM_OK) return tdm_cli_fail_err(&err);
    prompt *ps = NULL;
    size_t n = 0, cap = 0;
    int code = 0, line = 0;
    for (char *p = text, *end = text + len; p < end && !code;) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *stop = nl ? nl : end;
        line++;
        size_t l = (size_t)(stop - p);
        char *s = p;
        p = nl ? nl + 1 : end;
        while (l > 0 && (s[l - 1] == '\r' || s[l - 1] == ' ' || s[l - 1] == '\t'))
            l--;
        if (l == 0) continue;
        json_error_t je;
        json_t *j = json_loadb(s, l, 0, &je);
        char why[200] = "";
        if (!j || !json_is_object(j)) {
            code = tdm_cli_fail(TDM_EXIT_USAGE, "%s:%d: %s", path, line,
                                j ? "expected a JSON object" : je.text);
            json_decref(j);
            break;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            prompt *np = realloc(ps, cap * sizeof *np);
            if (!np) {
                json_decref(j);
                code = tdm_cli_fail(TDM_EXIT_FAILURE, "out of memory");
                break;
            }
            ps = np;
        }
        prompt *q = &ps[n];
        memset(q, 0, sizeof *q);
        json_t *pr = json_object_get(j, "prompt"), *ad = json_object_get(j, "adapter");
        json_t *ids = json_object_get(j, "ids");
        if (json_is_string(pr))
            q->text = strdup(json_string_value(pr));
        else if (ids)
            code = read_ids(ids, q, path, line);
        else if (json_object_get(j, "messages") && !(q->messages = messages_of(j, why, sizeof why)))
            code = tdm_cli_fail(TDM_EXIT_USAGE, "%s:%d: \"messages\": %s", path, line, why);
        else if (!json_object_get(j, "messages"))
            code = tdm_cli_fail(TDM_EXIT_USAGE,
                                "%s:%d: a line needs \"prompt\": TEXT, \"messages\": [...] or "
                                "\"ids\": [...]",
                                path, line);
        if (!code && ad && !json_is_string(ad) && !json_is_null(ad))
            code = tdm_cli_fail(TDM_EXIT_USAGE, "%s:%d: \"adapter\" must be a name or null", path,
                                line);
        if (!code && json_is_string(ad)) q->adapter = strdup(json_string_value(ad));
        char where[600];
        snprintf(where, sizeof where, "%s:%d", path, line);
        q->where = strdup(where);
        n++;
        json_decref(j);
    }
    free(text);
    if (!code && n == 0) code = tdm_cli_fail(TDM_EXIT_USAGE, "%s: no prompts", path);
    *out = ps, *n_out = n;
    return code;
}

static int read_messages_file(const char *path, prompt *q)
{
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j)
        return tdm_cli_fail(TDM_EXIT_USAGE, "%s:%d: %s", path, je.line > 0 ? je.line : 1, je.text);
    char why[200];
    q->messages = messages_of(j, why, sizeof why);
    json_decref(j);
    if (!q->messages) return tdm_cli_fail(TDM_EXIT_USAGE, "%s: %s", path, why);
    q->where = strdup(path);
    return 0;
}

/* Renders a prompt into its ids. */
static int render(tdm_tokenizer *tok, tdm_chat_template tmpl, int32_t eos, prompt *q)
{
    tdm_error err = {0};
    tdm_status st;
    if (q->given_ids) return 0;
    if (q->text) {
        st = tdm_data_render_prompt(tok, tmpl, q->text, strlen(q->text), &q->ids, &err);
    } else {
        size_t n = json_array_size(q->messages);
        tdm_chat_message *m = calloc(n, sizeof *m);
        if (!m) return tdm_cli_fail(TDM_EXIT_FAILURE, "out of memory");
        for (size_t i = 0; i < n; i++) {
            json_t *e = json_array_get(q->messages, i);
            m[i].role = json_string_value(json_object_get(e, "role"));
            m[i].content = json_string_value(json_object_get(e, "content"));
            m[i].content_len = json_string_length(json_object_get(e, "content"));
        }
        st = tdm_data_render_messages_prompt(tok, tmpl, m, n, eos, &q->ids, &err);
        free(m);
    }
    if (st != TDM_OK) return tdm_cli_fail(TDM_EXIT_USAGE, "%s: %s", q->where, err.message);
    return 0;
}

static json_t *ids_json(const int32_t *ids, int64_t n)
{
    json_t *a = json_array();
    for (int64_t i = 0; a && i < n; i++)
        json_array_append_new(a, json_integer(ids[i]));
    return a;
}

/* --top-logits: for each step, its largest logits as [[id, logit], ...]. */
static json_t *top_json(const tdm_generate_result *r)
{
    json_t *steps = json_array();
    for (int64_t i = 0; steps && i < r->n_steps; i++) {
        json_t *step = json_array();
        for (int64_t k = 0; step && k < r->n_top; k++) {
            size_t at = (size_t)(i * r->n_top + k);
            json_array_append_new(
                step, json_pack("[i, f]", (int)r->top_ids[at], (double)r->top_logits[at]));
        }
        json_array_append_new(steps, step);
    }
    return steps;
}

int tdm_cmd_generate(int argc, char **argv)
{
    static const struct option longopts[] = {{"prompt", required_argument, NULL, G_PROMPT},
                                             {"messages", required_argument, NULL, G_MESSAGES},
                                             {"file", required_argument, NULL, G_FILE},
                                             {"adapter", required_argument, NULL, G_ADAPTER},
                                             {"max-new-tokens", required_argument, NULL, G_MAXNEW},
                                             {"temperature", required_argument, NULL, G_TEMP},
                                             {"top-p", required_argument, NULL, G_TOPP},
                                             {"top-k", required_argument, NULL, G_TOPK},
                                             {"seed", required_argument, NULL, G_SEED},
                                             {"batch-size", required_argument, NULL, G_BATCH},
                                             {"device", required_argument, NULL, G_DEVICE},
                                             {"threads", required_argument, NULL, G_THREADS},
                                             {"method", required_argument, NULL, G_METHOD},
                                             {"no-double-quant", no_argument, NULL, G_NODQ},
                                             {"chat-template", required_argument, NULL, G_TMPL},
                                             {"no-cache", no_argument, NULL, G_NOCACHE},
                                             {"json", no_argument, NULL, G_JSON},
                                             {"top-logits", required_argument, NULL, G_TOPLOGITS},
                                             {"help", no_argument, NULL, G_HELP},
                                             {NULL, 0, NULL, 0}};
    const char *prompt_text = NULL, *messages_file = NULL, *prompt_file = NULL;
    const char *device = "auto";
    slot slots[64];
    int n_slots = 0;
    bool nf4 = true, dq = true, json = false, tmpl_given = false, no_cache = false;
    long max_new = 64, top_k = 0, batch = 16, seed = 0, n_top = 0, threads = 0;
    double temperature = 0, top_p = 1;
    tdm_chat_template tmpl = TDM_CHAT_NONE;
    tdm_error err = {0};
    optind = 1;
    opterr = 0;
    int ch;
    while ((ch = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (ch) {
        case G_PROMPT:
            prompt_text = optarg;
            break;
        case G_MESSAGES:
            messages_file = optarg;
            break;
        case G_FILE:
            prompt_file = optarg;
            break;
        case G_ADAPTER: {
            if (n_slots == 63)
                return tdm_cli_fail(TDM_EXIT_USAGE, "generate: at most 63 --adapter options");
            /* NAME=DIR when '=' comes before any '/'; "base" is the bare base model */
            char *eq = strchr(optarg, '='), *sl = strchr(optarg, '/');
            slot *s = &slots[n_slots++];
            if (eq && (!sl || eq < sl)) {
                *eq = '\0';
                s->name = optarg, s->dir = eq + 1;
            } else {
                s->name = optarg, s->dir = optarg;
            }
            if (!strcmp(s->dir, "base")) s->dir = NULL;
            if (!*s->name || (s->dir && !*s->dir))
                return tdm_cli_fail(TDM_EXIT_USAGE, "generate: --adapter needs [NAME=]DIR");
            break;
        }
        case G_MAXNEW:
            if (!tdm_cli_parse_long(optarg, &max_new) || max_new < 1 || max_new > (1L << 20))
                return tdm_cli_fail(TDM_EXIT_USAGE,
                                    "generate: --max-new-tokens needs an integer >= 1");
            break;
        case G_TEMP:
            if (!tdm_cli_parse_double(optarg, &temperature) || !(temperature >= 0) ||
                isinf(temperature))
                return tdm_cli_fail(TDM_EXIT_USAGE, "generate: --temperature needs a number >= 0");
            break;
        case G_TOPP:
            if (!tdm_cli_parse_double(optarg, &top_p) || !(top_p > 0 && top_p <= 1))
                return tdm_cli_fail(TDM_EXIT_USAGE, "generate: --top-p needs a number in (0, 1]");
            break;
        case G_TOPK:
            if (!tdm_cli_parse_long(optarg, &top_k) || top_k < 0)
                return tdm_cli_fail(TDM_EXIT_USAGE, "generate: --top-k needs an integer >= 0");
            break;
        case G_SEED:
            if (!tdm_cli_parse_long(optarg, &seed) || seed < 0)
                return tdm_cli_fail(TDM_EXIT_USAGE, "generate: --seed needs an integer >= 0");
            break;
        case G_BATCH:
            if (!tdm_cli_parse_long(optarg, &batch) || batch < 1 || batch > 4096)
                return tdm_cli_fail(TDM_EXIT_USAGE, "generate: --batch-size needs 1..4096");
            break;
        case G_DEVICE:
            if (strcmp(optarg, "auto") && strcmp(optarg, "cpu") && strcmp(optarg, "cuda"))
                return tdm_cli_fail(TDM_EXIT_USAGE,
                                    "generate: --device: '%s' is not auto, cpu or cuda", optarg);
            device = optarg;
            break;
        case G_THREADS:
            if (!tdm_cli_parse_long(optarg, &threads) || threads < 0 || threads > 4096)
                return tdm_cli_fail(TDM_EXIT_USAGE, "generate: --threads needs 0..4096");
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
        case G_NOCACHE:
            no_cache = true;
            break;
        case G_JSON:
            json = true;
            break;
        case G_TOPLOGITS:
            if (!tdm_cli_parse_long(optarg, &n_top) || n_top < 1 || n_top > (1L << 24))
                return tdm_cli_fail(TDM_EXIT_USAGE, "generate: --top-logits needs an integer >= 1");
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
    if (!!prompt_text + !!messages_file + !!prompt_file != 1)
        return tdm_cli_fail(TDM_EXIT_USAGE,
                            "generate: give one of --prompt TEXT, --messages FILE.json or --file "
                            "PROMPTS.jsonl");
    if (n_top && !json) return tdm_cli_fail(TDM_EXIT_USAGE, "generate: --top-logits needs --json");
    if (n_slots == 0) slots[n_slots++] = (slot){"base", NULL, NULL, false};
    const char *model_dir = argv[optind];

    int code = TDM_EXIT_OK;
    prompt *ps = NULL;
    size_t n_ps = 0;
    tdm_generate_request *reqs = NULL;
    tdm_generate_result *res = NULL;
    size_t n_req = 0; /* read at out: even when a goto leaves before the requests are built */
    int *req_prompt = NULL;
    tdm_device dev = {0};
    tdm_model *m = NULL;
    tdm_lora *loras[64] = {NULL};
    tdm_tokenizer tok;
    if (prompt_file) {
        code = read_prompt_file(prompt_file, &ps, &n_ps);
    } else {
        ps = calloc(1, sizeof *ps);
        n_ps = ps ? 1 : 0;
        if (!ps) return tdm_cli_fail(TDM_EXIT_FAILURE, "out of memory");
        if (messages_file)
            code = read_messages_file(messages_file, ps);
        else
            ps->text = strdup(prompt_text), ps->where = strdup("--prompt");
    }
    bool tok_loaded = false;
    if (!code && tdm_tokenizer_load(&tok, model_dir, &err) != TDM_OK) code = tdm_cli_fail_err(&err);
    tok_loaded = !code;
    if (code) goto out;
    if (!tmpl_given) tmpl = tdm_chat_template_detect(&tok);
    int32_t stops[2], eos;
    int n_stop = stop_ids(&tok, model_dir, tmpl, stops, &eos);
    /* requests: each prompt under the slot it names, or under every slot */
    for (size_t i = 0; !code && i < n_ps; i++) {
        code = render(&tok, tmpl, eos, &ps[i]);
        n_req += ps[i].adapter ? 1 : (size_t)n_slots;
    }
    if (code) goto out;
    reqs = calloc(n_req, sizeof *reqs);
    res = calloc(n_req, sizeof *res);
    req_prompt = calloc(n_req, sizeof *req_prompt);
    if (!reqs || !res || !req_prompt) {
        code = tdm_cli_fail(TDM_EXIT_FAILURE, "out of memory");
        goto out;
    }
    size_t k = 0;
    int64_t longest = 0;
    for (size_t i = 0; i < n_ps; i++) {
        for (int s = 0; s < n_slots; s++) {
            if (!ps[i].adapter && slots[s].named_only) continue;
            if (ps[i].adapter && strcmp(ps[i].adapter, slots[s].name) &&
                (!slots[s].dir || strcmp(ps[i].adapter, slots[s].dir)))
                continue;
            reqs[k] = (tdm_generate_request){ps[i].ids.ids, (int64_t)ps[i].ids.len, s, k};
            req_prompt[k++] = (int)i;
            if (ps[i].adapter) break;
        }
        if (ps[i].adapter && (k == 0 || req_prompt[k - 1] != (int)i)) {
            if (strcmp(ps[i].adapter, "base") == 0) { /* the bare base, for these lines only */
                slots[n_slots] = (slot){"base", NULL, NULL, true};
                reqs[k] = (tdm_generate_request){ps[i].ids.ids, (int64_t)ps[i].ids.len, n_slots, k};
                req_prompt[k++] = (int)i;
                n_slots++;
            } else {
                code = tdm_cli_fail(TDM_EXIT_USAGE,
                                    "%s: adapter '%s' is not one of the --adapter options",
                                    ps[i].where, ps[i].adapter);
                goto out;
            }
        }
        if ((int64_t)ps[i].ids.len > longest) longest = (int64_t)ps[i].ids.len;
    }
    n_req = k;

    /* the device, as eval opens it (src/run/device_open.c): the reservation covers the weights,
     * the adapters, the prefill of the largest batch and the KV cache */
    tdm_model_config cfg;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    if (tdm_model_config_load(&cfg, path, &err) != TDM_OK) {
        code = tdm_cli_fail_err(&err);
        goto out;
    }
    for (size_t i = 0; i < n_ps; i++)
        for (size_t j = 0; ps[i].given_ids && j < ps[i].ids.len; j++)
            if (ps[i].ids.ids[j] >= cfg.vocab_size) {
                code = tdm_cli_fail(
                    TDM_EXIT_USAGE, "%s: \"ids\"[%zu] = %d is outside %s's vocabulary (%lld ids)",
                    ps[i].where, j, ps[i].ids.ids[j], model_dir, (long long)cfg.vocab_size);
                goto out;
            }
    /* an adapter whose run recorded another base model is refused, as eval refuses it
     * (train/run_records.h); one without that record (made elsewhere) is used as it is */
    for (int s = 0; s < n_slots; s++)
        if (slots[s].dir && tdm_adapter_check_base(slots[s].dir, model_dir, &err) != TDM_OK) {
            code = tdm_cli_fail(TDM_EXIT_FAILURE, "generate: %s", err.message);
            goto out;
        }
    /* dense_embed: the logits of a decoded token are one row's product with the lm_head, where
     * a bf16 table widened per token was slower than an f32 one (model.h) */
    tdm_model_opts mo = {.nf4 = nf4, .double_quant = nf4 && dq, .dense_embed = true};
    int64_t B = batch < (long)n_req ? batch : (int64_t)n_req;
    tdm_model_mem_plan plan = {.rows = B * longest,
                               .n_seqs = B,
                               .max_rank = 64,
                               .targets = (1u << TDM_LORA_N_TARGETS) - 1};
    tdm_device_request req = {.device = device,
                              .threads = (int)threads,
                              .task = "generate",
                              .timeout_sec = 3600,
                              .note = print_note};
    bool cpu = !strcmp(device, "cpu");
    tdm_model_mem est;
    if (!cpu) {
        if (tdm_model_memory_estimate(&cfg, &mo, TDM_BE_BF16, &plan, &est, &err) != TDM_OK) {
            code = tdm_cli_fail_err(&err);
            goto out;
        }
        int64_t cap = longest + max_new < cfg.max_position_embeddings ? longest + max_new
                                                                      : cfg.max_position_embeddings;
        est.activations += tdm_kv_cache_bytes(&cfg, TDM_BE_BF16, B, cap);
        est.adapters = 0;
        for (int s = 0; s < n_slots; s++) /* an estimate: rank 64 on every module */
            if (slots[s].dir)
                est.adapters += (uint64_t)cfg.num_layers * 64 * 4 *
                                (uint64_t)(7 * cfg.hidden_size + 3 * cfg.intermediate_size);
    }
    if (tdm_device_open(&dev, &req, cpu ? NULL : &est, &err) != TDM_OK ||
        tdm_model_load(&m, dev.be, model_dir, &mo, &err) != TDM_OK) {
        code = tdm_cli_fail_err(&err);
        goto out;
    }
    for (int s = 0; s < n_slots; s++)
        if (slots[s].dir &&
            tdm_generate_load_adapter(m, slots[s].dir, &slots[s].lora, &err) != TDM_OK) {
            code = tdm_cli_fail_err(&err);
            goto out;
        }
    for (int s = 0; s < n_slots; s++)
        loras[s] = slots[s].lora;
    tdm_device_record_actual(&dev, false, NULL, NULL);
    tdm_generate_opts go = {.max_new_tokens = max_new,
                            .stop_ids = stops,
                            .n_stop = n_stop,
                            .n_candidates = tok.n_ids, /* never an id the tokenizer cannot decode */
                            .sampling = {.temperature = temperature,
                                         .top_k = top_k,
                                         .top_p = top_p,
                                         .seed = (uint64_t)seed},
                            .max_batch = batch,
                            .no_cache = no_cache,
                            .n_top = n_top};
    if (tdm_generate(m, loras, n_slots, reqs, (int64_t)n_req, &go, res, &err) != TDM_OK) {
        code = tdm_cli_fail_err(&err);
        goto out;
    }
    bool one = n_req == 1;
    for (size_t i = 0; i < n_req && !code; i++) {
        const tdm_generate_result *r = &res[i];
        const prompt *q = &ps[req_prompt[i]];
        const slot *sl = &slots[reqs[i].adapter];
        char *text = NULL;
        size_t text_len = 0, text_cap = 0;
        if (tdm_tokenizer_decode(&tok, r->tokens, (size_t)r->n_tokens, true, &text, &text_len,
                                 &text_cap, &err) != TDM_OK) {
            code = tdm_cli_fail_err(&err);
            break;
        }
        if (json) {
            char *valid = utf8_lossy(text ? text : "", text_len);
            double tps = r->decode_sec > 0 ? (double)(r->n_tokens > 1 ? r->n_tokens - 1 : 0) *
                                                 (double)r->batch_size / r->decode_sec
                                           : 0;
            json_t *j =
                valid ? json_pack("{s:o, s:s?, s:s, s:o, s:I, s:s, s:I, s:{s:f, s:f, s:f, "
                                  "s:I, s:b}}",
                                  "prompt",
                                  q->text        ? json_string(q->text)
                                  : q->given_ids ? ids_json(q->ids.ids, (int64_t)q->ids.len)
                                                 : json_incref(q->messages),
                                  "adapter", sl->dir ? sl->name : NULL, "text", valid, "tokens",
                                  ids_json(r->tokens, r->n_tokens), "prompt_tokens",
                                  (json_int_t)q->ids.len, "stop", tdm_generate_stop_name(r->why),
                                  "index", (json_int_t)req_prompt[i], "timing", "prefill_s",
                                  r->prefill_sec, "decode_s", r->decode_sec, "batch_tokens_per_s",
                                  tps, "batch_size", (json_int_t)r->batch_size, "kv_cache",
                                  r->kv_cache)
                      : NULL;
            if (j && r->n_top > 0) json_object_set_new(j, "top", top_json(r));
            char *s = j ? json_dumps(j, JSON_SORT_KEYS | JSON_COMPACT) : NULL;
            if (s)
                printf("%s\n", s);
            else
                code = tdm_cli_fail(TDM_EXIT_FAILURE, "out of memory");
            free(s);
            free(valid);
            json_decref(j);
        } else {
            if (!one)
                printf("### %s | %s\n", sl->dir ? sl->name : "base", q->text ? q->text : q->where);
            if (text_len) fwrite(text, 1, text_len, stdout);
            putchar('\n');
        }
        free(text);
    }
out:
    for (int s = 0; s < n_slots; s++)
        tdm_lora_free(slots[s].lora);
    tdm_model_free(m);
    tdm_device_close(&dev);
    for (size_t i = 0; i < n_req && res; i++)
        tdm_generate_result_free(&res[i]);
    free(res), free(reqs), free(req_prompt);
    for (size_t i = 0; i < n_ps; i++) {
        json_decref(ps[i].messages);
        free(ps[i].text), free(ps[i].adapter), free(ps[i].where);
        tdm_token_ids_free(&ps[i].ids);
    }
    free(ps);
    if (tok_loaded) tdm_tokenizer_free(&tok);
    return code;
}
