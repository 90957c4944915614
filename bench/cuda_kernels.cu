/* Kernel lab for the CUDA backend: each hot kernel alone, checked and timed against its
 * byte count.
 *
 *   1. device-to-device copy bandwidth (bytes read + written): the ceiling decode is
 *      held against;
 *   2. cu_matvec (decode linear) per weight type and shape: median time, achieved GB/s
 *      (weights + x + y bytes) and its fraction of the copy bandwidth; each result is
 *      checked against a double-precision host product on sampled rows;
 *   3. cu_linear_tiled (prefill for block-quantized weights): TFLOP/s at 512 rows;
 *   4. K-quants (Q4_K, Q5_K, Q6_K): the matvec at each output-rows-per-warp variant,
 *      checked against format/quant_k.c's dequantizer, and the bf16 dequantization
 *      that feeds cuBLAS for prefill (GB/s read + written);
 *   5. (--attention) prefill attention of one layer (append + attention): the
 *      tensor-core kernel against the f32 tiled one, timed and checked.
 *
 * Weights are random (never zeros), written on the device in the upload layout
 * (cu_weight); every timed run rotates over enough copies that the working set is
 * several times the L2. q8_0 matvecs run with each x mode (cu_matvec_q8_x). Usage:
 *   6. (--decode-attention) one decode token's attention (8B and 0.6B shapes, f32 and
 *      f16 KV): the warp kernel against the cluster kernel at several launch shapes.
 * bench_cuda_kernels [--quick | --sweep [TYPE [XMODE [JOB]]] | --persist [TYPE] | --tma [TYPE [JOB]] |
 *                     --attention | --decode-attention];
 * --sweep times the 8B and 0.6B decode launch shapes at every matvec launch shape
 * (cu_matvec_tune) instead, --persist those launches with and without persistent
 * blocks (cu_matvec_persist), --tma the register matvec against the staged one
 * (kernels_stream.cu; also chained after a decode attention), --attention only the
 * prefill attention. */
extern "C" {
#include "backend/cuda/cuda_backend.h"
#include "format/gguf.h"
#include "ir/ir.h"
/* format/quant_k.h (C-only static asserts): the reference K-quant dequantizer */
void quant_k_dequantize_row(enum ggml_type type, const void *src, float *dst, int64_t n);
}
#include "backend/cuda/cuda_kernels.cuh"
#include "cuda_check.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

static __device__ uint32_t hash32(uint64_t i, uint32_t seed) {
    uint64_t x = i * 0x9e3779b97f4a7c15ull + seed;
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    return (uint32_t)(x >> 16);
}

/* uniform in [-1, 1), never 0 */
static __device__ float rand_pm1(uint64_t i, uint32_t seed) {
    return ((float)(hash32(i, seed) & 0xffffff) + 0.5f) / 8388608.0f - 1.0f;
}

/* Fills n elements of a weight part: kind 0 f32, 1 f16, 2 bf16, 3 raw bytes, 4 scales (f16 in [0.001, 0.02)). */
__global__ void fill_kernel(void *p, int64_t n, int kind, uint32_t seed) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float r = rand_pm1(i, seed);
        switch (kind) {
        case 0: ((float *)p)[i] = r; break;
        case 1: ((__half *)p)[i] = __float2half(r); break;
        case 2: ((uint16_t *)p)[i] = (uint16_t)(__float_as_uint(r) >> 16); break;
        case 3: ((uint8_t *)p)[i] = (uint8_t)hash32(i, seed); break;
        default: ((__half *)p)[i] = __float2half(0.001f + 0.0095f * (r + 1.0f)); break;
        }
    }
}

static void fill(void *p, int64_t n, int kind, uint32_t seed) {
    fill_kernel<<<1024, 256>>>(p, n, kind, seed);
    CHECK_CUDA(cudaGetLastError());
}

/* Q4_K/Q5_K blocks of random bytes: d and dmin set to finite f16 in [0.001, 0.02). */
__global__ void fix_kq_scales_kernel(uint8_t *p, int64_t blocks, int block_bytes, uint32_t seed) {
    for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b < blocks; b += (int64_t)gridDim.x * blockDim.x) {
        __half d = __float2half(0.001f + 0.0095f * (rand_pm1(2 * b, seed) + 1.0f));
        __half m = __float2half(0.001f + 0.0095f * (rand_pm1(2 * b + 1, seed) + 1.0f));
        memcpy(p + b * block_bytes, &d, 2);
        memcpy(p + b * block_bytes + 2, &m, 2);
    }
}

static float h2f(uint16_t h) {
    __half_raw r;
    r.x = h;
    return __half2float(__half(r));
}

/* Host dequantization of one element of the upload layout (independent of the kernels). */
static double host_elem(int dtype, const uint8_t *data, const uint16_t *sc, int64_t r, int64_t c, int64_t cols) {
    switch (dtype) {
    case CU_F32: { float f; memcpy(&f, data + (r * cols + c) * 4, 4); return f; }
    case CU_F16: { uint16_t h; memcpy(&h, data + (r * cols + c) * 2, 2); return h2f(h); }
    case CU_BF16: { uint16_t h; memcpy(&h, data + (r * cols + c) * 2, 2); uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
    case CU_Q8_0: return (double)(int8_t)data[r * cols + c] * h2f(sc[r * (cols / 32) + c / 32]);
    default: {
        uint8_t b = data[r * (cols / 2) + (c / 32) * 16 + (c % 32) % 16];
        int q = (c % 32) < 16 ? (b & 15) : (b >> 4);
        return (double)(q - 8) * h2f(sc[r * (cols / 32) + c / 32]);
    }
    }
}

static const char *dtype_name(int t) {
    static const char *names[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "?", "q4_k", "q5_k", "q6_k"};
    return names[t];
}

/* Row r of a K-quant weight in the upload layout, dequantized by format/quant_k.c
 * (q6_k: the 210-byte GGUF block rebuilt from the 208 bytes and d). */
static void host_kq_row(int dtype, const uint8_t *data, const uint16_t *sc, int64_t r, int64_t cols, float *out) {
    int64_t nb = cols / 256;
    if (dtype == CU_Q6_K) {
        std::vector<uint8_t> blk((size_t)nb * 210);
        for (int64_t b = 0; b < nb; b++) {
            memcpy(&blk[(size_t)b * 210], data + (size_t)(r * nb + b) * 208, 208);
            memcpy(&blk[(size_t)b * 210 + 208], &sc[r * nb + b], 2);
        }
        quant_k_dequantize_row(GGML_TYPE_Q6_K, blk.data(), out, cols);
        return;
    }
    int bytes = dtype == CU_Q4_K ? 144 : 176;
    quant_k_dequantize_row(dtype == CU_Q4_K ? GGML_TYPE_Q4_K : GGML_TYPE_Q5_K, data + (size_t)(r * nb) * bytes, out, cols);
}

/* cu_matvec_q8_x modes -1..1: the default (int8 or f32 x by launch kind), f32 x, int8 x */
static const char *const q8_x_names[] = {"/xdflt", "/xf32", "/x8"};

/* x as the int8 x mode of the q8_0 matvec sees it (cu_matvec_q8_x): each block of 32
 * rounded to q * d, d = amax / 127, q = nearbyint(x / d), in the kernel's f32 steps. */
static void host_q8x(const float *x, int64_t k, double *out) {
    for (int64_t b = 0; b < k / 32; b++) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[b * 32 + j]));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < 32; j++) out[b * 32 + j] = (double)nearbyintf(x[b * 32 + j] * id) * d;
    }
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

/* Median seconds of run() (work enqueued on stream 0) over `reps` event-timed runs
 * after `warm` whose times are dropped. */
template <class F> static double time_median(int warm, int reps, F &&run) {
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    std::vector<double> t;
    for (int rep = 0; rep < warm + reps; rep++) {
        CHECK_CUDA(cudaEventRecord(e0));
        run();
        CHECK_CUDA(cudaEventRecord(e1));
        CHECK_CUDA(cudaEventSynchronize(e1));
        float ms;
        CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        if (rep >= warm) t.push_back(ms * 1e-3);
    }
    CHECK_CUDA(cudaEventDestroy(e0));
    CHECK_CUDA(cudaEventDestroy(e1));
    return median(t);
}

static double copy_bandwidth(void) {
    size_t bytes = (size_t)2 << 30;
    void *a, *b;
    CHECK_CUDA(cudaMalloc(&a, bytes));
    CHECK_CUDA(cudaMalloc(&b, bytes));
    fill(a, (int64_t)bytes, 3, 1);
    double sec = time_median(3, 10, [&] { CHECK_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); });
    CHECK_CUDA(cudaFree(a));
    CHECK_CUDA(cudaFree(b));
    return 2.0 * (double)bytes / sec / 1e9;
}

struct shape { int64_t n_out, k; const char *what; };

/* A random weight [rows, cols] of dtype in the upload layout (data, 256-byte aligned
 * scales after it) in one allocation, returned (cudaFree it); *w describes it. */
static void *random_weight(int dtype, int64_t rows, int64_t cols, uint32_t seed, struct cu_weight *w) {
    size_t data = cu_weight_data_bytes(dtype, rows, cols), scale = cu_weight_scale_bytes(dtype, rows, cols);
    size_t off = (data + 255) & ~(size_t)255;
    void *mem;
    CHECK_CUDA(cudaMalloc(&mem, off + scale));
    const int kinds[] = {0, 1, 2, 3, 3, 3, 3, 3, 3};
    fill(mem, dtype >= CU_Q8_0 ? (int64_t)data : (int64_t)(data / (dtype == CU_F32 ? 4 : 2)), kinds[dtype], 7 + seed);
    if (dtype == CU_Q4_K || dtype == CU_Q5_K) {
        fix_kq_scales_kernel<<<256, 256>>>((uint8_t *)mem, rows * (cols / 256), dtype == CU_Q4_K ? 144 : 176, 11 + seed);
        CHECK_CUDA(cudaGetLastError());
    }
    *w = {dtype, rows, cols, mem, NULL};
    if (scale) {
        uint16_t *sc = (uint16_t *)((uint8_t *)mem + off);
        fill(sc, (int64_t)(scale / 2), 4, 99 + seed);
        w->scales = sc;
    }
    return mem;
}

/* Times cu_matvec on one weight shape/type; returns GB/s (and prints a row). */
/* nr / xs: the K-quant matvec's rows per warp and x mode (cu_matvec_kq); both left
 * at 0 / -1: cu_matvec with its defaults. */
static double bench_matvec(int dtype, struct shape sh, int rows, double copy_gbs, bool *ok, int nr = 0, int xs = -1,
                           int q8x = 0) {
    size_t data = cu_weight_data_bytes(dtype, sh.n_out, sh.k), scale = cu_weight_scale_bytes(dtype, sh.n_out, sh.k);
    size_t one = ((data + 255) & ~(size_t)255) + scale;
    int copies = (int)std::min<size_t>(64, std::max<size_t>(1, ((size_t)256 << 20) / one + 1));
    std::vector<cu_weight> w(copies);
    std::vector<void *> mem(copies);
    for (int c = 0; c < copies; c++) mem[c] = random_weight(dtype, sh.n_out, sh.k, (uint32_t)c, &w[c]);
    float *x, *y;
    CHECK_CUDA(cudaMalloc(&x, (size_t)(rows * sh.k) * 4));
    CHECK_CUDA(cudaMalloc(&y, (size_t)(rows * sh.n_out) * 4));
    fill(x, rows * sh.k, 0, 3);
    struct cu_epilogue ep = {NULL, NULL, NULL, -1, NULL, 0.0f};
    if (dtype == CU_Q8_0) cu_matvec_q8_x(q8x);
    if (!cu_matvec_ok(&w[0])) {
        printf("%-28s %-5s rows %d: matvec not applicable\n", sh.what, dtype_name(dtype), rows);
        return 0;
    }
    /* check copy 0 against a double product on sampled rows */
    auto launch = [&](const struct cu_weight *wp) {
        return nr || xs >= 0 ? cu_matvec_kq(0, wp, x, rows, y, &ep, nr, xs) : cu_matvec(0, wp, x, rows, y, &ep);
    };
    CHECK_CUDA(launch(&w[0]));
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<uint8_t> hw(one);
    std::vector<float> hx((size_t)(rows * sh.k)), hy((size_t)(rows * sh.n_out));
    CHECK_CUDA(cudaMemcpy(hw.data(), mem[0], one, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(hx.data(), x, hx.size() * 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(hy.data(), y, hy.size() * 4, cudaMemcpyDeviceToHost));
    const uint16_t *hsc = scale ? (const uint16_t *)(hw.data() + ((data + 255) & ~(size_t)255)) : NULL;
    double worst = 0;
    std::vector<float> wrow((size_t)sh.k);
    /* references: x as given, and (q8_0, one row, not forced f32) x as the int8 mode
     * rounds it; the default picks per launch, so a row may match either */
    const bool x8 = dtype == CU_Q8_0 && q8x && rows == 1;
    std::vector<double> xd(hx.begin(), hx.end()), xq(hx.begin(), hx.end());
    if (x8) host_q8x(hx.data(), sh.k, xq.data());
    double worst8 = 0;
    for (int64_t s = 0; s < 64; s++) {
        int64_t j = (s * 7919) % sh.n_out;
        if (cu_dtype_kquant(dtype)) host_kq_row(dtype, hw.data(), hsc, j, sh.k, wrow.data());
        for (int r = 0; r < rows; r++) {
            double ref = 0, ref8 = 0, mag = 0;
            for (int64_t c = 0; c < sh.k; c++) {
                double wv = cu_dtype_kquant(dtype) ? wrow[(size_t)c] : host_elem(dtype, hw.data(), hsc, j, c, sh.k);
                double p = wv * xd[(size_t)(r * sh.k + c)];
                ref += p;
                ref8 += wv * xq[(size_t)(r * sh.k + c)];
                mag += fabs(p);
            }
            const double got = hy[(size_t)(r * sh.n_out + j)], m = mag > 0 ? mag : 1;
            worst = std::max(worst, fabs(got - ref) / m);
            worst8 = std::max(worst8, fabs(got - ref8) / m);
        }
    }
    const bool took8 = x8 && worst8 < worst; /* the launch quantized x */
    if (took8) worst = worst8;
    /* x rounded to int8 (K-quant mode 2, their default), compared with f32 x: ~1e-3 */
    *ok = worst < (xs == 2 || (xs < 0 && cu_dtype_kquant(dtype)) ? 1e-2 : 1e-5);
    int per = std::max(copies, 8);
    double sec = time_median(3, 20, [&] {
                     for (int i = 0; i < per; i++) CHECK_CUDA(launch(&w[i % copies]));
                 }) / per;
    double bytes = (double)(data + scale) + (double)rows * (double)(sh.k + sh.n_out) * 4;
    double gbs = bytes / sec / 1e9;
    char nrs[32] = "";
    if (nr || xs >= 0) snprintf(nrs, sizeof nrs, " nr%d xs%d", nr, xs);
    if (dtype == CU_Q8_0) snprintf(nrs, sizeof nrs, " %s:%s", q8_x_names[q8x + 1] + 1, took8 ? "int8" : "f32");
    printf("%-28s %-5s%s rows %d  %9.2f us  %7.1f GB/s  %5.1f%% of copy  err %.1e %s\n", sh.what, dtype_name(dtype),
           nrs, rows, sec * 1e6, gbs, 100 * gbs / copy_gbs, worst, *ok ? "ok" : "FAIL");
    for (int c = 0; c < copies; c++) CHECK_CUDA(cudaFree(mem[c]));
    CHECK_CUDA(cudaFree(x));
    CHECK_CUDA(cudaFree(y));
    return gbs;
}

static void bench_tiled(int dtype, int64_t n_out, int64_t k, int64_t rows) {
    size_t data = cu_weight_data_bytes(dtype, n_out, k), scale = cu_weight_scale_bytes(dtype, n_out, k);
    void *mem;
    size_t off = (data + 255) & ~(size_t)255;
    CHECK_CUDA(cudaMalloc(&mem, off + scale));
    fill(mem, (int64_t)data, 3, 5);
    struct cu_weight w = {dtype, n_out, k, mem, NULL};
    if (scale) {
        fill((uint8_t *)mem + off, (int64_t)(scale / 2), 4, 6);
        w.scales = (const uint16_t *)((uint8_t *)mem + off);
    }
    float *x, *y;
    CHECK_CUDA(cudaMalloc(&x, (size_t)(rows * k) * 4));
    CHECK_CUDA(cudaMalloc(&y, (size_t)(rows * n_out) * 4));
    fill(x, rows * k, 0, 8);
    struct cu_epilogue ep = {NULL, NULL, NULL, -1, NULL, 0.0f};
    double sec = time_median(2, 6, [&] { CHECK_CUDA(cu_linear_tiled(0, &w, x, rows, y, &ep)); });
    printf("tiled linear %-5s %lldx%lld rows %lld: %8.1f us  %6.1f TFLOP/s\n", dtype_name(dtype), (long long)n_out,
           (long long)k, (long long)rows, sec * 1e6, 2.0 * n_out * k * rows / sec / 1e12);
    CHECK_CUDA(cudaFree(mem));
    CHECK_CUDA(cudaFree(x));
    CHECK_CUDA(cudaFree(y));
}

/* An attention over the given buffers: n_tok tokens of one sequence (slot 0), the cache
 * in n_blocks blocks of bs rows, scale 1 / sqrt(dh); splits and flags left to the caller. */
static struct cu_attention lab_attention(const float *q, const float *k, const float *v, float *out,
                                         const int32_t *pos, const int32_t *slot, const int32_t *table, float *kc,
                                         float *vc, int n_tok, int heads, int kv_heads, int dh, int bs, int n_blocks) {
    struct cu_attention a;
    memset(&a, 0, sizeof a);
    a.q = q;
    a.k = k;
    a.v = v;
    a.out = out;
    a.pos = pos;
    a.slot = slot;
    a.block_table = table;
    a.k_cache = kc;
    a.v_cache = vc;
    a.n_tok = n_tok;
    a.n_heads = heads;
    a.n_kv_heads = kv_heads;
    a.head_dim = dh;
    a.block_size = bs;
    a.max_blocks_per_slot = n_blocks;
    a.scale = 1.0f / sqrtf((float)dh);
    a.splits = 1;
    return a;
}

/* Prefill attention of one layer (append + attention, n_tok tokens of one sequence
 * from position 0): the tensor-core kernel against the f32 tiled kernel, each timed,
 * and the first checked against the second (max |diff| / max |ref|). */
static bool bench_prefill_attention(int n_tok, int heads, int kv_heads, int dh) {
    const int bs = 16, n_blocks = (n_tok + bs - 1) / bs;
    const int64_t q_n = (int64_t)heads * n_tok * dh, kv_n = (int64_t)kv_heads * n_tok * dh;
    float *q, *k, *v, *kc, *vc, *out[2];
    int32_t *pos, *slot, *table;
    CHECK_CUDA(cudaMalloc(&q, q_n * 4));
    CHECK_CUDA(cudaMalloc(&k, kv_n * 4));
    CHECK_CUDA(cudaMalloc(&v, kv_n * 4));
    CHECK_CUDA(cudaMalloc(&kc, (int64_t)n_blocks * bs * kv_heads * dh * 4));
    CHECK_CUDA(cudaMalloc(&vc, (int64_t)n_blocks * bs * kv_heads * dh * 4));
    for (int i = 0; i < 2; i++) CHECK_CUDA(cudaMalloc(&out[i], q_n * 4));
    fill(q, q_n, 0, 21);
    fill(k, kv_n, 0, 22);
    fill(v, kv_n, 0, 23);
    std::vector<int32_t> h_pos(n_tok), h_table(n_blocks);
    for (int t = 0; t < n_tok; t++) h_pos[t] = t;
    for (int b = 0; b < n_blocks; b++) h_table[b] = n_blocks - 1 - b; /* blocks out of order */
    CHECK_CUDA(cudaMalloc(&pos, n_tok * 4));
    CHECK_CUDA(cudaMalloc(&slot, n_tok * 4));
    CHECK_CUDA(cudaMalloc(&table, n_blocks * 4));
    CHECK_CUDA(cudaMemcpy(pos, h_pos.data(), n_tok * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemset(slot, 0, n_tok * 4));
    CHECK_CUDA(cudaMemcpy(table, h_table.data(), n_blocks * 4, cudaMemcpyHostToDevice));
    double flop = 0;
    for (int t = 0; t < n_tok; t++) flop += 4.0 * (t + 1) * dh * heads;
    double sec[2];
    for (int f32 = 0; f32 < 2; f32++) {
        struct cu_attention a = lab_attention(q, k, v, out[f32], pos, slot, table, kc, vc, n_tok, heads, kv_heads, dh,
                                              bs, n_blocks);
        a.splits = 1;
        a.tiled_f32 = f32;
        sec[f32] = time_median(2, 10, [&] { CHECK_CUDA(cu_attention(0, &a)); });
    }
    std::vector<float> got(q_n), want(q_n);
    CHECK_CUDA(cudaMemcpy(got.data(), out[0], q_n * 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(want.data(), out[1], q_n * 4, cudaMemcpyDeviceToHost));
    double max_ref = 0, max_diff = 0;
    for (int64_t i = 0; i < q_n; i++) {
        max_ref = std::max(max_ref, (double)fabsf(want[i]));
        max_diff = std::max(max_diff, fabs((double)got[i] - want[i]));
    }
    double err = max_ref > 0 ? max_diff / max_ref : max_diff;
    bool ok = err <= 1e-2 && err == err;
    printf("prefill attention %d tokens H%d/%d Dh%d: tensor cores %7.1f us %6.1f TFLOP/s, f32 tiled %7.1f us %6.1f "
           "TFLOP/s; err %.2e %s\n",
           n_tok, heads, kv_heads, dh, sec[0] * 1e6, flop / sec[0] / 1e12, sec[1] * 1e6, flop / sec[1] / 1e12, err,
           ok ? "ok" : "FAIL");
    for (float *pf : {q, k, v, kc, vc, out[0], out[1]}) CHECK_CUDA(cudaFree(pf));
    for (int32_t *pi : {pos, slot, table}) CHECK_CUDA(cudaFree(pi));
    return ok;
}

/* --decode-attention: one decode token's attention (`heads` query heads over 8 KV heads
 * of 128: 32 the 8B shape, 16 the 0.6B one; `ctx` cached positions, f32 or f16 KV; the
 * kernel appends the token's own K/V) through the warp kernel (at its default splits)
 * and the cluster kernel at several shapes (splits x warps), alternated, each the
 * median of 20 (over 16 launches); the launches rotate over enough cache copies that
 * the L2 holds none of the rows read (as in a model, where each layer has its own).
 * Every result is checked against the unsplit warp-kernel launch (max |diff| / max
 * |ref|). */
/* The buffers of one decode token's attention (Dh 128, 8 KV heads, block size 16), the
 * cache in enough copies (256 MiB of K/V) that rotating over them leaves none in L2. */
struct lab_dec_att {
    struct cu_attention a;
    float *q, *k, *v, *out, *part;
    char *kc, *vc;
    int32_t *pos, *slot, *table;
    unsigned *counters;
    int64_t q_n, copy_n;
    int copies, esz, rot;
};

static void lab_dec_att_init(struct lab_dec_att *d, int ctx, int heads, bool kv_f16) {
    const int kv_heads = 8, dh = 128, bs = 16, n_blocks = (ctx + bs) / bs, esz = kv_f16 ? 2 : 4;
    const int64_t q_n = (int64_t)heads * dh, kv_n = (int64_t)kv_heads * dh, copy_n = (int64_t)n_blocks * bs * kv_n;
    const int copies = (int)std::max<int64_t>(2, (256ll << 20) / (2 * copy_n * esz)); /* 256 MiB of K/V */
    d->q_n = q_n;
    d->copy_n = copy_n;
    d->copies = copies;
    d->esz = esz;
    d->rot = 0;
    CHECK_CUDA(cudaMalloc(&d->q, q_n * 4));
    CHECK_CUDA(cudaMalloc(&d->k, kv_n * 4));
    CHECK_CUDA(cudaMalloc(&d->v, kv_n * 4));
    CHECK_CUDA(cudaMalloc(&d->kc, copies * copy_n * esz));
    CHECK_CUDA(cudaMalloc(&d->vc, copies * copy_n * esz));
    CHECK_CUDA(cudaMalloc(&d->out, q_n * 4));
    fill(d->q, q_n, 0, 31);
    fill(d->k, kv_n, 0, 32);
    fill(d->v, kv_n, 0, 33);
    fill(d->kc, copies * copy_n, kv_f16 ? 1 : 0, 34);
    fill(d->vc, copies * copy_n, kv_f16 ? 1 : 0, 35);
    std::vector<int32_t> h_table(n_blocks);
    for (int b = 0; b < n_blocks; b++) h_table[b] = n_blocks - 1 - b; /* blocks out of order */
    const int32_t p = ctx; /* ctx positions cached before this token */
    CHECK_CUDA(cudaMalloc(&d->pos, 4));
    CHECK_CUDA(cudaMalloc(&d->slot, 4));
    CHECK_CUDA(cudaMalloc(&d->table, n_blocks * 4));
    CHECK_CUDA(cudaMemcpy(d->pos, &p, 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemset(d->slot, 0, 4));
    CHECK_CUDA(cudaMemcpy(d->table, h_table.data(), n_blocks * 4, cudaMemcpyHostToDevice));
    d->a = lab_attention(d->q, d->k, d->v, d->out, d->pos, d->slot, d->table, (float *)d->kc, (float *)d->vc, 1, heads,
                         kv_heads, dh, bs, n_blocks);
    CHECK_CUDA(cudaMalloc(&d->part, cu_attention_part_floats(1, heads, dh, CU_ATT_MAX_SPLITS) * 4));
    CHECK_CUDA(cudaMalloc(&d->counters, CU_ATT_COUNTERS * 4));
    CHECK_CUDA(cudaMemset(d->counters, 0, CU_ATT_COUNTERS * 4));
    d->a.part = d->part;
    d->a.counters = d->counters;
    d->a.kv_f16 = kv_f16;
    d->a.splits = cu_attention_splits(1, heads, ctx + 1, kv_f16); /* the warp kernel's default */
}

/* one attention launch over the next cache copy */
static void lab_dec_att_launch(struct lab_dec_att *d) {
    d->a.k_cache = d->kc + (int64_t)(d->rot % d->copies) * d->copy_n * d->esz;
    d->a.v_cache = d->vc + (int64_t)(d->rot % d->copies) * d->copy_n * d->esz;
    d->rot++;
    CHECK_CUDA(cu_attention(0, &d->a));
}

static void lab_dec_att_free(struct lab_dec_att *d) {
    for (float *pf : {d->q, d->k, d->v, d->out, d->part}) CHECK_CUDA(cudaFree(pf));
    for (char *pc : {d->kc, d->vc}) CHECK_CUDA(cudaFree(pc));
    for (int32_t *pi : {d->pos, d->slot, d->table}) CHECK_CUDA(cudaFree(pi));
    CHECK_CUDA(cudaFree(d->counters));
}

static bool bench_decode_attention(int ctx, int heads, bool kv_f16) {
    struct lab_dec_att d;
    lab_dec_att_init(&d, ctx, heads, kv_f16);
    struct cu_attention &a = d.a;
    const int64_t q_n = d.q_n;
    float *out = d.out;
    /* {splits, dec_splits, dec_warps, warp_warps}: the reference, the warp kernel's default
     * splits at 4 and 8 warps a block, f32 rows' split count, cluster shapes */
    const int dflt = cu_attention_splits(1, heads, ctx + 1, kv_f16), f32s = cu_attention_splits(1, heads, ctx + 1, false);
    const int var[][4] = {{1, 0, 0, 4}, {dflt, 0, 0, 4}, {dflt, 0, 0, 8}, {f32s, 0, 0, 8}, {1, 8, 8, 0}, {1, 8, 4, 0}};
    const int n_v = (int)(sizeof var / sizeof var[0]);
    std::vector<float> ref((size_t)q_n), got((size_t)q_n);
    bool ok = true;
    double err[8] = {0};
    int clusters[8] = {0};
    const auto set = [&](int i) {
        a.splits = var[i][0];
        a.dec_splits = var[i][1];
        a.dec_warps = var[i][2];
        a.warp_warps = var[i][3];
    };
    const auto launch = [&]() { lab_dec_att_launch(&d); };
    for (int i = 0; i < n_v; i++) {
        set(i);
        clusters[i] = a.dec_splits ? cu_attention_dec_clusters(&a) : 0;
        CHECK_CUDA(cudaMemset(out, 0xff, q_n * 4)); /* NaN: every output must be written */
        d.rot = 0;
        launch();
        CHECK_CUDA(cudaDeviceSynchronize());
        CHECK_CUDA(cudaMemcpy((i ? got : ref).data(), out, q_n * 4, cudaMemcpyDeviceToHost));
        double mr = 0, md = 0;
        for (int64_t j = 0; j < q_n; j++) {
            mr = std::max(mr, (double)fabsf(ref[(size_t)j]));
            md = std::max(md, fabs((double)(i ? got : ref)[(size_t)j] - ref[(size_t)j]));
        }
        err[i] = md / (mr > 0 ? mr : 1);
        ok = ok && err[i] <= 1e-5 && err[i] == err[i] && mr == mr && mr > 0;
    }
    std::vector<double> t[8];
    for (int rep = 0; rep < 4; rep++)
        for (int i = 1; i < n_v; i++) {
            set(i);
            t[i].push_back(time_median(1, 5, [&] {
                               for (int r = 0; r < 16; r++) launch();
                           }) / 16);
        }
    printf("decode attention H%d/8 Dh128 %s KV, %d cached positions (+1 own), %d cache copies:\n", heads,
           kv_f16 ? "f16" : "f32", ctx, d.copies);
    for (int i = 1; i < n_v; i++) {
        if (var[i][1])
            printf("  cluster %2d splits x %d warps %6.2f us (err %.1e, %d clusters fit)\n", var[i][1], var[i][2],
                   median(t[i]) * 1e6, err[i], clusters[i]);
        else
            printf("  warp kernel %2d splits x %d warps %6.2f us (err %.1e)\n", var[i][0], var[i][3], median(t[i]) * 1e6,
                   err[i]);
    }
    printf("  %s\n", ok ? "ok" : "FAIL");
    lab_dec_att_free(&d);
    return ok;
}

/* cu_weight_to_bf16 of a K-quant weight (the prefill path): GB/s read + written,
 * sampled rows checked against the reference dequantizer within bf16 rounding. */
static bool bench_kq_dequant(int dtype, int64_t n_out, int64_t k, double copy_gbs) {
    size_t data = cu_weight_data_bytes(dtype, n_out, k), scale = cu_weight_scale_bytes(dtype, n_out, k);
    size_t off = (data + 255) & ~(size_t)255;
    void *mem, *out;
    CHECK_CUDA(cudaMalloc(&mem, off + scale));
    CHECK_CUDA(cudaMalloc(&out, (size_t)(n_out * k) * 2));
    fill(mem, (int64_t)data, 3, 21);
    if (dtype != CU_Q6_K) fix_kq_scales_kernel<<<256, 256>>>((uint8_t *)mem, n_out * (k / 256), dtype == CU_Q4_K ? 144 : 176, 22);
    if (scale) fill((uint8_t *)mem + off, (int64_t)(scale / 2), 4, 23);
    CHECK_CUDA(cudaGetLastError());
    struct cu_weight w = {dtype, n_out, k, mem, scale ? (const uint16_t *)((uint8_t *)mem + off) : NULL};
    CHECK_CUDA(cu_weight_to_bf16(0, &w, out));
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<uint8_t> hw(off + scale);
    std::vector<uint16_t> hb((size_t)k);
    std::vector<float> ref((size_t)k);
    CHECK_CUDA(cudaMemcpy(hw.data(), mem, off + scale, cudaMemcpyDeviceToHost));
    double worst = 0;
    for (int64_t s = 0; s < 16; s++) {
        int64_t j = (s * 7919) % n_out;
        CHECK_CUDA(cudaMemcpy(hb.data(), (uint16_t *)out + j * k, (size_t)k * 2, cudaMemcpyDeviceToHost));
        host_kq_row(dtype, hw.data(), scale ? (const uint16_t *)(hw.data() + off) : NULL, j, k, ref.data());
        double amax = 0;
        for (int64_t c = 0; c < k; c++) amax = std::max(amax, (double)fabsf(ref[(size_t)c]));
        for (int64_t c = 0; c < k; c++) {
            uint32_t u = (uint32_t)hb[(size_t)c] << 16;
            float g;
            memcpy(&g, &u, 4);
            worst = std::max(worst, fabs((double)g - ref[(size_t)c]) / (amax > 0 ? amax : 1));
        }
    }
    double sec = time_median(3, 10, [&] { CHECK_CUDA(cu_weight_to_bf16(0, &w, out)); });
    double gbs = ((double)(data + scale) + (double)(n_out * k) * 2) / sec / 1e9;
    bool ok = worst < 1.0 / 128;
    printf("dequant->bf16 %-5s %lldx%lld: %8.1f us  %7.1f GB/s  %5.1f%% of copy  err %.1e %s\n", dtype_name(dtype),
           (long long)n_out, (long long)k, sec * 1e6, gbs, 100 * gbs / copy_gbs, worst, ok ? "ok" : "FAIL");
    CHECK_CUDA(cudaFree(mem));
    CHECK_CUDA(cudaFree(out));
    return ok;
}

/* One decode launch shape of an 8B layer through cu_matvec_multi: n_seg products of
 * one x (segment s: rows[s] x K), or with `pair` a SwiGLU gate/up pair of rows[0] x K;
 * `norm`: the rms_norm prologue. Times it at every launch shape of cu_matvec_tune
 * (output rows a warp, loads in flight, split-K target), each checked on sampled rows
 * of every segment against a double host product, then restores the defaults. */
struct mv_job_shape {
    const char *what;
    int n_seg;
    int64_t rows[3], k;
    bool pair, norm;
};

/* q8x: the q8_0 x mode (cu_matvec_q8_x; 1: the reference rounds x as the kernel does).
 * tys: each segment's type (K-quants may mix), or NULL: all dtype. K-quant jobs
 * (cu_matvec_kq_multi, int8 x) go through the cu_kq_tune shapes instead, 1e-2. */
/* --persist: sweep_job times the default launch shape with cu_matvec_persist 0, -1, 1 */
static bool sweep_persist_ab = false;
/* --tma: sweep_job times the register kernel against the staged one (tma_tunes) */
static bool sweep_tma_ab = false;

static bool sweep_job(int dtype, const struct mv_job_shape &js, double copy_gbs, int q8x, const int *tys = NULL) {
    cu_matvec_q8_x(q8x);
    const int n_w = js.pair ? 2 : js.n_seg;
    auto ty = [&](int i) { return tys && !js.pair ? tys[i % n_w] : dtype; };
    const bool kq = cu_dtype_kquant(dtype);
    size_t set_bytes = 0;
    for (int i = 0; i < n_w; i++)
        set_bytes += cu_weight_data_bytes(ty(i), js.rows[js.pair ? 0 : i], js.k) +
                     cu_weight_scale_bytes(ty(i), js.rows[js.pair ? 0 : i], js.k);
    const int copies = (int)std::min<size_t>(16, ((size_t)512 << 20) / set_bytes + 1);
    std::vector<cu_weight> w((size_t)(copies * n_w));
    std::vector<void *> mem(w.size());
    for (size_t i = 0; i < w.size(); i++)
        mem[i] = random_weight(ty((int)(i % n_w)), js.rows[js.pair ? 0 : i % n_w], js.k, (uint32_t)(31 + i), &w[i]);
    int64_t n_out = 0;
    for (int s = 0; s < js.n_seg; s++) n_out += js.rows[s];
    float *x, *y, *nw;
    CHECK_CUDA(cudaMalloc(&x, (size_t)js.k * 4));
    CHECK_CUDA(cudaMalloc(&nw, (size_t)js.k * 4));
    CHECK_CUDA(cudaMalloc(&y, (size_t)n_out * 4));
    fill(x, js.k, 0, 5);
    fill(nw, js.k, 0, 6);
    const float eps = 1e-6f;
    auto launch = [&](int c) {
        struct cu_mv_seg seg[3];
        float *yo = y;
        for (int s = 0; s < js.n_seg; s++) {
            seg[s] = {w[(size_t)(c * n_w + s)], yo, {NULL, NULL, NULL, js.pair ? (int)IR_OP_SILU : -1, NULL, 0.0f}, 0};
            yo += js.rows[s];
        }
        if (js.norm) {
            seg[0].ep.norm_w = nw;
            seg[0].ep.norm_eps = eps;
        }
        return cu_matvec_multi(0, x, 1, seg, js.n_seg, js.pair ? &w[(size_t)(c * n_w + 1)] : NULL);
    };
    /* host copies of set 0 and the (normalized) x in double */
    std::vector<std::vector<uint8_t>> hw((size_t)n_w);
    for (int i = 0; i < n_w; i++) {
        const cu_weight &wi = w[(size_t)i];
        size_t data = cu_weight_data_bytes(wi.dtype, wi.rows, js.k), off = (data + 255) & ~(size_t)255;
        hw[(size_t)i].resize(off + cu_weight_scale_bytes(wi.dtype, wi.rows, js.k));
        CHECK_CUDA(cudaMemcpy(hw[(size_t)i].data(), mem[(size_t)i], hw[(size_t)i].size(), cudaMemcpyDeviceToHost));
    }
    std::vector<float> hx((size_t)js.k), hn((size_t)js.k), hy((size_t)n_out);
    CHECK_CUDA(cudaMemcpy(hx.data(), x, hx.size() * 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(hn.data(), nw, hn.size() * 4, cudaMemcpyDeviceToHost));
    std::vector<double> xn((size_t)js.k);
    double ss = 0;
    for (float v : hx) ss += (double)v * v;
    const double inv = js.norm ? 1.0 / sqrt(ss / (double)js.k + eps) : 1.0;
    for (int64_t c = 0; c < js.k; c++) xn[(size_t)c] = hx[(size_t)c] * inv * (js.norm ? hn[(size_t)c] : 1.0f);
    if (q8x) { /* the int8 x mode: the normalized row as the kernel forms it in f32, then rounded */
        std::vector<float> xf((size_t)js.k);
        const float invf = js.norm ? 1.0f / sqrtf((float)(ss / (double)js.k) + eps) : 1.0f;
        for (int64_t c = 0; c < js.k; c++) xf[(size_t)c] = js.norm ? hx[(size_t)c] * invf * hn[(size_t)c] : hx[(size_t)c];
        host_q8x(xf.data(), js.k, xn.data());
    }
    auto host_dot = [&](int i, int64_t j, double *mag) {
        const cu_weight &wi = w[(size_t)i];
        size_t off = (cu_weight_data_bytes(wi.dtype, wi.rows, js.k) + 255) & ~(size_t)255;
        const uint16_t *sc = wi.scales ? (const uint16_t *)(hw[(size_t)i].data() + off) : NULL;
        double d = 0;
        *mag = 0;
        std::vector<float> row(kq ? (size_t)js.k : 0);
        if (kq) host_kq_row(wi.dtype, hw[(size_t)i].data(), sc, j, js.k, row.data());
        for (int64_t c = 0; c < js.k; c++) {
            double p = (kq ? row[(size_t)c] : host_elem(dtype, hw[(size_t)i].data(), sc, j, c, js.k)) * xn[(size_t)c];
            d += p;
            *mag += fabs(p);
        }
        return d;
    };
    const int mv_tunes[][8] = {{0, 0, 0},  {1, 4, 0},  {1, 8, 0},  {1, 16, 0}, {2, 4, 0},  {2, 8, 0},
                               {2, 16, 0}, {4, 4, 0},  {4, 8, 0},  {4, 16, 0}, {1, 8, 16384}, {2, 8, 16384},
                               {1, 16, 16384}, {2, 16, 16384}, {4, 8, 16384}};
    /* K-quants: rows a warp (0 the default), next loads in flight (1 yes, 2 no), blocks an SM (0 as many as fit) */
    const int kq_tunes[][8] = {{0, 0, 0}, {1, 1, 0}, {2, 1, 0}, {1, 2, 0}, {2, 2, 0}};
    /* --persist: {persist mode, 0, 0}, each at the default shape */
    const int persist_tunes[][8] = {{0, 0, 0}, {-1, 0, 0}, {1, 0, 0}};
    /* --tma: {staged kernel off/on, rows a tile, shared memory KiB, wait mode, blocks an
     * SM, producer lanes, a copy a row}: the register kernel; the staged default; 8 rows
     * a tile in a 200 KiB ring; 8 rows a tile, two blocks an SM of 100 KiB; one block an
     * SM of 100 KiB (room for the next launch's block beside it: its producer streams
     * while this one drains); the default with spin waits */
    const int tma_tunes[][8] = {{0}, {1, 0, 0, -1, 0, 1, 0}, {1, 8, 200, -1, 0, 1, 0}, {1, 8, 100, -1, 2, 1, 0},
                                {1, 8, 100, -1, 1, 1, 0}, {1, 0, 0, 1, 0, 1, 0}};
    const int(*tunes)[8] = sweep_tma_ab ? tma_tunes : kq ? kq_tunes : sweep_persist_ab ? persist_tunes : mv_tunes;
    const size_t n_tunes = sweep_tma_ab       ? sizeof tma_tunes / sizeof tma_tunes[0]
                           : kq               ? sizeof kq_tunes / sizeof kq_tunes[0]
                           : sweep_persist_ab ? 3
                                              : sizeof mv_tunes / sizeof mv_tunes[0];
    bool all_ok = true;
    double best = 0;
    int best_t = 0;
    for (size_t t = 0; t < n_tunes; t++) {
        if (js.pair && tunes[t][0] == 4 && !sweep_tma_ab) continue;
        if (sweep_tma_ab) { /* (K-quants: the register kernel at its default shape) */
            cu_matvec_tma(tunes[t][0]);
            cu_matvec_tma_tune(tunes[t][1], tunes[t][2], tunes[t][4], -1, 0, tunes[t][3], tunes[t][5], tunes[t][6]);
        } else if (kq)
            cu_kq_tune(tunes[t][0], tunes[t][1], tunes[t][2]);
        else if (sweep_persist_ab)
            cu_matvec_persist(tunes[t][0], 0);
        else
            cu_matvec_tune(tunes[t][0], tunes[t][1], tunes[t][2]);
        CHECK_CUDA(cudaMemset(y, 0xff, (size_t)n_out * 4)); /* NaN: every output must be written */
        CHECK_CUDA(launch(0));
        CHECK_CUDA(cudaDeviceSynchronize());
        CHECK_CUDA(cudaMemcpy(hy.data(), y, hy.size() * 4, cudaMemcpyDeviceToHost));
        double worst = 0;
        int64_t base = 0;
        for (int s = 0; s < js.n_seg; s++) {
            for (int64_t q = 0; q < 24; q++) {
                int64_t j = q == 0 ? js.rows[s] - 1 : (q * 7919) % js.rows[s];
                double mag, ref = host_dot(s, j, &mag);
                if (js.pair) {
                    double magu, u = host_dot(1, j, &magu), sg = ref / (1.0 + exp(-ref));
                    mag = mag * fabs(u) + fabs(sg) * magu;
                    ref = sg * u;
                }
                double got = hy[(size_t)(base + j)];
                double e = std::isfinite(got) ? fabs(got - ref) / (mag > 0 ? mag : 1) : INFINITY;
                worst = std::max(worst, e);
            }
            base += js.rows[s];
        }
        bool ok = worst < (kq ? 1e-2 : 1e-5); /* K-quants: x rounded to int8 */
        all_ok = all_ok && ok;
        int per = std::max(copies, 8);
        double sec = time_median(3, 15, [&] {
                         for (int i = 0; i < per; i++) CHECK_CUDA(launch(i % copies));
                     }) / per;
        double gbs = ((double)set_bytes + (double)(js.k * (js.norm ? 8 : 4) + n_out * 4)) / sec / 1e9;
        if (gbs > best) best = gbs, best_t = (int)t;
        if (sweep_persist_ab)
            printf("persist %2d ", tunes[t][0]);
        if (sweep_tma_ab)
            printf("%s rs %d smem %3d bps %d wait %2d ", tunes[t][0] ? "tma" : "reg", tunes[t][1], tunes[t][2],
                   tunes[t][4], tunes[t][3]);
        printf("sweep %-34s %-5s%s nr %d lif %2d warps %5d  %8.2f us  %7.1f GB/s  %5.1f%% of copy  err %.1e %s\n", js.what,
               dtype_name(dtype), dtype == CU_Q8_0 ? q8_x_names[q8x + 1] : "", tunes[t][0], tunes[t][1], tunes[t][2], sec * 1e6, gbs,
               100 * gbs / copy_gbs, worst, ok ? "ok" : "FAIL");
    }
    printf("best  %-34s %-5s%s nr %d lif %2d warps %5d  %.1f%% of copy\n", js.what, dtype_name(dtype),
           dtype == CU_Q8_0 ? q8_x_names[q8x + 1] : "",
           tunes[best_t][0], tunes[best_t][1], tunes[best_t][2], 100 * best / copy_gbs);
    cu_matvec_q8_x(-1);
    cu_matvec_tune(0, 0, 0);
    cu_matvec_persist(-1, 0);
    cu_kq_tune(0, 0, 0);
    cu_matvec_tma(-1);
    cu_matvec_tma_tune(0, 0, 0, -1, 0, -1, 1, 0);
    for (void *m : mem) CHECK_CUDA(cudaFree(m));
    CHECK_CUDA(cudaFree(x));
    CHECK_CUDA(cudaFree(y));
    CHECK_CUDA(cudaFree(nw));
    return all_ok;
}

/* --sweep [bf16|q8_0 [0|1|-1 [JOB]]]: the 8B and 0.6B decode launch shapes (bf16, q8_0
 * with f32 and int8 x, or only the x mode given; -1 both) at every cu_matvec_tune
 * shape; JOB: only the launches whose name begins with it. */
static int sweep(double copy_gbs, const char *only, int only_x, const char *job) {
    const struct mv_job_shape jobs[] = {
        {"attn_o 4096x4096", 1, {4096}, 4096, false, false},
        {"ffn_down 4096x14336", 1, {4096}, 14336, false, false},
        {"q/k/v (4096+1024+1024)x4096 +norm", 3, {4096, 1024, 1024}, 4096, false, true},
        {"gate/up pair 2x14336x4096 +norm", 1, {14336}, 4096, true, true},
        {"0.6B attn_o 1024x2048", 1, {1024}, 2048, false, false},
        {"0.6B ffn_down 1024x3072", 1, {1024}, 3072, false, false},
        {"0.6B q/k/v (2048+1024+1024)x1024 +norm", 3, {2048, 1024, 1024}, 1024, false, true},
        {"0.6B gate/up pair 2x3072x1024 +norm", 1, {3072}, 1024, true, true},
        {"0.6B lm_head 151936x1024", 1, {151936}, 1024, false, false},
        {"0.6B lm_head 151936x1024 +norm", 1, {151936}, 1024, false, true},
    };
    bool ok = true;
    for (int dtype : {CU_BF16, CU_Q8_0})
        for (int q8x = 0; q8x <= (dtype == CU_Q8_0 ? 1 : 0); q8x++)
            for (const auto &js : jobs)
                if ((!only || !strcmp(only, dtype_name(dtype))) && (only_x < 0 || only_x == q8x) &&
                    (!job || !strncmp(js.what, job, strlen(job))))
                    ok = sweep_job(dtype, js, copy_gbs, q8x) && ok;
    printf("sweep checks %s\n", ok ? "ok" : "FAILED");
    return ok ? 0 : 1;
}

/* --persist [bf16|q8_0]: the Qwen3-8B decode launches (and 0.6B q/k/v, pair) at the
 * default shape, not persistent, the default, and every launch persistent
 * (cu_matvec_persist 0, -1, 1) one after the other in one process. */
static int persist_ab(double copy_gbs, const char *only) {
    const struct mv_job_shape jobs[] = {
        {"q/k/v (4096+1024+1024)x4096 +norm", 3, {4096, 1024, 1024}, 4096, false, true},
        {"attn_o 4096x4096", 1, {4096}, 4096, false, false},
        {"gate/up pair 2x12288x4096 +norm", 1, {12288}, 4096, true, true},
        {"ffn_down 4096x12288", 1, {4096}, 12288, false, false},
        {"lm_head 151936x4096", 1, {151936}, 4096, false, false},
        {"0.6B q/k/v (2048+1024+1024)x1024 +norm", 3, {2048, 1024, 1024}, 1024, false, true},
        {"0.6B gate/up pair 2x3072x1024 +norm", 1, {3072}, 1024, true, true},
    };
    sweep_persist_ab = true;
    bool ok = true;
    for (int dtype : {CU_BF16, CU_Q8_0})
        for (const auto &js : jobs)
            if (!only || !strcmp(only, dtype_name(dtype))) {
                /* q8_0: the x mode the default takes for this launch (int8: a prologue, a
                 * pair, or K <= 4096 below 16384 rows), forced so the reference matches */
                const int64_t n = js.rows[0] + js.rows[1] + js.rows[2];
                const int q8x = dtype == CU_Q8_0 && (js.norm || js.pair || (js.k <= 4096 && n < 16384)) ? 1 : 0;
                ok = sweep_job(dtype, js, copy_gbs, q8x) && ok;
            }
    /* q8_0 ffn_down and lm_head with int8 x (their default is f32 x): with persistent
     * blocks the x quantization runs once a block */
    if (!only || !strcmp(only, "q8_0"))
        for (int j = 3; j <= 4; j++) ok = sweep_job(CU_Q8_0, jobs[j], copy_gbs, 1) && ok;
    sweep_persist_ab = false;
    printf("persist checks %s\n", ok ? "ok" : "FAILED");
    return ok ? 0 : 1;
}

/* --tma's chained row: a decode attention (the 8B or 0.6B shape: 32 or 16 query heads
 * of 128, f16 KV, 576 cached positions) followed by the attn_o matvec on its output (+
 * residual), launched as its programmatic dependent as in a decode step; 16 pairs a
 * run, rotating over cache and weight copies (none in L2). The attention alone, the
 * matvec alone and the pairs, register kernel against staged, alternated: what a pair
 * saves against the sum of the two alone is the overlap (the staged ring filling while
 * the attention runs). */
static bool bench_chain(int dtype, int heads, int64_t n_out) {
    const int64_t k = (int64_t)heads * 128;
    struct lab_dec_att d;
    lab_dec_att_init(&d, 576, heads, true);
    size_t one = ((cu_weight_data_bytes(dtype, n_out, k) + 255) & ~(size_t)255) + cu_weight_scale_bytes(dtype, n_out, k);
    const int copies = (int)std::min<size_t>(64, ((size_t)256 << 20) / one + 1);
    std::vector<cu_weight> w((size_t)copies);
    std::vector<void *> mem((size_t)copies);
    for (int c = 0; c < copies; c++) mem[(size_t)c] = random_weight(dtype, n_out, k, (uint32_t)(61 + c), &w[(size_t)c]);
    float *y, *res;
    CHECK_CUDA(cudaMalloc(&y, (size_t)n_out * 4));
    CHECK_CUDA(cudaMalloc(&res, (size_t)n_out * 4));
    fill(res, n_out, 0, 62);
    struct cu_epilogue ep = {NULL, NULL, res, -1, NULL, 0.0f};
    cu_matvec_q8_x(1);
    int wi = 0;
    const auto mv = [&]() { CHECK_CUDA(cu_matvec(0, &w[(size_t)(wi++ % copies)], d.out, 1, y, &ep)); };
    std::vector<double> t[2][3];
    std::vector<float> ref((size_t)n_out), got((size_t)n_out);
    double err = 0;
    for (int rep = 0; rep < 5; rep++)
        for (int m = 0; m < 2; m++) {
            cu_matvec_tma(m);
            if (rep == 0) { /* the pair's output, register against staged, on the same inputs */
                d.rot = 0;
                wi = 0;
                CHECK_CUDA(cudaMemset(y, 0xff, (size_t)n_out * 4));
                lab_dec_att_launch(&d);
                mv();
                CHECK_CUDA(cudaDeviceSynchronize());
                CHECK_CUDA(cudaMemcpy((m ? got : ref).data(), y, (size_t)n_out * 4, cudaMemcpyDeviceToHost));
            }
            t[m][0].push_back(time_median(1, 5, [&] { for (int r = 0; r < 16; r++) lab_dec_att_launch(&d); }) / 16);
            t[m][1].push_back(time_median(1, 5, [&] { for (int r = 0; r < 16; r++) mv(); }) / 16);
            t[m][2].push_back(time_median(1, 5, [&] {
                                  for (int r = 0; r < 16; r++) {
                                      lab_dec_att_launch(&d);
                                      mv();
                                  }
                              }) / 16);
        }
    double mr = 0;
    for (int64_t j = 0; j < n_out; j++) {
        mr = std::max(mr, (double)fabsf(ref[(size_t)j]));
        err = std::max(err, fabs((double)got[(size_t)j] - ref[(size_t)j]));
    }
    err /= mr > 0 ? mr : 1;
    const bool ok = err == err && err < 1e-4 && mr == mr;
    for (int m = 0; m < 2; m++) {
        const double a = median(t[m][0]) * 1e6, b = median(t[m][1]) * 1e6, p = median(t[m][2]) * 1e6;
        printf("chain %-4s attention H%d (576 pos, f16 KV) -> attn_o %lldx%lld %s: attention %6.2f us, matvec %6.2f us, "
               "pair %6.2f us, overlap %5.2f us\n",
               dtype_name(dtype), heads, (long long)n_out, (long long)k, m ? "staged  " : "register", a, b, p, a + b - p);
    }
    printf("chain check (staged vs register output, max |diff| / max |ref|) %.1e %s\n", err, ok ? "ok" : "FAIL");
    cu_matvec_tma(-1);
    cu_matvec_q8_x(-1);
    for (void *m : mem) CHECK_CUDA(cudaFree(m));
    CHECK_CUDA(cudaFree(y));
    CHECK_CUDA(cudaFree(res));
    lab_dec_att_free(&d);
    return ok;
}

/* --tma [bf16|q8_0|q4_k|q6_k [JOB]]: the 8B and 0.6B decode launches, register kernel
 * against the staged one at its launch shapes (sweep_job with tma_tunes; q8_0 with int8
 * x for both; the K-quants also q/k/v of q4_K q/k and a q6_K v, as Q4_K_M files mix
 * them), then the chained rows (bf16, q8_0); JOB: only the launches whose name begins
 * with it, no chains. */
static int tma_ab(double copy_gbs, const char *only, const char *job) {
    const struct mv_job_shape jobs[] = {
        {"attn_o 4096x4096", 1, {4096}, 4096, false, false},
        {"ffn_down 4096x12288", 1, {4096}, 12288, false, false},
        {"q/k/v (4096+1024+1024)x4096 +norm", 3, {4096, 1024, 1024}, 4096, false, true},
        {"gate/up pair 2x12288x4096 +norm", 1, {12288}, 4096, true, true},
        {"lm_head 151936x4096 +norm", 1, {151936}, 4096, false, true},
        {"0.6B attn_o 1024x2048", 1, {1024}, 2048, false, false},
        {"0.6B ffn_down 1024x3072", 1, {1024}, 3072, false, false},
        {"0.6B q/k/v (2048+1024+1024)x1024 +norm", 3, {2048, 1024, 1024}, 1024, false, true},
        {"0.6B gate/up pair 2x3072x1024 +norm", 1, {3072}, 1024, true, true},
        {"0.6B lm_head 151936x1024 +norm", 1, {151936}, 1024, false, true},
    };
    sweep_tma_ab = true;
    bool ok = true;
    for (int dtype : {CU_BF16, CU_Q8_0, CU_Q4_K, CU_Q6_K})
        if (!only || !strcmp(only, dtype_name(dtype)))
            for (const auto &js : jobs)
                if (!job || !strncmp(js.what, job, strlen(job)))
                    ok = sweep_job(dtype, js, copy_gbs, dtype == CU_Q8_0 ? 1 : 0) && ok;
    const struct mv_job_shape mixed = {"q/k/v q4_K q/k, q6_K v +norm", 3, {4096, 1024, 1024}, 4096, false, true};
    const int mixed_tys[3] = {CU_Q4_K, CU_Q4_K, CU_Q6_K};
    if ((!only || !strcmp(only, "q4_k")) && (!job || !strncmp(mixed.what, job, strlen(job))))
        ok = sweep_job(CU_Q4_K, mixed, copy_gbs, 0, mixed_tys) && ok;
    sweep_tma_ab = false;
    for (int dtype : {CU_BF16, CU_Q8_0})
        if ((!only || !strcmp(only, dtype_name(dtype))) && !job) {
            ok = bench_chain(dtype, 32, 4096) && ok;
            ok = bench_chain(dtype, 16, 1024) && ok;
        }
    printf("tma checks %s\n", ok ? "ok" : "FAILED");
    return ok ? 0 : 1;
}

int main(int argc, char **argv) {
    bool quick = argc > 1 && !strcmp(argv[1], "--quick");
    char desc[256], why[256];
    if (!cuda_device_available(why, sizeof why)) {
        printf("skip: %s\n", why);
        return 0;
    }
    cuda_device_describe(desc, sizeof desc);
    printf("device: %s\n", desc);
    double copy_gbs = copy_bandwidth();
    printf("device-to-device copy: %.1f GB/s (read + write, 2 GiB, median of 10)\n\n", copy_gbs);
    if (argc > 1 && !strcmp(argv[1], "--sweep")) return sweep(copy_gbs, argc > 2 ? argv[2] : NULL, argc > 3 ? atoi(argv[3]) : -1, argc > 4 ? argv[4] : NULL);
    if (argc > 1 && !strcmp(argv[1], "--persist")) return persist_ab(copy_gbs, argc > 2 ? argv[2] : NULL);
    if (argc > 1 && !strcmp(argv[1], "--tma")) return tma_ab(copy_gbs, argc > 2 ? argv[2] : NULL, argc > 3 ? argv[3] : NULL);
    if (argc > 1 && !strcmp(argv[1], "--decode-attention")) /* 8B decode attention at several split counts */
    {
        bool ok = true;
        for (int heads : {32, 16})
            for (bool f16 : {false, true})
                for (int ctx : {576, 640, 1024, 4096}) ok = bench_decode_attention(ctx, heads, f16) && ok;
        return ok ? 0 : 1;
    }
    if (argc > 1 && !strcmp(argv[1], "--attention")) { /* 8B and 0.6B-shaped layers (Dh 128), a 64-dim one */
        bool ok = bench_prefill_attention(512, 32, 8, 128) && bench_prefill_attention(2048, 32, 8, 128) &&
                  bench_prefill_attention(512, 16, 8, 128) && bench_prefill_attention(512, 32, 8, 64);
        return ok ? 0 : 1;
    }
    struct shape shapes[] = {
        {4096, 4096, "8B attn_q/o 4096x4096"},
        {14336, 4096, "8B ffn_up 14336x4096"},
        {4096, 14336, "8B ffn_down 4096x14336"},
        {151936, 1024, "0.6B lm_head 151936x1024"},
        {3072, 1024, "0.6B ffn_up 3072x1024"},
        {1024, 3072, "0.6B ffn_down 1024x3072"},
        {2048, 1024, "0.6B attn_q 2048x1024"},
    };
    int types[] = {CU_BF16, CU_Q8_0, CU_Q4_0, CU_F16, CU_F32};
    int n_types = quick ? 3 : 5;
    bool all_ok = true;
    double best = 0;
    for (int t = 0; t < n_types; t++)
        for (int q8x = (types[t] == CU_Q8_0 ? -1 : 0); q8x <= (types[t] == CU_Q8_0 ? 1 : 0); q8x++)
            for (const struct shape &sh : shapes) {
                bool ok = true;
                double g = bench_matvec(types[t], sh, 1, copy_gbs, &ok, 0, -1, q8x);
                best = std::max(best, g);
                all_ok = all_ok && ok;
            }
    printf("\n");
    for (int t = 0; t < 2; t++) {
        bool ok = true;
        bench_matvec(types[t], shapes[1], 4, copy_gbs, &ok);
        all_ok = all_ok && ok;
    }
    printf("\n");
    bench_tiled(CU_Q8_0, 4096, 4096, 512);
    bench_tiled(CU_Q4_0, 4096, 4096, 512);
    /* K-quants: 8B shapes at 1, 2 and 4 output rows a warp, x f32 from global or
     * shared memory or int8 (dp4a), then the default choice on
     * every shape, 4 x rows, and the prefill dequantization */
    printf("\n");
    int kq_types[] = {CU_Q4_K, CU_Q6_K, CU_Q5_K};
    for (int t = 0; t < (quick ? 2 : 3); t++) {
        for (int s = 0; s < 3; s++) {
            /* the older kernel's best f32 shapes, then the int8-x kernel (q4_K/q6_K:
             * cu_matvec_kq_multi at 1 and 2 rows a warp, with the next item's loads in
             * flight (16 warps an SM) or not (24)) */
            for (int v = 0; v < 6; v++) {
                static const int var[][3] = {{4, 1, 0}, {2, 1, 0}, {1, 2, 1}, {2, 2, 1}, {1, 2, 2}, {2, 2, 2}};
                if (kq_types[t] == CU_Q5_K && var[v][2] == 2) continue;
                cu_kq_tune(0, var[v][2], 0);
                bool ok = true;
                bench_matvec(kq_types[t], shapes[s], 1, copy_gbs, &ok, var[v][0], var[v][1]);
                if (var[v][2] == 2) printf("  (above: no prefetch, 24 warps an SM)\n");
                all_ok = all_ok && ok;
            }
            cu_kq_tune(0, 0, 0);
        }
        for (const struct shape &sh : shapes) {
            bool ok = true;
            double g = bench_matvec(kq_types[t], sh, 1, copy_gbs, &ok);
            best = std::max(best, g);
            all_ok = all_ok && ok;
        }
        bool ok = true;
        bench_matvec(kq_types[t], shapes[1], 4, copy_gbs, &ok);
        all_ok = all_ok && ok && bench_kq_dequant(kq_types[t], 14336, 4096, copy_gbs);
        printf("\n");
    }
    /* the fused 8B decode launches with K-quant weights (Q4_K_M: q6_K v in some layers) */
    static const int qkv_mixed[] = {CU_Q4_K, CU_Q4_K, CU_Q6_K};
    const struct mv_job_shape kq_jobs[] = {
        {"q/k/v (4096+1024+1024)x4096 +norm", 3, {4096, 1024, 1024}, 4096, false, true},
        {"gate/up pair 2x14336x4096 +norm", 1, {14336}, 4096, true, true},
    };
    all_ok = sweep_job(CU_Q4_K, kq_jobs[0], copy_gbs, 0) && all_ok;
    all_ok = sweep_job(CU_Q4_K, kq_jobs[0], copy_gbs, 0, qkv_mixed) && all_ok;
    printf("  (above: q4_K q/k, q6_K v)\n");
    all_ok = sweep_job(CU_Q4_K, kq_jobs[1], copy_gbs, 0) && all_ok;
    printf("\nsummary: copy %.0f GB/s; best matvec %.0f GB/s (%.0f%%); checks %s\n", copy_gbs, best,
           100 * best / copy_gbs, all_ok ? "ok" : "FAILED");
    return all_ok ? 0 : 1;
}
