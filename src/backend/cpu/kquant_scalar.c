/* Scalar kernels for the types of cpu_kq_kernels, and the sub-block unpacking every
 * ISA's GEMM packing shares (kquant.h). Block layouts: format/quant.h (Q5_0),
 * format/quant_k.h (Q4_K, Q5_K, Q6_K, IQ4_XS). */
#include "backend/cpu/kquant.h"

#include "base/fp16.h"
#include "format/quant.h"
#include "format/quant_k.h"

#include <string.h>

static float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return fp16_to_f32(h);
}

void kq_unpack_sub(enum ir_dtype t, const uint8_t *row, int64_t b, struct kq_sub *out) {
    switch (t) {
    case IR_DTYPE_Q4_K:
    case IR_DTYPE_Q5_K: {
        const bool q5 = t == IR_DTYPE_Q5_K;
        const uint8_t *blk = row + (b / 8) * (q5 ? sizeof(block_q5_K) : sizeof(block_q4_K));
        int j = (int)(b % 8);
        uint8_t sc, mn;
        quant_k_get_scale_min(blk + 4, j, &sc, &mn);
        float d = f16_at(blk), dmin = f16_at(blk + 2);
        const uint8_t *qs = blk + (q5 ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs)) + 32 * (j / 2);
        for (int l = 0; l < 32; l++) {
            int v = (qs[l] >> (4 * (j % 2))) & 0x0f;
            if (q5) v |= ((blk[offsetof(block_q5_K, qh) + l] >> j) & 1) << 4;
            out->u[l] = (uint8_t)v;
        }
        out->s[0] = out->s[1] = d * (float)sc;
        out->o[0] = out->o[1] = dmin * (float)mn;
        return;
    }
    case IR_DTYPE_Q6_K: {
        const uint8_t *blk = row + (b / 8) * sizeof(block_q6_K);
        int h = (int)(b % 8) / 4, g = (int)(b % 4);
        float d = f16_at(blk + offsetof(block_q6_K, d));
        const uint8_t *ql = blk + offsetof(block_q6_K, ql) + 64 * h + 32 * (g & 1);
        const uint8_t *qh = blk + offsetof(block_q6_K, qh) + 32 * h;
        for (int l = 0; l < 32; l++) {
            int low4 = g < 2 ? ql[l] & 0x0f : ql[l] >> 4;
            out->u[l] = (uint8_t)(low4 | ((qh[l] >> (2 * g)) & 3) << 4);
        }
        for (int half = 0; half < 2; half++) {
            float s = d * (float)(int8_t)blk[offsetof(block_q6_K, scales) + 2 * (b % 8) + half];
            out->s[half] = s;
            out->o[half] = 32.0f * s;
        }
        return;
    }
    case IR_DTYPE_Q5_0: {
        block_q5_0 blk;
        memcpy(&blk, row + b * sizeof blk, sizeof blk);
        float d = fp16_to_f32(blk.d);
        int8_t q[QK5_0];
        quant_q5_0_ints(&blk, q);
        for (int l = 0; l < QK5_0; l++) out->u[l] = (uint8_t)(q[l] + 16);
        out->s[0] = out->s[1] = d;
        out->o[0] = out->o[1] = 16.0f * d;
        return;
    }
    case IR_DTYPE_IQ4_XS: {
        block_iq4_xs blk;
        memcpy(&blk, row + (b / 8) * sizeof blk, sizeof blk);
        int j = (int)(b % 8);
        float dl = fp16_to_f32(blk.d) * (float)(quant_iq4_xs_scale(&blk, j) - 32);
        int8_t v[32];
        quant_iq4_xs_ints(&blk, j, v);
        for (int l = 0; l < 32; l++) out->u[l] = (uint8_t)(v[l] + 128); /* table values biased by 128 to unsigned */
        out->s[0] = out->s[1] = dl;
        out->o[0] = out->o[1] = 128.0f * dl;
        return;
    }
    default: break;
    }
    LLMOPT_ASSERT(!"kq_unpack_sub: not a kq type");
}

/* out[r * CPU_TILE_C + c] = dot(activation row r0 + r, weight row c) through the
 * unpacked sub-blocks: integer sums per half, scaled once per half. */
static void tile_kq(enum ir_dtype t, const struct cpu_qact *qa, int64_t r0, const uint8_t *w, size_t ldw, int nr,
                    int nc, float *out) {
    const int64_t k = qa->k, nb = k / CPU_QBLOCK;
    const int halves = kq_halves(t), hlen = 32 / halves;
    float acc[CPU_TILE_R][CPU_TILE_C] = {{0}};
    for (int64_t b = 0; b < nb; b++)
        for (int c = 0; c < nc; c++) {
            struct kq_sub sub;
            kq_unpack_sub(t, w + (size_t)c * ldw, b, &sub);
            for (int r = 0; r < nr; r++) {
                const int8_t *x = qa->qs + (r0 + r) * k + b * CPU_QBLOCK;
                float dx = qa->d[(r0 + r) * nb + b], sum = 0.0f;
                for (int h = 0; h < halves; h++) {
                    int32_t dot = 0, sx = 0;
                    for (int l = h * hlen; l < (h + 1) * hlen; l++) {
                        dot += (int32_t)sub.u[l] * x[l];
                        sx += x[l];
                    }
                    sum += sub.s[h] * (float)dot - sub.o[h] * (float)sx;
                }
                acc[r][c] += dx * sum;
            }
        }
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++) out[r * CPU_TILE_C + c] = acc[r][c];
}

#define KQ_SCALAR_TILE(name, type)                                                                    \
    static void name(const struct cpu_qact *qa, int64_t r0, const uint8_t *w, size_t ldw, int nr, int nc, \
                     float *out) {                                                                    \
        tile_kq(type, qa, r0, w, ldw, nr, nc, out);                                                   \
    }
KQ_SCALAR_TILE(tile_q4_k, IR_DTYPE_Q4_K)
KQ_SCALAR_TILE(tile_q5_k, IR_DTYPE_Q5_K)
KQ_SCALAR_TILE(tile_q6_k, IR_DTYPE_Q6_K)
KQ_SCALAR_TILE(tile_q5_0, IR_DTYPE_Q5_0)
KQ_SCALAR_TILE(tile_iq4_xs, IR_DTYPE_IQ4_XS)

const struct cpu_kq_kernels cpu_kq_kernels_scalar = {
    .tile_q4_k = tile_q4_k,
    .tile_q5_k = tile_q5_k,
    .tile_q6_k = tile_q6_k,
    .tile_q5_0 = tile_q5_0,
    .tile_iq4_xs = tile_iq4_xs,
};
