/* The continuous-batching scheduler (see srv_sched.h). The loop, in one breath:
 *
 *   admit queued requests into free slots
 *   batch = one decode token per running request whose reader has room
 *         + prompt chunks of requests still prefilling, up to prefill_chunk tokens
 *   forward(batch), logits only for the rows that end a request's input
 *   per row: sample, detokenize, match stop sequences, post an event
 *   retire finished or cancelled requests: reset their slot, drop their reference
 *
 * Locks: e->mu guards the wait queue and the wake counter; r->mu guards a request's
 * event ring and finish state. Neither is held across a forward. Order: e->mu before
 * r->mu (admission checks waiters under e->mu); HTTP threads drop r->mu before they
 * take e->mu to wake the scheduler. */
#define _GNU_SOURCE /* memmem */
#include "server/srv_sched.h"

#include "base/clock.h"
#include "base/cpu_features.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct srv_req {
    struct srv_engine *eng; /* the engine it was submitted to */
    atomic_int refs; /* the HTTP side and the scheduler */

    /* Set by submit, read-only afterwards. */
    int32_t *tokens; /* (n_prompt + max_new) prompt then generated ids */
    int32_t n_prompt, max_new;
    int32_t logprobs; /* -1: none */
    int32_t n_stop;
    char *stop[SRV_MAX_STOP];
    size_t stop_len[SRV_MAX_STOP];
    struct llmopt_sampling sampling;
    struct llmopt_sampler *sampler; /* made at admission: O(n_vocab) scratch per request */
    struct llmopt_detok *detok;     /* primed with the prompt, so spacing continues it */
    double t_submit;

    /* Scheduler thread only. */
    int32_t slot;   /* -1 while queued */
    int32_t n_fed;  /* tokens in the slot's sequence */
    int32_t n_cached; /* of them, attached from the prefix cache at admission */
    int32_t n_step; /* tokens added by the step being built */
    int32_t n_gen;
    double t_last;                     /* when the previous token was sampled */
    char held[2 * SRV_MAX_STOP_BYTES]; /* text that may still begin a stop sequence */
    size_t held_len;
    char *piece; /* held + the new piece, while matching */
    size_t piece_cap;
    bool wake;       /* events posted this step: the reader may need a signal */
    int32_t pending; /* events in the ring when the last one was posted */

    /* Shared, under mu. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct srv_event ev[SRV_EVENT_CAP];
    int32_t ev_head, ev_count;
    enum srv_finish finish;
    bool done; /* the scheduler let go: no more events */
    bool cancelled;
    char error[256];
    srv_park_fn reader_wake; /* a parked reader: called once, then cleared */
    void *reader_ctx;
    srv_gone_fn gone; /* the client watch; cleared when the HTTP side lets go */
    intptr_t gone_arg;
    int32_t wake_events; /* SRV_EVENT_CAP - 2 for a whole-result reader, else 1 */
};

/* One engine: a session, its scheduler thread and its wait queue. */
struct srv_engine {
    int32_t index; /* in the set, for the metrics' per-engine gauges */
    const struct llmopt_model *model;
    struct llmopt_session *session;
    struct srv_metrics *metrics;
    int32_t n_slots, n_ctx, n_vocab, n_batch, prefill_chunk, queue_cap;
    int32_t stream_batch; /* events a shared stream's reader is woken for (1: each) */

    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct srv_req **queue; /* (q_size) ring of waiting requests */
    int32_t q_size;         /* queue_cap + n_slots: waiters plus those a free slot takes */
    int32_t q_head, q_count;
    bool stopping;
    uint64_t wake_seq;    /* bumped by every event that may unblock a step */
    atomic_int n_running; /* requests holding a slot (read by submit) */

    /* Scheduler thread only. */
    struct srv_req **active; /* (n_slots) running requests, in admission order */
    int32_t n_active;
    bool *slot_busy;                                /* (n_slots) */
    int32_t *tokens, *positions, *slots, *out_rows; /* (n_batch) the step's batch */
    struct srv_req **out_req;                       /* (n_batch) whose logits each out row is */
    float *scratch;                                 /* (n_vocab) logits the sampler may modify */
    /* (n_batch) each out row's sampler, history and drawn id, for
     * llmopt_session_forward_sample */
    struct llmopt_sampler **row_sampler;
    const int32_t **row_history;
    size_t *row_n_history;
    int32_t *row_id;
    double t_watch;                    /* when clients were last checked */
    double lap_t;                      /* when the current phase began */
    double lap[SRV_PHASE_COUNT];       /* seconds per phase since the last publish */
    int64_t lap_tokens, lap_rows;      /* the step's forward: tokens in, logits rows out */
};

/* Forward time (seconds) from which a step wakes every reader whatever --stream-batch
 * says: a wake-up costs a few microseconds, so holding a token back a step only pays
 * for steps far shorter than this. */
#define SRV_STREAM_BATCH_MAX_STEP_S 0.002

/* Ends the scheduler's current phase, charging its time to p. */
static void sched_lap(struct srv_engine *e, enum srv_phase p) {
    double t = clock_now_s();
    e->lap[p] += t - e->lap_t;
    e->lap_t = t;
}

void srv_event_clear(struct srv_event *ev) {
    free(ev->text);
    ev->text = NULL;
    ev->text_len = 0;
}

/* ---- request lifetime ---- */

static void req_free(struct srv_req *r) {
    for (int32_t i = 0; i < r->ev_count; i++)
        srv_event_clear(&r->ev[(r->ev_head + i) % SRV_EVENT_CAP]);
    for (int32_t i = 0; i < r->n_stop; i++) free(r->stop[i]);
    llmopt_sampler_free(r->sampler);
    llmopt_detok_free(r->detok);
    free(r->tokens);
    free(r->piece);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

static void req_unref(struct srv_req *r) {
    if (atomic_fetch_sub(&r->refs, 1) == 1) req_free(r);
}

static void sched_wake(struct srv_engine *e) {
    pthread_mutex_lock(&e->mu);
    e->wake_seq++;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

static enum srv_submit engine_submit(struct srv_engine *e, const struct srv_req_spec *spec,
                                 struct srv_req **out, struct llmopt_err *err) {
    *out = NULL;
    if (spec->n_prompt < 1 || spec->n_prompt >= e->n_ctx || spec->n_stop > SRV_MAX_STOP ||
        spec->logprobs > SRV_MAX_TOP_LOGPROBS) {
        snprintf(err->msg, sizeof err->msg, "submit: prompt of %d tokens, context %d",
                 spec->n_prompt, e->n_ctx);
        err->status = LLMOPT_ERR_INVALID_ARG;
        return SRV_SUBMIT_ERROR;
    }
    struct srv_req *r = calloc(1, sizeof *r);
    if (!r) goto nomem;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    atomic_init(&r->refs, 2);
    r->eng = e;
    r->slot = -1;
    r->n_prompt = spec->n_prompt;
    int64_t room = e->n_ctx - spec->n_prompt;
    r->max_new =
        (int32_t)(spec->max_tokens >= 0 && spec->max_tokens < room ? spec->max_tokens : room);
    r->logprobs = spec->logprobs;
    r->tokens = malloc(((size_t)r->n_prompt + (size_t)r->max_new) * sizeof *r->tokens);
    if (!r->tokens) goto nomem_req;
    memcpy(r->tokens, spec->prompt, (size_t)spec->n_prompt * sizeof *r->tokens);
    for (int32_t i = 0; i < spec->n_stop; i++) {
        if (!(r->stop[i] = malloc(spec->stop_len[i] + 1))) goto nomem_req;
        memcpy(r->stop[i], spec->stop[i], spec->stop_len[i] + 1);
        r->stop_len[i] = spec->stop_len[i];
        r->n_stop++;
    }
    r->sampling = spec->sampling;
    r->gone = spec->gone;
    r->gone_arg = spec->gone_arg;
    r->wake_events = spec->whole ? SRV_EVENT_CAP - 2 : 1;
    if (llmopt_detok_create(e->model, &r->detok, err)) {
        req_free(r);
        return SRV_SUBMIT_ERROR;
    }
    for (int32_t i = 0; i < r->n_prompt; i++) llmopt_detok_push(r->detok, r->tokens[i]);
    r->t_submit = clock_now_s();

    pthread_mutex_lock(&e->mu);
    /* Requests that a free slot will take at the next step do not count against the
     * wait queue. */
    int32_t free_slots = e->n_slots - atomic_load(&e->n_running);
    enum srv_submit res = e->stopping                               ? SRV_SUBMIT_STOPPING
                          : e->q_count >= e->queue_cap + free_slots ? SRV_SUBMIT_FULL
                                                                    : SRV_SUBMIT_OK;
    if (res == SRV_SUBMIT_OK) {
        e->queue[(e->q_head + e->q_count++) % e->q_size] = r;
        e->wake_seq++;
        pthread_cond_signal(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
    if (res != SRV_SUBMIT_OK) {
        req_free(r);
        return res;
    }
    *out = r;
    return SRV_SUBMIT_OK;
nomem_req:
    req_free(r);
nomem:
    err->status = LLMOPT_ERR_NOMEM;
    snprintf(err->msg, sizeof err->msg, "out of memory for a new request");
    return SRV_SUBMIT_ERROR;
}

/* ---- the HTTP side ---- */

enum srv_next srv_req_next(struct srv_req *r, struct srv_event *ev, int timeout_ms) {
    pthread_mutex_lock(&r->mu);
    if (r->ev_count == 0 && !r->done && timeout_ms > 0) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += timeout_ms / 1000;
        until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        while (r->ev_count == 0 && !r->done)
            if (pthread_cond_timedwait(&r->cv, &r->mu, &until) == ETIMEDOUT) break;
    }
    enum srv_next res = SRV_NEXT_TIMEOUT;
    bool was_full = false;
    if (r->ev_count > 0) {
        was_full = r->ev_count > SRV_EVENT_CAP - 2;
        *ev = r->ev[r->ev_head];
        r->ev_head = (r->ev_head + 1) % SRV_EVENT_CAP;
        r->ev_count--;
        res = SRV_NEXT_EVENT;
    } else if (r->done) {
        res = SRV_NEXT_END;
    }
    pthread_mutex_unlock(&r->mu);
    if (was_full) sched_wake(r->eng); /* the scheduler skipped r for want of room */
    return res;
}

bool srv_req_park(struct srv_req *r, srv_park_fn park, srv_park_fn wake, void *ctx) {
    pthread_mutex_lock(&r->mu);
    bool parked = r->ev_count == 0 && !r->done;
    if (parked) {
        park(ctx);
        r->reader_wake = wake;
        r->reader_ctx = ctx;
    }
    pthread_mutex_unlock(&r->mu);
    return parked;
}

void srv_req_result(struct srv_req *r, struct srv_req_result *out) {
    pthread_mutex_lock(&r->mu);
    out->finish = r->finish;
    out->n_prompt = r->n_prompt;
    out->n_generated = r->done ? r->n_gen : 0; /* written by the scheduler until done */
    out->n_cached = r->done ? r->n_cached : 0;
    memcpy(out->error, r->error, sizeof out->error);
    pthread_mutex_unlock(&r->mu);
}

void srv_req_release(struct srv_req *r) {
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    bool running = !r->done;
    if (running) r->cancelled = true;
    r->reader_wake = NULL; /* the reader and its client are gone */
    r->gone = NULL;
    pthread_mutex_unlock(&r->mu);
    if (running) sched_wake(r->eng);
    req_unref(r);
}

/* ---- the scheduler side ---- */

static bool req_cancelled(struct srv_req *r) {
    pthread_mutex_lock(&r->mu);
    bool c = r->cancelled;
    pthread_mutex_unlock(&r->mu);
    return c;
}

/* Tells r's reader that there is something to take. The parked reader's wake callback
 * is taken under r->mu (its park ran under it, so the park is complete) but called
 * after: a waiter woken while the waker still holds the lock would only block on it
 * again, one more context switch per token. */
static void req_notify(struct srv_req *r, bool done) {
    pthread_mutex_lock(&r->mu);
    if (done) r->done = true;
    srv_park_fn wake = r->reader_wake;
    void *ctx = r->reader_ctx;
    r->reader_wake = NULL;
    pthread_mutex_unlock(&r->mu);
    pthread_cond_broadcast(&r->cv);
    if (wake) wake(ctx);
}

/* Cancels r when its client went away. */
static void req_watch(struct srv_req *r) {
    pthread_mutex_lock(&r->mu);
    if (!r->cancelled && r->gone && r->gone(r->gone_arg)) r->cancelled = true;
    pthread_mutex_unlock(&r->mu);
}

/* Room for a token's event plus a final one. */
static bool req_has_room(struct srv_req *r) {
    pthread_mutex_lock(&r->mu);
    bool room = r->ev_count <= SRV_EVENT_CAP - 2;
    pthread_mutex_unlock(&r->mu);
    return room;
}

static void req_post(struct srv_req *r, const char *text, size_t len, const struct srv_event *tok) {
    struct srv_event ev = tok ? *tok : (struct srv_event){.token = -1};
    ev.text = NULL;
    ev.text_len = 0;
    if (len) {
        ev.text = malloc(len + 1);
        if (ev.text) {
            memcpy(ev.text, text, len);
            ev.text[len] = 0;
            ev.text_len = len;
        }
    }
    if (!ev.text_len && ev.token < 0) return;
    pthread_mutex_lock(&r->mu);
    if (r->ev_count < SRV_EVENT_CAP) {
        r->ev[(r->ev_head + r->ev_count++) % SRV_EVENT_CAP] = ev;
        r->wake = true;
        r->pending = r->ev_count;
    } else {
        free(ev.text); /* cannot happen: steps check req_has_room */
    }
    pthread_mutex_unlock(&r->mu);
}

/* Copies a message, cut to fit. */
static void copy_text(char *dst, size_t cap, const char *src) {
    size_t n = strnlen(src, cap - 1);
    memcpy(dst, src, n);
    dst[n] = 0;
}

static void req_set_finish(struct srv_req *r, enum srv_finish f, const char *error) {
    pthread_mutex_lock(&r->mu);
    if (r->finish == SRV_FINISH_NONE) {
        r->finish = f;
        if (error) copy_text(r->error, sizeof r->error, error);
    }
    pthread_mutex_unlock(&r->mu);
}

/* Frees r's slot and hands r back: the reader sees SRV_NEXT_END after its events. */
static void sched_retire(struct srv_engine *e, struct srv_req *r) {
    if (r->slot >= 0) {
        llmopt_session_reset(e->session, r->slot);
        e->slot_busy[r->slot] = false;
        r->slot = -1;
        atomic_fetch_sub(&e->n_running, 1);
    }
    pthread_mutex_lock(&r->mu);
    if (r->finish == SRV_FINISH_NONE)
        r->finish = r->cancelled ? SRV_FINISH_CANCEL : SRV_FINISH_ERROR;
    enum srv_finish f = r->finish;
    pthread_mutex_unlock(&r->mu);
    /* counted before the reader is told: a client that reads /metrics right after its
     * reply must find its request in the counters */
    if (f == SRV_FINISH_CANCEL) srv_metrics_cancelled(e->metrics);
    srv_metrics_tokens(e->metrics, r->n_fed > 0 ? r->n_prompt : 0, r->n_cached, r->n_gen);
    req_notify(r, true);
    req_unref(r);
}

/* Earliest occurrence of a stop sequence in t, or -1. */
static ptrdiff_t stop_find(const struct srv_req *r, const char *t, size_t n) {
    ptrdiff_t best = -1;
    for (int32_t i = 0; i < r->n_stop; i++) {
        const char *hit = memmem(t, n, r->stop[i], r->stop_len[i]);
        if (hit && (best < 0 || hit - t < best)) best = hit - t;
    }
    return best;
}

/* Bytes at the end of t that could be the start of a stop sequence. */
static size_t stop_partial(const struct srv_req *r, const char *t, size_t n) {
    size_t best = 0;
    for (int32_t i = 0; i < r->n_stop; i++) {
        size_t k = r->stop_len[i] - 1 < n ? r->stop_len[i] - 1 : n;
        for (; k > best; k--)
            if (t[n - k] == r->stop[i][0] && !memcmp(t + n - k, r->stop[i], k)) {
                best = k;
                break;
            }
    }
    return best;
}

/* Log-softmax of the raw logits: the chosen token's value and the top alternatives
 * (ties: the lower id first, as greedy picks). */
static void logprobs_fill(const float *row, int32_t n_vocab, int32_t id, int32_t n_top,
                          struct srv_event *ev) {
    float max = -INFINITY;
    for (int32_t i = 0; i < n_vocab; i++)
        if (row[i] > max) max = row[i];
    double sum = 0.0;
    for (int32_t i = 0; i < n_vocab; i++) sum += exp((double)row[i] - (double)max);
    double lse = (double)max + log(sum);
    ev->token = id;
    ev->logprob = (float)((double)row[id] - lse);
    ev->n_top = 0;
    for (int32_t i = 0; i < n_vocab && n_top > 0; i++) {
        float v = row[i];
        if (ev->n_top == n_top && !(v > ev->top_logprob[n_top - 1])) continue;
        int32_t j = ev->n_top < n_top ? ev->n_top++ : n_top - 1;
        while (j > 0 && v > ev->top_logprob[j - 1]) {
            ev->top_logprob[j] = ev->top_logprob[j - 1];
            ev->top_id[j] = ev->top_id[j - 1];
            j--;
        }
        ev->top_logprob[j] = v;
        ev->top_id[j] = i;
    }
    for (int32_t j = 0; j < ev->n_top; j++)
        ev->top_logprob[j] = (float)((double)ev->top_logprob[j] - lse);
    /* JSON has no infinities or NaN; OpenAI reports -9999 for "impossible". */
    if (!isfinite(ev->logprob)) ev->logprob = -9999.0f;
    for (int32_t j = 0; j < ev->n_top; j++)
        if (!isfinite(ev->top_logprob[j])) ev->top_logprob[j] = -9999.0f;
}

/* Appends bytes to r->piece[*n..]; false when out of memory. */
static bool piece_add(struct srv_req *r, size_t *n, const char *add, size_t len) {
    if (*n + len + 1 > r->piece_cap) {
        size_t cap = 2 * r->piece_cap > *n + len + 1 ? 2 * r->piece_cap : *n + len + 1;
        char *p = realloc(r->piece, cap);
        if (!p) return false;
        r->piece = p;
        r->piece_cap = cap;
    }
    memcpy(r->piece + *n, add, len);
    *n += len;
    return true;
}

/* r->piece[0..n) is the held-back text plus the new text: posts what no stop
 * sequence can claim any more, holds back a tail that may begin one, and ends the
 * request at a stop sequence (which is never posted). final: the request ends here.
 * tok: the token this text came with (NULL: none). */
static void req_release_text(struct srv_req *r, size_t n, bool final, const struct srv_event *tok) {
    ptrdiff_t hit = stop_find(r, r->piece, n);
    if (hit >= 0) {
        req_post(r, r->piece, (size_t)hit, tok);
        r->held_len = 0;
        req_set_finish(r, SRV_FINISH_STOP, NULL);
        return;
    }
    size_t keep = final ? 0 : stop_partial(r, r->piece, n);
    req_post(r, r->piece, n - keep, tok);
    memcpy(r->held, r->piece + n - keep, keep); /* keep < the longest stop < sizeof held */
    r->held_len = keep;
}

/* Samples the next token of r from its logits row (or takes id, drawn where the logits
 * were, when row is NULL: r wants no logprobs) and posts the result. */
static void req_sample(struct srv_engine *e, struct srv_req *r, const float *row, int32_t id) {
    if (row) {
        memcpy(e->scratch, row, (size_t)e->n_vocab * sizeof *e->scratch);
        id = llmopt_sampler_sample(r->sampler, e->scratch, r->tokens, (size_t)(r->n_prompt + r->n_gen), NULL);
    }
    double t = clock_now_s();
    if (r->n_gen == 0)
        srv_metrics_ttft(e->metrics, t - r->t_submit);
    else
        srv_metrics_itl(e->metrics, t - r->t_last);
    r->t_last = t;

    size_t n = 0;
    bool ok = piece_add(r, &n, r->held, r->held_len);
    if (llmopt_token_is_eog(e->model, id)) { /* not posted, not counted */
        const char *tail = llmopt_detok_flush(r->detok);
        if (ok && piece_add(r, &n, tail, strlen(tail))) {
            req_release_text(r, n, true, NULL);
            req_set_finish(r, SRV_FINISH_STOP, NULL);
            return;
        }
    } else {
        struct srv_event tok = {.token = id};
        if (r->logprobs >= 0) logprobs_fill(row, e->n_vocab, id, r->logprobs, &tok);
        r->tokens[r->n_prompt + r->n_gen++] = id;
        bool last = r->n_gen >= r->max_new;
        const char *text = llmopt_detok_push(r->detok, id);
        ok = ok && piece_add(r, &n, text, strlen(text));
        if (last && ok) {
            const char *tail = llmopt_detok_flush(r->detok);
            ok = piece_add(r, &n, tail, strlen(tail));
        }
        if (ok) {
            req_release_text(r, n, last, r->logprobs >= 0 ? &tok : NULL);
            if (last) req_set_finish(r, SRV_FINISH_LENGTH, NULL);
            return;
        }
    }
    req_set_finish(r, SRV_FINISH_ERROR, "out of memory while detokenizing");
}

/* ---- the loop ---- */

/* Under e->mu: drops cancelled waiters, then fills free slots in arrival order. */
static void sched_admit_locked(struct srv_engine *e) {
    int32_t kept = 0;
    for (int32_t i = 0; i < e->q_count; i++) {
        struct srv_req *r = e->queue[(e->q_head + i) % e->q_size];
        if (req_cancelled(r))
            sched_retire(e, r);
        else
            e->queue[(e->q_head + kept++) % e->q_size] = r;
    }
    e->q_count = kept;
    while (e->q_count > 0 && e->n_active < e->n_slots) {
        struct srv_req *r = e->queue[e->q_head];
        e->q_head = (e->q_head + 1) % e->q_size;
        e->q_count--;
        int32_t slot = 0;
        while (e->slot_busy[slot]) slot++;
        e->slot_busy[slot] = true;
        r->slot = slot;
        r->n_fed = r->n_cached = llmopt_session_prefix_attach(e->session, slot, r->tokens, r->n_prompt);
        atomic_fetch_add(&e->n_running, 1);
        e->active[e->n_active++] = r;
    }
}

/* Builds and runs one step. Returns false when no request could make progress. */
static bool sched_step(struct srv_engine *e) {
    int32_t n = 0, n_out = 0;
    bool progressed = false;
    /* Cancelled requests leave first; newly admitted ones get their sampler. */
    int32_t kept = 0;
    for (int32_t i = 0; i < e->n_active; i++) {
        struct srv_req *r = e->active[i];
        struct llmopt_err err = {0};
        if (!req_cancelled(r) &&
            (r->sampler || !llmopt_sampler_create(&r->sampling, e->n_vocab, &r->sampler, &err))) {
            e->active[kept++] = r;
            continue;
        }
        if (!r->sampler && !req_cancelled(r)) req_set_finish(r, SRV_FINISH_ERROR, err.msg);
        sched_retire(e, r);
        progressed = true;
    }
    e->n_active = kept;
    /* Decode tokens: the last sampled token of each generating request. */
    for (int32_t i = 0; i < e->n_active; i++) {
        struct srv_req *r = e->active[i];
        r->n_step = 0;
        if (r->n_fed < r->n_prompt || !req_has_room(r)) continue;
        e->tokens[n] = r->tokens[r->n_fed];
        e->positions[n] = r->n_fed;
        e->slots[n] = r->slot;
        e->out_rows[n_out] = n;
        e->out_req[n_out++] = r;
        r->n_step = 1;
        n++;
    }
    /* Prompt chunks, oldest request first. */
    int32_t budget = e->prefill_chunk;
    for (int32_t i = 0; i < e->n_active && budget > 0 && n < e->n_batch; i++) {
        struct srv_req *r = e->active[i];
        if (r->n_fed >= r->n_prompt) continue;
        int32_t chunk = r->n_prompt - r->n_fed;
        if (chunk > budget) chunk = budget;
        if (chunk > e->n_batch - n) chunk = e->n_batch - n;
        for (int32_t t = 0; t < chunk; t++) {
            e->tokens[n + t] = r->tokens[r->n_fed + t];
            e->positions[n + t] = r->n_fed + t;
            e->slots[n + t] = r->slot;
        }
        n += chunk;
        budget -= chunk;
        r->n_step = chunk;
        if (r->n_fed + chunk == r->n_prompt) {
            e->out_rows[n_out] = n - 1;
            e->out_req[n_out++] = r;
        }
    }
    sched_lap(e, SRV_PHASE_BATCH);
    if (n == 0) return progressed;

    /* The session returns at least one row; a step of prompt chunks only ignores it. */
    int32_t n_rows = n_out;
    if (n_rows == 0) e->out_rows[n_rows++] = n - 1;
    /* Rows that want no logprobs need no logits here: the session samples them where
     * the logits are (on a GPU, only the best candidates come back). */
    bool need_logits = n_out == 0;
    for (int32_t j = 0; j < n_out; j++) {
        struct srv_req *r = e->out_req[j];
        need_logits = need_logits || r->logprobs >= 0;
        e->row_sampler[j] = r->sampler;
        e->row_history[j] = r->tokens;
        e->row_n_history[j] = (size_t)(r->n_prompt + r->n_gen);
    }
    const float *logits = NULL;
    struct llmopt_err err = {0};
    const double forward_t0 = clock_now_s();
    enum llmopt_status st =
        need_logits ? llmopt_session_forward(e->session, n, e->tokens, e->positions, e->slots, n_rows, e->out_rows,
                                             &logits, &err)
                    : llmopt_session_forward_sample(e->session, n, e->tokens, e->positions, e->slots, n_rows,
                                                    e->out_rows, e->row_sampler, e->row_history, e->row_n_history,
                                                    e->row_id, &err);
    sched_lap(e, SRV_PHASE_FORWARD);
    e->lap_tokens += n;
    e->lap_rows += n_out;
    if (st) fprintf(stderr, "llmopt serve: forward failed: %s\n", err.msg);
    for (int32_t i = 0; i < e->n_active; i++) {
        struct srv_req *r = e->active[i];
        if (!r->n_step) continue;
        if (st) {
            req_set_finish(r, SRV_FINISH_ERROR, err.msg);
            continue;
        }
        bool prompt_done = r->n_fed < r->n_prompt && r->n_fed + r->n_step == r->n_prompt;
        r->n_fed += r->n_step;
        /* Prompts only, as soon as they are in (requests with the same prompt may arrive
         * meanwhile). Not the answers: released, their blocks go back on the free stack
         * and are handed out first, still in the CPU's caches; cached they would stay,
         * and new sequences would take cold blocks instead (stories260K's server
         * forwards ran ~40% slower so). The next turn of a chat reuses its previous
         * prompt and computes the answer again. */
        if (prompt_done) llmopt_session_prefix_publish(e->session, r->slot, r->tokens, r->n_prompt);
    }
    if (!st)
        for (int32_t j = 0; j < n_out; j++)
            req_sample(e, e->out_req[j], logits ? logits + (size_t)j * (size_t)e->n_vocab : NULL, e->row_id[j]);
    /* Readers are woken only now: a woken HTTP thread can take the core from the
     * scheduler, and waking them one row at a time let that happen up to once a row. The
     * event was queued under r->mu, so a reader either saw it or already waits. While
     * requests share steps, a reader waits for stream_batch events (or its request's
     * end): a reader that is not woken keeps r->wake, and the ring holds
     * SRV_EVENT_CAP - 2 >= stream_batch events before the request must skip steps, so
     * every event is signalled at the latest with the stream_batch - 1 events after it
     * or the request's end. r->finish is written by this thread only. Holding back pays
     * only where a step is short against a wake-up (tiny models, big batches): after a
     * forward of SRV_STREAM_BATCH_MAX_STEP_S or more every reader is woken at once, so a
     * real model's tokens are never held a whole step. A reader that wants the whole
     * result only (a non-streamed reply) is woken once SRV_EVENT_CAP - 2 events wait, so
     * that the request never sits out a step for want of room, or at the end. */
    const bool short_step = e->lap_t - forward_t0 < SRV_STREAM_BATCH_MAX_STEP_S;
    int32_t batch = e->n_active > 1 && short_step ? e->stream_batch : 1;
    for (int32_t j = 0; j < n_out; j++) {
        struct srv_req *r = e->out_req[j];
        int32_t want = r->wake_events > batch ? r->wake_events : batch;
        if (!r->wake || (r->pending < want && r->finish == SRV_FINISH_NONE)) continue;
        r->wake = false;
        req_notify(r, false);
    }
    sched_lap(e, SRV_PHASE_SAMPLE);
    /* Retire what finished. */
    kept = 0;
    for (int32_t i = 0; i < e->n_active; i++) {
        struct srv_req *r = e->active[i];
        pthread_mutex_lock(&r->mu);
        bool finished = r->finish != SRV_FINISH_NONE;
        pthread_mutex_unlock(&r->mu);
        if (finished)
            sched_retire(e, r);
        else
            e->active[kept++] = r;
    }
    e->n_active = kept;
    return true;
}

static void sched_publish(struct srv_engine *e, int32_t queued) {
    srv_metrics_gauges(e->metrics, e->index, queued, e->n_active,
                       llmopt_session_kv_blocks_in_use(e->session),
                       llmopt_session_kv_blocks_cached(e->session));
    sched_lap(e, SRV_PHASE_RETIRE);
    srv_metrics_step(e->metrics, e->lap_tokens, e->lap_rows, e->lap);
    memset(e->lap, 0, sizeof e->lap);
    e->lap_tokens = e->lap_rows = 0;
}

static void *sched_main(void *arg) {
    struct srv_engine *e = arg;
    e->lap_t = clock_now_s();
    pthread_mutex_lock(&e->mu);
    while (!e->stopping) {
        sched_lap(e, SRV_PHASE_IDLE);
        if (e->lap_t - e->t_watch >= SRV_WATCH_MS * 1e-3) { /* clients that went away */
            e->t_watch = e->lap_t;
            for (int32_t i = 0; i < e->q_count; i++) req_watch(e->queue[(e->q_head + i) % e->q_size]);
            for (int32_t i = 0; i < e->n_active; i++) req_watch(e->active[i]);
        }
        sched_admit_locked(e);
        uint64_t seq = e->wake_seq;
        int32_t queued = e->q_count;
        pthread_mutex_unlock(&e->mu);
        bool worked = e->n_active > 0 && sched_step(e);
        sched_publish(e, queued);
        pthread_mutex_lock(&e->mu);
        if (worked || e->stopping || e->wake_seq != seq) continue;
        /* Idle, or every running request waits for its reader: sleep until a submit,
         * a cancel or a reader making room bumps wake_seq. */
        if (e->n_active == 0) {
            pthread_cond_wait(&e->cv, &e->mu);
        } else {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += 50 * 1000000L;
            if (until.tv_nsec >= 1000000000L) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&e->cv, &e->mu, &until);
        }
    }
    /* Shutting down: everyone still here ends with an error. */
    while (e->q_count > 0) {
        struct srv_req *r = e->queue[e->q_head];
        e->q_head = (e->q_head + 1) % e->q_size;
        e->q_count--;
        req_set_finish(r, SRV_FINISH_ERROR, "the server is shutting down");
        sched_retire(e, r);
    }
    pthread_mutex_unlock(&e->mu);
    for (int32_t i = 0; i < e->n_active; i++) {
        req_set_finish(e->active[i], SRV_FINISH_ERROR, "the server is shutting down");
        sched_retire(e, e->active[i]);
    }
    e->n_active = 0;
    sched_publish(e, 0);
    return NULL;
}

static void engine_free(struct srv_engine *e);

/* Engine `index` with its own session of o->n_slots slots and o->n_threads threads. */
static enum llmopt_status engine_create(const struct llmopt_model *m, const struct srv_sched_opts *o,
                                        int32_t index, struct srv_metrics *metrics,
                                        struct srv_engine **out, struct llmopt_err *err) {
    *out = NULL;
    if (o->n_slots < 1 || o->prefill_chunk < 1 || o->queue_cap < 1 || o->n_ctx < 0 ||
        o->stream_batch < 1 || o->stream_batch > SRV_EVENT_CAP - 2) {
        err->status = LLMOPT_ERR_INVALID_ARG;
        snprintf(err->msg, sizeof err->msg,
                 "scheduler: bad options (slots %d, chunk %d, queue %d, stream batch %d)",
                 o->n_slots, o->prefill_chunk, o->queue_cap, o->stream_batch);
        return err->status;
    }
    struct srv_engine *e = calloc(1, sizeof *e);
    if (!e) goto nomem;
    e->index = index;
    e->model = m;
    e->metrics = metrics;
    e->n_slots = o->n_slots;
    e->prefill_chunk = o->prefill_chunk;
    e->queue_cap = o->queue_cap;
    e->stream_batch = o->stream_batch;
    e->n_vocab = llmopt_model_n_vocab(m);
    e->n_batch = o->n_slots + o->prefill_chunk;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    struct llmopt_session_opts so = {
        .n_ctx = o->n_ctx, .n_batch = e->n_batch, .n_slots = o->n_slots, .n_threads = o->n_threads,
        .kv_type = o->kv_type, .prefix_cache = o->prefix_cache, .backend = o->backend};
    enum llmopt_status st = llmopt_session_create(m, &so, &e->session, err);
    if (st) {
        engine_free(e);
        return st;
    }
    e->n_ctx = llmopt_session_n_ctx(e->session);
    if (e->n_batch > e->n_ctx * e->n_slots) e->n_batch = e->n_ctx * e->n_slots;
    e->q_size = e->queue_cap + e->n_slots;
    e->queue = calloc((size_t)e->q_size, sizeof *e->queue);
    e->active = calloc((size_t)e->n_slots, sizeof *e->active);
    e->slot_busy = calloc((size_t)e->n_slots, sizeof *e->slot_busy);
    e->tokens = calloc((size_t)e->n_batch, sizeof *e->tokens);
    e->positions = calloc((size_t)e->n_batch, sizeof *e->positions);
    e->slots = calloc((size_t)e->n_batch, sizeof *e->slots);
    e->out_rows = calloc((size_t)e->n_batch, sizeof *e->out_rows);
    e->out_req = calloc((size_t)e->n_batch, sizeof *e->out_req);
    e->scratch = calloc((size_t)e->n_vocab, sizeof *e->scratch);
    e->row_sampler = calloc((size_t)e->n_batch, sizeof *e->row_sampler);
    e->row_history = calloc((size_t)e->n_batch, sizeof *e->row_history);
    e->row_n_history = calloc((size_t)e->n_batch, sizeof *e->row_n_history);
    e->row_id = calloc((size_t)e->n_batch, sizeof *e->row_id);
    if (!e->queue || !e->active || !e->slot_busy || !e->tokens || !e->positions || !e->slots ||
        !e->out_rows || !e->out_req || !e->scratch || !e->row_sampler || !e->row_history || !e->row_n_history ||
        !e->row_id) {
        engine_free(e);
        goto nomem;
    }
    if (pthread_create(&e->thread, NULL, sched_main, e)) {
        engine_free(e);
        err->status = LLMOPT_ERR_NOMEM;
        snprintf(err->msg, sizeof err->msg, "scheduler: cannot start its thread");
        return err->status;
    }
    e->thread_started = true;
    pthread_setname_np(e->thread, "llmopt-sched"); /* for top, perf and bench/server_load.mjs */
    *out = e;
    return LLMOPT_OK;
nomem:
    err->status = LLMOPT_ERR_NOMEM;
    snprintf(err->msg, sizeof err->msg, "scheduler: out of memory");
    return err->status;
}

static void engine_stop(struct srv_engine *e) {
    if (!e || !e->thread_started) return;
    pthread_mutex_lock(&e->mu);
    e->stopping = true;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    e->thread_started = false;
}

static void engine_free(struct srv_engine *e) {
    if (!e) return;
    engine_stop(e);
    llmopt_session_free(e->session);
    free(e->queue);
    free(e->active);
    free(e->slot_busy);
    free(e->tokens);
    free(e->positions);
    free(e->slots);
    free(e->out_rows);
    free(e->out_req);
    free(e->scratch);
    free(e->row_sampler);
    free(e->row_history);
    free(e->row_n_history);
    free(e->row_id);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}


/* ---- the set of engines ---- */

struct srv_sched {
    struct srv_engine *eng[SRV_MAX_ENGINES];
    int32_t n_eng;
};

/* Requests an engine holds: running plus waiting. */
static int32_t engine_load(struct srv_engine *e) {
    pthread_mutex_lock(&e->mu);
    int32_t load = atomic_load(&e->n_running) + e->q_count;
    pthread_mutex_unlock(&e->mu);
    return load;
}

/* The least loaded engine, the first among equals: requests one at a time always meet
 * the same engine (its caches warm, its prefix cache holding what came before), and the
 * others only take work when it already has some. */
static struct srv_engine *engine_pick(struct srv_sched *s) {
    int32_t best = 0, best_load = engine_load(s->eng[0]);
    for (int32_t i = 1; i < s->n_eng && best_load > 0; i++) {
        int32_t load = engine_load(s->eng[i]);
        if (load < best_load) best = i, best_load = load;
    }
    return s->eng[best];
}

enum srv_submit srv_sched_submit(struct srv_sched *s, const struct srv_req_spec *spec,
                                 struct srv_req **out, struct llmopt_err *err) {
    return engine_submit(engine_pick(s), spec, out, err);
}

/* Engines for o->n_engines = 0: a forward that uses fewer threads than this process has
 * CPUs (a small model; session.c's rule) leaves CPUs that only another engine can use,
 * as long as each engine keeps at least 8 slots to batch. */
static bool backend_on_cpu(const char *backend) {
    return !backend || !*backend || !strcmp(backend, "cpu") || !strcmp(backend, "cpu-ref");
}

static int32_t engines_auto(const struct llmopt_model *m, const struct srv_sched_opts *o) {
    if (!backend_on_cpu(o->backend)) return 1;
    int32_t threads = o->n_threads ? o->n_threads : llmopt_model_cpu_threads(m);
    int32_t n = cpu_features_get()->usable_cpus / threads;
    if (n > o->n_slots / 8) n = o->n_slots / 8;
    if (n > SRV_MAX_ENGINES) n = SRV_MAX_ENGINES;
    return n < 1 ? 1 : n;
}

enum llmopt_status srv_sched_create(const struct llmopt_model *m, const struct srv_sched_opts *o,
                                    struct srv_metrics *metrics, struct srv_sched **out,
                                    struct llmopt_err *err) {
    *out = NULL;
    if (o->n_engines < 0 || o->n_engines > SRV_MAX_ENGINES || o->n_engines > o->n_slots) {
        err->status = LLMOPT_ERR_INVALID_ARG;
        snprintf(err->msg, sizeof err->msg, "scheduler: %d engines for %d slots (1..%d, at most one a slot)",
                 o->n_engines, o->n_slots, SRV_MAX_ENGINES);
        return err->status;
    }
    if (o->n_engines > 1 && !backend_on_cpu(o->backend)) {
        err->status = LLMOPT_ERR_INVALID_ARG;
        snprintf(err->msg, sizeof err->msg,
                 "scheduler: %d engines on backend '%s': a device backend runs one engine (each would upload "
                 "its own copy of the weights)",
                 o->n_engines, o->backend);
        return err->status;
    }
    struct srv_sched *s = calloc(1, sizeof *s);
    if (!s) {
        err->status = LLMOPT_ERR_NOMEM;
        snprintf(err->msg, sizeof err->msg, "scheduler: out of memory");
        return err->status;
    }
    int32_t n = o->n_engines ? o->n_engines : engines_auto(m, o);
    enum llmopt_status st = LLMOPT_OK;
    for (int32_t i = 0; i < n; i++) { /* slots and queue places split as evenly as they go */
        struct srv_sched_opts eo = *o;
        eo.n_slots = o->n_slots / n + (i < o->n_slots % n);
        eo.queue_cap = o->queue_cap / n + (i < o->queue_cap % n);
        if (eo.queue_cap < 1) eo.queue_cap = 1;
        if ((st = engine_create(m, &eo, i, metrics, &s->eng[i], err))) goto fail;
        s->n_eng++;
    }
    *out = s;
    return LLMOPT_OK;
fail:
    srv_sched_free(s);
    return st;
}

void srv_sched_stop(struct srv_sched *s) {
    if (!s) return;
    for (int32_t i = 0; i < s->n_eng; i++) engine_stop(s->eng[i]);
}

void srv_sched_free(struct srv_sched *s) {
    if (!s) return;
    for (int32_t i = 0; i < s->n_eng; i++) engine_free(s->eng[i]);
    free(s);
}

int32_t srv_sched_n_engines(const struct srv_sched *s) {
    return s->n_eng;
}

const struct llmopt_session *srv_sched_session(const struct srv_sched *s, int32_t engine) {
    return s->eng[engine]->session;
}

int32_t srv_sched_n_running(const struct srv_sched *s) {
    int32_t n = 0;
    for (int32_t i = 0; i < s->n_eng; i++) n += atomic_load(&s->eng[i]->n_running);
    return n;
}

int32_t srv_sched_n_ctx(const struct srv_sched *s) {
    return s->eng[0]->n_ctx;
}
