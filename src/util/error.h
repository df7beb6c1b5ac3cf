/* error.h — the status + message pair every library function returns.
 *
 * Library code never prints and never exits: it fills a tdm_error and returns its status.
 * Only src/cli and src/main.c turn a status into text for humans and an exit code.
 *
 *     tdm_error err = {0};
 *     if (tdm_ledger_open(&ledger, dir, &err) != TDM_OK) { fprintf(stderr, "%s\n", err.message); }
 */
#ifndef TANDEM_UTIL_ERROR_H
#define TANDEM_UTIL_ERROR_H

typedef enum tdm_status {
    TDM_OK = 0,
    TDM_ERR_INVALID,     /* the caller or the user gave something malformed or out of range */
    TDM_ERR_IO,          /* a system call failed (message carries the path and strerror) */
    TDM_ERR_PARSE,       /* a file could not be parsed (message carries FILE:LINE[:COL]) */
    TDM_ERR_NOMEM,       /* an allocation failed */
    TDM_ERR_NOT_FOUND,   /* a named thing (file, GPU, tensor) does not exist */
    TDM_ERR_UNSUPPORTED, /* understood, but tandem does not do it */
    TDM_ERR_TIMEOUT,     /* a bounded wait ran out */
    TDM_ERR_BUSY,        /* the resource is taken and the caller asked not to wait */
    TDM_ERR_NEVER_FITS,  /* a request larger than the capacity it could ever get */
    TDM_ERR_CORRUPT,     /* on-disk data is damaged */
    TDM_ERR_DEVICE,      /* the GPU, its driver or a GPU library failed (message: call + reason) */
    TDM_ERR_STOPPED,     /* stopped early because the caller asked (a signal); state was saved */
} tdm_status;

typedef struct tdm_error {
    tdm_status status;
    char message[1024];
    int sys_errno; /* the errno a failure came from (tdm_fail_errno), else 0: lets a caller add
                      advice for a cause (a full disk) without parsing the message */
} tdm_error;

/* Fills err (when not NULL) with status and a printf-style message; returns status. */
tdm_status tdm_fail(tdm_error *err, tdm_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Like tdm_fail, and appends ": strerror(errno_value)". */
tdm_status tdm_fail_errno(tdm_error *err, tdm_status status, int errno_value, const char *fmt,
                          ...) __attribute__((format(printf, 4, 5)));

/* Prefixes err->message with "context: " (for example a file name). Returns err->status. */
tdm_status tdm_error_prefix(tdm_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

const char *tdm_status_str(tdm_status status);

/* Returns from the calling function with expr's status when it is not TDM_OK (the callee has
 * filled the error). */
#define TDM_TRY(expr)                                                                              \
    do {                                                                                           \
        tdm_status tdm_try_st_ = (expr);                                                           \
        if (tdm_try_st_ != TDM_OK) return tdm_try_st_;                                             \
    } while (0)

/* Library warnings (a corrupt ledger moved aside, a budget exceeded) go through one sink that the
 * CLI installs; the default prints "tandem: warning: ..." on stderr. */
typedef void (*tdm_warn_fn)(const char *message, void *user);
void tdm_set_warn_sink(tdm_warn_fn fn, void *user);
void tdm_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
