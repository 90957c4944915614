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
 * and the probabilities come from sample_exp (runtime/sample_exp.h: operations every
 * IEEE machine rounds alike, not the C library's expf), so a seed gives the same draws
 * from the same logits everywhere, a CUDA device included.
 *
 * One sampler per sequence; a sampler is not safe to share between threads. */
#ifndef LLMOPT_RUNTIME_SAMPLER_H
#define LLMOPT_RUNTIME_SAMPLER_H

#include "llmopt.h"

#include <stdbool.h>
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

/* The parameters s was made with (seed: the last sampler_reset's). */
const struct sampler_params *sampler_get_params(const struct sampler *s);

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

/* sampler_sample on logits that already carry the penalties (a device backend applied
 * them): the same id, probability and PRNG state as sampler_sample on the raw row. */
int32_t sampler_sample_penalized(struct sampler *s, float *logits, float *prob_out);

/* ---- sampling from candidates picked elsewhere (a device backend) ----
 *
 * A backend that holds the logits can apply the penalties and pick the best k
 * candidates itself; the draw then runs here on those alone, with the bits of
 * sampler_sample on the whole row: with top-k on, sampler_sample draws from the best k
 * alone, and greedy picks the best. */

#define SAMPLER_RANKED_MAX 256

/* How many of the best candidates (after the penalties) sampler_sample_ranked needs:
 * 1 for greedy, top_k where 1 <= top_k <= SAMPLER_RANKED_MAX and top_k < n_vocab,
 * else 0 (the whole row: top-k off or larger). */
int32_t sampler_device_k(const struct sampler *s);

/* logit with the penalties of an id seen count times in the window: the repeat penalty
 * (logit > 0 ? logit / repeat : logit * repeat, unless repeat is 1), then minus
 * presence + count * frequency. sampler_sample applies exactly this. */
float sampler_penalize(const struct sampler_params *p, float logit, int32_t count);

/* The penalties sampler_sample would apply for this history, as (id, count) pairs: the
 * window's distinct ids in the order of their first appearance, each with its count.
 * Returns the number of pairs (0 when the penalties are off), or -1 when there are
 * more than cap. */
int32_t sampler_penalty_list(struct sampler *s, const int32_t *history, size_t n_history,
                             int32_t *ids, int32_t *counts, int32_t cap);

/* Whether s draws from the whole row (temperature > 0, top-k off or at least n_vocab,
 * top-p off): then its probabilities (sample_exp((logit - max) / temperature), kept
 * where > 0 and >= min_p) are summed and walked in id order in the blocks of
 * sample_exp.h, which a device can reproduce with the next uniform
 * (sampler_peek_uniform) and hand back the id; sampler_take_uniform then advances the
 * PRNG as sampler_sample would have (it draws unless no logit is finite). */
bool sampler_device_full(const struct sampler *s);
double sampler_peek_uniform(const struct sampler *s);
void sampler_take_uniform(struct sampler *s);

/* Draws from the n best candidates of the penalized row, best first (the rank order:
 * higher logit, then lower id; NaN as -inf, +inf as FLT_MAX), n >= sampler_device_k(s)
 * unless the row has fewer finite logits: entries after the first -inf logit or id
 * outside [0, n_vocab) are not candidates. Returns the id sampler_sample would return
 * for that row and the same PRNG state (0 when there is no candidate).
 * sampler_device_k(s) must be > 0. */
int32_t sampler_sample_ranked(struct sampler *s, const int32_t *ids, const float *logits, int32_t n);

/* Top-p without top-k (temperature > 0, top-k off or at least n_vocab, top_p < 1).
 * sampler_sample's top-p takes the smallest best-first set of the candidates kept by
 * min-p whose probabilities, summed best first, reach top_p * z, z being every finite
 * candidate's probability summed in sample_exp.h's draw blocks (before min-p), and
 * draws from it best first; when the candidates do not reach that, top-p removes
 * nothing and the draw is the whole-row one (id order, in blocks). It ranks only the
 * best SAMPLER_RANKED_MAX unless the set is larger. True for such a sampler unless
 * its candidates were not enough within its last 32 draws (a flat distribution: the
 * whole row is then asked for directly). */
bool sampler_device_nucleus(const struct sampler *s);

/* sampler_sample from the n best candidates (ranked as for sampler_sample_ranked, n <=
 * SAMPLER_RANKED_MAX: fewer finite logits end the list early) and z computed by the
 * device: returns sampler_sample's id with its PRNG state, or -1, having drawn nothing,
 * when that needs more candidates than these (the set is larger, or min-p may keep
 * later ones): then sample the whole penalized row (sampler_sample_penalized). The
 * sampler's parameters must be top-p's as sampler_device_nucleus says. */
int32_t sampler_sample_nucleus(struct sampler *s, const int32_t *ids, const float *logits, int32_t n, double z);

#endif
