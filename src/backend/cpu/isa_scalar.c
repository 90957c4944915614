/* Portable kernels: the generic bodies over one-lane "vectors", plain-C integer dot
 * products for the block types, and the activation quantizer every ISA must match. */
#include "backend/cpu/kernels.h"
#include "backend/cpu/kquant.h"
#include "base/fp16.h"
#include "format/quant.h"

#include <math.h>
#include <string.h>

typedef float vf;
#define VLEN 1
#define TILE_PASS_R 4

static inline vf v_zero(void) {
    return 0.0f;
}
static inline vf v_set1(float f) {
    return f;
}
static inline vf v_load(const float *p) {
    return *p;
}
static inline vf v_load_n(const float *p, int n) {
    return n > 0 ? *p : 0.0f;
}
static inline vf v_load_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return fp16_to_f32(h);
}
static inline vf v_load_f16_n(const uint8_t *p, int n) {
    return n > 0 ? v_load_f16(p) : 0.0f;
}
static inline vf v_load_bf16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return bf16_to_f32(h);
}
static inline vf v_load_bf16_n(const uint8_t *p, int n) {
    return n > 0 ? v_load_bf16(p) : 0.0f;
}
static inline void v_store(float *p, vf v) {
    *p = v;
}
static inline void v_store_n(float *p, vf v, int n) {
    if (n > 0) *p = v;
}
static inline vf v_add(vf a, vf b) {
    return a + b;
}
static inline vf v_sub(vf a, vf b) {
    return a - b;
}
static inline vf v_mul(vf a, vf b) {
    return a * b;
}
static inline vf v_div(vf a, vf b) {
    return a / b;
}
static inline vf v_max(vf a, vf b) {
    return a > b ? a : b;
}
static inline vf v_fma(vf a, vf b, vf c) {
    return a * b + c;
}
static inline float v_hsum(vf v) {
    return v;
}
static inline float v_hmax(vf v) {
    return v;
}
static inline vf v_exp(vf v) {
    return expf(v);
}
static inline vf v_reduce_lanes(const vf *a) {
    return a[0];
}

/* KV cache vocabulary: int8 and broadcast f16 loads. */
static inline vf v_load_i8(const int8_t *p) {
    return (float)*p;
}
static inline vf v_set1_f16(const uint8_t *p) {
    return v_load_f16(p);
}

#include "backend/cpu/kern_generic.h"

/* The activation quantizer. d = amax / 127 and quants round(x / d) to nearest even
 * (what vector conversions do), so every ISA's quantizer gives the same bytes. */
static void quantize_row(const float *x, const struct cpu_qact *qa, int64_t r) {
    int64_t k = qa->k;
    int8_t *qs = qa->qs + r * k;
    float *d = qa->d + r * (k / CPU_QBLOCK);
    int32_t *corr = qa->corr + r * (k / 4);
    const float *xr = x;
    for (int64_t b = 0; b < k / CPU_QBLOCK; b++) {
        const float *xb = xr + b * CPU_QBLOCK;
        float amax = 0.0f;
        for (int j = 0; j < CPU_QBLOCK; j++) amax = fmaxf(amax, fabsf(xb[j]));
        float db = amax / 127.0f, id = db != 0.0f ? 1.0f / db : 0.0f;
        d[b] = db;
        for (int j = 0; j < CPU_QBLOCK; j++) {
            float v = nearbyintf(xb[j] * id);
            v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
            qs[b * CPU_QBLOCK + j] = (int8_t)(v == v ? v : 0.0f);
        }
    }
    for (int64_t q = 0; q < k / 4; q++)
        corr[q] = -128 * (qs[4 * q] + qs[4 * q + 1] + qs[4 * q + 2] + qs[4 * q + 3]);
    cpu_qact_sum_blocks(qa, r);
}

static void tile_q8_0(const struct cpu_qact *qa, int64_t r0, const uint8_t *w, size_t ldw, int nr,
                      int nc, float *out) {
    int64_t k = qa->k, nb = k / QK8_0;
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++) {
            const int8_t *xq = qa->qs + (r0 + r) * k;
            const float *xd = qa->d + (r0 + r) * nb;
            const uint8_t *wr = w + c * ldw;
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                block_q8_0 blk;
                memcpy(&blk, wr + b * (int64_t)sizeof blk, sizeof blk);
                int32_t s = 0;
                for (int j = 0; j < QK8_0; j++) s += blk.qs[j] * xq[b * QK8_0 + j];
                acc += (float)s * (fp16_to_f32(blk.d) * xd[b]);
            }
            out[r * CPU_TILE_C + c] = acc;
        }
}

static void tile_q4_0(const struct cpu_qact *qa, int64_t r0, const uint8_t *w, size_t ldw, int nr,
                      int nc, float *out) {
    int64_t k = qa->k, nb = k / QK4_0;
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++) {
            const int8_t *xq = qa->qs + (r0 + r) * k;
            const float *xd = qa->d + (r0 + r) * nb;
            const uint8_t *wr = w + c * ldw;
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                block_q4_0 blk;
                memcpy(&blk, wr + b * (int64_t)sizeof blk, sizeof blk);
                const int8_t *xb = xq + b * QK4_0;
                int32_t s = 0;
                for (int j = 0; j < QK4_0 / 2; j++)
                    s += ((blk.qs[j] & 0x0f) - 8) * xb[j] + ((blk.qs[j] >> 4) - 8) * xb[j + QK4_0 / 2];
                acc += (float)s * (fp16_to_f32(blk.d) * xd[b]);
            }
            out[r * CPU_TILE_C + c] = acc;
        }
}

static void store_f16(const float *src, uint8_t *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint16_t h = fp16_from_f32(src[i]);
        memcpy(dst + 2 * i, &h, 2);
    }
}

const struct cpu_isa_kernels cpu_isa_kernels_scalar = {
    .isa = CPU_ISA_SCALAR,
    KG_ISA_TABLE_ENTRIES,
    .kq = &cpu_kq_kernels_scalar,
};
