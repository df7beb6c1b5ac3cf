/* sha256.c — SHA-256 as FIPS 180-4 section 6.2 specifies it (see sha256.h). */
#include "util/sha256.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "util/regular_file.h"

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t rotr(uint32_t x, int n)
{
    return (x >> n) | (x << (32 - n));
}

/* Processes one 64-byte block (FIPS 180-4 6.2.2). */
static void compress(uint32_t h[8], const uint8_t *p)
{
    uint32_t w[64];
    for (int t = 0; t < 16; t++)
        w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 |
               (uint32_t)p[4 * t + 2] << 8 | (uint32_t)p[4 * t + 3];
    for (int t = 16; t < 64; t++) {
        uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
        uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
        w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int t = 0; t < 64; t++) {
        uint32_t t1 =
            k + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[t] + w[t];
        uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += k;
}

void tdm_sha256_init(tdm_sha256 *s)
{
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof h0);
    s->n_bytes = 0;
    s->block_len = 0;
}

void tdm_sha256_update(tdm_sha256 *s, const void *data, size_t len)
{
    const uint8_t *p = data;
    s->n_bytes += len;
    if (s->block_len) {
        size_t take = 64 - s->block_len < len ? 64 - s->block_len : len;
        memcpy(s->block + s->block_len, p, take);
        s->block_len += take;
        p += take;
        len -= take;
        if (s->block_len < 64) return;
        compress(s->h, s->block);
        s->block_len = 0;
    }
    for (; len >= 64; p += 64, len -= 64)
        compress(s->h, p);
    memcpy(s->block, p, len);
    s->block_len = len;
}

void tdm_sha256_final(tdm_sha256 *s, uint8_t digest[TDM_SHA256_DIGEST_LEN])
{
    uint64_t bits = s->n_bytes * 8;
    s->block[s->block_len++] = 0x80;
    if (s->block_len > 56) {
        memset(s->block + s->block_len, 0, 64 - s->block_len);
        compress(s->h, s->block);
        s->block_len = 0;
    }
    memset(s->block + s->block_len, 0, 56 - s->block_len);
    for (int i = 0; i < 8; i++)
        s->block[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
    compress(s->h, s->block);
    for (int i = 0; i < 8; i++) {
        digest[4 * i] = (uint8_t)(s->h[i] >> 24);
        digest[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
        digest[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
        digest[4 * i + 3] = (uint8_t)s->h[i];
    }
    memset(s, 0, sizeof *s);
}

void tdm_sha256_buf(const void *data, size_t len, uint8_t digest[TDM_SHA256_DIGEST_LEN])
{
    tdm_sha256 s;
    tdm_sha256_init(&s);
    tdm_sha256_update(&s, data, len);
    tdm_sha256_final(&s, digest);
}

void tdm_sha256_tagged(const uint8_t digest[TDM_SHA256_DIGEST_LEN], char out[TDM_SHA256_TAGGED_LEN])
{
    static const char hex[] = "0123456789abcdef";
    memcpy(out, "sha256:", 7);
    for (int i = 0; i < TDM_SHA256_DIGEST_LEN; i++) {
        out[7 + 2 * i] = hex[digest[i] >> 4];
        out[8 + 2 * i] = hex[digest[i] & 15];
    }
    out[7 + 64] = 0;
}

tdm_status tdm_sha256_file(const char *path, char out[TDM_SHA256_TAGGED_LEN], tdm_error *err)
{
    FILE *f;
    tdm_status ost = tdm_fopen_regular(path, &f, err);
    if (ost != TDM_OK) return ost;
    tdm_sha256 s;
    tdm_sha256_init(&s);
    uint8_t buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        tdm_sha256_update(&s, buf, n);
    int bad = ferror(f), e = errno;
    fclose(f);
    if (bad) return tdm_fail_errno(err, TDM_ERR_IO, e, "%s: read error", path);
    uint8_t d[TDM_SHA256_DIGEST_LEN];
    tdm_sha256_final(&s, d);
    tdm_sha256_tagged(d, out);
    return TDM_OK;
}
