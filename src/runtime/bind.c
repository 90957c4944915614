/* Binding a program to a GGUF file: hyper-parameters from metadata and tensor shapes,
 * parameters to tensors by name through the program's map, with shape and type checks
 * and the map's transforms. Nothing here knows any architecture: names, keys and
 * transforms all come from the program's map.json. */
#include "runtime/model.h"

#include "base/fp16.h"
#include "format/graph_file.h"
#include "format/quant.h"
#include "ir/expr.h"

#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BIND_NAME_MAX 512

struct binder {
    struct llmopt_model *m;
    const json_t *params_map; /* graph param name -> {tensor, fallback, transform} */
    bool *tensor_used;        /* (gguf n_tensors) */
    char arch[128];
};

/* "{arch}.embedding_length" -> "llama.embedding_length" */
static bool substitute_arch(const char *tmpl, const char *arch, char *out, size_t cap) {
    size_t o = 0;
    for (const char *p = tmpl; *p; p++) {
        if (!strncmp(p, "{arch}", 6)) {
            size_t n = strlen(arch);
            if (o + n >= cap) return false;
            memcpy(out + o, arch, n);
            o += n;
            p += 5;
        } else {
            if (o + 1 >= cap) return false;
            out[o++] = *p;
        }
    }
    out[o] = 0;
    return true;
}

static bool owned_push(struct llmopt_model *m, void *p) {
    if (m->n_owned == m->cap_owned) {
        int32_t cap = m->cap_owned ? m->cap_owned * 2 : 16;
        void **owned = realloc(m->owned, (size_t)cap * sizeof *owned);
        if (!owned) return false;
        m->owned = owned;
        m->cap_owned = cap;
    }
    m->owned[m->n_owned++] = p;
    return true;
}

/* A tensor's row-major shape at `rank`: leading dims of 1 may be dropped or added.
 * False if it cannot be expressed at that rank. */
static bool tensor_shape(const struct weights_tensor *t, int rank, int64_t *dims) {
    int extra = t->n_dims - rank;
    for (int d = 0; d < extra; d++)
        if (t->shape[d] != 1) return false;
    for (int d = 0; d < rank; d++) {
        int k = d + extra;
        dims[d] = k >= 0 ? t->shape[k] : 1;
    }
    return true;
}

/* A metadata value as JSON, arrays included (GGUF arrays of numbers or strings become
 * JSON arrays; at most 1 << 16 elements, which per-layer keys never approach). NULL
 * when absent. The caller json_decref()s it. */
static json_t *meta_json(struct binder *b, const char *key) {
    struct llmopt_model *m = b->m;
    if (m->weights.kind != WEIGHTS_GGUF) return weights_value(&m->weights, key);
    const struct gguf_kv *kv = gguf_find_kv(m->weights.gguf, key);
    if (!kv) return NULL;
    if (kv->type != GGUF_TYPE_ARRAY) return weights_value(&m->weights, key);
    if (kv->array_len > (1u << 16)) return NULL;
    json_t *arr = json_array();
    for (uint64_t i = 0; arr && i < kv->array_len; i++) {
        double d;
        struct gguf_str s;
        if (kv->array_type == GGUF_TYPE_STRING && gguf_str_array_get(kv, i, &s))
            json_array_append_new(arr, json_stringn(s.ptr, s.len));
        else if (gguf_array_get_f64(kv, i, &d))
            json_array_append_new(arr, json_real(d));
        else
            json_array_append_new(arr, json_null());
    }
    return arr;
}

/* The first present key of a rule ("key" or "config", a name or a list of names) as
 * JSON; key_out names it. NULL when none is present. */
static json_t *rule_meta(struct binder *b, const json_t *spec, char *key_out, size_t cap, bool *bad) {
    const json_t *rule = json_object_get(spec, "key");
    if (!rule) rule = json_object_get(spec, "config");
    *bad = false;
    key_out[0] = 0;
    if (!rule) return NULL;
    size_t n_alt = json_is_array(rule) ? json_array_size(rule) : 1;
    for (size_t a = 0; a < n_alt; a++) {
        const char *tmpl = json_string_value(json_is_array(rule) ? json_array_get(rule, a) : rule);
        if (!tmpl || !substitute_arch(tmpl, b->arch, key_out, cap)) {
            *bad = true;
            return NULL;
        }
        json_t *v = meta_json(b, key_out);
        if (v) return v;
    }
    return NULL;
}

/* How a metadata value is spelled as a key of a per-layer rule's "values": a string
 * as is, true/false, an integral number as an integer, else the shortest round trip. */
static bool value_key(const json_t *v, char *buf, size_t cap) {
    if (json_is_string(v)) {
        snprintf(buf, cap, "%s", json_string_value(v));
        return true;
    }
    if (json_is_boolean(v)) {
        snprintf(buf, cap, "%s", json_is_true(v) ? "true" : "false");
        return true;
    }
    if (!json_is_number(v)) return false;
    double d = json_number_value(v);
    if (d == floor(d) && fabs(d) < 9.0e15) {
        snprintf(buf, cap, "%lld", (long long)d);
        return true;
    }
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, d);
        if (strtod(buf, NULL) == d) break;
    }
    return true;
}

/* hp plus the layer index `i` and layer `layer`'s per-layer values (for expressions
 * evaluated per layer). */
static void layer_env(const struct ir_hparams *hp, const char *index, int layer, struct ir_hparams *env) {
    *env = *hp;
    if (env->n < IR_MAX_HPARAMS) {
        env->names[env->n] = index;
        env->values[env->n++] = layer;
    }
    for (int k = 0; k < hp->n_layer && env->n < IR_MAX_HPARAMS; k++) {
        if (layer >= hp->layer_count[k]) continue;
        env->names[env->n] = hp->layer_names[k];
        env->values[env->n++] = hp->layer_values[k][layer];
    }
}

static const json_t *graph_repeat(const json_t *graph) {
    size_t i;
    json_t *node;
    json_array_foreach(json_object_get(graph, "nodes"), i, node) {
        const char *op = json_string_value(json_object_get(node, "op"));
        if (op && !strcmp(op, "repeat")) return node;
    }
    return NULL;
}

/* One per-layer hparam (docs/formats/graph.md "Per-layer hparams"): a list in the
 * metadata (or a scalar, the same on every layer), each entry mapped through "values"
 * when the rule has it; else "default", an expression over the hparams and i. */
static enum llmopt_status per_layer_hparam(struct binder *b, const char *name, const json_t *spec,
                                           int32_t count, double *out, struct llmopt_err *err) {
    char key[BIND_NAME_MAX];
    bool bad;
    json_t *v = rule_meta(b, spec, key, sizeof key, &bad);
    if (bad) return err_set(err, LLMOPT_ERR_FORMAT, "map: hparam '%s' has a bad key", name);
    const json_t *dflt = json_object_get(spec, "default");
    const json_t *table = json_object_get(spec, "values");
    enum llmopt_status st = LLMOPT_OK;
    if (!v && !json_is_string(dflt) && !json_is_number(dflt))
        return err_set(err, LLMOPT_ERR_BIND, "hparam '%s': key '%s' not in the %s", name, key,
                       b->m->weights.kind == WEIGHTS_GGUF ? "file's metadata" : "config.json");
    if (v && json_is_array(v) && (int64_t)json_array_size(v) != count) {
        st = err_set(err, LLMOPT_ERR_BIND, "hparam '%s': '%s' has %zu entries for %d layers", name, key,
                     json_array_size(v), count);
        json_decref(v);
        return st;
    }
    for (int32_t i = 0; i < count && !st; i++) {
        struct ir_hparams env;
        layer_env(&b->m->hp, "i", i, &env);
        const json_t *expr = dflt;
        if (v) {
            const json_t *item = json_is_array(v) ? json_array_get(v, (size_t)i) : v;
            if (table) {
                char k[128];
                expr = value_key(item, k, sizeof k) ? json_object_get(table, k) : NULL;
                if (!expr) expr = json_object_get(table, "*");
                if (!expr) {
                    char *text = json_dumps(item, JSON_ENCODE_ANY);
                    st = err_set(err, LLMOPT_ERR_BIND, "hparam '%s': '%s'[%d] is %s, which the program does not take",
                                 name, key, i, text ? text : "?");
                    free(text);
                    break;
                }
            } else if (json_is_number(item)) {
                out[i] = json_number_value(item);
                continue;
            } else {
                st = err_set(err, LLMOPT_ERR_BIND, "hparam '%s': '%s'[%d] is not a number", name, key, i);
                break;
            }
        }
        if ((st = ir_number_from_json(expr, &env, &out[i], err))) err_prefix(err, "hparam '%s' layer %d", name, i);
        else if (!isfinite(out[i])) st = err_set(err, LLMOPT_ERR_BIND, "hparam '%s' layer %d is not finite", name, i);
    }
    json_decref(v);
    return st;
}

static bool is_layer_hparam(const json_t *graph, const char *name) {
    size_t i;
    json_t *h;
    json_array_foreach(json_object_get(graph, "layer_hparams"), i, h) {
        if (json_is_string(h) && !strcmp(json_string_value(h), name)) return true;
    }
    return false;
}

static enum llmopt_status resolve_layer_hparams(struct binder *b, struct llmopt_err *err) {
    struct llmopt_model *m = b->m;
    const json_t *names = json_object_get(m->graph, "layer_hparams");
    if (!json_array_size(names)) return LLMOPT_OK;
    const json_t *hmap = json_object_get(json_object_get(m->map, weights_kind_section(m->weights.kind)), "hparams");
    const json_t *rep = graph_repeat(m->graph);
    double count_d;
    if (!rep || ir_number_from_json(json_object_get(rep, "count"), &m->hp, &count_d, err) ||
        count_d < 0 || count_d > 4096 || count_d != floor(count_d))
        return err_set(err, LLMOPT_ERR_FORMAT, "graph: per-layer hparams need a repeat with a layer count");
    if (json_array_size(names) > IR_MAX_LAYER_HPARAMS)
        return err_set(err, LLMOPT_ERR_LIMIT, "graph: more than %d per-layer hparams", IR_MAX_LAYER_HPARAMS);
    int32_t count = (int32_t)count_d;
    size_t i;
    json_t *h;
    json_array_foreach(names, i, h) {
        const char *name = json_string_value(h);
        const json_t *spec = name ? json_object_get(hmap, name) : NULL;
        if (!spec) return err_set(err, LLMOPT_ERR_FORMAT, "graph per-layer hparam '%s' has no rule in the map",
                                  name ? name : "?");
        double *vals = calloc((size_t)(count ? count : 1), sizeof *vals);
        if (!vals || !owned_push(m, vals)) {
            free(vals);
            return err_set(err, LLMOPT_ERR_NOMEM, "bind: out of memory");
        }
        enum llmopt_status st = per_layer_hparam(b, name, spec, count, vals, err);
        if (st) return st;
        m->hp.layer_names[m->hp.n_layer] = name;
        m->hp.layer_values[m->hp.n_layer] = vals;
        m->hp.layer_count[m->hp.n_layer++] = count;
    }
    return LLMOPT_OK;
}

static enum llmopt_status resolve_hparams(struct binder *b, struct llmopt_err *err) {
    struct llmopt_model *m = b->m;
    const json_t *hmap = json_object_get(json_object_get(m->map, weights_kind_section(m->weights.kind)), "hparams");
    size_t n = json_object_size(hmap);
    if (n > IR_MAX_HPARAMS) return err_set(err, LLMOPT_ERR_LIMIT, "map: more than %d hparams", IR_MAX_HPARAMS);
    bool done[IR_MAX_HPARAMS] = {0};
    size_t n_done = 0;
    m->hp.n = 0;
    m->hp.n_layer = 0;
    /* Defaults may refer to other hparams: resolve in rounds until nothing moves. */
    for (size_t round = 0; round <= n && n_done < n; round++) {
        size_t k = 0;
        const char *name;
        json_t *spec;
        json_object_foreach((json_t *)hmap, name, spec) {
            size_t i = k++;
            if (done[i]) continue;
            if (is_layer_hparam(m->graph, name)) { /* resolved after the scalars */
                done[i] = true;
                n_done++;
                continue;
            }
            double value = 0;
            bool have = false;
            /* "key": GGUF metadata; "config": a dotted config.json path or a list of them */
            const json_t *key_rule = json_object_get(spec, "key");
            if (!key_rule) key_rule = json_object_get(spec, "config");
            const char *tensor = json_string_value(json_object_get(spec, "tensor"));
            const json_t *dflt = json_object_get(spec, "default");
            if (key_rule) {
                char key[BIND_NAME_MAX] = "";
                size_t n_alt = json_is_array(key_rule) ? json_array_size(key_rule) : 1;
                for (size_t a = 0; a < n_alt && !have; a++) {
                    const char *tmpl = json_string_value(json_is_array(key_rule) ? json_array_get(key_rule, a) : key_rule);
                    if (!tmpl || !substitute_arch(tmpl, b->arch, key, sizeof key))
                        return err_set(err, LLMOPT_ERR_FORMAT, "map: hparam '%s' has a bad key", name);
                    have = weights_number(&m->weights, key, &value);
                    json_t *arr = have ? NULL : meta_json(b, key);
                    if (json_is_array(arr)) {
                        /* one value per layer: a scalar hparam takes their maximum when
                         * the rule says so ("reduce": "max"), else the file is refused */
                        const char *reduce = json_string_value(json_object_get(spec, "reduce"));
                        bool ok = reduce && !strcmp(reduce, "max") && json_array_size(arr) > 0;
                        size_t e;
                        json_t *x;
                        json_array_foreach(arr, e, x) {
                            ok = ok && json_is_number(x);
                            if (ok && (!e || json_number_value(x) > value)) value = json_number_value(x);
                        }
                        json_decref(arr);
                        if (!ok)
                            return err_set(err, LLMOPT_ERR_BIND,
                                           "hparam '%s': '%s' is a list (one value per layer?); a scalar hparam "
                                           "needs \"reduce\": \"max\"", name, key);
                        have = true;
                    } else {
                        json_decref(arr);
                    }
                }
                if (!have && !dflt)
                    return err_set(err, LLMOPT_ERR_BIND, "hparam '%s': key '%s' not in the %s", name, key,
                                   m->weights.kind == WEIGHTS_GGUF ? "file's metadata" : "config.json");
            }
            if (!have && tensor) {
                struct weights_tensor t;
                json_int_t dim = json_integer_value(json_object_get(spec, "dim"));
                if (!weights_find(&m->weights, tensor, &t) || dim < 0 || dim >= t.n_dims) {
                    if (!dflt)
                        return err_set(err, LLMOPT_ERR_BIND, "hparam '%s': tensor '%s' dim %lld not in the file",
                                       name, tensor, (long long)dim);
                } else {
                    value = (double)t.shape[dim];
                    have = true;
                }
            }
            if (!have && dflt) {
                struct llmopt_err tmp;
                if (json_is_number(dflt)) {
                    value = json_number_value(dflt);
                    have = true;
                } else if (json_is_string(dflt) &&
                           expr_eval_number(json_string_value(dflt), ir_hparams_lookup, &m->hp,
                                            &value, &tmp) == LLMOPT_OK) {
                    have = true;
                }
            }
            if (!have) continue; /* a default waiting on another hparam */
            if (!isfinite(value))
                return err_set(err, LLMOPT_ERR_BIND, "hparam '%s' is not finite", name);
            m->hp.names[m->hp.n] = name;
            m->hp.values[m->hp.n++] = value;
            done[i] = true;
            n_done++;
        }
    }
    if (n_done < n) {
        size_t k = 0;
        const char *name;
        json_t *spec;
        json_object_foreach((json_t *)hmap, name, spec) {
            if (!done[k++])
                return err_set(err, LLMOPT_ERR_BIND, "hparam '%s': default '%s' cannot be evaluated",
                               name, json_string_value(json_object_get(spec, "default")));
        }
    }
    enum llmopt_status st = resolve_layer_hparams(b, err);
    if (st) return st;
    /* Every hparam the graph uses must now have a value. */
    size_t i;
    json_t *h;
    json_array_foreach(json_object_get(m->graph, "hparams"), i, h) {
        double v;
        if (!json_is_string(h) || !ir_hparams_get(&m->hp, json_string_value(h), &v))
            return err_set(err, LLMOPT_ERR_FORMAT, "graph hparam '%s' has no rule in the map",
                           json_is_string(h) ? json_string_value(h) : "?");
    }
    return LLMOPT_OK;
}

/* Whole rows move: row half*(hd/2)+j of each head comes from row 2*j+half. */
/* Whole rows move: row half*(hd/2)+j of each head comes from row 2*j+half. */
static enum llmopt_status transform_unpermute_rope_rows(struct llmopt_model *m, const json_t *spec,
                                                        const char *pname, int64_t rows,
                                                        size_t row_bytes, struct ir_weight *w,
                                                        struct llmopt_err *err) {
    double heads_d;
    const json_t *heads = json_object_get(spec, "heads");
    enum llmopt_status st = ir_number_from_json(heads, &m->hp, &heads_d, err);
    if (st) {
        err_prefix(err, "param '%s' transform heads", pname);
        return st;
    }
    int64_t n_heads = (int64_t)heads_d;
    if (n_heads < 1 || rows % n_heads || (rows / n_heads) % 2)
        return err_set(err, LLMOPT_ERR_BIND, "param '%s': %lld rows do not split into %lld heads of even size",
                       pname, (long long)rows, (long long)n_heads);
    int64_t hd = rows / n_heads;
    uint8_t *dst = malloc((size_t)rows * row_bytes);
    if (!dst || !owned_push(m, dst)) {
        free(dst);
        return err_set(err, LLMOPT_ERR_NOMEM, "bind: out of memory");
    }
    const uint8_t *src = w->data;
    for (int64_t h = 0; h < n_heads; h++)
        for (int64_t half = 0; half < 2; half++)
            for (int64_t j = 0; j < hd / 2; j++)
                memcpy(dst + (size_t)(h * hd + half * (hd / 2) + j) * row_bytes,
                       src + (size_t)(h * hd + 2 * j + half) * row_bytes, row_bytes);
    w->data = dst;
    return LLMOPT_OK;
}

/* value added to every element of an f32 vector (e.g. Gemma's norms, stored as 1 + w). */
static enum llmopt_status transform_add_scalar(struct llmopt_model *m, const json_t *spec,
                                               const char *pname, int64_t n, struct ir_weight *w,
                                               struct llmopt_err *err) {
    double value;
    enum llmopt_status st = ir_number_from_json(json_object_get(spec, "value"), &m->hp, &value, err);
    if (st) {
        err_prefix(err, "param '%s' transform value", pname);
        return st;
    }
    if (w->dtype != IR_DTYPE_F32)
        return err_set(err, LLMOPT_ERR_BIND, "param '%s': add_scalar needs an f32 vector", pname);
    float *dst = malloc((size_t)n * sizeof(float));
    if (!dst || !owned_push(m, dst)) {
        free(dst);
        return err_set(err, LLMOPT_ERR_NOMEM, "bind: out of memory");
    }
    const float *src = w->data;
    for (int64_t i = 0; i < n; i++) dst[i] = src[i] + (float)value;
    w->data = dst;
    return LLMOPT_OK;
}

enum llmopt_status model_bind_tensor(struct llmopt_model *m, const char *pname,
                                     const struct weights_tensor *t, const struct ir_shape *shape,
                                     const json_t *transform, struct ir_weight *out,
                                     struct llmopt_err *err) {
    const char *tname = t->name;
    int64_t dims[IR_MAX_RANK];
    /* A "reshape" transform names the tensor's shape in the file: the graph views the
     * same elements with the same rows (a squeezed [C, 1, L] kernel stored as [C, L]). */
    const char *top = transform ? json_string_value(json_object_get(transform, "op")) : NULL;
    struct ir_shape stored = *shape;
    if (top && !strcmp(top, "reshape")) {
        const json_t *sj = json_object_get(transform, "shape");
        int64_t n_want = 1, n_stored = 1;
        bool ok = json_is_array(sj) && json_array_size(sj) >= 1 && json_array_size(sj) <= IR_MAX_RANK;
        stored.rank = ok ? (int)json_array_size(sj) : 0;
        for (int d = 0; ok && d < stored.rank; d++) {
            struct llmopt_err tmp;
            ok = !ir_dim_from_json(json_array_get(sj, (size_t)d), &m->hp, &stored.dims[d], &tmp) &&
                 !stored.dims[d].sym && stored.dims[d].coef >= 0;
            if (ok) n_stored *= stored.dims[d].coef;
        }
        for (int d = 0; d < shape->rank; d++) n_want *= shape->dims[d].coef;
        if (!ok || n_stored != n_want || !shape->rank ||
            stored.dims[stored.rank - 1].coef != shape->dims[shape->rank - 1].coef)
            return err_set(err, LLMOPT_ERR_FORMAT, "param '%s': the reshape transform's shape does not view the "
                           "graph's elements with the same rows", pname);
    }
    bool shape_ok = tensor_shape(t, stored.rank, dims);
    for (int d = 0; shape_ok && d < stored.rank; d++) shape_ok = dims[d] == stored.dims[d].coef;
    if (!shape_ok) {
        char want[128], got[160] = "[";
        ir_shape_str(&stored, want, sizeof want);
        for (int d = 0; d < t->n_dims; d++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%lld%s", (long long)t->shape[d],
                     d + 1 < t->n_dims ? ", " : "");
        snprintf(got + strlen(got), sizeof got - strlen(got), "]");
        return err_set(err, LLMOPT_ERR_BIND, "tensor '%s' has shape %s, param '%s' needs %s", tname, got,
                       pname, want);
    }
    if (!t->dtype_known)
        return err_set(err, LLMOPT_ERR_UNSUPPORTED, "tensor '%s' has type %d, which llmopt does not read",
                       tname, t->raw_type);
    out->dtype = t->dtype;
    out->data = t->data;
    out->n_bytes = t->n_bytes;
    out->source = ir_strdup(&m->ir, tname);
    out->transform = NULL;
    int64_t row_len = shape->rank ? shape->dims[shape->rank - 1].coef : 1;
    int64_t rows = 1;
    for (int d = 0; d + 1 < shape->rank; d++) rows *= shape->dims[d].coef;
    int64_t row_len_stored = row_len;

    /* Vectors (norm weights, biases) are read by f32 kernels: widen them once. f32 data
     * that is not 4-byte aligned (safetensors does not promise it) is copied too. */
    if ((shape->rank <= 1 && out->dtype != IR_DTYPE_F32) ||
        (out->dtype == IR_DTYPE_F32 && (uintptr_t)out->data % 4)) {
        int64_t n = shape->rank <= 1 ? row_len : rows * row_len;
        float *f = malloc((size_t)n * sizeof(float));
        if (!f || !owned_push(m, f)) {
            free(f);
            return err_set(err, LLMOPT_ERR_NOMEM, "bind: out of memory");
        }
        enum ggml_type type = GGML_TYPE_F32;
        const bool known = quant_ggml_type_of(out->dtype, &type);
        LLMOPT_ASSERT(known); /* dtype_known above: every type weights.c reads has a GGUF name */
        quant_dequantize_row(type, out->data, f, n);
        row_len = n;
        out->data = f;
        out->dtype = IR_DTYPE_F32;
        out->n_bytes = (uint64_t)row_len * 4;
        row_len = row_len_stored;
    }
    if (transform) {
        const char *op = json_string_value(json_object_get(transform, "op"));
        enum llmopt_status st;
        if (op && !strcmp(op, "unpermute_rope_rows") && shape->rank == 2)
            st = transform_unpermute_rope_rows(m, transform, pname, rows,
                                               ir_dtype_row_bytes(out->dtype, row_len), out, err);
        else if (op && !strcmp(op, "add_scalar") && shape->rank == 1)
            st = transform_add_scalar(m, transform, pname, row_len, out, err);
        else if (op && !strcmp(op, "reshape"))
            st = LLMOPT_OK; /* a view: checked above, no data moves */
        else
            st = err_set(err, LLMOPT_ERR_UNSUPPORTED, "param '%s': unknown transform '%s'", pname,
                         op ? op : "?");
        if (st) return st;
        char *text = json_dumps(transform, JSON_COMPACT | JSON_SORT_KEYS);
        out->transform = text ? ir_strdup(&m->ir, text) : NULL;
        free(text);
    }
    return LLMOPT_OK;
}

/* A map entry's tensor names: [0] "tensor", [1] "fallback" (NULL when absent). */
static void param_tensor_names(const json_t *spec, const char *names[2]) {
    names[0] = json_string_value(json_object_get(spec, "tensor"));
    names[1] = json_string_value(json_object_get(spec, "fallback"));
}

/* What find_param_tensor found. Not to be copied: t.name points into name. */
struct param_lookup {
    struct weights_tensor t;   /* when found */
    char name[BIND_NAME_MAX];  /* the name looked up last */
    char first[BIND_NAME_MAX]; /* names[0] as substituted ("" when absent or bad) */
    const char *bad;           /* the first name tried that does not substitute, or NULL */
};

/* Looks up the tensor a map entry binds at `layer` (-1: not per layer): names[0], else
 * names[1]. */
static bool find_param_tensor(const struct binder *b, const char *const names[2], int layer,
                              struct param_lookup *L) {
    bool found = false;
    L->first[0] = 0;
    L->bad = NULL;
    for (int k = 0; k < 2 && !found; k++) {
        if (!names[k]) continue;
        if (!ir_substitute_layer(names[k], layer, L->name, sizeof L->name)) {
            if (!L->bad) L->bad = names[k];
            continue;
        }
        if (k == 0) snprintf(L->first, sizeof L->first, "%s", L->name);
        found = weights_find(&b->m->weights, L->name, &L->t);
    }
    return found;
}

static enum llmopt_status bind_param(void *ctx, const char *tmpl, int layer,
                                     const struct ir_shape *shape, struct ir_weight *out,
                                     struct llmopt_err *err) {
    struct binder *b = ctx;
    struct llmopt_model *m = b->m;
    char pname[BIND_NAME_MAX];
    ir_substitute_layer(tmpl, layer, pname, sizeof pname);
    const json_t *spec = json_object_get(b->params_map, tmpl);
    if (!json_is_object(spec))
        return err_set(err, LLMOPT_ERR_FORMAT, "map has no entry for param '%s'", tmpl);
    const char *names[2];
    param_tensor_names(spec, names);
    struct param_lookup L;
    bool found = find_param_tensor(b, names, layer, &L);
    if (L.bad) return err_set(err, LLMOPT_ERR_FORMAT, "map: bad tensor name '%s'", L.bad);
    if (!found)
        return err_set(err, LLMOPT_ERR_BIND, "tensor '%s' (for param '%s') is missing%s", names[0] ? names[0] : "?",
                       pname, names[1] ? " and so is its fallback" : "");
    enum llmopt_status st = model_bind_tensor(m, pname, &L.t, shape, json_object_get(spec, "transform"), out, err);
    if (!st && L.t.index >= 0) b->tensor_used[L.t.index] = true;
    return st;
}

/* Whether body `body` (a JSON node list) reads value `name`. */
static bool body_reads(const json_t *body, const char *name) {
    size_t i, k;
    json_t *node, *ref;
    json_array_foreach(body, i, node) {
        json_array_foreach(json_object_get(node, "in"), k, ref) {
            if (json_is_string(ref) && !strcmp(json_string_value(ref), name)) return true;
        }
    }
    return false;
}

/* The body each layer runs (a repeat with "kind" and "bodies"), or NULL for all when
 * every layer runs the same body (or the kinds cannot be evaluated: then every layer
 * counts, which only makes a refusal list more tensors). *bodies is malloc'd. */
static const json_t **layer_bodies(struct binder *b, int n_layers) {
    const json_t *rep = graph_repeat(b->m->graph);
    const json_t *bodies = json_object_get(rep, "bodies");
    if (!bodies || n_layers < 1) return NULL;
    const json_t **out = calloc((size_t)n_layers, sizeof *out);
    for (int l = 0; out && l < n_layers; l++) {
        struct ir_hparams env;
        struct llmopt_err tmp;
        double kind;
        const char *index = json_string_value(json_object_get(rep, "index"));
        layer_env(&b->m->hp, index ? index : "i", l, &env);
        char key[32];
        if (ir_number_from_json(json_object_get(rep, "kind"), &env, &kind, &tmp)) {
            free(out);
            return NULL;
        }
        snprintf(key, sizeof key, "%lld", (long long)kind);
        out[l] = json_object_get(json_object_get(bodies, key), "body");
    }
    return out;
}

/* Counts the tensors the map names that the file lacks (layers 0..n_layers-1) and
 * lists the first 3, so a refusal says everything that did not bind, not only the
 * first. Names that do not substitute are left to bind_param to report. */
static enum llmopt_status check_tensors_present(struct binder *b, int n_layers,
                                                struct llmopt_err *err) {
    char missing[700] = "";
    int n_missing = 0;
    const char *pname;
    json_t *spec;
    const json_t **bodies = layer_bodies(b, n_layers);
    json_object_foreach((json_t *)b->params_map, pname, spec) {
        const char *names[2];
        param_tensor_names(spec, names);
        bool per_layer = names[0] && strstr(names[0], "{i}");
        for (int layer = 0; layer < (per_layer ? n_layers : 1); layer++) {
            /* a param of one layer kind binds only on the layers of that kind */
            if (per_layer && bodies && !body_reads(bodies[layer], pname)) continue;
            struct param_lookup L;
            if (find_param_tensor(b, names, per_layer ? layer : -1, &L)) continue;
            if (n_missing++ < 3)
                snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s'%.60s'",
                         n_missing > 1 ? ", " : "", L.first);
        }
    }
    free(bodies);
    if (!n_missing) return LLMOPT_OK;
    return err_set(err, LLMOPT_ERR_BIND, "%d tensors missing: %s%s", n_missing, missing,
                   n_missing > 3 ? ", ..." : "");
}

/* The map's "match" clause: each key must hold one of the listed values (null: may be
 * absent). It guards what structure cannot tell apart (a scaled RoPE, a family whose
 * tensors look like another's), as data of the program, not code here. */
static enum llmopt_status check_match(struct binder *b, const json_t *match, struct llmopt_err *err) {
    const char *key_tmpl;
    json_t *allowed;
    json_object_foreach((json_t *)match, key_tmpl, allowed) {
        char key[BIND_NAME_MAX];
        if (!json_is_array(allowed) || !substitute_arch(key_tmpl, b->arch, key, sizeof key))
            return err_set(err, LLMOPT_ERR_FORMAT, "map: match '%s' needs a list of values", key_tmpl);
        json_t *have = weights_value(&b->m->weights, key);
        bool ok = false;
        size_t i;
        json_t *v;
        json_array_foreach(allowed, i, v) {
            if (json_is_null(v) ? !have
                                : have && (json_equal(have, v) ||
                                           (json_is_number(have) && json_is_number(v) &&
                                            json_number_value(have) == json_number_value(v))))
                ok = true;
        }
        char got[128] = "absent";
        if (have) {
            char *text = json_dumps(have, JSON_ENCODE_ANY);
            snprintf(got, sizeof got, "%s", text ? text : "?");
            free(text);
        }
        json_decref(have);
        if (!ok) {
            char *want = json_dumps(allowed, JSON_COMPACT);
            err_set(err, LLMOPT_ERR_BIND, "'%s' is %s, the program takes %s", key, got, want ? want : "?");
            free(want);
            return LLMOPT_ERR_BIND;
        }
    }
    return LLMOPT_OK;
}

static bool load_program_files(struct llmopt_model *m, const char *dir, struct llmopt_err *err) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/graph.json", dir);
    if (json_load_file_capped(path, GRAPH_FILE_MAX_BYTES, &m->graph, err)) return false;
    if (graph_file_check(m->graph, err)) {
        err_prefix(err, "%s", path);
        return false;
    }
    snprintf(path, sizeof path, "%s/map.json", dir);
    if (json_load_file_capped(path, GRAPH_FILE_MAX_BYTES, &m->map, err)) return false;
    if (param_map_check(m->map, err)) {
        err_prefix(err, "%s", path);
        return false;
    }
    return true;
}

void model_unbind(struct llmopt_model *m) {
    for (int32_t i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    m->owned = NULL;
    m->n_owned = m->cap_owned = 0;
    if (m->ir.arena) ir_graph_free(&m->ir);
    json_decref(m->graph);
    json_decref(m->map);
    m->graph = m->map = NULL;
    m->hp.n = 0;
    m->hp.n_layer = 0;
    m->program_name[0] = 0;
}

enum llmopt_status model_bind_program(struct llmopt_model *m, const char *program_dir,
                                      struct llmopt_err *err) {
    struct binder b = {.m = m};
    if (!weights_arch(&m->weights, b.arch, sizeof b.arch)) b.arch[0] = 0;
    if (!load_program_files(m, program_dir, err)) {
        model_unbind(m);
        return err->status ? err->status : LLMOPT_ERR_FORMAT;
    }
    const char *section = weights_kind_section(m->weights.kind);
    b.params_map = json_object_get(json_object_get(m->map, section), "params");
    if (!json_is_object(b.params_map)) {
        err_set(err, LLMOPT_ERR_BIND, "the program's map has no '%s' section", section);
        model_unbind(m);
        return LLMOPT_ERR_BIND;
    }
    const json_t *match = json_object_get(json_object_get(m->map, section), "match");
    if (match && check_match(&b, match, err)) {
        model_unbind(m);
        return LLMOPT_ERR_BIND;
    }
    int64_t n_tensors = weights_n_tensors(&m->weights);
    b.tensor_used = calloc((size_t)(n_tensors ? n_tensors : 1), sizeof(bool));
    enum llmopt_status st = b.tensor_used ? LLMOPT_OK : err_set(err, LLMOPT_ERR_NOMEM, "bind: out of memory");
    if (!st) {
        /* Missing tensors explain a refusal best; then hparams; then import's checks. */
        double n_layers = 1;
        struct llmopt_err hp_err = {0};
        enum llmopt_status hp_st = resolve_hparams(&b, &hp_err);
        if (!hp_st) {
            /* the layer count is the graph's repeat count */
            size_t i;
            json_t *node;
            json_array_foreach(json_object_get(m->graph, "nodes"), i, node) {
                const json_t *count = json_object_get(node, "count");
                struct llmopt_err ignored;
                if (count && ir_number_from_json(count, &m->hp, &n_layers, &ignored)) n_layers = 1;
            }
        }
        if (n_layers < 1 || n_layers > 4096) n_layers = 1;
        st = check_tensors_present(&b, (int)n_layers, err);
        if (!st && hp_st) st = err_set(err, hp_st, "%s", hp_err.msg);
    }
    if (!st) {
        /* ir_import initializes m->ir; parameter strings live in its arena. */
        st = ir_import(m->graph, &m->hp, bind_param, &b, &m->ir, err);
    }
    if (!st) {
        /* Structure matching: every tensor of the file must be used by the program. */
        char extra[600] = "";
        int n_extra = 0;
        for (int64_t i = 0; i < n_tensors; i++) {
            if (b.tensor_used[i]) continue;
            char name[BIND_NAME_MAX];
            struct weights_tensor t;
            if (n_extra++ < 6 && weights_at(&m->weights, i, name, sizeof name, &t))
                snprintf(extra + strlen(extra), sizeof extra - strlen(extra), "%s'%.100s'",
                         n_extra > 1 ? ", " : "", name);
        }
        if (n_extra)
            st = err_set(err, LLMOPT_ERR_BIND, "%d tensors of the file are not used by the program: %s%s",
                         n_extra, extra, n_extra > 6 ? ", ..." : "");
    }
    free(b.tensor_used);
    if (st) {
        model_unbind(m);
        return st;
    }
    const char *name = json_string_value(json_object_get(m->graph, "name"));
    snprintf(m->program_name, sizeof m->program_name, "%s", name ? name : "?");
    snprintf(m->program_dir, sizeof m->program_dir, "%s", program_dir);
    return LLMOPT_OK;
}

static bool dir_has_programs(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return false;
    closedir(d);
    return true;
}

const char *model_programs_dir(const struct llmopt_load_opts *opts, char *buf, size_t cap) {
    if (opts && opts->programs_dir) return opts->programs_dir;
    const char *env = getenv("LLMOPT_PROGRAMS");
    if (env && *env) return env;
    /* Next to the binary: <prefix>/bin/llmopt -> <prefix>/programs, build/llmopt -> programs. */
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            snprintf(buf, cap, "%s/../programs", exe);
            if (dir_has_programs(buf)) return buf;
        }
    }
    return LLMOPT_SOURCE_DIR "/programs";
}
