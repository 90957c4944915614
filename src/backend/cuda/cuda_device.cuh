/* Device-side helpers shared by the kernel files: f16/bf16 bits, warp and block
 * reductions; the IR's unary/binary formulas are backend/op_math.h's, shared with the CPU
 * reference. */
#ifndef LLMOPT_BACKEND_CUDA_CUDA_DEVICE_CUH
#define LLMOPT_BACKEND_CUDA_CUDA_DEVICE_CUH

#include "backend/cuda/cuda_kernels.cuh"

extern "C" {
#include "ir/ir.h"
}
#include "backend/op_math.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define CU_WARP 32

static __device__ __forceinline__ float cu_f16(uint16_t h) {
    return __half2float(__ushort_as_half(h));
}
static __device__ __forceinline__ float cu_bf16(uint16_t h) {
    return __uint_as_float((uint32_t)h << 16);
}

/* A result stored as f32, or rounded to f16/bf16 (an operand of a cuBLAS product). */
static __device__ __forceinline__ void cu_put(float *p, float v) { *p = v; }
static __device__ __forceinline__ void cu_put(__half *p, float v) { *p = __float2half_rn(v); }
static __device__ __forceinline__ void cu_put(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

static __device__ __forceinline__ float cu_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float cu_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Block-wide sum / max for blockDim.x a multiple of 32 (<= 1024); every thread gets the
 * result. red: __shared__ float[32]. Ends with a barrier so red can be reused.
 * cu_warps_sum: the sum over the first nw warps of the block, every thread of them gets
 * it, synchronized by barrier `bar` of nw * 32 threads (0 with the whole block:
 * cu_block_sum; a named barrier 1..15 when other warps of the block take no part). */
static __device__ __forceinline__ float cu_warps_sum(float v, float *red, int nw, int bar) {
    int lane = threadIdx.x % CU_WARP, warp = threadIdx.x / CU_WARP;
    v = cu_warp_sum(v);
    if (lane == 0) red[warp] = v;
    asm volatile("bar.sync %0, %1;" ::"r"(bar), "r"(nw * CU_WARP) : "memory");
    float r = lane < nw ? red[lane] : 0.0f;
    r = cu_warp_sum(r);
    asm volatile("bar.sync %0, %1;" ::"r"(bar), "r"(nw * CU_WARP) : "memory");
    return r;
}
static __device__ __forceinline__ float cu_block_sum(float v, float *red) {
    return cu_warps_sum(v, red, blockDim.x / CU_WARP, 0);
}
static __device__ __forceinline__ float cu_block_max(float v, float *red) {
    int lane = threadIdx.x % CU_WARP, warp = threadIdx.x / CU_WARP, nw = blockDim.x / CU_WARP;
    v = cu_warp_max(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float r = lane < nw ? red[lane] : -INFINITY;
    r = cu_warp_max(r);
    __syncthreads();
    return r;
}

/* A q4_K / q5_K super-block's sub-block j 6-bit scale and min from its 16-byte header m
 * (x: d and dmin; the 12 packed bytes in y, z, w: bytes 0..3, 4..7, 8..11),
 * format/quant_k.h's packing. (kquant_dot.cuh's km_dot unpacks two at once.) */
static __device__ __forceinline__ void kq_scale_min(const uint4 &m, int j, int &sc, int &mn) {
    const int sh = 8 * (j & 3);
    const int by = (int)((m.y >> sh) & 0xffu), bz = (int)((m.z >> sh) & 0xffu), bw = (int)((m.w >> sh) & 0xffu);
    if (j < 4) {
        sc = by & 63;
        mn = bz & 63;
    } else {
        sc = (bw & 15) | ((by >> 6) << 4);
        mn = (bw >> 4) | ((bz >> 6) << 4);
    }
}

/* One element of a weight in the upload layout (cu_weight). */
static __device__ __forceinline__ float cu_weight_elem(const struct cu_weight &w, int64_t r, int64_t c) {
    switch (w.dtype) {
    case CU_F32: return ((const float *)w.data)[r * w.cols + c];
    case CU_F16: return cu_f16(((const uint16_t *)w.data)[r * w.cols + c]);
    case CU_BF16: return cu_bf16(((const uint16_t *)w.data)[r * w.cols + c]);
    case CU_Q8_0:
        return (float)((const int8_t *)w.data)[r * w.cols + c] * cu_f16(w.scales[r * (w.cols / 32) + c / 32]);
    case CU_Q4_0: {
        int64_t in_blk = c % 32;
        uint8_t b = ((const uint8_t *)w.data)[r * (w.cols / 2) + (c / 32) * 16 + (in_blk % 16)];
        int q = in_blk < 16 ? (b & 15) : (b >> 4);
        return (float)(q - 8) * cu_f16(w.scales[r * (w.cols / 32) + c / 32]);
    }
    case CU_Q4_K:
    case CU_Q5_K: { /* format/quant_k.c's dequantize_q4_K / _q5_K, same f32 operations */
        const bool q5 = w.dtype == CU_Q5_K;
        const int64_t nb = w.cols / 256, e = c % 256;
        const uint8_t *bp = (const uint8_t *)w.data + (size_t)(r * nb + c / 256) * (q5 ? 176 : 144);
        const int j = (int)(e / 32), l = (int)(e % 32);
        int sc, mn; /* blocks of 144 / 176 bytes: every header 16-byte aligned */
        kq_scale_min(*(const uint4 *)bp, j, sc, mn);
        int q = (bp[(q5 ? 48 : 16) + 32 * (j / 2) + l] >> (4 * (j % 2))) & 15;
        if (q5) q |= ((bp[16 + l] >> j) & 1) << 4;
        const float d = cu_f16((uint16_t)(bp[0] | bp[1] << 8)), dmin = cu_f16((uint16_t)(bp[2] | bp[3] << 8));
        return __fsub_rn(__fmul_rn(__fmul_rn(d, (float)sc), (float)q), __fmul_rn(dmin, (float)mn));
    }
    case CU_Q6_K: { /* dequantize_q6_K on the 208-byte upload blocks, d apart */
        const int64_t nb = w.cols / 256, e = c % 256;
        const uint8_t *bp = (const uint8_t *)w.data + (size_t)(r * nb + c / 256) * 208;
        const int h = (int)(e / 128), g = (int)(e % 128) / 32, l = (int)(e % 32);
        const uint8_t lo = bp[64 * h + l + 32 * (g & 1)];
        const int q = (g < 2 ? lo & 15 : lo >> 4) | (((bp[128 + 32 * h + l] >> (2 * g)) & 3) << 4);
        const float d = cu_f16(w.scales[r * nb + c / 256]);
        return __fmul_rn(__fmul_rn(d, (float)(int8_t)bp[192 + e / 16]), (float)(q - 32));
    }
    default: return 0.0f;
    }
}

/* The epilogue operands of output j of x row r of a matvec (0, or 1 for a gate, where
 * absent), loaded apart from cu_matvec_put so that a kernel can issue them early. */
struct cu_mv_epi {
    float bias, gate, residual;
};
template <bool PAIR>
static __device__ __forceinline__ struct cu_mv_epi cu_matvec_epi(int64_t j, int r, int64_t n_out,
                                                                 const struct cu_epilogue &ep) {
    const size_t o = (size_t)r * n_out + j;
    struct cu_mv_epi e;
    e.bias = ep.bias ? ep.bias[j] : 0.0f;
    e.gate = !PAIR && ep.gate ? ep.gate[o] : 1.0f;
    e.residual = ep.residual ? ep.residual[o] : 0.0f;
    return e;
}
/* Output j of x row r of a matvec whose product is `sum` (`up`: the second product of a
 * SwiGLU pair; e: cu_matvec_epi's operands): act(sum + bias) * (up or gate) + residual,
 * stored row-major or, with head_dim > 0, head-major (cu_matvec_finish, kernels_stream.cu,
 * kernels_kquant.cu). */
template <bool PAIR>
static __device__ __forceinline__ void cu_matvec_put(float sum, float up, const struct cu_mv_epi &e, int64_t j, int r,
                                                     int64_t n_out, int rows, float *__restrict__ y,
                                                     const struct cu_epilogue &ep, int64_t head_dim) {
    float v = sum + e.bias;
    if (ep.act >= 0) v = op_unary_apply(ep.act, v);
    if constexpr (PAIR)
        v *= up;
    else if (ep.gate)
        v *= e.gate;
    if (ep.residual) v += e.residual;
    const size_t o = (size_t)r * n_out + j;
    y[head_dim > 0 ? (size_t)(((j / head_dim) * rows + r) * head_dim + j % head_dim) : o] = v;
}

/* The end of a matvec block (cu_matvec_multi, cu_matvec_kq): each lane holds partial
 * sums acc[nr][r] for output rows j0 + nr and x rows r (with PAIR, acc[NR + nr][r] are
 * the up products of a SwiGLU pair); the warp sums them, the `ksplit` warps sharing
 * rows add their sums through part (a barrier every thread of the block reaches), and
 * the first of them writes act(sum + bias) * (up or gate) + residual. head_dim > 0
 * writes output row r head-major: element j at ((j / head_dim) * rows + r) * head_dim
 * + j % head_dim. */
template <int NR, int RMAX, bool PAIR = false>
static __device__ __forceinline__ void cu_matvec_finish(float (&acc)[NR * (PAIR ? 2 : 1)][RMAX],
                                                        float (*part)[NR * (PAIR ? 2 : 1) * RMAX], int ksplit,
                                                        int64_t j0, int64_t n_out, int rows, float *__restrict__ y,
                                                        const struct cu_epilogue &ep, int64_t head_dim = 0) {
    constexpr int NW = NR * (PAIR ? 2 : 1);
    const int lane = threadIdx.x % CU_WARP, warp = threadIdx.x / CU_WARP, ks = warp % ksplit;
#pragma unroll
    for (int nr = 0; nr < NW; nr++)
#pragma unroll
        for (int r = 0; r < RMAX; r++) acc[nr][r] = cu_warp_sum(acc[nr][r]);
    if (ksplit > 1) {
        if (lane == 0)
#pragma unroll
            for (int nr = 0; nr < NW; nr++)
#pragma unroll
                for (int r = 0; r < RMAX; r++) part[warp][nr * RMAX + r] = acc[nr][r];
        __syncthreads();
        if (ks == 0 && lane == 0)
#pragma unroll
            for (int nr = 0; nr < NW; nr++)
#pragma unroll
                for (int r = 0; r < RMAX; r++) {
                    float s = 0.0f;
                    for (int k = 0; k < ksplit; k++) s += part[warp + k][nr * RMAX + r];
                    acc[nr][r] = s;
                }
    }
    if (ks != 0 || lane != 0) return;
#pragma unroll
    for (int nr = 0; nr < NR; nr++) {
        const int64_t j = j0 + nr;
        if (j >= n_out) break;
        for (int r = 0; r < rows && r < RMAX; r++)
            cu_matvec_put<PAIR>(acc[nr][r], PAIR ? acc[NR + nr][r] : 0.0f, cu_matvec_epi<PAIR>(j, r, n_out, ep), j, r,
                                n_out, rows, y, ep, head_dim);
    }
}

/* ---- int8 x of the q8_0 matvecs (kernels_linear.cu, kernels_stream.cu) ---- */

/* Bytes of a K-element x row staged as int8: K quants, then one f32 scale per 32. */
static inline size_t mv_xq_smem(int64_t K) {
    return (size_t)K + (size_t)(K / 32) * sizeof(float);
}
/* ... and from one x row to the next where several are staged (16-byte aligned) */
static __host__ __device__ inline size_t mv_xq_row_stride(int64_t K) {
    return ((size_t)K + (size_t)(K / 32) * sizeof(float) + 15) & ~(size_t)15;
}

/* 4 values times id rounded half to even to int8, packed: adding 1.5 * 2^23 to the
 * rounded product (no fma) leaves the integer in the low mantissa byte (|v| <= 127.5). */
static __device__ __forceinline__ uint32_t mv_q8_pack4(float a, float b, float c, float d, float id) {
    const uint32_t qa = __float_as_uint(__fadd_rn(__fmul_rn(a, id), 12582912.0f));
    const uint32_t qb = __float_as_uint(__fadd_rn(__fmul_rn(b, id), 12582912.0f));
    const uint32_t qc = __float_as_uint(__fadd_rn(__fmul_rn(c, id), 12582912.0f));
    const uint32_t qd = __float_as_uint(__fadd_rn(__fmul_rn(d, id), 12582912.0f));
    return __byte_perm(__byte_perm(qa, qb, 0x0040u), __byte_perm(qc, qd, 0x0040u), 0x5410u);
}

/* d and 1 / d of a block whose largest magnitude is amax */
static __device__ __forceinline__ float mv_q8_scale(float amax, float *id) {
    const float d = amax / 127.0f;
    *id = d != 0.0f ? 1.0f / d : 0.0f;
    return d;
}

/* The largest magnitude of the 32 values that 8 neighbouring lanes (lane % 8 == 0..7)
 * hold 4 each, in every one of them; every lane of the warp calls this. */
static __device__ __forceinline__ float cu_amax8(float4 v) {
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    return fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 4));
}

/* Stores one thread's 4 values a (element group f) of x as int8 in q, and its q8_0
 * block's scale in d from the block's first lane: the amax is taken over the 8 lanes
 * of the block, so every lane of the warp must call this (in: whether f is in range). */
static __device__ __forceinline__ void mv_put_x_q8(float4 a, bool in, int64_t f, uint32_t *q, float *d) {
    const float amax = cu_amax8(a);
    float id;
    const float db = mv_q8_scale(amax, &id);
    if (!in) return;
    q[f] = mv_q8_pack4(a.x, a.y, a.z, a.w, id);
    if (threadIdx.x % 8 == 0) d[f / 8] = db;
}

/* The largest magnitude and the sum of the 32 values that 8 neighbouring lanes (lane %
 * 8 == 0..7) hold 4 each, in every one of them; every lane of the warp calls this. */
static __device__ __forceinline__ void cu_amax_sum8(float4 v, float *amax_out, float *sum_out) {
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    float sum = (v.x + v.y) + (v.z + v.w);
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    }
    *amax_out = amax;
    *sum_out = sum;
}

/* The int8 x of the K-quant tensor-core products: mv_put_x_q8's int8 and scale, and
 * beside them what the K-quant sums need. The 32-element block f / 8 gets the record
 * rec[f / 8] = {d, the f32 sum of its 4 x 8 values, -8 d Σq (q4_K's offset), the int
 * sums of its quantized first and second 16 as two int16 (|Σ| <= 2032) in one word}.
 * Every lane of the warp calls this. */
static __device__ __forceinline__ void mv_put_x_q8_sums(float4 a, bool in, int64_t f, uint32_t *q, float4 *rec) {
    float amax, sum;
    cu_amax_sum8(a, &amax, &sum);
    float id;
    const float db = mv_q8_scale(amax, &id);
    const uint32_t w = mv_q8_pack4(a.x, a.y, a.z, a.w, id);
    int qs = __dp4a((int)w, 0x01010101, 0); /* the 4 signed bytes' sum */
    qs += __shfl_xor_sync(0xffffffffu, qs, 1);
    qs += __shfl_xor_sync(0xffffffffu, qs, 2);
    const int qs_hi = __shfl_down_sync(0xffffffffu, qs, 4); /* lane + 4: the block's second 16 */
    if (!in) return;
    q[f] = w;
    if (threadIdx.x % 8 == 0)
        rec[f / 8] = make_float4(db, sum, (float)(-8 * (qs + qs_hi)) * db,
                                 __uint_as_float(((uint32_t)qs & 0xffffu) | (uint32_t)qs_hi << 16));
}

/* MV_X_Q8: x (times sc * nw, the rms_norm prologue, when nw is set) -> K int8 in
 * q and K / 32 scales in d, by `threads` threads of the block: a thread converts 4
 * consecutive elements, 8 neighbouring lanes a block (K % 32 == 0, so the 8 lanes of a
 * block are all in range or all out). */
static __device__ __forceinline__ void mv_quantize_x_q8(const float *__restrict__ x, const float *__restrict__ nw,
                                                        float sc, int64_t K, int threads, uint32_t *q, float *d) {
    for (int64_t f0 = 0; f0 < K / 4; f0 += threads) { /* uniform bound: whole warps shuffle */
        const int64_t f = f0 + threadIdx.x;
        const bool in = f < K / 4;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (in) {
            v = __ldg((const float4 *)x + f);
            if (nw) {
                const float4 w = __ldg((const float4 *)nw + f);
                v = make_float4(v.x * sc * w.x, v.y * sc * w.y, v.z * sc * w.z, v.w * sc * w.w);
            }
        }
        mv_put_x_q8(v, in, f, q, d);
    }
}

/* Several x rows staged for the int8-x matvecs: put(v, r, f, in) for every float4
 * group f of the rows r = 0..rows-1 (row r at x + r * K), v times sc(r) * nw first
 * where nw is set (the rms_norm prologue, (x * sc) * w as mv_quantize_x_q8), by the
 * block's threads 0..threads-1. The groups of all rows form one sequence
 * g = r * K / 4 + f, and each thread loads its next U groups before it puts any, so
 * one round trip to x serves U * threads groups; a row at a time, a group at a time
 * waited for x once a group (8 rows of 12288: 96 round trips a block). The (r, f) of
 * a thread's groups advance by subtraction, without a division on the way to the
 * first load. Whole warps call put, as the q8 rules shuffle: with K % 32 == 0 the 8
 * lanes of a 32-element block lie in one row and are all in range or all out (in
 * false: v is zero), with K % 256 == 0 the same holds for whole warps. */
template <int U, typename SC, typename PUT>
static __device__ __forceinline__ void cu_stage_x_rows(const float *__restrict__ x, int rows, int64_t K,
                                                       const float *__restrict__ nw, SC sc, int threads, PUT put) {
    const uint32_t fr = (uint32_t)(K / 4), n = (uint32_t)rows * fr, t = threadIdx.x;
    uint32_t r = t < fr ? 0 : t / fr, f = t - r * fr;              /* the thread's next group */
    for (uint32_t g0 = 0; g0 < n; g0 += (uint32_t)(U * threads)) { /* uniform bound */
        float4 v[U], w[U];
        uint32_t row[U], grp[U];
#pragma unroll
        for (int u = 0; u < U; u++) { /* every load of the round in flight */
            row[u] = r;
            grp[u] = f;
            v[u] = w[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (r < (uint32_t)rows) {
                v[u] = __ldg((const float4 *)(x + (size_t)r * K) + f);
                if (nw) w[u] = __ldg((const float4 *)nw + f);
            }
            for (f += (uint32_t)threads; f >= fr; f -= fr) r++;
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (g0 + (uint32_t)(u * threads) >= n) break; /* uniform: whole warps shuffle */
            const bool in = row[u] < (uint32_t)rows;
            float4 a = v[u];
            if (nw && in) {
                const float s = sc(row[u]);
                a = make_float4(a.x * s * w[u].x, a.y * s * w[u].y, a.z * s * w[u].z, a.w * s * w[u].w);
            }
            put(a, in ? row[u] : 0, grp[u], in);
        }
    }
}

/* Asynchronous copies global -> shared (cp.async, sm_80+): 16 bytes bypassing L1, or 8;
 * a commit closes this thread's group of copies, cu_cp_async_wait<N> waits until at
 * most N of its groups are pending (then __syncwarp/__syncthreads before other threads
 * read what it copied). Both addresses aligned to the size. */
static __device__ __forceinline__ void cu_cp_async16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src)
                 : "memory");
}
static __device__ __forceinline__ void cu_cp_async8(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src)
                 : "memory");
}
static __device__ __forceinline__ void cu_cp_async_commit(void) {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N> static __device__ __forceinline__ void cu_cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* sum of 16 int8 products (a 16-byte chunk of q8_0 weights and of x) */
static __device__ __forceinline__ int mv_dot16(uint4 w, const uint32_t xq[4]) {
    int dot = __dp4a((int)w.x, (int)xq[0], 0);
    dot = __dp4a((int)w.y, (int)xq[1], dot);
    dot = __dp4a((int)w.z, (int)xq[2], dot);
    return __dp4a((int)w.w, (int)xq[3], dot);
}

#ifdef LLMOPT_CUDA_TRACE
/* Diagnostic builds only (-DLLMOPT_CUDA_TRACE): thread 0 of every block records its
 * launch (%gridid), the source line of its cu_pdl_trigger call, and %globaltimer at
 * the start, after cu_pdl_wait and at CU_TRACE_END (kernels that have one). Each .cu
 * file has its own copy of these pointers, set by its CU_TRACE_TU function. */
struct cu_trace_rec {
    unsigned long long grid, t0, tw, te;
    unsigned line, block, smid, n_blocks;
};
#define CU_TRACE_MAX (1u << 20)
static __device__ struct cu_trace_rec *cu_trace_buf;
static __device__ unsigned *cu_trace_cnt;
#define CU_TRACE_TU(name)                                                                  \
    extern "C" void name(void *buf, void *cnt) {                                           \
        cudaMemcpyToSymbol(cu_trace_buf, &buf, sizeof buf);                                \
        cudaMemcpyToSymbol(cu_trace_cnt, &cnt, sizeof cnt);                                \
    }
static __device__ __forceinline__ unsigned long long cu_trace_now(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
static __device__ __forceinline__ unsigned &cu_trace_slot(void) {
    __shared__ unsigned slot;
    return slot;
}
static __device__ __forceinline__ bool cu_trace_thread0(void) {
    return (threadIdx.x | threadIdx.y | threadIdx.z) == 0 && cu_trace_buf;
}
static __device__ __forceinline__ void cu_trace_start(unsigned line) {
    if (!cu_trace_thread0()) return;
    const unsigned i = atomicAdd(cu_trace_cnt, 1u);
    cu_trace_slot() = i;
    if (i >= CU_TRACE_MAX) return;
    struct cu_trace_rec r;
    asm volatile("mov.u64 %0, %%gridid;" : "=l"(r.grid));
    asm volatile("mov.u32 %0, %%smid;" : "=r"(r.smid));
    r.t0 = cu_trace_now();
    r.tw = 0;
    r.te = 0;
    r.line = line;
    r.block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    r.n_blocks = gridDim.x * gridDim.y * gridDim.z;
    cu_trace_buf[i] = r;
}
static __device__ __forceinline__ void cu_trace_mark(int which) {
    if (!cu_trace_thread0()) return;
    const unsigned i = cu_trace_slot();
    if (i >= CU_TRACE_MAX) return;
    if (which) cu_trace_buf[i].te = cu_trace_now();
    else cu_trace_buf[i].tw = cu_trace_now();
}
struct cu_trace_end_guard {
    __device__ ~cu_trace_end_guard() { cu_trace_mark(1); }
};
#define CU_TRACE_END cu_trace_end_guard cu_trace_end_guard_
#else
#define CU_TRACE_TU(name)
#define CU_TRACE_END
#endif

/* Programmatic dependent launch (Hopper): a kernel launched with cu_launch_pdl may start
 * while the kernel before it on the stream is still running; it must call
 * cu_pdl_wait() before touching anything that kernel writes or reads (the wait returns
 * once it has completed and its writes are visible). cu_pdl_trigger() at the start of
 * a kernel lets such a dependent start as soon as all of this kernel's blocks are
 * resident. Both are no-ops for ordinary launches. */
static __device__ __forceinline__ void cu_pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#ifdef LLMOPT_CUDA_TRACE
    cu_trace_mark(0);
#endif
}
static __device__ __forceinline__ void cu_pdl_trigger(unsigned line = __builtin_LINE()) {
#ifdef LLMOPT_CUDA_TRACE
    cu_trace_start(line);
#else
    (void)line;
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Launches kernel<<<grid, block, smem, st>>>(args) as a programmatic dependent of the
 * kernel before it on the stream (unless $LLMOPT_CUDA_PDL=0): the kernel must call
 * cu_pdl_wait() before it reads anything an earlier kernel writes, or writes anything
 * an earlier kernel reads. */
template <typename... P, typename... A>
static inline cudaError_t cu_launch_pdl(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                                        A &&...args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = cu_pdl_enabled() ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, static_cast<A &&>(args)...);
}

/* Blocks of `threads` threads one multiprocessor holds of `kern` with `smem` bytes of
 * dynamic shared memory, remembered in the caller's statics (*cached_smem, *cached:
 * one pair per kernel instantiation; asked again when smem changes). max_smem > 0 opts
 * the kernel into that much dynamic shared memory first (above 48 KiB is opt-in). On
 * an error *cached is 1 for this call and the error is returned. */
template <typename KERN>
static inline cudaError_t cu_blocks_per_sm(KERN kern, int threads, size_t smem, size_t max_smem, size_t *cached_smem,
                                           int *cached) {
    if (*cached_smem == smem) return cudaSuccess;
    cudaError_t e = max_smem ? cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)max_smem)
                             : cudaSuccess;
    int n = 0;
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, threads, smem);
    *cached = e == cudaSuccess && n > 0 ? n : 1;
    if (e == cudaSuccess) *cached_smem = smem; /* (an error is asked again next time) */
    return e;
}

/* Multiprocessors of the current device (read once; 1 if the query fails). Shared by
 * the persistent matvec launches of kernels_linear.cu and kernels_kquant.cu. */
static inline int cu_sm_count(void) {
    static int n = 0;
    if (n <= 0) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0)
            n = 1;
    }
    return n;
}

static inline unsigned cu_blocks(int64_t n, int threads) {
    return (unsigned)((n + threads - 1) / threads);
}

/* Split-K factor of a matvec launch: powers of two up to `warps` (a block's) until
 * about `target` warps have work (4096 = 132 SMs x 32 warps on an H200), keeping >= 2
 * rounds of 32 chunks a lane (n_chunks: the 16-byte chunks or K-quant units of a row). */
static inline int cu_matvec_ksplit(int64_t groups, int64_t n_chunks, int warps, int64_t target) {
    int ksplit = 1;
    while (ksplit < warps && groups * ksplit < target && n_chunks / (CU_WARP * ksplit * 2) >= 2) ksplit *= 2;
    return ksplit;
}

#endif
