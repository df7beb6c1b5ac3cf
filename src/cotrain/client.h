/* client.h — the joiner's end of a co-training connection.
 *
 * A joiner does nothing but wait on its host, so the client is single-threaded and blocking with
 * timeouts:
 *
 *     tdm_cotrain_client c;
 *     tdm_cotrain_client_connect(&c, advert.socket_path, &err);
 *     tdm_cotrain_client_send(&c, &join_msg, &err);
 *     for (;;) {
 *         tdm_cotrain_msg m;
 *         st = tdm_cotrain_client_next(&c, 200, &m, &err);
 *         if (st == TDM_ERR_TIMEOUT) { if (interrupted) send detach; continue; }
 *         if (st != TDM_OK) break;              // c.host_gone: the host died or froze
 *         ... admitted / waiting / progress / done / rejected ...
 *         tdm_cotrain_msg_free(&m);
 *     }
 *     tdm_cotrain_client_close(&c);
 *
 * Host death is noticed by EOF on the socket (kill -9, crash: at once) or by
 * TDM_COTRAIN_HOST_SILENCE_MS without any byte (a frozen or stopped host; heartbeats come every
 * TDM_COTRAIN_HEARTBEAT_MS).
 */
#ifndef TANDEM_COTRAIN_CLIENT_H
#define TANDEM_COTRAIN_CLIENT_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cotrain/protocol.h"
#include "util/error.h"

typedef struct tdm_cotrain_client {
    int fd;
    char *in; /* received bytes not yet returned as messages */
    size_t in_len, in_cap;
    int64_t last_rx_ns; /* monotonic time of the last byte from the host */
    bool host_gone;     /* EOF, a socket error or silence: the host is dead or frozen */
    bool eof;           /* the host closed the connection (as opposed to going silent) */
} tdm_cotrain_client;

tdm_status tdm_cotrain_client_connect(tdm_cotrain_client *c, const char *socket_path,
                                      tdm_error *err);

/* Sends one message, waiting at most 5 s for the socket to take it. TDM_ERR_IO when the host
 * closed the connection: call tdm_cotrain_client_next to read why (a refused peer is answered
 * "rejected" before the host closes). */
tdm_status tdm_cotrain_client_send(tdm_cotrain_client *c, const tdm_cotrain_msg *msg,
                                   tdm_error *err);

/* Waits at most timeout_ms for the next message other than a heartbeat (heartbeats only prove
 * the host alive). TDM_OK with *msg filled (free it); TDM_ERR_TIMEOUT when none came in time
 * (also when a signal interrupted the wait: the caller checks its flags); TDM_ERR_IO with
 * c->host_gone when the host closed the connection or was silent for
 * TDM_COTRAIN_HOST_SILENCE_MS; the parse statuses when the host sent something invalid. */
tdm_status tdm_cotrain_client_next(tdm_cotrain_client *c, int timeout_ms, tdm_cotrain_msg *msg,
                                   tdm_error *err);

/* After a silence (c->host_gone, not c->eof) from a host whose process still exists (stopped
 * with SIGSTOP or Ctrl-Z, or frozen): keep the connection and wait on, counting the silence from
 * now. Nothing happens after EOF. */
void tdm_cotrain_client_keep_waiting(tdm_cotrain_client *c);

void tdm_cotrain_client_close(tdm_cotrain_client *c);

#endif
