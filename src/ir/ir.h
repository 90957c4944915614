/* The IR: a flat, topologically ordered list of nodes over tensors whose shapes are
 * concrete except for the token count N and the output-row count M.
 *
 * Building a graph computes nothing; a backend executes it after planning. Layers of a
 * graph file's `repeat` are unrolled on import, so the IR is a straight line. */
#ifndef LLMOPT_IR_IR_H
#define LLMOPT_IR_IR_H

#include "base/status.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define IR_MAX_RANK 6
#define IR_MAX_NODES 200000
#define IR_NONE (-1)

enum ir_dtype {
    IR_DTYPE_F32,
    IR_DTYPE_F16,
    IR_DTYPE_BF16,
    IR_DTYPE_Q8_0,
    IR_DTYPE_Q4_0,
    IR_DTYPE_I32,
    /* llama.cpp's other block layouts (format/quant.h, format/quant_k.h) */
    IR_DTYPE_Q4_K,
    IR_DTYPE_Q5_K,
    IR_DTYPE_Q6_K,
    IR_DTYPE_Q5_0,
    IR_DTYPE_IQ4_XS,
    IR_DTYPE_COUNT
};
const char *ir_dtype_name(enum ir_dtype t);
bool ir_dtype_parse(const char *name, enum ir_dtype *out);
/* Weight dtypes whose rows are blocks (q8_0, q4_0, q5_0: 32; q4_k, q5_k, q6_k, iq4_xs:
 * 256): elements per block. 1 otherwise. */
int ir_dtype_block_elems(enum ir_dtype t);
/* Bytes per row of n elements (n a multiple of the block size). */
size_t ir_dtype_row_bytes(enum ir_dtype t, int64_t n);

#define IR_OPS(X)                                                                  \
    X(INPUT, "input", 0) X(PARAM, "param", 0) X(CONST, "const", 0)                 \
    X(ROPE_FREQS, "rope_freqs", 0) X(EMBEDDING, "embedding", 2)                    \
    X(LINEAR, "linear", -1) X(MATMUL, "matmul", 2)                                 \
    X(NEG, "neg", 1) X(EXP, "exp", 1) X(SQRT, "sqrt", 1) X(RSQRT, "rsqrt", 1)       \
    X(RECIP, "recip", 1) X(SILU, "silu", 1) X(SIGMOID, "sigmoid", 1)               \
    X(TANH, "tanh", 1) X(RELU, "relu", 1) X(GELU, "gelu", 1)                        \
    X(GELU_TANH, "gelu_tanh", 1) X(COS, "cos", 1) X(SIN, "sin", 1)                  \
    X(ADD, "add", 2) X(SUB, "sub", 2) X(MUL, "mul", 2) X(DIV, "div", 2)             \
    X(POW, "pow", 2) X(MAXIMUM, "maximum", 2) X(MINIMUM, "minimum", 2)              \
    X(MEAN, "mean", 1) X(SUM, "sum", 1) X(MAX, "max", 1) X(SOFTMAX, "softmax", 1)   \
    X(RMS_NORM, "rms_norm", 2) X(LAYER_NORM, "layer_norm", 3)                      \
    X(RESHAPE, "reshape", 1) X(PERMUTE, "permute", 1) X(EXPAND, "expand", 1)        \
    X(SLICE, "slice", 1) X(CONCAT, "concat", -1) X(CAST, "cast", 1)                 \
    X(SELECT_ROWS, "select_rows", 2) X(ATTENTION, "attention", 5)                  \
    X(ROPE, "rope", 3) X(SHORT_CONV, "short_conv", 4)

enum ir_op {
#define IR_OP_ENUM(name, str, arity) IR_OP_##name,
    IR_OPS(IR_OP_ENUM)
#undef IR_OP_ENUM
    IR_OP_COUNT
};
const char *ir_op_name(enum ir_op op);
bool ir_op_parse(const char *name, enum ir_op *out);
/* Operand count, or -1 when variable (linear: 2 or 3; concat: >= 1). */
int ir_op_arity(enum ir_op op);
bool ir_op_is_unary_elementwise(enum ir_op op);
bool ir_op_is_binary_elementwise(enum ir_op op);

/* One dimension: coef, times N or M when sym says so. */
enum ir_sym { IR_SYM_NONE, IR_SYM_N, IR_SYM_M };
struct ir_dim {
    int64_t coef;
    enum ir_sym sym;
};
struct ir_shape {
    int rank;
    struct ir_dim dims[IR_MAX_RANK];
};

/* Concrete shape for given N and M. */
struct ir_extent {
    int rank;
    int64_t dims[IR_MAX_RANK];
};

/* A bound weight: borrowed from the weights file (or owned by the binder when a
 * transform had to rewrite it). Row-major [rows, row_len] for 2-D weights. */
struct ir_weight {
    const void *data;
    enum ir_dtype dtype;
    uint64_t n_bytes;
    const char *source;    /* tensor name in the weights file */
    const char *transform; /* the map transform applied at bind (compact JSON), or NULL */
};

/* Epilogue of a fused linear: y = act(x W^T + bias) * gate + residual. Operands
 * after x and w come in this order, each present only when its flag is set. */
enum ir_linear_flags {
    IR_LINEAR_BIAS = 1 << 0,
    IR_LINEAR_GATE = 1 << 1,     /* multiply by an operand of the output's shape */
    IR_LINEAR_RESIDUAL = 1 << 2, /* add an operand of the output's shape */
};

struct ir_attrs {
    double value;                 /* const: value; rms/layer_norm: eps; attention: scale; rope_freqs: theta */
    int64_t axis;                 /* softmax/concat/slice: dim (normalized >= 0); rope_freqs: dim */
    struct ir_dim start, end;     /* slice (end clamped at execution) */
    int64_t step;                 /* slice */
    int n_axes;                   /* mean/sum/max: reduced axes; permute: rank */
    int64_t axes[IR_MAX_RANK];    /* mean/sum/max: axes (normalized); permute: perm */
    bool keepdim;                 /* mean/sum/max */
    struct ir_shape target;       /* reshape/expand */
    enum ir_dtype cast_to;        /* cast */
    int64_t window;               /* attention: 0 = unlimited */
    int32_t kv_layer;             /* attention: index of its KV cache layer; short_conv: index of
                                     its conv-state layer (numbered apart from the KV layers) */
    uint32_t linear_flags;        /* linear: enum ir_linear_flags */
    enum ir_op linear_act;        /* linear: unary activation, or IR_OP_INPUT for none */
};

struct ir_node {
    enum ir_op op;
    enum ir_dtype dtype; /* of the result (params: the bound weight's dtype) */
    struct ir_shape shape;
    int n_in;
    int32_t *in;         /* (n_in) operand node indices, all < this node's index */
    struct ir_attrs attrs;
    const char *name;    /* graph-file id or param name (arena string) */
    struct ir_weight weight; /* PARAM only */
    int32_t n_uses;      /* filled by ir_count_uses */
    bool constant;       /* depends on no input: computed once when a plan is prepared */
};

/* Inputs of every token-batch entrypoint (graph.md). */
enum ir_input {
    IR_INPUT_TOKENS,
    IR_INPUT_POSITIONS,
    IR_INPUT_SEQ_SLOTS,
    IR_INPUT_OUT_ROWS,
    IR_INPUT_COUNT
};
extern const char *const ir_input_names[IR_INPUT_COUNT];

struct arena;

struct ir_graph {
    struct arena *arena;     /* owns nodes' operand arrays and strings */
    struct ir_node *nodes;   /* (n_nodes) topological order */
    int32_t n_nodes, cap_nodes;
    int32_t inputs[IR_INPUT_COUNT];
    int32_t output;          /* logits [.., M, vocab] */
    int32_t n_kv_layers;     /* attention nodes */
    int32_t n_conv_layers;   /* short_conv nodes (conv-state layers), set by the importer */
};

/* Conv-state layers of g: its short_conv nodes, counted (the k-th has kv_layer k). */
int32_t ir_count_conv_layers(const struct ir_graph *g);

enum llmopt_status ir_graph_init(struct ir_graph *g, struct llmopt_err *err);
void ir_graph_free(struct ir_graph *g);
/* Appends a node; copies in[] into the arena. Returns its index or IR_NONE (err set). */
int32_t ir_add_node(struct ir_graph *g, enum ir_op op, const int32_t *in, int n_in,
                    struct llmopt_err *err);
const char *ir_strdup(struct ir_graph *g, const char *s);

/* Infers node `idx`'s shape and dtype from its operands and attributes; returns an
 * error naming the node and what disagreed. */
enum llmopt_status ir_infer_node(struct ir_graph *g, int32_t idx, struct llmopt_err *err);
/* Checks the whole graph: operand order, arities, shapes consistent, one output. */
enum llmopt_status ir_verify(const struct ir_graph *g, struct llmopt_err *err);
void ir_count_uses(struct ir_graph *g);
/* Points every use of node `from` (and the output) at node `to`. */
void ir_replace_uses(struct ir_graph *g, int32_t from, int32_t to);
/* Sets node idx's operands (copied into the arena). */
enum llmopt_status ir_set_operands(struct ir_graph *g, int32_t idx, const int32_t *in, int n_in,
                                   struct llmopt_err *err);
/* Weight bytes one decode token reads: every parameter a linear/other op reads whole,
 * one row of an embedding table (decode is bandwidth-bound: this over the measured
 * read bandwidth is its ceiling). KV cache reads are extra and grow with context. */
uint64_t ir_weight_bytes_per_token(const struct ir_graph *g);
/* Nodes a step executes as kernels (not inputs, params, views or constants). */
int32_t ir_count_kernels(const struct ir_graph *g);

void ir_extent_of(const struct ir_shape *s, int64_t n, int64_t m, struct ir_extent *out);
int64_t ir_extent_numel(const struct ir_extent *e);
/* Element strides of a contiguous extent `in` read as `out` under broadcasting: the dims
 * right-aligned, a dim of 1 facing a larger output dim (or a missing leading dim) gets
 * stride 0. strides: out->rank entries. */
void ir_extent_broadcast_strides(const struct ir_extent *in, const struct ir_extent *out,
                                 int64_t *strides);
bool ir_dim_eq(struct ir_dim a, struct ir_dim b);
bool ir_shape_eq(const struct ir_shape *a, const struct ir_shape *b);
/* No dim depends on the token counts N or M: the same extent in every step. */
bool ir_shape_is_static(const struct ir_shape *s);
/* "[1, N, 64]" into buf. */
const char *ir_shape_str(const struct ir_shape *s, char *buf, size_t cap);

void ir_print(const struct ir_graph *g, FILE *out);

#endif
