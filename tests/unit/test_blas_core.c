/* Unit tests of engine/cpu/blas_core: which OpenBLAS kernel set is forced on a CPU OpenBLAS did
 * not recognize, and the note that names it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cpu/blas_core.h"

static const unsigned AVX512 = TDM_CPU_AVX | TDM_CPU_AVX2_FMA | TDM_CPU_AVX512;
static const unsigned AVX2 = TDM_CPU_AVX | TDM_CPU_AVX2_FMA;

static void test_fallback_cores_upgraded(void **state)
{
    (void)state;
    /* the case seen on the GPU machine's host: Prescott on an AVX-512 Xeon */
    assert_string_equal(tdm_blas_core_upgrade("Prescott", AVX512), "SkylakeX");
    assert_string_equal(tdm_blas_core_upgrade("prescott", AVX512), "SkylakeX");
    assert_string_equal(tdm_blas_core_upgrade("Nehalem", AVX2), "Haswell");
    assert_string_equal(tdm_blas_core_upgrade("Barcelona", AVX2), "Haswell");
    assert_string_equal(tdm_blas_core_upgrade("Core2", TDM_CPU_AVX), "Sandybridge");
    /* a pre-AVX CPU keeps its pre-AVX kernels */
    assert_null(tdm_blas_core_upgrade("Prescott", 0));
}

static void test_avx2_cores_upgraded_on_avx512(void **state)
{
    (void)state;
    /* OpenBLAS 0.3.21's AVX2 kernels on an AVX-512 CPU it does not know (the development VM's
     * Zen 5 EPYC and the H100 machine's host: Haswell) */
    assert_string_equal(tdm_blas_core_upgrade("Haswell", AVX512), "SkylakeX");
    assert_string_equal(tdm_blas_core_upgrade("zen", AVX512), "SkylakeX");
    /* without AVX-512 they are the best there is */
    assert_null(tdm_blas_core_upgrade("Haswell", AVX2));
    assert_null(tdm_blas_core_upgrade("Zen", AVX2));
}

static void test_recognized_cores_kept(void **state)
{
    (void)state;
    /* an AVX-512 core OpenBLAS named stands, and so do AVX sets it chose for a CPU of that class */
    const char *kept[] = {"SkylakeX", "Cooperlake", "SapphireRapids", "Sandybridge", "Excavator"};
    for (size_t i = 0; i < sizeof kept / sizeof *kept; i++)
        assert_null(tdm_blas_core_upgrade(kept[i], AVX512));
    assert_null(tdm_blas_core_upgrade(NULL, AVX512));
}

static void test_this_cpu(void **state)
{
    (void)state;
    /* in this process OpenBLAS has loaded with the kernels the command would keep or force:
     * after the upgrade (or with none needed) the core is not a fallback on this CPU */
    const char *core = openblas_get_corename();
    assert_non_null(core);
    const char *up = tdm_blas_core_upgrade(core, tdm_blas_cpu_features());
    if (getenv("OPENBLAS_CORETYPE") == NULL && up)
        skip(); /* unit tests do not re-execute; the CLI does (integration.finetune) */
    const char *note = tdm_blas_core_note();
    assert_non_null(strstr(note, "OpenBLAS core "));
    assert_non_null(strstr(note, core));
}

static void test_note_names_a_weak_core_from_the_environment(void **state)
{
    (void)state;
    /* OpenBLAS has loaded with whatever OPENBLAS_CORETYPE said; the note names a better set only
     * where the environment set the core and this CPU can run a better one */
    const char *core = openblas_get_corename();
    const char *better = tdm_blas_core_upgrade(core, tdm_blas_cpu_features());
    const char *env = getenv("OPENBLAS_CORETYPE");
    const char *note = tdm_blas_core_note();
    if (env && better) {
        assert_non_null(strstr(note, "in the environment"));
        assert_non_null(strstr(note, better));
    } else {
        assert_null(strstr(note, "in the environment"));
    }
}

static void test_note_names_forced_core(void **state)
{
    (void)state;
    setenv(TDM_BLAS_CORE_FROM_ENV, "Prescott", 1);
    const char *note = tdm_blas_core_note();
    assert_non_null(strstr(note, "(forced: it picked Prescott on this CPU)"));
    unsetenv(TDM_BLAS_CORE_FROM_ENV);
    assert_null(strstr(tdm_blas_core_note(), "forced"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fallback_cores_upgraded),
        cmocka_unit_test(test_avx2_cores_upgraded_on_avx512),
        cmocka_unit_test(test_recognized_cores_kept),
        cmocka_unit_test(test_this_cpu),
        cmocka_unit_test(test_note_names_a_weak_core_from_the_environment),
        cmocka_unit_test(test_note_names_forced_core),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
