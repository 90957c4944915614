/* GGUF v3 writer; see gguf_write.h. Each kv is kept as its on-disk encoding (key,
 * type, value), so the header is written by concatenation and its size is known
 * before any byte is written; tensor offsets are assigned as tensors are added. */
#include "format/gguf_write.h"

#include "base/fp16.h"
#include "format/quant.h"
#include "format/quant_k.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf_write.c writes little-endian fields with memcpy: port it for big-endian hosts"
#endif

#define GGUF_W_VERSION   3u
#define GGUF_W_IO_BUFFER (4u << 20)

struct w_kv {
    char *key;     /* NUL-terminated copy, for lookups */
    uint8_t *blob; /* on-disk encoding: u64 key length, key, u32 type, value */
    size_t size;
};

struct w_tensor {
    char name[GGUF_W_NAME_MAX + 1];
    enum ggml_type type;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    uint64_t n_bytes;
    uint64_t offset; /* relative to the data section */
};

struct gguf_w {
    struct w_kv *kv; /* (n_kv) */
    uint64_t n_kv, cap_kv;
    struct w_tensor *tensors; /* (n_tensors) */
    uint32_t n_tensors, cap_tensors;
    uint32_t alignment;
    uint64_t data_bytes; /* data section, every tensor padded to the alignment */

    FILE *file;
    char *path, *partial_path;
    void *io_buffer;
    bool begun, finished;
    uint32_t cur;         /* tensor the next write continues */
    uint64_t cur_written; /* bytes of it written */
};

/* ---- a growable byte buffer for encodings ---- */

struct wbuf {
    uint8_t *data;
    size_t len, cap;
    bool failed;
};

static void wbuf_put(struct wbuf *b, const void *p, size_t n) {
    if (b->failed) return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n) cap *= 2;
        uint8_t *d = realloc(b->data, cap);
        if (!d) {
            b->failed = true;
            return;
        }
        b->data = d;
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
}

static void wbuf_u32(struct wbuf *b, uint32_t v) {
    wbuf_put(b, &v, sizeof v);
}
static void wbuf_u64(struct wbuf *b, uint64_t v) {
    wbuf_put(b, &v, sizeof v);
}

static void wbuf_str(struct wbuf *b, const char *s, uint64_t len) {
    wbuf_u64(b, len);
    wbuf_put(b, s, (size_t)len);
}

/* ---- lifetime ---- */

enum llmopt_status gguf_w_create(struct gguf_w **out, struct llmopt_err *err) {
    struct gguf_w *w = calloc(1, sizeof *w);
    if (!w) return err_set(err, LLMOPT_ERR_NOMEM, "gguf writer: out of memory");
    w->alignment = GGUF_W_DEFAULT_ALIGNMENT;
    *out = w;
    return LLMOPT_OK;
}

void gguf_w_free(struct gguf_w *w) {
    if (!w) return;
    if (w->file) fclose(w->file);
    if (w->begun && !w->finished && w->partial_path) unlink(w->partial_path);
    for (uint64_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].blob);
    }
    free(w->kv);
    free(w->tensors);
    free(w->path);
    free(w->partial_path);
    free(w->io_buffer);
    free(w);
}

/* ---- metadata ---- */

static enum llmopt_status check_open_for_layout(const struct gguf_w *w, const char *what,
                                                struct llmopt_err *err) {
    if (w->begun)
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "gguf writer: %s after gguf_w_begin", what);
    return LLMOPT_OK;
}

static struct w_kv *find_kv(const struct gguf_w *w, const char *key) {
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->kv[i].key, key)) return &w->kv[i];
    return NULL;
}

/* Starts an encoding: key and type. */
static enum llmopt_status kv_start(const struct gguf_w *w, const char *key, uint64_t key_len,
                                   enum gguf_type type, struct wbuf *b, struct llmopt_err *err) {
    enum llmopt_status st = check_open_for_layout(w, "setting a kv", err);
    if (st) return st;
    if (key_len == 0 || key_len > GGUF_MAX_STRING)
        return err_set(err, LLMOPT_ERR_INVALID_ARG,
                       "gguf writer: key of %llu bytes (expected 1..%u)",
                       (unsigned long long)key_len, GGUF_MAX_STRING);
    if (memchr(key, 0, (size_t)key_len))
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "gguf writer: key holds a NUL byte");
    wbuf_str(b, key, key_len);
    wbuf_u32(b, (uint32_t)type);
    return LLMOPT_OK;
}

/* Stores a finished encoding under key (replacing an existing one); takes b's data. */
static enum llmopt_status kv_commit(struct gguf_w *w, const char *key, uint64_t key_len,
                                    struct wbuf *b, struct llmopt_err *err) {
    char *k = b->failed ? NULL : malloc((size_t)key_len + 1);
    if (!k) {
        free(b->data);
        return err_set(err, LLMOPT_ERR_NOMEM, "gguf writer: out of memory");
    }
    memcpy(k, key, (size_t)key_len);
    k[key_len] = 0;
    struct w_kv *slot = find_kv(w, k);
    if (!slot) {
        if (w->n_kv >= GGUF_MAX_KV) {
            free(k);
            free(b->data);
            return err_set(err, LLMOPT_ERR_LIMIT, "gguf writer: more than %u kvs", GGUF_MAX_KV);
        }
        if (w->n_kv == w->cap_kv) {
            uint64_t cap = w->cap_kv ? 2 * w->cap_kv : 32;
            struct w_kv *kv = realloc(w->kv, (size_t)cap * sizeof *kv);
            if (!kv) {
                free(k);
                free(b->data);
                return err_set(err, LLMOPT_ERR_NOMEM, "gguf writer: out of memory");
            }
            w->kv = kv;
            w->cap_kv = cap;
        }
        slot = &w->kv[w->n_kv++];
        slot->key = k;
    } else {
        free(k);
        free(slot->blob);
    }
    slot->blob = b->data;
    slot->size = b->len;
    return LLMOPT_OK;
}

static bool is_scalar_type(enum gguf_type type) {
    return (unsigned)type < GGUF_TYPE_COUNT && gguf_type_size(type) > 0;
}

enum llmopt_status gguf_w_set_scalar(struct gguf_w *w, const char *key, enum gguf_type type,
                                     const void *value, struct llmopt_err *err) {
    if (!is_scalar_type(type))
        return err_set(err, LLMOPT_ERR_INVALID_ARG,
                       "gguf writer: kv '%s': type %d is not a scalar type", key, (int)type);
    struct wbuf b = {0};
    enum llmopt_status st = kv_start(w, key, strlen(key), type, &b, err);
    if (st) {
        free(b.data);
        return st;
    }
    if (type == GGUF_TYPE_BOOL) {
        uint8_t v = *(const uint8_t *)value ? 1 : 0;
        wbuf_put(&b, &v, 1);
    } else {
        wbuf_put(&b, value, gguf_type_size(type));
    }
    return kv_commit(w, key, strlen(key), &b, err);
}

enum llmopt_status gguf_w_set_u32(struct gguf_w *w, const char *key, uint32_t v,
                                  struct llmopt_err *err) {
    return gguf_w_set_scalar(w, key, GGUF_TYPE_UINT32, &v, err);
}

enum llmopt_status gguf_w_set_i32(struct gguf_w *w, const char *key, int32_t v,
                                  struct llmopt_err *err) {
    return gguf_w_set_scalar(w, key, GGUF_TYPE_INT32, &v, err);
}

enum llmopt_status gguf_w_set_u64(struct gguf_w *w, const char *key, uint64_t v,
                                  struct llmopt_err *err) {
    return gguf_w_set_scalar(w, key, GGUF_TYPE_UINT64, &v, err);
}

enum llmopt_status gguf_w_set_f32(struct gguf_w *w, const char *key, float v,
                                  struct llmopt_err *err) {
    return gguf_w_set_scalar(w, key, GGUF_TYPE_FLOAT32, &v, err);
}

enum llmopt_status gguf_w_set_bool(struct gguf_w *w, const char *key, bool v,
                                   struct llmopt_err *err) {
    uint8_t b = v;
    return gguf_w_set_scalar(w, key, GGUF_TYPE_BOOL, &b, err);
}

enum llmopt_status gguf_w_set_strn(struct gguf_w *w, const char *key, const char *s, uint64_t len,
                                   struct llmopt_err *err) {
    if (len > GGUF_MAX_STRING)
        return err_set(err, LLMOPT_ERR_LIMIT, "gguf writer: kv '%s': string of %llu bytes (cap %u)",
                       key, (unsigned long long)len, GGUF_MAX_STRING);
    struct wbuf b = {0};
    enum llmopt_status st = kv_start(w, key, strlen(key), GGUF_TYPE_STRING, &b, err);
    if (st) {
        free(b.data);
        return st;
    }
    wbuf_str(&b, s, len);
    return kv_commit(w, key, strlen(key), &b, err);
}

enum llmopt_status gguf_w_set_str(struct gguf_w *w, const char *key, const char *s,
                                  struct llmopt_err *err) {
    return gguf_w_set_strn(w, key, s, strlen(s), err);
}

enum llmopt_status gguf_w_set_array(struct gguf_w *w, const char *key, enum gguf_type elem_type,
                                    const void *elems, uint64_t n, struct llmopt_err *err) {
    if (!is_scalar_type(elem_type))
        return err_set(err, LLMOPT_ERR_INVALID_ARG,
                       "gguf writer: kv '%s': array element type %d is not a scalar type (strings: "
                       "gguf_w_set_str_array)",
                       key, (int)elem_type);
    if (n > GGUF_MAX_ARRAY)
        return err_set(err, LLMOPT_ERR_LIMIT, "gguf writer: kv '%s': %llu elements (cap %u)", key,
                       (unsigned long long)n, GGUF_MAX_ARRAY);
    struct wbuf b = {0};
    enum llmopt_status st = kv_start(w, key, strlen(key), GGUF_TYPE_ARRAY, &b, err);
    if (st) {
        free(b.data);
        return st;
    }
    wbuf_u32(&b, (uint32_t)elem_type);
    wbuf_u64(&b, n);
    if (elem_type == GGUF_TYPE_BOOL) {
        for (uint64_t i = 0; i < n; i++) {
            uint8_t v = ((const uint8_t *)elems)[i] ? 1 : 0;
            wbuf_put(&b, &v, 1);
        }
    } else {
        wbuf_put(&b, elems, (size_t)n * gguf_type_size(elem_type));
    }
    return kv_commit(w, key, strlen(key), &b, err);
}

enum llmopt_status gguf_w_set_str_array(struct gguf_w *w, const char *key, const char *const *strs,
                                        const uint64_t *lens, uint64_t n, struct llmopt_err *err) {
    if (n > GGUF_MAX_ARRAY)
        return err_set(err, LLMOPT_ERR_LIMIT, "gguf writer: kv '%s': %llu elements (cap %u)", key,
                       (unsigned long long)n, GGUF_MAX_ARRAY);
    struct wbuf b = {0};
    enum llmopt_status st = kv_start(w, key, strlen(key), GGUF_TYPE_ARRAY, &b, err);
    if (st) {
        free(b.data);
        return st;
    }
    wbuf_u32(&b, GGUF_TYPE_STRING);
    wbuf_u64(&b, n);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len = lens ? lens[i] : strlen(strs[i]);
        if (len > GGUF_MAX_STRING) {
            free(b.data);
            return err_set(err, LLMOPT_ERR_LIMIT,
                           "gguf writer: kv '%s' element %llu: %llu bytes (cap %u)", key,
                           (unsigned long long)i, (unsigned long long)len, GGUF_MAX_STRING);
        }
        wbuf_str(&b, strs[i], len);
    }
    return kv_commit(w, key, strlen(key), &b, err);
}

/* Bytes of a kv's value as stored in its file (from kv->data, which for arrays is the
 * first element: the array's type and count come before it). The reader checked every
 * length against the file, so walking strings stays inside the mapping. */
static uint64_t kv_value_bytes(const struct gguf_kv *kv) {
    if (kv->type == GGUF_TYPE_STRING) {
        uint64_t len;
        memcpy(&len, kv->data, sizeof len);
        return 8 + len;
    }
    if (kv->type != GGUF_TYPE_ARRAY) return gguf_type_size(kv->type);
    if (kv->array_type != GGUF_TYPE_STRING) return kv->array_len * gguf_type_size(kv->array_type);
    const uint8_t *p = kv->data;
    for (uint64_t i = 0; i < kv->array_len; i++) {
        uint64_t len;
        memcpy(&len, p, sizeof len);
        p += 8 + len;
    }
    return (uint64_t)(p - kv->data);
}

enum llmopt_status gguf_w_copy_kv(struct gguf_w *w, const struct gguf_kv *kv,
                                  struct llmopt_err *err) {
    if ((unsigned)kv->type >= GGUF_TYPE_COUNT ||
        (kv->type == GGUF_TYPE_ARRAY && !is_scalar_type(kv->array_type) &&
         kv->array_type != GGUF_TYPE_STRING))
        return err_set(err, LLMOPT_ERR_UNSUPPORTED,
                       "gguf writer: kv '%.*s' has a type it cannot copy", (int)kv->key.len,
                       kv->key.ptr);
    struct wbuf b = {0};
    enum llmopt_status st = kv_start(w, kv->key.ptr, kv->key.len, kv->type, &b, err);
    if (st) {
        free(b.data);
        return st;
    }
    if (kv->type == GGUF_TYPE_ARRAY) {
        wbuf_u32(&b, (uint32_t)kv->array_type);
        wbuf_u64(&b, kv->array_len);
    }
    wbuf_put(&b, kv->data, (size_t)kv_value_bytes(kv));
    return kv_commit(w, kv->key.ptr, kv->key.len, &b, err);
}

bool gguf_w_has_kv(const struct gguf_w *w, const char *key) {
    return find_kv(w, key) != NULL;
}

bool gguf_w_remove_kv(struct gguf_w *w, const char *key) {
    struct w_kv *slot = find_kv(w, key);
    if (!slot || w->begun) return false;
    free(slot->key);
    free(slot->blob);
    size_t i = (size_t)(slot - w->kv);
    memmove(&w->kv[i], &w->kv[i + 1], (size_t)(w->n_kv - i - 1) * sizeof *w->kv);
    w->n_kv--;
    return true;
}

enum llmopt_status gguf_w_set_alignment(struct gguf_w *w, uint32_t alignment,
                                        struct llmopt_err *err) {
    if (alignment == 0 || (alignment & (alignment - 1)))
        return err_set(err, LLMOPT_ERR_INVALID_ARG,
                       "gguf writer: alignment %u is not a power of two", alignment);
    if (w->n_tensors)
        return err_set(err, LLMOPT_ERR_INVALID_ARG,
                       "gguf writer: alignment set after tensors were added");
    enum llmopt_status st = gguf_w_set_u32(w, "general.alignment", alignment, err);
    if (!st) w->alignment = alignment;
    return st;
}

uint64_t gguf_w_n_kv(const struct gguf_w *w) {
    return w->n_kv;
}

/* ---- tensors ---- */

static uint64_t pad_to(uint64_t n, uint32_t alignment) {
    return (n + alignment - 1) / alignment * alignment;
}

enum llmopt_status gguf_w_add_tensor(struct gguf_w *w, const char *name, enum ggml_type type,
                                     uint32_t n_dims, const uint64_t *ne, uint32_t *index,
                                     struct llmopt_err *err) {
    enum llmopt_status st = check_open_for_layout(w, "adding a tensor", err);
    if (st) return st;
    size_t name_len = strlen(name);
    if (name_len == 0 || name_len > GGUF_W_NAME_MAX)
        return err_set(err, LLMOPT_ERR_INVALID_ARG,
                       "gguf writer: tensor name '%.80s' has %zu bytes (expected 1..%d)", name,
                       name_len, GGUF_W_NAME_MAX);
    for (uint32_t i = 0; i < w->n_tensors; i++)
        if (!strcmp(w->tensors[i].name, name))
            return err_set(err, LLMOPT_ERR_INVALID_ARG, "gguf writer: tensor '%s' added twice",
                           name);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return err_set(err, LLMOPT_ERR_INVALID_ARG,
                       "gguf writer: tensor '%s': %u dims (expected 1..%d)", name, n_dims,
                       GGUF_MAX_DIMS);
    uint32_t block_elems, block_bytes;
    if (!gguf_w_type_block(type, &block_elems, &block_bytes))
        return err_set(err, LLMOPT_ERR_UNSUPPORTED,
                       "gguf writer: tensor '%s': type %d is not one it writes", name, (int)type);
    uint64_t n_elems = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] == 0 || ne[d] > (uint64_t)INT64_MAX / n_elems)
            return err_set(err, LLMOPT_ERR_INVALID_ARG,
                           "gguf writer: tensor '%s': ne[%u] = %llu out of range", name, d,
                           (unsigned long long)ne[d]);
        n_elems *= ne[d];
    }
    if (ne[0] % block_elems)
        return err_set(
            err, LLMOPT_ERR_INVALID_ARG,
            "gguf writer: tensor '%s': row length %llu is not a multiple of the %s block (%u)",
            name, (unsigned long long)ne[0], gguf_w_type_name(type), block_elems);
    if (w->n_tensors >= GGUF_MAX_TENSORS)
        return err_set(err, LLMOPT_ERR_LIMIT, "gguf writer: more than %u tensors",
                       GGUF_MAX_TENSORS);
    if (w->n_tensors == w->cap_tensors) {
        uint32_t cap = w->cap_tensors ? 2 * w->cap_tensors : 64;
        struct w_tensor *t = realloc(w->tensors, (size_t)cap * sizeof *t);
        if (!t) return err_set(err, LLMOPT_ERR_NOMEM, "gguf writer: out of memory");
        w->tensors = t;
        w->cap_tensors = cap;
    }
    struct w_tensor *t = &w->tensors[w->n_tensors];
    memset(t, 0, sizeof *t);
    memcpy(t->name, name, name_len + 1);
    t->type = type;
    t->n_dims = n_dims;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    t->n_bytes = n_elems / block_elems * block_bytes;
    t->offset = w->data_bytes;
    w->data_bytes += pad_to(t->n_bytes, w->alignment);
    if (index) *index = w->n_tensors;
    w->n_tensors++;
    return LLMOPT_OK;
}

uint32_t gguf_w_n_tensors(const struct gguf_w *w) {
    return w->n_tensors;
}

uint64_t gguf_w_tensor_bytes(const struct gguf_w *w, uint32_t index) {
    return index < w->n_tensors ? w->tensors[index].n_bytes : 0;
}

static uint64_t header_bytes(const struct gguf_w *w) {
    uint64_t n = 4 + 4 + 8 + 8;
    for (uint64_t i = 0; i < w->n_kv; i++) n += w->kv[i].size;
    for (uint32_t i = 0; i < w->n_tensors; i++)
        n += 8 + strlen(w->tensors[i].name) + 4 + 8ull * w->tensors[i].n_dims + 4 + 8;
    return pad_to(n, w->alignment);
}

uint64_t gguf_w_file_bytes(const struct gguf_w *w) {
    return header_bytes(w) + w->data_bytes;
}

/* ---- writing ---- */

static enum llmopt_status put(struct gguf_w *w, const void *p, size_t n, struct llmopt_err *err) {
    if (n && fwrite(p, 1, n, w->file) != n)
        return err_set(err, LLMOPT_ERR_IO, "gguf writer: writing '%s' failed: %s", w->partial_path,
                       strerror(errno));
    return LLMOPT_OK;
}

static enum llmopt_status put_zeros(struct gguf_w *w, uint64_t n, struct llmopt_err *err) {
    static const uint8_t zeros[256];
    while (n) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        enum llmopt_status st = put(w, zeros, k, err);
        if (st) return st;
        n -= k;
    }
    return LLMOPT_OK;
}

static char *str_concat(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    char *s = malloc(na + nb + 1);
    if (!s) return NULL;
    memcpy(s, a, na);
    memcpy(s + na, b, nb + 1);
    return s;
}

enum llmopt_status gguf_w_begin(struct gguf_w *w, const char *path, struct llmopt_err *err) {
    enum llmopt_status st = check_open_for_layout(w, "gguf_w_begin", err);
    if (st) return st;
    w->path = str_concat(path, "");
    w->partial_path = str_concat(path, ".partial");
    w->io_buffer = malloc(GGUF_W_IO_BUFFER);
    if (!w->path || !w->partial_path || !w->io_buffer)
        return err_set(err, LLMOPT_ERR_NOMEM, "gguf writer: out of memory");
    w->file = fopen(w->partial_path, "wb");
    if (!w->file)
        return err_set(err, LLMOPT_ERR_IO, "gguf writer: cannot create '%s': %s", w->partial_path,
                       strerror(errno));
    setvbuf(w->file, w->io_buffer, _IOFBF, GGUF_W_IO_BUFFER);
    w->begun = true;

    struct wbuf b = {0};
    wbuf_put(&b, "GGUF", 4);
    wbuf_u32(&b, GGUF_W_VERSION);
    wbuf_u64(&b, w->n_tensors);
    wbuf_u64(&b, w->n_kv);
    for (uint64_t i = 0; i < w->n_kv; i++) wbuf_put(&b, w->kv[i].blob, w->kv[i].size);
    for (uint32_t i = 0; i < w->n_tensors; i++) {
        const struct w_tensor *t = &w->tensors[i];
        wbuf_str(&b, t->name, strlen(t->name));
        wbuf_u32(&b, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) wbuf_u64(&b, t->ne[d]);
        wbuf_u32(&b, (uint32_t)t->type);
        wbuf_u64(&b, t->offset);
    }
    if (b.failed) {
        free(b.data);
        return err_set(err, LLMOPT_ERR_NOMEM, "gguf writer: out of memory");
    }
    size_t len = b.len;
    st = put(w, b.data, len, err);
    free(b.data);
    if (!st) st = put_zeros(w, pad_to(len, w->alignment) - len, err);
    w->cur = 0;
    w->cur_written = 0;
    return st;
}

enum llmopt_status gguf_w_write(struct gguf_w *w, const void *data, size_t n,
                                struct llmopt_err *err) {
    if (!w->begun || w->finished)
        return err_set(err, LLMOPT_ERR_INVALID_ARG,
                       "gguf writer: gguf_w_write outside begin/finish");
    const uint8_t *p = data;
    while (n) {
        if (w->cur >= w->n_tensors)
            return err_set(err, LLMOPT_ERR_INVALID_ARG,
                           "gguf writer: %zu bytes more than the tensors hold", n);
        const struct w_tensor *t = &w->tensors[w->cur];
        uint64_t left = t->n_bytes - w->cur_written;
        size_t k = n < left ? n : (size_t)left;
        enum llmopt_status st = put(w, p, k, err);
        if (st) return st;
        p += k;
        n -= k;
        w->cur_written += k;
        if (w->cur_written == t->n_bytes) {
            st = put_zeros(w, pad_to(t->n_bytes, w->alignment) - t->n_bytes, err);
            if (st) return st;
            w->cur++;
            w->cur_written = 0;
        }
    }
    return LLMOPT_OK;
}

uint32_t gguf_w_current_tensor(const struct gguf_w *w) {
    return w->cur;
}

enum llmopt_status gguf_w_finish(struct gguf_w *w, struct llmopt_err *err) {
    if (!w->begun || w->finished)
        return err_set(err, LLMOPT_ERR_INVALID_ARG,
                       "gguf writer: gguf_w_finish without gguf_w_begin");
    if (w->cur < w->n_tensors)
        return err_set(err, LLMOPT_ERR_INVALID_ARG,
                       "gguf writer: tensor '%s' (%u of %u) got %llu of its %llu bytes",
                       w->tensors[w->cur].name, w->cur, w->n_tensors,
                       (unsigned long long)w->cur_written,
                       (unsigned long long)w->tensors[w->cur].n_bytes);
    FILE *f = w->file;
    w->file = NULL;
    if (fflush(f) != 0 || ferror(f)) {
        int e = errno;
        fclose(f);
        return err_set(err, LLMOPT_ERR_IO, "gguf writer: writing '%s' failed: %s", w->partial_path,
                       strerror(e));
    }
    if (fclose(f) != 0)
        return err_set(err, LLMOPT_ERR_IO, "gguf writer: closing '%s' failed: %s", w->partial_path,
                       strerror(errno));
    if (rename(w->partial_path, w->path) != 0)
        return err_set(err, LLMOPT_ERR_IO, "gguf writer: renaming '%s' to '%s' failed: %s",
                       w->partial_path, w->path, strerror(errno));
    w->finished = true;
    return LLMOPT_OK;
}

/* ---- element types ---- */

const char *gguf_w_type_name(enum ggml_type type) {
    return ggml_type_name(type);
}

bool gguf_w_type_block(enum ggml_type type, uint32_t *block_elems, uint32_t *block_bytes) {
    return ggml_type_block(type, block_elems, block_bytes);
}

size_t gguf_w_row_bytes(enum ggml_type type, int64_t n) {
    uint32_t block_elems, block_bytes;
    if (n < 0 || !gguf_w_type_block(type, &block_elems, &block_bytes) || (uint64_t)n % block_elems)
        return 0;
    return (size_t)((uint64_t)n / block_elems * block_bytes);
}

bool gguf_w_type_from_name(const char *name, enum ggml_type *out) {
    static const enum ggml_type known[] = {GGML_TYPE_F32,   GGML_TYPE_F16,  GGML_TYPE_BF16,
                                           GGML_TYPE_Q8_0,  GGML_TYPE_Q4_0, GGML_TYPE_Q4_K,
                                           GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_Q5_0,
                                           GGML_TYPE_IQ4_XS};
    for (size_t i = 0; i < LLMOPT_ARRAY_LEN(known); i++) {
        if (!strcasecmp(name, gguf_w_type_name(known[i]))) {
            *out = known[i];
            return true;
        }
    }
    return false;
}

bool gguf_w_encode_row(enum ggml_type type, const float *src, void *dst, int64_t n) {
    if (n < 0 || (n && !gguf_w_row_bytes(type, n))) return false;
    uint16_t *h = dst;
    switch (type) {
    case GGML_TYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        return true;
    case GGML_TYPE_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t v = fp16_from_f32(src[i]);
            memcpy(h + i, &v, sizeof v);
        }
        return true;
    case GGML_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t v = bf16_from_f32(src[i]);
            memcpy(h + i, &v, sizeof v);
        }
        return true;
    case GGML_TYPE_Q8_0:
        quant_quantize_row_q8_0(src, dst, n);
        return true;
    case GGML_TYPE_Q4_0:
        quant_quantize_row_q4_0(src, dst, n);
        return true;
    case GGML_TYPE_Q5_0:
        quant_quantize_row_q5_0(src, dst, n);
        return true;
    default:
        break;
    }
    if (type == GGML_TYPE_Q4_K)
        quant_k_quantize_row_q4_K(src, dst, n);
    else if (type == GGML_TYPE_Q5_K)
        quant_k_quantize_row_q5_K(src, dst, n);
    else if (type == GGML_TYPE_Q6_K)
        quant_k_quantize_row_q6_K(src, dst, n);
    else if (type == GGML_TYPE_IQ4_XS)
        quant_k_quantize_row_iq4_xs(src, dst, n);
    else
        return false;
    return true;
}

bool gguf_w_decode_row(enum ggml_type type, const void *src, float *dst, int64_t n) {
    if (n < 0 || (n && !gguf_w_row_bytes(type, n))) return false;
    quant_dequantize_row(type, src, dst, n);
    return true;
}
