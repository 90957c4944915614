/* Per-op-family profile of a session's forwards (llmopt profile): structural
 * classification of the graph's nodes, per-node wall time from the backend's timing
 * hook, and the bytes each kernel reads at a batch's N, M and positions. */
#ifndef LLMOPT_RUNTIME_OP_PROFILE_H
#define LLMOPT_RUNTIME_OP_PROFILE_H

#include "backend/backend.h"
#include "llmopt.h"

struct op_profile {
    uint8_t *family;       /* (n_nodes) enum llmopt_op_family of each node */
    double *node_seconds;  /* (n_nodes) wall time the backend adds per node */
    struct llmopt_profile totals; /* kernels, bytes, steps, tokens, forward time (no seconds per family) */
};

/* Family of every node of g into family[n_nodes], from the graph's structure only. */
void op_profile_classify(const struct ir_graph *g, uint8_t *family);
enum llmopt_status op_profile_create(const struct ir_graph *g, struct op_profile **out,
                                     struct llmopt_err *err);
void op_profile_free(struct op_profile *p);
/* Adds one forward of batch b over cache kv (its wall time `seconds`): kernels run and
 * bytes read (KV rows at the cache's element type). */
void op_profile_add_forward(struct op_profile *p, const struct ir_graph *g, const struct exec_batch *b,
                            const struct kv_cache *kv, double seconds);
/* Totals with each family's seconds summed from node_seconds. */
void op_profile_read(const struct op_profile *p, const struct ir_graph *g, struct llmopt_profile *out);

#endif
