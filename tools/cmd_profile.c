/* llmopt profile: where a decode step's (--prefill: the prompt's) time goes, by op
 * family (attention, QKV projections, attention output projection, MLP, lm_head, norms,
 * rope, other), with kernels per token and each family's achieved bandwidth (bytes its
 * kernels read / its time) against the measured limit of a `llmopt probe` profile. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cmd_profile(int argc, char **argv) {
    struct cli_bench_opts o = {.n_prompt = 128, .n_gen = 64, .reps = 3};
    int bad = cli_parse_bench_opts("profile", argc, argv, &o);
    if (bad) return bad;
    struct llmopt_err err = {0};
    struct llmopt_model *model = NULL;
    struct llmopt_session *s = NULL;
    int rc = 1;
    int32_t *tokens = malloc((size_t)o.n_prompt * sizeof(int32_t));
    if (!tokens) goto done;
    if (cli_bench_setup(&o, &model, &s, tokens, &err)) goto done;
    int32_t n_vocab = llmopt_model_n_vocab(model);
    /* Best of reps runs (the one whose decode took least wall time): on a shared machine
     * a preempted step would otherwise charge its wait to whichever kernel it hit. */
    struct llmopt_profile p = {0}, run;
    for (long long r = 0; r < o.reps; r++) {
        const float *logits;
        llmopt_session_reset(s, 0);
        if (o.prefill && llmopt_session_profile_start(s, &err)) goto done;
        if (llmopt_session_append(s, 0, tokens, (int32_t)o.n_prompt, &logits, &err)) goto done;
        if (!o.prefill && llmopt_session_profile_start(s, &err)) goto done;
        for (long long g = 0; !o.prefill && g < o.n_gen; g++) {
            int32_t tok = cli_argmax(logits, n_vocab);
            if (llmopt_session_append(s, 0, &tok, 1, &logits, &err)) goto done;
        }
        llmopt_session_profile_read(s, &run);
        if (r == 0 || run.forward_seconds < p.forward_seconds) p = run;
    }
    llmopt_session_profile_stop(s);
    /* per decode step, or per prompt (its forwards summed: chunks of up to 512 tokens) */
    double steps = o.prefill ? 1.0 : (double)p.steps, kernel_s = 0;
    uint64_t kernels = 0, bytes = 0;
    for (int f = 0; f < LLMOPT_OPS_COUNT; f++) {
        kernel_s += p.family[f].seconds;
        kernels += p.family[f].kernels;
        bytes += p.family[f].bytes_read;
    }
    if (o.json) {
        printf("{\"model\": \"%s\", \"program\": \"%s\", \"backend\": \"%s\", \"threads\": %lld, \"n_prompt\": %lld, "
               "\"phase\": \"%s\", \"reps\": %lld, \"steps\": %llu, \"tokens\": %llu, \"step_ms\": %.4f, \"kernel_ms_per_step\": %.4f, "
               "\"kernels_per_token\": %.2f, \"bytes_per_step\": %.0f, \"read_bandwidth_gbps\": %.2f, \"families\": {",
               o.model, llmopt_model_program(model), o.backend ? o.backend : "cpu", o.threads, o.n_prompt,
               o.prefill ? "prefill" : "decode", o.reps,
               (unsigned long long)p.steps, (unsigned long long)p.tokens, 1e3 * p.forward_seconds / steps,
               1e3 * kernel_s / steps, (double)kernels / (double)p.tokens, (double)bytes / steps, o.read_bw);
        for (int f = 0; f < LLMOPT_OPS_COUNT; f++) {
            const struct llmopt_op_family_stats *st = &p.family[f];
            double gbps = st->seconds > 0 ? (double)st->bytes_read / st->seconds / 1e9 : 0;
            printf("%s\"%s\": {\"ms_per_step\": %.4f, \"kernels_per_step\": %.2f, \"bytes_per_step\": %.0f, "
                   "\"gbps\": %.3f, \"fraction_of_limit\": %.4f}",
                   f ? ", " : "", llmopt_op_family_name((enum llmopt_op_family)f), 1e3 * st->seconds / steps,
                   (double)st->kernels / steps, (double)st->bytes_read / steps, gbps,
                   o.read_bw > 0 ? gbps / o.read_bw : 0);
        }
        printf("}}\n");
    } else {
        char thr[32];
        snprintf(thr, sizeof thr, o.threads ? "%lld" : "all", o.threads);
        printf("model     %s (program %s, backend %s, threads %s)\n", o.model, llmopt_model_program(model),
               o.backend ? o.backend : "cpu", thr);
        if (o.prefill)
            printf("prefill   a %lld-token prompt in %llu forward(s) (best of %lld): %.3f ms (%.1f tok/s), "
                   "kernels %.3f ms (the rest is the loop between them)\n",
                   o.n_prompt, (unsigned long long)p.steps, o.reps, 1e3 * p.forward_seconds,
                   (double)o.n_prompt / p.forward_seconds, 1e3 * kernel_s);
        else
            printf("decode    %llu steps after a %lld-token prompt (best of %lld): %.3f ms/step (%.1f tok/s), "
                   "kernels %.3f ms (the rest is the loop between them)\n",
                   (unsigned long long)p.steps, o.n_prompt, o.reps, 1e3 * p.forward_seconds / steps,
                   steps / p.forward_seconds, 1e3 * kernel_s / steps);
        printf("kernels   %.1f per token; reads %.2f MB per %s\n", (double)kernels / (double)p.tokens,
               (double)bytes / steps / 1e6, o.prefill ? "prompt" : "step");
        if (o.read_bw > 0) printf("limit     %.1f GB/s read bandwidth (%s)\n", o.read_bw, o.profile);
        else printf("limit     no profile (pass --profile P.json from llmopt probe -o P.json)\n");
        printf("\n%-10s %9s %6s %8s %10s %8s %8s\n", "family", o.prefill ? "ms" : "ms/step", "time", "kernels",
               o.prefill ? "MB" : "MB/step", "GB/s",
               "of limit");
        for (int f = 0; f < LLMOPT_OPS_COUNT; f++) {
            const struct llmopt_op_family_stats *st = &p.family[f];
            double gbps = st->seconds > 0 ? (double)st->bytes_read / st->seconds / 1e9 : 0;
            char frac[16] = "-";
            if (o.read_bw > 0) snprintf(frac, sizeof frac, "%.0f%%", 100.0 * gbps / o.read_bw);
            printf("%-10s %9.3f %5.1f%% %8.1f %10.2f %8.2f %8s\n", llmopt_op_family_name((enum llmopt_op_family)f),
                   1e3 * st->seconds / steps, kernel_s > 0 ? 100.0 * st->seconds / kernel_s : 0,
                   (double)st->kernels / steps, (double)st->bytes_read / steps / 1e6, gbps, frac);
        }
    }
    rc = 0;
done:
    if (rc) fail(&err);
    free(tokens);
    llmopt_session_free(s);
    llmopt_model_free(model);
    return rc;
}
