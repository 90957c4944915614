/* The backend interface: a small vtable that a compiled graph runs behind. A backend
 * prepares a graph once (plan, arena, constants) and then runs token batches. */
#ifndef LLMOPT_BACKEND_BACKEND_H
#define LLMOPT_BACKEND_BACKEND_H

#include "backend/kv_cache.h"
#include "ir/ir.h"
#include "passes/memplan.h"

/* One token-batch forward (DESIGN decision 1). */
struct exec_batch {
    int32_t n_tokens;          /* N */
    const int32_t *tokens;     /* (N) */
    const int32_t *positions;  /* (N) */
    const int32_t *seq_slots;  /* (N) */
    int32_t n_out;             /* M */
    const int32_t *out_rows;   /* (M) indices into the batch */
};

struct backend_stats {
    uint64_t kernels_run; /* kernels launched (nodes executed, views excluded) */
    uint64_t steps;
    uint64_t packed_bytes; /* weights repacked once at prepare (the CPU GEMM's panels) */
};

struct backend_ops {
    const char *name;
    /* Plans memory for batches of up to n_max tokens over sequences of up to max_ctx
     * positions and allocates everything a step needs; *state is the backend's
     * compiled form of g (g must outlive it). */
    /* plan: a memory plan for g at n_max (e.g. from a Model Program), or NULL to plan
     * here. n_threads: CPU threads the backend may use (0: every CPU available). */
    enum llmopt_status (*prepare)(const struct ir_graph *g, int64_t n_max, int64_t max_ctx,
                                  const struct mem_plan *plan, int32_t n_threads, void **state,
                                  struct llmopt_err *err);
    /* Runs one batch; *logits (logits is never NULL) points at (M, vocab) floats valid
     * until the next run. */
    enum llmopt_status (*run)(void *state, const struct exec_batch *batch, struct kv_cache *kv,
                              const float **logits, struct llmopt_err *err);
    /* Optional (NULL where not offered): runs the batch like run, but hands back only the
     * greedy choice of each output row, ids[j] = argmax of logits row j (NaN counts as
     * -inf, +inf as FLT_MAX, the lowest id wins ties: sampler_greedy's rule), so the
     * logits need not leave the device. */
    enum llmopt_status (*run_argmax)(void *state, const struct exec_batch *batch, struct kv_cache *kv,
                                     int32_t *ids, struct llmopt_err *err);
    void (*stats)(void *state, struct backend_stats *out);
    size_t (*arena_bytes)(void *state);
    void (*release)(void *state);
    /* Optional (NULL: this backend cannot time nodes). With node_seconds, an array of
     * the graph's n_nodes doubles, every later run adds each node's wall time in
     * seconds to its entry; NULL turns timing off, and the run loop then reads no
     * clock (one predictable branch per node). */
    void (*set_node_timing)(void *state, double *node_seconds);
};

/* The CPU backend: fast kernels (SIMD chosen at run time) on a thread pool; with
 * $LLMOPT_CPU_REF=1 at prepare it runs the scalar reference kernels instead. */
extern const struct backend_ops cpu_backend_ops;
/* Always the scalar reference kernels, one thread: the oracle. */
extern const struct backend_ops cpu_ref_backend_ops;

#endif
