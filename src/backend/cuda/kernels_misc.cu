/* Elementwise, layout, reduction, normalization, rope and matmul kernels: the generic
 * ops that keep any graph runnable. Each follows the reference's formula; reductions
 * that the reference sums sequentially are summed sequentially per output here too
 * unless a contiguous row can use a whole block. */
#include "backend/cuda/cuda_device.cuh"
#include "runtime/sample_exp.h"

#include <float.h>
#include <string.h>

CU_TRACE_TU(cu_trace_tu_misc)

#define EW_THREADS 256

/* Offsets of output element e in up to two inputs, from the output extent. Unrolled
 * over CU_MAX_RANK: constant indices, so a cu_strided copied out of a kernel parameter
 * (norm_rope's part) stays in registers instead of a 200-byte local-memory frame. */
static __device__ __forceinline__ void strided_offsets(const struct cu_strided &s, int64_t e,
                                                       int64_t *oa, int64_t *ob) {
    int64_t a = 0, b = 0;
#pragma unroll
    for (int d = CU_MAX_RANK - 1; d >= 0; d--) {
        if (d >= s.rank) continue;
        int64_t i = e % s.dims[d];
        e /= s.dims[d];
        a += i * s.sa[d];
        b += i * s.sb[d];
    }
    *oa = a;
    *ob = b;
}

static int64_t strided_numel(const struct cu_strided *s) {
    int64_t n = 1;
    for (int d = 0; d < s->rank; d++) n *= s->dims[d];
    return n;
}

__global__ void unary_kernel(int op, const float *x, float *o, int64_t n) {
    cu_pdl_trigger(); /* a dependent matvec may start loading its weights */
    CU_TRACE_END;
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e < n) o[e] = op_unary_apply(op, x[e]);
}

cudaError_t cu_unary(cudaStream_t st, int op, const float *x, float *o, int64_t n) {
    if (n <= 0) return cudaSuccess;
    unary_kernel<<<cu_blocks(n, EW_THREADS), EW_THREADS, 0, st>>>(op, x, o, n);
    return cudaGetLastError();
}

__global__ void binary_contig_kernel(int op, const float *a, const float *b, float *o, int64_t n) {
    cu_pdl_trigger(); /* a dependent matvec may start loading its weights */
    CU_TRACE_END;
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e < n) o[e] = op_binary_apply(op, a[e], b[e]);
}

__global__ void binary_strided_kernel(int op, const float *a, const float *b, float *o,
                                      struct cu_strided s, int64_t n) {
    cu_pdl_trigger(); /* a dependent matvec may start loading its weights */
    CU_TRACE_END;
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    int64_t oa, ob;
    strided_offsets(s, e, &oa, &ob);
    o[e] = op_binary_apply(op, a[oa], b[ob]);
}

cudaError_t cu_binary(cudaStream_t st, int op, const float *a, const float *b, float *o,
                      const struct cu_strided *s, bool contiguous) {
    int64_t n = strided_numel(s);
    if (n <= 0) return cudaSuccess;
    if (contiguous)
        binary_contig_kernel<<<cu_blocks(n, EW_THREADS), EW_THREADS, 0, st>>>(op, a, b, o, n);
    else
        binary_strided_kernel<<<cu_blocks(n, EW_THREADS), EW_THREADS, 0, st>>>(op, a, b, o, *s, n);
    return cudaGetLastError();
}

__global__ void strided_copy_kernel(const float *in, int64_t base, float *o, struct cu_strided s,
                                    int64_t n) {
    cu_pdl_trigger(); /* a dependent matvec may start loading its weights */
    CU_TRACE_END;
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    int64_t oa, ob;
    strided_offsets(s, e, &oa, &ob);
    o[e] = in[base + oa];
}

cudaError_t cu_strided_copy(cudaStream_t st, const float *in, int64_t base, float *o,
                            const struct cu_strided *s) {
    int64_t n = strided_numel(s);
    if (n <= 0) return cudaSuccess;
    strided_copy_kernel<<<cu_blocks(n, EW_THREADS), EW_THREADS, 0, st>>>(in, base, o, *s, n);
    return cudaGetLastError();
}

__global__ void concat_kernel(const float *x, float *o, int64_t piece, int64_t len_out_inner,
                              int64_t at_inner, int64_t n) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    int64_t a = e / piece, r = e % piece;
    o[a * len_out_inner + at_inner + r] = x[e];
}

cudaError_t cu_concat_piece(cudaStream_t st, const float *x, float *o, int64_t outer, int64_t len,
                            int64_t len_out, int64_t at, int64_t inner) {
    int64_t piece = len * inner, n = outer * piece;
    if (n <= 0) return cudaSuccess;
    concat_kernel<<<cu_blocks(n, EW_THREADS), EW_THREADS, 0, st>>>(x, o, piece, len_out * inner,
                                                                   at * inner, n);
    return cudaGetLastError();
}

__global__ void cast_kernel(const void *x, void *o, int64_t n, int kind) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    if (kind == 0) {
        ((float *)o)[e] = (float)((const int32_t *)x)[e];
    } else {
        float v = ((const float *)x)[e];
        ((int32_t *)o)[e] = isfinite(v) && fabsf(v) < 2147483520.0f ? (int32_t)v : 0;
    }
}

cudaError_t cu_cast(cudaStream_t st, const void *x, void *o, int64_t n, int kind) {
    if (n <= 0) return cudaSuccess;
    cast_kernel<<<cu_blocks(n, EW_THREADS), EW_THREADS, 0, st>>>(x, o, n, kind);
    return cudaGetLastError();
}

/* The rope table of a step in one launch: the chain cast(positions) -> matmul with the
 * [1, half, 1] frequencies (one product a element) -> permute -> concat(p, p) -> cos,
 * sin, same arithmetic (int to float, one f32 product, op_unary_apply's cosf/sinf). */
__global__ void rope_table_kernel(const float *freqs, const int32_t *pos, int64_t half, float *c, float *s, int64_t n) {
    cu_pdl_trigger(); /* a dependent matvec may start loading its weights */
    CU_TRACE_END;
    const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    const int64_t t = e / (2 * half), d = e % (2 * half);
    const float ang = freqs[d % half] * (float)pos[t];
    c[e] = op_unary_apply(IR_OP_COS, ang);
    s[e] = op_unary_apply(IR_OP_SIN, ang);
}

cudaError_t cu_rope_table(cudaStream_t st, const float *freqs, const int32_t *pos, int64_t n_tok, int64_t half,
                          float *c, float *s) {
    const int64_t n = n_tok * 2 * half;
    if (n <= 0) return cudaSuccess;
    rope_table_kernel<<<cu_blocks(n, EW_THREADS), EW_THREADS, 0, st>>>(freqs, pos, half, c, s, n);
    return cudaGetLastError();
}

/* A programmatic dependent launch: since prune-rows, a decode step's last layer selects
 * its returned rows inside the chain of dependent launches, and an ordinary launch there
 * would make the kernel before it drain and the one after it start cold. */
__global__ void select_rows_kernel(const float *x, const int32_t *rows, float *o, int64_t rows_in,
                                   int64_t m, int64_t d, int64_t n) {
    cu_pdl_trigger();
    CU_TRACE_END;
    cu_pdl_wait(); /* x and rows come from the kernels before this one */
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    int64_t c = e % d, j = (e / d) % m, a = e / (d * m);
    int32_t r = rows[j];
    o[e] = r >= 0 && r < rows_in ? x[(a * rows_in + r) * d + c] : 0.0f;
}

cudaError_t cu_select_rows(cudaStream_t st, const float *x, const int32_t *rows, float *o,
                           int64_t outer, int64_t rows_in, int64_t m, int64_t d) {
    int64_t n = outer * m * d;
    if (n <= 0) return cudaSuccess;
    cudaError_t e = cu_launch_pdl(select_rows_kernel, dim3(cu_blocks(n, EW_THREADS)), dim3(EW_THREADS), 0, st, x, rows,
                                  o, rows_in, m, d, n);
    return e != cudaSuccess ? e : cudaGetLastError();
}

/* ---- reductions ------------------------------------------------------------------ */

__global__ void reduce_seq_kernel(int op, const float *x, float *o, struct cu_reduce r) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= r.out_numel) return;
    int64_t base = 0, rem = e;
    for (int d = r.n_kept - 1; d >= 0; d--) {
        base += (rem % r.kept_dims[d]) * r.kept_strides[d];
        rem /= r.kept_dims[d];
    }
    float acc = op == IR_OP_MAX ? -INFINITY : 0.0f;
    for (int64_t k = 0; k < r.count; k++) {
        int64_t off = base, kr = k;
        for (int d = r.n_red - 1; d >= 0; d--) {
            off += (kr % r.red_dims[d]) * r.red_strides[d];
            kr /= r.red_dims[d];
        }
        float v = x[off];
        acc = op == IR_OP_MAX ? (v > acc ? v : acc) : acc + v;
    }
    if (op == IR_OP_MEAN && r.count > 0) acc /= (float)r.count;
    o[e] = acc;
}

/* Reduced dims are the contiguous tail: output e reduces x[e*count, (e+1)*count). */
__global__ void reduce_rows_kernel(int op, const float *x, float *o, int64_t count) {
    __shared__ float red[32];
    const float *row = x + (int64_t)blockIdx.x * count;
    float acc = op == IR_OP_MAX ? -INFINITY : 0.0f;
    for (int64_t k = threadIdx.x; k < count; k += blockDim.x)
        acc = op == IR_OP_MAX ? fmaxf(acc, row[k]) : acc + row[k];
    acc = op == IR_OP_MAX ? cu_block_max(acc, red) : cu_block_sum(acc, red);
    if (threadIdx.x == 0) o[blockIdx.x] = op == IR_OP_MEAN && count > 0 ? acc / (float)count : acc;
}

cudaError_t cu_reduce(cudaStream_t st, int op, const float *x, float *o, const struct cu_reduce *r) {
    if (r->out_numel <= 0) return cudaSuccess;
    if (r->trailing && r->count >= 256 && r->out_numel <= 0x7fffffff)
        reduce_rows_kernel<<<(unsigned)r->out_numel, 256, 0, st>>>(op, x, o, r->count);
    else
        reduce_seq_kernel<<<cu_blocks(r->out_numel, EW_THREADS), EW_THREADS, 0, st>>>(op, x, o, *r);
    return cudaGetLastError();
}

/* softmax over a contiguous row (inner == 1): one block per row */
__global__ void softmax_rows_kernel(const float *x, float *o, int64_t len) {
    __shared__ float red[32];
    const float *xr = x + (int64_t)blockIdx.x * len;
    float *orow = o + (int64_t)blockIdx.x * len;
    float mx = -INFINITY;
    for (int64_t k = threadIdx.x; k < len; k += blockDim.x) mx = fmaxf(mx, xr[k]);
    mx = cu_block_max(mx, red);
    float sum = 0.0f;
    for (int64_t k = threadIdx.x; k < len; k += blockDim.x) {
        float v = expf(xr[k] - mx);
        orow[k] = v;
        sum += v;
    }
    sum = cu_block_sum(sum, red);
    for (int64_t k = threadIdx.x; k < len; k += blockDim.x) orow[k] /= sum;
}

/* softmax along a strided axis: one thread per (outer, inner) line, reference order */
__global__ void softmax_strided_kernel(const float *x, float *o, int64_t outer, int64_t len,
                                       int64_t inner) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= outer * inner) return;
    int64_t a = e / inner, c = e % inner;
    const float *xr = x + a * len * inner + c;
    float *orow = o + a * len * inner + c;
    float mx = -INFINITY;
    for (int64_t k = 0; k < len; k++) mx = xr[k * inner] > mx ? xr[k * inner] : mx;
    float sum = 0.0f;
    for (int64_t k = 0; k < len; k++) {
        orow[k * inner] = expf(xr[k * inner] - mx);
        sum += orow[k * inner];
    }
    for (int64_t k = 0; k < len; k++) orow[k * inner] /= sum;
}

cudaError_t cu_softmax(cudaStream_t st, const float *x, float *o, int64_t outer, int64_t len,
                       int64_t inner) {
    if (outer * len * inner <= 0) return cudaSuccess;
    if (inner == 1 && outer <= 0x7fffffff)
        softmax_rows_kernel<<<(unsigned)outer, len >= 1024 ? 512 : 128, 0, st>>>(x, o, len);
    else
        softmax_strided_kernel<<<cu_blocks(outer * inner, EW_THREADS), EW_THREADS, 0, st>>>(x, o, outer,
                                                                                          len, inner);
    return cudaGetLastError();
}

/* rms_norm / layer_norm: one block per row */
template <typename O>
__global__ void norm_kernel(const float *x, const float *w, const float *b, O *o, int64_t d, float eps, bool layer,
                            bool vec) {
    cu_pdl_trigger(); /* a dependent matvec may start loading its weights */
    CU_TRACE_END;
    cu_pdl_wait();    /* launched as a dependent itself: x is the kernel before's */
    __shared__ float red[32];
    const float *xr = x + (int64_t)blockIdx.x * d;
    O *orow = o + (int64_t)blockIdx.x * d;
    if (vec) { /* rms_norm, 16-byte rows of at most 16 floats a thread: x read once, kept */
        const float4 *x4 = (const float4 *)xr, *w4 = (const float4 *)w;
        const int n4 = (int)(d / 4);
        float4 v[4];
        float ss = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int k = threadIdx.x + i * blockDim.x;
            v[i] = k < n4 ? x4[k] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            ss += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
        }
        ss = cu_block_sum(ss, red);
        const float scale = 1.0f / sqrtf(ss / (float)d + eps);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int k = threadIdx.x + i * blockDim.x;
            if (k >= n4) continue;
            const float4 wk = w4[k];
            cu_put(orow + 4 * k, v[i].x * scale * wk.x);
            cu_put(orow + 4 * k + 1, v[i].y * scale * wk.y);
            cu_put(orow + 4 * k + 2, v[i].z * scale * wk.z);
            cu_put(orow + 4 * k + 3, v[i].w * scale * wk.w);
        }
        return;
    }
    if (!layer) {
        float ss = 0.0f;
        for (int64_t k = threadIdx.x; k < d; k += blockDim.x) ss += xr[k] * xr[k];
        ss = cu_block_sum(ss, red);
        float scale = 1.0f / sqrtf(ss / (float)d + eps);
        for (int64_t k = threadIdx.x; k < d; k += blockDim.x) cu_put(orow + k, xr[k] * scale * w[k]);
        return;
    }
    float mean = 0.0f;
    for (int64_t k = threadIdx.x; k < d; k += blockDim.x) mean += xr[k];
    mean = cu_block_sum(mean, red) / (float)d;
    float var = 0.0f;
    for (int64_t k = threadIdx.x; k < d; k += blockDim.x) var += (xr[k] - mean) * (xr[k] - mean);
    var = cu_block_sum(var, red);
    float scale = 1.0f / sqrtf(var / (float)d + eps);
    for (int64_t k = threadIdx.x; k < d; k += blockDim.x) cu_put(orow + k, (xr[k] - mean) * scale * w[k] + b[k]);
}

/* The norm kernel's float4 path applies: rms_norm, 16-byte aligned rows and weight, at
 * most 4 float4 a thread. */
static bool norm_vec(const float *x, const float *w, int64_t d, int threads, bool layer) {
    return !layer && d % 4 == 0 && d <= 16 * (int64_t)threads && ((uintptr_t)x | (uintptr_t)w) % 16 == 0;
}

cudaError_t cu_norm(cudaStream_t st, const float *x, const float *w, const float *b, float *o,
                    int64_t rows, int64_t d, float eps, bool layer) {
    if (rows <= 0 || d <= 0) return cudaSuccess;
    if (rows > 0x7fffffff) return cudaErrorInvalidValue;
    int threads = d >= 2048 ? 512 : d >= 512 ? 256 : d >= 128 ? 128 : 32;
    cudaError_t e = cu_launch_pdl(norm_kernel<float>, dim3((unsigned)rows), dim3(threads), 0, st, x, w, b, o, d, eps, layer,
                                  norm_vec(x, w, d, threads, layer));
    return e != cudaSuccess ? e : cudaGetLastError();
}

cudaError_t cu_norm_half(cudaStream_t st, const float *x, const float *w, const float *b, void *o, int64_t rows,
                         int64_t d, float eps, bool layer, bool to_bf16) {
    if (rows <= 0 || d <= 0) return cudaSuccess;
    if (rows > 0x7fffffff) return cudaErrorInvalidValue;
    int threads = d >= 2048 ? 512 : d >= 512 ? 256 : d >= 128 ? 128 : 32;
    bool vec = norm_vec(x, w, d, threads, layer);
    if (to_bf16)
        norm_kernel<<<(unsigned)rows, threads, 0, st>>>(x, w, b, (__nv_bfloat16 *)o, d, eps, layer, vec);
    else
        norm_kernel<<<(unsigned)rows, threads, 0, st>>>(x, w, b, (__half *)o, d, eps, layer, vec);
    return cudaGetLastError();
}

/* rope: one thread per (row, k < d/2) */
__global__ void rope_kernel(const float *x, const float *c, const float *s, float *o, int64_t d,
                            struct cu_strided rows, int64_t n) {
    cu_pdl_trigger(); /* a dependent matvec may start loading its weights */
    CU_TRACE_END;
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    int64_t half = d / 2, k = e % half, r = e / half;
    int64_t off, unused;
    strided_offsets(rows, r, &off, &unused);
    const float *xr = x + r * d, *cr = c + off, *sr = s + off;
    float *orow = o + r * d;
    float x0 = xr[k], x1 = xr[k + half];
    orow[k] = x0 * cr[k] - x1 * sr[k];
    orow[k + half] = x1 * cr[k + half] + x0 * sr[k + half];
}

cudaError_t cu_rope(cudaStream_t st, const float *x, const float *c, const float *s, float *o,
                    int64_t n_rows, int64_t d, const struct cu_strided *rows) {
    int64_t n = n_rows * (d / 2);
    if (n <= 0) return cudaSuccess;
    rope_kernel<<<cu_blocks(n, EW_THREADS), EW_THREADS, 0, st>>>(x, c, s, o, d, *rows, n);
    return cudaGetLastError();
}

/* matmul: one thread per output element, K walked in order (the reference's sum) */
__global__ void matmul_kernel(const float *a, const float *b, float *o, int64_t p, int64_t kk,
                              int64_t q, struct cu_strided batch, int64_t n) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    int64_t c = e % q, r = (e / q) % p, bt = e / (p * q);
    int64_t ba, bb;
    strided_offsets(batch, bt, &ba, &bb);
    const float *ar = a + ba * p * kk + r * kk, *bc = b + bb * kk * q + c;
    float acc = 0.0f;
    for (int64_t k = 0; k < kk; k++) acc += ar[k] * bc[k * q];
    o[e] = acc;
}

cudaError_t cu_matmul(cudaStream_t st, const float *a, const float *b, float *o, int64_t p,
                      int64_t k, int64_t q, const struct cu_strided *batch) {
    int64_t n = strided_numel(batch) * p * q;
    if (n <= 0) return cudaSuccess;
    matmul_kernel<<<cu_blocks(n, EW_THREADS), EW_THREADS, 0, st>>>(a, b, o, p, k, q, *batch, n);
    return cudaGetLastError();
}

/* ---- greedy argmax over logits rows ---------------------------------------------------- */

/* A float and its index as one 64-bit key whose unsigned order is the greedy order:
 * the larger logit first, then the lower index (NaN as -inf, +inf as FLT_MAX). */
static __device__ __forceinline__ unsigned long long argmax_key(float v, uint32_t idx) {
    if (isnan(v)) v = -INFINITY;
    if (v == INFINITY) v = FLT_MAX;
    uint32_t u = __float_as_uint(v);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)u << 32) | (uint32_t)~idx;
}

#define ARGMAX_THREADS 256
#define ARGMAX_PER_THREAD 8

__global__ void argmax_rows_kernel(const float *x, int64_t len, unsigned long long *keys) {
    __shared__ unsigned long long red[ARGMAX_THREADS / CU_WARP];
    const float *row = x + (int64_t)blockIdx.y * len;
    unsigned long long best = 0;
    const int64_t stride = (int64_t)gridDim.x * ARGMAX_THREADS;
    for (int64_t i = (int64_t)blockIdx.x * ARGMAX_THREADS + threadIdx.x; i < len; i += stride) {
        unsigned long long k = argmax_key(row[i], (uint32_t)i);
        best = k > best ? k : best;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        unsigned long long other = __shfl_xor_sync(0xffffffffu, best, o);
        best = other > best ? other : best;
    }
    if (threadIdx.x % CU_WARP == 0) red[threadIdx.x / CU_WARP] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < ARGMAX_THREADS / CU_WARP; w++) best = red[w] > best ? red[w] : best;
        atomicMax(keys + blockIdx.y, best);
    }
}

cudaError_t cu_argmax_rows(cudaStream_t st, const float *x, int64_t rows, int64_t len, unsigned long long *keys) {
    if (rows <= 0) return cudaSuccess;
    if (len <= 0 || len > 0x7fffffff || rows > 65535) return cudaErrorInvalidValue;
    cudaError_t e = cudaMemsetAsync(keys, 0, (size_t)rows * sizeof *keys, st);
    if (e != cudaSuccess) return e;
    int64_t blocks = (len + ARGMAX_THREADS * ARGMAX_PER_THREAD - 1) / (ARGMAX_THREADS * ARGMAX_PER_THREAD);
    if (blocks > 128) blocks = 128;
    argmax_rows_kernel<<<dim3((unsigned)blocks, (unsigned)rows), ARGMAX_THREADS, 0, st>>>(x, len, keys);
    return cudaGetLastError();
}

int32_t cu_argmax_key_index(unsigned long long key) { return (int32_t)~(uint32_t)key; }

/* ---- sampling: the penalties, then the best k of each row -------------------------- */

/* runtime/sampler.c sampler_penalize, operation for operation, each rounded once (no
 * contraction into an FMA), so the penalized logit has the host's bits. */
__global__ void penalize_rows_kernel(float *x, int64_t len, const struct cu_penalty_row *hdr, const int2 *pairs,
                                     int pair_stride) {
    const struct cu_penalty_row h = hdr[blockIdx.x];
    float *row = x + (int64_t)blockIdx.x * len;
    for (int i = threadIdx.x; i < h.n; i += blockDim.x) {
        const int2 pc = pairs[(int64_t)blockIdx.x * pair_stride + i];
        if (pc.x < 0 || pc.x >= len) continue;
        float l = row[pc.x];
        if (h.repeat != 1.0f) l = l > 0.0f ? __fdiv_rn(l, h.repeat) : __fmul_rn(l, h.repeat);
        row[pc.x] = __fsub_rn(l, __fadd_rn(h.presence, __fmul_rn(__int2float_rn(pc.y), h.frequency)));
    }
}

cudaError_t cu_penalize_rows(cudaStream_t st, float *x, int64_t rows, int64_t len, const struct cu_penalty_row *hdr,
                             const int2 *pairs, int pair_stride) {
    if (rows <= 0) return cudaSuccess;
    if (rows > 0x7fffffff) return cudaErrorInvalidValue;
    penalize_rows_kernel<<<(unsigned)rows, 256, 0, st>>>(x, len, hdr, pairs, pair_stride);
    return cudaGetLastError();
}

#define TOPK_THREADS 1024
#define TOPK_SMEM_KEYS 4096 /* keys of the threshold's group held in shared memory once few enough */
#define TOPK_OUT_MAX 256    /* = BACKEND_TOP_K_MAX */

/* What a top-k block selects from: n entries, keys made from logits (index i0 + i) or
 * keys as they are. */
struct topk_src {
    const float *logits; /* or NULL: keys */
    const unsigned long long *keys;
    int64_t n, i0;
    bool vec; /* logits 16-byte aligned: float4 loads */
};

/* The keys of entries base + 4 (u * TOPK_THREADS + t) + e (t this thread, u < 4, e < 4):
 * 16 a thread, all loads in flight, coalesced across the block; valid false past n. */
#define TOPK_PER_THREAD 16
#define TOPK_CHUNK (TOPK_PER_THREAD * TOPK_THREADS) /* entries a block reads a round */
static __device__ __forceinline__ void topk_load(const struct topk_src &src, int64_t base,
                                                 unsigned long long (&key)[TOPK_PER_THREAD],
                                                 bool (&valid)[TOPK_PER_THREAD]) {
#pragma unroll
    for (int u = 0; u < TOPK_PER_THREAD / 4; u++) {
        const int64_t i0 = base + 4 * ((int64_t)u * TOPK_THREADS + threadIdx.x); /* 4 consecutive entries */
        if (src.logits) {
            float v[4];
            if (src.vec && i0 + 3 < src.n) {
                const float4 f = __ldg((const float4 *)(src.logits + i0));
                v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
            } else
                for (int e = 0; e < 4; e++) v[e] = i0 + e < src.n ? src.logits[i0 + e] : 0.0f;
            for (int e = 0; e < 4; e++) key[4 * u + e] = argmax_key(v[e], (uint32_t)(src.i0 + i0 + e));
        } else
            for (int e = 0; e < 4; e++) key[4 * u + e] = i0 + e < src.n ? src.keys[i0 + e] : 0;
        for (int e = 0; e < 4; e++) valid[4 * u + e] = i0 + e < src.n;
    }
}

/* f(key) for every entry of src, TOPK_CHUNK entries a round (topk_load). */
template <typename F>
static __device__ __forceinline__ void topk_each_key(const struct topk_src &src, F f) {
    for (int64_t base = 0; base < src.n; base += TOPK_CHUNK) {
        unsigned long long key[TOPK_PER_THREAD];
        bool valid[TOPK_PER_THREAD];
        topk_load(src, base, key, valid);
#pragma unroll
        for (int e = 0; e < TOPK_PER_THREAD; e++)
            if (valid[e]) f(key[e]);
    }
}

/* Block (b, r): the best k of entries [b * slice, +slice) of row r (row_len entries a
 * row: logits x, made into argmax keys, the rank order, or keys kin), best first, into
 * out[(r * gridDim.x + b) * k ..] (0 past the slice). An MSB-first radix select finds
 * the k-th largest key T, 8 bits a pass over the keys that still share T's prefix (a
 * histogram, then the digit where the count from the top reaches k): keys are unique
 * (the index is in them), so exactly k keys are >= T. A slice of up to TOPK_SMEM_KEYS
 * entries is read once into shared memory; a longer one is read a pass at a time until
 * the keys sharing the prefix fit there. The keys >= T are then gathered and sorted by
 * a bitonic network. cu_top_k_rows runs it on slices of 4096 (many blocks, each from
 * shared memory), then on their keys: ~45 us a 151936 row on the H200, against ~100 us
 * for one block over the whole row (one SM reading it several times) or for bitonic
 * sorts of 4096-key blocks in levels (bench/results/cuda-sample-2026-12-01.md). */
__global__ void __launch_bounds__(TOPK_THREADS)
    topk_radix_kernel(const float *x, const unsigned long long *kin, int64_t row_len, int64_t slice, int k,
                      unsigned long long *out) {
    __shared__ unsigned int hist[256], wsum[8];
    __shared__ unsigned long long group[TOPK_SMEM_KEYS], best[TOPK_OUT_MAX];
    __shared__ unsigned long long prefix_s;
    __shared__ unsigned int want_s, n_group, n_best;
    const int64_t first = (int64_t)blockIdx.x * slice, row0 = (int64_t)blockIdx.y * row_len + first;
    struct topk_src src = {x ? x + row0 : NULL, kin ? kin + row0 : NULL,
                           row_len - first < slice ? row_len - first : slice, first, false};
    src.vec = src.logits && ((uintptr_t)src.logits % 16) == 0;
    const unsigned int tid = threadIdx.x, lane = tid % CU_WARP, warp = tid / CU_WARP;
    unsigned long long prefix = 0, mask = 0; /* T's bits found so far */
    unsigned int want = (unsigned int)k;    /* T's rank among the keys sharing prefix */
    const bool all_in_smem = src.n <= TOPK_SMEM_KEYS; /* group[] holds every entry */
    bool in_smem = all_in_smem;                       /* group[] holds the keys sharing prefix */
    unsigned int n_in = 0;
    if (all_in_smem) {
        if (tid == 0) n_group = 0;
        __syncthreads();
        topk_each_key(src, [&](unsigned long long key) { group[atomicAdd(&n_group, 1u)] = key; });
        __syncthreads();
        n_in = (unsigned int)src.n;
    }
    if (src.n > k)
        for (int shift = 56; shift >= 0; shift -= 8) {
            if (tid < 256) hist[tid] = 0;
            __syncthreads();
            if (in_smem)
                for (unsigned int i = tid; i < n_in; i += TOPK_THREADS) {
                    const unsigned long long key = group[i];
                    if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
                }
            else
                topk_each_key(src, [&](unsigned long long key) {
                    if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
                });
            __syncthreads();
            /* the digit d with (count above d) < want <= (count at or above d) */
            unsigned int v = 0, suffix = 0;
            if (tid < 256) {
                v = suffix = hist[tid];
                for (int o = 1; o < CU_WARP; o <<= 1) {
                    const unsigned int t = __shfl_down_sync(0xffffffffu, suffix, o);
                    if (lane + o < CU_WARP) suffix += t;
                }
                if (lane == 0) wsum[warp] = suffix;
            }
            __syncthreads();
            if (tid < 256) {
                for (unsigned int w = warp + 1; w < 8; w++) suffix += wsum[w];
                if (suffix - v < want && suffix >= want) {
                    prefix_s = prefix | ((unsigned long long)tid << shift);
                    want_s = want - (suffix - v);
                    n_group = v;
                }
            }
            __syncthreads();
            prefix = prefix_s;
            want = want_s;
            mask |= 255ull << shift;
            const unsigned int group_size = n_group;
            __syncthreads();
            if (!in_smem && shift > 0 && group_size <= TOPK_SMEM_KEYS) { /* the group, once, into shared memory */
                if (tid == 0) n_group = 0;
                __syncthreads();
                topk_each_key(src, [&](unsigned long long key) {
                    if ((key & mask) == prefix) group[atomicAdd(&n_group, 1u)] = key;
                });
                __syncthreads();
                in_smem = true;
                n_in = group_size;
            }
        }
    /* prefix is T (0 when the slice has at most k entries: all of them) */
    if (tid == 0) n_best = 0;
    if (tid < TOPK_OUT_MAX) best[tid] = 0;
    __syncthreads();
    if (all_in_smem) {
        for (unsigned int i = tid; i < n_in; i += TOPK_THREADS)
            if (group[i] >= prefix) best[atomicAdd(&n_best, 1u)] = group[i];
    } else
        topk_each_key(src, [&](unsigned long long key) {
            if (key >= prefix) best[atomicAdd(&n_best, 1u)] = key;
        });
    __syncthreads();
    /* bitonic sort of best[0, k), k a power of two, best first */
    for (int size = 2; size <= k; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            if (tid < (unsigned)k / 2) {
                const int lo = 2 * stride * ((int)tid / stride) + (int)tid % stride, hi = lo + stride;
                const unsigned long long a = best[lo], b = best[hi];
                if ((a < b) == ((lo & size) == 0)) {
                    best[lo] = b;
                    best[hi] = a;
                }
            }
            __syncthreads();
        }
    if (tid < (unsigned)k) out[((int64_t)blockIdx.y * gridDim.x + blockIdx.x) * k + tid] = best[tid];
}

int64_t cu_top_k_scratch(int64_t len, int k) {
    return (len + TOPK_SMEM_KEYS - 1) / TOPK_SMEM_KEYS * k;
}

cudaError_t cu_top_k_rows(cudaStream_t st, const float *x, int64_t rows, int64_t len, int k,
                          unsigned long long *scratch, unsigned long long *out) {
    if (rows <= 0) return cudaSuccess;
    if (len <= 0 || len > 0x7fffffff || rows > 65535 || k < 2 || k > TOPK_OUT_MAX || (k & (k - 1)))
        return cudaErrorInvalidValue;
    const int64_t nb = (len + TOPK_SMEM_KEYS - 1) / TOPK_SMEM_KEYS;
    if (nb == 1) {
        topk_radix_kernel<<<dim3(1, (unsigned)rows), TOPK_THREADS, 0, st>>>(x, NULL, len, len, k, out);
        return cudaGetLastError();
    }
    /* each slice of TOPK_SMEM_KEYS entries its best k (from shared memory, many blocks),
     * then one block a row over those nb * k keys */
    topk_radix_kernel<<<dim3((unsigned)nb, (unsigned)rows), TOPK_THREADS, 0, st>>>(x, NULL, len, TOPK_SMEM_KEYS, k,
                                                                                    scratch);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    topk_radix_kernel<<<dim3(1, (unsigned)rows), TOPK_THREADS, 0, st>>>(NULL, scratch, nb * k, nb * k, k, out);
    return cudaGetLastError();
}

/* ---- the whole-row draw (runtime/sampler.c's draw_blocks_*, the same operations) ----- */

/* The (sanitized) logit an argmax key holds: argmax_key's order mapping undone (for a
 * row's largest key, -inf when the row has nothing finite). */
static __host__ __device__ __forceinline__ float key_logit(unsigned long long key) {
    const uint32_t hi = (uint32_t)(key >> 32);
    const uint32_t u = (hi & 0x80000000u) ? hi & 0x7fffffffu : ~hi;
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* Entry id's probability as the sampler computes it, 0 where it is not kept (not
 * finite, 0, or below min-p). */
static __device__ __forceinline__ float draw_p(const float *row, int64_t id, int64_t len, float max,
                                               const struct cu_draw_row &d) {
    if (id >= len) return 0.0f;
    float l = row[id];
    if (isnan(l)) l = -INFINITY;
    if (l == INFINITY) l = FLT_MAX;
    if (l == -INFINITY) return 0.0f;
    const float p = sample_exp(__fdiv_rn(__fsub_rn(l, max), d.temperature));
    return p > 0.0f && p >= d.min_p ? p : 0.0f;
}

/* Block (b, row): the sum, in id order, of the kept probabilities of ids [b * B, +B)
 * (B = SAMPLE_DRAW_BLOCK = the block's threads) into sums[row * gridDim.x + b]; the
 * row's largest key is keys[row * key_stride]. */
__global__ void __launch_bounds__(SAMPLE_DRAW_BLOCK)
    draw_sums_kernel(const float *x, int64_t len, const unsigned long long *keys, int key_stride,
                     const struct cu_draw_row *rows, double *sums) {
    __shared__ float ps[SAMPLE_DRAW_BLOCK];
    const int64_t row = blockIdx.y;
    const float max = key_logit(keys[row * key_stride]);
    const int64_t id = (int64_t)blockIdx.x * SAMPLE_DRAW_BLOCK + threadIdx.x;
    ps[threadIdx.x] = max == -INFINITY ? 0.0f : draw_p(x + row * len, id, len, max, rows[row]);
    __syncthreads();
    if (threadIdx.x) return;
    double sb = 0.0;
    for (int i = 0; i < SAMPLE_DRAW_BLOCK; i++) sb += ps[i]; /* + 0.0 where not kept: the same bits */
    sums[row * gridDim.x + blockIdx.x] = sb;
}

/* Block row: target = u * (the blocks' sums in order); the first block whose running
 * total passes it, then the first id in it whose (earlier blocks) + (block so far)
 * passes it; the last kept id when rounding leaves none. ids[row] = -1: nothing finite. */
__global__ void __launch_bounds__(SAMPLE_DRAW_BLOCK)
    draw_pick_kernel(const float *x, int64_t len, const unsigned long long *keys, const struct cu_draw_row *rows,
                     const double *sums, int nb, int32_t *ids) {
    __shared__ float ps[SAMPLE_DRAW_BLOCK];
    __shared__ int blk;
    __shared__ double before, target;
    const int64_t row = blockIdx.y;
    const float max = key_logit(keys[row]);
    const double *sr = sums + row * nb;
    if (threadIdx.x == 0) {
        blk = -1;
        if (max != -INFINITY) {
            double z = 0.0;
            for (int b = 0; b < nb; b++) z += sr[b];
            const double t = rows[row].u * z;
            double c = 0.0;
            int last = 0;
            for (int b = 0; b < nb && blk < 0; b++) {
                if (sr[b] > 0.0) last = b;
                if (t < c + sr[b])
                    blk = b;
                else
                    c += sr[b];
            }
            target = blk < 0 ? INFINITY : t; /* none passed: the last kept of the last block */
            before = c;
            if (blk < 0) blk = last;
        } else
            ids[row] = -1;
    }
    __syncthreads();
    if (blk < 0) return;
    const int64_t id0 = (int64_t)blk * SAMPLE_DRAW_BLOCK;
    ps[threadIdx.x] = draw_p(x + row * len, id0 + threadIdx.x, len, max, rows[row]);
    __syncthreads();
    if (threadIdx.x) return;
    double sb = 0.0;
    int pick = -1, last = -1;
    for (int i = 0; i < SAMPLE_DRAW_BLOCK && pick < 0; i++)
        if (ps[i] > 0.0f) {
            last = i;
            sb += ps[i];
            if (target < before + sb) pick = i;
        }
    ids[row] = (int32_t)(id0 + (pick >= 0 ? pick : last));
}

int64_t cu_draw_scratch(int64_t len) {
    return (len + SAMPLE_DRAW_BLOCK - 1) / SAMPLE_DRAW_BLOCK; /* the draw's blocks a row */
}

cudaError_t cu_draw_block_sums(cudaStream_t st, const float *x, int64_t rows, int64_t len,
                               const unsigned long long *keys, int key_stride, const struct cu_draw_row *params,
                               double *sums) {
    if (rows <= 0) return cudaSuccess;
    if (len <= 0 || len > 0x7fffffff || rows > 65535 || key_stride < 1) return cudaErrorInvalidValue;
    draw_sums_kernel<<<dim3((unsigned)cu_draw_scratch(len), (unsigned)rows), SAMPLE_DRAW_BLOCK, 0, st>>>(
        x, len, keys, key_stride, params, sums);
    return cudaGetLastError();
}

cudaError_t cu_draw_rows(cudaStream_t st, const float *x, int64_t rows, int64_t len, const unsigned long long *keys,
                         const struct cu_draw_row *params, double *sums, int32_t *ids) {
    cudaError_t e = cu_draw_block_sums(st, x, rows, len, keys, 1, params, sums);
    if (e != cudaSuccess || rows <= 0) return e;
    draw_pick_kernel<<<dim3(1, (unsigned)rows), SAMPLE_DRAW_BLOCK, 0, st>>>(x, len, keys, params, sums,
                                                                            (int)cu_draw_scratch(len), ids);
    return cudaGetLastError();
}

void cu_key_decode(unsigned long long key, int32_t *id, float *logit) {
    if (!key) { /* padding: the row had fewer entries */
        *id = -1;
        *logit = -INFINITY;
        return;
    }
    *id = cu_argmax_key_index(key);
    *logit = key_logit(key);
}

/* ---- rms_norm + permute + rope (decode fusion) ----------------------------------- */

struct nr_job {
    struct cu_norm_rope_part part[CU_NR_MAX_PARTS];
    int64_t end[CU_NR_MAX_PARTS]; /* cumulative rows */
    int n;
};

#define NR_THREADS 128

/* A warp per output row: sum of squares over the source row, then each lane rotates
 * pairs (k, k + d/2) of normalized values. */
__global__ void __launch_bounds__(NR_THREADS) norm_rope_kernel(struct nr_job job, int64_t d) {
    cu_pdl_trigger(); /* a dependent matvec may start loading its weights */
    CU_TRACE_END;
    cu_pdl_wait();    /* launched as a dependent itself */
    static_assert(CU_NR_MAX_PARTS == 3, "the part choice below names each part");
    const int lane = threadIdx.x % CU_WARP;
    int64_t row = (int64_t)blockIdx.x * (NR_THREADS / CU_WARP) + threadIdx.x / CU_WARP;
    struct cu_norm_rope_part p; /* constant indices: no local copy of the parameter */
    if (job.n > 2 && row >= job.end[1]) {
        p = job.part[2];
        row -= job.end[1];
    } else if (job.n > 1 && row >= job.end[0]) {
        p = job.part[1];
        row -= job.end[0];
    } else {
        p = job.part[0];
    }
    if (row >= p.n_rows) return;
    int64_t co, xo;
    strided_offsets(p.rows, row, &co, &xo);
    const float *xr = p.x + xo, *cr = p.c + co, *sr = p.s + co;
    float *orow = p.o + row * d;
    float scale = 1.0f;
    if (p.norm_w) {
        float ss = 0.0f;
        for (int64_t k = lane; k < d; k += CU_WARP) ss += xr[k] * xr[k];
        ss = cu_warp_sum(ss);
        scale = 1.0f / sqrtf(ss / (float)d + p.eps);
    }
    const int64_t half = d / 2;
    for (int64_t k = lane; k < half; k += CU_WARP) {
        float x0 = xr[k], x1 = xr[k + half];
        if (p.norm_w) {
            x0 = x0 * scale * p.norm_w[k];
            x1 = x1 * scale * p.norm_w[k + half];
        }
        orow[k] = x0 * cr[k] - x1 * sr[k];
        orow[k + half] = x1 * cr[k + half] + x0 * sr[k + half];
    }
}

cudaError_t cu_norm_rope(cudaStream_t st, const struct cu_norm_rope_part *parts, int n_parts, int64_t d) {
    if (n_parts < 1 || n_parts > CU_NR_MAX_PARTS || d < 2 || d % 2) return cudaErrorInvalidValue;
    struct nr_job job;
    memset(&job, 0, sizeof job);
    job.n = n_parts;
    int64_t rows = 0;
    for (int k = 0; k < n_parts; k++) {
        job.part[k] = parts[k];
        rows += parts[k].n_rows;
        job.end[k] = rows;
    }
    if (rows <= 0) return cudaSuccess;
    const int64_t per_block = NR_THREADS / CU_WARP;
    cudaError_t e = cu_launch_pdl(norm_rope_kernel, dim3(cu_blocks(rows, (int)per_block)), dim3(NR_THREADS), 0, st, job, d);
    return e != cudaSuccess ? e : cudaGetLastError();
}
