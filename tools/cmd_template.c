/* llmopt template: render a conversation through a model's chat template and print
 * the prompt exactly as the model would see it (no trailing newline added). */
#include "cli.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TEMPLATE_MAX_FILE (64L << 20)

/* A template given as text, with bos/eos strings from MODEL's tokenizer (NULL model:
 * none), as transformers would render it for that tokenizer. */
enum llmopt_status cli_template_from_text(const char *model, const char *text, size_t len,
                                          struct llmopt_chat_template **out, struct llmopt_err *err) {
    if (!model) return llmopt_chat_template_from_text(text, len, NULL, NULL, out, err);
    struct llmopt_model *m = NULL;
    struct llmopt_load_opts lo = {.vocab_only = true};
    enum llmopt_status st = llmopt_model_load(model, &lo, &m, err);
    if (st) return st;
    char *tok[2] = {NULL, NULL};
    int32_t ids[2] = {llmopt_token_bos(m), llmopt_token_eos(m)};
    for (int i = 0; i < 2; i++) {
        size_t n = 0;
        const char *t = ids[i] >= 0 ? llmopt_token_text(m, ids[i], &n) : NULL;
        if (t && (tok[i] = malloc(n + 1))) {
            memcpy(tok[i], t, n);
            tok[i][n] = 0;
        }
    }
    st = llmopt_chat_template_from_text(text, len, tok[0], tok[1], out, err);
    free(tok[0]);
    free(tok[1]);
    llmopt_model_free(m);
    return st;
}

/* Errors of a template given with --chat-template FILE name the file instead of the
 * generic "chat template" (llmopt_chat_template_from_text's name for its text). */
void cli_name_template_error(struct llmopt_err *err, const char *path) {
    static const char generic[] = "chat template";
    if (!path || strncmp(err->msg, generic, sizeof generic - 1) != 0) return;
    char msg[sizeof err->msg];
    snprintf(msg, sizeof msg, "%s%s", path, err->msg + sizeof generic - 1);
    memcpy(err->msg, msg, sizeof msg);
}

/* Reads a whole file ("-" for stdin) into a NUL-terminated buffer. */
char *cli_read_file(const char *path, size_t *len, struct llmopt_err *err) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) {
        err->status = LLMOPT_ERR_IO;
        snprintf(err->msg, sizeof err->msg, "cannot open %s", path);
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 == cap) {
            char *p = cap < (size_t)TEMPLATE_MAX_FILE ? realloc(buf, cap * 2) : NULL;
            if (!p) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = p;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        if (got == 0) break;
        n += got;
    }
    if (f != stdin) fclose(f);
    if (!buf) {
        err->status = LLMOPT_ERR_LIMIT;
        snprintf(err->msg, sizeof err->msg, "%s: too large or out of memory", path);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

int cmd_template(int argc, char **argv) {
    const char *model = NULL, *messages_path = NULL, *tools_path = NULL, *template_path = NULL, *extra = NULL;
    bool gen = false;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i], *v = NULL;
        if (!strcmp(arg, "--add-generation-prompt")) { gen = true; continue; }
        if (arg[0] != '-' || !arg[1]) {
            if (model) return usage_error("template: unexpected argument '%s'", arg);
            model = arg;
            continue;
        }
        if (!(v = option_value(argc, argv, &i))) return usage_error("template: option '%s' needs a value", arg);
        if (!strcmp(arg, "--messages")) messages_path = v;
        else if (!strcmp(arg, "--tools")) tools_path = v;
        else if (!strcmp(arg, "--chat-template")) template_path = v;
        else if (!strcmp(arg, "--extra")) extra = v;
        else return usage_error("template: unknown option '%s'", arg);
    }
    if (!messages_path) return usage_error("template: %s", "--messages FILE.json is required");
    if (!model && !template_path) return usage_error("template: %s", "needs MODEL (or --chat-template FILE)");

    struct llmopt_err err = {0};
    struct llmopt_chat_template *tpl = NULL;
    char *tpl_text = NULL, *messages = NULL, *extra_text = NULL, *out = NULL;
    size_t len = 0, out_len = 0;
    int rc = 1;
    if (template_path && !(tpl_text = cli_read_file(template_path, &len, &err))) goto done;
    if (!tpl_text) {
        if (llmopt_chat_template_load(model, &tpl, &err)) goto done;
    } else if (cli_template_from_text(model, tpl_text, len, &tpl, &err)) {
        goto done;
    }
    size_t mlen;
    if (!(messages = cli_read_file(messages_path, &mlen, &err))) goto done;
    /* --messages: an array of messages, or a conversation object {"messages", "tools",
       "extra"} (the form of tests/golden/templates/conversations/). The extra context
       passed to the template: the object's "extra", then --extra (a JSON object, inline
       or @FILE), then "tools" from --tools or the object. */
    json_error_t jerr;
    json_t *conv = json_loadb(messages, mlen, 0, &jerr), *ctx = json_object();
    if (!conv || !ctx) {
        err.status = LLMOPT_ERR_INVALID_ARG;
        snprintf(err.msg, sizeof err.msg, "%s: invalid JSON (line %d: %s)", messages_path, jerr.line, jerr.text);
        json_decref(conv);
        json_decref(ctx);
        goto done;
    }
    json_t *msgs = conv;
    if (json_is_object(conv)) {
        msgs = json_object_get(conv, "messages");
        if (json_is_object(json_object_get(conv, "extra"))) json_object_update(ctx, json_object_get(conv, "extra"));
        if (json_object_get(conv, "tools")) json_object_set(ctx, "tools", json_object_get(conv, "tools"));
    }
    if (extra) {
        json_t *x = extra[0] == '@' ? json_load_file(extra + 1, 0, &jerr) : json_loads(extra, 0, &jerr);
        if (!json_is_object(x)) {
            err.status = LLMOPT_ERR_INVALID_ARG;
            snprintf(err.msg, sizeof err.msg, "--extra: expected a JSON object (%s)", x ? "not an object" : jerr.text);
            json_decref(x);
            json_decref(conv);
            json_decref(ctx);
            goto done;
        }
        json_object_update(ctx, x);
        json_decref(x);
    }
    if (tools_path) {
        json_t *t = json_load_file(tools_path, 0, &jerr);
        if (!t) {
            err.status = LLMOPT_ERR_INVALID_ARG;
            snprintf(err.msg, sizeof err.msg, "%s: invalid JSON (line %d: %s)", tools_path, jerr.line, jerr.text);
            json_decref(conv);
            json_decref(ctx);
            goto done;
        }
        json_object_set_new(ctx, "tools", t);
    }
    free(messages);
    messages = msgs ? json_dumps(msgs, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    extra_text = json_dumps(ctx, JSON_COMPACT);
    json_decref(conv);
    json_decref(ctx);
    if (!messages) {
        err.status = LLMOPT_ERR_INVALID_ARG;
        snprintf(err.msg, sizeof err.msg, "%s: no \"messages\"", messages_path);
        goto done;
    }
    mlen = strlen(messages);
    if (llmopt_chat_template_render(tpl, messages, mlen, gen, extra_text, &out, &out_len, &err)) goto done;
    fwrite(out, 1, out_len, stdout);
    fflush(stdout);
    rc = 0;
done:
    if (rc) {
        cli_name_template_error(&err, template_path);
        fail(&err);
    }
    free(out);
    free(extra_text);
    free(messages);
    free(tpl_text);
    llmopt_chat_template_free(tpl);
    return rc;
}
