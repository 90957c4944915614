/* OpenAI request bodies -> generation parameters (see srv_request.h). Messages follow
 * OpenAI's wording where it has one ("Invalid type for 'temperature': ..."), so
 * clients that surface the message read naturally. */
#include "server/srv_request.h"

#include "base/json_kind.h"
#include "base/utf8.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void srv_error_set(struct srv_error *e, int status, const char *type, const char *code,
                   const char *param, const char *fmt, ...) {
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

static bool bad_request(struct srv_error *e, const char *code, const char *param, const char *fmt,
                        ...) __attribute__((format(printf, 4, 5)));
static bool bad_request(struct srv_error *e, const char *code, const char *param, const char *fmt,
                        ...) {
    e->status = 400;
    e->type = "invalid_request_error";
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return false;
}

bool srv_utf8_valid(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        uint8_t lo, hi; /* allowed range of the second byte */
        const size_t len = (size_t)utf8_lead(c, &lo, &hi);
        if (len == 0) return false;
        if (n - i < len || s[i + 1] < lo || s[i + 1] > hi) return false;
        for (size_t k = 2; k < len; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xbf) return false;
        i += len;
    }
    return true;
}

bool srv_json_too_deep(const char *s, size_t n, int max_depth) {
    int depth = 0;
    bool in_string = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_string) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > max_depth) return true;
        } else if (c == ']' || c == '}') {
            depth--;
        }
    }
    return false;
}

static bool wrong_type(struct srv_error *e, const char *param, const char *want, const json_t *v) {
    return bad_request(e, "invalid_type", param,
                       "Invalid type for '%s': expected %s, but got %s instead.", param, want,
                       json_kind(v));
}

/* Each getter: a missing key or JSON null leaves *out untouched and *present false. */
static bool get_number(json_t *o, const char *key, double *out, bool *present,
                       struct srv_error *e) {
    json_t *v = json_object_get(o, key);
    if (present) *present = false;
    if (!v || json_is_null(v)) return true;
    if (!json_is_number(v)) return wrong_type(e, key, "a number", v);
    *out = json_number_value(v);
    if (present) *present = true;
    return true;
}

static bool get_int(json_t *o, const char *key, int64_t *out, bool *present, struct srv_error *e) {
    json_t *v = json_object_get(o, key);
    if (present) *present = false;
    if (!v || json_is_null(v)) return true;
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
               fabs(json_real_value(v)) < 9e15) {
        *out = (int64_t)json_real_value(v);
    } else {
        return wrong_type(e, key, "an integer", v);
    }
    if (present) *present = true;
    return true;
}

static bool get_bool(json_t *o, const char *key, bool *out, struct srv_error *e) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return true;
    if (!json_is_boolean(v)) return wrong_type(e, key, "a boolean", v);
    *out = json_is_true(v);
    return true;
}

static bool in_range(struct srv_error *e, const char *param, double v, double lo, double hi) {
    if (v >= lo && v <= hi) return true;
    return bad_request(e, "invalid_value", param,
                       "Invalid value for '%s': expected a value in [%g, %g], but got %g instead.",
                       param, lo, hi, v);
}

static char *dup_bytes(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

static bool out_of_memory(struct srv_error *e) {
    srv_error_set(e, 500, "server_error", NULL, NULL, "out of memory while reading the request");
    return false;
}

static bool parse_stop(json_t *root, struct srv_params *p, struct srv_error *e) {
    json_t *v = json_object_get(root, "stop");
    if (!v || json_is_null(v)) return true;
    json_t *one = json_is_string(v) ? v : NULL;
    if (!one && !json_is_array(v))
        return wrong_type(e, "stop", "a string or an array of strings", v);
    size_t n = one ? 1 : json_array_size(v);
    if (n > SRV_MAX_STOP)
        return bad_request(e, "invalid_value", "stop",
                           "Invalid 'stop': at most %d stop sequences are allowed, got %zu.",
                           SRV_MAX_STOP, n);
    for (size_t i = 0; i < n; i++) {
        json_t *s = one ? one : json_array_get(v, i);
        char param[32];
        snprintf(param, sizeof param, one ? "stop" : "stop[%zu]", i);
        if (!json_is_string(s)) return wrong_type(e, param, "a string", s);
        size_t len = json_string_length(s);
        if (len == 0) continue; /* an empty stop sequence would stop before anything */
        if (len > SRV_MAX_STOP_BYTES)
            return bad_request(e, "invalid_value", param,
                               "Invalid '%s': a stop sequence holds at most %d bytes, got %zu.",
                               param, SRV_MAX_STOP_BYTES, len);
        char *d = dup_bytes(json_string_value(s), len);
        if (!d) return out_of_memory(e);
        p->stop[p->n_stop] = d;
        p->stop_len[p->n_stop++] = len;
    }
    return true;
}

static const char *const chat_roles[] = {"system",    "developer", "user",
                                         "assistant", "tool",      "function"};

/* Copies the messages, flattening content given as parts ([{"type": "text", ...}])
 * into one string, since chat templates expect text. */
static bool parse_messages(json_t *root, struct srv_params *p, struct srv_error *e) {
    json_t *msgs = json_object_get(root, "messages");
    if (!msgs || json_is_null(msgs))
        return bad_request(e, "missing_required_parameter", "messages",
                           "Missing required parameter: 'messages'.");
    if (!json_is_array(msgs)) return wrong_type(e, "messages", "an array", msgs);
    if (json_array_size(msgs) == 0)
        return bad_request(e, "empty_array", "messages",
                           "Invalid 'messages': empty array. Expected an array with minimum "
                           "length 1, but got an empty array instead.");
    json_t *out = json_array();
    if (!out) return out_of_memory(e);
    size_t i;
    json_t *m;
    char param[96];
    json_array_foreach(msgs, i, m) {
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (!json_is_object(m)) {
            wrong_type(e, param, "an object", m);
            goto fail;
        }
        json_t *role = json_object_get(m, "role");
        snprintf(param, sizeof param, "messages[%zu].role", i);
        if (!role) {
            bad_request(e, "missing_required_parameter", param, "Missing required parameter: '%s'.",
                        param);
            goto fail;
        }
        if (!json_is_string(role)) {
            wrong_type(e, param, "a string", role);
            goto fail;
        }
        bool known = false;
        for (size_t r = 0; r < sizeof chat_roles / sizeof chat_roles[0]; r++)
            known |= !strcmp(json_string_value(role), chat_roles[r]);
        if (!known) {
            bad_request(e, "invalid_value", param,
                        "Invalid value: '%.64s'. Supported values are: 'system', 'developer', "
                        "'user', 'assistant', 'tool' and 'function'.",
                        json_string_value(role));
            goto fail;
        }
        json_t *copy = json_copy(m);
        if (!copy || json_array_append_new(out, copy)) {
            json_decref(copy);
            out_of_memory(e);
            goto fail;
        }
        json_t *content = json_object_get(m, "content");
        snprintf(param, sizeof param, "messages[%zu].content", i);
        if (!content) {
            if (strcmp(json_string_value(role), "assistant")) {
                bad_request(e, "missing_required_parameter", param,
                            "Missing required parameter: '%s'.", param);
                goto fail;
            }
            continue;
        }
        if (json_is_string(content) || json_is_null(content)) continue;
        if (!json_is_array(content)) {
            wrong_type(e, param, "a string or an array of content parts", content);
            goto fail;
        }
        /* Concatenate the text parts. */
        size_t total = 0, k;
        json_t *part;
        json_array_foreach(content, k, part) {
            json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
            snprintf(param, sizeof param, "messages[%zu].content[%zu]", i, k);
            if (!json_is_object(part) || !json_is_string(type)) {
                bad_request(e, "invalid_value", param,
                            "Invalid '%s': expected a content part object with a 'type'.", param);
                goto fail;
            }
            if (strcmp(json_string_value(type), "text")) {
                bad_request(e, "invalid_value", param,
                            "Invalid '%s': content parts of type '%.32s' are not supported; "
                            "this model reads text only.",
                            param, json_string_value(type));
                goto fail;
            }
            if (!json_is_string(text)) {
                snprintf(param, sizeof param, "messages[%zu].content[%zu].text", i, k);
                wrong_type(e, param, "a string", text ? text : json_null());
                goto fail;
            }
            total += json_string_length(text);
        }
        char *flat = malloc(total + 1);
        if (!flat) {
            out_of_memory(e);
            goto fail;
        }
        size_t at = 0;
        json_array_foreach(content, k, part) {
            json_t *text = json_object_get(part, "text");
            memcpy(flat + at, json_string_value(text), json_string_length(text));
            at += json_string_length(text);
        }
        json_t *s = json_stringn_nocheck(flat, total);
        free(flat);
        if (!s || json_object_set_new(copy, "content", s)) {
            out_of_memory(e);
            goto fail;
        }
    }
    p->messages_json = json_dumps(out, JSON_COMPACT);
    json_decref(out);
    if (!p->messages_json) return out_of_memory(e);
    p->messages_len = strlen(p->messages_json);
    json_t *tools = json_object_get(root, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools)) return wrong_type(e, "tools", "an array", tools);
        json_t *extra = json_pack("{sO}", "tools", tools);
        p->extra_json = extra ? json_dumps(extra, JSON_COMPACT) : NULL;
        json_decref(extra);
        if (!p->extra_json) return out_of_memory(e);
    }
    return true;
fail:
    json_decref(out);
    return false;
}

static bool set_prompt_ids(struct srv_params *p, json_t *arr, const char *param,
                           struct srv_error *e) {
    size_t n = json_array_size(arr), i;
    json_t *v;
    p->prompt_ids = malloc((n ? n : 1) * sizeof *p->prompt_ids);
    if (!p->prompt_ids) return out_of_memory(e);
    json_array_foreach(arr, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return bad_request(e, "invalid_value", param,
                               "Invalid '%s': token ids must be integers >= 0.", param);
        p->prompt_ids[i] = (int32_t)json_integer_value(v);
    }
    p->n_prompt_ids = n;
    return true;
}

/* prompt: a string, [string], [ids...] or [[ids...]]; one prompt only (n = 1). */
static bool parse_prompt(json_t *root, struct srv_params *p, struct srv_error *e) {
    json_t *v = json_object_get(root, "prompt");
    if (!v || json_is_null(v))
        return bad_request(e, "missing_required_parameter", "prompt",
                           "Missing required parameter: 'prompt'.");
    if (json_is_array(v) && json_array_size(v) == 1 &&
        (json_is_string(json_array_get(v, 0)) || json_is_array(json_array_get(v, 0))))
        v = json_array_get(v, 0);
    if (json_is_string(v)) {
        p->prompt = dup_bytes(json_string_value(v), json_string_length(v));
        p->prompt_len = json_string_length(v);
        return p->prompt ? true : out_of_memory(e);
    }
    if (json_is_array(v)) {
        if (json_array_size(v) > 0 && !json_is_integer(json_array_get(v, 0)))
            return bad_request(e, "invalid_value", "prompt",
                               "Invalid 'prompt': this server completes one prompt per request "
                               "(a string, or an array of token ids).");
        return set_prompt_ids(p, v, "prompt", e);
    }
    return wrong_type(e, "prompt", "a string or an array of token ids", v);
}

bool srv_params_parse(enum srv_kind kind, const char *body, size_t len, struct srv_params *p,
                      struct srv_error *e) {
    memset(p, 0, sizeof *p);
    p->kind = kind;
    p->max_tokens = -1;
    p->logprobs = -1;
    p->sampling = (struct llmopt_sampling){
        .temperature = 1.0f,
        .top_k = 0,
        .top_p = 1.0f,
        .min_p = 0.0f,
        .repeat_penalty = 1.0f,
        .repeat_last_n = 64,
        .presence_penalty = 0.0f,
        .frequency_penalty = 0.0f,
        .seed = 0,
    };
    if (!srv_utf8_valid(body, len)) {
        bad_request(e, "invalid_encoding", NULL, "The request body is not valid UTF-8.");
        goto fail;
    }
    if (srv_json_too_deep(body, len, SRV_MAX_JSON_DEPTH)) {
        bad_request(e, "invalid_json", NULL, "The request body nests JSON deeper than %d levels.",
                    SRV_MAX_JSON_DEPTH);
        goto fail;
    }
    json_error_t jerr;
    json_t *root = json_loadb(body, len, 0, &jerr);
    if (!root) {
        bad_request(e, "invalid_json", NULL,
                    "We could not parse the JSON body of your request: %s (line %d, column %d).",
                    jerr.text, jerr.line, jerr.column);
        goto fail;
    }
    bool ok = false;
    if (!json_is_object(root)) {
        wrong_type(e, "body", "an object", root);
        goto done;
    }
    json_t *model = json_object_get(root, "model");
    if (model && !json_is_null(model)) {
        if (!json_is_string(model)) {
            wrong_type(e, "model", "a string", model);
            goto done;
        }
        if (!(p->model = dup_bytes(json_string_value(model), json_string_length(model)))) {
            out_of_memory(e);
            goto done;
        }
    }
    if (kind == SRV_KIND_CHAT ? !parse_messages(root, p, e) : !parse_prompt(root, p, e)) goto done;

    int64_t iv;
    double dv;
    bool present;
    if (!get_int(root, "n", &iv, &present, e)) goto done;
    if (present && iv != 1) {
        bad_request(e, "invalid_value", "n",
                    "Invalid value for 'n': this server generates one choice per request "
                    "(n = 1), got %lld.",
                    (long long)iv);
        goto done;
    }
    if (!get_int(root, "best_of", &iv, &present, e)) goto done;
    if (present && iv != 1) {
        bad_request(e, "invalid_value", "best_of",
                    "Invalid value for 'best_of': only 1 is supported.");
        goto done;
    }
    if (!get_bool(root, "echo", &p->echo, e)) goto done;
    if (p->echo && kind == SRV_KIND_CHAT) {
        bad_request(e, "invalid_value", "echo",
                    "Invalid value for 'echo': echo is a parameter of /v1/completions only.");
        goto done;
    }
    json_t *suffix = json_object_get(root, "suffix");
    if (suffix && !json_is_null(suffix) &&
        !(json_is_string(suffix) && json_string_length(suffix) == 0)) {
        bad_request(e, "invalid_value", "suffix",
                    "Invalid value for 'suffix': suffix is not supported.");
        goto done;
    }

    /* max_completion_tokens (chat) wins over the older max_tokens. */
    const char *max_keys[2] = {"max_tokens",
                               kind == SRV_KIND_CHAT ? "max_completion_tokens" : NULL};
    for (int k = 0; k < 2 && max_keys[k]; k++) {
        if (!get_int(root, max_keys[k], &iv, &present, e)) goto done;
        if (!present) continue;
        if (iv < 1) {
            bad_request(e, "integer_below_min_value", max_keys[k],
                        "Invalid '%s': integer below minimum value. Expected a value >= 1, but "
                        "got %lld instead.",
                        max_keys[k], (long long)iv);
            goto done;
        }
        p->max_tokens = iv > INT32_MAX ? INT32_MAX : iv;
    }

    struct llmopt_sampling *s = &p->sampling;
    if (!get_number(root, "temperature", &dv, &present, e)) goto done;
    if (present) {
        if (!in_range(e, "temperature", dv, 0.0, 100.0)) goto done;
        s->temperature = (float)dv;
    }
    if (!get_int(root, "top_k", &iv, &present, e)) goto done;
    if (present) {
        if (!in_range(e, "top_k", (double)iv, -1.0, (double)INT32_MAX)) goto done;
        s->top_k = iv > 0 ? (int32_t)iv : 0;
    }
    if (!get_number(root, "top_p", &dv, &present, e)) goto done;
    if (present) {
        if (!in_range(e, "top_p", dv, 0.0, 1.0)) goto done;
        if (dv == 0.0)
            s->top_k = 1; /* the smallest set: the best token alone */
        else
            s->top_p = (float)dv;
    }
    if (!get_number(root, "min_p", &dv, &present, e)) goto done;
    if (present) {
        if (!in_range(e, "min_p", dv, 0.0, 1.0)) goto done;
        s->min_p = (float)dv;
    }
    if (!get_number(root, "presence_penalty", &dv, &present, e)) goto done;
    if (present) {
        if (!in_range(e, "presence_penalty", dv, -2.0, 2.0)) goto done;
        s->presence_penalty = (float)dv;
    }
    if (!get_number(root, "frequency_penalty", &dv, &present, e)) goto done;
    if (present) {
        if (!in_range(e, "frequency_penalty", dv, -2.0, 2.0)) goto done;
        s->frequency_penalty = (float)dv;
    }
    if (!get_number(root, "repetition_penalty", &dv, &present, e)) goto done;
    if (present) {
        if (!(dv > 0.0 && dv <= 100.0)) {
            bad_request(e, "invalid_value", "repetition_penalty",
                        "Invalid value for 'repetition_penalty': expected a number in (0, 100], "
                        "but got %g instead.",
                        dv);
            goto done;
        }
        s->repeat_penalty = (float)dv;
    }
    if (!get_int(root, "seed", &iv, &p->seed_given, e)) goto done;
    if (p->seed_given) s->seed = (uint64_t)iv;

    if (!parse_stop(root, p, e)) goto done;

    if (!get_bool(root, "stream", &p->stream, e)) goto done;
    json_t *so = json_object_get(root, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) {
            wrong_type(e, "stream_options", "an object", so);
            goto done;
        }
        if (!p->stream) {
            bad_request(e, "invalid_value", "stream_options",
                        "The 'stream_options' parameter is only allowed when 'stream' is enabled.");
            goto done;
        }
        json_t *iu = json_object_get(so, "include_usage");
        if (iu && !json_is_null(iu) && !json_is_boolean(iu)) {
            wrong_type(e, "stream_options.include_usage", "a boolean", iu);
            goto done;
        }
        p->include_usage = iu && json_is_true(iu);
    }

    if (kind == SRV_KIND_CHAT) {
        bool want = false;
        if (!get_bool(root, "logprobs", &want, e)) goto done;
        if (!get_int(root, "top_logprobs", &iv, &present, e)) goto done;
        if (present) {
            if (!want) {
                bad_request(e, "invalid_value", "top_logprobs",
                            "Invalid value for 'top_logprobs': 'logprobs' must be set to true "
                            "when 'top_logprobs' is used.");
                goto done;
            }
            if (!in_range(e, "top_logprobs", (double)iv, 0, SRV_MAX_TOP_LOGPROBS)) goto done;
        }
        p->logprobs = want ? (present ? (int32_t)iv : 0) : -1;
    } else {
        json_t *lp = json_object_get(root, "logprobs");
        if (json_is_boolean(lp)) { /* some clients send a boolean here */
            p->logprobs = json_is_true(lp) ? 0 : -1;
        } else {
            if (!get_int(root, "logprobs", &iv, &present, e)) goto done;
            if (present) {
                if (!in_range(e, "logprobs", (double)iv, 0, 5)) goto done;
                p->logprobs = (int32_t)iv;
            }
        }
        /* The prompt's own logprobs would need logits for every prompt row. */
        if (p->echo && p->logprobs >= 0) {
            bad_request(e, "invalid_value", "echo",
                        "Invalid value for 'echo': echo together with logprobs is not supported.");
            goto done;
        }
    }
    ok = true;
done:
    json_decref(root);
    if (ok) return true;
fail:
    srv_params_free(p);
    p->kind = kind;
    return false;
}

void srv_params_free(struct srv_params *p) {
    free(p->model);
    free(p->messages_json);
    free(p->extra_json);
    free(p->prompt);
    free(p->prompt_ids);
    for (int32_t i = 0; i < p->n_stop; i++) free(p->stop[i]);
    memset(p, 0, sizeof *p);
}
