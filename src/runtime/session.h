/* Internal accessors of struct llmopt_session for the rest of the runtime. */
#ifndef LLMOPT_RUNTIME_SESSION_H
#define LLMOPT_RUNTIME_SESSION_H

#include "llmopt.h"

int32_t session_n_ctx(const struct llmopt_session *s);
const struct llmopt_model *session_model(const struct llmopt_session *s);

#endif
