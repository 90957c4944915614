#include "format/quant.h"

#include "base/fp16.h"
#include "format/quant_k.h"

#include <math.h>
#include <string.h>

size_t quant_row_bytes(enum ggml_type type, int64_t n) {
    uint32_t block_elems, block_bytes;
    if (n < 0 || !ggml_type_block(type, &block_elems, &block_bytes))
        return 0;
    if ((uint64_t)n % block_elems)
        return 0;
    uint64_t blocks = (uint64_t)n / block_elems;
    if (blocks > SIZE_MAX / block_bytes)
        return 0;
    return (size_t)(blocks * block_bytes);
}

/* Blocks are copied out with memcpy: rows inside a mapping or a fuzzer's buffer
 * need not be aligned for the struct. */
static void dequantize_q8_0(const uint8_t *src, float *dst, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; b++) {
        block_q8_0 blk;
        memcpy(&blk, src + b * (int64_t)sizeof blk, sizeof blk);
        float d = fp16_to_f32(blk.d);
        for (int j = 0; j < QK8_0; j++)
            dst[b * QK8_0 + j] = (float)blk.qs[j] * d;
    }
}

static void dequantize_q4_0(const uint8_t *src, float *dst, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; b++) {
        block_q4_0 blk;
        memcpy(&blk, src + b * (int64_t)sizeof blk, sizeof blk);
        float d = fp16_to_f32(blk.d);
        float *y = dst + b * QK4_0;
        for (int j = 0; j < QK4_0 / 2; j++) {
            y[j] = (float)((int)(blk.qs[j] & 0x0f) - 8) * d;
            y[j + QK4_0 / 2] = (float)((int)(blk.qs[j] >> 4) - 8) * d;
        }
    }
}

static void dequantize_q5_0(const uint8_t *src, float *dst, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; b++) {
        block_q5_0 blk;
        memcpy(&blk, src + b * (int64_t)sizeof blk, sizeof blk);
        float d = fp16_to_f32(blk.d);
        int8_t q[QK5_0];
        quant_q5_0_ints(&blk, q);
        float *y = dst + b * QK5_0;
        for (int j = 0; j < QK5_0; j++) y[j] = (float)q[j] * d;
    }
}

/* The types both sides name (quant_ir_dtype_of / quant_ggml_type_of). */
static const struct {
    enum ggml_type ggml;
    enum ir_dtype ir;
} type_names[] = {
    {GGML_TYPE_F32, IR_DTYPE_F32},   {GGML_TYPE_F16, IR_DTYPE_F16},
    {GGML_TYPE_BF16, IR_DTYPE_BF16}, {GGML_TYPE_Q8_0, IR_DTYPE_Q8_0},
    {GGML_TYPE_Q4_0, IR_DTYPE_Q4_0}, {GGML_TYPE_Q5_0, IR_DTYPE_Q5_0},
    {GGML_TYPE_Q4_K, IR_DTYPE_Q4_K}, {GGML_TYPE_Q5_K, IR_DTYPE_Q5_K},
    {GGML_TYPE_Q6_K, IR_DTYPE_Q6_K}, {GGML_TYPE_IQ4_XS, IR_DTYPE_IQ4_XS},
};

bool quant_ir_dtype_of(enum ggml_type type, enum ir_dtype *out) {
    for (size_t i = 0; i < sizeof type_names / sizeof type_names[0]; i++)
        if (type_names[i].ggml == type) {
            *out = type_names[i].ir;
            return true;
        }
    return false;
}

bool quant_ggml_type_of(enum ir_dtype dtype, enum ggml_type *out) {
    for (size_t i = 0; i < sizeof type_names / sizeof type_names[0]; i++)
        if (type_names[i].ir == dtype) {
            *out = type_names[i].ggml;
            return true;
        }
    return false;
}

void quant_dequantize_row(enum ggml_type type, const void *src, float *dst, int64_t n) {
    const uint8_t *s = src;
    LLMOPT_ASSERT(n >= 0);
    switch (type) {
    case GGML_TYPE_F32:
        memcpy(dst, s, (size_t)n * sizeof(float));
        return;
    case GGML_TYPE_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, sizeof h);
            dst[i] = fp16_to_f32(h);
        }
        return;
    case GGML_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, sizeof h);
            dst[i] = bf16_to_f32(h);
        }
        return;
    case GGML_TYPE_Q8_0:
        LLMOPT_ASSERT(n % QK8_0 == 0);
        dequantize_q8_0(s, dst, n / QK8_0);
        return;
    case GGML_TYPE_Q4_0:
        LLMOPT_ASSERT(n % QK4_0 == 0);
        dequantize_q4_0(s, dst, n / QK4_0);
        return;
    case GGML_TYPE_Q5_0:
        LLMOPT_ASSERT(n % QK5_0 == 0);
        dequantize_q5_0(s, dst, n / QK5_0);
        return;
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K:
    case GGML_TYPE_Q6_K:
    case GGML_TYPE_IQ4_XS:
        quant_k_dequantize_row(type, src, dst, n);
        return;
    default:
        break;
    }
    LLMOPT_ASSERT(!"quant_dequantize_row: unsupported type");
}

/* (int)v truncated into [lo, hi]; NaN gives lo. */
static int clamp_to_int(float v, int lo, int hi) {
    if (v >= (float)hi)
        return hi;
    if (v > (float)lo)
        return (int)v;
    return lo;
}

/* The element of x[0..n) of largest magnitude, its sign kept (the first one on ties;
 * 0 when all are 0 or NaN). */
static float signed_amax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

void quant_quantize_row_q8_0(const float *src, void *dst, int64_t n) {
    LLMOPT_ASSERT(n >= 0 && n % QK8_0 == 0);
    uint8_t *out = dst;
    for (int64_t b = 0; b < n / QK8_0; b++) {
        const float *x = src + b * QK8_0;
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        block_q8_0 blk;
        blk.d = fp16_from_f32(d);
        for (int j = 0; j < QK8_0; j++) {
            /* |x * id| <= 127 for finite input; the clamp only keeps NaN/inf from
             * reaching an undefined float -> int conversion */
            blk.qs[j] = (int8_t)clamp_to_int(roundf(x[j] * id), -127, 127);
        }
        memcpy(out + b * (int64_t)sizeof blk, &blk, sizeof blk);
    }
}

void quant_quantize_row_q4_0(const float *src, void *dst, int64_t n) {
    LLMOPT_ASSERT(n >= 0 && n % QK4_0 == 0);
    uint8_t *out = dst;
    for (int64_t b = 0; b < n / QK4_0; b++) {
        const float *x = src + b * QK4_0;
        /* the element of largest magnitude maps to quant 0, i.e. -8 * d, so the
         * opposite side gets the extra level */
        float d = signed_amax(x, QK4_0) / -8.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        block_q4_0 blk;
        blk.d = fp16_from_f32(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            /* x * id + 8.5 lies in [0.5, 16.5] for finite input; truncating and
             * capping at 15 is round-to-nearest onto 0..15 */
            float v0 = x[j] * id + 8.5f;
            float v1 = x[j + QK4_0 / 2] * id + 8.5f;
            int q0 = clamp_to_int(v0, 0, 15);
            int q1 = clamp_to_int(v1, 0, 15);
            blk.qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
        memcpy(out + b * (int64_t)sizeof blk, &blk, sizeof blk);
    }
}

void quant_quantize_row_q5_0(const float *src, void *dst, int64_t n) {
    LLMOPT_ASSERT(n >= 0 && n % QK5_0 == 0);
    uint8_t *out = dst;
    for (int64_t b = 0; b < n / QK5_0; b++) {
        const float *x = src + b * QK5_0;
        /* as Q4_0: the element of largest magnitude maps to quant 0 (-16 * d) */
        float d = signed_amax(x, QK5_0) / -16.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        block_q5_0 blk;
        blk.d = fp16_from_f32(d);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_0 / 2; j++) {
            int q0 = clamp_to_int(x[j] * id + 16.5f, 0, 31);
            int q1 = clamp_to_int(x[j + QK5_0 / 2] * id + 16.5f, 0, 31);
            blk.qs[j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
            qh |= (uint32_t)(q0 >> 4) << j | (uint32_t)(q1 >> 4) << (j + 16);
        }
        for (int i = 0; i < 4; i++) blk.qh[i] = (uint8_t)(qh >> (8 * i));
        memcpy(out + b * (int64_t)sizeof blk, &blk, sizeof blk);
    }
}
