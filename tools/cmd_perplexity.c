/* llmopt perplexity: mean negative log-likelihood per token and perplexity of a model
 * over a text, with teacher forcing, computed as llama.cpp's perplexity tool does so the
 * numbers compare: the text is tokenized once (with BOS when the model adds one) and cut
 * into chunks of ctx tokens (a partial last chunk is dropped); each chunk runs from an
 * empty cache with its first token replaced by BOS, and only the second half of each
 * chunk is scored (every scored token sees at least ctx/2 tokens of context). */
#include "base/clock.h"
#include "cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* log softmax(logits)[target], in double. */
static double log_prob(const float *logits, int32_t n_vocab, int32_t target) {
    float max = logits[0];
    for (int32_t v = 1; v < n_vocab; v++)
        if (logits[v] > max) max = logits[v];
    double sum = 0;
    for (int32_t v = 0; v < n_vocab; v++) sum += exp((double)logits[v] - max);
    return (double)logits[target] - max - log(sum);
}

int cmd_perplexity(int argc, char **argv) {
    const char *model_path = NULL, *text_path = NULL, *backend = NULL;
    long long ctx = 0, threads = 0, batch = 0, max_chunks = 0;
    bool as_json = false;
    for (int i = 0; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--json")) as_json = true;
        else if (!strcmp(argv[i], "-f") && (v = option_value(argc, argv, &i))) text_path = v;
        else if (!strcmp(argv[i], "--ctx") && (v = option_value(argc, argv, &i))) {
            if (!parse_long(v, 4, 1 << 20, &ctx)) return usage_error("perplexity: --ctx needs 4..1048576, got '%s'", v);
        } else if (!strcmp(argv[i], "--batch") && (v = option_value(argc, argv, &i))) {
            if (!parse_long(v, 1, 1 << 16, &batch)) return usage_error("perplexity: --batch needs 1..65536, got '%s'", v);
        } else if (!strcmp(argv[i], "--chunks") && (v = option_value(argc, argv, &i))) {
            if (!parse_long(v, 1, 1 << 30, &max_chunks))
                return usage_error("perplexity: --chunks needs a positive count, got '%s'", v);
        } else if (!strcmp(argv[i], "-t") && (v = option_value(argc, argv, &i))) {
            if (!parse_long(v, 1, 1024, &threads)) return usage_error("perplexity: -t needs 1..1024, got '%s'", v);
        } else if (!strcmp(argv[i], "--backend") && (v = option_value(argc, argv, &i))) backend = v;
        else if (argv[i][0] == '-') return usage_error("perplexity: unknown option or missing value '%s'", argv[i]);
        else if (!model_path) model_path = argv[i];
        else return usage_error("perplexity: unexpected argument '%s'", argv[i]);
    }
    if (!model_path) return usage_error("perplexity: %s", "missing MODEL");
    if (!text_path) return usage_error("perplexity: %s", "missing -f TEXT");
    struct llmopt_err err = {0};
    struct llmopt_model *model = NULL;
    struct llmopt_session *s = NULL;
    char *text = NULL;
    int32_t *ids = NULL, *chunk = NULL, *pos = NULL, *slots = NULL, *rows = NULL;
    int rc = 1;
    size_t len, n_ids = 0;
    if (!(text = cli_read_file(text_path, &len, &err))) goto done;
    if (llmopt_model_load(model_path, NULL, &model, &err)) goto done;
    if (!ctx) ctx = llmopt_model_ctx_train(model) < 512 ? llmopt_model_ctx_train(model) : 512;
    if (!batch) batch = ctx < 256 ? ctx : 256;
    if (batch > ctx) batch = ctx;
    bool add_bos = llmopt_add_bos_default(model);
    /* Plain text: control tokens written in it stay text, as for untrusted input. */
    enum llmopt_status st = llmopt_tokenize_ex(model, text, len, add_bos, false, NULL, 0, &n_ids, &err);
    if (st && st != LLMOPT_ERR_LIMIT) goto done;
    if (!(ids = malloc((n_ids ? n_ids : 1) * sizeof *ids))) goto oom;
    if (llmopt_tokenize_ex(model, text, len, add_bos, false, ids, n_ids, &n_ids, &err)) goto done;
    if ((long long)n_ids < 2 * ctx) {
        err.status = LLMOPT_ERR_INVALID_ARG;
        snprintf(err.msg, sizeof err.msg,
                 "perplexity: %s tokenizes to %zu tokens; a context of %lld needs at least %lld (lower --ctx)",
                 text_path, n_ids, ctx, 2 * ctx);
        goto done;
    }
    long long n_chunks = (long long)n_ids / ctx;
    if (max_chunks && n_chunks > max_chunks) n_chunks = max_chunks;
    struct llmopt_session_opts so = {.n_ctx = (int32_t)ctx, .n_batch = (int32_t)batch,
                                     .n_threads = (int32_t)threads, .backend = backend};
    if (llmopt_session_create(model, &so, &s, &err)) goto done;
    chunk = malloc((size_t)ctx * sizeof *chunk);
    pos = malloc((size_t)batch * sizeof *pos);
    slots = calloc((size_t)batch, sizeof *slots);
    rows = malloc((size_t)batch * sizeof *rows);
    if (!chunk || !pos || !slots || !rows) goto oom;
    int32_t n_vocab = llmopt_model_n_vocab(model), bos = llmopt_token_bos(model);
    long long first = ctx / 2, count = 0;
    double nll = 0, nll2 = 0, t0 = clock_now_s();
    if (!as_json) fprintf(stderr, "perplexity: %zu tokens, %lld chunks of %lld, scoring the last %lld of each\n",
                          n_ids, n_chunks, ctx, ctx - first - 1);
    for (long long c = 0; c < n_chunks; c++) {
        memcpy(chunk, ids + c * ctx, (size_t)ctx * sizeof *chunk);
        if (add_bos && bos >= 0) chunk[0] = bos;
        llmopt_session_reset(s, 0);
        for (long long b0 = 0; b0 < ctx; b0 += batch) {
            int32_t n = (int32_t)(ctx - b0 < batch ? ctx - b0 : batch), n_out = 0;
            for (int32_t t = 0; t < n; t++) {
                pos[t] = (int32_t)(b0 + t);
                if (b0 + t >= first && b0 + t < ctx - 1) rows[n_out++] = t;
            }
            if (!n_out) rows[n_out++] = n - 1; /* a forward returns at least one row */
            const float *logits;
            if (llmopt_session_forward(s, n, chunk + b0, pos, slots, n_out, rows, &logits, &err)) goto done;
            for (int32_t r = 0; r < n_out; r++) {
                long long j = b0 + rows[r];
                if (j < first || j >= ctx - 1) continue;
                /* scored against the text's own next token (not the BOS substitution) */
                double lp = log_prob(logits + (size_t)r * (size_t)n_vocab, n_vocab, ids[c * ctx + j + 1]);
                nll -= lp;
                nll2 += lp * lp;
                count++;
            }
        }
        if (!as_json) fprintf(stderr, "[%lld]%.4f%s", c + 1, exp(nll / (double)count), c + 1 < n_chunks ? "," : "\n");
    }
    double seconds = clock_now_s() - t0, mean = nll / (double)count, ppl = exp(mean);
    double var = nll2 / (double)count - mean * mean;
    double se = var > 0 && count > 1 ? sqrt(var / (double)(count - 1)) : 0;
    if (as_json) {
        printf("{\"model\": \"%s\", \"text\": \"%s\", \"tokens\": %zu, \"ctx\": %lld, \"chunks\": %lld, "
               "\"scored\": %lld, \"mean_nll\": %.6f, \"mean_logprob\": %.6f, \"nll_stderr\": %.6f, "
               "\"perplexity\": %.4f, \"perplexity_stderr\": %.4f, \"seconds\": %.3f}\n",
               model_path, text_path, n_ids, ctx, n_chunks, count, mean, -mean, se, ppl, se * ppl, seconds);
    } else {
        printf("tokens      %zu (%lld chunks of %lld; %lld scored)\n", n_ids, n_chunks, ctx, count);
        printf("mean NLL    %.6f nats per token (mean log-prob %.6f; +/- %.6f)\n", mean, -mean, se);
        printf("perplexity  %.4f +/- %.4f\n", ppl, se * ppl);
        printf("time        %.2f s (%.1f tok/s)\n", seconds, (double)(n_chunks * ctx) / seconds);
    }
    rc = 0;
    goto done;
oom:
    err.status = LLMOPT_ERR_NOMEM;
    snprintf(err.msg, sizeof err.msg, "perplexity: out of memory");
done:
    if (rc) fail(&err);
    free(text);
    free(ids);
    free(chunk);
    free(pos);
    free(slots);
    free(rows);
    llmopt_session_free(s);
    llmopt_model_free(model);
    return rc;
}
