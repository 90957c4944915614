/* The HTTP layer on libmicrohttpd: one event-loop thread serves every connection
 * (a connection waiting for tokens is suspended and the scheduler resumes it), request
 * bodies read into a capped buffer, POST bodies handled by two worker threads (JSON,
 * template, tokenizer: never on the event loop), replies and SSE streams from
 * srv_api.c. Nothing here knows about models. */
#ifndef LLMOPT_SERVER_HTTP_H
#define LLMOPT_SERVER_HTTP_H

#include "llmopt.h"
#include "server/srv_api.h"

#include <stdint.h>

struct http_opts {
    const char *host;         /* numeric IPv4 or IPv6 address, or a name to resolve */
    int port;                 /* 0: any free port (see http_server_port) */
    unsigned max_connections; /* connections at once; MHD refuses more */
    unsigned idle_timeout_s;  /* an idle keep-alive connection is closed after this */
};

struct http_server;
enum llmopt_status http_server_start(const struct http_opts *o, struct srv_app *app,
                                     struct http_server **out, struct llmopt_err *err);
int http_server_port(const struct http_server *h);
/* Stops accepting connections; requests in flight go on. */
void http_server_quiesce(struct http_server *h);
/* Closes every connection and joins MHD's thread. Every request must have ended
 * first (srv_sched_stop), so that no connection is left suspended. */
void http_server_stop(struct http_server *h);

#endif
