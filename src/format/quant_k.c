/* K-quant reference (de)quantizers; layouts in quant_k.h.
 *
 * The quantizers fit each sub-block on its own (least squares over a few candidate
 * grids), then quantize the sub-block scales (and mins) against one f16 super-block
 * scale, then recompute every quant against the scales as stored, so the quants match
 * what a reader will multiply them by. */
#include "format/quant_k.h"

#include "base/fp16.h"

#include <math.h>
#include <string.h>

const int8_t iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                 1,    13,   25,  38,  53,  69,  89,  113};

bool quant_k_is_k_type(enum ggml_type type) {
    return type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K || type == GGML_TYPE_Q6_K ||
           type == GGML_TYPE_IQ4_XS;
}

int quant_iq4_xs_scale(const block_iq4_xs *b, int j) {
    return ((b->scales_l[j / 2] >> (4 * (j % 2))) & 0x0f) | (((b->scales_h >> (2 * j)) & 3) << 4);
}

void quant_k_get_scale_min(const uint8_t scales[K_SCALE_SIZE], int j, uint8_t *sc, uint8_t *mn) {
    if (j < 4) {
        *sc = scales[j] & 63;
        *mn = scales[j + 4] & 63;
    } else {
        *sc = (uint8_t)((scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4));
        *mn = (uint8_t)((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
    }
}

static void put_scale_min(uint8_t scales[K_SCALE_SIZE], const uint8_t sc[8], const uint8_t mn[8]) {
    for (int j = 0; j < 4; j++) {
        scales[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        scales[j + 4] = (uint8_t)((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
        scales[j + 8] = (uint8_t)((sc[j + 4] & 0x0f) | ((mn[j + 4] & 0x0f) << 4));
    }
}

/* v rounded to nearest (halves up) and clamped into [lo, hi]; NaN gives lo (never an
 * undefined conversion). v - lo > 0 here, so truncation is floor: no libm call in the
 * quantizers' inner loops. */
static inline int round_clamp(float v, int lo, int hi) {
    if (!(v > (float)lo)) return lo;
    if (v >= (float)hi) return hi;
    return (int)(v - (float)lo + 0.5f) + lo;
}

/* ---- dequantization ---- */

/* One q4_K (qh NULL) or q5_K super-block to QK_K floats: sub-block j's 32 quants are
 * the low (j even) or high nibbles of qs[32 (j / 2) ..], with bit j of qh[l] as the
 * fifth bit, times d * sc_j, minus dmin * mn_j. */
static void dequantize_k_nibbles(uint16_t d16, uint16_t dmin16, const uint8_t scales[K_SCALE_SIZE],
                                 const uint8_t *qs, const uint8_t *qh, float *y) {
    const float d = fp16_to_f32(d16), dmin = fp16_to_f32(dmin16);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, mn;
        quant_k_get_scale_min(scales, j, &sc, &mn);
        const float ds = d * sc, dm = dmin * mn;
        const uint8_t *q = qs + 32 * (j / 2);
        const int shift = 4 * (j % 2);
        for (int l = 0; l < 32; l++) {
            const int v = ((q[l] >> shift) & 0x0f) | (qh ? ((qh[l] >> j) & 1) << 4 : 0);
            y[32 * j + l] = ds * (float)v - dm;
        }
    }
}

static void dequantize_q4_K(const uint8_t *src, float *dst, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; b++) {
        block_q4_K blk;
        memcpy(&blk, src + b * (int64_t)sizeof blk, sizeof blk);
        dequantize_k_nibbles(blk.d, blk.dmin, blk.scales, blk.qs, NULL, dst + b * QK_K);
    }
}

static void dequantize_q5_K(const uint8_t *src, float *dst, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; b++) {
        block_q5_K blk;
        memcpy(&blk, src + b * (int64_t)sizeof blk, sizeof blk);
        dequantize_k_nibbles(blk.d, blk.dmin, blk.scales, blk.qs, blk.qh, dst + b * QK_K);
    }
}

static void dequantize_q6_K(const uint8_t *src, float *dst, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; b++) {
        block_q6_K blk;
        memcpy(&blk, src + b * (int64_t)sizeof blk, sizeof blk);
        float d = fp16_to_f32(blk.d);
        float *y = dst + b * QK_K;
        for (int e = 0; e < QK_K; e++) {
            int h = e / 128, g = (e % 128) / 32, l = e % 32;
            uint8_t lo = blk.ql[64 * h + l + 32 * (g & 1)];
            int low4 = g < 2 ? (lo & 0x0f) : (lo >> 4);
            int high2 = (blk.qh[32 * h + l] >> (2 * g)) & 3;
            y[e] = d * (float)blk.scales[e / 16] * (float)((low4 | (high2 << 4)) - 32);
        }
    }
}

static void dequantize_iq4_xs(const uint8_t *src, float *dst, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; b++) {
        block_iq4_xs blk;
        memcpy(&blk, src + b * (int64_t)sizeof blk, sizeof blk);
        float d = fp16_to_f32(blk.d);
        float *y = dst + b * QK_K;
        for (int j = 0; j < 8; j++) {
            float dl = d * (float)(quant_iq4_xs_scale(&blk, j) - 32);
            int8_t v[32];
            quant_iq4_xs_ints(&blk, j, v);
            for (int l = 0; l < 32; l++) y[32 * j + l] = dl * (float)v[l];
        }
    }
}

void quant_k_dequantize_row(enum ggml_type type, const void *src, float *dst, int64_t n) {
    LLMOPT_ASSERT(n >= 0 && n % QK_K == 0);
    if (type == GGML_TYPE_Q4_K)
        dequantize_q4_K(src, dst, n / QK_K);
    else if (type == GGML_TYPE_Q5_K)
        dequantize_q5_K(src, dst, n / QK_K);
    else if (type == GGML_TYPE_Q6_K)
        dequantize_q6_K(src, dst, n / QK_K);
    else if (type == GGML_TYPE_IQ4_XS)
        dequantize_iq4_xs(src, dst, n / QK_K);
    else
        LLMOPT_ASSERT(!"quant_k_dequantize_row: not a K type");
}

/* ---- sub-block fits ---- *
 * The fits see finite input only (quantize_* replace non-finite values by 0 first), so
 * the grids below stay within a few units and convert to int without checks. Each
 * candidate grid's error comes from the sums of its quants (no second pass): the
 * least-squares residual of (s, b) given those quants. */

/* x[0..n) ~= s * q - m with q in 0..nmax, s >= 0, m >= 0 (the grid always reaches
 * zero or below, as the format's min is subtracted). Tries grids slightly finer and
 * coarser than the plain (max - min) / nmax and keeps the least-squares best. n even. */
static void fit_affine(const float *x, int n, int nmax, float *s_out, float *m_out) {
    float lo = x[0], hi = x[0], sx = 0.0f, sxx = 0.0f;
    for (int i = 0; i < n; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
        sx += x[i];
        sxx += x[i] * x[i];
    }
    if (lo > 0.0f) lo = 0.0f;
    float range = hi - lo;
    if (!(range > 1e-30f) || !(range < 1e30f)) { /* constant, or beyond what f16 scales hold */
        *s_out = 0.0f;
        *m_out = -lo;
        return;
    }
    double best_err = INFINITY;
    float best_s = range / (float)nmax, best_m = -lo;
    for (int k = -3; k <= 3; k++) {
        float iscale = ((float)nmax + 0.25f * (float)k) / range;
        int sq = 0, sqq = 0;
        float sqx0 = 0.0f,
              sqx1 = 0.0f; /* two chains: the adds' latency, not their count, is the cost */
        for (int i = 0; i < n; i += 2) {
            int q0 = (int)(iscale * (x[i] - lo) + 0.5f),
                q1 = (int)(iscale * (x[i + 1] - lo) + 0.5f);
            q0 = q0 < nmax ? q0 : nmax;
            q1 = q1 < nmax ? q1 : nmax;
            sq += q0 + q1;
            sqq += q0 * q0 + q1 * q1;
            sqx0 += (float)q0 * x[i];
            sqx1 += (float)q1 * x[i + 1];
        }
        double sqx = (double)sqx0 + sqx1;
        /* least squares x ~= s * q + b; the format needs b <= 0 */
        double det = (double)n * sqq - (double)sq * sq;
        if (!(det > 0.0)) continue;
        double s = ((double)n * sqx - (double)sq * sx) / det;
        double b = ((double)sqq * sx - (double)sq * sqx) / det;
        if (b > 0.0) {
            b = 0.0;
            s = sqx / sqq;
        }
        if (!(s > 0.0)) continue;
        double err =
            s * s * sqq + 2.0 * s * b * sq + (double)n * b * b - 2.0 * s * sqx - 2.0 * b * sx + sxx;
        if (err < best_err) {
            best_err = err;
            best_s = (float)s;
            best_m = (float)-b;
        }
    }
    *s_out = best_s;
    *m_out = best_m;
}

/* x[0..n) ~= s * q with q in -32..31 (s may be negative: the element of largest
 * magnitude maps to -32, so its side gets the extra level). n even. */
static float fit_symmetric_q6(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; i++) {
        float a = x[i] < 0.0f ? -x[i] : x[i];
        if (a > amax) {
            amax = a;
            max = x[i];
        }
    }
    if (!(amax > 1e-30f) || !(amax < 1e30f)) return 0.0f;
    double best_gain = -1.0;
    float best_s = max / -32.0f;
    for (int k = -3; k <= 3; k++) {
        float iscale = -(32.0f + 0.25f * (float)k) / max; /* |iscale * x| <= 32.75 */
        int sqq = 0;
        float sqx0 = 0.0f, sqx1 = 0.0f;
        for (int i = 0; i < n; i += 2) {
            /* +64.5 keeps the value positive, so truncation rounds (halves up) */
            int q0 = (int)(iscale * x[i] + 64.5f) - 64, q1 = (int)(iscale * x[i + 1] + 64.5f) - 64;
            q0 = q0 < -32 ? -32 : q0 > 31 ? 31 : q0;
            q1 = q1 < -32 ? -32 : q1 > 31 ? 31 : q1;
            sqq += q0 * q0 + q1 * q1;
            sqx0 += (float)q0 * x[i];
            sqx1 += (float)q1 * x[i + 1];
        }
        if (!sqq) continue;
        /* residual sum(x^2) - sqx^2 / sqq: the best fit has the largest sqx^2 / sqq */
        double sqx = (double)sqx0 + sqx1, gain = sqx * sqx / sqq;
        if (gain > best_gain) {
            best_gain = gain;
            best_s = (float)(sqx / sqq);
        }
    }
    return best_s;
}

/* Copies a super-block with non-finite values replaced by 0. */
static void finite_copy(const float *x, float *out) {
    for (int i = 0; i < QK_K; i++) out[i] = isfinite(x[i]) ? x[i] : 0.0f;
}

/* ---- quantization ---- */

/* Shared by Q4_K (nmax 15) and Q5_K (nmax 31): the 8 sub-block fits, their 6-bit
 * scales and mins, and the quants q[256] recomputed against the stored scales. */
static void quantize_affine_block(const float *src, int nmax, uint16_t *d_out, uint16_t *dmin_out,
                                  uint8_t scales[K_SCALE_SIZE], uint8_t q[QK_K]) {
    float x[QK_K];
    finite_copy(src, x);
    float s[8], m[8], max_s = 0.0f, max_m = 0.0f;
    for (int j = 0; j < 8; j++) {
        fit_affine(x + 32 * j, 32, nmax, &s[j], &m[j]);
        max_s = fmaxf(max_s, s[j]);
        max_m = fmaxf(max_m, m[j]);
    }
    float d = max_s / 63.0f, dmin = max_m / 63.0f;
    float id = d > 0.0f ? 1.0f / d : 0.0f, idmin = dmin > 0.0f ? 1.0f / dmin : 0.0f;
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; j++) {
        sc[j] = (uint8_t)round_clamp(s[j] * id, 0, 63);
        mn[j] = (uint8_t)round_clamp(m[j] * idmin, 0, 63);
    }
    *d_out = fp16_from_f32(d);
    *dmin_out = fp16_from_f32(dmin);
    put_scale_min(scales, sc, mn);
    float d_stored = fp16_to_f32(*d_out), dmin_stored = fp16_to_f32(*dmin_out);
    for (int j = 0; j < 8; j++) {
        float ds = d_stored * sc[j], dm = dmin_stored * mn[j];
        float ids = ds > 0.0f ? 1.0f / ds : 0.0f;
        for (int l = 0; l < 32; l++)
            q[32 * j + l] = (uint8_t)round_clamp((x[32 * j + l] + dm) * ids, 0, nmax);
    }
}

void quant_k_quantize_row_q4_K(const float *src, void *dst, int64_t n) {
    LLMOPT_ASSERT(n >= 0 && n % QK_K == 0);
    for (int64_t b = 0; b < n / QK_K; b++) {
        block_q4_K blk;
        uint8_t q[QK_K];
        quantize_affine_block(src + b * QK_K, 15, &blk.d, &blk.dmin, blk.scales, q);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                blk.qs[32 * c + l] = (uint8_t)(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
        memcpy((uint8_t *)dst + b * (int64_t)sizeof blk, &blk, sizeof blk);
    }
}

void quant_k_quantize_row_q5_K(const float *src, void *dst, int64_t n) {
    LLMOPT_ASSERT(n >= 0 && n % QK_K == 0);
    for (int64_t b = 0; b < n / QK_K; b++) {
        block_q5_K blk;
        uint8_t q[QK_K];
        quantize_affine_block(src + b * QK_K, 31, &blk.d, &blk.dmin, blk.scales, q);
        memset(blk.qh, 0, sizeof blk.qh);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                blk.qs[32 * c + l] =
                    (uint8_t)((q[64 * c + l] & 0x0f) | ((q[64 * c + 32 + l] & 0x0f) << 4));
        for (int j = 0; j < 8; j++)
            for (int l = 0; l < 32; l++) blk.qh[l] |= (uint8_t)((q[32 * j + l] >> 4) << j);
        memcpy((uint8_t *)dst + b * (int64_t)sizeof blk, &blk, sizeof blk);
    }
}

void quant_k_quantize_row_q6_K(const float *src, void *dst, int64_t n) {
    LLMOPT_ASSERT(n >= 0 && n % QK_K == 0);
    for (int64_t b = 0; b < n / QK_K; b++) {
        float x[QK_K];
        finite_copy(src + b * QK_K, x);
        block_q6_K blk;
        float s[16], max_abs = 0.0f;
        for (int j = 0; j < 16; j++) {
            s[j] = fit_symmetric_q6(x + 16 * j, 16);
            max_abs = fmaxf(max_abs, fabsf(s[j]));
        }
        float d = max_abs / 127.0f;
        float id = d > 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < 16; j++) blk.scales[j] = (int8_t)round_clamp(s[j] * id, -127, 127);
        blk.d = fp16_from_f32(d);
        float d_stored = fp16_to_f32(blk.d);
        memset(blk.ql, 0, sizeof blk.ql);
        memset(blk.qh, 0, sizeof blk.qh);
        for (int e = 0; e < QK_K; e++) {
            float ds = d_stored * (float)blk.scales[e / 16];
            int q = ds != 0.0f ? round_clamp(x[e] / ds, -32, 31) + 32 : 32; /* 0..63 */
            int h = e / 128, g = (e % 128) / 32, l = e % 32;
            blk.ql[64 * h + l + 32 * (g & 1)] |= (uint8_t)((q & 0x0f) << (g < 2 ? 0 : 4));
            blk.qh[32 * h + l] |= (uint8_t)((q >> 4) << (2 * g));
        }
        memcpy((uint8_t *)dst + b * (int64_t)sizeof blk, &blk, sizeof blk);
    }
}

/* The index of the table entry nearest to v (the table ascends). */
static int iq4nl_nearest(float v) {
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (v < (float)iq4nl_values[mid]) hi = mid;
        else lo = mid;
    }
    return v - (float)iq4nl_values[lo] <= (float)iq4nl_values[hi] - v ? lo : hi;
}

/* x[0..32) ~= s * iq4nl_values[q]: candidate scales mapping the element of largest
 * magnitude onto either end of the table, a little finer or coarser; for each the
 * least-squares s given the chosen levels, keeping the one of least error. */
static float fit_iq4nl(const float *x) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < 32; i++) {
        float a = fabsf(x[i]);
        if (a > amax) {
            amax = a;
            max = x[i];
        }
    }
    if (!(amax > 1e-30f) || !(amax < 1e30f)) return 0.0f;
    double best_gain = -1.0;
    float best_s = max / (float)iq4nl_values[0];
    for (int side = 0; side < 2; side++)
        for (int k = -4; k <= 4; k++) {
            float end = side ? (float)iq4nl_values[15] : (float)iq4nl_values[0];
            float s = max / (end * (1.0f + 0.03f * (float)k));
            float is = 1.0f / s;
            double sqx = 0, sqq = 0;
            for (int i = 0; i < 32; i++) {
                float q = (float)iq4nl_values[iq4nl_nearest(x[i] * is)];
                sqx += (double)q * x[i];
                sqq += (double)q * q;
            }
            if (!(sqq > 0)) continue;
            double gain = sqx * sqx / sqq; /* residual = sum x^2 - gain */
            if (gain > best_gain) {
                best_gain = gain;
                best_s = (float)(sqx / sqq);
            }
        }
    return best_s;
}

void quant_k_quantize_row_iq4_xs(const float *src, void *dst, int64_t n) {
    LLMOPT_ASSERT(n >= 0 && n % QK_K == 0);
    for (int64_t b = 0; b < n / QK_K; b++) {
        float x[QK_K];
        finite_copy(src + b * QK_K, x);
        float s[8], max_scale = 0.0f;
        for (int j = 0; j < 8; j++) {
            s[j] = fit_iq4nl(x + 32 * j);
            if (fabsf(s[j]) > fabsf(max_scale)) max_scale = s[j];
        }
        /* factors ls - 32 span -32..31: d takes the sign that maps the largest scale
         * onto -32 exactly; a positive d would clamp a positive one to 31 (3% short) */
        float d = -max_scale / 32.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        block_iq4_xs blk;
        memset(&blk, 0, sizeof blk);
        blk.d = fp16_from_f32(d);
        float d_stored = fp16_to_f32(blk.d);
        for (int j = 0; j < 8; j++) {
            int ls = round_clamp(s[j] * id, -32, 31) + 32;
            blk.scales_l[j / 2] |= (uint8_t)((ls & 0x0f) << (4 * (j % 2)));
            blk.scales_h |= (uint16_t)((ls >> 4) << (2 * j));
            float dl = d_stored * (float)(ls - 32);
            float idl = dl != 0.0f ? 1.0f / dl : 0.0f;
            for (int l = 0; l < 16; l++) {
                int q0 = iq4nl_nearest(x[32 * j + l] * idl), q1 = iq4nl_nearest(x[32 * j + 16 + l] * idl);
                blk.qs[16 * j + l] = (uint8_t)(q0 | (q1 << 4));
            }
        }
        memcpy((uint8_t *)dst + b * (int64_t)sizeof blk, &blk, sizeof blk);
    }
}
