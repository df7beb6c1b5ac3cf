/* mkdir_p.h — `mkdir -p`: a directory and every missing parent. */
#ifndef TANDEM_UTIL_MKDIR_P_H
#define TANDEM_UTIL_MKDIR_P_H
#include <sys/types.h>

#include "util/error.h"

/* Creates path and every missing component of it with mode (before the umask); components that
 * exist are fine, whatever they are (a later open names the problem). Errors: TDM_ERR_INVALID
 * for a path longer than 4095 bytes, TDM_ERR_IO naming the component that could not be created
 * and why. */
tdm_status tdm_mkdir_p(const char *path, mode_t mode, tdm_error *err);

#endif
