#include "model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/atomic_file.h"
#include "util/fault.h"
#include "util/half.h"
#include "util/regular_file.h"

bool tdm_st_shape_size(const int64_t *shape, int rank, tdm_dtype dtype, int64_t *numel,
                       uint64_t *nbytes)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++) {
        if (shape[i] < 0 || __builtin_mul_overflow(n, shape[i], &n))
            return false;
    }
    uint64_t b;
    if (__builtin_mul_overflow((uint64_t)n, (uint64_t)tdm_dtype_size(dtype), &b))
        return false;
    *numel = n;
    *nbytes = b;
    return true;
}

void tdm_st_close(tdm_st_file *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->n_tensors; i++)
        free(f->tensors[i].name);
    free(f->tensors);
    for (size_t i = 0; i < f->n_meta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_values[i]);
    }
    free(f->meta_keys);
    free(f->meta_values);
    if (f->map)
        munmap(f->map, f->map_len);
    free(f->path);
    memset(f, 0, sizeof *f);
}

static int cmp_offset(const void *a, const void *b)
{
    const tdm_st_tensor *x = a, *y = b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes) /* empty tensors first at a shared offset */
        return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

static void shape_str(const tdm_st_tensor *t, char *buf, size_t size)
{
    size_t n = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < t->rank && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (n < size)
        snprintf(buf + n, size - n, "]");
}

static tdm_status parse_metadata(tdm_st_file *f, json_t *meta, const char *name, tdm_error *err)
{
    if (!json_is_object(meta))
        return tdm_fail(err, TDM_ERR_PARSE, "%s: header: __metadata__ is not an object", name);
    size_t n = json_object_size(meta);
    f->meta_keys = calloc(n ? n : 1, sizeof *f->meta_keys);
    f->meta_values = calloc(n ? n : 1, sizeof *f->meta_values);
    if (!f->meta_keys || !f->meta_values)
        return tdm_fail(err, TDM_ERR_NOMEM, "%s: out of memory", name);
    const char *key;
    json_t *value;
    json_object_foreach(meta, key, value) {
        if (!json_is_string(value))
            return tdm_fail(err, TDM_ERR_PARSE,
                            "%s: header: __metadata__ value of \"%s\" is not a string", name, key);
        f->meta_keys[f->n_meta] = strdup(key);
        f->meta_values[f->n_meta] = strdup(json_string_value(value));
        f->n_meta++;
        if (!f->meta_keys[f->n_meta - 1] || !f->meta_values[f->n_meta - 1])
            return tdm_fail(err, TDM_ERR_NOMEM, "%s: out of memory", name);
    }
    return TDM_OK;
}

static bool json_u64(json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

static tdm_status parse_tensor(tdm_st_tensor *t, const char *key, json_t *obj, const char *name,
                               uint64_t data_len, tdm_error *err)
{
    if (!json_is_object(obj))
        return tdm_fail(err, TDM_ERR_PARSE, "%s: tensor \"%s\": entry is not an object", name,
                        key);
    json_t *jd = json_object_get(obj, "dtype"), *js = json_object_get(obj, "shape"),
           *jo = json_object_get(obj, "data_offsets");
    if (!json_is_string(jd))
        return tdm_fail(err, TDM_ERR_PARSE, "%s: tensor \"%s\": missing or non-string \"dtype\"",
                        name, key);
    if (!tdm_dtype_parse(json_string_value(jd), &t->dtype))
        return tdm_fail(err, TDM_ERR_UNSUPPORTED,
                        "%s: tensor \"%s\": unknown dtype \"%s\" (known: F64 F32 F16 BF16 I64 "
                        "I32 I16 I8 U64 U32 U16 U8 BOOL F8_E4M3 F8_E5M2)",
                        name, key, json_string_value(jd));
    if (!json_is_array(js))
        return tdm_fail(err, TDM_ERR_PARSE, "%s: tensor \"%s\": missing or non-array \"shape\"",
                        name, key);
    if (json_array_size(js) > TDM_ST_MAX_RANK)
        return tdm_fail(err, TDM_ERR_UNSUPPORTED, "%s: tensor \"%s\": rank %zu exceeds %d", name,
                        key, json_array_size(js), TDM_ST_MAX_RANK);
    t->rank = (int)json_array_size(js);
    for (int i = 0; i < t->rank; i++) {
        uint64_t d;
        if (!json_u64(json_array_get(js, (size_t)i), &d))
            return tdm_fail(err, TDM_ERR_PARSE,
                            "%s: tensor \"%s\": shape[%d] is not a non-negative integer", name,
                            key, i);
        t->shape[i] = (int64_t)d;
    }
    if (!json_is_array(jo) || json_array_size(jo) != 2)
        return tdm_fail(err, TDM_ERR_PARSE,
                        "%s: tensor \"%s\": \"data_offsets\" must be [begin, end]", name, key);
    uint64_t begin, end;
    if (!json_u64(json_array_get(jo, 0), &begin) || !json_u64(json_array_get(jo, 1), &end))
        return tdm_fail(err, TDM_ERR_PARSE,
                        "%s: tensor \"%s\": data_offsets are not non-negative integers", name,
                        key);
    char shp[256];
    shape_str(t, shp, sizeof shp);
    if (!tdm_st_shape_size(t->shape, t->rank, t->dtype, &t->numel, &t->nbytes))
        return tdm_fail(err, TDM_ERR_CORRUPT,
                        "%s: tensor \"%s\": shape %s overflows a 64-bit element count", name, key,
                        shp);
    if (end < begin)
        return tdm_fail(err, TDM_ERR_CORRUPT,
                        "%s: tensor \"%s\": data_offsets [%llu, %llu] end before they begin", name,
                        key, (unsigned long long)begin, (unsigned long long)end);
    if (end > data_len)
        return tdm_fail(err, TDM_ERR_CORRUPT,
                        "%s: tensor \"%s\": data_offsets [%llu, %llu] run past the data section "
                        "(%llu bytes): the file is truncated or the header is wrong",
                        name, key, (unsigned long long)begin, (unsigned long long)end,
                        (unsigned long long)data_len);
    if (end - begin != t->nbytes)
        return tdm_fail(err, TDM_ERR_CORRUPT,
                        "%s: tensor \"%s\": shape %s of %s needs %llu bytes but data_offsets "
                        "[%llu, %llu] hold %llu",
                        name, key, shp, tdm_dtype_name(t->dtype), (unsigned long long)t->nbytes,
                        (unsigned long long)begin, (unsigned long long)end,
                        (unsigned long long)(end - begin));
    t->offset = begin;
    t->name = strdup(key);
    if (!t->name)
        return tdm_fail(err, TDM_ERR_NOMEM, "%s: out of memory", name);
    return TDM_OK;
}

static tdm_status parse_header(tdm_st_file *f, const uint8_t *buf, size_t len, const char *name,
                               tdm_error *err)
{
    if (len < 8)
        return tdm_fail(err, TDM_ERR_CORRUPT,
                        "%s: %zu bytes is too short for a safetensors file (8-byte header length "
                        "missing)",
                        name, len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | buf[i];
    if (hlen > TDM_ST_MAX_HEADER_BYTES)
        return tdm_fail(err, TDM_ERR_CORRUPT,
                        "%s: header length %llu exceeds the %u-byte limit (not a safetensors "
                        "file, or a damaged one)",
                        name, (unsigned long long)hlen, TDM_ST_MAX_HEADER_BYTES);
    if (hlen > len - 8)
        return tdm_fail(err, TDM_ERR_CORRUPT,
                        "%s: header length %llu runs past the end of the file (%zu bytes): the "
                        "file is truncated",
                        name, (unsigned long long)hlen, len);
    if (hlen < 2)
        return tdm_fail(err, TDM_ERR_PARSE, "%s: header of %llu bytes cannot hold a JSON object",
                        name, (unsigned long long)hlen);
    f->data = buf + 8 + hlen;
    f->data_len = (uint64_t)(len - 8 - hlen);

    json_error_t jerr;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return tdm_fail(err, TDM_ERR_PARSE, "%s: header JSON line %d column %d: %s", name,
                        jerr.line, jerr.column, jerr.text);
    tdm_status st = TDM_OK;
    if (!json_is_object(root)) {
        st = tdm_fail(err, TDM_ERR_PARSE, "%s: header is not a JSON object", name);
        goto out;
    }
    size_t n = json_object_size(root);
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    if (!f->tensors) {
        st = tdm_fail(err, TDM_ERR_NOMEM, "%s: out of memory for %zu tensors", name, n);
        goto out;
    }
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value) {
        if (!strcmp(key, "__metadata__")) {
            if ((st = parse_metadata(f, value, name, err)) != TDM_OK)
                goto out;
            continue;
        }
        if (!*key) {
            st = tdm_fail(err, TDM_ERR_PARSE, "%s: header has a tensor with an empty name", name);
            goto out;
        }
        st = parse_tensor(&f->tensors[f->n_tensors], key, value, name, f->data_len, err);
        if (st != TDM_OK)
            goto out;
        f->n_tensors++;
    }
    qsort(f->tensors, f->n_tensors, sizeof *f->tensors, cmp_offset);
    uint64_t at = 0;
    for (size_t i = 0; i < f->n_tensors; i++) {
        tdm_st_tensor *t = &f->tensors[i];
        if (t->offset < at) {
            st = tdm_fail(err, TDM_ERR_CORRUPT,
                          "%s: tensor \"%s\" at data_offsets [%llu, %llu] overlaps tensor \"%s\"",
                          name, t->name, (unsigned long long)t->offset,
                          (unsigned long long)(t->offset + t->nbytes), f->tensors[i - 1].name);
            goto out;
        }
        if (t->offset > at) {
            st = tdm_fail(err, TDM_ERR_CORRUPT,
                          "%s: %llu unused bytes before tensor \"%s\" at offset %llu (tensors "
                          "must tile the data section)",
                          name, (unsigned long long)(t->offset - at), t->name,
                          (unsigned long long)t->offset);
            goto out;
        }
        t->data = f->data + t->offset;
        at = t->offset + t->nbytes;
    }
    if (at != f->data_len) {
        st = tdm_fail(err, TDM_ERR_CORRUPT,
                      "%s: data section has %llu bytes but the tensors cover %llu (trailing "
                      "garbage or a wrong header)",
                      name, (unsigned long long)f->data_len, (unsigned long long)at);
        goto out;
    }
out:
    json_decref(root);
    return st;
}

tdm_status tdm_st_parse(tdm_st_file *f, const void *buf, size_t len, const char *name,
                        tdm_error *err)
{
    memset(f, 0, sizeof *f);
    f->path = strdup(name ? name : "<memory>");
    if (!f->path)
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    tdm_status st = parse_header(f, buf, len, f->path, err);
    if (st != TDM_OK)
        tdm_st_close(f);
    return st;
}

tdm_status tdm_st_open(tdm_st_file *f, const char *path, tdm_error *err)
{
    memset(f, 0, sizeof *f);
    int fd;
    struct stat sb;
    tdm_status ost = tdm_open_regular(path, &fd, &sb, err); /* a FIFO would block open() */
    if (ost != TDM_OK) return ost;
    size_t len = (size_t)sb.st_size;
    if (len < 8) {
        close(fd);
        return tdm_fail(err, TDM_ERR_CORRUPT,
                        "%s: %zu bytes is too short for a safetensors file (8-byte header length "
                        "missing)",
                        path, len);
    }
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED)
        return tdm_fail_errno(err, TDM_ERR_IO, e, "cannot map %s", path);
    madvise(map, len, MADV_WILLNEED);
    tdm_status st = tdm_st_parse(f, map, len, path, err);
    if (st != TDM_OK) {
        munmap(map, len);
        return st;
    }
    f->map = map;
    f->map_len = len;
    return TDM_OK;
}

const tdm_st_tensor *tdm_st_find(const tdm_st_file *f, const char *name)
{
    for (size_t i = 0; i < f->n_tensors; i++)
        if (!strcmp(f->tensors[i].name, name))
            return &f->tensors[i];
    return NULL;
}

const char *tdm_st_metadata(const tdm_st_file *f, const char *key)
{
    for (size_t i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta_keys[i], key))
            return f->meta_values[i];
    return NULL;
}

tdm_status tdm_st_tensor_to_f32(const tdm_st_tensor *t, float *out, tdm_error *err)
{
    const uint8_t *p = t->data;
    size_t n = (size_t)t->numel;
    switch (t->dtype) {
    case TDM_DTYPE_F32:
        memcpy(out, p, n * sizeof(float));
        return TDM_OK;
    case TDM_DTYPE_BF16:
    case TDM_DTYPE_F16: {
        /* Threads, because this touches every byte of the mapped file: a 7B base is 15 GB to
         * fault in and widen, which one thread does at about 1 GB/s. Each element is converted
         * on its own, so the result does not depend on the thread count. */
        bool bf16 = t->dtype == TDM_DTYPE_BF16;
#pragma omp parallel for schedule(static) if (n > (1u << 20))
        for (size_t i = 0; i < n; i++) {
            uint16_t h = (uint16_t)(p[2 * i] | (p[2 * i + 1] << 8));
            out[i] = bf16 ? tdm_bf16_to_f32(h) : tdm_f16_to_f32(h);
        }
        return TDM_OK;
    }
    default:
        return tdm_fail(err, TDM_ERR_UNSUPPORTED, "tensor \"%s\": cannot convert %s to F32",
                        t->name, tdm_dtype_name(t->dtype));
    }
}

/* ---- writer ---- */

#define WBUF_BYTES (4u << 20)

struct tdm_st_writer {
    char path[PATH_MAX];
    char tmp[PATH_MAX + 64];
    char dir[PATH_MAX];
    int fd;
    uint64_t remaining;
    uint8_t *buf;
    size_t buf_used;
};

static tdm_status flush_buf(tdm_st_writer *w, tdm_error *err)
{
    const uint8_t *p = w->buf;
    size_t len = w->buf_used;
    while (len > 0) {
        ssize_t n = tdm_fault("safetensors.write") ? (errno = EIO, -1) : write(w->fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot write %s", w->tmp);
        }
        p += n;
        len -= (size_t)n;
    }
    w->buf_used = 0;
    return TDM_OK;
}

static tdm_status buffered_write(tdm_st_writer *w, const void *data, size_t len, tdm_error *err)
{
    const uint8_t *p = data;
    while (len > 0) {
        size_t take = WBUF_BYTES - w->buf_used;
        if (take > len)
            take = len;
        memcpy(w->buf + w->buf_used, p, take);
        w->buf_used += take;
        p += take;
        len -= take;
        if (w->buf_used == WBUF_BYTES) {
            tdm_status st = flush_buf(w, err);
            if (st != TDM_OK)
                return st;
        }
    }
    return TDM_OK;
}

void tdm_st_writer_abort(tdm_st_writer *w)
{
    if (!w)
        return;
    if (w->fd >= 0) {
        close(w->fd);
        unlink(w->tmp);
    }
    free(w->buf);
    free(w);
}

static tdm_status build_header(const tdm_st_spec *specs, size_t n, const char *const *meta,
                               size_t n_meta, char **out, uint64_t *total, tdm_error *err)
{
    json_t *root = json_object();
    tdm_status st = TDM_OK;
    if (!root)
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    if (n_meta > 0) {
        json_t *m = json_object();
        for (size_t i = 0; i < n_meta; i++)
            json_object_set_new(m, meta[2 * i], json_string(meta[2 * i + 1]));
        json_object_set_new(root, "__metadata__", m);
    }
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const tdm_st_spec *s = &specs[i];
        if (!s->name || !*s->name || !strcmp(s->name, "__metadata__")) {
            st = tdm_fail(err, TDM_ERR_INVALID, "tensor %zu has an empty or reserved name", i);
            goto fail;
        }
        if (json_object_get(root, s->name)) {
            st = tdm_fail(err, TDM_ERR_INVALID, "tensor \"%s\" is given twice", s->name);
            goto fail;
        }
        if (s->rank < 0 || s->rank > TDM_ST_MAX_RANK || (unsigned)s->dtype >= TDM_DTYPE_COUNT) {
            st = tdm_fail(err, TDM_ERR_INVALID, "tensor \"%s\": bad rank or dtype", s->name);
            goto fail;
        }
        int64_t numel;
        uint64_t nbytes;
        if (!tdm_st_shape_size(s->shape, s->rank, s->dtype, &numel, &nbytes) ||
            __builtin_add_overflow(at, nbytes, &at)) {
            st = tdm_fail(err, TDM_ERR_INVALID, "tensor \"%s\": negative or overflowing shape",
                          s->name);
            goto fail;
        }
        json_t *t = json_object(), *shape = json_array(), *offs = json_array();
        json_object_set_new(t, "dtype", json_string(tdm_dtype_name(s->dtype)));
        for (int d = 0; d < s->rank; d++)
            json_array_append_new(shape, json_integer(s->shape[d]));
        json_object_set_new(t, "shape", shape);
        json_array_append_new(offs, json_integer((json_int_t)(at - nbytes)));
        json_array_append_new(offs, json_integer((json_int_t)at));
        json_object_set_new(t, "data_offsets", offs);
        json_object_set_new(root, s->name, t);
    }
    char *text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!text) {
        st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory encoding the header");
        goto fail;
    }
    json_decref(root);
    *out = text;
    *total = at;
    return TDM_OK;
fail:
    json_decref(root);
    return st;
}

tdm_status tdm_st_writer_open(tdm_st_writer **out, const char *path, const tdm_st_spec *specs,
                              size_t n_specs, const char *const *meta, size_t n_meta,
                              tdm_error *err)
{
    *out = NULL;
    tdm_st_writer *w = calloc(1, sizeof *w);
    if (!w)
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    w->fd = -1;
    char base_buf[PATH_MAX];
    if (snprintf(w->path, sizeof w->path, "%s", path) >= (int)sizeof w->path ||
        snprintf(w->dir, sizeof w->dir, "%s", path) >= (int)sizeof w->dir ||
        snprintf(base_buf, sizeof base_buf, "%s", path) >= (int)sizeof base_buf) {
        free(w);
        return tdm_fail(err, TDM_ERR_INVALID, "path too long: %s", path);
    }
    char *dir = dirname(w->dir);
    memmove(w->dir, dir, strlen(dir) + 1);
    snprintf(w->tmp, sizeof w->tmp, "%s/.%s.tmp-%ld", w->dir, basename(base_buf),
             (long)getpid());

    char *header = NULL;
    uint64_t total = 0;
    tdm_status st = build_header(specs, n_specs, meta, n_meta, &header, &total, err);
    if (st != TDM_OK) {
        free(w);
        return tdm_error_prefix(err, "%s", path);
    }
    size_t hlen = strlen(header);
    size_t padded = (8 + hlen + 7) / 8 * 8 - 8;
    w->buf = malloc(WBUF_BYTES);
    if (!w->buf) {
        free(header);
        free(w);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    }
    st = tdm_create_temp_exclusive(w->tmp, 0644, &w->fd, err);
    if (st != TDM_OK) {
        free(header);
        tdm_st_writer_abort(w);
        return st;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    st = buffered_write(w, len8, 8, err);
    if (st == TDM_OK)
        st = buffered_write(w, header, hlen, err);
    for (size_t i = hlen; i < padded && st == TDM_OK; i++)
        st = buffered_write(w, " ", 1, err);
    free(header);
    if (st != TDM_OK) {
        tdm_st_writer_abort(w);
        return st;
    }
    w->remaining = total;
    *out = w;
    return TDM_OK;
}

tdm_status tdm_st_writer_write(tdm_st_writer *w, const void *data, size_t len, tdm_error *err)
{
    if (len > w->remaining)
        return tdm_fail(err, TDM_ERR_INVALID,
                        "%s: %zu bytes written but only %llu more were announced", w->path, len,
                        (unsigned long long)w->remaining);
    tdm_status st = buffered_write(w, data, len, err);
    if (st == TDM_OK)
        w->remaining -= len;
    return st;
}

uint64_t tdm_st_writer_remaining(const tdm_st_writer *w)
{
    return w->remaining;
}

tdm_status tdm_st_writer_commit(tdm_st_writer *w, tdm_error *err)
{
    tdm_status st = TDM_OK;
    if (w->remaining != 0)
        st = tdm_fail(err, TDM_ERR_INVALID, "%s: %llu bytes of tensor data were never written",
                      w->path, (unsigned long long)w->remaining);
    if (st == TDM_OK)
        st = flush_buf(w, err);
    if (st == TDM_OK && (tdm_fault("safetensors.fsync") ? (errno = EIO, 1) : fsync(w->fd) != 0))
        st = tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot fsync %s", w->tmp);
    if (st != TDM_OK) {
        tdm_st_writer_abort(w);
        return st;
    }
    int rc = close(w->fd);
    w->fd = -1;
    if (rc != 0)
        st = tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot close %s", w->tmp);
    if (st == TDM_OK &&
        (tdm_fault("safetensors.rename") ? (errno = EIO, 1) : rename(w->tmp, w->path) != 0))
        st = tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot rename %s to %s", w->tmp, w->path);
    if (st != TDM_OK)
        unlink(w->tmp);
    else
        st = tdm_fsync_dir(w->dir, err);
    free(w->buf);
    free(w);
    return st;
}

tdm_status tdm_st_save(const char *path, const tdm_st_spec *specs, const void *const *data,
                       size_t n_specs, const char *const *meta, size_t n_meta, tdm_error *err)
{
    tdm_st_writer *w;
    tdm_status st = tdm_st_writer_open(&w, path, specs, n_specs, meta, n_meta, err);
    if (st != TDM_OK)
        return st;
    for (size_t i = 0; i < n_specs; i++) {
        int64_t numel = 0;
        uint64_t nbytes = 0;
        tdm_st_shape_size(specs[i].shape, specs[i].rank, specs[i].dtype, &numel, &nbytes);
        if (nbytes > 0 && (st = tdm_st_writer_write(w, data[i], (size_t)nbytes, err)) != TDM_OK) {
            tdm_st_writer_abort(w);
            return st;
        }
    }
    return tdm_st_writer_commit(w, err);
}
