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
 * [2 halves][64 columns] f32 (the halves differ for Q6_K only). A micro-kernel keeps
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

static void kq_gemm_pack(enum ir_dtype t, const uint8_t *w, size_t ldw, int64_t k, int nc, void *panel) {
    uint8_t *p = panel;
    for (int64_t b = 0; b < k / CPU_QBLOCK; b++, p += KQ_GEMM_BLOCK) {
        uint32_t *u = (uint32_t *)(void *)p;
        float *s = (float *)(void *)(p + KQ_GEMM_U_BYTES), *o = s + 2 * CPU_GEMM_NC;
        for (int c = 0; c < CPU_GEMM_NC; c++) {
            struct kq_sub sub = {0};
            if (c < nc) kq_unpack_sub(t, w + (size_t)c * ldw, b, &sub);
            for (int q = 0; q < 8; q++) memcpy(&u[q * CPU_GEMM_NC + c], sub.u + 4 * q, 4);
            for (int h = 0; h < 2; h++) {
                s[h * CPU_GEMM_NC + c] = sub.s[h];
                o[h * CPU_GEMM_NC + c] = sub.o[h];
            }
        }
    }
}

static inline __attribute__((always_inline)) void kq_gemm_rc(const uint8_t *panel, const struct cpu_qact *qa,
                                                             int64_t r0, float *out, const int R, const int H) {
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
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
#pragma GCC unroll 4
                for (int g = 0; g < 4; g++) is[r][g] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int q = h * (8 / H); q < (h + 1) * (8 / H); q++) {
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
                const int64_t row = r0 + r;
                int32_t nsum; /* -128 * the sum of this half's activations */
                if (H == 1) {
                    nsum = qa->bsum[row * nb + b];
                } else {
                    const int32_t *cr = qa->corr + row * (k / 4) + b * 8 + 4 * h;
                    nsum = cr[0] + cr[1] + cr[2] + cr[3];
                }
                float dx = qa->d[row * nb + b];
                __m512 vdx = _mm512_set1_ps(dx), vsum = _mm512_set1_ps((float)nsum * (-1.0f / 128.0f));
#pragma GCC unroll 4
                for (int g = 0; g < 4; g++) {
                    __m512 t = _mm512_fnmadd_ps(vsum, _mm512_load_ps(op + h * CPU_GEMM_NC + 16 * g),
                                                _mm512_mul_ps(_mm512_cvtepi32_ps(is[r][g]),
                                                              _mm512_load_ps(sp + h * CPU_GEMM_NC + 16 * g)));
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

static void kq_gemm_tile(enum ir_dtype t, const void *panel, const float *x, const struct cpu_qact *qa, int64_t r0,
                         int64_t k, int nr, float *out) {
    (void)x;
    (void)k;
    const bool halves = kq_halves(t) == 2;
    switch (nr) {
    case 1: halves ? kq_gemm_rc(panel, qa, r0, out, 1, 2) : kq_gemm_rc(panel, qa, r0, out, 1, 1); break;
    case 2: halves ? kq_gemm_rc(panel, qa, r0, out, 2, 2) : kq_gemm_rc(panel, qa, r0, out, 2, 1); break;
    default: halves ? kq_gemm_rc(panel, qa, r0, out, 3, 2) : kq_gemm_rc(panel, qa, r0, out, 3, 1); break;
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
