/* Template values: construction, Python's str()/repr()/==/< and json.dumps, UTF-8. */
#include "template/tpl_internal.h"

#include "base/utf8.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool tpl_str_eq(struct tpl_str a, struct tpl_str b) {
    return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, a.len) == 0);
}

bool tpl_str_eqc(struct tpl_str a, const char *c) {
    size_t n = strlen(c);
    return a.len == n && memcmp(a.ptr, c, n) == 0;
}

const char *tpl_type_name(enum tpl_type type) {
    static const char *const names[] = {
        [TPL_UNDEFINED] = "Undefined", [TPL_NONE] = "NoneType", [TPL_BOOL] = "bool",
        [TPL_INT] = "int",             [TPL_FLOAT] = "float",   [TPL_STR] = "str",
        [TPL_LIST] = "list",           [TPL_DICT] = "dict",     [TPL_NAMESPACE] = "Namespace",
        [TPL_MACRO] = "Macro",         [TPL_FUNC] = "builtin_function_or_method",
        [TPL_LOOP] = "LoopContext",
    };
    _Static_assert(sizeof names / sizeof names[0] == TPL_TYPE_COUNT, "type names");
    return (unsigned)type < TPL_TYPE_COUNT ? names[type] : "?";
}

/* ---- allocation ------------------------------------------------------------------- */

void *tpl_alloc(struct tpl_render *r, const struct tpl_node *at, size_t size) {
    if (size > r->lim.max_memory || r->arena.used_total > r->lim.max_memory - size) {
        tpl_fail(r, at, LLMOPT_ERR_LIMIT, "the template used more than %zu MiB of memory",
                 r->lim.max_memory >> 20);
        return NULL;
    }
    void *p = arena_alloc(&r->arena, size);
    if (!p) tpl_fail(r, at, LLMOPT_ERR_NOMEM, "out of memory");
    return p;
}

struct tpl_value tpl_undefined_fmt(struct tpl_render *r, const char *fmt, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if ((size_t)n >= sizeof buf) n = sizeof buf - 1;
    char *p = arena_alloc(&r->arena, (size_t)n + 1); /* small; outside the cap on purpose */
    if (!p) return tpl_undefined((struct tpl_str){"", 0});
    memcpy(p, buf, (size_t)n);
    return tpl_undefined((struct tpl_str){p, (size_t)n});
}

bool tpl_str_new(struct tpl_render *r, const struct tpl_node *at, const char *s, size_t n,
                 struct tpl_value *out) {
    char *p = tpl_alloc(r, at, n + 1);
    if (!p) return false;
    if (n) memcpy(p, s, n);
    *out = tpl_strv((struct tpl_str){p, n});
    return true;
}

struct tpl_list *tpl_list_new(struct tpl_render *r, const struct tpl_node *at, size_t len) {
    if (len > (SIZE_MAX - sizeof(struct tpl_list)) / sizeof(struct tpl_value)) {
        tpl_fail(r, at, LLMOPT_ERR_LIMIT, "list too large");
        return NULL;
    }
    struct tpl_list *l = tpl_alloc(r, at, sizeof *l + len * sizeof(struct tpl_value));
    if (l) l->len = len;
    return l;
}

struct tpl_dict *tpl_dict_new(struct tpl_render *r, const struct tpl_node *at, size_t cap) {
    struct tpl_dict *d = tpl_alloc(r, at, sizeof *d);
    if (!d) return NULL;
    if (cap < 4) cap = 4;
    d->keys = tpl_alloc(r, at, cap * sizeof *d->keys);
    d->vals = tpl_alloc(r, at, cap * sizeof *d->vals);
    if (!d->keys || !d->vals) return NULL;
    d->cap = cap;
    return d;
}

static uint64_t str_hash(struct tpl_str s) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < s.len; i++) h = (h ^ (uint8_t)s.ptr[i]) * 1099511628211ull;
    return h;
}

#define DICT_LINEAR_MAX 8

static bool dict_reindex(struct tpl_render *r, const struct tpl_node *at, struct tpl_dict *d) {
    size_t cap = 16;
    while (cap < d->len * 2 + 2) cap *= 2;
    uint32_t *index = tpl_alloc(r, at, cap * sizeof *index);
    if (!index) return false;
    for (size_t e = 0; e < d->len; e++) {
        if (d->keys[e].type != TPL_STR) continue;
        size_t h = str_hash(d->keys[e].u.s) & (cap - 1);
        while (index[h]) h = (h + 1) & (cap - 1);
        index[h] = (uint32_t)(e + 1);
    }
    d->index = index;
    d->index_cap = cap;
    return true;
}

struct tpl_value *tpl_dict_get_str(const struct tpl_dict *d, struct tpl_str key) {
    if (d->index) {
        size_t h = str_hash(key) & (d->index_cap - 1);
        while (d->index[h]) {
            size_t e = d->index[h] - 1;
            if (tpl_str_eq(d->keys[e].u.s, key)) return &d->vals[e];
            h = (h + 1) & (d->index_cap - 1);
        }
        return NULL;
    }
    for (size_t e = 0; e < d->len; e++)
        if (d->keys[e].type == TPL_STR && tpl_str_eq(d->keys[e].u.s, key)) return &d->vals[e];
    return NULL;
}

struct tpl_value *tpl_dict_get(const struct tpl_dict *d, struct tpl_value key) {
    if (key.type == TPL_STR) return tpl_dict_get_str(d, key.u.s);
    for (size_t e = 0; e < d->len; e++)
        if (tpl_equal(d->keys[e], key)) return &d->vals[e];
    return NULL;
}

bool tpl_dict_set(struct tpl_render *r, const struct tpl_node *at, struct tpl_dict *d,
                  struct tpl_value key, struct tpl_value val) {
    struct tpl_value *slot = tpl_dict_get(d, key);
    if (slot) {
        *slot = val;
        return true;
    }
    if (d->len == d->cap) {
        size_t cap = d->cap * 2;
        struct tpl_value *keys = tpl_alloc(r, at, cap * sizeof *keys);
        struct tpl_value *vals = tpl_alloc(r, at, cap * sizeof *vals);
        if (!keys || !vals) return false;
        memcpy(keys, d->keys, d->len * sizeof *keys);
        memcpy(vals, d->vals, d->len * sizeof *vals);
        d->keys = keys;
        d->vals = vals;
        d->cap = cap;
    }
    d->keys[d->len] = key;
    d->vals[d->len] = val;
    d->len++;
    if (d->index && d->len * 2 + 2 > d->index_cap) return dict_reindex(r, at, d);
    if (d->index && key.type == TPL_STR) {
        size_t h = str_hash(key.u.s) & (d->index_cap - 1);
        while (d->index[h]) h = (h + 1) & (d->index_cap - 1);
        d->index[h] = (uint32_t)d->len;
    } else if (!d->index && d->len > DICT_LINEAR_MAX) {
        return dict_reindex(r, at, d);
    }
    return true;
}

bool tpl_from_json(struct tpl_render *r, const json_t *j, struct tpl_value *out, int depth) {
    if (depth > 512) return tpl_fail(r, NULL, LLMOPT_ERR_LIMIT, "JSON input nested deeper than 512");
    switch (json_typeof(j)) {
    case JSON_NULL: *out = tpl_none(); return true;
    case JSON_TRUE: *out = tpl_bool(true); return true;
    case JSON_FALSE: *out = tpl_bool(false); return true;
    case JSON_INTEGER: *out = tpl_int((int64_t)json_integer_value(j)); return true;
    case JSON_REAL: *out = tpl_float(json_real_value(j)); return true;
    case JSON_STRING:
        return tpl_str_new(r, NULL, json_string_value(j), json_string_length(j), out);
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        struct tpl_list *l = tpl_list_new(r, NULL, n);
        if (!l) return false;
        for (size_t i = 0; i < n; i++)
            if (!tpl_from_json(r, json_array_get(j, i), &l->items[i], depth + 1)) return false;
        out->type = TPL_LIST;
        out->flags = 0;
        out->u.list = l;
        return true;
    }
    case JSON_OBJECT: {
        struct tpl_dict *d = tpl_dict_new(r, NULL, json_object_size(j));
        if (!d) return false;
        const char *key;
        json_t *val;
        void *tmp;
        json_object_foreach_safe((json_t *)j, tmp, key, val) {
            struct tpl_value k, v;
            if (!tpl_str_new(r, NULL, key, strlen(key), &k)) return false;
            if (!tpl_from_json(r, val, &v, depth + 1)) return false;
            if (!tpl_dict_set(r, NULL, d, k, v)) return false;
        }
        out->type = TPL_DICT;
        out->flags = 0;
        out->u.dict = d;
        return true;
    }
    }
    return tpl_fail(r, NULL, LLMOPT_ERR_FORMAT, "unknown JSON value type");
}

/* ---- truth, equality, ordering ----------------------------------------------------- */

bool tpl_truthy(struct tpl_value v) {
    switch ((enum tpl_type)v.type) {
    case TPL_UNDEFINED:
    case TPL_NONE: return false;
    case TPL_BOOL: return v.u.b;
    case TPL_INT: return v.u.i != 0;
    case TPL_FLOAT: return v.u.f != 0;
    case TPL_STR: return v.u.s.len > 0;
    case TPL_LIST: return v.u.list->len > 0;
    case TPL_DICT: return v.u.dict->len > 0;
    case TPL_NAMESPACE:
    case TPL_MACRO:
    case TPL_FUNC:
    case TPL_LOOP:
    case TPL_TYPE_COUNT: return true;
    }
    return true;
}

bool tpl_is_number(struct tpl_value v) {
    return v.type == TPL_BOOL || v.type == TPL_INT || v.type == TPL_FLOAT;
}

double tpl_as_double(struct tpl_value v) {
    if (v.type == TPL_BOOL) return v.u.b;
    if (v.type == TPL_INT) return (double)v.u.i;
    if (v.type == TPL_FLOAT) return v.u.f;
    return 0;
}

static int64_t as_int(struct tpl_value v) { return v.type == TPL_BOOL ? v.u.b : v.u.i; }

bool tpl_equal(struct tpl_value a, struct tpl_value b) {
    if (tpl_is_number(a) && tpl_is_number(b)) {
        if (a.type != TPL_FLOAT && b.type != TPL_FLOAT) return as_int(a) == as_int(b);
        return tpl_as_double(a) == tpl_as_double(b);
    }
    if (a.type != b.type) return false;
    switch ((enum tpl_type)a.type) {
    case TPL_UNDEFINED:
    case TPL_NONE: return true;
    case TPL_STR: return tpl_str_eq(a.u.s, b.u.s);
    case TPL_LIST:
        if ((a.flags & TPL_F_TUPLE) != (b.flags & TPL_F_TUPLE)) return false;
        if (a.u.list->len != b.u.list->len) return false;
        for (size_t i = 0; i < a.u.list->len; i++)
            if (!tpl_equal(a.u.list->items[i], b.u.list->items[i])) return false;
        return true;
    case TPL_DICT:
        if (a.u.dict->len != b.u.dict->len) return false;
        for (size_t i = 0; i < a.u.dict->len; i++) {
            struct tpl_value *o = tpl_dict_get(b.u.dict, a.u.dict->keys[i]);
            if (!o || !tpl_equal(a.u.dict->vals[i], *o)) return false;
        }
        return true;
    case TPL_NAMESPACE: return a.u.dict == b.u.dict;
    case TPL_MACRO: return a.u.macro == b.u.macro;
    case TPL_FUNC: return a.u.func == b.u.func;
    case TPL_LOOP: return a.u.loop == b.u.loop;
    default: return false;
    }
}

bool tpl_compare(struct tpl_render *r, const struct tpl_node *at, struct tpl_value a,
                 struct tpl_value b, int *cmp) {
    if (tpl_is_number(a) && tpl_is_number(b)) {
        if (a.type != TPL_FLOAT && b.type != TPL_FLOAT) {
            int64_t x = as_int(a), y = as_int(b);
            *cmp = (x > y) - (x < y);
        } else {
            double x = tpl_as_double(a), y = tpl_as_double(b);
            *cmp = (x > y) - (x < y); /* NaN compares equal-ish; Python says False both ways */
        }
        return true;
    }
    if (a.type == TPL_STR && b.type == TPL_STR) {
        /* UTF-8 byte order is code point order. */
        size_t n = a.u.s.len < b.u.s.len ? a.u.s.len : b.u.s.len;
        int c = n ? memcmp(a.u.s.ptr, b.u.s.ptr, n) : 0;
        if (c == 0) c = (a.u.s.len > b.u.s.len) - (a.u.s.len < b.u.s.len);
        *cmp = (c > 0) - (c < 0);
        return true;
    }
    if (a.type == TPL_LIST && b.type == TPL_LIST &&
        (a.flags & TPL_F_TUPLE) == (b.flags & TPL_F_TUPLE)) {
        size_t n = a.u.list->len < b.u.list->len ? a.u.list->len : b.u.list->len;
        for (size_t i = 0; i < n; i++) {
            if (tpl_equal(a.u.list->items[i], b.u.list->items[i])) continue;
            return tpl_compare(r, at, a.u.list->items[i], b.u.list->items[i], cmp);
        }
        *cmp = (a.u.list->len > b.u.list->len) - (a.u.list->len < b.u.list->len);
        return true;
    }
    if (a.type == TPL_UNDEFINED) return tpl_fail_undefined(r, at, a);
    if (b.type == TPL_UNDEFINED) return tpl_fail_undefined(r, at, b);
    return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "cannot order '%s' and '%s' values",
                    a.flags & TPL_F_TUPLE ? "tuple" : tpl_type_name(a.type),
                    b.flags & TPL_F_TUPLE ? "tuple" : tpl_type_name(b.type));
}

/* ---- UTF-8 and Python string helpers ------------------------------------------------ */

uint32_t tpl_utf8_next(const char *s, size_t len, size_t *i) {
    const uint8_t *p = (const uint8_t *)s + *i;
    size_t left = len - *i;
    uint8_t c = p[0];
    uint32_t cp;
    size_t n;
    if (c < 0x80) { *i += 1; return c; }
    if (c >= 0xc2 && c <= 0xdf) { n = 2; cp = c & 0x1f; }
    else if (c >= 0xe0 && c <= 0xef) { n = 3; cp = c & 0x0f; }
    else if (c >= 0xf0 && c <= 0xf4) { n = 4; cp = c & 0x07; }
    else { *i += 1; return 0xfffd00u | c; } /* an invalid byte stands for itself */
    if (left < n) { *i += 1; return 0xfffd00u | c; }
    for (size_t k = 1; k < n; k++) {
        if ((p[k] & 0xc0) != 0x80) { *i += 1; return 0xfffd00u | c; }
        cp = cp << 6 | (p[k] & 0x3f);
    }
    *i += n;
    return cp;
}

size_t tpl_utf8_put(uint32_t cp, char *out) {
    if (cp >= 0xfffd00u) { out[0] = (char)(cp & 0xff); return 1; } /* invalid byte, as read */
    return utf8_put(cp, out);
}

size_t tpl_utf8_count(struct tpl_str s) {
    size_t n = 0;
    for (size_t i = 0; i < s.len;) {
        if ((uint8_t)s.ptr[i] < 0x80) {
            i++;
        } else {
            tpl_utf8_next(s.ptr, s.len, &i);
        }
        n++;
    }
    return n;
}

size_t tpl_utf8_offset(struct tpl_str s, size_t cp) {
    size_t i = 0;
    while (cp > 0 && i < s.len) {
        tpl_utf8_next(s.ptr, s.len, &i);
        cp--;
    }
    return i;
}

bool tpl_is_space(uint32_t cp) {
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x1f)) return true;
    if (cp < 0x80) return false;
    return cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

static bool in_chars(uint32_t cp, const struct tpl_str *chars) {
    if (!chars) return tpl_is_space(cp);
    for (size_t i = 0; i < chars->len;)
        if (tpl_utf8_next(chars->ptr, chars->len, &i) == cp) return true;
    return false;
}

struct tpl_str tpl_strip(struct tpl_str s, const struct tpl_str *chars, int which) {
    size_t start = 0, end = s.len;
    if (which & 1) {
        while (start < end) {
            size_t i = start;
            if (!in_chars(tpl_utf8_next(s.ptr, end, &i), chars)) break;
            start = i;
        }
    }
    if (which & 2) {
        while (end > start) {
            size_t b = end - 1; /* back up to the start of the last code point */
            while (b > start && ((uint8_t)s.ptr[b] & 0xc0) == 0x80 && end - b < 4) b--;
            size_t i = b;
            uint32_t cp = tpl_utf8_next(s.ptr, end, &i);
            if (i != end) { b = end - 1; i = b; cp = tpl_utf8_next(s.ptr, end, &i); }
            if (!in_chars(cp, chars)) break;
            end = b;
        }
    }
    return (struct tpl_str){s.ptr + start, end - start};
}

/* ---- buffers ------------------------------------------------------------------------ */

bool tpl_buf_put(struct tpl_buf *b, const char *s, size_t n) {
    if (n > b->limit || b->len > b->limit - n) return false;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->data, cap);
        if (!p) return false;
        b->data = p;
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
    return true;
}

bool tpl_buf_putc(struct tpl_buf *b, char c) { return tpl_buf_put(b, &c, 1); }

bool tpl_buf_printf(struct tpl_buf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return false;
    if ((size_t)n >= sizeof tmp) n = sizeof tmp - 1;
    return tpl_buf_put(b, tmp, (size_t)n);
}

void tpl_buf_free(struct tpl_buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

/* ---- str() and repr() ------------------------------------------------------------- */

int tpl_fmt_float(double f, char *buf) {
    if (isnan(f)) return sprintf(buf, "nan");
    if (isinf(f)) return sprintf(buf, f < 0 ? "-inf" : "inf");
    if (f == 0) return sprintf(buf, signbit(f) ? "-0.0" : "0.0");
    /* Shortest digits that read back as f (what Python's repr produces). */
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    char digits[24];
    int nd = 0, exp10 = 0;
    const char *p = tmp;
    bool neg = false;
    if (*p == '-') { neg = true; p++; }
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9' && nd < 20) digits[nd++] = *p;
    if (*p == 'e') exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    int decpt = exp10 + 1; /* value = 0.DIGITS x 10^decpt */
    char *o = buf;
    if (neg) *o++ = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -decpt; i++) *o++ = '0';
            for (int i = 0; i < nd; i++) *o++ = digits[i];
        } else if (decpt >= nd) {
            for (int i = 0; i < nd; i++) *o++ = digits[i];
            for (int i = nd; i < decpt; i++) *o++ = '0';
            *o++ = '.';
            *o++ = '0';
        } else {
            for (int i = 0; i < decpt; i++) *o++ = digits[i];
            *o++ = '.';
            for (int i = decpt; i < nd; i++) *o++ = digits[i];
        }
        *o = 0;
    } else {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            for (int i = 1; i < nd; i++) *o++ = digits[i];
        }
        int e = decpt - 1;
        o += sprintf(o, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
    return (int)(o - buf);
}

/* Python's str.isprintable() for the code points that matter in practice: controls,
 * separators other than ' ', common format characters, surrogates, private use. */
static bool py_printable(uint32_t cp) {
    if (cp < 0x20 || cp == 0x7f) return false;
    if (cp < 0x7f) return true;
    if (cp >= 0xfffd00u) return false;
    if (cp <= 0xa0 || cp == 0xad) return false;
    if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200f) || (cp >= 0x2028 && cp <= 0x202f) ||
        (cp >= 0x205f && cp <= 0x2064) || (cp >= 0x2066 && cp <= 0x206f) || cp == 0x3000)
        return false;
    if ((cp >= 0x600 && cp <= 0x605) || cp == 0x61c || cp == 0x6dd || cp == 0x70f || cp == 0x180e)
        return false;
    if ((cp >= 0xd800 && cp <= 0xf8ff) || cp == 0xfeff || (cp >= 0xfff9 && cp <= 0xfffb) ||
        cp == 0xfffe || cp == 0xffff)
        return false;
    if (cp >= 0xe0000) return false;
    return true;
}

static bool write_str_repr(struct tpl_buf *b, struct tpl_str s) {
    bool has_sq = memchr(s.ptr, '\'', s.len) != NULL, has_dq = memchr(s.ptr, '"', s.len) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    if (!tpl_buf_putc(b, q)) return false;
    for (size_t i = 0; i < s.len;) {
        size_t start = i;
        uint32_t cp = tpl_utf8_next(s.ptr, s.len, &i);
        bool ok = true;
        if (cp == (uint32_t)q || cp == '\\') {
            ok = tpl_buf_putc(b, '\\') && tpl_buf_putc(b, (char)cp);
        } else if (cp == '\n') {
            ok = tpl_buf_put(b, "\\n", 2);
        } else if (cp == '\r') {
            ok = tpl_buf_put(b, "\\r", 2);
        } else if (cp == '\t') {
            ok = tpl_buf_put(b, "\\t", 2);
        } else if (py_printable(cp)) {
            ok = tpl_buf_put(b, s.ptr + start, i - start);
        } else if (cp >= 0xfffd00u) {
            ok = tpl_buf_printf(b, "\\x%02x", cp & 0xff);
        } else if (cp < 0x100) {
            ok = tpl_buf_printf(b, "\\x%02x", cp);
        } else if (cp < 0x10000) {
            ok = tpl_buf_printf(b, "\\u%04x", cp);
        } else {
            ok = tpl_buf_printf(b, "\\U%08x", cp);
        }
        if (!ok) return false;
    }
    return tpl_buf_putc(b, q);
}

static bool write_value(struct tpl_buf *b, struct tpl_value v, bool repr, int depth) {
    char num[40];
    if (depth > 200) return tpl_buf_put(b, "...", 3);
    switch ((enum tpl_type)v.type) {
    case TPL_UNDEFINED: return repr ? tpl_buf_put(b, "Undefined", 9) : true;
    case TPL_NONE: return tpl_buf_put(b, "None", 4);
    case TPL_BOOL: return v.u.b ? tpl_buf_put(b, "True", 4) : tpl_buf_put(b, "False", 5);
    case TPL_INT: return tpl_buf_printf(b, "%lld", (long long)v.u.i);
    case TPL_FLOAT: return tpl_buf_put(b, num, (size_t)tpl_fmt_float(v.u.f, num));
    case TPL_STR: return repr ? write_str_repr(b, v.u.s) : tpl_buf_put(b, v.u.s.ptr, v.u.s.len);
    case TPL_LIST: {
        bool tuple = v.flags & TPL_F_TUPLE;
        if (!tpl_buf_putc(b, tuple ? '(' : '[')) return false;
        for (size_t i = 0; i < v.u.list->len; i++) {
            if (i && !tpl_buf_put(b, ", ", 2)) return false;
            if (!write_value(b, v.u.list->items[i], true, depth + 1)) return false;
        }
        if (tuple && v.u.list->len == 1 && !tpl_buf_putc(b, ',')) return false;
        return tpl_buf_putc(b, tuple ? ')' : ']');
    }
    case TPL_NAMESPACE:
    case TPL_DICT: {
        if (v.type == TPL_NAMESPACE && !tpl_buf_put(b, "<Namespace ", 11)) return false;
        if (!tpl_buf_putc(b, '{')) return false;
        for (size_t i = 0; i < v.u.dict->len; i++) {
            if (i && !tpl_buf_put(b, ", ", 2)) return false;
            if (!write_value(b, v.u.dict->keys[i], true, depth + 1) || !tpl_buf_put(b, ": ", 2) ||
                !write_value(b, v.u.dict->vals[i], true, depth + 1))
                return false;
        }
        if (!tpl_buf_putc(b, '}')) return false;
        return v.type == TPL_NAMESPACE ? tpl_buf_putc(b, '>') : true;
    }
    case TPL_MACRO: return tpl_buf_printf(b, "<Macro '%.*s'>", (int)v.u.macro->def->name.len, v.u.macro->def->name.ptr);
    case TPL_FUNC: return tpl_buf_put(b, "<built-in function>", 19);
    case TPL_LOOP:
        return tpl_buf_printf(b, "<LoopContext %zu/%zu>", v.u.loop->index0 + 1, v.u.loop->length);
    case TPL_TYPE_COUNT: break;
    }
    return true;
}

bool tpl_write_str(struct tpl_buf *b, struct tpl_value v) { return write_value(b, v, false, 0); }
bool tpl_write_repr(struct tpl_buf *b, struct tpl_value v) { return write_value(b, v, true, 0); }

bool tpl_to_str(struct tpl_render *r, const struct tpl_node *at, struct tpl_value v,
                struct tpl_value *out) {
    if (v.type == TPL_STR) {
        *out = v;
        out->flags = 0;
        return true;
    }
    if (v.type == TPL_UNDEFINED) {
        *out = tpl_strv((struct tpl_str){"", 0});
        return true;
    }
    if (v.type == TPL_INT && v.u.i >= 0 && v.u.i < 10) { /* common and cheap */
        static const char digits[] = "0123456789";
        *out = tpl_strv((struct tpl_str){digits + v.u.i, 1});
        return true;
    }
    struct tpl_buf b = {.limit = r->lim.max_output};
    if (!tpl_write_str(&b, v)) {
        tpl_buf_free(&b);
        return tpl_fail(r, at, LLMOPT_ERR_LIMIT, "string conversion exceeds %zu bytes",
                        r->lim.max_output);
    }
    bool ok = tpl_str_new(r, at, b.data ? b.data : "", b.len, out);
    tpl_buf_free(&b);
    return ok;
}

/* ---- json.dumps ------------------------------------------------------------------- */

static bool json_write_string(struct tpl_buf *b, struct tpl_str s, bool ensure_ascii) {
    if (!tpl_buf_putc(b, '"')) return false;
    size_t run = 0; /* start of bytes copied as they are */
    for (size_t i = 0; i < s.len;) {
        size_t start = i;
        uint8_t c = (uint8_t)s.ptr[i];
        const char *esc = NULL;
        char tmp[16];
        if (c < 0x80) {
            i++;
            switch (c) {
            case '"': esc = "\\\""; break;
            case '\\': esc = "\\\\"; break;
            case '\n': esc = "\\n"; break;
            case '\r': esc = "\\r"; break;
            case '\t': esc = "\\t"; break;
            case '\b': esc = "\\b"; break;
            case '\f': esc = "\\f"; break;
            default:
                if (c < 0x20) {
                    snprintf(tmp, sizeof tmp, "\\u%04x", c);
                    esc = tmp;
                }
            }
        } else {
            uint32_t cp = tpl_utf8_next(s.ptr, s.len, &i);
            if (ensure_ascii) {
                if (cp >= 0xfffd00u) cp = 0xfffd;
                if (cp >= 0x10000) {
                    uint32_t v = cp - 0x10000;
                    snprintf(tmp, sizeof tmp, "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
                } else {
                    snprintf(tmp, sizeof tmp, "\\u%04x", cp);
                }
                esc = tmp;
            }
        }
        if (esc) {
            if (!tpl_buf_put(b, s.ptr + run, start - run) || !tpl_buf_put(b, esc, strlen(esc))) return false;
            run = i;
        }
    }
    return tpl_buf_put(b, s.ptr + run, s.len - run) && tpl_buf_putc(b, '"');
}

static bool json_newline(struct tpl_buf *b, const struct tpl_json_opts *o, int level) {
    if (!tpl_buf_putc(b, '\n')) return false;
    for (int i = 0; i < level; i++)
        if (!tpl_buf_put(b, o->indent.ptr, o->indent.len)) return false;
    return true;
}

/* A dict key as json.dumps writes it: strings as they are, numbers/bools/None
 * converted; other keys are a TypeError. */
static bool json_key(struct tpl_render *r, const struct tpl_node *at, struct tpl_value k,
                     struct tpl_value *out) {
    if (k.type == TPL_STR) { *out = k; return true; }
    if (k.type == TPL_BOOL) { *out = tpl_strv(k.u.b ? TPL_STR_LIT("true") : TPL_STR_LIT("false")); return true; }
    if (k.type == TPL_NONE) { *out = tpl_strv(TPL_STR_LIT("null")); return true; }
    if (k.type == TPL_INT || k.type == TPL_FLOAT) return tpl_to_str(r, at, k, out);
    return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "tojson: keys must be str, int, float, bool or None, not %s",
                    tpl_type_name(k.type));
}

static bool limit_fail(struct tpl_render *r, const struct tpl_node *at) {
    return tpl_fail(r, at, LLMOPT_ERR_LIMIT, "output exceeds %zu bytes", r->lim.max_output);
}

bool tpl_write_json(struct tpl_render *r, const struct tpl_node *at, struct tpl_buf *b,
                    struct tpl_value v, const struct tpl_json_opts *o, int depth) {
    char num[40];
    if (depth > 500) return tpl_fail(r, at, LLMOPT_ERR_LIMIT, "tojson: value nested deeper than 500");
    switch ((enum tpl_type)v.type) {
    case TPL_NONE: return tpl_buf_put(b, "null", 4) || limit_fail(r, at);
    case TPL_BOOL: return (v.u.b ? tpl_buf_put(b, "true", 4) : tpl_buf_put(b, "false", 5)) || limit_fail(r, at);
    case TPL_INT: return tpl_buf_printf(b, "%lld", (long long)v.u.i) || limit_fail(r, at);
    case TPL_FLOAT: {
        int n;
        if (isnan(v.u.f)) n = sprintf(num, "NaN");
        else if (isinf(v.u.f)) n = sprintf(num, v.u.f < 0 ? "-Infinity" : "Infinity");
        else n = tpl_fmt_float(v.u.f, num);
        return tpl_buf_put(b, num, (size_t)n) || limit_fail(r, at);
    }
    case TPL_STR: return json_write_string(b, v.u.s, o->ensure_ascii) || limit_fail(r, at);
    case TPL_LIST: {
        size_t n = v.u.list->len;
        if (n == 0) return tpl_buf_put(b, "[]", 2) || limit_fail(r, at);
        if (!tpl_buf_putc(b, '[')) return limit_fail(r, at);
        for (size_t i = 0; i < n; i++) {
            if (i && !tpl_buf_put(b, o->item_sep.ptr, o->item_sep.len)) return limit_fail(r, at);
            if (o->have_indent && !json_newline(b, o, depth + 1)) return limit_fail(r, at);
            if (!tpl_write_json(r, at, b, v.u.list->items[i], o, depth + 1)) return false;
        }
        if (o->have_indent && !json_newline(b, o, depth)) return limit_fail(r, at);
        return tpl_buf_putc(b, ']') || limit_fail(r, at);
    }
    case TPL_DICT: {
        const struct tpl_dict *d = v.u.dict;
        if (d->len == 0) return tpl_buf_put(b, "{}", 2) || limit_fail(r, at);
        size_t *order = tpl_alloc(r, at, d->len * sizeof *order);
        struct tpl_value *keys = tpl_alloc(r, at, d->len * sizeof *keys);
        if (!order || !keys) return false;
        for (size_t i = 0; i < d->len; i++) {
            order[i] = i;
            if (!json_key(r, at, d->keys[i], &keys[i])) return false;
        }
        if (o->sort_keys) { /* insertion sort: stable, dicts are small */
            for (size_t i = 1; i < d->len; i++) {
                size_t x = order[i], j = i;
                while (j > 0) {
                    int c;
                    if (!tpl_compare(r, at, keys[order[j - 1]], keys[x], &c)) return false;
                    if (c <= 0) break;
                    order[j] = order[j - 1];
                    j--;
                }
                order[j] = x;
            }
        }
        if (!tpl_buf_putc(b, '{')) return limit_fail(r, at);
        for (size_t k = 0; k < d->len; k++) {
            size_t i = order[k];
            if (k && !tpl_buf_put(b, o->item_sep.ptr, o->item_sep.len)) return limit_fail(r, at);
            if (o->have_indent && !json_newline(b, o, depth + 1)) return limit_fail(r, at);
            if (!json_write_string(b, keys[i].u.s, o->ensure_ascii) ||
                !tpl_buf_put(b, o->key_sep.ptr, o->key_sep.len))
                return limit_fail(r, at);
            if (!tpl_write_json(r, at, b, d->vals[i], o, depth + 1)) return false;
        }
        if (o->have_indent && !json_newline(b, o, depth)) return limit_fail(r, at);
        return tpl_buf_putc(b, '}') || limit_fail(r, at);
    }
    default:
        return tpl_fail(r, at, LLMOPT_ERR_FORMAT, "tojson: object of type %s is not JSON serializable",
                        tpl_type_name(v.type));
    }
}
