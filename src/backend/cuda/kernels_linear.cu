/* Linear (y = act(x W^T + bias) * gate + residual) and embedding kernels.
 *
 * Decode is a stream over the weights: cu_matvec reads each weight row once with
 * 16-byte loads (4 f32, 8 f16/bf16, 16 q8_0 or 32 q4_0 elements a load), dequantizes in
 * registers and applies it to up to 8 activation rows. Large matrices give each warp
 * 2 or 4 output rows (x loaded once for all of them); when the matrix has few rows,
 * several warps split one row's K range (split-K inside a block) so that enough loads
 * are in flight to cover the memory latency.
 *
 * cu_linear_tiled is the generic path for any shape and dtype (and the prefill path
 * for block-quantized weights): a 64x64 output tile per block, W dequantized a 32-wide
 * K slice at a time into shared memory, f32 accumulation in K order. */
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/kquant_dot.cuh"

#include <stdlib.h>
#include <string.h>

CU_TRACE_TU(cu_trace_tu_linear)

/* ---- upload layout -------------------------------------------------------------- */

size_t cu_weight_data_bytes(int dtype, int64_t rows, int64_t cols) {
    switch (dtype) {
    case CU_F32: return (size_t)(rows * cols) * 4;
    case CU_F16:
    case CU_BF16: return (size_t)(rows * cols) * 2;
    case CU_Q8_0: return (size_t)(rows * cols);
    case CU_Q4_0: return (size_t)(rows * cols / 2);
    case CU_Q4_K: return (size_t)(rows * (cols / 256)) * 144;
    case CU_Q5_K: return (size_t)(rows * (cols / 256)) * 176;
    case CU_Q6_K: return (size_t)(rows * (cols / 256)) * 208;
    default: return 0;
    }
}

size_t cu_weight_scale_bytes(int dtype, int64_t rows, int64_t cols) {
    if (dtype == CU_Q6_K) return (size_t)(rows * (cols / 256)) * 2;
    return dtype == CU_Q8_0 || dtype == CU_Q4_0 ? (size_t)(rows * (cols / 32)) * 2 : 0;
}

void cu_weight_repack_rows(int dtype, const void *src, int64_t rows, int64_t cols, void *qs,
                           uint16_t *sc) {
    if (dtype == CU_Q6_K) {
        cu_kq_repack_q6_k(src, rows * (cols / 256), qs, sc);
        return;
    }
    const uint8_t *s = (const uint8_t *)src;
    uint8_t *q = (uint8_t *)qs;
    int64_t nb = cols / 32;
    int q_bytes = dtype == CU_Q8_0 ? 32 : 16; /* quant bytes per 32-element block */
    size_t blk = 2 + (size_t)q_bytes;         /* GGUF block: f16 scale, then quants */
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *bp = s + (size_t)(r * nb + b) * blk;
            memcpy(&sc[r * nb + b], bp, 2);
            memcpy(q + (size_t)(r * nb + b) * (size_t)q_bytes, bp + 2, (size_t)q_bytes);
        }
}

/* ---- matrix-vector -------------------------------------------------------------- */

static int pdl_state = -1; /* -1: $LLMOPT_CUDA_PDL not read yet */
bool cu_pdl_enabled(void) {
    if (pdl_state < 0) {
        const char *e = getenv("LLMOPT_CUDA_PDL");
        pdl_state = !(e && !strcmp(e, "0"));
    }
    return pdl_state == 1;
}

#define MV_THREADS 256
#define MV_WARPS (MV_THREADS / CU_WARP)
#define MV_LIF 4 /* default 16-byte weight loads in flight per lane */

template <int DT> struct mv_traits;
template <> struct mv_traits<CU_F32> { static constexpr int E = 4; };
template <> struct mv_traits<CU_F16> { static constexpr int E = 8; };
template <> struct mv_traits<CU_BF16> { static constexpr int E = 8; };
template <> struct mv_traits<CU_Q8_0> { static constexpr int E = 16; };
template <> struct mv_traits<CU_Q4_0> { static constexpr int E = 32; };

/* Decodes one 16-byte load into E values; returns the block scale the values must be
 * multiplied by: the f16 bits sc loaded beside it (q8_0/q4_0), 1 for unscaled types. */
template <int DT>
static __device__ __forceinline__ float mv_decode(uint4 raw, uint16_t sc, float *f) {
    uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
    if constexpr (DT == CU_F32) {
#pragma unroll
        for (int i = 0; i < 4; i++) f[i] = __uint_as_float(u[i]);
        return 1.0f;
    } else if constexpr (DT == CU_F16) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            f[2 * i] = cu_f16((uint16_t)(u[i] & 0xffffu));
            f[2 * i + 1] = cu_f16((uint16_t)(u[i] >> 16));
        }
        return 1.0f;
    } else if constexpr (DT == CU_BF16) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            f[2 * i] = __uint_as_float(u[i] << 16);
            f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
        }
        return 1.0f;
    } else if constexpr (DT == CU_Q8_0) {
        /* int8 -> f32 without I2F: (q ^ 0x80) is q + 128 as a byte; placed (one byte
         * permute) in the low mantissa bits of 2^23 it reads as 2^23 + q + 128, exactly */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t biased = u[i] ^ 0x80808080u;
#pragma unroll
            for (int b = 0; b < 4; b++)
                f[4 * i + b] = __uint_as_float(__byte_perm(biased, 0x4b000000u, 0x7540u | (unsigned)b)) - 8388736.0f;
        }
        return cu_f16(sc);
    } else {
        /* nibble -> f32 the same way: 2^23 + n, minus 2^23 + 8 */
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int b = 0; b < 4; b++) {
                f[4 * i + b] = __uint_as_float(0x4b000000u | ((u[i] >> (8 * b)) & 15u)) - 8388616.0f;
                f[16 + 4 * i + b] = __uint_as_float(0x4b000000u | ((u[i] >> (8 * b + 4)) & 15u)) - 8388616.0f;
            }
        return cu_f16(sc);
    }
}

/* How a one-row matvec reads x (XM): f32; or, q8_0 only, MV_X_Q8: the block first
 * quantizes the row into shared memory as q8_0 blocks of 32, int8 with the f32 scale d
 * = amax / 127 of each block, q = nearbyint(x / d) (the CPU's activation quantization,
 * backend/cpu isa_scalar.c; the same int8 for finite x), and the products are dp4a. */
enum { MV_X_F32 = 0, MV_X_Q8 = 1, MV_X_Q8R = 2 /* MV_X_Q8 after mv_norm_quantize_x_q8 */ };

/* MV_X_Q8R: MV_X_Q8 with the rms_norm prologue where K <= 4096: the same int8 x and
 * scales as mv_sumsq + mv_quantize_x_q8 (the same f32 operations in the same order: a
 * thread's elements f = threadIdx.x + i * MV_THREADS, its float4 squares summed in i
 * order, then cu_block_sum), but the norm weight is loaded into registers before the
 * PDL wait (nw_pre) and x once, all loads in flight, and quantized from registers:
 * after the wait one round trip to x instead of x, then x again with the norm weight. */
#define MV_XR_MAX 4 /* float4 of x a thread: K <= 4 * 4 * MV_THREADS */
/* A thread's float4 of v[0..K) (elements f = threadIdx.x + i * MV_THREADS; zeros past
 * K / 4) into registers, all loads in flight: the norm weight and x of MV_X_Q8R. */
static __device__ __forceinline__ void mv_load_regs(const float *__restrict__ v, int64_t K, float4 (&r)[MV_XR_MAX]) {
#pragma unroll
    for (int i = 0; i < MV_XR_MAX; i++) {
        const int64_t f = threadIdx.x + (int64_t)i * MV_THREADS;
        r[i] = f < K / 4 ? __ldg((const float4 *)v + f) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}
static __device__ __forceinline__ void mv_norm_quantize_x_q8(const float *__restrict__ x, const float4 (&w)[MV_XR_MAX],
                                                             float eps, int64_t K, float *red, uint32_t *q, float *d) {
    float4 v[MV_XR_MAX];
    float ss = 0.0f;
    mv_load_regs(x, K, v);
#pragma unroll
    for (int i = 0; i < MV_XR_MAX; i++)
        if (threadIdx.x + (int64_t)i * MV_THREADS < K / 4)
            ss += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
    const float sc = 1.0f / sqrtf(cu_block_sum(ss, red) / (float)K + eps);
#pragma unroll
    for (int i = 0; i < MV_XR_MAX; i++) {
        if ((int64_t)i * MV_THREADS >= K / 4) break; /* uniform: whole warps shuffle */
        const int64_t f = threadIdx.x + (int64_t)i * MV_THREADS;
        const bool in = f < K / 4;
        const float4 a = in ? make_float4(v[i].x * sc * w[i].x, v[i].y * sc * w[i].y, v[i].z * sc * w[i].z,
                                          v[i].w * sc * w[i].w)
                            : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        mv_put_x_q8(a, in, f, q, d);
    }
}

/* What one matvec launch computes: up to CU_MV_MAX_SEGS products sharing x (their
 * output rows are laid end to end: group g of NR rows belongs to the segment whose
 * [g_begin, g_end) holds it), or, with `up` set, one SwiGLU pair (segment 0's weight
 * and `up` read side by side, y = act(x W0^T + b) * (x Wup^T) + residual). */
struct mv_job {
    struct cu_mv_seg seg[CU_MV_MAX_SEGS];
    int64_t g_end[CU_MV_MAX_SEGS];
    int n_seg;
    struct cu_weight up; /* data NULL: no pair */
};

/* Segment i of a job, read from the parameters where it is used (constant indices
 * only: a dynamically indexed parameter would be copied to local memory; and only the
 * index lives across a loop, not the segment's fields, which would take registers from
 * the loads in flight). */
static __device__ __forceinline__ struct cu_mv_seg mv_job_seg(const struct mv_job &job, int i) {
    static_assert(CU_MV_MAX_SEGS == 3, "the segment choice below names each segment");
    struct cu_mv_seg sg;
    if (i == 2)
        sg = job.seg[2];
    else if (i == 1)
        sg = job.seg[1];
    else
        sg = job.seg[0];
    return sg;
}

/* The segment holding group (or tile) idx of a job whose g_end counts them: its index,
 * and the first group of it in *base. */
static __device__ __forceinline__ int mv_job_find(const struct mv_job &job, int64_t idx, int64_t *base) {
    if (job.n_seg > 2 && idx >= job.g_end[1]) {
        *base = job.g_end[1];
        return 2;
    }
    if (job.n_seg > 1 && idx >= job.g_end[0]) {
        *base = job.g_end[0];
        return 1;
    }
    *base = 0;
    return 0;
}

/* sum of squares of x[0..K) (K % 4 == 0, 16-byte aligned) by the whole block, every
 * thread gets it: float4 loads, up to 4 in flight a thread (K = 4096: one round trip) */
static __device__ __forceinline__ float mv_sumsq(const float *__restrict__ x, int64_t K, float *red) {
    const float4 *x4 = (const float4 *)x;
    float ss = 0.0f;
#pragma unroll 4
    for (int64_t f = threadIdx.x; f < K / 4; f += MV_THREADS) {
        const float4 v = __ldg(x4 + f);
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    return cu_block_sum(ss, red);
}

/* Several x rows (rows <= RMAX) to int8 + scales in shared memory, row r at
 * r * stride bytes from xs (MV_X_Q8 with several rows), by the whole block;
 * with NORM each row times its 1 / rms (every row's sum of squares in one pass and one
 * block reduction) and the norm weight first. SUMS: after a row's K int8 a 16-byte
 * record a block of 32 (mv_put_x_q8_sums: the K-quant products), else a scale. Ends
 * with a barrier. */
template <int RMAX, bool NORM, bool SUMS = false>
static __device__ __forceinline__ void mv_stage_x_rows_q8(const float *__restrict__ x, int rows, int64_t K,
                                                          const float *__restrict__ norm_w, float eps, uint8_t *xs,
                                                          size_t stride) {
    __shared__ float inv_rms[RMAX];
    if constexpr (NORM) {
        __shared__ float red_rows[MV_WARPS][RMAX];
        float ss[RMAX];
#pragma unroll
        for (int r = 0; r < RMAX; r++) ss[r] = 0.0f;
        for (int64_t f = threadIdx.x; f < K / 4; f += MV_THREADS)
#pragma unroll
            for (int r = 0; r < RMAX; r++)
                if (r < rows) {
                    const float4 v = __ldg((const float4 *)(x + (size_t)r * K) + f);
                    ss[r] += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
                }
#pragma unroll
        for (int r = 0; r < RMAX; r++) {
            const float v = cu_warp_sum(ss[r]);
            if (threadIdx.x % CU_WARP == 0) red_rows[threadIdx.x / CU_WARP][r] = v;
        }
        __syncthreads();
        if (threadIdx.x < RMAX) {
            float t = 0.0f;
            for (int w = 0; w < MV_WARPS; w++) t += red_rows[w][threadIdx.x];
            inv_rms[threadIdx.x] = 1.0f / sqrtf(t / (float)K + eps);
        }
        __syncthreads();
    }
    /* every row's groups in one sequence, 8 loads a thread in flight where 4 would take
     * more than one round trip to x (8 rows of 4096: 4 round trips instead of 32), else
     * 4. (8 everywhere took the 0.6B q8_0 at 2 rows, K = 1024, to 566-569 us a token, 4
     * everywhere to 540-542, both one round trip there; this rule measured 562-566, old
     * 551-552; the cause was not found: bench/results/cuda-batch-stage-2026-12-01.md) */
    const int n_rows = rows < RMAX ? rows : RMAX;
    const float *nw = NORM ? norm_w : NULL;
    auto sc = [&](uint32_t r) { return inv_rms[r]; };
    auto put = [&](float4 a, uint32_t r, uint32_t f, bool in) {
        uint8_t *qr = xs + (size_t)r * stride;
        if constexpr (SUMS)
            mv_put_x_q8_sums(a, in, f, (uint32_t *)qr, (float4 *)(qr + K));
        else
            mv_put_x_q8(a, in, f, (uint32_t *)qr, (float *)(qr + K));
    };
    if ((int64_t)n_rows * K / 4 > 4 * MV_THREADS)
        cu_stage_x_rows<8>(x, n_rows, K, nw, sc, MV_THREADS, put);
    else
        cu_stage_x_rows<4>(x, n_rows, K, nw, sc, MV_THREADS, put);
    __syncthreads();
}

/* Block: MV_WARPS warps; `ksplit` consecutive warps share NR consecutive output rows
 * j0..j0+NR-1, each warp taking every ksplit-th group of 32 chunks. With one x row
 * (decode) a lane loads its x chunk once and applies it to the NW = NR (PAIR: 2 NR)
 * weight rows: x traffic through L1 per weight byte drops NW times (a q8_0 chunk of 16
 * bytes needs 64 bytes of x). With several x rows (RMAX > 1, NR = 1) each weight chunk
 * serves every row. The launch has n_bg block groups of rows (MV_WARPS / ksplit row
 * groups each); block b takes groups b, b + gridDim.x, ... (a persistent launch, grid
 * smaller than n_bg: the prologue, rms_norm or x to int8, runs once per block instead
 * of once per group). */
template <int DT, int RMAX, int NR, bool NORM, bool PAIR, int LIF, int XM = MV_X_F32>
__global__ void __launch_bounds__(MV_THREADS)
    matvec_kernel(struct mv_job job, const float *__restrict__ x, int rows, int ksplit, int64_t n_bg) {
    constexpr int E = mv_traits<DT>::E;
    static_assert(XM == MV_X_F32 || (DT == CU_Q8_0 && (RMAX == 1 || XM == MV_X_Q8)),
                  "int8 x: q8_0 weights; several x rows by MV_X_Q8");
    static_assert(XM != MV_X_Q8R || NORM, "the register prologue is an rms_norm prologue");
    constexpr int NW = PAIR ? 2 * NR : NR;         /* weight rows a warp streams */
    constexpr int U = LIF / NW > 1 ? LIF / NW : 1; /* U * NW loads in flight per lane */
    static_assert(RMAX == 1 || NR == 1, "several x rows take one output row per warp");
    __shared__ float part[MV_WARPS][NW * RMAX];
    cu_pdl_trigger();
    CU_TRACE_END;
    const int lane = threadIdx.x % CU_WARP, warp = threadIdx.x / CU_WARP;
    const int rows_per_block = MV_WARPS / ksplit;
    const int ks = warp % ksplit;
    const int64_t K = job.seg[0].w.cols, n_chunks = K / E; /* one K for every segment */
    constexpr int64_t bytes_num = DT == CU_F32 ? 4 : DT == CU_Q4_0 ? 1 : DT == CU_Q8_0 ? 2 : 4;
    constexpr int64_t bytes_den = DT == CU_F32 ? 1 : DT == CU_Q4_0 ? 2 : DT == CU_Q8_0 ? 2 : 2;
    constexpr bool SCALED = DT == CU_Q8_0 || DT == CU_Q4_0;
    constexpr int CPB = DT == CU_Q8_0 ? 2 : 1; /* 16-byte chunks a 32-element block */
    int si;
    int64_t j0, n_out;
    const uint4 *wrow[NW];
    const uint16_t *srow[NW]; /* block scales of each streamed row (q8_0/q4_0) */
    auto setup = [&](int64_t bg) { /* this warp's segment, rows and row pointers in group bg */
        const int64_t gidx = bg * rows_per_block + warp / ksplit;
        int64_t g_base;
        si = mv_job_find(job, gidx, &g_base);
        const struct cu_weight w = mv_job_seg(job, si).w;
        j0 = (gidx - g_base) * NR;
        n_out = w.rows;
#pragma unroll
        for (int nr = 0; nr < NW; nr++) {
            const struct cu_weight &ws = PAIR && nr >= NR ? job.up : w;
            /* rows past the end repeat the last one; their sums are dropped */
            const int64_t jr = j0 + nr % NR < n_out ? j0 + nr % NR : n_out - 1;
            wrow[nr] = (const uint4 *)((const uint8_t *)ws.data + (size_t)(jr * K * bytes_num / bytes_den));
            srow[nr] = SCALED ? ws.scales + jr * (K / 32) : NULL;
        }
    };
    const int64_t step = (int64_t)CU_WARP * ksplit;
    uint4 raw[U][NW];
    uint16_t scl[U][NW]; /* each load's block scale, fetched with it */
    auto load = [&](int64_t c0) { /* U chunks of NW rows: U * NW loads in flight */
#pragma unroll
        for (int u = 0; u < U; u++) {
            int64_t c = c0 + u * step;
            if (c < n_chunks)
#pragma unroll
                for (int nr = 0; nr < NW; nr++) {
                    raw[u][nr] = __ldg(wrow[nr] + c);
                    scl[u][nr] = SCALED ? __ldg(srow[nr] + c / CPB) : 0;
                }
        }
    };
    /* the weights do not depend on the previous kernel: the first loads go out before
     * the dependency wait (programmatic dependent launch) */
    const int64_t first = (int64_t)ks * CU_WARP + lane;
    int64_t bg = blockIdx.x;
    setup(bg);
    if (j0 < n_out) load(first);
    float4 nw_pre[XM == MV_X_Q8R ? MV_XR_MAX : 1];
    if constexpr (XM == MV_X_Q8R) mv_load_regs(job.seg[0].ep.norm_w, K, nw_pre); /* a parameter: before the wait */
    cu_pdl_wait();
    /* the rms_norm prologue (segment 0 carries it for the launch): every x row's scale,
     * by the whole block; with one row the normalized row goes to shared memory (xs,
     * K floats) and the loop below reads it from there */
    __shared__ float inv_rms[RMAX], red[32];
    extern __shared__ float4 xs_dyn[];
    const float *xs = (const float *)xs_dyn;
    const float *norm_w = job.seg[0].ep.norm_w;
    if constexpr (XM == MV_X_Q8R) {
        mv_norm_quantize_x_q8(x, nw_pre, job.seg[0].ep.norm_eps, K, red, (uint32_t *)xs_dyn,
                              (float *)((uint8_t *)xs_dyn + K));
        __syncthreads();
    } else if constexpr (XM == MV_X_Q8 && RMAX == 1) {
        float sc = 1.0f;
        if constexpr (NORM) sc = 1.0f / sqrtf(mv_sumsq(x, K, red) / (float)K + job.seg[0].ep.norm_eps);
        mv_quantize_x_q8(x, NORM ? norm_w : NULL, sc, K, MV_THREADS, (uint32_t *)xs_dyn, (float *)((uint8_t *)xs_dyn + K));
        __syncthreads();
    } else if constexpr (XM == MV_X_Q8) {
        mv_stage_x_rows_q8<RMAX, NORM>(x, rows, K, norm_w, job.seg[0].ep.norm_eps, (uint8_t *)xs_dyn,
                                       mv_xq_row_stride(K));
    } else if constexpr (NORM) {
        for (int r = 0; r < rows && r < RMAX; r++) {
            const float ss = mv_sumsq(x + (size_t)r * K, K, red);
            if (threadIdx.x == 0) inv_rms[r] = 1.0f / sqrtf(ss / (float)K + job.seg[0].ep.norm_eps);
        }
        __syncthreads();
        if constexpr (RMAX == 1) {
            const float sc = inv_rms[0];
            for (int64_t f = threadIdx.x; f < K / 4; f += MV_THREADS) {
                const float4 v = __ldg((const float4 *)x + f), nw = __ldg((const float4 *)norm_w + f);
                xs_dyn[f] = make_float4(v.x * sc * nw.x, v.y * sc * nw.y, v.z * sc * nw.z, v.w * sc * nw.w);
            }
            __syncthreads();
        }
    }
    for (;;) {
        float acc[NW][RMAX];
#pragma unroll
        for (int nr = 0; nr < NW; nr++)
#pragma unroll
            for (int r = 0; r < RMAX; r++) acc[nr][r] = 0.0f;
        if (j0 < n_out) {
            for (int64_t c0 = first; c0 < n_chunks; c0 += step * U) {
                if (c0 != first) load(c0);
#pragma unroll
                for (int u = 0; u < U; u++) {
                    int64_t c = c0 + u * step;
                    if (c >= n_chunks) break;
                    if constexpr (XM != MV_X_F32) { /* 16 int8 of each x row and its block's scale */
#pragma unroll
                        for (int r = 0; r < RMAX; r++) {
                            if (r >= rows) break;
                            const uint8_t *qr = (const uint8_t *)xs_dyn + (size_t)r * mv_xq_row_stride(K);
                            const uint4 xv = ((const uint4 *)qr)[c];
                            const uint32_t xq[4] = {xv.x, xv.y, xv.z, xv.w};
                            const float xd = ((const float *)(qr + K))[c / 2];
#pragma unroll
                            for (int nr = 0; nr < NW; nr++)
                                acc[nr][r] += (float)mv_dot16(raw[u][nr], xq) * (cu_f16(scl[u][nr]) * xd);
                        }
                    } else if constexpr (RMAX == 1) {
                        float xr[E];
#pragma unroll
                        for (int i = 0; i < E / 4; i++) {
                            float4 xx = NORM ? ((const float4 *)(xs + (size_t)c * E))[i]
                                             : __ldg((const float4 *)(x + (size_t)c * E) + i);
                            xr[4 * i] = xx.x;
                            xr[4 * i + 1] = xx.y;
                            xr[4 * i + 2] = xx.z;
                            xr[4 * i + 3] = xx.w;
                        }
#pragma unroll
                        for (int nr = 0; nr < NW; nr++) {
                            float f[E];
                            float scale = mv_decode<DT>(raw[u][nr], scl[u][nr], f);
                            float s = 0.0f;
#pragma unroll
                            for (int i = 0; i < E; i++) s += f[i] * xr[i];
                            acc[nr][0] += s * scale;
                        }
                    } else {
#pragma unroll
                        for (int nr = 0; nr < NW; nr++) {
                            float f[E];
                            float scale = mv_decode<DT>(raw[u][nr], scl[u][nr], f);
#pragma unroll
                            for (int r = 0; r < RMAX; r++) {
                                if (r >= rows) break;
                                const float4 *xv = (const float4 *)(x + (size_t)r * K + (size_t)c * E);
                                float s = 0.0f;
#pragma unroll
                                for (int i = 0; i < E / 4; i++) {
                                    float4 xx = __ldg(xv + i);
                                    if constexpr (NORM) {
                                        const float sc = inv_rms[r];
                                        const float4 nw = __ldg((const float4 *)(norm_w + (size_t)c * E) + i);
                                        xx.x = xx.x * sc * nw.x;
                                        xx.y = xx.y * sc * nw.y;
                                        xx.z = xx.z * sc * nw.z;
                                        xx.w = xx.w * sc * nw.w;
                                    }
                                    s += f[4 * i] * xx.x + f[4 * i + 1] * xx.y + f[4 * i + 2] * xx.z +
                                         f[4 * i + 3] * xx.w;
                                }
                                acc[nr][r] += s * scale;
                            }
                        }
                    }
                }
            }
        }
        const struct cu_mv_seg seg = mv_job_seg(job, si);
        cu_matvec_finish<NR, RMAX, PAIR>(acc, part, ksplit, j0, n_out, rows, seg.y, seg.ep, seg.head_dim);
        bg += gridDim.x;
        if (bg >= n_bg) break;
        if (ksplit > 1) __syncthreads(); /* part is written again */
        setup(bg);
        if (j0 < n_out) load(first);
    }
}

/* Products of 2..CU_MATVEC_MAX_ROWS x rows on int8 tensor cores, q8_0, q4_K and q6_K
 * weights, in the decode fusion's job (segments sharing x, a SwiGLU pair, the rms_norm
 * prologue, the epilogue). The dp4a loops with several x rows read 20 bytes of shared
 * memory per x row for every 16 q8_0 weight bytes, more than shared memory delivers at
 * the weights' streaming rate, and the K-quant one decodes each weight once per x row
 * (an 8-sequence 8B q4_k_m step cost 5 one-sequence steps); here one mma takes 16
 * weight rows and all 8 x rows of a block of 32 (q6_K: 16, one scale each).
 *
 * Each block stages every x row as int8 (mv_stage_x_rows_q8: the matvec's int8 x rule;
 * K-quants also the sums their offsets need) once, then takes tiles of 16 output rows
 * in turn (a persistent launch). Its 8 warps split a tile's K in chunks of 128 weights
 * a row (q8_0: 4 blocks of 32; K-quants: half a super-block; warp w the chunks w,
 * w + 8, ...). Each warp streams its chunks through a ring of S stages in shared memory
 * by cp.async: a stage is one chunk of the 16 rows (16-byte copies: each q8_0 copy
 * instruction reads 4 whole 128-byte lines), the ring running ahead across tiles, its
 * first S - 1 stages issued before the PDL wait (8-byte loads straight into fragments
 * touched 8 lines a load instruction and held L1 at ~75% busy with DRAM at 20-38%: ncu,
 * 8B q8_0 at 2 rows). Fragments as q8_mma_kernel's (A: weight rows g and g + 8, bytes
 * 8t..8t+7 of a block; B: x row g, the same bytes; C: output rows g, g + 8 by x rows 2t,
 * 2t + 1; q6_K's k16: bytes 4t..4t+3), read from rows padded so that no two lanes of a
 * half warp share a bank, and x rows at a stride of 32 mod 128 bytes. The warps' sums
 * are added in shared memory in warp order and written through cu_matvec_put. Needs K %
 * 128 == 0 (K-quants: q6_K K % 1024 == 0, for the 8-byte word of d values a row copies). */
#define MV_MMA_TILE 16
#define MV_MMA_ROWB        160    /* a q8_0 stage's row: 128 bytes of quants and 32 of padding */
#define MV_MMA_STAGES 4      /* ring stages a warp, plain products */
#define MV_MMA_STAGES_PAIR 3 /* ... and SwiGLU pairs (each stage two weights) */
#define MV_MMA_WB (MV_MMA_TILE * MV_MMA_ROWB)     /* quant bytes of a stage, one weight */
#define MV_MMA_PB (MV_MMA_WB + MV_MMA_TILE * 8)   /* ... and its 4 scales a row */
/* K-quant stage rows, half a super-block each: q4_K its 64 bytes of qs, then the 16-byte
 * header (96: uint2 loads of rows g = 0..3 land on distinct banks); q6_K 64 bytes of ql,
 * 32 of qh, its 8 scales, the 8-byte word of d values holding the super-block's (112:
 * 32-bit loads of rows g = 0..7 on distinct banks) */
#define MV_MMA_ROWB_Q4K 96
#define MV_MMA_ROWB_Q6K 112

/* A stage's bytes, one weight, for format dt: CU_Q8_0, CU_Q4_K, CU_Q6_K, or 0 for
 * segments of q4_K and q6_K mixed (q/k/v; q6_K's rows, the longer) */
static __host__ __device__ constexpr int mv_mma_pb(int dt) {
    return dt == CU_Q8_0 ? MV_MMA_PB : MV_MMA_TILE * (dt == CU_Q4_K ? MV_MMA_ROWB_Q4K : MV_MMA_ROWB_Q6K);
}

/* DT: a format as mv_mma_pb's */
template <int DT, bool PAIR, int STAGES> struct mv_mma_cfg {
    static constexpr int NP = PAIR ? 2 : 1;  /* weights a tile streams */
    static constexpr int S = STAGES;         /* stages a warp's ring */
    static constexpr bool KQ = DT != CU_Q8_0;
    static constexpr int PB = mv_mma_pb(DT);
    static constexpr int STAGE = NP * PB; /* a stage's bytes */
};
/* the staged x rows' stride: int8 row and scales (K-quants: 16-byte records, as
 * mv_put_x_q8_sums writes them), 16-byte aligned, 32 mod 128 bytes */
static __host__ __device__ inline size_t mv_mma_x_stride(int64_t K, bool kq) {
    const size_t row = kq ? (size_t)K + (size_t)K / 32 * 16 : mv_xq_row_stride(K);
    return ((row + 127) & ~(size_t)127) + 32;
}

/* A lane's share of the copies that fill a K-quant stage (16 rows, half a super-block):
 * pieces i = lane, lane + 32, lane + 64 of the 16 x 5 (q4_K: the header, 4 of qs) or
 * 16 x 6 (q6_K: 4 of ql, 2 of qh) 16-byte pieces, and q6_K one 8-byte copy a lane (row
 * lane / 2: its 8 scales, or the word of d values). Set once a tile (rows past n_rows
 * repeat the last one): each source at super-block 0, half 0, and the bytes a half adds. */
struct mv_kq_copies {
    const uint8_t *src[4];
    uint32_t dst[4], hm[4];
};
static __device__ __forceinline__ void mv_kq_copies_set(mv_kq_copies &cp, const struct cu_weight &w, int64_t n_rows,
                                                        int64_t j0, int64_t K, int lane) {
    const int64_t nsb = K / 256;
    const bool q4 = w.dtype == CU_Q4_K;
    const int np = q4 ? 5 : 6, rowb = q4 ? MV_MMA_ROWB_Q4K : MV_MMA_ROWB_Q6K;
#pragma unroll
    for (int k = 0; k < 3; k++) {
        const int i = lane + 32 * k, r = (i < MV_MMA_TILE * np ? i : 0) / np, p = i - np * r;
        const int64_t j = j0 + r < n_rows ? j0 + r : n_rows - 1;
        const uint8_t *row = (const uint8_t *)w.data + j * nsb * (q4 ? 144 : 208);
        if (q4) { /* header at 64 (no half offset); qs piece p - 1 at 16 + 64h + 16(p - 1) */
            cp.src[k] = row + (p ? 16 * p : 0);
            cp.hm[k] = p ? 64 : 0;
            cp.dst[k] = r * rowb + (p ? 16 * (p - 1) : 64);
        } else { /* ql at 64h + 16p, qh at 128 + 32h + 16(p - 4) */
            cp.src[k] = row + (p < 4 ? 16 * p : 128 + 16 * (p - 4));
            cp.hm[k] = p < 4 ? 64 : 32;
            cp.dst[k] = r * rowb + 16 * p;
        }
    }
    if (q4) return;
    const int r = lane >> 1;
    const int64_t j = j0 + r < n_rows ? j0 + r : n_rows - 1;
    cp.src[3] = lane & 1 ? (const uint8_t *)(w.scales + j * nsb) : (const uint8_t *)w.data + j * nsb * 208 + 192;
    cp.hm[3] = lane & 1 ? 0 : 8;
    cp.dst[3] = r * rowb + (lane & 1 ? 104 : 96);
}

/* Copies chunk ic (half ic % 2 of super-block ic / 2) of the tile cp was set for into
 * the stage at sp (q4_K: 80 pieces, so lanes 16..31 have two). */
static __device__ __forceinline__ void mv_kq_copies_issue(const mv_kq_copies &cp, bool q4, int64_t ic, int lane,
                                                          uint8_t *sp) {
    const int64_t sb = ic >> 1;
    const uint32_t h = (uint32_t)ic & 1;
    const int64_t sbb = q4 ? 144 : 208;
#pragma unroll
    for (int k = 0; k < 3; k++)
        if (k < 2 || !q4 || lane < 16) cu_cp_async16(sp + cp.dst[k], cp.src[k] + sb * sbb + h * cp.hm[k]);
    if (!q4) /* the d word: the aligned 4 values holding the super-block's (K % 1024 == 0) */
        cu_cp_async8(sp + cp.dst[3], cp.src[3] + (lane & 1 ? (sb & ~(int64_t)3) * 2 : sb * 208 + h * 8));
}

/* D = A (16 x 32, u8) B (32 x 8, s8), and D = A (16 x 16, s8) B (16 x 8, s8) */
static __device__ __forceinline__ void mv_mma_u8(int d[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                 uint2 b) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b.x), "r"(b.y), "r"(0));
}
static __device__ __forceinline__ void mv_mma_k16(int d[4], uint32_t a0, uint32_t a1, uint32_t b) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(b), "r"(0));
}

/* The x operands of a lane: its B row (x row g) and the records of its C columns (x
 * rows 2t, 2t + 1), a float4 a block of 32 (mv_put_x_q8_sums) */
struct mv_mma_x {
    const uint8_t *b;
    const float4 *r0, *r1;
};

/* acc += chunk c of a q4_K stage (rows g, g + 8) by the lane's x rows: per sub-block of
 * 32, d sc Σ(q - 8)·x + (8 d sc - dmin mn) Σx, as km_dot (the 8 Σq·x folded into the
 * record's offset, so not the same bits). The high nibbles stay in place (u8: 16 q):
 * that product is 16 times the sum, and x's scale / 16 takes it back. The 4 lanes of a
 * row pair share its coefficients: lane t decodes those of row g (t < 2) or g + 8 (t >= 2)
 * for the 64 weights t % 2 ({d sc, 8 d sc - dmin mn} of both sub-blocks) into the warp's `coef`
 * (32 float4), and each lane reads the others' (every lane decoded all 8 before: a
 * third of the chunk's instructions). */
static __device__ __forceinline__ void mv_mma_q4k(const uint8_t *sp, int64_t c, int g, int t, const mv_mma_x &X,
                                                  float4 *coef, float acc[4]) {
    const uint8_t *ra = sp + g * MV_MMA_ROWB_Q4K, *rb = sp + (g + 8) * MV_MMA_ROWB_Q4K;
    {
        const uint4 hdr = *(const uint4 *)((t < 2 ? ra : rb) + 64);
        int s0, s1, m0, m1;
        kq4_scale_min(hdr, 2 * (int)(c & 1) + (t & 1), s0, s1, m0, m1);
        const float d = cu_f16((uint16_t)(hdr.x & 0xffffu)), dm = cu_f16((uint16_t)(hdr.x >> 16));
        const float a0 = d * (float)s0, a1 = d * (float)s1;
        __syncwarp(); /* the previous chunk's (or weight's) coefficients are read */
        coef[4 * g + t] = make_float4(a0, 8.0f * a0 - dm * (float)m0, a1, 8.0f * a1 - dm * (float)m1);
        __syncwarp();
    }
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const uint2 wa = *(const uint2 *)(ra + 32 * j + 8 * t), wb = *(const uint2 *)(rb + 32 * j + 8 * t);
        const int64_t kb = 4 * c + 2 * j; /* the low nibbles' block of 32 (the high ones': kb + 1) */
        int lo[4], hi[4];
        mv_mma_u8(lo, wa.x & 0x0f0f0f0fu, wb.x & 0x0f0f0f0fu, wa.y & 0x0f0f0f0fu, wb.y & 0x0f0f0f0fu,
                  *(const uint2 *)(X.b + kb * 32));
        mv_mma_u8(hi, wa.x & 0xf0f0f0f0u, wb.x & 0xf0f0f0f0u, wa.y & 0xf0f0f0f0u, wb.y & 0xf0f0f0f0u,
                  *(const uint2 *)(X.b + kb * 32 + 32));
        const float4 xl[2] = {X.r0[kb], X.r1[kb]}, xh[2] = {X.r0[kb + 1], X.r1[kb + 1]};
#pragma unroll
        for (int rr = 0; rr < 2; rr++) { /* row g, then g + 8 */
            const float4 k = coef[4 * g + 2 * rr + j]; /* {a0, b0, a1, b1} */
#pragma unroll
            for (int u = 0; u < 2; u++) { /* x rows 2t, 2t + 1 */
                const float4 &l = xl[u], &h = xh[u];
                acc[2 * rr + u] += k.x * fmaf((float)lo[2 * rr + u], l.x, l.z) + k.y * l.y +
                                   k.z * fmaf((float)hi[2 * rr + u], 0.0625f * h.x, h.z) + k.w * h.y;
            }
        }
    }
}

/* acc += chunk c of a q6_K stage: per 16, d sc Σ(q - 32)·x (km_dot's), a k16 mma each */
static __device__ __forceinline__ void mv_mma_q6k(const uint8_t *sp, int64_t c, int g, int t, const mv_mma_x &X,
                                                  float acc[4]) {
    const uint8_t *ra = sp + g * MV_MMA_ROWB_Q6K, *rb = sp + (g + 8) * MV_MMA_ROWB_Q6K;
    const uint2 sca = *(const uint2 *)(ra + 96), scb = *(const uint2 *)(rb + 96);
    const int di = (int)((c >> 1) & 3); /* the super-block's d in the word (K % 1024 == 0) */
    const float da = cu_f16(((const uint16_t *)(ra + 104))[di]), db = cu_f16(((const uint16_t *)(rb + 104))[di]);
#pragma unroll
    for (int i = 0; i < 2; i++) { /* the first or second 16 of each 32 */
        const uint32_t a0 = *(const uint32_t *)(ra + 16 * i + 4 * t),
                       a1 = *(const uint32_t *)(ra + 32 + 16 * i + 4 * t),
                       ah = *(const uint32_t *)(ra + 64 + 16 * i + 4 * t);
        const uint32_t b0 = *(const uint32_t *)(rb + 16 * i + 4 * t),
                       b1 = *(const uint32_t *)(rb + 32 + 16 * i + 4 * t),
                       bh = *(const uint32_t *)(rb + 64 + 16 * i + 4 * t);
#pragma unroll
        for (int m = 0; m < 4; m++) { /* elements 32m + 16i.. of the half: ql low / high nibbles, qh bits 2m */
            const uint32_t la = m & 1 ? a1 : a0, lb = m & 1 ? b1 : b0;
            const int sl = m < 2 ? 0 : 4, sh = 4 - 2 * m; /* qh bits 2m, 2m + 1 -> bits 4, 5 */
            const uint32_t qa = (la >> sl & 0x0f0f0f0fu) | ((sh >= 0 ? ah << sh : ah >> -sh) & 0x30303030u);
            const uint32_t qb = (lb >> sl & 0x0f0f0f0fu) | ((sh >= 0 ? bh << sh : bh >> -sh) & 0x30303030u);
            const int64_t kb = 4 * c + m; /* the block of 32 */
            int d[4];
            mv_mma_k16(d, qa, qb, *(const uint32_t *)(X.b + kb * 32 + 16 * i));
            const float4 x0 = X.r0[kb], x1 = X.r1[kb];
            /* 32 Σqx of this 16: the record's int16 i, times 32 (shifts keep the sign) */
            const int q0 = i ? (int)__float_as_uint(x0.w) >> 16 << 5 : (int)(__float_as_uint(x0.w) << 16) >> 11;
            const int q1 = i ? (int)__float_as_uint(x1.w) >> 16 << 5 : (int)(__float_as_uint(x1.w) << 16) >> 11;
            const int sh8 = 8 * (2 * (m & 1) + i); /* scale 2m + i of the half's 8 */
            const int s_a = (int)(int8_t)((m < 2 ? sca.x : sca.y) >> sh8 & 0xffu);
            const int s_b = (int)(int8_t)((m < 2 ? scb.x : scb.y) >> sh8 & 0xffu);
            const float fa = da * (float)s_a, fb = db * (float)s_b;
            acc[0] += fa * ((float)(d[0] - q0) * x0.x);
            acc[1] += fa * ((float)(d[1] - q1) * x1.x);
            acc[2] += fb * ((float)(d[2] - q0) * x0.x);
            acc[3] += fb * ((float)(d[3] - q1) * x1.x);
        }
    }
}

template <int DT, bool NORM, bool PAIR, int STAGES>
__global__ void __launch_bounds__(MV_THREADS, 2) /* <= 128 registers: 2 blocks an SM */
    mv_mma_kernel(struct mv_job job, const float *__restrict__ x, int rows, int64_t n_tiles) {
    using C = mv_mma_cfg<DT, PAIR, STAGES>;
    constexpr int NP = C::NP, S = C::S;
    __shared__ float red[MV_WARPS][NP * 4][CU_WARP];
    __shared__ float4 kq_coef[DT == CU_Q8_0 || DT == CU_Q6_K ? 1 : MV_WARPS][CU_WARP]; /* mv_mma_q4k's */
    cu_pdl_trigger();
    CU_TRACE_END;
    const int lane = threadIdx.x % CU_WARP, warp = threadIdx.x / CU_WARP, g = lane / 4, t = lane % 4;
    const int64_t K = job.seg[0].w.cols, nb = K / 32, nc = K / 128;
    const size_t xstride = mv_mma_x_stride(K, C::KQ);
    extern __shared__ float4 xs_dyn[];
    uint8_t *xs = (uint8_t *)xs_dyn;
    uint8_t *ring = xs + (size_t)rows * xstride + (size_t)warp * S * C::STAGE;
    /* the issue side: the (tile, chunk) that fills the next stage; K-quants: the lane's
     * copies of that tile, set when it moves to another */
    int64_t it = warp < nc ? (int64_t)blockIdx.x : n_tiles, ic = warp, kq_tile = -1;
    mv_kq_copies kq_cp[C::KQ ? NP : 1];
    bool kq_q4 = true;
    (void)kq_cp; /* (q8_0: unused) */
    (void)kq_coef;
    (void)kq_q4;
    (void)kq_tile;
    auto issue = [&](int s) {
        if (it < n_tiles) {
            uint8_t *st = ring + (size_t)s * C::STAGE;
            if constexpr (C::KQ) {
                if (it != kq_tile) {
                    int64_t base;
                    const struct cu_weight w = mv_job_seg(job, mv_job_find(job, it, &base)).w;
#pragma unroll
                    for (int p = 0; p < NP; p++)
                        mv_kq_copies_set(kq_cp[p], PAIR && p == 1 ? job.up : w, w.rows, (it - base) * MV_MMA_TILE, K,
                                         lane);
                    kq_q4 = w.dtype == CU_Q4_K;
                    kq_tile = it;
                }
#pragma unroll
                for (int p = 0; p < NP; p++) mv_kq_copies_issue(kq_cp[p], kq_q4, ic, lane, st + p * C::PB);
            } else {
                int64_t base;
                const struct cu_weight w = mv_job_seg(job, mv_job_find(job, it, &base)).w;
                const int64_t j0 = (it - base) * MV_MMA_TILE;
#pragma unroll
                for (int p = 0; p < NP; p++) {
                    const struct cu_weight &ws = PAIR && p == 1 ? job.up : w;
                    uint8_t *sp = st + p * C::PB;
#pragma unroll
                    for (int i = 0; i < MV_MMA_TILE / 4; i++) {
                        const int r = 4 * i + lane / 8; /* rows past the end repeat the last one */
                        const int64_t j = j0 + r < w.rows ? j0 + r : w.rows - 1;
                        cu_cp_async16(sp + r * MV_MMA_ROWB + 16 * (lane % 8),
                                      (const uint8_t *)ws.data + j * K + ic * 128 + 16 * (lane % 8));
                    }
                    if (lane < MV_MMA_TILE) {
                        const int64_t j = j0 + lane < w.rows ? j0 + lane : w.rows - 1;
                        cu_cp_async8(sp + MV_MMA_WB + lane * 8, ws.scales + j * nb + ic * 4);
                    }
                }
            }
            ic += MV_WARPS;
            if (ic >= nc) {
                ic = warp;
                it += gridDim.x;
            }
        }
        cu_cp_async_commit(); /* (empty past the end: one group an iteration) */
    };
#pragma unroll
    for (int s = 0; s < S - 1; s++) issue(s); /* weights only: before the dependency wait */
    cu_pdl_wait();
    mv_stage_x_rows_q8<CU_MATVEC_MAX_ROWS, NORM, C::KQ>(x, rows, K, job.seg[0].ep.norm_w, job.seg[0].ep.norm_eps, xs,
                                                        xstride);
    /* this lane's B column (x row g) and its C columns (x rows 2t, 2t + 1); rows past
     * the batch read its last one and are dropped */
    const uint8_t *xb = xs + (size_t)(g < rows ? g : rows - 1) * xstride + 8 * t;
    const uint8_t *xc0 = xs + (size_t)(2 * t < rows ? 2 * t : rows - 1) * xstride + K;
    const uint8_t *xc1 = xs + (size_t)(2 * t + 1 < rows ? 2 * t + 1 : rows - 1) * xstride + K;
    int s_issue = S - 1, s_use = 0;
    for (int64_t tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
        bool q4 = DT == CU_Q4_K;
        if constexpr (DT == 0) {
            int64_t base;
            q4 = mv_job_seg(job, mv_job_find(job, tile, &base)).w.dtype == CU_Q4_K;
        }
        (void)q4; /* (q8_0: unused) */
        float acc[NP][4];
#pragma unroll
        for (int p = 0; p < NP; p++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[p][i] = 0.0f;
        for (int64_t c = warp; c < nc; c += MV_WARPS) {
            issue(s_issue);
            s_issue = s_issue + 1 == S ? 0 : s_issue + 1;
            cu_cp_async_wait<S - 1>(); /* this chunk's stage has landed */
            __syncwarp();
            const uint8_t *st = ring + (size_t)s_use * C::STAGE;
            if constexpr (C::KQ) {
                /* q6_K's k16 B operand is bytes 4t..4t+3 of a 16 */
                const mv_mma_x X4 = {xb, (const float4 *)xc0, (const float4 *)xc1}, X6 = {xb - 4 * t, X4.r0, X4.r1};
#pragma unroll
                for (int p = 0; p < NP; p++) {
                    if (DT != CU_Q6_K && q4)
                        mv_mma_q4k(st + p * C::PB, c, g, t, X4, kq_coef[warp], acc[p]);
                    else if constexpr (DT != CU_Q4_K)
                        mv_mma_q6k(st + p * C::PB, c, g, t, X6, acc[p]);
                }
            } else {
                const float *xd0 = (const float *)xc0, *xd1 = (const float *)xc1;
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const int64_t kb = c * 4 + q;
                    const uint2 xv = *(const uint2 *)(xb + kb * 32);
                    const float x0 = xd0[kb], x1 = xd1[kb];
#pragma unroll
                    for (int p = 0; p < NP; p++) {
                        const uint8_t *sp = st + p * MV_MMA_PB;
                        const uint2 a = *(const uint2 *)(sp + g * MV_MMA_ROWB + 32 * q + 8 * t);
                        const uint2 b = *(const uint2 *)(sp + (g + 8) * MV_MMA_ROWB + 32 * q + 8 * t);
                        const float da = cu_f16(*(const uint16_t *)(sp + MV_MMA_WB + g * 8 + 2 * q));
                        const float db = cu_f16(*(const uint16_t *)(sp + MV_MMA_WB + (g + 8) * 8 + 2 * q));
                        int d0, d1, d2, d3;
                        asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, "
                                     "{%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
                                     : "=r"(d0), "=r"(d1), "=r"(d2), "=r"(d3)
                                     : "r"(a.x), "r"(b.x), "r"(a.y), "r"(b.y), "r"(xv.x), "r"(xv.y), "r"(0));
                        acc[p][0] += (float)d0 * (da * x0);
                        acc[p][1] += (float)d1 * (da * x1);
                        acc[p][2] += (float)d2 * (db * x0);
                        acc[p][3] += (float)d3 * (db * x1);
                    }
                }
            }
            __syncwarp(); /* the stage is read: the next issue may refill it */
            s_use = s_use + 1 == S ? 0 : s_use + 1;
        }
#pragma unroll
        for (int p = 0; p < NP; p++)
#pragma unroll
            for (int i = 0; i < 4; i++) red[warp][p * 4 + i][lane] = acc[p][i];
        __syncthreads();
        if (threadIdx.x < 4 * CU_WARP) {
            int64_t base;
            const struct cu_mv_seg seg = mv_job_seg(job, mv_job_find(job, tile, &base));
            const int64_t j0 = (tile - base) * MV_MMA_TILE, n_out = seg.w.rows;
            const int i = threadIdx.x / CU_WARP, l = threadIdx.x % CU_WARP;
            float sum = 0.0f, up = 0.0f;
#pragma unroll
            for (int w = 0; w < MV_WARPS; w++) {
                sum += red[w][i][l];
                if constexpr (PAIR) up += red[w][4 + i][l];
            }
            const int64_t j = j0 + l / 4 + (i >= 2 ? 8 : 0);
            const int r = 2 * (l % 4) + (i & 1);
            if (j < n_out && r < rows)
                cu_matvec_put<PAIR>(sum, up, cu_matvec_epi<PAIR>(j, r, n_out, seg.ep), j, r, n_out, rows, seg.y,
                                    seg.ep, seg.head_dim);
        }
        __syncthreads(); /* red is written again */
    }
    cu_cp_async_wait<0>(); /* (only empty groups are left) */
}

static int mv_elems(int dtype) {
    switch (dtype) {
    case CU_F32: return 4;
    case CU_F16:
    case CU_BF16: return 8;
    case CU_Q8_0: return 16;
    case CU_Q4_0: return 32;
    default: return 0;
    }
}

bool cu_matvec_ok(const struct cu_weight *w) {
    if (cu_dtype_kquant(w->dtype)) return w->cols % 256 == 0; /* kernels_kquant.cu */
    int e = mv_elems(w->dtype);
    /* every load 16-byte aligned: row bytes and x rows (K floats) multiples of 16 */
    return e > 0 && w->cols % e == 0 && w->cols % 4 == 0 &&
           cu_weight_data_bytes(w->dtype, 1, w->cols) % 16 == 0;
}

/* Launch shape of one-row matvecs: output rows per warp and 16-byte loads in flight
 * per lane (0: mv_default_shape) and the warps a launch aims at when it
 * splits K (keeping at least two rounds of 32 chunks per warp; 0: 4096 = 132 SMs x 32
 * warps on an H200). From $LLMOPT_CUDA_MV_NR, _MV_LIF and _MV_WARPS, read once, or
 * cu_matvec_tune (the kernel lab). */
static struct {
    bool read;
    int nr, lif;
    int64_t warps;
} mv_tune;

/* An A/B switch, on unless $name is "0": *state -1 until read (or set by a setter). */
static bool mv_switch_on(int *state, const char *name) {
    if (*state < 0) {
        const char *e = getenv(name);
        *state = !(e && !strcmp(e, "0"));
    }
    return *state == 1;
}

static int mv_env(const char *name, long long lo, long long hi) {
    const char *e = getenv(name);
    long long v = e ? atoll(e) : 0;
    return v >= lo && v <= hi ? (int)v : 0;
}

extern "C" void cu_matvec_tune(int nr, int lif, int64_t warps) {
    mv_tune.read = true;
    mv_tune.nr = nr == 1 || nr == 2 || nr == 4 ? nr : 0;
    mv_tune.lif = lif == 4 || lif == 8 || lif == 16 ? lif : 0;
    mv_tune.warps = warps >= 128 && warps <= (1 << 20) ? warps : 0;
}

static void mv_tune_read(void) {
    if (!mv_tune.read)
        cu_matvec_tune(mv_env("LLMOPT_CUDA_MV_NR", 1, 4), mv_env("LLMOPT_CUDA_MV_LIF", 4, 16),
                       mv_env("LLMOPT_CUDA_MV_WARPS", 128, 1 << 20));
}

/* The x mode of one-row q8_0 matvecs (cu_matvec_q8_x): MV_X_F32 or MV_X_Q8 forced, or
 * -1, the default (mv_q8_shape); -2: $LLMOPT_CUDA_Q8_X not read yet. int8 x takes K
 * int8 and K / 32 f32 scales of dynamic shared memory, within the default 48 KiB. */
static int mv_x_mode = -2;

extern "C" void cu_matvec_q8_x(int mode) {
    mv_x_mode = mode == MV_X_F32 || mode == MV_X_Q8 ? mode : -1;
}

/* Persistent one-row matvec launches (cu_matvec_persist): -1 the default (the launches
 * with a per-block prologue: the rms_norm or x to int8), 0 none, 1 all; -2 unread;
 * at most mv_persist_cap blocks when not 0 (tests: many groups a block). */
static int mv_persist_mode = -2, mv_persist_cap = 0;

extern "C" void cu_matvec_persist(int mode, int max_blocks) {
    mv_persist_mode = mode == 0 || mode == 1 ? mode : -1;
    mv_persist_cap = max_blocks > 0 ? max_blocks : 0;
}

static bool mv_persistent(bool prologue) {
    if (mv_persist_mode == -2) {
        const char *e = getenv("LLMOPT_CUDA_MV_PERSIST");
        cu_matvec_persist(e && *e ? atoi(e) : -1, 0);
    }
    return mv_persist_mode == 1 || (mv_persist_mode < 0 && prologue);
}

/* int8-x launches over many short rows (>= 16384 rows of K <= 2048: the 0.6B lm_head,
 * with or without the rms_norm prologue): with 1 row a warp a lane has only K / 512
 * loads of a row in flight (2 at K = 1024, whatever the loads-in-flight setting), so
 * they take 4 rows a warp and 4 loads (8 in flight at K = 1024); $LLMOPT_CUDA_MV_SHORT=0:
 * 1 row and 4 (prologue) or 8 (plain) loads as before (A/B, read once per process). */
static int mv_short_state = -1;
static bool mv_short_rows(void) {
    return mv_switch_on(&mv_short_state, "LLMOPT_CUDA_MV_SHORT");
}

/* The int8-x rms_norm prologue from registers (MV_X_Q8R) where K <= 4096 below 4 rows;
 * $LLMOPT_CUDA_MV_XREGS=0: the two passes over x as before (A/B, read once per process;
 * both give the same bits). */
static int mv_x_regs_state = -1;
extern "C" void cu_matvec_x_regs(int on) {
    mv_x_regs_state = on != 0;
}
static bool mv_x_regs_on(void) {
    return mv_switch_on(&mv_x_regs_state, "LLMOPT_CUDA_MV_XREGS");
}

/* Whether a one-row q8_0 launch over rows of K (`streamed` weight rows, prologue
 * `norm`, SwiGLU `pair`) takes int8 x, and then its launch shape (output rows a warp
 * *nr, loads in flight *lif). The default, from the kernel lab's sweep on an H200
 * (bench/results/cuda-q8-2026-11-30.md): int8 x for the launches with the rms_norm
 * prologue or a pair, and for plain ones with K <= 4096 (attn_o, 0.6B ffn_down, and,
 * with persistent launches, where each block quantizes x once, lm_head: 80 -> 101% of
 * copy bandwidth, bench/results/cuda-big-2026-11-30.md); f32 x for long rows (8B
 * ffn_down: 62 vs 54%) and, without persistent launches, from 16384 rows. */
static int mv_x_mode_read(void) {
    if (mv_x_mode == -2) {
        const char *e = getenv("LLMOPT_CUDA_Q8_X");
        cu_matvec_q8_x(e && *e ? atoi(e) : -1);
    }
    return mv_x_mode;
}

static bool mv_q8_shape(int64_t K, int64_t streamed, bool norm, bool pair, int *nr, int *lif) {
    mv_x_mode_read();
    if (mv_xq_smem(K) > (48 << 10) || mv_x_mode == MV_X_F32) return false;
    if (mv_x_mode < 0 && !norm && !pair && (K > 4096 || (streamed >= 16384 && !mv_persistent(true)))) return false;
    if (!pair && streamed >= 16384 && K <= 2048 && mv_short_rows()) {
        *nr = 4; /* 0.6B lm_head: 4 rows x 4 loads (bench/results/cuda-mv-2026-11-30.md) */
        *lif = 4;
    } else if (pair) { /* 2 row pairs, 8 loads; 4 below 16384 streamed rows (the 0.6B pair,
                          * K = 1024: 0.6B q8_0 1,486-1,488 -> 1,508 tok/s in one call, 1,465-1,467
                          * -> 1,467-1,474 in another; 1 row pair a warp with 4, 8 or 16 loads
                          * 1,398-1,462; bench/results/cuda-trace-2026-12-01.md) */
        *nr = 2;
        *lif = streamed >= 16384 ? 8 : 4;
    } else if (norm) { /* q/k/v: 1 row and 4 loads from 6144 rows (8B), else 2 and 4 (0.6B) */
        *nr = streamed >= 6144 ? 1 : 2;
        *lif = 4;
    } else {
        *nr = 1;
        *lif = 8;
    }
    return true;
}

/* q8_0 products of 2..8 x rows through mv_mma_kernel ($LLMOPT_CUDA_Q8_MMA=0, or
 * cu_matvec_mma(0): matvec_kernel's dp4a loop over int8 x rows instead; read once). */
static int mv_mma_state = -1;
extern "C" void cu_matvec_mma(int on) {
    mv_mma_state = on != 0;
}
static bool mv_mma_on(void) {
    return mv_switch_on(&mv_mma_state, "LLMOPT_CUDA_Q8_MMA");
}

/* Stages of a warp's ring in mv_mma_kernel: 0 the default (mv_mma_stages), else 2..4
 * (cu_matvec_mma_stages; until the first call $LLMOPT_CUDA_MMA_STAGES). */
static int mv_mma_stage_set = -1;
extern "C" void cu_matvec_mma_stages(int stages) {
    mv_mma_stage_set = stages >= 2 && stages <= 4 ? stages : 0;
}
static int mv_mma_stages(bool pair) {
    if (mv_mma_stage_set < 0) cu_matvec_mma_stages(mv_env("LLMOPT_CUDA_MMA_STAGES", 2, 4));
    return mv_mma_stage_set ? mv_mma_stage_set : pair ? MV_MMA_STAGES_PAIR : MV_MMA_STAGES;
}

/* Shared memory of an mv_mma_kernel launch: the staged x rows and the warps' rings */
static size_t mv_mma_smem(int dt, bool pair, int stages, int rows, int64_t K) {
    return (size_t)rows * mv_mma_x_stride(K, dt != CU_Q8_0) +
           (size_t)MV_WARPS * stages * (pair ? 2 : 1) * mv_mma_pb(dt);
}
#define MV_MMA_SMEM_MAX (212 << 10) /* dynamic: an H100/H200 block's most (227 KiB) less the static (<= 12.3 KiB) */

template <int DT, bool NORM, bool PAIR, int STAGES>
static void mv_mma_launch_s(cudaStream_t st, const struct mv_job &job, const float *x, int rows, int64_t tiles) {
    const size_t smem = mv_mma_smem(DT, PAIR, STAGES, rows, job.seg[0].w.cols);
    auto kern = mv_mma_kernel<DT, NORM, PAIR, STAGES>;
    /* persistent: the blocks the device holds at once (each stages x once), or
     * $LLMOPT_CUDA_MMA_BPS blocks an SM where fewer */
    static size_t occ_smem = (size_t)-1;
    static int occ = 1;
    /* (an error here fails the launch below, which reports it) */
    cu_blocks_per_sm(kern, MV_THREADS, smem, MV_MMA_SMEM_MAX, &occ_smem, &occ);
    static const int bps = mv_env("LLMOPT_CUDA_MMA_BPS", 1, 64);
    const int per_sm = bps && bps < occ ? bps : occ;
    int64_t cap = mv_persist_cap ? mv_persist_cap : (int64_t)per_sm * cu_sm_count();
    const unsigned grid = (unsigned)(tiles < cap ? tiles : cap);
    cu_launch_pdl(kern, dim3(grid), dim3(MV_THREADS), smem, st, job, x, rows, tiles);
}

/* DT as mv_mma_kernel's; K-quants at the default ring depths only */
template <int DT, bool NORM, bool PAIR>
static void mv_mma_launch(cudaStream_t st, struct mv_job job, const float *x, int rows, int stages) {
    int64_t tiles = 0;
    for (int k = 0; k < job.n_seg; k++) {
        tiles += (job.seg[k].w.rows + MV_MMA_TILE - 1) / MV_MMA_TILE;
        job.g_end[k] = tiles;
    }
    if constexpr (DT != CU_Q8_0) {
        (void)stages;
        mv_mma_launch_s<DT, NORM, PAIR, PAIR ? MV_MMA_STAGES_PAIR : MV_MMA_STAGES>(st, job, x, rows, tiles);
    } else {
        if (stages == 2) return mv_mma_launch_s<DT, NORM, PAIR, 2>(st, job, x, rows, tiles);
        if (stages == 3) return mv_mma_launch_s<DT, NORM, PAIR, 3>(st, job, x, rows, tiles);
        mv_mma_launch_s<DT, NORM, PAIR, 4>(st, job, x, rows, tiles);
    }
}

/* q4_K/q6_K products of 2..8 x rows through mv_mma_kernel ($LLMOPT_CUDA_KQ_MMA=0, or
 * cu_matvec_kq_mma_on(0): cu_matvec_kq_multi's dp4a loop instead; read once). */
static int mv_kq_mma_state = -1;
extern "C" void cu_matvec_kq_mma_on(int on) {
    mv_kq_mma_state = on != 0;
}

template <int DT> static void mv_kq_mma_launch(cudaStream_t st, const struct mv_job &job, const float *x, int rows) {
    const bool norm = job.seg[0].ep.norm_w != NULL;
    if constexpr (DT != 0)
        if (job.up.data)
            return norm ? mv_mma_launch<DT, true, true>(st, job, x, rows, 0)
                        : mv_mma_launch<DT, false, true>(st, job, x, rows, 0);
    norm ? mv_mma_launch<DT, true, false>(st, job, x, rows, 0) : mv_mma_launch<DT, false, false>(st, job, x, rows, 0);
}

cudaError_t cu_matvec_kq_mma(cudaStream_t st, const float *x, int64_t rows, const struct cu_mv_seg *segs, int n_seg,
                             const struct cu_weight *up) {
    if (rows < 2 || rows > CU_MATVEC_MAX_ROWS || n_seg < 1 || n_seg > CU_MV_MAX_SEGS ||
        !mv_switch_on(&mv_kq_mma_state, "LLMOPT_CUDA_KQ_MMA"))
        return cudaErrorNotSupported;
    const int64_t K = segs[0].w.cols;
    bool q4 = false, q6 = false;
    struct mv_job job;
    memset(&job, 0, sizeof job);
    job.n_seg = n_seg;
    for (int k = 0; k <= n_seg; k++) { /* the segments, then the pair's up weight */
        const struct cu_weight *w = k < n_seg ? &segs[k].w : up;
        if (!w) break;
        q4 = q4 || w->dtype == CU_Q4_K;
        q6 = q6 || w->dtype == CU_Q6_K;
        if ((w->dtype != CU_Q4_K && w->dtype != CU_Q6_K) || w->cols != K || (uintptr_t)w->data % 16 ||
            (w->dtype == CU_Q6_K && (!w->scales || (uintptr_t)w->scales % 8)))
            return cudaErrorNotSupported;
        if (k < n_seg) job.seg[k] = segs[k];
    }
    if (up) job.up = *up;
    /* q6_K copies the aligned word of 4 d values holding a super-block's: K % 1024 */
    const int dt = q4 && q6 ? 0 : q4 ? CU_Q4_K : CU_Q6_K;
    if (K % (q6 ? 1024 : 256) || (dt == 0 && up) ||
        mv_mma_smem(dt, up != NULL, up ? MV_MMA_STAGES_PAIR : MV_MMA_STAGES, (int)rows, K) > MV_MMA_SMEM_MAX)
        return cudaErrorNotSupported;
    if (dt == CU_Q4_K)
        mv_kq_mma_launch<CU_Q4_K>(st, job, x, (int)rows);
    else if (dt == CU_Q6_K)
        mv_kq_mma_launch<CU_Q6_K>(st, job, x, (int)rows);
    else
        mv_kq_mma_launch<0>(st, job, x, (int)rows);
    return cudaGetLastError();
}

template <int DT, int RMAX, int NR, bool NORM, bool PAIR, int LIF, int XM = MV_X_F32>
static void mv_launch_nr(cudaStream_t st, struct mv_job job, const float *x, int rows) {
    int64_t n_chunks = job.seg[0].w.cols / mv_traits<DT>::E, groups = 0;
    for (int k = 0; k < job.n_seg; k++) {
        groups += (job.seg[k].w.rows + NR - 1) / NR;
        job.g_end[k] = groups;
    }
    const size_t smem = XM != MV_X_F32 ? (size_t)rows * mv_xq_row_stride(job.seg[0].w.cols)
                           : NORM && RMAX == 1 ? (size_t)job.seg[0].w.cols * sizeof(float) : 0;
    auto kern = matvec_kernel<DT, RMAX, NR, NORM, PAIR, LIF, XM>;
    /* persistent: as many blocks as the device holds at once, and K split only while
     * the split rows still fit in their warps (split K costs two barriers a row group,
     * and more blocks than fit mean a second, partial round) */
    int64_t cap = 0;
    if (mv_persistent(NORM || XM != MV_X_F32)) {
        static size_t occ_smem = (size_t)-1;
        static int occ = 1;
        cu_blocks_per_sm(kern, MV_THREADS, smem, 0, &occ_smem, &occ); /* (on an error 1) */
        cap = mv_persist_cap ? mv_persist_cap : (int64_t)occ * cu_sm_count();
    }
    const int64_t target = mv_tune.warps ? mv_tune.warps : cap ? cap * MV_WARPS / 2 + 1 : 4096;
    const int ksplit = cu_matvec_ksplit(groups, n_chunks, MV_WARPS, target);
    const unsigned blocks = cu_blocks(groups, MV_WARPS / ksplit);
    const unsigned grid = cap && cap < (int64_t)blocks ? (unsigned)cap : blocks;
    cu_launch_pdl(kern, dim3(grid), dim3(MV_THREADS), smem, st, job, x, rows, ksplit, (int64_t)blocks);
}

/* Loads in flight: bf16 and q8_0 (the decode types) have 4, 8 and 16; the others 4. */
template <int DT, int NR, bool NORM, bool PAIR, int XM>
static void mv_launch_lif(cudaStream_t st, const struct mv_job &job, const float *x, int lif) {
    if constexpr (DT == CU_BF16 || DT == CU_Q8_0) {
        if (lif == 16) return mv_launch_nr<DT, 1, NR, NORM, PAIR, 16, XM>(st, job, x, 1);
        if (lif == 8) return mv_launch_nr<DT, 1, NR, NORM, PAIR, 8, XM>(st, job, x, 1);
    }
    mv_launch_nr<DT, 1, NR, NORM, PAIR, MV_LIF, XM>(st, job, x, 1);
}

/* Default launch shape of a one-row matvec (bench/results/cuda-matvec-2026-11-29.md:
 * the kernel lab's sweep of the 8B shapes on an H200). `streamed`: the weight rows a
 * launch reads (a SwiGLU pair counts both of its weights). Before that sweep every
 * launch used 4 loads in flight and 4, 2 or 1 output rows a warp from 16384 / 8192
 * streamed rows (a pair 2 from 16384); bf16 and q8_0 now take, where measured:
 *   plain products from 4096 rows (attn_o, ffn_down, lm_head): 4 rows a warp, 4 loads
 *     (more rows a warp: x read once for 4 rows, and K split over 4 warps of a block);
 *   q/k/v with the rms_norm prologue (6144..16383 rows): bf16 2 rows and 16 loads,
 *     q8_0 4 rows and 8 loads;
 *   the gate/up pair from 8192 rows: bf16 1 row and 16 loads (q8_0 keeps 2 rows and 4
 *     loads: fastest once its scales are fetched with the loads).
 * Swept again with the persistent prologue launches (bench/results/cuda-bf16-2026-11-30.md):
 * bf16 q/k/v 2 rows and 8 loads (16.7 against 17.6 us at 16 loads), bf16 attn_o
 * (K <= 4096, below 16384 rows) 2 rows and 4 loads (10.7 against 11.4 us at 4 rows). */
template <int DT, bool NORM, bool PAIR>
static void mv_default_shape(int64_t streamed, int64_t K, int *nr, int *lif) {
    constexpr bool BF = DT == CU_BF16, Q8 = DT == CU_Q8_0;
    *lif = MV_LIF;
    *nr = streamed >= 16384 ? (PAIR ? 2 : 4) : streamed >= 8192 && !PAIR ? 2 : 1;
    if (!BF && !Q8) return;
    if (PAIR && streamed >= 16384 && BF) {
        *nr = 1;
        *lif = 16;
    } else if (!PAIR && NORM && streamed >= 6144 && streamed < 16384) {
        *nr = BF ? 2 : 4;
        *lif = 8;
    } else if (!PAIR && !NORM && streamed >= 4096) {
        *nr = BF && K <= 4096 && streamed < 16384 ? 2 : 4;
    }
}

template <int DT, bool NORM, bool PAIR, int XM>
static void mv_launch_shape(cudaStream_t st, const struct mv_job &job, const float *x, int nr, int lif) {
    if constexpr (!PAIR && XM != MV_X_Q8R) /* (the register prologue is not taken at 4 rows) */
        if (nr == 4) return mv_launch_lif<DT, 4, NORM, PAIR, XM>(st, job, x, lif);
    if (nr >= 2)
        mv_launch_lif<DT, 2, NORM, PAIR, XM>(st, job, x, lif);
    else
        mv_launch_lif<DT, 1, NORM, PAIR, XM>(st, job, x, lif);
}

/* One x row: the launch shape of cu_matvec_tune, or the default above (q8_0 with int8
 * x: mv_q8_shape's); several rows: f32 x, 1 output row a warp (every weight chunk
 * serves each x row). */
template <int DT, bool NORM, bool PAIR>
static void mv_launch_rows(cudaStream_t st, const struct mv_job &job, const float *x, int rows) {
    mv_tune_read();
    if constexpr (DT == CU_Q8_0) /* several rows: int8 x rows side by side in shared memory, where they fit */
        if (rows > 1 && mv_x_mode_read() != MV_X_F32) {
            const int64_t K = job.seg[0].w.cols;
            const size_t staged = (size_t)rows * mv_xq_row_stride(K);
            const int stages = mv_mma_stages(PAIR);
            if (mv_mma_on() && K % 128 == 0 && mv_mma_smem(DT, PAIR, stages, rows, K) <= MV_MMA_SMEM_MAX &&
                mv_xq_smem(K) <= (48 << 10))
                return mv_mma_launch<DT, NORM, PAIR>(st, job, x, rows, stages);
            if (staged <= (48 << 10))
                return mv_launch_nr<DT, CU_MATVEC_MAX_ROWS, 1, NORM, PAIR, MV_LIF, MV_X_Q8>(st, job, x, rows);
        }
    if (rows > 1) return mv_launch_nr<DT, CU_MATVEC_MAX_ROWS, 1, NORM, PAIR, MV_LIF>(st, job, x, rows);
    int64_t streamed = 0;
    for (int k = 0; k < job.n_seg; k++) streamed += job.seg[k].w.rows;
    if (PAIR) streamed *= 2;
    int nr, lif;
    mv_default_shape<DT, NORM, PAIR>(streamed, job.seg[0].w.cols, &nr, &lif);
    bool xq = false;
    if constexpr (DT == CU_Q8_0) xq = mv_q8_shape(job.seg[0].w.cols, streamed, NORM, PAIR, &nr, &lif);
    if (mv_tune.nr) nr = PAIR && mv_tune.nr == 4 ? 2 : mv_tune.nr;
    if (mv_tune.lif) lif = mv_tune.lif;
    if constexpr (DT == CU_Q8_0)
        if (xq) {
            /* the register prologue, but not at 4 rows a warp: there it takes the kernel
             * from 75 to 106 registers, 3 to 2 blocks an SM (0.6B lm_head +norm, the lab:
             * 55.8 us, plain 48.1: bench/results/cuda-mv-2026-11-30.md) */
            if constexpr (NORM)
                if (nr < 4 && job.seg[0].w.cols <= 4 * MV_XR_MAX * MV_THREADS && mv_x_regs_on())
                    return mv_launch_shape<DT, NORM, PAIR, MV_X_Q8R>(st, job, x, nr, lif);
            return mv_launch_shape<DT, NORM, PAIR, MV_X_Q8>(st, job, x, nr, lif);
        }
    mv_launch_shape<DT, NORM, PAIR, MV_X_F32>(st, job, x, nr, lif);
}

template <int DT>
static void mv_launch(cudaStream_t st, const struct mv_job &job, const float *x, int rows) {
    if (job.up.data && job.seg[0].ep.norm_w)
        mv_launch_rows<DT, true, true>(st, job, x, rows);
    else if (job.up.data)
        mv_launch_rows<DT, false, true>(st, job, x, rows);
    else if (job.seg[0].ep.norm_w)
        mv_launch_rows<DT, true, false>(st, job, x, rows);
    else
        mv_launch_rows<DT, false, false>(st, job, x, rows);
}

cudaError_t cu_matvec_multi(cudaStream_t st, const float *x, int64_t rows, const struct cu_mv_seg *segs, int n_seg,
                            const struct cu_weight *up) {
    if (rows < 1 || rows > CU_MATVEC_MAX_ROWS || n_seg < 1 || n_seg > CU_MV_MAX_SEGS || (up && n_seg != 1))
        return cudaErrorInvalidValue;
    if (cu_dtype_kquant(segs[0].w.dtype)) return cu_matvec_kq_multi(st, x, rows, segs, n_seg, up, 0); /* kernels_kquant.cu */
    struct mv_job job;
    memset(&job, 0, sizeof job);
    job.n_seg = n_seg;
    for (int k = 0; k < n_seg; k++) {
        const struct cu_weight *w = &segs[k].w;
        if (!cu_matvec_ok(w) || w->dtype != segs[0].w.dtype || w->cols != segs[0].w.cols ||
            (k > 0 && segs[k].ep.norm_w) || (segs[k].head_dim > 0 && w->rows % segs[k].head_dim) ||
            (segs[k].ep.norm_w && w->cols > CU_MATVEC_NORM_MAX_K))
            return cudaErrorInvalidValue;
        job.seg[k] = segs[k];
    }
    if (up) {
        if (up->dtype != segs[0].w.dtype || up->rows != segs[0].w.rows || up->cols != segs[0].w.cols)
            return cudaErrorInvalidValue;
        job.up = *up;
    }
    if (rows == 1) { /* the staged kernel (kernels_stream.cu), where it is chosen and applies */
        /* int8 x where the register kernel may take it (not forced f32, K fits 48 KiB) */
        const bool q8_int8 = mv_x_mode_read() != MV_X_F32 && mv_xq_smem(segs[0].w.cols) <= (48 << 10);
        const cudaError_t e = cu_matvec_stream(st, x, segs, n_seg, up, q8_int8);
        if (e != cudaErrorNotSupported) return e;
    }
    switch (segs[0].w.dtype) {
    case CU_F32: mv_launch<CU_F32>(st, job, x, (int)rows); break;
    case CU_F16: mv_launch<CU_F16>(st, job, x, (int)rows); break;
    case CU_BF16: mv_launch<CU_BF16>(st, job, x, (int)rows); break;
    case CU_Q8_0: mv_launch<CU_Q8_0>(st, job, x, (int)rows); break;
    case CU_Q4_0: mv_launch<CU_Q4_0>(st, job, x, (int)rows); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

cudaError_t cu_matvec(cudaStream_t st, const struct cu_weight *w, const float *x, int64_t rows,
                      float *y, const struct cu_epilogue *ep) {
    if (rows >= 1 && rows <= CU_MATVEC_MAX_ROWS && cu_dtype_kquant(w->dtype) && cu_matvec_ok(w))
        return cu_matvec_kq(st, w, x, rows, y, ep, 0, -1); /* kernels_kquant.cu */
    struct cu_mv_seg seg;
    memset(&seg, 0, sizeof seg);
    seg.w = *w;
    seg.y = y;
    seg.ep = *ep;
    return cu_matvec_multi(st, x, rows, &seg, 1, NULL);
}

/* ---- q8_0 products of a few rows on int8 tensor cores ---------------------------- */

/* x rows to int8 per 32 with an f32 scale each (mv_quantize_x_q8: the matvec's int8 x
 * rule), a block per row: xq (rows, K), xd (rows, K / 32). */
__global__ void __launch_bounds__(256) q8_mma_quantize_kernel(const float *__restrict__ x, int64_t K, int8_t *xq,
                                                              float *xd) {
    const int64_t r = blockIdx.x;
    mv_quantize_x_q8(x + r * K, NULL, 1.0f, K, blockDim.x, (uint32_t *)(xq + r * K), xd + r * (K / 32));
}

/* y (rows, n_out) = x W^T for q8_0 W (quants (n_out, K) int8, scales (n_out, K / 32)
 * f16) and x as q8_mma_quantize_kernel left it, rows <= 8 NT. A block takes 16 output
 * rows; its 8 warps split K (warp w the 32-element blocks w, w + 8, ...). Each block of
 * 32 is one mma.m16n8k32 (s8 x s8 -> s32) per 8 x rows, its s32 result scaled by the
 * weight row's and the x row's scales into f32 sums, then the warps' sums are added in
 * shared memory. Fragments: within a block of 32 the k order is permuted alike for W
 * and x (thread t of a quad holds bytes 8t..8t+7 of its row: the PTX layout's k 4t..4t+3
 * in its low word, 16+4t..16+4t+3 in its high one), so every fragment is one 8-byte
 * load of 32 contiguous bytes a row per quad. */
template <int NT>
__global__ void __launch_bounds__(256) q8_mma_kernel(const int8_t *__restrict__ wq, const uint16_t *__restrict__ ws,
                                                     int64_t n_out, int64_t K, const int8_t *__restrict__ xq,
                                                     const float *__restrict__ xd, int rows, float *__restrict__ y,
                                                     struct cu_epilogue ep) {
    __shared__ float red[8][NT * 4][CU_WARP];
    const int lane = threadIdx.x % CU_WARP, warp = threadIdx.x / CU_WARP, g = lane / 4, t = lane % 4;
    const int64_t j0 = (int64_t)blockIdx.x * 16, nb = K / 32;
    const int64_t ja = j0 + g < n_out ? j0 + g : n_out - 1, jb = j0 + g + 8 < n_out ? j0 + g + 8 : n_out - 1;
    const int8_t *wa = wq + ja * K + 8 * t, *wb = wq + jb * K + 8 * t;
    const uint16_t *sa = ws + ja * nb, *sb = ws + jb * nb;
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[nt][i] = 0.0f;
#pragma unroll 2
    for (int64_t kb = warp; kb < nb; kb += 8) {
        const uint2 a_lo = __ldg((const uint2 *)(wa + kb * 32)), a_hi = __ldg((const uint2 *)(wb + kb * 32));
        const float da = cu_f16(__ldg(sa + kb)), db = cu_f16(__ldg(sb + kb));
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int nB = nt * 8 + g < rows ? nt * 8 + g : rows - 1; /* this lane's B column */
            const uint2 b = __ldg((const uint2 *)(xq + (int64_t)nB * K + kb * 32 + 8 * t));
            int c0, c1, c2, c3;
            asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                         "{%10,%10,%10,%10};"
                         : "=r"(c0), "=r"(c1), "=r"(c2), "=r"(c3)
                         : "r"(a_lo.x), "r"(a_hi.x), "r"(a_lo.y), "r"(a_hi.y), "r"(b.x), "r"(b.y), "r"(0));
            const int n0 = nt * 8 + 2 * t; /* the C fragment's columns n0, n0 + 1 */
            const float x0 = __ldg(xd + (int64_t)(n0 < rows ? n0 : rows - 1) * nb + kb);
            const float x1 = __ldg(xd + (int64_t)(n0 + 1 < rows ? n0 + 1 : rows - 1) * nb + kb);
            acc[nt][0] += (float)c0 * (da * x0);
            acc[nt][1] += (float)c1 * (da * x1);
            acc[nt][2] += (float)c2 * (db * x0);
            acc[nt][3] += (float)c3 * (db * x1);
        }
    }
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) red[warp][nt * 4 + i][lane] = acc[nt][i];
    __syncthreads();
    for (int o = threadIdx.x; o < NT * 4 * CU_WARP; o += blockDim.x) {
        const int q = o / CU_WARP, l = o % CU_WARP, nt = q / 4, i = q % 4;
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < 8; w++) sum += red[w][q][l];
        const int64_t j = j0 + l / 4 + (i >= 2 ? 8 : 0);
        const int n = nt * 8 + 2 * (l % 4) + (i & 1);
        if (j < n_out && n < rows) /* the epilogue pass's operations, in its order */
            cu_matvec_put<false>(sum, 0.0f, cu_matvec_epi<false>(j, n, n_out, ep), j, n, n_out, rows, y, ep, 0);
    }
}

size_t cu_linear_q8_mma_scratch(int64_t rows, int64_t K) {
    return (size_t)(rows * K) + (size_t)(rows * (K / 32)) * sizeof(float) + 16;
}

cudaError_t cu_linear_q8_mma(cudaStream_t st, const struct cu_weight *w, const float *x, int64_t rows, float *y,
                             void *scratch, bool x_ready, const struct cu_epilogue *ep) {
    const int64_t K = w->cols;
    /* f32 x asked for (tests), or a row longer than the matvec's int8 x takes: x is
     * rounded to int8 by one rule per K whatever the batch */
    if (mv_x_mode_read() == MV_X_F32 || mv_xq_smem(K) > (48 << 10)) return cudaErrorNotSupported;
    if (w->dtype != CU_Q8_0 || rows < 1 || rows > CU_MMA_MAX_ROWS || K % 32 || w->rows < 1 ||
        (int64_t)(w->rows + 15) / 16 > 0x7fffffff)
        return cudaErrorInvalidValue;
    int8_t *xq = (int8_t *)scratch;
    float *xd = (float *)(((uintptr_t)(xq + rows * K) + 15) & ~(uintptr_t)15);
    if (!x_ready) {
        q8_mma_quantize_kernel<<<(unsigned)rows, 256, 0, st>>>(x, K, xq, xd);
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    struct cu_epilogue none;
    memset(&none, 0, sizeof none);
    none.act = -1;
    const unsigned grid = (unsigned)((w->rows + 15) / 16);
    const int8_t *wq = (const int8_t *)w->data;
    using kernel_t = void (*)(const int8_t *, const uint16_t *, int64_t, int64_t, const int8_t *, const float *, int,
                              float *, struct cu_epilogue);
    static const kernel_t by_tiles[8] = {q8_mma_kernel<1>, q8_mma_kernel<2>, q8_mma_kernel<3>, q8_mma_kernel<4>,
                                         q8_mma_kernel<5>, q8_mma_kernel<6>, q8_mma_kernel<7>, q8_mma_kernel<8>};
    by_tiles[(rows + 7) / 8 - 1]<<<grid, 256, 0, st>>>(wq, w->scales, w->rows, K, xq, xd, (int)rows, y,
                                                        ep ? *ep : none);
    return cudaGetLastError();
}

/* ---- tiled linear (any shape, any dtype) ---------------------------------------- */

#define LT_M 64
#define LT_N 64
#define LT_K 32
#define LT_THREADS 256

__global__ void __launch_bounds__(LT_THREADS)
    linear_tiled_kernel(struct cu_weight w, const float *__restrict__ x, int64_t rows,
                        float *__restrict__ y, struct cu_epilogue ep) {
    __shared__ float xs[LT_K][LT_M + 4]; /* k-major tiles: the inner loop reads rows */
    __shared__ float ws[LT_K][LT_N + 4];
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int64_t m0 = (int64_t)blockIdx.y * LT_M, n0 = (int64_t)blockIdx.x * LT_N;
    const int64_t K = w.cols, n_out = w.rows;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int jj = 0; jj < 4; jj++) acc[i][jj] = 0.0f;
    for (int64_t k0 = 0; k0 < K; k0 += LT_K) {
#pragma unroll
        for (int i = 0; i < (LT_M * LT_K) / LT_THREADS; i++) {
            int idx = tid + i * LT_THREADS, mm = idx / LT_K, kk = idx % LT_K;
            int64_t m = m0 + mm, k = k0 + kk;
            xs[kk][mm] = m < rows && k < K ? x[m * K + k] : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < (LT_N * LT_K) / LT_THREADS; i++) {
            int idx = tid + i * LT_THREADS, nn = idx / LT_K, kk = idx % LT_K;
            int64_t n = n0 + nn, k = k0 + kk;
            ws[kk][nn] = n < n_out && k < K ? cu_weight_elem(w, n, k) : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < LT_K; kk++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) a[i] = xs[kk][ty * 4 + i];
#pragma unroll
            for (int jj = 0; jj < 4; jj++) b[jj] = ws[kk][tx * 4 + jj];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int jj = 0; jj < 4; jj++) acc[i][jj] += a[i] * b[jj];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int64_t m = m0 + ty * 4 + i;
        if (m >= rows) continue;
#pragma unroll
        for (int jj = 0; jj < 4; jj++) {
            int64_t n = n0 + tx * 4 + jj;
            if (n >= n_out) continue;
            float v = acc[i][jj] + (ep.bias ? ep.bias[n] : 0.0f);
            if (ep.act >= 0) v = op_unary_apply(ep.act, v);
            size_t o = (size_t)m * n_out + n;
            if (ep.gate) v *= ep.gate[o];
            if (ep.residual) v += ep.residual[o];
            y[o] = v;
        }
    }
}

cudaError_t cu_linear_tiled(cudaStream_t st, const struct cu_weight *w, const float *x,
                            int64_t rows, float *y, const struct cu_epilogue *ep) {
    if (rows <= 0 || w->rows <= 0) return cudaSuccess;
    dim3 grid(cu_blocks(w->rows, LT_N), cu_blocks(rows, LT_M));
    if (grid.y > 65535) return cudaErrorInvalidValue;
    linear_tiled_kernel<<<grid, LT_THREADS, 0, st>>>(*w, x, rows, y, *ep);
    return cudaGetLastError();
}

/* ---- epilogue after cuBLAS, activation conversion, embedding -------------------- */

template <typename O>
__global__ void epilogue_kernel(const float *y, O *out, int64_t n, int64_t n_out, struct cu_epilogue ep) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    float v = y[e] + (ep.bias ? ep.bias[e % n_out] : 0.0f);
    if (ep.act >= 0) v = op_unary_apply(ep.act, v);
    if (ep.gate) v *= ep.gate[e];
    if (ep.residual) v += ep.residual[e];
    cu_put(out + e, v);
}

cudaError_t cu_linear_epilogue(cudaStream_t st, float *y, int64_t rows, int64_t n_out,
                               const struct cu_epilogue *ep) {
    int64_t n = rows * n_out;
    if (n <= 0 || (!ep->bias && ep->act < 0 && !ep->gate && !ep->residual)) return cudaSuccess;
    epilogue_kernel<float><<<cu_blocks(n, 256), 256, 0, st>>>(y, y, n, n_out, *ep);
    return cudaGetLastError();
}

cudaError_t cu_linear_epilogue_half(cudaStream_t st, const float *y, void *out, int64_t rows, int64_t n_out,
                                    const struct cu_epilogue *ep, bool to_bf16) {
    int64_t n = rows * n_out;
    if (n <= 0) return cudaSuccess;
    if (to_bf16)
        epilogue_kernel<<<cu_blocks(n, 256), 256, 0, st>>>(y, (__nv_bfloat16 *)out, n, n_out, *ep);
    else
        epilogue_kernel<<<cu_blocks(n, 256), 256, 0, st>>>(y, (__half *)out, n, n_out, *ep);
    return cudaGetLastError();
}

__global__ void weight_to_bf16_kernel(struct cu_weight w, __nv_bfloat16 *out, int64_t n) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x)
        out[e] = __float2bfloat16_rn(cu_weight_elem(w, e / w.cols, e % w.cols));
}

/* Block-quantized fast paths: rows are whole 32-element blocks, so flat block b of the
 * matrix has its scale at scales[b]. q8_0: a thread per 16 elements (one 16-byte
 * load, two 16-byte stores); q4_0: a thread per block (16 bytes in, 64 out). Same
 * arithmetic as cu_weight_elem: q * scale in f32, rounded to bf16. */
static __device__ __forceinline__ uint32_t bf16_pair(float lo, float hi) {
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16);
}

__global__ void q8_0_to_bf16_kernel(const int8_t *qs, const uint16_t *scales, uint4 *out, int64_t groups) {
    for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < groups; g += (int64_t)gridDim.x * blockDim.x) {
        const uint4 raw = ((const uint4 *)qs)[g];
        const float sc = cu_f16(scales[g / 2]);
        const int8_t *q = (const int8_t *)&raw;
        uint32_t o[8];
#pragma unroll
        for (int k = 0; k < 8; k++) o[k] = bf16_pair((float)q[2 * k] * sc, (float)q[2 * k + 1] * sc);
        out[2 * g] = make_uint4(o[0], o[1], o[2], o[3]);
        out[2 * g + 1] = make_uint4(o[4], o[5], o[6], o[7]);
    }
}

__global__ void q4_0_to_bf16_kernel(const uint8_t *qs, const uint16_t *scales, uint4 *out, int64_t blocks) {
    for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b < blocks; b += (int64_t)gridDim.x * blockDim.x) {
        const uint4 raw = ((const uint4 *)qs)[b];
        const float sc = cu_f16(scales[b]);
        const uint8_t *q = (const uint8_t *)&raw;
        uint32_t lo[8], hi[8];
#pragma unroll
        for (int k = 0; k < 8; k++) {
            lo[k] = bf16_pair((float)((q[2 * k] & 15) - 8) * sc, (float)((q[2 * k + 1] & 15) - 8) * sc);
            hi[k] = bf16_pair((float)((q[2 * k] >> 4) - 8) * sc, (float)((q[2 * k + 1] >> 4) - 8) * sc);
        }
        out[4 * b] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
        out[4 * b + 1] = make_uint4(lo[4], lo[5], lo[6], lo[7]);
        out[4 * b + 2] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
        out[4 * b + 3] = make_uint4(hi[4], hi[5], hi[6], hi[7]);
    }
}

cudaError_t cu_weight_to_bf16(cudaStream_t st, const struct cu_weight *w, void *out) {
    int64_t n = w->rows * w->cols;
    if (n <= 0) return cudaSuccess;
    if (cu_dtype_kquant(w->dtype)) return cu_kq_to_bf16(st, w, out);
    bool aligned = ((uintptr_t)w->data % 16) == 0 && ((uintptr_t)out % 16) == 0 && w->cols % 32 == 0;
    if (aligned && w->dtype == CU_Q8_0) {
        q8_0_to_bf16_kernel<<<4 * 132 * 8, 256, 0, st>>>((const int8_t *)w->data, w->scales, (uint4 *)out, n / 16);
        return cudaGetLastError();
    }
    if (aligned && w->dtype == CU_Q4_0) {
        q4_0_to_bf16_kernel<<<4 * 132 * 8, 256, 0, st>>>((const uint8_t *)w->data, w->scales, (uint4 *)out, n / 32);
        return cudaGetLastError();
    }
    weight_to_bf16_kernel<<<4 * 132 * 8, 256, 0, st>>>(*w, (__nv_bfloat16 *)out, n);
    return cudaGetLastError();
}

__global__ void convert_half_kernel(const float *x, void *out, int64_t n, bool to_bf16) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    if (to_bf16)
        ((__nv_bfloat16 *)out)[e] = __float2bfloat16_rn(x[e]);
    else
        ((__half *)out)[e] = __float2half_rn(x[e]);
}

cudaError_t cu_convert_half(cudaStream_t st, const float *x, void *out, int64_t n, bool to_bf16) {
    if (n <= 0) return cudaSuccess;
    convert_half_kernel<<<cu_blocks(n, 256), 256, 0, st>>>(x, out, n, to_bf16);
    return cudaGetLastError();
}

__global__ void embedding_kernel(struct cu_weight w, const int32_t *ids, float *out) {
    int64_t t = blockIdx.x;
    int32_t id = ids[t];
    bool ok = id >= 0 && id < w.rows;
    for (int64_t c = threadIdx.x; c < w.cols; c += blockDim.x)
        out[t * w.cols + c] = ok ? cu_weight_elem(w, id, c) : 0.0f;
}

cudaError_t cu_embedding(cudaStream_t st, const struct cu_weight *w, const int32_t *ids,
                         int64_t n_ids, float *out) {
    if (n_ids <= 0) return cudaSuccess;
    embedding_kernel<<<(unsigned)n_ids, 256, 0, st>>>(*w, ids, out);
    return cudaGetLastError();
}
