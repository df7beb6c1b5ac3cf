/* byte_level.h — the GPT-2 "byte-level" alphabet: every byte 0..255 has one printable Unicode
 * character standing for it. Bytes that are printable Latin-1 ('!'..'~', U+00A1..U+00AC,
 * U+00AE..U+00FF) stand for themselves; the other 68 bytes take U+0100, U+0101, ... in byte
 * order (so ' ' (0x20) is 'Ġ' U+0120 and '\n' is 'Ċ' U+010A). Vocabulary strings of byte-level
 * BPE tokenizers are written in this alphabet.
 */
#ifndef TANDEM_TOKENIZER_BYTE_LEVEL_H
#define TANDEM_TOKENIZER_BYTE_LEVEL_H
#include <stddef.h>
#include <stdint.h>

/* The code point standing for byte b. */
uint32_t tdm_byte_level_char(uint8_t b);
/* The byte a code point stands for, or -1 when cp is not in the alphabet. */
int tdm_byte_level_byte(uint32_t cp);
/* Writes the alphabet form of bytes[0..n) to out as UTF-8 (each byte becomes 1 or 2 bytes, so
 * out must hold 2*n bytes). Returns the bytes written. */
size_t tdm_byte_level_encode(const uint8_t *bytes, size_t n, char *out);
/* Reverse of tdm_byte_level_encode: decodes UTF-8 text in the alphabet into bytes (out must hold
 * n bytes). Returns the bytes written, or -1 when text holds a character outside the alphabet or
 * malformed UTF-8 (out is then unspecified). */
long tdm_byte_level_decode(const char *text, size_t n, uint8_t *out);

#endif
