#include "runtime/weights.h"

#include "format/graph_file.h"
#include "format/quant.h"

#include <string.h>
#include <sys/stat.h>

const char *weights_kind_section(enum weights_kind kind) {
    static const char *const names[WEIGHTS_KIND_COUNT] = {[WEIGHTS_GGUF] = "gguf",
                                                          [WEIGHTS_SAFETENSORS] = "safetensors"};
    return (unsigned)kind < WEIGHTS_KIND_COUNT ? names[kind] : "?";
}

enum llmopt_status weights_open(const char *path, struct weights_source *out,
                                struct llmopt_err *err) {
    memset(out, 0, sizeof *out);
    snprintf(out->path, sizeof out->path, "%s", path);
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        char cfg[4200];
        snprintf(cfg, sizeof cfg, "%s/config.json", path);
        enum llmopt_status st = json_load_file_capped(cfg, 16u << 20, &out->config, err);
        if (st) return st;
        if (!json_is_object(out->config)) {
            weights_close(out);
            return err_set(err, LLMOPT_ERR_FORMAT, "%s: not a JSON object", cfg);
        }
        out->kind = WEIGHTS_SAFETENSORS;
        if ((st = st_open_dir(path, &out->st, err))) weights_close(out);
        return st;
    }
    out->kind = WEIGHTS_GGUF;
    return gguf_open(path, &out->gguf, err);
}

void weights_close(struct weights_source *w) {
    if (w->gguf) gguf_close(w->gguf);
    if (w->st) st_close(w->st);
    json_decref(w->config);
    w->gguf = NULL;
    w->st = NULL;
    w->config = NULL;
}

int64_t weights_n_tensors(const struct weights_source *w) {
    return w->kind == WEIGHTS_GGUF ? (int64_t)w->gguf->n_tensors : (int64_t)st_n_tensors(w->st);
}

static void from_gguf(const struct gguf_file *f, const struct gguf_tensor *t, struct weights_tensor *out) {
    out->index = t - f->tensors;
    out->n_dims = (int)t->n_dims;
    for (int d = 0; d < out->n_dims; d++) out->shape[d] = (int64_t)t->ne[t->n_dims - 1 - d];
    out->raw_type = (int)t->type;
    out->dtype_known = quant_ir_dtype_of(t->type, &out->dtype);
    out->data = t->data;
    out->n_bytes = t->n_bytes;
}

static void from_st(const struct st_tensor *t, int64_t index, struct weights_tensor *out) {
    out->index = index;
    out->n_dims = t->n_dims;
    for (int d = 0; d < t->n_dims; d++) out->shape[d] = t->shape[d];
    out->raw_type = (int)t->dtype;
    out->dtype_known = true;
    out->dtype = t->dtype == ST_DTYPE_F32 ? IR_DTYPE_F32 : t->dtype == ST_DTYPE_F16 ? IR_DTYPE_F16 : IR_DTYPE_BF16;
    out->data = t->data;
    out->n_bytes = t->n_bytes;
}

bool weights_find(const struct weights_source *w, const char *name, struct weights_tensor *out) {
    memset(out, 0, sizeof *out);
    out->name = name;
    if (w->kind == WEIGHTS_GGUF) {
        const struct gguf_tensor *t = gguf_find_tensor(w->gguf, name);
        if (!t) return false;
        from_gguf(w->gguf, t, out);
        return true;
    }
    const struct st_tensor *t = st_find_tensor(w->st, name);
    if (!t) return false;
    from_st(t, (int64_t)st_tensor_index(w->st, t), out);
    return true;
}

bool weights_at(const struct weights_source *w, int64_t i, char *name_buf, size_t cap,
                struct weights_tensor *out) {
    if (i < 0 || i >= weights_n_tensors(w)) return false;
    memset(out, 0, sizeof *out);
    if (w->kind == WEIGHTS_GGUF) {
        const struct gguf_tensor *t = &w->gguf->tensors[i];
        snprintf(name_buf, cap, "%.*s", (int)t->name.len, t->name.ptr);
        from_gguf(w->gguf, t, out);
    } else {
        const struct st_tensor *t = st_tensor_at(w->st, (uint64_t)i);
        snprintf(name_buf, cap, "%s", t->name);
        from_st(t, i, out);
    }
    out->name = name_buf;
    return true;
}

/* dotted path into config.json: "rope_parameters.rope_theta" */
static const json_t *config_path(const json_t *v, const char *key) {
    char part[256];
    const char *p = key;
    while (v && *p) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        if (n >= sizeof part) return NULL;
        memcpy(part, p, n);
        part[n] = 0;
        v = json_object_get(v, part);
        p += n + (dot ? 1 : 0);
    }
    return v;
}

json_t *weights_value(const struct weights_source *w, const char *key) {
    if (w->kind == WEIGHTS_SAFETENSORS) {
        const json_t *v = config_path(w->config, key);
        return v && !json_is_null(v) ? json_incref((json_t *)v) : NULL;
    }
    struct gguf_str s;
    double d;
    bool b;
    if (gguf_get_str(w->gguf, key, &s)) return json_stringn(s.ptr, s.len);
    if (gguf_get_bool(w->gguf, key, &b)) return json_boolean(b);
    if (gguf_get_f64(w->gguf, key, &d)) return json_real(d);
    return NULL;
}

bool weights_number(const struct weights_source *w, const char *key, double *out) {
    if (w->kind == WEIGHTS_GGUF) return gguf_get_f64(w->gguf, key, out);
    const json_t *v = config_path(w->config, key);
    if (json_is_number(v)) {
        *out = json_number_value(v);
        return true;
    }
    if (json_is_boolean(v)) {
        *out = json_is_true(v);
        return true;
    }
    return false;
}

bool weights_arch(const struct weights_source *w, char *buf, size_t cap) {
    if (w->kind == WEIGHTS_GGUF) {
        struct gguf_str s;
        if (!gguf_get_str(w->gguf, "general.architecture", &s) || s.len >= cap) return false;
        memcpy(buf, s.ptr, s.len);
        buf[s.len] = 0;
        return true;
    }
    const char *t = json_string_value(json_object_get(w->config, "model_type"));
    if (!t || strlen(t) >= cap) return false;
    snprintf(buf, cap, "%s", t);
    return true;
}
