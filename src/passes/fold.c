/* Constant folding: a node whose operands are all constants or parameters, and whose
 * result has no N or M dimension, does not change between steps. It is marked
 * constant and computed once when a plan is prepared (e.g. the (1 + w) of a norm, the
 * views of the rotary frequency table), never in a step. Results over FOLD_MAX_ELEMS
 * are left alone so folding never duplicates a large weight. */
#include "passes/passes.h"

#define FOLD_MAX_ELEMS (1 << 20)

int32_t pass_fold(struct ir_graph *g, struct llmopt_err *err) {
    (void)err;
    int32_t marked = 0;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        struct ir_node *n = &g->nodes[i];
        if (n->constant || n->n_in == 0 || n->op == IR_OP_ATTENTION || n->op == IR_OP_INPUT ||
            n->op == IR_OP_PARAM)
            continue;
        bool all_const = true;
        for (int k = 0; k < n->n_in && all_const; k++) {
            const struct ir_node *x = &g->nodes[n->in[k]];
            all_const = x->constant || (x->op == IR_OP_PARAM && x->dtype == IR_DTYPE_F32);
        }
        all_const = all_const && ir_shape_is_static(&n->shape);
        int64_t elems = 1;
        for (int d = 0; d < n->shape.rank && all_const; d++) elems *= n->shape.dims[d].coef;
        /* a fold that only views a parameter gains nothing */
        bool all_params = true;
        for (int k = 0; k < n->n_in; k++) all_params &= g->nodes[n->in[k]].op == IR_OP_PARAM;
        if (!all_const || elems > FOLD_MAX_ELEMS || (n->op == IR_OP_RESHAPE && all_params)) continue;
        n->constant = true;
        marked++;
    }
    return marked;
}
