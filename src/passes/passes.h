/* Graph passes over the IR. Each pass is one file, rewrites the graph in place and
 * leaves dead nodes for pass_dce to remove; passes_run runs the pipeline.
 *
 * Rewrites keep topological order by turning the *last* node of a matched pattern into
 * the fused node (its operands are all defined earlier). Every pass has an on/off
 * parity test (tests/unit/test_passes.c). */
#ifndef LLMOPT_PASSES_PASSES_H
#define LLMOPT_PASSES_PASSES_H

#include "ir/ir.h"

enum pass_id {
    PASS_CANONICALIZE, /* identities, reshape/permute chains, matmul(x, W^T) -> linear */
    PASS_CSE,          /* common subexpressions */
    PASS_FOLD,         /* nodes that depend on no input are computed once at prepare */
    PASS_PRUNE_ROWS,   /* row-wise ops before select_rows(out_rows) compute the output rows only */
    PASS_FUSE_RMS_NORM,
    PASS_FUSE_ROPE,
    PASS_FUSE_LINEAR, /* linear epilogues: activation, gate, bias, residual */
    PASS_DCE,         /* dead code */
    PASS_COUNT
};
extern const char *const pass_names[PASS_COUNT];

struct pass_report {
    int32_t nodes_before, nodes_after;
    int32_t kernels_before, kernels_after; /* kernels a step runs (ir_count_kernels) */
    int32_t rewrites[PASS_COUNT];          /* changes each pass made */
};

/* Runs every pass whose bit is set in `enabled` (bit i = pass i), to a fixed point
 * for the fusions, then DCE and the verifier. */
enum llmopt_status passes_run(struct ir_graph *g, uint32_t enabled, struct pass_report *report,
                              struct llmopt_err *err);
#define PASSES_ALL ((1u << PASS_COUNT) - 1)

/* The passes, each returning the number of rewrites (or -1 with err set). */
int32_t pass_canonicalize(struct ir_graph *g, struct llmopt_err *err);
int32_t pass_cse(struct ir_graph *g, struct llmopt_err *err);
int32_t pass_fold(struct ir_graph *g, struct llmopt_err *err);
int32_t pass_prune_rows(struct ir_graph *g, struct llmopt_err *err);
int32_t pass_fuse_rms_norm(struct ir_graph *g, struct llmopt_err *err);
int32_t pass_fuse_rope(struct ir_graph *g, struct llmopt_err *err);
int32_t pass_fuse_linear(struct ir_graph *g, struct llmopt_err *err);
int32_t pass_dce(struct ir_graph *g, struct llmopt_err *err);

/* Helpers shared by the passes (passes/match.c). */
bool match_const(const struct ir_graph *g, int32_t idx, double *value);
bool match_op(const struct ir_graph *g, int32_t idx, enum ir_op op);
/* For a binary node: puts the operand that is `op` into *a and the other into *b. */
bool match_commuted(const struct ir_graph *g, int32_t idx, enum ir_op op, int32_t *a, int32_t *b);
/* Rewrites node idx in place into op with operands in[], re-infers its shape and checks
 * it is unchanged. */
enum llmopt_status rewrite_node(struct ir_graph *g, int32_t idx, enum ir_op op,
                                const int32_t *in, int n_in, const struct ir_attrs *attrs,
                                struct llmopt_err *err);

#endif
