/* A bounded protobuf wire-format reader: enough for SentencePiece's ModelProto.
 *
 * A message is a sequence of (key, value); key = varint (field << 3 | wire type).
 * Wire types: 0 varint, 1 fixed 64-bit, 2 length-delimited (bytes, strings,
 * sub-messages), 5 fixed 32-bit; groups (3, 4) are refused. Every varint is at most
 * 10 bytes and every length is checked against what is left, so a truncated or
 * corrupt buffer is an error naming the offset, never a read out of bounds. */
#ifndef LLMOPT_TOKENIZER_PROTOBUF_H
#define LLMOPT_TOKENIZER_PROTOBUF_H

#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum pb_wire {
    PB_WIRE_VARINT = 0,
    PB_WIRE_I64 = 1,
    PB_WIRE_LEN = 2,
    PB_WIRE_I32 = 5,
};

struct pb_reader {
    const uint8_t *data; /* (size) the message's bytes */
    size_t size;
    size_t pos;       /* next byte to read */
    size_t base;      /* offset of data[0] in the whole buffer, for messages */
    const char *what; /* the message's name, for messages */
};

struct pb_field {
    uint32_t number;
    enum pb_wire wire;
    uint64_t u64;        /* varint, fixed32 or fixed64 value */
    const uint8_t *data; /* PB_WIRE_LEN: (len) bytes */
    size_t len;
    size_t offset; /* of the key, in the whole buffer */
};

void pb_reader_init(struct pb_reader *r, const uint8_t *data, size_t size, size_t base,
                    const char *what);
/* A sub-message reader over a length-delimited field. */
void pb_reader_sub(struct pb_reader *sub, const struct pb_reader *parent, const struct pb_field *f,
                   const char *what);
/* Reads the next field. *more is false (and LLMOPT_OK) at the end of the message. */
enum llmopt_status pb_next(struct pb_reader *r, struct pb_field *f, bool *more,
                           struct llmopt_err *err);
/* The field as a float (fixed32), int32 (varint, two's complement) or bool (varint);
 * LLMOPT_ERR_FORMAT naming the field when the wire type does not fit. */
enum llmopt_status pb_float(const struct pb_reader *r, const struct pb_field *f, float *out,
                            struct llmopt_err *err);
enum llmopt_status pb_int32(const struct pb_reader *r, const struct pb_field *f, int32_t *out,
                            struct llmopt_err *err);
enum llmopt_status pb_bool(const struct pb_reader *r, const struct pb_field *f, bool *out,
                           struct llmopt_err *err);
/* Requires a length-delimited field (string, bytes, message). */
enum llmopt_status pb_bytes(const struct pb_reader *r, const struct pb_field *f,
                            struct llmopt_err *err);

#endif
