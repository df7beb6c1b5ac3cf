/* Unit tests of train/lora (layout, PEFT initialisation, determinism) and train/peft_io (PEFT
 * adapter directories: names, shapes, config fields, round trip, dtypes, refusals). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/config.h"
#include "model/safetensors.h"
#include "train/lora.h"
#include "train/peft_io.h"
#include "util/atomic_file.h"
#include "util/half.h"

static char tmpdir[256];

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/tandem-test-lora-XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* A tiny Llama: hidden 64, 4 heads of 16, 2 KV heads (K = 32), intermediate 96, 2 layers. */
static void tiny_config(tdm_model_config *cfg, int hidden, int inter, int layers)
{
    char text[1024];
    snprintf(text, sizeof text,
             "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\","
             "\"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d,"
             "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 128}",
             hidden, inter, layers);
    tdm_error err = {0};
    if (tdm_model_config_parse(cfg, text, strlen(text), "tiny", &err) != TDM_OK)
        fail_msg("%s", err.message);
}

static void test_layout(void **state)
{
    (void)state;
    tdm_model_config cfg;
    tiny_config(&cfg, 64, 96, 2);
    tdm_lora_params l;
    tdm_error err = {0};
    assert_int_equal(tdm_lora_params_init(&l, &cfg, 8, 16.0, false, TDM_ADAPTER_TARGET_ALL, &err), TDM_OK);
    assert_int_equal(l.n_modules, 14);
    /* per layer: q 8*64+64*8, k,v 8*64+32*8, o 8*64+64*8, gate,up 8*64+96*8, down 8*96+64*8 */
    int64_t per_layer = 1024 + 768 + 768 + 1024 + 1280 + 1280 + 1280;
    assert_int_equal(l.n_params, 2 * per_layer);
    const int64_t want_in[7] = {64, 64, 64, 64, 64, 64, 96};
    const int64_t want_out[7] = {64, 32, 32, 64, 96, 96, 64};
    int64_t off = 0;
    for (size_t i = 0; i < l.n_modules; i++) {
        const tdm_lora_module *m = &l.modules[i];
        assert_int_equal(m->layer, (int)(i / 7));
        assert_int_equal(m->target, i % 7);
        assert_int_equal(m->in, want_in[i % 7]);
        assert_int_equal(m->out, want_out[i % 7]);
        assert_int_equal(m->a_offset, off);
        assert_int_equal(m->b_offset, off + 8 * m->in);
        assert_ptr_equal(m->A, l.params + m->a_offset);
        assert_ptr_equal(m->B, l.params + m->b_offset);
        off = m->b_offset + m->out * 8;
        assert_ptr_equal(tdm_lora_params_find(&l, m->layer, m->target), m);
    }
    assert_int_equal(off, l.n_params);
    assert_true(l.scale == 2.0);
    char name[200];
    assert_true(tdm_lora_params_tensor_name(&l.modules[13], true, name, sizeof name));
    assert_string_equal(name, "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight");
    assert_true(tdm_lora_params_tensor_name(&l.modules[1], false, name, sizeof name));
    assert_string_equal(name, "base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight");
    tdm_lora_params_free(&l);

    /* q,v only, rslora */
    assert_int_equal(tdm_lora_params_init(&l, &cfg, 4, 16.0, true,
                                   TDM_ADAPTER_TARGET_Q_PROJ | TDM_ADAPTER_TARGET_V_PROJ, &err),
                     TDM_OK);
    assert_int_equal(l.n_modules, 4);
    assert_true(l.scale == 8.0);
    assert_null(tdm_lora_params_find(&l, 0, 1));
    assert_null(tdm_lora_params_find(&l, 2, 0));
    assert_int_equal(tdm_lora_params_find(&l, 1, 2)->target, 2);
    assert_int_equal(tdm_lora_params_find(&l, 1, 2)->layer, 1);
    tdm_lora_params_free(&l);

    assert_int_equal(tdm_lora_params_init(&l, &cfg, 0, 16.0, false, 1, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_lora_params_init(&l, &cfg, 4, -1.0, false, 1, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_lora_params_init(&l, &cfg, 4, 1.0, false, 0, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_lora_params_init(&l, &cfg, 4, 1.0, false, 0x80, &err), TDM_ERR_INVALID);
}

static void test_init_statistics_and_order(void **state)
{
    (void)state;
    tdm_model_config cfg;
    tiny_config(&cfg, 256, 512, 2);
    tdm_lora_params l;
    tdm_error err = {0};
    assert_int_equal(tdm_lora_params_init(&l, &cfg, 16, 32.0, false, TDM_ADAPTER_TARGET_ALL, &err),
                     TDM_OK);
    for (int64_t i = 0; i < l.n_params; i++)
        l.params[i] = 1.0f; /* init must overwrite B too */
    tdm_rng rng;
    tdm_rng_seed(&rng, 42);
    tdm_lora_params_init_peft(&l, &rng);
    for (size_t i = 0; i < l.n_modules; i++) {
        const tdm_lora_module *m = &l.modules[i];
        double bound = 1.0 / sqrt((double)m->in);
        int64_t na = 16 * m->in, nb = 16 * m->out;
        double sum = 0, sq = 0, mx = 0;
        for (int64_t j = 0; j < na; j++) {
            double a = m->A[j];
            sum += a;
            sq += a * a;
            mx = fmax(mx, fabs(a));
        }
        assert_true(mx <= bound);
        assert_true(mx > 0.95 * bound);
        /* U(-b, b): mean 0 (sd b/sqrt(3n)), variance b^2/3 */
        double mean = sum / (double)na, var = sq / (double)na - mean * mean;
        assert_true(fabs(mean) < 5 * bound / sqrt(3.0 * (double)na));
        assert_true(fabs(var / (bound * bound / 3.0) - 1.0) < 0.05);
        for (int64_t j = 0; j < nb; j++)
            assert_true(m->B[j] == 0.0f);
    }
    /* The documented draw order: module after module, A row-major. */
    tdm_rng r2;
    tdm_rng_seed(&r2, 42);
    const tdm_lora_module *m0 = &l.modules[0], *m1 = &l.modules[1], *m6 = &l.modules[6];
    assert_true(m0->A[0] == (float)((2.0 * tdm_rng_uniform(&r2) - 1.0) / sqrt(256.0)));
    assert_true(m0->A[1] == (float)((2.0 * tdm_rng_uniform(&r2) - 1.0) / sqrt(256.0)));
    tdm_rng_seed(&r2, 42);
    for (int64_t j = 0; j < 16 * m0->in; j++)
        tdm_rng_uniform(&r2);
    assert_true(m1->A[0] == (float)((2.0 * tdm_rng_uniform(&r2) - 1.0) / sqrt(256.0)));
    tdm_rng_seed(&r2, 42);
    for (int64_t j = 0; j < 16 * 256 * 6; j++) /* modules 0..5 all have in = 256 */
        tdm_rng_uniform(&r2);
    assert_true(m6->A[0] == (float)((2.0 * tdm_rng_uniform(&r2) - 1.0) / sqrt(512.0)));

    /* Determinism: same seed same bits; the stream position after init is n_A draws. */
    tdm_lora_params l2;
    assert_int_equal(tdm_lora_params_init(&l2, &cfg, 16, 32.0, false, TDM_ADAPTER_TARGET_ALL, &err),
                     TDM_OK);
    tdm_rng rb;
    tdm_rng_seed(&rb, 42);
    tdm_lora_params_init_peft(&l2, &rb);
    assert_memory_equal(l.params, l2.params, (size_t)l.n_params * sizeof(float));
    assert_memory_equal(rng.s, rb.s, sizeof rng.s);
    tdm_rng_seed(&rb, 43);
    tdm_lora_params_init_peft(&l2, &rb);
    assert_true(memcmp(l.params, l2.params, (size_t)l.n_params * sizeof(float)) != 0);
    tdm_lora_params_free(&l2);
    tdm_lora_params_free(&l);
}

static json_t *load_json(const char *path)
{
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    if (!o) fail_msg("%s: %s", path, je.text);
    return o;
}

static void test_peft_round_trip(void **state)
{
    (void)state;
    tdm_model_config cfg;
    tiny_config(&cfg, 64, 96, 2);
    tdm_lora_params l;
    tdm_error err = {0};
    assert_int_equal(tdm_lora_params_init(&l, &cfg, 8, 16.0, true,
                                   TDM_ADAPTER_TARGET_V_PROJ | TDM_ADAPTER_TARGET_Q_PROJ |
                                       TDM_ADAPTER_TARGET_DOWN_PROJ,
                                   &err),
                     TDM_OK);
    for (int64_t i = 0; i < l.n_params; i++)
        l.params[i] = (float)sin((double)i) * 0.1f;
    tdm_peft_meta meta = {.lora_dropout = 0.05};
    snprintf(meta.base_model_name_or_path, sizeof meta.base_model_name_or_path, "models/tiny");
    char dir[300];
    snprintf(dir, sizeof dir, "%s/adapter", tmpdir);
    assert_int_equal(tdm_peft_save(dir, &l, &meta, &err), TDM_OK);

    char path[400];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    json_t *c = load_json(path);
    assert_string_equal(json_string_value(json_object_get(c, "peft_type")), "LORA");
    assert_string_equal(json_string_value(json_object_get(c, "task_type")), "CAUSAL_LM");
    assert_int_equal(json_integer_value(json_object_get(c, "r")), 8);
    assert_int_equal(json_integer_value(json_object_get(c, "lora_alpha")), 16);
    assert_true(json_is_true(json_object_get(c, "use_rslora")));
    assert_true(json_is_false(json_object_get(c, "use_dora")));
    assert_true(json_is_false(json_object_get(c, "fan_in_fan_out")));
    assert_string_equal(json_string_value(json_object_get(c, "bias")), "none");
    assert_string_equal(json_string_value(json_object_get(c, "base_model_name_or_path")),
                        "models/tiny");
    assert_true(fabs(json_number_value(json_object_get(c, "lora_dropout")) - 0.05) < 1e-15);
    json_t *tm = json_object_get(c, "target_modules");
    assert_int_equal(json_array_size(tm), 3);
    assert_string_equal(json_string_value(json_array_get(tm, 0)), "q_proj");
    assert_string_equal(json_string_value(json_array_get(tm, 1)), "v_proj");
    assert_string_equal(json_string_value(json_array_get(tm, 2)), "down_proj");
    assert_true(json_is_object(json_object_get(c, "rank_pattern")));
    assert_true(json_is_null(json_object_get(c, "modules_to_save")));
    json_decref(c);

    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    tdm_st_file f = {0};
    assert_int_equal(tdm_st_open(&f, path, &err), TDM_OK);
    assert_int_equal(f.n_tensors, 12);
    const tdm_st_tensor *t =
        tdm_st_find(&f, "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight");
    assert_non_null(t);
    assert_int_equal(t->dtype, TDM_DTYPE_F32);
    assert_int_equal(t->shape[0], 32);
    assert_int_equal(t->shape[1], 8);
    t = tdm_st_find(&f, "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight");
    assert_non_null(t);
    assert_int_equal(t->shape[0], 8);
    assert_int_equal(t->shape[1], 96);
    assert_string_equal(tdm_st_metadata(&f, "format"), "pt");
    tdm_st_close(&f);

    tdm_lora_params back;
    tdm_peft_meta mb;
    assert_int_equal(tdm_peft_load(dir, &cfg, &back, &mb, &err), TDM_OK);
    assert_int_equal(back.rank, 8);
    assert_true(back.alpha == 16.0 && back.use_rslora && back.targets == l.targets);
    assert_int_equal(back.n_params, l.n_params);
    assert_memory_equal(back.params, l.params, (size_t)l.n_params * sizeof(float));
    assert_string_equal(mb.base_model_name_or_path, "models/tiny");
    assert_true(mb.lora_dropout == 0.05);
    tdm_lora_params_free(&back);

    /* Replacing the directory as a whole leaves no scratch entries behind. */
    l.params[0] = 42.0f;
    assert_int_equal(tdm_peft_save(dir, &l, &meta, &err), TDM_OK);
    assert_int_equal(tdm_peft_load(dir, &cfg, &back, NULL, &err), TDM_OK);
    assert_true(back.params[0] == 42.0f);
    tdm_lora_params_free(&back);
    DIR *d = opendir(tmpdir);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.' || strstr(e->d_name, ".tmp-") || strstr(e->d_name, ".del-"))
            n++, assert_string_equal(e->d_name, "adapter");
    closedir(d);
    assert_int_equal(n, 1);

    /* The same adapter does not fit a model with another hidden size. */
    tdm_model_config other;
    tiny_config(&other, 128, 96, 2);
    assert_int_equal(tdm_peft_load(dir, &other, &back, NULL, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.message, "lora_A.weight has shape [8, 64], expected [8, 128]"));
    /* ... nor one with fewer layers (an unexpected tensor) */
    tiny_config(&other, 64, 96, 1);
    assert_int_equal(tdm_peft_load(dir, &other, &back, NULL, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.message, "unexpected tensor base_model.model.model.layers.1"));
    /* ... nor more */
    tiny_config(&other, 64, 96, 3);
    assert_int_equal(tdm_peft_load(dir, &other, &back, NULL, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.message, "layers.2.self_attn.q_proj.lora_A.weight is missing"));
    tdm_lora_params_free(&l);
}

/* Adapters saved in bf16 or f16 (PEFT saves in the model's dtype) are read and converted. */
static void test_peft_load_half_dtypes(void **state)
{
    (void)state;
    tdm_model_config cfg;
    tiny_config(&cfg, 64, 96, 1);
    tdm_error err = {0};
    for (int half = 0; half < 2; half++) {
        char dir[300], path[400];
        snprintf(dir, sizeof dir, "%s/half%d", tmpdir, half);
        mkdir(dir, 0755);
        const char *cfgtext = "{\"peft_type\": \"LORA\", \"r\": 2, \"lora_alpha\": 4,"
                              "\"target_modules\": [\"o_proj\"], \"bias\": \"none\","
                              "\"use_dora\": false, \"rank_pattern\": {}, \"task_type\": "
                              "\"CAUSAL_LM\", \"lora_bias\": false, \"unknown_future_key\": 1}";
        snprintf(path, sizeof path, "%s/adapter_config.json", dir);
        assert_int_equal(tdm_atomic_write(path, cfgtext, strlen(cfgtext), 0644, &err), TDM_OK);
        uint16_t a[2 * 64], b[64 * 2];
        float want_a[2 * 64], want_b[64 * 2];
        for (int i = 0; i < 128; i++) {
            float va = (float)i / 64.0f - 1.0f, vb = 0.001f * (float)i;
            a[i] = half ? tdm_f32_to_f16(va) : tdm_f32_to_bf16(va);
            b[i] = half ? tdm_f32_to_f16(vb) : tdm_f32_to_bf16(vb);
            want_a[i] = half ? tdm_f16_to_f32(a[i]) : tdm_bf16_to_f32(a[i]);
            want_b[i] = half ? tdm_f16_to_f32(b[i]) : tdm_bf16_to_f32(b[i]);
        }
        tdm_dtype dt = half ? TDM_DTYPE_F16 : TDM_DTYPE_BF16;
        tdm_st_spec specs[2] = {
            {"base_model.model.model.layers.0.self_attn.o_proj.lora_A.weight", dt, 2, {2, 64}},
            {"base_model.model.model.layers.0.self_attn.o_proj.lora_B.weight", dt, 2, {64, 2}},
        };
        const void *data[2] = {a, b};
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
        assert_int_equal(tdm_st_save(path, specs, data, 2, NULL, 0, &err), TDM_OK);
        tdm_lora_params l;
        assert_int_equal(tdm_peft_load(dir, &cfg, &l, NULL, &err), TDM_OK);
        assert_int_equal(l.rank, 2);
        assert_true(l.scale == 2.0);
        assert_int_equal(l.targets, TDM_ADAPTER_TARGET_O_PROJ);
        assert_memory_equal(l.modules[0].A, want_a, sizeof want_a);
        assert_memory_equal(l.modules[0].B, want_b, sizeof want_b);
        tdm_lora_params_free(&l);
    }
}

static void expect_config_error(const char *text, tdm_status want, const char *fragment)
{
    int rank;
    double alpha;
    uint32_t targets;
    bool rs;
    tdm_error err = {0};
    tdm_status st = tdm_peft_config_parse(text, strlen(text), "cfg.json", &rank, &alpha, &targets,
                                          &rs, NULL, &err);
    if (st != want || !strstr(err.message, fragment))
        fail_msg("%s -> %d \"%s\", wanted %d with \"%s\"", text, st, err.message, want, fragment);
}

static void test_peft_config_refusals(void **state)
{
    (void)state;
    expect_config_error("{\"peft_type\": \"IA3\", \"r\": 4, \"target_modules\": [\"q_proj\"]}",
                        TDM_ERR_UNSUPPORTED, "peft_type \"IA3\"");
    expect_config_error("{\"peft_type\": \"LORA\", \"target_modules\": [\"q_proj\"]}",
                        TDM_ERR_PARSE, "\"r\"");
    expect_config_error("{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": \"all-linear\"}",
                        TDM_ERR_UNSUPPORTED, "regular expression");
    expect_config_error("{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": [\"lm_head\"]}",
                        TDM_ERR_UNSUPPORTED, "\"lm_head\"");
    expect_config_error("{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": [\"q_proj\"],"
                        "\"use_dora\": true}",
                        TDM_ERR_UNSUPPORTED, "use_dora");
    expect_config_error("{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": [\"q_proj\"],"
                        "\"bias\": \"all\"}",
                        TDM_ERR_UNSUPPORTED, "bias");
    expect_config_error("{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": [\"q_proj\"],"
                        "\"rank_pattern\": {\"q_proj\": 8}}",
                        TDM_ERR_UNSUPPORTED, "rank_pattern");
    expect_config_error("{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": [\"q_proj\"],"
                        "\"layers_to_transform\": [0]}",
                        TDM_ERR_UNSUPPORTED, "layers_to_transform");
    expect_config_error("{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": [\"q_proj\"],"
                        "\"modules_to_save\": [\"lm_head\"]}",
                        TDM_ERR_UNSUPPORTED, "modules_to_save");
    expect_config_error("{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": [\"q_proj\"],"
                        "\"lora_alpha\": -1}",
                        TDM_ERR_PARSE, "lora_alpha");
    expect_config_error("{\"peft_type\": \"LORA\",\n \"r\": 4,,}", TDM_ERR_PARSE, "cfg.json:2:");

    /* defaults: lora_alpha 8, use_rslora false */
    int rank;
    double alpha;
    uint32_t targets;
    bool rs = true;
    tdm_error err = {0};
    const char *ok = "{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": [\"up_proj\", "
                     "\"gate_proj\"], \"layers_to_transform\": null, \"modules_to_save\": null}";
    assert_int_equal(
        tdm_peft_config_parse(ok, strlen(ok), "x", &rank, &alpha, &targets, &rs, NULL, &err),
        TDM_OK);
    assert_int_equal(rank, 4);
    assert_true(alpha == 8.0 && !rs);
    assert_int_equal(targets, TDM_ADAPTER_TARGET_GATE_PROJ | TDM_ADAPTER_TARGET_UP_PROJ);

    tdm_model_config cfg;
    tiny_config(&cfg, 64, 96, 1);
    tdm_lora_params l;
    assert_int_equal(tdm_peft_load("/nonexistent-dir", &cfg, &l, NULL, &err), TDM_ERR_NOT_FOUND);
    assert_non_null(strstr(err.message, "not a PEFT adapter directory"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_init_statistics_and_order),
        cmocka_unit_test(test_peft_round_trip),
        cmocka_unit_test(test_peft_load_half_dtypes),
        cmocka_unit_test(test_peft_config_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
