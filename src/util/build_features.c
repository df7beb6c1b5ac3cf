/* build_features.c — the build's features word (see build_features.h). */
#include "util/build_features.h"

const char *tdm_build_features(void)
{
#ifdef TANDEM_HAVE_CUDA
    return "cuda";
#else
    return "cpu-only";
#endif
}
