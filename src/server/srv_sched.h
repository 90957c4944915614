/* Continuous batching: one scheduler thread owns a session (an engine); a server runs
 * one engine or several, each with its own session, slots and thread (data
 * parallelism for models whose kernels are too small to split across CPUs). Requests wait in a
 * bounded queue, are admitted into free sequence slots between steps, and each step
 * runs one token-batch forward that mixes the decode tokens of running requests with
 * chunks of new prompts. Results flow back to the HTTP threads through a small
 * bounded event ring per request; a request whose ring is full (a slow reader) simply
 * sits out steps until its reader catches up, so it never stalls anyone else.
 *
 * Threads: srv_sched_submit / srv_req_* are called by HTTP threads; everything else
 * of a running request belongs to the scheduler thread. A reader either blocks in
 * srv_req_next (woken through a condition variable) or parks (srv_req_park) and is
 * woken through a callback; the scheduler also watches each request's client. */
#ifndef LLMOPT_SERVER_SRV_SCHED_H
#define LLMOPT_SERVER_SRV_SCHED_H

#include "llmopt.h"
#include "server/srv_metrics.h"
#include "server/srv_request.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SRV_EVENT_CAP 16 /* events buffered per request */

enum srv_finish {
    SRV_FINISH_NONE,   /* still running */
    SRV_FINISH_STOP,   /* end-of-generation token or a stop sequence */
    SRV_FINISH_LENGTH, /* max_tokens or the context is full */
    SRV_FINISH_CANCEL, /* the client went away */
    SRV_FINISH_ERROR,  /* the forward failed or the server is shutting down */
    SRV_FINISH_COUNT
};

/* One generated token as the client sees it: the text released with it (stop
 * sequences hold text back, so text may belong to earlier tokens, or be empty) and,
 * when asked for, its log-probability and the top alternatives. A finishing request
 * may add one last event with text only (token -1). */
struct srv_event {
    char *text; /* heap, NUL-terminated; NULL when empty */
    size_t text_len;
    int32_t token; /* -1: no token */
    float logprob; /* log-softmax of the raw logits */
    int32_t n_top;
    int32_t top_id[SRV_MAX_TOP_LOGPROBS];
    float top_logprob[SRV_MAX_TOP_LOGPROBS];
};
void srv_event_clear(struct srv_event *ev);

struct srv_sched_opts {
    int32_t n_slots;       /* sequences decoded together */
    int32_t n_ctx;         /* positions per sequence; 0: the model's default */
    int32_t prefill_chunk; /* prompt tokens per step, across requests */
    int32_t queue_cap;     /* requests waiting for a slot before submit says FULL */
    /* While more than one request runs, a reader is woken once this many events wait
     * for it (or its request ends) instead of for every token: fewer wake-ups and
     * context switches per token, each chunk up to stream_batch - 1 steps later.
     * 1: every token at once. 1 .. SRV_EVENT_CAP - 2. */
    int32_t stream_batch;
    int32_t n_threads;     /* CPU threads for the session's kernels; 0: every CPU */
    enum llmopt_kv_type kv_type; /* KV cache element type */
    bool prefix_cache;           /* reuse KV blocks of prompt prefixes computed before */
    /* Engines (sessions with their own scheduler thread) sharing the n_slots slots and
     * the queue places; n_threads is each engine's. 0: automatic, one engine per
     * llmopt_model_cpu_threads CPUs of the process, while each keeps >= 8 slots. */
    int32_t n_engines;
    /* llmopt_session_opts.backend of every engine. A device backend ("cuda") runs one
     * engine (automatic) and refuses more: each engine would hold its own copy of the
     * weights on the one device. */
    const char *backend;
};
#define SRV_MAX_ENGINES SRV_METRICS_MAX_ENGINES /* each engine has its gauges there */

struct srv_sched;
struct srv_req;

enum llmopt_status srv_sched_create(const struct llmopt_model *m, const struct srv_sched_opts *o,
                                    struct srv_metrics *metrics, struct srv_sched **out,
                                    struct llmopt_err *err);
/* Ends every queued and running request (SRV_FINISH_ERROR) and joins the threads. */
void srv_sched_stop(struct srv_sched *s);
/* After srv_sched_stop and after every request was released. */
void srv_sched_free(struct srv_sched *s);
int32_t srv_sched_n_ctx(const struct srv_sched *s);
/* Requests holding a slot now, in every engine (any thread; a snapshot). */
int32_t srv_sched_n_running(const struct srv_sched *s);
int32_t srv_sched_n_engines(const struct srv_sched *s);
const struct llmopt_session *srv_sched_session(const struct srv_sched *s, int32_t engine);

/* A check the scheduler runs on a request's client every SRV_WATCH_MS while the
 * request waits or runs: true when the client went away (the request is then
 * cancelled). The argument is copied at submit, so it needs no lifetime of its own. */
typedef bool (*srv_gone_fn)(intptr_t arg);
#define SRV_WATCH_MS 100

struct srv_req_spec {
    const int32_t *prompt;
    int32_t n_prompt;   /* 1 .. n_ctx - 1 */
    int64_t max_tokens; /* -1: until end of text or a full context */
    struct llmopt_sampling sampling;
    int32_t logprobs; /* -1: none; else top alternatives (<= SRV_MAX_TOP_LOGPROBS) */
    int32_t n_stop;
    char *const *stop;
    const size_t *stop_len;
    srv_gone_fn gone; /* NULL: nobody to watch */
    intptr_t gone_arg;
    bool whole; /* the reader wants the whole result only (a non-streamed reply): it is
                 * woken when the ring is nearly full or the request ends, not per token */
};

enum srv_submit {
    SRV_SUBMIT_OK,
    SRV_SUBMIT_FULL,     /* the wait queue is full */
    SRV_SUBMIT_STOPPING, /* the server is shutting down */
    SRV_SUBMIT_ERROR,    /* err says why (bad sampling parameters, out of memory) */
};
/* Queues the request at the least loaded engine (see srv_sched.c). */
enum srv_submit srv_sched_submit(struct srv_sched *s, const struct srv_req_spec *spec,
                                 struct srv_req **out, struct llmopt_err *err);

enum srv_next {
    SRV_NEXT_EVENT,   /* *ev filled; srv_event_clear it */
    SRV_NEXT_TIMEOUT, /* nothing within timeout_ms */
    SRV_NEXT_END,     /* finished and every event taken */
};
enum srv_next srv_req_next(struct srv_req *r, struct srv_event *ev, int timeout_ms);

/* For readers on an event loop, which must not block in srv_req_next: when no event
 * waits and r has not ended, calls park(ctx) under r's lock (the HTTP layer suspends
 * the connection there) and returns true; the scheduler then calls wake(ctx) once,
 * from its own thread, when there are events for the reader (subject to stream_batch)
 * or r ends: always after park(ctx) returned, since it takes the callback under the
 * same lock. Returns false, calling nothing, when there is something to take now. */
typedef void (*srv_park_fn)(void *ctx);
bool srv_req_park(struct srv_req *r, srv_park_fn park, srv_park_fn wake, void *ctx);

struct srv_req_result {
    enum srv_finish finish;
    int32_t n_prompt, n_generated; /* n_generated: 0 until the request is done */
    int32_t n_cached; /* prompt tokens taken from the prefix cache (final once admitted) */
    char error[256];
};
void srv_req_result(struct srv_req *r, struct srv_req_result *out);
/* The HTTP side is done with r: cancels it if it still runs. */
void srv_req_release(struct srv_req *r);

#endif
