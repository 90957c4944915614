/* Linear epilogues: y = act(x W^T + bias) * gate + residual in one kernel.
 *   act(linear)                     -> linear{act}       (silu, gelu, gelu_tanh, relu, sigmoid, tanh)
 *   linear{act} * z                 -> linear{act, gate: z}   (SwiGLU / GeGLU)
 *   linear + b  (b: [O])            -> linear{bias: b}
 *   h + linear  (h: the output's shape) -> linear{residual: h}
 * The absorbed linear must have no other user, and the epilogue stages apply in that
 * order only (an activation after a residual is not an epilogue). */
#include "passes/passes.h"

static bool is_epilogue_act(enum ir_op op) {
    return op == IR_OP_SILU || op == IR_OP_GELU || op == IR_OP_GELU_TANH || op == IR_OP_RELU ||
           op == IR_OP_SIGMOID || op == IR_OP_TANH;
}

/* Appends one epilogue operand to linear node lin, producing node idx. */
static enum llmopt_status absorb(struct ir_graph *g, int32_t idx, int32_t lin, uint32_t flag,
                                 enum ir_op act, int32_t extra, struct llmopt_err *err) {
    const struct ir_node *l = &g->nodes[lin];
    struct ir_attrs at = l->attrs;
    int32_t in[8];
    int n = 0;
    for (int k = 0; k < l->n_in; k++) in[n++] = l->in[k];
    if (flag) {
        /* keep the operand order bias, gate, residual */
        int pos = 2 + !!(at.linear_flags & IR_LINEAR_BIAS) * (flag != IR_LINEAR_BIAS) +
                  !!(at.linear_flags & IR_LINEAR_GATE) * (flag == IR_LINEAR_RESIDUAL);
        for (int k = n; k > pos; k--) in[k] = in[k - 1];
        in[pos] = extra;
        n++;
        at.linear_flags |= flag;
    }
    if (act != IR_OP_INPUT) at.linear_act = act;
    return rewrite_node(g, idx, IR_OP_LINEAR, in, n, &at, err);
}

int32_t pass_fuse_linear(struct ir_graph *g, struct llmopt_err *err) {
    int32_t fused = 0;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const struct ir_node *n = &g->nodes[i];
        enum llmopt_status st = LLMOPT_OK;
        bool done = false;
        if (is_epilogue_act(n->op) && match_op(g, n->in[0], IR_OP_LINEAR)) {
            const struct ir_node *l = &g->nodes[n->in[0]];
            if (l->n_uses == 1 && l->attrs.linear_act == IR_OP_INPUT &&
                !(l->attrs.linear_flags & (IR_LINEAR_GATE | IR_LINEAR_RESIDUAL))) {
                st = absorb(g, i, n->in[0], 0, n->op, IR_NONE, err);
                done = true;
            }
        } else if (n->op == IR_OP_MUL || n->op == IR_OP_ADD) {
            for (int k = 0; k < 2 && !done; k++) {
                int32_t lin = n->in[k], other = n->in[1 - k];
                if (!match_op(g, lin, IR_OP_LINEAR) || g->nodes[lin].n_uses != 1) continue;
                const struct ir_node *l = &g->nodes[lin], *o = &g->nodes[other];
                uint32_t fl = l->attrs.linear_flags;
                if (n->op == IR_OP_MUL) {
                    /* a gate multiplies an activated linear (SwiGLU's silu(g) * u) */
                    if (l->attrs.linear_act != IR_OP_INPUT && !(fl & (IR_LINEAR_GATE | IR_LINEAR_RESIDUAL)) &&
                        ir_shape_eq(&o->shape, &l->shape)) {
                        st = absorb(g, i, lin, IR_LINEAR_GATE, IR_OP_INPUT, other, err);
                        done = true;
                    }
                } else if (!(fl & IR_LINEAR_RESIDUAL)) {
                    bool is_bias = o->shape.rank == 1 && ir_dim_eq(o->shape.dims[0], l->shape.dims[l->shape.rank - 1]) &&
                                   !(fl & (IR_LINEAR_BIAS | IR_LINEAR_GATE)) && l->attrs.linear_act == IR_OP_INPUT;
                    if (is_bias) {
                        st = absorb(g, i, lin, IR_LINEAR_BIAS, IR_OP_INPUT, other, err);
                        done = true;
                    } else if (ir_shape_eq(&o->shape, &l->shape)) {
                        st = absorb(g, i, lin, IR_LINEAR_RESIDUAL, IR_OP_INPUT, other, err);
                        done = true;
                    }
                }
            }
        }
        if (st) return -1;
        if (done) {
            fused++;
            ir_count_uses(g); /* the absorbed linear lost its user */
        }
    }
    return fused;
}
