/* tokenize.c — `tandem tokenize PATH [--text STR | --file F.jsonl | --chat F.jsonl |
 * --decode IDS] [--add-special] [--chat-template chatml|llama3|none] [--stats]`: encodes text
 * with a model directory's (or a
 * tokenizer.json's) tokenizer and prints {"ids": [...]} lines. With --file, every input line is a
 * JSON object {"text": "..."}; one output line per input line, in order. With --chat, every line
 * is {"messages": [{"role": ..., "content": ...}, ...]}, rendered with the chat template (detected
 * from the tokenizer unless --chat-template names one) and printed as {"ids": [...], "mask": [...]}
 * (mask 1 = assistant response). --decode prints the text of token ids. With none of them,
 * standard input is encoded as one text.
 */
#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "util/timeutil.h"

static void usage(FILE *out)
{
    fputs(
        "usage: tandem tokenize PATH [--text STR | --file F.jsonl | --chat F.jsonl | "
        "--decode IDS]\n"
        "                      [--add-special] [--chat-template chatml|llama3|none] [--stats]\n"
        "\n"
        "PATH is a model directory holding tokenizer.json, or a tokenizer.json file.\n"
        "  --text STR      encode STR (UTF-8)\n"
        "  --file F.jsonl  encode the \"text\" of every line ({\"text\": ...}); '-' = stdin\n"
        "  --chat F.jsonl  render every line's {\"messages\": [{\"role\", \"content\"}...]} with\n"
        "                  the chat template and print {\"ids\": [...], \"mask\": [...]}\n"
        "                  (mask 1 = assistant response tokens)\n"
        "  --decode IDS    print the text of token ids: \"1,2,3\", \"1 2 3\", a JSON list, or a\n"
        "                  {\"ids\": [...]} line as the other modes print; special tokens kept\n"
        "  --chat-template NAME  chatml, llama3 or none (default: from the tokenizer's tokens)\n"
        "  --add-special   add what the tokenizer's post_processor adds (not with --chat)\n"
        "  --stats         print load and encode times, texts, tokens and bytes on stderr\n"
        "Without --text, --file or --chat, standard input is encoded as one text.\n"
        "Prints one {\"ids\": [...]} line per text.\n",
        out);
}

/* --stats counters */
static long stat_texts, stat_tokens, stat_bytes;
static int64_t stat_encode_ns;

static void print_ids(FILE *out, const tdm_token_ids *ids)
{
    fputs("{\"ids\": [", out);
    for (size_t i = 0; i < ids->len; i++)
        fprintf(out, i ? ", %d" : "%d", ids->ids[i]);
    fputs("]}\n", out);
}

static int encode_one(tdm_tokenizer *tok, const char *text, size_t len, bool add_special,
                      tdm_token_ids *ids, const char *where)
{
    tdm_error err = {0};
    ids->len = 0;
    int64_t t0 = tdm_now_mono_ns();
    tdm_status st = tdm_tokenizer_encode(tok, text, len, add_special, ids, &err);
    stat_encode_ns += tdm_now_mono_ns() - t0;
    stat_texts++;
    stat_tokens += (long)ids->len;
    stat_bytes += (long)len;
    if (st != TDM_OK) {
        if (where) tdm_error_prefix(&err, "%s", where);
        return tdm_cli_fail_err(&err);
    }
    print_ids(stdout, ids);
    return TDM_EXIT_OK;
}

static int encode_jsonl(tdm_tokenizer *tok, const char *file, bool add_special, tdm_token_ids *ids)
{
    FILE *in = strcmp(file, "-") ? fopen(file, "r") : stdin;
    if (!in) return tdm_cli_fail(TDM_EXIT_FAILURE, "%s: cannot open: %m", file);
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long lineno = 0;
    int rc = TDM_EXIT_OK;
    while (rc == TDM_EXIT_OK && (n = getline(&line, &cap, in)) >= 0) {
        lineno++;
        json_error_t je;
        json_t *obj = json_loadb(line, (size_t)n, JSON_ALLOW_NUL, &je);
        const json_t *text = json_object_get(obj, "text");
        if (!obj) {
            rc = tdm_cli_fail(TDM_EXIT_USAGE, "%s:%ld:%d: %s", file, lineno, je.column, je.text);
        } else if (!json_is_string(text)) {
            rc = tdm_cli_fail(TDM_EXIT_USAGE,
                              "%s:%ld: expected an object with a string \"text\" field", file,
                              lineno);
        } else {
            char where[512];
            snprintf(where, sizeof where, "%s:%ld", file, lineno);
            rc = encode_one(tok, json_string_value(text), json_string_length(text), add_special,
                            ids, where);
        }
        json_decref(obj);
    }
    if (rc == TDM_EXIT_OK && ferror(in))
        rc = tdm_cli_fail(TDM_EXIT_FAILURE, "%s: read error", file);
    free(line);
    if (in != stdin) fclose(in);
    return rc;
}

static void print_list(FILE *out, const char *name, const tdm_token_ids *v, bool first)
{
    fprintf(out, first ? "{\"%s\": [" : ", \"%s\": [", name);
    for (size_t i = 0; i < v->len; i++)
        fprintf(out, i ? ", %d" : "%d", v->ids[i]);
    fputc(']', out);
}

/* One {"messages": [...]} line: render, encode per segment, print ids and mask. */
static int encode_chat_line(tdm_tokenizer *tok, tdm_chat_template tmpl, const json_t *obj,
                            const char *where)
{
    const json_t *msgs = json_object_get(obj, "messages");
    if (!json_is_array(msgs))
        return tdm_cli_fail(TDM_EXIT_USAGE, "%s: expected an object with a \"messages\" list",
                            where);
    size_t n = json_array_size(msgs);
    tdm_chat_message *m = calloc(n ? n : 1, sizeof *m);
    if (!m) return tdm_cli_fail(TDM_EXIT_FAILURE, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *msg = json_array_get(msgs, i);
        const json_t *role = json_object_get(msg, "role"),
                     *content = json_object_get(msg, "content");
        if (!json_is_string(role) || !json_is_string(content)) {
            free(m);
            return tdm_cli_fail(TDM_EXIT_USAGE,
                                "%s: messages[%zu] needs string \"role\" and \"content\"", where,
                                i);
        }
        m[i] = (tdm_chat_message){json_string_value(role), json_string_value(content),
                                  json_string_length(content)};
    }
    tdm_chat_rendered r;
    tdm_token_ids ids = {0}, mask = {0};
    tdm_error err = {0};
    tdm_status st = tdm_chat_render(tmpl, m, n, false, &r, &err);
    free(m);
    if (st == TDM_OK) {
        st = tdm_chat_encode(tok, &r, &ids, &mask, &err);
        tdm_chat_rendered_free(&r);
    }
    int rc = TDM_EXIT_OK;
    if (st != TDM_OK) {
        tdm_error_prefix(&err, "%s", where);
        rc = tdm_cli_fail_err(&err);
    } else {
        print_list(stdout, "ids", &ids, true);
        print_list(stdout, "mask", &mask, false);
        fputs("}\n", stdout);
    }
    tdm_token_ids_free(&ids);
    tdm_token_ids_free(&mask);
    return rc;
}

static int encode_chat(tdm_tokenizer *tok, const char *file, tdm_chat_template tmpl)
{
    FILE *in = strcmp(file, "-") ? fopen(file, "r") : stdin;
    if (!in) return tdm_cli_fail(TDM_EXIT_FAILURE, "%s: cannot open: %m", file);
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long lineno = 0;
    int rc = TDM_EXIT_OK;
    while (rc == TDM_EXIT_OK && (n = getline(&line, &cap, in)) >= 0) {
        lineno++;
        json_error_t je;
        json_t *obj = json_loadb(line, (size_t)n, JSON_ALLOW_NUL, &je);
        char where[512];
        snprintf(where, sizeof where, "%s:%ld", file, lineno);
        if (!obj)
            rc = tdm_cli_fail(TDM_EXIT_USAGE, "%s:%d: %s", where, je.column, je.text);
        else
            rc = encode_chat_line(tok, tmpl, obj, where);
        json_decref(obj);
    }
    free(line);
    if (in != stdin) fclose(in);
    return rc;
}

static int push_id(tdm_token_ids *ids, int32_t id)
{
    tdm_error err = {0};
    if (tdm_token_ids_append(ids, &id, 1, &err) != TDM_OK) return tdm_cli_fail_err(&err);
    return TDM_EXIT_OK;
}

/* The ids of --decode's argument into *ids: integers separated by commas and/or white space, a
 * JSON list of them, or a {"ids": [...]} object. A usage failure names the bad item. */
static int parse_ids(const char *arg, tdm_token_ids *ids)
{
    while (*arg == ' ' || *arg == '\t' || *arg == '\n') arg++;
    if (*arg == '[' || *arg == '{') {
        json_error_t je;
        json_t *doc = json_loads(arg, JSON_DECODE_ANY, &je);
        json_t *list = json_is_object(doc) ? json_object_get(doc, "ids") : doc;
        int rc = TDM_EXIT_OK;
        if (!doc)
            rc = tdm_cli_fail(TDM_EXIT_USAGE, "tokenize: --decode: column %d: %s", je.column,
                              je.text);
        else if (!json_is_array(list))
            rc = tdm_cli_fail(TDM_EXIT_USAGE, "tokenize: --decode: expected a list of ids or an "
                              "object {\"ids\": [...]}");
        for (size_t i = 0; rc == TDM_EXIT_OK && i < json_array_size(list); i++) {
            json_t *v = json_array_get(list, i);
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                json_integer_value(v) > INT32_MAX)
                rc = tdm_cli_fail(TDM_EXIT_USAGE,
                                  "tokenize: --decode: item %zu is not a token id (an integer "
                                  ">= 0)", i + 1);
            else if (push_id(ids, (int32_t)json_integer_value(v)) != TDM_EXIT_OK)
                rc = TDM_EXIT_FAILURE;
        }
        json_decref(doc);
        return rc;
    }
    size_t item = 0;
    for (const char *p = arg; *p;) {
        if (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n') {
            p++;
            continue;
        }
        item++;
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX ||
            (*end && !strchr(", \t\n", *end))) {
            int len = (int)strcspn(p, ", \t\n");
            return tdm_cli_fail(TDM_EXIT_USAGE,
                                "tokenize: --decode: item %zu '%.*s' is not a token id (an "
                                "integer >= 0)", item, len, p);
        }
        if (push_id(ids, (int32_t)v) != TDM_EXIT_OK) return TDM_EXIT_FAILURE;
        p = end;
    }
    return TDM_EXIT_OK;
}

/* --decode: the bytes of the ids, then a newline. */
static int decode_ids(tdm_tokenizer *tok, const char *arg)
{
    tdm_token_ids ids = {0};
    int rc = parse_ids(arg, &ids);
    char *text = NULL;
    size_t len = 0, cap = 0;
    tdm_error err = {0};
    if (rc == TDM_EXIT_OK &&
        tdm_tokenizer_decode(tok, ids.ids, ids.len, false, &text, &len, &cap, &err) != TDM_OK) {
        tdm_error_prefix(&err, "tokenize: --decode");
        rc = tdm_cli_fail(TDM_EXIT_USAGE, "%s", err.message);
    }
    if (rc == TDM_EXIT_OK) {
        if (len) fwrite(text, 1, len, stdout); /* no ids: text is NULL */
        fputc('\n', stdout);
    }
    free(text);
    tdm_token_ids_free(&ids);
    return rc;
}

int tdm_cmd_tokenize(int argc, char **argv)
{
    const char *path = NULL, *text = NULL, *file = NULL, *chat = NULL, *tmpl_name = NULL,
               *decode = NULL;
    bool add_special = false, stats = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return TDM_EXIT_OK;
        } else if (!strcmp(a, "--add-special")) {
            add_special = true;
        } else if (!strcmp(a, "--stats")) {
            stats = true;
        } else if (!strcmp(a, "--text") || !strcmp(a, "--file") || !strcmp(a, "--chat") ||
                   !strcmp(a, "--chat-template") || !strcmp(a, "--decode")) {
            if (i + 1 >= argc) return tdm_cli_fail(TDM_EXIT_USAGE, "tokenize: %s needs a value", a);
            const char *v = argv[++i];
            if (!strcmp(a, "--text"))
                text = v;
            else if (!strcmp(a, "--file"))
                file = v;
            else if (!strcmp(a, "--chat"))
                chat = v;
            else if (!strcmp(a, "--decode"))
                decode = v;
            else
                tmpl_name = v;
        } else if (a[0] == '-' && a[1]) {
            tdm_cli_fail(TDM_EXIT_USAGE, "tokenize: unknown option '%s'", a);
            usage(stderr);
            return TDM_EXIT_USAGE;
        } else if (!path) {
            path = a;
        } else {
            return tdm_cli_fail(TDM_EXIT_USAGE, "tokenize: unexpected argument '%s'", a);
        }
    }
    if (!path) {
        usage(stderr);
        return TDM_EXIT_USAGE;
    }
    if ((text != NULL) + (file != NULL) + (chat != NULL) + (decode != NULL) > 1)
        return tdm_cli_fail(TDM_EXIT_USAGE,
                            "tokenize: give one of --text, --file, --chat and --decode");
    if (decode && (add_special || tmpl_name))
        return tdm_cli_fail(TDM_EXIT_USAGE,
                            "tokenize: --add-special and --chat-template do not apply to --decode");
    if (chat && add_special)
        return tdm_cli_fail(TDM_EXIT_USAGE,
                            "tokenize: --add-special does not apply to --chat (the template adds "
                            "the special tokens)");
    tdm_chat_template tmpl = TDM_CHAT_NONE;
    if (tmpl_name) {
        tdm_error perr = {0};
        if (tdm_chat_template_parse(tmpl_name, &tmpl, &perr) != TDM_OK)
            return tdm_cli_fail(TDM_EXIT_USAGE, "tokenize: --chat-template: %s", perr.message);
    }

    tdm_tokenizer tok;
    tdm_error err = {0};
    int64_t load_t0 = tdm_now_mono_ns();
    if (tdm_tokenizer_load(&tok, path, &err) != TDM_OK) return tdm_cli_fail_err(&err);
    int64_t load_ns = tdm_now_mono_ns() - load_t0;
    static char outbuf[1 << 16];
    setvbuf(stdout, outbuf, _IOFBF, sizeof outbuf);
    tdm_token_ids ids = {0};
    int rc;
    if (decode) {
        rc = decode_ids(&tok, decode);
    } else if (chat) {
        if (!tmpl_name) tmpl = tdm_chat_template_detect(&tok);
        rc = encode_chat(&tok, chat, tmpl);
    } else if (text) {
        rc = encode_one(&tok, text, strlen(text), add_special, &ids, "--text");
    } else if (file) {
        rc = encode_jsonl(&tok, file, add_special, &ids);
    } else {
        char *buf = NULL;
        size_t len = 0;
        FILE *mem = open_memstream(&buf, &len);
        char chunk[65536];
        size_t got;
        while (mem && (got = fread(chunk, 1, sizeof chunk, stdin)) > 0)
            fwrite(chunk, 1, got, mem);
        if (!mem || fclose(mem) != 0)
            rc = tdm_cli_fail(TDM_EXIT_FAILURE, "tokenize: cannot read standard input");
        else
            rc = encode_one(&tok, buf, len, add_special, &ids, "<stdin>");
        free(buf);
    }
    if (fflush(stdout) != 0 && rc == TDM_EXIT_OK)
        rc = tdm_cli_fail(TDM_EXIT_FAILURE, "tokenize: cannot write standard output");
    if (stats) {
        double enc_s = (double)stat_encode_ns / 1e9;
        fprintf(stderr,
                "tokenize stats: load %.3f s, encode %.3f s, %ld texts, %ld tokens, %ld bytes, "
                "%.0f tokens/s, %.2f MB/s\n",
                (double)load_ns / 1e9, enc_s, stat_texts, stat_tokens, stat_bytes,
                enc_s > 0 ? (double)stat_tokens / enc_s : 0.0,
                enc_s > 0 ? (double)stat_bytes / enc_s / 1e6 : 0.0);
    }
    tdm_token_ids_free(&ids);
    tdm_tokenizer_free(&tok);
    return rc;
}
