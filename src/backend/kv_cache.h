/* Paged KV cache, owned by the runtime and read by backends' attention kernels, plus
 * the conv state of short_conv layers (the other runtime-owned state).
 *
 * Positions of a sequence (slot) live in fixed-size blocks; a per-slot block table
 * maps position / block_size to a block id. Blocks come from one free list shared by
 * all slots, so a long sequence and many short ones share memory. Every layer uses
 * the same block ids; each layer has its own storage because layers may differ in
 * KV heads and head size. Storage is allocated once at creation: reserving blocks
 * during a step never touches the heap.
 *
 * Element type (kv_dtype): rows are stored as f32, f16 (IEEE half, rounded to
 * nearest even on write) or q8_0 (ggml's block_q8_0: 32 int8 quants and an f16
 * scale per block, format/quant.h). Writers convert with kv_cache_write; attention
 * kernels read the stored type directly (dequantizing in registers), the reference
 * path through kv_cache_read. For q8_0 every head must start on a block: head_dim a
 * multiple of 32 (the session checks it).
 *
 * Prefix reuse (kv_cache_prefix_*, when enabled): a full block whose rows a sequence
 * computed can be published with the tokens at its positions. Released by every
 * sequence, a published block stays cached (evicted oldest first, and only when
 * kv_cache_reserve finds no free block), and a later sequence that begins with the same
 * tokens attaches it instead of computing it again. A block matches when its tokens
 * and its parent (the block before it, by id and publish generation) match, so an
 * attached chain is exactly a token prefix. Shared blocks are read-only in effect: a
 * sequence only writes positions past the blocks it attached, and only full blocks are
 * published. Not for caches with conv state, which is not per position.
 *
 * Conv state (kv_cache_add_conv_state): for each short_conv layer and slot, the last
 * L-1 inputs of the sequence, L the layer's kernel size; row (pos % (L-1)) holds the
 * input at position pos. A short_conv kernel reads the rows of positions before its
 * batch, then writes the batch's inputs; releasing a slot zeroes its rows. Unlike the
 * KV cache it cannot be rolled back: a forward that fails part way leaves the slot's
 * conv state undefined (release it). */
#ifndef LLMOPT_BACKEND_KV_CACHE_H
#define LLMOPT_BACKEND_KV_CACHE_H

#include "base/status.h"

#include <stdbool.h>
#include <stdint.h>

enum kv_dtype {
    KV_DTYPE_F32,
    KV_DTYPE_F16,
    KV_DTYPE_Q8_0,
    KV_DTYPE_COUNT
};
#define KV_Q8_0_BLOCK 32       /* values per q8_0 block */
#define KV_Q8_0_BLOCK_BYTES 34 /* f16 scale + 32 int8 (sizeof(block_q8_0)) */
/* "f32", "f16", "q8_0". */
const char *kv_dtype_name(enum kv_dtype t);
/* Bytes of n values of type t (n a multiple of KV_Q8_0_BLOCK for q8_0). */
static inline int64_t kv_dtype_bytes(enum kv_dtype t, int64_t n) {
    return t == KV_DTYPE_F32 ? n * 4 : t == KV_DTYPE_F16 ? n * 2 : n / KV_Q8_0_BLOCK * KV_Q8_0_BLOCK_BYTES;
}

struct kv_cache {
    int32_t n_layers;
    int32_t n_slots;       /* sequences that can be live at once */
    int32_t block_size;    /* positions per block */
    int32_t n_blocks;      /* total blocks */
    int32_t max_positions; /* per sequence */
    int32_t max_blocks_per_slot;
    enum kv_dtype dtype;   /* element type of k and v */
    int32_t *row_elems;    /* (n_layers) Hkv * Dh */
    int64_t *row_bytes;    /* (n_layers) kv_dtype_bytes(dtype, row_elems[l]) */
    uint8_t **k;           /* (n_layers) each (n_blocks, block_size, row_bytes[l]) */
    uint8_t **v;           /* (n_layers) same */
    int32_t *block_table;  /* (n_slots, max_blocks_per_slot); -1 = none */
    int32_t *slot_len;     /* (n_slots) positions written so far */
    int32_t *slot_blocks;  /* (n_slots) blocks held */
    int32_t *free_blocks;  /* (n_blocks) stack of free block ids (unheld, not cached) */
    int32_t n_free;
    int32_t *refs;         /* (n_blocks) slot tables holding the block */
    struct kv_prefix *prefix; /* NULL: prefix reuse off */
    int32_t n_conv_layers;   /* short_conv layers */
    int32_t *conv_rows;      /* (n_conv_layers) L - 1 */
    int32_t *conv_channels;  /* (n_conv_layers) C */
    float **conv;            /* (n_conv_layers) each (n_slots, conv_rows[l], conv_channels[l]) */
};

/* row_elems: (n_layers) values per KV row, multiples of KV_Q8_0_BLOCK for q8_0. */
enum llmopt_status kv_cache_create(int32_t n_layers, const int32_t *row_elems, enum kv_dtype dtype,
                                   int32_t n_slots, int32_t max_positions, int32_t n_blocks,
                                   int32_t block_size, struct kv_cache **out, struct llmopt_err *err);
/* Bytes of K and V storage together (what the cache costs in memory). */
int64_t kv_cache_bytes(const struct kv_cache *kv);
void kv_cache_free(struct kv_cache *kv);
/* Bytes kv_cache_create allocates for K and V of n_layers layers of row_elems[l]
 * values of dtype per position, n_blocks blocks of block_size positions (llmopt mem
 * sizes a cache with it before creating one). */
int64_t kv_cache_storage_bytes(int32_t n_layers, const int32_t *row_elems, enum kv_dtype dtype,
                               int32_t n_blocks, int32_t block_size);

/* Adds conv state for n_layers short_conv layers (rows[l] = L - 1, channels[l] = C),
 * zeroed; once, after kv_cache_create. */
enum llmopt_status kv_cache_add_conv_state(struct kv_cache *kv, int32_t n_layers, const int32_t *rows,
                                           const int32_t *channels, struct llmopt_err *err);

/* Makes positions [0, n_positions) of slot addressable; LLMOPT_ERR_LIMIT when the
 * sequence would exceed max_positions or no free block is left (nothing changes then).
 * Cached prefix blocks nobody holds count as free: the oldest are evicted first. */
enum llmopt_status kv_cache_reserve(struct kv_cache *kv, int32_t slot, int32_t n_positions,
                                    struct llmopt_err *err);
/* Returns the slot's blocks to the free list (or, published ones, to the prefix cache)
 * and empties it (conv state zeroed). */
void kv_cache_release(struct kv_cache *kv, int32_t slot);
/* Blocks some slot holds (cached prefix blocks nobody holds are not in use). */
int32_t kv_cache_blocks_in_use(const struct kv_cache *kv);

/* Turns prefix reuse on (LLMOPT_ERR_INVALID_ARG with conv state). */
enum llmopt_status kv_cache_prefix_enable(struct kv_cache *kv, struct llmopt_err *err);
/* An empty slot takes the longest chain of cached blocks whose tokens are a prefix of
 * tokens[0, n - 1) (the last token is left to compute: its logits are wanted). Returns
 * the positions attached (a multiple of block_size; 0 when off or nothing matches). */
int32_t kv_cache_prefix_attach(struct kv_cache *kv, int32_t slot, const int32_t *tokens, int32_t n);
/* Publishes the slot's full blocks within its first n positions, tokens[0, n) being
 * the tokens at those positions (n <= the positions written). Already published
 * blocks, and blocks equal to a cached one, are left as they are. */
void kv_cache_prefix_publish(struct kv_cache *kv, int32_t slot, const int32_t *tokens, int32_t n);
/* Published blocks (held or not). */
int32_t kv_cache_blocks_cached(const struct kv_cache *kv);

/* Row (row_bytes[layer] bytes of dtype) for (slot, pos); the block must be reserved. */
static inline uint8_t *kv_cache_row(const struct kv_cache *kv, uint8_t *const *store, int32_t layer,
                                    int32_t slot, int32_t pos) {
    int32_t block = kv->block_table[(int64_t)slot * kv->max_blocks_per_slot + pos / kv->block_size];
    int64_t row = (int64_t)block * kv->block_size + pos % kv->block_size;
    return store[layer] + row * kv->row_bytes[layer];
}
/* Values [col, col + n) of row (slot, pos) = src converted to dtype (f16: round to
 * nearest even; q8_0: per block, col and n multiples of KV_Q8_0_BLOCK). */
void kv_cache_write(const struct kv_cache *kv, uint8_t *const *store, int32_t layer, int32_t slot,
                    int32_t pos, int64_t col, const float *src, int64_t n);
/* dst[0..n) = values [col, col + n) of row (slot, pos), widened to f32 (same
 * alignment rule as kv_cache_write). */
void kv_cache_read(const struct kv_cache *kv, uint8_t *const *store, int32_t layer, int32_t slot,
                   int32_t pos, int64_t col, float *dst, int64_t n);

/* Conv-state row (conv_channels[layer] floats) of position pos >= 0 of slot. */
static inline float *kv_cache_conv_row(const struct kv_cache *kv, int32_t layer, int32_t slot, int32_t pos) {
    int64_t rows = kv->conv_rows[layer];
    return kv->conv[layer] + ((int64_t)slot * rows + pos % rows) * kv->conv_channels[layer];
}

/* Reference kernels of the state ops over this cache, in src/backend/cpu/ref_state.c
 * (declared here so every backend reaches them through backend.h). short_conv node i
 * of g: operand and result data at arena + offset[node] (parameters, also through
 * reshapes, at their bound weight), extents of the current step in extent[]. */
struct ir_graph;
struct ir_extent;
enum llmopt_status ref_short_conv(const struct ir_graph *g, int32_t i, const struct ir_extent *extent,
                                  uint8_t *arena, const int64_t *offset, struct kv_cache *kv,
                                  struct llmopt_err *err);

#endif
