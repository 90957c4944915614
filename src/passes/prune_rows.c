/* Row pruning: computes on the output rows only, as far up the graph as rows stay
 * independent.
 *
 * A graph selects the rows whose logits a step returns (select_rows(x, out_rows), M of
 * N token rows) just before the lm_head. Every row-wise op before it (norms,
 * elementwise ops, linears and their epilogues) computes each token row on its own, so
 * select_rows(f(x)) = f(select_rows(x)): the select moves up through them until it
 * meets an op that mixes rows (attention, short_conv) or a value something else still
 * needs whole. For a decoder that is the last layer's attention output projection,
 * residual adds, MLP and the final norm: prefill of a 512-token prompt computes them for
 * one row instead of 512 (llama.cpp does the same with its output ids).
 *
 * A node is prunable when it is row-wise (below), it is not the graph's output, and
 * every user is either select_rows(node, out_rows) or a prunable node. The graph is
 * rebuilt in order: a prunable node's operands that are whole token rows and not
 * prunable get a select_rows(operand, out_rows) right before it (one per operand), its
 * shape is inferred again ([.., M, ..]), and the old select_rows nodes are dropped
 * (their users read the pruned node). */
#include "passes/passes.h"

#include "base/arena.h"

#include <stdlib.h>
#include <string.h>

/* The shape has token rows (dims[rank - 2] is N) and no other N or M dim. */
static bool token_rows(const struct ir_shape *s) {
    if (s->rank < 2 || !ir_dim_eq(s->dims[s->rank - 2], (struct ir_dim){1, IR_SYM_N})) return false;
    for (int d = 0; d < s->rank; d++)
        if (d != s->rank - 2 && s->dims[d].sym != IR_SYM_NONE) return false;
    return true;
}

/* Operand k of n, whose output has token rows: whole token rows of the same rank
 * (selected with it), or no token dimension at all (broadcast, kept). */
static bool operand_rows(const struct ir_graph *g, const struct ir_node *n, int k) {
    const struct ir_node *x = &g->nodes[n->in[k]];
    return x->shape.rank == n->shape.rank && token_rows(&x->shape) && x->dtype == IR_DTYPE_F32;
}

/* Operand k of the prunable node n needs a select_rows of its own: it has n's token
 * rows and is not pruned itself */
static bool needs_select(const struct ir_graph *g, const bool *prune, const struct ir_node *n, int k) {
    return !prune[n->in[k]] && operand_rows(g, n, k);
}

/* Whether n computes each token row from that row of its operands alone. */
static bool row_wise(const struct ir_graph *g, const struct ir_node *n) {
    if (n->dtype != IR_DTYPE_F32 || !token_rows(&n->shape)) return false;
    const int row_axis = n->shape.rank - 2;
    switch (n->op) {
    case IR_OP_LINEAR:
    case IR_OP_RMS_NORM:
    case IR_OP_LAYER_NORM: /* over the last axis; weights and biases have no rows */
        break;
    case IR_OP_MATMUL: /* x [.., N, K] by a matrix without token rows */
        if (!ir_shape_is_static(&g->nodes[n->in[1]].shape)) return false;
        break;
    case IR_OP_MEAN:
    case IR_OP_SUM:
    case IR_OP_MAX:
        if (!n->attrs.keepdim) return false;
        for (int a = 0; a < n->attrs.n_axes; a++)
            if (n->attrs.axes[a] <= row_axis) return false;
        break;
    case IR_OP_SOFTMAX:
        if (n->attrs.axis <= row_axis) return false;
        break;
    default:
        if (!ir_op_is_unary_elementwise(n->op) && !ir_op_is_binary_elementwise(n->op)) return false;
    }
    for (int k = 0; k < n->n_in; k++)
        if (!operand_rows(g, n, k) && !ir_shape_is_static(&g->nodes[n->in[k]].shape)) return false;
    return true;
}

int32_t pass_prune_rows(struct ir_graph *g, struct llmopt_err *err) {
    const int32_t n = g->n_nodes, rows = g->inputs[IR_INPUT_OUT_ROWS];
    if (rows == IR_NONE || g->output == IR_NONE) return 0;
    /* users of each node, as offsets into one array (operands come before users) */
    int32_t *first = calloc((size_t)n + 1, sizeof *first);
    int32_t n_edges = 0;
    for (int32_t i = 0; i < n; i++) n_edges += g->nodes[i].n_in;
    int32_t *users = malloc(((size_t)n_edges + 1) * sizeof *users);
    int32_t *fill = calloc((size_t)n + 1, sizeof *fill);
    bool *prune = calloc((size_t)n, sizeof *prune);
    int32_t *map = malloc((size_t)n * sizeof *map), *sel = malloc((size_t)n * sizeof *sel);
    struct ir_node *nodes = NULL;
    bool *redo = NULL; /* new nodes whose shape is inferred again */
    int32_t pruned = 0, added = 0;
    if (!first || !users || !fill || !prune || !map || !sel) goto nomem;
    for (int32_t i = 0; i < n; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++) first[g->nodes[i].in[k] + 1]++;
    for (int32_t i = 0; i < n; i++) first[i + 1] += first[i];
    for (int32_t i = 0; i < n; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++) {
            int32_t x = g->nodes[i].in[k];
            users[first[x] + fill[x]++] = i;
        }
    /* users come after their operands: decide from the last node back */
    for (int32_t i = n - 1; i >= 0; i--) {
        const struct ir_node *nd = &g->nodes[i];
        if (i == g->output || first[i] == first[i + 1] || !row_wise(g, nd)) continue;
        bool all = true;
        for (int32_t e = first[i]; e < first[i + 1] && all; e++) {
            const struct ir_node *u = &g->nodes[users[e]];
            all = (u->op == IR_OP_SELECT_ROWS && u->in[0] == i && u->in[1] == rows) || prune[users[e]];
        }
        if (all) {
            prune[i] = true;
            pruned++;
        }
    }
    if (!pruned) goto done;
    /* the rebuilt array: every node, less the dropped selects, plus a select per operand */
    for (int32_t i = 0; i < n; i++) {
        sel[i] = IR_NONE;
        if (!prune[i]) continue;
        for (int k = 0; k < g->nodes[i].n_in; k++) {
            int32_t x = g->nodes[i].in[k];
            if (needs_select(g, prune, &g->nodes[i], k) && sel[x] == IR_NONE) {
                sel[x] = 0; /* counted; numbered below */
                added++;
            }
        }
    }
    if (n + added > IR_MAX_NODES) {
        err_set(err, LLMOPT_ERR_LIMIT, "prune-rows: more than %d nodes", IR_MAX_NODES);
        goto fail;
    }
    if (!(nodes = malloc((size_t)(n + added) * sizeof *nodes)) || !(redo = calloc((size_t)(n + added), sizeof *redo)))
        goto nomem;
    for (int32_t i = 0; i < n; i++) sel[i] = IR_NONE;
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        struct ir_node *nd = &g->nodes[i];
        if (nd->op == IR_OP_SELECT_ROWS && nd->in[1] == rows && prune[nd->in[0]]) {
            map[i] = map[nd->in[0]]; /* the pruned node has the selected rows */
            continue;
        }
        if (prune[i])
            for (int k = 0; k < nd->n_in; k++) {
                int32_t x = nd->in[k];
                if (!needs_select(g, prune, nd, k) || sel[x] != IR_NONE) continue;
                struct ir_node *s = &nodes[m];
                memset(s, 0, sizeof *s);
                s->op = IR_OP_SELECT_ROWS;
                s->dtype = IR_DTYPE_F32;
                s->n_in = 2;
                if (!(s->in = arena_alloc(g->arena, 2 * sizeof *s->in))) goto nomem;
                s->in[0] = map[x];
                s->in[1] = map[rows];
                redo[m] = true;
                sel[x] = m++;
            }
        nodes[m] = *nd;
        for (int k = 0; k < nd->n_in; k++) {
            int32_t x = nd->in[k];
            nodes[m].in[k] = prune[i] && needs_select(g, prune, nd, k) ? sel[x] : map[x];
        }
        redo[m] = prune[i];
        map[i] = m++;
    }
    for (int k = 0; k < IR_INPUT_COUNT; k++)
        if (g->inputs[k] != IR_NONE) g->inputs[k] = map[g->inputs[k]];
    g->output = map[g->output];
    free(g->nodes);
    g->nodes = nodes;
    g->n_nodes = g->cap_nodes = m;
    nodes = NULL;
    /* shapes of the selects and the pruned nodes, in order: [.., M, ..] */
    for (int32_t i = 0; i < g->n_nodes; i++)
        if (redo[i] && ir_infer_node(g, i, err)) goto fail;
    ir_count_uses(g);
    goto done;
nomem:
    err_set(err, LLMOPT_ERR_NOMEM, "prune-rows: out of memory");
fail:
    pruned = -1;
done:
    free(first);
    free(users);
    free(fill);
    free(prune);
    free(map);
    free(sel);
    free(nodes);
    free(redo);
    return pruned;
}
