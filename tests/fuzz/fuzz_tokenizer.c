/* Fuzz entry point for the tokenizer: the input bytes are encoded (special tokens
 * parsed or not, by the first byte), the ids decoded through the streaming
 * detokenizer, and the input reinterpreted as ids is decoded too. The vocabulary
 * comes from $LLMOPT_FUZZ_VOCAB (a GGUF, a tokenizer.model or a Hugging Face
 * directory), by default the Llama-2 vocabulary in ../shared; fuzz_tokenizer_bpe.c
 * runs the same on a byte-level BPE vocabulary. */
#include "tokenizer/tokenizer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static struct tok_vocab *fuzz_vocab;

static struct tok_vocab *load_vocab(void) {
    if (fuzz_vocab) return fuzz_vocab;
    const char *path = getenv("LLMOPT_FUZZ_VOCAB");
    if (!path) path = "../shared/tokenizers/ggml-vocab-llama-spm.gguf";
    struct llmopt_err err;
    if (tok_vocab_load(path, &fuzz_vocab, &err)) {
        fprintf(stderr, "fuzz_tokenizer: %s\n", err.msg);
        abort();
    }
    return fuzz_vocab;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct tok_vocab *v = load_vocab();
    size_t cap = size + 2, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    char out[256];
    struct llmopt_err err;
    bool special = size > 0 && (data[0] & 1);
    if (ids && tok_encode(v, (const char *)data, size, tok_bos(v) >= 0, special, ids, cap, &n,
                          &err) == LLMOPT_OK) {
        struct tok_stream st;
        tok_stream_init(&st, v);
        for (size_t i = 0; i < n; i++) tok_stream_push(&st, ids[i], out, sizeof out);
        tok_stream_flush(&st, out, sizeof out);
    }
    struct tok_stream st;
    tok_stream_init(&st, v);
    for (size_t i = 0; i + 4 <= size; i += 4) {
        int32_t id;
        memcpy(&id, data + i, 4);
        tok_stream_push(&st, id, out, sizeof out);
    }
    tok_stream_flush(&st, out, sizeof out);
    free(ids);
    return 0;
}
