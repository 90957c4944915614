/* Decode batch scaling: what the server's continuous batching can gain from the
 * forward alone. B sequences each get a short prompt, then `steps` decode forwards of B
 * rows (one token per sequence, as the server's scheduler builds them); prints
 * microseconds per generated token for B = 1, 2, 4, ... (from -m to -b) and the speedup
 * over the first.
 * Times are the best of `reps` repetitions, wall and the calling thread's CPU time;
 * with -t 1 the CPU time is the whole forward's, which other processes on a shared
 * machine inflate least (its speedup is the one to read there). Both include the
 * greedy pick over each row's logits; "fwd cpu" is the forward calls' CPU time alone.
 *
 * -P 1 adds, per batch size, one more repetition with the session's per-node profile
 * on and prints each op family's microseconds per generated token (where a batched
 * step's time goes).
 *
 *   bench_batch_decode MODEL.gguf [-t THREADS] [-m MIN_B] [-b MAX_B] [-n STEPS] [-r REPS] [-P 1]
 *                      [--backend cpu|cpu-ref|cuda]
 */
#include "llmopt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One repetition for B sequences: prompts, then `steps` decode forwards. Returns
 * the seconds the decode steps took (wall and this thread's CPU). */
static int run_batch(struct llmopt_session *s, int32_t n_vocab, int32_t B, int32_t steps,
                     double *wall, double *cpu, double *fwd) {
    enum { PROMPT = 10 };
    int32_t *tok = malloc((size_t)B * sizeof *tok), *pos = malloc((size_t)B * sizeof *pos);
    int32_t *slot = malloc((size_t)B * sizeof *slot), *rows = malloc((size_t)B * sizeof *rows);
    struct llmopt_err err = {0};
    int rc = 0;
    for (int32_t b = 0; b < B && !rc; b++) {
        int32_t prompt[PROMPT];
        for (int32_t i = 0; i < PROMPT; i++) prompt[i] = 1 + (b * 7 + i * 13) % (n_vocab - 1);
        const float *logits;
        llmopt_session_reset(s, b);
        if (llmopt_session_append(s, b, prompt, PROMPT, &logits, &err)) rc = 1;
        tok[b] = prompt[PROMPT - 1];
        pos[b] = PROMPT;
        slot[b] = b;
        rows[b] = b;
    }
    double w0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
    *fwd = 0;
    for (int32_t i = 0; i < steps && !rc; i++) {
        const float *logits;
        double f0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
        if (llmopt_session_forward(s, B, tok, pos, slot, B, rows, &logits, &err)) {
            rc = 1;
            break;
        }
        *fwd += clock_s(CLOCK_THREAD_CPUTIME_ID) - f0;
        for (int32_t b = 0; b < B; b++) { /* greedy, as the server's load test runs */
            int32_t best = 0;
            for (int32_t v = 1; v < n_vocab; v++)
                if (logits[(size_t)b * n_vocab + v] > logits[(size_t)b * n_vocab + best]) best = v;
            tok[b] = best;
            pos[b]++;
        }
    }
    *wall = clock_s(CLOCK_MONOTONIC) - w0;
    *cpu = clock_s(CLOCK_THREAD_CPUTIME_ID) - c0;
    if (rc) fprintf(stderr, "bench_batch_decode: %s\n", err.msg);
    free(tok);
    free(pos);
    free(slot);
    free(rows);
    return rc;
}

/* One more repetition with the per-node profile on: each op family's us per token. */
static int print_profile(struct llmopt_session *s, int32_t n_vocab, int32_t B, int32_t steps) {
    struct llmopt_err err = {0};
    struct llmopt_profile p;
    double w, c, f;
    if (llmopt_session_profile_start(s, &err)) {
        fprintf(stderr, "bench_batch_decode: %s\n", err.msg);
        return 1;
    }
    int rc = run_batch(s, n_vocab, B, steps, &w, &c, &f);
    llmopt_session_profile_read(s, &p);
    llmopt_session_profile_stop(s);
    if (rc) return rc;
    double per = 1e6 / ((double)steps * B), fam = 0;
    printf("       profile us/token:");
    for (int i = 0; i < LLMOPT_OPS_COUNT; i++) {
        /* the profile also counts the prompts' forwards: scale to the decode steps */
        double sec = p.family[i].seconds * (f / p.forward_seconds);
        fam += sec;
        printf(" %s %.2f", llmopt_op_family_name((enum llmopt_op_family)i), sec * per);
    }
    printf(" | loop %.2f\n", (f - fam) * per);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr,
                "usage: bench_batch_decode MODEL.gguf [-t THREADS] [-m MIN_B] [-b MAX_B] [-n STEPS] [-r REPS] [-P 1]"
                " [--backend B]\n");
        return 2;
    }
    int32_t threads = 1, min_b = 1, max_b = 32, steps = 64, reps = 5, prof = 0;
    const char *backend = NULL;
    for (int i = 2; i + 1 < argc; i += 2) {
        int32_t v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--backend")) backend = argv[i + 1];
        else if (!strcmp(argv[i], "-t")) threads = v;
        else if (!strcmp(argv[i], "-b")) max_b = v;
        else if (!strcmp(argv[i], "-m")) min_b = v;
        else if (!strcmp(argv[i], "-n")) steps = v;
        else if (!strcmp(argv[i], "-r")) reps = v;
        else if (!strcmp(argv[i], "-P")) prof = v;
        else {
            fprintf(stderr, "bench_batch_decode: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (threads < 0 || min_b < 1 || max_b < min_b || steps < 1 || reps < 1) {
        fprintf(stderr, "bench_batch_decode: -t >= 0, 1 <= -m <= -b, -n and -r >= 1\n");
        return 2;
    }
    struct llmopt_err err = {0};
    struct llmopt_model *m = NULL;
    struct llmopt_load_opts lo = {0};
    if (llmopt_model_load(argv[1], &lo, &m, &err)) {
        fprintf(stderr, "bench_batch_decode: %s\n", err.msg);
        return 1;
    }
    struct llmopt_session_opts so = {.n_ctx = 10 + steps + 1, .n_batch = max_b, .n_slots = max_b,
                                     .n_threads = threads, .backend = backend};
    struct llmopt_session *s = NULL;
    if (llmopt_session_create(m, &so, &s, &err)) {
        fprintf(stderr, "bench_batch_decode: %s\n", err.msg);
        llmopt_model_free(m);
        return 1;
    }
    int32_t n_vocab = llmopt_model_n_vocab(m);
    printf("%s: %d decode steps after a 10-token prompt, %s, %d threads, best of %d\n", argv[1], steps,
           backend ? backend : "cpu", threads, reps);
    printf("%6s %14s %14s %13s %13s %13s %11s\n", "batch", "us/token wall", "us/token cpu", "speedup wall",
           "speedup cpu", "us/tok fwd cpu", "speedup fwd");
    double base = 0, base_cpu = 0, base_fwd = 0;
    int rc = 0;
    for (int32_t B = min_b; B <= max_b && !rc; B = B * 2 > max_b && B < max_b ? max_b : B * 2) {
        double best_w = 1e30, best_c = 1e30, best_f = 1e30;
        for (int32_t r = 0; r < reps && !rc; r++) {
            double w, c, f;
            rc = run_batch(s, n_vocab, B, steps, &w, &c, &f);
            if (w < best_w) best_w = w;
            if (c < best_c) best_c = c;
            if (f < best_f) best_f = f;
        }
        double per = 1e6 / ((double)steps * B);
        double us = best_w * per, usc = best_c * per, usf = best_f * per;
        if (B == min_b) {
            base = us;
            base_cpu = usc;
            base_fwd = usf;
        }
        printf("%6d %14.2f %14.2f %12.2fx %12.2fx %14.2f %10.2fx\n", B, us, usc, base / us, base_cpu / usc, usf,
               base_fwd / usf);
        if (prof && !rc) rc = print_profile(s, n_vocab, B, steps);
    }
    llmopt_session_free(s);
    llmopt_model_free(m);
    return rc;
}
