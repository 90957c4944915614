/* llmopt chat: an interactive chat in the terminal (or over a pipe, one user message
 * per line). Each turn renders the whole conversation through the chat template,
 * tokenizes it with special tokens parsed, and generates the reply token by token.
 *
 * The KV cache is reused across turns: the session remembers the ids it holds, and
 * when they are a prefix of the new prompt's ids only the new suffix is fed (the
 * previous reply's final end-of-turn token was never fed, so a template that closes
 * the turn with it still matches). Otherwise (a template that rewrites history,
 * /system, /reset) the sequence is reset and the prompt fed whole.
 *
 * A reply ends at an end-of-generation token, at the template's end-of-turn string
 * (found by rendering a probe conversation and reading what follows the assistant's
 * text) appearing in the text, or after -n tokens. */
#include "base/clock.h"
#include "cli.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct chat_args {
    const char *model, *system, *template_path, *programs, *extra, *backend;
    long long n_predict, n_ctx;
    enum llmopt_kv_type kv_type;
    struct llmopt_sampling sampling;
    bool seed_given, verbose;
};

struct chat {
    struct llmopt_model *model;
    struct llmopt_session *sess;
    struct llmopt_sampler *sampler;
    struct llmopt_chat_template *tpl;
    json_t *messages;   /* the conversation, OpenAI style */
    char *system;       /* current system prompt or NULL */
    char *extra;        /* extra template variables (a JSON object) or NULL */
    char *end_of_turn;  /* the template's end-of-turn string, or NULL */
    int32_t *kv_ids;    /* (n_ctx) ids the session's sequence holds */
    int32_t n_kv, n_ctx;
    bool tty;
};

/* What the template puts right after an assistant's text: render a probe
 * conversation and read the first line after the reply marker. NULL when the
 * template fails on the probe or puts nothing there. */
static char *probe_end_of_turn(const struct llmopt_chat_template *tpl) {
    static const char marker[] = "llmopt-reply-marker";
    const char *msgs = "[{\"role\": \"user\", \"content\": \"llmopt-user-marker\"},"
                       " {\"role\": \"assistant\", \"content\": \"llmopt-reply-marker\"}]";
    char *out = NULL;
    size_t n = 0;
    struct llmopt_err err = {0};
    if (llmopt_chat_template_render(tpl, msgs, strlen(msgs), false, NULL, &out, &n, &err)) return NULL;
    const char *m = strstr(out, marker);
    char *eot = NULL;
    if (m) {
        const char *s = m + sizeof marker - 1;
        while (*s == ' ' || *s == '\n' || *s == '\r' || *s == '\t') s++;
        size_t len = strcspn(s, "\n");
        while (len && (s[len - 1] == ' ' || s[len - 1] == '\r' || s[len - 1] == '\t')) len--;
        if (len && (eot = malloc(len + 1))) {
            memcpy(eot, s, len);
            eot[len] = 0;
        }
    }
    free(out);
    return eot;
}

static bool push_message(json_t *messages, const char *role, const char *content) {
    json_t *m = json_pack("{s:s, s:s}", "role", role, "content", content);
    return m && json_array_append_new(messages, m) == 0;
}

/* Rebuilds the conversation with only the system prompt (if any). */
static bool reset_conversation(struct chat *c) {
    json_array_clear(c->messages);
    return !c->system || push_message(c->messages, "system", c->system);
}

/* Length of the longest suffix of s[0..n) that is a proper prefix of eot. */
static size_t partial_suffix(const char *s, size_t n, const char *eot) {
    size_t e = strlen(eot);
    for (size_t k = e - 1 < n ? e - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, eot, k)) return k;
    return 0;
}

struct reply {
    char *text;
    size_t len, cap, printed;
};

static bool reply_add(struct reply *r, const char *s) {
    size_t n = strlen(s);
    if (r->len + n + 1 > r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 1024;
        while (cap < r->len + n + 1) cap *= 2;
        char *p = realloc(r->text, cap);
        if (!p) return false;
        r->text = p;
        r->cap = cap;
    }
    memcpy(r->text + r->len, s, n);
    r->len += n;
    r->text[r->len] = 0;
    return true;
}

/* Prints the reply up to `upto` bytes. */
static void reply_print(struct reply *r, size_t upto) {
    if (upto > r->printed) {
        fwrite(r->text + r->printed, 1, upto - r->printed, stdout);
        fflush(stdout);
        r->printed = upto;
    }
}

/* One turn: render, feed what the session lacks, generate and stream the reply,
 * append it to the conversation. */
static enum llmopt_status chat_turn(struct chat *c, const struct chat_args *a, struct llmopt_err *err) {
    char *prompt = NULL;
    size_t prompt_len = 0;
    char *msgs = json_dumps(c->messages, JSON_COMPACT);
    if (!msgs) return err->status = LLMOPT_ERR_NOMEM;
    enum llmopt_status st = llmopt_chat_template_render(c->tpl, msgs, strlen(msgs), true, c->extra, &prompt, &prompt_len, err);
    free(msgs);
    if (st) return st;

    size_t cap = prompt_len + 2, n_ids = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) {
        free(prompt);
        return err->status = LLMOPT_ERR_NOMEM;
    }
    /* BOS: the template usually writes it; add it only when the tokenizer wants one
       and the rendered text did not start with it. */
    int32_t bos = llmopt_token_bos(c->model);
    bool want_bos = llmopt_add_bos_default(c->model) && bos >= 0;
    st = llmopt_tokenize_ex(c->model, prompt, prompt_len, false, true, ids + 1, cap - 1, &n_ids, err);
    free(prompt);
    if (st) {
        free(ids);
        return st;
    }
    int32_t *p_ids = ids + 1;
    if (want_bos && (n_ids == 0 || p_ids[0] != bos)) {
        ids[0] = bos;
        p_ids = ids;
        n_ids++;
    }
    if ((int64_t)n_ids + 1 > c->n_ctx) {
        free(ids);
        err->status = LLMOPT_ERR_LIMIT;
        snprintf(err->msg, sizeof err->msg,
                 "the conversation (%zu tokens) no longer fits the context of %d tokens; /reset starts over",
                 n_ids, c->n_ctx);
        return LLMOPT_ERR_LIMIT;
    }
    /* Reuse the cache when it holds a prefix of the new prompt. */
    int32_t keep = c->n_kv;
    if (keep >= (int32_t)n_ids || memcmp(c->kv_ids, p_ids, (size_t)keep * sizeof *p_ids) != 0) {
        llmopt_session_reset(c->sess, 0);
        keep = 0;
    }
    /* The sampler sees the whole sequence as its penalty history; the session samples
     * on the device where the backend can (llmopt_session_append_sample). */
    memcpy(c->kv_ids, p_ids, n_ids * sizeof *p_ids);
    int32_t id = 0;
    double t0 = clock_now_s();
    st = llmopt_session_append_sample(c->sess, 0, p_ids + keep, (int32_t)n_ids - keep, c->sampler, c->kv_ids,
                                      n_ids, &id, err);
    if (st) {
        c->n_kv = 0;
        llmopt_session_reset(c->sess, 0);
        free(ids);
        return st;
    }
    c->n_kv = (int32_t)n_ids;
    int32_t n_fed = (int32_t)n_ids - keep;
    free(ids);

    struct llmopt_detok *detok = NULL;
    if ((st = llmopt_detok_create(c->model, &detok, err))) return st;
    struct reply r = {0};
    int32_t n_gen = 0;
    const char *why = "length";
    for (;;) {
        if (llmopt_token_is_eog(c->model, id)) {
            why = "end of generation token";
            break;
        }
        n_gen++;
        if (!reply_add(&r, llmopt_detok_push(detok, id))) {
            st = err->status = LLMOPT_ERR_NOMEM;
            break;
        }
        if (c->end_of_turn) {
            char *hit = strstr(r.text ? r.text : "", c->end_of_turn);
            if (hit) {
                r.len = (size_t)(hit - r.text);
                r.text[r.len] = 0;
                why = "end-of-turn text";
                break;
            }
            reply_print(&r, r.len - partial_suffix(r.text, r.len, c->end_of_turn));
        } else {
            reply_print(&r, r.len);
        }
        if (n_gen >= a->n_predict || c->n_kv + 1 >= c->n_ctx) {
            if (c->n_kv + 1 >= c->n_ctx) why = "context full";
            break;
        }
        c->kv_ids[c->n_kv] = id;
        int32_t next = 0;
        if ((st = llmopt_session_append_sample(c->sess, 0, &c->kv_ids[c->n_kv], 1, c->sampler, c->kv_ids,
                                               (size_t)c->n_kv + 1, &next, err)))
            break;
        c->n_kv++;
        id = next;
    }
    if (!st && !reply_add(&r, llmopt_detok_flush(detok))) st = err->status = LLMOPT_ERR_NOMEM;
    llmopt_detok_free(detok);
    if (!st) {
        reply_print(&r, r.len);
        putchar('\n');
        fflush(stdout);
        if (!push_message(c->messages, "assistant", r.text ? r.text : "")) st = err->status = LLMOPT_ERR_NOMEM;
    }
    if (a->verbose)
        fprintf(stderr, "[fed %d prompt tokens (%d reused from the cache), generated %d, stopped: %s, %.2f s]\n",
                n_fed, keep, n_gen, why, clock_now_s() - t0);
    free(r.text);
    return st;
}

static void set_system(struct chat *c, const char *text) {
    free(c->system);
    c->system = text && *text ? strdup(text) : NULL;
}

int cmd_chat(int argc, char **argv) {
    struct chat_args a = {.n_predict = 512};
    llmopt_sampling_default(&a.sampling);
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i], *v = NULL;
        if (!strcmp(arg, "-v") || !strcmp(arg, "--verbose")) { a.verbose = true; continue; }
        if (arg[0] != '-' || !arg[1]) {
            if (a.model) return usage_error("chat: unexpected argument '%s'", arg);
            a.model = arg;
            continue;
        }
        if (!(v = option_value(argc, argv, &i))) return usage_error("chat: option '%s' needs a value", arg);
        int sr = cli_sampling_option("chat", arg, v, &a.sampling, &a.seed_given);
        if (sr > 0) return sr;
        if (sr == 0) continue;
        if (!strcmp(arg, "--system")) a.system = v;
        else if (!strcmp(arg, "--chat-template")) a.template_path = v;
        else if (!strcmp(arg, "--extra")) a.extra = v;
        else if (!strcmp(arg, "--programs")) a.programs = v;
        else if (!strcmp(arg, "--backend")) a.backend = v;
        else if (!strcmp(arg, "--kv-type")) {
            if (!llmopt_kv_type_parse(v, &a.kv_type)) return usage_error("chat: --kv-type needs f16, q8_0 or f32, got '%s'", v);
        }
        else if (!strcmp(arg, "-n") || !strcmp(arg, "--n-predict")) {
            if (!parse_long(v, 1, INT32_MAX, &a.n_predict)) return usage_error("chat: -n needs a count >= 1, got '%s'", v);
        } else if (!strcmp(arg, "--ctx") || !strcmp(arg, "-c")) {
            if (!parse_long(v, 1, 1 << 20, &a.n_ctx)) return usage_error("chat: --ctx needs 1..1048576, got '%s'", v);
        } else {
            return usage_error("chat: unknown option '%s'", arg);
        }
    }
    if (!a.model) return usage_error("chat: %s", "missing MODEL");
    if (!a.seed_given) a.sampling.seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);

    struct llmopt_err err = {0};
    struct chat c = {.tty = isatty(STDIN_FILENO)};
    char *line = NULL, *tpl_text = NULL;
    size_t line_cap = 0;
    int rc = 1;
    struct llmopt_load_opts lo = {.programs_dir = a.programs, .verbose = a.verbose};
    if (llmopt_model_load(a.model, &lo, &c.model, &err)) goto done;
    if (a.template_path) {
        size_t len;
        if (!(tpl_text = cli_read_file(a.template_path, &len, &err)) ||
            cli_template_from_text(a.model, tpl_text, len, &c.tpl, &err))
            goto done;
    } else if (llmopt_chat_template_load(a.model, &c.tpl, &err)) {
        goto done;
    }
    if (a.extra) {
        size_t len;
        if (a.extra[0] == '@' ? !(c.extra = cli_read_file(a.extra + 1, &len, &err)) : !(c.extra = strdup(a.extra))) {
            if (!err.status) err.status = LLMOPT_ERR_NOMEM;
            goto done;
        }
    }
    c.end_of_turn = probe_end_of_turn(c.tpl);
    struct llmopt_session_opts so = {.n_ctx = (int32_t)a.n_ctx, .kv_type = a.kv_type, .backend = a.backend};
    if (llmopt_session_create(c.model, &so, &c.sess, &err)) goto done;
    c.n_ctx = llmopt_session_n_ctx(c.sess);
    if (llmopt_sampler_create(&a.sampling, llmopt_model_n_vocab(c.model), &c.sampler, &err)) goto done;
    c.kv_ids = malloc((size_t)c.n_ctx * sizeof *c.kv_ids);
    c.messages = json_array();
    set_system(&c, a.system);
    if (!c.kv_ids || !c.messages || !reset_conversation(&c)) {
        err.status = LLMOPT_ERR_NOMEM;
        goto done;
    }
    if (c.tty)
        fprintf(stderr, "llmopt chat: %s (context %d tokens%s%s%s). /reset, /system TEXT, /exit\n", a.model, c.n_ctx,
                c.end_of_turn ? ", turns end at \"" : "", c.end_of_turn ? c.end_of_turn : "", c.end_of_turn ? "\"" : "");
    for (;;) {
        if (c.tty) {
            fputs("\033[1m> \033[0m", stdout);
            fflush(stdout);
        }
        ssize_t got = getline(&line, &line_cap, stdin);
        if (got < 0) break;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        if (got == 0) continue;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            if (!reset_conversation(&c)) break;
            if (c.tty) fputs("(conversation cleared)\n", stderr);
            continue;
        }
        if (!strcmp(line, "/system") || !strncmp(line, "/system ", 8)) {
            set_system(&c, line[7] ? line + 8 : NULL);
            if (!reset_conversation(&c)) break;
            if (c.tty) fprintf(stderr, "(system prompt %s; conversation cleared)\n", c.system ? "set" : "removed");
            continue;
        }
        if (line[0] == '/' && line[1] != '/' && c.tty) {
            fprintf(stderr, "commands: /reset, /system TEXT, /exit (start a message with // to send a leading /)\n");
            continue;
        }
        const char *text = line[0] == '/' && line[1] == '/' ? line + 1 : line;
        if (!push_message(c.messages, "user", text)) {
            err.status = LLMOPT_ERR_NOMEM;
            goto done;
        }
        enum llmopt_status st = chat_turn(&c, &a, &err);
        if ((st == LLMOPT_ERR_LIMIT || st == LLMOPT_ERR_INVALID_ARG) && c.tty) {
            /* the conversation does not fit, or the template refused it: drop the message */
            cli_name_template_error(&err, a.template_path);
            fail(&err);
            json_array_remove(c.messages, json_array_size(c.messages) - 1);
            memset(&err, 0, sizeof err);
            continue;
        }
        if (st) goto done;
    }
    rc = 0;
done:
    if (rc) {
        cli_name_template_error(&err, a.template_path);
        fail(&err);
    }
    free(line);
    free(tpl_text);
    free(c.kv_ids);
    free(c.system);
    free(c.end_of_turn);
    free(c.extra);
    json_decref(c.messages);
    llmopt_sampler_free(c.sampler);
    llmopt_session_free(c.sess);
    llmopt_chat_template_free(c.tpl);
    llmopt_model_free(c.model);
    return rc;
}
