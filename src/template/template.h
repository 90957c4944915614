/* Chat templates: an interpreter for the subset of Jinja2 that real chat templates
 * use, rendering the way Hugging Face transformers does (trim_blocks, lstrip_blocks,
 * the loopcontrols extension, an immutable sandbox, tojson without HTML escaping and
 * with ensure_ascii=False, raise_exception and strftime_now as globals).
 *
 * A template is parsed once into an AST (tpl_parse) and rendered many times
 * (tpl_render) against a context given as a JSON object whose members become the
 * template's variables. Rendering never hangs or grows without bound: output,
 * memory, steps and call depth are capped (struct tpl_limits), and every failure is
 * a status with a message naming the construct and its line:column.
 *
 * A parsed template is read-only while rendering: one template may be rendered by
 * several threads at once (each render has its own arena).
 *
 * docs/templates.md lists what is supported and the known gaps. */
#ifndef LLMOPT_TEMPLATE_TEMPLATE_H
#define LLMOPT_TEMPLATE_TEMPLATE_H

#include "base/status.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TPL_MAX_SOURCE (4u << 20)   /* bytes of template text */
#define TPL_MAX_NESTING 200         /* parser: nested blocks and expressions */
#define TPL_MAX_RANGE 100000        /* elements of range(); the Jinja sandbox's limit */

struct tpl_limits {
    size_t max_output;  /* bytes of rendered text (also of any captured block) */
    size_t max_memory;  /* bytes of values the render may allocate */
    uint64_t max_steps; /* expression evaluations + loop iterations + calls */
    int max_depth;      /* nested macro / filter calls */
};
/* 16 MiB output, 512 MiB memory, 50M steps, depth 100. */
void tpl_limits_default(struct tpl_limits *lim);

struct tpl_template;

/* Parses src[0..len). name prefixes error messages ("chat template" or a path).
 * Syntax errors, unknown tags/filters/tests and unsupported constructs are
 * LLMOPT_ERR_FORMAT / LLMOPT_ERR_UNSUPPORTED with "name:line:col: ...". */
enum llmopt_status tpl_parse(const char *src, size_t len, const char *name,
                             struct tpl_template **out, struct llmopt_err *err);
void tpl_free(struct tpl_template *t);

/* Renders with the members of context (a JSON object; NULL for none) as variables.
 * *out is NUL-terminated, malloc'd; the caller frees it. lim NULL: defaults. */
enum llmopt_status tpl_render(const struct tpl_template *t, const json_t *context,
                              const struct tpl_limits *lim, char **out, size_t *out_len,
                              struct llmopt_err *err);

/* Fuzz entry point: the first line of data is a JSON context (may be invalid), the
 * rest a template; parse and render with small limits; never crash. */
int tpl_fuzz_one(const uint8_t *data, size_t size);

#endif
