#include "train/merge.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/config.h"
#include "model/layout.h"
#include "model/lora_targets.h"
#include "model/nf4.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "train/checkpoint.h"
#include "train/lora.h"
#include "train/peft_io.h"
#include "train/run_records.h"
#include "util/atomic_dir.h"
#include "util/atomic_file.h"
#include "util/half.h"
#include "util/json_file.h"
#include "util/mkdir_p.h"
#include "util/path_identity.h"

const char *const TDM_MERGE_COPIED_FILES[] = {
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    NULL,
};

const char *tdm_merge_base_name(tdm_merge_base b)
{
    switch (b) {
    case TDM_MERGE_BASE_ORIGINAL:
        return "original";
    case TDM_MERGE_BASE_DEQUANTIZED:
        return "dequantized";
    default:
        return "auto";
    }
}

static void note(const tdm_merge_opts *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void note(const tdm_merge_opts *o, const char *fmt, ...)
{
    if (!o->note) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    o->note(line, o->note_user);
}

/* What one adapter's run record says about how its base was held. */
typedef struct adapter_info {
    char method[16]; /* "qlora", "lora", "" when unrecorded */
    bool double_quant;
    char record[4200]; /* the metadata.json read, "" when none */
    tdm_lora_params lp;
} adapter_info;

static tdm_status read_record(const char *dir, adapter_info *ai, tdm_error *err)
{
    json_t *md = tdm_adapter_run_record(dir, ai->record, sizeof ai->record);
    if (!md) {
        ai->record[0] = 0;
        return TDM_OK;
    }
    tdm_status st = TDM_OK;
    const char *m = json_string_value(json_object_get(md, "method"));
    json_t *bs = json_object_get(md, "nf4_block_size");
    if (m && strcmp(m, "qlora") && strcmp(m, "lora"))
        st = tdm_fail(err, TDM_ERR_UNSUPPORTED, "%s: method \"%s\" is not qlora or lora",
                      ai->record, m);
    else if (m && !strcmp(m, "qlora") && json_is_integer(bs) &&
             json_integer_value(bs) != TDM_NF4_BLOCK)
        st = tdm_fail(err, TDM_ERR_UNSUPPORTED,
                      "%s: nf4_block_size %lld, but this tandem quantizes in blocks of %d",
                      ai->record, (long long)json_integer_value(bs), TDM_NF4_BLOCK);
    if (st == TDM_OK && m) {
        snprintf(ai->method, sizeof ai->method, "%s", m);
        ai->double_quant = json_is_true(json_object_get(md, "double_quant"));
    }
    json_decref(md);
    return st;
}

/* Picks the base from the options and the adapters' records (see merge.h). */
static tdm_status resolve_base(const tdm_merge_opts *o, const adapter_info *ai,
                               tdm_merge_base *base, bool *dq, tdm_error *err)
{
    size_t first_q = SIZE_MAX, first_other = SIZE_MAX;
    for (size_t i = 0; i < o->n_adapters; i++) {
        if (!strcmp(ai[i].method, "qlora")) {
            if (first_q == SIZE_MAX)
                first_q = i;
            else if (ai[i].double_quant != ai[first_q].double_quant)
                return tdm_fail(err, TDM_ERR_UNSUPPORTED,
                                "%s was trained with%s double quantization and %s with%s (%s, %s): "
                                "no one dequantized base matches both; merge them separately or "
                                "pass --base original",
                                o->adapters[first_q].dir, ai[first_q].double_quant ? "" : "out",
                                o->adapters[i].dir, ai[i].double_quant ? "" : "out",
                                ai[first_q].record, ai[i].record);
        } else if (first_other == SIZE_MAX) {
            first_other = i;
        }
    }
    *base = o->base;
    if (*base == TDM_MERGE_BASE_AUTO) {
        if (first_q != SIZE_MAX && first_other != SIZE_MAX)
            return tdm_fail(err, TDM_ERR_UNSUPPORTED,
                            "%s was trained with QLoRA (%s) but %s %s: pick the base with --base "
                            "dequantized or --base original",
                            o->adapters[first_q].dir, ai[first_q].record,
                            o->adapters[first_other].dir,
                            ai[first_other].method[0] ? "with --method lora"
                                                      : "records no method (made elsewhere)");
        *base = first_q != SIZE_MAX ? TDM_MERGE_BASE_DEQUANTIZED : TDM_MERGE_BASE_ORIGINAL;
    }
    *dq = first_q != SIZE_MAX ? ai[first_q].double_quant : o->double_quant;
    if (*base == TDM_MERGE_BASE_DEQUANTIZED && o->double_quant_given && first_q != SIZE_MAX &&
        o->double_quant != ai[first_q].double_quant)
        return tdm_fail(err, TDM_ERR_UNSUPPORTED,
                        "%s was trained with%s double quantization (%s): drop --%s so the "
                        "dequantized base is the one it saw",
                        o->adapters[first_q].dir, ai[first_q].double_quant ? "" : "out",
                        ai[first_q].record, o->double_quant ? "double-quant" : "no-double-quant");
    return TDM_OK;
}

/* out_dir with its trailing slashes removed, into buf. */
static void strip_slashes(const char *in, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", in);
    size_t l = strlen(buf);
    while (l > 1 && buf[l - 1] == '/')
        buf[--l] = 0;
}

/* The first adapter directory or training OUT_DIR (train/checkpoint.h) below dir, not following
 * symbolic links: its path into found, the entry that marks it into marker. */
static bool find_run_dir_below(const char *dir, char *found, size_t found_cap, char *marker,
                               size_t marker_cap)
{
    DIR *d = opendir(dir);
    if (!d) return false;
    bool hit = false;
    struct dirent *e;
    while (!hit && (e = readdir(d))) {
        char sub[PATH_MAX];
        struct stat sb;
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (snprintf(sub, sizeof sub, "%s/%s", dir, e->d_name) >= (int)sizeof sub) continue;
        if (lstat(sub, &sb) != 0 || !S_ISDIR(sb.st_mode)) continue;
        if (tdm_is_adapter_or_run_dir(sub, marker, marker_cap)) {
            snprintf(found, found_cap, "%s", sub);
            hit = true;
        } else {
            hit = find_run_dir_below(sub, found, found_cap, marker, marker_cap);
        }
    }
    closedir(d);
    return hit;
}

/* Refuses, with or without force, an out_dir that is, holds or lies inside a PEFT adapter
 * directory or a training run's OUT_DIR: replacing it would delete the run. An earlier merged
 * model has none of their files and may be replaced. out_real: out resolved (tdm_path_resolve). */
static tdm_status check_not_run_dir(const char *out, const char *out_real, tdm_error *err)
{
    char real[TDM_PATH_IDENTITY_MAX], marker[PATH_MAX + 64];
    snprintf(real, sizeof real, "%s", out_real);
    struct stat sb;
    bool out_exists = stat(out, &sb) == 0 && S_ISDIR(sb.st_mode);
    for (bool at_out = out_exists;; at_out = false) {
        if (tdm_is_adapter_or_run_dir(at_out ? out : real, marker, sizeof marker)) {
            if (at_out)
                return tdm_fail(err, TDM_ERR_INVALID,
                                "--out %s is an adapter directory or a training run's OUT_DIR "
                                "(it has %s), which even --force does not replace: write the "
                                "merged model to a new directory",
                                out, marker);
            return tdm_fail(err, TDM_ERR_INVALID,
                            "--out %s lies inside %s, an adapter directory or a training run's "
                            "OUT_DIR (it has %s): write the merged model outside it",
                            out, real, marker);
        }
        char *slash = strrchr(real, '/');
        if (!slash || !strcmp(real, "/")) break;
        slash[slash == real ? 1 : 0] = 0;
    }
    char found[PATH_MAX];
    if (out_exists && find_run_dir_below(out, found, sizeof found, marker, sizeof marker))
        return tdm_fail(err, TDM_ERR_INVALID,
                        "--out %s holds %s, an adapter directory or a training run's OUT_DIR (it "
                        "has %s), which even --force does not replace: write the merged model "
                        "elsewhere",
                        out, found, marker);
    return TDM_OK;
}

/* Refuses an out_dir that would overwrite or remove the inputs or a training run, or a non-empty
 * one without force; creates its parent. */
static tdm_status check_out_dir(const tdm_merge_opts *o, const char *out, tdm_error *err)
{
    char ko[TDM_PATH_IDENTITY_MAX], k[TDM_PATH_IDENTITY_MAX];
    char out_real[TDM_PATH_IDENTITY_MAX], in_real[TDM_PATH_IDENTITY_MAX];
    TDM_TRY(tdm_path_identity("", out, ko, sizeof ko, err));
    TDM_TRY(tdm_path_resolve("", out, out_real, sizeof out_real, err));
    for (size_t i = 0; i <= o->n_adapters; i++) {
        const char *in = i == 0 ? o->model_dir : o->adapters[i - 1].dir;
        TDM_TRY(tdm_path_identity("", in, k, sizeof k, err));
        TDM_TRY(tdm_path_resolve("", in, in_real, sizeof in_real, err));
        if (!strcmp(k, ko) || tdm_path_within(in_real, out_real))
            return tdm_fail(err, TDM_ERR_INVALID,
                            "--out %s is (or holds) the %s %s: write the merged model elsewhere",
                            out, i == 0 ? "model" : "adapter", in);
        if (i > 0 && tdm_path_within(out_real, in_real))
            return tdm_fail(err, TDM_ERR_INVALID,
                            "--out %s lies inside the adapter %s: write the merged model outside "
                            "it",
                            out, in);
    }
    TDM_TRY(check_not_run_dir(out, out_real, err));
    struct stat sb;
    if (lstat(out, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode))
            return tdm_fail(err, TDM_ERR_INVALID, "--out %s exists and is not a directory", out);
        DIR *d = opendir(out);
        if (!d) return tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot open %s", out);
        bool empty = true;
        struct dirent *e;
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = false;
        closedir(d);
        if (!empty && !o->force)
            return tdm_fail(err, TDM_ERR_INVALID,
                            "--out %s exists and is not empty: choose another directory, or pass "
                            "--force to replace it (atomically, once the merge is complete)",
                            out);
    } else if (errno != ENOENT) {
        return tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot stat %s", out);
    }
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", out);
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent) {
        *slash = 0;
        TDM_TRY(tdm_mkdir_p(parent, 0755, err));
    }
    return TDM_OK;
}

/* The (layer, target) of a decoder projection name of a layer the config uses, else false. */
static bool projection_of(const char *name, int num_layers, int *layer, unsigned *target)
{
    static const char prefix[] = "model.layers.";
    if (strncmp(name, prefix, sizeof prefix - 1)) return false;
    const char *p = name + sizeof prefix - 1;
    char *end;
    errno = 0;
    long l = strtol(p, &end, 10);
    if (end == p || *end != '.' || errno || l < 0 || l >= num_layers) return false;
    for (unsigned t = 0; t < TDM_LORA_N_TARGETS; t++) {
        char want[64];
        snprintf(want, sizeof want, ".%s.weight", tdm_lora_target_path(t));
        if (!strcmp(end, want)) {
            *layer = (int)l;
            *target = t;
            return true;
        }
    }
    return false;
}

static bool is_float(tdm_dtype d)
{
    return d == TDM_DTYPE_F32 || d == TDM_DTYPE_F16 || d == TDM_DTYPE_BF16;
}

static const char *torch_dtype_name(tdm_dtype d)
{
    return d == TDM_DTYPE_F32 ? "float32" : d == TDM_DTYPE_F16 ? "float16" : "bfloat16";
}

/* W (rows, cols) += sum_i (coef[i] * B_i[row, k]) * A_i[k, :] over k ascending, accumulated per
 * row in f32 before the one addition to W. acc: omp_get_max_threads() rows of cols floats. */
static void add_deltas(float *W, int64_t rows, int64_t cols, const tdm_lora_module *const *mods,
                       const int *ranks, const float *coef, int n, float *acc)
{
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < rows; o++) {
        float *a = acc + (size_t)omp_get_thread_num() * (size_t)cols;
        memset(a, 0, (size_t)cols * sizeof *a);
        for (int i = 0; i < n; i++) {
            const float *B = mods[i]->B + o * ranks[i];
            for (int k = 0; k < ranks[i]; k++) {
                float b = coef[i] * B[k];
                const float *Ak = mods[i]->A + (int64_t)k * cols;
                for (int64_t j = 0; j < cols; j++)
                    a[j] += b * Ak[j];
            }
        }
        float *w = W + o * cols;
        for (int64_t j = 0; j < cols; j++)
            w[j] += a[j];
    }
}

static tdm_status copy_file(const char *src, const char *dst, tdm_error *err)
{
    char *data = NULL;
    size_t len = 0;
    TDM_TRY(tdm_read_file(src, &data, &len, err));
    tdm_status st = tdm_atomic_write(dst, data, len, 0644, err);
    free(data);
    return st;
}

static tdm_status write_config(const tdm_merge_opts *o, const char *tmp, tdm_error *err)
{
    char src[4200], dst[4200];
    snprintf(src, sizeof src, "%s/config.json", o->model_dir);
    snprintf(dst, sizeof dst, "%s/config.json", tmp);
    if (!o->has_dtype) return copy_file(src, dst, err);
    json_error_t je;
    json_t *doc = json_load_file(src, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(doc)) {
        json_decref(doc);
        return tdm_fail(err, TDM_ERR_PARSE, "%s:%d:%d: %s", src, je.line, je.column, je.text);
    }
    const char *name = torch_dtype_name(o->dtype);
    /* transformers >= 5 writes "dtype", older versions "torch_dtype": set the ones present */
    bool has_new = json_object_get(doc, "dtype") != NULL;
    if (!has_new || json_object_get(doc, "torch_dtype"))
        json_object_set_new(doc, "torch_dtype", json_string(name));
    if (has_new) json_object_set_new(doc, "dtype", json_string(name));
    tdm_status st =
        tdm_atomic_write_json(dst, doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER, true, 0644, err);
    json_decref(doc);
    return st;
}

static tdm_status write_record(const tdm_merge_opts *o, const adapter_info *ai,
                               const tdm_merge_result *r, const char *tmp, tdm_error *err)
{
    json_t *doc = json_object(), *ads = json_array();
    json_object_set_new(doc, "model", json_string(o->model_dir));
    json_object_set_new(doc, "base", json_string(tdm_merge_base_name(r->base)));
    bool deq = r->base == TDM_MERGE_BASE_DEQUANTIZED;
    json_object_set_new(doc, "double_quant", deq ? json_boolean(r->double_quant) : json_null());
    json_object_set_new(doc, "nf4_block_size", deq ? json_integer(TDM_NF4_BLOCK) : json_null());
    json_object_set_new(doc, "dtype",
                        o->has_dtype ? json_string(tdm_dtype_name(o->dtype)) : json_null());
    for (size_t i = 0; i < o->n_adapters; i++) {
        const tdm_lora_params *lp = &ai[i].lp;
        json_array_append_new(ads, json_pack("{s:s, s:f, s:s?, s:i, s:f, s:b, s:f}", "path",
                                             o->adapters[i].dir, "weight", o->adapters[i].weight,
                                             "method", ai[i].method[0] ? ai[i].method : NULL, "r",
                                             lp->rank, "lora_alpha", lp->alpha, "use_rslora",
                                             lp->use_rslora, "scale", lp->scale));
    }
    json_object_set_new(doc, "adapters", ads);
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", tmp, TDM_MERGE_RECORD_FILE);
    tdm_status st =
        tdm_atomic_write_json(path, doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER, true, 0644, err);
    json_decref(doc);
    return st;
}

/* One output tensor: its source, output dtype, shard and what happens to it. */
typedef struct out_tensor {
    const tdm_st_tensor *t;
    tdm_dtype dtype;
    size_t shard;
    int layer; /* projection: layer and target, else layer -1 */
    unsigned target;
    int n_mods; /* adapters targeting it */
} out_tensor;

typedef struct merge_job {
    const tdm_merge_opts *o;
    adapter_info *ai;
    tdm_merge_base base;
    bool dq;
    tdm_weights w;
    out_tensor *ot;
    size_t n;
    float *host; /* max numel f32 */
    void *conv;  /* max numel * output size */
    float *acc;  /* threads * max cols */
    const tdm_lora_module **mods;
    int *ranks;
    float *coef;
} merge_job;

/* Produces tensor i in its output dtype and hands its bytes to the writer. */
static tdm_status write_tensor(merge_job *j, size_t i, tdm_st_writer *wr, tdm_error *err)
{
    const out_tensor *x = &j->ot[i];
    const tdm_st_tensor *t = x->t;
    bool deq = x->layer >= 0 && j->base == TDM_MERGE_BASE_DEQUANTIZED;
    if (!deq && x->n_mods == 0 && x->dtype == t->dtype)
        return tdm_st_writer_write(wr, t->data, (size_t)t->nbytes, err);
    TDM_TRY(tdm_st_tensor_to_f32(t, j->host, err));
    if (deq) {
        tdm_nf4 q;
        TDM_TRY(tdm_nf4_quantize(j->host, t->numel, j->dq, &q, err));
        tdm_nf4_dequantize(&q, j->host);
        tdm_nf4_free(&q);
    }
    if (x->n_mods > 0) {
        int n = 0;
        for (size_t a = 0; a < j->o->n_adapters; a++) {
            const tdm_lora_module *m = tdm_lora_params_find(&j->ai[a].lp, x->layer, x->target);
            if (!m) continue;
            j->mods[n] = m;
            j->ranks[n] = j->ai[a].lp.rank;
            j->coef[n] = (float)(j->o->adapters[a].weight * j->ai[a].lp.scale);
            n++;
        }
        add_deltas(j->host, t->shape[0], t->shape[1], j->mods, j->ranks, j->coef, n, j->acc);
    }
    size_t n = (size_t)t->numel;
    switch (x->dtype) {
    case TDM_DTYPE_F32:
        return tdm_st_writer_write(wr, j->host, n * sizeof(float), err);
    case TDM_DTYPE_BF16:
        tdm_f32_to_bf16_n(j->host, j->conv, n);
        break;
    default:
        tdm_f32_to_f16_n(j->host, j->conv, n);
        break;
    }
    return tdm_st_writer_write(wr, j->conv, n * 2, err);
}

/* Plans the output tensors and shards, and allocates the work buffers. */
static tdm_status plan(merge_job *j, const tdm_model_config *cfg, tdm_merge_result *r,
                       tdm_error *err)
{
    const tdm_merge_opts *o = j->o;
    uint64_t cap = o->max_shard_bytes ? o->max_shard_bytes : TDM_MERGE_DEFAULT_SHARD_BYTES;
    j->n = j->w.n_tensors;
    if (!(j->ot = calloc(j->n ? j->n : 1, sizeof *j->ot)))
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    int64_t max_numel = 1, max_cols = 1;
    uint64_t shard_bytes = 0;
    size_t shard = 0;
    for (size_t i = 0; i < j->n; i++) {
        out_tensor *x = &j->ot[i];
        x->t = j->w.tensors[i];
        x->dtype = o->has_dtype && is_float(x->t->dtype) ? o->dtype : x->t->dtype;
        x->layer = -1;
        int layer;
        unsigned tg;
        if (projection_of(x->t->name, cfg->num_layers, &layer, &tg) && x->t->rank == 2) {
            x->layer = layer, x->target = tg;
            for (size_t a = 0; a < o->n_adapters; a++)
                if (tdm_lora_params_find(&j->ai[a].lp, layer, tg)) x->n_mods++;
            if (x->n_mods) r->n_merged++;
            if (x->t->shape[1] > max_cols) max_cols = x->t->shape[1];
        }
        if (is_float(x->t->dtype) && x->t->numel > max_numel) max_numel = x->t->numel;
        uint64_t bytes = (uint64_t)x->t->numel * tdm_dtype_size(x->dtype);
        if (shard_bytes > 0 && shard_bytes + bytes > cap) shard++, shard_bytes = 0;
        x->shard = shard;
        shard_bytes += bytes;
        r->total_size += bytes;
    }
    r->n_tensors = j->n;
    r->n_shards = j->n ? shard + 1 : 0;
    size_t threads = (size_t)omp_get_max_threads();
    j->host = malloc((size_t)max_numel * sizeof(float));
    j->conv = malloc((size_t)max_numel * 2);
    j->acc = malloc(threads * (size_t)max_cols * sizeof(float));
    j->mods = calloc(o->n_adapters, sizeof *j->mods);
    j->ranks = calloc(o->n_adapters, sizeof *j->ranks);
    j->coef = calloc(o->n_adapters, sizeof *j->coef);
    if (!j->host || !j->conv || !j->acc || !j->mods || !j->ranks || !j->coef)
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory for a %lld-element tensor",
                        (long long)max_numel);
    return TDM_OK;
}

static void shard_name(char *buf, size_t cap, size_t i, size_t n)
{
    snprintf(buf, cap, "model-%05zu-of-%05zu.safetensors", i + 1, n);
}

static tdm_status write_shards(merge_job *j, const char *tmp, size_t n_shards, tdm_error *err)
{
    static const char *const meta[] = {"format", "pt"};
    tdm_st_spec *specs = calloc(j->n ? j->n : 1, sizeof *specs);
    if (!specs) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    tdm_status st = TDM_OK;
    size_t i = 0;
    for (size_t s = 0; st == TDM_OK && s < n_shards; s++) {
        size_t first = i, k = 0;
        uint64_t bytes = 0;
        for (; i < j->n && j->ot[i].shard == s; i++, k++) {
            const out_tensor *x = &j->ot[i];
            specs[k].name = x->t->name;
            specs[k].dtype = x->dtype;
            specs[k].rank = x->t->rank;
            memcpy(specs[k].shape, x->t->shape, sizeof specs[k].shape);
            bytes += (uint64_t)x->t->numel * tdm_dtype_size(x->dtype);
        }
        char name[64], path[4200];
        shard_name(name, sizeof name, s, n_shards);
        snprintf(path, sizeof path, "%s/%s", tmp, name);
        tdm_st_writer *wr = NULL;
        st = tdm_st_writer_open(&wr, path, specs, k, meta, 1, err);
        for (size_t t = first; st == TDM_OK && t < i; t++) {
            st = write_tensor(j, t, wr, err);
            if (st != TDM_OK) tdm_error_prefix(err, "%s", j->ot[t].t->name);
        }
        if (st == TDM_OK)
            st = tdm_st_writer_commit(wr, err);
        else
            tdm_st_writer_abort(wr);
        if (st == TDM_OK)
            note(j->o, "wrote %s: %zu tensors, %.1f MB", name, k, (double)bytes / 1e6);
    }
    free(specs);
    return st;
}

static tdm_status write_index(merge_job *j, const char *tmp, const tdm_merge_result *r,
                              tdm_error *err)
{
    json_t *doc = json_object(), *md = json_object(), *wm = json_object();
    json_object_set_new(md, "total_size", json_integer((json_int_t)r->total_size));
    for (size_t i = 0; i < j->n; i++) {
        char name[64];
        shard_name(name, sizeof name, j->ot[i].shard, r->n_shards);
        json_object_set_new(wm, j->ot[i].t->name, json_string(name));
    }
    json_object_set_new(doc, "metadata", md);
    json_object_set_new(doc, "weight_map", wm);
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", tmp);
    tdm_status st =
        tdm_atomic_write_json(path, doc, JSON_INDENT(2) | JSON_SORT_KEYS, true, 0644, err);
    json_decref(doc);
    return st;
}

tdm_status tdm_merge(const tdm_merge_opts *o, tdm_merge_result *res, tdm_error *err)
{
    tdm_merge_result r = {0};
    if (!o->n_adapters) return tdm_fail(err, TDM_ERR_INVALID, "no adapter to merge");
    for (size_t i = 0; i < o->n_adapters; i++) {
        const char *dir = o->adapters[i].dir;
        struct stat sb;
        if (!isfinite(o->adapters[i].weight))
            return tdm_fail(err, TDM_ERR_INVALID, "adapter %s: the weight is not finite", dir);
        if (stat(dir, &sb) != 0 && errno == ENOENT)
            return tdm_fail(err, TDM_ERR_NOT_FOUND,
                            "adapter %s does not exist: give a PEFT adapter directory (a "
                            "training run's OUT_DIR, its best/ or a checkpoint-N/)",
                            dir);
    }
    if (o->has_dtype && !is_float(o->dtype))
        return tdm_fail(err, TDM_ERR_INVALID, "output dtype %s is not F32, F16 or BF16",
                        tdm_dtype_name(o->dtype));
    char out[4096];
    strip_slashes(o->out_dir, out, sizeof out);
    TDM_TRY(check_out_dir(o, out, err));

    tdm_model_config cfg;
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", o->model_dir);
    TDM_TRY(tdm_model_config_load(&cfg, path, err));

    merge_job j = {.o = o};
    char tmp[4096] = "";
    tdm_status st = TDM_OK;
    if (!(j.ai = calloc(o->n_adapters, sizeof *j.ai)))
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    for (size_t i = 0; st == TDM_OK && i < o->n_adapters; i++) {
        const char *dir = o->adapters[i].dir;
        st = tdm_adapter_check_base(dir, o->model_dir, err);
        if (st == TDM_OK) st = read_record(dir, &j.ai[i], err);
        if (st == TDM_OK && (st = tdm_peft_load(dir, &cfg, &j.ai[i].lp, NULL, err)) != TDM_OK &&
            st != TDM_ERR_NOT_FOUND) /* a missing file: not a misfit, the message says what */
            tdm_error_prefix(err, "adapter %s does not fit %s", dir, o->model_dir);
    }
    if (st == TDM_OK) st = resolve_base(o, j.ai, &j.base, &j.dq, err);
    r.base = j.base;
    r.double_quant = j.base == TDM_MERGE_BASE_DEQUANTIZED && j.dq;
    if (st == TDM_OK) {
        for (size_t i = 0; i < o->n_adapters; i++)
            if (j.base == TDM_MERGE_BASE_ORIGINAL && !strcmp(j.ai[i].method, "qlora"))
                note(o,
                     "%s was trained with QLoRA; merging into the original weights, not the "
                     "dequantized NF4 ones it saw (--base original)",
                     o->adapters[i].dir);
            else if (j.ai[i].record[0] && !j.ai[i].method[0] && o->base == TDM_MERGE_BASE_AUTO)
                note(o,
                     "%s: %s does not record the training method (an older tandem): merging "
                     "into the original weights; pass --base dequantized if it was trained "
                     "with QLoRA",
                     o->adapters[i].dir, j.ai[i].record);
        note(o, "base: %s%s", tdm_merge_base_name(j.base),
             j.base != TDM_MERGE_BASE_DEQUANTIZED ? ""
             : j.dq                               ? " (NF4, blocks of 64, double quantization)"
                                                  : " (NF4, blocks of 64, no double quantization)");
    }
    if (st == TDM_OK) st = tdm_weights_open(&j.w, o->model_dir, err);
    if (st == TDM_OK) st = tdm_model_check_weights(&cfg, &j.w, NULL, err);
    if (st == TDM_OK) st = plan(&j, &cfg, &r, err);
    if (st == TDM_OK) st = tdm_atomic_dir_begin(out, tmp, sizeof tmp, err);
    if (st == TDM_OK) st = write_shards(&j, tmp, r.n_shards, err);
    if (st == TDM_OK) st = write_index(&j, tmp, &r, err);
    if (st == TDM_OK) st = write_config(o, tmp, err);
    for (size_t i = 0; st == TDM_OK && TDM_MERGE_COPIED_FILES[i]; i++) {
        char src[4200], dst[4200];
        struct stat sb;
        snprintf(src, sizeof src, "%s/%s", o->model_dir, TDM_MERGE_COPIED_FILES[i]);
        snprintf(dst, sizeof dst, "%s/%s", tmp, TDM_MERGE_COPIED_FILES[i]);
        if (stat(src, &sb) == 0) st = copy_file(src, dst, err);
    }
    if (st == TDM_OK) st = write_record(o, j.ai, &r, tmp, err);
    if (st == TDM_OK) {
        st = tdm_atomic_dir_commit(tmp, out, err);
    } else if (tmp[0]) {
        tdm_atomic_dir_abort(tmp);
    }
    tdm_weights_close(&j.w);
    for (size_t i = 0; i < o->n_adapters; i++)
        tdm_lora_params_free(&j.ai[i].lp);
    free(j.ai);
    free(j.ot);
    free(j.host);
    free(j.conv);
    free(j.acc);
    free(j.mods);
    free(j.ranks);
    free(j.coef);
    if (st == TDM_OK && res) *res = r;
    return st;
}
