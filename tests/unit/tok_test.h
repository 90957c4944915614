/* Helpers shared by the tokenizer tests (test_tokenizer_bpe.c, test_tokenizer_spm.c):
 * encode into a fresh buffer, decode through tok_decode, a strict UTF-8 check, and a
 * GGUF built in memory (header and kvs, no tensors) to feed malformed vocabularies to
 * tok_vocab_from_gguf. Include after test.h. */
#ifndef LLMOPT_TOK_TEST_H
#define LLMOPT_TOK_TEST_H

#include "format/gguf.h"
#include "tokenizer/tokenizer.h"

#include "test.h"

#include <stdint.h>
#include <string.h>

/* Encodes into a fresh buffer; returns the count or -1 (message printed, *ids_out NULL). */
static inline long encode_ids(const struct tok_vocab *v, const char *s, size_t len, bool bos,
                              bool special, int32_t **ids_out) {
    size_t cap = len + 8, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    struct llmopt_err err = {0};
    if (tok_encode(v, s, len, bos, special, ids, cap, &n, &err) != LLMOPT_OK) {
        fprintf(stderr, "  tok_encode: %s\n", err.msg);
        free(ids);
        *ids_out = NULL;
        return -1;
    }
    *ids_out = ids;
    return (long)n;
}

/* Decodes through tok_decode, sizing first (malloc'd, NUL-terminated). */
static inline char *decode(const struct tok_vocab *v, const int32_t *ids, size_t n, size_t *len) {
    size_t cap = 0;
    struct llmopt_err err = {0};
    enum llmopt_status st = tok_decode(v, ids, n, NULL, 0, &cap, &err);
    CHECK_EQ_INT(st, cap ? LLMOPT_ERR_LIMIT : LLMOPT_OK);
    char *out = malloc(cap + 1);
    size_t got = 0;
    CHECK_EQ_INT(tok_decode(v, ids, n, out, cap, &got, &err), LLMOPT_OK);
    CHECK_EQ_INT(got, cap);
    out[got] = 0;
    *len = got;
    return out;
}

/* Strict UTF-8: no overlongs, surrogates, code points past U+10FFFF or truncation. */
static inline bool utf8_valid(const char *s, size_t n) {
    const uint8_t *p = (const uint8_t *)s;
    for (size_t i = 0; i < n;) {
        uint8_t c = p[i];
        size_t k;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xc2 && c <= 0xdf) {
            k = 1;
            cp = c & 0x1f;
        } else if (c >= 0xe0 && c <= 0xef) {
            k = 2;
            cp = c & 0x0f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            k = 3;
            cp = c & 0x07;
        } else
            return false;
        if (i + k >= n) return false; /* truncated */
        for (size_t j = 1; j <= k; j++) {
            if ((p[i + j] & 0xc0) != 0x80) return false;
            cp = cp << 6 | (p[i + j] & 0x3f);
        }
        if ((k == 2 && cp < 0x800) || (k == 3 && (cp < 0x10000 || cp > 0x10ffff)) ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += k + 1;
    }
    return true;
}

/* A GGUF built in memory: header, then kvs; no tensors. */
struct gguf_builder {
    uint8_t buf[1 << 14];
    size_t n;
    uint64_t n_kv;
};

static inline void put(struct gguf_builder *b, const void *p, size_t n) {
    LLMOPT_ASSERT(b->n + n <= sizeof b->buf);
    memcpy(b->buf + b->n, p, n);
    b->n += n;
}
static inline void put_u32(struct gguf_builder *b, uint32_t x) {
    put(b, &x, 4);
}
static inline void put_u64(struct gguf_builder *b, uint64_t x) {
    put(b, &x, 8);
}
static inline void put_str(struct gguf_builder *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static inline void kv_str(struct gguf_builder *b, const char *key, const char *val) {
    put_str(b, key);
    put_u32(b, GGUF_TYPE_STRING);
    put_str(b, val);
    b->n_kv++;
}
static inline void kv_strs(struct gguf_builder *b, const char *key, const char *const *s,
                           size_t n) {
    put_str(b, key);
    put_u32(b, GGUF_TYPE_ARRAY);
    put_u32(b, GGUF_TYPE_STRING);
    put_u64(b, n);
    for (size_t i = 0; i < n; i++) put_str(b, s[i]);
    b->n_kv++;
}
static inline void builder_start(struct gguf_builder *b) {
    b->n = 0;
    b->n_kv = 0;
    put(b, "GGUF", 4);
    put_u32(b, 3);
    put_u64(b, 0); /* tensors */
    put_u64(b, 0); /* kvs: patched by builder_vocab */
}

/* Parses b and builds a vocab; returns the status (message in err), or
 * LLMOPT_STATUS_COUNT when b itself does not parse (the builder is wrong, not the
 * vocab). */
static inline enum llmopt_status builder_vocab(struct gguf_builder *b, struct tok_vocab **v,
                                               struct llmopt_err *err) {
    memcpy(b->buf + 16, &b->n_kv, 8);
    while (b->n % 32) b->buf[b->n++] = 0; /* the (empty) data section is aligned */
    struct gguf_file *f = NULL;
    *v = NULL;
    enum llmopt_status st = gguf_parse(b->buf, b->n, &f, err);
    if (st) {
        fprintf(stderr, "  gguf_parse: %s\n", err->msg);
        return LLMOPT_STATUS_COUNT;
    }
    st = tok_vocab_from_gguf(f, v, err);
    gguf_close(f);
    return st;
}

#endif
