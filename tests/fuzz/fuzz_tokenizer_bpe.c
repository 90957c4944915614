/* Fuzz entry point for byte-level BPE: fuzz_tokenizer.c's checks (encode with and
 * without special tokens, streaming decode of the ids and of the input read as ids)
 * on a byte-level vocabulary, by default the Qwen3 directory in ../shared
 * ($LLMOPT_FUZZ_VOCAB picks another). Exercises the PCRE2 pre-tokenizer on invalid
 * UTF-8, NFC and the merge heap. */
#include "tokenizer_fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct tok_vocab *v = fuzz_tok_vocab(LLMOPT_SOURCE_DIR "/../shared/models/qwen3-tokenizer", "fuzz_tokenizer_bpe");
    size_t cap = size + 2, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    char out[512];
    struct llmopt_err err;
    for (int special = 0; special < 2 && ids; special++) {
        if (tok_encode(v, (const char *)data, size, false, special, ids, cap, &n, &err)) continue;
        fuzz_tok_stream(v, ids, n, out, sizeof out);
    }
    fuzz_tok_stream_bytes(v, data, size, out, sizeof out);
    free(ids);
    return 0;
}
