/* llmopt tokenize: print the token ids of a text. MODEL is a GGUF, a Hugging Face
 * tokenizer directory or a tokenizer.model; special tokens written in the text
 * (<|im_start|>, <s>) are parsed unless --no-special, as llama.cpp does; BOS is
 * prepended when the tokenizer asks for it, unless --no-bos. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cmd_tokenize(int argc, char **argv) {
    const char *model_path = NULL, *text = NULL;
    bool add_bos = true, special = true;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--no-bos"))
            add_bos = false;
        else if (!strcmp(argv[i], "--no-special"))
            special = false;
        else if (!model_path)
            model_path = argv[i];
        else if (!text)
            text = argv[i];
        else
            return usage_error("tokenize: unexpected argument '%s'", argv[i]);
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
    } else if (!llmopt_tokenize_ex(model, text, len, add_bos && llmopt_add_bos_default(model),
                                   special, ids, cap, &n, &err)) {
        for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
        putchar('\n');
        rc = 0;
    }
    if (rc) fail(&err);
    free(ids);
    llmopt_model_free(model);
    return rc;
}
