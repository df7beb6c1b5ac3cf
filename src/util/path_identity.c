/* path_identity.c — see path_identity.h. */
#include "util/path_identity.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Appends component c (length len) to the absolute path in out, applying "." and "..". */
static void push_component(char *out, size_t cap, const char *c, size_t len)
{
    if (len == 0 || (len == 1 && c[0] == '.')) return;
    if (len == 2 && c[0] == '.' && c[1] == '.') {
        char *slash = strrchr(out, '/');
        if (slash) *(slash == out ? slash + 1 : slash) = '\0';
        return;
    }
    size_t n = strlen(out);
    if (n + 1 + len + 1 > cap) return; /* the caller checks the total length first */
    if (n > 1 || out[0] != '/') out[n++] = '/';
    memcpy(out + n, c, len);
    out[n + len] = '\0';
}

/* The absolute path of `path` (relative to base_dir, see the header) into full; its length. */
static tdm_status absolute_path(const char *base_dir, const char *path, char *full, size_t cap,
                                size_t *len_out, tdm_error *err)
{
    char cwd[PATH_MAX] = "";
    if (path[0] != '/' && (!base_dir || base_dir[0] != '/') && !getcwd(cwd, sizeof cwd))
        return tdm_fail_errno(err, TDM_ERR_IO, errno, "getcwd");
    int len;
    if (path[0] == '/')
        len = snprintf(full, cap, "%s", path);
    else if (base_dir && base_dir[0] == '/')
        len = snprintf(full, cap, "%s/%s", base_dir, path);
    else if (base_dir && base_dir[0])
        len = snprintf(full, cap, "%s/%s/%s", cwd, base_dir, path);
    else
        len = snprintf(full, cap, "%s/%s", cwd, path);
    if (len < 0 || (size_t)len >= cap)
        return tdm_fail(err, TDM_ERR_INVALID, "path too long: %s", path);
    *len_out = (size_t)len;
    return TDM_OK;
}

/* The longest existing prefix of full (len chars) resolved by realpath(3), then the remaining
 * components applied lexically, into out (cap bytes). */
static tdm_status resolve_prefix(const char *full, size_t len, const char *path, char *out,
                                 size_t cap, tdm_error *err)
{
    /* the longest existing prefix: cut at each '/' from the right until realpath succeeds */
    char prefix[PATH_MAX * 2];
    size_t cut = len;
    char resolved[PATH_MAX];
    if (realpath(full, resolved)) {
        cut = len;
    } else {
        for (;;) {
            while (cut > 0 && full[cut - 1] != '/')
                cut--;
            if (cut == 0) { /* not even "/" resolved: keep the path lexical */
                snprintf(resolved, sizeof resolved, "/");
                break;
            }
            memcpy(prefix, full, cut);
            prefix[cut] = '\0';
            if (realpath(prefix, resolved)) break;
            cut--; /* drop the '/' and try the parent */
        }
    }
    char buf[PATH_MAX * 3];
    snprintf(buf, sizeof buf, "%s", resolved);
    for (const char *c = full + cut; *c;) {
        const char *e = strchr(c, '/');
        size_t l = e ? (size_t)(e - c) : strlen(c);
        push_component(buf, sizeof buf, c, l);
        c += l;
        if (*c == '/') c++;
    }
    if (strlen(buf) + 1 > cap) return tdm_fail(err, TDM_ERR_INVALID, "path too long: %s", path);
    snprintf(out, cap, "%s", buf);
    return TDM_OK;
}

tdm_status tdm_path_identity(const char *base_dir, const char *path, char *key, size_t cap,
                             tdm_error *err)
{
    char full[PATH_MAX * 2];
    size_t len = 0;
    TDM_TRY(absolute_path(base_dir, path, full, sizeof full, &len, err));
    if (len + 2 > cap) return tdm_fail(err, TDM_ERR_INVALID, "path too long: %s", path);
    struct stat st;
    if (stat(full, &st) == 0) {
        snprintf(key, cap, "@%ju:%ju", (uintmax_t)st.st_dev, (uintmax_t)st.st_ino);
        return TDM_OK;
    }
    return resolve_prefix(full, len, path, key, cap, err);
}

tdm_status tdm_path_resolve(const char *base_dir, const char *path, char *out, size_t cap,
                            tdm_error *err)
{
    char full[PATH_MAX * 2];
    size_t len = 0;
    TDM_TRY(absolute_path(base_dir, path, full, sizeof full, &len, err));
    return resolve_prefix(full, len, path, out, cap, err);
}

bool tdm_path_within(const char *inner, const char *outer)
{
    size_t n = strlen(outer);
    if (n == 1 && outer[0] == '/') return inner[0] == '/' && inner[1] != '\0';
    return !strncmp(inner, outer, n) && inner[n] == '/';
}
