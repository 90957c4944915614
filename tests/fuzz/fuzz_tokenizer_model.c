/* Fuzz entry point for the tokenizer loaders: the input is a SentencePiece
 * tokenizer.model (the bounded protobuf reader) when its first byte is even, a
 * tokenizer.json (pre-tokenizer regexes, merges, added tokens) when odd. A vocab
 * that loads encodes and decodes a short text. Seeds: ../shared's tokenizer.model
 * and small tokenizer.json files. */
#include "tokenizer/tokenizer.h"

#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    if (data[0] & 1) return tok_fuzz_hf_json(data + 1, size - 1);
    return tok_fuzz_spm_model(data + 1, size - 1);
}
