/* The part of the kernel vocabulary (kern_generic.h) that is the same on every x86
 * width: lane-wise float arithmetic and the vector exp, written once over the
 * intrinsic prefix. The including ISA file (isa_avx2.c, isa_avx512.c) first defines
 *
 *   vf, VLEN            its float vector
 *   KX_PREFIX           the intrinsic prefix (_mm256, _mm512)
 *   v_round_nearest(v)  round to the nearest integer (ties to even), as floats
 *   v_ldexp(p, n)       p * 2^n for integral float n (|n| <= 127)
 *
 * and then includes this file and kern_generic.h. */
#ifndef LLMOPT_BACKEND_CPU_KERN_X86_H
#define LLMOPT_BACKEND_CPU_KERN_X86_H

#define KX_CAT2(a, b) a##b
#define KX_CAT(a, b) KX_CAT2(a, b)
#define KX(op) KX_CAT(KX_PREFIX, op)

static inline vf v_zero(void) {
    return KX(_setzero_ps)();
}
static inline vf v_set1(float f) {
    return KX(_set1_ps)(f);
}
static inline vf v_load(const float *p) {
    return KX(_loadu_ps)(p);
}
static inline void v_store(float *p, vf v) {
    KX(_storeu_ps)(p, v);
}
static inline vf v_add(vf a, vf b) {
    return KX(_add_ps)(a, b);
}
static inline vf v_sub(vf a, vf b) {
    return KX(_sub_ps)(a, b);
}
static inline vf v_mul(vf a, vf b) {
    return KX(_mul_ps)(a, b);
}
static inline vf v_div(vf a, vf b) {
    return KX(_div_ps)(a, b);
}
static inline vf v_max(vf a, vf b) {
    return KX(_max_ps)(a, b);
}
static inline vf v_fma(vf a, vf b, vf c) {
    return KX(_fmadd_ps)(a, b, c);
}

/* Sum of a 256-bit vector's lanes (both widths reduce through it). */
static inline float kx_hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* e^x = 2^n * e^r, n = round(x / ln 2), |r| <= ln2 / 2, e^r by a degree-6 polynomial
 * (Cephes' expf coefficients); ln 2 is split in two for an exact n * ln2_hi. */
static inline vf v_exp(vf x) {
    x = KX(_min_ps)(KX(_max_ps)(x, v_set1(-87.3365478515625f)), v_set1(88.3762626647949f));
    vf n = v_round_nearest(v_mul(x, v_set1(1.44269504088896341f)));
    vf r = KX(_fnmadd_ps)(n, v_set1(0.693359375f), x);
    r = KX(_fnmadd_ps)(n, v_set1(-2.12194440e-4f), r);
    vf p = v_set1(1.9875691500e-4f);
    p = v_fma(p, r, v_set1(1.3981999507e-3f));
    p = v_fma(p, r, v_set1(8.3334519073e-3f));
    p = v_fma(p, r, v_set1(4.1665795894e-2f));
    p = v_fma(p, r, v_set1(1.6666665459e-1f));
    p = v_fma(p, r, v_set1(5.0000001201e-1f));
    p = v_fma(p, v_mul(r, r), v_add(r, v_set1(1.0f)));
    return v_ldexp(p, n);
}

#endif
