/* Split-half rotary embedding as captured from Hugging Face models:
 *     x * cos + concat(-x[..., D/2:], x[..., :D/2]) * sin
 * (operands of the add and the muls in either order) becomes rope(x, cos, sin): seven
 * kernels and four temporaries become one. */
#include "passes/passes.h"

/* concat(neg(slice(x, h, 2h)), slice(x, 0, h)) on the last axis; returns x. */
static bool match_rotate_half(const struct ir_graph *g, int32_t idx, int32_t *x_out) {
    if (!match_op(g, idx, IR_OP_CONCAT)) return false;
    const struct ir_node *c = &g->nodes[idx];
    if (c->n_in != 2 || c->attrs.axis != c->shape.rank - 1) return false;
    if (!match_op(g, c->in[0], IR_OP_NEG)) return false;
    int32_t hi = g->nodes[c->in[0]].in[0], lo = c->in[1];
    if (!match_op(g, hi, IR_OP_SLICE) || !match_op(g, lo, IR_OP_SLICE)) return false;
    const struct ir_node *h = &g->nodes[hi], *l = &g->nodes[lo];
    int32_t x = h->in[0];
    if (l->in[0] != x) return false;
    const struct ir_node *xn = &g->nodes[x];
    int last = xn->shape.rank - 1;
    struct ir_dim d = xn->shape.dims[last];
    if (d.sym || d.coef % 2) return false;
    int64_t half = d.coef / 2;
    bool ok = h->attrs.axis == last && l->attrs.axis == last && h->attrs.step == 1 && l->attrs.step == 1 &&
              h->attrs.start.coef == half && l->attrs.start.coef == 0 &&
              h->shape.dims[last].coef == half && l->shape.dims[last].coef == half;
    if (!ok) return false;
    *x_out = x;
    return true;
}

int32_t pass_fuse_rope(struct ir_graph *g, struct llmopt_err *err) {
    int32_t fused = 0;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        if (!match_op(g, i, IR_OP_ADD)) continue;
        const struct ir_node *n = &g->nodes[i];
        for (int k = 0; k < 2; k++) {
            int32_t p = n->in[k], q = n->in[1 - k];
            if (!match_op(g, p, IR_OP_MUL) || !match_op(g, q, IR_OP_MUL)) continue;
            int32_t rot, sin, x2;
            if (!match_commuted(g, q, IR_OP_CONCAT, &rot, &sin) || !match_rotate_half(g, rot, &x2)) continue;
            const struct ir_node *pn = &g->nodes[p];
            int32_t x = pn->in[0] == x2 ? pn->in[0] : pn->in[1] == x2 ? pn->in[1] : IR_NONE;
            if (x == IR_NONE) continue;
            int32_t cos = pn->in[0] == x ? pn->in[1] : pn->in[0];
            if (!ir_shape_eq(&g->nodes[cos].shape, &g->nodes[sin].shape)) continue;
            int32_t in[3] = {x, cos, sin};
            struct llmopt_err ignored;
            /* the shape check of rope (cos/sin broadcast to x) decides the last doubts */
            if (rewrite_node(g, i, IR_OP_ROPE, in, 3, NULL, &ignored)) {
                err_set(err, LLMOPT_ERR_FORMAT, "rope fusion: %s", ignored.msg);
                return -1;
            }
            fused++;
            break;
        }
    }
    ir_count_uses(g);
    return fused;
}
