/* UTF-8: encoding one code point (the tokenizer's NFC pass and the template engine, each
 * handling its own marker for raw, invalid input bytes first) and the well-formedness
 * rule for a sequence's lead byte (the server's validation of request bodies and the
 * detokenizer's stream decoding). */
#ifndef LLMOPT_BASE_UTF8_H
#define LLMOPT_BASE_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Writes cp (at most U+10FFFF) to out, which has room for 4 bytes; returns the byte
 * count (1 to 4). Surrogates are encoded as they come, not refused. */
static inline size_t utf8_put(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3f));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Unicode's well-formed byte sequences (Table 3-7) seen from a lead byte c >= 0x80:
 * returns the sequence's length (2 to 4), with the allowed range [*lo, *hi] of its second
 * byte (narrower after E0, ED, F0, F4: no overlongs, surrogates or code points past
 * U+10FFFF; every later byte is 80..BF), or 0 for a byte that cannot start a sequence
 * (a continuation byte, C0, C1, F5..FF). */
static inline int utf8_lead(uint8_t c, uint8_t *lo, uint8_t *hi) {
    *lo = 0x80;
    *hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) return 2;
    if (c >= 0xe0 && c <= 0xef) {
        if (c == 0xe0) *lo = 0xa0;
        if (c == 0xed) *hi = 0x9f;
        return 3;
    }
    if (c >= 0xf0 && c <= 0xf4) {
        if (c == 0xf0) *lo = 0x90;
        if (c == 0xf4) *hi = 0x8f;
        return 4;
    }
    return 0;
}

#endif
