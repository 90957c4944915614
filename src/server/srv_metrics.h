/* Server metrics, rendered as Prometheus text (GET /metrics). Writers are the HTTP
 * threads (requests by endpoint and status) and the scheduler (tokens, latencies,
 * gauges); one mutex guards everything, since every update is a few adds. */
#ifndef LLMOPT_SERVER_SRV_METRICS_H
#define LLMOPT_SERVER_SRV_METRICS_H

#include <stddef.h>
#include <stdint.h>

enum srv_endpoint {
    SRV_EP_CHAT,        /* /v1/chat/completions */
    SRV_EP_COMPLETIONS, /* /v1/completions */
    SRV_EP_MODELS,      /* /v1/models */
    SRV_EP_HEALTH,      /* /health */
    SRV_EP_METRICS,     /* /metrics */
    SRV_EP_OTHER,       /* anything else (404s) */
    SRV_EP_COUNT
};
extern const char *const srv_endpoint_names[SRV_EP_COUNT];

struct srv_metrics;

struct srv_metrics *srv_metrics_create(void);
void srv_metrics_free(struct srv_metrics *m);

void srv_metrics_request(struct srv_metrics *m, enum srv_endpoint ep, int status);
/* prompt: tokens of an admitted request's prompt, cached: how many of them came from
 * the prefix cache instead of a forward. */
void srv_metrics_tokens(struct srv_metrics *m, int64_t prompt, int64_t cached, int64_t generated);
void srv_metrics_ttft(struct srv_metrics *m, double seconds);
void srv_metrics_itl(struct srv_metrics *m, double seconds);
/* Gauges, published by each engine's scheduler after each step (engine <
 * SRV_METRICS_MAX_ENGINES); /metrics shows their sums. */
#define SRV_METRICS_MAX_ENGINES 16
void srv_metrics_gauges(struct srv_metrics *m, int engine, int64_t queue_depth, int64_t running,
                        int64_t kv_blocks_in_use, int64_t kv_blocks_cached);
void srv_metrics_cancelled(struct srv_metrics *m);

/* Where the scheduler thread's time goes, in wall seconds (see srv_sched.c). */
enum srv_phase {
    SRV_PHASE_BATCH,   /* admitting, building the token batch */
    SRV_PHASE_FORWARD, /* llmopt_session_forward, or _forward_sample (its sampling too) */
    SRV_PHASE_SAMPLE,  /* sampling logits rows, detokenizing, stop sequences, posting events */
    SRV_PHASE_RETIRE,  /* freeing finished requests' slots, publishing gauges */
    SRV_PHASE_IDLE,    /* waiting for work or for readers to make room */
    SRV_PHASE_COUNT
};
extern const char *const srv_phase_names[SRV_PHASE_COUNT];
/* One scheduler step: the forward's tokens and logits rows, and seconds per phase
 * (idle included: the wait before the step). */
void srv_metrics_step(struct srv_metrics *m, int64_t tokens, int64_t rows,
                      const double seconds[SRV_PHASE_COUNT]);

/* The Prometheus text exposition; free() it. NULL when out of memory. */
char *srv_metrics_render(struct srv_metrics *m, size_t *len);

#endif
