/* base_identity.c — see base_identity.h. */
#include "model/base_identity.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/regular_file.h"

static void hash_u64(tdm_sha256 *h, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    tdm_sha256_update(h, b, sizeof b);
}

/* pread of exactly len bytes at off into buf. */
static bool read_at(int fd, void *buf, size_t len, uint64_t off)
{
    size_t done = 0;
    while (done < len) {
        ssize_t r = pread(fd, (char *)buf + done, len - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        done += (size_t)r;
    }
    return true;
}

/* Feeds one file (the whole of it when small is true, else size + header + sampled blocks). */
static tdm_status hash_file(tdm_sha256 *h, const char *path, bool whole, tdm_error *err)
{
    int fd = -1;
    struct stat st;
    tdm_status s = tdm_open_regular(path, &fd, &st, err); /* a FIFO must not block us */
    if (s != TDM_OK) return s;
    uint8_t *buf = NULL;
    uint64_t size = (uint64_t)st.st_size;
    hash_u64(h, size);
    if (whole) {
        if (size > (64u << 20)) {
            s = tdm_fail(err, TDM_ERR_INVALID, "%s: larger than 64 MiB", path);
            goto done;
        }
        buf = malloc(size ? size : 1);
        if (!buf || !read_at(fd, buf, size, 0)) {
            s = buf ? tdm_fail_errno(err, TDM_ERR_IO, errno, "read %s", path)
                    : tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
            goto done;
        }
        tdm_sha256_update(h, buf, size);
        goto done;
    }
    uint8_t lenb[8];
    if (size < 8 || !read_at(fd, lenb, 8, 0)) {
        s = tdm_fail(err, TDM_ERR_CORRUPT, "%s: too short for a safetensors file", path);
        goto done;
    }
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)lenb[i] << (8 * i);
    if (hlen > size - 8 || hlen > (100u << 20)) {
        s = tdm_fail(err, TDM_ERR_CORRUPT, "%s: header length %llu beyond the file", path,
                     (unsigned long long)hlen);
        goto done;
    }
    buf = malloc(hlen > TDM_BASE_IDENTITY_BLOCK ? hlen : TDM_BASE_IDENTITY_BLOCK);
    if (!buf) {
        s = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (!read_at(fd, buf, hlen, 8)) {
        s = tdm_fail_errno(err, TDM_ERR_IO, errno, "read %s", path);
        goto done;
    }
    tdm_sha256_update(h, lenb, 8);
    tdm_sha256_update(h, buf, hlen);
    uint64_t data0 = 8 + hlen, data_len = size - data0;
    uint64_t blk = TDM_BASE_IDENTITY_BLOCK;
    if (data_len <= blk * TDM_BASE_IDENTITY_SAMPLES) { /* small: all of it, block by block */
        for (uint64_t off = 0; off < data_len; off += blk) {
            uint64_t n = data_len - off < blk ? data_len - off : blk;
            if (!read_at(fd, buf, n, data0 + off)) {
                s = tdm_fail_errno(err, TDM_ERR_IO, errno, "read %s", path);
                goto done;
            }
            tdm_sha256_update(h, buf, n);
        }
        goto done;
    }
    for (int i = 0; i < TDM_BASE_IDENTITY_SAMPLES; i++) {
        uint64_t off = (data_len - blk) / (TDM_BASE_IDENTITY_SAMPLES - 1) * (uint64_t)i;
        if (i == TDM_BASE_IDENTITY_SAMPLES - 1) off = data_len - blk;
        if (!read_at(fd, buf, blk, data0 + off)) {
            s = tdm_fail_errno(err, TDM_ERR_IO, errno, "read %s", path);
            goto done;
        }
        tdm_sha256_update(h, buf, blk);
    }
done:
    free(buf);
    close(fd);
    return s;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

tdm_status tdm_base_model_identity(const char *model_dir, char out[TDM_BASE_IDENTITY_LEN],
                                   tdm_error *err)
{
    tdm_sha256 h;
    tdm_sha256_init(&h);
    static const char magic[] = "tandem-base-identity-v1\n";
    tdm_sha256_update(&h, magic, sizeof magic - 1);
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    tdm_status s = hash_file(&h, path, true, err);
    if (s != TDM_OK) return s;

    DIR *d = opendir(model_dir);
    if (!d) return tdm_fail_errno(err, TDM_ERR_IO, errno, "%s", model_dir);
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while (s == TDM_OK && (e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l <= 12 || strcmp(e->d_name + l - 12, ".safetensors") || e->d_name[0] == '.') continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn) {
                s = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
                break;
            }
            names = nn;
        }
        if (!(names[n] = strdup(e->d_name)))
            s = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        else
            n++;
    }
    closedir(d);
    if (s == TDM_OK && n == 0)
        s = tdm_fail(err, TDM_ERR_NOT_FOUND, "%s: no .safetensors file", model_dir);
    if (s == TDM_OK) qsort(names, n, sizeof *names, cmp_names);
    for (size_t i = 0; s == TDM_OK && i < n; i++) {
        hash_u64(&h, strlen(names[i]));
        tdm_sha256_update(&h, names[i], strlen(names[i]));
        snprintf(path, sizeof path, "%s/%s", model_dir, names[i]);
        s = hash_file(&h, path, false, err);
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    if (s != TDM_OK) return s;
    uint8_t dg[TDM_SHA256_DIGEST_LEN];
    tdm_sha256_final(&h, dg);
    tdm_sha256_tagged(dg, out);
    return TDM_OK;
}
