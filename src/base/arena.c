#include "base/arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct arena_chunk {
    struct arena_chunk *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

void arena_init(struct arena *a) { memset(a, 0, sizeof *a); }

void *arena_alloc(struct arena *a, size_t size) {
    size = (size + 15) & ~(size_t)15;
    if (size == 0) size = 16;
    struct arena_chunk *c = a->head;
    if (!c || c->size - c->used < size) {
        size_t want = c ? c->size * 2 : 64 * 1024;
        if (want > (64u << 20)) want = 64u << 20;
        if (want < size) want = size;
        c = malloc(sizeof *c + want);
        if (!c) return NULL;
        c->size = want;
        c->used = 0;
        c->next = a->head;
        a->head = c;
    }
    void *p = c->data + c->used;
    c->used += size;
    a->used_total += size;
    memset(p, 0, size);
    return p;
}

char *arena_strndup(struct arena *a, const char *s, size_t n) {
    char *p = arena_alloc(a, n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

void arena_free(struct arena *a) {
    struct arena_chunk *c = a->head;
    while (c) {
        struct arena_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->used_total = 0;
}
