#include "model/init_model.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/layout.h"
#include "model/presets.h"
#include "model/safetensors.h"
#include "util/atomic_file.h"
#include "util/json_file.h"
#include "util/half.h"
#include "util/rng.h"

#define CHUNK_ELEMS 65536
#define PIECE_CHUNKS 16 /* 1 Mi elements per write: 4 MB of f32 */

uint64_t tdm_init_model_chunk_seed(uint64_t seed, const char *name, uint64_t chunk)
{
    uint64_t st = seed ^ tdm_hash_str(name);
    return tdm_splitmix64(&st) + chunk;
}

/* Fills out[0..n) with the values of elements [first, first + n) of a tensor; first and n are
 * multiples of CHUNK_ELEMS except for the tensor's tail. */
static void fill_piece(const tdm_tensor_desc *d, uint64_t seed, double std, int64_t first,
                       int64_t n, float *out)
{
    if (d->role == TDM_ROLE_NORM || d->role == TDM_ROLE_BIAS) {
        float v = d->role == TDM_ROLE_NORM ? 1.0f : 0.0f;
        for (int64_t i = 0; i < n; i++)
            out[i] = v;
        return;
    }
    int64_t nchunks = (n + CHUNK_ELEMS - 1) / CHUNK_ELEMS;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < nchunks; c++) {
        tdm_rng r;
        tdm_rng_seed(&r, tdm_init_model_chunk_seed(seed, d->name,
                                                   (uint64_t)(first / CHUNK_ELEMS + c)));
        int64_t lo = c * CHUNK_ELEMS, hi = lo + CHUNK_ELEMS < n ? lo + CHUNK_ELEMS : n;
        for (int64_t i = lo; i < hi; i++)
            out[i] = (float)(tdm_rng_normal(&r) * std);
    }
}

static tdm_status write_weights(const char *path, const tdm_model_config *cfg,
                                const tdm_init_model_opts *o, tdm_error *err)
{
    tdm_tensor_desc *d;
    size_t n;
    tdm_status st = tdm_model_layout(cfg, &d, &n, err);
    if (st != TDM_OK)
        return st;
    tdm_st_spec *specs = calloc(n, sizeof *specs);
    float *buf = malloc((size_t)CHUNK_ELEMS * PIECE_CHUNKS * sizeof(float));
    uint16_t *half = malloc((size_t)CHUNK_ELEMS * PIECE_CHUNKS * sizeof(uint16_t));
    tdm_st_writer *w = NULL;
    if (!specs || !buf || !half) {
        st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        specs[i].name = d[i].name;
        specs[i].dtype = o->dtype;
        specs[i].rank = d[i].rank;
        specs[i].shape[0] = d[i].shape[0];
        specs[i].shape[1] = d[i].shape[1];
    }
    char seed_str[32];
    snprintf(seed_str, sizeof seed_str, "%llu", (unsigned long long)o->seed);
    const char *meta[] = {"format", "pt", "tandem.preset", o->preset, "tandem.seed", seed_str};
    if ((st = tdm_st_writer_open(&w, path, specs, n, meta, 3, err)) != TDM_OK)
        goto out;
    uint64_t total = tdm_st_writer_remaining(w), done = 0;
    for (size_t i = 0; i < n && st == TDM_OK; i++) {
        int64_t numel = d[i].shape[0] * (d[i].rank == 2 ? d[i].shape[1] : 1);
        for (int64_t at = 0; at < numel && st == TDM_OK; at += CHUNK_ELEMS * PIECE_CHUNKS) {
            int64_t m = numel - at < CHUNK_ELEMS * PIECE_CHUNKS ? numel - at
                                                                : CHUNK_ELEMS * PIECE_CHUNKS;
            fill_piece(&d[i], o->seed, o->init_std > 0 ? o->init_std : 0.02, at, m, buf);
            if (o->dtype == TDM_DTYPE_BF16) {
                tdm_f32_to_bf16_n(buf, half, (size_t)m);
                st = tdm_st_writer_write(w, half, (size_t)m * 2, err);
                done += (uint64_t)m * 2;
            } else {
                st = tdm_st_writer_write(w, buf, (size_t)m * 4, err);
                done += (uint64_t)m * 4;
            }
            if (o->progress)
                o->progress(done, total, o->user);
        }
    }
    if (st == TDM_OK) {
        st = tdm_st_writer_commit(w, err);
        w = NULL;
    }
out:
    tdm_st_writer_abort(w);
    free(specs);
    free(buf);
    free(half);
    free(d);
    return st;
}

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the others to 256 + k in order. */
static void byte_to_unicode(int byte_to_cp[256])
{
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
        byte_to_cp[b] = printable ? b : 256 + n++;
    }
}

static void utf8_encode(int cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else if (cp < 0x800) {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        out[2] = 0;
    } else {
        out[0] = (char)(0xe0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        out[3] = 0;
    }
}

static const char *const specials[3] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};

static const char chatml_template[] =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

static json_t *byte_level(bool prefix_space)
{
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space",
                     prefix_space, "trim_offsets", 1, "use_regex", 1);
}

static tdm_status write_json(const char *path, json_t *doc, tdm_error *err)
{
    tdm_status st =
        tdm_atomic_write_json(path, doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER, false, 0644, err);
    json_decref(doc);
    return st;
}

static tdm_status write_byte_tokenizer(const char *dir, const tdm_model_config *cfg,
                                       tdm_error *err)
{
    int cps[256];
    byte_to_unicode(cps);
    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++) {
        char s[8];
        utf8_encode(cps[b], s);
        json_object_set_new(vocab, s, json_integer(b));
    }
    json_t *added = json_array();
    for (int i = 0; i < 3; i++)
        json_array_append_new(
            added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", 256 + i, "content",
                             specials[i], "single_word", 0, "lstrip", 0, "rstrip", 0,
                             "normalized", 0, "special", 1));
    json_t *model = json_pack("{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o, s:[]}", "type",
                              "BPE", "dropout", "unk_token", "continuing_subword_prefix",
                              "end_of_word_suffix", "fuse_unk", 0, "byte_fallback", 0,
                              "ignore_merges", 0, "vocab", vocab, "merges");
    json_t *tok = json_pack("{s:s, s:n, s:n, s:o, s:n, s:o, s:n, s:o, s:o}", "version", "1.0",
                            "truncation", "padding", "added_tokens", added, "normalizer",
                            "pre_tokenizer", byte_level(false), "post_processor", "decoder",
                            byte_level(true), "model", model);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    tdm_status st = write_json(path, tok, err);
    if (st != TDM_OK)
        return st;
    json_t *decoder = json_object();
    for (int i = 0; i < 3; i++) {
        char id[16]; /* room for any int: GCC -O1 checks the format, not the range */
        snprintf(id, sizeof id, "%d", 256 + i);
        json_object_set_new(decoder, id,
                            json_pack("{s:s, s:b, s:b, s:b, s:b, s:b}", "content", specials[i],
                                      "lstrip", 0, "normalized", 0, "rstrip", 0, "single_word",
                                      0, "special", 1));
    }
    json_t *conf = json_pack(
        "{s:b, s:b, s:o, s:[s,s], s:n, s:s, s:b, s:s, s:s, s:I, s:s, s:b, s:n}", "add_bos_token",
        0, "add_prefix_space", 0, "added_tokens_decoder", decoder, "additional_special_tokens",
        specials[1], specials[2], "bos_token", "chat_template", chatml_template,
        "clean_up_tokenization_spaces", 0, "eos_token", specials[2], "pad_token", specials[0],
        "model_max_length", (json_int_t)cfg->max_position_embeddings, "tokenizer_class",
        "PreTrainedTokenizerFast", "split_special_tokens", 0, "unk_token");
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    return write_json(path, conf, err);
}

/* The id of a token string in tokenizer.json (added_tokens, then model.vocab), or -1. */
static int64_t token_id(json_t *tok, const char *content)
{
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(tok, "added_tokens"), i, t) {
        json_t *c = json_object_get(t, "content");
        if (json_is_string(c) && !strcmp(json_string_value(c), content))
            return json_integer_value(json_object_get(t, "id"));
    }
    json_t *vocab = json_object_get(json_object_get(tok, "model"), "vocab");
    json_t *id = json_is_object(vocab) ? json_object_get(vocab, content) : NULL;
    return json_is_integer(id) ? json_integer_value(id) : -1;
}

/* A tokenizer_config.json special token: a string or {"content": ...}. */
static const char *special_name(json_t *conf, const char *key)
{
    json_t *v = json_object_get(conf, key);
    if (json_is_object(v))
        v = json_object_get(v, "content");
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static tdm_status copy_tokenizer(const char *dir, const char *src, tdm_model_config *cfg,
                                 tdm_error *err)
{
    char tok_path[PATH_MAX + 32], conf_path[PATH_MAX + 32], src_dir[PATH_MAX];
    struct stat sb;
    if (stat(src, &sb) != 0)
        return tdm_fail_errno(err, errno == ENOENT ? TDM_ERR_NOT_FOUND : TDM_ERR_IO, errno,
                              "tokenizer %s", src);
    if (S_ISDIR(sb.st_mode)) {
        snprintf(src_dir, sizeof src_dir, "%s", src);
        snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", src);
    } else {
        snprintf(tok_path, sizeof tok_path, "%s", src);
        snprintf(src_dir, sizeof src_dir, "%s", src);
        char *slash = strrchr(src_dir, '/');
        if (slash)
            *slash = 0;
        else
            snprintf(src_dir, sizeof src_dir, ".");
    }
    snprintf(conf_path, sizeof conf_path, "%s/tokenizer_config.json", src_dir);
    char *text;
    size_t len;
    tdm_status st = tdm_read_file(tok_path, &text, &len, err);
    if (st != TDM_OK)
        return st;
    json_error_t jerr;
    json_t *tok = json_loadb(text, len, 0, &jerr);
    if (!tok) {
        free(text);
        return tdm_fail(err, TDM_ERR_PARSE, "%s:%d:%d: %s", tok_path, jerr.line, jerr.column,
                        jerr.text);
    }
    /* The largest id in model.vocab (an object for BPE/WordPiece/WordLevel, a list for Unigram)
     * and added_tokens decides the vocabulary size. */
    int64_t max_id = -1;
    json_t *vocab = json_object_get(json_object_get(tok, "model"), "vocab");
    const char *key;
    json_t *v;
    size_t i;
    if (json_is_object(vocab)) {
        json_object_foreach(vocab, key, v) {
            if (json_is_integer(v) && json_integer_value(v) > max_id)
                max_id = json_integer_value(v);
        }
    } else if (json_is_array(vocab)) {
        max_id = (int64_t)json_array_size(vocab) - 1;
    }
    json_array_foreach(json_object_get(tok, "added_tokens"), i, v) {
        json_t *id = json_object_get(v, "id");
        if (json_is_integer(id) && json_integer_value(id) > max_id)
            max_id = json_integer_value(id);
    }
    if (max_id < 0 || max_id > (int64_t)1 << 30) {
        json_decref(tok);
        free(text);
        return tdm_fail(err, TDM_ERR_PARSE, "%s: no token ids found in model.vocab or "
                        "added_tokens", tok_path);
    }
    if (max_id + 1 > cfg->vocab_size)
        cfg->vocab_size = (max_id + 1 + 63) / 64 * 64;
    char out[PATH_MAX];
    snprintf(out, sizeof out, "%s/tokenizer.json", dir);
    st = tdm_atomic_write(out, text, len, 0644, err);
    free(text);
    if (st == TDM_OK && stat(conf_path, &sb) == 0) {
        if ((st = tdm_read_file(conf_path, &text, &len, err)) == TDM_OK) {
            json_t *conf = json_loadb(text, len, 0, &jerr);
            if (conf) {
                const char *bos = special_name(conf, "bos_token"),
                           *eos = special_name(conf, "eos_token");
                cfg->bos_token_id = bos ? token_id(tok, bos) : -1;
                cfg->eos_token_id = eos ? token_id(tok, eos) : -1;
                json_decref(conf);
            }
            snprintf(out, sizeof out, "%s/tokenizer_config.json", dir);
            st = tdm_atomic_write(out, text, len, 0644, err);
            free(text);
        }
    }
    json_decref(tok);
    return st;
}

tdm_status tdm_init_model(const char *out_dir, const tdm_init_model_opts *o,
                          tdm_model_config *cfg_out, tdm_error *err)
{
    if (o->dtype != TDM_DTYPE_BF16 && o->dtype != TDM_DTYPE_F32)
        return tdm_fail(err, TDM_ERR_INVALID, "init-model writes bf16 or f32 weights only");
    if (!(o->init_std >= 0 && o->init_std <= 1))
        return tdm_fail(err, TDM_ERR_INVALID, "init-model: init std %g is not in (0, 1]",
                        o->init_std);
    tdm_model_config cfg;
    tdm_status st = tdm_preset_config(o->preset, &cfg, err);
    if (st != TDM_OK)
        return st;
    if (o->layers < 0 || o->layers > TDM_INIT_MODEL_MAX_LAYERS)
        return tdm_fail(err, TDM_ERR_INVALID, "init-model: %lld layers is not in 1..%d",
                        (long long)o->layers, TDM_INIT_MODEL_MAX_LAYERS);
    if (o->layers > 0) cfg.num_layers = o->layers;
    snprintf(cfg.torch_dtype, sizeof cfg.torch_dtype, "%s",
             o->dtype == TDM_DTYPE_BF16 ? "bfloat16" : "float32");
    if (mkdir(out_dir, 0755) != 0 && errno != EEXIST)
        return tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot create %s", out_dir);
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/model.safetensors", out_dir) >= (int)sizeof path)
        return tdm_fail(err, TDM_ERR_INVALID, "path too long: %s", out_dir);
    /* The tokenizer first: it may widen the vocabulary. */
    if (o->tokenizer) {
        st = copy_tokenizer(out_dir, o->tokenizer, &cfg, err);
    } else {
        cfg.bos_token_id = 256;
        cfg.eos_token_id = 258;
        st = write_byte_tokenizer(out_dir, &cfg, err);
    }
    if (st != TDM_OK)
        return st;
    if ((st = write_weights(path, &cfg, o, err)) != TDM_OK)
        return st;
    char *json;
    if ((st = tdm_model_config_to_json(&cfg, &json, err)) != TDM_OK)
        return st;
    snprintf(path, sizeof path, "%s/config.json", out_dir);
    st = tdm_atomic_write(path, json, strlen(json), 0644, err);
    free(json);
    if (st == TDM_OK && cfg_out)
        *cfg_out = cfg;
    return st;
}
