/* The load generator's incremental HTTP/SSE parser (bench/loadgen_parse.c): streamed
 * completions made of fresh random texts, framed chunked / with Content-Length / until
 * close, re-chunked at random sizes (extensions, upper-case hex), fed whole, a byte at a
 * time and in random pieces, must give back the texts, the usage count and [DONE]; and
 * each kind of malformed or oversized input must end in an error that says what. */
#include "loadgen_parse.h"
#include "test.h"

#include "rng.h"

#include <jansson.h>
#include <stdint.h>

static uint32_t rnd(void) {
    return (uint32_t)(rng_next() >> 32);
}

/* Random valid UTF-8 text of up to max_cp code points, biased to what needs escaping. */
static void rand_text(struct srv_buf *b, int max_cp) {
    static const char special[] = "\"\\/\b\f\n\r\t\x01 :data[DONE]";
    int n = (int)(rnd() % (uint32_t)(max_cp + 1));
    for (int i = 0; i < n; i++) {
        char u[4];
        uint32_t kind = rnd() % 4, cp;
        if (kind == 0) {
            srv_buf_append(b, &special[rnd() % (sizeof special - 1)], 1);
            continue;
        }
        cp = kind == 1   ? 0x20 + rnd() % 0x5f
             : kind == 2 ? 0x80 + rnd() % 0x780
                         : 0x800 + rnd() % 0xc000;
        if (cp >= 0xd800 && cp < 0xe000) cp = 0x4e2d;
        if (cp < 0x80) {
            u[0] = (char)cp;
            srv_buf_append(b, u, 1);
        } else if (cp < 0x800) {
            u[0] = (char)(0xc0 | cp >> 6);
            u[1] = (char)(0x80 | (cp & 63));
            srv_buf_append(b, u, 2);
        } else {
            u[0] = (char)(0xe0 | cp >> 12);
            u[1] = (char)(0x80 | ((cp >> 6) & 63));
            u[2] = (char)(0x80 | (cp & 63));
            srv_buf_append(b, u, 3);
        }
    }
}

static void put(struct srv_buf *b, const char *s) {
    srv_buf_append(b, s, strlen(s));
}

/* An SSE body as the server streams a completion: one chunk per piece of text, a finish
 * chunk, a usage chunk, [DONE]. `expect` gets the joined text. Line endings vary
 * (LF / CRLF / CR) and comments or other fields may appear, as SSE allows. */
static int make_sse_body(struct srv_buf *body, struct srv_buf *expect, int64_t *tokens) {
    int n_events = 0;
    int pieces = 1 + (int)(rnd() % 40);
    const char *eol = (const char *[]){"\n", "\r\n", "\r"}[rnd() % 3];
    for (int i = 0; i < pieces; i++) {
        struct srv_buf t;
        srv_buf_init(&t, 1 << 16);
        rand_text(&t, 8);
        srv_buf_append(expect, t.data ? t.data : "", t.len);
        json_t *j = json_pack("{s:s,s:s,s:[{s:s%,s:i,s:n,s:n}],s:n}", "id", "cmpl-1", "object",
                              "text_completion", "choices", "text", t.data ? t.data : "", t.len,
                              "index", 0, "logprobs", "finish_reason", "usage");
        char *s = json_dumps(j, JSON_COMPACT);
        if (rnd() % 8 == 0) {
            put(body, ": a comment");
            put(body, eol);
        }
        if (rnd() % 8 == 0) {
            put(body, "event: message");
            put(body, eol);
        }
        put(body, rnd() % 2 ? "data: " : "data:");
        put(body, s);
        put(body, eol);
        put(body, eol);
        n_events++;
        free(s);
        json_decref(j);
        srv_buf_free(&t);
    }
    *tokens = rnd() % 1000;
    char usage[200];
    snprintf(usage, sizeof usage,
             "data: {\"choices\":[{\"text\":\"\",\"finish_reason\":\"length\"}]}%s%s"
             "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":%lld}}%s%s"
             "data: [DONE]%s%s",
             eol, eol, (long long)*tokens, eol, eol, eol, eol);
    put(body, usage);
    return n_events + 3;
}

enum framing { FRAME_CHUNKED, FRAME_LENGTH, FRAME_CLOSE, FRAME_COUNT };

/* The whole response: headers, then the body in the given framing. */
static void make_response(struct srv_buf *wire, const struct srv_buf *body, enum framing f) {
    put(wire, "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nCache-Control: no-cache\r\n");
    char h[80];
    if (f == FRAME_LENGTH) {
        snprintf(h, sizeof h, "Content-Length: %zu\r\n", body->len);
        put(wire, h);
    } else if (f == FRAME_CHUNKED) {
        put(wire, "Transfer-Encoding: chunked\r\n");
    } else {
        put(wire, "Connection: close\r\n");
    }
    put(wire, "\r\n");
    if (f != FRAME_CHUNKED) {
        srv_buf_append(wire, body->data, body->len);
        return;
    }
    for (size_t at = 0; at < body->len;) {
        size_t k = 1 + rnd() % 300;
        if (k > body->len - at) k = body->len - at;
        snprintf(h, sizeof h, rnd() % 2 ? "%zx%s\r\n" : "%zX%s\r\n", k, rnd() % 5 ? "" : ";ext=1");
        put(wire, h);
        srv_buf_append(wire, body->data + at, k);
        put(wire, "\r\n");
        at += k;
    }
    put(wire, rnd() % 2 ? "0\r\n\r\n" : "0\r\nX-Trailer: 1\r\n\r\n");
}

/* Feeds wire to a fresh parser in pieces of `step` bytes (0: random sizes). */
static enum lg_state feed(struct lg_resp *r, const struct srv_buf *wire, size_t step, bool eof) {
    enum lg_state st = r->state;
    for (size_t at = 0; at < wire->len && st != LG_ERROR;) {
        size_t k = step ? step : 1 + rnd() % 700;
        if (k > wire->len - at) k = wire->len - at;
        st = lg_resp_feed(r, wire->data + at, k);
        at += k;
    }
    if (eof) st = lg_resp_eof(r);
    return st;
}

static void test_streams(void) {
    rng_seed_fresh("loadgen_parse streams");
    struct lg_resp r;
    CHECK(lg_resp_init(&r, lg_completion_event, NULL));
    for (int iter = 0; iter < 300; iter++) {
        struct srv_buf body, expect, wire;
        srv_buf_init(&body, 1 << 22);
        srv_buf_init(&expect, 1 << 22);
        srv_buf_init(&wire, 1 << 22);
        int64_t tokens;
        int n_events = make_sse_body(&body, &expect, &tokens);
        enum framing f = (enum framing)(iter % FRAME_COUNT);
        make_response(&wire, &body, f);
        size_t steps[] = {wire.len, 1, 0};
        for (int s = 0; s < 3; s++) {
            struct lg_completion c;
            lg_completion_init(&c);
            lg_resp_reset(&r);
            r.event_ctx = &c;
            enum lg_state st = feed(&r, &wire, steps[s], f == FRAME_CLOSE);
            CHECK_MSG(st == LG_DONE, "iter %d framing %d step %zu: state %d: %s", iter, f, steps[s],
                      st, r.error);
            CHECK(r.status == 200 && r.sse);
            CHECK(r.keep_alive == (f != FRAME_CLOSE));
            CHECK_EQ_INT(r.n_events, n_events);
            CHECK(c.done);
            CHECK_EQ_INT(c.completion_tokens, tokens);
            CHECK_EQ_INT(c.text.len, expect.len);
            CHECK(c.text.len == expect.len &&
                  (!c.text.len || !memcmp(c.text.data, expect.data, c.text.len)));
            lg_completion_free(&c);
        }
        srv_buf_free(&body);
        srv_buf_free(&expect);
        srv_buf_free(&wire);
    }
    lg_resp_free(&r);
}

/* Multi-line data joins with '\n'; an event without a blank line after it at the end
 * of the stream is dropped (SSE); a plain body is kept whole. */
static int n_seen;
static char seen[4][64];
static bool record(void *ctx, const char *data, size_t len, char *err, size_t cap) {
    (void)ctx;
    (void)err;
    (void)cap;
    if (n_seen < 4) snprintf(seen[n_seen], sizeof seen[0], "%.*s", (int)len, data);
    n_seen++;
    return true;
}

static enum lg_state feed_str(struct lg_resp *r, const char *s, bool eof) {
    struct srv_buf b;
    srv_buf_init(&b, 1 << 20);
    put(&b, s);
    enum lg_state st = feed(r, &b, 1, eof);
    srv_buf_free(&b);
    return st;
}

static void test_fields_and_plain(void) {
    struct lg_resp r;
    CHECK(lg_resp_init(&r, record, NULL));
    n_seen = 0;
    CHECK_EQ_INT(feed_str(&r,
                          "HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
                          "data: a\ndata:b\r\ndata\rid: 7\n\ndata: tail-without-blank-line\n",
                          true),
                 LG_DONE);
    CHECK(!r.keep_alive);
    CHECK_EQ_INT(n_seen, 1);
    CHECK(!strcmp(seen[0], "a\nb\n"));

    lg_resp_reset(&r);
    CHECK_EQ_INT(feed_str(&r,
                          "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 404 Not Found\r\n"
                          "Content-Length: 11\r\n\r\n{\"e\":\"no\"}\n",
                          false),
                 LG_DONE);
    CHECK_EQ_INT(r.status, 404);
    CHECK(r.keep_alive && !r.sse);
    CHECK(r.body.len == 11 && !strcmp(r.body.data, "{\"e\":\"no\"}\n"));

    lg_resp_reset(&r);
    CHECK_EQ_INT(
        feed_str(&r, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", false),
        LG_DONE);
    CHECK(!r.keep_alive && r.body.len == 0);
    lg_resp_free(&r);
}

/* Each malformed input fails, and the message names the problem. */
static void test_errors(void) {
    static const struct {
        const char *wire, *message;
        bool eof;
    } cases[] = {
        {"HTTP/2 200\r\n\r\n", "bad status line", false},
        {"HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n", "bad Content-Length", false},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size", false},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n",
         "longer than its size", false},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\nab", "CRLF", false},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff\r\n", "too large",
         false},
        {"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nabc", "after the end", false},
        {"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab", "closed in the middle", true},
        {"", "closed before a response", true},
        {"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 40\r\n\r\n"
         "data: [DONE]\n\ndata: {}\n\n",
         "after [DONE]", false},
        {"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
         "data: {\"error\":{\"message\":\"boom\"}}\n\n",
         "error event: boom", false},
        {"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
         "data: {nope\n\n",
         "not a JSON object", false},
        {"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
         "data: {\"usage\":{\"completion_tokens\":\"7\"}}\n\n",
         "integer completion_tokens", false},
    };
    struct lg_resp r;
    CHECK(lg_resp_init(&r, lg_completion_event, NULL));
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct lg_completion c;
        lg_completion_init(&c);
        lg_resp_reset(&r);
        r.event_ctx = &c;
        enum lg_state st = feed_str(&r, cases[i].wire, cases[i].eof);
        CHECK_MSG(st == LG_ERROR && strstr(r.error, cases[i].message), "case %zu: state %d, '%s'",
                  i, st, r.error);
        lg_completion_free(&c);
    }
    /* Caps: headers, one SSE line, one event, a plain body. */
    struct srv_buf b;
    srv_buf_init(&b, 1 << 22);
    put(&b, "HTTP/1.1 200 OK\r\n");
    for (int i = 0; i < LG_HEAD_CAP / 10; i++) put(&b, "X-Pad: 12\r\n");
    lg_resp_reset(&r);
    CHECK(feed(&r, &b, 0, false) == LG_ERROR && strstr(r.error, "headers longer"));
    const char *heads[] = {
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n",
        "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"};
    const char *msgs[] = {"SSE line over", "SSE event over", "body over"};
    for (int k = 0; k < 3; k++) {
        b.len = 0;
        put(&b, heads[k]);
        size_t n = k == 2 ? LG_BODY_CAP + 1 : k == 1 ? 2 * LG_SSE_DATA_CAP : LG_SSE_LINE_CAP + 1;
        for (size_t i = 0; i < n; i += 1000) {
            if (k == 1) put(&b, "data: ");
            for (int j = 0; j < (k == 1 ? 990 : 1000); j++) srv_buf_append(&b, "x", 1);
            if (k == 1) put(&b, "\n");
        }
        lg_resp_reset(&r);
        CHECK_MSG(feed(&r, &b, 0, true) == LG_ERROR && strstr(r.error, msgs[k]), "cap %d: '%s'", k,
                  r.error);
    }
    srv_buf_free(&b);
    lg_resp_free(&r);
}

/* The template fast path: after a first chunk parsed in full, chunks that differ
 * only in a plain text skip jansson and give the same text; a chunk whose text is
 * not a plain JSON string (a raw control byte, a bare quote, a cut or unknown escape)
 * is parsed in full and fails as before; \u escapes and non-ASCII text are parsed in
 * full and kept. Texts are fresh random printable ASCII with escapes. */
static void test_template_fast_path(void) {
    rng_seed_fresh("loadgen_parse template");
    static const char head[] = "{\"id\":\"cmpl-9\",\"object\":\"text_completion\",\"created\":1,"
                               "\"model\":\"m\",\"choices\":[{\"text\":\"";
    static const char tail[] = "\",\"index\":0,\"logprobs\":null,\"finish_reason\":null}],"
                               "\"usage\":null}";
    static const char esc[] = "\"\\/\b\f\n\r\t";
    static const char *const esc_json[] = {"\\\"", "\\\\", "\\/", "\\b", "\\f", "\\n", "\\r",
                                           "\\t"};
    for (int iter = 0; iter < 200; iter++) {
        struct lg_completion c;
        lg_completion_init(&c);
        struct srv_buf want, ev;
        srv_buf_init(&want, 1 << 20);
        srv_buf_init(&ev, 1 << 20);
        char err[320] = "";
        int n_chunks = 2 + (int)(rnd() % 20);
        bool ok = true;
        for (int k = 0; k < n_chunks && ok; k++) {
            ev.len = 0;
            put(&ev, head);
            int len = 1 + (int)(rnd() % 12);
            for (int i = 0; i < len; i++) {
                if (rnd() % 4 == 0) {
                    int e = (int)(rnd() % 8);
                    srv_buf_append(&want, &esc[e], 1);
                    put(&ev, esc_json[e]);
                } else {
                    char ch = (char)(0x20 + rnd() % 0x5f);
                    if (ch == '"' || ch == '\\') ch = 'q';
                    srv_buf_append(&want, &ch, 1);
                    srv_buf_append(&ev, &ch, 1);
                }
            }
            put(&ev, tail);
            ok = lg_completion_event(&c, ev.data, ev.len, err, sizeof err);
        }
        CHECK_MSG(ok, "iter %d: %s", iter, err);
        CHECK_EQ_INT(c.n_fast, n_chunks - 1);
        CHECK(c.text.len == want.len && !memcmp(c.text.data, want.data, want.len));
        /* \u escapes and UTF-8: parsed in full, text kept. */
        ev.len = 0;
        put(&ev, head);
        put(&ev, "\\u00e9\xc3\xa9");
        put(&ev, tail);
        CHECK(lg_completion_event(&c, ev.data, ev.len, err, sizeof err));
        CHECK_EQ_INT(c.n_fast, n_chunks - 1);
        CHECK(c.text.len == want.len + 4 && !memcmp(c.text.data + want.len, "\xc3\xa9\xc3\xa9", 4));
        /* Not JSON once the template is cut out: each fails as before. */
        static const char *const bad[] = {"a\x01z", "a\"z", "a\\", "a\\x", "a\\u12"};
        const char *bad_text = bad[iter % 5];
        ev.len = 0;
        put(&ev, head);
        put(&ev, bad_text);
        put(&ev, tail);
        CHECK_MSG(!lg_completion_event(&c, ev.data, ev.len, err, sizeof err) &&
                      strstr(err, "not a JSON object"),
                  "iter %d: bad text '%s' accepted (%s)", iter, bad_text, err);
        lg_completion_free(&c);
        srv_buf_free(&want);
        srv_buf_free(&ev);
    }
}

TEST_MAIN(test_streams, test_fields_and_plain, test_errors, test_template_fast_path)
