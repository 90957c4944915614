/* Shared pieces of the CPU kernels for llama.cpp's other block types (Q4_K, Q5_K, Q6_K,
 * Q5_0, IQ4_XS; kernels.h's cpu_kq_kernels).
 *
 * Every one of these types is affine per sub-block of 32 values (per 16 for Q6_K):
 * value i = s * u[i] - o with unsigned quants u, so a dot product with quantized
 * activations (x ~= qx * dx) is dx * (s * sum(u * qx) - o * sum(qx)) per sub-block,
 * integer dot products plus the activation block sums the quantizer already keeps.
 * kq_unpack_sub writes a sub-block in that form; the scalar tiles and the packed GEMM
 * panels are built from it. */
#ifndef LLMOPT_BACKEND_CPU_KQUANT_H
#define LLMOPT_BACKEND_CPU_KQUANT_H

#include "backend/cpu/kernels.h"

#include <stdint.h>

/* One sub-block of 32 values: value i = s[i / 16] * u[i] - o[i / 16]; the halves share
 * s and o except for Q6_K (kq_halves 2). */
struct kq_sub {
    uint8_t u[32];
    float s[2], o[2];
};

/* Sub-block b (values 32b .. 32b + 31) of the row at `row` of type t. */
void kq_unpack_sub(enum ir_dtype t, const uint8_t *row, int64_t b, struct kq_sub *out);

/* Sub-blocks of 16 with their own scale (Q6_K) rather than 32. */
static inline int kq_halves(enum ir_dtype t) {
    return t == IR_DTYPE_Q6_K ? 2 : 1;
}

extern const struct cpu_kq_kernels cpu_kq_kernels_scalar;
#if defined(__x86_64__) || defined(__i386__)
extern const struct cpu_kq_kernels cpu_kq_kernels_avx2;
extern const struct cpu_kq_kernels cpu_kq_kernels_avx512;
#endif

#endif
