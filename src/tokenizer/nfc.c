/* Unicode NFC (UAX #15), for tokenizers whose normalizer is NFC (Qwen 2/3).
 *
 * Canonical decomposition (recursive, Hangul algorithmic), canonical ordering of
 * combining marks (stable, by combining class), then canonical composition (each
 * mark composes with the last starter unless blocked). Tables come from
 * nfc_tables.h (generated). Bytes that are not valid UTF-8 pass through unchanged
 * as starters that compose with nothing. Text with no code point at or above U+0300
 * is already NFC (nothing there decomposes differently or combines), so it is
 * returned as is without work. */
#include "tokenizer/tok_internal.h"

#include "base/utf8.h"

#include <stdlib.h>
#include <string.h>

#include "tokenizer/nfc_tables.h"

/* An invalid byte b, carried through as a code point that is none. */
#define NFC_RAW_BYTE 0x80000000u

enum {
    HANGUL_S = 0xac00,
    HANGUL_L = 0x1100,
    HANGUL_V = 0x1161,
    HANGUL_T = 0x11a7,
    HANGUL_L_COUNT = 19,
    HANGUL_V_COUNT = 21,
    HANGUL_T_COUNT = 28,
    HANGUL_N = HANGUL_V_COUNT * HANGUL_T_COUNT,
    HANGUL_S_COUNT = HANGUL_L_COUNT * HANGUL_N,
};

static uint8_t ccc_of(uint32_t cp) {
    if (cp < 0x300 || cp >= NFC_RAW_BYTE) return 0;
    size_t lo = 0, hi = LLMOPT_ARRAY_LEN(nfc_ccc);
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < nfc_ccc[mid][0])
            hi = mid;
        else if (cp > nfc_ccc[mid][1])
            lo = mid + 1;
        else
            return (uint8_t)nfc_ccc[mid][2];
    }
    return 0;
}

static const uint32_t *decomp_of(uint32_t cp) {
    size_t lo = 0, hi = LLMOPT_ARRAY_LEN(nfc_decomp);
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < nfc_decomp[mid][0])
            hi = mid;
        else if (cp > nfc_decomp[mid][0])
            lo = mid + 1;
        else
            return nfc_decomp[mid];
    }
    return NULL;
}

/* The primary composite of (a, b), or 0. */
static uint32_t compose(uint32_t a, uint32_t b) {
    if (a >= HANGUL_L && a < HANGUL_L + HANGUL_L_COUNT && b >= HANGUL_V &&
        b < HANGUL_V + HANGUL_V_COUNT)
        return HANGUL_S + ((a - HANGUL_L) * HANGUL_V_COUNT + (b - HANGUL_V)) * HANGUL_T_COUNT;
    if (a >= HANGUL_S && a < HANGUL_S + HANGUL_S_COUNT && (a - HANGUL_S) % HANGUL_T_COUNT == 0 &&
        b > HANGUL_T && b < HANGUL_T + HANGUL_T_COUNT)
        return a + (b - HANGUL_T);
    size_t lo = 0, hi = LLMOPT_ARRAY_LEN(nfc_comp);
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const uint32_t *e = nfc_comp[mid];
        if (a < e[0] || (a == e[0] && b < e[1]))
            hi = mid;
        else if (a > e[0] || b > e[1])
            lo = mid + 1;
        else
            return e[2];
    }
    return 0;
}

/* Appends the full canonical decomposition of cp (at most 4 code points). */
static size_t decompose(uint32_t cp, uint32_t *out) {
    if (cp >= HANGUL_S && cp < HANGUL_S + HANGUL_S_COUNT) {
        uint32_t s = cp - HANGUL_S, t = s % HANGUL_T_COUNT;
        out[0] = HANGUL_L + s / HANGUL_N;
        out[1] = HANGUL_V + (s % HANGUL_N) / HANGUL_T_COUNT;
        if (!t) return 2;
        out[2] = HANGUL_T + t;
        return 3;
    }
    const uint32_t *d = cp >= 0xc0 && cp < NFC_RAW_BYTE ? decomp_of(cp) : NULL;
    if (!d) {
        out[0] = cp;
        return 1;
    }
    size_t n = decompose(d[1], out);
    if (d[2]) n += decompose(d[2], out + n);
    return n;
}

/* One code point from s[0..n): *k bytes; an invalid sequence is one raw byte. */
static uint32_t next_cp(const uint8_t *s, size_t n, size_t *k) {
    uint8_t c = s[0];
    *k = 1;
    if (c < 0x80) return c;
    size_t len = c >= 0xc2 && c <= 0xdf   ? 2
                 : c >= 0xe0 && c <= 0xef ? 3
                 : c >= 0xf0 && c <= 0xf4 ? 4
                                          : 0;
    if (!len || len > n) return NFC_RAW_BYTE | c;
    uint32_t cp = c & (0xff >> (len + 1));
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return NFC_RAW_BYTE | c;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return NFC_RAW_BYTE | c;
    *k = len;
    return cp;
}

static size_t put_utf8(uint32_t cp, char *out) {
    if (cp >= NFC_RAW_BYTE) {
        out[0] = (char)(cp & 0xff);
        return 1;
    }
    return utf8_put(cp, out);
}

bool tok_nfc_needed(const char *text, size_t len) {
    /* a lead byte of U+0300 or above is 0xcc or more */
    for (size_t i = 0; i < len; i++)
        if ((uint8_t)text[i] >= 0xcc) return true;
    return false;
}

enum llmopt_status tok_nfc(const char *text, size_t len, char **out, size_t *out_len,
                           struct llmopt_err *err) {
    *out = NULL;
    *out_len = 0;
    /* a code point takes at least one byte and decomposes into at most 4 */
    uint32_t *cps = malloc(sizeof *cps * (4 * len + 4));
    if (!cps) return err_set(err, LLMOPT_ERR_NOMEM, "tokenizer: NFC of %zu bytes", len);
    size_t n = 0;
    const uint8_t *s = (const uint8_t *)text;
    for (size_t i = 0, k; i < len; i += k) n += decompose(next_cp(s + i, len - i, &k), cps + n);

    /* canonical ordering: a stable insertion sort of each run of marks */
    for (size_t i = 1; i < n; i++) {
        uint8_t c = ccc_of(cps[i]);
        if (!c) continue;
        uint32_t cp = cps[i];
        size_t j = i;
        while (j > 0 && ccc_of(cps[j - 1]) > c) {
            cps[j] = cps[j - 1];
            j--;
        }
        cps[j] = cp;
    }

    /* composition, in place: m code points kept so far */
    size_t m = 0;
    long starter = -1; /* index in cps[0..m) of the last starter */
    int last_ccc = -1; /* class of the last code point kept after the starter; -1: none */
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = cps[i];
        int c = ccc_of(cp);
        bool blocked = last_ccc != -1 && (last_ccc >= c || last_ccc == 0);
        if (starter >= 0 && !blocked) {
            uint32_t comp = compose(cps[starter], cp);
            if (comp) {
                cps[starter] = comp;
                continue;
            }
        }
        if (c == 0) {
            starter = (long)m;
            last_ccc = -1;
        } else {
            last_ccc = c;
        }
        cps[m++] = cp;
    }

    char *res = malloc(4 * m + 1);
    if (!res) {
        free(cps);
        return err_set(err, LLMOPT_ERR_NOMEM, "tokenizer: NFC of %zu bytes", len);
    }
    size_t k = 0;
    for (size_t i = 0; i < m; i++) k += put_utf8(cps[i], res + k);
    free(cps);
    *out = res;
    *out_len = k;
    return LLMOPT_OK;
}
