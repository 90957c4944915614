/* Kernel lab for the CUDA backend: each hot kernel alone, checked and timed against its
 * byte count.
 *
 *   1. device-to-device copy bandwidth (bytes read + written): the ceiling decode is
 *      held against;
 *   2. cu_matvec (decode linear) per weight type and shape: median time, achieved GB/s
 *      (weights + x + y bytes) and its fraction of the copy bandwidth; each result is
 *      checked against a double-precision host product on sampled rows;
 *   3. cu_linear_tiled (prefill for block-quantized weights): TFLOP/s at 512 rows.
 *
 * Weights are random (never zeros), written on the device in the upload layout
 * (cu_weight); every timed run rotates over enough copies that the working set is
 * several times the L2. Usage: bench_cuda_kernels [--quick] */
extern "C" {
#include "backend/cuda/cuda_backend.h"
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
    static const char *names[] = {"f32", "f16", "bf16", "q8_0", "q4_0"};
    return names[t];
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

static double copy_bandwidth(void) {
    size_t bytes = (size_t)2 << 30;
    void *a, *b;
    CHECK_CUDA(cudaMalloc(&a, bytes));
    CHECK_CUDA(cudaMalloc(&b, bytes));
    fill(a, (int64_t)bytes, 3, 1);
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    std::vector<double> t;
    for (int rep = 0; rep < 13; rep++) {
        CHECK_CUDA(cudaEventRecord(e0));
        CHECK_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
        CHECK_CUDA(cudaEventRecord(e1));
        CHECK_CUDA(cudaEventSynchronize(e1));
        float ms;
        CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        if (rep >= 3) t.push_back(ms * 1e-3);
    }
    CHECK_CUDA(cudaFree(a));
    CHECK_CUDA(cudaFree(b));
    return 2.0 * (double)bytes / median(t) / 1e9;
}

struct shape { int64_t n_out, k; const char *what; };

/* Times cu_matvec on one weight shape/type; returns GB/s (and prints a row). */
static double bench_matvec(int dtype, struct shape sh, int rows, double copy_gbs, bool *ok) {
    size_t data = cu_weight_data_bytes(dtype, sh.n_out, sh.k), scale = cu_weight_scale_bytes(dtype, sh.n_out, sh.k);
    size_t one = ((data + 255) & ~(size_t)255) + scale;
    int copies = (int)std::min<size_t>(64, std::max<size_t>(1, ((size_t)256 << 20) / one + 1));
    std::vector<cu_weight> w(copies);
    std::vector<void *> mem(copies);
    int kinds[] = {0, 1, 2, 3, 3};
    for (int c = 0; c < copies; c++) {
        CHECK_CUDA(cudaMalloc(&mem[c], one));
        fill(mem[c], dtype >= CU_Q8_0 ? (int64_t)data : (int64_t)(data / (dtype == CU_F32 ? 4 : 2)), kinds[dtype], 7 + c);
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
    CHECK_CUDA(cu_matvec(0, &w[0], x, rows, y, &ep));
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<uint8_t> hw(one);
    std::vector<float> hx((size_t)(rows * sh.k)), hy((size_t)(rows * sh.n_out));
    CHECK_CUDA(cudaMemcpy(hw.data(), mem[0], one, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(hx.data(), x, hx.size() * 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(hy.data(), y, hy.size() * 4, cudaMemcpyDeviceToHost));
    const uint16_t *hsc = scale ? (const uint16_t *)(hw.data() + ((data + 255) & ~(size_t)255)) : NULL;
    double worst = 0;
    for (int64_t s = 0; s < 64; s++) {
        int64_t j = (s * 7919) % sh.n_out;
        for (int r = 0; r < rows; r++) {
            double ref = 0, mag = 0;
            for (int64_t c = 0; c < sh.k; c++) {
                double p = host_elem(dtype, hw.data(), hsc, j, c, sh.k) * hx[(size_t)(r * sh.k + c)];
                ref += p;
                mag += fabs(p);
            }
            double e = fabs(hy[(size_t)(r * sh.n_out + j)] - ref) / (mag > 0 ? mag : 1);
            worst = std::max(worst, e);
        }
    }
    *ok = worst < 1e-5;
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    std::vector<double> t;
    int per = std::max(copies, 8);
    for (int rep = 0; rep < 23; rep++) {
        CHECK_CUDA(cudaEventRecord(e0));
        for (int i = 0; i < per; i++) CHECK_CUDA(cu_matvec(0, &w[i % copies], x, rows, y, &ep));
        CHECK_CUDA(cudaEventRecord(e1));
        CHECK_CUDA(cudaEventSynchronize(e1));
        float ms;
        CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        if (rep >= 3) t.push_back(ms * 1e-3 / per);
    }
    double sec = median(t);
    double bytes = (double)(data + scale) + (double)rows * (double)(sh.k + sh.n_out) * 4;
    double gbs = bytes / sec / 1e9;
    printf("%-28s %-5s rows %d  %9.2f us  %7.1f GB/s  %5.1f%% of copy  err %.1e %s\n", sh.what, dtype_name(dtype),
           rows, sec * 1e6, gbs, 100 * gbs / copy_gbs, worst, *ok ? "ok" : "FAIL");
    for (int c = 0; c < copies; c++) CHECK_CUDA(cudaFree(mem[c]));
    CHECK_CUDA(cudaFree(x));
    CHECK_CUDA(cudaFree(y));
    CHECK_CUDA(cudaEventDestroy(e0));
    CHECK_CUDA(cudaEventDestroy(e1));
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
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    std::vector<double> t;
    for (int rep = 0; rep < 8; rep++) {
        CHECK_CUDA(cudaEventRecord(e0));
        CHECK_CUDA(cu_linear_tiled(0, &w, x, rows, y, &ep));
        CHECK_CUDA(cudaEventRecord(e1));
        CHECK_CUDA(cudaEventSynchronize(e1));
        float ms;
        CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        if (rep >= 2) t.push_back(ms * 1e-3);
    }
    double sec = median(t);
    printf("tiled linear %-5s %lldx%lld rows %lld: %8.1f us  %6.1f TFLOP/s\n", dtype_name(dtype), (long long)n_out,
           (long long)k, (long long)rows, sec * 1e6, 2.0 * n_out * k * rows / sec / 1e12);
    CHECK_CUDA(cudaFree(mem));
    CHECK_CUDA(cudaFree(x));
    CHECK_CUDA(cudaFree(y));
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
    printf("\nsummary: copy %.0f GB/s; best matvec %.0f GB/s (%.0f%%); checks %s\n", copy_gbs, best,
           100 * best / copy_gbs, all_ok ? "ok" : "FAILED");
    return all_ok ? 0 : 1;
}
