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
 *      that feeds cuBLAS for prefill (GB/s read + written).
 *
 * Weights are random (never zeros), written on the device in the upload layout
 * (cu_weight); every timed run rotates over enough copies that the working set is
 * several times the L2. Usage: bench_cuda_kernels [--quick] */
extern "C" {
#include "backend/cuda/cuda_backend.h"
#include "format/gguf.h"
/* format/quant_k.h (C-only static asserts): the reference K-quant dequantizer */
void quant_k_dequantize_row(enum ggml_type type, const void *src, float *dst, int64_t n);
}
#include "backend/cuda/cuda_kernels.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define CHECK_CUDA(call)                                                                       \
    do {                                                                                       \
        cudaError_t e_ = (call);                                                               \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

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

/* Times cu_matvec on one weight shape/type; returns GB/s (and prints a row). */
/* nr / xs: the K-quant matvec's rows per warp and x mode (cu_matvec_kq); both left
 * at 0 / -1: cu_matvec with its defaults. */
static double bench_matvec(int dtype, struct shape sh, int rows, double copy_gbs, bool *ok, int nr = 0, int xs = -1) {
    size_t data = cu_weight_data_bytes(dtype, sh.n_out, sh.k), scale = cu_weight_scale_bytes(dtype, sh.n_out, sh.k);
    size_t one = ((data + 255) & ~(size_t)255) + scale;
    int copies = (int)std::min<size_t>(64, std::max<size_t>(1, ((size_t)256 << 20) / one + 1));
    std::vector<cu_weight> w(copies);
    std::vector<void *> mem(copies);
    int kinds[] = {0, 1, 2, 3, 3, 3, 3, 3, 3};
    for (int c = 0; c < copies; c++) {
        CHECK_CUDA(cudaMalloc(&mem[c], one));
        fill(mem[c], dtype >= CU_Q8_0 ? (int64_t)data : (int64_t)(data / (dtype == CU_F32 ? 4 : 2)), kinds[dtype], 7 + c);
        if (dtype == CU_Q4_K || dtype == CU_Q5_K) {
            fix_kq_scales_kernel<<<256, 256>>>((uint8_t *)mem[c], sh.n_out * (sh.k / 256), dtype == CU_Q4_K ? 144 : 176, 11 + c);
            CHECK_CUDA(cudaGetLastError());
        }
        w[c] = {dtype, sh.n_out, sh.k, mem[c], NULL};
        if (scale) {
            uint16_t *sc = (uint16_t *)((uint8_t *)mem[c] + ((data + 255) & ~(size_t)255));
            fill(sc, (int64_t)(scale / 2), 4, 99 + c);
            w[c].scales = sc;
        }
    }
    float *x, *y;
    CHECK_CUDA(cudaMalloc(&x, (size_t)(rows * sh.k) * 4));
    CHECK_CUDA(cudaMalloc(&y, (size_t)(rows * sh.n_out) * 4));
    fill(x, rows * sh.k, 0, 3);
    struct cu_epilogue ep = {NULL, NULL, NULL, -1, NULL, 0.0f};
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
    for (int64_t s = 0; s < 64; s++) {
        int64_t j = (s * 7919) % sh.n_out;
        if (cu_dtype_kquant(dtype)) host_kq_row(dtype, hw.data(), hsc, j, sh.k, wrow.data());
        for (int r = 0; r < rows; r++) {
            double ref = 0, mag = 0;
            for (int64_t c = 0; c < sh.k; c++) {
                double wv = cu_dtype_kquant(dtype) ? wrow[(size_t)c] : host_elem(dtype, hw.data(), hsc, j, c, sh.k);
                double p = wv * hx[(size_t)(r * sh.k + c)];
                ref += p;
                mag += fabs(p);
            }
            double e = fabs(hy[(size_t)(r * sh.n_out + j)] - ref) / (mag > 0 ? mag : 1);
            worst = std::max(worst, e);
        }
    }
    *ok = worst < (xs == 2 ? 1e-2 : 1e-5); /* x rounded to int8: ~1e-3 */
    int per = std::max(copies, 8);
    double sec = time_median(3, 20, [&] {
                     for (int i = 0; i < per; i++) CHECK_CUDA(launch(&w[i % copies]));
                 }) / per;
    double bytes = (double)(data + scale) + (double)rows * (double)(sh.k + sh.n_out) * 4;
    double gbs = bytes / sec / 1e9;
    char nrs[32] = "";
    if (nr || xs >= 0) snprintf(nrs, sizeof nrs, " nr%d xs%d", nr, xs);
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
        for (const struct shape &sh : shapes) {
            bool ok = true;
            double g = bench_matvec(types[t], sh, 1, copy_gbs, &ok);
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
        for (int s = 0; s < 3; s++)
            for (int nr = 1; nr <= 4; nr *= 2)
                for (int xs = 0; xs <= 2; xs++) {
                    bool ok = true;
                    bench_matvec(kq_types[t], shapes[s], 1, copy_gbs, &ok, nr, xs);
                    all_ok = all_ok && ok;
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
    printf("\nsummary: copy %.0f GB/s; best matvec %.0f GB/s (%.0f%%); checks %s\n", copy_gbs, best,
           100 * best / copy_gbs, all_ok ? "ok" : "FAILED");
    return all_ok ? 0 : 1;
}
