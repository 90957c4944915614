/* Capped byte buffer (see srv_buf.h). */
#include "server/srv_buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void srv_buf_init(struct srv_buf *b, size_t max) {
    *b = (struct srv_buf){.max = max};
}

static bool srv_buf_reserve(struct srv_buf *b, size_t extra) {
    if (extra > b->max || b->len > b->max - extra) {
        b->failed = true;
        return false;
    }
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) cap *= 2;
    if (cap > b->max + 1) cap = b->max + 1;
    char *d = realloc(b->data, cap);
    if (!d) {
        b->failed = true;
        return false;
    }
    b->data = d;
    b->cap = cap;
    return true;
}

bool srv_buf_append(struct srv_buf *b, const char *s, size_t n) {
    if (!srv_buf_reserve(b, n)) return false;
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
    return true;
}

bool srv_buf_puts(struct srv_buf *b, const char *s) {
    return srv_buf_append(b, s, strlen(s));
}

bool srv_buf_printf(struct srv_buf *b, const char *fmt, ...) {
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = true;
        return false;
    }
    if ((size_t)n < sizeof small) return srv_buf_append(b, small, (size_t)n);
    if (!srv_buf_reserve(b, (size_t)n)) return false;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return true;
}

bool srv_buf_json_escaped(struct srv_buf *b, const char *s, size_t n) {
    static const char hex[] = "0123456789ABCDEF";
    size_t run = 0; /* bytes before s[i] that need no escape, not yet appended */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            run++;
            continue;
        }
        if (run && !srv_buf_append(b, s + i - run, run)) return false;
        run = 0;
        char esc[6] = {'\\', 0};
        size_t len = 2;
        switch (c) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        default:
            memcpy(esc + 1, "u00", 3);
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            len = 6;
        }
        if (!srv_buf_append(b, esc, len)) return false;
    }
    return !run || srv_buf_append(b, s + n - run, run);
}

char *srv_buf_take(struct srv_buf *b, size_t *len) {
    char *d = b->data;
    if (!d) d = calloc(1, 1);
    if (len) *len = b->len;
    b->data = NULL;
    b->len = b->cap = 0;
    return d;
}

void srv_buf_reset(struct srv_buf *b) {
    b->len = 0;
    b->failed = false;
    if (b->data) b->data[0] = 0;
}

void srv_buf_free(struct srv_buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}
