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

/* The sampler's penalties for one output row (runtime/sampler.h): logit[ids[j]] becomes
 * sampler_penalize(logit, counts[j]) with these parameters; ids distinct. */
struct backend_penalty {
    float repeat, presence, frequency;
    int32_t n;                      /* pairs; 0: none */
    const int32_t *ids, *counts;    /* (n) */
};

/* A row's candidate: logits sanitized (NaN as -inf, +inf as FLT_MAX); id -1: none
 * (the row had fewer entries). */
struct backend_cand {
    int32_t id;
    float logit;
};

/* A row's sampling on the device: its penalties, and for a whole-row draw the
 * sampler's temperature (> 0), min-p and the uniform u in [0, 1) it draws with. */
struct backend_row_sample {
    struct backend_penalty pen;
    float temperature, min_p;
    double u;
};

#define BACKEND_TOP_K_MAX 256   /* = SAMPLER_RANKED_MAX */
#define BACKEND_PENALTY_MAX 512 /* pairs a row run_sample takes */

/* What a forward hands back, one of: the logits (run), each output row's argmax
 * (run_argmax), or after rows' penalties its best k candidates (run_sample, k > 0:
 * cands, with sums: each row's top-p z too) or its whole-row draw (run_sample, k == 0:
 * draws). */
struct backend_out {
    const float **logits;
    int32_t *argmax;
    const struct backend_row_sample *rows;
    int32_t k;
    struct backend_cand *cands;
    double *sums;
    int32_t *draws;
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
    /* Optional (NULL where not offered): runs the batch like run, then, for each output
     * row j, applies rows[j].pen (rows NULL: no penalties; pen.n <=
     * BACKEND_PENALTY_MAX) to the row's logits, and
     * - k in [1, BACKEND_TOP_K_MAX]: hands back its best k entries in rank order
     *   (higher sanitized logit, then lower id), cands[j * k + i]; a sampler with top-k
     *   (runtime/sampler.h, sampler_sample_ranked) needs nothing else;
     *   with sums (rows then required): also sums[j], the row's probabilities
     *   sample_exp((logit - max) / rows[j].temperature) over every finite logit, summed
     *   in sample_exp.h's draw blocks (top-p's z: sampler_sample_nucleus; a greedy
     *   row's, temperature 0, is taken at 1);
     * - k == 0: draws draws[j] from the whole row as sampler_sample does with top-k and
     *   top-p off (sampler_device_full), with rows[j]'s temperature, min-p and u; -1
     *   when no logit is finite.
     * Either way the logits need not leave the device. */
    enum llmopt_status (*run_sample)(void *state, const struct exec_batch *batch, struct kv_cache *kv,
                                     const struct backend_row_sample *rows, int32_t k, struct backend_cand *cands,
                                     double *sums, int32_t *draws, struct llmopt_err *err);
    /* Optional (NULL where run_sample is): after run_sample, copies the step's output rows
     * back as it left them, penalties applied: *logits points at (M, vocab) floats valid
     * until the next run (for a row whose candidates were not enough). */
    enum llmopt_status (*fetch_logits)(void *state, const float **logits, struct llmopt_err *err);
};

/* The CPU backend: fast kernels (SIMD chosen at run time) on a thread pool; with
 * $LLMOPT_CPU_REF=1 at prepare it runs the scalar reference kernels instead. */
extern const struct backend_ops cpu_backend_ops;
/* Always the scalar reference kernels, one thread: the oracle. */
extern const struct backend_ops cpu_ref_backend_ops;

#endif
