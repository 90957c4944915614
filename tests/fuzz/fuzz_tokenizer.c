/* Fuzz entry point for the tokenizer: the input bytes are encoded (special tokens
 * parsed or not, by the first byte), the ids decoded through the streaming
 * detokenizer, and the input reinterpreted as ids is decoded too. The vocabulary
 * comes from $LLMOPT_FUZZ_VOCAB (a GGUF, a tokenizer.model or a Hugging Face
 * directory), by default the Llama-2 vocabulary in ../shared; fuzz_tokenizer_bpe.c
 * runs the same on a byte-level BPE vocabulary (shared parts: tokenizer_fuzz.h). */
#include "tokenizer_fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct tok_vocab *v =
        fuzz_tok_vocab(LLMOPT_SOURCE_DIR "/../shared/tokenizers/ggml-vocab-llama-spm.gguf", "fuzz_tokenizer");
    size_t cap = size + 2, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    char out[256];
    struct llmopt_err err;
    bool special = size > 0 && (data[0] & 1);
    if (ids && tok_encode(v, (const char *)data, size, tok_bos(v) >= 0, special, ids, cap, &n,
                          &err) == LLMOPT_OK)
        fuzz_tok_stream(v, ids, n, out, sizeof out);
    fuzz_tok_stream_bytes(v, data, size, out, sizeof out);
    free(ids);
    return 0;
}
