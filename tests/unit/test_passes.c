/* Passes on/off parity: every stock program, bound to every model we have, computes the
 * same logits with and without the compiler's passes (prefill of a prompt, then decode
 * steps on the KV cache), while the compiled graph runs fewer kernels. Also each pass
 * alone, so a miscompile points at its pass. */
#include "llmopt.h"
#include "test.h"

#include <dirent.h>
#include <stdlib.h>

#define REL_TOL 1e-5 /* f32 sums in another order, at most */

static const char *const models[] = {
    "../shared/models/stories260K/stories260K-F32.gguf",
    "../shared/models/stories260K/stories260K-Q8_0.gguf",
    "../shared/models/stories260K/stories260K-Q4_0.gguf",
    "../shared/models/llama-2-tiny-random/llama-2-tiny-random.gguf",
};

/* Runs a 7-token prompt then 6 greedy decode steps; writes every step's logits. */
static int run_steps(const char *path, const struct llmopt_load_opts *lo, float **out, int32_t *n_vocab,
                     struct llmopt_compile_stats *cs) {
    struct llmopt_err err = {0};
    struct llmopt_model *m = NULL;
    struct llmopt_session *s = NULL;
    if (llmopt_model_load(path, lo, &m, &err)) {
        fprintf(stderr, "  %s: %s\n", path, err.msg);
        return -1;
    }
    llmopt_model_compile_stats(m, cs);
    *n_vocab = llmopt_model_n_vocab(m);
    struct llmopt_session_opts so = {.n_ctx = 64, .n_batch = 8, .kv_type = LLMOPT_KV_F32};
    int steps = 0;
    if (!llmopt_session_create(m, &so, &s, &err)) {
        int32_t prompt[7] = {1, 20, 30, 40, 50, 60, 70};
        *out = malloc(sizeof(float) * (size_t)*n_vocab * 7);
        const float *logits;
        if (!llmopt_session_append(s, 0, prompt, 7, &logits, &err)) {
            for (steps = 0; steps < 7; steps++) {
                memcpy(*out + (size_t)steps * (size_t)*n_vocab, logits, sizeof(float) * (size_t)*n_vocab);
                int32_t best = 0;
                for (int32_t v = 1; v < *n_vocab; v++)
                    if (logits[v] > logits[best]) best = v;
                if (steps == 6 || llmopt_session_append(s, 0, &best, 1, &logits, &err)) break;
            }
            steps++;
        }
    }
    if (err.msg[0]) fprintf(stderr, "  %s: %s\n", path, err.msg);
    llmopt_session_free(s);
    llmopt_model_free(m);
    return steps;
}

static double compare(const float *a, const float *b, size_t n) {
    double max_ref = 0, max_diff = 0;
    for (size_t i = 0; i < n; i++) {
        max_ref = fabs(b[i]) > max_ref ? fabs(b[i]) : max_ref;
        max_diff = fabs((double)a[i] - b[i]) > max_diff ? fabs((double)a[i] - b[i]) : max_diff;
    }
    return max_ref > 0 ? max_diff / max_ref : max_diff;
}

static void check_model(const char *path, const char *passes_env) {
    struct llmopt_load_opts off = {.no_passes = true}, on = {0};
    float *ref = NULL, *got = NULL;
    int32_t nv = 0;
    struct llmopt_compile_stats cs_off, cs_on;
    if (passes_env) setenv("LLMOPT_PASSES", passes_env, 1);
    else unsetenv("LLMOPT_PASSES");
    int n_ref = run_steps(path, &off, &ref, &nv, &cs_off);
    int n_got = run_steps(path, &on, &got, &nv, &cs_on);
    unsetenv("LLMOPT_PASSES");
    CHECK_MSG(n_ref == 7 && n_got == 7, "%s: ran %d / %d steps", path, n_ref, n_got);
    if (n_ref == 7 && n_got == 7) {
        double rel = compare(got, ref, (size_t)nv * 7);
        CHECK_MSG(rel <= REL_TOL, "%s (passes %s): relative error %.3g", path, passes_env ? passes_env : "all", rel);
        if (!passes_env) {
            CHECK_MSG(cs_on.kernels_compiled < cs_off.kernels_compiled, "%s: %d kernels fused vs %d", path,
                      cs_on.kernels_compiled, cs_off.kernels_compiled);
            fprintf(stderr, "  %s: kernels per forward %d -> %d, relative error %.2g\n", path,
                    cs_on.kernels_imported, cs_on.kernels_compiled, rel);
        }
    }
    free(ref);
    free(got);
}

/* Parity is judged on the scalar reference kernels, so the only difference between the
 * two runs is the graph; fast kernels have their own tests against the same oracle. */
static void test_all_passes_parity(void) {
    setenv("LLMOPT_CPU_REF", "1", 1);
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) check_model(models[i], NULL);
    DIR *d = opendir("tests/golden");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[512];
        snprintf(path, sizeof path, "tests/golden/%s/model.gguf", e->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        fclose(f);
        check_model(path, NULL);
    }
    if (d) closedir(d);
}

static void test_each_pass_alone(void) {
    setenv("LLMOPT_CPU_REF", "1", 1);
    static const char *const passes[] = {"canonicalize",  "cse",       "fold",        "prune-rows",
                                         "fuse-rms-norm", "fuse-rope", "fuse-linear", "dce"};
    for (size_t p = 0; p < sizeof passes / sizeof passes[0]; p++) check_model(models[0], passes[p]);
}

TEST_MAIN(test_all_passes_parity, test_each_pass_alone)
