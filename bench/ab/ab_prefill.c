/* A/B of the prefill kernels of two AVX-512 kernel tables in one process (run.sh builds
 * the old one from an older commit, as for ab_linear.c), on Qwen3-0.6B's shapes at 512
 * tokens: each F16 linear of one layer (q, k, v, o, gate, up, down; weights rotated
 * over copies larger than the L3 so each comes from memory, as in a prefill) and the
 * prefill attention of one layer (16 query heads, 8 KV heads, head_dim 128, f16 cache).
 * Old and new alternate, best of the repeats in thread CPU time on one thread (or wall
 * time through a pool with THREADS=N); prints ms and GFLOP/s and the largest output
 * difference between the tables.
 *
 *   bench/ab/run.sh OLD_COMMIT prefill [gemm|attention|all] [tokens 512] */
#include "backend/cpu/kernels.h"
#include "backend/cpu/pool.h"
#include "backend/kv_cache.h"
#include "base/fp16.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
extern const struct cpu_isa_kernels cpu_isa_kernels_avx512_old;
static int wall;
static double now(void) {
    struct timespec t;
    clock_gettime(wall ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static float rnd(void) {
    return (float)((rand() % 2001) - 1000) / 1000.f;
}
static double maxdiff(const float *a, const float *b, size_t n) {
    double md = 0;
    for (size_t i = 0; i < n; i++) {
        double d = a[i] - b[i];
        md = d > md ? d : -d > md ? -d : md;
    }
    return md;
}
int main(int argc, char **argv) {
    const char *what = argc > 2 ? argv[2] : "all";
    const int T = argc > 3 ? atoi(argv[3]) : 512, reps = getenv("REPS") ? atoi(getenv("REPS")) : 5;
    const struct cpu_isa_kernels *kern[2] = {&cpu_isa_kernels_avx512_old, cpu_isa_kernels_get(CPU_ISA_AVX512)};
    struct cpu_pool *pool = NULL;
    struct llmopt_err err;
    if (getenv("THREADS")) {
        wall = 1;
        if (pool_create(atoi(getenv("THREADS")), &pool, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
    }
    int nth = pool ? pool_threads(pool) : 1;
    printf("tokens %d, %d thread(s), %s, best of %d, old -> new\n", T, nth, wall ? "wall time" : "thread CPU time",
           reps);
    double tot[2] = {0, 0};
    if (strcmp(what, "attention")) {
        static const int shapes[][2] = {{1024, 2048}, {1024, 1024}, {1024, 1024}, {2048, 1024},
                                        {1024, 3072}, {1024, 3072}, {3072, 1024}};
        static const char *names[] = {"q", "k", "v", "o", "gate", "up", "down"};
        for (int s = 0; s < 7; s++) {
            int K = shapes[s][0], N = shapes[s][1];
            size_t ldw = (size_t)K * 2, bytes = ldw * N;
            int copies = (int)((320u << 20) / bytes) + 1;
            uint8_t **w = malloc(copies * sizeof *w);
            for (int c = 0; c < copies; c++) {
                w[c] = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
                if (c == 0)
                    for (size_t i = 0; i < bytes / 2; i++) {
                        uint16_t h = fp16_from_f32(rnd());
                        memcpy(w[0] + 2 * i, &h, 2);
                    }
                else
                    memcpy(w[c], w[0], bytes);
            }
            float *x = malloc((size_t)T * K * 4), *y[2];
            for (size_t i = 0; i < (size_t)T * K; i++) x[i] = rnd();
            y[0] = malloc((size_t)T * N * 4);
            y[1] = malloc((size_t)T * N * 4);
            size_t sb0 = cpu_linear_scratch_bytes(kern[0], IR_DTYPE_F16, T, K, nth);
            size_t sb1 = cpu_linear_scratch_bytes(kern[1], IR_DTYPE_F16, T, K, nth);
            void *sc = malloc((sb0 > sb1 ? sb0 : sb1) + 64);
            struct cpu_linear op = {.x = x, .rows = T, .k = K, .n_out = N, .wtype = IR_DTYPE_F16,
                                    .act = IR_OP_INPUT, .scratch = sc};
            double best[2] = {1e9, 1e9};
            int cc = 0;
            for (int rep = 0; rep < reps; rep++)
                for (int v = 0; v < 2; v++) {
                    op.y = y[v];
                    double t0 = now();
                    for (int i = 0; i < 4; i++) {
                        op.w = w[cc];
                        cc = (cc + 1) % copies;
                        cpu_linear_run(&op, kern[v], pool);
                    }
                    double dt = (now() - t0) / 4;
                    if (dt < best[v]) best[v] = dt;
                }
            double gf = 2.0 * T * K * N / 1e9;
            printf("%-5s k %4d n %4d: %7.2f ms (%5.1f GFLOP/s) -> %7.2f ms (%5.1f GFLOP/s) %.3fx maxdiff %.1e\n",
                   names[s], K, N, best[0] * 1e3, gf / best[0], best[1] * 1e3, gf / best[1], best[0] / best[1],
                   maxdiff(y[0], y[1], (size_t)T * N));
            tot[0] += best[0];
            tot[1] += best[1];
            for (int c = 0; c < copies; c++) free(w[c]);
            free(w);
            free(x);
            free(y[0]);
            free(y[1]);
            free(sc);
        }
    }
    if (strcmp(what, "gemm")) {
        const int H = 16, HKV = 8, DH = 128, BS = 16;
        int32_t row_elems[1] = {HKV * DH};
        struct kv_cache *kv;
        int max_pos = (T + BS - 1) / BS * BS;
        if (kv_cache_create(1, row_elems, KV_DTYPE_F16, 1, max_pos, max_pos / BS, BS, &kv, &err) ||
            kv_cache_reserve(kv, 0, T, &err)) {
            fprintf(stderr, "kv cache: %s\n", err.msg);
            return 1;
        }
        float *row = malloc(HKV * DH * sizeof(float));
        for (int p = 0; p < T; p++)
            for (int kvi = 0; kvi < 2; kvi++) {
                for (int i = 0; i < HKV * DH; i++) row[i] = rnd();
                kv_cache_write(kv, kvi ? kv->v : kv->k, 0, 0, p, 0, row, HKV * DH);
            }
        int32_t *pos = malloc(T * 4), *slot = calloc(T, 4);
        for (int t = 0; t < T; t++) pos[t] = t;
        float *q = malloc((size_t)H * T * DH * 4), *out[2];
        for (size_t i = 0; i < (size_t)H * T * DH; i++) q[i] = rnd() * 3;
        out[0] = malloc((size_t)H * T * DH * 4);
        out[1] = malloc((size_t)H * T * DH * 4);
        int64_t sf = cpu_attention_scratch_floats(H, HKV, DH);
        float *scratch = malloc((size_t)sf * nth * sizeof(float));
        struct cpu_attention op = {.q = q, .pos = pos, .slot = slot, .n_heads = H, .n_kv_heads = HKV, .n_tok = T,
                                   .head_dim = DH, .scale = 0.088f, .kv = kv, .scratch = scratch,
                                   .scratch_per_thread = sf};
        double best[2] = {1e9, 1e9};
        for (int rep = 0; rep < reps; rep++)
            for (int v = 0; v < 2; v++) {
                op.out = out[v];
                double t0 = now();
                cpu_attention_run(&op, kern[v], pool);
                double dt = now() - t0;
                if (dt < best[v]) best[v] = dt;
            }
        double gf = 4.0 * H * DH * ((double)T * (T + 1) / 2) / 1e9;
        printf("attention f16 kv, 1 layer: %7.2f ms (%5.1f GFLOP/s) -> %7.2f ms (%5.1f GFLOP/s) %.3fx maxdiff %.1e\n",
               best[0] * 1e3, gf / best[0], best[1] * 1e3, gf / best[1], best[0] / best[1],
               maxdiff(out[0], out[1], (size_t)H * T * DH));
        printf("attention x 28 layers: %.1f -> %.1f ms\n", best[0] * 28e3, best[1] * 28e3);
        kv_cache_free(kv);
    }
    if (tot[0] > 0) printf("linears of one layer: %.2f -> %.2f ms (x 28: %.1f -> %.1f ms)\n", tot[0] * 1e3,
                           tot[1] * 1e3, tot[0] * 28e3, tot[1] * 28e3);
    pool_free(pool);
    return 0;
}
