/* Kernel lab: times each fast CPU kernel in isolation and prints a table.
 *
 *   build/bench_kernels [-t THREADS] [--isa scalar|avx2|avx512|all] [--quick] [--only NAME]
 *                       [--gemm-min-rows N] [--one-range] [--wall] [--rows R,R,...]
 *   build/bench_kernels --model MODEL.gguf [-t THREADS] [-p PROMPT] [-n DECODE] [--ref]
 *
 * Matrix-vector products (decode) are bandwidth-bound: they stream a set of weight
 * copies larger than the last-level cache, so every byte comes from memory, and report
 * GB/s of weights read (compare with the machine's measured read bandwidth, `llmopt
 * probe`). Matrix-matrix products (prefill) are compute-bound and report GFLOP/s
 * (2 * rows * k * n). Each number is the median of several repeats. matvec with rows > 1
 * is a server batch of decode rows: at X GB/s for rows R against Y for rows 1 the batch
 * costs Y / X single rows. --rows sets those row counts (default 1,4,16; at most 16 of
 * them, each 1..1024), e.g. to find where the GEMM overtakes the dot-product tiles with
 * --gemm-min-rows 1025 against the default.
 *
 * --model times whole forwards through the public API: prefill tok/s and decode tok/s
 * (greedy), with the fast backend or, with --ref, the scalar reference. */
#include "backend/cpu/kernels.h"
#include "backend/cpu/pool.h"
#include "base/fp16.h"
#include "format/quant.h"
#include "format/quant_k.h"
#include "llmopt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* One thread: this thread's CPU time, which leaves out time the scheduler gave to other
 * processes (this machine is shared); more threads: wall time. */
static clockid_t bench_clock = CLOCK_MONOTONIC;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(bench_clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) & 0xffffff) / 8388608.0f - 1.0f + 1e-6f;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

/* A random weight matrix (n_out, k) of type t. */
static uint8_t *make_weights(enum ir_dtype t, int64_t n_out, int64_t k) {
    size_t row = ir_dtype_row_bytes(t, k);
    uint8_t *w = aligned_alloc(64, (row * (size_t)n_out + 63) & ~(size_t)63);
    float *tmp = malloc((size_t)k * 4);
    for (int64_t j = 0; j < n_out; j++) {
        for (int64_t i = 0; i < k; i++) tmp[i] = rnd();
        uint8_t *dst = w + row * (size_t)j;
        if (t == IR_DTYPE_F32) memcpy(dst, tmp, (size_t)k * 4);
        else if (t == IR_DTYPE_F16 || t == IR_DTYPE_BF16)
            for (int64_t i = 0; i < k; i++) {
                uint16_t h = t == IR_DTYPE_F16 ? fp16_from_f32(tmp[i]) : bf16_from_f32(tmp[i]);
                memcpy(dst + 2 * i, &h, 2);
            }
        else if (t == IR_DTYPE_Q8_0) quant_quantize_row_q8_0(tmp, dst, k);
        else if (t == IR_DTYPE_Q4_0) quant_quantize_row_q4_0(tmp, dst, k);
        else if (t == IR_DTYPE_Q4_K) quant_k_quantize_row_q4_K(tmp, dst, k);
        else if (t == IR_DTYPE_Q5_K) quant_k_quantize_row_q5_K(tmp, dst, k);
        else if (t == IR_DTYPE_Q6_K) quant_k_quantize_row_q6_K(tmp, dst, k);
        else if (t == IR_DTYPE_Q5_0) quant_quantize_row_q5_0(tmp, dst, k);
        else quant_k_quantize_row_iq4_xs(tmp, dst, k);
    }
    free(tmp);
    return w;
}

struct opts {
    int threads;
    int isa; /* -1: all available */
    bool quick;
    const char *model;
    int prompt, decode;
    bool ref;
    bool wall; /* wall time even with one thread */
    const char *only; /* run only kernels whose name contains this */
    int64_t rows[16]; /* activation rows of the matvec table */
    int n_rows;
};

/* "R,R,..." -> o->rows; false on anything else (empty items, junk, out of range). */
static bool parse_rows(const char *s, struct opts *o) {
    o->n_rows = 0;
    for (;;) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 1024 || o->n_rows == (int)(sizeof o->rows / sizeof o->rows[0])) return false;
        o->rows[o->n_rows++] = v;
        if (*end == '\0') return true;
        if (*end != ',') return false;
        s = end + 1;
    }
}

static const char *only_filter;
static bool wanted(const char *name) {
    return !only_filter || strstr(name, only_filter);
}

static const enum ir_dtype wtypes[] = {IR_DTYPE_F32,  IR_DTYPE_F16,  IR_DTYPE_BF16, IR_DTYPE_Q8_0,
                                       IR_DTYPE_Q4_0, IR_DTYPE_Q4_K, IR_DTYPE_Q5_K, IR_DTYPE_Q6_K,
                                       IR_DTYPE_Q5_0, IR_DTYPE_IQ4_XS};
#define N_WTYPES (int)(sizeof wtypes / sizeof wtypes[0])

/* Decode: y (rows, n) = x W^T, cycling through enough weight copies to defeat the
 * caches. Returns GB/s of weights. */
static double bench_matvec(const struct cpu_isa_kernels *kern, struct cpu_pool *pool, enum ir_dtype t,
                           int64_t rows, int64_t k, int64_t n, int reps, bool hot) {
    size_t bytes = ir_dtype_row_bytes(t, k) * (size_t)n;
    int copies = (int)((768u << 20) / bytes) + 1;
    if (copies > 512) copies = 512;
    if (hot) copies = 1; /* cache-resident: the kernel's arithmetic limit */
    uint8_t **w = malloc((size_t)copies * sizeof *w);
    w[0] = make_weights(t, n, k);
    for (int c = 1; c < copies; c++) {
        w[c] = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
        memcpy(w[c], w[0], bytes);
    }
    float *x = malloc((size_t)(rows * k) * 4), *y = malloc((size_t)(rows * n) * 4);
    for (int64_t i = 0; i < rows * k; i++) x[i] = rnd();
    void *scratch = malloc(cpu_linear_scratch_bytes(kern, t, rows, k, pool_threads(pool)) + 64);
    struct cpu_linear op = {.x = x, .rows = rows, .k = k, .n_out = n, .wtype = t, .act = IR_OP_INPUT,
                            .y = y, .scratch = scratch};
    double *gbs = malloc((size_t)reps * sizeof *gbs);
    for (int c = 0; c < copies; c++) { /* warm: page in every copy */
        op.w = w[c];
        cpu_linear_run(&op, kern, pool);
    }
    int inner = hot ? 200 : 1;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        for (int i = 0; i < inner; i++)
            for (int c = 0; c < copies; c++) {
                op.w = w[c];
                cpu_linear_run(&op, kern, pool);
            }
        gbs[r] = (double)bytes * copies * inner / (now_s() - t0) / 1e9;
    }
    double res = median(gbs, reps);
    for (int c = 0; c < copies; c++) free(w[c]);
    free(w);
    free(x);
    free(y);
    free(scratch);
    free(gbs);
    return res;
}

/* Prefill: one weight matrix (cache-resident or not, it is reused rows times).
 * Returns GFLOP/s. */
static double bench_gemm(const struct cpu_isa_kernels *kern, struct cpu_pool *pool, enum ir_dtype t,
                         int64_t rows, int64_t k, int64_t n, int reps) {
    uint8_t *w = make_weights(t, n, k);
    float *x = malloc((size_t)(rows * k) * 4), *y = malloc((size_t)(rows * n) * 4);
    for (int64_t i = 0; i < rows * k; i++) x[i] = rnd();
    void *scratch = malloc(cpu_linear_scratch_bytes(kern, t, rows, k, pool_threads(pool)) + 64);
    struct cpu_linear op = {.x = x, .rows = rows, .k = k, .n_out = n, .w = w, .wtype = t,
                            .act = IR_OP_INPUT, .y = y, .scratch = scratch};
    cpu_linear_run(&op, kern, pool);
    double *gf = malloc((size_t)reps * sizeof *gf);
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        cpu_linear_run(&op, kern, pool);
        gf[r] = 2.0 * (double)rows * (double)k * (double)n / (now_s() - t0) / 1e9;
    }
    double res = median(gf, reps);
    free(w);
    free(x);
    free(y);
    free(scratch);
    free(gf);
    return res;
}

/* Attention of n_tok tokens at positions ctx - n_tok .. ctx - 1 (one sequence) over a
 * cache of dtype holding ctx positions: n_tok 1 is a decode step, n_tok == ctx a
 * prompt's prefill. Returns GB/s of K and V read (the stored bytes, once) and sets *us
 * and *gflops (the multiply-adds of q.k and p.v over every token's positions, x 2). */
static double bench_attention(const struct cpu_isa_kernels *kern, struct cpu_pool *pool, enum kv_dtype dtype,
                              int64_t n_heads, int64_t n_kv, int64_t dh, int32_t ctx, int32_t n_tok, int reps,
                              double *us, double *gflops) {
    struct llmopt_err err = {0};
    struct kv_cache *kv = NULL;
    int32_t row = (int32_t)(n_kv * dh);
    if (kv_cache_create(1, &row, dtype, 1, ctx + 1, (ctx + 16) / 16 + 1, 16, &kv, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 0;
    }
    kv_cache_reserve(kv, 0, ctx, &err);
    float *vals = malloc((size_t)row * 4);
    for (int32_t p = 0; p < ctx; p++)
        for (int kvi = 0; kvi < 2; kvi++) {
            for (int32_t e = 0; e < row; e++) vals[e] = rnd();
            kv_cache_write(kv, kvi ? kv->v : kv->k, 0, 0, p, 0, vals, row);
        }
    free(vals);
    size_t q_floats = (size_t)(n_heads * n_tok * dh);
    float *q = malloc(q_floats * 4), *out = malloc(q_floats * 4);
    int32_t *pos = malloc((size_t)n_tok * sizeof *pos), *slot = calloc((size_t)n_tok, sizeof *slot);
    for (size_t i = 0; i < q_floats; i++) q[i] = rnd();
    double macs = 0;
    for (int32_t t = 0; t < n_tok; t++) {
        pos[t] = ctx - n_tok + t;
        macs += 2.0 * (pos[t] + 1) * (double)(n_heads * dh);
    }
    int64_t per = cpu_attention_scratch_floats(n_heads, n_kv, dh);
    float *scratch = malloc((size_t)(per * pool_threads(pool)) * 4);
    struct cpu_attention a = {.q = q,
                              .out = out,
                              .pos = pos,
                              .slot = slot,
                              .n_heads = n_heads,
                              .n_kv_heads = n_kv,
                              .n_tok = n_tok,
                              .head_dim = dh,
                              .scale = 0.088f,
                              .layer = 0,
                              .kv = kv,
                              .scratch = scratch,
                              .scratch_per_thread = per};
    double *v = malloc((size_t)reps * sizeof *v);
    cpu_attention_run(&a, kern, pool);
    /* calls per timed sample: a short context's decode call is below the clock's resolution; a
     * prefill takes 4 to even out the other tenants */
    int inner = n_tok == 1 && ctx < 512 ? 64 : n_tok > 1 ? 4 : 1;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        for (int i = 0; i < inner; i++) cpu_attention_run(&a, kern, pool);
        v[r] = (now_s() - t0) / inner;
    }
    double t = median(v, reps);
    *us = t * 1e6;
    *gflops = 2.0 * macs / t / 1e9;
    free(v);
    free(q);
    free(out);
    free(pos);
    free(slot);
    free(scratch);
    double bytes = 2.0 * ctx * (double)kv->row_bytes[0];
    kv_cache_free(kv);
    return bytes / t / 1e9;
}

static double bench_rms_norm(const struct cpu_isa_kernels *kern, struct cpu_pool *pool, int64_t rows,
                             int64_t d, int reps) {
    float *x = malloc((size_t)(rows * d) * 4), *w = malloc((size_t)d * 4), *o = malloc((size_t)(rows * d) * 4);
    for (int64_t i = 0; i < rows * d; i++) x[i] = rnd();
    for (int64_t i = 0; i < d; i++) w[i] = rnd();
    struct cpu_rms_norm op = {.x = x, .w = w, .o = o, .rows = rows, .d = d, .eps = 1e-6f};
    double *v = malloc((size_t)reps * sizeof *v);
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        for (int i = 0; i < 100; i++) cpu_rms_norm_run(&op, kern, pool);
        v[r] = (now_s() - t0) / 100 * 1e6;
    }
    double res = median(v, reps);
    free(x);
    free(w);
    free(o);
    free(v);
    return res;
}

static double bench_rope(const struct cpu_isa_kernels *kern, struct cpu_pool *pool, int64_t heads,
                         int64_t rows_per_head, int64_t d, int reps) {
    int64_t rows = heads * rows_per_head;
    float *x = malloc((size_t)(rows * d) * 4), *o = malloc((size_t)(rows * d) * 4);
    float *c = malloc((size_t)(rows_per_head * d) * 4), *s = malloc((size_t)(rows_per_head * d) * 4);
    for (int64_t i = 0; i < rows * d; i++) x[i] = rnd();
    for (int64_t i = 0; i < rows_per_head * d; i++) c[i] = s[i] = rnd();
    struct cpu_rope op = {.x = x, .o = o, .cos_t = c, .sin_t = s, .rows = rows, .d = d, .rank = 2,
                          .dims = {heads, rows_per_head}, .strides = {0, d}};
    double *v = malloc((size_t)reps * sizeof *v);
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        for (int i = 0; i < 100; i++) cpu_rope_run(&op, kern, pool);
        v[r] = (now_s() - t0) / 100 * 1e6;
    }
    double res = median(v, reps);
    free(x);
    free(o);
    free(c);
    free(s);
    free(v);
    return res;
}

static void nop_fn(void *ctx, int ith, int nth) {
    (void)ctx;
    (void)ith;
    (void)nth;
}

static double bench_pool_run(struct cpu_pool *pool) {
    double v[7];
    for (int r = 0; r < 7; r++) {
        double t0 = now_s();
        for (int i = 0; i < 20000; i++) pool_run(pool, nop_fn, NULL);
        v[r] = (now_s() - t0) / 20000 * 1e9;
    }
    return median(v, 7);
}

static int bench_model(const struct opts *o) {
    struct llmopt_err err = {0};
    struct llmopt_model *m = NULL;
    struct llmopt_session *s = NULL;
    if (o->ref) setenv("LLMOPT_CPU_REF", "1", 1);
    if (llmopt_model_load(o->model, NULL, &m, &err)) {
        fprintf(stderr, "bench: %s\n", err.msg);
        return 1;
    }
    int32_t n_ctx = o->prompt + o->decode + 8;
    struct llmopt_session_opts so = {.n_ctx = n_ctx, .n_batch = o->prompt > 0 ? o->prompt : 1,
                                     .n_threads = o->threads};
    if (llmopt_session_create(m, &so, &s, &err)) {
        fprintf(stderr, "bench: %s\n", err.msg);
        llmopt_model_free(m);
        return 1;
    }
    int32_t nv = llmopt_model_n_vocab(m);
    int32_t *prompt = malloc((size_t)(o->prompt > 0 ? o->prompt : 1) * 4);
    for (int i = 0; i < o->prompt; i++) prompt[i] = 1 + (int32_t)((i * 7919 + 13) % (nv - 1));
    const float *logits = NULL;
    int np = o->prompt > 0 ? o->prompt : 1;
    if (o->prompt <= 0) prompt[0] = 1;
    double t0 = now_s();
    if (llmopt_session_append(s, 0, prompt, np, &logits, &err)) {
        fprintf(stderr, "bench: %s\n", err.msg);
        return 1;
    }
    double t_prefill = now_s() - t0;
    double *step = malloc((size_t)o->decode * sizeof *step);
    struct timespec cpu0, cpu1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu0);
    for (int i = 0; i < o->decode; i++) {
        int32_t best = 0;
        for (int32_t v = 1; v < nv; v++) best = logits[v] > logits[best] ? v : best;
        double ts = now_s();
        if (llmopt_session_append(s, 0, &best, 1, &logits, &err)) {
            fprintf(stderr, "bench: %s\n", err.msg);
            return 1;
        }
        step[i] = now_s() - ts;
    }
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu1);
    double cpu_s = (double)(cpu1.tv_sec - cpu0.tv_sec) + (double)(cpu1.tv_nsec - cpu0.tv_nsec) * 1e-9;
    double total = 0;
    for (int i = 0; i < o->decode; i++) total += step[i];
    double med = o->decode ? median(step, o->decode) : 0;
    printf("model %s  backend %s  isa %s  threads %d\n", o->model, o->ref ? "cpu-ref" : "cpu",
           o->ref ? "scalar-ref" : cpu_isa_name(cpu_isa_best()), o->threads);
    printf("  prefill %d tokens: %.1f tok/s (%.1f ms)\n", np, np / t_prefill, t_prefill * 1e3);
    if (o->decode)
        printf("  decode %d tokens: %.1f tok/s (mean), median step %.3f ms; process CPU time %.1f ms/token\n",
               o->decode, o->decode / total, med * 1e3, cpu_s / o->decode * 1e3);
    free(step);
    free(prompt);
    llmopt_session_free(s);
    llmopt_model_free(m);
    return 0;
}

int main(int argc, char **argv) {
    struct opts o = {.threads = 0, .isa = -2, .prompt = 128, .decode = 64, .rows = {1, 4, 16}, .n_rows = 3};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc) o.threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick")) o.quick = true;
        else if (!strcmp(argv[i], "--ref")) o.ref = true;
        else if (!strcmp(argv[i], "--wall")) o.wall = true;
        else if (!strcmp(argv[i], "--one-range")) cpu_linear_one_range = true;
        else if (!strcmp(argv[i], "--gemm-min-rows") && i + 1 < argc) cpu_gemm_min_rows = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) o.only = only_filter = argv[++i];
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc) {
            if (!parse_rows(argv[++i], &o)) {
                fprintf(stderr, "bench: --rows wants up to 16 counts of 1..1024, comma-separated: %s\n", argv[i]);
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--model") && i + 1 < argc) o.model = argv[++i];
        else if (!strcmp(argv[i], "-p") && i + 1 < argc) o.prompt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-n") && i + 1 < argc) o.decode = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
            const char *name = argv[++i];
            o.isa = -1;
            for (int k = 0; k < CPU_ISA_COUNT; k++)
                if (!strcmp(name, cpu_isa_name((enum cpu_isa)k))) o.isa = k;
            if (o.isa < 0 && strcmp(name, "all")) {
                fprintf(stderr, "bench: unknown ISA %s\n", name);
                return 2;
            }
        } else {
            fprintf(stderr, "usage: %s [-t THREADS] [--isa scalar|avx2|avx512|all] [--quick] [--only NAME]\n"
                            "       [--gemm-min-rows N] [--one-range] [--wall] [--rows R,R,...]\n"
                            "       %s --model MODEL.gguf [-t THREADS] [-p PROMPT] [-n DECODE] [--ref]\n",
                    argv[0], argv[0]);
            return 2;
        }
    }
    if (o.model) return bench_model(&o);

    struct llmopt_err err = {0};
    struct cpu_pool *pool = NULL;
    if (pool_create(o.threads, &pool, &err)) {
        fprintf(stderr, "bench: %s\n", err.msg);
        return 1;
    }
    int reps = o.quick ? 3 : 7;
    if (pool_threads(pool) == 1 && !o.wall) bench_clock = CLOCK_THREAD_CPUTIME_ID;
    printf("threads %d (%s); pool_run (empty) %.0f ns\n", pool_threads(pool),
           bench_clock == CLOCK_MONOTONIC ? "wall time" : "thread CPU time", bench_pool_run(pool));
    for (int isa = 0; isa < CPU_ISA_COUNT; isa++) {
        if (o.isa == -2 && isa != (int)cpu_isa_best()) continue;
        if (o.isa >= 0 && isa != o.isa) continue;
        const struct cpu_isa_kernels *kern = cpu_isa_kernels_get((enum cpu_isa)isa);
        if (!kern) {
            printf("\n%s: not available on this CPU\n", cpu_isa_name((enum cpu_isa)isa));
            continue;
        }
        printf("\n## %s\n\n", cpu_isa_name((enum cpu_isa)isa));
        printf("| kernel | shape | result |\n|---|---|---|\n");
        static const int64_t mv[][2] = {{1024, 3072}, {3072, 1024}, {4096, 4096}};
        char name[64];
        for (int t = 0; t < N_WTYPES; t++)
            for (size_t s = 0; s < sizeof mv / sizeof mv[0]; s++) {
                snprintf(name, sizeof name, "matvec %s", ir_dtype_name(wtypes[t]));
                if ((o.quick && s == 2) || !wanted(name)) continue;
                for (int ri = 0; ri < o.n_rows; ri++) { /* server batches */
                    const int64_t rows = o.rows[ri];
                    printf("| matvec %s | rows %lld, k %lld, n %lld | %.1f GB/s |\n",
                           ir_dtype_name(wtypes[t]), (long long)rows, (long long)mv[s][0],
                           (long long)mv[s][1],
                           bench_matvec(kern, pool, wtypes[t], rows, mv[s][0], mv[s][1], reps, false));
                }
                fflush(stdout);
            }
        /* The same kernels on a cache-resident matrix: what they could stream if memory
         * kept up (decode stays memory-bound only while this is well above the
         * machine's bandwidth per core). */
        for (int t = 0; t < N_WTYPES; t++) {
            snprintf(name, sizeof name, "matvec-hot %s", ir_dtype_name(wtypes[t]));
            if (!wanted(name)) continue;
            for (int64_t rows = 1; rows <= 32; rows *= 2)
                printf("| matvec-hot %s | rows %lld, k 1024, n 256 (in L2) | %.1f GB/s |\n",
                       ir_dtype_name(wtypes[t]), (long long)rows,
                       bench_matvec(kern, pool, wtypes[t], rows, 1024, 256, reps, true));
            fflush(stdout);
        }
        int64_t gemm_rows[] = {16, 128};
        for (int t = 0; t < N_WTYPES; t++)
            for (size_t r = 0; r < 2; r++) {
                snprintf(name, sizeof name, "gemm %s", ir_dtype_name(wtypes[t]));
                if ((isa == CPU_ISA_SCALAR && gemm_rows[r] > 16) || !wanted(name)) continue;
                printf("| gemm %s | rows %lld, k 1024, n 3072 | %.1f GFLOP/s |\n", ir_dtype_name(wtypes[t]),
                       (long long)gemm_rows[r],
                       bench_gemm(kern, pool, wtypes[t], gemm_rows[r], 1024, 3072, reps));
                fflush(stdout);
            }
        int32_t ctxs[] = {256, 1024, 4096};
        for (int dt = 0; dt < KV_DTYPE_COUNT && wanted("attention"); dt++)
            for (int c = 0; c < 3; c++) {
                double us = 0, gf = 0;
                double gbs = bench_attention(kern, pool, (enum kv_dtype)dt, 16, 8, 128, ctxs[c], 1, reps, &us, &gf);
                printf("| attention decode kv %s | H 16, Hkv 8, Dh 128, ctx %d | %.1f GB/s (%.1f us) |\n",
                       kv_dtype_name((enum kv_dtype)dt), ctxs[c], gbs, us);
                fflush(stdout);
            }
        /* stories260K's tiny heads, where the cost per call shows rather than bandwidth */
        int32_t small_ctxs[] = {16, 64, 256};
        for (int dt = 0; dt < KV_DTYPE_COUNT && wanted("attention"); dt++)
            for (int c = 0; c < 3; c++) {
                double us = 0, gf = 0;
                if ((enum kv_dtype)dt == KV_DTYPE_Q8_0) continue; /* q8_0 needs Dh % 32 == 0 */
                bench_attention(kern, pool, (enum kv_dtype)dt, 8, 4, 8, small_ctxs[c], 1, reps, &us, &gf);
                printf("| attention decode kv %s | H 8, Hkv 4, Dh 8, ctx %d | %.3f us |\n",
                       kv_dtype_name((enum kv_dtype)dt), small_ctxs[c], us);
                fflush(stdout);
            }
        /* a Qwen3-0.6B layer's prefill of a 512-token prompt (issue 7's F16 prefill) */
        for (int dt = 0; dt < KV_DTYPE_COUNT && wanted("attention prefill"); dt++) {
            double us = 0, gf = 0;
            bench_attention(kern, pool, (enum kv_dtype)dt, 16, 8, 128, 512, 512, reps, &us, &gf);
            printf("| attention prefill kv %s | H 16, Hkv 8, Dh 128, 512 tokens | %.1f GFLOP/s (%.0f us) |\n",
                   kv_dtype_name((enum kv_dtype)dt), gf, us);
            fflush(stdout);
        }
        if (wanted("rms_norm")) {
            printf("| rms_norm | rows 1, d 1024 | %.2f us |\n", bench_rms_norm(kern, pool, 1, 1024, reps));
            printf("| rms_norm | rows 256, d 1024 | %.2f us |\n", bench_rms_norm(kern, pool, 256, 1024, reps));
        }
        if (wanted("rope")) {
            printf("| rope | 16 heads x 1 row, d 128 | %.2f us |\n", bench_rope(kern, pool, 16, 1, 128, reps));
            printf("| rope | 16 heads x 256 rows, d 128 | %.2f us |\n", bench_rope(kern, pool, 16, 256, 128, reps));
        }
        fflush(stdout);
    }
    pool_free(pool);
    return 0;
}
