/* SentencePiece-style BPE encoding (llama.cpp's SPM tokenizer is the reference).
 *
 * The text, with a dummy-prefix space and every ' ' written as "▁", is split into
 * UTF-8 characters ("symbols", a doubly linked list over one buffer). Every adjacent
 * pair whose concatenation is a piece goes into a max-heap keyed by that piece's
 * score (ties: the leftmost pair). Popping the best pair merges the right symbol into
 * the left one and offers the two new neighbour pairs; entries made stale by earlier
 * merges are recognised by their size and skipped. A symbol only grows and its left
 * end never moves, so (left index, merged size) identifies a pair exactly. Whole
 * encode: O(n log n) for n characters. */
#include "tokenizer/tok_internal.h"

#include <stdlib.h>
#include <string.h>

/* "▁" (U+2581, LOWER ONE EIGHTH BLOCK): SentencePiece's visible space. */
static const char spm_space[3] = {'\xe2', '\x96', '\x81'};

struct spm_sym {
    int32_t prev, next; /* neighbours in the list, -1 at the ends */
    uint32_t off;       /* first byte in the escaped text */
    uint32_t n;         /* bytes; 0 once merged into its left neighbour */
};

/* A candidate merge. The key orders pairs in one integer compare: the score's
 * order-preserving bits above, the complement of the left index below, so the
 * largest key is the best score and, among equal scores, the leftmost pair. */
struct spm_pair {
    uint64_t key;
    uint32_t size; /* bytes of left + right when the pair was offered */
};

struct spm_heap {
    struct spm_pair *a; /* (cap) binary max-heap on key, a[0] is the best pair */
    size_t n, cap;
};

struct spm_work {
    const struct tok_vocab *v;
    char *esc;            /* (escaped length) the escaped text, owned */
    const char *text;     /* the chunk being encoded: a part of esc */
    struct spm_sym *syms; /* (syms_cap) one per character of the chunk */
    size_t syms_cap;
    struct spm_heap heap;
};

/* Maps a float to a uint32_t with the same order (scores are never NaN; -0 was
 * made +0 at load, so equal scores give equal bits). */
static uint32_t score_order(float score) {
    uint32_t b;
    memcpy(&b, &score, sizeof b);
    return b & 0x80000000u ? ~b : b | 0x80000000u;
}

static struct spm_pair make_pair(float score, int32_t left, uint32_t size) {
    return (struct spm_pair){(uint64_t)score_order(score) << 32 | (UINT32_MAX - (uint32_t)left),
                             size};
}

static int32_t pair_left(struct spm_pair p) {
    return (int32_t)(UINT32_MAX - (uint32_t)p.key);
}

static void sift_down(struct spm_heap *h, size_t i, struct spm_pair p) {
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && h->a[c + 1].key > h->a[c].key) c++;
        if (h->a[c].key <= p.key) break;
        h->a[i] = h->a[c];
        i = c;
    }
    h->a[i] = p;
}

static bool heap_push(struct spm_heap *h, struct spm_pair p) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 64;
        struct spm_pair *a = realloc(h->a, cap * sizeof *a);
        if (!a) return false;
        h->a = a;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (h->a[parent].key >= p.key) break;
        h->a[i] = h->a[parent];
        i = parent;
    }
    h->a[i] = p;
    return true;
}

static struct spm_pair heap_pop(struct spm_heap *h) {
    struct spm_pair top = h->a[0];
    struct spm_pair last = h->a[--h->n];
    if (h->n) sift_down(h, 0, last);
    return top;
}

/* The pair (left, left's right neighbour), if its concatenation is a piece. */
static bool pair_of(const struct spm_work *w, int32_t left, struct spm_pair *out) {
    if (left < 0) return false;
    const struct spm_sym *l = &w->syms[left];
    if (l->next < 0) return false;
    uint32_t size = l->n + w->syms[l->next].n;
    int32_t id = tok_find(w->v, w->text + l->off, size);
    if (id < 0) return false;
    *out = make_pair(w->v->scores[id], left, size);
    return true;
}

static bool offer_pair(struct spm_work *w, int32_t left) {
    struct spm_pair p;
    return !pair_of(w, left, &p) || heap_push(&w->heap, p);
}

/* Bytes in the character starting with byte c, by its high nibble; llama.cpp's rule:
 * a stray continuation byte is a character of its own, and a truncated sequence is
 * cut at the end of the text. */
static uint32_t utf8_char_len(uint8_t c) {
    static const uint8_t by_nibble[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return by_nibble[c >> 4];
}

/* One symbol left after merging: its piece, else its bytes as <0xXX> tokens, else unk. */
static enum llmopt_status emit_symbol(const struct spm_work *w, const struct spm_sym *s,
                                      int32_t *ids, size_t cap, size_t *count,
                                      struct llmopt_err *err) {
    const struct tok_vocab *v = w->v;
    const uint8_t *bytes = (const uint8_t *)w->text + s->off;
    int32_t id = tok_find(v, (const char *)bytes, s->n);
    if (id >= 0) {
        tok_emit(id, ids, cap, count);
        return LLMOPT_OK;
    }
    bool all_bytes = v->byte_fallback;
    for (uint32_t i = 0; i < s->n; i++) all_bytes = all_bytes && v->byte_ids[bytes[i]] >= 0;
    if (all_bytes) {
        for (uint32_t i = 0; i < s->n; i++) tok_emit(v->byte_ids[bytes[i]], ids, cap, count);
        return LLMOPT_OK;
    }
    if (v->unk >= 0) {
        tok_emit(v->unk, ids, cap, count);
        return LLMOPT_OK;
    }
    return err_set(err, LLMOPT_ERR_UNSUPPORTED,
                   "tokenizer: no token for the character 0x%02x... (%u bytes): expected a "
                   "piece, <0xXX> byte tokens or an unknown token in the vocab, found none",
                   bytes[0], (unsigned)s->n);
}

/* Escapes text into w->esc: the dummy prefix, then ' ' -> "▁"; with
 * remove_extra_ws (SentencePiece's normalizer flag) leading and trailing spaces are
 * dropped and runs of spaces become one, and text of spaces only becomes empty. At
 * most 3 * (len + 1) bytes, under 2^26 by the text cap, so uint32_t offsets hold. */
static enum llmopt_status escape_text(struct spm_work *w, const char *text, size_t len,
                                      size_t *esc_len, struct llmopt_err *err) {
    const struct tok_vocab *v = w->v;
    size_t n_spaces = 0;
    for (size_t i = 0; i < len; i++) n_spaces += text[i] == ' ';
    size_t n = len + 2 * n_spaces + (v->add_space_prefix ? 3 : 0);
    char *esc = malloc(n ? n : 1);
    if (!esc) return err_set(err, LLMOPT_ERR_NOMEM, "tokenizer: %zu bytes of escaped text", n);
    size_t begin = 0, end = len;
    if (v->remove_extra_ws) {
        while (begin < end && text[begin] == ' ') begin++;
        while (end > begin && text[end - 1] == ' ') end--;
    }
    size_t k = 0;
    if (v->add_space_prefix && begin < end) {
        memcpy(esc, spm_space, 3);
        k = 3;
    }
    for (size_t i = begin; i < end; i++) {
        if (text[i] == ' ') {
            if (v->remove_extra_ws && text[i - 1] == ' ') continue; /* i > begin here */
            memcpy(esc + k, spm_space, 3);
            k += 3;
        } else {
            esc[k++] = text[i];
        }
    }
    LLMOPT_ASSERT(k <= n);
    w->esc = esc;
    *esc_len = k;
    return LLMOPT_OK;
}

/* Splits w->text[0..len) into one symbol per UTF-8 character, linked in order. */
static enum llmopt_status split_symbols(struct spm_work *w, size_t len, size_t *n_syms,
                                        struct llmopt_err *err) {
    size_t n_chars = 0;
    for (size_t off = 0; off < len; n_chars++) {
        size_t n = utf8_char_len((uint8_t)w->text[off]);
        off += n < len - off ? n : len - off;
    }
    if (n_chars > w->syms_cap) {
        struct spm_sym *s = realloc(w->syms, n_chars * sizeof *s);
        if (!s) return err_set(err, LLMOPT_ERR_NOMEM, "tokenizer: %zu symbols", n_chars);
        w->syms = s;
        w->syms_cap = n_chars;
    }
    size_t off = 0;
    for (size_t i = 0; i < n_chars; i++) {
        size_t n = utf8_char_len((uint8_t)w->text[off]);
        if (n > len - off) n = len - off;
        w->syms[i] = (struct spm_sym){
            .prev = (int32_t)i - 1,
            .next = i + 1 < n_chars ? (int32_t)i + 1 : -1,
            .off = (uint32_t)off,
            .n = (uint32_t)n,
        };
        off += n;
    }
    *n_syms = n_chars;
    return LLMOPT_OK;
}

/* Merges symbols by the best-scoring pair until no adjacent pair forms a piece. */
static enum llmopt_status merge_symbols(struct spm_work *w, size_t n_syms, struct llmopt_err *err) {
    /* the first pairs go in at once and are heapified bottom-up: O(n) */
    w->heap.n = 0;
    if (n_syms > w->heap.cap) {
        struct spm_pair *a = realloc(w->heap.a, n_syms * sizeof *a);
        if (!a) goto nomem;
        w->heap.a = a;
        w->heap.cap = n_syms;
    }
    for (size_t i = 0; i + 1 < n_syms; i++) {
        struct spm_pair p;
        if (pair_of(w, (int32_t)i, &p)) w->heap.a[w->heap.n++] = p;
    }
    for (size_t i = w->heap.n / 2; i-- > 0;) sift_down(&w->heap, i, w->heap.a[i]);

    while (w->heap.n) {
        struct spm_pair p = heap_pop(&w->heap);
        int32_t left = pair_left(p);
        struct spm_sym *l = &w->syms[left];
        if (l->n == 0 || l->next < 0) continue; /* stale: left was merged away */
        struct spm_sym *r = &w->syms[l->next];
        if (l->n + r->n != p.size) continue; /* stale: a side grew since the offer */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (l->next >= 0) w->syms[l->next].prev = left;
        if (!offer_pair(w, l->prev) || !offer_pair(w, left)) goto nomem;
    }
    return LLMOPT_OK;
nomem:
    return err_set(err, LLMOPT_ERR_NOMEM, "tokenizer: merge queue of %zu pairs for %zu symbols",
                   w->heap.cap, n_syms);
}

static enum llmopt_status encode_chunk(struct spm_work *w, const char *chunk, size_t len,
                                       int32_t *ids, size_t cap, size_t *count,
                                       struct llmopt_err *err) {
    size_t n_syms = 0;
    enum llmopt_status st;
    w->text = chunk;
    if ((st = split_symbols(w, len, &n_syms, err)) || (st = merge_symbols(w, n_syms, err)))
        return st;
    /* Symbol 0 is never merged away (merges fold right into left). */
    for (int32_t i = 0; i >= 0; i = w->syms[i].next)
        if ((st = emit_symbol(w, &w->syms[i], ids, cap, count, err))) return st;
    return LLMOPT_OK;
}

/* Where the next chunk starts: at the next symbol "▁" that follows a symbol that is
 * not one (symbols as split_symbols cuts them). No merge crosses there when the
 * vocab's pieces hold "▁" only in a leading run (v->spm_chunks): the merged piece
 * would hold a "▁" after another character. Chunks keep the merge heap small. */
static size_t next_cut(const char *esc, size_t start, size_t len) {
    bool prev_space = false;
    for (size_t i = start; i < len;) {
        size_t n = utf8_char_len((uint8_t)esc[i]);
        if (n > len - i) n = len - i;
        bool space = n == 3 && memcmp(esc + i, spm_space, 3) == 0;
        if (space && !prev_space && i > start) return i;
        prev_space = space;
        i += n;
    }
    return len;
}

enum llmopt_status tok_spm_encode_fragment(const struct tok_vocab *v, const char *text, size_t len,
                                           int32_t *ids, size_t cap, size_t *count,
                                           struct llmopt_err *err) {
    struct spm_work w = {.v = v};
    size_t esc_len = 0;
    enum llmopt_status st = escape_text(&w, text, len, &esc_len, err);
    for (size_t start = 0; !st && start < esc_len;) {
        size_t end = v->spm_chunks ? next_cut(w.esc, start, esc_len) : esc_len;
        st = encode_chunk(&w, w.esc + start, end - start, ids, cap, count, err);
        start = end;
    }
    free(w.heap.a);
    free(w.syms);
    free(w.esc);
    return st;
}
