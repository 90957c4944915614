/* Writing, loading and checking Model Programs. Loading rebuilds the IR node by node
 * from the file, binds parameters by tensor name, re-infers every shape and compares
 * it with the stored one, and takes the stored memory plan after checking it: a
 * corrupted or hand-edited program is refused with the field named, never run. */
#include "runtime/program.h"

#include "backend/kv_cache.h"
#include "format/graph_file.h"
#include "target/profile.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

uint64_t program_checksum(const uint8_t *data, size_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, data + i, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ data[i]) * 0x100000001b3ull;
    h ^= h >> 33;
    return h * 0xc4ceb9fe1a85ec53ull;
}

static const char *sym_expr(struct ir_dim d, char *buf, size_t cap) {
    if (d.sym == IR_SYM_NONE) snprintf(buf, cap, "%" PRId64, d.coef);
    else snprintf(buf, cap, "%" PRId64 "*%s", d.coef, d.sym == IR_SYM_N ? "N" : "M");
    return buf;
}

static json_t *shape_json(const struct ir_shape *s) {
    json_t *a = json_array();
    char buf[48];
    for (int i = 0; i < s->rank; i++) json_array_append_new(a, json_string(sym_expr(s->dims[i], buf, sizeof buf)));
    return a;
}

static json_t *attrs_json(const struct ir_node *n) {
    const struct ir_attrs *at = &n->attrs;
    char buf[48];
    json_t *o = json_object();
    json_object_set_new(o, "value", json_real(at->value));
    json_object_set_new(o, "axis", json_integer(at->axis));
    json_object_set_new(o, "start", json_string(sym_expr(at->start, buf, sizeof buf)));
    json_object_set_new(o, "end", json_string(sym_expr(at->end, buf, sizeof buf)));
    json_object_set_new(o, "step", json_integer(at->step));
    json_t *axes = json_array();
    for (int i = 0; i < at->n_axes; i++) json_array_append_new(axes, json_integer(at->axes[i]));
    json_object_set_new(o, "axes", axes);
    json_object_set_new(o, "keepdim", json_boolean(at->keepdim));
    json_object_set_new(o, "target", shape_json(&at->target));
    json_object_set_new(o, "cast_to", json_string(ir_dtype_name(at->cast_to)));
    json_object_set_new(o, "window", json_integer(at->window));
    json_object_set_new(o, "kv_layer", json_integer(at->kv_layer));
    json_object_set_new(o, "linear_flags", json_integer(at->linear_flags));
    json_object_set_new(o, "linear_act", json_string(ir_op_name(at->linear_act)));
    return o;
}

/* The kernel the reference CPU backend runs for a node ("cpu-ref.linear.q8_0"). */
static const char *kernel_name(const struct ir_graph *g, const struct ir_node *n, char *buf, size_t cap) {
    if (n->op == IR_OP_INPUT || n->op == IR_OP_PARAM) return "none";
    if (n->op == IR_OP_RESHAPE) return "view";
    if (n->constant) return "once";
    if (n->op == IR_OP_LINEAR || n->op == IR_OP_EMBEDDING) {
        const struct ir_node *w = &g->nodes[n->in[n->op == IR_OP_LINEAR ? 1 : 0]];
        snprintf(buf, cap, "cpu-ref.%s.%s", ir_op_name(n->op), ir_dtype_name(w->dtype));
    } else {
        snprintf(buf, cap, "cpu-ref.%s", ir_op_name(n->op));
    }
    return buf;
}

static enum llmopt_status checksum_file(const char *path, uint64_t *size, uint64_t *full,
                                        uint64_t *header, uint64_t header_bytes,
                                        struct llmopt_err *err) {
    struct gguf_file *f;
    enum llmopt_status st = gguf_open(path, &f, err);
    if (st) return st;
    *size = f->size;
    if (full) *full = program_checksum(f->base, f->size);
    uint64_t hb = header_bytes ? header_bytes : f->data_offset;
    if (hb > f->size) hb = f->size;
    *header = program_checksum(f->base, hb);
    gguf_close(f);
    return LLMOPT_OK;
}

enum llmopt_status program_write(const struct llmopt_model *m, const char *weights_path,
                                 const struct program_write_opts *opts, const char *out_path,
                                 struct llmopt_err *err) {
    const struct ir_graph *g = &m->ir;
    if (!m->gguf)
        return err_set(err, LLMOPT_ERR_UNSUPPORTED,
                       "compile: writing a program for a safetensors checkpoint is not supported yet "
                       "(convert it to GGUF, or run the directory directly)");
    struct mem_plan plan;
    enum llmopt_status st = mem_plan_build(g, opts->n_max, opts->n_max, &plan, err);
    if (st) return st;
    json_t *root = json_object();
    json_object_set_new(root, "format", json_string(PROGRAM_FORMAT));
    json_object_set_new(root, "version", json_integer(PROGRAM_VERSION));

    struct gguf_str name = {"", 0}, arch = {"", 0};
    gguf_get_str(m->gguf, "general.name", &name);
    gguf_get_str(m->gguf, "general.architecture", &arch);
    json_t *identity = json_object();
    json_object_set_new(identity, "name", json_stringn(name.ptr, name.len));
    json_object_set_new(identity, "program", json_string(m->program_name));
    json_object_set_new(identity, "program_dir", json_string(m->program_dir));
    json_object_set_new(identity, "architecture_string", json_stringn(arch.ptr, arch.len));
    json_object_set_new(identity, "compiled_by", json_string("llmopt compile"));
    json_object_set_new(identity, "created", json_integer((json_int_t)time(NULL)));
    json_object_set_new(root, "identity", identity);

    /* weights: absolute path, size, checksums of the whole file and of its header */
    char abs_path[PATH_MAX];
    if (!realpath(weights_path, abs_path)) {
        st = err_set(err, LLMOPT_ERR_IO, "%s: %s", weights_path, strerror(errno));
        goto done;
    }
    uint64_t size, full, header;
    if ((st = checksum_file(abs_path, &size, &full, &header, 0, err))) goto done;
    char hex[3][24];
    snprintf(hex[0], sizeof hex[0], "%016" PRIx64, full);
    snprintf(hex[1], sizeof hex[1], "%016" PRIx64, header);
    json_t *w = json_object();
    json_object_set_new(w, "path", json_string(abs_path));
    json_object_set_new(w, "format", json_string("gguf"));
    json_object_set_new(w, "size", json_integer((json_int_t)size));
    json_object_set_new(w, "checksum", json_string(hex[0]));
    json_object_set_new(w, "header_bytes", json_integer((json_int_t)m->gguf->data_offset));
    json_object_set_new(w, "header_checksum", json_string(hex[1]));
    json_t *weights = json_array();
    json_array_append_new(weights, w);
    json_object_set_new(root, "weights", weights);

    json_t *hp = json_object();
    for (int i = 0; i < m->hp.n; i++) json_object_set_new(hp, m->hp.names[i], json_real(m->hp.values[i]));
    json_object_set_new(root, "hparams", hp);

    /* generation facts and tokenizer */
    json_t *gen = json_object();
    json_object_set_new(gen, "vocab_size", json_integer(m->n_vocab));
    json_object_set_new(gen, "max_positions", json_integer(m->ctx_train));
    json_object_set_new(gen, "bos", json_integer(m->vocab ? tok_bos(m->vocab) : -1));
    json_object_set_new(gen, "eos", json_integer(m->vocab ? tok_eos(m->vocab) : -1));
    json_t *stops = json_array();
    for (int32_t id = 0; m->vocab && id < tok_n_tokens(m->vocab); id++)
        if (tok_is_eog(m->vocab, id)) json_array_append_new(stops, json_integer(id));
    json_object_set_new(gen, "stop_ids", stops);
    json_object_set_new(root, "generation", gen);
    json_t *tok = json_object();
    struct gguf_str model_kind = {"", 0}, pre = {"", 0};
    gguf_get_str(m->gguf, "tokenizer.ggml.model", &model_kind);
    gguf_get_str(m->gguf, "tokenizer.ggml.pre", &pre);
    json_object_set_new(tok, "source", json_string(m->vocab ? "weights:0" : "none"));
    json_object_set_new(tok, "model", json_stringn(model_kind.ptr, model_kind.len));
    json_object_set_new(tok, "pre", json_stringn(pre.ptr, pre.len));
    json_object_set_new(tok, "n_tokens", json_integer(m->vocab ? tok_n_tokens(m->vocab) : 0));
    json_object_set_new(tok, "add_bos", json_boolean(m->vocab && tok_add_bos(m->vocab)));
    json_object_set_new(root, "tokenizer", tok);
    struct gguf_str tmpl;
    json_object_set_new(root, "chat_template", gguf_get_str(m->gguf, "tokenizer.chat_template", &tmpl)
                                                   ? json_stringn(tmpl.ptr, tmpl.len)
                                                   : json_null());

    /* state layout: one KV layer per attention node */
    json_t *layers = json_array();
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const struct ir_node *n = &g->nodes[i];
        if (n->op != IR_OP_ATTENTION) continue;
        const struct ir_shape *k = &g->nodes[n->in[1]].shape;
        json_t *l = json_object();
        json_object_set_new(l, "kind", json_string("attention"));
        json_object_set_new(l, "node", json_integer(i));
        json_object_set_new(l, "kv_heads", json_integer(k->dims[1].coef));
        json_object_set_new(l, "head_dim", json_integer(k->dims[3].coef));
        json_object_set_new(l, "window", json_integer(n->attrs.window));
        json_array_append_new(layers, l);
    }
    json_t *state = json_object();
    json_object_set_new(state, "block_size", json_integer(16));
    json_object_set_new(state, "kv_dtype", json_string(llmopt_kv_type_name(opts->kv_type)));
    json_object_set_new(state, "layers", layers);
    json_object_set_new(root, "state_layout", state);

    /* target: the profile (validated) decides the thread count and gives the decode
     * roofline: bytes read per token over the measured read bandwidth */
    json_t *target = json_object();
    json_object_set_new(target, "backend", json_string("cpu"));
    json_t *profile = json_null();
    int threads = 0;
    if (opts->profile_path) {
        struct target_profile tp;
        if ((st = target_profile_read_json(opts->profile_path, &tp, err)) ||
            (st = json_load_file_capped(opts->profile_path, 1u << 20, &profile, err))) {
            json_decref(target);
            goto done;
        }
        threads = tp.threads;
        double gbps = target_profile_read_bandwidth_gbps(&tp);
        uint64_t weight_bytes = ir_weight_bytes_per_token(g);
        json_object_set_new(target, "read_bandwidth_gbps", json_real(gbps));
        json_object_set_new(target, "weight_bytes_per_token", json_integer((json_int_t)weight_bytes));
        json_object_set_new(target, "decode_roofline_tok_s",
                            json_real(weight_bytes ? gbps * 1e9 / (double)weight_bytes : 0));
    }
    json_object_set_new(target, "threads", json_integer(threads)); /* 0: every usable core */
    json_object_set_new(target, "profile", profile);
    json_object_set_new(root, "target", target);

    /* the entrypoint: nodes after fusion, kernel, arena offset */
    json_t *nodes = json_array();
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const struct ir_node *n = &g->nodes[i];
        json_t *o = json_object();
        char kbuf[64];
        json_object_set_new(o, "op", json_string(ir_op_name(n->op)));
        json_object_set_new(o, "dtype", json_string(ir_dtype_name(n->dtype)));
        json_object_set_new(o, "shape", shape_json(&n->shape));
        json_t *in = json_array();
        for (int k = 0; k < n->n_in; k++) json_array_append_new(in, json_integer(n->in[k]));
        json_object_set_new(o, "in", in);
        if (n->name) json_object_set_new(o, "name", json_string(n->name));
        if (n->op != IR_OP_INPUT && n->op != IR_OP_PARAM) json_object_set_new(o, "attrs", attrs_json(n));
        if (n->constant) json_object_set_new(o, "constant", json_true());
        json_object_set_new(o, "kernel", json_string(kernel_name(g, n, kbuf, sizeof kbuf)));
        json_object_set_new(o, "offset", json_integer(plan.offset[i]));
        if (n->op == IR_OP_PARAM) {
            json_t *p = json_object();
            json_object_set_new(p, "weights", json_integer(0));
            json_object_set_new(p, "tensor", json_string(n->weight.source));
            if (n->weight.transform) {
                json_error_t jerr;
                json_t *t = json_loads(n->weight.transform, 0, &jerr);
                if (t) json_object_set_new(p, "transform", t);
            }
            json_object_set_new(o, "param", p);
        }
        json_array_append_new(nodes, o);
    }
    json_t *ep = json_object();
    json_object_set_new(ep, "name", json_string("forward"));
    json_object_set_new(ep, "n_max", json_integer(opts->n_max));
    json_object_set_new(ep, "arena_bytes", json_integer((json_int_t)plan.arena_bytes));
    json_object_set_new(ep, "naive_bytes", json_integer((json_int_t)plan.naive_bytes));
    json_object_set_new(ep, "kernels_per_step", json_integer(ir_count_kernels(g)));
    json_t *inputs = json_array();
    for (int k = 0; k < IR_INPUT_COUNT; k++) json_array_append_new(inputs, json_integer(g->inputs[k]));
    json_object_set_new(ep, "inputs", inputs);
    json_object_set_new(ep, "output", json_integer(g->output));
    json_object_set_new(ep, "nodes", nodes);
    json_t *eps = json_array();
    json_array_append_new(eps, ep);
    json_object_set_new(root, "entrypoints", eps);

    if (json_dump_file(root, out_path, JSON_INDENT(1) | JSON_PRESERVE_ORDER) != 0)
        st = err_set(err, LLMOPT_ERR_IO, "%s: cannot write", out_path);
done:
    json_decref(root);
    mem_plan_free(&plan);
    return st;
}

/* ---- loading ---------------------------------------------------------------------- */

#define FIELD_FAIL(...) err_set(err, LLMOPT_ERR_FORMAT, __VA_ARGS__)

static bool get_int(const json_t *o, const char *key, json_int_t lo, json_int_t hi, json_int_t *out) {
    const json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) return false;
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi) return false;
    *out = x;
    return true;
}

static enum llmopt_status dims_from_json(const json_t *arr, struct ir_shape *s, const char *what,
                                         int32_t node, struct llmopt_err *err) {
    static const struct ir_hparams none = {0};
    if (!json_is_array(arr) || json_array_size(arr) > IR_MAX_RANK)
        return FIELD_FAIL("program: node %d: '%s' is not a list of at most %d dims", node, what, IR_MAX_RANK);
    s->rank = (int)json_array_size(arr);
    for (int i = 0; i < s->rank; i++)
        if (ir_dim_from_json(json_array_get(arr, (size_t)i), &none, &s->dims[i], err))
            return FIELD_FAIL("program: node %d: '%s' dim %d is not an integer, c*N or c*M", node, what, i);
    return LLMOPT_OK;
}

static enum llmopt_status attrs_from_json(const json_t *o, struct ir_node *n, int32_t idx,
                                          struct llmopt_err *err) {
    static const struct ir_hparams none = {0};
    struct ir_attrs *at = &n->attrs;
    json_int_t v;
    if (!json_is_object(o)) return FIELD_FAIL("program: node %d: 'attrs' missing", idx);
    const json_t *value = json_object_get(o, "value");
    if (!json_is_number(value)) return FIELD_FAIL("program: node %d: attrs.value missing", idx);
    at->value = json_number_value(value);
    if (!get_int(o, "axis", -64, INT32_MAX, &v)) return FIELD_FAIL("program: node %d: attrs.axis", idx);
    at->axis = v;
    if (ir_dim_from_json(json_object_get(o, "start"), &none, &at->start, err) ||
        ir_dim_from_json(json_object_get(o, "end"), &none, &at->end, err))
        return FIELD_FAIL("program: node %d: attrs.start/end", idx);
    if (!get_int(o, "step", 0, INT32_MAX, &v)) return FIELD_FAIL("program: node %d: attrs.step", idx);
    at->step = v;
    const json_t *axes = json_object_get(o, "axes");
    if (!json_is_array(axes) || json_array_size(axes) > IR_MAX_RANK)
        return FIELD_FAIL("program: node %d: attrs.axes", idx);
    at->n_axes = (int)json_array_size(axes);
    for (int i = 0; i < at->n_axes; i++) {
        const json_t *a = json_array_get(axes, (size_t)i);
        if (!json_is_integer(a) || json_integer_value(a) < 0 || json_integer_value(a) >= IR_MAX_RANK)
            return FIELD_FAIL("program: node %d: attrs.axes[%d]", idx, i);
        at->axes[i] = json_integer_value(a);
    }
    at->keepdim = json_is_true(json_object_get(o, "keepdim"));
    enum llmopt_status st = dims_from_json(json_object_get(o, "target"), &at->target, "attrs.target", idx, err);
    if (st) return st;
    const char *cast = json_string_value(json_object_get(o, "cast_to"));
    if (!cast || !ir_dtype_parse(cast, &at->cast_to)) return FIELD_FAIL("program: node %d: attrs.cast_to", idx);
    if (!get_int(o, "window", 0, INT32_MAX, &v)) return FIELD_FAIL("program: node %d: attrs.window", idx);
    at->window = v;
    if (!get_int(o, "kv_layer", 0, INT32_MAX, &v)) return FIELD_FAIL("program: node %d: attrs.kv_layer", idx);
    at->kv_layer = (int32_t)v;
    if (!get_int(o, "linear_flags", 0, 7, &v)) return FIELD_FAIL("program: node %d: attrs.linear_flags", idx);
    at->linear_flags = (uint32_t)v;
    const char *act = json_string_value(json_object_get(o, "linear_act"));
    if (!act || !ir_op_parse(act, &at->linear_act)) return FIELD_FAIL("program: node %d: attrs.linear_act", idx);
    return LLMOPT_OK;
}

static enum llmopt_status load_weights(struct llmopt_model *m, const json_t *root, bool verify_full,
                                       struct llmopt_err *err) {
    const json_t *weights = json_object_get(root, "weights");
    if (!json_is_array(weights) || json_array_size(weights) != 1)
        return FIELD_FAIL("program: 'weights' must list exactly one file");
    const json_t *w = json_array_get(weights, 0);
    const char *path = json_string_value(json_object_get(w, "path"));
    json_int_t size, header_bytes;
    const char *sum = json_string_value(json_object_get(w, "checksum"));
    const char *hsum = json_string_value(json_object_get(w, "header_checksum"));
    if (!path || !sum || !hsum || !get_int(w, "size", 0, INT64_MAX, &size) ||
        !get_int(w, "header_bytes", 0, INT64_MAX, &header_bytes))
        return FIELD_FAIL("program: weights[0] needs path, size, checksum, header_bytes, header_checksum");
    uint64_t got_size, got_full = 0, got_header;
    enum llmopt_status st = checksum_file(path, &got_size, verify_full ? &got_full : NULL, &got_header,
                                          (uint64_t)header_bytes, err);
    if (st) {
        err_prefix(err, "program: weights[0].path");
        return st;
    }
    if ((json_int_t)got_size != size)
        return err_set(err, LLMOPT_ERR_BIND, "program: weights[0] '%s' is %" PRIu64 " bytes, the program was compiled for %lld (weights[0].size)",
                       path, got_size, (long long)size);
    char hex[24];
    snprintf(hex, sizeof hex, "%016" PRIx64, got_header);
    if (strcmp(hex, hsum))
        return err_set(err, LLMOPT_ERR_BIND, "program: weights[0] '%s' changed: header checksum %s, expected %s (weights[0].header_checksum)",
                       path, hex, hsum);
    if (verify_full) {
        snprintf(hex, sizeof hex, "%016" PRIx64, got_full);
        if (strcmp(hex, sum))
            return err_set(err, LLMOPT_ERR_BIND, "program: weights[0] '%s' changed: checksum %s, expected %s (weights[0].checksum)",
                           path, hex, sum);
    }
    st = weights_open(path, &m->weights, err);
    m->gguf = m->weights.gguf;
    if (!st && !m->gguf) st = FIELD_FAIL("program: weights[0] is not a GGUF file");
    return st;
}

static enum llmopt_status load_nodes(struct llmopt_model *m, const json_t *ep, int64_t n_max,
                                     int64_t **offsets_out, struct llmopt_err *err) {
    const json_t *nodes = json_object_get(ep, "nodes");
    if (!json_is_array(nodes) || json_array_size(nodes) > IR_MAX_NODES)
        return FIELD_FAIL("program: entrypoints[0].nodes missing or too long");
    struct ir_graph *g = &m->ir;
    enum llmopt_status st = ir_graph_init(g, err);
    if (st) return st;
    size_t n = json_array_size(nodes);
    int64_t *offsets = malloc((n ? n : 1) * sizeof *offsets);
    if (!offsets) return err_set(err, LLMOPT_ERR_NOMEM, "program: out of memory");
    *offsets_out = offsets;
    int n_inputs = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t idx = (int32_t)i;
        const json_t *o = json_array_get(nodes, i);
        const char *op_name = json_string_value(json_object_get(o, "op"));
        enum ir_op op;
        if (!op_name || !ir_op_parse(op_name, &op)) return FIELD_FAIL("program: node %d: unknown op '%s'", idx, op_name ? op_name : "");
        const json_t *in = json_object_get(o, "in");
        if (!json_is_array(in) || json_array_size(in) > 64) return FIELD_FAIL("program: node %d: 'in'", idx);
        int32_t operands[64];
        for (size_t k = 0; k < json_array_size(in); k++) {
            const json_t *x = json_array_get(in, k);
            if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= idx)
                return FIELD_FAIL("program: node %d: operand %zu refers to an unknown buffer", idx, k);
            operands[k] = (int32_t)json_integer_value(x);
        }
        if (ir_add_node(g, op, operands, (int)json_array_size(in), err) != idx) return err->status;
        struct ir_node *node = &g->nodes[idx];
        const char *name = json_string_value(json_object_get(o, "name"));
        node->name = name ? ir_strdup(g, name) : NULL;
        node->constant = json_is_true(json_object_get(o, "constant"));
        json_int_t off;
        if (!get_int(o, "offset", -1, INT64_MAX, &off)) return FIELD_FAIL("program: node %d: 'offset'", idx);
        offsets[i] = off;
        struct ir_shape stored;
        if ((st = dims_from_json(json_object_get(o, "shape"), &stored, "shape", idx, err))) return st;
        const char *dt = json_string_value(json_object_get(o, "dtype"));
        enum ir_dtype dtype;
        if (!dt || !ir_dtype_parse(dt, &dtype)) return FIELD_FAIL("program: node %d: 'dtype'", idx);
        if (op == IR_OP_INPUT) {
            if (n_inputs >= IR_INPUT_COUNT || !name || strcmp(name, ir_input_names[n_inputs]))
                return FIELD_FAIL("program: node %d: input %d must be '%s'", idx, n_inputs,
                                  n_inputs < IR_INPUT_COUNT ? ir_input_names[n_inputs] : "?");
            struct ir_dim want = {1, n_inputs == IR_INPUT_OUT_ROWS ? IR_SYM_M : IR_SYM_N};
            if (stored.rank != 1 || !ir_dim_eq(stored.dims[0], want) || dtype != IR_DTYPE_I32)
                return FIELD_FAIL("program: node %d: input '%s' must be i32 [%s]", idx, ir_input_names[n_inputs],
                                  n_inputs == IR_INPUT_OUT_ROWS ? "M" : "N");
            node->dtype = IR_DTYPE_I32;
            node->shape = stored;
            node->name = ir_input_names[n_inputs];
            g->inputs[n_inputs++] = idx;
            continue;
        }
        if (op == IR_OP_PARAM) {
            const json_t *p = json_object_get(o, "param");
            const char *tensor = json_string_value(json_object_get(p, "tensor"));
            struct weights_tensor wt;
            if (!tensor || !weights_find(&m->weights, tensor, &wt))
                return err_set(err, LLMOPT_ERR_BIND, "program: node %d: tensor '%s' not in the weights file", idx, tensor ? tensor : "(none)");
            const struct weights_tensor *t = &wt;
            for (int d = 0; d < stored.rank; d++)
                if (stored.dims[d].sym) return FIELD_FAIL("program: node %d: a parameter shape uses N or M", idx);
            node->shape = stored;
            if ((st = model_bind_tensor(m, name ? name : tensor, t, &stored, json_object_get(p, "transform"), &node->weight, err)))
                return st;
            node->dtype = node->weight.dtype;
            continue;
        }
        if ((st = attrs_from_json(json_object_get(o, "attrs"), node, idx, err))) return st;
        if (op == IR_OP_ATTENTION) {
            if (node->attrs.kv_layer != g->n_kv_layers)
                return FIELD_FAIL("program: node %d: attention kv_layer %d, expected %d", idx, node->attrs.kv_layer, g->n_kv_layers);
            g->n_kv_layers++;
        }
        bool constant = node->constant;
        if ((st = ir_infer_node(g, idx, err))) {
            err_prefix(err, "program: node %d", idx);
            return st;
        }
        node->constant = node->constant || constant;
        if (!ir_shape_eq(&stored, &node->shape) || dtype != node->dtype) {
            char a[128], b[128];
            return FIELD_FAIL("program: node %d (%s): stored shape %s %s, inferred %s %s", idx, op_name,
                              ir_shape_str(&stored, a, sizeof a), dt, ir_shape_str(&node->shape, b, sizeof b),
                              ir_dtype_name(node->dtype));
        }
    }
    json_int_t output;
    if (!get_int(ep, "output", 0, (json_int_t)n - 1, &output))
        return FIELD_FAIL("program: entrypoints[0].output refers to an unknown buffer");
    g->output = (int32_t)output;
    if (n_inputs != IR_INPUT_COUNT) return FIELD_FAIL("program: %d inputs, expected %d", n_inputs, IR_INPUT_COUNT);
    ir_count_uses(g);
    (void)n_max;
    return ir_verify(g, err);
}

static enum llmopt_status check_state_layout(struct llmopt_model *m, const json_t *root,
                                             struct llmopt_err *err) {
    const json_t *state = json_object_get(root, "state_layout");
    const json_t *layers = json_object_get(state, "layers");
    const char *kv_name = json_string_value(json_object_get(state, "kv_dtype"));
    if (!llmopt_kv_type_parse(kv_name, &m->kv_type))
        return FIELD_FAIL("program: state_layout.kv_dtype is '%s', expected f32, f16 or q8_0",
                          kv_name ? kv_name : "(missing)");
    if (!json_is_array(layers)) return FIELD_FAIL("program: state_layout.layers missing");
    if ((int32_t)json_array_size(layers) != m->ir.n_kv_layers)
        return FIELD_FAIL("program: state_layout.layers lists %zu layers, the plan has %d attention nodes",
                          json_array_size(layers), m->ir.n_kv_layers);
    size_t i;
    json_t *l;
    json_array_foreach(layers, i, l) {
        json_int_t node, kv_heads, head_dim, window;
        if (!get_int(l, "node", 0, m->ir.n_nodes - 1, &node) || m->ir.nodes[node].op != IR_OP_ATTENTION)
            return FIELD_FAIL("program: state_layout.layers[%zu].node is not an attention node", i);
        const struct ir_node *a = &m->ir.nodes[node];
        const struct ir_shape *k = &m->ir.nodes[a->in[1]].shape;
        if (!get_int(l, "kv_heads", 1, INT32_MAX, &kv_heads) || kv_heads != k->dims[1].coef ||
            !get_int(l, "head_dim", 1, INT32_MAX, &head_dim) || head_dim != k->dims[3].coef ||
            !get_int(l, "window", 0, INT32_MAX, &window) || window != a->attrs.window ||
            a->attrs.kv_layer != (int32_t)i)
            return FIELD_FAIL("program: state_layout.layers[%zu] (kv_heads/head_dim/window) is inconsistent with node %lld",
                              i, (long long)node);
        if (m->kv_type == LLMOPT_KV_Q8_0 && head_dim % 32)
            return FIELD_FAIL("program: state_layout.kv_dtype q8_0 needs head_dim a multiple of 32, layers[%zu] has %lld",
                              i, (long long)head_dim);
    }
    return LLMOPT_OK;
}

static enum llmopt_status check_generation(struct llmopt_model *m, const json_t *root,
                                           struct llmopt_err *err) {
    const json_t *gen = json_object_get(root, "generation");
    json_int_t vocab, max_pos, bos, eos;
    if (!get_int(gen, "vocab_size", 1, INT32_MAX, &vocab) || vocab != m->n_vocab)
        return FIELD_FAIL("program: generation.vocab_size does not match the output's %d rows", m->n_vocab);
    if (!get_int(gen, "max_positions", 1, INT32_MAX, &max_pos))
        return FIELD_FAIL("program: generation.max_positions missing");
    m->ctx_train = (int32_t)max_pos;
    if (!get_int(gen, "bos", -1, vocab - 1, &bos)) return FIELD_FAIL("program: generation.bos is out of range [-1, %lld)", (long long)vocab);
    if (!get_int(gen, "eos", -1, vocab - 1, &eos)) return FIELD_FAIL("program: generation.eos is out of range [-1, %lld)", (long long)vocab);
    const json_t *stops = json_object_get(gen, "stop_ids");
    if (!json_is_array(stops)) return FIELD_FAIL("program: generation.stop_ids missing");
    for (size_t i = 0; i < json_array_size(stops); i++) {
        const json_t *s = json_array_get(stops, i);
        if (!json_is_integer(s) || json_integer_value(s) < 0 || json_integer_value(s) >= vocab)
            return FIELD_FAIL("program: generation.stop_ids[%zu] is out of range [0, %lld)", i, (long long)vocab);
    }
    const json_t *tok = json_object_get(root, "tokenizer");
    json_int_t n_tokens;
    if (!get_int(tok, "n_tokens", 0, vocab, &n_tokens))
        return FIELD_FAIL("program: tokenizer.n_tokens is out of range [0, %lld]", (long long)vocab);
    if (m->vocab && (tok_n_tokens(m->vocab) != n_tokens || tok_bos(m->vocab) != bos || tok_eos(m->vocab) != eos))
        return FIELD_FAIL("program: tokenizer (n_tokens/bos/eos) does not match the weights file's vocabulary");
    return LLMOPT_OK;
}

enum llmopt_status program_load(const char *path, bool verify_full, struct llmopt_model **out,
                                struct llmopt_err *err) {
    json_t *root = NULL;
    enum llmopt_status st = json_load_file_capped(path, PROGRAM_MAX_BYTES, &root, err);
    if (st) return st;
    struct llmopt_model *m = calloc(1, sizeof *m);
    int64_t *offsets = NULL;
    if (!m) {
        json_decref(root);
        return err_set(err, LLMOPT_ERR_NOMEM, "out of memory");
    }
    const char *format = json_string_value(json_object_get(root, "format"));
    json_int_t version = 0;
    if (!json_is_object(root) || !format || strcmp(format, PROGRAM_FORMAT)) {
        st = FIELD_FAIL("program: field 'format' is not '%s'", PROGRAM_FORMAT);
        goto fail;
    }
    if (!get_int(root, "version", 0, INT32_MAX, &version) || version != PROGRAM_VERSION) {
        st = err_set(err, LLMOPT_ERR_UNSUPPORTED, "program: version %lld, this build reads %d (field 'version')",
                     (long long)version, PROGRAM_VERSION);
        goto fail;
    }
    if ((st = load_weights(m, root, verify_full, err))) goto fail;
    const json_t *hp = json_object_get(root, "hparams");
    if (!json_is_object(hp) || json_object_size(hp) > IR_MAX_HPARAMS) {
        st = FIELD_FAIL("program: 'hparams' missing");
        goto fail;
    }
    /* hparam names must outlive the model: keep them in the IR arena */
    const json_t *eps = json_object_get(root, "entrypoints");
    const json_t *ep = json_array_get(eps, 0);
    json_int_t n_max, arena_bytes;
    if (!json_is_array(eps) || json_array_size(eps) != 1 || !get_int(ep, "n_max", 1, 1 << 20, &n_max) ||
        !get_int(ep, "arena_bytes", 0, (json_int_t)1 << 40, &arena_bytes)) {
        st = FIELD_FAIL("program: entrypoints[0] needs n_max and arena_bytes");
        goto fail;
    }
    {
        const char *key;
        json_t *v;
        m->hp.n = 0;
        json_object_foreach((json_t *)hp, key, v) {
            if (!json_is_number(v)) {
                st = FIELD_FAIL("program: hparams.%s is not a number", key);
                goto fail;
            }
            m->hp.values[m->hp.n] = json_number_value(v);
            m->hp.names[m->hp.n++] = key; /* fixed below, once the IR arena exists */
        }
    }
    if ((st = load_nodes(m, ep, n_max, &offsets, err))) goto fail;
    for (int i = 0; i < m->hp.n; i++) m->hp.names[i] = ir_strdup(&m->ir, m->hp.names[i]);
    const struct ir_shape *logits = &m->ir.nodes[m->ir.output].shape;
    m->n_vocab = (int32_t)logits->dims[logits->rank - 1].coef;
    struct llmopt_err tok_err;
    if (tok_vocab_from_gguf(m->gguf, &m->vocab, &tok_err)) m->vocab = NULL;
    if ((st = check_generation(m, root, err)) || (st = check_state_layout(m, root, err))) goto fail;
    m->plan = calloc(1, sizeof *m->plan);
    if (!m->plan) {
        st = err_set(err, LLMOPT_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((st = mem_plan_from_offsets(&m->ir, n_max, n_max, offsets, (size_t)arena_bytes, m->plan, err))) {
        free(m->plan);
        m->plan = NULL;
        err_prefix(err, "program: entrypoints[0]");
        goto fail;
    }
    const json_t *identity = json_object_get(root, "identity");
    snprintf(m->program_name, sizeof m->program_name, "%s",
             json_string_value(json_object_get(identity, "program")) ? json_string_value(json_object_get(identity, "program")) : "?");
    m->passes.nodes_before = m->passes.nodes_after = m->ir.n_nodes;
    m->passes.kernels_before = m->passes.kernels_after = ir_count_kernels(&m->ir);
    free(offsets);
    json_decref(root);
    *out = m;
    return LLMOPT_OK;
fail:
    free(offsets);
    /* hp.names may still point into root: clear them before the model goes */
    m->hp.n = 0;
    llmopt_model_free(m);
    json_decref(root);
    return st ? st : LLMOPT_ERR_FORMAT;
}

/* ---- public API ---------------------------------------------------------------------- */

enum llmopt_status llmopt_program_write(const struct llmopt_model *m, const char *weights_path,
                                        const struct llmopt_program_opts *opts,
                                        const char *out_path, struct llmopt_err *err) {
    if (!m->ir.arena) return err_set(err, LLMOPT_ERR_INVALID_ARG, "compile: the model was loaded vocab-only");
    struct program_write_opts wo = {opts && opts->n_batch > 0 ? opts->n_batch : 256,
                                    opts ? opts->profile_path : NULL,
                                    opts && opts->kv_type ? opts->kv_type : LLMOPT_KV_F16};
    if ((unsigned)wo.kv_type >= LLMOPT_KV_TYPE_COUNT)
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "compile: unknown KV type %d", (int)wo.kv_type);
    for (int32_t i = 0; i < m->ir.n_nodes && wo.kv_type == LLMOPT_KV_Q8_0; i++) {
        const struct ir_node *n = &m->ir.nodes[i];
        int64_t head_dim = n->op == IR_OP_ATTENTION ? m->ir.nodes[n->in[1]].shape.dims[3].coef : 0;
        if (head_dim % 32)
            return err_set(err, LLMOPT_ERR_UNSUPPORTED,
                           "compile: --kv-type q8_0 needs a head size that is a multiple of 32, attention node %d has %lld",
                           i, (long long)head_dim);
    }
    return program_write(m, weights_path, &wo, out_path, err);
}

enum llmopt_status llmopt_program_check(const char *path, struct llmopt_err *err) {
    struct llmopt_model *m = NULL;
    enum llmopt_status st = program_load(path, true, &m, err);
    llmopt_model_free(m);
    return st;
}

void llmopt_model_plan_bytes(const struct llmopt_model *m, int32_t n_batch, size_t *arena,
                             size_t *naive) {
    struct mem_plan plan;
    struct llmopt_err err;
    *arena = *naive = 0;
    if (!m->ir.arena || mem_plan_build(&m->ir, n_batch, n_batch, &plan, &err)) return;
    *arena = plan.arena_bytes;
    *naive = plan.naive_bytes;
    mem_plan_free(&plan);
}

uint64_t llmopt_model_weight_bytes_per_token(const struct llmopt_model *m) {
    return m->ir.arena ? ir_weight_bytes_per_token(&m->ir) : 0;
}
