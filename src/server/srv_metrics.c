/* Counters, gauges and fixed-bucket histograms (see srv_metrics.h). */
#include "server/srv_metrics.h"

#include "server/srv_buf.h"

#include <assert.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

const char *const srv_endpoint_names[SRV_EP_COUNT] = {
    "/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics", "other",
};
static_assert(sizeof srv_endpoint_names / sizeof srv_endpoint_names[0] == SRV_EP_COUNT,
              "one name per endpoint");

const char *const srv_phase_names[SRV_PHASE_COUNT] = {"batch", "forward", "sample", "retire",
                                                      "idle"};
static_assert(sizeof srv_phase_names / sizeof srv_phase_names[0] == SRV_PHASE_COUNT,
              "one name per scheduler phase");

/* The statuses the server answers with; anything else is counted as "other". */
static const int status_codes[] = {200, 204, 400, 401, 404, 405, 413, 429, 500, 503};
#define N_STATUS (sizeof status_codes / sizeof status_codes[0] + 1)

/* Seconds. TTFT spans queueing + prefill; ITL is one decode step. */
static const double ttft_bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
static const double itl_bounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                    0.05,   0.1,   0.25,   0.5,   1,    2.5};
#define HIST_MAX_BOUNDS 12

struct hist {
    const double *bounds;
    int n_bounds;
    uint64_t count[HIST_MAX_BOUNDS + 1]; /* per bucket, not cumulative; last is +Inf */
    double sum;
    uint64_t n;
};

/* What one engine's scheduler last published (srv_metrics_gauges). */
struct engine_gauges {
    int64_t queue_depth, running, kv_blocks_in_use, kv_blocks_cached;
};

struct srv_metrics {
    pthread_mutex_t mu;
    uint64_t requests[SRV_EP_COUNT][N_STATUS];
    uint64_t prompt_tokens, cached_tokens, generated_tokens, cancelled;
    struct hist ttft, itl;
    struct engine_gauges gauge[SRV_METRICS_MAX_ENGINES];
    uint64_t steps, step_tokens, step_rows;
    double phase_seconds[SRV_PHASE_COUNT];
};

struct srv_metrics *srv_metrics_create(void) {
    struct srv_metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_mutex_init(&m->mu, NULL);
    m->ttft = (struct hist){.bounds = ttft_bounds, .n_bounds = sizeof ttft_bounds / sizeof(double)};
    m->itl = (struct hist){.bounds = itl_bounds, .n_bounds = sizeof itl_bounds / sizeof(double)};
    return m;
}

void srv_metrics_free(struct srv_metrics *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void srv_metrics_request(struct srv_metrics *m, enum srv_endpoint ep, int status) {
    size_t k = N_STATUS - 1;
    for (size_t i = 0; i + 1 < N_STATUS; i++)
        if (status_codes[i] == status) k = i;
    pthread_mutex_lock(&m->mu);
    m->requests[ep][k]++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_tokens(struct srv_metrics *m, int64_t prompt, int64_t cached, int64_t generated) {
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += (uint64_t)prompt;
    m->cached_tokens += (uint64_t)cached;
    m->generated_tokens += (uint64_t)generated;
    pthread_mutex_unlock(&m->mu);
}

static void hist_observe(struct hist *h, double v) {
    int b = 0;
    while (b < h->n_bounds && v > h->bounds[b]) b++;
    h->count[b]++;
    h->sum += v;
    h->n++;
}

void srv_metrics_ttft(struct srv_metrics *m, double seconds) {
    pthread_mutex_lock(&m->mu);
    hist_observe(&m->ttft, seconds);
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_itl(struct srv_metrics *m, double seconds) {
    pthread_mutex_lock(&m->mu);
    hist_observe(&m->itl, seconds);
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_gauges(struct srv_metrics *m, int engine, int64_t queue_depth, int64_t running,
                        int64_t kv_blocks_in_use, int64_t kv_blocks_cached) {
    if (engine < 0 || engine >= SRV_METRICS_MAX_ENGINES) return;
    pthread_mutex_lock(&m->mu);
    m->gauge[engine] = (struct engine_gauges){queue_depth, running, kv_blocks_in_use, kv_blocks_cached};
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_cancelled(struct srv_metrics *m) {
    pthread_mutex_lock(&m->mu);
    m->cancelled++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_step(struct srv_metrics *m, int64_t tokens, int64_t rows,
                      const double seconds[SRV_PHASE_COUNT]) {
    pthread_mutex_lock(&m->mu);
    if (tokens > 0) m->steps++;
    m->step_tokens += (uint64_t)tokens;
    m->step_rows += (uint64_t)rows;
    for (int i = 0; i < SRV_PHASE_COUNT; i++) m->phase_seconds[i] += seconds[i];
    pthread_mutex_unlock(&m->mu);
}

static void hist_render(struct srv_buf *b, const char *name, const char *help,
                        const struct hist *h) {
    srv_buf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < h->n_bounds; i++) {
        cum += h->count[i];
        srv_buf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i],
                       (unsigned long long)cum);
    }
    cum += h->count[h->n_bounds];
    srv_buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    srv_buf_printf(b, "%s_sum %.9g\n%s_count %llu\n", name, h->sum, name, (unsigned long long)h->n);
}

char *srv_metrics_render(struct srv_metrics *m, size_t *len) {
    struct srv_buf b;
    srv_buf_init(&b, 1 << 20);
    pthread_mutex_lock(&m->mu);
    struct engine_gauges g = {0}; /* summed over engines */
    for (int e = 0; e < SRV_METRICS_MAX_ENGINES; e++) {
        g.queue_depth += m->gauge[e].queue_depth;
        g.running += m->gauge[e].running;
        g.kv_blocks_in_use += m->gauge[e].kv_blocks_in_use;
        g.kv_blocks_cached += m->gauge[e].kv_blocks_cached;
    }
    srv_buf_puts(&b,
                 "# HELP llmopt_requests_total HTTP requests answered, by endpoint and status.\n"
                 "# TYPE llmopt_requests_total counter\n");
    for (int ep = 0; ep < SRV_EP_COUNT; ep++)
        for (size_t k = 0; k < N_STATUS; k++) {
            if (!m->requests[ep][k]) continue;
            if (k + 1 < N_STATUS)
                srv_buf_printf(&b, "llmopt_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n",
                               srv_endpoint_names[ep], status_codes[k],
                               (unsigned long long)m->requests[ep][k]);
            else
                srv_buf_printf(&b, "llmopt_requests_total{endpoint=\"%s\",status=\"other\"} %llu\n",
                               srv_endpoint_names[ep], (unsigned long long)m->requests[ep][k]);
        }
    srv_buf_printf(&b,
                   "# HELP llmopt_prompt_tokens_total Prompt tokens of admitted requests.\n"
                   "# TYPE llmopt_prompt_tokens_total counter\n"
                   "llmopt_prompt_tokens_total %llu\n"
                   "# HELP llmopt_prompt_tokens_cached_total Prompt tokens taken from the prefix cache.\n"
                   "# TYPE llmopt_prompt_tokens_cached_total counter\n"
                   "llmopt_prompt_tokens_cached_total %llu\n"
                   "# HELP llmopt_generated_tokens_total Tokens generated (sampled).\n"
                   "# TYPE llmopt_generated_tokens_total counter\n"
                   "llmopt_generated_tokens_total %llu\n"
                   "# HELP llmopt_requests_cancelled_total Requests whose client went away.\n"
                   "# TYPE llmopt_requests_cancelled_total counter\n"
                   "llmopt_requests_cancelled_total %llu\n"
                   "# HELP llmopt_queue_depth Requests waiting for a sequence slot.\n"
                   "# TYPE llmopt_queue_depth gauge\n"
                   "llmopt_queue_depth %lld\n"
                   "# HELP llmopt_requests_running Requests holding a sequence slot.\n"
                   "# TYPE llmopt_requests_running gauge\n"
                   "llmopt_requests_running %lld\n"
                   "# HELP llmopt_kv_blocks_in_use KV cache blocks held by running requests.\n"
                   "# TYPE llmopt_kv_blocks_in_use gauge\n"
                   "llmopt_kv_blocks_in_use %lld\n"
                   "# HELP llmopt_kv_blocks_cached KV cache blocks the prefix cache keeps (in use or not).\n"
                   "# TYPE llmopt_kv_blocks_cached gauge\n"
                   "llmopt_kv_blocks_cached %lld\n",
                   (unsigned long long)m->prompt_tokens, (unsigned long long)m->cached_tokens,
                   (unsigned long long)m->generated_tokens,
                   (unsigned long long)m->cancelled, (long long)g.queue_depth, (long long)g.running,
                   (long long)g.kv_blocks_in_use, (long long)g.kv_blocks_cached);
    srv_buf_printf(&b,
                   "# HELP llmopt_scheduler_steps_total Forwards run by the scheduler.\n"
                   "# TYPE llmopt_scheduler_steps_total counter\n"
                   "llmopt_scheduler_steps_total %llu\n"
                   "# HELP llmopt_scheduler_batch_tokens_total Tokens fed through those forwards.\n"
                   "# TYPE llmopt_scheduler_batch_tokens_total counter\n"
                   "llmopt_scheduler_batch_tokens_total %llu\n"
                   "# HELP llmopt_scheduler_logit_rows_total Logits rows sampled from.\n"
                   "# TYPE llmopt_scheduler_logit_rows_total counter\n"
                   "llmopt_scheduler_logit_rows_total %llu\n"
                   "# HELP llmopt_scheduler_seconds_total Scheduler thread wall seconds by phase.\n"
                   "# TYPE llmopt_scheduler_seconds_total counter\n",
                   (unsigned long long)m->steps, (unsigned long long)m->step_tokens,
                   (unsigned long long)m->step_rows);
    for (int i = 0; i < SRV_PHASE_COUNT; i++)
        srv_buf_printf(&b, "llmopt_scheduler_seconds_total{phase=\"%s\"} %.9g\n", srv_phase_names[i],
                       m->phase_seconds[i]);
    hist_render(&b, "llmopt_time_to_first_token_seconds",
                "Seconds from a request's arrival to its first generated token.", &m->ttft);
    hist_render(&b, "llmopt_inter_token_latency_seconds",
                "Seconds between consecutive tokens of one request.", &m->itl);
    pthread_mutex_unlock(&m->mu);
    if (b.failed) {
        srv_buf_free(&b);
        return NULL;
    }
    return srv_buf_take(&b, len);
}
