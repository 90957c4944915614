/* llmopt bench: prefill and decode speed of a model, as llama-bench reports them, plus
 * the roofline view: bytes read per decoded token and the fraction of the measured
 * read bandwidth (from a `llmopt probe` profile) that decode reaches. */
#include "base/clock.h"
#include "cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double percentile(const double *sorted, int n, double p) {
    if (n == 0) return 0;
    int i = (int)ceil(p / 100.0 * n) - 1;
    return sorted[i < 0 ? 0 : i >= n ? n - 1 : i];
}

int cmd_bench(int argc, char **argv) {
    struct cli_bench_opts o = {.n_prompt = 512, .n_gen = 128, .reps = 3};
    llmopt_sampling_default(&o.sampling);
    int bad = cli_parse_bench_opts("bench", argc, argv, &o);
    if (bad) return bad;
    struct llmopt_err err = {0};
    struct llmopt_model *model = NULL;
    struct llmopt_session *s = NULL;
    int rc = 1;
    double *prefill_s = calloc((size_t)o.reps, sizeof(double));
    double *itl = calloc((size_t)(o.reps * o.n_gen), sizeof(double));
    double *decode_s = calloc((size_t)o.reps, sizeof(double));
    int32_t *tokens = malloc((size_t)o.n_prompt * sizeof(int32_t));
    /* with sampling: the sequence so far, for the penalties */
    int32_t *hist = malloc((size_t)(o.n_prompt + o.n_gen + 1) * sizeof(int32_t));
    struct llmopt_sampler *smp = NULL;
    if (!prefill_s || !itl || !decode_s || !tokens || !hist) goto done;
    if (cli_bench_setup(&o, &model, &s, tokens, &err)) goto done;
    int n_itl = 0;
    double kernels_per_step = 0; /* launched per decode step, fusion included (last repetition) */
    for (long long r = 0; r <= o.reps; r++) { /* r == 0 warms up */
        llmopt_session_reset(s, 0);
        if (o.sample) { /* the same draws every repetition */
            llmopt_sampler_free(smp);
            smp = NULL;
            if (llmopt_sampler_create(&o.sampling, llmopt_model_n_vocab(model), &smp, &err)) goto done;
            memcpy(hist, tokens, (size_t)o.n_prompt * sizeof *hist);
        }
        size_t n_hist = (size_t)o.n_prompt;
        double t0 = clock_now_s();
        int32_t tok = 1;
        /* greedy decode: the backend picks the argmax (on the device for cuda); with
         * sampling, the session samples where the logits are */
        if (o.sample ? llmopt_session_append_sample(s, 0, tokens, (int32_t)o.n_prompt, smp, hist, n_hist, &tok, &err)
                     : llmopt_session_append_greedy(s, 0, tokens, (int32_t)o.n_prompt, &tok, &err))
            goto done;
        double t1 = clock_now_s();
        double prev = t1;
        uint64_t k0 = llmopt_session_kernels_run(s);
        for (long long g = 0; g < o.n_gen; g++) {
            hist[n_hist++] = tok;
            if (o.sample ? llmopt_session_append_sample(s, 0, &tok, 1, smp, hist, n_hist, &tok, &err)
                         : llmopt_session_append_greedy(s, 0, &tok, 1, &tok, &err))
                goto done;
            double t = clock_now_s();
            if (r > 0) itl[n_itl++] = t - prev;
            prev = t;
        }
        if (o.n_gen > 0) kernels_per_step = (double)(llmopt_session_kernels_run(s) - k0) / (double)o.n_gen;
        if (r > 0) {
            prefill_s[r - 1] = t1 - t0;
            decode_s[r - 1] = prev - t1;
        }
    }
    qsort(prefill_s, (size_t)o.reps, sizeof(double), cmp_double);
    qsort(decode_s, (size_t)o.reps, sizeof(double), cmp_double);
    qsort(itl, (size_t)n_itl, sizeof(double), cmp_double);
    double pp = o.n_prompt / prefill_s[o.reps / 2], tg = o.n_gen / decode_s[o.reps / 2];
    uint64_t bytes = llmopt_model_weight_bytes_per_token(model);
    double bw = o.read_bw;
    double roof = bw > 0 ? bw * 1e9 / (double)bytes : 0;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    struct llmopt_compile_stats cs;
    llmopt_model_compile_stats(model, &cs);
    if (o.json) {
        printf("{\"model\": \"%s\", \"program\": \"%s\", \"backend\": \"%s\", \"threads\": %lld, \"n_prompt\": %lld, "
               "\"n_gen\": %lld, \"reps\": %lld, \"prefill_tok_s\": %.2f, \"decode_tok_s\": %.2f, "
               "\"ttft_ms\": %.3f, \"itl_ms_p50\": %.3f, \"itl_ms_p95\": %.3f, \"itl_ms_p99\": %.3f, "
               "\"weight_bytes_per_token\": %llu, \"read_bandwidth_gbps\": %.2f, \"decode_roofline_tok_s\": %.2f, "
               "\"roofline_fraction\": %.3f, \"kernels_per_step\": %.1f, \"graph_kernels\": %d, \"peak_rss_mib\": %.1f, "
               "\"kv_type\": \"%s\", \"kv_bytes\": %llu, \"sampling\": \"%s\"}\n",
               o.model, llmopt_model_program(model), o.backend ? o.backend : "cpu", o.threads, o.n_prompt,
               o.n_gen, o.reps, pp, tg, prefill_s[o.reps / 2] * 1e3, percentile(itl, n_itl, 50) * 1e3,
               percentile(itl, n_itl, 95) * 1e3, percentile(itl, n_itl, 99) * 1e3, (unsigned long long)bytes, bw,
               roof, roof > 0 ? tg / roof : 0, kernels_per_step, cs.kernels_compiled, ru.ru_maxrss / 1024.0,
               llmopt_kv_type_name(llmopt_session_kv_type(s)), (unsigned long long)llmopt_session_kv_bytes(s),
               o.sample ? "sampled" : "greedy");
    } else {
        char thr[32];
        snprintf(thr, sizeof thr, o.threads ? "%lld" : "auto", o.threads);
        printf("model           %s (program %s, backend %s, threads %s)\n", o.model, llmopt_model_program(model),
               o.backend ? o.backend : "cpu", thr);
        printf("prefill         %lld tokens: %.1f tok/s (median of %lld; time to first token %.1f ms)\n", o.n_prompt,
               pp, o.reps, prefill_s[o.reps / 2] * 1e3);
        printf("decode          %lld tokens: %.1f tok/s; inter-token latency p50 %.2f / p95 %.2f / p99 %.2f ms\n",
               o.n_gen, tg, percentile(itl, n_itl, 50) * 1e3, percentile(itl, n_itl, 95) * 1e3,
               percentile(itl, n_itl, 99) * 1e3);
        if (o.sample)
            printf("sampling        temperature %g, top-k %d, top-p %g, min-p %g, repeat penalty %g, seed %llu\n",
                   (double)o.sampling.temperature, o.sampling.top_k, (double)o.sampling.top_p,
                   (double)o.sampling.min_p, (double)o.sampling.repeat_penalty,
                   (unsigned long long)o.sampling.seed);
        else
            printf("sampling        greedy\n");
        printf("bytes per token %.1f MB of weights (KV reads extra); kernels per decode step %.1f launched "
               "(%d in the compiled graph)\n",
               bytes / 1e6, kernels_per_step, cs.kernels_compiled);
        if (roof > 0)
            printf("roofline        %.1f GB/s measured read bandwidth -> ceiling %.1f tok/s; decode at %.0f%%\n", bw,
                   roof, 100.0 * tg / roof);
        printf("kv cache        %s, %.1f MiB for %lld positions\n", llmopt_kv_type_name(llmopt_session_kv_type(s)),
               (double)llmopt_session_kv_bytes(s) / (1024.0 * 1024.0), o.n_prompt + o.n_gen + 1);
        printf("peak RSS        %.1f MiB\n", ru.ru_maxrss / 1024.0);
    }
    rc = 0;
done:
    if (rc) fail(&err);
    free(prefill_s);
    free(itl);
    free(decode_s);
    free(tokens);
    free(hist);
    llmopt_sampler_free(smp);
    llmopt_session_free(s);
    llmopt_model_free(model);
    return rc;
}
