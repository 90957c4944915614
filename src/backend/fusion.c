/* Structural fusion shared by the backends' schedules (fusion.h). */
#include "backend/fusion.h"

void fusion_count_uses(const struct ir_graph *g, int32_t *uses) {
    for (int32_t i = 0; i < g->n_nodes; i++) uses[i] = 0;
    for (int32_t i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++) uses[g->nodes[i].in[k]]++;
}

static bool is_taken(const bool *taken, int32_t i) {
    return taken && taken[i];
}

int32_t fusion_norm_rope_chain(const struct ir_graph *g, const int32_t *uses, const bool *taken, int32_t i) {
    const struct ir_node *o = &g->nodes[i];
    if (o->op != IR_OP_ROPE || o->constant || i == g->output || o->n_in != 3 || is_taken(taken, i)) return -1;
    int32_t p = o->in[0];
    const struct ir_node *pn = &g->nodes[p];
    int rank = o->shape.rank;
    if (pn->op != IR_OP_PERMUTE || pn->constant || uses[p] != 1 || p == g->output || is_taken(taken, p) ||
        pn->attrs.n_axes != rank || rank < 2 || pn->attrs.axes[rank - 1] != rank - 1 ||
        o->shape.dims[rank - 1].sym != IR_SYM_NONE || o->shape.dims[rank - 1].coef % 2 || o->in[1] == p ||
        o->in[2] == p)
        return -1;
    int32_t r = pn->in[0];
    const struct ir_node *rn = &g->nodes[r], *wn = &g->nodes[rn->in[1]];
    bool norm = rn->op == IR_OP_RMS_NORM && !rn->constant && rn->n_in == 2 && uses[r] == 1 && !is_taken(taken, r) &&
                r != g->output && wn->dtype == IR_DTYPE_F32 &&
                (wn->op != IR_OP_PARAM || wn->weight.dtype == IR_DTYPE_F32);
    return norm ? r : p;
}

bool fusion_tok_major_permute(const struct ir_graph *g, const int32_t *uses, int32_t p) {
    const struct ir_node *pn = &g->nodes[p];
    if (pn->op != IR_OP_PERMUTE || uses[p] != 1 || p == g->output || pn->constant || pn->attrs.n_axes != 4 ||
        pn->attrs.axes[0] != 0 || pn->attrs.axes[1] != 2 || pn->attrs.axes[2] != 1 || pn->attrs.axes[3] != 3)
        return false;
    const struct ir_shape *xs = &g->nodes[pn->in[0]].shape;
    return xs->rank == 4 && xs->dims[0].coef == 1 && xs->dims[0].sym == IR_SYM_NONE && xs->dims[1].coef == 1 &&
           xs->dims[1].sym == IR_SYM_N && xs->dims[2].sym == IR_SYM_NONE && xs->dims[3].sym == IR_SYM_NONE;
}

/* The byte range of node i's root storage; false without arena storage. */
static bool storage_range(const struct ir_graph *g, const struct mem_plan *plan, int32_t i, size_t *lo, size_t *hi) {
    int32_t r = plan->root[i];
    if (plan->offset[r] < 0) return false;
    *lo = (size_t)plan->offset[r];
    *hi = *lo + mem_plan_node_bytes(&g->nodes[r], plan->n_max, plan->m_max);
    return true;
}

bool fusion_storage_overlaps(const struct ir_graph *g, const struct mem_plan *plan, int32_t a, int32_t b) {
    size_t al, ah, bl, bh;
    return storage_range(g, plan, a, &al, &ah) && storage_range(g, plan, b, &bl, &bh) && al < bh && bl < ah;
}

bool fusion_source_kept(const struct ir_graph *g, const struct mem_plan *plan, int32_t src, int32_t from, int32_t to,
                        bool (*skipped)(const void *ctx, int32_t j), const void *ctx) {
    size_t lo, hi;
    if (!storage_range(g, plan, src, &lo, &hi)) return false;
    for (int32_t j = from + 1; j < to; j++) {
        const struct ir_node *nj = &g->nodes[j];
        /* views, inputs (written before the first node), params and constants (computed
         * once in prepare) write nothing while a step runs */
        if (nj->op == IR_OP_RESHAPE || nj->op == IR_OP_INPUT || nj->op == IR_OP_PARAM || nj->constant ||
            plan->root[j] != j || (skipped && skipped(ctx, j)))
            continue;
        size_t jl, jh;
        if (storage_range(g, plan, j, &jl, &jh) && jl < hi && lo < jh) return false;
    }
    return true;
}
