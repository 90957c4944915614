/* Shared helpers of the llmopt CLI (see cli.h). */
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

const char cli_usage_text[] =
    "usage: llmopt COMMAND ...\n"
    "\n"
    "commands:\n"
    "  run MODEL [-p PROMPT] [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P]\n"
    "            [--repeat-penalty R] [--repeat-last-n N] [--seed S] [--ctx N] [--ids] [-v]\n"
    "            [--prompt-ids ID,ID,...] [--kv-type f16|q8_0|f32] [--backend cpu|cpu-ref|cuda]\n"
    "      generate text from a GGUF file, a Hugging Face directory or a compiled ENGINE_DIR\n"
    "  tokenize MODEL TEXT [--no-bos] [--no-special]\n"
    "      print token ids, space-separated; MODEL: a GGUF or a Hugging Face tokenizer\n"
    "      directory; special tokens in TEXT are parsed unless --no-special\n"
    "  detokenize MODEL ID...             print the text of token ids\n"
    "  template MODEL --messages FILE.json [--add-generation-prompt] [--tools FILE.json]\n"
    "           [--extra JSON|@FILE] [--chat-template FILE]\n"
    "      print the prompt the chat template renders, exactly (docs/templates.md)\n"
    "  chat MODEL [--system TEXT] [--chat-template FILE] [--extra JSON|@FILE] [-n N] [--temp T]\n"
    "       [--top-k K] [--top-p P] [--min-p P] [--repeat-penalty R] [--seed S] [--ctx N]\n"
    "       [--kv-type f16|q8_0|f32] [--backend cpu|cpu-ref|cuda] [-v]\n"
    "      interactive chat (or one message per line from a pipe); /reset, /system TEXT, /exit\n"
    "  inspect FILE.gguf                  print metadata and the tensor table\n"
    "  serve MODEL [--host 127.0.0.1] [--port 8080] [--api-key KEY] [--parallel N] [--ctx TOKENS]\n"
    "        [--chat-template FILE] [--max-body BYTES] [--queue N] [--prefill-chunk N] [-t N]\n"
    "        [--engines N] [--kv-type f16|q8_0|f32] [--stream-batch N] [--no-prefix-cache]\n"
    "        [--backend cpu|cpu-ref|cuda] [-v]\n"
    "      OpenAI-compatible HTTP server with continuous batching (docs/server.md)\n"
    "  compile MODEL [-o ENGINE_DIR] [--batch N] [--profile P] [--kv-type T] [--dump-ir] [--no-passes]\n"
    "      bind the stock program, run the passes, plan memory, write ENGINE_DIR/model.llmopt\n"
    "  check ENGINE_DIR/model.llmopt      validate a compiled Model Program\n"
    "  bench MODEL [-p 512] [-n 128] [-r 3] [-t THREADS] [--profile P] [--backend B]\n"
    "        [--kv-type f16|q8_0|f32] [--temp T] [--top-k K] [--top-p P] [--min-p P]\n"
    "        [--repeat-penalty R] [--seed S] [--json]\n"
    "      prefill/decode tok/s, inter-token latency, bytes per token and roofline fraction;\n"
    "      greedy decode unless a sampling option is given (the others then as run's defaults)\n"
    "  profile MODEL [-p 128] [-n 64] [-r 3] [-t THREADS] [--profile P] [--kv-type T] [--prefill]\n"
    "          [--json]\n"
    "      decode (or with --prefill the prompt's) time per op family (attention, qkv, attn_out,\n"
    "      mlp, lm_head, norm, rope, other), kernels per token and each family's GB/s\n"
    "  mem MODEL [--ctx N] [--parallel N] [--batch N] [--kv-type T] [--no-load] [-t N] [--json]\n"
    "      weights by type, KV cache, planned arena and their total; then the measured peak RSS\n"
    "  perplexity MODEL -f TEXT [--ctx N] [--batch N] [--chunks N] [-t N] [--backend B] [--json]\n"
    "      mean negative log-likelihood and perplexity over a text (llama.cpp's method)\n"
    "  probe [-o PROFILE.json] [--quick] [-t THREADS] | --show PROFILE.json\n"
    "      measure this machine (dispatch, bandwidth, FMA and int8 peaks) into a target profile\n"
    "  synth --like NAME --type TYPE -o OUT.gguf [--seed S] [--layers N] [-t THREADS] | --list\n"
    "      random-weight GGUF at a real model's shapes with its vocabulary (docs/tools.md)\n"
    "  quantize IN.gguf OUT.gguf TYPE [-t THREADS]\n"
    "      convert every matrix to TYPE: f32 f16 bf16 q8_0 q4_0 q4_k q5_k q6_k q4_k_m q5_k_m\n"
    "\n"
    "common options: --programs DIR (stock programs; default: the build's programs/)\n"
    "KV cache: --kv-type f16 (default; a Model Program's recorded type wins), q8_0 (blocks of 32\n"
    "          int8, head size a multiple of 32; on CUDA also at most 128) or f32\n";

int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "llmopt: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n\n%s", cli_usage_text);
    return 2;
}

int fail(const struct llmopt_err *err) {
    fprintf(stderr, "llmopt: error: %s\n", err->msg[0] ? err->msg : llmopt_status_str(err->status));
    return 1;
}

/* Parses a whole-string number; false on junk or out of range. */
bool parse_long(const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool parse_float(const char *s, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end) return false;
    *out = v;
    return true;
}

/* Value of option argv[*i] (advancing *i), or NULL when missing. */
const char *option_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) return NULL;
    return argv[++*i];
}

/* "CMD: OPTION needs WHAT, got 'V'" as a usage error. */
static int bad_option_value(const char *cmd, const char *need, const char *v) {
    char fmt[128];
    snprintf(fmt, sizeof fmt, "%s: %s, got '%%s'", cmd, need);
    return usage_error(fmt, v);
}

int cli_sampling_option(const char *cmd, const char *arg, const char *v, struct llmopt_sampling *s,
                        bool *seed_given) {
    long long n;
    if (!strcmp(arg, "--temp")) {
        if (!parse_float(v, &s->temperature)) return bad_option_value(cmd, "--temp needs a number", v);
    } else if (!strcmp(arg, "--top-k")) {
        if (!parse_long(v, INT32_MIN, INT32_MAX, &n))
            return bad_option_value(cmd, "--top-k needs an integer", v);
        s->top_k = (int32_t)n;
    } else if (!strcmp(arg, "--top-p")) {
        if (!parse_float(v, &s->top_p)) return bad_option_value(cmd, "--top-p needs a number", v);
    } else if (!strcmp(arg, "--min-p")) {
        if (!parse_float(v, &s->min_p)) return bad_option_value(cmd, "--min-p needs a number", v);
    } else if (!strcmp(arg, "--repeat-penalty")) {
        if (!parse_float(v, &s->repeat_penalty))
            return bad_option_value(cmd, "--repeat-penalty needs a number", v);
    } else if (!strcmp(arg, "--repeat-last-n")) {
        if (!parse_long(v, -1, INT32_MAX, &n))
            return bad_option_value(cmd, "--repeat-last-n needs an integer >= -1", v);
        s->repeat_last_n = (int32_t)n;
    } else if (!strcmp(arg, "--seed") || !strcmp(arg, "-s")) {
        if (!parse_long(v, 0, LLONG_MAX, &n))
            return bad_option_value(cmd, "--seed needs an integer >= 0", v);
        s->seed = (uint64_t)n;
        *seed_given = true;
    } else {
        return -1;
    }
    return 0;
}

double cli_profile_read_bandwidth(const char *path) {
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    double best = 0;
    const json_t *m = json_object_get(root, "measurements");
    const char *keys[] = {"read_bandwidth_simd_all", "read_bandwidth_plain_all"};
    for (int k = 0; k < 2; k++) {
        double v = json_number_value(json_object_get(json_object_get(m, keys[k]), "best"));
        if (v > best) best = v;
    }
    json_decref(root);
    return best;
}

int cli_parse_bench_opts(const char *cmd, int argc, char **argv, struct cli_bench_opts *o) {
    static const struct {
        const char *flag;
        long long lo, hi;
    } counts[] = {{"-p", 1, 1 << 16}, {"-n", 1, 1 << 16}, {"-r", 1, 100}, {"-t", 1, 1024}};
    long long *dst[] = {&o->n_prompt, &o->n_gen, &o->reps, &o->threads};
    char msg[128];
    int bad = 0;
    bool seed_given = false;
    for (int i = 0; i < argc; i++) {
        const char *v = NULL;
        int c = 0;
        while (c < 4 && strcmp(argv[i], counts[c].flag)) c++;
        if (!strcmp(argv[i], "--json")) {
            o->json = true;
        } else if (!strcmp(argv[i], "--prefill") && !strcmp(cmd, "profile")) {
            o->prefill = true;
        } else if (c < 4 && (v = option_value(argc, argv, &i))) {
            if (!parse_long(v, counts[c].lo, counts[c].hi, dst[c])) {
                snprintf(msg, sizeof msg, "%s: %s needs %lld..%lld, got '%%s'", cmd, counts[c].flag, counts[c].lo,
                         counts[c].hi);
                return usage_error(msg, v);
            }
        } else if (!strcmp(argv[i], "--profile") && (v = option_value(argc, argv, &i))) {
            o->profile = v;
        } else if (!strcmp(argv[i], "--backend") && (v = option_value(argc, argv, &i))) {
            o->backend = v;
        } else if (!strcmp(argv[i], "--kv-type") && (v = option_value(argc, argv, &i))) {
            if (!llmopt_kv_type_parse(v, &o->kv_type)) return bad_option_value(cmd, "--kv-type needs f16, q8_0 or f32", v);
        } else if (!strcmp(cmd, "bench") && i + 1 < argc &&
                   (bad = cli_sampling_option(cmd, argv[i], argv[i + 1], &o->sampling, &seed_given)) >= 0) {
            if (bad) return bad;
            o->sample = true;
            i++;
        } else if (argv[i][0] == '-' || o->model) {
            snprintf(msg, sizeof msg, "%s: %s '%%s'", cmd,
                     argv[i][0] == '-' ? "unknown option or missing value" : "unexpected argument");
            return usage_error(msg, argv[i]);
        } else {
            o->model = argv[i];
        }
    }
    if (!o->model) {
        snprintf(msg, sizeof msg, "%s: %%s", cmd);
        return usage_error(msg, "missing MODEL");
    }
    if (o->profile && !(o->read_bw = cli_profile_read_bandwidth(o->profile))) {
        fprintf(stderr,
                "llmopt: error: %s: %s holds no read bandwidth measurement (write one with "
                "llmopt probe -o)\n",
                cmd, o->profile);
        return 1;
    }
    return 0;
}

enum llmopt_status cli_bench_setup(const struct cli_bench_opts *o, struct llmopt_model **model,
                                   struct llmopt_session **s, int32_t *tokens, struct llmopt_err *err) {
    enum llmopt_status st = llmopt_model_load(o->model, NULL, model, err);
    if (st) return st;
    struct llmopt_session_opts so = {.n_ctx = (int32_t)(o->n_prompt + o->n_gen + 1),
                                     .n_batch = (int32_t)(o->n_prompt < 512 ? o->n_prompt : 512),
                                     .n_threads = (int32_t)o->threads,
                                     .backend = o->backend,
                                     .kv_type = o->kv_type};
    if ((st = llmopt_session_create(*model, &so, s, err))) return st;
    int32_t n_vocab = llmopt_model_n_vocab(*model);
    for (long long i = 0; i < o->n_prompt; i++) tokens[i] = (int32_t)(1 + (i * 7919) % (n_vocab - 1));
    return LLMOPT_OK;
}

int32_t cli_argmax(const float *logits, int32_t n) {
    int32_t best = 0;
    for (int32_t v = 1; v < n; v++)
        if (logits[v] > logits[best]) best = v;
    return best;
}
