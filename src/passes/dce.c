/* Dead-code elimination: keeps what the output needs (and every input and attention
 * node: attention writes the KV cache), drops the rest and compacts the node array. */
#include "passes/passes.h"

#include <stdlib.h>
#include <string.h>

int32_t pass_dce(struct ir_graph *g, struct llmopt_err *err) {
    int32_t n = g->n_nodes;
    bool *live = calloc((size_t)n, sizeof *live);
    int32_t *remap = malloc((size_t)n * sizeof *remap);
    if (!live || !remap) {
        free(live);
        free(remap);
        err_set(err, LLMOPT_ERR_NOMEM, "dce: out of memory");
        return -1;
    }
    live[g->output] = true;
    for (int k = 0; k < IR_INPUT_COUNT; k++) live[g->inputs[k]] = true;
    for (int32_t i = 0; i < n; i++)
        if (g->nodes[i].op == IR_OP_ATTENTION) live[i] = true;
    /* Operands come before users: one backwards sweep marks everything needed. */
    for (int32_t i = n - 1; i >= 0; i--)
        if (live[i])
            for (int k = 0; k < g->nodes[i].n_in; k++) live[g->nodes[i].in[k]] = true;
    int32_t kept = 0;
    for (int32_t i = 0; i < n; i++) {
        if (!live[i]) {
            remap[i] = IR_NONE;
            continue;
        }
        remap[i] = kept;
        if (kept != i) g->nodes[kept] = g->nodes[i];
        struct ir_node *node = &g->nodes[kept];
        for (int k = 0; k < node->n_in; k++) node->in[k] = remap[node->in[k]];
        kept++;
    }
    for (int k = 0; k < IR_INPUT_COUNT; k++) g->inputs[k] = remap[g->inputs[k]];
    g->output = remap[g->output];
    int32_t removed = n - kept;
    g->n_nodes = kept;
    free(live);
    free(remap);
    ir_count_uses(g);
    return removed;
}
