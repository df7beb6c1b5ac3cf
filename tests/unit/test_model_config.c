/* Unit tests of model/config and model/layout: the real config.json files of the four supported
 * families (copied from their Hugging Face repositories), the refusals, RoPE variants, parameter
 * counts checked against the published totals, and (when gen_fixtures.py has been run) configs
 * saved by transformers with the tensor names and shapes transformers itself creates. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The fixtures gen_fixtures.py writes; TANDEM_MODEL_FIXTURES points elsewhere (a fresh run). */
static const char *fixtures_dir(void)
{
    const char *d = getenv("TANDEM_MODEL_FIXTURES");
    return d && *d ? d : TANDEM_SOURCE_DIR "/tests/fixtures/model";
}

#include "model/config.h"
#include "model/layout.h"

static const char *qwen25_05b =
    "{\"architectures\":[\"Qwen2ForCausalLM\"],\"attention_dropout\":0.0,\"bos_token_id\":151643,"
    "\"eos_token_id\":151643,\"hidden_act\":\"silu\",\"hidden_size\":896,\"initializer_range\":0.02,"
    "\"intermediate_size\":4864,\"max_position_embeddings\":32768,\"max_window_layers\":24,"
    "\"model_type\":\"qwen2\",\"num_attention_heads\":14,\"num_hidden_layers\":24,"
    "\"num_key_value_heads\":2,\"rms_norm_eps\":1e-06,\"rope_theta\":1000000.0,"
    "\"sliding_window\":32768,\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\","
    "\"transformers_version\":\"4.40.1\",\"use_cache\":true,\"use_sliding_window\":false,"
    "\"vocab_size\":151936}";

static const char *llama32_1b =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
    "\"bos_token_id\":128000,\"eos_token_id\":128001,\"head_dim\":64,\"hidden_act\":\"silu\","
    "\"hidden_size\":2048,\"initializer_range\":0.02,\"intermediate_size\":8192,"
    "\"max_position_embeddings\":131072,\"mlp_bias\":false,\"model_type\":\"llama\","
    "\"num_attention_heads\":32,\"num_hidden_layers\":16,\"num_key_value_heads\":8,"
    "\"pretraining_tp\":1,\"rms_norm_eps\":1e-05,\"rope_scaling\":{\"factor\":32.0,"
    "\"high_freq_factor\":4.0,\"low_freq_factor\":1.0,\"original_max_position_embeddings\":8192,"
    "\"rope_type\":\"llama3\"},\"rope_theta\":500000.0,\"tie_word_embeddings\":true,"
    "\"torch_dtype\":\"bfloat16\",\"use_cache\":true,\"vocab_size\":128256}";

static const char *qwen3_06b =
    "{\"architectures\":[\"Qwen3ForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
    "\"bos_token_id\":151643,\"eos_token_id\":151645,\"head_dim\":128,\"hidden_act\":\"silu\","
    "\"hidden_size\":1024,\"initializer_range\":0.02,\"intermediate_size\":3072,"
    "\"max_position_embeddings\":40960,\"max_window_layers\":28,\"model_type\":\"qwen3\","
    "\"num_attention_heads\":16,\"num_hidden_layers\":28,\"num_key_value_heads\":8,"
    "\"rms_norm_eps\":1e-06,\"rope_scaling\":null,\"rope_theta\":1000000,\"sliding_window\":null,"
    "\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\",\"use_cache\":true,"
    "\"use_sliding_window\":false,\"vocab_size\":151936}";

static const char *mistral_7b_v03 =
    "{\"architectures\":[\"MistralForCausalLM\"],\"attention_dropout\":0.0,\"bos_token_id\":1,"
    "\"eos_token_id\":2,\"hidden_act\":\"silu\",\"hidden_size\":4096,\"initializer_range\":0.02,"
    "\"intermediate_size\":14336,\"max_position_embeddings\":32768,\"model_type\":\"mistral\","
    "\"num_attention_heads\":32,\"num_hidden_layers\":32,\"num_key_value_heads\":8,"
    "\"rms_norm_eps\":1e-05,\"rope_theta\":1000000.0,\"sliding_window\":null,"
    "\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\",\"vocab_size\":32768}";

static tdm_status parse(const char *text, tdm_model_config *cfg, tdm_error *err)
{
    return tdm_model_config_parse(cfg, text, strlen(text), "config.json", err);
}

/* Sum of the layout's element counts must equal the closed-form parameter count. */
static int64_t layout_params(const tdm_model_config *cfg)
{
    tdm_tensor_desc *d;
    size_t n;
    tdm_error err = {0};
    assert_int_equal(tdm_model_layout(cfg, &d, &n, &err), TDM_OK);
    int64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += d[i].shape[0] * (d[i].rank == 2 ? d[i].shape[1] : 1);
    free(d);
    return total;
}

static void test_real_configs(void **state)
{
    tdm_model_config c;
    tdm_error err = {0};
    assert_int_equal(parse(qwen25_05b, &c, &err), TDM_OK);
    assert_int_equal(c.arch, TDM_ARCH_QWEN2);
    assert_int_equal(c.head_dim, 64);
    assert_int_equal(c.num_kv_heads, 2);
    assert_true(c.qkv_bias && !c.o_bias && !c.qk_norm && c.tie_word_embeddings);
    assert_true(c.rope.type == TDM_ROPE_DEFAULT && c.rope.theta == 1e6);
    assert_true(c.rms_norm_eps == 1e-6);
    assert_string_equal(c.torch_dtype, "bfloat16");
    assert_int_equal(c.eos_token_id, 151643);
    assert_int_equal(tdm_model_config_param_count(&c), 494032768); /* published: 0.49B */
    assert_int_equal(layout_params(&c), 494032768);

    assert_int_equal(parse(llama32_1b, &c, &err), TDM_OK);
    assert_int_equal(c.arch, TDM_ARCH_LLAMA);
    assert_true(!c.qkv_bias && !c.o_bias && c.tie_word_embeddings);
    assert_int_equal(c.rope.type, TDM_ROPE_LLAMA3);
    assert_true(c.rope.theta == 500000.0 && c.rope.factor == 32.0);
    assert_true(c.rope.low_freq_factor == 1.0 && c.rope.high_freq_factor == 4.0);
    assert_int_equal(c.rope.original_max_position_embeddings, 8192);
    assert_int_equal(tdm_model_config_param_count(&c), 1235814400); /* published: 1.24B */
    assert_int_equal(layout_params(&c), 1235814400);

    assert_int_equal(parse(qwen3_06b, &c, &err), TDM_OK);
    assert_int_equal(c.arch, TDM_ARCH_QWEN3);
    assert_int_equal(c.head_dim, 128); /* explicit, != 1024 / 16 */
    assert_true(c.qk_norm && !c.qkv_bias);
    assert_int_equal(tdm_model_config_param_count(&c), 596049920);
    assert_int_equal(layout_params(&c), 596049920);

    assert_int_equal(parse(mistral_7b_v03, &c, &err), TDM_OK);
    assert_int_equal(c.arch, TDM_ARCH_MISTRAL);
    assert_false(c.tie_word_embeddings);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(tdm_model_config_param_count(&c), 7248023552); /* published: 7.25B */
    assert_int_equal(layout_params(&c), 7248023552);
}

/* Replaces the first occurrence of `from` in base by `to`. */
static char *edit(const char *base, const char *from, const char *to)
{
    const char *p = strstr(base, from);
    assert_non_null(p);
    size_t n = strlen(base) - strlen(from) + strlen(to) + 1;
    char *out = malloc(n);
    snprintf(out, n, "%.*s%s%s", (int)(p - base), base, to, p + strlen(from));
    return out;
}

static void expect_refused(const char *base, const char *from, const char *to, tdm_status want,
                           const char *needle)
{
    char *text = edit(base, from, to);
    tdm_model_config c;
    tdm_error err = {0};
    tdm_status st = parse(text, &c, &err);
    if (st != want || !strstr(err.message, needle))
        fail_msg("edit %s -> %s: got %d \"%s\", want %d with \"%s\"", from, to, st, err.message,
                 want, needle);
    assert_non_null(strstr(err.message, "config.json"));
    free(text);
}

static void test_refusals(void **state)
{
    expect_refused(qwen25_05b, "Qwen2ForCausalLM", "Qwen2MoeForCausalLM", TDM_ERR_UNSUPPORTED,
                   "architecture \"Qwen2MoeForCausalLM\" is not supported");
    expect_refused(qwen25_05b, "\"vocab_size\"", "\"num_experts\":60,\"vocab_size\"",
                   TDM_ERR_UNSUPPORTED, "mixture of experts (num_experts = 60)");
    expect_refused(mistral_7b_v03, "\"vocab_size\"", "\"num_local_experts\":8,\"vocab_size\"",
                   TDM_ERR_UNSUPPORTED, "num_local_experts");
    expect_refused(qwen25_05b, "\"use_sliding_window\":false", "\"use_sliding_window\":true",
                   TDM_ERR_UNSUPPORTED, "use_sliding_window");
    /* Mistral 7B v0.1: a 4096 window under a 32768 context. */
    expect_refused(mistral_7b_v03, "\"sliding_window\":null", "\"sliding_window\":4096",
                   TDM_ERR_UNSUPPORTED, "sliding_window 4096");
    expect_refused(qwen25_05b, "\"vocab_size\"",
                   "\"layer_types\":[\"full_attention\",\"sliding_attention\"],\"vocab_size\"",
                   TDM_ERR_UNSUPPORTED, "sliding_attention");
    expect_refused(qwen25_05b, "\"rope_theta\":1000000.0",
                   "\"rope_theta\":1000000.0,\"rope_scaling\":{\"type\":\"yarn\",\"factor\":4.0}",
                   TDM_ERR_UNSUPPORTED, "RoPE scaling type \"yarn\"");
    expect_refused(qwen25_05b, "\"silu\"", "\"gelu\"", TDM_ERR_UNSUPPORTED, "hidden_act \"gelu\"");
    expect_refused(llama32_1b, "\"mlp_bias\":false", "\"mlp_bias\":true", TDM_ERR_UNSUPPORTED,
                   "mlp_bias");
    expect_refused(qwen25_05b, "\"vocab_size\"",
                   "\"quantization_config\":{\"quant_method\":\"gptq\"},\"vocab_size\"",
                   TDM_ERR_UNSUPPORTED, "method gptq");
    expect_refused(qwen25_05b, "\"model_type\":\"qwen2\"", "\"model_type\":\"llama\"",
                   TDM_ERR_PARSE, "does not match");
    expect_refused(qwen25_05b, "\"num_key_value_heads\":2", "\"num_key_value_heads\":3",
                   TDM_ERR_PARSE, "not a multiple of num_key_value_heads");
    expect_refused(qwen25_05b, "\"hidden_size\":896,", "", TDM_ERR_PARSE, "missing \"hidden_size\"");
    expect_refused(qwen25_05b, "\"hidden_size\":896", "\"hidden_size\":-896", TDM_ERR_PARSE,
                   "\"hidden_size\" must be a positive integer");
    expect_refused(qwen25_05b, "\"hidden_size\":896", "\"hidden_size\":\"896\"", TDM_ERR_PARSE,
                   "hidden_size");
    expect_refused(qwen25_05b, "\"rms_norm_eps\":1e-06", "\"rms_norm_eps\":0", TDM_ERR_PARSE,
                   "rms_norm_eps");
    expect_refused(qwen25_05b, "\"tie_word_embeddings\":true", "\"tie_word_embeddings\":1",
                   TDM_ERR_PARSE, "tie_word_embeddings");
    expect_refused(qwen25_05b, "\"architectures\":[\"Qwen2ForCausalLM\"],", "", TDM_ERR_PARSE,
                   "architectures");
    expect_refused(llama32_1b, "\"low_freq_factor\":1.0,", "", TDM_ERR_PARSE, "low_freq_factor");
    expect_refused(llama32_1b, "\"high_freq_factor\":4.0", "\"high_freq_factor\":0.5",
                   TDM_ERR_PARSE, "high_freq_factor");
    expect_refused(llama32_1b, "\"head_dim\":64", "\"head_dim\":63", TDM_ERR_PARSE, "odd");
    /* Sizes whose products would overflow are refused before any arithmetic. */
    expect_refused(qwen25_05b, "\"hidden_size\":896", "\"hidden_size\":234881024",
                   TDM_ERR_UNSUPPORTED, "hidden_size 234881024 exceeds");
    expect_refused(qwen25_05b, "\"vocab_size\":151936", "\"vocab_size\":999999999",
                   TDM_ERR_UNSUPPORTED, "vocab_size");
    expect_refused(qwen3_06b, "\"num_attention_heads\":16", "\"num_attention_heads\":16384",
                   TDM_ERR_UNSUPPORTED, "num_attention_heads * head_dim");
    /* JSON syntax errors carry FILE:LINE:COLUMN. */
    tdm_model_config c;
    tdm_error err = {0};
    const char *bad = "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"hidden_size\": 12,,\n}";
    assert_int_equal(parse(bad, &c, &err), TDM_ERR_PARSE);
    assert_non_null(strstr(err.message, "config.json:3:"));
    assert_int_equal(parse("[]", &c, &err), TDM_ERR_PARSE);
    assert_int_equal(parse("{\"a\":1,\"a\":2}", &c, &err), TDM_ERR_PARSE);
}

static void test_rope_variants(void **state)
{
    tdm_model_config c;
    tdm_error err = {0};
    /* transformers >= 5: rope_parameters carries theta and scaling. */
    char *t = edit(llama32_1b, "\"rope_scaling\"", "\"rope_parameters\"");
    char *t2 = edit(t, "\"rope_type\":\"llama3\"}", "\"rope_type\":\"llama3\",\"rope_theta\":250000.0}");
    assert_int_equal(parse(t2, &c, &err), TDM_OK);
    assert_int_equal(c.rope.type, TDM_ROPE_LLAMA3);
    assert_true(c.rope.theta == 250000.0);
    free(t);
    free(t2);
    t = edit(qwen25_05b, "\"rope_theta\":1000000.0",
             "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":1000000.0}");
    assert_int_equal(parse(t, &c, &err), TDM_OK);
    assert_true(c.rope.type == TDM_ROPE_DEFAULT && c.rope.theta == 1e6);
    free(t);
    /* Older files: "type" instead of "rope_type"; linear scaling. */
    t = edit(qwen25_05b, "\"rope_theta\":1000000.0",
             "\"rope_scaling\":{\"type\":\"linear\",\"factor\":2.0}");
    assert_int_equal(parse(t, &c, &err), TDM_OK);
    assert_true(c.rope.type == TDM_ROPE_LINEAR && c.rope.factor == 2.0);
    assert_true(c.rope.theta == 10000.0); /* the default when rope_theta is absent */
    free(t);
    /* Defaults: no num_key_value_heads means MHA; no head_dim means hidden / heads. */
    t = edit(mistral_7b_v03, "\"num_key_value_heads\":8,", "");
    assert_int_equal(parse(t, &c, &err), TDM_OK);
    assert_int_equal(c.num_kv_heads, 32);
    free(t);
}

/* to_json output parses back to the same config. */
static void test_json_round_trip(void **state)
{
    const char *all[] = {qwen25_05b, llama32_1b, qwen3_06b, mistral_7b_v03};
    for (int i = 0; i < 4; i++) {
        tdm_model_config a, b;
        tdm_error err = {0};
        assert_int_equal(parse(all[i], &a, &err), TDM_OK);
        char *text;
        assert_int_equal(tdm_model_config_to_json(&a, &text, &err), TDM_OK);
        if (parse(text, &b, &err) != TDM_OK)
            fail_msg("%s\n%s", err.message, text);
        assert_memory_equal(&a, &b, sizeof a);
        free(text);
    }
}

static void test_quantized_names(void **state)
{
    assert_true(tdm_model_tensor_is_quantized("model.layers.0.self_attn.q_proj.weight", 2));
    assert_true(tdm_model_tensor_is_quantized("model.layers.31.mlp.down_proj.weight", 2));
    assert_false(tdm_model_tensor_is_quantized("model.layers.0.self_attn.q_proj.bias", 1));
    assert_false(tdm_model_tensor_is_quantized("model.layers.0.self_attn.q_proj.weight", 1));
    assert_false(tdm_model_tensor_is_quantized("model.layers.x.mlp.up_proj.weight", 2));
    assert_false(tdm_model_tensor_is_quantized("model.embed_tokens.weight", 2));
    assert_false(tdm_model_tensor_is_quantized("lm_head.weight", 2));
    assert_false(tdm_model_tensor_is_quantized("model.layers.0.input_layernorm.weight", 1));
}

/* Golden: configs saved by transformers' *Config.save_pretrained, with the parameter names and
 * shapes of the model transformers builds from them (tests/fixtures/model/configs/, made by
 * gen_fixtures.py). */
static void test_golden_transformers_configs(void **state)
{
    char root[600], exp_path[700];
    snprintf(root, sizeof root, "%s/configs", fixtures_dir());
    snprintf(exp_path, sizeof exp_path, "%s/expected.json", root);
    if (access(exp_path, F_OK) != 0) {
        print_message("SKIP: %s absent; run tests/fixtures/model/gen_fixtures.py on a machine "
                      "with torch + transformers to make it\n",
                      exp_path);
        skip();
    }
    json_error_t jerr;
    json_t *expected = json_load_file(exp_path, 0, &jerr);
    assert_non_null(expected);
    const char *name;
    json_t *e;
    int checked = 0;
    json_object_foreach(expected, name, e) {
        char dir[700];
        snprintf(dir, sizeof dir, "%s/%s", root, name);
        tdm_model_config c;
        tdm_error err = {0};
        if (tdm_model_config_load(&c, dir, &err) != TDM_OK)
            fail_msg("%s: %s", name, err.message);
        assert_string_equal(c.architecture,
                            json_string_value(json_object_get(e, "architecture")));
        assert_int_equal(c.head_dim, json_integer_value(json_object_get(e, "head_dim")));
        assert_int_equal(c.num_kv_heads, json_integer_value(json_object_get(e, "num_kv_heads")));
        assert_true(c.rope.theta == json_number_value(json_object_get(e, "rope_theta")));
        assert_string_equal(tdm_rope_type_name(c.rope.type),
                            json_string_value(json_object_get(e, "rope_type")));
        assert_int_equal(tdm_model_config_param_count(&c),
                         json_integer_value(json_object_get(e, "param_count")));
        json_t *params = json_object_get(e, "parameters"); /* {name: [shape...]} */
        tdm_tensor_desc *d;
        size_t n;
        assert_int_equal(tdm_model_layout(&c, &d, &n, &err), TDM_OK);
        if (n != json_object_size(params))
            fail_msg("%s: layout has %zu tensors, transformers %zu", name, n,
                     json_object_size(params));
        for (size_t i = 0; i < n; i++) {
            json_t *shape = json_object_get(params, d[i].name);
            if (!shape)
                fail_msg("%s: transformers has no parameter %s", name, d[i].name);
            assert_int_equal((size_t)d[i].rank, json_array_size(shape));
            for (int k = 0; k < d[i].rank; k++)
                assert_int_equal(d[i].shape[k],
                                 json_integer_value(json_array_get(shape, (size_t)k)));
        }
        free(d);
        checked++;
    }
    assert_true(checked >= 5);
    json_decref(expected);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_real_configs),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_rope_variants),
        cmocka_unit_test(test_json_round_trip),
        cmocka_unit_test(test_quantized_names),
        cmocka_unit_test(test_golden_transformers_configs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
