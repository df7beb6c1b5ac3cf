/* test_merge.c — tdm_merge (train/merge.h) against the formula, on a tiny f32 Qwen2-shaped model
 * written by tdm_init_model and two random PEFT adapters:
 *   1. weighted linear merge: every projection of the output equals, within f32 rounding,
 *      W + sum_i weight_i * scale_i * B_i A_i computed here in double (rsLoRA scale for the
 *      second adapter; a negative weight); untouched tensors are bit-identical;
 *   2. dequantized base: every projection (targeted or not) is the NF4 round trip of the stored
 *      weight (tdm_nf4_quantize / dequantize, with and without double quantization) plus the
 *      delta; embeddings and norms as stored;
 *   3. shards and index: a small shard limit gives several shards that tdm_weights_open accepts
 *      (index and shards agree exactly), total_size is the tensors' bytes, no shard exceeds the
 *      limit unless it holds one tensor;
 *   4. --dtype bf16: every float tensor BF16, equal to the f32 merge rounded; config.json says
 *      bfloat16; tokenizer and generation files copied byte for byte;
 *   5. refusals before any write: non-empty out (kept as it was) unless force, out = the model,
 *      out holding the adapter, out being, inside or holding an adapter directory or a run's
 *      OUT_DIR even with force, an adapter of another shape, a missing adapter, another base
 *      identity, QLoRA and non-QLoRA adapters under auto, two double-quantization settings;
 *      faults while writing a shard or renaming leave neither the output nor a temporary
 *      directory.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/config.h"
#include "model/init_model.h"
#include "model/lora_targets.h"
#include "model/nf4.h"
#include "model/weights.h"
#include "train/lora.h"
#include "train/merge.h"
#include "train/peft_io.h"
#include "util/atomic_file.h"
#include "util/half.h"
#include "util/mkdir_p.h"
#include "util/rng.h"

#define OK(call)                                                                                   \
    do {                                                                                           \
        tdm_error err_ = {0};                                                                      \
        tdm_error *err = &err_;                                                                    \
        if ((call) != TDM_OK) fail_msg("%s: %s", #call, err_.message);                             \
    } while (0)

static char tmpdir[256], model[300], ad1[300], ad2[300];
static tdm_model_config cfg;
static tdm_lora_params l1, l2;

static void randomize(tdm_lora_params *l, uint64_t seed)
{
    tdm_rng rng;
    tdm_rng_seed(&rng, seed);
    for (int64_t i = 0; i < l->n_params; i++)
        l->params[i] = (float)(tdm_rng_normal(&rng) * 0.05);
}

static int setup(void **state)
{
    (void)state;
    /* one thread: the result does not depend on the count (one delta row per thread), and a
     * loaded 2-core machine only waits on spinning threads; integration.merge runs the default */
    omp_set_num_threads(1);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/tandem-test-merge-XXXXXX");
    if (!mkdtemp(tmpdir)) return -1;
    snprintf(model, sizeof model, "%s/model", tmpdir);
    snprintf(ad1, sizeof ad1, "%s/ad1", tmpdir);
    snprintf(ad2, sizeof ad2, "%s/ad2", tmpdir);
    tdm_error err = {0};
    tdm_init_model_opts io = {
        .preset = "tiny", .seed = 5, .dtype = TDM_DTYPE_F32, .init_std = 0.05};
    if (tdm_init_model(model, &io, &cfg, &err) != TDM_OK) {
        fprintf(stderr, "init-model: %s\n", err.message);
        return -1;
    }
    char p[400];
    snprintf(p, sizeof p, "%s/generation_config.json", model);
    const char *gc = "{\"eos_token_id\": 258, \"do_sample\": false}\n";
    if (tdm_atomic_write(p, gc, strlen(gc), 0644, &err) != TDM_OK) return -1;
    tdm_peft_meta meta = {.lora_dropout = 0};
    uint32_t t1 = TDM_LORA_BIT(TDM_LORA_Q) | TDM_LORA_BIT(TDM_LORA_V);
    uint32_t t2 = TDM_LORA_BIT(TDM_LORA_Q) | TDM_LORA_BIT(TDM_LORA_DOWN);
    if (tdm_lora_params_init(&l1, &cfg, 4, 8, false, t1, &err) != TDM_OK ||
        tdm_lora_params_init(&l2, &cfg, 2, 6, true, t2, &err) != TDM_OK)
        return -1;
    randomize(&l1, 1);
    randomize(&l2, 2);
    if (tdm_peft_save(ad1, &l1, &meta, &err) != TDM_OK ||
        tdm_peft_save(ad2, &l2, &meta, &err) != TDM_OK) {
        fprintf(stderr, "peft_save: %s\n", err.message);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tdm_lora_params_free(&l1);
    tdm_lora_params_free(&l2);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return 0;
}

static float *tensor_f32(const tdm_weights *w, const char *name, int64_t *numel)
{
    const tdm_st_tensor *t = tdm_weights_find(w, name);
    if (!t) fail_msg("no tensor %s", name);
    float *v = malloc((size_t)t->numel * sizeof *v);
    OK(tdm_st_tensor_to_f32(t, v, err));
    if (numel) *numel = t->numel;
    return v;
}

static void proj_name(char *buf, size_t cap, int layer, unsigned tg)
{
    snprintf(buf, cap, "model.layers.%d.%s.weight", layer, tdm_lora_target_path(tg));
}

/* Checks every projection of out against base (optionally NF4 round-tripped) + the weighted
 * deltas of the adapters, in double. */
static void check_projections(const char *out, bool deq, bool dq, const tdm_lora_params *const *ls,
                              const double *weights, int n)
{
    tdm_weights wb = {0}, wo = {0};
    OK(tdm_weights_open(&wb, model, err));
    OK(tdm_weights_open(&wo, out, err));
    int n_changed = 0;
    for (int layer = 0; layer < cfg.num_layers; layer++)
        for (unsigned tg = 0; tg < TDM_LORA_N_TARGETS; tg++) {
            char name[128];
            proj_name(name, sizeof name, layer, tg);
            int64_t numel;
            float *w = tensor_f32(&wb, name, &numel), *got = tensor_f32(&wo, name, NULL);
            if (deq) {
                tdm_nf4 q;
                OK(tdm_nf4_quantize(w, numel, dq, &q, err));
                tdm_nf4_dequantize(&q, w);
                tdm_nf4_free(&q);
            }
            int64_t in, outf;
            tdm_lora_params_projection_dims(&cfg, tg, &in, &outf);
            bool any = false;
            double max_err = 0, max_delta = 0;
            for (int64_t o = 0; o < outf; o++)
                for (int64_t j = 0; j < in; j++) {
                    double want = w[o * in + j], delta = 0, mag = 0;
                    for (int i = 0; i < n; i++) {
                        const tdm_lora_module *m = tdm_lora_params_find(ls[i], layer, tg);
                        if (!m) continue;
                        any = true;
                        double s = 0, c = weights[i] * ls[i]->scale;
                        for (int k = 0; k < ls[i]->rank; k++) {
                            double term = (double)m->B[o * ls[i]->rank + k] * m->A[k * in + j];
                            s += term;
                            mag += fabs(c * term);
                        }
                        delta += c * s;
                    }
                    want += delta;
                    double e = fabs(got[o * in + j] - want);
                    if (e > max_err) max_err = e;
                    if (fabs(delta) > max_delta) max_delta = fabs(delta);
                    /* f32 rounding of the weight, the sum and each of the r products */
                    if (e > 2e-7 * (fabs(w[o * in + j]) + fabs(delta)) + 4e-7 * mag)
                        fail_msg("%s[%lld,%lld]: merged %.9g, formula %.9g", name, (long long)o,
                                 (long long)j, got[o * in + j], want);
                }
            if (!any && memcmp(w, got, (size_t)numel * sizeof *w))
                fail_msg("%s: untargeted projection changed", name);
            if (any) {
                n_changed++;
                assert_true(max_delta > 1e-3); /* the delta is not negligible */
            }
            free(w);
            free(got);
        }
    assert_true(n_changed > 0);
    /* the rest as stored, bit for bit */
    for (size_t i = 0; i < wb.n_tensors; i++) {
        const tdm_st_tensor *t = wb.tensors[i], *u = tdm_weights_find(&wo, t->name);
        assert_non_null(u);
        if (strstr(t->name, "_proj.weight")) continue;
        assert_int_equal(t->nbytes, u->nbytes);
        if (memcmp(t->data, u->data, t->nbytes)) fail_msg("%s changed", t->name);
    }
    assert_int_equal(wb.n_tensors, wo.n_tensors);
    tdm_weights_close(&wb);
    tdm_weights_close(&wo);
}

static tdm_merge_opts opts(const tdm_merge_adapter *a, size_t n, const char *out)
{
    return (tdm_merge_opts){.model_dir = model,
                            .adapters = a,
                            .n_adapters = n,
                            .out_dir = out,
                            .base = TDM_MERGE_BASE_AUTO,
                            .double_quant = true};
}

static void test_weighted_linear_merge(void **state)
{
    (void)state;
    char out[400];
    snprintf(out, sizeof out, "%s/lin", tmpdir);
    tdm_merge_adapter a[2] = {{ad1, 0.7}, {ad2, -0.3}};
    tdm_merge_opts o = opts(a, 2, out);
    tdm_merge_result r;
    OK(tdm_merge(&o, &r, err));
    assert_int_equal(r.base, TDM_MERGE_BASE_ORIGINAL); /* no run records: made elsewhere */
    /* q in every layer, v (ad1) and down (ad2) */
    assert_int_equal(r.n_merged, (size_t)(3 * cfg.num_layers));
    const tdm_lora_params *ls[2] = {&l1, &l2};
    double w[2] = {0.7, -0.3};
    check_projections(out, false, false, ls, w, 2);
    /* the rsLoRA scale is the one used: the scale of l2 is alpha / sqrt(r) */
    assert_true(fabs(l2.scale - 6 / sqrt(2.0)) < 1e-12);
}

static void test_dequantized_base(void **state)
{
    (void)state;
    for (int dq = 0; dq < 2; dq++) {
        char out[400];
        snprintf(out, sizeof out, "%s/deq%d", tmpdir, dq);
        tdm_merge_adapter a[1] = {{ad1, 1}};
        tdm_merge_opts o = opts(a, 1, out);
        o.base = TDM_MERGE_BASE_DEQUANTIZED;
        o.double_quant = dq;
        tdm_merge_result r;
        OK(tdm_merge(&o, &r, err));
        assert_int_equal(r.base, TDM_MERGE_BASE_DEQUANTIZED);
        assert_int_equal(r.double_quant, dq);
        const tdm_lora_params *ls[1] = {&l1};
        double w[1] = {1};
        check_projections(out, true, dq, ls, w, 1);
    }
}

static void test_shards_and_index(void **state)
{
    (void)state;
    char out[400], p[500];
    snprintf(out, sizeof out, "%s/shards", tmpdir);
    tdm_merge_adapter a[1] = {{ad1, 1}};
    tdm_merge_opts o = opts(a, 1, out);
    o.max_shard_bytes = 600000;
    tdm_merge_result r;
    OK(tdm_merge(&o, &r, err));
    assert_true(r.n_shards > 3);
    tdm_weights w = {0};
    OK(tdm_weights_open(&w, out, err)); /* index and shards agree exactly */
    assert_non_null(w.index_path);
    assert_int_equal(w.n_files, r.n_shards);
    assert_int_equal(tdm_weights_data_bytes(&w), r.total_size);
    for (size_t f = 0; f < w.n_files; f++) {
        uint64_t bytes = w.files[f].data_len;
        if (bytes > o.max_shard_bytes) assert_int_equal(w.files[f].n_tensors, 1);
        char want[64];
        snprintf(want, sizeof want, "model-%05zu-of-%05zu.safetensors", f + 1, r.n_shards);
        assert_non_null(strstr(w.file_names[f], want));
        assert_string_equal(tdm_st_metadata(&w.files[f], "format"), "pt");
    }
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", out);
    json_t *idx = json_load_file(p, 0, NULL);
    assert_non_null(idx);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(idx, "metadata"), "total_size")),
        (json_int_t)r.total_size);
    assert_int_equal(json_object_size(json_object_get(idx, "weight_map")), w.n_tensors);
    json_decref(idx);
    tdm_weights_close(&w);
}

static void test_dtype_bf16(void **state)
{
    (void)state;
    char out[400], ref[400], p[500];
    snprintf(out, sizeof out, "%s/bf16", tmpdir);
    snprintf(ref, sizeof ref, "%s/lin", tmpdir); /* test 1's f32 output */
    tdm_merge_adapter a[2] = {{ad1, 0.7}, {ad2, -0.3}};
    tdm_merge_opts o = opts(a, 2, out);
    o.has_dtype = true;
    o.dtype = TDM_DTYPE_BF16;
    OK(tdm_merge(&o, NULL, err));
    tdm_weights w = {0}, wr = {0};
    OK(tdm_weights_open(&w, out, err));
    OK(tdm_weights_open(&wr, ref, err));
    for (size_t i = 0; i < w.n_tensors; i++) {
        const tdm_st_tensor *t = w.tensors[i];
        assert_int_equal(t->dtype, TDM_DTYPE_BF16);
        float *want = tensor_f32(&wr, t->name, NULL);
        const uint16_t *h = t->data;
        for (int64_t k = 0; k < t->numel; k++) {
            uint16_t v;
            memcpy(&v, h + k, 2);
            if (v != tdm_f32_to_bf16(want[k]))
                fail_msg("%s[%lld] not the f32 merge rounded", t->name, (long long)k);
        }
        free(want);
    }
    tdm_weights_close(&w);
    tdm_weights_close(&wr);
    snprintf(p, sizeof p, "%s/config.json", out);
    tdm_model_config c2;
    OK(tdm_model_config_load(&c2, p, err));
    assert_string_equal(c2.torch_dtype, "bfloat16");
    const char *copied[] = {"generation_config.json", "tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 3; i++) {
        char a1[500], b1[500], *x, *y;
        size_t lx, ly;
        snprintf(a1, sizeof a1, "%s/%s", model, copied[i]);
        snprintf(b1, sizeof b1, "%s/%s", out, copied[i]);
        OK(tdm_read_file(a1, &x, &lx, err));
        OK(tdm_read_file(b1, &y, &ly, err));
        assert_int_equal(lx, ly);
        assert_memory_equal(x, y, lx);
        free(x);
        free(y);
    }
    snprintf(p, sizeof p, "%s/%s", out, TDM_MERGE_RECORD_FILE);
    json_t *rec = json_load_file(p, 0, NULL);
    assert_non_null(rec);
    assert_string_equal(json_string_value(json_object_get(rec, "base")), "original");
    assert_int_equal(json_array_size(json_object_get(rec, "adapters")), 2);
    json_decref(rec);
}

/* Whether dir holds an entry whose name contains part. */
static bool dir_has(const char *dir, const char *part)
{
    DIR *d = opendir(dir);
    if (!d) return false;
    bool found = false;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, part)) found = true;
    closedir(d);
    return found;
}

static void expect_fail(tdm_merge_opts *o, tdm_status want, const char *msg)
{
    tdm_error err = {0};
    tdm_status st = tdm_merge(o, NULL, &err);
    if (st != want || !strstr(err.message, msg))
        fail_msg("status %d (want %d), message \"%s\" (want \"%s\")", st, want, err.message, msg);
}

static void write_text(const char *dir, const char *name, const char *text)
{
    char p[500];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    OK(tdm_atomic_write(p, text, strlen(text), 0644, err));
}

static void test_refusals(void **state)
{
    (void)state;
    char out[400], p[500], d[400];
    tdm_merge_adapter a[2] = {{ad1, 1}, {ad2, 1}};
    /* a non-empty out is kept as it was */
    snprintf(out, sizeof out, "%s/busy", tmpdir);
    mkdir(out, 0755);
    write_text(out, "keep.txt", "mine");
    tdm_merge_opts o = opts(a, 1, out);
    expect_fail(&o, TDM_ERR_INVALID, "exists and is not empty");
    snprintf(p, sizeof p, "%s/keep.txt", out);
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    o.force = true;
    OK(tdm_merge(&o, NULL, err));
    assert_int_not_equal(stat(p, &sb), 0);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", out);
    assert_int_equal(stat(p, &sb), 0);
    /* out is the model, or holds an adapter: refused even with force */
    o.out_dir = model;
    expect_fail(&o, TDM_ERR_INVALID, "is (or holds) the model");
    o.out_dir = tmpdir;
    expect_fail(&o, TDM_ERR_INVALID, "is (or holds) the model");
    /* out is, lies inside or holds an adapter directory or a training run's OUT_DIR (runs/r1
     * has only a run record): refused even with force, and the run keeps its files */
    char runs[400], run[450], in_ad2[400];
    snprintf(runs, sizeof runs, "%s/runs", tmpdir);
    snprintf(run, sizeof run, "%s/r1", runs);
    snprintf(in_ad2, sizeof in_ad2, "%s/merged", ad2);
    OK(tdm_mkdir_p(run, 0755, err));
    write_text(run, "metrics.jsonl", "{\"step\": 1, \"loss\": 2.5}\n");
    const char *refused_out[] = {ad2, in_ad2, run, runs};
    const char *why[] = {"is an adapter directory or a training run's OUT_DIR", "lies inside",
                         "r1 is an adapter directory or a training run's OUT_DIR (it has ",
                         "runs holds "};
    for (size_t i = 0; i < sizeof why / sizeof *why; i++) {
        o.out_dir = refused_out[i];
        expect_fail(&o, TDM_ERR_INVALID, why[i]);
    }
    snprintf(p, sizeof p, "%s/metrics.jsonl", run);
    assert_int_equal(stat(p, &sb), 0);
    o.force = false;
    /* an adapter of another shape: one layer more */
    tdm_model_config c5 = cfg;
    c5.num_layers = cfg.num_layers + 1;
    tdm_lora_params l5;
    OK(tdm_lora_params_init(&l5, &c5, 4, 8, false, TDM_LORA_BIT(TDM_LORA_Q), err));
    snprintf(d, sizeof d, "%s/ad_layers", tmpdir);
    tdm_peft_meta meta = {0};
    OK(tdm_peft_save(d, &l5, &meta, err));
    tdm_lora_params_free(&l5);
    snprintf(out, sizeof out, "%s/never", tmpdir);
    tdm_merge_adapter bad[1] = {{d, 1}};
    o = opts(bad, 1, out);
    expect_fail(&o, TDM_ERR_INVALID, "does not fit");
    assert_int_not_equal(stat(out, &sb), 0);
    /* a missing adapter is said not to exist (not "does not fit") */
    snprintf(d, sizeof d, "%s/no_such_adapter", tmpdir);
    expect_fail(&o, TDM_ERR_NOT_FOUND, "no_such_adapter does not exist");
    assert_int_not_equal(stat(out, &sb), 0);
    /* another base model recorded */
    snprintf(d, sizeof d, "%s/ad_other", tmpdir);
    OK(tdm_peft_save(d, &l1, &meta, err));
    write_text(d, "metadata.json",
               "{\"base_model_identity\": \"sha256:0000000000000000000000000000000000000000000000"
               "000000000000000000\", \"method\": \"qlora\", \"double_quant\": true}");
    o = opts(bad, 1, out);
    bad[0].dir = d;
    expect_fail(&o, TDM_ERR_UNSUPPORTED, "was trained on another base model");
    /* QLoRA (recorded) and made elsewhere under auto; explicit bases go through */
    snprintf(d, sizeof d, "%s/ad_q", tmpdir);
    OK(tdm_peft_save(d, &l1, &meta, err));
    write_text(d, "metadata.json", "{\"method\": \"qlora\", \"double_quant\": true}");
    tdm_merge_adapter mixed[2] = {{d, 1}, {ad2, 1}};
    o = opts(mixed, 2, out);
    expect_fail(&o, TDM_ERR_UNSUPPORTED, "pick the base with --base");
    o.base = TDM_MERGE_BASE_DEQUANTIZED;
    tdm_merge_result r;
    OK(tdm_merge(&o, &r, err));
    assert_true(r.double_quant);
    /* the adapter's recorded setting against the user's */
    o.double_quant = false;
    o.double_quant_given = true;
    o.force = true;
    expect_fail(&o, TDM_ERR_UNSUPPORTED, "drop --no-double-quant");
    /* a qlora adapter alone: dequantized by default, with its record's setting */
    char d2[400];
    snprintf(d2, sizeof d2, "%s/ad_q2", tmpdir);
    OK(tdm_peft_save(d2, &l2, &meta, err));
    write_text(d2, "metadata.json", "{\"method\": \"qlora\", \"double_quant\": false}");
    tdm_merge_adapter one[1] = {{d2, 1}};
    o = opts(one, 1, out);
    o.force = true;
    OK(tdm_merge(&o, &r, err));
    assert_int_equal(r.base, TDM_MERGE_BASE_DEQUANTIZED);
    assert_false(r.double_quant);
    /* two double-quantization settings */
    tdm_merge_adapter two[2] = {{d, 1}, {d2, 1}};
    o = opts(two, 2, out);
    o.force = true;
    expect_fail(&o, TDM_ERR_UNSUPPORTED, "no one dequantized base matches both");
    write_text(d2, "metadata.json", "{\"method\": \"qlora\", \"nf4_block_size\": 128}");
    o = opts(one, 1, out);
    o.force = true;
    expect_fail(&o, TDM_ERR_UNSUPPORTED, "nf4_block_size 128");
}

static void test_faults_leave_nothing(void **state)
{
    (void)state;
    const char *points[] = {"safetensors.write", "safetensors.rename", "atomic_write.fsync",
                            "atomic_dir.rename"};
    char parent[400], out[500];
    snprintf(parent, sizeof parent, "%s/faults", tmpdir);
    mkdir(parent, 0755);
    snprintf(out, sizeof out, "%s/m", parent);
    tdm_merge_adapter a[1] = {{ad1, 1}};
    for (int i = 0; i < 4; i++) {
        setenv("TANDEM_FAULT_INJECT", points[i], 1);
        tdm_merge_opts o = opts(a, 1, out);
        tdm_error err = {0};
        tdm_status st = tdm_merge(&o, NULL, &err);
        unsetenv("TANDEM_FAULT_INJECT");
        if (st == TDM_OK) fail_msg("fault %s: the merge succeeded", points[i]);
        struct stat sb;
        if (stat(out, &sb) == 0) fail_msg("fault %s: %s exists", points[i], out);
        if (dir_has(parent, ".m.")) fail_msg("fault %s: a temporary directory is left", points[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_weighted_linear_merge),
        cmocka_unit_test(test_dequantized_base),
        cmocka_unit_test(test_shards_and_index),
        cmocka_unit_test(test_dtype_bf16),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_faults_leave_nothing),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
