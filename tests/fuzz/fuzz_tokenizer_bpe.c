/* Fuzz entry point for byte-level BPE: fuzz_tokenizer.c's checks (encode with and
 * without special tokens, streaming decode of the ids and of the input read as ids)
 * on a byte-level vocabulary, by default the Qwen3 directory in ../shared
 * ($LLMOPT_FUZZ_VOCAB picks another). Exercises the PCRE2 pre-tokenizer on invalid
 * UTF-8, NFC and the merge heap. */
#include "tokenizer/tokenizer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static struct tok_vocab *fuzz_vocab;

static struct tok_vocab *load_vocab(void) {
    if (fuzz_vocab) return fuzz_vocab;
    const char *path = getenv("LLMOPT_FUZZ_VOCAB");
    if (!path) path = "../shared/models/qwen3-tokenizer";
    struct llmopt_err err;
    if (tok_vocab_load(path, &fuzz_vocab, &err)) {
        fprintf(stderr, "fuzz_tokenizer_bpe: %s\n", err.msg);
        abort();
    }
    return fuzz_vocab;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct tok_vocab *v = load_vocab();
    size_t cap = size + 2, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    char out[512];
    struct llmopt_err err;
    for (int special = 0; special < 2 && ids; special++) {
        if (tok_encode(v, (const char *)data, size, false, special, ids, cap, &n, &err)) continue;
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
