/* Weights sources: one view over a GGUF file or a Hugging Face checkpoint directory
 * (config.json + safetensors, sharded or not), so binding is written once. A source
 * answers "which tensor has this name" (row-major shape, stored type, bytes) and
 * "what is this hyper-parameter" (a GGUF metadata key, or a dotted path into
 * config.json). */
#ifndef LLMOPT_RUNTIME_WEIGHTS_H
#define LLMOPT_RUNTIME_WEIGHTS_H

#include "format/gguf.h"
#include "format/safetensors.h"
#include "ir/ir.h"

#include <jansson.h>

#define WEIGHTS_MAX_DIMS 8

enum weights_kind { WEIGHTS_GGUF, WEIGHTS_SAFETENSORS, WEIGHTS_KIND_COUNT };
/* The parameter-map section that binds this kind ("gguf", "safetensors"). */
const char *weights_kind_section(enum weights_kind kind);

struct weights_tensor {
    const char *name;  /* NUL-terminated copy owned by the caller's buffer */
    int64_t index;     /* position in the source, for "unused tensor" reports */
    int n_dims;
    int64_t shape[WEIGHTS_MAX_DIMS]; /* row-major */
    bool dtype_known;  /* false: a type llmopt does not read (raw_type says which) */
    enum ir_dtype dtype;
    int raw_type;
    const void *data;  /* borrowed from the mapping */
    uint64_t n_bytes;
};

struct weights_source {
    enum weights_kind kind;
    struct gguf_file *gguf;  /* WEIGHTS_GGUF */
    struct st_file *st;      /* WEIGHTS_SAFETENSORS */
    json_t *config;          /* config.json of a checkpoint directory */
    char path[4096];
};

/* Opens a .gguf file or a directory with config.json and safetensors. */
enum llmopt_status weights_open(const char *path, struct weights_source *out,
                                struct llmopt_err *err);
void weights_close(struct weights_source *w);

int64_t weights_n_tensors(const struct weights_source *w);
/* Tensor by name / by index; name_buf (cap bytes) holds the name. */
bool weights_find(const struct weights_source *w, const char *name, struct weights_tensor *out);
bool weights_at(const struct weights_source *w, int64_t i, char *name_buf, size_t cap,
                struct weights_tensor *out);
/* A number: GGUF metadata key, or for checkpoints a dotted path into config.json. */
bool weights_number(const struct weights_source *w, const char *key, double *out);
/* A metadata value as JSON (string, number, bool; NULL when absent or null): a GGUF
 * key, or a dotted config.json path. The caller json_decref()s it. */
json_t *weights_value(const struct weights_source *w, const char *key);
/* A string (general.architecture / config.json "model_type"), for {arch} in keys. */
bool weights_arch(const struct weights_source *w, char *buf, size_t cap);

#endif
