/* llmopt synth: a random-weight GGUF at a real model's shapes with its real vocabulary,
 * for benchmarks (src/runtime/synth.h; docs/tools.md). */
#include "cli.h"
#include "runtime/synth.h"

#include <stdio.h>
#include <string.h>

int cmd_synth(int argc, char **argv) {
    struct synth_opts o = {.seed = 1};
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        long long v;
        if (!strcmp(arg, "--list")) {
            synth_list(stdout);
            return 0;
        }
        const char *val = option_value(argc, argv, &i);
        if (!val) return usage_error("synth: option '%s' needs a value (or is unknown)", arg);
        if (!strcmp(arg, "--like"))
            o.like = val;
        else if (!strcmp(arg, "--type"))
            o.type = val;
        else if (!strcmp(arg, "-o"))
            o.out_path = val;
        else if (!strcmp(arg, "--programs"))
            o.programs_dir = val;
        else if (!strcmp(arg, "--vocab-from"))
            o.vocab_path = val;
        else if (!strcmp(arg, "--seed")) {
            if (!parse_long(val, 0, (long long)(~0ull >> 1), &v))
                return usage_error("synth: --seed needs a non-negative integer, got '%s'", val);
            o.seed = (uint64_t)v;
        } else if (!strcmp(arg, "--layers")) {
            if (!parse_long(val, 1, 4096, &v))
                return usage_error("synth: --layers needs 1..4096, got '%s'", val);
            o.n_layers = (int)v;
        } else if (!strcmp(arg, "-t")) {
            if (!parse_long(val, 1, 4096, &v))
                return usage_error("synth: -t needs 1..4096, got '%s'", val);
            o.threads = (int)v;
        } else {
            return usage_error("synth: unknown option '%s'", arg);
        }
    }
    if (!o.like || !o.type || !o.out_path)
        return usage_error(
            "synth: %s", "needs --like NAME, --type TYPE and -o OUT.gguf (--list shows the names)");
    struct synth_report rep;
    struct llmopt_err err = {0};
    if (synth_write(&o, &rep, &err)) return fail(&err);
    synth_report_print(&rep, o.out_path, stdout);
    return 0;
}
