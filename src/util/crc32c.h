/* crc32c.h — CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, initial and final XOR
 * 0xFFFFFFFF), the checksum of TFRecord framing (train/tfevents.h). Debian has no C library for it
 * (python3-crc32c only), so it is the table-driven loop. Check value: "123456789" -> 0xE3069283.
 */
#ifndef TANDEM_UTIL_CRC32C_H
#define TANDEM_UTIL_CRC32C_H
#include <stddef.h>
#include <stdint.h>

uint32_t tdm_crc32c(const void *data, size_t n);

#endif
