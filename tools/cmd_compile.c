/* llmopt compile: bind the stock program to a model and report on the plan. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

int cmd_compile(int argc, char **argv) {
    const char *model_path = NULL, *programs = NULL;
    bool dump_ir = false;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--dump-ir")) dump_ir = true;
        else if (!strcmp(argv[i], "--programs") && i + 1 < argc) programs = argv[++i];
        else if (!model_path) model_path = argv[i];
        else return usage_error("compile: unexpected argument '%s'", argv[i]);
    }
    if (!model_path) return usage_error("compile: %s", "missing MODEL");
    struct llmopt_err err = {0};
    struct llmopt_model *model = NULL;
    struct llmopt_session *sess = NULL;
    struct llmopt_load_opts lo = {.programs_dir = programs, .verbose = true};
    if (llmopt_model_load(model_path, &lo, &model, &err)) return fail(&err);
    if (dump_ir) llmopt_model_dump_ir(model, stdout);
    struct llmopt_session_opts so = {0};
    if (llmopt_session_create(model, &so, &sess, &err)) {
        llmopt_model_free(model);
        return fail(&err);
    }
    fprintf(stderr, "llmopt: planned activation arena %zu bytes for a batch of up to 256 tokens\n",
            llmopt_session_arena_bytes(sess));
    llmopt_session_free(sess);
    llmopt_model_free(model);
    return 0;
}

