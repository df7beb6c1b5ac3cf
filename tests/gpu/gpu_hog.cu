// gpu_hog — a small CUDA program for the real-GPU checks of the sharing layer (run by
// scripts/device/verify-gpu-sharing.sh, never by the CPU test suite).
//   gpu_hog ALLOC_MIB HOLD_SECONDS [LOG_FILE]
// Prints the device's name and multiprocessor count (under MPS with an active-thread percentage
// the count reported is the client's share), allocates ALLOC_MIB in 256 MiB chunks, touching each
// (so the memory is really committed), reports how far it got if an allocation fails (a clean
// failure, exit 3), holds the memory for HOLD_SECONDS, and appends "start <ns> end <ns>" to LOG_FILE.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: gpu_hog ALLOC_MIB HOLD_SECONDS [LOG_FILE]\n");
        return 2;
    }
    long long start = now_ns();
    long alloc_mib = atol(argv[1]);
    double hold = atof(argv[2]);
    cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, 0);
    if (e != cudaSuccess) {
        fprintf(stderr, "gpu_hog: cudaGetDeviceProperties: %s\n", cudaGetErrorString(e));
        return 1;
    }
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    printf("gpu_hog: device %s, %d multiprocessors, CUDA_VISIBLE_DEVICES=%s\n", prop.name, sms,
           getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "(unset)");
    const size_t chunk = 256ull << 20;
    long got = 0;
    int failed = 0;
    while (got < alloc_mib) {
        void *p = NULL;
        size_t bytes = (size_t)((alloc_mib - got) < 256 ? (alloc_mib - got) : 256) << 20;
        e = cudaMalloc(&p, bytes);
        if (e != cudaSuccess) {
            printf("gpu_hog: allocation failed cleanly after %ld MiB: %s\n", got,
                   cudaGetErrorString(e));
            cudaGetLastError(); // clear the sticky-free error so the context stays usable
            failed = 1;
            break;
        }
        cudaMemset(p, 0xA5, bytes);
        got += (long)(bytes >> 20);
    }
    (void)chunk;
    cudaDeviceSynchronize();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    printf("gpu_hog: holding %ld MiB; device free %zu MiB of %zu MiB\n", got, free_b >> 20,
           total_b >> 20);
    fflush(stdout);
    usleep((useconds_t)(hold * 1e6));
    long long end = now_ns();
    if (argc > 3) {
        FILE *f = fopen(argv[3], "a");
        if (f) {
            fprintf(f, "%s start %lld end %lld mib %ld\n",
                    getenv("TANDEM_RESERVATION_ID") ? getenv("TANDEM_RESERVATION_ID") : "-", start,
                    end, got);
            fclose(f);
        }
    }
    return failed ? 3 : 0;
}
