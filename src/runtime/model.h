/* A loaded model: weights file + the stock program that binds to it + imported IR +
 * tokenizer. Internal view of struct llmopt_model. */
#ifndef LLMOPT_RUNTIME_MODEL_H
#define LLMOPT_RUNTIME_MODEL_H

#include "format/gguf.h"
#include "ir/import.h"
#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <limits.h>

struct llmopt_model {
    struct gguf_file *gguf;
    json_t *graph, *map;      /* the bound program's files; hp.names point into them */
    char program_name[128];
    char program_dir[PATH_MAX];
    struct ir_hparams hp;
    struct ir_graph ir;
    void **owned;             /* (n_owned) weights the binder had to rewrite */
    int32_t n_owned, cap_owned;
    struct tok_vocab *vocab;
    int32_t n_vocab;
    int32_t ctx_train;
};

/* Tries to bind one program directory to an open GGUF; on success fills m's program
 * fields and IR. On failure err says what did not bind. */
enum llmopt_status model_bind_program(struct llmopt_model *m, const char *program_dir,
                                      struct llmopt_err *err);
/* Frees what model_bind_program set up (used between attempts). */
void model_unbind(struct llmopt_model *m);
/* Directory holding stock programs, per opts / env / build. */
const char *model_programs_dir(const struct llmopt_load_opts *opts, char *buf, size_t cap);

#endif
