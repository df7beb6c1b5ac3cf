/* base_identity.c — hash of a model directory's content and the run settings that decide whether
 * two jobs can share a forward pass (contract in base_identity.h). */
#include "cotrain/base_identity.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/safetensors.h"
#include "util/atomic_file.h"

#define SAMPLE_BYTES 64

/* Field: 8-byte little-endian length, then the bytes. */
static void put_field(tdm_sha256 *h, const void *data, size_t len)
{
    uint8_t n[8];
    for (int i = 0; i < 8; i++)
        n[i] = (uint8_t)((uint64_t)len >> (8 * i));
    tdm_sha256_update(h, n, 8);
    tdm_sha256_update(h, data, len);
}

static void put_str(tdm_sha256 *h, const char *s)
{
    put_field(h, s, strlen(s));
}

static void put_u64(tdm_sha256 *h, uint64_t x)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(x >> (8 * i));
    put_field(h, b, 8);
}

/* Hashes "name", then "present" + bytes or "absent". */
static tdm_status put_file(tdm_sha256 *h, const char *dir, const char *name, bool required,
                           tdm_error *err)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return tdm_fail(err, TDM_ERR_INVALID, "path too long: %s/%s", dir, name);
    put_str(h, name);
    char *text = NULL;
    size_t len = 0;
    tdm_status st = tdm_read_file(path, &text, &len, err);
    if (st == TDM_ERR_NOT_FOUND && !required) {
        put_str(h, "absent");
        return TDM_OK;
    }
    if (st != TDM_OK) return st;
    put_str(h, "present");
    put_field(h, text, len);
    free(text);
    return TDM_OK;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Hashes up to SAMPLE_BYTES at off (clamped to [begin, end)). */
static tdm_status put_sample(tdm_sha256 *h, int fd, const char *path, uint64_t begin, uint64_t end,
                             uint64_t off, tdm_error *err)
{
    uint8_t buf[SAMPLE_BYTES];
    if (off + SAMPLE_BYTES > end) off = end >= begin + SAMPLE_BYTES ? end - SAMPLE_BYTES : begin;
    size_t want = (size_t)(end - off < SAMPLE_BYTES ? end - off : SAMPLE_BYTES);
    ssize_t got = pread(fd, buf, want, (off_t)off);
    if (got != (ssize_t)want)
        return tdm_fail_errno(err, TDM_ERR_IO, got < 0 ? errno : EIO,
                              "cannot read tensor data of %s at byte %llu", path,
                              (unsigned long long)off);
    put_field(h, buf, want);
    return TDM_OK;
}

/* One weight file: name, size, header, samples of every tensor. */
static tdm_status put_weights(tdm_sha256 *h, const char *dir, const char *name, tdm_error *err)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return tdm_fail(err, TDM_ERR_INVALID, "path too long: %s/%s", dir, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return tdm_fail_errno(err, errno == ENOENT ? TDM_ERR_NOT_FOUND : TDM_ERR_IO, errno,
                              "cannot open %s", path);
    tdm_status st = TDM_OK;
    char *header = NULL;
    json_t *root = NULL;
    const char **names = NULL;
    struct stat sb;
    uint8_t nbuf[8];
    if (fstat(fd, &sb) != 0) {
        st = tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot stat %s", path);
        goto out;
    }
    uint64_t size = (uint64_t)sb.st_size, n = 0;
    if (pread(fd, nbuf, 8, 0) != 8) {
        st = tdm_fail(err, TDM_ERR_CORRUPT, "%s: shorter than a safetensors header", path);
        goto out;
    }
    for (int i = 0; i < 8; i++)
        n |= (uint64_t)nbuf[i] << (8 * i);
    if (n > TDM_ST_MAX_HEADER_BYTES || n > size - 8) {
        st = tdm_fail(err, TDM_ERR_CORRUPT, "%s: header length %llu does not fit the file", path,
                      (unsigned long long)n);
        goto out;
    }
    header = malloc(n ? n : 1);
    if (!header) {
        st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory reading %s", path);
        goto out;
    }
    if (pread(fd, header, n, 8) != (ssize_t)n) {
        st = tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot read the header of %s", path);
        goto out;
    }
    put_str(h, name);
    put_u64(h, size);
    put_field(h, nbuf, 8);
    put_field(h, header, n);
    json_error_t jerr;
    root = json_loadb(header, n, 0, &jerr);
    if (!json_is_object(root)) {
        st = tdm_fail(err, TDM_ERR_CORRUPT, "%s: header is not a JSON object", path);
        goto out;
    }
    size_t count = json_object_size(root), k = 0;
    names = calloc(count ? count : 1, sizeof *names);
    if (!names) {
        st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory reading %s", path);
        goto out;
    }
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value)
    {
        if (strcmp(key, "__metadata__") != 0) names[k++] = key;
    }
    qsort(names, k, sizeof *names, cmp_str);
    uint64_t data_start = 8 + n;
    for (size_t i = 0; i < k && st == TDM_OK; i++) {
        json_t *offs = json_object_get(json_object_get(root, names[i]), "data_offsets");
        json_t *b = json_array_get(offs, 0), *e = json_array_get(offs, 1);
        if (!json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 ||
            json_integer_value(e) < json_integer_value(b) ||
            (uint64_t)json_integer_value(e) > size - data_start) {
            st = tdm_fail(err, TDM_ERR_CORRUPT,
                          "%s: tensor \"%s\" has data_offsets outside the file", path, names[i]);
            break;
        }
        uint64_t begin = data_start + (uint64_t)json_integer_value(b);
        uint64_t end = data_start + (uint64_t)json_integer_value(e);
        put_str(h, names[i]);
        if (begin == end) continue;
        st = put_sample(h, fd, path, begin, end, begin, err);
        if (st == TDM_OK) st = put_sample(h, fd, path, begin, end, begin + (end - begin) / 2, err);
        if (st == TDM_OK) st = put_sample(h, fd, path, begin, end, end, err);
    }
out:
    free(names);
    json_decref(root);
    free(header);
    close(fd);
    return st;
}

/* The weight files, in the order tdm_weights_open finds them: the index's shards (sorted,
 * unique) or model.safetensors. */
static tdm_status put_all_weights(tdm_sha256 *h, const char *dir, tdm_error *err)
{
    char index[PATH_MAX];
    if (snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir) >= (int)sizeof index)
        return tdm_fail(err, TDM_ERR_INVALID, "path too long: %s", dir);
    struct stat sb;
    if (stat(index, &sb) != 0) {
        put_str(h, "single");
        return put_weights(h, dir, "model.safetensors", err);
    }
    tdm_status st = put_file(h, dir, "model.safetensors.index.json", true, err);
    if (st != TDM_OK) return st;
    json_error_t jerr;
    json_t *root = json_load_file(index, 0, &jerr);
    json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(map)) {
        json_decref(root);
        return tdm_fail(err, TDM_ERR_CORRUPT, "%s: missing \"weight_map\" object", index);
    }
    size_t count = json_object_size(map), k = 0;
    const char **files = calloc(count ? count : 1, sizeof *files);
    if (!files) {
        json_decref(root);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    }
    const char *key;
    json_t *value;
    json_object_foreach(map, key, value)
    {
        const char *f = json_string_value(value);
        if (!f || !*f || strchr(f, '/')) {
            st = tdm_fail(err, TDM_ERR_CORRUPT, "%s: weight_map[\"%s\"] must be a plain file name",
                          index, key);
            break;
        }
        files[k++] = f;
    }
    qsort(files, k, sizeof *files, cmp_str);
    put_str(h, "sharded");
    for (size_t i = 0; i < k && st == TDM_OK; i++)
        if (i == 0 || strcmp(files[i], files[i - 1]) != 0) st = put_weights(h, dir, files[i], err);
    free(files);
    json_decref(root);
    return st;
}

void tdm_base_identity_seal(tdm_base_identity *out)
{
    tdm_sha256 h;
    tdm_sha256_init(&h);
    put_str(&h, "tandem-base-identity-v1");
    put_str(&h, out->model);
    put_str(&h, out->method);
    put_str(&h, out->double_quant ? "double-quant" : "single-quant");
    put_str(&h, out->compute_dtype);
    put_str(&h, out->device);
    uint8_t d[TDM_SHA256_DIGEST_LEN];
    tdm_sha256_final(&h, d);
    tdm_sha256_tagged(d, out->id);
}

tdm_status tdm_base_identity_compute(const char *model_dir, bool nf4, bool double_quant,
                                     const char *compute_dtype, const char *device,
                                     tdm_base_identity *out, tdm_error *err)
{
    memset(out, 0, sizeof *out);
    if (!compute_dtype || !*compute_dtype || strlen(compute_dtype) >= sizeof out->compute_dtype)
        return tdm_fail(err, TDM_ERR_INVALID, "base identity: compute dtype must be f32 or bf16");
    if (!device || !*device || strlen(device) >= sizeof out->device)
        return tdm_fail(err, TDM_ERR_INVALID,
                        "base identity: device must be \"cpu\" or a GPU UUID of at most %d bytes",
                        TDM_BASE_DEVICE_MAX - 1);
    tdm_sha256 h;
    tdm_sha256_init(&h);
    put_str(&h, "tandem-model-content-v1");
    tdm_status st = put_file(&h, model_dir, "config.json", true, err);
    if (st == TDM_OK) st = put_file(&h, model_dir, "tokenizer.json", false, err);
    if (st == TDM_OK) st = put_file(&h, model_dir, "tokenizer_config.json", false, err);
    if (st == TDM_OK) st = put_all_weights(&h, model_dir, err);
    if (st != TDM_OK) return st;
    uint8_t d[TDM_SHA256_DIGEST_LEN];
    tdm_sha256_final(&h, d);
    tdm_sha256_tagged(d, out->model);
    snprintf(out->method, sizeof out->method, "%s", nf4 ? "qlora" : "lora");
    out->double_quant = nf4 && double_quant;
    snprintf(out->compute_dtype, sizeof out->compute_dtype, "%s", compute_dtype);
    snprintf(out->device, sizeof out->device, "%s", device);
    tdm_base_identity_seal(out);
    return TDM_OK;
}

const char *tdm_base_identity_mismatch(const tdm_base_identity *a, const tdm_base_identity *b)
{
    if (strcmp(a->model, b->model) != 0) return "model";
    if (strcmp(a->method, b->method) != 0) return "method";
    if (a->double_quant != b->double_quant) return "double quantization";
    if (strcmp(a->compute_dtype, b->compute_dtype) != 0) return "compute dtype";
    if (strcmp(a->device, b->device) != 0) return "device";
    return strcmp(a->id, b->id) != 0 ? "identity" : "";
}
