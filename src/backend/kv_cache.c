#include "backend/kv_cache.h"

#include "base/fp16.h"
#include "format/quant.h"

#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(block_q8_0) == KV_Q8_0_BLOCK_BYTES && QK8_0 == KV_Q8_0_BLOCK,
               "q8_0 KV rows use ggml's block_q8_0");

static const char *const kv_dtype_names[] = {"f32", "f16", "q8_0"};
_Static_assert(sizeof kv_dtype_names / sizeof *kv_dtype_names == KV_DTYPE_COUNT, "kv_dtype names");

/* The prefix cache: published blocks indexed by (parent, parent generation, tokens)
 * in a chained hash table, and the evictable ones (published, held by no slot) in an
 * LRU list, oldest at the head. Per block arrays are (n_blocks). */
struct kv_prefix {
    int32_t *tokens;      /* (n_blocks, block_size) tokens of a published block */
    uint32_t *gen;        /* bumped at every publish of the block */
    int32_t *parent;      /* the block before it in its sequence; -1 for the first */
    uint32_t *parent_gen; /* that block's generation when this one was published */
    bool *cached;         /* published and not evicted since */
    int32_t *next;        /* next block in the same hash bucket; -1 ends */
    int32_t *lru_prev, *lru_next;
    int32_t lru_head, lru_tail, n_evictable, n_cached;
    int32_t *bucket; /* (n_buckets) first block of each bucket; -1 empty */
    uint32_t n_buckets; /* a power of two >= n_blocks */
};

const char *kv_dtype_name(enum kv_dtype t) {
    return (unsigned)t < KV_DTYPE_COUNT ? kv_dtype_names[t] : "?";
}

enum llmopt_status kv_cache_create(int32_t n_layers, const int32_t *row_elems, enum kv_dtype dtype,
                                   int32_t n_slots, int32_t max_positions, int32_t n_blocks,
                                   int32_t block_size, struct kv_cache **out, struct llmopt_err *err) {
    if (n_layers < 0 || n_slots < 1 || max_positions < 1 || n_blocks < 1 || block_size < 1)
        return err_set(err, LLMOPT_ERR_INVALID_ARG,
                       "kv cache: bad sizes (layers %d, slots %d, positions %d, blocks %d x %d)",
                       n_layers, n_slots, max_positions, n_blocks, block_size);
    if ((unsigned)dtype >= KV_DTYPE_COUNT)
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "kv cache: unknown element type %d", (int)dtype);
    for (int32_t l = 0; l < n_layers; l++)
        if (row_elems[l] < 1 || (dtype == KV_DTYPE_Q8_0 && row_elems[l] % KV_Q8_0_BLOCK))
            return err_set(err, LLMOPT_ERR_INVALID_ARG,
                           "kv cache: layer %d rows of %d values (q8_0 needs a multiple of %d)", l,
                           row_elems[l], KV_Q8_0_BLOCK);
    struct kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv) return err_set(err, LLMOPT_ERR_NOMEM, "kv cache: out of memory");
    kv->n_layers = n_layers;
    kv->n_slots = n_slots;
    kv->block_size = block_size;
    kv->n_blocks = n_blocks;
    kv->max_positions = max_positions;
    kv->dtype = dtype;
    kv->max_blocks_per_slot = (max_positions + block_size - 1) / block_size;
    kv->row_elems = calloc((size_t)(n_layers ? n_layers : 1), sizeof *kv->row_elems);
    kv->row_bytes = calloc((size_t)(n_layers ? n_layers : 1), sizeof *kv->row_bytes);
    kv->k = calloc((size_t)(n_layers ? n_layers : 1), sizeof *kv->k);
    kv->v = calloc((size_t)(n_layers ? n_layers : 1), sizeof *kv->v);
    kv->block_table = malloc((size_t)n_slots * (size_t)kv->max_blocks_per_slot * sizeof(int32_t));
    kv->slot_len = calloc((size_t)n_slots, sizeof(int32_t));
    kv->slot_blocks = calloc((size_t)n_slots, sizeof(int32_t));
    kv->free_blocks = malloc((size_t)n_blocks * sizeof(int32_t));
    kv->refs = calloc((size_t)n_blocks, sizeof(int32_t));
    if (!kv->row_elems || !kv->row_bytes || !kv->k || !kv->v || !kv->block_table || !kv->slot_len ||
        !kv->slot_blocks || !kv->free_blocks || !kv->refs)
        goto oom;
    for (int32_t l = 0; l < n_layers; l++) {
        kv->row_elems[l] = row_elems[l];
        kv->row_bytes[l] = kv_dtype_bytes(dtype, row_elems[l]);
        size_t n = (size_t)n_blocks * (size_t)block_size * (size_t)kv->row_bytes[l];
        kv->k[l] = calloc(n, 1);
        kv->v[l] = calloc(n, 1);
        if (!kv->k[l] || !kv->v[l]) goto oom;
    }
    for (int64_t i = 0; i < (int64_t)n_slots * kv->max_blocks_per_slot; i++) kv->block_table[i] = -1;
    /* Stack popped from the end: hand out low block ids first. */
    for (int32_t b = 0; b < n_blocks; b++) kv->free_blocks[b] = n_blocks - 1 - b;
    kv->n_free = n_blocks;
    *out = kv;
    return LLMOPT_OK;
oom:
    kv_cache_free(kv);
    return err_set(err, LLMOPT_ERR_NOMEM, "kv cache: out of memory (%d blocks of %d positions)",
                   n_blocks, block_size);
}

enum llmopt_status kv_cache_add_conv_state(struct kv_cache *kv, int32_t n_layers, const int32_t *rows,
                                           const int32_t *channels, struct llmopt_err *err) {
    if (kv->conv || n_layers < 0)
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "kv cache: conv state added twice or %d layers", n_layers);
    for (int32_t l = 0; l < n_layers; l++)
        if (rows[l] < 0 || channels[l] < 1)
            return err_set(err, LLMOPT_ERR_INVALID_ARG, "kv cache: conv layer %d has %d rows of %d channels", l,
                           rows[l], channels[l]);
    if (!n_layers) return LLMOPT_OK;
    kv->conv_rows = calloc((size_t)n_layers, sizeof *kv->conv_rows);
    kv->conv_channels = calloc((size_t)n_layers, sizeof *kv->conv_channels);
    kv->conv = calloc((size_t)n_layers, sizeof *kv->conv);
    if (!kv->conv_rows || !kv->conv_channels || !kv->conv) goto oom;
    kv->n_conv_layers = n_layers;
    for (int32_t l = 0; l < n_layers; l++) {
        kv->conv_rows[l] = rows[l];
        kv->conv_channels[l] = channels[l];
        size_t n = (size_t)kv->n_slots * (size_t)rows[l] * (size_t)channels[l];
        kv->conv[l] = calloc(n ? n : 1, sizeof(float));
        if (!kv->conv[l]) goto oom;
    }
    return LLMOPT_OK;
oom:
    return err_set(err, LLMOPT_ERR_NOMEM, "kv cache: out of memory for the conv state of %d layers", n_layers);
}

static void prefix_free(struct kv_prefix *p) {
    if (!p) return;
    free(p->tokens);
    free(p->gen);
    free(p->parent);
    free(p->parent_gen);
    free(p->cached);
    free(p->next);
    free(p->lru_prev);
    free(p->lru_next);
    free(p->bucket);
    free(p);
}

void kv_cache_free(struct kv_cache *kv) {
    if (!kv) return;
    prefix_free(kv->prefix);
    free(kv->refs);
    for (int32_t l = 0; l < kv->n_conv_layers && kv->conv; l++) free(kv->conv[l]);
    free(kv->conv);
    free(kv->conv_rows);
    free(kv->conv_channels);
    for (int32_t l = 0; l < kv->n_layers && kv->k && kv->v; l++) {
        free(kv->k[l]);
        free(kv->v[l]);
    }
    free(kv->k);
    free(kv->v);
    free(kv->row_elems);
    free(kv->row_bytes);
    free(kv->block_table);
    free(kv->slot_len);
    free(kv->slot_blocks);
    free(kv->free_blocks);
    free(kv);
}

/* ---- prefix cache ---- */

static uint32_t prefix_hash(const struct kv_prefix *p, int32_t parent, uint32_t parent_gen,
                            const int32_t *tokens, int32_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)(uint32_t)parent * 0xff51afd7ed558ccdull ^ parent_gen;
    for (int32_t i = 0; i < n; i++) {
        h ^= (uint32_t)tokens[i];
        h *= 0xc4ceb9fe1a85ec53ull;
        h ^= h >> 29;
    }
    return (uint32_t)(h ^ h >> 32) & (p->n_buckets - 1);
}

static void lru_unlink(struct kv_prefix *p, int32_t b) {
    int32_t prev = p->lru_prev[b], next = p->lru_next[b];
    if (prev >= 0) p->lru_next[prev] = next;
    else p->lru_head = next;
    if (next >= 0) p->lru_prev[next] = prev;
    else p->lru_tail = prev;
    p->lru_prev[b] = p->lru_next[b] = -1;
    p->n_evictable--;
}

static void lru_push(struct kv_prefix *p, int32_t b) {
    p->lru_prev[b] = p->lru_tail;
    p->lru_next[b] = -1;
    if (p->lru_tail >= 0) p->lru_next[p->lru_tail] = b;
    else p->lru_head = b;
    p->lru_tail = b;
    p->n_evictable++;
}

/* Takes b out of the cache: unlinked from its bucket (and from the LRU list when
 * evictable); its children can no longer match (their parent generation is stale). */
static void prefix_uncache(struct kv_cache *kv, int32_t b) {
    struct kv_prefix *p = kv->prefix;
    const int32_t *tok = p->tokens + (int64_t)b * kv->block_size;
    int32_t *link = &p->bucket[prefix_hash(p, p->parent[b], p->parent_gen[b], tok, kv->block_size)];
    while (*link >= 0 && *link != b) link = &p->next[*link];
    if (*link == b) *link = p->next[b];
    p->next[b] = -1;
    if (kv->refs[b] == 0) lru_unlink(p, b);
    p->cached[b] = false;
    p->n_cached--;
}

/* The cached block after (parent, parent_gen) holding tokens[0, block_size), or -1;
 * h: their prefix_hash (the caller keeps it to insert a block there). */
static int32_t prefix_find(const struct kv_cache *kv, uint32_t h, int32_t parent, uint32_t parent_gen,
                           const int32_t *tokens) {
    const struct kv_prefix *p = kv->prefix;
    const size_t bytes = (size_t)kv->block_size * sizeof *tokens;
    for (int32_t b = p->bucket[h]; b >= 0; b = p->next[b])
        if (p->parent[b] == parent && p->parent_gen[b] == parent_gen &&
            !memcmp(p->tokens + (int64_t)b * kv->block_size, tokens, bytes))
            return b;
    return -1;
}

enum llmopt_status kv_cache_prefix_enable(struct kv_cache *kv, struct llmopt_err *err) {
    if (kv->prefix) return LLMOPT_OK;
    if (kv->n_conv_layers > 0)
        return err_set(err, LLMOPT_ERR_INVALID_ARG,
                       "kv cache: prefix reuse needs per-position state only (this model has conv state)");
    struct kv_prefix *p = calloc(1, sizeof *p);
    if (!p) return err_set(err, LLMOPT_ERR_NOMEM, "kv cache: out of memory for the prefix cache");
    size_t nb = (size_t)kv->n_blocks;
    p->n_buckets = 1;
    while (p->n_buckets < nb) p->n_buckets <<= 1;
    p->tokens = malloc(nb * (size_t)kv->block_size * sizeof *p->tokens);
    p->gen = calloc(nb, sizeof *p->gen);
    p->parent = malloc(nb * sizeof *p->parent);
    p->parent_gen = calloc(nb, sizeof *p->parent_gen);
    p->cached = calloc(nb, sizeof *p->cached);
    p->next = malloc(nb * sizeof *p->next);
    p->lru_prev = malloc(nb * sizeof *p->lru_prev);
    p->lru_next = malloc(nb * sizeof *p->lru_next);
    p->bucket = malloc(p->n_buckets * sizeof *p->bucket);
    if (!p->tokens || !p->gen || !p->parent || !p->parent_gen || !p->cached || !p->next ||
        !p->lru_prev || !p->lru_next || !p->bucket) {
        prefix_free(p);
        return err_set(err, LLMOPT_ERR_NOMEM, "kv cache: out of memory for the prefix cache");
    }
    for (size_t b = 0; b < nb; b++) p->parent[b] = p->next[b] = p->lru_prev[b] = p->lru_next[b] = -1;
    for (uint32_t i = 0; i < p->n_buckets; i++) p->bucket[i] = -1;
    p->lru_head = p->lru_tail = -1;
    kv->prefix = p;
    return LLMOPT_OK;
}

int32_t kv_cache_prefix_attach(struct kv_cache *kv, int32_t slot, const int32_t *tokens, int32_t n) {
    struct kv_prefix *p = kv->prefix;
    if (!p || slot < 0 || slot >= kv->n_slots || kv->slot_blocks[slot] || n < 2) return 0;
    const int32_t bs = kv->block_size;
    int32_t *table = kv->block_table + (int64_t)slot * kv->max_blocks_per_slot;
    int32_t parent = -1, nb = 0;
    uint32_t parent_gen = 0;
    for (; (int64_t)(nb + 1) * bs <= n - 1 && nb < kv->max_blocks_per_slot; nb++) {
        const int32_t *tok = tokens + (int64_t)nb * bs;
        int32_t b = prefix_find(kv, prefix_hash(p, parent, parent_gen, tok, bs), parent, parent_gen, tok);
        if (b < 0) break;
        if (kv->refs[b]++ == 0) lru_unlink(p, b);
        table[nb] = b;
        parent = b;
        parent_gen = p->gen[b];
    }
    kv->slot_blocks[slot] = nb;
    kv->slot_len[slot] = nb * bs;
    return nb * bs;
}

void kv_cache_prefix_publish(struct kv_cache *kv, int32_t slot, const int32_t *tokens, int32_t n) {
    struct kv_prefix *p = kv->prefix;
    if (!p || slot < 0 || slot >= kv->n_slots) return;
    const int32_t bs = kv->block_size;
    if (n > kv->slot_len[slot]) n = kv->slot_len[slot];
    const int32_t *table = kv->block_table + (int64_t)slot * kv->max_blocks_per_slot;
    int32_t parent = -1;
    uint32_t parent_gen = 0;
    for (int32_t i = 0; (int64_t)(i + 1) * bs <= n; i++) {
        const int32_t *tok = tokens + (int64_t)i * bs;
        int32_t b = table[i];
        if (!p->cached[b]) {
            /* an equal block already cached (two sequences computed the same prefix):
             * chain on from that one, leave this one private */
            uint32_t h = prefix_hash(p, parent, parent_gen, tok, bs);
            int32_t twin = prefix_find(kv, h, parent, parent_gen, tok);
            if (twin >= 0) {
                b = twin;
            } else {
                memcpy(p->tokens + (int64_t)b * bs, tok, (size_t)bs * sizeof *tok);
                p->parent[b] = parent;
                p->parent_gen[b] = parent_gen;
                p->gen[b]++;
                p->next[b] = p->bucket[h];
                p->bucket[h] = b;
                p->cached[b] = true;
                p->n_cached++;
            }
        } else if (p->parent[b] != parent || p->parent_gen[b] != parent_gen) {
            break; /* cannot happen: a cached block in a table was attached along its chain */
        }
        parent = b;
        parent_gen = p->gen[b];
    }
}

int32_t kv_cache_blocks_cached(const struct kv_cache *kv) { return kv->prefix ? kv->prefix->n_cached : 0; }

enum llmopt_status kv_cache_reserve(struct kv_cache *kv, int32_t slot, int32_t n_positions,
                                    struct llmopt_err *err) {
    if (slot < 0 || slot >= kv->n_slots)
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "kv cache: slot %d out of range [0, %d)",
                       slot, kv->n_slots);
    if (n_positions > kv->max_positions)
        return err_set(err, LLMOPT_ERR_LIMIT,
                       "kv cache: sequence of %d positions exceeds the context of %d",
                       n_positions, kv->max_positions);
    int32_t need = (n_positions + kv->block_size - 1) / kv->block_size - kv->slot_blocks[slot];
    if (need <= 0) return LLMOPT_OK;
    int32_t evictable = kv->prefix ? kv->prefix->n_evictable : 0;
    if (need > kv->n_free + evictable)
        return err_set(err, LLMOPT_ERR_LIMIT, "kv cache: %d more blocks needed, %d free", need,
                       kv->n_free + evictable);
    int32_t *table = kv->block_table + (int64_t)slot * kv->max_blocks_per_slot;
    for (int32_t i = 0; i < need; i++) {
        int32_t b;
        if (kv->n_free > 0) {
            b = kv->free_blocks[--kv->n_free];
        } else { /* the least recently released cached block */
            b = kv->prefix->lru_head;
            prefix_uncache(kv, b);
        }
        kv->refs[b] = 1;
        table[kv->slot_blocks[slot]++] = b;
    }
    return LLMOPT_OK;
}

void kv_cache_release(struct kv_cache *kv, int32_t slot) {
    if (slot < 0 || slot >= kv->n_slots) return;
    int32_t *table = kv->block_table + (int64_t)slot * kv->max_blocks_per_slot;
    for (int32_t i = 0; i < kv->slot_blocks[slot]; i++) {
        int32_t b = table[i];
        if (--kv->refs[b] == 0) {
            if (kv->prefix && kv->prefix->cached[b])
                lru_push(kv->prefix, b);
            else
                kv->free_blocks[kv->n_free++] = b;
        }
        table[i] = -1;
    }
    kv->slot_blocks[slot] = 0;
    kv->slot_len[slot] = 0;
    for (int32_t l = 0; l < kv->n_conv_layers; l++) {
        size_t row = (size_t)kv->conv_rows[l] * (size_t)kv->conv_channels[l];
        memset(kv->conv[l] + (size_t)slot * row, 0, row * sizeof(float));
    }
}

int32_t kv_cache_blocks_in_use(const struct kv_cache *kv) {
    return kv->n_blocks - kv->n_free - (kv->prefix ? kv->prefix->n_evictable : 0);
}

int64_t kv_cache_storage_bytes(int32_t n_layers, const int32_t *row_elems, enum kv_dtype dtype,
                               int32_t n_blocks, int32_t block_size) {
    int64_t bytes = 0;
    for (int32_t l = 0; l < n_layers; l++)
        bytes += 2 * (int64_t)n_blocks * block_size * kv_dtype_bytes(dtype, row_elems[l]);
    return bytes;
}

int64_t kv_cache_bytes(const struct kv_cache *kv) {
    return kv_cache_storage_bytes(kv->n_layers, kv->row_elems, kv->dtype, kv->n_blocks, kv->block_size);
}

void kv_cache_write(const struct kv_cache *kv, uint8_t *const *store, int32_t layer, int32_t slot,
                    int32_t pos, int64_t col, const float *src, int64_t n) {
    uint8_t *dst = kv_cache_row(kv, store, layer, slot, pos) + kv_dtype_bytes(kv->dtype, col);
    switch (kv->dtype) {
    case KV_DTYPE_F32: memcpy(dst, src, (size_t)n * sizeof(float)); return;
    case KV_DTYPE_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = fp16_from_f32(src[i]);
            memcpy(dst + 2 * i, &h, 2);
        }
        return;
    case KV_DTYPE_Q8_0:
        LLMOPT_ASSERT(col % KV_Q8_0_BLOCK == 0 && n % KV_Q8_0_BLOCK == 0);
        quant_quantize_row_q8_0(src, dst, n);
        return;
    case KV_DTYPE_COUNT: break;
    }
    LLMOPT_ASSERT(!"kv_cache_write: bad dtype");
}

void kv_cache_read(const struct kv_cache *kv, uint8_t *const *store, int32_t layer, int32_t slot,
                   int32_t pos, int64_t col, float *dst, int64_t n) {
    static const enum ggml_type as_ggml[KV_DTYPE_COUNT] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q8_0};
    LLMOPT_ASSERT((unsigned)kv->dtype < KV_DTYPE_COUNT);
    LLMOPT_ASSERT(kv->dtype != KV_DTYPE_Q8_0 || (col % KV_Q8_0_BLOCK == 0 && n % KV_Q8_0_BLOCK == 0));
    quant_dequantize_row(as_ggml[kv->dtype], kv_cache_row(kv, store, layer, slot, pos) + kv_dtype_bytes(kv->dtype, col),
                         dst, n);
}
