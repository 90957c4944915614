/* tok_encode: special tokens split out first, then each text fragment through the
 * vocab's algorithm (spm.c, or pretok.c + bpe.c).
 *
 * Special-token matching scans the text once: at each byte, the added tokens that
 * start with that byte are tried longest first (the index built by vocab.c), and the
 * first one that matches and is allowed wins (leftmost, then longest — what Hugging
 * Face's added-token matcher does). */
#include "tokenizer/tok_internal.h"

#include <stdlib.h>
#include <string.h>

struct encode_ctx {
    const struct tok_vocab *v;
    int32_t *ids;
    size_t cap, count;
    struct bpe_work bpe;
    char *scratch; /* (scratch_cap) a fragment rewritten (prefix space, NFC) */
    size_t scratch_cap;
};

/* Length of the allowed special token at text[pos..len), or 0; *id is its id. */
static size_t match_special(const struct tok_vocab *v, const char *text, size_t len, size_t pos,
                            bool parse_special, int32_t *id) {
    uint8_t b = (uint8_t)text[pos];
    for (uint32_t i = v->special_start[b]; i < v->special_start[b + 1]; i++) {
        int32_t t = v->specials[i];
        uint32_t n = tok_piece_len(v, t);
        if (n > len - pos || memcmp(tok_piece_ptr(v, t), text + pos, n) != 0) continue;
        if (!parse_special && v->types[t] != TOK_TYPE_USER_DEFINED) continue;
        *id = t;
        return n;
    }
    return 0;
}

static enum llmopt_status bpe_word(void *ctx, const char *word, size_t n, struct llmopt_err *err) {
    struct encode_ctx *c = ctx;
    return tok_bpe_encode_word(c->v, &c->bpe, (const uint8_t *)word, n, c->ids, c->cap, &c->count,
                               err);
}

static enum llmopt_status encode_bpe_fragment(struct encode_ctx *c, const char *text, size_t len,
                                              struct llmopt_err *err);

static enum llmopt_status encode_fragment(struct encode_ctx *c, const char *text, size_t len,
                                          struct llmopt_err *err) {
    const struct tok_vocab *v = c->v;
    if (v->kind == TOK_KIND_SPM)
        return tok_spm_encode_fragment(v, text, len, c->ids, c->cap, &c->count, err);
    char *normalized = NULL;
    if (v->nfc && tok_nfc_needed(text, len)) {
        /* the normalizer runs on each fragment between added tokens, as in HF */
        enum llmopt_status st = tok_nfc(text, len, &normalized, &len, err);
        if (st) return st;
        text = normalized;
        if (len == 0) {
            free(normalized);
            return LLMOPT_OK;
        }
    }
    enum llmopt_status st = encode_bpe_fragment(c, text, len, err);
    free(normalized);
    return st;
}

static enum llmopt_status encode_bpe_fragment(struct encode_ctx *c, const char *text, size_t len,
                                              struct llmopt_err *err) {
    const struct tok_vocab *v = c->v;
    if (v->bpe_prefix_space && text[0] != ' ') {
        /* ByteLevel(add_prefix_space): the fragment reads as if a space preceded it */
        if (len + 1 > c->scratch_cap) {
            char *s = realloc(c->scratch, len + 1);
            if (!s) return err_set(err, LLMOPT_ERR_NOMEM, "tokenizer: %zu bytes", len + 1);
            c->scratch = s;
            c->scratch_cap = len + 1;
        }
        c->scratch[0] = ' ';
        memcpy(c->scratch + 1, text, len);
        text = c->scratch;
        len++;
    }
    return tok_pretok_split(v->pretok, text, len, bpe_word, c, err);
}

enum llmopt_status tok_encode(const struct tok_vocab *v, const char *text, size_t len, bool add_bos,
                              bool parse_special, int32_t *ids, size_t cap, size_t *n_ids,
                              struct llmopt_err *err) {
    *n_ids = 0;
    if (!text && len) return err_set(err, LLMOPT_ERR_INVALID_ARG, "tokenizer: NULL text");
    if (!ids && cap) return err_set(err, LLMOPT_ERR_INVALID_ARG, "tokenizer: NULL ids");
    if (len > TOK_MAX_TEXT)
        return err_set(err, LLMOPT_ERR_LIMIT,
                       "tokenizer: text of %zu bytes exceeds the cap of %u bytes", len,
                       TOK_MAX_TEXT);
    if (add_bos && v->bos < 0)
        return err_set(err, LLMOPT_ERR_INVALID_ARG,
                       "tokenizer: BOS requested but the vocab has no bos token");

    struct encode_ctx c = {.v = v, .ids = ids, .cap = cap};
    if (add_bos) tok_emit(v->bos, ids, cap, &c.count);
    enum llmopt_status st = LLMOPT_OK;
    size_t frag = 0; /* start of the text fragment not yet encoded */
    for (size_t pos = 0; pos < len;) {
        int32_t id = -1;
        size_t n = v->n_specials ? match_special(v, text, len, pos, parse_special, &id) : 0;
        if (n == 0) {
            pos++;
            continue;
        }
        if (pos > frag && (st = encode_fragment(&c, text + frag, pos - frag, err))) goto out;
        tok_emit(id, ids, cap, &c.count);
        pos += n;
        frag = pos;
    }
    /* empty text gets no dummy prefix: [] or [bos] */
    if (len > frag && (st = encode_fragment(&c, text + frag, len - frag, err))) goto out;
    *n_ids = c.count;
    if (c.count > cap)
        st = err_set(err, LLMOPT_ERR_LIMIT, "tokenizer: text needs %zu ids, the buffer holds %zu",
                     c.count, cap);
out:
    tok_bpe_work_free(&c.bpe);
    free(c.scratch);
    return st;
}
