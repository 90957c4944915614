/* A loaded model: weights file + the stock program that binds to it + imported IR +
 * tokenizer. Internal view of struct llmopt_model. */
#ifndef LLMOPT_RUNTIME_MODEL_H
#define LLMOPT_RUNTIME_MODEL_H

#include "format/gguf.h"
#include "ir/import.h"
#include "runtime/weights.h"
#include "passes/memplan.h"
#include "passes/passes.h"
#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <limits.h>

struct llmopt_model {
    struct weights_source weights; /* the GGUF file or checkpoint directory */
    struct gguf_file *gguf;   /* weights.gguf when the weights are a GGUF, else NULL */
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
    struct pass_report passes; /* what the passes did at load */
    struct mem_plan *plan;     /* from a Model Program, or NULL */
    enum llmopt_kv_type kv_type; /* a Model Program's state_layout.kv_dtype, else DEFAULT */
};

/* Tries to bind one program directory to an open GGUF; on success fills m's program
 * fields and IR. On failure err says what did not bind. */
enum llmopt_status model_bind_program(struct llmopt_model *m, const char *program_dir,
                                      struct llmopt_err *err);
/* Binds GGUF tensor t to a parameter of `shape` (checks shape and type; widens 1-D
 * tensors to f32; applies `transform`, a map transform object, or NULL). */
enum llmopt_status model_bind_tensor(struct llmopt_model *m, const char *pname,
                                     const struct weights_tensor *t, const struct ir_shape *shape,
                                     const json_t *transform, struct ir_weight *out,
                                     struct llmopt_err *err);
/* Frees what model_bind_program set up (used between attempts). */
void model_unbind(struct llmopt_model *m);
/* Directory holding stock programs, per opts / env / build. */
const char *model_programs_dir(const struct llmopt_load_opts *opts, char *buf, size_t cap);

#endif
