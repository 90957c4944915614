/* llmopt: one command-line tool with subcommands. Uses only the public API; each
 * subcommand is a tools/cmd_*.c file listed in the table below. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
} commands[] = {
    {"run", cmd_run},
    {"tokenize", cmd_tokenize},
    {"template", cmd_template},
    {"chat", cmd_chat},
    {"detokenize", cmd_detokenize},
    {"inspect", cmd_inspect},
    {"compile", cmd_compile},
    {"serve", cmd_serve},
    {"check", cmd_check},
    {"bench", cmd_bench},
    {"probe", cmd_probe},
    {"synth", cmd_synth},
    {"quantize", cmd_quantize},
    {"profile", cmd_profile},
    {"mem", cmd_mem},
    {"perplexity", cmd_perplexity},
};

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        fputs(cli_usage_text, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 2, argv + 2);
    return usage_error("unknown command '%s'", argv[1]);
}
