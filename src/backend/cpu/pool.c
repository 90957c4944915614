/* Thread pool: workers wait on a run counter (`epoch`), run their share, and count
 * down `pending`; the caller runs share 0 and waits for pending to reach 0.
 *
 * Every wait spins for a short while (a forward issues a run every few microseconds,
 * so a sleeping worker would turn each into a syscall) and then sleeps on a futex.
 * Sleepers announce themselves in a counter before sleeping; wakers read it after
 * publishing, so with sequentially consistent atomics either the waker sees the
 * sleeper or the sleeper's futex_wait sees the new value and returns at once. */
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

struct pool_worker {
    struct cpu_pool *pool;
    int ith;
};

struct cpu_pool {
    int n_threads;
    pthread_t *threads;         /* (n_threads - 1) workers; thread 0 is the caller */
    struct pool_worker *workers; /* (n_threads - 1) */
    int n_started;

    /* Written by the caller before an epoch bump, read by workers after it. */
    pool_fn fn;
    void *ctx;
    bool quit;

    _Alignas(64) _Atomic uint32_t epoch;  /* runs started; workers wait for a change */
    _Atomic int32_t epoch_sleepers;
    _Alignas(64) _Atomic uint32_t pending; /* workers still inside the current run */
    _Atomic int32_t pending_sleepers;
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
        if (p->quit) break;
        p->fn(p->ctx, w->ith, p->n_threads);
        if (atomic_fetch_sub(&p->pending, 1) == 1) wake_if_sleeping(&p->pending, &p->pending_sleepers);
    }
    return NULL;
}

int pool_threads(const struct cpu_pool *pool) {
    return pool ? pool->n_threads : 1;
}

void pool_run(struct cpu_pool *p, pool_fn fn, void *ctx) {
    if (!p || p->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->pending, (uint32_t)(p->n_threads - 1));
    atomic_fetch_add(&p->epoch, 1); /* publishes fn/ctx (seq_cst) */
    wake_if_sleeping(&p->epoch, &p->epoch_sleepers);
    fn(ctx, 0, p->n_threads);
    for (;;) {
        uint32_t left = atomic_load(&p->pending);
        if (!left) break;
        wait_while_equal(&p->pending, left, &p->pending_sleepers);
    }
}

void pool_barrier(struct cpu_pool *p) {
    if (!p || p->n_threads == 1) return;
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
    p->quit = true;
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
        p->workers = calloc((size_t)n_threads - 1, sizeof *p->workers);
        if (!p->threads || !p->workers) {
            pool_free(p);
            return err_set(err, LLMOPT_ERR_NOMEM, "thread pool: out of memory");
        }
    }
    for (int i = 0; i < n_threads - 1; i++) {
        p->workers[i] = (struct pool_worker){.pool = p, .ith = i + 1};
        int rc = pthread_create(&p->threads[i], NULL, pool_worker_main, &p->workers[i]);
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
