/* GGUF v2/v3 reader. Every count, length and offset read from the file is checked
 * against what is left of the file before it is used: allocations are proportional
 * to the bytes the file actually holds and bounded by the GGUF_MAX_* caps.
 *
 * Errors: LLMOPT_ERR_FORMAT for malformed input (truncated, out of range, bad
 * values), LLMOPT_ERR_UNSUPPORTED for well-formed things llmopt does not read
 * (GGUF v1, tensor types other than F32/F16/BF16/Q8_0/Q4_0/Q5_0/Q4_K/Q5_K/Q6_K/IQ4_XS,
 * arrays of arrays),
 * LLMOPT_ERR_LIMIT when a count or length passes a GGUF_MAX_* cap although the
 * file could hold it. Messages name the field and its file offset. */
#include "format/gguf.h"

#include "base/file_map.h"
#include "base/fp16.h"
#include "format/quant.h"
#include "format/quant_k.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c reads little-endian fields with memcpy: port it for big-endian hosts"
#endif

#define GGUF_MAGIC "GGUF"
#define GGUF_DEFAULT_ALIGNMENT 32u

/* Smallest possible encodings, used to reject counts the file cannot hold before
 * allocating for them. A kv: u64 key length + 1 key byte + u32 type + 1 value
 * byte. A tensor info: u64 name length + 1 name byte + u32 n_dims + 1 x u64 ne +
 * u32 type + u64 offset. (Empty keys and names are rejected.) */
#define GGUF_MIN_KV_BYTES (8u + 1u + 4u + 1u)
#define GGUF_MIN_TENSOR_INFO_BYTES (8u + 1u + 4u + 8u + 4u + 8u)

/* Names quoted in messages are cut to this many bytes (escaped). */
#define GGUF_MSG_NAME_MAX 80

static const char *const gguf_type_names[GGUF_TYPE_COUNT] = {
    [GGUF_TYPE_UINT8] = "u8",     [GGUF_TYPE_INT8] = "i8",     [GGUF_TYPE_UINT16] = "u16",
    [GGUF_TYPE_INT16] = "i16",    [GGUF_TYPE_UINT32] = "u32",  [GGUF_TYPE_INT32] = "i32",
    [GGUF_TYPE_FLOAT32] = "f32",  [GGUF_TYPE_BOOL] = "bool",   [GGUF_TYPE_STRING] = "string",
    [GGUF_TYPE_ARRAY] = "array",  [GGUF_TYPE_UINT64] = "u64",  [GGUF_TYPE_INT64] = "i64",
    [GGUF_TYPE_FLOAT64] = "f64",
};
_Static_assert(LLMOPT_ARRAY_LEN(gguf_type_names) == GGUF_TYPE_COUNT,
               "gguf type name table out of sync");

/* Bytes of one scalar value; 0 for string and array (variable length). */
static const uint8_t gguf_type_sizes[GGUF_TYPE_COUNT] = {
    [GGUF_TYPE_UINT8] = 1,   [GGUF_TYPE_INT8] = 1,    [GGUF_TYPE_UINT16] = 2,
    [GGUF_TYPE_INT16] = 2,   [GGUF_TYPE_UINT32] = 4,  [GGUF_TYPE_INT32] = 4,
    [GGUF_TYPE_FLOAT32] = 4, [GGUF_TYPE_BOOL] = 1,    [GGUF_TYPE_STRING] = 0,
    [GGUF_TYPE_ARRAY] = 0,   [GGUF_TYPE_UINT64] = 8,  [GGUF_TYPE_INT64] = 8,
    [GGUF_TYPE_FLOAT64] = 8,
};
_Static_assert(LLMOPT_ARRAY_LEN(gguf_type_sizes) == GGUF_TYPE_COUNT,
               "gguf type size table out of sync");

const char *gguf_type_name(enum gguf_type type) {
    if ((unsigned)type >= GGUF_TYPE_COUNT)
        return "?";
    return gguf_type_names[type];
}

size_t gguf_type_size(enum gguf_type type) {
    if ((unsigned)type >= GGUF_TYPE_COUNT)
        return 0;
    return gguf_type_sizes[type];
}

/* Tensor types llmopt reads: name, elements per block, bytes per block. */
struct ggml_type_info {
    const char *name;
    uint32_t block_elems;
    uint32_t block_bytes;
};

static const struct ggml_type_info ggml_types[GGML_TYPE_COUNT] = {
    [GGML_TYPE_F32] = {"f32", 1, 4},
    [GGML_TYPE_F16] = {"f16", 1, 2},
    [GGML_TYPE_Q4_0] = {"q4_0", QK4_0, sizeof(block_q4_0)},
    [GGML_TYPE_Q5_0] = {"q5_0", QK5_0, sizeof(block_q5_0)},
    [GGML_TYPE_Q8_0] = {"q8_0", QK8_0, sizeof(block_q8_0)},
    [GGML_TYPE_Q4_K] = {"q4_K", QK_K, sizeof(block_q4_K)},
    [GGML_TYPE_Q5_K] = {"q5_K", QK_K, sizeof(block_q5_K)},
    [GGML_TYPE_Q6_K] = {"q6_K", QK_K, sizeof(block_q6_K)},
    [GGML_TYPE_IQ4_XS] = {"iq4_xs", QK_K, sizeof(block_iq4_xs)},
    [GGML_TYPE_BF16] = {"bf16", 1, 2},
};
_Static_assert(LLMOPT_ARRAY_LEN(ggml_types) == GGML_TYPE_COUNT,
               "ggml type table out of sync");

const char *ggml_type_name(enum ggml_type type) {
    if ((unsigned)type >= GGML_TYPE_COUNT)
        return NULL;
    return ggml_types[type].name;
}

bool ggml_type_block(enum ggml_type type, uint32_t *block_elems, uint32_t *block_bytes) {
    if ((unsigned)type >= GGML_TYPE_COUNT || !ggml_types[type].name)
        return false;
    *block_elems = ggml_types[type].block_elems;
    *block_bytes = ggml_types[type].block_bytes;
    return true;
}

bool gguf_str_eq(struct gguf_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.ptr, c, n) == 0);
}

/* ---- little-endian field access (values in the mapping are unaligned) ---- */

static uint16_t load_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static uint32_t load_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static uint64_t load_u64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Writes s into buf (cap bytes) for a message: quotes not included; control bytes,
 * quotes and backslashes escaped; longer names cut with "...". */
static const char *escape_str(char *buf, size_t cap, const char *s, uint64_t len) {
    size_t o = 0;
    for (uint64_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        char tmp[8];
        int n;
        if (c == '\n')
            n = snprintf(tmp, sizeof tmp, "\\n");
        else if (c == '\t')
            n = snprintf(tmp, sizeof tmp, "\\t");
        else if (c == '"' || c == '\'' || c == '\\')
            n = snprintf(tmp, sizeof tmp, "\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            n = snprintf(tmp, sizeof tmp, "\\x%02x", c);
        else
            n = snprintf(tmp, sizeof tmp, "%c", c);
        if (o + (size_t)n + 4 > cap) { /* room for "..." and NUL */
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        memcpy(buf + o, tmp, (size_t)n);
        o += (size_t)n;
    }
    buf[o] = '\0';
    return buf;
}

/* ---- name sets: open addressing over pointers to gguf_str (FNV-1a) ---- */

struct name_set {
    const struct gguf_str **slots; /* (mask + 1); NULL = empty */
    uint64_t mask;
};

static uint64_t hash_bytes(const char *s, uint64_t len) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* Room for n names at load factor <= 1/2. n is bounded by the caps. */
static bool name_set_init(struct name_set *set, uint64_t n) {
    uint64_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    set->slots = calloc(cap, sizeof *set->slots);
    set->mask = cap - 1;
    return set->slots != NULL;
}

static void name_set_free(struct name_set *set) {
    free(set->slots);
    set->slots = NULL;
}

static bool str_equal(const struct gguf_str *a, const char *b, uint64_t b_len) {
    return a->len == b_len && (b_len == 0 || memcmp(a->ptr, b, b_len) == 0);
}

static const struct gguf_str *name_set_find(const struct name_set *set, const char *s,
                                            uint64_t len) {
    if (!set->slots)
        return NULL;
    for (uint64_t i = hash_bytes(s, len) & set->mask;; i = (i + 1) & set->mask) {
        const struct gguf_str *e = set->slots[i];
        if (!e)
            return NULL;
        if (str_equal(e, s, len))
            return e;
    }
}

/* Inserts name (owned by the caller's array); returns the existing entry when the
 * name is already present, else NULL. The set never fills: sized for all names. */
static const struct gguf_str *name_set_insert(struct name_set *set,
                                              const struct gguf_str *name) {
    for (uint64_t i = hash_bytes(name->ptr, name->len) & set->mask;;
         i = (i + 1) & set->mask) {
        const struct gguf_str *e = set->slots[i];
        if (!e) {
            set->slots[i] = name;
            return NULL;
        }
        if (str_equal(e, name->ptr, name->len))
            return e;
    }
}

/* Lookups turn a found name back into its entry: name and key come first. */
_Static_assert(offsetof(struct gguf_kv, key) == 0, "gguf_kv.key must be the first member");
_Static_assert(offsetof(struct gguf_tensor, name) == 0,
               "gguf_tensor.name must be the first member");

/* The gguf_file handed out is the first member of this, so lookups can use the
 * name sets built while checking for duplicates. */
struct gguf_file_impl {
    struct gguf_file pub;
    struct name_set kv_names;
    struct name_set tensor_names;
};

/* ---- the reader ---- */

struct parser {
    const uint8_t *base;
    uint64_t size;
    uint64_t pos;            /* next byte to read */
    struct llmopt_err *err;
    char where[256];         /* the item being read, e.g. "kv #3 'general.name'" */
};

static void set_where(struct parser *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void set_where(struct parser *p, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->where, sizeof p->where, fmt, ap);
    va_end(ap);
}

static uint64_t remaining(const struct parser *p) { return p->size - p->pos; }

/* Fails with "gguf: <where> <field> [offset N] ...": the standard prefix. */
static enum llmopt_status fail_at(struct parser *p, enum llmopt_status st, uint64_t offset,
                                  const char *field, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static enum llmopt_status fail_at(struct parser *p, enum llmopt_status st, uint64_t offset,
                                  const char *field, const char *fmt, ...) {
    char detail[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    return err_set(p->err, st, "gguf: %s%s%s [offset %" PRIu64 "]: %s", p->where,
                   p->where[0] ? " " : "", field, offset, detail);
}

/* Takes n bytes at the cursor or fails naming field as truncated. */
static enum llmopt_status take(struct parser *p, const char *field, uint64_t n,
                               const uint8_t **out) {
    *out = NULL; /* err_set's result is opaque to the compiler: always assign */
    if (n > remaining(p))
        return fail_at(p, LLMOPT_ERR_FORMAT, p->pos, field,
                       "truncated: needs %" PRIu64 " bytes, only %" PRIu64
                       " left (file size %" PRIu64 ")",
                       n, remaining(p), p->size);
    *out = p->base + p->pos;
    p->pos += n;
    return LLMOPT_OK;
}

static enum llmopt_status read_u32(struct parser *p, const char *field, uint32_t *v) {
    const uint8_t *b;
    enum llmopt_status st = take(p, field, 4, &b);
    if (st == LLMOPT_OK)
        *v = load_u32(b);
    return st;
}

static enum llmopt_status read_u64(struct parser *p, const char *field, uint64_t *v) {
    const uint8_t *b;
    enum llmopt_status st = take(p, field, 8, &b);
    if (st == LLMOPT_OK)
        *v = load_u64(b);
    return st;
}

/* A string: u64 length then that many bytes; the length is checked against the
 * cap and against the bytes left before anything is taken. */
static enum llmopt_status read_str(struct parser *p, const char *field, struct gguf_str *out) {
    uint64_t len_offset = p->pos;
    uint64_t len;
    enum llmopt_status st = read_u64(p, field, &len);
    if (st != LLMOPT_OK)
        return st;
    if (len > remaining(p))
        return fail_at(p, LLMOPT_ERR_FORMAT, len_offset, field,
                       "string length %" PRIu64 " runs past end of file (%" PRIu64
                       " bytes left, file size %" PRIu64 ")",
                       len, remaining(p), p->size);
    if (len > GGUF_MAX_STRING)
        return fail_at(p, LLMOPT_ERR_LIMIT, len_offset, field,
                       "string length %" PRIu64 " exceeds the cap of %u bytes", len,
                       GGUF_MAX_STRING);
    out->ptr = (const char *)p->base + p->pos;
    out->len = len;
    p->pos += len;
    return LLMOPT_OK;
}

/* A type field of a metadata value (or of an array's elements). */
static enum llmopt_status read_value_type(struct parser *p, const char *field,
                                          enum gguf_type *out) {
    uint64_t offset = p->pos;
    uint32_t t;
    enum llmopt_status st = read_u32(p, field, &t);
    if (st != LLMOPT_OK)
        return st;
    if (t >= GGUF_TYPE_COUNT)
        return fail_at(p, LLMOPT_ERR_FORMAT, offset, field,
                       "value type %" PRIu32 " is not a GGUF type (expected 0..%d)", t,
                       GGUF_TYPE_COUNT - 1);
    *out = (enum gguf_type)t;
    return LLMOPT_OK;
}

/* n scalar values of type at the cursor; bools must be 0 or 1 (the spec calls
 * other values invalid, and a reader would otherwise see a bool that is neither). */
static enum llmopt_status read_scalars(struct parser *p, const char *field,
                                       enum gguf_type type, uint64_t n) {
    uint64_t offset = p->pos;
    const uint8_t *b;
    uint64_t elem = gguf_type_sizes[type];
    /* n <= GGUF_MAX_ARRAY (2^26) and elem <= 8: the product cannot overflow */
    enum llmopt_status st = take(p, field, n * elem, &b);
    if (st != LLMOPT_OK)
        return st;
    if (type == GGUF_TYPE_BOOL) {
        for (uint64_t i = 0; i < n; i++)
            if (b[i] > 1)
                return fail_at(p, LLMOPT_ERR_FORMAT, offset + i, field,
                               "bool value %u is neither 0 nor 1", b[i]);
    }
    return LLMOPT_OK;
}

static enum llmopt_status read_kv_value(struct parser *p, struct gguf_kv *kv) {
    enum llmopt_status st = read_value_type(p, "value type", &kv->type);
    if (st != LLMOPT_OK)
        return st;
    kv->offset = p->pos;
    kv->data = p->base + p->pos;
    if (kv->type == GGUF_TYPE_STRING) {
        struct gguf_str s;
        return read_str(p, "string value", &s);
    }
    if (kv->type != GGUF_TYPE_ARRAY)
        return read_scalars(p, "value", kv->type, 1);

    uint64_t elem_type_offset = p->pos;
    st = read_value_type(p, "array element type", &kv->array_type);
    if (st != LLMOPT_OK)
        return st;
    if (kv->array_type == GGUF_TYPE_ARRAY)
        return fail_at(p, LLMOPT_ERR_UNSUPPORTED, elem_type_offset, "array element type",
                       "arrays of arrays are not supported");
    uint64_t len_offset = p->pos;
    st = read_u64(p, "array length", &kv->array_len);
    if (st != LLMOPT_OK)
        return st;
    /* every element takes at least one byte (a string at least its u64 length) */
    uint64_t min_elem = kv->array_type == GGUF_TYPE_STRING ? 8 : gguf_type_sizes[kv->array_type];
    if (kv->array_len > remaining(p) / min_elem)
        return fail_at(p, LLMOPT_ERR_FORMAT, len_offset, "array length",
                       "%" PRIu64 " elements of %s need at least %" PRIu64
                       " bytes each, only %" PRIu64 " bytes left (file size %" PRIu64 ")",
                       kv->array_len, gguf_type_name(kv->array_type), min_elem,
                       remaining(p), p->size);
    if (kv->array_len > GGUF_MAX_ARRAY)
        return fail_at(p, LLMOPT_ERR_LIMIT, len_offset, "array length",
                       "%" PRIu64 " elements exceeds the cap of %u", kv->array_len,
                       GGUF_MAX_ARRAY);
    kv->data = p->base + p->pos;
    if (kv->array_type != GGUF_TYPE_STRING)
        return read_scalars(p, "array data", kv->array_type, kv->array_len);
    for (uint64_t i = 0; i < kv->array_len; i++) {
        char field[64];
        snprintf(field, sizeof field, "array element #%" PRIu64, i);
        struct gguf_str s;
        st = read_str(p, field, &s);
        if (st != LLMOPT_OK)
            return st;
    }
    return LLMOPT_OK;
}

/* A kv key or a tensor name (`field`: "key" or "name"), refused when empty; *offset
 * gets where it starts and name an escaped copy for messages. */
static enum llmopt_status read_name(struct parser *p, const char *field, struct gguf_str *out,
                                   uint64_t *offset, char name[GGUF_MSG_NAME_MAX]) {
    *offset = p->pos;
    enum llmopt_status st = read_str(p, field, out);
    if (st != LLMOPT_OK)
        return st;
    if (out->len == 0)
        return fail_at(p, LLMOPT_ERR_FORMAT, *offset, field, "%s is empty", field);
    escape_str(name, GGUF_MSG_NAME_MAX, out->ptr, out->len);
    return LLMOPT_OK;
}

static enum llmopt_status read_kvs(struct parser *p, struct gguf_file_impl *f) {
    struct gguf_file *g = &f->pub;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        struct gguf_kv *kv = &g->kv[i];
        set_where(p, "kv #%" PRIu64, i);
        uint64_t key_offset;
        char name[GGUF_MSG_NAME_MAX];
        enum llmopt_status st = read_name(p, "key", &kv->key, &key_offset, name);
        if (st != LLMOPT_OK)
            return st;
        set_where(p, "kv #%" PRIu64 " '%s'", i, name);
        const struct gguf_str *prev = name_set_insert(&f->kv_names, &kv->key);
        if (prev)
            return fail_at(p, LLMOPT_ERR_FORMAT, key_offset, "key",
                           "duplicate key (first is kv #%td)",
                           (const struct gguf_kv *)(const void *)prev - g->kv);
        st = read_kv_value(p, kv);
        if (st != LLMOPT_OK)
            return st;
    }
    p->where[0] = '\0';
    return LLMOPT_OK;
}

/* general.alignment: optional; when present a u32 power of two. */
static enum llmopt_status read_alignment(struct parser *p, struct gguf_file *g) {
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const struct gguf_kv *kv = gguf_find_kv(g, "general.alignment");
    if (!kv)
        return LLMOPT_OK;
    set_where(p, "kv 'general.alignment'");
    if (kv->type != GGUF_TYPE_UINT32)
        return fail_at(p, LLMOPT_ERR_FORMAT, kv->offset, "value",
                       "has type %s, expected u32", gguf_type_name(kv->type));
    uint32_t a = load_u32(kv->data);
    if (a == 0 || (a & (a - 1)) != 0)
        return fail_at(p, LLMOPT_ERR_FORMAT, kv->offset, "value",
                       "alignment %" PRIu32 " is not a nonzero power of two", a);
    g->alignment = a;
    p->where[0] = '\0';
    return LLMOPT_OK;
}

/* One tensor info: name, n_dims, ne[n_dims], type, offset; n_bytes from the type. */
static enum llmopt_status read_tensor_info(struct parser *p, struct gguf_file_impl *f,
                                           uint64_t i) {
    struct gguf_file *g = &f->pub;
    struct gguf_tensor *t = &g->tensors[i];
    set_where(p, "tensor #%" PRIu64, i);
    uint64_t name_offset;
    char name[GGUF_MSG_NAME_MAX];
    enum llmopt_status st = read_name(p, "name", &t->name, &name_offset, name);
    if (st != LLMOPT_OK)
        return st;
    set_where(p, "tensor '%s' (#%" PRIu64 ")", name, i);
    const struct gguf_str *prev = name_set_insert(&f->tensor_names, &t->name);
    if (prev)
        return fail_at(p, LLMOPT_ERR_FORMAT, name_offset, "name",
                       "duplicate tensor name (first is tensor #%td)",
                       (const struct gguf_tensor *)(const void *)prev - g->tensors);

    uint64_t field_offset = p->pos;
    st = read_u32(p, "n_dims", &t->n_dims);
    if (st != LLMOPT_OK)
        return st;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return fail_at(p, LLMOPT_ERR_FORMAT, field_offset, "n_dims",
                       "n_dims %" PRIu32 " out of range (expected 1..%d)", t->n_dims,
                       GGUF_MAX_DIMS);
    uint64_t n_elems = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if (d >= t->n_dims)
            continue;
        char field[16];
        snprintf(field, sizeof field, "ne[%" PRIu32 "]", d);
        field_offset = p->pos;
        st = read_u64(p, field, &t->ne[d]);
        if (st != LLMOPT_OK)
            return st;
        if (t->ne[d] == 0 || t->ne[d] > (uint64_t)INT64_MAX)
            return fail_at(p, LLMOPT_ERR_FORMAT, field_offset, field,
                           "dimension %" PRIu64 " out of range (expected 1..2^63-1)",
                           t->ne[d]);
        if (n_elems > (uint64_t)INT64_MAX / t->ne[d])
            return fail_at(p, LLMOPT_ERR_FORMAT, field_offset, field,
                           "element count overflows: product of ne[0..%" PRIu32
                           "] exceeds 2^63-1",
                           d);
        n_elems *= t->ne[d];
    }

    field_offset = p->pos;
    uint32_t type;
    st = read_u32(p, "type", &type);
    if (st != LLMOPT_OK)
        return st;
    if (type >= GGML_TYPE_COUNT)
        return fail_at(p, LLMOPT_ERR_FORMAT, field_offset, "type",
                       "tensor type %" PRIu32 " is not a ggml type (expected < %d)", type,
                       GGML_TYPE_COUNT);
    t->type = (enum ggml_type)type;
    uint32_t block_elems, block_bytes;
    if (!ggml_type_block(t->type, &block_elems, &block_bytes))
        return fail_at(p, LLMOPT_ERR_UNSUPPORTED, field_offset, "type",
                       "tensor type %" PRIu32
                       " is not supported (llmopt reads f32, f16, bf16, q8_0, q4_0, q5_0, "
                       "q4_K, q5_K, q6_K, iq4_xs)",
                       type);
    if (t->ne[0] % block_elems)
        return fail_at(p, LLMOPT_ERR_FORMAT, field_offset, "type",
                       "ne[0] = %" PRIu64 " is not a multiple of the %s block size %" PRIu32,
                       t->ne[0], ggml_type_name(t->type), block_elems);
    /* n_elems < 2^63, but a byte count may still overflow (4 bytes per f32) */
    uint64_t n_blocks = n_elems / block_elems;
    if (n_blocks > (uint64_t)INT64_MAX / block_bytes)
        return fail_at(p, LLMOPT_ERR_FORMAT, field_offset, "type",
                       "byte size overflows: %" PRIu64 " blocks of %" PRIu32 " bytes",
                       n_blocks, block_bytes);
    t->n_bytes = n_blocks * block_bytes;

    field_offset = p->pos;
    st = read_u64(p, "offset", &t->offset);
    if (st != LLMOPT_OK)
        return st;
    if (t->offset % g->alignment)
        return fail_at(p, LLMOPT_ERR_FORMAT, field_offset, "offset",
                       "data offset %" PRIu64 " is not a multiple of the alignment %" PRIu32,
                       t->offset, g->alignment);
    return LLMOPT_OK;
}

static enum llmopt_status parse_into(struct parser *p, struct gguf_file_impl *f) {
    struct gguf_file *g = &f->pub;
    enum llmopt_status st;

    set_where(p, "header");
    const uint8_t *magic;
    if (p->size < 4)
        return fail_at(p, LLMOPT_ERR_FORMAT, 0, "magic",
                       "file is %" PRIu64 " bytes, too small for the 4-byte magic 'GGUF'",
                       p->size);
    st = take(p, "magic", 4, &magic);
    if (st != LLMOPT_OK)
        return st;
    if (memcmp(magic, GGUF_MAGIC, 4) != 0)
        return fail_at(p, LLMOPT_ERR_FORMAT, 0, "magic",
                       "expected 'GGUF' (47 47 55 46), found %02x %02x %02x %02x", magic[0],
                       magic[1], magic[2], magic[3]);

    uint64_t field_offset = p->pos;
    st = read_u32(p, "version", &g->version);
    if (st != LLMOPT_OK)
        return st;
    if (g->version == 1)
        return fail_at(p, LLMOPT_ERR_UNSUPPORTED, field_offset, "version",
                       "GGUF version 1 (32-bit counts) is not supported, expected 2 or 3");
    if (g->version != 2 && g->version != 3) {
        if (g->version == 0x03000000u || g->version == 0x02000000u)
            return fail_at(p, LLMOPT_ERR_UNSUPPORTED, field_offset, "version",
                           "version reads as %" PRIu32
                           ": a big-endian GGUF file, only little-endian is supported",
                           g->version);
        return fail_at(p, LLMOPT_ERR_FORMAT, field_offset, "version",
                       "version %" PRIu32 " is not a known GGUF version (expected 2 or 3)",
                       g->version);
    }

    uint64_t n_tensors_offset = p->pos;
    st = read_u64(p, "n_tensors", &g->n_tensors);
    if (st != LLMOPT_OK)
        return st;
    uint64_t n_kv_offset = p->pos;
    st = read_u64(p, "n_kv", &g->n_kv);
    if (st != LLMOPT_OK)
        return st;
    /* Reject counts the rest of the file cannot hold, then counts over the caps,
     * before allocating anything for them. */
    if (g->n_kv > remaining(p) / GGUF_MIN_KV_BYTES)
        return fail_at(p, LLMOPT_ERR_FORMAT, n_kv_offset, "n_kv",
                       "%" PRIu64 " key-value pairs need at least %u bytes each, only %" PRIu64
                       " bytes follow the header (file size %" PRIu64 ")",
                       g->n_kv, GGUF_MIN_KV_BYTES, remaining(p), p->size);
    uint64_t after_kv = remaining(p) - g->n_kv * GGUF_MIN_KV_BYTES;
    if (g->n_tensors > after_kv / GGUF_MIN_TENSOR_INFO_BYTES)
        return fail_at(p, LLMOPT_ERR_FORMAT, n_tensors_offset, "n_tensors",
                       "%" PRIu64 " tensor infos need at least %u bytes each, only %" PRIu64
                       " bytes follow the header and %" PRIu64 " key-value pairs (file size %"
                       PRIu64 ")",
                       g->n_tensors, GGUF_MIN_TENSOR_INFO_BYTES, after_kv, g->n_kv, p->size);
    if (g->n_kv > GGUF_MAX_KV)
        return fail_at(p, LLMOPT_ERR_LIMIT, n_kv_offset, "n_kv",
                       "%" PRIu64 " key-value pairs exceeds the cap of %u", g->n_kv,
                       GGUF_MAX_KV);
    if (g->n_tensors > GGUF_MAX_TENSORS)
        return fail_at(p, LLMOPT_ERR_LIMIT, n_tensors_offset, "n_tensors",
                       "%" PRIu64 " tensors exceeds the cap of %u", g->n_tensors,
                       GGUF_MAX_TENSORS);

    if (g->n_kv) {
        g->kv = calloc(g->n_kv, sizeof *g->kv);
        if (!g->kv)
            return fail_at(p, LLMOPT_ERR_NOMEM, n_kv_offset, "n_kv",
                           "cannot allocate %" PRIu64 " key-value entries", g->n_kv);
    }
    if (!name_set_init(&f->kv_names, g->n_kv))
        return fail_at(p, LLMOPT_ERR_NOMEM, n_kv_offset, "n_kv", "cannot allocate key index");
    st = read_kvs(p, f);
    if (st != LLMOPT_OK)
        return st;
    st = read_alignment(p, g);
    if (st != LLMOPT_OK)
        return st;

    /* The kvs are read: check n_tensors again against what is really left. */
    set_where(p, "header");
    if (g->n_tensors > remaining(p) / GGUF_MIN_TENSOR_INFO_BYTES)
        return fail_at(p, LLMOPT_ERR_FORMAT, n_tensors_offset, "n_tensors",
                       "%" PRIu64 " tensor infos need at least %u bytes each, only %" PRIu64
                       " bytes follow the metadata at offset %" PRIu64 " (file size %" PRIu64
                       ")",
                       g->n_tensors, GGUF_MIN_TENSOR_INFO_BYTES, remaining(p), p->pos,
                       p->size);
    if (g->n_tensors) {
        g->tensors = calloc(g->n_tensors, sizeof *g->tensors);
        if (!g->tensors)
            return fail_at(p, LLMOPT_ERR_NOMEM, n_tensors_offset, "n_tensors",
                           "cannot allocate %" PRIu64 " tensor entries", g->n_tensors);
    }
    if (!name_set_init(&f->tensor_names, g->n_tensors))
        return fail_at(p, LLMOPT_ERR_NOMEM, n_tensors_offset, "n_tensors",
                       "cannot allocate tensor index");
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        st = read_tensor_info(p, f, i);
        if (st != LLMOPT_OK)
            return st;
    }

    /* Data section: starts at the first multiple of the alignment after the infos. */
    set_where(p, "data section");
    uint64_t pad = (g->alignment - p->pos % g->alignment) % g->alignment;
    if (pad > remaining(p)) {
        if (g->n_tensors > 0)
            return fail_at(p, LLMOPT_ERR_FORMAT, p->pos, "start",
                           "aligned to %" PRIu32 " it starts at %" PRIu64
                           ", past the end of the file (size %" PRIu64 ")",
                           g->alignment, p->pos + pad, p->size);
        pad = remaining(p); /* no tensors: the padding may be left out */
    }
    g->data_offset = p->pos + pad;
    uint64_t data_size = p->size - g->data_offset;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        struct gguf_tensor *t = &g->tensors[i];
        if (t->offset > data_size || t->n_bytes > data_size - t->offset) {
            char name[GGUF_MSG_NAME_MAX];
            escape_str(name, sizeof name, t->name.ptr, t->name.len);
            p->where[0] = '\0';
            return err_set(p->err, LLMOPT_ERR_FORMAT,
                           "gguf: tensor '%s' (#%" PRIu64 ") data [offset %" PRIu64
                           " in the data section at %" PRIu64 ", %" PRIu64
                           " bytes] extends past end of file (size %" PRIu64 ")",
                           name, i, t->offset, g->data_offset, t->n_bytes, p->size);
        }
        t->data = p->base + g->data_offset + t->offset;
    }
    return LLMOPT_OK;
}

static void file_free(struct gguf_file_impl *f) {
    name_set_free(&f->tensor_names);
    name_set_free(&f->kv_names);
    free(f->pub.tensors);
    free(f->pub.kv);
    free(f);
}

enum llmopt_status gguf_parse(const uint8_t *data, size_t size, struct gguf_file **out,
                              struct llmopt_err *err) {
    if (!data && size)
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "gguf: NULL buffer of %zu bytes", size);
    struct gguf_file_impl *f = calloc(1, sizeof *f);
    if (!f)
        return err_set(err, LLMOPT_ERR_NOMEM, "gguf: cannot allocate file");
    static const uint8_t empty[1];
    struct parser p = {.base = data ? data : empty, .size = size, .err = err};
    f->pub.base = p.base;
    f->pub.size = size;
    enum llmopt_status st = parse_into(&p, f);
    if (st != LLMOPT_OK) {
        file_free(f);
        return st;
    }
    *out = &f->pub;
    return LLMOPT_OK;
}

enum llmopt_status gguf_open(const char *path, struct gguf_file **out, struct llmopt_err *err) {
    struct file_map map;
    enum llmopt_status st = file_map_open(path, &map, err);
    if (st != LLMOPT_OK)
        return st;
    struct gguf_file *f;
    st = gguf_parse(map.data, map.size, &f, err);
    if (st != LLMOPT_OK) {
        err_prefix(err, "%s", path);
        file_map_close(&map);
        return st;
    }
    f->mapped = map.size > 0;
    *out = f;
    return LLMOPT_OK;
}

void gguf_close(struct gguf_file *f) {
    if (!f)
        return;
    if (f->mapped) {
        struct file_map map = {.data = f->base, .size = f->size};
        file_map_close(&map);
    }
    file_free((struct gguf_file_impl *)f);
}

/* ---- lookups ---- */

const struct gguf_kv *gguf_find_kv(const struct gguf_file *f, const char *key) {
    const struct gguf_file_impl *impl = (const struct gguf_file_impl *)f;
    const struct gguf_str *s = name_set_find(&impl->kv_names, key, strlen(key));
    /* key is the first member of gguf_kv: the entry is at that address */
    return s ? (const struct gguf_kv *)(const void *)s : NULL;
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name) {
    const struct gguf_file_impl *impl = (const struct gguf_file_impl *)f;
    const struct gguf_str *s = name_set_find(&impl->tensor_names, name, strlen(name));
    return s ? (const struct gguf_tensor *)(const void *)s : NULL;
}

bool gguf_kv_get_i64(const struct gguf_kv *kv, int64_t *out) {
    const uint8_t *b = kv->data;
    switch (kv->type) {
    case GGUF_TYPE_UINT8: *out = b[0]; return true;
    case GGUF_TYPE_INT8: *out = (int8_t)b[0]; return true;
    case GGUF_TYPE_UINT16: *out = load_u16(b); return true;
    case GGUF_TYPE_INT16: *out = (int16_t)load_u16(b); return true;
    case GGUF_TYPE_UINT32: *out = load_u32(b); return true;
    case GGUF_TYPE_INT32: *out = (int32_t)load_u32(b); return true;
    case GGUF_TYPE_INT64: *out = (int64_t)load_u64(b); return true;
    case GGUF_TYPE_UINT64: {
        uint64_t v = load_u64(b);
        if (v > (uint64_t)INT64_MAX)
            return false;
        *out = (int64_t)v;
        return true;
    }
    default: return false;
    }
}

bool gguf_kv_get_u64(const struct gguf_kv *kv, uint64_t *out) {
    if (kv->type == GGUF_TYPE_UINT64) {
        *out = load_u64(kv->data);
        return true;
    }
    int64_t v;
    if (!gguf_kv_get_i64(kv, &v) || v < 0)
        return false;
    *out = (uint64_t)v;
    return true;
}

bool gguf_kv_get_f64(const struct gguf_kv *kv, double *out) {
    if (kv->type == GGUF_TYPE_FLOAT32) {
        float v;
        memcpy(&v, kv->data, sizeof v);
        *out = v;
        return true;
    }
    if (kv->type == GGUF_TYPE_FLOAT64) {
        memcpy(out, kv->data, sizeof *out);
        return true;
    }
    if (kv->type == GGUF_TYPE_UINT64) {
        *out = (double)load_u64(kv->data);
        return true;
    }
    int64_t v;
    if (!gguf_kv_get_i64(kv, &v))
        return false;
    *out = (double)v;
    return true;
}

bool gguf_kv_get_str(const struct gguf_kv *kv, struct gguf_str *out) {
    if (kv->type != GGUF_TYPE_STRING)
        return false;
    out->len = load_u64(kv->data);
    out->ptr = (const char *)kv->data + 8;
    return true;
}

bool gguf_get_u64(const struct gguf_file *f, const char *key, uint64_t *out) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    return kv && gguf_kv_get_u64(kv, out);
}

bool gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *out) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    return kv && gguf_kv_get_i64(kv, out);
}

bool gguf_get_f64(const struct gguf_file *f, const char *key, double *out) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    return kv && gguf_kv_get_f64(kv, out);
}

bool gguf_get_bool(const struct gguf_file *f, const char *key, bool *out) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv || kv->type != GGUF_TYPE_BOOL)
        return false;
    *out = kv->data[0] != 0;
    return true;
}

bool gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *out) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    return kv && gguf_kv_get_str(kv, out);
}

/* Element i of a scalar array as a one-element kv, so the scalar getters apply. */
static bool array_elem(const struct gguf_kv *kv, uint64_t i, struct gguf_kv *elem) {
    if (kv->type != GGUF_TYPE_ARRAY || i >= kv->array_len ||
        (unsigned)kv->array_type >= GGUF_TYPE_COUNT || !gguf_type_sizes[kv->array_type])
        return false;
    *elem = (struct gguf_kv){
        .type = kv->array_type,
        .data = kv->data + i * gguf_type_sizes[kv->array_type],
        .offset = kv->offset + i * gguf_type_sizes[kv->array_type],
    };
    return true;
}

bool gguf_array_get_i64(const struct gguf_kv *kv, uint64_t i, int64_t *out) {
    struct gguf_kv elem;
    return array_elem(kv, i, &elem) && gguf_kv_get_i64(&elem, out);
}

bool gguf_array_get_f64(const struct gguf_kv *kv, uint64_t i, double *out) {
    struct gguf_kv elem;
    return array_elem(kv, i, &elem) && gguf_kv_get_f64(&elem, out);
}

void gguf_str_iter_init(struct gguf_str_iter *it, const struct gguf_kv *kv) {
    it->kv = kv;
    it->pos = kv->data;
    /* anything but an array of strings iterates over nothing */
    bool strings = kv->type == GGUF_TYPE_ARRAY && kv->array_type == GGUF_TYPE_STRING;
    it->index = strings ? 0 : UINT64_MAX;
}

bool gguf_str_iter_next(struct gguf_str_iter *it, struct gguf_str *out) {
    if (it->index >= it->kv->array_len)
        return false;
    /* lengths were all checked by the parser */
    out->len = load_u64(it->pos);
    out->ptr = (const char *)it->pos + 8;
    it->pos += 8 + out->len;
    it->index++;
    return true;
}

bool gguf_str_array_get(const struct gguf_kv *kv, uint64_t i, struct gguf_str *out) {
    struct gguf_str_iter it;
    gguf_str_iter_init(&it, kv);
    struct gguf_str s;
    for (uint64_t k = 0; gguf_str_iter_next(&it, &s); k++) {
        if (k == i) {
            *out = s;
            return true;
        }
    }
    return false;
}

/* ---- printing ---- */

#define PRINT_STR_MAX 60   /* bytes of a string value shown */
#define PRINT_ARRAY_HEAD 5 /* array elements shown */

static void print_quoted(FILE *out, struct gguf_str s) {
    char buf[PRINT_STR_MAX * 4 + 8];
    uint64_t shown = s.len < PRINT_STR_MAX ? s.len : PRINT_STR_MAX;
    escape_str(buf, sizeof buf, s.ptr, shown);
    fprintf(out, "\"%s\"%s", buf, shown < s.len ? "..." : "");
}

/* One scalar value (type is not string or array). */
static void print_scalar(FILE *out, const struct gguf_kv *kv) {
    int64_t i;
    uint64_t u;
    double d;
    if (kv->type == GGUF_TYPE_BOOL)
        fprintf(out, "%s", kv->data[0] ? "true" : "false");
    else if (kv->type == GGUF_TYPE_FLOAT32 && gguf_kv_get_f64(kv, &d))
        fprintf(out, "%.9g", d);
    else if (kv->type == GGUF_TYPE_FLOAT64 && gguf_kv_get_f64(kv, &d))
        fprintf(out, "%.17g", d);
    else if (kv->type == GGUF_TYPE_UINT64 && gguf_kv_get_u64(kv, &u))
        fprintf(out, "%" PRIu64, u);
    else if (gguf_kv_get_i64(kv, &i))
        fprintf(out, "%" PRId64, i);
    else
        fprintf(out, "?");
}

static void print_value(FILE *out, const struct gguf_kv *kv) {
    struct gguf_str s;
    if (kv->type == GGUF_TYPE_STRING && gguf_kv_get_str(kv, &s)) {
        print_quoted(out, s);
        return;
    }
    if (kv->type != GGUF_TYPE_ARRAY) {
        print_scalar(out, kv);
        return;
    }
    fprintf(out, "%" PRIu64 " x [", kv->array_len);
    uint64_t shown = kv->array_len < PRINT_ARRAY_HEAD ? kv->array_len : PRINT_ARRAY_HEAD;
    if (kv->array_type == GGUF_TYPE_STRING) {
        struct gguf_str_iter it;
        gguf_str_iter_init(&it, kv);
        for (uint64_t i = 0; i < shown && gguf_str_iter_next(&it, &s); i++) {
            fprintf(out, "%s", i ? ", " : "");
            print_quoted(out, s);
        }
    } else {
        for (uint64_t i = 0; i < shown; i++) {
            struct gguf_kv elem;
            fprintf(out, "%s", i ? ", " : "");
            if (array_elem(kv, i, &elem))
                print_scalar(out, &elem);
        }
    }
    fprintf(out, "%s]", shown < kv->array_len ? ", ..." : "");
}

void gguf_print(const struct gguf_file *f, FILE *out) {
    fprintf(out, "GGUF v%" PRIu32 ": %zu bytes, %" PRIu64 " kv, %" PRIu64
                 " tensors, alignment %" PRIu32 ", data section at offset %" PRIu64 "\n",
            f->version, f->size, f->n_kv, f->n_tensors, f->alignment, f->data_offset);

    fprintf(out, "\nmetadata:\n%6s  %-44s %-14s %s\n", "#", "key", "type", "value");
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const struct gguf_kv *kv = &f->kv[i];
        char key[GGUF_MSG_NAME_MAX * 2];
        escape_str(key, sizeof key, kv->key.ptr, kv->key.len);
        char type[32];
        if (kv->type == GGUF_TYPE_ARRAY)
            snprintf(type, sizeof type, "[%s]", gguf_type_name(kv->array_type));
        else
            snprintf(type, sizeof type, "%s", gguf_type_name(kv->type));
        fprintf(out, "%6" PRIu64 "  %-44s %-14s ", i, key, type);
        print_value(out, kv);
        fputc('\n', out);
    }

    uint64_t total = 0;
    fprintf(out, "\ntensors:\n%6s  %-36s %-6s %-28s %12s %12s\n", "#", "name", "type",
            "shape (ne0 x ne1 ...)", "offset", "bytes");
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        char name[GGUF_MSG_NAME_MAX * 2];
        escape_str(name, sizeof name, t->name.ptr, t->name.len);
        char shape[128];
        int n = 0;
        for (uint32_t d = 0; d < t->n_dims && d < GGUF_MAX_DIMS; d++)
            n += snprintf(shape + n, sizeof shape - (size_t)n, "%s%" PRIu64, d ? " x " : "",
                          t->ne[d]);
        const char *type = ggml_type_name(t->type);
        fprintf(out, "%6" PRIu64 "  %-36s %-6s %-28s %12" PRIu64 " %12" PRIu64 "\n", i, name,
                type ? type : "?", shape, t->offset, t->n_bytes);
        total += t->n_bytes;
    }
    fprintf(out, "%6s  %-36s %-6s %-28s %12s %12" PRIu64 "\n", "", "total", "", "", "", total);
}

/* ---- fuzz entry ---- */

static FILE *fuzz_sink(void) {
    /* printing exercises the escaping of hostile strings; opened once, never closed */
    static FILE *sink;
    if (!sink)
        sink = fopen("/dev/null", "w");
    return sink;
}

int gguf_fuzz_one(const uint8_t *data, size_t size) {
    struct gguf_file *f;
    struct llmopt_err err;
    if (gguf_parse(data, size, &f, &err) != LLMOPT_OK) {
        LLMOPT_ASSERT(err.msg[0] != '\0');
        return 0;
    }
    volatile uint64_t sum = 0;
    LLMOPT_ASSERT(gguf_find_kv(f, "") == NULL); /* empty keys are rejected */
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const struct gguf_kv *kv = &f->kv[i];
        int64_t iv;
        double dv;
        struct gguf_str s;
        if (gguf_kv_get_i64(kv, &iv))
            sum += (uint64_t)iv;
        if (gguf_kv_get_f64(kv, &dv))
            sum += dv == dv;
        if (gguf_kv_get_str(kv, &s))
            for (uint64_t k = 0; k < s.len; k++)
                sum += (unsigned char)s.ptr[k];
        if (kv->type == GGUF_TYPE_ARRAY && kv->array_type == GGUF_TYPE_STRING) {
            struct gguf_str_iter it;
            uint64_t n = 0;
            gguf_str_iter_init(&it, kv);
            while (gguf_str_iter_next(&it, &s)) {
                sum += s.len ? (unsigned char)s.ptr[s.len - 1] : 0;
                n++;
            }
            LLMOPT_ASSERT(n == kv->array_len);
        } else if (kv->type == GGUF_TYPE_ARRAY) {
            for (uint64_t k = 0; k < kv->array_len; k++)
                if (gguf_array_get_f64(kv, k, &dv))
                    sum += dv == dv;
        }
        /* the first kv with this key is this one (keys are unique) */
        char key[64];
        if (kv->key.len < sizeof key && !memchr(kv->key.ptr, 0, kv->key.len)) {
            memcpy(key, kv->key.ptr, kv->key.len);
            key[kv->key.len] = '\0';
            LLMOPT_ASSERT(gguf_find_kv(f, key) == kv);
        }
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        const uint8_t *b = t->data;
        for (uint64_t k = 0; k < t->n_bytes; k++)
            sum += b[k];
        /* dequantize the first row (up to 256 elements) through the reference path */
        float row[256];
        uint32_t block_elems, block_bytes;
        LLMOPT_ASSERT(ggml_type_block(t->type, &block_elems, &block_bytes));
        uint64_t n = t->ne[0] < 256 ? t->ne[0] : 256 / block_elems * block_elems;
        quant_dequantize_row(t->type, t->data, row, (int64_t)n);
        for (uint64_t k = 0; k < n; k++)
            sum += row[k] == row[k];
    }
    FILE *sink = fuzz_sink();
    if (sink)
        gguf_print(f, sink);
    (void)sum;
    gguf_close(f);
    return 0;
}
