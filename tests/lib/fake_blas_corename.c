/* fake_blas_corename.c — LD_PRELOADed by integration.blas_core: OpenBLAS as it loads on a CPU it
 * does not recognize. openblas_get_corename() answers "Prescott" (the fallback seen on the GPU
 * machine's VM host) unless OPENBLAS_CORETYPE is set, which OpenBLAS would then honour: so the
 * `tandem` command's re-execution (src/main.c) is exercised on any CPU with AVX. */
#include <stdlib.h>

char *openblas_get_corename(void); /* OpenBLAS's own declaration (cblas.h) */

char *openblas_get_corename(void)
{
    char *forced = getenv("OPENBLAS_CORETYPE");
    return forced && *forced ? forced : (char *)"Prescott";
}
