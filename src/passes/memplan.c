#include "passes/memplan.h"

#include <stdlib.h>
#include <string.h>

size_t mem_plan_node_bytes(const struct ir_node *n, int64_t n_max, int64_t m_max) {
    struct ir_extent e;
    ir_extent_of(&n->shape, n_max, m_max, &e);
    return (size_t)ir_extent_numel(&e) * 4; /* activations are f32 or i32 */
}

static bool node_has_storage(const struct ir_node *n) { return n->op != IR_OP_PARAM; }
static bool node_aliases_input(const struct ir_node *n) { return n->op == IR_OP_RESHAPE; }
/* Computed once and read by every step: never reused. */
static bool node_is_persistent(const struct ir_node *n) {
    return n->op == IR_OP_CONST || n->op == IR_OP_ROPE_FREQS || n->constant;
}

struct live_block {
    int64_t offset;
    size_t size;
    int32_t end; /* last node index that reads it */
};

static size_t align_up(size_t x) { return (x + MEMPLAN_ALIGN - 1) & ~(size_t)(MEMPLAN_ALIGN - 1); }

/* Allocates the plan's arrays and fills root[] and last_use[] (liveness). */
static enum llmopt_status plan_liveness(const struct ir_graph *g, int64_t n_max, int64_t m_max,
                                        struct mem_plan *out, struct llmopt_err *err) {
    memset(out, 0, sizeof *out);
    int32_t n = g->n_nodes;
    out->n_nodes = n;
    out->n_max = n_max;
    out->m_max = m_max;
    out->offset = malloc((size_t)(n ? n : 1) * sizeof *out->offset);
    out->root = calloc((size_t)(n ? n : 1), sizeof *out->root);
    out->last_use = calloc((size_t)(n ? n : 1), sizeof *out->last_use);
    if (!out->offset || !out->root || !out->last_use) {
        mem_plan_free(out);
        return err_set(err, LLMOPT_ERR_NOMEM, "memory plan: out of memory");
    }
    for (int32_t i = 0; i < n; i++) {
        const struct ir_node *node = &g->nodes[i];
        out->root[i] = node_aliases_input(node) ? out->root[node->in[0]] : i;
        out->last_use[i] = node_is_persistent(node) ? INT32_MAX : i;
    }
    for (int32_t i = 0; i < n; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++) {
            int32_t r = out->root[g->nodes[i].in[k]];
            if (out->last_use[r] < i) out->last_use[r] = i;
        }
    out->last_use[out->root[g->output]] = INT32_MAX;
    return LLMOPT_OK;
}

enum llmopt_status mem_plan_build(const struct ir_graph *g, int64_t n_max, int64_t m_max,
                                  struct mem_plan *out, struct llmopt_err *err) {
    enum llmopt_status st = plan_liveness(g, n_max, m_max, out, err);
    if (st) return st;
    int32_t n = g->n_nodes;
    struct live_block *live = malloc((size_t)(n ? n : 1) * sizeof *live);
    if (!live) {
        mem_plan_free(out);
        return err_set(err, LLMOPT_ERR_NOMEM, "memory plan: out of memory");
    }

    /* Persistent nodes are written once, before any step, so they live for the whole
     * timeline: they take a prefix of the arena that the walk below never reuses. */
    int64_t prefix = 0;
    for (int32_t i = 0; i < n; i++) {
        out->offset[i] = -1;
        if (!node_is_persistent(&g->nodes[i])) continue;
        if (out->root[i] != i) { /* a view of a constant */
            out->offset[i] = out->offset[out->root[i]];
            continue;
        }
        size_t size = align_up(mem_plan_node_bytes(&g->nodes[i], n_max, m_max));
        out->offset[i] = prefix;
        prefix += (int64_t)size;
        out->naive_bytes += size;
    }
    out->arena_bytes = (size_t)prefix;
    int32_t n_live = 0;
    for (int32_t i = 0; i < n; i++) {
        const struct ir_node *node = &g->nodes[i];
        if (!node_has_storage(node) || out->offset[i] >= 0) continue;
        if (out->root[i] != i) {
            out->offset[i] = out->offset[out->root[i]];
            continue;
        }
        size_t size = align_up(mem_plan_node_bytes(node, n_max, m_max));
        out->naive_bytes += size;
        /* Drop blocks whose last reader ran before this node (a result never shares
         * storage with its own operands). */
        int32_t w = 0;
        for (int32_t k = 0; k < n_live; k++)
            if (live[k].end >= i) live[w++] = live[k];
        n_live = w;
        /* live[] is kept sorted by offset; find the smallest gap that fits. */
        int64_t best = -1;
        size_t best_gap = SIZE_MAX;
        int64_t cursor = prefix;
        for (int32_t k = 0; k <= n_live; k++) {
            int64_t gap_end = k < n_live ? live[k].offset : INT64_MAX;
            size_t gap = (size_t)(gap_end - cursor);
            if (gap >= size && (gap < best_gap || best < 0)) {
                best = cursor;
                best_gap = gap;
            }
            if (k < n_live) cursor = live[k].offset + (int64_t)live[k].size;
        }
        out->offset[i] = best;
        int32_t pos = 0;
        while (pos < n_live && live[pos].offset < best) pos++;
        memmove(&live[pos + 1], &live[pos], (size_t)(n_live - pos) * sizeof *live);
        live[pos] = (struct live_block){best, size, out->last_use[i]};
        n_live++;
        if ((size_t)best + size > out->arena_bytes) out->arena_bytes = (size_t)best + size;
    }
    free(live);
    return LLMOPT_OK;
}

enum llmopt_status mem_plan_from_offsets(const struct ir_graph *g, int64_t n_max, int64_t m_max,
                                         const int64_t *offsets, size_t arena_bytes,
                                         struct mem_plan *out, struct llmopt_err *err) {
    enum llmopt_status st = plan_liveness(g, n_max, m_max, out, err);
    if (st) return st;
    int32_t n = g->n_nodes;
    out->arena_bytes = arena_bytes;
    for (int32_t i = 0; i < n; i++) {
        const struct ir_node *node = &g->nodes[i];
        out->offset[i] = offsets[i];
        size_t size = node_has_storage(node) ? mem_plan_node_bytes(node, n_max, m_max) : 0;
        bool ok = node_has_storage(node)
                      ? offsets[i] >= 0 && (uint64_t)offsets[i] % 4 == 0 &&
                            (uint64_t)offsets[i] <= arena_bytes &&
                            size <= arena_bytes - (uint64_t)offsets[i] &&
                            (out->root[i] == i || offsets[i] == offsets[out->root[i]])
                      : offsets[i] == -1;
        if (!ok) {
            err_set(err, LLMOPT_ERR_FORMAT,
                    "memory plan: node %d (%s) has offset %lld: outside the %zu-byte arena or "
                    "not the buffer it must use",
                    i, ir_op_name(node->op), (long long)offsets[i], arena_bytes);
            mem_plan_free(out);
            return LLMOPT_ERR_FORMAT;
        }
        if (node_has_storage(node) && out->root[i] == i) out->naive_bytes += align_up(size);
    }
    /* Roots live over [i, last_use]; persistent ones over everything. */
    for (int32_t i = 0; i < n; i++) {
        if (out->root[i] != i || !node_has_storage(&g->nodes[i])) continue;
        int32_t start_i = node_is_persistent(&g->nodes[i]) ? -1 : i;
        size_t size_i = mem_plan_node_bytes(&g->nodes[i], n_max, m_max);
        for (int32_t j = i + 1; j < n; j++) {
            if (out->root[j] != j || !node_has_storage(&g->nodes[j])) continue;
            int32_t start_j = node_is_persistent(&g->nodes[j]) ? -1 : j;
            bool overlap_time = start_i <= out->last_use[j] && start_j <= out->last_use[i];
            if (!overlap_time) continue;
            size_t size_j = mem_plan_node_bytes(&g->nodes[j], n_max, m_max);
            if (size_i == 0 || size_j == 0) continue;
            bool disjoint = offsets[i] + (int64_t)size_i <= offsets[j] || offsets[j] + (int64_t)size_j <= offsets[i];
            if (!disjoint) {
                err_set(err, LLMOPT_ERR_FORMAT,
                        "memory plan: buffers of nodes %d and %d are live together and overlap", i, j);
                mem_plan_free(out);
                return LLMOPT_ERR_FORMAT;
            }
        }
    }
    return LLMOPT_OK;
}

enum llmopt_status mem_plan_copy(const struct mem_plan *src, struct mem_plan *dst,
                                 struct llmopt_err *err) {
    *dst = *src;
    size_t n = (size_t)(src->n_nodes ? src->n_nodes : 1);
    dst->offset = malloc(n * sizeof *dst->offset);
    dst->root = malloc(n * sizeof *dst->root);
    dst->last_use = malloc(n * sizeof *dst->last_use);
    if (!dst->offset || !dst->root || !dst->last_use) {
        mem_plan_free(dst);
        return err_set(err, LLMOPT_ERR_NOMEM, "memory plan: out of memory");
    }
    memcpy(dst->offset, src->offset, (size_t)src->n_nodes * sizeof *dst->offset);
    memcpy(dst->root, src->root, (size_t)src->n_nodes * sizeof *dst->root);
    memcpy(dst->last_use, src->last_use, (size_t)src->n_nodes * sizeof *dst->last_use);
    return LLMOPT_OK;
}

void mem_plan_free(struct mem_plan *p) {
    free(p->offset);
    free(p->root);
    free(p->last_use);
    memset(p, 0, sizeof *p);
}
