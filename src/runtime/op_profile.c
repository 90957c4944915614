/* Op-family profile (see op_profile.h). The compiler never branches on a model's
 * name, and neither does this: a node's family follows from where its data goes. */
#include "runtime/op_profile.h"

#include <stdlib.h>
#include <string.h>

static const char *const family_names[] = {
    "attention", "qkv", "attn_out", "mlp", "lm_head", "norm", "rope", "other",
};
_Static_assert(LLMOPT_ARRAY_LEN(family_names) == LLMOPT_OPS_COUNT, "one name per op family");

const char *llmopt_op_family_name(enum llmopt_op_family f) {
    return (unsigned)f < LLMOPT_OPS_COUNT ? family_names[f] : "?";
}

/* Nodes a step executes as kernels (the CPU run loop's rule, ir_count_kernels). */
static bool is_kernel(const struct ir_node *n) {
    return !(n->op == IR_OP_INPUT || n->op == IR_OP_PARAM || n->op == IR_OP_RESHAPE || n->constant);
}

/* A node that passes one tensor through towards the logits: views, row selection,
 * casts, unary ops, and binary ops whose other side is constant or a weight
 * (a logit soft-cap is x / c, tanh, * c). Returns the operand it passes, or IR_NONE. */
static int32_t logits_passthrough(const struct ir_graph *g, int32_t i) {
    const struct ir_node *n = &g->nodes[i];
    switch (n->op) {
    case IR_OP_RESHAPE:
    case IR_OP_PERMUTE:
    case IR_OP_SLICE:
    case IR_OP_CAST:
    case IR_OP_SELECT_ROWS: return n->in[0];
    default: break;
    }
    if (ir_op_is_unary_elementwise(n->op)) return n->in[0];
    if (ir_op_is_binary_elementwise(n->op)) {
        const struct ir_node *a = &g->nodes[n->in[0]], *b = &g->nodes[n->in[1]];
        bool a_fixed = a->constant || a->op == IR_OP_PARAM, b_fixed = b->constant || b->op == IR_OP_PARAM;
        if (b_fixed && !a_fixed) return n->in[0];
        if (a_fixed && !b_fixed) return n->in[1];
    }
    return IR_NONE;
}

static bool stops_walk(enum ir_op op) {
    return op == IR_OP_LINEAR || op == IR_OP_MATMUL || op == IR_OP_ATTENTION || op == IR_OP_EMBEDDING;
}

void op_profile_classify(const struct ir_graph *g, uint8_t *family) {
    int32_t n = g->n_nodes;
    /* feeds_qkv[i]: node i's result reaches an attention's q, k or v without passing
     * through a linear (marks run backwards, stopping at linears). from_attn[i]: node
     * i's result derives from an attention's result without passing through a linear. */
    bool *feeds_qkv = calloc((size_t)(n ? n : 1), sizeof *feeds_qkv);
    bool *from_attn = calloc((size_t)(n ? n : 1), sizeof *from_attn);
    LLMOPT_ASSERT(feeds_qkv && from_attn);
    for (int32_t i = n - 1; i >= 0; i--) {
        const struct ir_node *node = &g->nodes[i];
        if (node->op == IR_OP_ATTENTION) {
            for (int k = 0; k < 3 && k < node->n_in; k++) feeds_qkv[node->in[k]] = true;
        } else if (feeds_qkv[i] && !stops_walk(node->op)) {
            for (int k = 0; k < node->n_in; k++) feeds_qkv[node->in[k]] = true;
        }
    }
    for (int32_t i = 0; i < n; i++) {
        const struct ir_node *node = &g->nodes[i];
        from_attn[i] = node->op == IR_OP_ATTENTION;
        if (stops_walk(node->op)) continue;
        for (int k = 0; k < node->n_in && !from_attn[i]; k++) from_attn[i] = from_attn[node->in[k]];
    }
    int32_t lm_head = g->output;
    while (lm_head != IR_NONE && g->nodes[lm_head].op != IR_OP_LINEAR) lm_head = logits_passthrough(g, lm_head);
    for (int32_t i = 0; i < n; i++) {
        const struct ir_node *node = &g->nodes[i];
        enum llmopt_op_family f = LLMOPT_OPS_OTHER;
        switch (node->op) {
        case IR_OP_ATTENTION: f = LLMOPT_OPS_ATTENTION; break;
        case IR_OP_RMS_NORM:
        case IR_OP_LAYER_NORM: f = LLMOPT_OPS_NORM; break;
        case IR_OP_ROPE: f = LLMOPT_OPS_ROPE; break;
        case IR_OP_LINEAR:
            f = i == lm_head                ? LLMOPT_OPS_LM_HEAD
                : feeds_qkv[i]              ? LLMOPT_OPS_QKV
                : from_attn[node->in[0]]    ? LLMOPT_OPS_ATTN_OUT
                                            : LLMOPT_OPS_MLP;
            break;
        default: break;
        }
        family[i] = (uint8_t)f;
    }
    free(feeds_qkv);
    free(from_attn);
}

enum llmopt_status op_profile_create(const struct ir_graph *g, struct op_profile **out,
                                     struct llmopt_err *err) {
    struct op_profile *p = calloc(1, sizeof *p);
    size_t n = (size_t)(g->n_nodes ? g->n_nodes : 1);
    if (p) {
        p->family = calloc(n, sizeof *p->family);
        p->node_seconds = calloc(n, sizeof *p->node_seconds);
    }
    if (!p || !p->family || !p->node_seconds) {
        op_profile_free(p);
        return err_set(err, LLMOPT_ERR_NOMEM, "profile: out of memory for %zu nodes", n);
    }
    op_profile_classify(g, p->family);
    *out = p;
    return LLMOPT_OK;
}

void op_profile_free(struct op_profile *p) {
    if (!p) return;
    free(p->family);
    free(p->node_seconds);
    free(p);
}

/* Bytes operand k of node i reads at (n_tok, n_out): a weight whole (one row per token
 * for an embedding's table), an activation as its f32/i32 extent. */
static uint64_t operand_bytes(const struct ir_graph *g, int32_t i, int k, int64_t n_tok, int64_t n_out) {
    const struct ir_node *node = &g->nodes[i];
    int32_t src = node->in[k];
    while (g->nodes[src].op == IR_OP_RESHAPE) src = g->nodes[src].in[0];
    const struct ir_node *p = &g->nodes[src];
    if (p->op == IR_OP_PARAM) {
        if (node->op == IR_OP_EMBEDDING && k == 0 && p->shape.rank == 2)
            return (uint64_t)n_tok * ir_dtype_row_bytes(p->weight.dtype, p->shape.dims[1].coef);
        return p->weight.n_bytes;
    }
    struct ir_extent e;
    ir_extent_of(&g->nodes[node->in[k]].shape, n_tok, n_out, &e);
    return ir_dtype_row_bytes(g->nodes[node->in[k]].dtype, ir_extent_numel(&e));
}

void op_profile_add_forward(struct op_profile *p, const struct ir_graph *g, const struct exec_batch *b,
                            const struct kv_cache *kv, double seconds) {
    struct llmopt_profile *t = &p->totals;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const struct ir_node *node = &g->nodes[i];
        if (!is_kernel(node)) continue;
        struct llmopt_op_family_stats *f = &t->family[p->family[i]];
        f->kernels++;
        for (int k = 0; k < node->n_in; k++) f->bytes_read += operand_bytes(g, i, k, b->n_tokens, b->n_out);
        if (node->op == IR_OP_ATTENTION) {
            /* K and V rows of every cached position each token attends to. */
            const struct ir_shape *ks = &g->nodes[node->in[1]].shape;
            uint64_t row = (uint64_t)kv_dtype_bytes(kv->dtype, ks->dims[1].coef * ks->dims[3].coef);
            for (int32_t tk = 0; tk < b->n_tokens; tk++) {
                int64_t seen = (int64_t)b->positions[tk] + 1;
                if (node->attrs.window > 0 && seen > node->attrs.window) seen = node->attrs.window;
                f->bytes_read += 2 * row * (uint64_t)seen;
            }
        }
    }
    t->steps++;
    t->tokens += (uint64_t)b->n_tokens;
    t->forward_seconds += seconds;
}

void op_profile_read(const struct op_profile *p, const struct ir_graph *g, struct llmopt_profile *out) {
    *out = p->totals;
    for (int f = 0; f < LLMOPT_OPS_COUNT; f++) out->family[f].seconds = 0;
    for (int32_t i = 0; i < g->n_nodes; i++) out->family[p->family[i]].seconds += p->node_seconds[i];
}
