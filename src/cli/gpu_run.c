/* tandem gpu run — reserve, run a command with CUDA_VISIBLE_DEVICES set, monitor, release. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "gpu/inventory.h"
#include "gpu/mps.h"
#include "obs/profile.h"
#include "obs/trace.h"
#include "gpu/proc_identity.h"
#include "gpu/reservation.h"
#include "util/timeutil.h"

static const char usage[] =
    "usage: tandem gpu run --vram GB [--gpu UUID|INDEX] [--task NAME] [--no-wait-gpu]\n"
    "                      [--timeout SEC] [--experimental-mps [--gpu-share PCT]]\n"
    "                      [--profile] [--trace FILE.json] -- COMMAND [ARGS...]\n"
    "\n"
    "Reserves GB GiB of GPU memory in the ledger (waiting in arrival order until it fits), runs\n"
    "COMMAND with CUDA_VISIBLE_DEVICES set to the chosen GPU and TANDEM_RESERVATION_ID set,\n"
    "forwards SIGINT/SIGTERM/SIGHUP/SIGUSR1 to it, records its measured memory, releases the\n"
    "reservation when it exits, and exits with its exit code.\n"
    "\n"
    "  --vram GB        memory budget in GiB (fractions allowed: 0.5 = 512 MiB)\n"
    "  --gpu ID         a GPU UUID, unique UUID prefix or index; default: the GPU with most room\n"
    "  --task NAME      label shown in `tandem gpu status` (default: the command's name)\n"
    "  --no-wait-gpu    fail at once (exit 1) instead of waiting when memory is not available\n"
    "  --timeout SEC    give up waiting after SEC seconds (default 3600) and exit 75\n"
    "  --experimental-mps  run COMMAND as a client of a running CUDA MPS daemon (tandem never\n"
    "                   starts one): its reservation becomes a hard memory limit. A GPU fault in\n"
    "                   any MPS client crashes every client on that GPU\n"
    "  --gpu-share PCT  with --experimental-mps: the share of the GPU's SMs (1-100, default 100)\n"
    "  --profile        print the sharing layer's phase timings and overhead at exit\n"
    "  --trace FILE     write a Chrome/Perfetto trace of the sharing layer to FILE\n"
    "\n"
    "Exit codes: the command's own; 1 tandem failed; 2 usage error; 75 timed out waiting.\n";

/* Signal plumbing: handlers only set flags, forward to the child and poke a self-pipe. */
static volatile sig_atomic_t child_pid;
static volatile sig_atomic_t stop_signal; /* a signal that arrived while waiting for memory */
static int wake_pipe[2] = {-1, -1};

static void on_forwarded_signal(int sig)
{
    int saved = errno;
    if (child_pid > 0)
        kill((pid_t)child_pid, sig);
    else
        stop_signal = sig;
    errno = saved;
}

static void on_sigchld(int sig)
{
    (void)sig;
    int saved = errno;
    if (wake_pipe[1] >= 0) {
        ssize_t ignored = write(wake_pipe[1], "c", 1);
        (void)ignored;
    }
    errno = saved;
}

static void install_handlers(void)
{
    struct sigaction sa = {0};
    sa.sa_handler = on_forwarded_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    /* Slurm's --signal=USR1@N (time nearly up) is meant for the program: tandem finetune
     * checkpoints on it; the wrapper, killed by its default action, would orphan the child. */
    sigaction(SIGUSR1, &sa, NULL);
    /* A held child that died before admission closes its end of the go pipe: writing to it must
     * fail with EPIPE, not kill the wrapper before it releases the reservation. */
    signal(SIGPIPE, SIG_IGN);
    sa.sa_handler = on_sigchld;
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, NULL);
}

static void report_waiting(const tdm_wait_report *r, void *user)
{
    (void)user;
    if (r->elapsed_sec < 0.5) {
        fprintf(stderr,
                "tandem: waiting for %lld MiB of GPU memory: position %d in the queue of %s, "
                "%lld MiB available now\n",
                (long long)r->needed_mb, r->position, r->gpu_uuid, (long long)r->available_mb);
    } else {
        fprintf(stderr,
                "tandem: still waiting for %lld MiB: position %d in the queue of %s, %lld MiB "
                "available, %.0f s elapsed\n",
                (long long)r->needed_mb, r->position, r->gpu_uuid, (long long)r->available_mb,
                r->elapsed_sec);
    }
}

/* Device memory used by the child's process tree on the reserved GPU (MiB), -1 when unknown. */
static int64_t measure_actual(pid_t child, const char *gpu_uuid)
{
    tdm_inventory inv;
    tdm_error err = {0};
    if (tdm_inventory_query(&inv, &err) != TDM_OK)
        return -1;
    int64_t total = -1;
    const tdm_gpu *g = tdm_inventory_find(&inv, gpu_uuid);
    if (g) {
        pid_t pids[256];
        size_t n = tdm_proc_tree(child, pids, 256);
        if (n > 256)
            n = 256;
        for (size_t i = 0; i < n; i++) {
            int64_t mb = tdm_gpu_process_used_mb(g, (uint32_t)pids[i]);
            if (mb >= 0)
                total = (total < 0 ? 0 : total) + mb;
        }
    }
    tdm_inventory_free(&inv);
    return total;
}

static int exit_code_of(int status)
{
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return TDM_EXIT_FAILURE;
}

static int64_t env_interval_ms(const char *name, int64_t dflt)
{
    const char *s = getenv(name);
    return s && atoll(s) > 0 ? atoll(s) : dflt;
}

/* A child forked before the reservation and held back on a pipe until admission, so that it is
 * recorded as a holder in the same ledger write that admits it: were the wrapper killed at any
 * moment, the ledger still accounts for whatever the child runs. */
typedef struct held_child {
    pid_t pid;
    int go_fd;   /* write 'g' to start it; close without writing to make it exit 125 */
    int exec_fd; /* carries errno back when exec fails; EOF when exec succeeded */
} held_child;

static int spawn_held_child(held_child *hc, char **command)
{
    int exec_pipe[2], go_pipe[2];
    if (pipe2(wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0 || pipe2(exec_pipe, O_CLOEXEC) != 0 ||
        pipe2(go_pipe, O_CLOEXEC) != 0)
        return tdm_cli_fail(TDM_EXIT_FAILURE, "pipe: %s", strerror(errno));
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGCHLD);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGHUP);
    sigaddset(&block, SIGUSR1);
    sigprocmask(SIG_BLOCK, &block, &old);
    pid_t pid = fork();
    if (pid < 0) {
        sigprocmask(SIG_SETMASK, &old, NULL);
        return tdm_cli_fail(TDM_EXIT_FAILURE, "fork: %s", strerror(errno));
    }
    if (pid == 0) {
        struct sigaction dfl = {0};
        dfl.sa_handler = SIG_DFL;
        sigaction(SIGINT, &dfl, NULL);
        sigaction(SIGTERM, &dfl, NULL);
        sigaction(SIGHUP, &dfl, NULL);
        sigaction(SIGUSR1, &dfl, NULL);
        sigaction(SIGCHLD, &dfl, NULL);
        signal(SIGPIPE, SIG_DFL);
        /* A terminal's Ctrl-C reaches the whole process group: while held back the child ignores
         * it and lets the wrapper decide (it then closes the go pipe). */
        signal(SIGINT, SIG_IGN);
        sigprocmask(SIG_SETMASK, &old, NULL);
        close(go_pipe[1]);
        close(exec_pipe[0]);
        /* The go message: 'g' then NUL-terminated KEY=VALUE entries for our environment. */
        static char msg[8192];
        size_t n = 0;
        for (;;) {
            ssize_t r = read(go_pipe[0], msg + n, sizeof msg - 1 - n);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                break;
            n += (size_t)r;
        }
        if (n == 0 || msg[0] != 'g')
            _exit(125);
        msg[n] = '\0';
        for (size_t i = 1; i < n; i += strlen(msg + i) + 1)
            putenv(msg + i);
        signal(SIGINT, SIG_DFL);
        execvp(command[0], command);
        int e = errno;
        ssize_t ignored = write(exec_pipe[1], &e, sizeof e);
        (void)ignored;
        _exit(127);
    }
    close(go_pipe[0]);
    close(exec_pipe[1]);
    hc->pid = pid;
    hc->go_fd = go_pipe[1];
    hc->exec_fd = exec_pipe[0];
    sigprocmask(SIG_SETMASK, &old, NULL);
    return TDM_EXIT_OK;
}

/* Lets a held child go away without running anything. */
static void discard_held_child(held_child *hc)
{
    close(hc->go_fd);
    close(hc->exec_fd);
    while (waitpid(hc->pid, NULL, 0) < 0 && errno == EINTR) {
    }
}

/* Starts the held child and watches it until it exits. Returns its exit code. */
static int supervise(tdm_lease *lease, held_child *hc, const tdm_mps_opts *mps, char **command)
{
    pid_t pid = hc->pid;
    char msg[2048];
    int len = snprintf(msg, sizeof msg, "gCUDA_VISIBLE_DEVICES=%s%cTANDEM_RESERVATION_ID=%s%c",
                       lease->gpu_uuid, 0, lease->id, 0);
    if (mps->enabled) {
        int more = tdm_mps_child_env(mps, lease->gpu_uuid, lease->budget_mb, msg + len,
                                     sizeof msg - (size_t)len);
        if (more > 0)
            len += more;
    }
    child_pid = pid;
    ssize_t wrote = write(hc->go_fd, msg, (size_t)len);
    (void)wrote;
    close(hc->go_fd);
    int exec_errno = 0;
    if (read(hc->exec_fd, &exec_errno, sizeof exec_errno) == (ssize_t)sizeof exec_errno)
        fprintf(stderr, "tandem: cannot run %s: %s\n", command[0], strerror(exec_errno));
    close(hc->exec_fd);

    tdm_error err = {0};
    int64_t monitor_ms = env_interval_ms("TANDEM_MONITOR_MS", 2000);
    /* Readable when the ledger directory changes; the reservation is written back at once when
     * the ledger was moved aside. Every ledger write wakes it too, so the measuring period runs on
     * its own deadline: a busy ledger must not postpone measuring and renewing forever. */
    int watch_fd = tdm_reservation_watch_open(lease);
    int64_t next_measure = tdm_now_mono_ns() + monitor_ms * 1000000LL;
    bool warned = false;
    int status = 0;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            break;
        if (r < 0 && errno != EINTR) {
            status = 1 << 8;
            break;
        }
        int64_t left_ms = (next_measure - tdm_now_mono_ns()) / 1000000 + 1;
        if (r == 0 && next_measure > tdm_now_mono_ns()) {
            struct pollfd pfd[2] = {{.fd = wake_pipe[0], .events = POLLIN},
                                    {.fd = watch_fd, .events = POLLIN}};
            if (poll(pfd, watch_fd >= 0 ? 2 : 1, (int)left_ms) > 0) {
                if (pfd[1].revents & POLLIN) {
                    bool back;
                    if (tdm_reservation_watch_handle(lease, watch_fd, &back, &err) != TDM_OK)
                        fprintf(stderr, "tandem: warning: cannot re-register the reservation: %s\n",
                                err.message);
                    else if (back)
                        fprintf(stderr,
                                "tandem: the GPU ledger was moved aside; reservation %s "
                                "re-registered\n",
                                lease->id);
                }
                if (pfd[0].revents & POLLIN) {
                    char buf[64];
                    while (read(wake_pipe[0], buf, sizeof buf) > 0) {
                    }
                }
            }
            continue; /* reap first (a SIGCHLD), then wait out the rest of the period */
        }
        next_measure = tdm_now_mono_ns() + monitor_ms * 1000000LL;
        int64_t actual = measure_actual(pid, lease->gpu_uuid);
        if (actual >= 0 && actual != lease->actual_mb) {
            if (tdm_reservation_update_actual(lease, actual, &err) != TDM_OK)
                fprintf(stderr, "tandem: warning: %s\n", err.message);
            if (!warned && actual * 10 > lease->budget_mb * 12) {
                fprintf(stderr,
                        "tandem: warning: %s uses %lld MiB on %s, more than 20%% over its budget "
                        "of %lld MiB; other jobs' admissions assumed the budget. Raise --vram\n",
                        command[0], (long long)actual, lease->gpu_uuid,
                        (long long)lease->budget_mb);
                warned = true;
            }
        }
        if (tdm_reservation_renew_due(lease) && tdm_reservation_renew(lease, &err) != TDM_OK)
            fprintf(stderr, "tandem: warning: cannot renew the lease: %s\n", err.message);
    }
    child_pid = 0;
    if (watch_fd >= 0)
        close(watch_fd);
    return exec_errno ? (exec_errno == ENOENT ? 127 : 126) : exit_code_of(status);
}

/* Reports the chosen GPU's compute mode under MPS (a warning unless EXCLUSIVE_PROCESS). */
static void report_compute_mode(const char *gpu_uuid)
{
    tdm_inventory inv;
    tdm_error err = {0};
    if (tdm_inventory_query(&inv, &err) != TDM_OK)
        return;
    const tdm_gpu *g = tdm_inventory_find(&inv, gpu_uuid);
    if (g && g->compute_mode >= 0) {
        fprintf(stderr, "tandem: %s compute mode: %s\n", gpu_uuid,
                tdm_compute_mode_str(g->compute_mode));
        if (g->compute_mode != TDM_COMPUTE_EXCLUSIVE_PROCESS)
            fprintf(stderr, "tandem: warning: the compute mode is not EXCLUSIVE_PROCESS: programs "
                            "that bypass the MPS daemon can still share this GPU\n");
    }
    tdm_inventory_free(&inv);
}

/* Reserve (with the child held back), run, release. Returns the exit code. */
static int run_reserved(tdm_acquire_opts *ao, const tdm_mps_opts *mps, char **command)
{
    install_handlers();
    held_child hc = {0};
    int rc = spawn_held_child(&hc, command);
    if (rc != TDM_EXIT_OK)
        return rc;
    ao->extra_holder = hc.pid;
    tdm_lease lease;
    tdm_error err = {0};
    if (tdm_reservation_acquire(&lease, ao, &err) != TDM_OK) {
        discard_held_child(&hc);
        if (stop_signal)
            return 128 + stop_signal;
        return tdm_cli_fail_err(&err);
    }
    tdm_reservation_release_at_exit(&lease);
    if (stop_signal) { /* interrupted between admission and start: do not start */
        discard_held_child(&hc);
        tdm_reservation_release(&lease, &err);
        return 128 + stop_signal;
    }
    fprintf(stderr, "tandem: reserved %lld MiB on %s (%s) as %s\n", (long long)lease.budget_mb,
            lease.gpu_uuid, lease.gpu_name, lease.id);
    if (mps->enabled)
        report_compute_mode(lease.gpu_uuid);
    int code = supervise(&lease, &hc, mps, command);
    if (tdm_reservation_release(&lease, &err) != TDM_OK)
        fprintf(stderr, "tandem: warning: could not release %s: %s (it will be pruned as dead)\n",
                lease.id, err.message);
    return code;
}

int tdm_cmd_gpu_run(int argc, char **argv)
{
    static const struct option opts[] = {
        {"vram", required_argument, NULL, 'v'},     {"gpu", required_argument, NULL, 'g'},
        {"task", required_argument, NULL, 't'},     {"no-wait-gpu", no_argument, NULL, 'n'},
        {"timeout", required_argument, NULL, 'T'},  {"help", no_argument, NULL, 'h'},
        {"experimental-mps", no_argument, NULL, 'M'}, {"gpu-share", required_argument, NULL, 'S'},
        {"profile", no_argument, NULL, 'P'},        {"trace", required_argument, NULL, 'R'},
        {NULL, 0, NULL, 0},
    };
    tdm_acquire_opts ao = tdm_acquire_defaults();
    double vram_gb = 0;
    tdm_error err = {0};
    bool have_vram = false, profile = false, have_share = false;
    const char *trace_path = NULL;
    tdm_mps_opts mps = {.enabled = false, .gpu_share_pct = 100};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
        switch (c) {
        case 'v':
            if (tdm_vram_gib_parse(optarg, false, &vram_gb, &err) != TDM_OK) /* as finetune's */
                return tdm_cli_fail(TDM_EXIT_USAGE, "--vram%s%s",
                                    strncmp(err.message, "needs ", 6) ? ": " : " ", err.message);
            have_vram = true;
            break;
        case 'g': ao.gpu = optarg; break;
        case 't': ao.task = optarg; break;
        case 'n': ao.wait = false; break;
        case 'T':
            if (!tdm_cli_parse_double(optarg, &ao.timeout_sec) || ao.timeout_sec < 0)
                return tdm_cli_fail(TDM_EXIT_USAGE, "--timeout needs seconds >= 0, not '%s'",
                                    optarg);
            break;
        case 'M': mps.enabled = true; break;
        case 'S': {
            long pct;
            if (!tdm_cli_parse_long(optarg, &pct) || pct < 1 || pct > 100)
                return tdm_cli_fail(TDM_EXIT_USAGE, "--gpu-share needs a percentage from 1 to 100, "
                                                    "not '%s'", optarg);
            mps.gpu_share_pct = (int)pct;
            have_share = true;
            break;
        }
        case 'P': profile = true; break;
        case 'R': trace_path = optarg; break;
        case 'h': fputs(usage, stdout); return TDM_EXIT_OK;
        default:
            fputs(usage, stderr);
            return tdm_cli_fail(TDM_EXIT_USAGE, "unknown or incomplete option '%s'",
                                argv[optind - 1]);
        }
    }
    if (!have_vram) {
        fputs(usage, stderr);
        return tdm_cli_fail(TDM_EXIT_USAGE, "--vram GB is required");
    }
    if (optind >= argc) {
        fputs(usage, stderr);
        return tdm_cli_fail(TDM_EXIT_USAGE, "no command given (put it after --)");
    }
    if (have_share && !mps.enabled)
        return tdm_cli_fail(TDM_EXIT_USAGE, "--gpu-share only applies with --experimental-mps");
    char **command = argv + optind;
    if (!strcmp(ao.task, "job")) {
        const char *slash = strrchr(command[0], '/');
        ao.task = slash ? slash + 1 : command[0];
    }
    ao.budget_mb = (int64_t)ceil(vram_gb * 1024.0);
    ao.report = report_waiting;
    ao.cancel = &stop_signal;

    int64_t wall_start = tdm_now_mono_ns();
    if (mps.enabled) {
        if (tdm_mps_detect(500, &err) != TDM_OK)
            return tdm_cli_fail_err(&err);
        fprintf(stderr, "tandem: MPS enabled \xe2\x80\x94 a GPU fault in any job will crash all jobs "
                        "on this GPU\n");
        if (mps.gpu_share_pct < TDM_MPS_UNRELIABLE_BELOW_PCT)
            fprintf(stderr, "tandem: warning: --gpu-share %d is below %d%%: MPS partitioning is "
                            "unreliable there, especially on Jetson\n",
                    mps.gpu_share_pct, TDM_MPS_UNRELIABLE_BELOW_PCT);
    }
    if (profile)
        tdm_profile_enable(true);
    if (trace_path) {
        if (tdm_trace_open(trace_path, &err) != TDM_OK)
            return tdm_cli_fail_err(&err);
        tdm_trace_set_label(ao.task);
    }
    int code = run_reserved(&ao, &mps, command);
    if (profile) {
        fflush(stdout);
        if (tdm_profile_report(stderr, tdm_now_mono_ns() - wall_start, &err) != TDM_OK)
            fprintf(stderr, "tandem: warning: %s\n", err.message);
    }
    if (trace_path && tdm_trace_close(&err) != TDM_OK)
        fprintf(stderr, "tandem: warning: %s\n", err.message);
    return code;
}
