/* regular_file.c — open an input only when it is a regular file (see regular_file.h). */
#include "util/regular_file.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

/* What a non-regular st_mode is, in words for the message. */
static const char *file_kind(mode_t mode)
{
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a plain file";
}

tdm_status tdm_open_regular(const char *path, int *fd, struct stat *sb, tdm_error *err)
{
    *fd = -1;
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever. */
    int f = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (f < 0)
        return tdm_fail_errno(err, errno == ENOENT ? TDM_ERR_NOT_FOUND : TDM_ERR_IO, errno,
                              "%s: cannot open", path);
    struct stat st;
    if (fstat(f, &st) != 0) {
        int e = errno;
        close(f);
        return tdm_fail_errno(err, TDM_ERR_IO, e, "cannot stat %s", path);
    }
    if (!S_ISREG(st.st_mode)) {
        close(f);
        return tdm_fail(err, TDM_ERR_IO,
                        "%s: not a regular file (%s); give the path of an ordinary file", path,
                        file_kind(st.st_mode));
    }
    int flags = fcntl(f, F_GETFL);
    if (flags < 0 || fcntl(f, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(f);
        return tdm_fail_errno(err, TDM_ERR_IO, e, "cannot clear O_NONBLOCK on %s", path);
    }
    if (sb) *sb = st;
    *fd = f;
    return TDM_OK;
}

tdm_status tdm_fopen_regular(const char *path, FILE **out, tdm_error *err)
{
    *out = NULL;
    int fd;
    tdm_status st = tdm_open_regular(path, &fd, NULL, err);
    if (st != TDM_OK) return st;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        close(fd);
        return tdm_fail_errno(err, TDM_ERR_IO, e, "%s: cannot open", path);
    }
    *out = f;
    return TDM_OK;
}
