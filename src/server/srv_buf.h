/* A byte buffer with a hard cap (curl's dynbuf idea): appends past max fail and mark
 * the buffer, so nothing fed by the network can grow memory without bound. */
#ifndef LLMOPT_SERVER_SRV_BUF_H
#define LLMOPT_SERVER_SRV_BUF_H

#include <stdbool.h>
#include <stddef.h>

struct srv_buf {
    char *data; /* NUL-terminated when non-NULL */
    size_t len, cap;
    size_t max;  /* appends that would pass this many bytes fail */
    bool failed; /* an append failed (cap or out of memory); contents are partial */
};

void srv_buf_init(struct srv_buf *b, size_t max);
bool srv_buf_append(struct srv_buf *b, const char *s, size_t n);
bool srv_buf_puts(struct srv_buf *b, const char *s);
bool srv_buf_printf(struct srv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Hands the bytes to the caller (free() them); the buffer is empty afterwards. */
/* Appends s[0..n) as the inside of a JSON string, escaped byte for byte as jansson's
 * json_dumps writes it: \" \\ \b \f \n \r \t, other bytes below 0x20 as \u00XX,
 * everything else (UTF-8 included) as is. s must be valid UTF-8. */
bool srv_buf_json_escaped(struct srv_buf *b, const char *s, size_t n);
char *srv_buf_take(struct srv_buf *b, size_t *len);
void srv_buf_reset(struct srv_buf *b); /* empty, keeping the allocation */
void srv_buf_free(struct srv_buf *b);

#endif
