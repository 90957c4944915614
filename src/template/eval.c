/* Template evaluator: walks the AST with Python/Jinja2 semantics.
 *
 * Scopes follow Jinja2: the top level is one frame; each for-loop iteration, macro
 * call, {% with %} and {% generation %} body gets a fresh frame whose writes vanish
 * when it ends (hence namespace() for state carried out of loops); if-blocks share
 * their enclosing frame. A macro resolves free names in the frame where it was
 * defined, at call time. Undefined behaves like Jinja's default Undefined: it prints
 * as nothing, is falsy and iterates as empty, while attribute access, calls and
 * arithmetic on it are errors. */
#include "template/tpl_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TPL_MAX_EVAL_DEPTH 3000 /* C recursion: nested expressions x blocks x calls */

void tpl_limits_default(struct tpl_limits *lim) {
    lim->max_output = 16u << 20;
    lim->max_memory = 512u << 20;
    lim->max_steps = 50000000;
    lim->max_depth = 64;
}

bool tpl_fail_v(struct tpl_render *r, const struct tpl_node *at, enum llmopt_status status,
                const char *fmt, va_list ap) {
    if (r->status) return false; /* keep the first error */
    r->status = status;
    char msg[800];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (at)
        err_set(r->err, status, "%s:%u:%u: %s", r->tpl->name, at->line, at->col, msg);
    else
        err_set(r->err, status, "%s: %s", r->tpl->name, msg);
    return false;
}

bool tpl_fail(struct tpl_render *r, const struct tpl_node *at, enum llmopt_status status,
              const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tpl_fail_v(r, at, status, fmt, ap);
    va_end(ap);
    return false;
}

bool tpl_fail_undefined(struct tpl_render *r, const struct tpl_node *at, struct tpl_value v) {
    if (v.u.s.len)
        return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "%.*s", (int)v.u.s.len, v.u.s.ptr);
    return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "operation on an undefined value");
}

bool tpl_step(struct tpl_render *r, const struct tpl_node *at) {
    if (++r->steps <= r->lim.max_steps) return true;
    return tpl_fail(r, at, LLMOPT_ERR_LIMIT, "the template took more than %llu steps",
                    (unsigned long long)r->lim.max_steps);
}

/* ---- frames ----------------------------------------------------------------------- */

static struct tpl_frame *frame_new(struct tpl_render *r, const struct tpl_node *at, struct tpl_frame *parent) {
    struct tpl_frame *f = tpl_alloc(r, at, sizeof *f);
    if (f) f->parent = parent;
    return f;
}

static struct tpl_value *frame_find(struct tpl_frame *f, struct tpl_str name) {
    for (; f; f = f->parent)
        for (uint32_t i = f->n; i-- > 0;)
            if (tpl_str_eq(f->vars[i].name, name)) return &f->vars[i].val;
    return NULL;
}

static bool frame_set(struct tpl_render *r, const struct tpl_node *at, struct tpl_frame *f,
                      struct tpl_str name, struct tpl_value val) {
    for (uint32_t i = 0; i < f->n; i++)
        if (tpl_str_eq(f->vars[i].name, name)) {
            f->vars[i].val = val;
            return true;
        }
    if (f->n == f->cap) {
        uint32_t cap = f->cap ? f->cap * 2 : 8;
        struct tpl_var *vars = tpl_alloc(r, at, cap * sizeof *vars);
        if (!vars) return false;
        if (f->n) memcpy(vars, f->vars, f->n * sizeof *vars);
        f->vars = vars;
        f->cap = cap;
    }
    f->vars[f->n].name = name;
    f->vars[f->n].val = val;
    f->n++;
    return true;
}

/* ---- output ----------------------------------------------------------------------- */

static bool out_put(struct tpl_render *r, const struct tpl_node *at, const char *s, size_t n) {
    if (tpl_buf_put(r->out, s, n)) return true;
    return tpl_fail(r, at, LLMOPT_ERR_LIMIT, "rendered output exceeds %zu bytes", r->out->limit);
}

/* ---- attribute and item access --------------------------------------------------- */

static const char *obj_name(struct tpl_value v) {
    if (v.type == TPL_LIST && (v.flags & TPL_F_TUPLE)) return "tuple";
    return tpl_type_name(v.type);
}

bool tpl_getattr(struct tpl_render *r, const struct tpl_node *at, struct tpl_value obj,
                 struct tpl_str name, struct tpl_value *out) {
    switch ((enum tpl_type)obj.type) {
    case TPL_UNDEFINED: return tpl_fail_undefined(r, at, obj);
    case TPL_DICT:
        if (tpl_builtin_attr(r, at, obj, name, out)) return !r->status;
        if (r->status) return false;
        {
            struct tpl_value *v = tpl_dict_get_str(obj.u.dict, name);
            if (v) {
                *out = *v;
                return true;
            }
        }
        break;
    case TPL_NAMESPACE: {
        struct tpl_value *v = tpl_dict_get_str(obj.u.dict, name);
        if (v) {
            *out = *v;
            return true;
        }
        break;
    }
    default:
        if (tpl_builtin_attr(r, at, obj, name, out)) return !r->status;
        if (r->status) return false;
        break;
    }
    if (obj.type == TPL_NONE)
        *out = tpl_undefined_fmt(r, "'None' has no attribute '%.*s'", (int)name.len, name.ptr);
    else
        *out = tpl_undefined_fmt(r, "'%s object' has no attribute '%.*s'", obj_name(obj), (int)name.len, name.ptr);
    return true;
}

/* Python's index normalization: false when out of range. */
static bool norm_index(int64_t i, size_t len, size_t *out) {
    if (i < 0) i += (int64_t)len;
    if (i < 0 || (uint64_t)i >= len) return false;
    *out = (size_t)i;
    return true;
}

bool tpl_getitem(struct tpl_render *r, const struct tpl_node *at, struct tpl_value obj,
                 struct tpl_value key, struct tpl_value *out) {
    if (obj.type == TPL_UNDEFINED) return tpl_fail_undefined(r, at, obj);
    bool int_key = key.type == TPL_INT || key.type == TPL_BOOL;
    int64_t ik = key.type == TPL_BOOL ? key.u.b : key.u.i;
    if (obj.type == TPL_DICT) {
        struct tpl_value *v = key.type == TPL_UNDEFINED ? NULL : tpl_dict_get(obj.u.dict, key);
        if (v) {
            *out = *v;
            return true;
        }
    } else if (obj.type == TPL_LIST && int_key) {
        size_t i;
        if (norm_index(ik, obj.u.list->len, &i)) {
            *out = obj.u.list->items[i];
            return true;
        }
        *out = tpl_undefined_fmt(r, "'%s object' has no element %lld", obj_name(obj), (long long)ik);
        return true;
    } else if (obj.type == TPL_STR && int_key) {
        size_t n = tpl_utf8_count(obj.u.s), i;
        if (norm_index(ik, n, &i)) {
            size_t b = tpl_utf8_offset(obj.u.s, i), e = b;
            tpl_utf8_next(obj.u.s.ptr, obj.u.s.len, &e);
            *out = tpl_strv((struct tpl_str){obj.u.s.ptr + b, e - b});
            return true;
        }
        *out = tpl_undefined_fmt(r, "'str object' has no element %lld", (long long)ik);
        return true;
    }
    if (key.type == TPL_STR) {
        if (obj.type == TPL_DICT) {
            if (tpl_builtin_attr(r, at, obj, key.u.s, out)) return !r->status;
            if (r->status) return false;
            *out = tpl_undefined_fmt(r, "'dict object' has no attribute '%.*s'", (int)key.u.s.len, key.u.s.ptr);
            return true;
        }
        return tpl_getattr(r, at, obj, key.u.s, out);
    }
    *out = tpl_undefined_fmt(r, "'%s object' has no element", obj_name(obj));
    return true;
}

/* Python slice index adjustment (PySlice_AdjustIndices). */
static size_t slice_indices(int64_t len, const int64_t *start_p, const int64_t *stop_p, int64_t step,
                            int64_t *start_out) {
    int64_t start, stop;
    if (step > 0) {
        start = start_p ? *start_p : 0;
        stop = stop_p ? *stop_p : len;
        if (start < 0) start = start + len < 0 ? 0 : start + len;
        if (start > len) start = len;
        if (stop < 0) stop = stop + len < 0 ? 0 : stop + len;
        if (stop > len) stop = len;
        *start_out = start;
        return stop > start ? (size_t)((stop - start - 1) / step + 1) : 0;
    }
    start = start_p ? *start_p : len - 1;
    stop = stop_p ? *stop_p : -1;
    if (start_p) {
        if (start < 0) start = start + len < 0 ? -1 : start + len;
        if (start >= len) start = len - 1;
    }
    if (stop_p) {
        if (stop < 0) stop = stop + len < 0 ? -1 : stop + len;
        if (stop >= len) stop = len - 1;
    }
    *start_out = start;
    return start > stop ? (size_t)((start - stop - 1) / (-step) + 1) : 0;
}

static bool eval(struct tpl_render *r, struct tpl_frame *f, const struct tpl_node *n, struct tpl_value *out);

static bool eval_slice(struct tpl_render *r, struct tpl_frame *f, const struct tpl_node *n, struct tpl_value *out) {
    struct tpl_value obj, parts[3];
    int64_t vals[3];
    bool have[3] = {false, false, false};
    if (!eval(r, f, n->a, &obj)) return false;
    for (int k = 0; k < 3; k++) {
        if (!n->args[k]) continue;
        if (!eval(r, f, n->args[k], &parts[k])) return false;
        if (parts[k].type == TPL_NONE) continue;
        if (parts[k].type != TPL_INT && parts[k].type != TPL_BOOL) {
            if (obj.type == TPL_UNDEFINED) return tpl_fail_undefined(r, n, obj);
            *out = tpl_undefined_fmt(r, "slice indices must be integers or None");
            return true;
        }
        vals[k] = parts[k].type == TPL_BOOL ? parts[k].u.b : parts[k].u.i;
        have[k] = true;
    }
    int64_t step = have[2] ? vals[2] : 1;
    if (step == 0) return tpl_fail(r, n, LLMOPT_ERR_FORMAT, "slice step cannot be zero");
    if (step == INT64_MIN) step = -INT64_MAX;
    if (obj.type == TPL_UNDEFINED) return tpl_fail_undefined(r, n, obj);
    if (obj.type == TPL_LIST) {
        int64_t start;
        size_t count = slice_indices((int64_t)obj.u.list->len, have[0] ? &vals[0] : NULL,
                                     have[1] ? &vals[1] : NULL, step, &start);
        if (step == 1) {
            struct tpl_list *l = tpl_list_new(r, n, count);
            if (!l) return false;
            if (count) memcpy(l->items, obj.u.list->items + start, count * sizeof *l->items);
            out->type = TPL_LIST;
            out->flags = obj.flags & TPL_F_TUPLE;
            out->u.list = l;
            return true;
        }
        struct tpl_list *l = tpl_list_new(r, n, count);
        if (!l) return false;
        for (size_t i = 0; i < count; i++) l->items[i] = obj.u.list->items[start + (int64_t)i * step];
        out->type = TPL_LIST;
        out->flags = obj.flags & TPL_F_TUPLE;
        out->u.list = l;
        return true;
    }
    if (obj.type == TPL_STR) {
        struct tpl_str s = obj.u.s;
        bool ascii = true;
        for (size_t i = 0; i < s.len && ascii; i++) ascii = (uint8_t)s.ptr[i] < 0x80;
        size_t ncp = ascii ? s.len : tpl_utf8_count(s);
        int64_t start;
        size_t count = slice_indices((int64_t)ncp, have[0] ? &vals[0] : NULL, have[1] ? &vals[1] : NULL, step, &start);
        if (ascii && step == 1) {
            *out = tpl_strv((struct tpl_str){s.ptr + start, count});
            return true;
        }
        size_t *offs = NULL; /* (ncp + 1) byte offsets of code points */
        if (!ascii) {
            offs = tpl_alloc(r, n, (ncp + 1) * sizeof *offs);
            if (!offs) return false;
            size_t i = 0, k = 0;
            while (i < s.len) {
                offs[k++] = i;
                tpl_utf8_next(s.ptr, s.len, &i);
            }
            offs[k] = s.len;
        }
        char *buf = tpl_alloc(r, n, s.len + 1);
        if (!buf) return false;
        size_t len = 0;
        for (size_t i = 0; i < count; i++) {
            size_t cp = (size_t)(start + (int64_t)i * step);
            size_t b = ascii ? cp : offs[cp], e = ascii ? cp + 1 : offs[cp + 1];
            memcpy(buf + len, s.ptr + b, e - b);
            len += e - b;
        }
        *out = tpl_strv((struct tpl_str){buf, len});
        return true;
    }
    *out = tpl_undefined_fmt(r, "'%s object' is not subscriptable", obj_name(obj));
    return true;
}

/* ---- iteration, membership --------------------------------------------------------- */

bool tpl_iterate(struct tpl_render *r, const struct tpl_node *at, struct tpl_value v,
                 const struct tpl_value **items, size_t *n) {
    switch ((enum tpl_type)v.type) {
    case TPL_UNDEFINED: *items = NULL; *n = 0; return true;
    case TPL_LIST: *items = v.u.list->items; *n = v.u.list->len; return true;
    case TPL_DICT: *items = v.u.dict->keys; *n = v.u.dict->len; return true;
    case TPL_STR: {
        size_t count = tpl_utf8_count(v.u.s);
        struct tpl_value *chars = tpl_alloc(r, at, (count ? count : 1) * sizeof *chars);
        if (!chars) return false;
        size_t i = 0, k = 0;
        while (i < v.u.s.len) {
            size_t b = i;
            tpl_utf8_next(v.u.s.ptr, v.u.s.len, &i);
            chars[k++] = tpl_strv((struct tpl_str){v.u.s.ptr + b, i - b});
        }
        *items = chars;
        *n = count;
        return true;
    }
    default:
        return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "'%s' object is not iterable", obj_name(v));
    }
}

static bool str_contains(struct tpl_str hay, struct tpl_str needle) {
    if (needle.len == 0) return true;
    if (needle.len > hay.len) return false;
    for (size_t i = 0; i + needle.len <= hay.len; i++) {
        const char *p = memchr(hay.ptr + i, needle.ptr[0], hay.len - needle.len + 1 - i);
        if (!p) return false;
        i = (size_t)(p - hay.ptr);
        if (memcmp(p, needle.ptr, needle.len) == 0) return true;
    }
    return false;
}

static bool contains(struct tpl_render *r, const struct tpl_node *at, struct tpl_value needle,
                     struct tpl_value hay, bool *out) {
    *out = false;
    switch ((enum tpl_type)hay.type) {
    case TPL_STR:
        if (needle.type != TPL_STR) {
            if (needle.type == TPL_UNDEFINED) return tpl_fail_undefined(r, at, needle);
            return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "'in <string>' requires string as left operand, not %s",
                            obj_name(needle));
        }
        *out = str_contains(hay.u.s, needle.u.s);
        return true;
    case TPL_LIST:
        *out = false;
        for (size_t i = 0; i < hay.u.list->len && !*out; i++) *out = tpl_equal(hay.u.list->items[i], needle);
        return true;
    case TPL_DICT: *out = tpl_dict_get(hay.u.dict, needle) != NULL; return true;
    case TPL_UNDEFINED: *out = false; return true;
    default:
        return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "argument of type '%s' is not iterable", obj_name(hay));
    }
}

/* ---- arithmetic ------------------------------------------------------------------- */

static bool is_intlike(struct tpl_value v) { return v.type == TPL_INT || v.type == TPL_BOOL; }
static int64_t int_of(struct tpl_value v) { return v.type == TPL_BOOL ? v.u.b : v.u.i; }

static bool html_escape(struct tpl_render *r, const struct tpl_node *at, struct tpl_str s, struct tpl_str *out) {
    size_t extra = 0;
    for (size_t i = 0; i < s.len; i++) {
        char c = s.ptr[i];
        extra += c == '&' ? 4 : c == '<' || c == '>' ? 3 : c == '"' || c == '\'' ? 4 : 0;
    }
    if (!extra) {
        *out = s;
        return true;
    }
    char *buf = tpl_alloc(r, at, s.len + extra + 1);
    if (!buf) return false;
    size_t n = 0;
    for (size_t i = 0; i < s.len; i++) {
        const char *rep = NULL;
        switch (s.ptr[i]) {
        case '&': rep = "&amp;"; break;
        case '<': rep = "&lt;"; break;
        case '>': rep = "&gt;"; break;
        case '"': rep = "&#34;"; break;
        case '\'': rep = "&#39;"; break;
        default: buf[n++] = s.ptr[i]; continue;
        }
        memcpy(buf + n, rep, strlen(rep));
        n += strlen(rep);
    }
    *out = (struct tpl_str){buf, n};
    return true;
}

static bool concat2(struct tpl_render *r, const struct tpl_node *at, struct tpl_str a, struct tpl_str b,
                    struct tpl_value *out) {
    if (a.len + b.len > r->lim.max_output)
        return tpl_fail(r, at, LLMOPT_ERR_LIMIT, "string longer than %zu bytes", r->lim.max_output);
    if (b.len == 0) { *out = tpl_strv(a); return true; }
    if (a.len == 0) { *out = tpl_strv(b); return true; }
    char *buf = tpl_alloc(r, at, a.len + b.len + 1);
    if (!buf) return false;
    memcpy(buf, a.ptr, a.len);
    memcpy(buf + a.len, b.ptr, b.len);
    *out = tpl_strv((struct tpl_str){buf, a.len + b.len});
    return true;
}

static bool repeat(struct tpl_render *r, const struct tpl_node *at, struct tpl_value seq, int64_t times,
                   struct tpl_value *out) {
    if (times < 0) times = 0;
    if (seq.type == TPL_STR) {
        if (seq.u.s.len && (uint64_t)times > r->lim.max_output / seq.u.s.len)
            return tpl_fail(r, at, LLMOPT_ERR_LIMIT, "string longer than %zu bytes", r->lim.max_output);
        size_t total = seq.u.s.len * (size_t)times;
        char *buf = tpl_alloc(r, at, total + 1);
        if (!buf) return false;
        for (int64_t i = 0; i < times; i++) memcpy(buf + (size_t)i * seq.u.s.len, seq.u.s.ptr, seq.u.s.len);
        *out = tpl_strv((struct tpl_str){buf, total});
        return true;
    }
    size_t len = seq.u.list->len;
    if (len && (uint64_t)times > (r->lim.max_memory / sizeof(struct tpl_value)) / len)
        return tpl_fail(r, at, LLMOPT_ERR_LIMIT, "list too large");
    struct tpl_list *l = tpl_list_new(r, at, len * (size_t)times);
    if (!l) return false;
    for (int64_t i = 0; i < times; i++) memcpy(l->items + (size_t)i * len, seq.u.list->items, len * sizeof *l->items);
    out->type = TPL_LIST;
    out->flags = seq.flags & TPL_F_TUPLE;
    out->u.list = l;
    return true;
}

bool tpl_percent_format(struct tpl_render *r, const struct tpl_node *at, struct tpl_str fmt,
                        struct tpl_value args, struct tpl_value *out);

static bool type_error(struct tpl_render *r, const struct tpl_node *at, int op, struct tpl_value a, struct tpl_value b) {
    if (a.type == TPL_UNDEFINED) return tpl_fail_undefined(r, at, a);
    if (b.type == TPL_UNDEFINED) return tpl_fail_undefined(r, at, b);
    return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "unsupported operand type(s) for %s: '%s' and '%s'",
                    tpl_op_text(op), obj_name(a), obj_name(b));
}

bool tpl_binop(struct tpl_render *r, const struct tpl_node *at, int op, struct tpl_value a,
               struct tpl_value b, struct tpl_value *out) {
    bool nums = tpl_is_number(a) && tpl_is_number(b);
    bool ints = is_intlike(a) && is_intlike(b);
    int64_t x = int_of(a), y = int_of(b), z;
    switch (op) {
    case OP_ADD:
        if (ints) {
            if (__builtin_add_overflow(x, y, &z)) goto overflow;
            *out = tpl_int(z);
            return true;
        }
        if (nums) { *out = tpl_float(tpl_as_double(a) + tpl_as_double(b)); return true; }
        if (a.type == TPL_STR && b.type == TPL_STR) {
            struct tpl_str sa = a.u.s, sb = b.u.s;
            bool markup = (a.flags | b.flags) & TPL_F_MARKUP;
            if (markup && !(a.flags & TPL_F_MARKUP) && !html_escape(r, at, sa, &sa)) return false;
            if (markup && !(b.flags & TPL_F_MARKUP) && !html_escape(r, at, sb, &sb)) return false;
            if (!concat2(r, at, sa, sb, out)) return false;
            if (markup) out->flags = TPL_F_MARKUP;
            return true;
        }
        if (a.type == TPL_LIST && b.type == TPL_LIST && (a.flags & TPL_F_TUPLE) == (b.flags & TPL_F_TUPLE)) {
            size_t na = a.u.list->len, nb = b.u.list->len;
            struct tpl_list *l = tpl_list_new(r, at, na + nb);
            if (!l) return false;
            memcpy(l->items, a.u.list->items, na * sizeof *l->items);
            memcpy(l->items + na, b.u.list->items, nb * sizeof *l->items);
            out->type = TPL_LIST;
            out->flags = a.flags & TPL_F_TUPLE;
            out->u.list = l;
            return true;
        }
        return type_error(r, at, op, a, b);
    case OP_SUB:
        if (ints) {
            if (__builtin_sub_overflow(x, y, &z)) goto overflow;
            *out = tpl_int(z);
            return true;
        }
        if (nums) { *out = tpl_float(tpl_as_double(a) - tpl_as_double(b)); return true; }
        return type_error(r, at, op, a, b);
    case OP_MUL:
        if (ints) {
            if (__builtin_mul_overflow(x, y, &z)) goto overflow;
            *out = tpl_int(z);
            return true;
        }
        if (nums) { *out = tpl_float(tpl_as_double(a) * tpl_as_double(b)); return true; }
        if ((a.type == TPL_STR || a.type == TPL_LIST) && is_intlike(b)) return repeat(r, at, a, y, out);
        if ((b.type == TPL_STR || b.type == TPL_LIST) && is_intlike(a)) return repeat(r, at, b, x, out);
        return type_error(r, at, op, a, b);
    case OP_DIV:
        if (!nums) return type_error(r, at, op, a, b);
        if (tpl_as_double(b) == 0) return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "division by zero");
        *out = tpl_float(ints ? (double)x / (double)y : tpl_as_double(a) / tpl_as_double(b));
        return true;
    case OP_FLOORDIV:
    case OP_MOD:
        if (op == OP_MOD && a.type == TPL_STR) return tpl_percent_format(r, at, a.u.s, b, out);
        if (!nums) return type_error(r, at, op, a, b);
        if (tpl_as_double(b) == 0)
            return tpl_fail(r, at, LLMOPT_ERR_FORMAT, op == OP_MOD ? "modulo by zero" : "division by zero");
        if (ints) {
            if (x == INT64_MIN && y == -1) goto overflow;
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
                q -= 1;
                m += y;
            }
            *out = tpl_int(op == OP_MOD ? m : q);
            return true;
        }
        {
            /* Python's float divmod */
            double vx = tpl_as_double(a), wx = tpl_as_double(b), mod = fmod(vx, wx), div = (vx - mod) / wx;
            if (mod != 0) {
                if ((wx < 0) != (mod < 0)) {
                    mod += wx;
                    div -= 1.0;
                }
            } else {
                mod = copysign(0.0, wx);
            }
            double floordiv;
            if (div != 0) {
                floordiv = floor(div);
                if (div - floordiv > 0.5) floordiv += 1.0;
            } else {
                floordiv = copysign(0.0, vx / wx);
            }
            *out = tpl_float(op == OP_MOD ? mod : floordiv);
        }
        return true;
    case OP_POW:
        if (!nums) return type_error(r, at, op, a, b);
        if (ints && y >= 0) {
            int64_t result = 1, base = x;
            for (int64_t e = y; e > 0; e >>= 1) {
                if ((e & 1) && __builtin_mul_overflow(result, base, &result)) goto overflow;
                if (e > 1 && __builtin_mul_overflow(base, base, &base)) goto overflow;
            }
            *out = tpl_int(result);
            return true;
        }
        *out = tpl_float(pow(tpl_as_double(a), tpl_as_double(b)));
        return true;
    default: break;
    }
    return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "unknown operator");
overflow:
    return tpl_fail(r, at, LLMOPT_ERR_UNSUPPORTED, "integer overflow (llmopt's template integers are 64-bit)");
}

/* ---- calls ------------------------------------------------------------------------ */

static enum exec_status {
    EX_OK,
    EX_ERR,
    EX_BREAK,
    EX_CONTINUE
} exec_body(struct tpl_render *r, struct tpl_frame *f, const struct tpl_body *b);

/* Renders body into a string value (macro calls, block set, filter blocks). */
static bool capture(struct tpl_render *r, struct tpl_frame *f, const struct tpl_node *at,
                    const struct tpl_body *body, struct tpl_value *out) {
    /* Nested captures (recursive macros) each hold a buffer: together they stay within
       what is left of the memory budget, not max_output each. */
    size_t left = r->arena.used_total < r->lim.max_memory ? r->lim.max_memory - r->arena.used_total : 0;
    struct tpl_buf buf = {.limit = left < r->lim.max_output ? left : r->lim.max_output};
    struct tpl_buf *saved = r->out;
    r->out = &buf;
    enum exec_status st = exec_body(r, f, body);
    r->out = saved;
    bool ok = st != EX_ERR && tpl_str_new(r, at, buf.data ? buf.data : "", buf.len, out);
    tpl_buf_free(&buf);
    return ok;
}

static bool call_macro(struct tpl_render *r, const struct tpl_node *at, const struct tpl_macro *m,
                       const struct tpl_args *args, struct tpl_value *out) {
    const struct tpl_node *def = m->def;
    if (args->n_pos > def->n_targets)
        return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "macro '%.*s' takes not more than %zu argument(s)",
                        (int)def->name.len, def->name.ptr, def->n_targets);
    if (r->depth >= r->lim.max_depth)
        return tpl_fail(r, at, LLMOPT_ERR_LIMIT, "macro calls nested deeper than %d", r->lim.max_depth);
    struct tpl_frame *f = frame_new(r, at, m->closure);
    if (!f) return false;
    for (size_t k = 0; k < args->n_kw; k++) {
        bool found = false;
        for (size_t i = 0; i < def->n_targets && !found; i++) found = tpl_str_eq(def->targets[i], args->kw_names[k]);
        if (!found)
            return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "macro '%.*s' has no parameter named '%.*s'",
                            (int)def->name.len, def->name.ptr, (int)args->kw_names[k].len, args->kw_names[k].ptr);
    }
    for (size_t i = 0; i < def->n_targets; i++) {
        struct tpl_value v;
        bool have = false;
        if (i < args->n_pos) {
            v = args->pos[i];
            have = true;
        }
        for (size_t k = 0; k < args->n_kw; k++)
            if (tpl_str_eq(def->targets[i], args->kw_names[k])) {
                if (have)
                    return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "macro '%.*s' got multiple values for argument '%.*s'",
                                    (int)def->name.len, def->name.ptr, (int)def->targets[i].len, def->targets[i].ptr);
                v = args->kw[k];
                have = true;
            }
        if (!have) {
            if (def->args[i]) {
                if (!eval(r, f, def->args[i], &v)) return false;
            } else {
                v = tpl_undefined_fmt(r, "parameter '%.*s' was not provided", (int)def->targets[i].len, def->targets[i].ptr);
            }
        }
        if (!frame_set(r, at, f, def->targets[i], v)) return false;
    }
    r->depth++;
    bool ok = capture(r, f, at, &def->body, out);
    r->depth--;
    return ok;
}

bool tpl_call_value(struct tpl_render *r, const struct tpl_node *at, struct tpl_value callee,
                    const struct tpl_args *args, struct tpl_value *out) {
    switch ((enum tpl_type)callee.type) {
    case TPL_MACRO: return call_macro(r, at, callee.u.macro, args, out);
    case TPL_FUNC: return tpl_call_builtin(r, at, callee.u.func, args, out);
    case TPL_UNDEFINED: return tpl_fail_undefined(r, at, callee);
    default: return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "'%s' object is not callable", obj_name(callee));
    }
}

/* Evaluates n->args into an argument pack (positional first, then keywords). */
static bool eval_args(struct tpl_render *r, struct tpl_frame *f, const struct tpl_node *n, struct tpl_args *a) {
    memset(a, 0, sizeof *a);
    if (!n->n_args) return true;
    struct tpl_value *vals = tpl_alloc(r, n, n->n_args * sizeof *vals);
    struct tpl_str *names = tpl_alloc(r, n, n->n_args * sizeof *names);
    if (!vals || !names) return false;
    size_t n_pos = 0;
    for (size_t i = 0; i < n->n_args; i++)
        if (!n->arg_names || n->arg_names[i].len == 0) n_pos++;
    size_t p = 0, k = n_pos;
    for (size_t i = 0; i < n->n_args; i++) {
        bool kw = n->arg_names && n->arg_names[i].len;
        size_t slot = kw ? k++ : p++;
        if (!eval(r, f, n->args[i], &vals[slot])) return false;
        if (kw) names[slot] = n->arg_names[i];
    }
    a->n_pos = n_pos;
    a->pos = vals;
    a->n_kw = n->n_args - n_pos;
    a->kw = vals + n_pos;
    a->kw_names = names + n_pos;
    return true;
}

/* Evaluates a filter chain whose innermost input is `input` (N_FILTER with a NULL). */
static bool eval_filter_chain(struct tpl_render *r, struct tpl_frame *f, const struct tpl_node *n,
                              struct tpl_value input, struct tpl_value *out) {
    struct tpl_value in = input;
    if (n->a && !eval_filter_chain(r, f, n->a, input, &in)) return false;
    struct tpl_args a;
    if (!eval_args(r, f, n, &a)) return false;
    return tpl_apply_filter(r, n, n->op, in, &a, out);
}

/* ---- expressions ------------------------------------------------------------------ */

static bool eval_compare(struct tpl_render *r, struct tpl_frame *f, const struct tpl_node *n, struct tpl_value *out) {
    struct tpl_value left, right;
    if (!eval(r, f, n->args[0], &left)) return false;
    for (size_t i = 1; i < n->n_args; i++) {
        if (!eval(r, f, n->args[i], &right)) return false;
        bool res = false;
        int c = 0;
        switch (n->ops[i - 1]) {
        case OP_EQ: res = tpl_equal(left, right); break;
        case OP_NE: res = !tpl_equal(left, right); break;
        case OP_IN:
        case OP_NOTIN:
            if (!contains(r, n, left, right, &res)) return false;
            if (n->ops[i - 1] == OP_NOTIN) res = !res;
            break;
        default:
            if (!tpl_compare(r, n, left, right, &c)) return false;
            switch (n->ops[i - 1]) {
            case OP_LT: res = c < 0; break;
            case OP_LE: res = c <= 0; break;
            case OP_GT: res = c > 0; break;
            default: res = c >= 0; break;
            }
            /* NaN: every ordering is false */
            if ((left.type == TPL_FLOAT && isnan(left.u.f)) || (right.type == TPL_FLOAT && isnan(right.u.f))) res = false;
        }
        if (!res) {
            *out = tpl_bool(false);
            return true;
        }
        left = right;
    }
    *out = tpl_bool(true);
    return true;
}

static bool eval_inner(struct tpl_render *r, struct tpl_frame *f, const struct tpl_node *n, struct tpl_value *out) {
    struct tpl_value a, b;
    switch ((enum tpl_node_kind)n->kind) {
    case N_CONST: *out = n->lit; return true;
    case N_NAME: {
        struct tpl_value *v = frame_find(f, n->name);
        if (v) {
            *out = *v;
            return true;
        }
        if (tpl_global_lookup(n->name, out)) return true;
        *out = tpl_undefined_fmt(r, "'%.*s' is undefined", (int)n->name.len, n->name.ptr);
        return true;
    }
    case N_GETATTR:
        if (!eval(r, f, n->a, &a)) return false;
        return tpl_getattr(r, n, a, n->name, out);
    case N_GETITEM:
        if (!eval(r, f, n->a, &a) || !eval(r, f, n->b, &b)) return false;
        return tpl_getitem(r, n, a, b, out);
    case N_SLICE: return eval_slice(r, f, n, out);
    case N_CALL: {
        struct tpl_args args;
        if (!eval(r, f, n->a, &a)) return false;
        if (a.type == TPL_UNDEFINED) return tpl_fail_undefined(r, n->a, a); /* point at the name */
        if (!eval_args(r, f, n, &args)) return false;
        return tpl_call_value(r, n, a, &args, out);
    }
    case N_FILTER: {
        struct tpl_args args;
        if (!eval(r, f, n->a, &a) || !eval_args(r, f, n, &args)) return false;
        if (r->depth >= r->lim.max_depth)
            return tpl_fail(r, n, LLMOPT_ERR_LIMIT, "calls nested deeper than %d", r->lim.max_depth);
        r->depth++;
        bool ok = tpl_apply_filter(r, n, n->op, a, &args, out);
        r->depth--;
        return ok;
    }
    case N_TEST: {
        struct tpl_args args;
        bool res;
        if (!eval(r, f, n->a, &a) || !eval_args(r, f, n, &args)) return false;
        if (!tpl_apply_test(r, n, n->op, a, &args, &res)) return false;
        *out = tpl_bool(res);
        return true;
    }
    case N_NOT:
        if (!eval(r, f, n->a, &a)) return false;
        *out = tpl_bool(!tpl_truthy(a));
        return true;
    case N_NEG:
    case N_POS:
        if (!eval(r, f, n->a, &a)) return false;
        if (a.type == TPL_FLOAT) {
            *out = tpl_float(n->kind == N_NEG ? -a.u.f : a.u.f);
            return true;
        }
        if (is_intlike(a)) {
            int64_t v = int_of(a);
            if (n->kind == N_NEG && v == INT64_MIN) return tpl_fail(r, n, LLMOPT_ERR_UNSUPPORTED, "integer overflow");
            *out = tpl_int(n->kind == N_NEG ? -v : v);
            return true;
        }
        if (a.type == TPL_UNDEFINED) return tpl_fail_undefined(r, n, a);
        return tpl_fail(r, n, LLMOPT_ERR_FORMAT, "bad operand type for unary %s: '%s'", n->kind == N_NEG ? "-" : "+",
                        obj_name(a));
    case N_BINOP:
        if (!eval(r, f, n->a, &a) || !eval(r, f, n->b, &b)) return false;
        return tpl_binop(r, n, n->op, a, b, out);
    case N_CONCAT: {
        struct tpl_buf buf = {.limit = r->lim.max_output};
        for (size_t i = 0; i < n->n_args; i++) {
            if (!eval(r, f, n->args[i], &a)) {
                tpl_buf_free(&buf);
                return false;
            }
            if (!tpl_write_str(&buf, a)) {
                tpl_buf_free(&buf);
                return tpl_fail(r, n, LLMOPT_ERR_LIMIT, "string longer than %zu bytes", r->lim.max_output);
            }
        }
        bool ok = tpl_str_new(r, n, buf.data ? buf.data : "", buf.len, out);
        tpl_buf_free(&buf);
        return ok;
    }
    case N_AND:
        if (!eval(r, f, n->a, &a)) return false;
        if (!tpl_truthy(a)) {
            *out = a;
            return true;
        }
        return eval(r, f, n->b, out);
    case N_OR:
        if (!eval(r, f, n->a, &a)) return false;
        if (tpl_truthy(a)) {
            *out = a;
            return true;
        }
        return eval(r, f, n->b, out);
    case N_COMPARE: return eval_compare(r, f, n, out);
    case N_CONDEXPR:
        if (!eval(r, f, n->a, &a)) return false;
        if (tpl_truthy(a)) return eval(r, f, n->b, out);
        if (n->c) return eval(r, f, n->c, out);
        *out = tpl_undefined_fmt(r, "the inline if-expression on line %u evaluated to false and no else section was defined",
                                 n->line);
        return true;
    case N_LIST:
    case N_TUPLE: {
        struct tpl_list *l = tpl_list_new(r, n, n->n_args);
        if (!l) return false;
        for (size_t i = 0; i < n->n_args; i++)
            if (!eval(r, f, n->args[i], &l->items[i])) return false;
        out->type = TPL_LIST;
        out->flags = n->kind == N_TUPLE ? TPL_F_TUPLE : 0;
        out->u.list = l;
        return true;
    }
    case N_DICT: {
        struct tpl_dict *d = tpl_dict_new(r, n, n->n_args / 2);
        if (!d) return false;
        for (size_t i = 0; i + 1 < n->n_args; i += 2) {
            if (!eval(r, f, n->args[i], &a) || !eval(r, f, n->args[i + 1], &b)) return false;
            if (a.type == TPL_LIST || a.type == TPL_DICT || a.type == TPL_UNDEFINED)
                return tpl_fail(r, n, LLMOPT_ERR_FORMAT, "unhashable dict key of type '%s'", obj_name(a));
            if (!tpl_dict_set(r, n, d, a, b)) return false;
        }
        out->type = TPL_DICT;
        out->flags = 0;
        out->u.dict = d;
        return true;
    }
    default: break;
    }
    return tpl_fail(r, n, LLMOPT_ERR_FORMAT, "not an expression");
}

static bool eval(struct tpl_render *r, struct tpl_frame *f, const struct tpl_node *n, struct tpl_value *out) {
    if (!tpl_step(r, n)) return false;
    if (++r->eval_depth > TPL_MAX_EVAL_DEPTH) {
        r->eval_depth--;
        return tpl_fail(r, n, LLMOPT_ERR_LIMIT, "evaluation nested deeper than %d", TPL_MAX_EVAL_DEPTH);
    }
    bool ok = eval_inner(r, f, n, out);
    r->eval_depth--;
    return ok;
}

/* ---- statements ------------------------------------------------------------------- */

static bool assign_targets(struct tpl_render *r, struct tpl_frame *f, const struct tpl_node *n,
                           struct tpl_value v) {
    if (!n->tuple_target) return frame_set(r, n, f, n->targets[0], v);
    const struct tpl_value *items;
    size_t count;
    if (v.type == TPL_UNDEFINED) return tpl_fail_undefined(r, n, v);
    if (!tpl_iterate(r, n, v, &items, &count)) return false;
    if (count != n->n_targets)
        return tpl_fail(r, n, LLMOPT_ERR_FORMAT, "%s values to unpack (expected %zu, got %zu)",
                        count < n->n_targets ? "not enough" : "too many", n->n_targets, count);
    for (size_t i = 0; i < count; i++)
        if (!frame_set(r, n, f, n->targets[i], items[i])) return false;
    return true;
}

static enum exec_status exec_for(struct tpl_render *r, struct tpl_frame *f, const struct tpl_node *n) {
    struct tpl_value seq;
    const struct tpl_value *items;
    size_t count;
    if (!eval(r, f, n->a, &seq) || !tpl_iterate(r, n->a, seq, &items, &count)) return EX_ERR;
    struct tpl_frame *it = frame_new(r, n, f);
    if (!it) return EX_ERR;
    if (n->b) { /* for x in seq if cond: the loop sees only the items that pass */
        struct tpl_value *kept = tpl_alloc(r, n, (count ? count : 1) * sizeof *kept);
        if (!kept) return EX_ERR;
        size_t k = 0;
        for (size_t i = 0; i < count; i++) {
            if (!tpl_step(r, n)) return EX_ERR;
            it->n = 0;
            struct tpl_value cond;
            if (!assign_targets(r, it, n, items[i]) || !eval(r, it, n->b, &cond)) return EX_ERR;
            if (tpl_truthy(cond)) kept[k++] = items[i];
            if (it->captured && !(it = frame_new(r, n, f))) return EX_ERR;
        }
        items = kept;
        count = k;
    }
    /* Jinja renders the else block unless some iteration ran to the end of the body:
       it clears its flag there, so iterations left by break or continue do not count. */
    bool completed_any = false;
    struct tpl_loop *loop = tpl_alloc(r, n, sizeof *loop);
    if (!loop) return EX_ERR;
    loop->items = items;
    loop->length = count;
    struct tpl_value loop_val = {.type = TPL_LOOP};
    loop_val.u.loop = loop;
    for (size_t i = 0; i < count; i++) {
        if (!tpl_step(r, n)) return EX_ERR;
        if (it->captured && !(it = frame_new(r, n, f))) return EX_ERR;
        it->n = 0;
        loop->index0 = i;
        if (!frame_set(r, n, it, TPL_STR_LIT("loop"), loop_val) || !assign_targets(r, it, n, items[i]))
            return EX_ERR;
        enum exec_status st = exec_body(r, it, &n->body);
        if (st == EX_ERR) return EX_ERR;
        if (st == EX_OK) completed_any = true;
        if (st == EX_BREAK) break;
    }
    if (completed_any || !n->else_body.len) return EX_OK;
    if (it->captured && !(it = frame_new(r, n, f))) return EX_ERR;
    it->n = 0;
    return exec_body(r, it, &n->else_body) == EX_ERR ? EX_ERR : EX_OK;
}

static enum exec_status exec_stmt(struct tpl_render *r, struct tpl_frame *f, const struct tpl_node *n) {
    struct tpl_value v;
    switch ((enum tpl_node_kind)n->kind) {
    case N_TEXT: return out_put(r, n, n->name.ptr, n->name.len) ? EX_OK : EX_ERR;
    case N_OUTPUT:
        if (!eval(r, f, n->a, &v)) return EX_ERR;
        if (!tpl_write_str(r->out, v))
            return tpl_fail(r, n, LLMOPT_ERR_LIMIT, "rendered output exceeds %zu bytes", r->out->limit), EX_ERR;
        return EX_OK;
    case N_IF:
        if (!eval(r, f, n->a, &v)) return EX_ERR;
        return exec_body(r, f, tpl_truthy(v) ? &n->body : &n->else_body);
    case N_FOR: return exec_for(r, f, n);
    case N_SET:
        if (!eval(r, f, n->a, &v)) return EX_ERR;
        if (n->op == 1) { /* set ns.attr = v */
            struct tpl_value *ns = frame_find(f, n->targets[0]);
            if (!ns || ns->type != TPL_NAMESPACE)
                return tpl_fail(r, n, LLMOPT_ERR_FORMAT, "cannot assign attribute '%.*s' on '%.*s': not a namespace",
                                (int)n->name.len, n->name.ptr, (int)n->targets[0].len, n->targets[0].ptr),
                       EX_ERR;
            return tpl_dict_set(r, n, ns->u.dict, tpl_strv(n->name), v) ? EX_OK : EX_ERR;
        }
        return assign_targets(r, f, n, v) ? EX_OK : EX_ERR;
    case N_SET_BLOCK:
        if (!capture(r, f, n, &n->body, &v)) return EX_ERR;
        if (n->a && !eval_filter_chain(r, f, n->a, v, &v)) return EX_ERR;
        return frame_set(r, n, f, n->targets[0], v) ? EX_OK : EX_ERR;
    case N_MACRO: {
        struct tpl_macro *m = tpl_alloc(r, n, sizeof *m);
        if (!m) return EX_ERR;
        m->def = n;
        m->closure = f;
        f->captured = true;
        v = (struct tpl_value){.type = TPL_MACRO};
        v.u.macro = m;
        return frame_set(r, n, f, n->name, v) ? EX_OK : EX_ERR;
    }
    case N_BREAK: return EX_BREAK;
    case N_CONTINUE: return EX_CONTINUE;
    case N_FILTER_BLOCK:
        if (!capture(r, f, n, &n->body, &v) || !eval_filter_chain(r, f, n->a, v, &v)) return EX_ERR;
        if (!tpl_write_str(r->out, v))
            return tpl_fail(r, n, LLMOPT_ERR_LIMIT, "rendered output exceeds %zu bytes", r->out->limit), EX_ERR;
        return EX_OK;
    case N_WITH: {
        struct tpl_frame *w = frame_new(r, n, f);
        if (!w) return EX_ERR;
        for (size_t i = 0; i < n->n_targets; i++) {
            if (!eval(r, f, n->args[i], &v) || !frame_set(r, n, w, n->targets[i], v)) return EX_ERR;
        }
        return exec_body(r, w, &n->body);
    }
    case N_SCOPE: {
        struct tpl_frame *w = frame_new(r, n, f);
        if (!w) return EX_ERR;
        enum exec_status st = exec_body(r, w, &n->body);
        return st;
    }
    default: break;
    }
    return tpl_fail(r, n, LLMOPT_ERR_FORMAT, "not a statement"), EX_ERR;
}

static enum exec_status exec_body(struct tpl_render *r, struct tpl_frame *f, const struct tpl_body *b) {
    if (++r->eval_depth > TPL_MAX_EVAL_DEPTH) {
        r->eval_depth--;
        return tpl_fail(r, b->len ? b->items[0] : NULL, LLMOPT_ERR_LIMIT, "evaluation nested deeper than %d",
                        TPL_MAX_EVAL_DEPTH), EX_ERR;
    }
    enum exec_status st = EX_OK;
    for (size_t i = 0; i < b->len && st == EX_OK; i++) {
        if (!tpl_step(r, b->items[i])) st = EX_ERR;
        else st = exec_stmt(r, f, b->items[i]);
    }
    r->eval_depth--;
    return st;
}

enum llmopt_status tpl_render(const struct tpl_template *t, const json_t *context,
                              const struct tpl_limits *lim, char **out, size_t *out_len,
                              struct llmopt_err *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (context && !json_is_object(context))
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "%s: the render context must be a JSON object", t->name);
    struct tpl_render r = {.tpl = t, .err = err};
    if (lim) r.lim = *lim;
    else tpl_limits_default(&r.lim);
    arena_init(&r.arena);
    struct tpl_buf buf = {.limit = r.lim.max_output};
    r.out = &buf;
    struct tpl_frame *top = frame_new(&r, NULL, NULL);
    bool ok = top != NULL;
    if (ok && context) {
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)context, key, val) {
            struct tpl_value name, v;
            if (!tpl_str_new(&r, NULL, key, strlen(key), &name) || !tpl_from_json(&r, val, &v, 0) ||
                !frame_set(&r, NULL, top, name.u.s, v)) {
                ok = false;
                break;
            }
        }
    }
    if (ok) ok = exec_body(&r, top, &t->root) == EX_OK;
    arena_free(&r.arena);
    if (!ok) {
        tpl_buf_free(&buf);
        return r.status ? r.status : LLMOPT_ERR_FORMAT;
    }
    if (!buf.data && !tpl_buf_put(&buf, "", 0)) {
        tpl_buf_free(&buf);
        return err_set(err, LLMOPT_ERR_NOMEM, "out of memory");
    }
    *out = buf.data;
    if (out_len) *out_len = buf.len;
    return LLMOPT_OK;
}
