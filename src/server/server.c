/* llmopt serve (see server.h): start everything, wait for a signal, stop everything
 * in reverse order. */
#include "server/server.h"

#include "server/http.h"
#include "server/srv_api.h"
#include "server/srv_metrics.h"
#include "server/srv_sched.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SRV_MAX_TEMPLATE_FILE (1u << 20)

static enum llmopt_status fail(struct llmopt_err *err, enum llmopt_status st, const char *fmt,
                               const char *arg) {
    err->status = st;
    snprintf(err->msg, sizeof err->msg, fmt, arg);
    return st;
}

/* "dir/stories260K-F32.gguf" -> "stories260K-F32" */
static void model_id_of(const char *path, char *out, size_t cap) {
    const char *base = strrchr(path, '/');
    base = base && base[1] ? base + 1 : path;
    snprintf(out, cap, "%s", base);
    size_t n = strlen(out);
    if (n > 5 && !strcmp(out + n - 5, ".gguf")) out[n - 5] = 0;
}

static char *token_text_dup(const struct llmopt_model *m, int32_t id) {
    size_t len = 0;
    const char *t = id >= 0 ? llmopt_token_text(m, id, &len) : NULL;
    if (!t) return NULL;
    char *s = malloc(len + 1);
    if (s) {
        memcpy(s, t, len);
        s[len] = 0;
    }
    return s;
}

/* The chat template: --chat-template FILE, else the model's own; NULL (with a note
 * saying why) when there is none, which leaves chat answering 400. */
static enum llmopt_status load_template(const struct srv_opts *o, const struct llmopt_model *m,
                                        struct llmopt_chat_template **out, char *note,
                                        size_t note_cap, struct llmopt_err *err) {
    *out = NULL;
    if (!o->chat_template_path) {
        struct llmopt_err terr = {0};
        if (llmopt_chat_template_load(o->model_path, out, &terr)) {
            snprintf(note, note_cap, "the model brings none (%.400s)", terr.msg);
            *out = NULL;
        }
        return LLMOPT_OK;
    }
    FILE *f = fopen(o->chat_template_path, "rb");
    if (!f)
        return fail(err, LLMOPT_ERR_IO, "serve: cannot open chat template '%s'",
                    o->chat_template_path);
    char *text = malloc(SRV_MAX_TEMPLATE_FILE + 1);
    size_t len = text ? fread(text, 1, SRV_MAX_TEMPLATE_FILE + 1, f) : 0;
    bool too_big = len > SRV_MAX_TEMPLATE_FILE, read_err = ferror(f);
    fclose(f);
    if (!text || too_big || read_err) {
        free(text);
        return fail(err, too_big ? LLMOPT_ERR_LIMIT : LLMOPT_ERR_IO,
                    "serve: cannot read chat template '%s' (over 1 MiB, or a read error)",
                    o->chat_template_path);
    }
    char *bos = token_text_dup(m, llmopt_token_bos(m)),
         *eos = token_text_dup(m, llmopt_token_eos(m));
    enum llmopt_status st = llmopt_chat_template_from_text(text, len, bos, eos, out, err);
    free(text);
    free(bos);
    free(eos);
    return st;
}

enum llmopt_status srv_run(const struct srv_opts *o, struct llmopt_err *err) {
    /* Signals go to sigwait below only: block them before any thread exists, so
     * every thread inherits the mask. SIGPIPE from a vanished client is ignored. */
    sigset_t sigs, old_sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, &old_sigs);
    struct sigaction old_pipe, ign = {.sa_handler = SIG_IGN};
    sigaction(SIGPIPE, &ign, &old_pipe);

    struct llmopt_model *model = NULL;
    struct llmopt_chat_template *tmpl = NULL;
    struct srv_metrics *metrics = NULL;
    struct srv_sched *sched = NULL;
    struct srv_app *app = NULL;
    struct http_server *http = NULL;
    char model_id[256], note[600] = "";
    enum llmopt_status st;

    struct llmopt_load_opts lo = {.programs_dir = o->programs_dir, .verbose = o->verbose};
    if ((st = llmopt_model_load(o->model_path, &lo, &model, err))) goto done;
    if ((st = load_template(o, model, &tmpl, note, sizeof note, err))) goto done;
    if (!(metrics = srv_metrics_create())) {
        st = fail(err, LLMOPT_ERR_NOMEM, "serve: out of memory%s", "");
        goto done;
    }
    struct srv_sched_opts so = {.n_slots = o->n_slots,
                                .n_ctx = o->n_ctx,
                                .prefill_chunk = o->prefill_chunk,
                                .queue_cap = o->queue_cap,
                                .stream_batch = o->stream_batch,
                                .n_threads = o->n_threads,
                                .kv_type = o->kv_type,
                                .prefix_cache = o->prefix_cache,
                                .n_engines = o->n_engines,
                                .backend = o->backend};
    if ((st = srv_sched_create(model, &so, metrics, &sched, err))) goto done;
    model_id_of(o->model_path, model_id, sizeof model_id);
    struct srv_app_opts ao = {.model_id = model_id,
                              .api_key = o->api_key,
                              .max_body = o->max_body,
                              .template_note = note};
    if (!(app = srv_app_create(model, tmpl, sched, metrics, &ao))) {
        st = fail(err, LLMOPT_ERR_NOMEM, "serve: out of memory%s", "");
        goto done;
    }
    /* Enough connections for every slot, the queue and some idle keep-alive clients;
     * beyond that MHD refuses connections. */
    struct http_opts ho = {.host = o->host,
                           .port = o->port,
                           .max_connections = (unsigned)(o->n_slots + o->queue_cap + 64),
                           .idle_timeout_s = 120};
    if ((st = http_server_start(&ho, app, &http, err))) goto done;

    int32_t n_ctx = srv_sched_n_ctx(sched), n_eng = srv_sched_n_engines(sched);
    const struct llmopt_session *sess = srv_sched_session(sched, 0);
    uint64_t kv_bytes = 0;
    for (int32_t i = 0; i < n_eng; i++) kv_bytes += llmopt_session_kv_bytes(srv_sched_session(sched, i));
    const int32_t n_thr = llmopt_session_n_threads(sess); /* 0 on a device backend */
    char where[64];
    if (n_thr)
        snprintf(where, sizeof where, "%d engine%s x %d thread%s", n_eng, n_eng > 1 ? "s" : "", n_thr,
                 n_thr > 1 ? "s" : "");
    else
        snprintf(where, sizeof where, "%d engine%s on %.32s", n_eng, n_eng > 1 ? "s" : "",
                 o->backend ? o->backend : "cpu");
    fprintf(stderr,
            "llmopt serve: model %s (program %s, vocab %d); %d slots x %d positions = KV "
            "capacity %lld tokens (%s, %.1f MiB); %s; prefill chunk %d; queue %d; "
            "prefix cache %s\n",
            model_id, llmopt_model_program(model), llmopt_model_n_vocab(model), o->n_slots, n_ctx,
            (long long)o->n_slots * n_ctx, llmopt_kv_type_name(llmopt_session_kv_type(sess)),
            (double)kv_bytes / (1024.0 * 1024.0), where, o->prefill_chunk,
            o->queue_cap,
            llmopt_session_prefix_cache_on(sess) ? "on" : o->prefix_cache ? "off (state not per position)" : "off");
    if (!tmpl)
        fprintf(stderr, "llmopt serve: no chat template: %s; /v1/chat/completions answers 400\n",
                note);
    fprintf(stderr, "llmopt serve: listening on http://%s%s%s:%d%s\n",
            strchr(o->host, ':') ? "[" : "", o->host, strchr(o->host, ':') ? "]" : "",
            http_server_port(http), o->api_key ? " (API key required)" : "");
    fflush(stderr);

    int sig = 0;
    while (sigwait(&sigs, &sig) != 0) {
    }
    fprintf(stderr, "llmopt serve: %s, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    /* Stop taking connections, end every request (their streams close and every
     * suspended connection is resumed), then close the remaining connections. */
    srv_app_set_stopping(app);
    http_server_quiesce(http);
    srv_sched_stop(sched);
    if (!srv_app_wait_idle(app, 5000))
        fprintf(stderr, "llmopt serve: some replies did not finish writing; closing them\n");
    http_server_stop(http);
    http = NULL;
    st = LLMOPT_OK;
done:
    http_server_stop(http);
    srv_sched_stop(sched);
    srv_app_free(app);
    srv_sched_free(sched);
    srv_metrics_free(metrics);
    llmopt_chat_template_free(tmpl);
    llmopt_model_free(model);
    sigaction(SIGPIPE, &old_pipe, NULL);
    pthread_sigmask(SIG_SETMASK, &old_sigs, NULL);
    return st;
}
