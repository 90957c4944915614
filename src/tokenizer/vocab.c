/* Vocabulary core: one owned structure (pieces in a single arena, scores, types,
 * special ids, piece -> id map, merge map, special-token index), filled by the
 * loaders (vocab_gguf.c, vocab_hf.c, spm_model.c) and finished here. */
#include "tokenizer/tok_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *const tok_kind_names[TOK_KIND_COUNT] = {
    [TOK_KIND_SPM] = "spm",
    [TOK_KIND_BPE] = "bpe",
};
_Static_assert(LLMOPT_ARRAY_LEN(tok_kind_names) == TOK_KIND_COUNT,
               "tok_kind name table out of sync");

static const char *const tok_type_names[TOK_TYPE_COUNT] = {
    [TOK_TYPE_UNDEFINED] = "undefined",
    [TOK_TYPE_NORMAL] = "normal",
    [TOK_TYPE_UNKNOWN] = "unknown",
    [TOK_TYPE_CONTROL] = "control",
    [TOK_TYPE_USER_DEFINED] = "user_defined",
    [TOK_TYPE_UNUSED] = "unused",
    [TOK_TYPE_BYTE] = "byte",
};
_Static_assert(LLMOPT_ARRAY_LEN(tok_type_names) == TOK_TYPE_COUNT,
               "tok_type name table out of sync");

const char *tok_kind_name(enum tok_kind kind) {
    return (unsigned)kind < TOK_KIND_COUNT ? tok_kind_names[kind] : "?";
}

const char *tok_type_name(enum tok_type type) {
    return (unsigned)type < TOK_TYPE_COUNT ? tok_type_names[type] : "?";
}

/* FNV-1a, 64-bit: short keys, good spread, no tables. */
static uint64_t piece_hash(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

int32_t tok_find(const struct tok_vocab *v, const char *s, size_t n) {
    if (n > v->max_piece || !v->map) return -1;
    uint32_t slot = (uint32_t)piece_hash(s, n) & v->map_mask;
    for (;;) {
        int32_t id = v->map[slot];
        if (id < 0) return -1;
        if (tok_piece_len(v, id) == n && memcmp(tok_piece_ptr(v, id), s, n) == 0) return id;
        slot = (slot + 1) & v->map_mask;
    }
}

struct tok_vocab *tok_vocab_new(void) {
    struct tok_vocab *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    v->bos = v->eos = v->unk = v->pad = v->eot = v->eom = -1;
    v->add_bos = true;
    v->add_space_prefix = true;
    v->byte_fallback = true;
    for (int b = 0; b < 256; b++) v->byte_ids[b] = -1;
    return v;
}

enum llmopt_status tok_vocab_set_pieces(struct tok_vocab *v, int32_t n,
                                        const struct tok_str *pieces, const char *what,
                                        struct llmopt_err *err) {
    if (n <= 0 || n > TOK_MAX_TOKENS)
        return err_set(err, n > 0 ? LLMOPT_ERR_LIMIT : LLMOPT_ERR_FORMAT,
                       "tokenizer: %s: expected 1 to %d tokens, found %d", what, TOK_MAX_TOKENS,
                       (int)n);
    uint64_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        if (pieces[i].len > TOK_MAX_PIECE)
            return err_set(err, LLMOPT_ERR_LIMIT,
                           "tokenizer: %s: token %d: piece of %u bytes exceeds the cap of %d", what,
                           (int)i, (unsigned)pieces[i].len, TOK_MAX_PIECE);
        total += pieces[i].len;
        if (total > TOK_MAX_PIECE_BYTES)
            return err_set(err, LLMOPT_ERR_LIMIT,
                           "tokenizer: %s: pieces exceed the cap of %u bytes in all", what,
                           TOK_MAX_PIECE_BYTES);
        if (pieces[i].len > v->max_piece) v->max_piece = pieces[i].len;
    }
    v->n_tokens = n;
    v->piece_bytes = malloc(total ? total : 1);
    v->piece_off = malloc(sizeof *v->piece_off * ((size_t)n + 1));
    v->scores = calloc((size_t)n, sizeof *v->scores);
    v->types = malloc((size_t)n);
    if (!v->piece_bytes || !v->piece_off || !v->scores || !v->types)
        return err_set(err, LLMOPT_ERR_NOMEM, "tokenizer: %s: %d tokens, %llu bytes of pieces",
                       what, (int)n, (unsigned long long)total);
    memset(v->types, TOK_TYPE_NORMAL, (size_t)n);
    uint32_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        v->piece_off[i] = off;
        if (pieces[i].len) memcpy(v->piece_bytes + off, pieces[i].ptr, pieces[i].len);
        off += pieces[i].len;
    }
    v->piece_off[n] = off;
    return LLMOPT_OK;
}

/* Inserts every piece; a duplicate piece maps to its last id, as llama.cpp's map
 * does (later entries overwrite earlier ones). */
static enum llmopt_status build_map(struct tok_vocab *v, struct llmopt_err *err) {
    uint32_t cap = 1;
    while (cap < 2u * (uint32_t)v->n_tokens) cap <<= 1;
    v->map = malloc(sizeof *v->map * cap);
    if (!v->map) return err_set(err, LLMOPT_ERR_NOMEM, "tokenizer: piece map of %u slots", cap);
    memset(v->map, 0xff, sizeof *v->map * cap); /* every slot -1 */
    v->map_mask = cap - 1;
    for (int32_t id = 0; id < v->n_tokens; id++) {
        const char *s = tok_piece_ptr(v, id);
        uint32_t n = tok_piece_len(v, id);
        uint32_t slot = (uint32_t)piece_hash(s, n) & v->map_mask;
        for (;;) {
            int32_t other = v->map[slot];
            if (other < 0 ||
                (tok_piece_len(v, other) == n && memcmp(tok_piece_ptr(v, other), s, n) == 0)) {
                v->map[slot] = id;
                break;
            }
            slot = (slot + 1) & v->map_mask;
        }
    }
    return LLMOPT_OK;
}

/* ---- merges ------------------------------------------------------------------------- */

static uint32_t pair_hash(int32_t left, int32_t right) {
    uint64_t k = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    k *= 0x9e3779b97f4a7c15ull; /* Fibonacci hashing: the high bits are well mixed */
    return (uint32_t)(k >> 32);
}

const struct tok_merge *tok_merge_find(const struct tok_vocab *v, int32_t left, int32_t right) {
    if (!v->merges) return NULL;
    uint32_t slot = pair_hash(left, right) & v->merge_mask;
    for (;;) {
        const struct tok_merge *m = &v->merges[slot];
        if (m->left < 0) return NULL;
        if (m->left == left && m->right == right) return m;
        slot = (slot + 1) & v->merge_mask;
    }
}

bool tok_split_merge(const char *s, size_t n, struct tok_str *left, struct tok_str *right) {
    /* from the second byte: a piece may itself be a space in non-byte-level vocabs */
    const char *sp = n > 1 ? memchr(s + 1, ' ', n - 1) : NULL;
    if (!sp) return false;
    size_t a = (size_t)(sp - s);
    if (a + 1 >= n) return false; /* nothing after the space */
    *left = (struct tok_str){s, (uint32_t)a};
    *right = (struct tok_str){sp + 1, (uint32_t)(n - a - 1)};
    return true;
}

/* Prints at most 48 bytes of a piece for a message. */
static int show_len(uint32_t n) {
    return n > 48 ? 48 : (int)n;
}

enum llmopt_status tok_vocab_set_merges(struct tok_vocab *v, int32_t n, const struct tok_str *lefts,
                                        const struct tok_str *rights, const char *what,
                                        struct llmopt_err *err) {
    enum llmopt_status st = tok_vocab_finish_map(v, err); /* merges name pieces */
    if (st) return st;
    if (n < 0 || n > TOK_MAX_MERGES)
        return err_set(err, LLMOPT_ERR_LIMIT, "tokenizer: %s: %d merges exceed the cap of %d", what,
                       (int)n, TOK_MAX_MERGES);
    uint32_t cap = 16;
    while (cap < 2u * (uint32_t)n) cap <<= 1;
    v->merges = malloc(sizeof *v->merges * cap);
    if (!v->merges) return err_set(err, LLMOPT_ERR_NOMEM, "tokenizer: merge map of %u slots", cap);
    for (uint32_t i = 0; i < cap; i++) v->merges[i].left = -1;
    v->merge_mask = cap - 1;
    char *joined = malloc(v->max_piece + 1); /* left + right, when it can be a piece */
    if (!joined) return err_set(err, LLMOPT_ERR_NOMEM, "tokenizer: merge buffer");
    for (int32_t i = 0; i < n; i++) {
        const struct tok_str *a = &lefts[i], *b = &rights[i];
        int32_t ia = tok_find(v, a->ptr, a->len), ib = tok_find(v, b->ptr, b->len);
        if (ia < 0 || ib < 0) {
            free(joined);
            return err_set(err, LLMOPT_ERR_FORMAT,
                           "tokenizer: %s: merge %d (\"%.*s\" \"%.*s\"): expected two vocab "
                           "pieces, \"%.*s\" is not one",
                           what, (int)i, show_len(a->len), a->ptr, show_len(b->len), b->ptr,
                           ia < 0 ? show_len(a->len) : show_len(b->len), ia < 0 ? a->ptr : b->ptr);
        }
        int32_t ic = -1;
        if ((size_t)a->len + b->len <= v->max_piece) {
            memcpy(joined, a->ptr, a->len);
            memcpy(joined + a->len, b->ptr, b->len);
            ic = tok_find(v, joined, (size_t)a->len + b->len);
        }
        if (ic < 0) {
            free(joined);
            return err_set(err, LLMOPT_ERR_FORMAT,
                           "tokenizer: %s: merge %d (\"%.*s\" \"%.*s\"): the merged piece is "
                           "not in the vocab",
                           what, (int)i, show_len(a->len), a->ptr, show_len(b->len), b->ptr);
        }
        uint32_t slot = pair_hash(ia, ib) & v->merge_mask;
        for (;;) {
            struct tok_merge *m = &v->merges[slot];
            if (m->left < 0) {
                *m = (struct tok_merge){ia, ib, ic, (uint32_t)i};
                v->n_merges++;
                break;
            }
            if (m->left == ia && m->right == ib) break; /* repeated: the first rank stays */
            slot = (slot + 1) & v->merge_mask;
        }
    }
    free(joined);
    return LLMOPT_OK;
}

/* ---- finishing ------------------------------------------------------------------- */

/* Byte tokens are found by their spelling, as llama.cpp does, whatever their type
 * says: "<0xXX>" for spm, the byte's GPT-2 code point for bpe. */
static void find_byte_tokens(struct tok_vocab *v) {
    static const char hex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; b++) {
        if (v->kind == TOK_KIND_SPM) {
            char name[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
            v->byte_ids[b] = tok_find(v, name, sizeof name);
        } else {
            char c[2];
            int n = tok_byte_char_utf8((uint8_t)b, c);
            v->byte_ids[b] = tok_find(v, c, (size_t)n);
        }
    }
}

static bool is_special_type(uint8_t t) {
    return t == TOK_TYPE_CONTROL || t == TOK_TYPE_USER_DEFINED || t == TOK_TYPE_UNKNOWN;
}

/* Sort order of the special index: first byte, then longer first, then lower id. */
static _Thread_local const struct tok_vocab *sort_vocab; /* qsort has no context */
static int compare_specials(const void *pa, const void *pb) {
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    const struct tok_vocab *v = sort_vocab;
    uint8_t fa = (uint8_t)tok_piece_ptr(v, a)[0], fb = (uint8_t)tok_piece_ptr(v, b)[0];
    if (fa != fb) return fa < fb ? -1 : 1;
    uint32_t la = tok_piece_len(v, a), lb = tok_piece_len(v, b);
    if (la != lb) return la > lb ? -1 : 1;
    return a < b ? -1 : a > b;
}

static enum llmopt_status build_specials(struct tok_vocab *v, struct llmopt_err *err) {
    free(v->specials); /* finishing again (a loader adding to a finished vocab) */
    uint32_t n = 0;
    for (int32_t id = 0; id < v->n_tokens; id++)
        n += is_special_type(v->types[id]) && tok_piece_len(v, id) > 0;
    v->specials = malloc(sizeof *v->specials * (n ? n : 1));
    if (!v->specials) return err_set(err, LLMOPT_ERR_NOMEM, "tokenizer: %u special tokens", n);
    n = 0;
    for (int32_t id = 0; id < v->n_tokens; id++)
        if (is_special_type(v->types[id]) && tok_piece_len(v, id) > 0) v->specials[n++] = id;
    v->n_specials = n;
    sort_vocab = v;
    qsort(v->specials, n, sizeof *v->specials, compare_specials);
    sort_vocab = NULL;
    uint32_t i = 0;
    for (int b = 0; b < 256; b++) {
        v->special_start[b] = i;
        while (i < n && (uint8_t)tok_piece_ptr(v, v->specials[i])[0] == b) i++;
    }
    v->special_start[256] = n;
    return LLMOPT_OK;
}

/* Spellings of end-of-turn tokens that chat models declare as control tokens. */
static const char *const eog_names[] = {
    "<|eot_id|>",    "<|eom_id|>",    "<|im_end|>",      "<|end|>",
    "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
};

void tok_vocab_add_eog(struct tok_vocab *v, int32_t id) {
    if (id < 0 || v->n_extra_eog >= TOK_MAX_EOG) return;
    for (int i = 0; i < v->n_extra_eog; i++)
        if (v->extra_eog[i] == id) return;
    v->extra_eog[v->n_extra_eog++] = id;
}

static void add_eog_sorted(struct tok_vocab *v, int32_t id) {
    if (id < 0 || id >= v->n_tokens || v->n_eog >= TOK_MAX_EOG) return;
    int i = 0;
    while (i < v->n_eog && v->eog[i] < id) i++;
    if (i < v->n_eog && v->eog[i] == id) return;
    memmove(v->eog + i + 1, v->eog + i, sizeof *v->eog * (size_t)(v->n_eog - i));
    v->eog[i] = id;
    v->n_eog++;
}

static void build_eog(struct tok_vocab *v) {
    v->n_eog = 0;
    add_eog_sorted(v, v->eos);
    add_eog_sorted(v, v->eot);
    add_eog_sorted(v, v->eom);
    for (int i = 0; i < v->n_extra_eog; i++) add_eog_sorted(v, v->extra_eog[i]);
    for (size_t k = 0; k < LLMOPT_ARRAY_LEN(eog_names); k++) {
        int32_t id = tok_find(v, eog_names[k], strlen(eog_names[k]));
        if (id >= 0 && (v->types[id] == TOK_TYPE_CONTROL || v->types[id] == TOK_TYPE_USER_DEFINED))
            add_eog_sorted(v, id);
    }
}

/* Whether every piece holds "▁" (U+2581) only in a leading run: then no SentencePiece
 * merge can join a character to a following "▁" (see spm.c). */
static bool space_only_leads(const struct tok_vocab *v) {
    for (int32_t id = 0; id < v->n_tokens; id++) {
        const char *p = tok_piece_ptr(v, id);
        size_t n = tok_piece_len(v, id), i = 0;
        while (i + 3 <= n && memcmp(p + i, "\xe2\x96\x81", 3) == 0) i += 3;
        for (; i + 3 <= n; i++)
            if (memcmp(p + i, "\xe2\x96\x81", 3) == 0) return false;
    }
    return true;
}

enum llmopt_status tok_vocab_finish(struct tok_vocab *v, struct llmopt_err *err) {
    enum llmopt_status st;
    if (!v->map && (st = build_map(v, err))) return st;
    if ((st = build_specials(v, err))) return st;
    find_byte_tokens(v);
    build_eog(v);
    if (v->kind == TOK_KIND_BPE) v->add_space_prefix = false;
    v->spm_chunks = v->kind == TOK_KIND_SPM && space_only_leads(v);
    return LLMOPT_OK;
}

enum llmopt_status tok_vocab_finish_map(struct tok_vocab *v, struct llmopt_err *err) {
    return v->map ? LLMOPT_OK : build_map(v, err);
}

/* ---- files -------------------------------------------------------------------------- */

void tok_fuzz_round_trip(const struct tok_vocab *v, const char *text, size_t len) {
    int32_t ids[128];
    size_t n = 0;
    struct llmopt_err err;
    if (tok_encode(v, text, len, false, true, ids, 128, &n, &err) == LLMOPT_OK) {
        char out[512];
        size_t got;
        (void)tok_decode(v, ids, n < 128 ? n : 128, out, sizeof out, &got, &err);
    }
}

enum llmopt_status tok_read_file(const char *path, bool optional, char **data, size_t *size,
                                 struct llmopt_err *err) {
    *data = NULL;
    *size = 0;
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        if (optional && errno == ENOENT) return LLMOPT_OK;
        return err_set(err, LLMOPT_ERR_IO, "tokenizer: %s: open failed: %s", path, strerror(errno));
    }
    struct stat sb;
    enum llmopt_status st = LLMOPT_OK;
    if (fstat(fileno(fp), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = err_set(err, LLMOPT_ERR_IO, "tokenizer: %s: not a regular file", path);
        goto out;
    }
    if ((uint64_t)sb.st_size > TOK_MAX_FILE) {
        st = err_set(err, LLMOPT_ERR_LIMIT, "tokenizer: %s: %lld bytes exceed the cap of %u", path,
                     (long long)sb.st_size, TOK_MAX_FILE);
        goto out;
    }
    size_t n = (size_t)sb.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        st = err_set(err, LLMOPT_ERR_NOMEM, "tokenizer: %s: %zu bytes", path, n);
        goto out;
    }
    if (n && fread(buf, 1, n, fp) != n) {
        free(buf);
        st = err_set(err, LLMOPT_ERR_IO, "tokenizer: %s: short read", path);
        goto out;
    }
    buf[n] = 0;
    *data = buf;
    *size = n;
out:
    fclose(fp);
    return st;
}

enum llmopt_status tok_vocab_load(const char *path, struct tok_vocab **out,
                                  struct llmopt_err *err) {
    if (!path || !out) return err_set(err, LLMOPT_ERR_INVALID_ARG, "tokenizer: NULL argument");
    struct stat sb;
    if (stat(path, &sb) != 0)
        return err_set(err, LLMOPT_ERR_IO, "tokenizer: %s: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode)) return tok_vocab_from_dir(path, out, err);
    size_t n = strlen(path);
    if (n >= 6 && strcmp(path + n - 6, ".model") == 0) {
        char *data;
        size_t size;
        enum llmopt_status st = tok_read_file(path, false, &data, &size, err);
        if (st) return st;
        st = tok_vocab_from_spm_model((const uint8_t *)data, size, out, err);
        free(data);
        if (st) err_prefix(err, "%s", path);
        return st;
    }
    struct gguf_file *f = NULL;
    enum llmopt_status st = gguf_open(path, &f, err);
    if (st) return st;
    st = tok_vocab_from_gguf(f, out, err);
    gguf_close(f);
    return st;
}

void tok_vocab_free(struct tok_vocab *v) {
    if (!v) return;
    tok_pretok_free(v->pretok);
    free(v->specials);
    free(v->merges);
    free(v->map);
    free(v->types);
    free(v->scores);
    free(v->piece_off);
    free(v->piece_bytes);
    free(v);
}

/* ---- accessors ------------------------------------------------------------------ */

enum tok_kind tok_vocab_kind(const struct tok_vocab *v) {
    return v->kind;
}
const char *tok_pre_name(const struct tok_vocab *v) {
    return v->pre_name;
}
int32_t tok_n_tokens(const struct tok_vocab *v) {
    return v->n_tokens;
}
int32_t tok_bos(const struct tok_vocab *v) {
    return v->bos;
}
int32_t tok_eos(const struct tok_vocab *v) {
    return v->eos;
}
int32_t tok_unk(const struct tok_vocab *v) {
    return v->unk;
}
int32_t tok_pad(const struct tok_vocab *v) {
    return v->pad;
}
int32_t tok_eot(const struct tok_vocab *v) {
    return v->eot;
}
bool tok_add_bos(const struct tok_vocab *v) {
    return v->add_bos && v->bos >= 0;
}
bool tok_add_eos(const struct tok_vocab *v) {
    return v->add_eos && v->eos >= 0;
}

bool tok_is_eog(const struct tok_vocab *v, int32_t id) {
    if (id < 0) return false;
    for (int i = 0; i < v->n_eog; i++)
        if (v->eog[i] == id) return true;
    return false;
}

int tok_eog_ids(const struct tok_vocab *v, const int32_t **ids) {
    *ids = v->eog;
    return v->n_eog;
}

const char *tok_token_text(const struct tok_vocab *v, int32_t id, size_t *len) {
    if (id < 0 || id >= v->n_tokens) {
        *len = 0;
        return NULL;
    }
    *len = tok_piece_len(v, id);
    return tok_piece_ptr(v, id);
}

float tok_token_score(const struct tok_vocab *v, int32_t id) {
    return id >= 0 && id < v->n_tokens ? v->scores[id] : 0.0f;
}

enum tok_type tok_token_type(const struct tok_vocab *v, int32_t id) {
    return id >= 0 && id < v->n_tokens ? (enum tok_type)v->types[id] : TOK_TYPE_UNDEFINED;
}
