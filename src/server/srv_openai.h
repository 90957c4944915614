/* The JSON shapes of OpenAI's API that the server answers with: error objects,
 * usage, logprobs (chat and legacy completions), finish reasons and ids. */
#ifndef LLMOPT_SERVER_SRV_OPENAI_H
#define LLMOPT_SERVER_SRV_OPENAI_H

#include "llmopt.h"
#include "server/srv_request.h"
#include "server/srv_sched.h"

#include <jansson.h>

/* {"error": {"message", "type", "param", "code"}} as compact JSON; free() it. */
char *srv_error_body(const struct srv_error *e, size_t *len);
json_t *srv_usage_json(int32_t prompt_tokens, int32_t cached_tokens, int32_t completion_tokens);
const char *srv_finish_name(enum srv_finish f); /* "stop", "length"; NULL otherwise */
/* "chatcmpl-…" / "cmpl-…": the prefix and 29 random letters and digits. */
void srv_make_id(char *buf, size_t cap, const char *prefix);

/* Chat: one entry of logprobs.content, {"token", "logprob", "bytes", "top_logprobs"}. */
json_t *srv_chat_logprob(const struct llmopt_model *m, const struct srv_event *ev);
/* Completions: {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
 * and one token appended to it (n_top: alternatives asked for; 0 gives null entries). */
json_t *srv_completion_logprobs_new(void);
void srv_completion_logprobs_add(const struct llmopt_model *m, json_t *lp,
                                 const struct srv_event *ev, int32_t n_top, size_t text_offset);

#endif
