/* A 16 x 16 transpose of 32-bit lanes in AVX-512 registers, shared by the AVX-512 files
 * (isa_avx512.c: the float GEMM pack, the block types' pack, the vocabulary's
 * v_transpose; isa_kquant_avx512.c: the K-quant GEMM pack). Include it after the
 * file's `#pragma GCC target` that enables avx512f. */
#ifndef LLMOPT_BACKEND_CPU_TRANSPOSE_AVX512_H
#define LLMOPT_BACKEND_CPU_TRANSPOSE_AVX512_H

#include <immintrin.h>

/* out[j][i] = in[i][j] for a 16 x 16 float block (the vocabulary's v_transpose): 32-bit, then 64-bit interleaves
 * within 128-bit lanes, then a 4 x 4 transpose of the lanes. */
static inline __attribute__((always_inline)) void transpose16(const __m512 *in, __m512 *out) {
    __m512 a[16], b[16];
    for (int m = 0; m < 8; m++) {
        a[2 * m] = _mm512_unpacklo_ps(in[2 * m], in[2 * m + 1]);
        a[2 * m + 1] = _mm512_unpackhi_ps(in[2 * m], in[2 * m + 1]);
    }
    /* b[4n + e], 128-bit lane L: columns 4n..4n+3 of element 4L + e */
    for (int n = 0; n < 4; n++) {
        b[4 * n + 0] = _mm512_shuffle_ps(a[4 * n], a[4 * n + 2], 0x44);
        b[4 * n + 1] = _mm512_shuffle_ps(a[4 * n], a[4 * n + 2], 0xee);
        b[4 * n + 2] = _mm512_shuffle_ps(a[4 * n + 1], a[4 * n + 3], 0x44);
        b[4 * n + 3] = _mm512_shuffle_ps(a[4 * n + 1], a[4 * n + 3], 0xee);
    }
    for (int e = 0; e < 4; e++) {
        __m512 c0 = _mm512_shuffle_f32x4(b[e], b[4 + e], 0x88), c1 = _mm512_shuffle_f32x4(b[e], b[4 + e], 0xdd);
        __m512 c2 = _mm512_shuffle_f32x4(b[8 + e], b[12 + e], 0x88);
        __m512 c3 = _mm512_shuffle_f32x4(b[8 + e], b[12 + e], 0xdd);
        out[0 + e] = _mm512_shuffle_f32x4(c0, c2, 0x88);
        out[8 + e] = _mm512_shuffle_f32x4(c0, c2, 0xdd);
        out[4 + e] = _mm512_shuffle_f32x4(c1, c3, 0x88);
        out[12 + e] = _mm512_shuffle_f32x4(c1, c3, 0xdd);
    }
}

#endif
