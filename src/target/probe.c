/* `llmopt probe`: measures this machine into a target profile.
 *
 * Every measurement runs once to warm up (and calibrate its length), then `repeats`
 * times; the profile keeps the best, the median and the worst. "All threads" runs use a
 * small persistent pool written here (the same shape the CPU backend's pool will have:
 * workers spin briefly between steps, then sleep on a condition variable), so the
 * dispatch numbers are what one pool step costs. */
#define _GNU_SOURCE
#include "base/clock.h"
#include "target/profile.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define PROBE_X86 1
#endif

static inline void cpu_relax(void) {
#ifdef PROBE_X86
    _mm_pause();
#endif
}

/* ---- A persistent thread pool ------------------------------------------------------------
 * Thread 0 is the caller. A step publishes (fn, ctx), bumps `generation`, wakes sleepers
 * (only when some worker went to sleep), runs its own share and spins until `pending`
 * reaches zero. */

typedef void (*pool_fn)(void *ctx, int ith, int nth);

struct probe_pool {
    int n_threads;      /* including the caller */
    _Atomic int spin_iters; /* pause-loop iterations a worker spins before it sleeps */
    pthread_t *workers; /* (n_threads - 1) */
    int n_started;
    pool_fn fn;
    void *ctx;
    _Atomic uint64_t generation;
    _Atomic int pending;  /* workers still running the current step */
    _Atomic int sleepers; /* workers asleep (or about to be) on wake_cond */
    _Atomic bool stop;
    pthread_mutex_t lock;
    pthread_cond_t wake_cond;
};

struct pool_worker_arg {
    struct probe_pool *pool;
    int ith;
};

static void *pool_worker(void *p) {
    struct pool_worker_arg *arg = p;
    struct probe_pool *pool = arg->pool;
    int ith = arg->ith;
    free(arg);
    uint64_t seen = 0;
    for (;;) {
        uint64_t g = atomic_load(&pool->generation);
        int spin = atomic_load_explicit(&pool->spin_iters, memory_order_relaxed);
        for (int i = 0; g == seen && i < spin; i++) {
            cpu_relax();
            g = atomic_load(&pool->generation);
        }
        if (g == seen) {
            pthread_mutex_lock(&pool->lock);
            atomic_fetch_add(&pool->sleepers, 1);
            while ((g = atomic_load(&pool->generation)) == seen && !atomic_load(&pool->stop))
                pthread_cond_wait(&pool->wake_cond, &pool->lock);
            atomic_fetch_sub(&pool->sleepers, 1);
            pthread_mutex_unlock(&pool->lock);
        }
        if (atomic_load(&pool->stop)) break;
        seen = g;
        pool->fn(pool->ctx, ith, pool->n_threads);
        atomic_fetch_sub(&pool->pending, 1);
    }
    return NULL;
}

static void pool_step(struct probe_pool *pool, pool_fn fn, void *ctx) {
    if (pool->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store(&pool->pending, pool->n_threads - 1);
    atomic_fetch_add(&pool->generation, 1);
    /* A worker that saw the old generation either has registered as a sleeper (and is
     * woken here) or will see the new generation under the lock (seq_cst order). */
    if (atomic_load(&pool->sleepers) > 0) {
        pthread_mutex_lock(&pool->lock);
        pthread_cond_broadcast(&pool->wake_cond);
        pthread_mutex_unlock(&pool->lock);
    }
    fn(ctx, 0, pool->n_threads);
    for (int i = 0; atomic_load(&pool->pending) > 0; i++) {
        if (i < 256)
            cpu_relax();
        else
            sched_yield(); /* an oversubscribed machine: let the worker we wait for run */
    }
}

static void pool_destroy(struct probe_pool *pool) {
    if (pool->n_started > 0) {
        pthread_mutex_lock(&pool->lock);
        atomic_store(&pool->stop, true);
        atomic_fetch_add(&pool->generation, 1);
        pthread_cond_broadcast(&pool->wake_cond);
        pthread_mutex_unlock(&pool->lock);
        for (int i = 0; i < pool->n_started; i++) pthread_join(pool->workers[i], NULL);
    }
    free(pool->workers);
    pthread_cond_destroy(&pool->wake_cond);
    pthread_mutex_destroy(&pool->lock);
    memset(pool, 0, sizeof *pool);
}

static enum llmopt_status pool_create(struct probe_pool *pool, int n_threads,
                                      struct llmopt_err *err) {
    memset(pool, 0, sizeof *pool);
    pool->n_threads = n_threads;
    pool->spin_iters = 2000;
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->wake_cond, NULL);
    pool->workers = calloc((size_t)n_threads, sizeof *pool->workers);
    if (!pool->workers) {
        pool_destroy(pool);
        return err_set(err, LLMOPT_ERR_NOMEM, "probe: cannot allocate %d threads", n_threads);
    }
    for (int i = 1; i < n_threads; i++) {
        struct pool_worker_arg *arg = malloc(sizeof *arg);
        if (!arg) {
            pool_destroy(pool);
            return err_set(err, LLMOPT_ERR_NOMEM, "probe: cannot allocate thread %d", i);
        }
        *arg = (struct pool_worker_arg){pool, i};
        int rc = pthread_create(&pool->workers[i - 1], NULL, pool_worker, arg);
        if (rc) {
            free(arg);
            pool_destroy(pool);
            return err_set(err, LLMOPT_ERR_NOMEM, "probe: pthread_create for thread %d of %d: %s",
                           i, n_threads, strerror(rc));
        }
        pool->n_started++;
    }
    return LLMOPT_OK;
}

/* Until every worker sleeps (bounded: a busy machine may keep one off its CPU). */
static void pool_wait_all_asleep(struct probe_pool *pool) {
    double deadline = clock_now_s() + 0.05;
    while (atomic_load(&pool->sleepers) < pool->n_threads - 1 && clock_now_s() < deadline) sched_yield();
}

/* ---- Repeats and statistics ------------------------------------------------------------- */

struct probe_settings {
    int repeats;
    double compute_rep_s;    /* target length of one compute repeat */
    int bandwidth_passes;    /* buffer passes per bandwidth repeat */
    int dispatch_spin_steps; /* steps per dispatch repeat */
    int dispatch_wake_steps;
};

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* To the 6 significant digits the JSON keeps, so a profile read back equals the one
 * measured (and prints the same table). */
static double round_6_digits(double v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%.6g", v);
    return strtod(buf, NULL);
}

/* Fills best/median/worst from `n` values of metric `m`. */
static void summarize(struct target_measurement *out, enum target_metric m, double *values, int n,
                      int threads, const char *kernel) {
    for (int i = 0; i < n; i++) values[i] = round_6_digits(values[i]);
    qsort(values, (size_t)n, sizeof *values, cmp_double);
    bool low = target_metric_lower_is_better(m);
    out->best = low ? values[0] : values[n - 1];
    out->worst = low ? values[n - 1] : values[0];
    out->median = n % 2 ? values[n / 2] : round_6_digits(0.5 * (values[n / 2 - 1] + values[n / 2]));
    out->repeats = n;
    out->threads = threads;
    snprintf(out->kernel, sizeof out->kernel, "%s", kernel);
}

#define PROBE_MAX_REPEATS 16

/* ---- Dispatch overhead ----------------------------------------------------------------- */

static void empty_step(void *ctx, int ith, int nth) {
    (void)ctx;
    (void)ith;
    (void)nth;
}

static void measure_dispatch(struct probe_pool *pool, const struct probe_settings *s,
                             struct target_profile *p) {
    double v[PROBE_MAX_REPEATS];
    /* Back-to-back steps: workers never get to sleep. */
    pool->spin_iters = 2000;
    for (int r = -1; r < s->repeats; r++) {
        int steps = s->dispatch_spin_steps;
        double t0 = clock_now_s();
        for (int i = 0; i < steps; i++) pool_step(pool, empty_step, NULL);
        double ns = (clock_now_s() - t0) * 1e9 / steps;
        if (r >= 0) v[r] = ns;
    }
    summarize(&p->m[TARGET_DISPATCH_SPIN], TARGET_DISPATCH_SPIN, v, s->repeats, pool->n_threads,
              "pool_spin");

    /* Workers asleep at every step start: the cost of waking them through the kernel. */
    pool->spin_iters = 0;
    for (int r = -1; r < s->repeats; r++) {
        int steps = s->dispatch_wake_steps;
        double total = 0;
        for (int i = 0; i < steps; i++) {
            pool_wait_all_asleep(pool);
            double t0 = clock_now_s();
            pool_step(pool, empty_step, NULL);
            total += clock_now_s() - t0;
        }
        if (r >= 0) v[r] = total * 1e9 / steps;
    }
    summarize(&p->m[TARGET_DISPATCH_WAKE], TARGET_DISPATCH_WAKE, v, s->repeats, pool->n_threads,
              "pool_wake");
    pool->spin_iters = 2000;
}

/* ---- Memory read bandwidth --------------------------------------------------------------- */

/* Plain C: what a simple loop gets from the compiler's baseline flags. */
static uint64_t read_sum_c(const uint64_t *p, size_t n_bytes) {
    uint64_t sum = 0;
    size_t n = n_bytes / sizeof *p;
    for (size_t i = 0; i < n; i++) sum += p[i];
    return sum;
}

#ifdef PROBE_X86
/* n_bytes is a multiple of 256 (slices are cut that way). */
static uint64_t read_sum_sse2(const uint64_t *p, size_t n_bytes) {
    const __m128i *v = (const __m128i *)p;
    __m128i a0 = _mm_setzero_si128(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < n_bytes / 16; i += 4) {
        a0 = _mm_add_epi64(a0, _mm_load_si128(v + i));
        a1 = _mm_add_epi64(a1, _mm_load_si128(v + i + 1));
        a2 = _mm_add_epi64(a2, _mm_load_si128(v + i + 2));
        a3 = _mm_add_epi64(a3, _mm_load_si128(v + i + 3));
    }
    __m128i s = _mm_add_epi64(_mm_add_epi64(a0, a1), _mm_add_epi64(a2, a3));
    return (uint64_t)_mm_cvtsi128_si64(s) + (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(s, s));
}

__attribute__((target("avx2"))) static uint64_t read_sum_avx2(const uint64_t *p, size_t n_bytes) {
    const __m256i *v = (const __m256i *)p;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < n_bytes / 32; i += 4) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256(v + i));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256(v + i + 1));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256(v + i + 2));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256(v + i + 3));
    }
    __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, s);
    return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

__attribute__((target("avx512f"))) static uint64_t read_sum_avx512(const uint64_t *p,
                                                                   size_t n_bytes) {
    const __m512i *v = (const __m512i *)p;
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < n_bytes / 64; i += 4) {
        a0 = _mm512_add_epi64(a0, _mm512_load_si512(v + i));
        a1 = _mm512_add_epi64(a1, _mm512_load_si512(v + i + 1));
        a2 = _mm512_add_epi64(a2, _mm512_load_si512(v + i + 2));
        a3 = _mm512_add_epi64(a3, _mm512_load_si512(v + i + 3));
    }
    /* not _mm512_reduce_add_epi64: it adds as signed, which UBSan flags on wrap-around */
    uint64_t lanes[8], sum = 0;
    _mm512_storeu_si512(lanes,
                        _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
    for (int i = 0; i < 8; i++) sum += lanes[i];
    return sum;
}
#endif

typedef uint64_t (*read_fn)(const uint64_t *p, size_t n_bytes);

struct read_job {
    const uint8_t *buf;
    size_t bytes; /* multiple of 256 */
    int passes;
    read_fn fn;
    uint64_t sink[64 * 8]; /* per thread, a cache line apart; up to 64 threads */
    int write;             /* first touch instead of a read */
};

/* Thread ith's slice: 256-byte aligned cuts, the last thread takes the rest. */
static void slice_of(size_t bytes, int ith, int nth, size_t *off, size_t *len) {
    size_t per = bytes / (size_t)nth / 256 * 256;
    *off = per * (size_t)ith;
    *len = ith == nth - 1 ? bytes - *off : per;
}

static void read_step(void *ctx, int ith, int nth) {
    struct read_job *job = ctx;
    size_t off, len;
    slice_of(job->bytes, ith, nth, &off, &len);
    if (job->write) {
        memset((uint8_t *)job->buf + off, 1 + ith % 255, len);
        return;
    }
    uint64_t s = 0;
    for (int k = 0; k < job->passes; k++) s += job->fn((const uint64_t *)(job->buf + off), len);
    job->sink[(ith % 64) * 8] += s;
}

/* Twice the last-level cache and at least 512 MiB, at most a quarter of RAM; a
 * multiple of 4 MiB. */
static size_t bandwidth_buffer_bytes(const struct cpu_features *cpu) {
    const size_t mib = 1 << 20;
    size_t bytes = 512 * mib;
    int64_t llc = cpu_features_llc_bytes(cpu);
    if (llc > 0 && (size_t)llc * 2 > bytes) bytes = (size_t)llc * 2;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0 && (size_t)pages / 4 * (size_t)page < bytes)
        bytes = (size_t)pages / 4 * (size_t)page;
    bytes = (bytes + 4 * mib - 1) / (4 * mib) * (4 * mib);
    return bytes < 4 * mib ? 4 * mib : bytes;
}

static void measure_read(struct probe_pool *pool, struct read_job *job,
                         const struct probe_settings *s, struct target_profile *p,
                         enum target_metric metric, bool all_threads, const char *kernel) {
    double v[PROBE_MAX_REPEATS];
    for (int r = -1; r < s->repeats; r++) {
        double t0 = clock_now_s();
        if (all_threads)
            pool_step(pool, read_step, job);
        else
            read_step(job, 0, 1);
        double t = clock_now_s() - t0;
        if (r >= 0) v[r] = (double)job->bytes * job->passes / t * 1e-9;
    }
    summarize(&p->m[metric], metric, v, s->repeats, all_threads ? pool->n_threads : 1, kernel);
}

static enum llmopt_status measure_bandwidth(struct probe_pool *pool, const struct probe_settings *s,
                                            const struct target_probe_opts *opts,
                                            const struct cpu_features *isa,
                                            struct target_profile *p, struct llmopt_err *err) {
    size_t bytes = bandwidth_buffer_bytes(&p->cpu);
    p->bandwidth_buffer_bytes = (int64_t)bytes;
    uint8_t *buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED)
        return err_set(err, LLMOPT_ERR_NOMEM, "probe: cannot map a %zu MiB bandwidth buffer",
                       bytes >> 20);
    struct read_job *job = calloc(1, sizeof *job);
    if (!job) {
        munmap(buf, bytes);
        return err_set(err, LLMOPT_ERR_NOMEM, "probe: out of memory");
    }
    *job = (struct read_job){.buf = buf, .bytes = bytes, .passes = s->bandwidth_passes, .write = 1};
    /* First touch by the thread that later reads the slice (NUMA placement). */
    pool_step(pool, read_step, job);
    job->write = 0;

    const char *simd_kernel = "c";
    read_fn simd = read_sum_c;
#ifdef PROBE_X86
    simd_kernel = "sse2", simd = read_sum_sse2;
    if (isa->has[CPU_AVX2]) simd_kernel = "avx2", simd = read_sum_avx2;
    if (isa->has[CPU_AVX512F]) simd_kernel = "avx512", simd = read_sum_avx512;
#endif
    if (opts->progress)
        fprintf(opts->progress, "llmopt: probe: read bandwidth over %zu MiB (c, %s)\n", bytes >> 20,
                simd_kernel);
    job->fn = read_sum_c;
    measure_read(pool, job, s, p, TARGET_READ_BW_PLAIN_1T, false, "c");
    measure_read(pool, job, s, p, TARGET_READ_BW_PLAIN_ALL, true, "c");
    job->fn = simd;
    measure_read(pool, job, s, p, TARGET_READ_BW_SIMD_1T, false, simd_kernel);
    measure_read(pool, job, s, p, TARGET_READ_BW_SIMD_ALL, true, simd_kernel);
    free(job);
    munmap(buf, bytes);
    return LLMOPT_OK;
}

/* ---- Peak arithmetic ----------------------------------------------------------------------
 * A compute kernel runs `iters` iterations and returns the operations it did (FLOPs or
 * int8 ops, a multiply-accumulate counting 2), storing a result into *sink so nothing
 * is optimized away. */

typedef double (*compute_fn)(int64_t iters, const void *data, float *sink);

/* f32 FMA: independent accumulator chains, enough of them to cover the FMA latency on
 * every port (latency 4 x 2 ports = 8 in flight; 12-16 leaves margin). */
static double fma_c(int64_t iters, const void *data, float *sink) {
    const float *in = data;
    float x = in[0], y = in[1];
    float a0 = in[2], a1 = a0 + 1, a2 = a0 + 2, a3 = a0 + 3, a4 = a0 + 4, a5 = a0 + 5, a6 = a0 + 6,
          a7 = a0 + 7;
    for (int64_t i = 0; i < iters; i++) {
        a0 = a0 * x + y, a1 = a1 * x + y, a2 = a2 * x + y, a3 = a3 * x + y;
        a4 = a4 * x + y, a5 = a5 * x + y, a6 = a6 * x + y, a7 = a7 * x + y;
    }
    *sink = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
    return (double)iters * 8 * 2;
}

#define REP8(X)  X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define REP12(X) REP8(X) X(8) X(9) X(10) X(11)
#define REP16(X) REP12(X) X(12) X(13) X(14) X(15)

#ifdef PROBE_X86
/* Named accumulators rather than an array: they must live in registers at any -O. */
__attribute__((target("avx2,fma"))) static double fma_avx2(int64_t iters, const void *data,
                                                           float *sink) {
    const float *in = data;
    __m256 x = _mm256_set1_ps(in[0]), y = _mm256_set1_ps(in[1]), s = _mm256_setzero_ps();
#define DECL(j) __m256 a##j = _mm256_set1_ps(in[2] + (float)j);
#define STEP(j) a##j = _mm256_fmadd_ps(a##j, x, y);
#define SUM(j)  s = _mm256_add_ps(s, a##j);
    REP12(DECL)
    for (int64_t i = 0; i < iters; i++) {
        REP12(STEP)
    }
    REP12(SUM)
#undef DECL
#undef STEP
#undef SUM
    float lanes[8];
    _mm256_storeu_ps(lanes, s);
    *sink = lanes[0] + lanes[7];
    return (double)iters * 12 * 8 * 2;
}

__attribute__((target("avx512f"))) static double fma_avx512(int64_t iters, const void *data,
                                                            float *sink) {
    const float *in = data;
    __m512 x = _mm512_set1_ps(in[0]), y = _mm512_set1_ps(in[1]), s = _mm512_setzero_ps();
#define DECL(j) __m512 a##j = _mm512_set1_ps(in[2] + (float)j);
#define STEP(j) a##j = _mm512_fmadd_ps(a##j, x, y);
#define SUM(j)  s = _mm512_add_ps(s, a##j);
    REP16(DECL)
    for (int64_t i = 0; i < iters; i++) {
        REP16(STEP)
    }
    REP16(SUM)
#undef DECL
#undef STEP
#undef SUM
    *sink = _mm512_reduce_add_ps(s);
    return (double)iters * 16 * 16 * 2;
}
#endif

/* int8 dot: u8 activations x s8 weights summed into i32, the inner step of a quantized
 * matmul. The u8 operand streams from an L1-resident block (as a GEMM micro-kernel's
 * weights would), so no product can be hoisted out of the loop; the s8 operand stays in
 * a register. Ops = 2 per byte of the block per iteration. */
#define INT8_BLOCK_BYTES 3072
_Static_assert(INT8_BLOCK_BYTES % (12 * 64) == 0, "the block must be 12 whole vectors per step");

static double int8_c(int64_t iters, const void *data, float *sink) {
    const uint8_t *a = data;
    const int8_t *w = (const int8_t *)data + INT8_BLOCK_BYTES;
    uint32_t acc = 0; /* unsigned: wraps instead of overflowing */
    for (int64_t it = 0; it < iters; it++) {
        __asm__ volatile("" : "+r"(a)); /* the block may have changed: reload it */
        for (int i = 0; i < INT8_BLOCK_BYTES; i++)
            acc += (uint32_t)((int32_t)a[i] * (int32_t)w[i & 63]);
    }
    *sink = (float)acc;
    return (double)iters * INT8_BLOCK_BYTES * 2;
}

#ifdef PROBE_X86
/* One kernel body per vector width; STEP12 does 12 vectors of the block into the
 * accumulators. VNNI's vpdpbusd chains through its accumulator (latency ~5), so it needs
 * 12 of them; the vpmaddubsw path chains only through a 1-cycle vpaddd, and 4 keep its
 * register pressure inside 16 ymm registers. */
#define INT8_KERNEL(name, target_isa, vec_t, load, store, ZERO, STEP12, OP, ADD, VBYTES)           \
    __attribute__((target(target_isa))) static double name(int64_t iters, const void *data,        \
                                                           float *sink) {                          \
        const vec_t *a = data;                                                                     \
        vec_t w = load((const vec_t *)((const uint8_t *)data + INT8_BLOCK_BYTES));                 \
        vec_t acc0 = ZERO, acc1 = ZERO, acc2 = ZERO, acc3 = ZERO, acc4 = ZERO, acc5 = ZERO,        \
              acc6 = ZERO, acc7 = ZERO, acc8 = ZERO, acc9 = ZERO, acc10 = ZERO, acc11 = ZERO;      \
        for (int64_t it = 0; it < iters; it++) {                                                   \
            __asm__ volatile("" : "+r"(a)); /* the block may have changed: reload it */            \
            for (int k = 0; k < INT8_BLOCK_BYTES / VBYTES; k += 12) {                              \
                STEP12(OP, a + k)                                                                  \
            }                                                                                      \
        }                                                                                          \
        acc0 = ADD(ADD(ADD(acc0, acc1), ADD(acc2, acc3)), ADD(ADD(acc4, acc5), ADD(acc6, acc7)));  \
        acc0 = ADD(acc0, ADD(ADD(acc8, acc9), ADD(acc10, acc11)));                                 \
        int32_t lanes[VBYTES / 4];                                                                 \
        store((vec_t *)lanes, acc0);                                                               \
        *sink = (float)lanes[0];                                                                   \
        return (double)iters * INT8_BLOCK_BYTES * 2;                                               \
    }

/* vpdpbusd through inline asm: GCC 12 wraps the intrinsic's accumulator in register
 * copies and stack spills that halve the measured rate. AT&T order: w, a, acc. */
#define VNNI_YMM(acc, p) __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(*(p)), "x"(w));
#define VNNI_ZMM(acc, p) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(*(p)), "v"(w));
#define STEP12_VNNI(VNNI, p)                                                                       \
    VNNI(acc0, p + 0)                                                                              \
    VNNI(acc1, p + 1)                                                                              \
    VNNI(acc2, p + 2) VNNI(acc3, p + 3) VNNI(acc4, p + 4) VNNI(acc5, p + 5) VNNI(acc6, p + 6)      \
        VNNI(acc7, p + 7) VNNI(acc8, p + 8) VNNI(acc9, p + 9) VNNI(acc10, p + 10)                  \
            VNNI(acc11, p + 11)

/* Without VNNI: u8*s8 pairs to saturating i16 (vpmaddubsw), pairs of i16 to i32 (vpmaddwd
 * with ones), accumulate (vpaddd). */
#define MADD_YMM(acc, p)                                                                           \
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_load_si256(p), w),   \
                                                  _mm256_set1_epi16(1)));
#define MADD_ZMM(acc, p)                                                                           \
    acc = _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_load_si512(p), w),   \
                                                  _mm512_set1_epi16(1)));
#define STEP12_MADD(MADD, p)                                                                       \
    MADD(acc0, p + 0)                                                                              \
    MADD(acc1, p + 1)                                                                              \
    MADD(acc2, p + 2) MADD(acc3, p + 3) MADD(acc0, p + 4) MADD(acc1, p + 5) MADD(acc2, p + 6)      \
        MADD(acc3, p + 7) MADD(acc0, p + 8) MADD(acc1, p + 9) MADD(acc2, p + 10)                   \
            MADD(acc3, p + 11)

INT8_KERNEL(int8_avx2, "avx2", __m256i, _mm256_load_si256, _mm256_storeu_si256,
            _mm256_setzero_si256(), STEP12_MADD, MADD_YMM, _mm256_add_epi32, 32)
INT8_KERNEL(int8_avx512bw, "avx512f,avx512bw", __m512i, _mm512_load_si512, _mm512_storeu_si512,
            _mm512_setzero_si512(), STEP12_MADD, MADD_ZMM, _mm512_add_epi32, 64)
INT8_KERNEL(int8_avx_vnni, "avx2,avxvnni", __m256i, _mm256_load_si256, _mm256_storeu_si256,
            _mm256_setzero_si256(), STEP12_VNNI, VNNI_YMM, _mm256_add_epi32, 32)
INT8_KERNEL(int8_avx512_vnni, "avx512f,avx512vnni", __m512i, _mm512_load_si512, _mm512_storeu_si512,
            _mm512_setzero_si512(), STEP12_VNNI, VNNI_ZMM, _mm512_add_epi32, 64)
#endif

struct compute_job {
    compute_fn fn;
    int64_t iters;
    const void *data;
    float sink[64 * 16]; /* per thread, a cache line apart */
    double ops[64 * 8];
};

static void compute_step(void *ctx, int ith, int nth) {
    (void)nth;
    struct compute_job *job = ctx;
    float sink;
    double ops = job->fn(job->iters, job->data, &sink);
    if (ith < 64) job->sink[ith * 16] = sink, job->ops[ith * 8] = ops;
}

static void measure_compute(struct probe_pool *pool, const struct probe_settings *s,
                            struct target_profile *p, compute_fn fn, const void *data,
                            const char *kernel, enum target_metric metric_1t,
                            enum target_metric metric_all) {
    struct compute_job job = {.fn = fn, .iters = 1024, .data = data};
    /* Warm-up and calibration on one thread: grow until a run takes >= 1/8 of a repeat. */
    double t;
    for (;;) {
        double t0 = clock_now_s();
        compute_step(&job, 0, 1);
        t = clock_now_s() - t0;
        if (t >= s->compute_rep_s / 8 || job.iters > ((int64_t)1 << 40)) break;
        job.iters *= 2;
    }
    double scale = s->compute_rep_s / (t > 1e-9 ? t : 1e-9);
    if (scale > 1) job.iters = (int64_t)((double)job.iters * scale);

    double v[PROBE_MAX_REPEATS];
    for (int r = -1; r < s->repeats; r++) {
        double t0 = clock_now_s();
        compute_step(&job, 0, 1);
        double rate = job.ops[0] / (clock_now_s() - t0) * 1e-9;
        if (r >= 0) v[r] = rate;
    }
    summarize(&p->m[metric_1t], metric_1t, v, s->repeats, 1, kernel);

    for (int r = -1; r < s->repeats; r++) {
        double t0 = clock_now_s();
        pool_step(pool, compute_step, &job);
        double elapsed = clock_now_s() - t0;
        double ops = 0;
        for (int i = 0; i < pool->n_threads; i++)
            ops += i < 64 ? job.ops[i * 8] : job.ops[0]; /* every thread does the same work */
        if (r >= 0) v[r] = ops / elapsed * 1e-9;
    }
    summarize(&p->m[metric_all], metric_all, v, s->repeats, pool->n_threads, kernel);
}

static void measure_arithmetic(struct probe_pool *pool, const struct probe_settings *s,
                               const struct target_probe_opts *opts, const struct cpu_features *isa,
                               struct target_profile *p) {
    /* operands: x, y, a0 for FMA; a u8 block then s8 weights for int8 (64-byte aligned) */
    _Alignas(64) uint8_t int8_data[INT8_BLOCK_BYTES + 64];
    for (size_t i = 0; i < sizeof int8_data; i++) int8_data[i] = (uint8_t)(i * 37 + 11);
    static const float fma_data[3] = {0.999f, 0.001f, 0.5f};

    compute_fn fma = fma_c, dot = int8_c;
    const char *fma_kernel = "c", *dot_kernel = "c";
#ifdef PROBE_X86
    const bool *has = isa->has; /* ascending preference: the last that applies wins */
    if (has[CPU_AVX2] && has[CPU_FMA]) fma = fma_avx2, fma_kernel = "avx2";
    if (has[CPU_AVX512F]) fma = fma_avx512, fma_kernel = "avx512";
    if (has[CPU_AVX2]) dot = int8_avx2, dot_kernel = "avx2";
    if (has[CPU_AVX512F] && has[CPU_AVX512BW]) dot = int8_avx512bw, dot_kernel = "avx512bw";
    if (has[CPU_AVX2] && has[CPU_AVX_VNNI]) dot = int8_avx_vnni, dot_kernel = "avx_vnni";
    if (has[CPU_AVX512F] && has[CPU_AVX512BW] && has[CPU_AVX512_VNNI])
        dot = int8_avx512_vnni, dot_kernel = "avx512_vnni";
#endif
    if (opts->progress)
        fprintf(opts->progress, "llmopt: probe: f32 FMA (%s), int8 dot (%s)\n", fma_kernel,
                dot_kernel);
    measure_compute(pool, s, p, fma, fma_data, fma_kernel, TARGET_F32_FMA_1T, TARGET_F32_FMA_ALL);
    measure_compute(pool, s, p, dot, int8_data, dot_kernel, TARGET_INT8_DOT_1T,
                    TARGET_INT8_DOT_ALL);
}

/* ---- The probe ---------------------------------------------------------------------------- */

enum llmopt_status target_probe(const struct target_probe_opts *opts, struct target_profile *out,
                                struct llmopt_err *err) {
    memset(out, 0, sizeof *out);
    const struct cpu_features *cpu = cpu_features_get();
    int threads = opts->threads > 0 ? opts->threads : cpu->usable_cpus;
    if (threads < 1 || threads > 4096)
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "probe: threads must be 1..4096, got %d",
                       threads);
    const struct probe_settings settings =
        opts->quick ? (struct probe_settings){.repeats = 3,
                                              .compute_rep_s = 0.02,
                                              .bandwidth_passes = 1,
                                              .dispatch_spin_steps = 2000,
                                              .dispatch_wake_steps = 100}
                    : (struct probe_settings){.repeats = 5,
                                              .compute_rep_s = 0.15,
                                              .bandwidth_passes = 2,
                                              .dispatch_spin_steps = 20000,
                                              .dispatch_wake_steps = 500};

    out->version = TARGET_PROFILE_VERSION;
    out->cpu = *cpu;
    out->threads = threads;
    out->quick = opts->quick;
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out->created_utc, sizeof out->created_utc, "%Y-%m-%dT%H:%M:%SZ", &tm);
    struct utsname u;
    if (uname(&u) == 0)
        snprintf(out->os, sizeof out->os, "%.40s %.60s %.20s", u.sysname, u.release, u.machine);
    else
        snprintf(out->os, sizeof out->os, "unknown");

    struct probe_pool pool;
    enum llmopt_status st = pool_create(&pool, threads, err);
    if (st) return st;
    if (opts->progress)
        fprintf(opts->progress, "llmopt: probe: dispatch overhead (%d threads)\n", threads);
    measure_dispatch(&pool, &settings, out);
    /* Kernels use what this machine has, further limited by opts->isa. */
    struct cpu_features isa = *cpu;
    for (int f = 0; f < CPU_FEATURE_COUNT; f++)
        isa.has[f] = cpu->has[f] && (!opts->isa || opts->isa->has[f]);
    st = measure_bandwidth(&pool, &settings, opts, &isa, out, err);
    if (st == LLMOPT_OK) measure_arithmetic(&pool, &settings, opts, &isa, out);
    pool_destroy(&pool);
    if (st) memset(out, 0, sizeof *out);
    return st;
}
