/* GGUF reader, fp16/bf16 conversions and Q8_0/Q4_0 reference (de)quantizers.
 * Runs from the repository root: shared models are at ../shared/models. */
#include "rng.h"
#include "test.h"

#include "base/fp16.h"
#include "format/gguf.h"
#include "format/quant.h"

#include <float.h>
#include <inttypes.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#define MODELS "../shared/models/"
#define STORIES_F32 MODELS "stories260K/stories260K-F32.gguf"
#define STORIES_Q8_0 MODELS "stories260K/stories260K-Q8_0.gguf"
#define STORIES_Q4_0 MODELS "stories260K/stories260K-Q4_0.gguf"
#define LLAMA_TINY MODELS "llama-2-tiny-random/llama-2-tiny-random.gguf"

/* ---- helpers on open files ---- */

static struct gguf_file *open_or_fail(const char *path) {
    struct gguf_file *f = NULL;
    struct llmopt_err err = {0};
    enum llmopt_status st = gguf_open(path, &f, &err);
    CHECK_MSG(st == LLMOPT_OK, "%s: %s", path, err.msg);
    return st == LLMOPT_OK ? f : NULL;
}

static uint64_t u64_or(const struct gguf_file *f, const char *key, uint64_t fallback) {
    uint64_t v;
    return gguf_get_u64(f, key, &v) ? v : fallback;
}

static int count_type(const struct gguf_file *f, enum ggml_type type) {
    int n = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++)
        n += f->tensors[i].type == type;
    return n;
}

static bool str_is(struct gguf_str s, const char *c) { return gguf_str_eq(s, c); }

/* Facts shared by the three stories260K conversions (PROVENANCE.md). */
static void check_stories_common(const struct gguf_file *f) {
    CHECK_EQ_INT(f->version, 3);
    CHECK_EQ_INT(f->n_kv, 23);
    CHECK_EQ_INT(f->n_tensors, 48);
    CHECK_EQ_INT(f->alignment, 32);
    CHECK_EQ_INT(f->data_offset % 32, 0);
    CHECK(f->mapped);
    CHECK_EQ_INT(u64_or(f, "llama.embedding_length", 0), 64);
    CHECK_EQ_INT(u64_or(f, "llama.feed_forward_length", 0), 172);
    CHECK_EQ_INT(u64_or(f, "llama.block_count", 0), 5);
    CHECK_EQ_INT(u64_or(f, "llama.attention.head_count", 0), 8);
    CHECK_EQ_INT(u64_or(f, "llama.attention.head_count_kv", 0), 4);
    CHECK_EQ_INT(u64_or(f, "llama.context_length", 0), 512);
    CHECK_EQ_INT(u64_or(f, "tokenizer.ggml.bos_token_id", 99), 1);
    CHECK_EQ_INT(u64_or(f, "tokenizer.ggml.eos_token_id", 99), 2);
    CHECK_EQ_INT(u64_or(f, "tokenizer.ggml.unknown_token_id", 99), 0);
    double eps = 0, theta = 0;
    CHECK(gguf_get_f64(f, "llama.attention.layer_norm_rms_epsilon", &eps));
    CHECK(fabs(eps - 1e-5) < 1e-10);
    CHECK(gguf_get_f64(f, "llama.rope.freq_base", &theta) && theta == 10000.0);
    bool add_bos = false, add_eos = true;
    CHECK(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &add_bos) && add_bos);
    CHECK(gguf_get_bool(f, "tokenizer.ggml.add_eos_token", &add_eos) && !add_eos);
    struct gguf_str s;
    CHECK(gguf_get_str(f, "general.architecture", &s) && str_is(s, "llama"));
    CHECK(gguf_get_str(f, "general.name", &s) && str_is(s, "stories260K"));
    /* lookups of the wrong type or of absent keys fail */
    uint64_t u;
    CHECK(!gguf_get_str(f, "llama.block_count", &s));
    CHECK(!gguf_get_u64(f, "general.architecture", &u));
    CHECK(!gguf_get_u64(f, "no.such.key", &u));
    CHECK(gguf_find_kv(f, "llama.block_coun") == NULL);

    const struct gguf_kv *tokens = gguf_find_kv(f, "tokenizer.ggml.tokens");
    CHECK(tokens && tokens->type == GGUF_TYPE_ARRAY && tokens->array_type == GGUF_TYPE_STRING);
    CHECK(tokens && tokens->array_len == 512);

    const struct gguf_tensor *emb = gguf_find_tensor(f, "token_embd.weight");
    CHECK(emb != NULL);
    if (emb) {
        CHECK_EQ_INT(emb->n_dims, 2);
        CHECK_EQ_INT(emb->ne[0], 64);
        CHECK_EQ_INT(emb->ne[1], 512);
        CHECK_EQ_INT(emb->ne[2], 1);
        CHECK_EQ_INT(emb->n_bytes, quant_row_bytes(emb->type, 64) * 512);
    }
    const struct gguf_tensor *down = gguf_find_tensor(f, "blk.4.ffn_down.weight");
    CHECK(down && down->ne[0] == 172 && down->ne[1] == 64);
    const struct gguf_tensor *norm = gguf_find_tensor(f, "blk.0.attn_norm.weight");
    CHECK(norm && norm->type == GGML_TYPE_F32 && norm->n_dims == 1 && norm->ne[0] == 64);
    CHECK(gguf_find_tensor(f, "blk.5.attn_q.weight") == NULL);

    /* every tensor is found by name, lies in the data section, and is aligned */
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        char name[128];
        CHECK(t->name.len < sizeof name);
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        CHECK(gguf_find_tensor(f, name) == t);
        CHECK((const uint8_t *)t->data == f->base + f->data_offset + t->offset);
        CHECK(t->offset % 32 == 0);
        CHECK(f->data_offset + t->offset + t->n_bytes <= f->size);
    }
}

static void test_open_stories_f32(void) {
    struct gguf_file *f = open_or_fail(STORIES_F32);
    if (!f)
        return;
    check_stories_common(f);
    CHECK_EQ_INT(f->size, 1185504);
    CHECK_EQ_INT(count_type(f, GGML_TYPE_F32), 48);
    CHECK_EQ_INT(u64_or(f, "general.file_type", 99), 0);
    const struct gguf_tensor *emb = gguf_find_tensor(f, "token_embd.weight");
    CHECK(emb && emb->type == GGML_TYPE_F32 && emb->n_bytes == 64 * 512 * 4);
    gguf_close(f);
}

static void test_open_stories_q8_0(void) {
    struct gguf_file *f = open_or_fail(STORIES_Q8_0);
    if (!f)
        return;
    check_stories_common(f);
    CHECK_EQ_INT(f->size, 379232);
    CHECK_EQ_INT(count_type(f, GGML_TYPE_Q8_0), 32);
    CHECK_EQ_INT(count_type(f, GGML_TYPE_F16), 5);
    CHECK_EQ_INT(count_type(f, GGML_TYPE_F32), 11);
    CHECK_EQ_INT(u64_or(f, "general.file_type", 99), 7);
    const struct gguf_tensor *emb = gguf_find_tensor(f, "token_embd.weight");
    CHECK(emb && emb->type == GGML_TYPE_Q8_0 && emb->n_bytes == 2 * 512 * 34);
    const struct gguf_tensor *down = gguf_find_tensor(f, "blk.0.ffn_down.weight");
    CHECK(down && down->type == GGML_TYPE_F16 && down->n_bytes == 172 * 64 * 2);
    gguf_close(f);
}

static void test_open_stories_q4_0(void) {
    struct gguf_file *f = open_or_fail(STORIES_Q4_0);
    if (!f)
        return;
    check_stories_common(f);
    CHECK_EQ_INT(f->size, 260704);
    CHECK_EQ_INT(count_type(f, GGML_TYPE_Q4_0), 32);
    CHECK_EQ_INT(count_type(f, GGML_TYPE_F16), 5);
    CHECK_EQ_INT(count_type(f, GGML_TYPE_F32), 11);
    CHECK_EQ_INT(u64_or(f, "general.file_type", 99), 2);
    const struct gguf_tensor *q = gguf_find_tensor(f, "blk.2.attn_k.weight");
    CHECK(q && q->type == GGML_TYPE_Q4_0 && q->ne[0] == 64 && q->ne[1] == 32 &&
          q->n_bytes == 2 * 32 * 18);
    gguf_close(f);
}

static void test_open_llama_tiny(void) {
    struct gguf_file *f = open_or_fail(LLAMA_TINY);
    if (!f)
        return;
    CHECK_EQ_INT(f->version, 3);
    CHECK_EQ_INT(f->size, 1750560);
    CHECK_EQ_INT(f->n_kv, 18);
    CHECK_EQ_INT(f->n_tensors, 12);
    CHECK_EQ_INT(f->alignment, 32); /* no general.alignment: the default */
    CHECK_EQ_INT(count_type(f, GGML_TYPE_F16), 9);
    CHECK_EQ_INT(count_type(f, GGML_TYPE_F32), 3);
    CHECK_EQ_INT(u64_or(f, "llama.embedding_length", 0), 8);
    CHECK_EQ_INT(u64_or(f, "llama.context_length", 0), 4096);
    CHECK_EQ_INT(u64_or(f, "llama.block_count", 0), 1);
    CHECK_EQ_INT(u64_or(f, "llama.feed_forward_length", 0), 32);
    CHECK_EQ_INT(u64_or(f, "llama.attention.head_count", 0), 2);
    CHECK_EQ_INT(u64_or(f, "llama.rope.dimension_count", 0), 4);
    CHECK_EQ_INT(u64_or(f, "general.file_type", 0), 1);
    int64_t i64;
    CHECK(gguf_get_i64(f, "tokenizer.ggml.eos_token_id", &i64) && i64 == 2);
    const struct gguf_kv *tokens = gguf_find_kv(f, "tokenizer.ggml.tokens");
    CHECK(tokens && tokens->array_type == GGUF_TYPE_STRING && tokens->array_len == 32000);
    const struct gguf_kv *scores = gguf_find_kv(f, "tokenizer.ggml.scores");
    CHECK(scores && scores->array_type == GGUF_TYPE_FLOAT32 && scores->array_len == 32000);
    const char *names[] = {"token_embd.weight", "output.weight"};
    for (size_t i = 0; i < LLMOPT_ARRAY_LEN(names); i++) {
        const struct gguf_tensor *t = gguf_find_tensor(f, names[i]);
        CHECK(t && t->type == GGML_TYPE_F16 && t->n_dims == 2 && t->ne[0] == 8 &&
              t->ne[1] == 32000 && t->n_bytes == 8 * 32000 * 2);
    }
    gguf_close(f);
}

static void test_string_arrays(void) {
    struct gguf_file *f = open_or_fail(LLAMA_TINY);
    if (!f)
        return;
    const struct gguf_kv *tokens = gguf_find_kv(f, "tokenizer.ggml.tokens");
    CHECK(tokens != NULL);
    if (tokens) {
        struct gguf_str_iter it;
        struct gguf_str s;
        uint64_t n = 0, bytes = 0;
        gguf_str_iter_init(&it, tokens);
        while (gguf_str_iter_next(&it, &s)) {
            if (n == 0)
                CHECK(str_is(s, "<unk>"));
            if (n == 1)
                CHECK(str_is(s, "<s>"));
            if (n == 2)
                CHECK(str_is(s, "</s>"));
            if (n == 3)
                CHECK(str_is(s, "<0x00>"));
            bytes += s.len;
            n++;
        }
        CHECK_EQ_INT(n, 32000);
        CHECK(bytes > 32000);
        CHECK(!gguf_str_iter_next(&it, &s)); /* stays at the end */
        /* "Hello world" is [15043, 3186] in the Llama-2 vocab (llama2-tokenizer) */
        CHECK(gguf_str_array_get(tokens, 15043, &s) && str_is(s, "\xe2\x96\x81Hello"));
        CHECK(gguf_str_array_get(tokens, 3186, &s) && str_is(s, "\xe2\x96\x81world"));
        CHECK(gguf_str_array_get(tokens, 31999, &s));
        CHECK(!gguf_str_array_get(tokens, 32000, &s));
    }
    /* numeric arrays: O(1) element access; a string iterator over them is empty */
    const struct gguf_kv *types = gguf_find_kv(f, "tokenizer.ggml.token_type");
    CHECK(types && types->array_type == GGUF_TYPE_INT32);
    if (types) {
        int64_t v;
        CHECK(gguf_array_get_i64(types, 0, &v) && v == 2);
        CHECK(gguf_array_get_i64(types, 1, &v) && v == 3);
        CHECK(gguf_array_get_i64(types, 3, &v) && v == 6);
        CHECK(gguf_array_get_i64(types, 15043, &v) && v == 1);
        CHECK(!gguf_array_get_i64(types, 32000, &v));
        struct gguf_str_iter it;
        struct gguf_str s;
        gguf_str_iter_init(&it, types);
        CHECK(!gguf_str_iter_next(&it, &s));
        CHECK(!gguf_str_array_get(types, 0, &s));
    }
    const struct gguf_kv *scores = gguf_find_kv(f, "tokenizer.ggml.scores");
    if (scores) {
        double v;
        int64_t iv;
        CHECK(gguf_array_get_f64(scores, 31999, &v) && isfinite(v));
        CHECK(!gguf_array_get_i64(scores, 0, &iv)); /* floats are not integers */
    }
    /* a scalar kv is not an array */
    const struct gguf_kv *bos = gguf_find_kv(f, "tokenizer.ggml.bos_token_id");
    if (bos) {
        int64_t v;
        CHECK(!gguf_array_get_i64(bos, 0, &v));
        CHECK(gguf_kv_get_i64(bos, &v) && v == 1);
    }
    gguf_close(f);
}

static void test_print(void) {
    struct gguf_file *f = open_or_fail(STORIES_Q8_0);
    if (!f)
        return;
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    CHECK(out != NULL);
    if (out) {
        gguf_print(f, out);
        fclose(out);
        CHECK(strstr(text, "llama.embedding_length") != NULL);
        CHECK(strstr(text, "512 x [\"<unk>\", \"<s>\", \"</s>\"") != NULL);
        CHECK(strstr(text, "[f32]") != NULL);
        CHECK(strstr(text, "blk.0.ffn_down.weight") != NULL);
        CHECK(strstr(text, "172 x 64") != NULL);
        CHECK(strstr(text, "q8_0") != NULL);
        free(text);
    }
    gguf_close(f);
}

/* ---- fp16 / bf16 ---- */

/* Independent oracle for f32 -> 16-bit float rounding: values[h] for the positive
 * encodings 0..inf_bits (monotonic), with inf taken as 2^(emax+1) so overflow
 * rounds the way IEEE says; binary search, then nearest with ties to even. */
static uint16_t round_by_table(const double *values, uint16_t inf_bits, float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    uint16_t sign = (bits >> 31) ? 0x8000 : 0;
    double a = fabs((double)x);
    uint32_t lo = 0, hi = inf_bits; /* values[lo] <= a, find the largest such lo */
    if (a >= values[inf_bits])
        return sign | inf_bits;
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if (values[mid] <= a)
            lo = mid;
        else
            hi = mid;
    }
    double dlo = a - values[lo], dhi = values[lo + 1] - a;
    uint32_t r = dlo < dhi ? lo : dhi < dlo ? lo + 1 : (lo & 1) ? lo + 1 : lo;
    return (uint16_t)(sign | r);
}

static void test_fp16_bf16(void) {
    /* every 16-bit pattern survives 16 -> 32 -> 16 (NaNs stay NaN with their sign) */
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = fp16_to_f32((uint16_t)h);
        uint16_t back = fp16_from_f32(f);
        bool is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        if (is_nan)
            CHECK_MSG(isnan(f) && (back & 0x7c00) == 0x7c00 && (back & 0x3ff) &&
                          (back & 0x8000) == (h & 0x8000),
                      "f16 nan %04x", h);
        else
            CHECK_MSG(back == h, "f16 %04x -> %g -> %04x", h, f, back);
        float b = bf16_to_f32((uint16_t)h);
        uint16_t bback = bf16_from_f32(b);
        bool b_nan = (h & 0x7f80) == 0x7f80 && (h & 0x7f);
        if (b_nan)
            CHECK_MSG(isnan(b) && (bback & 0x7f80) == 0x7f80 && (bback & 0x7f),
                      "bf16 nan %04x", h);
        else
            CHECK_MSG(bback == h, "bf16 %04x -> %g -> %04x", h, b, bback);
    }
    /* known values */
    CHECK(fp16_to_f32(0x3c00) == 1.0f);
    CHECK(fp16_to_f32(0xc000) == -2.0f);
    CHECK(fp16_to_f32(0x7bff) == 65504.0f);
    CHECK(fp16_to_f32(0x0001) == 0x1p-24f);
    CHECK(fp16_to_f32(0x03ff) == 1023 * 0x1p-24f);
    CHECK(fp16_to_f32(0x0400) == 0x1p-14f);
    CHECK(isinf(fp16_to_f32(0x7c00)) && fp16_to_f32(0xfc00) < 0);
    CHECK(signbit(fp16_to_f32(0x8000)) && fp16_to_f32(0x8000) == 0.0f);
    CHECK_EQ_INT(fp16_from_f32(65504.0f), 0x7bff);
    CHECK_EQ_INT(fp16_from_f32(65519.996f), 0x7bff);
    CHECK_EQ_INT(fp16_from_f32(65520.0f), 0x7c00); /* tie goes to even: inf */
    CHECK_EQ_INT(fp16_from_f32(1e10f), 0x7c00);
    CHECK_EQ_INT(fp16_from_f32(-INFINITY), 0xfc00);
    CHECK_EQ_INT(fp16_from_f32(0x1p-24f), 0x0001);
    CHECK_EQ_INT(fp16_from_f32(0x1p-25f), 0x0000);           /* tie to even: 0 */
    CHECK_EQ_INT(fp16_from_f32(0x1.000002p-25f), 0x0001);    /* just above the tie */
    CHECK_EQ_INT(fp16_from_f32(1.5f * 0x1p-24f), 0x0002);    /* tie to even: 2 */
    CHECK_EQ_INT(fp16_from_f32(2.5f * 0x1p-24f), 0x0002);    /* tie to even: 2 */
    CHECK_EQ_INT(fp16_from_f32(1023.5f * 0x1p-24f), 0x0400); /* rounds up to normal */
    CHECK_EQ_INT(fp16_from_f32(1.0f + 0x1p-11f), 0x3c00);    /* tie to even */
    CHECK_EQ_INT(fp16_from_f32(1.0f + 3 * 0x1p-11f), 0x3c02);
    CHECK_EQ_INT(fp16_from_f32(-0.0f), 0x8000);
    CHECK_EQ_INT(fp16_from_f32(FLT_MIN), 0x0000);
    CHECK(isnan(fp16_to_f32(fp16_from_f32(NAN))));
    CHECK_EQ_INT(bf16_from_f32(1.0f), 0x3f80);
    CHECK_EQ_INT(bf16_from_f32(1.0f + 0x1p-8f), 0x3f80);     /* tie to even */
    CHECK_EQ_INT(bf16_from_f32(1.0f + 3 * 0x1p-8f), 0x3f82); /* tie to even, up */
    CHECK_EQ_INT(bf16_from_f32(FLT_MAX), 0x7f80);            /* rounds to inf */
    CHECK_EQ_INT(bf16_from_f32(-INFINITY), 0xff80);
    CHECK(isnan(bf16_to_f32(bf16_from_f32(NAN))));
    /* a NaN whose payload sits only in the low 16 bits must not become inf */
    uint32_t low_nan_bits = 0x7f800001u;
    float low_nan;
    memcpy(&low_nan, &low_nan_bits, sizeof low_nan);
    CHECK(isnan(bf16_to_f32(bf16_from_f32(low_nan))));
    CHECK(isnan(fp16_to_f32(fp16_from_f32(low_nan))));

    /* f32 -> 16 bits against the table oracle on many values: random bit patterns,
     * values around the f16 range, its subnormals, and near-ties */
    static double f16_values[0x7c01], bf16_values[0x7f81];
    for (uint32_t h = 0; h < 0x7c00; h++)
        f16_values[h] = fp16_to_f32((uint16_t)h);
    f16_values[0x7c00] = 65536.0;
    for (uint32_t h = 0; h < 0x7f80; h++)
        bf16_values[h] = bf16_to_f32((uint16_t)h);
    bf16_values[0x7f80] = ldexp(1.0, 128);
    rng_seed_fresh("fp16/bf16");
    int bad16 = 0, badb = 0;
    for (int i = 0; i < 400000; i++) {
        uint32_t bits = (uint32_t)rng_next();
        float x;
        switch (i % 4) {
        case 0: /* any finite f32 */
            if ((bits & 0x7f800000u) == 0x7f800000u)
                bits &= 0xbfffffffu;
            memcpy(&x, &bits, sizeof x);
            break;
        case 1: /* f16 range, log-uniform from 2^-26 to 2^17 */
            x = ldexpf(1.0f + 0.5f * (rng_float() + 1.0f), (int)(bits % 44) - 26);
            x = (bits >> 8) & 1 ? -x : x;
            break;
        case 2: { /* exactly halfway between two adjacent f16 values, and one ulp off */
            uint16_t h = (uint16_t)(bits % 0x7bff);
            double mid = (f16_values[h] + f16_values[h + 1]) / 2;
            x = (float)mid;
            if ((bits >> 20) & 1)
                x = nextafterf(x, (bits >> 21) & 1 ? INFINITY : 0.0f);
            break;
        }
        default: { /* halfway between two bf16 values */
            uint16_t h = (uint16_t)(bits % 0x7f7f);
            x = (float)((bf16_values[h] + bf16_values[h + 1]) / 2);
            break;
        }
        }
        uint16_t want16 = round_by_table(f16_values, 0x7c00, x);
        uint16_t wantb = round_by_table(bf16_values, 0x7f80, x);
        if (fp16_from_f32(x) != want16 && bad16++ < 5)
            CHECK_MSG(0, "f16 of %a: got %04x want %04x", x, fp16_from_f32(x), want16);
        if (bf16_from_f32(x) != wantb && badb++ < 5)
            CHECK_MSG(0, "bf16 of %a: got %04x want %04x", x, bf16_from_f32(x), wantb);
#if defined(__FLT16_MAX__)
        /* the compiler's own conversion (soft-float or F16C) agrees too */
        _Float16 hw = (_Float16)x;
        uint16_t hw_bits;
        memcpy(&hw_bits, &hw, sizeof hw_bits);
        if (hw_bits != want16 && bad16++ < 5)
            CHECK_MSG(0, "_Float16 of %a: %04x, oracle %04x", x, hw_bits, want16);
#endif
    }
    CHECK_EQ_INT(bad16, 0);
    CHECK_EQ_INT(badb, 0);
}

/* ---- quantizers ---- */

/* n random values in blocks of 32 with scales spread over many magnitudes, a few
 * outliers, and some blocks of equal magnitudes (ties for the q4_0 max). */
static void fill_random(float *x, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++) {
        /* 2^-4..2^8: block scales stay normal f16 numbers */
        float scale = ldexpf(1.0f, (int)(rng_next() % 13) - 4);
        int kind = (int)(rng_next() % 8);
        for (int j = 0; j < 32; j++) {
            float v = rng_float() * scale;
            if (kind == 0 && j == (int)(rng_next() % 32))
                v *= 50.0f; /* outlier */
            if (kind == 1)
                v = (j & 1) ? scale : -scale; /* ties of |x| with both signs */
            x[b * 32 + j] = v;
        }
    }
}

static void test_quant_q8_0(void) {
    enum { N = 32 * 512 };
    static float x[N], y[N];
    static block_q8_0 q[N / 32];
    rng_seed_fresh("q8_0");
    fill_random(x, N);
    CHECK_EQ_INT(quant_row_bytes(GGML_TYPE_Q8_0, N), sizeof q);
    CHECK_EQ_INT(quant_row_bytes(GGML_TYPE_Q8_0, 33), 0);
    quant_quantize_row_q8_0(x, q, N);
    quant_dequantize_row(GGML_TYPE_Q8_0, q, y, N);
    int bad = 0;
    double err2 = 0, sig2 = 0;
    for (int b = 0; b < N / 32; b++) {
        float amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[b * 32 + j]));
        /* rounding to the grid: d/2; the f16 scale is off by <= d * 2^-11, times |q| <= 127 */
        float d = amax / 127.0f;
        float bound = d * (0.5f + 127.0f * 0x1p-11f) * 1.0001f + 127 * 0x1p-25f;
        CHECK(fabsf(fp16_to_f32(q[b].d) - d) <= d * 0x1p-11f * 1.0001f + 0x1p-25f);
        for (int j = 0; j < 32; j++) {
            float e = fabsf(y[b * 32 + j] - x[b * 32 + j]);
            if (!(e <= bound) && bad++ < 5)
                CHECK_MSG(0, "q8_0 block %d elem %d: x %g y %g err %g > %g", b, j,
                          x[b * 32 + j], y[b * 32 + j], e, bound);
            CHECK(q[b].qs[j] >= -127);
            err2 += (double)e * e;
            sig2 += (double)x[b * 32 + j] * x[b * 32 + j];
        }
    }
    CHECK_EQ_INT(bad, 0);
    /* ~ 1/127/sqrt(12) of the block max; the outlier blocks dominate */
    CHECK(sqrt(err2 / sig2) < 0.02);
    /* zeros quantize to d = 0 and come back as zeros */
    float zeros[32] = {0}, back[32];
    block_q8_0 zq;
    quant_quantize_row_q8_0(zeros, &zq, 32);
    quant_dequantize_row(GGML_TYPE_Q8_0, &zq, back, 32);
    CHECK(zq.d == 0 && back[0] == 0 && back[31] == 0);
    /* the largest magnitude maps to +-127 exactly */
    float ramp[32];
    for (int j = 0; j < 32; j++)
        ramp[j] = (float)(j - 16) / 4.0f;
    quant_quantize_row_q8_0(ramp, &zq, 32);
    CHECK_EQ_INT(zq.qs[0], -127);
    CHECK_EQ_INT(zq.qs[16], 0);
    CHECK_EQ_INT(zq.qs[20], 32); /* round(1 * 127/4) */
}

static void test_quant_q4_0(void) {
    enum { N = 32 * 512 };
    static float x[N], y[N];
    static block_q4_0 q[N / 32];
    rng_seed_fresh("q4_0");
    fill_random(x, N);
    CHECK_EQ_INT(quant_row_bytes(GGML_TYPE_Q4_0, N), sizeof q);
    CHECK_EQ_INT(quant_row_bytes(GGML_TYPE_Q4_0, -32), 0);
    quant_quantize_row_q4_0(x, q, N);
    quant_dequantize_row(GGML_TYPE_Q4_0, q, y, N);
    int bad = 0;
    double err2 = 0, sig2 = 0;
    for (int b = 0; b < N / 32; b++) {
        float amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[b * 32 + j]));
        /* levels -8d..7d with |8d| = amax: the opposite extreme is off by up to |d|,
         * the rest by |d|/2; the f16 scale adds |q - 8| <= 8 times its error */
        float d = amax / 8.0f;
        float bound = d * (1.0f + 8.0f * 0x1p-11f) * 1.0001f + 8 * 0x1p-25f;
        for (int j = 0; j < 32; j++) {
            float e = fabsf(y[b * 32 + j] - x[b * 32 + j]);
            if (!(e <= bound) && bad++ < 5)
                CHECK_MSG(0, "q4_0 block %d elem %d: x %g y %g err %g > %g", b, j,
                          x[b * 32 + j], y[b * 32 + j], e, bound);
            err2 += (double)e * e;
            sig2 += (double)x[b * 32 + j] * x[b * 32 + j];
        }
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(sqrt(err2 / sig2) < 0.15);
    /* the signed maximum is exact (quant 0 = -8 d) and the nibble layout is
     * low = element j, high = element j + 16 */
    float v[32];
    for (int j = 0; j < 32; j++)
        v[j] = j == 20 ? -4.0f : (float)(j % 5) * 0.25f;
    block_q4_0 blk;
    quant_quantize_row_q4_0(v, &blk, 32);
    CHECK(fp16_to_f32(blk.d) == 0.5f); /* -4 / -8 */
    CHECK_EQ_INT(blk.qs[4] >> 4, 0);   /* element 20 */
    CHECK_EQ_INT(blk.qs[4] & 0xf, 10); /* element 4: 1.0 / 0.5 + 8 */
    float back[32];
    quant_dequantize_row(GGML_TYPE_Q4_0, &blk, back, 32);
    CHECK(back[20] == -4.0f && back[4] == 1.0f && back[0] == 0.0f);
}

/* f16/bf16/f32 rows through quant_dequantize_row */
static void test_dequant_float_types(void) {
    float x[64], y[64];
    uint16_t h[64], b[64];
    rng_seed_fresh("float rows");
    for (int i = 0; i < 64; i++) {
        x[i] = rng_float() * 100.0f;
        h[i] = fp16_from_f32(x[i]);
        b[i] = bf16_from_f32(x[i]);
    }
    quant_dequantize_row(GGML_TYPE_F16, h, y, 64);
    for (int i = 0; i < 64; i++)
        CHECK(fabsf(y[i] - x[i]) <= fabsf(x[i]) * 0x1p-11f + 0x1p-24f);
    quant_dequantize_row(GGML_TYPE_BF16, b, y, 64);
    for (int i = 0; i < 64; i++)
        CHECK(fabsf(y[i] - x[i]) <= fabsf(x[i]) * 0x1p-8f);
    quant_dequantize_row(GGML_TYPE_F32, x, y, 64);
    CHECK(memcmp(x, y, sizeof x) == 0);
    /* unaligned source rows are fine */
    uint8_t raw[2 * 64 + 1];
    memcpy(raw + 1, h, sizeof h);
    quant_dequantize_row(GGML_TYPE_F16, raw + 1, y, 64);
    CHECK(y[5] == fp16_to_f32(h[5]));
    CHECK_EQ_INT(quant_row_bytes(GGML_TYPE_F16, 172), 344);
    CHECK_EQ_INT(quant_row_bytes(GGML_TYPE_BF16, 3), 6);
    CHECK_EQ_INT(quant_row_bytes(GGML_TYPE_F32, 5), 20);
    CHECK_EQ_INT(quant_row_bytes(GGML_TYPE_Q4_K, 256), 144);
    CHECK_EQ_INT(quant_row_bytes(GGML_TYPE_Q4_K, 96), 0); /* not whole super-blocks */
    CHECK_EQ_INT(quant_row_bytes((enum ggml_type)3, 32), 0); /* q4_1: not read */
}

/* The quantized stories files against the F32 one: dequantized values lie within
 * the quantization error, and re-quantizing the F32 weights with the reference
 * quantizers reproduces the files' blocks byte for byte. */
static void compare_quantized_file(const char *path, enum ggml_type qtype, double bound_per_amax) {
    struct gguf_file *f32 = open_or_fail(STORIES_F32);
    struct gguf_file *fq = open_or_fail(path);
    if (!f32 || !fq)
        goto done;
    const char *names[] = {"token_embd.weight", "blk.0.attn_q.weight", "blk.4.ffn_up.weight",
                           "blk.2.ffn_down.weight"};
    for (size_t k = 0; k < LLMOPT_ARRAY_LEN(names); k++) {
        const struct gguf_tensor *a = gguf_find_tensor(f32, names[k]);
        const struct gguf_tensor *b = gguf_find_tensor(fq, names[k]);
        CHECK(a && b);
        if (!a || !b)
            continue;
        CHECK(a->ne[0] == b->ne[0] && a->ne[1] == b->ne[1]);
        bool is_f16 = b->type == GGML_TYPE_F16;
        CHECK(is_f16 ? a->ne[0] % 32 != 0 : b->type == qtype);
        int64_t ne0 = (int64_t)a->ne[0], rows = (int64_t)a->ne[1];
        size_t row_bytes = quant_row_bytes(b->type, ne0);
        float *x = malloc(sizeof *x * (size_t)ne0), *y = malloc(sizeof *y * (size_t)ne0);
        uint8_t *requant = malloc(row_bytes);
        int bad = 0, mismatched_rows = 0;
        for (int64_t r = 0; r < rows; r++) {
            quant_dequantize_row(GGML_TYPE_F32, (const uint8_t *)a->data + r * ne0 * 4, x, ne0);
            const uint8_t *qrow = (const uint8_t *)b->data + (size_t)r * row_bytes;
            quant_dequantize_row(b->type, qrow, y, ne0);
            for (int64_t blk = 0; blk < ne0; blk += 32) {
                int64_t end = blk + 32 < ne0 ? blk + 32 : ne0;
                float amax = 0;
                for (int64_t j = blk; j < end; j++)
                    amax = fmaxf(amax, fabsf(x[j]));
                for (int64_t j = blk; j < end; j++) {
                    double bound = is_f16 ? fabs(x[j]) * 0x1p-11 + 0x1p-24
                                          : amax * bound_per_amax + 128 * 0x1p-25;
                    if (!(fabs((double)y[j] - x[j]) <= bound) && bad++ < 3)
                        CHECK_MSG(0, "%s %s row %" PRId64 " elem %" PRId64 ": %g vs %g", path,
                                  names[k], r, j, y[j], x[j]);
                }
            }
            if (is_f16)
                continue;
            if (qtype == GGML_TYPE_Q8_0)
                quant_quantize_row_q8_0(x, requant, ne0);
            else
                quant_quantize_row_q4_0(x, requant, ne0);
            mismatched_rows += memcmp(requant, qrow, row_bytes) != 0;
        }
        CHECK_EQ_INT(bad, 0);
        CHECK_MSG(mismatched_rows == 0, "%s %s: %d of %" PRId64 " rows differ after re-quantizing",
                  path, names[k], mismatched_rows, rows);
        free(x);
        free(y);
        free(requant);
    }
done:
    gguf_close(fq);
    gguf_close(f32);
}

static void test_q8_0_file_matches_f32(void) {
    compare_quantized_file(STORIES_Q8_0, GGML_TYPE_Q8_0, (0.5 + 127 * 0x1p-11) / 127 * 1.0001);
}

static void test_q4_0_file_matches_f32(void) {
    compare_quantized_file(STORIES_Q4_0, GGML_TYPE_Q4_0, (1.0 + 8 * 0x1p-11) / 8 * 1.0001);
}

/* ---- hand-made files ---- */

struct buf {
    uint8_t *p;
    size_t len, cap;
};

static void put(struct buf *b, const void *src, size_t n) {
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        LLMOPT_ASSERT(b->p);
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
}
static void put_u8(struct buf *b, uint8_t v) { put(b, &v, 1); }
static void put_u16(struct buf *b, uint16_t v) { put(b, &v, 2); }
static void put_u32(struct buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(struct buf *b, uint64_t v) { put(b, &v, 8); }
static void put_f32(struct buf *b, float v) { put(b, &v, 4); }
static void put_f64(struct buf *b, double v) { put(b, &v, 8); }
static void put_str(struct buf *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void put_key(struct buf *b, const char *key, enum gguf_type type) {
    put_str(b, key);
    put_u32(b, type);
}
static void patch_u32(struct buf *b, size_t at, uint32_t v) { memcpy(b->p + at, &v, 4); }
static void patch_u64(struct buf *b, size_t at, uint64_t v) { memcpy(b->p + at, &v, 8); }

/* File offsets of the fields the malformed cases patch. */
struct small_file {
    struct buf b;
    size_t version, n_tensors, n_kv;
    size_t key0_len;        /* first key's u64 length */
    size_t str_value_len;   /* general.name value length */
    size_t type_u8;         /* value type of "t.u8" */
    size_t bool_value;      /* the byte of "t.bool" */
    size_t align_type, align_value;
    size_t arr_elem_type, arr_len;      /* "t.strings" */
    size_t key_dup;         /* key "t.i8" (same length as "t.u8") */
    size_t t0_n_dims, t0_ne0, t0_ne1, t0_type, t0_offset;
    size_t t1_name;         /* bytes of tensor #1's name: "b.weight" */
    size_t t1_type;
};

/* A small valid v3 file: one kv of every type (arrays of strings and of i32),
 * general.alignment = alignment, tensors a.weight f32 [8, 2] and b.weight q8_0
 * [32, 2] with data. */
static struct small_file build_small(uint32_t alignment) {
    struct small_file s = {0};
    struct buf *b = &s.b;
    put(b, "GGUF", 4);
    s.version = b->len;
    put_u32(b, 3);
    s.n_tensors = b->len;
    put_u64(b, 2);
    s.n_kv = b->len;
    put_u64(b, 16);
    s.key0_len = b->len;
    put_key(b, "general.architecture", GGUF_TYPE_STRING);
    put_str(b, "test");
    put_key(b, "general.name", GGUF_TYPE_STRING);
    s.str_value_len = b->len;
    put_str(b, "small \"file\"\n");
    put_str(b, "t.u8");
    s.type_u8 = b->len;
    put_u32(b, GGUF_TYPE_UINT8);
    put_u8(b, 200);
    s.key_dup = b->len;
    put_key(b, "t.i8", GGUF_TYPE_INT8);
    put_u8(b, (uint8_t)-5);
    put_key(b, "t.u16", GGUF_TYPE_UINT16);
    put_u16(b, 65535);
    put_key(b, "t.i16", GGUF_TYPE_INT16);
    put_u16(b, (uint16_t)-300);
    put_key(b, "t.u32", GGUF_TYPE_UINT32);
    put_u32(b, 4000000000u);
    put_key(b, "t.i32", GGUF_TYPE_INT32);
    put_u32(b, (uint32_t)-70000);
    put_key(b, "t.f32", GGUF_TYPE_FLOAT32);
    put_f32(b, 0.25f);
    put_key(b, "t.bool", GGUF_TYPE_BOOL);
    s.bool_value = b->len;
    put_u8(b, 1);
    put_key(b, "t.u64", GGUF_TYPE_UINT64);
    put_u64(b, UINT64_MAX);
    put_key(b, "t.i64", GGUF_TYPE_INT64);
    put_u64(b, (uint64_t)INT64_MIN);
    put_key(b, "t.f64", GGUF_TYPE_FLOAT64);
    put_f64(b, -1.5e300);
    put_str(b, "general.alignment");
    s.align_type = b->len;
    put_u32(b, GGUF_TYPE_UINT32);
    s.align_value = b->len;
    put_u32(b, alignment);
    put_key(b, "t.strings", GGUF_TYPE_ARRAY);
    s.arr_elem_type = b->len;
    put_u32(b, GGUF_TYPE_STRING);
    s.arr_len = b->len;
    put_u64(b, 3);
    put_str(b, "alpha");
    put_str(b, "");
    put_str(b, "gamma");
    put_key(b, "t.ints", GGUF_TYPE_ARRAY);
    put_u32(b, GGUF_TYPE_INT32);
    put_u64(b, 4);
    for (int32_t i = 0; i < 4; i++)
        put_u32(b, (uint32_t)(i * -7));

    put_str(b, "a.weight");
    s.t0_n_dims = b->len;
    put_u32(b, 2);
    s.t0_ne0 = b->len;
    put_u64(b, 8);
    s.t0_ne1 = b->len;
    put_u64(b, 2);
    s.t0_type = b->len;
    put_u32(b, GGML_TYPE_F32);
    s.t0_offset = b->len;
    put_u64(b, 0);
    s.t1_name = b->len + 8;
    put_str(b, "b.weight");
    put_u32(b, 2);
    put_u64(b, 32);
    put_u64(b, 2);
    s.t1_type = b->len;
    put_u32(b, GGML_TYPE_Q8_0);
    uint64_t t1_offset = (64 + alignment - 1) / alignment * alignment; /* after 64 bytes */
    put_u64(b, t1_offset);

    while (b->len % alignment)
        put_u8(b, 0);
    for (int i = 0; i < 16; i++)
        put_f32(b, (float)i);
    while (b->len % alignment)
        put_u8(b, 0xee);
    for (int r = 0; r < 2; r++) {
        put_u16(b, fp16_from_f32(0.5f));
        for (int j = 0; j < 32; j++)
            put_u8(b, (uint8_t)(j - 16));
    }
    return s;
}

/* Parses a copy of exactly len bytes (so ASan sees any read past the end). */
static enum llmopt_status parse_copy(const uint8_t *data, size_t len, struct llmopt_err *err) {
    uint8_t *copy = malloc(len ? len : 1);
    if (len)
        memcpy(copy, data, len);
    struct gguf_file *f = NULL;
    err->msg[0] = '\0';
    enum llmopt_status st = gguf_parse(copy, len, &f, err);
    if (st == LLMOPT_OK)
        gguf_close(f);
    else
        CHECK(f == NULL);
    gguf_fuzz_one(copy, len);
    free(copy);
    return st;
}

static void test_small_valid(void) {
    struct small_file s = build_small(32);
    struct gguf_file *f = NULL;
    struct llmopt_err err = {0};
    enum llmopt_status st = gguf_parse(s.b.p, s.b.len, &f, &err);
    CHECK_MSG(st == LLMOPT_OK, "%s", err.msg);
    if (st != LLMOPT_OK) {
        free(s.b.p);
        return;
    }
    CHECK(!f->mapped);
    CHECK_EQ_INT(f->n_kv, 16);
    CHECK_EQ_INT(f->n_tensors, 2);
    CHECK_EQ_INT(f->alignment, 32);
    uint64_t u;
    int64_t i;
    double d;
    bool bv;
    struct gguf_str str;
    CHECK(gguf_get_u64(f, "t.u8", &u) && u == 200);
    CHECK(gguf_get_i64(f, "t.i8", &i) && i == -5);
    CHECK(!gguf_get_u64(f, "t.i8", &u)); /* negative */
    CHECK(gguf_get_u64(f, "t.u16", &u) && u == 65535);
    CHECK(gguf_get_i64(f, "t.i16", &i) && i == -300);
    CHECK(gguf_get_u64(f, "t.u32", &u) && u == 4000000000u);
    CHECK(gguf_get_i64(f, "t.i32", &i) && i == -70000);
    CHECK(gguf_get_f64(f, "t.f32", &d) && d == 0.25);
    CHECK(!gguf_get_i64(f, "t.f32", &i));
    CHECK(gguf_get_bool(f, "t.bool", &bv) && bv);
    CHECK(!gguf_get_bool(f, "t.u8", &bv));
    CHECK(gguf_get_u64(f, "t.u64", &u) && u == UINT64_MAX);
    CHECK(!gguf_get_i64(f, "t.u64", &i)); /* does not fit */
    CHECK(gguf_get_i64(f, "t.i64", &i) && i == INT64_MIN);
    CHECK(gguf_get_f64(f, "t.f64", &d) && d == -1.5e300);
    CHECK(gguf_get_f64(f, "t.i32", &d) && d == -70000.0);
    CHECK(gguf_get_str(f, "general.name", &str) && str_is(str, "small \"file\"\n"));
    const struct gguf_kv *kv = gguf_find_kv(f, "t.strings");
    CHECK(kv && kv->array_len == 3);
    if (kv) {
        const char *want[] = {"alpha", "", "gamma"};
        struct gguf_str_iter it;
        uint64_t n = 0;
        gguf_str_iter_init(&it, kv);
        while (gguf_str_iter_next(&it, &str)) {
            CHECK(n < 3 && str_is(str, want[n]));
            n++;
        }
        CHECK_EQ_INT(n, 3);
    }
    kv = gguf_find_kv(f, "t.ints");
    CHECK(kv && kv->array_type == GGUF_TYPE_INT32 && kv->array_len == 4);
    if (kv) {
        CHECK(gguf_array_get_i64(kv, 3, &i) && i == -21);
        CHECK(gguf_array_get_f64(kv, 2, &d) && d == -14.0);
    }
    const struct gguf_tensor *a = gguf_find_tensor(f, "a.weight");
    const struct gguf_tensor *b = gguf_find_tensor(f, "b.weight");
    CHECK(a && b);
    if (a && b) {
        CHECK_EQ_INT(a->n_bytes, 64);
        CHECK_EQ_INT(b->n_bytes, 68);
        float x[64];
        quant_dequantize_row(GGML_TYPE_F32, a->data, x, 16);
        CHECK(x[0] == 0.0f && x[15] == 15.0f);
        quant_dequantize_row(GGML_TYPE_Q8_0, b->data, x, 64);
        CHECK(x[0] == -8.0f && x[63] == 7.5f);
    }
    /* printing copes with quotes and newlines in values */
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    if (out) {
        gguf_print(f, out);
        fclose(out);
        CHECK(strstr(text, "\"small \\\"file\\\"\\n\"") != NULL);
        CHECK(strstr(text, "3 x [\"alpha\", \"\", \"gamma\"]") != NULL);
        CHECK(strstr(text, "18446744073709551615") != NULL);
        CHECK(strstr(text, "-9223372036854775808") != NULL);
        free(text);
    }
    gguf_close(f);

    /* version 2 has the same layout */
    patch_u32(&s.b, s.version, 2);
    CHECK_EQ_INT(parse_copy(s.b.p, s.b.len, &err), LLMOPT_OK);
    free(s.b.p);

    /* a larger alignment moves the data section and tensor offsets with it */
    s = build_small(256);
    st = gguf_parse(s.b.p, s.b.len, &f, &err);
    CHECK_MSG(st == LLMOPT_OK, "%s", err.msg);
    if (st == LLMOPT_OK) {
        CHECK_EQ_INT(f->alignment, 256);
        CHECK_EQ_INT(f->data_offset % 256, 0);
        CHECK_EQ_INT(f->tensors[1].offset, 256);
        gguf_close(f);
    }
    free(s.b.p);

    /* the smallest file: header only, no kv, no tensors, no padding */
    struct buf e = {0};
    put(&e, "GGUF", 4);
    put_u32(&e, 3);
    put_u64(&e, 0);
    put_u64(&e, 0);
    st = gguf_parse(e.p, e.len, &f, &err);
    CHECK_MSG(st == LLMOPT_OK, "%s", err.msg);
    if (st == LLMOPT_OK) {
        CHECK(f->n_kv == 0 && f->n_tensors == 0 && f->data_offset == 24);
        CHECK(gguf_find_kv(f, "x") == NULL && gguf_find_tensor(f, "x") == NULL);
        gguf_close(f);
    }
    free(e.p);
}

static void test_truncated_everywhere(void) {
    struct small_file s = build_small(32);
    struct llmopt_err err;
    int failures = 0;
    for (size_t len = 0; len < s.b.len; len++) {
        enum llmopt_status st = parse_copy(s.b.p, len, &err);
        if ((st != LLMOPT_ERR_FORMAT || strncmp(err.msg, "gguf: ", 6) != 0) && failures++ < 5)
            CHECK_MSG(0, "truncated to %zu of %zu bytes: status %d, msg '%s'", len, s.b.len,
                      st, err.msg);
    }
    CHECK_EQ_INT(failures, 0);
    CHECK_EQ_INT(parse_copy(s.b.p, s.b.len, &err), LLMOPT_OK);
    /* the message names what was cut */
    CHECK(parse_copy(s.b.p, 10, &err) == LLMOPT_ERR_FORMAT && strstr(err.msg, "n_tensors") &&
          strstr(err.msg, "truncated"));
    CHECK(parse_copy(s.b.p, s.arr_len + 3, &err) == LLMOPT_ERR_FORMAT &&
          strstr(err.msg, "'t.strings'") && strstr(err.msg, "array length"));
    /* cut inside the tensor infos: n_tensors is checked against what is left */
    CHECK(parse_copy(s.b.p, s.t0_ne1 + 3, &err) == LLMOPT_ERR_FORMAT &&
          strstr(err.msg, "n_tensors") && strstr(err.msg, "33 bytes each"));
    CHECK(parse_copy(s.b.p, s.b.len - 1, &err) == LLMOPT_ERR_FORMAT &&
          strstr(err.msg, "'b.weight'") && strstr(err.msg, "past end of file"));
    free(s.b.p);
}

/* One malformed case: expect status and both needles (when non-NULL) in the
 * message; frees the file. */
static void expect_bad(const char *what, struct small_file *s, enum llmopt_status want,
                       const char *needle1, const char *needle2) {
    struct llmopt_err err;
    enum llmopt_status st = parse_copy(s->b.p, s->b.len, &err);
    CHECK_MSG(st == want, "%s: status %d (%s), want %d; msg '%s'", what, st,
              llmopt_status_str(st), want, err.msg);
    CHECK_MSG(strncmp(err.msg, "gguf: ", 6) == 0, "%s: msg '%s'", what, err.msg);
    CHECK_MSG(!needle1 || strstr(err.msg, needle1), "%s: '%s' not in '%s'", what, needle1,
              err.msg);
    CHECK_MSG(!needle2 || strstr(err.msg, needle2), "%s: '%s' not in '%s'", what, needle2,
              err.msg);
    if (getenv("LLMOPT_TEST_VERBOSE"))
        fprintf(stderr, "  %-28s %s\n", what, err.msg);
    free(s->b.p);
}

static void test_malformed(void) {
    struct small_file s;
#define CASE(what, status, n1, n2, ...)                                            \
    do {                                                                           \
        s = build_small(32);                                                       \
        __VA_ARGS__;                                                               \
        expect_bad(what, &s, status, n1, n2);                                      \
    } while (0)

    CASE("bad magic", LLMOPT_ERR_FORMAT, "magic", "47 47 55 46", s.b.p[3] = 'X');
    CASE("version 1", LLMOPT_ERR_UNSUPPORTED, "version", "1", patch_u32(&s.b, s.version, 1));
    CASE("version 0", LLMOPT_ERR_FORMAT, "version", "0", patch_u32(&s.b, s.version, 0));
    CASE("version 4", LLMOPT_ERR_FORMAT, "version", "4", patch_u32(&s.b, s.version, 4));
    CASE("big-endian", LLMOPT_ERR_UNSUPPORTED, "version", "big-endian",
         patch_u32(&s.b, s.version, 0x03000000u));
    CASE("n_tensors 2^60", LLMOPT_ERR_FORMAT, "n_tensors", "1152921504606846976",
         patch_u64(&s.b, s.n_tensors, 1ull << 60));
    CASE("n_tensors max", LLMOPT_ERR_FORMAT, "n_tensors", NULL,
         patch_u64(&s.b, s.n_tensors, UINT64_MAX));
    CASE("n_tensors 3", LLMOPT_ERR_FORMAT, "tensor #2", NULL, patch_u64(&s.b, s.n_tensors, 3));
    CASE("n_kv 2^60", LLMOPT_ERR_FORMAT, "n_kv", "1152921504606846976",
         patch_u64(&s.b, s.n_kv, 1ull << 60));
    CASE("n_kv max", LLMOPT_ERR_FORMAT, "n_kv", NULL, patch_u64(&s.b, s.n_kv, UINT64_MAX));
    CASE("key length 2^62", LLMOPT_ERR_FORMAT, "kv #0", "key",
         patch_u64(&s.b, s.key0_len, 1ull << 62));
    CASE("key length max", LLMOPT_ERR_FORMAT, "kv #0", "string length",
         patch_u64(&s.b, s.key0_len, UINT64_MAX));
    CASE("empty key", LLMOPT_ERR_FORMAT, "kv #0", "empty", patch_u64(&s.b, s.key0_len, 0));
    CASE("string value 2^63", LLMOPT_ERR_FORMAT, "'general.name'", "string value",
         patch_u64(&s.b, s.str_value_len, 1ull << 63));
    CASE("array length 2^60", LLMOPT_ERR_FORMAT, "'t.strings'", "array length",
         patch_u64(&s.b, s.arr_len, 1ull << 60));
    CASE("array elem type 13", LLMOPT_ERR_FORMAT, "'t.strings'", "array element type",
         patch_u32(&s.b, s.arr_elem_type, 13));
    CASE("array of arrays", LLMOPT_ERR_UNSUPPORTED, "'t.strings'", "arrays of arrays",
         patch_u32(&s.b, s.arr_elem_type, GGUF_TYPE_ARRAY));
    CASE("value type 13", LLMOPT_ERR_FORMAT, "'t.u8'", "value type 13",
         patch_u32(&s.b, s.type_u8, 13));
    CASE("value type 2^32-1", LLMOPT_ERR_FORMAT, "'t.u8'", "value type",
         patch_u32(&s.b, s.type_u8, UINT32_MAX));
    CASE("bool 2", LLMOPT_ERR_FORMAT, "'t.bool'", "bool", s.b.p[s.bool_value] = 2);
    CASE("duplicate key", LLMOPT_ERR_FORMAT, "'t.u8'", "duplicate",
         s.b.p[s.key_dup + 8 + 2] = 'u');
    CASE("alignment 0", LLMOPT_ERR_FORMAT, "general.alignment", "power of two",
         patch_u32(&s.b, s.align_value, 0));
    CASE("alignment 3", LLMOPT_ERR_FORMAT, "general.alignment", "3",
         patch_u32(&s.b, s.align_value, 3));
    CASE("alignment as i32", LLMOPT_ERR_FORMAT, "general.alignment", "expected u32",
         patch_u32(&s.b, s.align_type, GGUF_TYPE_INT32));
    CASE("alignment 2^31", LLMOPT_ERR_FORMAT, "offset", NULL,
         patch_u32(&s.b, s.align_value, 1u << 31));
    CASE("n_dims 0", LLMOPT_ERR_FORMAT, "'a.weight'", "n_dims 0",
         patch_u32(&s.b, s.t0_n_dims, 0));
    CASE("n_dims 5", LLMOPT_ERR_FORMAT, "'a.weight'", "n_dims 5",
         patch_u32(&s.b, s.t0_n_dims, 5));
    CASE("ne 0", LLMOPT_ERR_FORMAT, "'a.weight'", "ne[1]", patch_u64(&s.b, s.t0_ne1, 0));
    CASE("ne 2^63", LLMOPT_ERR_FORMAT, "'a.weight'", "ne[0]",
         patch_u64(&s.b, s.t0_ne0, 1ull << 63));
    CASE("ne product overflow", LLMOPT_ERR_FORMAT, "'a.weight'", "overflow",
         patch_u64(&s.b, s.t0_ne0, 1ull << 32);
         patch_u64(&s.b, s.t0_ne1, 1ull << 32));
    CASE("byte size overflow", LLMOPT_ERR_FORMAT, "'a.weight'", "overflow",
         patch_u64(&s.b, s.t0_ne0, 1ull << 62);
         patch_u64(&s.b, s.t0_ne1, 1));
    CASE("unsupported type q4_1", LLMOPT_ERR_UNSUPPORTED, "'a.weight'", "type 3",
         patch_u32(&s.b, s.t0_type, 3));
    CASE("q4_k ne0 not /256", LLMOPT_ERR_FORMAT, "'a.weight'", "q4_K block size 256",
         patch_u32(&s.b, s.t0_type, 12));
    CASE("type 40", LLMOPT_ERR_FORMAT, "'a.weight'", "type 40", patch_u32(&s.b, s.t0_type, 40));
    CASE("q8_0 ne0 not /32", LLMOPT_ERR_FORMAT, "'a.weight'", "block size",
         patch_u32(&s.b, s.t0_type, GGML_TYPE_Q8_0));
    CASE("misaligned offset", LLMOPT_ERR_FORMAT, "'a.weight'", "alignment",
         patch_u64(&s.b, s.t0_offset, 4));
    CASE("offset out of range", LLMOPT_ERR_FORMAT, "'a.weight' (#0) data", "past end of file",
         patch_u64(&s.b, s.t0_offset, 1ull << 40));
    CASE("offset near 2^64", LLMOPT_ERR_FORMAT, "'a.weight'", "past end of file",
         patch_u64(&s.b, s.t0_offset, UINT64_MAX - 31));
    CASE("data runs past end", LLMOPT_ERR_FORMAT, "'b.weight'", "past end of file",
         patch_u32(&s.b, s.t1_type, GGML_TYPE_F32));
    CASE("duplicate tensor", LLMOPT_ERR_FORMAT, "'a.weight' (#1)", "duplicate",
         s.b.p[s.t1_name] = 'a');
    CASE("empty tensor name", LLMOPT_ERR_FORMAT, "tensor #1", "empty",
         patch_u64(&s.b, s.t1_name - 8, 0));
    CASE("tensor name 2^61", LLMOPT_ERR_FORMAT, "tensor #1", "name",
         patch_u64(&s.b, s.t1_name - 8, 1ull << 61));
#undef CASE

    /* counts that fit the file but pass a cap: LLMOPT_ERR_LIMIT */
    struct buf big = {0};
    put(&big, "GGUF", 4);
    put_u32(&big, 3);
    put_u64(&big, 0);
    put_u64(&big, (uint64_t)GGUF_MAX_KV + 1);
    size_t header = big.len;
    big.len = header + ((size_t)GGUF_MAX_KV + 1) * 16; /* room for that many small kvs */
    big.p = realloc(big.p, big.len);
    memset(big.p + header, 0, big.len - header);
    struct llmopt_err err;
    CHECK_EQ_INT(parse_copy(big.p, big.len, &err), LLMOPT_ERR_LIMIT);
    CHECK(strstr(err.msg, "n_kv") && strstr(err.msg, "cap"));
    free(big.p);

    /* empty and tiny inputs */
    CHECK_EQ_INT(parse_copy(NULL, 0, &err), LLMOPT_ERR_FORMAT);
    CHECK(strstr(err.msg, "magic"));
    CHECK_EQ_INT(parse_copy((const uint8_t *)"GG", 2, &err), LLMOPT_ERR_FORMAT);
}

static void test_open_errors(void) {
    struct gguf_file *f = (struct gguf_file *)0x1;
    struct llmopt_err err = {0};
    CHECK_EQ_INT(gguf_open("../shared/models/no-such-file.gguf", &f, &err), LLMOPT_ERR_IO);
    CHECK(strstr(err.msg, "no-such-file.gguf") != NULL);
    CHECK(f == (struct gguf_file *)0x1); /* untouched on failure */
    CHECK_EQ_INT(gguf_open("../shared/models", &f, &err), LLMOPT_ERR_IO);
    /* an empty file and a non-GGUF file name the path and the problem */
    char path[] = "/tmp/llmopt_test_gguf_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    CHECK_EQ_INT(gguf_open(path, &f, &err), LLMOPT_ERR_FORMAT);
    CHECK(strstr(err.msg, path) && strstr(err.msg, "magic"));
    CHECK(write(fd, "GGUF\x03\0\0\0", 8) == 8);
    CHECK_EQ_INT(gguf_open(path, &f, &err), LLMOPT_ERR_FORMAT);
    CHECK(strstr(err.msg, path) && strstr(err.msg, "n_tensors"));
    close(fd);
    unlink(path);
    CHECK(f == (struct gguf_file *)0x1);
    gguf_close(NULL);
}

static void test_type_names(void) {
    CHECK(strcmp(gguf_type_name(GGUF_TYPE_STRING), "string") == 0);
    CHECK(strcmp(gguf_type_name(GGUF_TYPE_FLOAT64), "f64") == 0);
    CHECK(strcmp(gguf_type_name((enum gguf_type)99), "?") == 0);
    CHECK_EQ_INT(gguf_type_size(GGUF_TYPE_UINT64), 8);
    CHECK_EQ_INT(gguf_type_size(GGUF_TYPE_STRING), 0);
    CHECK(strcmp(ggml_type_name(GGML_TYPE_Q8_0), "q8_0") == 0);
    CHECK(strcmp(ggml_type_name(GGML_TYPE_BF16), "bf16") == 0);
    CHECK(strcmp(ggml_type_name((enum ggml_type)12), "q4_K") == 0);
    CHECK(ggml_type_name((enum ggml_type)3) == NULL); /* q4_1: not read */
    CHECK(ggml_type_name((enum ggml_type)1000) == NULL);
    uint32_t be, bb;
    CHECK(ggml_type_block(GGML_TYPE_Q4_0, &be, &bb) && be == 32 && bb == 18);
    CHECK(ggml_type_block(GGML_TYPE_Q8_0, &be, &bb) && be == 32 && bb == 34);
    CHECK(ggml_type_block(GGML_TYPE_F16, &be, &bb) && be == 1 && bb == 2);
    CHECK(!ggml_type_block((enum ggml_type)3, &be, &bb));
    struct gguf_str s = {"abc", 3};
    CHECK(gguf_str_eq(s, "abc") && !gguf_str_eq(s, "ab") && !gguf_str_eq(s, "abcd"));
    struct gguf_str nul = {"a\0b", 3};
    CHECK(!gguf_str_eq(nul, "a"));
}

TEST_MAIN(test_open_stories_f32, test_open_stories_q8_0, test_open_stories_q4_0,
          test_open_llama_tiny, test_string_arrays, test_print, test_fp16_bf16,
          test_quant_q8_0, test_quant_q4_0, test_dequant_float_types,
          test_q8_0_file_matches_f32, test_q4_0_file_matches_f32, test_small_valid,
          test_truncated_everywhere, test_malformed, test_open_errors, test_type_names)
