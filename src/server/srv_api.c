/* The OpenAI-compatible endpoints (see srv_api.h): routing, authentication, prompt
 * building (chat template + tokenizer), submission to the scheduler, and the reply,
 * whole or streamed as server-sent events in OpenAI's chunk shapes. */
#include "server/srv_api.h"

#include "server/srv_buf.h"
#include "server/srv_openai.h"
#include "server/srv_request.h"

#include <jansson.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#define SRV_MAX_REPLY (64u << 20) /* bytes of one non-streamed reply */

struct srv_app {
    const struct llmopt_model *model;
    const struct llmopt_chat_template *tmpl;
    struct srv_sched *sched;
    struct srv_metrics *metrics;
    char *model_id;
    char *api_key;
    char *template_note;
    size_t max_body;
    int32_t n_vocab;
    int64_t created;
    atomic_bool stopping;
    atomic_int in_flight; /* generation requests between submit and their reply's end */
};

struct srv_app *srv_app_create(const struct llmopt_model *m,
                               const struct llmopt_chat_template *tmpl, struct srv_sched *sched,
                               struct srv_metrics *metrics, const struct srv_app_opts *o) {
    struct srv_app *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->model = m;
    a->tmpl = tmpl;
    a->sched = sched;
    a->metrics = metrics;
    a->model_id = strdup(o->model_id);
    a->api_key = o->api_key ? strdup(o->api_key) : NULL;
    a->template_note =
        strdup(o->template_note ? o->template_note : "the model has no chat template");
    a->max_body = o->max_body;
    a->n_vocab = llmopt_model_n_vocab(m);
    a->created = (int64_t)time(NULL);
    atomic_init(&a->stopping, false);
    atomic_init(&a->in_flight, 0);
    if (!a->model_id || (o->api_key && !a->api_key) || !a->template_note) {
        srv_app_free(a);
        return NULL;
    }
    return a;
}

void srv_app_free(struct srv_app *a) {
    if (!a) return;
    free(a->model_id);
    free(a->api_key);
    free(a->template_note);
    free(a);
}

void srv_app_set_stopping(struct srv_app *a) {
    atomic_store(&a->stopping, true);
}
size_t srv_app_max_body(const struct srv_app *a) {
    return a->max_body;
}

bool srv_app_wait_idle(struct srv_app *a, int timeout_ms) {
    for (int waited = 0; atomic_load(&a->in_flight) > 0; waited += 10) {
        if (waited >= timeout_ms) return false;
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return true;
}

void srv_reply_clear(struct srv_reply *r) {
    free(r->body);
    if (r->stream) srv_stream_free(r->stream);
    if (r->pending) srv_pending_free(r->pending);
    memset(r, 0, sizeof *r);
}

/* The HTTP side lets go of a submitted request (cancelling it if it still runs). */
static void app_release(struct srv_app *a, struct srv_req *req) {
    srv_req_release(req);
    atomic_fetch_sub(&a->in_flight, 1);
}

/* ---- replies ---- */

static void reply_json(struct srv_reply *out, int status, json_t *body) {
    out->status = status;
    out->content_type = "application/json";
    out->body = body ? json_dumps(body, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(body);
    if (!out->body) {
        out->status = 500;
        out->body = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                           "\"param\":null,\"code\":null}}");
    }
    out->len = out->body ? strlen(out->body) : 0;
}

static void reply_error(struct srv_reply *out, const struct srv_error *e) {
    out->status = e->status;
    out->content_type = "application/json";
    out->body = srv_error_body(e, &out->len);
}

static void reply_errorf(struct srv_reply *out, int status, const char *type, const char *code,
                         const char *param, const char *msg) {
    struct srv_error e;
    srv_error_set(&e, status, type, code, param, "%s", msg);
    reply_error(out, &e);
}

/* ---- routing ---- */

/* Endpoint of a path; "/v1" may be left out, as several clients do. */
static enum srv_endpoint endpoint_of(const char *path, const char **model_arg) {
    *model_arg = NULL;
    if (!strncmp(path, "/v1/", 4)) path += 3;
    if (!strcmp(path, "/chat/completions")) return SRV_EP_CHAT;
    if (!strcmp(path, "/completions")) return SRV_EP_COMPLETIONS;
    if (!strcmp(path, "/models")) return SRV_EP_MODELS;
    if (!strncmp(path, "/models/", 8) && path[8]) {
        *model_arg = path + 8;
        return SRV_EP_MODELS;
    }
    if (!strcmp(path, "/health")) return SRV_EP_HEALTH;
    if (!strcmp(path, "/metrics")) return SRV_EP_METRICS;
    return SRV_EP_OTHER;
}

static const char *method_of(enum srv_endpoint ep) {
    return ep == SRV_EP_CHAT || ep == SRV_EP_COMPLETIONS ? "POST" : "GET";
}

/* Compares without an early exit, so the time taken says nothing about the key. */
static bool key_equal(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    unsigned char diff = (unsigned char)(la != lb);
    for (size_t i = 0; i < la; i++) diff |= (unsigned char)(a[i] ^ b[lb ? i % lb : 0]);
    return diff == 0;
}

bool srv_app_precheck(struct srv_app *a, const char *method, const char *path,
                      const char *authorization, const char *content_length,
                      struct srv_reply *out) {
    memset(out, 0, sizeof *out);
    const char *model_arg;
    enum srv_endpoint ep = endpoint_of(path, &model_arg);
    char msg[300];
    if (!strcmp(method, "OPTIONS")) {
        out->status = 204;
        out->preflight = true;
    } else if (ep == SRV_EP_OTHER) {
        snprintf(msg, sizeof msg, "Unknown request URL: %.16s %.200s.", method, path);
        reply_errorf(out, 404, "invalid_request_error", "unknown_url", NULL, msg);
    } else if (strcmp(method, method_of(ep)) &&
               !(ep != SRV_EP_CHAT && ep != SRV_EP_COMPLETIONS && !strcmp(method, "HEAD"))) {
        snprintf(msg, sizeof msg, "Method %.16s is not allowed on %.200s; use %s.", method, path,
                 method_of(ep));
        reply_errorf(out, 405, "invalid_request_error", "method_not_allowed", NULL, msg);
    } else if (a->api_key && ep != SRV_EP_HEALTH && ep != SRV_EP_METRICS &&
               !(authorization && !strncmp(authorization, "Bearer ", 7) &&
                 key_equal(authorization + 7, a->api_key))) {
        reply_errorf(out, 401, "invalid_request_error", "invalid_api_key", NULL,
                     authorization ? "Incorrect API key provided."
                                   : "You didn't provide an API key. Provide it in the "
                                     "Authorization header as 'Bearer YOUR_KEY'.");
    } else if (content_length && strtoull(content_length, NULL, 10) > a->max_body) {
        snprintf(msg, sizeof msg, "The request body of %.20s bytes exceeds the limit of %zu bytes.",
                 content_length, a->max_body);
        reply_errorf(out, 413, "invalid_request_error", "request_too_large", NULL, msg);
    } else {
        return false;
    }
    srv_metrics_request(a->metrics, ep, out->status);
    return true;
}

/* ---- prompts ---- */

/* Tokenizes text, growing the id buffer when the first guess is short. */
static int32_t *tokenize(const struct llmopt_model *m, const char *text, size_t len, bool add_bos,
                         size_t *n, struct llmopt_err *err) {
    size_t cap = len + 3;
    for (int attempt = 0; attempt < 2; attempt++) {
        int32_t *ids = malloc(cap * sizeof *ids);
        if (!ids) break;
        enum llmopt_status st = llmopt_tokenize(m, text, len, add_bos, ids, cap, n, err);
        if (st == LLMOPT_OK) return ids;
        free(ids);
        if (st != LLMOPT_ERR_LIMIT) return NULL;
        cap = *n;
    }
    err->status = LLMOPT_ERR_NOMEM;
    snprintf(err->msg, sizeof err->msg, "out of memory tokenizing the prompt");
    return NULL;
}

/* The prompt of a chat request: messages through the chat template, then tokens. A
 * template that writes the BOS text itself gets no second BOS. */
static int32_t *chat_prompt(struct srv_app *a, const struct srv_params *p, size_t *n,
                            struct srv_error *e) {
    if (!a->tmpl) {
        srv_error_set(e, 400, "invalid_request_error", "chat_template_missing", "messages",
                      "Chat completions need a chat template, and %s; use /v1/completions, or "
                      "start the server with --chat-template FILE.",
                      a->template_note);
        return NULL;
    }
    struct llmopt_err err = {0};
    char *text = NULL;
    size_t len = 0;
    if (llmopt_chat_template_render(a->tmpl, p->messages_json, p->messages_len, true, p->extra_json,
                                    &text, &len, &err)) {
        srv_error_set(e, err.status == LLMOPT_ERR_NOMEM ? 500 : 400,
                      err.status == LLMOPT_ERR_NOMEM ? "server_error" : "invalid_request_error",
                      "template_error", "messages", "The chat template failed: %s", err.msg);
        return NULL;
    }
    bool add_bos = llmopt_add_bos_default(a->model);
    size_t bos_len = 0;
    const char *bos =
        add_bos ? llmopt_token_text(a->model, llmopt_token_bos(a->model), &bos_len) : NULL;
    if (bos && bos_len && len >= bos_len && !memcmp(text, bos, bos_len)) add_bos = false;
    int32_t *ids = tokenize(a->model, text, len, add_bos, n, &err);
    free(text);
    if (!ids)
        srv_error_set(e, 500, "server_error", NULL, NULL, "Tokenizing the prompt failed: %s",
                      err.msg);
    return ids;
}

static int32_t *completion_prompt(struct srv_app *a, const struct srv_params *p, size_t *n,
                                  struct srv_error *e) {
    if (!p->prompt) {
        for (size_t i = 0; i < p->n_prompt_ids; i++)
            if (p->prompt_ids[i] >= a->n_vocab) {
                srv_error_set(e, 400, "invalid_request_error", "invalid_value", "prompt",
                              "Invalid 'prompt': token id %d is outside the vocabulary of %d.",
                              p->prompt_ids[i], a->n_vocab);
                return NULL;
            }
        int32_t *ids = malloc((p->n_prompt_ids ? p->n_prompt_ids : 1) * sizeof *ids);
        if (!ids) {
            srv_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
            return NULL;
        }
        if (p->n_prompt_ids) memcpy(ids, p->prompt_ids, p->n_prompt_ids * sizeof *ids);
        *n = p->n_prompt_ids;
        return ids;
    }
    struct llmopt_err err = {0};
    int32_t *ids =
        tokenize(a->model, p->prompt, p->prompt_len, llmopt_add_bos_default(a->model), n, &err);
    if (!ids)
        srv_error_set(e, 500, "server_error", NULL, NULL, "Tokenizing the prompt failed: %s",
                      err.msg);
    return ids;
}

/* echo: the prompt the reply's text starts with: the string as sent, or the
 * detokenized ids. */
static bool echo_text(struct srv_app *a, const struct srv_params *p, struct srv_buf *b) {
    if (p->prompt) return srv_buf_append(b, p->prompt, p->prompt_len);
    struct llmopt_detok *d = NULL;
    struct llmopt_err err = {0};
    if (llmopt_detok_create(a->model, &d, &err)) return false;
    bool ok = true;
    for (size_t i = 0; i < p->n_prompt_ids && ok; i++)
        ok = srv_buf_puts(b, llmopt_detok_push(d, p->prompt_ids[i]));
    ok = ok && srv_buf_puts(b, llmopt_detok_flush(d));
    llmopt_detok_free(d);
    return ok;
}

/* ---- streaming ---- */

enum stream_phase { STREAM_START, STREAM_RUN, STREAM_END };

struct srv_stream {
    struct srv_app *app;
    struct srv_req *req;
    enum srv_kind kind;
    char id[48];
    int64_t created;
    bool include_usage;
    int32_t logprobs;
    enum stream_phase phase;
    struct srv_buf out; /* formatted bytes not yet handed to the connection */
    size_t off;
    size_t text_offset; /* bytes of completion text so far (completions logprobs) */
    /* A text chunk without logprobs, as compact JSON made once by jansson, split where
     * the text goes: every token's event is head + escaped text + tail, with no JSON
     * tree built per token. */
    char *tmpl;
    size_t tmpl_head, tmpl_len;
    struct srv_buf echo; /* completions with echo: the prompt, sent as the first chunk */
};

/* A chunk's envelope: {"id", "object", "created", "model", "choices": [choice]} with
 * "usage": null while usage is promised for the end. */
static json_t *chunk_new(struct srv_stream *st, json_t *choice) {
    json_t *c =
        json_pack("{s:s,s:s,s:I,s:s,s:[]}", "id", st->id, "object",
                  st->kind == SRV_KIND_CHAT ? "chat.completion.chunk" : "text_completion",
                  "created", (json_int_t)st->created, "model", st->app->model_id, "choices");
    if (!c) {
        json_decref(choice);
        return NULL;
    }
    if (choice) json_array_append_new(json_object_get(c, "choices"), choice);
    if (st->include_usage) json_object_set_new(c, "usage", json_null());
    return c;
}

static void stream_put(struct srv_stream *st, json_t *chunk) {
    char *s = chunk ? json_dumps(chunk, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(chunk);
    if (!s) {
        st->out.failed = true;
        return;
    }
    srv_buf_puts(&st->out, "data: ");
    srv_buf_puts(&st->out, s);
    srv_buf_puts(&st->out, "\n\n");
    free(s);
}

static json_t *choice_chat(json_t *delta, json_t *logprobs, const char *finish) {
    return json_pack("{s:i,s:o,s:o,s:o}", "index", 0, "delta", delta, "logprobs",
                     logprobs ? logprobs : json_null(), "finish_reason",
                     finish ? json_string(finish) : json_null());
}

static json_t *choice_completion(const char *text, size_t len, json_t *logprobs,
                                 const char *finish) {
    return json_pack("{s:s%,s:i,s:o,s:o}", "text", text, len, "index", 0, "logprobs",
                     logprobs ? logprobs : json_null(), "finish_reason",
                     finish ? json_string(finish) : json_null());
}

/* Makes st->tmpl; false when out of memory. */
static bool stream_template(struct srv_stream *st) {
    bool chat = st->kind == SRV_KIND_CHAT;
    json_t *choice = chat ? choice_chat(json_pack("{s:s}", "content", ""), NULL, NULL)
                          : choice_completion("", 0, NULL, NULL);
    json_t *chunk = chunk_new(st, choice);
    char *t = chunk ? json_dumps(chunk, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(chunk);
    /* Keys and values before the text are escaped, so the marker's quotes are JSON's. */
    const char *marker = chat ? "\"content\":\"\"" : "\"text\":\"\"";
    const char *at = t ? strstr(t, marker) : NULL;
    if (!at) {
        free(t);
        return false;
    }
    st->tmpl = t;
    st->tmpl_head = (size_t)(at - t) + strlen(marker) - 1; /* through the opening quote */
    st->tmpl_len = strlen(t);
    return true;
}

static void stream_event(struct srv_stream *st, const struct srv_event *ev) {
    const char *text = ev->text ? ev->text : "";
    bool with_lp = st->logprobs >= 0 && ev->token >= 0;
    if (!ev->text_len && !with_lp) return;
    if (!with_lp && srv_utf8_valid(text, ev->text_len)) {
        if (!st->tmpl && !stream_template(st)) {
            st->out.failed = true;
            return;
        }
        srv_buf_append(&st->out, "data: ", 6);
        srv_buf_append(&st->out, st->tmpl, st->tmpl_head);
        srv_buf_json_escaped(&st->out, text, ev->text_len);
        srv_buf_append(&st->out, st->tmpl + st->tmpl_head, st->tmpl_len - st->tmpl_head);
        srv_buf_append(&st->out, "\n\n", 2);
        st->text_offset += ev->text_len;
        return;
    }
    json_t *choice;
    if (st->kind == SRV_KIND_CHAT) {
        json_t *lp = NULL;
        if (with_lp) lp = json_pack("{s:[o]}", "content", srv_chat_logprob(st->app->model, ev));
        choice = choice_chat(json_pack("{s:s%}", "content", text, ev->text_len), lp, NULL);
    } else {
        json_t *lp = NULL;
        if (with_lp) {
            lp = srv_completion_logprobs_new();
            if (lp)
                srv_completion_logprobs_add(st->app->model, lp, ev, st->logprobs, st->text_offset);
        }
        choice = choice_completion(text, ev->text_len, lp, NULL);
    }
    st->text_offset += ev->text_len;
    stream_put(st, chunk_new(st, choice));
}

static void stream_error_event(struct srv_stream *st, const char *msg) {
    struct srv_error e;
    srv_error_set(&e, 500, "server_error", NULL, NULL, "%s", msg);
    char *body = srv_error_body(&e, NULL);
    srv_buf_puts(&st->out, "data: ");
    srv_buf_puts(&st->out, body ? body : "{}");
    srv_buf_puts(&st->out, "\n\n");
    free(body);
}

static void stream_finish(struct srv_stream *st) {
    struct srv_req_result res;
    srv_req_result(st->req, &res);
    const char *finish = srv_finish_name(res.finish);
    if (!finish) {
        stream_error_event(st, res.error[0] ? res.error : "the request was cancelled");
    } else {
        json_t *choice = st->kind == SRV_KIND_CHAT ? choice_chat(json_object(), NULL, finish)
                                                   : choice_completion("", 0, NULL, finish);
        stream_put(st, chunk_new(st, choice));
        if (st->include_usage) {
            json_t *c = chunk_new(st, NULL);
            if (c) json_object_set_new(c, "usage", srv_usage_json(res.n_prompt, res.n_cached, res.n_generated));
            stream_put(st, c);
        }
    }
    srv_buf_puts(&st->out, "data: [DONE]\n\n");
}

ssize_t srv_stream_read(struct srv_stream *st, char *buf, size_t max, int block_ms) {
    while (st->off == st->out.len) {
        srv_buf_reset(&st->out);
        st->off = 0;
        if (st->phase == STREAM_END) return 0;
        if (st->phase == STREAM_START) {
            if (st->kind == SRV_KIND_CHAT)
                stream_put(st, chunk_new(st, choice_chat(json_pack("{s:s,s:s}", "role", "assistant",
                                                                   "content", ""),
                                                         NULL, NULL)));
            if (st->echo.len)
                stream_event(st, &(struct srv_event){.text = st->echo.data,
                                                     .text_len = st->echo.len, .token = -1});
            st->phase = STREAM_RUN;
            continue;
        }
        /* Every event already there, as one write of several chunks. */
        struct srv_event ev;
        int timeout = srv_stream_shared(st) ? 0 : block_ms;
        for (;;) {
            enum srv_next nx = srv_req_next(st->req, &ev, timeout);
            timeout = 0;
            if (nx == SRV_NEXT_EVENT) {
                stream_event(st, &ev);
                srv_event_clear(&ev);
                if (st->out.len >= max) break;
                continue;
            }
            if (nx == SRV_NEXT_END) {
                stream_finish(st);
                st->phase = STREAM_END;
            }
            break;
        }
        if (st->out.failed) return -1;
        if (st->out.len == 0 && st->phase != STREAM_END) return SRV_STREAM_WAIT;
    }
    size_t n = st->out.len - st->off < max ? st->out.len - st->off : max;
    memcpy(buf, st->out.data + st->off, n);
    st->off += n;
    return (ssize_t)n;
}

bool srv_stream_shared(const struct srv_stream *st) {
    return srv_sched_n_running(st->app->sched) > 1;
}

bool srv_stream_park(struct srv_stream *st, srv_park_fn park, srv_park_fn wake, void *ctx) {
    return srv_req_park(st->req, park, wake, ctx);
}

void srv_stream_free(struct srv_stream *st) {
    if (!st) return;
    app_release(st->app, st->req);
    srv_buf_free(&st->out);
    srv_buf_free(&st->echo);
    free(st->tmpl);
    free(st);
}

/* ---- non-streamed replies ---- */

/* A non-streamed generation in flight: the text and logprobs gathered so far. */
struct srv_pending {
    struct srv_app *app;
    struct srv_req *req;
    enum srv_kind kind;
    int32_t logprobs; /* -1: none */
    char id[48];
    int64_t created;
    struct srv_buf text; /* the echoed prompt, then the completion */
    json_t *lp;          /* NULL unless logprobs were asked for */
};

void srv_pending_free(struct srv_pending *pd) {
    if (!pd) return;
    if (pd->req) app_release(pd->app, pd->req);
    srv_buf_free(&pd->text);
    json_decref(pd->lp);
    free(pd);
}

bool srv_pending_park(struct srv_pending *pd, srv_park_fn park, srv_park_fn wake, void *ctx) {
    return srv_req_park(pd->req, park, wake, ctx);
}

/* OpenAI's reply object for a finished request. */
static void pending_reply(struct srv_pending *pd, const struct srv_req_result *res,
                          struct srv_reply *out) {
    struct srv_app *a = pd->app;
    const char *finish = srv_finish_name(res->finish);
    if (res->finish == SRV_FINISH_CANCEL) {
        out->status = 0; /* the client went away: nobody to answer */
        return;
    }
    if (!finish || pd->text.failed) {
        bool shutting = atomic_load(&a->stopping);
        reply_errorf(out, shutting ? 503 : 500, "server_error", NULL, NULL,
                     pd->text.failed ? "the reply is too large"
                     : res->error[0] ? res->error
                                     : "the request failed");
        return;
    }
    json_t *choice, *lp = pd->lp;
    pd->lp = NULL;
    const char *text = pd->text.data ? pd->text.data : "";
    if (pd->kind == SRV_KIND_CHAT) {
        json_t *msg = json_pack("{s:s,s:s%,s:n}", "role", "assistant", "content", text,
                                pd->text.len, "refusal");
        choice = json_pack("{s:i,s:o,s:o,s:s}", "index", 0, "message", msg, "logprobs",
                           lp ? json_pack("{s:o,s:n}", "content", lp, "refusal") : json_null(),
                           "finish_reason", finish);
    } else {
        choice = json_pack("{s:s%,s:i,s:o,s:s}", "text", text, pd->text.len, "index", 0,
                           "logprobs", lp ? lp : json_null(), "finish_reason", finish);
    }
    json_t *body = json_pack("{s:s,s:s,s:I,s:s,s:[o],s:o}", "id", pd->id, "object",
                             pd->kind == SRV_KIND_CHAT ? "chat.completion" : "text_completion",
                             "created", (json_int_t)pd->created, "model", a->model_id,
                             "choices", choice, "usage",
                             srv_usage_json(res->n_prompt, res->n_cached, res->n_generated));
    reply_json(out, 200, body);
}

bool srv_pending_poll(struct srv_pending *pd, struct srv_reply *out) {
    memset(out, 0, sizeof *out);
    struct srv_event ev;
    enum srv_next nx;
    while ((nx = srv_req_next(pd->req, &ev, 0)) == SRV_NEXT_EVENT) {
        if (pd->lp && ev.token >= 0) {
            if (pd->kind == SRV_KIND_CHAT)
                json_array_append_new(pd->lp, srv_chat_logprob(pd->app->model, &ev));
            else
                srv_completion_logprobs_add(pd->app->model, pd->lp, &ev, pd->logprobs,
                                            pd->text.len);
        }
        if (ev.text_len) srv_buf_append(&pd->text, ev.text, ev.text_len);
        srv_event_clear(&ev);
    }
    if (nx != SRV_NEXT_END) return false;
    struct srv_req_result res;
    srv_req_result(pd->req, &res);
    app_release(pd->app, pd->req);
    pd->req = NULL;
    pending_reply(pd, &res, out);
    if (out->status)
        srv_metrics_request(pd->app->metrics,
                            pd->kind == SRV_KIND_CHAT ? SRV_EP_CHAT : SRV_EP_COMPLETIONS,
                            out->status);
    return true;
}

/* ---- generation endpoints ---- */

static uint64_t random_seed(void) {
    uint64_t s;
    if (getrandom(&s, sizeof s, 0) == (ssize_t)sizeof s) return s;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)ts.tv_sec;
}

static void handle_generate(struct srv_app *a, enum srv_kind kind, const char *body, size_t len,
                            srv_gone_fn gone, intptr_t gone_arg, struct srv_reply *out) {
    struct srv_params p;
    struct srv_error e;
    struct srv_buf echo;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    srv_buf_init(&echo, SRV_MAX_REPLY);
    if (!srv_params_parse(kind, body, len, &p, &e)) goto fail;
    if (p.model && strcmp(p.model, a->model_id)) {
        srv_error_set(&e, 404, "invalid_request_error", "model_not_found", "model",
                      "The model '%.200s' does not exist; this server serves '%.200s'.", p.model,
                      a->model_id);
        goto fail;
    }
    ids = kind == SRV_KIND_CHAT ? chat_prompt(a, &p, &n_ids, &e)
                                : completion_prompt(a, &p, &n_ids, &e);
    if (!ids) goto fail;
    int32_t n_ctx = srv_sched_n_ctx(a->sched);
    if (n_ids == 0) {
        srv_error_set(&e, 400, "invalid_request_error", "invalid_value",
                      kind == SRV_KIND_CHAT ? "messages" : "prompt",
                      "The prompt is empty (and the model adds no BOS token).");
        goto fail;
    }
    if (n_ids >= (size_t)n_ctx) {
        srv_error_set(&e, 400, "invalid_request_error", "context_length_exceeded",
                      kind == SRV_KIND_CHAT ? "messages" : "prompt",
                      "This model's maximum context length is %d tokens. However, your prompt "
                      "is %zu tokens, which leaves no room for a completion.",
                      n_ctx, n_ids);
        goto fail;
    }
    if (p.echo && !echo_text(a, &p, &echo)) {
        srv_error_set(&e, 500, "server_error", NULL, NULL, "out of memory for the echoed prompt");
        goto fail;
    }
    if (!p.seed_given) p.sampling.seed = random_seed();
    struct srv_req_spec spec = {
        .prompt = ids,
        .n_prompt = (int32_t)n_ids,
        .max_tokens = p.max_tokens,
        .sampling = p.sampling,
        .logprobs = p.logprobs,
        .n_stop = p.n_stop,
        .stop = p.stop,
        .stop_len = p.stop_len,
        .gone = gone,
        .gone_arg = gone_arg,
        .whole = !p.stream,
    };
    struct srv_req *req = NULL;
    struct llmopt_err err = {0};
    enum srv_submit sub = atomic_load(&a->stopping) ? SRV_SUBMIT_STOPPING
                                                    : srv_sched_submit(a->sched, &spec, &req, &err);
    free(ids);
    ids = NULL;
    switch (sub) {
    case SRV_SUBMIT_OK:
        atomic_fetch_add(&a->in_flight, 1);
        break;
    case SRV_SUBMIT_FULL:
        srv_error_set(&e, 503, "server_error", "server_overloaded", NULL,
                      "The server is overloaded: every slot is busy and the wait queue is full. "
                      "Retry later.");
        goto fail;
    case SRV_SUBMIT_STOPPING:
        srv_error_set(&e, 503, "server_error", "server_shutting_down", NULL,
                      "The server is shutting down.");
        goto fail;
    case SRV_SUBMIT_ERROR:
        srv_error_set(&e, err.status == LLMOPT_ERR_NOMEM ? 500 : 400,
                      err.status == LLMOPT_ERR_NOMEM ? "server_error" : "invalid_request_error",
                      NULL, NULL, "%s", err.msg);
        goto fail;
    }

    char id[48];
    srv_make_id(id, sizeof id, kind == SRV_KIND_CHAT ? "chatcmpl-" : "cmpl-");
    int64_t created = (int64_t)time(NULL);
    if (!p.stream) {
        struct srv_pending *pd = calloc(1, sizeof *pd);
        json_t *lp = NULL;
        if (pd && p.logprobs >= 0)
            lp = kind == SRV_KIND_CHAT ? json_array() : srv_completion_logprobs_new();
        if (!pd || (p.logprobs >= 0 && !lp)) {
            free(pd);
            app_release(a, req);
            srv_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
            goto fail;
        }
        *pd = (struct srv_pending){.app = a, .req = req, .kind = kind, .logprobs = p.logprobs,
                                   .created = created, .text = echo, .lp = lp};
        snprintf(pd->id, sizeof pd->id, "%s", id);
        out->pending = pd; /* pd owns echo now: the reply text begins with it */
        srv_params_free(&p);
        return;
    }
    struct srv_stream *st = calloc(1, sizeof *st);
    if (!st) {
        app_release(a, req);
        srv_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        goto fail;
    }
    st->app = a;
    st->req = req;
    st->kind = kind;
    snprintf(st->id, sizeof st->id, "%s", id);
    st->created = created;
    st->include_usage = p.include_usage;
    st->logprobs = p.logprobs;
    st->echo = echo; /* the stream owns it now */
    srv_buf_init(&st->out, 1u << 20);
    out->status = 200;
    out->content_type = "text/event-stream";
    out->stream = st;
    srv_params_free(&p);
    return;
fail:
    free(ids);
    srv_buf_free(&echo);
    srv_params_free(&p);
    reply_error(out, &e);
}

/* ---- the other endpoints ---- */

static json_t *model_object(struct srv_app *a) {
    return json_pack("{s:s,s:s,s:I,s:s}", "id", a->model_id, "object", "model", "created",
                     (json_int_t)a->created, "owned_by", "llmopt");
}

void srv_app_handle(struct srv_app *a, const char *method, const char *path, const char *body,
                    size_t len, bool too_large, srv_gone_fn gone, intptr_t gone_arg,
                    struct srv_reply *out) {
    memset(out, 0, sizeof *out);
    const char *model_arg;
    enum srv_endpoint ep = endpoint_of(path, &model_arg);
    char msg[300];
    if (too_large) {
        snprintf(msg, sizeof msg, "The request body exceeds the limit of %zu bytes.", a->max_body);
        reply_errorf(out, 413, "invalid_request_error", "request_too_large", NULL, msg);
    } else if (ep == SRV_EP_CHAT) {
        handle_generate(a, SRV_KIND_CHAT, body, len, gone, gone_arg, out);
    } else if (ep == SRV_EP_COMPLETIONS) {
        handle_generate(a, SRV_KIND_COMPLETION, body, len, gone, gone_arg, out);
    } else if (ep == SRV_EP_MODELS && !model_arg) {
        reply_json(out, 200, json_pack("{s:s,s:[o]}", "object", "list", "data", model_object(a)));
    } else if (ep == SRV_EP_MODELS) {
        if (!strcmp(model_arg, a->model_id)) {
            reply_json(out, 200, model_object(a));
        } else {
            snprintf(msg, sizeof msg, "The model '%.200s' does not exist.", model_arg);
            reply_errorf(out, 404, "invalid_request_error", "model_not_found", "model", msg);
        }
    } else if (ep == SRV_EP_HEALTH) {
        bool stopping = atomic_load(&a->stopping);
        reply_json(out, stopping ? 503 : 200,
                   json_pack("{s:s}", "status", stopping ? "shutting down" : "ok"));
    } else if (ep == SRV_EP_METRICS) {
        out->body = srv_metrics_render(a->metrics, &out->len);
        out->status = out->body ? 200 : 500;
        out->content_type = "text/plain; version=0.0.4; charset=utf-8";
    } else {
        snprintf(msg, sizeof msg, "Unknown request URL: %.16s %.200s.", method, path);
        reply_errorf(out, 404, "invalid_request_error", "unknown_url", NULL, msg);
    }
    if (out->status) srv_metrics_request(a->metrics, ep, out->status);
}
