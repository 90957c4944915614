/* Generation loop: prefill the prompt, then sample and decode one token per step. All
 * buffers are allocated before the first decode step. */
#include "base/clock.h"
#include "runtime/model.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

void llmopt_sampling_default(struct llmopt_sampling *p) {
    struct sampler_params sp;
    sampler_params_default(&sp);
    *p = (struct llmopt_sampling){sp.temperature,    sp.top_k,          sp.top_p,
                                  sp.min_p,          sp.repeat_penalty, sp.repeat_last_n,
                                  sp.presence_penalty, sp.frequency_penalty, sp.seed};
}

static struct sampler_params sampler_params_of(const struct llmopt_sampling *p) {
    return (struct sampler_params){p->temperature,      p->top_k,          p->top_p,
                                   p->min_p,            p->repeat_penalty, p->repeat_last_n,
                                   p->presence_penalty, p->frequency_penalty, p->seed};
}

/* The public sampler is the runtime's sampler under another name. */
enum llmopt_status llmopt_sampler_create(const struct llmopt_sampling *p, int32_t n_vocab,
                                         struct llmopt_sampler **out, struct llmopt_err *err) {
    struct sampler_params sp = sampler_params_of(p);
    return sampler_create(&sp, n_vocab, (struct sampler **)out, err);
}

int32_t llmopt_sampler_sample(struct llmopt_sampler *s, float *logits, const int32_t *history,
                              size_t n_history, float *prob_out) {
    return sampler_sample((struct sampler *)s, logits, history, n_history, prob_out);
}

void llmopt_sampler_free(struct llmopt_sampler *s) { sampler_free((struct sampler *)s); }

enum llmopt_status llmopt_generate(struct llmopt_session *s, int32_t slot, const int32_t *prompt,
                                   int32_t n_prompt, int32_t max_new,
                                   const struct llmopt_sampling *sampling, llmopt_token_cb cb,
                                   void *user, struct llmopt_generate_result *result,
                                   struct llmopt_err *err) {
    const struct llmopt_model *m = session_model(s);
    memset(result, 0, sizeof *result);
    if (n_prompt < 1)
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "generate: the prompt has no tokens (not even BOS)");
    if (max_new < 0) return err_set(err, LLMOPT_ERR_INVALID_ARG, "generate: max_new %d < 0", max_new);
    int32_t n_ctx = session_n_ctx(s);
    if (n_prompt > n_ctx)
        return err_set(err, LLMOPT_ERR_LIMIT, "generate: prompt of %d tokens exceeds the context of %d",
                       n_prompt, n_ctx);
    if (max_new > n_ctx - n_prompt) max_new = n_ctx - n_prompt;
    struct sampler_params sp = sampler_params_of(sampling);
    struct sampler *smp = NULL;
    enum llmopt_status st = sampler_create(&sp, m->n_vocab, &smp, err);
    if (st) return st;
    int32_t *history = malloc(((size_t)n_prompt + (size_t)max_new + 1) * sizeof *history);
    if (!history) {
        st = err_set(err, LLMOPT_ERR_NOMEM, "generate: out of memory");
        goto done;
    }
    memcpy(history, prompt, (size_t)n_prompt * sizeof *history);
    int32_t n_hist = n_prompt;
    llmopt_session_reset(s, slot);
    /* the session samples where the logits are: on the device, a greedy pick or the
     * best top-k candidates come back instead of the logits */
    struct llmopt_sampler *ls = (struct llmopt_sampler *)smp;
    double t0 = clock_now_s();
    int32_t id = 0;
    st = llmopt_session_append_sample(s, slot, prompt, n_prompt, ls, history, (size_t)n_hist, &id, err);
    if (st) goto done;
    result->n_prompt = n_prompt;
    double t1 = clock_now_s();
    result->prefill_seconds = t1 - t0;
    for (int32_t i = 0; i < max_new; i++) {
        if (llmopt_token_is_eog(m, id)) {
            result->stopped_eog = true;
            break;
        }
        history[n_hist++] = id;
        result->n_generated++;
        if (cb && !cb(user, id)) break;
        if (i + 1 == max_new) break; /* the last token needs no forward */
        st = llmopt_session_append_sample(s, slot, &history[n_hist - 1], 1, ls, history, (size_t)n_hist, &id, err);
        if (st) goto done;
    }
    result->decode_seconds = clock_now_s() - t1;
done:
    free(history);
    sampler_free(smp);
    return st;
}
