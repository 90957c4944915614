/* Byte-level BPE of one pre-tokenized word (Hugging Face tokenizers' BPE model is
 * the reference).
 *
 * Each byte of the word starts as the token of its GPT-2 code point (byte_ids).
 * Every adjacent pair with a merge rule goes into a min-heap keyed by (rank, left
 * position): popping the best merges the right symbol into the left one and offers
 * the two new neighbour pairs. An entry made stale by an earlier merge is recognised
 * on popping: the pair at its position no longer has that rank (ranks are unique
 * per pair). Each merge removes a symbol and pushes at most two entries, so a word
 * of n bytes costs O(n log n). */
#include "tokenizer/tok_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- GPT-2 byte <-> code point map ------------------------------------------------ */

/* Bytes that stand for themselves: '!'..'~', '¡'..'¬', '®'..'ÿ'. The others (0x00-0x20,
 * 0x7f-0xa0, 0xad: 68 bytes) take U+0100.. in byte order. */
static bool byte_is_printable(uint8_t b) {
    return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
}

uint32_t tok_byte_to_cp(uint8_t b) {
    if (byte_is_printable(b)) return b;
    if (b <= 0x20) return 0x100u + b;               /* 33 bytes: U+0100..U+0120 */
    if (b <= 0xa0) return 0x100u + 33 + (b - 0x7f); /* 34 bytes: U+0121..U+0142 */
    return 0x100u + 67;                             /* 0xad: U+0143 */
}

int tok_cp_to_byte(uint32_t cp) {
    if (cp < 0x100) return byte_is_printable((uint8_t)cp) ? (int)cp : -1;
    if (cp <= 0x120) return (int)(cp - 0x100);
    if (cp <= 0x142) return (int)(cp - 0x121 + 0x7f);
    if (cp == 0x143) return 0xad;
    return -1;
}

int tok_byte_char_utf8(uint8_t b, char out[2]) {
    uint32_t cp = tok_byte_to_cp(b);
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xc0 | cp >> 6);
    out[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
}

/* ---- merging ---------------------------------------------------------------------- */

struct bpe_sym {
    int32_t id;         /* token; -1 once merged into its left neighbour */
    int32_t prev, next; /* neighbours in the word, -1 at the ends */
};

/* A candidate merge: rank above, left position below, so the smallest key is the
 * lowest rank and, among equal ranks (the same pair), the leftmost. */
struct bpe_pair {
    uint64_t key;
};

void tok_bpe_work_free(struct bpe_work *w) {
    free(w->syms);
    free(w->heap);
    free(w->word);
    memset(w, 0, sizeof *w);
}

static void heap_push(struct bpe_work *w, uint64_t key) {
    size_t i = w->heap_n++;
    LLMOPT_ASSERT(w->heap_n <= w->heap_cap); /* sized for every push of one word */
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (w->heap[parent].key <= key) break;
        w->heap[i] = w->heap[parent];
        i = parent;
    }
    w->heap[i].key = key;
}

static uint64_t heap_pop(struct bpe_work *w) {
    uint64_t top = w->heap[0].key;
    uint64_t last = w->heap[--w->heap_n].key;
    size_t n = w->heap_n, i = 0;
    if (n == 0) return top;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && w->heap[c + 1].key < w->heap[c].key) c++;
        if (w->heap[c].key >= last) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    w->heap[i].key = last;
    return top;
}

static void offer(const struct tok_vocab *v, struct bpe_work *w, int32_t left) {
    if (left < 0) return;
    int32_t right = w->syms[left].next;
    if (right < 0) return;
    const struct tok_merge *m = tok_merge_find(v, w->syms[left].id, w->syms[right].id);
    if (m) heap_push(w, (uint64_t)m->rank << 32 | (uint32_t)left);
}

static enum llmopt_status reserve(struct bpe_work *w, size_t n, struct llmopt_err *err) {
    if (n > w->syms_cap) {
        size_t cap = n < 64 ? 64 : n;
        struct bpe_sym *s = realloc(w->syms, cap * sizeof *s);
        if (!s) return err_set(err, LLMOPT_ERR_NOMEM, "tokenizer: %zu symbols", cap);
        w->syms = s;
        w->syms_cap = cap;
    }
    /* initial pairs (n - 1) plus at most two per merge (n - 1 merges) */
    size_t heap_need = 3 * n;
    if (heap_need > w->heap_cap) {
        struct bpe_pair *h = realloc(w->heap, heap_need * sizeof *h);
        if (!h) return err_set(err, LLMOPT_ERR_NOMEM, "tokenizer: merge queue of %zu", heap_need);
        w->heap = h;
        w->heap_cap = heap_need;
    }
    if (2 * n > w->word_cap) {
        char *s = realloc(w->word, 2 * n);
        if (!s) return err_set(err, LLMOPT_ERR_NOMEM, "tokenizer: word of %zu bytes", n);
        w->word = s;
        w->word_cap = 2 * n;
    }
    return LLMOPT_OK;
}

enum llmopt_status tok_bpe_encode_word(const struct tok_vocab *v, struct bpe_work *w,
                                       const uint8_t *word, size_t n, int32_t *ids, size_t cap,
                                       size_t *count, struct llmopt_err *err) {
    if (n == 0) return LLMOPT_OK;
    enum llmopt_status st = reserve(w, n, err);
    if (st) return st;

    if (v->ignore_merges && n <= v->max_piece) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++) k += (size_t)tok_byte_char_utf8(word[i], w->word + k);
        int32_t id = tok_find(v, w->word, k);
        if (id >= 0) {
            tok_emit(id, ids, cap, count);
            return LLMOPT_OK;
        }
    }

    for (size_t i = 0; i < n; i++) {
        int32_t id = v->byte_ids[word[i]];
        if (id < 0) id = v->unk;
        if (id < 0)
            return err_set(err, LLMOPT_ERR_UNSUPPORTED,
                           "tokenizer: no token for the byte 0x%02x: expected its byte-level "
                           "piece or an unknown token in the vocab, found none",
                           word[i]);
        w->syms[i] = (struct bpe_sym){id, (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1};
    }
    w->heap_n = 0;
    for (size_t i = 0; i + 1 < n; i++) offer(v, w, (int32_t)i);

    while (w->heap_n) {
        uint64_t key = heap_pop(w);
        int32_t left = (int32_t)(uint32_t)key;
        struct bpe_sym *l = &w->syms[left];
        if (l->id < 0 || l->next < 0) continue; /* stale: left merged away or now last */
        const struct tok_merge *m = tok_merge_find(v, l->id, w->syms[l->next].id);
        if (!m || m->rank != (uint32_t)(key >> 32)) continue; /* stale: another pair */
        struct bpe_sym *r = &w->syms[l->next];
        l->id = m->result;
        r->id = -1;
        l->next = r->next;
        if (l->next >= 0) w->syms[l->next].prev = left;
        offer(v, w, l->prev);
        offer(v, w, left);
    }
    /* Symbol 0 is never merged away (merges fold right into left). */
    for (int32_t i = 0; i >= 0; i = w->syms[i].next) tok_emit(w->syms[i].id, ids, cap, count);
    return LLMOPT_OK;
}
