/* The runtime-state ops: attention over the paged KV cache (f32 K/V, the block-table
 * layout of kv_cache.h), and short_conv over the conv state.
 *
 * 1. kv_append: every token's K and V rows go to its sequence's block.
 * 2. attention_partial: one block per (context split, query head, token). The split's
 *    positions are walked ATT_CHUNK at a time: each position's K/V row offset (through
 *    the block table) into shared memory, scores into shared memory (a warp per
 *    position, lanes over the head dim, 4 positions in flight), then an online softmax
 *    update of the running max, sum and the weighted V sum (a thread per head-dim
 *    element, 8 V loads in flight). Positions and block tables are read from device
 *    memory, so the launch is the same every decode step (a CUDA graph replays it).
 * 3. attention_combine (splits > 1): merges the partial (max, sum, acc) of each split:
 *    flash-decoding for long contexts with few tokens. */
#include "backend/cuda/cuda_device.cuh"

#define ATT_THREADS 128
#define ATT_CHUNK 64
#define ATT_MAX_DH 512
#define ATT_DH_PER_THREAD (ATT_MAX_DH / ATT_THREADS)

static __device__ __forceinline__ int64_t kv_row(const int32_t *block_table, int max_blocks_per_slot,
                                                 int block_size, int32_t slot, int32_t pos) {
    int32_t block = block_table[(int64_t)slot * max_blocks_per_slot + pos / block_size];
    return (int64_t)block * block_size + pos % block_size;
}

__global__ void kv_append_kernel(struct cu_attention a) {
    int t = blockIdx.x;
    int row_elems = a.n_kv_heads * a.head_dim;
    int64_t row = kv_row(a.block_table, a.max_blocks_per_slot, a.block_size, a.slot[t], a.pos[t]);
    float *kr = a.k_cache + row * row_elems, *vr = a.v_cache + row * row_elems;
    for (int e = threadIdx.x; e < row_elems; e += blockDim.x) {
        int h = e / a.head_dim, d = e % a.head_dim;
        int64_t src = ((int64_t)h * a.n_tok + t) * a.head_dim + d;
        kr[e] = a.k[src];
        vr[e] = a.v[src];
    }
}

__global__ void __launch_bounds__(ATT_THREADS) attention_partial_kernel(struct cu_attention a) {
    __shared__ float qs[ATT_MAX_DH];
    __shared__ float sc[ATT_CHUNK];
    __shared__ int64_t rowoff[ATT_CHUNK]; /* element offset of each position's K/V head row */
    __shared__ float red[32];
    const int split = blockIdx.x, h = blockIdx.y, t = blockIdx.z;
    const int Dh = a.head_dim, lane = threadIdx.x % CU_WARP, warp = threadIdx.x / CU_WARP;
    constexpr int nw = ATT_THREADS / CU_WARP;
    const int kvh = h / (a.n_heads / a.n_kv_heads), row_elems = a.n_kv_heads * Dh;
    const int32_t p = a.pos[t], slot = a.slot[t];
    const int32_t first = a.window > 0 && p + 1 > a.window ? p + 1 - a.window : 0;
    /* this split's positions: whole chunks, split as evenly as the chunk count allows */
    const int32_t n_chunks = (p + 1 - first + ATT_CHUNK - 1) / ATT_CHUNK;
    const int32_t per = (n_chunks + a.splits - 1) / a.splits;
    const int32_t begin = first + split * per * ATT_CHUNK;
    const int32_t end = min(p + 1, begin + per * ATT_CHUNK);

    for (int d = threadIdx.x; d < Dh; d += ATT_THREADS) qs[d] = a.q[((int64_t)h * a.n_tok + t) * Dh + d];
    float m = -INFINITY, l = 0.0f, acc[ATT_DH_PER_THREAD];
#pragma unroll
    for (int i = 0; i < ATT_DH_PER_THREAD; i++) acc[i] = 0.0f;

    for (int32_t c0 = begin; c0 < end; c0 += ATT_CHUNK) {
        const int cn = min(ATT_CHUNK, end - c0);
        for (int jj = threadIdx.x; jj < cn; jj += ATT_THREADS)
            rowoff[jj] = kv_row(a.block_table, a.max_blocks_per_slot, a.block_size, slot, c0 + jj) * row_elems +
                         (int64_t)kvh * Dh;
        __syncthreads(); /* rowoff (and qs on the first chunk) */
        /* scores: a warp per position, 4 positions in flight per warp */
        for (int jj0 = warp; jj0 < cn; jj0 += 4 * nw) {
            float dot[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int jj = jj0 + u * nw;
                dot[u] = 0.0f;
                if (jj < cn) {
                    const float *kr = a.k_cache + rowoff[jj];
                    for (int d = lane; d < Dh; d += CU_WARP) dot[u] += qs[d] * kr[d];
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
                for (int u = 0; u < 8; u++) v[u] = a.v_cache[rowoff[jj + u] + d];
#pragma unroll
                for (int u = 0; u < 8; u += 2) {
                    s0 += sc[jj + u] * v[u];
                    s1 += sc[jj + u + 1] * v[u + 1];
                }
            }
            for (; jj < cn; jj++) s0 += sc[jj] * a.v_cache[rowoff[jj] + d];
            acc[i] = s0 + s1;
        }
        __syncthreads(); /* sc and rowoff are rewritten by the next chunk */
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
}

__global__ void attention_combine_kernel(struct cu_attention a) {
    const int h = blockIdx.x, t = blockIdx.y, Dh = a.head_dim;
    const int64_t th = (int64_t)t * a.n_heads + h;
    const float *part = a.part + th * a.splits * (Dh + 2);
    float m = -INFINITY;
    for (int s = 0; s < a.splits; s++)
        if (part[s * (Dh + 2) + 1] > 0.0f) m = fmaxf(m, part[s * (Dh + 2)]);
    float l = 0.0f;
    for (int s = 0; s < a.splits; s++) {
        const float *ps = part + s * (Dh + 2);
        if (ps[1] > 0.0f) l += ps[1] * expf(ps[0] - m);
    }
    for (int d = threadIdx.x; d < Dh; d += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < a.splits; s++) {
            const float *ps = part + s * (Dh + 2);
            if (ps[1] > 0.0f) acc += ps[2 + d] * expf(ps[0] - m);
        }
        a.out[th * Dh + d] = acc / l;
    }
}

int cu_attention_splits(int n_tok, int n_heads, int64_t max_ctx) {
    int64_t want = (264 + (int64_t)n_tok * n_heads - 1) / ((int64_t)n_tok * n_heads); /* 2 blocks / SM */
    int64_t chunks = (max_ctx + ATT_CHUNK - 1) / ATT_CHUNK;
    if (want > chunks) want = chunks;
    if (want > CU_ATT_MAX_SPLITS) want = CU_ATT_MAX_SPLITS;
    return want < 1 ? 1 : (int)want;
}

int64_t cu_attention_part_floats(int n_tok, int n_heads, int head_dim, int splits) {
    return splits > 1 ? (int64_t)n_tok * n_heads * splits * (head_dim + 2) : 0;
}

cudaError_t cu_attention(cudaStream_t st, const struct cu_attention *a) {
    if (a->n_tok <= 0) return cudaSuccess;
    if (a->head_dim > ATT_MAX_DH || a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads ||
        a->n_heads > 65535 || a->n_tok > 65535 || a->splits < 1 || (a->splits > 1 && !a->part))
        return cudaErrorInvalidValue;
    kv_append_kernel<<<a->n_tok, 256, 0, st>>>(*a);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    dim3 grid(a->splits, a->n_heads, a->n_tok);
    attention_partial_kernel<<<grid, ATT_THREADS, 0, st>>>(*a);
    if ((e = cudaGetLastError()) != cudaSuccess || a->splits == 1) return e;
    attention_combine_kernel<<<dim3(a->n_heads, a->n_tok), 128, 0, st>>>(*a);
    return cudaGetLastError();
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
