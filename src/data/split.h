/* split.h — the deterministic train/validation split.
 *
 * A sample goes to validation when
 *     u = first 8 bytes, big-endian, of SHA-256(seed as 8 bytes little-endian || canonical)
 *     (u >> 11) * 2^-53 < val_split
 * where canonical is the sample's canonical content (format.h: tdm_data_fields_canonical). It
 * depends only on the content and the seed: the same on every machine, whatever the line order,
 * and duplicates of a sample always land on the same side.
 */
#ifndef TANDEM_DATA_SPLIT_H
#define TANDEM_DATA_SPLIT_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The 64-bit split key u above. */
uint64_t tdm_data_split_key(const char *canonical, size_t len, uint64_t seed);
/* True when the sample belongs to the validation set (val_split in [0, 1]). */
bool tdm_data_split_is_val(const char *canonical, size_t len, uint64_t seed, double val_split);

#endif
