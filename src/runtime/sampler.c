#include "runtime/sampler.h"
#include "runtime/sample_exp.h"

#include "base/status.h"

#include <float.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

/* A token still in the running. */
struct sampler_cand {
    int32_t id;
    float logit; /* penalized, NaN -> -inf, +inf -> FLT_MAX */
    float p;     /* exp((logit - max_logit) / temperature): unnormalized, best = 1 */
};

struct sampler {
    struct sampler_params params;
    int32_t n_vocab;
    uint64_t rng[4];             /* xoshiro256** state */
    struct sampler_cand *cand;   /* (n_vocab) scratch for the filter chain */
    struct sampler_cand *ranked; /* (SAMPLER_RANKED_MAX) top-p's best candidates, best first */
    int32_t nucleus_wait;        /* draws from whole rows before sampler_device_nucleus says yes
                                  * again: set when the candidates were not enough */
    int32_t *window_count;       /* (n_vocab) occurrences in the penalty window; all
                                  * zero between calls */
};

/* ---- PRNG: xoshiro256** (Blackman & Vigna), state filled by splitmix64 ---- */

static uint64_t splitmix64_next(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(uint64_t s[4]) {
    uint64_t out = rotl64(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return out;
}

/* Uniform in [0, 1) with 53 random bits. A 24-bit float draw would give tokens with
 * p < 2^-24 (common in a 150k vocab) a visibly wrong share. */
static double rng_uniform(uint64_t s[4]) {
    return (double)(rng_next(s) >> 11) * 0x1.0p-53;
}

/* ---- params ---- */

void sampler_params_default(struct sampler_params *p) {
    *p = (struct sampler_params){
        .temperature = 0.8f,
        .top_k = 40,
        .top_p = 0.95f,
        .min_p = 0.05f,
        .repeat_penalty = 1.0f,
        .repeat_last_n = 64,
        .presence_penalty = 0.0f,
        .frequency_penalty = 0.0f,
        .seed = 0,
    };
}

enum llmopt_status sampler_params_validate(const struct sampler_params *p,
                                           struct llmopt_err *err) {
    if (!p) return err_set(err, LLMOPT_ERR_INVALID_ARG, "sampler: params is NULL");
    if (!isfinite(p->temperature))
        return err_set(err, LLMOPT_ERR_INVALID_ARG,
                       "sampler: temperature must be finite (<= 0 selects greedy), got %g",
                       (double)p->temperature);
    /* Written as !(in range) so that NaN fails too. */
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return err_set(err, LLMOPT_ERR_INVALID_ARG,
                       "sampler: top_p must be in (0, 1] (1 turns it off), got %g",
                       (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return err_set(err, LLMOPT_ERR_INVALID_ARG,
                       "sampler: min_p must be in [0, 1] (0 turns it off), got %g",
                       (double)p->min_p);
    if (!(p->repeat_penalty > 0.0f && isfinite(p->repeat_penalty)))
        return err_set(err, LLMOPT_ERR_INVALID_ARG,
                       "sampler: repeat_penalty must be finite and > 0 (1 turns it off), "
                       "got %g",
                       (double)p->repeat_penalty);
    if (p->repeat_last_n < -1)
        return err_set(err, LLMOPT_ERR_INVALID_ARG,
                       "sampler: repeat_last_n must be >= -1 (-1: whole history, "
                       "0: penalties off), got %d",
                       (int)p->repeat_last_n);
    if (!isfinite(p->presence_penalty))
        return err_set(err, LLMOPT_ERR_INVALID_ARG,
                       "sampler: presence_penalty must be finite, got %g",
                       (double)p->presence_penalty);
    if (!isfinite(p->frequency_penalty))
        return err_set(err, LLMOPT_ERR_INVALID_ARG,
                       "sampler: frequency_penalty must be finite, got %g",
                       (double)p->frequency_penalty);
    return LLMOPT_OK;
}

/* ---- lifetime ---- */

enum llmopt_status sampler_create(const struct sampler_params *p, int32_t n_vocab,
                                  struct sampler **out, struct llmopt_err *err) {
    if (!out) return err_set(err, LLMOPT_ERR_INVALID_ARG, "sampler: out is NULL");
    *out = NULL;
    enum llmopt_status st = sampler_params_validate(p, err);
    if (st != LLMOPT_OK) return st;
    if (n_vocab <= 0)
        return err_set(err, LLMOPT_ERR_INVALID_ARG,
                       "sampler: n_vocab must be > 0, got %d", (int)n_vocab);

    struct sampler *s = calloc(1, sizeof *s);
    if (!s) goto fail_struct;
    s->params = *p;
    s->n_vocab = n_vocab;
    s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
    s->ranked = malloc(SAMPLER_RANKED_MAX * sizeof *s->ranked);
    s->window_count = calloc((size_t)n_vocab, sizeof *s->window_count);
    if (!s->cand || !s->ranked || !s->window_count) goto fail_alloc;
    sampler_reset(s, p->seed);
    *out = s;
    return LLMOPT_OK;

fail_alloc:
    free(s->window_count);
    free(s->ranked);
    free(s->cand);
    free(s);
fail_struct:
    return err_set(err, LLMOPT_ERR_NOMEM,
                   "sampler: out of memory allocating scratch for n_vocab %d",
                   (int)n_vocab);
}

void sampler_free(struct sampler *s) {
    if (!s) return;
    free(s->window_count);
    free(s->ranked);
    free(s->cand);
    free(s);
}

const struct sampler_params *sampler_get_params(const struct sampler *s) { return &s->params; }

void sampler_reset(struct sampler *s, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64_next(&x);
    s->params.seed = seed;
}

/* ---- penalties ---- */

float sampler_penalize(const struct sampler_params *p, float logit, int32_t count) {
    if (p->repeat_penalty != 1.0f)
        logit = logit > 0.0f ? logit / p->repeat_penalty : logit * p->repeat_penalty;
    return logit - (p->presence_penalty + (float)count * p->frequency_penalty);
}

/* Visits the distinct ids of the penalty window in the order of their first appearance,
 * with their counts: penalizes logits[id] in place (logits set) and/or records the pair
 * (ids/counts set, at most cap of them). Returns the number of distinct ids, or -1 when
 * there were more than cap to record. Counts, then visits the window again: the first
 * visit of an id takes it and zeroes its count, which both skips its repeats and
 * leaves window_count all zero for the next call, at O(window) cost instead of
 * O(n_vocab). */
static int32_t penalty_visit(struct sampler *s, const int32_t *history, size_t n_history, float *logits,
                             int32_t *ids, int32_t *counts, int32_t cap) {
    const struct sampler_params *p = &s->params;
    if (p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f &&
        p->frequency_penalty == 0.0f)
        return 0;
    if (p->repeat_last_n == 0 || n_history == 0) return 0;
    size_t window = n_history;
    if (p->repeat_last_n > 0 && (size_t)p->repeat_last_n < n_history)
        window = (size_t)p->repeat_last_n;
    const int32_t *recent = history + (n_history - window);

    for (size_t i = 0; i < window; i++) {
        int32_t id = recent[i];
        if (id >= 0 && id < s->n_vocab && s->window_count[id] < INT32_MAX)
            s->window_count[id]++;
    }
    int32_t n = 0;
    for (size_t i = 0; i < window; i++) {
        int32_t id = recent[i];
        if (id < 0 || id >= s->n_vocab || s->window_count[id] == 0) continue;
        int32_t count = s->window_count[id];
        s->window_count[id] = 0;
        if (logits) logits[id] = sampler_penalize(p, logits[id], count);
        if (n < 0) continue; /* over cap: only zeroing counts */
        if (ids && n == cap) {
            n = -1;
            continue;
        }
        if (ids) {
            ids[n] = id;
            counts[n] = count;
        }
        n++;
    }
    return n;
}

int32_t sampler_penalty_list(struct sampler *s, const int32_t *history, size_t n_history,
                             int32_t *ids, int32_t *counts, int32_t cap) {
    LLMOPT_ASSERT(s && ids && counts && cap >= 0 && (history || n_history == 0));
    return penalty_visit(s, history, n_history, NULL, ids, counts, cap);
}

/* ---- ranking and heaps over candidates ---- */

static inline float logit_sanitize(float l) {
    if (isnan(l)) return -INFINITY;
    if (l == INFINITY) return FLT_MAX;
    return l;
}

/* Rank order: the higher logit first; equal logits put the lower id first, the same
 * tie rule as greedy, so top_k = 1 is exactly greedy. */
static inline bool cand_ranks_above(const struct sampler_cand *a,
                                    const struct sampler_cand *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

/* Binary heap over h[0, n). best_on_top: the best-ranked candidate sits at the root
 * (popped in rank order for top-p); otherwise the worst does (a bounded top-k
 * selection evicts it when something better arrives). */
static inline bool heap_above(const struct sampler_cand *a, const struct sampler_cand *b,
                              bool best_on_top) {
    return best_on_top ? cand_ranks_above(a, b) : cand_ranks_above(b, a);
}

static void heap_sift_down(struct sampler_cand *h, size_t n, size_t i, bool best_on_top) {
    struct sampler_cand x = h[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && heap_above(&h[c + 1], &h[c], best_on_top)) c++;
        if (!heap_above(&h[c], &x, best_on_top)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
}

static void heap_sift_up(struct sampler_cand *h, size_t i, bool best_on_top) {
    struct sampler_cand x = h[i];
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!heap_above(&x, &h[parent], best_on_top)) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = x;
}

/* Moves the root to h[n - 1] and restores the heap on h[0, n - 1). */
static void heap_pop(struct sampler_cand *h, size_t n, bool best_on_top) {
    struct sampler_cand root = h[0];
    h[0] = h[n - 1];
    h[n - 1] = root;
    heap_sift_down(h, n - 1, 0, best_on_top);
}

/* Top-p over many candidates (top_p_large): they are binned by log-probability, bin
 * width 1/8 nat; the last bin takes everything below e^-31.9. */
#define TOP_P_BINS 256
#define TOP_P_BINS_PER_NAT 8

static inline size_t top_p_bin(float logit, float max_logit, float temperature) {
    float neg_log_p = (max_logit - logit) / temperature; /* >= 0, may be +inf */
    const float last = (float)(TOP_P_BINS - 1) / TOP_P_BINS_PER_NAT;
    return neg_log_p < last ? (size_t)(neg_log_p * TOP_P_BINS_PER_NAT) : TOP_P_BINS - 1;
}

/* ---- sampling ---- */

/* The greedy pick: the lowest id among the highest sanitized logits (NaN never wins,
 * +inf counts as FLT_MAX), 0 when every logit is NaN or -inf. Two passes instead of
 * one running (max, id) pair, whose compare-and-branch chain cost ~0.86 us on a
 * 512-token row (the server samples one per stream per step): the maximum over 8
 * lanes, then the first id that holds it: 0.13 us with SSE2, 0.57 us in the scalar C
 * below (best of 5, 200k rows, thread CPU time).
 * test_sampler checks it against the one-pass definition on random rows with NaN,
 * infinities and ties. */
static int32_t greedy_argmax(const float *logits, int32_t n, float *best_out) {
    int32_t i = 0;
    float best = -INFINITY;
#if defined(__SSE2__)
    /* max_ps(a, b) is a > b ? a : b and min_ps(a, b) a < b ? a : b, lane by lane: a NaN
     * l stays NaN through min_ps(FLT_MAX, l) and then loses to the lane's maximum. */
    const __m128 cap = _mm_set1_ps(FLT_MAX);
    __m128 m0 = _mm_set1_ps(-INFINITY), m1 = m0;
    for (; i + 8 <= n; i += 8) {
        m0 = _mm_max_ps(_mm_min_ps(cap, _mm_loadu_ps(logits + i)), m0);
        m1 = _mm_max_ps(_mm_min_ps(cap, _mm_loadu_ps(logits + i + 4)), m1);
    }
    float lane[4];
    _mm_storeu_ps(lane, _mm_max_ps(m0, m1));
    for (int k = 0; k < 4; k++) best = lane[k] > best ? lane[k] : best;
#else
    float lane[8];
    for (int k = 0; k < 8; k++) lane[k] = -INFINITY;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) {
            float l = logits[i + k];
            l = l > FLT_MAX ? FLT_MAX : l; /* NaN compares false below: skipped */
            lane[k] = l > lane[k] ? l : lane[k];
        }
    for (int k = 0; k < 8; k++) best = lane[k] > best ? lane[k] : best;
#endif
    for (; i < n; i++) {
        float l = logit_sanitize(logits[i]);
        best = l > best ? l : best;
    }
    *best_out = best;
    if (best == -INFINITY) return 0;
    i = 0;
#if defined(__SSE2__)
    const __m128 want = _mm_set1_ps(best);
    for (; i + 4 <= n; i += 4) {
        int hit = _mm_movemask_ps(_mm_cmpeq_ps(_mm_min_ps(cap, _mm_loadu_ps(logits + i)), want));
        if (hit) return i + __builtin_ctz((unsigned)hit);
    }
#endif
    for (; i < n; i++)
        if (logit_sanitize(logits[i]) == best) return i;
    return 0; /* not reached: best is one of the logits */
}

static int32_t sampler_greedy(const struct sampler *s, const float *logits,
                              float *prob_out) {
    float best_logit;
    int32_t best = greedy_argmax(logits, s->n_vocab, &best_logit);
    if (prob_out) {
        if (best_logit == -INFINITY) {
            *prob_out = 0.0f;
        } else {
            double z = 0.0;
            for (int32_t i = 0; i < s->n_vocab; i++)
                z += sample_exp(logit_sanitize(logits[i]) - best_logit);
            *prob_out = (float)(1.0 / z);
        }
    }
    return best;
}

static int32_t sampler_draw(struct sampler *s, size_t m, float max_logit, bool sorted, float *prob_out);

/* No heap allocation on this path, by design: every buffer it touches (cand,
 * window_count) was sized to n_vocab by sampler_create, and the only sort is an
 * in-place heap (qsort is avoided: glibc's may malloc a merge buffer). */
int32_t sampler_sample(struct sampler *s, float *logits, const int32_t *history,
                       size_t n_history, float *prob_out) {
    LLMOPT_ASSERT(s && logits && (history || n_history == 0));
    penalty_visit(s, history, n_history, logits, NULL, NULL, 0);
    return sampler_sample_penalized(s, logits, prob_out);
}

int32_t sampler_sample_penalized(struct sampler *s, float *logits, float *prob_out) {
    LLMOPT_ASSERT(s && logits);
    const struct sampler_params *p = &s->params;
    if (s->nucleus_wait > 0) s->nucleus_wait--;
    if (p->temperature <= 0.0f) return sampler_greedy(s, logits, prob_out);

    /* Gather candidates (finite logits). With top-k on, a worst-on-top heap of size k
     * keeps the best k in O(n_vocab log k), then a heap sort orders them best first;
     * the vocab is never fully sorted. */
    struct sampler_cand *cand = s->cand;
    size_t top_k = p->top_k > 0 && p->top_k < s->n_vocab ? (size_t)p->top_k : 0;
    size_t m = 0;
    float max_logit = -INFINITY;
    bool sorted = false;
    for (int32_t i = 0; i < s->n_vocab; i++) {
        float l = logit_sanitize(logits[i]);
        if (l == -INFINITY) continue;
        struct sampler_cand c = {.id = i, .logit = l, .p = 0.0f};
        if (!top_k) {
            cand[m++] = c;
        } else if (m < top_k) {
            cand[m] = c;
            heap_sift_up(cand, m++, false);
        } else if (cand_ranks_above(&c, &cand[0])) {
            cand[0] = c;
            heap_sift_down(cand, m, 0, false);
        }
        if (l > max_logit) max_logit = l;
    }
    if (m == 0) { /* everything masked: nothing to draw */
        if (prob_out) *prob_out = 0.0f;
        return 0;
    }
    if (top_k) {
        for (size_t n = m; n > 1; n--) heap_pop(cand, n, false); /* worst to the back */
        sorted = true;
    }
    return sampler_draw(s, m, max_logit, sorted, prob_out);
}

int32_t sampler_device_k(const struct sampler *s) {
    const struct sampler_params *p = &s->params;
    if (p->temperature <= 0.0f) return 1;
    return p->top_k > 0 && p->top_k < s->n_vocab && p->top_k <= SAMPLER_RANKED_MAX ? p->top_k : 0;
}

bool sampler_device_full(const struct sampler *s) {
    const struct sampler_params *p = &s->params;
    return p->temperature > 0.0f && (p->top_k <= 0 || p->top_k >= s->n_vocab) && p->top_p >= 1.0f;
}

double sampler_peek_uniform(const struct sampler *s) {
    uint64_t copy[4] = {s->rng[0], s->rng[1], s->rng[2], s->rng[3]};
    return rng_uniform(copy);
}

void sampler_take_uniform(struct sampler *s) { (void)rng_uniform(s->rng); }

int32_t sampler_sample_ranked(struct sampler *s, const int32_t *ids, const float *logits, int32_t n) {
    LLMOPT_ASSERT(s && (ids || n == 0) && (logits || n == 0));
    const int32_t k = sampler_device_k(s);
    LLMOPT_ASSERT(k > 0);
    struct sampler_cand *cand = s->cand;
    size_t m = 0;
    for (int32_t j = 0; j < n && m < (size_t)k; j++) {
        if (ids[j] < 0 || ids[j] >= s->n_vocab) break; /* past the row's candidates */
        float l = logit_sanitize(logits[j]);
        if (l == -INFINITY) break; /* ranked: every later one is -inf too */
        cand[m++] = (struct sampler_cand){.id = ids[j], .logit = l, .p = 0.0f};
    }
    if (m == 0) return 0; /* everything masked: nothing to draw (greedy's answer too) */
    if (s->params.temperature <= 0.0f) return cand[0].id;
    return sampler_draw(s, m, cand[0].logit, true, NULL);
}

/* keep[0, n) in id order: the probabilities summed in SAMPLE_DRAW_BLOCK blocks of ids,
 * each in order, then the blocks' sums in order. */
static double draw_blocks_sum(const struct sampler_cand *keep, size_t n) {
    double z = 0.0;
    for (size_t j = 0; j < n;) {
        const int32_t b = keep[j].id / SAMPLE_DRAW_BLOCK;
        double sb = 0.0;
        for (; j < n && keep[j].id / SAMPLE_DRAW_BLOCK == b; j++) sb += keep[j].p;
        z += sb;
    }
    return z;
}

/* The first j whose cumulative mass, (the earlier blocks' sums, added in order) + (its
 * block's sum through j), exceeds target; n - 1 when none does. */
static size_t draw_blocks_walk(const struct sampler_cand *keep, size_t n, double target) {
    double before = 0.0;
    for (size_t j = 0; j < n;) {
        const int32_t b = keep[j].id / SAMPLE_DRAW_BLOCK;
        size_t end = j;
        double sb = 0.0;
        for (; end < n && keep[end].id / SAMPLE_DRAW_BLOCK == b; end++) sb += keep[end].p;
        if (target < before + sb) {
            double s = 0.0;
            for (; j < end; j++) {
                s += keep[j].p;
                if (target < before + s) return j;
            }
        }
        before += sb;
        j = end;
    }
    return n - 1;
}

/* Top-p over more than SAMPLER_RANKED_MAX candidates whose best SAMPLER_RANKED_MAX do
 * not reach target: s->cand[0, kept) are binned by log-probability so that only the
 * bin where the cut falls must be ranked; better bins are kept whole, worse ones
 * dropped. Returns first, with the survivors as cand[first, first + *n_keep) (the cut
 * bin's ranked part, then the better bins); kept (and *n_keep untouched) when no bin
 * gets there (min-p took the mass): top-p removes nothing. */
static size_t top_p_large(struct sampler *s, size_t kept, float max_logit, double target, size_t *n_keep) {
    struct sampler_cand *cand = s->cand;
    const float temperature = s->params.temperature;
    double bin_mass[TOP_P_BINS] = {0};
    for (size_t j = 0; j < kept; j++) bin_mass[top_p_bin(cand[j].logit, max_logit, temperature)] += cand[j].p;
    size_t cut = TOP_P_BINS;
    double above = 0.0; /* mass of the bins better than cut */
    for (size_t b = 0; b < TOP_P_BINS; b++) {
        if (above + bin_mass[b] >= target) {
            cut = b;
            break;
        }
        above += bin_mass[b];
    }
    if (cut == TOP_P_BINS) return kept;
    /* Three-way partition: [cut bin | better bins | worse bins (dropped)]. */
    size_t lo = 0, mid = 0, hi = kept;
    while (mid < hi) {
        size_t b = top_p_bin(cand[mid].logit, max_logit, temperature);
        struct sampler_cand tmp = cand[mid];
        if (b == cut) {
            cand[mid++] = cand[lo];
            cand[lo++] = tmp;
        } else if (b < cut) {
            mid++;
        } else {
            cand[mid] = cand[--hi];
            cand[hi] = tmp;
        }
    }
    /* Rank the cut bin with a best-on-top heap, popping only until the target is met;
     * popped tokens collect at the bin's back, right before the better bins, so the set
     * stays contiguous. */
    const size_t n_cut = lo;
    for (size_t j = n_cut / 2; j-- > 0;) heap_sift_down(cand, n_cut, j, true);
    size_t heap_n = n_cut;
    double cum = above;
    while (heap_n > 0) {
        heap_pop(cand, heap_n, true);
        heap_n--;
        cum += cand[heap_n].p;
        if (cum >= target) break;
    }
    *n_keep = mid - heap_n;
    return heap_n;
}

/* The best min(n, SAMPLER_RANKED_MAX) of cand[0, n) into s->ranked, best first: a
 * worst-on-top heap of that size over the candidates, then popped worst to the back.
 * Returns how many. */
static size_t rank_best(struct sampler *s, const struct sampler_cand *cand, size_t n) {
    struct sampler_cand *h = s->ranked;
    size_t m = 0;
    for (size_t j = 0; j < n; j++) {
        if (m < SAMPLER_RANKED_MAX) {
            h[m] = cand[j];
            heap_sift_up(h, m++, false);
        } else if (cand_ranks_above(&cand[j], &h[0])) {
            h[0] = cand[j];
            heap_sift_down(h, m, 0, false);
        }
    }
    for (size_t k = m; k > 1; k--) heap_pop(h, k, false);
    return m;
}

/* The length of the shortest best-first prefix of r[0, n) whose probabilities, summed
 * in that order, reach target; 0 when all n do not. */
static size_t nucleus_prefix(const struct sampler_cand *r, size_t n, double target) {
    double cum = 0.0;
    for (size_t j = 0; j < n; j++) {
        cum += r[j].p;
        if (cum >= target) return j + 1;
    }
    return 0;
}

/* Renormalizes over keep[0, n) and draws. id_order: keep is in id order and is summed
 * and walked in sample_exp.h's blocks (the order a device reproduces); otherwise in
 * its own order. */
static int32_t draw_kept(struct sampler *s, const struct sampler_cand *keep, size_t n, bool id_order,
                         float *prob_out) {
    size_t pick = n - 1; /* if rounding leaves target >= the sum */
    double z_keep;
    if (id_order) {
        z_keep = draw_blocks_sum(keep, n);
        pick = draw_blocks_walk(keep, n, rng_uniform(s->rng) * z_keep);
    } else {
        z_keep = 0.0;
        for (size_t j = 0; j < n; j++) z_keep += keep[j].p;
        const double target = rng_uniform(s->rng) * z_keep;
        double cum = 0.0;
        for (size_t j = 0; j < n; j++) {
            cum += keep[j].p;
            if (target < cum) {
                pick = j;
                break;
            }
        }
    }
    if (prob_out) *prob_out = (float)(keep[pick].p / z_keep);
    return keep[pick].id;
}

/* The chain after the candidates are gathered: s->cand[0, m) holds every finite
 * candidate (the best k, ranked best first, when sorted; else every finite one in id
 * order), max_logit the best logit. */
static int32_t sampler_draw(struct sampler *s, size_t m, float max_logit, bool sorted, float *prob_out) {
    const struct sampler_params *p = &s->params;
    struct sampler_cand *cand = s->cand;
    /* Softmax with temperature, unnormalized: the best token gets exactly 1. Division
     * rather than a reciprocal multiply: with a tiny temperature 1/T is inf and
     * 0 * inf would be NaN for the best token. */
    const float temperature = p->temperature;
    double z = 0.0;
    size_t j0 = 0;
#if defined(__SSE2__)
    const __m128 vmax = _mm_set1_ps(max_logit), vt = _mm_set1_ps(temperature);
    for (; j0 + 4 <= m; j0 += 4) { /* the scalar loop's bits, 4 at a time */
        const __m128 l = _mm_setr_ps(cand[j0].logit, cand[j0 + 1].logit, cand[j0 + 2].logit, cand[j0 + 3].logit);
        float p4[4];
        _mm_storeu_ps(p4, sample_exp4(_mm_div_ps(_mm_sub_ps(l, vmax), vt)));
        for (int q = 0; q < 4; q++) {
            cand[j0 + q].p = p4[q];
            z += p4[q];
        }
    }
#endif
    for (size_t j = j0; j < m; j++) {
        cand[j].p = sample_exp((cand[j].logit - max_logit) / temperature);
        z += cand[j].p;
    }
    /* The whole row's mass for top-p: in the draw's blocks (the order a device sums a
     * row in, so sampler_sample_nucleus can be handed it), unless the candidates are
     * top-k's, which come ranked. */
    if (!sorted && p->top_p < 1.0f) z = draw_blocks_sum(cand, m);

    /* min-p, before top-p: both keep a best-first prefix of the ranked candidates, so
     * applying them in either order keeps the shorter prefix, and filtering first
     * shrinks what top-p must rank. p_max is 1 here, so the bar is min_p itself.
     * Zero-probability tokens go too; the order of what stays is kept. */
    size_t kept = 0;
    for (size_t j = 0; j < m; j++)
        if (cand[j].p > 0.0f && cand[j].p >= p->min_p) cand[kept++] = cand[j];

    /* top-p, against the full softmax (z, before min-p): the smallest best-first set
     * whose mass, summed best first, reaches top_p * z. The survivors end up as
     * keep[0, n_keep), drawn best first, or in id order when top-p removes nothing. */
    const struct sampler_cand *keep = cand;
    size_t n_keep = kept;
    bool id_order = !sorted;
    if (p->top_p < 1.0f && kept > 1) {
        const double target = (double)p->top_p * z;
        if (sorted) {
            const size_t n = nucleus_prefix(cand, kept, target);
            if (n) n_keep = n;
        } else {
            /* The best SAMPLER_RANKED_MAX first: a real model's nucleus is mostly that
             * small, and a device backend hands back as many (sampler_sample_nucleus). */
            const size_t nr = rank_best(s, cand, kept);
            const size_t n = nucleus_prefix(s->ranked, nr, target);
            if (n) {
                keep = s->ranked;
                n_keep = n;
                id_order = false;
            } else if (kept > nr) {
                const size_t first = top_p_large(s, kept, max_logit, target, &n_keep);
                if (first < kept) {
                    keep = cand + first;
                    id_order = false;
                }
            }
            /* else every kept one is ranked and they do not reach top_p * z (min-p took
             * the mass, or rounding): top-p removes nothing */
        }
    }
    return draw_kept(s, keep, n_keep, id_order, prob_out);
}

/* ---- sampling from candidates picked elsewhere: top-p without top-k ---- */

static bool nucleus_params(const struct sampler *s) {
    const struct sampler_params *p = &s->params;
    return p->temperature > 0.0f && (p->top_k <= 0 || p->top_k >= s->n_vocab) && p->top_p < 1.0f;
}

/* A flat distribution (a random-weight model's, or a high temperature's) has sets of
 * thousands; the candidates are then a wasted trip, so a sampler whose last ones were
 * not enough draws this many times from whole rows before it asks again. Which way a
 * draw goes changes no id. */
#define NUCLEUS_RETRY 32

bool sampler_device_nucleus(const struct sampler *s) { return nucleus_params(s) && s->nucleus_wait == 0; }

/* Heap sort of c[0, n) by id (top-p's survivors when it removes nothing, for the id
 * order draw); no allocation. */
static void sort_by_id(struct sampler_cand *c, size_t n) {
    for (size_t i = n / 2; i-- > 0;) {
        for (size_t j = i;;) { /* sift down, larger id on top */
            size_t k = 2 * j + 1;
            if (k >= n) break;
            if (k + 1 < n && c[k + 1].id > c[k].id) k++;
            if (c[k].id <= c[j].id) break;
            struct sampler_cand t = c[j];
            c[j] = c[k];
            c[k] = t;
            j = k;
        }
    }
    for (size_t end = n; end > 1; end--) {
        struct sampler_cand t = c[0];
        c[0] = c[end - 1];
        c[end - 1] = t;
        for (size_t j = 0;;) {
            size_t k = 2 * j + 1;
            if (k >= end - 1) break;
            if (k + 1 < end - 1 && c[k + 1].id > c[k].id) k++;
            if (c[k].id <= c[j].id) break;
            struct sampler_cand u = c[j];
            c[j] = c[k];
            c[k] = u;
            j = k;
        }
    }
}

/* sample_exp is within 1.2 ulp of e^x (test_sampler), so a token ranked below one with
 * probability p has at most p * (1 + 2.4 ulp): this margin (about 8 ulp) covers it. */
#define NUCLEUS_MIN_P_MARGIN 1.000001f

int32_t sampler_sample_nucleus(struct sampler *s, const int32_t *ids, const float *logits, int32_t n, double z) {
    LLMOPT_ASSERT(s && (ids || n == 0) && (logits || n == 0) && nucleus_params(s));
    const struct sampler_params *p = &s->params;
    struct sampler_cand *r = s->ranked;
    size_t m = 0, kept = 0;
    float max_logit = -INFINITY, last_p = 1.0f;
    for (int32_t j = 0; j < n && m < SAMPLER_RANKED_MAX; j++, m++) {
        if (ids[j] < 0 || ids[j] >= s->n_vocab) break; /* past the row's candidates */
        const float l = logit_sanitize(logits[j]);
        if (l == -INFINITY) break; /* ranked: every later one is -inf too */
        if (m == 0) max_logit = l;
        last_p = sample_exp((l - max_logit) / p->temperature);
        if (last_p > 0.0f && last_p >= p->min_p)
            r[kept++] = (struct sampler_cand){.id = ids[j], .logit = l, .p = last_p};
    }
    if (m == 0) return 0; /* nothing finite: sampler_sample's answer, and it draws nothing */
    /* Every finite candidate is here (the row ended), or every later one fails min-p:
     * then r[0, kept) is all that sampler_draw keeps. */
    const bool complete = m < (size_t)n || m == (size_t)s->n_vocab || last_p * NUCLEUS_MIN_P_MARGIN < p->min_p;
    if (kept > 1) { /* sampler_draw's top-p on its best SAMPLER_RANKED_MAX */
        const size_t k = nucleus_prefix(r, kept, (double)p->top_p * z);
        if (k) return draw_kept(s, r, k, false, NULL);
    }
    if (!complete) {
        s->nucleus_wait = NUCLEUS_RETRY;
        return -1;
    }
    sort_by_id(r, kept); /* top-p removes nothing: the id order draw */
    return draw_kept(s, r, kept, true, NULL);
}
