/* Token sampler: turns one row of logits into the next token id.
 *
 * Chain, in order (llama.cpp's default order, with temperature ahead of top-p):
 *   penalties (repeat, presence, frequency; applied to `logits` in place)
 *   temperature <= 0: argmax, lowest id on ties; done
 *   top-k -> softmax(logits / temperature) -> top-p -> min-p -> renormalize -> draw
 *
 * Logits: NaN counts as -inf (never chosen), +inf as the largest finite float. A token
 * whose logit is -inf is never drawn.
 *
 * Determinism: the PRNG is the sampler's own (xoshiro256** seeded through splitmix64),
 * so a seed gives the same draws everywhere; the probabilities go through the C
 * library's expf, which may differ by an ulp between libms, so a draw sitting exactly
 * on a boundary may resolve differently on another platform.
 *
 * One sampler per sequence; a sampler is not safe to share between threads. */
#ifndef LLMOPT_RUNTIME_SAMPLER_H
#define LLMOPT_RUNTIME_SAMPLER_H

#include "llmopt.h"

#include <stddef.h>
#include <stdint.h>

struct sampler_params {
    float temperature;      /* <= 0: greedy (argmax, lowest id on ties); finite */
    int32_t top_k;          /* <= 0 or >= n_vocab: off */
    float top_p;            /* (0, 1]; 1: off. Keeps the smallest best-first set whose
                             * probability reaches top_p, at least one token */
    float min_p;            /* [0, 1]; 0: off. Keeps tokens with p >= min_p * p_max */
    float repeat_penalty;   /* > 0; 1: off. For each distinct id in the window:
                             * logit > 0 ? logit / penalty : logit * penalty */
    int32_t repeat_last_n;  /* window: the last n history ids; 0: penalties off;
                             * -1: the whole history */
    float presence_penalty; /* 0: off. logit -= presence (once per id in the window) */
    float frequency_penalty; /* 0: off. logit -= frequency * count in the window */
    uint64_t seed;
};

/* temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, repeat_penalty 1 (off),
 * repeat_last_n 64, presence/frequency 0, seed 0. */
void sampler_params_default(struct sampler_params *p);

/* LLMOPT_ERR_INVALID_ARG, with the field's name and value in the message, for a
 * non-finite temperature, top_p outside (0, 1], min_p outside [0, 1], a repeat_penalty
 * that is not finite and > 0, repeat_last_n < -1, or a non-finite presence or
 * frequency penalty. NaN is rejected everywhere. */
enum llmopt_status sampler_params_validate(const struct sampler_params *p,
                                           struct llmopt_err *err);

struct sampler;

/* Validates p, then allocates every scratch buffer sampler_sample will need
 * (O(n_vocab) memory). n_vocab must be > 0. */
enum llmopt_status sampler_create(const struct sampler_params *p, int32_t n_vocab,
                                  struct sampler **out, struct llmopt_err *err);
void sampler_free(struct sampler *s);

/* Restarts the PRNG from seed: the draws that follow repeat those of a fresh sampler
 * created with that seed. */
void sampler_reset(struct sampler *s, uint64_t seed);

/* Picks the next token from logits (n_vocab), applying the penalties to logits in
 * place (nothing else is written). history (n_history): ids seen so far, prompt then
 * generated; only the last repeat_last_n feed the penalties, and ids outside
 * [0, n_vocab) are ignored. history may be NULL when n_history is 0.
 *
 * prob_out (optional): the chosen token's probability in the distribution it was drawn
 * from (after all filtering, renormalized). In greedy mode there is no filtering: it is
 * the token's softmax probability over the penalized logits at temperature 1.
 *
 * When every logit is -inf or NaN nothing can be drawn: returns 0 with probability 0.
 * Allocates nothing: all scratch comes from sampler_create. */
int32_t sampler_sample(struct sampler *s, float *logits, const int32_t *history,
                       size_t n_history, float *prob_out);

#endif
