/* build_features.h — what this binary was built with, as `tandem --version` reports it.
 *
 * `tandem --version` prints two lines:
 *     tandem 0.1.0
 *     features: cuda            (or: features: cpu-only)
 * and `tandem gpu status --json` carries the same word as "features". `tandem submit` reads the
 * line from every node's tandem (node_probe.h) so that GPU work never goes to a node whose tandem
 * cannot run the CUDA backend.
 */
#ifndef TANDEM_UTIL_BUILD_FEATURES_H
#define TANDEM_UTIL_BUILD_FEATURES_H

/* "cuda" when the CUDA backend is compiled in (TANDEM_HAVE_CUDA), else "cpu-only". */
const char *tdm_build_features(void);

#endif
