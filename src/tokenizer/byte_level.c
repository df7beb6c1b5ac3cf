/* byte_level.c — the GPT-2 byte alphabet (see byte_level.h). */
#include "tokenizer/byte_level.h"

#include <stdbool.h>

static bool printable_latin1(unsigned b)
{
    return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
}

uint32_t tdm_byte_level_char(uint8_t b)
{
    if (printable_latin1(b)) return b;
    /* n = how many non-printable bytes come before b */
    unsigned n = 0;
    for (unsigned i = 0; i < b; i++)
        n += !printable_latin1(i);
    return 256 + n;
}

int tdm_byte_level_byte(uint32_t cp)
{
    if (cp < 256) return printable_latin1(cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1;
    unsigned n = cp - 256;
    for (unsigned b = 0; b < 256; b++)
        if (!printable_latin1(b) && n-- == 0) return (int)b;
    return -1;
}

/* The table is tiny and built once; both directions are a lookup after that. */
static uint16_t char_of[256];
static int16_t byte_of[256 + 68];
static bool tables_ready;

static void build_tables(void)
{
    unsigned n = 0;
    for (unsigned b = 0; b < 256; b++) {
        char_of[b] = printable_latin1(b) ? (uint16_t)b : (uint16_t)(256 + n++);
    }
    for (unsigned c = 0; c < 256 + 68; c++)
        byte_of[c] = -1;
    for (unsigned b = 0; b < 256; b++)
        byte_of[char_of[b]] = (int16_t)b;
    __atomic_store_n(&tables_ready, true, __ATOMIC_RELEASE);
}

static void ensure_tables(void)
{
    /* Racing builders write identical values, so a benign double build is harmless. */
    if (!__atomic_load_n(&tables_ready, __ATOMIC_ACQUIRE)) build_tables();
}

size_t tdm_byte_level_encode(const uint8_t *bytes, size_t n, char *out)
{
    ensure_tables();
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned c = char_of[bytes[i]];
        if (c < 0x80) {
            out[o++] = (char)c;
        } else {
            out[o++] = (char)(0xc0 | (c >> 6));
            out[o++] = (char)(0x80 | (c & 0x3f));
        }
    }
    return o;
}

long tdm_byte_level_decode(const char *text, size_t n, uint8_t *out)
{
    ensure_tables();
    const uint8_t *s = (const uint8_t *)text;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        unsigned c;
        if (s[i] < 0x80) {
            c = s[i++];
        } else if ((s[i] & 0xe0) == 0xc0 && i + 1 < n && (s[i + 1] & 0xc0) == 0x80) {
            c = (unsigned)(s[i] & 0x1f) << 6 | (s[i + 1] & 0x3f);
            i += 2;
            if (c < 0x80) return -1; /* overlong */
        } else {
            return -1; /* 3- and 4-byte characters are never in the alphabet */
        }
        if (c >= 256 + 68 || byte_of[c] < 0) return -1;
        out[o++] = (uint8_t)byte_of[c];
    }
    return (long)o;
}
