/* llmopt run: generate text from a model. */
#include "cli.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct run_args {
    const char *model, *prompt, *programs, *prompt_ids, *backend;
    long long n_predict, n_ctx;
    enum llmopt_kv_type kv_type;
    struct llmopt_sampling sampling;
    bool seed_given, ids, verbose;
};

struct run_output {
    struct llmopt_detok *detok;
    bool ids;
    int32_t n_printed;
};

static bool on_token(void *user, int32_t id) {
    struct run_output *o = user;
    if (o->ids) {
        printf(o->n_printed ? " %d" : "%d", id);
    } else {
        fputs(llmopt_detok_push(o->detok, id), stdout);
        fflush(stdout);
    }
    o->n_printed++;
    return true;
}

int cmd_run(int argc, char **argv) {
    struct run_args a = {.n_predict = 256};
    llmopt_sampling_default(&a.sampling);
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i], *v = NULL;
        if (!strcmp(arg, "--ids")) { a.ids = true; continue; }
        if (!strcmp(arg, "-v") || !strcmp(arg, "--verbose")) { a.verbose = true; continue; }
        if (arg[0] != '-' || !arg[1]) {
            if (a.model) return usage_error("run: unexpected argument '%s'", arg);
            a.model = arg;
            continue;
        }
        if (!(v = option_value(argc, argv, &i))) return usage_error("run: option '%s' needs a value", arg);
        int sr = cli_sampling_option("run", arg, v, &a.sampling, &a.seed_given);
        if (sr > 0) return sr;
        if (sr == 0) continue;
        if (!strcmp(arg, "-p") || !strcmp(arg, "--prompt")) a.prompt = v;
        else if (!strcmp(arg, "--prompt-ids")) a.prompt_ids = v;
        else if (!strcmp(arg, "--programs")) a.programs = v;
        else if (!strcmp(arg, "--backend")) a.backend = v;
        else if (!strcmp(arg, "--kv-type")) {
            if (!llmopt_kv_type_parse(v, &a.kv_type)) return usage_error("run: --kv-type needs f16, q8_0 or f32, got '%s'", v);
        }
        else if (!strcmp(arg, "-n") || !strcmp(arg, "--n-predict")) {
            if (!parse_long(v, 0, INT32_MAX, &a.n_predict)) return usage_error("run: -n needs a count >= 0, got '%s'", v);
        } else if (!strcmp(arg, "--ctx") || !strcmp(arg, "-c")) {
            if (!parse_long(v, 1, 1 << 20, &a.n_ctx)) return usage_error("run: --ctx needs 1..1048576, got '%s'", v);
        } else {
            return usage_error("run: unknown option '%s'", arg);
        }
    }
    if (!a.model) return usage_error("run: %s", "missing MODEL");
    if (!a.seed_given) a.sampling.seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);

    struct llmopt_err err = {0};
    struct llmopt_model *model = NULL;
    struct llmopt_session *sess = NULL;
    struct llmopt_detok *detok = NULL;
    int32_t *prompt = NULL;
    int rc = 1;
    struct llmopt_load_opts lo = {.programs_dir = a.programs, .verbose = a.verbose};
    if (llmopt_model_load(a.model, &lo, &model, &err)) goto done;
    struct llmopt_session_opts so = {.n_ctx = (int32_t)a.n_ctx, .backend = a.backend, .kv_type = a.kv_type};
    if (llmopt_session_create(model, &so, &sess, &err)) goto done;
    const char *text = a.prompt ? a.prompt : "";
    size_t len = strlen(text), n_prompt = 0, cap = len + 2;
    if (a.prompt_ids) cap = strlen(a.prompt_ids) / 2 + 2;
    prompt = malloc(cap * sizeof *prompt);
    if (!prompt) {
        err.status = LLMOPT_ERR_NOMEM;
        goto done;
    }
    if (a.prompt_ids) {
        /* "1,20,30" or "1 20 30": token ids given directly (no tokenizer needed) */
        char *end;
        for (const char *p = a.prompt_ids; *p;) {
            if (*p == ',' || *p == ' ') {
                p++;
                continue;
            }
            long long id = strtoll(p, &end, 10);
            if (end == p || id < 0 || id >= llmopt_model_n_vocab(model) || n_prompt >= cap) {
                snprintf(err.msg, sizeof err.msg, "--prompt-ids: '%s' is not a list of ids in [0, %d)",
                         a.prompt_ids, llmopt_model_n_vocab(model));
                goto done;
            }
            prompt[n_prompt++] = (int32_t)id;
            p = end;
        }
    } else if (llmopt_tokenize(model, text, len, llmopt_add_bos_default(model), prompt, cap, &n_prompt, &err)) {
        goto done;
    }
    if (n_prompt == 0) {
        snprintf(err.msg, sizeof err.msg, "the prompt is empty and the model adds no BOS token");
        goto done;
    }
    if (!a.ids && llmopt_detok_create(model, &detok, &err)) goto done;
    struct run_output out = {.detok = detok, .ids = a.ids};
    if (!a.ids) {
        for (size_t i = 0; i < n_prompt; i++) fputs(llmopt_detok_push(detok, prompt[i]), stdout);
        fflush(stdout);
    }
    struct llmopt_generate_result res;
    if (llmopt_generate(sess, 0, prompt, (int32_t)n_prompt, (int32_t)a.n_predict, &a.sampling, on_token,
                        &out, &res, &err))
        goto done;
    if (!a.ids) fputs(llmopt_detok_flush(detok), stdout);
    putchar('\n');
    fflush(stdout);
    if (a.verbose || !a.ids)
        fprintf(stderr,
                "\nllmopt: program %s; prompt %d tokens in %.1f ms (%.1f tok/s); "
                "generated %d tokens in %.1f ms (%.1f tok/s)%s; seed %llu; KV %s (%.1f MiB)\n",
                llmopt_model_program(model), res.n_prompt, res.prefill_seconds * 1e3,
                res.prefill_seconds > 0 ? res.n_prompt / res.prefill_seconds : 0.0,
                res.n_generated, res.decode_seconds * 1e3,
                res.decode_seconds > 0 ? (res.n_generated - 1) / res.decode_seconds : 0.0,
                res.stopped_eog ? ", stopped at end of text" : "",
                (unsigned long long)a.sampling.seed, llmopt_kv_type_name(llmopt_session_kv_type(sess)),
                (double)llmopt_session_kv_bytes(sess) / (1024.0 * 1024.0));
    rc = 0;
done:
    if (rc) fail(&err);
    free(prompt);
    llmopt_detok_free(detok);
    llmopt_session_free(sess);
    llmopt_model_free(model);
    return rc;
}

