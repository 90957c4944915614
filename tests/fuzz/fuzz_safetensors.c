/* Fuzz entry point for the safetensors reader (libFuzzer signature; replay_main.c
 * drives it without libFuzzer). Seeds: any .safetensors file (the header is what
 * matters; a file cut after a few tensors' data is enough). */
#include "format/safetensors.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return st_fuzz_one(data, size);
}
