/* Vocabulary from a SentencePiece tokenizer.model (a serialized ModelProto).
 *
 * The fields read (sentencepiece_model.proto numbering):
 *   ModelProto     1 pieces (repeated SentencePiece), 2 trainer_spec, 3 normalizer_spec
 *   SentencePiece  1 piece (string), 2 score (float), 3 type (enum, default NORMAL)
 *   TrainerSpec    3 model_type (UNIGRAM 1, BPE 2, ...; default UNIGRAM),
 *                  24 treat_whitespace_as_suffix, 35 byte_fallback,
 *                  40 unk_id (0), 41 bos_id (1), 42 eos_id (2), 43 pad_id (-1)
 *   NormalizerSpec 1 name, 2 precompiled_charsmap, 3 add_dummy_prefix (true),
 *                  4 remove_extra_whitespaces (true), 5 escape_whitespaces (true)
 * Everything else is skipped. The piece types use the same numbers as GGUF's
 * tokenizer.ggml.token_type, so this path and a converted GGUF give the same vocab. */
#include "tokenizer/protobuf.h"
#include "tokenizer/tok_internal.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

struct spm_spec {
    int32_t model_type;
    bool byte_fallback, suffix_ws;
    int32_t unk_id, bos_id, eos_id, pad_id;
    struct tok_str norm_name;
    size_t charsmap_len;
    bool add_dummy_prefix, remove_extra_ws, escape_ws;
};

/* The spec fields read, by kind: each stores into the spm_spec member at `at`. */
enum spec_kind {
    SPEC_INT32, /* int32_t */
    SPEC_BOOL,  /* bool */
    SPEC_STR,   /* struct tok_str, borrowed from the buffer */
    SPEC_LEN,   /* size_t: only the length of a bytes field */
};

struct spec_field {
    uint32_t number;
    enum spec_kind kind;
    size_t at; /* offsetof(struct spm_spec, ...) */
};

#define SPEC(num, kind, member)                                                                    \
    { num, kind, offsetof(struct spm_spec, member) }

static const struct spec_field trainer_fields[] = {
    SPEC(3, SPEC_INT32, model_type),    SPEC(24, SPEC_BOOL, suffix_ws),
    SPEC(35, SPEC_BOOL, byte_fallback), SPEC(40, SPEC_INT32, unk_id),
    SPEC(41, SPEC_INT32, bos_id),       SPEC(42, SPEC_INT32, eos_id),
    SPEC(43, SPEC_INT32, pad_id),
};

static const struct spec_field normalizer_fields[] = {
    SPEC(1, SPEC_STR, norm_name),         SPEC(2, SPEC_LEN, charsmap_len),
    SPEC(3, SPEC_BOOL, add_dummy_prefix), SPEC(4, SPEC_BOOL, remove_extra_ws),
    SPEC(5, SPEC_BOOL, escape_ws),
};

#undef SPEC

/* Reads one spec message (TrainerSpec or NormalizerSpec) into s; fields not in the
 * table are skipped. */
static enum llmopt_status read_spec(struct pb_reader *r, const struct spec_field *fields,
                                    size_t n_fields, struct spm_spec *s, struct llmopt_err *err) {
    struct pb_field f;
    bool more;
    enum llmopt_status st;
    while (!(st = pb_next(r, &f, &more, err)) && more) {
        const struct spec_field *sf = NULL;
        for (size_t k = 0; k < n_fields && !sf; k++)
            if (fields[k].number == f.number) sf = &fields[k];
        if (!sf) continue;
        void *dst = (char *)s + sf->at;
        switch (sf->kind) {
        case SPEC_INT32:
            st = pb_int32(r, &f, dst, err);
            break;
        case SPEC_BOOL:
            st = pb_bool(r, &f, dst, err);
            break;
        case SPEC_STR:
            if (!(st = pb_bytes(r, &f, err)))
                *(struct tok_str *)dst = (struct tok_str){(const char *)f.data, (uint32_t)f.len};
            break;
        case SPEC_LEN:
            if (!(st = pb_bytes(r, &f, err))) *(size_t *)dst = f.len;
            break;
        }
        if (st) return st;
    }
    return st;
}

/* One SentencePiece message: piece, score, type. */
static enum llmopt_status read_piece(struct pb_reader *r, struct tok_str *piece, float *score,
                                     int32_t *type, struct llmopt_err *err) {
    struct pb_field f;
    bool more, have_piece = false;
    enum llmopt_status st;
    *score = 0;
    *type = TOK_TYPE_NORMAL;
    while (!(st = pb_next(r, &f, &more, err)) && more) {
        switch (f.number) {
        case 1:
            if (!(st = pb_bytes(r, &f, err))) {
                if (f.len > TOK_MAX_PIECE)
                    return err_set(err, LLMOPT_ERR_LIMIT,
                                   "protobuf: %s: piece at offset %zu: %zu bytes exceed the cap "
                                   "of %d",
                                   r->what, f.offset, f.len, TOK_MAX_PIECE);
                *piece = (struct tok_str){(const char *)f.data, (uint32_t)f.len};
                have_piece = true;
            }
            break;
        case 2:
            st = pb_float(r, &f, score, err);
            break;
        case 3:
            st = pb_int32(r, &f, type, err);
            break;
        default:
            break;
        }
        if (st) return st;
    }
    if (st) return st;
    if (!have_piece)
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "protobuf: %s at offset %zu: expected field 1 "
                       "(piece), found none",
                       r->what, r->base);
    if (isnan(*score))
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "protobuf: %s at offset %zu: expected a score, found NaN", r->what, r->base);
    if (*type < TOK_TYPE_NORMAL || *type >= TOK_TYPE_COUNT)
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "protobuf: %s at offset %zu: expected a piece type in [1, %d], found %d",
                       r->what, r->base, TOK_TYPE_COUNT - 1, (int)*type);
    return LLMOPT_OK;
}

static enum llmopt_status check_id(const char *name, int32_t id, int32_t n,
                                   struct llmopt_err *err) {
    if (id >= -1 && id < n) return LLMOPT_OK;
    return err_set(err, LLMOPT_ERR_FORMAT,
                   "tokenizer.model: trainer_spec.%s: expected -1 or a piece id in [0, %d), "
                   "found %d",
                   name, (int)n, (int)id);
}

static enum llmopt_status check_spec(const struct spm_spec *spec, struct llmopt_err *err) {
    if (spec->model_type != 2)
        return err_set(err, LLMOPT_ERR_UNSUPPORTED,
                       "tokenizer.model: trainer_spec.model_type %d (%s) is not supported "
                       "(expected 2, BPE)",
                       (int)spec->model_type,
                       spec->model_type == 1   ? "unigram"
                       : spec->model_type == 3 ? "word"
                       : spec->model_type == 4 ? "char"
                                               : "unknown");
    if (spec->charsmap_len > 0)
        return err_set(err, LLMOPT_ERR_UNSUPPORTED,
                       "tokenizer.model: normalizer \"%.*s\" with a precompiled character map "
                       "is not supported (expected identity)",
                       spec->norm_name.len > 64 ? 64 : (int)spec->norm_name.len,
                       spec->norm_name.ptr ? spec->norm_name.ptr : "");
    if (!spec->escape_ws || spec->suffix_ws)
        return err_set(err, LLMOPT_ERR_UNSUPPORTED, "tokenizer.model: %s is not supported",
                       spec->suffix_ws ? "treat_whitespace_as_suffix"
                                       : "escape_whitespaces = false");
    return LLMOPT_OK;
}

static enum llmopt_status load_model(struct tok_vocab *v, const uint8_t *data, size_t size,
                                     struct llmopt_err *err) {
    struct spm_spec spec = {.model_type = 1,
                            .unk_id = 0,
                            .bos_id = 1,
                            .eos_id = 2,
                            .pad_id = -1,
                            .add_dummy_prefix = true,
                            .remove_extra_ws = true,
                            .escape_ws = true};
    struct pb_reader r, sub;
    struct pb_field f;
    bool more;
    enum llmopt_status st;

    /* pass 1: count the pieces, read the specs */
    size_t n = 0;
    pb_reader_init(&r, data, size, 0, "ModelProto");
    while (!(st = pb_next(&r, &f, &more, err)) && more) {
        if (f.number == 1) {
            if ((st = pb_bytes(&r, &f, err))) return st;
            if (++n > TOK_MAX_TOKENS)
                return err_set(err, LLMOPT_ERR_LIMIT, "tokenizer.model: more than %d pieces",
                               TOK_MAX_TOKENS);
        } else if (f.number == 2 || f.number == 3) {
            if ((st = pb_bytes(&r, &f, err))) return st;
            pb_reader_sub(&sub, &r, &f, f.number == 2 ? "TrainerSpec" : "NormalizerSpec");
            st = f.number == 2
                     ? read_spec(&sub, trainer_fields, LLMOPT_ARRAY_LEN(trainer_fields), &spec, err)
                     : read_spec(&sub, normalizer_fields, LLMOPT_ARRAY_LEN(normalizer_fields),
                                 &spec, err);
            if (st) return st;
        }
    }
    if (st) return st;
    if (n == 0)
        return err_set(err, LLMOPT_ERR_FORMAT, "tokenizer.model: expected pieces, found none");

    /* pass 2: the pieces (malformed pieces are reported before unsupported specs) */
    struct tok_str *pieces = malloc(n * sizeof *pieces);
    float *scores = malloc(n * sizeof *scores);
    uint8_t *types = malloc(n);
    if (!pieces || !scores || !types) {
        st = err_set(err, LLMOPT_ERR_NOMEM, "tokenizer.model: %zu pieces", n);
        goto out;
    }
    size_t i = 0;
    pb_reader_init(&r, data, size, 0, "ModelProto");
    while (!(st = pb_next(&r, &f, &more, err)) && more) {
        if (f.number != 1) continue;
        int32_t type;
        pb_reader_sub(&sub, &r, &f, "SentencePiece");
        if ((st = read_piece(&sub, &pieces[i], &scores[i], &type, err))) goto out;
        types[i++] = (uint8_t)type;
    }
    if (st) goto out;
    LLMOPT_ASSERT(i == n);
    if ((st = check_spec(&spec, err))) goto out;
    if ((st = tok_vocab_set_pieces(v, (int32_t)n, pieces, "tokenizer.model", err))) goto out;
    for (i = 0; i < n; i++) {
        v->scores[i] = scores[i] == 0 ? 0.0f : scores[i]; /* -0 -> +0 as the GGUF path */
        v->types[i] = types[i];
    }
    v->kind = TOK_KIND_SPM;
    v->add_space_prefix = spec.add_dummy_prefix;
    v->remove_extra_ws = spec.remove_extra_ws;
    v->byte_fallback = spec.byte_fallback;
    int32_t nt = (int32_t)n;
    if ((st = check_id("unk_id", spec.unk_id, nt, err)) ||
        (st = check_id("bos_id", spec.bos_id, nt, err)) ||
        (st = check_id("eos_id", spec.eos_id, nt, err)) ||
        (st = check_id("pad_id", spec.pad_id, nt, err)))
        goto out;
    v->unk = spec.unk_id;
    v->bos = spec.bos_id;
    v->eos = spec.eos_id;
    v->pad = spec.pad_id;
    v->add_bos = true; /* SentencePiece models of the Llama family start with BOS */
    st = tok_vocab_finish(v, err);
out:
    free(types);
    free(scores);
    free(pieces);
    return st;
}

enum llmopt_status tok_vocab_from_spm_model(const uint8_t *data, size_t size,
                                            struct tok_vocab **out, struct llmopt_err *err) {
    if ((!data && size) || !out)
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "tokenizer: NULL argument");
    struct tok_vocab *v = tok_vocab_new();
    if (!v) return err_set(err, LLMOPT_ERR_NOMEM, "tokenizer: vocab");
    enum llmopt_status st = load_model(v, data, size, err);
    if (st) {
        tok_vocab_free(v);
        return st;
    }
    *out = v;
    return LLMOPT_OK;
}

int tok_fuzz_spm_model(const uint8_t *data, size_t size) {
    struct tok_vocab *v = NULL;
    struct llmopt_err err;
    if (tok_vocab_from_spm_model(data, size, &v, &err) != LLMOPT_OK) return 0;
    static const char text[] = "Hello wörld <s> 日本 😀\n";
    tok_fuzz_round_trip(v, text, sizeof text - 1);
    tok_vocab_free(v);
    return 0;
}
