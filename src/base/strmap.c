#include "base/strmap.h"

#include <stdlib.h>
#include <string.h>

static uint64_t strmap_hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

void strmap_init(struct strmap *m) {
    memset(m, 0, sizeof *m);
    arena_init(&m->keys);
}

void strmap_free(struct strmap *m) {
    arena_free(&m->keys);
    free(m->slot_keys);
    free(m->slot_lens);
    free(m->slot_vals);
    memset(m, 0, sizeof *m);
}

void strmap_clear(struct strmap *m) {
    arena_free(&m->keys);
    if (m->cap) memset(m->slot_keys, 0, m->cap * sizeof *m->slot_keys);
    m->count = 0;
}

static bool strmap_grow(struct strmap *m) {
    size_t cap = m->cap ? m->cap * 2 : 64;
    const char **keys = calloc(cap, sizeof *keys);
    size_t *lens = calloc(cap, sizeof *lens);
    int32_t *vals = calloc(cap, sizeof *vals);
    if (!keys || !lens || !vals) {
        free(keys);
        free(lens);
        free(vals);
        return false;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slot_keys[i]) continue;
        size_t j = strmap_hash(m->slot_keys[i], m->slot_lens[i]) & (cap - 1);
        while (keys[j]) j = (j + 1) & (cap - 1);
        keys[j] = m->slot_keys[i];
        lens[j] = m->slot_lens[i];
        vals[j] = m->slot_vals[i];
    }
    free(m->slot_keys);
    free(m->slot_lens);
    free(m->slot_vals);
    m->slot_keys = keys;
    m->slot_lens = lens;
    m->slot_vals = vals;
    m->cap = cap;
    return true;
}

bool strmap_put(struct strmap *m, const char *key, size_t len, int32_t val) {
    if ((m->count + 1) * 2 > m->cap && !strmap_grow(m)) return false;
    size_t j = strmap_hash(key, len) & (m->cap - 1);
    while (m->slot_keys[j]) {
        if (m->slot_lens[j] == len && !memcmp(m->slot_keys[j], key, len)) {
            m->slot_vals[j] = val;
            return true;
        }
        j = (j + 1) & (m->cap - 1);
    }
    const char *copy = arena_strndup(&m->keys, key, len);
    if (!copy) return false;
    m->slot_keys[j] = copy;
    m->slot_lens[j] = len;
    m->slot_vals[j] = val;
    m->count++;
    return true;
}

bool strmap_get(const struct strmap *m, const char *key, size_t len, int32_t *val) {
    if (!m->cap) return false;
    size_t j = strmap_hash(key, len) & (m->cap - 1);
    while (m->slot_keys[j]) {
        if (m->slot_lens[j] == len && !memcmp(m->slot_keys[j], key, len)) {
            *val = m->slot_vals[j];
            return true;
        }
        j = (j + 1) & (m->cap - 1);
    }
    return false;
}
