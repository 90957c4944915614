/* Fuzz entry point for the server's request parser: the input bytes are parsed as a
 * chat request and as a completions request (srv_params_parse, no model or socket),
 * and an error, when there is one, is rendered as OpenAI's error body. Whatever the
 * bytes, parsing must not crash or leak, and must either succeed with a valid
 * result or fail with a 4xx/5xx status and a message. */
#include "server/srv_openai.h"
#include "server/srv_request.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    for (int kind = 0; kind < SRV_KIND_COUNT; kind++) {
        struct srv_params p;
        struct srv_error e;
        if (srv_params_parse((enum srv_kind)kind, (const char *)data, size, &p, &e)) {
            if (kind == SRV_KIND_CHAT &&
                (!p.messages_json || p.messages_len != strlen(p.messages_json)))
                abort();
            if (kind == SRV_KIND_COMPLETION && !p.prompt && !p.prompt_ids && p.n_prompt_ids)
                abort();
            if (p.n_stop < 0 || p.n_stop > SRV_MAX_STOP || p.logprobs > SRV_MAX_TOP_LOGPROBS)
                abort();
            for (int32_t i = 0; i < p.n_stop; i++)
                if (!p.stop_len[i] || p.stop_len[i] > SRV_MAX_STOP_BYTES) abort();
        } else {
            if (e.status < 400 || e.status > 599 || !e.message[0]) abort();
            size_t len = 0;
            char *body = srv_error_body(&e, &len);
            if (!body || !len) abort();
            free(body);
        }
        srv_params_free(&p);
    }
    return 0;
}
