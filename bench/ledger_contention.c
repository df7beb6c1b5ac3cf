/* ledger_contention — cost of one reserve + release through the library API while P processes
 * hammer the same ledger. Usage: ledger_contention PROCS CYCLES (uses TANDEM_LEDGER_DIR and
 * TANDEM_FAKE_GPUS from the environment). Prints per-process medians and the overall figure. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu/reservation.h"
#include "util/timeutil.h"

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s PROCS CYCLES\n", argv[0]);
        return 2;
    }
    int procs = atoi(argv[1]), cycles = atoi(argv[2]);
    int fds[2];
    if (pipe(fds) != 0)
        return 1;
    int64_t t0 = tdm_now_mono_ns();
    for (int p = 0; p < procs; p++) {
        if (fork() == 0) {
            close(fds[0]);
            int64_t *lat = calloc((size_t)cycles, sizeof *lat);
            for (int i = 0; i < cycles; i++) {
                tdm_acquire_opts o = tdm_acquire_defaults();
                o.budget_mb = 16;
                o.task = "bench";
                tdm_lease lease;
                tdm_error err = {0};
                int64_t s = tdm_now_mono_ns();
                if (tdm_reservation_acquire(&lease, &o, &err) != TDM_OK ||
                    tdm_reservation_release(&lease, &err) != TDM_OK) {
                    fprintf(stderr, "bench: %s\n", err.message);
                    _exit(1);
                }
                lat[i] = tdm_now_mono_ns() - s;
            }
            qsort(lat, (size_t)cycles, sizeof *lat, cmp_i64);
            int64_t med = lat[cycles / 2], p90 = lat[cycles * 9 / 10];
            if (write(fds[1], &med, sizeof med) < 0 || write(fds[1], &p90, sizeof p90) < 0)
                _exit(1);
            _exit(0);
        }
    }
    close(fds[1]);
    int64_t meds[256], p90s[256];
    int n = 0;
    while (n < procs && n < 256 && read(fds[0], &meds[n], sizeof meds[n]) == sizeof meds[n] &&
           read(fds[0], &p90s[n], sizeof p90s[n]) == sizeof p90s[n])
        n++;
    int failed = 0, st;
    while (wait(&st) > 0)
        failed |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    double wall = (double)(tdm_now_mono_ns() - t0) / 1e9;
    qsort(meds, (size_t)n, sizeof *meds, cmp_i64);
    qsort(p90s, (size_t)n, sizeof *p90s, cmp_i64);
    printf("procs=%d cycles=%d  reserve+release: median %.2f ms (median over processes), p90 %.2f "
           "ms (worst process)  throughput %.0f ops/s\n",
           procs, cycles, (double)meds[n / 2] / 1e6, n ? (double)p90s[n - 1] / 1e6 : 0.0,
           procs * cycles / wall);
    return failed;
}
