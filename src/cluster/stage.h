/* stage.h — putting the model and the data on a node, copying only what differs.
 *
 * Files are compared by SHA-256 (coreutils `sha256sum`, here and on the node). Layout on the node:
 *     WORKDIR/models/<model dir name>-<12 hex of the SHA-256 of the model's manifest>/...
 *     WORKDIR/data/<12 hex of the file's SHA-256>/<file name>
 * The manifest is the sorted "SHA256  RELATIVE-PATH" lines of the model directory's regular
 * files (hidden ones skipped), so a changed model gets a new directory and a running job never
 * sees its files change.
 */
#ifndef TANDEM_CLUSTER_STAGE_H
#define TANDEM_CLUSTER_STAGE_H
#include <stddef.h>
#include <stdint.h>

#include "cluster/transport.h"
#include "util/error.h"

typedef struct tdm_stage_stats {
    size_t copied, present; /* files */
    int64_t copied_bytes;
} tdm_stage_stats;

/* SHA-256 (64 hex + NUL) of paths[0..n) on the node (t) or here (t NULL); "" for a file that is
 * missing or unreadable. */
tdm_status tdm_stage_hashes(tdm_transport *t, const char *const *paths, size_t n,
                            char (*hex)[65], tdm_error *err);

/* Copies the model directory to the node unless an identical copy is there; *remote_dir gets
 * its path on the node (malloc'd). */
tdm_status tdm_stage_model(tdm_transport *t, const char *model_dir, char **remote_dir,
                           tdm_stage_stats *stats, tdm_error *err);

/* The same for one data file; *remote_path gets its path on the node (malloc'd). */
tdm_status tdm_stage_file(tdm_transport *t, const char *path, char **remote_path,
                          tdm_stage_stats *stats, tdm_error *err);

#endif
