/* GGUF v3 reader: mmap the file, parse header, metadata and tensor infos with every
 * offset and count checked; tensor data is borrowed from the mapping (zero copies).
 *
 * Layout (little-endian): magic "GGUF", u32 version, u64 n_tensors, u64 n_kv,
 * n_kv x {string key, u32 type, value}, n_tensors x {string name, u32 n_dims,
 * u64 ne[n_dims], u32 ggml_type, u64 offset}, padding to `general.alignment`
 * (default 32), then the data section; tensor offsets are relative to it. */
#ifndef LLMOPT_FORMAT_GGUF_H
#define LLMOPT_FORMAT_GGUF_H

#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Caps on what a file can make the parser allocate or loop over. */
#define GGUF_MAX_TENSORS (1u << 20)
#define GGUF_MAX_KV (1u << 16)
#define GGUF_MAX_STRING (1u << 24)    /* bytes in one string */
#define GGUF_MAX_ARRAY (1u << 26)     /* elements in one array */
#define GGUF_MAX_DIMS 4

/* Metadata value types, as numbered on disk (append-only). */
enum gguf_type {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT
};
const char *gguf_type_name(enum gguf_type type);
/* Bytes of one scalar value of type; 0 for string, array and unknown types. */
size_t gguf_type_size(enum gguf_type type);

/* Tensor element types, ggml numbering (on disk; append-only). Only the ones
 * llmopt reads are listed by name; others are rejected with their number. */
enum ggml_type {
    GGML_TYPE_F32 = 0,
    GGML_TYPE_F16 = 1,
    GGML_TYPE_Q4_0 = 2,
    GGML_TYPE_Q5_0 = 6,
    GGML_TYPE_Q8_0 = 8,
    GGML_TYPE_Q4_K = 12,
    GGML_TYPE_Q5_K = 13,
    GGML_TYPE_Q6_K = 14,
    GGML_TYPE_IQ4_XS = 23,
    GGML_TYPE_BF16 = 30,
    GGML_TYPE_COUNT = 40
};
/* Name of a tensor type ("q8_0"), or NULL when llmopt does not read it. */
const char *ggml_type_name(enum ggml_type type);
/* Elements per block and bytes per block; false when the type is unsupported. */
bool ggml_type_block(enum ggml_type type, uint32_t *block_elems, uint32_t *block_bytes);

/* A string inside the mapping: not NUL-terminated. */
struct gguf_str {
    const char *ptr;
    uint64_t len;
};

struct gguf_kv {
    struct gguf_str key;
    enum gguf_type type;
    enum gguf_type array_type; /* element type when type == GGUF_TYPE_ARRAY */
    uint64_t array_len;        /* elements when type == GGUF_TYPE_ARRAY */
    const uint8_t *data;       /* the value's bytes (for arrays: first element) */
    uint64_t offset;           /* file offset of the value, for messages */
};

struct gguf_tensor {
    struct gguf_str name;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the innermost (row) length; unused dims = 1 */
    enum ggml_type type;
    uint64_t offset;            /* relative to the data section */
    uint64_t n_bytes;
    const void *data;           /* borrowed from the mapping */
};

struct gguf_file {
    const uint8_t *base; /* whole file */
    size_t size;
    bool mapped;         /* base came from mmap (else borrowed memory) */
    uint32_t version;
    uint32_t alignment;
    uint64_t data_offset;
    uint64_t n_kv;
    struct gguf_kv *kv;        /* (n_kv) */
    uint64_t n_tensors;
    struct gguf_tensor *tensors; /* (n_tensors) */
};

/* Opens and maps path; on failure *out is untouched and err names the field/offset. */
enum llmopt_status gguf_open(const char *path, struct gguf_file **out, struct llmopt_err *err);
/* Parses a file already in memory (borrowed; must outlive the gguf_file). Used by
 * the fuzz entry point and tests. */
enum llmopt_status gguf_parse(const uint8_t *data, size_t size, struct gguf_file **out,
                              struct llmopt_err *err);
void gguf_close(struct gguf_file *f);

/* Lookups. Return NULL / false when absent or of another type. */
const struct gguf_kv *gguf_find_kv(const struct gguf_file *f, const char *key);
const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name);
bool gguf_get_u64(const struct gguf_file *f, const char *key, uint64_t *out); /* any int type >= 0 */
bool gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *out);  /* any int type */
bool gguf_get_f64(const struct gguf_file *f, const char *key, double *out);   /* float or int */
bool gguf_get_bool(const struct gguf_file *f, const char *key, bool *out);
bool gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *out);
/* Reads one kv's value; false when it is of another type (or out of range). A
 * string kv's `data` points at its u64 length; an array kv's `data` at its first
 * element (a string element starts with its u64 length). Same conversions as the
 * gguf_get_* functions above. */
bool gguf_kv_get_u64(const struct gguf_kv *kv, uint64_t *out);
bool gguf_kv_get_i64(const struct gguf_kv *kv, int64_t *out);
bool gguf_kv_get_f64(const struct gguf_kv *kv, double *out);
bool gguf_kv_get_str(const struct gguf_kv *kv, struct gguf_str *out);
/* Element i of an array of numbers (integers or floats), e.g. token scores
 * or token types; false when i >= array_len or the elements are strings. O(1). */
bool gguf_array_get_i64(const struct gguf_kv *kv, uint64_t i, int64_t *out);
bool gguf_array_get_f64(const struct gguf_kv *kv, uint64_t i, double *out);
/* Array of strings: element i (0 <= i < kv->array_len). Walks the array; O(i). Callers
 * that read all elements use gguf_str_array_iter. */
struct gguf_str_iter {
    const struct gguf_kv *kv;
    uint64_t index;
    const uint8_t *pos;
};
void gguf_str_iter_init(struct gguf_str_iter *it, const struct gguf_kv *kv);
bool gguf_str_iter_next(struct gguf_str_iter *it, struct gguf_str *out);
/* Element i of an array of strings (walks the array: O(i)); false when out of range. */
bool gguf_str_array_get(const struct gguf_kv *kv, uint64_t i, struct gguf_str *out);

/* True when s equals the NUL-terminated c. */
bool gguf_str_eq(struct gguf_str s, const char *c);

/* Prints metadata and the tensor table (llmopt inspect). */
void gguf_print(const struct gguf_file *f, FILE *out);

/* Fuzz entry point: parse, touch every value, never crash. */
int gguf_fuzz_one(const uint8_t *data, size_t size);

#endif
