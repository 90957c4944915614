/* Tokenizers read from a GGUF vocabulary: SentencePiece-style BPE ("llama" model,
 * Llama 2 family) now; byte-level BPE ("gpt2") comes later behind the same API.
 *
 * Encoding matches llama.cpp's SPM tokenizer: a dummy-prefix space, every ' ' written
 * as U+2581 "▁", the text split into UTF-8 characters, then adjacent pairs merged by
 * the highest vocab score of the merged piece (ties: leftmost) until none merges;
 * leftover characters that are not pieces become byte tokens <0xXX>. No special-token
 * parsing: "<s>" in the text is plain text.
 *
 * Decoding is streaming: tok_stream takes one id at a time and emits only whole UTF-8
 * code points, so byte-fallback tokens of one character may arrive separately. */
#ifndef LLMOPT_TOKENIZER_TOKENIZER_H
#define LLMOPT_TOKENIZER_TOKENIZER_H

#include "base/status.h"
#include "format/gguf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Caps on what a vocabulary file or a caller can make the tokenizer allocate. */
#define TOK_MAX_TOKENS (1 << 22)        /* tokens in a vocabulary */
#define TOK_MAX_PIECE (1 << 16)         /* bytes in one token's piece */
#define TOK_MAX_PIECE_BYTES (1u << 28)  /* bytes of all pieces together */
#define TOK_MAX_TEXT (1u << 24)         /* bytes of text in one tok_encode call */

enum tok_kind {
    TOK_KIND_SPM, /* SentencePiece BPE with scores and byte fallback ("llama") */
    TOK_KIND_COUNT
};
const char *tok_kind_name(enum tok_kind kind);

/* Token types, as numbered in tokenizer.ggml.token_type (on disk; append-only). */
enum tok_type {
    TOK_TYPE_UNDEFINED = 0,
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER_DEFINED = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6,
    TOK_TYPE_COUNT
};
const char *tok_type_name(enum tok_type type);

/* Opaque: pieces, scores, types, special ids and a piece -> id hash map. */
struct tok_vocab;

/* Reads tokenizer.ggml.{model, tokens, scores, token_type, bos/eos/unknown/padding/
 * eot_token_id, add_bos_token, add_eos_token, add_space_prefix}. A model other than
 * "llama" is LLMOPT_ERR_UNSUPPORTED; missing or inconsistent arrays, ids out of range
 * and caps exceeded are LLMOPT_ERR_FORMAT / LLMOPT_ERR_LIMIT. The vocab copies what it
 * needs: f may be closed afterwards. */
enum llmopt_status tok_vocab_from_gguf(const struct gguf_file *f, struct tok_vocab **out,
                                       struct llmopt_err *err);
void tok_vocab_free(struct tok_vocab *v);

enum tok_kind tok_vocab_kind(const struct tok_vocab *v);
int32_t tok_n_tokens(const struct tok_vocab *v);
int32_t tok_bos(const struct tok_vocab *v); /* -1 when none */
int32_t tok_eos(const struct tok_vocab *v); /* -1 when none */
int32_t tok_unk(const struct tok_vocab *v); /* -1 when none */
int32_t tok_pad(const struct tok_vocab *v); /* -1 when none */
int32_t tok_eot(const struct tok_vocab *v); /* -1 when none */
/* Whether a prompt should start with BOS (add_bos_token, default true, and a BOS
 * exists) / end with EOS (add_eos_token, default false; tok_encode never adds it). */
bool tok_add_bos(const struct tok_vocab *v);
bool tok_add_eos(const struct tok_vocab *v);
/* End of generation: eos or eot. */
bool tok_is_eog(const struct tok_vocab *v, int32_t id);

/* The piece as stored in the vocabulary (with "▁", "<0x0A>" spelled out); not
 * NUL-terminated. NULL and *len = 0 for an id out of range. */
const char *tok_token_text(const struct tok_vocab *v, int32_t id, size_t *len);
/* Score and type of a token; 0 / TOK_TYPE_UNDEFINED for an id out of range. */
float tok_token_score(const struct tok_vocab *v, int32_t id);
enum tok_type tok_token_type(const struct tok_vocab *v, int32_t id);
/* Id of the piece s[0..n), or -1. */
int32_t tok_find(const struct tok_vocab *v, const char *s, size_t n);

/* Encodes text[0..len) (any bytes; need not be NUL-terminated), prepending BOS when
 * add_bos. Writes at most cap ids and sets *n_ids to the count the text needs; when
 * that exceeds cap the result is LLMOPT_ERR_LIMIT (ids holds the first cap). Text over
 * TOK_MAX_TEXT bytes is LLMOPT_ERR_LIMIT; add_bos without a BOS in the vocab is
 * LLMOPT_ERR_INVALID_ARG. Allocates working memory proportional to len. */
enum llmopt_status tok_encode(const struct tok_vocab *v, const char *text, size_t len,
                              bool add_bos, int32_t *ids, size_t cap, size_t *n_ids,
                              struct llmopt_err *err);

/* The text bytes of one token: "▁" -> ' ' in normal pieces, <0xXX> -> that byte,
 * control / unused / undefined -> nothing, unknown -> "▅" (U+2585, as llama.cpp
 * prints it), user-defined -> the piece as is. Writes min(length, cap) bytes, no NUL,
 * and returns the full length (like snprintf); 0 for an id out of range. The bytes
 * need not be valid UTF-8 on their own (a byte token is one byte of a character). */
size_t tok_piece(const struct tok_vocab *v, int32_t id, char *buf, size_t cap);

/* Streaming detokenizer. Fixed-size state, no allocation. Holds back the bytes of an
 * incomplete UTF-8 sequence until it completes; bytes that cannot form a valid
 * sequence come out as U+FFFD (one per maximal invalid subpart, as WHATWG/Unicode
 * recommend). Drops the one leading space of the first text after the start (or after
 * BOS) when the vocab adds a dummy prefix, as SentencePiece's decoder does. */
struct tok_stream {
    const struct tok_vocab *vocab;
    uint8_t pending[4]; /* bytes of an incomplete UTF-8 sequence */
    uint8_t n_pending;  /* bytes held in pending */
    uint8_t n_need;     /* total length of the sequence pending starts */
    bool strip_space;   /* drop a leading ' ' from the next piece with text */
    uint64_t n_dropped; /* bytes that did not fit in callers' buffers (lost) */
};

void tok_stream_init(struct tok_stream *s, const struct tok_vocab *v);
/* Bytes that one tok_stream_push can write at most for this vocab; a buffer of this
 * size never drops output. tok_stream_flush writes at most 3 bytes. */
size_t tok_stream_max_out(const struct tok_vocab *v);
/* Feeds one id; writes the completed text to out and returns the bytes written. Output
 * is whole code points only; when out is too small the rest of this call's output is
 * dropped (counted in s->n_dropped). Ids out of range produce nothing. */
size_t tok_stream_push(struct tok_stream *s, int32_t id, char *out, size_t cap);
/* Ends the text: a held-back incomplete sequence comes out as U+FFFD. */
size_t tok_stream_flush(struct tok_stream *s, char *out, size_t cap);

/* Whole-sequence decode through a tok_stream (flushed at the end). Sets *n_out to
 * the bytes the text needs; LLMOPT_ERR_LIMIT when that exceeds cap (out then holds a
 * prefix of whole code points). */
enum llmopt_status tok_decode(const struct tok_vocab *v, const int32_t *ids, size_t n_ids,
                              char *out, size_t cap, size_t *n_out, struct llmopt_err *err);

#endif
