#include "util/append_file.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/fault.h"

static bool fault_at(const char *fault, const char *what)
{
    char name[128];
    snprintf(name, sizeof name, "%s.%s", fault, what);
    return tdm_fault(name);
}

/* Writes all n bytes of p to fd. A full disk first writes what fits (a short count) and fails
 * the next call with ENOSPC: looping reports that real errno instead of a made-up EIO. Returns 0
 * or the errno of the failing call. */
static int write_all(int fd, const char *p, size_t n, const char *fault)
{
    if (fault_at(fault, "write")) return EIO;
    if (fault_at(fault, "enospc")) {
        if (write(fd, p, n / 2) < 0) return errno;
        return ENOSPC;
    }
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return errno;
        if (w == 0) return EIO; /* no progress and no errno: do not spin */
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

tdm_status tdm_append_whole(const char *path, const void *data, size_t n, const char *fault,
                            tdm_error *err)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot open %s", path);
    tdm_status st = TDM_OK;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot stat %s", path);
        close(fd);
        return st;
    }
    int e = write_all(fd, data, n, fault);
    const char *what = "append to";
    if (e == 0 && fsync(fd) != 0) { /* a delayed allocation can fail here with ENOSPC too */
        e = errno;
        what = "fsync";
    }
    if (e != 0) {
        /* take back the part that was written: the file still ends with the last whole record */
        if (ftruncate(fd, sb.st_size) != 0)
            st = tdm_fail_errno(err, TDM_ERR_IO, e,
                                "cannot %s %s (and cutting the partial record off failed too: "
                                "%s; its last record is torn)",
                                what, path, strerror(errno));
        else
            st = tdm_fail_errno(err, TDM_ERR_IO, e, "cannot %s %s", what, path);
    }
    close(fd);
    return st;
}
