/* A/B of the decode attention of two AVX-512 kernel tables in one process (run.sh
 * builds the old one from an older commit, as for ab_linear.c): one query token at
 * depth D over a Qwen3-0.6B-shaped f16 KV cache (28 layers, 16 query heads, 8 KV
 * heads, head_dim 128, blocks of 16 positions), every layer once per repeat, the
 * cache evicted from L2/L3 between repeats by reading a 512 MiB buffer. One thread,
 * best of the repeats in thread CPU time, old and new alternating; prints GB/s of KV
 * read and the largest output difference. THREADS=N: through a pool of N threads,
 * timed in wall-clock time.
 *
 * SMALL=1: stories260K's shape instead (5 layers, 8 query heads, 4 KV heads, head_dim 8),
 * each repeat running the layers 200 times with the cache hot (the server's batched
 * decode, where the cost per position shows rather than bandwidth).
 *
 *   bench/ab/run.sh OLD_COMMIT attention [depth 512] [kv f16|f32|q8_0]   (HOT=1: no eviction) */
#include "backend/cpu/kernels.h"
#include "backend/cpu/pool.h"
#include "backend/kv_cache.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
extern const struct cpu_isa_kernels cpu_isa_kernels_avx512_old;
static int wall; /* THREADS=N: through a pool of N threads, in wall-clock time */
static double now(void) {
    struct timespec t;
    clock_gettime(wall ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static float rnd(void) {
    return (float)((rand() % 2001) - 1000) / 1000.f;
}
int main(int argc, char **argv) {
    /* CONTIG=1: 8x the layers of one KV head each (same bytes, each head's rows
     * contiguous), to see what the interleaved heads cost */
    const int contig = getenv("CONTIG") != NULL;
    const int small = getenv("SMALL") != NULL;
    const int L = contig ? 224 : small ? 5 : 28, H = contig ? 2 : small ? 8 : 16, HKV = contig ? 1 : small ? 4 : 8,
              DH = small ? 8 : 128, BS = 16, inner = small ? 200 : 1;
    int depth = argc > 2 ? atoi(argv[2]) : 512;
    enum kv_dtype kt = argc > 3 && !strcmp(argv[3], "f32") ? KV_DTYPE_F32
                       : argc > 3 && !strcmp(argv[3], "q8_0") ? KV_DTYPE_Q8_0 : KV_DTYPE_F16;
    int32_t row_elems[224];
    for (int l = 0; l < L; l++) row_elems[l] = HKV * DH;
    struct kv_cache *kv;
    struct llmopt_err err;
    int npos = depth + 1, max_pos = (npos + BS - 1) / BS * BS;
    if (kv_cache_create(L, row_elems, kt, 1, max_pos, max_pos / BS, BS, &kv, &err) ||
        kv_cache_reserve(kv, 0, npos, &err)) {
        fprintf(stderr, "kv cache: %s\n", err.msg);
        return 1;
    }
    float *row = malloc(HKV * DH * sizeof(float));
    for (int l = 0; l < L; l++)
        for (int p = 0; p < npos; p++) {
            for (int i = 0; i < HKV * DH; i++) row[i] = rnd();
            kv_cache_write(kv, kv->k, l, 0, p, 0, row, HKV * DH);
            for (int i = 0; i < HKV * DH; i++) row[i] = rnd();
            kv_cache_write(kv, kv->v, l, 0, p, 0, row, HKV * DH);
        }
    float *q = malloc(H * DH * sizeof(float)), *out[2];
    for (int i = 0; i < H * DH; i++) q[i] = rnd();
    out[0] = malloc((size_t)L * H * DH * sizeof(float));
    out[1] = malloc((size_t)L * H * DH * sizeof(float));
    struct cpu_pool *pool = NULL;
    if (getenv("THREADS")) {
        wall = 1;
        if (pool_create(atoi(getenv("THREADS")), &pool, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
    }
    const int nth = pool ? pool_threads(pool) : 1;
    int64_t sf = cpu_attention_scratch_floats(H, HKV, DH);
    float *scratch = malloc((size_t)sf * nth * sizeof(float));
    int32_t pos = depth, slot = 0;
    struct cpu_attention op = {.q = q, .pos = &pos, .slot = &slot, .n_heads = H, .n_kv_heads = HKV, .n_tok = 1,
                               .head_dim = DH, .scale = 0.088f, .kv = kv, .scratch = scratch,
                               .scratch_per_thread = sf};
    const struct cpu_isa_kernels *kern[2] = {&cpu_isa_kernels_avx512_old, cpu_isa_kernels_get(CPU_ISA_AVX512)};
    size_t flush_bytes = (size_t)512 << 20;
    volatile uint64_t *flush = malloc(flush_bytes);
    memset((void *)flush, 1, flush_bytes);
    double best[2] = {1e9, 1e9};
    uint64_t sink = 0;
    for (int rep = 0; rep < 9; rep++)
        for (int v = 0; v < 2; v++) {
            if (!getenv("HOT") && !small)
                for (size_t i = 0; i < flush_bytes / 8; i += 8) sink += flush[i];
            double t0 = now();
            for (int i = 0; i < inner; i++)
                for (int l = 0; l < L; l++) {
                    op.layer = l;
                    op.out = out[v] + (size_t)l * H * DH;
                    cpu_attention_run(&op, kern[v], pool);
                }
            double dt = (now() - t0) / inner;
            if (dt < best[v]) best[v] = dt;
        }
    double md = 0;
    for (size_t i = 0; i < (size_t)L * H * DH; i++) {
        double d = out[0][i] - out[1][i];
        md = d > md ? d : -d > md ? -d : md;
    }
    double gb = 2.0 * L * npos * kv_dtype_bytes(kt, HKV * DH) / 1e9;
    printf("decode attention %s depth %d, %d layers, %d thread(s): old %.3f ms (%.1f GB/s) -> new %.3f ms (%.1f GB/s) "
           "%.2fx maxdiff %.1e (%llu)\n",
           kv_dtype_name(kt), depth, L, nth, best[0] * 1e3, gb / best[0], best[1] * 1e3, gb / best[1], best[0] / best[1], md,
           (unsigned long long)(sink & 1));
    kv_cache_free(kv);
    pool_free(pool);
    return 0;
}
