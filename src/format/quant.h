/* On-disk quant block layouts (ggml-compatible) and scalar reference
 * (de)quantizers. The reference functions are the oracle for every optimized
 * kernel and the quantizer of the `quantize` tool; they favour clarity over speed.
 *
 * A row of n elements of a block type is n / block_elems consecutive blocks; every
 * block scale `d` is an IEEE f16 bit pattern (see base/fp16.h). */
#ifndef LLMOPT_FORMAT_QUANT_H
#define LLMOPT_FORMAT_QUANT_H

#include "format/gguf.h"
#include "ir/ir.h"

#include <assert.h> /* static_assert, in C and C++ (the CUDA upload reads these layouts) */
#include <stddef.h>
#include <stdint.h>

#define QK8_0 32
#define QK4_0 32
#define QK5_0 32

/* Q8_0: x[i] = qs[i] * d. */
typedef struct {
    uint16_t d;        /* f16 scale */
    int8_t qs[QK8_0];  /* (32) signed quants */
} block_q8_0;
static_assert(sizeof(block_q8_0) == 2 + QK8_0, "block_q8_0 must be 34 bytes");

/* Q4_0: byte j holds element j in its low nibble and element j + 16 in its high
 * nibble; x = (nibble - 8) * d. */
typedef struct {
    uint16_t d;            /* f16 scale */
    uint8_t qs[QK4_0 / 2]; /* (16) nibble pairs */
} block_q4_0;
static_assert(sizeof(block_q4_0) == 2 + QK4_0 / 2, "block_q4_0 must be 18 bytes");

/* Q5_0: element j (j < 16) has its low 4 bits in the low nibble of qs[j], element
 * j + 16 in the high nibble; bit i of the little-endian u32 qh is element i's fifth
 * bit; x = (q - 16) * d. */
typedef struct {
    uint16_t d;            /* f16 scale */
    uint8_t qh[4];         /* fifth bits */
    uint8_t qs[QK5_0 / 2]; /* (16) nibble pairs */
} block_q5_0;
static_assert(sizeof(block_q5_0) == 6 + QK5_0 / 2, "block_q5_0 must be 22 bytes");

/* A Q5_0 block's 32 values as the signed integers q - 16 (-16..15), x = q * d (the
 * layout above). The one reading of the bits: the dequantizer, the CPU kernels' unpacking
 * and the CUDA upload (as q8_0) all take it. */
static inline void quant_q5_0_ints(const block_q5_0 *b, int8_t q[QK5_0]) {
    const uint32_t qh =
        (uint32_t)b->qh[0] | (uint32_t)b->qh[1] << 8 | (uint32_t)b->qh[2] << 16 | (uint32_t)b->qh[3] << 24;
    for (int j = 0; j < QK5_0 / 2; j++) {
        q[j] = (int8_t)((int)((b->qs[j] & 0x0fu) | ((qh >> j) & 1u) << 4) - 16);
        q[j + QK5_0 / 2] = (int8_t)((int)((b->qs[j] >> 4) | ((qh >> (j + 16)) & 1u) << 4) - 16);
    }
}

/* Bytes taken by a row of n elements of type; 0 when the type is unsupported or
 * n is negative or not a multiple of the type's block size. */
size_t quant_row_bytes(enum ggml_type type, int64_t n);

/* dst[0..n) = values of the row at src (every type gguf.h names: F32, F16, BF16,
 * Q8_0, Q4_0, Q5_0 and quant_k.h's K types). n must be a
 * multiple of the block size and the type supported (asserted: a caller bug). src
 * needs no particular alignment. */
void quant_dequantize_row(enum ggml_type type, const void *src, float *dst, int64_t n);

/* The IR's name for a GGUF tensor type and back (F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_K,
 * Q5_K, Q6_K, IQ4_XS): false, *out untouched, for a type the other side has no name for. */
bool quant_ir_dtype_of(enum ggml_type type, enum ir_dtype *out);
bool quant_ggml_type_of(enum ir_dtype dtype, enum ggml_type *out);

/* Reference quantizers, bit-identical to ggml's reference ones for finite input
 * (non-finite input gives unspecified quants but no undefined behaviour).
 * n must be a multiple of 32; dst receives n / 32 blocks. */
void quant_quantize_row_q8_0(const float *src, void *dst, int64_t n);
void quant_quantize_row_q4_0(const float *src, void *dst, int64_t n);
void quant_quantize_row_q5_0(const float *src, void *dst, int64_t n);

#endif
