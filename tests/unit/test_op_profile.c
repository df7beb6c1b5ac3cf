/* test_op_profile.c — per-op profiling (engine/op_profile.h) on the CPU backend:
 *   - off by default: ops run and nothing is counted (no report);
 *   - on: every op through backend.c is counted once per call, with its time; the report lists
 *     the ops by name with their call counts, sorted by device time (checked on set figures:
 *     measured ones are too close to order reliably), and the window covers them;
 *   - an op that fails its argument checks is not counted (it never reached the backend);
 *   - turning it off drops the figures; on again starts from zero.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/backend_impl.h"
#include "engine/op_profile.h"

static char *report(tdm_backend *be)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    tdm_be_profile_report(be, f);
    fclose(f);
    return buf;
}

/* the call count printed on the row of op `name` (-1 when the row is missing) */
static long calls_of(const char *text, const char *name)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\n  %s ", name);
    const char *p = strstr(text, pat);
    if (!p) return -1;
    return strtol(p + strlen(pat), NULL, 10);
}

static void gemms(tdm_backend *be, int n, float *a, float *c)
{
    tdm_error err = {0};
    tdm_gemm_args g = {.m = 64, .n = 64, .k = 64, .alpha = 1, .a = a, .a_dtype = TDM_BE_F32,
                       .lda = 64, .b = a, .b_dtype = TDM_BE_F32, .ldb = 64, .c = c,
                       .c_dtype = TDM_BE_F32, .ldc = 64, .batch = 1};
    for (int i = 0; i < n; i++) assert_int_equal(tdm_be_gemm(be, &g, &err), TDM_OK);
}

static void test_counts_and_report(void **state)
{
    (void)state;
    tdm_backend *be = NULL;
    tdm_error err = {0};
    assert_int_equal(tdm_backend_create(&be, "cpu", NULL, &err), TDM_OK);
    float *a, *c;
    assert_int_equal(tdm_be_alloc(be, TDM_BE_F32, 64 * 64, (void **)&a, &err), TDM_OK);
    assert_int_equal(tdm_be_alloc(be, TDM_BE_F32, 64 * 64, (void **)&c, &err), TDM_OK);
    assert_int_equal(tdm_be_fill(be, a, TDM_BE_F32, 64 * 64, 0.5f, &err), TDM_OK);

    /* off: nothing counted, no report */
    gemms(be, 2, a, c);
    assert_null(be->prof);
    char *text = report(be);
    assert_true(text == NULL || text[0] == 0);
    free(text);

    assert_int_equal(tdm_be_profile_enable(be, true, &err), TDM_OK);
    gemms(be, 3, a, c);
    assert_int_equal(tdm_be_fill(be, c, TDM_BE_F32, 64 * 64, 1.0f, &err), TDM_OK);
    assert_int_equal(tdm_be_scale(be, c, TDM_BE_F32, 64 * 64, 2.0f, &err), TDM_OK);
    /* a rejected call (lda < k) never reaches the backend: not counted */
    tdm_gemm_args bad = {.m = 4, .n = 4, .k = 8, .alpha = 1, .a = a, .a_dtype = TDM_BE_F32,
                         .lda = 4, .b = a, .b_dtype = TDM_BE_F32, .ldb = 4, .c = c,
                         .c_dtype = TDM_BE_F32, .ldc = 4, .batch = 1};
    assert_int_equal(tdm_be_gemm(be, &bad, &err), TDM_ERR_INVALID);
    assert_int_equal(be->prof->op[TDM_OP_GEMM].calls, 3);
    assert_int_equal(be->prof->op[TDM_OP_FILL].calls, 1);
    assert_int_equal(be->prof->op[TDM_OP_SCALE].calls, 1);
    assert_int_equal(be->prof->depth, 0);
    /* a synchronous backend: device time is the host time, the window their sum */
    double sum = 0;
    for (int i = 0; i < TDM_OP_N_TOP; i++) {
        assert_true(be->prof->op[i].device_ms == be->prof->op[i].host_ms);
        sum += be->prof->op[i].device_ms;
    }
    assert_true(be->prof->op[TDM_OP_GEMM].host_ms > 0);
    /* the same times, added in another order: equal to rounding */
    assert_true(fabs(be->prof->window_ms - sum) <= 1e-9 * sum);

    text = report(be);
    assert_non_null(strstr(text, "op profile (backend cpu)"));
    assert_int_equal(calls_of(text, "gemm"), 3);
    assert_int_equal(calls_of(text, "fill"), 1);
    assert_int_equal(calls_of(text, "scale"), 1);
    assert_int_equal(calls_of(text, "adamw"), -1); /* never called: no row */
    free(text);

    /* sorted by device time, largest first. The measured times cannot decide the order (one
     * preemption during the fill outlasts three 64^3 GEMMs under ASan on a loaded machine), so
     * the figures are set: scale, then gemm, then fill. */
    be->prof->op[TDM_OP_SCALE].device_ms = 3.0;
    be->prof->op[TDM_OP_GEMM].device_ms = 2.0;
    be->prof->op[TDM_OP_FILL].device_ms = 1.0;
    text = report(be);
    const char *scale_row = strstr(text, "\n  scale "), *gemm_row = strstr(text, "\n  gemm "),
               *fill_row = strstr(text, "\n  fill ");
    assert_non_null(scale_row);
    assert_non_null(gemm_row);
    assert_non_null(fill_row);
    assert_true(scale_row < gemm_row);
    assert_true(gemm_row < fill_row);
    free(text);

    /* off drops the figures; on again starts from zero */
    assert_int_equal(tdm_be_profile_enable(be, false, &err), TDM_OK);
    assert_null(be->prof);
    assert_int_equal(tdm_be_profile_enable(be, true, &err), TDM_OK);
    gemms(be, 1, a, c);
    assert_int_equal(be->prof->op[TDM_OP_GEMM].calls, 1);
    assert_int_equal(be->prof->op[TDM_OP_FILL].calls, 0);

    tdm_be_free(be, a);
    tdm_be_free(be, c);
    tdm_backend_free(be); /* frees the profile too (LeakSanitizer checks) */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts_and_report),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
