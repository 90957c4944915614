/* The words that error messages use for a JSON value's type ("expected an integer, but
 * got a string"), shared by every reader of JSON through jansson (safetensors headers,
 * the server's request bodies). */
#ifndef LLMOPT_BASE_JSON_KIND_H
#define LLMOPT_BASE_JSON_KIND_H

#include <jansson.h>

static inline const char *json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "something else";
}

#endif
