/* Fuzz entry point for the chat-template interpreter: the input's first line is a
 * JSON render context (an invalid one is replaced by a small conversation), the rest
 * a template; it is parsed and rendered under small output / memory / step limits.
 * Neither syntax errors, invalid UTF-8, huge literals nor runaway loops may crash,
 * hang or grow memory without bound (see tpl_fuzz_one in src/template/chat.c). */
#include "template/template.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return tpl_fuzz_one(data, size); }
