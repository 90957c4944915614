/* Vocabulary: read from GGUF tokenizer.ggml.* metadata into one owned structure
 * (pieces in a single arena, scores, types, special ids, piece -> id hash map). */
#include "tokenizer/tok_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const tok_kind_names[TOK_KIND_COUNT] = {
    [TOK_KIND_SPM] = "spm",
};
_Static_assert(LLMOPT_ARRAY_LEN(tok_kind_names) == TOK_KIND_COUNT,
               "tok_kind name table out of sync");

static const char *const tok_type_names[TOK_TYPE_COUNT] = {
    [TOK_TYPE_UNDEFINED] = "undefined", [TOK_TYPE_NORMAL] = "normal",
    [TOK_TYPE_UNKNOWN] = "unknown",     [TOK_TYPE_CONTROL] = "control",
    [TOK_TYPE_USER_DEFINED] = "user_defined", [TOK_TYPE_UNUSED] = "unused",
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
    if (n > v->max_piece) return -1;
    uint32_t slot = (uint32_t)piece_hash(s, n) & v->map_mask;
    for (;;) {
        int32_t id = v->map[slot];
        if (id < 0) return -1;
        if (tok_piece_len(v, id) == n && memcmp(tok_piece_ptr(v, id), s, n) == 0) return id;
        slot = (slot + 1) & v->map_mask;
    }
}

/* Inserts every piece; a duplicate piece maps to its last id, as llama.cpp's map
 * does (later entries overwrite earlier ones). */
static enum llmopt_status build_map(struct tok_vocab *v, struct llmopt_err *err) {
    uint32_t cap = 1;
    while (cap < 2u * (uint32_t)v->n_tokens) cap <<= 1;
    v->map = malloc(sizeof *v->map * cap);
    if (!v->map)
        return err_set(err, LLMOPT_ERR_NOMEM, "tokenizer: piece map of %u slots", cap);
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

static bool is_int_type(enum gguf_type t) {
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16:
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64:
        return true;
    default:
        return false;
    }
}

/* Reads an optional token id. Absent -> def; -1 means "none"; anything else must
 * name a token. */
static enum llmopt_status read_id(const struct gguf_file *f, const char *key, int32_t def,
                                  int32_t n_tokens, int32_t *out, struct llmopt_err *err) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) {
        *out = def < n_tokens ? def : -1;
        return LLMOPT_OK;
    }
    int64_t id;
    if (!gguf_get_i64(f, key, &id))
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "tokenizer: %s: expected an integer token id, found type %s (offset %llu)",
                       key, gguf_type_name(kv->type), (unsigned long long)kv->offset);
    if (id == -1) {
        *out = -1;
        return LLMOPT_OK;
    }
    if (id < 0 || id >= n_tokens)
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "tokenizer: %s: expected a token id in [0, %d), found %lld", key,
                       (int)n_tokens, (long long)id);
    *out = (int32_t)id;
    return LLMOPT_OK;
}

/* Reads an optional flag; absent -> def. */
static enum llmopt_status read_bool(const struct gguf_file *f, const char *key, bool def,
                                    bool *out, struct llmopt_err *err) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    *out = def;
    if (kv && !gguf_get_bool(f, key, out))
        return err_set(err, LLMOPT_ERR_FORMAT, "tokenizer: %s: expected a bool, found %s", key,
                       gguf_type_name(kv->type));
    return LLMOPT_OK;
}

/* Pieces into the arena: one pass to measure and validate, one to copy. */
static enum llmopt_status read_pieces(struct tok_vocab *v, const struct gguf_kv *kv,
                                      struct llmopt_err *err) {
    struct gguf_str_iter it;
    struct gguf_str s;
    uint64_t total = 0;
    gguf_str_iter_init(&it, kv);
    for (int32_t i = 0; i < v->n_tokens; i++) {
        if (!gguf_str_iter_next(&it, &s))
            return err_set(err, LLMOPT_ERR_FORMAT,
                           "tokenizer: tokenizer.ggml.tokens: expected %d strings, found %d",
                           (int)v->n_tokens, (int)i);
        if (s.len > TOK_MAX_PIECE)
            return err_set(err, LLMOPT_ERR_LIMIT,
                           "tokenizer: token %d: piece of %llu bytes exceeds the cap of %d",
                           (int)i, (unsigned long long)s.len, TOK_MAX_PIECE);
        total += s.len;
        if (total > TOK_MAX_PIECE_BYTES)
            return err_set(err, LLMOPT_ERR_LIMIT,
                           "tokenizer: pieces exceed the cap of %u bytes in all",
                           TOK_MAX_PIECE_BYTES);
        if (s.len > v->max_piece) v->max_piece = (uint32_t)s.len;
    }
    v->piece_bytes = malloc(total ? total : 1);
    v->piece_off = malloc(sizeof *v->piece_off * ((size_t)v->n_tokens + 1));
    if (!v->piece_bytes || !v->piece_off)
        return err_set(err, LLMOPT_ERR_NOMEM, "tokenizer: %llu bytes of pieces",
                       (unsigned long long)total);
    uint32_t off = 0;
    gguf_str_iter_init(&it, kv);
    for (int32_t i = 0; i < v->n_tokens; i++) {
        LLMOPT_ASSERT(gguf_str_iter_next(&it, &s)); /* the first pass read them all */
        v->piece_off[i] = off;
        if (s.len) memcpy(v->piece_bytes + off, s.ptr, s.len);
        off += (uint32_t)s.len;
    }
    v->piece_off[v->n_tokens] = off;
    return LLMOPT_OK;
}

static enum llmopt_status read_scores(struct tok_vocab *v, const struct gguf_file *f,
                                      struct llmopt_err *err) {
    const char *key = "tokenizer.ggml.scores";
    v->scores = calloc((size_t)v->n_tokens, sizeof *v->scores);
    if (!v->scores) return err_set(err, LLMOPT_ERR_NOMEM, "tokenizer: scores");
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return LLMOPT_OK; /* all 0: merges then go leftmost first, as llama.cpp */
    if (kv->type != GGUF_TYPE_ARRAY || kv->array_type != GGUF_TYPE_FLOAT32)
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "tokenizer: %s: expected an array of float32, found %s of %s", key,
                       gguf_type_name(kv->type), gguf_type_name(kv->array_type));
    if (kv->array_len != (uint64_t)v->n_tokens)
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "tokenizer: %s: expected %d scores (one per token), found %llu", key,
                       (int)v->n_tokens, (unsigned long long)kv->array_len);
    for (int32_t i = 0; i < v->n_tokens; i++) {
        float x;
        memcpy(&x, kv->data + 4 * (size_t)i, sizeof x); /* float32, little-endian host */
        /* NaN compares false both ways and would make the merge order undefined */
        if (isnan(x))
            return err_set(err, LLMOPT_ERR_FORMAT,
                           "tokenizer: %s[%d]: expected a number, found NaN", key, (int)i);
        v->scores[i] = x == 0 ? 0.0f : x; /* -0 -> +0: equal scores, equal merge keys */
    }
    return LLMOPT_OK;
}

static enum llmopt_status read_types(struct tok_vocab *v, const struct gguf_file *f,
                                     struct llmopt_err *err) {
    const char *key = "tokenizer.ggml.token_type";
    v->types = malloc((size_t)v->n_tokens);
    if (!v->types) return err_set(err, LLMOPT_ERR_NOMEM, "tokenizer: token types");
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) {
        /* llama.cpp treats every token as normal when the array is absent */
        memset(v->types, TOK_TYPE_NORMAL, (size_t)v->n_tokens);
        return LLMOPT_OK;
    }
    if (kv->type != GGUF_TYPE_ARRAY || !is_int_type(kv->array_type))
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "tokenizer: %s: expected an array of integers, found %s of %s", key,
                       gguf_type_name(kv->type), gguf_type_name(kv->array_type));
    if (kv->array_len != (uint64_t)v->n_tokens)
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "tokenizer: %s: expected %d types (one per token), found %llu", key,
                       (int)v->n_tokens, (unsigned long long)kv->array_len);
    for (int32_t i = 0; i < v->n_tokens; i++) {
        int64_t t = -1; /* a u64 over INT64_MAX does not read: rejected below */
        if (!gguf_array_get_i64(kv, (uint64_t)i, &t)) t = -1;
        if (t < 0 || t >= TOK_TYPE_COUNT)
            return err_set(err, LLMOPT_ERR_FORMAT,
                           "tokenizer: %s[%d]: expected a type in [0, %d), found %lld", key,
                           (int)i, TOK_TYPE_COUNT, (long long)t);
        v->types[i] = (uint8_t)t;
    }
    return LLMOPT_OK;
}

/* Byte tokens are found by their spelling "<0xXX>", as llama.cpp does, whatever
 * their type says. */
static void find_byte_tokens(struct tok_vocab *v) {
    static const char hex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; b++) {
        char name[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
        v->byte_ids[b] = tok_find(v, name, sizeof name);
    }
}

static enum llmopt_status vocab_load(struct tok_vocab *v, const struct gguf_file *f,
                                     struct llmopt_err *err) {
    struct gguf_str model;
    const struct gguf_kv *kv = gguf_find_kv(f, "tokenizer.ggml.model");
    if (!kv)
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "tokenizer: expected key tokenizer.ggml.model, found none");
    if (!gguf_get_str(f, "tokenizer.ggml.model", &model))
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "tokenizer: tokenizer.ggml.model: expected a string, found %s",
                       gguf_type_name(kv->type));
    if (!gguf_str_eq(model, "llama")) {
        int n = model.len > 64 ? 64 : (int)model.len;
        return err_set(err, LLMOPT_ERR_UNSUPPORTED,
                       "tokenizer: tokenizer.ggml.model \"%.*s\" is not supported "
                       "(expected \"llama\", SentencePiece BPE)",
                       n, model.ptr);
    }
    v->kind = TOK_KIND_SPM;

    kv = gguf_find_kv(f, "tokenizer.ggml.tokens");
    if (!kv)
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "tokenizer: expected key tokenizer.ggml.tokens, found none");
    if (kv->type != GGUF_TYPE_ARRAY || kv->array_type != GGUF_TYPE_STRING)
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "tokenizer: tokenizer.ggml.tokens: expected an array of strings, "
                       "found %s of %s",
                       gguf_type_name(kv->type), gguf_type_name(kv->array_type));
    if (kv->array_len == 0 || kv->array_len > TOK_MAX_TOKENS)
        return err_set(err, kv->array_len ? LLMOPT_ERR_LIMIT : LLMOPT_ERR_FORMAT,
                       "tokenizer: tokenizer.ggml.tokens: expected 1 to %d tokens, found %llu",
                       TOK_MAX_TOKENS, (unsigned long long)kv->array_len);
    v->n_tokens = (int32_t)kv->array_len;

    enum llmopt_status st;
    if ((st = read_pieces(v, kv, err)) || (st = read_scores(v, f, err)) ||
        (st = read_types(v, f, err)) || (st = build_map(v, err)))
        return st;
    find_byte_tokens(v);

    /* Defaults for absent keys are llama.cpp's for the "llama" model (old converters
     * omitted them): bos 1, eos 2, unk 0. */
    if ((st = read_id(f, "tokenizer.ggml.bos_token_id", 1, v->n_tokens, &v->bos, err)) ||
        (st = read_id(f, "tokenizer.ggml.eos_token_id", 2, v->n_tokens, &v->eos, err)) ||
        (st = read_id(f, "tokenizer.ggml.unknown_token_id", 0, v->n_tokens, &v->unk, err)) ||
        (st = read_id(f, "tokenizer.ggml.padding_token_id", -1, v->n_tokens, &v->pad, err)) ||
        (st = read_id(f, "tokenizer.ggml.eot_token_id", -1, v->n_tokens, &v->eot, err)))
        return st;
    if ((st = read_bool(f, "tokenizer.ggml.add_bos_token", true, &v->add_bos, err)) ||
        (st = read_bool(f, "tokenizer.ggml.add_eos_token", false, &v->add_eos, err)) ||
        (st = read_bool(f, "tokenizer.ggml.add_space_prefix", true, &v->add_space_prefix, err)))
        return st;
    return LLMOPT_OK;
}

enum llmopt_status tok_vocab_from_gguf(const struct gguf_file *f, struct tok_vocab **out,
                                       struct llmopt_err *err) {
    if (!f || !out) return err_set(err, LLMOPT_ERR_INVALID_ARG, "tokenizer: NULL argument");
    struct tok_vocab *v = calloc(1, sizeof *v);
    if (!v) return err_set(err, LLMOPT_ERR_NOMEM, "tokenizer: vocab");
    enum llmopt_status st = vocab_load(v, f, err);
    if (st) {
        tok_vocab_free(v);
        return st;
    }
    *out = v;
    return LLMOPT_OK;
}

void tok_vocab_free(struct tok_vocab *v) {
    if (!v) return;
    free(v->map);
    free(v->types);
    free(v->scores);
    free(v->piece_off);
    free(v->piece_bytes);
    free(v);
}

enum tok_kind tok_vocab_kind(const struct tok_vocab *v) { return v->kind; }
int32_t tok_n_tokens(const struct tok_vocab *v) { return v->n_tokens; }
int32_t tok_bos(const struct tok_vocab *v) { return v->bos; }
int32_t tok_eos(const struct tok_vocab *v) { return v->eos; }
int32_t tok_unk(const struct tok_vocab *v) { return v->unk; }
int32_t tok_pad(const struct tok_vocab *v) { return v->pad; }
int32_t tok_eot(const struct tok_vocab *v) { return v->eot; }
bool tok_add_bos(const struct tok_vocab *v) { return v->add_bos && v->bos >= 0; }
bool tok_add_eos(const struct tok_vocab *v) { return v->add_eos && v->eos >= 0; }

bool tok_is_eog(const struct tok_vocab *v, int32_t id) {
    return id >= 0 && (id == v->eos || id == v->eot);
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
