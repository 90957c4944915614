/* Common-subexpression elimination: a node equal to an earlier one (same op, dtype,
 * shape, operands and attributes) is replaced by it. Parameters, inputs and attention
 * (which has side effects) are never merged. Unrolled layers repeat their constants
 * (eps, exponent 2) and the rotary tables' views: those collapse to one each. */
#include "passes/passes.h"

#include <stdlib.h>
#include <string.h>

static uint64_t node_hash(const struct ir_node *n) {
    uint64_t h = 1469598103934665603ull;
#define MIX(v) h = (h ^ (uint64_t)(v)) * 1099511628211ull
    MIX(n->op);
    MIX(n->dtype);
    MIX(n->n_in);
    for (int k = 0; k < n->n_in; k++) MIX(n->in[k]);
    const unsigned char *a = (const unsigned char *)&n->attrs;
    for (size_t i = 0; i < sizeof n->attrs; i++) MIX(a[i]);
#undef MIX
    return h;
}

static bool nodes_equal(const struct ir_node *a, const struct ir_node *b) {
    if (a->op != b->op || a->dtype != b->dtype || a->n_in != b->n_in ||
        !ir_shape_eq(&a->shape, &b->shape) || a->constant != b->constant)
        return false;
    for (int k = 0; k < a->n_in; k++)
        if (a->in[k] != b->in[k]) return false;
    /* attrs are zero-initialized with their node, so padding compares equal */
    return !memcmp(&a->attrs, &b->attrs, sizeof a->attrs);
}

int32_t pass_cse(struct ir_graph *g, struct llmopt_err *err) {
    size_t cap = 16;
    while (cap < (size_t)g->n_nodes * 2) cap *= 2;
    int32_t *table = malloc(cap * sizeof *table);
    if (!table) {
        err_set(err, LLMOPT_ERR_NOMEM, "cse: out of memory");
        return -1;
    }
    for (size_t i = 0; i < cap; i++) table[i] = IR_NONE;
    int32_t merged = 0;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        struct ir_node *n = &g->nodes[i];
        /* operands may have been merged already: point them at the survivors first */
        if (n->op == IR_OP_INPUT || n->op == IR_OP_PARAM || n->op == IR_OP_ATTENTION) continue;
        size_t j = node_hash(n) & (cap - 1);
        for (;;) {
            if (table[j] == IR_NONE) {
                table[j] = i;
                break;
            }
            if (nodes_equal(&g->nodes[table[j]], n)) {
                ir_replace_uses(g, i, table[j]);
                merged++;
                break;
            }
            j = (j + 1) & (cap - 1);
        }
    }
    free(table);
    ir_count_uses(g);
    return merged;
}
