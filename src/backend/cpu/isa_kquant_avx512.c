/* AVX-512 kernels for the types of cpu_kq_kernels: the tiles of kquant_simd.h with VNNI
 * (vpdpbusd on 256-bit registers), and a packed GEMM for prefill. Nothing here runs
 * unless cpu_isa_available(CPU_ISA_AVX512). */
#if defined(__x86_64__) || defined(__i386__)
#ifndef __clang__ /* (clang: the same features as flags from CMakeLists.txt) */
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#endif

#include <immintrin.h>

#define KQ_DOTU(init, u, x) _mm256_dpbusd_epi32(init, u, x)
/* signed w biased to unsigned w + 128; corr (-128 * quad sums of x) removes the bias */
#define KQ_DOTS(corr, w, x) _mm256_dpbusd_epi32(corr, _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80)), x)
#define KQ_PASS_R 4

#include "backend/cpu/kquant_simd.h"
#include "backend/cpu/transpose_avx512.h"

/* ---- decode tiles for Q4_K and Q6_K on 512-bit vectors ----------------------------- */

/* A super-block is taken as 4 vectors of 64 values (two sub-blocks of 32 each) whose
 * bytes line up with 64 contiguous activation bytes, so one vpdpbusd covers two
 * sub-blocks and its 16 lanes scale by one vector of per-lane factors (weight
 * sub-block scale times activation block scale, spread by one permute). The quants
 * (Q6_K's u = q + 32) are unsigned and go straight in as vpdpbusd's unsigned operand;
 * Q4_K's mins take one FMA per super-block against the activation block sums, Q6_K's
 * -32 offset starts the integer sums at -32 * the quad sums. Float accumulators are
 * reduced once per output. */
#define KQ_PF_L2_TILES 4 /* rows this many tiles ahead go to L2 (like isa_avx512.c) */

/* Q4_K values 64p .. 64p + 63: the 32 bytes of nibbles qs[32p ..] in both halves, the
 * low nibbles kept in the lower half, the high ones in place (16 u) in the upper half:
 * the odd sub-blocks' factors carry 1 / 16 (exact). */
KQ_INLINE __m512i kq5_q4k_pair(const uint8_t *blk, const int p) {
    __m512i q = _mm512_broadcast_i64x4(kq_load(blk + offsetof(block_q4_K, qs) + 32 * p));
    return _mm512_and_si512(q, _mm512_inserti64x4(_mm512_set1_epi8(0x0f), _mm256_set1_epi8((char)0xf0), 1));
}

/* Q4_K's 8 sub-block scales times d (lanes 0..7) and 8 mins times dmin (8..15), the
 * 6-bit fields of quant_k.h's 12 bytes unpacked with two byte shuffles. */
KQ_INLINE __m512 kq5_q4k_scales(const uint8_t *blk) {
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)blk); /* d, dmin, scales[12] */
    /* scales[i] is byte 4 + i: low fields (scales 0..3 | 4..7 low nibbles | mins 0..3 |
     * 4..7 high nibbles), then the top 2 bits of scales[0..3] / [4..7] for fields 4..7 */
    __m128i lo = _mm_shuffle_epi8(v, _mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
    __m128i hi = _mm_shuffle_epi8(v, _mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11));
    lo = _mm_mask_blend_epi8((__mmask16)0xf000, lo, _mm_srli_epi16(lo, 4));
    lo = _mm_and_si128(lo, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15));
    __m128i u = _mm_or_si128(lo, _mm_and_si128(_mm_srli_epi16(hi, 2), _mm_set1_epi8(0x30)));
    __m512 dd = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                      _mm512_castps128_ps512(_mm_cvtph_ps(v)));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(u)), dd);
}

/* Q6_K values 64p .. 64p + 63 (u = q + 32, 0..63): low nibbles of ql[64 h ..] for even
 * p, high nibbles for odd p (h = p / 2), with bits 4..5 from qh[32 h ..]: bit pairs
 * 0 / 2 (lower / upper 32 values) for even p, 4 / 6 for odd p. */
KQ_INLINE __m512i kq5_q6k_pair(const uint8_t *blk, const int p) {
    const int h = p / 2;
    __m512i ql = _mm512_loadu_si512((const void *)(blk + offsetof(block_q6_K, ql) + 64 * h));
    __m512i qh = _mm512_broadcast_i64x4(kq_load(blk + offsetof(block_q6_K, qh) + 32 * h));
    const __m512i cnt = _mm512_inserti64x4(_mm512_set1_epi16(p % 2 ? 0 : 4), _mm256_set1_epi16(2), 1);
    __m512i lo, hb;
    if (p % 2 == 0) {
        lo = _mm512_and_si512(ql, _mm512_set1_epi8(0x0f));
        hb = _mm512_sllv_epi16(qh, cnt);
    } else {
        lo = _mm512_and_si512(_mm512_srli_epi16(ql, 4), _mm512_set1_epi8(0x0f));
        hb = _mm512_srlv_epi16(qh, cnt);
    }
    return _mm512_ternarylogic_epi32(lo, hb, _mm512_set1_epi8(0x30), 0xf8); /* lo | (hb & 0x30) */
}

KQ_INLINE void kq5_tile(const struct cpu_qact *qa, int64_t r0, const uint8_t *w, size_t ldw, float *out,
                        const int T, const int nr, const int nc) {
    const int64_t k = qa->k, nb = k / CPU_QBLOCK;
    const size_t bs = kq_block_bytes(T);
    __m512 acc[KQ_PASS_R][CPU_TILE_C];
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) acc[r][c] = _mm512_setzero_ps();
    /* lane l of pair p's factors: sub-block 2p + l / 8 (Q6_K: 16-value group 4p + l / 4) */
    const __m512i l8 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i l4 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    for (int64_t sb = 0; sb < nb / 8; sb++) {
        __m512 dx[KQ_PASS_R];
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            const int64_t at = (r0 + r) * nb + sb * 8;
            __m256 d8 = _mm256_loadu_ps(qa->d + at);
            if (T == KQ_Q6_K) { /* per 16-value group: dx of block i / 2 */
                dx[r] = _mm512_permutexvar_ps(_mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
                                                                                  11, 12, 13, 14, 15), 1),
                                              _mm512_castps256_ps512(d8));
            } else { /* lanes 0..7: dx; 8..15: - dx * sum(qx) = dx * bsum / 128, for the mins */
                __m256 db = _mm256_mul_ps(_mm256_mul_ps(d8, _mm256_set1_ps(1.0f / 128.0f)),
                                          _mm256_cvtepi32_ps(kq_load(qa->bsum + at)));
                d8 = _mm256_mul_ps(d8, _mm256_setr_ps(1.0f, 1.0f / 16.0f, 1.0f, 1.0f / 16.0f, 1.0f, 1.0f / 16.0f,
                                                      1.0f, 1.0f / 16.0f)); /* kq5_q4k_pair's 16 u */
                dx[r] = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(d8)),
                                                            _mm256_castps_pd(db), 1));
            }
        }
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) {
            const uint8_t *blk = w + c * ldw + sb * bs;
            /* the next tile's rows into L1, those KQ_PF_L2_TILES ahead into L2 */
            for (size_t o = 63; o < bs + 63; o += 64) {
                size_t oo = o < bs ? o : bs - 1;
                _mm_prefetch((const char *)(blk + nc * ldw + oo), _MM_HINT_T0);
                _mm_prefetch((const char *)(blk + KQ_PF_L2_TILES * nc * ldw + oo), _MM_HINT_T1);
            }
            __m512 sw;
            if (T == KQ_Q6_K) {
                __m128i s8 = _mm_loadu_si128((const __m128i *)(const void *)(blk + offsetof(block_q6_K, scales)));
                sw = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(s8)),
                                   _mm512_set1_ps(kq_f16(blk + offsetof(block_q6_K, d))));
            } else {
                sw = kq5_q4k_scales(blk);
            }
            __m512i u[4];
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++) u[p] = T == KQ_Q6_K ? kq5_q6k_pair(blk, p) : kq5_q4k_pair(blk, p);
#pragma GCC unroll 4
            for (int r = 0; r < nr; r++) {
                const int64_t row = r0 + r;
                const int8_t *xp = qa->qs + row * k + sb * 256;
                __m512 f = _mm512_mul_ps(sw, dx[r]);
                if (T != KQ_Q6_K) /* lanes 8..15: the mins' terms */
                    acc[r][c] = _mm512_mask_add_ps(acc[r][c], (__mmask16)0xff00, acc[r][c], f);
#pragma GCC unroll 4
                for (int p = 0; p < 4; p++) {
                    __m512i init = _mm512_setzero_si512();
                    if (T == KQ_Q6_K) /* -32 * the quad sums removes the +32 */
                        init = _mm512_srai_epi32(
                            _mm512_loadu_si512((const void *)(qa->corr + row * (k / 4) + sb * 64 + 16 * p)), 2);
                    __m512i s = _mm512_dpbusd_epi32(init, u[p], _mm512_loadu_si512((const void *)(xp + 64 * p)));
                    __m512 fp = T == KQ_Q6_K ? _mm512_permutexvar_ps(_mm512_add_epi32(l4, _mm512_set1_epi32(4 * p)), f)
                                             : _mm512_permutexvar_ps(_mm512_add_epi32(l8, _mm512_set1_epi32(2 * p)), f);
                    acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), fp, acc[r][c]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) out[r * CPU_TILE_C + c] = _mm512_reduce_add_ps(acc[r][c]);
}

#define KQ5_NC_SWITCH(T, R)                                                                     \
    switch (nc) {                                                                               \
    case 1: kq5_tile(qa, r0 + rp, w, ldw, out + rp * CPU_TILE_C, T, R, 1); break;               \
    case 2: kq5_tile(qa, r0 + rp, w, ldw, out + rp * CPU_TILE_C, T, R, 2); break;               \
    case 3: kq5_tile(qa, r0 + rp, w, ldw, out + rp * CPU_TILE_C, T, R, 3); break;               \
    default: kq5_tile(qa, r0 + rp, w, ldw, out + rp * CPU_TILE_C, T, R, 4); break;              \
    }

#define KQ5_DEFINE_TILE(name, T)                                                                \
    static void name(const struct cpu_qact *qa, int64_t r0, const uint8_t *w, size_t ldw, int nr, int nc, \
                     float *out) {                                                              \
        for (int rp = 0; rp < nr; rp += KQ_PASS_R) {                                            \
            switch (nr - rp) {                                                                  \
            case 1: KQ5_NC_SWITCH(T, 1) break;                                                  \
            case 2: KQ5_NC_SWITCH(T, 2) break;                                                  \
            case 3: KQ5_NC_SWITCH(T, 3) break;                                                  \
            default: KQ5_NC_SWITCH(T, 4) break;                                                 \
            }                                                                                   \
        }                                                                                       \
    }

KQ5_DEFINE_TILE(kq5_tile_q4_k, KQ_Q4_K)
KQ5_DEFINE_TILE(kq5_tile_q6_k, KQ_Q6_K)

/* ---- prefill GEMM ----------------------------------------------------------------- */

/* Panels hold CPU_GEMM_NC = 64 columns as 4 groups of 16 lanes; per sub-block of 32:
 * 8 quads x 64 columns x 4 bytes of u (kquant.h: value = s * u - o), then s and o as
 * [2 halves][64 columns] f32 (second halves: Q6_K only; o: Q4_K / Q5_K only). A micro-kernel keeps
 * KQ_GEMM_ROWS rows x 64 columns of accumulators in registers; per quad it loads the
 * 4 weight vectors once and broadcasts each row's 4 activation bytes against them,
 * and per sub-block (half) converts the integer sums once:
 *   acc += dx * (s * sum(u * qx) - o * sum(qx)). */
#define KQ_GEMM_U_BYTES (8 * CPU_GEMM_NC * 4)
#define KQ_GEMM_BLOCK (KQ_GEMM_U_BYTES + 4 * CPU_GEMM_NC * 4)
#define KQ_GEMM_ROWS 3

static size_t kq_gemm_panel_bytes(enum ir_dtype t, int64_t k) {
    (void)t;
    return (size_t)(k / CPU_QBLOCK) * KQ_GEMM_BLOCK;
}

static int kq_gemm_rows(enum ir_dtype t) {
    (void)t;
    return KQ_GEMM_ROWS;
}

/* Packs blocks of type T: each column's sub-blocks are unpacked in registers
 * (kquant_simd.h) into a small buffer, then transposed 16 columns at a time into the
 * panel's 16-column vectors. */
static inline __attribute__((always_inline)) void kq_pack(const uint8_t *w, size_t ldw, int64_t k, int nc,
                                                          uint8_t *panel, const int T) {
    const int per = T == KQ_Q5_0 ? 1 : 8; /* sub-blocks per stored block */
    const size_t bs = kq_block_bytes(T);
    _Alignas(64) uint8_t tmp[8][CPU_GEMM_NC][32]; /* (sub-block, column, u) */
    _Alignas(64) float sc[CPU_GEMM_NC][16], mn[CPU_GEMM_NC][8]; /* (column, sub-block scale / min) */
    for (int64_t blk_i = 0; blk_i < k / CPU_QBLOCK / per; blk_i++) {
        uint8_t *pb = panel + blk_i * per * KQ_GEMM_BLOCK;
        for (int c = 0; c < CPU_GEMM_NC; c++) {
            const uint8_t *blk = w + (size_t)c * ldw + blk_i * bs;
            if (c < nc && T == KQ_Q5_0) {
                sc[c][0] = kq_f16(blk);
                _mm256_store_si256((__m256i *)(void *)tmp[0][c],
                                   _mm256_or_si256(kq_nibbles16(blk + offsetof(block_q5_0, qs)),
                                                   kq_bits_to_0x10(kq_u32(blk + offsetof(block_q5_0, qh)))));
            } else if (c < nc) {
                __m256 vsc, vsc_hi = _mm256_setzero_ps(), vmn = _mm256_setzero_ps();
                kq_scales(blk, T, &vsc, &vsc_hi, &vmn);
                _mm256_store_ps(sc[c], vsc);
                _mm256_store_ps(sc[c] + 8, vsc_hi);
                _mm256_store_ps(mn[c], vmn);
#pragma GCC unroll 8
                for (int j = 0; j < 8; j++) {
                    __m256i u = kq_unpack(blk, T, j);
                    if (T == KQ_IQ4_XS) u = _mm256_xor_si256(u, _mm256_set1_epi8((char)0x80)); /* to unsigned */
                    _mm256_store_si256((__m256i *)(void *)tmp[j][c], u);
                }
            } else {
                for (int j = 0; j < per; j++) memset(tmp[j][c], 0, 32);
                memset(sc[c], 0, sizeof sc[c]);
                memset(mn[c], 0, sizeof mn[c]);
            }
        }
        /* 16 columns at a time, transposed in registers (in place of ~320 gathers a
         * block; a few percent faster on the EPYC host, where the per-column unpack
         * above is most of the pack): two sub-blocks' 8 quads of u per transpose,
         * then the scales (Q6_K: 16 a column) or the 8 scales and 8 mins (Q4_K /
         * Q5_K; IQ4_XS: no mins, Q5_0: one scale) of one block in one more; the other
         * types' offsets are C * s (kq_gemm_rc) */
        for (int g = 0; g < 4; g++) {
            __m512 r[16], tr[16];
            for (int j = 0; j < per; j += 2) {
                for (int i = 0; i < 16; i++) {
                    const __m256i *a = (const __m256i *)(const void *)tmp[j][16 * g + i];
                    __m512i v = _mm512_castsi256_si512(_mm256_load_si256(a));
                    if (j + 1 < per) /* the next sub-block's u of this column (tmp[j + 1][c]) */
                        v = _mm512_inserti64x4(v, _mm256_load_si256(a + CPU_GEMM_NC), 1);
                    r[i] = _mm512_castsi512_ps(v);
                }
                transpose16(r, tr);
                for (int h = 0; h < 2 && j + h < per; h++)
#pragma GCC unroll 8
                    for (int q = 0; q < 8; q++) {
                        float *pq = (float *)(void *)(pb + (j + h) * KQ_GEMM_BLOCK) + q * CPU_GEMM_NC;
                        _mm512_store_ps(pq + 16 * g, tr[8 * h + q]);
                    }
            }
            for (int i = 0; i < 16; i++) {
                const float *cs = sc[16 * g + i];
                if (T == KQ_Q6_K) r[i] = _mm512_load_ps(cs);
                else if (T == KQ_Q5_0) r[i] = _mm512_maskz_load_ps(1, cs);
                else {
                    const __m256i hi = T == KQ_IQ4_XS ? _mm256_setzero_si256()
                                                      : _mm256_castps_si256(_mm256_load_ps(mn[16 * g + i]));
                    r[i] = _mm512_castsi512_ps(
                        _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_castps_si256(_mm256_load_ps(cs))), hi, 1));
                }
            }
            transpose16(r, tr);
            for (int j = 0; j < per; j++) {
                float *sp = (float *)(void *)(pb + j * KQ_GEMM_BLOCK + KQ_GEMM_U_BYTES), *op = sp + 2 * CPU_GEMM_NC;
                for (int h = 0; h < (T == KQ_Q6_K ? 2 : 1); h++)
                    _mm512_store_ps(sp + h * CPU_GEMM_NC + 16 * g, tr[T == KQ_Q6_K ? 2 * j + h : j]);
                if (T == KQ_Q4_K || T == KQ_Q5_K) _mm512_store_ps(op + 16 * g, tr[8 + j]);
            }
        }
    }
}

static void kq_gemm_pack(enum ir_dtype t, const uint8_t *w, size_t ldw, int64_t k, int nc, void *panel) {
    switch (t) {
    case IR_DTYPE_Q4_K: kq_pack(w, ldw, k, nc, panel, KQ_Q4_K); break;
    case IR_DTYPE_Q5_K: kq_pack(w, ldw, k, nc, panel, KQ_Q5_K); break;
    case IR_DTYPE_Q6_K: kq_pack(w, ldw, k, nc, panel, KQ_Q6_K); break;
    case IR_DTYPE_Q5_0: kq_pack(w, ldw, k, nc, panel, KQ_Q5_0); break;
    default: kq_pack(w, ldw, k, nc, panel, KQ_IQ4_XS); break;
    }
}

/* C: the integer offset of the signed types (o = C * s: Q6_K 32, Q5_0 16, IQ4_XS 128),
 * taken out by starting the integer sums at -C * sum(qx); 0 for Q4_K / Q5_K, whose
 * per-sub-block mins take one more FMA. */
static inline __attribute__((always_inline)) void kq_gemm_rc(const uint8_t *panel, const struct cpu_qact *qa,
                                                             int64_t r0, float *out, const int R, const int H,
                                                             const int C) {
    const int64_t k = qa->k, nb = k / CPU_QBLOCK;
    __m512 acc[KQ_GEMM_ROWS][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) acc[r][g] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *pb = panel + b * KQ_GEMM_BLOCK;
        const float *sp = (const float *)(const void *)(pb + KQ_GEMM_U_BYTES), *op = sp + 2 * CPU_GEMM_NC;
#pragma GCC unroll 2
        for (int h = 0; h < H; h++) {
            __m512i is[KQ_GEMM_ROWS][4];
            int32_t nsum[KQ_GEMM_ROWS]; /* -128 * the sum of this half's activations */
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const int64_t row = r0 + r;
                if (H == 1) {
                    nsum[r] = qa->bsum[row * nb + b];
                } else {
                    const int32_t *cr = qa->corr + row * (k / 4) + b * 8 + 4 * h;
                    nsum[r] = cr[0] + cr[1] + cr[2] + cr[3];
                }
                __m512i init = _mm512_set1_epi32(C ? nsum[r] / 128 * C : 0);
#pragma GCC unroll 4
                for (int g = 0; g < 4; g++) is[r][g] = init;
            }
            const int n_quads = H == 2 ? 4 : 8; /* per half */
#pragma GCC unroll 8
            for (int qq = 0; qq < n_quads; qq++) {
                const int q = h * n_quads + qq;
                __m512i wv[4];
#pragma GCC unroll 4
                for (int g = 0; g < 4; g++)
                    wv[g] = _mm512_load_si512((const void *)(pb + (q * CPU_GEMM_NC + 16 * g) * 4));
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    int32_t quad;
                    memcpy(&quad, qa->qs + (r0 + r) * k + b * CPU_QBLOCK + 4 * q, 4);
                    __m512i xb = _mm512_set1_epi32(quad);
#pragma GCC unroll 4
                    for (int g = 0; g < 4; g++) is[r][g] = _mm512_dpbusd_epi32(is[r][g], wv[g], xb);
                }
            }
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m512 vdx = _mm512_set1_ps(qa->d[(r0 + r) * nb + b]);
                __m512 vsum = _mm512_set1_ps((float)nsum[r] * (-1.0f / 128.0f));
#pragma GCC unroll 4
                for (int g = 0; g < 4; g++) {
                    __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(is[r][g]), _mm512_load_ps(sp + h * CPU_GEMM_NC + 16 * g));
                    if (!C) t = _mm512_fnmadd_ps(vsum, _mm512_load_ps(op + h * CPU_GEMM_NC + 16 * g), t);
                    acc[r][g] = _mm512_fmadd_ps(t, vdx, acc[r][g]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) _mm512_store_ps(out + r * CPU_GEMM_NC + 16 * g, acc[r][g]);
}

#define KQ_GEMM_RC(H, C)                                                                       \
    switch (nr) {                                                                              \
    case 1: kq_gemm_rc(panel, qa, r0, out, 1, H, C); break;                                    \
    case 2: kq_gemm_rc(panel, qa, r0, out, 2, H, C); break;                                    \
    default: kq_gemm_rc(panel, qa, r0, out, 3, H, C); break;                                   \
    }

static void kq_gemm_tile(enum ir_dtype t, const void *panel, const float *x, const struct cpu_qact *qa, int64_t r0,
                         int64_t k, int nr, float *out) {
    (void)x;
    (void)k;
    switch (t) {
    case IR_DTYPE_Q6_K: KQ_GEMM_RC(2, 32) break;
    case IR_DTYPE_Q5_0: KQ_GEMM_RC(1, 16) break;
    case IR_DTYPE_IQ4_XS: KQ_GEMM_RC(1, 128) break;
    default: KQ_GEMM_RC(1, 0) break; /* Q4_K, Q5_K */
    }
}

const struct cpu_kq_kernels cpu_kq_kernels_avx512 = {
    .tile_q4_k = kq5_tile_q4_k,
    .tile_q5_k = kq_tile_q5_k,
    .tile_q6_k = kq5_tile_q6_k,
    .tile_q5_0 = kq_tile_q5_0_fn,
    .tile_iq4_xs = kq_tile_iq4_xs,
    .gemm_panel_bytes = kq_gemm_panel_bytes,
    .gemm_pack = kq_gemm_pack,
    .gemm_tile = kq_gemm_tile,
    .gemm_rows = kq_gemm_rows,
};

#endif
