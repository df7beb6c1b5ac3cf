/* Unit tests of train/adamw (reference AdamW, gradient clipping) and train/lr_schedule (HF
 * schedules). Expected numbers were computed by hand / in double precision from torch's and
 * transformers' published formulas (the derivations are in the comments). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "train/adamw.h"
#include "train/lr_schedule.h"

static void assert_close(double got, double want, double rel)
{
    double tol = rel * fmax(1.0, fabs(want));
    if (!(fabs(got - want) <= tol))
        fail_msg("got %.12g, want %.12g (tolerance %.3g)", got, want, tol);
}

/* p = 1, grads 0.5, -0.25, 2.0, lr 0.1, no decay.
 * t=1: m = 0.05, v = 0.00025, m^ = 0.5, v^ = 0.25, p = 1 - 0.1 * 0.5 / (0.5 + 1e-8) = 0.900000002
 * t=2: m = 0.02, v = 0.00031225, bc1 = 0.19, bc2 = 0.001999, p = 0.873366298708
 * t=3: m = 0.218, v = 0.00431193775, p = 0.806301534529 */
static void test_adamw_hand_steps(void **state)
{
    (void)state;
    tdm_adamw_state s;
    tdm_error err = {0};
    assert_int_equal(tdm_adamw_state_init(&s, 1, &err), TDM_OK);
    tdm_adamw_config c = tdm_adamw_defaults();
    float p = 1.0f;
    const float g[3] = {0.5f, -0.25f, 2.0f};
    const double want_p[3] = {0.900000002, 0.873366298708, 0.806301534529};
    const double want_m[3] = {0.05, 0.02, 0.218};
    const double want_v[3] = {0.00025, 0.00031225, 0.00431193775};
    for (int t = 0; t < 3; t++) {
        tdm_adamw_step(&s, &c, 0.1, &p, &g[t]);
        assert_int_equal(s.step, t + 1);
        assert_close(p, want_p[t], 1e-6);
        assert_close(s.m[0], want_m[t], 1e-6);
        assert_close(s.v[0] / want_v[t], 1.0, 1e-5);
    }
    tdm_adamw_state_free(&s);
}

/* Same with weight decay 0.1: p *= 1 - 0.1 * 0.1 = 0.99 before each update.
 * t=1: 0.99 - 0.1 = 0.890000002; t=2: 0.890000002 * 0.99 - 0.026633703 = 0.854466298688;
 * t=3: 0.778856871522. And the moments do not see the decay. */
static void test_adamw_weight_decay(void **state)
{
    (void)state;
    tdm_adamw_state s;
    tdm_error err = {0};
    assert_int_equal(tdm_adamw_state_init(&s, 2, &err), TDM_OK);
    tdm_adamw_config c = tdm_adamw_defaults();
    c.weight_decay = 0.1;
    float p[2] = {1.0f, -2.0f};
    const double want0[3] = {0.890000002, 0.854466298688, 0.778856871522};
    const float g0[3] = {0.5f, -0.25f, 2.0f};
    for (int t = 0; t < 3; t++) {
        float g[2] = {g0[t], 0.0f}; /* element 1: zero gradient, pure decay */
        tdm_adamw_step(&s, &c, 0.1, p, g);
        assert_close(p[0], want0[t], 1e-6);
    }
    /* zero gradient: m = v = 0, update 0 / (0 + eps) = 0: p = -2 * 0.99^3 */
    assert_close(p[1], -2.0 * 0.99 * 0.99 * 0.99, 1e-6);
    assert_true(s.m[1] == 0.0f && s.v[1] == 0.0f);
    tdm_adamw_state_free(&s);
}

/* Bias correction makes the first step's size lr * sign(g) whatever |g| is, and the state
 * carried across calls gives the same result as one long run (resume property). */
static void test_adamw_first_step_and_split(void **state)
{
    (void)state;
    tdm_error err = {0};
    tdm_adamw_config c = tdm_adamw_defaults();
    tdm_adamw_state s;
    assert_int_equal(tdm_adamw_state_init(&s, 4, &err), TDM_OK);
    float p[4] = {0, 0, 0, 0};
    float g[4] = {1e-3f, -7.0f, 123.0f, -0.5f};
    tdm_adamw_step(&s, &c, 0.01, p, g);
    assert_close(p[0], -0.01, 1e-4);
    assert_close(p[1], 0.01, 1e-6);
    assert_close(p[2], -0.01, 1e-6);
    assert_close(p[3], 0.01, 1e-6);
    /* two states stepping the same sequence stay bit-identical */
    tdm_adamw_state a, b;
    assert_int_equal(tdm_adamw_state_init(&a, 4, &err), TDM_OK);
    assert_int_equal(tdm_adamw_state_init(&b, 4, &err), TDM_OK);
    float pa[4] = {1, 2, 3, 4}, pb[4] = {1, 2, 3, 4};
    for (int t = 0; t < 20; t++) {
        float gg[4] = {sinf((float)t), cosf((float)t), 0.1f * (float)t, -1.0f};
        tdm_adamw_step(&a, &c, 1e-3, pa, gg);
        tdm_adamw_step(&b, &c, 1e-3, pb, gg);
    }
    assert_memory_equal(pa, pb, sizeof pa);
    assert_memory_equal(a.v, b.v, 4 * sizeof(float));
    tdm_adamw_state_free(&a);
    tdm_adamw_state_free(&b);
    tdm_adamw_state_free(&s);
}

static void test_adamw_config_check(void **state)
{
    (void)state;
    tdm_error err = {0};
    tdm_adamw_config c = tdm_adamw_defaults();
    assert_int_equal(tdm_adamw_config_check(&c, &err), TDM_OK);
    c.beta2 = 1.0;
    assert_int_equal(tdm_adamw_config_check(&c, &err), TDM_ERR_INVALID);
    c = tdm_adamw_defaults();
    c.eps = 0;
    assert_int_equal(tdm_adamw_config_check(&c, &err), TDM_ERR_INVALID);
    c = tdm_adamw_defaults();
    c.weight_decay = -1;
    assert_int_equal(tdm_adamw_config_check(&c, &err), TDM_ERR_INVALID);
}

/* g = (3, 4): norm 5. max 1: coef = 1 / (5 + 1e-6) -> (0.6, 0.8) * 5/(5+1e-6).
 * max 10: untouched. max 0: off. max exactly the norm: coef = 5 / 5.000001 < 1, so torch
 * scales (by 0.9999998), and so do we. */
static void test_clip_grad_norm(void **state)
{
    (void)state;
    float g[2] = {3.0f, 4.0f};
    double n = tdm_clip_grad_norm(g, 2, 1.0);
    assert_close(n, 5.0, 1e-12);
    assert_close(g[0], 3.0 / (5.0 + 1e-6), 1e-7);
    assert_close(g[1], 4.0 / (5.0 + 1e-6), 1e-7);
    assert_close(tdm_grad_norm(g, 2), 1.0, 1e-6);

    float h[2] = {3.0f, 4.0f};
    assert_close(tdm_clip_grad_norm(h, 2, 10.0), 5.0, 1e-12);
    assert_true(h[0] == 3.0f && h[1] == 4.0f);
    assert_close(tdm_clip_grad_norm(h, 2, 0.0), 5.0, 1e-12);
    assert_true(h[0] == 3.0f && h[1] == 4.0f);
    tdm_clip_grad_norm(h, 2, 5.0);
    assert_true(h[0] < 3.0f && h[1] < 4.0f);
    assert_close(h[0], 3.0 * 5.0 / 5.000001, 1e-7);

    /* a larger vector: the norm over all of it */
    float big[1000];
    for (int i = 0; i < 1000; i++)
        big[i] = (i % 2) ? 0.1f : -0.1f;
    double bn = tdm_clip_grad_norm(big, 1000, 1.0);
    assert_close(bn, sqrt(1000 * 0.01), 1e-6);
    assert_close(tdm_grad_norm(big, 1000), 1.0 * bn / (bn + 1e-6), 1e-6);
}

/* W = 10, T = 100.
 * cosine: s 0 -> 0, 5 -> 0.5, 10 -> 1 (warmup end), 55 -> 0.5 (midpoint: cos(pi/2) = 0),
 *         100 -> 0 (end), 32.5% in (s = 39.25 not integer) -> use s = 37: p = 27/90 = 0.3,
 *         0.5 * (1 + cos(0.3 pi)) = 0.793892626146
 *         past the end HF's formula comes back up: s = 120: p = 110/90, 0.5 (1 + cos(1.2222 pi))
 * linear: 10 -> 1, 55 -> 0.5, 100 -> 0, 120 -> 0 (clamped), 37 -> 63/90 = 0.7
 * constant: warmup then 1. */
static void test_lr_schedules(void **state)
{
    (void)state;
    tdm_lr_schedule s = {TDM_LR_COSINE, 2e-4, 10, 100};
    tdm_error err = {0};
    assert_int_equal(tdm_lr_schedule_check(&s, &err), TDM_OK);
    assert_true(tdm_lr_factor(&s, 0) == 0.0);
    assert_close(tdm_lr_factor(&s, 5), 0.5, 1e-15);
    assert_close(tdm_lr_factor(&s, 10), 1.0, 1e-15);
    assert_close(tdm_lr_factor(&s, 55), 0.5, 1e-15);
    assert_close(tdm_lr_factor(&s, 37), 0.793892626146, 1e-11);
    assert_close(tdm_lr_factor(&s, 100), 0.0, 1e-15);
    assert_close(tdm_lr_factor(&s, 120), 0.5 * (1 + cos(M_PI * 110.0 / 90.0)), 1e-12);
    assert_close(tdm_lr_at(&s, 55), 1e-4, 1e-15);

    s.kind = TDM_LR_LINEAR;
    assert_close(tdm_lr_factor(&s, 3), 0.3, 1e-15);
    assert_close(tdm_lr_factor(&s, 10), 1.0, 1e-15);
    assert_close(tdm_lr_factor(&s, 55), 0.5, 1e-15);
    assert_close(tdm_lr_factor(&s, 37), 0.7, 1e-15);
    assert_true(tdm_lr_factor(&s, 100) == 0.0);
    assert_true(tdm_lr_factor(&s, 120) == 0.0);

    s.kind = TDM_LR_CONSTANT;
    assert_close(tdm_lr_factor(&s, 7), 0.7, 1e-15);
    assert_true(tdm_lr_factor(&s, 10) == 1.0);
    assert_true(tdm_lr_factor(&s, 1000) == 1.0);

    /* no warmup: the first step has the full rate; W = T: max(1, 0) guards the division */
    tdm_lr_schedule c0 = {TDM_LR_COSINE, 1.0, 0, 4};
    assert_true(tdm_lr_factor(&c0, 0) == 1.0);
    assert_close(tdm_lr_factor(&c0, 2), 0.5, 1e-15);
    tdm_lr_schedule ww = {TDM_LR_LINEAR, 1.0, 4, 4};
    assert_close(tdm_lr_factor(&ww, 3), 0.75, 1e-15);
    assert_true(tdm_lr_factor(&ww, 4) == 0.0);

    tdm_lr_kind k;
    assert_int_equal(tdm_lr_kind_parse("linear", &k, &err), TDM_OK);
    assert_int_equal(k, TDM_LR_LINEAR);
    assert_int_equal(tdm_lr_kind_parse("cosine_with_restarts", &k, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.message, "cosine, linear or constant"));
    s.peak_lr = 0;
    assert_int_equal(tdm_lr_schedule_check(&s, &err), TDM_ERR_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw_hand_steps),
        cmocka_unit_test(test_adamw_weight_decay),
        cmocka_unit_test(test_adamw_first_step_and_split),
        cmocka_unit_test(test_adamw_config_check),
        cmocka_unit_test(test_clip_grad_norm),
        cmocka_unit_test(test_lr_schedules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
