/* Fuzz entry point for the graph-file parser, the importer and the passes: any bytes
 * are parsed as a graph file, imported with fixed hyper-parameters and a binder that
 * hands out a zero-filled f32 weight of the requested shape (capped), and an imported
 * graph goes through every pass (a user's program directory is untrusted input that
 * llmopt_model_load compiles the same way). Never crashes. */
#include "format/graph_file.h"
#include "ir/import.h"
#include "passes/passes.h"

#include <stdint.h>
#include <stdlib.h>

static float fuzz_weight[1 << 16];

static enum llmopt_status fuzz_bind(void *ctx, const char *tmpl, int layer,
                                    const struct ir_shape *shape, struct ir_weight *out,
                                    struct llmopt_err *err) {
    (void)ctx;
    (void)tmpl;
    (void)layer;
    int64_t n = 1;
    for (int i = 0; i < shape->rank; i++) {
        n *= shape->dims[i].coef;
        if (n > (int64_t)(sizeof fuzz_weight / sizeof fuzz_weight[0]))
            return err_set(err, LLMOPT_ERR_LIMIT, "fuzz: weight too large");
    }
    *out = (struct ir_weight){fuzz_weight, IR_DTYPE_F32, (uint64_t)n * 4, "fuzz", NULL};
    return LLMOPT_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *root = NULL;
    struct llmopt_err err;
    if (graph_file_parse((const char *)data, size, &root, &err)) return 0;
    if (graph_file_check(root, &err) == LLMOPT_OK) {
        struct ir_hparams hp = {.n = 4,
                                .names = {"d_model", "n_layers", "vocab", "head_dim"},
                                .values = {8, 2, 16, 4}};
        struct ir_graph g;
        if (ir_import(root, &hp, fuzz_bind, NULL, &g, &err) == LLMOPT_OK) {
            (void)passes_run(&g, PASSES_ALL, NULL, &err);
            ir_graph_free(&g);
        }
    }
    json_decref(root);
    return 0;
}
