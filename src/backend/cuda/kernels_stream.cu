/* The staged one-row matvec (decode: bf16, q8_0, q4_K, q6_K): weights travel global ->
 * shared memory by Hopper bulk copies (cp.async.bulk ... mbarrier::complete_tx::bytes) into a
 * ring of stages, so the bytes in flight cost no registers.
 *
 * A block is MS_CW consumer warps and one producer warp. The launch's output rows are
 * cut into tiles of `rs` consecutive rows of one segment (of a SwiGLU pair: rs gate and
 * rs up rows); a tile's rows are a contiguous byte range of the row-major weight (q8_0:
 * and q6_K: a second range of their f16 scales), copied whole into one stage. Block b takes tiles
 * b, b + grid, ...; one producer thread fills the stages (full barrier: expect_tx of
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

#define MS_CW 8                         /* consumer warps */
#define MS_CT (MS_CW * CU_WARP)         /* consumer threads */
#define MS_THREADS (MS_CT + CU_WARP)    /* + the producer warp */
#define MS_MAX_RS 8                     /* rows a tile */
#define MS_MAX_STAGES 8
#define MS_SMEM_MAX (227 << 10)         /* dynamic shared memory a block, at most */
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

/* One launch's products (a job): its output rows cut into tiles of rs rows. */
struct ms_job {
    struct cu_mv_seg seg[CU_MV_MAX_SEGS];
    int64_t t_end[CU_MV_MAX_SEGS]; /* tiles of segments 0..s, cumulative */
    int n_seg;
    struct cu_weight up;           /* data NULL: no pair */
    const float *x;                /* (K) the row the job multiplies (before the rms_norm prologue) */
    int64_t n_tiles;
    int rs;                        /* rows a tile (<= MS_MAX_RS) */
};

/* The ring of a launch, shared by the jobs of a chain: ring_bytes of shared memory that
 * tiles fill in order, each at the end of the one before or, where it would not fit
 * before the ring's end, at its start (ms_place), so jobs of different tile sizes use the
 * whole ring. Tile i has the barrier pair i % MS_MAX_STAGES (so at most that many tiles
 * are in flight). */
struct ms_ring {
    uint32_t ring_bytes;           /* a multiple of 128 */
    uint32_t ring_off;             /* the ring's offset in dynamic shared memory */
    int evict_first;               /* L2::evict_first hint on the weight copies */
    int wait;                      /* ms_wait's mode */
    int row_copies;                /* a bulk copy a row instead of one a tile */
};

/* A chain: consecutive jobs of a decode step in one launch (cu_matvec_chain_*). Job j's
 * consumers start after every block has finished job j - 1 (a grid-wide counter in
 * sync[j - 1]); the producers stream job j's weights meanwhile. */
#define MS_MAX_JOBS 6
struct ms_chain {
    struct ms_ring ring;
    int n_jobs;
    uint32_t *sync;                /* (n_jobs) counters, zero at launch; the last block out zeroes them */
    int backoff_ns;                /* sleep between polls of a counter ($LLMOPT_CUDA_MV_CHAIN_SLEEP; 0: spin) */
    struct ms_job job[MS_MAX_JOBS];
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
 * registers, all loads in flight (zeros past K / 4). x goes through L2 only (ld.global.cg):
 * in a chain it was written by other blocks of the same launch, which the non-coherent
 * read-only path must not see. */
#define MS_XB 4
template <bool CG>
static __device__ __forceinline__ void ms_load_x(const float *__restrict__ v, int64_t f0, int64_t K,
                                                 float4 (&r)[MS_XB]) {
#pragma unroll
    for (int u = 0; u < MS_XB; u++) {
        const int64_t f = f0 + threadIdx.x + u * MS_CT;
        r[u] = f >= K / 4 ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : CG ? __ldcg((const float4 *)v + f) : __ldg((const float4 *)v + f);
    }
}
static __device__ __forceinline__ void ms_consumer_sync(void) {
    asm volatile("bar.sync 1, %0;" ::"r"(MS_CT) : "memory");
}

/* Tiles of the job that this block takes: blockIdx.x, + gridDim.x, ... */
static __device__ __forceinline__ int ms_block_tiles(const struct ms_job &job) {
    return job.n_tiles > (int64_t)blockIdx.x ? (int)((job.n_tiles - 1 - (int64_t)blockIdx.x) / gridDim.x + 1) : 0;
}

/* Tile t of the job: segment si, first row j0, nr rows. */
static __device__ __forceinline__ void ms_tile(const struct ms_job &job, int64_t t, int &si, int64_t &j0, int &nr) {
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
}

/* Bytes of a tile in the ring: rs rows of the tile's segment type (both weights of a
 * pair), rounded up to 128. */
template <int DT>
static __device__ __forceinline__ uint32_t ms_tile_bytes(const struct ms_job &job, int si) {
    const int dt = DT ? DT : job.seg[si].w.dtype;
    const int64_t K = job.seg[0].w.cols;
    const uint32_t b = (job.up.data ? 2u : 1u) * (uint32_t)job.rs * (ms_row_bytes(dt, K) + ms_sc_bytes(dt, K));
    return (b + 127u) & ~127u;
}

/* The offset of the next tile of `bytes`: after the previous one (whose end is `end`), or
 * at the ring's start where it would not fit before its end. Producer and consumers walk
 * the same tiles in the same order, so they place them alike. */
static __device__ __forceinline__ uint32_t ms_place(uint32_t &end, uint32_t bytes, uint32_t ring_bytes) {
    const uint32_t off = end + bytes > ring_bytes ? 0u : end;
    end = off + bytes;
    return off;
}

/* The producer's view of the ring across the jobs of a launch: the next tile's index,
 * the end of the last one placed, the oldest tile not yet seen released, and where the
 * tiles in flight lie. */
struct ms_prod {
    int i, tail;
    uint32_t end;
    uint32_t off[MS_MAX_STAGES], bytes[MS_MAX_STAGES];
};

/* The producer thread of a block: fills the ring with the block's tiles of one job, in
 * order after every tile of the jobs before. Before a tile is copied, it waits for the
 * release of the oldest tiles in flight until its barrier pair is free and no tile in
 * flight overlaps its bytes (tiles are released in order, and the ring is filled in
 * order, so those are the oldest). Weights only, so it runs before the PDL wait and ahead
 * of the consumers' grid-wide waits. */
template <int DT>
static __device__ __forceinline__ void ms_produce(const struct ms_ring &R, const struct ms_job &job, struct ms_head *hd,
                                                  uint8_t *ring, uint64_t policy, struct ms_prod &P) {
    constexpr int S = MS_MAX_STAGES;
    const int nb = ms_block_tiles(job);
    const int64_t K = job.seg[0].w.cols;
    const int NW = job.up.data ? 2 : 1;
    const int dt0 = DT ? DT : job.seg[0].w.dtype; /* a pair's weights are of one type */
    const uint32_t w_bytes = (uint32_t)job.rs * (ms_row_bytes(dt0, K) + ms_sc_bytes(dt0, K));
    for (int m = 0; m < nb; m++, P.i++) {
        const int64_t t = blockIdx.x + (int64_t)m * gridDim.x;
        int si, nr;
        int64_t j0;
        ms_tile(job, t, si, j0, nr);
        const uint32_t bytes = ms_tile_bytes<DT>(job, si);
        const uint32_t off = ms_place(P.end, bytes, R.ring_bytes);
        while (P.tail < P.i) {
            bool busy = P.i - P.tail >= S;
            for (int q = P.tail; q < P.i && !busy; q++)
                busy = off < P.off[q % S] + P.bytes[q % S] && P.off[q % S] < off + bytes;
            if (!busy) break;
            ms_wait(&hd->empty[P.tail % S], (uint32_t)((P.tail / S) & 1), R.wait);
            P.tail++;
        }
        const int s = P.i % S;
        P.off[s] = off;
        P.bytes[s] = bytes;
        const int dt = DT ? DT : job.seg[si].w.dtype;
        const uint32_t row_bytes = ms_row_bytes(dt, K), sc_bytes = ms_sc_bytes(dt, K);
        uint8_t *stg = ring + off;
        ms_expect_tx(&hd->full[s], NW * (uint32_t)nr * (row_bytes + sc_bytes));
        /* the tile's rows in one copy (and its scales in another), or a copy a row */
        const int pieces = R.row_copies ? nr : 1, prow = R.row_copies ? 1 : nr;
        for (int w = 0; w < NW; w++) {
            const struct cu_weight &wt = w ? job.up : job.seg[si].w;
            uint8_t *dst = stg + (size_t)w * w_bytes;
            for (int k = 0; k < pieces; k++) {
                const int64_t r0 = j0 + (int64_t)k * prow;
                ms_copy(dst + (size_t)k * prow * row_bytes, (const uint8_t *)wt.data + (size_t)r0 * row_bytes,
                        (uint32_t)prow * row_bytes, &hd->full[s], policy, R.evict_first);
                if (sc_bytes)
                    ms_copy(dst + (size_t)job.rs * row_bytes + (size_t)k * prow * sc_bytes,
                            (const uint8_t *)wt.scales + (size_t)r0 * sc_bytes, (uint32_t)prow * sc_bytes,
                            &hd->full[s], policy, R.evict_first);
            }
        }
    }
}

/* The consumer warps' part of one job, after x is ready in global memory: x (after the
 * rms_norm prologue with NORM) into shared memory, then the block's tiles k0, k0 + 1, ...
 * of the launch from the ring (end: where the warp's walk of the ring placed the last
 * tile, ms_place). Returns k0 plus the job's tiles of this block. CG: x is read through
 * L2 only (a chain's). */
template <int DT, bool NORM, bool PAIR, bool CG>
static __device__ __forceinline__ int ms_consume(const struct ms_ring &R, const struct ms_job &job, struct ms_head *hd,
                                                 uint8_t *xs, uint8_t *ring, int k0, uint32_t &end) {
    constexpr bool Q8 = DT == CU_Q8_0, KQ = DT == CU_Q4_K || DT == CU_Q6_K || DT == 0;
    constexpr int NW = PAIR ? 2 : 1; /* weights a tile streams */
    const int64_t K = job.seg[0].w.cols;
    const float *x = job.x;
    const int dt0 = DT ? DT : job.seg[0].w.dtype;
    const uint32_t w_bytes = (uint32_t)job.rs * (ms_row_bytes(dt0, K) + ms_sc_bytes(dt0, K));
    const int warp = threadIdx.x / CU_WARP, lane = threadIdx.x % CU_WARP;
    const int ct = threadIdx.x;
    const int nb = ms_block_tiles(job);
    if (nb == 0) return k0; /* block-uniform: none of the job's tiles is this block's */
    const float *nw = job.seg[0].ep.norm_w;
    float sc = 1.0f;
    if constexpr (NORM) { /* mv_sumsq's operations and order (the same 256 threads) */
        float ss = 0.0f;
        for (int64_t f0 = 0; f0 < K / 4; f0 += MS_XB * MS_CT) {
            float4 v[MS_XB];
            ms_load_x<CG>(x, f0, K, v);
#pragma unroll
            for (int u = 0; u < MS_XB; u++)
                if (f0 + ct + u * MS_CT < K / 4) ss += v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w;
        }
        sc = 1.0f / sqrtf(cu_warps_sum(ss, hd->red, MS_CW, 1) / (float)K + job.seg[0].ep.norm_eps);
    }
    /* x (times sc * nw) into shared memory: f32; q8_0 int8 by mv_put_x_q8 (the rule and
     * thread layout of mv_quantize_x_q8); K-quants by km_put_x4 */
    for (int64_t f0 = 0; f0 < K / 4; f0 += MS_XB * MS_CT) {
        float4 v[MS_XB], w[MS_XB];
        ms_load_x<CG>(x, f0, K, v);
        if constexpr (NORM) ms_load_x<false>(nw, f0, K, w);
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
    for (int m = 0; m < nb; m++) {
        const int k = k0 + m;
        const int64_t t = blockIdx.x + (int64_t)m * gridDim.x;
        const int s = k % MS_MAX_STAGES;
        const int r = warp - (k * rs) % MS_CW; /* this warp's row of the tile, if in [0, nr) */
        int si, nr;
        int64_t j0;
        ms_tile(job, t, si, j0, nr);
        const uint32_t off = ms_place(end, ms_tile_bytes<DT>(job, si), R.ring_bytes);
        const bool mine = r >= 0 && r < nr; /* warp-uniform */
        const struct cu_mv_seg &sg = job.seg[si];
        struct cu_mv_epi epi = {0.0f, 1.0f, 0.0f};
        if (mine && lane == 0) epi = cu_matvec_epi<PAIR>(j0 + r, 0, sg.w.rows, sg.ep); /* in flight during the dots */
        ms_wait(&hd->full[s], (uint32_t)((k / MS_MAX_STAGES) & 1), R.wait);
        float acc[NW] = {};
        if (mine) {
            const uint8_t *stg = ring + off;
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
    return k0 + nb;
}

/* The barriers of the ring (one thread), then every thread of the block. */
static __device__ __forceinline__ void ms_ring_init(struct ms_head *hd) {
    if (threadIdx.x == 0) {
        for (int s = 0; s < MS_MAX_STAGES; s++) {
            ms_bar_init(&hd->full[s], 1);
            ms_bar_init(&hd->empty[s], MS_CW);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
}

static __device__ __forceinline__ uint64_t ms_policy(const struct ms_ring &R) {
    uint64_t policy = 0;
    if (R.evict_first) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}

/* DT: bf16, q8_0, q4_K, q6_K, or 0: K-quant segments of either type (the type is
 * per segment, so uniform over a tile). Held to the registers of MS_BLOCKS_PER_SM blocks
 * an SM: unbounded, q6_K took 123 and q8_0 108, and either ran one block an SM (q8_0:
 * the gate/up pair 28.1 -> 46.6 us in the lab, bench/results/cuda-chain-2026-12-01.md). */
template <int DT, bool NORM, bool PAIR>
__global__ void __launch_bounds__(MS_THREADS, MS_BLOCKS_PER_SM)
    matvec_stream_kernel(const __grid_constant__ struct ms_ring R, const __grid_constant__ struct ms_job job) {
    extern __shared__ __align__(128) uint8_t ms_smem[];
    struct ms_head *hd = (struct ms_head *)ms_smem;
    const int warp = threadIdx.x / CU_WARP, lane = threadIdx.x % CU_WARP;
    ms_ring_init(hd);
    cu_pdl_trigger();
    if (warp == MS_CW) { /* the producer: weights only, so before the PDL wait */
        if (lane == 0) {
            struct ms_prod P = {};
            ms_produce<DT>(R, job, hd, ms_smem + R.ring_off, ms_policy(R), P);
        }
        return;
    }
    cu_pdl_wait(); /* x and the epilogue's operands are the kernels' before */
    uint32_t end = 0;
    ms_consume<DT, NORM, PAIR, false>(R, job, hd, ms_smem + sizeof(struct ms_head), ms_smem + R.ring_off, 0, end);
}

/* Thread 0 of the consumers, between two jobs of a chain: the block's results of the job
 * are stored (the consumer barrier before this), made visible at device scope, and
 * counted; then it waits until every block of the grid has counted, and the barrier after
 * this lets the others read what they stored (the acquire). Every block of the launch is
 * resident at once (cu_matvec_chain_flush sizes the grid by the occupancy), so the wait
 * ends. */
static __device__ __forceinline__ void ms_grid_sync(uint32_t *counter, int backoff_ns) {
    __threadfence();
    atomicAdd(counter, 1u);
    uint32_t seen;
    for (;;) {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
        if (seen >= gridDim.x) break;
        if (backoff_ns) __nanosleep(backoff_ns);
    }
    __threadfence();
}

/* Held to the registers of two blocks an SM (mixed K-quants took 117 unbounded), the
 * residency its grid is sized by. */
template <int DT>
__global__ void __launch_bounds__(MS_THREADS, MS_BLOCKS_PER_SM) matvec_chain_kernel(const __grid_constant__ struct ms_chain c) {
    extern __shared__ __align__(128) uint8_t ms_smem[];
    struct ms_head *hd = (struct ms_head *)ms_smem;
    uint8_t *xs = ms_smem + sizeof(struct ms_head), *ring = ms_smem + c.ring.ring_off;
    const int warp = threadIdx.x / CU_WARP, lane = threadIdx.x % CU_WARP;
    ms_ring_init(hd);
    cu_pdl_trigger();
    if (warp == MS_CW) { /* weights of every job in order, as far ahead as the ring lets them */
        if (lane != 0) return;
        const uint64_t policy = ms_policy(c.ring);
        struct ms_prod P = {};
        for (int j = 0; j < c.n_jobs; j++) ms_produce<DT>(c.ring, c.job[j], hd, ring, policy, P);
        return;
    }
    cu_pdl_wait(); /* the first job's x and every operand from before the launch */
    int k = 0;
    uint32_t end = 0;
    for (int j = 0; j < c.n_jobs; j++) {
        if (j > 0) { /* job j's x (and residual) are earlier jobs' results, from every block */
            ms_consumer_sync();
            if (threadIdx.x == 0) ms_grid_sync(&c.sync[j - 1], c.backoff_ns);
            ms_consumer_sync();
        }
        const struct ms_job &job = c.job[j];
        const bool norm = job.seg[0].ep.norm_w != NULL, pair = job.up.data != NULL;
        if (norm && pair) k = ms_consume<DT, true, true, true>(c.ring, job, hd, xs, ring, k, end);
        else if (pair) k = ms_consume<DT, false, true, true>(c.ring, job, hd, xs, ring, k, end);
        else if (norm) k = ms_consume<DT, true, false, true>(c.ring, job, hd, xs, ring, k, end);
        else k = ms_consume<DT, false, false, true>(c.ring, job, hd, xs, ring, k, end);
    }
    /* the last block out zeroes the counters for the next launch that uses them */
    ms_consumer_sync();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(&c.sync[c.n_jobs - 1], 1u) == gridDim.x - 1)
            for (int j = 0; j < c.n_jobs; j++) atomicExch(&c.sync[j], 0u);
    }
}

/* ---- launch ----------------------------------------------------------------------- */

static int ms_mode = -2; /* -2: $LLMOPT_CUDA_MV_TMA not read yet; -1 the default */
static struct {
    bool set; /* by cu_matvec_tma_tune, or $LLMOPT_CUDA_MV_TMA_TUNE read */
    int rs, smem_kb, blocks_per_sm, evict_first, max_blocks, wait, row_copies;
} ms_tune;

extern "C" void cu_matvec_tma(int mode) {
    ms_mode = mode == 0 || mode == 1 ? mode : -1;
}

extern "C" void cu_matvec_tma_tune(int rows_per_tile, int smem_kb, int blocks_per_sm, int evict_first, int max_blocks,
                                   int wait, int row_copies) {
    ms_tune.set = true;
    ms_tune.rs = rows_per_tile == 1 || rows_per_tile == 2 || rows_per_tile == 4 || rows_per_tile == 8 ? rows_per_tile : 0;
    ms_tune.smem_kb = smem_kb >= 8 && smem_kb <= (MS_SMEM_MAX >> 10) ? smem_kb : 0;
    ms_tune.blocks_per_sm = blocks_per_sm >= 1 && blocks_per_sm <= 4 ? blocks_per_sm : 0;
    ms_tune.evict_first = evict_first == 1;
    ms_tune.max_blocks = max_blocks > 0 ? max_blocks : 0;
    ms_tune.wait = wait >= 0 && wait <= 2 ? wait : 0;
    ms_tune.row_copies = row_copies == 1;
}

/* $LLMOPT_CUDA_MV_TMA_TUNE=rs,smem_kb,blocks_per_sm,wait,row_copies (model A/B;
 * read once, unless cu_matvec_tma_tune came first) */
static void ms_tune_read(void) {
    if (ms_tune.set) return;
    int v[5] = {0, 0, 0, -1, 0};
    const char *e = getenv("LLMOPT_CUDA_MV_TMA_TUNE");
    for (int k = 0; e && *e && k < 5; k++) {
        v[k] = atoi(e);
        e = strchr(e, ',');
        if (e) e++;
    }
    cu_matvec_tma_tune(v[0], v[1], v[2], -1, 0, v[3], v[4]);
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

/* What the ring needs of a job: bytes of x in shared memory, bytes of one tile row (both
 * halves of a pair), and the stages it wants at least (rows a tile are then the most,
 * <= 8, that leave them: 4, K-quant rows of <= 4096 2). */
struct ms_need {
    size_t x_bytes, unit;
    int min_stages;
    int cls;                       /* CU_BF16, CU_Q8_0, or CU_Q4_K for every K-quant */
    int kdt;                       /* K-quants: the one type of every weight, or 0 (q4_K and q6_K mixed) */
};

/* Checks a one-row launch for the staged kernel and fills its job (all but rs and
 * n_tiles); false: not chosen or not supported, nothing launched. */
static bool ms_job_of(const float *x, const struct cu_mv_seg *segs, int n_seg, const struct cu_weight *up,
                      bool q8_int8, struct ms_job *job, struct ms_need *need) {
    ms_tune_read();
    const int dt = segs[0].w.dtype;
    const int64_t K = segs[0].w.cols;
    const bool kq = km_type_ok(dt);
    /* q8_0: whole 16-byte runs of scales a row; K-quants: whole super-blocks, q6_K also
     * 16-byte runs of super-block scales (K % 2048) */
    if (n_seg < 1 || n_seg > CU_MV_MAX_SEGS || !(dt == CU_BF16 || (dt == CU_Q8_0 && q8_int8) || kq) ||
        K % (dt == CU_BF16 ? 8 : 256) || !ms_aligned(x) || (segs[0].ep.norm_w && !ms_aligned(segs[0].ep.norm_w)))
        return false;
    int64_t streamed = up ? 2 * up->rows : 0; /* weight rows the launch streams */
    for (int k = 0; k < n_seg; k++) streamed += up ? 0 : segs[k].w.rows;
    if (!ms_chosen(dt, K, streamed, q8_int8)) return false;
    memset(job, 0, sizeof *job);
    job->n_seg = n_seg;
    job->x = x;
    size_t row_max = 0; /* bytes of the largest weight row and its scales (segment types may differ: q4_K, q6_K) */
    bool mixed = false;
    for (int k = 0; k < n_seg; k++) {
        const struct cu_weight &w = segs[k].w;
        const bool same = w.dtype == dt || (kq && km_type_ok(w.dtype));
        if (!same || w.cols != K || w.rows < 1 || !ms_aligned(w.data) || (ms_sc_bytes(w.dtype, K) && !ms_aligned(w.scales)) ||
            (w.dtype == CU_Q6_K && K % 2048))
            return false;
        mixed = mixed || w.dtype != dt;
        row_max = std::max(row_max, (size_t)ms_row_bytes(w.dtype, K) + ms_sc_bytes(w.dtype, K));
        job->seg[k] = segs[k];
    }
    if (up) {
        if (up->dtype != dt || !ms_aligned(up->data) || (ms_sc_bytes(dt, K) && !ms_aligned(up->scales))) return false;
        job->up = *up;
    }
    need->unit = row_max * (up ? 2 : 1);
    need->x_bytes = dt == CU_Q8_0 ? mv_xq_smem(K) : kq ? km_row_bytes(K) : 4 * (size_t)K;
    need->min_stages = ms_tune.rs || (kq && K <= 4096) ? 2 : 4;
    need->cls = kq ? CU_Q4_K : dt;
    need->kdt = kq && !mixed ? dt : 0;
    return true;
}

static size_t ms_round(size_t b) {
    return (b + 127) & ~(size_t)127;
}

/* One ring for jobs[0..n): x's room is the largest job's, the ring the rest of the
 * shared-memory budget. Each job's tiles take the most rows (<= 8) that leave it its
 * stages in that ring (ms_need.min_stages), as a launch of its own would. Alone, the ring
 * is cut to a whole number of those tiles (at most MS_MAX_STAGES), as the fixed stages
 * measured for one launch were; a chain keeps it whole, so jobs of other tile sizes fill
 * it too. Fills R and each job's rs and tiles; false when two of some job's one-row tiles
 * do not fit. */
static bool ms_shape(struct ms_job *jobs, const struct ms_need *need, int n, struct ms_ring *R, size_t *smem) {
    ms_tune_read();
    size_t x_bytes = 0, unit_max = 0;
    for (int j = 0; j < n; j++) {
        x_bytes = std::max(x_bytes, need[j].x_bytes);
        unit_max = std::max(unit_max, need[j].unit);
    }
    const size_t ring_off = ms_round(sizeof(struct ms_head) + x_bytes);
    if (ring_off + 2 * ms_round(unit_max) > MS_SMEM_MAX) return false;
    size_t budget = ms_tune.smem_kb ? (size_t)ms_tune.smem_kb << 10 : MS_SMEM_DEFAULT;
    if (budget > MS_SMEM_MAX) budget = MS_SMEM_MAX;
    size_t ring = budget > ring_off + 2 * ms_round(unit_max) ? budget - ring_off : 2 * ms_round(unit_max);
    ring &= ~(size_t)127;
    for (int j = 0; j < n; j++) {
        int rs = ms_tune.rs ? ms_tune.rs : MS_MAX_RS;
        while (rs > 1 && need[j].min_stages * ms_round(rs * need[j].unit) > ring) rs /= 2;
        jobs[j].rs = rs;
        jobs[j].n_tiles = 0;
        for (int k = 0; k < jobs[j].n_seg; k++) {
            jobs[j].n_tiles += (jobs[j].seg[k].w.rows + rs - 1) / rs;
            jobs[j].t_end[k] = jobs[j].n_tiles;
        }
    }
    if (n == 1) {
        const size_t stage = ms_round(jobs[0].rs * need[0].unit);
        ring = std::min(ring / stage, (size_t)MS_MAX_STAGES) * stage;
    }
    memset(R, 0, sizeof *R);
    R->ring_bytes = (uint32_t)ring;
    R->ring_off = (uint32_t)ring_off;
    R->evict_first = ms_tune.evict_first;
    R->wait = ms_tune.wait;
    R->row_copies = ms_tune.row_copies;
    *smem = ring_off + ring;
    return true;
}

/* Blocks a launch: MS_BLOCKS_PER_SM (or the tune's) an SM, at most the tune's cap */
static int64_t ms_grid_cap(void) {
    int64_t cap = (int64_t)(ms_tune.blocks_per_sm ? ms_tune.blocks_per_sm : MS_BLOCKS_PER_SM) * cu_sm_count();
    if (ms_tune.max_blocks && ms_tune.max_blocks < cap) cap = ms_tune.max_blocks;
    return cap;
}

template <typename F> static cudaError_t ms_smem_attr(F kern, bool &done) {
    if (done) return cudaSuccess;
    const cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, MS_SMEM_MAX);
    done = e == cudaSuccess;
    return e;
}

template <int DT, bool NORM, bool PAIR>
static cudaError_t ms_launch(cudaStream_t st, const struct ms_ring &R, const struct ms_job &job, unsigned grid,
                             size_t smem) {
    auto kern = matvec_stream_kernel<DT, NORM, PAIR>;
    static bool attr = false;
    const cudaError_t e = ms_smem_attr(kern, attr);
    if (e != cudaSuccess) return e;
    return cu_launch_pdl(kern, dim3(grid), dim3(MS_THREADS), smem, st, R, job);
}

template <int DT>
static cudaError_t ms_launch_dt(cudaStream_t st, const struct ms_ring &R, const struct ms_job &job, unsigned grid,
                                size_t smem) {
    const bool norm = job.seg[0].ep.norm_w != NULL, pair = job.up.data != NULL;
    if constexpr (DT != 0) { /* (mixed segment types are never a pair) */
        if (norm && pair) return ms_launch<DT, true, true>(st, R, job, grid, smem);
        if (pair) return ms_launch<DT, false, true>(st, R, job, grid, smem);
    }
    if (norm) return ms_launch<DT, true, false>(st, R, job, grid, smem);
    return ms_launch<DT, false, false>(st, R, job, grid, smem);
}

/* One job in its own launch (cu_matvec_stream, and a chain of one). */
static cudaError_t ms_launch_one(cudaStream_t st, struct ms_job &job, const struct ms_need &need) {
    struct ms_ring R;
    size_t smem;
    if (!ms_shape(&job, &need, 1, &R, &smem)) return cudaErrorNotSupported;
    const int64_t cap = ms_grid_cap();
    const unsigned grid = (unsigned)(job.n_tiles < cap ? job.n_tiles : cap);
    switch (need.cls == CU_Q4_K ? need.kdt : need.cls) {
    case CU_Q8_0: return ms_launch_dt<CU_Q8_0>(st, R, job, grid, smem);
    case CU_Q4_K: return ms_launch_dt<CU_Q4_K>(st, R, job, grid, smem);
    case CU_Q6_K: return ms_launch_dt<CU_Q6_K>(st, R, job, grid, smem);
    case 0: return ms_launch_dt<0>(st, R, job, grid, smem);
    default: return ms_launch_dt<CU_BF16>(st, R, job, grid, smem);
    }
}

cudaError_t cu_matvec_stream(cudaStream_t st, const float *x, const struct cu_mv_seg *segs, int n_seg,
                             const struct cu_weight *up, bool q8_int8) {
    struct ms_job job;
    struct ms_need need;
    if (!ms_job_of(x, segs, n_seg, up, q8_int8, &job, &need)) return cudaErrorNotSupported;
    return ms_launch_one(st, job, need);
}

/* ---- chains ----------------------------------------------------------------------- */

#define MS_SYNC_SLOTS 64 /* counter sets, taken in turn by the launches */

struct cu_mv_chain {
    struct ms_chain c;             /* the pending jobs: c.job[0..c.n_jobs) */
    struct ms_need need[MS_MAX_JOBS];
    uint32_t *sync;                /* (MS_SYNC_SLOTS * MS_MAX_JOBS) device counters */
    int slot;
    int merged;                    /* launches saved since cu_matvec_chain_merged */
};

extern "C" cudaError_t cu_matvec_chain_new(struct cu_mv_chain **out) {
    *out = NULL;
    struct cu_mv_chain *c = (struct cu_mv_chain *)calloc(1, sizeof *c);
    if (!c) return cudaErrorMemoryAllocation;
    const size_t bytes = (size_t)MS_SYNC_SLOTS * MS_MAX_JOBS * sizeof(uint32_t);
    cudaError_t e = cudaMalloc((void **)&c->sync, bytes);
    if (e == cudaSuccess) e = cudaMemset(c->sync, 0, bytes);
    if (e != cudaSuccess) {
        if (c->sync) cudaFree(c->sync);
        free(c);
        return e;
    }
    *out = c;
    return cudaSuccess;
}

extern "C" void cu_matvec_chain_free(struct cu_mv_chain *c) {
    if (!c) return;
    cudaFree(c->sync);
    free(c);
}

extern "C" void cu_matvec_chain_drop(struct cu_mv_chain *c) {
    c->c.n_jobs = 0;
}

extern "C" int cu_matvec_chain_merged(struct cu_mv_chain *c) {
    const int m = c->merged;
    c->merged = 0;
    return m;
}

template <int DT>
static cudaError_t ms_chain_launch(cudaStream_t st, const struct ms_chain &ch, size_t smem, int64_t max_tiles) {
    auto kern = matvec_chain_kernel<DT>;
    static bool attr = false;
    static size_t occ_smem = 0;
    static int occ = 0;
    cudaError_t e = ms_smem_attr(kern, attr);
    if (e != cudaSuccess) return e;
    if (occ_smem != smem) { /* every block must be resident at once: the jobs wait on each other */
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, MS_THREADS, smem);
        if (e != cudaSuccess) return e;
        occ_smem = smem;
    }
    if (occ < 1) return cudaErrorNotSupported;
    int64_t grid = ms_grid_cap();
    if (grid > (int64_t)occ * cu_sm_count()) grid = (int64_t)occ * cu_sm_count();
    if (grid > max_tiles) grid = max_tiles;
    return cu_launch_pdl(kern, dim3((unsigned)grid), dim3(MS_THREADS), smem, st, ch);
}

extern "C" cudaError_t cu_matvec_chain_flush(struct cu_mv_chain *c, cudaStream_t st) {
    struct ms_chain &ch = c->c;
    const int n = ch.n_jobs;
    ch.n_jobs = 0;
    if (n == 0) return cudaSuccess;
    if (n == 1) return ms_launch_one(st, ch.job[0], c->need[0]);
    size_t smem;
    if (!ms_shape(ch.job, c->need, n, &ch.ring, &smem)) return cudaErrorInvalidValue; /* checked by the adds */
    ch.n_jobs = n;
    ch.sync = c->sync + (size_t)c->slot * MS_MAX_JOBS;
    const char *e_sl = getenv("LLMOPT_CUDA_MV_CHAIN_SLEEP");
    ch.backoff_ns = e_sl ? atoi(e_sl) : 0;
    c->slot = (c->slot + 1) % MS_SYNC_SLOTS;
    int64_t max_tiles = 0;
    int kdt = c->need[0].kdt;
    for (int j = 0; j < n; j++) {
        max_tiles = std::max(max_tiles, ch.job[j].n_tiles);
        if (c->need[j].kdt != kdt) kdt = 0;
    }
    cudaError_t e;
    switch (c->need[0].cls == CU_Q4_K ? kdt : c->need[0].cls) {
    case CU_Q8_0: e = ms_chain_launch<CU_Q8_0>(st, ch, smem, max_tiles); break;
    case CU_Q4_K: e = ms_chain_launch<CU_Q4_K>(st, ch, smem, max_tiles); break;
    case CU_Q6_K: e = ms_chain_launch<CU_Q6_K>(st, ch, smem, max_tiles); break;
    case 0: e = ms_chain_launch<0>(st, ch, smem, max_tiles); break;
    default: e = ms_chain_launch<CU_BF16>(st, ch, smem, max_tiles); break;
    }
    ch.n_jobs = 0;
    if (e == cudaErrorNotSupported) { /* no block fits: each job alone */
        for (int j = 0; j < n; j++)
            if ((e = ms_launch_one(st, ch.job[j], c->need[j])) != cudaSuccess) return e;
        return cudaSuccess;
    }
    if (e == cudaSuccess) c->merged += n - 1;
    return e;
}

extern "C" cudaError_t cu_matvec_chain_add(struct cu_mv_chain *c, cudaStream_t st, const float *x,
                                           const struct cu_mv_seg *segs, int n_seg, const struct cu_weight *up) {
    struct ms_job job;
    struct ms_need need;
    /* K-quants where cu_matvec / cu_matvec_kq_multi would take the staged kernel */
    if ((km_type_ok(segs[0].w.dtype) && !(cu_kq_staged_ok() && cu_kq_multi_ok(&segs[0].w))) ||
        !ms_job_of(x, segs, n_seg, up, cu_matvec_q8_int8_ok(segs[0].w.cols), &job, &need))
        return cudaErrorNotSupported;
    struct ms_chain &ch = c->c;
    const char *e_mj = getenv("LLMOPT_CUDA_MV_CHAIN_JOBS");
    const int max_jobs = e_mj && atoi(e_mj) >= 1 && atoi(e_mj) <= MS_MAX_JOBS ? atoi(e_mj) : MS_MAX_JOBS;
    bool fits = ch.n_jobs < max_jobs && (ch.n_jobs == 0 || need.cls == c->need[0].cls);
    if (fits && ch.n_jobs > 0) { /* the chain's ring must still hold two stages of every job */
        struct ms_job jobs[MS_MAX_JOBS];
        struct ms_need needs[MS_MAX_JOBS];
        struct ms_ring R;
        size_t smem;
        memcpy(jobs, ch.job, (size_t)ch.n_jobs * sizeof jobs[0]);
        memcpy(needs, c->need, (size_t)ch.n_jobs * sizeof needs[0]);
        jobs[ch.n_jobs] = job;
        needs[ch.n_jobs] = need;
        fits = ms_shape(jobs, needs, ch.n_jobs + 1, &R, &smem);
    }
    if (!fits) {
        const cudaError_t e = cu_matvec_chain_flush(c, st);
        if (e != cudaSuccess) return e;
    }
    ch.job[ch.n_jobs] = job;
    c->need[ch.n_jobs] = need;
    ch.n_jobs++;
    return cudaSuccess;
}
