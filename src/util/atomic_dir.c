#include "util/atomic_dir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/atomic_file.h"
#include "util/fault.h"

/* Splits path into parent directory and last component (no trailing slash expected). */
static tdm_status split_path(const char *path, char *parent, size_t pcap, const char **base,
                             tdm_error *err)
{
    size_t len = strlen(path);
    if (len == 0 || len >= pcap || path[len - 1] == '/')
        return tdm_fail(err, TDM_ERR_INVALID, "bad directory path \"%s\"", path);
    const char *slash = strrchr(path, '/');
    if (!slash) {
        snprintf(parent, pcap, ".");
        *base = path;
    } else if (slash == path) {
        snprintf(parent, pcap, "/");
        *base = slash + 1;
    } else {
        memcpy(parent, path, (size_t)(slash - path));
        parent[slash - path] = '\0';
        *base = slash + 1;
    }
    if (!**base || strcmp(*base, ".") == 0 || strcmp(*base, "..") == 0)
        return tdm_fail(err, TDM_ERR_INVALID, "bad directory path \"%s\"", path);
    return TDM_OK;
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)ftw;
    if (flag == FTW_DP || flag == FTW_D) return rmdir(p) == 0 || errno == ENOENT ? 0 : -1;
    return unlink(p) == 0 || errno == ENOENT ? 0 : -1;
}

static int rm_tree_raw(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(st.st_mode)) return unlink(path);
    return nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

void tdm_atomic_dir_abort(const char *tmp)
{
    if (tmp && *tmp) rm_tree_raw(tmp);
}

tdm_status tdm_fsync_path(const char *path, tdm_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot open %s", path);
    int rc = tdm_fault("atomic_dir.fsync") ? (errno = EIO, -1) : fsync(fd);
    int saved = errno;
    close(fd);
    if (rc != 0) return tdm_fail_errno(err, TDM_ERR_IO, saved, "cannot fsync %s", path);
    return TDM_OK;
}

tdm_status tdm_atomic_dir_begin(const char *final_path, char *tmp, size_t cap, tdm_error *err)
{
    char parent[PATH_MAX];
    const char *base;
    tdm_status st = split_path(final_path, parent, sizeof parent, &base, err);
    if (st != TDM_OK) return st;
    if (snprintf(tmp, cap, "%s/.%s.tmp-%ld", parent, base, (long)getpid()) >= (int)cap)
        return tdm_fail(err, TDM_ERR_INVALID, "path too long: %s", final_path);
    rm_tree_raw(tmp);
    if (tdm_fault("atomic_dir.mkdir") ? (errno = EIO, 1) : mkdir(tmp, 0755) != 0)
        return tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot create directory %s", tmp);
    return TDM_OK;
}

tdm_status tdm_atomic_dir_commit(const char *tmp, const char *final_path, tdm_error *err)
{
    char parent[PATH_MAX];
    const char *base;
    tdm_status st = split_path(final_path, parent, sizeof parent, &base, err);
    if (st != TDM_OK) {
        rm_tree_raw(tmp);
        return st;
    }
    /* Every file in tmp was fsynced by its writer; make the directory entries durable too. */
    st = tdm_fsync_path(tmp, err);
    if (st != TDM_OK) {
        rm_tree_raw(tmp);
        return st;
    }
    bool exchanged = false;
    int rc;
    if (tdm_fault("atomic_dir.rename")) {
        errno = EIO;
        rc = -1;
    } else {
        rc = renameat2(AT_FDCWD, tmp, AT_FDCWD, final_path, RENAME_NOREPLACE);
        if (rc != 0 && errno == EEXIST) {
            rc = renameat2(AT_FDCWD, tmp, AT_FDCWD, final_path, RENAME_EXCHANGE);
            exchanged = rc == 0;
        } else if (rc != 0 && errno == EINVAL) {
            rc = rename(tmp, final_path); /* a file system without renameat2 flags */
        }
    }
    if (rc != 0) {
        int saved = errno;
        rm_tree_raw(tmp);
        return tdm_fail_errno(err, TDM_ERR_IO, saved, "cannot rename %s to %s", tmp, final_path);
    }
    st = tdm_fsync_dir(parent, err);
    if (exchanged) rm_tree_raw(tmp); /* the old content now lives under the temporary name */
    return st;
}

tdm_status tdm_remove_tree(const char *path, tdm_error *err)
{
    char parent[PATH_MAX], scratch[PATH_MAX + 64];
    const char *base;
    tdm_status st = split_path(path, parent, sizeof parent, &base, err);
    if (st != TDM_OK) return st;
    snprintf(scratch, sizeof scratch, "%s/.%s.del-%ld", parent, base, (long)getpid());
    rm_tree_raw(scratch);
    if (rename(path, scratch) != 0) {
        if (errno == ENOENT) return TDM_OK;
        return tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot remove %s", path);
    }
    st = tdm_fsync_dir(parent, err);
    if (rm_tree_raw(scratch) != 0 && st == TDM_OK)
        st = tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot remove %s", scratch);
    return st;
}

/* True for ".NAME.tmp-PID" / ".NAME.del-PID" and sets *pid. */
static bool scratch_name(const char *name, long *pid)
{
    if (name[0] != '.') return false;
    const char *t = strstr(name, ".tmp-");
    const char *d = strstr(name, ".del-");
    const char *m = t && d ? (t > d ? t : d) : (t ? t : d);
    if (!m || m == name) return false;
    char *end;
    errno = 0;
    long v = strtol(m + 5, &end, 10);
    if (errno || *end || end == m + 5 || v <= 0) return false;
    *pid = v;
    return true;
}

tdm_status tdm_atomic_dir_remove_stale(const char *dir, int *n_removed, tdm_error *err)
{
    if (n_removed) *n_removed = 0;
    DIR *d = opendir(dir);
    if (!d)
        return tdm_fail_errno(err, errno == ENOENT ? TDM_ERR_NOT_FOUND : TDM_ERR_IO, errno,
                              "cannot open directory %s", dir);
    struct dirent *e;
    char path[PATH_MAX];
    while ((e = readdir(d)) != NULL) {
        long pid;
        if (!scratch_name(e->d_name, &pid)) continue;
        if (kill((pid_t)pid, 0) == 0 || errno == EPERM)
            continue; /* its writer may still be at work */
        if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) continue;
        if (rm_tree_raw(path) == 0 && n_removed) (*n_removed)++;
    }
    closedir(d);
    return TDM_OK;
}
