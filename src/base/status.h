/* Status codes and the error-message convention shared by every module.
 *
 * Recoverable failures return an `enum llmopt_status` and write a message into a
 * caller-provided `struct llmopt_err` saying what was expected and what was found
 * (file, field, tensor, offset). Broken invariants abort through LLMOPT_ASSERT. */
#ifndef LLMOPT_BASE_STATUS_H
#define LLMOPT_BASE_STATUS_H

#include "llmopt.h"

#include <stdio.h>
#include <stdlib.h>

/* Formats a message into err (if non-NULL) and returns status; use as
 * `return err_set(err, LLMOPT_ERR_FORMAT, "gguf: ...", ...)`. */
enum llmopt_status err_set(struct llmopt_err *err, enum llmopt_status status,
                           const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prepends "prefix: " to the message already in err (context while unwinding). */
void err_prefix(struct llmopt_err *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define LLMOPT_ASSERT(cond)                                                        \
    do {                                                                           \
        if (!(cond)) {                                                             \
            fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__, __LINE__,   \
                    #cond);                                                        \
            abort();                                                               \
        }                                                                          \
    } while (0)

#define LLMOPT_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif
