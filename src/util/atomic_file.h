/* atomic_file.h — replace a file so that readers see either the old or the new content, never a
 * torn one, and a crash at any point loses nothing that was already durable (the redis rdbSave
 * recipe): write "<dir>/.<name>.tmp-<pid>" with the requested mode, fsync it, close it, rename it
 * over the target, fsync the directory. On any failure the temp file is unlinked and the target is
 * untouched.
 *
 * The temp file is created with O_CREAT|O_EXCL|O_NOFOLLOW, so nothing planted at its name (a hard
 * or symbolic link to another file) is ever truncated or written through. A file already at the
 * name is removed first only when it is a leftover of this process id: a regular file we own with
 * a single link; anything else makes the write fail (TDM_ERR_IO naming the temp path). Two threads
 * of one process must not write the same path at once (they would share the temp name).
 *
 * Fault points (util/fault.h): atomic_write.open, atomic_write.write, atomic_write.fsync,
 * atomic_write.rename, atomic_write.dirsync.
 */
#ifndef TANDEM_UTIL_ATOMIC_FILE_H
#define TANDEM_UTIL_ATOMIC_FILE_H
#include <stddef.h>
#include <sys/types.h>

#include "util/error.h"

tdm_status tdm_atomic_write(const char *path, const void *data, size_t len, mode_t mode,
                            tdm_error *err);

/* Creates the temp file tmp for writing (O_CREAT|O_EXCL|O_NOFOLLOW, mode before the umask), the way
 * tdm_atomic_write does: a file already at tmp is removed first only when it is a leftover of ours
 * (a regular file we own with one link); anything else (a planted hard or symbolic link, another
 * user's file) stays and the call fails (TDM_ERR_IO naming tmp). For writers that stream their
 * temp file instead of writing one buffer (safetensors). */
tdm_status tdm_create_temp_exclusive(const char *tmp, mode_t mode, int *fd, tdm_error *err);

/* Reads a whole file into a NUL-terminated malloc'd buffer (len excludes the NUL). Only a regular
 * file is read: a FIFO, device or directory is refused at once (util/regular_file.h). */
tdm_status tdm_read_file(const char *path, char **out, size_t *len, tdm_error *err);

/* fsync of the directory holding path (or of path itself when it is a directory). */
tdm_status tdm_fsync_dir(const char *dir, tdm_error *err);

#endif
