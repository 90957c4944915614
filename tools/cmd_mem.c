/* llmopt mem: what a model needs in memory before loading it (weights by stored type,
 * KV cache for a context and slot count, the planned activation arena) and, unless
 * --no-load, the peak RSS measured after a session is created and runs one batch. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static double mib(uint64_t bytes) { return (double)bytes / (1024.0 * 1024.0); }

int cmd_mem(int argc, char **argv) {
    const char *model_path = NULL, *backend = NULL;
    enum llmopt_kv_type kv_type = LLMOPT_KV_DEFAULT;
    long long ctx = 0, parallel = 1, batch = 0, threads = 0;
    bool no_load = false, as_json = false;
    for (int i = 0; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--no-load")) no_load = true;
        else if (!strcmp(argv[i], "--json")) as_json = true;
        else if (!strcmp(argv[i], "--ctx") && (v = option_value(argc, argv, &i))) {
            if (!parse_long(v, 1, 1 << 20, &ctx)) return usage_error("mem: --ctx needs 1..1048576, got '%s'", v);
        } else if (!strcmp(argv[i], "--parallel") && (v = option_value(argc, argv, &i))) {
            if (!parse_long(v, 1, 4096, &parallel)) return usage_error("mem: --parallel needs 1..4096, got '%s'", v);
        } else if (!strcmp(argv[i], "--batch") && (v = option_value(argc, argv, &i))) {
            if (!parse_long(v, 1, 1 << 16, &batch)) return usage_error("mem: --batch needs 1..65536, got '%s'", v);
        } else if (!strcmp(argv[i], "-t") && (v = option_value(argc, argv, &i))) {
            if (!parse_long(v, 1, 1024, &threads)) return usage_error("mem: -t needs 1..1024, got '%s'", v);
        } else if (!strcmp(argv[i], "--kv-type") && (v = option_value(argc, argv, &i))) {
            if (!llmopt_kv_type_parse(v, &kv_type)) return usage_error("mem: --kv-type needs f16, q8_0 or f32, got '%s'", v);
        }
        else if (!strcmp(argv[i], "--backend") && (v = option_value(argc, argv, &i))) backend = v;
        else if (argv[i][0] == '-') return usage_error("mem: unknown option or missing value '%s'", argv[i]);
        else if (!model_path) model_path = argv[i];
        else return usage_error("mem: unexpected argument '%s'", argv[i]);
    }
    if (!model_path) return usage_error("mem: %s", "missing MODEL");
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double rss_start = (double)ru.ru_maxrss * 1024.0; /* code and shared libraries (CUDA's, when built in) */
    struct llmopt_err err = {0};
    struct llmopt_model *model = NULL;
    struct llmopt_session *s = NULL;
    int32_t *tokens = NULL, *positions = NULL, *slots = NULL;
    int rc = 1;
    if (llmopt_model_load(model_path, NULL, &model, &err)) goto done;
    struct llmopt_session_opts so = {.n_ctx = (int32_t)ctx, .n_batch = (int32_t)batch, .n_slots = (int32_t)parallel,
                                     .n_threads = (int32_t)threads, .backend = backend, .kv_type = kv_type};
    struct llmopt_memory mem;
    if (llmopt_model_memory(model, &so, &mem, &err)) goto done;
    double rss = 0;
    int32_t n_run = 0;
    if (!no_load) {
        /* One full batch from slot 0 touches every weight and the arena; KV pages count
         * once written, so only n_run positions of the cache are resident. */
        so.n_ctx = mem.n_ctx;
        so.n_batch = mem.n_batch;
        if (llmopt_session_create(model, &so, &s, &err)) goto done;
        n_run = mem.n_batch < mem.n_ctx ? mem.n_batch : mem.n_ctx;
        tokens = malloc((size_t)n_run * sizeof *tokens);
        positions = malloc((size_t)n_run * sizeof *positions);
        slots = calloc((size_t)n_run, sizeof *slots);
        if (!tokens || !positions || !slots) {
            err.status = LLMOPT_ERR_NOMEM;
            snprintf(err.msg, sizeof err.msg, "mem: out of memory");
            goto done;
        }
        int32_t n_vocab = llmopt_model_n_vocab(model), last = n_run - 1;
        for (int32_t t = 0; t < n_run; t++) {
            tokens[t] = (int32_t)(1 + ((int64_t)t * 7919) % (n_vocab - 1));
            positions[t] = t;
        }
        const float *logits;
        if (llmopt_session_forward(s, n_run, tokens, positions, slots, 1, &last, &logits, &err)) goto done;
        getrusage(RUSAGE_SELF, &ru);
        rss = (double)ru.ru_maxrss * 1024.0;
    }
    if (as_json) {
        printf("{\"model\": \"%s\", \"program\": \"%s\", \"n_ctx\": %d, \"n_slots\": %d, \"n_batch\": %d, "
               "\"weights\": {",
               model_path, llmopt_model_program(model), mem.n_ctx, mem.n_slots, mem.n_batch);
        for (int32_t k = 0; k < mem.n_weight_types; k++)
            printf("%s\"%s\": {\"tensors\": %d, \"bytes\": %llu}", k ? ", " : "", mem.weights[k].dtype,
                   mem.weights[k].tensors, (unsigned long long)mem.weights[k].bytes);
        printf("}, \"weight_bytes\": %llu, \"kv_type\": \"%s\", \"kv_layers\": %d, \"kv_bytes\": %llu, "
               "\"conv_state_bytes\": %llu, \"arena_bytes\": %llu, \"total_bytes\": %llu",
               (unsigned long long)mem.weight_bytes, mem.kv_type, mem.kv_layers, (unsigned long long)mem.kv_bytes,
               (unsigned long long)mem.conv_state_bytes, (unsigned long long)mem.arena_bytes,
               (unsigned long long)mem.total_bytes);
        if (!no_load)
            printf(", \"packed_bytes\": %llu, \"peak_rss_bytes\": %.0f, \"rss_at_start_bytes\": %.0f, "
                   "\"positions_run\": %d",
                   (unsigned long long)llmopt_session_packed_bytes(s), rss, rss_start, n_run);
        printf("}\n");
    } else {
        printf("model        %s (program %s)\n", model_path, llmopt_model_program(model));
        printf("weights      %10.2f MiB:", mib(mem.weight_bytes));
        for (int32_t k = 0; k < mem.n_weight_types; k++)
            printf("%s %s %d tensors %.2f MiB", k ? "," : "", mem.weights[k].dtype, mem.weights[k].tensors,
                   mib(mem.weights[k].bytes));
        printf("\nkv cache     %10.2f MiB: %s, %d layers x %d positions x %d slot%s\n", mib(mem.kv_bytes), mem.kv_type,
               mem.kv_layers, mem.n_ctx, mem.n_slots, mem.n_slots == 1 ? "" : "s");
        if (mem.conv_state_bytes) printf("conv state   %10.2f MiB\n", mib(mem.conv_state_bytes));
        printf("arena        %10.2f MiB: activations planned for batches of %d tokens\n", mib(mem.arena_bytes),
               mem.n_batch);
        printf("estimate     %10.2f MiB in all (not counted: the tokenizer, kernel scratch, code)\n",
               mib(mem.total_bytes));
        if (!no_load)
            printf("packed       %10.2f MiB: weights repacked once for the CPU GEMM (in the measured RSS, not the "
                   "estimate)\n",
                   mib(llmopt_session_packed_bytes(s)));
        if (!no_load)
            printf("measured     %10.2f MiB peak RSS after one forward of %d tokens, %.2f MiB of it before loading\n"
                   "             (code and libraries); of the KV cache only the %d of %d positions written are resident\n",
                   rss / (1024.0 * 1024.0), n_run, rss_start / (1024.0 * 1024.0), n_run, mem.n_ctx * mem.n_slots);
    }
    rc = 0;
done:
    if (rc && err.status) fail(&err);
    free(tokens);
    free(positions);
    free(slots);
    llmopt_session_free(s);
    llmopt_model_free(model);
    return rc;
}
