/* The staged one-row matvec (decode: bf16, q8_0, q4_K, q6_K): weights travel global ->
 * shared memory by Hopper bulk copies (cp.async.bulk ... mbarrier::complete_tx::bytes) into a
 * ring of stages, so the bytes in flight cost no registers.
 *
 * A block is MS_CW consumer warps and one producer warp. The launch's output rows are
 * cut into tiles of `rs` consecutive rows of one segment (of a SwiGLU pair: rs gate and
 * rs up rows); a tile's rows are a contiguous byte range of the row-major weight (q8_0:
 * and q6_K: a second range of their f16 scales), copied whole into one stage. Block b takes tiles
 * b, b + grid, ... (static on purpose: tiles handed out from a counter made every block
 * end together and lost 5-7%, since the blocks a tile short leave room for the next
 * launch's ring fill; bench/results/cuda-tiles-2026-12-02.md); one producer thread
 * fills the stages (full barrier: expect_tx of
 * the tile's bytes) and refills a stage once the consumer warps have released it
 * (empty barrier, one arrival a warp). The producer reads only weights, so it issues
 * the whole ring before the PDL wait: with one block an SM and a small footprint the
 * block is resident while the kernel before it still runs, and its first tiles stream
 * in meanwhile. After the wait the consumers stage x in shared memory (bf16: f32, after
 * the rms_norm prologue when set; q8_0: int8 and a scale per 32, the rule of
 * mv_quantize_x_q8, so the same int8 x as the register kernel's int8 mode; K-quants:
 * km_put_x4's int8 per 32 with the chunk sums, cu_matvec_kq_multi's x). Each
 * consumer warp then owns whole rows (row r of the block's k-th tile: warp
 * (k * rs + r) % 8): its lanes dot 16-byte chunks c = lane, lane + 32, ... with x
 * (K-quants: 4 lanes a super-block, ms_kq_row), a warp sum, and lane 0 writes the
 * epilogue (cu_matvec_put; its operands loaded before the stage wait). Warps are not
 * synchronized with each other, only through the ring: each waits for every stage and
 * releases it.
 *
 * Measured on the H200 (bench/results/cuda-tma-2026-11-30.md): with two blocks an SM
 * of 100 KiB (the default shape) 4.5% faster than the register kernel on the 8B q8_0
 * model, 7% slower on the 0.6B one; on 8B bf16 1% slower everywhere, 2.4% faster on the
 * q/k/v and attn_o launches alone; on 8B q4_k_m 15% faster (bench/results/
 * cuda-kq-stream-2026-11-30.md). So by default (ms_chosen) q8_0 launches with
 * int8 x and q4_K/q6_K launches, each with rows of >= 4096, and bf16 launches of <= 8192
 * rows of 4096 take it (LLMOPT_CUDA_MV_TMA=0: never, 1: wherever it applies). */
#include "backend/cuda/kquant_dot.cuh"

#include <stdlib.h>
#include <string.h>

#include <algorithm>

CU_TRACE_TU(cu_trace_tu_stream)

#define MS_CW 8                         /* consumer warps */
#define MS_CT (MS_CW * CU_WARP)         /* consumer threads */
#define MS_THREADS (MS_CT + CU_WARP)    /* + the producer warp */
#define MS_MAX_RS 8                     /* rows a tile */
#define MS_MAX_STAGES 8
#ifdef LLMOPT_CUDA_TRACE
#define MS_SMEM_MAX ((227 << 10) - 1024) /* room for the trace's static shared slot */
#else
#define MS_SMEM_MAX (227 << 10)         /* dynamic shared memory a block, at most */
#endif
#define MS_SMEM_DEFAULT (100 << 10)     /* with MS_BLOCKS_PER_SM: the best shape of the 8B q8_0 model A/B */
#define MS_BLOCKS_PER_SM 2              /* (bench/results/cuda-tma-2026-11-30.md, 332.5 / 332.7 / 328.7 tok/s) */

/* Bytes of one weight row of K in the upload layout (cuda_kernels.cuh), and of its
 * separate scales (q8_0: an f16 per 32; q6_K: an f16 per super-block of 256). */
static __host__ __device__ __forceinline__ uint32_t ms_row_bytes(int dt, int64_t K) {
    return (uint32_t)(dt == CU_Q8_0 ? K : dt == CU_Q4_K ? K / 256 * 144 : dt == CU_Q6_K ? K / 256 * 208 : 2 * K);
}
static __host__ __device__ __forceinline__ uint32_t ms_sc_bytes(int dt, int64_t K) {
    return (uint32_t)(dt == CU_Q8_0 ? K / 16 : dt == CU_Q6_K ? K / 128 : 0);
}
/* One row's dot products of a K-quant tile: cu_matvec_kq_multi's lane split and
 * arithmetic (kquant_dot.cuh: 4 lanes a super-block, 64 weights a lane, int8 x, quants
 * centred, every x address a lane constant L plus a stride a pass), on stage row r of
 * each of the NW weights of the stage (their scales, q6_K, after the stage's rs rows).
 * Lane (q, c) takes super-blocks q, q + 8, ... */
template <int D, int NW>
static __device__ __forceinline__ void ms_kq_row(const uint8_t *stg, uint32_t w_bytes, int r, int rs, int64_t K,
                                                 const uint8_t *xs, const km_lane &L, int lane, float (&acc)[NW]) {
    const uint32_t nb = (uint32_t)(K / 256), row_bytes = ms_row_bytes(D, K);
    const uint32_t q = (uint32_t)lane >> 2;
    const int c = lane & 3;
    constexpr uint32_t BB = D == CU_Q4_K ? 144 : 208;
    const uint8_t *wp[NW];
    const uint16_t *dp[NW];
#pragma unroll
    for (int w = 0; w < NW; w++) {
        const uint8_t *base = stg + (size_t)w * w_bytes;
        wp[w] = base + (uint32_t)r * row_bytes + BB * q; /* + 8 BB a pass */
        dp[w] = (const uint16_t *)(base + (uint32_t)rs * row_bytes) + (uint32_t)r * nb + q;
    }
#pragma unroll 2
    for (uint32_t sb = q, p = 0; sb < nb; sb += 8, p++) {
        km_xv v;
        km_x_load<D>(xs, L, p, c, v);
#pragma unroll
        for (int w = 0; w < NW; w++) {
            km_raw R;
            km_load<D, true>(wp[w] + 8 * BB * p, dp[w] + 8 * p, c, R);
            acc[w] += km_dot<D>(R, v, c);
        }
    }
}

struct ms_job {
    struct cu_mv_seg seg[CU_MV_MAX_SEGS];
    int64_t t_end[CU_MV_MAX_SEGS]; /* tiles of segments 0..s, cumulative */
    int n_seg;
    struct cu_weight up;           /* data NULL: no pair */
    int64_t n_tiles;
    int rs, n_stages;              /* rows a tile (<= MS_MAX_RS), stages of the ring */
    uint32_t stage_bytes;          /* stage stride (a multiple of 128) */
    uint32_t ring_off;             /* the ring's offset in dynamic shared memory */
    int evict_first;               /* L2::evict_first hint on the weight copies */
    int wait;                      /* ms_wait's mode */
    int producers;                 /* producer lanes (nst a multiple of it) */
    int row_copies;                /* a bulk copy a row instead of one a tile */
};

/* The start of the dynamic shared memory; x follows it, then the ring at ring_off. */
struct ms_head {
    uint64_t full[MS_MAX_STAGES], empty[MS_MAX_STAGES];
    float red[32];
};

static __device__ __forceinline__ uint32_t ms_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
static __device__ __forceinline__ void ms_bar_init(uint64_t *b, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(ms_addr(b)), "r"(count) : "memory");
}
static __device__ __forceinline__ void ms_expect_tx(uint64_t *b, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(ms_addr(b)), "r"(bytes) : "memory");
}
/* relaxed: a release arrival would first wait for the thread's outstanding global loads
 * and stores (the epilogue's); the stage's shared loads are complete when it is called
 * (their values summed across the warp) */
static __device__ __forceinline__ void ms_arrive_relaxed(uint64_t *b) {
    asm volatile("mbarrier.arrive.relaxed.cta.shared::cta.b64 _, [%0];" ::"r"(ms_addr(b)) : "memory");
}
/* Waits for the phase of parity `parity` of b to complete. mode (ms_tune.wait): 0
 * try_wait (the thread may be suspended until the phase completes or a
 * system-dependent time limit), 1 test_wait (a spin, never suspended), 2 try_wait
 * with a 10 ms suspend-time hint. */
static __device__ __forceinline__ void ms_wait(uint64_t *b, uint32_t parity, int mode) {
    uint32_t done;
    do {
        if (mode == 1)
            asm volatile("{\n\t.reg .pred p;\n\tmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                         "selp.u32 %0, 1, 0, p;\n\t}"
                         : "=r"(done)
                         : "r"(ms_addr(b)), "r"(parity)
                         : "memory");
        else if (mode == 2)
            asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\n\t"
                         "selp.u32 %0, 1, 0, p;\n\t}"
                         : "=r"(done)
                         : "r"(ms_addr(b)), "r"(parity), "r"(10000000u)
                         : "memory");
        else
            asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                         "selp.u32 %0, 1, 0, p;\n\t}"
                         : "=r"(done)
                         : "r"(ms_addr(b)), "r"(parity)
                         : "memory");
    } while (!done);
}
/* bytes (a multiple of 16, both addresses 16-byte aligned) global -> shared, counted on bar */
static __device__ __forceinline__ void ms_copy(void *dst, const void *src, uint32_t bytes, uint64_t *bar,
                                               uint64_t policy, bool hint) {
    if (hint)
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, "
                     "[%3], %4;" ::"r"(ms_addr(dst)),
                     "l"(src), "r"(bytes), "r"(ms_addr(bar)), "l"(policy)
                     : "memory");
    else
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                         ms_addr(dst)),
                     "l"(src), "r"(bytes), "r"(ms_addr(bar))
                     : "memory");
}
/* float4 elements f0 + ct + u * MS_CT (u < MS_XB) of v[0..K) of consumer thread ct into
 * registers, all loads in flight (zeros past K / 4) */
#define MS_XB 4
static __device__ __forceinline__ void ms_load_x(const float *__restrict__ v, int64_t f0, int64_t K,
                                                 float4 (&r)[MS_XB]) {
#pragma unroll
    for (int u = 0; u < MS_XB; u++) {
        const int64_t f = f0 + threadIdx.x + u * MS_CT;
        r[u] = f < K / 4 ? __ldg((const float4 *)v + f) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}
static __device__ __forceinline__ void ms_consumer_sync(void) {
    asm volatile("bar.sync 1, %0;" ::"r"(MS_CT) : "memory");
}

/* DT: bf16, q8_0, q4_K, q6_K, or 0: K-quant segments of either type (the type is
 * per segment, so uniform over a tile). The K-quant kernels are held to the registers
 * of MS_BLOCKS_PER_SM blocks an SM (q6_K took 123 unbounded: one block an SM). */
template <int DT, bool NORM, bool PAIR>
__global__ void __launch_bounds__(MS_THREADS, DT == CU_BF16 || DT == CU_Q8_0 ? 1 : MS_BLOCKS_PER_SM)
    matvec_stream_kernel(const __grid_constant__ struct ms_job job, const float *__restrict__ x) {
    constexpr bool Q8 = DT == CU_Q8_0, KQ = DT == CU_Q4_K || DT == CU_Q6_K || DT == 0;
    constexpr int NW = PAIR ? 2 : 1; /* weights a tile streams */
    extern __shared__ __align__(128) uint8_t ms_smem[];
    struct ms_head *hd = (struct ms_head *)ms_smem;
    uint8_t *xs = ms_smem + sizeof(struct ms_head);
    uint8_t *ring = ms_smem + job.ring_off;
    const int64_t K = job.seg[0].w.cols;
    /* a pair's weights are of one type (segment 0's), so w_bytes is fixed */
    const int dt0 = DT ? DT : job.seg[0].w.dtype;
    const uint32_t w_bytes = (uint32_t)job.rs * (ms_row_bytes(dt0, K) + ms_sc_bytes(dt0, K));
    const int nst = job.n_stages, warp = threadIdx.x / CU_WARP, lane = threadIdx.x % CU_WARP;
    if (threadIdx.x == 0) {
        for (int s = 0; s < nst; s++) {
            ms_bar_init(&hd->full[s], 1);
            ms_bar_init(&hd->empty[s], MS_CW);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    cu_pdl_trigger();
    CU_TRACE_END;
    /* tile t: segment si, first row j0, nr rows */
    auto tile = [&](int64_t t, int &si, int64_t &j0, int &nr) {
        int64_t base = 0;
        si = 0;
        if (job.n_seg > 2 && t >= job.t_end[1]) {
            si = 2;
            base = job.t_end[1];
        } else if (job.n_seg > 1 && t >= job.t_end[0]) {
            si = 1;
            base = job.t_end[0];
        }
        j0 = (t - base) * job.rs;
        const int64_t left = job.seg[si].w.rows - j0;
        nr = left < job.rs ? (int)left : job.rs;
    };
    if (warp == MS_CW) { /* the producers: weights only, so before the PDL wait */
        if (lane >= job.producers) return; /* lane p fills the stages s % producers == p */
        uint64_t policy = 0;
        if (job.evict_first) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
        int i = lane;
        for (int64_t t = blockIdx.x + (int64_t)lane * gridDim.x; t < job.n_tiles;
             t += (int64_t)job.producers * gridDim.x, i += job.producers) {
            const int s = i % nst;
            if (i >= nst) ms_wait(&hd->empty[s], (uint32_t)((i / nst - 1) & 1), job.wait);
            int si, nr;
            int64_t j0;
            tile(t, si, j0, nr);
            const int dt = DT ? DT : job.seg[si].w.dtype;
            const uint32_t row_bytes = ms_row_bytes(dt, K), sc_bytes = ms_sc_bytes(dt, K);
            uint8_t *stg = ring + (size_t)s * job.stage_bytes;
            ms_expect_tx(&hd->full[s], NW * (uint32_t)nr * (row_bytes + sc_bytes));
            /* the tile's rows in one copy (and its scales in another), or a copy a row */
            const int pieces = job.row_copies ? nr : 1, prow = job.row_copies ? 1 : nr;
#pragma unroll
            for (int w = 0; w < NW; w++) {
                const struct cu_weight &wt = w ? job.up : job.seg[si].w;
                uint8_t *dst = stg + (size_t)w * w_bytes;
                for (int k = 0; k < pieces; k++) {
                    const int64_t r0 = j0 + (int64_t)k * prow;
                    ms_copy(dst + (size_t)k * prow * row_bytes, (const uint8_t *)wt.data + (size_t)r0 * row_bytes,
                            (uint32_t)prow * row_bytes, &hd->full[s], policy, job.evict_first);
                    if (sc_bytes)
                        ms_copy(dst + (size_t)job.rs * row_bytes + (size_t)k * prow * sc_bytes,
                                (const uint8_t *)wt.scales + (size_t)r0 * sc_bytes, (uint32_t)prow * sc_bytes,
                                &hd->full[s], policy, job.evict_first);
                }
            }
        }
        return;
    }
    /* the consumers: x (after the previous kernel) into shared memory, MS_XB float4 a
     * thread at a time (all in flight). With the rms_norm prologue and rows of up to
     * MS_XB * 4 * MS_CT = 4096 elements, the sum of squares and the staging read the same
     * registers (x was read twice: 437 against 425 tok/s on 8B q4_k_m, with the q4_K
     * high nibbles in place and the split merge of the decode attention). Measured and
     * not taken (bench/results/cuda-trace-2026-12-01.md): three such chunks in flight at
     * once for rows of 12288 (ffn_down), 415 tok/s; the norm weights loaded before the
     * PDL wait, no better than without; q8_0 pairs took 95 -> 109 registers with either. */
    cu_pdl_wait();
    const int ct = threadIdx.x;
    const float *nw = job.seg[0].ep.norm_w;
    float4 v[MS_XB];
    const bool held = NORM && K / 4 <= MS_XB * MS_CT; /* v keeps all of x after the sum */
    float sc = 1.0f;
    if constexpr (NORM) { /* mv_sumsq's operations and order (the same 256 threads) */
        float ss = 0.0f;
        for (int64_t f0 = 0; f0 < K / 4; f0 += MS_XB * MS_CT) {
            ms_load_x(x, f0, K, v);
#pragma unroll
            for (int u = 0; u < MS_XB; u++)
                if (f0 + ct + u * MS_CT < K / 4) ss += v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w;
        }
        sc = 1.0f / sqrtf(cu_warps_sum(ss, hd->red, MS_CW, 1) / (float)K + job.seg[0].ep.norm_eps);
    }
    /* x (times sc * nw) into shared memory: f32; q8_0 int8 by mv_put_x_q8 (the rule and
     * thread layout of mv_quantize_x_q8); K-quants by km_put_x4 */
    for (int64_t f0 = 0; f0 < K / 4; f0 += MS_XB * MS_CT) {
        float4 w[MS_XB];
        if (!held) ms_load_x(x, f0, K, v);
        if constexpr (NORM) ms_load_x(nw, f0, K, w);
#pragma unroll
        for (int u = 0; u < MS_XB; u++) {
            if (f0 + u * MS_CT >= K / 4) break; /* uniform: whole warps shuffle */
            const int64_t f = f0 + ct + u * MS_CT;
            const bool in = f < K / 4;
            float4 a = v[u];
            if constexpr (NORM) a = make_float4(a.x * sc * w[u].x, a.y * sc * w[u].y, a.z * sc * w[u].z, a.w * sc * w[u].w);
            if constexpr (Q8)
                mv_put_x_q8(in ? a : make_float4(0.0f, 0.0f, 0.0f, 0.0f), in, f, (uint32_t *)xs, (float *)(xs + K));
            else if constexpr (KQ) {
                if (in) km_put_x4(a, f, xs, K); /* warp-uniform: K % 256 == 0 */
            } else if (in)
                ((float4 *)xs)[f] = a;
        }
    }
    ms_consumer_sync();
    const int64_t n_chunks = Q8 ? K / 16 : K / 8; /* 16-byte chunks a row (bf16, q8_0) */
    const uint32_t row_bytes = ms_row_bytes(DT, K); /* bf16, q8_0 */
    /* Every warp waits for every stage and releases it (one arrival each), but owns
     * whole rows: slot k * rs + r (row r of the block's k-th tile) belongs to warp
     * (k * rs + r) % MS_CW, at most one row a tile (rs <= MS_CW). No barrier between
     * warps: each runs ahead as far as the filled stages let it, so the latencies of
     * one row's chain (stage wait, dots, warp sum, epilogue) overlap across warps. */
    const int rs = job.rs;
    km_lane kl4, kl6; /* K-quants: the lane constants of ms_kq_row */
    if constexpr (KQ) {
        if constexpr (DT != CU_Q6_K) kl4 = km_lane_of<CU_Q4_K>(K, lane);
        if constexpr (DT != CU_Q4_K) kl6 = km_lane_of<CU_Q6_K>(K, lane);
    }
    int k = 0;
    for (int64_t t = blockIdx.x; t < job.n_tiles; t += gridDim.x, k++) {
        const int s = k % nst;
        const int r = warp - (int)(((int64_t)k * rs) % MS_CW); /* this warp's row of the tile, if in [0, nr) */
        int si, nr;
        int64_t j0;
        tile(t, si, j0, nr);
        const bool mine = r >= 0 && r < nr; /* warp-uniform */
        const struct cu_mv_seg &sg = job.seg[si];
        struct cu_mv_epi epi = {0.0f, 1.0f, 0.0f};
        if (mine && lane == 0) epi = cu_matvec_epi<PAIR>(j0 + r, 0, sg.w.rows, sg.ep); /* in flight during the dots */
        ms_wait(&hd->full[s], (uint32_t)((k / nst) & 1), job.wait);
        float acc[NW] = {};
        if (mine) {
            const uint8_t *stg = ring + (size_t)s * job.stage_bytes;
            if constexpr (KQ) {
                if ((DT ? DT : sg.w.dtype) == CU_Q4_K)
                    ms_kq_row<CU_Q4_K, NW>(stg, w_bytes, r, rs, K, xs, kl4, lane, acc);
                else
                    ms_kq_row<CU_Q6_K, NW>(stg, w_bytes, r, rs, K, xs, kl6, lane, acc);
            } else {
#pragma unroll 4
                for (int64_t c = lane; c < n_chunks; c += CU_WARP) {
                    if constexpr (Q8) {
                        const uint4 xv = ((const uint4 *)xs)[c];
                        const uint32_t xq[4] = {xv.x, xv.y, xv.z, xv.w};
                        const float xd = ((const float *)(xs + K))[c / 2];
#pragma unroll
                        for (int w = 0; w < NW; w++) {
                            const uint8_t *q = stg + (size_t)w * w_bytes;
                            const uint16_t *scl = (const uint16_t *)(q + (size_t)rs * row_bytes);
                            const uint4 raw = ((const uint4 *)(q + (size_t)r * row_bytes))[c];
                            acc[w] += (float)mv_dot16(raw, xq) * (cu_f16(scl[(size_t)r * (K / 32) + c / 2]) * xd);
                        }
                    } else {
                        const float4 x0 = ((const float4 *)xs)[2 * c], x1 = ((const float4 *)xs)[2 * c + 1];
#pragma unroll
                        for (int w = 0; w < NW; w++) {
                            const uint4 u = ((const uint4 *)(stg + (size_t)w * w_bytes + (size_t)r * row_bytes))[c];
                            acc[w] += __uint_as_float(u.x << 16) * x0.x + __uint_as_float(u.x & 0xffff0000u) * x0.y +
                                      __uint_as_float(u.y << 16) * x0.z + __uint_as_float(u.y & 0xffff0000u) * x0.w +
                                      __uint_as_float(u.z << 16) * x1.x + __uint_as_float(u.z & 0xffff0000u) * x1.y +
                                      __uint_as_float(u.w << 16) * x1.z + __uint_as_float(u.w & 0xffff0000u) * x1.w;
                        }
                    }
                }
            }
#pragma unroll
            for (int w = 0; w < NW; w++) acc[w] = cu_warp_sum(acc[w]);
        }
        __syncwarp();
        if (lane == 0) ms_arrive_relaxed(&hd->empty[s]); /* the stage is read: the producer may refill it */
        if (mine && lane == 0) cu_matvec_put<PAIR>(acc[0], PAIR ? acc[NW - 1] : 0.0f, epi, j0 + r, 0, sg.w.rows, 1, sg.y, sg.ep, sg.head_dim);
    }
}

/* ---- launch ----------------------------------------------------------------------- */

static int ms_mode = -2; /* -2: $LLMOPT_CUDA_MV_TMA not read yet; -1 the default */
static struct {
    bool set; /* by cu_matvec_tma_tune, or $LLMOPT_CUDA_MV_TMA_TUNE read */
    int rs, smem_kb, blocks_per_sm, evict_first, max_blocks, wait, producers, row_copies;
} ms_tune;

extern "C" void cu_matvec_tma(int mode) {
    ms_mode = mode == 0 || mode == 1 ? mode : -1;
}

extern "C" void cu_matvec_tma_tune(int rows_per_tile, int smem_kb, int blocks_per_sm, int evict_first, int max_blocks,
                                   int wait, int producers, int row_copies) {
    ms_tune.set = true;
    ms_tune.rs = rows_per_tile == 1 || rows_per_tile == 2 || rows_per_tile == 4 || rows_per_tile == 8 ? rows_per_tile : 0;
    ms_tune.smem_kb = smem_kb >= 8 && smem_kb <= (MS_SMEM_MAX >> 10) ? smem_kb : 0;
    ms_tune.blocks_per_sm = blocks_per_sm >= 1 && blocks_per_sm <= 4 ? blocks_per_sm : 0;
    ms_tune.evict_first = evict_first == 1;
    ms_tune.max_blocks = max_blocks > 0 ? max_blocks : 0;
    ms_tune.wait = wait >= 0 && wait <= 2 ? wait : 0;
    ms_tune.producers = producers == 2 || producers == 4 ? producers : 1;
    ms_tune.row_copies = row_copies == 1;
}

/* $LLMOPT_CUDA_MV_TMA_TUNE=rs,smem_kb,blocks_per_sm,wait,producers,row_copies (model A/B;
 * read once, unless cu_matvec_tma_tune came first) */
static void ms_tune_read(void) {
    if (ms_tune.set) return;
    int v[6] = {0, 0, 0, -1, 1, 0};
    const char *e = getenv("LLMOPT_CUDA_MV_TMA_TUNE");
    for (int k = 0; e && *e && k < 6; k++) {
        v[k] = atoi(e);
        e = strchr(e, ',');
        if (e) e++;
    }
    cu_matvec_tma_tune(v[0], v[1], v[2], -1, 0, v[3], v[4], v[5]);
}

/* Whether a one-row matvec of this weight type (segment 0's), row length K and `streamed`
 * weight rows (all segments, both halves of a pair) takes the staged kernel:
 * cu_matvec_tma's mode, else $LLMOPT_CUDA_MV_TMA=0|1 read once (0 never, 1 wherever it
 * applies), else where it measured faster in the models. */
static bool ms_chosen(int dtype, int64_t K, int64_t streamed, bool q8_int8) {
    if (ms_mode == -2) {
        const char *e = getenv("LLMOPT_CUDA_MV_TMA");
        cu_matvec_tma(e && *e ? atoi(e) : -1);
    }
    if (ms_mode >= 0) return ms_mode == 1;
    /* the default, where it measured faster in the models (bench/results/cuda-tma-2026-11-30.md):
     * q8_0 with int8 x and rows of >= 4096 (every 8B launch: 319.4 -> 333.5 tok/s; no 0.6B
     * launch, where the staged kernel lost: 1,361 -> 1,260); bf16 rows of 4096 in launches
     * of at most 8192 rows (the 8B q/k/v and attn_o: 218.4 -> 223.6 tok/s; with ffn_down
     * too 215.3, every bf16 launch 214.1 / 213.5; other row lengths not measured) */
    if (dtype == CU_BF16) return K == 4096 && streamed <= 8192;
    /* K-quants: rows of >= 4096 (every 8B q4_k_m launch: 333.1 / 335.7 -> 386.2 / 383.0
     * tok/s; staged only for SwiGLU pairs and q6_K launches measured 342; the 0.6B
     * launches, K <= 3072, lost with the staged pairs: 1,054.7 -> 1,011.5) */
    if (km_type_ok(dtype)) return K >= 4096;
    return dtype == CU_Q8_0 && q8_int8 && K >= 4096;
}

static bool ms_aligned(const void *p) {
    return ((uintptr_t)p % 16) == 0;
}

template <int DT, bool NORM, bool PAIR>
static cudaError_t ms_launch(cudaStream_t st, const struct ms_job &job, const float *x, unsigned grid, size_t smem) {
    auto kern = matvec_stream_kernel<DT, NORM, PAIR>;
    static bool attr = false;
    if (!attr) {
        const cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, MS_SMEM_MAX);
        if (e != cudaSuccess) return e;
        attr = true;
    }
    return cu_launch_pdl(kern, dim3(grid), dim3(MS_THREADS), smem, st, job, x);
}

template <int DT>
static cudaError_t ms_launch_dt(cudaStream_t st, const struct ms_job &job, const float *x, unsigned grid,
                                size_t smem) {
    const bool norm = job.seg[0].ep.norm_w != NULL, pair = job.up.data != NULL;
    if constexpr (DT != 0) { /* (mixed segment types are never a pair) */
        if (norm && pair) return ms_launch<DT, true, true>(st, job, x, grid, smem);
        if (pair) return ms_launch<DT, false, true>(st, job, x, grid, smem);
    }
    if (norm) return ms_launch<DT, true, false>(st, job, x, grid, smem);
    return ms_launch<DT, false, false>(st, job, x, grid, smem);
}

cudaError_t cu_matvec_stream(cudaStream_t st, const float *x, const struct cu_mv_seg *segs, int n_seg,
                             const struct cu_weight *up, bool q8_int8) {
    const int dt = segs[0].w.dtype;
    const int64_t K = segs[0].w.cols;
    const bool kq = km_type_ok(dt);
    /* q8_0: whole 16-byte runs of scales a row; K-quants: whole super-blocks, q6_K also
     * 16-byte runs of super-block scales (K % 2048) */
    if (n_seg < 1 || n_seg > CU_MV_MAX_SEGS || !(dt == CU_BF16 || (dt == CU_Q8_0 && q8_int8) || kq) ||
        K % (dt == CU_BF16 ? 8 : 256) || !ms_aligned(x) || (segs[0].ep.norm_w && !ms_aligned(segs[0].ep.norm_w)))
        return cudaErrorNotSupported;
    int64_t streamed = up ? 2 * up->rows : 0; /* weight rows the launch streams */
    for (int k = 0; k < n_seg; k++) streamed += up ? 0 : segs[k].w.rows;
    if (!ms_chosen(dt, K, streamed, q8_int8)) return cudaErrorNotSupported;
    struct ms_job job;
    memset(&job, 0, sizeof job);
    job.n_seg = n_seg;
    size_t row_max = 0; /* bytes of the largest weight row and its scales (segment types may differ: q4_K, q6_K) */
    bool mixed = false;
    for (int k = 0; k < n_seg; k++) {
        const struct cu_weight &w = segs[k].w;
        const bool same = w.dtype == dt || (kq && km_type_ok(w.dtype));
        if (!same || w.cols != K || w.rows < 1 || !ms_aligned(w.data) || (ms_sc_bytes(w.dtype, K) && !ms_aligned(w.scales)) ||
            (w.dtype == CU_Q6_K && K % 2048))
            return cudaErrorNotSupported;
        mixed = mixed || w.dtype != dt;
        row_max = std::max(row_max, (size_t)ms_row_bytes(w.dtype, K) + ms_sc_bytes(w.dtype, K));
        job.seg[k] = segs[k];
    }
    if (up) {
        if (up->dtype != dt || !ms_aligned(up->data) || (ms_sc_bytes(dt, K) && !ms_aligned(up->scales)))
            return cudaErrorNotSupported;
        job.up = *up;
    }
    const size_t unit = row_max * (up ? 2 : 1); /* stage bytes of one tile row */
    const size_t x_bytes = dt == CU_Q8_0 ? mv_xq_smem(K) : kq ? km_row_bytes(K) : 4 * (size_t)K;
    const size_t ring_off = (sizeof(struct ms_head) + x_bytes + 127) & ~(size_t)127;
    if (ring_off + 2 * ((unit + 127) & ~(size_t)127) > MS_SMEM_MAX) return cudaErrorNotSupported;
    ms_tune_read();
    size_t budget = ms_tune.smem_kb ? (size_t)ms_tune.smem_kb << 10 : MS_SMEM_DEFAULT;
    if (budget > MS_SMEM_MAX) budget = MS_SMEM_MAX;
    const size_t ring = budget > ring_off + 2 * ((unit + 127) & ~(size_t)127) ? budget - ring_off
                                                                               : 2 * ((unit + 127) & ~(size_t)127);
    /* rows a tile: the most (<= 8) that leave 4 stages in the ring (K-quant rows of <=
     * 4096: 2 stages), at least 2 */
    int rs = ms_tune.rs ? ms_tune.rs : MS_MAX_RS;
    const int min_stages = ms_tune.rs || (kq && K <= 4096) ? 2 : 4;
    while (rs > 1 && min_stages * ((rs * unit + 127) & ~(size_t)127) > ring) rs /= 2;
    const size_t stage = (rs * unit + 127) & ~(size_t)127;
    int nst = (int)(ring / stage);
    if (nst > MS_MAX_STAGES) nst = MS_MAX_STAGES;
    int producers = ms_tune.producers;
    while (producers > nst) producers /= 2;
    nst -= nst % producers; /* each producer lane its own stages */
    job.rs = rs;
    job.n_stages = nst;
    job.stage_bytes = (uint32_t)stage;
    job.ring_off = (uint32_t)ring_off;
    job.evict_first = ms_tune.evict_first;
    job.wait = ms_tune.wait;
    job.producers = producers;
    job.row_copies = ms_tune.row_copies;
    for (int k = 0; k < n_seg; k++) {
        job.n_tiles += (segs[k].w.rows + rs - 1) / rs;
        job.t_end[k] = job.n_tiles;
    }
    int64_t cap = (int64_t)(ms_tune.blocks_per_sm ? ms_tune.blocks_per_sm : MS_BLOCKS_PER_SM) * cu_sm_count();
    if (ms_tune.max_blocks && ms_tune.max_blocks < cap) cap = ms_tune.max_blocks;
    const unsigned grid = (unsigned)(job.n_tiles < cap ? job.n_tiles : cap);
    const size_t smem = ring_off + (size_t)nst * stage;
    if (mixed) return ms_launch_dt<0>(st, job, x, grid, smem);
    switch (dt) {
    case CU_Q8_0: return ms_launch_dt<CU_Q8_0>(st, job, x, grid, smem);
    case CU_Q4_K: return ms_launch_dt<CU_Q4_K>(st, job, x, grid, smem);
    case CU_Q6_K: return ms_launch_dt<CU_Q6_K>(st, job, x, grid, smem);
    default: return ms_launch_dt<CU_BF16>(st, job, x, grid, smem);
    }
}
