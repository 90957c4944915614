/* String -> int32 hash map (open addressing, FNV-1a). Keys are copied into the map's
 * own arena. Used for names in graph import and parameter binding. */
#ifndef LLMOPT_BASE_STRMAP_H
#define LLMOPT_BASE_STRMAP_H

#include "base/arena.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct strmap {
    struct arena keys;
    const char **slot_keys; /* (cap) NULL when empty */
    size_t *slot_lens;      /* (cap) */
    int32_t *slot_vals;     /* (cap) */
    size_t cap, count;
};

void strmap_init(struct strmap *m);
void strmap_free(struct strmap *m);
/* Inserts or overwrites; false on OOM. */
bool strmap_put(struct strmap *m, const char *key, size_t len, int32_t val);
bool strmap_get(const struct strmap *m, const char *key, size_t len, int32_t *val);
void strmap_clear(struct strmap *m);

#endif
