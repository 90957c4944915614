/* K-quant (Q4_K, Q5_K, Q6_K) linear kernels: the decode matvec and the dequantization
 * to bf16 that sends prefill through cuBLAS. Upload layouts: cuda_kernels.cuh.
 *
 * A "unit" is what one lane decodes from its 16-byte loads: Q4_K/Q5_K 32 elements (one
 * 16-byte slice of qs, 8 units a super-block), Q6_K 64 elements (one slice of each ql
 * half and the matching qh slice, 4 units a super-block). A unit splits into G groups
 * of 16 consecutive elements that share one scale and one min: value = sc * q - mn
 * with q an unsigned quant. The matvec factors that per group,
 *     sum(value * x) = sc * sum(q * x) - mn * sum(x),
 * so each element costs a byte-to-float (prmt into the 2^23 mantissa, one subtract)
 * and one FMA per weight row, and sum(x) is shared by the rows of a warp. That older
 * kernel serves q5_K and the f32 x modes; the default for q4_K/q6_K is the int8-x
 * kernel further down (cu_matvec_kq_multi: x rounded to 8 bits, dp4a products, also
 * the fused decode launches). */
#include "backend/cuda/kquant_dot.cuh"

#include <string.h>

#include <algorithm>
#include <type_traits>

CU_TRACE_TU(cu_trace_tu_kquant)

template <int DT> struct kq_traits;
template <> struct kq_traits<CU_Q4_K> { static constexpr int BYTES = 144, UPB = 8, G = 2; };
template <> struct kq_traits<CU_Q5_K> { static constexpr int BYTES = 176, UPB = 8, G = 2; };
template <> struct kq_traits<CU_Q6_K> { static constexpr int BYTES = 208, UPB = 4, G = 4; };

/* The loads of one unit, into a km_raw (kquant_dot.cuh): Q4_K a = meta (d, dmin,
 * scales), b = qs slice; Q5_K adds c = qh slice; Q6_K a, b = the two ql slices, c = qh
 * slice, s = 8 sub-block scales, d = super-block scale. */
template <int DT>
static __device__ __forceinline__ void kq_load(const uint8_t *row, const uint16_t *drow, int64_t blk, int ub,
                                               km_raw &r) {
    const uint8_t *bp = row + blk * kq_traits<DT>::BYTES;
    if constexpr (DT == CU_Q4_K) {
        r.a = __ldg((const uint4 *)bp);
        r.b = __ldg((const uint4 *)(bp + 16) + ub);
    } else if constexpr (DT == CU_Q5_K) {
        r.a = __ldg((const uint4 *)bp);
        r.c = __ldg((const uint4 *)(bp + 16) + (ub & 1));
        r.b = __ldg((const uint4 *)(bp + 48) + ub);
    } else {
        const int h = ub >> 1, s = ub & 1;
        r.a = __ldg((const uint4 *)(bp + 64 * h + 16 * s));
        r.b = __ldg((const uint4 *)(bp + 64 * h + 32 + 16 * s));
        r.c = __ldg((const uint4 *)(bp + 128 + 32 * h + 16 * s));
        r.s = __ldg((const uint2 *)(bp + 192 + 8 * h));
        r.d = cu_f16(drow[blk]);
    }
}

/* Byte b of v as a float: v's byte under 0x4b0000 reads as 2^23 + byte, exactly. */
static __device__ __forceinline__ float kq_byte(uint32_t v, int b) {
    return __uint_as_float(__byte_perm(v, 0x4b000000u, 0x7440u | (unsigned)b)) - 8388608.0f;
}

/* First element (within the super-block) of group g of unit ub. */
template <int DT> static __device__ __forceinline__ int kq_group_off(int ub, int g) {
    if constexpr (DT == CU_Q6_K)
        return 128 * (ub >> 1) + 32 * g + 16 * (ub & 1);
    else
        return 64 * (ub >> 1) + 32 * g + 16 * (ub & 1);
}

/* Group g of unit ub: 16 quants as bytes (4 words) and the group's scale and min. */
template <int DT, int g>
static __device__ __forceinline__ void kq_group(const km_raw &r, int ub, uint32_t qw[4], float &sc, float &mn) {
    const uint32_t b[4] = {r.b.x, r.b.y, r.b.z, r.b.w};
    if constexpr (DT == CU_Q6_K) {
        const uint32_t a[4] = {r.a.x, r.a.y, r.a.z, r.a.w}, c[4] = {r.c.x, r.c.y, r.c.z, r.c.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t lo = g == 0 ? a[i] : g == 1 ? b[i] : g == 2 ? a[i] >> 4 : b[i] >> 4;
            const uint32_t hi = g == 0 ? c[i] << 4 : g == 1 ? c[i] << 2 : g == 2 ? c[i] : c[i] >> 2;
            qw[i] = (lo & 0x0f0f0f0fu) | (hi & 0x30303030u);
        }
        const int k = 2 * g + (ub & 1); /* scales[8h + k] */
        const int8_t s8 = (int8_t)(((k < 4 ? r.s.x : r.s.y) >> (8 * (k & 3))) & 0xffu);
        sc = r.d * (float)s8;
        mn = 32.0f * sc;
    } else {
        const int j = 2 * (ub >> 1) + g; /* sub-block */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t q = (g == 0 ? b[i] : b[i] >> 4) & 0x0f0f0f0fu;
            if constexpr (DT == CU_Q5_K) {
                const uint32_t c[4] = {r.c.x, r.c.y, r.c.z, r.c.w};
                q |= ((c[i] >> j) & 0x01010101u) << 4;
            }
            qw[i] = q;
        }
        int s6, m6;
        kq_scale_min(r.a, j, s6, m6);
        sc = cu_f16((uint16_t)(r.a.x & 0xffffu)) * (float)s6;
        mn = cu_f16((uint16_t)(r.a.x >> 16)) * (float)m6;
    }
}

/* ---- matrix-vector -------------------------------------------------------------- */

#define KQ_THREADS 256
#define KQ_WARPS (KQ_THREADS / CU_WARP)
#define KQ_XS_MAX_BYTES (64 << 10) /* staged x: up to 64 KiB of dynamic shared memory */

/* How the matvec reads its one x row (cu_kq_set_x_mode):
 *   KQ_X_GLOBAL  f32 from global memory (L2), 4 float4 loads a group of 16;
 *   KQ_X_SHARED  f32, the block first copies x into shared memory (K * 4 bytes);
 *   KQ_X_Q8      (the default) q4_K/q6_K: cu_matvec_kq_multi below; q5_K: the block
 *                quantizes x into shared memory, int8 per group of 16 with its scale d
 *                and the f32 sum of the group (K * 1.5 bytes), and the dot products
 *                are dp4a: sc * d * sum(q * qx) - mn * sum(x). Not exact: x is rounded
 *                to 8 bits (relative error ~1e-3), as the CPU's K-quant kernels do
 *                with q8 activations. */
enum { KQ_X_GLOBAL = 0, KQ_X_SHARED = 1, KQ_X_Q8 = 2 };
#define KQ_X_DEFAULT KQ_X_Q8
static int kq_x_mode = KQ_X_DEFAULT;

void cu_kq_set_x_mode(int mode) {
    kq_x_mode = mode >= KQ_X_GLOBAL && mode <= KQ_X_Q8 ? mode : KQ_X_DEFAULT;
}

static size_t kq_x_smem(int mode, int64_t K) {
    return mode == KQ_X_SHARED ? (size_t)K * 4 : mode == KQ_X_Q8 ? (size_t)K + (size_t)K / 2 : 0;
}

/* Slot (16-byte unit) of q8 group G: the lanes of a quarter warp read groups 16 or 64
 * elements apart; XOR-ing bit 1 with bit 3 and bit 2 with bit 4 puts them on distinct
 * banks for all three layouts (a permutation inside each aligned run of 32). */
static __device__ __forceinline__ int64_t kq_q8_slot(int64_t G) {
    return G ^ (((G >> 3) & 1) << 1) ^ (((G >> 4) & 1) << 2);
}


/* x staged in shared memory: float4 f of the row at kq_xs_slot(f). A lane reads 16
 * consecutive floats and the lanes of a quarter warp start 16 or 64 floats apart, which
 * would put them on the same banks; XOR-ing the float4 index with its bits 4..6 spreads
 * them (a permutation inside each aligned run of 8 float4). */
static __device__ __forceinline__ int64_t kq_xs_slot(int64_t f) {
    return f ^ ((f >> 4) & 7);
}

/* 16 consecutive floats of x at element e (a multiple of 16): from global memory, or
 * from the staged copy xs (KQ_X_SHARED) */
template <int XM>
static __device__ __forceinline__ void kq_load_x(const float *x, const float4 *xs, int64_t e, float xr[16]) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float4 v = XM == KQ_X_SHARED ? xs[kq_xs_slot(e / 4 + i)] : __ldg((const float4 *)(x + e) + i);
        xr[4 * i] = v.x;
        xr[4 * i + 1] = v.y;
        xr[4 * i + 2] = v.z;
        xr[4 * i + 3] = v.w;
    }
}

/* sum(q[i] * x[i]) over a group: two FMA chains */
static __device__ __forceinline__ float kq_dot16(const uint32_t qw[4], const float xr[16]) {
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
        s0 += kq_byte(qw[i / 4], i % 4) * xr[i];
        s1 += kq_byte(qw[i / 4], i % 4 + 1) * xr[i + 1];
    }
    return s0 + s1;
}

/* x (K floats) -> int8 groups of 16 at kq_q8_slot, with (d, sum) per group after them;
 * by the whole block. */
static __device__ __forceinline__ void kq_stage_q8(const float *__restrict__ x, int64_t K, uint4 *q8, float2 *dsum) {
    for (int64_t G = threadIdx.x; G < K / 16; G += KQ_THREADS) {
        float v[16];
        kq_load_x<KQ_X_GLOBAL>(x, NULL, G * 16, v);
        float amax = 0.0f, sum = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            amax = fmaxf(amax, fabsf(v[i]));
            sum += v[i];
        }
        const float d = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        uint32_t q[4] = {0, 0, 0, 0};
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const int qi = max(-127, min(127, __float2int_rn(v[i] * inv)));
            q[i / 4] |= (uint32_t)(qi & 0xff) << (8 * (i % 4));
        }
        q8[kq_q8_slot(G)] = make_uint4(q[0], q[1], q[2], q[3]);
        dsum[G] = make_float2(d, sum);
    }
}

/* Block: KQ_WARPS warps; `ksplit` consecutive warps share NR consecutive output rows,
 * each warp taking every ksplit-th group of 32 units. One x row (RMAX 1): a lane loads
 * its x groups once (as XM says) and applies them to NR weight rows; the staged modes
 * fill shared memory while the first weight loads are in flight. Several x rows (NR 1,
 * x from global memory): each decoded group serves every x row. */
template <int DT, int RMAX, int NR, int XM>
__global__ void __launch_bounds__(KQ_THREADS, 2) /* <= 128 registers: 16 warps an SM */
    kq_matvec_kernel(struct cu_weight w, const float *__restrict__ x, int rows, float *__restrict__ y,
                     struct cu_epilogue ep, int ksplit) {
    static_assert(XM == KQ_X_GLOBAL || RMAX == 1, "one staged x row");
    extern __shared__ float4 xs[];
    using T = kq_traits<DT>;
    constexpr int U = NR == 1 ? 2 : 1; /* units in flight per lane and row */
    static_assert(RMAX == 1 || NR == 1, "several x rows take one weight row per warp");
    __shared__ float part[KQ_WARPS][NR * RMAX];
    cu_pdl_trigger();
    CU_TRACE_END;
    const int lane = threadIdx.x % CU_WARP, warp = threadIdx.x / CU_WARP;
    const int ks = warp % ksplit;
    const int64_t j0 = ((int64_t)blockIdx.x * (KQ_WARPS / ksplit) + warp / ksplit) * NR;
    const int64_t K = w.cols, n_out = w.rows, nb = K / 256, n_units = nb * T::UPB;
    const uint8_t *wrow[NR];
    const uint16_t *drow[NR];
#pragma unroll
    for (int nr = 0; nr < NR; nr++) { /* rows past the end repeat the last one; dropped */
        const int64_t jr = j0 + nr < n_out ? j0 + nr : n_out - 1;
        wrow[nr] = (const uint8_t *)w.data + (size_t)(jr * nb * T::BYTES);
        drow[nr] = w.scales ? w.scales + jr * nb : NULL;
    }
    float acc[NR][RMAX];
#pragma unroll
    for (int nr = 0; nr < NR; nr++)
#pragma unroll
        for (int r = 0; r < RMAX; r++) acc[nr][r] = 0.0f;
    const int64_t step = (int64_t)CU_WARP * ksplit;
    km_raw raw[U][NR];
    auto load = [&](int64_t u0) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t un = u0 + u * step;
            if (un < n_units)
#pragma unroll
                for (int nr = 0; nr < NR; nr++)
                    kq_load<DT>(wrow[nr], drow[nr], un / T::UPB, (int)(un % T::UPB), raw[u][nr]);
        }
    };
    /* weights first, then wait for x (programmatic dependent launch) */
    const int64_t first = (int64_t)ks * CU_WARP + lane;
    if (j0 < n_out) load(first);
    cu_pdl_wait();
    /* staging: every thread, before any may leave */
    uint4 *const q8 = (uint4 *)xs;
    float2 *const dsum = (float2 *)((uint8_t *)xs + K);
    if constexpr (XM == KQ_X_SHARED) {
        for (int64_t f = threadIdx.x; f < K / 4; f += KQ_THREADS) xs[kq_xs_slot(f)] = __ldg((const float4 *)x + f);
        __syncthreads();
    } else if constexpr (XM == KQ_X_Q8) {
        kq_stage_q8(x, K, q8, dsum);
        __syncthreads();
    }
    if (j0 < n_out) {
        for (int64_t u0 = first; u0 < n_units; u0 += step * U) {
            if (u0 != first) load(u0);
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int64_t un = u0 + u * step;
                if (un >= n_units) break;
                const int ub = (int)(un % T::UPB);
                const int64_t eb = un / T::UPB * 256; /* the unit's super-block in x */
                auto group = [&](auto gc) {
                    constexpr int g = decltype(gc)::value;
                    const int off = kq_group_off<DT>(ub, g);
                    if constexpr (XM == KQ_X_Q8) {
                        const int64_t G = (eb + off) / 16;
                        const uint4 xq = q8[kq_q8_slot(G)];
                        const float2 ds = dsum[G];
#pragma unroll
                        for (int nr = 0; nr < NR; nr++) {
                            uint32_t qw[4];
                            float sc, mn;
                            kq_group<DT, g>(raw[u][nr], ub, qw, sc, mn);
                            int dot = __dp4a((int)qw[0], (int)xq.x, 0); /* quants < 128: signed is exact */
                            dot = __dp4a((int)qw[1], (int)xq.y, dot);
                            dot = __dp4a((int)qw[2], (int)xq.z, dot);
                            dot = __dp4a((int)qw[3], (int)xq.w, dot);
                            acc[nr][0] += sc * ds.x * (float)dot - mn * ds.y;
                        }
                    } else if constexpr (RMAX == 1) {
                        float xr[16];
                        kq_load_x<XM>(x, xs, eb + off, xr);
                        float sx = 0.0f;
#pragma unroll
                        for (int i = 0; i < 16; i++) sx += xr[i];
#pragma unroll
                        for (int nr = 0; nr < NR; nr++) {
                            uint32_t qw[4];
                            float sc, mn;
                            kq_group<DT, g>(raw[u][nr], ub, qw, sc, mn);
                            acc[nr][0] += sc * kq_dot16(qw, xr) - mn * sx;
                        }
                    } else {
                        uint32_t qw[4];
                        float sc, mn;
                        kq_group<DT, g>(raw[u][0], ub, qw, sc, mn);
#pragma unroll
                        for (int r = 0; r < RMAX; r++) {
                            if (r >= rows) break;
                            float xr[16];
                            kq_load_x<KQ_X_GLOBAL>(x, xs, (int64_t)r * K + eb + off, xr);
                            float sx = 0.0f;
#pragma unroll
                            for (int i = 0; i < 16; i++) sx += xr[i];
                            acc[0][r] += sc * kq_dot16(qw, xr) - mn * sx;
                        }
                    }
                };
                group(std::integral_constant<int, 0>());
                group(std::integral_constant<int, 1>());
                if constexpr (T::G == 4) {
                    group(std::integral_constant<int, 2>());
                    group(std::integral_constant<int, 3>());
                }
            }
        }
    }
    cu_matvec_finish<NR, RMAX>(acc, part, ksplit, j0, n_out, rows, y, ep);
}

template <int DT, int RMAX, int NR, int XM>
static void kq_launch(cudaStream_t st, const struct cu_weight *w, const float *x, int rows, float *y,
                      const struct cu_epilogue *ep) {
    static bool smem_set = false; /* above 48 KiB dynamic shared memory is opt-in */
    if (XM != KQ_X_GLOBAL && !smem_set) {
        cudaFuncSetAttribute(kq_matvec_kernel<DT, RMAX, NR, XM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             KQ_XS_MAX_BYTES);
        smem_set = true;
    }
    const int64_t n_units = w->cols / 256 * kq_traits<DT>::UPB, groups = (w->rows + NR - 1) / NR;
    const int ksplit = cu_matvec_ksplit(groups, n_units, KQ_WARPS, 4096);
    (void)cu_launch_pdl(kq_matvec_kernel<DT, RMAX, NR, XM>, dim3(cu_blocks(groups, KQ_WARPS / ksplit)),
                        dim3(KQ_THREADS), kq_x_smem(XM, w->cols), st, *w, x, rows, y, *ep, ksplit);
}

template <int DT, int XM>
static void kq_launch_nr(cudaStream_t st, const struct cu_weight *w, const float *x, int rows, float *y,
                         const struct cu_epilogue *ep, int nr) {
    if (nr == 4)
        kq_launch<DT, 1, 4, XM>(st, w, x, rows, y, ep);
    else if (nr == 2)
        kq_launch<DT, 1, 2, XM>(st, w, x, rows, y, ep);
    else
        kq_launch<DT, 1, 1, XM>(st, w, x, rows, y, ep);
}

template <int DT>
static void kq_launch_rows(cudaStream_t st, const struct cu_weight *w, const float *x, int rows, float *y,
                           const struct cu_epilogue *ep, int nr, int xm) {
    if (rows > 1)
        kq_launch<DT, CU_MATVEC_MAX_ROWS, 1, KQ_X_GLOBAL>(st, w, x, rows, y, ep);
    else if (xm == KQ_X_Q8)
        kq_launch_nr<DT, KQ_X_Q8>(st, w, x, rows, y, ep, nr);
    else if (xm == KQ_X_SHARED)
        kq_launch_nr<DT, KQ_X_SHARED>(st, w, x, rows, y, ep, nr);
    else
        kq_launch_nr<DT, KQ_X_GLOBAL>(st, w, x, rows, y, ep, nr);
}

cudaError_t cu_matvec_kq(cudaStream_t st, const struct cu_weight *w, const float *x, int64_t rows, float *y,
                         const struct cu_epilogue *ep, int nr, int xm) {
    if (rows < 1 || rows > CU_MATVEC_MAX_ROWS || w->cols % 256 || w->rows < 1 || nr > 4 || xm > KQ_X_Q8)
        return cudaErrorInvalidValue;
    if (xm < 0) { /* the mode, where x fits in shared memory */
        xm = kq_x_mode;
        if (kq_x_smem(xm, w->cols) > KQ_XS_MAX_BYTES) xm = KQ_X_GLOBAL;
    } else if (kq_x_smem(xm, w->cols) > KQ_XS_MAX_BYTES)
        return cudaErrorInvalidValue;
    /* the int8-x kernel below, any rows; also whatever the mode when the rms_norm
     * prologue was planned (cu_kq_multi_ok) under another session's mode */
    if ((xm == KQ_X_Q8 || ep->norm_w) && km_type_ok(w->dtype)) {
        struct cu_mv_seg seg;
        memset(&seg, 0, sizeof seg);
        seg.w = *w;
        seg.y = y;
        seg.ep = *ep;
        return cu_matvec_kq_multi(st, x, rows, &seg, 1, NULL, nr);
    }
    if (ep->norm_w) return cudaErrorInvalidValue; /* no rms_norm prologue here */
    if (nr <= 0) nr = w->rows >= 8192 ? 4 : w->rows >= 2048 ? 2 : 1;
    switch (w->dtype) {
    case CU_Q4_K: kq_launch_rows<CU_Q4_K>(st, w, x, (int)rows, y, ep, nr, xm); break;
    case CU_Q5_K: kq_launch_rows<CU_Q5_K>(st, w, x, (int)rows, y, ep, nr, xm); break;
    case CU_Q6_K: kq_launch_rows<CU_Q6_K>(st, w, x, (int)rows, y, ep, nr, xm); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

/* ---- int8-x matvec: one launch for up to three products of x ----------------------
 *
 * The decode form (cu_matvec_kq_multi; cu_matvec_kq's int8 mode for q4_K/q6_K). A
 * block first writes its x rows into shared memory quantized to int8 per group of 32
 * (scale d = max|x| / 127 and the f32 sum of the group beside them; with the rms_norm
 * prologue x * inv_rms * norm_w is what gets quantized), then its warps stream weight
 * rows: an item is NR rows (PAIR: NR gate and NR up rows) by KM_SB super-blocks, four
 * lanes a super-block, each lane 64 weights a row (q4_K: the 16-byte scale header and
 * two 16-byte qs slices; q6_K: two ql slices, one qh slice and 8 scales) in 16-byte
 * loads, dp4a against the int8 x, one float multiply-add per 16 or 32 weights. The
 * loads of the next item are in flight while an item is computed. The grid is what
 * fits the device at once (persistent warps: warp w takes row groups w, w + W, ...),
 * so each block quantizes x once for many rows. Segments may differ in type (q4_K
 * q/k with a q6_K v): the type is uniform over a row group, so a warp branches on it
 * per item. Not exact: x is rounded to 8 bits (~1e-3 relative), as the CPU's K-quant
 * dot products round x to q8_K. */

#define KM_THREADS 256
#define KM_WARPS (KM_THREADS / CU_WARP)
#define KM_SB 8 /* super-blocks of a row per item: 32 lanes x 64 weights (km_lane assumes 8 a pass) */

struct km_job {
    struct cu_mv_seg seg[CU_MV_MAX_SEGS];
    int64_t g_end[CU_MV_MAX_SEGS]; /* row groups of NR rows, segments end to end */
    int n_seg;
    struct cu_weight up; /* PAIR: the up weight beside segment 0 */
    int r0, rows_total;  /* the launch's x rows are r0.. of rows_total (output offsets) */
};

/* x rows (rows of K) -> shared memory (km_row_bytes each), by the whole block; with
 * NORM each row becomes x * inv_rms * norm_w first (cu_norm's expressions). */
template <bool NORM>
static __device__ __forceinline__ void km_stage_x(const float *__restrict__ x, int64_t K, int rows,
                                                  const float *__restrict__ norm_w, float eps, uint8_t *sm) {
    __shared__ float red[32];
    for (int r = 0; r < rows; r++) {
        const float4 *xr = (const float4 *)(x + (size_t)r * K);
        uint8_t *out = sm + (size_t)r * km_row_bytes(K);
        float inv = 1.0f;
        if constexpr (NORM) {
            float ss = 0.0f;
            for (int64_t f = threadIdx.x; f < K / 4; f += KM_THREADS) {
                const float4 v = __ldg(xr + f);
                ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            }
            ss = cu_block_sum(ss, red);
            inv = 1.0f / sqrtf(ss / (float)K + eps);
        }
        /* K % 256 == 0: every warp's 32 float4 are 4 whole groups, all lanes active */
        for (int64_t f = threadIdx.x; f < K / 4; f += KM_THREADS) {
            float4 v = __ldg(xr + f);
            if constexpr (NORM) {
                const float4 g = __ldg((const float4 *)norm_w + f);
                v = make_float4(v.x * inv * g.x, v.y * inv * g.y, v.z * inv * g.z, v.w * inv * g.w);
            }
            km_put_x4(v, f, out, K);
        }
    }
    __syncthreads();
}

/* A warp's position in its sequence of items: row group g (segment seg, first row j0)
 * and stage st (super-blocks st KM_SB ..), advanced without divisions. */
struct km_cur {
    int64_t g, j0;
    int st, seg;
};

/* DT: every segment's type, or 0 (q4_K and q6_K segments mixed: per item). RM: the x
 * rows a launch takes at most (`rows` of them, each in shared memory); several rows
 * take one output row a warp. PF: the next item's loads go out before an item is
 * computed (two register buffers; 16 warps an SM), else 24 warps an SM hide latency
 * (one x row). */
template <int DT, int NR, int RM, bool NORM, bool PAIR, bool PF>
__global__ void __launch_bounds__(KM_THREADS, PF || RM > 1 ? 2 : 3)
    km_kernel(struct km_job job, const float *__restrict__ x, int rows) {
    static_assert(RM == 1 || NR == 1, "several x rows take one output row a warp");
    static_assert(CU_MV_MAX_SEGS == 3, "the segment choice below names each segment");
    constexpr int NW = PAIR ? 2 * NR : NR;
    extern __shared__ uint4 km_sm[];
    cu_pdl_trigger();
    CU_TRACE_END;
    const int lane = threadIdx.x % CU_WARP, c = lane & 3;
    const int64_t K = job.seg[0].w.cols, nb = K / 256;
    const int S = (int)((nb + KM_SB - 1) / KM_SB);
    const int64_t G = job.n_seg > 2 ? job.g_end[2] : job.n_seg > 1 ? job.g_end[1] : job.g_end[0];
    const int64_t W = (int64_t)gridDim.x * KM_WARPS, gw = (int64_t)blockIdx.x * KM_WARPS + threadIdx.x / CU_WARP;
    const int64_t T = gw < G ? ((G - 1 - gw) / W + 1) * S : 0; /* this warp's items */
    auto locate = [&](km_cur &q) {
        if (job.n_seg > 2 && q.g >= job.g_end[1]) {
            q.seg = 2;
            q.j0 = (q.g - job.g_end[1]) * NR;
        } else if (job.n_seg > 1 && q.g >= job.g_end[0]) {
            q.seg = 1;
            q.j0 = (q.g - job.g_end[0]) * NR;
        } else {
            q.seg = 0;
            q.j0 = q.g * NR;
        }
    };
    auto advance = [&](km_cur &q) {
        if (++q.st == S) {
            q.st = 0;
            q.g += W;
            if (q.g < G) locate(q);
        }
    };
    auto weight = [&](int seg) {
        struct cu_weight w = job.seg[0].w;
        if (seg == 1) w = job.seg[1].w;
        if (seg == 2) w = job.seg[2].w;
        return w;
    };
    /* the loading side: its item, and the rows of its group (from the group's first) */
    km_cur lc = {gw, 0, 0, 0};
    locate(lc);
    const uint8_t *rp[NW];
    const uint16_t *dp[NW];
    int l_dt = CU_Q4_K;
    auto rows_of = [&]() {
        const struct cu_weight w = weight(lc.seg);
        l_dt = w.dtype;
        const int bytes = w.dtype == CU_Q4_K ? 144 : 208;
#pragma unroll
        for (int nr = 0; nr < NW; nr++) {
            /* rows past the end repeat the last one; their sums are dropped */
            const int64_t row = lc.j0 + nr % NR < w.rows ? lc.j0 + nr % NR : w.rows - 1;
            const struct cu_weight &ws = PAIR && nr >= NR ? job.up : w;
            rp[nr] = (const uint8_t *)ws.data + (size_t)(row * nb) * bytes + (size_t)(lane >> 2) * bytes;
            dp[nr] = ws.scales ? ws.scales + row * nb + (lane >> 2) : NULL;
        }
    };
    if (T > 0) rows_of();
    auto load = [&](km_raw *R) {
        const int64_t sb = (int64_t)lc.st * KM_SB + (lane >> 2);
        if (sb < nb) {
            const int64_t o = (int64_t)lc.st * KM_SB;
#pragma unroll
            for (int nr = 0; nr < NW; nr++) {
                if constexpr (DT == 0) {
                    if (l_dt == CU_Q4_K)
                        km_load<CU_Q4_K>(rp[nr] + o * 144, NULL, c, R[nr]);
                    else
                        km_load<CU_Q6_K>(rp[nr] + o * 208, dp[nr] + o, c, R[nr]);
                } else {
                    km_load<DT>(rp[nr] + o * (DT == CU_Q4_K ? 144 : 208), DT == CU_Q4_K ? NULL : dp[nr] + o, c, R[nr]);
                }
            }
        }
        const int64_t g0 = lc.g;
        advance(lc);
        if (lc.g != g0 && lc.g < G) rows_of();
    };
    float acc[NW][RM];
#pragma unroll
    for (int nr = 0; nr < NW; nr++)
#pragma unroll
        for (int r = 0; r < RM; r++) acc[nr][r] = 0.0f;
    const uint8_t *sm = (const uint8_t *)km_sm;
    km_lane xl4, xl6; /* where each lane's x operands are (kquant_dot.cuh) */
    if constexpr (DT != CU_Q6_K) xl4 = km_lane_of<CU_Q4_K>(K, lane);
    if constexpr (DT != CU_Q4_K) xl6 = km_lane_of<CU_Q6_K>(K, lane);
    const uint32_t xrow = (uint32_t)km_row_bytes(K);
    auto dots = [&](auto dc, const km_raw *R, int st) {
        constexpr int D = decltype(dc)::value;
#pragma unroll
        for (int r = 0; r < RM; r++) {
            if (r >= rows) break;
            km_xv v;
            km_x_load<D>(sm + r * xrow, D == CU_Q4_K ? xl4 : xl6, (uint32_t)st, c, v);
#pragma unroll
            for (int nr = 0; nr < NW; nr++) acc[nr][r] += km_dot<D>(R[nr], v, c);
        }
    };
    km_cur cc = lc; /* the computing side */
    auto compute = [&](const km_raw *R) {
        const int64_t sb = (int64_t)cc.st * KM_SB + (lane >> 2);
        if (sb < nb) {
            if constexpr (DT == 0) {
                if (weight(cc.seg).dtype == CU_Q4_K)
                    dots(std::integral_constant<int, CU_Q4_K>(), R, cc.st);
                else
                    dots(std::integral_constant<int, CU_Q6_K>(), R, cc.st);
            } else {
                dots(std::integral_constant<int, DT>(), R, cc.st);
            }
        }
        if (cc.st == S - 1) {
            /* the group's last item: sums to lane 0, which writes act(sum + bias) * (up
             * or gate) + residual (cu_matvec_finish's epilogue) */
#pragma unroll
            for (int nr = 0; nr < NW; nr++)
#pragma unroll
                for (int r = 0; r < RM; r++) acc[nr][r] = cu_warp_sum(acc[nr][r]);
            if (lane == 0) {
                struct cu_mv_seg sg = job.seg[0];
                if (cc.seg == 1) sg = job.seg[1];
                if (cc.seg == 2) sg = job.seg[2];
                const int64_t n_out = sg.w.rows;
#pragma unroll
                for (int nr = 0; nr < NR; nr++)
#pragma unroll
                    for (int r = 0; r < RM; r++) {
                        const int64_t j = cc.j0 + nr;
                        const int rr = job.r0 + r; /* the launch's x row */
                        if (j >= n_out || r >= rows) continue;
                        cu_matvec_put<PAIR>(acc[nr][r], PAIR ? acc[NR + nr][r] : 0.0f,
                                            cu_matvec_epi<PAIR>(j, rr, n_out, sg.ep), j, rr, n_out, job.rows_total,
                                            sg.y, sg.ep, sg.head_dim);
                    }
            }
#pragma unroll
            for (int nr = 0; nr < NW; nr++)
#pragma unroll
                for (int r = 0; r < RM; r++) acc[nr][r] = 0.0f;
        }
        advance(cc);
    };
    km_raw R0[NW] = {}, R1[PF ? NW : 1] = {};
    if (T > 0) load(R0);
    cu_pdl_wait();
    km_stage_x<NORM>(x, K, rows, job.seg[0].ep.norm_w, job.seg[0].ep.norm_eps, (uint8_t *)km_sm);
    if constexpr (PF) {
        for (int64_t t = 0; t < T; t += 2) {
            if (t + 1 < T) load(R1);
            compute(R0);
            if (t + 1 >= T) break;
            if (t + 2 < T) load(R0);
            compute(R1);
        }
    } else {
        for (int64_t t = 0; t < T; t++) {
            if (t > 0) load(R0);
            compute(R0);
        }
    }
}

static int km_bps_cap = 0, km_nr = 0, km_pf = 0; /* cu_kq_tune */

extern "C" void cu_kq_tune(int nr, int prefetch, int blocks_per_sm) {
    km_nr = nr == 1 || nr == 2 ? nr : 0;
    km_pf = prefetch == 1 || prefetch == 2 ? prefetch : 0;
    km_bps_cap = blocks_per_sm >= 1 && blocks_per_sm <= 16 ? blocks_per_sm : 0;
}

/* One launch: as many blocks as the device holds at once (or the row groups need). */
template <int DT, int NR, int RM, bool NORM, bool PAIR, bool PF>
static cudaError_t km_launch(cudaStream_t st, struct km_job job, const float *x, int rows) {
    auto kern = km_kernel<DT, NR, RM, NORM, PAIR, PF>;
    const size_t smem = km_row_bytes(job.seg[0].w.cols) * (size_t)rows;
    static size_t occ_smem = (size_t)-1;
    static int occ = 1;
    const cudaError_t e = cu_blocks_per_sm(kern, KM_THREADS, smem, KQ_XS_MAX_BYTES, &occ_smem, &occ);
    if (e != cudaSuccess) return e;
    const int bps = km_bps_cap && km_bps_cap < occ ? km_bps_cap : occ;
    int64_t groups = 0;
    for (int k = 0; k < job.n_seg; k++) {
        groups += (job.seg[k].w.rows + NR - 1) / NR;
        job.g_end[k] = groups;
    }
    const int64_t blocks = std::min<int64_t>(cu_blocks(groups, KM_WARPS), (int64_t)bps * cu_sm_count());
    return cu_launch_pdl(kern, dim3((unsigned)blocks), dim3(KM_THREADS), smem, st, job, x, rows);
}

/* One x row: nr output rows a warp (1 or 2), with or without the next item's loads in
 * flight (pf); several: one, x rows in shared memory as many at a time as fit. */
template <int DT, bool NORM, bool PAIR>
static cudaError_t km_launch_rows(cudaStream_t st, struct km_job &job, const float *x, int64_t rows, int nr) {
    const int64_t K = job.seg[0].w.cols;
    job.rows_total = (int)rows;
    job.r0 = 0;
    if (rows == 1) {
        /* the next item's loads in flight where a row has more than 2 items (K > 4096:
         * 8B ffn_down 19.1 against 21.7 us); else 24 warps an SM do better (8B ffn_up
         * 15.9 against 17.5 us, q/k/v with the norm prologue 9.5 against 11.3 us;
         * bench/results/cuda-kq-2026-11-30.md) */
        const bool pf = km_pf ? km_pf == 1 : K > 4096;
        if constexpr (!PAIR) /* a pair streams 2 rows a warp already (more spill) */
            if (nr >= 2)
                return pf ? km_launch<DT, 2, 1, NORM, PAIR, true>(st, job, x, 1)
                          : km_launch<DT, 2, 1, NORM, PAIR, false>(st, job, x, 1);
        return pf ? km_launch<DT, 1, 1, NORM, PAIR, true>(st, job, x, 1)
                  : km_launch<DT, 1, 1, NORM, PAIR, false>(st, job, x, 1);
    }
    const int64_t fit = std::max<int64_t>(1, std::min<int64_t>(CU_MATVEC_MAX_ROWS, KQ_XS_MAX_BYTES / (int64_t)km_row_bytes(K)));
    for (int64_t r0 = 0; r0 < rows; r0 += fit) {
        job.r0 = (int)r0;
        cudaError_t e = km_launch<DT, 1, CU_MATVEC_MAX_ROWS, NORM, PAIR, false>(st, job, x + r0 * K, (int)std::min(fit, rows - r0));
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

template <int DT>
static cudaError_t km_launch_ep(cudaStream_t st, struct km_job &job, const float *x, int64_t rows, int nr) {
    const bool norm = job.seg[0].ep.norm_w != NULL;
    if constexpr (DT != 0)
        if (job.up.data)
            return norm ? km_launch_rows<DT, true, true>(st, job, x, rows, nr)
                        : km_launch_rows<DT, false, true>(st, job, x, rows, nr);
    return norm ? km_launch_rows<DT, true, false>(st, job, x, rows, nr)
                : km_launch_rows<DT, false, false>(st, job, x, rows, nr);
}

bool cu_kq_multi_ok(const struct cu_weight *w) {
    return km_type_ok(w->dtype) && w->cols > 0 && w->cols % 256 == 0 && w->rows >= 1 &&
           km_row_bytes(w->cols) <= KQ_XS_MAX_BYTES && kq_x_mode == KQ_X_Q8;
}

cudaError_t cu_matvec_kq_multi(cudaStream_t st, const float *x, int64_t rows, const struct cu_mv_seg *segs, int n_seg,
                               const struct cu_weight *up, int nr) {
    if (rows < 1 || rows > CU_MATVEC_MAX_ROWS || n_seg < 1 || n_seg > CU_MV_MAX_SEGS || (up && n_seg != 1) || nr < 0 ||
        nr > 4)
        return cudaErrorInvalidValue;
    const int64_t K = segs[0].w.cols;
    bool same = true;
    for (int k = 0; k < n_seg; k++) {
        const struct cu_weight *w = &segs[k].w;
        if (!km_type_ok(w->dtype) || w->cols != K || K % 256 || K <= 0 || w->rows < 1 || !w->data ||
            (w->dtype == CU_Q6_K && !w->scales) || km_row_bytes(K) > KQ_XS_MAX_BYTES || (k > 0 && segs[k].ep.norm_w) ||
            (segs[k].head_dim > 0 && w->rows % segs[k].head_dim) || !segs[k].y)
            return cudaErrorInvalidValue;
        same = same && w->dtype == segs[0].w.dtype;
    }
    if (up && (up->dtype != segs[0].w.dtype || up->rows != segs[0].w.rows || up->cols != K || !up->data))
        return cudaErrorInvalidValue;
    struct km_job job;
    memset(&job, 0, sizeof job);
    job.n_seg = n_seg;
    for (int k = 0; k < n_seg; k++) job.seg[k] = segs[k];
    if (up) job.up = *up;
    if (rows == 1 && nr == 0 && !km_nr && !km_pf && !km_bps_cap) {
        /* the staged kernel (kernels_stream.cu), where it is chosen and applies; not
         * under a cu_kq_tune launch shape (lab, tests of this kernel) */
        const cudaError_t e = cu_matvec_stream(st, x, segs, n_seg, up, true);
        if (e != cudaErrorNotSupported) return e;
    }
    if (rows > 1 && !km_nr && !km_pf && !km_bps_cap) {
        /* tensor cores (kernels_linear.cu), where they apply; not under a cu_kq_tune
         * launch shape (lab, tests of this kernel) */
        const cudaError_t e = cu_matvec_kq_mma(st, x, rows, segs, n_seg, up);
        if (e != cudaErrorNotSupported) return e;
    }
    if (nr == 0) nr = km_nr ? km_nr : 2;
    cudaError_t e;
    if (!same)
        e = km_launch_ep<0>(st, job, x, rows, nr);
    else if (segs[0].w.dtype == CU_Q4_K)
        e = km_launch_ep<CU_Q4_K>(st, job, x, rows, nr);
    else
        e = km_launch_ep<CU_Q6_K>(st, job, x, rows, nr);
    return e != cudaSuccess ? e : cudaGetLastError();
}

/* ---- dequantization to bf16 (prefill) ------------------------------------------- */

/* A thread per group of 16 elements (two 16-byte stores; a warp writes 1 KiB in
 * order), value = sc * q - mn rounded once (the matvec's factoring, not the
 * reference's expression order: bf16 rounding dominates either way). */
template <int DT, int g>
static __device__ __forceinline__ void kq_group_to_bf16(const km_raw &r, int ub, uint4 *dst) {
    uint32_t qw[4], o[8];
    float sc, mn;
    kq_group<DT, g>(r, ub, qw, sc, mn);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const float lo = sc * kq_byte(qw[i / 2], 2 * (i % 2)) - mn;
        const float hi = sc * kq_byte(qw[i / 2], 2 * (i % 2) + 1) - mn;
        o[i] = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
               ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16);
    }
    dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
    dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

template <int DT>
__global__ void kq_to_bf16_kernel(struct cu_weight w, uint4 *out, int64_t n_groups) {
    for (int64_t gi = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; gi < n_groups;
         gi += (int64_t)gridDim.x * blockDim.x) {
        const int64_t blk = gi / 16; /* flat super-block (row blk / nb) */
        const int G = (int)(gi % 16); /* elements 16G .. 16G + 15 of it */
        /* the unit and group holding them (kq_group_off inverted) */
        const int ub = DT == CU_Q6_K ? 2 * (G / 8) + (G & 1) : 2 * (G / 4) + (G & 1);
        const int g = DT == CU_Q6_K ? (G % 8) / 2 : (G % 4) / 2;
        km_raw r;
        kq_load<DT>((const uint8_t *)w.data, w.scales, blk, ub, r);
        uint4 *dst = out + gi * 2;
        if (g == 0) kq_group_to_bf16<DT, 0>(r, ub, dst);
        else if (g == 1) kq_group_to_bf16<DT, 1>(r, ub, dst);
        else if constexpr (DT == CU_Q6_K) {
            if (g == 2) kq_group_to_bf16<DT, 2>(r, ub, dst);
            else kq_group_to_bf16<DT, 3>(r, ub, dst);
        }
    }
}

cudaError_t cu_kq_to_bf16(cudaStream_t st, const struct cu_weight *w, void *out) {
    if (w->cols % 256 || ((uintptr_t)out % 16)) return cudaErrorInvalidValue;
    const int64_t blocks = w->rows * (w->cols / 256);
    if (blocks <= 0) return cudaSuccess;
    switch (w->dtype) {
    case CU_Q4_K: kq_to_bf16_kernel<CU_Q4_K><<<4 * 132 * 8, 256, 0, st>>>(*w, (uint4 *)out, blocks * 16); break;
    case CU_Q5_K: kq_to_bf16_kernel<CU_Q5_K><<<4 * 132 * 8, 256, 0, st>>>(*w, (uint4 *)out, blocks * 16); break;
    case CU_Q6_K: kq_to_bf16_kernel<CU_Q6_K><<<4 * 132 * 8, 256, 0, st>>>(*w, (uint4 *)out, blocks * 16); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

/* ---- upload --------------------------------------------------------------------- */

void cu_kq_repack_q6_k(const void *src, int64_t blocks, void *qs, uint16_t *d) {
    const uint8_t *s = (const uint8_t *)src;
    uint8_t *q = (uint8_t *)qs;
    for (int64_t b = 0; b < blocks; b++) { /* GGUF: ql 128, qh 64, scales 16, d 2 */
        memcpy(q + b * 208, s + b * 210, 208);
        memcpy(&d[b], s + b * 210 + 208, 2);
    }
}
