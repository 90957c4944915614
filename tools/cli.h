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

int cmd_run(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_compile(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_check(int argc, char **argv);
int cmd_probe(int argc, char **argv);

#endif
