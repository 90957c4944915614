/* The load generator's HTTP/SSE response parser (see loadgen_parse.h). */
#define _GNU_SOURCE /* memmem */
#include "loadgen_parse.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const lg_state_names[] = {"headers",          "chunk size", "chunk data",
                                             "chunk CRLF",       "trailer",    "body",
                                             "body until close", "done",       "error"};
_Static_assert(sizeof lg_state_names / sizeof lg_state_names[0] == LG_STATE_COUNT,
               "one name per parser state");

static enum lg_state lg_fail(struct lg_resp *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->error, sizeof r->error, fmt, ap);
    va_end(ap);
    r->state = LG_ERROR;
    return LG_ERROR;
}

bool lg_resp_init(struct lg_resp *r, lg_event_fn on_event, void *event_ctx) {
    memset(r, 0, sizeof *r);
    r->sse_line = malloc(LG_SSE_LINE_CAP + 1);
    r->sse_data = malloc(LG_SSE_DATA_CAP + 1);
    r->on_event = on_event;
    r->event_ctx = event_ctx;
    srv_buf_init(&r->body, LG_BODY_CAP);
    if (!r->sse_line || !r->sse_data) {
        lg_resp_free(r);
        return false;
    }
    return true;
}

void lg_resp_reset(struct lg_resp *r) {
    char *line = r->sse_line, *data = r->sse_data;
    lg_event_fn fn = r->on_event;
    void *ctx = r->event_ctx;
    struct srv_buf body = r->body;
    memset(r, 0, sizeof *r);
    r->sse_line = line;
    r->sse_data = data;
    r->on_event = fn;
    r->event_ctx = ctx;
    srv_buf_reset(&body);
    r->body = body;
}

void lg_resp_free(struct lg_resp *r) {
    free(r->sse_line);
    free(r->sse_data);
    srv_buf_free(&r->body);
    r->sse_line = r->sse_data = NULL;
}

/* ---- headers ---- */

/* Case-insensitive: does the header line `line` (NUL-terminated) name `name`?
 * Returns its value with leading blanks skipped, or NULL. */
static const char *header_value(const char *line, const char *name) {
    size_t n = strlen(name);
    if (strncasecmp(line, name, n) || line[n] != ':') return NULL;
    const char *v = line + n + 1;
    while (*v == ' ' || *v == '\t') v++;
    return v;
}

static bool has_token(const char *v, const char *token) {
    size_t n = strlen(token);
    for (const char *p = v; *p; p++)
        if (!strncasecmp(p, token, n)) return true;
    return false;
}

/* r->head holds the status line and headers, each ending in CRLF, then an empty line. */
static enum lg_state parse_head(struct lg_resp *r) {
    int minor = 0, status = 0, used = 0;
    if (sscanf(r->head, "HTTP/1.%d %3d%n", &minor, &status, &used) != 2 || status < 100 ||
        status > 599)
        return lg_fail(r, "bad status line '%.60s'", r->head);
    r->status = status;
    r->keep_alive = minor >= 1;
    bool have_len = false;
    char *line = strstr(r->head, "\r\n") + 2;
    while (*line && line[0] != '\r') {
        char *end = strstr(line, "\r\n");
        *end = 0;
        const char *v;
        if ((v = header_value(line, "Transfer-Encoding"))) {
            r->chunked = has_token(v, "chunked");
        } else if ((v = header_value(line, "Content-Length"))) {
            char *e;
            long long len = strtoll(v, &e, 10);
            if (e == v || *e || len < 0) return lg_fail(r, "bad Content-Length '%.40s'", v);
            r->remaining = len;
            have_len = true;
        } else if ((v = header_value(line, "Connection"))) {
            if (has_token(v, "close"))
                r->keep_alive = false;
            else if (has_token(v, "keep-alive"))
                r->keep_alive = true;
        } else if ((v = header_value(line, "Content-Type"))) {
            r->sse = !strncasecmp(v, "text/event-stream", 17);
        }
        line = end + 2;
    }
    if (status < 200) { /* 100 Continue and friends: the real response follows */
        r->head_len = 0;
        r->chunked = r->sse = false;
        return r->state = LG_HEAD;
    }
    if (status == 204 || status == 304) return r->state = LG_DONE;
    if (r->chunked) return r->state = LG_CHUNK_SIZE;
    if (have_len) return r->state = r->remaining ? LG_BODY_LEN : LG_DONE;
    r->keep_alive = false;
    return r->state = LG_BODY_EOF;
}

/* Takes header bytes from p[0..n); returns how many it used. */
static size_t feed_head(struct lg_resp *r, const char *p, size_t n) {
    size_t from = r->head_len >= 3 ? r->head_len - 3 : 0;
    size_t take = n < LG_HEAD_CAP - r->head_len ? n : LG_HEAD_CAP - r->head_len;
    memcpy(r->head + r->head_len, p, take);
    r->head_len += take;
    r->head[r->head_len] = 0;
    char *end = strstr(r->head + from, "\r\n\r\n");
    if (!end) {
        if (r->head_len == LG_HEAD_CAP) lg_fail(r, "headers longer than %d bytes", LG_HEAD_CAP);
        return take;
    }
    size_t head_end = (size_t)(end - r->head) + 4;
    size_t used = take - (r->head_len - head_end);
    r->head[head_end - 2] = 0; /* keep the last header's CRLF, drop the empty line */
    parse_head(r);
    return used;
}

/* ---- SSE ---- */

static bool sse_line_done(struct lg_resp *r) {
    char *line = r->sse_line;
    size_t len = r->sse_line_len;
    line[len] = 0;
    if (len == 0) { /* the blank line ends an event */
        if (!r->sse_has_data) return true;
        r->sse_data[r->sse_data_len] = 0;
        r->n_events++;
        bool ok = true;
        if (r->on_event)
            ok = r->on_event(r->event_ctx, r->sse_data, r->sse_data_len, r->error, sizeof r->error);
        r->sse_data_len = 0;
        r->sse_has_data = false;
        if (!ok) r->state = LG_ERROR;
        return ok;
    }
    if (line[0] == ':') return true; /* a comment */
    char *colon = memchr(line, ':', len);
    size_t name_len = colon ? (size_t)(colon - line) : len;
    if (name_len != 4 || memcmp(line, "data", 4)) return true; /* event, id, retry: unused */
    const char *v = colon ? colon + 1 : line + len;
    if (*v == ' ') v++;
    size_t vlen = (size_t)(line + len - v);
    size_t need = vlen + (r->sse_has_data ? 1 : 0);
    if (need > LG_SSE_DATA_CAP - r->sse_data_len) {
        lg_fail(r, "an SSE event over %d bytes", LG_SSE_DATA_CAP);
        return false;
    }
    if (r->sse_has_data) r->sse_data[r->sse_data_len++] = '\n';
    memcpy(r->sse_data + r->sse_data_len, v, vlen);
    r->sse_data_len += vlen;
    r->sse_has_data = true;
    return true;
}

/* SSE lines end in LF, CRLF or a lone CR. */
static bool sse_feed(struct lg_resp *r, const char *p, size_t n) {
    while (n) {
        if (r->sse_cr && *p == '\n') {
            p++, n--;
            r->sse_cr = false;
            continue;
        }
        r->sse_cr = false;
        size_t k = 0;
        while (k < n && p[k] != '\n' && p[k] != '\r') k++;
        if (k > LG_SSE_LINE_CAP - r->sse_line_len) {
            lg_fail(r, "an SSE line over %d bytes", LG_SSE_LINE_CAP);
            return false;
        }
        memcpy(r->sse_line + r->sse_line_len, p, k);
        r->sse_line_len += k;
        if (k == n) return true;
        r->sse_cr = p[k] == '\r';
        p += k + 1;
        n -= k + 1;
        if (!sse_line_done(r)) return false;
        r->sse_line_len = 0;
    }
    return true;
}

static bool body_bytes(struct lg_resp *r, const char *p, size_t n) {
    if (r->sse) return sse_feed(r, p, n);
    if (srv_buf_append(&r->body, p, n)) return true;
    lg_fail(r, "a body over %u bytes (or out of memory)", LG_BODY_CAP);
    return false;
}

/* ---- chunked framing ---- */

/* Collects a CRLF-terminated line into r->line; returns bytes used, *complete when
 * the line ended (r->line then holds it without the CRLF). */
static size_t feed_line(struct lg_resp *r, const char *p, size_t n, bool *complete) {
    *complete = false;
    const char *lf = memchr(p, '\n', n);
    size_t take = lf ? (size_t)(lf - p) + 1 : n;
    if (take > LG_LINE_CAP - r->line_len) {
        lg_fail(r, "a chunk-size or trailer line over %d bytes", LG_LINE_CAP);
        return n;
    }
    memcpy(r->line + r->line_len, p, take);
    r->line_len += take;
    if (!lf) return take;
    if (r->line_len < 2 || r->line[r->line_len - 2] != '\r') {
        lg_fail(r, "a chunk line not ending in CRLF");
        return n;
    }
    r->line_len -= 2;
    r->line[r->line_len] = 0;
    *complete = true;
    return take;
}

static void chunk_size_line(struct lg_resp *r) {
    int64_t size = 0;
    size_t i = 0;
    for (; i < r->line_len; i++) {
        char c = r->line[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) break;
        if (size > (INT64_C(1) << 40)) {
            lg_fail(r, "chunk size '%.40s' too large", r->line);
            return;
        }
        size = size * 16 + d;
    }
    if (i == 0 ||
        (i < r->line_len && r->line[i] != ';' && r->line[i] != ' ' && r->line[i] != '\t')) {
        lg_fail(r, "bad chunk size line '%.40s'", r->line);
        return;
    }
    r->remaining = size;
    r->state = size ? LG_CHUNK_DATA : LG_TRAILER;
}

enum lg_state lg_resp_feed(struct lg_resp *r, const char *p, size_t n) {
    if (n) r->got_bytes = true;
    while (n && r->state != LG_ERROR) {
        size_t used = n;
        bool line_done;
        switch (r->state) {
        case LG_HEAD:
            used = feed_head(r, p, n);
            break;
        case LG_CHUNK_SIZE:
        case LG_CHUNK_CRLF:
        case LG_TRAILER:
            used = feed_line(r, p, n, &line_done);
            if (!line_done || r->state == LG_ERROR) break;
            if (r->state == LG_CHUNK_SIZE) {
                chunk_size_line(r);
            } else if (r->state == LG_CHUNK_CRLF) {
                if (r->line_len)
                    lg_fail(r, "chunk data longer than its size");
                else
                    r->state = LG_CHUNK_SIZE;
            } else if (r->line_len == 0) {
                r->state = LG_DONE;
            }
            r->line_len = 0;
            break;
        case LG_CHUNK_DATA:
        case LG_BODY_LEN:
            used = (int64_t)n < r->remaining ? n : (size_t)r->remaining;
            if (!body_bytes(r, p, used)) break;
            r->remaining -= (int64_t)used;
            if (!r->remaining) r->state = r->state == LG_CHUNK_DATA ? LG_CHUNK_CRLF : LG_DONE;
            break;
        case LG_BODY_EOF:
            body_bytes(r, p, n);
            break;
        case LG_DONE:
            return lg_fail(r, "%zu bytes after the end of the response", n);
        case LG_ERROR:
        case LG_STATE_COUNT:
            break;
        }
        p += used;
        n -= used;
    }
    return r->state;
}

enum lg_state lg_resp_eof(struct lg_resp *r) {
    if (r->state == LG_BODY_EOF) r->state = LG_DONE;
    if (r->state == LG_DONE || r->state == LG_ERROR) return r->state;
    if (r->state == LG_HEAD && r->head_len == 0)
        return lg_fail(r, "the connection closed before a response");
    return lg_fail(r, "the connection closed in the middle of the response (%s)",
                   lg_state_names[r->state]);
}

/* ---- OpenAI completion chunks ---- */

void lg_completion_init(struct lg_completion *c) {
    srv_buf_init(&c->text, LG_BODY_CAP);
    c->completion_tokens = -1;
    c->done = false;
    c->tmpl = NULL;
    c->tmpl_head = c->tmpl_len = 0;
    c->n_fast = 0;
}

void lg_completion_free(struct lg_completion *c) {
    srv_buf_free(&c->text);
    free(c->tmpl);
    c->tmpl = NULL;
}

/* s[0..n) as the inside of a JSON string made only of printable ASCII and the
 * two-character escapes, unescaped onto out (NULL: only checked). False for anything
 * else (a quote, a control byte, non-ASCII, \u, a cut escape): the caller then parses
 * in full. */
static bool plain_json_string(const char *s, size_t n, struct srv_buf *out) {
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch < 0x20 || ch >= 0x80 || ch == '"') return false;
        if (ch == '\\' && (++i == n || !strchr("\"\\/bfnrt", s[i]) || !s[i])) return false;
    }
    if (!out) return true;
    size_t run = 0; /* plain bytes before s[i] not yet appended */
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\') {
            run++;
            continue;
        }
        if (run && !srv_buf_append(out, s + i - run, run)) return false;
        run = 0;
        char e = s[++i];
        char ch = e == 'b' ? '\b' : e == 'f' ? '\f' : e == 'n' ? '\n' : e == 'r' ? '\r' : e == 't' ? '\t' : e;
        if (!srv_buf_append(out, &ch, 1)) return false;
    }
    return !run || srv_buf_append(out, s + n - run, run);
}

/* After a chunk parsed in full whose only content is one non-empty text string (want;
 * a chat stream's first chunk, the role with "", is shaped unlike the rest): makes the
 * template when the raw text is a plain JSON string that unescapes to want. */
static void template_try(struct lg_completion *c, const char *data, size_t len, json_t *want) {
    static const char *const keys[] = {"\"text\":\"", "\"content\":\""};
    for (int k = 0; k < 2 && !c->tmpl; k++) {
        const char *at = memmem(data, len, keys[k], strlen(keys[k]));
        if (!at) continue;
        size_t head = (size_t)(at - data) + strlen(keys[k]), end = head;
        while (end < len && data[end] != '"') end += data[end] == '\\' ? 2 : 1;
        if (end >= len) continue;
        struct srv_buf t;
        srv_buf_init(&t, len);
        bool same = plain_json_string(data + head, end - head, &t) && !t.failed &&
                    t.len == json_string_length(want) &&
                    (!t.len || !memcmp(t.data, json_string_value(want), t.len));
        srv_buf_free(&t);
        if (!same || !(c->tmpl = malloc(len - (end - head)))) continue;
        memcpy(c->tmpl, data, head);
        memcpy(c->tmpl + head, data + end, len - end);
        c->tmpl_head = head;
        c->tmpl_len = len - (end - head);
    }
}

/* The fast path: true when data is the template around a plain string (its text
 * appended, *ok false if that overflowed). */
static bool template_event(struct lg_completion *c, const char *data, size_t len, bool *ok,
                           char *err, size_t err_cap) {
    if (!c->tmpl || len < c->tmpl_len) return false;
    size_t head = c->tmpl_head, tail = c->tmpl_len - head, n = len - c->tmpl_len;
    if (memcmp(data, c->tmpl, head) || memcmp(data + len - tail, c->tmpl + head, tail) ||
        !plain_json_string(data + head, n, NULL))
        return false;
    c->n_fast++;
    *ok = plain_json_string(data + head, n, &c->text);
    if (!*ok) snprintf(err, err_cap, "completion text over %zu bytes", c->text.max);
    return true;
}

static bool add_text(struct lg_completion *c, json_t *s, char *err, size_t err_cap) {
    if (!json_is_string(s)) return true;
    if (srv_buf_append(&c->text, json_string_value(s), json_string_length(s))) return true;
    snprintf(err, err_cap, "completion text over %zu bytes", c->text.max);
    return false;
}

bool lg_completion_event(void *ctx, const char *data, size_t len, char *err, size_t err_cap) {
    struct lg_completion *c = ctx;
    if (len == 6 && !memcmp(data, "[DONE]", 6)) {
        if (c->done) {
            snprintf(err, err_cap, "[DONE] twice");
            return false;
        }
        c->done = true;
        return true;
    }
    if (c->done) {
        snprintf(err, err_cap, "an event after [DONE]: '%.60s'", data);
        return false;
    }
    bool fast_ok;
    if (template_event(c, data, len, &fast_ok, err, err_cap)) return fast_ok;
    json_error_t jerr;
    json_t *j = json_loadb(data, len, 0, &jerr);
    if (!json_is_object(j)) {
        snprintf(err, err_cap, "an event that is not a JSON object (%s): '%.60s'", jerr.text, data);
        json_decref(j);
        return false;
    }
    bool ok = true;
    json_t *e = json_object_get(j, "error");
    if (e) {
        json_t *m = json_object_get(e, "message");
        snprintf(err, err_cap, "the server sent an error event: %.200s",
                 json_is_string(m) ? json_string_value(m) : "(no message)");
        ok = false;
    }
    size_t i;
    json_t *choice;
    json_array_foreach(json_object_get(j, "choices"), i, choice) {
        if (!ok) break;
        ok =
            add_text(c, json_object_get(choice, "text"), err, err_cap) &&
            add_text(c, json_object_get(json_object_get(choice, "delta"), "content"), err, err_cap);
    }
    json_t *usage = json_object_get(j, "usage");
    json_t *only = json_array_get(json_object_get(j, "choices"), 0);
    json_t *text = json_object_get(only, "text");
    if (!text) text = json_object_get(json_object_get(only, "delta"), "content");
    if (ok && !c->tmpl && !json_is_object(usage) && json_array_size(json_object_get(j, "choices")) == 1 &&
        json_is_string(text) && json_string_length(text) > 0)
        template_try(c, data, len, text);
    if (ok && json_is_object(usage)) {
        json_t *t = json_object_get(usage, "completion_tokens");
        if (!json_is_integer(t)) {
            snprintf(err, err_cap, "usage without an integer completion_tokens");
            ok = false;
        } else {
            c->completion_tokens = json_integer_value(t);
        }
    }
    json_decref(j);
    return ok;
}
