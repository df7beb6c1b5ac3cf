/* blas_core.c — see blas_core.h. */
#include "engine/cpu/blas_core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cblas.h>

unsigned tdm_blas_cpu_features(void)
{
    unsigned f = 0;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx")) f |= TDM_CPU_AVX;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) f |= TDM_CPU_AVX2_FMA;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl"))
        f |= TDM_CPU_AVX512;
#endif
    return f;
}

const char *tdm_blas_core_upgrade(const char *detected, unsigned features)
{
    /* OpenBLAS's x86 kernel sets older than AVX: what it falls back to on a model it does not
     * know (Prescott for Intel, Barcelona/Opteron for AMD) */
    static const char *const pre_avx[] = {"Prescott", "Core2",     "Penryn",   "Dunnington",
                                          "Nehalem",  "Atom",      "Katmai",   "Coppermine",
                                          "Northwood", "Banias",   "Opteron",  "Opteron_SSE3",
                                          "Barcelona", "Nano",     "Bobcat",   "Athlon"};
    /* its AVX2 kernel sets, which 0.3.21 also picks on AVX-512 CPUs it does not know (an AMD
     * EPYC with Zen 5's 512-bit units: Haswell, 1.6x slower a training step than SkylakeX) */
    static const char *const avx2[] = {"Haswell", "Zen"};
    if (!detected) return NULL;
    int weak = 0;
    for (size_t i = 0; i < sizeof pre_avx / sizeof *pre_avx; i++)
        if (strcasecmp(detected, pre_avx[i]) == 0) weak = 1;
    for (size_t i = 0; i < sizeof avx2 / sizeof *avx2; i++)
        if (strcasecmp(detected, avx2[i]) == 0 && (features & TDM_CPU_AVX512)) weak = 1;
    if (!weak) return NULL;
    if (features & TDM_CPU_AVX512) return "SkylakeX";
    if (features & TDM_CPU_AVX2_FMA) return "Haswell";
    if (features & TDM_CPU_AVX) return "Sandybridge";
    return NULL;
}

const char *tdm_blas_core_note(void)
{
    static char buf[160];
    const char *core = openblas_get_corename();
    const char *from = getenv(TDM_BLAS_CORE_FROM_ENV);
    const char *set = getenv("OPENBLAS_CORETYPE");
    const char *better = set ? tdm_blas_core_upgrade(core, tdm_blas_cpu_features()) : NULL;
    if (from && *from)
        snprintf(buf, sizeof buf, "OpenBLAS core %s (forced: it picked %s on this CPU)",
                 core ? core : "?", from);
    else if (better)
        /* the user's (or the machine's) own setting stands, but it costs: say so once */
        snprintf(buf, sizeof buf,
                 "OpenBLAS core %s (OPENBLAS_CORETYPE=%s in the environment; this CPU runs %s "
                 "kernels, faster: unset it to use them)",
                 core ? core : "?", set, better);
    else
        snprintf(buf, sizeof buf, "OpenBLAS core %s", core ? core : "?");
    return buf;
}
