/* Recursive-descent evaluator for graph-file expressions (grammar in graph.md). */
#include "ir/expr.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct expr_parser {
    const char *text;
    size_t pos, len;
    int depth;
    expr_lookup_fn lookup;
    void *ctx;
    struct llmopt_err *err;
    bool failed;
};

#define EXPR_MAX_DEPTH 32

static struct expr_value expr_fail(struct expr_parser *p, const char *what) {
    if (!p->failed)
        err_set(p->err, LLMOPT_ERR_FORMAT, "expression '%s': %s at offset %zu", p->text, what,
                p->pos);
    p->failed = true;
    return (struct expr_value){0, 0, 0};
}

static void expr_skip_space(struct expr_parser *p) {
    while (p->pos < p->len && isspace((unsigned char)p->text[p->pos])) p->pos++;
}

static struct expr_value expr_parse_sum(struct expr_parser *p);

static struct expr_value expr_parse_unary(struct expr_parser *p) {
    expr_skip_space(p);
    if (p->failed) return (struct expr_value){0, 0, 0};
    if (++p->depth > EXPR_MAX_DEPTH) return expr_fail(p, "nested too deeply");
    struct expr_value v = {0, 0, 0};
    if (p->pos >= p->len) {
        v = expr_fail(p, "unexpected end");
    } else if (p->text[p->pos] == '-') {
        p->pos++;
        v = expr_parse_unary(p);
        v.coef = -v.coef;
    } else if (p->text[p->pos] == '(') {
        p->pos++;
        v = expr_parse_sum(p);
        expr_skip_space(p);
        if (p->pos >= p->len || p->text[p->pos] != ')')
            v = expr_fail(p, "expected ')'");
        else
            p->pos++;
    } else if (isdigit((unsigned char)p->text[p->pos]) || p->text[p->pos] == '.') {
        char *end = NULL;
        v.coef = strtod(p->text + p->pos, &end);
        if (end == p->text + p->pos) return expr_fail(p, "bad number");
        p->pos = (size_t)(end - p->text);
    } else if (isalpha((unsigned char)p->text[p->pos]) || p->text[p->pos] == '_') {
        size_t start = p->pos;
        while (p->pos < p->len &&
               (isalnum((unsigned char)p->text[p->pos]) || p->text[p->pos] == '_'))
            p->pos++;
        size_t n = p->pos - start;
        const char *name = p->text + start;
        if (n == 1 && name[0] == 'N') {
            v = (struct expr_value){1, 1, 0};
        } else if (n == 1 && name[0] == 'M') {
            v = (struct expr_value){1, 0, 1};
        } else if (!p->lookup || !p->lookup(p->ctx, name, n, &v.coef)) {
            p->pos = start;
            if (!p->failed)
                err_set(p->err, LLMOPT_ERR_FORMAT, "expression '%s': unknown symbol '%.*s'",
                        p->text, (int)n, name);
            p->failed = true;
        }
    } else {
        v = expr_fail(p, "unexpected character");
    }
    p->depth--;
    return v;
}

static struct expr_value expr_parse_power(struct expr_parser *p) {
    struct expr_value base = expr_parse_unary(p);
    expr_skip_space(p);
    if (p->pos < p->len && p->text[p->pos] == '^') {
        p->pos++;
        struct expr_value e = expr_parse_power(p); /* right-associative */
        if (e.n_pow || e.m_pow) return expr_fail(p, "exponent must not use N or M");
        if (base.n_pow || base.m_pow) {
            double k = e.coef;
            if (k != floor(k)) return expr_fail(p, "fractional power of N or M");
            base.n_pow *= (int)k;
            base.m_pow *= (int)k;
        }
        base.coef = pow(base.coef, e.coef);
    }
    return base;
}

static struct expr_value expr_parse_product(struct expr_parser *p) {
    struct expr_value v = expr_parse_power(p);
    for (;;) {
        expr_skip_space(p);
        if (p->failed || p->pos >= p->len) break;
        char c = p->text[p->pos];
        if (c != '*' && c != '/') break;
        p->pos++;
        struct expr_value r = expr_parse_power(p);
        if (c == '*') {
            v.coef *= r.coef;
            v.n_pow += r.n_pow;
            v.m_pow += r.m_pow;
        } else {
            if (r.coef == 0) return expr_fail(p, "division by zero");
            v.coef /= r.coef;
            v.n_pow -= r.n_pow;
            v.m_pow -= r.m_pow;
        }
    }
    return v;
}

static struct expr_value expr_parse_sum(struct expr_parser *p) {
    struct expr_value v = expr_parse_product(p);
    for (;;) {
        expr_skip_space(p);
        if (p->failed || p->pos >= p->len) break;
        char c = p->text[p->pos];
        if (c != '+' && c != '-') break;
        p->pos++;
        struct expr_value r = expr_parse_product(p);
        if (p->failed) break;
        /* Adding terms of different powers (N + 1) has no monomial form; 0 is neutral. */
        if (r.coef != 0 && v.coef != 0 && (r.n_pow != v.n_pow || r.m_pow != v.m_pow))
            return expr_fail(p, "sum of terms with different powers of N/M");
        if (v.coef == 0) {
            v.n_pow = r.n_pow;
            v.m_pow = r.m_pow;
        }
        v.coef += c == '+' ? r.coef : -r.coef;
    }
    return v;
}

enum llmopt_status expr_eval(const char *text, expr_lookup_fn lookup, void *ctx,
                             struct expr_value *out, struct llmopt_err *err) {
    size_t len = strnlen(text, EXPR_MAX_LEN + 1);
    if (len > EXPR_MAX_LEN)
        return err_set(err, LLMOPT_ERR_FORMAT, "expression longer than %d characters",
                       EXPR_MAX_LEN);
    struct expr_parser p = {.text = text, .len = len, .lookup = lookup, .ctx = ctx, .err = err};
    struct expr_value v = expr_parse_sum(&p);
    expr_skip_space(&p);
    if (!p.failed && p.pos != p.len) expr_fail(&p, "trailing characters");
    if (p.failed) return LLMOPT_ERR_FORMAT;
    if (!isfinite(v.coef))
        return err_set(err, LLMOPT_ERR_FORMAT, "expression '%s' is not finite", text);
    *out = v;
    return LLMOPT_OK;
}

enum llmopt_status expr_eval_number(const char *text, expr_lookup_fn lookup, void *ctx,
                                    double *out, struct llmopt_err *err) {
    struct expr_value v;
    enum llmopt_status st = expr_eval(text, lookup, ctx, &v, err);
    if (st) return st;
    if (v.n_pow || v.m_pow)
        return err_set(err, LLMOPT_ERR_FORMAT, "expression '%s' must not depend on N or M",
                       text);
    *out = v.coef;
    return LLMOPT_OK;
}
