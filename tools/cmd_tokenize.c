/* llmopt tokenize: print token ids of a text. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cmd_tokenize(int argc, char **argv) {
    const char *model_path = NULL, *text = NULL;
    bool add_bos = true;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--no-bos")) add_bos = false;
        else if (!model_path) model_path = argv[i];
        else if (!text) text = argv[i];
        else return usage_error("tokenize: unexpected argument '%s'", argv[i]);
    }
    if (!model_path || !text) return usage_error("tokenize: %s", "needs MODEL and TEXT");
    struct llmopt_err err = {0};
    struct llmopt_model *model = NULL;
    struct llmopt_load_opts lo = {.vocab_only = true};
    if (llmopt_model_load(model_path, &lo, &model, &err)) return fail(&err);
    size_t len = strlen(text), n = 0, cap = len + 2;
    int32_t *ids = malloc(cap * sizeof *ids);
    int rc = 1;
    if (!ids) {
        err.status = LLMOPT_ERR_NOMEM;
    } else if (!llmopt_tokenize(model, text, len, add_bos && llmopt_token_bos(model) >= 0, ids, cap, &n,
                                &err)) {
        for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
        putchar('\n');
        rc = 0;
    }
    if (rc) fail(&err);
    free(ids);
    llmopt_model_free(model);
    return rc;
}

