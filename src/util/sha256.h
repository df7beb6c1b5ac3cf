/* sha256.h — SHA-256 (FIPS 180-4), incremental and one-shot, and "sha256:<hex>" file checksums
 * (dataset hashes in metadata.json, file checksums of the cluster layer).
 *
 *     tdm_sha256 h;
 *     tdm_sha256_init(&h);
 *     tdm_sha256_update(&h, data, len);   // any number of times
 *     uint8_t digest[32];
 *     tdm_sha256_final(&h, digest);
 *
 * Pure integer code, the same result on every machine. Messages up to 2^61 - 1 bytes.
 */
#ifndef TANDEM_UTIL_SHA256_H
#define TANDEM_UTIL_SHA256_H
#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

enum {
    TDM_SHA256_DIGEST_LEN = 32,
    /* "sha256:" + 64 hex digits + NUL */
    TDM_SHA256_TAGGED_LEN = 7 + 64 + 1,
};

typedef struct tdm_sha256 {
    uint32_t h[8];     // chaining state
    uint64_t n_bytes;  // message bytes so far
    uint8_t block[64]; // pending partial block
    size_t block_len;  // bytes used in block
} tdm_sha256;

void tdm_sha256_init(tdm_sha256 *s);
void tdm_sha256_update(tdm_sha256 *s, const void *data, size_t len);
/* Pads, writes the 32-byte digest, and leaves s unusable until the next init. */
void tdm_sha256_final(tdm_sha256 *s, uint8_t digest[TDM_SHA256_DIGEST_LEN]);

/* One shot: digest of data[0..len). */
void tdm_sha256_buf(const void *data, size_t len, uint8_t digest[TDM_SHA256_DIGEST_LEN]);

/* Writes "sha256:" and the 64 lower-case hex digits of digest, NUL-terminated, to out. */
void tdm_sha256_tagged(const uint8_t digest[TDM_SHA256_DIGEST_LEN],
                       char out[TDM_SHA256_TAGGED_LEN]);

/* "sha256:<hex>" of a whole file, read in chunks. TDM_ERR_NOT_FOUND / TDM_ERR_IO naming the path.
 */
tdm_status tdm_sha256_file(const char *path, char out[TDM_SHA256_TAGGED_LEN], tdm_error *err);

#endif
