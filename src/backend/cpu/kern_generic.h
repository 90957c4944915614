/* ISA-generic kernel bodies, written once over a small vector vocabulary and compiled
 * once per ISA: each isa_*.c defines the vocabulary and then includes this file.
 *
 *   vf, VLEN                      vector of VLEN floats
 *   v_zero() v_set1(f)            constants
 *   v_load(p) v_load_n(p, n)      f32 loads; _n: first n < VLEN lanes, the rest 0
 *   v_load_f16(p) v_load_f16_n    f16 / bf16 values at byte pointer p, widened
 *   v_load_bf16(p) v_load_bf16_n
 *   v_load_i8(p)                  VLEN int8 values at p, widened (KV cache q8_0)
 *   v_set1_f16(p)                 the f16 at byte pointer p in every lane
 *   v_store(p, v) v_store_n       stores (_n: first n lanes)
 *   v_add v_sub v_mul v_div v_max lane-wise
 *   v_fma(a, b, c)                a * b + c
 *   v_hsum(v) v_hmax(v)           horizontal sum / max
 *   v_exp(v)                      e^v (|rel err| ~ 2 ulp over the f32 range)
 *   v_reduce_lanes(vf a[VLEN])    lane j = sum of the lanes of a[j]
 *   v_transpose(in, out)          optional (KG_HAVE_TRANSPOSE): out[j] lane i = in[i] lane j
 *   TILE_PASS_R                   tile rows one pass keeps in registers
 *
 * Everything here is static; the including file puts the functions in its table. The
 * x86 files share the width-independent part of the vocabulary (arithmetic, v_exp)
 * through kern_x86.h. */
#ifndef LLMOPT_BACKEND_CPU_KERN_GENERIC_H
#define LLMOPT_BACKEND_CPU_KERN_GENERIC_H

#include "backend/cpu/kernels.h"
#include "backend/op_math.h"

#include <float.h>
#include <math.h>
#include <string.h>

#define KG_INLINE static inline __attribute__((always_inline))

enum { KG_W_F32, KG_W_F16, KG_W_BF16 };

/* Dot-product tiles prefetch weight rows this many tiles ahead into L2 (and the next
 * tile into L1). */
#define KG_PF_L2_TILES 4

KG_INLINE vf kg_load_w(const uint8_t *w, int64_t i, const int wt) {
    if (wt == KG_W_F32) return v_load((const float *)(const void *)w + i);
    if (wt == KG_W_F16) return v_load_f16(w + 2 * i);
    return v_load_bf16(w + 2 * i);
}

KG_INLINE vf kg_load_w_n(const uint8_t *w, int64_t i, int n, const int wt) {
    if (wt == KG_W_F32) return v_load_n((const float *)(const void *)w + i, n);
    if (wt == KG_W_F16) return v_load_f16_n(w + 2 * i, n);
    return v_load_bf16_n(w + 2 * i, n);
}

/* A nr x nc tile of dot products; nr, nc and wt are constants after inlining, so the
 * accumulators live in registers. Weights are loaded (and widened) once per tile and
 * reused across the nr activation rows. */
KG_INLINE void kg_tile_float(const float *x, int64_t ldx, const uint8_t *w, size_t ldw, int64_t k,
                             float *out, const int wt, const int nr, const int nc) {
    vf acc[CPU_TILE_R][CPU_TILE_C];
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) acc[r][c] = v_zero();
    /* U vectors per step: one 64-byte line of each weight row, prefetched once */
    const int eb = wt == KG_W_F32 ? 4 : 2, U = VLEN * eb >= 64 ? 1 : 64 / (VLEN * eb);
    int64_t i = 0;
    for (; i + U * VLEN <= k; i += U * VLEN) {
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) {
            /* the next tile's rows into L1, the rows KG_PF_L2_TILES ahead into L2 (see
             * the int8 tiles) */
            __builtin_prefetch(w + (c + nc) * ldw + i * eb);
            __builtin_prefetch(w + (c + KG_PF_L2_TILES * nc) * ldw + i * eb, 0, 2);
        }
#pragma GCC unroll 8
        for (int u = 0; u < U; u++) {
            vf wv[CPU_TILE_C];
#pragma GCC unroll 4
            for (int c = 0; c < nc; c++) wv[c] = kg_load_w(w + c * ldw, i + u * VLEN, wt);
#pragma GCC unroll 4
            for (int r = 0; r < nr; r++) {
                vf xv = v_load(x + r * ldx + i + u * VLEN);
#pragma GCC unroll 4
                for (int c = 0; c < nc; c++) acc[r][c] = v_fma(xv, wv[c], acc[r][c]);
            }
        }
    }
    for (; i + VLEN <= k; i += VLEN) {
        vf wv[CPU_TILE_C];
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) wv[c] = kg_load_w(w + c * ldw, i, wt);
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            vf xv = v_load(x + r * ldx + i);
#pragma GCC unroll 4
            for (int c = 0; c < nc; c++) acc[r][c] = v_fma(xv, wv[c], acc[r][c]);
        }
    }
    if (i < k) {
        int n = (int)(k - i);
        vf wv[CPU_TILE_C];
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) wv[c] = kg_load_w_n(w + c * ldw, i, n, wt);
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            vf xv = v_load_n(x + r * ldx + i, n);
#pragma GCC unroll 4
            for (int c = 0; c < nc; c++) acc[r][c] = v_fma(xv, wv[c], acc[r][c]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) out[r * CPU_TILE_C + c] = v_hsum(acc[r][c]);
}

/* Calls CALL(R, C) with constants matching the runtime nr (1..4), nc (1..4). */
#define KG_TILE_SWITCH(nr, nc, CALL)                                                       \
    switch (((nr)-1) * 4 + ((nc)-1)) {                                                     \
    case 0: CALL(1, 1); break;                                                             \
    case 1: CALL(1, 2); break;                                                             \
    case 2: CALL(1, 3); break;                                                             \
    case 3: CALL(1, 4); break;                                                             \
    case 4: CALL(2, 1); break;                                                             \
    case 5: CALL(2, 2); break;                                                             \
    case 6: CALL(2, 3); break;                                                             \
    case 7: CALL(2, 4); break;                                                             \
    case 8: CALL(3, 1); break;                                                             \
    case 9: CALL(3, 2); break;                                                             \
    case 10: CALL(3, 3); break;                                                            \
    case 11: CALL(3, 4); break;                                                            \
    case 12: CALL(4, 1); break;                                                            \
    case 13: CALL(4, 2); break;                                                            \
    case 14: CALL(4, 3); break;                                                            \
    default: CALL(4, 4); break;                                                            \
    }

/* One activation row (decode) against nc float weight rows: the rows one after another,
 * four accumulators a row, so each thread's reads are one sequential stream (its rows
 * are contiguous). The tile above, stepping 64 bytes of each of 4 rows at once, streamed
 * 43-48 GB/s of F16 on two threads against 57-62 for this (1.28-1.35x, bench/ab
 * ab_linear.c; the 0.6B F16 decode step 30.5-33.9 -> 25.0-26.7 ms): the hardware
 * prefetcher follows one stream better than four 2-6 KiB apart, and software prefetches
 * ahead of this stream measured slower. */
KG_INLINE void kg_row_float(const float *x, const uint8_t *w, size_t ldw, int64_t k, float *out, const int wt,
                            int nc) {
    for (int c = 0; c < nc; c++) {
        const uint8_t *wr = w + c * ldw;
        vf a0 = v_zero(), a1 = v_zero(), a2 = v_zero(), a3 = v_zero();
        int64_t i = 0;
        for (; i + 4 * VLEN <= k; i += 4 * VLEN) {
            a0 = v_fma(v_load(x + i), kg_load_w(wr, i, wt), a0);
            a1 = v_fma(v_load(x + i + VLEN), kg_load_w(wr, i + VLEN, wt), a1);
            a2 = v_fma(v_load(x + i + 2 * VLEN), kg_load_w(wr, i + 2 * VLEN, wt), a2);
            a3 = v_fma(v_load(x + i + 3 * VLEN), kg_load_w(wr, i + 3 * VLEN, wt), a3);
        }
        for (; i + VLEN <= k; i += VLEN) a0 = v_fma(v_load(x + i), kg_load_w(wr, i, wt), a0);
        if (i < k) a1 = v_fma(v_load_n(x + i, (int)(k - i)), kg_load_w_n(wr, i, (int)(k - i), wt), a1);
        out[c] = v_hsum(v_add(v_add(a0, a1), v_add(a2, a3)));
    }
}

#define KG_DEFINE_FLOAT_TILE(name, wt)                                                     \
    static void name(const float *x, int64_t ldx, const uint8_t *w, size_t ldw, int64_t k, \
                     int nr, int nc, float *out) {                                         \
        if (nr == 1) {                                                                     \
            kg_row_float(x, w, ldw, k, out, wt, nc);                                       \
            return;                                                                        \
        }                                                                                  \
        for (int r0 = 0; r0 < nr; r0 += TILE_PASS_R) {                                     \
            int pr = nr - r0 < TILE_PASS_R ? nr - r0 : TILE_PASS_R;                        \
            const float *xp = x + r0 * ldx;                                                \
            float *op = out + r0 * CPU_TILE_C;                                             \
            (void)xp;                                                                      \
            (void)op;                                                                      \
            (void)ldw;                                                                     \
            (void)k;                                                                       \
            (void)w;                                                                       \
            KG_TILE_SWITCH(pr, nc, KG_FLOAT_CALL_##wt)                                     \
        }                                                                                  \
    }
#define KG_FLOAT_CALL_KG_W_F32(R, C) kg_tile_float(xp, ldx, w, ldw, k, op, KG_W_F32, R, C)
#define KG_FLOAT_CALL_KG_W_F16(R, C) kg_tile_float(xp, ldx, w, ldw, k, op, KG_W_F16, R, C)
#define KG_FLOAT_CALL_KG_W_BF16(R, C) kg_tile_float(xp, ldx, w, ldw, k, op, KG_W_BF16, R, C)

KG_DEFINE_FLOAT_TILE(kg_tile_f32, KG_W_F32)
KG_DEFINE_FLOAT_TILE(kg_tile_f16, KG_W_F16)
KG_DEFINE_FLOAT_TILE(kg_tile_bf16, KG_W_BF16)

/* ---- small vector helpers --------------------------------------------------------- */

KG_INLINE float kg_dot(const float *a, const float *b, int64_t n) {
    vf acc0 = v_zero(), acc1 = v_zero();
    int64_t i = 0;
    for (; i + 2 * VLEN <= n; i += 2 * VLEN) {
        acc0 = v_fma(v_load(a + i), v_load(b + i), acc0);
        acc1 = v_fma(v_load(a + i + VLEN), v_load(b + i + VLEN), acc1);
    }
    for (; i + VLEN <= n; i += VLEN) acc0 = v_fma(v_load(a + i), v_load(b + i), acc0);
    if (i < n) acc1 = v_fma(v_load_n(a + i, (int)(n - i)), v_load_n(b + i, (int)(n - i)), acc1);
    return v_hsum(v_add(acc0, acc1));
}

/* y += a * x */
KG_INLINE void kg_axpy(float *y, float a, const float *x, int64_t n) {
    vf va = v_set1(a);
    int64_t i = 0;
    for (; i + VLEN <= n; i += VLEN) v_store(y + i, v_fma(va, v_load(x + i), v_load(y + i)));
    if (i < n) {
        int m = (int)(n - i);
        v_store_n(y + i, v_fma(va, v_load_n(x + i, m), v_load_n(y + i, m)), m);
    }
}

/* y *= a */
KG_INLINE void kg_scale(float *y, float a, int64_t n) {
    vf va = v_set1(a);
    int64_t i = 0;
    for (; i + VLEN <= n; i += VLEN) v_store(y + i, v_mul(va, v_load(y + i)));
    if (i < n) v_store_n(y + i, v_mul(va, v_load_n(y + i, (int)(n - i))), (int)(n - i));
}

/* y[i] = exp(y[i] - sub); returns the sum of the new values. */
KG_INLINE float kg_exp_sub_sum(float *y, float sub, int64_t n) {
    vf vs = v_set1(sub), acc = v_zero();
    int64_t i = 0;
    for (; i + VLEN <= n; i += VLEN) {
        vf e = v_exp(v_sub(v_load(y + i), vs));
        v_store(y + i, e);
        acc = v_add(acc, e);
    }
    float sum = v_hsum(acc);
    if (i < n) {
        int m = (int)(n - i);
        v_store_n(y + i, v_exp(v_sub(v_load_n(y + i, m), vs)), m);
        for (; i < n; i++) sum += y[i];
    }
    return sum;
}

static void kg_exp_row(const float *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + VLEN <= n; i += VLEN) v_store(dst + i, v_exp(v_load(src + i)));
    if (i < n) v_store_n(dst + i, v_exp(v_load_n(src + i, (int)(n - i))), (int)(n - i));
}

/* y = act(x + bias) * gate + residual over n values (the linear epilogue, one output
 * row of a tile). bias, gate, residual may be NULL; act is IR_OP_INPUT for none. The
 * common activations use the vector exp; others fall back to op_unary_apply. */
KG_INLINE vf kg_act(vf x, const int act) {
    const vf one = v_set1(1.0f);
    if (act == IR_OP_SILU) return v_div(x, v_add(one, v_exp(v_sub(v_zero(), x))));
    if (act == IR_OP_SIGMOID) return v_div(one, v_add(one, v_exp(v_sub(v_zero(), x))));
    if (act == IR_OP_RELU) return v_max(x, v_zero());
    if (act == IR_OP_GELU_TANH) {
        /* 0.5 x (1 + tanh(u)) = x / (1 + e^(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3) */
        vf u = v_mul(v_mul(x, v_set1(-2.0f * 0.79788456080286536f)),
                     v_fma(v_mul(x, x), v_set1(0.044715f), one));
        return v_div(x, v_add(one, v_exp(u)));
    }
    return x;
}

KG_INLINE void kg_epilogue_act(const float *x, int64_t n, const float *bias, const float *gate,
                               const float *residual, float *y, const int act) {
    int64_t i = 0;
    for (; i < n; i += VLEN) {
        int m = n - i < VLEN ? (int)(n - i) : VLEN;
        vf v = m == VLEN ? v_load(x + i) : v_load_n(x + i, m);
        if (bias) v = v_add(v, m == VLEN ? v_load(bias + i) : v_load_n(bias + i, m));
        v = kg_act(v, act);
        if (gate) v = v_mul(v, m == VLEN ? v_load(gate + i) : v_load_n(gate + i, m));
        if (residual) v = v_add(v, m == VLEN ? v_load(residual + i) : v_load_n(residual + i, m));
        if (m == VLEN) v_store(y + i, v);
        else v_store_n(y + i, v, m);
    }
}

static void kg_epilogue_row(const float *x, int64_t n, const float *bias, enum ir_op act, const float *gate,
                            const float *residual, float *y) {
    switch (act) {
    case IR_OP_INPUT: kg_epilogue_act(x, n, bias, gate, residual, y, IR_OP_INPUT); return;
    case IR_OP_SILU: kg_epilogue_act(x, n, bias, gate, residual, y, IR_OP_SILU); return;
    case IR_OP_SIGMOID: kg_epilogue_act(x, n, bias, gate, residual, y, IR_OP_SIGMOID); return;
    case IR_OP_RELU: kg_epilogue_act(x, n, bias, gate, residual, y, IR_OP_RELU); return;
    case IR_OP_GELU_TANH: kg_epilogue_act(x, n, bias, gate, residual, y, IR_OP_GELU_TANH); return;
    default: break;
    }
    for (int64_t i = 0; i < n; i++) {
        float v = x[i] + (bias ? bias[i] : 0.0f);
        v = op_unary_apply(act, v);
        if (gate) v *= gate[i];
        if (residual) v += residual[i];
        y[i] = v;
    }
}

static void kg_rms_norm_row(const float *x, const float *w, float eps, int64_t d, float *o) {
    vf acc = v_zero();
    int64_t i = 0;
    for (; i + VLEN <= d; i += VLEN) {
        vf xv = v_load(x + i);
        acc = v_fma(xv, xv, acc);
    }
    if (i < d) {
        vf xv = v_load_n(x + i, (int)(d - i));
        acc = v_fma(xv, xv, acc);
    }
    float scale = 1.0f / sqrtf(v_hsum(acc) / (float)d + eps);
    vf vs = v_set1(scale);
    for (i = 0; i + VLEN <= d; i += VLEN) v_store(o + i, v_mul(v_mul(v_load(x + i), vs), v_load(w + i)));
    if (i < d) {
        int n = (int)(d - i);
        v_store_n(o + i, v_mul(v_mul(v_load_n(x + i, n), vs), v_load_n(w + i, n)), n);
    }
}

static void kg_rope_row(const float *x, const float *c, const float *s, int64_t d, float *o) {
    int64_t half = d / 2, i = 0;
    for (; i + VLEN <= half; i += VLEN) {
        vf x0 = v_load(x + i), x1 = v_load(x + half + i);
        v_store(o + i, v_sub(v_mul(x0, v_load(c + i)), v_mul(x1, v_load(s + i))));
        v_store(o + half + i, v_add(v_mul(x1, v_load(c + half + i)), v_mul(x0, v_load(s + half + i))));
    }
    if (i < half) {
        int n = (int)(half - i);
        vf x0 = v_load_n(x + i, n), x1 = v_load_n(x + half + i, n);
        v_store_n(o + i, v_sub(v_mul(x0, v_load_n(c + i, n)), v_mul(x1, v_load_n(s + i, n))), n);
        v_store_n(o + half + i,
                  v_add(v_mul(x1, v_load_n(c + half + i, n)), v_mul(x0, v_load_n(s + half + i, n))), n);
    }
}

/* Positions per online-softmax step (a multiple of VLEN): scores of one chunk for all
 * heads of a group stay in L1 together with the chunk's K and V rows. */
#define KG_ATT_CHUNK 32
/* Positions per online-softmax step of the decode kernel (a multiple of VLEN). */
#define KG_DEC_CHUNK CPU_ATT_DEC_CHUNK
/* KV rows are byte pointers to a head's first value, f32, f16 or q8_0 (kt, enum
 * kv_dtype, a constant after inlining); VLEN values from value d on, widened (q8_0:
 * times the block's scale) in registers. */
KG_INLINE vf kg_load_kv(const uint8_t *row, int64_t d, const int kt) {
    if (kt == KV_DTYPE_Q8_0) { /* VLEN divides the block: one scale */
        const uint8_t *blk = row + d / KV_Q8_0_BLOCK * KV_Q8_0_BLOCK_BYTES;
        return v_mul(v_load_i8((const int8_t *)(blk + 2) + d % KV_Q8_0_BLOCK), v_set1_f16(blk));
    }
    return kt == KV_DTYPE_F16 ? v_load_f16(row + 2 * d) : v_load((const float *)(const void *)row + d);
}

KG_INLINE vf kg_load_kv_n(const uint8_t *row, int64_t d, int n, const int kt) {
    if (kt == KV_DTYPE_Q8_0) { /* not reached: q8_0 heads are whole blocks */
        float tmp[VLEN] = {0};
        const uint8_t *blk = row + d / KV_Q8_0_BLOCK * KV_Q8_0_BLOCK_BYTES;
        const float scale = fp16_to_f32((uint16_t)(blk[0] | blk[1] << 8));
        const int8_t *qs = (const int8_t *)(blk + 2) + d % KV_Q8_0_BLOCK;
        for (int i = 0; i < n; i++) tmp[i] = scale * (float)qs[i];
        return v_load(tmp);
    }
    return kt == KV_DTYPE_F16 ? v_load_f16_n(row + 2 * d, n) : v_load_n((const float *)(const void *)row + d, n);
}

/* dst[0..dh) = the q8_0 row at row (dh a multiple of 32; VLEN divides 32): each
 * block's quants widened and times its f16 scale. */
KG_INLINE void kg_widen_q8_0(const uint8_t *row, int64_t dh, float *dst) {
    for (int64_t b = 0; b < dh / KV_Q8_0_BLOCK; b++, row += KV_Q8_0_BLOCK_BYTES, dst += KV_Q8_0_BLOCK) {
        const vf scale = v_set1_f16(row);
#pragma GCC unroll 32
        for (int i = 0; i < KV_Q8_0_BLOCK; i += VLEN) v_store(dst + i, v_mul(v_load_i8((const int8_t *)(row + 2) + i), scale));
    }
}


/* out[j] = dot(q, rows[j]) for the VLEN rows at rows[0..VLEN): one vector of partial
 * sums per row, reduced all at once (v_reduce_lanes) rather than one horizontal sum
 * per row. */
KG_INLINE vf kg_dots(const float *q, const uint8_t *const *rows, int64_t dh, const int kt) {
    vf acc[VLEN];
#pragma GCC unroll 16
    for (int j = 0; j < VLEN; j++) acc[j] = v_zero();
    int64_t d = 0;
    for (; d + VLEN <= dh; d += VLEN) {
        vf qv = v_load(q + d);
#pragma GCC unroll 16
        for (int j = 0; j < VLEN; j++) acc[j] = v_fma(qv, kg_load_kv(rows[j], d, kt), acc[j]);
    }
    if (d < dh) {
        int n = (int)(dh - d);
        vf qv = v_load_n(q + d, n);
#pragma GCC unroll 16
        for (int j = 0; j < VLEN; j++) acc[j] = v_fma(qv, kg_load_kv_n(rows[j], d, n, kt), acc[j]);
    }
    return v_reduce_lanes(acc);
}

/* acc[d0 .. d0 + NV * VLEN) += sum_j p[j] * rows[j][same], the acc vectors held in
 * registers across the rows; the last vector has m lanes (1..VLEN). */
KG_INLINE void kg_weighted_sum_nv(float *acc, const float *p, const uint8_t *const *rows, int n, int64_t d0,
                                  int m, const int NV, const int kt) {
    /* U interleaved sums over the rows, so short heads are not bound by FMA latency */
    const int U = NV == 1 ? 4 : NV == 2 ? 2 : 1;
    vf a[4][4];
#pragma GCC unroll 4
    for (int u = 0; u < U; u++)
#pragma GCC unroll 4
        for (int i = 0; i < NV; i++)
            a[u][i] = u > 0 ? v_zero()
                            : i < NV - 1 || m == VLEN ? v_load(acc + d0 + i * VLEN) : v_load_n(acc + d0 + i * VLEN, m);
    int j = 0;
    for (; j + U <= n; j += U)
#pragma GCC unroll 4
        for (int u = 0; u < U; u++) {
            vf pj = v_set1(p[j + u]);
            const uint8_t *r = rows[j + u];
#pragma GCC unroll 4
            for (int i = 0; i < NV; i++)
                a[u][i] = v_fma(pj, i < NV - 1 || m == VLEN ? kg_load_kv(r, d0 + i * VLEN, kt)
                                                            : kg_load_kv_n(r, d0 + i * VLEN, m, kt),
                                a[u][i]);
        }
    for (; j < n; j++) {
        vf pj = v_set1(p[j]);
        const uint8_t *r = rows[j];
#pragma GCC unroll 4
        for (int i = 0; i < NV; i++)
            a[0][i] = v_fma(pj, i < NV - 1 || m == VLEN ? kg_load_kv(r, d0 + i * VLEN, kt)
                                                        : kg_load_kv_n(r, d0 + i * VLEN, m, kt),
                            a[0][i]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < NV; i++) {
        vf sum = a[0][i];
#pragma GCC unroll 4
        for (int u = 1; u < U; u++) sum = v_add(sum, a[u][i]);
        if (i < NV - 1 || m == VLEN) v_store(acc + d0 + i * VLEN, sum);
        else v_store_n(acc + d0 + i * VLEN, sum, m);
    }
}

/* acc[0..dh) += sum_j p[j] * rows[j][0..dh) over n rows. */
KG_INLINE void kg_weighted_sum(float *acc, const float *p, const uint8_t *const *rows, int n, int64_t dh,
                               const int kt) {
    for (int64_t d0 = 0; d0 < dh; d0 += 4 * VLEN) {
        int64_t left = dh - d0 < 4 * VLEN ? dh - d0 : 4 * VLEN;
        int nv = (int)((left + VLEN - 1) / VLEN), m = (int)(left - (nv - 1) * VLEN);
        switch (nv) {
        case 1: kg_weighted_sum_nv(acc, p, rows, n, d0, m, 1, kt); break;
        case 2: kg_weighted_sum_nv(acc, p, rows, n, d0, m, 2, kt); break;
        case 3: kg_weighted_sum_nv(acc, p, rows, n, d0, m, 3, kt); break;
        default: kg_weighted_sum_nv(acc, p, rows, n, d0, m, 4, kt); break;
        }
    }
}

/* rows[i] = row of position first + i (i < n) in store, offset by col_bytes; one
 * block-table lookup per block rather than a division per position. */
static inline void kg_kv_rows(const struct kv_cache *kv, uint8_t *const *store, int32_t layer, int32_t slot,
                              int32_t first, int n, int64_t col_bytes, const uint8_t **rows) {
    const int32_t bs = kv->block_size;
    const int64_t row_bytes = kv->row_bytes[layer];
    const int32_t *table = kv->block_table + (int64_t)slot * kv->max_blocks_per_slot;
    int i = 0;
    while (i < n) {
        int32_t pos = first + i, off = pos % bs;
        const uint8_t *base = store[layer] + ((int64_t)table[pos / bs] * bs + off) * row_bytes + col_bytes;
        for (; off < bs && i < n; off++, i++, base += row_bytes) rows[i] = base;
    }
}

/* Score tiles for blocks of queries: KG_QT queries x KG_PT positions = VLEN dot
 * products per tile, each K and q vector loaded once per tile, reduced together. */
#define KG_QT (VLEN >= 4 ? 4 : 1)
#define KG_PT (VLEN / KG_QT)

/* Lane a * KG_PT + b = dot(qp[a], kp[b]) over dh. */
KG_INLINE vf kg_score_tile(const float *const *qp, const uint8_t *const *kp, int64_t dh, const int kt) {
    vf acc[VLEN];
#pragma GCC unroll 16
    for (int i = 0; i < VLEN; i++) acc[i] = v_zero();
    int64_t d = 0;
    for (; d + VLEN <= dh; d += VLEN) {
        vf qv[KG_QT], kv[KG_PT];
#pragma GCC unroll 4
        for (int a = 0; a < KG_QT; a++) qv[a] = v_load(qp[a] + d);
#pragma GCC unroll 4
        for (int b = 0; b < KG_PT; b++) kv[b] = kg_load_kv(kp[b], d, kt);
#pragma GCC unroll 4
        for (int a = 0; a < KG_QT; a++)
#pragma GCC unroll 4
            for (int b = 0; b < KG_PT; b++) acc[a * KG_PT + b] = v_fma(qv[a], kv[b], acc[a * KG_PT + b]);
    }
    if (d < dh) {
        int n = (int)(dh - d);
        vf qv[KG_QT], kv[KG_PT];
#pragma GCC unroll 4
        for (int a = 0; a < KG_QT; a++) qv[a] = v_load_n(qp[a] + d, n);
#pragma GCC unroll 4
        for (int b = 0; b < KG_PT; b++) kv[b] = kg_load_kv_n(kp[b], d, n, kt);
#pragma GCC unroll 4
        for (int a = 0; a < KG_QT; a++)
#pragma GCC unroll 4
            for (int b = 0; b < KG_PT; b++) acc[a * KG_PT + b] = v_fma(qv[a], kv[b], acc[a * KG_PT + b]);
    }
    return v_reduce_lanes(acc);
}

/* acc[a][d0 .. d0 + NV * VLEN) += sum_j p[a][j] * rows[j][same] for KG_QT queries a
 * (score rows ld floats apart): each V vector loaded once for all the queries. */
KG_INLINE void kg_weighted_sum4_nv(float *const *acc, const float *p, int64_t ld, const uint8_t *const *rows,
                                   int n, int64_t d0, int m, const int NV, const int kt) {
    vf a[KG_QT][4];
#pragma GCC unroll 4
    for (int q = 0; q < KG_QT; q++)
#pragma GCC unroll 4
        for (int i = 0; i < NV; i++)
            a[q][i] = i < NV - 1 || m == VLEN ? v_load(acc[q] + d0 + i * VLEN) : v_load_n(acc[q] + d0 + i * VLEN, m);
    for (int j = 0; j < n; j++) {
        vf v[4];
#pragma GCC unroll 4
        for (int i = 0; i < NV; i++)
            v[i] = i < NV - 1 || m == VLEN ? kg_load_kv(rows[j], d0 + i * VLEN, kt)
                                           : kg_load_kv_n(rows[j], d0 + i * VLEN, m, kt);
#pragma GCC unroll 4
        for (int q = 0; q < KG_QT; q++) {
            vf pj = v_set1(p[q * ld + j]);
#pragma GCC unroll 4
            for (int i = 0; i < NV; i++) a[q][i] = v_fma(pj, v[i], a[q][i]);
        }
    }
#pragma GCC unroll 4
    for (int q = 0; q < KG_QT; q++)
#pragma GCC unroll 4
        for (int i = 0; i < NV; i++) {
            if (i < NV - 1 || m == VLEN) v_store(acc[q] + d0 + i * VLEN, a[q][i]);
            else v_store_n(acc[q] + d0 + i * VLEN, a[q][i], m);
        }
}

KG_INLINE void kg_weighted_sum4(float *const *acc, const float *p, int64_t ld, const uint8_t *const *rows, int n,
                                int64_t dh, const int kt) {
    for (int64_t d0 = 0; d0 < dh; d0 += 4 * VLEN) {
        int64_t left = dh - d0 < 4 * VLEN ? dh - d0 : 4 * VLEN;
        int nv = (int)((left + VLEN - 1) / VLEN), m = (int)(left - (nv - 1) * VLEN);
        switch (nv) {
        case 1: kg_weighted_sum4_nv(acc, p, ld, rows, n, d0, m, 1, kt); break;
        case 2: kg_weighted_sum4_nv(acc, p, ld, rows, n, d0, m, 2, kt); break;
        case 3: kg_weighted_sum4_nv(acc, p, ld, rows, n, d0, m, 3, kt); break;
        default: kg_weighted_sum4_nv(acc, p, ld, rows, n, d0, m, 4, kt); break;
        }
    }
}

/* Online softmax for a block of queries: tokens t0..t1-1 of one sequence at
 * consecutive positions (a prefill chunk; a single token in decode), and the
 * n_heads / n_kv_heads query heads that read KV head kvh. Each chunk of K and V rows
 * is fetched once for the whole block (a prefill reads the cache once per
 * CPU_ATT_QBLOCK tokens, not once per token), and with KG_QT queries or more the
 * scores and the weighted sums run as register tiles over several queries. */
KG_INLINE void kg_attention_block_kt(const struct cpu_attention *a, int64_t t0, int64_t t1, int64_t kvh,
                                     float *scratch, const int kt) {
    const int64_t dh = a->head_dim, group = a->n_heads / a->n_kv_heads, nq = (t1 - t0) * group;
    const int64_t nq_pad = (nq + KG_QT - 1) / KG_QT * KG_QT;
    const int64_t ld = KG_ATT_CHUNK + VLEN;  /* score row stride */
    float *acc = scratch;                    /* (nq_pad, dh); query (t, g) at (t - t0) * group + g */
    float *sc = acc + nq_pad * dh;           /* (nq_pad, ld) scores of one chunk */
    float *mx = sc + nq_pad * ld;            /* (nq_pad) running max */
    float *l = mx + nq_pad;                  /* (nq_pad) running sum */
    float *kwide = l + nq_pad;               /* (KG_ATT_CHUNK, dh) q8_0 K rows of a chunk as f32 */
    float *vwide = kwide + KG_ATT_CHUNK * dh; /* (KG_ATT_CHUNK, dh) same for V */
    /* q8_0 rows are widened once per chunk, then read as f32 by every query of the
     * block (a single query takes the decode kernel, which dequantizes in registers). */
    const int rt = kt == KV_DTYPE_Q8_0 ? KV_DTYPE_F32 : kt; /* type the inner kernels read */
    const uint8_t *krows[KG_ATT_CHUNK + VLEN], *vrows[KG_ATT_CHUNK];
    const float *qp[CPU_ATT_QBLOCK * 16 + KG_QT];
    float *accp[CPU_ATT_QBLOCK * 16 + KG_QT];
    const struct kv_cache *kv = a->kv;
    const bool tiled = nq >= KG_QT && nq <= CPU_ATT_QBLOCK * 16;
    int32_t slot = a->slot[t0], p_last = a->pos[t1 - 1], p_first = a->pos[t0];
    int32_t first = cpu_attention_first(a->window, p_first);
    for (int64_t q = 0; q < nq_pad; q++) {
        mx[q] = -INFINITY;
        l[q] = 0;
        for (int64_t e = 0; e < dh; e++) acc[q * dh + e] = 0;
        int64_t qq = q < nq ? q : nq - 1, t = t0 + qq / group, g = qq % group;
        if (tiled) {
            qp[q] = a->q + ((kvh * group + g) * a->n_tok + t) * dh;
            accp[q] = acc + q * dh;
        }
    }
    const vf vscale = v_set1(a->scale);
    for (int32_t j0 = first; j0 <= p_last; j0 += KG_ATT_CHUNK) {
        int n = p_last + 1 - j0 < KG_ATT_CHUNK ? p_last + 1 - j0 : KG_ATT_CHUNK;
        kg_kv_rows(kv, kv->k, a->layer, slot, j0, n, kv_dtype_bytes(kt, kvh * dh), krows);
        kg_kv_rows(kv, kv->v, a->layer, slot, j0, n, kv_dtype_bytes(kt, kvh * dh), vrows);
        if (kt == KV_DTYPE_Q8_0)
            for (int jj = 0; jj < n; jj++) {
                kg_widen_q8_0(krows[jj], dh, kwide + jj * dh);
                kg_widen_q8_0(vrows[jj], dh, vwide + jj * dh);
                krows[jj] = (const uint8_t *)(kwide + jj * dh);
                vrows[jj] = (const uint8_t *)(vwide + jj * dh);
            }
        /* rows past the last position repeat it: read by the vector dots, never used */
        for (int jj = n; jj < KG_ATT_CHUNK + VLEN; jj++) krows[jj] = krows[n - 1];
        int n_padded = (n + VLEN - 1) / VLEN * VLEN;
        if (tiled) /* every query's scores over the whole chunk, masked below */
            for (int64_t q0 = 0; q0 < nq_pad; q0 += KG_QT)
                for (int jj = 0; jj < n_padded; jj += KG_PT) {
                    float tile[VLEN];
                    v_store(tile, v_mul(kg_score_tile(qp + q0, krows + jj, dh, rt), vscale));
                    for (int aa = 0; aa < KG_QT; aa++)
                        for (int b = 0; b < KG_PT; b++) sc[(q0 + aa) * ld + jj + b] = tile[aa * KG_PT + b];
                }
        for (int64_t q = 0; q < nq; q++) {
            int64_t t = t0 + q / group, g = q % group;
            int32_t p = a->pos[t];
            int32_t lo_pos = cpu_attention_first(a->window, p);
            int lo = lo_pos > j0 ? lo_pos - j0 : 0, hi = p + 1 - j0 < n ? p + 1 - j0 : n;
            if (!tiled && hi <= lo) continue;
            float *s = sc + q * ld;
            if (!tiled) { /* scores from lo on, at s[0..) */
                const float *qv = a->q + ((kvh * group + g) * a->n_tok + t) * dh;
                int m = hi - lo, m_padded = (m + VLEN - 1) / VLEN * VLEN;
                for (int jj = 0; jj < m_padded; jj += VLEN)
                    v_store(s + jj, v_mul(kg_dots(qv, krows + lo + jj, dh, rt), vscale));
                for (int jj = m; jj < m_padded; jj++) s[jj] = -INFINITY;
                float cmax = s[0];
                for (int jj = 1; jj < m; jj++) cmax = s[jj] > cmax ? s[jj] : cmax;
                float m_new = cmax > mx[q] ? cmax : mx[q];
                float sum = kg_exp_sub_sum(s, m_new, m);
                if (mx[q] != m_new) {
                    float alpha = expf(mx[q] - m_new); /* 0 on the first chunk */
                    l[q] *= alpha;
                    kg_scale(acc + q * dh, alpha, dh);
                    mx[q] = m_new;
                }
                l[q] += sum;
                kg_weighted_sum(acc + q * dh, s, vrows + lo, m, dh, rt);
                continue;
            }
            /* tiled: probabilities over [0, n) with zeros outside [lo, hi) */
            if (hi <= lo) {
                for (int jj = 0; jj < n; jj++) s[jj] = 0.0f;
                continue;
            }
            float cmax = s[lo];
            for (int jj = lo + 1; jj < hi; jj++) cmax = s[jj] > cmax ? s[jj] : cmax;
            float m_new = cmax > mx[q] ? cmax : mx[q];
            float sum = kg_exp_sub_sum(s + lo, m_new, hi - lo);
            for (int jj = 0; jj < lo; jj++) s[jj] = 0.0f;
            for (int jj = hi; jj < n; jj++) s[jj] = 0.0f;
            if (mx[q] != m_new) {
                float alpha = expf(mx[q] - m_new);
                l[q] *= alpha;
                kg_scale(acc + q * dh, alpha, dh);
                mx[q] = m_new;
            }
            l[q] += sum;
        }
        if (tiled) {
            for (int64_t q = nq; q < nq_pad; q++) /* padding queries: weights 0 */
                for (int jj = 0; jj < n; jj++) sc[q * ld + jj] = 0.0f;
            for (int64_t q0 = 0; q0 < nq_pad; q0 += KG_QT)
                kg_weighted_sum4(accp + q0, sc + q0 * ld, ld, vrows, n, dh, rt);
        }
    }
    for (int64_t t = t0; t < t1; t++)
        for (int64_t g = 0; g < group; g++) {
            int64_t q = (t - t0) * group + g;
            float *ov = a->out + (t * a->n_heads + kvh * group + g) * dh; /* out (N, H, Dh) */
            float inv = 1.0f / l[q];
            for (int64_t e = 0; e < dh; e++) ov[e] = acc[q * dh + e] * inv;
        }
}

/* acc[g * dh + 0..dh) += sum_j p[g * ld + j] * rows[j][0..dh) for the G heads of a
 * group, dh <= VLEN: each V row is loaded once for all of them, two rows interleaved. */
KG_INLINE void kg_weighted_sum_heads(float *acc, const float *p, int64_t ld, const uint8_t *const *rows, int n,
                                     int dh, const int G, const int kt) {
    vf a[4], b[4];
#pragma GCC unroll 4
    for (int g = 0; g < G; g++) {
        a[g] = v_load_n(acc + g * dh, dh);
        b[g] = v_zero();
    }
    int j = 0;
    for (; j + 2 <= n; j += 2) {
        vf v0 = kg_load_kv_n(rows[j], 0, dh, kt), v1 = kg_load_kv_n(rows[j + 1], 0, dh, kt);
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
            a[g] = v_fma(v_set1(p[g * ld + j]), v0, a[g]);
            b[g] = v_fma(v_set1(p[g * ld + j + 1]), v1, b[g]);
        }
    }
    if (j < n) {
        vf v0 = kg_load_kv_n(rows[j], 0, dh, kt);
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) a[g] = v_fma(v_set1(p[g * ld + j]), v0, a[g]);
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; g++) v_store_n(acc + g * dh, v_add(a[g], b[g]), dh);
}

/* Software prefetch of KV rows in the decode kernel (rows of one KV head are a few
 * hundred bytes at a stride of the whole KV row, too short for the hardware prefetcher
 * to ramp up): K rows KG_PF_KD and V rows KG_PF_VD score steps ahead, to L2
 * (bench/ab/ab_attention.c measured 2/0 with the L2 hint best on AVX-512). */
#define KG_PF_KD 2
#define KG_PF_VD 0
#define KG_PF_K 2
#define KG_PF_V 2
/* Every cache line of rows[from..to) (len bytes each) toward the caches: locality
 * hint 3 = L1, 2 = L2. */
KG_INLINE void kg_prefetch_rows(const uint8_t *const *rows, int from, int to, int64_t len, const int hint) {
    for (int j = from; j < to; j++) {
        const uint8_t *line = (const uint8_t *)((uintptr_t)rows[j] & ~(uintptr_t)63), *end = rows[j] + len;
        for (; line < end; line += 64) {
            if (hint == 3) __builtin_prefetch(line, 0, 3);
            else __builtin_prefetch(line, 0, 2);
        }
    }
}

/* Accumulator vectors the grouped decode kernels keep in registers. */
#define KG_GROUP_ACC (VLEN >= 16 ? 16 : 8)

/* Scores of the G heads of a group (G divides VLEN) over R = VLEN / G rows: lane
 * g * R + r = dot(q[g], rows[r]) over dh, each K vector loaded (and widened) once for
 * the group; written scaled to s[g * ld + r]. */
KG_INLINE void kg_dots_group(const float *const *q, const uint8_t *const *rows, int64_t dh, vf vscale, float *s,
                             int64_t ld, const int G, const int kt) {
    const int R = VLEN / G;
    vf acc[VLEN];
#pragma GCC unroll 16
    for (int j = 0; j < VLEN; j++) acc[j] = v_zero();
    int64_t d = 0;
    for (; d + VLEN <= dh; d += VLEN) {
        vf qv[4];
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) qv[g] = v_load(q[g] + d);
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) {
            vf kv = kg_load_kv(rows[r], d, kt);
#pragma GCC unroll 4
            for (int g = 0; g < G; g++) acc[g * R + r] = v_fma(qv[g], kv, acc[g * R + r]);
        }
    }
    if (d < dh) {
        int n = (int)(dh - d);
        vf qv[4];
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) qv[g] = v_load_n(q[g] + d, n);
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) {
            vf kv = kg_load_kv_n(rows[r], d, n, kt);
#pragma GCC unroll 4
            for (int g = 0; g < G; g++) acc[g * R + r] = v_fma(qv[g], kv, acc[g * R + r]);
        }
    }
    float out[VLEN];
    v_store(out, v_mul(v_reduce_lanes(acc), vscale));
#pragma GCC unroll 4
    for (int g = 0; g < G; g++)
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) s[g * ld + r] = out[g * R + r];
}

/* acc[g * dh + d0 ..) += sum_j p[g * ld + j] * rows[j][d0 ..) for the G heads of a
 * group over NV vectors from d0 (the last one m lanes): each V vector is loaded once
 * for the group, G * NV sums in registers. */
KG_INLINE void kg_weighted_sum_group_nv(float *acc, const float *p, int64_t ld, const uint8_t *const *rows, int n,
                                        int64_t dh, int64_t d0, int m, const uint8_t *const *pf, int n_pf,
                                        int64_t pf_len, const int G, const int NV, const int kt) {
    vf a[4][KG_GROUP_ACC];
#pragma GCC unroll 4
    for (int g = 0; g < G; g++)
#pragma GCC unroll 16
        for (int i = 0; i < NV; i++) {
            const float *src = acc + g * dh + d0 + i * VLEN;
            a[g][i] = i < NV - 1 || m == VLEN ? v_load(src) : v_load_n(src, m);
        }
    for (int j = 0; j < n; j++) {
        if (j < n_pf) kg_prefetch_rows(pf, j, j + 1, pf_len, KG_PF_K);
        vf v[KG_GROUP_ACC];
#pragma GCC unroll 16
        for (int i = 0; i < NV; i++)
            v[i] = i < NV - 1 || m == VLEN ? kg_load_kv(rows[j], d0 + i * VLEN, kt)
                                           : kg_load_kv_n(rows[j], d0 + i * VLEN, m, kt);
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
            vf pj = v_set1(p[g * ld + j]);
#pragma GCC unroll 16
            for (int i = 0; i < NV; i++) a[g][i] = v_fma(pj, v[i], a[g][i]);
        }
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; g++)
#pragma GCC unroll 16
        for (int i = 0; i < NV; i++) {
            float *dst = acc + g * dh + d0 + i * VLEN;
            if (i < NV - 1 || m == VLEN) v_store(dst, a[g][i]);
            else v_store_n(dst, a[g][i], m);
        }
}

/* The same over all of dh; the first pass over the rows also prefetches the n_pf rows
 * at pf (pf_len bytes each: the next chunk's K rows). */
KG_INLINE void kg_weighted_sum_group(float *acc, const float *p, int64_t ld, const uint8_t *const *rows, int n,
                                     int64_t dh, const uint8_t *const *pf, int n_pf, int64_t pf_len, const int G,
                                     const int kt) {
    const int NV = KG_GROUP_ACC / G;
    int64_t d0 = 0;
    for (; d0 + NV * VLEN <= dh; d0 += NV * VLEN, n_pf = 0)
        kg_weighted_sum_group_nv(acc, p, ld, rows, n, dh, d0, VLEN, pf, n_pf, pf_len, G, NV, kt);
    for (; d0 < dh; d0 += VLEN, n_pf = 0) /* the rest one vector at a time */
        kg_weighted_sum_group_nv(acc, p, ld, rows, n, dh, d0, dh - d0 < VLEN ? (int)(dh - d0) : VLEN, pf, n_pf,
                                 pf_len, G, 1, kt);
}

/* K and V row pointers of positions j0 .. j0 + n of one KV head (bases kbase, vbase):
 * one block-table lookup per block. */
KG_INLINE void kg_dec_rows(const int32_t *table, int32_t bs, int64_t row_bytes, const uint8_t *kbase,
                           const uint8_t *vbase, int32_t j0, int n, const uint8_t **krows, const uint8_t **vrows) {
    for (int i = 0; i < n;) {
        int32_t pos = j0 + i, off = pos % bs;
        int64_t r = ((int64_t)table[pos / bs] * bs + off) * row_bytes;
        for (; off < bs && i < n; off++, i++, r += row_bytes) {
            krows[i] = kbase + r;
            vrows[i] = vbase + r;
        }
    }
}

/* Decode: one query token t (a run of one, the common case of a continuous batch) and
 * the n_heads / n_kv_heads query heads that read KV head kvh. Cheaper per call than the
 * block above, which small heads (stories260K: head_dim 8, ~0.7 us a call) feel: one
 * walk of the block table per chunk fills the K and V row pointers together, chunks are
 * KG_DEC_CHUNK positions (one online-softmax step for most contexts), the row maximum is
 * taken over whole score vectors, and nothing is set up per query but its accumulator.
 * Scratch: (group, dh) accumulators, (group, KG_DEC_CHUNK + VLEN) scores, running max
 * and sum per head. f32, f16 and q8_0 caches (kt; q8_0 vectors dequantized in registers,
 * 1.7-3.6x faster on Qwen3-0.6B's shape than the block kernel's chunks widened through
 * memory, bench/results/cpu-attention-2026-12-01.md). Groups of two or four heads larger than a
 * vector run together (kg_dots_group, kg_weighted_sum_group: each K and V vector
 * loaded once per group), and KV rows are prefetched ahead of their reads, the next
 * chunk's K rows during this chunk's weighted sums: 1.4-1.6x from memory on
 * Qwen3-0.6B's shape (16 heads over 8, head_dim 128; bench/ab/ab_attention.c).
 *
 * This one: positions [j_begin, j_end) of token t for KV head kvh, carrying on from the
 * state acc (group, dh: unnormalised weighted sums), mx and l (group: running max and
 * sum; mx -INFINITY and acc, l 0 for a fresh start). sc: (group, KG_DEC_CHUNK + VLEN)
 * scores. kg_attention_decode_kt below runs it over a token's whole context,
 * kg_attention_decode_seg over a segment of it. */
KG_INLINE void kg_attention_decode_range_kt(const struct cpu_attention *a, int64_t t, int64_t kvh, int32_t j_begin,
                                            int32_t j_end, float *acc, float *mx, float *l, float *sc,
                                            const int kt) {
    const int64_t dh = a->head_dim, group = a->n_heads / a->n_kv_heads, ld = KG_DEC_CHUNK + VLEN;
    const struct kv_cache *kv = a->kv;
    /* this chunk's rows and the next one's ([c] and [c ^ 1]) */
    const uint8_t *rowbuf[2][2][KG_DEC_CHUNK + VLEN];
    const int32_t p = j_end - 1, first = j_begin, bs = kv->block_size;
    const int64_t row_bytes = kv->row_bytes[a->layer], col = kv_dtype_bytes(kt, kvh * dh);
    const int32_t *table = kv->block_table + (int64_t)a->slot[t] * kv->max_blocks_per_slot;
    const uint8_t *kbase = kv->k[a->layer] + col, *vbase = kv->v[a->layer] + col;
    const vf vscale = v_set1(a->scale);
    const int64_t row_len = kv_dtype_bytes(kt, dh);
    /* heads of one vector, few to a group: their weighted sums share the V loads */
    const bool small = dh <= VLEN && group <= 4;
    /* larger heads, two or four to a group: scores and weighted sums of the whole
     * group at once, each K and V vector loaded once for it */
    const bool grouped = !small && (group == 2 || group == 4) && VLEN % group == 0;
    const float *qp[4];
    for (int64_t g = 0; g < group && g < 4; g++) qp[g] = a->q + ((kvh * group + g) * a->n_tok + t) * dh;
    int c = 0;
    kg_dec_rows(table, bs, row_bytes, kbase, vbase, first, p + 1 - first < KG_DEC_CHUNK ? p + 1 - first : KG_DEC_CHUNK,
                rowbuf[0][0], rowbuf[0][1]);
    for (int32_t j0 = first; j0 <= p; j0 += KG_DEC_CHUNK, c ^= 1) {
        const int n = p + 1 - j0 < KG_DEC_CHUNK ? p + 1 - j0 : KG_DEC_CHUNK, n_padded = (n + VLEN - 1) / VLEN * VLEN;
        const uint8_t **krows = rowbuf[c][0], **vrows = rowbuf[c][1];
        /* the next chunk's rows (the grouped path prefetches them while this one runs) */
        const int32_t j1 = j0 + KG_DEC_CHUNK;
        const int n1 = j1 > p ? 0 : p + 1 - j1 < KG_DEC_CHUNK ? p + 1 - j1 : KG_DEC_CHUNK;
        if (n1 > 0) kg_dec_rows(table, bs, row_bytes, kbase, vbase, j1, n1, rowbuf[c ^ 1][0], rowbuf[c ^ 1][1]);
        /* lanes past the last position repeat its row: a repeated score leaves the
         * maximum as it is, and the exponentials below stop at n */
        for (int jj = n; jj < n_padded; jj++) krows[jj] = krows[n - 1];
        if (grouped) {
            /* K rows a few steps ahead (the first chunk's: the previous chunk prefetched
             * the others) and this chunk's V rows toward the caches while the scores run */
            const int R = VLEN / (int)group;
            for (int jj = 0; jj < n_padded; jj += R) {
                int k0 = jj + KG_PF_KD * R, v0 = jj + KG_PF_VD * R;
                if (j0 == first) kg_prefetch_rows(krows, k0, k0 + R < n ? k0 + R : n, row_len, KG_PF_K);
                kg_prefetch_rows(vrows, v0, v0 + R < n ? v0 + R : n, row_len, KG_PF_V);
                if (group == 2) kg_dots_group(qp, krows + jj, dh, vscale, sc + jj, ld, 2, kt);
                else kg_dots_group(qp, krows + jj, dh, vscale, sc + jj, ld, 4, kt);
            }
        }
        for (int64_t g = 0; g < group; g++) {
            const float *qv = qp[g < 4 ? g : 0];
            float *s = sc + g * ld;
            vf vmax = v_set1(-INFINITY);
            if (grouped)
                for (int jj = 0; jj < n_padded; jj += VLEN) vmax = v_max(vmax, v_load(s + jj));
            else {
                qv = a->q + ((kvh * group + g) * a->n_tok + t) * dh;
                for (int jj = 0; jj < n_padded; jj += VLEN) {
                    if (g == 0 && !small) {
                        int k0 = jj + KG_PF_KD * VLEN;
                        kg_prefetch_rows(krows, k0, k0 + VLEN < n ? k0 + VLEN : n, row_len, KG_PF_K);
                        kg_prefetch_rows(vrows, jj, jj + VLEN < n ? jj + VLEN : n, row_len, KG_PF_V);
                    }
                    vf d = v_mul(kg_dots(qv, krows + jj, dh, kt), vscale);
                    v_store(s + jj, d);
                    vmax = v_max(vmax, d);
                }
            }
            float cmax = v_hmax(vmax), m_new = cmax > mx[g] ? cmax : mx[g];
            float sum = kg_exp_sub_sum(s, m_new, n);
            if (mx[g] != m_new) {
                if (mx[g] > -INFINITY) { /* acc and l are 0 before the first chunk */
                    float alpha = expf(mx[g] - m_new);
                    l[g] *= alpha;
                    kg_scale(acc + g * dh, alpha, dh);
                }
                mx[g] = m_new;
            }
            l[g] += sum;
            if (!small && !grouped) kg_weighted_sum(acc + g * dh, s, vrows, n, dh, kt);
        }
        if (grouped) {
            if (group == 2)
                kg_weighted_sum_group(acc, sc, ld, vrows, n, dh, rowbuf[c ^ 1][0], n1, row_len, 2, kt);
            else
                kg_weighted_sum_group(acc, sc, ld, vrows, n, dh, rowbuf[c ^ 1][0], n1, row_len, 4, kt);
        } else if (small) switch (group) {
            case 1: kg_weighted_sum_heads(acc, sc, ld, vrows, n, (int)dh, 1, kt); break;
            case 2: kg_weighted_sum_heads(acc, sc, ld, vrows, n, (int)dh, 2, kt); break;
            case 3: kg_weighted_sum_heads(acc, sc, ld, vrows, n, (int)dh, 3, kt); break;
            default: kg_weighted_sum_heads(acc, sc, ld, vrows, n, (int)dh, 4, kt); break;
            }
    }
}

/* A fresh online-softmax state of n heads: acc (n, dh) 0, running max -INFINITY, sum 0. */
KG_INLINE void kg_softmax_state_init(float *acc, float *mx, float *l, int64_t n, int64_t dh) {
    for (int64_t e = 0; e < n * dh; e++) acc[e] = 0;
    for (int64_t h = 0; h < n; h++) {
        mx[h] = -INFINITY;
        l[h] = 0;
    }
}

KG_INLINE void kg_attention_decode_kt(const struct cpu_attention *a, int64_t t, int64_t kvh, float *scratch,
                                      const int kt) {
    const int64_t dh = a->head_dim, group = a->n_heads / a->n_kv_heads;
    float *acc = scratch, *sc = acc + group * dh, *mx = sc + group * (KG_DEC_CHUNK + VLEN), *l = mx + group;
    const int32_t p = a->pos[t];
    const int32_t first = cpu_attention_first(a->window, p);
    kg_softmax_state_init(acc, mx, l, group, dh);
    kg_attention_decode_range_kt(a, t, kvh, first, p + 1, acc, mx, l, sc, kt);
    for (int64_t g = 0; g < group; g++) {
        float *ov = a->out + (t * a->n_heads + kvh * group + g) * dh; /* out (N, H, Dh) */
        kg_scale(acc + g * dh, 1.0f / l[g], dh);
        for (int64_t e = 0; e < dh; e++) ov[e] = acc[g * dh + e];
    }
}

/* ---- decode attention over segments of a long context ----------------------------- */

/* Token t (one query), positions [j_begin, j_end), every head: the
 * unnormalised state part = acc (n_heads, dh), then max (n_heads), then sum (n_heads),
 * for kg_attention_merge. cpu_attention_run hands the threads consecutive segments of
 * one token's context, so that each streams its own stretch of the cache. Split by KV
 * head instead, Qwen3-0.6B's decode attention ran 1.2x (512 positions) to 1.4x (4,096)
 * slower (bench/ab/ab_attention.c, 2 threads), likely because both threads then walk
 * the same rows at once, a few hundred bytes apart. Scratch: (group, KG_DEC_CHUNK +
 * VLEN) scores. */
static void kg_attention_decode_seg(const struct cpu_attention *a, int64_t t, int32_t j_begin, int32_t j_end,
                                    float *part, float *scratch) {
    const int64_t dh = a->head_dim, H = a->n_heads, group = H / a->n_kv_heads;
    const bool f16 = a->kv->dtype == KV_DTYPE_F16, q8 = a->kv->dtype == KV_DTYPE_Q8_0;
    float *acc = part, *mx = part + H * dh, *l = mx + H;
    kg_softmax_state_init(acc, mx, l, H, dh);
    for (int64_t h = 0; h < a->n_kv_heads; h++) {
        float *ah = acc + h * group * dh, *mh = mx + h * group, *lh = l + h * group;
        if (f16) kg_attention_decode_range_kt(a, t, h, j_begin, j_end, ah, mh, lh, scratch, KV_DTYPE_F16);
        else if (q8) kg_attention_decode_range_kt(a, t, h, j_begin, j_end, ah, mh, lh, scratch, KV_DTYPE_Q8_0);
        else kg_attention_decode_range_kt(a, t, h, j_begin, j_end, ah, mh, lh, scratch, KV_DTYPE_F32);
    }
}

/* Token t's output from n segment states (kg_attention_decode_seg's layout) in order:
 * per head, out = sum_i e^(max_i - max) acc_i / sum_i e^(max_i - max) sum_i. */
static void kg_attention_merge(const struct cpu_attention *a, int64_t t, const float *const *parts, int n) {
    const int64_t dh = a->head_dim, H = a->n_heads;
    for (int64_t h = 0; h < H; h++) {
        float m = -INFINITY, sum = 0;
        for (int i = 0; i < n; i++) m = parts[i][H * dh + h] > m ? parts[i][H * dh + h] : m;
        float *ov = a->out + (t * H + h) * dh; /* out (N, H, Dh) */
        for (int i = 0; i < n; i++) {
            const float w = expf(parts[i][H * dh + h] - m), *ai = parts[i] + h * dh;
            const vf vw = v_set1(w);
            sum += w * parts[i][H * dh + H + h];
            int64_t d = 0;
            if (i == 0) {
                for (; d + VLEN <= dh; d += VLEN) v_store(ov + d, v_mul(vw, v_load(ai + d)));
                for (; d < dh; d++) ov[d] = w * ai[d];
            } else {
                for (; d + VLEN <= dh; d += VLEN) v_store(ov + d, v_fma(vw, v_load(ai + d), v_load(ov + d)));
                for (; d < dh; d++) ov[d] += w * ai[d];
            }
        }
        kg_scale(ov, 1.0f / sum, dh);
    }
}

/* ---- prefill attention: a block of queries as two small GEMMs ---------------------- */

#if VLEN >= 8
/* A block of nq queries (tokens t0..t1-1 x the group's heads) against one KV head, the
 * queries in vector lanes: per chunk of CPU_ATT_PF_CHUNK positions, S^T = K Q^T (each K
 * value broadcast against two vectors of queries), the online softmax lane-wise (a
 * lane's max and sum never leave it), and O += P V (each V vector loaded once for
 * KG_PF_QB queries). The chunk's K and V rows are widened to f32 once for all queries
 * instead of once per dot product. Scores, probabilities and outputs are f32; the
 * softmax scale is folded into the queries. */
#define KG_PF_SQ (2 * VLEN)           /* queries per score micro-tile: two vectors */
#define KG_PF_NJ (VLEN >= 16 ? 8 : 4) /* positions per score micro-tile */
#define KG_PF_QB (VLEN >= 16 ? 8 : 2) /* queries per weighted-sum micro-tile ... */
#define KG_PF_NV (VLEN >= 16 ? 3 : 4) /* ... times vectors of V values */

/* s[jj * ldq + 0..SQ) = dot(query columns 0..SQ of qt, kf row jj) for jj < KG_PF_NJ;
 * qt is (dh, ldq), kf rows dh apart. */
KG_INLINE void kg_pf_scores(const float *qt, int64_t ldq, const float *kf, int64_t dh, float *s) {
    vf acc[KG_PF_NJ][2];
#pragma GCC unroll 8
    for (int jj = 0; jj < KG_PF_NJ; jj++) acc[jj][0] = acc[jj][1] = v_zero();
    for (int64_t d = 0; d < dh; d++) {
        vf qa = v_load(qt + d * ldq), qb = v_load(qt + d * ldq + VLEN);
#pragma GCC unroll 8
        for (int jj = 0; jj < KG_PF_NJ; jj++) {
            vf kb = v_set1(kf[jj * dh + d]);
            acc[jj][0] = v_fma(qa, kb, acc[jj][0]);
            acc[jj][1] = v_fma(qb, kb, acc[jj][1]);
        }
    }
#pragma GCC unroll 8
    for (int jj = 0; jj < KG_PF_NJ; jj++) {
        v_store(s + jj * ldq, acc[jj][0]);
        v_store(s + jj * ldq + VLEN, acc[jj][1]);
    }
}

/* For QB queries from the first: o[q][d0 .. d0 + NV * VLEN) = o * alpha[q] +
 * sum_j p[j * ldq + q] * vw[j][same] over n rows (o and vw rows dh apart); the last
 * vector has m lanes (1..VLEN). */
KG_INLINE void kg_pf_wsum_nv(float *o, int64_t dh, const float *alpha, const float *p, int64_t ldq, const float *vw,
                             int n, int64_t d0, int m, const int QB, const int NV) {
    vf acc[KG_PF_QB][KG_PF_NV];
#pragma GCC unroll 8
    for (int q = 0; q < QB; q++) {
        vf al = v_set1(alpha[q]);
#pragma GCC unroll 4
        for (int i = 0; i < NV; i++) {
            const float *src = o + q * dh + d0 + i * VLEN;
            acc[q][i] = v_mul(i < NV - 1 || m == VLEN ? v_load(src) : v_load_n(src, m), al);
        }
    }
    for (int j = 0; j < n; j++) {
        vf v[KG_PF_NV];
#pragma GCC unroll 4
        for (int i = 0; i < NV; i++) {
            const float *src = vw + j * dh + d0 + i * VLEN;
            v[i] = i < NV - 1 || m == VLEN ? v_load(src) : v_load_n(src, m);
        }
#pragma GCC unroll 8
        for (int q = 0; q < QB; q++) {
            vf pj = v_set1(p[j * ldq + q]);
#pragma GCC unroll 4
            for (int i = 0; i < NV; i++) acc[q][i] = v_fma(pj, v[i], acc[q][i]);
        }
    }
#pragma GCC unroll 8
    for (int q = 0; q < QB; q++)
#pragma GCC unroll 4
        for (int i = 0; i < NV; i++) {
            float *dst = o + q * dh + d0 + i * VLEN;
            if (i < NV - 1 || m == VLEN) v_store(dst, acc[q][i]);
            else v_store_n(dst, acc[q][i], m);
        }
}

KG_INLINE void kg_pf_wsum_qb(float *o, int64_t dh, const float *alpha, const float *p, int64_t ldq, const float *vw,
                             int n, const int QB) {
    for (int64_t d0 = 0; d0 < dh; d0 += KG_PF_NV * VLEN) {
        int64_t left = dh - d0 < KG_PF_NV * VLEN ? dh - d0 : KG_PF_NV * VLEN;
        int nv = (int)((left + VLEN - 1) / VLEN), m = (int)(left - (nv - 1) * VLEN);
        switch (nv) {
        case 1: kg_pf_wsum_nv(o, dh, alpha, p, ldq, vw, n, d0, m, QB, 1); break;
        case 2: kg_pf_wsum_nv(o, dh, alpha, p, ldq, vw, n, d0, m, QB, 2); break;
        case 3: kg_pf_wsum_nv(o, dh, alpha, p, ldq, vw, n, d0, m, QB, 3); break;
        default: kg_pf_wsum_nv(o, dh, alpha, p, ldq, vw, n, d0, m, QB, KG_PF_NV); break;
        }
    }
}

/* O += P V for queries [0, nq): micro-tiles of KG_PF_QB queries, then the rest. */
static void kg_pf_wsum(float *o, int64_t dh, const float *alpha, const float *p, int64_t ldq, const float *vw, int n,
                       int64_t nq) {
    int64_t q = 0;
    for (; q + KG_PF_QB <= nq; q += KG_PF_QB) kg_pf_wsum_qb(o + q * dh, dh, alpha + q, p + q, ldq, vw, n, KG_PF_QB);
    for (; q < nq; q++) kg_pf_wsum_qb(o + q * dh, dh, alpha + q, p + q, ldq, vw, n, 1);
}

/* dst[0..dh) = the KV row at row (stored type kt) as f32. */
static void kg_pf_widen(const uint8_t *row, int kt, int64_t dh, float *dst) {
    if (kt == KV_DTYPE_Q8_0) {
        kg_widen_q8_0(row, dh, dst);
        return;
    }
    if (kt != KV_DTYPE_F16) {
        memcpy(dst, row, (size_t)dh * sizeof(float));
        return;
    }
    int64_t d = 0;
    for (; d + VLEN <= dh; d += VLEN) v_store(dst + d, v_load_f16(row + 2 * d));
    if (d < dh) v_store_n(dst + d, v_load_f16_n(row + 2 * d, (int)(dh - d)), (int)(dh - d));
}

/* Chunk positions [lo, hi) query q may see (q < nq), relative to j0, clamped to
 * [0, n]. */
static void kg_pf_range(const struct cpu_attention *a, int64_t t0, int64_t group, int64_t q, int32_t j0, int n,
                        int *lo, int *hi) {
    int32_t p = a->pos[t0 + q / group];
    int32_t lo_pos = cpu_attention_first(a->window, p);
    *lo = lo_pos > j0 ? (lo_pos - j0 < n ? lo_pos - j0 : n) : 0;
    *hi = p + 1 - j0 < n ? (p + 1 - j0 > 0 ? p + 1 - j0 : 0) : n;
}

/* Sets s[jj * ldq + q] = val for the chunk positions jj < n query q may not see. */
static void kg_pf_mask(const struct cpu_attention *a, int64_t t0, int64_t group, int64_t nq, int32_t j0, int n,
                       float *s, int64_t ldq, float val) {
    for (int64_t q = 0; q < nq; q++) {
        int lo, hi;
        kg_pf_range(a, t0, group, q, j0, n, &lo, &hi);
        for (int jj = 0; jj < lo; jj++) s[jj * ldq + q] = val;
        for (int jj = hi; jj < n; jj++) s[jj * ldq + q] = val;
    }
}

/* qt[d * ldq + q] = scale * query q's value d (q < nq; 0 for the padding to ldq). */
static void kg_pf_transpose_q(const struct cpu_attention *a, int64_t t0, int64_t kvh, int64_t group, int64_t nq,
                              int64_t ldq, float *qt) {
    const int64_t dh = a->head_dim;
#ifdef KG_HAVE_TRANSPOSE
    const vf scale = v_set1(a->scale);
    for (int64_t q0 = 0; q0 < ldq; q0 += VLEN)
        for (int64_t d0 = 0; d0 < dh; d0 += VLEN) {
            int m = dh - d0 < VLEN ? (int)(dh - d0) : VLEN;
            vf in[VLEN], out[VLEN];
            for (int i = 0; i < VLEN; i++) {
                int64_t q = q0 + i;
                const float *qv = a->q + ((kvh * group + q % group) * a->n_tok + t0 + q / group) * dh + d0;
                in[i] = q >= nq ? v_zero() : v_mul(m == VLEN ? v_load(qv) : v_load_n(qv, m), scale);
            }
            v_transpose(in, out);
            for (int j = 0; j < m; j++) v_store(qt + (d0 + j) * ldq + q0, out[j]);
        }
#else
    memset(qt, 0, (size_t)(dh * ldq) * sizeof(float));
    for (int64_t q = 0; q < nq; q++) {
        const float *qv = a->q + ((kvh * group + q % group) * a->n_tok + t0 + q / group) * dh;
        for (int64_t d = 0; d < dh; d++) qt[d * ldq + q] = qv[d] * a->scale;
    }
#endif
}

static void kg_attention_prefill(const struct cpu_attention *a, int64_t t0, int64_t t1, int64_t kvh,
                                 float *scratch) {
    const int64_t dh = a->head_dim, group = a->n_heads / a->n_kv_heads, nq = (t1 - t0) * group;
    const int64_t ldq = (nq + KG_PF_SQ - 1) / KG_PF_SQ * KG_PF_SQ; /* <= cpu_attention_scratch_floats' pad */
    LLMOPT_ASSERT(ldq * (2 * dh + CPU_ATT_PF_CHUNK + 3) + 2 * CPU_ATT_PF_CHUNK * dh <= a->scratch_per_thread);
    const int kt = a->kv->dtype;
    float *qt = scratch;                        /* (dh, ldq) scaled queries, column q */
    float *o = qt + dh * ldq;                   /* (ldq, dh) outputs, not yet divided by l */
    float *s = o + ldq * dh;                    /* (CPU_ATT_PF_CHUNK, ldq) scores, then probabilities */
    float *mx = s + CPU_ATT_PF_CHUNK * ldq;     /* (ldq) running max */
    float *l = mx + ldq;                        /* (ldq) running sum */
    float *alpha = l + ldq;                     /* (ldq) this chunk's rescale of o and l */
    float *kf = alpha + ldq;                    /* (CPU_ATT_PF_CHUNK, dh) K rows as f32 */
    float *vw = kf + CPU_ATT_PF_CHUNK * dh;     /* (CPU_ATT_PF_CHUNK, dh) V rows as f32 */
    const uint8_t *krows[CPU_ATT_PF_CHUNK], *vrows[CPU_ATT_PF_CHUNK];
    const struct kv_cache *kv = a->kv;
    int32_t slot = a->slot[t0], p_first = a->pos[t0], p_last = a->pos[t1 - 1];
    int32_t first = cpu_attention_first(a->window, p_first);
    /* positions every query of the block sees: [all_lo, p_first] */
    int32_t all_lo = cpu_attention_first(a->window, p_last);
    for (int64_t q = 0; q < ldq; q++) {
        mx[q] = -INFINITY;
        l[q] = 0;
    }
    kg_pf_transpose_q(a, t0, kvh, group, nq, ldq, qt);
    memset(o, 0, (size_t)(ldq * dh) * sizeof(float));
    const vf lowest = v_set1(-FLT_MAX);
    const int64_t col = kv_dtype_bytes(kt, kvh * dh);
    for (int32_t j0 = first; j0 <= p_last; j0 += CPU_ATT_PF_CHUNK) {
        int n = p_last + 1 - j0 < CPU_ATT_PF_CHUNK ? p_last + 1 - j0 : CPU_ATT_PF_CHUNK;
        int n_tiles = (n + KG_PF_NJ - 1) / KG_PF_NJ * KG_PF_NJ;
        kg_kv_rows(kv, kv->k, a->layer, slot, j0, n, col, krows);
        kg_kv_rows(kv, kv->v, a->layer, slot, j0, n, col, vrows);
        for (int jj = 0; jj < n; jj++) {
            kg_pf_widen(krows[jj], kt, dh, kf + jj * dh);
            kg_pf_widen(vrows[jj], kt, dh, vw + jj * dh);
        }
        /* rows past the last position: scores computed, never used */
        memset(kf + n * dh, 0, (size_t)((n_tiles - n) * dh) * sizeof(float));
        for (int64_t q0 = 0; q0 < ldq; q0 += KG_PF_SQ)
            for (int jj = 0; jj < n_tiles; jj += KG_PF_NJ) kg_pf_scores(qt + q0, ldq, kf + jj * dh, dh, s + jj * ldq + q0);
        /* the causal / window edge: scores out of a query's range -inf (out of the max),
         * their probabilities 0 */
        const bool masked = j0 + n - 1 > p_first || j0 < all_lo;
        if (masked) kg_pf_mask(a, t0, group, nq, j0, n, s, ldq, -INFINITY);
        for (int64_t q = 0; q < ldq; q += VLEN) {
            vf m_old = v_load(mx + q), cmax = v_load(s + q);
            for (int jj = 1; jj < n; jj++) cmax = v_max(cmax, v_load(s + jj * ldq + q));
            vf m_new = v_max(m_old, cmax), m_sub = v_max(m_new, lowest); /* finite */
            vf al = v_exp(v_sub(m_old, m_sub)), sum = v_zero();
            for (int jj = 0; jj < n; jj++) {
                vf e = v_exp(v_sub(v_load(s + jj * ldq + q), m_sub));
                v_store(s + jj * ldq + q, e);
                sum = v_add(sum, e);
            }
            v_store(mx + q, m_new);
            v_store(alpha + q, al);
            v_store(l + q, masked ? v_mul(v_load(l + q), al) : v_fma(v_load(l + q), al, sum));
        }
        if (masked) { /* v_exp(-inf) is the smallest normal, not 0: zero, then sum */
            kg_pf_mask(a, t0, group, nq, j0, n, s, ldq, 0.0f);
            for (int64_t q = 0; q < ldq; q += VLEN) {
                vf sum = v_zero();
                for (int jj = 0; jj < n; jj++) sum = v_add(sum, v_load(s + jj * ldq + q));
                v_store(l + q, v_add(v_load(l + q), sum));
            }
        }
        kg_pf_wsum(o, dh, alpha, s, ldq, vw, n, nq);
    }
    for (int64_t q = 0; q < nq; q++) {
        float *ov = a->out + ((t0 + q / group) * a->n_heads + kvh * group + q % group) * dh; /* out (N, H, Dh) */
        vf inv = v_set1(1.0f / l[q]);
        int64_t e = 0;
        for (; e + VLEN <= dh; e += VLEN) v_store(ov + e, v_mul(v_load(o + q * dh + e), inv));
        if (e < dh) v_store_n(ov + e, v_mul(v_load_n(o + q * dh + e, (int)(dh - e)), inv), (int)(dh - e));
    }
}
#endif

/* Blocks of VLEN queries or more take the prefill kernel; otherwise one instance of the
 * block per KV element type, and single-token runs take the decode kernel. */
static void kg_attention_block(const struct cpu_attention *a, int64_t t0, int64_t t1, int64_t kvh,
                               float *scratch) {
#if VLEN >= 8
    if ((t1 - t0) * (a->n_heads / a->n_kv_heads) >= VLEN) {
        kg_attention_prefill(a, t0, t1, kvh, scratch);
        return;
    }
#endif
    if (t1 - t0 == 1) {
        switch (a->kv->dtype) {
        case KV_DTYPE_F16: kg_attention_decode_kt(a, t0, kvh, scratch, KV_DTYPE_F16); return;
        case KV_DTYPE_Q8_0: kg_attention_decode_kt(a, t0, kvh, scratch, KV_DTYPE_Q8_0); return;
        default: kg_attention_decode_kt(a, t0, kvh, scratch, KV_DTYPE_F32); return;
        }
    }
    switch (a->kv->dtype) {
    case KV_DTYPE_F16: kg_attention_block_kt(a, t0, t1, kvh, scratch, KV_DTYPE_F16); return;
    case KV_DTYPE_Q8_0: kg_attention_block_kt(a, t0, t1, kvh, scratch, KV_DTYPE_Q8_0); return;
    default: kg_attention_block_kt(a, t0, t1, kvh, scratch, KV_DTYPE_F32); return;
    }
}

/* ---- decode attention over every head of a token at once (small heads) ------------- */

/* Heads of dh = VLEN / S values: a KV row (all Hkv heads) is NV = Hkv / S vectors of S
 * heads each, and a vector's lanes [s * dh, (s + 1) * dh) are segment s. S = 1
 * (dh = VLEN) everywhere; S = 2 (dh = 8) where the ISA defines the 8-lane segment
 * vocabulary (KG_HAVE_SEG8: v_seg8_ksplit, v_seg8_qsplit, v_reduce_seg8_folded,
 * v_seg8_max, v_seg8_sum, v_load_halves, v_store_half). */

/* Every lane of a segment = the max / sum of that segment's lanes. */
KG_INLINE vf kg_seg_max(vf x, const int S) {
#ifdef KG_HAVE_SEG8
    if (S == 2) return v_seg8_max(x);
#endif
    (void)S;
    return v_set1(v_hmax(x));
}

KG_INLINE vf kg_seg_sum(vf x, const int S) {
#ifdef KG_HAVE_SEG8
    if (S == 2) return v_seg8_sum(x);
#endif
    (void)S;
    return v_set1(v_hsum(x));
}

/* r[g] lane s * NP + i = dot of segment s of k[i] and of q[g], for NP = VLEN / S rows
 * k and G queries (qa, qb: q split by v_seg8_qsplit where S = 2; q[g] = qa[g] else). */
KG_INLINE void kg_dots_seg(const vf *k, const vf *qa, const vf *qb, vf *r, const int S, const int G) {
#ifdef KG_HAVE_SEG8
    if (S == 2) {
        vf x[4][4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            vf ka, kb;
            v_seg8_ksplit(k[2 * i], k[2 * i + 1], &ka, &kb);
#pragma GCC unroll 4
            for (int g = 0; g < G; g++) x[g][i] = v_fma(kb, qb[g], v_mul(ka, qa[g]));
        }
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) r[g] = v_reduce_seg8_folded(x[g]);
        return;
    }
#endif
    (void)qb;
#pragma GCC unroll 4
    for (int g = 0; g < G; g++) {
        vf pr[VLEN];
        for (int i = 0; i < VLEN / S; i++) pr[i] = v_mul(k[i], qa[g]);
        r[g] = v_reduce_lanes(pr);
    }
}

/* Segment s from p[s] (VLEN / S floats each). */
KG_INLINE vf kg_load_segs(const float *const *p, const int S) {
#ifdef KG_HAVE_SEG8
    if (S == 2) return v_load_halves(p[0], p[1]);
#endif
    (void)S;
    return v_load(p[0]);
}

/* VLEN / S floats at p = segment s of x. */
KG_INLINE void kg_store_seg(float *p, vf x, int s, const int S) {
#ifdef KG_HAVE_SEG8
    if (S == 2) {
        v_store_half(p, x, s);
        return;
    }
#endif
    (void)S;
    (void)s;
    v_store(p, x);
}

/* 32 ones, then 32 zeros: VLEN floats from kg_ones_zeros + 32 - n are n ones, then
 * zeros (n <= VLEN). */
static const float kg_ones_zeros[64] = {
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
};

/* One query token t (a run of one) and every head: the block table is walked once per
 * chunk for all KV heads, the scores of NP = VLEN / S positions for S heads come out of
 * one segmented reduction (no lane wasted on heads narrower than a vector), the softmax
 * runs on whole vectors with per-segment maxima, and each V vector (S heads) is loaded
 * once for the G query heads of each, its weights broadcast from memory (one
 * accumulator per query head, of which segment s is kept). G (1, 2, 4) and S are
 * constants. Scratch: (G, chunk * S) probabilities, then the accumulators, maxima and
 * sums carried between chunks, (nv, G * S + 2 G, VLEN). */
KG_INLINE void kg_attention_heads_kt(const struct cpu_attention *a, int64_t t, float *scratch, const int kt,
                                     const int S, const int G) {
    const int NP = VLEN / S, dh = VLEN / S;
    const struct kv_cache *kv = a->kv;
    const int64_t n_tok = a->n_tok, nv = a->n_kv_heads / S, ld = KG_DEC_CHUNK * S, nst = G * S + 2 * G;
    float *sc = scratch;    /* (G, ld): probabilities of one chunk, steps of VLEN */
    float *st = sc + G * ld; /* (nv, nst, VLEN): acc, max, sum between chunks */
    int64_t roff[KG_DEC_CHUNK + VLEN];
    const int32_t p = a->pos[t], bs = kv->block_size;
    const int32_t first = cpu_attention_first(a->window, p);
    const int64_t row_bytes = kv->row_bytes[a->layer];
    const int32_t *table = kv->block_table + (int64_t)a->slot[t] * kv->max_blocks_per_slot;
    const uint8_t *kbase = kv->k[a->layer], *vbase = kv->v[a->layer];
    const vf vscale = v_set1(a->scale);
    for (int32_t j0 = first; j0 <= p; j0 += KG_DEC_CHUNK) {
        const int n = p + 1 - j0 < KG_DEC_CHUNK ? p + 1 - j0 : KG_DEC_CHUNK;
        const int steps = (n + NP - 1) / NP, tail = n - (steps - 1) * NP;
        { /* row offsets: one block-table lookup per block; the rows' first lines are
           * requested now (a decode batch's cache is past L2, and the loads below
           * go row by row through pointers) */
            int32_t blk = j0 / bs, off = j0 % bs;
            for (int i = 0; i < n; blk++, off = 0) {
                int64_t r = ((int64_t)table[blk] * bs + off) * row_bytes;
                for (; off < bs && i < n; off++, i++, r += row_bytes) {
                    roff[i] = r;
                    __builtin_prefetch(kbase + r);
                    __builtin_prefetch(vbase + r);
                }
            }
        }
        /* positions past the last repeat its row: the same score, probability masked to 0 */
        for (int i = n; i < steps * NP; i++) roff[i] = roff[n - 1];
        const float *tm[2] = {kg_ones_zeros + 32 - tail, kg_ones_zeros + 32 - tail};
        const vf tmask = kg_load_segs(tm, S);
        for (int64_t v = 0; v < nv; v++) {
            const int64_t kcol = kv_dtype_bytes(kt, v * VLEN);
            float *sv = st + v * nst * VLEN;
            vf acc[8], mx[4], sum[4], qa[4], qb[4], cmax[4];
#pragma GCC unroll 4
            for (int g = 0; g < G; g++) {
                const float *qh[2];
                for (int s = 0; s < S; s++) qh[s] = a->q + (((v * S + s) * G + g) * n_tok + t) * dh;
                qa[g] = qb[g] = v_mul(kg_load_segs(qh, S), vscale);
#ifdef KG_HAVE_SEG8
                if (S == 2) v_seg8_qsplit(qa[g], &qa[g], &qb[g]);
#endif
                cmax[g] = v_set1(-INFINITY);
            }
            /* scores of NP positions x S heads per reduction, each K vector loaded once
             * for the G query heads */
            for (int s0 = 0; s0 < steps; s0++) {
                const int64_t *ro = roff + s0 * NP;
                vf kk[VLEN], r[4];
#pragma GCC unroll 16
                for (int i = 0; i < NP; i++) kk[i] = kg_load_kv(kbase + ro[i] + kcol, 0, kt);
                kg_dots_seg(kk, qa, qb, r, S, G);
#pragma GCC unroll 4
                for (int g = 0; g < G; g++) {
                    v_store(sc + g * ld + s0 * VLEN, r[g]);
                    cmax[g] = v_max(cmax[g], r[g]);
                }
            }
#pragma GCC unroll 4
            for (int g = 0; g < G; g++) {
                /* online softmax: per-segment maxima, rescale what earlier chunks summed */
                vf m_new = kg_seg_max(cmax[g], S);
                sum[g] = v_zero();
                if (j0 != first) {
                    vf m_old = v_load(sv + (G * S + g) * VLEN);
                    m_new = v_max(m_new, m_old);
                    vf alpha = v_exp(v_sub(m_old, m_new));
                    sum[g] = v_mul(v_load(sv + (G * S + G + g) * VLEN), alpha);
#pragma GCC unroll 2
                    for (int s = 0; s < S; s++) acc[g * S + s] = v_mul(v_load(sv + (g * S + s) * VLEN), alpha);
                } else {
#pragma GCC unroll 2
                    for (int s = 0; s < S; s++) acc[g * S + s] = v_zero();
                }
                mx[g] = m_new;
                for (int s0 = 0; s0 < steps; s0++) {
                    float *ps = sc + g * ld + s0 * VLEN;
                    vf e = v_exp(v_sub(v_load(ps), m_new));
                    if (s0 == steps - 1) e = v_mul(e, tmask);
                    v_store(ps, e);
                    sum[g] = v_add(sum[g], e);
                }
            }
            /* weighted sums: each V vector once for the G * S query heads it serves */
            for (int s0 = 0; s0 < steps; s0++) {
                const int64_t *ro = roff + s0 * NP;
                const float *ps = sc + s0 * VLEN;
#pragma GCC unroll 16
                for (int i = 0; i < NP; i++) {
                    vf vv = kg_load_kv(vbase + ro[i] + kcol, 0, kt);
#pragma GCC unroll 4
                    for (int g = 0; g < G; g++)
#pragma GCC unroll 2
                        for (int s = 0; s < S; s++)
                            acc[g * S + s] = v_fma(v_set1(ps[g * ld + s * NP + i]), vv, acc[g * S + s]);
                }
            }
            if (j0 + KG_DEC_CHUNK <= p) { /* another chunk follows */
#pragma GCC unroll 4
                for (int g = 0; g < G; g++) {
#pragma GCC unroll 2
                    for (int s = 0; s < S; s++) v_store(sv + (g * S + s) * VLEN, acc[g * S + s]);
                    v_store(sv + (G * S + g) * VLEN, mx[g]);
                    v_store(sv + (G * S + G + g) * VLEN, sum[g]);
                }
                continue;
            }
#pragma GCC unroll 4
            for (int g = 0; g < G; g++) {
                vf inv = v_div(v_set1(1.0f), kg_seg_sum(sum[g], S));
#pragma GCC unroll 2
                for (int s = 0; s < S; s++) /* out (N, H, Dh) */
                    kg_store_seg(a->out + (t * a->n_heads + (v * S + s) * G + g) * dh, v_mul(acc[g * S + s], inv), s, S);
            }
        }
    }
}

/* The shapes kg_attention_heads takes: f32 / f16 caches, dh = VLEN (or VLEN / 2 with an
 * even Hkv where the ISA has the segment vocabulary), 1, 2 or 4 query heads per KV
 * head. Scratch: cpu_attention_scratch_floats covers it (2 G chunk + 4 H Dh). */
static bool kg_attention_heads_ok(const struct cpu_attention *a) {
    const int64_t dh = a->head_dim, hkv = a->n_kv_heads, group = hkv > 0 ? a->n_heads / hkv : 0;
    if (VLEN < 8 || (a->kv->dtype != KV_DTYPE_F32 && a->kv->dtype != KV_DTYPE_F16)) return false;
    if ((group != 1 && group != 2 && group != 4) || group * hkv != a->n_heads) return false;
    if (dh == VLEN) return true;
#ifdef KG_HAVE_SEG8
    if (dh == VLEN / 2 && hkv % 2 == 0) return true;
#endif
    return false;
}

#define KG_HEADS_G(kt, S)                                                                  \
    switch (group) {                                                                       \
    case 1: kg_attention_heads_kt(a, t, scratch, kt, S, 1); return;                        \
    case 2: kg_attention_heads_kt(a, t, scratch, kt, S, 2); return;                        \
    default: kg_attention_heads_kt(a, t, scratch, kt, S, 4); return;                       \
    }

static void kg_attention_heads(const struct cpu_attention *a, int64_t t, float *scratch) {
    const int64_t group = a->n_heads / a->n_kv_heads;
    const bool f16 = a->kv->dtype == KV_DTYPE_F16;
#ifdef KG_HAVE_SEG8
    if (a->head_dim != VLEN) {
        if (f16) KG_HEADS_G(KV_DTYPE_F16, 2)
        KG_HEADS_G(KV_DTYPE_F32, 2)
    }
#endif
    if (f16) KG_HEADS_G(KV_DTYPE_F16, 1)
    KG_HEADS_G(KV_DTYPE_F32, 1)
}

/* The entries of an ISA's kernel table (struct cpu_isa_kernels, kernels.h) that every ISA
 * file fills the same way: this file's generic kernels, and the four that each ISA file
 * defines itself under these names (static tile_q8_0, tile_q4_0, quantize_row,
 * store_f16). The table adds its .isa, its K-quant table and any GEMM micro-kernels. */
#define KG_ISA_TABLE_ENTRIES                                                                 \
    .tile_f32 = kg_tile_f32, .tile_f16 = kg_tile_f16, .tile_bf16 = kg_tile_bf16,           \
    .tile_q8_0 = tile_q8_0, .tile_q4_0 = tile_q4_0, .quantize_row = quantize_row,           \
    .rms_norm_row = kg_rms_norm_row, .rope_row = kg_rope_row,                               \
    .attention_block = kg_attention_block, .attention_heads_ok = kg_attention_heads_ok,     \
    .attention_heads = kg_attention_heads, .attention_decode_seg = kg_attention_decode_seg, \
    .attention_merge = kg_attention_merge, .store_f16 = store_f16, .exp_row = kg_exp_row,   \
    .epilogue_row = kg_epilogue_row

#endif
