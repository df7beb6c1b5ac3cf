/* path_identity.h — whether two paths name the same place, for refusing two outputs that are
 * one directory (`--adapter a.jsonl:out/a --adapter b.jsonl:./out/a/`).
 *
 *     char ka[TDM_PATH_IDENTITY_MAX], kb[TDM_PATH_IDENTITY_MAX];
 *     tdm_path_identity("", "out/a", ka, sizeof ka, &err);
 *     tdm_path_identity("", "./out/a/", kb, sizeof kb, &err);
 *     strcmp(ka, kb) == 0   // the same directory
 */
#ifndef TANDEM_UTIL_PATH_IDENTITY_H
#define TANDEM_UTIL_PATH_IDENTITY_H
#include <stdbool.h>
#include <stddef.h>

#include "util/error.h"

#define TDM_PATH_IDENTITY_MAX 4200

/* Writes to key (cap bytes) a string that is equal for two paths exactly when they name the same
 * file or directory: "@DEV:INO" when path exists (so symbolic links, bind mounts, "." and ".."
 * are resolved by the kernel), else "/" + the absolute path whose longest existing prefix is
 * resolved by realpath(3) and whose remaining (non-existing) components are normalized
 * lexically ("." and empty components dropped, ".." removes the previous component, as mkdir -p
 * would create them). A relative path is taken relative to base_dir (NULL or "" = the working
 * directory; a relative base_dir is itself relative to the working directory). */
tdm_status tdm_path_identity(const char *base_dir, const char *path, char *key, size_t cap,
                             tdm_error *err);

/* The absolute path `path` leads to (base_dir as above): its longest existing prefix resolved
 * by realpath(3) (symbolic links, "." and ".."), the rest normalized lexically. Two resolved
 * paths can be compared for nesting with tdm_path_within; cap >= TDM_PATH_IDENTITY_MAX. */
tdm_status tdm_path_resolve(const char *base_dir, const char *path, char *out, size_t cap,
                            tdm_error *err);

/* Whether the resolved path inner lies strictly inside the resolved directory outer
 * ("/a/b/c" within "/a/b"; not "/a/bc", not "/a/b" itself). */
bool tdm_path_within(const char *inner, const char *outer);

#endif
