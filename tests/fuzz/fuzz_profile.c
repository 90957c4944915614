/* Fuzz entry point for the target-profile reader: any bytes are parsed as a profile.
 * Never crashes; a profile that parses is written, parsed again and must write the same
 * text (what the reader accepts, the writer reproduces). */
#define _GNU_SOURCE
#include "target/profile.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *write_text(const struct target_profile *p, size_t *len) {
    char *text = NULL;
    FILE *mem = open_memstream(&text, len);
    if (!mem) abort();
    struct llmopt_err err;
    if (target_profile_write_json(p, mem, &err)) abort();
    fclose(mem);
    return text;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct target_profile p, q;
    struct llmopt_err err;
    if (target_profile_parse((const char *)data, size, &p, &err)) return 0;
    size_t len1, len2;
    char *text1 = write_text(&p, &len1);
    if (target_profile_parse(text1, len1, &q, &err)) {
        fprintf(stderr, "fuzz_profile: rewritten profile rejected: %s\n", err.msg);
        abort();
    }
    char *text2 = write_text(&q, &len2);
    if (len1 != len2 || memcmp(text1, text2, len1)) abort();
    free(text1);
    free(text2);
    return 0;
}
