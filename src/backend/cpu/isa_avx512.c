/* AVX-512 kernels (Ice Lake / Sapphire Rapids / Zen 4): 512-bit float paths, and
 * integer dot products with VNNI (vpdpbusd on 256-bit registers, where it issues on
 * two ports). Nothing here runs unless cpu_isa_available(CPU_ISA_AVX512). */
#if defined(__x86_64__) || defined(__i386__)
#ifndef __clang__ /* (clang: the same features as flags from CMakeLists.txt) */
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#endif

#include "backend/cpu/kernels.h"
#include "backend/cpu/kquant.h"
#include "backend/cpu/transpose_avx512.h"
#include "base/fp16.h"
#include "format/quant.h"

#include <immintrin.h>
#include <string.h>

typedef __m512 vf;
#define VLEN 16
#define TILE_PASS_R 4

static inline vf v_round_nearest(vf v) {
    return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
static inline vf v_ldexp(vf p, vf n) {
    return _mm512_scalef_ps(p, n);
}
#define KX_PREFIX _mm512
#include "backend/cpu/kern_x86.h"

static inline __mmask16 lane_mask(int n) {
    return (__mmask16)((1u << n) - 1u);
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
static inline void v_store_n(float *p, vf v, int n) {
    _mm512_mask_storeu_ps(p, lane_mask(n), v);
}
static inline float v_hsum(vf v) {
    __m256 lo = _mm512_castps512_ps256(v);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    return kx_hsum256(_mm256_add_ps(lo, hi));
}
static inline float v_hmax(vf v) {
    return _mm512_reduce_max_ps(v);
}
/* lane j = sum of a[j]'s lanes: fold 512 -> 256 -> 128 bits pairing vectors as the
 * width halves, then within 128-bit lanes; lane L of 128-bit lane e then holds row
 * 4e + L, which one permute puts in place. */
static inline __attribute__((always_inline)) vf v_reduce_lanes(const vf *a) {
    vf x[8], y[4], v[2];
    /* unrolled, so that a caller's sums stay in registers rather than being stored for
     * a loop to read back */
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xee));
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        y[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], 0xdd));
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++)
        v[i] = _mm512_add_ps(_mm512_shuffle_ps(y[2 * i], y[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(y[2 * i], y[2 * i + 1], 0xee));
    vf r = _mm512_add_ps(_mm512_shuffle_ps(v[0], v[1], 0x88), _mm512_shuffle_ps(v[0], v[1], 0xdd));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), r);
}

/* 8-lane segment vocabulary (kern_generic.h, KG_HAVE_SEG8): a vector is two segments,
 * lanes 0-7 and 8-15 (two heads of 8 values). Segmented reduction of 8 products
 * a[i] = k[i] * q: lane s * 8 + i = sum of segment s of a[i] (the last three folds of
 * v_reduce_lanes, which never cross a segment), in two parts below; v_seg8_max / v_seg8_sum: every lane = its segment's max / sum;
 * v_load_halves: segment 0 from p0, segment 1 from p1; v_store_half: segment s. */
#define KG_HAVE_SEG8 1
/* First fold of v_reduce_seg8 for products a[i] = k[i] * q: its quarter shuffles of
 * k0, k1 (shared by every q) times q's quarters (v_seg8_qsplit, once per q):
 * x = fma(kb, qb, ka * qa) is the fold of (k0 * q, k1 * q). */
static inline void v_seg8_ksplit(vf k0, vf k1, vf *ka, vf *kb) {
    *ka = _mm512_shuffle_f32x4(k0, k1, 0x88);
    *kb = _mm512_shuffle_f32x4(k0, k1, 0xdd);
}
static inline void v_seg8_qsplit(vf q, vf *qa, vf *qb) {
    v_seg8_ksplit(q, q, qa, qb);
}
/* The rest of v_reduce_seg8 from the four first folds x[i] of (a[2i], a[2i + 1]). */
static inline vf v_reduce_seg8_folded(const vf *x) {
    vf y[2];
    for (int i = 0; i < 2; i++)
        y[i] = _mm512_add_ps(_mm512_shuffle_ps(x[2 * i], x[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(x[2 * i], x[2 * i + 1], 0xee));
    vf r = _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], 0x88), _mm512_shuffle_ps(y[0], y[1], 0xdd));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15), r);
}
static inline vf v_seg8_max(vf x) {
    x = _mm512_max_ps(x, _mm512_shuffle_ps(x, x, 0x4e));
    x = _mm512_max_ps(x, _mm512_shuffle_ps(x, x, 0xb1));
    return _mm512_max_ps(x, _mm512_shuffle_f32x4(x, x, 0xb1));
}
static inline vf v_seg8_sum(vf x) {
    x = _mm512_add_ps(x, _mm512_shuffle_ps(x, x, 0x4e));
    x = _mm512_add_ps(x, _mm512_shuffle_ps(x, x, 0xb1));
    return _mm512_add_ps(x, _mm512_shuffle_f32x4(x, x, 0xb1));
}
static inline vf v_load_halves(const float *p0, const float *p1) {
    __m512d lo = _mm512_castps_pd(_mm512_castps256_ps512(_mm256_loadu_ps(p0)));
    return _mm512_castpd_ps(_mm512_insertf64x4(lo, _mm256_castps_pd(_mm256_loadu_ps(p1)), 1));
}
static inline void v_store_half(float *p, vf x, int s) {
    _mm256_storeu_ps(p, s ? _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)) : _mm512_castps512_ps256(x));
}

/* KV cache vocabulary: VLEN int8 at p widened to floats, and
 * the f16 at p broadcast to every lane. */
static inline vf v_load_i8(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)p)));
}
static inline vf v_set1_f16(const uint8_t *p) {
    int16_t h;
    memcpy(&h, p, 2);
    return _mm512_cvtph_ps(_mm256_set1_epi16(h));
}

#define KG_HAVE_TRANSPOSE 1
static inline void v_transpose(const vf *in, vf *out) {
    transpose16(in, out);
}

#include "backend/cpu/kern_generic.h"

/* ---- int8 -------------------------------------------------------------------------- */

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
    cpu_qact_sum_blocks(qa, r);
}

/* Weights biased to unsigned bytes (w + 128, or 16 * nibble for Q4_0) as vpdpbusd's
 * unsigned operand; the accumulator starts at corr = -128 * quad sums of x, which
 * removes the bias exactly: sum (w + 128) x - 128 sum x = sum w x.
 *
 * Two blocks per 512-bit vector: lanes 0-7 hold block b's 8 quad sums, lanes 8-15
 * block b + 1's, so the bias, vpdpbusd, int -> float conversion and scale FMA each
 * run once per two blocks. The scales of 16 blocks come from one gather per column
 * (and one load per row); a permute spreads a pair's two scales over the halves. */

/* Weight blocks b and b + 1 of one column as unsigned bytes (the second half zero
 * when `one`: a last, odd block). */
static inline __attribute__((always_inline)) __m512i q_pair_weights(const uint8_t *blk, const int q4,
                                                                    const bool one) {
    if (q4) {
        const __m512i high4 = _mm512_set1_epi8((char)0xf0);
        const __m512i shift = _mm512_setr_epi32(4, 4, 4, 4, 0, 0, 0, 0, 4, 4, 4, 4, 0, 0, 0, 0);
        /* bytes 0..15 -> 16 * low nibbles (elements 0..15), 16..31 -> 16 * high nibbles */
        __m256i lo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(blk + 2)));
        __m512i q = one ? _mm512_zextsi256_si512(lo)
                        : _mm512_inserti64x4(_mm512_castsi256_si512(lo),
                                             _mm256_broadcastsi128_si256(_mm_loadu_si128(
                                                 (const __m128i *)(const void *)(blk + 2 + sizeof(block_q4_0)))),
                                             1);
        return _mm512_and_si512(_mm512_sllv_epi32(q, shift), high4);
    }
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m256i lo = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 2));
    if (one) return _mm512_zextsi256_si512(_mm256_xor_si256(lo, _mm512_castsi512_si256(flip)));
    __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(lo),
                                   _mm256_loadu_si256((const __m256i *)(const void *)(blk + 2 + sizeof(block_q8_0))),
                                   1);
    return _mm512_xor_si512(q, flip);
}

/* Blocks b, b + 1 (b only when `one`) of every tile row and column; bb = b's index
 * within its 16-block chunk, whose scales are in dw (per column) and dx (per row). */
static inline __attribute__((always_inline)) void q_pair_step(const struct cpu_qact *qa, int64_t r0,
                                                              const uint8_t *w, size_t ldw, int64_t b, int bb,
                                                              const __m512 *dw, const __m512 *dx,
                                                              __m512 (*acc)[CPU_TILE_C], const int q4,
                                                              const int nr, const int nc, const bool one) {
    const int64_t k = qa->k;
    const int blk_bytes = q4 ? (int)sizeof(block_q4_0) : (int)sizeof(block_q8_0);
    const __m512i pick = _mm512_add_epi32(_mm512_set1_epi32(bb),
                                          _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
    __m512i wu[CPU_TILE_C];
    __m512 dwp[CPU_TILE_C];
#pragma GCC unroll 4
    for (int c = 0; c < nc; c++) {
        const uint8_t *blk = w + c * ldw + b * blk_bytes;
        /* the next tile's rows into L1 and the rows 4 tiles ahead into L2: the hardware
         * prefetcher alone ramps up too slowly on these short interleaved streams, and
         * L1 prefetches alone keep too few lines in flight (bench/ab/prefetch.c: one
         * L2 prefetch per pair, +10-25 % from memory on one thread; a second one per
         * pair costs more in instructions than it brings) */
        _mm_prefetch((const char *)(blk + nc * ldw), _MM_HINT_T0);
        _mm_prefetch((const char *)(blk + nc * ldw + 2 * blk_bytes - 1), _MM_HINT_T0);
        _mm_prefetch((const char *)(blk + KG_PF_L2_TILES * nc * ldw + 2 * blk_bytes - 1), _MM_HINT_T1);
        wu[c] = q_pair_weights(blk, q4, one);
        dwp[c] = _mm512_permutexvar_ps(pick, dw[c]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++) {
        const int8_t *xp = qa->qs + (r0 + r) * k + b * CPU_QBLOCK;
        const int32_t *cp = qa->corr + (r0 + r) * (k / 4) + b * 8;
        __m512i xq = one ? _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)xp))
                         : _mm512_loadu_si512((const void *)xp);
        __m512i cr = one ? _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)cp))
                         : _mm512_loadu_si512((const void *)cp);
        __m512 dxp = nr == 1 ? _mm512_setzero_ps() : _mm512_permutexvar_ps(pick, dx[r]);
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) {
            __m512 s = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(cr, wu[c], xq));
            if (nr > 1) s = _mm512_mul_ps(s, dxp);
            acc[r][c] = _mm512_fmadd_ps(s, dwp[c], acc[r][c]);
        }
    }
}

static inline __attribute__((always_inline)) void tile_q_rc(const struct cpu_qact *qa, int64_t r0,
                                                            const uint8_t *w, size_t ldw, float *out,
                                                            const int q4, const int nr, const int nc) {
    const int64_t k = qa->k, nb = k / CPU_QBLOCK;
    const int blk_bytes = q4 ? (int)sizeof(block_q4_0) : (int)sizeof(block_q8_0);
    const __m512i blk_off = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(blk_bytes));
    /* 16 * nibble: the product comes out 16x, the scale takes 1/16 back (exact) */
    const __m512 wscale = _mm512_set1_ps(q4 ? 1.0f / 16.0f : 1.0f);
    __m512 acc[CPU_TILE_R][CPU_TILE_C];
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) acc[r][c] = _mm512_setzero_ps();
    for (int64_t b0 = 0; b0 < nb; b0 += 16) {
        int nbc = nb - b0 < 16 ? (int)(nb - b0) : 16;
        __mmask16 m = (__mmask16)((1u << nbc) - 1u);
        __m512 dw[CPU_TILE_C], dx[CPU_TILE_R];
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) dx[r] = _mm512_maskz_loadu_ps(m, qa->d + (r0 + r) * nb + b0);
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) {
            __m512i h = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, blk_off,
                                                    w + c * ldw + b0 * blk_bytes, 1);
            dw[c] = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(h)), wscale);
            if (nr == 1) dw[c] = _mm512_mul_ps(dw[c], dx[0]); /* one row: fold dx in once */
        }
        int bb = 0;
        for (; bb + 2 <= nbc; bb += 2) q_pair_step(qa, r0, w, ldw, b0 + bb, bb, dw, dx, acc, q4, nr, nc, false);
        if (bb < nbc) q_pair_step(qa, r0, w, ldw, b0 + bb, bb, dw, dx, acc, q4, nr, nc, true);
    }
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) out[r * CPU_TILE_C + c] = v_hsum(acc[r][c]);
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

/* ---- prefill GEMM ----------------------------------------------------------------- */

/* Panels hold CPU_GEMM_NC = 64 columns as 4 groups of 16 lanes.
 *   block types: per block of 32: 8 quads x 64 columns x 4 bytes of w + 128 (Q4_0:
 *                16 * nibble), then 64 f32 scales (Q4_0: scale / 16);
 *   float types: per k, 64 f32 values.
 * A micro-kernel keeps R rows x 64 columns of accumulators in registers; for each
 * quad (or k) it loads the 4 weight vectors once and broadcasts each row's 4 bytes
 * (or one float) against them, so vpdpbusd / FMA lanes are output columns and no
 * horizontal sums are needed. */
#define GQ_BLOCK_BYTES (8 * CPU_GEMM_NC * 4 + CPU_GEMM_NC * 4)
#define GQ_ROWS 3
#define GF_ROWS 6
/* Bytes ahead of its reads that gemm_pack prefetches a weight row (4 lines: measured
 * best of 128-2048 on the EPYC host). */
#define GEMM_PACK_AHEAD 256

static bool gemm_supports(enum ir_dtype t) {
    return t == IR_DTYPE_Q8_0 || t == IR_DTYPE_Q4_0 || t == IR_DTYPE_F32 || t == IR_DTYPE_F16 ||
           t == IR_DTYPE_BF16;
}

static int gemm_rows(enum ir_dtype t) {
    return t == IR_DTYPE_Q8_0 || t == IR_DTYPE_Q4_0 ? GQ_ROWS : GF_ROWS;
}

static size_t gemm_panel_bytes(enum ir_dtype t, int64_t k) {
    if (t == IR_DTYPE_Q8_0 || t == IR_DTYPE_Q4_0) return (size_t)(k / CPU_QBLOCK) * GQ_BLOCK_BYTES;
    return (size_t)k * CPU_GEMM_NC * sizeof(float);
}

/* The block types' panel (layout above) without a gather per quad: a group of 16
 * columns is walked to its end (16 streams, as the float pack below), and per step the
 * group's quant dwords of several blocks are loaded row by row as one vector per column
 * (Q8_0: the 8 dwords of blocks b, b + 1; Q4_0: the 4 of blocks b .. b + 3) and
 * transposed, so that vector j holds dword j of the 16 columns. Q8_0 quants are biased
 * to unsigned (w + 128), Q4_0's nibbles become 16 * nibble (quads 0-3 the low nibbles,
 * 4-7 the high ones). Scales are read as scalars (a gather per block and group measured
 * slower for Q4_0 on the EPYC host); absent columns (c >= nc) take column 0's scales and
 * zero quants. */
static void gemm_pack_q(const bool q4, const uint8_t *w, size_t ldw, int64_t k, int nc, uint8_t *panel) {
    const size_t bs = q4 ? sizeof(block_q4_0) : sizeof(block_q8_0);
    const int step = q4 ? 4 : 2; /* blocks per transposed tile */
    const int64_t nb = k / CPU_QBLOCK;
    const __m512i flip = _mm512_set1_epi8((char)0x80), high4 = _mm512_set1_epi8((char)0xf0);
    const __m512 sc_mul = _mm512_set1_ps(q4 ? 1.0f / 16.0f : 1.0f);
    for (int g = 0; g < 4; g++) {
        for (int64_t b0 = 0; b0 < nb; b0 += step) {
            const int n = nb - b0 < step ? (int)(nb - b0) : step;
            __m512 r[16], tr[16];
            _Alignas(32) uint16_t dsc[4][16];
            for (int i = 0; i < 16; i++) {
                const int c = 16 * g + i;
                const uint8_t *blk = w + (size_t)(c < nc ? c : 0) * ldw + (size_t)b0 * bs, *src = blk + 2;
                for (int j = 0; j < n; j++) memcpy(&dsc[j][i], blk + (size_t)j * bs, 2); /* d first */
                if (c >= nc) {
                    r[i] = _mm512_setzero_ps();
                    continue;
                }
                _mm_prefetch((const char *)src + GEMM_PACK_AHEAD, _MM_HINT_T0);
                __m512i v = _mm512_setzero_si512();
                if (q4) {
                    for (int j = 0; j < n; j++)
                        v = _mm512_mask_loadu_epi32(v, (__mmask16)(0xfu << (4 * j)),
                                                    (const void *)(src + (size_t)j * bs - 16 * j));
                } else {
                    v = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)src));
                    if (n > 1)
                        v = _mm512_inserti64x4(v, _mm256_loadu_si256((const __m256i *)(const void *)(src + bs)), 1);
                }
                r[i] = _mm512_castsi512_ps(v);
            }
            transpose16(r, tr);
            for (int j = 0; j < n; j++) {
                uint8_t *p = panel + (size_t)(b0 + j) * GQ_BLOCK_BYTES;
                const __m256i d16 = _mm256_load_si256((const __m256i *)(const void *)dsc[j]);
                const __m512 sc = _mm512_mul_ps(_mm512_cvtph_ps(d16), sc_mul);
                _mm512_store_ps((float *)(void *)(p + 8 * CPU_GEMM_NC * 4) + 16 * g, sc);
                for (int q = 0; q < 8; q++) {
                    __m512i v;
                    if (q4) {
                        v = _mm512_castps_si512(tr[4 * j + (q & 3)]);
                        v = _mm512_and_si512(q < 4 ? _mm512_slli_epi32(v, 4) : v, high4);
                    } else {
                        v = _mm512_xor_si512(_mm512_castps_si512(tr[8 * j + q]), flip);
                    }
                    _mm512_store_si512((void *)(p + (q * CPU_GEMM_NC + 16 * g) * 4), v);
                }
            }
        }
    }
}

static void gemm_pack(enum ir_dtype t, const uint8_t *w, size_t ldw, int64_t k, int nc, void *panel) {
    if (t == IR_DTYPE_Q8_0 || t == IR_DTYPE_Q4_0) {
        gemm_pack_q(t == IR_DTYPE_Q4_0, w, ldw, k, nc, panel);
        return;
    }
    /* float types: 16 columns x 16 k at a time, loaded (and widened) along k, then
     * transposed in registers so the panel holds 16 columns per k. A group of 16 rows
     * is walked to its end before the next (16 streams rather than 64 at once), each
     * row's line GEMM_PACK_AHEAD bytes on prefetched as its first bytes are read: the
     * weights come from memory once per op, and this doubled the pack's rate from a
     * mapped F16 file on the EPYC host (bench/results/cpu-f16-epyc-2026-11-30.md). */
    float *p = panel;
    const size_t esz = t == IR_DTYPE_F32 ? 4 : 2;
    for (int g = 0; g < 4; g++)
        for (int64_t k0 = 0; k0 < k; k0 += 16) {
            int n = k - k0 < 16 ? (int)(k - k0) : 16;
            bool line_start = (k0 * (int64_t)esz) % 64 == 0;
            __m512 r[16];
            for (int i = 0; i < 16; i++) {
                int c = 16 * g + i;
                const uint8_t *src = w + (size_t)c * ldw + (size_t)k0 * esz;
                if (c >= nc) {
                    r[i] = _mm512_setzero_ps();
                    continue;
                }
                if (line_start) _mm_prefetch((const char *)src + GEMM_PACK_AHEAD, _MM_HINT_T0);
                if (t == IR_DTYPE_F32) r[i] = v_load_n((const float *)(const void *)src, n);
                else if (t == IR_DTYPE_F16) r[i] = v_load_f16_n(src, n);
                else r[i] = v_load_bf16_n(src, n);
            }
            __m512 tr[16];
            transpose16(r, tr);
            for (int j = 0; j < n; j++) _mm512_store_ps(p + (k0 + j) * CPU_GEMM_NC + 16 * g, tr[j]);
        }
}

static inline __attribute__((always_inline)) void gemm_q_rc(const uint8_t *panel, const struct cpu_qact *qa,
                                                            int64_t r0, float *out, const int R) {
    const int64_t k = qa->k, nb = k / CPU_QBLOCK;
    __m512 acc[GQ_ROWS][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) acc[r][g] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *pb = panel + b * GQ_BLOCK_BYTES;
        __m512i is[GQ_ROWS][4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512i c = _mm512_set1_epi32(qa->bsum[(r0 + r) * nb + b]);
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) is[r][g] = c;
        }
#pragma GCC unroll 8
        for (int q = 0; q < 8; q++) {
            __m512i wv[4];
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) wv[g] = _mm512_load_si512((const void *)(pb + (q * CPU_GEMM_NC + 16 * g) * 4));
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                int32_t quad;
                memcpy(&quad, qa->qs + (r0 + r) * k + b * CPU_QBLOCK + 4 * q, 4);
                __m512i xb = _mm512_set1_epi32(quad);
#pragma GCC unroll 4
                for (int g = 0; g < 4; g++) is[r][g] = _mm512_dpbusd_epi32(is[r][g], wv[g], xb);
            }
        }
        const float *sc = (const float *)(const void *)(pb + 8 * CPU_GEMM_NC * 4);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512 dx = _mm512_set1_ps(qa->d[(r0 + r) * nb + b]);
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++)
                acc[r][g] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(is[r][g]), dx),
                                            _mm512_load_ps(sc + 16 * g), acc[r][g]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) _mm512_store_ps(out + r * CPU_GEMM_NC + 16 * g, acc[r][g]);
}

static inline __attribute__((always_inline)) void gemm_f_rc(const float *panel, const float *x, int64_t k,
                                                            float *out, const int R) {
    __m512 acc[GF_ROWS][4];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) acc[r][g] = _mm512_setzero_ps();
    for (int64_t kk = 0; kk < k; kk++) {
        const float *pk = panel + kk * CPU_GEMM_NC;
        __m512 wv[4];
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) wv[g] = _mm512_load_ps(pk + 16 * g);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 xb = _mm512_set1_ps(x[r * k + kk]);
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) acc[r][g] = _mm512_fmadd_ps(xb, wv[g], acc[r][g]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) _mm512_store_ps(out + r * CPU_GEMM_NC + 16 * g, acc[r][g]);
}

static void gemm_tile(enum ir_dtype t, const void *panel, const float *x, const struct cpu_qact *qa,
                      int64_t r0, int64_t k, int nr, float *out) {
    if (t == IR_DTYPE_Q8_0 || t == IR_DTYPE_Q4_0) {
        switch (nr) {
        case 1: gemm_q_rc(panel, qa, r0, out, 1); break;
        case 2: gemm_q_rc(panel, qa, r0, out, 2); break;
        default: gemm_q_rc(panel, qa, r0, out, 3); break;
        }
        return;
    }
    const float *xr = x + r0 * k;
    switch (nr) {
    case 1: gemm_f_rc(panel, xr, k, out, 1); break;
    case 2: gemm_f_rc(panel, xr, k, out, 2); break;
    case 3: gemm_f_rc(panel, xr, k, out, 3); break;
    case 4: gemm_f_rc(panel, xr, k, out, 4); break;
    case 5: gemm_f_rc(panel, xr, k, out, 5); break;
    default: gemm_f_rc(panel, xr, k, out, 6); break;
    }
}

/* n f16 values from src, 16 at a time and the rest masked (round to nearest even). */
static void store_f16(const float *src, uint8_t *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(void *)(dst + 2 * i), _mm512_cvtps_ph(_mm512_loadu_ps(src + i), 0));
    if (i < n) /* the rest through a mask */
        _mm256_mask_storeu_epi16(dst + 2 * i, lane_mask((int)(n - i)),
                                 _mm512_cvtps_ph(_mm512_maskz_loadu_ps(lane_mask((int)(n - i)), src + i), 0));
}

const struct cpu_isa_kernels cpu_isa_kernels_avx512 = {
    .isa = CPU_ISA_AVX512,
    KG_ISA_TABLE_ENTRIES,
    .gemm_panel_bytes = gemm_panel_bytes,
    .gemm_pack = gemm_pack,
    .gemm_tile = gemm_tile,
    .gemm_rows = gemm_rows,
    .gemm_supports = gemm_supports,
    .kq = &cpu_kq_kernels_avx512,
};

#endif
