/* Lab prototype (issue 8, not used by the runtime): a one-token decode "attention block"
 * of a small GQA model as ONE thread-block-cluster kernel, timed as a chain of dependent
 * launches, to decide whether fusing the q/k/v product, the attention and the output
 * projection is worth building into the decode fusion.
 *
 * Why: in the traced 0.6B q8_0 step (bench/results/cuda-trace-2026-12-01.md) the q/k/v
 * matvec, the decode attention and attn_o take 4.1 + 6.4 + 3.4 = 13.9 µs of a 22.7-µs
 * layer, mostly fixed costs a launch (PDL wait, x from L2, block skew, the split merge
 * through global memory). Only the attention output projection needs every head; q/k/v
 * and the attention of a KV group need only that group's rows. So a cluster of C blocks
 * per KV group can do all three with cluster barriers instead of kernel boundaries:
 *
 *   before the PDL wait: each block copies (cp.async) its share of the group's q/k/v
 *     weight rows, its share of the output projection's rows restricted to the group's
 *     columns, and its share of the cached K/V positions into shared memory;
 *   after it: x (f32) rms-normed and quantized to int8 per 32 in every block; the
 *     block's q/k/v rows by dp4a, pushed into every block of the cluster (distributed
 *     shared memory, 16 bytes a store); cluster barrier; q/k rms norm and rope (NeoX
 *     halves) in every block; attention of the group's query heads over the block's
 *     positions (the last block adds the new token), an online softmax a warp, the
 *     warps merged in shared memory; cluster barrier; block r merges slice r of the
 *     output from every block's partial (DSMEM reads) and pushes it to every block;
 *     cluster barrier; the merged output (G heads x Dh) quantized to int8; the block's
 *     output rows of W_o[:, group columns] by dp4a -> partial[group][row] in global memory.
 * Measured: bench/results/cuda-attn-block-lab-2026-12-02.md.
 *
 * The next kernel of the layer (the gate/up pair) would sum the HKV partials and the
 * residual in its prologue; `chain_sum` times that extra read as a separate launch, and
 * the "layer" chain adds the backend's own gate/up pair and ffn_down launches.
 *
 * Layouts: q8_0 rows as int8 [rows][K] with f16 scales [rows][K/32] (the backend's upload
 * layout); W_qkv per group g: rows q head G*g .. q head G*g+G-1, k head g, v head g
 * (Dh rows each); W_o [D][HQ*Dh]; K/V f16 [HKV][Pmax][Dh] (lab-only: the backend's cache is
 * paged and position-major). Checked against a host reference with the same int8
 * rounding of x and of the attention output.
 *
 *   bench_cuda_block [P [C [LAUNCHES [KVGLOBAL [PULL [DEFER [RAWBAR [P2P]]]]]]]]
 * P: context positions incl. the new one (default 576); C: cluster size, 8 or 16
 * (default 16); LAUNCHES: links in the timed chain (224). Variants, each 0 or 1:
 * KVGLOBAL 1: the cached K/V read from global memory after the PDL wait instead of
 * copied into shared memory before; PULL 0: every block pushes its whole partial to
 * every block instead of the slice merge (default 1); DEFER 1: the output rows and K/V
 * copied after the PDL wait; RAWBAR 1: cluster barriers as the aligned PTX pair; P2P 1:
 * each exchange as 16-byte stores that complete on the receiver's mbarrier (st.async),
 * the receiver waiting on it, instead of barriers and DSMEM loads. */
#include "backend/cuda/cuda_device.cuh"
#include "cuda_check.cuh"

#include <cooperative_groups.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

namespace cg = cooperative_groups;

/* Qwen3-0.6B's attention shapes */
#define D       1024 /* d_model */
#define HQ      16   /* query heads */
#define HKV     8    /* KV heads */
#define G       (HQ / HKV)
#define DH      128            /* head dim */
#define ROWS_G  ((G + 2) * DH) /* q/k/v rows of one group: 512 */
#define OCOLS   (G * DH)       /* output-projection columns of one group: 256 */
#define THREADS 256
#define EPS     1e-6f
static_assert(2 * G <= 4, "rml holds G maxima and G sums");

struct lab_args {
    const float *x, *wn, *qn, *kn, *cosv, *sinv; /* x [D]; norm weights; rope tables [DH/2] */
    const int8_t *wqkv;                          /* [HKV][ROWS_G][D] */
    const __half *wqkv_s;                        /* [HKV][ROWS_G][D/32] */
    const int8_t *wo;                            /* [D][HQ*DH] */
    const __half *wo_s;                          /* [D][HQ*DH/32] */
    __half *kc, *vc;                             /* [HKV][pmax][DH] */
    float *partial;                              /* [HKV][D] */
    int p, pmax;                                 /* positions incl. the new one (at p - 1) */
    int stop;                                    /* timing only: leave after this phase (0-5; 6: all) */
    int noload;                                  /* timing only: no weight or K/V copies */
    int defer;                                   /* output rows and K/V copied after the wait */
    int rawbar;                                  /* cluster barriers as the aligned PTX pair */
    int kvglobal; /* cached K/V read from global memory after the wait, not copied before it */
};

/* cooperative_groups' cluster.sync(), or (raw) the aligned PTX pair */
template <class CL> static __device__ __forceinline__ void cl_sync(CL &cluster, bool raw) {
    if (raw)
        asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    else
        cluster.sync();
}
/* Point-to-point exchange (XCH_P2P): 16-byte stores into another block's shared memory
 * that complete on that block's mbarrier (st.async ... complete_tx), so a receiver
 * waits for its bytes instead of a cluster barrier. */
static __device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
static __device__ __forceinline__ void p2p_send(const float4 *local_dst, const float4 &v, uint64_t *local_bar,
                                                int rank) {
    uint32_t d, b;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(d) : "r"(smem_u32(local_dst)), "r"(rank));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(b) : "r"(smem_u32(local_bar)), "r"(rank));
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(d),
                 "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(b)
                 : "memory");
}
static __device__ __forceinline__ void p2p_expect(uint64_t *bar, uint32_t bytes) { /* init: one arrival */
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(bar)) : "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void p2p_wait(uint64_t *bar) { /* phase 0 */
    asm volatile(
        "{\n\t.reg .pred p;\nP2P_WAIT_%=:\n\tmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], 0;\n\t"
        "@!p bra P2P_WAIT_%=;\n}" ::"r"(smem_u32(bar))
        : "memory");
}

/* Merges C partial softmax sums: block b's max m[b], sum of exponentials l[b] and sum of
 * exponential-weighted values acc[b] (a block with no positions: m = -inf, l = acc = 0). */
template <int C>
static __device__ __forceinline__ float merge_parts(const float (&m)[C], const float (&l)[C], const float (&acc)[C]) {
    float M = -INFINITY, L = 0, o = 0;
    for (int b = 0; b < C; b++) M = fmaxf(M, m[b]);
    for (int b = 0; b < C; b++) {
        const float e = m[b] == -INFINITY ? 0.0f : __expf(m[b] - M);
        L += e * l[b];
        o += e * acc[b];
    }
    return o / L;
}

/* Σ w·x over one q8_0 block of 32: int8 rows in shared memory, 16-byte aligned */
static __device__ __forceinline__ int dot32_q8(const int8_t *w, const int8_t *x) {
    int acc = 0;
    for (int h = 0; h < 2; h++) {
        const int4 a = ((const int4 *)w)[h], b = ((const int4 *)x)[h];
        acc = __dp4a(a.x, b.x, acc);
        acc = __dp4a(a.y, b.y, acc);
        acc = __dp4a(a.z, b.z, acc);
        acc = __dp4a(a.w, b.w, acc);
    }
    return acc;
}

/* Shared memory of a block (C blocks a group): rows_r = ROWS_G / C q/k/v rows,
 * orows_r = D / C output rows, npos = ceil((p - 1) / C) cached positions. */
struct lab_smem {
    int rows_r, orows_r, npos;
    size_t o_wq, o_wqs, o_wo, o_wos, o_k, o_v, total;
};
static __host__ __device__ lab_smem lab_layout(int C, int p, bool kv_smem) {
    lab_smem s;
    s.rows_r = ROWS_G / C;
    s.orows_r = D / C;
    s.npos = (p - 1 + C - 1) / C;
    size_t o = 0;
    s.o_wq = o, o += (size_t)s.rows_r * D;
    s.o_wqs = o, o += (size_t)s.rows_r * (D / 32) * 2;
    s.o_wo = o, o += (size_t)s.orows_r * OCOLS;
    s.o_wos = o, o += (size_t)s.orows_r * 16; /* 8 scales a row, padded to 16 bytes */
    s.o_k = o, o += kv_smem ? (size_t)s.npos * DH * 2 : 0;
    s.o_v = o, o += kv_smem ? (size_t)s.npos * DH * 2 : 0;
    s.total = o;
    return s;
}

/* How the blocks of a cluster exchange the q/k/v rows and the attention partials
 * (compile-time, so that each variant's loops stay straight-line code). */
enum { XCH_PUSH, XCH_PULL, XCH_P2P };

template <int C, int X>
__global__ void __cluster_dims__(C, 1, 1) __launch_bounds__(THREADS, 1) attn_block_kernel(lab_args a) {
    constexpr bool P2P = X == XCH_P2P;
    extern __shared__ __align__(16) uint8_t sm[];
    __shared__ __align__(16) int8_t xq[D];
    __shared__ float xs[D / 32];
    __shared__ __align__(16) float grp[ROWS_G]; /* the group's q/k/v rows, from every block */
    __shared__ __align__(16) float qh[G][DH], kh[DH], vh[DH];
    __shared__ float wpm[THREADS / 32][G], wpl[THREADS / 32][G]; /* each warp's softmax max and sum */
    __shared__ __align__(16) float wpacc[THREADS / 32][G][DH];   /* and its weighted sum of V */
    __shared__ __align__(16) float racc[C][G][DH];               /* every block's partial, pushed here: sums of V, */
    __shared__ __align__(16) float rml[C][4];                    /* softmax max (G) and sum (G) */
    __shared__ __align__(16) float mo[G * DH];                   /* merged output (the slice merges) */
    __shared__ __align__(16) float rsl[C][G * DH / C];           /* XCH_P2P: every block's slice r of its partial */
    __shared__ __align__(8) uint64_t bar[3];                     /* XCH_P2P: q/k/v rows, slices, merged slices */
    __shared__ __align__(16) int8_t oq[OCOLS];
    __shared__ float os[OCOLS / 32];
    __shared__ float red[THREADS / 32];

    cu_pdl_trigger();
    cg::cluster_group cluster = cg::this_cluster();
    const int r = (int)cluster.block_rank(), g = (int)(blockIdx.x / C);
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const lab_smem L = lab_layout(C, a.p, !a.kvglobal);
    constexpr int S = G * DH / C; /* the merge's slice of the output a block */
    if constexpr (P2P) {          /* the bytes each exchange brings from the other C - 1 blocks */
        if (t == 0) {
            p2p_expect(&bar[0], (uint32_t)((ROWS_G - L.rows_r) * 4));
            p2p_expect(&bar[1], (uint32_t)((C - 1) * (S + 4) * 4));
            p2p_expect(&bar[2], (uint32_t)((C - 1) * S * 4));
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        }
    }
    int8_t *wq = (int8_t *)(sm + L.o_wq), *wo = (int8_t *)(sm + L.o_wo);
    __half *wqs = (__half *)(sm + L.o_wqs), *wos = (__half *)(sm + L.o_wos);
    const size_t kv0 = ((size_t)g * a.pmax + (size_t)r * L.npos) * DH;
    const __half *kcs = a.kvglobal ? a.kc + kv0 : (const __half *)(sm + L.o_k);
    const __half *vcs = a.kvglobal ? a.vc + kv0 : (const __half *)(sm + L.o_v);
    const int pos0 = r * L.npos, pos1 = min(pos0 + L.npos, a.p - 1); /* cached positions here */

    /* 1. the q/k/v rows: read-only for this launch, so before the wait */
    if (!a.noload) {
        const uint8_t *src = (const uint8_t *)(a.wqkv + ((size_t)g * ROWS_G + (size_t)r * L.rows_r) * D);
        for (int i = t; i < L.rows_r * D / 16; i += THREADS) cu_cp_async16(wq + 16 * i, src + 16 * i);
        src = (const uint8_t *)(a.wqkv_s + ((size_t)g * ROWS_G + (size_t)r * L.rows_r) * (D / 32));
        for (int i = t; i < L.rows_r * (D / 32) * 2 / 16; i += THREADS)
            cu_cp_async16((uint8_t *)wqs + 16 * i, src + 16 * i);
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
    /* the output projection's rows and the cached K/V: needed later, so (a.defer) issued
     * after the wait, behind x */
    auto copy_later = [&]() {
        for (int i = t; i < L.orows_r * OCOLS / 16; i += THREADS) {
            int row = i / (OCOLS / 16), c = i % (OCOLS / 16);
            cu_cp_async16(wo + (size_t)row * OCOLS + 16 * c,
                          a.wo + ((size_t)(r * L.orows_r + row)) * (HQ * DH) + (size_t)g * OCOLS + 16 * c);
        }
        for (int i = t; i < L.orows_r; i += THREADS)
            cu_cp_async16((uint8_t *)wos + 16 * i,
                          a.wo_s + ((size_t)(r * L.orows_r + i)) * (HQ * DH / 32) + g * (OCOLS / 32));
        for (int i = t; i < (a.kvglobal ? 0 : pos1 - pos0) * DH * 2 / 16; i += THREADS) {
            cu_cp_async16((uint8_t *)(sm + L.o_k) + 16 * i, (const uint8_t *)(a.kc + kv0) + 16 * i);
            cu_cp_async16((uint8_t *)(sm + L.o_v) + 16 * i, (const uint8_t *)(a.vc + kv0) + 16 * i);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    if (!a.noload && !a.defer) copy_later();
    const float4 wn4 = ((const float4 *)a.wn)[t];
    float nw4[4], cs4[4], sn4[4]; /* warps <= G: the q/k norm weight and rope of the lane's 4 dims */
    if (warp <= G)
        for (int i = 0; i < 4; i++) {
            const int d = 4 * lane + i;
            nw4[i] = (warp < G ? a.qn : a.kn)[d];
            cs4[i] = a.cosv[d & (DH / 2 - 1)];
            sn4[i] = a.sinv[d & (DH / 2 - 1)];
        }
    if constexpr (P2P) cl_sync(cluster, false); /* no block sends before every block's barriers exist */
    cu_pdl_wait();
    if (!a.noload && a.defer) copy_later();
#define LAB_STOP(s)                                                                                                    \
    if (a.stop == (s)) {                                                                                               \
        asm volatile("cp.async.wait_all;");                                                                            \
        cl_sync(cluster, a.rawbar);                                                                                    \
        return;                                                                                                        \
    }
    LAB_STOP(0)

    /* 2. x: rms_norm, int8 per 32 (8 threads a group) */
    {
        float4 x4 = ((const float4 *)a.x)[t];
        float ss = cu_warp_sum(x4.x * x4.x + x4.y * x4.y + x4.z * x4.z + x4.w * x4.w);
        if (lane == 0) red[warp] = ss;
        __syncthreads();
        ss = 0;
        for (int w = 0; w < THREADS / 32; w++) ss += red[w];
        const float inv = rsqrtf(ss / D + EPS);
        float y[4] = {x4.x * inv * wn4.x, x4.y * inv * wn4.y, x4.z * inv * wn4.z, x4.w * inv * wn4.w};
        float am = fmaxf(fmaxf(fabsf(y[0]), fabsf(y[1])), fmaxf(fabsf(y[2]), fabsf(y[3])));
        for (int o = 1; o < 8; o <<= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
        const float s = am / 127.0f, is = s > 0 ? 1.0f / s : 0.0f;
        char4 q;
        q.x = (signed char)__float2int_rn(y[0] * is);
        q.y = (signed char)__float2int_rn(y[1] * is);
        q.z = (signed char)__float2int_rn(y[2] * is);
        q.w = (signed char)__float2int_rn(y[3] * is);
        ((char4 *)xq)[t] = q;
        if ((t & 7) == 0) xs[t >> 3] = s;
    }
    asm volatile("cp.async.wait_group 1;" ::: "memory"); /* the q/k/v rows (the later copies may be in flight) */
    __syncthreads();
    LAB_STOP(1)

    /* 3. the block's q/k/v rows (lane l: the row's block of 32 number l), into every block */
    for (int j = warp; j < L.rows_r; j += THREADS / 32) {
        const int acc = dot32_q8(wq + (size_t)j * D + 32 * lane, xq + 32 * lane);
        float v = cu_warp_sum((float)acc * __half2float(wqs[j * (D / 32) + lane]) * xs[lane]);
        if (lane == 0) grp[r * L.rows_r + j] = v;
    }
    __syncthreads();
    /* pushed 16 bytes at a time: a 4-byte remote store costs as much as a 16-byte one */
    for (int i = t; i < L.rows_r / 4 * C; i += THREADS) {
        const int c = i % (L.rows_r / 4), b = i / (L.rows_r / 4);
        float4 *dst = (float4 *)&grp[r * L.rows_r + 4 * c];
        if (b == r) continue;
        if constexpr (P2P)
            p2p_send(dst, *dst, &bar[0], b);
        else
            *cluster.map_shared_rank(dst, b) = *dst;
    }
    if constexpr (P2P) {
        p2p_wait(&bar[0]);
        __syncthreads(); /* the block's own rows, written by other warps */
    } else {
        cl_sync(cluster, a.rawbar);
    }
    LAB_STOP(2)

    /* 4. q/k rms norm and rope (warp h < G: q head h; warp G: k), v as it is */
    if (warp <= G) {
        const float *src = grp + warp * DH;
        float v[4];
        for (int i = 0; i < 4; i++) v[i] = src[4 * lane + i];
        float ss = cu_warp_sum(v[0] * v[0] + v[1] * v[1] + v[2] * v[2] + v[3] * v[3]);
        const float inv = rsqrtf(ss / DH + EPS);
        for (int i = 0; i < 4; i++) v[i] *= inv * nw4[i];
        float pv[4]; /* dims d +- 64: lane ^ 16 */
        for (int i = 0; i < 4; i++) pv[i] = __shfl_xor_sync(0xffffffffu, v[i], 16);
        float *dst = warp < G ? qh[warp] : kh;
        for (int i = 0; i < 4; i++) {
            const int d = 4 * lane + i;
            dst[d] = d < DH / 2 ? v[i] * cs4[i] - pv[i] * sn4[i] : v[i] * cs4[i] + pv[i] * sn4[i];
        }
    } else if (warp == G + 1) {
        for (int i = 0; i < 4; i++) vh[4 * lane + i] = grp[(G + 1) * DH + 4 * lane + i];
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory"); /* K/V and the output rows */
    __syncthreads();
    if (r == C - 1 && t < DH) { /* the new position into the cache, for later steps */
        a.kc[((size_t)g * a.pmax + a.p - 1) * DH + t] = __float2half(kh[t]);
        a.vc[((size_t)g * a.pmax + a.p - 1) * DH + t] = __float2half(vh[t]);
    }

    /* 5. attention of the G heads over the block's positions (+ the new one in the last) */
    const int n = pos1 - pos0 + (r == C - 1 ? 1 : 0), nc = max(pos1 - pos0, 0);
    LAB_STOP(3)
    /* warp w: positions 4w .. 4w + 3, then 32 further, ...; an online softmax a head, a lane
     * holding 4 dims of each head's sum */
    const float scale = rsqrtf((float)DH);
    float wm[G], wl[G], wacc[G][4];
    for (int h = 0; h < G; h++) {
        wm[h] = -INFINITY, wl[h] = 0;
        for (int i = 0; i < 4; i++) wacc[h][i] = 0;
    }
    float q[G][4];
    for (int h = 0; h < G; h++) {
        const float4 q4 = ((const float4 *)qh[h])[lane];
        q[h][0] = q4.x, q[h][1] = q4.y, q[h][2] = q4.z, q[h][3] = q4.w;
    }
    for (int j0 = 4 * warp; j0 < n; j0 += 4 * (THREADS / 32)) { /* positions j0 .. j0 + 3 */
        float sc[4][G], k[4][4], v[4][4];
        for (int u = 0; u < 4; u++) {
            const int j = j0 + u;
            for (int i = 0; i < 4; i++) k[u][i] = v[u][i] = 0;
            if (j < nc) {
                const __half2 *k2 = (const __half2 *)(kcs + (size_t)j * DH + 4 * lane);
                const __half2 *v2 = (const __half2 *)(vcs + (size_t)j * DH + 4 * lane);
                float2 a0 = __half22float2(k2[0]), a1 = __half22float2(k2[1]);
                float2 b0 = __half22float2(v2[0]), b1 = __half22float2(v2[1]);
                k[u][0] = a0.x, k[u][1] = a0.y, k[u][2] = a1.x, k[u][3] = a1.y;
                v[u][0] = b0.x, v[u][1] = b0.y, v[u][2] = b1.x, v[u][3] = b1.y;
            } else if (j < n) { /* the new position, as the cache holds it */
                for (int i = 0; i < 4; i++) {
                    k[u][i] = __half2float(__float2half(kh[4 * lane + i]));
                    v[u][i] = __half2float(__float2half(vh[4 * lane + i]));
                }
            }
            for (int h = 0; h < G; h++)
                sc[u][h] = q[h][0] * k[u][0] + q[h][1] * k[u][1] + q[h][2] * k[u][2] + q[h][3] * k[u][3];
        }
        for (int o = 16; o; o >>= 1)
            for (int u = 0; u < 4; u++)
                for (int h = 0; h < G; h++) sc[u][h] += __shfl_xor_sync(0xffffffffu, sc[u][h], o);
        for (int h = 0; h < G; h++) {
            float m = wm[h];
            for (int u = 0; u < 4; u++) {
                sc[u][h] = j0 + u < n ? sc[u][h] * scale : -INFINITY;
                m = fmaxf(m, sc[u][h]);
            }
            const float corr = wm[h] == -INFINITY ? 0.0f : __expf(wm[h] - m);
            wl[h] *= corr;
            for (int i = 0; i < 4; i++) wacc[h][i] *= corr;
            for (int u = 0; u < 4; u++) {
                const float e = sc[u][h] == -INFINITY ? 0.0f : __expf(sc[u][h] - m);
                wl[h] += e;
                for (int i = 0; i < 4; i++) wacc[h][i] += e * v[u][i];
            }
            wm[h] = m;
        }
    }
    for (int h = 0; h < G; h++) {
        if (lane == 0) wpm[warp][h] = wm[h], wpl[warp][h] = wl[h];
        ((float4 *)wpacc[warp][h])[lane] = make_float4(wacc[h][0], wacc[h][1], wacc[h][2], wacc[h][3]);
    }
    __syncthreads();
    {
        const int h = t / DH, d = t % DH; /* THREADS == G * DH: the block's partial, pushed to every block */
        float m = -INFINITY, l = 0, acc = 0;
        for (int w = 0; w < THREADS / 32; w++) m = fmaxf(m, wpm[w][h]);
        for (int w = 0; w < THREADS / 32; w++) {
            const float e = wpm[w][h] == -INFINITY ? 0.0f : __expf(wpm[w][h] - m);
            l += e * wpl[w][h];
            acc += e * wpacc[w][h][d];
        }
        racc[r][h][d] = acc;
        if (d == 0) rml[r][h] = m, rml[r][G + h] = l;
    }
    float o;       /* the merged output of (head t / DH, dim t % DH) */
    if constexpr (X == XCH_PUSH) { /* every block pushes its partial to every block, which merges all */
        __syncthreads();
        for (int i = t; i < (G * DH / 4 + 1) * C; i += THREADS) { /* 16 bytes a remote store */
            const int c = i % (G * DH / 4 + 1), b = i / (G * DH / 4 + 1);
            float4 *src = c < G * DH / 4 ? (float4 *)&racc[r][0][4 * c] : (float4 *)rml[r];
            if (b != r) *cluster.map_shared_rank(src, b) = *src;
        }
        cl_sync(cluster, a.rawbar); /* every block's partial is in every block: no remote access after this */
        LAB_STOP(4)
        const int h = t / DH, d = t % DH;
        float mb[C], lb[C], ab[C];
        for (int b = 0; b < C; b++) mb[b] = rml[b][h], lb[b] = rml[b][G + h], ab[b] = racc[b][h][d];
        o = merge_parts<C>(mb, lb, ab);
    } else {                 /* block r merges slice r of every block's partial and sends it to every block */
        if constexpr (P2P) { /* slice b of this block's partial to block b */
            __syncthreads();
            for (int i = t; i < (S / 4 + 1) * C; i += THREADS) {
                const int c = i % (S / 4 + 1), b = i / (S / 4 + 1);
                const float4 v = c < S / 4 ? *(const float4 *)&racc[r][0][b * S + 4 * c] : *(const float4 *)rml[r];
                float4 *dst = c < S / 4 ? (float4 *)&rsl[r][4 * c] : (float4 *)rml[r];
                if (b == r)
                    *dst = v;
                else
                    p2p_send(dst, v, &bar[1], b);
            }
            p2p_wait(&bar[1]);
            __syncthreads();
        } else {
            cl_sync(cluster, a.rawbar); /* every block's partial written (in its own slot), read below */
        }
        LAB_STOP(4)
        if (t < S) {
            const int e0 = r * S + t, h = e0 / DH, d = e0 % DH;
            float mb[C], lb[C], ab[C];
            for (int b = 0; b < C; b++) {
                if constexpr (P2P) {
                    mb[b] = rml[b][h], lb[b] = rml[b][G + h], ab[b] = rsl[b][t];
                } else {
                    mb[b] = *cluster.map_shared_rank(&rml[b][h], b);
                    lb[b] = *cluster.map_shared_rank(&rml[b][G + h], b);
                    ab[b] = *cluster.map_shared_rank(&racc[b][h][d], b);
                }
            }
            mo[e0] = merge_parts<C>(mb, lb, ab);
        }
        if (warp == 0) {
            __syncwarp();
            for (int i = lane; i < S / 4 * C; i += 32) {
                const int c = i % (S / 4), b = i / (S / 4);
                float4 *src = (float4 *)&mo[r * S + 4 * c];
                if (b == r) continue;
                if constexpr (P2P)
                    p2p_send(src, *src, &bar[2], b);
                else
                    *cluster.map_shared_rank(src, b) = *src;
            }
        }
        if constexpr (P2P) {
            p2p_wait(&bar[2]);
            __syncthreads();
        } else {
            cl_sync(cluster, a.rawbar); /* every slice in every block, and no remote reads after this */
        }
        o = mo[t];
    }
    {
        const float am = cu_warp_max(fabsf(o)), s = am / 127.0f;
        oq[t] = (int8_t)__float2int_rn(s > 0 ? o / s : 0.0f);
        if (lane == 0) os[warp] = s;
    }
    __syncthreads();
    if (a.stop == 5) return;

    /* 7. the block's output rows over the group's columns: 4 lanes a row, 2 blocks of 32 a lane */
    for (int j = warp * 8 + (lane >> 2); j < L.orows_r; j += THREADS / 4) {
        const int b0 = 2 * (lane & 3);
        float v = 0;
        for (int b = b0; b < b0 + 2; b++) {
            const int acc = dot32_q8(wo + (size_t)j * OCOLS + 32 * b, oq + 32 * b);
            v += (float)acc * __half2float(wos[j * 8 + b]) * os[b];
        }
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        if ((lane & 3) == 0) a.partial[(size_t)g * D + r * L.orows_r + j] = v;
    }
}

/* The next kernel's extra work: x = residual + the HKV partials (one block a 1024 row) */
__global__ void chain_sum_kernel(const float *partial, const float *res, float *x) {
    cu_pdl_trigger();
    cu_pdl_wait();
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    float v = res[t];
    for (int g = 0; g < HKV; g++) v += partial[(size_t)g * D + t];
    x[t] = v * 1e-3f + res[t];
}

static uint32_t rng = 12345;
static float frand(void) {
    rng = rng * 1664525u + 1013904223u;
    return ((rng >> 8) & 0xffff) / 32768.0f - 1.0f;
}

template <int C, int X> static void launch_x(cudaStream_t st, const lab_args &a, size_t smem, bool pdl) {
    if (pdl)
        CHECK_CUDA(cu_launch_pdl(attn_block_kernel<C, X>, dim3(HKV * C), dim3(THREADS), smem, st, a));
    else
        attn_block_kernel<C, X><<<HKV * C, THREADS, smem, st>>>(a);
    CHECK_CUDA(cudaGetLastError());
}
template <int C> static void launch(cudaStream_t st, const lab_args &a, size_t smem, bool pdl, int x) {
    if (x == XCH_PUSH) launch_x<C, XCH_PUSH>(st, a, smem, pdl);
    if (x == XCH_PULL) launch_x<C, XCH_PULL>(st, a, smem, pdl);
    if (x == XCH_P2P) launch_x<C, XCH_P2P>(st, a, smem, pdl);
}
template <int C, int X> static void set_attributes(size_t smem) {
    if (C == 16)
        CHECK_CUDA(cudaFuncSetAttribute(attn_block_kernel<C, X>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    CHECK_CUDA(cudaFuncSetAttribute(attn_block_kernel<C, X>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
}
static void launch_sum(cudaStream_t st, const float *partial, const float *res, float *x) {
    CHECK_CUDA(cu_launch_pdl(chain_sum_kernel, dim3(D / 256), dim3(256), 0, st, partial, res, x));
}

static int8_t q8(float v, float is) {
    return (int8_t)lrintf(v * is);
}

template <int C> static int run(int p, int launches, int kvglobal, int pull, int defer, int rawbar, int p2p) {
    const int xch = p2p ? XCH_P2P : pull ? XCH_PULL : XCH_PUSH;
    const int pmax = p + 8;
    lab_smem L = lab_layout(C, p, !kvglobal);
    if (L.total > (227u << 10)) {
        fprintf(stderr, "P %d at C %d: %zu bytes of shared memory a block, more than 227 KiB (try KVGLOBAL 1)\n", p, C,
                L.total);
        return 1;
    }
    set_attributes<C, XCH_PUSH>(L.total);
    set_attributes<C, XCH_PULL>(L.total);
    set_attributes<C, XCH_P2P>(L.total);
    {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(HKV * C);
        cfg.blockDim = dim3(THREADS);
        cfg.dynamicSmemBytes = L.total;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = C, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        int nc = 0;
        cudaError_t e = cudaOccupancyMaxActiveClusters(&nc, attn_block_kernel<C, XCH_PULL>, &cfg);
        if (e != cudaSuccess) printf("cudaOccupancyMaxActiveClusters: %s\n", cudaGetErrorString(e)), nc = -1;
        printf("C %d: %d blocks of %zu B dynamic shared memory; clusters that fit at once: %d (need %d)\n", C, HKV * C,
               L.total, nc, HKV);
    }

    /* host data */
    std::vector<float> x(D), wn(D), qn(DH), kn(DH), cs(DH / 2), sn(DH / 2);
    for (auto &v : x) v = frand();
    for (auto &v : wn) v = 1.0f + 0.2f * frand();
    for (auto &v : qn) v = 1.0f + 0.2f * frand();
    for (auto &v : kn) v = 1.0f + 0.2f * frand();
    for (int i = 0; i < DH / 2; i++) {
        float ang = (p - 1) * powf(1e6f, -2.0f * i / DH);
        cs[i] = cosf(ang), sn[i] = sinf(ang);
    }
    const size_t nqkv = (size_t)HKV * ROWS_G * D, nwo = (size_t)D * HQ * DH;
    std::vector<int8_t> wqkv(nqkv), wo(nwo);
    std::vector<__half> wqkv_s(nqkv / 32), wo_s(nwo / 32), kc((size_t)HKV * pmax * DH), vc(kc.size());
    for (auto &v : wqkv) v = (int8_t)(frand() * 127);
    for (auto &v : wo) v = (int8_t)(frand() * 127);
    for (auto &v : wqkv_s) v = __float2half(0.002f * (1.5f + frand()));
    for (auto &v : wo_s) v = __float2half(0.002f * (1.5f + frand()));
    for (auto &v : kc) v = __float2half(frand());
    for (auto &v : vc) v = __float2half(frand());

    /* host reference: the same int8 rounding of x and of each group's output */
    std::vector<float> ref((size_t)HKV * D);
    {
        double ss = 0;
        for (float v : x) ss += (double)v * v;
        const float inv = 1.0f / sqrtf((float)(ss / D) + EPS);
        std::vector<int8_t> xqh(D);
        std::vector<float> xsh(D / 32);
        for (int b = 0; b < D / 32; b++) {
            float am = 0, y[32];
            for (int i = 0; i < 32; i++) y[i] = x[32 * b + i] * inv * wn[32 * b + i], am = fmaxf(am, fabsf(y[i]));
            float s = am / 127.0f, is = s > 0 ? 1.0f / s : 0.0f;
            xsh[b] = s;
            for (int i = 0; i < 32; i++) xqh[32 * b + i] = q8(y[i], is);
        }
        for (int g = 0; g < HKV; g++) {
            float grp[ROWS_G];
            for (int j = 0; j < ROWS_G; j++) {
                const size_t row = (size_t)g * ROWS_G + j;
                double v = 0;
                for (int b = 0; b < D / 32; b++) {
                    int acc = 0;
                    for (int i = 0; i < 32; i++) acc += wqkv[row * D + 32 * b + i] * xqh[32 * b + i];
                    v += (double)acc * __half2float(wqkv_s[row * (D / 32) + b]) * xsh[b];
                }
                grp[j] = (float)v;
            }
            float hv[G + 1][DH], vv[DH];
            for (int h = 0; h <= G; h++) {
                const float *src = grp + h * DH, *nw = h < G ? qn.data() : kn.data();
                double s2 = 0;
                for (int d = 0; d < DH; d++) s2 += (double)src[d] * src[d];
                float inv2 = 1.0f / sqrtf((float)(s2 / DH) + EPS), y[DH];
                for (int d = 0; d < DH; d++) y[d] = src[d] * inv2 * nw[d];
                for (int d = 0; d < DH; d++) {
                    int i = d % (DH / 2);
                    hv[h][d] = d < DH / 2 ? y[d] * cs[i] - y[d + DH / 2] * sn[i] : y[d] * cs[i] + y[d - DH / 2] * sn[i];
                }
            }
            for (int d = 0; d < DH; d++) vv[d] = grp[(G + 1) * DH + d];
            float o[OCOLS];
            for (int h = 0; h < G; h++) {
                std::vector<double> s(p);
                double m = -1e300;
                for (int j = 0; j < p; j++) {
                    double dot = 0;
                    for (int d = 0; d < DH; d++) {
                        float k = j < p - 1 ? __half2float(kc[((size_t)g * pmax + j) * DH + d])
                                            : __half2float(__float2half(hv[G][d]));
                        dot += (double)hv[h][d] * k;
                    }
                    s[j] = dot / sqrt((double)DH);
                    m = fmax(m, s[j]);
                }
                double l = 0;
                for (int j = 0; j < p; j++) l += (s[j] = exp(s[j] - m));
                for (int d = 0; d < DH; d++) {
                    double acc = 0;
                    for (int j = 0; j < p; j++) {
                        float v = j < p - 1 ? __half2float(vc[((size_t)g * pmax + j) * DH + d])
                                            : __half2float(__float2half(vv[d]));
                        acc += s[j] * v;
                    }
                    o[h * DH + d] = (float)(acc / l);
                }
            }
            int8_t oqh[OCOLS];
            float osh[OCOLS / 32];
            for (int b = 0; b < OCOLS / 32; b++) {
                float am = 0;
                for (int i = 0; i < 32; i++) am = fmaxf(am, fabsf(o[32 * b + i]));
                float s = am / 127.0f;
                osh[b] = s;
                for (int i = 0; i < 32; i++) oqh[32 * b + i] = s > 0 ? q8(o[32 * b + i] / s, 1.0f) : 0;
            }
            for (int row = 0; row < D; row++) {
                double v = 0;
                for (int b = 0; b < OCOLS / 32; b++) {
                    int acc = 0;
                    for (int i = 0; i < 32; i++)
                        acc += wo[(size_t)row * HQ * DH + g * OCOLS + 32 * b + i] * oqh[32 * b + i];
                    v += (double)acc * __half2float(wo_s[(size_t)row * (HQ * DH / 32) + g * (OCOLS / 32) + b]) * osh[b];
                }
                ref[(size_t)g * D + row] = (float)v;
            }
        }
    }

    /* device copies: several weight sets, so that a chain streams from DRAM as a model does */
    const int sets = 24;
    auto dup = [&](const void *src, size_t bytes) {
        void *d;
        CHECK_CUDA(cudaMalloc(&d, bytes * sets));
        for (int i = 0; i < sets; i++)
            CHECK_CUDA(cudaMemcpy((uint8_t *)d + i * bytes, src, bytes, cudaMemcpyHostToDevice));
        return d;
    };
    auto one = [&](const void *src, size_t bytes) {
        void *d;
        CHECK_CUDA(cudaMalloc(&d, bytes));
        CHECK_CUDA(cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice));
        return d;
    };
    float *dx = (float *)one(x.data(), D * 4), *dres = (float *)one(x.data(), D * 4);
    float *dwn = (float *)one(wn.data(), D * 4), *dqn = (float *)one(qn.data(), DH * 4),
          *dkn = (float *)one(kn.data(), DH * 4), *dcs = (float *)one(cs.data(), DH * 2),
          *dsn = (float *)one(sn.data(), DH * 2);
    int8_t *dwqkv = (int8_t *)dup(wqkv.data(), nqkv), *dwo = (int8_t *)dup(wo.data(), nwo);
    __half *dwqkv_s = (__half *)dup(wqkv_s.data(), nqkv / 16), *dwo_s = (__half *)dup(wo_s.data(), nwo / 16);
    __half *dkc = (__half *)dup(kc.data(), kc.size() * 2), *dvc = (__half *)dup(vc.data(), vc.size() * 2);
    cudaStream_t st;
    CHECK_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    float *dpart;
    CHECK_CUDA(cudaMalloc(&dpart, (size_t)HKV * D * 4 * sets));
    /* the rest of a layer, for the layer chain: the backend's own q8_0 launches of the
     * gate/up pair (rms_norm prologue, SwiGLU) and ffn_down (+ residual), Qwen3-0.6B's
     * d_ff 3072, random weights in the upload layout */
    const int64_t F = 3072;
    std::vector<int8_t> wgu(2 * F * D), wdn(F * D);
    std::vector<__half> wgu_s(2 * F * D / 32), wdn_s(F * D / 32);
    for (auto &v : wgu) v = (int8_t)(frand() * 127);
    for (auto &v : wdn) v = (int8_t)(frand() * 127);
    for (auto &v : wgu_s) v = __float2half(0.002f * (1.5f + frand()));
    for (auto &v : wdn_s) v = __float2half(0.002f * (1.5f + frand()));
    int8_t *dwgu = (int8_t *)dup(wgu.data(), wgu.size()), *dwdn = (int8_t *)dup(wdn.data(), wdn.size());
    __half *dwgu_s = (__half *)dup(wgu_s.data(), wgu_s.size() * 2),
           *dwdn_s = (__half *)dup(wdn_s.data(), wdn_s.size() * 2);
    float *dwn2 = (float *)one(wn.data(), D * 4), *dx2 = (float *)one(x.data(), D * 4), *dh;
    CHECK_CUDA(cudaMalloc(&dh, F * 4));
    auto mlp =
        [&](int i) { /* x (the sum's output) -> h -> x2 = x + h W_down^T */
                     struct cu_mv_seg pair = {}, down = {};
                     pair.w = {CU_Q8_0, F, D, dwgu + (size_t)i * 2 * F * D,
                               (const uint16_t *)(dwgu_s + (size_t)i * 2 * F * D / 32)};
                     const struct cu_weight up = {CU_Q8_0, F, D, dwgu + (size_t)i * 2 * F * D + F * D,
                                                  (const uint16_t *)(dwgu_s + (size_t)i * 2 * F * D / 32 + F * D / 32)};
                     pair.y = dh;
                     pair.ep.act = IR_OP_SILU;
                     pair.ep.norm_w = dwn2;
                     pair.ep.norm_eps = EPS;
                     CHECK_CUDA(cu_matvec_multi(st, dx, 1, &pair, 1, &up));
                     down.w = {CU_Q8_0, D, F, dwdn + (size_t)i * F * D,
                               (const uint16_t *)(dwdn_s + (size_t)i * F * D / 32)};
                     down.y = dx2;
                     down.ep.act = -1;
                     down.ep.residual = dx;
                     CHECK_CUDA(cu_matvec_multi(st, dh, 1, &down, 1, NULL));
        };
    auto args = [&](int i) {
        lab_args a = {};
        a.x = dx, a.wn = dwn, a.qn = dqn, a.kn = dkn, a.cosv = dcs, a.sinv = dsn;
        a.wqkv = dwqkv + i * nqkv, a.wqkv_s = dwqkv_s + i * (nqkv / 32);
        a.wo = dwo + i * nwo, a.wo_s = dwo_s + i * (nwo / 32);
        a.kc = dkc + (size_t)i * kc.size(), a.vc = dvc + (size_t)i * kc.size();
        a.partial = dpart + (size_t)i * HKV * D;
        a.p = p, a.pmax = pmax, a.stop = 6;
        a.defer = defer, a.rawbar = rawbar, a.kvglobal = kvglobal;
        return a;
    };

    /* check */
    launch<C>(st, args(0), L.total, false, xch);
    CHECK_CUDA(cudaStreamSynchronize(st));
    std::vector<float> got((size_t)HKV * D);
    CHECK_CUDA(cudaMemcpy(got.data(), dpart, got.size() * 4, cudaMemcpyDeviceToHost));
    double worst = 0, amax = 0;
    for (size_t i = 0; i < got.size(); i++) amax = fmax(amax, fabs(ref[i]));
    for (size_t i = 0; i < got.size(); i++) worst = fmax(worst, fabs(got[i] - ref[i]) / amax);
    printf("check: worst |error| / max |ref| = %.3g over %zu outputs (max |ref| %.3g): %s\n", worst, got.size(), amax,
           worst < 2e-2 ? "ok" : "FAILED");
    if (!(worst < 2e-2)) return 1;

    mlp(0); /* once outside a capture: the backend's launches set their attributes on first use */
    CHECK_CUDA(cudaStreamSynchronize(st));

    /* chains of dependent launches, captured once and replayed */
    int stop = 6, noload = 0;
    auto timed = [&](const char *what, int mode) {
        cudaGraph_t gr;
        cudaGraphExec_t ge;
        CHECK_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        for (int i = 0; i < launches; i++) {
            lab_args ai = args(i % sets);
            ai.stop = stop, ai.noload = noload;
            if (mode >= 3) { /* a layer: the block reads the last ffn_down's output */
                ai.x = dx2;
                if (mode == 3) launch<C>(st, ai, L.total, true, xch);
                launch_sum(st, dpart + (size_t)(i % sets) * HKV * D, dx2, dx);
                mlp(i % sets);
                continue;
            }
            if (mode != 1) launch<C>(st, ai, L.total, true, xch);
            if (mode != 0) launch_sum(st, dpart + (size_t)(i % sets) * HKV * D, dres, dx);
        }
        CHECK_CUDA(cudaStreamEndCapture(st, &gr));
        CHECK_CUDA(cudaGraphInstantiate(&ge, gr, 0));
        cudaEvent_t e0, e1;
        CHECK_CUDA(cudaEventCreate(&e0));
        CHECK_CUDA(cudaEventCreate(&e1));
        std::vector<float> ms;
        for (int rep = 0; rep < 12; rep++) {
            CHECK_CUDA(cudaEventRecord(e0, st));
            CHECK_CUDA(cudaGraphLaunch(ge, st));
            CHECK_CUDA(cudaEventRecord(e1, st));
            CHECK_CUDA(cudaEventSynchronize(e1));
            float v;
            CHECK_CUDA(cudaEventElapsedTime(&v, e0, e1));
            if (rep >= 2) ms.push_back(v);
        }
        std::sort(ms.begin(), ms.end());
        printf("%-44s %7.2f us a link (median of %zu replays of %d links; best %.2f)\n", what,
               ms[ms.size() / 2] * 1e3 / launches, ms.size(), launches, ms[0] * 1e3 / launches);
        CHECK_CUDA(cudaGraphExecDestroy(ge));
        CHECK_CUDA(cudaGraphDestroy(gr));
    };
    char what[96];
    snprintf(what, sizeof what, "attention block (C %d, P %d%s%s%s%s)", C, p, kvglobal ? ", K/V global" : "",
             p2p    ? ", p2p"
             : pull ? ", pull"
                    : "",
             defer ? ", defer" : "", rawbar ? ", raw barriers" : "");
    timed(what, 0);
    timed("sum of the partials + residual alone", 1);
    snprintf(what, sizeof what, "attention block + the sum (C %d, P %d)", C, p);
    timed(what, 2);
    timed("a layer: attention block, sum, gate/up pair, ffn_down", 3);
    timed("  the sum, gate/up pair and ffn_down alone", 4);
    static const char *phase[] = {"the PDL wait and the copies",   "+ x normed and quantized",
                                  "+ q/k/v rows, barrier",         "+ q/k norm and rope",
                                  "+ attention partials, barrier", "+ merge"};
    for (stop = 0; stop < 6; stop++) {
        snprintf(what, sizeof what, "  leaving after %d: %s", stop, phase[stop]);
        timed(what, 0);
    }
    stop = 6, noload = 1;
    timed("  all phases, no weight or K/V copies", 0);
    stop = 0;
    timed("  leaving after 0, no copies (the launch chain)", 0);
    return 0;
}

int main(int argc, char **argv) {
    const int p = argc > 1 ? atoi(argv[1]) : 576, c = argc > 2 ? atoi(argv[2]) : 16,
              launches = argc > 3 ? atoi(argv[3]) : 112;
    if (p < 2 || launches < 1) {
        fprintf(stderr, "usage: %s [P >= 2 [C 8|16 [LAUNCHES]]]\n", argv[0]);
        return 2;
    }
    const int kvglobal = argc > 4 ? atoi(argv[4]) : 0, pull = argc > 5 ? atoi(argv[5]) : 1,
              defer = argc > 6 ? atoi(argv[6]) : 0, rawbar = argc > 7 ? atoi(argv[7]) : 0,
              p2p = argc > 8 ? atoi(argv[8]) : 0;
    if (c == 16) return run<16>(p, launches, kvglobal, pull, defer, rawbar, p2p);
    if (c == 8) return run<8>(p, launches, kvglobal, pull, defer, rawbar, p2p);
    fprintf(stderr, "C must be 8 or 16, not %d\n", c);
    return 2;
}
