/* K-quant block layouts (ggml-compatible: Q4_K, Q5_K, Q6_K) and scalar reference
 * quantizers / dequantizers. A super-block holds QK_K = 256 elements.
 *
 * Q4_K and Q5_K split a super-block into 8 sub-blocks of 32 elements; sub-block j
 * has a 6-bit scale sc[j] and a 6-bit min mn[j]:  x = d * sc[j] * q - dmin * mn[j],
 * q in 0..15 (Q4_K) or 0..31 (Q5_K). The 16 six-bit numbers are packed in 12 bytes:
 *   bytes 0..3:  sc[0..3] in bits 0..5, bits 4..5 of sc[4..7] in bits 6..7
 *   bytes 4..7:  mn[0..3] in bits 0..5, bits 4..5 of mn[4..7] in bits 6..7
 *   bytes 8..11: bits 0..3 of sc[4..7] in the low nibble, of mn[4..7] in the high one
 * Quants: each 64-element chunk c takes 32 bytes of qs; element 64c + l sits in the low
 * nibble of qs[32c + l] and element 64c + 32 + l in its high nibble (l < 32). Q5_K adds
 * the fifth bit of element 32j + l as bit j of qh[l].
 *
 * Q6_K: 16 sub-blocks of 16 elements, each with a signed 8-bit scale:
 * x = d * scales[e / 16] * (q - 32), q in 0..63. Each 128-element half h uses
 * ql[64h ..], qh[32h ..]; element 128h + 32g + l (g < 4, l < 32) keeps its low 4 bits in
 * ql[64h + l + 32 * (g & 1)] (low nibble for g < 2, high nibble for g >= 2) and its top
 * 2 bits in bits 2g..2g+1 of qh[32h + l].
 *
 * IQ4_XS (same super-block of 256): 8 sub-blocks of 32, each with a 6-bit scale ls[j]
 * (low 4 bits in nibble j % 2 of scales_l[j / 2], high 2 bits in bits 2j..2j+1 of
 * scales_h): x = d * (ls[j] - 32) * iq4nl_values[q], q a 4-bit index into the
 * non-linear table below. Sub-block j takes qs[16j ..]: element l < 16 in the low
 * nibble of qs[16j + l], element 16 + l in its high nibble. */
#ifndef LLMOPT_FORMAT_QUANT_K_H
#define LLMOPT_FORMAT_QUANT_K_H

#include "format/gguf.h"

#include <assert.h> /* static_assert, in C and C++ (the CUDA upload reads these layouts) */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define QK_K         256
#define K_SCALE_SIZE 12

typedef struct {
    uint16_t d;                   /* f16 super-block scale of the sub-block scales */
    uint16_t dmin;                /* f16 super-block scale of the sub-block mins */
    uint8_t scales[K_SCALE_SIZE]; /* 8 scales + 8 mins, 6 bits each (packing above) */
    uint8_t qs[QK_K / 2];         /* (128) 4-bit quants */
} block_q4_K;
static_assert(sizeof(block_q4_K) == 144, "block_q4_K must be 144 bytes");

typedef struct {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8]; /* (32) fifth bits */
    uint8_t qs[QK_K / 2]; /* (128) low 4 bits */
} block_q5_K;
static_assert(sizeof(block_q5_K) == 176, "block_q5_K must be 176 bytes");

/* IQ4_XS's (and IQ4_NL's) 16 levels, ascending. */
extern const int8_t iq4nl_values[16];

typedef struct {
    uint16_t d;               /* f16 super-block scale */
    uint16_t scales_h;        /* high 2 bits of the 8 sub-block scales */
    uint8_t scales_l[QK_K / 64]; /* (4) low 4 bits of the sub-block scales */
    uint8_t qs[QK_K / 2];     /* (128) 4-bit table indices */
} block_iq4_xs;
static_assert(sizeof(block_iq4_xs) == 136, "block_iq4_xs must be 136 bytes");

/* Sub-block j (0..7) of an IQ4_XS block as its 32 table values (-127..113), x = d *
 * (ls[j] - 32) * v (the layout above). The dequantizer, the CPU kernels' unpacking and
 * the CUDA upload (as q8_0) all take it. */
static inline void quant_iq4_xs_ints(const block_iq4_xs *b, int j, int8_t v[32]) {
    for (int l = 0; l < 16; l++) {
        v[l] = iq4nl_values[b->qs[16 * j + l] & 0x0f];
        v[l + 16] = iq4nl_values[b->qs[16 * j + l] >> 4];
    }
}

typedef struct {
    uint8_t ql[QK_K / 2];     /* (128) low 4 bits */
    uint8_t qh[QK_K / 4];     /* (64) top 2 bits */
    int8_t scales[QK_K / 16]; /* (16) signed sub-block scales */
    uint16_t d;               /* f16 super-block scale */
} block_q6_K;
static_assert(sizeof(block_q6_K) == 210, "block_q6_K must be 210 bytes");

/* The types of this file (Q4_K, Q5_K, Q6_K, IQ4_XS). */
bool quant_k_is_k_type(enum ggml_type type);

/* Unpacks sub-block j's (0..7) 6-bit scale and min from a Q4_K/Q5_K scales array. */
void quant_k_get_scale_min(const uint8_t scales[K_SCALE_SIZE], int j, uint8_t *sc, uint8_t *mn);
/* Sub-block j's (0..7) 6-bit scale of an IQ4_XS block (0..63; the factor is ls - 32). */
int quant_iq4_xs_scale(const block_iq4_xs *b, int j);

/* dst[0..n) = the values of a row of one of this file's types; n a multiple of QK_K (asserted). src
 * needs no particular alignment. */
void quant_k_dequantize_row(enum ggml_type type, const void *src, float *dst, int64_t n);

/* Reference quantizers: n a multiple of QK_K (asserted); dst receives n / QK_K
 * blocks. Each sub-block's scale (and min) is fitted by least squares over a few
 * candidate grids; finite input gives finite output; non-finite input gives
 * unspecified quants but no undefined behaviour. */
void quant_k_quantize_row_q4_K(const float *src, void *dst, int64_t n);
void quant_k_quantize_row_q5_K(const float *src, void *dst, int64_t n);
void quant_k_quantize_row_q6_K(const float *src, void *dst, int64_t n);
/* IQ4_XS: each sub-block's scale is fitted (a few candidates, least squares) against
 * the non-linear table, then quantized to 6 bits against the f16 super-block scale,
 * and every element takes the table entry nearest to it under the stored scale. */
void quant_k_quantize_row_iq4_xs(const float *src, void *dst, int64_t n);

#endif
