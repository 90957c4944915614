/* Minimal test harness: CHECK records a failure and continues; each test file ends
 * with TEST_MAIN(fn, fn, ...), which prints "N passed, N failed" and exits non-zero
 * on any failure. */
#ifndef LLMOPT_TEST_H
#define LLMOPT_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int test_failures_in_current;

/* True under the sanitizer stage of `make test` (LLMOPT_TEST_SANITIZED=1): the slowest
 * sweeps run a subset there (the release stage runs them whole); sanitizers look for
 * memory errors, which every code path still meets in the subset. */
static inline int test_sanitized(void) {
    const char *e = getenv("LLMOPT_TEST_SANITIZED");
    return e && *e && strcmp(e, "0") != 0;
}

#define CHECK(cond)                                                                \
    do {                                                                           \
        if (!(cond)) {                                                             \
            fprintf(stderr, "  %s:%d: CHECK failed: %s\n", __FILE__, __LINE__,     \
                    #cond);                                                        \
            test_failures_in_current++;                                            \
        }                                                                          \
    } while (0)

#define CHECK_MSG(cond, ...)                                                       \
    do {                                                                           \
        if (!(cond)) {                                                             \
            fprintf(stderr, "  %s:%d: CHECK failed: %s: ", __FILE__, __LINE__,     \
                    #cond);                                                        \
            fprintf(stderr, __VA_ARGS__);                                          \
            fputc('\n', stderr);                                                   \
            test_failures_in_current++;                                            \
        }                                                                          \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                         \
    do {                                                                           \
        long long check_a_ = (long long)(a), check_b_ = (long long)(b);           \
        if (check_a_ != check_b_) {                                                \
            fprintf(stderr, "  %s:%d: CHECK failed: %s == %s (%lld vs %lld)\n",    \
                    __FILE__, __LINE__, #a, #b, check_a_, check_b_);               \
            test_failures_in_current++;                                            \
        }                                                                          \
    } while (0)

typedef void (*test_fn)(void);

static inline int test_run_all(const char *const *names, const test_fn *fns, int n) {
    int passed = 0, failed = 0;
    for (int i = 0; i < n; i++) {
        test_failures_in_current = 0;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        fns[i]();
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        if (test_failures_in_current) {
            fprintf(stderr, "FAIL %s (%.1f s)\n", names[i] ? names[i] : "?", s);
            failed++;
        } else {
            fprintf(stderr, "ok   %s (%.1f s)\n", names[i] ? names[i] : "?", s);
            passed++;
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

#define TEST_MAIN(...)                                                             \
    int main(void) {                                                               \
        const test_fn fns[] = {__VA_ARGS__};                                       \
        char names_buf[] = #__VA_ARGS__;                                           \
        const char *names[sizeof fns / sizeof fns[0]] = {0};                             \
        int n = (int)(sizeof fns / sizeof fns[0]), k = 0;                          \
        char *save = NULL;                                                         \
        for (char *tok = strtok_r(names_buf, ", ", &save); tok && k < n;          \
             tok = strtok_r(NULL, ", ", &save))                                    \
            names[k++] = tok;                                                      \
        return test_run_all(names, fns, n);                                        \
    }

#endif
