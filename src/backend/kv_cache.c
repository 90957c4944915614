#include "backend/kv_cache.h"

#include <stdlib.h>
#include <string.h>

_Static_assert(KV_CACHE_ELEM_BYTES == sizeof(**((struct kv_cache *)0)->k),
               "KV_CACHE_ELEM_BYTES must match the element type of kv_cache.k/v");

uint64_t kv_cache_storage_bytes(int32_t n_layers, const int32_t *row_elems, int32_t n_blocks,
                                int32_t block_size) {
    uint64_t total = 0;
    for (int32_t l = 0; l < n_layers; l++)
        total += 2 * (uint64_t)n_blocks * (uint64_t)block_size * (uint64_t)row_elems[l] * KV_CACHE_ELEM_BYTES;
    return total;
}

enum llmopt_status kv_cache_create(int32_t n_layers, const int32_t *row_elems, int32_t n_slots,
                                   int32_t max_positions, int32_t n_blocks, int32_t block_size,
                                   struct kv_cache **out, struct llmopt_err *err) {
    if (n_layers < 0 || n_slots < 1 || max_positions < 1 || n_blocks < 1 || block_size < 1)
        return err_set(err, LLMOPT_ERR_INVALID_ARG,
                       "kv cache: bad sizes (layers %d, slots %d, positions %d, blocks %d x %d)",
                       n_layers, n_slots, max_positions, n_blocks, block_size);
    struct kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv) return err_set(err, LLMOPT_ERR_NOMEM, "kv cache: out of memory");
    kv->n_layers = n_layers;
    kv->n_slots = n_slots;
    kv->block_size = block_size;
    kv->n_blocks = n_blocks;
    kv->max_positions = max_positions;
    kv->max_blocks_per_slot = (max_positions + block_size - 1) / block_size;
    kv->row_elems = calloc((size_t)(n_layers ? n_layers : 1), sizeof *kv->row_elems);
    kv->k = calloc((size_t)(n_layers ? n_layers : 1), sizeof *kv->k);
    kv->v = calloc((size_t)(n_layers ? n_layers : 1), sizeof *kv->v);
    kv->block_table = malloc((size_t)n_slots * (size_t)kv->max_blocks_per_slot * sizeof(int32_t));
    kv->slot_len = calloc((size_t)n_slots, sizeof(int32_t));
    kv->slot_blocks = calloc((size_t)n_slots, sizeof(int32_t));
    kv->free_blocks = malloc((size_t)n_blocks * sizeof(int32_t));
    if (!kv->row_elems || !kv->k || !kv->v || !kv->block_table || !kv->slot_len ||
        !kv->slot_blocks || !kv->free_blocks)
        goto oom;
    for (int32_t l = 0; l < n_layers; l++) {
        kv->row_elems[l] = row_elems[l];
        size_t n = (size_t)n_blocks * (size_t)block_size * (size_t)row_elems[l];
        kv->k[l] = calloc(n, sizeof(float));
        kv->v[l] = calloc(n, sizeof(float));
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

void kv_cache_free(struct kv_cache *kv) {
    if (!kv) return;
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
    free(kv->block_table);
    free(kv->slot_len);
    free(kv->slot_blocks);
    free(kv->free_blocks);
    free(kv);
}

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
    if (need > kv->n_free)
        return err_set(err, LLMOPT_ERR_LIMIT, "kv cache: %d more blocks needed, %d free", need,
                       kv->n_free);
    int32_t *table = kv->block_table + (int64_t)slot * kv->max_blocks_per_slot;
    for (int32_t i = 0; i < need; i++) table[kv->slot_blocks[slot]++] = kv->free_blocks[--kv->n_free];
    return LLMOPT_OK;
}

void kv_cache_release(struct kv_cache *kv, int32_t slot) {
    if (slot < 0 || slot >= kv->n_slots) return;
    int32_t *table = kv->block_table + (int64_t)slot * kv->max_blocks_per_slot;
    for (int32_t i = 0; i < kv->slot_blocks[slot]; i++) {
        kv->free_blocks[kv->n_free++] = table[i];
        table[i] = -1;
    }
    kv->slot_blocks[slot] = 0;
    kv->slot_len[slot] = 0;
    for (int32_t l = 0; l < kv->n_conv_layers; l++) {
        size_t row = (size_t)kv->conv_rows[l] * (size_t)kv->conv_channels[l];
        memset(kv->conv[l] + (size_t)slot * row, 0, row * sizeof(float));
    }
}

int32_t kv_cache_blocks_in_use(const struct kv_cache *kv) { return kv->n_blocks - kv->n_free; }
