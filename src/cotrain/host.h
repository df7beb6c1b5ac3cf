/* host.h — the co-training host's server: listens, admits connections, queues joiners' requests
 * for the trainer and carries its replies and progress back.
 *
 * One service thread owns every socket. Why a thread rather than a poll(2) with timeout 0 at each
 * step boundary: a fused step of a 7B model takes seconds, and a joiner must tell a live host
 * from a dead or frozen one within a second. Served only at step boundaries, heartbeats would
 * stop for a whole step and a connecting joiner would hang unanswered for as long. The thread
 * never touches training state: it accepts, checks SO_PEERCRED, parses, refuses what it can
 * refuse alone (wrong base identity, hostile input, a pid/uid that is not the peer's), sends a
 * heartbeat every TDM_COTRAIN_HEARTBEAT_MS, and queues the rest. The trainer takes requests with
 * tdm_cotrain_host_take (non-blocking) at its step boundaries and answers with
 * tdm_cotrain_host_send; both only lock a mutex for a queue operation.
 *
 *     tdm_cotrain_host *h;
 *     tdm_cotrain_host_start(&h, dir, &base, model_dir, &err);
 *     ... at every step boundary:
 *     tdm_cotrain_request rq;
 *     while (tdm_cotrain_host_take(h, &rq)) { ...; tdm_cotrain_request_free(&rq); }
 *     tdm_cotrain_host_send(h, conn, &progress_msg, &err);
 *     ...
 *     tdm_cotrain_host_stop(h);   // unadvertises, flushes (bounded), closes, joins the thread
 *
 * Limits that keep a hostile or stuck peer from hurting the host: at most
 * TDM_COTRAIN_MAX_CONNECTIONS connections; a connection that has not sent a join within
 * TDM_COTRAIN_JOIN_TIMEOUT_MS is closed; more than TDM_COTRAIN_OUTBOX_MAX unsent bytes to one
 * joiner (it stopped reading) close its connection; a line over TDM_COTRAIN_MSG_MAX, invalid
 * JSON or a message a joiner may not send gets "rejected" and the connection is closed.
 */
#ifndef TANDEM_COTRAIN_HOST_H
#define TANDEM_COTRAIN_HOST_H
#include <stdbool.h>
#include <stdint.h>

#include "cotrain/base_identity.h"
#include "cotrain/endpoint.h"
#include "cotrain/protocol.h"
#include "util/error.h"

#define TDM_COTRAIN_HEARTBEAT_MS 250     /* host -> joiner, while the connection is open */
#define TDM_COTRAIN_HOST_SILENCE_MS 1000 /* a joiner declares the host dead after this silence */
#define TDM_COTRAIN_MAX_CONNECTIONS 64
#define TDM_COTRAIN_JOIN_TIMEOUT_MS 10000
#define TDM_COTRAIN_OUTBOX_MAX (8u << 20)

typedef enum tdm_cotrain_request_kind {
    TDM_COTRAIN_REQ_JOIN,    /* msg.u.join is a join with our base identity from an allowed peer */
    TDM_COTRAIN_REQ_DETACH,  /* the joiner asks for its adapters back (Ctrl-C); once per
                                connection, repeats are dropped */
    TDM_COTRAIN_REQ_GONE,    /* the joiner's connection ended (exit, kill): its adapters have
                                nobody watching; checkpoint and remove them */
    TDM_COTRAIN_REQ_REFUSED, /* a connection was refused by the service thread; reason says why
                                (for the host's log; the peer was already answered) */
} tdm_cotrain_request_kind;

typedef struct tdm_cotrain_request {
    tdm_cotrain_request_kind kind;
    uint64_t conn; /* connection id for tdm_cotrain_host_send / _close (never reused) */
    tdm_cotrain_peer peer;
    tdm_cotrain_msg msg; /* JOIN: the join (owned); zeroed otherwise */
    char reason[1024];   /* REFUSED */
} tdm_cotrain_request;

typedef struct tdm_cotrain_host tdm_cotrain_host;

/* Listens in dir (tdm_cotrain_listen), advertises base and starts the service thread. */
tdm_status tdm_cotrain_host_start(tdm_cotrain_host **out, const char *dir,
                                  const tdm_base_identity *base, const char *model_dir,
                                  tdm_error *err);

/* Host election, for a job that wants to share a device (a new finetune, or a joiner whose host
 * died). Under an exclusive flock(2) of dir/cotrain.lock (waiting at most 10 s for it): when a
 * live host with base's identity is advertised, *found receives the oldest one and *out is NULL;
 * otherwise this process becomes a host (tdm_cotrain_host_start) before the lock is released, and
 * *out is it. Two processes electing at once therefore never both become hosts. *why (may be
 * NULL) is tdm_cotrain_find_host's "nearest mismatch" when this process became the host. */
tdm_status tdm_cotrain_elect(const char *dir, const tdm_base_identity *base, const char *model_dir,
                             tdm_cotrain_host **out, tdm_cotrain_advert *found, const char **why,
                             tdm_error *err);

/* Takes the oldest queued request into *rq (the caller frees it with
 * tdm_cotrain_request_free); false when there is none. Never blocks on the network. */
bool tdm_cotrain_host_take(tdm_cotrain_host *h, tdm_cotrain_request *rq);
void tdm_cotrain_request_free(tdm_cotrain_request *rq);

/* Queues msg for connection conn. TDM_ERR_NOT_FOUND when conn is closed (the joiner left). */
tdm_status tdm_cotrain_host_send(tdm_cotrain_host *h, uint64_t conn, const tdm_cotrain_msg *msg,
                                 tdm_error *err);

/* Closes conn once what is queued for it is sent (at most 1 s later). */
void tdm_cotrain_host_close(tdm_cotrain_host *h, uint64_t conn);

/* The global step the heartbeats report. */
void tdm_cotrain_host_set_step(tdm_cotrain_host *h, int64_t global_step);

/* What was advertised (socket path, pid, identity). */
const tdm_cotrain_advert *tdm_cotrain_host_advert(const tdm_cotrain_host *h);

/* Rewrites the advertisement atomically with status (cotrain/status.h) as its "status" field:
 * the host's live state for `gpu status`. Call from the thread that trains (never concurrently
 * with itself), only between tdm_cotrain_host_start and tdm_cotrain_host_stop. */
tdm_status tdm_cotrain_host_publish(tdm_cotrain_host *h, const json_t *status, tdm_error *err);

/* Removes the advertisement (no new joiner finds this host), sends what is queued (for at most
 * 1 s), closes every connection, stops the thread, removes the socket and frees h. NULL allowed.
 */
void tdm_cotrain_host_stop(tdm_cotrain_host *h);

#endif
