/* Detokenizing: the text bytes of a token (SentencePiece "▁" and <0xXX>, or GPT-2's
 * byte-level code points), and a streaming decoder that emits only whole UTF-8 code
 * points. */
#include "tokenizer/tok_internal.h"

#include "base/utf8.h"

#include <string.h>

/* Calls fn for each text byte of token id (see tok_piece for the rules). */
typedef void (*piece_byte_fn)(void *ctx, uint8_t b);

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* Code point of the 1- or 2-byte UTF-8 sequence at p[0..n) (byte-level pieces use
 * U+0021..U+0143 only); -1 for anything else, with *k the bytes to skip. */
static int32_t small_cp(const uint8_t *p, uint32_t n, uint32_t *k) {
    *k = 1;
    if (p[0] < 0x80) return p[0];
    if (p[0] >= 0xc2 && p[0] <= 0xdf && n >= 2 && (p[1] & 0xc0) == 0x80) {
        *k = 2;
        return (int32_t)((p[0] & 0x1fu) << 6 | (p[1] & 0x3fu));
    }
    return -1;
}

/* A byte-level piece: each code point back to its byte. Hugging Face's ByteLevel
 * decoder keeps a piece as written when any of its code points is not in the map. */
static void bpe_visit(const uint8_t *p, uint32_t n, piece_byte_fn fn, void *ctx) {
    uint32_t k;
    for (uint32_t i = 0; i < n; i += k) {
        int32_t cp = small_cp(p + i, n - i, &k);
        if (cp < 0 || tok_cp_to_byte((uint32_t)cp) < 0) {
            for (uint32_t j = 0; j < n; j++) fn(ctx, p[j]);
            return;
        }
    }
    for (uint32_t i = 0; i < n; i += k)
        fn(ctx, (uint8_t)tok_cp_to_byte((uint32_t)small_cp(p + i, n - i, &k)));
}

static void piece_visit(const struct tok_vocab *v, int32_t id, piece_byte_fn fn, void *ctx) {
    if (id < 0 || id >= v->n_tokens) return;
    const uint8_t *p = (const uint8_t *)tok_piece_ptr(v, id);
    uint32_t n = tok_piece_len(v, id);
    switch ((enum tok_type)v->types[id]) {
    case TOK_TYPE_NORMAL:
        if (v->kind == TOK_KIND_BPE) {
            bpe_visit(p, n, fn, ctx);
            return;
        }
        for (uint32_t i = 0; i < n; i++) {
            if (i + 2 < n && p[i] == 0xe2 && p[i + 1] == 0x96 && p[i + 2] == 0x81) {
                fn(ctx, ' '); /* "▁" is SentencePiece's space */
                i += 2;
            } else {
                fn(ctx, p[i]);
            }
        }
        return;
    case TOK_TYPE_BYTE: {
        if (v->kind == TOK_KIND_BPE) {
            bpe_visit(p, n, fn, ctx);
            return;
        }
        int hi = n == 6 ? hex_digit((char)p[3]) : -1, lo = n == 6 ? hex_digit((char)p[4]) : -1;
        if (hi >= 0 && lo >= 0 && memcmp(p, "<0x", 3) == 0 && p[5] == '>') {
            fn(ctx, (uint8_t)(hi << 4 | lo));
        } else {
            for (uint32_t i = 0; i < n; i++) fn(ctx, p[i]); /* not "<0xXX>": as written */
        }
        return;
    }
    case TOK_TYPE_UNKNOWN: /* llama.cpp prints "▅" (U+2585) for the unknown token */
        fn(ctx, 0xe2);
        fn(ctx, 0x96);
        fn(ctx, 0x85);
        return;
    case TOK_TYPE_USER_DEFINED:
        for (uint32_t i = 0; i < n; i++) fn(ctx, p[i]);
        return;
    case TOK_TYPE_UNDEFINED:
    case TOK_TYPE_CONTROL:
    case TOK_TYPE_UNUSED:
    case TOK_TYPE_COUNT:
        return;
    }
}

struct buf_writer {
    char *buf;
    size_t cap, n; /* n counts every byte, written or not */
};

static void buf_put(void *ctx, uint8_t b) {
    struct buf_writer *w = ctx;
    if (w->n < w->cap) w->buf[w->n] = (char)b;
    w->n++;
}

size_t tok_piece(const struct tok_vocab *v, int32_t id, char *buf, size_t cap) {
    struct buf_writer w = {buf, buf ? cap : 0, 0};
    piece_visit(v, id, buf_put, &w);
    return w.n;
}

/* ---- streaming ---------------------------------------------------------------- */

/* Output of one push/flush call: whole code points only; after the first one that
 * does not fit, the rest of the call is dropped so the output stays a prefix. */
struct stream_out {
    struct tok_stream *s;
    char *out;
    size_t cap, n;
    bool full;
    bool first_byte; /* next byte is the piece's first (for the leading-space strip) */
    bool any_byte;   /* the piece produced a byte */
};

static void out_bytes(struct stream_out *o, const uint8_t *b, size_t n) {
    if (!o->full && o->cap - o->n >= n) {
        memcpy(o->out + o->n, b, n);
        o->n += n;
    } else {
        o->full = true;
        o->s->n_dropped += n;
    }
}

static const uint8_t replacement[3] = {0xef, 0xbf, 0xbd}; /* U+FFFD */

/* UTF-8 decoding per the Unicode "maximal subpart" rule: a lead byte opens a
 * sequence of known length; each continuation byte must lie in its allowed range
 * (narrower after E0, ED, F0, F4 to exclude overlongs, surrogates and > U+10FFFF).
 * A byte that breaks the sequence ends it with one U+FFFD and is then read anew. */
static void utf8_feed(struct stream_out *o, uint8_t b) {
    struct tok_stream *s = o->s;
    uint8_t lo = 0x80, hi = 0xbf; /* allowed range of the next continuation byte */
    if (s->n_pending) {
        if (s->n_pending == 1) utf8_lead(s->pending[0], &lo, &hi);
        if (b >= lo && b <= hi) {
            s->pending[s->n_pending++] = b;
            if (s->n_pending == s->n_need) {
                out_bytes(o, s->pending, s->n_pending);
                s->n_pending = 0;
            }
            return;
        }
        out_bytes(o, replacement, sizeof replacement);
        s->n_pending = 0;
    }
    const int need = b < 0x80 ? 1 : utf8_lead(b, &lo, &hi);
    if (need == 1) {
        out_bytes(o, &b, 1);
    } else if (need) {
        s->pending[0] = b;
        s->n_pending = 1;
        s->n_need = (uint8_t)need;
    } else {
        out_bytes(o, replacement, sizeof replacement); /* stray continuation or invalid */
    }
}

static void stream_put(void *ctx, uint8_t b) {
    struct stream_out *o = ctx;
    bool first = o->first_byte;
    o->first_byte = false;
    o->any_byte = true;
    if (first && o->s->strip_space && b == ' ') return;
    utf8_feed(o, b);
}

void tok_stream_init(struct tok_stream *s, const struct tok_vocab *v) {
    memset(s, 0, sizeof *s);
    s->vocab = v;
    s->strip_space = v->add_space_prefix;
}

size_t tok_stream_max_out(const struct tok_vocab *v) {
    /* each byte fed can come out as a 3-byte U+FFFD, and up to 3 held-back bytes of
     * an earlier push can come out too (as themselves or one U+FFFD) */
    uint32_t fed = v->max_piece > 3 ? v->max_piece : 3;
    return 3 * ((size_t)fed + 4);
}

size_t tok_stream_push(struct tok_stream *s, int32_t id, char *out, size_t cap) {
    const struct tok_vocab *v = s->vocab;
    struct stream_out o = {.s = s, .out = out, .cap = out ? cap : 0, .first_byte = true};
    if (id >= 0 && id == v->bos) {
        /* a new text starts: SentencePiece's decoder drops its dummy-prefix space */
        s->strip_space = v->add_space_prefix;
        return 0;
    }
    piece_visit(v, id, stream_put, &o);
    if (o.any_byte) s->strip_space = false;
    return o.n;
}

size_t tok_stream_flush(struct tok_stream *s, char *out, size_t cap) {
    struct stream_out o = {.s = s, .out = out, .cap = out ? cap : 0};
    if (s->n_pending) {
        out_bytes(&o, replacement, sizeof replacement);
        s->n_pending = 0;
    }
    return o.n;
}

enum llmopt_status tok_decode(const struct tok_vocab *v, const int32_t *ids, size_t n_ids,
                              char *out, size_t cap, size_t *n_out, struct llmopt_err *err) {
    struct tok_stream s;
    tok_stream_init(&s, v);
    size_t n = 0;
    /* once something was dropped, write nothing more: out stays a prefix, and
     * n + s.n_dropped still counts every byte the text needs */
    for (size_t i = 0; i < n_ids; i++) {
        bool room = out && !s.n_dropped;
        n += tok_stream_push(&s, ids[i], room ? out + n : NULL, room ? cap - n : 0);
    }
    bool room = out && !s.n_dropped;
    n += tok_stream_flush(&s, room ? out + n : NULL, room ? cap - n : 0);
    *n_out = n + (size_t)s.n_dropped;
    if (s.n_dropped)
        return err_set(err, LLMOPT_ERR_LIMIT,
                       "tokenizer: text needs %zu bytes, the buffer holds %zu", *n_out, cap);
    return LLMOPT_OK;
}
