/* llmopt probe: measure this machine into a target profile (src/target/profile.h). */
#include "cli.h"
#include "target/profile.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

int cmd_probe(int argc, char **argv) {
    const char *out_path = NULL, *show_path = NULL;
    struct target_probe_opts opts = {.progress = stderr};
    for (int i = 0; i < argc; i++) {
        long long v;
        if (!strcmp(argv[i], "--quick")) {
            opts.quick = true;
        } else if (!strcmp(argv[i], "-o")) {
            if (!(out_path = option_value(argc, argv, &i)))
                return usage_error("probe: %s needs a path", "-o");
        } else if (!strcmp(argv[i], "--show")) {
            if (!(show_path = option_value(argc, argv, &i)))
                return usage_error("probe: %s needs a path", "--show");
        } else if (!strcmp(argv[i], "-t")) {
            const char *s = option_value(argc, argv, &i);
            if (!s || !parse_long(s, 1, 4096, &v))
                return usage_error("probe: -t needs a thread count in 1..4096, got '%s'",
                                   s ? s : "");
            opts.threads = (int)v;
        } else {
            return usage_error("probe: unexpected argument '%s'", argv[i]);
        }
    }

    struct target_profile profile;
    struct llmopt_err err = {0};
    if (show_path) {
        if (out_path || opts.quick || opts.threads)
            return usage_error("probe: %s takes no other option", "--show");
        if (target_profile_read_json(show_path, &profile, &err)) return fail(&err);
        target_profile_print(&profile, stdout);
        return 0;
    }

    /* Open the output first: a bad path fails now, not after the measurements. */
    bool json_to_stdout = out_path && !strcmp(out_path, "-");
    FILE *out = NULL;
    if (out_path && !json_to_stdout && !(out = fopen(out_path, "w"))) {
        fprintf(stderr, "llmopt: error: cannot write %s: %s\n", out_path, strerror(errno));
        return 1;
    }
    if (json_to_stdout) out = stdout;
    enum llmopt_status st = target_probe(&opts, &profile, &err);
    if (st == LLMOPT_OK) {
        /* With the JSON on stdout the table moves to stderr, so stdout stays parseable. */
        target_profile_print(&profile, json_to_stdout ? stderr : stdout);
        if (out) st = target_profile_write_json(&profile, out, &err);
    }
    if (out && out != stdout && fclose(out) && !st)
        st = err_set(&err, LLMOPT_ERR_IO, "close failed: %s", strerror(errno));
    if (st) {
        if (out && out != stdout) {
            remove(out_path); /* no half-written profile */
            err_prefix(&err, "%s", out_path);
        }
        return fail(&err);
    }
    if (out && out != stdout) fprintf(stderr, "llmopt: wrote %s\n", out_path);
    return 0;
}
