/* The Model Program (ENGINE_DIR/model.llmopt, docs/formats/model-program.md): what
 * `llmopt compile` writes and `llmopt run ENGINE_DIR` loads without running a pass —
 * the compiled IR (after fusion) with each node's kernel and arena offset, the memory
 * plan, the weights file (path, size, checksums), tokenizer facts, chat template,
 * generation facts, the KV state layout and the target. */
#ifndef LLMOPT_RUNTIME_PROGRAM_H
#define LLMOPT_RUNTIME_PROGRAM_H

#include "runtime/model.h"

#include <stdio.h>

#define PROGRAM_FORMAT "llmopt-program"
#define PROGRAM_VERSION 1
#define PROGRAM_MAX_BYTES (256u << 20)

struct program_write_opts {
    int64_t n_max;             /* batch size the plan is for */
    const char *profile_path;  /* target profile JSON (llmopt probe), or NULL */
    enum llmopt_kv_type kv_type; /* recorded in state_layout.kv_dtype (not DEFAULT) */
};

enum llmopt_status program_write(const struct llmopt_model *m, const char *weights_path,
                                 const struct program_write_opts *opts, const char *out_path,
                                 struct llmopt_err *err);
/* Loads a program; verify_full: hash the whole weights file (llmopt check) rather
 * than its header. */
enum llmopt_status program_load(const char *path, bool verify_full, struct llmopt_model **out,
                                struct llmopt_err *err);
/* 64-bit checksum of a byte range (fast: 8 bytes a step). */
uint64_t program_checksum(const uint8_t *data, size_t n);

#endif
