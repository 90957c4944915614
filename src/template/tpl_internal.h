/* Internals of the template interpreter: values, tokens, AST nodes and the render
 * state shared by lex.c, parse.c, value.c, eval.c and builtins.c.
 *
 * Values follow Python's data model as Jinja2 sees it: none, bool, int (64-bit here),
 * float, str (UTF-8, indexed by code point), list/tuple, dict (insertion-ordered),
 * plus Jinja's undefined, namespaces, macros, bound builtins and the loop object.
 * Everything a render allocates lives in one arena freed when the render ends, so
 * values are plain structs that share their payloads freely. Lists and dicts never
 * change once built (the sandbox transformers uses forbids mutation); only namespace
 * attributes and scope frames are written. */
#ifndef LLMOPT_TEMPLATE_TPL_INTERNAL_H
#define LLMOPT_TEMPLATE_TPL_INTERNAL_H

#include "base/arena.h"
#include "template/template.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A string slice: not NUL-terminated, valid UTF-8 in practice (invalid bytes are
 * treated as one code point each). */
struct tpl_str {
    const char *ptr;
    size_t len;
};

#define TPL_STR_LIT(s) ((struct tpl_str){(s), sizeof(s) - 1})

bool tpl_str_eq(struct tpl_str a, struct tpl_str b);
bool tpl_str_eqc(struct tpl_str a, const char *c);

/* ---- values ------------------------------------------------------------------- */

enum tpl_type {
    TPL_UNDEFINED,
    TPL_NONE,
    TPL_BOOL,
    TPL_INT,
    TPL_FLOAT,
    TPL_STR,
    TPL_LIST,      /* also tuples (TPL_F_TUPLE) */
    TPL_DICT,
    TPL_NAMESPACE, /* a dict whose entries are attributes, assignable with set */
    TPL_MACRO,
    TPL_FUNC,      /* a builtin function or a method bound to a value */
    TPL_LOOP,
    TPL_TYPE_COUNT
};
const char *tpl_type_name(enum tpl_type type); /* Python's: "str", "dict", ... */

#define TPL_F_MARKUP 1u /* str: Markup (from |safe or |escape); + escapes the other side */
#define TPL_F_TUPLE 2u  /* list: a tuple (printed with parentheses) */

struct tpl_list;
struct tpl_dict;
struct tpl_macro;
struct tpl_func;
struct tpl_loop;

struct tpl_value {
    uint8_t type; /* enum tpl_type */
    uint8_t flags;
    union {
        bool b;
        int64_t i;
        double f;
        struct tpl_str s;       /* TPL_STR; TPL_UNDEFINED: why it is undefined (may be empty) */
        struct tpl_list *list;  /* TPL_LIST */
        struct tpl_dict *dict;  /* TPL_DICT, TPL_NAMESPACE */
        struct tpl_macro *macro;
        const struct tpl_func *func;
        struct tpl_loop *loop;
    } u;
};

struct tpl_list {
    size_t len;
    struct tpl_value items[]; /* (len) */
};

/* Insertion-ordered; string keys are also indexed by a hash table once len > 8. */
struct tpl_dict {
    size_t len, cap;
    struct tpl_value *keys, *vals; /* (cap) */
    uint32_t *index;               /* (index_cap) 0 = empty, else entry + 1 */
    size_t index_cap;
};

struct tpl_render;
struct tpl_node;
struct tpl_frame;

struct tpl_macro {
    const struct tpl_node *def; /* N_MACRO */
    struct tpl_frame *closure;  /* where it was defined: free names resolve there at call time */
};

/* A builtin callable (range, namespace, ...) or a method bound to self. */
struct tpl_func {
    int id; /* enum tpl_builtin (builtins.c) */
    struct tpl_value self;
};

struct tpl_loop {
    const struct tpl_value *items; /* (length) */
    size_t length, index0;
};

/* ---- render state --------------------------------------------------------------- */

/* Growable byte buffer with a hard cap (malloc'd). */
struct tpl_buf {
    char *data;
    size_t len, cap, limit;
};

struct tpl_var {
    struct tpl_str name;
    struct tpl_value val;
};

/* A scope: the template's top level, one iteration of a for loop, a macro call. */
struct tpl_frame {
    struct tpl_frame *parent;
    struct tpl_var *vars; /* (cap) */
    uint32_t n, cap;
    bool captured; /* a macro closes over it: do not reuse it for the next iteration */
};

struct tpl_render {
    const struct tpl_template *tpl;
    struct arena arena;
    struct tpl_limits lim;
    uint64_t steps;
    int depth;      /* nested macro / filter calls */
    int eval_depth; /* C recursion of eval / exec */
    struct tpl_buf *out; /* where output goes now (captures push their own) */
    struct llmopt_err *err;
    enum llmopt_status status; /* of the first failure */
};

/* Records an error at node's position ("name:line:col: ..."); returns false. */
bool tpl_fail(struct tpl_render *r, const struct tpl_node *at, enum llmopt_status status,
              const char *fmt, ...) __attribute__((format(printf, 4, 5)));
bool tpl_fail_v(struct tpl_render *r, const struct tpl_node *at, enum llmopt_status status,
                const char *fmt, va_list ap);

/* Arena allocation with the memory cap; NULL (and an error recorded) on failure. */
void *tpl_alloc(struct tpl_render *r, const struct tpl_node *at, size_t size);

/* ---- value constructors and helpers (value.c) ---------------------------------- */

static inline struct tpl_value tpl_undefined(struct tpl_str why) {
    struct tpl_value v = {.type = TPL_UNDEFINED};
    v.u.s = why;
    return v;
}
static inline struct tpl_value tpl_none(void) { return (struct tpl_value){.type = TPL_NONE}; }
static inline struct tpl_value tpl_bool(bool b) {
    struct tpl_value v = {.type = TPL_BOOL};
    v.u.b = b;
    return v;
}
static inline struct tpl_value tpl_int(int64_t i) {
    struct tpl_value v = {.type = TPL_INT};
    v.u.i = i;
    return v;
}
static inline struct tpl_value tpl_float(double f) {
    struct tpl_value v = {.type = TPL_FLOAT};
    v.u.f = f;
    return v;
}
static inline struct tpl_value tpl_strv(struct tpl_str s) {
    struct tpl_value v = {.type = TPL_STR};
    v.u.s = s;
    return v;
}

/* Undefined with a formatted reason ("'x' is undefined"). */
struct tpl_value tpl_undefined_fmt(struct tpl_render *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* A copy of s[0..n) in the arena. */
bool tpl_str_new(struct tpl_render *r, const struct tpl_node *at, const char *s, size_t n,
                 struct tpl_value *out);
struct tpl_list *tpl_list_new(struct tpl_render *r, const struct tpl_node *at, size_t len);
struct tpl_dict *tpl_dict_new(struct tpl_render *r, const struct tpl_node *at, size_t cap);
/* Inserts or replaces (Python dict assignment). */
bool tpl_dict_set(struct tpl_render *r, const struct tpl_node *at, struct tpl_dict *d,
                  struct tpl_value key, struct tpl_value val);
/* Lookup; NULL when absent. */
struct tpl_value *tpl_dict_get(const struct tpl_dict *d, struct tpl_value key);
struct tpl_value *tpl_dict_get_str(const struct tpl_dict *d, struct tpl_str key);

/* JSON (jansson) to a value; depth-capped. */
bool tpl_from_json(struct tpl_render *r, const json_t *j, struct tpl_value *out, int depth);

bool tpl_truthy(struct tpl_value v);
bool tpl_is_number(struct tpl_value v); /* bool, int, float (Python's numbers.Number) */
double tpl_as_double(struct tpl_value v);
/* Python ==. */
bool tpl_equal(struct tpl_value a, struct tpl_value b);
/* Python <, for sorting and comparisons: *cmp < 0, 0, > 0; false (and an error at
 * `at`) when the types cannot be ordered. */
bool tpl_compare(struct tpl_render *r, const struct tpl_node *at, struct tpl_value a,
                 struct tpl_value b, int *cmp);

/* Python str() / repr() appended to b. False when the buffer cap is hit. */
bool tpl_buf_put(struct tpl_buf *b, const char *s, size_t n);
bool tpl_buf_putc(struct tpl_buf *b, char c);
bool tpl_buf_printf(struct tpl_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void tpl_buf_free(struct tpl_buf *b);
bool tpl_write_str(struct tpl_buf *b, struct tpl_value v); /* str(v); undefined: "" */
bool tpl_write_repr(struct tpl_buf *b, struct tpl_value v);
/* json.dumps(v, ensure_ascii, indent, separators, sort_keys). indent: NULL for none.
 * On an unserializable value, *bad_type names it and false is returned with b intact. */
struct tpl_json_opts {
    bool ensure_ascii, sort_keys, have_indent;
    struct tpl_str indent; /* used when have_indent */
    struct tpl_str item_sep, key_sep;
};
bool tpl_write_json(struct tpl_render *r, const struct tpl_node *at, struct tpl_buf *b,
                    struct tpl_value v, const struct tpl_json_opts *o, int depth);
/* str(v) as a value in the arena (strings are returned as they are). */
bool tpl_to_str(struct tpl_render *r, const struct tpl_node *at, struct tpl_value v,
                struct tpl_value *out);
/* Python float repr ("1.0", "1e-05"); buf >= 32 bytes; returns length. */
int tpl_fmt_float(double f, char *buf);

/* UTF-8 and Python string helpers. */
uint32_t tpl_utf8_next(const char *s, size_t len, size_t *i); /* decodes at *i, advances */
size_t tpl_utf8_put(uint32_t cp, char *out);                  /* out >= 4 bytes */
size_t tpl_utf8_count(struct tpl_str s);                      /* code points */
/* Byte offset of code point index cp (cp <= count). */
size_t tpl_utf8_offset(struct tpl_str s, size_t cp);
bool tpl_is_space(uint32_t cp); /* Python str.isspace() */
/* Python str.strip family: which = 1 left, 2 right, 3 both; chars NULL = whitespace. */
struct tpl_str tpl_strip(struct tpl_str s, const struct tpl_str *chars, int which);

/* ---- tokens (lex.c) ------------------------------------------------------------- */

enum tpl_tok_kind {
    TK_EOF,
    TK_DATA,
    TK_VAR_BEGIN,
    TK_VAR_END,
    TK_BLOCK_BEGIN,
    TK_BLOCK_END,
    TK_NAME,
    TK_STRING,
    TK_INT,
    TK_FLOAT,
    TK_OP,
    TK_KIND_COUNT
};

enum tpl_op {
    OP_NONE,
    OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_TILDE,
    OP_LBRACKET, OP_RBRACKET, OP_LPAREN, OP_RPAREN, OP_LBRACE, OP_RBRACE,
    OP_EQ, OP_NE, OP_GT, OP_GE, OP_LT, OP_LE, OP_IN, OP_NOTIN,
    OP_ASSIGN, OP_DOT, OP_COLON, OP_PIPE, OP_COMMA, OP_SEMICOLON,
    OP_COUNT
};
const char *tpl_op_text(enum tpl_op op);

struct tpl_token {
    uint8_t kind; /* enum tpl_tok_kind */
    uint8_t op;   /* enum tpl_op for TK_OP */
    uint32_t line, col;
    struct tpl_str text; /* TK_DATA / TK_NAME / TK_STRING (unescaped) */
    int64_t ival;
    double fval;
};

struct tpl_token_list {
    struct tpl_token *items;
    size_t len, cap;
};

/* Tokenizes the (newline-normalized) source; strings and data live in arena. */
enum llmopt_status tpl_lex(const char *src, size_t len, const char *name, struct arena *arena,
                           struct tpl_token_list *out, struct llmopt_err *err);

/* ---- AST (parse.c) --------------------------------------------------------------- */

enum tpl_node_kind {
    /* statements */
    N_TEXT,       /* name = the text */
    N_OUTPUT,     /* {{ a }} */
    N_IF,         /* if a: body else else_body (elif nests an N_IF in else_body) */
    N_FOR,        /* for targets in a [if b]: body else else_body */
    N_SET,        /* set targets = a  |  set a.name = b (op = 1) */
    N_SET_BLOCK,  /* set targets[0] %} body {% endset, filters in args (N_FILTER chain on NULL) */
    N_MACRO,      /* name, params (targets), defaults (args), body */
    N_BREAK,
    N_CONTINUE,
    N_FILTER_BLOCK, /* filter a (an N_FILTER chain whose innermost input is NULL) */
    N_WITH,       /* targets = args: body */
    N_SCOPE,      /* {% generation %}: body in its own scope */
    /* expressions */
    N_CONST,      /* lit */
    N_NAME,       /* name */
    N_GETATTR,    /* a.name */
    N_GETITEM,    /* a[b] */
    N_SLICE,      /* a[args[0]:args[1]:args[2]] (NULL for omitted) */
    N_CALL,       /* a(args, kw) */
    N_FILTER,     /* a | name(args, kw); op = filter id */
    N_TEST,       /* a is name(args, kw); op = test id */
    N_NOT,
    N_NEG,
    N_POS,
    N_BINOP,      /* op: OP_ADD ... OP_POW */
    N_CONCAT,     /* args joined with ~ */
    N_AND,
    N_OR,
    N_COMPARE,    /* args[0] ops[0] args[1] ops[1] args[2] ... */
    N_CONDEXPR,   /* b if a else c (c may be NULL) */
    N_LIST,
    N_TUPLE,
    N_DICT,       /* args: key0, val0, key1, val1, ... */
    N_KIND_COUNT
};

struct tpl_body {
    struct tpl_node **items;
    size_t len;
};

struct tpl_node {
    uint8_t kind; /* enum tpl_node_kind */
    int op;
    uint32_t line, col;
    struct tpl_node *a, *b, *c;
    struct tpl_node **args;    /* (n_args) positional then keyword; NULL entries in slices */
    struct tpl_str *arg_names; /* (n_args) keyword names; len 0 for positional; may be NULL */
    size_t n_args;
    uint8_t *ops;              /* N_COMPARE: (n_args - 1) enum tpl_op */
    struct tpl_str name;
    struct tpl_value lit;      /* N_CONST */
    struct tpl_str *targets;   /* N_FOR / N_SET / N_MACRO / N_WITH names */
    size_t n_targets;
    bool tuple_target;         /* for/set target was written as a tuple */
    struct tpl_body body, else_body;
};

struct tpl_template {
    struct arena arena; /* AST, strings */
    struct tpl_body root;
    char *name;
};

/* ---- builtins (builtins.c) ------------------------------------------------------- */

/* Resolves a filter / test name at parse time: its id, or -1 when unknown; *known
 * is set when Jinja has it but llmopt does not (for a clearer message). */
int tpl_filter_lookup(struct tpl_str name, bool *known);
int tpl_test_lookup(struct tpl_str name, bool *known);
const char *tpl_filter_name(int id);
const char *tpl_test_name(int id);

/* Call arguments as evaluated values. */
struct tpl_args {
    size_t n_pos, n_kw;
    struct tpl_value *pos;      /* (n_pos) */
    struct tpl_str *kw_names;   /* (n_kw) */
    struct tpl_value *kw;       /* (n_kw) */
};

bool tpl_apply_filter(struct tpl_render *r, const struct tpl_node *at, int id,
                      struct tpl_value input, const struct tpl_args *args, struct tpl_value *out);
bool tpl_apply_test(struct tpl_render *r, const struct tpl_node *at, int id,
                    struct tpl_value input, const struct tpl_args *args, bool *out);
/* Globals (range, namespace, dict, raise_exception, strftime_now): false when the
 * name is not one. */
bool tpl_global_lookup(struct tpl_str name, struct tpl_value *out);
/* obj.name for builtin methods (str.split, dict.items, loop.cycle, ...) and
 * attributes of the loop object: true with *out set when found. */
bool tpl_builtin_attr(struct tpl_render *r, const struct tpl_node *at, struct tpl_value obj,
                      struct tpl_str name, struct tpl_value *out);
bool tpl_call_builtin(struct tpl_render *r, const struct tpl_node *at, const struct tpl_func *f,
                      const struct tpl_args *args, struct tpl_value *out);

/* ---- evaluator (eval.c), used by builtins ---------------------------------------- */

bool tpl_getattr(struct tpl_render *r, const struct tpl_node *at, struct tpl_value obj,
                 struct tpl_str name, struct tpl_value *out);
bool tpl_getitem(struct tpl_render *r, const struct tpl_node *at, struct tpl_value obj,
                 struct tpl_value key, struct tpl_value *out);
bool tpl_call_value(struct tpl_render *r, const struct tpl_node *at, struct tpl_value callee,
                    const struct tpl_args *args, struct tpl_value *out);
/* Items of an iterable as an array (list items are shared, not copied). Undefined
 * iterates as empty; none, numbers are errors. */
bool tpl_iterate(struct tpl_render *r, const struct tpl_node *at, struct tpl_value v,
                 const struct tpl_value **items, size_t *n);
/* Counts a unit of work against max_steps. */
bool tpl_step(struct tpl_render *r, const struct tpl_node *at);
/* Binary operators with Python semantics (+ - * / // % **). */
bool tpl_binop(struct tpl_render *r, const struct tpl_node *at, int op, struct tpl_value a,
               struct tpl_value b, struct tpl_value *out);
/* The error message for operations on undefined ("'x' is undefined"). */
bool tpl_fail_undefined(struct tpl_render *r, const struct tpl_node *at, struct tpl_value v);

#endif
