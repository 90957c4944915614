/* GGUF writer (round trips through the reader), K-quant layouts and the quantizers'
 * error bounds, the synth/quantize type plans. Runs from the repository root. */
#include "rng.h"
#include "test.h"

#include "base/fp16.h"
#include "format/gguf.h"
#include "format/gguf_write.h"
#include "format/quant.h"
#include "format/quant_k.h"
#include "runtime/synth.h"

#include <inttypes.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define VOCAB_SPM "../shared/tokenizers/ggml-vocab-llama-spm.gguf"

/* roughly normal(0, 1): sum of 4 uniforms, scaled */
static float rng_normal(void) {
    return (rng_float() + rng_float() + rng_float() + rng_float()) * 0.8660254f;
}

static void temp_path(char *buf, size_t cap, const char *tag) {
    const char *dir = getenv("TMPDIR");
    snprintf(buf, cap, "%s/llmopt_test_gguf_write_%ld_%s.gguf", dir && *dir ? dir : "/tmp",
             (long)getpid(), tag);
}

static bool file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static struct gguf_file *open_or_fail(const char *path) {
    struct gguf_file *f = NULL;
    struct llmopt_err err = {0};
    enum llmopt_status st = gguf_open(path, &f, &err);
    CHECK_MSG(st == LLMOPT_OK, "%s: %s", path, err.msg);
    return st == LLMOPT_OK ? f : NULL;
}

#define OK(call)                                                                                   \
    do {                                                                                           \
        struct llmopt_err ok_err_ = {0};                                                           \
        enum llmopt_status ok_st_ = (call);                                                        \
        (void)ok_err_;                                                                             \
        CHECK_MSG(ok_st_ == LLMOPT_OK, "%s", #call);                                               \
    } while (0)

/* ---- metadata round trip: every scalar type, strings, arrays ---- */

static void test_kv_round_trip(void) {
    char path[512];
    temp_path(path, sizeof path, "kv");
    struct llmopt_err err = {0};
    struct gguf_w *w = NULL;
    CHECK(gguf_w_create(&w, &err) == LLMOPT_OK);
    if (!w) return;

    uint8_t u8 = 200;
    int8_t i8 = -100;
    uint16_t u16 = 60000;
    int16_t i16 = -30000;
    int32_t i32 = -2000000000;
    int64_t i64 = -((int64_t)1 << 60);
    double f64 = 3.141592653589793;
    CHECK(gguf_w_set_scalar(w, "t.u8", GGUF_TYPE_UINT8, &u8, &err) == LLMOPT_OK);
    CHECK(gguf_w_set_scalar(w, "t.i8", GGUF_TYPE_INT8, &i8, &err) == LLMOPT_OK);
    CHECK(gguf_w_set_scalar(w, "t.u16", GGUF_TYPE_UINT16, &u16, &err) == LLMOPT_OK);
    CHECK(gguf_w_set_scalar(w, "t.i16", GGUF_TYPE_INT16, &i16, &err) == LLMOPT_OK);
    CHECK(gguf_w_set_u32(w, "t.u32", 4000000000u, &err) == LLMOPT_OK);
    CHECK(gguf_w_set_i32(w, "t.i32", i32, &err) == LLMOPT_OK);
    CHECK(gguf_w_set_f32(w, "t.f32", 1e-6f, &err) == LLMOPT_OK);
    CHECK(gguf_w_set_bool(w, "t.bool", true, &err) == LLMOPT_OK);
    CHECK(gguf_w_set_u64(w, "t.u64", UINT64_MAX - 5, &err) == LLMOPT_OK);
    CHECK(gguf_w_set_scalar(w, "t.i64", GGUF_TYPE_INT64, &i64, &err) == LLMOPT_OK);
    CHECK(gguf_w_set_scalar(w, "t.f64", GGUF_TYPE_FLOAT64, &f64, &err) == LLMOPT_OK);
    CHECK(gguf_w_set_str(w, "t.str", "h\xc3\xa9llo \xe4\xb8\x96", &err) == LLMOPT_OK);
    CHECK(gguf_w_set_str(w, "t.empty", "", &err) == LLMOPT_OK);
    CHECK(gguf_w_set_strn(w, "t.nul", "a\0b", 3, &err) == LLMOPT_OK);
    /* replaced values keep their place; removed keys disappear */
    CHECK(gguf_w_set_u32(w, "t.replaced", 1, &err) == LLMOPT_OK);
    CHECK(gguf_w_set_str(w, "t.gone", "x", &err) == LLMOPT_OK);
    CHECK(gguf_w_set_u32(w, "t.replaced", 2, &err) == LLMOPT_OK);
    CHECK(gguf_w_remove_kv(w, "t.gone"));
    CHECK(!gguf_w_remove_kv(w, "t.gone"));
    CHECK(gguf_w_has_kv(w, "t.replaced"));

    const int32_t ai32[] = {1, -2, 3, INT32_MIN, INT32_MAX};
    const float af32[] = {0.5f, -1.25f, 1e30f};
    const uint8_t abool[] = {1, 0, 7};
    const uint64_t au64[] = {0, UINT64_MAX};
    const int8_t ai8[] = {-128, 127};
    const double af64[] = {-0.1, 1e300};
    CHECK(gguf_w_set_array(w, "a.i32", GGUF_TYPE_INT32, ai32, 5, &err) == LLMOPT_OK);
    CHECK(gguf_w_set_array(w, "a.f32", GGUF_TYPE_FLOAT32, af32, 3, &err) == LLMOPT_OK);
    CHECK(gguf_w_set_array(w, "a.bool", GGUF_TYPE_BOOL, abool, 3, &err) == LLMOPT_OK);
    CHECK(gguf_w_set_array(w, "a.u64", GGUF_TYPE_UINT64, au64, 2, &err) == LLMOPT_OK);
    CHECK(gguf_w_set_array(w, "a.i8", GGUF_TYPE_INT8, ai8, 2, &err) == LLMOPT_OK);
    CHECK(gguf_w_set_array(w, "a.f64", GGUF_TYPE_FLOAT64, af64, 2, &err) == LLMOPT_OK);
    CHECK(gguf_w_set_array(w, "a.empty", GGUF_TYPE_UINT32, NULL, 0, &err) == LLMOPT_OK);
    const char *strs[] = {"alpha", "", "\316\263amma" /* U+03B3 in UTF-8, then "amma" */, "d"};
    CHECK(gguf_w_set_str_array(w, "a.str", strs, NULL, 4, &err) == LLMOPT_OK);
    const uint64_t lens[] = {2, 0, 1};
    CHECK(gguf_w_set_str_array(w, "a.strn", strs, lens, 3, &err) == LLMOPT_OK);
    /* not scalar types */
    CHECK(gguf_w_set_scalar(w, "bad", GGUF_TYPE_STRING, "x", &err) == LLMOPT_ERR_INVALID_ARG);
    CHECK(gguf_w_set_array(w, "bad", GGUF_TYPE_ARRAY, ai32, 1, &err) == LLMOPT_ERR_INVALID_ARG);
    CHECK(gguf_w_set_u32(w, "", 1, &err) == LLMOPT_ERR_INVALID_ARG);

    uint64_t n_kv = gguf_w_n_kv(w);
    CHECK(gguf_w_begin(w, path, &err) == LLMOPT_OK);
    CHECK(gguf_w_set_u32(w, "late", 1, &err) == LLMOPT_ERR_INVALID_ARG);
    CHECK_MSG(gguf_w_finish(w, &err) == LLMOPT_OK, "%s", err.msg);
    uint64_t expect_bytes = gguf_w_file_bytes(w);
    gguf_w_free(w);

    struct gguf_file *f = open_or_fail(path);
    if (!f) return;
    CHECK_EQ_INT(f->size, expect_bytes);
    CHECK_EQ_INT(f->n_kv, n_kv);
    CHECK_EQ_INT(f->n_tensors, 0);
    CHECK_EQ_INT(f->version, 3);
    uint64_t u;
    int64_t i;
    double d;
    bool b;
    struct gguf_str s;
    CHECK(gguf_get_u64(f, "t.u8", &u) && u == 200 &&
          gguf_find_kv(f, "t.u8")->type == GGUF_TYPE_UINT8);
    CHECK(gguf_get_i64(f, "t.i8", &i) && i == -100 &&
          gguf_find_kv(f, "t.i8")->type == GGUF_TYPE_INT8);
    CHECK(gguf_get_u64(f, "t.u16", &u) && u == 60000 &&
          gguf_find_kv(f, "t.u16")->type == GGUF_TYPE_UINT16);
    CHECK(gguf_get_i64(f, "t.i16", &i) && i == -30000 &&
          gguf_find_kv(f, "t.i16")->type == GGUF_TYPE_INT16);
    CHECK(gguf_get_u64(f, "t.u32", &u) && u == 4000000000u &&
          gguf_find_kv(f, "t.u32")->type == GGUF_TYPE_UINT32);
    CHECK(gguf_get_i64(f, "t.i32", &i) && i == i32 &&
          gguf_find_kv(f, "t.i32")->type == GGUF_TYPE_INT32);
    CHECK(gguf_get_f64(f, "t.f32", &d) && (float)d == 1e-6f &&
          gguf_find_kv(f, "t.f32")->type == GGUF_TYPE_FLOAT32);
    CHECK(gguf_get_bool(f, "t.bool", &b) && b);
    CHECK(gguf_get_u64(f, "t.u64", &u) && u == UINT64_MAX - 5);
    CHECK(gguf_get_i64(f, "t.i64", &i) && i == i64 &&
          gguf_find_kv(f, "t.i64")->type == GGUF_TYPE_INT64);
    CHECK(gguf_get_f64(f, "t.f64", &d) && d == f64 &&
          gguf_find_kv(f, "t.f64")->type == GGUF_TYPE_FLOAT64);
    CHECK(gguf_get_str(f, "t.str", &s) && gguf_str_eq(s, "h\xc3\xa9llo \xe4\xb8\x96"));
    CHECK(gguf_get_str(f, "t.empty", &s) && s.len == 0);
    CHECK(gguf_get_str(f, "t.nul", &s) && s.len == 3 && !memcmp(s.ptr, "a\0b", 3));
    CHECK(gguf_get_u64(f, "t.replaced", &u) && u == 2);
    CHECK(!gguf_find_kv(f, "t.gone"));
    CHECK(!gguf_find_kv(f, "late") && !gguf_find_kv(f, "general.alignment"));
    /* order: t.replaced keeps the place of its first set, after t.nul */
    CHECK(gguf_str_eq(f->kv[14].key, "t.replaced"));

    const struct gguf_kv *kv = gguf_find_kv(f, "a.i32");
    CHECK(kv && kv->type == GGUF_TYPE_ARRAY && kv->array_type == GGUF_TYPE_INT32 &&
          kv->array_len == 5);
    for (uint64_t k = 0; kv && k < 5; k++) CHECK(gguf_array_get_i64(kv, k, &i) && i == ai32[k]);
    kv = gguf_find_kv(f, "a.f32");
    for (uint64_t k = 0; kv && k < 3; k++)
        CHECK(gguf_array_get_f64(kv, k, &d) && (float)d == af32[k]);
    kv = gguf_find_kv(f, "a.bool");
    CHECK(kv && kv->array_type == GGUF_TYPE_BOOL && kv->array_len == 3);
    if (kv) CHECK(kv->data[0] == 1 && kv->data[1] == 0 && kv->data[2] == 1);
    kv = gguf_find_kv(f, "a.u64");
    CHECK(kv && kv->array_type == GGUF_TYPE_UINT64 && kv->array_len == 2);
    if (kv) {
        uint64_t v1;
        memcpy(&v1, kv->data + 8, 8);
        CHECK(v1 == UINT64_MAX);
    }
    kv = gguf_find_kv(f, "a.i8");
    for (uint64_t k = 0; kv && k < 2; k++) CHECK(gguf_array_get_i64(kv, k, &i) && i == ai8[k]);
    kv = gguf_find_kv(f, "a.f64");
    for (uint64_t k = 0; kv && k < 2; k++) CHECK(gguf_array_get_f64(kv, k, &d) && d == af64[k]);
    kv = gguf_find_kv(f, "a.empty");
    CHECK(kv && kv->type == GGUF_TYPE_ARRAY && kv->array_len == 0 &&
          kv->array_type == GGUF_TYPE_UINT32);
    kv = gguf_find_kv(f, "a.str");
    CHECK(kv && kv->array_type == GGUF_TYPE_STRING && kv->array_len == 4);
    if (kv) {
        struct gguf_str_iter it;
        gguf_str_iter_init(&it, kv);
        for (int k = 0; k < 4; k++) CHECK(gguf_str_iter_next(&it, &s) && gguf_str_eq(s, strs[k]));
        CHECK(!gguf_str_iter_next(&it, &s));
    }
    kv = gguf_find_kv(f, "a.strn");
    CHECK(kv && kv->array_len == 3);
    if (kv) {
        CHECK(gguf_str_array_get(kv, 0, &s) && gguf_str_eq(s, "al"));
        CHECK(gguf_str_array_get(kv, 1, &s) && s.len == 0);
        CHECK(gguf_str_array_get(kv, 2, &s) && gguf_str_eq(s, "d") == false && s.len == 1 &&
              s.ptr[0] == '\xce');
    }
    gguf_close(f);
    unlink(path);
}

/* ---- tensors: every type, odd write splits, a custom alignment ---- */

static void test_tensor_round_trip(void) {
    rng_seed_fresh("tensor_round_trip");
    static const enum ggml_type types[] = {GGML_TYPE_F32,   GGML_TYPE_F16,  GGML_TYPE_BF16,
                                           GGML_TYPE_Q8_0,  GGML_TYPE_Q4_0, GGML_TYPE_Q4_K,
                                           GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
    enum { N_TYPES = sizeof types / sizeof types[0] };
    for (int alignment_case = 0; alignment_case < 2; alignment_case++) {
        uint32_t alignment = alignment_case ? 64 : GGUF_W_DEFAULT_ALIGNMENT;
        char path[512];
        temp_path(path, sizeof path, alignment_case ? "t64" : "t32");
        struct llmopt_err err = {0};
        struct gguf_w *w = NULL;
        CHECK(gguf_w_create(&w, &err) == LLMOPT_OK);
        if (!w) return;
        if (alignment_case) CHECK(gguf_w_set_alignment(w, alignment, &err) == LLMOPT_OK);
        CHECK(gguf_w_set_alignment(w, 48, &err) == LLMOPT_ERR_INVALID_ARG);
        CHECK(gguf_w_set_str(w, "general.architecture", "test", &err) == LLMOPT_OK);
        uint8_t *data[N_TYPES + 1];
        uint64_t bytes[N_TYPES + 1];
        uint32_t n_tensors = 0;
        for (int k = 0; k < N_TYPES; k++) {
            uint32_t be, bb;
            CHECK(gguf_w_type_block(types[k], &be, &bb));
            uint64_t ne[3] = {2 * (uint64_t)be, 3, 1 + (uint64_t)k % 2};
            char name[64];
            snprintf(name, sizeof name, "t.%s", gguf_w_type_name(types[k]));
            uint32_t index = 99;
            CHECK_MSG(gguf_w_add_tensor(w, name, types[k], 2 + (uint32_t)(k % 2), ne, &index,
                                        &err) == LLMOPT_OK,
                      "%s", err.msg);
            CHECK_EQ_INT(index, n_tensors);
            bytes[n_tensors] = gguf_w_tensor_bytes(w, index);
            CHECK_EQ_INT(bytes[n_tensors], 2 * 3 * (1 + k % 2) * (uint64_t)bb);
            data[n_tensors] = malloc(bytes[n_tensors]);
            for (uint64_t b = 0; b < bytes[n_tensors]; b++)
                data[n_tensors][b] = (uint8_t)rng_next();
            n_tensors++;
        }
        /* a 1-D f32 tensor whose size is not a multiple of the alignment */
        uint64_t ne1[1] = {5};
        CHECK(gguf_w_add_tensor(w, "norm", GGML_TYPE_F32, 1, ne1, NULL, &err) == LLMOPT_OK);
        bytes[n_tensors] = 20;
        data[n_tensors] = malloc(20);
        for (int b = 0; b < 20; b++) data[n_tensors][b] = (uint8_t)rng_next();
        n_tensors++;
        CHECK_EQ_INT(gguf_w_n_tensors(w), n_tensors);

        CHECK(gguf_w_begin(w, path, &err) == LLMOPT_OK);
        CHECK(file_exists(path) == false); /* bytes go to the .partial file until finish */
        /* all the data as one stream, cut into pieces of random sizes */
        uint64_t total = 0;
        for (uint32_t t = 0; t < n_tensors; t++) total += bytes[t];
        uint8_t *stream = malloc(total);
        uint64_t pos = 0;
        for (uint32_t t = 0; t < n_tensors; t++) {
            memcpy(stream + pos, data[t], bytes[t]);
            pos += bytes[t];
        }
        for (pos = 0; pos < total;) {
            uint64_t k = 1 + rng_next() % 97;
            if (k > total - pos) k = total - pos;
            CHECK(gguf_w_write(w, stream + pos, (size_t)k, &err) == LLMOPT_OK);
            pos += k;
        }
        CHECK_EQ_INT(gguf_w_current_tensor(w), n_tensors);
        CHECK(gguf_w_write(w, stream, 1, &err) ==
              LLMOPT_ERR_INVALID_ARG); /* past the last tensor */
        CHECK_MSG(gguf_w_finish(w, &err) == LLMOPT_OK, "%s", err.msg);
        uint64_t expect_bytes = gguf_w_file_bytes(w);
        gguf_w_free(w);
        free(stream);

        /* the reader reads every type but the K-quants: check those by hand */
        struct gguf_file *f = NULL;
        enum llmopt_status st = gguf_open(path, &f, &err);
        if (st == LLMOPT_OK) {
            CHECK_EQ_INT(f->size, expect_bytes);
            CHECK_EQ_INT(f->alignment, alignment);
            CHECK_EQ_INT(f->data_offset % alignment, 0);
            uint64_t a;
            CHECK(gguf_get_u64(f, "general.alignment", &a) == (alignment_case == 1));
            CHECK_EQ_INT(f->n_tensors, n_tensors);
            for (uint32_t t = 0; t < f->n_tensors && t < n_tensors; t++) {
                CHECK_EQ_INT(f->tensors[t].n_bytes, bytes[t]);
                CHECK_EQ_INT(f->tensors[t].offset % alignment, 0);
                CHECK(!memcmp(f->tensors[t].data, data[t], bytes[t]));
            }
            gguf_close(f);
        } else {
            /* a reader without the K-quants: it must say so, nothing else */
            CHECK_MSG(st == LLMOPT_ERR_UNSUPPORTED, "%s", err.msg);
            FILE *fp = fopen(path, "rb");
            CHECK(fp != NULL);
            if (fp) {
                fseek(fp, 0, SEEK_END);
                CHECK_EQ_INT((uint64_t)ftell(fp), expect_bytes);
                /* the last tensor (norm) ends the file, padded */
                uint8_t tail[20];
                uint64_t norm_at = expect_bytes - ((20 + alignment - 1) / alignment * alignment);
                fseek(fp, (long)norm_at, SEEK_SET);
                CHECK(fread(tail, 1, 20, fp) == 20 && !memcmp(tail, data[n_tensors - 1], 20));
                fclose(fp);
            }
        }
        for (uint32_t t = 0; t < n_tensors; t++) free(data[t]);
        unlink(path);
    }
}

/* ---- copying kvs from another file, byte for byte ---- */

static void test_copy_kv(void) {
    struct gguf_file *src = open_or_fail(VOCAB_SPM);
    if (!src) return;
    char path[512];
    temp_path(path, sizeof path, "copy");
    struct llmopt_err err = {0};
    struct gguf_w *w = NULL;
    CHECK(gguf_w_create(&w, &err) == LLMOPT_OK);
    for (uint64_t i = 0; w && i < src->n_kv; i++)
        CHECK_MSG(gguf_w_copy_kv(w, &src->kv[i], &err) == LLMOPT_OK, "%s", err.msg);
    uint64_t ne[2] = {32, 2};
    CHECK(gguf_w_add_tensor(w, "x", GGML_TYPE_Q8_0, 2, ne, NULL, &err) == LLMOPT_OK);
    CHECK(gguf_w_begin(w, path, &err) == LLMOPT_OK);
    uint8_t blocks[2 * 34] = {0};
    CHECK(gguf_w_write(w, blocks, sizeof blocks, &err) == LLMOPT_OK);
    CHECK(gguf_w_finish(w, &err) == LLMOPT_OK);
    gguf_w_free(w);
    struct gguf_file *f = open_or_fail(path);
    if (f) {
        CHECK_EQ_INT(f->n_kv, src->n_kv);
        for (uint64_t i = 0; i < f->n_kv && i < src->n_kv; i++) {
            const struct gguf_kv *a = &src->kv[i], *b = &f->kv[i];
            CHECK(a->key.len == b->key.len && !memcmp(a->key.ptr, b->key.ptr, a->key.len));
            CHECK(a->type == b->type && a->array_type == b->array_type &&
                  a->array_len == b->array_len);
            if (a->type == GGUF_TYPE_STRING) {
                struct gguf_str sa, sb;
                CHECK(gguf_kv_get_str(a, &sa) && gguf_kv_get_str(b, &sb) && sa.len == sb.len &&
                      !memcmp(sa.ptr, sb.ptr, sa.len));
            } else if (a->type != GGUF_TYPE_ARRAY) {
                CHECK(!memcmp(a->data, b->data, gguf_type_size(a->type)));
            } else if (a->array_type == GGUF_TYPE_STRING) {
                struct gguf_str_iter ia, ib;
                struct gguf_str sa, sb;
                gguf_str_iter_init(&ia, a);
                gguf_str_iter_init(&ib, b);
                int mismatches = 0;
                while (gguf_str_iter_next(&ia, &sa)) {
                    if (!gguf_str_iter_next(&ib, &sb) || sa.len != sb.len ||
                        memcmp(sa.ptr, sb.ptr, sa.len))
                        mismatches++;
                }
                CHECK_EQ_INT(mismatches, 0);
            } else {
                CHECK(!memcmp(a->data, b->data,
                              (size_t)(a->array_len * gguf_type_size(a->array_type))));
            }
        }
        struct gguf_str s1, s2;
        const struct gguf_kv *t1 = gguf_find_kv(src, "tokenizer.ggml.tokens");
        const struct gguf_kv *t2 = gguf_find_kv(f, "tokenizer.ggml.tokens");
        CHECK(t1 && t2 && t1->array_len == t2->array_len);
        if (t1 && t2) {
            CHECK(gguf_str_array_get(t1, t1->array_len - 1, &s1) &&
                  gguf_str_array_get(t2, t2->array_len - 1, &s2) && s1.len == s2.len &&
                  !memcmp(s1.ptr, s2.ptr, s1.len));
        }
        gguf_close(f);
    }
    gguf_close(src);
    unlink(path);
}

/* ---- misuse is reported, and a failed write leaves no file ---- */

static void test_writer_errors(void) {
    char path[512], partial[600];
    temp_path(path, sizeof path, "err");
    snprintf(partial, sizeof partial, "%s.partial", path);
    struct llmopt_err err = {0};
    struct gguf_w *w = NULL;
    CHECK(gguf_w_create(&w, &err) == LLMOPT_OK);
    if (!w) return;
    uint64_t ne[2] = {48, 2};
    CHECK(gguf_w_add_tensor(w, "q", GGML_TYPE_Q8_0, 2, ne, NULL, &err) == LLMOPT_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "block") != NULL);
    CHECK(gguf_w_add_tensor(w, "k", GGML_TYPE_Q4_K, 2, ne, NULL, &err) == LLMOPT_ERR_INVALID_ARG);
    CHECK(gguf_w_add_tensor(w, "t", (enum ggml_type)3, 2, ne, NULL, &err) ==
          LLMOPT_ERR_UNSUPPORTED);
    CHECK(gguf_w_add_tensor(w, "t", GGML_TYPE_F32, 5, ne, NULL, &err) == LLMOPT_ERR_INVALID_ARG);
    char long_name[80];
    memset(long_name, 'a', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = 0;
    CHECK(gguf_w_add_tensor(w, long_name, GGML_TYPE_F32, 2, ne, NULL, &err) ==
          LLMOPT_ERR_INVALID_ARG);
    uint64_t zero[2] = {0, 1};
    CHECK(gguf_w_add_tensor(w, "z", GGML_TYPE_F32, 2, zero, NULL, &err) == LLMOPT_ERR_INVALID_ARG);
    CHECK(gguf_w_add_tensor(w, "a", GGML_TYPE_F32, 2, ne, NULL, &err) == LLMOPT_OK);
    CHECK(gguf_w_add_tensor(w, "a", GGML_TYPE_F32, 2, ne, NULL, &err) == LLMOPT_ERR_INVALID_ARG);
    CHECK(gguf_w_set_alignment(w, 64, &err) == LLMOPT_ERR_INVALID_ARG); /* after a tensor */
    CHECK(gguf_w_write(w, ne, 8, &err) == LLMOPT_ERR_INVALID_ARG);      /* before begin */
    CHECK(gguf_w_begin(w, path, &err) == LLMOPT_OK);
    CHECK(file_exists(partial));
    float row[48] = {0};
    CHECK(gguf_w_write(w, row, sizeof row, &err) == LLMOPT_OK); /* one of two rows */
    CHECK(gguf_w_finish(w, &err) == LLMOPT_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "'a'") != NULL);
    gguf_w_free(w);
    CHECK(!file_exists(partial) && !file_exists(path));

    w = NULL;
    CHECK(gguf_w_create(&w, &err) == LLMOPT_OK);
    CHECK(gguf_w_begin(w, "/nonexistent-dir/x.gguf", &err) == LLMOPT_ERR_IO);
    gguf_w_free(w);
}

/* ---- quantizers: round-trip error bounds on fresh random rows ---- */

struct err_stats {
    double rel_rms; /* rms(error) / rms(x) */
    double max_rel; /* max |error| / max |x| of its super-block (256) */
};

static struct err_stats round_trip_error(enum ggml_type type, const float *x, int64_t n) {
    size_t bytes = gguf_w_row_bytes(type, n);
    uint8_t *q = malloc(bytes);
    float *y = malloc((size_t)n * sizeof *y);
    struct err_stats e = {0};
    CHECK(gguf_w_encode_row(type, x, q, n));
    CHECK(gguf_w_decode_row(type, q, y, n));
    double se = 0, sx = 0;
    for (int64_t b = 0; b < n; b += 256) {
        float amax = 0;
        for (int64_t i = b; i < b + 256; i++) amax = fmaxf(amax, fabsf(x[i]));
        for (int64_t i = b; i < b + 256; i++) {
            double d = (double)y[i] - x[i];
            se += d * d;
            sx += (double)x[i] * x[i];
            if (amax > 0) e.max_rel = fmax(e.max_rel, fabs(d) / amax);
        }
    }
    e.rel_rms = sqrt(se / sx);
    free(q);
    free(y);
    return e;
}

static void test_quant_error_bounds(void) {
    rng_seed_fresh("quant_error_bounds");
    enum { N = 256 * 64 };
    float *x = malloc(N * sizeof *x);
    /* rows like trained weights: normal, a few outliers, blocks of different scales */
    for (int i = 0; i < N; i++) {
        float scale = 0.02f * (1.0f + (float)((i / 256) % 7));
        x[i] = rng_normal() * scale;
        if (rng_next() % 500 == 0) x[i] *= 8.0f;
    }
    /* Bounds sit above the worst of 1,500 seeds (2026-12-01: iq4_xs 0.098 / 0.146,
     * q4_K 0.083 / 0.125, q4_0 0.122 / 0.125). iq4_xs's max bound has more room: its fit
     * minimises squared error, so one element can land mid-way in the table's widest
     * gap (24 steps of 127) at a scale the refit has widened. */
    static const struct {
        enum ggml_type type;
        double rel_rms, max_rel;
    } bounds[] = {
        {GGML_TYPE_F16, 1e-3, 1e-3},   {GGML_TYPE_BF16, 5e-3, 5e-3},  {GGML_TYPE_Q8_0, 0.012, 0.01},
        {GGML_TYPE_Q4_0, 0.16, 0.15},  {GGML_TYPE_Q6_K, 0.03, 0.04}, {GGML_TYPE_Q5_K, 0.06, 0.08},
        {GGML_TYPE_Q4_K, 0.12, 0.15},  {GGML_TYPE_Q5_0, 0.08, 0.08}, {GGML_TYPE_IQ4_XS, 0.12, 0.18},
    };
    for (size_t k = 0; k < sizeof bounds / sizeof bounds[0]; k++) {
        struct err_stats e = round_trip_error(bounds[k].type, x, N);
        fprintf(stderr, "  %-5s rms error %.4f of rms, max error %.4f of block max\n",
                gguf_w_type_name(bounds[k].type), e.rel_rms, e.max_rel);
        CHECK_MSG(e.rel_rms < bounds[k].rel_rms && e.max_rel < bounds[k].max_rel, "%s: %.4f / %.4f",
                  gguf_w_type_name(bounds[k].type), e.rel_rms, e.max_rel);
    }
    /* more bits, less error */
    CHECK(round_trip_error(GGML_TYPE_Q6_K, x, N).rel_rms <
          round_trip_error(GGML_TYPE_Q5_K, x, N).rel_rms);
    CHECK(round_trip_error(GGML_TYPE_Q5_K, x, N).rel_rms <
          round_trip_error(GGML_TYPE_Q4_K, x, N).rel_rms);
    CHECK(round_trip_error(GGML_TYPE_Q4_K, x, N).rel_rms <
          round_trip_error(GGML_TYPE_Q4_0, x, N).rel_rms);

    /* all-positive, all-negative, constant, zero and non-finite blocks stay finite */
    for (int i = 0; i < 256; i++) x[i] = 1.0f + 0.01f * (float)i;
    for (int i = 256; i < 512; i++) x[i] = -1.0f - 0.01f * (float)(i - 256);
    for (int i = 512; i < 768; i++) x[i] = 0.25f;
    for (int i = 768; i < 1024; i++) x[i] = 0.0f;
    for (int i = 1024; i < 1280; i++) x[i] = (i % 3) ? NAN : (i % 2 ? INFINITY : 1.0f);
    static const enum ggml_type ks[] = {GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_XS};
    for (int k = 0; k < 4; k++) {
        uint8_t q[5 * 210];
        float y[1280];
        CHECK(gguf_w_encode_row(ks[k], x, q, 1280));
        CHECK(gguf_w_decode_row(ks[k], q, y, 1280));
        bool finite = true;
        double worst = 0;
        for (int i = 0; i < 1024; i++) {
            finite &= isfinite(y[i]);
            worst = fmax(worst, fabs((double)y[i] - x[i]) / (fabs(x[i]) > 1 ? fabs(x[i]) : 1.0));
        }
        for (int i = 1024; i < 1280; i++) finite &= isfinite(y[i]);
        CHECK_MSG(finite, "%s", gguf_w_type_name(ks[k]));
        /* iq4_xs: the table's end levels are 23 / 24 of 127 apart, so a block whose
         * values crowd near its max (the ramps) sees up to ~ 0.12 */
        CHECK_MSG(worst < (k == 2 ? 0.03 : k == 3 ? 0.12 : 0.1), "%s: %.4f", gguf_w_type_name(ks[k]), worst);
        for (int i = 768; i < 1024; i++) CHECK(y[i] == 0.0f);
    }
    free(x);
}

/* ---- K-quant layouts: blocks built bit by bit from the documented layout ---- */

static void test_k_layouts(void) {
    /* Q4_K: d = 1, dmin = 0.5; sub-block j: scale 3 + 8j (>= 16 from j = 2 on, so the
     * packed high bits matter), min 60 - 7j; quant of element e = (e * 7) % 16. */
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; j++) {
        sc[j] = (uint8_t)(3 + 8 * j);
        mn[j] = (uint8_t)(60 - 7 * j);
    }
    block_q4_K b4;
    memset(&b4, 0, sizeof b4);
    b4.d = fp16_from_f32(1.0f);
    b4.dmin = fp16_from_f32(0.5f);
    for (int j = 0; j < 8; j++) {
        /* 12 bytes: j < 4 low 6 bits in bytes j / j + 4; j >= 4 low nibbles in byte j + 4
         * and high 2 bits on top of bytes j - 4 / j */
        if (j < 4) {
            b4.scales[j] |= sc[j];
            b4.scales[j + 4] |= mn[j];
        } else {
            b4.scales[j + 4] = (uint8_t)((sc[j] & 15) | ((mn[j] & 15) << 4));
            b4.scales[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
            b4.scales[j] |= (uint8_t)((mn[j] >> 4) << 6);
        }
    }
    for (int e = 0; e < 256; e++) {
        int q = (e * 7) % 16, c = e / 64, l = e % 32;
        b4.qs[32 * c + l] |= (uint8_t)(e % 64 < 32 ? q : q << 4);
    }
    float y[256];
    quant_k_dequantize_row(GGML_TYPE_Q4_K, &b4, y, 256);
    int bad = 0;
    for (int e = 0; e < 256; e++) {
        float want = 1.0f * sc[e / 32] * (float)((e * 7) % 16) - 0.5f * mn[e / 32];
        bad += y[e] != want;
    }
    CHECK_EQ_INT(bad, 0);
    for (int j = 0; j < 8; j++) {
        uint8_t s, m;
        quant_k_get_scale_min(b4.scales, j, &s, &m);
        CHECK(s == sc[j] && m == mn[j]);
    }

    /* Q5_K: same scales; quant (e * 11) % 32, its fifth bit in qh[e % 32] bit e / 32 */
    block_q5_K b5;
    memset(&b5, 0, sizeof b5);
    b5.d = b4.d;
    b5.dmin = b4.dmin;
    memcpy(b5.scales, b4.scales, sizeof b5.scales);
    for (int e = 0; e < 256; e++) {
        int q = (e * 11) % 32, c = e / 64, l = e % 32;
        b5.qs[32 * c + l] |= (uint8_t)(e % 64 < 32 ? (q & 15) : (q & 15) << 4);
        b5.qh[l] |= (uint8_t)((q >> 4) << (e / 32));
    }
    quant_k_dequantize_row(GGML_TYPE_Q5_K, &b5, y, 256);
    bad = 0;
    for (int e = 0; e < 256; e++)
        bad += y[e] != 1.0f * sc[e / 32] * (float)((e * 11) % 32) - 0.5f * mn[e / 32];
    CHECK_EQ_INT(bad, 0);

    /* Q6_K: d = 0.25, scales[s] = s * 9 - 70 (signed); quant (e * 13) % 64 - 32 */
    block_q6_K b6;
    memset(&b6, 0, sizeof b6);
    b6.d = fp16_from_f32(0.25f);
    for (int s = 0; s < 16; s++) b6.scales[s] = (int8_t)(s * 9 - 70);
    for (int e = 0; e < 256; e++) {
        int q = (e * 13) % 64, h = e / 128, g = (e % 128) / 32, l = e % 32;
        b6.ql[64 * h + l + (g % 2) * 32] |= (uint8_t)(g < 2 ? (q & 15) : (q & 15) << 4);
        b6.qh[32 * h + l] |= (uint8_t)((q >> 4) << (2 * g));
    }
    quant_k_dequantize_row(GGML_TYPE_Q6_K, &b6, y, 256);
    bad = 0;
    for (int e = 0; e < 256; e++)
        bad += y[e] != 0.25f * (float)(e / 16 * 9 - 70) * (float)((e * 13) % 64 - 32);
    CHECK_EQ_INT(bad, 0);

    /* the quantizers write what the dequantizers read: a row on a block's grid comes
     * back up to the rounding of the f16 super-block scale */
    float x[256];
    /* 6-bit grid of step 1/16, every sub-block reaching -32 steps */
    for (int e = 0; e < 256; e++) x[e] = e % 16 == 3 ? -2.0f : (float)((e * 5) % 31 - 15) * 0.0625f;
    block_q6_K q6;
    quant_k_quantize_row_q6_K(x, &q6, 256);
    quant_k_dequantize_row(GGML_TYPE_Q6_K, &q6, y, 256);
    bad = 0;
    for (int e = 0; e < 256; e++) bad += fabsf(y[e] - x[e]) > 2e-3f;
    CHECK_EQ_INT(bad, 0);
    for (int e = 0; e < 256; e++) x[e] = (float)((e * 7) % 16) * 0.5f; /* 4-bit grid from 0 */
    block_q4_K q4;
    quant_k_quantize_row_q4_K(x, &q4, 256);
    quant_k_dequantize_row(GGML_TYPE_Q4_K, &q4, y, 256);
    bad = 0;
    for (int e = 0; e < 256; e++) bad += fabsf(y[e] - x[e]) > 8e-3f;
    CHECK_EQ_INT(bad, 0);
}

/* ---- type names and the plans of synth/quantize ---- */

static void test_type_plans(void) {
    enum ggml_type t;
    CHECK(gguf_w_type_from_name("Q4_K", &t) && t == GGML_TYPE_Q4_K);
    CHECK(gguf_w_type_from_name("q8_0", &t) && t == GGML_TYPE_Q8_0);
    CHECK(gguf_w_type_from_name("BF16", &t) && t == GGML_TYPE_BF16);
    CHECK(!gguf_w_type_from_name("q4_1", &t));
    CHECK_EQ_INT(gguf_w_row_bytes(GGML_TYPE_Q6_K, 512), 420);
    CHECK_EQ_INT(gguf_w_row_bytes(GGML_TYPE_Q5_K, 100), 0);
    CHECK_EQ_INT(gguf_w_row_bytes(GGML_TYPE_Q4_0, 64), 36);

    struct synth_qplan p;
    CHECK(!synth_qplan_parse("q3_k", &p));
    CHECK(synth_qplan_parse("Q4_K_M", &p) && p.base == GGML_TYPE_Q4_K &&
          p.more_bits == GGML_TYPE_Q6_K && p.file_type == 15);
    uint64_t ne[2] = {1024, 3072}, odd[2] = {576, 1536}, vec[1] = {1024};
    /* 28 layers: the first and last eighth (0..2, 25..27) and every third in between */
    CHECK(synth_tensor_type(&p, "blk.0.attn_v.weight", 2, ne, GGML_TYPE_F32, 28, false) ==
          GGML_TYPE_Q6_K);
    CHECK(synth_tensor_type(&p, "blk.4.attn_v.weight", 2, ne, GGML_TYPE_F32, 28, false) ==
          GGML_TYPE_Q4_K);
    CHECK(synth_tensor_type(&p, "blk.5.ffn_down.weight", 2, ne, GGML_TYPE_F32, 28, false) ==
          GGML_TYPE_Q6_K);
    CHECK(synth_tensor_type(&p, "blk.27.ffn_down.weight", 2, ne, GGML_TYPE_F32, 28, false) ==
          GGML_TYPE_Q6_K);
    CHECK(synth_tensor_type(&p, "blk.5.ffn_up.weight", 2, ne, GGML_TYPE_F32, 28, false) ==
          GGML_TYPE_Q4_K);
    CHECK(synth_tensor_type(&p, "token_embd.weight", 2, ne, GGML_TYPE_F32, 28, false) ==
          GGML_TYPE_Q6_K);
    CHECK(synth_tensor_type(&p, "token_embd.weight", 2, ne, GGML_TYPE_F32, 28, true) ==
          GGML_TYPE_Q4_K);
    CHECK(synth_tensor_type(&p, "output.weight", 2, ne, GGML_TYPE_F32, 28, true) ==
          GGML_TYPE_Q6_K);
    CHECK(synth_tensor_type(&p, "blk.1.attn_norm.weight", 1, vec, GGML_TYPE_F32, 28, true) ==
          GGML_TYPE_F32);
    CHECK(synth_tensor_type(&p, "blk.1.attn_norm.weight", 1, vec, GGML_TYPE_F16, 28, true) ==
          GGML_TYPE_F16);
    /* rows not a multiple of 256 fall back to q5_0 (q6_K: q8_0), and to f16 when not a
     * multiple of 32 either */
    CHECK(synth_tensor_type(&p, "blk.1.ffn_up.weight", 2, odd, GGML_TYPE_F32, 28, true) ==
          GGML_TYPE_Q5_0);
    CHECK(synth_tensor_type(&p, "output.weight", 2, odd, GGML_TYPE_F32, 28, true) == GGML_TYPE_Q8_0);
    const uint64_t odd16[2] = {16 * 11, 8};
    CHECK(synth_tensor_type(&p, "blk.1.ffn_up.weight", 2, odd16, GGML_TYPE_F32, 28, true) ==
          GGML_TYPE_F16);
    CHECK(synth_qplan_parse("q8_0", &p) && p.file_type == 7);
    CHECK(synth_tensor_type(&p, "blk.1.ffn_up.weight", 2, odd, GGML_TYPE_F32, 28, true) ==
          GGML_TYPE_Q8_0);
    CHECK(synth_tensor_type(&p, "output.weight", 2, ne, GGML_TYPE_F32, 28, true) == GGML_TYPE_Q8_0);
}

TEST_MAIN(test_kv_round_trip, test_tensor_round_trip, test_copy_kv, test_writer_errors,
          test_quant_error_bounds, test_k_layouts, test_type_plans)
