/* atomic_dir.h — create or replace a whole directory so that readers see either the old one or
 * the complete new one under its name, never a half-written one (checkpoints, best/, adapters).
 *
 * Calling sequence:
 *     char tmp[PATH_MAX];
 *     tdm_atomic_dir_begin("/out/checkpoint-40", tmp, sizeof tmp, &err);  // makes
 * "/out/.checkpoint-40.tmp-PID"
 *     ... write files into tmp (each written and fsynced, e.g. with tdm_atomic_write) ...
 *     tdm_atomic_dir_commit(tmp, "/out/checkpoint-40", &err);  // or tdm_atomic_dir_abort(tmp)
 *
 * commit fsyncs the temporary directory, then renames it to the final name. When the final name
 * already exists, the two are swapped in one step (renameat2 RENAME_EXCHANGE) and the old content,
 * now under the temporary name, is removed; a crash in between leaves the new directory in place
 * and a stale ".NAME.tmp-PID" that tdm_atomic_dir_remove_stale deletes. Then the parent directory
 * is fsynced. On failure the temporary directory is removed and the final name keeps what it had.
 *
 * Names starting with '.' and containing ".tmp-" or ".del-" are this module's scratch names;
 * listing code must ignore them.
 *
 * Fault points (util/fault.h): atomic_dir.mkdir, atomic_dir.fsync, atomic_dir.rename.
 */
#ifndef TANDEM_UTIL_ATOMIC_DIR_H
#define TANDEM_UTIL_ATOMIC_DIR_H
#include <stdbool.h>
#include <stddef.h>

#include "util/error.h"

/* Creates the temporary sibling of final_path (mode 0755) and writes its path into tmp (cap
 * bytes). A leftover directory of the same name (an earlier crash of a process with our pid) is
 * removed first. */
tdm_status tdm_atomic_dir_begin(const char *final_path, char *tmp, size_t cap, tdm_error *err);

/* fsync tmp, move it to final_path (swapping with an existing one), remove the old content,
 * fsync the parent. Removes tmp on failure. */
tdm_status tdm_atomic_dir_commit(const char *tmp, const char *final_path, tdm_error *err);

/* Removes tmp and everything under it (best effort). NULL or "" is fine. */
void tdm_atomic_dir_abort(const char *tmp);

/* Removes the directory tree at path (no symlinks followed): first renames it to a scratch
 * ".NAME.del-PID" sibling so that it vanishes from its name in one step, then deletes. */
tdm_status tdm_remove_tree(const char *path, tdm_error *err);

/* Deletes scratch entries (".*.tmp-*", ".*.del-*") left in dir by crashed writers. Returns the
 * number removed in *n_removed (optional). Entries of live processes of this host are left
 * alone when their pid still exists. */
tdm_status tdm_atomic_dir_remove_stale(const char *dir, int *n_removed, tdm_error *err);

/* fsync of a regular file by path. */
tdm_status tdm_fsync_path(const char *path, tdm_error *err);

#endif
