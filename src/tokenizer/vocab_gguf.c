/* Vocabulary from GGUF tokenizer.ggml.* metadata: "llama" (SentencePiece BPE, with
 * scores) and "gpt2" (byte-level BPE, with merges and a named pre-tokenizer). */
#include "tokenizer/tok_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static bool is_int_type(enum gguf_type t) {
    switch (t) {
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_INT8:
    case GGUF_TYPE_UINT16:
    case GGUF_TYPE_INT16:
    case GGUF_TYPE_UINT32:
    case GGUF_TYPE_INT32:
    case GGUF_TYPE_UINT64:
    case GGUF_TYPE_INT64:
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
static enum llmopt_status read_bool(const struct gguf_file *f, const char *key, bool def, bool *out,
                                    struct llmopt_err *err) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    *out = def;
    if (kv && !gguf_get_bool(f, key, out))
        return err_set(err, LLMOPT_ERR_FORMAT, "tokenizer: %s: expected a bool, found %s", key,
                       gguf_type_name(kv->type));
    return LLMOPT_OK;
}

/* An array of strings as borrowed tok_strs (pointers into the mapping). */
static enum llmopt_status read_str_array(const struct gguf_kv *kv, const char *key, uint64_t max,
                                         struct tok_str **out, struct llmopt_err *err) {
    *out = NULL;
    if (kv->type != GGUF_TYPE_ARRAY || kv->array_type != GGUF_TYPE_STRING)
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "tokenizer: %s: expected an array of strings, found %s of %s", key,
                       gguf_type_name(kv->type), gguf_type_name(kv->array_type));
    if (kv->array_len > max)
        return err_set(err, LLMOPT_ERR_LIMIT, "tokenizer: %s: %llu strings exceed the cap of %llu",
                       key, (unsigned long long)kv->array_len, (unsigned long long)max);
    struct tok_str *a = malloc(sizeof *a * (kv->array_len ? kv->array_len : 1));
    if (!a) return err_set(err, LLMOPT_ERR_NOMEM, "tokenizer: %s", key);
    struct gguf_str_iter it;
    struct gguf_str s;
    gguf_str_iter_init(&it, kv);
    for (uint64_t i = 0; i < kv->array_len; i++) {
        if (!gguf_str_iter_next(&it, &s)) {
            free(a);
            return err_set(err, LLMOPT_ERR_FORMAT,
                           "tokenizer: %s: expected %llu strings, found %llu", key,
                           (unsigned long long)kv->array_len, (unsigned long long)i);
        }
        if (s.len > TOK_MAX_PIECE * 2ull + 1) {
            free(a);
            return err_set(err, LLMOPT_ERR_LIMIT,
                           "tokenizer: %s[%llu]: string of %llu bytes exceeds the cap of %d", key,
                           (unsigned long long)i, (unsigned long long)s.len, TOK_MAX_PIECE * 2 + 1);
        }
        a[i] = (struct tok_str){s.ptr, (uint32_t)s.len};
    }
    *out = a;
    return LLMOPT_OK;
}

/* The per-token array `key` (*kv NULL when absent): an array whose element type passes
 * type_ok (else an error expecting "an array of <elems>") with one entry per token
 * (else an error expecting "<n> <what> (one per token)"). */
static enum llmopt_status per_token_array(const struct tok_vocab *v, const struct gguf_file *f,
                                          const char *key, bool (*type_ok)(enum gguf_type),
                                          const char *elems, const char *what,
                                          const struct gguf_kv **kv, struct llmopt_err *err) {
    *kv = gguf_find_kv(f, key);
    if (!*kv) return LLMOPT_OK;
    if ((*kv)->type != GGUF_TYPE_ARRAY || !type_ok((*kv)->array_type))
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "tokenizer: %s: expected an array of %s, found %s of %s", key, elems,
                       gguf_type_name((*kv)->type), gguf_type_name((*kv)->array_type));
    if ((*kv)->array_len != (uint64_t)v->n_tokens)
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "tokenizer: %s: expected %d %s (one per token), found %llu", key,
                       (int)v->n_tokens, what, (unsigned long long)(*kv)->array_len);
    return LLMOPT_OK;
}

static bool is_f32_type(enum gguf_type t) {
    return t == GGUF_TYPE_FLOAT32;
}

static enum llmopt_status read_scores(struct tok_vocab *v, const struct gguf_file *f,
                                      struct llmopt_err *err) {
    const char *key = "tokenizer.ggml.scores";
    const struct gguf_kv *kv;
    enum llmopt_status st = per_token_array(v, f, key, is_f32_type, "float32", "scores", &kv, err);
    if (st || !kv) return st; /* absent: all 0, merges then go leftmost first, as llama.cpp */
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
    const struct gguf_kv *kv;
    enum llmopt_status st = per_token_array(v, f, key, is_int_type, "integers", "types", &kv, err);
    if (st || !kv) return st; /* absent: llama.cpp treats every token as normal */
    for (int32_t i = 0; i < v->n_tokens; i++) {
        int64_t t = -1; /* a u64 over INT64_MAX does not read: rejected below */
        if (!gguf_array_get_i64(kv, (uint64_t)i, &t)) t = -1;
        if (t < 0 || t >= TOK_TYPE_COUNT)
            return err_set(err, LLMOPT_ERR_FORMAT,
                           "tokenizer: %s[%d]: expected a type in [0, %d), found %lld", key, (int)i,
                           TOK_TYPE_COUNT, (long long)t);
        v->types[i] = (uint8_t)t;
    }
    return LLMOPT_OK;
}

static enum llmopt_status read_merges(struct tok_vocab *v, const struct gguf_file *f,
                                      struct llmopt_err *err) {
    const char *key = "tokenizer.ggml.merges";
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv)
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "tokenizer: expected key %s for a byte-level BPE vocab, found none", key);
    struct tok_str *lines = NULL, *rights = NULL;
    enum llmopt_status st = read_str_array(kv, key, TOK_MAX_MERGES, &lines, err);
    if (st) return st;
    size_t n = kv->array_len;
    rights = malloc(sizeof *rights * (n ? n : 1));
    if (!rights) {
        st = err_set(err, LLMOPT_ERR_NOMEM, "tokenizer: %s", key);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        struct tok_str line = lines[i];
        if (!tok_split_merge(line.ptr, line.len, &lines[i], &rights[i])) {
            st = err_set(err, LLMOPT_ERR_FORMAT,
                         "tokenizer: %s[%zu]: expected \"LEFT RIGHT\" (two pieces and a space), "
                         "found \"%.*s\"",
                         key, i, line.len > 48 ? 48 : (int)line.len, line.ptr);
            goto out;
        }
    }
    st = tok_vocab_set_merges(v, (int32_t)n, lines, rights, key, err);
out:
    free(rights);
    free(lines);
    return st;
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
    if (gguf_str_eq(model, "llama")) {
        v->kind = TOK_KIND_SPM;
    } else if (gguf_str_eq(model, "gpt2")) {
        v->kind = TOK_KIND_BPE;
    } else {
        int n = model.len > 64 ? 64 : (int)model.len;
        return err_set(err, LLMOPT_ERR_UNSUPPORTED,
                       "tokenizer: tokenizer.ggml.model \"%.*s\" is not supported "
                       "(expected \"llama\", SentencePiece BPE, or \"gpt2\", byte-level BPE)",
                       n, model.ptr);
    }

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

    struct tok_str *pieces = NULL;
    enum llmopt_status st =
        read_str_array(kv, "tokenizer.ggml.tokens", TOK_MAX_TOKENS, &pieces, err);
    if (st) return st;
    st = tok_vocab_set_pieces(v, (int32_t)kv->array_len, pieces, "tokenizer.ggml.tokens", err);
    free(pieces);
    if (st || (st = read_scores(v, f, err)) || (st = read_types(v, f, err))) return st;

    bool add_bos_default = true;
    if (v->kind == TOK_KIND_BPE) {
        struct gguf_str pre = {"default", 7};
        const struct gguf_kv *pkv = gguf_find_kv(f, "tokenizer.ggml.pre");
        if (pkv && !gguf_get_str(f, "tokenizer.ggml.pre", &pre))
            return err_set(err, LLMOPT_ERR_FORMAT,
                           "tokenizer: tokenizer.ggml.pre: expected a string, found %s",
                           gguf_type_name(pkv->type));
        if ((st = tok_pretok_by_name(pre.ptr, pre.len, "tokenizer.ggml.pre", &v->pretok,
                                     &v->ignore_merges, &add_bos_default, &v->nfc, err)))
            return st;
        snprintf(v->pre_name, sizeof v->pre_name, "%.*s", pre.len > 60 ? 60 : (int)pre.len,
                 pre.ptr);
        if ((st = read_merges(v, f, err))) return st;
    }
    if ((st = tok_vocab_finish_map(v, err))) return st;

    /* Defaults for absent keys: llama.cpp's for the "llama" model (old converters
     * omitted them): bos 1, eos 2, unk 0; none for byte-level BPE. */
    bool spm = v->kind == TOK_KIND_SPM;
    if ((st = read_id(f, "tokenizer.ggml.bos_token_id", spm ? 1 : -1, v->n_tokens, &v->bos, err)) ||
        (st = read_id(f, "tokenizer.ggml.eos_token_id", spm ? 2 : -1, v->n_tokens, &v->eos, err)) ||
        (st = read_id(f, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1, v->n_tokens, &v->unk,
                      err)) ||
        (st = read_id(f, "tokenizer.ggml.padding_token_id", -1, v->n_tokens, &v->pad, err)) ||
        (st = read_id(f, "tokenizer.ggml.eot_token_id", -1, v->n_tokens, &v->eot, err)) ||
        (st = read_id(f, "tokenizer.ggml.eom_token_id", -1, v->n_tokens, &v->eom, err)))
        return st;
    if ((st = read_bool(f, "tokenizer.ggml.add_bos_token", add_bos_default, &v->add_bos, err)) ||
        (st = read_bool(f, "tokenizer.ggml.add_eos_token", false, &v->add_eos, err)) ||
        (st = read_bool(f, "tokenizer.ggml.add_space_prefix", spm, &v->add_space_prefix, err)))
        return st;
    return tok_vocab_finish(v, err);
}

enum llmopt_status tok_vocab_from_gguf(const struct gguf_file *f, struct tok_vocab **out,
                                       struct llmopt_err *err) {
    if (!f || !out) return err_set(err, LLMOPT_ERR_INVALID_ARG, "tokenizer: NULL argument");
    struct tok_vocab *v = tok_vocab_new();
    if (!v) return err_set(err, LLMOPT_ERR_NOMEM, "tokenizer: vocab");
    enum llmopt_status st = vocab_load(v, f, err);
    if (st) {
        tok_vocab_free(v);
        return st;
    }
    *out = v;
    return LLMOPT_OK;
}
