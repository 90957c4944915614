/* RMSNorm as captured from PyTorch:
 *     r = rsqrt(mean(pow(x, 2), dims=[-1], keepdim) + eps);  y = w * (x * r)
 * (operands of the muls and the add in either order; pow(x, 2) or x * x)
 * becomes rms_norm(x, w; eps): six kernels and two full-size temporaries become one. */
#include "passes/passes.h"

/* x*r where r = rsqrt(mean(x^2) + eps) over the last dim; returns x and eps. */
static bool match_normalized(const struct ir_graph *g, int32_t idx, int32_t *x_out, double *eps) {
    int32_t r, x;
    if (!match_commuted(g, idx, IR_OP_RSQRT, &r, &x)) return false;
    int32_t sum = g->nodes[r].in[0], mean, eps_node;
    if (!match_op(g, sum, IR_OP_ADD)) return false;
    if (!match_commuted(g, sum, IR_OP_MEAN, &mean, &eps_node) || !match_const(g, eps_node, eps)) return false;
    const struct ir_node *mn = &g->nodes[mean];
    const struct ir_node *xn = &g->nodes[x];
    if (mn->attrs.n_axes != 1 || mn->attrs.axes[0] != xn->shape.rank - 1 || !mn->attrs.keepdim) return false;
    int32_t sq = mn->in[0];
    double two;
    const struct ir_node *sqn = &g->nodes[sq];
    bool squares = (sqn->op == IR_OP_POW && sqn->in[0] == x && match_const(g, sqn->in[1], &two) && two == 2.0) ||
                   (sqn->op == IR_OP_MUL && sqn->in[0] == x && sqn->in[1] == x);
    if (!squares) return false;
    *x_out = x;
    return true;
}

int32_t pass_fuse_rms_norm(struct ir_graph *g, struct llmopt_err *err) {
    int32_t fused = 0;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        if (!match_op(g, i, IR_OP_MUL)) continue;
        const struct ir_node *n = &g->nodes[i];
        for (int k = 0; k < 2; k++) {
            int32_t y = n->in[k], w = n->in[1 - k], x;
            double eps;
            if (!match_op(g, y, IR_OP_MUL) || !match_normalized(g, y, &x, &eps)) continue;
            const struct ir_node *wn = &g->nodes[w], *xn = &g->nodes[x];
            if (wn->shape.rank != 1 || !ir_dim_eq(wn->shape.dims[0], xn->shape.dims[xn->shape.rank - 1]))
                continue;
            struct ir_attrs at = {0};
            at.value = eps;
            int32_t in[2] = {x, w};
            if (rewrite_node(g, i, IR_OP_RMS_NORM, in, 2, &at, err)) return -1;
            fused++;
            break;
        }
    }
    ir_count_uses(g);
    return fused;
}
