/* blas_core.h — which OpenBLAS kernel set ("core") this CPU should run.
 *
 * Debian's OpenBLAS is a DYNAMIC_ARCH build: at load it picks a kernel set from the CPU's
 * family and model numbers. Inside some virtual machines (seen: the 16-core host of the GPU
 * machine, a Firecracker VM reporting "Intel(R) Xeon(R) Processor") the model is one it does not
 * know, and it falls back to Prescott, SSE3 kernels 4-8x slower than the AVX-512 ones the CPU
 * runs; on others (an AMD EPYC with AVX-512) it picks its AVX2 kernels. OpenBLAS reads
 * OPENBLAS_CORETYPE only when it loads, so the `tandem` command re-executes itself with it set
 * (src/main.c); this file holds the decision, a pure function, and the note. */
#ifndef TANDEM_ENGINE_CPU_BLAS_CORE_H
#define TANDEM_ENGINE_CPU_BLAS_CORE_H

/* CPU features that decide the kernel set (bits of tdm_blas_cpu_features). */
enum {
    TDM_CPU_AVX = 1u << 0,
    TDM_CPU_AVX2_FMA = 1u << 1, /* AVX2 and FMA3 */
    TDM_CPU_AVX512 = 1u << 2,   /* AVX-512 F, CD, BW, DQ and VL: OpenBLAS's SkylakeX kernels */
};

/* This CPU's features (cpuid, through the compiler's builtins). */
unsigned tdm_blas_cpu_features(void);

/* The OPENBLAS_CORETYPE to force when OpenBLAS picked `detected` (openblas_get_corename()) on a
 * CPU with `features`: "SkylakeX", "Haswell" or "Sandybridge" when `detected` is one of the
 * pre-AVX fallback kernel sets and the CPU can run a better one; "SkylakeX" when it is an AVX2
 * set (Haswell, Zen) on a CPU with AVX-512; NULL when the choice stands (a core it named
 * correctly, or a CPU with nothing better). */
const char *tdm_blas_core_upgrade(const char *detected, unsigned features);

/* Set on the re-executed process: the core OpenBLAS had picked, for the thread note. */
#define TDM_BLAS_CORE_FROM_ENV "TANDEM_OPENBLAS_CORE_FROM"

/* The OpenBLAS core in words for the thread note: "OpenBLAS core SkylakeX", "OpenBLAS core
 * SkylakeX (forced: it picked Prescott on this CPU)", or, where OPENBLAS_CORETYPE in the
 * environment holds a weaker set than tdm_blas_core_upgrade would run, that and the better one
 * (the setting stands). A static buffer. */
const char *tdm_blas_core_note(void);

#endif
