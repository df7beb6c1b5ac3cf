#include "model/weights.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util/atomic_file.h"

void tdm_weights_close(tdm_weights *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n_files; i++) {
        tdm_st_close(&w->files[i]);
        free(w->file_names[i]);
    }
    free(w->files);
    free(w->file_names);
    free(w->tensors);
    free(w->tensor_file);
    free(w->index_path);
    memset(w, 0, sizeof *w);
}

static int cmp_tensor_name(const void *a, const void *b)
{
    const tdm_st_tensor *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

/* Adds a shard (already validated) and returns its index. */
static tdm_status add_file(tdm_weights *w, const char *path, size_t *idx, tdm_error *err)
{
    tdm_st_file *nf = realloc(w->files, (w->n_files + 1) * sizeof *nf);
    if (!nf)
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    w->files = nf;
    char **nn = realloc(w->file_names, (w->n_files + 1) * sizeof *nn);
    if (!nn)
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    w->file_names = nn;
    char *name = strdup(path);
    if (!name)
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    tdm_status st = tdm_st_open(&w->files[w->n_files], path, err);
    if (st != TDM_OK) {
        free(name);
        return st;
    }
    w->file_names[w->n_files] = name;
    *idx = w->n_files++;
    return TDM_OK;
}

/* Builds the sorted name table and rejects duplicates across shards. */
static tdm_status build_table(tdm_weights *w, tdm_error *err)
{
    size_t n = 0;
    for (size_t i = 0; i < w->n_files; i++)
        n += w->files[i].n_tensors;
    w->tensors = calloc(n ? n : 1, sizeof *w->tensors);
    w->tensor_file = calloc(n ? n : 1, sizeof *w->tensor_file);
    if (!w->tensors || !w->tensor_file)
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < w->n_files; i++)
        for (size_t j = 0; j < w->files[i].n_tensors; j++)
            w->tensors[w->n_tensors++] = &w->files[i].tensors[j];
    qsort(w->tensors, w->n_tensors, sizeof *w->tensors, cmp_tensor_name);
    /* Recover each tensor's file by pointer range (the file tables are contiguous arrays). */
    for (size_t k = 0; k < w->n_tensors; k++) {
        for (size_t i = 0; i < w->n_files; i++) {
            const tdm_st_file *f = &w->files[i];
            if (w->tensors[k] >= f->tensors && w->tensors[k] < f->tensors + f->n_tensors) {
                w->tensor_file[k] = i;
                break;
            }
        }
        if (k > 0 && !strcmp(w->tensors[k]->name, w->tensors[k - 1]->name))
            return tdm_fail(err, TDM_ERR_CORRUPT, "tensor \"%s\" is in both %s and %s",
                            w->tensors[k]->name, w->file_names[w->tensor_file[k - 1]],
                            w->file_names[w->tensor_file[k]]);
    }
    return TDM_OK;
}

static bool plain_file_name(const char *s)
{
    return *s && *s != '.' && !strchr(s, '/') && strlen(s) < NAME_MAX;
}

static tdm_status open_index(tdm_weights *w, const char *dir, const char *index_path,
                             tdm_error *err)
{
    w->index_path = strdup(index_path);
    if (!w->index_path)
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    char *text;
    size_t len;
    tdm_status rst = tdm_read_file(index_path, &text, &len, err); /* refuses a FIFO */
    if (rst != TDM_OK) return rst;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!root)
        return tdm_fail(err, TDM_ERR_PARSE, "%s:%d:%d: %s", index_path, jerr.line, jerr.column,
                        jerr.text);
    tdm_status st = TDM_OK;
    json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(map)) {
        st = tdm_fail(err, TDM_ERR_PARSE, "%s: missing \"weight_map\" object", index_path);
        goto out;
    }
    const char *name;
    json_t *v;
    /* First pass: open each shard once, in order of first appearance. */
    json_object_foreach(map, name, v) {
        if (!json_is_string(v) || !plain_file_name(json_string_value(v))) {
            st = tdm_fail(err, TDM_ERR_PARSE,
                          "%s: weight_map[\"%s\"] must be a plain file name in the model "
                          "directory",
                          index_path, name);
            goto out;
        }
        char path[PATH_MAX];
        if (snprintf(path, sizeof path, "%s/%s", dir, json_string_value(v)) >= (int)sizeof path) {
            st = tdm_fail(err, TDM_ERR_INVALID, "path too long under %s", dir);
            goto out;
        }
        bool seen = false;
        for (size_t i = 0; i < w->n_files && !seen; i++)
            seen = !strcmp(w->file_names[i], path);
        size_t idx;
        if (!seen && (st = add_file(w, path, &idx, err)) != TDM_OK) {
            tdm_error_prefix(err, "shard listed in %s", index_path);
            goto out;
        }
    }
    if ((st = build_table(w, err)) != TDM_OK)
        goto out;
    /* Second pass: every indexed tensor is where the index says. */
    json_object_foreach(map, name, v) {
        const tdm_st_tensor *t = tdm_weights_find(w, name);
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, json_string_value(v));
        if (!t) {
            st = tdm_fail(err, TDM_ERR_CORRUPT, "%s: tensor \"%s\" is indexed in %s but absent",
                          index_path, name, json_string_value(v));
            goto out;
        }
        size_t k = (size_t)((const tdm_st_tensor *const *)bsearch(&t, w->tensors, w->n_tensors,
                                                                  sizeof *w->tensors,
                                                                  cmp_tensor_name) -
                            w->tensors);
        if (strcmp(w->file_names[w->tensor_file[k]], path) != 0) {
            st = tdm_fail(err, TDM_ERR_CORRUPT, "%s: tensor \"%s\" is indexed in %s but lives in %s",
                          index_path, name, path, w->file_names[w->tensor_file[k]]);
            goto out;
        }
    }
    if (json_object_size(map) != w->n_tensors) {
        for (size_t k = 0; k < w->n_tensors; k++)
            if (!json_object_get(map, w->tensors[k]->name)) {
                st = tdm_fail(err, TDM_ERR_CORRUPT, "%s: tensor \"%s\" of %s is not indexed",
                              index_path, w->tensors[k]->name, w->file_names[w->tensor_file[k]]);
                goto out;
            }
    }
out:
    json_decref(root);
    return st;
}

tdm_status tdm_weights_open(tdm_weights *w, const char *path, tdm_error *err)
{
    memset(w, 0, sizeof *w);
    struct stat sb;
    if (stat(path, &sb) != 0)
        return tdm_fail_errno(err, errno == ENOENT ? TDM_ERR_NOT_FOUND : TDM_ERR_IO, errno,
                              "cannot open %s", path);
    tdm_status st;
    size_t idx;
    if (!S_ISDIR(sb.st_mode)) {
        st = add_file(w, path, &idx, err);
        if (st == TDM_OK)
            st = build_table(w, err);
    } else {
        char index[PATH_MAX], single[PATH_MAX];
        if (snprintf(index, sizeof index, "%s/model.safetensors.index.json", path) >=
                (int)sizeof index ||
            snprintf(single, sizeof single, "%s/model.safetensors", path) >= (int)sizeof single)
            return tdm_fail(err, TDM_ERR_INVALID, "path too long: %s", path);
        if (stat(index, &sb) == 0)
            st = open_index(w, path, index, err);
        else if (stat(single, &sb) == 0) {
            st = add_file(w, single, &idx, err);
            if (st == TDM_OK)
                st = build_table(w, err);
        } else
            return tdm_fail(err, TDM_ERR_NOT_FOUND,
                            "%s: no model.safetensors or model.safetensors.index.json in this "
                            "directory",
                            path);
    }
    if (st != TDM_OK)
        tdm_weights_close(w);
    return st;
}

const tdm_st_tensor *tdm_weights_find(const tdm_weights *w, const char *name)
{
    size_t lo = 0, hi = w->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(w->tensors[mid]->name, name);
        if (c == 0)
            return w->tensors[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

uint64_t tdm_weights_data_bytes(const tdm_weights *w)
{
    uint64_t total = 0;
    for (size_t i = 0; i < w->n_files; i++)
        total += w->files[i].data_len;
    return total;
}
