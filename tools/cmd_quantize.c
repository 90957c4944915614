/* llmopt quantize: a GGUF's matrices converted to another type, streaming row by row
 * (src/runtime/synth.h; docs/tools.md). */
#include "cli.h"
#include "runtime/synth.h"

#include <stdio.h>
#include <string.h>

int cmd_quantize(int argc, char **argv) {
    struct synth_quantize_opts o = {0};
    const char *positional[3];
    int n_positional = 0;
    for (int i = 0; i < argc; i++) {
        long long v;
        if (!strcmp(argv[i], "-t")) {
            const char *val = option_value(argc, argv, &i);
            if (!val || !parse_long(val, 1, 4096, &v))
                return usage_error("quantize: -t needs 1..4096, got '%s'", val ? val : "");
            o.threads = (int)v;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return usage_error("quantize: unknown option '%s'", argv[i]);
        } else if (n_positional < 3) {
            positional[n_positional++] = argv[i];
        } else {
            return usage_error("quantize: unexpected argument '%s'", argv[i]);
        }
    }
    if (n_positional != 3) return usage_error("quantize: %s", "needs IN.gguf OUT.gguf TYPE");
    o.in_path = positional[0];
    o.out_path = positional[1];
    o.type = positional[2];
    struct synth_report rep;
    struct llmopt_err err = {0};
    if (synth_quantize(&o, &rep, &err)) return fail(&err);
    synth_report_print(&rep, o.out_path, stdout);
    return 0;
}
