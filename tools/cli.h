/* Shared helpers of the llmopt command-line tool: argument parsing and error
 * printing. Each subcommand lives in its own tools/cmd_*.c file and is listed in the
 * command table of tools/llmopt.c. */
#ifndef LLMOPT_TOOLS_CLI_H
#define LLMOPT_TOOLS_CLI_H

#include "llmopt.h"

#include <stdbool.h>

extern const char cli_usage_text[];

/* Prints "llmopt: <message>" and the usage; returns 2 (the exit code for bad usage). */
int usage_error(const char *fmt, const char *arg);
/* Prints the error's message; returns 1. */
int fail(const struct llmopt_err *err);
/* Whole-string numbers; false on junk or out of range. */
bool parse_long(const char *s, long long lo, long long hi, long long *out);
bool parse_float(const char *s, float *out);
/* Value of option argv[*i] (advancing *i), or NULL when missing. */
const char *option_value(int argc, char **argv, int *i);
/* The sampling options of run and chat: --temp, --top-k, --top-p, --min-p,
 * --repeat-penalty, --repeat-last-n and --seed/-s (which sets *seed_given). Returns 0
 * when arg (with value v) is one of them, stored in *s; -1 when it is none of them;
 * else usage_error's exit code for a bad value, the message prefixed with cmd. */
int cli_sampling_option(const char *cmd, const char *arg, const char *v, struct llmopt_sampling *s,
                        bool *seed_given);

/* Reads a whole file ("-": stdin) into a NUL-terminated malloc'd buffer (tools/cmd_template.c). */
char *cli_read_file(const char *path, size_t *len, struct llmopt_err *err);
/* A chat template from text with bos/eos strings from MODEL's tokenizer (NULL: none). */
enum llmopt_status cli_template_from_text(const char *model, const char *text, size_t len,
                                          struct llmopt_chat_template **out, struct llmopt_err *err);
/* Replaces the generic "chat template" at the start of an error message with path. */
void cli_name_template_error(struct llmopt_err *err, const char *path);

/* Best all-thread read bandwidth (GB/s) of a `llmopt probe` profile; 0 when the file
 * is unreadable or has none. */
double cli_profile_read_bandwidth(const char *path);
/* Options of bench and profile: MODEL [-p N] [-n N] [-r N] [-t N] [--profile P]
 * [--backend B] [--kv-type T] [--json]. */
struct cli_bench_opts {
    const char *model, *profile, *backend;
    long long n_prompt, n_gen, reps, threads; /* the caller sets the defaults */
    enum llmopt_kv_type kv_type;
    bool json;
    bool prefill; /* profile --prefill: time the prompt's forward instead of decode steps */
    double read_bw; /* GB/s: the --profile's measured read bandwidth; 0 without one */
    bool sample;    /* bench: a sampling flag was given: decode draws with `sampling` */
    struct llmopt_sampling sampling; /* the caller sets the defaults */
};
/* Parses argv into o for command `cmd` (and reads the --profile's bandwidth, which it
 * must hold); returns 0, or the exit code (usage or error printed). */
int cli_parse_bench_opts(const char *cmd, int argc, char **argv, struct cli_bench_opts *o);
/* Loads o->model and a one-slot session for its prompt and generation (prompt chunks of
 * up to 512 tokens), and fills tokens[o->n_prompt] with the prompt both commands feed:
 * ordinary ids (the content does not change the cost). */
enum llmopt_status cli_bench_setup(const struct cli_bench_opts *o, struct llmopt_model **model,
                                   struct llmopt_session **s, int32_t *tokens, struct llmopt_err *err);
/* Index of the largest of n logits (greedy choice). */
int32_t cli_argmax(const float *logits, int32_t n);

int cmd_run(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_compile(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_check(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_probe(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_profile(int argc, char **argv);
int cmd_mem(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);

#endif
