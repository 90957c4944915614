/* OpenAI JSON shapes (see srv_openai.h). */
#include "server/srv_openai.h"

#include "server/srv_buf.h"

#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

char *srv_error_body(const struct srv_error *e, size_t *len) {
    json_t *o = json_pack("{s:{s:s,s:s,s:o,s:o}}", "error", "message", e->message, "type",
                          e->type ? e->type : "invalid_request_error", "param",
                          e->param[0] ? json_string(e->param) : json_null(), "code",
                          e->code ? json_string(e->code) : json_null());
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s) { /* the message was not UTF-8, or no memory: a fixed body */
        static const char fallback[] = "{\"error\":{\"message\":\"error\",\"type\":\"server_"
                                       "error\",\"param\":null,\"code\":null}}";
        s = strdup(fallback);
    }
    if (len) *len = s ? strlen(s) : 0;
    return s;
}

json_t *srv_usage_json(int32_t prompt_tokens, int32_t cached_tokens, int32_t completion_tokens) {
    return json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", prompt_tokens, "completion_tokens",
                     completion_tokens, "total_tokens", prompt_tokens + completion_tokens,
                     "prompt_tokens_details", "cached_tokens", cached_tokens);
}

const char *srv_finish_name(enum srv_finish f) {
    switch (f) {
    case SRV_FINISH_STOP:
        return "stop";
    case SRV_FINISH_LENGTH:
        return "length";
    default:
        return NULL;
    }
}

void srv_make_id(char *buf, size_t cap, const char *prefix) {
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    unsigned char r[29];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
        struct timespec ts; /* no entropy: still unique enough per process */
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ (uint64_t)(uintptr_t)buf;
        for (size_t i = 0; i < sizeof r; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            r[i] = (unsigned char)(x >> 56);
        }
    }
    char tail[sizeof r + 1];
    for (size_t i = 0; i < sizeof r; i++) tail[i] = alphabet[r[i] % (sizeof alphabet - 1)];
    tail[sizeof r] = 0;
    snprintf(buf, cap, "%s%s", prefix, tail);
}

/* The token's text as a JSON string (valid UTF-8 as is; otherwise tiktoken's
 * "bytes:\xNN" spelling) and, optionally, its bytes as an array of integers. */
static json_t *token_string(const struct llmopt_model *m, int32_t id, json_t **bytes) {
    char buf[512];
    size_t n = llmopt_token_piece(m, id, buf, sizeof buf);
    if (n > sizeof buf) n = sizeof buf;
    if (bytes) {
        *bytes = json_array();
        for (size_t i = 0; i < n && *bytes; i++)
            json_array_append_new(*bytes, json_integer((unsigned char)buf[i]));
    }
    if (srv_utf8_valid(buf, n)) return json_stringn(buf, n);
    struct srv_buf b;
    srv_buf_init(&b, 4 * sizeof buf + 8);
    srv_buf_puts(&b, "bytes:");
    for (size_t i = 0; i < n; i++) srv_buf_printf(&b, "\\x%02x", (unsigned char)buf[i]);
    json_t *s = json_stringn(b.data ? b.data : "", b.len);
    srv_buf_free(&b);
    return s;
}

static json_t *chat_top_entry(const struct llmopt_model *m, int32_t id, float logprob) {
    json_t *bytes = NULL, *tok = token_string(m, id, &bytes);
    return json_pack("{s:o,s:f,s:o}", "token", tok ? tok : json_string(""), "logprob",
                     (double)logprob, "bytes", bytes ? bytes : json_array());
}

json_t *srv_chat_logprob(const struct llmopt_model *m, const struct srv_event *ev) {
    json_t *e = chat_top_entry(m, ev->token, ev->logprob);
    json_t *top = json_array();
    for (int32_t j = 0; j < ev->n_top && top; j++)
        json_array_append_new(top, chat_top_entry(m, ev->top_id[j], ev->top_logprob[j]));
    if (e)
        json_object_set_new(e, "top_logprobs", top ? top : json_array());
    else
        json_decref(top);
    return e;
}

json_t *srv_completion_logprobs_new(void) {
    return json_pack("{s:[],s:[],s:[],s:[]}", "tokens", "token_logprobs", "top_logprobs",
                     "text_offset");
}

void srv_completion_logprobs_add(const struct llmopt_model *m, json_t *lp,
                                 const struct srv_event *ev, int32_t n_top, size_t text_offset) {
    json_t *tok = token_string(m, ev->token, NULL);
    json_array_append_new(json_object_get(lp, "tokens"), tok ? tok : json_string(""));
    json_array_append_new(json_object_get(lp, "token_logprobs"), json_real(ev->logprob));
    json_t *top = json_null();
    if (n_top > 0) {
        top = json_object();
        for (int32_t j = 0; j < ev->n_top && top; j++) {
            json_t *k = token_string(m, ev->top_id[j], NULL);
            if (k) json_object_set_new(top, json_string_value(k), json_real(ev->top_logprob[j]));
            json_decref(k);
        }
    }
    json_array_append_new(json_object_get(lp, "top_logprobs"), top ? top : json_null());
    json_array_append_new(json_object_get(lp, "text_offset"),
                          json_integer((json_int_t)text_offset));
}
