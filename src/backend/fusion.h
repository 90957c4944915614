/* Structural fusion shared by the backends' schedules (cpu/ref_ops.c, cuda/cuda_backend.cu):
 * chains found from the graph's ops, operands, use counts and shapes (never names), and
 * the memory-plan check that lets a fused kernel read a source later than the plan's node
 * order promises. What a backend does with a chain (where it runs it, into which storage)
 * stays its own. */
#ifndef LLMOPT_BACKEND_FUSION_H
#define LLMOPT_BACKEND_FUSION_H

#include "ir/ir.h"
#include "passes/memplan.h"

#include <stdbool.h>

/* uses[i] = the operand slots that read node i (n_nodes entries, all written). */
void fusion_count_uses(const struct ir_graph *g, int32_t *uses);

/* Node i is the rope of a [rms_norm ->] permute (last axis kept) -> rope chain, each link
 * used once (uses), none of them the graph's output or marked in taken (NULL: none):
 * returns the chain's first node (the rms_norm, if it has an f32 weight, else the
 * permute), or -1. */
int32_t fusion_norm_rope_chain(const struct ir_graph *g, const int32_t *uses, const bool *taken, int32_t i);

/* Node p is a permute [1, N, H, Dh] -> [1, H, N, Dh] (token-major rows to head-major)
 * read once and not the output: its reader could take the source in token-major order. */
bool fusion_tok_major_permute(const struct ir_graph *g, const int32_t *uses, int32_t p);

/* Whether the arena storage of nodes a and b (their roots') overlaps; false when either
 * has none (params). */
bool fusion_storage_overlaps(const struct ir_graph *g, const struct mem_plan *plan, int32_t a, int32_t b);

/* Whether node src's value survives from node `from` until node `to` runs: src has arena
 * storage and no node strictly between them that runs (skipped(ctx, j) false; skipped
 * NULL: all run) writes storage overlapping it. */
bool fusion_source_kept(const struct ir_graph *g, const struct mem_plan *plan, int32_t src, int32_t from, int32_t to,
                        bool (*skipped)(const void *ctx, int32_t j), const void *ctx);

#endif
