/* Expressions in graph files: shapes and numeric attributes such as
 * "n_heads*head_dim", "head_dim/2", "head_dim^-0.5", "N". See docs/formats/graph.md.
 *
 * Evaluation yields a monomial coef * N^n_pow * M^m_pow, so a shape keeps the token
 * count N (or output-row count M) symbolic while every other symbol is a number. */
#ifndef LLMOPT_IR_EXPR_H
#define LLMOPT_IR_EXPR_H

#include "base/status.h"

#include <stdbool.h>
#include <stdint.h>

#define EXPR_MAX_LEN 256

struct expr_value {
    double coef;
    int n_pow; /* power of N */
    int m_pow; /* power of M */
};

/* Looks up a symbol's value; returns false when unknown. N and M are handled by the
 * evaluator itself. */
typedef bool (*expr_lookup_fn)(void *ctx, const char *name, size_t len, double *value);

enum llmopt_status expr_eval(const char *text, expr_lookup_fn lookup, void *ctx,
                             struct expr_value *out, struct llmopt_err *err);

/* Convenience: a plain number (no N/M allowed). */
enum llmopt_status expr_eval_number(const char *text, expr_lookup_fn lookup, void *ctx,
                                    double *out, struct llmopt_err *err);

#endif
