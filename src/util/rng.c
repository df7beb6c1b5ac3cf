#include "util/rng.h"

#include <math.h>

uint64_t tdm_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

void tdm_rng_seed(tdm_rng *r, uint64_t seed)
{
    uint64_t st = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = tdm_splitmix64(&st);
    r->has_spare = false;
    r->spare = 0;
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t tdm_rng_next(tdm_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double tdm_rng_uniform(tdm_rng *r)
{
    return (double)(tdm_rng_next(r) >> 11) * 0x1p-53;
}

double tdm_rng_normal(tdm_rng *r)
{
    if (r->has_spare) {
        r->has_spare = false;
        return r->spare;
    }
    double u1 = 1.0 - tdm_rng_uniform(r), u2 = tdm_rng_uniform(r);
    double rad = sqrt(-2.0 * log(u1)), ang = 2.0 * M_PI * u2;
    r->spare = rad * sin(ang);
    r->has_spare = true;
    return rad * cos(ang);
}

uint64_t tdm_hash_str(const char *s)
{
    uint64_t h = 0xcbf29ce484222325u;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3u;
    }
    return h;
}
