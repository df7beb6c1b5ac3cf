/* stage.c — checksum-compared copies through transport.h. */
#include "cluster/stage.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char hash_script[] =
    "for f in \"$@\"; do h=$(sha256sum < \"$f\" 2>/dev/null) || h=; "
    "h=${h%% *}; echo \"${h:-none}\"; done\n";

tdm_status tdm_stage_hashes(tdm_transport *t, const char *const *paths, size_t n,
                            char (*hex)[65], tdm_error *err)
{
    const char **argv = calloc(n + 5, sizeof *argv); /* NULL-terminated for spawn */
    if (!argv)
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    argv[0] = "sh";
    argv[1] = "-c";
    argv[2] = hash_script;
    argv[3] = "tandem-hash";
    memcpy(argv + 4, paths, n * sizeof *paths);
    tdm_spawn_result res;
    tdm_status st = t ? tdm_transport_run(t, argv, n + 4, NULL, 0, 0, &res, err)
                      : tdm_spawn_run(argv, NULL, 0, 0, &res, err);
    free(argv);
    if (st != TDM_OK)
        return st;
    char why[512];
    if (t && tdm_transport_unreachable(t, &res, why, sizeof why)) {
        tdm_spawn_result_free(&res);
        return tdm_fail(err, TDM_ERR_IO, "node %s is unreachable: %s", t->node->name, why);
    }
    const char *p = res.out;
    for (size_t i = 0; i < n; i++) {
        size_t len = strcspn(p, "\n");
        if (len == 64)
            memcpy(hex[i], p, 64), hex[i][64] = '\0';
        else
            hex[i][0] = '\0';
        p += len + (p[len] == '\n');
    }
    tdm_spawn_result_free(&res);
    return TDM_OK;
}

/* The model directory's regular files (relative paths, sorted). */
typedef struct file_list {
    char **rel;
    size_t n, cap;
} file_list;

static tdm_status list_files(const char *root, const char *rel, file_list *fl, int depth,
                             tdm_error *err)
{
    if (depth > 8)
        return TDM_OK;
    char path[4096];
    snprintf(path, sizeof path, "%s%s%s", root, rel[0] ? "/" : "", rel);
    DIR *d = opendir(path);
    if (!d)
        return tdm_fail_errno(err, errno == ENOENT ? TDM_ERR_NOT_FOUND : TDM_ERR_IO, errno, "%s",
                              path);
    struct dirent *de;
    tdm_status st = TDM_OK;
    while ((de = readdir(d)) && st == TDM_OK) {
        if (de->d_name[0] == '.')
            continue;
        char sub[4096], full[8192];
        snprintf(sub, sizeof sub, "%s%s%s", rel, rel[0] ? "/" : "", de->d_name);
        snprintf(full, sizeof full, "%s/%s", root, sub);
        struct stat s;
        if (stat(full, &s) != 0)
            continue;
        if (S_ISDIR(s.st_mode)) {
            st = list_files(root, sub, fl, depth + 1, err);
        } else if (S_ISREG(s.st_mode)) {
            if (fl->n == fl->cap) {
                fl->cap = fl->cap ? fl->cap * 2 : 16;
                char **g = realloc(fl->rel, fl->cap * sizeof *g);
                if (!g) {
                    st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
                    break;
                }
                fl->rel = g;
            }
            fl->rel[fl->n] = strdup(sub);
            if (!fl->rel[fl->n])
                st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
            else
                fl->n++;
        }
    }
    closedir(d);
    return st;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static char *join(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b) + 2;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "%s/%s", a, b);
    return s;
}

static int64_t file_size(const char *path)
{
    struct stat s;
    return stat(path, &s) == 0 ? (int64_t)s.st_size : 0;
}

/* Copies local[i] to remote[i] where the node's hash differs from the local one. */
static tdm_status sync_files(tdm_transport *t, char **local, char **remote, char (*lhex)[65],
                             size_t n, tdm_stage_stats *stats, tdm_error *err)
{
    char(*rhex)[65] = calloc(n ? n : 1, sizeof *rhex);
    if (!rhex)
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    tdm_status st = tdm_stage_hashes(t, (const char *const *)remote, n, rhex, err);
    for (size_t i = 0; i < n && st == TDM_OK; i++) {
        if (lhex[i][0] && !strcmp(lhex[i], rhex[i])) {
            stats->present++;
            continue;
        }
        st = tdm_transport_push(t, local[i], remote[i], err);
        if (st == TDM_OK) {
            stats->copied++;
            stats->copied_bytes += file_size(local[i]);
        }
    }
    free(rhex);
    return st;
}

static const char *base_name(const char *path, char *buf, size_t size)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    size_t start = n;
    while (start > 0 && path[start - 1] != '/')
        start--;
    snprintf(buf, size, "%.*s", (int)(n - start), path + start);
    return buf;
}

tdm_status tdm_stage_model(tdm_transport *t, const char *model_dir, char **remote_dir,
                           tdm_stage_stats *stats, tdm_error *err)
{
    *remote_dir = NULL;
    file_list fl = {0};
    tdm_status st = list_files(model_dir, "", &fl, 0, err);
    char(*hex)[65] = NULL;
    char **local = NULL, **remote = NULL;
    char *manifest = NULL;
    if (st != TDM_OK)
        goto out;
    if (fl.n == 0) {
        st = tdm_fail(err, TDM_ERR_NOT_FOUND, "%s: no files in the model directory", model_dir);
        goto out;
    }
    qsort(fl.rel, fl.n, sizeof *fl.rel, cmp_str);
    hex = calloc(fl.n, sizeof *hex);
    local = calloc(fl.n, sizeof *local);
    remote = calloc(fl.n, sizeof *remote);
    if (!hex || !local || !remote) {
        st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        goto out;
    }
    size_t mlen = 0;
    for (size_t i = 0; i < fl.n; i++) {
        local[i] = join(model_dir, fl.rel[i]);
        if (!local[i]) {
            st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
            goto out;
        }
        mlen += strlen(fl.rel[i]) + 68;
    }
    st = tdm_stage_hashes(NULL, (const char *const *)local, fl.n, hex, err);
    if (st != TDM_OK)
        goto out;
    manifest = malloc(mlen + 1);
    if (!manifest) {
        st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        goto out;
    }
    manifest[0] = '\0';
    size_t off = 0;
    for (size_t i = 0; i < fl.n; i++) {
        if (!hex[i][0]) {
            st = tdm_fail(err, TDM_ERR_IO, "%s: cannot read it to checksum it", local[i]);
            goto out;
        }
        off += (size_t)sprintf(manifest + off, "%s  %s\n", hex[i], fl.rel[i]);
    }
    /* SHA-256 of the manifest, through sha256sum's stdin. */
    const char *argv[] = {"sha256sum", NULL};
    tdm_spawn_result res;
    st = tdm_spawn_run(argv, manifest, off, 0, &res, err);
    if (st != TDM_OK)
        goto out;
    char mhash[13];
    snprintf(mhash, sizeof mhash, "%.12s", res.out);
    bool ok = res.exit_code == 0 && strlen(mhash) == 12;
    tdm_spawn_result_free(&res);
    if (!ok) {
        st = tdm_fail(err, TDM_ERR_IO, "sha256sum failed");
        goto out;
    }
    char base[512], leaf[600];
    base_name(model_dir, base, sizeof base);
    snprintf(leaf, sizeof leaf, "models/%s-%s", base, mhash);
    *remote_dir = join(t->node->workdir, leaf);
    if (!*remote_dir) {
        st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < fl.n; i++) {
        remote[i] = join(*remote_dir, fl.rel[i]);
        if (!remote[i]) {
            st = tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
            goto out;
        }
    }
    st = sync_files(t, local, remote, hex, fl.n, stats, err);
out:
    for (size_t i = 0; i < fl.n; i++) {
        free(fl.rel[i]);
        if (local)
            free(local[i]);
        if (remote)
            free(remote[i]);
    }
    free(fl.rel);
    free(local);
    free(remote);
    free(hex);
    free(manifest);
    if (st != TDM_OK) {
        free(*remote_dir);
        *remote_dir = NULL;
    }
    return st;
}

tdm_status tdm_stage_file(tdm_transport *t, const char *path, char **remote_path,
                          tdm_stage_stats *stats, tdm_error *err)
{
    *remote_path = NULL;
    char hex[1][65];
    tdm_status st = tdm_stage_hashes(NULL, &path, 1, hex, err);
    if (st != TDM_OK)
        return st;
    if (!hex[0][0])
        return tdm_fail(err, TDM_ERR_NOT_FOUND, "%s: cannot read it (does it exist?)", path);
    char base[512];
    base_name(path, base, sizeof base);
    size_t n = strlen(t->node->workdir) + strlen(base) + 32;
    char *remote = malloc(n);
    if (!remote)
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    snprintf(remote, n, "%s/data/%.12s/%s", t->node->workdir, hex[0], base);
    char *local = (char *)path;
    st = sync_files(t, &local, &remote, hex, 1, stats, err);
    if (st != TDM_OK) {
        free(remote);
        return st;
    }
    *remote_path = remote;
    return TDM_OK;
}
