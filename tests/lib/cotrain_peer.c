/* cotrain_peer — a stand-alone co-training host or joiner for tests/integration/cotrain_peers.sh,
 * until `tandem finetune` speaks the protocol itself. Built with the tests, not installed.
 *
 *   cotrain_peer host  DIR MODEL_DIR [--device D] [--method qlora|lora] [--hold]
 *       elects (tdm_cotrain_elect); when it becomes the host prints "host PID" and serves until
 *       SIGTERM/SIGINT (clean stop: files removed): every join is admitted, and unless --hold each
 *       adapter gets one progress and a done, then the connection is closed; every refusal is
 *       printed as "refused: REASON". When a host already exists prints "exists PID", exits 3.
 *   cotrain_peer join  DIR MODEL_DIR [--device D] [--method qlora|lora] [--socket PATH]
 *       finds the host (or, with --socket, connects to PATH without discovery, as someone who
 *       cannot list DIR but guesses a host's socket would), joins with one adapter and prints
 *       every message it gets ("admitted N", "progress A STEP", "done A OUTCOME", "rejected
 *       STATUS: MESSAGE"), and "gone eof|silence REALTIME_NS" when the host dies (the
 *       CLOCK_REALTIME nanoseconds at which it noticed). Exit 0: every adapter finished; 3: no host
 * ("no host: WHY"); 10: rejected; 11: the host died; 12: the socket refused the connection; 1:
 * error. cotrain_peer list  DIR discovery (removing stale files): one "PID IDENTITY" line per live
 * host.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cotrain/base_identity.h"
#include "cotrain/client.h"
#include "cotrain/endpoint.h"
#include "cotrain/host.h"
#include "cotrain/protocol.h"
#include "gpu/proc_identity.h"
#include "train/adapters_config.h"
#include "util/timeutil.h"

static volatile sig_atomic_t g_stop;
static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

static int usage(void)
{
    fprintf(stderr, "usage: cotrain_peer host|join DIR MODEL_DIR [--device D] [--method M] "
                    "[--hold] | list DIR\n");
    return 2;
}

static int run_host(const char *dir, const char *model, const tdm_base_identity *base, bool hold)
{
    tdm_cotrain_host *h;
    tdm_cotrain_advert found;
    tdm_error err = {0};
    if (tdm_cotrain_elect(dir, base, model, &h, &found, NULL, &err) != TDM_OK) {
        fprintf(stderr, "cotrain_peer: %s\n", err.message);
        return 1;
    }
    if (!h) {
        printf("exists %d\n", (int)found.pid);
        return 3;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    printf("host %d\n", (int)getpid());
    fflush(stdout);
    for (int64_t step = 1; !g_stop; step++) {
        tdm_cotrain_request rq;
        while (tdm_cotrain_host_take(h, &rq)) {
            if (rq.kind == TDM_COTRAIN_REQ_REFUSED) {
                printf("refused: %s\n", rq.reason);
            } else if (rq.kind == TDM_COTRAIN_REQ_JOIN) {
                printf("joined pid %d user %s adapters %d\n", (int)rq.peer.pid, rq.peer.user,
                       rq.msg.u.join.n_adapters);
                tdm_cotrain_msg m = {.type = TDM_COTRAIN_ADMITTED};
                m.u.admitted.host_pid = (int32_t)getpid();
                m.u.admitted.n_adapters = rq.msg.u.join.n_adapters;
                tdm_cotrain_host_send(h, rq.conn, &m, &err);
                for (int a = 0; !hold && a < rq.msg.u.join.n_adapters; a++) {
                    tdm_cotrain_msg p = {.type = TDM_COTRAIN_PROGRESS};
                    p.u.progress = (tdm_cotrain_progress_msg){.adapter = a,
                                                              .event = TDM_TRAINER_EVENT_STEP,
                                                              .global_step = step,
                                                              .step = 1,
                                                              .total_steps = 1,
                                                              .epoch = 1,
                                                              .epochs = 1,
                                                              .loss = 2.0,
                                                              .learning_rate = 1e-4,
                                                              .grad_norm = 1,
                                                              .val_loss = 1.5,
                                                              .tokens_per_sec = 10,
                                                              .eta_sec = 0};
                    tdm_cotrain_host_send(h, rq.conn, &p, &err);
                    tdm_cotrain_msg d = {.type = TDM_COTRAIN_DONE};
                    d.u.done.adapter = a;
                    d.u.done.outcome = TDM_COTRAIN_FINISHED;
                    d.u.done.step = 1;
                    tdm_cotrain_host_send(h, rq.conn, &d, &err);
                }
                if (!hold) tdm_cotrain_host_close(h, rq.conn);
            } else if (rq.kind == TDM_COTRAIN_REQ_GONE) {
                printf("gone pid %d\n", (int)rq.peer.pid);
            }
            fflush(stdout);
            tdm_cotrain_request_free(&rq);
        }
        tdm_cotrain_host_set_step(h, step);
        tdm_sleep_ms(10); /* a "training step" */
    }
    tdm_cotrain_host_stop(h);
    printf("stopped\n");
    return 0;
}

static int run_join(const char *dir, const tdm_base_identity *base, const char *socket)
{
    tdm_cotrain_advert ad;
    tdm_error err = {0};
    const char *why = "";
    tdm_status st = TDM_OK;
    if (socket)
        snprintf(ad.socket_path, sizeof ad.socket_path, "%s", socket);
    else
        st = tdm_cotrain_find_host(dir, base, &ad, &why, &err);
    if (st == TDM_ERR_NOT_FOUND) {
        printf("no host: %s\n", *why ? why : "none");
        return 3;
    }
    if (st != TDM_OK) {
        fprintf(stderr, "cotrain_peer: %s\n", err.message);
        return 1;
    }
    tdm_cotrain_client c;
    if (tdm_cotrain_client_connect(&c, ad.socket_path, &err) != TDM_OK) {
        printf("connect: %s\n", err.message);
        return 12;
    }
    char cwd[2048];
    if (!getcwd(cwd, sizeof cwd)) return 1;
    char data[2200], out[2200];
    snprintf(data, sizeof data, "%s/data.jsonl", cwd);
    snprintf(out, sizeof out, "%s/out-%d", cwd, (int)getpid());
    tdm_cotrain_adapter a = {.data = data,
                             .output = out,
                             .rank = 8,
                             .alpha = 16,
                             .targets = TDM_ADAPTER_TARGET_Q_PROJ | TDM_ADAPTER_TARGET_V_PROJ,
                             .lr = 2e-4,
                             .epochs = 1,
                             .batch_size = 4,
                             .max_seq_len = 256,
                             .weight = 1};
    tdm_cotrain_msg j = {.type = TDM_COTRAIN_JOIN};
    j.u.join.pid = (int32_t)getpid();
    j.u.join.uid = (uint32_t)geteuid();
    j.u.join.user = (char *)tdm_user_name();
    j.u.join.identity = (char *)base->id;
    j.u.join.opts.task = (char *)"instruct";
    j.u.join.opts.grad_accum = 1;
    j.u.join.opts.log_every = 10;
    j.u.join.opts.seed = 42;
    j.u.join.adapters = &a;
    j.u.join.n_adapters = 1;
    tdm_status sent = tdm_cotrain_client_send(&c, &j, &err);
    int done = 0, code = 1;
    for (;;) {
        tdm_cotrain_msg m;
        st = tdm_cotrain_client_next(&c, 60000, &m, &err);
        if (st == TDM_ERR_IO && c.host_gone) {
            printf("gone %s %lld\n", c.eof ? "eof" : "silence", (long long)tdm_now_real_ns());
            code = sent == TDM_OK ? 11 : 12;
            break;
        }
        if (st != TDM_OK) {
            printf("error: %s\n", err.message);
            break;
        }
        if (m.type == TDM_COTRAIN_ADMITTED) {
            printf("admitted %d\n", m.u.admitted.n_adapters);
        } else if (m.type == TDM_COTRAIN_REJECTED) {
            printf("rejected %s: %s\n", tdm_cotrain_status_name(m.u.rejected.status),
                   m.u.rejected.message);
            code = 10;
        } else if (m.type == TDM_COTRAIN_PROGRESS) {
            printf("progress %d %lld\n", m.u.progress.adapter, (long long)m.u.progress.step);
        } else if (m.type == TDM_COTRAIN_DONE) {
            printf("done %d %s\n", m.u.done.adapter, tdm_cotrain_outcome_name(m.u.done.outcome));
            if (m.u.done.outcome == TDM_COTRAIN_FINISHED) done++;
        }
        fflush(stdout);
        bool end = m.type == TDM_COTRAIN_REJECTED || done == j.u.join.n_adapters;
        tdm_cotrain_msg_free(&m);
        if (end) {
            if (code != 10) code = 0;
            break;
        }
    }
    tdm_cotrain_client_close(&c);
    return code;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 3 && strcmp(argv[1], "list") == 0) {
        tdm_cotrain_advert *hosts;
        size_t n;
        tdm_error err = {0};
        if (tdm_cotrain_discover(argv[2], &hosts, &n, &err) != TDM_OK) {
            fprintf(stderr, "cotrain_peer: %s\n", err.message);
            return 1;
        }
        for (size_t i = 0; i < n; i++)
            printf("%d %s\n", (int)hosts[i].pid, hosts[i].base.id);
        free(hosts);
        return 0;
    }
    if (argc < 4) return usage();
    const char *device = "GPU-sim-0", *method = "qlora", *socket = NULL;
    bool hold = false;
    for (int i = 4; i < argc; i++) {
        if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
            device = argv[++i];
        else if (strcmp(argv[i], "--method") == 0 && i + 1 < argc)
            method = argv[++i];
        else if (strcmp(argv[i], "--socket") == 0 && i + 1 < argc)
            socket = argv[++i];
        else if (strcmp(argv[i], "--hold") == 0)
            hold = true;
        else
            return usage();
    }
    tdm_base_identity base;
    tdm_error err = {0};
    if (tdm_base_identity_compute(argv[3], strcmp(method, "qlora") == 0, true, "f32", device, &base,
                                  &err) != TDM_OK) {
        fprintf(stderr, "cotrain_peer: %s\n", err.message);
        return 1;
    }
    if (strcmp(argv[1], "host") == 0) return run_host(argv[2], argv[3], &base, hold);
    if (strcmp(argv[1], "join") == 0) return run_join(argv[2], &base, socket);
    return usage();
}
