/* The int8-x K-quant dot product (q4_K, q6_K): what one lane loads of a super-block,
 * the x operands of its 64 weights, and their product. Shared by the register kernel
 * (kernels_kquant.cu, cu_matvec_kq_multi: weights from global memory) and the staged
 * one (kernels_stream.cu: weights from a shared-memory ring), so that both compute the
 * same sums in the same order. The x layout: km_put_x4, km_row_bytes. */
#pragma once

#include "backend/cuda/cuda_device.cuh"

/* The K-quant types with this int8-x dot product (q5_K keeps kernels_kquant.cu's older
 * kernel). */
static inline bool km_type_ok(int t) { return t == CU_Q4_K || t == CU_Q6_K; }

/* 16-byte chunk c of a quantized x row -> its slot: q4_K lanes read chunks 4 apart, q6_K
 * lanes 1, 8 and 16 apart; XOR-ing bits 0 and 2 with bit 3 and bit 1 with bit 4 puts
 * the 8 lanes of each quarter warp on distinct banks for both (a permutation inside
 * each aligned run of 32 chunks). */
static __device__ __forceinline__ int64_t km_slot(int64_t c) {
    return c ^ (((c >> 3) & 1) * 5) ^ (((c >> 4) & 1) << 1);
}

struct km_raw {
    uint4 a, b, c;
    uint2 s;
    float d;
};

/* A load of T at p: through the read-only path from global memory, or a plain one
 * (SMEM: p is in shared memory). */
template <typename T, bool SMEM> static __device__ __forceinline__ T km_ld(const void *p) {
    if constexpr (SMEM)
        return *(const T *)p;
    else
        return __ldg((const T *)p);
}

/* Lane part c (0..3) of a super-block at bp (q6_K: its scale at dp): q4_K a = header,
 * b/c = qs bytes 32c..32c+31; q6_K (h = c / 2, s = c % 2) a/b = ql slices, c = qh
 * slice, s = the 8 scales of half h, d = the super-block scale. SMEM: bp and dp are in
 * shared memory. */
template <int DT, bool SMEM = false>
static __device__ __forceinline__ void km_load(const uint8_t *bp, const uint16_t *dp, int c, km_raw &r) {
    if constexpr (DT == CU_Q4_K) {
        r.a = km_ld<uint4, SMEM>(bp);
        r.b = km_ld<uint4, SMEM>(bp + 16 + 32 * c);
        r.c = km_ld<uint4, SMEM>(bp + 32 + 32 * c);
    } else {
        const int h = c >> 1, s = c & 1;
        r.a = km_ld<uint4, SMEM>(bp + 64 * h + 16 * s);
        r.b = km_ld<uint4, SMEM>(bp + 64 * h + 32 + 16 * s);
        r.c = km_ld<uint4, SMEM>(bp + 128 + 32 * h + 16 * s);
        r.s = km_ld<uint2, SMEM>(bp + 192 + 8 * h);
        r.d = cu_f16(km_ld<uint16_t, SMEM>(dp));
    }
}

/* Shared-memory bytes of one quantized x row of K (km_put_x4's layout: K int8 in
 * 16-byte chunks at km_slot(chunk), K / 32 f32 scales, K / 32 f32 sums of x, K / 16 int
 * sums of the quantized chunks). */
static __host__ __device__ __forceinline__ size_t km_row_bytes(int64_t K) {
    return (size_t)K + (size_t)K / 32 * 8 + (size_t)K / 16 * 4;
}

/* Where lane (q, c) = (lane / 4, lane % 4) finds its x operands in a quantized row, for
 * weight type D, in bytes from the row's start at its first super-block q; each pass of
 * 8 super-blocks adds 2048 (chunks), 256 (scales, sums of x) and 512 (chunk sums).
 * Lane constants: km_slot's permutation depends only on c and on q's low bit, as 8
 * super-blocks a pass keep sb % 2 == q % 2. Computed once a kernel, so the inner loops
 * do no index arithmetic beyond a stride a pass. */
struct km_lane {
    uint32_t xo[4]; /* the lane's 4 int8 chunks (q4_K: 64 consecutive x; q6_K: 4 groups of 16, 32 apart) */
    uint32_t xd;    /* its group scales: q4_K 2, q6_K 4 */
    uint32_t xs;    /* q4_K: its 2 groups' f32 sums of x */
    uint32_t cs;    /* the int sums of its chunks: q4_K 4 consecutive, q6_K 8 around them */
};

template <int D>
static __device__ __forceinline__ km_lane km_lane_of(int64_t K, int lane) {
    const uint32_t k32 = (uint32_t)K, q = (uint32_t)lane >> 2, c = (uint32_t)lane & 3, h = c >> 1;
    const uint32_t sw = h * 5 ^ (q & 1) << 1;
    km_lane L;
#pragma unroll
    for (int i = 0; i < 4; i++) L.xo[i] = 256 * q + 16 * ((D == CU_Q4_K ? 4 * c + i : 8 * h + 2 * i + (c & 1)) ^ sw);
    L.xd = k32 + 32 * q + (D == CU_Q4_K ? 8 * c : 16 * h);
    L.xs = L.xd + k32 / 8;
    L.cs = k32 + k32 / 4 + 64 * q + (D == CU_Q4_K ? 16 * c : 32 * h);
    return L;
}

/* The x operands of a lane's 64 weights: 4 int8 chunks (as words), their group scales
 * (q4_K: 2 groups of 32, q6_K: 4 of 16), q4_K the groups' f32 sums, and the int sums of
 * the quantized x of each group. */
struct km_xv {
    uint32_t w[4][4];
    float4 d;
    float2 s;
    int qs[4];
};

/* Pass p's x operands of lane part c from the quantized row at xr (shared memory). */
template <int D>
static __device__ __forceinline__ void km_x_load(const uint8_t *xr, const km_lane &L, uint32_t p, int c, km_xv &v) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint4 t = *(const uint4 *)(xr + L.xo[i] + 2048 * p);
        v.w[i][0] = t.x;
        v.w[i][1] = t.y;
        v.w[i][2] = t.z;
        v.w[i][3] = t.w;
    }
    if constexpr (D == CU_Q4_K) {
        const float2 d = *(const float2 *)(xr + L.xd + 256 * p);
        v.d = make_float4(d.x, d.y, 0.0f, 0.0f);
        v.s = *(const float2 *)(xr + L.xs + 256 * p);
        const int4 t = *(const int4 *)(xr + L.cs + 512 * p);
        v.qs[0] = t.x + t.y;
        v.qs[1] = t.z + t.w;
    } else { /* chunks 16 sb + 8 h + 2 g + s of the 8 at cs */
        v.d = *(const float4 *)(xr + L.xd + 256 * p);
        const int4 t0 = *(const int4 *)(xr + L.cs + 512 * p), t1 = *(const int4 *)(xr + L.cs + 512 * p + 16);
        const bool s = c & 1;
        v.qs[0] = s ? t0.y : t0.x;
        v.qs[1] = s ? t0.w : t0.z;
        v.qs[2] = s ? t1.y : t1.x;
        v.qs[3] = s ? t1.w : t1.z;
    }
}

/* One thread's 4 elements v (elements 4f .. 4f + 3) of an x row into its quantized form
 * at out (km_row_bytes(K)): int8 per group of 32 with d = max|x| / 127, the group's f32
 * sum, and the int sum of each 16-byte chunk. Groups are 8
 * neighbouring lanes with f % 8 == lane % 8, so every lane of the warp calls this. */
static __device__ __forceinline__ void km_put_x4(float4 v, int64_t f, uint8_t *out, int64_t K) {
    float *xd = (float *)(out + K), *xs = xd + K / 32;
    float amax, sum;
    cu_amax_sum8(v, &amax, &sum);
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    const int q0 = __float2int_rn(v.x * id), q1 = __float2int_rn(v.y * id), q2 = __float2int_rn(v.z * id),
              q3 = __float2int_rn(v.w * id);
    const uint32_t w = (uint32_t)(q0 & 0xff) | (uint32_t)(q1 & 0xff) << 8 | (uint32_t)(q2 & 0xff) << 16 |
                       (uint32_t)(q3 & 0xff) << 24;
    ((uint32_t *)out)[km_slot(f / 4) * 4 + f % 4] = w;
    if ((f & 7) == 0) {
        xd[f / 8] = amax / 127.0f;
        xs[f / 8] = sum;
    }
    int t = (q0 + q1) + (q2 + q3);
    t += __shfl_xor_sync(0xffffffffu, t, 1);
    t += __shfl_xor_sync(0xffffffffu, t, 2);
    if ((f & 3) == 0) ((int *)(xs + K / 32))[f / 4] = t;
}

/* Σ a_i b_i + c over 4 bytes: a unsigned, b signed. */
static __device__ __forceinline__ int km_dp4a_us(uint32_t a, uint32_t b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

/* Scales s0, s1 and mins m0, m1 of sub-blocks 2c, 2c + 1 of a q4_K super-block whose
 * 16-byte header is a (format/quant_k.h's packing, as cuda_device.cuh's kq_scale_min
 * reads one): bytes 2(c % 2) and 2(c % 2) + 1 of the header's words y, z, w; c < 2 the
 * low 6 bits of y / z, else w's nibbles under y's / z's top 2 bits. */
static __device__ __forceinline__ void kq4_scale_min(const uint4 &a, int c, int &s0, int &s1, int &m0, int &m1) {
    const uint32_t sh = 16 * ((uint32_t)c & 1), y = a.y >> sh, z = a.z >> sh, w = a.w >> sh;
    const uint32_t scp = c >> 1 ? (w & 0x0f0fu) | (y >> 2 & 0x3030u) : y & 0x3f3fu;
    const uint32_t mnp = c >> 1 ? (w >> 4 & 0x0f0fu) | (z >> 2 & 0x3030u) : z & 0x3f3fu;
    s0 = (int)(scp & 0xffu);
    s1 = (int)(scp >> 8 & 0xffu);
    m0 = (int)(mnp & 0xffu);
    m1 = (int)(mnp >> 8 & 0xffu);
}

/* One row's contribution of a lane's 64 weights, the quants centred so that x's
 * rounding error is not carried by their offset: q4_K per sub-block of 32 d sc Σ(q -
 * 8)·x + (8 d sc - dmin mn) Σx (Σx exact in f32); q6_K per 16 d sc Σ(q - 32)·x; the
 * integer sums Σ(q - c)·qx = Σq·qx - c Σqx. */
template <int DT>
static __device__ __forceinline__ float km_dot(const km_raw &r, const km_xv &v, int c) {
    const uint32_t a[4] = {r.a.x, r.a.y, r.a.z, r.a.w}, b[4] = {r.b.x, r.b.y, r.b.z, r.b.w},
                   h[4] = {r.c.x, r.c.y, r.c.z, r.c.w};
    if constexpr (DT == CU_Q4_K) {
        /* quants < 16: signed dp4a is exact. The high nibbles stay in place (16 q, an
         * unsigned byte): hi16 = 16 Σq·x, and no shift a word. 16 s1 (Σq·x - 8 Σqx) <
         * 2^31, its conversion to f32 is 16 times the unscaled one's, and x's scale / 16
         * is exact (a normal float), so the product has the same bits as with the
         * nibbles shifted down (one SHF fewer a word: 8B q4_k_m decode +0.5%). */
        int lo = 0, hi16 = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            lo = __dp4a((int)(b[i] & 0x0f0f0f0fu), (int)v.w[0][i], lo);
            lo = __dp4a((int)(h[i] & 0x0f0f0f0fu), (int)v.w[1][i], lo);
            hi16 = km_dp4a_us(b[i] & 0xf0f0f0f0u, v.w[2][i], hi16);
            hi16 = km_dp4a_us(h[i] & 0xf0f0f0f0u, v.w[3][i], hi16);
        }
        int s0, s1, m0, m1;
        kq4_scale_min(r.a, c, s0, s1, m0, m1);
        const float d = cu_f16((uint16_t)(r.a.x & 0xffffu)), dmin = cu_f16((uint16_t)(r.a.x >> 16));
        return d * ((float)(s0 * (lo - 8 * v.qs[0])) * v.d.x + (float)(s1 * (hi16 - 128 * v.qs[1])) * (0.0625f * v.d.y)) +
               (8.0f * d * (float)s0 - dmin * (float)m0) * v.s.x + (8.0f * d * (float)s1 - dmin * (float)m1) * v.s.y;
    } else {
        const uint32_t s = (uint32_t)c & 1;
        const float dx[4] = {v.d.x, v.d.y, v.d.z, v.d.w};
        float t = 0.0f;
#pragma unroll
        for (int g = 0; g < 4; g++) {
            int dot = 0;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const uint32_t lo = g == 0 ? a[i] : g == 1 ? b[i] : g == 2 ? a[i] >> 4 : b[i] >> 4;
                const uint32_t hb = g == 0 ? h[i] << 4 : g == 1 ? h[i] << 2 : g == 2 ? h[i] : h[i] >> 2;
                dot = __dp4a((int)((lo & 0x0f0f0f0fu) | (hb & 0x30303030u)), (int)v.w[g][i], dot);
            }
            /* scales[8h + 2g + s]: byte 2(g % 2) + s of word g / 2 */
            const int sc = (int)(int8_t)((g < 2 ? r.s.x : r.s.y) >> (16 * (g & 1) + 8 * s) & 0xffu);
            t += (float)(sc * (dot - 32 * v.qs[g])) * dx[g];
        }
        return r.d * t;
    }
}
