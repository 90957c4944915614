/* safetensors reader: mmap each file, parse and check its JSON header, and present
 * the tensors as borrowed pointers into the mapping (zero copies). A Hugging Face
 * checkpoint directory with a sharded model.safetensors.index.json is presented
 * as one merged table.
 *
 * Layout of one file: u64 little-endian header length N, N bytes of UTF-8 JSON
 *   {"NAME": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]},
 *    ..., "__metadata__": {"key": "value", ...}}
 * then the data buffer; offsets are relative to its first byte (file offset 8 + N).
 * Shapes are row-major: the last dimension is the contiguous one. See
 * docs/formats/safetensors.md for what is checked. */
#ifndef LLMOPT_FORMAT_SAFETENSORS_H
#define LLMOPT_FORMAT_SAFETENSORS_H

#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Caps on what a file can make the reader allocate or loop over. */
#define ST_MAX_HEADER_BYTES (100u << 20) /* JSON header of one file */
#define ST_MAX_INDEX_BYTES  (64u << 20)  /* model.safetensors.index.json */
#define ST_MAX_TENSORS      (1u << 20)   /* in one file, and in all shards together */
#define ST_MAX_SHARDS       4096u
#define ST_MAX_METADATA     (1u << 16) /* distinct __metadata__ keys, all shards together */
#define ST_MAX_DIMS         8

/* Element types llmopt reads. Other safetensors dtypes (I64, F8_E4M3, ...) make the
 * whole file unsupported: a tensor that cannot be read is never silently skipped. */
enum st_dtype { ST_DTYPE_F32, ST_DTYPE_F16, ST_DTYPE_BF16, ST_DTYPE_COUNT };
const char *st_dtype_name(enum st_dtype dtype); /* as spelled in the file: "BF16" */
size_t st_dtype_size(enum st_dtype dtype);      /* bytes per element; 0 if out of range */

struct st_tensor {
    const char *name; /* NUL-terminated; owned by the st_file */
    enum st_dtype dtype;
    int n_dims;                 /* 0 for a scalar */
    int64_t shape[ST_MAX_DIMS]; /* row-major, as in the file; unused dims = 1 */
    const void *data;           /* borrowed from the mapping; alignment not guaranteed */
    uint64_t n_bytes;           /* numel * dtype size */
    uint32_t shard;             /* index of the file that holds it (st_shard_name) */
    uint64_t offset;            /* file offset of the data in that shard */
};

struct st_file; /* opaque: tensors, metadata, shard mappings and name indexes */

/* Maps and parses one .safetensors file. On failure *out is untouched and err names
 * the file, tensor and field. */
enum llmopt_status st_open_file(const char *path, struct st_file **out, struct llmopt_err *err);
/* Opens a checkpoint directory: DIR/model.safetensors.index.json when present
 * (every shard of its weight_map, each mapped once, checked against the map),
 * else DIR/model.safetensors. */
enum llmopt_status st_open_dir(const char *dir, struct st_file **out, struct llmopt_err *err);
/* Parses a file already in memory (borrowed; must outlive the st_file). Used by
 * the fuzz entry point and tests. */
enum llmopt_status st_parse(const uint8_t *data, size_t size, struct st_file **out,
                            struct llmopt_err *err);
void st_close(struct st_file *f);

/* Tensors in data order: shard by shard, by offset within a shard. */
uint64_t st_n_tensors(const struct st_file *f);
/* NULL when i >= st_n_tensors(f). */
const struct st_tensor *st_tensor_at(const struct st_file *f, uint64_t i);
const struct st_tensor *st_find_tensor(const struct st_file *f, const char *name); /* O(1) */
/* Position of t (from st_find_tensor or st_tensor_at) in st_tensor_at order. O(1). */
uint64_t st_tensor_index(const struct st_file *f, const struct st_tensor *t);
/* Product of the shape (1 for a scalar). */
int64_t st_tensor_numel(const struct st_tensor *t);

/* __metadata__ string pairs; with shards, the union (the first shard that has a key
 * gives its value). The index file's own "metadata" is not read. */
const char *st_metadata_get(const struct st_file *f, const char *key); /* NULL if absent */
uint64_t st_n_metadata(const struct st_file *f);
bool st_metadata_at(const struct st_file *f, uint64_t i, const char **key, const char **value);

/* Files behind the table: the path given to st_open_file, the plain file names of a
 * directory's shards (sorted), or "<memory>". */
uint32_t st_n_shards(const struct st_file *f);
const char *st_shard_name(const struct st_file *f, uint32_t i); /* NULL if out of range */

/* Prints shards, metadata and the tensor table (llmopt inspect). */
void st_print(const struct st_file *f, FILE *out);

/* Fuzz entry point: parse, touch every value, never crash. */
int st_fuzz_one(const uint8_t *data, size_t size);

#endif
