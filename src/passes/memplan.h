/* Static memory plan: every activation gets a byte offset in one arena sized for the
 * largest batch (N_max tokens, M_max output rows). Offsets come from liveness
 * intervals over the node order with best-fit placement; reshapes alias their input.
 * Executing a step with any N <= N_max allocates nothing. */
#ifndef LLMOPT_PASSES_MEMPLAN_H
#define LLMOPT_PASSES_MEMPLAN_H

#include "ir/ir.h"

#define MEMPLAN_ALIGN 64

struct mem_plan {
    int32_t n_nodes;
    int64_t n_max, m_max;
    int64_t *offset;    /* (n_nodes) byte offset of the node's storage; -1: none (params) */
    int32_t *root;      /* (n_nodes) node that owns the storage (itself unless aliased) */
    int32_t *last_use;  /* (n_nodes) last node index reading the root's storage */
    size_t arena_bytes; /* planned arena size */
    size_t naive_bytes; /* sum of every node's own storage, for the report */
};

enum llmopt_status mem_plan_build(const struct ir_graph *g, int64_t n_max, int64_t m_max,
                                  struct mem_plan *out, struct llmopt_err *err);
/* A plan given from outside (a Model Program): takes the offsets (n_nodes entries)
 * and checks them: every stored node inside the arena, views at their root's offset,
 * and no two buffers live at the same time overlapping. Errors name the node. */
enum llmopt_status mem_plan_from_offsets(const struct ir_graph *g, int64_t n_max, int64_t m_max,
                                         const int64_t *offsets, size_t arena_bytes,
                                         struct mem_plan *out, struct llmopt_err *err);
enum llmopt_status mem_plan_copy(const struct mem_plan *src, struct mem_plan *dst,
                                 struct llmopt_err *err);
void mem_plan_free(struct mem_plan *p);
/* Bytes a node's result needs at the plan's N_max/M_max. */
size_t mem_plan_node_bytes(const struct ir_node *n, int64_t n_max, int64_t m_max);

#endif
