/* The tok_vocab layout, shared by the files of src/tokenizer/ only. */
#ifndef LLMOPT_TOKENIZER_TOK_INTERNAL_H
#define LLMOPT_TOKENIZER_TOK_INTERNAL_H

#include "tokenizer/tokenizer.h"

struct tok_vocab {
    enum tok_kind kind;
    int32_t n_tokens;
    char *piece_bytes;     /* (sum of piece lengths) all pieces back to back */
    uint32_t *piece_off;   /* (n_tokens + 1) piece i is piece_bytes[off[i] .. off[i+1]) */
    float *scores;         /* (n_tokens) merge priority of the piece; higher first */
    uint8_t *types;        /* (n_tokens) enum tok_type */
    uint32_t max_piece;    /* bytes in the longest piece */

    int32_t bos, eos, unk, pad, eot; /* -1 when absent */
    bool add_bos, add_eos;
    bool add_space_prefix; /* encode prepends "▁"; decode drops the first ' ' */

    int32_t byte_ids[256]; /* (256) id of piece "<0xXX>" for byte XX, -1 if none */

    /* piece -> id: open addressing, linear probing; slots hold ids, -1 when empty.
     * Capacity is a power of two at least twice n_tokens, so probes stay short. */
    int32_t *map;          /* (map_mask + 1) */
    uint32_t map_mask;
};

static inline const char *tok_piece_ptr(const struct tok_vocab *v, int32_t id) {
    return v->piece_bytes + v->piece_off[id];
}
static inline uint32_t tok_piece_len(const struct tok_vocab *v, int32_t id) {
    return v->piece_off[id + 1] - v->piece_off[id];
}

#endif
