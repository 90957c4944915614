/* UTF-8 encoding of one code point, for the tokenizer's NFC pass and the template
 * engine (each handles its own marker for raw, invalid input bytes first). */
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

#endif
