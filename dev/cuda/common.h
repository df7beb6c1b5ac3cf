/* common.h — shared helpers of the dev/cuda kernel programs (llm.c style): checked CUDA calls,
 * random inputs (never zero), NaN poisoning, validation against a CPU reference, and timing with
 * CUDA events (warm-up, then the median of repeated runs).
 *
 * Every program prints, for each variant and size, one line
 *     RESULT <kernel> <variant> <shape> time_us=<median> <rate> err=<max_rel_err> <ok|FAIL>
 * that scripts/device/cuda-check.sh gathers into its final table. Exit status: 0 when every
 * validated variant passed, 1 otherwise. `--quick` runs fewer repetitions.
 */
#ifndef TANDEM_DEV_CUDA_COMMON_H
#define TANDEM_DEV_CUDA_COMMON_H
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#define cudaCheck(call)                                                                            \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "CUDA error: %s at %s:%d: %s\n", #call, __FILE__, __LINE__,            \
                    cudaGetErrorString(e_));                                                       \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)
#define launchCheck(name) cudaCheck(cudaGetLastError())

static int g_failures = 0;
static int g_reps = 50;

static inline void dev_parse_args(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--quick") == 0) g_reps = 10;
}

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static inline double urand(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) * (1.0 / 9007199254740992.0);
}

/* |x| in [0.1, 1] * scale with a random sign: never zero */
static inline float rnd1(float scale)
{
    double mag = 0.1 + 0.9 * urand();
    return (float)(urand() < 0.5 ? -mag : mag) * scale;
}

static inline float bf16r(float x) /* round through bf16 */
{
    return __bfloat162float(__float2bfloat16_rn(x));
}

static inline std::vector<float> rand_vec(size_t n, float scale, bool round_bf16)
{
    std::vector<float> v(n);
    for (auto &x : v) x = round_bf16 ? bf16r(rnd1(scale)) : rnd1(scale);
    return v;
}

template <typename T> static T *to_device(const std::vector<float> &h)
{
    std::vector<T> t(h.size());
    for (size_t i = 0; i < h.size(); i++) t[i] = (T)h[i];
    T *d;
    cudaCheck(cudaMalloc(&d, std::max<size_t>(1, h.size()) * sizeof(T)));
    cudaCheck(cudaMemcpy(d, t.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

template <typename T> static std::vector<float> from_device(const T *d, size_t n)
{
    std::vector<T> t(n);
    cudaCheck(cudaMemcpy(t.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    std::vector<float> h(n);
    for (size_t i = 0; i < n; i++) h[i] = (float)t[i];
    return h;
}

/* 0xFF bytes: NaN in f32 and bf16, so an unwritten element fails validation */
static inline void poison(void *d, size_t bytes)
{
    cudaCheck(cudaMemset(d, 0xff, bytes));
}

/* max |got - want| / max |want|; NaN anywhere gives NaN */
static inline double max_rel_err(const std::vector<float> &got, const std::vector<double> &want)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < got.size(); i++) {
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= num)) num = d;
        den = std::max(den, fabs(want[i]));
    }
    return den > 0 ? num / den : num;
}

static inline bool validate(const char *what, const std::vector<float> &got,
                            const std::vector<double> &want, double tol, double *err_out)
{
    double e = max_rel_err(got, want);
    bool ok = e <= tol;
    printf("  validate %-40s max_rel_err %.3e (tol %.0e) %s\n", what, e, tol, ok ? "ok" : "FAIL");
    if (!ok) g_failures++;
    if (err_out) *err_out = std::max(*err_out, std::isnan(e) ? INFINITY : e);
    return ok;
}

/* Median time in microseconds of `reps` runs of f() after 3 warm-ups, timed with events. */
template <typename F> static double time_us(F f)
{
    for (int i = 0; i < 3; i++) f();
    cudaCheck(cudaDeviceSynchronize());
    std::vector<float> ms;
    cudaEvent_t a, b;
    cudaCheck(cudaEventCreate(&a));
    cudaCheck(cudaEventCreate(&b));
    for (int i = 0; i < g_reps; i++) {
        cudaCheck(cudaEventRecord(a));
        f();
        cudaCheck(cudaEventRecord(b));
        cudaCheck(cudaEventSynchronize(b));
        float t;
        cudaCheck(cudaEventElapsedTime(&t, a, b));
        ms.push_back(t);
    }
    cudaCheck(cudaGetLastError());
    cudaCheck(cudaEventDestroy(a));
    cudaCheck(cudaEventDestroy(b));
    std::sort(ms.begin(), ms.end());
    return 1000.0 * ms[ms.size() / 2];
}

static inline void result(const char *kernel, const char *variant, const char *shape, double us,
                          const char *rate_unit, double rate, double err, bool ok)
{
    printf("RESULT %s %s %s time_us=%.1f %s=%.1f err=%.2e %s\n", kernel, variant, shape, us,
           rate_unit, rate, err, ok ? "ok" : "FAIL");
    fflush(stdout);
}

/* blocks for n items at per_block items per block (at least 1, capped for grid-stride loops) */
static inline unsigned cuda_grid(int64_t n, int64_t per_block)
{
    int64_t b = (n + per_block - 1) / per_block;
    return (unsigned)std::min<int64_t>(std::max<int64_t>(b, 1), 1 << 20);
}

static inline void dev_header(const char *name)
{
    int dev = 0;
    cudaDeviceProp p;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaGetDeviceProperties(&p, dev));
    printf("== %s on %s (sm_%d%d, %d SMs)\n", name, p.name, p.major, p.minor,
           p.multiProcessorCount);
}

#endif
