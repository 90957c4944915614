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

/* Bytes of one stored K or V element and its type name: the cache holds f32 rows. The
 * one place that sizes of the cache are derived from (kv_cache_storage_bytes, llmopt
 * mem, the profiler's bytes read); kv_cache.c checks it against its storage type. */
#define KV_CACHE_ELEM_BYTES ((size_t)4)
#define KV_CACHE_ELEM_TYPE "f32"

struct kv_cache {
    int32_t n_layers;
    int32_t n_slots;       /* sequences that can be live at once */
    int32_t block_size;    /* positions per block */
    int32_t n_blocks;      /* total blocks */
    int32_t max_positions; /* per sequence */
    int32_t max_blocks_per_slot;
    int32_t *row_elems;    /* (n_layers) Hkv * Dh */
    float **k;             /* (n_layers) each (n_blocks, block_size, row_elems[l]) */
    float **v;             /* (n_layers) same */
    int32_t *block_table;  /* (n_slots, max_blocks_per_slot); -1 = none */
    int32_t *slot_len;     /* (n_slots) positions written so far */
    int32_t *slot_blocks;  /* (n_slots) blocks held */
    int32_t *free_blocks;  /* (n_blocks) stack of free block ids */
    int32_t n_free;
    int32_t n_conv_layers;   /* short_conv layers */
    int32_t *conv_rows;      /* (n_conv_layers) L - 1 */
    int32_t *conv_channels;  /* (n_conv_layers) C */
    float **conv;            /* (n_conv_layers) each (n_slots, conv_rows[l], conv_channels[l]) */
};

enum llmopt_status kv_cache_create(int32_t n_layers, const int32_t *row_elems, int32_t n_slots,
                                   int32_t max_positions, int32_t n_blocks, int32_t block_size,
                                   struct kv_cache **out, struct llmopt_err *err);
void kv_cache_free(struct kv_cache *kv);
/* Bytes kv_cache_create allocates for K and V of n_layers layers of row_elems[l]
 * elements per position, n_blocks blocks of block_size positions. */
uint64_t kv_cache_storage_bytes(int32_t n_layers, const int32_t *row_elems, int32_t n_blocks,
                                int32_t block_size);

/* Adds conv state for n_layers short_conv layers (rows[l] = L - 1, channels[l] = C),
 * zeroed; once, after kv_cache_create. */
enum llmopt_status kv_cache_add_conv_state(struct kv_cache *kv, int32_t n_layers, const int32_t *rows,
                                           const int32_t *channels, struct llmopt_err *err);

/* Makes positions [0, n_positions) of slot addressable; LLMOPT_ERR_LIMIT when the
 * sequence would exceed max_positions or no free block is left (nothing changes then). */
enum llmopt_status kv_cache_reserve(struct kv_cache *kv, int32_t slot, int32_t n_positions,
                                    struct llmopt_err *err);
/* Returns the slot's blocks to the free list and empties it (conv state zeroed). */
void kv_cache_release(struct kv_cache *kv, int32_t slot);
int32_t kv_cache_blocks_in_use(const struct kv_cache *kv);

/* Row (row_elems[layer] floats) for (slot, pos); the block must be reserved. */
static inline float *kv_cache_row(const struct kv_cache *kv, float *const *store, int32_t layer,
                                  int32_t slot, int32_t pos) {
    int32_t block = kv->block_table[(int64_t)slot * kv->max_blocks_per_slot + pos / kv->block_size];
    int64_t row = (int64_t)block * kv->block_size + pos % kv->block_size;
    return store[layer] + row * kv->row_elems[layer];
}

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
