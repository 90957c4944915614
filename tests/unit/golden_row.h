/* One logits row against a PyTorch golden row (a JSON array of n numbers): the
 * relative error max |got - want| / max |want| and the row's argmax. Shared by the
 * golden tests of every backend (test_golden.c, test_cuda.c). */
#ifndef LLMOPT_TEST_GOLDEN_ROW_H
#define LLMOPT_TEST_GOLDEN_ROW_H

#include <jansson.h>
#include <math.h>

static inline double golden_row_error(const float *got, const json_t *want, int n, int *argmax) {
    double max_ref = 0, max_diff = 0;
    int best = 0;
    for (int v = 0; v < n; v++) {
        double w = json_number_value(json_array_get(want, (size_t)v));
        double d = fabs((double)got[v] - w);
        max_ref = fabs(w) > max_ref ? fabs(w) : max_ref;
        max_diff = d > max_diff ? d : max_diff;
        if (got[v] > got[best]) best = v;
    }
    *argmax = best;
    return max_ref > 0 ? max_diff / max_ref : max_diff;
}

#endif
