/* endpoint.h — where co-training hosts listen, how joiners find them, and who may connect.
 *
 * Files, in the ledger directory ($TANDEM_LEDGER_DIR or ${XDG_CACHE_HOME:-~/.cache}/tandem/):
 *   cotrain-<pid>.sock   the host's Unix stream socket (one per host process)
 *   cotrain-<pid>.json   its advertisement, written atomically after the socket listens and
 *                        removed before it closes:
 *       {"v":1, "pid":123, "start_time":456789, "uid":1000, "user":"ana",
 *        "socket":"cotrain-123.sock", "started_at":1764680000, "model_dir":"/models/qwen",
 *        "base":{"id":"sha256:…", "model":"sha256:…", "method":"qlora", "double_quant":false,
 *                "compute_dtype":"bf16", "device":"GPU-…"}}
 *       start_time is /proc/PID/stat field 22 (gpu/proc_identity.h): a recycled pid does not
 *       pass for the host. model_dir is for display only; matching uses base.id. From the
 *       first step boundary on, the host rewrites it with a "status" field: its live state
 *       (cotrain/status.h), which readers of this version of the advertisement ignore.
 * Modes: 0660 for the socket and 0640 for the advertisement when the ledger directory is
 * group-writable (an administrator shared it with a group), 0600 for both otherwise.
 * Who may connect (SO_PEERCRED, checked by the host on every accepted connection): the host's
 * own uid; or, when the directory is group-writable, a process whose primary group or one of
 * whose supplementary groups (/proc/PID/status "Groups:") is the directory's group.
 * Discovery removes the files of hosts that are dead or whose pid was recycled.
 */
#ifndef TANDEM_COTRAIN_ENDPOINT_H
#define TANDEM_COTRAIN_ENDPOINT_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include <sys/types.h>

#include "cotrain/base_identity.h"
#include "util/error.h"

#define TDM_COTRAIN_SOCKET_PATH_MAX 108 /* sizeof sockaddr_un.sun_path */

typedef struct tdm_cotrain_advert {
    int32_t pid;
    uint64_t start_time; /* /proc/PID/stat field 22 */
    uint32_t uid;
    char user[64];
    int64_t started_at;                            /* Unix seconds */
    char socket_path[TDM_COTRAIN_SOCKET_PATH_MAX]; /* absolute or as the directory was given */
    char model_dir[4096];                          /* display only */
    tdm_base_identity base;
} tdm_cotrain_advert;

/* The ledger directory (created 0700 when missing, refused when a symbolic link), into buf.
 * dir NULL: the default location. */
tdm_status tdm_cotrain_dir(const char *dir, char *buf, size_t size, tdm_error *err);

/* True when the directory is group-writable: sockets 0660, group members may join. */
bool tdm_cotrain_dir_shared(const char *dir);

/* Creates, binds and listens on dir/cotrain-<own pid>.sock (removing a leftover file of that
 * name: its owner was an earlier process with our pid, so it is dead), then writes the
 * advertisement of base and model_dir. *fd is the listening socket (non-blocking, close-on-exec);
 * *advert what was advertised. TDM_ERR_INVALID when the path does not fit a socket address
 * (say so, and to choose a shorter TANDEM_LEDGER_DIR), TDM_ERR_IO otherwise. */
tdm_status tdm_cotrain_listen(const char *dir, const tdm_base_identity *base, const char *model_dir,
                              int *fd, tdm_cotrain_advert *advert, tdm_error *err);

/* Writes (or rewrites, atomically) the advertisement of a in dir, with the host's live status
 * (cotrain/status.h) as its "status" field when status is not NULL. Mode 0640 in a
 * group-writable directory, 0600 otherwise. */
tdm_status tdm_cotrain_advertise(const char *dir, const tdm_cotrain_advert *a, const json_t *status,
                                 tdm_error *err);

/* dir/cotrain-<pid>.json into buf; -1 when it does not fit. */
int tdm_cotrain_advert_path(char *buf, size_t size, const char *dir, int32_t pid);

/* Removes the advertisement, then the socket file, of host pid (own files at exit). */
void tdm_cotrain_unadvertise(const char *dir, int32_t pid);

/* Every live host advertised in dir other than this process, oldest first (start_time, then
 * pid), into a malloc'd *hosts (free()). Removes the files of dead or recycled hosts, and sockets
 * without an advertisement whose pid is dead. Unreadable advertisements of live pids are skipped
 * (another user's 0600 file). */
tdm_status tdm_cotrain_discover(const char *dir, tdm_cotrain_advert **hosts, size_t *n,
                                tdm_error *err);

/* The oldest live host whose base.id equals want->id, into *out. TDM_ERR_NOT_FOUND when there is
 * none; then *why (when not NULL) says, for the nearest host, which part differed
 * ("device", "method", ...) or "" when there was no host at all. Picking the oldest makes every
 * joiner of a dead host choose the same new host. */
tdm_status tdm_cotrain_find_host(const char *dir, const tdm_base_identity *want,
                                 tdm_cotrain_advert *out, const char **why, tdm_error *err);

/* Who is on the other end of a connected Unix socket. */
typedef struct tdm_cotrain_peer {
    int32_t pid;
    uint32_t uid, gid;
    char user[64];
} tdm_cotrain_peer;

/* Reads SO_PEERCRED of fd into *peer and decides whether that peer may use a host advertised in
 * dir: TDM_OK, or TDM_ERR_INVALID with a message naming the peer's user and the rule. */
tdm_status tdm_cotrain_peer_check(int fd, const char *dir, tdm_cotrain_peer *peer, tdm_error *err);

/* Connects to a host's socket (blocking connect, then non-blocking, close-on-exec). */
tdm_status tdm_cotrain_connect(const char *socket_path, int *fd, tdm_error *err);

#endif
