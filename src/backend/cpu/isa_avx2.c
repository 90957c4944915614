/* AVX2 + FMA + F16C kernels (Haswell and later, Zen). The whole file is compiled for
 * that target; nothing here runs unless cpu_isa_available(CPU_ISA_AVX2). */
#if defined(__x86_64__) || defined(__i386__)
#ifndef __clang__ /* (clang: the same features as flags from CMakeLists.txt) */
#pragma GCC target("avx2,fma,f16c")
#endif

#include "backend/cpu/kernels.h"
#include "backend/cpu/kquant.h"
#include "base/fp16.h"
#include "format/quant.h"

#include <immintrin.h>
#include <string.h>

typedef __m256 vf;
#define VLEN 8
/* 16 ymm registers: 2 x 4 accumulators + 4 weight vectors + temporaries. */
#define TILE_PASS_R 2

static inline vf v_round_nearest(vf v) {
    return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
static inline vf v_ldexp(vf p, vf n) {
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#define KX_PREFIX _mm256
#include "backend/cpu/kern_x86.h"

static inline __m256i lane_mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline vf v_load_n(const float *p, int n) {
    return _mm256_maskload_ps(p, lane_mask(n));
}
static inline __m128i load_u16_n(const uint8_t *p, int n) {
    uint16_t buf[8] = {0};
    memcpy(buf, p, (size_t)n * 2);
    return _mm_loadu_si128((const __m128i *)(const void *)buf);
}
static inline vf v_load_f16(const uint8_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}
static inline vf v_load_f16_n(const uint8_t *p, int n) {
    return _mm256_cvtph_ps(load_u16_n(p, n));
}
static inline vf bf16_widen(__m128i h) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
static inline vf v_load_bf16(const uint8_t *p) {
    return bf16_widen(_mm_loadu_si128((const __m128i *)(const void *)p));
}
static inline vf v_load_bf16_n(const uint8_t *p, int n) {
    return bf16_widen(load_u16_n(p, n));
}
static inline void v_store_n(float *p, vf v, int n) {
    _mm256_maskstore_ps(p, lane_mask(n), v);
}
static inline float v_hsum(vf v) {
    return kx_hsum256(v);
}
static inline float v_hmax(vf v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
/* lane j = sum of a[j]'s lanes: pairwise hadds, then the two 128-bit halves. */
static inline vf v_reduce_lanes(const vf *a) {
    vf t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    vf t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    vf u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* KV cache vocabulary: VLEN int8 at p widened to floats, and
 * the f16 at p broadcast to every lane. */
static inline vf v_load_i8(const int8_t *p) {
    int64_t b;
    memcpy(&b, p, 8);
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(b)));
}
static inline vf v_set1_f16(const uint8_t *p) {
    int16_t h;
    memcpy(&h, p, 2);
    return _mm256_cvtph_ps(_mm_set1_epi16(h));
}

#include "backend/cpu/kern_generic.h"

/* ---- int8 -------------------------------------------------------------------------- */

static inline float f16_scale(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 32 floats -> 32 int8 (round to nearest even) with scale amax / 127; returns the
 * quants and stores the scale. */
static inline __m256i quantize_block(const float *x, float *d_out) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
    __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
    __m256 amax = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
    float m = v_hmax(amax);
    float d = m / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    *d_out = d;
    const __m256 vid = _mm256_set1_ps(id), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    __m256i i0 = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v0, vid), lo), hi));
    __m256i i1 = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v1, vid), lo), hi));
    __m256i i2 = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v2, vid), lo), hi));
    __m256i i3 = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v3, vid), lo), hi));
    /* packs work within 128-bit lanes: undo the interleave with a dword permute */
    __m256i p01 = _mm256_packs_epi32(i0, i1), p23 = _mm256_packs_epi32(i2, i3);
    __m256i q = _mm256_packs_epi16(p01, p23);
    return _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static void quantize_row(const float *x, const struct cpu_qact *qa, int64_t r) {
    int64_t k = qa->k;
    int8_t *qs = qa->qs + r * k;
    float *d = qa->d + r * (k / CPU_QBLOCK);
    int32_t *corr = qa->corr + r * (k / 4);
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < k / CPU_QBLOCK; b++) {
        __m256i q = quantize_block(x + b * CPU_QBLOCK, d + b);
        _mm256_storeu_si256((__m256i *)(void *)(qs + b * CPU_QBLOCK), q);
        __m256i quad = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16);
        _mm256_storeu_si256((__m256i *)(void *)(corr + b * 8),
                            _mm256_slli_epi32(_mm256_sub_epi32(_mm256_setzero_si256(), quad), 7));
    }
    cpu_qact_sum_blocks(qa, r);
}

/* Q8_0: |w| * sign(x, w) keeps maddubs's unsigned x signed operands in range
 * (2 * 128 * 127 < 2^15), madd with ones sums quads to int32. */
static inline __attribute__((always_inline)) void tile_q8_0_rc(const struct cpu_qact *qa, int64_t r0,
                                                               const uint8_t *w, size_t ldw, float *out,
                                                               const int nr, const int nc) {
    const int64_t k = qa->k, nb = k / QK8_0;
    const __m256i ones16 = _mm256_set1_epi16(1);
    __m256 acc[2][CPU_TILE_C];
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) acc[r][c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i wq[CPU_TILE_C], wabs[CPU_TILE_C];
        float dw[CPU_TILE_C];
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) {
            const uint8_t *blk = w + c * ldw + b * (int64_t)sizeof(block_q8_0);
            _mm_prefetch((const char *)(blk + nc * ldw), _MM_HINT_T0);
            wq[c] = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 2));
            wabs[c] = _mm256_sign_epi8(wq[c], wq[c]);
            dw[c] = f16_scale(blk);
        }
#pragma GCC unroll 2
        for (int r = 0; r < nr; r++) {
            __m256i xq = _mm256_loadu_si256((const __m256i *)(const void *)(qa->qs + (r0 + r) * k + b * QK8_0));
            float dx = qa->d[(r0 + r) * nb + b];
#pragma GCC unroll 4
            for (int c = 0; c < nc; c++) {
                __m256i prod = _mm256_maddubs_epi16(wabs[c], _mm256_sign_epi8(xq, wq[c]));
                __m256 s = _mm256_cvtepi32_ps(_mm256_madd_epi16(prod, ones16));
                acc[r][c] = _mm256_fmadd_ps(s, _mm256_set1_ps(dw[c] * dx), acc[r][c]);
            }
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) out[r * CPU_TILE_C + c] = v_hsum(acc[r][c]);
}

/* Q4_0: nibbles n in 0..15 as maddubs's unsigned operand; sum (n - 8) x = sum n x +
 * corr / 16 (corr = -128 * quad sums). */
static inline __attribute__((always_inline)) void tile_q4_0_rc(const struct cpu_qact *qa, int64_t r0,
                                                               const uint8_t *w, size_t ldw, float *out,
                                                               const int nr, const int nc) {
    const int64_t k = qa->k, nb = k / QK4_0;
    const __m256i ones16 = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(0x0f);
    const __m256i shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    __m256 acc[2][CPU_TILE_C];
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) acc[r][c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i wn[CPU_TILE_C];
        float dw[CPU_TILE_C];
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) {
            const uint8_t *blk = w + c * ldw + b * (int64_t)sizeof(block_q4_0);
            _mm_prefetch((const char *)(blk + nc * ldw), _MM_HINT_T0);
            /* bytes 0..15 -> low nibbles (elements 0..15), 16..31 -> high (16..31) */
            __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(blk + 2)));
            wn[c] = _mm256_and_si256(_mm256_srlv_epi32(q, shift), low4);
            dw[c] = f16_scale(blk);
        }
#pragma GCC unroll 2
        for (int r = 0; r < nr; r++) {
            __m256i xq = _mm256_loadu_si256((const __m256i *)(const void *)(qa->qs + (r0 + r) * k + b * QK4_0));
            __m256i corr = _mm256_srai_epi32(
                _mm256_loadu_si256((const __m256i *)(const void *)(qa->corr + (r0 + r) * (k / 4) + b * 8)), 4);
            float dx = qa->d[(r0 + r) * nb + b];
#pragma GCC unroll 4
            for (int c = 0; c < nc; c++) {
                __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(wn[c], xq), ones16), corr);
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(dw[c] * dx), acc[r][c]);
            }
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) out[r * CPU_TILE_C + c] = v_hsum(acc[r][c]);
}

/* tile_q8_0 / tile_q4_0: an nr x nc tile (nr <= CPU_TILE_R, nc <= CPU_TILE_C) as row
 * pairs, each through the instance of KERNEL (tile_*_rc) of its shape, so the
 * accumulators stay in registers. */
#define TILE_BY_ROW_PAIRS(NAME, KERNEL)                                                                     \
    static void NAME(const struct cpu_qact *qa, int64_t r0, const uint8_t *w, size_t ldw, int nr, int nc,   \
                     float *out) {                                                                          \
        for (int rp = 0; rp < nr; rp += 2) {                                                                \
            int pr = nr - rp < 2 ? nr - rp : 2;                                                             \
            float *o = out + rp * CPU_TILE_C;                                                               \
            switch ((pr - 1) * 4 + nc - 1) {                                                                \
            case 0: KERNEL(qa, r0 + rp, w, ldw, o, 1, 1); break;                                            \
            case 1: KERNEL(qa, r0 + rp, w, ldw, o, 1, 2); break;                                            \
            case 2: KERNEL(qa, r0 + rp, w, ldw, o, 1, 3); break;                                            \
            case 3: KERNEL(qa, r0 + rp, w, ldw, o, 1, 4); break;                                            \
            case 4: KERNEL(qa, r0 + rp, w, ldw, o, 2, 1); break;                                            \
            case 5: KERNEL(qa, r0 + rp, w, ldw, o, 2, 2); break;                                            \
            case 6: KERNEL(qa, r0 + rp, w, ldw, o, 2, 3); break;                                            \
            default: KERNEL(qa, r0 + rp, w, ldw, o, 2, 4); break;                                           \
            }                                                                                               \
        }                                                                                                   \
    }
TILE_BY_ROW_PAIRS(tile_q8_0, tile_q8_0_rc)
TILE_BY_ROW_PAIRS(tile_q4_0, tile_q4_0_rc)

/* n f16 values from src, 8 at a time with F16C (round to nearest even). */
static void store_f16(const float *src, uint8_t *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(dst + 2 * i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), 0));
    for (; i < n; i++) {
        uint16_t h = fp16_from_f32(src[i]);
        memcpy(dst + 2 * i, &h, 2);
    }
}

const struct cpu_isa_kernels cpu_isa_kernels_avx2 = {
    .isa = CPU_ISA_AVX2,
    KG_ISA_TABLE_ENTRIES,
    .kq = &cpu_kq_kernels_avx2,
};

#endif
