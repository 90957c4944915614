/* Pattern-matching helpers shared by the passes. */
#include "passes/passes.h"

#include <string.h>

bool match_op(const struct ir_graph *g, int32_t idx, enum ir_op op) {
    return idx >= 0 && idx < g->n_nodes && g->nodes[idx].op == op;
}

bool match_const(const struct ir_graph *g, int32_t idx, double *value) {
    if (!match_op(g, idx, IR_OP_CONST)) return false;
    *value = g->nodes[idx].attrs.value;
    return true;
}

bool match_commuted(const struct ir_graph *g, int32_t idx, enum ir_op op, int32_t *a, int32_t *b) {
    const struct ir_node *n = &g->nodes[idx];
    if (n->n_in != 2) return false;
    for (int k = 0; k < 2; k++)
        if (match_op(g, n->in[k], op)) {
            *a = n->in[k];
            *b = n->in[1 - k];
            return true;
        }
    return false;
}

enum llmopt_status rewrite_node(struct ir_graph *g, int32_t idx, enum ir_op op,
                                const int32_t *in, int n_in, const struct ir_attrs *attrs,
                                struct llmopt_err *err) {
    struct ir_node *n = &g->nodes[idx];
    struct ir_shape before = n->shape;
    enum ir_dtype dtype_before = n->dtype;
    enum llmopt_status st = ir_set_operands(g, idx, in, n_in, err);
    if (st) return st;
    n->op = op;
    memset(&n->attrs, 0, sizeof n->attrs);
    if (attrs) n->attrs = *attrs;
    if ((st = ir_infer_node(g, idx, err))) return st;
    if (!ir_shape_eq(&before, &n->shape) || n->dtype != dtype_before)
        return err_set(err, LLMOPT_ERR_FORMAT, "pass: rewriting node %d into %s changed its shape", idx,
                       ir_op_name(op));
    return LLMOPT_OK;
}
