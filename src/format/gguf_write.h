/* GGUF v3 writer (layout in format/gguf.h): metadata of every value type, tensor infos
 * with offsets computed up front, then the tensor data streamed in order, so a file of
 * many GB is written with memory for one row at a time.
 *
 *   struct gguf_w *w;  gguf_w_create(&w, err);
 *   gguf_w_set_str(w, "general.architecture", "llama", err);  ...metadata...
 *   gguf_w_add_tensor(w, "token_embd.weight", GGML_TYPE_Q8_0, 2, ne, err);  ...
 *   gguf_w_begin(w, "out.gguf", err);        header, metadata, tensor infos, padding
 *   gguf_w_write(w, bytes, n, err);  ...     tensor data in the order added; any split
 *   gguf_w_finish(w, err);                   checks every byte came, renames into place
 *   gguf_w_free(w);
 *
 * Bytes go to "<path>.partial" and are renamed to path by gguf_w_finish, so a failed or
 * interrupted write never leaves a truncated file under the real name; gguf_w_free of
 * an unfinished writer removes the partial file. Setting a key twice replaces its value
 * (the key keeps its place). Files stay within the reader's caps (GGUF_MAX_*), tensor
 * names within ggml's 63 bytes. */
#ifndef LLMOPT_FORMAT_GGUF_WRITE_H
#define LLMOPT_FORMAT_GGUF_WRITE_H

#include "format/gguf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GGUF_W_NAME_MAX          63 /* bytes in a tensor name (ggml's GGML_MAX_NAME - 1) */
#define GGUF_W_DEFAULT_ALIGNMENT 32u

struct gguf_w;

enum llmopt_status gguf_w_create(struct gguf_w **out, struct llmopt_err *err);
/* Frees w; removes the partial output file when gguf_w_finish did not succeed. */
void gguf_w_free(struct gguf_w *w);

/* ---- metadata (before gguf_w_begin) ---- */

/* One scalar of a numeric or bool type; value points at a value of that C type
 * (uint8_t ... double; bool as uint8_t 0/1). */
enum llmopt_status gguf_w_set_scalar(struct gguf_w *w, const char *key, enum gguf_type type,
                                     const void *value, struct llmopt_err *err);
enum llmopt_status gguf_w_set_u32(struct gguf_w *w, const char *key, uint32_t v,
                                  struct llmopt_err *err);
enum llmopt_status gguf_w_set_i32(struct gguf_w *w, const char *key, int32_t v,
                                  struct llmopt_err *err);
enum llmopt_status gguf_w_set_u64(struct gguf_w *w, const char *key, uint64_t v,
                                  struct llmopt_err *err);
enum llmopt_status gguf_w_set_f32(struct gguf_w *w, const char *key, float v,
                                  struct llmopt_err *err);
enum llmopt_status gguf_w_set_bool(struct gguf_w *w, const char *key, bool v,
                                   struct llmopt_err *err);
enum llmopt_status gguf_w_set_str(struct gguf_w *w, const char *key, const char *s,
                                  struct llmopt_err *err);
enum llmopt_status gguf_w_set_strn(struct gguf_w *w, const char *key, const char *s, uint64_t len,
                                   struct llmopt_err *err);
/* Array of n numbers or bools of elem_type, packed as that C type. */
enum llmopt_status gguf_w_set_array(struct gguf_w *w, const char *key, enum gguf_type elem_type,
                                    const void *elems, uint64_t n, struct llmopt_err *err);
/* Array of n strings; lens NULL: NUL-terminated strings. */
enum llmopt_status gguf_w_set_str_array(struct gguf_w *w, const char *key, const char *const *strs,
                                        const uint64_t *lens, uint64_t n, struct llmopt_err *err);
/* The kv of another (open) file, value copied byte for byte under the same key. */
enum llmopt_status gguf_w_copy_kv(struct gguf_w *w, const struct gguf_kv *kv,
                                  struct llmopt_err *err);
bool gguf_w_has_kv(const struct gguf_w *w, const char *key);
/* True when the key was there. */
bool gguf_w_remove_kv(struct gguf_w *w, const char *key);
/* Data alignment (a power of two); also sets general.alignment (u32). Default 32,
 * written as no key. */
enum llmopt_status gguf_w_set_alignment(struct gguf_w *w, uint32_t alignment,
                                        struct llmopt_err *err);
uint64_t gguf_w_n_kv(const struct gguf_w *w);

/* ---- tensors (before gguf_w_begin) ---- */

/* ne[0] is the innermost (row) length, a multiple of the type's block size. Returns
 * the tensor's index through index (may be NULL). */
enum llmopt_status gguf_w_add_tensor(struct gguf_w *w, const char *name, enum ggml_type type,
                                     uint32_t n_dims, const uint64_t *ne, uint32_t *index,
                                     struct llmopt_err *err);
uint32_t gguf_w_n_tensors(const struct gguf_w *w);
uint64_t gguf_w_tensor_bytes(const struct gguf_w *w, uint32_t index);
/* Bytes the whole file will take (valid once the tensors are added). */
uint64_t gguf_w_file_bytes(const struct gguf_w *w);

/* ---- writing ---- */

enum llmopt_status gguf_w_begin(struct gguf_w *w, const char *path, struct llmopt_err *err);
/* Appends tensor data: the bytes of tensor 0, then 1, ...; a call may end anywhere
 * and may span tensors; the padding between tensors is written by the writer. */
enum llmopt_status gguf_w_write(struct gguf_w *w, const void *data, size_t n,
                                struct llmopt_err *err);
/* Index of the tensor the next gguf_w_write continues (n_tensors when all are done). */
uint32_t gguf_w_current_tensor(const struct gguf_w *w);
enum llmopt_status gguf_w_finish(struct gguf_w *w, struct llmopt_err *err);

/* ---- tensor element types the writer knows: the reader's (f32, f16, bf16, q8_0,
 * q4_0, q5_0, q4_K, q5_K, q6_K, iq4_xs) ---- */

const char *gguf_w_type_name(enum ggml_type type); /* NULL when unknown */
bool gguf_w_type_block(enum ggml_type type, uint32_t *block_elems, uint32_t *block_bytes);
/* Bytes of a row of n elements; 0 when the type is unknown or n not a multiple of
 * its block. */
size_t gguf_w_row_bytes(enum ggml_type type, int64_t n);
/* "q8_0", "Q4_K", "f16", ... (case-insensitive) -> type; false when unknown. */
bool gguf_w_type_from_name(const char *name, enum ggml_type *out);
/* Encodes n f32 values as a row of type (quantizing with the reference quantizers);
 * decodes a row of type to f32. False when the type is unknown or n does not fit. */
bool gguf_w_encode_row(enum ggml_type type, const float *src, void *dst, int64_t n);
bool gguf_w_decode_row(enum ggml_type type, const void *src, float *dst, int64_t n);

#endif
