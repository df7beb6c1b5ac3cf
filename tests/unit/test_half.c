/* Unit tests of util/half: bf16 and f16 conversions, exhaustively where the domain is small and
 * against the compiler's own _Float16 conversion where it has one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "util/half.h"

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void test_bf16_round_to_nearest_even(void **state)
{
    assert_int_equal(tdm_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(tdm_f32_to_bf16(-2.0f), 0xc000);
    assert_int_equal(tdm_f32_to_bf16(from_bits(0x3f808000)), 0x3f80); /* tie, even below */
    assert_int_equal(tdm_f32_to_bf16(from_bits(0x3f818000)), 0x3f82); /* tie, odd: up */
    assert_int_equal(tdm_f32_to_bf16(from_bits(0x3f808001)), 0x3f81); /* above the tie */
    assert_int_equal(tdm_f32_to_bf16(from_bits(0x3f807fff)), 0x3f80);
    assert_int_equal(tdm_f32_to_bf16(from_bits(0x7f7fffff)), 0x7f80); /* FLT_MAX -> inf */
    assert_int_equal(tdm_f32_to_bf16(INFINITY), 0x7f80);
    assert_int_equal(tdm_f32_to_bf16(-0.0f), 0x8000);
    uint16_t nan = tdm_f32_to_bf16(from_bits(0x7f800001)); /* payload only in dropped bits */
    assert_true(isnan(tdm_bf16_to_f32(nan)));
    assert_true(isnan(tdm_bf16_to_f32(tdm_f32_to_bf16(NAN))));
}

/* Every non-NaN bf16 and f16 pattern survives 16 -> 32 -> 16 unchanged. */
static void test_exhaustive_round_trip(void **state)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float b = tdm_bf16_to_f32((uint16_t)h);
        if (!isnan(b))
            assert_int_equal(tdm_f32_to_bf16(b), h);
        float f = tdm_f16_to_f32((uint16_t)h);
        if (!isnan(f))
            assert_int_equal(tdm_f32_to_f16(f), h);
        else
            assert_true(isnan(tdm_f16_to_f32(tdm_f32_to_f16(f))));
    }
}

static void test_f16_edges(void **state)
{
    assert_int_equal(tdm_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(tdm_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(tdm_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(tdm_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(tdm_f32_to_f16(0x1p-24f), 0x0001);
    assert_int_equal(tdm_f32_to_f16(0x1p-25f), 0x0000);        /* tie to even (0) */
    assert_int_equal(tdm_f32_to_f16(0x1.8p-25f), 0x0001);      /* above the tie */
    assert_int_equal(tdm_f32_to_f16(0x1.8p-24f), 0x0002);      /* 1.5 ulp: tie to even (2) */
    assert_int_equal(tdm_f32_to_f16(0x1.ffcp-15f), 0x0400);    /* subnormal rounds to normal */
    assert_int_equal(tdm_f32_to_f16(0x1.ff8p-15f), 0x03ff);    /* largest subnormal */
    assert_int_equal(tdm_f32_to_f16(-0x1p-14f), 0x8400);
    assert_true(tdm_f16_to_f32(0x0001) == 0x1p-24f);
    assert_true(tdm_f16_to_f32(0xfc00) == -INFINITY);
}

#ifdef __FLT16_MAX__
/* The compiler's float -> _Float16 conversion rounds to nearest even too: compare on a dense
 * sweep of f32 bit patterns (every 4099th) plus all patterns near the f16 range's edges. */
static void test_f16_matches_compiler(void **state)
{
    for (uint64_t u = 0; u <= 0xffffffffu; u += 4099) {
        float f = from_bits((uint32_t)u);
        if (isnan(f))
            continue;
        _Float16 h = (_Float16)f;
        uint16_t want;
        memcpy(&want, &h, 2);
        if (tdm_f32_to_f16(f) != want)
            fail_msg("f32 0x%08x: got 0x%04x want 0x%04x", (unsigned)u, tdm_f32_to_f16(f), want);
    }
    for (uint32_t u = 0x33000000u - 70000; u < 0x33000000u + 70000; u++) {
        _Float16 h = (_Float16)from_bits(u);
        uint16_t want;
        memcpy(&want, &h, 2);
        assert_int_equal(tdm_f32_to_f16(from_bits(u)), want);
    }
}
#else
static void test_f16_matches_compiler(void **state)
{
    skip();
}
#endif

static void test_bf16_matches_reference_rounding(void **state)
{
    /* Reference: round through double arithmetic on the value's neighbours. */
    for (uint64_t u = 0; u <= 0xffffffffu; u += 65537) {
        float f = from_bits((uint32_t)u);
        if (isnan(f) || isinf(f))
            continue;
        uint16_t lo = (uint16_t)(u >> 16);
        double a = tdm_bf16_to_f32(lo);
        double b = tdm_bf16_to_f32((uint16_t)(lo + 1));
        if (isinf(b)) /* the next step past the largest finite value is 2^128 */
            b = copysign(0x1p128, b);
        double da = fabs((double)f - a), db = fabs(b - f);
        uint16_t want = da < db ? lo : db < da ? (uint16_t)(lo + 1) : (lo & 1 ? lo + 1 : lo);
        assert_int_equal(tdm_f32_to_bf16(f), want);
    }
    (void)to_bits;
}

static void test_arrays(void **state)
{
    float in[4] = {1.0f, -0.5f, 3.140625f, 0.0f}, out[4];
    uint16_t h[4];
    tdm_f32_to_bf16_n(in, h, 4);
    tdm_bf16_to_f32_n(h, out, 4);
    assert_memory_equal(in, out, sizeof in);
    tdm_f32_to_f16_n(in, h, 4);
    tdm_f16_to_f32_n(h, out, 4);
    assert_memory_equal(in, out, sizeof in);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_round_to_nearest_even),
        cmocka_unit_test(test_exhaustive_round_trip),
        cmocka_unit_test(test_f16_edges),
        cmocka_unit_test(test_f16_matches_compiler),
        cmocka_unit_test(test_bf16_matches_reference_rounding),
        cmocka_unit_test(test_arrays),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
