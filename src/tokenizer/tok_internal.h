/* The tok_vocab layout and the helpers shared by the files of src/tokenizer/ only.
 *
 * Loading is the same for every source: a loader fills an array of pieces (one per
 * id), scores and types, optional merges, then tok_vocab_finish builds the lookup
 * structures (piece map, byte tokens, special-token index, end-of-generation ids). */
#ifndef LLMOPT_TOKENIZER_TOK_INTERNAL_H
#define LLMOPT_TOKENIZER_TOK_INTERNAL_H

#include "tokenizer/tokenizer.h"

/* A borrowed byte string (not NUL-terminated). */
struct tok_str {
    const char *ptr;
    uint32_t len;
};

/* One BPE merge rule (left, right) -> result, applied in rank order (lower first). */
struct tok_merge {
    int32_t left, right; /* left < 0: empty slot */
    int32_t result;
    uint32_t rank;
};

struct tok_pretok; /* pretok.c: a sequence of compiled split regexes */

struct tok_vocab {
    enum tok_kind kind;
    int32_t n_tokens;
    char *piece_bytes;   /* (sum of piece lengths) all pieces back to back */
    uint32_t *piece_off; /* (n_tokens + 1) piece i is piece_bytes[off[i] .. off[i+1]) */
    float *scores;       /* (n_tokens) merge priority of the piece; higher first (spm) */
    uint8_t *types;      /* (n_tokens) enum tok_type */
    uint32_t max_piece;  /* bytes in the longest piece */

    int32_t bos, eos, unk, pad, eot, eom; /* -1 when absent */
    bool add_bos, add_eos;
    bool add_space_prefix; /* spm: encode prepends "▁"; decode drops the first ' ' */
    bool byte_fallback;    /* spm: unknown characters become <0xXX> tokens */
    bool spm_chunks;       /* spm: "▁" only leads pieces, so text can be cut before it */
    bool remove_extra_ws;  /* spm: drop leading/trailing spaces, collapse runs */

    /* spm: id of piece "<0xXX>" for byte XX; bpe: id of the one-character piece
     * standing for byte XX. -1 if none. */
    int32_t byte_ids[256];

    /* piece -> id: open addressing, linear probing; slots hold ids, -1 when empty.
     * Capacity is a power of two at least twice n_tokens, so probes stay short. */
    int32_t *map; /* (map_mask + 1) */
    uint32_t map_mask;

    /* bpe: (left, right) -> merge, open addressing on the pair; rank is the rule's
     * line number. Capacity a power of two at least twice the rules. */
    struct tok_merge *merges; /* (merge_mask + 1) */
    uint32_t merge_mask;
    int32_t n_merges;
    bool ignore_merges;        /* a word that is a piece is emitted whole (Llama 3) */
    bool bpe_prefix_space;     /* ByteLevel add_prefix_space: ' ' before each fragment */
    bool nfc;                  /* the source asks for NFC normalization (see encode.c) */
    struct tok_pretok *pretok; /* bpe: NULL means the whole fragment is one word */
    char pre_name[64];

    /* Added tokens (control, user-defined, unknown) by first byte: the ids of those
     * starting with byte b are specials[special_start[b] .. special_start[b + 1]),
     * longest first. */
    int32_t *specials; /* (n_specials) */
    uint32_t n_specials;
    uint32_t special_start[257];

    int32_t eog[TOK_MAX_EOG]; /* (n_eog) ascending */
    int n_eog;
    /* end-of-generation ids named by the source besides eos/eot/eom (HF configs) */
    int32_t extra_eog[TOK_MAX_EOG];
    int n_extra_eog;
};

static inline const char *tok_piece_ptr(const struct tok_vocab *v, int32_t id) {
    return v->piece_bytes + v->piece_off[id];
}
static inline uint32_t tok_piece_len(const struct tok_vocab *v, int32_t id) {
    return v->piece_off[id + 1] - v->piece_off[id];
}

/* ---- vocab.c: building ------------------------------------------------------------ */

/* A fresh vocab: every id -1, flags at their spm defaults. */
struct tok_vocab *tok_vocab_new(void);
/* Copies n pieces (pieces[i] is token i's; NULL ptr = empty) into the vocab and
 * allocates scores (0) and types (NORMAL). `what` names the source in messages. */
enum llmopt_status tok_vocab_set_pieces(struct tok_vocab *v, int32_t n,
                                        const struct tok_str *pieces, const char *what,
                                        struct llmopt_err *err);
/* Adds n merge rules, rank = index. Each of left, right and left+right must be a
 * piece; a repeated pair keeps its first rank. */
enum llmopt_status tok_vocab_set_merges(struct tok_vocab *v, int32_t n, const struct tok_str *lefts,
                                        const struct tok_str *rights, const char *what,
                                        struct llmopt_err *err);
/* Builds the piece -> id map now (merges and special names are looked up by piece);
 * tok_vocab_finish keeps it. */
enum llmopt_status tok_vocab_finish_map(struct tok_vocab *v, struct llmopt_err *err);
/* Splits a merge line "A B" at its first space after the first byte. */
bool tok_split_merge(const char *s, size_t n, struct tok_str *left, struct tok_str *right);
/* The piece map, byte tokens, special-token index and end-of-generation ids; checks
 * that what the encoder needs is there. Call once, after pieces, types and merges. */
enum llmopt_status tok_vocab_finish(struct tok_vocab *v, struct llmopt_err *err);
/* Adds an end-of-generation id named by the source (ignored when -1 or full). */
void tok_vocab_add_eog(struct tok_vocab *v, int32_t id);

/* For the loaders' fuzz entries: encodes text[0..len) (special tokens parsed) and
 * decodes the ids again, results discarded; only crashes and sanitizer reports count. */
void tok_fuzz_round_trip(const struct tok_vocab *v, const char *text, size_t len);

/* Reads a whole file into a malloc'd buffer (NUL-terminated, at most TOK_MAX_FILE
 * bytes). *data is NULL with LLMOPT_OK when the file does not exist and optional. */
enum llmopt_status tok_read_file(const char *path, bool optional, char **data, size_t *size,
                                 struct llmopt_err *err);

/* ---- bpe.c ------------------------------------------------------------------------ */

/* GPT-2's byte -> code point map: printable bytes stand for themselves, the others
 * (controls, space, 0x7f-0xa0, 0xad) for U+0100 + their order. */
uint32_t tok_byte_to_cp(uint8_t b);
/* The inverse: the byte a code point stands for, or -1. */
int tok_cp_to_byte(uint32_t cp);
/* Writes the UTF-8 of code point cp (< 0x800) to out; returns 1 or 2. */
int tok_byte_char_utf8(uint8_t b, char out[2]);
/* Merge rule of (left, right), or NULL. */
const struct tok_merge *tok_merge_find(const struct tok_vocab *v, int32_t left, int32_t right);

/* Working memory of one tok_encode call for byte-level BPE (grows to the longest
 * word; freed at the end of the call). */
struct bpe_work {
    struct bpe_sym *syms;
    size_t syms_cap;
    struct bpe_pair *heap;
    size_t heap_n, heap_cap;
    char *word; /* the word in byte-level spelling (ignore_merges lookups) */
    size_t word_cap;
};
void tok_bpe_work_free(struct bpe_work *w);
/* Encodes one pre-tokenized word (raw bytes). */
enum llmopt_status tok_bpe_encode_word(const struct tok_vocab *v, struct bpe_work *w,
                                       const uint8_t *word, size_t n, int32_t *ids, size_t cap,
                                       size_t *count, struct llmopt_err *err);

/* ---- spm.c ------------------------------------------------------------------------ */

/* Encodes one text fragment (no special tokens in it) the SentencePiece way. */
enum llmopt_status tok_spm_encode_fragment(const struct tok_vocab *v, const char *text, size_t len,
                                           int32_t *ids, size_t cap, size_t *count,
                                           struct llmopt_err *err);

/* ---- pretok.c --------------------------------------------------------------------- */

/* Compiles patterns (PCRE2, UTF + UCP, JIT when available) into a sequence: the first
 * splits the text, each next one splits the pieces of the one before; unmatched
 * gaps are pieces too (Hugging Face's "Isolated" behaviour). `what` names the source
 * in messages. */
enum llmopt_status tok_pretok_compile(const char *const *patterns, const size_t *lens,
                                      const bool *literal, int n, const char *what,
                                      struct tok_pretok **out, struct llmopt_err *err);
/* The sequence for a tokenizer.ggml.pre / tokenizer_class name; unknown names are
 * LLMOPT_ERR_UNSUPPORTED naming it. Sets *nfc when the tokenizer normalizes to NFC
 * and *add_bos_default for the Llama 3 family. */
enum llmopt_status tok_pretok_by_name(const char *name, size_t len, const char *what,
                                      struct tok_pretok **out, bool *ignore_merges,
                                      bool *add_bos_default, bool *nfc, struct llmopt_err *err);
/* The GPT-2 split regex (ByteLevel's use_regex). */
extern const char tok_gpt2_pattern[];
void tok_pretok_free(struct tok_pretok *p);
typedef enum llmopt_status (*tok_word_fn)(void *ctx, const char *word, size_t n,
                                          struct llmopt_err *err);
/* Calls fn for each piece of text[0..len), in order; a non-OK status from fn stops
 * the split and is returned. Regex engine failures (match limits) are
 * LLMOPT_ERR_LIMIT. */
enum llmopt_status tok_pretok_split(const struct tok_pretok *p, const char *text, size_t len,
                                    tok_word_fn fn, void *ctx, struct llmopt_err *err);

/* ---- nfc.c ------------------------------------------------------------------------ */

/* Whether text may change under NFC (it holds a code point at or above U+0300). */
bool tok_nfc_needed(const char *text, size_t len);
/* NFC of text into a malloc'd *out; invalid UTF-8 bytes pass through unchanged. */
enum llmopt_status tok_nfc(const char *text, size_t len, char **out, size_t *out_len,
                           struct llmopt_err *err);

/* ---- shared by encoders ----------------------------------------------------------- */

static inline void tok_emit(int32_t id, int32_t *ids, size_t cap, size_t *count) {
    if (*count < cap) ids[*count] = id;
    (*count)++;
}

#endif
