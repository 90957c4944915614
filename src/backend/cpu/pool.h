/* A persistent thread pool for CPU kernels (ggml-style (ith, nth) work splitting).
 *
 * pool_run(pool, fn, ctx) calls fn(ctx, ith, nth) once on each of the pool's nth
 * threads, the caller being thread 0, and returns when all calls have returned.
 * Workers wait for the next run by spinning briefly and then sleeping on a futex, so
 * back-to-back runs inside a forward cost a cache-line handoff rather than a syscall.
 * A run allocates nothing. One caller at a time per pool. */
#ifndef LLMOPT_BACKEND_CPU_POOL_H
#define LLMOPT_BACKEND_CPU_POOL_H

#include "base/status.h"

#include <stdint.h>

struct cpu_pool;

typedef void (*pool_fn)(void *ctx, int ith, int nth);

/* n_threads <= 0: the CPUs this process may run on. Capped at POOL_MAX_THREADS. */
#define POOL_MAX_THREADS 256
enum llmopt_status pool_create(int n_threads, struct cpu_pool **out, struct llmopt_err *err);
void pool_free(struct cpu_pool *pool);
int pool_threads(const struct cpu_pool *pool);

/* Runs fn on every thread of the pool (a NULL pool runs fn(ctx, 0, 1) here). */
void pool_run(struct cpu_pool *pool, pool_fn fn, void *ctx);

/* Like pool_run for an fn whose threads take their work from a shared counter (never
 * by ith alone) and never call pool_barrier: a worker that has not started when the
 * caller's own call returns is skipped, so one the OS keeps off a CPU does not hold
 * up the run. fn is called with nth = the pool's threads on whichever threads run. */
void pool_run_shared(struct cpu_pool *pool, pool_fn fn, void *ctx);

/* Waits until every thread of the current run has reached this barrier; called by all
 * nth threads from inside fn of a pool_run (a no-op for a NULL pool or nth == 1).
 * Memory written before the barrier is visible to every thread after it. */
void pool_barrier(struct cpu_pool *pool);

/* [*begin, *end) of n items for thread ith of nth, in contiguous chunks whose
 * boundaries are multiples of `align` (the last chunk takes the remainder). */
static inline void pool_split(int64_t n, int64_t align, int ith, int nth, int64_t *begin,
                              int64_t *end) {
    int64_t units = (n + align - 1) / align;
    int64_t b = units * ith / nth * align, e = units * (ith + 1) / nth * align;
    *begin = b < n ? b : n;
    *end = e < n ? e : n;
}

#endif
