/* Bounded protobuf wire-format reader (see protobuf.h). */
#include "tokenizer/protobuf.h"

#include <string.h>

void pb_reader_init(struct pb_reader *r, const uint8_t *data, size_t size, size_t base,
                    const char *what) {
    *r = (struct pb_reader){.data = data, .size = size, .base = base, .what = what};
}

void pb_reader_sub(struct pb_reader *sub, const struct pb_reader *parent, const struct pb_field *f,
                   const char *what) {
    pb_reader_init(sub, f->data, f->len, parent->base + (size_t)(f->data - parent->data), what);
}

/* A varint of at most 10 bytes; the 10th may only hold the top bit of 64. */
static enum llmopt_status read_varint(struct pb_reader *r, uint64_t *out, struct llmopt_err *err) {
    uint64_t x = 0;
    size_t start = r->pos;
    for (int i = 0; i < 10; i++) {
        if (r->pos >= r->size)
            return err_set(err, LLMOPT_ERR_FORMAT,
                           "protobuf: %s: varint at offset %zu: expected more bytes, found the "
                           "end of the message",
                           r->what, r->base + start);
        uint8_t b = r->data[r->pos++];
        if (i == 9 && b > 1)
            return err_set(err, LLMOPT_ERR_FORMAT,
                           "protobuf: %s: varint at offset %zu: expected at most 64 bits", r->what,
                           r->base + start);
        x |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *out = x;
            return LLMOPT_OK;
        }
    }
    return err_set(err, LLMOPT_ERR_FORMAT,
                   "protobuf: %s: varint at offset %zu: expected at most 10 bytes", r->what,
                   r->base + start);
}

static enum llmopt_status read_fixed(struct pb_reader *r, size_t n, uint64_t *out,
                                     struct llmopt_err *err) {
    if (r->size - r->pos < n)
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "protobuf: %s: fixed%zu at offset %zu: expected %zu bytes, found %zu",
                       r->what, 8 * n, r->base + r->pos, n, r->size - r->pos);
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) x |= (uint64_t)r->data[r->pos + i] << (8 * i);
    r->pos += n;
    *out = x;
    return LLMOPT_OK;
}

enum llmopt_status pb_next(struct pb_reader *r, struct pb_field *f, bool *more,
                           struct llmopt_err *err) {
    *more = false;
    if (r->pos >= r->size) return LLMOPT_OK;
    memset(f, 0, sizeof *f);
    f->offset = r->base + r->pos;
    uint64_t key;
    enum llmopt_status st = read_varint(r, &key, err);
    if (st) return st;
    uint64_t number = key >> 3;
    if (number == 0 || number > 0x1fffffff)
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "protobuf: %s: key at offset %zu: expected a field number in [1, 2^29), "
                       "found %llu",
                       r->what, f->offset, (unsigned long long)number);
    f->number = (uint32_t)number;
    f->wire = (enum pb_wire)(key & 7);
    switch ((int)(key & 7)) {
    case PB_WIRE_VARINT:
        st = read_varint(r, &f->u64, err);
        break;
    case PB_WIRE_I64:
        st = read_fixed(r, 8, &f->u64, err);
        break;
    case PB_WIRE_I32:
        st = read_fixed(r, 4, &f->u64, err);
        break;
    case PB_WIRE_LEN: {
        uint64_t len;
        if ((st = read_varint(r, &len, err))) break;
        if (len > r->size - r->pos) {
            st = err_set(err, LLMOPT_ERR_FORMAT,
                         "protobuf: %s: field %u at offset %zu: length %llu exceeds the %zu "
                         "bytes left (truncated?)",
                         r->what, f->number, f->offset, (unsigned long long)len, r->size - r->pos);
            break;
        }
        f->data = r->data + r->pos;
        f->len = (size_t)len;
        r->pos += (size_t)len;
        break;
    }
    default:
        st = err_set(err, LLMOPT_ERR_FORMAT,
                     "protobuf: %s: field %u at offset %zu: wire type %u is not supported "
                     "(expected 0, 1, 2 or 5)",
                     r->what, f->number, f->offset, (unsigned)(key & 7));
        break;
    }
    if (st == LLMOPT_OK) *more = true;
    return st;
}

static enum llmopt_status wrong_wire(const struct pb_reader *r, const struct pb_field *f,
                                     const char *expected, struct llmopt_err *err) {
    return err_set(err, LLMOPT_ERR_FORMAT,
                   "protobuf: %s: field %u at offset %zu: expected %s, found wire type %u", r->what,
                   f->number, f->offset, expected, (unsigned)f->wire);
}

enum llmopt_status pb_float(const struct pb_reader *r, const struct pb_field *f, float *out,
                            struct llmopt_err *err) {
    if (f->wire != PB_WIRE_I32) return wrong_wire(r, f, "a float (fixed32)", err);
    uint32_t bits = (uint32_t)f->u64;
    memcpy(out, &bits, sizeof *out);
    return LLMOPT_OK;
}

enum llmopt_status pb_int32(const struct pb_reader *r, const struct pb_field *f, int32_t *out,
                            struct llmopt_err *err) {
    if (f->wire != PB_WIRE_VARINT) return wrong_wire(r, f, "an int32 (varint)", err);
    *out = (int32_t)(uint32_t)f->u64; /* negative int32s are 10-byte sign-extended varints */
    return LLMOPT_OK;
}

enum llmopt_status pb_bool(const struct pb_reader *r, const struct pb_field *f, bool *out,
                           struct llmopt_err *err) {
    if (f->wire != PB_WIRE_VARINT) return wrong_wire(r, f, "a bool (varint)", err);
    *out = f->u64 != 0;
    return LLMOPT_OK;
}

enum llmopt_status pb_bytes(const struct pb_reader *r, const struct pb_field *f,
                            struct llmopt_err *err) {
    return f->wire == PB_WIRE_LEN ? LLMOPT_OK : wrong_wire(r, f, "length-delimited bytes", err);
}
