/* Template parser: tokens to an AST, following Jinja2's grammar and precedence:
 *
 *   expr     := or ['if' or ['else' expr]]
 *   or       := and ('or' and)*          and := not ('and' not)*
 *   not      := 'not' not | compare      compare := math1 (cmpop math1)*
 *   math1    := concat (('+'|'-') concat)*   concat := math2 ('~' math2)*
 *   math2    := pow (('*'|'/'|'//'|'%') pow)*  pow := unary ('**' unary)*
 *   unary    := ('-'|'+') unary-without-filters | primary postfix* (filter | test)*
 *
 * so filters and tests bind tighter than every binary operator ("'a' + x | trim" is
 * 'a' + (x | trim)) and `not x is defined` is not (x is defined). Unknown filters and
 * tests are errors at parse time, as in Jinja. */
#include "template/tpl_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct parser {
    const struct tpl_token *toks;
    size_t n, pos;
    struct arena *arena;
    const char *name;
    struct llmopt_err *err;
    int depth;      /* expression / block nesting */
    int loop_depth; /* for loops around the current statement (for break/continue) */
    bool failed;
};

static const struct tpl_token *cur(const struct parser *P) { return &P->toks[P->pos]; }
static const struct tpl_token *peek(const struct parser *P, size_t k) {
    size_t i = P->pos + k;
    return &P->toks[i < P->n ? i : P->n - 1];
}
static void advance(struct parser *P) {
    if (P->pos + 1 < P->n) P->pos++;
}

static bool tok_is_name(const struct tpl_token *t, const char *name) {
    return t->kind == TK_NAME && tpl_str_eqc(t->text, name);
}
static bool tok_is_op(const struct tpl_token *t, enum tpl_op op) { return t->kind == TK_OP && t->op == op; }

static void describe(const struct tpl_token *t, char *buf, size_t cap) {
    switch ((enum tpl_tok_kind)t->kind) {
    case TK_EOF: snprintf(buf, cap, "end of template"); break;
    case TK_DATA: snprintf(buf, cap, "template text"); break;
    case TK_VAR_BEGIN: snprintf(buf, cap, "'{{'"); break;
    case TK_VAR_END: snprintf(buf, cap, "end of print statement '}}'"); break;
    case TK_BLOCK_BEGIN: snprintf(buf, cap, "'{%%'"); break;
    case TK_BLOCK_END: snprintf(buf, cap, "end of statement block '%%}'"); break;
    case TK_NAME: snprintf(buf, cap, "name '%.*s'", (int)(t->text.len > 60 ? 60 : t->text.len), t->text.ptr); break;
    case TK_STRING: snprintf(buf, cap, "string literal"); break;
    case TK_INT: snprintf(buf, cap, "integer"); break;
    case TK_FLOAT: snprintf(buf, cap, "float"); break;
    case TK_OP: snprintf(buf, cap, "'%s'", tpl_op_text(t->op)); break;
    default: snprintf(buf, cap, "?"); break;
    }
}

__attribute__((format(printf, 4, 5))) static bool fail_at(struct parser *P, const struct tpl_token *t,
                                                          enum llmopt_status st, const char *fmt, ...) {
    if (P->failed) return false;
    P->failed = true;
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    err_set(P->err, st, "%s:%u:%u: %s", P->name, t->line, t->col, msg);
    return false;
}

static bool fail_expected(struct parser *P, const char *what) {
    char got[96];
    describe(cur(P), got, sizeof got);
    return fail_at(P, cur(P), LLMOPT_ERR_FORMAT, "expected %s, got %s", what, got);
}

static struct tpl_node *new_node(struct parser *P, enum tpl_node_kind kind, const struct tpl_token *at) {
    struct tpl_node *n = arena_alloc(P->arena, sizeof *n);
    if (!n) {
        fail_at(P, at, LLMOPT_ERR_NOMEM, "out of memory");
        return NULL;
    }
    n->kind = (uint8_t)kind;
    n->line = at->line;
    n->col = at->col;
    return n;
}

/* A growable array of node pointers (malloc'd while parsing, then copied). */
struct node_vec {
    struct tpl_node **items;
    struct tpl_str *names;
    size_t len, cap;
};

static bool vec_push(struct parser *P, struct node_vec *v, struct tpl_node *n, struct tpl_str name) {
    if (v->len == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 8;
        struct tpl_node **items = realloc(v->items, cap * sizeof *items);
        if (!items) return fail_at(P, cur(P), LLMOPT_ERR_NOMEM, "out of memory");
        v->items = items;
        struct tpl_str *names = realloc(v->names, cap * sizeof *names);
        if (!names) return fail_at(P, cur(P), LLMOPT_ERR_NOMEM, "out of memory");
        v->names = names;
        v->cap = cap;
    }
    v->items[v->len] = n;
    v->names[v->len] = name;
    v->len++;
    return true;
}

static void vec_free(struct node_vec *v) {
    free(v->items);
    free(v->names);
    memset(v, 0, sizeof *v);
}

/* Moves the vector into node->args (and arg_names when any is a keyword). */
static bool vec_to_args(struct parser *P, struct node_vec *v, struct tpl_node *node) {
    node->n_args = v->len;
    if (v->len) {
        node->args = arena_alloc(P->arena, v->len * sizeof *node->args);
        if (!node->args) return fail_at(P, cur(P), LLMOPT_ERR_NOMEM, "out of memory");
        memcpy(node->args, v->items, v->len * sizeof *node->args);
        bool any_kw = false;
        for (size_t i = 0; i < v->len; i++) any_kw |= v->names[i].len > 0;
        if (any_kw) {
            node->arg_names = arena_alloc(P->arena, v->len * sizeof *node->arg_names);
            if (!node->arg_names) return fail_at(P, cur(P), LLMOPT_ERR_NOMEM, "out of memory");
            memcpy(node->arg_names, v->names, v->len * sizeof *node->arg_names);
        }
    }
    vec_free(v);
    return true;
}

static struct tpl_node *parse_expression(struct parser *P, bool with_condexpr);
static struct tpl_node *parse_or(struct parser *P);
static struct tpl_node *parse_unary(struct parser *P, bool with_filter);
static struct tpl_node *parse_primary(struct parser *P);
static struct tpl_node *parse_postfix(struct parser *P, struct tpl_node *node);
static struct tpl_node *parse_filter_expr(struct parser *P, struct tpl_node *node);

static bool at_tuple_end(const struct parser *P, const char *extra_end) {
    const struct tpl_token *t = cur(P);
    if (t->kind == TK_VAR_END || t->kind == TK_BLOCK_END || t->kind == TK_EOF) return true;
    if (tok_is_op(t, OP_RPAREN)) return true;
    return extra_end && tok_is_name(t, extra_end);
}

/* Comma-separated expressions; a tuple when there is a comma (or explicit parens). */
static struct tpl_node *parse_tuple(struct parser *P, bool with_condexpr, const char *extra_end,
                                    bool explicit_parens) {
    const struct tpl_token *start = cur(P);
    struct node_vec v = {0};
    bool is_tuple = false;
    for (;;) {
        if (v.len) {
            if (!tok_is_op(cur(P), OP_COMMA)) {
                fail_expected(P, "','");
                goto fail;
            }
            advance(P);
        }
        if (at_tuple_end(P, extra_end)) break;
        struct tpl_node *e = parse_expression(P, with_condexpr);
        if (!e || !vec_push(P, &v, e, (struct tpl_str){0})) goto fail;
        if (tok_is_op(cur(P), OP_COMMA)) is_tuple = true;
        else break;
    }
    if (!is_tuple) {
        if (v.len) {
            struct tpl_node *only = v.items[0];
            vec_free(&v);
            return only;
        }
        if (!explicit_parens) {
            fail_expected(P, "an expression");
            goto fail;
        }
    }
    struct tpl_node *t = new_node(P, N_TUPLE, start);
    if (!t || !vec_to_args(P, &v, t)) goto fail;
    return t;
fail:
    vec_free(&v);
    return NULL;
}

static struct tpl_node *parse_expression(struct parser *P, bool with_condexpr) {
    if (++P->depth > TPL_MAX_NESTING) {
        fail_at(P, cur(P), LLMOPT_ERR_LIMIT, "expression nested deeper than %d", TPL_MAX_NESTING);
        return NULL;
    }
    struct tpl_node *e = parse_or(P);
    while (e && with_condexpr && tok_is_name(cur(P), "if")) {
        const struct tpl_token *t = cur(P);
        advance(P);
        struct tpl_node *cond = parse_or(P);
        if (!cond) return NULL;
        struct tpl_node *alt = NULL;
        if (tok_is_name(cur(P), "else")) {
            advance(P);
            alt = parse_expression(P, true);
            if (!alt) return NULL;
        }
        struct tpl_node *n = new_node(P, N_CONDEXPR, t);
        if (!n) return NULL;
        n->a = cond;
        n->b = e;
        n->c = alt;
        e = n;
    }
    P->depth--;
    return e;
}

static struct tpl_node *binary(struct parser *P, enum tpl_node_kind kind, int op,
                               const struct tpl_token *t, struct tpl_node *a, struct tpl_node *b) {
    if (!a || !b) return NULL;
    struct tpl_node *n = new_node(P, kind, t);
    if (!n) return NULL;
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

/* One left-associative binary level: operands from `next`, joined either by the
 * keyword `word` (node `kind`, op 0) or by one of `ops` (node `kind`, op = the token's). */
struct binary_level {
    struct tpl_node *(*next)(struct parser *P);
    enum tpl_node_kind kind;
    const char *word;
    enum tpl_op ops[4]; /* OP_NONE after the last */
};

static bool level_joins(const struct binary_level *L, const struct tpl_token *t) {
    if (L->word) return tok_is_name(t, L->word);
    for (size_t k = 0; k < LLMOPT_ARRAY_LEN(L->ops) && L->ops[k] != OP_NONE; k++)
        if (tok_is_op(t, L->ops[k])) return true;
    return false;
}

static struct tpl_node *parse_level(struct parser *P, const struct binary_level *L) {
    struct tpl_node *e = L->next(P);
    while (e && level_joins(L, cur(P))) {
        const struct tpl_token *t = cur(P);
        advance(P);
        e = binary(P, L->kind, L->word ? 0 : (int)t->op, t, e, L->next(P));
    }
    return e;
}

static struct tpl_node *parse_and(struct parser *P);
static struct tpl_node *parse_not(struct parser *P);
static struct tpl_node *parse_concat(struct parser *P);
static struct tpl_node *parse_pow(struct parser *P);
static struct tpl_node *parse_unary_filtered(struct parser *P) { return parse_unary(P, true); }

/* The binary levels of the grammar above, loosest first ('not', compare and concat
 * have parsers of their own). */
static const struct binary_level level_or = {parse_and, N_OR, "or", {OP_NONE}};
static const struct binary_level level_and = {parse_not, N_AND, "and", {OP_NONE}};
static const struct binary_level level_math1 = {parse_concat, N_BINOP, NULL, {OP_ADD, OP_SUB}};
static const struct binary_level level_math2 = {parse_pow, N_BINOP, NULL,
                                                {OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD}};
static const struct binary_level level_pow = {parse_unary_filtered, N_BINOP, NULL, {OP_POW}};

static struct tpl_node *parse_or(struct parser *P) { return parse_level(P, &level_or); }
static struct tpl_node *parse_and(struct parser *P) { return parse_level(P, &level_and); }
static struct tpl_node *parse_math1(struct parser *P) { return parse_level(P, &level_math1); }
static struct tpl_node *parse_math2(struct parser *P) { return parse_level(P, &level_math2); }
static struct tpl_node *parse_pow(struct parser *P) { return parse_level(P, &level_pow); }

static struct tpl_node *parse_compare(struct parser *P);
static struct tpl_node *parse_not(struct parser *P) {
    if (tok_is_name(cur(P), "not")) {
        const struct tpl_token *t = cur(P);
        if (++P->depth > TPL_MAX_NESTING) {
            fail_at(P, t, LLMOPT_ERR_LIMIT, "expression nested deeper than %d", TPL_MAX_NESTING);
            return NULL;
        }
        advance(P);
        struct tpl_node *inner = parse_not(P);
        P->depth--;
        if (!inner) return NULL;
        struct tpl_node *n = new_node(P, N_NOT, t);
        if (n) n->a = inner;
        return n;
    }
    return parse_compare(P);
}

static struct tpl_node *parse_compare(struct parser *P) {
    const struct tpl_token *start = cur(P);
    struct tpl_node *first = parse_math1(P);
    if (!first) return NULL;
    struct node_vec v = {0};
    uint8_t ops[64];
    size_t n_ops = 0;
    if (!vec_push(P, &v, first, (struct tpl_str){0})) return NULL;
    for (;;) {
        const struct tpl_token *t = cur(P);
        enum tpl_op op = OP_NONE;
        if (t->kind == TK_OP && (t->op == OP_EQ || t->op == OP_NE || t->op == OP_LT || t->op == OP_LE ||
                                 t->op == OP_GT || t->op == OP_GE)) {
            op = t->op;
            advance(P);
        } else if (tok_is_name(t, "in")) {
            op = OP_IN;
            advance(P);
        } else if (tok_is_name(t, "not") && tok_is_name(peek(P, 1), "in")) {
            op = OP_NOTIN;
            advance(P);
            advance(P);
        } else {
            break;
        }
        if (n_ops == LLMOPT_ARRAY_LEN(ops)) {
            vec_free(&v);
            fail_at(P, t, LLMOPT_ERR_LIMIT, "too many chained comparisons");
            return NULL;
        }
        ops[n_ops++] = (uint8_t)op;
        struct tpl_node *e = parse_math1(P);
        if (!e || !vec_push(P, &v, e, (struct tpl_str){0})) {
            vec_free(&v);
            return NULL;
        }
    }
    if (n_ops == 0) {
        vec_free(&v);
        return first;
    }
    struct tpl_node *n = new_node(P, N_COMPARE, start);
    if (!n) {
        vec_free(&v);
        return NULL;
    }
    n->ops = arena_alloc(P->arena, n_ops);
    if (!n->ops) {
        vec_free(&v);
        fail_at(P, start, LLMOPT_ERR_NOMEM, "out of memory");
        return NULL;
    }
    memcpy(n->ops, ops, n_ops);
    return vec_to_args(P, &v, n) ? n : NULL;
}

static struct tpl_node *parse_concat(struct parser *P) {
    const struct tpl_token *start = cur(P);
    struct tpl_node *first = parse_math2(P);
    if (!first || !tok_is_op(cur(P), OP_TILDE)) return first;
    struct node_vec v = {0};
    if (!vec_push(P, &v, first, (struct tpl_str){0})) return NULL;
    while (tok_is_op(cur(P), OP_TILDE)) {
        advance(P);
        struct tpl_node *e = parse_math2(P);
        if (!e || !vec_push(P, &v, e, (struct tpl_str){0})) {
            vec_free(&v);
            return NULL;
        }
    }
    struct tpl_node *n = new_node(P, N_CONCAT, start);
    if (!n) {
        vec_free(&v);
        return NULL;
    }
    return vec_to_args(P, &v, n) ? n : NULL;
}

static struct tpl_node *parse_unary(struct parser *P, bool with_filter) {
    const struct tpl_token *t = cur(P);
    struct tpl_node *node;
    if (tok_is_op(t, OP_SUB) || tok_is_op(t, OP_ADD)) {
        if (++P->depth > TPL_MAX_NESTING) {
            fail_at(P, t, LLMOPT_ERR_LIMIT, "expression nested deeper than %d", TPL_MAX_NESTING);
            return NULL;
        }
        advance(P);
        struct tpl_node *inner = parse_unary(P, false);
        P->depth--;
        if (!inner) return NULL;
        node = new_node(P, t->op == OP_SUB ? N_NEG : N_POS, t);
        if (!node) return NULL;
        node->a = inner;
    } else {
        node = parse_primary(P);
    }
    node = parse_postfix(P, node);
    if (with_filter) node = parse_filter_expr(P, node);
    return node;
}

/* Call arguments after '(' : positional, then name=value; ends after ')'. */
static bool parse_call_args(struct parser *P, struct tpl_node *node) {
    struct node_vec v = {0};
    bool seen_kw = false;
    advance(P); /* ( */
    for (;;) {
        if (v.len) {
            if (tok_is_op(cur(P), OP_RPAREN)) break;
            if (!tok_is_op(cur(P), OP_COMMA)) {
                vec_free(&v);
                return fail_expected(P, "',' or ')'");
            }
            advance(P);
        }
        if (tok_is_op(cur(P), OP_RPAREN)) break;
        if (tok_is_op(cur(P), OP_MUL) || tok_is_op(cur(P), OP_POW)) {
            vec_free(&v);
            return fail_at(P, cur(P), LLMOPT_ERR_UNSUPPORTED, "*args / **kwargs in calls are not supported");
        }
        struct tpl_str kw = {0};
        if (cur(P)->kind == TK_NAME && tok_is_op(peek(P, 1), OP_ASSIGN)) {
            kw = cur(P)->text;
            advance(P);
            advance(P);
            seen_kw = true;
        } else if (seen_kw) {
            vec_free(&v);
            return fail_at(P, cur(P), LLMOPT_ERR_FORMAT, "positional argument follows keyword argument");
        }
        struct tpl_node *e = parse_expression(P, true);
        if (!e || !vec_push(P, &v, e, kw)) {
            vec_free(&v);
            return false;
        }
    }
    advance(P); /* ) */
    return vec_to_args(P, &v, node);
}

static struct tpl_node *parse_subscribed(struct parser *P) {
    const struct tpl_token *start = cur(P);
    struct tpl_node *parts[3] = {NULL, NULL, NULL};
    if (tok_is_op(cur(P), OP_COLON)) {
        advance(P);
    } else {
        struct tpl_node *e = parse_expression(P, true);
        if (!e) return NULL;
        if (!tok_is_op(cur(P), OP_COLON)) return e;
        advance(P);
        parts[0] = e;
    }
    if (!tok_is_op(cur(P), OP_COLON) && !tok_is_op(cur(P), OP_RBRACKET) && !tok_is_op(cur(P), OP_COMMA)) {
        if (!(parts[1] = parse_expression(P, true))) return NULL;
    }
    if (tok_is_op(cur(P), OP_COLON)) {
        advance(P);
        if (!tok_is_op(cur(P), OP_RBRACKET) && !tok_is_op(cur(P), OP_COMMA))
            if (!(parts[2] = parse_expression(P, true))) return NULL;
    }
    struct tpl_node *n = new_node(P, N_SLICE, start);
    if (!n) return NULL;
    n->args = arena_alloc(P->arena, 3 * sizeof *n->args);
    if (!n->args) {
        fail_at(P, start, LLMOPT_ERR_NOMEM, "out of memory");
        return NULL;
    }
    memcpy(n->args, parts, sizeof parts);
    n->n_args = 3;
    return n;
}

static struct tpl_node *parse_postfix(struct parser *P, struct tpl_node *node) {
    while (node) {
        const struct tpl_token *t = cur(P);
        if (tok_is_op(t, OP_DOT)) {
            advance(P);
            const struct tpl_token *a = cur(P);
            if (a->kind == TK_NAME) {
                struct tpl_node *n = new_node(P, N_GETATTR, t);
                if (!n) return NULL;
                n->a = node;
                n->name = a->text;
                advance(P);
                node = n;
            } else if (a->kind == TK_INT) {
                struct tpl_node *idx = new_node(P, N_CONST, a), *n = new_node(P, N_GETITEM, t);
                if (!idx || !n) return NULL;
                idx->lit = tpl_int(a->ival);
                n->a = node;
                n->b = idx;
                advance(P);
                node = n;
            } else {
                fail_expected(P, "an attribute name after '.'");
                return NULL;
            }
        } else if (tok_is_op(t, OP_LBRACKET)) {
            advance(P);
            struct node_vec v = {0};
            for (;;) {
                if (v.len) {
                    if (!tok_is_op(cur(P), OP_COMMA)) break;
                    advance(P);
                    if (tok_is_op(cur(P), OP_RBRACKET)) break;
                }
                struct tpl_node *e = parse_subscribed(P);
                if (!e || !vec_push(P, &v, e, (struct tpl_str){0})) {
                    vec_free(&v);
                    return NULL;
                }
            }
            if (!tok_is_op(cur(P), OP_RBRACKET)) {
                vec_free(&v);
                fail_expected(P, "']'");
                return NULL;
            }
            advance(P);
            if (v.len == 1 && v.items[0]->kind == N_SLICE) {
                struct tpl_node *s = v.items[0];
                vec_free(&v);
                s->a = node;
                node = s;
                continue;
            }
            for (size_t k = 0; v.len > 1 && k < v.len; k++)
                if (v.items[k]->kind == N_SLICE) {
                    const struct tpl_node *sl = v.items[k];
                    vec_free(&v);
                    struct tpl_token at_tok = {.line = sl->line, .col = sl->col};
                    fail_at(P, &at_tok, LLMOPT_ERR_UNSUPPORTED, "a slice inside a tuple subscript (x[a:b, c]) is not supported");
                    return NULL;
                }
            struct tpl_node *idx;
            if (v.len == 1) {
                idx = v.items[0];
                vec_free(&v);
            } else {
                idx = new_node(P, N_TUPLE, t);
                if (!idx || !vec_to_args(P, &v, idx)) {
                    vec_free(&v);
                    return NULL;
                }
            }
            struct tpl_node *n = new_node(P, N_GETITEM, t);
            if (!n) return NULL;
            n->a = node;
            n->b = idx;
            node = n;
        } else if (tok_is_op(t, OP_LPAREN)) {
            struct tpl_node *n = new_node(P, N_CALL, t);
            if (!n) return NULL;
            n->a = node;
            n->line = node->line; /* errors of a call point at what is called */
            n->col = node->col;
            if (!parse_call_args(P, n)) return NULL;
            node = n;
        } else {
            break;
        }
    }
    return node;
}

/* A node `kind` at `at` over `input`, named by the name token at cur(P) (consumed);
 * `expected` says what was wanted when there is none. */
static struct tpl_node *name_node(struct parser *P, enum tpl_node_kind kind, const struct tpl_token *at,
                                  struct tpl_node *input, const char *expected) {
    const struct tpl_token *t = cur(P);
    if (t->kind != TK_NAME) {
        fail_expected(P, expected);
        return NULL;
    }
    struct tpl_node *n = new_node(P, kind, at);
    if (!n) return NULL;
    n->a = input;
    n->name = t->text;
    advance(P);
    return n;
}

/* Resolves n->name through `lookup` (tpl_filter_lookup or tpl_test_lookup) into n->op;
 * an unknown or unsupported name is an error at `t` naming `what` ("filter", "test"). */
static bool resolve_name(struct parser *P, const struct tpl_token *t, struct tpl_node *n,
                         int (*lookup)(struct tpl_str name, bool *known), const char *what) {
    bool known = false;
    n->op = lookup(n->name, &known);
    if (n->op >= 0) return true;
    fail_at(P, t, LLMOPT_ERR_UNSUPPORTED, known ? "%s '%.*s' is not supported by llmopt" : "unknown %s '%.*s'",
            what, (int)(n->name.len > 60 ? 60 : n->name.len), n->name.ptr);
    return false;
}

/* A filter name (dotted names allowed) and optional call arguments; input may be
 * NULL for {% filter %} / {% set x | f %} chains. */
static struct tpl_node *parse_filter(struct parser *P, struct tpl_node *input) {
    const struct tpl_token *t = cur(P); /* the name */
    struct tpl_node *n = name_node(P, N_FILTER, t, input, "a filter name");
    if (!n) return NULL;
    if (tok_is_op(cur(P), OP_DOT)) {
        fail_at(P, t, LLMOPT_ERR_UNSUPPORTED, "dotted filter names are not supported");
        return NULL;
    }
    if (!resolve_name(P, t, n, tpl_filter_lookup, "filter")) return NULL;
    if (tok_is_op(cur(P), OP_LPAREN) && !parse_call_args(P, n)) return NULL;
    return n;
}

static struct tpl_node *parse_test(struct parser *P, struct tpl_node *input) {
    const struct tpl_token *is_tok = cur(P);
    advance(P); /* is */
    bool negated = false;
    if (tok_is_name(cur(P), "not")) {
        negated = true;
        advance(P);
    }
    const struct tpl_token *t = cur(P); /* the name */
    struct tpl_node *n = name_node(P, N_TEST, is_tok, input, "a test name after 'is'");
    if (!n) return NULL;
    if (!resolve_name(P, t, n, tpl_test_lookup, "test")) return NULL;
    const struct tpl_token *a = cur(P);
    if (tok_is_op(a, OP_LPAREN)) {
        if (!parse_call_args(P, n)) return NULL;
    } else if ((a->kind == TK_NAME || a->kind == TK_STRING || a->kind == TK_INT || a->kind == TK_FLOAT ||
                tok_is_op(a, OP_LBRACKET) || tok_is_op(a, OP_LBRACE)) &&
               !tok_is_name(a, "else") && !tok_is_name(a, "or") && !tok_is_name(a, "and")) {
        if (tok_is_name(a, "is")) {
            fail_at(P, a, LLMOPT_ERR_FORMAT, "you cannot chain multiple tests with 'is'");
            return NULL;
        }
        struct tpl_node *arg = parse_postfix(P, parse_primary(P));
        if (!arg) return NULL;
        n->args = arena_alloc(P->arena, sizeof *n->args);
        if (!n->args) {
            fail_at(P, a, LLMOPT_ERR_NOMEM, "out of memory");
            return NULL;
        }
        n->args[0] = arg;
        n->n_args = 1;
    }
    if (negated) {
        struct tpl_node *x = new_node(P, N_NOT, is_tok);
        if (!x) return NULL;
        x->a = n;
        return x;
    }
    return n;
}

static struct tpl_node *parse_filter_expr(struct parser *P, struct tpl_node *node) {
    while (node) {
        if (tok_is_op(cur(P), OP_PIPE)) {
            advance(P);
            node = parse_filter(P, node);
        } else if (tok_is_name(cur(P), "is")) {
            node = parse_test(P, node);
        } else if (tok_is_op(cur(P), OP_LPAREN)) {
            struct tpl_node *n = new_node(P, N_CALL, cur(P));
            if (!n) return NULL;
            n->a = node;
            if (!parse_call_args(P, n)) return NULL;
            node = n;
        } else {
            break;
        }
    }
    return node;
}

static struct tpl_node *parse_primary(struct parser *P) {
    const struct tpl_token *t = cur(P);
    struct tpl_node *n;
    switch ((enum tpl_tok_kind)t->kind) {
    case TK_NAME:
        if (tok_is_name(t, "true") || tok_is_name(t, "True") || tok_is_name(t, "false") ||
            tok_is_name(t, "False")) {
            if (!(n = new_node(P, N_CONST, t))) return NULL;
            n->lit = tpl_bool(t->text.ptr[0] == 't' || t->text.ptr[0] == 'T');
        } else if (tok_is_name(t, "none") || tok_is_name(t, "None")) {
            if (!(n = new_node(P, N_CONST, t))) return NULL;
            n->lit = tpl_none();
        } else {
            if (!(n = new_node(P, N_NAME, t))) return NULL;
            n->name = t->text;
        }
        advance(P);
        return n;
    case TK_STRING: {
        /* Adjacent literals concatenate ("a" "b"). */
        size_t total = 0, k = P->pos;
        while (k < P->n && P->toks[k].kind == TK_STRING) total += P->toks[k++].text.len;
        if (!(n = new_node(P, N_CONST, t))) return NULL;
        if (k == P->pos + 1) {
            n->lit = tpl_strv(t->text);
            advance(P);
            return n;
        }
        char *buf = arena_alloc(P->arena, total + 1);
        if (!buf) {
            fail_at(P, t, LLMOPT_ERR_NOMEM, "out of memory");
            return NULL;
        }
        size_t off = 0;
        while (cur(P)->kind == TK_STRING) {
            memcpy(buf + off, cur(P)->text.ptr, cur(P)->text.len);
            off += cur(P)->text.len;
            advance(P);
        }
        n->lit = tpl_strv((struct tpl_str){buf, total});
        return n;
    }
    case TK_INT:
    case TK_FLOAT:
        if (!(n = new_node(P, N_CONST, t))) return NULL;
        n->lit = t->kind == TK_INT ? tpl_int(t->ival) : tpl_float(t->fval);
        advance(P);
        return n;
    case TK_OP:
        if (t->op == OP_LPAREN) {
            advance(P);
            n = parse_tuple(P, true, NULL, true);
            if (!n) return NULL;
            if (!tok_is_op(cur(P), OP_RPAREN)) {
                fail_expected(P, "')'");
                return NULL;
            }
            advance(P);
            return n;
        }
        if (t->op == OP_LBRACKET || t->op == OP_LBRACE) {
            bool is_dict = t->op == OP_LBRACE;
            enum tpl_op close = is_dict ? OP_RBRACE : OP_RBRACKET;
            advance(P);
            struct node_vec v = {0};
            for (;;) {
                if (v.len) {
                    if (!tok_is_op(cur(P), OP_COMMA)) break;
                    advance(P);
                }
                if (tok_is_op(cur(P), close)) break;
                struct tpl_node *e = parse_expression(P, true);
                if (!e || !vec_push(P, &v, e, (struct tpl_str){0})) {
                    vec_free(&v);
                    return NULL;
                }
                if (is_dict) {
                    if (!tok_is_op(cur(P), OP_COLON)) {
                        vec_free(&v);
                        fail_expected(P, "':' in a dict literal");
                        return NULL;
                    }
                    advance(P);
                    e = parse_expression(P, true);
                    if (!e || !vec_push(P, &v, e, (struct tpl_str){0})) {
                        vec_free(&v);
                        return NULL;
                    }
                }
            }
            if (!tok_is_op(cur(P), close)) {
                vec_free(&v);
                fail_expected(P, is_dict ? "',' or '}'" : "',' or ']'");
                return NULL;
            }
            advance(P);
            if (!(n = new_node(P, is_dict ? N_DICT : N_LIST, t)) || !vec_to_args(P, &v, n)) {
                vec_free(&v);
                return NULL;
            }
            return n;
        }
        break;
    default: break;
    }
    fail_expected(P, "an expression");
    return NULL;
}

/* ---- statements --------------------------------------------------------------------- */

static bool expect_block_end(struct parser *P) {
    if (tok_is_op(cur(P), OP_COLON)) advance(P); /* Jinja tolerates {% if x: %} */
    if (cur(P)->kind != TK_BLOCK_END) return fail_expected(P, "end of statement block '%}'");
    advance(P);
    return true;
}

/* The statements up to a {% tag %} named in end_tags (NULL-terminated). On success
 * P->pos is at that tag's name. opener: the tag that opened the block, for errors. */
static bool parse_body(struct parser *P, struct tpl_body *body, const char *const *end_tags,
                       const struct tpl_token *opener);

static bool parse_targets(struct parser *P, struct tpl_node *n, bool allow_attr, const char *end_name) {
    struct tpl_str names[32];
    size_t count = 0;
    bool parens = false;
    if (tok_is_op(cur(P), OP_LPAREN)) {
        parens = true;
        advance(P);
    }
    for (;;) {
        const struct tpl_token *t = cur(P);
        if (t->kind != TK_NAME) return fail_expected(P, "a variable name");
        if (count == LLMOPT_ARRAY_LEN(names)) return fail_at(P, t, LLMOPT_ERR_LIMIT, "too many assignment targets");
        names[count++] = t->text;
        advance(P);
        if (allow_attr && count == 1 && !parens && tok_is_op(cur(P), OP_DOT)) {
            advance(P);
            if (cur(P)->kind != TK_NAME) return fail_expected(P, "an attribute name");
            n->name = cur(P)->text;
            n->op = 1;
            advance(P);
            break;
        }
        if (!tok_is_op(cur(P), OP_COMMA)) break;
        advance(P);
        n->tuple_target = true;
        if ((parens && tok_is_op(cur(P), OP_RPAREN)) || (end_name && tok_is_name(cur(P), end_name))) break;
    }
    if (parens) {
        if (!tok_is_op(cur(P), OP_RPAREN)) return fail_expected(P, "')'");
        advance(P);
        n->tuple_target = n->tuple_target || count > 1;
    }
    n->targets = arena_alloc(P->arena, count * sizeof *n->targets);
    if (!n->targets) return fail_at(P, cur(P), LLMOPT_ERR_NOMEM, "out of memory");
    memcpy(n->targets, names, count * sizeof *names);
    n->n_targets = count;
    return true;
}

/* A filter chain for {% filter %} / {% set x | f %}: returns the outermost filter. */
static struct tpl_node *parse_filter_chain(struct parser *P) {
    struct tpl_node *node = parse_filter(P, NULL);
    while (node && tok_is_op(cur(P), OP_PIPE)) {
        advance(P);
        node = parse_filter(P, node);
    }
    return node;
}

static struct tpl_node *parse_statement(struct parser *P);

/* The body of block n (opened by t) up to its one end tag `end` ("endset", ...), then
 * the end tag's closing '%}'; n, or NULL on an error. */
static struct tpl_node *parse_block_body(struct parser *P, struct tpl_node *n, const struct tpl_token *t,
                                         const char *end) {
    const char *const ends[] = {end, NULL};
    if (!parse_body(P, &n->body, ends, t)) return NULL;
    advance(P);
    return expect_block_end(P) ? n : NULL;
}

static bool parse_body(struct parser *P, struct tpl_body *body, const char *const *end_tags,
                       const struct tpl_token *opener) {
    struct node_vec v = {0};
    if (++P->depth > TPL_MAX_NESTING) return fail_at(P, cur(P), LLMOPT_ERR_LIMIT, "blocks nested deeper than %d", TPL_MAX_NESTING);
    for (;;) {
        const struct tpl_token *t = cur(P);
        struct tpl_node *n = NULL;
        if (t->kind == TK_EOF) {
            if (end_tags) {
                char want[128] = "";
                size_t off = 0;
                for (const char *const *e = end_tags; *e && off < sizeof want - 40; e++)
                    off += (size_t)snprintf(want + off, sizeof want - off, "%s'%s'", off ? " or " : "", *e);
                vec_free(&v);
                return fail_at(P, t, LLMOPT_ERR_FORMAT,
                               "unexpected end of template: the '%.*s' block opened at %u:%u is never closed "
                               "(expected %s)",
                               (int)opener->text.len, opener->text.ptr, opener->line, opener->col, want);
            }
            break;
        }
        if (t->kind == TK_DATA) {
            if (!(n = new_node(P, N_TEXT, t))) goto fail;
            n->name = t->text;
            advance(P);
        } else if (t->kind == TK_VAR_BEGIN) {
            advance(P);
            if (!(n = new_node(P, N_OUTPUT, t))) goto fail;
            if (!(n->a = parse_tuple(P, true, NULL, false))) goto fail;
            if (cur(P)->kind != TK_VAR_END) {
                fail_expected(P, "end of print statement '}}'");
                goto fail;
            }
            advance(P);
        } else if (t->kind == TK_BLOCK_BEGIN) {
            const struct tpl_token *name = peek(P, 1);
            if (name->kind != TK_NAME) {
                advance(P);
                fail_expected(P, "a statement name after '{%'");
                goto fail;
            }
            bool is_end = false;
            for (const char *const *e = end_tags; e && *e; e++)
                if (tok_is_name(name, *e)) is_end = true;
            if (is_end) {
                advance(P); /* to the name */
                break;
            }
            advance(P);
            if (!(n = parse_statement(P))) goto fail;
        } else {
            char got[96];
            describe(t, got, sizeof got);
            fail_at(P, t, LLMOPT_ERR_FORMAT, "unexpected %s", got);
            goto fail;
        }
        if (!vec_push(P, &v, n, (struct tpl_str){0})) goto fail;
    }
    P->depth--;
    body->len = v.len;
    if (v.len) {
        body->items = arena_alloc(P->arena, v.len * sizeof *body->items);
        if (!body->items) {
            vec_free(&v);
            return fail_at(P, cur(P), LLMOPT_ERR_NOMEM, "out of memory");
        }
        memcpy(body->items, v.items, v.len * sizeof *body->items);
    }
    vec_free(&v);
    return true;
fail:
    vec_free(&v);
    return false;
}

static struct tpl_node *parse_if(struct parser *P, const struct tpl_token *opener) {
    struct tpl_node *n = new_node(P, N_IF, opener);
    if (!n) return NULL;
    advance(P); /* if / elif */
    if (!(n->a = parse_tuple(P, false, NULL, false)) || !expect_block_end(P)) return NULL;
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    if (!parse_body(P, &n->body, ends, opener)) return NULL;
    const struct tpl_token *end = cur(P);
    if (tok_is_name(end, "elif")) {
        struct tpl_node *elif = parse_if(P, end);
        if (!elif) return NULL;
        n->else_body.items = arena_alloc(P->arena, sizeof *n->else_body.items);
        if (!n->else_body.items) return NULL;
        n->else_body.items[0] = elif;
        n->else_body.len = 1;
        return n; /* the nested if consumed the endif */
    }
    if (tok_is_name(end, "else")) {
        advance(P);
        if (!expect_block_end(P)) return NULL;
        static const char *const ends2[] = {"endif", NULL};
        if (!parse_body(P, &n->else_body, ends2, opener)) return NULL;
    }
    advance(P); /* endif */
    return expect_block_end(P) ? n : NULL;
}

static struct tpl_node *parse_statement(struct parser *P) {
    const struct tpl_token *t = cur(P); /* the statement's name */
    struct tpl_node *n = NULL;
    if (tok_is_name(t, "if")) return parse_if(P, t);
    if (tok_is_name(t, "for")) {
        if (!(n = new_node(P, N_FOR, t))) return NULL;
        advance(P);
        if (!parse_targets(P, n, false, "in")) return NULL;
        if (!tok_is_name(cur(P), "in")) {
            fail_expected(P, "'in'");
            return NULL;
        }
        advance(P);
        if (!(n->a = parse_tuple(P, false, "recursive", false))) return NULL;
        if (tok_is_name(cur(P), "if")) {
            advance(P);
            if (!(n->b = parse_expression(P, true))) return NULL;
        }
        if (tok_is_name(cur(P), "recursive")) {
            fail_at(P, cur(P), LLMOPT_ERR_UNSUPPORTED, "recursive for loops are not supported");
            return NULL;
        }
        if (!expect_block_end(P)) return NULL;
        static const char *const ends[] = {"endfor", "else", NULL};
        P->loop_depth++;
        if (!parse_body(P, &n->body, ends, t)) return NULL;
        P->loop_depth--;
        if (tok_is_name(cur(P), "else")) {
            advance(P);
            if (!expect_block_end(P)) return NULL;
            static const char *const ends2[] = {"endfor", NULL};
            if (!parse_body(P, &n->else_body, ends2, t)) return NULL;
        }
        advance(P); /* endfor */
        return expect_block_end(P) ? n : NULL;
    }
    if (tok_is_name(t, "set")) {
        if (!(n = new_node(P, N_SET, t))) return NULL;
        advance(P);
        if (!parse_targets(P, n, true, NULL)) return NULL;
        if (tok_is_op(cur(P), OP_ASSIGN)) {
            advance(P);
            if (!(n->a = parse_tuple(P, true, NULL, false))) return NULL;
            return expect_block_end(P) ? n : NULL;
        }
        if (n->op == 1 || n->tuple_target) {
            fail_expected(P, "'='");
            return NULL;
        }
        n->kind = N_SET_BLOCK;
        if (tok_is_op(cur(P), OP_PIPE)) {
            advance(P);
            if (!(n->a = parse_filter_chain(P))) return NULL;
        }
        if (!expect_block_end(P)) return NULL;
        return parse_block_body(P, n, t, "endset");
    }
    if (tok_is_name(t, "macro")) {
        if (!(n = new_node(P, N_MACRO, t))) return NULL;
        advance(P);
        if (cur(P)->kind != TK_NAME) {
            fail_expected(P, "a macro name");
            return NULL;
        }
        n->name = cur(P)->text;
        advance(P);
        if (!tok_is_op(cur(P), OP_LPAREN)) {
            fail_expected(P, "'(' after the macro name");
            return NULL;
        }
        advance(P);
        struct tpl_str names[64];
        struct tpl_node *defaults[64];
        size_t count = 0;
        while (!tok_is_op(cur(P), OP_RPAREN)) {
            if (count) {
                if (!tok_is_op(cur(P), OP_COMMA)) {
                    fail_expected(P, "',' or ')'");
                    return NULL;
                }
                advance(P);
                if (tok_is_op(cur(P), OP_RPAREN)) break;
            }
            if (cur(P)->kind != TK_NAME) {
                fail_expected(P, "a parameter name");
                return NULL;
            }
            if (count == LLMOPT_ARRAY_LEN(names)) {
                fail_at(P, cur(P), LLMOPT_ERR_LIMIT, "too many macro parameters");
                return NULL;
            }
            names[count] = cur(P)->text;
            defaults[count] = NULL;
            advance(P);
            if (tok_is_op(cur(P), OP_ASSIGN)) {
                advance(P);
                if (!(defaults[count] = parse_expression(P, true))) return NULL;
            } else if (count && defaults[count - 1]) {
                fail_at(P, cur(P), LLMOPT_ERR_FORMAT, "non-default argument follows default argument");
                return NULL;
            }
            count++;
        }
        advance(P); /* ) */
        n->targets = arena_alloc(P->arena, (count + 1) * sizeof *n->targets);
        n->args = arena_alloc(P->arena, (count + 1) * sizeof *n->args);
        if (!n->targets || !n->args) return NULL;
        memcpy(n->targets, names, count * sizeof *names);
        memcpy(n->args, defaults, count * sizeof *defaults);
        n->n_targets = n->n_args = count;
        if (!expect_block_end(P)) return NULL;
        int saved = P->loop_depth;
        P->loop_depth = 0;
        static const char *const ends[] = {"endmacro", NULL};
        if (!parse_body(P, &n->body, ends, t)) return NULL;
        P->loop_depth = saved;
        advance(P);
        if (cur(P)->kind == TK_NAME) advance(P); /* {% endmacro name %} */
        return expect_block_end(P) ? n : NULL;
    }
    if (tok_is_name(t, "break") || tok_is_name(t, "continue")) {
        if (P->loop_depth == 0) {
            fail_at(P, t, LLMOPT_ERR_FORMAT, "'%.*s' outside a for loop", (int)t->text.len, t->text.ptr);
            return NULL;
        }
        if (!(n = new_node(P, t->text.ptr[0] == 'b' ? N_BREAK : N_CONTINUE, t))) return NULL;
        advance(P);
        return expect_block_end(P) ? n : NULL;
    }
    if (tok_is_name(t, "filter")) {
        if (!(n = new_node(P, N_FILTER_BLOCK, t))) return NULL;
        advance(P);
        if (!(n->a = parse_filter_chain(P)) || !expect_block_end(P)) return NULL;
        return parse_block_body(P, n, t, "endfilter");
    }
    if (tok_is_name(t, "with")) {
        if (!(n = new_node(P, N_WITH, t))) return NULL;
        advance(P);
        struct tpl_str names[32];
        struct tpl_node *vals[32];
        size_t count = 0;
        while (cur(P)->kind != TK_BLOCK_END) {
            if (count) {
                if (!tok_is_op(cur(P), OP_COMMA)) {
                    fail_expected(P, "','");
                    return NULL;
                }
                advance(P);
            }
            if (cur(P)->kind != TK_NAME || count == LLMOPT_ARRAY_LEN(names)) {
                fail_expected(P, "a variable name");
                return NULL;
            }
            names[count] = cur(P)->text;
            advance(P);
            if (!tok_is_op(cur(P), OP_ASSIGN)) {
                fail_expected(P, "'='");
                return NULL;
            }
            advance(P);
            if (!(vals[count] = parse_expression(P, true))) return NULL;
            count++;
        }
        n->targets = arena_alloc(P->arena, (count + 1) * sizeof *n->targets);
        n->args = arena_alloc(P->arena, (count + 1) * sizeof *n->args);
        if (!n->targets || !n->args) return NULL;
        memcpy(n->targets, names, count * sizeof *names);
        memcpy(n->args, vals, count * sizeof *vals);
        n->n_targets = n->n_args = count;
        if (!expect_block_end(P)) return NULL;
        return parse_block_body(P, n, t, "endwith");
    }
    if (tok_is_name(t, "generation")) {
        /* transformers' AssistantTracker: marks assistant text for masks; renders its body. */
        if (!(n = new_node(P, N_SCOPE, t))) return NULL;
        advance(P);
        if (!expect_block_end(P)) return NULL;
        return parse_block_body(P, n, t, "endgeneration");
    }
    static const char *const unsupported[] = {"include", "import", "from", "extends", "block", "call",
                                              "do", "autoescape", "trans", "pluralize", "raw", NULL};
    for (const char *const *u = unsupported; *u; u++)
        if (tok_is_name(t, *u)) {
            fail_at(P, t, LLMOPT_ERR_UNSUPPORTED, "'{%% %s %%}' is not supported by llmopt's template interpreter", *u);
            return NULL;
        }
    if (t->text.len > 3 && memcmp(t->text.ptr, "end", 3) == 0) {
        fail_at(P, t, LLMOPT_ERR_FORMAT, "unexpected '{%% %.*s %%}' (no open block to close)", (int)t->text.len, t->text.ptr);
        return NULL;
    }
    if (tok_is_name(t, "else") || tok_is_name(t, "elif")) {
        fail_at(P, t, LLMOPT_ERR_FORMAT, "unexpected '{%% %.*s %%}' outside an if or for block", (int)t->text.len, t->text.ptr);
        return NULL;
    }
    fail_at(P, t, LLMOPT_ERR_UNSUPPORTED, "unknown tag '%.*s'", (int)(t->text.len > 60 ? 60 : t->text.len), t->text.ptr);
    return NULL;
}

enum llmopt_status tpl_parse(const char *src, size_t len, const char *name,
                             struct tpl_template **out, struct llmopt_err *err) {
    *out = NULL;
    if (!name) name = "template";
    if (len > TPL_MAX_SOURCE)
        return err_set(err, LLMOPT_ERR_LIMIT, "%s: template of %zu bytes exceeds the %u byte limit", name, len, TPL_MAX_SOURCE);
    struct tpl_template *t = calloc(1, sizeof *t);
    if (!t) return err_set(err, LLMOPT_ERR_NOMEM, "out of memory");
    arena_init(&t->arena);
    t->name = arena_strndup(&t->arena, name, strlen(name));
    /* Newlines normalized to \n; one trailing newline dropped (keep_trailing_newline=False). */
    char *s = arena_alloc(&t->arena, len + 1);
    if (!t->name || !s) {
        tpl_free(t);
        return err_set(err, LLMOPT_ERR_NOMEM, "out of memory");
    }
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = 0;
    struct tpl_token_list toks = {0};
    enum llmopt_status st = tpl_lex(s, n, t->name, &t->arena, &toks, err);
    if (st) {
        tpl_free(t);
        return st;
    }
    struct parser P = {.toks = toks.items, .n = toks.len, .arena = &t->arena, .name = t->name, .err = err};
    if (!parse_body(&P, &t->root, NULL, NULL)) {
        st = err->status ? err->status : LLMOPT_ERR_FORMAT;
        tpl_free(t);
        return st;
    }
    *out = t;
    return LLMOPT_OK;
}

void tpl_free(struct tpl_template *t) {
    if (!t) return;
    arena_free(&t->arena);
    free(t);
}
