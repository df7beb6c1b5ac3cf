/* cpu_linears.c — the CPU backend's frozen-projection GEMMs alone, at a training step's shapes.
 *
 *     bench_cpu_linears [--rows 1024] [--threads 0] [--reps 10] [--shapes OUTxIN,...]
 *                       [--row-major | --nf4 | --lm-head]
 *     bench_cpu_linears --peak [--threads 0]
 *
 * For each weight shape (default: Qwen2.5-0.5B's projections, 896x896 q/o, 128x896 k/v,
 * 4864x896 gate/up, 896x4864 down) times tdm_be_linear_fwd (Y = X W^T) and tdm_be_linear_bwd
 * (dX = dY W) of ROWS rows through the CPU backend, f32 weights: median of REPS after 2 untimed
 * calls, in ms and TFLOP/s, then the step's frozen GEMMs in all (q, k, v, o, gate, up, down
 * forward and backward, weighted by how often a layer runs each). The weights are laid out as
 * the model lays them out at load (tdm_be_lay_out_frozen: the forward's panels), unless
 * --row-major (each forward product then lays W out itself, as before that layout), or --nf4
 * (the weights NF4 with double quantization, as --method qlora loads them: each product
 * dequantizes tiles of W's rows). Compare kernels with TANDEM_CPU_PANELS=0 (OpenBLAS tiles)
 * against the default (cpu_panel_gemm.c). --lm-head lays the weights out as the model lays out
 * its lm_head (TDM_BE_FROZEN_LM_HEAD: the forward's panels alone, at any size), e.g.
 * `--shapes 151936x896 --rows 512` for the cross-entropy's logits product of one chunk.
 *
 * --peak: the f32 multiply-add ceiling of this CPU at THREADS threads, no memory traffic: each
 * thread runs 24 independent chains of 16-lane (AVX-512; 8-lane with AVX2) fused multiply-adds,
 * the register blocking of tandem's GEMM kernel, for about half a second; prints GFLOP/s per
 * thread and in all, the rate no f32 GEMM on these cores can pass (what the frozen products'
 * rate is set against in docs/benchmarks.md).
 */
#include <immintrin.h>
#include <omp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/backend.h"
#include "model/nf4.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define MAX_REPS 100

/* ---- --peak: 24 independent FMA chains a thread; each returns the flops it did. The chains'
 * sum goes through an empty asm (a sink the compiler cannot see through), so no chain is
 * dropped; `a` through another each iteration, so the loop is not folded. ---- */
#define PEAK_CHAINS(X)                                                                             \
    X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15) X(16)    \
        X(17) X(18) X(19) X(20) X(21) X(22) X(23)

__attribute__((target("avx512f"))) static double peak_avx512(long iters)
{
#define P512_DECL(i) __m512 c##i = _mm512_set1_ps(1e-3f * (i));
#define P512_FMA(i) c##i = _mm512_fmadd_ps(a, b, c##i);
#define P512_SUM(i) s = _mm512_add_ps(s, c##i);
    PEAK_CHAINS(P512_DECL)
    __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f), s = _mm512_setzero_ps();
    for (long it = 0; it < iters; it++) {
        PEAK_CHAINS(P512_FMA)
        __asm__ volatile("" : "+v"(a));
    }
    PEAK_CHAINS(P512_SUM)
    __asm__ volatile("" : : "v"(s));
    return 24.0 * 16 * 2 * (double)iters;
}

__attribute__((target("avx2,fma"))) static double peak_avx2(long iters)
{
#define P256_DECL(i) __m256 c##i = _mm256_set1_ps(1e-3f * (i));
#define P256_FMA(i) c##i = _mm256_fmadd_ps(a, b, c##i);
#define P256_SUM(i) s = _mm256_add_ps(s, c##i);
    PEAK_CHAINS(P256_DECL)
    __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f), s = _mm256_setzero_ps();
    for (long it = 0; it < iters; it++) {
        PEAK_CHAINS(P256_FMA)
        __asm__ volatile("" : "+x"(a));
    }
    PEAK_CHAINS(P256_SUM)
    __asm__ volatile("" : : "x"(s));
    return 24.0 * 8 * 2 * (double)iters;
}

/* The FMA ceiling at `threads` threads (0: OpenMP's default), printed; 0 on success. */
static int run_peak(int threads)
{
    __builtin_cpu_init();
    bool avx512 = __builtin_cpu_supports("avx512f");
    if (!avx512 && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) {
        fprintf(stderr, "bench_cpu_linears: --peak needs AVX2 + FMA\n");
        return 1;
    }
    int nt = threads > 0 ? threads : omp_get_max_threads();
    long iters = 1000000; /* grown past 0.1 s a round on one thread, then x5: ~0.5 s */
    for (;;) {
        double t0 = now_s();
        avx512 ? peak_avx512(iters) : peak_avx2(iters);
        if (now_s() - t0 > 0.1) break;
        iters *= 4;
    }
    iters *= 5;
    double total = 0, t0 = now_s();
#pragma omp parallel num_threads(nt) reduction(+ : total)
    total += avx512 ? peak_avx512(iters) : peak_avx2(iters);
    double secs = now_s() - t0;
    printf("# FMA peak, %s, %d threads: %.1f GFLOP/s a thread, %.3f TFLOP/s in all (%.2f s)\n",
           avx512 ? "AVX-512" : "AVX2", nt, total / secs / nt / 1e9, total / secs / 1e12, secs);
    return 0;
}

/* median seconds of one call of linear_fwd (bwd false) or linear_bwd */
static double time_linear(tdm_backend *be, const tdm_be_weight *w, int64_t m, bool bwd,
                          const void *in, void *out, int reps)
{
    double t[MAX_REPS];
    tdm_error err = {0};
    for (int i = 0; i < reps + 2; i++) {
        double t0 = now_s();
        tdm_status st = bwd ? tdm_be_linear_bwd(be, w, in, m, out, 0.0f, &err)
                            : tdm_be_linear_fwd(be, w, in, m, out, 0.0f, &err);
        if (st != TDM_OK) {
            fprintf(stderr, "bench_cpu_linears: %s\n", err.message);
            exit(1);
        }
        if (i >= 2) t[i - 2] = now_s() - t0;
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_double);
    return reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
}

int main(int argc, char **argv)
{
    int64_t m = 1024;
    int threads = 0, reps = 10;
    const char *shapes = "896x896,128x896,4864x896,896x4864";
    /* how many of each shape a Qwen2.5 layer has: q+o, k+v, gate+up, down */
    int per_layer[] = {2, 2, 2, 1};
    bool row_major = false, nf4 = false, peak = false, lm_head = false;
    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i];
        if (!strcmp(opt, "--row-major")) {
            row_major = true;
            continue;
        }
        if (!strcmp(opt, "--nf4")) {
            nf4 = true;
            continue;
        }
        if (!strcmp(opt, "--lm-head")) {
            lm_head = true;
            continue;
        }
        if (!strcmp(opt, "--peak")) {
            peak = true;
            continue;
        }
        if (strcmp(opt, "--rows") && strcmp(opt, "--threads") && strcmp(opt, "--reps") &&
            strcmp(opt, "--shapes")) {
            fprintf(stderr, "bench_cpu_linears: unknown option %s\n", opt);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "bench_cpu_linears: %s needs a value\n", opt);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(opt, "--rows"))
            m = atoll(v);
        else if (!strcmp(opt, "--threads"))
            threads = atoi(v);
        else if (!strcmp(opt, "--reps"))
            reps = atoi(v);
        else
            shapes = v, per_layer[0] = per_layer[1] = per_layer[2] = per_layer[3] = 1;
    }
    if (reps < 1 || reps > MAX_REPS || m < 1) {
        fprintf(stderr, "bench_cpu_linears: --reps 1..%d, --rows >= 1\n", MAX_REPS);
        return 2;
    }
    if (peak) return run_peak(threads);
    tdm_backend *be;
    tdm_error err = {0};
    tdm_backend_opts opts = {.n_threads = threads};
    if (tdm_backend_create(&be, "cpu", &opts, &err) != TDM_OK) {
        fprintf(stderr, "bench_cpu_linears: %s\n", err.message);
        return 1;
    }
    const char *panels = getenv("TANDEM_CPU_PANELS");
    printf("# rows %lld, TANDEM_CPU_PANELS=%s, weights %s\n", (long long)m,
           panels ? panels : "(unset)",
           nf4         ? "NF4 (double quantization)"
           : row_major ? "row-major"
           : lm_head   ? "laid out as the model's lm_head"
                       : "laid out as the model does");
    printf("%-12s %10s %8s %10s %8s\n", "out x in", "fwd ms", "TFLOP/s", "bwd ms", "TFLOP/s");
    double layer_s = 0, layer_flop = 0;
    char *list = strdup(shapes);
    int idx = 0;
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ","), idx++) {
        long long rows, cols;
        if (sscanf(tok, "%lldx%lld", &rows, &cols) != 2 || rows < 1 || cols < 1) {
            fprintf(stderr, "bench_cpu_linears: bad shape %s (want OUTxIN)\n", tok);
            return 2;
        }
        void *w = NULL, *x = NULL, *y = NULL;
        int64_t big = (m * cols > m * rows ? m * cols : m * rows);
        if (tdm_be_alloc(be, TDM_BE_F32, rows * cols, &w, &err) != TDM_OK ||
            tdm_be_alloc(be, TDM_BE_F32, big, &x, &err) != TDM_OK ||
            tdm_be_alloc(be, TDM_BE_F32, big, &y, &err) != TDM_OK ||
            tdm_be_fill(be, w, TDM_BE_F32, rows * cols, 0.01f, &err) != TDM_OK ||
            tdm_be_fill(be, x, TDM_BE_F32, big, 0.5f, &err) != TDM_OK) {
            fprintf(stderr, "bench_cpu_linears: %s\n", err.message);
            return 1;
        }
        tdm_be_weight wt = {.format = TDM_BE_W_F32, .rows = rows, .cols = cols, .data = w};
        tdm_nf4 q = {0};
        if (nf4) { /* the CPU backend's memory is the host's: the quantized arrays as they are */
            float *host = malloc((size_t)(rows * cols) * sizeof(float));
            if (!host) return 1;
            for (int64_t e = 0; e < rows * cols; e++) /* varied codes, as a real weight's */
                host[e] = (float)((e * 2654435761u) % 2001) * 1e-5f - 0.01f;
            if (tdm_nf4_quantize(host, rows * cols, true, &q, &err) != TDM_OK) {
                fprintf(stderr, "bench_cpu_linears: %s\n", err.message);
                return 1;
            }
            free(host);
            wt = (tdm_be_weight){.format = TDM_BE_W_NF4_DQ, .rows = rows, .cols = cols,
                                 .codes = q.packed, .absmax_q = q.absmax_q,
                                 .absmax2 = q.absmax2, .offset = q.offset};
        } else if (!row_major &&
                   tdm_be_lay_out_frozen(be, &wt,
                                         lm_head ? TDM_BE_FROZEN_LM_HEAD : TDM_BE_FROZEN_PROJECTION,
                                         &err) != TDM_OK) {
            fprintf(stderr, "bench_cpu_linears: %s\n", err.message);
            return 1;
        }
        double flop = 2.0 * (double)m * (double)rows * (double)cols;
        double f = time_linear(be, &wt, m, false, x, y, reps);
        double b = time_linear(be, &wt, m, true, x, y, reps);
        printf("%-12s %10.3f %8.3f %10.3f %8.3f\n", tok, 1e3 * f, flop / f / 1e12, 1e3 * b,
               flop / b / 1e12);
        int times = idx < 4 ? per_layer[idx] : 1;
        layer_s += times * (f + b), layer_flop += times * 2 * flop;
        tdm_be_free(be, w), tdm_be_free(be, x), tdm_be_free(be, y);
        tdm_nf4_free(&q);
    }
    printf("# a layer's frozen GEMMs, forward + backward: %.3f ms, %.3f TFLOP/s\n", 1e3 * layer_s,
           layer_flop / layer_s / 1e12);
    free(list);
    tdm_backend_free(be);
    return 0;
}
