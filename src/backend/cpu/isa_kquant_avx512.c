/* AVX-512 kernels for the types of cpu_kq_kernels: the tiles of kquant_simd.h with VNNI
 * (vpdpbusd on 256-bit registers), and a packed GEMM for prefill. Nothing here runs
 * unless cpu_isa_available(CPU_ISA_AVX512). */
#if defined(__x86_64__) || defined(__i386__)
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")

#include <immintrin.h>

#define KQ_DOTU(init, u, x) _mm256_dpbusd_epi32(init, u, x)
/* signed w biased to unsigned w + 128; corr (-128 * quad sums of x) removes the bias */
#define KQ_DOTS(corr, w, x) _mm256_dpbusd_epi32(corr, _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80)), x)
#define KQ_PASS_R 4

#include "backend/cpu/kquant_simd.h"

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
 * (kquant_simd.h) into a small buffer, then gathered quad by quad into the panel's
 * 16-column vectors. */
static inline __attribute__((always_inline)) void kq_pack(const uint8_t *w, size_t ldw, int64_t k, int nc,
                                                          uint8_t *panel, const int T) {
    const int per = T == KQ_Q5_0 ? 1 : 8; /* sub-blocks per stored block */
    const size_t bs = kq_block_bytes(T);
    _Alignas(64) uint8_t tmp[8][CPU_GEMM_NC][32]; /* (sub-block, column, u) */
    _Alignas(64) float sc[CPU_GEMM_NC][16], mn[CPU_GEMM_NC][8]; /* (column, sub-block scale / min) */
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i lane_u = _mm512_mullo_epi32(lane, _mm512_set1_epi32(32));
    const __m512i lane_s = _mm512_mullo_epi32(lane, _mm512_set1_epi32(16 * 4));
    const __m512i lane_m = _mm512_mullo_epi32(lane, _mm512_set1_epi32(8 * 4));
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
        /* 16 columns at a time: quads of u, the scales (both halves for Q6_K) and, for
         * Q4_K / Q5_K, the mins; the other types' offsets are C * s (kq_gemm_rc) */
        for (int j = 0; j < per; j++) {
            uint8_t *pj = pb + j * KQ_GEMM_BLOCK;
            float *sp = (float *)(void *)(pj + KQ_GEMM_U_BYTES), *op = sp + 2 * CPU_GEMM_NC;
            for (int g = 0; g < 4; g++) {
#pragma GCC unroll 8
                for (int q = 0; q < 8; q++)
                    _mm512_store_si512((void *)(pj + (q * CPU_GEMM_NC + 16 * g) * 4),
                                       _mm512_i32gather_epi32(lane_u, tmp[j][16 * g] + 4 * q, 1));
                for (int h = 0; h < (T == KQ_Q6_K ? 2 : 1); h++)
                    _mm512_store_ps(sp + h * CPU_GEMM_NC + 16 * g,
                                    _mm512_i32gather_ps(lane_s, &sc[16 * g][T == KQ_Q6_K ? 2 * j + h : j], 1));
                if (T == KQ_Q4_K || T == KQ_Q5_K)
                    _mm512_store_ps(op + 16 * g, _mm512_i32gather_ps(lane_m, &mn[16 * g][j], 1));
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
    .tile_q4_k = kq_tile_q4_k,
    .tile_q5_k = kq_tile_q5_k,
    .tile_q6_k = kq_tile_q6_k,
    .tile_q5_0 = kq_tile_q5_0_fn,
    .tile_iq4_xs = kq_tile_iq4_xs,
    .gemm_panel_bytes = kq_gemm_panel_bytes,
    .gemm_pack = kq_gemm_pack,
    .gemm_tile = kq_gemm_tile,
    .gemm_rows = kq_gemm_rows,
};

#endif
