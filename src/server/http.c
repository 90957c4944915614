/* libmicrohttpd glue (see http.h). */
#define _GNU_SOURCE /* SCHED_BATCH */
#include "server/http.h"

#include "server/srv_buf.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Workers that handle large POST bodies (JSON, chat template, tokenizer, submission)
 * off the event loop: tokenizing a 3 MB prompt takes ~0.2 s, which on the event-loop
 * thread would stall every stream's writes that long. */
#define HTTP_WORKERS 2
/* Bodies up to this many bytes are handled on the event loop (well under a millisecond
 * of parsing and tokenizing): the common small request skips the hop to a worker and
 * never queues behind large prompts there. */
#define HTTP_INLINE_BODY_MAX (16 << 10)

struct http_request;

struct http_server {
    struct MHD_Daemon *daemon;
    struct srv_app *app;
    int port;
    MHD_socket quiesced_fd; /* the listening socket after quiesce, closed at stop */
    pthread_mutex_t mu;     /* guards the job queue, stopping and requests' state */
    pthread_cond_t cv;
    struct http_request *jobs, *jobs_tail;
    bool stopping; /* workers leave once the queue is empty; requests are handled inline */
    int n_workers;
    pthread_t workers[HTTP_WORKERS];
};

enum http_job { HTTP_JOB_NONE, HTTP_JOB_QUEUED, HTTP_JOB_DONE };

/* Per request (MHD's con_cls): the body read so far, then (handed to a worker) the
 * reply it made, then a non-streamed generation waiting for its end. */
struct http_request {
    struct srv_buf body;
    bool too_large;
    bool answered; /* a reply was queued before the body was read */
    struct srv_pending *pending;
    enum http_job job; /* under http_server.mu */
    struct MHD_Connection *conn;
    const char *method, *url; /* MHD's, valid until the request completes */
    struct srv_reply reply;   /* the worker's */
    struct http_request *next_job;
};

/* An SSE reply in flight. */
struct http_stream {
    struct srv_stream *stream;
    struct MHD_Connection *conn;
};

/* The scheduler watches each request's client through this: a peer that closed its
 * end reads as end-of-file (or an error); a live one as "would block" (or pending bytes
 * of a next request). MHD itself does not look at a suspended connection. */
static bool http_fd_gone(intptr_t arg) {
    int fd = (int)arg;
    if (fd < 0) return false;
    char b;
    ssize_t k = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static int http_conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? (int)ci->connect_fd : -1;
}

/* A connection waiting for tokens is suspended (taken out of MHD's event loop) from
 * inside its own callback, and resumed by the scheduler thread once there is
 * something for it (srv_req_park: the suspend runs under the request's lock, under
 * which the scheduler takes the resume callback, so a resume never comes before its
 * suspend). */
static void http_park(void *c) {
    MHD_suspend_connection(c);
}
static void http_wake(void *c) {
    MHD_resume_connection(c);
}

/* While requests share the scheduler, the event-loop thread runs as SCHED_BATCH: woken
 * (resumed connections) it waits for a free core or the next tick instead of
 * preempting the scheduler thread, whose step every request waits on. With one request
 * it is SCHED_OTHER: its reader is what the scheduler waits for once the request's
 * event ring is full, and disfavoured it let the scheduler idle for milliseconds on a
 * loaded machine. A thread may switch its own policy between these two without
 * privilege. LLMOPT_SERVER_HTTP_POLICY=other keeps SCHED_OTHER (to compare). */
static void http_thread_policy(bool batch) {
    static _Thread_local bool is_batch;
    if (batch == is_batch) return;
    const char *e = getenv("LLMOPT_SERVER_HTTP_POLICY");
    if (batch && e && !strcmp(e, "other")) return;
    struct sched_param sp = {0};
    if (!pthread_setschedparam(pthread_self(), batch ? SCHED_BATCH : SCHED_OTHER, &sp))
        is_batch = batch;
}

/* How long the event loop may wait inside a lone stream's callback for its next token
 * (srv_stream_read): far above a tiny model's step, and a delay no client notices. */
#define HTTP_LONE_STREAM_WAIT_MS 2

static ssize_t http_stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    struct http_stream *hs = cls;
    http_thread_policy(srv_stream_shared(hs->stream));
    for (;;) {
        ssize_t n = srv_stream_read(hs->stream, buf, max, HTTP_LONE_STREAM_WAIT_MS);
        if (n > 0) return n;
        if (n == 0) return MHD_CONTENT_READER_END_OF_STREAM;
        if (n != SRV_STREAM_WAIT) return MHD_CONTENT_READER_END_WITH_ERROR;
        /* 0 with the connection suspended: MHD calls again once resumed */
        if (srv_stream_park(hs->stream, http_park, http_wake, hs->conn)) return 0;
    }
}

static void http_stream_free(void *cls) {
    struct http_stream *hs = cls;
    srv_stream_free(hs->stream); /* cancels the request if the client left early */
    free(hs);
}

/* The app's answer to hr's whole body (inline, or on a worker while c sleeps). */
static void http_handle(struct http_server *h, struct http_request *hr, struct MHD_Connection *c,
                        const char *method, const char *url, struct srv_reply *out) {
    srv_app_handle(h->app, method, url, hr->body.data ? hr->body.data : "", hr->body.len,
                   hr->too_large, http_fd_gone, http_conn_fd(c), out);
}

/* Queues r on c; r's body and stream pass to MHD. */
static enum MHD_Result http_send(struct MHD_Connection *c, struct srv_reply *r) {
    if (r->status == 0) {
        srv_reply_clear(r);
        return MHD_NO; /* the client is gone: close */
    }
    struct MHD_Response *resp;
    if (r->stream) {
        struct http_stream *hs = malloc(sizeof *hs);
        if (!hs) {
            srv_reply_clear(r);
            return MHD_NO;
        }
        hs->stream = r->stream;
        hs->conn = c;
        r->stream = NULL;
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, http_stream_read, hs,
                                                 http_stream_free);
        if (!resp) {
            http_stream_free(hs);
            srv_reply_clear(r);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    } else {
        resp = MHD_create_response_from_buffer(r->len, r->body ? r->body : (void *)"",
                                               r->body ? MHD_RESPMEM_MUST_FREE
                                                       : MHD_RESPMEM_PERSISTENT);
        if (!resp) {
            srv_reply_clear(r);
            return MHD_NO;
        }
        r->body = NULL;
    }
    if (r->content_type) MHD_add_response_header(resp, "Content-Type", r->content_type);
    MHD_add_response_header(resp, "Access-Control-Allow-Origin", "*");
    if (r->preflight) {
        MHD_add_response_header(resp, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        MHD_add_response_header(resp, "Access-Control-Allow-Headers",
                                "Authorization, Content-Type");
        MHD_add_response_header(resp, "Access-Control-Max-Age", "86400");
    }
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    srv_reply_clear(r);
    return ok;
}

static enum MHD_Result http_on_request(void *cls, struct MHD_Connection *c, const char *url,
                                       const char *method, const char *version,
                                       const char *upload_data, size_t *upload_data_size,
                                       void **con_cls) {
    (void)version;
    struct http_server *h = cls;
    struct http_request *hr = *con_cls;
    struct srv_reply reply;
    if (!hr) { /* headers only so far: reject early what needs no body */
        hr = calloc(1, sizeof *hr);
        if (!hr) return MHD_NO;
        srv_buf_init(&hr->body, srv_app_max_body(h->app));
        *con_cls = hr;
        const char *auth =
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
        const char *clen =
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (srv_app_precheck(h->app, method, url, auth, clen, &reply)) {
            hr->answered = true;
            return http_send(c, &reply);
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        /* Past the cap the rest is read and dropped: memory stays bounded, and the
         * client still gets its 413 rather than a reset. */
        if (!hr->too_large && !hr->answered &&
            !srv_buf_append(&hr->body, upload_data, *upload_data_size)) {
            hr->too_large = true;
            srv_buf_free(&hr->body);
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (hr->answered) return MHD_YES;
    if (!hr->pending) {
        pthread_mutex_lock(&h->mu);
        enum http_job job = hr->job;
        if (job == HTTP_JOB_NONE && !h->stopping && h->n_workers > 0 && !strcmp(method, "POST") &&
            hr->body.len > HTTP_INLINE_BODY_MAX) {
            /* to a worker; the connection sleeps until the worker resumes it (the
             * suspend happens under mu, which the worker takes before it resumes) */
            hr->job = HTTP_JOB_QUEUED;
            hr->conn = c;
            hr->method = method;
            hr->url = url;
            hr->next_job = NULL;
            if (h->jobs_tail)
                h->jobs_tail->next_job = hr;
            else
                h->jobs = hr;
            h->jobs_tail = hr;
            MHD_suspend_connection(c);
            pthread_cond_signal(&h->cv);
            pthread_mutex_unlock(&h->mu);
            return MHD_YES;
        }
        pthread_mutex_unlock(&h->mu);
        if (job == HTTP_JOB_DONE) {
            reply = hr->reply;
            memset(&hr->reply, 0, sizeof hr->reply);
        } else {
            http_handle(h, hr, c, method, url, &reply);
        }
        hr->job = HTTP_JOB_NONE;
        srv_buf_free(&hr->body);
        if (!reply.pending) return http_send(c, &reply);
        hr->pending = reply.pending;
    }
    /* A non-streamed generation: called again after each resume until it ends. */
    for (;;) {
        if (srv_pending_poll(hr->pending, &reply)) {
            srv_pending_free(hr->pending);
            hr->pending = NULL;
            return http_send(c, &reply);
        }
        if (srv_pending_park(hr->pending, http_park, http_wake, c)) return MHD_YES;
    }
}

static void http_on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                              enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)c;
    (void)toe;
    struct http_request *hr = *con_cls;
    if (!hr) return;
    srv_buf_free(&hr->body);
    srv_reply_clear(&hr->reply);   /* a worker's reply never sent */
    srv_pending_free(hr->pending); /* the connection closed before the reply */
    free(hr);
    *con_cls = NULL;
}

static void *http_worker(void *arg) {
    struct http_server *h = arg;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        while (!h->jobs && !h->stopping) pthread_cond_wait(&h->cv, &h->mu);
        struct http_request *hr = h->jobs;
        if (!hr) break; /* stopping, and nothing left */
        h->jobs = hr->next_job;
        if (!h->jobs) h->jobs_tail = NULL;
        pthread_mutex_unlock(&h->mu);
        http_handle(h, hr, hr->conn, hr->method, hr->url, &hr->reply);
        pthread_mutex_lock(&h->mu);
        hr->job = HTTP_JOB_DONE;
        MHD_resume_connection(hr->conn);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* Lets the workers finish the queue and joins them; later requests run inline. */
static void http_workers_stop(struct http_server *h) {
    pthread_mutex_lock(&h->mu);
    h->stopping = true;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    for (int i = 0; i < h->n_workers; i++) pthread_join(h->workers[i], NULL);
    h->n_workers = 0;
}

enum llmopt_status http_server_start(const struct http_opts *o, struct srv_app *app,
                                     struct http_server **out, struct llmopt_err *err) {
    *out = NULL;
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    int gai = getaddrinfo(o->host, port, &hints, &ai);
    if (gai) {
        err->status = LLMOPT_ERR_INVALID_ARG;
        snprintf(err->msg, sizeof err->msg, "serve: cannot resolve host '%s': %s", o->host,
                 gai_strerror(gai));
        return err->status;
    }
    struct http_server *h = calloc(1, sizeof *h);
    if (!h) {
        freeaddrinfo(ai);
        err->status = LLMOPT_ERR_NOMEM;
        snprintf(err->msg, sizeof err->msg, "serve: out of memory");
        return err->status;
    }
    h->app = app;
    h->quiesced_fd = MHD_INVALID_SOCKET;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    /* (fewer workers if a thread cannot start: their requests then run inline) */
    while (h->n_workers < HTTP_WORKERS &&
           !pthread_create(&h->workers[h->n_workers], NULL, http_worker, h))
        pthread_setname_np(h->workers[h->n_workers++], "llmopt-http");
    /* One event-loop thread (epoll on Linux) for every connection. */
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    h->daemon = MHD_start_daemon(flags, 0, NULL, NULL, http_on_request, h, MHD_OPTION_SOCK_ADDR,
                                 ai->ai_addr, MHD_OPTION_CONNECTION_LIMIT, o->max_connections,
                                 MHD_OPTION_CONNECTION_TIMEOUT, o->idle_timeout_s,
                                 MHD_OPTION_NOTIFY_COMPLETED, http_on_completed, h, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!h->daemon) {
        http_workers_stop(h);
        pthread_mutex_destroy(&h->mu);
        pthread_cond_destroy(&h->cv);
        free(h);
        err->status = LLMOPT_ERR_IO;
        snprintf(err->msg, sizeof err->msg, "serve: cannot listen on %s port %d (in use?)", o->host,
                 o->port);
        return err->status;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : o->port;
    *out = h;
    return LLMOPT_OK;
}

int http_server_port(const struct http_server *h) {
    return h->port;
}

void http_server_quiesce(struct http_server *h) {
    if (h && h->daemon && h->quiesced_fd == MHD_INVALID_SOCKET)
        h->quiesced_fd = MHD_quiesce_daemon(h->daemon);
}

void http_server_stop(struct http_server *h) {
    if (!h) return;
    http_workers_stop(h); /* every queued request handled and its connection resumed */
    if (h->daemon) MHD_stop_daemon(h->daemon);
    if (h->quiesced_fd != MHD_INVALID_SOCKET) close(h->quiesced_fd);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    free(h);
}
