/* Tokenizers: SentencePiece-style BPE (Llama 2 family) and byte-level BPE (GPT-2,
 * Llama 3, Qwen 2/3), behind one API. Sources: a GGUF vocabulary
 * (tokenizer.ggml.*), a SentencePiece tokenizer.model (protobuf), or a Hugging Face
 * directory (tokenizer.json, or vocab.json + merges.txt, plus tokenizer_config.json).
 *
 * SentencePiece BPE ("spm") matches sentencepiece / llama.cpp: a dummy-prefix space,
 * every ' ' written as U+2581 "▁", the text split into UTF-8 characters, then
 * adjacent pairs merged by the highest vocab score of the merged piece (ties:
 * leftmost) until none merges; leftover characters that are not pieces become byte
 * tokens <0xXX> (byte fallback) or the unknown token.
 *
 * Byte-level BPE ("bpe") matches Hugging Face tokenizers: the pre-tokenizer's regexes
 * (PCRE2, Unicode classes) split the text into words; each byte of a word is written
 * as the printable code point GPT-2 assigns it (' ' -> "Ġ"); the lowest-ranked merge
 * applies first (ties: leftmost) until none applies. With ignore_merges (Llama 3) a
 * word that is itself a vocab entry is emitted whole.
 *
 * Special tokens. Before either algorithm runs, added tokens are split out of the
 * text (at each position the longest one that matches, scanning left to right):
 * user-defined tokens (HF added tokens with "special": false, e.g. <think>) always,
 * control tokens (<|im_start|>, <s>, <|eot_id|>, ...) and the unknown token only
 * when the caller asks (parse_special) — the rule of both llama.cpp and Hugging
 * Face's encode_special_tokens. Each remaining text fragment is encoded on its own
 * (for spm: each gets the dummy prefix, as llama.cpp does).
 *
 * End of generation (tok_is_eog): eos, eot (tokenizer.ggml.eot_token_id), eom
 * (tokenizer.ggml.eom_token_id), the eos_token of tokenizer_config.json and the
 * eos_token_id(s) of generation_config.json, and every control or user-defined
 * token spelled as a well-known end of turn: <|eot_id|>, <|eom_id|>, <|im_end|>,
 * <|end|>, <end_of_turn>, <|endoftext|>, <|end_of_text|>, <EOT>.
 *
 * Decoding is streaming: tok_stream takes one id at a time and emits only whole
 * UTF-8 code points, so a character split over several tokens (byte-fallback tokens,
 * byte-level pieces) comes out once it is complete. */
#ifndef LLMOPT_TOKENIZER_TOKENIZER_H
#define LLMOPT_TOKENIZER_TOKENIZER_H

#include "base/status.h"
#include "format/gguf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Caps on what a vocabulary file or a caller can make the tokenizer allocate. */
#define TOK_MAX_TOKENS      (1 << 22)  /* tokens in a vocabulary */
#define TOK_MAX_PIECE       (1 << 16)  /* bytes in one token's piece */
#define TOK_MAX_PIECE_BYTES (1u << 28) /* bytes of all pieces together */
#define TOK_MAX_TEXT        (1u << 24) /* bytes of text in one tok_encode call */
#define TOK_MAX_MERGES      (1 << 22)  /* BPE merge rules */
#define TOK_MAX_FILE        (1u << 26) /* bytes of one tokenizer file (json, txt, model) */
#define TOK_MAX_PRETOK      8          /* regexes in one pre-tokenizer sequence */
#define TOK_MAX_EOG         16         /* end-of-generation ids */

enum tok_kind {
    TOK_KIND_SPM, /* SentencePiece BPE with scores and byte fallback ("llama") */
    TOK_KIND_BPE, /* byte-level BPE with merges and a regex pre-tokenizer ("gpt2") */
    TOK_KIND_COUNT
};
const char *tok_kind_name(enum tok_kind kind);

/* Token types, as numbered in tokenizer.ggml.token_type and in SentencePiece's
 * ModelProto (on disk; append-only). */
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

/* Opaque: pieces, scores, types, special ids, merges, pre-tokenizer and a
 * piece -> id hash map. Immutable after loading: encode/decode may run on several
 * threads at once. */
struct tok_vocab;

/* Reads tokenizer.ggml.{model, pre, tokens, scores, token_type, merges,
 * bos/eos/unknown/padding/eot/eom_token_id, add_bos_token, add_eos_token,
 * add_space_prefix}. model "llama" is spm, "gpt2" byte-level BPE (pre names the
 * split regexes; absent or "default" means GPT-2's); any other model or an unknown
 * pre is LLMOPT_ERR_UNSUPPORTED naming it; missing or inconsistent arrays, malformed
 * merges, ids out of range and caps exceeded are LLMOPT_ERR_FORMAT / LLMOPT_ERR_LIMIT.
 * The vocab copies what it needs: f may be closed afterwards. */
enum llmopt_status tok_vocab_from_gguf(const struct gguf_file *f, struct tok_vocab **out,
                                       struct llmopt_err *err);
/* A SentencePiece ModelProto (the bytes of a tokenizer.model file). BPE models only
 * (a unigram model is LLMOPT_ERR_UNSUPPORTED); normalizers other than identity are
 * LLMOPT_ERR_UNSUPPORTED. Truncated or malformed protobuf is LLMOPT_ERR_FORMAT with
 * the field and offset. */
enum llmopt_status tok_vocab_from_spm_model(const uint8_t *data, size_t size,
                                            struct tok_vocab **out, struct llmopt_err *err);
/* A Hugging Face tokenizer directory: tokenizer.json (byte-level BPE), else
 * tokenizer.model (SentencePiece), else vocab.json + merges.txt (pre-tokenizer
 * chosen by tokenizer_config.json's tokenizer_class); tokenizer_config.json
 * (optional) adds special tokens, bos/eos and add_bos_token; generation_config.json
 * (optional) adds eos ids. */
enum llmopt_status tok_vocab_from_dir(const char *dir, struct tok_vocab **out,
                                      struct llmopt_err *err);
/* A path: a directory (tok_vocab_from_dir), a tokenizer.model file, or a GGUF. */
enum llmopt_status tok_vocab_load(const char *path, struct tok_vocab **out, struct llmopt_err *err);
void tok_vocab_free(struct tok_vocab *v);

enum tok_kind tok_vocab_kind(const struct tok_vocab *v);
/* The pre-tokenizer's name ("qwen2", "tokenizer.json", ...); "" for spm. */
const char *tok_pre_name(const struct tok_vocab *v);
int32_t tok_n_tokens(const struct tok_vocab *v);
int32_t tok_bos(const struct tok_vocab *v); /* -1 when none */
int32_t tok_eos(const struct tok_vocab *v); /* -1 when none */
int32_t tok_unk(const struct tok_vocab *v); /* -1 when none */
int32_t tok_pad(const struct tok_vocab *v); /* -1 when none */
int32_t tok_eot(const struct tok_vocab *v); /* -1 when none */
/* Whether a prompt should start with BOS (add_bos_token; default true for spm and
 * the Llama 3 pre-tokenizer, false for other byte-level BPE; and a BOS exists) /
 * end with EOS (add_eos_token, default false; tok_encode never adds it). */
bool tok_add_bos(const struct tok_vocab *v);
bool tok_add_eos(const struct tok_vocab *v);
/* End of generation: see the rule at the top of this file. */
bool tok_is_eog(const struct tok_vocab *v, int32_t id);
/* The end-of-generation ids, ascending; returns how many (at most TOK_MAX_EOG). */
int tok_eog_ids(const struct tok_vocab *v, const int32_t **ids);

/* The piece as stored in the vocabulary (with "▁", "<0x0A>", "Ġ" spelled out); not
 * NUL-terminated. NULL and *len = 0 for an id out of range. */
const char *tok_token_text(const struct tok_vocab *v, int32_t id, size_t *len);
/* Score and type of a token; 0 / TOK_TYPE_UNDEFINED for an id out of range. */
float tok_token_score(const struct tok_vocab *v, int32_t id);
enum tok_type tok_token_type(const struct tok_vocab *v, int32_t id);
/* Id of the piece s[0..n), or -1. */
int32_t tok_find(const struct tok_vocab *v, const char *s, size_t n);

/* Encodes text[0..len) (any bytes; need not be NUL-terminated), prepending BOS when
 * add_bos; parse_special splits control tokens out of the text (see the top of this
 * file). Writes at most cap ids and sets *n_ids to the count the text needs; when
 * that exceeds cap the result is LLMOPT_ERR_LIMIT (ids holds the first cap). Text
 * over TOK_MAX_TEXT bytes is LLMOPT_ERR_LIMIT; add_bos without a BOS in the vocab is
 * LLMOPT_ERR_INVALID_ARG. Allocates working memory proportional to len; caches
 * nothing. Invalid UTF-8 is encoded byte for byte (byte-level BPE) or through byte
 * tokens (spm). */
enum llmopt_status tok_encode(const struct tok_vocab *v, const char *text, size_t len, bool add_bos,
                              bool parse_special, int32_t *ids, size_t cap, size_t *n_ids,
                              struct llmopt_err *err);

/* The text bytes of one token. spm: "▁" -> ' ' in normal pieces, <0xXX> -> that
 * byte. bpe: each code point of a normal piece back to its byte (a piece holding a
 * code point outside GPT-2's map comes out as written). Both: control / unused /
 * undefined -> nothing, unknown -> "▅" (U+2585, as llama.cpp prints it),
 * user-defined -> the piece as is. Writes min(length, cap) bytes, no NUL, and
 * returns the full length (like snprintf); 0 for an id out of range. The bytes need
 * not be valid UTF-8 on their own (a byte token is one byte of a character). */
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

/* Fuzz entry points (bounded work on arbitrary bytes; never crash). */
int tok_fuzz_spm_model(const uint8_t *data, size_t size);
int tok_fuzz_hf_json(const uint8_t *data, size_t size);

#endif
