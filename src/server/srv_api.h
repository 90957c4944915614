/* The OpenAI-compatible endpoints, independent of the HTTP library: a request comes
 * in as method, path, headers of interest and body bytes; a reply goes out as a
 * status and a body, or as an SSE stream read piece by piece. http.c feeds it from
 * libmicrohttpd. */
#ifndef LLMOPT_SERVER_SRV_API_H
#define LLMOPT_SERVER_SRV_API_H

#include "llmopt.h"
#include "server/srv_metrics.h"
#include "server/srv_sched.h"

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct srv_app_opts {
    const char *model_id;      /* the name /v1/models lists and requests may use */
    const char *api_key;       /* NULL: no authentication */
    size_t max_body;           /* bytes of a request body */
    const char *template_note; /* why chat is unavailable when tmpl is NULL */
};

struct srv_app;
/* Borrows everything; none of it may go before srv_app_free. tmpl may be NULL. */
struct srv_app *srv_app_create(const struct llmopt_model *m,
                               const struct llmopt_chat_template *tmpl, struct srv_sched *sched,
                               struct srv_metrics *metrics, const struct srv_app_opts *o);
void srv_app_free(struct srv_app *a);
/* From now on new generation requests get 503 and /health says so. */
void srv_app_set_stopping(struct srv_app *a);
size_t srv_app_max_body(const struct srv_app *a);
/* Waits until no generation reply is in flight; false after timeout_ms. */
bool srv_app_wait_idle(struct srv_app *a, int timeout_ms);

struct srv_stream;
struct srv_pending;

struct srv_reply {
    int status; /* 0: answer nothing, close the connection (unless pending is set) */
    const char *content_type;
    char *body; /* heap (free()); NULL for none */
    size_t len;
    struct srv_stream *stream;   /* non-NULL: the body is an SSE stream */
    struct srv_pending *pending; /* non-NULL: no reply yet; see srv_pending_poll */
    bool preflight;              /* a CORS preflight: add the Allow-* headers */
};
void srv_reply_clear(struct srv_reply *r);

/* Before the body is read: route, method, authorization and the declared length.
 * Returns true with *out filled when that already decides the answer. */
bool srv_app_precheck(struct srv_app *a, const char *method, const char *path,
                      const char *authorization, const char *content_length, struct srv_reply *out);
/* The whole request. too_large: the body passed max_body and was cut. Nothing here
 * blocks: a generation request that does not stream comes back as out->pending.
 * gone(gone_arg) tells the scheduler whether the client went away (it cancels the
 * request then); NULL for no watch. */
void srv_app_handle(struct srv_app *a, const char *method, const char *path, const char *body,
                    size_t len, bool too_large, srv_gone_fn gone, intptr_t gone_arg,
                    struct srv_reply *out);

/* Next bytes of an SSE stream: > 0 bytes written to buf, 0 at the end, -1 when the
 * stream must be cut (out of memory), SRV_STREAM_WAIT when nothing is there yet (park
 * with srv_stream_park, or try again). Blocks only while the stream's request runs
 * alone, up to block_ms for its next event: for an event-loop caller that delays its
 * other connections that long, and saves a park and resume (a suspend, a resume, a
 * wake-up of the loop) per token of a lone stream. */
#define SRV_STREAM_WAIT (-2)
ssize_t srv_stream_read(struct srv_stream *st, char *buf, size_t max, int block_ms);
/* Whether the stream's request shares the scheduler with other running requests. */
bool srv_stream_shared(const struct srv_stream *st);
/* srv_req_park for the stream's request: false when there is something to read now. */
bool srv_stream_park(struct srv_stream *st, srv_park_fn park, srv_park_fn wake, void *ctx);
/* Ends the stream; cancels the request if it still runs. */
void srv_stream_free(struct srv_stream *st);

/* A non-streamed generation: takes what the scheduler produced so far; true once the
 * request ended, with *out the reply (status 0: the client went away, close). Never
 * blocks; after true, only srv_pending_free may follow. */
bool srv_pending_poll(struct srv_pending *pd, struct srv_reply *out);
/* srv_req_park for the request: false when srv_pending_poll has something to take. */
bool srv_pending_park(struct srv_pending *pd, srv_park_fn park, srv_park_fn wake, void *ctx);
/* Lets go of pd; cancels its request if it still runs. */
void srv_pending_free(struct srv_pending *pd);

#endif
