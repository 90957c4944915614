/* Incremental HTTP/1.1 response parser of the load generator (bench/loadgen.c): feed it
 * the bytes of one response in pieces of any size; it decodes the status line, the
 * headers, a chunked, Content-Length or read-until-close body, and, for a
 * text/event-stream body, the SSE events, whose `data:` payloads go to a callback.
 * Every buffer has a hard cap: a response that needs more is an error, never growth.
 * No I/O here, so tests/unit/test_loadgen_parse.c drives it with byte strings. */
#ifndef LLMOPT_BENCH_LOADGEN_PARSE_H
#define LLMOPT_BENCH_LOADGEN_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server/srv_buf.h" /* the server's capped byte buffer */

#define LG_HEAD_CAP     8192       /* status line + headers */
#define LG_LINE_CAP     256        /* a chunk-size or trailer line */
#define LG_SSE_LINE_CAP 65536      /* one SSE line */
#define LG_SSE_DATA_CAP 65536      /* one event's joined data lines */
#define LG_BODY_CAP     (1u << 20) /* a plain (non-SSE) body, or one request's completion text */

enum lg_state {
    LG_HEAD,       /* reading the status line and headers */
    LG_CHUNK_SIZE, /* chunked: a size line */
    LG_CHUNK_DATA, /* chunked: `remaining` bytes of data */
    LG_CHUNK_CRLF, /* chunked: the CRLF after the data */
    LG_TRAILER,    /* chunked: trailer lines up to an empty one */
    LG_BODY_LEN,   /* Content-Length: `remaining` bytes */
    LG_BODY_EOF,   /* neither: the body ends when the peer closes */
    LG_DONE,       /* the whole response was read */
    LG_ERROR,      /* error[] says why */
    LG_STATE_COUNT
};

/* Called with each SSE event's data (data lines joined by '\n', NUL-terminated);
 * returns false to fail the response with the message it wrote to err. */
typedef bool (*lg_event_fn)(void *ctx, const char *data, size_t len, char *err, size_t err_cap);

struct lg_resp {
    enum lg_state state;
    int status;      /* HTTP status code */
    bool chunked;    /* Transfer-Encoding: chunked */
    bool sse;        /* Content-Type: text/event-stream */
    bool keep_alive; /* the connection may carry another request */
    bool got_bytes;  /* any byte arrived (a reused connection that closes at once did not) */
    int64_t remaining;
    char head[LG_HEAD_CAP + 1];
    size_t head_len;
    char line[LG_LINE_CAP + 1];
    size_t line_len;
    /* SSE */
    char *sse_line; /* (LG_SSE_LINE_CAP + 1) */
    size_t sse_line_len;
    bool sse_cr;    /* the last byte was a CR: a following LF belongs to it */
    char *sse_data; /* (LG_SSE_DATA_CAP + 1) */
    size_t sse_data_len;
    bool sse_has_data; /* a data field was seen in the event being read */
    int64_t n_events;
    lg_event_fn on_event;
    void *event_ctx;
    struct srv_buf body; /* a plain body */
    char error[256];
};

/* on_event may be NULL (events are counted only). Returns false when out of memory. */
bool lg_resp_init(struct lg_resp *r, lg_event_fn on_event, void *event_ctx);
/* Ready for the next response on the same connection (keeps the buffers). */
void lg_resp_reset(struct lg_resp *r);
void lg_resp_free(struct lg_resp *r);
/* Feeds n bytes; returns the new state. Bytes past the end of the response (the
 * server never pipelines) are an error. */
enum lg_state lg_resp_feed(struct lg_resp *r, const char *p, size_t n);
/* The peer closed the connection; returns the new state. */
enum lg_state lg_resp_eof(struct lg_resp *r);

/* One streamed completion as the OpenAI protocol sends it: the text of every
 * choice, usage.completion_tokens from the usage chunk, and whether [DONE] came. */
struct lg_completion {
    struct srv_buf text;
    int64_t completion_tokens; /* -1 until a usage chunk says */
    bool done;                 /* data: [DONE] was seen */
    /* The first text chunk, parsed in full, with its text cut out (at tmpl_head): a
     * later chunk that is this template around a plain JSON string skips jansson. */
    char *tmpl;
    size_t tmpl_head, tmpl_len;
    int64_t n_fast; /* chunks that took that fast path */
};
void lg_completion_init(struct lg_completion *c);
void lg_completion_free(struct lg_completion *c);
/* An lg_event_fn whose ctx is a struct lg_completion: parses one chunk's JSON. An
 * "error" object, a chunk after [DONE] or one that is not JSON fails the response.
 * Fast path: a chunk equal to the stream's template (above) around a JSON string of
 * printable ASCII and simple escapes is that same JSON object with that text, so its
 * text is unescaped directly (a few times cheaper than jansson's tree); anything else
 * is parsed in full. */
bool lg_completion_event(void *ctx, const char *data, size_t len, char *err, size_t err_cap);

#endif
