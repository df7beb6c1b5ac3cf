/* regular_file.h — opening an input file for reading only when it is a regular file.
 *
 * A FIFO, a character device or a socket given where tandem expects a file (model config.json,
 * *.safetensors, tokenizer.json, a JSONL dataset, adapters.toml, ...) would make a plain
 * open()/read() block forever (a FIFO without a writer) or read without end (/dev/zero). These
 * helpers open with O_NONBLOCK, so opening a FIFO returns at once, check fstat's st_mode, refuse
 * anything but a regular file with a message naming the path and its kind, and then clear
 * O_NONBLOCK so the caller reads as usual.
 */
#ifndef TANDEM_UTIL_REGULAR_FILE_H
#define TANDEM_UTIL_REGULAR_FILE_H
#include <stdio.h>
#include <sys/stat.h>

#include "util/error.h"

/* Opens path read-only (O_CLOEXEC, blocking reads) when it is a regular file: *fd is the open
 * descriptor and *sb (when not NULL) its fstat. Errors: TDM_ERR_NOT_FOUND (no such file),
 * TDM_ERR_IO ("PATH: not a regular file (a FIFO); ...", and the like, with nothing left open; it
 * is an I/O status, as read() on a directory failing with EISDIR would be, so the CLI exits 1),
 * TDM_ERR_IO also for any other open/fstat/fcntl failure. */
tdm_status tdm_open_regular(const char *path, int *fd, struct stat *sb, tdm_error *err);

/* Same check, as a stdio stream opened "rb". */
tdm_status tdm_fopen_regular(const char *path, FILE **out, tdm_error *err);

#endif
