/* Thread pool: workers wait on a run counter (`epoch`), claim the run, do their
 * share and record the run as finished; the caller does share 0 and then waits for
 * the workers that claimed the run.
 *
 * Every wait spins for a short while (a forward issues a run every few microseconds,
 * so a sleeping worker would turn each into a syscall) and then sleeps on a futex.
 * Sleepers announce themselves in a counter before sleeping; wakers read it after
 * publishing, so with sequentially consistent atomics either the waker sees the
 * sleeper or the sleeper's futex_wait sees the new value and returns at once.
 *
 * Shared runs (pool_run_shared): when the caller is done, it marks every worker that
 * has not claimed the run yet as skipped (a compare-and-swap on the worker's claim
 * word, which the worker's own claim races against), and waits only for the workers
 * that did claim it. On a machine shared with other processes a worker the OS has
 * not scheduled then costs nothing: the threads that run take its work. */
#define _GNU_SOURCE
#include "backend/cpu/pool.h"

#include "base/cpu_features.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Pause iterations before sleeping: a few hundred microseconds on current x86. */
#define POOL_SPIN 4096

/* Claim words: the run's epoch in the low 32 bits, bit 32 set when the worker claimed
 * it, clear when the caller skipped the worker for it. */
#define CLAIM_STARTED(e) ((uint64_t)(e) | (1ull << 32))
#define CLAIM_SKIPPED(e) ((uint64_t)(e))

struct pool_worker {
    struct cpu_pool *pool;
    int ith;
    _Alignas(64) _Atomic uint64_t claim;    /* CLAIM_STARTED / CLAIM_SKIPPED of a run */
    _Atomic uint32_t finished;              /* last run whose share returned */
};

struct cpu_pool {
    int n_threads;
    pthread_t *threads;          /* (n_threads - 1) workers; thread 0 is the caller */
    struct pool_worker *workers; /* (n_threads - 1) */
    int n_started;

    /* Written by the caller before an epoch bump, read by workers after claiming it. */
    pool_fn fn;
    void *ctx;
    bool shared;
    _Atomic bool quit; /* read by workers before they claim a run */

    _Alignas(64) _Atomic uint32_t epoch;  /* runs started; workers wait for a change */
    _Atomic int32_t epoch_sleepers;
    _Alignas(64) _Atomic uint32_t done;   /* shares finished, all runs; the caller waits on it */
    _Atomic int32_t done_sleepers;
    _Alignas(64) _Atomic uint32_t bar_arrived; /* threads at the current barrier */
    _Atomic uint32_t bar_phase;                /* barriers completed */
    _Atomic int32_t bar_sleepers;
};

static void futex_wait(_Atomic uint32_t *addr, uint32_t expected) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *addr) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Waits until *addr != value: spin, then sleep. */
static void wait_while_equal(_Atomic uint32_t *addr, uint32_t value, _Atomic int32_t *sleepers) {
    for (int i = 0; i < POOL_SPIN; i++) {
        if (atomic_load_explicit(addr, memory_order_acquire) != value) return;
        cpu_relax();
    }
    while (atomic_load(addr) == value) {
        atomic_fetch_add(sleepers, 1);
        futex_wait(addr, value);
        atomic_fetch_sub(sleepers, 1);
    }
}

static void wake_if_sleeping(_Atomic uint32_t *addr, _Atomic int32_t *sleepers) {
    if (atomic_load(sleepers) > 0) futex_wake_all(addr);
}

static void *pool_worker_main(void *arg) {
    struct pool_worker *w = arg;
    struct cpu_pool *p = w->pool;
    uint32_t seen = 0;
    for (;;) {
        wait_while_equal(&p->epoch, seen, &p->epoch_sleepers);
        seen = atomic_load(&p->epoch);
        if (atomic_load(&p->quit)) break;
        /* Claim run `seen` unless the caller already skipped this worker for it (a
         * shared run the caller finished alone); only a claimed run's fields are
         * stable, since the caller waits for claimed shares before the next run. */
        uint64_t c = atomic_load(&w->claim);
        if ((int32_t)((uint32_t)c - seen) >= 0) continue; /* skipped for this run or a later one */
        if (!atomic_compare_exchange_strong(&w->claim, &c, CLAIM_STARTED(seen))) continue;
        p->fn(p->ctx, w->ith, p->n_threads);
        atomic_store(&w->finished, seen);
        atomic_fetch_add(&p->done, 1);
        wake_if_sleeping(&p->done, &p->done_sleepers);
    }
    return NULL;
}

int pool_threads(const struct cpu_pool *pool) {
    return pool ? pool->n_threads : 1;
}

static void run(struct cpu_pool *p, pool_fn fn, void *ctx, bool shared) {
    if (!p || p->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->shared = shared;
    uint32_t e = atomic_fetch_add(&p->epoch, 1) + 1; /* publishes the fields (seq_cst) */
    wake_if_sleeping(&p->epoch, &p->epoch_sleepers);
    fn(ctx, 0, p->n_threads);
    for (int i = 0; i < p->n_threads - 1; i++) {
        struct pool_worker *w = &p->workers[i];
        if (shared) {
            uint64_t c = atomic_load(&w->claim);
            if (c != CLAIM_STARTED(e) && atomic_compare_exchange_strong(&w->claim, &c, CLAIM_SKIPPED(e)))
                continue; /* skipped: it will not touch this run */
        }
        for (;;) {
            uint32_t done = atomic_load(&p->done);
            if (atomic_load(&w->finished) == e) break;
            wait_while_equal(&p->done, done, &p->done_sleepers);
        }
    }
}

void pool_run(struct cpu_pool *p, pool_fn fn, void *ctx) {
    run(p, fn, ctx, false);
}

void pool_run_shared(struct cpu_pool *p, pool_fn fn, void *ctx) {
    run(p, fn, ctx, true);
}

void pool_barrier(struct cpu_pool *p) {
    if (!p || p->n_threads == 1) return;
    LLMOPT_ASSERT(!p->shared);
    uint32_t phase = atomic_load(&p->bar_phase);
    if (atomic_fetch_add(&p->bar_arrived, 1) == (uint32_t)p->n_threads - 1) {
        atomic_store(&p->bar_arrived, 0);
        atomic_fetch_add(&p->bar_phase, 1);
        wake_if_sleeping(&p->bar_phase, &p->bar_sleepers);
        return;
    }
    wait_while_equal(&p->bar_phase, phase, &p->bar_sleepers);
}

void pool_free(struct cpu_pool *p) {
    if (!p) return;
    atomic_store(&p->quit, true);
    atomic_fetch_add(&p->epoch, 1);
    futex_wake_all(&p->epoch);
    for (int i = 0; i < p->n_started; i++) pthread_join(p->threads[i], NULL);
    free(p->threads);
    free(p->workers);
    free(p);
}

enum llmopt_status pool_create(int n_threads, struct cpu_pool **out, struct llmopt_err *err) {
    if (n_threads <= 0) n_threads = cpu_features_get()->usable_cpus;
    if (n_threads < 1) n_threads = 1;
    if (n_threads > POOL_MAX_THREADS) n_threads = POOL_MAX_THREADS;
    struct cpu_pool *p = calloc(1, sizeof *p);
    if (!p) return err_set(err, LLMOPT_ERR_NOMEM, "thread pool: out of memory");
    p->n_threads = n_threads;
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        p->workers = aligned_alloc(64, ((size_t)n_threads - 1) * sizeof *p->workers);
        if (!p->threads || !p->workers) {
            pool_free(p);
            return err_set(err, LLMOPT_ERR_NOMEM, "thread pool: out of memory");
        }
    }
    for (int i = 0; i < n_threads - 1; i++) {
        struct pool_worker *w = &p->workers[i];
        w->pool = p;
        w->ith = i + 1;
        atomic_init(&w->claim, CLAIM_STARTED(0));
        atomic_init(&w->finished, 0);
        int rc = pthread_create(&p->threads[i], NULL, pool_worker_main, w);
        if (rc) {
            pool_free(p);
            return err_set(err, LLMOPT_ERR_NOMEM, "thread pool: cannot start thread %d of %d (%s)",
                           i + 1, n_threads, rc == EAGAIN ? "EAGAIN" : "error");
        }
        p->n_started++;
    }
    *out = p;
    return LLMOPT_OK;
}
