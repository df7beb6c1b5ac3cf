#include "gpu/mps.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

tdm_run_context tdm_run_context_for(const tdm_mps_opts *mps)
{
    tdm_run_context ctx = {0};
    if (mps) {
        ctx.mps = *mps;
        if (mps->enabled)
            ctx.max_checkpoint_interval_steps = TDM_MPS_MAX_CHECKPOINT_STEPS;
    }
    return ctx;
}

void tdm_mps_control_path(char *buf, size_t size)
{
    const char *dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
    snprintf(buf, size, "%s/control", dir && *dir ? dir : "/tmp/nvidia-mps");
}

static tdm_status no_daemon(tdm_error *err, const char *path, const char *why)
{
    return tdm_fail(err, TDM_ERR_NOT_FOUND,
                    "--experimental-mps: no MPS control daemon answers at %s (%s). Start one "
                    "yourself, as the user that runs the jobs: `nvidia-cuda-mps-control -d` "
                    "(with CUDA_MPS_PIPE_DIRECTORY/CUDA_MPS_LOG_DIRECTORY set if you use private "
                    "directories; ideally with the GPU in EXCLUSIVE_PROCESS compute mode). tandem "
                    "does not start it for you: the daemon is shared by every CUDA program of that "
                    "user on this machine, and under MPS a fault in one client crashes all clients "
                    "on the GPU, so it is a decision for the machine's owner",
                    path, why);
}

tdm_status tdm_mps_detect(int timeout_ms, tdm_error *err)
{
    char path[sizeof(((struct sockaddr_un *)0)->sun_path) + 64];
    tdm_mps_control_path(path, sizeof path);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path)
        return no_daemon(err, path, "the path is too long for a Unix socket");
    memcpy(addr.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return tdm_fail_errno(err, TDM_ERR_IO, errno, "socket");
    int rc = connect(fd, (struct sockaddr *)&addr, sizeof addr);
    if (rc != 0 && (errno == EINPROGRESS || errno == EAGAIN)) {
        /* A daemon whose backlog is full: wait a little, never hang. */
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        int soerr = ETIMEDOUT;
        if (poll(&pfd, 1, timeout_ms) > 0) {
            socklen_t len = sizeof soerr;
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
        }
        rc = soerr == 0 ? 0 : -1;
        errno = soerr;
    }
    int saved = errno;
    close(fd);
    if (rc != 0)
        return no_daemon(err, path, strerror(saved));
    return TDM_OK;
}

int tdm_mps_child_env(const tdm_mps_opts *mps, const char *gpu_uuid, int64_t budget_mb, char *buf,
                      size_t size)
{
    int n = snprintf(buf, size,
                     "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%d%cCUDA_MPS_PINNED_DEVICE_MEM_LIMIT=%s=%lldM%c",
                     mps->gpu_share_pct, 0, gpu_uuid, (long long)budget_mb, 0);
    return n < 0 || (size_t)n >= size ? -1 : n;
}
