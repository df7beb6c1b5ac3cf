/* lease_keeper.c — see lease_keeper.h. */
#include "gpu/lease_keeper.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

struct tdm_lease_keeper {
    tdm_lease *lease;
    pthread_t thread;
    pthread_mutex_t mu; /* guards *lease between the keeper and the main thread */
    int stop_pipe[2];   /* the main thread writes a byte to stop the keeper */
    int watch_fd;       /* inotify watch of the ledger directory, or -1 */
};

/* How often the keeper looks at the renewal clock when nothing else wakes it (ms). */
#define KEEPER_TICK_MS 1000

static void *keeper_main(void *arg)
{
    tdm_lease_keeper *k = arg;
    for (;;) {
        struct pollfd p[2] = {{.fd = k->stop_pipe[0], .events = POLLIN},
                              {.fd = k->watch_fd, .events = POLLIN}};
        int n = poll(p, k->watch_fd >= 0 ? 2 : 1, KEEPER_TICK_MS);
        if (n < 0 && errno != EINTR) break;
        if (p[0].revents) break;
        tdm_error e = {0};
        pthread_mutex_lock(&k->mu);
        if (k->lease->held) {
            bool back = false;
            /* errors are retried at the next wake-up: a ledger being rewritten by another
             * process, a full disk; the reservation is still in use and the ledger's own
             * pruning never drops a live holder */
            if (k->watch_fd >= 0 && n > 0 && (p[1].revents & POLLIN))
                (void)tdm_reservation_watch_handle(k->lease, k->watch_fd, &back, &e);
            if (tdm_reservation_renew_due(k->lease)) (void)tdm_reservation_renew(k->lease, &e);
        }
        pthread_mutex_unlock(&k->mu);
    }
    return NULL;
}

tdm_status tdm_lease_keeper_start(tdm_lease_keeper **out, tdm_lease *lease, tdm_error *err)
{
    *out = NULL;
    tdm_lease_keeper *k = calloc(1, sizeof *k);
    if (!k) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    k->lease = lease;
    k->watch_fd = -1;
    if (pipe2(k->stop_pipe, O_CLOEXEC) != 0) {
        free(k);
        return tdm_fail_errno(err, TDM_ERR_IO, errno, "lease keeper: pipe");
    }
    pthread_mutex_init(&k->mu, NULL);
    k->watch_fd = tdm_reservation_watch_open(lease);
    /* the thread inherits this mask: the CLI's SIGINT/SIGTERM/SIGUSR1 handlers stay on the
     * threads that run the work */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&k->thread, NULL, keeper_main, k);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        if (k->watch_fd >= 0) close(k->watch_fd);
        close(k->stop_pipe[0]);
        close(k->stop_pipe[1]);
        pthread_mutex_destroy(&k->mu);
        free(k);
        return tdm_fail_errno(err, TDM_ERR_IO, rc, "lease keeper: pthread_create");
    }
    *out = k;
    return TDM_OK;
}

tdm_status tdm_lease_keeper_update_actual(tdm_lease_keeper *k, int64_t actual_mb, tdm_error *err)
{
    pthread_mutex_lock(&k->mu);
    tdm_status st = tdm_reservation_update_actual(k->lease, actual_mb, err);
    pthread_mutex_unlock(&k->mu);
    return st;
}

tdm_status tdm_lease_keeper_resize(tdm_lease_keeper *k, int64_t budget_mb, bool wait,
                                   int64_t *ticket, bool *granted, tdm_wait_report *report,
                                   tdm_error *err)
{
    pthread_mutex_lock(&k->mu);
    tdm_status st = tdm_reservation_resize(k->lease, budget_mb, wait, ticket, granted, report, err);
    pthread_mutex_unlock(&k->mu);
    return st;
}

void tdm_lease_keeper_resize_cancel(tdm_lease_keeper *k, int64_t *ticket)
{
    pthread_mutex_lock(&k->mu);
    tdm_reservation_resize_cancel(k->lease, ticket);
    pthread_mutex_unlock(&k->mu);
}

void tdm_lease_keeper_stop(tdm_lease_keeper *k)
{
    if (!k) return;
    char b = 1;
    while (write(k->stop_pipe[1], &b, 1) < 0 && errno == EINTR) {
    }
    pthread_join(k->thread, NULL);
    if (k->watch_fd >= 0) close(k->watch_fd);
    close(k->stop_pipe[0]);
    close(k->stop_pipe[1]);
    pthread_mutex_destroy(&k->mu);
    free(k);
}
