/* Template lexer: splits the source into text and the tokens of {{ }} / {% %} tags,
 * dropping {# #} comments and turning {% raw %} blocks into text.
 *
 * Whitespace follows Jinja2 with transformers' settings:
 *   - "{%-", "{{-", "{#-" strip all whitespace before the tag; "-%}", "-}}", "-#}"
 *     strip all whitespace after it;
 *   - trim_blocks: the first newline after "%}" or "#}" is removed (not after "}}");
 *   - lstrip_blocks: spaces and tabs from the start of a line up to "{%" or "{#" are
 *     removed ("{%+" keeps them);
 *   - "+%}" keeps the newline trim_blocks would remove.
 * The caller has already turned \r\n and \r into \n and dropped one trailing newline
 * (Jinja's keep_trailing_newline=False). */
#include "template/tpl_internal.h"

#include <stdio.h>
#include <string.h>

const char *tpl_op_text(enum tpl_op op) {
    static const char *const text[] = {
        [OP_NONE] = "?",     [OP_ADD] = "+",      [OP_SUB] = "-",      [OP_MUL] = "*",
        [OP_DIV] = "/",      [OP_FLOORDIV] = "//", [OP_MOD] = "%",     [OP_POW] = "**",
        [OP_TILDE] = "~",    [OP_LBRACKET] = "[", [OP_RBRACKET] = "]", [OP_LPAREN] = "(",
        [OP_RPAREN] = ")",   [OP_LBRACE] = "{",   [OP_RBRACE] = "}",   [OP_EQ] = "==",
        [OP_NE] = "!=",      [OP_GT] = ">",       [OP_GE] = ">=",      [OP_LT] = "<",
        [OP_LE] = "<=",      [OP_IN] = "in",      [OP_NOTIN] = "not in", [OP_ASSIGN] = "=",
        [OP_DOT] = ".",      [OP_COLON] = ":",    [OP_PIPE] = "|",     [OP_COMMA] = ",",
        [OP_SEMICOLON] = ";",
    };
    _Static_assert(sizeof text / sizeof text[0] == OP_COUNT, "op names");
    return (unsigned)op < OP_COUNT ? text[op] : "?";
}

struct lexer {
    const char *s;
    size_t len;
    const char *name;
    struct arena *arena;
    struct tpl_token_list *toks;
    struct llmopt_err *err;
    size_t tracked;    /* newlines counted up to here */
    uint32_t line;     /* line of `tracked` */
    size_t line_start; /* offset where that line starts */
};

static void line_col(struct lexer *L, size_t pos, uint32_t *line, uint32_t *col) {
    if (pos < L->tracked) { /* positions only move forward, except in error paths */
        L->tracked = 0;
        L->line = 1;
        L->line_start = 0;
    }
    for (size_t i = L->tracked; i < pos && i < L->len; i++)
        if (L->s[i] == '\n') {
            L->line++;
            L->line_start = i + 1;
        }
    L->tracked = pos;
    *line = L->line;
    *col = (uint32_t)(pos - L->line_start + 1);
}

static enum llmopt_status lex_fail(struct lexer *L, size_t pos, const char *fmt, const char *arg) {
    uint32_t line, col;
    line_col(L, pos, &line, &col);
    char msg[512];
    snprintf(msg, sizeof msg, fmt, arg);
    return err_set(L->err, LLMOPT_ERR_FORMAT, "%s:%u:%u: %s", L->name, line, col, msg);
}

static struct tpl_token *push(struct lexer *L, enum tpl_tok_kind kind, size_t pos) {
    struct tpl_token_list *t = L->toks;
    if (t->len == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 256;
        struct tpl_token *items = arena_alloc(L->arena, cap * sizeof *items);
        if (!items) return NULL;
        if (t->len) memcpy(items, t->items, t->len * sizeof *items);
        t->items = items;
        t->cap = cap;
    }
    struct tpl_token *tok = &t->items[t->len++];
    memset(tok, 0, sizeof *tok);
    tok->kind = (uint8_t)kind;
    line_col(L, pos, &tok->line, &tok->col);
    return tok;
}

/* Length of the Python-\s whitespace character at p, or 0. */
static size_t space_at(const char *s, size_t len, size_t p) {
    if (p >= len) return 0;
    uint8_t c = (uint8_t)s[p];
    if (c < 0x80) return (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) ? 1 : 0;
    size_t i = p;
    uint32_t cp = tpl_utf8_next(s, len, &i);
    return tpl_is_space(cp) ? i - p : 0;
}

static size_t skip_space(const char *s, size_t len, size_t p) {
    size_t n;
    while ((n = space_at(s, len, p))) p += n;
    return p;
}

static bool at(const struct lexer *L, size_t p, const char *lit) {
    size_t n = strlen(lit);
    return p + n <= L->len && memcmp(L->s + p, lit, n) == 0;
}

/* The data before a tag, stripped as the tag's modifier and lstrip_blocks say. */
static enum llmopt_status emit_data(struct lexer *L, size_t start, size_t end, char modifier,
                                    bool lstrip_applies) {
    if (modifier == '-') {
        struct tpl_str t = tpl_strip((struct tpl_str){L->s + start, end - start}, NULL, 2);
        end = start + t.len;
    } else if (modifier != '+' && lstrip_applies) {
        size_t l_pos = end;
        while (l_pos > start && L->s[l_pos - 1] != '\n') l_pos--;
        bool line_starting = start == 0 || L->s[start - 1] == '\n';
        if ((l_pos > start || line_starting) && l_pos < end && skip_space(L->s, end, l_pos) == end)
            end = l_pos;
    }
    if (end > start) {
        struct tpl_token *t = push(L, TK_DATA, start);
        if (!t) return err_set(L->err, LLMOPT_ERR_NOMEM, "out of memory");
        t->text = (struct tpl_str){L->s + start, end - start};
    }
    return LLMOPT_OK;
}

/* Offset just past a block end at p ("%}" family), applying its whitespace rules. */
static size_t block_end_after(const struct lexer *L, size_t p) {
    if (L->s[p] == '+') return p + 3;
    if (L->s[p] == '-') return skip_space(L->s, L->len, p + 3);
    p += 2;
    if (p < L->len && L->s[p] == '\n') p++; /* trim_blocks */
    return p;
}

/* At p: "+%}", "-%}" or "%}"? */
static bool block_end_at(const struct lexer *L, size_t p) {
    return at(L, p, "%}") || at(L, p, "-%}") || at(L, p, "+%}");
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Python string-literal escapes (Jinja decodes with 'unicode-escape'). */
static enum llmopt_status lex_string(struct lexer *L, size_t *pp) {
    size_t p = *pp, start = p;
    char q = L->s[p++];
    size_t body = p;
    while (p < L->len && L->s[p] != q) p += L->s[p] == '\\' && p + 1 < L->len ? 2 : 1;
    if (p >= L->len) return lex_fail(L, start, "unterminated string literal starting with %s", q == '"' ? "\"" : "'");
    size_t body_end = p;
    char *out = arena_alloc(L->arena, body_end - body + 1);
    if (!out) return err_set(L->err, LLMOPT_ERR_NOMEM, "out of memory");
    size_t n = 0;
    for (size_t i = body; i < body_end;) {
        char c = L->s[i];
        if (c != '\\') {
            out[n++] = c;
            i++;
            continue;
        }
        char e = L->s[i + 1];
        i += 2;
        uint32_t cp = 0;
        int digits = 0;
        switch (e) {
        case '\\': out[n++] = '\\'; continue;
        case '\'': out[n++] = '\''; continue;
        case '"': out[n++] = '"'; continue;
        case 'a': out[n++] = '\a'; continue;
        case 'b': out[n++] = '\b'; continue;
        case 'f': out[n++] = '\f'; continue;
        case 'n': out[n++] = '\n'; continue;
        case 'r': out[n++] = '\r'; continue;
        case 't': out[n++] = '\t'; continue;
        case 'v': out[n++] = '\v'; continue;
        case '\n': continue; /* line continuation */
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        case 'N': return lex_fail(L, i - 2, "%s", "\\N{...} escapes are not supported");
        default:
            if (e >= '0' && e <= '7') {
                cp = (uint32_t)(e - '0');
                for (int k = 0; k < 2 && i < body_end && L->s[i] >= '0' && L->s[i] <= '7'; k++)
                    cp = cp * 8 + (uint32_t)(L->s[i++] - '0');
                n += tpl_utf8_put(cp, out + n);
                continue;
            }
            out[n++] = '\\'; /* unknown escapes stay as written */
            out[n++] = e;
            continue;
        }
        for (int k = 0; k < digits; k++) {
            int h = i < body_end ? hexval(L->s[i]) : -1;
            if (h < 0) return lex_fail(L, i, "%s", "truncated \\x / \\u / \\U escape in a string literal");
            cp = cp * 16 + (uint32_t)h;
            i++;
        }
        if (cp > 0x10ffff) return lex_fail(L, i, "%s", "\\U escape out of range");
        n += tpl_utf8_put(cp, out + n); /* an escape's UTF-8 is never longer than the escape */
    }
    out[n] = 0;
    struct tpl_token *t = push(L, TK_STRING, start);
    if (!t) return err_set(L->err, LLMOPT_ERR_NOMEM, "out of memory");
    t->text = (struct tpl_str){out, n};
    *pp = body_end + 1;
    return LLMOPT_OK;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (uint8_t)c >= 0x80; }
static bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

/* Digits with single underscores between them ("1_000"); returns the end. */
static size_t scan_digits(const struct lexer *L, size_t p) {
    while (p < L->len && is_digit(L->s[p])) {
        p++;
        if (p + 1 < L->len && L->s[p] == '_' && is_digit(L->s[p + 1])) p++;
    }
    return p;
}

static enum llmopt_status lex_number(struct lexer *L, size_t *pp) {
    size_t p = *pp, start = p;
    char buf[128];
    size_t n = 0;
    if (L->s[p] == '0' && p + 2 < L->len && strchr("xXoObB", L->s[p + 1]) && L->s[p + 1]) {
        int base = (L->s[p + 1] | 0x20) == 'x' ? 16 : (L->s[p + 1] | 0x20) == 'o' ? 8 : 2;
        size_t q = p + 2;
        uint64_t v = 0;
        bool any = false;
        for (; q < L->len; q++) {
            if (L->s[q] == '_') continue;
            int h = hexval(L->s[q]);
            if (h < 0 || h >= base) break;
            if (v > (UINT64_MAX >> 4)) return lex_fail(L, start, "%s", "integer literal too large");
            v = v * (uint64_t)base + (uint64_t)h;
            any = true;
        }
        if (any) {
            if (v > INT64_MAX) return lex_fail(L, start, "%s", "integer literal too large");
            struct tpl_token *t = push(L, TK_INT, start);
            if (!t) return err_set(L->err, LLMOPT_ERR_NOMEM, "out of memory");
            t->ival = (int64_t)v;
            *pp = q;
            return LLMOPT_OK;
        }
    }
    size_t end = scan_digits(L, p);
    bool is_float = false;
    bool after_dot = start > 0 && L->s[start - 1] == '.';
    size_t q = end;
    if (!after_dot && q + 1 < L->len && L->s[q] == '.' && is_digit(L->s[q + 1])) {
        q = scan_digits(L, q + 1);
        is_float = true;
    }
    if (!after_dot && q < L->len && (L->s[q] == 'e' || L->s[q] == 'E')) {
        size_t e = q + 1;
        if (e < L->len && (L->s[e] == '+' || L->s[e] == '-')) e++;
        if (e < L->len && is_digit(L->s[e])) {
            q = scan_digits(L, e);
            is_float = true;
        }
    }
    if (is_float) end = q;
    for (size_t i = start; i < end; i++)
        if (L->s[i] != '_' && n + 1 < sizeof buf) buf[n++] = L->s[i];
    buf[n] = 0;
    if (n + 1 >= sizeof buf) return lex_fail(L, start, "%s", "number literal too long");
    struct tpl_token *t = push(L, is_float ? TK_FLOAT : TK_INT, start);
    if (!t) return err_set(L->err, LLMOPT_ERR_NOMEM, "out of memory");
    if (is_float) {
        t->fval = strtod(buf, NULL);
    } else {
        uint64_t v = 0;
        for (size_t i = 0; i < n; i++) {
            if (v > (uint64_t)(INT64_MAX - 9) / 10) return lex_fail(L, start, "%s", "integer literal too large (llmopt integers are 64-bit)");
            v = v * 10 + (uint64_t)(buf[i] - '0');
        }
        t->ival = (int64_t)v;
    }
    *pp = end;
    return LLMOPT_OK;
}

static enum tpl_op op_at(const struct lexer *L, size_t p, size_t *n) {
    static const struct {
        const char *text;
        enum tpl_op op;
    } ops[] = {
        {"//", OP_FLOORDIV}, {"**", OP_POW}, {"==", OP_EQ}, {"!=", OP_NE}, {">=", OP_GE},
        {"<=", OP_LE}, {"+", OP_ADD}, {"-", OP_SUB}, {"/", OP_DIV}, {"*", OP_MUL},
        {"%", OP_MOD}, {"~", OP_TILDE}, {"[", OP_LBRACKET}, {"]", OP_RBRACKET},
        {"(", OP_LPAREN}, {")", OP_RPAREN}, {"{", OP_LBRACE}, {"}", OP_RBRACE},
        {">", OP_GT}, {"<", OP_LT}, {"=", OP_ASSIGN}, {".", OP_DOT}, {":", OP_COLON},
        {"|", OP_PIPE}, {",", OP_COMMA}, {";", OP_SEMICOLON},
    };
    for (size_t i = 0; i < LLMOPT_ARRAY_LEN(ops); i++)
        if (at(L, p, ops[i].text)) {
            *n = strlen(ops[i].text);
            return ops[i].op;
        }
    return OP_NONE;
}

/* Tokens of one {{ }} or {% %} tag from p; returns the offset after its end. */
static enum llmopt_status lex_tag(struct lexer *L, char kind, size_t tag_start, size_t *pp) {
    size_t p = *pp;
    char stack[TPL_MAX_NESTING];
    int depth = 0;
    for (;;) {
        if (depth == 0) {
            if (kind == '{' && (at(L, p, "}}") || at(L, p, "-}}"))) {
                if (!push(L, TK_VAR_END, p)) return err_set(L->err, LLMOPT_ERR_NOMEM, "out of memory");
                *pp = L->s[p] == '-' ? skip_space(L->s, L->len, p + 3) : p + 2;
                return LLMOPT_OK;
            }
            if (kind == '%' && block_end_at(L, p)) {
                if (!push(L, TK_BLOCK_END, p)) return err_set(L->err, LLMOPT_ERR_NOMEM, "out of memory");
                *pp = block_end_after(L, p);
                return LLMOPT_OK;
            }
        }
        size_t ws = skip_space(L->s, L->len, p);
        if (ws != p) {
            p = ws;
            continue;
        }
        if (p >= L->len)
            return lex_fail(L, tag_start, "%s", kind == '{' ? "'{{' is never closed with '}}'"
                                                             : "'{%' is never closed with '%}'");
        char c = L->s[p];
        enum llmopt_status st;
        if (c == '\'' || c == '"') {
            if ((st = lex_string(L, &p))) return st;
            continue;
        }
        if (is_digit(c)) {
            if ((st = lex_number(L, &p))) return st;
            continue;
        }
        if (is_name_start(c)) {
            size_t s = p;
            while (p < L->len && is_name_char(L->s[p])) p++;
            struct tpl_token *t = push(L, TK_NAME, s);
            if (!t) return err_set(L->err, LLMOPT_ERR_NOMEM, "out of memory");
            t->text = (struct tpl_str){L->s + s, p - s};
            continue;
        }
        size_t n;
        enum tpl_op op = op_at(L, p, &n);
        if (op == OP_NONE) {
            char ch[2] = {c, 0};
            return lex_fail(L, p, "unexpected character '%s' in a tag", ch);
        }
        if (op == OP_LPAREN || op == OP_LBRACKET || op == OP_LBRACE) {
            if (depth >= TPL_MAX_NESTING) return lex_fail(L, p, "%s", "brackets nested too deeply");
            stack[depth++] = (char)op;
        } else if (op == OP_RPAREN || op == OP_RBRACKET || op == OP_RBRACE) {
            enum tpl_op want = op == OP_RPAREN ? OP_LPAREN : op == OP_RBRACKET ? OP_LBRACKET : OP_LBRACE;
            if (depth == 0 || stack[depth - 1] != (char)want) return lex_fail(L, p, "unexpected '%s'", tpl_op_text(op));
            depth--;
        }
        struct tpl_token *t = push(L, TK_OP, p);
        if (!t) return err_set(L->err, LLMOPT_ERR_NOMEM, "out of memory");
        t->op = (uint8_t)op;
        p += n;
    }
}

enum llmopt_status tpl_lex(const char *src, size_t len, const char *name, struct arena *arena,
                           struct tpl_token_list *out, struct llmopt_err *err) {
    struct lexer L = {.s = src, .len = len, .name = name, .arena = arena, .toks = out, .err = err, .line = 1};
    size_t pos = 0;
    enum llmopt_status st;
    while (pos < len) {
        size_t t = pos;
        for (;;) {
            const char *brace = memchr(src + t, '{', len - t);
            if (!brace) { t = len; break; }
            t = (size_t)(brace - src);
            if (t + 1 < len && (src[t + 1] == '{' || src[t + 1] == '%' || src[t + 1] == '#')) break;
            t++;
        }
        if (t >= len) {
            if ((st = emit_data(&L, pos, len, 0, false))) return st;
            break;
        }
        char kind = src[t + 1];
        size_t m = t + 2;
        char mod = 0;
        if (m < len && (src[m] == '-' || src[m] == '+')) mod = src[m++];

        /* {% raw %} ... {% endraw %}: the content is text. */
        if (kind == '%') {
            size_t q = skip_space(src, len, m);
            if (at(&L, q, "raw")) {
                size_t e = skip_space(src, len, q + 3);
                if (at(&L, e, "%}") || at(&L, e, "-%}")) {
                    size_t content = at(&L, e, "-%}") ? skip_space(src, len, e + 3) : e + 2;
                    if ((st = emit_data(&L, pos, t, mod, true))) return st;
                    /* find {%[-+]? endraw [-+]?%} */
                    size_t c = content;
                    for (;;) {
                        const char *f = NULL;
                        for (size_t x = c; x + 1 < len; x++)
                            if (src[x] == '{' && src[x + 1] == '%') { f = src + x; break; }
                        if (!f) return lex_fail(&L, t, "%s", "'{% raw %}' is never closed with '{% endraw %}'");
                        size_t b = (size_t)(f - src), k = b + 2;
                        char emod = 0;
                        if (k < len && (src[k] == '-' || src[k] == '+')) emod = src[k++];
                        k = skip_space(src, len, k);
                        if (at(&L, k, "endraw")) {
                            size_t k2 = skip_space(src, len, k + 6);
                            if (block_end_at(&L, k2)) {
                                if ((st = emit_data(&L, content, b, emod, true))) return st;
                                pos = block_end_after(&L, k2);
                                break;
                            }
                        }
                        c = b + 2;
                    }
                    continue;
                }
            }
        }
        if ((st = emit_data(&L, pos, t, mod, kind != '{'))) return st;
        if (kind == '#') {
            const char *f = NULL;
            for (size_t c = m; c + 1 < len; c++)
                if (src[c] == '#' && src[c + 1] == '}') { f = src + c; break; }
            if (!f) return lex_fail(&L, t, "%s", "'{#' comment is never closed with '#}'");
            size_t q = (size_t)(f - src);
            char cmod = q > m && (src[q - 1] == '-' || src[q - 1] == '+') ? src[q - 1] : 0;
            pos = q + 2;
            if (cmod == '-') pos = skip_space(src, len, pos);
            else if (cmod != '+' && pos < len && src[pos] == '\n') pos++;
            continue;
        }
        struct tpl_token *tok = push(&L, kind == '{' ? TK_VAR_BEGIN : TK_BLOCK_BEGIN, t);
        if (!tok) return err_set(err, LLMOPT_ERR_NOMEM, "out of memory");
        pos = m;
        if ((st = lex_tag(&L, kind, t, &pos))) return st;
    }
    if (!push(&L, TK_EOF, len)) return err_set(err, LLMOPT_ERR_NOMEM, "out of memory");
    return LLMOPT_OK;
}
