/* splitmix64 random numbers for tests. rng_seed_fresh() picks a fresh seed per run
 * (printed; $LLMOPT_TEST_SEED repeats it); tests that want a fixed stream set
 * rng_state themselves, or define TEST_RNG_SEED before including this. */
#ifndef LLMOPT_TEST_RNG_H
#define LLMOPT_TEST_RNG_H

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#ifndef TEST_RNG_SEED
#define TEST_RNG_SEED 0
#endif

static uint64_t rng_state = TEST_RNG_SEED;

static inline uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [-1, 1) */
static inline float rng_float(void) {
    return (float)((double)(rng_next() >> 11) * 0x1p-52 - 1.0);
}

static inline void rng_seed_fresh(const char *what) {
    const char *env = getenv("LLMOPT_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) ^ (uint64_t)getpid();
    rng_state = seed;
    for (const char *c = what; *c; c++) /* a different stream per test */
        rng_state = rng_state * 31 + (unsigned char)*c;
    fprintf(stderr, "  %s: seed %" PRIu64 " (set LLMOPT_TEST_SEED to repeat)\n", what, seed);
}

#endif
