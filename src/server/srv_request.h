/* OpenAI request bodies -> generation parameters, and OpenAI-style errors.
 *
 * srv_params_parse is a pure function of the body bytes (no model, no socket), so the
 * fuzzer (tests/fuzz/fuzz_server_request.c) can drive it directly. Checks that need
 * the model (model name, template, token counts) happen later, in srv_api.c. */
#ifndef LLMOPT_SERVER_SRV_REQUEST_H
#define LLMOPT_SERVER_SRV_REQUEST_H

#include "llmopt.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SRV_MAX_STOP         16  /* stop sequences per request */
#define SRV_MAX_STOP_BYTES   256 /* bytes in one stop sequence */
#define SRV_MAX_TOP_LOGPROBS 20  /* chat top_logprobs; completions allow 0..5 */
#define SRV_MAX_JSON_DEPTH   64  /* nesting checked before jansson recurses */

enum srv_kind {
    SRV_KIND_CHAT,       /* POST /v1/chat/completions */
    SRV_KIND_COMPLETION, /* POST /v1/completions */
    SRV_KIND_COUNT
};

/* An error as OpenAI reports it: {"error": {"message", "type", "param", "code"}}. */
struct srv_error {
    int status;       /* HTTP status */
    const char *type; /* "invalid_request_error", "authentication_error", "server_error", ... */
    const char *code; /* NULL or a short machine-readable code */
    char param[64];   /* the offending parameter; "" when none */
    char message[512];
};

void srv_error_set(struct srv_error *e, int status, const char *type, const char *code,
                   const char *param, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

struct srv_params {
    enum srv_kind kind;
    char *model; /* NULL when absent */
    /* chat: the messages array as JSON, every content flattened to a string */
    char *messages_json;
    size_t messages_len;
    char *extra_json; /* chat: NULL or {"tools": [...]} for the template */
    /* completions: the prompt as text, or as token ids (then prompt is NULL) */
    char *prompt;
    size_t prompt_len;
    int32_t *prompt_ids;
    size_t n_prompt_ids;
    bool stream, include_usage;
    int64_t max_tokens; /* -1: until end of text or a full context */
    struct llmopt_sampling sampling;
    bool seed_given;
    int32_t n_stop;
    char *stop[SRV_MAX_STOP]; /* each NUL-terminated, non-empty, valid UTF-8 */
    size_t stop_len[SRV_MAX_STOP];
    int32_t logprobs; /* -1: none; else the top alternatives per token */
    bool echo;        /* completions: the reply's text starts with the prompt */
};

/* Parses and validates a request body. On failure fills e (status 400 with the
 * parameter named) and leaves p empty; p must be released with srv_params_free
 * either way. */
bool srv_params_parse(enum srv_kind kind, const char *body, size_t len, struct srv_params *p,
                      struct srv_error *e);
void srv_params_free(struct srv_params *p);

/* Strict UTF-8 (no overlongs, surrogates or code points above U+10FFFF). */
bool srv_utf8_valid(const char *s, size_t n);
/* Whether JSON text nests objects/arrays deeper than max_depth (strings skipped). */
bool srv_json_too_deep(const char *s, size_t n, int max_depth);

#endif
