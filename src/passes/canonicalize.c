/* Canonicalization: removes identities and folds chains so the fusion patterns see
 * one spelling of each computation.
 *   cast to the same dtype, reshape/expand to the same shape, identity permute, whole
 *   slice, x*1, x/1, x+0, x-0                               -> x
 *   reshape(reshape(x))                                       -> reshape(x)
 *   permute(permute(x))                                       -> permute(x) composed
 *   matmul(a, permute(W)) with W a 2-D parameter, perm [1,0] -> linear(a, W) */
#include "passes/passes.h"

#include <string.h>

static bool is_identity(const struct ir_graph *g, const struct ir_node *n) {
    const struct ir_node *x = n->n_in > 0 ? &g->nodes[n->in[0]] : NULL;
    double c;
    switch (n->op) {
    case IR_OP_CAST: return x->dtype == n->attrs.cast_to;
    case IR_OP_RESHAPE:
    case IR_OP_EXPAND: return ir_shape_eq(&x->shape, &n->shape);
    case IR_OP_PERMUTE:
        for (int i = 0; i < n->attrs.n_axes; i++)
            if (n->attrs.axes[i] != i) return false;
        return true;
    case IR_OP_SLICE: return ir_shape_eq(&x->shape, &n->shape) && n->attrs.start.coef == 0 && n->attrs.step == 1;
    case IR_OP_MUL:
    case IR_OP_DIV:
    case IR_OP_ADD:
    case IR_OP_SUB: {
        double neutral = n->op == IR_OP_MUL || n->op == IR_OP_DIV ? 1.0 : 0.0;
        /* operand 1 neutral (or operand 0 for the commutative ones), shape unchanged */
        if (match_const(g, n->in[1], &c) && c == neutral && ir_shape_eq(&x->shape, &n->shape)) return true;
        return false;
    }
    default: return false;
    }
}

int32_t pass_canonicalize(struct ir_graph *g, struct llmopt_err *err) {
    int32_t changes = 0;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        struct ir_node *n = &g->nodes[i];
        if (n->op == IR_OP_INPUT || n->op == IR_OP_PARAM) continue;
        if (is_identity(g, n) && i != g->output) {
            ir_replace_uses(g, i, n->in[0]);
            changes++;
            continue;
        }
        double c;
        if ((n->op == IR_OP_MUL || n->op == IR_OP_ADD) && match_const(g, n->in[0], &c) &&
            c == (n->op == IR_OP_MUL ? 1.0 : 0.0) && ir_shape_eq(&g->nodes[n->in[1]].shape, &n->shape) &&
            i != g->output) {
            ir_replace_uses(g, i, n->in[1]);
            changes++;
            continue;
        }
        if (n->op == IR_OP_RESHAPE && match_op(g, n->in[0], IR_OP_RESHAPE)) {
            int32_t in[1] = {g->nodes[n->in[0]].in[0]};
            struct ir_attrs at = n->attrs;
            if (rewrite_node(g, i, IR_OP_RESHAPE, in, 1, &at, err)) return -1;
            changes++;
            continue;
        }
        if (n->op == IR_OP_PERMUTE && match_op(g, n->in[0], IR_OP_PERMUTE)) {
            const struct ir_node *inner = &g->nodes[n->in[0]];
            struct ir_attrs at = n->attrs;
            for (int k = 0; k < at.n_axes; k++) at.axes[k] = inner->attrs.axes[n->attrs.axes[k]];
            int32_t in[1] = {inner->in[0]};
            if (rewrite_node(g, i, IR_OP_PERMUTE, in, 1, &at, err)) return -1;
            changes++;
            continue;
        }
        if (n->op == IR_OP_MATMUL && match_op(g, n->in[1], IR_OP_PERMUTE)) {
            const struct ir_node *p = &g->nodes[n->in[1]];
            const struct ir_node *w = &g->nodes[p->in[0]];
            if (p->attrs.n_axes == 2 && p->attrs.axes[0] == 1 && p->attrs.axes[1] == 0 &&
                w->op == IR_OP_PARAM && w->shape.rank == 2) {
                int32_t in[2] = {n->in[0], p->in[0]};
                if (rewrite_node(g, i, IR_OP_LINEAR, in, 2, NULL, err)) return -1;
                changes++;
            }
        }
    }
    ir_count_uses(g);
    return changes;
}
