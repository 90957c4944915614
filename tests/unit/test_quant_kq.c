/* The llama.cpp block types beyond Q8_0/Q4_0 (Q5_0, Q4_K, Q5_K, Q6_K, IQ4_XS):
 * hand-built blocks against known values, the CPU kernels' sub-block unpacking against
 * the reference dequantizers on fresh random rows, and the GGUF reader's handling of
 * these types (sizes, and a clear error for rows that are not whole blocks).
 * Quantize -> dequantize error bounds are in test_gguf_write.c. */
#include "backend/cpu/kquant.h"
#include "base/fp16.h"
#include "format/gguf.h"
#include "format/gguf_write.h"
#include "format/quant.h"
#include "format/quant_k.h"
#include "ir/ir.h"
#include "llmopt.h"
#include "test.h"

#include <inttypes.h>
#include <time.h>
#include <unistd.h>

static uint64_t rng_state;

static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [-1, 1) */
static float rng_float(void) {
    return (float)((double)(rng_next() >> 11) * 0x1p-52 - 1.0);
}

static void rng_seed_fresh(const char *what) {
    const char *env = getenv("LLMOPT_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) ^ (uint64_t)getpid();
    rng_state = seed;
    for (const char *c = what; *c; c++) rng_state = rng_state * 31 + (unsigned char)*c;
    fprintf(stderr, "  %s: seed %" PRIu64 " (set LLMOPT_TEST_SEED to repeat)\n", what, seed);
}

static void put_f16(uint16_t *dst, float v) {
    uint16_t h = fp16_from_f32(v);
    memcpy(dst, &h, 2);
}

/* ---- hand-built blocks ------------------------------------------------------------ */

static void test_q5_0_block(void) {
    block_q5_0 b;
    memset(&b, 0, sizeof b);
    put_f16(&b.d, 0.5f);
    uint32_t qh = 1u << 0 | 1u << 17;
    for (int i = 0; i < 4; i++) b.qh[i] = (uint8_t)(qh >> (8 * i));
    b.qs[0] = 0x3 | 0xa << 4; /* element 0: 3 | 16 = 19; element 16: 10 */
    b.qs[1] = 0xf;            /* element 1: 15; element 17: 0 | 16 */
    float y[32];
    quant_dequantize_row(GGML_TYPE_Q5_0, &b, y, 32);
    CHECK(y[0] == 1.5f);   /* (19 - 16) * 0.5 */
    CHECK(y[16] == -3.0f); /* (10 - 16) * 0.5 */
    CHECK(y[1] == -0.5f);  /* (15 - 16) * 0.5 */
    CHECK(y[17] == 0.0f);  /* (16 - 16) * 0.5 */
    CHECK(y[5] == -8.0f && y[31] == -8.0f);
}

static void test_q4_k_block(void) {
    block_q4_K b;
    memset(&b, 0, sizeof b);
    put_f16(&b.d, 1.0f);
    put_f16(&b.dmin, 0.5f);
    /* sub-block 0: scale 2, min 3; sub-block 5: scale 33, min 17 (6-bit values whose
     * high bits go to the top of bytes 1 and 5, low bits to byte 9) */
    b.scales[0] = 2;
    b.scales[4] = 3;
    b.scales[1] = (33 >> 4) << 6;
    b.scales[5] = (17 >> 4) << 6;
    b.scales[9] = (33 & 0xf) | (17 & 0xf) << 4;
    b.qs[0] = 7;    /* element 0 (sub-block 0, low nibble) */
    b.qs[67] = 0x90; /* element 64 * 2 + 32 + 3 = 163 (sub-block 5, high nibble): 9 */
    uint8_t sc, mn;
    quant_k_get_scale_min(b.scales, 5, &sc, &mn);
    CHECK_EQ_INT(sc, 33);
    CHECK_EQ_INT(mn, 17);
    float y[256];
    quant_dequantize_row(GGML_TYPE_Q4_K, &b, y, 256);
    CHECK(y[0] == 12.5f);    /* 1 * 2 * 7 - 0.5 * 3 */
    CHECK(y[1] == -1.5f);    /* quant 0: - 0.5 * 3 */
    CHECK(y[163] == 288.5f); /* 1 * 33 * 9 - 0.5 * 17 */
    CHECK(y[160] == -8.5f);
    CHECK(y[131] == 0.0f); /* sub-block 4: scale and min 0 */
}

static void test_q6_k_block(void) {
    block_q6_K b;
    memset(&b, 0, sizeof b);
    put_f16(&b.d, 0.25f);
    b.scales[0] = 2;
    b.scales[13] = -3;
    b.ql[0] = 5;        /* element 0: low 4 bits 5 */
    b.qh[0] = 2;        /* ... top 2 bits 2: q = 37 */
    b.ql[82] = 0xc0;    /* element 128 + 64 + 18 = 210 (half 1, group 2): low bits 12 */
    b.qh[50] = 1 << 4;  /* ... top bits 1 (bits 4..5 for group 2): q = 28 */
    float y[256];
    quant_dequantize_row(GGML_TYPE_Q6_K, &b, y, 256);
    CHECK(y[0] == 2.5f);   /* 0.25 * 2 * (37 - 32) */
    CHECK(y[210] == 3.0f); /* 0.25 * -3 * (28 - 32) */
    CHECK(y[1] == -16.0f); /* 0.25 * 2 * -32 */
    CHECK(y[146] == 0.0f); /* scale 9 is 0 */
}

static void test_iq4_xs_block(void) {
    block_iq4_xs b;
    memset(&b, 0, sizeof b);
    put_f16(&b.d, 0.5f);
    /* sub-block 0: ls 33 (factor 1) = low 1, high 2; sub-block 3: ls 30 (factor -2) */
    b.scales_l[0] = 1;
    b.scales_h = 2;
    b.scales_l[1] = 14 << 4;
    b.scales_h |= 1 << 6;
    b.qs[0] = 0x0f;        /* element 0: index 15 (113); element 16: index 0 (-127) */
    b.qs[48 + 2] = 0x38;   /* element 98: index 8 (1); element 114: index 3 (-65) */
    CHECK_EQ_INT(quant_iq4_xs_scale(&b, 0), 33);
    CHECK_EQ_INT(quant_iq4_xs_scale(&b, 3), 30);
    CHECK_EQ_INT(quant_iq4_xs_scale(&b, 1), 0);
    float y[256];
    quant_dequantize_row(GGML_TYPE_IQ4_XS, &b, y, 256);
    CHECK(y[0] == 56.5f);
    CHECK(y[16] == -63.5f);
    CHECK(y[98] == -1.0f);
    CHECK(y[114] == 65.0f);
    CHECK(y[32] == 0.5f * -32 * -127); /* sub-block 1: ls 0, factor -32 */
}

/* Q5_0 quantizer: the signed maximum maps to quant 0 exactly; layout as above. */
static void test_q5_0_quantizer(void) {
    float v[32];
    for (int j = 0; j < 32; j++) v[j] = j == 20 ? -8.0f : (float)(j % 5) * 0.5f;
    block_q5_0 b;
    quant_quantize_row_q5_0(v, &b, 32);
    CHECK(fp16_to_f32(b.d) == 0.5f); /* -8 / -16 */
    float back[32];
    quant_dequantize_row(GGML_TYPE_Q5_0, &b, back, 32);
    for (int j = 0; j < 32; j++) CHECK_MSG(back[j] == v[j], "element %d: %g vs %g", j, back[j], v[j]);
}

/* ---- unpacking for the CPU kernels -------------------------------------------------- */

static void test_unpack_matches_dequantize(void) {
    rng_seed_fresh("unpack");
    static const enum ir_dtype types[] = {IR_DTYPE_Q4_K, IR_DTYPE_Q5_K, IR_DTYPE_Q6_K, IR_DTYPE_Q5_0,
                                          IR_DTYPE_IQ4_XS};
    static const enum ggml_type gtypes[] = {GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_Q5_0,
                                            GGML_TYPE_IQ4_XS};
    enum { N = 256 * 8 };
    static float x[N], y[N];
    static uint8_t q[N * 2];
    for (size_t t = 0; t < LLMOPT_ARRAY_LEN(types); t++) {
        for (int i = 0; i < N; i++) x[i] = rng_float() * (float)(1 + i / 256) * (i % 97 == 0 ? 9.0f : 1.0f);
        CHECK(gguf_w_encode_row(gtypes[t], x, q, N));
        CHECK_EQ_INT(ir_dtype_row_bytes(types[t], N), quant_row_bytes(gtypes[t], N));
        quant_dequantize_row(gtypes[t], q, y, N);
        int bad = 0;
        for (int64_t b = 0; b < N / 32; b++) {
            struct kq_sub sub;
            kq_unpack_sub(types[t], q, b, &sub);
            for (int l = 0; l < 32; l++) {
                int h = l / 16;
                float v = sub.s[h] * (float)sub.u[l] - sub.o[h], want = y[b * 32 + l];
                if (!(fabsf(v - want) <= 1e-6f * (fabsf(sub.o[h]) + fabsf(want)) + 1e-30f) && bad++ < 3)
                    CHECK_MSG(0, "%s sub-block %lld elem %d: %g vs %g", ir_dtype_name(types[t]), (long long)b,
                              l, v, want);
            }
        }
        CHECK_EQ_INT(bad, 0);
    }
}

/* ---- GGUF reader ---------------------------------------------------------------------- */

static void test_gguf_reads_new_types(void) {
    rng_seed_fresh("gguf types");
    static const enum ggml_type types[] = {GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_Q5_0,
                                           GGML_TYPE_IQ4_XS};
    static const char *const names[] = {"a", "b", "c", "d", "e"};
    enum { ROW = 512, ROWS = 3 };
    char path[64];
    snprintf(path, sizeof path, "/tmp/llmopt_test_kq_%d.gguf", (int)getpid());
    struct llmopt_err err = {0};
    struct gguf_w *w = NULL;
    CHECK(gguf_w_create(&w, &err) == LLMOPT_OK);
    uint64_t ne[2] = {ROW, ROWS};
    for (int t = 0; t < 5; t++) CHECK(gguf_w_add_tensor(w, names[t], types[t], 2, ne, NULL, &err) == LLMOPT_OK);
    CHECK_MSG(gguf_w_begin(w, path, &err) == LLMOPT_OK, "%s", err.msg);
    static float x[ROW * ROWS];
    static uint8_t rows[5][ROW * ROWS];
    for (int t = 0; t < 5; t++) {
        for (int i = 0; i < ROW * ROWS; i++) x[i] = rng_float();
        for (int r = 0; r < ROWS; r++)
            CHECK(gguf_w_encode_row(types[t], x + r * ROW, rows[t] + r * quant_row_bytes(types[t], ROW), ROW));
        CHECK(gguf_w_write(w, rows[t], ROWS * quant_row_bytes(types[t], ROW), &err) == LLMOPT_OK);
    }
    CHECK_MSG(gguf_w_finish(w, &err) == LLMOPT_OK, "%s", err.msg);
    gguf_w_free(w);

    struct gguf_file *f = NULL;
    CHECK_MSG(gguf_open(path, &f, &err) == LLMOPT_OK, "%s", err.msg);
    if (f) {
        CHECK_EQ_INT(f->n_tensors, 5);
        for (int t = 0; t < 5 && t < (int)f->n_tensors; t++) {
            const struct gguf_tensor *gt = &f->tensors[t];
            CHECK_EQ_INT(gt->type, types[t]);
            CHECK_EQ_INT(gt->n_bytes, ROWS * quant_row_bytes(types[t], ROW));
            CHECK(!memcmp(gt->data, rows[t], gt->n_bytes));
        }
        CHECK(!strcmp(ggml_type_name(GGML_TYPE_IQ4_XS), "iq4_xs"));
        CHECK(!strcmp(ggml_type_name(GGML_TYPE_Q4_K), "q4_K"));
        /* a Q5_0 tensor (rows of 512) retyped as something whose block does not divide
         * its rows: the reader names the type and the block size */
        size_t size = f->size;
        uint8_t *copy = malloc(size);
        memcpy(copy, f->base, size);
        gguf_close(f);
        f = NULL;
        /* tensor "d": name length u64, "d", n_dims u32, ne[2] u64, then the type u32 */
        const uint8_t pattern[] = {1, 0, 0, 0, 0, 0, 0, 0, 'd', 2, 0, 0, 0};
        uint8_t *at = NULL;
        for (size_t i = 0; !at && i + sizeof pattern <= size; i++)
            if (!memcmp(copy + i, pattern, sizeof pattern)) at = copy + i;
        CHECK(at != NULL);
        if (at) {
            uint32_t type;
            memcpy(&type, at + sizeof pattern + 16, 4);
            CHECK_EQ_INT(type, GGML_TYPE_Q5_0);
            uint64_t ne0 = 96; /* a multiple of 32, not of 256 */
            memcpy(at + sizeof pattern, &ne0, 8);
            type = GGML_TYPE_Q4_K;
            memcpy(at + sizeof pattern + 16, &type, 4);
            struct gguf_file *g = NULL;
            CHECK(gguf_parse(copy, size, &g, &err) == LLMOPT_ERR_FORMAT);
            CHECK_MSG(strstr(err.msg, "not a multiple of the q4_K block size 256") != NULL, "%s", err.msg);
            gguf_close(g);
            /* an unsupported type (Q4_1) is refused by number */
            type = 3;
            memcpy(at + sizeof pattern + 16, &type, 4);
            CHECK(gguf_parse(copy, size, &g, &err) == LLMOPT_ERR_UNSUPPORTED);
            CHECK_MSG(strstr(err.msg, "type 3") != NULL, "%s", err.msg);
            gguf_close(g);
        }
        free(copy);
    }
    unlink(path);
}

TEST_MAIN(test_q5_0_block, test_q4_k_block, test_q6_k_block, test_iq4_xs_block, test_q5_0_quantizer,
          test_unpack_matches_dequantize, test_gguf_reads_new_types)
