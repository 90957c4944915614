/* The runtime-state ops: attention over the paged KV cache (f32 or f16 K/V rows, the
 * block-table layout of kv_cache.h; every kernel is instantiated for both, loads widen
 * to f32 and appends round to nearest even; q8_0 rows, kv_q8_t below, through kv_append,
 * the warp kernel, the tiled one and the tensor-core one), and short_conv over the conv
 * state.
 *
 * 1. kv_append: every token's K and V rows go to its sequence's block.
 * 2. attention_partial: one block per (context split, query head, token). The split's
 *    positions are walked ATT_CHUNK at a time: each position's K/V row address (through
 *    the block table) into shared memory, scores into shared memory (a warp per
 *    position, lanes over the head dim, 4 positions in flight), then an online softmax
 *    update of the running max, sum and the weighted V sum (a thread per head-dim
 *    element, 8 V loads in flight). Positions and block tables are read from device
 *    memory, so the launch is the same every decode step (a CUDA graph replays it).
 * 3. splits > 1: the last block of each (token, head) to finish merges the partial
 *    (max, sum, acc) of every split (flash-decoding for long contexts with few
 *    tokens), counted through a device counter it resets. A single token (decode)
 *    needs no step 1: the attention kernel appends its K/V and reads the token's own
 *    position from the inputs, so decode attention is one launch.
 * 2'. attention_tiled (batches above CU_ATT_TILED_MIN_TOKENS, head dim <= 128, a
 *    multiple of 4: prefill): one block per (16 consecutive tokens of the batch, head).
 *    For each sequence present in the tile, the union of its tokens' key ranges is
 *    walked 32 positions at a time: K and V rows into shared memory once for all 16
 *    queries (the per-token kernel reads them once per query), then a warp per query
 *    (lanes over keys) for scores and the online softmax, lanes over the head dim for
 *    the weighted V sum. Keys outside a query's causal (and window) range, or of
 *    another sequence, get no weight.
 * 2''. attention_dec (one token, opt-in: cu_attention's dec_splits): a thread-block
 *    cluster per (KV head, query heads of its group) over the context, merged through
 *    distributed shared memory (see the kernel). */
#include "backend/cuda/cuda_device.cuh"

#include <cooperative_groups.h>
#include <limits.h>

CU_TRACE_TU(cu_trace_tu_attention)

namespace cg = cooperative_groups;

#define ATT_THREADS 128
#define ATT_CHUNK 64
#define ATT_MAX_DH 512
#define ATT_DH_PER_THREAD (ATT_MAX_DH / ATT_THREADS)
#define ATT_MERGE_GROUP 16 /* splits whose partial results the merge loads at once */

static __device__ __forceinline__ int64_t kv_row(const int32_t *block_table, int max_blocks_per_slot,
                                                 int block_size, int32_t slot, int32_t pos) {
    int32_t block = block_table[(int64_t)slot * max_blocks_per_slot + pos / block_size];
    return (int64_t)block * block_size + pos % block_size;
}

/* The cache's element type KV (float, or __half when cu_attention's kv_f16; kv_q8_t
 * below): loads widen to f32, stores round to nearest even (the CPU cache's f16 rule),
 * and kv_pack4 (below) gives values as the cache holds them. */
static __device__ __forceinline__ float kv_ld(const float *p) { return *p; }
static __device__ __forceinline__ float kv_ld(const __half *p) { return __half2float(*p); }
static __device__ __forceinline__ void kv_st(float *p, float v) { *p = v; }
static __device__ __forceinline__ void kv_st(__half *p, float v) { *p = __float2half_rn(v); }
/* 4 consecutive cache values as loaded (kv_raw4<KV>::T: float4, or uint2 of 4 halves),
 * widened only where used, so a warp's loads are all in flight before the first
 * conversion waits on one; kv_pack4 rounds f32 values to that form. */
template <typename KV> struct kv_raw4;
template <> struct kv_raw4<float> { typedef float4 T; };
template <> struct kv_raw4<__half> { typedef uint2 T; };
static __device__ __forceinline__ float4 kv_raw_ld4(const float *p) { return *(const float4 *)p; }
static __device__ __forceinline__ uint2 kv_raw_ld4(const __half *p) { return *(const uint2 *)p; }
static __device__ __forceinline__ float4 kv_widen4(float4 r) { return r; }
static __device__ __forceinline__ float4 kv_widen4(uint2 u) {
    const float2 lo = __half22float2(*(const __half2 *)&u.x), hi = __half22float2(*(const __half2 *)&u.y);
    return make_float4(lo.x, lo.y, hi.x, hi.y);
}
static __device__ __forceinline__ void kv_pack4(float4 v, float4 *r) { *r = v; }
static __device__ __forceinline__ void kv_pack4(float4 v, uint2 *r) {
    const __half2 lo = __floats2half2_rn(v.x, v.y), hi = __floats2half2_rn(v.z, v.w);
    *r = make_uint2(*(const uint32_t *)&lo, *(const uint32_t *)&hi);
}

/* q8_0 rows (cu_attention's kv_q8; head sizes a multiple of 32, so a head's blocks are
 * whole): element i of a layer's cache is the int8 at byte i of its base, times the f16
 * scale (i / 32) of the array kv_scale_off bytes on: ggml's block_q8_0 values, written
 * by its rule (mv_q8_scale, kv_q8_byte). KV = kv_q8_t names the type; 4 values as loaded are
 * their quants and their block's scale. The kernels reach every type's rows through
 * kv_raw_at / kv_store_raw (and the tiled kernel kv_ld4_at), which take the layer's base,
 * an element index and the scale offset (unused by f32 and f16). */
struct kv_q8_t {
    int8_t q;
};
struct kv_q8x4 {
    uint32_t q; /* 4 quants, the first in the low byte */
    __half d;   /* their block's scale, as stored: widened where used, like the quants, so
                 * a warp's loads are all in flight before a conversion waits on one (a
                 * float here, converted at the load, made the decode attention wait on
                 * every row's scale in turn) */
};
template <> struct kv_raw4<kv_q8_t> { typedef kv_q8x4 T; };
template <typename KV> static constexpr bool kv_is_q8 = false;
template <> constexpr bool kv_is_q8<kv_q8_t> = true;
static __device__ __forceinline__ float4 kv_widen4(kv_q8x4 r) {
    const float d = __half2float(r.d);
    return make_float4((float)(int8_t)(r.q & 0xff) * d, (float)(int8_t)((r.q >> 8) & 0xff) * d,
                       (float)(int8_t)((r.q >> 16) & 0xff) * d, (float)(int8_t)(r.q >> 24) * d);
}
/* ggml's q8_0 rule on a block's values: d = amax / 127 and its 1 / d (mv_q8_scale, the
 * int8 x's too), the f32 for the quants and its f16 stored, and q = round(x / d) half
 * away from zero (here, unlike the int8 x's half to even: the CPU cache's rounding) */
static __device__ __forceinline__ uint32_t kv_q8_byte(float x, float id) {
    return (uint32_t)(uint8_t)(int8_t)roundf(x * id);
}
/* 4 consecutive values' quants by that rule, the first in the low byte */
static __device__ __forceinline__ uint32_t kv_q8_pack4(float4 v, float id) {
    return kv_q8_byte(v.x, id) | kv_q8_byte(v.y, id) << 8 | kv_q8_byte(v.z, id) << 16 | kv_q8_byte(v.w, id) << 24;
}
/* The f16 scale of element i of a q8_0 layer at base (the array soff bytes on) */
static __device__ __forceinline__ __half *kv_q8_scale_at(const void *base, int64_t i, int64_t soff) {
    return (__half *)((const uint8_t *)base + soff) + i / 32;
}
template <typename KV>
static __device__ __forceinline__ typename kv_raw4<KV>::T kv_raw_at(const void *base, int64_t i, int64_t soff) {
    if constexpr (kv_is_q8<KV>) {
        return kv_q8x4{*(const uint32_t *)((const int8_t *)base + i), *kv_q8_scale_at(base, i, soff)};
    } else {
        (void)soff;
        return kv_raw_ld4((const KV *)base + i);
    }
}
template <typename KV> static __device__ __forceinline__ float4 kv_ld4_at(const void *base, int64_t i, int64_t soff) {
    return kv_widen4(kv_raw_at<KV>(base, i, soff));
}
/* zeros as the cache holds them */
template <typename KV> static __device__ __forceinline__ typename kv_raw4<KV>::T kv_zero4(void) {
    typename kv_raw4<KV>::T r;
    if constexpr (kv_is_q8<KV>)
        r = kv_q8x4{0u, __float2half_rn(0.0f)};
    else
        kv_pack4(make_float4(0.0f, 0.0f, 0.0f, 0.0f), &r);
    return r;
}
/* A row's 4 values a lane (lanes 8b .. 8b + 7 holding block b of 32 of a q8_0 row) as
 * the cache would hold them; every lane of the warp calls it. */
template <typename KV> static __device__ __forceinline__ typename kv_raw4<KV>::T kv_pack4_warp(float4 v) {
    typename kv_raw4<KV>::T r;
    if constexpr (kv_is_q8<KV>) {
        float id;
        const float d = mv_q8_scale(cu_amax8(v), &id);
        r.q = kv_q8_pack4(v, id);
        r.d = __float2half_rn(d);
    } else {
        kv_pack4(v, &r);
    }
    return r;
}
/* Stores kv_pack4_warp's values of the lane at element i (q8_0: lane % 8 == 0 writes the
 * block's scale) */
template <typename KV>
static __device__ __forceinline__ void kv_store_raw(void *base, int64_t i, int64_t soff, typename kv_raw4<KV>::T r,
                                                    int lane) {
    if constexpr (kv_is_q8<KV>) {
        *(uint32_t *)((int8_t *)base + i) = r.q;
        if (lane % 8 == 0) *kv_q8_scale_at(base, i, soff) = r.d;
    } else {
        (void)soff;
        (void)lane;
        *(typename kv_raw4<KV>::T *)((KV *)base + i) = r;
    }
}
/* One block of 32 values x (element i, a multiple of 32, of the layer at base) into a
 * q8_0 cache. */
static __device__ __forceinline__ void kv_q8_store_block(void *base, int64_t i, int64_t soff, const float *x) {
    float amax = 0.0f, id;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = mv_q8_scale(amax, &id);
    for (int j = 0; j < 32; j += 4)
        *(uint32_t *)((int8_t *)base + i + j) = kv_q8_pack4(make_float4(x[j], x[j + 1], x[j + 2], x[j + 3]), id);
    *kv_q8_scale_at(base, i, soff) = __float2half_rn(d);
}

template <typename KV>
__global__ void kv_append_kernel(struct cu_attention a) {
    cu_pdl_trigger(); /* a dependent matvec may start loading its weights */
    CU_TRACE_END;
    cu_pdl_wait();    /* launched as a dependent itself */
    int t = blockIdx.x;
    int row_elems = a.n_kv_heads * a.head_dim;
    int64_t row = kv_row(a.block_table, a.max_blocks_per_slot, a.block_size, a.slot[t], a.pos[t]);
    if constexpr (kv_is_q8<KV>) { /* a thread a block of 32 (head sizes % 32 == 0) */
        for (int b = threadIdx.x; b < row_elems / 32; b += blockDim.x)
            for (int w = 0; w < 2; w++) {
                float x[32];
                for (int j = 0; j < 32; j++) {
                    const int e = 32 * b + j, h = e / a.head_dim, d = e % a.head_dim;
                    const int64_t src = ((int64_t)h * a.n_tok + t) * a.head_dim + d, tok = (int64_t)t * row_elems + e;
                    x[j] = w ? a.v[a.v_tok_major ? tok : src] : a.k[a.k_tok_major ? tok : src];
                }
                kv_q8_store_block(w ? a.v_cache : a.k_cache, row * row_elems + 32 * b, a.kv_scale_off, x);
            }
    } else {
        KV *kr = (KV *)a.k_cache + row * row_elems, *vr = (KV *)a.v_cache + row * row_elems;
        for (int e = threadIdx.x; e < row_elems; e += blockDim.x) {
            int h = e / a.head_dim, d = e % a.head_dim;
            int64_t src = ((int64_t)h * a.n_tok + t) * a.head_dim + d, tok = (int64_t)t * row_elems + e;
            kv_st(kr + e, a.k[a.k_tok_major ? tok : src]);
            kv_st(vr + e, a.v[a.v_tok_major ? tok : src]);
        }
    }
}

/* Merges a split's partial result into out once every split of (token, head) th has
 * left its (m, l, acc) in part: the last block to arrive (counters[th]) does it and
 * resets the counter. Called by all threads of each block. */
static __device__ __forceinline__ void att_merge_splits(const struct cu_attention &a, int64_t th, bool *last_block) {
    /* The block's stores of its partial result are ordered before thread 0's arrival by
     * the barrier; the arrival is an acq_rel atomic at gpu scope, which releases them
     * (cumulatively) and, in the last block, acquires every other block's, which the
     * barrier after it passes on to the block's threads (loads through L2 below). Was a
     * __threadfence by every thread before the barrier and after it, and a relaxed add. */
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned old;
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(a.counters + th) : "memory");
        *last_block = old == (unsigned)a.splits - 1;
    }
    __syncthreads();
    if (!*last_block) return;
    const int Dh = a.head_dim;
    const float *pt = a.part + th * a.splits * (Dh + 2);
    for (int d = threadIdx.x; d < Dh; d += blockDim.x) {
        /* 16 splits' (m, l, acc[d]) loaded at once: one round trip for up to 16 splits,
         * not one for (m, l) and another for the acc values; groups merged online */
        float mm = -INFINITY, ll = 0.0f, o = 0.0f;
        for (int s0 = 0; s0 < a.splits; s0 += ATT_MERGE_GROUP) {
            float mv[ATT_MERGE_GROUP], lv[ATT_MERGE_GROUP], ov[ATT_MERGE_GROUP];
#pragma unroll
            for (int j = 0; j < ATT_MERGE_GROUP; j++) {
                lv[j] = 0.0f;
                if (s0 + j < a.splits) {
                    const float *ps = pt + (s0 + j) * (Dh + 2);
                    mv[j] = __ldcg(ps);
                    lv[j] = __ldcg(ps + 1);
                    ov[j] = __ldcg(ps + 2 + d);
                }
            }
            float gm = mm;
#pragma unroll
            for (int j = 0; j < ATT_MERGE_GROUP; j++)
                if (lv[j] > 0.0f) gm = fmaxf(gm, mv[j]);
            if (gm == -INFINITY) continue; /* no positions yet */
            const float c = expf(mm - gm); /* 0 on the first group with positions */
            ll *= c;
            o *= c;
#pragma unroll
            for (int j = 0; j < ATT_MERGE_GROUP; j++) /* the weight of each split, and the sum */
                if (lv[j] > 0.0f) {
                    const float w = expf(mv[j] - gm);
                    ll += lv[j] * w;
                    o += ov[j] * w;
                }
            mm = gm;
        }
        a.out[th * Dh + d] = o / ll;
    }
    if (threadIdx.x == 0) a.counters[th] = 0; /* ready for the next launch */
}

/* What a decode block (context split `split`, query head h, token t) works on: its KV
 * head, the token's position and slot, and its positions [begin, end) — whole ATT_CHUNK
 * chunks of the (windowed) context, split as evenly as the chunk count allows; k_own,
 * v_own: the token's own K/V head rows in the k/v inputs, [n_kv_heads, n_tok, Dh]. */
struct att_span {
    int kvh, row_elems;
    int32_t p, slot, begin, end;
    const float *k_own, *v_own;
};
static __device__ __forceinline__ struct att_span att_decode_span(const struct cu_attention &a, int split, int h,
                                                                  int t) {
    struct att_span sp;
    const int Dh = a.head_dim, group = a.n_heads / a.n_kv_heads;
    sp.kvh = h / group;
    sp.row_elems = a.n_kv_heads * Dh;
    sp.p = a.pos[t];
    sp.slot = a.slot[t];
    const int32_t first = a.window > 0 && sp.p + 1 > a.window ? sp.p + 1 - a.window : 0;
    const int32_t n_chunks = (sp.p + 1 - first + ATT_CHUNK - 1) / ATT_CHUNK;
    const int32_t per = (n_chunks + a.splits - 1) / a.splits;
    sp.begin = first + split * per * ATT_CHUNK;
    sp.end = min(sp.p + 1, sp.begin + per * ATT_CHUNK);
    const int64_t own = ((int64_t)sp.kvh * a.n_tok + t) * Dh, own_tm = (int64_t)t * sp.row_elems + (int64_t)sp.kvh * Dh;
    sp.k_own = a.k + (a.k_tok_major ? own_tm : own);
    sp.v_own = a.v + (a.v_tok_major ? own_tm : own);
    return sp;
}

/* APPEND: the first block of each KV head writes the token's own K/V row into the
 * cache (k_row: the K row to store, the k input's or the block's rotated one). */
template <typename KV>
static __device__ __forceinline__ void att_append_own(const struct cu_attention &a, const struct att_span &sp,
                                                      int split, int h, const float *k_row) {
    if (split != 0 || h % (a.n_heads / a.n_kv_heads)) return;
    const int Dh = a.head_dim;
    const int64_t row =
        kv_row(a.block_table, a.max_blocks_per_slot, a.block_size, sp.slot, sp.p) * sp.row_elems + (int64_t)sp.kvh * Dh;
    for (int d = threadIdx.x; d < Dh; d += blockDim.x) {
        kv_st((KV *)a.k_cache + row + d, k_row[d]);
        kv_st((KV *)a.v_cache + row + d, sp.v_own[d]);
    }
}

/* APPEND (one token): the kernel appends the token's K/V itself (a block per KV head
 * writes its row); every block reads the token's own position from the k/v inputs, the
 * other positions from the cache. With splits, each block leaves its partial result
 * and the last block of a (token, head) to finish merges them (counters[t, h], reset
 * by that block), so no combine kernel follows. */
template <bool APPEND, typename KV>
__global__ void __launch_bounds__(ATT_THREADS) attention_partial_kernel(struct cu_attention a) {
    cu_pdl_trigger(); /* a dependent matvec may start loading its weights */
    CU_TRACE_END;
    cu_pdl_wait();    /* launched as a dependent itself */
    __shared__ float qs[ATT_MAX_DH];
    __shared__ float sc[ATT_CHUNK];
    __shared__ const KV *krow[ATT_CHUNK], *vrow[ATT_CHUNK]; /* each position's K/V head row */
    __shared__ KV kown[ATT_MAX_DH], vown[ATT_MAX_DH];        /* the token's own row, as the cache holds it */
    __shared__ float red[32];
    __shared__ bool last_block;
    const int split = blockIdx.x, h = blockIdx.y, t = blockIdx.z;
    const int Dh = a.head_dim, lane = threadIdx.x % CU_WARP, warp = threadIdx.x / CU_WARP;
    constexpr int nw = ATT_THREADS / CU_WARP;
    const struct att_span sp = att_decode_span(a, split, h, t);
    if (APPEND) att_append_own<KV>(a, sp, split, h, sp.k_own);
    const int kvh = sp.kvh, row_elems = sp.row_elems;
    const int32_t p = sp.p, slot = sp.slot, begin = sp.begin, end = sp.end;
    const KV *kc = (const KV *)a.k_cache, *vc = (const KV *)a.v_cache;

    for (int d = threadIdx.x; d < Dh; d += ATT_THREADS) {
        qs[d] = a.q[((int64_t)h * a.n_tok + t) * Dh + d];
        kv_st(&kown[d], sp.k_own[d]);
        kv_st(&vown[d], sp.v_own[d]);
    }
    float m = -INFINITY, l = 0.0f, acc[ATT_DH_PER_THREAD];
#pragma unroll
    for (int i = 0; i < ATT_DH_PER_THREAD; i++) acc[i] = 0.0f;

    for (int32_t c0 = begin; c0 < end; c0 += ATT_CHUNK) {
        const int cn = min(ATT_CHUNK, end - c0);
        for (int jj = threadIdx.x; jj < cn; jj += ATT_THREADS) {
            if (c0 + jj == p) {
                krow[jj] = kown;
                vrow[jj] = vown;
            } else {
                int64_t off = kv_row(a.block_table, a.max_blocks_per_slot, a.block_size, slot, c0 + jj) * row_elems +
                              (int64_t)kvh * Dh;
                krow[jj] = kc + off;
                vrow[jj] = vc + off;
            }
        }
        __syncthreads(); /* krow/vrow (and qs on the first chunk) */
        /* scores: a warp per position, 4 positions in flight per warp */
        for (int jj0 = warp; jj0 < cn; jj0 += 4 * nw) {
            float dot[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int jj = jj0 + u * nw;
                dot[u] = 0.0f;
                if (jj < cn) {
                    const KV *kr = krow[jj];
                    for (int d = lane; d < Dh; d += CU_WARP) dot[u] += qs[d] * kv_ld(kr + d);
                }
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                float v = cu_warp_sum(dot[u]);
                int jj = jj0 + u * nw;
                if (lane == 0 && jj < cn) sc[jj] = v * a.scale;
            }
        }
        __syncthreads();
        float cm = -INFINITY;
        for (int jj = threadIdx.x; jj < cn; jj += ATT_THREADS) cm = fmaxf(cm, sc[jj]);
        cm = cu_block_max(cm, red);
        const float new_m = fmaxf(m, cm);
        const float corr = expf(m - new_m); /* 0 on the first chunk (m = -inf) */
        float csum = 0.0f;
        for (int jj = threadIdx.x; jj < cn; jj += ATT_THREADS) {
            float e = expf(sc[jj] - new_m);
            sc[jj] = e;
            csum += e;
        }
        csum = cu_block_sum(csum, red); /* its barriers also publish sc */
        l = l * corr + csum;
        m = new_m;
#pragma unroll
        for (int i = 0; i < ATT_DH_PER_THREAD; i++) {
            int d = threadIdx.x + i * ATT_THREADS;
            if (d >= Dh) break;
            float s0 = acc[i] * corr, s1 = 0.0f;
            int jj = 0;
            /* two sums, 8 loads in flight: the loop is load-latency bound */
            for (; jj + 8 <= cn; jj += 8) {
                float v[8];
#pragma unroll
                for (int u = 0; u < 8; u++) v[u] = kv_ld(vrow[jj + u] + d);
#pragma unroll
                for (int u = 0; u < 8; u += 2) {
                    s0 += sc[jj + u] * v[u];
                    s1 += sc[jj + u + 1] * v[u + 1];
                }
            }
            for (; jj < cn; jj++) s0 += sc[jj] * kv_ld(vrow[jj] + d);
            acc[i] = s0 + s1;
        }
        __syncthreads(); /* sc and krow/vrow are rewritten by the next chunk */
    }

    const int64_t th = (int64_t)t * a.n_heads + h;
    if (a.splits == 1) {
#pragma unroll
        for (int i = 0; i < ATT_DH_PER_THREAD; i++) {
            int d = threadIdx.x + i * ATT_THREADS;
            if (d < Dh) a.out[th * Dh + d] = acc[i] / l;
        }
        return;
    }
    float *part = a.part + (th * a.splits + split) * (Dh + 2);
#pragma unroll
    for (int i = 0; i < ATT_DH_PER_THREAD; i++) {
        int d = threadIdx.x + i * ATT_THREADS;
        if (d < Dh) part[2 + d] = acc[i];
    }
    if (threadIdx.x == 0) {
        part[0] = m;
        part[1] = l;
    }
    att_merge_splits(a, th, &last_block);
}

/* Decode attention with warps as independent sub-splits (head dim a multiple of 4, at
 * most 128: a lane holds 4 dims of a row). One block of NW warps (4 or 8) per (split,
 * head, token), the split's positions as in attention_partial_kernel; warp w takes
 * positions w, w + NW, ... of each group of ATT_CHUNK, P = ATT_CHUNK / NW of them (16
 * or 8): the lanes find P rows through the block table at once, load P K rows and P V
 * rows (2P independent loads a lane: 16 bytes of f32 rows, 8 of f16), score the K rows
 * (their P partial dot products summed over the lanes by one transposed exchange
 * tree, att_sum_transposed: log2(32) exchange rounds instead of P warp sums, and one
 * exp a lane), update the warp's own running max / sum / weighted V sum. The warps
 * merge at the end; splits merge as in attention_partial_kernel (counters, last
 * block), and APPEND has the same meaning. NW: cu_attention_warps.
 * kv_before_wait (APPEND only): the positions, slots and block table are step inputs and
 * the cached rows were written by earlier steps, so the first group's rows are found
 * and loaded before the PDL wait, while the kernel before (the q/k/v product) runs; the
 * token's own row comes from the inputs after the wait.
 * rope_c (APPEND only): q and k are the raw [rms_norm ->] rope inputs; every warp
 * normalizes and rotates the block's q row and the token's k row in registers
 * (att_dec_rope: q, k, the rope rows and norm weights in one round of loads, no block
 * barrier; head dims % 8 == 4: warps 0 and 1 into shared memory), cu_norm_rope's
 * arithmetic, and the appended K row is the rotated one. The split merge loads up to 16
 * splits' partial results in one round. */
/* NW warps a block share a group of ATT_CHUNK positions, ATT_CHUNK / NW a warp (a round). */
template <int NW> struct att_w {
    static constexpr int POS = ATT_CHUNK / NW; /* positions a warp a round */
    static_assert(POS * NW == ATT_CHUNK && POS <= CU_WARP, "a round is one ATT_CHUNK");
};

/* Lane i < POS of warp `warp` finds the cache offset of the warp's i-th position of the
 * group at c0 (-1: past the span or the token's own position); the warp's count of
 * positions in the group. */
template <int NW>
static __device__ __forceinline__ int att_warp_rows(const struct cu_attention &a, const struct att_span &sp, int32_t c0,
                                                    int warp, int lane, int64_t *off) {
    constexpr int POS = att_w<NW>::POS;
    const int32_t mine = c0 + warp + NW * lane;
    *off = -1;
    if (lane < POS && mine < sp.end && mine != sp.p)
        *off = kv_row(a.block_table, a.max_blocks_per_slot, a.block_size, sp.slot, mine) * sp.row_elems +
               (int64_t)sp.kvh * a.head_dim;
    return min(POS, max(0, (sp.end - c0 - warp + NW - 1) / NW));
}

/* The warp's K and V rows of a group (this lane's 4 dims; zeros where there is none,
 * and at the token's own position, which the kernel fills). */
template <typename KV, int POS>
static __device__ __forceinline__ void att_warp_load(const struct cu_attention &a, int64_t off, int n_mine, bool dl,
                                                     int lane, typename kv_raw4<KV>::T *kk,
                                                     typename kv_raw4<KV>::T *vv) {
#pragma unroll
    for (int i = 0; i < POS; i++) {
        const int64_t oi = __shfl_sync(0xffffffffu, off, i);
        kk[i] = kv_zero4<KV>();
        vv[i] = kk[i];
        if (i < n_mine && dl && oi >= 0) {
            kk[i] = kv_raw_at<KV>(a.k_cache, oi + 4 * lane, a.kv_scale_off);
            vv[i] = kv_raw_at<KV>(a.v_cache, oi + 4 * lane, a.kv_scale_off);
        }
    }
}

/* x (this lane's 4 dims, as given) [rms-normalized with weights w (NULL: none)] then
 * rotated with the rope rows c, s: d < Dh/2 takes x[d] c[d] - x[d + Dh/2] s[d], the
 * rest x[d] c[d] + x[d - Dh/2] s[d]; cu_norm_rope's arithmetic. All lanes call it. */
static __device__ __forceinline__ float4 att_dec_rope(float4 x, const float *w, float4 wn, float4 c, float4 s,
                                                      float eps, int Dh, int lane) {
    if (w) {
        float ss = x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w;
        ss = cu_warp_sum(ss);
        const float scale = 1.0f / sqrtf(ss / (float)Dh + eps);
        x = make_float4(x.x * scale * wn.x, x.y * scale * wn.y, x.z * scale * wn.z, x.w * scale * wn.w);
    }
    const int hl = Dh / 8, lo = lane < hl;
    const int src = lo ? lane + hl : (lane < 2 * hl ? lane - hl : lane);
    float4 o;
    o.x = __shfl_sync(0xffffffffu, x.x, src);
    o.y = __shfl_sync(0xffffffffu, x.y, src);
    o.z = __shfl_sync(0xffffffffu, x.z, src);
    o.w = __shfl_sync(0xffffffffu, x.w, src);
    const float sg = lo ? -1.0f : 1.0f;
    return make_float4(x.x * c.x + sg * o.x * s.x, x.y * c.y + sg * o.y * s.y, x.z * c.z + sg * o.z * s.z,
                       x.w * c.w + sg * o.w * s.w);
}

/* c ? a : b on values (a select of array elements written as such becomes a select of
 * their addresses, and the array goes to local memory) */
static __device__ __forceinline__ float att_sel(bool c, float a, float b) {
    float r;
    asm("{\n.reg .pred p;\nsetp.ne.u32 p, %3, 0;\nselp.f32 %0, %1, %2, p;\n}"
        : "=f"(r)
        : "f"(a), "f"(b), "r"((unsigned)c));
    return r;
}

/* Sums each of V values (V a power of 2, <= 32) over the warp's lanes: returns, to
 * lane l, the sum of value l / (32 / V). Halving exchanges: at offset 16 a lane keeps
 * half its values (the upper half where the offset's bit is set) and adds its partner's
 * copy of that half, and so on; then plain butterfly sums over the remaining bits. */
template <int N, int OFF> struct att_xsum { /* N values left, exchanged at offset OFF */
    static __device__ __forceinline__ float run(float *v, int lane) {
        const bool up = lane & OFF;
#pragma unroll
        for (int k = 0; k < N / 2; k++) {
            const float send = att_sel(up, v[k], v[k + N / 2]), keep = att_sel(up, v[k + N / 2], v[k]);
            v[k] = keep + __shfl_xor_sync(0xffffffffu, send, OFF);
        }
        return att_xsum<N / 2, OFF / 2>::run(v, lane);
    }
};
template <int OFF> struct att_xsum<1, OFF> {
    static __device__ __forceinline__ float run(float *v, int lane) {
        float s = v[0];
#pragma unroll
        for (int off = OFF; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
        return s;
    }
};
template <int V>
static __device__ __forceinline__ float att_sum_transposed(float (&v)[V], int lane) {
    return att_xsum<V, 16>::run(v, lane);
}

/* MINB: blocks an SM the registers must allow (8 warps: 2, <= 128 registers; f16 rows
 * also 3, <= 80: att_warp_launch). */
template <bool APPEND, typename KV, int NW, int MINB>
__global__ void __launch_bounds__(NW *CU_WARP, MINB) attention_warp_kernel(struct cu_attention a) {
    cu_pdl_trigger(); /* a dependent matvec may start loading its weights */
    CU_TRACE_END;
    const bool early = APPEND && a.kv_before_wait;
    if (!early) cu_pdl_wait(); /* launched as a dependent itself */
    constexpr int WPOS = att_w<NW>::POS;
    __shared__ float wm[NW], wl[NW];
    __shared__ __align__(16) float wacc[NW][128];
    __shared__ __align__(16) float qk[2][128]; /* rope_c: the rotated q and own k rows */
    __shared__ bool last_block;
    const int split = blockIdx.x, h = blockIdx.y, t = blockIdx.z;
    const int Dh = a.head_dim, lane = threadIdx.x % CU_WARP, warp = threadIdx.x / CU_WARP;
    const struct att_span sp = att_decode_span(a, split, h, t);
    const int32_t p = sp.p, begin = sp.begin, end = sp.end;
    const bool dl = 4 * lane < Dh; /* this lane's 4 dims exist */
    const float4 zero4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    typename kv_raw4<KV>::T kk[WPOS], vv[WPOS]; /* as cached: widened where used */
    int64_t off;
    int n_mine = att_warp_rows<NW>(a, sp, begin, warp, lane, &off);
    att_warp_load<KV, WPOS>(a, off, n_mine, dl, lane, kk, vv);
    if (early) cu_pdl_wait(); /* q, k, v of this step, and the scratch of the last attention */
    float4 q, kown = zero4, vown = zero4; /* this lane's dims of the (rotated) q row and the own K/V rows */
    if (APPEND && a.rope_c && Dh % 8 == 0) { /* every warp rotates q and k in registers: one round of loads */
        float4 qw = zero4, kw = zero4, c = zero4, s = zero4;
        q = zero4;
        if (dl) {
            q = *(const float4 *)(a.q + (int64_t)h * Dh + 4 * lane); /* one token: [H, Dh] */
            kown = *(const float4 *)(sp.k_own + 4 * lane);
            c = *(const float4 *)(a.rope_c + 4 * lane);
            s = *(const float4 *)(a.rope_s + 4 * lane);
            if (a.q_norm_w) qw = *(const float4 *)(a.q_norm_w + 4 * lane);
            if (a.k_norm_w) kw = *(const float4 *)(a.k_norm_w + 4 * lane);
        }
        q = att_dec_rope(q, a.q_norm_w, qw, c, s, a.q_eps, Dh, lane);
        kown = att_dec_rope(kown, a.k_norm_w, kw, c, s, a.k_eps, Dh, lane);
    } else if (APPEND && a.rope_c) { /* Dh % 8 == 4: warps 0 and 1 rotate the rows into shared memory */
        if (warp < 2) {
            const float *x = warp == 0 ? a.q + (int64_t)h * Dh : sp.k_own; /* one token: [H, Dh] */
            const float *wn = warp == 0 ? a.q_norm_w : a.k_norm_w;
            float scale = 1.0f;
            if (wn) {
                float ss = 0.0f;
                for (int k = lane; k < Dh; k += CU_WARP) ss += x[k] * x[k];
                ss = cu_warp_sum(ss);
                scale = 1.0f / sqrtf(ss / (float)Dh + (warp == 0 ? a.q_eps : a.k_eps));
            }
            const int half = Dh / 2;
            for (int k = lane; k < half; k += CU_WARP) {
                float x0 = x[k], x1 = x[k + half];
                if (wn) {
                    x0 = x0 * scale * wn[k];
                    x1 = x1 * scale * wn[k + half];
                }
                qk[warp][k] = x0 * a.rope_c[k] - x1 * a.rope_s[k];
                qk[warp][k + half] = x1 * a.rope_c[k + half] + x0 * a.rope_s[k + half];
            }
        }
        __syncthreads();
        q = dl ? *(const float4 *)&qk[0][4 * lane] : zero4;
        kown = dl ? *(const float4 *)&qk[1][4 * lane] : zero4;
    } else {
        q = dl ? *(const float4 *)(a.q + ((int64_t)h * a.n_tok + t) * Dh + 4 * lane) : zero4;
        if (dl) kown = *(const float4 *)(sp.k_own + 4 * lane);
    }
    if (dl) vown = *(const float4 *)(sp.v_own + 4 * lane);
    /* the own row as the cache holds it */
    const typename kv_raw4<KV>::T kown_c = kv_pack4_warp<KV>(kown), vown_c = kv_pack4_warp<KV>(vown);
    if (APPEND && split == 0 && h % (a.n_heads / a.n_kv_heads) == 0 && warp == 0 && dl) { /* a block a KV head */
        const int64_t row = kv_row(a.block_table, a.max_blocks_per_slot, a.block_size, sp.slot, p) * sp.row_elems +
                            (int64_t)sp.kvh * Dh + 4 * lane;
        kv_store_raw<KV>(a.k_cache, row, a.kv_scale_off, kown_c, lane);
        kv_store_raw<KV>(a.v_cache, row, a.kv_scale_off, vown_c, lane);
    }
    float m = -INFINITY, l = 0.0f;
    float4 acc = zero4;
    for (int32_t c0 = begin; c0 < end;) {
        if (n_mine > 0) {
#pragma unroll
            for (int i = 0; i < WPOS; i++) /* the token's own row, from the inputs as the cache holds it */
                if (c0 + warp + NW * i == p && dl) {
                    kk[i] = kown_c;
                    vv[i] = vown_c;
                }
            /* the WPOS dot products summed transposed (att_sum_transposed: lane l
             * gets row l / LPV), so each lane exponentiates one score and the
             * rows' weights reach every lane by a shuffle each */
            constexpr int LPV = CU_WARP / WPOS;
            float s[WPOS];
#pragma unroll
            for (int i = 0; i < WPOS; i++) {
                const float4 k4 = kv_widen4(kk[i]);
                s[i] = q.x * k4.x + q.y * k4.y + q.z * k4.z + q.w * k4.w;
            }
            float sc = att_sum_transposed<WPOS>(s, lane);
            sc = lane / LPV < n_mine ? sc * a.scale : -INFINITY;
            float cmax = sc;
#pragma unroll
            for (int o = LPV; o < CU_WARP; o *= 2) cmax = fmaxf(cmax, __shfl_xor_sync(0xffffffffu, cmax, o));
            const float new_m = fmaxf(m, cmax);
            const float corr = expf(m - new_m); /* 0 on the warp's first group (m = -inf) */
            const float e = expf(sc - new_m);   /* 0 past the warp's rows */
            float csum = e;
#pragma unroll
            for (int o = LPV; o < CU_WARP; o *= 2) csum += __shfl_xor_sync(0xffffffffu, csum, o);
            acc.x *= corr;
            acc.y *= corr;
            acc.z *= corr;
            acc.w *= corr;
#pragma unroll
            for (int i = 0; i < WPOS; i++) {
                const float ei = __shfl_sync(0xffffffffu, e, i * LPV);
                const float4 v4 = kv_widen4(vv[i]);
                acc.x += ei * v4.x;
                acc.y += ei * v4.y;
                acc.z += ei * v4.z;
                acc.w += ei * v4.w;
            }
            l = l * corr + csum;
            m = new_m;
        }
        c0 += ATT_CHUNK;
        if (c0 < end) {
            n_mine = att_warp_rows<NW>(a, sp, c0, warp, lane, &off);
            att_warp_load<KV, WPOS>(a, off, n_mine, dl, lane, kk, vv);
        }
    }
    /* the warps' results, merged by the block */
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
    if (dl) *(float4 *)&wacc[warp][4 * lane] = acc;
    __syncthreads();
    float bm = -INFINITY, bl = 0.0f;
#pragma unroll
    for (int w = 0; w < NW; w++)
        if (wl[w] > 0.0f) bm = fmaxf(bm, wm[w]);
    float wsc[NW];
#pragma unroll
    for (int w = 0; w < NW; w++) {
        wsc[w] = wl[w] > 0.0f ? expf(wm[w] - bm) : 0.0f;
        bl += wl[w] * wsc[w];
    }
    const int64_t th = (int64_t)t * a.n_heads + h;
    float *part = a.splits > 1 ? a.part + (th * a.splits + split) * (Dh + 2) : NULL;
    for (int d = threadIdx.x; d < Dh; d += NW * CU_WARP) {
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; w++) o += wacc[w][d] * wsc[w];
        if (part)
            part[2 + d] = o;
        else
            a.out[th * Dh + d] = o / bl;
    }
    if (!part) return;
    if (threadIdx.x == 0) {
        part[0] = bm;
        part[1] = bl;
    }
    att_merge_splits(a, th, &last_block);
}

/* One-token decode attention as a thread-block cluster (head dim a multiple of 8, at
 * most 128: a lane holds 4 dims of a row). A cluster of S blocks (the context split S
 * ways, contiguous ranges) per GB query heads of one KV head (GB: 4, 2 or 1 of its
 * group), so each cached K/V row is loaded once for GB heads; a block of W warps
 * splits its range again, warp w taking positions w, w + W, ..., R rows a round (16;
 * 8 where GB is 4): the lanes look up 32 rows in the block table at once, then every
 * row's K and V (16-byte loads for f32 rows, 8-byte for f16, all 2R in flight, kept as
 * cached until used). The GB x R partial dot products of a round are summed over the
 * lanes by halving exchanges (V - 1 shuffles for V = GB x R sums instead of 5 V),
 * leaving lane l the whole sum of product l / (32 / V); the running max, softmax
 * weights and sums are then one lane's work per (head, row), the weights shared through
 * shared memory for the weighted V sums (GB float4 a lane). The warps merge in shared
 * memory, then the blocks of the cluster through distributed shared memory (every block
 * reads the S partial results of its share of the outputs): no global scratch,
 * counters or fences. kv_before_wait, rope_c: as in attention_warp_kernel (att_dec_rope
 * in every warp), the norm weights loaded before the PDL wait and the rope rows
 * (written by this step's kernels) with q and k after it. */
#define ATT_DEC_MAX_WARPS 8
#define ATT_DEC_MAX_SPLITS CU_ATT_DEC_MAX_SPLITS

template <typename KV, int GB, int R>
__global__ void __launch_bounds__(ATT_DEC_MAX_WARPS *CU_WARP) attention_dec_kernel(struct cu_attention a) {
    cu_pdl_trigger(); /* a dependent matvec may start loading its weights */
    CU_TRACE_END;
    if (!a.kv_before_wait) cu_pdl_wait();
    constexpr int V = GB * R, LPV = CU_WARP / V, LPH = CU_WARP / GB; /* lanes a value, a head */
    typedef typename kv_raw4<KV>::T raw4;
    __shared__ __align__(16) float wacc[ATT_DEC_MAX_WARPS][GB][128];
    __shared__ float wm[ATT_DEC_MAX_WARPS][GB], wl[ATT_DEC_MAX_WARPS][GB];
    __shared__ __align__(16) float pe[ATT_DEC_MAX_WARPS][V];
    __shared__ float pc[ATT_DEC_MAX_WARPS][GB];
    __shared__ __align__(16) float bacc[GB][128];
    __shared__ float bm[GB], bl[GB];
    cg::cluster_group cluster = cg::this_cluster();
    const int S = (int)cluster.num_blocks(), rank = (int)cluster.block_rank();
    const int nw = blockDim.x / CU_WARP, lane = threadIdx.x % CU_WARP, warp = threadIdx.x / CU_WARP;
    const int Dh = a.head_dim, G = a.n_heads / a.n_kv_heads;
    const int h0 = blockIdx.y * GB, kvh = h0 / G, row_elems = a.n_kv_heads * Dh;
    const int32_t p = a.pos[0], slot = a.slot[0];
    const int32_t first = a.window > 0 && p + 1 > a.window ? p + 1 - a.window : 0;
    int32_t per = (p + 1 - first + S - 1) / S;
    per = (per + nw - 1) / nw * nw;
    const int32_t begin = first + rank * per, end = min(p + 1, begin + per);
    const int cnt = end - begin > warp ? (end - begin - warp + nw - 1) / nw : 0; /* the warp's positions */
    const bool dl = 4 * lane < Dh;
    const int64_t col = (int64_t)kvh * Dh + 4 * lane;
    const KV *kc = (const KV *)a.k_cache, *vc = (const KV *)a.v_cache;
    const auto lookup = [&](int j0) -> int64_t { /* lane j: the warp's position j0 + j (-1: none, or the own) */
        const int j = j0 + lane;
        const int32_t pj = begin + warp + nw * j;
        return j < cnt && pj != p ? kv_row(a.block_table, a.max_blocks_per_slot, a.block_size, slot, pj) * row_elems
                                  : -1;
    };
    raw4 kk[R], vv[R];
    const auto load = [&](int64_t off, int r) { /* round r's rows; zeros where there is none */
#pragma unroll
        for (int i = 0; i < R; i++) {
            const int64_t oi = __shfl_sync(0xffffffffu, off, (r % (CU_WARP / R)) * R + i);
            kv_pack4(make_float4(0.0f, 0.0f, 0.0f, 0.0f), &kk[i]);
            vv[i] = kk[i];
            if (dl && oi >= 0) {
                kk[i] = kv_raw_ld4(kc + oi + col);
                vv[i] = kv_raw_ld4(vc + oi + col);
            }
        }
    };
    int64_t off = cnt > 0 ? lookup(0) : -1;
    if (cnt > 0) load(off, 0);
    const float4 zero4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const bool rope = a.rope_c != NULL;
    const float4 qw = rope && a.q_norm_w && dl ? *(const float4 *)(a.q_norm_w + 4 * lane) : zero4;
    const float4 kw = rope && a.k_norm_w && dl ? *(const float4 *)(a.k_norm_w + 4 * lane) : zero4;
    if (a.kv_before_wait) cu_pdl_wait(); /* q, k, v and the rope rows of this step */
    float4 q[GB], kown = zero4, vown = zero4;
#pragma unroll
    for (int g = 0; g < GB; g++) q[g] = dl ? *(const float4 *)(a.q + (int64_t)(h0 + g) * Dh + 4 * lane) : zero4;
    if (dl) {
        kown = *(const float4 *)(a.k + (int64_t)kvh * Dh + 4 * lane);
        vown = *(const float4 *)(a.v + (int64_t)kvh * Dh + 4 * lane);
    }
    if (rope) {
        const float4 c = dl ? *(const float4 *)(a.rope_c + 4 * lane) : zero4;
        const float4 s = dl ? *(const float4 *)(a.rope_s + 4 * lane) : zero4;
#pragma unroll
        for (int g = 0; g < GB; g++) q[g] = att_dec_rope(q[g], a.q_norm_w, qw, c, s, a.q_eps, Dh, lane);
        kown = att_dec_rope(kown, a.k_norm_w, kw, c, s, a.k_eps, Dh, lane);
    }
    raw4 kown_c, vown_c; /* the own row as the cache holds it */
    kv_pack4(kown, &kown_c);
    kv_pack4(vown, &vown_c);
    if (rank == 0 && h0 % G == 0 && warp == 0 && dl) { /* APPEND: one block of each KV head */
        const int64_t row = kv_row(a.block_table, a.max_blocks_per_slot, a.block_size, slot, p) * row_elems + col;
        *(raw4 *)((KV *)a.k_cache + row) = kown_c;
        *(raw4 *)((KV *)a.v_cache + row) = vown_c;
    }
    const int vi = lane / LPV, gi = vi / R, ii = vi % R; /* the (head, row) of this lane's sum */
    float m = -INFINITY, l = 0.0f;
    float4 acc[GB];
#pragma unroll
    for (int g = 0; g < GB; g++) acc[g] = zero4;
    for (int r = 0; r * R < cnt; r++) { /* warp-uniform */
        if (r > 0) {
            if (r % (CU_WARP / R) == 0) off = lookup(r * R);
            load(off, r);
        }
#pragma unroll
        for (int i = 0; i < R; i++)
            if (begin + warp + nw * (r * R + i) == p) {
                kk[i] = kown_c;
                vv[i] = vown_c;
            }
        float s[V];
#pragma unroll
        for (int i = 0; i < R; i++) {
            const float4 k4 = kv_widen4(kk[i]);
#pragma unroll
            for (int g = 0; g < GB; g++) s[g * R + i] = q[g].x * k4.x + q[g].y * k4.y + q[g].z * k4.z + q[g].w * k4.w;
        }
        float sc = att_sum_transposed<V>(s, lane);
        sc = r * R + ii < cnt ? sc * a.scale : -INFINITY;
        float cm = sc;
#pragma unroll
        for (int o = LPV; o < LPH; o *= 2) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, o));
        const float new_m = fmaxf(m, cm); /* finite: a round has a row */
        const float corr = expf(m - new_m), e = expf(sc - new_m);
        float cs = e;
#pragma unroll
        for (int o = LPV; o < LPH; o *= 2) cs += __shfl_xor_sync(0xffffffffu, cs, o);
        l = l * corr + cs;
        m = new_m;
        if (lane % LPV == 0) pe[warp][vi] = e;
        if (lane % LPH == 0) pc[warp][gi] = corr;
        __syncwarp();
#pragma unroll
        for (int g = 0; g < GB; g++) {
            const float c = pc[warp][g];
            float4 o = make_float4(acc[g].x * c, acc[g].y * c, acc[g].z * c, acc[g].w * c);
#pragma unroll
            for (int i = 0; i < R; i++) {
                const float w = pe[warp][g * R + i];
                const float4 v4 = kv_widen4(vv[i]);
                o.x += w * v4.x;
                o.y += w * v4.y;
                o.z += w * v4.z;
                o.w += w * v4.w;
            }
            acc[g] = o;
        }
        __syncwarp(); /* pe and pc are rewritten by the next round */
    }
    /* the warps' results, merged by the block */
    if (lane % LPH == 0) {
        wm[warp][gi] = m;
        wl[warp][gi] = l;
    }
#pragma unroll
    for (int g = 0; g < GB; g++)
        if (dl) *(float4 *)&wacc[warp][g][4 * lane] = acc[g];
    __syncthreads();
    for (int e = threadIdx.x; e < GB * Dh; e += blockDim.x) {
        const int g = e / Dh, d = e % Dh;
        float mm = -INFINITY, ll = 0.0f, o = 0.0f;
        for (int w = 0; w < nw; w++)
            if (wl[w][g] > 0.0f) mm = fmaxf(mm, wm[w][g]);
        for (int w = 0; w < nw; w++)
            if (wl[w][g] > 0.0f) {
                const float f = expf(wm[w][g] - mm);
                ll += wl[w][g] * f;
                o += wacc[w][g][d] * f;
            }
        bacc[g][d] = o;
        if (d == 0) {
            bm[g] = mm;
            bl[g] = ll;
        }
    }
    cluster.sync(); /* every block's partial result written */
    /* output e (head h0 + e / Dh, dim e % Dh) is block e % S's: the S partials merged,
     * all S read at once */
    for (int e = rank + threadIdx.x * S; e < GB * Dh; e += S * (int)blockDim.x) {
        const int g = e / Dh, d = e % Dh;
        float lb[ATT_DEC_MAX_SPLITS], mb[ATT_DEC_MAX_SPLITS], ob[ATT_DEC_MAX_SPLITS];
#pragma unroll
        for (int b = 0; b < ATT_DEC_MAX_SPLITS; b++)
            if (b < S) {
                lb[b] = *cluster.map_shared_rank(&bl[g], b);
                mb[b] = *cluster.map_shared_rank(&bm[g], b);
                ob[b] = *cluster.map_shared_rank(&bacc[g][d], b);
            }
        float mm = -INFINITY, ll = 0.0f, o = 0.0f;
#pragma unroll
        for (int b = 0; b < ATT_DEC_MAX_SPLITS; b++)
            if (b < S && lb[b] > 0.0f) mm = fmaxf(mm, mb[b]);
#pragma unroll
        for (int b = 0; b < ATT_DEC_MAX_SPLITS; b++)
            if (b < S && lb[b] > 0.0f) {
                const float f = expf(mb[b] - mm);
                ll += lb[b] * f;
                o += ob[b] * f;
            }
        a.out[(int64_t)(h0 + g) * Dh + d] = o / ll;
    }
    cluster.sync(); /* no block leaves while another reads its shared memory */
}

#define ATT_TQ 16      /* queries per block */
#define ATT_TK 32      /* keys per shared-memory chunk (one per lane) */
#define ATT_TDH 128    /* largest head dim of the tiled kernel */
#define ATT_TTHREADS 256 /* 8 warps, 2 queries each */

template <typename KV>
__global__ void __launch_bounds__(ATT_TTHREADS) attention_tiled_kernel(struct cu_attention a) {
    cu_pdl_trigger(); /* a dependent matvec may start loading its weights */
    CU_TRACE_END;
    /* 16-byte aligned rows; K rows padded by 4 floats: the 8 lanes of a quarter-warp
     * reading 16 bytes from 8 different rows hit 8 different groups of 4 banks */
    __shared__ __align__(16) float qs[ATT_TQ][ATT_TDH];
    __shared__ __align__(16) float ks[ATT_TK][ATT_TDH + 4];
    __shared__ __align__(16) float vs[ATT_TK][ATT_TDH];
    __shared__ __align__(16) float ps[ATT_TQ][ATT_TK];
    __shared__ int32_t tpos[ATT_TQ], tslot[ATT_TQ], tfirst[ATT_TQ];
    __shared__ int32_t slots[ATT_TQ], n_slots;
    /* the last tiles (most keys in a prefill) first: less tail */
    const int h = blockIdx.y, t0 = (gridDim.x - 1 - blockIdx.x) * ATT_TQ, nq = min(ATT_TQ, a.n_tok - t0);
    const int Dh = a.head_dim, lane = threadIdx.x % CU_WARP, warp = threadIdx.x / CU_WARP;
    constexpr int nw = ATT_TTHREADS / CU_WARP, QPW = ATT_TQ / nw, DPL = ATT_TDH / CU_WARP;
    const int kvh = h / (a.n_heads / a.n_kv_heads), row_elems = a.n_kv_heads * Dh;
    if (threadIdx.x < ATT_TQ) {
        int q = threadIdx.x;
        int32_t p = q < nq ? a.pos[t0 + q] : 0;
        tpos[q] = p;
        tslot[q] = q < nq ? a.slot[t0 + q] : -1;
        tfirst[q] = a.window > 0 && p + 1 > a.window ? p + 1 - a.window : 0;
    }
    for (int e = threadIdx.x; e < nq * Dh; e += ATT_TTHREADS) {
        int q = e / Dh, d = e % Dh;
        qs[q][d] = a.q[((int64_t)h * a.n_tok + t0 + q) * Dh + d];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int n = 0;
        for (int q = 0; q < nq; q++) {
            int k = 0;
            while (k < n && slots[k] != tslot[q]) k++;
            if (k == n) slots[n++] = tslot[q];
        }
        n_slots = n;
    }
    float m[QPW], l[QPW], acc[QPW][DPL];
#pragma unroll
    for (int i = 0; i < QPW; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int k = 0; k < DPL; k++) acc[i][k] = 0.0f;
    }
    __syncthreads();
    for (int si = 0; si < n_slots; si++) {
        const int32_t slot = slots[si];
        int32_t lo = INT_MAX, hi = -1;
        for (int q = 0; q < nq; q++)
            if (tslot[q] == slot) {
                lo = min(lo, tfirst[q]);
                hi = max(hi, tpos[q]);
            }
        for (int32_t c0 = lo; c0 <= hi; c0 += ATT_TK) {
            const int cn = min(ATT_TK, hi + 1 - c0);
            const int dq = Dh / 4;
            for (int e = threadIdx.x; e < ATT_TK * dq; e += ATT_TTHREADS) {
                int j = e / dq, d4 = (e % dq) * 4;
                float4 kv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), vv = kv; /* rows past the chunk: zeros */
                if (j < cn) {
                    int64_t off = kv_row(a.block_table, a.max_blocks_per_slot, a.block_size, slot, c0 + j) *
                                      row_elems + (int64_t)kvh * Dh + d4;
                    kv = kv_ld4_at<KV>(a.k_cache, off, a.kv_scale_off);
                    vv = kv_ld4_at<KV>(a.v_cache, off, a.kv_scale_off);
                }
                *(float4 *)&ks[j][d4] = kv;
                *(float4 *)&vs[j][d4] = vv;
            }
            __syncthreads();
            const int32_t key = c0 + lane;
            bool live[QPW];
            float dot[QPW];
#pragma unroll
            for (int i = 0; i < QPW; i++) {
                const int q = warp + i * nw;
                live[i] = q < nq && tslot[q] == slot && lane < cn && key >= tfirst[q] && key <= tpos[q];
                dot[i] = 0.0f;
            }
            for (int d = 0; d < Dh; d += 4) { /* d in order: the reference's sum */
                const float4 kd = *(const float4 *)&ks[lane][d];
#pragma unroll
                for (int i = 0; i < QPW; i++) {
                    const float4 qd = *(const float4 *)&qs[warp + i * nw][d];
                    dot[i] += qd.x * kd.x;
                    dot[i] += qd.y * kd.y;
                    dot[i] += qd.z * kd.z;
                    dot[i] += qd.w * kd.w;
                }
            }
#pragma unroll
            for (int i = 0; i < QPW; i++) {
                const float sc = live[i] ? dot[i] * a.scale : -INFINITY;
                const float cm = cu_warp_max(sc); /* warp-uniform */
                float p = 0.0f;
                if (cm != -INFINITY) {
                    const float new_m = fmaxf(m[i], cm), corr = expf(m[i] - new_m);
                    p = live[i] ? expf(sc - new_m) : 0.0f;
                    l[i] = l[i] * corr + cu_warp_sum(p);
                    m[i] = new_m;
#pragma unroll
                    for (int k = 0; k < DPL; k++) acc[i][k] *= corr;
                }
                ps[warp + i * nw][lane] = p; /* 0 for keys past the chunk */
            }
            __syncwarp(); /* a warp reads back only its own queries' ps rows */
            for (int j = 0; j < cn; j += 4) {
                float v[4][DPL];
#pragma unroll
                for (int u = 0; u < 4; u++)
#pragma unroll
                    for (int k = 0; k < DPL; k++) v[u][k] = lane + k * CU_WARP < Dh ? vs[j + u][lane + k * CU_WARP] : 0.0f;
#pragma unroll
                for (int i = 0; i < QPW; i++) {
                    const float4 p = *(const float4 *)&ps[warp + i * nw][j];
#pragma unroll
                    for (int k = 0; k < DPL; k++) {
                        acc[i][k] += p.x * v[0][k];
                        acc[i][k] += p.y * v[1][k];
                        acc[i][k] += p.z * v[2][k];
                        acc[i][k] += p.w * v[3][k];
                    }
                }
            }
            __syncthreads(); /* ks, vs rewritten by the next chunk */
        }
    }
#pragma unroll
    for (int i = 0; i < QPW; i++) {
        const int q = warp + i * nw;
        if (q >= nq) continue;
        float *o = a.out + ((int64_t)(t0 + q) * a.n_heads + h) * Dh;
#pragma unroll
        for (int k = 0; k < DPL; k++) {
            const int d = lane + k * CU_WARP;
            if (d < Dh) o[d] = acc[i][k] / l[i];
        }
    }
}

/* ---- tensor-core prefill attention --------------------------------------------------- */

#define FA_WARPS 4
#define FA_ROWS (16 * FA_WARPS) /* query rows (token, head) of a block: 16 a warp */
#define FA_KC 64                /* keys per shared-memory chunk */

static __device__ __forceinline__ uint32_t fa_pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); /* lo in the low half: the lower index */
    return *reinterpret_cast<uint32_t *>(&v);
}

/* c (16x8 f32) += a (16x16 bf16, row) * b (16x8 bf16, col) */
static __device__ __forceinline__ void fa_mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Flash attention on bf16 tensor cores (mma.sync m16n8k16, f32 accumulation) over the
 * f32, f16 or q8_0 paged cache. A block takes one KV head and FA_ROWS query rows: TB = FA_ROWS / G
 * consecutive tokens times the G query heads that share the KV head (row r: token
 * t0 + r / G, head kvh * G + r % G), so one K/V chunk in shared memory serves every
 * head of the group. Warp w owns rows 16w..16w+15: its q rows (scaled by scale * log2 e)
 * stay in registers as A fragments. For each sequence present in the block, the union
 * of its tokens' key ranges is walked FA_KC keys at a time: the K and V rows of the
 * next chunk are copied to shared memory by cp.async as cached while the current one computes
 * (q8_0: the quants; each thread loads the scales of its units with its copies), then
 * converted to bf16 rows (padded by 16 bytes: the fragment loads and ldmatrix hit
 * distinct banks); a warp whose rows see none of the chunk's keys skips it; S = Q K^T
 * (FA_KC / 8 tiles of 16x8), masked (another sequence, past the query's position,
 * before its window), the online softmax in base 2 on the accumulators (a row's 4
 * lanes exchange their maxima), then P (the S accumulators repacked as bf16 A
 * fragments) times V (B fragments by ldmatrix.trans from the row-major V). Rounding:
 * q, k, v and p to bf16 (8 bits), sums in f32. */
template <int DH, typename KV>
struct fa_smem { /* dynamic shared memory of attention_mma_kernel<DH, KV> */
    static constexpr int EPU = 16 / (int)sizeof(KV); /* cache elements a 16-byte copy */
    static constexpr int LD = DH + 8, LDF = DH + EPU;
    KV k32[FA_KC * LDF], v32[FA_KC * LDF];        /* the chunk in flight (cp.async), as cached */
    __nv_bfloat16 ks[FA_KC * LD], vs[FA_KC * LD]; /* the chunk computed on, bf16 */
};

/* One 16-byte unit of staged cache elements to bf16 (4 f32 or 8 f16 values). */
static __device__ __forceinline__ void fa_to_bf16(const float *src, __nv_bfloat16 *dst) {
    const float4 v = *(const float4 *)src;
    *(uint2 *)dst = make_uint2(fa_pack(v.x, v.y), fa_pack(v.z, v.w));
}
static __device__ __forceinline__ void fa_to_bf16(const __half *src, __nv_bfloat16 *dst) {
    const uint4 u = *(const uint4 *)src;
    const float2 x = __half22float2(*(const __half2 *)&u.x), y = __half22float2(*(const __half2 *)&u.y);
    const float2 z = __half22float2(*(const __half2 *)&u.z), w = __half22float2(*(const __half2 *)&u.w);
    *(uint4 *)dst = make_uint4(fa_pack(x.x, x.y), fa_pack(y.x, y.y), fa_pack(z.x, z.y), fa_pack(w.x, w.y));
}

/* 16 q8_0 cache values (16 int8, one block's, whose scale is d) to bf16: q d is exact in
 * f32 (8 x 11 bits), then rounded to bf16 as the other cache types are */
static __device__ __forceinline__ void fa_to_bf16(const kv_q8_t *src, float d, __nv_bfloat16 *dst) {
    const uint4 u = *(const uint4 *)src;
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
    uint32_t p[8];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        p[2 * i] = fa_pack((float)(int8_t)(w[i] & 0xffu) * d, (float)(int8_t)(w[i] >> 8 & 0xffu) * d);
        p[2 * i + 1] = fa_pack((float)(int8_t)(w[i] >> 16 & 0xffu) * d, (float)(int8_t)(w[i] >> 24) * d);
    }
    ((uint4 *)dst)[0] = make_uint4(p[0], p[1], p[2], p[3]);
    ((uint4 *)dst)[1] = make_uint4(p[4], p[5], p[6], p[7]);
}

/* 16 bytes global -> shared without registers; src_bytes 0 fills zeros */
static __device__ __forceinline__ void fa_cp16(void *dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(src_bytes)
                 : "memory");
}

template <int DH, typename KV>
__global__ void __launch_bounds__(FA_WARPS *CU_WARP) attention_mma_kernel(struct cu_attention a) {
    cu_pdl_trigger(); /* a dependent matvec may start loading its weights */
    CU_TRACE_END;
    constexpr int EPU = fa_smem<DH, KV>::EPU, LD = fa_smem<DH, KV>::LD, LDF = fa_smem<DH, KV>::LDF;
    constexpr int KS = DH / 16, NT = DH / 8, U4 = DH / EPU;
    constexpr int NTHR = FA_WARPS * CU_WARP, UNITS = FA_KC * U4 / NTHR;
    static_assert(DH % 16 == 0 && (FA_KC * U4) % NTHR == 0, "head dim a multiple of 16");
    extern __shared__ __align__(16) unsigned char fa_dyn[];
    fa_smem<DH, KV> &sm = *reinterpret_cast<fa_smem<DH, KV> *>(fa_dyn);
    __nv_bfloat16 *const ks = sm.ks, *const vs = sm.vs;
    __shared__ int64_t koff[2][FA_KC]; /* the rows of the next two chunks */
    __shared__ int32_t rpos[FA_ROWS], rslot[FA_ROWS], rfirst[FA_ROWS], slots[FA_ROWS];
    __shared__ int n_slots;
    const int G = a.n_heads / a.n_kv_heads, TB = FA_ROWS / G;
    /* the last tiles (most keys in a prefill) first: less tail */
    const int kvh = blockIdx.y, t0 = (gridDim.x - 1 - blockIdx.x) * TB;
    const int nrows = min(TB, a.n_tok - t0) * G;
    const int lane = threadIdx.x % CU_WARP, warp = threadIdx.x / CU_WARP, g = lane / 4, tq = lane % 4;
    const int64_t row_elems = (int64_t)a.n_kv_heads * DH;
    for (int r = threadIdx.x; r < FA_ROWS; r += NTHR) {
        const bool ok = r < nrows;
        const int32_t p = ok ? a.pos[t0 + r / G] : -1;
        rpos[r] = p;
        rslot[r] = ok ? a.slot[t0 + r / G] : -1;
        rfirst[r] = a.window > 0 && p + 1 > a.window ? p + 1 - a.window : 0;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int n = 0;
        for (int r = 0; r < nrows; r += G) {
            int k = 0;
            while (k < n && slots[k] != rslot[r]) k++;
            if (k == n) slots[n++] = rslot[r];
        }
        n_slots = n;
    }
    const int r0 = warp * 16 + g, r1 = r0 + 8; /* this lane's two rows */
    const int32_t p0 = rpos[r0], p1 = rpos[r1], f0 = rfirst[r0], f1 = rfirst[r1];
    const int32_t sl0 = rslot[r0], sl1 = rslot[r1];
    uint32_t qa[KS][4];
    {
        const float qs = a.scale * 1.44269504088896341f; /* exp2 below */
        const float *q0 = r0 < nrows ? a.q + ((int64_t)(kvh * G + r0 % G) * a.n_tok + t0 + r0 / G) * DH : NULL;
        const float *q1 = r1 < nrows ? a.q + ((int64_t)(kvh * G + r1 % G) * a.n_tok + t0 + r1 / G) * DH : NULL;
        const float2 z = make_float2(0.0f, 0.0f);
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
            const int d = 16 * kk + 2 * tq;
            float2 x00 = q0 ? *(const float2 *)(q0 + d) : z, x10 = q1 ? *(const float2 *)(q1 + d) : z;
            float2 x01 = q0 ? *(const float2 *)(q0 + d + 8) : z, x11 = q1 ? *(const float2 *)(q1 + d + 8) : z;
            qa[kk][0] = fa_pack(x00.x * qs, x00.y * qs);
            qa[kk][1] = fa_pack(x10.x * qs, x10.y * qs);
            qa[kk][2] = fa_pack(x01.x * qs, x01.y * qs);
            qa[kk][3] = fa_pack(x11.x * qs, x11.y * qs);
        }
    }
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f, o[NT][4];
    /* q8_0 rows: the scales of this thread's units in flight, loaded with their copies
     * (a unit of 16 quants lies in one block of 32) and kept as stored until their
     * conversion (widened at the load, the thread would wait there for them before
     * computing the chunk the copies overlap), which comes before the next chunk's
     * copies are issued */
    __half ksc[kv_is_q8<KV> ? UNITS : 1], vsc[kv_is_q8<KV> ? UNITS : 1];
    (void)ksc;
    (void)vsc;
#pragma unroll
    for (int n = 0; n < NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    __syncthreads(); /* n_slots */
    for (int si = 0; si < n_slots; si++) {
        const int32_t slot = slots[si];
        int32_t lo = INT_MAX, hi = -1; /* the block's key range in this sequence */
        for (int r = 0; r < nrows; r += G)
            if (rslot[r] == slot) {
                lo = min(lo, rfirst[r]);
                hi = max(hi, rpos[r]);
            }
        int32_t wlo = INT_MAX, whi = -1; /* this warp's */
        if (sl0 == slot) {
            wlo = f0;
            whi = p0;
        }
        if (sl1 == slot) {
            wlo = min(wlo, f1);
            whi = max(whi, p1);
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            wlo = min(wlo, __shfl_xor_sync(0xffffffffu, wlo, off));
            whi = max(whi, __shfl_xor_sync(0xffffffffu, whi, off));
        }
        /* chunk i's copies are issued while chunk i - 1 computes, and its rows (koff[i % 2])
         * looked up while chunk i - 2 computes */
        const auto lookup = [&](int32_t c) -> int64_t { /* thread j < FA_KC: row c + j */
            const int j = threadIdx.x;
            return j < FA_KC && c + j <= hi ? kv_row(a.block_table, a.max_blocks_per_slot, a.block_size, slot, c + j) *
                                                  row_elems + (int64_t)kvh * DH
                                            : -1;
        };
        const auto issue = [&](int buf) {
#pragma unroll
            for (int it = 0; it < UNITS; it++) { /* rows past the chunk: zeros */
                const int e = threadIdx.x + it * NTHR, j = e / U4, d4 = (e % U4) * EPU;
                const int64_t off = koff[buf][j];
                fa_cp16(&sm.k32[j * LDF + d4], (const KV *)a.k_cache + (off >= 0 ? off + d4 : 0), off >= 0 ? 16 : 0);
                fa_cp16(&sm.v32[j * LDF + d4], (const KV *)a.v_cache + (off >= 0 ? off + d4 : 0), off >= 0 ? 16 : 0);
                if constexpr (kv_is_q8<KV>) { /* the unit's block scales, widened at its conversion */
                    ksc[it] = vsc[it] = __float2half_rn(0.0f);
                    if (off >= 0) {
                        ksc[it] = *kv_q8_scale_at(a.k_cache, off + d4, a.kv_scale_off);
                        vsc[it] = *kv_q8_scale_at(a.v_cache, off + d4, a.kv_scale_off);
                    }
                }
            }
            asm volatile("cp.async.commit_group;\n" ::: "memory");
        };
        __syncthreads(); /* koff free: the sequence before has issued its last chunk */
        if (threadIdx.x < FA_KC) {
            koff[0][threadIdx.x] = lookup(lo);
            koff[1][threadIdx.x] = lookup(lo + FA_KC);
        }
        __syncthreads();
        issue(0);
        for (int32_t c0 = lo, ci = 0; c0 <= hi; c0 += FA_KC, ci++) {
            const int cn = min(FA_KC, hi + 1 - c0);
            asm volatile("cp.async.wait_group 0;\n" ::: "memory");
            __syncthreads(); /* every thread's copies landed; the chunk before is computed */
#pragma unroll 4
            for (int it = 0; it < UNITS; it++) {
                const int e = threadIdx.x + it * NTHR, j = e / U4, d4 = (e % U4) * EPU;
                if constexpr (kv_is_q8<KV>) {
                    fa_to_bf16(&sm.k32[j * LDF + d4], __half2float(ksc[it]), &ks[j * LD + d4]);
                    fa_to_bf16(&sm.v32[j * LDF + d4], __half2float(vsc[it]), &vs[j * LD + d4]);
                } else {
                    fa_to_bf16(&sm.k32[j * LDF + d4], &ks[j * LD + d4]);
                    fa_to_bf16(&sm.v32[j * LDF + d4], &vs[j * LD + d4]);
                }
            }
            __syncthreads(); /* staging read */
            if (c0 + FA_KC <= hi) issue((ci + 1) % 2);
            /* koff[ci % 2] was read by this chunk's copies, issued before the barriers above */
            const int64_t ahead = lookup(c0 + 2 * FA_KC);
            if (c0 <= whi && c0 + cn - 1 >= wlo) { /* warp-uniform */
                float s[FA_KC / 8][4];
#pragma unroll
                for (int n = 0; n < FA_KC / 8; n++) {
                    s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
                    if (8 * n >= cn) continue;
                    const __nv_bfloat16 *kr = &ks[(8 * n + g) * LD + 2 * tq];
#pragma unroll
                    for (int kk = 0; kk < KS; kk++)
                        fa_mma(s[n], qa[kk], *(const uint32_t *)(kr + 16 * kk), *(const uint32_t *)(kr + 16 * kk + 8));
                }
                float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
                for (int n = 0; n < FA_KC / 8; n++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int32_t key = c0 + 8 * n + 2 * tq + e; /* past the chunk: past every position */
                        s[n][e] = sl0 == slot && key >= f0 && key <= p0 ? s[n][e] : -INFINITY;
                        s[n][2 + e] = sl1 == slot && key >= f1 && key <= p1 ? s[n][2 + e] : -INFINITY;
                        mx0 = fmaxf(mx0, s[n][e]);
                        mx1 = fmaxf(mx1, s[n][2 + e]);
                    }
#pragma unroll
                for (int off = 1; off < 4; off <<= 1) { /* the row's 4 lanes */
                    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
                    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
                }
                const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
                const float b0 = n0 == -INFINITY ? 0.0f : n0, b1 = n1 == -INFINITY ? 0.0f : n1;
                const float c0f = exp2f(m0 - b0), c1f = exp2f(m1 - b1);
                m0 = n0;
                m1 = n1;
                float ps0 = 0.0f, ps1 = 0.0f;
#pragma unroll
                for (int n = 0; n < FA_KC / 8; n++) {
                    s[n][0] = exp2f(s[n][0] - b0);
                    s[n][1] = exp2f(s[n][1] - b0);
                    s[n][2] = exp2f(s[n][2] - b1);
                    s[n][3] = exp2f(s[n][3] - b1);
                    ps0 += s[n][0] + s[n][1];
                    ps1 += s[n][2] + s[n][3];
                }
                l0 = l0 * c0f + ps0; /* this lane's part of the row sum */
                l1 = l1 * c1f + ps1;
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    o[n][0] *= c0f;
                    o[n][1] *= c0f;
                    o[n][2] *= c1f;
                    o[n][3] *= c1f;
                }
#pragma unroll
                for (int kk = 0; kk < FA_KC / 16; kk++) {
                    if (16 * kk >= cn) continue;
                    const uint32_t pa[4] = {fa_pack(s[2 * kk][0], s[2 * kk][1]), fa_pack(s[2 * kk][2], s[2 * kk][3]),
                                            fa_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                            fa_pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
                    /* lane l: row (key) 16kk + l % 8 + 8 (l / 8 % 2), columns 8 (l / 16) on */
                    const uint32_t vaddr = (uint32_t)__cvta_generic_to_shared(
                        &vs[(16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 8]);
#pragma unroll
                    for (int np = 0; np < NT / 2; np++) {
                        uint32_t v0, v1, v2, v3;
                        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                                     : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3)
                                     : "r"(vaddr + np * 32));
                        fa_mma(o[2 * np], pa, v0, v1);
                        fa_mma(o[2 * np + 1], pa, v2, v3);
                    }
                }
            }
            if (threadIdx.x < FA_KC) koff[ci % 2][threadIdx.x] = ahead; /* read after two barriers */
        }
    }
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, off);
        l1 += __shfl_xor_sync(0xffffffffu, l1, off);
    }
    const float i0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, i1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
    float *o0 = r0 < nrows ? a.out + ((int64_t)(t0 + r0 / G) * a.n_heads + kvh * G + r0 % G) * DH : NULL;
    float *o1 = r1 < nrows ? a.out + ((int64_t)(t0 + r1 / G) * a.n_heads + kvh * G + r1 % G) * DH : NULL;
#pragma unroll
    for (int n = 0; n < NT; n++) {
        const int d = 8 * n + 2 * tq;
        if (o0) *(float2 *)(o0 + d) = make_float2(o[n][0] * i0, o[n][1] * i0);
        if (o1) *(float2 *)(o1 + d) = make_float2(o[n][2] * i1, o[n][3] * i1);
    }
}

/* f32 rows: enough blocks for 2 an SM (the 4-warp kernel took 207 registers when this was
 * measured);
 * f16 rows: as many as 3 an SM hold (157 / 80 registers; the 8B: 11 splits, one 64-position
 * chunk a block at 640 positions, where 9 left a block 2: bench/results/cuda-att8-2026-11-30.md) */
int cu_attention_splits(int n_tok, int n_heads, int64_t max_ctx, bool kv_f16) {
    const int64_t th = (int64_t)n_tok * n_heads;
    const int64_t sms = cu_sm_count(); /* decode grids are sized by the SMs (132 on the H200) */
    int64_t want = kv_f16 ? 3 * sms / th : (2 * sms + th - 1) / th;
    int64_t chunks = (max_ctx + ATT_CHUNK - 1) / ATT_CHUNK;
    if (want > chunks) want = chunks;
    if (want > CU_ATT_MAX_SPLITS) want = CU_ATT_MAX_SPLITS;
    return want < 1 ? 1 : (int)want;
}

int cu_attention_warps(int64_t max_ctx, int splits) {
    return (max_ctx + ATT_CHUNK - 1) / ATT_CHUNK <= splits ? 4 : 8;
}

int64_t cu_attention_part_floats(int n_tok, int n_heads, int head_dim, int splits) {
    return splits > 1 ? (int64_t)n_tok * n_heads * splits * (head_dim + 2) : 0;
}

bool cu_attention_tiled_ok(const struct cu_attention *a) {
    return !a->per_token && a->n_tok >= CU_ATT_TILED_MIN_TOKENS && a->head_dim <= ATT_TDH && a->head_dim % 4 == 0;
}

template <int DH, typename KV>
static cudaError_t fa_launch(dim3 grid, cudaStream_t st, const struct cu_attention *a) {
    static bool sized; /* above 48 KiB of dynamic shared memory needs the attribute, once */
    cudaError_t e;
    if (!sized && (e = cudaFuncSetAttribute(attention_mma_kernel<DH, KV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)sizeof(fa_smem<DH, KV>))) != cudaSuccess)
        return e;
    sized = true;
    attention_mma_kernel<DH, KV><<<grid, FA_WARPS * CU_WARP, sizeof(fa_smem<DH, KV>), st>>>(*a);
    return cudaGetLastError();
}

bool cu_attention_rope_ok(const struct cu_attention *a) {
    return a->n_tok == 1 && a->head_dim % 4 == 0 && a->head_dim <= 128 && !a->per_position;
}

bool cu_attention_mma_ok(const struct cu_attention *a) {
    return !a->tiled_f32 && !a->per_token && a->n_tok >= CU_ATT_TILED_MIN_TOKENS && a->n_kv_heads > 0 &&
           a->n_heads / a->n_kv_heads <= FA_ROWS && (a->head_dim == 64 || a->head_dim == 96 || a->head_dim == 128);
}

bool cu_attention_q8_ok(int head_dim) {
    return head_dim % 32 == 0 && head_dim <= 128;
}

bool cu_attention_dec_ok(const struct cu_attention *a) {
    return a->dec_splits > 0 && a->n_tok == 1 && a->head_dim % 8 == 0 && a->head_dim <= 128 && !a->per_position;
}

/* The cluster decode launch: GB query heads a block (4, 2 or 1: the largest dividing
 * the group), R rows a warp a round (GB x R <= 32 sums a round). */
template <typename KV, int GB>
static cudaError_t att_dec_config(const struct cu_attention *a, cudaLaunchConfig_t *cfg, cudaLaunchAttribute *attr,
                                  void (**kernel)(struct cu_attention)) {
    constexpr int R = GB == 4 ? 8 : 16;
    *kernel = attention_dec_kernel<KV, GB, R>;
    const int S = a->dec_splits;
    cfg->gridDim = dim3(S, a->n_heads / GB, 1);
    cfg->blockDim = dim3(a->dec_warps * CU_WARP);
    cfg->dynamicSmemBytes = 0;
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = S;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    cfg->attrs = attr;
    cfg->numAttrs = cu_pdl_enabled() ? 2 : 1;
    return cudaSuccess;
}

template <typename KV>
static cudaError_t att_dec_config_kv(const struct cu_attention *a, cudaLaunchConfig_t *cfg, cudaLaunchAttribute *attr,
                                     void (**kernel)(struct cu_attention)) {
    const int G = a->n_heads / a->n_kv_heads;
    if (G % 4 == 0) return att_dec_config<KV, 4>(a, cfg, attr, kernel);
    if (G % 2 == 0) return att_dec_config<KV, 2>(a, cfg, attr, kernel);
    return att_dec_config<KV, 1>(a, cfg, attr, kernel);
}

static cudaError_t att_dec_launch(cudaStream_t st, const struct cu_attention *a) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[2];
    void (*kernel)(struct cu_attention) = NULL;
    cudaError_t e = a->kv_f16 ? att_dec_config_kv<__half>(a, &cfg, attr, &kernel)
                              : att_dec_config_kv<float>(a, &cfg, attr, &kernel);
    if (e != cudaSuccess) return e;
    cfg.stream = st;
    if ((e = cudaLaunchKernelEx(&cfg, kernel, *a)) != cudaSuccess) return e;
    return cudaGetLastError();
}

int cu_attention_dec_clusters(const struct cu_attention *a) {
    if (!cu_attention_dec_ok(a)) return -1;
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[2];
    void (*kernel)(struct cu_attention) = NULL;
    if ((a->kv_f16 ? att_dec_config_kv<__half>(a, &cfg, attr, &kernel)
                   : att_dec_config_kv<float>(a, &cfg, attr, &kernel)) != cudaSuccess)
        return -1;
    cfg.numAttrs = 1; /* the cluster shape alone */
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return n;
}

template <typename KV, int NW, int MINB>
static cudaError_t att_warp_launch_as(dim3 grid, cudaStream_t st, const struct cu_attention *a) {
    return cu_launch_pdl(a->n_tok == 1 ? attention_warp_kernel<true, KV, NW, MINB>
                                       : attention_warp_kernel<false, KV, NW, MINB>,
                         grid, dim3(NW * CU_WARP), 0, st, *a);
}

/* The warp kernel's launch shape (bench/results/cuda-att8-2026-11-30.md): 8 warps a
 * block (8 positions a warp a round) unless a.warp_warps says 4 (cu_attention_warps).
 * With f16 rows, an 8-warp grid that 2 blocks an SM do not hold takes the 80-register
 * build (3 blocks an SM: the 8B shapes at long contexts; it also fits beside the staged
 * matvec's blocks), a smaller one the 128-register build (the 0.6B: 3 an SM measured
 * slower there). */
template <typename KV>
static cudaError_t att_warp_launch(dim3 grid, cudaStream_t st, const struct cu_attention *a) {
    if (a->warp_warps == 4) return att_warp_launch_as<KV, 4, 1>(grid, st, a);
    if constexpr (sizeof(KV) == 2) /* no f32 build at 80 registers: it would spill */
        if ((int64_t)grid.x * grid.y * grid.z > 2 * (int64_t)cu_sm_count()) return att_warp_launch_as<KV, 8, 3>(grid, st, a);
    return att_warp_launch_as<KV, 8, 2>(grid, st, a);
}

template <typename KV>
static cudaError_t attention_launch(cudaStream_t st, const struct cu_attention *a) {
    bool tiled = cu_attention_tiled_ok(a);
    cudaError_t e;
    if (tiled || a->n_tok > 1) { /* one token appends inside the attention kernel */
        if ((e = cu_launch_pdl(kv_append_kernel<KV>, dim3(a->n_tok), dim3(256), 0, st, *a)) != cudaSuccess) return e;
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
    if (tiled && cu_attention_mma_ok(a)) {
        dim3 grid((a->n_tok + FA_ROWS / (a->n_heads / a->n_kv_heads) - 1) / (FA_ROWS / (a->n_heads / a->n_kv_heads)),
                  a->n_kv_heads);
        switch (a->head_dim) {
        case 64:
            return fa_launch<64, KV>(grid, st, a);
        case 96:
            return fa_launch<96, KV>(grid, st, a);
        default:
            return fa_launch<128, KV>(grid, st, a);
        }
    }
    if (tiled) {
        attention_tiled_kernel<KV><<<dim3((a->n_tok + ATT_TQ - 1) / ATT_TQ, a->n_heads), ATT_TTHREADS, 0, st>>>(*a);
        return cudaGetLastError();
    }
    dim3 grid(a->splits, a->n_heads, a->n_tok);
    if constexpr (kv_is_q8<KV>) { /* the warp kernel only (cu_attention checked its shape) */
        e = att_warp_launch<KV>(grid, st, a);
    } else {
        if (cu_attention_dec_ok(a)) return att_dec_launch(st, a);
        if (a->head_dim % 4 == 0 && a->head_dim <= 128 && !a->per_position)
            e = att_warp_launch<KV>(grid, st, a);
        else
            e = cu_launch_pdl(a->n_tok == 1 ? attention_partial_kernel<true, KV> : attention_partial_kernel<false, KV>,
                              grid, dim3(ATT_THREADS), 0, st, *a);
    }
    return e != cudaSuccess ? e : cudaGetLastError();
}

cudaError_t cu_attention(cudaStream_t st, const struct cu_attention *a) {
    if (a->n_tok <= 0) return cudaSuccess;
    if (a->head_dim > ATT_MAX_DH || a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads ||
        a->n_heads > 65535 || a->n_tok > 65535 || a->splits < 1 ||
        (a->splits > 1 && (!a->part || !a->counters || (int64_t)a->n_tok * a->n_heads > CU_ATT_COUNTERS)))
        return cudaErrorInvalidValue;
    if ((a->rope_c || a->kv_before_wait) && !cu_attention_rope_ok(a)) return cudaErrorInvalidValue;
    if (a->warp_warps != 0 && a->warp_warps != 4 && a->warp_warps != 8) return cudaErrorInvalidValue;
    if (a->dec_splits && (a->dec_splits < 2 || a->dec_splits > CU_ATT_DEC_MAX_SPLITS || a->dec_warps < 1 ||
                          a->dec_warps > ATT_DEC_MAX_WARPS))
        return cudaErrorInvalidValue;
    if (a->kv_q8) { /* rows of whole blocks, and the kernels that read them (cu_attention_q8_ok) */
        if (!cu_attention_q8_ok(a->head_dim) || a->kv_f16) return cudaErrorInvalidValue;
        return attention_launch<kv_q8_t>(st, a);
    }
    return a->kv_f16 ? attention_launch<__half>(st, a) : attention_launch<float>(st, a);
}

/* ---- short_conv ------------------------------------------------------------------- */

/* One block per token: thread 0 finds where each of the L inputs comes from (a token
 * of this batch: the sequence's earlier tokens in the batch, in position order; the
 * state; or nothing), then the threads share the channels, summing j in order. */
__global__ void short_conv_kernel(struct cu_short_conv a) {
    __shared__ int src_tok[CU_SHORT_CONV_MAX_KERNEL], src_pos[CU_SHORT_CONV_MAX_KERNEL];
    const int t = blockIdx.x, L = a.klen, C = a.channels;
    const int32_t slot = a.slot[t];
    if (threadIdx.x == 0) {
        int found = 1;
        src_tok[L - 1] = t;
        for (int s = t - 1; s >= 0 && found < L; s--) {
            if (a.slot[s] != slot) continue;
            src_tok[L - 1 - found] = s;
            found++;
        }
        for (int k = found; k < L; k++) {
            src_tok[L - 1 - k] = -1;
            src_pos[L - 1 - k] = a.pos[t] - k; /* < 0: nothing */
        }
    }
    __syncthreads();
    const int rows = L - 1;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < L; j++) {
            float u;
            if (src_tok[j] >= 0)
                u = a.x[(int64_t)src_tok[j] * C + c];
            else if (src_pos[j] >= 0)
                u = a.state[((int64_t)slot * rows + src_pos[j] % rows) * C + c];
            else
                continue;
            acc += cu_weight_elem(a.w, 0, (int64_t)c * L + j) * u;
        }
        a.y[(int64_t)t * C + c] = acc;
    }
}

/* After every output is computed: the last L-1 inputs of each sequence in the batch
 * replace the state rows (earlier ones of the same row would be overwritten). */
__global__ void short_conv_state_kernel(struct cu_short_conv a) {
    __shared__ int32_t last;
    const int t = blockIdx.x, rows = a.klen - 1, C = a.channels;
    const int32_t slot = a.slot[t];
    if (threadIdx.x == 0) {
        int32_t m = a.pos[t];
        for (int s = t + 1; s < a.n_tok; s++)
            if (a.slot[s] == slot && a.pos[s] > m) m = a.pos[s];
        last = m;
    }
    __syncthreads();
    if (last - a.pos[t] >= rows) return;
    float *row = a.state + ((int64_t)slot * rows + a.pos[t] % rows) * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) row[c] = a.x[(int64_t)t * C + c];
}

cudaError_t cu_short_conv(cudaStream_t st, const struct cu_short_conv *a) {
    if (a->n_tok <= 0 || a->channels <= 0) return cudaSuccess;
    if (a->klen < 1 || a->klen > CU_SHORT_CONV_MAX_KERNEL) return cudaErrorInvalidValue;
    short_conv_kernel<<<a->n_tok, 256, 0, st>>>(*a);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || a->klen == 1) return e;
    short_conv_state_kernel<<<a->n_tok, 256, 0, st>>>(*a);
    return cudaGetLastError();
}
