/* llmopt inspect: metadata and tensor table of a GGUF file. */
#include "cli.h"

#include <stdio.h>

int cmd_inspect(int argc, char **argv) {
    if (argc != 1) return usage_error("inspect: %s", "needs exactly one FILE.gguf");
    struct llmopt_err err = {0};
    if (llmopt_inspect_gguf(argv[0], stdout, &err)) return fail(&err);
    return 0;
}

