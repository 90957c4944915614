/* Bump allocator for objects that die together (IR, parsed files). Chunks grow
 * geometrically; arena_free releases everything at once. */
#ifndef LLMOPT_BASE_ARENA_H
#define LLMOPT_BASE_ARENA_H

#include <stddef.h>

struct arena_chunk;
struct arena {
    struct arena_chunk *head;
    size_t used_total;
};

void arena_init(struct arena *a);
/* 16-byte aligned, zeroed; NULL on OOM. */
void *arena_alloc(struct arena *a, size_t size);
char *arena_strndup(struct arena *a, const char *s, size_t n);
void arena_free(struct arena *a);

#endif
