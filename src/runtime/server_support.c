/* Server support: small accessors the HTTP server needs (see the "Server support"
 * section of include/llmopt.h). */
#include "runtime/model.h"
#include "runtime/session.h"

size_t llmopt_token_piece(const struct llmopt_model *m, int32_t id, char *buf, size_t cap) {
    return m->vocab ? tok_piece(m->vocab, id, buf, cap) : 0;
}

const char *llmopt_token_text(const struct llmopt_model *m, int32_t id, size_t *len) {
    *len = 0;
    return m->vocab ? tok_token_text(m->vocab, id, len) : NULL;
}

int32_t llmopt_session_n_ctx(const struct llmopt_session *s) {
    return session_n_ctx(s);
}
