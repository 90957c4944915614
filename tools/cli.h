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
/* Monotonic clock in seconds. */
double cli_now_s(void);

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
