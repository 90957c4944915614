/* Template builtins: Jinja2's filters and tests, the globals transformers provides
 * (range, namespace, dict, raise_exception, strftime_now), Python's str / dict / list
 * methods that chat templates call, and the loop object's attributes.
 *
 * Each behaves like its Python original on the inputs chat templates give it; the
 * known differences (Unicode case mapping beyond Latin, Greek and Cyrillic; filters
 * returning lists where Jinja returns generators) are listed in docs/templates.md. */
#include "template/tpl_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- names ------------------------------------------------------------------------ */

enum filter_id {
    F_ABS, F_ATTR, F_BATCH, F_CAPITALIZE, F_CENTER, F_COUNT, F_DEFAULT, F_DICTSORT, F_ESCAPE,
    F_FIRST, F_FLOAT, F_FORCEESCAPE, F_FORMAT, F_INDENT, F_INT, F_ITEMS, F_JOIN, F_LAST,
    F_LIST, F_LOWER, F_MAP, F_MAX, F_MIN, F_REJECT, F_REJECTATTR, F_REPLACE, F_REVERSE,
    F_ROUND, F_SAFE, F_SELECT, F_SELECTATTR, F_SORT, F_STRING, F_SUM, F_TITLE, F_TOJSON,
    F_TRIM, F_UNIQUE, F_UPPER, F_WORDCOUNT,
    F_COUNT_
};

static const struct {
    const char *name;
    int id; /* -1: Jinja has it, llmopt does not */
} filter_table[] = {
    {"abs", F_ABS}, {"attr", F_ATTR}, {"batch", F_BATCH}, {"capitalize", F_CAPITALIZE},
    {"center", F_CENTER}, {"count", F_COUNT}, {"d", F_DEFAULT}, {"default", F_DEFAULT},
    {"dictsort", F_DICTSORT}, {"e", F_ESCAPE}, {"escape", F_ESCAPE}, {"first", F_FIRST},
    {"float", F_FLOAT}, {"forceescape", F_FORCEESCAPE}, {"format", F_FORMAT},
    {"indent", F_INDENT}, {"int", F_INT}, {"items", F_ITEMS}, {"join", F_JOIN},
    {"last", F_LAST}, {"length", F_COUNT}, {"list", F_LIST}, {"lower", F_LOWER},
    {"map", F_MAP}, {"max", F_MAX}, {"min", F_MIN}, {"reject", F_REJECT},
    {"rejectattr", F_REJECTATTR}, {"replace", F_REPLACE}, {"reverse", F_REVERSE},
    {"round", F_ROUND}, {"safe", F_SAFE}, {"select", F_SELECT}, {"selectattr", F_SELECTATTR},
    {"sort", F_SORT}, {"string", F_STRING}, {"sum", F_SUM}, {"title", F_TITLE},
    {"tojson", F_TOJSON}, {"trim", F_TRIM}, {"unique", F_UNIQUE}, {"upper", F_UPPER},
    {"wordcount", F_WORDCOUNT},
    {"filesizeformat", -1}, {"groupby", -1}, {"pprint", -1}, {"random", -1}, {"slice", -1},
    {"striptags", -1}, {"truncate", -1}, {"urlencode", -1}, {"urlize", -1}, {"wordwrap", -1},
    {"xmlattr", -1},
};

enum test_id {
    T_BOOLEAN, T_CALLABLE, T_DEFINED, T_DIVISIBLEBY, T_EQ, T_ESCAPED, T_EVEN, T_FALSE,
    T_FILTER, T_FLOAT, T_GE, T_GT, T_IN, T_INTEGER, T_ITERABLE, T_LE, T_LOWER, T_LT,
    T_MAPPING, T_NE, T_NONE, T_NUMBER, T_ODD, T_SAMEAS, T_SEQUENCE, T_STRING, T_TEST,
    T_TRUE, T_UNDEFINED, T_UPPER,
    T_COUNT_
};

static const struct {
    const char *name;
    int id;
} test_table[] = {
    {"boolean", T_BOOLEAN}, {"callable", T_CALLABLE}, {"defined", T_DEFINED},
    {"divisibleby", T_DIVISIBLEBY}, {"eq", T_EQ}, {"equalto", T_EQ}, {"==", T_EQ},
    {"escaped", T_ESCAPED}, {"even", T_EVEN}, {"false", T_FALSE}, {"filter", T_FILTER},
    {"float", T_FLOAT}, {"ge", T_GE}, {">=", T_GE}, {"gt", T_GT}, {"greaterthan", T_GT},
    {">", T_GT}, {"in", T_IN}, {"integer", T_INTEGER}, {"iterable", T_ITERABLE},
    {"le", T_LE}, {"<=", T_LE}, {"lower", T_LOWER}, {"lt", T_LT}, {"lessthan", T_LT},
    {"<", T_LT}, {"mapping", T_MAPPING}, {"ne", T_NE}, {"!=", T_NE}, {"none", T_NONE},
    {"number", T_NUMBER}, {"odd", T_ODD}, {"sameas", T_SAMEAS}, {"sequence", T_SEQUENCE},
    {"string", T_STRING}, {"test", T_TEST}, {"true", T_TRUE}, {"undefined", T_UNDEFINED},
    {"upper", T_UPPER},
};

int tpl_filter_lookup(struct tpl_str name, bool *known) {
    *known = false;
    for (size_t i = 0; i < LLMOPT_ARRAY_LEN(filter_table); i++)
        if (tpl_str_eqc(name, filter_table[i].name)) {
            *known = true;
            return filter_table[i].id;
        }
    return -1;
}

int tpl_test_lookup(struct tpl_str name, bool *known) {
    *known = false;
    for (size_t i = 0; i < LLMOPT_ARRAY_LEN(test_table); i++)
        if (tpl_str_eqc(name, test_table[i].name)) {
            *known = true;
            return test_table[i].id;
        }
    return -1;
}

const char *tpl_filter_name(int id) {
    for (size_t i = 0; i < LLMOPT_ARRAY_LEN(filter_table); i++)
        if (filter_table[i].id == id) return filter_table[i].name;
    return "?";
}

const char *tpl_test_name(int id) {
    for (size_t i = 0; i < LLMOPT_ARRAY_LEN(test_table); i++)
        if (test_table[i].id == id) return test_table[i].name;
    return "?";
}

/* Builtin callables: globals, methods of str / dict / list, loop.cycle. */
enum tpl_builtin {
    B_RANGE, B_NAMESPACE, B_DICT, B_RAISE_EXCEPTION, B_STRFTIME_NOW,
    B_STR_STARTSWITH, B_STR_ENDSWITH, B_STR_STRIP, B_STR_LSTRIP, B_STR_RSTRIP, B_STR_SPLIT,
    B_STR_RSPLIT, B_STR_SPLITLINES, B_STR_REPLACE, B_STR_UPPER, B_STR_LOWER, B_STR_TITLE,
    B_STR_CAPITALIZE, B_STR_SWAPCASE, B_STR_FIND, B_STR_RFIND, B_STR_INDEX, B_STR_RINDEX,
    B_STR_COUNT, B_STR_JOIN, B_STR_FORMAT, B_STR_ISDIGIT, B_STR_ISALPHA, B_STR_ISALNUM,
    B_STR_ISSPACE, B_STR_ISLOWER, B_STR_ISUPPER, B_STR_PARTITION, B_STR_RPARTITION,
    B_STR_CENTER, B_STR_LJUST, B_STR_RJUST, B_STR_ZFILL,
    B_DICT_ITEMS, B_DICT_KEYS, B_DICT_VALUES, B_DICT_GET,
    B_LIST_INDEX, B_LIST_COUNT, B_UNSAFE,
    B_LOOP_CYCLE,
    B_COUNT_
};

/* Read-only: renders may run on several threads at once. */
static const struct {
    const char *name;
    struct tpl_func func;
} global_table[] = {
    {"range", {.id = B_RANGE}}, {"namespace", {.id = B_NAMESPACE}}, {"dict", {.id = B_DICT}},
    {"raise_exception", {.id = B_RAISE_EXCEPTION}}, {"strftime_now", {.id = B_STRFTIME_NOW}},
};

static const struct {
    const char *name;
    int id;
} str_methods[] = {
    {"startswith", B_STR_STARTSWITH}, {"endswith", B_STR_ENDSWITH}, {"strip", B_STR_STRIP},
    {"lstrip", B_STR_LSTRIP}, {"rstrip", B_STR_RSTRIP}, {"split", B_STR_SPLIT},
    {"rsplit", B_STR_RSPLIT}, {"splitlines", B_STR_SPLITLINES}, {"replace", B_STR_REPLACE},
    {"upper", B_STR_UPPER}, {"lower", B_STR_LOWER}, {"title", B_STR_TITLE},
    {"capitalize", B_STR_CAPITALIZE}, {"swapcase", B_STR_SWAPCASE}, {"casefold", B_STR_LOWER},
    {"find", B_STR_FIND}, {"rfind", B_STR_RFIND}, {"index", B_STR_INDEX},
    {"rindex", B_STR_RINDEX}, {"count", B_STR_COUNT}, {"join", B_STR_JOIN},
    {"format", B_STR_FORMAT}, {"isdigit", B_STR_ISDIGIT}, {"isalpha", B_STR_ISALPHA},
    {"isalnum", B_STR_ISALNUM}, {"isspace", B_STR_ISSPACE}, {"islower", B_STR_ISLOWER},
    {"isupper", B_STR_ISUPPER}, {"partition", B_STR_PARTITION}, {"rpartition", B_STR_RPARTITION},
    {"center", B_STR_CENTER}, {"ljust", B_STR_LJUST}, {"rjust", B_STR_RJUST}, {"zfill", B_STR_ZFILL},
};

static const struct {
    const char *name;
    int id;
} dict_methods[] = {
    {"items", B_DICT_ITEMS}, {"keys", B_DICT_KEYS}, {"values", B_DICT_VALUES}, {"get", B_DICT_GET},
};

static const char *const mutating_methods[] = {
    "append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear",
    "update", "setdefault", "popitem", NULL,
};

bool tpl_global_lookup(struct tpl_str name, struct tpl_value *out) {
    for (size_t i = 0; i < LLMOPT_ARRAY_LEN(global_table); i++)
        if (tpl_str_eqc(name, global_table[i].name)) {
            out->type = TPL_FUNC;
            out->flags = 0;
            out->u.func = &global_table[i].func;
            return true;
        }
    return false;
}

static bool bound(struct tpl_render *r, const struct tpl_node *at, int id, struct tpl_value self,
                  struct tpl_value *out) {
    struct tpl_func *f = tpl_alloc(r, at, sizeof *f);
    if (!f) return true; /* error recorded; caller checks r->status */
    f->id = id;
    f->self = self;
    out->type = TPL_FUNC;
    out->flags = 0;
    out->u.func = f;
    return true;
}

bool tpl_builtin_attr(struct tpl_render *r, const struct tpl_node *at, struct tpl_value obj,
                      struct tpl_str name, struct tpl_value *out) {
    switch ((enum tpl_type)obj.type) {
    case TPL_STR:
        for (size_t i = 0; i < LLMOPT_ARRAY_LEN(str_methods); i++)
            if (tpl_str_eqc(name, str_methods[i].name)) return bound(r, at, str_methods[i].id, obj, out);
        return false;
    case TPL_DICT:
        for (size_t i = 0; i < LLMOPT_ARRAY_LEN(dict_methods); i++)
            if (tpl_str_eqc(name, dict_methods[i].name)) return bound(r, at, dict_methods[i].id, obj, out);
        for (const char *const *m = mutating_methods; *m; m++)
            if (tpl_str_eqc(name, *m)) return bound(r, at, B_UNSAFE, tpl_strv(name), out);
        return false;
    case TPL_LIST:
        if (tpl_str_eqc(name, "index")) return bound(r, at, B_LIST_INDEX, obj, out);
        if (tpl_str_eqc(name, "count")) return bound(r, at, B_LIST_COUNT, obj, out);
        for (const char *const *m = mutating_methods; *m; m++)
            if (tpl_str_eqc(name, *m)) return bound(r, at, B_UNSAFE, tpl_strv(name), out);
        return false;
    case TPL_LOOP: {
        const struct tpl_loop *l = obj.u.loop;
        size_t i = l->index0, n = l->length;
        if (tpl_str_eqc(name, "index")) *out = tpl_int((int64_t)i + 1);
        else if (tpl_str_eqc(name, "index0")) *out = tpl_int((int64_t)i);
        else if (tpl_str_eqc(name, "revindex")) *out = tpl_int((int64_t)(n - i));
        else if (tpl_str_eqc(name, "revindex0")) *out = tpl_int((int64_t)(n - i - 1));
        else if (tpl_str_eqc(name, "first")) *out = tpl_bool(i == 0);
        else if (tpl_str_eqc(name, "last")) *out = tpl_bool(i + 1 == n);
        else if (tpl_str_eqc(name, "length")) *out = tpl_int((int64_t)n);
        else if (tpl_str_eqc(name, "depth")) *out = tpl_int(1);
        else if (tpl_str_eqc(name, "depth0")) *out = tpl_int(0);
        else if (tpl_str_eqc(name, "previtem"))
            *out = i > 0 ? l->items[i - 1] : tpl_undefined_fmt(r, "there is no previous item");
        else if (tpl_str_eqc(name, "nextitem"))
            *out = i + 1 < n ? l->items[i + 1] : tpl_undefined_fmt(r, "there is no next item");
        else if (tpl_str_eqc(name, "cycle")) return bound(r, at, B_LOOP_CYCLE, obj, out);
        else return false;
        return true;
    }
    case TPL_INT:
    case TPL_BOOL:
    case TPL_FLOAT: /* numbers' real and imaginary parts (selectattr("real") sees them) */
        if (tpl_str_eqc(name, "real")) *out = obj.type == TPL_BOOL ? tpl_int(obj.u.b) : obj;
        else if (tpl_str_eqc(name, "imag")) *out = obj.type == TPL_FLOAT ? tpl_float(0) : tpl_int(0);
        else return false;
        return true;
    default: return false;
    }
}

/* ---- argument binding --------------------------------------------------------------- */

/* Binds args to the parameters names[0..n): out[i] and given[i]. Unknown keywords and
 * extra positionals are errors naming the callable `what`. */
static bool bind_args(struct tpl_render *r, const struct tpl_node *at, const char *what,
                      const struct tpl_args *a, const char *const *names, size_t n,
                      struct tpl_value *out, bool *given) {
    for (size_t i = 0; i < n; i++) {
        given[i] = false;
        out[i] = tpl_none();
    }
    if (a->n_pos > n)
        return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "%s takes at most %zu argument(s), %zu given", what, n, a->n_pos);
    for (size_t i = 0; i < a->n_pos; i++) {
        out[i] = a->pos[i];
        given[i] = true;
    }
    for (size_t k = 0; k < a->n_kw; k++) {
        size_t i = 0;
        while (i < n && !tpl_str_eqc(a->kw_names[k], names[i])) i++;
        if (i == n)
            return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "%s got an unexpected keyword argument '%.*s'", what,
                            (int)a->kw_names[k].len, a->kw_names[k].ptr);
        if (given[i])
            return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "%s got multiple values for argument '%s'", what, names[i]);
        out[i] = a->kw[k];
        given[i] = true;
    }
    return true;
}

static bool need_str(struct tpl_render *r, const struct tpl_node *at, const char *what, struct tpl_value v) {
    if (v.type == TPL_STR) return true;
    if (v.type == TPL_UNDEFINED) return tpl_fail_undefined(r, at, v);
    return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "%s: expected a string, got %s", what, tpl_type_name(v.type));
}

static bool need_int(struct tpl_render *r, const struct tpl_node *at, const char *what, struct tpl_value v,
                     int64_t *out) {
    *out = 0;
    if (v.type == TPL_INT) { *out = v.u.i; return true; }
    if (v.type == TPL_BOOL) { *out = v.u.b; return true; }
    if (v.type == TPL_UNDEFINED) return tpl_fail_undefined(r, at, v);
    return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "%s: expected an integer, got %s", what, tpl_type_name(v.type));
}

static struct tpl_value list_value(struct tpl_list *l, bool tuple) {
    struct tpl_value v = {.type = TPL_LIST, .flags = tuple ? TPL_F_TUPLE : 0};
    v.u.list = l;
    return v;
}

static bool make_list(struct tpl_render *r, const struct tpl_node *at, const struct tpl_value *items,
                      size_t n, bool tuple, struct tpl_value *out) {
    struct tpl_list *l = tpl_list_new(r, at, n);
    if (!l) return false;
    if (n) memcpy(l->items, items, n * sizeof *items);
    *out = list_value(l, tuple);
    return true;
}

static bool make_pair(struct tpl_render *r, const struct tpl_node *at, struct tpl_value a, struct tpl_value b,
                      struct tpl_value *out) {
    struct tpl_value items[2] = {a, b};
    return make_list(r, at, items, 2, true, out);
}

/* ---- case mapping ------------------------------------------------------------------- */

static uint32_t cp_upper(uint32_t c) {
    if (c >= 'a' && c <= 'z') return c - 32;
    if (c < 0x80) return c;
    if ((c >= 0xe0 && c <= 0xfe && c != 0xf7)) return c - 32;
    if (c == 0xff) return 0x178;
    if (c == 0xb5) return 0x39c;
    if (c >= 0x100 && c <= 0x17f) {
        if (c == 0x131) return 'I';
        if ((c >= 0x100 && c <= 0x137) || (c >= 0x14a && c <= 0x177)) return c & 1 ? c - 1 : c;
        if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e)) return c & 1 ? c : c - 1;
        if (c == 0x17f) return 'S';
        return c;
    }
    if (c >= 0x3b1 && c <= 0x3c9) return c == 0x3c2 ? 0x3a3 : c - 32;
    if (c == 0x3ac) return 0x386;
    if (c >= 0x3ad && c <= 0x3af) return c - 37;
    if (c == 0x3cc) return 0x38c;
    if (c == 0x3cd || c == 0x3ce) return c - 63;
    if (c >= 0x430 && c <= 0x44f) return c - 32;
    if (c >= 0x450 && c <= 0x45f) return c - 80;
    return c;
}

static uint32_t cp_lower(uint32_t c) {
    if (c >= 'A' && c <= 'Z') return c + 32;
    if (c < 0x80) return c;
    if ((c >= 0xc0 && c <= 0xde && c != 0xd7)) return c + 32;
    if (c == 0x178) return 0xff;
    if (c >= 0x100 && c <= 0x17f) {
        if (c == 0x130) return 'i';
        if ((c >= 0x100 && c <= 0x137) || (c >= 0x14a && c <= 0x177)) return c & 1 ? c : c + 1;
        if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e)) return c & 1 ? c + 1 : c;
        return c;
    }
    if (c >= 0x391 && c <= 0x3a9 && c != 0x3a2) return c + 32;
    if (c == 0x386) return 0x3ac;
    if (c >= 0x388 && c <= 0x38a) return c + 37;
    if (c == 0x38c) return 0x3cc;
    if (c == 0x38e || c == 0x38f) return c + 63;
    if (c >= 0x410 && c <= 0x42f) return c + 32;
    if (c >= 0x400 && c <= 0x40f) return c + 80;
    return c;
}

static bool cp_cased(uint32_t c) { return cp_upper(c) != c || cp_lower(c) != c || c == 0xdf; }
static bool cp_alpha(uint32_t c) {
    return (c < 0x80) ? ((c | 32) >= 'a' && (c | 32) <= 'z') : (c < 0xfffd00u && (cp_cased(c) || c >= 0x3040));
}
static bool cp_digit(uint32_t c) { return c >= '0' && c <= '9'; }

enum case_mode { CASE_UPPER, CASE_LOWER, CASE_SWAP, CASE_TITLE_PY, CASE_TITLE_JINJA, CASE_CAPITALIZE };

static bool jinja_title_sep(uint32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || tpl_is_space(c); }

static bool case_map(struct tpl_render *r, const struct tpl_node *at, struct tpl_str s, enum case_mode mode,
                     struct tpl_value *out) {
    char *buf = tpl_alloc(r, at, s.len * 2 + 1); /* a mapping never more than doubles a code point */
    if (!buf) return false;
    size_t n = 0;
    bool prev_cased = false, first = true, after_sep = true;
    for (size_t i = 0; i < s.len;) {
        uint32_t c = tpl_utf8_next(s.ptr, s.len, &i), m = c;
        switch (mode) {
        case CASE_UPPER:
            if (c == 0xdf) { /* Python: "ß".upper() == "SS" */
                buf[n++] = 'S';
                m = 'S';
                break;
            }
            m = cp_upper(c);
            break;
        case CASE_LOWER: m = cp_lower(c); break;
        case CASE_SWAP: m = cp_upper(c) != c ? cp_upper(c) : cp_lower(c); break;
        case CASE_TITLE_PY:
            m = prev_cased ? cp_lower(c) : cp_upper(c);
            prev_cased = cp_cased(c);
            break;
        case CASE_TITLE_JINJA:
            if (jinja_title_sep(c)) {
                after_sep = true;
            } else {
                m = after_sep ? cp_upper(c) : cp_lower(c);
                after_sep = false;
            }
            break;
        case CASE_CAPITALIZE: m = first ? cp_upper(c) : cp_lower(c); break;
        }
        first = false;
        n += tpl_utf8_put(m, buf + n);
    }
    *out = tpl_strv((struct tpl_str){buf, n});
    return true;
}

/* ---- sorting ------------------------------------------------------------------------ */

/* Lower-cases strings for case-insensitive comparisons (Jinja's ignore_case). */
static bool fold_key(struct tpl_render *r, const struct tpl_node *at, struct tpl_value v, bool case_sensitive,
                     struct tpl_value *out) {
    if (case_sensitive || v.type != TPL_STR) {
        *out = v;
        return true;
    }
    return case_map(r, at, v.u.s, CASE_LOWER, out);
}

/* Jinja's attribute getter: "a.b.0" through getitem. */
static bool get_path(struct tpl_render *r, const struct tpl_node *at, struct tpl_value v, struct tpl_value attr,
                     struct tpl_value *out) {
    if (attr.type != TPL_STR) return tpl_getitem(r, at, v, attr, out);
    struct tpl_str s = attr.u.s;
    size_t start = 0;
    *out = v;
    for (size_t i = 0; i <= s.len; i++) {
        if (i < s.len && s.ptr[i] != '.') continue;
        struct tpl_str part = {s.ptr + start, i - start};
        struct tpl_value key = tpl_strv(part);
        bool digits = part.len > 0 && part.len < 18;
        int64_t num = 0;
        for (size_t k = 0; k < part.len && digits; k++) {
            digits = part.ptr[k] >= '0' && part.ptr[k] <= '9';
            num = num * 10 + (part.ptr[k] - '0');
        }
        if (digits) key = tpl_int(num);
        if (!tpl_getitem(r, at, *out, key, out)) return false;
        start = i + 1;
    }
    return true;
}

/* Stable merge sort of idx[0..n) by keys; false on an incomparable pair. */
static bool sort_indices(struct tpl_render *r, const struct tpl_node *at, const struct tpl_value *keys,
                         size_t *idx, size_t n, bool reverse) {
    if (n < 2) return true;
    size_t *tmp = tpl_alloc(r, at, n * sizeof *tmp);
    if (!tmp) return false;
    for (size_t width = 1; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                int c;
                if (!tpl_compare(r, at, keys[idx[j]], keys[idx[i]], &c)) return false;
                if (reverse) c = -c;
                tmp[k++] = c < 0 ? idx[j++] : idx[i++];
            }
            while (i < mid) tmp[k++] = idx[i++];
            while (j < hi) tmp[k++] = idx[j++];
        }
        memcpy(idx, tmp, n * sizeof *idx);
        if (!tpl_step(r, at)) return false;
    }
    return true;
}

/* ---- json / tojson -------------------------------------------------------------------- */

static bool do_tojson(struct tpl_render *r, const struct tpl_node *at, struct tpl_value v, const struct tpl_args *a,
                      struct tpl_value *out) {
    static const char *const names[] = {"ensure_ascii", "indent", "separators", "sort_keys"};
    struct tpl_value p[4];
    bool given[4] = {false};
    if (!bind_args(r, at, "tojson", a, names, 4, p, given)) return false;
    struct tpl_json_opts o = {.ensure_ascii = tpl_truthy(p[0]), .sort_keys = tpl_truthy(p[3])};
    char spaces[64];
    if (p[1].type == TPL_INT || p[1].type == TPL_BOOL) {
        int64_t w = p[1].type == TPL_BOOL ? p[1].u.b : p[1].u.i;
        if (w > (int64_t)sizeof spaces) return tpl_fail(r, at, LLMOPT_ERR_LIMIT, "tojson: indent %lld is too large", (long long)w);
        if (w < 0) w = 0;
        memset(spaces, ' ', (size_t)w);
        o.have_indent = true;
        o.indent = (struct tpl_str){spaces, (size_t)w};
    } else if (p[1].type == TPL_STR) {
        o.have_indent = true;
        o.indent = p[1].u.s;
    } else if (p[1].type != TPL_NONE && p[1].type != TPL_UNDEFINED) {
        return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "tojson: indent must be an integer or a string");
    }
    o.item_sep = o.have_indent ? TPL_STR_LIT(",") : TPL_STR_LIT(", ");
    o.key_sep = TPL_STR_LIT(": ");
    if (p[2].type == TPL_LIST && p[2].u.list->len == 2 && p[2].u.list->items[0].type == TPL_STR &&
        p[2].u.list->items[1].type == TPL_STR) {
        o.item_sep = p[2].u.list->items[0].u.s;
        o.key_sep = p[2].u.list->items[1].u.s;
    } else if (p[2].type != TPL_NONE && p[2].type != TPL_UNDEFINED) {
        return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "tojson: separators must be a pair of strings");
    }
    struct tpl_buf b = {.limit = r->lim.max_output};
    bool ok = tpl_write_json(r, at, &b, v, &o, 0) && tpl_str_new(r, at, b.data ? b.data : "", b.len, out);
    tpl_buf_free(&b);
    return ok;
}

/* ---- string helpers ----------------------------------------------------------------- */

/* Ends a string built in b (ok: every write fit): the string as *out, or, when a write
 * hit the output limit, an error naming the builtin `what`. Frees b either way. */
static bool buf_result(struct tpl_render *r, const struct tpl_node *at, struct tpl_buf *b, bool ok, const char *what,
                       struct tpl_value *out) {
    if (!ok) {
        tpl_buf_free(b);
        return tpl_fail(r, at, LLMOPT_ERR_LIMIT, "%s: result longer than %zu bytes", what, r->lim.max_output);
    }
    ok = tpl_str_new(r, at, b->data ? b->data : "", b->len, out);
    tpl_buf_free(b);
    return ok;
}

static bool str_of(struct tpl_render *r, const struct tpl_node *at, struct tpl_value v, struct tpl_str *out) {
    struct tpl_value s;
    if (!tpl_to_str(r, at, v, &s)) return false;
    *out = s.u.s;
    return true;
}

/* Byte offset of the first occurrence of needle in hay at or after from; -1 if none. */
static int64_t str_find(struct tpl_str hay, struct tpl_str needle, size_t from) {
    if (needle.len == 0) return from <= hay.len ? (int64_t)from : -1;
    for (size_t i = from; i + needle.len <= hay.len; i++)
        if (hay.ptr[i] == needle.ptr[0] && memcmp(hay.ptr + i, needle.ptr, needle.len) == 0) return (int64_t)i;
    return -1;
}

static int64_t str_rfind(struct tpl_str hay, struct tpl_str needle) {
    if (needle.len > hay.len) return -1;
    for (size_t i = hay.len - needle.len + 1; i-- > 0;)
        if (memcmp(hay.ptr + i, needle.ptr, needle.len) == 0) return (int64_t)i;
    return -1;
}

static bool str_replace(struct tpl_render *r, const struct tpl_node *at, struct tpl_str s, struct tpl_str old,
                        struct tpl_str new_s, int64_t count, struct tpl_value *out) {
    if (count < 0) count = INT64_MAX;
    struct tpl_buf b = {.limit = r->lim.max_output};
    bool ok = true;
    if (old.len == 0) { /* "ab".replace("", "-") == "-a-b-" */
        int64_t done = 0;
        size_t i = 0;
        for (;;) {
            if (done < count) {
                ok = ok && tpl_buf_put(&b, new_s.ptr, new_s.len);
                done++;
            }
            if (i >= s.len) break;
            size_t st = i;
            tpl_utf8_next(s.ptr, s.len, &i);
            ok = ok && tpl_buf_put(&b, s.ptr + st, i - st);
        }
    } else {
        size_t pos = 0;
        int64_t done = 0;
        while (done < count) {
            int64_t f = str_find(s, old, pos);
            if (f < 0) break;
            ok = ok && tpl_buf_put(&b, s.ptr + pos, (size_t)f - pos) && tpl_buf_put(&b, new_s.ptr, new_s.len);
            pos = (size_t)f + old.len;
            done++;
        }
        ok = ok && tpl_buf_put(&b, s.ptr + pos, s.len - pos);
    }
    return buf_result(r, at, &b, ok, "replace", out);
}

/* Python str.split / rsplit. */
static bool str_split(struct tpl_render *r, const struct tpl_node *at, struct tpl_str s, const struct tpl_str *sep,
                      int64_t maxsplit, bool from_right, struct tpl_value *out) {
    if (sep && sep->len == 0) return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "split: empty separator");
    size_t cap = 16, n = 0;
    struct tpl_str *parts = malloc(cap * sizeof *parts);
    if (!parts) return tpl_fail(r, at, LLMOPT_ERR_NOMEM, "out of memory");
    bool ok = true;
#define ADD_PART(p_, l_)                                                               \
    do {                                                                               \
        if (n == cap) {                                                                \
            cap *= 2;                                                                  \
            struct tpl_str *np_ = realloc(parts, cap * sizeof *parts);                 \
            if (!np_) { ok = false; goto done; }                                       \
            parts = np_;                                                               \
        }                                                                              \
        parts[n++] = (struct tpl_str){(p_), (l_)};                                    \
    } while (0)
    if (maxsplit < 0) maxsplit = INT64_MAX;
    if (sep) {
        if (!from_right) {
            size_t pos = 0;
            int64_t done = 0;
            for (;;) {
                int64_t f = done < maxsplit ? str_find(s, *sep, pos) : -1;
                if (f < 0) break;
                ADD_PART(s.ptr + pos, (size_t)f - pos);
                pos = (size_t)f + sep->len;
                done++;
            }
            ADD_PART(s.ptr + pos, s.len - pos);
        } else {
            size_t end = s.len;
            int64_t done = 0;
            for (;;) {
                int64_t f = done < maxsplit ? str_rfind((struct tpl_str){s.ptr, end}, *sep) : -1;
                if (f < 0) break;
                ADD_PART(s.ptr + f + sep->len, end - (size_t)f - sep->len);
                end = (size_t)f;
                done++;
            }
            ADD_PART(s.ptr, end);
            for (size_t i = 0; i < n / 2; i++) {
                struct tpl_str t = parts[i];
                parts[i] = parts[n - 1 - i];
                parts[n - 1 - i] = t;
            }
        }
    } else if (!from_right) { /* runs of whitespace, no empty parts */
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            size_t j = i;
            while (j < s.len) {
                size_t k = j;
                if (!tpl_is_space(tpl_utf8_next(s.ptr, s.len, &k))) break;
                j = k;
            }
            i = j;
            if (i >= s.len) break;
            if (done >= maxsplit) {
                struct tpl_str rest = tpl_strip((struct tpl_str){s.ptr + i, s.len - i}, NULL, 2);
                ADD_PART(rest.ptr, rest.len);
                break;
            }
            size_t st = i;
            while (i < s.len) {
                size_t k = i;
                if (tpl_is_space(tpl_utf8_next(s.ptr, s.len, &k))) break;
                i = k;
            }
            ADD_PART(s.ptr + st, i - st);
            done++;
        }
    } else {
        /* rsplit() without sep: split from the right on whitespace runs. */
        struct tpl_str t = tpl_strip(s, NULL, 2);
        size_t end = t.len;
        int64_t done = 0;
        while (end > 0) {
            if (done >= maxsplit) {
                struct tpl_str rest = tpl_strip((struct tpl_str){s.ptr, end}, NULL, 1);
                ADD_PART(rest.ptr, rest.len);
                break;
            }
            size_t st = end;
            while (st > 0 && !tpl_is_space((uint8_t)s.ptr[st - 1])) st--;
            ADD_PART(s.ptr + st, end - st);
            done++;
            end = st;
            while (end > 0 && tpl_is_space((uint8_t)s.ptr[end - 1])) end--;
        }
        for (size_t i = 0; i < n / 2; i++) {
            struct tpl_str x = parts[i];
            parts[i] = parts[n - 1 - i];
            parts[n - 1 - i] = x;
        }
    }
#undef ADD_PART
done:
    if (!ok) {
        free(parts);
        return tpl_fail(r, at, LLMOPT_ERR_NOMEM, "out of memory");
    }
    struct tpl_list *l = tpl_list_new(r, at, n);
    if (l)
        for (size_t i = 0; i < n; i++) l->items[i] = tpl_strv(parts[i]);
    free(parts);
    if (!l) return false;
    *out = list_value(l, false);
    return true;
}

static bool is_line_break(uint32_t c) {
    return c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e ||
           c == 0x85 || c == 0x2028 || c == 0x2029;
}

/* Python str.splitlines(keepends). */
static bool str_splitlines(struct tpl_render *r, const struct tpl_node *at, struct tpl_str s, bool keepends,
                           struct tpl_value *out) {
    size_t n = 0;
    for (int pass = 0; pass < 2; pass++) {
        struct tpl_list *l = NULL;
        if (pass == 1 && !(l = tpl_list_new(r, at, n))) return false;
        size_t count = 0, i = 0;
        while (i < s.len) {
            size_t st = i, eol = i, next = i;
            for (;;) {
                if (eol >= s.len) { next = eol; break; }
                size_t k = eol;
                uint32_t c = tpl_utf8_next(s.ptr, s.len, &k);
                if (is_line_break(c)) {
                    next = k;
                    if (c == '\r' && k < s.len && s.ptr[k] == '\n') next = k + 1;
                    break;
                }
                eol = k;
            }
            if (l) l->items[count] = tpl_strv((struct tpl_str){s.ptr + st, (keepends ? next : eol) - st});
            count++;
            i = next;
        }
        if (pass == 0) n = count;
        else *out = list_value(l, false);
    }
    return true;
}

static bool do_indent(struct tpl_render *r, const struct tpl_node *at, struct tpl_value v, const struct tpl_args *a,
                      struct tpl_value *out) {
    static const char *const names[] = {"width", "first", "blank"};
    struct tpl_value p[3];
    bool given[3] = {false};
    if (!bind_args(r, at, "indent", a, names, 3, p, given)) return false;
    char spaces[256];
    struct tpl_str ind = {spaces, 4};
    memset(spaces, ' ', sizeof spaces);
    if (given[0]) {
        if (p[0].type == TPL_STR) {
            ind = p[0].u.s;
        } else {
            int64_t w = 0;
            if (!need_int(r, at, "indent", p[0], &w)) return false;
            if (w < 0) w = 0;
            if (w > (int64_t)sizeof spaces) return tpl_fail(r, at, LLMOPT_ERR_LIMIT, "indent: width %lld is too large", (long long)w);
            ind.len = (size_t)w;
        }
    }
    bool first = tpl_truthy(p[1]), blank = tpl_truthy(p[2]);
    struct tpl_str s;
    if (!str_of(r, at, v, &s)) return false;
    /* s += "\n"; lines = s.splitlines() */
    char *withnl = tpl_alloc(r, at, s.len + 2);
    if (!withnl) return false;
    memcpy(withnl, s.ptr, s.len);
    withnl[s.len] = '\n';
    struct tpl_value lines_v;
    if (!str_splitlines(r, at, (struct tpl_str){withnl, s.len + 1}, false, &lines_v)) return false;
    const struct tpl_list *lines = lines_v.u.list;
    struct tpl_buf b = {.limit = r->lim.max_output};
    bool ok = true;
    if (first) ok = tpl_buf_put(&b, ind.ptr, ind.len);
    for (size_t i = 0; i < lines->len && ok; i++) {
        struct tpl_str line = lines->items[i].u.s;
        if (i) {
            ok = tpl_buf_putc(&b, '\n');
            if (ok && (blank || line.len)) ok = tpl_buf_put(&b, ind.ptr, ind.len);
        }
        ok = ok && tpl_buf_put(&b, line.ptr, line.len);
    }
    return buf_result(r, at, &b, ok, "indent", out);
}

/* Python's int(str, base) for base 10 / 0 / 2..36 (underscores between digits allowed). */
static bool parse_py_int(struct tpl_str s, int64_t base, int64_t *out) {
    s = tpl_strip(s, NULL, 3);
    size_t i = 0;
    bool neg = false;
    if (i < s.len && (s.ptr[i] == '+' || s.ptr[i] == '-')) neg = s.ptr[i++] == '-';
    if (base == 0) {
        base = 10;
        if (i + 1 < s.len && s.ptr[i] == '0') {
            char p = (char)(s.ptr[i + 1] | 32);
            if (p == 'x') base = 16;
            else if (p == 'o') base = 8;
            else if (p == 'b') base = 2;
            if (base != 10) i += 2;
        }
    } else if (base == 16 || base == 8 || base == 2) {
        if (i + 1 < s.len && s.ptr[i] == '0' &&
            (char)(s.ptr[i + 1] | 32) == (base == 16 ? 'x' : base == 8 ? 'o' : 'b'))
            i += 2;
    }
    if (base < 2 || base > 36 || i >= s.len) return false;
    uint64_t v = 0;
    bool any = false, last_us = false;
    for (; i < s.len; i++) {
        char c = s.ptr[i];
        if (c == '_') {
            if (!any || last_us) return false;
            last_us = true;
            continue;
        }
        int d = c >= '0' && c <= '9' ? c - '0' : (c | 32) >= 'a' && (c | 32) <= 'z' ? (c | 32) - 'a' + 10 : 99;
        if (d >= base) return false;
        if (v > ((uint64_t)INT64_MAX + 1 - (uint64_t)d) / (uint64_t)base) return false;
        v = v * (uint64_t)base + (uint64_t)d;
        any = true;
        last_us = false;
    }
    if (!any || last_us) return false;
    if (!neg && v > INT64_MAX) return false;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}

static bool parse_py_float(struct tpl_str s, double *out) {
    s = tpl_strip(s, NULL, 3);
    char buf[128];
    size_t n = 0;
    if (s.len == 0 || s.len >= sizeof buf) return false;
    for (size_t i = 0; i < s.len; i++) {
        char c = s.ptr[i];
        if (c == '_') continue;
        if (!((c >= '0' && c <= '9') || c == '.' || c == '+' || c == '-' || (c | 32) == 'e' || (c | 32) == 'i' ||
              (c | 32) == 'n' || (c | 32) == 'f' || (c | 32) == 't' || (c | 32) == 'y' || (c | 32) == 'a'))
            return false;
        buf[n++] = c;
    }
    buf[n] = 0;
    if ((buf[0] | 32) == 'x' || (n > 1 && (buf[1] | 32) == 'x')) return false;
    char *end;
    *out = strtod(buf, &end);
    return end == buf + n && n > 0;
}

/* ---- % formatting and str.format ----------------------------------------------------- */

bool tpl_percent_format(struct tpl_render *r, const struct tpl_node *at, struct tpl_str fmt,
                        struct tpl_value args, struct tpl_value *out);

bool tpl_percent_format(struct tpl_render *r, const struct tpl_node *at, struct tpl_str fmt,
                        struct tpl_value args, struct tpl_value *out) {
    const struct tpl_value *items = &args;
    size_t n_items = 1, next = 0;
    bool mapping = args.type == TPL_DICT;
    if (args.type == TPL_LIST && (args.flags & TPL_F_TUPLE)) {
        items = args.u.list->items;
        n_items = args.u.list->len;
    }
    struct tpl_buf b = {.limit = r->lim.max_output};
    bool ok = true;
    for (size_t i = 0; i < fmt.len && ok;) {
        if (fmt.ptr[i] != '%') {
            size_t j = i;
            while (j < fmt.len && fmt.ptr[j] != '%') j++;
            ok = tpl_buf_put(&b, fmt.ptr + i, j - i);
            i = j;
            continue;
        }
        i++;
        struct tpl_value arg;
        bool have_arg = false;
        if (i < fmt.len && fmt.ptr[i] == '(') {
            size_t j = i + 1;
            while (j < fmt.len && fmt.ptr[j] != ')') j++;
            if (j >= fmt.len || !mapping) {
                tpl_buf_free(&b);
                return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "%%-format: bad mapping key");
            }
            struct tpl_value *v = tpl_dict_get_str(args.u.dict, (struct tpl_str){fmt.ptr + i + 1, j - i - 1});
            if (!v) {
                tpl_buf_free(&b);
                return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "%%-format: key '%.*s' not found", (int)(j - i - 1), fmt.ptr + i + 1);
            }
            arg = *v;
            have_arg = true;
            i = j + 1;
        }
        char spec[32] = "%";
        size_t sn = 1;
        while (i < fmt.len && strchr("-+ #0", fmt.ptr[i]) && sn < 8) spec[sn++] = fmt.ptr[i++];
        while (i < fmt.len && fmt.ptr[i] >= '0' && fmt.ptr[i] <= '9' && sn < 16) spec[sn++] = fmt.ptr[i++];
        if (i < fmt.len && fmt.ptr[i] == '.') {
            spec[sn++] = fmt.ptr[i++];
            while (i < fmt.len && fmt.ptr[i] >= '0' && fmt.ptr[i] <= '9' && sn < 24) spec[sn++] = fmt.ptr[i++];
        }
        if (i >= fmt.len) {
            tpl_buf_free(&b);
            return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "%%-format: incomplete format");
        }
        char conv = fmt.ptr[i++];
        if (conv == '%') {
            ok = tpl_buf_putc(&b, '%');
            continue;
        }
        if (!have_arg) {
            if (mapping) arg = args;
            else if (next < n_items) arg = items[next++];
            else {
                tpl_buf_free(&b);
                return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "not enough arguments for format string");
            }
        }
        char tmp[512];
        switch (conv) {
        case 's':
        case 'r': {
            struct tpl_buf sb = {.limit = r->lim.max_output};
            bool w = conv == 's' ? tpl_write_str(&sb, arg) : tpl_write_repr(&sb, arg);
            if (w) {
                spec[sn++] = 's';
                spec[sn] = 0;
                if (sn == 2) {
                    ok = tpl_buf_put(&b, sb.data ? sb.data : "", sb.len);
                } else {
                    snprintf(tmp, sizeof tmp, spec, sb.data ? sb.data : "");
                    ok = tpl_buf_put(&b, tmp, strlen(tmp));
                }
            } else {
                ok = false;
            }
            tpl_buf_free(&sb);
            break;
        }
        case 'd': case 'i': case 'u': case 'x': case 'X': case 'o': case 'c': {
            int64_t v = 0;
            if (arg.type == TPL_FLOAT && conv != 'c') v = (int64_t)arg.u.f;
            else if (!need_int(r, at, "%-format", arg, &v)) { tpl_buf_free(&b); return false; }
            if (conv == 'c') {
                char cb[4];
                ok = tpl_buf_put(&b, cb, tpl_utf8_put((uint32_t)v, cb));
                break;
            }
            spec[sn++] = 'l';
            spec[sn++] = 'l';
            spec[sn++] = conv == 'i' || conv == 'u' ? 'd' : conv;
            spec[sn] = 0;
            snprintf(tmp, sizeof tmp, spec, (long long)v);
            ok = tpl_buf_put(&b, tmp, strlen(tmp));
            break;
        }
        case 'f': case 'F': case 'e': case 'E': case 'g': case 'G': {
            if (!tpl_is_number(arg)) {
                tpl_buf_free(&b);
                return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "%%%c format: a real number is required, not %s", conv, tpl_type_name(arg.type));
            }
            spec[sn++] = conv;
            spec[sn] = 0;
            snprintf(tmp, sizeof tmp, spec, tpl_as_double(arg));
            ok = tpl_buf_put(&b, tmp, strlen(tmp));
            break;
        }
        default:
            tpl_buf_free(&b);
            return tpl_fail(r, at, LLMOPT_ERR_UNSUPPORTED, "%%-format: unsupported conversion '%c'", conv);
        }
    }
    if (ok && !mapping && next < n_items) {
        tpl_buf_free(&b);
        return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "not all arguments converted during string formatting");
    }
    return buf_result(r, at, &b, ok, "%-format", out);
}

/* str.format: {} {0} {name} {name.attr} {name[key]} with !s / !r; no format specs. */
static bool str_format(struct tpl_render *r, const struct tpl_node *at, struct tpl_str fmt, const struct tpl_args *a,
                       struct tpl_value *out) {
    struct tpl_buf b = {.limit = r->lim.max_output};
    size_t auto_idx = 0;
    bool ok = true;
    for (size_t i = 0; i < fmt.len && ok;) {
        char c = fmt.ptr[i];
        if ((c == '{' || c == '}') && i + 1 < fmt.len && fmt.ptr[i + 1] == c) {
            ok = tpl_buf_putc(&b, c);
            i += 2;
            continue;
        }
        if (c == '}') {
            tpl_buf_free(&b);
            return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "format: single '}' encountered in format string");
        }
        if (c != '{') {
            ok = tpl_buf_putc(&b, c);
            i++;
            continue;
        }
        size_t j = i + 1;
        while (j < fmt.len && fmt.ptr[j] != '}') j++;
        if (j >= fmt.len) {
            tpl_buf_free(&b);
            return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "format: single '{' encountered in format string");
        }
        struct tpl_str field = {fmt.ptr + i + 1, j - i - 1};
        i = j + 1;
        char conv = 's';
        const char *bang = memchr(field.ptr, '!', field.len), *colon = memchr(field.ptr, ':', field.len);
        if (colon && (!bang || colon < bang)) {
            tpl_buf_free(&b);
            return tpl_fail(r, at, LLMOPT_ERR_UNSUPPORTED, "format: format specs ('{:...}') are not supported");
        }
        if (bang) {
            conv = bang + 1 < field.ptr + field.len ? bang[1] : 's';
            field.len = (size_t)(bang - field.ptr);
        }
        size_t k = 0;
        while (k < field.len && field.ptr[k] != '.' && field.ptr[k] != '[') k++;
        struct tpl_str head = {field.ptr, k};
        struct tpl_value v;
        int64_t idx;
        if (head.len == 0) {
            if (auto_idx >= a->n_pos) goto missing;
            v = a->pos[auto_idx++];
        } else if (parse_py_int(head, 10, &idx)) {
            if (idx < 0 || (size_t)idx >= a->n_pos) goto missing;
            v = a->pos[idx];
        } else {
            size_t q = 0;
            while (q < a->n_kw && !tpl_str_eq(a->kw_names[q], head)) q++;
            if (q == a->n_kw) goto missing;
            v = a->kw[q];
        }
        while (k < field.len) {
            if (field.ptr[k] == '.') {
                size_t e = ++k;
                while (e < field.len && field.ptr[e] != '.' && field.ptr[e] != '[') e++;
                if (!tpl_getattr(r, at, v, (struct tpl_str){field.ptr + k, e - k}, &v)) { tpl_buf_free(&b); return false; }
                k = e;
            } else {
                size_t e = ++k;
                while (e < field.len && field.ptr[e] != ']') e++;
                struct tpl_str key = {field.ptr + k, e - k};
                struct tpl_value kv = tpl_strv(key);
                if (parse_py_int(key, 10, &idx)) kv = tpl_int(idx);
                if (!tpl_getitem(r, at, v, kv, &v)) { tpl_buf_free(&b); return false; }
                k = e + 1;
            }
        }
        ok = conv == 'r' ? tpl_write_repr(&b, v) : tpl_write_str(&b, v);
        continue;
    missing:
        tpl_buf_free(&b);
        return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "format: replacement field '{%.*s}' has no argument", (int)field.len, field.ptr);
    }
    return buf_result(r, at, &b, ok, "format", out);
}

/* ---- filters ------------------------------------------------------------------------ */

static bool filter_fail_args(struct tpl_render *r, const struct tpl_node *at, int id) {
    return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "filter '%s': wrong arguments", tpl_filter_name(id));
}

static bool items_of(struct tpl_render *r, const struct tpl_node *at, struct tpl_value v,
                     const struct tpl_value **items, size_t *n) {
    return tpl_iterate(r, at, v, items, n);
}

static bool length_of(struct tpl_render *r, const struct tpl_node *at, struct tpl_value v, int64_t *out) {
    switch ((enum tpl_type)v.type) {
    case TPL_STR: *out = (int64_t)tpl_utf8_count(v.u.s); return true;
    case TPL_LIST: *out = (int64_t)v.u.list->len; return true;
    case TPL_DICT: *out = (int64_t)v.u.dict->len; return true;
    case TPL_UNDEFINED: *out = 0; return true;
    default: return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "object of type '%s' has no len()", tpl_type_name(v.type));
    }
}

/* select / reject / selectattr / rejectattr and map(attribute=...). */
static bool select_items(struct tpl_render *r, const struct tpl_node *at, int id, struct tpl_value v,
                         const struct tpl_args *a, struct tpl_value *out) {
    bool by_attr = id == F_SELECTATTR || id == F_REJECTATTR, keep_if = id == F_SELECT || id == F_SELECTATTR;
    size_t first_test_arg = by_attr ? 1 : 0;
    if (a->n_kw) return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "filter '%s' takes no keyword arguments", tpl_filter_name(id));
    if (by_attr && a->n_pos < 1) return filter_fail_args(r, at, id);
    int test = -1;
    if (a->n_pos > first_test_arg) {
        struct tpl_value name = a->pos[first_test_arg];
        if (name.type != TPL_STR) return filter_fail_args(r, at, id);
        bool known;
        test = tpl_test_lookup(name.u.s, &known);
        if (test < 0)
            return tpl_fail(r, at, LLMOPT_ERR_UNSUPPORTED, "%s test '%.*s'", known ? "unsupported" : "no", (int)name.u.s.len, name.u.s.ptr);
    }
    struct tpl_args targs = {0};
    if (test >= 0) {
        targs.n_pos = a->n_pos - first_test_arg - 1;
        targs.pos = a->pos + first_test_arg + 1;
    }
    const struct tpl_value *items;
    size_t n;
    if (!items_of(r, at, v, &items, &n)) return false;
    struct tpl_list *l = tpl_list_new(r, at, n);
    if (!l) return false;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        struct tpl_value x = items[i];
        if (!tpl_step(r, at)) return false;
        if (by_attr && !get_path(r, at, x, a->pos[0], &x)) return false;
        bool pass;
        if (test >= 0) {
            if (!tpl_apply_test(r, at, test, x, &targs, &pass)) return false;
        } else {
            pass = tpl_truthy(x);
        }
        if (pass == keep_if) l->items[k++] = items[i];
    }
    l->len = k;
    *out = list_value(l, false);
    return true;
}

static bool do_map(struct tpl_render *r, const struct tpl_node *at, struct tpl_value v, const struct tpl_args *a,
                   struct tpl_value *out) {
    const struct tpl_value *items;
    size_t n;
    struct tpl_value attr = {0}, deflt = {0};
    bool have_attr = false, have_default = false;
    for (size_t k = 0; k < a->n_kw; k++) {
        if (tpl_str_eqc(a->kw_names[k], "attribute")) {
            attr = a->kw[k];
            have_attr = true;
        } else if (tpl_str_eqc(a->kw_names[k], "default")) {
            deflt = a->kw[k];
            have_default = true;
        } else if (!(a->n_pos > 0)) {
            return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "map: unexpected keyword argument '%.*s'", (int)a->kw_names[k].len,
                            a->kw_names[k].ptr);
        }
    }
    int filter = -1;
    struct tpl_args fargs = {0};
    if (!have_attr) {
        if (a->n_pos < 1 || a->pos[0].type != TPL_STR) return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "map: needs a filter name or attribute=");
        bool known;
        filter = tpl_filter_lookup(a->pos[0].u.s, &known);
        if (filter < 0)
            return tpl_fail(r, at, LLMOPT_ERR_UNSUPPORTED, "map: %s filter '%.*s'", known ? "unsupported" : "no",
                            (int)a->pos[0].u.s.len, a->pos[0].u.s.ptr);
        fargs.n_pos = a->n_pos - 1;
        fargs.pos = a->pos + 1;
        fargs.n_kw = a->n_kw;
        fargs.kw = a->kw;
        fargs.kw_names = a->kw_names;
    }
    if (!items_of(r, at, v, &items, &n)) return false;
    struct tpl_list *l = tpl_list_new(r, at, n);
    if (!l) return false;
    for (size_t i = 0; i < n; i++) {
        if (!tpl_step(r, at)) return false;
        if (have_attr) {
            if (!get_path(r, at, items[i], attr, &l->items[i])) return false;
            if (have_default && l->items[i].type == TPL_UNDEFINED) l->items[i] = deflt;
        } else if (!tpl_apply_filter(r, at, filter, items[i], &fargs, &l->items[i])) {
            return false;
        }
    }
    *out = list_value(l, false);
    return true;
}

static bool do_sortlike(struct tpl_render *r, const struct tpl_node *at, int id, struct tpl_value v,
                        const struct tpl_args *a, struct tpl_value *out) {
    /* sort(reverse, case_sensitive, attribute); unique / min / max(case_sensitive, attribute);
       dictsort(case_sensitive, by, reverse) */
    static const char *const sort_names[] = {"reverse", "case_sensitive", "attribute"};
    static const char *const uniq_names[] = {"case_sensitive", "attribute"};
    static const char *const dsort_names[] = {"case_sensitive", "by", "reverse"};
    struct tpl_value p[3];
    bool given[3] = {false};
    bool reverse = false, case_sensitive;
    struct tpl_value attr = tpl_none();
    if (id == F_SORT) {
        if (!bind_args(r, at, "sort", a, sort_names, 3, p, given)) return false;
        reverse = tpl_truthy(p[0]);
        case_sensitive = tpl_truthy(p[1]);
        attr = p[2];
    } else if (id == F_DICTSORT) {
        if (!bind_args(r, at, "dictsort", a, dsort_names, 3, p, given)) return false;
        case_sensitive = tpl_truthy(p[0]);
        reverse = tpl_truthy(p[2]);
        if (v.type != TPL_DICT) return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "dictsort: expected a mapping");
        bool by_value = given[1] && p[1].type == TPL_STR && tpl_str_eqc(p[1].u.s, "value");
        if (given[1] && !by_value && !(p[1].type == TPL_STR && tpl_str_eqc(p[1].u.s, "key")))
            return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "dictsort: 'by' must be 'key' or 'value'");
        size_t n = v.u.dict->len;
        struct tpl_value *keys = tpl_alloc(r, at, (n + 1) * sizeof *keys);
        size_t *idx = tpl_alloc(r, at, (n + 1) * sizeof *idx);
        struct tpl_list *l = tpl_list_new(r, at, n);
        if (!keys || !idx || !l) return false;
        for (size_t i = 0; i < n; i++) {
            idx[i] = i;
            if (!fold_key(r, at, by_value ? v.u.dict->vals[i] : v.u.dict->keys[i], case_sensitive, &keys[i])) return false;
        }
        if (!sort_indices(r, at, keys, idx, n, reverse)) return false;
        for (size_t i = 0; i < n; i++)
            if (!make_pair(r, at, v.u.dict->keys[idx[i]], v.u.dict->vals[idx[i]], &l->items[i])) return false;
        *out = list_value(l, false);
        return true;
    } else {
        if (!bind_args(r, at, tpl_filter_name(id), a, uniq_names, 2, p, given)) return false;
        case_sensitive = tpl_truthy(p[0]);
        attr = p[1];
    }
    const struct tpl_value *items;
    size_t n;
    if (!items_of(r, at, v, &items, &n)) return false;
    struct tpl_value *keys = tpl_alloc(r, at, (n + 1) * sizeof *keys);
    size_t *idx = tpl_alloc(r, at, (n + 1) * sizeof *idx);
    if (!keys || !idx) return false;
    for (size_t i = 0; i < n; i++) {
        struct tpl_value k = items[i];
        if (attr.type != TPL_NONE && !get_path(r, at, k, attr, &k)) return false;
        if (!fold_key(r, at, k, case_sensitive, &keys[i])) return false;
        idx[i] = i;
    }
    if (id == F_SORT) {
        if (!sort_indices(r, at, keys, idx, n, reverse)) return false;
        struct tpl_list *l = tpl_list_new(r, at, n);
        if (!l) return false;
        for (size_t i = 0; i < n; i++) l->items[i] = items[idx[i]];
        *out = list_value(l, false);
        return true;
    }
    if (id == F_UNIQUE) {
        struct tpl_list *l = tpl_list_new(r, at, n);
        if (!l) return false;
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            bool seen = false;
            for (size_t j = 0; j < i && !seen; j++) seen = tpl_equal(keys[j], keys[i]);
            if (!seen) l->items[k++] = items[i];
            if (!tpl_step(r, at)) return false;
        }
        l->len = k;
        *out = list_value(l, false);
        return true;
    }
    /* min / max */
    if (n == 0) {
        *out = tpl_undefined_fmt(r, "no aggregated item, sequence was empty");
        return true;
    }
    size_t best = 0;
    for (size_t i = 1; i < n; i++) {
        int c;
        if (!tpl_compare(r, at, keys[i], keys[best], &c)) return false;
        if (id == F_MIN ? c < 0 : c > 0) best = i;
    }
    *out = items[best];
    return true;
}

bool tpl_apply_filter(struct tpl_render *r, const struct tpl_node *at, int id, struct tpl_value v,
                      const struct tpl_args *a, struct tpl_value *out) {
    struct tpl_value p[4];
    bool given[4] = {false};
    struct tpl_str s;
    const struct tpl_value *items = NULL;
    size_t n = 0;
    int64_t iv = 0;
    const char *fname = tpl_filter_name(id);
    switch ((enum filter_id)id) {
    case F_ABS:
        if (!bind_args(r, at, fname, a, NULL, 0, p, given)) return false;
        if (v.type == TPL_FLOAT) { *out = tpl_float(fabs(v.u.f)); return true; }
        if (!need_int(r, at, "abs", v, &iv)) return false;
        if (iv == INT64_MIN) return tpl_fail(r, at, LLMOPT_ERR_UNSUPPORTED, "integer overflow");
        *out = tpl_int(iv < 0 ? -iv : iv);
        return true;
    case F_ATTR: {
        static const char *const names[] = {"name"};
        if (!bind_args(r, at, fname, a, names, 1, p, given)) return false;
        if (!need_str(r, at, "attr", p[0])) return false;
        if (v.type == TPL_UNDEFINED) return tpl_fail_undefined(r, at, v);
        if (v.type == TPL_NAMESPACE) {
            struct tpl_value *x = tpl_dict_get_str(v.u.dict, p[0].u.s);
            if (x) { *out = *x; return true; }
        } else if (tpl_builtin_attr(r, at, v, p[0].u.s, out)) {
            return !r->status;
        }
        *out = tpl_undefined_fmt(r, "'%s object' has no attribute '%.*s'", tpl_type_name(v.type), (int)p[0].u.s.len, p[0].u.s.ptr);
        return !r->status;
    }
    case F_BATCH: {
        static const char *const names[] = {"linecount", "fill_with"};
        if (!bind_args(r, at, fname, a, names, 2, p, given)) return false;
        if (!need_int(r, at, "batch", p[0], &iv)) return false;
        if (iv <= 0) return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "batch: linecount must be positive");
        if (!items_of(r, at, v, &items, &n)) return false;
        size_t per = (size_t)iv, groups = (n + per - 1) / per;
        struct tpl_list *l = tpl_list_new(r, at, groups);
        if (!l) return false;
        for (size_t g = 0; g < groups; g++) {
            size_t cnt = n - g * per < per ? n - g * per : per;
            size_t len = given[1] ? per : cnt;
            struct tpl_list *row = tpl_list_new(r, at, len);
            if (!row) return false;
            for (size_t i = 0; i < len; i++) row->items[i] = i < cnt ? items[g * per + i] : p[1];
            l->items[g] = list_value(row, false);
        }
        *out = list_value(l, false);
        return true;
    }
    case F_CAPITALIZE:
    case F_LOWER:
    case F_UPPER:
    case F_TITLE:
        if (!bind_args(r, at, fname, a, NULL, 0, p, given) || !str_of(r, at, v, &s)) return false;
        return case_map(r, at, s,
                        id == F_CAPITALIZE ? CASE_CAPITALIZE : id == F_LOWER ? CASE_LOWER : id == F_UPPER ? CASE_UPPER : CASE_TITLE_JINJA,
                        out);
    case F_CENTER: {
        static const char *const names[] = {"width"};
        if (!bind_args(r, at, fname, a, names, 1, p, given) || !str_of(r, at, v, &s)) return false;
        iv = 80;
        if (given[0] && !need_int(r, at, "center", p[0], &iv)) return false;
        struct tpl_value self = tpl_strv(s);
        struct tpl_args ca = {.n_pos = 1, .pos = &p[0]};
        p[0] = tpl_int(iv);
        struct tpl_func f = {.id = B_STR_CENTER, .self = self};
        return tpl_call_builtin(r, at, &f, &ca, out);
    }
    case F_COUNT:
        if (!bind_args(r, at, fname, a, NULL, 0, p, given) || !length_of(r, at, v, &iv)) return false;
        *out = tpl_int(iv);
        return true;
    case F_DEFAULT: {
        static const char *const names[] = {"default_value", "boolean"};
        if (!bind_args(r, at, fname, a, names, 2, p, given)) return false;
        if (!given[0]) p[0] = tpl_strv(TPL_STR_LIT(""));
        bool use_default = v.type == TPL_UNDEFINED || (tpl_truthy(p[1]) && !tpl_truthy(v));
        *out = use_default ? p[0] : v;
        return true;
    }
    case F_DICTSORT:
    case F_SORT:
    case F_UNIQUE:
    case F_MIN:
    case F_MAX: return do_sortlike(r, at, id, v, a, out);
    case F_ESCAPE:
    case F_FORCEESCAPE: {
        if (!bind_args(r, at, fname, a, NULL, 0, p, given)) return false;
        if (id == F_ESCAPE && v.type == TPL_STR && (v.flags & TPL_F_MARKUP)) {
            *out = v;
            return true;
        }
        if (!str_of(r, at, v, &s)) return false;
        struct tpl_value esc, empty_markup = tpl_strv((struct tpl_str){"", 0});
        empty_markup.flags = TPL_F_MARKUP;
        if (!tpl_binop(r, at, OP_ADD, empty_markup, tpl_strv(s), &esc)) return false; /* Markup("") + s escapes s */
        *out = esc;
        out->flags = TPL_F_MARKUP;
        return true;
    }
    case F_FIRST:
    case F_LAST:
        if (!bind_args(r, at, fname, a, NULL, 0, p, given) || !items_of(r, at, v, &items, &n)) return false;
        if (n == 0) {
            *out = tpl_undefined_fmt(r, "no %s item, sequence was empty", id == F_FIRST ? "first" : "last");
            return true;
        }
        *out = items[id == F_FIRST ? 0 : n - 1];
        return true;
    case F_FLOAT: {
        static const char *const names[] = {"default"};
        if (!bind_args(r, at, fname, a, names, 1, p, given)) return false;
        double d;
        if (v.type == TPL_FLOAT) *out = v;
        else if (v.type == TPL_INT || v.type == TPL_BOOL) *out = tpl_float(tpl_as_double(v));
        else if (v.type == TPL_STR && parse_py_float(v.u.s, &d)) *out = tpl_float(d);
        else if (v.type == TPL_UNDEFINED) return tpl_fail_undefined(r, at, v);
        else *out = given[0] ? p[0] : tpl_float(0.0);
        return true;
    }
    case F_FORMAT: {
        if (!str_of(r, at, v, &s)) return false;
        if (a->n_kw && a->n_pos) return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "format: can't handle positional and keyword arguments at the same time");
        struct tpl_value args;
        if (a->n_kw) {
            struct tpl_dict *d = tpl_dict_new(r, at, a->n_kw);
            if (!d) return false;
            for (size_t k = 0; k < a->n_kw; k++)
                if (!tpl_dict_set(r, at, d, tpl_strv(a->kw_names[k]), a->kw[k])) return false;
            args = (struct tpl_value){.type = TPL_DICT};
            args.u.dict = d;
        } else if (!make_list(r, at, a->pos, a->n_pos, true, &args)) {
            return false;
        }
        return tpl_percent_format(r, at, s, args, out);
    }
    case F_INDENT: return do_indent(r, at, v, a, out);
    case F_INT: {
        static const char *const names[] = {"default", "base"};
        if (!bind_args(r, at, fname, a, names, 2, p, given)) return false;
        int64_t base = 10;
        if (given[1] && !need_int(r, at, "int", p[1], &base)) return false;
        double d;
        if (v.type == TPL_INT) *out = v;
        else if (v.type == TPL_BOOL) *out = tpl_int(v.u.b);
        else if (v.type == TPL_FLOAT) {
            if (!isfinite(v.u.f) || fabs(v.u.f) >= 9.2e18) *out = given[0] ? p[0] : tpl_int(0);
            else *out = tpl_int((int64_t)v.u.f);
        } else if (v.type == TPL_STR && parse_py_int(v.u.s, base, &iv)) *out = tpl_int(iv);
        else if (v.type == TPL_STR && parse_py_float(v.u.s, &d) && isfinite(d) && fabs(d) < 9.2e18) *out = tpl_int((int64_t)d);
        else if (v.type == TPL_UNDEFINED) return tpl_fail_undefined(r, at, v);
        else *out = given[0] ? p[0] : tpl_int(0);
        return true;
    }
    case F_ITEMS:
        if (!bind_args(r, at, fname, a, NULL, 0, p, given)) return false;
        if (v.type == TPL_UNDEFINED) return make_list(r, at, NULL, 0, false, out);
        if (v.type != TPL_DICT) return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "items: can only get item pairs from a mapping");
        {
            struct tpl_func f = {.id = B_DICT_ITEMS, .self = v};
            struct tpl_args none = {0};
            return tpl_call_builtin(r, at, &f, &none, out);
        }
    case F_JOIN: {
        static const char *const names[] = {"d", "attribute"};
        if (!bind_args(r, at, fname, a, names, 2, p, given) || !items_of(r, at, v, &items, &n)) return false;
        struct tpl_str sep = {"", 0};
        if (given[0] && !str_of(r, at, p[0], &sep)) return false;
        struct tpl_buf b = {.limit = r->lim.max_output};
        bool ok = true;
        for (size_t i = 0; i < n && ok; i++) {
            struct tpl_value x = items[i];
            if (given[1] && p[1].type != TPL_NONE && !get_path(r, at, x, p[1], &x)) {
                tpl_buf_free(&b);
                return false;
            }
            ok = (i == 0 || tpl_buf_put(&b, sep.ptr, sep.len)) && tpl_write_str(&b, x);
        }
        return buf_result(r, at, &b, ok, "join", out);
    }
    case F_LIST:
        if (!bind_args(r, at, fname, a, NULL, 0, p, given) || !items_of(r, at, v, &items, &n)) return false;
        return make_list(r, at, items, n, false, out);
    case F_MAP: return do_map(r, at, v, a, out);
    case F_REJECT:
    case F_REJECTATTR:
    case F_SELECT:
    case F_SELECTATTR: return select_items(r, at, id, v, a, out);
    case F_REPLACE: {
        static const char *const names[] = {"old", "new", "count"};
        if (!bind_args(r, at, fname, a, names, 3, p, given) || !str_of(r, at, v, &s)) return false;
        if (!given[0] || !given[1]) return filter_fail_args(r, at, id);
        struct tpl_str olds, news;
        if (!str_of(r, at, p[0], &olds) || !str_of(r, at, p[1], &news)) return false;
        iv = -1;
        if (given[2] && p[2].type != TPL_NONE && !need_int(r, at, "replace", p[2], &iv)) return false;
        return str_replace(r, at, s, olds, news, iv, out);
    }
    case F_REVERSE:
        if (!bind_args(r, at, fname, a, NULL, 0, p, given)) return false;
        if (v.type == TPL_STR) {
            char *buf = tpl_alloc(r, at, v.u.s.len + 1);
            if (!buf) return false;
            size_t len = v.u.s.len;
            for (size_t i = 0; i < v.u.s.len;) {
                size_t st = i;
                tpl_utf8_next(v.u.s.ptr, v.u.s.len, &i);
                memcpy(buf + len - i, v.u.s.ptr + st, i - st);
            }
            *out = tpl_strv((struct tpl_str){buf, v.u.s.len});
            return true;
        }
        if (!items_of(r, at, v, &items, &n)) return false;
        {
            struct tpl_list *l = tpl_list_new(r, at, n);
            if (!l) return false;
            for (size_t i = 0; i < n; i++) l->items[i] = items[n - 1 - i];
            *out = list_value(l, false);
        }
        return true;
    case F_ROUND: {
        static const char *const names[] = {"precision", "method"};
        if (!bind_args(r, at, fname, a, names, 2, p, given)) return false;
        int64_t prec = 0;
        if (given[0] && !need_int(r, at, "round", p[0], &prec)) return false;
        if (prec < -30 || prec > 30) return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "round: precision out of range");
        struct tpl_str method = TPL_STR_LIT("common");
        if (given[1]) {
            if (!need_str(r, at, "round", p[1])) return false;
            method = p[1].u.s;
        }
        if (!tpl_is_number(v)) {
            if (v.type == TPL_UNDEFINED) return tpl_fail_undefined(r, at, v);
            return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "round: expected a number, got %s", tpl_type_name(v.type));
        }
        double x = tpl_as_double(v), scale = pow(10.0, (double)prec);
        if (tpl_str_eqc(method, "common")) {
            if (v.type != TPL_FLOAT) { *out = v.type == TPL_BOOL ? tpl_int(v.u.b) : v; return true; }
            if (prec >= 0 && isfinite(x)) {
                char buf[400];
                snprintf(buf, sizeof buf, "%.*f", (int)prec, x); /* correctly rounded, ties to even */
                *out = tpl_float(strtod(buf, NULL));
            } else {
                *out = tpl_float(nearbyint(x * scale) / scale);
            }
            return true;
        }
        if (tpl_str_eqc(method, "floor")) *out = tpl_float(floor(x * scale) / scale);
        else if (tpl_str_eqc(method, "ceil")) *out = tpl_float(ceil(x * scale) / scale);
        else return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "round: method must be 'common', 'ceil' or 'floor'");
        return true;
    }
    case F_SAFE:
    case F_STRING:
        if (!bind_args(r, at, fname, a, NULL, 0, p, given)) return false;
        if (v.type == TPL_STR) {
            *out = v;
        } else if (!tpl_to_str(r, at, v, out)) {
            return false;
        }
        if (id == F_SAFE) out->flags = TPL_F_MARKUP;
        return true;
    case F_SUM: {
        static const char *const names[] = {"attribute", "start"};
        if (!bind_args(r, at, fname, a, names, 2, p, given) || !items_of(r, at, v, &items, &n)) return false;
        struct tpl_value acc = given[1] ? p[1] : tpl_int(0);
        for (size_t i = 0; i < n; i++) {
            struct tpl_value x = items[i];
            if (given[0] && p[0].type != TPL_NONE && !get_path(r, at, x, p[0], &x)) return false;
            if (!tpl_binop(r, at, OP_ADD, acc, x, &acc)) return false;
        }
        *out = acc;
        return true;
    }
    case F_TOJSON: return do_tojson(r, at, v, a, out);
    case F_TRIM: {
        static const char *const names[] = {"chars"};
        if (!bind_args(r, at, fname, a, names, 1, p, given) || !str_of(r, at, v, &s)) return false;
        if (given[0] && p[0].type != TPL_NONE) {
            if (!need_str(r, at, "trim", p[0])) return false;
            *out = tpl_strv(tpl_strip(s, &p[0].u.s, 3));
        } else {
            *out = tpl_strv(tpl_strip(s, NULL, 3));
        }
        return true;
    }
    case F_WORDCOUNT: {
        if (!bind_args(r, at, fname, a, NULL, 0, p, given) || !str_of(r, at, v, &s)) return false;
        int64_t words = 0;
        bool in_word = false;
        for (size_t i = 0; i < s.len;) {
            uint32_t c = tpl_utf8_next(s.ptr, s.len, &i);
            bool w = c == '_' || cp_digit(c) || cp_alpha(c);
            if (w && !in_word) words++;
            in_word = w;
        }
        *out = tpl_int(words);
        return true;
    }
    case F_COUNT_: break;
    }
    return tpl_fail(r, at, LLMOPT_ERR_UNSUPPORTED, "unknown filter id %d", id);
}

/* ---- tests --------------------------------------------------------------------------- */

bool tpl_apply_test(struct tpl_render *r, const struct tpl_node *at, int id, struct tpl_value v,
                    const struct tpl_args *a, bool *out) {
    struct tpl_value p[1];
    bool given[1] = {false};
    static const char *const one[] = {"other"};
    int c = 0;
    int64_t iv = 0, d = 0;
    switch ((enum test_id)id) {
    case T_BOOLEAN: *out = v.type == TPL_BOOL; return true;
    case T_CALLABLE: *out = v.type == TPL_MACRO || v.type == TPL_FUNC; return true;
    case T_DEFINED: *out = v.type != TPL_UNDEFINED; return true;
    case T_UNDEFINED: *out = v.type == TPL_UNDEFINED; return true;
    case T_ESCAPED: *out = v.type == TPL_STR && (v.flags & TPL_F_MARKUP); return true;
    case T_FALSE: *out = v.type == TPL_BOOL && !v.u.b; return true;
    case T_TRUE: *out = v.type == TPL_BOOL && v.u.b; return true;
    case T_FLOAT: *out = v.type == TPL_FLOAT; return true;
    case T_INTEGER: *out = v.type == TPL_INT; return true;
    case T_NUMBER: *out = tpl_is_number(v); return true;
    case T_NONE: *out = v.type == TPL_NONE; return true;
    case T_STRING: *out = v.type == TPL_STR; return true;
    case T_MAPPING: *out = v.type == TPL_DICT; return true;
    case T_ITERABLE:
        *out = v.type == TPL_STR || v.type == TPL_LIST || v.type == TPL_DICT || v.type == TPL_UNDEFINED || v.type == TPL_LOOP;
        return true;
    case T_SEQUENCE: *out = v.type == TPL_STR || v.type == TPL_LIST || v.type == TPL_DICT || v.type == TPL_UNDEFINED; return true;
    case T_LOWER:
    case T_UPPER: {
        struct tpl_str s;
        if (!str_of(r, at, v, &s)) return false;
        bool any_cased = false, ok = true;
        for (size_t i = 0; i < s.len && ok;) {
            uint32_t ch = tpl_utf8_next(s.ptr, s.len, &i);
            if (!cp_cased(ch)) continue;
            any_cased = true;
            ok = id == T_LOWER ? cp_lower(ch) == ch : cp_upper(ch) == ch;
        }
        *out = ok && any_cased;
        return true;
    }
    case T_EVEN:
    case T_ODD:
        if (!need_int(r, at, id == T_EVEN ? "even" : "odd", v, &iv)) return false;
        *out = (iv % 2 == 0) == (id == T_EVEN);
        return true;
    case T_DIVISIBLEBY:
        if (!bind_args(r, at, "divisibleby", a, (const char *const[]){"num"}, 1, p, given)) return false;
        if (!need_int(r, at, "divisibleby", v, &iv) || !need_int(r, at, "divisibleby", p[0], &d)) return false;
        if (d == 0) return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "divisibleby: division by zero");
        *out = d == -1 || iv % d == 0;
        return true;
    case T_EQ:
    case T_NE:
        if (!bind_args(r, at, tpl_test_name(id), a, one, 1, p, given)) return false;
        *out = tpl_equal(v, p[0]) == (id == T_EQ);
        return true;
    case T_GE:
    case T_GT:
    case T_LE:
    case T_LT:
        if (!bind_args(r, at, tpl_test_name(id), a, one, 1, p, given)) return false;
        if (!tpl_compare(r, at, v, p[0], &c)) return false;
        *out = id == T_GE ? c >= 0 : id == T_GT ? c > 0 : id == T_LE ? c <= 0 : c < 0;
        return true;
    case T_IN: {
        if (!bind_args(r, at, "in", a, (const char *const[]){"seq"}, 1, p, given)) return false;
        struct tpl_value seq = p[0];
        if (seq.type == TPL_STR) {
            if (v.type != TPL_STR) return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "'in <string>' requires string as left operand");
            *out = str_find(seq.u.s, v.u.s, 0) >= 0;
            return true;
        }
        if (seq.type == TPL_DICT) {
            *out = tpl_dict_get(seq.u.dict, v) != NULL;
            return true;
        }
        const struct tpl_value *items;
        size_t n;
        if (!tpl_iterate(r, at, seq, &items, &n)) return false;
        *out = false;
        for (size_t i = 0; i < n && !*out; i++) *out = tpl_equal(items[i], v);
        return true;
    }
    case T_SAMEAS:
        if (!bind_args(r, at, "sameas", a, one, 1, p, given)) return false;
        if (v.type != p[0].type) *out = false;
        else if (v.type == TPL_NONE || v.type == TPL_UNDEFINED) *out = v.type == TPL_NONE;
        else if (v.type == TPL_BOOL || v.type == TPL_INT || v.type == TPL_FLOAT) *out = tpl_equal(v, p[0]);
        else if (v.type == TPL_STR) *out = v.u.s.ptr == p[0].u.s.ptr && v.u.s.len == p[0].u.s.len;
        else *out = v.u.list == p[0].u.list;
        return true;
    case T_FILTER:
    case T_TEST: {
        bool known;
        if (v.type != TPL_STR) { *out = false; return true; }
        *out = (id == T_FILTER ? tpl_filter_lookup(v.u.s, &known) : tpl_test_lookup(v.u.s, &known)) >= 0;
        return true;
    }
    case T_COUNT_: break;
    }
    return tpl_fail(r, at, LLMOPT_ERR_UNSUPPORTED, "unknown test id %d", id);
}

/* ---- callables ------------------------------------------------------------------------ */

static bool str_pad(struct tpl_render *r, const struct tpl_node *at, struct tpl_str s, int64_t width,
                    struct tpl_str fill, int how, struct tpl_value *out) {
    /* how: 0 center, 1 ljust, 2 rjust */
    size_t len = tpl_utf8_count(s);
    if (width <= (int64_t)len) {
        *out = tpl_strv(s);
        return true;
    }
    if (width > (int64_t)r->lim.max_output) return tpl_fail(r, at, LLMOPT_ERR_LIMIT, "padding width too large");
    size_t marg = (size_t)width - len, left;
    if (how == 0) left = marg / 2 + (marg & (size_t)width & 1);
    else if (how == 1) left = 0;
    else left = marg;
    char *buf = tpl_alloc(r, at, s.len + marg * fill.len + 1);
    if (!buf) return false;
    size_t n = 0;
    for (size_t i = 0; i < left; i++, n += fill.len) memcpy(buf + n, fill.ptr, fill.len);
    memcpy(buf + n, s.ptr, s.len);
    n += s.len;
    for (size_t i = left; i < marg; i++, n += fill.len) memcpy(buf + n, fill.ptr, fill.len);
    *out = tpl_strv((struct tpl_str){buf, n});
    return true;
}

/* startswith / endswith with a string or a tuple of strings. */
static bool str_affix(struct tpl_render *r, const struct tpl_node *at, struct tpl_str s, struct tpl_value affix,
                      bool suffix, bool *out) {
    const struct tpl_value *items = &affix;
    size_t n = 1;
    if (affix.type == TPL_LIST && (affix.flags & TPL_F_TUPLE)) {
        items = affix.u.list->items;
        n = affix.u.list->len;
    }
    *out = false;
    for (size_t i = 0; i < n; i++) {
        if (items[i].type != TPL_STR) {
            if (items[i].type == TPL_UNDEFINED) return tpl_fail_undefined(r, at, items[i]);
            return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "%s first arg must be str or a tuple of str, not %s",
                            suffix ? "endswith" : "startswith", tpl_type_name(items[i].type));
        }
        struct tpl_str x = items[i].u.s;
        if (x.len <= s.len && memcmp(suffix ? s.ptr + s.len - x.len : s.ptr, x.ptr, x.len) == 0) *out = true;
    }
    return true;
}

static int64_t cp_index_of(struct tpl_str s, int64_t byte_off) {
    return byte_off < 0 ? -1 : (int64_t)tpl_utf8_count((struct tpl_str){s.ptr, (size_t)byte_off});
}

static bool call_str_method(struct tpl_render *r, const struct tpl_node *at, int id, struct tpl_str s,
                            const struct tpl_args *a, struct tpl_value *out) {
    struct tpl_value p[3];
    bool given[3] = {false};
    int64_t iv = 0;
    static const char *const no_names[] = {NULL};
    switch (id) {
    case B_STR_STARTSWITH:
    case B_STR_ENDSWITH: {
        static const char *const names[] = {"prefix"};
        bool res;
        if (!bind_args(r, at, id == B_STR_STARTSWITH ? "startswith" : "endswith", a, names, 1, p, given)) return false;
        if (!given[0]) return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "startswith/endswith takes one argument");
        if (!str_affix(r, at, s, p[0], id == B_STR_ENDSWITH, &res)) return false;
        *out = tpl_bool(res);
        return true;
    }
    case B_STR_STRIP:
    case B_STR_LSTRIP:
    case B_STR_RSTRIP: {
        static const char *const names[] = {"chars"};
        if (!bind_args(r, at, "strip", a, names, 1, p, given)) return false;
        int which = id == B_STR_STRIP ? 3 : id == B_STR_LSTRIP ? 1 : 2;
        if (given[0] && p[0].type != TPL_NONE) {
            if (!need_str(r, at, "strip", p[0])) return false;
            *out = tpl_strv(tpl_strip(s, &p[0].u.s, which));
        } else {
            *out = tpl_strv(tpl_strip(s, NULL, which));
        }
        return true;
    }
    case B_STR_SPLIT:
    case B_STR_RSPLIT: {
        static const char *const names[] = {"sep", "maxsplit"};
        if (!bind_args(r, at, "split", a, names, 2, p, given)) return false;
        iv = -1;
        if (given[1] && !need_int(r, at, "split", p[1], &iv)) return false;
        if (given[0] && p[0].type != TPL_NONE) {
            if (!need_str(r, at, "split", p[0])) return false;
            return str_split(r, at, s, &p[0].u.s, iv, id == B_STR_RSPLIT, out);
        }
        return str_split(r, at, s, NULL, iv, id == B_STR_RSPLIT, out);
    }
    case B_STR_SPLITLINES: {
        static const char *const names[] = {"keepends"};
        if (!bind_args(r, at, "splitlines", a, names, 1, p, given)) return false;
        return str_splitlines(r, at, s, tpl_truthy(p[0]), out);
    }
    case B_STR_REPLACE: {
        static const char *const names[] = {"old", "new", "count"};
        if (!bind_args(r, at, "replace", a, names, 3, p, given)) return false;
        if (!given[0] || !given[1] || !need_str(r, at, "replace", p[0]) || !need_str(r, at, "replace", p[1]))
            return given[0] && given[1] ? false : tpl_fail(r, at, LLMOPT_ERR_FORMAT, "replace takes at least 2 arguments");
        iv = -1;
        if (given[2] && !need_int(r, at, "replace", p[2], &iv)) return false;
        return str_replace(r, at, s, p[0].u.s, p[1].u.s, iv, out);
    }
    case B_STR_UPPER:
    case B_STR_LOWER:
    case B_STR_TITLE:
    case B_STR_CAPITALIZE:
    case B_STR_SWAPCASE:
        if (!bind_args(r, at, "str method", a, no_names, 0, p, given)) return false;
        return case_map(r, at, s,
                        id == B_STR_UPPER ? CASE_UPPER : id == B_STR_LOWER ? CASE_LOWER : id == B_STR_TITLE ? CASE_TITLE_PY
                        : id == B_STR_CAPITALIZE ? CASE_CAPITALIZE : CASE_SWAP,
                        out);
    case B_STR_FIND:
    case B_STR_RFIND:
    case B_STR_INDEX:
    case B_STR_RINDEX:
    case B_STR_COUNT: {
        static const char *const names[] = {"sub"};
        if (!bind_args(r, at, "find", a, names, 1, p, given)) return false;
        if (!given[0] || !need_str(r, at, "find", p[0])) return given[0] ? false : tpl_fail(r, at, LLMOPT_ERR_FORMAT, "find takes one argument");
        if (id == B_STR_COUNT) {
            int64_t cnt = 0;
            if (p[0].u.s.len == 0) {
                cnt = (int64_t)tpl_utf8_count(s) + 1;
            } else {
                size_t pos = 0;
                int64_t f;
                while ((f = str_find(s, p[0].u.s, pos)) >= 0) {
                    cnt++;
                    pos = (size_t)f + p[0].u.s.len;
                }
            }
            *out = tpl_int(cnt);
            return true;
        }
        int64_t f = id == B_STR_FIND || id == B_STR_INDEX ? str_find(s, p[0].u.s, 0) : str_rfind(s, p[0].u.s);
        if (f < 0 && (id == B_STR_INDEX || id == B_STR_RINDEX)) return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "substring not found");
        *out = tpl_int(cp_index_of(s, f));
        return true;
    }
    case B_STR_JOIN: {
        static const char *const names[] = {"iterable"};
        const struct tpl_value *items;
        size_t n;
        if (!bind_args(r, at, "join", a, names, 1, p, given) || !tpl_iterate(r, at, p[0], &items, &n)) return false;
        struct tpl_buf b = {.limit = r->lim.max_output};
        bool ok = true;
        for (size_t i = 0; i < n && ok; i++) {
            if (items[i].type != TPL_STR) {
                tpl_buf_free(&b);
                return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "sequence item %zu: expected str instance, %s found", i,
                                tpl_type_name(items[i].type));
            }
            ok = (i == 0 || tpl_buf_put(&b, s.ptr, s.len)) && tpl_buf_put(&b, items[i].u.s.ptr, items[i].u.s.len);
        }
        return buf_result(r, at, &b, ok, "join", out);
    }
    case B_STR_FORMAT: return str_format(r, at, s, a, out);
    case B_STR_ISDIGIT:
    case B_STR_ISALPHA:
    case B_STR_ISALNUM:
    case B_STR_ISSPACE:
    case B_STR_ISLOWER:
    case B_STR_ISUPPER: {
        if (!bind_args(r, at, "str method", a, no_names, 0, p, given)) return false;
        bool ok = s.len > 0, any_cased = false;
        for (size_t i = 0; i < s.len && ok;) {
            uint32_t c = tpl_utf8_next(s.ptr, s.len, &i);
            switch (id) {
            case B_STR_ISDIGIT: ok = cp_digit(c); break;
            case B_STR_ISALPHA: ok = cp_alpha(c); break;
            case B_STR_ISALNUM: ok = cp_alpha(c) || cp_digit(c); break;
            case B_STR_ISSPACE: ok = tpl_is_space(c); break;
            default:
                if (cp_cased(c)) {
                    any_cased = true;
                    ok = id == B_STR_ISLOWER ? cp_lower(c) == c : cp_upper(c) == c;
                }
            }
        }
        if (id == B_STR_ISLOWER || id == B_STR_ISUPPER) ok = ok && any_cased;
        *out = tpl_bool(ok);
        return true;
    }
    case B_STR_PARTITION:
    case B_STR_RPARTITION: {
        static const char *const names[] = {"sep"};
        if (!bind_args(r, at, "partition", a, names, 1, p, given)) return false;
        if (!given[0] || !need_str(r, at, "partition", p[0])) return given[0] ? false : tpl_fail(r, at, LLMOPT_ERR_FORMAT, "partition takes one argument");
        if (p[0].u.s.len == 0) return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "partition: empty separator");
        int64_t f = id == B_STR_PARTITION ? str_find(s, p[0].u.s, 0) : str_rfind(s, p[0].u.s);
        struct tpl_value parts[3];
        struct tpl_str empty = {"", 0};
        if (f < 0) {
            parts[0] = tpl_strv(id == B_STR_PARTITION ? s : empty);
            parts[1] = tpl_strv(empty);
            parts[2] = tpl_strv(id == B_STR_PARTITION ? empty : s);
        } else {
            parts[0] = tpl_strv((struct tpl_str){s.ptr, (size_t)f});
            parts[1] = p[0];
            parts[2] = tpl_strv((struct tpl_str){s.ptr + f + p[0].u.s.len, s.len - (size_t)f - p[0].u.s.len});
        }
        return make_list(r, at, parts, 3, true, out);
    }
    case B_STR_CENTER:
    case B_STR_LJUST:
    case B_STR_RJUST:
    case B_STR_ZFILL: {
        static const char *const names[] = {"width", "fillchar"};
        if (!bind_args(r, at, "str method", a, names, id == B_STR_ZFILL ? 1 : 2, p, given)) return false;
        if (!given[0] || !need_int(r, at, "padding", p[0], &iv)) return given[0] ? false : tpl_fail(r, at, LLMOPT_ERR_FORMAT, "missing width");
        struct tpl_str fill = TPL_STR_LIT(" ");
        if (given[1]) {
            if (!need_str(r, at, "padding", p[1])) return false;
            if (tpl_utf8_count(p[1].u.s) != 1)
                return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "the fill character must be exactly one character long");
            fill = p[1].u.s;
        }
        if (id == B_STR_ZFILL) {
            bool sign = s.len && (s.ptr[0] == '-' || s.ptr[0] == '+');
            struct tpl_value padded;
            if (!str_pad(r, at, (struct tpl_str){s.ptr + sign, s.len - sign}, iv - sign, TPL_STR_LIT("0"), 2, &padded)) return false;
            if (!sign) { *out = padded; return true; }
            return tpl_binop(r, at, OP_ADD, tpl_strv((struct tpl_str){s.ptr, 1}), padded, out);
        }
        return str_pad(r, at, s, iv, fill, id == B_STR_CENTER ? 0 : id == B_STR_LJUST ? 1 : 2, out);
    }
    default: break;
    }
    return tpl_fail(r, at, LLMOPT_ERR_UNSUPPORTED, "unknown string method");
}

static bool do_range(struct tpl_render *r, const struct tpl_node *at, const struct tpl_args *a, struct tpl_value *out) {
    int64_t v[3] = {0, 0, 1};
    if (a->n_kw || a->n_pos < 1 || a->n_pos > 3)
        return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "range expects 1 to 3 integer arguments");
    for (size_t i = 0; i < a->n_pos; i++)
        if (!need_int(r, at, "range", a->pos[i], &v[a->n_pos == 1 ? 1 : i])) return false;
    int64_t start = v[0], stop = v[1], step = v[2];
    if (step == 0) return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "range() arg 3 must not be zero");
    double count_d = step > 0 ? ((double)stop - (double)start) / (double)step : ((double)start - (double)stop) / (double)-step;
    if (count_d > TPL_MAX_RANGE)
        return tpl_fail(r, at, LLMOPT_ERR_LIMIT, "range too big: the sandbox allows at most %d items", TPL_MAX_RANGE);
    size_t count = 0;
    if (step > 0 && stop > start) count = (size_t)((stop - start - 1) / step + 1);
    if (step < 0 && start > stop) count = (size_t)((start - stop - 1) / -step + 1);
    struct tpl_list *l = tpl_list_new(r, at, count);
    if (!l) return false;
    for (size_t i = 0; i < count; i++) l->items[i] = tpl_int(start + (int64_t)i * step);
    *out = list_value(l, false);
    return true;
}

static bool do_dictlike(struct tpl_render *r, const struct tpl_node *at, const struct tpl_args *a, bool ns,
                        struct tpl_value *out) {
    struct tpl_dict *d = tpl_dict_new(r, at, a->n_kw + 4);
    if (!d) return false;
    if (a->n_pos > 1) return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "%s expects at most 1 positional argument", ns ? "namespace" : "dict");
    if (a->n_pos == 1) {
        struct tpl_value src = a->pos[0];
        if (src.type == TPL_DICT || src.type == TPL_NAMESPACE) {
            for (size_t i = 0; i < src.u.dict->len; i++)
                if (!tpl_dict_set(r, at, d, src.u.dict->keys[i], src.u.dict->vals[i])) return false;
        } else {
            const struct tpl_value *items;
            size_t n;
            if (!tpl_iterate(r, at, src, &items, &n)) return false;
            for (size_t i = 0; i < n; i++) {
                if (items[i].type != TPL_LIST || items[i].u.list->len != 2)
                    return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "dictionary update sequence element #%zu has the wrong length", i);
                if (!tpl_dict_set(r, at, d, items[i].u.list->items[0], items[i].u.list->items[1])) return false;
            }
        }
    }
    for (size_t k = 0; k < a->n_kw; k++)
        if (!tpl_dict_set(r, at, d, tpl_strv(a->kw_names[k]), a->kw[k])) return false;
    out->type = ns ? TPL_NAMESPACE : TPL_DICT;
    out->flags = 0;
    out->u.dict = d;
    return true;
}

bool tpl_call_builtin(struct tpl_render *r, const struct tpl_node *at, const struct tpl_func *f,
                      const struct tpl_args *a, struct tpl_value *out) {
    struct tpl_value p[2];
    bool given[2] = {false};
    if (f->id >= B_STR_STARTSWITH && f->id <= B_STR_ZFILL) return call_str_method(r, at, f->id, f->self.u.s, a, out);
    switch ((enum tpl_builtin)f->id) {
    case B_RANGE: return do_range(r, at, a, out);
    case B_NAMESPACE: return do_dictlike(r, at, a, true, out);
    case B_DICT: return do_dictlike(r, at, a, false, out);
    case B_RAISE_EXCEPTION: {
        static const char *const names[] = {"message"};
        if (!bind_args(r, at, "raise_exception", a, names, 1, p, given)) return false;
        struct tpl_str msg;
        if (!str_of(r, at, p[0], &msg)) return false;
        return tpl_fail(r, at, LLMOPT_ERR_INVALID_ARG, "raise_exception: %.*s", (int)(msg.len > 600 ? 600 : msg.len), msg.ptr);
    }
    case B_STRFTIME_NOW: {
        static const char *const names[] = {"format"};
        if (!bind_args(r, at, "strftime_now", a, names, 1, p, given)) return false;
        if (!given[0] || !need_str(r, at, "strftime_now", p[0])) return given[0] ? false : tpl_fail(r, at, LLMOPT_ERR_FORMAT, "strftime_now takes a format");
        if (p[0].u.s.len > 256) return tpl_fail(r, at, LLMOPT_ERR_LIMIT, "strftime_now: format too long");
        char fmt[260], buf[1024];
        memcpy(fmt, p[0].u.s.ptr, p[0].u.s.len);
        fmt[p[0].u.s.len] = 0;
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t n = fmt[0] ? strftime(buf, sizeof buf, fmt, &tm) : 0;
        return tpl_str_new(r, at, buf, n, out);
    }
    case B_DICT_ITEMS:
    case B_DICT_KEYS:
    case B_DICT_VALUES: {
        if (a->n_pos || a->n_kw) return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "dict method takes no arguments");
        const struct tpl_dict *d = f->self.u.dict;
        struct tpl_list *l = tpl_list_new(r, at, d->len);
        if (!l) return false;
        for (size_t i = 0; i < d->len; i++) {
            if (f->id == B_DICT_ITEMS) {
                if (!make_pair(r, at, d->keys[i], d->vals[i], &l->items[i])) return false;
            } else {
                l->items[i] = f->id == B_DICT_KEYS ? d->keys[i] : d->vals[i];
            }
        }
        *out = list_value(l, false);
        return true;
    }
    case B_DICT_GET: {
        static const char *const names[] = {"key", "default"};
        if (!bind_args(r, at, "get", a, names, 2, p, given)) return false;
        if (!given[0]) return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "get expected at least 1 argument");
        struct tpl_value *v = tpl_dict_get(f->self.u.dict, p[0]);
        *out = v ? *v : p[1];
        return true;
    }
    case B_LIST_INDEX:
    case B_LIST_COUNT: {
        static const char *const names[] = {"value"};
        if (!bind_args(r, at, "list method", a, names, 1, p, given)) return false;
        const struct tpl_list *l = f->self.u.list;
        int64_t cnt = 0;
        for (size_t i = 0; i < l->len; i++) {
            if (!tpl_equal(l->items[i], p[0])) continue;
            if (f->id == B_LIST_INDEX) {
                *out = tpl_int((int64_t)i);
                return true;
            }
            cnt++;
        }
        if (f->id == B_LIST_INDEX) return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "list.index(x): x not in list");
        *out = tpl_int(cnt);
        return true;
    }
    case B_UNSAFE:
        return tpl_fail(r, at, LLMOPT_ERR_UNSUPPORTED,
                        "access to attribute '%.*s' is unsafe: the sandbox transformers renders chat templates in "
                        "forbids changing lists and dicts",
                        (int)f->self.u.s.len, f->self.u.s.ptr);
    case B_LOOP_CYCLE:
        if (a->n_pos == 0) return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "no items for cycling given");
        *out = a->pos[f->self.u.loop->index0 % a->n_pos];
        return true;
    default: break;
    }
    return tpl_fail(r, at, LLMOPT_ERR_UNSUPPORTED, "unknown builtin %d", f->id);
}
