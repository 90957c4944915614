/* safetensors reader. The header length is checked against the file size and
 * capped before jansson sees a byte; every tensor entry is checked (dtype, shape,
 * byte count, range inside the data buffer, no overlap with another tensor) before
 * a pointer into the mapping is handed out. A sharded directory is read through
 * its index and cross-checked against it.
 *
 * Errors: LLMOPT_ERR_FORMAT for malformed input, LLMOPT_ERR_UNSUPPORTED for
 * well-formed dtypes llmopt does not read (I64, F8_E4M3, ...), LLMOPT_ERR_LIMIT
 * when a ST_MAX_* cap is passed, LLMOPT_ERR_IO when a file cannot be opened or
 * mapped. Messages start with "safetensors: " and name the tensor and field; the
 * open functions put the file's path in front. */
#include "format/safetensors.h"

#include "base/arena.h"
#include "base/file_map.h"
#include "base/fp16.h"
#include "base/json_kind.h"
#include "base/strmap.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c reads the little-endian header length with memcpy: port it"
#endif

#define ST_INDEX_FILE   "model.safetensors.index.json"
#define ST_SINGLE_FILE  "model.safetensors"
#define ST_METADATA_KEY "__metadata__"
#define ST_MSG_NAME_MAX 96 /* bytes of a name quoted in a message (escaped) */

struct st_dtype_info {
    const char *name;
    uint8_t size;
};

static const struct st_dtype_info st_dtypes[ST_DTYPE_COUNT] = {
    [ST_DTYPE_F32] = {"F32", 4},
    [ST_DTYPE_F16] = {"F16", 2},
    [ST_DTYPE_BF16] = {"BF16", 2},
};
_Static_assert(LLMOPT_ARRAY_LEN(st_dtypes) == ST_DTYPE_COUNT, "st dtype table out of sync");

/* dtypes of the safetensors format that llmopt does not read: a file holding one
 * is unsupported, not malformed. */
static const char *const st_unread_dtypes[] = {
    "BOOL", "U8",  "I8",      "U16",     "I16",     "U32",     "I32",     "U64", "I64",
    "F64",  "C64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4",
};

const char *st_dtype_name(enum st_dtype dtype) {
    if ((unsigned)dtype >= ST_DTYPE_COUNT) return "?";
    return st_dtypes[dtype].name;
}

size_t st_dtype_size(enum st_dtype dtype) {
    if ((unsigned)dtype >= ST_DTYPE_COUNT) return 0;
    return st_dtypes[dtype].size;
}

/* ---- the file object ---- */

struct st_shard {
    const char *name;    /* arena; see st_shard_name */
    struct file_map map; /* zeroed when the bytes are borrowed (st_parse) */
    const uint8_t *base; /* (size) bytes */
    uint64_t size;
    uint64_t data_start; /* file offset of the data buffer: 8 + header length */
};

struct st_kv {
    const char *key;   /* arena */
    const char *value; /* arena */
};

struct st_file {
    struct arena strings;    /* tensor names, metadata, shard names */
    struct st_shard *shards; /* (n_shards) */
    uint32_t n_shards;
    struct st_tensor *tensors; /* (n_tensors), data order */
    uint64_t n_tensors, tensors_cap;
    struct st_kv *metadata; /* (n_metadata) */
    uint64_t n_metadata, metadata_cap;
    struct strmap tensor_index;   /* name -> index in tensors */
    struct strmap metadata_index; /* key -> index in metadata */
};

static struct st_file *file_new(void) {
    struct st_file *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    arena_init(&f->strings);
    strmap_init(&f->tensor_index);
    strmap_init(&f->metadata_index);
    return f;
}

static void file_free(struct st_file *f) {
    if (!f) return;
    strmap_free(&f->metadata_index);
    strmap_free(&f->tensor_index);
    free(f->metadata);
    free(f->tensors);
    for (uint32_t i = 0; i < f->n_shards; i++) file_map_close(&f->shards[i].map);
    free(f->shards);
    arena_free(&f->strings);
    free(f);
}

/* array with room for `need` elements of `elem` bytes (capacity *cap, updated);
 * NULL on OOM, the old array still valid. */
static void *grow(void *array, uint64_t *cap, uint64_t need, size_t elem) {
    if (need <= *cap && array) return array;
    uint64_t n = *cap ? *cap : 16;
    while (n < need) n *= 2;
    void *p = realloc(array, (size_t)n * elem); /* need is capped: no overflow */
    if (p) *cap = n;
    return p;
}

/* ---- messages ---- */

/* Writes s into buf (cap bytes) for a message: control bytes, quotes and
 * backslashes escaped; longer names cut with "...". */
static const char *escape_name(char *buf, size_t cap, const char *s) {
    size_t o = 0;
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        char tmp[8];
        int n;
        if (*c == '"' || *c == '\'' || *c == '\\')
            n = snprintf(tmp, sizeof tmp, "\\%c", *c);
        else if (*c < 0x20 || *c == 0x7f)
            n = snprintf(tmp, sizeof tmp, "\\x%02x", *c);
        else
            n = snprintf(tmp, sizeof tmp, "%c", *c);
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

/* A JSON value as found, for "expected X, found Y" messages. */
static const char *describe(char *buf, size_t cap, const json_t *v) {
    if (json_is_integer(v))
        snprintf(buf, cap, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
    else if (json_is_string(v)) {
        char s[ST_MSG_NAME_MAX];
        snprintf(buf, cap, "\"%s\"", escape_name(s, sizeof s, json_string_value(v)));
    } else
        snprintf(buf, cap, "%s", json_kind(v));
    return buf;
}

/* "safetensors: tensor 'NAME' field 'FIELD': detail" */
static enum llmopt_status tensor_fail(struct llmopt_err *err, enum llmopt_status st,
                                      const char *name, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static enum llmopt_status tensor_fail(struct llmopt_err *err, enum llmopt_status st,
                                      const char *name, const char *field, const char *fmt, ...) {
    char detail[512], quoted[ST_MSG_NAME_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    return err_set(err, st, "safetensors: tensor '%s' field '%s': %s",
                   escape_name(quoted, sizeof quoted, name), field, detail);
}

static void format_shape(char *buf, size_t cap, const struct st_tensor *t) {
    int n = snprintf(buf, cap, "[");
    for (int d = 0; d < t->n_dims && (size_t)n < cap; d++)
        n += snprintf(buf + n, cap - (size_t)n, "%s%" PRId64, d ? ", " : "", t->shape[d]);
    if ((size_t)n < cap) snprintf(buf + n, cap - (size_t)n, "]");
}

/* ---- one header ---- */

/* A non-negative JSON integer; false for anything else. */
static bool get_count(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

static enum llmopt_status parse_dtype(const char *name, const json_t *entry, enum st_dtype *out,
                                      struct llmopt_err *err) {
    const json_t *v = json_object_get(entry, "dtype");
    char found[ST_MSG_NAME_MAX + 8];
    if (!v) return tensor_fail(err, LLMOPT_ERR_FORMAT, name, "dtype", "missing");
    if (!json_is_string(v))
        return tensor_fail(err, LLMOPT_ERR_FORMAT, name, "dtype",
                           "expected a string such as \"F32\", found %s",
                           describe(found, sizeof found, v));
    const char *s = json_string_value(v);
    for (int i = 0; i < ST_DTYPE_COUNT; i++) {
        if (strcmp(s, st_dtypes[i].name) == 0) {
            *out = (enum st_dtype)i;
            return LLMOPT_OK;
        }
    }
    for (size_t i = 0; i < LLMOPT_ARRAY_LEN(st_unread_dtypes); i++)
        if (strcmp(s, st_unread_dtypes[i]) == 0)
            return tensor_fail(err, LLMOPT_ERR_UNSUPPORTED, name, "dtype",
                               "%s is not supported (llmopt reads F32, F16, BF16)", s);
    return tensor_fail(err, LLMOPT_ERR_FORMAT, name, "dtype", "%s is not a safetensors dtype",
                       describe(found, sizeof found, v));
}

/* shape: a list of at most ST_MAX_DIMS non-negative integers; fills n_dims, shape
 * and n_bytes (checked for overflow). */
static enum llmopt_status parse_shape(const char *name, const json_t *entry, struct st_tensor *t,
                                      struct llmopt_err *err) {
    const json_t *v = json_object_get(entry, "shape");
    char found[ST_MSG_NAME_MAX + 8];
    if (!v) return tensor_fail(err, LLMOPT_ERR_FORMAT, name, "shape", "missing");
    if (!json_is_array(v))
        return tensor_fail(err, LLMOPT_ERR_FORMAT, name, "shape",
                           "expected a list of non-negative integers, found %s",
                           describe(found, sizeof found, v));
    size_t n_dims = json_array_size(v);
    if (n_dims > ST_MAX_DIMS)
        return tensor_fail(err, LLMOPT_ERR_LIMIT, name, "shape",
                           "%zu dimensions exceeds the cap of %d", n_dims, ST_MAX_DIMS);
    t->n_dims = (int)n_dims;
    bool empty = false;
    for (int d = 0; d < ST_MAX_DIMS; d++) {
        t->shape[d] = 1;
        if (d >= t->n_dims) continue;
        const json_t *dim = json_array_get(v, (size_t)d);
        uint64_t n;
        if (!get_count(dim, &n))
            return tensor_fail(err, LLMOPT_ERR_FORMAT, name, "shape",
                               "dimension %d is %s, expected a non-negative integer", d,
                               describe(found, sizeof found, dim));
        t->shape[d] = (int64_t)n;
        empty |= n == 0;
    }
    /* The product of the non-zero dimensions must fit even when a zero makes the
     * tensor empty, so that products of shapes never overflow in any order. */
    uint64_t numel = 1;
    for (int d = 0; d < t->n_dims; d++) {
        uint64_t n = (uint64_t)t->shape[d];
        if (n == 0) continue;
        if (numel > (uint64_t)INT64_MAX / n)
            return tensor_fail(err, LLMOPT_ERR_FORMAT, name, "shape",
                               "element count overflows: the product of the dimensions "
                               "exceeds 2^63-1 at dimension %d",
                               d);
        numel *= n;
    }
    if (empty) numel = 0;
    uint64_t size = st_dtypes[t->dtype].size;
    if (numel > (uint64_t)INT64_MAX / size)
        return tensor_fail(err, LLMOPT_ERR_FORMAT, name, "shape",
                           "byte size overflows: %" PRIu64 " elements of %" PRIu64 " bytes", numel,
                           size);
    t->n_bytes = numel * size;
    return LLMOPT_OK;
}

/* data_offsets: [begin, end] inside the data buffer, end - begin == n_bytes. */
static enum llmopt_status parse_offsets(const char *name, const json_t *entry,
                                        const struct st_shard *sh, struct st_tensor *t,
                                        struct llmopt_err *err) {
    const json_t *v = json_object_get(entry, "data_offsets");
    char found[ST_MSG_NAME_MAX + 8];
    if (!v) return tensor_fail(err, LLMOPT_ERR_FORMAT, name, "data_offsets", "missing");
    if (!json_is_array(v) || json_array_size(v) != 2)
        return json_is_array(v)
                   ? tensor_fail(err, LLMOPT_ERR_FORMAT, name, "data_offsets",
                                 "expected two integers [begin, end], found a list of %zu",
                                 json_array_size(v))
                   : tensor_fail(err, LLMOPT_ERR_FORMAT, name, "data_offsets",
                                 "expected a list of two integers [begin, end], found %s",
                                 describe(found, sizeof found, v));
    uint64_t off[2];
    static const char *const which[2] = {"begin", "end"};
    for (size_t i = 0; i < 2; i++) {
        const json_t *o = json_array_get(v, i);
        if (!get_count(o, &off[i]))
            return tensor_fail(err, LLMOPT_ERR_FORMAT, name, "data_offsets",
                               "%s is %s, expected a non-negative integer", which[i],
                               describe(found, sizeof found, o));
    }
    uint64_t begin = off[0], end = off[1];
    if (end < begin)
        return tensor_fail(err, LLMOPT_ERR_FORMAT, name, "data_offsets",
                           "end %" PRIu64 " is before begin %" PRIu64, end, begin);
    if (end - begin != t->n_bytes) {
        char shape[128];
        format_shape(shape, sizeof shape, t);
        return tensor_fail(err, LLMOPT_ERR_FORMAT, name, "data_offsets",
                           "[%" PRIu64 ", %" PRIu64 "] holds %" PRIu64 " bytes, but %s %s "
                           "needs %" PRIu64,
                           begin, end, end - begin, st_dtypes[t->dtype].name, shape, t->n_bytes);
    }
    uint64_t data_size = sh->size - sh->data_start;
    if (end > data_size)
        return tensor_fail(err, LLMOPT_ERR_FORMAT, name, "data_offsets",
                           "[%" PRIu64 ", %" PRIu64 "] runs past the end of the data buffer "
                           "(%" PRIu64 " bytes at file offset %" PRIu64 ", file size %" PRIu64 ")",
                           begin, end, data_size, sh->data_start, sh->size);
    t->offset = sh->data_start + begin;
    t->data = sh->base + t->offset;
    return LLMOPT_OK;
}

static enum llmopt_status parse_tensor(struct st_file *f, uint32_t shard, const char *key,
                                       const json_t *entry, struct llmopt_err *err) {
    char found[ST_MSG_NAME_MAX + 8];
    if (!key[0]) return tensor_fail(err, LLMOPT_ERR_FORMAT, "", "name", "tensor name is empty");
    if (!json_is_object(entry))
        return tensor_fail(err, LLMOPT_ERR_FORMAT, key, "entry",
                           "expected an object {\"dtype\", \"shape\", \"data_offsets\"}, "
                           "found %s",
                           describe(found, sizeof found, entry));
    struct st_tensor t = {.shard = shard};
    enum llmopt_status st = parse_dtype(key, entry, &t.dtype, err);
    if (st == LLMOPT_OK) st = parse_shape(key, entry, &t, err);
    if (st == LLMOPT_OK) st = parse_offsets(key, entry, &f->shards[shard], &t, err);
    if (st != LLMOPT_OK) return st;
    t.name = arena_strndup(&f->strings, key, strlen(key));
    if (!t.name) return err_set(err, LLMOPT_ERR_NOMEM, "safetensors: cannot allocate tensor names");
    f->tensors[f->n_tensors++] = t; /* room was made for every entry */
    return LLMOPT_OK;
}

/* __metadata__: an object of strings. Keys already seen (in an earlier shard) keep
 * their first value. */
static enum llmopt_status parse_metadata(struct st_file *f, const json_t *v,
                                         struct llmopt_err *err) {
    char found[ST_MSG_NAME_MAX + 8], quoted[ST_MSG_NAME_MAX];
    if (!json_is_object(v))
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "safetensors: field '" ST_METADATA_KEY "': expected an object of "
                       "strings, found %s",
                       describe(found, sizeof found, v));
    const char *key;
    const json_t *value;
    json_object_foreach((json_t *)v, key, value) {
        if (!json_is_string(value))
            return err_set(err, LLMOPT_ERR_FORMAT,
                           "safetensors: field '" ST_METADATA_KEY "' key '%s': expected a "
                           "string value, found %s",
                           escape_name(quoted, sizeof quoted, key),
                           describe(found, sizeof found, value));
        int32_t prev;
        if (strmap_get(&f->metadata_index, key, strlen(key), &prev)) continue;
        if (f->n_metadata >= ST_MAX_METADATA)
            return err_set(err, LLMOPT_ERR_LIMIT,
                           "safetensors: field '" ST_METADATA_KEY "': more than %u keys",
                           ST_MAX_METADATA);
        struct st_kv *metadata =
            grow(f->metadata, &f->metadata_cap, f->n_metadata + 1, sizeof *f->metadata);
        if (!metadata)
            return err_set(err, LLMOPT_ERR_NOMEM, "safetensors: cannot allocate metadata");
        f->metadata = metadata;
        struct st_kv kv = {
            .key = arena_strndup(&f->strings, key, strlen(key)),
            .value =
                arena_strndup(&f->strings, json_string_value(value), json_string_length(value)),
        };
        if (!kv.key || !kv.value ||
            !strmap_put(&f->metadata_index, key, strlen(key), (int32_t)f->n_metadata))
            return err_set(err, LLMOPT_ERR_NOMEM, "safetensors: cannot allocate metadata");
        f->metadata[f->n_metadata++] = kv;
    }
    return LLMOPT_OK;
}

static int cmp_by_offset(const void *pa, const void *pb) {
    const struct st_tensor *a = pa, *b = pb;
    if (a->offset != b->offset) return a->offset < b->offset ? -1 : 1;
    if (a->n_bytes != b->n_bytes) return a->n_bytes < b->n_bytes ? -1 : 1;
    return strcmp(a->name, b->name); /* names are unique in a shard: a total order */
}

/* Sorts tensors [first, n_tensors) of one shard by offset and rejects overlapping
 * ranges. Empty tensors own no bytes and overlap nothing. */
static enum llmopt_status check_overlaps(struct st_file *f, uint64_t first,
                                         const struct st_shard *sh, struct llmopt_err *err) {
    uint64_t n = f->n_tensors - first;
    if (n > 1) qsort(f->tensors + first, (size_t)n, sizeof *f->tensors, cmp_by_offset);
    const struct st_tensor *prev = NULL; /* the non-empty tensor that ends last so far */
    for (uint64_t i = first; i < f->n_tensors; i++) {
        const struct st_tensor *t = &f->tensors[i];
        if (!t->n_bytes) continue;
        if (prev && t->offset < prev->offset + prev->n_bytes) {
            char a[ST_MSG_NAME_MAX], b[ST_MSG_NAME_MAX];
            uint64_t pb = prev->offset - sh->data_start, tb = t->offset - sh->data_start;
            return err_set(err, LLMOPT_ERR_FORMAT,
                           "safetensors: tensor '%s' field 'data_offsets': [%" PRIu64 ", %" PRIu64
                           "] overlaps tensor '%s' at [%" PRIu64 ", %" PRIu64 "]",
                           escape_name(a, sizeof a, t->name), tb, tb + t->n_bytes,
                           escape_name(b, sizeof b, prev->name), pb, pb + prev->n_bytes);
        }
        prev = t;
    }
    return LLMOPT_OK;
}

static enum llmopt_status parse_header(struct st_file *f, uint32_t shard, const json_t *root,
                                       struct llmopt_err *err) {
    char found[ST_MSG_NAME_MAX + 8];
    if (!json_is_object(root))
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "safetensors: header: expected a JSON object, found %s",
                       describe(found, sizeof found, root));
    size_t n_entries = json_object_size(root);
    size_t n_new = n_entries - (json_object_get(root, ST_METADATA_KEY) ? 1 : 0);
    if (n_new > ST_MAX_TENSORS - f->n_tensors)
        return err_set(err, LLMOPT_ERR_LIMIT,
                       "safetensors: header: %zu tensors (%" PRIu64 " before this file) "
                       "exceeds the cap of %u",
                       n_new, f->n_tensors, ST_MAX_TENSORS);
    struct st_tensor *tensors =
        grow(f->tensors, &f->tensors_cap, f->n_tensors + n_new, sizeof *f->tensors);
    if (!tensors)
        return err_set(err, LLMOPT_ERR_NOMEM, "safetensors: cannot allocate %zu tensors", n_new);
    f->tensors = tensors;

    uint64_t first = f->n_tensors;
    const char *key;
    const json_t *value;
    json_object_foreach((json_t *)root, key, value) {
        enum llmopt_status st = strcmp(key, ST_METADATA_KEY) == 0
                                    ? parse_metadata(f, value, err)
                                    : parse_tensor(f, shard, key, value, err);
        if (st != LLMOPT_OK) return st;
    }
    return check_overlaps(f, first, &f->shards[shard], err);
}

/* Parses shard `shard`, whose base and size are set: header length, JSON, entries. */
static enum llmopt_status parse_shard(struct st_file *f, uint32_t shard, struct llmopt_err *err) {
    struct st_shard *sh = &f->shards[shard];
    if (sh->size < 8)
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "safetensors: header length: file is %" PRIu64 " bytes, too small for "
                       "the 8-byte header length",
                       sh->size);
    uint64_t n;
    memcpy(&n, sh->base, sizeof n);
    if (n > sh->size - 8)
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "safetensors: header length: %" PRIu64 " bytes runs past the end of "
                       "the file (%" PRIu64 " bytes follow the length, file size %" PRIu64 ")",
                       n, sh->size - 8, sh->size);
    if (n > ST_MAX_HEADER_BYTES)
        return err_set(err, LLMOPT_ERR_LIMIT,
                       "safetensors: header length: %" PRIu64 " bytes exceeds the cap of %u", n,
                       ST_MAX_HEADER_BYTES);
    sh->data_start = 8 + n;

    json_error_t jerr;
    json_t *root = json_loadb((const char *)sh->base + 8, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "safetensors: header: invalid JSON at line %d column %d (file offset "
                       "%" PRIu64 "): %s",
                       jerr.line, jerr.column,
                       8 + (uint64_t)(jerr.position > 0 ? jerr.position : 0), jerr.text);
    enum llmopt_status st = parse_header(f, shard, root, err);
    json_decref(root);
    return st;
}

/* Every tensor name goes into the index; a name already there is in another shard. */
static enum llmopt_status build_index(struct st_file *f, struct llmopt_err *err) {
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct st_tensor *t = &f->tensors[i];
        size_t len = strlen(t->name);
        int32_t prev;
        if (strmap_get(&f->tensor_index, t->name, len, &prev)) {
            char name[ST_MSG_NAME_MAX], a[ST_MSG_NAME_MAX], b[ST_MSG_NAME_MAX];
            return err_set(err, LLMOPT_ERR_FORMAT,
                           "safetensors: tensor '%s' is in two shards: '%s' and '%s'",
                           escape_name(name, sizeof name, t->name),
                           escape_name(a, sizeof a, f->shards[f->tensors[prev].shard].name),
                           escape_name(b, sizeof b, f->shards[t->shard].name));
        }
        if (!strmap_put(&f->tensor_index, t->name, len, (int32_t)i))
            return err_set(err, LLMOPT_ERR_NOMEM, "safetensors: cannot allocate tensor index");
    }
    return LLMOPT_OK;
}

static enum llmopt_status alloc_shards(struct st_file *f, uint32_t n, struct llmopt_err *err) {
    f->shards = calloc(n ? n : 1, sizeof *f->shards);
    if (!f->shards)
        return err_set(err, LLMOPT_ERR_NOMEM, "safetensors: cannot allocate %u shards", n);
    f->n_shards = n;
    return LLMOPT_OK;
}

/* Maps path as shard i (named `name`) and parses it; errors get the path in front. */
static enum llmopt_status open_shard(struct st_file *f, uint32_t i, const char *path,
                                     const char *name, struct llmopt_err *err) {
    static const uint8_t empty[1];
    struct st_shard *sh = &f->shards[i];
    sh->name = arena_strndup(&f->strings, name, strlen(name));
    if (!sh->name)
        return err_set(err, LLMOPT_ERR_NOMEM, "safetensors: cannot allocate shard names");
    enum llmopt_status st = file_map_open(path, &sh->map, err);
    if (st != LLMOPT_OK) return st; /* the message names the path */
    sh->base = sh->map.data ? sh->map.data : empty;
    sh->size = sh->map.size;
    st = parse_shard(f, i, err);
    if (st != LLMOPT_OK) err_prefix(err, "%s", path);
    return st;
}

/* ---- public: opening ---- */

enum llmopt_status st_parse(const uint8_t *data, size_t size, struct st_file **out,
                            struct llmopt_err *err) {
    static const uint8_t empty[1];
    if (!data && size)
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "safetensors: NULL buffer of %zu bytes", size);
    struct st_file *f = file_new();
    if (!f) return err_set(err, LLMOPT_ERR_NOMEM, "safetensors: cannot allocate file");
    enum llmopt_status st = alloc_shards(f, 1, err);
    if (st == LLMOPT_OK) {
        f->shards[0] =
            (struct st_shard){.name = "<memory>", .base = data ? data : empty, .size = size};
        st = parse_shard(f, 0, err);
    }
    if (st == LLMOPT_OK) st = build_index(f, err);
    if (st != LLMOPT_OK) {
        file_free(f);
        return st;
    }
    *out = f;
    return LLMOPT_OK;
}

enum llmopt_status st_open_file(const char *path, struct st_file **out, struct llmopt_err *err) {
    struct st_file *f = file_new();
    if (!f) return err_set(err, LLMOPT_ERR_NOMEM, "safetensors: cannot allocate file");
    enum llmopt_status st = alloc_shards(f, 1, err);
    if (st == LLMOPT_OK) st = open_shard(f, 0, path, path, err);
    if (st == LLMOPT_OK) st = build_index(f, err);
    if (st != LLMOPT_OK) {
        file_free(f);
        return st;
    }
    *out = f;
    return LLMOPT_OK;
}

/* dir + "/" + name, malloc'd; NULL on OOM. */
static char *path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    bool slash = a > 0 && dir[a - 1] != '/';
    char *p = malloc(a + slash + b + 1);
    if (!p) return NULL;
    memcpy(p, dir, a);
    if (slash) p[a] = '/';
    memcpy(p + a + slash, name, b + 1);
    return p;
}

/* A shard named by the index must be a file in the directory itself. */
static bool plain_file_name(const char *s) {
    return s[0] && !strchr(s, '/') && !strstr(s, "..");
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* weight_map of the index: checks each entry and collects the distinct shard file
 * names, sorted, into *names (pointers into root; caller frees the array). */
static enum llmopt_status read_weight_map(const json_t *root, const json_t **weight_map,
                                          const char ***names, uint32_t *n_names,
                                          struct llmopt_err *err) {
    char found[ST_MSG_NAME_MAX + 8], quoted[ST_MSG_NAME_MAX];
    *names = NULL;
    *n_names = 0;
    if (!json_is_object(root))
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "safetensors index: expected a JSON object, found %s",
                       describe(found, sizeof found, root));
    const json_t *meta = json_object_get(root, "metadata");
    if (meta && !json_is_object(meta))
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "safetensors index: field 'metadata': expected an object, found %s",
                       describe(found, sizeof found, meta));
    const json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm))
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "safetensors index: field 'weight_map': expected an object "
                       "{\"tensor\": \"file.safetensors\"}, found %s",
                       wm ? describe(found, sizeof found, wm) : "nothing");
    if (json_object_size(wm) > ST_MAX_TENSORS)
        return err_set(err, LLMOPT_ERR_LIMIT,
                       "safetensors index: field 'weight_map': %zu tensors exceeds the cap "
                       "of %u",
                       json_object_size(wm), ST_MAX_TENSORS);
    *weight_map = wm;

    struct strmap seen;
    strmap_init(&seen);
    const char **list = NULL;
    uint64_t n = 0, cap = 0;
    enum llmopt_status st = LLMOPT_OK;
    const char *key;
    const json_t *value;
    json_object_foreach((json_t *)wm, key, value) {
        if (!key[0]) {
            st = err_set(err, LLMOPT_ERR_FORMAT,
                         "safetensors index: field 'weight_map': tensor name is empty");
            break;
        }
        const char *file = json_string_value(value);
        if (!file || !plain_file_name(file)) {
            st = err_set(err, LLMOPT_ERR_FORMAT,
                         "safetensors index: field 'weight_map' tensor '%s': expected a plain "
                         "file name (no '/' or '..'), found %s",
                         escape_name(quoted, sizeof quoted, key),
                         describe(found, sizeof found, value));
            break;
        }
        int32_t id;
        if (strmap_get(&seen, file, strlen(file), &id)) continue;
        if (n >= ST_MAX_SHARDS) {
            st = err_set(err, LLMOPT_ERR_LIMIT,
                         "safetensors index: field 'weight_map': more than %u shard files",
                         ST_MAX_SHARDS);
            break;
        }
        const char **more = grow(list, &cap, n + 1, sizeof *list);
        if (!more || !strmap_put(&seen, file, strlen(file), (int32_t)n)) {
            st = err_set(err, LLMOPT_ERR_NOMEM, "safetensors index: cannot allocate");
            break;
        }
        list = more;
        list[n++] = file;
    }
    strmap_free(&seen);
    if (st != LLMOPT_OK) {
        free(list);
        return st;
    }
    if (n) qsort(list, (size_t)n, sizeof *list, cmp_str_ptr);
    *names = list;
    *n_names = (uint32_t)n;
    return LLMOPT_OK;
}

/* Every tensor is where the weight map says, and every weight map entry was found. */
static enum llmopt_status check_against_map(const struct st_file *f, const json_t *wm,
                                            struct llmopt_err *err) {
    char name[ST_MSG_NAME_MAX], listed[ST_MSG_NAME_MAX], holder[ST_MSG_NAME_MAX];
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct st_tensor *t = &f->tensors[i];
        const char *file = json_string_value(json_object_get(wm, t->name));
        const char *shard = f->shards[t->shard].name;
        if (!file)
            return err_set(err, LLMOPT_ERR_FORMAT,
                           "safetensors index: field 'weight_map': tensor '%s' of shard '%s' "
                           "is not listed",
                           escape_name(name, sizeof name, t->name),
                           escape_name(holder, sizeof holder, shard));
        if (strcmp(file, shard) != 0)
            return err_set(err, LLMOPT_ERR_FORMAT,
                           "safetensors index: field 'weight_map': tensor '%s' is listed in "
                           "'%s' but found in '%s'",
                           escape_name(name, sizeof name, t->name),
                           escape_name(listed, sizeof listed, file),
                           escape_name(holder, sizeof holder, shard));
    }
    const char *key;
    const json_t *value;
    json_object_foreach((json_t *)wm, key, value) {
        if (!st_find_tensor(f, key))
            return err_set(err, LLMOPT_ERR_FORMAT,
                           "safetensors index: field 'weight_map': tensor '%s' is listed in "
                           "'%s', which does not hold it",
                           escape_name(name, sizeof name, key),
                           escape_name(listed, sizeof listed, json_string_value(value)));
    }
    return LLMOPT_OK;
}

static enum llmopt_status open_index(struct st_file *f, const char *dir, const char *index_path,
                                     struct llmopt_err *err) {
    struct file_map map;
    enum llmopt_status st = file_map_open(index_path, &map, err);
    if (st != LLMOPT_OK) return st;
    if (map.size > ST_MAX_INDEX_BYTES) {
        file_map_close(&map);
        return err_set(err, LLMOPT_ERR_LIMIT, "%s: %zu bytes exceeds the cap of %u", index_path,
                       map.size, ST_MAX_INDEX_BYTES);
    }
    json_error_t jerr;
    json_t *root =
        json_loadb(map.data ? (const char *)map.data : "", map.size, JSON_REJECT_DUPLICATES, &jerr);
    file_map_close(&map);
    if (!root)
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "%s: safetensors index: invalid JSON at line %d column %d: %s", index_path,
                       jerr.line, jerr.column, jerr.text);

    const json_t *wm = NULL;
    const char **names = NULL;
    uint32_t n_names = 0;
    st = read_weight_map(root, &wm, &names, &n_names, err);
    if (st != LLMOPT_OK) {
        err_prefix(err, "%s", index_path);
        goto done;
    }
    st = alloc_shards(f, n_names, err);
    for (uint32_t i = 0; st == LLMOPT_OK && i < n_names; i++) {
        char *path = path_join(dir, names[i]);
        st = path ? open_shard(f, i, path, names[i], err)
                  : err_set(err, LLMOPT_ERR_NOMEM, "safetensors: cannot allocate a path");
        free(path);
    }
    if (st != LLMOPT_OK) goto done;
    st = build_index(f, err);
    if (st != LLMOPT_OK) {
        err_prefix(err, "%s", dir);
        goto done;
    }
    st = check_against_map(f, wm, err);
    if (st != LLMOPT_OK) err_prefix(err, "%s", index_path);
done:
    free(names);
    json_decref(root);
    return st;
}

enum llmopt_status st_open_dir(const char *dir, struct st_file **out, struct llmopt_err *err) {
    struct stat sb;
    if (stat(dir, &sb) != 0) return err_set(err, LLMOPT_ERR_IO, "%s: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return err_set(err, LLMOPT_ERR_IO, "%s: not a directory", dir);
    char *index_path = path_join(dir, ST_INDEX_FILE);
    char *single_path = path_join(dir, ST_SINGLE_FILE);
    struct st_file *f = file_new();
    enum llmopt_status st = LLMOPT_OK;
    if (!index_path || !single_path || !f) {
        st = err_set(err, LLMOPT_ERR_NOMEM, "safetensors: cannot allocate");
        goto done;
    }
    if (stat(index_path, &sb) == 0) {
        st = open_index(f, dir, index_path, err);
    } else if (errno != ENOENT) {
        st = err_set(err, LLMOPT_ERR_IO, "%s: %s", index_path, strerror(errno));
    } else if (stat(single_path, &sb) == 0) {
        st = alloc_shards(f, 1, err);
        if (st == LLMOPT_OK) st = open_shard(f, 0, single_path, ST_SINGLE_FILE, err);
        if (st == LLMOPT_OK) st = build_index(f, err);
    } else {
        st = err_set(err, LLMOPT_ERR_IO,
                     "%s: no " ST_INDEX_FILE " and no " ST_SINGLE_FILE " in this directory", dir);
    }
done:
    free(single_path);
    free(index_path);
    if (st != LLMOPT_OK) {
        file_free(f);
        return st;
    }
    *out = f;
    return LLMOPT_OK;
}

void st_close(struct st_file *f) {
    file_free(f);
}

/* ---- public: lookups ---- */

uint64_t st_n_tensors(const struct st_file *f) {
    return f->n_tensors;
}

const struct st_tensor *st_tensor_at(const struct st_file *f, uint64_t i) {
    return i < f->n_tensors ? &f->tensors[i] : NULL;
}

const struct st_tensor *st_find_tensor(const struct st_file *f, const char *name) {
    int32_t i;
    if (!strmap_get(&f->tensor_index, name, strlen(name), &i)) return NULL;
    return &f->tensors[i];
}

uint64_t st_tensor_index(const struct st_file *f, const struct st_tensor *t) {
    LLMOPT_ASSERT(t >= f->tensors && t < f->tensors + f->n_tensors);
    return (uint64_t)(t - f->tensors);
}

int64_t st_tensor_numel(const struct st_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->n_dims; d++) n *= t->shape[d]; /* checked at parse: cannot overflow */
    return n;
}

const char *st_metadata_get(const struct st_file *f, const char *key) {
    int32_t i;
    if (!strmap_get(&f->metadata_index, key, strlen(key), &i)) return NULL;
    return f->metadata[i].value;
}

uint64_t st_n_metadata(const struct st_file *f) {
    return f->n_metadata;
}

bool st_metadata_at(const struct st_file *f, uint64_t i, const char **key, const char **value) {
    if (i >= f->n_metadata) return false;
    *key = f->metadata[i].key;
    *value = f->metadata[i].value;
    return true;
}

uint32_t st_n_shards(const struct st_file *f) {
    return f->n_shards;
}

const char *st_shard_name(const struct st_file *f, uint32_t i) {
    return i < f->n_shards ? f->shards[i].name : NULL;
}

/* ---- printing ---- */

void st_print(const struct st_file *f, FILE *out) {
    uint64_t total = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) total += f->tensors[i].n_bytes;
    fprintf(out,
            "safetensors: %" PRIu32 " file%s, %" PRIu64 " tensors, %" PRIu64
            " bytes of tensor data\n",
            f->n_shards, f->n_shards == 1 ? "" : "s", f->n_tensors, total);

    fprintf(out, "\nfiles:\n%6s  %-44s %12s %12s\n", "#", "name", "header", "size");
    for (uint32_t i = 0; i < f->n_shards; i++) {
        const struct st_shard *sh = &f->shards[i];
        char name[ST_MSG_NAME_MAX];
        fprintf(out, "%6" PRIu32 "  %-44s %12" PRIu64 " %12" PRIu64 "\n", i,
                escape_name(name, sizeof name, sh->name), sh->data_start, sh->size);
    }

    fprintf(out, "\nmetadata:\n");
    for (uint64_t i = 0; i < f->n_metadata; i++) {
        char key[ST_MSG_NAME_MAX], value[ST_MSG_NAME_MAX];
        fprintf(out, "%6" PRIu64 "  %-44s \"%s\"\n", i,
                escape_name(key, sizeof key, f->metadata[i].key),
                escape_name(value, sizeof value, f->metadata[i].value));
    }

    fprintf(out, "\ntensors:\n%6s  %-44s %-5s %-28s %5s %12s %12s\n", "#", "name", "dtype",
            "shape (row-major)", "file", "offset", "bytes");
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct st_tensor *t = &f->tensors[i];
        char name[ST_MSG_NAME_MAX], shape[128];
        format_shape(shape, sizeof shape, t);
        fprintf(out, "%6" PRIu64 "  %-44s %-5s %-28s %5" PRIu32 " %12" PRIu64 " %12" PRIu64 "\n", i,
                escape_name(name, sizeof name, t->name), st_dtype_name(t->dtype), shape, t->shard,
                t->offset, t->n_bytes);
    }
}

/* ---- fuzz entry ---- */

static FILE *fuzz_sink(void) {
    /* printing exercises the escaping of hostile names; opened once, never closed */
    static FILE *sink;
    if (!sink) sink = fopen("/dev/null", "w");
    return sink;
}

int st_fuzz_one(const uint8_t *data, size_t size) {
    struct st_file *f;
    struct llmopt_err err;
    if (st_parse(data, size, &f, &err) != LLMOPT_OK) {
        LLMOPT_ASSERT(err.msg[0] != '\0');
        return 0;
    }
    volatile uint64_t sum = 0;
    LLMOPT_ASSERT(st_find_tensor(f, "") == NULL); /* empty names are rejected */
    LLMOPT_ASSERT(st_tensor_at(f, st_n_tensors(f)) == NULL);
    LLMOPT_ASSERT(st_n_shards(f) == 1);
    for (uint64_t i = 0; i < st_n_tensors(f); i++) {
        const struct st_tensor *t = st_tensor_at(f, i);
        LLMOPT_ASSERT(st_find_tensor(f, t->name) == t && st_tensor_index(f, t) == i);
        LLMOPT_ASSERT(t->n_dims >= 0 && t->n_dims <= ST_MAX_DIMS);
        LLMOPT_ASSERT((uint64_t)st_tensor_numel(t) * st_dtype_size(t->dtype) == t->n_bytes);
        LLMOPT_ASSERT(t->offset <= size && t->n_bytes <= size - t->offset);
        LLMOPT_ASSERT((const uint8_t *)t->data == data + t->offset);
        const uint8_t *b = t->data;
        for (uint64_t k = 0; k < t->n_bytes; k++) sum += b[k];
        /* read the first elements as the runtime would */
        uint64_t n = (uint64_t)st_tensor_numel(t);
        for (uint64_t k = 0; k < n && k < 64; k++) {
            uint16_t h;
            float v;
            if (t->dtype == ST_DTYPE_F32) {
                memcpy(&v, b + 4 * k, sizeof v);
            } else {
                memcpy(&h, b + 2 * k, sizeof h);
                v = t->dtype == ST_DTYPE_F16 ? fp16_to_f32(h) : bf16_to_f32(h);
            }
            sum += v == v;
        }
    }
    for (uint64_t i = 0; i < st_n_metadata(f); i++) {
        const char *key, *value;
        LLMOPT_ASSERT(st_metadata_at(f, i, &key, &value));
        LLMOPT_ASSERT(st_metadata_get(f, key) == value);
    }
    FILE *sink = fuzz_sink();
    if (sink) st_print(f, sink);
    (void)sum;
    st_close(f);
    return 0;
}
