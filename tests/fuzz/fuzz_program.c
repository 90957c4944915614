/* Fuzz entry point for the Model Program loader: the input is written to a temporary
 * file and loaded with full checks. Programs that name a real weights file reach the
 * node, plan and state-layout checks; seed with a compiled model.llmopt. */
#include "llmopt.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/llmopt_fuzz_program_%d.llmopt", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    struct llmopt_err err;
    struct llmopt_model *m = NULL;
    if (llmopt_model_load(path, NULL, &m, &err) == LLMOPT_OK) llmopt_model_free(m);
    llmopt_program_check(path, &err);
    unlink(path);
    return 0;
}
