/* llmopt serve: the OpenAI-compatible HTTP server (src/server/, docs/server.md). This
 * file only parses options; the server's entry point is srv_run. */
#include "cli.h"

#include "server/server.h"
#include "server/srv_sched.h"

#include <stdio.h>
#include <string.h>

int cmd_serve(int argc, char **argv) {
    struct srv_opts o = {
        .host = "127.0.0.1",
        .port = 8080,
        .n_slots = 4,
        .prefill_chunk = 256,
        .queue_cap = 64,
        .stream_batch = 2,
        .max_body = 4u << 20,
        .prefix_cache = true,
    };
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i], *v = NULL;
        long long n;
        if (!strcmp(arg, "-v") || !strcmp(arg, "--verbose")) {
            o.verbose = true;
            continue;
        }
        if (!strcmp(arg, "--no-prefix-cache")) {
            o.prefix_cache = false;
            continue;
        }
        if (arg[0] != '-' || !arg[1]) {
            if (o.model_path) return usage_error("serve: unexpected argument '%s'", arg);
            o.model_path = arg;
            continue;
        }
        if (!(v = option_value(argc, argv, &i)))
            return usage_error("serve: option '%s' needs a value", arg);
        if (!strcmp(arg, "--host")) {
            o.host = v;
        } else if (!strcmp(arg, "--port")) {
            if (!parse_long(v, 0, 65535, &n))
                return usage_error("serve: --port needs 0..65535, got '%s'", v);
            o.port = (int)n;
        } else if (!strcmp(arg, "--api-key")) {
            if (!*v) return usage_error("serve: --api-key needs a non-empty key%s", "");
            o.api_key = v;
        } else if (!strcmp(arg, "--parallel") || !strcmp(arg, "-np")) {
            if (!parse_long(v, 1, 1024, &n))
                return usage_error("serve: --parallel needs 1..1024, got '%s'", v);
            o.n_slots = (int32_t)n;
        } else if (!strcmp(arg, "--ctx") || !strcmp(arg, "-c")) {
            if (!parse_long(v, 2, 1 << 20, &n))
                return usage_error("serve: --ctx needs 2..1048576, got '%s'", v);
            o.n_ctx = (int32_t)n;
        } else if (!strcmp(arg, "--chat-template")) {
            o.chat_template_path = v;
        } else if (!strcmp(arg, "--max-body")) {
            if (!parse_long(v, 1024, 1LL << 30, &n))
                return usage_error("serve: --max-body needs 1024..1073741824 bytes, got '%s'", v);
            o.max_body = (size_t)n;
        } else if (!strcmp(arg, "--queue")) {
            if (!parse_long(v, 1, 65536, &n))
                return usage_error("serve: --queue needs 1..65536, got '%s'", v);
            o.queue_cap = (int32_t)n;
        } else if (!strcmp(arg, "--prefill-chunk")) {
            if (!parse_long(v, 1, 65536, &n))
                return usage_error("serve: --prefill-chunk needs 1..65536, got '%s'", v);
            o.prefill_chunk = (int32_t)n;
        } else if (!strcmp(arg, "--stream-batch")) {
            if (!parse_long(v, 1, SRV_STREAM_BATCH_MAX, &n))
                return usage_error("serve: --stream-batch needs 1..14, got '%s'", v);
            o.stream_batch = (int32_t)n;
        } else if (!strcmp(arg, "--engines")) {
            if (!parse_long(v, 0, SRV_MAX_ENGINES, &n))
                return usage_error("serve: --engines needs 0..16 (0: auto), got '%s'", v);
            o.n_engines = (int32_t)n;
        } else if (!strcmp(arg, "--threads") || !strcmp(arg, "-t")) {
            if (!parse_long(v, 0, 4096, &n))
                return usage_error("serve: --threads needs 0..4096 (0: auto), got '%s'", v);
            o.n_threads = (int32_t)n;
        } else if (!strcmp(arg, "--kv-type")) {
            if (!llmopt_kv_type_parse(v, &o.kv_type))
                return usage_error("serve: --kv-type needs f16, q8_0 or f32, got '%s'", v);
        } else if (!strcmp(arg, "--backend")) {
            o.backend = v;
        } else if (!strcmp(arg, "--programs")) {
            o.programs_dir = v;
        } else {
            return usage_error("serve: unknown option '%s'", arg);
        }
    }
    if (!o.model_path) return usage_error("serve: %s", "missing MODEL");
    struct llmopt_err err = {0};
    if (srv_run(&o, &err)) return fail(&err);
    return 0;
}
