#include "base/status.h"

#include <stdarg.h>
#include <string.h>

static const char *const status_names[LLMOPT_STATUS_COUNT] = {
    [LLMOPT_OK] = "ok",
    [LLMOPT_ERR_IO] = "i/o error",
    [LLMOPT_ERR_FORMAT] = "malformed input",
    [LLMOPT_ERR_UNSUPPORTED] = "unsupported",
    [LLMOPT_ERR_NOMEM] = "out of memory",
    [LLMOPT_ERR_INVALID_ARG] = "invalid argument",
    [LLMOPT_ERR_BIND] = "parameters do not bind",
    [LLMOPT_ERR_LIMIT] = "limit exceeded",
};
_Static_assert(LLMOPT_ARRAY_LEN(status_names) == LLMOPT_STATUS_COUNT,
               "status name table out of sync");

const char *llmopt_status_str(enum llmopt_status status) {
    if ((unsigned)status >= LLMOPT_STATUS_COUNT || !status_names[status])
        return "unknown status";
    return status_names[status];
}

enum llmopt_status err_set(struct llmopt_err *err, enum llmopt_status status,
                           const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->status = status;
    }
    return status;
}

void err_prefix(struct llmopt_err *err, const char *fmt, ...) {
    if (!err) return;
    char prefix[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    /* The newest context goes first; the tail of a long message may be cut. */
    char old[sizeof err->msg];
    memcpy(old, err->msg, sizeof old);
    size_t n = strlen(prefix);
    if (n > sizeof err->msg - 3) n = sizeof err->msg - 3;
    memcpy(err->msg, prefix, n);
    memcpy(err->msg + n, ": ", 2);
    size_t room = sizeof err->msg - n - 3;
    size_t old_len = strnlen(old, sizeof old);
    if (old_len > room) old_len = room;
    memcpy(err->msg + n + 2, old, old_len);
    err->msg[n + 2 + old_len] = 0;
}
