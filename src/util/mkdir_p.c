/* mkdir_p.c — `mkdir -p` (mkdir_p.h). */
#include "util/mkdir_p.h"

#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>

tdm_status tdm_mkdir_p(const char *path, mode_t mode, tdm_error *err)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return tdm_fail(err, TDM_ERR_INVALID, "path too long: %s", path);
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char saved = *p;
        *p = '\0';
        if (mkdir(buf, mode) != 0 && errno != EEXIST)
            return tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot create directory %s", buf);
        *p = saved;
        if (!saved) break;
    }
    return TDM_OK;
}
