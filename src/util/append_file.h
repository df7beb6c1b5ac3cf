/* append_file.h — append one record to a file so that it is whole or absent.
 *
 * The append-only run records (metrics.jsonl, the TensorBoard event files) add one record per
 * call: the bytes go out through an O_APPEND descriptor and are fsynced. When a write or the fsync
 * fails (a disk that fills up mid-record writes part of it, then fails with ENOSPC), the file is
 * cut back to its size before the call, so it still ends with the last whole record and a reader
 * (`tandem report`, TensorBoard, a resume) never meets half of one.
 */
#ifndef TANDEM_UTIL_APPEND_FILE_H
#define TANDEM_UTIL_APPEND_FILE_H
#include <stddef.h>

#include "util/error.h"

/* Appends the n bytes of data to path (created 0644 when missing) and fsyncs. Errors name path and
 * the real errno: "cannot append to PATH: No space left on device", "cannot fsync PATH: ...".
 * fault names the fault points (util/fault.h): "<fault>.write" fails the write with EIO;
 * "<fault>.enospc" writes the first half for real and then fails with ENOSPC. */
tdm_status tdm_append_whole(const char *path, const void *data, size_t n, const char *fault,
                            tdm_error *err);

#endif
