/* finetune_gpus.c — `tandem finetune --gpus all|N|UUID,UUID` (docs/finetune.md, "Several GPUs"):
 * the parent that spreads a run's adapters over the GPUs of this host and supervises one child
 * `tandem finetune` per GPU.
 *
 *   plan      run/gpus_run.h: the GPUs, each adapter's estimated tokens, the LPT split checked
 *             with the memory plan; printed (one line per GPU, one per adapter);
 *   children  the same command line plus `--device cuda --adapter-subset I,J` (hidden: a child
 *             trains those adapters and ignores --gpus), with CUDA_VISIBLE_DEVICES=<its GPU's
 *             UUID>: each is a normal finetune (its own ledger reservation, its own co-training
 *             host or join on its GPU, its own checkpoints);
 *   display   every line a child prints, prefixed "[gpu N] " (N: the GPU's index), on the
 *             stream it was printed on;
 *   signals   SIGINT, SIGTERM and SIGUSR1 are forwarded to every child (each stops gracefully,
 *             docs/finetune.md "Stopping"); the parent itself waits for them; a parent that
 *             dies (SIGKILL) has its children sent SIGTERM (PR_SET_PDEATHSIG, set by the child);
 *   exit      the worst child status: killed by a signal (128 + N) > failed (its code) > timed
 *             out waiting for memory (75) > stopped by a signal (130, 143) > 0; a failed child
 *             does not stop the others.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "run/gpus_run.h"

extern char **environ;

#define MAX_CHILDREN 64

static pid_t child_pid[MAX_CHILDREN]; /* 0: none or reaped */
static int n_child_pids;
static volatile sig_atomic_t got_signal;

static void forward_signal(int sig)
{
    int saved = errno;
    if (sig != SIGUSR1 || !got_signal) got_signal = sig;
    for (int i = 0; i < n_child_pids; i++)
        if (child_pid[i] > 0) kill(child_pid[i], sig);
    errno = saved;
}

typedef struct child {
    int gpu; /* index into plan->gpus */
    char subset[1024];
    pid_t pid;
    int fd[2];    /* stdout, stderr pipes (read ends); -1 closed */
    char *buf[2]; /* a partial line of each */
    size_t len[2];
    bool reaped;
    int code; /* exit code, 128 + N when killed by signal N */
    bool signaled;
} child;

#define LINE_MAX_BYTES 65536

/* Writes the complete lines of c's stream s, prefixed; with flush_all the rest too. */
static void emit(child *c, int s, const tdm_gpus_plan *p, bool flush_all)
{
    FILE *out = s ? stderr : stdout;
    char *b = c->buf[s];
    size_t start = 0;
    for (size_t i = 0; i < c->len[s]; i++) {
        if (b[i] != '\n') continue;
        fprintf(out, "[gpu %d] %.*s\n", p->gpus[c->gpu].index, (int)(i - start), b + start);
        start = i + 1;
    }
    if ((flush_all || c->len[s] - start >= LINE_MAX_BYTES) && start < c->len[s]) {
        fprintf(out, "[gpu %d] %.*s\n", p->gpus[c->gpu].index, (int)(c->len[s] - start), b + start);
        start = c->len[s];
    }
    memmove(b, b + start, c->len[s] - start);
    c->len[s] -= start;
    fflush(out);
}

/* Reads what is there on c's stream s; closes it at end of file. */
static void drain(child *c, int s, const tdm_gpus_plan *p)
{
    for (;;) {
        if (c->fd[s] < 0) return;
        if (c->len[s] + 4096 > LINE_MAX_BYTES + 4096) emit(c, s, p, true);
        ssize_t r = read(c->fd[s], c->buf[s] + c->len[s], 4096);
        if (r > 0) {
            c->len[s] += (size_t)r;
            emit(c, s, p, false);
            continue;
        }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && errno == EAGAIN) return;
        close(c->fd[s]); /* end of file, or an error: nothing more comes */
        c->fd[s] = -1;
        emit(c, s, p, true);
        return;
    }
}

/* The child's environment: ours with CUDA_VISIBLE_DEVICES naming its GPU alone and
 * TANDEM_GPUS_PARENT our pid (the child checks it is still our child once it asked for SIGTERM
 * at our death). vars[0..1]: those strings, malloc'd; free them and the array. */
static char **child_env(const char *uuid, char *vars[2])
{
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + 3, sizeof *env);
    if (!env) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "CUDA_VISIBLE_DEVICES=", 21) &&
            strncmp(environ[i], "TANDEM_GPUS_PARENT=", 19))
            env[k++] = environ[i];
    if (asprintf(&vars[0], "CUDA_VISIBLE_DEVICES=%s", uuid) < 0) vars[0] = NULL;
    if (asprintf(&vars[1], "TANDEM_GPUS_PARENT=%ld", (long)getpid()) < 0) vars[1] = NULL;
    if (!vars[0] || !vars[1]) {
        free(env);
        return NULL;
    }
    env[k++] = vars[0];
    env[k] = vars[1];
    return env;
}

/* Starts c: tandem finetune ARGS --device cuda --adapter-subset LIST (before a "--", if any). */
static tdm_status spawn_child(child *c, int argc, char **args, const tdm_gpus_plan *p,
                              tdm_error *err)
{
    int pout[2] = {-1, -1}, perr[2] = {-1, -1};
    char **av = calloc((size_t)argc + 8, sizeof *av);
    char *vars[2] = {NULL, NULL};
    char **env = child_env(p->gpus[c->gpu].uuid, vars);
    tdm_status st = TDM_OK;
    if (!av || !env || pipe(pout) || pipe(perr)) {
        st = tdm_fail(err, TDM_ERR_IO, "--gpus: cannot start a child: %s", strerror(errno));
        goto out;
    }
    int k = 0, dashdash = argc;
    av[k++] = "tandem";
    for (int i = 1; i < argc; i++)
        if (!strcmp(args[i], "--")) {
            dashdash = i;
            break;
        }
    for (int i = 0; i < dashdash; i++)
        av[k++] = args[i];
    av[k++] = "--device";
    av[k++] = "cuda";
    av[k++] = "--adapter-subset";
    av[k++] = c->subset;
    for (int i = dashdash; i < argc; i++)
        av[k++] = args[i];
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, pout[1], 1);
    posix_spawn_file_actions_adddup2(&fa, perr[1], 2);
    posix_spawn_file_actions_addclose(&fa, pout[0]);
    posix_spawn_file_actions_addclose(&fa, perr[0]);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t none, def;
    sigemptyset(&none);
    sigemptyset(&def);
    sigaddset(&def, SIGINT);
    sigaddset(&def, SIGTERM);
    sigaddset(&def, SIGUSR1);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &def);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    int rc = posix_spawn(&c->pid, "/proc/self/exe", &fa, &attr, av, env);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    if (rc) {
        st = tdm_fail(err, TDM_ERR_IO, "--gpus: cannot start tandem: %s", strerror(rc));
        goto out;
    }
    c->fd[0] = pout[0];
    c->fd[1] = perr[0];
    pout[0] = perr[0] = -1;
    fcntl(c->fd[0], F_SETFL, O_NONBLOCK);
    fcntl(c->fd[1], F_SETFL, O_NONBLOCK);
    fcntl(c->fd[0], F_SETFD, FD_CLOEXEC);
    fcntl(c->fd[1], F_SETFD, FD_CLOEXEC);
out:
    for (int i = 0; i < 2; i++) {
        if (pout[i] >= 0) close(pout[i]);
        if (perr[i] >= 0) close(perr[i]);
    }
    free(vars[0]);
    free(vars[1]);
    free(env);
    free(av);
    return st;
}

/* How bad an exit is, for the parent's status (the header comment). */
static int severity(const child *c)
{
    if (c->signaled) return 5;
    if (c->code == 0) return 0;
    if (c->code == 130 || c->code == 143) return 2;
    if (c->code == TDM_EXIT_TIMEOUT) return 3;
    return 4;
}

static void print_plan(const tdm_gpus_plan *p)
{
    int used = 0;
    for (int g = 0; g < p->n_gpus; g++)
        used += p->split.n_on[g] > 0;
    printf("--gpus: %d adapter(s) on %d of %d GPU(s), one process each, longest-processing-time "
           "first on estimated tokens (training samples x epochs x mean length):\n",
           p->n_adapters, used, p->n_gpus);
    for (int g = 0; g < p->n_gpus; g++) {
        const tdm_gpus_gpu *gp = &p->gpus[g];
        printf("  gpu %d %s (%s): ", gp->index, gp->uuid, gp->name);
        if (!p->split.n_on[g]) {
            printf("no adapter\n");
            continue;
        }
        printf("%d adapter(s), %.0f tokens, plan %lld MiB of %lld:", p->split.n_on[g],
               p->split.work[g], (long long)p->split.mb[g], (long long)gp->budget_mb);
        for (int a = 0; a < p->n_adapters; a++)
            if (p->split.gpu_of[a] == g) printf(" %s", p->labels[a]);
        printf("\n");
    }
    for (int a = 0; a < p->n_adapters; a++) {
        const tdm_gpus_gpu *gp = &p->gpus[p->split.gpu_of[a]];
        printf("adapter %d: %s -> %s: gpu %d %s (%lld samples, %.0f tokens)\n", a, p->data[a],
               p->labels[a], gp->index, gp->uuid, (long long)p->n_train[a], p->work[a]);
    }
    fflush(stdout);
}

int tdm_cmd_finetune_gpus(tdm_run_opts *ro, int argc, char **args, const char *cmdline)
{
    const char *adopted = getenv("TANDEM_RESERVATION_ID");
    if (adopted && *adopted)
        return tdm_cli_fail(TDM_EXIT_USAGE,
                            "finetune: --gpus reserves memory on each GPU itself; it cannot run "
                            "inside tandem gpu run (reservation %s)",
                            adopted);
    tdm_gpus_plan plan;
    tdm_error err = {0};
    char *bad = NULL;
    tdm_status st = tdm_gpus_plan_make(ro, &plan, &bad, &err);
    if (st != TDM_OK) {
        int code;
        if (bad) {
            fputs(bad, stderr);
            code = tdm_cli_fail(
                TDM_EXIT_FAILURE,
                "bad lines in the training data; nothing was written (fix them, or pass "
                "--skip-bad-lines; in adapters.toml: skip_bad_lines = true)");
        } else {
            code = tdm_cli_fail_err(&err);
        }
        free(bad);
        tdm_gpus_plan_free(&plan);
        return code;
    }
    print_plan(&plan);

    child *kids = calloc((size_t)plan.n_gpus, sizeof *kids);
    int n_kids = 0;
    if (!kids) {
        tdm_gpus_plan_free(&plan);
        return tdm_cli_fail(TDM_EXIT_FAILURE, "out of memory");
    }
    /* signals: blocked while children start (so each one's pid is known to the forwarder) */
    struct sigaction sa = {0};
    sa.sa_handler = forward_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGUSR1);
    sigprocmask(SIG_BLOCK, &block, &old);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    got_signal = 0;
    n_child_pids = 0;
    int code = TDM_EXIT_OK;
    for (int g = 0; g < plan.n_gpus && n_kids < MAX_CHILDREN; g++) {
        child *c = &kids[n_kids];
        c->gpu = g;
        c->fd[0] = c->fd[1] = -1;
        if (!tdm_split_plan_list(&plan.split, g, c->subset, sizeof c->subset)) continue;
        c->buf[0] = malloc(LINE_MAX_BYTES + 4096);
        c->buf[1] = malloc(LINE_MAX_BYTES + 4096);
        if (!c->buf[0] || !c->buf[1] || spawn_child(c, argc, args, &plan, &err) != TDM_OK) {
            if (!err.message[0]) snprintf(err.message, sizeof err.message, "out of memory");
            free(c->buf[0]);
            free(c->buf[1]);
            code = tdm_cli_fail(TDM_EXIT_FAILURE, "%s", err.message);
            break;
        }
        child_pid[n_child_pids++] = c->pid;
        n_kids++;
    }
    if (code != TDM_EXIT_OK) /* stop those already started: they checkpoint and exit */
        for (int i = 0; i < n_kids; i++)
            kill(kids[i].pid, SIGTERM);
    sigprocmask(SIG_SETMASK, &old, NULL);

    /* the display and the children's ends */
    int live = n_kids;
    while (live > 0) {
        struct pollfd pf[2 * MAX_CHILDREN];
        int map[2 * MAX_CHILDREN], n_pf = 0;
        for (int i = 0; i < n_kids; i++)
            for (int s = 0; s < 2; s++)
                if (kids[i].fd[s] >= 0) {
                    pf[n_pf] = (struct pollfd){.fd = kids[i].fd[s], .events = POLLIN};
                    map[n_pf++] = 2 * i + s;
                }
        int r = poll(pf, (nfds_t)n_pf, 200);
        for (int k = 0; r > 0 && k < n_pf; k++)
            if (pf[k].revents) drain(&kids[map[k] / 2], map[k] % 2, &plan);
        for (int i = 0; i < n_kids; i++) {
            child *c = &kids[i];
            if (c->reaped) continue;
            int ws;
            pid_t w = waitpid(c->pid, &ws, WNOHANG);
            if (w != c->pid) continue;
            child_pid[i] = 0;
            c->reaped = true;
            live--;
            c->signaled = WIFSIGNALED(ws);
            c->code = c->signaled ? 128 + WTERMSIG(ws) : WEXITSTATUS(ws);
            /* what it wrote before it ended is in the pipes; a process it left behind (an MPS
             * daemon) may hold them open, so read what is there and stop */
            for (int s = 0; s < 2; s++) {
                drain(c, s, &plan);
                if (c->fd[s] >= 0) {
                    emit(c, s, &plan, true);
                    close(c->fd[s]);
                    c->fd[s] = -1;
                }
            }
        }
    }
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGUSR1, SIG_DFL);

    /* the report: each GPU's process, then the run's status */
    int worst = -1, n_bad = 0;
    for (int i = 0; i < n_kids; i++) {
        child *c = &kids[i];
        const tdm_gpus_gpu *gp = &plan.gpus[c->gpu];
        char what[64];
        if (c->signaled)
            snprintf(what, sizeof what, "killed by signal %d", c->code - 128);
        else if (c->code == 0)
            snprintf(what, sizeof what, "finished");
        else if (c->code == 130 || c->code == 143)
            snprintf(what, sizeof what, "stopped (exit %d)", c->code);
        else
            snprintf(what, sizeof what, "failed (exit %d)", c->code);
        fprintf(stderr, "tandem: --gpus: gpu %d %s (adapters", gp->index, gp->uuid);
        for (int a = 0; a < plan.n_adapters; a++)
            if (plan.split.gpu_of[a] == c->gpu) fprintf(stderr, " %s", plan.labels[a]);
        fprintf(stderr, "): %s\n", what);
        if (severity(c) >= 3) n_bad++;
        if (worst < 0 || severity(c) > severity(&kids[worst])) worst = i;
    }
    if (code == TDM_EXIT_OK && worst >= 0) code = kids[worst].code;
    bool has_resume = strstr(cmdline, " --resume") != NULL;
    if (n_bad)
        fprintf(stderr,
                "tandem: --gpus: %d of %d GPU process(es) did not finish; the others ran to their "
                "end. To train what is left (every finished adapter is kept), run:\n  %s%s\n",
                n_bad, n_kids, cmdline, has_resume ? "" : " --resume");
    else if (got_signal)
        fprintf(stderr, "tandem: to continue exactly where it stopped, run:\n  %s%s\n", cmdline,
                has_resume ? "" : " --resume");
    for (int i = 0; i < n_kids; i++) {
        free(kids[i].buf[0]);
        free(kids[i].buf[1]);
    }
    free(kids);
    n_child_pids = 0;
    tdm_gpus_plan_free(&plan);
    return code;
}
