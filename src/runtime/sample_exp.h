/* The sampler's e^x and its whole-row draw blocks, shared by the host sampler
 * (runtime/sampler.c) and the CUDA backend's draw kernels, so that both compute the
 * same bits: only float products, sums and quotients that IEEE 754 rounds exactly once
 * on every machine (none contracted into an FMA) and exact bit operations. */
#ifndef LLMOPT_RUNTIME_SAMPLE_EXP_H
#define LLMOPT_RUNTIME_SAMPLE_EXP_H

#include <math.h>

#ifdef __CUDACC__
#define SAMPLE_FN static __host__ __device__ __forceinline__
#else
#define SAMPLE_FN static inline
#endif

/* A whole-row draw (top-k and top-p off) sums the probabilities in blocks of this many
 * ids: each block's sum in id order, then the blocks' sums in order; the walk to the
 * drawn token compares against (sum of the earlier blocks) + (the block's sum so far).
 * A device reproduces that order with one thread a block. */
#define SAMPLE_DRAW_BLOCK 512

/* One float product / sum, rounded once: the device's intrinsics keep nvcc from
 * contracting them into an FMA; on the host, sampler.c is compiled with
 * -ffp-contract=off (CMakeLists.txt) for the same reason. */
#ifdef __CUDA_ARCH__
#define SAMPLE_MUL(a, b) __fmul_rn(a, b)
#define SAMPLE_ADD(a, b) __fadd_rn(a, b)
#else
#define SAMPLE_MUL(a, b) ((a) * (b))
#define SAMPLE_ADD(a, b) ((a) + (b))
#endif

/* 2^k as a float, -126 <= k <= 127. */
SAMPLE_FN float sample_pow2(int k) {
    union {
        unsigned int u;
        float f;
    } v;
    v.u = (unsigned int)(k + 127) << 23;
    return v.f;
}

/* e^x, x <= 0 in use ((logit - max) / temperature): x = k ln2 + r with k = x / ln2
 * rounded to nearest even (the 1.5 * 2^23 trick), |r| <= ln2 / 2, e^r by its Taylor
 * series to r^7 (truncation < 5e-9 relative) in Horner form, times 2^k as two exact
 * factors. 0 at and below -87 (and for -inf and NaN), where e^x would be within a few
 * steps of the subnormal range: a token that far below the best one (1.6e-38 of its
 * probability) is not a candidate, and no product is subnormal, which x86 cores run
 * ~3x slower. x is taken as at most 88. Within 1.2 ulp of e^x (test_sampler).
 * Plain products and sums, no libm call and no branch, so a host loop vectorizes:
 * fmaf is a slow library routine on x86-64 hosts without FMA (sampling a 151936 row
 * took 3x longer with it). */
SAMPLE_FN float sample_exp(float x) {
    const float xc = x > -87.0f ? (x < 88.0f ? x : 88.0f) : -87.0f;
    const float magic = 12582912.0f; /* 1.5 * 2^23 */
    const float k = SAMPLE_ADD(SAMPLE_ADD(SAMPLE_MUL(xc, 1.44269504f), magic), -magic);
    /* ln2 split: k times the 15-bit head is exact, and so is xc minus it (Sterbenz) */
    float r = SAMPLE_ADD(xc, SAMPLE_MUL(k, -0.693145751953125f));
    r = SAMPLE_ADD(r, SAMPLE_MUL(k, -1.4286068203094172e-06f));
    float p = 1.98412698e-4f; /* 1/7! */
    p = SAMPLE_ADD(SAMPLE_MUL(p, r), 1.38888889e-3f);
    p = SAMPLE_ADD(SAMPLE_MUL(p, r), 8.33333333e-3f);
    p = SAMPLE_ADD(SAMPLE_MUL(p, r), 4.16666667e-2f);
    p = SAMPLE_ADD(SAMPLE_MUL(p, r), 1.66666667e-1f);
    p = SAMPLE_ADD(SAMPLE_MUL(p, r), 0.5f);
    p = SAMPLE_ADD(SAMPLE_MUL(p, r), 1.0f);
    p = SAMPLE_ADD(SAMPLE_MUL(p, r), 1.0f);
    const int ki = (int)k, k1 = ki / 2; /* ki in [-126, 127]: both halves in range */
    const float v = SAMPLE_MUL(SAMPLE_MUL(p, sample_pow2(k1)), sample_pow2(ki - k1));
    return x > -87.0f ? v : 0.0f;
}

#if defined(__SSE2__) && !defined(__CUDACC__)
#include <emmintrin.h>

/* sample_exp on 4 lanes: the same operations lane by lane (SSE2 products and sums are
 * IEEE single precision, rounded once), so the same bits (test_sampler); 288 against
 * 620 us a 151936 row for the scalar form and 352 for glibc's expf (Zen 5 host). */
static inline __m128 sample_exp4(__m128 x) {
    const __m128 lo = _mm_set1_ps(-87.0f);
    const __m128 live = _mm_cmpgt_ps(x, lo); /* false for NaN, as x > -87.0f */
    __m128 xc = _mm_min_ps(x, _mm_set1_ps(88.0f)); /* NaN lanes are masked out below */
    xc = _mm_or_ps(_mm_and_ps(live, xc), _mm_andnot_ps(live, lo));
    const __m128 magic = _mm_set1_ps(12582912.0f);
    const __m128 k = _mm_sub_ps(_mm_add_ps(_mm_mul_ps(xc, _mm_set1_ps(1.44269504f)), magic), magic);
    __m128 r = _mm_add_ps(xc, _mm_mul_ps(k, _mm_set1_ps(-0.693145751953125f)));
    r = _mm_add_ps(r, _mm_mul_ps(k, _mm_set1_ps(-1.4286068203094172e-06f)));
    __m128 p = _mm_set1_ps(1.98412698e-4f);
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.38888889e-3f));
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(8.33333333e-3f));
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(4.16666667e-2f));
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.66666667e-1f));
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(0.5f));
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.0f));
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.0f));
    const __m128i ki = _mm_cvttps_epi32(k);
    /* k1 = ki / 2 rounded toward zero: (ki + (ki < 0)) >> 1 */
    const __m128i k1 = _mm_srai_epi32(_mm_sub_epi32(ki, _mm_srai_epi32(ki, 31)), 1);
    const __m128i bias = _mm_set1_epi32(127);
    const __m128 f1 = _mm_castsi128_ps(_mm_slli_epi32(_mm_add_epi32(k1, bias), 23));
    const __m128 f2 = _mm_castsi128_ps(_mm_slli_epi32(_mm_add_epi32(_mm_sub_epi32(ki, k1), bias), 23));
    const __m128 v = _mm_mul_ps(_mm_mul_ps(p, f1), f2);
    return _mm_and_ps(live, v);
}
#endif

#endif
