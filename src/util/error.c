#include "util/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

tdm_status tdm_fail(tdm_error *err, tdm_status status, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
        err->status = status;
        err->sys_errno = 0;
    }
    return status;
}

tdm_status tdm_fail_errno(tdm_error *err, tdm_status status, int errno_value, const char *fmt,
                          ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < sizeof err->message)
            snprintf(err->message + n, sizeof err->message - (size_t)n, ": %s",
                     strerror(errno_value));
        err->status = status;
        err->sys_errno = errno_value;
    }
    return status;
}

tdm_status tdm_error_prefix(tdm_error *err, const char *fmt, ...)
{
    if (!err)
        return TDM_ERR_INVALID;
    char prefix[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(prefix, sizeof prefix - 2, fmt, ap);
    va_end(ap);
    if (n < 0)
        return err->status;
    size_t plen = strlen(prefix);
    memcpy(prefix + plen, ": ", 3);
    plen += 2;
    /* Shift the old message right by plen (truncating its tail), then write the prefix. */
    size_t cap = sizeof err->message;
    size_t old_len = strnlen(err->message, cap - 1);
    if (plen >= cap)
        plen = cap - 1;
    if (old_len + plen > cap - 1)
        old_len = cap - 1 - plen;
    memmove(err->message + plen, err->message, old_len);
    err->message[plen + old_len] = '\0';
    memcpy(err->message, prefix, plen);
    return err->status;
}

const char *tdm_status_str(tdm_status status)
{
    switch (status) {
    case TDM_OK: return "ok";
    case TDM_ERR_INVALID: return "invalid argument";
    case TDM_ERR_IO: return "I/O error";
    case TDM_ERR_PARSE: return "parse error";
    case TDM_ERR_NOMEM: return "out of memory";
    case TDM_ERR_NOT_FOUND: return "not found";
    case TDM_ERR_UNSUPPORTED: return "unsupported";
    case TDM_ERR_TIMEOUT: return "timed out";
    case TDM_ERR_BUSY: return "busy";
    case TDM_ERR_NEVER_FITS: return "never fits";
    case TDM_ERR_CORRUPT: return "corrupt data";
    case TDM_ERR_DEVICE: return "device failure";
    case TDM_ERR_STOPPED: return "stopped on request";
    }
    return "unknown status";
}

static void default_warn(const char *message, void *user)
{
    (void)user;
    fprintf(stderr, "tandem: warning: %s\n", message);
}

static tdm_warn_fn warn_sink = default_warn;
static void *warn_user;

void tdm_set_warn_sink(tdm_warn_fn fn, void *user)
{
    warn_sink = fn ? fn : default_warn;
    warn_user = user;
}

void tdm_warn(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    warn_sink(buf, warn_user);
}
