/* rng.h — a small deterministic PRNG: xoshiro256** seeded through splitmix64, with uniform and
 * normal (Box-Muller) draws. The same seed gives the same stream on every machine and compiler
 * (integer arithmetic, then IEEE double; log/sqrt/cos/sin come from libm, whose results for these
 * arguments are correctly rounded or nearly so on glibc).
 *
 *   splitmix64: z = (state += 0x9e3779b97f4a7c15); z = (z ^ z>>30) * 0xbf58476d1ce4e5b9;
 *               z = (z ^ z>>27) * 0x94d049bb133111eb; return z ^ z>>31
 *   xoshiro256**: result = rotl(s1 * 5, 7) * 9; t = s1 << 17; s2 ^= s0; s3 ^= s1; s1 ^= s2;
 *               s0 ^= s3; s2 ^= t; s3 = rotl(s3, 45)   (Blackman & Vigna)
 *   uniform: (next >> 11) * 2^-53, in [0, 1)
 *   normal: u1 = 1 - uniform (in (0, 1]), u2 = uniform; r = sqrt(-2 ln u1);
 *           returns r cos(2 pi u2), then r sin(2 pi u2) on the next call.
 */
#ifndef TANDEM_UTIL_RNG_H
#define TANDEM_UTIL_RNG_H
#include <stdbool.h>
#include <stdint.h>

typedef struct tdm_rng {
    uint64_t s[4];
    bool has_spare;
    double spare;
} tdm_rng;

uint64_t tdm_splitmix64(uint64_t *state);
/* Seeds the four words from splitmix64(seed). */
void tdm_rng_seed(tdm_rng *r, uint64_t seed);
uint64_t tdm_rng_next(tdm_rng *r);
double tdm_rng_uniform(tdm_rng *r);
double tdm_rng_normal(tdm_rng *r);

/* FNV-1a 64 of a string: used to derive a per-tensor stream from a seed and a name. */
uint64_t tdm_hash_str(const char *s);

#endif
