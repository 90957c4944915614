/* safetensors reader: valid files in memory, on disk and as a sharded directory;
 * every malformed header field; truncation at every byte; deterministic mutations
 * through the fuzz entry point. Files are built here, not read from the repo. */
#include "rng.h"
#include "test.h"

#include "base/fp16.h"
#include "format/safetensors.h"

#include <inttypes.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- building files ---- */

struct bytes {
    uint8_t *p;
    size_t len;
};

/* u64 header length, the header, then data_len bytes of data (zeros when NULL). */
static struct bytes make_file(const char *header, const void *data, size_t data_len) {
    size_t n = strlen(header);
    struct bytes b = {malloc(8 + n + data_len + 1), 8 + n + data_len};
    uint64_t len = n;
    memcpy(b.p, &len, 8);
    memcpy(b.p + 8, header, n);
    if (data)
        memcpy(b.p + 8 + n, data, data_len);
    else
        memset(b.p + 8 + n, 0, data_len);
    return b;
}

/* Parses a private copy of exactly len bytes, so ASan sees any read past the end. */
static enum llmopt_status parse_copy(const uint8_t *p, size_t len, struct llmopt_err *err) {
    uint8_t *copy = malloc(len ? len : 1);
    if (len) memcpy(copy, p, len);
    struct st_file *f = NULL;
    memset(err, 0, sizeof *err);
    enum llmopt_status st = st_parse(copy, len, &f, err);
    if (st == LLMOPT_OK) st_close(f);
    free(copy);
    return st;
}

/* The reference file: tensors of each dtype, a scalar, an empty tensor and metadata.
 * The header lists them out of data order. Data: 44 bytes. */
struct ref_file {
    struct bytes b;
    float f32[6];  /* "w.f32" F32 [2, 3] at [0, 24] */
    float f16[4];  /* "w.f16" F16 [4] at [24, 32] (exact in f16) */
    float bf16[4]; /* "w.bf16" BF16 [2, 2] at [32, 40] (exact in bf16) */
    float scalar;  /* "scalar" F32 [] at [40, 44] */
};

static const char REF_HEADER[] =
    "{\"scalar\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [40, 44]},"
    " \"w.bf16\": {\"dtype\": \"BF16\", \"shape\": [2, 2], \"data_offsets\": [32, 40]},"
    " \"__metadata__\": {\"format\": \"pt\", \"note\": \"caf\\u00e9\"},"
    " \"empty\": {\"dtype\": \"F16\", \"shape\": [0, 5], \"data_offsets\": [44, 44]},"
    " \"w.f32\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 24]},"
    " \"w.f16\": {\"dtype\": \"F16\", \"shape\": [4], \"data_offsets\": [24, 32]}}";

static struct ref_file build_ref(void) {
    struct ref_file r = {
        .f32 = {0.5f, -1.25f, 3.0f, 1e-3f, -7.5f, 1e6f},
        .f16 = {1.0f, -2.0f, 0.5f, 65504.0f},
        .bf16 = {1.0f, -3.0f, 0.15625f, 1e30f},
        .scalar = 42.0f,
    };
    r.bf16[3] = bf16_to_f32(bf16_from_f32(1e30f));
    uint8_t data[44];
    memcpy(data, r.f32, 24);
    for (int i = 0; i < 4; i++) {
        uint16_t h = fp16_from_f32(r.f16[i]), g = bf16_from_f32(r.bf16[i]);
        memcpy(data + 24 + 2 * i, &h, 2);
        memcpy(data + 32 + 2 * i, &g, 2);
    }
    memcpy(data + 40, &r.scalar, 4);
    r.b = make_file(REF_HEADER, data, sizeof data);
    return r;
}

static float elem_f32(const struct st_tensor *t, int64_t i) {
    const uint8_t *b = t->data;
    uint16_t h;
    float v;
    switch (t->dtype) {
    case ST_DTYPE_F32:
        memcpy(&v, b + 4 * i, 4);
        return v;
    case ST_DTYPE_F16:
        memcpy(&h, b + 2 * i, 2);
        return fp16_to_f32(h);
    case ST_DTYPE_BF16:
        memcpy(&h, b + 2 * i, 2);
        return bf16_to_f32(h);
    default:
        return NAN;
    }
}

/* Checks f against the reference file whose bytes start at base (NULL: skip the
 * pointer checks). */
static void check_ref(const struct st_file *f, const struct ref_file *r, const uint8_t *base) {
    uint64_t data_start = 8 + strlen(REF_HEADER);
    CHECK_EQ_INT(st_n_tensors(f), 5);
    /* data order: by offset; the empty tensor sorts after the scalar */
    static const char *const order[] = {"w.f32", "w.f16", "w.bf16", "scalar", "empty"};
    for (uint64_t i = 0; i < 5; i++) {
        const struct st_tensor *t = st_tensor_at(f, i);
        CHECK_MSG(t && strcmp(t->name, order[i]) == 0, "tensor %" PRIu64 " is '%s'", i,
                  t ? t->name : "(null)");
        CHECK(t && st_find_tensor(f, t->name) == t);
        CHECK(t && st_tensor_index(f, st_find_tensor(f, t->name)) == i);
    }
    CHECK(st_tensor_at(f, 5) == NULL);

    const struct st_tensor *t = st_find_tensor(f, "w.f32");
    CHECK(t && t->dtype == ST_DTYPE_F32 && t->n_dims == 2 && t->shape[0] == 2 && t->shape[1] == 3 &&
          t->shape[2] == 1 && t->n_bytes == 24 && t->offset == data_start && t->shard == 0);
    if (t && base) CHECK((const uint8_t *)t->data == base + data_start);
    for (int i = 0; t && i < 6; i++) CHECK(elem_f32(t, i) == r->f32[i]);
    CHECK(t && st_tensor_numel(t) == 6);

    t = st_find_tensor(f, "w.f16");
    CHECK(t && t->dtype == ST_DTYPE_F16 && t->n_dims == 1 && t->shape[0] == 4 && t->n_bytes == 8 &&
          t->offset == data_start + 24);
    for (int i = 0; t && i < 4; i++) CHECK(elem_f32(t, i) == r->f16[i]);

    t = st_find_tensor(f, "w.bf16");
    CHECK(t && t->dtype == ST_DTYPE_BF16 && t->n_dims == 2 && t->shape[0] == 2 &&
          t->shape[1] == 2 && t->n_bytes == 8 && t->offset == data_start + 32);
    for (int i = 0; t && i < 4; i++) CHECK(elem_f32(t, i) == r->bf16[i]);

    t = st_find_tensor(f, "scalar");
    CHECK(t && t->dtype == ST_DTYPE_F32 && t->n_dims == 0 && st_tensor_numel(t) == 1 &&
          t->n_bytes == 4 && elem_f32(t, 0) == 42.0f);

    t = st_find_tensor(f, "empty");
    CHECK(t && t->dtype == ST_DTYPE_F16 && t->n_dims == 2 && t->shape[0] == 0 && t->shape[1] == 5 &&
          t->n_bytes == 0 && st_tensor_numel(t) == 0);

    CHECK(st_find_tensor(f, "w") == NULL);
    CHECK(st_find_tensor(f, "__metadata__") == NULL);
    CHECK(st_find_tensor(f, "") == NULL);

    CHECK_EQ_INT(st_n_metadata(f), 2);
    CHECK(st_metadata_get(f, "format") && strcmp(st_metadata_get(f, "format"), "pt") == 0);
    CHECK(st_metadata_get(f, "note") && strcmp(st_metadata_get(f, "note"), "caf\xc3\xa9") == 0);
    CHECK(st_metadata_get(f, "missing") == NULL);
    const char *key, *value;
    CHECK(st_metadata_at(f, 0, &key, &value) && strcmp(key, "format") == 0);
    CHECK(!st_metadata_at(f, 2, &key, &value));
}

/* ---- valid files ---- */

static void test_parse_valid(void) {
    struct ref_file r = build_ref();
    struct st_file *f = NULL;
    struct llmopt_err err = {0};
    CHECK_MSG(st_parse(r.b.p, r.b.len, &f, &err) == LLMOPT_OK, "%s", err.msg);
    if (f) {
        check_ref(f, &r, r.b.p);
        CHECK_EQ_INT(st_n_shards(f), 1);
        CHECK(strcmp(st_shard_name(f, 0), "<memory>") == 0);
        CHECK(st_shard_name(f, 1) == NULL);
        FILE *out = tmpfile();
        if (out) {
            st_print(f, out);
            long n = ftell(out);
            CHECK(n > 200);
            char text[4096] = {0};
            rewind(out);
            size_t got = fread(text, 1, sizeof text - 1, out);
            CHECK(got > 0 && strstr(text, "w.bf16") && strstr(text, "[2, 3]") &&
                  strstr(text, "BF16"));
            fclose(out);
        }
        st_close(f);
    }
    free(r.b.p);
    st_close(NULL);
}

static void test_dtype_names(void) {
    CHECK(strcmp(st_dtype_name(ST_DTYPE_F32), "F32") == 0);
    CHECK(strcmp(st_dtype_name(ST_DTYPE_F16), "F16") == 0);
    CHECK(strcmp(st_dtype_name(ST_DTYPE_BF16), "BF16") == 0);
    CHECK(strcmp(st_dtype_name(ST_DTYPE_COUNT), "?") == 0);
    CHECK_EQ_INT(st_dtype_size(ST_DTYPE_F32), 4);
    CHECK_EQ_INT(st_dtype_size(ST_DTYPE_F16), 2);
    CHECK_EQ_INT(st_dtype_size(ST_DTYPE_BF16), 2);
    CHECK_EQ_INT(st_dtype_size(ST_DTYPE_COUNT), 0);
}

#define ENTRY(name, dtype, shape, offsets)                                                         \
    "\"" name "\": {\"dtype\": " dtype ", \"shape\": " shape ", \"data_offsets\": " offsets "}"
#define ONE(name, dtype, shape, offsets) "{" ENTRY(name, dtype, shape, offsets) "}"
#define TWO(a, b)                        "{" a ", " b "}"
#define THREE(a, b, c)                   "{" a ", " b ", " c "}"

/* Accepted although a strict writer would not produce them. */
static void test_lenient_cases(void) {
    struct llmopt_err err;
    static const struct {
        const char *what, *header;
        size_t data_len;
    } ok[] = {
        {"no tensors", "{}", 0},
        {"only metadata", "{\"__metadata__\": {}}", 0},
        {"header padded with spaces", ONE("a", "\"F32\"", "[1]", "[0, 4]") "      ", 4},
        {"gap between tensors",
         TWO(ENTRY("a", "\"F32\"", "[1]", "[0, 4]"), ENTRY("b", "\"F16\"", "[1]", "[8, 10]")), 10},
        {"trailing bytes", ONE("a", "\"F32\"", "[1]", "[0, 4]"), 100},
        {"empty tensors inside others",
         THREE(ENTRY("a", "\"F32\"", "[2]", "[0, 8]"), ENTRY("z", "\"F32\"", "[3, 0]", "[4, 4]"),
               ENTRY("y", "\"BF16\"", "[0]", "[4, 4]")),
         8},
        {"extra fields ignored",
         "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4], "
         "\"comment\": [1, 2]}}",
         4},
        {"8 dimensions", ONE("a", "\"F32\"", "[1,1,1,1,1,1,1,2]", "[0, 8]"), 8},
        {"huge dims in an empty tensor",
         ONE("a", "\"F32\"", "[4294967296, 0, 1073741824]", "[0, 0]"), 0},
    };
    for (size_t i = 0; i < LLMOPT_ARRAY_LEN(ok); i++) {
        struct bytes b = make_file(ok[i].header, NULL, ok[i].data_len);
        enum llmopt_status st = parse_copy(b.p, b.len, &err);
        CHECK_MSG(st == LLMOPT_OK, "%s: %s", ok[i].what, err.msg);
        free(b.p);
    }
}

/* ---- malformed files ---- */

/* Expect status and both needles (when non-NULL) in the message. */
static void expect_bad_bytes(const char *what, const uint8_t *p, size_t len,
                             enum llmopt_status want, const char *needle1, const char *needle2) {
    struct llmopt_err err;
    enum llmopt_status st = parse_copy(p, len, &err);
    CHECK_MSG(st == want, "%s: status %d (%s), want %d; msg '%s'", what, st, llmopt_status_str(st),
              want, err.msg);
    CHECK_MSG(strncmp(err.msg, "safetensors: ", 13) == 0, "%s: msg '%s'", what, err.msg);
    CHECK_MSG(!needle1 || strstr(err.msg, needle1), "%s: '%s' not in '%s'", what, needle1, err.msg);
    CHECK_MSG(!needle2 || strstr(err.msg, needle2), "%s: '%s' not in '%s'", what, needle2, err.msg);
    if (getenv("LLMOPT_TEST_VERBOSE")) fprintf(stderr, "  %-30s %s\n", what, err.msg);
}

static void expect_bad(const char *what, const char *header, size_t data_len,
                       enum llmopt_status want, const char *needle1, const char *needle2) {
    struct bytes b = make_file(header, NULL, data_len);
    expect_bad_bytes(what, b.p, b.len, want, needle1, needle2);
    free(b.p);
}

static void test_malformed_header(void) {
    const enum llmopt_status F = LLMOPT_ERR_FORMAT;
    uint8_t raw[24] = {0};
    uint64_t n = 100;
    memcpy(raw, &n, 8);
    memcpy(raw + 8, "{}", 2);
    expect_bad_bytes("header length past the end", raw, sizeof raw, F, "header length",
                     "past the end");
    n = UINT64_MAX;
    memcpy(raw, &n, 8);
    expect_bad_bytes("header length 2^64-1", raw, sizeof raw, F, "header length", "past the end");
    expect_bad_bytes("7-byte file", raw, 7, F, "header length", "too small");
    expect_bad_bytes("empty file", raw, 0, F, "header length", "too small");
    n = 0;
    memcpy(raw, &n, 8);
    expect_bad_bytes("empty header", raw, 8, F, "invalid JSON", NULL);

    expect_bad("invalid JSON", "{\"a\": ", 0, F, "invalid JSON", "line 1");
    expect_bad("trailing garbage", "{} x", 0, F, "invalid JSON", NULL);
    expect_bad("not an object", "[1, 2]", 0, F, "header", "found an array");
    expect_bad("invalid UTF-8", "{\"\xff\": 1}", 0, F, "invalid JSON", NULL);
    expect_bad("NUL in a name", "{\"a\\u0000b\": 1}", 0, F, "invalid JSON", NULL);
    expect_bad("duplicate names",
               TWO(ENTRY("a", "\"F32\"", "[1]", "[0, 4]"), ENTRY("a", "\"F32\"", "[1]", "[4, 8]")),
               8, F, "invalid JSON", "duplicate");
    expect_bad("empty name", ONE("", "\"F32\"", "[1]", "[0, 4]"), 4, F, "tensor ''",
               "name is empty");
    expect_bad("entry not an object", "{\"a\": [1]}", 0, F, "tensor 'a' field 'entry'",
               "found an array");
    expect_bad("metadata not an object", "{\"__metadata__\": \"pt\"}", 0, F, "field '__metadata__'",
               "found \"pt\"");
    expect_bad("metadata value not a string", "{\"__metadata__\": {\"format\": 1}}", 0, F,
               "key 'format'", "expected a string value, found 1");
    expect_bad("hostile name is escaped", "{\"a'\\n\": 7}", 0, F, "tensor 'a\\'\\x0a'", NULL);
}

static void test_malformed_dtype(void) {
    const enum llmopt_status F = LLMOPT_ERR_FORMAT, U = LLMOPT_ERR_UNSUPPORTED;
    expect_bad("dtype missing", "{\"a\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", 4, F,
               "tensor 'a' field 'dtype'", "missing");
    expect_bad("dtype not a string", ONE("a", "32", "[1]", "[0, 4]"), 4, F, "field 'dtype'",
               "found 32");
    expect_bad("dtype unknown", ONE("a", "\"F31\"", "[1]", "[0, 4]"), 4, F, "field 'dtype'",
               "\"F31\" is not a safetensors dtype");
    expect_bad("dtype lower case", ONE("a", "\"f32\"", "[1]", "[0, 4]"), 4, F, "field 'dtype'",
               "not a safetensors dtype");
    expect_bad("dtype I64", ONE("pos", "\"I64\"", "[1]", "[0, 8]"), 8, U,
               "tensor 'pos' field 'dtype'", "I64 is not supported");
    expect_bad("dtype F8_E4M3", ONE("w", "\"F8_E4M3\"", "[4]", "[0, 4]"), 4, U,
               "tensor 'w' field 'dtype'", "F8_E4M3 is not supported");
    expect_bad("dtype BOOL", ONE("m", "\"BOOL\"", "[4]", "[0, 4]"), 4, U, "BOOL", NULL);
    /* one unreadable tensor fails the whole file */
    expect_bad("U8 beside F32",
               TWO(ENTRY("a", "\"F32\"", "[1]", "[0, 4]"), ENTRY("b", "\"U8\"", "[4]", "[4, 8]")),
               8, U, "tensor 'b'", "U8");
}

static void test_malformed_shape(void) {
    const enum llmopt_status F = LLMOPT_ERR_FORMAT;
    expect_bad("shape missing", "{\"a\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", 4, F,
               "tensor 'a' field 'shape'", "missing");
    expect_bad("shape not a list", ONE("a", "\"F32\"", "4", "[0, 16]"), 16, F, "field 'shape'",
               "found 4");
    expect_bad("shape negative", ONE("a", "\"F32\"", "[2, -1]", "[0, 8]"), 8, F, "field 'shape'",
               "dimension 1 is -1");
    expect_bad("shape real", ONE("a", "\"F32\"", "[1.5]", "[0, 4]"), 4, F, "field 'shape'",
               "a real number");
    expect_bad("shape string", ONE("a", "\"F32\"", "[\"2\"]", "[0, 8]"), 8, F, "field 'shape'",
               "\"2\"");
    expect_bad("shape null", ONE("a", "\"F32\"", "[null]", "[0, 8]"), 8, F, "field 'shape'",
               "null");
    expect_bad("9 dimensions", ONE("a", "\"F32\"", "[1,1,1,1,1,1,1,1,1]", "[0, 4]"), 4,
               LLMOPT_ERR_LIMIT, "field 'shape'", "9 dimensions exceeds the cap of 8");
    expect_bad("element count overflow", ONE("a", "\"F16\"", "[4294967296, 4294967296]", "[0, 0]"),
               0, F, "field 'shape'", "element count overflows");
    expect_bad("overflow hidden by a zero",
               ONE("a", "\"F16\"", "[4294967296, 0, 4294967296]", "[0, 0]"), 0, F, "field 'shape'",
               "element count overflows");
    expect_bad("byte count overflow", ONE("a", "\"F32\"", "[4611686018427387904]", "[0, 0]"), 0, F,
               "field 'shape'", "byte size overflows");
    expect_bad("integer too big for JSON", ONE("a", "\"F32\"", "[99999999999999999999]", "[0, 0]"),
               0, F, "invalid JSON", NULL);
}

static void test_malformed_offsets(void) {
    const enum llmopt_status F = LLMOPT_ERR_FORMAT;
    expect_bad("data_offsets missing", "{\"a\": {\"dtype\": \"F32\", \"shape\": [1]}}", 4, F,
               "tensor 'a' field 'data_offsets'", "missing");
    expect_bad("data_offsets not a list", ONE("a", "\"F32\"", "[1]", "{}"), 4, F,
               "field 'data_offsets'", "found an object");
    expect_bad("data_offsets one element", ONE("a", "\"F32\"", "[1]", "[4]"), 4, F,
               "field 'data_offsets'", "found a list of 1");
    expect_bad("data_offsets three elements", ONE("a", "\"F32\"", "[1]", "[0, 4, 8]"), 8, F,
               "field 'data_offsets'", "found a list of 3");
    expect_bad("data_offsets real", ONE("a", "\"F32\"", "[1]", "[0, 4.0]"), 4, F,
               "field 'data_offsets'", "end is a real number");
    expect_bad("data_offsets negative", ONE("a", "\"F32\"", "[1]", "[-4, 0]"), 4, F,
               "field 'data_offsets'", "begin is -4");
    expect_bad("end before begin", ONE("a", "\"F32\"", "[1]", "[8, 4]"), 8, F,
               "field 'data_offsets'", "end 4 is before begin 8");
    expect_bad("size mismatch", ONE("a", "\"BF16\"", "[2, 3]", "[0, 8]"), 8, F,
               "tensor 'a' field 'data_offsets'", "holds 8 bytes, but BF16 [2, 3] needs 12");
    expect_bad("past the data buffer", ONE("a", "\"F32\"", "[2]", "[4, 12]"), 8, F,
               "field 'data_offsets'", "runs past the end of the data buffer");
    expect_bad("huge offsets",
               ONE("a", "\"F32\"", "[1]", "[9223372036854775800, 9223372036854775804]"), 8, F,
               "field 'data_offsets'", "past the end");
    expect_bad("overlap",
               TWO(ENTRY("a", "\"F32\"", "[2]", "[0, 8]"), ENTRY("b", "\"F32\"", "[2]", "[4, 12]")),
               12, F, "tensor 'b' field 'data_offsets'", "overlaps tensor 'a' at [0, 8]");
    expect_bad("same range twice",
               TWO(ENTRY("a", "\"F16\"", "[2]", "[0, 4]"), ENTRY("b", "\"BF16\"", "[2]", "[0, 4]")),
               4, F, "overlaps", NULL);
    expect_bad("overlap past an empty tensor",
               THREE(ENTRY("a", "\"F32\"", "[4]", "[0, 16]"),
                     ENTRY("e", "\"F32\"", "[0]", "[8, 8]"),
                     ENTRY("b", "\"F32\"", "[1]", "[12, 16]")),
               16, F, "tensor 'b'", "overlaps tensor 'a'");
}

/* More tensors than ST_MAX_TENSORS: rejected before any entry is checked. */
static void test_too_many_tensors(void) {
    size_t n = (size_t)ST_MAX_TENSORS + 1;
    size_t cap = n * 16 + 16;
    char *h = malloc(cap);
    size_t o = 0;
    h[o++] = '{';
    for (size_t i = 0; i < n; i++)
        o += (size_t)snprintf(h + o, cap - o, "%s\"%zx\":null", i ? "," : "", i);
    h[o++] = '}';
    h[o] = '\0';
    expect_bad("too many tensors", h, 0, LLMOPT_ERR_LIMIT, "1048577 tensors",
               "exceeds the cap of 1048576");

    o = (size_t)snprintf(h, cap, "{\"__metadata__\": {");
    for (size_t i = 0; i <= ST_MAX_METADATA; i++)
        o += (size_t)snprintf(h + o, cap - o, "%s\"%zx\":\"\"", i ? "," : "", i);
    snprintf(h + o, cap - o, "}}");
    expect_bad("too many metadata keys", h, 0, LLMOPT_ERR_LIMIT, "field '__metadata__'",
               "more than 65536 keys");
    free(h);
}

/* A header longer than the cap needs a file that holds it: map untouched zero pages. */
static void test_header_cap(void) {
    size_t size = (size_t)ST_MAX_HEADER_BYTES + 64;
    uint8_t *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    if (p == MAP_FAILED) return;
    uint64_t n = (uint64_t)ST_MAX_HEADER_BYTES + 1;
    memcpy(p, &n, 8);
    struct st_file *f = NULL;
    struct llmopt_err err = {0};
    CHECK_EQ_INT(st_parse(p, size, &f, &err), LLMOPT_ERR_LIMIT);
    CHECK_MSG(strstr(err.msg, "header length") && strstr(err.msg, "cap"), "%s", err.msg);
    CHECK_EQ_INT(st_parse(NULL, 5, &f, &err), LLMOPT_ERR_INVALID_ARG);
    munmap(p, size);
}

/* ---- truncation and mutation ---- */

static void test_truncated_everywhere(void) {
    struct ref_file r = build_ref(); /* the last tensor ends at the last byte */
    struct llmopt_err err;
    int failures = 0;
    for (size_t len = 0; len < r.b.len; len++) {
        enum llmopt_status st = parse_copy(r.b.p, len, &err);
        if ((st != LLMOPT_ERR_FORMAT || strncmp(err.msg, "safetensors: ", 13) != 0) &&
            failures++ < 5)
            CHECK_MSG(0, "truncated to %zu of %zu bytes: status %d, msg '%s'", len, r.b.len, st,
                      err.msg);
    }
    CHECK_EQ_INT(failures, 0);
    CHECK_EQ_INT(parse_copy(r.b.p, r.b.len, &err), LLMOPT_OK);
    CHECK(parse_copy(r.b.p, r.b.len - 1, &err) == LLMOPT_ERR_FORMAT &&
          strstr(err.msg, "'scalar'") && strstr(err.msg, "past the end of the data buffer"));
    CHECK(parse_copy(r.b.p, 20, &err) == LLMOPT_ERR_FORMAT && strstr(err.msg, "header length"));
    free(r.b.p);
}

static size_t rng_below(size_t n) {
    return n ? (size_t)(rng_next() % n) : 0;
}

/* One mutation of the reference file in place (buffer has room for +16 bytes);
 * returns the new length. */
static size_t mutate(uint8_t *p, size_t len, size_t header_len) {
    static const char json_bytes[] = "{}[],:\"0123456789-.eE \\u";
    static const char *const tokens[] = {
        "-1",         "0",
        "4294967296", "9223372036854775807",
        "1e3",        "null",
        "[]",         "{}",
        "\"I64\"",    "\"\"",
        "[0,0]",      "18446744073709551616",
        "true",       "[1,2,3,4,5,6,7,8,9]",
    };
    uint64_t n;
    switch (rng_below(6)) {
    case 0: /* flip bits in 1..4 random bytes */
        for (size_t k = 1 + rng_below(4); k > 0; k--)
            p[rng_below(len)] ^= (uint8_t)(1u << rng_below(8));
        return len;
    case 1: /* overwrite the header length */
        switch (rng_below(4)) {
        case 0:
            n = rng_next();
            break;
        case 1:
            n = header_len + rng_below(17) - 8;
            break;
        case 2:
            n = len - 8 - rng_below(3);
            break;
        default:
            n = rng_below(header_len + 1);
            break;
        }
        memcpy(p, &n, 8);
        return len;
    case 2: /* a JSON byte in the header */
        p[8 + rng_below(header_len)] = (uint8_t)json_bytes[rng_below(sizeof json_bytes - 1)];
        return len;
    case 3: { /* delete a header byte, header length adjusted */
        size_t at = 8 + rng_below(header_len);
        memmove(p + at, p + at + 1, len - at - 1);
        n = header_len - 1;
        memcpy(p, &n, 8);
        return len - 1;
    }
    case 4: { /* replace a run of digits with a token, header length adjusted */
        size_t at = 8 + rng_below(header_len), end = at;
        while (end < 8 + header_len && p[end] >= '0' && p[end] <= '9') end++;
        const char *tok = tokens[rng_below(LLMOPT_ARRAY_LEN(tokens))];
        size_t tl = strlen(tok);
        if (tl > (end - at) + 16) return len;
        memmove(p + at + tl, p + end, len - end);
        memcpy(p + at, tok, tl);
        n = header_len + tl - (end - at);
        memcpy(p, &n, 8);
        return len + tl - (end - at);
    }
    default: /* duplicate a header byte, header length adjusted */
    {
        size_t at = 8 + rng_below(header_len);
        memmove(p + at + 1, p + at, len - at);
        n = header_len + 1;
        memcpy(p, &n, 8);
        return len + 1;
    }
    }
}

static void test_mutations(void) {
    struct ref_file r = build_ref();
    size_t header_len = strlen(REF_HEADER);
    rng_state = 0x5afe7e2503ull; /* fixed: failures reproduce */
    int parsed = 0, rejected = 0;
    uint8_t *buf = malloc(r.b.len + 64);
    for (int iter = 0; iter < 1000; iter++) {
        memcpy(buf, r.b.p, r.b.len);
        size_t len = r.b.len;
        size_t hl = header_len;
        for (size_t k = 1 + rng_below(3); k > 0; k--) {
            uint64_t cur;
            memcpy(&cur, buf, 8);
            /* edits that shift bytes need the header length to still describe them */
            if (cur != hl || hl < 2 || len + 16 > r.b.len + 64) hl = 0;
            if (hl) {
                len = mutate(buf, len, hl);
                memcpy(&cur, buf, 8);
                hl = cur <= len - 8 ? (size_t)cur : 0;
            } else {
                buf[rng_below(len)] ^= 0xff;
            }
        }
        /* the fuzz entry asserts the reader's invariants on whatever parses */
        uint8_t *copy = malloc(len);
        memcpy(copy, buf, len);
        st_fuzz_one(copy, len);
        free(copy);
        struct llmopt_err err;
        enum llmopt_status st = parse_copy(buf, len, &err);
        if (st == LLMOPT_OK) {
            parsed++;
        } else {
            rejected++;
            CHECK_MSG(strncmp(err.msg, "safetensors: ", 13) == 0, "iteration %d: '%s'", iter,
                      err.msg);
        }
    }
    fprintf(stderr, "  mutations: %d parsed, %d rejected\n", parsed, rejected);
    CHECK(rejected > 500);
    CHECK(parsed > 0);
    free(buf);
    free(r.b.p);
}

/* ---- files on disk ---- */

struct tmp_dir {
    char path[64];
    char files[16][64];
    int n_files;
};

static void tmp_dir_make(struct tmp_dir *d) {
    memset(d, 0, sizeof *d);
    snprintf(d->path, sizeof d->path, "/tmp/llmopt_st_XXXXXX");
    CHECK(mkdtemp(d->path) != NULL);
}

static void tmp_dir_write(struct tmp_dir *d, const char *name, const void *data, size_t len) {
    char path[160];
    snprintf(path, sizeof path, "%s/%s", d->path, name);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    CHECK(fwrite(data, 1, len, f) == len);
    fclose(f);
    for (int i = 0; i < d->n_files; i++)
        if (strcmp(d->files[i], name) == 0) return;
    if (d->n_files < 16) snprintf(d->files[d->n_files++], sizeof d->files[0], "%s", name);
}

static void tmp_dir_write_str(struct tmp_dir *d, const char *name, const char *text) {
    tmp_dir_write(d, name, text, strlen(text));
}

static void tmp_dir_remove(struct tmp_dir *d) {
    char path[160];
    for (int i = 0; i < d->n_files; i++) {
        snprintf(path, sizeof path, "%s/%s", d->path, d->files[i]);
        unlink(path);
    }
    rmdir(d->path);
}

static void test_open_file(void) {
    struct ref_file r = build_ref();
    struct tmp_dir d;
    tmp_dir_make(&d);
    tmp_dir_write(&d, "ref.safetensors", r.b.p, r.b.len);
    char path[160];
    snprintf(path, sizeof path, "%s/ref.safetensors", d.path);
    struct st_file *f = NULL;
    struct llmopt_err err = {0};
    CHECK_MSG(st_open_file(path, &f, &err) == LLMOPT_OK, "%s", err.msg);
    if (f) {
        check_ref(f, &r, NULL);
        CHECK(strcmp(st_shard_name(f, 0), path) == 0);
        st_close(f);
    }

    /* a directory holding only model.safetensors */
    tmp_dir_write(&d, "model.safetensors", r.b.p, r.b.len);
    f = NULL;
    CHECK_MSG(st_open_dir(d.path, &f, &err) == LLMOPT_OK, "%s", err.msg);
    if (f) {
        check_ref(f, &r, NULL);
        CHECK(strcmp(st_shard_name(f, 0), "model.safetensors") == 0);
        st_close(f);
    }

    /* errors carry the path */
    r.b.p[8] = '[';
    tmp_dir_write(&d, "bad.safetensors", r.b.p, r.b.len);
    snprintf(path, sizeof path, "%s/bad.safetensors", d.path);
    CHECK_EQ_INT(st_open_file(path, &f, &err), LLMOPT_ERR_FORMAT);
    CHECK_MSG(strncmp(err.msg, path, strlen(path)) == 0 && strstr(err.msg, "invalid JSON"), "%s",
              err.msg);
    tmp_dir_write(&d, "empty.safetensors", "", 0);
    snprintf(path, sizeof path, "%s/empty.safetensors", d.path);
    CHECK_EQ_INT(st_open_file(path, &f, &err), LLMOPT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "empty.safetensors") && strstr(err.msg, "too small"), "%s", err.msg);
    snprintf(path, sizeof path, "%s/missing.safetensors", d.path);
    CHECK_EQ_INT(st_open_file(path, &f, &err), LLMOPT_ERR_IO);
    CHECK(strstr(err.msg, "missing.safetensors") != NULL);
    CHECK_EQ_INT(st_open_file(d.path, &f, &err), LLMOPT_ERR_IO); /* a directory */

    tmp_dir_remove(&d);
    free(r.b.p);
}

/* Two shards and an index; tensor "c" in shard 2, "a" and "b" in shard 1. */
#define SHARD1 "model-00001-of-00002.safetensors"
#define SHARD2 "model-00002-of-00002.safetensors"
static const char SHARD1_HEADER[] =
    "{\"__metadata__\": {\"format\": \"pt\"},"
    " \"b\": {\"dtype\": \"F16\", \"shape\": [3], \"data_offsets\": [16, 22]},"
    " \"a\": {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [0, 16]}}";
static const char SHARD2_HEADER[] =
    "{\"__metadata__\": {\"format\": \"other\", \"extra\": \"x\"},"
    " \"c\": {\"dtype\": \"BF16\", \"shape\": [1, 2], \"data_offsets\": [0, 4]}}";
static const char INDEX[] = "{\"metadata\": {\"total_size\": 26}, \"weight_map\": {"
                            "\"a\": \"" SHARD1 "\", \"c\": \"" SHARD2 "\", \"b\": \"" SHARD1 "\"}}";

static void write_shards(struct tmp_dir *d) {
    uint8_t data1[22], data2[4];
    float a[4] = {1.0f, 2.0f, -3.0f, 0.25f};
    memcpy(data1, a, 16);
    for (int i = 0; i < 3; i++) {
        uint16_t h = fp16_from_f32((float)(i + 1) * 0.5f);
        memcpy(data1 + 16 + 2 * i, &h, 2);
    }
    for (int i = 0; i < 2; i++) {
        uint16_t h = bf16_from_f32(i ? -8.0f : 0.75f);
        memcpy(data2 + 2 * i, &h, 2);
    }
    struct bytes b1 = make_file(SHARD1_HEADER, data1, sizeof data1);
    struct bytes b2 = make_file(SHARD2_HEADER, data2, sizeof data2);
    tmp_dir_write(d, SHARD1, b1.p, b1.len);
    tmp_dir_write(d, SHARD2, b2.p, b2.len);
    free(b1.p);
    free(b2.p);
}

static void test_open_dir_sharded(void) {
    struct tmp_dir d;
    tmp_dir_make(&d);
    write_shards(&d);
    tmp_dir_write_str(&d, "model.safetensors.index.json", INDEX);
    struct st_file *f = NULL;
    struct llmopt_err err = {0};
    CHECK_MSG(st_open_dir(d.path, &f, &err) == LLMOPT_OK, "%s", err.msg);
    if (!f) {
        tmp_dir_remove(&d);
        return;
    }
    CHECK_EQ_INT(st_n_shards(f), 2);
    CHECK(strcmp(st_shard_name(f, 0), SHARD1) == 0 && strcmp(st_shard_name(f, 1), SHARD2) == 0);
    CHECK_EQ_INT(st_n_tensors(f), 3);
    static const char *const order[] = {"a", "b", "c"};
    for (uint64_t i = 0; i < 3; i++) CHECK(strcmp(st_tensor_at(f, i)->name, order[i]) == 0);
    const struct st_tensor *a = st_find_tensor(f, "a"), *b = st_find_tensor(f, "b"),
                           *c = st_find_tensor(f, "c");
    CHECK(a && a->shard == 0 && a->dtype == ST_DTYPE_F32 && a->n_dims == 2 && a->shape[0] == 2 &&
          a->shape[1] == 2 && a->n_bytes == 16 && a->offset == 8 + strlen(SHARD1_HEADER));
    CHECK(a && elem_f32(a, 0) == 1.0f && elem_f32(a, 2) == -3.0f && elem_f32(a, 3) == 0.25f);
    CHECK(b && b->shard == 0 && b->dtype == ST_DTYPE_F16 && b->shape[0] == 3 &&
          elem_f32(b, 0) == 0.5f && elem_f32(b, 2) == 1.5f);
    CHECK(c && c->shard == 1 && c->dtype == ST_DTYPE_BF16 && c->n_dims == 2 && c->shape[1] == 2 &&
          elem_f32(c, 0) == 0.75f && elem_f32(c, 1) == -8.0f);
    /* metadata: the union, the first shard's value wins */
    CHECK(strcmp(st_metadata_get(f, "format"), "pt") == 0);
    CHECK(st_metadata_get(f, "extra") && strcmp(st_metadata_get(f, "extra"), "x") == 0);
    CHECK(st_metadata_get(f, "total_size") == NULL);
    st_close(f);

    /* a trailing slash on the directory is fine */
    char with_slash[80];
    snprintf(with_slash, sizeof with_slash, "%s/", d.path);
    f = NULL;
    CHECK_MSG(st_open_dir(with_slash, &f, &err) == LLMOPT_OK, "%s", err.msg);
    st_close(f);
    tmp_dir_remove(&d);
}

/* The index (or shard set) given replaces the good one; expect status and needles. */
static void expect_bad_dir(const char *what, const char *index, enum llmopt_status want,
                           const char *needle1, const char *needle2) {
    struct tmp_dir d;
    tmp_dir_make(&d);
    write_shards(&d);
    if (index) tmp_dir_write_str(&d, "model.safetensors.index.json", index);
    struct st_file *f = NULL;
    struct llmopt_err err = {0};
    enum llmopt_status st = st_open_dir(d.path, &f, &err);
    CHECK_MSG(st == want, "%s: status %d (%s), want %d; msg '%s'", what, st, llmopt_status_str(st),
              want, err.msg);
    CHECK_MSG(strstr(err.msg, d.path) != NULL, "%s: path not in '%s'", what, err.msg);
    CHECK_MSG(!needle1 || strstr(err.msg, needle1), "%s: '%s' not in '%s'", what, needle1, err.msg);
    CHECK_MSG(!needle2 || strstr(err.msg, needle2), "%s: '%s' not in '%s'", what, needle2, err.msg);
    if (getenv("LLMOPT_TEST_VERBOSE")) fprintf(stderr, "  %-30s %s\n", what, err.msg);
    if (st == LLMOPT_OK) st_close(f);
    tmp_dir_remove(&d);
}

static void test_open_dir_errors(void) {
    const enum llmopt_status F = LLMOPT_ERR_FORMAT;
    expect_bad_dir("no weights in the directory", NULL, LLMOPT_ERR_IO,
                   "no model.safetensors.index.json", NULL);
    expect_bad_dir("index not JSON", "{\"weight_map\": ", F, "index.json", "invalid JSON");
    expect_bad_dir("index not an object", "[]", F, "index.json", "found an array");
    expect_bad_dir("weight_map missing", "{\"metadata\": {}}", F, "field 'weight_map'",
                   "found nothing");
    expect_bad_dir("weight_map not an object", "{\"weight_map\": [\"a\"]}", F, "field 'weight_map'",
                   "found an array");
    expect_bad_dir("metadata not an object", "{\"metadata\": 3, \"weight_map\": {}}", F,
                   "field 'metadata'", NULL);
    expect_bad_dir("shard name not a string", "{\"weight_map\": {\"a\": 1}}", F, "tensor 'a'",
                   "found 1");
    expect_bad_dir("shard name with a slash", "{\"weight_map\": {\"a\": \"sub/" SHARD1 "\"}}", F,
                   "plain file name", "sub/");
    expect_bad_dir("shard name with ..", "{\"weight_map\": {\"a\": \"..\"}}", F, "plain file name",
                   NULL);
    expect_bad_dir("empty shard name", "{\"weight_map\": {\"a\": \"\"}}", F, "plain file name",
                   NULL);
    expect_bad_dir("empty tensor name", "{\"weight_map\": {\"\": \"" SHARD1 "\"}}", F,
                   "tensor name is empty", NULL);
    expect_bad_dir("duplicate in the weight map",
                   "{\"weight_map\": {\"a\": \"" SHARD1 "\", \"a\": \"" SHARD2 "\"}}", F,
                   "invalid JSON", "duplicate");
    expect_bad_dir("missing shard file",
                   "{\"weight_map\": {\"a\": \"" SHARD1 "\", \"b\": \"" SHARD1
                   "\", \"c\": \"" SHARD2 "\", \"d\": \"model-00003.safetensors\"}}",
                   LLMOPT_ERR_IO, "model-00003.safetensors", "open failed");
    expect_bad_dir("tensor not in its shard",
                   "{\"weight_map\": {\"a\": \"" SHARD1 "\", \"b\": \"" SHARD1
                   "\", \"c\": \"" SHARD2 "\", \"d\": \"" SHARD2 "\"}}",
                   F, "tensor 'd' is listed in '" SHARD2 "', which does not hold it", NULL);
    expect_bad_dir("tensor not listed",
                   "{\"weight_map\": {\"a\": \"" SHARD1 "\", \"c\": \"" SHARD2 "\"}}", F,
                   "tensor 'b' of shard '" SHARD1 "' is not listed", NULL);
    expect_bad_dir("tensor listed in the wrong shard",
                   "{\"weight_map\": {\"a\": \"" SHARD1 "\", \"b\": \"" SHARD1
                   "\", \"c\": \"" SHARD1 "\", \"x\": \"" SHARD2 "\"}}",
                   F, "tensor 'c' is listed in '" SHARD1 "' but found in '" SHARD2 "'", NULL);

    /* a tensor in two shards */
    struct tmp_dir d;
    tmp_dir_make(&d);
    write_shards(&d);
    struct bytes b = make_file(ONE("a", "\"F32\"", "[1]", "[0, 4]"), NULL, 4);
    tmp_dir_write(&d, "extra.safetensors", b.p, b.len);
    free(b.p);
    tmp_dir_write_str(&d, "model.safetensors.index.json",
                      "{\"weight_map\": {\"a\": \"" SHARD1 "\", \"b\": \"" SHARD1
                      "\", \"c\": \"" SHARD2 "\", \"z\": \"extra.safetensors\"}}");
    struct st_file *f = NULL;
    struct llmopt_err err = {0};
    CHECK_EQ_INT(st_open_dir(d.path, &f, &err), F);
    CHECK_MSG(strstr(err.msg, "tensor 'a' is in two shards") &&
                  strstr(err.msg, "extra.safetensors") && strstr(err.msg, SHARD1),
              "%s", err.msg);

    /* a malformed shard: the message names the shard file */
    b = make_file(ONE("c", "\"BF16\"", "[1, 2]", "[0, 6]"), NULL, 6);
    tmp_dir_write(&d, SHARD2, b.p, b.len);
    free(b.p);
    tmp_dir_write_str(&d, "model.safetensors.index.json", INDEX);
    CHECK_EQ_INT(st_open_dir(d.path, &f, &err), F);
    CHECK_MSG(strstr(err.msg, SHARD2 ": safetensors: tensor 'c' field 'data_offsets'"), "%s",
              err.msg);
    tmp_dir_remove(&d);

    /* an index past its cap: a sparse file */
    tmp_dir_make(&d);
    tmp_dir_write_str(&d, "model.safetensors.index.json", "{}");
    char index_path[160];
    snprintf(index_path, sizeof index_path, "%s/model.safetensors.index.json", d.path);
    CHECK(truncate(index_path, (off_t)ST_MAX_INDEX_BYTES + 1) == 0);
    CHECK_EQ_INT(st_open_dir(d.path, &f, &err), LLMOPT_ERR_LIMIT);
    CHECK_MSG(strstr(err.msg, "index.json") && strstr(err.msg, "cap"), "%s", err.msg);
    tmp_dir_remove(&d);

    /* not a directory */
    CHECK_EQ_INT(st_open_dir("/nonexistent/llmopt", &f, &err), LLMOPT_ERR_IO);
    CHECK_EQ_INT(st_open_dir("/dev/null", &f, &err), LLMOPT_ERR_IO);
    CHECK(strstr(err.msg, "not a directory") != NULL);
}

TEST_MAIN(test_parse_valid, test_dtype_names, test_lenient_cases, test_malformed_header,
          test_malformed_dtype, test_malformed_shape, test_malformed_offsets, test_too_many_tensors,
          test_header_cap, test_truncated_everywhere, test_mutations, test_open_file,
          test_open_dir_sharded, test_open_dir_errors)
