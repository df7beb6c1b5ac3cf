/* transport.h — running commands on a cluster node and moving files to and from it.
 *
 * transport ssh: the system `ssh` with
 *     -o BatchMode=yes -o ConnectTimeout=SEC -o ControlMaster=auto -o ControlPath=DIR/%C
 *     -o ControlPersist=60 [-o StrictHostKeyChecking=accept-new] [-F ssh_config] [-p port]
 *     [-i identity_file] [-l user] -- host COMMAND
 * where COMMAND is the argv joined by tdm_shell_join (every argument single-quoted), DIR is a
 * private (0700, owned by the user) directory: $TANDEM_SSH_CONTROL_DIR, else
 * $XDG_RUNTIME_DIR/tandem-ssh, else /tmp/tandem-ssh-UID. StrictHostKeyChecking=accept-new is
 * added only when the user's ssh configuration leaves it at ssh's default ("ask", which BatchMode
 * turns into a refusal); `ssh -G` tells. Files go with `rsync -a -s` (names sent through the
 * rsync protocol, never through the remote shell) and fall back to `scp -p [-r]` (SFTP).
 * transport local: the argv runs on this machine, files are copied with `cp -a`.
 * A node's env (cluster.yaml) is applied to every command as `env NAME=VALUE ... argv`.
 */
#ifndef TANDEM_CLUSTER_TRANSPORT_H
#define TANDEM_CLUSTER_TRANSPORT_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cluster/cluster_config.h"
#include "cluster/spawn.h"
#include "util/error.h"

#define TDM_TRANSPORT_CONNECT_TIMEOUT_S 10

typedef struct tdm_transport {
    const tdm_cluster_node *node; /* borrowed */
    const char *ssh_config;       /* borrowed; NULL for ssh's own configuration */
    char control_dir[200];
    int connect_timeout_s;
    int accept_new; /* -1 not asked yet, 0 no, 1 add StrictHostKeyChecking=accept-new */
} tdm_transport;

/* Prepares a transport for node (ssh: creates/checks the private control directory). */
tdm_status tdm_transport_init(tdm_transport *t, const tdm_cluster_node *node,
                              const char *ssh_config, tdm_error *err);

/* Runs argv[0..argc) on the node, stdin from stdin_data[0..stdin_len), at most timeout_ms.
 * res holds the remote command's exit code and output; with ssh, exit code 255 means ssh
 * itself failed (tdm_transport_unreachable tells). */
tdm_status tdm_transport_run(tdm_transport *t, const char *const *argv, size_t argc,
                             const char *stdin_data, size_t stdin_len, int64_t timeout_ms,
                             tdm_spawn_result *res, tdm_error *err);

/* True when res says the node could not be reached (ssh exit 255, or ssh missing); then why
 * holds ssh's last stderr line. */
bool tdm_transport_unreachable(const tdm_transport *t, const tdm_spawn_result *res, char *why,
                               size_t why_size);

/* The guard every copy passes before rsync, scp or cp sees a remote path: remote_path must be
 * absolute, hold no ".." component, and lie strictly inside the node's workdir (compared
 * component by component after dropping empty and "." components, so /w2 is not inside /w and
 * the workdir itself is refused). A node whose workdir is "/" allows no copy. Otherwise
 * TDM_ERR_INVALID naming the node, the path and the rule. An empty or relative path would mean
 * the remote login's home directory to rsync and scp ("host:" is the whole home), which is why
 * the transport refuses it itself instead of trusting its callers. */
tdm_status tdm_transport_check_remote_path(const tdm_cluster_node *node, const char *remote_path,
                                           tdm_error *err);

/* Copies a local file or directory to remote_path on the node (a directory's content lands in
 * remote_path, created with its parents). Names travel byte-exact. */
tdm_status tdm_transport_push(tdm_transport *t, const char *local_path, const char *remote_path,
                              tdm_error *err);

/* Copies a file or directory remote_path from the node to local_path (which must not exist for
 * a directory; its parent must). Both push and pull refuse a remote_path that
 * tdm_transport_check_remote_path refuses, before anything runs. */
tdm_status tdm_transport_pull(tdm_transport *t, const char *remote_path, const char *local_path,
                              tdm_error *err);

/* "user@host:port" / "local" for messages. */
void tdm_transport_describe(const tdm_transport *t, char *buf, size_t size);

#endif
