/* Unit tests of model/init_model and model/presets: the written model matches its config's
 * layout, the weights follow the documented distribution and seeding, bf16 is the rounded f32
 * draw, the byte-level tokenizer is complete, and a given tokenizer widens the vocabulary. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/config.h"
#include "model/init_model.h"
#include "model/layout.h"
#include "model/presets.h"
#include "model/weights.h"
#include "util/atomic_file.h"
#include "util/half.h"
#include "util/rng.h"

static char tmpdir[256];

static int setup(void **state)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/tandem-test-init-XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    return 0;
}

static int teardown(void **state)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void make(const char *name, const char *preset, tdm_dtype dtype, uint64_t seed,
                 const char *tokenizer, char *dir, tdm_model_config *cfg)
{
    snprintf(dir, 400, "%s/%s", tmpdir, name);
    tdm_init_model_opts o = {.preset = preset, .seed = seed, .dtype = dtype,
                             .tokenizer = tokenizer};
    tdm_error err = {0};
    if (tdm_init_model(dir, &o, cfg, &err) != TDM_OK)
        fail_msg("%s", err.message);
}

static void test_presets_are_valid_configs(void **state)
{
    size_t n;
    const tdm_preset_info *p = tdm_presets(&n);
    assert_true(n >= 5);
    for (size_t i = 0; i < n; i++) {
        tdm_model_config c, back;
        tdm_error err = {0};
        assert_int_equal(tdm_preset_config(p[i].name, &c, &err), TDM_OK);
        char *json;
        assert_int_equal(tdm_model_config_to_json(&c, &json, &err), TDM_OK);
        if (tdm_model_config_parse(&back, json, strlen(json), p[i].name, &err) != TDM_OK)
            fail_msg("%s: %s", p[i].name, err.message);
        free(json);
        if (!strncmp(p[i].name, "tiny", 4))
            assert_true(tdm_model_config_param_count(&c) < 5000000);
    }
    /* Published totals of the real models. */
    tdm_model_config c;
    tdm_error err = {0};
    assert_int_equal(tdm_preset_config("qwen2.5-0.5b", &c, &err), TDM_OK);
    assert_int_equal(tdm_model_config_param_count(&c), 494032768);
    assert_int_equal(tdm_preset_config("llama3.2-1b", &c, &err), TDM_OK);
    assert_int_equal(tdm_model_config_param_count(&c), 1235814400);
    assert_int_equal(tdm_preset_config("qwen2.5-7b", &c, &err), TDM_OK);
    assert_int_equal(tdm_model_config_param_count(&c), 7615616512);
    assert_int_equal(tdm_preset_config("qwen2.5-1.5b", &c, &err), TDM_OK);
    assert_int_equal(tdm_model_config_param_count(&c), 1543714304);
    assert_int_equal(tdm_preset_config("nope", &c, &err), TDM_ERR_NOT_FOUND);
    assert_non_null(strstr(err.message, "tiny"));
}

static void test_weights_follow_the_recipe(void **state)
{
    char dir[400];
    tdm_model_config cfg;
    make("f32", "tiny", TDM_DTYPE_F32, 7, NULL, dir, &cfg);
    tdm_model_config loaded;
    tdm_error err = {0};
    assert_int_equal(tdm_model_config_load(&loaded, dir, &err), TDM_OK);
    assert_memory_equal(&loaded, &cfg, sizeof cfg);
    tdm_weights w;
    assert_int_equal(tdm_weights_open(&w, dir, &err), TDM_OK);
    size_t unused = 99;
    assert_int_equal(tdm_model_check_weights(&cfg, &w, &unused, &err), TDM_OK);
    assert_int_equal(unused, 0);
    /* The documented seeding: chunk c of tensor t draws from seed(7, t, c). */
    const char *name = "model.layers.1.mlp.up_proj.weight"; /* 688*256 = 176128: 3 chunks */
    const tdm_st_tensor *t = tdm_weights_find(&w, name);
    assert_non_null(t);
    float *v = malloc((size_t)t->numel * sizeof *v);
    assert_int_equal(tdm_st_tensor_to_f32(t, v, &err), TDM_OK);
    for (uint64_t c = 0; c < 3; c++) {
        tdm_rng r;
        tdm_rng_seed(&r, tdm_init_model_chunk_seed(7, name, c));
        for (int64_t i = (int64_t)c * 65536; i < t->numel && i < (int64_t)(c + 1) * 65536; i++)
            assert_true(v[i] == (float)(tdm_rng_normal(&r) * 0.02));
    }
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < t->numel; i++) {
        sum += v[i];
        sq += (double)v[i] * v[i];
    }
    double mean = sum / (double)t->numel, sd = sqrt(sq / (double)t->numel - mean * mean);
    assert_true(fabs(mean) < 0.0005);
    assert_true(fabs(sd - 0.02) < 0.0005);
    free(v);
    float one[256];
    assert_int_equal(tdm_st_tensor_to_f32(tdm_weights_find(&w, "model.norm.weight"), one, &err),
                     TDM_OK);
    for (int i = 0; i < 256; i++)
        assert_true(one[i] == 1.0f);
    float bias[128];
    assert_int_equal(tdm_st_tensor_to_f32(
                         tdm_weights_find(&w, "model.layers.0.self_attn.k_proj.bias"), bias, &err),
                     TDM_OK);
    for (int i = 0; i < 128; i++)
        assert_true(bias[i] == 0.0f);
    assert_string_equal(tdm_st_metadata(&w.files[0], "tandem.preset"), "tiny");
    assert_string_equal(tdm_st_metadata(&w.files[0], "tandem.seed"), "7");

    /* bf16 with the same seed is the f32 file rounded to nearest even. */
    char dir16[400];
    make("bf16", "tiny", TDM_DTYPE_BF16, 7, NULL, dir16, &cfg);
    tdm_weights w16;
    assert_int_equal(tdm_weights_open(&w16, dir16, &err), TDM_OK);
    assert_int_equal(w16.n_tensors, w.n_tensors);
    for (size_t k = 0; k < w.n_tensors; k++) {
        const tdm_st_tensor *a = w.tensors[k], *b = w16.tensors[k];
        assert_string_equal(a->name, b->name);
        assert_int_equal(b->dtype, TDM_DTYPE_BF16);
        const float *fa = a->data; /* the writer aligns the data section to 8 bytes */
        const uint16_t *hb = b->data;
        for (int64_t i = 0; i < a->numel; i++)
            if (tdm_f32_to_bf16(fa[i]) != hb[i])
                fail_msg("%s[%lld]", a->name, (long long)i);
    }
    tdm_weights_close(&w16);
    tdm_weights_close(&w);
}

static void test_every_tiny_preset_checks(void **state)
{
    const char *names[] = {"tiny-llama", "tiny-qwen3", "tiny-mistral"};
    for (int i = 0; i < 3; i++) {
        char dir[400];
        tdm_model_config cfg;
        make(names[i], names[i], TDM_DTYPE_BF16, 1, NULL, dir, &cfg);
        tdm_weights w;
        tdm_error err = {0};
        assert_int_equal(tdm_weights_open(&w, dir, &err), TDM_OK);
        if (tdm_model_check_weights(&cfg, &w, NULL, &err) != TDM_OK)
            fail_msg("%s: %s", names[i], err.message);
        assert_int_equal(w.n_tensors == 0, 0);
        tdm_weights_close(&w);
    }
}

/* --layers N: the preset's first N layers, tensor for tensor the full model's (seeds follow the
 * names), a valid model of that many layers; 0 and beyond the maximum refused. */
static void test_fewer_layers(void **state)
{
    char full[400], one[400];
    tdm_model_config cfg_full, cfg_one;
    make("layers-full", "tiny", TDM_DTYPE_BF16, 3, NULL, full, &cfg_full);
    snprintf(one, sizeof one, "%s/layers-one", tmpdir);
    tdm_init_model_opts o = {.preset = "tiny", .seed = 3, .dtype = TDM_DTYPE_BF16, .layers = 1};
    tdm_error err = {0};
    assert_int_equal(tdm_init_model(one, &o, &cfg_one, &err), TDM_OK);
    assert_true(cfg_full.num_layers > 1);
    assert_int_equal(cfg_one.num_layers, 1);
    tdm_model_config loaded;
    assert_int_equal(tdm_model_config_load(&loaded, one, &err), TDM_OK);
    assert_int_equal(loaded.num_layers, 1);
    tdm_weights wf, w1;
    assert_int_equal(tdm_weights_open(&wf, full, &err), TDM_OK);
    assert_int_equal(tdm_weights_open(&w1, one, &err), TDM_OK);
    size_t unused = 99;
    assert_int_equal(tdm_model_check_weights(&cfg_one, &w1, &unused, &err), TDM_OK);
    assert_int_equal(unused, 0);
    assert_true(w1.n_tensors < wf.n_tensors);
    for (size_t k = 0; k < w1.n_tensors; k++) {
        const tdm_st_tensor *a = w1.tensors[k], *b = tdm_weights_find(&wf, a->name);
        assert_non_null(b);
        assert_int_equal(a->numel, b->numel);
        assert_memory_equal(a->data, b->data, (size_t)a->numel * 2);
    }
    assert_null(tdm_weights_find(&w1, "model.layers.1.mlp.up_proj.weight"));
    tdm_weights_close(&w1);
    tdm_weights_close(&wf);
    o.layers = -1;
    assert_int_equal(tdm_init_model(one, &o, NULL, &err), TDM_ERR_INVALID);
    o.layers = TDM_INIT_MODEL_MAX_LAYERS + 1;
    assert_int_equal(tdm_init_model(one, &o, NULL, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.message, "layers"));
}

static void test_byte_tokenizer(void **state)
{
    char dir[400], path[600];
    tdm_model_config cfg;
    make("tok", "tiny", TDM_DTYPE_BF16, 0, NULL, dir, &cfg);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    json_error_t jerr;
    json_t *tok = json_load_file(path, 0, &jerr);
    assert_non_null(tok);
    json_t *vocab = json_object_get(json_object_get(tok, "model"), "vocab");
    assert_int_equal(json_object_size(vocab), 256);
    /* GPT-2 byte-to-unicode: 'A' is itself, space is U+0120 'Ġ', newline U+010A 'Ċ'. */
    assert_int_equal(json_integer_value(json_object_get(vocab, "A")), 'A');
    assert_int_equal(json_integer_value(json_object_get(vocab, "\xc4\xa0")), ' ');
    assert_int_equal(json_integer_value(json_object_get(vocab, "\xc4\x8a")), '\n');
    assert_int_equal(json_integer_value(json_object_get(vocab, "\xc3\xbf")), 255);
    /* Every id 0..255 appears once. */
    int seen[256] = {0};
    const char *k;
    json_t *v;
    json_object_foreach(vocab, k, v) seen[json_integer_value(v)]++;
    for (int i = 0; i < 256; i++)
        assert_int_equal(seen[i], 1);
    json_t *added = json_object_get(tok, "added_tokens");
    assert_int_equal(json_array_size(added), 3);
    assert_string_equal(json_string_value(json_object_get(json_array_get(added, 2), "content")),
                        "<|im_end|>");
    assert_int_equal(cfg.eos_token_id, 258);
    assert_true(cfg.vocab_size >= 259);

    /* A tokenizer with ids beyond the preset's vocab widens it to a multiple of 64; the
     * special tokens named by its tokenizer_config.json give bos/eos. */
    char src[300];
    snprintf(src, sizeof src, "%s/srctok", tmpdir);
    assert_int_equal(mkdir(src, 0755), 0);
    json_object_set_new(json_array_get(added, 2), "id", json_integer(1000));
    snprintf(path, sizeof path, "%s/tokenizer.json", src);
    assert_int_equal(json_dump_file(tok, path, 0), 0);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", src);
    const char *conf = "{\"eos_token\": {\"content\": \"<|im_end|>\"}, \"bos_token\": null}";
    tdm_error err = {0};
    assert_int_equal(tdm_atomic_write(path, conf, strlen(conf), 0644, &err), TDM_OK);
    char dir2[400];
    make("tok2", "tiny", TDM_DTYPE_BF16, 0, src, dir2, &cfg);
    assert_int_equal(cfg.vocab_size, 1024);
    assert_int_equal(cfg.eos_token_id, 1000);
    assert_int_equal(cfg.bos_token_id, -1);
    tdm_weights w;
    assert_int_equal(tdm_weights_open(&w, dir2, &err), TDM_OK);
    assert_int_equal(tdm_weights_find(&w, "model.embed_tokens.weight")->shape[0], 1024);
    tdm_weights_close(&w);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir2);
    assert_int_equal(access(path, F_OK), 0);
    json_decref(tok);
    /* A tokenizer.json path directly, and a missing one. */
    snprintf(path, sizeof path, "%s/tokenizer.json", src);
    make("tok3", "tiny-llama", TDM_DTYPE_BF16, 0, path, dir2, &cfg);
    assert_int_equal(cfg.vocab_size, 1024);
    tdm_init_model_opts o = {.preset = "tiny", .dtype = TDM_DTYPE_BF16, .tokenizer = "/no/such"};
    snprintf(dir2, sizeof dir2, "%s/tok4", tmpdir);
    assert_int_equal(tdm_init_model(dir2, &o, NULL, &err), TDM_ERR_NOT_FOUND);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_presets_are_valid_configs),
        cmocka_unit_test(test_weights_follow_the_recipe),
        cmocka_unit_test(test_every_tiny_preset_checks),
        cmocka_unit_test(test_fewer_layers),
        cmocka_unit_test(test_byte_tokenizer),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
