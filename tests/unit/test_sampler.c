/* Sampler tests: every case runs on fresh pseudo-random logits (never all zeros).
 *
 * Heap allocation: sampler_sample allocates nothing by design (all scratch comes from
 * sampler_create; it calls no malloc/calloc/realloc and no qsort). The link-time
 * malloc wrapping that proves it is set up by the lead elsewhere; nothing here checks
 * it. */
#include "runtime/sampler.h"
#include "runtime/sample_exp.h"

#include "base/status.h"
#include "test.h"

#include <float.h>
#include <stdbool.h>
#include <stdint.h>

/* ---- helpers ---- */

/* The test's own generator, separate from the sampler's. */
static uint64_t test_rng_state = 0x2545f4914f6cdd1dull;

static uint64_t test_rng_next(void) {
    uint64_t x = test_rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    test_rng_state = x;
    return x * 0x2545f4914f6cdd1dull;
}

static float test_uniform(void) { return (float)(test_rng_next() >> 40) * 0x1.0p-24f; }

/* Roughly normal logits with standard deviation ~scale. */
static void fill_logits(float *logits, int n, float scale) {
    for (int i = 0; i < n; i++) {
        float u = test_uniform() + test_uniform() + test_uniform() + test_uniform() - 2.0f;
        logits[i] = u * scale * 1.7f;
    }
}

static int argmax(const float *logits, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

/* probs[i] = softmax(logits / temperature)[i], in double. */
static void softmax(const float *logits, int n, double temperature, double *probs) {
    double max = logits[0];
    for (int i = 1; i < n; i++)
        if (logits[i] > max) max = logits[i];
    double z = 0.0;
    for (int i = 0; i < n; i++) z += probs[i] = exp((logits[i] - max) / temperature);
    for (int i = 0; i < n; i++) probs[i] /= z;
}

/* Rank of token id among logits: how many tokens rank strictly above it (higher
 * logit, or equal logit and lower id). */
static int rank_of(const float *logits, int n, int id) {
    int r = 0;
    for (int i = 0; i < n; i++)
        if (logits[i] > logits[id] || (logits[i] == logits[id] && i < id)) r++;
    return r;
}

static struct sampler_params params_plain(float temperature) {
    struct sampler_params p;
    sampler_params_default(&p);
    p.temperature = temperature;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    return p;
}

static struct sampler *make_sampler(const struct sampler_params *p, int n_vocab) {
    struct sampler *s = NULL;
    struct llmopt_err err = {0};
    enum llmopt_status st = sampler_create(p, n_vocab, &s, &err);
    CHECK_MSG(st == LLMOPT_OK, "sampler_create: %s", err.msg);
    LLMOPT_ASSERT(s);
    return s;
}

/* Draws one token from a private copy of logits (sampler_sample may modify it). */
static int32_t draw(struct sampler *s, const float *logits, float *scratch, int n,
                    float *prob) {
    memcpy(scratch, logits, (size_t)n * sizeof *logits);
    return sampler_sample(s, scratch, NULL, 0, prob);
}

/* Logits whose softmax at temperature 1 is exactly probs (up to rounding). */
static void logits_from_probs(const double *probs, int n, float *logits) {
    for (int i = 0; i < n; i++) logits[i] = (float)log(probs[i]) + 3.0f;
}

#define N_VOCAB 1000

/* ---- tests ---- */

static void test_defaults_and_validation(void) {
    struct sampler_params p;
    sampler_params_default(&p);
    CHECK(p.temperature == 0.8f);
    CHECK_EQ_INT(p.top_k, 40);
    CHECK(p.top_p == 0.95f);
    CHECK(p.min_p == 0.05f);
    CHECK(p.repeat_penalty == 1.0f);
    CHECK_EQ_INT(p.repeat_last_n, 64);
    CHECK(p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f);
    CHECK(p.seed == 0);
    struct llmopt_err err = {0};
    CHECK_EQ_INT(sampler_params_validate(&p, &err), LLMOPT_OK);

    /* Allowed: negative temperature (greedy), top_k <= 0, top_p 1, min_p 0 and 1. */
    struct sampler_params ok = p;
    ok.temperature = -1.0f;
    ok.top_k = -5;
    ok.top_p = 1.0f;
    ok.min_p = 1.0f;
    ok.repeat_last_n = -1;
    ok.presence_penalty = -2.0f;
    CHECK_EQ_INT(sampler_params_validate(&ok, &err), LLMOPT_OK);
    ok.min_p = 0.0f;
    CHECK_EQ_INT(sampler_params_validate(&ok, &err), LLMOPT_OK);

    struct {
        const char *field;
        struct sampler_params p;
    } bad[16];
    int n_bad = 0;
#define BAD(name, assign)                                                          \
    do {                                                                           \
        bad[n_bad].field = name;                                                   \
        bad[n_bad].p = p;                                                          \
        bad[n_bad].p.assign;                                                       \
        n_bad++;                                                                   \
    } while (0)
    BAD("temperature", temperature = NAN);
    BAD("temperature", temperature = INFINITY);
    BAD("top_p", top_p = 0.0f);
    BAD("top_p", top_p = -0.5f);
    BAD("top_p", top_p = 1.5f);
    BAD("top_p", top_p = NAN);
    BAD("min_p", min_p = -0.1f);
    BAD("min_p", min_p = 1.01f);
    BAD("min_p", min_p = NAN);
    BAD("repeat_penalty", repeat_penalty = 0.0f);
    BAD("repeat_penalty", repeat_penalty = -1.1f);
    BAD("repeat_penalty", repeat_penalty = NAN);
    BAD("repeat_last_n", repeat_last_n = -2);
    BAD("presence_penalty", presence_penalty = NAN);
    BAD("frequency_penalty", frequency_penalty = INFINITY);
#undef BAD
    for (int i = 0; i < n_bad; i++) {
        memset(&err, 0, sizeof err);
        enum llmopt_status st = sampler_params_validate(&bad[i].p, &err);
        CHECK_MSG(st == LLMOPT_ERR_INVALID_ARG, "case %d (%s): status %d", i,
                  bad[i].field, (int)st);
        CHECK_EQ_INT(err.status, LLMOPT_ERR_INVALID_ARG);
        CHECK_MSG(strstr(err.msg, bad[i].field) != NULL, "case %d: '%s' lacks '%s'", i,
                  err.msg, bad[i].field);
        /* sampler_create validates too and leaves *out NULL. */
        struct sampler *s = (struct sampler *)&err; /* any non-NULL */
        CHECK_EQ_INT(sampler_create(&bad[i].p, N_VOCAB, &s, NULL), LLMOPT_ERR_INVALID_ARG);
        CHECK(s == NULL);
    }

    struct sampler *s = NULL;
    memset(&err, 0, sizeof err);
    CHECK_EQ_INT(sampler_create(&p, 0, &s, &err), LLMOPT_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "n_vocab") != NULL);
    CHECK(s == NULL);
    CHECK_EQ_INT(sampler_create(&p, -3, &s, &err), LLMOPT_ERR_INVALID_ARG);
    CHECK_EQ_INT(sampler_create(&p, 10, NULL, &err), LLMOPT_ERR_INVALID_ARG);
    sampler_free(NULL);
}

static void test_greedy_is_argmax(void) {
    float logits[N_VOCAB], work[N_VOCAB];
    struct sampler_params p = params_plain(0.0f);
    struct sampler *s = make_sampler(&p, N_VOCAB);
    for (int trial = 0; trial < 50; trial++) {
        fill_logits(logits, N_VOCAB, 2.0f);
        float prob = -1.0f;
        int32_t t = draw(s, logits, work, N_VOCAB, &prob);
        CHECK_EQ_INT(t, argmax(logits, N_VOCAB));
        double probs[N_VOCAB];
        softmax(logits, N_VOCAB, 1.0, probs);
        CHECK_MSG(fabs(prob - probs[t]) < 1e-5, "prob %g vs softmax %g", (double)prob,
                  probs[t]);
    }
    sampler_free(s);

    /* Negative temperature is greedy too; ties go to the lowest id; NaN never wins. */
    p.temperature = -0.5f;
    s = make_sampler(&p, N_VOCAB);
    fill_logits(logits, N_VOCAB, 1.0f);
    logits[700] = 50.0f;
    logits[300] = 50.0f;
    logits[900] = 50.0f;
    logits[10] = NAN;
    logits[11] = NAN;
    CHECK_EQ_INT(draw(s, logits, work, N_VOCAB, NULL), 300);
    logits[0] = NAN; /* NaN at index 0 must not seed the argmax */
    CHECK_EQ_INT(draw(s, logits, work, N_VOCAB, NULL), 300);
    logits[950] = INFINITY;
    CHECK_EQ_INT(draw(s, logits, work, N_VOCAB, NULL), 950);
    sampler_free(s);
}

/* Greedy's two-pass argmax against the one-pass definition (a running strict max of
 * sanitized logits) on fresh rows of every length 1..70 and a few larger ones, with
 * NaN, +-inf and ties sprinkled in at random places. */
static int32_t greedy_reference(const float *logits, int n) {
    int32_t best = 0;
    float best_logit = -INFINITY;
    for (int i = 0; i < n; i++) {
        float l = isnan(logits[i]) ? -INFINITY : logits[i] == INFINITY ? FLT_MAX : logits[i];
        if (l > best_logit) {
            best_logit = l;
            best = i;
        }
    }
    return best;
}

static void test_greedy_matches_reference(void) {
    static float logits[1031], work[1031];
    const int big[] = {512, 513, 1000, 1031};
    struct sampler_params p = params_plain(0.0f);
    for (int len = 1; len <= 70 + 4; len++) {
        int n = len <= 70 ? len : big[len - 71];
        struct sampler *s = make_sampler(&p, n);
        for (int trial = 0; trial < 40; trial++) {
            fill_logits(logits, n, 2.0f);
            int specials = (int)(test_rng_next() % 6);
            for (int k = 0; k < specials; k++) {
                int at = (int)(test_rng_next() % (uint64_t)n);
                int from = (int)(test_rng_next() % (uint64_t)n);
                switch (test_rng_next() % 6) {
                case 0: logits[at] = NAN; break;
                case 1: logits[at] = -INFINITY; break;
                case 2: logits[at] = INFINITY; break;
                case 3: logits[at] = FLT_MAX; break;
                default: logits[at] = logits[from]; break; /* a tie, maybe for the max */
                }
            }
            if (trial == 0) /* everything masked */
                for (int i = 0; i < n; i++) logits[i] = i % 2 ? NAN : -INFINITY;
            if (trial == 1) /* all equal */
                for (int i = 0; i < n; i++) logits[i] = 0.25f;
            int32_t want = greedy_reference(logits, n);
            int32_t got = draw(s, logits, work, n, NULL);
            if (got != want) {
                CHECK_MSG(0, "n %d trial %d: greedy %d (logit %g), reference %d (logit %g)", n,
                          trial, got, (double)logits[got], want, (double)logits[want]);
                break;
            }
        }
        sampler_free(s);
    }
}

static void test_seed_determinism(void) {
    float logits[N_VOCAB], work[N_VOCAB];
    fill_logits(logits, N_VOCAB, 1.0f);
    struct sampler_params p;
    sampler_params_default(&p);
    p.top_k = 0; /* a wide distribution so the sequences are informative */
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.temperature = 1.5f;
    enum { N = 200 };
    int32_t a[N], b[N], c[N], d[N];
    p.seed = 1234;
    struct sampler *sa = make_sampler(&p, N_VOCAB);
    struct sampler *sb = make_sampler(&p, N_VOCAB);
    p.seed = 1235;
    struct sampler *sc = make_sampler(&p, N_VOCAB);
    for (int i = 0; i < N; i++) {
        a[i] = draw(sa, logits, work, N_VOCAB, NULL);
        b[i] = draw(sb, logits, work, N_VOCAB, NULL);
        c[i] = draw(sc, logits, work, N_VOCAB, NULL);
    }
    CHECK(memcmp(a, b, sizeof a) == 0);
    int same = 0;
    for (int i = 0; i < N; i++) same += a[i] == c[i];
    CHECK_MSG(same < N / 4, "seeds 1234 and 1235 agree on %d of %d draws", same, N);

    /* reset: replays the sequence of a fresh sampler with that seed. */
    sampler_reset(sa, 1234);
    for (int i = 0; i < N; i++) d[i] = draw(sa, logits, work, N_VOCAB, NULL);
    CHECK(memcmp(a, d, sizeof a) == 0);
    sampler_reset(sa, 1235);
    for (int i = 0; i < N; i++) d[i] = draw(sa, logits, work, N_VOCAB, NULL);
    CHECK(memcmp(c, d, sizeof c) == 0);

    /* Same seed, default chain (top-k, top-p, min-p on): identical too. */
    sampler_params_default(&p);
    p.seed = 99;
    struct sampler *se = make_sampler(&p, N_VOCAB);
    struct sampler *sf = make_sampler(&p, N_VOCAB);
    for (int i = 0; i < N; i++) {
        a[i] = draw(se, logits, work, N_VOCAB, NULL);
        b[i] = draw(sf, logits, work, N_VOCAB, NULL);
    }
    CHECK(memcmp(a, b, sizeof a) == 0);
    sampler_free(sf);
    sampler_free(se);
    sampler_free(sc);
    sampler_free(sb);
    sampler_free(sa);
}

/* Pins the PRNG (splitmix64 -> xoshiro256**, 53-bit uniform): with equal logits every
 * token has weight exactly 1, so the draw is floor(u * n_vocab) whatever the libm.
 * Expected values come from an independent Python model of the same generator. */
static void test_prng_golden(void) {
    static const struct {
        uint64_t seed;
        int32_t tokens[10];
    } golden[] = {
        {0, {601, 747, 103, 416, 732, 999, 422, 535, 855, 918}},
        {42, {83, 378, 680, 924, 991, 769, 719, 850, 761, 583}},
        {0xdeadbeefcafef00dull, {617, 85, 542, 485, 766, 856, 772, 737, 541, 773}},
    };
    float logits[N_VOCAB], work[N_VOCAB];
    for (int i = 0; i < N_VOCAB; i++) logits[i] = 1.25f;
    struct sampler_params p = params_plain(0.9f);
    p.seed = 12345; /* replaced through sampler_reset below */
    struct sampler *s = make_sampler(&p, N_VOCAB);
    for (size_t g = 0; g < LLMOPT_ARRAY_LEN(golden); g++) {
        p.seed = golden[g].seed;
        struct sampler *fresh = make_sampler(&p, N_VOCAB);
        sampler_reset(s, golden[g].seed);
        for (int i = 0; i < 10; i++) {
            float prob = 0.0f;
            CHECK_EQ_INT(draw(fresh, logits, work, N_VOCAB, &prob), golden[g].tokens[i]);
            CHECK(prob == 1.0f / N_VOCAB);
            CHECK_EQ_INT(draw(s, logits, work, N_VOCAB, NULL), golden[g].tokens[i]);
        }
        sampler_free(fresh);
    }
    sampler_free(s);
}

static void test_top_k_one_is_greedy(void) {
    float logits[N_VOCAB], work[N_VOCAB];
    const float temps[] = {0.05f, 0.7f, 1.0f, 3.0f, 100.0f, 1e-30f};
    for (size_t ti = 0; ti < LLMOPT_ARRAY_LEN(temps); ti++) {
        struct sampler_params p = params_plain(temps[ti]);
        p.top_k = 1;
        p.seed = 7 + ti;
        struct sampler *s = make_sampler(&p, N_VOCAB);
        for (int trial = 0; trial < 20; trial++) {
            fill_logits(logits, N_VOCAB, 1.0f);
            if (trial == 0) { /* a tie: lowest id, as greedy */
                logits[500] = 40.0f;
                logits[20] = 40.0f;
            }
            float prob = 0.0f;
            int32_t t = draw(s, logits, work, N_VOCAB, &prob);
            CHECK_EQ_INT(t, argmax(logits, N_VOCAB));
            CHECK(prob == 1.0f);
        }
        sampler_free(s);
    }
}

static void test_top_k_stays_in_top_k(void) {
    float logits[N_VOCAB], work[N_VOCAB];
    const int ks[] = {2, 5, 40};
    for (size_t ki = 0; ki < LLMOPT_ARRAY_LEN(ks); ki++) {
        int k = ks[ki];
        fill_logits(logits, N_VOCAB, 0.5f); /* flat: many tokens near the cut */
        struct sampler_params p = params_plain(5.0f);
        p.top_k = k;
        p.seed = 42 + ki;
        struct sampler *s = make_sampler(&p, N_VOCAB);
        int hits[N_VOCAB] = {0};
        for (int i = 0; i < 5000; i++) {
            int32_t t = draw(s, logits, work, N_VOCAB, NULL);
            CHECK(t >= 0 && t < N_VOCAB);
            if (t < 0 || t >= N_VOCAB) continue;
            hits[t]++;
            int r = rank_of(logits, N_VOCAB, t);
            if (r >= k) {
                CHECK_MSG(r < k, "top_k %d drew token %d of rank %d", k, t, r);
                break;
            }
        }
        int distinct = 0;
        for (int i = 0; i < N_VOCAB; i++) distinct += hits[i] > 0;
        CHECK_MSG(distinct == k, "top_k %d: %d distinct tokens drawn", k, distinct);
        sampler_free(s);
    }
}

/* Case ci draws 2000 tokens from s over the 5 logits lg: each reports the probability
 * probs[t] / z, and exactly the tokens marked in keep come up. */
static void check_kept(struct sampler *s, const float *lg, float *work, const double probs[5],
                       double z, const int keep[5], size_t ci) {
    int hits[5] = {0};
    for (int i = 0; i < 2000; i++) {
        float prob = 0.0f;
        int32_t t = draw(s, lg, work, 5, &prob);
        if (t < 0 || t >= 5) {
            CHECK(t >= 0 && t < 5);
            break;
        }
        hits[t]++;
        CHECK_MSG(fabs(prob - probs[t] / z) < 1e-5, "case %zu tok %d: prob %g vs %g", ci, t,
                  (double)prob, probs[t] / z);
    }
    for (int i = 0; i < 5; i++)
        CHECK_MSG((hits[i] > 0) == keep[i], "case %zu: token %d drawn %d times", ci, i, hits[i]);
}

static void test_top_p(void) {
    float logits[N_VOCAB], work[N_VOCAB];
    /* Tiny top_p keeps only the max. */
    struct sampler_params p = params_plain(2.0f);
    p.top_p = 1e-6f;
    struct sampler *s = make_sampler(&p, N_VOCAB);
    for (int trial = 0; trial < 100; trial++) {
        fill_logits(logits, N_VOCAB, 1.0f);
        float prob = 0.0f;
        CHECK_EQ_INT(draw(s, logits, work, N_VOCAB, &prob), argmax(logits, N_VOCAB));
        CHECK(prob == 1.0f);
    }
    sampler_free(s);

    /* Known distribution, ids shuffled: p = .5 .3 .1 .06 .04 at ids 3 0 4 1 2. */
    const double probs[5] = {0.3, 0.06, 0.04, 0.5, 0.1};
    float lg[5];
    logits_from_probs(probs, 5, lg);
    struct {
        float temperature, top_p;
        int top_k;
        int keep[5]; /* 1: may be drawn */
    } cases[] = {
        {1.0f, 0.75f, 0, {1, 0, 0, 1, 0}}, /* .5 + .3 = .8 >= .75 */
        {1.0f, 0.85f, 0, {1, 0, 0, 1, 1}}, /* needs .1 too */
        {1.0f, 0.97f, 0, {1, 1, 1, 1, 1}},
        /* top-k first: over {.5,.3,.1}/.9 the first two make .889 >= .85 */
        {1.0f, 0.85f, 3, {1, 0, 0, 1, 0}},
        /* temperature before top-p: at T=.5, p ∝ p^2: .704 .253 .028 ... */
        {0.5f, 0.85f, 0, {1, 0, 0, 1, 0}},
        {0.5f, 0.96f, 0, {1, 0, 0, 1, 1}},
    };
    for (size_t ci = 0; ci < LLMOPT_ARRAY_LEN(cases); ci++) {
        p = params_plain(cases[ci].temperature);
        p.top_p = cases[ci].top_p;
        p.top_k = cases[ci].top_k;
        p.seed = 5 + ci;
        s = make_sampler(&p, 5);
        double kept_probs[5], z = 0.0;
        softmax(lg, 5, cases[ci].temperature, kept_probs);
        for (int i = 0; i < 5; i++) z += cases[ci].keep[i] ? kept_probs[i] : 0.0;
        check_kept(s, lg, work, kept_probs, z, cases[ci].keep, ci);
        sampler_free(s);
    }
}

static void test_min_p(void) {
    float work[N_VOCAB];
    /* Known distribution: p = .5 .3 .1 .06 .04 at ids 3 0 4 1 2. */
    const double probs[5] = {0.3, 0.06, 0.04, 0.5, 0.1};
    float lg[5];
    logits_from_probs(probs, 5, lg);
    struct {
        float min_p, top_p;
        int keep[5];
    } cases[] = {
        {0.15f, 1.0f, {1, 0, 0, 1, 1}}, /* bar .075: keeps .5 .3 .1 */
        {0.5f, 1.0f, {1, 0, 0, 1, 0}},  /* bar .25: keeps .5 .3 */
        {0.7f, 1.0f, {0, 0, 0, 1, 0}},  /* bar .35: keeps .5 */
        {0.01f, 1.0f, {1, 1, 1, 1, 1}},
        {1.0f, 1.0f, {0, 0, 0, 1, 0}},  /* only ties with the max */
        {0.15f, 0.75f, {1, 0, 0, 1, 0}}, /* with top-p: the shorter of the two */
        {0.5f, 0.85f, {1, 0, 0, 1, 0}},
        /* top-p measures the full distribution, not what min-p leaves: .5 .3 .1 make
         * .9 >= .85 (over min-p's .9 the first two would already make .889). */
        {0.15f, 0.85f, {1, 0, 0, 1, 1}},
    };
    for (size_t ci = 0; ci < LLMOPT_ARRAY_LEN(cases); ci++) {
        struct sampler_params p = params_plain(1.0f);
        p.min_p = cases[ci].min_p;
        p.top_p = cases[ci].top_p;
        p.seed = 11 + ci;
        struct sampler *s = make_sampler(&p, 5);
        double z = 0.0;
        for (int i = 0; i < 5; i++) z += cases[ci].keep[i] ? probs[i] : 0.0;
        check_kept(s, lg, work, probs, z, cases[ci].keep, ci);
        sampler_free(s);
    }

    /* Random logits: every draw satisfies p >= min_p * p_max (at the temperature). */
    float logits[N_VOCAB];
    fill_logits(logits, N_VOCAB, 1.0f);
    struct sampler_params p = params_plain(1.3f);
    p.min_p = 0.2f;
    struct sampler *s = make_sampler(&p, N_VOCAB);
    double sm[N_VOCAB];
    softmax(logits, N_VOCAB, 1.3, sm);
    double pmax = sm[argmax(logits, N_VOCAB)];
    int n_allowed = 0, distinct = 0, hits[N_VOCAB] = {0};
    for (int i = 0; i < N_VOCAB; i++) n_allowed += sm[i] >= 0.2 * pmax;
    for (int i = 0; i < 5000; i++) {
        int32_t t = draw(s, logits, work, N_VOCAB, NULL);
        if (sm[t] < 0.2 * pmax * (1 - 1e-5)) {
            CHECK_MSG(0, "min_p drew token %d with p %g < %g", t, sm[t], 0.2 * pmax);
            break;
        }
        distinct += hits[t]++ == 0;
    }
    CHECK_MSG(n_allowed > 5 && distinct == n_allowed, "%d allowed, %d drawn", n_allowed,
              distinct);
    sampler_free(s);
}

/* Empirical frequencies against softmax(logits / T): max abs difference and a
 * chi-square statistic. The seed is fixed, so the outcome is too. */
static void check_distribution(const float *logits, int n, float temperature,
                               uint64_t seed, int n_draws) {
    struct sampler_params p = params_plain(temperature);
    p.seed = seed;
    struct sampler *s = make_sampler(&p, n);
    double probs[64];
    int hits[64] = {0};
    float work[64];
    LLMOPT_ASSERT(n <= 64);
    softmax(logits, n, temperature, probs);
    for (int i = 0; i < n_draws; i++) {
        float prob = 0.0f;
        int32_t t = draw(s, logits, work, n, &prob);
        if (t < 0 || t >= n) {
            CHECK(t >= 0 && t < n);
            break;
        }
        hits[t]++;
        if (fabs(prob - probs[t]) > 1e-5) {
            CHECK_MSG(0, "prob_out %g vs softmax %g", (double)prob, probs[t]);
            break;
        }
    }
    double max_diff = 0.0, chi2 = 0.0;
    for (int i = 0; i < n; i++) {
        double f = (double)hits[i] / n_draws;
        if (fabs(f - probs[i]) > max_diff) max_diff = fabs(f - probs[i]);
        double expect = probs[i] * n_draws;
        chi2 += (hits[i] - expect) * (hits[i] - expect) / expect;
    }
    /* chi-square, n - 1 = 15 degrees of freedom: 37.7 is the 0.999 quantile. */
    CHECK_MSG(max_diff < 0.01, "T %g: max |freq - p| = %g", (double)temperature, max_diff);
    CHECK_MSG(chi2 < 37.7, "T %g: chi-square %g over %d tokens", (double)temperature, chi2,
              n);
    sampler_free(s);
}

static void test_frequencies_match_softmax(void) {
    float logits[16];
    fill_logits(logits, 16, 1.0f);
    check_distribution(logits, 16, 1.0f, 2024, 20000);
    fill_logits(logits, 16, 1.5f);
    check_distribution(logits, 16, 1.0f, 77, 20000);
}

static void test_temperature_scaling(void) {
    float logits[16];
    fill_logits(logits, 16, 1.0f);
    /* Each temperature matches its own softmax(l / T). */
    check_distribution(logits, 16, 0.5f, 3, 20000);
    check_distribution(logits, 16, 2.0f, 4, 20000);

    /* And moves the mass as expected: the top token's share falls and the entropy of
     * the empirical distribution rises with T. */
    const float temps[] = {0.25f, 0.5f, 1.0f, 2.0f, 4.0f};
    float work[16];
    int top = argmax(logits, 16);
    double prev_top = 2.0, prev_entropy = -1.0;
    for (size_t ti = 0; ti < LLMOPT_ARRAY_LEN(temps); ti++) {
        struct sampler_params p = params_plain(temps[ti]);
        p.seed = 100 + ti;
        struct sampler *s = make_sampler(&p, 16);
        int hits[16] = {0};
        for (int i = 0; i < 20000; i++) hits[draw(s, logits, work, 16, NULL)]++;
        double top_share = hits[top] / 20000.0, entropy = 0.0;
        for (int i = 0; i < 16; i++)
            if (hits[i]) entropy -= hits[i] / 20000.0 * log(hits[i] / 20000.0);
        CHECK_MSG(top_share < prev_top, "T %g: top share %g not below %g",
                  (double)temps[ti], top_share, prev_top);
        CHECK_MSG(entropy > prev_entropy, "T %g: entropy %g not above %g",
                  (double)temps[ti], entropy, prev_entropy);
        prev_top = top_share;
        prev_entropy = entropy;
        sampler_free(s);
    }
}

static void test_repeat_penalty(void) {
    float logits[N_VOCAB], work[N_VOCAB];
    fill_logits(logits, N_VOCAB, 2.0f);
    logits[5] = 3.0f;   /* positive: divided */
    logits[6] = -2.0f;  /* negative: multiplied */
    logits[7] = 0.0f;   /* zero stays zero */
    logits[8] = 4.0f;   /* only before the window: untouched */
    logits[9] = -INFINITY;
    struct sampler_params p = params_plain(0.0f);
    p.repeat_penalty = 1.5f;
    p.repeat_last_n = 6;
    struct sampler *s = make_sampler(&p, N_VOCAB);
    /* window = the last 6: {5, 6, 5, -1, 7, 9}; 5 twice, penalized once. Out-of-range
     * ids are ignored. */
    const int32_t history[] = {8, 8, 1000, 5, 6, 5, -1, 7, 9};
    memcpy(work, logits, sizeof logits);
    sampler_sample(s, work, history, LLMOPT_ARRAY_LEN(history), NULL);
    for (int i = 0; i < N_VOCAB; i++) {
        float want = logits[i];
        if (i == 5) want = 3.0f / 1.5f;
        if (i == 6) want = -2.0f * 1.5f;
        if (i == 7 || i == 9) want = logits[i] * 1.5f;
        CHECK_MSG(work[i] == want, "logit %d: %g, want %g", i, (double)work[i],
                  (double)want);
    }

    /* The penalty changes the choice: the argmax, once recent, loses to the second. */
    fill_logits(logits, N_VOCAB, 1.0f);
    int first = argmax(logits, N_VOCAB);
    logits[first] = 10.0f;
    logits[(first + 1) % N_VOCAB] = 9.0f;
    const int32_t recent[] = {first};
    CHECK_EQ_INT(draw(s, logits, work, N_VOCAB, NULL), first);
    memcpy(work, logits, sizeof logits);
    CHECK_EQ_INT(sampler_sample(s, work, recent, 1, NULL), (first + 1) % N_VOCAB);
    sampler_free(s);

    /* In sampling mode the recent token's probability drops. */
    p = params_plain(1.0f);
    struct sampler *plain = make_sampler(&p, N_VOCAB);
    p.repeat_penalty = 1.3f;
    struct sampler *pen = make_sampler(&p, N_VOCAB);
    float before = 0.0f, after = 0.0f;
    /* top-p tiny would hide it; draw until the recent token comes up in both */
    for (int i = 0; i < 20000 && (before == 0.0f || after == 0.0f); i++) {
        float pr;
        memcpy(work, logits, sizeof logits);
        if (sampler_sample(plain, work, recent, 1, &pr) == first) before = pr;
        memcpy(work, logits, sizeof logits);
        if (sampler_sample(pen, work, recent, 1, &pr) == first) after = pr;
    }
    CHECK_MSG(before > 0.0f && after > 0.0f && after < before, "p %g -> %g",
              (double)before, (double)after);
    sampler_free(pen);
    sampler_free(plain);

    /* History no longer than the window: all of it counts, nothing before it is read
     * (ASan would catch a read before history). */
    p = params_plain(0.0f);
    p.repeat_penalty = 2.0f;
    const int32_t n_hist[] = {1, 2, 3, 4};
    for (int h = 0; h < 4; h++) {
        p.repeat_last_n = 3;
        s = make_sampler(&p, N_VOCAB);
        const int32_t short_history[] = {5, 6, 7, 8};
        int32_t *heap_history = malloc((size_t)n_hist[h] * sizeof *heap_history);
        memcpy(heap_history, short_history + (4 - n_hist[h]), (size_t)n_hist[h] * 4);
        memcpy(work, logits, sizeof logits);
        sampler_sample(s, work, heap_history, (size_t)n_hist[h], NULL);
        for (int id = 5; id <= 8; id++) {
            bool in_window = id >= 5 + 4 - (n_hist[h] < 3 ? n_hist[h] : 3);
            float want = in_window ? (logits[id] > 0 ? logits[id] / 2.0f : logits[id] * 2.0f)
                                   : logits[id];
            CHECK_MSG(work[id] == want, "n_history %d id %d: %g want %g", n_hist[h], id,
                      (double)work[id], (double)want);
        }
        free(heap_history);
        sampler_free(s);
    }

    /* repeat_last_n 0: off; -1: the whole history. */
    p = params_plain(0.0f);
    p.repeat_penalty = 2.0f;
    p.repeat_last_n = 0;
    s = make_sampler(&p, N_VOCAB);
    memcpy(work, logits, sizeof logits);
    sampler_sample(s, work, history, LLMOPT_ARRAY_LEN(history), NULL);
    CHECK(memcmp(work, logits, sizeof logits) == 0);
    sampler_free(s);
    p.repeat_last_n = -1;
    s = make_sampler(&p, N_VOCAB);
    memcpy(work, logits, sizeof logits);
    sampler_sample(s, work, history, LLMOPT_ARRAY_LEN(history), NULL);
    CHECK(work[8] == (logits[8] > 0 ? logits[8] / 2.0f : logits[8] * 2.0f));
    CHECK(work[5] == (logits[5] > 0 ? logits[5] / 2.0f : logits[5] * 2.0f));
    sampler_free(s);
}

static void test_presence_frequency(void) {
    float logits[N_VOCAB], work[N_VOCAB];
    fill_logits(logits, N_VOCAB, 2.0f);
    logits[3] = 1.0f;
    logits[4] = -1.0f;
    logits[11] = 2.0f;
    struct sampler_params p = params_plain(0.0f);
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    p.repeat_last_n = 8;
    struct sampler *s = make_sampler(&p, N_VOCAB);
    /* window (last 8): 3 x3, 4 x1, 7 x2, 2 x1, 999 x1; 11 only outside it. */
    const int32_t history[] = {11, 11, 3, 7, 4, 3, 2, 7, 999, 3};
    for (int rep = 0; rep < 2; rep++) { /* twice: counts must reset between calls */
        memcpy(work, logits, sizeof logits);
        sampler_sample(s, work, history, LLMOPT_ARRAY_LEN(history), NULL);
        for (int i = 0; i < N_VOCAB; i++) {
            int count = i == 3 ? 3 : i == 7 ? 2 : (i == 4 || i == 2 || i == 999) ? 1 : 0;
            float want = logits[i];
            if (count) want = logits[i] - (0.5f + (float)count * 0.25f);
            CHECK_MSG(work[i] == want, "rep %d logit %d: %g, want %g", rep, i,
                      (double)work[i], (double)want);
        }
    }
    sampler_free(s);

    /* Combined with repeat: repeat first (on the sign), then subtract. */
    p.repeat_penalty = 2.0f;
    s = make_sampler(&p, N_VOCAB);
    memcpy(work, logits, sizeof logits);
    sampler_sample(s, work, history, LLMOPT_ARRAY_LEN(history), NULL);
    CHECK(work[3] == 1.0f / 2.0f - (0.5f + 3 * 0.25f));
    CHECK(work[4] == -1.0f * 2.0f - (0.5f + 0.25f));
    CHECK(work[11] == logits[11]);
    sampler_free(s);

    /* Negative penalties (OpenAI allows them) raise the logits. */
    p = params_plain(0.0f);
    p.presence_penalty = -1.0f;
    p.frequency_penalty = -0.5f;
    s = make_sampler(&p, N_VOCAB);
    memcpy(work, logits, sizeof logits);
    sampler_sample(s, work, history, LLMOPT_ARRAY_LEN(history), NULL);
    CHECK(work[11] == logits[11] + 1.0f + 2 * 0.5f);
    sampler_free(s);
}

static void test_nan_and_inf(void) {
    float logits[N_VOCAB], work[N_VOCAB];
    fill_logits(logits, N_VOCAB, 1.0f);
    for (int i = 0; i < N_VOCAB; i += 3) logits[i] = NAN;
    for (int i = 1; i < N_VOCAB; i += 3) logits[i] = -INFINITY;
    const int top_ks[] = {0, 10};
    const float top_ps[] = {1.0f, 0.9f};
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++) {
            struct sampler_params p = params_plain(3.0f);
            p.top_k = top_ks[a];
            p.top_p = top_ps[b];
            p.seed = (uint64_t)(a * 2 + b);
            struct sampler *s = make_sampler(&p, N_VOCAB);
            for (int i = 0; i < 2000; i++) {
                float prob = -1.0f;
                int32_t t = draw(s, logits, work, N_VOCAB, &prob);
                if (t % 3 != 2 || !(prob > 0.0f && prob <= 1.0f)) {
                    CHECK_MSG(0, "top_k %d top_p %g: drew %d (logit %g) prob %g",
                              top_ks[a], (double)top_ps[b], t, (double)logits[t],
                              (double)prob);
                    break;
                }
            }
            sampler_free(s);
        }

    /* +inf logits: drawn (uniformly among themselves) and nothing else is. */
    fill_logits(logits, N_VOCAB, 1.0f);
    logits[17] = INFINITY;
    logits[400] = INFINITY;
    struct sampler_params p = params_plain(1.0f);
    struct sampler *s = make_sampler(&p, N_VOCAB);
    int n17 = 0, n400 = 0;
    for (int i = 0; i < 2000; i++) {
        float prob = 0.0f;
        int32_t t = draw(s, logits, work, N_VOCAB, &prob);
        n17 += t == 17;
        n400 += t == 400;
        CHECK(prob == 0.5f);
    }
    CHECK_EQ_INT(n17 + n400, 2000);
    CHECK(n17 > 800 && n400 > 800);
    sampler_free(s);

    /* Everything masked: token 0 with probability 0, greedy or not. */
    for (int i = 0; i < N_VOCAB; i++) logits[i] = i % 2 ? NAN : -INFINITY;
    for (int greedy = 0; greedy < 2; greedy++) {
        p = params_plain(greedy ? 0.0f : 1.0f);
        p.top_k = greedy ? 0 : 5;
        s = make_sampler(&p, N_VOCAB);
        float prob = -1.0f;
        CHECK_EQ_INT(draw(s, logits, work, N_VOCAB, &prob), 0);
        CHECK(prob == 0.0f);
        sampler_free(s);
    }

    /* One finite logit left: always it. */
    logits[123] = -1000.0f;
    p = params_plain(0.7f);
    sampler_params_default(&p);
    s = make_sampler(&p, N_VOCAB);
    float prob = 0.0f;
    CHECK_EQ_INT(draw(s, logits, work, N_VOCAB, &prob), 123);
    CHECK(prob == 1.0f);
    sampler_free(s);
}

static const float *sort_logits;

/* qsort order for token ids: rank order (higher logit, then lower id). */
static int cmp_rank(const void *pa, const void *pb) {
    int a = *(const int *)pa, b = *(const int *)pb;
    if (sort_logits[a] != sort_logits[b]) return sort_logits[a] > sort_logits[b] ? -1 : 1;
    return (a > b) - (a < b);
}

/* The default chain on a realistic vocab: each draw is one of the top 40 and clears
 * the top-p and min-p bars, computed here independently. */
static void test_default_chain_large_vocab(void) {
    enum { N = 32000, K = 40 };
    static float logits[N], work[N];
    static double sm[N];
    fill_logits(logits, N, 3.0f);
    struct sampler_params p;
    sampler_params_default(&p);
    p.seed = 31337;
    struct sampler *s = make_sampler(&p, N);

    /* Reference: top-K by rank, softmax over them at T, top-p prefix, min-p. */
    static int order[N];
    for (int i = 0; i < N; i++) order[i] = i;
    sort_logits = logits;
    qsort(order, N, sizeof order[0], cmp_rank);
    double z = 0.0, pk[K];
    for (int r = 0; r < K; r++) z += pk[r] = exp((logits[order[r]] - logits[order[0]]) / 0.8);
    int allowed = 0;
    double cum = 0.0;
    for (int r = 0; r < K; r++) {
        if (pk[r] < 0.05 * pk[0]) break;
        allowed = r + 1;
        cum += pk[r] / z;
        if (cum >= 0.95) break;
    }
    for (int i = 0; i < N; i++) sm[i] = 0.0;
    for (int r = 0; r < allowed; r++) sm[order[r]] = 1.0;
    int distinct = 0;
    for (int i = 0; i < 3000; i++) {
        int32_t t = draw(s, logits, work, N, NULL);
        if (sm[t] == 0.0) {
            CHECK_MSG(0, "drew %d (logit %g); %d allowed", t, (double)logits[t], allowed);
            break;
        }
        if (sm[t] == 1.0) distinct++;
        sm[t] = 2.0;
    }
    CHECK_MSG(allowed > 3 && distinct == allowed, "%d allowed, %d drawn", allowed,
              distinct);
    sampler_free(s);
}

/* top-p with top-k off, on a large vocab and several logit spreads (the nucleus
 * ranges from a few tokens to thousands): every draw lies in the exact reference set,
 * and prob_out is p / (mass of that set), so a set with a wrong member fails too. */
static void test_top_p_large_vocab(void) {
    enum { N = 32000 };
    static float logits[N], work[N];
    static int order[N];
    static unsigned char in_set[N];
    const float scales[] = {0.3f, 1.0f, 4.0f};
    const float top_ps[] = {0.5f, 0.9f, 0.99f};
    const float min_ps[] = {0.0f, 0.05f};
    int case_no = 0;
    for (size_t si = 0; si < LLMOPT_ARRAY_LEN(scales); si++)
        for (size_t pi = 0; pi < LLMOPT_ARRAY_LEN(top_ps); pi++)
            for (size_t mi = 0; mi < LLMOPT_ARRAY_LEN(min_ps); mi++, case_no++) {
                fill_logits(logits, N, scales[si]);
                const double temperature = 0.9;
                for (int i = 0; i < N; i++) order[i] = i;
                sort_logits = logits;
                qsort(order, N, sizeof order[0], cmp_rank);
                double z = 0.0, z_set = 0.0, cum = 0.0;
                const double max = logits[order[0]];
                for (int i = 0; i < N; i++) z += exp((logits[i] - max) / temperature);
                memset(in_set, 0, sizeof in_set);
                int n_set = 0;
                for (int r = 0; r < N; r++) {
                    double pr = exp((logits[order[r]] - max) / temperature);
                    if (pr < min_ps[mi]) break;
                    in_set[order[r]] = 1;
                    n_set++;
                    z_set += pr;
                    cum += pr / z;
                    if (cum >= top_ps[pi]) break;
                }
                struct sampler_params p = params_plain((float)temperature);
                p.top_p = top_ps[pi];
                p.min_p = min_ps[mi];
                p.seed = 500 + (uint64_t)case_no;
                struct sampler *s = make_sampler(&p, N);
                int bad = 0;
                for (int i = 0; i < 100 && !bad; i++) {
                    float prob = 0.0f;
                    int32_t t = draw(s, logits, work, N, &prob);
                    double want = exp((logits[t] - max) / temperature) / z_set;
                    if (!in_set[t] || fabs(prob - want) > 1e-4 * want + 1e-7) {
                        CHECK_MSG(0,
                                  "scale %g top_p %g min_p %g: token %d in set %d, prob %g "
                                  "want %g (set of %d)",
                                  (double)scales[si], (double)top_ps[pi],
                                  (double)min_ps[mi], t, in_set[t], (double)prob, want,
                                  n_set);
                        bad = 1;
                    }
                }
                sampler_free(s);
            }
}

/* ---- sampling from ranked candidates (a device backend's path) ---- */

struct ranked_entry {
    int32_t id;
    float logit; /* sanitized */
};

static int ranked_cmp(const void *a, const void *b) {
    const struct ranked_entry *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* What a backend hands over: the row penalized by the pair list, every entry ranked
 * (sanitized logit, then id), the best n of them. */
static int rank_penalized(const struct sampler_params *p, const float *logits, int n_vocab,
                          const int32_t *ids, const int32_t *counts, int32_t n_pairs,
                          struct ranked_entry *all, int n, int32_t *out_ids, float *out_logits) {
    float *row = malloc((size_t)n_vocab * sizeof *row);
    memcpy(row, logits, (size_t)n_vocab * sizeof *row);
    for (int32_t j = 0; j < n_pairs; j++) row[ids[j]] = sampler_penalize(p, row[ids[j]], counts[j]);
    for (int i = 0; i < n_vocab; i++) {
        float l = row[i];
        if (isnan(l)) l = -INFINITY;
        if (l == INFINITY) l = FLT_MAX;
        all[i] = (struct ranked_entry){i, l};
    }
    free(row);
    qsort(all, (size_t)n_vocab, sizeof *all, ranked_cmp);
    if (n > n_vocab) n = n_vocab;
    for (int j = 0; j < n; j++) {
        out_ids[j] = all[j].id;
        out_logits[j] = all[j].logit;
    }
    return n;
}

/* sampler_sample_ranked on the best k of the penalized row gives sampler_sample's id on
 * the whole row, draw after draw (the PRNG states stay in step), for greedy and top-k
 * chains with penalties, ties, NaN and infinities. */
static void test_ranked_matches_sample(void) {
    enum { V = 3000, STEPS = 40 };
    float *logits = malloc(V * sizeof *logits), *work = malloc(V * sizeof *work);
    float *cl = malloc(SAMPLER_RANKED_MAX * sizeof *cl);
    int32_t *cid = malloc(SAMPLER_RANKED_MAX * sizeof *cid);
    struct ranked_entry *all = malloc(V * sizeof *all);
    int32_t pen_ids[256], pen_counts[256], history[STEPS + 100];
    const struct {
        float temperature, top_p, min_p, repeat, presence, frequency;
        int32_t top_k, last_n;
    } cases[] = {
        {0.0f, 1.0f, 0.0f, 1.3f, 0.0f, 0.0f, 0, 64},        /* greedy with a penalty */
        {0.8f, 0.95f, 0.05f, 1.0f, 0.0f, 0.0f, 40, 64},     /* the CLI default */
        {1.0f, 1.0f, 0.0f, 1.1f, 0.4f, 0.2f, 1, 32},        /* top-k 1 */
        {1.5f, 0.9f, 0.0f, 1.2f, -0.5f, 0.3f, 256, -1},     /* the cap, whole history */
        {0.7f, 0.5f, 0.1f, 0.8f, 0.0f, 0.0f, 7, 16},
        {2.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 100, 64},
    };
    for (size_t c = 0; c < LLMOPT_ARRAY_LEN(cases); c++) {
        struct sampler_params p = params_plain(cases[c].temperature);
        p.top_k = cases[c].top_k;
        p.top_p = cases[c].top_p;
        p.min_p = cases[c].min_p;
        p.repeat_penalty = cases[c].repeat;
        p.presence_penalty = cases[c].presence;
        p.frequency_penalty = cases[c].frequency;
        p.repeat_last_n = cases[c].last_n;
        p.seed = 77 + c;
        struct sampler *whole = make_sampler(&p, V), *ranked = make_sampler(&p, V);
        const int32_t k = sampler_device_k(ranked);
        CHECK_MSG(k == (p.temperature <= 0.0f ? 1 : p.top_k), "case %zu: device k %d", c, k);
        int32_t n_hist = 0;
        for (int i = 0; i < 60; i++) history[n_hist++] = (int32_t)(test_rng_next() % 40); /* repeats */
        for (int step = 0; step < STEPS; step++) {
            fill_logits(logits, V, 1.0f + (float)(step % 3));
            for (int i = 0; i < V; i += 97) logits[i] = logits[(i + 1) % V]; /* ties */
            logits[(step * 13) % V] = NAN;
            logits[(step * 17 + 5) % V] = -INFINITY;
            if (step % 5 == 0) logits[(step * 19 + 7) % V] = INFINITY;
            if (step % 7 == 0) logits[history[n_hist - 1]] = 8.0f; /* a penalized favourite */
            int32_t n_pairs = sampler_penalty_list(ranked, history, (size_t)n_hist, pen_ids, pen_counts, 256);
            CHECK_MSG(n_pairs >= 0, "case %zu step %d: %d pairs", c, step, n_pairs);
            int n = rank_penalized(&p, logits, V, pen_ids, pen_counts, n_pairs, all, k, cid, cl);
            memcpy(work, logits, V * sizeof *work);
            const int32_t want = sampler_sample(whole, work, history, (size_t)n_hist, NULL);
            const int32_t got = sampler_sample_ranked(ranked, cid, cl, n);
            if (got != want) {
                CHECK_MSG(0, "case %zu step %d: ranked %d, whole row %d", c, step, got, want);
                break;
            }
            history[n_hist++] = got;
        }
        sampler_free(whole);
        sampler_free(ranked);
    }
    /* top-k off, or at least the vocabulary, or above the cap: the whole row */
    struct sampler_params p = params_plain(1.0f);
    struct sampler *s = make_sampler(&p, V);
    CHECK_EQ_INT(sampler_device_k(s), 0);
    sampler_free(s);
    p.top_k = SAMPLER_RANKED_MAX + 1;
    s = make_sampler(&p, V);
    CHECK_EQ_INT(sampler_device_k(s), 0);
    sampler_free(s);
    p.top_k = 10;
    s = make_sampler(&p, 10);
    CHECK_EQ_INT(sampler_device_k(s), 0);
    sampler_free(s);

    /* Fewer finite logits than k: the candidates end at the first -inf. */
    p.top_k = 5;
    s = make_sampler(&p, V);
    struct sampler *w = make_sampler(&p, V);
    for (int i = 0; i < V; i++) logits[i] = -INFINITY;
    logits[10] = 1.0f;
    logits[20] = 2.0f;
    int n = rank_penalized(&p, logits, V, NULL, NULL, 0, all, 5, cid, cl);
    for (int i = 0; i < 8; i++) {
        memcpy(work, logits, V * sizeof *work);
        CHECK_EQ_INT(sampler_sample_ranked(s, cid, cl, n), sampler_sample(w, work, NULL, 0, NULL));
    }
    for (int i = 0; i < V; i++) logits[i] = NAN;
    n = rank_penalized(&p, logits, V, NULL, NULL, 0, all, 5, cid, cl);
    CHECK_EQ_INT(sampler_sample_ranked(s, cid, cl, n), 0);
    sampler_free(s);
    sampler_free(w);

    /* The pair list: first appearances in order, counts, -1 past the cap, and the next
     * call unaffected by the one that overflowed. */
    p = params_plain(1.0f);
    p.repeat_penalty = 1.1f;
    p.repeat_last_n = 6;
    s = make_sampler(&p, V);
    const int32_t h[] = {9, 4, 4, 7, -3, 4, 9, 5000};
    int32_t n_pairs = sampler_penalty_list(s, h, LLMOPT_ARRAY_LEN(h), pen_ids, pen_counts, 64);
    CHECK_EQ_INT(n_pairs, 3); /* window {4, 7, -3, 4, 9, 5000}: 4 x2, 7, 9 */
    CHECK(pen_ids[0] == 4 && pen_counts[0] == 2 && pen_ids[1] == 7 && pen_counts[1] == 1 &&
          pen_ids[2] == 9 && pen_counts[2] == 1);
    CHECK_EQ_INT(sampler_penalty_list(s, h, LLMOPT_ARRAY_LEN(h), pen_ids, pen_counts, 2), -1);
    CHECK_EQ_INT(sampler_penalty_list(s, h, LLMOPT_ARRAY_LEN(h), pen_ids, pen_counts, 3), 3);
    CHECK(pen_counts[0] == 2 && pen_counts[1] == 1 && pen_counts[2] == 1);
    sampler_free(s);
    p.repeat_penalty = 1.0f; /* penalties off: no pairs */
    s = make_sampler(&p, V);
    CHECK_EQ_INT(sampler_penalty_list(s, h, LLMOPT_ARRAY_LEN(h), pen_ids, pen_counts, 64), 0);
    sampler_free(s);
    free(logits);
    free(work);
    free(cl);
    free(cid);
    free(all);
}

/* sample_exp: 1 at 0, 0 at -inf and at or below -87, within 1.5 ulp of e^x above;
 * sample_exp4 (SSE2) the same bits lane by lane. */
static void test_sample_exp(void) {
    CHECK(sample_exp(0.0f) == 1.0f && sample_exp(-0.0f) == 1.0f);
    CHECK(sample_exp(-INFINITY) == 0.0f && sample_exp(NAN) == 0.0f && sample_exp(-200.0f) == 0.0f &&
          sample_exp(-87.0f) == 0.0f && sample_exp(-86.99f) > 0.0f);
    enum { N = 200000 };
    float *xs = malloc(N * sizeof *xs);
    double worst = 0.0;
    for (int i = 0; i < N; i++) {
        float x = -87.0f * test_uniform();
        if (i < 1000) x = -(float)i * 1e-3f; /* near 0 */
        if (i % 997 == 0) x = i % 2 ? NAN : -INFINITY;
        if (i % 991 == 0) x = -87.0f - (float)(i % 7);
        xs[i] = x;
        if (!(x > -87.0f)) continue;
        const double want = exp((double)x), got = sample_exp(x);
        const double e = fabs(got - want) / ldexp(1.0, ilogb(want) - 23);
        worst = e > worst ? e : worst;
    }
    CHECK_MSG(worst <= 1.5, "sample_exp: worst error %.2f ulp", worst);
#if defined(__SSE2__)
    int differ = 0;
    for (int i = 0; i + 4 <= N; i += 4) {
        float v[4];
        _mm_storeu_ps(v, sample_exp4(_mm_loadu_ps(xs + i)));
        for (int l = 0; l < 4; l++) {
            const float a = sample_exp(xs[i + l]);
            differ += memcmp(&a, &v[l], sizeof a) != 0;
        }
    }
    CHECK_MSG(differ == 0, "sample_exp4: %d of %d lanes differ from sample_exp", differ, N);
#endif
    free(xs);
}

/* The whole-row draw (top-k and top-p off) against the rule a device reproduces,
 * written over the whole vocabulary: probabilities of the finite logits, kept where
 * > 0 and >= min_p, summed in SAMPLE_DRAW_BLOCK blocks, the next uniform (peeked,
 * then taken by the draw) times the sum, walked as (earlier blocks) + (block so far). */
static int32_t draw_rule(const float *logits, int n, float temperature, float min_p, double u) {
    float max = -INFINITY;
    for (int i = 0; i < n; i++) {
        float l = isnan(logits[i]) ? -INFINITY : logits[i] == INFINITY ? FLT_MAX : logits[i];
        max = l > max ? l : max;
    }
    if (max == -INFINITY) return -1;
    double sums[64] = {0}, z = 0.0;
    const int nb = (n + SAMPLE_DRAW_BLOCK - 1) / SAMPLE_DRAW_BLOCK;
    float *p = malloc((size_t)n * sizeof *p);
    int32_t last = -1;
    for (int i = 0; i < n; i++) {
        float l = isnan(logits[i]) ? -INFINITY : logits[i] == INFINITY ? FLT_MAX : logits[i];
        p[i] = l == -INFINITY ? 0.0f : sample_exp((l - max) / temperature);
        if (!(p[i] > 0.0f && p[i] >= min_p)) p[i] = 0.0f;
        sums[i / SAMPLE_DRAW_BLOCK] += p[i];
        if (p[i] > 0.0f) last = i;
    }
    for (int b = 0; b < nb; b++) z += sums[b];
    const double target = u * z;
    double before = 0.0;
    int32_t pick = last;
    for (int b = 0; b < nb && pick == last; b++) {
        if (target < before + sums[b]) {
            double sb = 0.0;
            for (int i = b * SAMPLE_DRAW_BLOCK; i < n && i < (b + 1) * SAMPLE_DRAW_BLOCK; i++)
                if (p[i] > 0.0f) {
                    sb += p[i];
                    if (target < before + sb) {
                        pick = i;
                        break;
                    }
                }
            break;
        }
        before += sums[b];
    }
    free(p);
    return pick;
}

static void test_full_draw_rule(void) {
    enum { V = 3000 };
    float logits[V], work[V];
    const struct {
        float temperature, min_p, scale;
        int32_t top_k;
    } cases[] = {{1.0f, 0.0f, 1.0f, 0}, {0.7f, 0.05f, 3.0f, 0}, {1.5f, 0.0f, 0.3f, V}, {0.05f, 0.0f, 2.0f, -1}};
    for (size_t c = 0; c < LLMOPT_ARRAY_LEN(cases); c++) {
        struct sampler_params p = params_plain(cases[c].temperature);
        p.min_p = cases[c].min_p;
        p.top_k = cases[c].top_k;
        p.seed = 900 + c;
        struct sampler *s = make_sampler(&p, V);
        CHECK(sampler_device_full(s) && sampler_device_k(s) == 0);
        for (int step = 0; step < 300; step++) {
            fill_logits(logits, V, cases[c].scale);
            logits[(step * 7) % V] = NAN;
            logits[(step * 11 + 1) % V] = -INFINITY;
            if (step % 50 == 0) logits[(step * 13 + 2) % V] = INFINITY;
            const double u = sampler_peek_uniform(s);
            CHECK(u == sampler_peek_uniform(s)); /* a peek takes nothing */
            const int32_t want = draw_rule(logits, V, p.temperature, p.min_p, u);
            memcpy(work, logits, sizeof logits);
            const int32_t got = sampler_sample(s, work, NULL, 0, NULL);
            if (got != want) {
                CHECK_MSG(0, "case %zu step %d: sampler %d, rule %d", c, step, got, want);
                break;
            }
        }
        sampler_free(s);
    }
    /* top-p or a top-k below the vocabulary: not a whole-row draw */
    struct sampler_params p = params_plain(1.0f);
    p.top_p = 0.9f;
    struct sampler *s = make_sampler(&p, V);
    CHECK(!sampler_device_full(s));
    sampler_free(s);
    p = params_plain(0.0f);
    s = make_sampler(&p, V);
    CHECK(!sampler_device_full(s));
    sampler_free(s);
    /* the PRNG advances once a draw, as sampler_take_uniform does */
    p = params_plain(1.0f);
    struct sampler *a = make_sampler(&p, V), *b = make_sampler(&p, V);
    fill_logits(logits, V, 1.0f);
    memcpy(work, logits, sizeof logits);
    sampler_sample(a, work, NULL, 0, NULL);
    sampler_take_uniform(b);
    CHECK(sampler_peek_uniform(a) == sampler_peek_uniform(b));
    for (int i = 0; i < V; i++) work[i] = -INFINITY; /* nothing to draw: nothing taken */
    const double before = sampler_peek_uniform(a);
    CHECK_EQ_INT(sampler_sample(a, work, NULL, 0, NULL), 0);
    CHECK(sampler_peek_uniform(a) == before);
    sampler_free(a);
    sampler_free(b);
}

/* z as a device computes it for sampler_sample_nucleus: every finite (sanitized)
 * logit's sample_exp((l - max) / temperature), summed in id order within blocks of
 * SAMPLE_DRAW_BLOCK ids, then the blocks' sums in order. */
static double device_z(const float *row, int n, float temperature) {
    float max = -INFINITY;
    for (int i = 0; i < n; i++) {
        float l = isnan(row[i]) ? -INFINITY : row[i] == INFINITY ? FLT_MAX : row[i];
        max = l > max ? l : max;
    }
    double z = 0.0;
    for (int b = 0; b < n; b += SAMPLE_DRAW_BLOCK) {
        double sb = 0.0;
        for (int i = b; i < n && i < b + SAMPLE_DRAW_BLOCK; i++) {
            float l = isnan(row[i]) ? -INFINITY : row[i] == INFINITY ? FLT_MAX : row[i];
            if (l != -INFINITY) sb += sample_exp((l - max) / temperature);
        }
        z += sb;
    }
    return z;
}

/* Top-p without top-k from the best SAMPLER_RANKED_MAX candidates and the device's z:
 * sampler_sample_nucleus gives sampler_sample's id on the whole row, draw after draw,
 * or -1 having drawn nothing, and then sampler_sample_penalized on the penalized row
 * does. Peaked rows (small sets, answered from the candidates), flat ones (sets of
 * thousands: -1), min-p that takes the mass (the whole-row draw from the candidates),
 * rows with fewer finite logits than candidates, penalties, NaN and infinities, over
 * one and several draw blocks. */
static void test_nucleus_matches_sample(void) {
    enum { VMAX = 40000, STEPS = 30 };
    float *logits = malloc(VMAX * sizeof *logits), *work = malloc(VMAX * sizeof *work);
    float *pen = malloc(VMAX * sizeof *pen);
    float *cl = malloc(SAMPLER_RANKED_MAX * sizeof *cl);
    int32_t *cid = malloc(SAMPLER_RANKED_MAX * sizeof *cid);
    struct ranked_entry *all = malloc(VMAX * sizeof *all);
    int32_t pen_ids[256], pen_counts[256], history[STEPS + 100];
    const struct {
        int vocab;
        float scale, temperature, top_p, min_p, repeat;
        int finite; /* 0: every logit finite, else only this many */
    } cases[] = {
        {3000, 6.0f, 0.8f, 0.9f, 0.0f, 1.0f, 0},    {40000, 8.0f, 1.0f, 0.95f, 0.05f, 1.1f, 0},
        {40000, 5.0f, 0.7f, 0.5f, 0.0f, 1.3f, 0},   {40000, 0.3f, 1.0f, 0.9f, 0.0f, 1.0f, 0},
        {3000, 1.0f, 1.5f, 0.99f, 0.0f, 1.0f, 0},   {40000, 2.0f, 1.0f, 0.99f, 0.3f, 1.0f, 0},
        {40000, 1.0f, 0.9f, 0.95f, 0.0f, 1.2f, 100}, {700, 3.0f, 1.2f, 0.8f, 0.02f, 1.0f, 0},
    };
    int direct = 0, fallback = 0, id_order = 0;
    for (size_t c = 0; c < LLMOPT_ARRAY_LEN(cases); c++) {
        const int V = cases[c].vocab;
        struct sampler_params p = params_plain(cases[c].temperature);
        p.top_p = cases[c].top_p;
        p.min_p = cases[c].min_p;
        p.repeat_penalty = cases[c].repeat;
        p.presence_penalty = cases[c].repeat != 1.0f ? 0.2f : 0.0f;
        p.repeat_last_n = 64;
        p.seed = 900 + c;
        struct sampler *whole = make_sampler(&p, V), *nuc = make_sampler(&p, V);
        CHECK(sampler_device_nucleus(nuc) && sampler_device_k(nuc) == 0 && !sampler_device_full(nuc));
        int32_t n_hist = 0;
        for (int i = 0; i < 60; i++) history[n_hist++] = (int32_t)(test_rng_next() % 40);
        for (int step = 0; step < STEPS; step++) {
            fill_logits(logits, V, cases[c].scale);
            for (int i = 0; i < V; i += 97) logits[i] = logits[(i + 1) % V]; /* ties */
            logits[(step * 13) % V] = NAN;
            logits[(step * 17 + 5) % V] = -INFINITY;
            if (step % 5 == 0) logits[(step * 19 + 7) % V] = INFINITY;
            if (cases[c].finite)
                for (int i = cases[c].finite; i < V; i++) logits[(i * 7919) % V] = -INFINITY;
            const int32_t n_pairs = sampler_penalty_list(nuc, history, (size_t)n_hist, pen_ids, pen_counts, 256);
            CHECK(n_pairs >= 0);
            memcpy(pen, logits, (size_t)V * sizeof *pen);
            for (int32_t j = 0; j < n_pairs; j++) pen[pen_ids[j]] = sampler_penalize(&p, pen[pen_ids[j]], pen_counts[j]);
            const int n = rank_penalized(&p, logits, V, pen_ids, pen_counts, n_pairs, all, SAMPLER_RANKED_MAX, cid, cl);
            int nf = 0; /* the device pads a row of fewer finite entries */
            while (nf < n && cl[nf] != -INFINITY) nf++;
            for (int j = nf; j < n; j++) cid[j] = -1;
            memcpy(work, logits, (size_t)V * sizeof *work);
            const int32_t want = sampler_sample(whole, work, history, (size_t)n_hist, NULL);
            const double before = sampler_peek_uniform(nuc);
            int32_t got = sampler_sample_nucleus(nuc, cid, cl, n, device_z(pen, V, p.temperature));
            if (got < 0) {
                CHECK(sampler_peek_uniform(nuc) == before); /* drew nothing */
                CHECK(!sampler_device_nucleus(nuc));        /* the next draws ask for whole rows */
                got = sampler_sample_penalized(nuc, pen, NULL);
                fallback++;
            } else {
                direct++;
                id_order += cases[c].min_p >= 0.3f;
            }
            if (got != want) {
                CHECK_MSG(0, "case %zu step %d: nucleus %d, whole row %d", c, step, got, want);
                break;
            }
            history[n_hist++] = got;
        }
        sampler_free(whole);
        sampler_free(nuc);
    }
    fprintf(stderr, "    nucleus: %d draws from the candidates (%d with min-p 0.3), %d from the row\n", direct,
            id_order, fallback);
    CHECK(direct > 0 && fallback > 0 && id_order > 0);
    /* after a miss, NUCLEUS_RETRY (32) whole-row draws, then the candidates again */
    struct sampler_params p = params_plain(1.0f);
    p.top_p = 0.9f;
    struct sampler *s = make_sampler(&p, 1000);
    fill_logits(logits, 1000, 0.1f); /* flat: a set of ~900 */
    const int n = rank_penalized(&p, logits, 1000, NULL, NULL, 0, all, SAMPLER_RANKED_MAX, cid, cl);
    CHECK(sampler_device_nucleus(s));
    CHECK_EQ_INT(sampler_sample_nucleus(s, cid, cl, n, device_z(logits, 1000, 1.0f)), -1);
    for (int i = 0; i < 32; i++) {
        CHECK(!sampler_device_nucleus(s));
        memcpy(work, logits, 1000 * sizeof *work);
        sampler_sample(s, work, NULL, 0, NULL);
    }
    CHECK(sampler_device_nucleus(s));
    sampler_free(s);
    free(logits);
    free(work);
    free(pen);
    free(cl);
    free(cid);
    free(all);
}

TEST_MAIN(test_defaults_and_validation, test_greedy_is_argmax, test_greedy_matches_reference, test_seed_determinism,
          test_prng_golden, test_top_k_one_is_greedy, test_top_k_stays_in_top_k, test_top_p, test_min_p,
          test_frequencies_match_softmax, test_temperature_scaling, test_repeat_penalty,
          test_presence_frequency, test_nan_and_inf, test_default_chain_large_vocab,
          test_top_p_large_vocab, test_ranked_matches_sample, test_sample_exp,
          test_full_draw_rule, test_nucleus_matches_sample)
