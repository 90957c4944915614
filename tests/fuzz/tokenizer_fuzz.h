/* What fuzz_tokenizer.c and fuzz_tokenizer_bpe.c share: the vocabulary, loaded once
 * from $LLMOPT_FUZZ_VOCAB or the entry's default path (in ../shared beside the source
 * tree, found from any working directory), and the streaming decode of a
 * list of ids and of the input bytes read as ids. Each entry keeps its own encode
 * calls (the SentencePiece one adds BOS and picks special parsing by the first byte,
 * the BPE one encodes both ways). */
#ifndef LLMOPT_TOKENIZER_FUZZ_H
#define LLMOPT_TOKENIZER_FUZZ_H

#include "tokenizer/tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The vocabulary of this process; aborts naming `who` when it does not load. */
static struct tok_vocab *fuzz_tok_vocab(const char *default_path, const char *who) {
    static struct tok_vocab *vocab;
    if (vocab) return vocab;
    const char *path = getenv("LLMOPT_FUZZ_VOCAB");
    if (!path) path = default_path;
    struct llmopt_err err;
    if (tok_vocab_load(path, &vocab, &err)) {
        fprintf(stderr, "%s: %s\n", who, err.msg);
        abort();
    }
    return vocab;
}

/* Decodes ids[0..n) through a fresh streaming detokenizer into out[out_size]. */
static void fuzz_tok_stream(const struct tok_vocab *v, const int32_t *ids, size_t n, char *out,
                            size_t out_size) {
    struct tok_stream st;
    tok_stream_init(&st, v);
    for (size_t i = 0; i < n; i++) tok_stream_push(&st, ids[i], out, out_size);
    tok_stream_flush(&st, out, out_size);
}

/* Decodes the input read as native-endian int32 ids (any values, in range or not). */
static void fuzz_tok_stream_bytes(const struct tok_vocab *v, const uint8_t *data, size_t size,
                                  char *out, size_t out_size) {
    struct tok_stream st;
    tok_stream_init(&st, v);
    for (size_t i = 0; i + 4 <= size; i += 4) {
        int32_t id;
        memcpy(&id, data + i, 4);
        tok_stream_push(&st, id, out, out_size);
    }
    tok_stream_flush(&st, out, out_size);
}

#endif
