/* MPS opt-in: daemon detection over a real Unix SEQPACKET socket, the child's environment, the
 * run context, and `tandem gpu run --experimental-mps` end to end against a listening socket.
 * (A real MPS daemon on a real GPU is exercised by scripts/device/verify-gpu-sharing.sh.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "gpu/mps.h"

static char dir[64];

static int setup(void **state)
{
    snprintf(dir, sizeof dir, "/tmp/tandem-test-mps-XXXXXX");
    assert_non_null(mkdtemp(dir));
    setenv("CUDA_MPS_PIPE_DIRECTORY", dir, 1);
    return 0;
}

static int teardown(void **state)
{
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* A socket of `type` bound at dir/control; listening when `listen_too`. Returns the fd. */
static int bind_control(int type, int listen_too)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s/control", dir);
    unlink(addr.sun_path);
    int fd = socket(AF_UNIX, type, 0);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&addr, sizeof addr), 0);
    if (listen_too)
        assert_int_equal(listen(fd, 8), 0);
    return fd;
}

static void test_control_path(void **state)
{
    char buf[256];
    tdm_mps_control_path(buf, sizeof buf);
    assert_true(strncmp(buf, dir, strlen(dir)) == 0);
    unsetenv("CUDA_MPS_PIPE_DIRECTORY");
    tdm_mps_control_path(buf, sizeof buf);
    assert_string_equal(buf, "/tmp/nvidia-mps/control");
    setenv("CUDA_MPS_PIPE_DIRECTORY", dir, 1);
}

static void test_detect_no_daemon(void **state)
{
    tdm_error err = {0};
    char path[200];
    snprintf(path, sizeof path, "%s/control", dir);
    unlink(path);
    assert_int_equal(tdm_mps_detect(200, &err), TDM_ERR_NOT_FOUND);
    assert_non_null(strstr(err.message, "nvidia-cuda-mps-control -d"));
    assert_non_null(strstr(err.message, "does not start it"));
    /* A stale socket file whose daemon died: connection refused, reported, no hang. */
    int fd = bind_control(SOCK_SEQPACKET, 0);
    close(fd);
    assert_int_equal(tdm_mps_detect(200, &err), TDM_ERR_NOT_FOUND);
    assert_non_null(strstr(err.message, "refused"));
    /* A listener of the wrong socket type is not the MPS control daemon. */
    fd = bind_control(SOCK_STREAM, 1);
    assert_int_equal(tdm_mps_detect(200, &err), TDM_ERR_NOT_FOUND);
    close(fd);
}

static void test_detect_listening_daemon(void **state)
{
    int fd = bind_control(SOCK_SEQPACKET, 1);
    tdm_error err = {0};
    assert_int_equal(tdm_mps_detect(200, &err), TDM_OK);
    close(fd);
}

static void test_child_env_and_context(void **state)
{
    tdm_mps_opts o = {.enabled = true, .gpu_share_pct = 50};
    char buf[256];
    int n = tdm_mps_child_env(&o, "GPU-1234", 8192, buf, sizeof buf);
    assert_true(n > 0);
    assert_string_equal(buf, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50");
    assert_string_equal(buf + strlen(buf) + 1, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=GPU-1234=8192M");
    assert_int_equal(n, (int)(strlen(buf) + 1 + strlen(buf + strlen(buf) + 1) + 1));
    assert_int_equal(tdm_mps_child_env(&o, "GPU-1234", 8192, buf, 10), -1);
    tdm_run_context ctx = tdm_run_context_for(&o);
    assert_int_equal(ctx.max_checkpoint_interval_steps, TDM_MPS_MAX_CHECKPOINT_STEPS);
    o.enabled = false;
    ctx = tdm_run_context_for(&o);
    assert_int_equal(ctx.max_checkpoint_interval_steps, 0);
}

/* The CLI: with a control socket listening, the child gets both variables; the banner is printed
 * once; a share below 30 warns. */
static void test_gpu_run_passes_env(void **state)
{
    const char *tandem = getenv("TANDEM");
    if (!tandem)
        skip();
    int fd = bind_control(SOCK_SEQPACKET, 1);
    char cmd[1024], out[256], errf[256];
    snprintf(out, sizeof out, "%s/child.env", dir);
    snprintf(errf, sizeof errf, "%s/stderr", dir);
    snprintf(cmd, sizeof cmd,
             "TANDEM_LEDGER_DIR=%s/ledger TANDEM_FAKE_GPUS='uuid=GPU-sim-mps,name=Sim,"
             "total_mb=20000,memory=discrete' %s gpu run --vram 8 --experimental-mps "
             "--gpu-share 20 -- env > %s 2> %s",
             dir, tandem, out, errf);
    assert_int_equal(system(cmd), 0);
    close(fd);
    char line[512];
    int share = 0, limit = 0, banner = 0, low = 0;
    FILE *f = fopen(out, "r");
    assert_non_null(f);
    while (fgets(line, sizeof line, f)) {
        share += !strcmp(line, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=20\n");
        limit += !strcmp(line, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=GPU-sim-mps=8192M\n");
    }
    fclose(f);
    f = fopen(errf, "r");
    assert_non_null(f);
    while (fgets(line, sizeof line, f)) {
        banner += strstr(line, "MPS enabled") != NULL;
        low += strstr(line, "below 30%") != NULL;
    }
    fclose(f);
    assert_int_equal(share, 1);
    assert_int_equal(limit, 1);
    assert_int_equal(banner, 1);
    assert_int_equal(low, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_control_path),
        cmocka_unit_test(test_detect_no_daemon),
        cmocka_unit_test(test_detect_listening_daemon),
        cmocka_unit_test(test_child_env_and_context),
        cmocka_unit_test(test_gpu_run_passes_env),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
