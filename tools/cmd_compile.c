/* llmopt compile: bind the stock program to a model, run the passes, plan memory and
 * write the Model Program (ENGINE_DIR/model.llmopt); llmopt check: validate one. */
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

int cmd_compile(int argc, char **argv) {
    const char *model_path = NULL, *programs = NULL, *out_dir = NULL, *profile = NULL;
    bool dump_ir = false, no_passes = false;
    long long n_batch = 256;
    enum llmopt_kv_type kv_type = LLMOPT_KV_F16;
    for (int i = 0; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--dump-ir")) dump_ir = true;
        else if (!strcmp(argv[i], "--no-passes")) no_passes = true;
        else if (!strcmp(argv[i], "--programs") && (v = option_value(argc, argv, &i))) programs = v;
        else if ((!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) && (v = option_value(argc, argv, &i))) out_dir = v;
        else if (!strcmp(argv[i], "--profile") && (v = option_value(argc, argv, &i))) profile = v;
        else if (!strcmp(argv[i], "--kv-type") && (v = option_value(argc, argv, &i))) {
            if (!llmopt_kv_type_parse(v, &kv_type)) return usage_error("compile: --kv-type needs f16, q8_0 or f32, got '%s'", v);
        }
        else if (!strcmp(argv[i], "--batch") && (v = option_value(argc, argv, &i))) {
            if (!parse_long(v, 1, 1 << 16, &n_batch)) return usage_error("compile: --batch needs 1..65536, got '%s'", v);
        } else if (argv[i][0] == '-') return usage_error("compile: unknown option or missing value '%s'", argv[i]);
        else if (!model_path) model_path = argv[i];
        else return usage_error("compile: unexpected argument '%s'", argv[i]);
    }
    if (!model_path) return usage_error("compile: %s", "missing MODEL");
    struct llmopt_err err = {0};
    struct llmopt_model *model = NULL;
    struct llmopt_load_opts lo = {.programs_dir = programs, .verbose = true, .no_passes = no_passes};
    if (llmopt_model_load(model_path, &lo, &model, &err)) return fail(&err);
    if (dump_ir) llmopt_model_dump_ir(model, stdout);
    struct llmopt_compile_stats cs;
    llmopt_model_compile_stats(model, &cs);
    size_t arena, naive;
    llmopt_model_plan_bytes(model, (int32_t)n_batch, &arena, &naive);
    fprintf(stderr,
            "llmopt: nodes %d -> %d after passes; kernels per forward %d -> %d\n"
            "llmopt: memory plan for N_max = %lld: arena %zu bytes, naive sum of intermediates %zu bytes (%.1f%%)\n",
            cs.nodes_imported, cs.nodes_compiled, cs.kernels_imported, cs.kernels_compiled, n_batch, arena,
            naive, naive ? 100.0 * (double)arena / (double)naive : 0.0);
    int rc = 0;
    if (out_dir) {
        char path[4096];
        if (mkdir(out_dir, 0755) != 0 && errno != EEXIST) {
            snprintf(err.msg, sizeof err.msg, "%s: %s", out_dir, strerror(errno));
            rc = fail(&err);
        } else {
            snprintf(path, sizeof path, "%s/model.llmopt", out_dir);
            struct llmopt_program_opts po = {.n_batch = (int32_t)n_batch, .profile_path = profile, .kv_type = kv_type};
            if (llmopt_program_write(model, model_path, &po, path, &err)) rc = fail(&err);
            else fprintf(stderr, "llmopt: wrote %s\n", path);
        }
    }
    llmopt_model_free(model);
    return rc;
}

int cmd_check(int argc, char **argv) {
    if (argc != 1) return usage_error("check: %s", "needs exactly one ENGINE_DIR/model.llmopt");
    struct llmopt_err err = {0};
    if (llmopt_program_check(argv[0], &err)) return fail(&err);
    printf("%s: ok\n", argv[0]);
    return 0;
}
