#include "ir/import.h"

#include "base/strmap.h"
#include "ir/expr.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define IMPORT_MAX_LAYERS 4096
#define IMPORT_MAX_CARRY 16
#define IMPORT_NAME_MAX 512

bool ir_hparams_get(const struct ir_hparams *hp, const char *name, double *value) {
    for (int i = 0; i < hp->n; i++)
        if (!strcmp(hp->names[i], name)) {
            *value = hp->values[i];
            return true;
        }
    return false;
}

bool ir_hparams_lookup(void *ctx, const char *name, size_t len, double *value) {
    const struct ir_hparams *hp = ctx;
    for (int i = 0; i < hp->n; i++)
        if (strlen(hp->names[i]) == len && !memcmp(hp->names[i], name, len)) {
            *value = hp->values[i];
            return true;
        }
    return false;
}

static enum llmopt_status eval_json(const json_t *v, const struct ir_hparams *hp,
                                    struct expr_value *out, struct llmopt_err *err) {
    if (json_is_integer(v)) {
        *out = (struct expr_value){(double)json_integer_value(v), 0, 0};
        return LLMOPT_OK;
    }
    if (json_is_real(v)) {
        *out = (struct expr_value){json_real_value(v), 0, 0};
        return LLMOPT_OK;
    }
    if (json_is_string(v))
        return expr_eval(json_string_value(v), ir_hparams_lookup, (void *)hp, out, err);
    return err_set(err, LLMOPT_ERR_FORMAT, "expected a number or an expression string");
}

enum llmopt_status ir_dim_from_json(const json_t *v, const struct ir_hparams *hp,
                                    struct ir_dim *out, struct llmopt_err *err) {
    struct expr_value e;
    enum llmopt_status st = eval_json(v, hp, &e, err);
    if (st) return st;
    /* Huge integers (slice ends like INT64_MAX) exceed double's exact range: keep as is. */
    if (json_is_integer(v) && !e.n_pow && !e.m_pow) {
        *out = (struct ir_dim){json_integer_value(v), IR_SYM_NONE};
        return LLMOPT_OK;
    }
    bool ok = e.coef == floor(e.coef) && fabs(e.coef) < 9.0e15 && e.n_pow >= 0 &&
              e.m_pow >= 0 && e.n_pow + e.m_pow <= 1;
    if (!ok)
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "dimension '%s' is not an integer, c*N or c*M (value %g N^%d M^%d)",
                       json_is_string(v) ? json_string_value(v) : "?", e.coef, e.n_pow, e.m_pow);
    *out = (struct ir_dim){(int64_t)e.coef,
                           e.n_pow ? IR_SYM_N : e.m_pow ? IR_SYM_M : IR_SYM_NONE};
    return LLMOPT_OK;
}

enum llmopt_status ir_number_from_json(const json_t *v, const struct ir_hparams *hp,
                                       double *out, struct llmopt_err *err) {
    struct expr_value e;
    enum llmopt_status st = eval_json(v, hp, &e, err);
    if (st) return st;
    if (e.n_pow || e.m_pow) return err_set(err, LLMOPT_ERR_FORMAT, "number depends on N or M");
    *out = e.coef;
    return LLMOPT_OK;
}

static enum llmopt_status shape_from_json(const json_t *arr, const struct ir_hparams *hp,
                                          struct ir_shape *out, struct llmopt_err *err) {
    if (!json_is_array(arr) || json_array_size(arr) > IR_MAX_RANK)
        return err_set(err, LLMOPT_ERR_FORMAT, "shape must be an array of at most %d dims",
                       IR_MAX_RANK);
    out->rank = (int)json_array_size(arr);
    for (int i = 0; i < out->rank; i++) {
        enum llmopt_status st = ir_dim_from_json(json_array_get(arr, (size_t)i), hp,
                                                 &out->dims[i], err);
        if (st) return st;
        if (out->dims[i].coef < 0) return err_set(err, LLMOPT_ERR_FORMAT, "negative dimension");
    }
    return LLMOPT_OK;
}

/* The importer's state: hyper-parameters plus the current layer index `i`. */
struct importer {
    struct ir_graph *g;
    struct ir_hparams hp;      /* graph hparams + loop index */
    const json_t *param_decls; /* name -> decl object */
    ir_bind_param_fn bind;
    void *bind_ctx;
    struct strmap outer;       /* outer value names -> node */
    struct strmap local;       /* body-local names -> node, for the current layer */
    struct strmap params;      /* instantiated param names -> node */
    bool in_body;
    int layer;
    int n_carry;
    const char *carry_names[IMPORT_MAX_CARRY];
    int32_t carry_vals[IMPORT_MAX_CARRY];
};

/* "model.layers.{i}.x" -> "model.layers.3.x" */
bool ir_substitute_layer(const char *tmpl, int layer, char *out, size_t cap) {
    size_t o = 0;
    for (const char *p = tmpl; *p; p++) {
        if (!strncmp(p, "{i}", 3)) {
            if (layer < 0) return false;
            int w = snprintf(out + o, cap - o, "%d", layer);
            if (w < 0 || (size_t)w >= cap - o) return false;
            o += (size_t)w;
            p += 2;
        } else {
            if (o + 1 >= cap) return false;
            out[o++] = *p;
        }
    }
    out[o] = 0;
    return true;
}

static enum llmopt_status instantiate_param(struct importer *im, const char *tmpl,
                                            const json_t *decl, int32_t *out,
                                            struct llmopt_err *err) {
    char name[IMPORT_NAME_MAX];
    if (!ir_substitute_layer(tmpl, im->in_body ? im->layer : -1, name, sizeof name))
        return err_set(err, LLMOPT_ERR_FORMAT, "param '%s': '{i}' outside a repeat or name too long",
                       tmpl);
    if (strmap_get(&im->params, name, strlen(name), out)) return LLMOPT_OK;
    struct ir_shape shape;
    enum llmopt_status st = shape_from_json(json_object_get(decl, "shape"), &im->hp, &shape, err);
    if (st) {
        err_prefix(err, "param '%s'", name);
        return st;
    }
    for (int i = 0; i < shape.rank; i++)
        if (shape.dims[i].sym)
            return err_set(err, LLMOPT_ERR_FORMAT, "param '%s' has a dimension in N or M", name);
    int32_t idx = ir_add_node(im->g, IR_OP_PARAM, NULL, 0, err);
    if (idx == IR_NONE) return err->status;
    struct ir_node *n = &im->g->nodes[idx];
    n->name = ir_strdup(im->g, name);
    n->shape = shape;
    st = im->bind(im->bind_ctx, tmpl, im->in_body ? im->layer : -1, &shape, &n->weight, err);
    if (st) return st;
    n->dtype = n->weight.dtype;
    if (!strmap_put(&im->params, name, strlen(name), idx))
        return err_set(err, LLMOPT_ERR_NOMEM, "import: out of memory");
    *out = idx;
    return LLMOPT_OK;
}

static enum llmopt_status resolve_value(struct importer *im, const char *name, int32_t *out,
                                        struct llmopt_err *err) {
    size_t len = strlen(name);
    if (im->in_body) {
        if (strmap_get(&im->local, name, len, out)) return LLMOPT_OK;
        for (int i = 0; i < im->n_carry; i++)
            if (!strcmp(im->carry_names[i], name)) {
                *out = im->carry_vals[i];
                return LLMOPT_OK;
            }
    }
    if (strmap_get(&im->outer, name, len, out)) return LLMOPT_OK;
    const json_t *decl = json_object_get(im->param_decls, name);
    if (decl) return instantiate_param(im, name, decl, out, err);
    return err_set(err, LLMOPT_ERR_FORMAT, "value '%s' is not defined", name);
}

static int64_t norm_axis(int64_t axis, int rank) { return axis < 0 ? axis + rank : axis; }

static enum llmopt_status attr_number(struct importer *im, const json_t *attrs, const char *key,
                                      bool required, double dflt, double *out,
                                      struct llmopt_err *err) {
    const json_t *v = json_object_get(attrs, key);
    if (!v) {
        if (required) return err_set(err, LLMOPT_ERR_FORMAT, "attribute '%s' missing", key);
        *out = dflt;
        return LLMOPT_OK;
    }
    enum llmopt_status st = ir_number_from_json(v, &im->hp, out, err);
    if (st) err_prefix(err, "attribute '%s'", key);
    return st;
}

static enum llmopt_status attr_int(struct importer *im, const json_t *attrs, const char *key,
                                   bool required, int64_t dflt, int64_t *out,
                                   struct llmopt_err *err) {
    const json_t *v = json_object_get(attrs, key);
    if (!v) {
        if (required) return err_set(err, LLMOPT_ERR_FORMAT, "attribute '%s' missing", key);
        *out = dflt;
        return LLMOPT_OK;
    }
    struct ir_dim d;
    enum llmopt_status st = ir_dim_from_json(v, &im->hp, &d, err);
    if (st) {
        err_prefix(err, "attribute '%s'", key);
        return st;
    }
    if (d.sym) return err_set(err, LLMOPT_ERR_FORMAT, "attribute '%s' depends on N or M", key);
    *out = d.coef;
    return LLMOPT_OK;
}

static enum llmopt_status attr_axes(const json_t *attrs, const char *key, int rank,
                                    struct ir_attrs *at, struct llmopt_err *err) {
    const json_t *v = json_object_get(attrs, key);
    if (json_is_integer(v)) {
        at->n_axes = 1;
        at->axes[0] = norm_axis(json_integer_value(v), rank);
        return LLMOPT_OK;
    }
    if (!json_is_array(v) || json_array_size(v) > IR_MAX_RANK)
        return err_set(err, LLMOPT_ERR_FORMAT, "attribute '%s' must be a list of axes", key);
    at->n_axes = (int)json_array_size(v);
    for (int i = 0; i < at->n_axes; i++) {
        const json_t *a = json_array_get(v, (size_t)i);
        if (!json_is_integer(a))
            return err_set(err, LLMOPT_ERR_FORMAT, "attribute '%s' must hold integers", key);
        at->axes[i] = norm_axis(json_integer_value(a), rank);
    }
    return LLMOPT_OK;
}

static enum llmopt_status parse_attrs(struct importer *im, struct ir_node *n, const json_t *attrs,
                                      struct llmopt_err *err) {
    struct ir_graph *g = im->g;
    struct ir_attrs *at = &n->attrs;
    int rank0 = n->n_in > 0 ? g->nodes[n->in[0]].shape.rank : 0;
    int64_t tmp = 0;
    enum llmopt_status st = LLMOPT_OK;
    switch (n->op) {
    case IR_OP_CONST: return attr_number(im, attrs, "value", true, 0, &at->value, err);
    case IR_OP_ROPE_FREQS:
        if ((st = attr_int(im, attrs, "dim", true, 0, &at->axis, err))) return st;
        return attr_number(im, attrs, "theta", true, 0, &at->value, err);
    case IR_OP_MEAN:
    case IR_OP_SUM:
    case IR_OP_MAX:
        if ((st = attr_axes(attrs, "dims", rank0, at, err))) return st;
        if ((st = attr_int(im, attrs, "keepdim", false, 0, &tmp, err))) return st;
        at->keepdim = tmp != 0;
        return LLMOPT_OK;
    case IR_OP_SOFTMAX:
    case IR_OP_CONCAT:
        if ((st = attr_int(im, attrs, "dim", true, 0, &at->axis, err))) return st;
        at->axis = norm_axis(at->axis, rank0);
        return LLMOPT_OK;
    case IR_OP_RMS_NORM:
    case IR_OP_LAYER_NORM: return attr_number(im, attrs, "eps", true, 0, &at->value, err);
    case IR_OP_RESHAPE:
    case IR_OP_EXPAND:
        st = shape_from_json(json_object_get(attrs, "shape"), &im->hp, &at->target, err);
        if (st) err_prefix(err, "attribute 'shape'");
        return st;
    case IR_OP_PERMUTE: return attr_axes(attrs, "perm", rank0, at, err);
    case IR_OP_SLICE: {
        if ((st = attr_int(im, attrs, "dim", true, 0, &at->axis, err))) return st;
        at->axis = norm_axis(at->axis, rank0);
        if ((st = attr_int(im, attrs, "step", false, 1, &at->step, err))) return st;
        const json_t *s = json_object_get(attrs, "start");
        const json_t *e = json_object_get(attrs, "end");
        at->start = (struct ir_dim){0, IR_SYM_NONE};
        at->end = (struct ir_dim){INT64_MAX, IR_SYM_NONE};
        if (s && !json_is_null(s) && (st = ir_dim_from_json(s, &im->hp, &at->start, err))) return st;
        if (e && !json_is_null(e) && (st = ir_dim_from_json(e, &im->hp, &at->end, err))) return st;
        /* Negative starts/ends count from the end of a fixed dimension. */
        if (at->axis >= 0 && at->axis < rank0) {
            struct ir_dim d = g->nodes[n->in[0]].shape.dims[at->axis];
            if (!d.sym && !at->start.sym && at->start.coef < 0) at->start.coef += d.coef;
            if (!d.sym && !at->end.sym && at->end.coef < 0) at->end.coef += d.coef;
            if (at->start.coef < 0) at->start.coef = 0;
        }
        return LLMOPT_OK;
    }
    case IR_OP_CAST: {
        const char *dt = json_string_value(json_object_get(attrs, "dtype"));
        if (!dt || !ir_dtype_parse(dt, &at->cast_to))
            return err_set(err, LLMOPT_ERR_FORMAT, "attribute 'dtype' missing or unknown");
        return LLMOPT_OK;
    }
    case IR_OP_ATTENTION:
        if ((st = attr_number(im, attrs, "scale", true, 0, &at->value, err))) return st;
        if ((st = attr_int(im, attrs, "window", false, 0, &at->window, err))) return st;
        at->kv_layer = g->n_kv_layers++;
        return LLMOPT_OK;
    case IR_OP_SHORT_CONV: at->kv_layer = g->n_conv_layers++; return LLMOPT_OK;
    default: return LLMOPT_OK;
    }
}

static enum llmopt_status define_value(struct importer *im, const char *id, int32_t idx,
                                       struct llmopt_err *err) {
    struct strmap *m = im->in_body ? &im->local : &im->outer;
    int32_t old;
    if (strmap_get(m, id, strlen(id), &old))
        return err_set(err, LLMOPT_ERR_FORMAT, "value id '%s' defined twice", id);
    if (!strmap_put(m, id, strlen(id), idx))
        return err_set(err, LLMOPT_ERR_NOMEM, "import: out of memory");
    return LLMOPT_OK;
}

static enum llmopt_status import_nodes(struct importer *im, const json_t *nodes,
                                       struct llmopt_err *err);

/* The body a layer runs: "body"/"yield" of a plain repeat, or for a repeat with "kind"
 * and "bodies" the body whose key is the kind expression's value for this layer. */
static enum llmopt_status layer_body(struct importer *im, const json_t *node, int layer,
                                     const json_t **body, const json_t **yield,
                                     struct llmopt_err *err) {
    const json_t *bodies = json_object_get(node, "bodies");
    if (!bodies) {
        *body = json_object_get(node, "body");
        *yield = json_object_get(node, "yield");
        return LLMOPT_OK;
    }
    int64_t kind;
    enum llmopt_status st = attr_int(im, node, "kind", true, 0, &kind, err);
    if (st) {
        err_prefix(err, "layer %d: repeat", layer);
        return st;
    }
    char key[32];
    snprintf(key, sizeof key, "%lld", (long long)kind);
    const json_t *b = json_object_get(bodies, key);
    if (!json_is_object(b))
        return err_set(err, LLMOPT_ERR_FORMAT, "layer %d: kind '%s' is %lld, which has no body", layer,
                       json_string_value(json_object_get(node, "kind")) ? json_string_value(json_object_get(node, "kind")) : "?",
                       (long long)kind);
    *body = json_object_get(b, "body");
    *yield = json_object_get(b, "yield");
    return LLMOPT_OK;
}

static enum llmopt_status import_repeat(struct importer *im, const json_t *node,
                                        struct llmopt_err *err) {
    if (im->in_body) return err_set(err, LLMOPT_ERR_UNSUPPORTED, "nested repeat");
    double count_d;
    enum llmopt_status st = attr_number(im, node, "count", true, 0, &count_d, err);
    if (st) return st;
    if (count_d < 0 || count_d > IMPORT_MAX_LAYERS || count_d != floor(count_d))
        return err_set(err, LLMOPT_ERR_FORMAT, "repeat count %g out of range", count_d);
    const char *index = json_string_value(json_object_get(node, "index"));
    const json_t *carry = json_object_get(node, "carry"), *outs = json_object_get(node, "out");
    const json_t *bodies = json_object_get(node, "bodies");
    bool plain = json_is_array(json_object_get(node, "body")) && json_is_object(json_object_get(node, "yield"));
    bool kinds = json_is_object(bodies) && json_object_get(node, "kind");
    if (!index || !json_is_object(carry) || !json_is_object(outs) || plain == kinds)
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "repeat needs 'index', 'carry', 'out', and either 'body' and 'yield' or 'kind' and "
                       "'bodies'");
    if (kinds) {
        const char *key;
        json_t *b;
        json_object_foreach((json_t *)bodies, key, b) {
            if (!json_is_array(json_object_get(b, "body")) || !json_is_object(json_object_get(b, "yield")))
                return err_set(err, LLMOPT_ERR_FORMAT, "repeat body '%s' needs 'body' and 'yield'", key);
        }
    }
    if (json_object_size(carry) > IMPORT_MAX_CARRY)
        return err_set(err, LLMOPT_ERR_LIMIT, "repeat carries more than %d values",
                       IMPORT_MAX_CARRY);
    if (im->hp.n + 1 + im->hp.n_layer > IR_MAX_HPARAMS)
        return err_set(err, LLMOPT_ERR_LIMIT, "too many hparams");
    int n_layers = (int)count_d;
    for (int k = 0; k < im->hp.n_layer; k++)
        if (im->hp.layer_count[k] < n_layers)
            return err_set(err, LLMOPT_ERR_FORMAT, "per-layer hparam '%s' has %d values for %d layers",
                           im->hp.layer_names[k], im->hp.layer_count[k], n_layers);
    /* The loop index, then each per-layer hparam as this layer's scalar. */
    int index_slot = im->hp.n++;
    im->hp.names[index_slot] = index;
    int layer_slot = im->hp.n;
    for (int k = 0; k < im->hp.n_layer; k++) im->hp.names[im->hp.n++] = im->hp.layer_names[k];

    im->n_carry = 0;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)carry, key, val) {
        if (!json_is_string(val)) return err_set(err, LLMOPT_ERR_FORMAT, "carry '%s' not a name", key);
        if (!json_is_string(json_object_get(outs, key)))
            return err_set(err, LLMOPT_ERR_FORMAT, "carry '%s' has no out", key);
        im->carry_names[im->n_carry] = key;
        if ((st = resolve_value(im, json_string_value(val), &im->carry_vals[im->n_carry], err)))
            return st;
        im->n_carry++;
    }
    for (int layer = 0; layer < n_layers; layer++) {
        im->hp.values[index_slot] = layer;
        for (int k = 0; k < im->hp.n_layer; k++) im->hp.values[layer_slot + k] = im->hp.layer_values[k][layer];
        im->in_body = true;
        im->layer = layer;
        strmap_clear(&im->local);
        const json_t *body = NULL, *yield = NULL;
        if ((st = layer_body(im, node, layer, &body, &yield, err))) return st;
        if ((st = import_nodes(im, body, err))) {
            err_prefix(err, "layer %d", layer);
            return st;
        }
        int32_t next[IMPORT_MAX_CARRY];
        for (int c = 0; c < im->n_carry; c++) {
            const char *y = json_string_value(json_object_get(yield, im->carry_names[c]));
            if (!y) return err_set(err, LLMOPT_ERR_FORMAT, "layer %d: the body yields no '%s'", layer, im->carry_names[c]);
            if ((st = resolve_value(im, y, &next[c], err))) return st;
        }
        memcpy(im->carry_vals, next, sizeof(int32_t) * (size_t)im->n_carry);
    }
    im->in_body = false;
    im->hp.n = index_slot;
    for (int c = 0; c < im->n_carry; c++) {
        const char *o = json_string_value(json_object_get(outs, im->carry_names[c]));
        if ((st = define_value(im, o, im->carry_vals[c], err))) return st;
    }
    im->n_carry = 0;
    return LLMOPT_OK;
}

static enum llmopt_status import_node(struct importer *im, const json_t *node,
                                      struct llmopt_err *err) {
    const char *op_name = json_string_value(json_object_get(node, "op"));
    if (!op_name) return err_set(err, LLMOPT_ERR_FORMAT, "node without 'op'");
    if (!strcmp(op_name, "repeat")) return import_repeat(im, node, err);
    const char *id = json_string_value(json_object_get(node, "id"));
    if (!id) return err_set(err, LLMOPT_ERR_FORMAT, "%s node without 'id'", op_name);
    enum ir_op op;
    if (!ir_op_parse(op_name, &op) || op == IR_OP_INPUT || op == IR_OP_PARAM)
        return err_set(err, LLMOPT_ERR_UNSUPPORTED, "node '%s': unknown op '%s'", id, op_name);
    const json_t *in = json_object_get(node, "in");
    if (in && !json_is_array(in)) return err_set(err, LLMOPT_ERR_FORMAT, "node '%s': 'in' not a list", id);
    size_t n_in = in ? json_array_size(in) : 0;
    if (n_in > 64) return err_set(err, LLMOPT_ERR_LIMIT, "node '%s': more than 64 operands", id);
    int32_t operands[64];
    enum llmopt_status st;
    for (size_t k = 0; k < n_in; k++) {
        const char *ref = json_string_value(json_array_get(in, k));
        if (!ref) return err_set(err, LLMOPT_ERR_FORMAT, "node '%s': operand %zu not a name", id, k);
        if ((st = resolve_value(im, ref, &operands[k], err))) {
            err_prefix(err, "node '%s'", id);
            return st;
        }
    }
    struct ir_graph *g = im->g;
    int32_t idx = ir_add_node(g, op, operands, (int)n_in, err);
    if (idx == IR_NONE) return err->status;
    struct ir_node *n = &g->nodes[idx];
    char full_id[IMPORT_NAME_MAX];
    if (im->in_body)
        snprintf(full_id, sizeof full_id, "%s@%d", id, im->layer);
    else
        snprintf(full_id, sizeof full_id, "%s", id);
    n->name = ir_strdup(g, full_id);
    const json_t *attrs = json_object_get(node, "attrs");
    if ((st = parse_attrs(im, n, attrs, err)) || (st = ir_infer_node(g, idx, err))) {
        err_prefix(err, "node '%s'", full_id);
        return st;
    }
    const json_t *recorded = json_object_get(node, "shape");
    if (recorded) {
        struct ir_shape want;
        if ((st = shape_from_json(recorded, &im->hp, &want, err))) {
            err_prefix(err, "node '%s' recorded shape", full_id);
            return st;
        }
        if (!ir_shape_eq(&want, &n->shape)) {
            char b1[128], b2[128];
            return err_set(err, LLMOPT_ERR_FORMAT,
                           "node '%s' (%s): inferred shape %s, capture recorded %s", full_id,
                           op_name, ir_shape_str(&n->shape, b1, sizeof b1),
                           ir_shape_str(&want, b2, sizeof b2));
        }
    }
    return define_value(im, id, idx, err);
}

static enum llmopt_status import_nodes(struct importer *im, const json_t *nodes,
                                       struct llmopt_err *err) {
    size_t i;
    json_t *node;
    json_array_foreach((json_t *)nodes, i, node) {
        if (!json_is_object(node)) return err_set(err, LLMOPT_ERR_FORMAT, "node %zu is not an object", i);
        enum llmopt_status st = import_node(im, node, err);
        if (st) return st;
    }
    return LLMOPT_OK;
}

enum llmopt_status ir_import(const json_t *graph, const struct ir_hparams *hp,
                             ir_bind_param_fn bind, void *bind_ctx, struct ir_graph *g,
                             struct llmopt_err *err) {
    struct importer im = {.g = g, .hp = *hp, .bind = bind, .bind_ctx = bind_ctx};
    strmap_init(&im.outer);
    strmap_init(&im.local);
    strmap_init(&im.params);
    enum llmopt_status st = ir_graph_init(g, err);
    if (st) goto done;

    /* Parameter declarations by name. */
    json_t *decls = json_object();
    im.param_decls = decls;
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(graph, "params"), i, p) {
        const char *name = json_string_value(json_object_get(p, "name"));
        if (!name) {
            st = err_set(err, LLMOPT_ERR_FORMAT, "params[%zu] has no name", i);
            goto done_decls;
        }
        json_object_set(decls, name, p);
    }
    /* The four entrypoint inputs, in the fixed order. */
    const json_t *inputs = json_object_get(graph, "inputs");
    if (json_array_size(inputs) != IR_INPUT_COUNT) {
        st = err_set(err, LLMOPT_ERR_FORMAT, "graph must have exactly %d inputs", IR_INPUT_COUNT);
        goto done_decls;
    }
    for (int k = 0; k < IR_INPUT_COUNT; k++) {
        const char *name = json_string_value(json_object_get(json_array_get(inputs, (size_t)k), "name"));
        if (!name || strcmp(name, ir_input_names[k])) {
            st = err_set(err, LLMOPT_ERR_FORMAT, "input %d must be '%s'", k, ir_input_names[k]);
            goto done_decls;
        }
        int32_t idx = ir_add_node(g, IR_OP_INPUT, NULL, 0, err);
        if (idx == IR_NONE) {
            st = err->status;
            goto done_decls;
        }
        g->nodes[idx].name = ir_input_names[k];
        g->nodes[idx].dtype = IR_DTYPE_I32;
        g->nodes[idx].shape.rank = 1;
        g->nodes[idx].shape.dims[0] =
            (struct ir_dim){1, k == IR_INPUT_OUT_ROWS ? IR_SYM_M : IR_SYM_N};
        g->inputs[k] = idx;
        if ((st = define_value(&im, name, idx, err))) goto done_decls;
    }
    if ((st = import_nodes(&im, json_object_get(graph, "nodes"), err))) goto done_decls;
    const json_t *outputs = json_object_get(graph, "outputs");
    const char *logits = json_string_value(json_object_get(json_array_get(outputs, 0), "value"));
    if (json_array_size(outputs) != 1 || !logits) {
        st = err_set(err, LLMOPT_ERR_FORMAT, "graph must have one output 'logits'");
        goto done_decls;
    }
    if ((st = resolve_value(&im, logits, &g->output, err))) goto done_decls;
    ir_count_uses(g);
    st = ir_verify(g, err);
done_decls:
    json_decref(decls);
done:
    strmap_free(&im.outer);
    strmap_free(&im.local);
    strmap_free(&im.params);
    if (st) ir_graph_free(g);
    return st;
}
