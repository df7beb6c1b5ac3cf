#include "util/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/fault.h"
#include "util/regular_file.h"

tdm_status tdm_fsync_dir(const char *dir, tdm_error *err)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot open directory %s", dir);
    int rc = tdm_fault("atomic_write.dirsync") ? (errno = EIO, -1) : fsync(fd);
    int saved = errno;
    close(fd);
    if (rc != 0)
        return tdm_fail_errno(err, TDM_ERR_IO, saved, "cannot fsync directory %s", dir);
    return TDM_OK;
}

static tdm_status write_all(int fd, const char *tmp, const void *data, size_t len, tdm_error *err)
{
    const char *p = data;
    while (len > 0) {
        ssize_t n = tdm_fault("atomic_write.write") ? (errno = EIO, -1) : write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot write %s", tmp);
        }
        p += n;
        len -= (size_t)n;
    }
    return TDM_OK;
}

/* Creates the temp file exclusively: O_EXCL|O_NOFOLLOW never opens what is already at the path, so
 * a hard link or symbolic link planted there (to make us truncate and rewrite another file) is
 * never written through. A file already there is removed first only when it is plainly a leftover
 * of ours (our pid is in its name): a regular file owned by us with one link. Anything else stays
 * and the write fails with EEXIST. */
static int create_temp(const char *tmp, mode_t mode)
{
    const int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW;
    int fd = open(tmp, flags, mode);
    if (fd >= 0 || errno != EEXIST)
        return fd;
    struct stat st;
    if (lstat(tmp, &st) != 0)
        return -1;
    if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || st.st_nlink != 1) {
        errno = EEXIST;
        return -1;
    }
    if (unlink(tmp) != 0 && errno != ENOENT)
        return -1;
    return open(tmp, flags, mode);
}

tdm_status tdm_create_temp_exclusive(const char *tmp, mode_t mode, int *fd, tdm_error *err)
{
    *fd = create_temp(tmp, mode);
    if (*fd >= 0)
        return TDM_OK;
    if (errno == EEXIST)
        return tdm_fail(err, TDM_ERR_IO,
                        "cannot create %s: a file that is not a stale temp file of ours is there "
                        "(another user's, a link, or not a regular file); remove it",
                        tmp);
    return tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot create %s", tmp);
}

tdm_status tdm_atomic_write(const char *path, const void *data, size_t len, mode_t mode,
                            tdm_error *err)
{
    char dir_buf[PATH_MAX], base_buf[PATH_MAX], tmp[PATH_MAX + 64];
    if (snprintf(dir_buf, sizeof dir_buf, "%s", path) >= (int)sizeof dir_buf ||
        snprintf(base_buf, sizeof base_buf, "%s", path) >= (int)sizeof base_buf)
        return tdm_fail(err, TDM_ERR_INVALID, "path too long: %s", path);
    const char *dir = dirname(dir_buf);
    const char *base = basename(base_buf);
    snprintf(tmp, sizeof tmp, "%s/.%s.tmp-%ld", dir, base, (long)getpid());

    int fd = -1;
    if (tdm_fault("atomic_write.open"))
        return tdm_fail_errno(err, TDM_ERR_IO, EIO, "cannot create %s", tmp);
    tdm_status st = tdm_create_temp_exclusive(tmp, mode, &fd, err);
    if (st != TDM_OK) {
        /* the user named a directory that is not there: say so, not the temp file's name */
        struct stat sb;
        if (stat(dir, &sb) != 0 && errno == ENOENT)
            return tdm_fail(err, TDM_ERR_IO,
                            "cannot write %s: directory %s does not exist (create it first)",
                            path, dir);
        return st;
    }
    st = write_all(fd, tmp, data, len, err);
    if (st == TDM_OK && fchmod(fd, mode) != 0) /* umask may have narrowed or widened it */
        st = tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot chmod %s", tmp);
    if (st == TDM_OK && (tdm_fault("atomic_write.fsync") ? (errno = EIO, 1) : fsync(fd) != 0))
        st = tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot fsync %s", tmp);
    if (close(fd) != 0 && st == TDM_OK)
        st = tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot close %s", tmp);
    if (st == TDM_OK &&
        (tdm_fault("atomic_write.rename") ? (errno = EIO, 1) : rename(tmp, path) != 0))
        st = tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot rename %s to %s", tmp, path);
    if (st != TDM_OK) {
        unlink(tmp);
        return st;
    }
    return tdm_fsync_dir(dir, err);
}

tdm_status tdm_read_file(const char *path, char **out, size_t *len, tdm_error *err)
{
    *out = NULL;
    if (len)
        *len = 0;
    int fd;
    tdm_status st = tdm_open_regular(path, &fd, NULL, err);
    if (st != TDM_OK) return st;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        close(fd);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory reading %s", path);
    }
    for (;;) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                close(fd);
                return tdm_fail(err, TDM_ERR_NOMEM, "out of memory reading %s", path);
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + n, cap - n - 1);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            int saved = errno;
            free(buf);
            close(fd);
            return tdm_fail_errno(err, TDM_ERR_IO, saved, "cannot read %s", path);
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    *out = buf;
    if (len)
        *len = n;
    return TDM_OK;
}
