/* AVX-512 kernels (Ice Lake / Sapphire Rapids / Zen 4): 512-bit float paths, and
 * integer dot products with VNNI (vpdpbusd on 256-bit registers, where it issues on
 * two ports). Nothing here runs unless cpu_isa_available(CPU_ISA_AVX512). */
#if defined(__x86_64__) || defined(__i386__)
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")

#include "backend/cpu/kernels.h"
#include "base/fp16.h"
#include "format/quant.h"

#include <immintrin.h>
#include <string.h>

typedef __m512 vf;
#define VLEN 16
#define TILE_PASS_R 4

static inline __mmask16 lane_mask(int n) {
    return (__mmask16)((1u << n) - 1u);
}
static inline vf v_zero(void) {
    return _mm512_setzero_ps();
}
static inline vf v_set1(float f) {
    return _mm512_set1_ps(f);
}
static inline vf v_load(const float *p) {
    return _mm512_loadu_ps(p);
}
static inline vf v_load_n(const float *p, int n) {
    return _mm512_maskz_loadu_ps(lane_mask(n), p);
}
static inline vf v_load_f16(const uint8_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)p));
}
static inline vf v_load_f16_n(const uint8_t *p, int n) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lane_mask(n), p));
}
static inline vf bf16_widen(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
static inline vf v_load_bf16(const uint8_t *p) {
    return bf16_widen(_mm256_loadu_si256((const __m256i *)(const void *)p));
}
static inline vf v_load_bf16_n(const uint8_t *p, int n) {
    return bf16_widen(_mm256_maskz_loadu_epi16(lane_mask(n), p));
}
static inline void v_store(float *p, vf v) {
    _mm512_storeu_ps(p, v);
}
static inline void v_store_n(float *p, vf v, int n) {
    _mm512_mask_storeu_ps(p, lane_mask(n), v);
}
static inline vf v_add(vf a, vf b) {
    return _mm512_add_ps(a, b);
}
static inline vf v_sub(vf a, vf b) {
    return _mm512_sub_ps(a, b);
}
static inline vf v_mul(vf a, vf b) {
    return _mm512_mul_ps(a, b);
}
static inline vf v_max(vf a, vf b) {
    return _mm512_max_ps(a, b);
}
static inline vf v_fma(vf a, vf b, vf c) {
    return _mm512_fmadd_ps(a, b, c);
}
static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline float v_hsum(vf v) {
    __m256 lo = _mm512_castps512_ps256(v);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    return hsum256(_mm256_add_ps(lo, hi));
}
static inline float v_hmax(vf v) {
    return _mm512_reduce_max_ps(v);
}
/* e^x = 2^n * e^r as in the AVX2 file; scalef applies 2^n. */
static inline vf v_exp(vf x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3365478515625f)),
                      _mm512_set1_ps(88.3762626647949f));
    vf n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vf r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    vf p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

#include "backend/cpu/kern_generic.h"

/* ---- int8 -------------------------------------------------------------------------- */

static inline float f16_scale(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

static void quantize_row(const float *x, const struct cpu_qact *qa, int64_t r) {
    int64_t k = qa->k;
    int8_t *qs = qa->qs + r * k;
    float *d = qa->d + r * (k / CPU_QBLOCK);
    int32_t *corr = qa->corr + r * (k / 4);
    const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    const __m256i ones8 = _mm256_set1_epi8(1);
    for (int64_t b = 0; b < k / CPU_QBLOCK; b++) {
        const float *xb = x + b * CPU_QBLOCK;
        __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
        float m = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        float db = m / 127.0f, id = db != 0.0f ? 1.0f / db : 0.0f;
        d[b] = db;
        __m512 vid = _mm512_set1_ps(id);
        __m512i i0 = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v0, vid), lo), hi));
        __m512i i1 = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v1, vid), lo), hi));
        __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtsepi32_epi8(i0)),
                                            _mm512_cvtsepi32_epi8(i1), 1);
        _mm256_storeu_si256((__m256i *)(void *)(qs + b * CPU_QBLOCK), q);
        __m256i quad = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones8, q);
        _mm256_storeu_si256((__m256i *)(void *)(corr + b * 8),
                            _mm256_slli_epi32(_mm256_sub_epi32(_mm256_setzero_si256(), quad), 7));
    }
}

/* Weights biased to unsigned bytes (w + 128, or 16 * nibble for Q4_0) as vpdpbusd's
 * unsigned operand; the accumulator starts at corr = -128 * quad sums of x, which
 * removes the bias exactly: sum (w + 128) x - 128 sum x = sum w x. */
static inline __attribute__((always_inline)) void tile_q_rc(const struct cpu_qact *qa, int64_t r0,
                                                            const uint8_t *w, size_t ldw, float *out,
                                                            const int q4, const int nr, const int nc) {
    const int64_t k = qa->k, nb = k / CPU_QBLOCK;
    const size_t blk_bytes = q4 ? sizeof(block_q4_0) : sizeof(block_q8_0);
    const __m256i flip = _mm256_set1_epi8((char)0x80), high4 = _mm256_set1_epi8((char)0xf0);
    const __m256i shift = _mm256_setr_epi32(4, 4, 4, 4, 0, 0, 0, 0);
    /* 16 * nibble: the product comes out 16x, the scale takes 1/16 back (exact) */
    const float wscale = q4 ? 1.0f / 16.0f : 1.0f;
    __m256 acc[CPU_TILE_R][CPU_TILE_C];
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) acc[r][c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i wu[CPU_TILE_C];
        float dw[CPU_TILE_C];
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) {
            const uint8_t *blk = w + c * ldw + b * (int64_t)blk_bytes;
            if (q4) {
                __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(blk + 2)));
                wu[c] = _mm256_and_si256(_mm256_sllv_epi32(q, shift), high4);
            } else {
                wu[c] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(const void *)(blk + 2)), flip);
            }
            dw[c] = f16_scale(blk) * wscale;
        }
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            const int64_t row = r0 + r;
            __m256i xq = _mm256_loadu_si256((const __m256i *)(const void *)(qa->qs + row * k + b * CPU_QBLOCK));
            const int32_t *cr = qa->corr + row * (k / 4) + b * 8;
            __m256 dx = _mm256_broadcast_ss(qa->d + row * nb + b);
#pragma GCC unroll 4
            for (int c = 0; c < nc; c++) {
                __m256i s = _mm256_dpbusd_epi32(_mm256_loadu_si256((const __m256i *)(const void *)cr), wu[c], xq);
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(_mm256_set1_ps(dw[c]), dx),
                                            acc[r][c]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) out[r * CPU_TILE_C + c] = hsum256(acc[r][c]);
}

#define Q8_CALL(R, C) tile_q_rc(qa, r0, w, ldw, out, 0, R, C)
#define Q4_CALL(R, C) tile_q_rc(qa, r0, w, ldw, out, 1, R, C)

static void tile_q8_0(const struct cpu_qact *qa, int64_t r0, const uint8_t *w, size_t ldw, int nr,
                      int nc, float *out) {
    KG_TILE_SWITCH(nr, nc, Q8_CALL)
}

static void tile_q4_0(const struct cpu_qact *qa, int64_t r0, const uint8_t *w, size_t ldw, int nr,
                      int nc, float *out) {
    KG_TILE_SWITCH(nr, nc, Q4_CALL)
}

const struct cpu_isa_kernels cpu_isa_kernels_avx512 = {
    .isa = CPU_ISA_AVX512,
    .tile_f32 = kg_tile_f32,
    .tile_f16 = kg_tile_f16,
    .tile_bf16 = kg_tile_bf16,
    .tile_q8_0 = tile_q8_0,
    .tile_q4_0 = tile_q4_0,
    .quantize_row = quantize_row,
    .rms_norm_row = kg_rms_norm_row,
    .rope_row = kg_rope_row,
    .attention_item = kg_attention_item,
    .exp_row = kg_exp_row,
};

#endif
