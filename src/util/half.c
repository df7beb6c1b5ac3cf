#include "util/half.h"

#include <string.h>

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t tdm_f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep the sign, force a quiet payload bit */
        return (uint16_t)((u >> 16) | 0x0040u);
    /* Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate. Carries into
     * the exponent are correct (they round up to the next binade or to infinity). */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float tdm_bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

uint16_t tdm_f32_to_f16(float f)
{
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) /* NaN */
        return (uint16_t)(sign | 0x7e00u | ((abs >> 13) & 0x03ffu));
    if (abs >= 0x477ff000u) /* >= 65520 rounds to infinity (65504 is the largest finite f16) */
        return (uint16_t)(sign | 0x7c00u);
    int32_t exp = (int32_t)(abs >> 23) - 127; /* unbiased f32 exponent */
    uint32_t mant = abs & 0x007fffffu;
    if (exp >= -14) { /* normal f16 */
        uint32_t h = ((uint32_t)(exp + 15) << 10) | (mant >> 13);
        uint32_t rest = mant & 0x1fffu; /* the 13 dropped bits */
        if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
            h++; /* may carry into the exponent: still correct */
        return (uint16_t)(sign | h);
    }
    if (exp < -25) /* below half the smallest subnormal (2^-24): rounds to zero */
        return sign;
    /* Subnormal f16: value = m * 2^-24 with m < 1024. The f32 value is (1.mant) * 2^exp, so
     * m = (0x800000 | mant) >> (-exp - 1) with round to nearest even on the dropped bits. */
    uint32_t full = 0x00800000u | mant;
    int shift = -exp - 1; /* 14 .. 24 */
    uint32_t m = full >> shift;
    uint32_t rest = full & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (m & 1u)))
        m++;
    return (uint16_t)(sign | m);
}

float tdm_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x03ffu;
    if (exp == 0x1f) /* inf or NaN */
        return bits_f32(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
        if (mant == 0)
            return bits_f32(sign);
        /* Subnormal: mant * 2^-24, exact in f32. */
        float v = (float)mant * 0x1p-24f;
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

void tdm_bf16_to_f32_n(const uint16_t *in, float *out, size_t n)
{
    /* a shift a value: vectorized, as the CPU backend's bf16 weights are widened here a tile at
     * a time inside their products (cpu_panel_gemm.c) */
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        out[i] = tdm_bf16_to_f32(in[i]);
}

void tdm_f32_to_bf16_n(const float *in, uint16_t *out, size_t n)
{
    /* threaded: every dense weight of a base (embeddings, lm_head: 1 GB at 7B) passes here on
     * its way to a GPU; each element is rounded on its own, whatever the thread count */
#pragma omp parallel for schedule(static) if (n > (1u << 20))
    for (size_t i = 0; i < n; i++)
        out[i] = tdm_f32_to_bf16(in[i]);
}

void tdm_f16_to_f32_n(const uint16_t *in, float *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = tdm_f16_to_f32(in[i]);
}

void tdm_f32_to_f16_n(const float *in, uint16_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = tdm_f32_to_f16(in[i]);
}
