/* Tiles for the types of cpu_kq_kernels (Q4_K, Q5_K, Q6_K, Q5_0, IQ4_XS) over int8
 * activations, written once on 256-bit integer vectors and compiled per ISA: each
 * isa_kquant_*.c sets its target and defines, before including this file,
 *
 *   KQ_DOTU(init, u, x)     init + sums of 4 products u * x per 32-bit lane, u unsigned
 *                           bytes <= 63, x signed bytes (|x| <= 127)
 *   KQ_DOTS(corr, w, x)     the same for signed weight bytes w (|w| <= 127); corr holds
 *                           -128 * the sums of 4 x (cpu_qact.corr), for the VNNI bias trick
 *   KQ_PASS_R               activation rows one pass keeps in registers
 *
 * Weights are dequantized in registers, one sub-block of 32 at a time, to the integers
 * u of kquant.h (value = s * u - o); the scales s of a super-block (times each
 * activation block's scale) go to a small table read by broadcasts. The offsets o are
 * removed either through the accumulator's start value (Q6_K: u - 32, Q5_0: u - 16,
 * from cpu_qact.corr) or, for the per-sub-block mins of Q4_K / Q5_K, by one vector
 * FMA per super-block against the activation block sums. */
#ifndef LLMOPT_BACKEND_CPU_KQUANT_SIMD_H
#define LLMOPT_BACKEND_CPU_KQUANT_SIMD_H

#include "backend/cpu/kquant.h"
#include "format/quant.h"
#include "format/quant_k.h"

#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#define KQ_INLINE static inline __attribute__((always_inline))

enum { KQ_Q4_K, KQ_Q5_K, KQ_Q6_K, KQ_Q5_0, KQ_IQ4_XS };

KQ_INLINE float kq_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

KQ_INLINE uint32_t kq_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

KQ_INLINE __m256i kq_load(const void *p) {
    return _mm256_loadu_si256((const __m256i *)p);
}

KQ_INLINE __m256i kq_lo4(__m256i v) {
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

KQ_INLINE __m256i kq_hi4(__m256i v) {
    return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0f));
}

/* 16 bytes of nibble pairs -> 32 bytes: the 16 low nibbles, then the 16 high ones. */
KQ_INLINE __m256i kq_nibbles16(const uint8_t *p) {
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
    return kq_lo4(_mm256_set_m128i(_mm_srli_epi16(v, 4), v));
}

/* Bit i of m -> byte i: 0x10 where set, else 0. */
KQ_INLINE __m256i kq_bits_to_0x10(uint32_t m) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2,
                                            2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)m), spread), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, bit), _mm256_set1_epi8(0x10));
}

/* Bytes of bit b..b+1 of every byte of v moved to bits 4..5 (0x30 mask), b even. */
KQ_INLINE __m256i kq_2bits_to_4(__m256i v, const int b) {
    const __m256i m = _mm256_set1_epi8(0x30);
    if (b == 0) return _mm256_and_si256(_mm256_slli_epi16(v, 4), m);
    if (b == 2) return _mm256_and_si256(_mm256_slli_epi16(v, 2), m);
    if (b == 4) return _mm256_and_si256(v, m);
    return _mm256_and_si256(_mm256_srli_epi16(v, 2), m);
}

/* Bit j of every byte of v moved to bit 4 (0x10 mask). Shifts are 16-bit, but a
 * byte's bit 4 only ever receives a bit of the same byte here. */
KQ_INLINE __m256i kq_bit_to_4(__m256i v, const int j) {
    const __m256i m = _mm256_set1_epi8(0x10);
    if (j < 4) return _mm256_and_si256(_mm256_slli_epi16(v, 4 - j), m);
    if (j == 4) return _mm256_and_si256(v, m);
    return _mm256_and_si256(_mm256_srli_epi16(v, j - 4), m);
}

KQ_INLINE size_t kq_block_bytes(const int T) {
    return T == KQ_Q4_K   ? sizeof(block_q4_K)
           : T == KQ_Q5_K ? sizeof(block_q5_K)
           : T == KQ_Q6_K ? sizeof(block_q6_K)
           : T == KQ_Q5_0 ? sizeof(block_q5_0)
                          : sizeof(block_iq4_xs);
}

/* Sub-block j (0..7) of a super-block as 32 integers u (IQ4_XS: signed table values). */
KQ_INLINE __m256i kq_unpack(const uint8_t *blk, const int T, const int j) {
    if (T == KQ_Q4_K) {
        __m256i q = kq_load(blk + offsetof(block_q4_K, qs) + 32 * (j / 2));
        return j % 2 ? kq_hi4(q) : kq_lo4(q);
    }
    if (T == KQ_Q5_K) {
        __m256i q = kq_load(blk + offsetof(block_q5_K, qs) + 32 * (j / 2));
        __m256i hb = kq_bit_to_4(kq_load(blk + offsetof(block_q5_K, qh)), j);
        return _mm256_or_si256(j % 2 ? kq_hi4(q) : kq_lo4(q), hb);
    }
    if (T == KQ_Q6_K) {
        const int h = j / 4, g = j % 4;
        __m256i lo = kq_load(blk + offsetof(block_q6_K, ql) + 64 * h + 32 * (g & 1));
        __m256i hi = kq_2bits_to_4(kq_load(blk + offsetof(block_q6_K, qh) + 32 * h), 2 * g);
        return _mm256_or_si256(g < 2 ? kq_lo4(lo) : kq_hi4(lo), hi);
    }
    /* IQ4_XS */
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)iq4nl_values));
    return _mm256_shuffle_epi8(table, kq_nibbles16(blk + offsetof(block_iq4_xs, qs) + 16 * j));
}

/* A super-block's sub-block scales (Q6_K: 16 per-16 scales in two vectors), times d. */
KQ_INLINE void kq_scales(const uint8_t *blk, const int T, __m256 *sc, __m256 *sc_hi, __m256 *mn) {
    if (T == KQ_Q4_K || T == KQ_Q5_K) {
        /* 8 six-bit scales and mins from 12 bytes (layout in quant_k.h) */
        uint32_t a0 = kq_u32(blk + 4), a1 = kq_u32(blk + 8), a2 = kq_u32(blk + 12);
        uint32_t sc_lo = a0 & 0x3f3f3f3f, mn_lo = a1 & 0x3f3f3f3f;
        uint32_t sc_hi4 = (a2 & 0x0f0f0f0f) | ((a0 >> 2) & 0x30303030);
        uint32_t mn_hi4 = ((a2 >> 4) & 0x0f0f0f0f) | ((a1 >> 2) & 0x30303030);
        __m256i s = _mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, (int)sc_hi4, (int)sc_lo));
        __m256i m = _mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, (int)mn_hi4, (int)mn_lo));
        *sc = _mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(kq_f16(blk)));
        *mn = _mm256_mul_ps(_mm256_cvtepi32_ps(m), _mm256_set1_ps(kq_f16(blk + 2)));
    } else if (T == KQ_Q6_K) {
        const uint8_t *s = blk + offsetof(block_q6_K, scales);
        __m256 d = _mm256_set1_ps(kq_f16(blk + offsetof(block_q6_K, d)));
        *sc = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)s))), d);
        *sc_hi = _mm256_mul_ps(
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(s + 8)))), d);
    } else { /* IQ4_XS: (ls - 32) * d */
        uint32_t sl = kq_u32(blk + offsetof(block_iq4_xs, scales_l));
        uint16_t sh;
        memcpy(&sh, blk + offsetof(block_iq4_xs, scales_h), 2);
        __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)sl), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                      _mm256_set1_epi32(0x0f));
        __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(sh), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                      _mm256_set1_epi32(3));
        __m256i ls = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
        *sc = _mm256_mul_ps(_mm256_cvtepi32_ps(ls), _mm256_set1_ps(kq_f16(blk)));
    }
}

KQ_INLINE float kq_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Q5_0: one block of 32 per step, scale d * dx broadcast. */
KQ_INLINE void kq_tile_q5_0(const struct cpu_qact *qa, int64_t r0, const uint8_t *w, size_t ldw, float *out,
                            const int nr, const int nc) {
    const int64_t k = qa->k, nb = k / CPU_QBLOCK;
    __m256 acc[KQ_PASS_R][CPU_TILE_C];
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) acc[r][c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i u[CPU_TILE_C];
        float dw[CPU_TILE_C];
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) {
            const uint8_t *blk = w + c * ldw + b * sizeof(block_q5_0);
            _mm_prefetch((const char *)(blk + nc * ldw), _MM_HINT_T0);
            dw[c] = kq_f16(blk);
            u[c] = _mm256_or_si256(kq_nibbles16(blk + offsetof(block_q5_0, qs)),
                                   kq_bits_to_0x10(kq_u32(blk + offsetof(block_q5_0, qh))));
        }
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            const int64_t row = r0 + r;
            __m256i xq = kq_load(qa->qs + row * k + b * CPU_QBLOCK);
            /* -16 * the quad sums: the accumulator starts at the -16 offset's share */
            __m256i init = _mm256_srai_epi32(kq_load(qa->corr + row * (k / 4) + b * 8), 3);
            float dx = qa->d[row * nb + b];
#pragma GCC unroll 4
            for (int c = 0; c < nc; c++)
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(KQ_DOTU(init, u[c], xq)), _mm256_set1_ps(dw[c] * dx),
                                            acc[r][c]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) out[r * CPU_TILE_C + c] = kq_hsum(acc[r][c]);
}

/* The super-block types (Q4_K, Q5_K, Q6_K, IQ4_XS). */
KQ_INLINE void kq_tile_super(const struct cpu_qact *qa, int64_t r0, const uint8_t *w, size_t ldw, float *out,
                             const int T, const int nr, const int nc) {
    const int64_t k = qa->k, nb = k / CPU_QBLOCK;
    const size_t bs = kq_block_bytes(T);
    const bool has_min = T == KQ_Q4_K || T == KQ_Q5_K;
    __m256 acc[KQ_PASS_R][CPU_TILE_C];
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) acc[r][c] = _mm256_setzero_ps();
    /* scale[r][c][i]: weight scale times activation scale of sub-block i (Q6_K: of
     * 16-value half i) */
    _Alignas(32) float scale[KQ_PASS_R][CPU_TILE_C][16];
    for (int64_t sb = 0; sb < nb / 8; sb++) {
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) {
            const uint8_t *blk = w + c * ldw + sb * bs;
            for (size_t line = 0; line < bs; line += 64) /* the next tile's rows */
                _mm_prefetch((const char *)(blk + nc * ldw + line), _MM_HINT_T0);
            __m256 sc, sc_hi = _mm256_setzero_ps(), mn = _mm256_setzero_ps();
            kq_scales(blk, T, &sc, &sc_hi, &mn);
#pragma GCC unroll 4
            for (int r = 0; r < nr; r++) {
                const int64_t at = (r0 + r) * nb + sb * 8;
                __m256 dx = _mm256_loadu_ps(qa->d + at);
                if (T == KQ_Q6_K) {
                    __m256 dlo = _mm256_permutevar8x32_ps(dx, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
                    __m256 dhi = _mm256_permutevar8x32_ps(dx, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7));
                    _mm256_store_ps(scale[r][c], _mm256_mul_ps(sc, dlo));
                    _mm256_store_ps(scale[r][c] + 8, _mm256_mul_ps(sc_hi, dhi));
                } else {
                    _mm256_store_ps(scale[r][c], _mm256_mul_ps(sc, dx));
                }
                if (has_min) /* - mins * dx * sum(qx) = mins * dx * bsum / 128, lane per sub-block */
                    acc[r][c] = _mm256_fmadd_ps(
                        mn, _mm256_mul_ps(_mm256_mul_ps(dx, _mm256_set1_ps(1.0f / 128.0f)),
                                          _mm256_cvtepi32_ps(kq_load(qa->bsum + at))),
                        acc[r][c]);
            }
        }
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const int64_t b = sb * 8 + j;
            __m256i u[CPU_TILE_C];
#pragma GCC unroll 4
            for (int c = 0; c < nc; c++) u[c] = kq_unpack(w + c * ldw + sb * bs, T, j);
#pragma GCC unroll 4
            for (int r = 0; r < nr; r++) {
                const int64_t row = r0 + r;
                __m256i xq = kq_load(qa->qs + row * k + b * CPU_QBLOCK);
                __m256i corr = _mm256_setzero_si256();
                if (T == KQ_Q6_K || T == KQ_IQ4_XS) corr = kq_load(qa->corr + row * (k / 4) + b * 8);
                /* Q6_K: -32 * the quad sums removes the -32 offset */
                if (T == KQ_Q6_K) corr = _mm256_srai_epi32(corr, 2);
#pragma GCC unroll 4
                for (int c = 0; c < nc; c++) {
                    __m256i s = T == KQ_IQ4_XS ? KQ_DOTS(corr, u[c], xq) : KQ_DOTU(corr, u[c], xq);
                    __m256 sv;
                    if (T == KQ_Q6_K) /* lanes 0..3: first 16 values, 4..7: the second 16 */
                        sv = _mm256_permutevar8x32_ps(
                            _mm256_castpd_ps(_mm256_broadcast_sd((const double *)(const void *)&scale[r][c][2 * j])),
                            _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
                    else
                        sv = _mm256_broadcast_ss(&scale[r][c][j]);
                    acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), sv, acc[r][c]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) out[r * CPU_TILE_C + c] = kq_hsum(acc[r][c]);
}

KQ_INLINE void kq_tile_rc(const struct cpu_qact *qa, int64_t r0, const uint8_t *w, size_t ldw, float *out,
                          const int T, const int nr, const int nc) {
    if (T == KQ_Q5_0) kq_tile_q5_0(qa, r0, w, ldw, out, nr, nc);
    else kq_tile_super(qa, r0, w, ldw, out, T, nr, nc);
}

/* nr x nc (1..4 each) in passes of KQ_PASS_R rows, constants for the inlined body. */
#define KQ_NC_SWITCH(T, R)                                                                      \
    switch (nc) {                                                                               \
    case 1: kq_tile_rc(qa, r0 + rp, w, ldw, out + rp * CPU_TILE_C, T, R, 1); break;             \
    case 2: kq_tile_rc(qa, r0 + rp, w, ldw, out + rp * CPU_TILE_C, T, R, 2); break;             \
    case 3: kq_tile_rc(qa, r0 + rp, w, ldw, out + rp * CPU_TILE_C, T, R, 3); break;             \
    default: kq_tile_rc(qa, r0 + rp, w, ldw, out + rp * CPU_TILE_C, T, R, 4); break;            \
    }

#if KQ_PASS_R >= 4
#define KQ_PASS_SWITCH(T)                                                                       \
    switch (pr) {                                                                               \
    case 1: KQ_NC_SWITCH(T, 1) break;                                                           \
    case 2: KQ_NC_SWITCH(T, 2) break;                                                           \
    case 3: KQ_NC_SWITCH(T, 3) break;                                                           \
    default: KQ_NC_SWITCH(T, 4) break;                                                          \
    }
#else
#define KQ_PASS_SWITCH(T)                                                                       \
    switch (pr) {                                                                               \
    case 1: KQ_NC_SWITCH(T, 1) break;                                                           \
    default: KQ_NC_SWITCH(T, 2) break;                                                          \
    }
#endif

#define KQ_DEFINE_TILE(name, T)                                                                 \
    static __attribute__((unused)) void name(const struct cpu_qact *qa, int64_t r0, const uint8_t *w, size_t ldw, \
                                             int nr, int nc, float *out) {                     \
        for (int rp = 0; rp < nr; rp += KQ_PASS_R) {                                            \
            int pr = nr - rp < KQ_PASS_R ? nr - rp : KQ_PASS_R;                                 \
            KQ_PASS_SWITCH(T)                                                                   \
        }                                                                                       \
    }

KQ_DEFINE_TILE(kq_tile_q4_k, KQ_Q4_K)
KQ_DEFINE_TILE(kq_tile_q5_k, KQ_Q5_K)
KQ_DEFINE_TILE(kq_tile_q6_k, KQ_Q6_K)
KQ_DEFINE_TILE(kq_tile_q5_0_fn, KQ_Q5_0)
KQ_DEFINE_TILE(kq_tile_iq4_xs, KQ_IQ4_XS)

#endif
