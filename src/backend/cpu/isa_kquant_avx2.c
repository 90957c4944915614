/* AVX2 kernels for the types of cpu_kq_kernels (kquant_simd.h): int8 dot products with
 * maddubs (u8 x s8 pairs to s16, no saturation for |w| <= 127 or u <= 63) and madd. No
 * packed GEMM: the tiles serve every row count. */
#if defined(__x86_64__) || defined(__i386__)
#ifndef __clang__ /* (clang: the same features as flags from CMakeLists.txt) */
#pragma GCC target("avx2,fma,f16c")
#endif

#include <immintrin.h>

static inline __m256i kq_avx2_dotu(__m256i init, __m256i u, __m256i x) {
    return _mm256_add_epi32(init, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)));
}
/* |w| * sign(x, w) = w * x, with maddubs's unsigned operand |w| <= 127 */
static inline __m256i kq_avx2_dots(__m256i w, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w)), _mm256_set1_epi16(1));
}
#define KQ_DOTU(init, u, x) kq_avx2_dotu(init, u, x)
#define KQ_DOTS(corr, w, x) kq_avx2_dots(w, x)
#define KQ_PASS_R 2

#include "backend/cpu/kquant_simd.h"

const struct cpu_kq_kernels cpu_kq_kernels_avx2 = {
    .tile_q4_k = kq_tile_q4_k,
    .tile_q5_k = kq_tile_q5_k,
    .tile_q6_k = kq_tile_q6_k,
    .tile_q5_0 = kq_tile_q5_0_fn,
    .tile_iq4_xs = kq_tile_iq4_xs,
};

#endif
