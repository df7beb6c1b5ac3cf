/* cpu_math.h — exp and row sums for the CPU backend's elementwise loops, in plain C that GCC
 * turns into SIMD code at the project's -O2 on the generic x86-64 baseline (SSE2: 4 floats).
 *
 * Why not libm's expf: it is a call per element, which no loop around it can vectorize; SwiGLU
 * (1024 x 4864 elements a layer at a B4 x 256 step), the cross-entropy's softmax (1024 x 151,936
 * a step) and attention's probabilities spent most of their time in it (docs/benchmarks.md,
 * issue 20). Loops that use these helpers carry `#pragma omp simd`: at -O2 GCC 12 vectorizes only
 * loops needing no scalar tail, and the pragma lifts that limit. The vector and the scalar tail
 * compute an element with the same operations (no FMA on the baseline), so a result does not
 * depend on where a thread's share of a loop begins. */
#ifndef TANDEM_ENGINE_CPU_MATH_H
#define TANDEM_ENGINE_CPU_MATH_H
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t cpu_f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float cpu_f32_from_bits(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* e^x in float. Cody-Waite range reduction x = n ln2 + r, |r| <= ln2 / 2, then
 * e^r = 1 + r + r^2 P(r) with P of degree 5 (Cephes expf's minimax coefficients) and the result
 * scaled by 2^n. Accuracy, measured against e^x in double rounded to float over all 2.24e9
 * floats in [-104, 89] (2026-12-05, the 2-core dev VM, GCC 12 -O2; the same with -march=haswell,
 * i.e. with FMA contraction): never more than 1 ulp off, normal and denormal results alike
 * (relative error at most 8.2e-8), and bit-equal to glibc's expf for 99.2 % of those inputs
 * (glibc's is itself within 1 ulp). tests/unit/test_cpu_math.c checks a sample of the range
 * and the special values. Saturation as expf: 0 below -103.97 (and for -inf), +inf above 88.72
 * (and for +inf), NaN for NaN. The rounding of n uses the 1.5 * 2^23 shifter (adding it leaves
 * round(x / ln2) in the low mantissa bits): it needs round-to-nearest and no -ffast-math
 * reassociation, as the build has. */
static inline float cpu_expf(float x)
{
    const float shifter = 12582912.0f; /* 1.5 * 2^23 */
    /* beyond these bounds e^x is 0 or inf in float; the clamp keeps n within [-150, 128], where
     * the two factors 2^n1 2^n2 below are normal floats. NaN passes both comparisons unchanged. */
    x = x < -104.0f ? -104.0f : x;
    x = x > 89.0f ? 89.0f : x;
    float t = x * 1.44269504088896341f + shifter;
    float n = t - shifter;
    /* ln2 = 0.693359375 - 2.12194440e-4 (+ 1e-11): the first part has 9 significant bits, so
     * n times it is exact for |n| < 2^15 */
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    /* 2^n as 2^n1 2^n2 with n1 = floor(n / 2): one factor would leave the normal range for
     * results below 2^-126 (denormals) and at n = 128. Unsigned arithmetic: a NaN's bits make
     * garbage here, which must not be signed overflow (its result is NaN through p anyway). */
    int32_t ni = (int32_t)(cpu_f32_bits(t) - cpu_f32_bits(shifter));
    int32_t n1 = ni >> 1; /* arithmetic shift in GCC and Clang: floor(ni / 2) */
    float s1 = cpu_f32_from_bits((uint32_t)(n1 + 127) << 23);
    float s2 = cpu_f32_from_bits((uint32_t)(ni - n1 + 127) << 23);
    return p * s1 * s2;
}

/* max of x[0..n) (-inf for n 0), a SIMD reduction: max is exact, so any order gives the same
 * value. */
static inline float cpu_max_f32(const float *x, int64_t n)
{
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < n; j++)
        mx = x[j] > mx ? x[j] : mx;
    return mx;
}

/* The fixed number of partial sums of cpu_sum_f64: 8 doubles, two AVX-512 or four SSE2
 * registers. */
#define CPU_SUM_LANES 8

/* sum x[0..n) in double, or with exp_of the sum of cpu_expf(x[j] - shift): element j into
 * partial sum j % CPU_SUM_LANES, the partials then added in lane order, then the tail. The order
 * is fixed by this code, not by the compiler's choice of vector width or alignment peeling, so
 * a row's sum has the same bits wherever the row lies in memory and whichever thread sums it;
 * the lanes let GCC vectorize (one accumulator would be a chain of n dependent additions, 4
 * cycles each). exp_of is a constant at every call: the inlined loop has no branch. */
static inline double cpu_sum_f64(const float *x, int64_t n, bool exp_of, float shift)
{
    double acc[CPU_SUM_LANES] = {0};
    int64_t j = 0;
    for (; j + CPU_SUM_LANES <= n; j += CPU_SUM_LANES)
        for (int k = 0; k < CPU_SUM_LANES; k++)
            acc[k] += (double)(exp_of ? cpu_expf(x[j + k] - shift) : x[j + k]);
    double s = 0;
    for (int k = 0; k < CPU_SUM_LANES; k++)
        s += acc[k];
    for (; j < n; j++)
        s += (double)(exp_of ? cpu_expf(x[j] - shift) : x[j]);
    return s;
}

#endif
