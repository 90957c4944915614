/* The public chat-template API (include/llmopt.h): find a model's template and its
 * bos/eos strings, and render conversations with the variables transformers'
 * apply_chat_template gives a template:
 *
 *   messages, tools (None unless given), documents (None), add_generation_prompt,
 *   bos_token / eos_token (when the tokenizer has them), and every member of
 *   extra_json (e.g. enable_thinking, date_string, or tools).
 *
 * Where the template comes from:
 *   - a GGUF: `tokenizer.chat_template` (plus `tokenizer.chat_template.tool_use`, used
 *     when tools are given, as transformers does with named templates); bos/eos are
 *     `tokenizer.ggml.tokens[tokenizer.ggml.{bos,eos}_token_id]`;
 *   - a directory (or a tokenizer_config.json path): chat_template.jinja when present
 *     (newer transformers saves it there), else tokenizer_config.json's
 *     `chat_template` (a string, or a list of {name, template}: "default", and
 *     "tool_use" when tools are given); bos/eos from its `bos_token` / `eos_token`
 *     (a string or {"content": ...}). */
#include "format/gguf.h"
#include "template/tpl_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CHAT_MAX_CONFIG (64u << 20) /* bytes of tokenizer_config.json / a template file */

struct llmopt_chat_template {
    struct tpl_template *tpl;      /* the default template */
    struct tpl_template *tool_use; /* NULL unless the model names one */
    char *bos, *eos;               /* NULL when the tokenizer has none */
};

void llmopt_chat_template_free(struct llmopt_chat_template *t) {
    if (!t) return;
    tpl_free(t->tpl);
    tpl_free(t->tool_use);
    free(t->bos);
    free(t->eos);
    free(t);
}

static char *dup_n(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

/* Reads a whole file (capped); *out is NUL-terminated. */
static enum llmopt_status read_file(const char *path, char **out, size_t *len, struct llmopt_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return err_set(err, LLMOPT_ERR_IO, "cannot open %s", path);
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            if (cap >= CHAT_MAX_CONFIG) {
                free(buf);
                fclose(f);
                return err_set(err, LLMOPT_ERR_LIMIT, "%s is larger than %u bytes", path, CHAT_MAX_CONFIG);
            }
            char *p = realloc(buf, cap * 2);
            if (!p) break;
            buf = p;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    bool bad = ferror(f);
    fclose(f);
    if (!buf) return err_set(err, LLMOPT_ERR_NOMEM, "out of memory reading %s", path);
    if (bad) {
        free(buf);
        return err_set(err, LLMOPT_ERR_IO, "error reading %s", path);
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return LLMOPT_OK;
}

static enum llmopt_status parse_template(const char *text, size_t len, const char *name,
                                         struct tpl_template **out, struct llmopt_err *err) {
    return tpl_parse(text, len, name, out, err);
}

/* ---- GGUF ---------------------------------------------------------------------------- */

static char *gguf_token_string(const struct gguf_file *f, const char *id_key) {
    uint64_t id;
    const struct gguf_kv *tokens = gguf_find_kv(f, "tokenizer.ggml.tokens");
    struct gguf_str s;
    if (!gguf_get_u64(f, id_key, &id) || !tokens || tokens->type != GGUF_TYPE_ARRAY ||
        !gguf_str_array_get(tokens, id, &s))
        return NULL;
    return dup_n(s.ptr, s.len);
}

static enum llmopt_status load_gguf(const char *path, struct llmopt_chat_template *t, struct llmopt_err *err) {
    struct gguf_file *f = NULL;
    enum llmopt_status st = gguf_open(path, &f, err);
    if (st) return st;
    t->bos = gguf_token_string(f, "tokenizer.ggml.bos_token_id");
    t->eos = gguf_token_string(f, "tokenizer.ggml.eos_token_id");
    {
        struct gguf_str s;
        char name[1200];
        if (!gguf_get_str(f, "tokenizer.chat_template", &s)) {
            gguf_close(f);
            return err_set(err, LLMOPT_ERR_FORMAT,
                           "%s has no tokenizer.chat_template (give a template with --chat-template FILE)", path);
        }
        snprintf(name, sizeof name, "%s (tokenizer.chat_template)", path);
        st = parse_template(s.ptr, s.len, name, &t->tpl, err);
        if (!st && gguf_get_str(f, "tokenizer.chat_template.tool_use", &s)) {
            snprintf(name, sizeof name, "%s (tokenizer.chat_template.tool_use)", path);
            st = parse_template(s.ptr, s.len, name, &t->tool_use, err);
        }
    }
    gguf_close(f);
    return st;
}

/* ---- Hugging Face directory -------------------------------------------------------------- */

/* bos_token / eos_token: a string or an AddedToken {"content": ...}. */
static char *config_token(const json_t *cfg, const char *key) {
    const json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? dup_n(json_string_value(v), json_string_length(v)) : NULL;
}

static enum llmopt_status load_dir(const char *path, bool is_config_file, struct llmopt_chat_template *t,
                                   struct llmopt_err *err) {
    char cfg_path[4096], jinja_path[4096], name[4200];
    if (is_config_file) {
        snprintf(cfg_path, sizeof cfg_path, "%s", path);
        const char *slash = strrchr(path, '/');
        int dir_len = slash ? (int)(slash - path) : 1;
        snprintf(jinja_path, sizeof jinja_path, "%.*s/chat_template.jinja", dir_len, slash ? path : ".");
    } else {
        snprintf(cfg_path, sizeof cfg_path, "%s/tokenizer_config.json", path);
        snprintf(jinja_path, sizeof jinja_path, "%s/chat_template.jinja", path);
    }
    char *text = NULL;
    size_t len = 0;
    enum llmopt_status st = read_file(cfg_path, &text, &len, err);
    if (st) {
        if (!is_config_file) err_prefix(err, "%s: no tokenizer_config.json", path);
        return st;
    }
    json_error_t jerr;
    json_t *cfg = json_loadb(text, len, 0, &jerr);
    free(text);
    if (!cfg || !json_is_object(cfg)) {
        json_decref(cfg);
        return err_set(err, LLMOPT_ERR_FORMAT, "%s: not a JSON object (line %d: %s)", cfg_path, jerr.line, jerr.text);
    }
    t->bos = config_token(cfg, "bos_token");
    t->eos = config_token(cfg, "eos_token");
    {
        struct stat sb;
        if (stat(jinja_path, &sb) == 0 && S_ISREG(sb.st_mode)) {
            if (!(st = read_file(jinja_path, &text, &len, err))) {
                st = parse_template(text, len, jinja_path, &t->tpl, err);
                free(text);
            }
        } else {
            const json_t *ct = json_object_get(cfg, "chat_template");
            if (json_is_string(ct)) {
                snprintf(name, sizeof name, "%s (chat_template)", cfg_path);
                st = parse_template(json_string_value(ct), json_string_length(ct), name, &t->tpl, err);
            } else if (json_is_array(ct)) {
                size_t i;
                const json_t *entry;
                json_array_foreach(ct, i, entry) {
                    const json_t *n = json_object_get(entry, "name"), *tx = json_object_get(entry, "template");
                    if (!json_is_string(n) || !json_is_string(tx)) continue;
                    struct tpl_template **slot = !strcmp(json_string_value(n), "default") ? &t->tpl
                                                 : !strcmp(json_string_value(n), "tool_use") ? &t->tool_use
                                                                                             : NULL;
                    if (!slot || *slot) continue;
                    snprintf(name, sizeof name, "%s (chat_template '%s')", cfg_path, json_string_value(n));
                    if ((st = parse_template(json_string_value(tx), json_string_length(tx), name, slot, err))) break;
                }
                if (!st && !t->tpl)
                    st = err_set(err, LLMOPT_ERR_FORMAT, "%s: chat_template has no entry named \"default\"", cfg_path);
            } else {
                st = err_set(err, LLMOPT_ERR_FORMAT,
                             "%s has no chat_template (and there is no chat_template.jinja); give a template "
                             "with --chat-template FILE",
                             cfg_path);
            }
        }
    }
    json_decref(cfg);
    return st;
}

static enum llmopt_status load_any(const char *path, struct llmopt_chat_template *t, struct llmopt_err *err) {
    struct stat sb;
    if (!path) return err_set(err, LLMOPT_ERR_INVALID_ARG, "chat template: no path given");
    if (stat(path, &sb) != 0) return err_set(err, LLMOPT_ERR_IO, "cannot open %s", path);
    if (S_ISDIR(sb.st_mode)) return load_dir(path, false, t, err);
    size_t n = strlen(path);
    if (n >= 5 && !strcmp(path + n - 5, ".json")) return load_dir(path, true, t, err);
    return load_gguf(path, t, err);
}

enum llmopt_status llmopt_chat_template_load(const char *path, struct llmopt_chat_template **out,
                                             struct llmopt_err *err) {
    *out = NULL;
    struct llmopt_chat_template *t = calloc(1, sizeof *t);
    if (!t) return err_set(err, LLMOPT_ERR_NOMEM, "out of memory");
    enum llmopt_status st = load_any(path, t, err);
    if (st) {
        llmopt_chat_template_free(t);
        return st;
    }
    *out = t;
    return LLMOPT_OK;
}

enum llmopt_status llmopt_chat_template_from_text(const char *text, size_t len, const char *bos_token,
                                                  const char *eos_token, struct llmopt_chat_template **out,
                                                  struct llmopt_err *err) {
    *out = NULL;
    if (!text) return err_set(err, LLMOPT_ERR_INVALID_ARG, "chat template: no text given");
    struct llmopt_chat_template *t = calloc(1, sizeof *t);
    if (!t) return err_set(err, LLMOPT_ERR_NOMEM, "out of memory");
    if ((bos_token && !(t->bos = dup_n(bos_token, strlen(bos_token)))) ||
        (eos_token && !(t->eos = dup_n(eos_token, strlen(eos_token))))) {
        llmopt_chat_template_free(t);
        return err_set(err, LLMOPT_ERR_NOMEM, "out of memory");
    }
    enum llmopt_status st = parse_template(text, len, "chat template", &t->tpl, err);
    if (st) {
        llmopt_chat_template_free(t);
        return st;
    }
    *out = t;
    return LLMOPT_OK;
}

enum llmopt_status llmopt_chat_template_render(const struct llmopt_chat_template *t,
                                               const char *messages_json, size_t len,
                                               bool add_generation_prompt, const char *extra_json,
                                               char **out, size_t *out_len, struct llmopt_err *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (!t || !messages_json) return err_set(err, LLMOPT_ERR_INVALID_ARG, "chat template render: no template or messages");
    json_error_t jerr;
    json_t *messages = json_loadb(messages_json, len, 0, &jerr);
    if (!messages || !json_is_array(messages)) {
        json_decref(messages);
        if (!messages) return err_set(err, LLMOPT_ERR_INVALID_ARG, "messages: invalid JSON (line %d, column %d: %s)",
                                      jerr.line, jerr.column, jerr.text);
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "messages: expected a JSON array of {\"role\", \"content\"} objects");
    }
    json_t *extra = NULL;
    if (extra_json && extra_json[0]) {
        extra = json_loads(extra_json, 0, &jerr);
        if (!extra || !json_is_object(extra)) {
            json_decref(messages);
            json_decref(extra);
            return err_set(err, LLMOPT_ERR_INVALID_ARG, "extra context: expected a JSON object%s%s",
                           extra ? "" : ": ", extra ? "" : jerr.text);
        }
    }
    json_t *ctx = json_object();
    enum llmopt_status st = LLMOPT_OK;
    if (!ctx || json_object_set_new(ctx, "messages", messages) || json_object_set_new(ctx, "tools", json_null()) ||
        json_object_set_new(ctx, "documents", json_null()) ||
        json_object_set_new(ctx, "add_generation_prompt", json_boolean(add_generation_prompt)) ||
        (t->bos && json_object_set_new(ctx, "bos_token", json_string(t->bos))) ||
        (t->eos && json_object_set_new(ctx, "eos_token", json_string(t->eos))) ||
        (extra && json_object_update(ctx, extra)))
        st = err_set(err, LLMOPT_ERR_NOMEM, "out of memory (or a bos/eos token that is not UTF-8)");
    const struct tpl_template *tpl = t->tpl;
    const json_t *tools = json_object_get(ctx, "tools");
    if (t->tool_use && tools && !json_is_null(tools)) tpl = t->tool_use;
    if (!st) st = tpl_render(tpl, ctx, NULL, out, out_len, err);
    json_decref(ctx);
    json_decref(extra);
    return st;
}

/* ---- fuzzing ------------------------------------------------------------------------------- */

int tpl_fuzz_one(const uint8_t *data, size_t size) {
    const uint8_t *nl = memchr(data, '\n', size);
    size_t ctx_len = nl ? (size_t)(nl - data) : 0;
    const char *src = (const char *)data + (nl ? ctx_len + 1 : 0);
    size_t src_len = size - (nl ? ctx_len + 1 : 0);
    json_t *ctx = ctx_len ? json_loadb((const char *)data, ctx_len, 0, NULL) : NULL;
    if (ctx && !json_is_object(ctx)) {
        json_decref(ctx);
        ctx = NULL;
    }
    if (!ctx) {
        ctx = json_pack("{s:[{s:s,s:s},{s:s,s:s}],s:b,s:s,s:[{s:s}]}", "messages", "role", "user", "content",
                        "Hi <b>", "role", "assistant", "content", "Hello", "add_generation_prompt", 1, "bos_token",
                        "<s>", "tools", "name", "get_weather");
    }
    struct tpl_template *t = NULL;
    struct llmopt_err err;
    if (tpl_parse(src, src_len, "fuzz", &t, &err) == LLMOPT_OK) {
        struct tpl_limits lim;
        tpl_limits_default(&lim);
        lim.max_output = 1u << 20;
        lim.max_memory = 64u << 20;
        lim.max_steps = 200000;
        lim.max_depth = 32;
        char *out = NULL;
        size_t n = 0;
        if (tpl_render(t, ctx, &lim, &out, &n, &err) == LLMOPT_OK && out && strlen(out) > n) abort();
        free(out);
        tpl_free(t);
    }
    json_decref(ctx);
    return 0;
}
