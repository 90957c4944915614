/* IR tables, construction, shape inference and verification. */
#include "ir/ir.h"

#include "base/arena.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static const char *const dtype_names[IR_DTYPE_COUNT] = {
    [IR_DTYPE_F32] = "f32",   [IR_DTYPE_F16] = "f16",   [IR_DTYPE_BF16] = "bf16",
    [IR_DTYPE_Q8_0] = "q8_0", [IR_DTYPE_Q4_0] = "q4_0", [IR_DTYPE_I32] = "i32",
    [IR_DTYPE_Q4_K] = "q4_k", [IR_DTYPE_Q5_K] = "q5_k", [IR_DTYPE_Q6_K] = "q6_k",
    [IR_DTYPE_Q5_0] = "q5_0", [IR_DTYPE_IQ4_XS] = "iq4_xs",
};
_Static_assert(LLMOPT_ARRAY_LEN(dtype_names) == IR_DTYPE_COUNT, "dtype names");

const char *ir_dtype_name(enum ir_dtype t) {
    return (unsigned)t < IR_DTYPE_COUNT ? dtype_names[t] : "?";
}

bool ir_dtype_parse(const char *name, enum ir_dtype *out) {
    for (int i = 0; i < IR_DTYPE_COUNT; i++)
        if (!strcmp(name, dtype_names[i])) {
            *out = (enum ir_dtype)i;
            return true;
        }
    return false;
}

int ir_dtype_block_elems(enum ir_dtype t) {
    switch (t) {
    case IR_DTYPE_Q8_0:
    case IR_DTYPE_Q4_0:
    case IR_DTYPE_Q5_0: return 32;
    case IR_DTYPE_Q4_K:
    case IR_DTYPE_Q5_K:
    case IR_DTYPE_Q6_K:
    case IR_DTYPE_IQ4_XS: return 256;
    default: return 1;
    }
}

size_t ir_dtype_row_bytes(enum ir_dtype t, int64_t n) {
    switch (t) {
    case IR_DTYPE_F32:
    case IR_DTYPE_I32: return (size_t)n * 4;
    case IR_DTYPE_F16:
    case IR_DTYPE_BF16: return (size_t)n * 2;
    case IR_DTYPE_Q8_0: return (size_t)(n / 32) * 34;
    case IR_DTYPE_Q4_0: return (size_t)(n / 32) * 18;
    case IR_DTYPE_Q5_0: return (size_t)(n / 32) * 22;
    case IR_DTYPE_Q4_K: return (size_t)(n / 256) * 144;
    case IR_DTYPE_Q5_K: return (size_t)(n / 256) * 176;
    case IR_DTYPE_Q6_K: return (size_t)(n / 256) * 210;
    case IR_DTYPE_IQ4_XS: return (size_t)(n / 256) * 136;
    case IR_DTYPE_COUNT: break;
    }
    LLMOPT_ASSERT(0);
    return 0;
}

static const struct {
    const char *name;
    int arity;
} op_info[IR_OP_COUNT] = {
#define IR_OP_INFO(name, str, arity) [IR_OP_##name] = {str, arity},
    IR_OPS(IR_OP_INFO)
#undef IR_OP_INFO
};
_Static_assert(LLMOPT_ARRAY_LEN(op_info) == IR_OP_COUNT, "op table");

const char *const ir_input_names[IR_INPUT_COUNT] = {"tokens", "positions", "seq_slots",
                                                    "out_rows"};

const char *ir_op_name(enum ir_op op) {
    return (unsigned)op < IR_OP_COUNT ? op_info[op].name : "?";
}

bool ir_op_parse(const char *name, enum ir_op *out) {
    for (int i = 0; i < IR_OP_COUNT; i++)
        if (!strcmp(name, op_info[i].name)) {
            *out = (enum ir_op)i;
            return true;
        }
    return false;
}

int ir_op_arity(enum ir_op op) { return op_info[op].arity; }

bool ir_op_is_unary_elementwise(enum ir_op op) { return op >= IR_OP_NEG && op <= IR_OP_SIN; }

bool ir_op_is_binary_elementwise(enum ir_op op) {
    return op >= IR_OP_ADD && op <= IR_OP_MINIMUM;
}

enum llmopt_status ir_graph_init(struct ir_graph *g, struct llmopt_err *err) {
    memset(g, 0, sizeof *g);
    g->arena = malloc(sizeof *g->arena);
    if (!g->arena) return err_set(err, LLMOPT_ERR_NOMEM, "ir: out of memory");
    arena_init(g->arena);
    for (int i = 0; i < IR_INPUT_COUNT; i++) g->inputs[i] = IR_NONE;
    g->output = IR_NONE;
    return LLMOPT_OK;
}

void ir_graph_free(struct ir_graph *g) {
    if (g->arena) {
        arena_free(g->arena);
        free(g->arena);
    }
    free(g->nodes);
    memset(g, 0, sizeof *g);
}

const char *ir_strdup(struct ir_graph *g, const char *s) {
    return arena_strndup(g->arena, s, strlen(s));
}

int32_t ir_add_node(struct ir_graph *g, enum ir_op op, const int32_t *in, int n_in,
                    struct llmopt_err *err) {
    if (g->n_nodes >= IR_MAX_NODES) {
        err_set(err, LLMOPT_ERR_LIMIT, "ir: more than %d nodes", IR_MAX_NODES);
        return IR_NONE;
    }
    if (g->n_nodes == g->cap_nodes) {
        int32_t cap = g->cap_nodes ? g->cap_nodes * 2 : 256;
        struct ir_node *nodes = realloc(g->nodes, (size_t)cap * sizeof *nodes);
        if (!nodes) {
            err_set(err, LLMOPT_ERR_NOMEM, "ir: out of memory");
            return IR_NONE;
        }
        g->nodes = nodes;
        g->cap_nodes = cap;
    }
    int32_t idx = g->n_nodes;
    struct ir_node *n = &g->nodes[idx];
    memset(n, 0, sizeof *n);
    n->op = op;
    n->dtype = IR_DTYPE_F32;
    n->n_in = n_in;
    if (n_in > 0) {
        n->in = arena_alloc(g->arena, (size_t)n_in * sizeof *n->in);
        if (!n->in) {
            err_set(err, LLMOPT_ERR_NOMEM, "ir: out of memory");
            return IR_NONE;
        }
        for (int i = 0; i < n_in; i++) {
            if (in[i] < 0 || in[i] >= idx) {
                err_set(err, LLMOPT_ERR_FORMAT, "ir: node %d (%s) operand %d refers to node %d",
                        idx, ir_op_name(op), i, in[i]);
                return IR_NONE;
            }
            n->in[i] = in[i];
        }
    }
    g->n_nodes++;
    return idx;
}

bool ir_dim_eq(struct ir_dim a, struct ir_dim b) { return a.coef == b.coef && a.sym == b.sym; }

bool ir_shape_eq(const struct ir_shape *a, const struct ir_shape *b) {
    if (a->rank != b->rank) return false;
    for (int i = 0; i < a->rank; i++)
        if (!ir_dim_eq(a->dims[i], b->dims[i])) return false;
    return true;
}

bool ir_shape_is_static(const struct ir_shape *s) {
    for (int i = 0; i < s->rank; i++)
        if (s->dims[i].sym != IR_SYM_NONE) return false;
    return true;
}

const char *ir_shape_str(const struct ir_shape *s, char *buf, size_t cap) {
    size_t pos = 0;
    pos += (size_t)snprintf(buf + pos, cap - pos, "[");
    for (int i = 0; i < s->rank && pos < cap; i++) {
        const struct ir_dim d = s->dims[i];
        const char *sep = i ? ", " : "";
        if (d.sym == IR_SYM_NONE)
            pos += (size_t)snprintf(buf + pos, cap - pos, "%s%" PRId64, sep, d.coef);
        else if (d.coef == 1)
            pos += (size_t)snprintf(buf + pos, cap - pos, "%s%s", sep,
                                    d.sym == IR_SYM_N ? "N" : "M");
        else
            pos += (size_t)snprintf(buf + pos, cap - pos, "%s%" PRId64 "*%s", sep, d.coef,
                                    d.sym == IR_SYM_N ? "N" : "M");
    }
    if (pos < cap) snprintf(buf + pos, cap - pos, "]");
    return buf;
}

void ir_extent_of(const struct ir_shape *s, int64_t n, int64_t m, struct ir_extent *out) {
    out->rank = s->rank;
    for (int i = 0; i < s->rank; i++) {
        const struct ir_dim d = s->dims[i];
        out->dims[i] = d.coef * (d.sym == IR_SYM_N ? n : d.sym == IR_SYM_M ? m : 1);
    }
}

int64_t ir_extent_numel(const struct ir_extent *e) {
    int64_t n = 1;
    for (int i = 0; i < e->rank; i++) n *= e->dims[i];
    return n;
}

void ir_extent_broadcast_strides(const struct ir_extent *in, const struct ir_extent *out,
                                 int64_t *strides) {
    int64_t stride = 1;
    for (int i = out->rank - 1; i >= 0; i--) {
        const int k = i - (out->rank - in->rank);
        if (k < 0) {
            strides[i] = 0;
            continue;
        }
        strides[i] = in->dims[k] == 1 && out->dims[i] != 1 ? 0 : stride;
        stride *= in->dims[k];
    }
}

/* numel as a monomial: coef * N^n_pow * M^m_pow */
struct ir_numel {
    int64_t coef;
    int n_pow, m_pow;
};

static struct ir_numel shape_numel(const struct ir_shape *s) {
    struct ir_numel r = {1, 0, 0};
    for (int i = 0; i < s->rank; i++) {
        r.coef *= s->dims[i].coef;
        r.n_pow += s->dims[i].sym == IR_SYM_N;
        r.m_pow += s->dims[i].sym == IR_SYM_M;
    }
    return r;
}

static struct ir_dim dim_const(int64_t c) { return (struct ir_dim){c, IR_SYM_NONE}; }
static bool dim_is_one(struct ir_dim d) { return d.sym == IR_SYM_NONE && d.coef == 1; }

#define INFER_FAIL(...)                                                            \
    do {                                                                           \
        err_set(err, LLMOPT_ERR_FORMAT, __VA_ARGS__);                              \
        err_prefix(err, "node %d '%s' (%s)", idx, node->name ? node->name : "",     \
                   ir_op_name(node->op));                                          \
        return LLMOPT_ERR_FORMAT;                                                  \
    } while (0)

static enum llmopt_status infer_broadcast(const struct ir_shape *a, const struct ir_shape *b,
                                          struct ir_shape *out) {
    int rank = a->rank > b->rank ? a->rank : b->rank;
    out->rank = rank;
    for (int i = 0; i < rank; i++) {
        int ia = i - (rank - a->rank), ib = i - (rank - b->rank);
        struct ir_dim da = ia >= 0 ? a->dims[ia] : dim_const(1);
        struct ir_dim db = ib >= 0 ? b->dims[ib] : dim_const(1);
        if (ir_dim_eq(da, db) || dim_is_one(db))
            out->dims[i] = da;
        else if (dim_is_one(da))
            out->dims[i] = db;
        else
            return LLMOPT_ERR_FORMAT;
    }
    return LLMOPT_OK;
}

enum llmopt_status ir_infer_node(struct ir_graph *g, int32_t idx, struct llmopt_err *err) {
    struct ir_node *node = &g->nodes[idx];
    struct ir_attrs *at = &node->attrs;
    const int arity = ir_op_arity(node->op);
    char b1[128], b2[128];
    if (arity >= 0 && node->n_in != arity)
        INFER_FAIL("expects %d operands, got %d", arity, node->n_in);
    const struct ir_node *a = node->n_in > 0 ? &g->nodes[node->in[0]] : NULL;
    const struct ir_node *b = node->n_in > 1 ? &g->nodes[node->in[1]] : NULL;
    for (int i = 0; i < node->n_in; i++) {
        const struct ir_node *x = &g->nodes[node->in[i]];
        /* weights keep their stored type: embedding/linear tables, the short_conv kernel,
         * and views of a parameter (which keep its rows, checked below) */
        bool weight_ok = (node->op == IR_OP_EMBEDDING && i == 0) ||
                         (node->op == IR_OP_LINEAR && i == 1) ||
                         (node->op == IR_OP_SHORT_CONV && i == 1) ||
                         (node->op == IR_OP_RESHAPE && (x->op == IR_OP_PARAM || x->op == IR_OP_RESHAPE));
        bool int_ok = (node->op == IR_OP_EMBEDDING && i == 1) ||
                      (node->op == IR_OP_SELECT_ROWS && i == 1) ||
                      (node->op == IR_OP_ATTENTION && i >= 3) ||
                      (node->op == IR_OP_SHORT_CONV && i >= 2) || node->op == IR_OP_CAST ||
                      node->op == IR_OP_RESHAPE;
        if (x->dtype == IR_DTYPE_I32 ? !int_ok : (x->dtype != IR_DTYPE_F32 && !weight_ok))
            INFER_FAIL("operand %d '%s' has dtype %s, which this op does not take", i,
                       x->name ? x->name : "", ir_dtype_name(x->dtype));
    }
    struct ir_shape *out = &node->shape;
    enum ir_dtype dtype = IR_DTYPE_F32;
    switch (node->op) {
    case IR_OP_INPUT:
    case IR_OP_PARAM:
        return LLMOPT_OK; /* set by the importer */
    case IR_OP_CONST:
        out->rank = 0;
        node->constant = true;
        break;
    case IR_OP_ROPE_FREQS:
        node->constant = true;
        if (at->axis <= 0 || at->axis % 2) INFER_FAIL("dim must be even and positive");
        out->rank = 1;
        out->dims[0] = dim_const(at->axis / 2);
        break;
    case IR_OP_EMBEDDING: {
        if (a->shape.rank != 2) INFER_FAIL("table must be 2-D");
        if (b->shape.rank + 1 > IR_MAX_RANK) INFER_FAIL("ids rank too large");
        if (b->dtype != IR_DTYPE_I32) INFER_FAIL("ids must be i32");
        *out = b->shape;
        out->dims[out->rank++] = a->shape.dims[1];
        break;
    }
    case IR_OP_LINEAR: {
        uint32_t fl = at->linear_flags;
        int want_in = 2 + !!(fl & IR_LINEAR_BIAS) + !!(fl & IR_LINEAR_GATE) + !!(fl & IR_LINEAR_RESIDUAL);
        if (node->n_in == 3 && fl == 0) {
            at->linear_flags = fl = IR_LINEAR_BIAS; /* graph files give a bias as operand 3 */
            want_in = 3;
        }
        if (node->n_in != want_in) INFER_FAIL("takes %d operands for its epilogue, got %d", want_in, node->n_in);
        if (at->linear_act != IR_OP_INPUT && !ir_op_is_unary_elementwise(at->linear_act))
            INFER_FAIL("epilogue activation %s is not a unary op", ir_op_name(at->linear_act));
        if (b->shape.rank != 2) INFER_FAIL("weight must be 2-D, is %s",
                                           ir_shape_str(&b->shape, b1, sizeof b1));
        if (a->shape.rank < 1 || !ir_dim_eq(a->shape.dims[a->shape.rank - 1], b->shape.dims[1]))
            INFER_FAIL("x %s does not match weight %s", ir_shape_str(&a->shape, b1, sizeof b1),
                       ir_shape_str(&b->shape, b2, sizeof b2));
        if (b->shape.dims[1].coef % ir_dtype_block_elems(b->dtype))
            INFER_FAIL("weight row length is not a multiple of the %s block",
                       ir_dtype_name(b->dtype));
        int k = 2;
        if (fl & IR_LINEAR_BIAS) {
            const struct ir_node *bias = &g->nodes[node->in[k++]];
            if (bias->shape.rank != 1 || !ir_dim_eq(bias->shape.dims[0], b->shape.dims[0]))
                INFER_FAIL("bias shape mismatch");
        }
        *out = a->shape;
        out->dims[out->rank - 1] = b->shape.dims[0];
        for (; k < node->n_in; k++)
            if (!ir_shape_eq(&g->nodes[node->in[k]].shape, out))
                INFER_FAIL("epilogue operand %d shape %s differs from the output's %s", k,
                           ir_shape_str(&g->nodes[node->in[k]].shape, b1, sizeof b1),
                           ir_shape_str(out, b2, sizeof b2));
        break;
    }
    case IR_OP_ROPE: {
        struct ir_shape tmp;
        const struct ir_shape *c = &g->nodes[node->in[1]].shape, *s = &g->nodes[node->in[2]].shape;
        if (a->shape.rank < 1 || a->shape.dims[a->shape.rank - 1].sym ||
            a->shape.dims[a->shape.rank - 1].coef % 2)
            INFER_FAIL("x needs an even last dimension");
        if (!ir_shape_eq(c, s) || infer_broadcast(&a->shape, c, &tmp) || !ir_shape_eq(&tmp, &a->shape))
            INFER_FAIL("cos/sin %s must broadcast to x %s", ir_shape_str(c, b1, sizeof b1),
                       ir_shape_str(&a->shape, b2, sizeof b2));
        *out = a->shape;
        break;
    }
    case IR_OP_MATMUL: {
        const struct ir_shape *sa = &a->shape, *sb = &b->shape;
        if (sa->rank < 2 || sb->rank < 2) INFER_FAIL("operands must be at least 2-D");
        if (!ir_dim_eq(sa->dims[sa->rank - 1], sb->dims[sb->rank - 2]))
            INFER_FAIL("inner dims differ: %s x %s", ir_shape_str(sa, b1, sizeof b1),
                       ir_shape_str(sb, b2, sizeof b2));
        struct ir_shape ba = *sa, bb = *sb;
        ba.rank -= 2;
        bb.rank -= 2;
        if (infer_broadcast(&ba, &bb, out)) INFER_FAIL("batch dims do not broadcast");
        if (out->rank + 2 > IR_MAX_RANK) INFER_FAIL("rank too large");
        out->dims[out->rank++] = sa->dims[sa->rank - 2];
        out->dims[out->rank++] = sb->dims[sb->rank - 1];
        break;
    }
    case IR_OP_MEAN:
    case IR_OP_SUM:
    case IR_OP_MAX: {
        bool reduced[IR_MAX_RANK] = {0};
        for (int i = 0; i < at->n_axes; i++) {
            if (at->axes[i] < 0 || at->axes[i] >= a->shape.rank) INFER_FAIL("axis out of range");
            reduced[at->axes[i]] = true;
        }
        out->rank = 0;
        for (int i = 0; i < a->shape.rank; i++) {
            if (!reduced[i])
                out->dims[out->rank++] = a->shape.dims[i];
            else if (at->keepdim)
                out->dims[out->rank++] = dim_const(1);
        }
        break;
    }
    case IR_OP_SOFTMAX:
        if (at->axis < 0 || at->axis >= a->shape.rank) INFER_FAIL("axis out of range");
        *out = a->shape;
        break;
    case IR_OP_RMS_NORM:
    case IR_OP_LAYER_NORM:
        if (a->shape.rank < 1 || b->shape.rank != 1 ||
            !ir_dim_eq(b->shape.dims[0], a->shape.dims[a->shape.rank - 1]))
            INFER_FAIL("weight %s does not match x %s", ir_shape_str(&b->shape, b1, sizeof b1),
                       ir_shape_str(&a->shape, b2, sizeof b2));
        *out = a->shape;
        break;
    case IR_OP_RESHAPE: {
        struct ir_numel x = shape_numel(&a->shape), y = shape_numel(&at->target);
        if (x.coef != y.coef || x.n_pow != y.n_pow || x.m_pow != y.m_pow)
            INFER_FAIL("cannot reshape %s to %s", ir_shape_str(&a->shape, b1, sizeof b1),
                       ir_shape_str(&at->target, b2, sizeof b2));
        *out = at->target;
        dtype = a->dtype;
        if (dtype != IR_DTYPE_F32 && dtype != IR_DTYPE_I32 &&
            (!a->shape.rank || !out->rank ||
             !ir_dim_eq(a->shape.dims[a->shape.rank - 1], out->dims[out->rank - 1])))
            INFER_FAIL("a %s weight keeps its rows: cannot reshape %s to %s", ir_dtype_name(dtype),
                       ir_shape_str(&a->shape, b1, sizeof b1), ir_shape_str(&at->target, b2, sizeof b2));
        break;
    }
    case IR_OP_PERMUTE: {
        if (at->n_axes != a->shape.rank) INFER_FAIL("perm has %d axes for rank %d", at->n_axes,
                                                    a->shape.rank);
        bool seen[IR_MAX_RANK] = {0};
        out->rank = a->shape.rank;
        for (int i = 0; i < at->n_axes; i++) {
            int64_t p = at->axes[i];
            if (p < 0 || p >= a->shape.rank || seen[p]) INFER_FAIL("perm is not a permutation");
            seen[p] = true;
            out->dims[i] = a->shape.dims[p];
        }
        break;
    }
    case IR_OP_EXPAND: {
        const struct ir_shape *t = &at->target;
        if (t->rank < a->shape.rank) INFER_FAIL("expand to a lower rank");
        for (int i = 0; i < t->rank; i++) {
            int ia = i - (t->rank - a->shape.rank);
            if (ia >= 0 && !ir_dim_eq(a->shape.dims[ia], t->dims[i]) &&
                !dim_is_one(a->shape.dims[ia]))
                INFER_FAIL("cannot expand %s to %s", ir_shape_str(&a->shape, b1, sizeof b1),
                           ir_shape_str(t, b2, sizeof b2));
        }
        *out = *t;
        break;
    }
    case IR_OP_SLICE: {
        if (at->axis < 0 || at->axis >= a->shape.rank) INFER_FAIL("axis out of range");
        if (at->step < 1) INFER_FAIL("step must be >= 1");
        struct ir_dim d = a->shape.dims[at->axis];
        *out = a->shape;
        if (at->start.sym != IR_SYM_NONE || at->start.coef < 0) INFER_FAIL("bad slice start");
        if (d.sym != IR_SYM_NONE) {
            /* a symbolic axis may only be kept whole */
            bool to_end = (at->end.sym == IR_SYM_NONE && at->end.coef >= ((int64_t)1 << 62)) ||
                          ir_dim_eq(at->end, d);
            if (at->start.coef != 0 || at->step != 1 || !to_end)
                INFER_FAIL("only a whole slice of a symbolic dimension is supported");
        } else {
            if (at->end.sym != IR_SYM_NONE) INFER_FAIL("symbolic end on a fixed dimension");
            int64_t end = at->end.coef < d.coef ? at->end.coef : d.coef;
            int64_t len = end > at->start.coef ? (end - at->start.coef + at->step - 1) / at->step : 0;
            out->dims[at->axis] = dim_const(len);
        }
        break;
    }
    case IR_OP_CONCAT: {
        if (node->n_in < 1) INFER_FAIL("needs operands");
        if (at->axis < 0 || at->axis >= a->shape.rank) INFER_FAIL("axis out of range");
        *out = a->shape;
        for (int i = 1; i < node->n_in; i++) {
            const struct ir_shape *s = &g->nodes[node->in[i]].shape;
            if (s->rank != a->shape.rank) INFER_FAIL("operand ranks differ");
            for (int k = 0; k < s->rank; k++) {
                if (k == at->axis) continue;
                if (!ir_dim_eq(s->dims[k], a->shape.dims[k])) INFER_FAIL("operand %d shape differs", i);
            }
            struct ir_dim *d = &out->dims[at->axis];
            struct ir_dim e = s->dims[at->axis];
            if (d->sym != e.sym) INFER_FAIL("concat of fixed and symbolic dimensions");
            d->coef += e.coef;
        }
        break;
    }
    case IR_OP_CAST:
        *out = a->shape;
        dtype = at->cast_to;
        if (dtype != IR_DTYPE_F32 && dtype != IR_DTYPE_I32) INFER_FAIL("cast only to f32/i32");
        break;
    case IR_OP_SELECT_ROWS:
        if (a->shape.rank < 2 || b->shape.rank != 1 || b->dtype != IR_DTYPE_I32)
            INFER_FAIL("needs x [..., rows, D] and rows i32 [M]");
        *out = a->shape;
        out->dims[out->rank - 2] = b->shape.dims[0];
        break;
    case IR_OP_ATTENTION: {
        const struct ir_shape *q = &a->shape, *k = &b->shape, *v = &g->nodes[node->in[2]].shape;
        if (q->rank != 4 || k->rank != 4 || !ir_shape_eq(k, v) || !dim_is_one(q->dims[0]) ||
            !ir_dim_eq(q->dims[2], k->dims[2]) || !ir_dim_eq(q->dims[3], k->dims[3]) ||
            q->dims[1].sym || k->dims[1].sym || q->dims[3].sym)
            INFER_FAIL("needs q [1,H,N,Dh], k and v [1,Hkv,N,Dh]; got q %s k %s",
                       ir_shape_str(q, b1, sizeof b1), ir_shape_str(k, b2, sizeof b2));
        if (q->dims[1].coef % k->dims[1].coef) INFER_FAIL("H is not a multiple of Hkv");
        for (int i = 3; i < 5; i++) {
            const struct ir_node *x = &g->nodes[node->in[i]];
            if (x->dtype != IR_DTYPE_I32 || x->shape.rank != 1 || !ir_dim_eq(x->shape.dims[0], q->dims[2]))
                INFER_FAIL("positions and seq_slots must be i32 [N]");
        }
        out->rank = 4;
        out->dims[0] = q->dims[0];
        out->dims[1] = q->dims[2];
        out->dims[2] = q->dims[1];
        out->dims[3] = q->dims[3];
        break;
    }
    case IR_OP_SHORT_CONV: {
        /* x [..., N, C] (leading dims 1), w [C, L] or [C, 1, L] (PyTorch's depthwise
         * Conv1d layout), positions and seq_slots i32 [N] */
        const struct ir_shape *x = &a->shape, *w = &b->shape;
        bool ok = x->rank >= 2 && (w->rank == 2 || (w->rank == 3 && dim_is_one(w->dims[1]))) &&
                  !w->dims[0].sym && !w->dims[w->rank - 1].sym && w->dims[w->rank - 1].coef >= 1 &&
                  !x->dims[x->rank - 1].sym && ir_dim_eq(x->dims[x->rank - 1], w->dims[0]);
        for (int d = 0; ok && d + 2 < x->rank; d++) ok = dim_is_one(x->dims[d]);
        if (!ok)
            INFER_FAIL("needs x [1, N, C] and w [C, L] or [C, 1, L]; got x %s w %s", ir_shape_str(x, b1, sizeof b1),
                       ir_shape_str(w, b2, sizeof b2));
        for (int i = 2; i < 4; i++) {
            const struct ir_node *p = &g->nodes[node->in[i]];
            if (p->dtype != IR_DTYPE_I32 || p->shape.rank != 1 || !ir_dim_eq(p->shape.dims[0], x->dims[x->rank - 2]))
                INFER_FAIL("positions and seq_slots must be i32 [N]");
        }
        *out = *x;
        break;
    }
    default:
        if (ir_op_is_unary_elementwise(node->op)) {
            *out = a->shape;
        } else if (ir_op_is_binary_elementwise(node->op)) {
            if (infer_broadcast(&a->shape, &b->shape, out))
                INFER_FAIL("shapes %s and %s do not broadcast",
                           ir_shape_str(&a->shape, b1, sizeof b1),
                           ir_shape_str(&b->shape, b2, sizeof b2));
        } else {
            INFER_FAIL("no shape rule");
        }
    }
    node->dtype = dtype;
    return LLMOPT_OK;
}

enum llmopt_status ir_verify(const struct ir_graph *g, struct llmopt_err *err) {
    for (int i = 0; i < IR_INPUT_COUNT; i++)
        if (g->inputs[i] == IR_NONE)
            return err_set(err, LLMOPT_ERR_FORMAT, "ir: input '%s' is missing", ir_input_names[i]);
    if (g->output == IR_NONE || g->output >= g->n_nodes)
        return err_set(err, LLMOPT_ERR_FORMAT, "ir: no output");
    int32_t kv = 0, conv = 0;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const struct ir_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k] < 0 || n->in[k] >= i)
                return err_set(err, LLMOPT_ERR_FORMAT,
                               "ir: node %d (%s) operand %d is not defined before it", i,
                               ir_op_name(n->op), k);
        if (n->op == IR_OP_PARAM && !n->weight.data)
            return err_set(err, LLMOPT_ERR_BIND, "ir: parameter '%s' is not bound", n->name);
        if (n->op == IR_OP_ATTENTION && n->attrs.kv_layer != kv++)
            return err_set(err, LLMOPT_ERR_FORMAT, "ir: attention node %d has kv layer %d", i,
                           n->attrs.kv_layer);
        if (n->op == IR_OP_SHORT_CONV && n->attrs.kv_layer != conv++)
            return err_set(err, LLMOPT_ERR_FORMAT, "ir: short_conv node %d has conv layer %d, expected %d",
                           i, n->attrs.kv_layer, conv - 1);
    }
    if (kv != g->n_kv_layers)
        return err_set(err, LLMOPT_ERR_FORMAT, "ir: %d attention nodes, %d kv layers", kv,
                       g->n_kv_layers);
    const struct ir_shape *o = &g->nodes[g->output].shape;
    if (o->rank < 2 || o->dims[o->rank - 2].sym != IR_SYM_M)
        return err_set(err, LLMOPT_ERR_FORMAT, "ir: output logits must be [.., M, vocab]");
    for (int i = 0; i < o->rank - 2; i++)
        if (!dim_is_one(o->dims[i]))
            return err_set(err, LLMOPT_ERR_FORMAT, "ir: output logits must be [.., M, vocab]");
    return LLMOPT_OK;
}

int32_t ir_count_conv_layers(const struct ir_graph *g) {
    int32_t n = 0;
    for (int32_t i = 0; i < g->n_nodes; i++) n += g->nodes[i].op == IR_OP_SHORT_CONV;
    return n;
}

void ir_count_uses(struct ir_graph *g) {
    for (int32_t i = 0; i < g->n_nodes; i++) g->nodes[i].n_uses = 0;
    for (int32_t i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++) g->nodes[g->nodes[i].in[k]].n_uses++;
    if (g->output != IR_NONE) g->nodes[g->output].n_uses++;
}

void ir_replace_uses(struct ir_graph *g, int32_t from, int32_t to) {
    for (int32_t i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++)
            if (g->nodes[i].in[k] == from) g->nodes[i].in[k] = to;
    if (g->output == from) g->output = to;
}

enum llmopt_status ir_set_operands(struct ir_graph *g, int32_t idx, const int32_t *in, int n_in,
                                   struct llmopt_err *err) {
    int32_t *ops = n_in ? arena_alloc(g->arena, (size_t)n_in * sizeof *ops) : NULL;
    if (n_in && !ops) return err_set(err, LLMOPT_ERR_NOMEM, "ir: out of memory");
    for (int k = 0; k < n_in; k++) {
        LLMOPT_ASSERT(in[k] >= 0 && in[k] < idx);
        ops[k] = in[k];
    }
    g->nodes[idx].in = ops;
    g->nodes[idx].n_in = n_in;
    return LLMOPT_OK;
}

uint64_t ir_weight_bytes_per_token(const struct ir_graph *g) {
    uint64_t total = 0;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const struct ir_node *p = &g->nodes[i];
        if (p->op != IR_OP_PARAM) continue;
        bool only_gathered = p->n_uses > 0;
        for (int32_t j = i + 1; j < g->n_nodes && only_gathered; j++)
            for (int k = 0; k < g->nodes[j].n_in; k++)
                if (g->nodes[j].in[k] == i && !(g->nodes[j].op == IR_OP_EMBEDDING && k == 0)) only_gathered = false;
        if (only_gathered && p->shape.rank == 2)
            total += ir_dtype_row_bytes(p->weight.dtype, p->shape.dims[1].coef);
        else
            total += p->weight.n_bytes;
    }
    return total;
}

int32_t ir_count_kernels(const struct ir_graph *g) {
    int32_t n = 0;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const struct ir_node *node = &g->nodes[i];
        enum ir_op op = node->op;
        n += !(op == IR_OP_INPUT || op == IR_OP_PARAM || op == IR_OP_RESHAPE || node->constant);
    }
    return n;
}

void ir_print(const struct ir_graph *g, FILE *out) {
    char buf[160];
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const struct ir_node *n = &g->nodes[i];
        fprintf(out, "%%%-5d = %-11s", i, ir_op_name(n->op));
        for (int k = 0; k < n->n_in; k++) fprintf(out, "%s%%%d", k ? ", " : " ", n->in[k]);
        fprintf(out, "  : %s %s", ir_dtype_name(n->dtype), ir_shape_str(&n->shape, buf, sizeof buf));
        switch (n->op) {
        case IR_OP_CONST: fprintf(out, "  value=%g", n->attrs.value); break;
        case IR_OP_RMS_NORM:
        case IR_OP_LAYER_NORM: fprintf(out, "  eps=%g", n->attrs.value); break;
        case IR_OP_ATTENTION:
            fprintf(out, "  kv_layer=%d scale=%g window=%" PRId64, n->attrs.kv_layer,
                    n->attrs.value, n->attrs.window);
            break;
        case IR_OP_SHORT_CONV: fprintf(out, "  conv_layer=%d", n->attrs.kv_layer); break;
        case IR_OP_SOFTMAX:
        case IR_OP_CONCAT: fprintf(out, "  dim=%" PRId64, n->attrs.axis); break;
        case IR_OP_LINEAR:
            if (n->attrs.linear_act != IR_OP_INPUT) fprintf(out, "  act=%s", ir_op_name(n->attrs.linear_act));
            if (n->attrs.linear_flags & IR_LINEAR_BIAS) fprintf(out, " +bias");
            if (n->attrs.linear_flags & IR_LINEAR_GATE) fprintf(out, " *gate");
            if (n->attrs.linear_flags & IR_LINEAR_RESIDUAL) fprintf(out, " +residual");
            break;
        case IR_OP_SLICE:
            fprintf(out, "  dim=%" PRId64 " start=%" PRId64 " end=%" PRId64 "%s step=%" PRId64,
                    n->attrs.axis, n->attrs.start.coef, n->attrs.end.coef,
                    n->attrs.end.sym ? "*N" : "", n->attrs.step);
            break;
        default: break;
        }
        if (n->constant) fprintf(out, "  (constant)");
        if (n->name) fprintf(out, "  ; %s", n->name);
        if (n->op == IR_OP_PARAM && n->weight.source && strcmp(n->weight.source, n->name))
            fprintf(out, " <- %s", n->weight.source);
        fputc('\n', out);
    }
    fprintf(out, "output: %%%d\n", g->output);
}
