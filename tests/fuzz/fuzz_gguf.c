/* Fuzz entry point for the GGUF reader (libFuzzer signature; replay_main.c drives
 * it without libFuzzer). Seeds: the GGUF files under ../shared/models. */
#include "format/gguf.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return gguf_fuzz_one(data, size);
}
