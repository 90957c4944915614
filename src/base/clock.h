/* Monotonic time for measuring intervals (CLOCK_MONOTONIC; never a date). */
#ifndef LLMOPT_BASE_CLOCK_H
#define LLMOPT_BASE_CLOCK_H

#include <time.h>

/* Seconds since an unspecified start, for differences only. */
static inline double clock_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
