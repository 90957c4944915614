/* Load generator for `llmopt serve` (issue 6): the same greedy streaming completions run
 * by one client (one request after the other) and by N concurrent clients; prints, per
 * round, tokens/s of both, their ratio, the load average, the CPU seconds the server
 * (per thread group) and this program used, also per token, the scheduler's time per phase
 * from /metrics. Checks that every request completes (status 200, [DONE], a usage
 * chunk) and that the N-client outputs equal the one-client ones.
 *
 * One thread, poll() over N keep-alive connections, plain HTTP/1.1: it costs a few
 * microseconds of CPU per token, where the official openai npm client costs 50-200 on
 * the cores the server needs (bench/results/server-2026-11-29.md).
 *
 *   bench_loadgen --port P [--pid PID] [--host 127.0.0.1] [--clients 32] [--requests M]
 *                 [--tokens 64]
 *                 [--rounds 3] [--only-many] [--min-speedup X] [--model-id ID]
 *                 [--api-key KEY] [--timeout S] [--idle-timeout S]
 *
 * --requests M: requests per pass (default: one per client); N clients share them, each
 * connection taking the next when its previous one ends, and one client runs them all.
 * --pid: the server's process id, for its CPU time (from /proc); bench/server.sh starts
 * the server and passes both. Exit status 1 when a request fails, an output differs or
 * the median ratio is under --min-speedup (0: only measure); 2 on bad arguments. */
#define _GNU_SOURCE
#include "base/clock.h"
#include "loadgen_parse.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct lg_opts {
    const char *host, *model_id, *api_key;
    int port, pid, clients, requests, tokens, rounds;
    bool only_many;
    double min_speedup, timeout_s, idle_s;
};

/* One request to send: its whole HTTP/1.1 message. */
struct lg_req {
    char *wire;
    size_t wire_len;
    bool stream; /* an SSE completion (else a plain GET) */
};

struct lg_result {
    struct lg_completion c;
    bool ok;
    char error[320];
};

struct lg_conn {
    int fd;      /* -1: not connected */
    bool reused; /* carried a response before: the server may have closed it meanwhile */
    bool retried;
    int req; /* the request in flight; -1: idle */
    size_t sent;
    double t_start, t_last;
    struct lg_resp resp;
};

static double self_cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           1e-6 * (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

/* ---- connections ---- */

static void conn_close(struct lg_conn *c) {
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    c->reused = false;
}

/* Connects c->fd (blocking connect: the server is local), then makes it non-blocking. */
static bool conn_open(struct lg_conn *c, const struct lg_opts *o, char *err, size_t err_cap) {
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    int gai = getaddrinfo(o->host, port, &hints, &ai);
    if (gai) {
        snprintf(err, err_cap, "cannot resolve %s: %s", o->host, gai_strerror(gai));
        return false;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen)) {
        snprintf(err, err_cap, "cannot connect to %s:%d: %s", o->host, o->port, strerror(errno));
        if (fd >= 0) close(fd);
        freeaddrinfo(ai);
        return false;
    }
    freeaddrinfo(ai);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0) {
        snprintf(err, err_cap, "fcntl O_NONBLOCK: %s", strerror(errno));
        close(fd);
        return false;
    }
    c->fd = fd;
    c->reused = false;
    return true;
}

/* Starts request i on c; false (with res->error) when it cannot connect. */
static bool conn_start(struct lg_conn *c, int i, struct lg_result *res, const struct lg_opts *o) {
    if (c->fd < 0 && !conn_open(c, o, res->error, sizeof res->error)) return false;
    lg_resp_reset(&c->resp);
    c->resp.event_ctx = &res->c;
    c->req = i;
    c->sent = 0;
    c->t_start = c->t_last = clock_now_s();
    return true;
}

/* Whether the response on c is what request `req` needed; fills res. */
static void conn_finish(struct lg_conn *c, const struct lg_req *req, struct lg_result *res) {
    const struct lg_resp *r = &c->resp;
    res->ok = false;
    if (r->state == LG_ERROR) {
        snprintf(res->error, sizeof res->error, "%s", r->error);
    } else if (r->status != 200) {
        snprintf(res->error, sizeof res->error, "HTTP %d: %.200s", r->status,
                 r->body.data ? r->body.data : "");
    } else if (req->stream && !r->sse) {
        snprintf(res->error, sizeof res->error, "a streamed request answered without SSE");
    } else if (req->stream && !res->c.done) {
        snprintf(res->error, sizeof res->error, "the stream ended without data: [DONE]");
    } else if (req->stream && res->c.completion_tokens < 0) {
        snprintf(res->error, sizeof res->error, "the stream had no usage chunk");
    } else {
        res->ok = true;
    }
    if (!res->ok || !r->keep_alive)
        conn_close(c);
    else
        c->reused = true;
    c->req = -1;
}

/* Runs reqs[0..n_req) over conns[0..n_conn), each connection taking the next request
 * when its previous one is done. Returns how many requests failed (res[i].error). */
static int run_requests(struct lg_conn *conns, int n_conn, const struct lg_req *reqs,
                        struct lg_result *res, int n_req, const struct lg_opts *o) {
    static char rbuf[65536];
    struct pollfd pfd[n_conn];
    int next = 0, finished = 0, failed = 0;
    for (int i = 0; i < n_req; i++) {
        lg_completion_free(&res[i].c);
        lg_completion_init(&res[i].c);
        res[i].ok = false;
        res[i].error[0] = 0;
    }
    while (finished < n_req) {
        for (int k = 0; k < n_conn && next < n_req; k++) {
            if (conns[k].req >= 0) continue;
            conns[k].retried = false;
            if (!conn_start(&conns[k], next, &res[next], o)) {
                failed++;
                finished++;
            }
            next++;
        }
        double now = clock_now_s(), wait = 1.0;
        int np = 0;
        for (int k = 0; k < n_conn; k++) {
            struct lg_conn *c = &conns[k];
            pfd[k] = (struct pollfd){.fd = -1};
            if (c->req < 0) continue;
            double left_idle = c->t_last + o->idle_s - now,
                   left_all = c->t_start + o->timeout_s - now;
            if (left_idle < wait) wait = left_idle;
            if (left_all < wait) wait = left_all;
            pfd[k] = (struct pollfd){.fd = c->fd,
                                     .events = c->sent < reqs[c->req].wire_len ? POLLOUT : POLLIN};
            np++;
        }
        if (!np) continue;
        int pr = poll(pfd, (nfds_t)n_conn, wait > 0 ? (int)(wait * 1000) + 1 : 0);
        if (pr < 0 && errno != EINTR) {
            fprintf(stderr, "loadgen: poll: %s\n", strerror(errno));
            return n_req;
        }
        now = clock_now_s();
        for (int k = 0; k < n_conn; k++) {
            struct lg_conn *c = &conns[k];
            if (c->req < 0) continue;
            const struct lg_req *rq = &reqs[c->req];
            struct lg_result *rs = &res[c->req];
            bool end = false, io_error = false;
            if (pfd[k].revents & (POLLOUT | POLLERR | POLLHUP) && c->sent < rq->wire_len) {
                ssize_t w = send(c->fd, rq->wire + c->sent, rq->wire_len - c->sent, MSG_NOSIGNAL);
                if (w > 0) {
                    c->sent += (size_t)w;
                    c->t_last = now;
                } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
                    snprintf(c->resp.error, sizeof c->resp.error, "send: %s", strerror(errno));
                    io_error = end = true;
                }
            } else if (pfd[k].revents & (POLLIN | POLLERR | POLLHUP)) {
                ssize_t got = recv(c->fd, rbuf, sizeof rbuf, 0);
                if (got > 0) {
                    c->t_last = now;
                    end = lg_resp_feed(&c->resp, rbuf, (size_t)got) >= LG_DONE;
                } else if (got == 0) {
                    lg_resp_eof(&c->resp);
                    end = true;
                } else if (errno != EAGAIN && errno != EINTR) {
                    snprintf(c->resp.error, sizeof c->resp.error, "recv: %s", strerror(errno));
                    io_error = end = true;
                }
            }
            if (!end && now - c->t_last > o->idle_s) {
                snprintf(c->resp.error, sizeof c->resp.error, "no bytes for %.0f s", o->idle_s);
                io_error = end = true;
            } else if (!end && now - c->t_start > o->timeout_s) {
                snprintf(c->resp.error, sizeof c->resp.error, "not done after %.0f s",
                         o->timeout_s);
                io_error = end = true;
            }
            if (!end) continue;
            if (io_error) c->resp.state = LG_ERROR;
            /* A kept-alive connection the server closed meanwhile: once more on a new one. */
            if (c->resp.state == LG_ERROR && c->reused && !c->resp.got_bytes && !c->retried) {
                int i = c->req;
                conn_close(c);
                lg_completion_free(&rs->c);
                lg_completion_init(&rs->c);
                if (conn_start(c, i, rs, o)) {
                    c->retried = true;
                    continue;
                }
                c->req = -1;
                failed++;
                finished++;
                continue;
            }
            conn_finish(c, rq, rs);
            if (!rs->ok) failed++;
            finished++;
        }
    }
    return failed;
}

/* ---- requests ---- */

static bool req_make(struct lg_req *r, const struct lg_opts *o, const char *method,
                     const char *path, const char *body) {
    size_t blen = body ? strlen(body) : 0;
    char auth[300] = "";
    if (o->api_key) snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", o->api_key);
    bool v6 = strchr(o->host, ':') != NULL; /* an IPv6 literal goes in brackets */
    int head = snprintf(NULL, 0,
                        "%s %s HTTP/1.1\r\nHost: %s%s%s:%d\r\n%sContent-Type: application/json\r\n"
                        "Content-Length: %zu\r\n\r\n",
                        method, path, v6 ? "[" : "", o->host, v6 ? "]" : "", o->port, auth, blen);
    r->wire = malloc((size_t)head + blen + 1);
    if (!r->wire) return false;
    snprintf(r->wire, (size_t)head + 1,
             "%s %s HTTP/1.1\r\nHost: %s%s%s:%d\r\n%sContent-Type: application/json\r\n"
             "Content-Length: %zu\r\n\r\n",
             method, path, v6 ? "[" : "", o->host, v6 ? "]" : "", o->port, auth, blen);
    if (blen) memcpy(r->wire + head, body, blen);
    r->wire_len = (size_t)head + blen;
    r->stream = false;
    return true;
}

static bool req_completion(struct lg_req *r, const struct lg_opts *o, int i) {
    static const char *const who[] = {"Lily", "Tom",     "the dog", "a bird",
                                      "Ben",  "the sun", "Mom",     "a fish"};
    static const char *const did[] = {"saw", "had", "wanted", "found"};
    char prompt[128];
    snprintf(prompt, sizeof prompt, "Once upon a time, %s %s %d", who[i % 8], did[i % 4], i);
    json_t *j = json_pack("{s:s,s:s,s:i,s:i,s:b,s:{s:b}}", "model", o->model_id, "prompt", prompt,
                          "max_tokens", o->tokens, "temperature", 0, "stream", 1, "stream_options",
                          "include_usage", 1);
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    bool ok = body && req_make(r, o, "POST", "/v1/completions", body);
    free(body);
    r->stream = true;
    return ok;
}

/* GET path on a connection of its own; the body (NUL-terminated, owned by c->resp)
 * or NULL with the error printed. */
static const char *http_get(struct lg_conn *c, const struct lg_opts *o, const char *path) {
    struct lg_req rq;
    struct lg_result rs = {0};
    lg_completion_init(&rs.c);
    if (!req_make(&rq, o, "GET", path, NULL)) return NULL;
    int failed = run_requests(c, 1, &rq, &rs, 1, o);
    free(rq.wire);
    lg_completion_free(&rs.c);
    if (failed) {
        fprintf(stderr, "loadgen: GET %s: %s\n", path, rs.error);
        return NULL;
    }
    return c->resp.body.data ? c->resp.body.data : "";
}

/* ---- what the server used ---- */

enum {
    SCHED_STEPS,
    SCHED_TOKENS,
    SCHED_ROWS,
    SCHED_BATCH,
    SCHED_FORWARD,
    SCHED_SAMPLE,
    SCHED_RETIRE,
    SCHED_IDLE,
    SCHED_COUNT
};
static const char *const sched_keys[] = {"\nllmopt_scheduler_steps_total ",
                                         "\nllmopt_scheduler_batch_tokens_total ",
                                         "\nllmopt_scheduler_logit_rows_total ",
                                         "\nllmopt_scheduler_seconds_total{phase=\"batch\"} ",
                                         "\nllmopt_scheduler_seconds_total{phase=\"forward\"} ",
                                         "\nllmopt_scheduler_seconds_total{phase=\"sample\"} ",
                                         "\nllmopt_scheduler_seconds_total{phase=\"retire\"} ",
                                         "\nllmopt_scheduler_seconds_total{phase=\"idle\"} "};
_Static_assert(sizeof sched_keys / sizeof sched_keys[0] == SCHED_COUNT, "one key per counter");

/* Per thread group of the server: the scheduler thread, the HTTP (MHD) threads and
 * the rest; CPU seconds and involuntary context switches. Threads that ended during a
 * pass are missed: the load generator keeps its connections (and so MHD's
 * thread-per-connection threads) open from the warm-up to the end. */
enum { GROUP_SCHED, GROUP_HTTP, GROUP_OTHER, GROUP_COUNT };

struct server_sample {
    bool have_metrics, have_threads;
    double sched[SCHED_COUNT];
    double group_cpu[GROUP_COUNT];
    long long preempt[GROUP_COUNT];
};

static bool metrics_read(struct lg_conn *c, const struct lg_opts *o, double *v) {
    const char *t = http_get(c, o, "/metrics");
    if (!t) return false;
    for (int k = 0; k < SCHED_COUNT; k++) {
        const char *at = strstr(t, sched_keys[k]);
        v[k] = at ? strtod(at + strlen(sched_keys[k]), NULL) : 0.0;
    }
    return true;
}

/* A thread's time on a CPU, in seconds, from /proc/.../schedstat (nanoseconds; the
 * clock-tick counts of stat are too coarse for a pass of 0.1 s). */
static double proc_schedstat_cpu(const char *path) {
    FILE *f = fopen(path, "r");
    unsigned long long ns = 0;
    if (!f) return 0.0;
    if (fscanf(f, "%llu", &ns) != 1) ns = 0;
    fclose(f);
    return 1e-9 * (double)ns;
}

static void server_sample(struct lg_conn *mc, const struct lg_opts *o, struct server_sample *s) {
    memset(s, 0, sizeof *s);
    s->have_metrics = metrics_read(mc, o, s->sched);
    if (o->pid <= 0) return;
    char path[128];
    snprintf(path, sizeof path, "/proc/%d/task", o->pid);
    DIR *d = opendir(path);
    if (!d) return;
    s->have_threads = true;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char p[300], comm[64] = "", line[256];
        snprintf(p, sizeof p, "/proc/%d/task/%s/comm", o->pid, e->d_name);
        FILE *f = fopen(p, "r");
        if (!f) continue; /* the thread ended */
        if (!fgets(comm, sizeof comm, f)) comm[0] = 0;
        fclose(f);
        int g = !strncmp(comm, "llmopt-sched", 12) ? GROUP_SCHED
                : !strncmp(comm, "MHD", 3)         ? GROUP_HTTP
                                                   : GROUP_OTHER;
        snprintf(p, sizeof p, "/proc/%d/task/%s/schedstat", o->pid, e->d_name);
        s->group_cpu[g] += proc_schedstat_cpu(p);
        snprintf(p, sizeof p, "/proc/%d/task/%s/status", o->pid, e->d_name);
        if (!(f = fopen(p, "r"))) continue;
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "nonvoluntary_ctxt_switches:", 27))
                s->preempt[g] += atoll(line + 27);
        fclose(f);
    }
    closedir(d);
}

/* ---- one measured pass ---- */

struct pass {
    double secs, tps, client_cpu;
    long long tokens;
    int failed;
    struct server_sample before, after;
};

static void pass_run(struct pass *p, struct lg_conn *conns, int n_conn, struct lg_conn *mc,
                     const struct lg_req *reqs, struct lg_result *res, int n,
                     const struct lg_opts *o) {
    server_sample(mc, o, &p->before);
    double c0 = self_cpu_s(), t0 = clock_now_s();
    p->failed = run_requests(conns, n_conn, reqs, res, n, o);
    p->secs = clock_now_s() - t0;
    p->client_cpu = self_cpu_s() - c0;
    server_sample(mc, o, &p->after);
    p->tokens = 0;
    for (int i = 0; i < n; i++)
        if (res[i].ok) p->tokens += res[i].c.completion_tokens;
    p->tps = (double)p->tokens / p->secs;
}

static void pass_print(const struct pass *p, int round, int clients, const struct lg_opts *o) {
    double tok = p->tokens > 0 ? (double)p->tokens : 1.0;
    printf("round %d: %d client%s %.0f tok/s (%lld tokens in %.2f s)\n", round, clients,
           clients == 1 ? "" : "s", p->tps, p->tokens, p->secs);
    const struct server_sample *a = &p->before, *b = &p->after;
    if (a->have_threads && b->have_threads) {
        double g[GROUP_COUNT], all = 0.0;
        for (int k = 0; k < GROUP_COUNT; k++) {
            g[k] = b->group_cpu[k] - a->group_cpu[k];
            all += g[k];
        }
        printf("      CPU seconds: server %.3f, load client %.3f; per token: server %.1f us "
               "(scheduler thread %.1f, HTTP threads %.1f, other %.1f), load client %.1f us; "
               "preempted: scheduler %lld, HTTP threads %lld times\n",
               all, p->client_cpu, 1e6 * all / tok, 1e6 * g[GROUP_SCHED] / tok,
               1e6 * g[GROUP_HTTP] / tok, 1e6 * g[GROUP_OTHER] / tok, 1e6 * p->client_cpu / tok,
               b->preempt[GROUP_SCHED] - a->preempt[GROUP_SCHED],
               b->preempt[GROUP_HTTP] - a->preempt[GROUP_HTTP]);
    } else {
        printf("      CPU seconds: load client %.3f (%.1f us/token); server: %s\n", p->client_cpu,
               1e6 * p->client_cpu / tok, o->pid > 0 ? "its /proc entry is gone" : "pass --pid");
    }
    if (!a->have_metrics || !b->have_metrics) return;
    double d[SCHED_COUNT];
    for (int k = 0; k < SCHED_COUNT; k++) d[k] = b->sched[k] - a->sched[k];
    if (d[SCHED_STEPS] <= 0) return;
    printf("      scheduler: %.0f steps, %.1f tokens/step; ms in batch %.0f, forward %.0f (%.0f "
           "us/step), sample %.0f (%.1f us/row), retire %.0f, idle %.0f\n",
           d[SCHED_STEPS], d[SCHED_TOKENS] / d[SCHED_STEPS], 1e3 * d[SCHED_BATCH],
           1e3 * d[SCHED_FORWARD], 1e6 * d[SCHED_FORWARD] / d[SCHED_STEPS], 1e3 * d[SCHED_SAMPLE],
           d[SCHED_ROWS] > 0 ? 1e6 * d[SCHED_SAMPLE] / d[SCHED_ROWS] : 0.0, 1e3 * d[SCHED_RETIRE],
           1e3 * d[SCHED_IDLE]);
}

/* ---- main ---- */

static int usage(void) {
    fprintf(
        stderr,
        "usage: bench_loadgen --port P [--pid PID] [--host H] [--clients N] [--requests M]\n"
        "                     [--tokens T] [--rounds R] [--only-many] [--min-speedup X]\n"
        "                     [--model-id ID] [--api-key KEY] [--timeout S] [--idle-timeout S]\n");
    return 2;
}

static bool arg_num(const char *s, double lo, double hi, double *out) {
    char *e;
    double v = strtod(s, &e);
    if (e == s || *e || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    struct lg_opts o = {.host = "127.0.0.1",
                        .clients = 32,
                        .tokens = 64,
                        .rounds = 3,
                        .timeout_s = 300,
                        .idle_s = 60};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double x;
        if (!strcmp(a, "--only-many")) {
            o.only_many = true;
            continue;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage();
        if (!v) return usage();
        i++;
        if (!strcmp(a, "--host"))
            o.host = v;
        else if (!strcmp(a, "--model-id"))
            o.model_id = v;
        else if (!strcmp(a, "--api-key"))
            o.api_key = v;
        else if (!strcmp(a, "--port") && arg_num(v, 1, 65535, &x))
            o.port = (int)x;
        else if (!strcmp(a, "--pid") && arg_num(v, 1, 1 << 30, &x))
            o.pid = (int)x;
        else if (!strcmp(a, "--clients") && arg_num(v, 1, 4096, &x))
            o.clients = (int)x;
        else if (!strcmp(a, "--requests") && arg_num(v, 1, 1 << 20, &x))
            o.requests = (int)x;
        else if (!strcmp(a, "--tokens") && arg_num(v, 1, 1 << 20, &x))
            o.tokens = (int)x;
        else if (!strcmp(a, "--rounds") && arg_num(v, 1, 1000, &x))
            o.rounds = (int)x;
        else if (!strcmp(a, "--min-speedup") && arg_num(v, 0, 1e6, &x))
            o.min_speedup = x;
        else if (!strcmp(a, "--timeout") && arg_num(v, 1, 1e6, &x))
            o.timeout_s = x;
        else if (!strcmp(a, "--idle-timeout") && arg_num(v, 1, 1e6, &x))
            o.idle_s = x;
        else {
            fprintf(stderr, "loadgen: bad option or value: %s %s\n", a, v);
            return usage();
        }
    }
    if (!o.port) return usage();
    int n = o.clients, m = o.requests ? o.requests : o.clients;
    struct lg_conn *conns = calloc((size_t)n + 1, sizeof *conns);
    struct lg_req *reqs = calloc((size_t)m, sizeof *reqs);
    struct lg_result *one = calloc((size_t)m, sizeof *one), *many = calloc((size_t)m, sizeof *many);
    double *ratios = calloc((size_t)o.rounds, sizeof *ratios);
    if (!conns || !reqs || !one || !many || !ratios) {
        fprintf(stderr, "loadgen: out of memory\n");
        return 1;
    }
    for (int k = 0; k <= n; k++) {
        conns[k].fd = -1;
        conns[k].req = -1;
        if (!lg_resp_init(&conns[k].resp, lg_completion_event, NULL)) {
            fprintf(stderr, "loadgen: out of memory\n");
            return 1;
        }
    }
    for (int i = 0; i < m; i++) {
        lg_completion_init(&one[i].c);
        lg_completion_init(&many[i].c);
    }
    struct lg_conn *mc = &conns[n]; /* for /metrics and /v1/models */
    char model_id[256];
    if (!o.model_id) {
        const char *body = http_get(mc, &o, "/v1/models");
        json_t *j = body ? json_loads(body, 0, NULL) : NULL;
        json_t *id = json_object_get(json_array_get(json_object_get(j, "data"), 0), "id");
        if (!json_is_string(id)) {
            fprintf(stderr, "loadgen: no model id in GET /v1/models (pass --model-id)\n");
            json_decref(j);
            return 1;
        }
        snprintf(model_id, sizeof model_id, "%s", json_string_value(id));
        json_decref(j);
        o.model_id = model_id;
    }
    for (int i = 0; i < m; i++)
        if (!req_completion(&reqs[i], &o, i)) {
            fprintf(stderr, "loadgen: out of memory\n");
            return 1;
        }
    if (run_requests(conns, 1, reqs, one, 1, &o)) { /* warm-up */
        fprintf(stderr, "loadgen: warm-up request failed: %s\n", one[0].error);
        return 1;
    }
    bool same = true, complete = true;
    for (int round = 1; round <= o.rounds; round++) {
        struct pass p1 = {.tps = 1.0}, pn;
        if (!o.only_many) {
            pass_run(&p1, conns, 1, mc, reqs, one, m, &o);
            pass_print(&p1, round, 1, &o);
        }
        pass_run(&pn, conns, n, mc, reqs, many, m, &o);
        pass_print(&pn, round, n, &o);
        int shown = 0;
        for (int i = 0; i < m; i++) {
            if (!o.only_many && !one[i].ok && shown++ < 5)
                fprintf(stderr, "loadgen: round %d, 1 client, request %d: %s\n", round, i,
                        one[i].error);
            if (!many[i].ok && shown++ < 5)
                fprintf(stderr, "loadgen: round %d, %d clients, request %d: %s\n", round, n, i,
                        many[i].error);
            if (o.only_many || !one[i].ok || !many[i].ok) continue;
            if (one[i].c.completion_tokens != many[i].c.completion_tokens ||
                one[i].c.text.len != many[i].c.text.len ||
                (one[i].c.text.len &&
                 memcmp(one[i].c.text.data, many[i].c.text.data, one[i].c.text.len))) {
                fprintf(stderr,
                        "loadgen: round %d, request %d: %d clients gave\n  '%s' (%lld tokens)\n"
                        "where 1 client gave\n  '%s' (%lld tokens)\n",
                        round, i, n, many[i].c.text.data ? many[i].c.text.data : "",
                        (long long)many[i].c.completion_tokens,
                        one[i].c.text.data ? one[i].c.text.data : "",
                        (long long)one[i].c.completion_tokens);
                same = false;
            }
        }
        complete = complete && !pn.failed && (o.only_many || !p1.failed);
        if (!complete) {
            fprintf(stderr, "loadgen: round %d: %d of %d requests failed; stopping\n", round,
                    pn.failed + (o.only_many ? 0 : p1.failed), o.only_many ? m : 2 * m);
            o.rounds = round;
            break;
        }
        ratios[round - 1] = pn.tps / p1.tps;
        double la[3] = {0, 0, 0};
        getloadavg(la, 3);
        if (!o.only_many)
            printf("round %d: ratio %.2fx; load average %.2f %.2f %.2f\n", round, ratios[round - 1],
                   la[0], la[1], la[2]);
        else
            printf("round %d: load average %.2f %.2f %.2f\n", round, la[0], la[1], la[2]);
        fflush(stdout);
    }
    printf("every request completed: %s\n", complete ? "yes" : "NO");
    bool met = true;
    if (!o.only_many) {
        printf("outputs %d clients == 1 client: %s\n", n, same ? "yes" : "NO");
        printf("ratio per round:");
        for (int r = 0; r < o.rounds; r++) printf(" %.2f", ratios[r]);
        qsort(ratios, (size_t)o.rounds, sizeof *ratios, cmp_double);
        double median = ratios[o.rounds / 2];
        met = o.min_speedup <= 0 || median >= o.min_speedup;
        printf("; median %.2fx", median);
        if (o.min_speedup > 0) printf(" (goal >= %gx: %s)", o.min_speedup, met ? "met" : "NOT met");
        printf("\n");
    }
    for (int k = 0; k <= n; k++) {
        conn_close(&conns[k]);
        lg_resp_free(&conns[k].resp);
    }
    for (int i = 0; i < m; i++) {
        free(reqs[i].wire);
        lg_completion_free(&one[i].c);
        lg_completion_free(&many[i].c);
    }
    free(conns);
    free(reqs);
    free(one);
    free(many);
    free(ratios);
    return same && complete && met ? 0 : 1;
}
