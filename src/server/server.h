/* llmopt serve: the OpenAI-compatible server as one call, for tools/cmd_serve.c.
 * Layers, top to bottom: http.c (libmicrohttpd) -> srv_api.c (endpoints, OpenAI
 * shapes) -> srv_sched.c (continuous batching over one session) -> the public API. */
#ifndef LLMOPT_SERVER_SERVER_H
#define LLMOPT_SERVER_SERVER_H

#include "llmopt.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* --stream-batch's upper bound: a request's event ring (SRV_EVENT_CAP 16) less the room
 * a token and the final event need (srv_sched_create checks it against the ring). */
#define SRV_STREAM_BATCH_MAX 14

struct srv_opts {
    const char *model_path;
    const char *programs_dir;       /* NULL: the default */
    const char *host;               /* "127.0.0.1" */
    int port;                       /* 0: any free port */
    const char *api_key;            /* NULL: no authentication */
    const char *chat_template_path; /* NULL: the model's own template */
    int32_t n_slots;                /* sequences decoded together (--parallel) */
    int32_t n_ctx;                  /* positions per sequence; 0: the model's default */
    int32_t prefill_chunk;          /* prompt tokens per step */
    int32_t queue_cap;              /* requests waiting for a slot */
    int32_t stream_batch;           /* tokens per reader wake-up while streams share steps */
    int32_t n_threads;              /* CPU threads for each engine's kernels; 0: automatic */
    int32_t n_engines;              /* sessions with a scheduler thread each (--engines); 0: automatic */
    const char *backend;            /* llmopt_session_opts.backend: NULL / "cpu", "cpu-ref" or "cuda" */
    enum llmopt_kv_type kv_type;    /* KV cache element type; DEFAULT: the model's / f16 */
    size_t max_body;                /* bytes of a request body */
    bool prefix_cache;              /* reuse the KV blocks of prompt prefixes seen before */
    bool verbose;
};

/* Loads the model, serves until SIGINT or SIGTERM, then shuts down cleanly. */
enum llmopt_status srv_run(const struct srv_opts *o, struct llmopt_err *err);

#endif
