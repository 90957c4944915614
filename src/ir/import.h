/* Import: graph file (JSON, docs/formats/graph.md) -> IR, with every hyper-parameter
 * given a value, layers unrolled, each node's shape inferred and checked against the
 * shape capture recorded. Parameters are bound through a callback as they appear. */
#ifndef LLMOPT_IR_IMPORT_H
#define LLMOPT_IR_IMPORT_H

#include "ir/ir.h"

#include <jansson.h>

#define IR_MAX_HPARAMS 64
#define IR_MAX_LAYER_HPARAMS 8

/* Hyper-parameter values. Per-layer hparams (the graph's "layer_hparams") hold one value
 * per layer; inside a repeat body they read as the current layer's value. */
struct ir_hparams {
    int n;
    const char *names[IR_MAX_HPARAMS];
    double values[IR_MAX_HPARAMS];
    int n_layer;
    const char *layer_names[IR_MAX_LAYER_HPARAMS];
    const double *layer_values[IR_MAX_LAYER_HPARAMS]; /* (layer_count[k]), owned by the caller */
    int32_t layer_count[IR_MAX_LAYER_HPARAMS];
};

bool ir_hparams_get(const struct ir_hparams *hp, const char *name, double *value);
/* expr_lookup_fn over an ir_hparams. */
bool ir_hparams_lookup(void *hp, const char *name, size_t len, double *value);

/* Binds parameter `tmpl` (the graph's name, "{i}" standing for the layer) of layer
 * `layer` (-1 outside layers), whose graph shape is `shape` (no N/M): fills out with
 * the weight or returns an error naming the tensor. */
typedef enum llmopt_status (*ir_bind_param_fn)(void *ctx, const char *tmpl, int layer,
                                               const struct ir_shape *shape,
                                               struct ir_weight *out, struct llmopt_err *err);

/* "blk.{i}.attn_q" -> "blk.3.attn_q"; false if it does not fit or {i} has no layer. */
bool ir_substitute_layer(const char *tmpl, int layer, char *out, size_t cap);

enum llmopt_status ir_import(const json_t *graph, const struct ir_hparams *hp,
                             ir_bind_param_fn bind, void *bind_ctx, struct ir_graph *g,
                             struct llmopt_err *err);

/* Expression (string or JSON number) -> IR dimension; must be an integer c, c*N or c*M. */
enum llmopt_status ir_dim_from_json(const json_t *v, const struct ir_hparams *hp,
                                    struct ir_dim *out, struct llmopt_err *err);
enum llmopt_status ir_number_from_json(const json_t *v, const struct ir_hparams *hp,
                                       double *out, struct llmopt_err *err);

#endif
