/* split.c — train/validation assignment by content hash (see split.h). */
#include "data/split.h"

#include "util/sha256.h"

uint64_t tdm_data_split_key(const char *canonical, size_t len, uint64_t seed)
{
    uint8_t s[8], d[TDM_SHA256_DIGEST_LEN];
    for (int i = 0; i < 8; i++)
        s[i] = (uint8_t)(seed >> (8 * i));
    tdm_sha256 h;
    tdm_sha256_init(&h);
    tdm_sha256_update(&h, s, sizeof s);
    tdm_sha256_update(&h, canonical, len);
    tdm_sha256_final(&h, d);
    uint64_t u = 0;
    for (int i = 0; i < 8; i++)
        u = u << 8 | d[i];
    return u;
}

bool tdm_data_split_is_val(const char *canonical, size_t len, uint64_t seed, double val_split)
{
    if (val_split <= 0) return false;
    double x = (double)(tdm_data_split_key(canonical, len, seed) >> 11) * 0x1p-53;
    return x < val_split;
}
