/* Vocabulary from a Hugging Face tokenizer directory.
 *
 *   tokenizer.json         model (BPE: vocab, merges, ignore_merges, unk_token),
 *                          added_tokens, normalizer, pre_tokenizer, post_processor
 *   vocab.json, merges.txt the same model in the older two-file form; the
 *                          pre-tokenizer then comes from tokenizer_config.json's
 *                          tokenizer_class (the class fixes its split regex)
 *   tokenizer.model        SentencePiece (spm_model.c), when there is no byte-level
 *                          tokenizer.json
 *   tokenizer_config.json  added_tokens_decoder, bos/eos/unk/pad_token,
 *                          add_bos_token, add_eos_token, tokenizer_class
 *   generation_config.json eos_token_id (one id or a list): end of generation
 *
 * Added tokens become control tokens when "special" is true, user-defined ones
 * otherwise (as llama.cpp's converter types them); their piece is their content as
 * written. Every file is read whole under TOK_MAX_FILE bytes. */
#include "tokenizer/tok_internal.h"

#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* What the files of a directory hold, parsed. Any member may be NULL. */
struct hf_src {
    json_t *tokenizer; /* tokenizer.json */
    json_t *config;    /* tokenizer_config.json */
    json_t *gen;       /* generation_config.json */
    json_t *vocab;     /* vocab.json */
    char *merges_txt;  /* merges.txt, NUL-terminated */
    size_t merges_len;
    char *model; /* tokenizer.model */
    size_t model_len;
};

static void hf_src_free(struct hf_src *s) {
    json_decref(s->tokenizer);
    json_decref(s->config);
    json_decref(s->gen);
    json_decref(s->vocab);
    free(s->merges_txt);
    free(s->model);
}

static enum llmopt_status parse_json(const char *data, size_t size, const char *name, json_t **out,
                                     struct llmopt_err *err) {
    json_error_t jerr;
    *out = json_loadb(data, size, 0, &jerr);
    if (!*out)
        return err_set(err, LLMOPT_ERR_FORMAT, "tokenizer: %s: line %d column %d: %s", name,
                       jerr.line, jerr.column, jerr.text);
    if (!json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return err_set(err, LLMOPT_ERR_FORMAT, "tokenizer: %s: expected a JSON object", name);
    }
    return LLMOPT_OK;
}

static enum llmopt_status load_json(const char *dir, const char *name, json_t **out,
                                    struct llmopt_err *err) {
    char path[PATH_MAX];
    *out = NULL;
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path)
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "tokenizer: path too long: %s/%s", dir, name);
    char *data;
    size_t size;
    enum llmopt_status st = tok_read_file(path, true, &data, &size, err);
    if (st || !data) return st;
    st = parse_json(data, size, path, out, err);
    free(data);
    return st;
}

/* ---- pieces -------------------------------------------------------------------- */

/* The piece table being assembled: by id, with types. */
struct piece_table {
    struct tok_str *pieces; /* (cap) */
    uint8_t *types;         /* (cap) */
    int32_t n, cap;
};

static enum llmopt_status table_put(struct piece_table *t, int64_t id, const char *s, size_t len,
                                    uint8_t type, bool added, const char *what,
                                    struct llmopt_err *err) {
    if (id < 0 || id >= TOK_MAX_TOKENS)
        return err_set(err, id < 0 ? LLMOPT_ERR_FORMAT : LLMOPT_ERR_LIMIT,
                       "tokenizer: %s: token \"%.*s\": expected an id in [0, %d), found %lld", what,
                       len > 48 ? 48 : (int)len, s, TOK_MAX_TOKENS, (long long)id);
    if (len > TOK_MAX_PIECE)
        return err_set(err, LLMOPT_ERR_LIMIT,
                       "tokenizer: %s: token %lld: %zu bytes exceed the "
                       "cap of %d",
                       what, (long long)id, len, TOK_MAX_PIECE);
    if (id >= t->cap) {
        int64_t cap = t->cap ? t->cap : 1024;
        while (cap <= id) cap *= 2;
        if (cap > TOK_MAX_TOKENS) cap = TOK_MAX_TOKENS;
        struct tok_str *p = realloc(t->pieces, sizeof *p * (size_t)cap);
        if (p) t->pieces = p;
        uint8_t *ty = p ? realloc(t->types, (size_t)cap) : NULL;
        if (!p || !ty)
            return err_set(err, LLMOPT_ERR_NOMEM, "tokenizer: %lld tokens", (long long)cap);
        t->types = ty;
        for (int64_t i = t->cap; i < cap; i++) {
            t->pieces[i] = (struct tok_str){NULL, 0};
            t->types[i] = TOK_TYPE_UNDEFINED; /* a hole in the ids */
        }
        t->cap = (int32_t)cap;
    }
    if (!added && t->types[id] != TOK_TYPE_UNDEFINED)
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "tokenizer: %s: id %lld is given to two tokens (\"%.*s\" and \"%.*s\")",
                       what, (long long)id, t->pieces[id].len > 48 ? 48 : (int)t->pieces[id].len,
                       t->pieces[id].ptr, len > 48 ? 48 : (int)len, s);
    t->pieces[id] = (struct tok_str){s, (uint32_t)len};
    t->types[id] = type;
    if (id >= t->n) t->n = (int32_t)id + 1;
    return LLMOPT_OK;
}

static enum llmopt_status read_vocab_object(struct piece_table *t, json_t *vocab, const char *what,
                                            struct llmopt_err *err) {
    if (!json_is_object(vocab))
        return err_set(err, LLMOPT_ERR_FORMAT, "tokenizer: %s: expected an object piece -> id",
                       what);
    const char *key;
    json_t *val;
    void *iter = json_object_iter(vocab);
    for (; iter; iter = json_object_iter_next(vocab, iter)) {
        key = json_object_iter_key(iter);
        val = json_object_iter_value(iter);
        size_t klen = json_object_iter_key_len(iter); /* keys may hold NUL */
        if (!json_is_integer(val))
            return err_set(err, LLMOPT_ERR_FORMAT,
                           "tokenizer: %s: token \"%.*s\": expected an integer id", what,
                           klen > 48 ? 48 : (int)klen, key);
        enum llmopt_status st =
            table_put(t, json_integer_value(val), key, klen, TOK_TYPE_NORMAL, false, what, err);
        if (st) return st;
    }
    return LLMOPT_OK;
}

/* One added token: {"id", "content", "special"} (tokenizer.json's added_tokens) or
 * {"content", "special"} under its id (tokenizer_config.json's added_tokens_decoder). */
static enum llmopt_status read_added(struct piece_table *t, int64_t id, json_t *tok,
                                     const char *what, struct llmopt_err *err) {
    json_t *content = json_object_get(tok, "content");
    if (!json_is_string(content))
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "tokenizer: %s: added token %lld: expected a string \"content\"", what,
                       (long long)id);
    json_t *special = json_object_get(tok, "special");
    uint8_t type = json_is_true(special) ? TOK_TYPE_CONTROL : TOK_TYPE_USER_DEFINED;
    return table_put(t, id, json_string_value(content), json_string_length(content), type, true,
                     what, err);
}

static enum llmopt_status read_added_list(struct piece_table *t, json_t *list, const char *what,
                                          struct llmopt_err *err) {
    if (!list || json_is_null(list)) return LLMOPT_OK;
    if (!json_is_array(list))
        return err_set(err, LLMOPT_ERR_FORMAT, "tokenizer: %s: expected an array", what);
    size_t i;
    json_t *tok;
    json_array_foreach(list, i, tok) {
        json_t *id = json_object_get(tok, "id");
        if (!json_is_integer(id))
            return err_set(err, LLMOPT_ERR_FORMAT, "tokenizer: %s[%zu]: expected an integer \"id\"",
                           what, i);
        enum llmopt_status st = read_added(t, json_integer_value(id), tok, what, err);
        if (st) return st;
    }
    return LLMOPT_OK;
}

static enum llmopt_status read_added_decoder(struct piece_table *t, json_t *obj, const char *what,
                                             struct llmopt_err *err) {
    if (!obj || json_is_null(obj)) return LLMOPT_OK;
    if (!json_is_object(obj))
        return err_set(err, LLMOPT_ERR_FORMAT, "tokenizer: %s: expected an object id -> token",
                       what);
    const char *key;
    json_t *tok;
    json_object_foreach(obj, key, tok) {
        char *end;
        long long id = strtoll(key, &end, 10);
        if (end == key || *end || !json_is_object(tok))
            return err_set(
                err, LLMOPT_ERR_FORMAT,
                "tokenizer: %s: expected \"ID\": {\"content\": ...}, found key \"%.32s\"", what,
                key);
        enum llmopt_status st = read_added(t, id, tok, what, err);
        if (st) return st;
    }
    return LLMOPT_OK;
}

/* ---- merges ---------------------------------------------------------------------- */

struct merge_list {
    struct tok_str *lefts, *rights; /* (n) */
    int32_t n;
};

static void merge_list_free(struct merge_list *m) {
    free(m->lefts);
    free(m->rights);
}

static enum llmopt_status merge_list_alloc(struct merge_list *m, size_t n, const char *what,
                                           struct llmopt_err *err) {
    if (n > TOK_MAX_MERGES)
        return err_set(err, LLMOPT_ERR_LIMIT, "tokenizer: %s: %zu merges exceed the cap of %d",
                       what, n, TOK_MAX_MERGES);
    m->lefts = malloc(sizeof *m->lefts * (n ? n : 1));
    m->rights = malloc(sizeof *m->rights * (n ? n : 1));
    if (!m->lefts || !m->rights) return err_set(err, LLMOPT_ERR_NOMEM, "tokenizer: %s", what);
    return LLMOPT_OK;
}

static enum llmopt_status merge_line(struct merge_list *m, const char *s, size_t n,
                                     const char *what, size_t index, struct llmopt_err *err) {
    if (!tok_split_merge(s, n, &m->lefts[m->n], &m->rights[m->n]))
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "tokenizer: %s: merge %zu: expected \"LEFT RIGHT\" (two pieces and a "
                       "space), found \"%.*s\"",
                       what, index, n > 48 ? 48 : (int)n, s);
    m->n++;
    return LLMOPT_OK;
}

/* tokenizer.json model.merges: ["a b", ...] or [["a", "b"], ...]. */
static enum llmopt_status merges_from_json(struct merge_list *m, json_t *arr,
                                           struct llmopt_err *err) {
    const char *what = "tokenizer.json model.merges";
    if (!json_is_array(arr))
        return err_set(err, LLMOPT_ERR_FORMAT, "tokenizer: %s: expected an array", what);
    enum llmopt_status st = merge_list_alloc(m, json_array_size(arr), what, err);
    if (st) return st;
    size_t i;
    json_t *e;
    json_array_foreach(arr, i, e) {
        if (json_is_string(e)) {
            if ((st = merge_line(m, json_string_value(e), json_string_length(e), what, i, err)))
                return st;
        } else if (json_is_array(e) && json_array_size(e) == 2 &&
                   json_is_string(json_array_get(e, 0)) && json_is_string(json_array_get(e, 1))) {
            json_t *a = json_array_get(e, 0), *b = json_array_get(e, 1);
            if (json_string_length(a) > TOK_MAX_PIECE || json_string_length(b) > TOK_MAX_PIECE)
                return err_set(err, LLMOPT_ERR_LIMIT,
                               "tokenizer: %s: merge %zu: piece over "
                               "%d bytes",
                               what, i, TOK_MAX_PIECE);
            m->lefts[m->n] =
                (struct tok_str){json_string_value(a), (uint32_t)json_string_length(a)};
            m->rights[m->n] =
                (struct tok_str){json_string_value(b), (uint32_t)json_string_length(b)};
            m->n++;
        } else {
            return err_set(err, LLMOPT_ERR_FORMAT,
                           "tokenizer: %s: merge %zu: expected \"a b\" or [\"a\", \"b\"]", what, i);
        }
    }
    return LLMOPT_OK;
}

/* merges.txt: an optional "#version" line, then one "a b" per line. */
static enum llmopt_status merges_from_text(struct merge_list *m, const char *text, size_t len,
                                           struct llmopt_err *err) {
    const char *what = "merges.txt";
    size_t lines = 1;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    enum llmopt_status st = merge_list_alloc(m, lines, what, err);
    if (st) return st;
    size_t index = 0;
    for (size_t pos = 0; pos < len;) {
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - text) : len, n = end - pos;
        if (n && text[pos + n - 1] == '\r') n--;
        bool header = index == 0 && n >= 8 && memcmp(text + pos, "#version", 8) == 0;
        if (n && !header && (st = merge_line(m, text + pos, n, what, index, err))) return st;
        index++;
        pos = end + 1;
    }
    return LLMOPT_OK;
}

/* ---- pre-tokenizer and normalizer of tokenizer.json ------------------------------------- */

struct pre_spec {
    const char *patterns[TOK_MAX_PRETOK];
    size_t lens[TOK_MAX_PRETOK];
    bool literal[TOK_MAX_PRETOK];
    int n;
    bool byte_level, prefix_space;
};

static enum llmopt_status pre_push(struct pre_spec *p, const char *pat, size_t len, bool literal,
                                   struct llmopt_err *err) {
    if (p->n >= TOK_MAX_PRETOK)
        return err_set(err, LLMOPT_ERR_LIMIT,
                       "tokenizer: tokenizer.json pre_tokenizer: more than %d splits",
                       TOK_MAX_PRETOK);
    p->patterns[p->n] = pat;
    p->lens[p->n] = len;
    p->literal[p->n] = literal;
    p->n++;
    return LLMOPT_OK;
}

static bool get_bool(json_t *obj, const char *key, bool def) {
    json_t *b = json_object_get(obj, key);
    return json_is_boolean(b) ? json_is_true(b) : def;
}

static enum llmopt_status read_pre(struct pre_spec *p, json_t *node, int depth,
                                   struct llmopt_err *err) {
    if (!node || json_is_null(node)) return LLMOPT_OK;
    const char *type = json_string_value(json_object_get(node, "type"));
    if (!type || depth > 8)
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "tokenizer: tokenizer.json pre_tokenizer: expected an object with a "
                       "\"type\"%s",
                       depth > 8 ? " (nested too deep)" : "");
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(node, "pretokenizers");
        if (!json_is_array(list))
            return err_set(err, LLMOPT_ERR_FORMAT,
                           "tokenizer: tokenizer.json pre_tokenizer "
                           "Sequence: expected an array \"pretokenizers\"");
        size_t i;
        json_t *e;
        json_array_foreach(list, i, e) {
            enum llmopt_status st = read_pre(p, e, depth + 1, err);
            if (st) return st;
        }
        return LLMOPT_OK;
    }
    if (!strcmp(type, "ByteLevel")) {
        p->byte_level = true;
        /* add_prefix_space works on each fragment, before any split */
        if (get_bool(node, "add_prefix_space", true)) {
            if (p->n > 0)
                return err_set(err, LLMOPT_ERR_UNSUPPORTED,
                               "tokenizer: tokenizer.json pre_tokenizer: ByteLevel with "
                               "add_prefix_space after a Split is not supported");
            p->prefix_space = true;
        }
        if (get_bool(node, "use_regex", true))
            return pre_push(p, tok_gpt2_pattern, strlen(tok_gpt2_pattern), false, err);
        return LLMOPT_OK;
    }
    if (!strcmp(type, "Split")) {
        json_t *pattern = json_object_get(node, "pattern");
        json_t *re = json_object_get(pattern, "Regex"), *lit = json_object_get(pattern, "String");
        const char *behavior = json_string_value(json_object_get(node, "behavior"));
        if (!json_is_string(re) && !json_is_string(lit))
            return err_set(err, LLMOPT_ERR_FORMAT,
                           "tokenizer: tokenizer.json pre_tokenizer "
                           "Split: expected pattern {\"Regex\": ...} or {\"String\": ...}");
        if (!behavior || strcmp(behavior, "Isolated") != 0 || get_bool(node, "invert", false))
            return err_set(err, LLMOPT_ERR_UNSUPPORTED,
                           "tokenizer: tokenizer.json pre_tokenizer Split: behavior \"%.32s\"%s "
                           "is not supported (expected \"Isolated\")",
                           behavior ? behavior : "?",
                           get_bool(node, "invert", false) ? " with invert" : "");
        json_t *s = json_is_string(re) ? re : lit;
        return pre_push(p, json_string_value(s), json_string_length(s), s == lit, err);
    }
    if (!strcmp(type, "Digits")) {
        const char *pat = get_bool(node, "individual_digits", false) ? "\\p{N}" : "\\p{N}+";
        return pre_push(p, pat, strlen(pat), false, err);
    }
    return err_set(err, LLMOPT_ERR_UNSUPPORTED,
                   "tokenizer: tokenizer.json pre_tokenizer type \"%.48s\" is not supported "
                   "(expected ByteLevel, Split, Digits or Sequence)",
                   type);
}

static enum llmopt_status read_normalizer(struct tok_vocab *v, json_t *node, int depth,
                                          struct llmopt_err *err) {
    if (!node || json_is_null(node)) return LLMOPT_OK;
    const char *type = json_string_value(json_object_get(node, "type"));
    if (type && !strcmp(type, "NFC")) {
        v->nfc = true;
        return LLMOPT_OK;
    }
    if (type && !strcmp(type, "Sequence") && depth < 8) {
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(node, "normalizers"), i, e) {
            enum llmopt_status st = read_normalizer(v, e, depth + 1, err);
            if (st) return st;
        }
        return LLMOPT_OK;
    }
    return err_set(err, LLMOPT_ERR_UNSUPPORTED,
                   "tokenizer: tokenizer.json normalizer \"%.48s\" is not supported "
                   "(expected none or NFC)",
                   type ? type : "?");
}

/* ---- assembling ------------------------------------------------------------------ */

/* A special-token name of tokenizer_config.json: "text" or {"content": "text"}. */
static const char *token_name(json_t *config, const char *key, size_t *len) {
    json_t *t = json_object_get(config, key);
    if (json_is_object(t)) t = json_object_get(t, "content");
    if (!json_is_string(t)) return NULL;
    *len = json_string_length(t);
    return json_string_value(t);
}

static int32_t find_named(const struct tok_vocab *v, json_t *config, const char *key) {
    size_t len;
    const char *s = token_name(config, key, &len);
    return s ? tok_find(v, s, len) : -1;
}

/* TemplateProcessing's "single": a leading SpecialToken is the BOS it adds. */
static void read_post_processor(struct tok_vocab *v, json_t *post, bool *add_bos) {
    const char *type = json_string_value(json_object_get(post, "type"));
    if (!type) return;
    if (!strcmp(type, "Sequence")) {
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(post, "processors"), i, e)
            read_post_processor(v, e, add_bos);
        return;
    }
    if (strcmp(type, "TemplateProcessing") != 0) return;
    json_t *single = json_object_get(post, "single");
    json_t *first = json_object_get(json_array_get(single, 0), "SpecialToken");
    json_t *id = json_object_get(first, "id");
    if (!json_is_string(id)) return;
    int32_t bos = tok_find(v, json_string_value(id), json_string_length(id));
    if (bos >= 0) {
        v->bos = bos;
        *add_bos = true;
    }
}

static enum llmopt_status build_bpe(struct tok_vocab *v, struct hf_src *s, struct llmopt_err *err) {
    struct piece_table t = {0};
    struct merge_list m = {0};
    struct pre_spec pre = {0};
    enum llmopt_status st;
    json_t *model = s->tokenizer ? json_object_get(s->tokenizer, "model") : NULL;
    const char *what = s->tokenizer ? "tokenizer.json model.vocab" : "vocab.json";
    v->kind = TOK_KIND_BPE;

    if (s->tokenizer) {
        const char *type = json_string_value(json_object_get(model, "type"));
        if (!json_is_object(model))
            return err_set(err, LLMOPT_ERR_FORMAT,
                           "tokenizer: tokenizer.json: expected an "
                           "object \"model\"");
        if (type && strcmp(type, "BPE") != 0)
            return err_set(err, LLMOPT_ERR_UNSUPPORTED,
                           "tokenizer: tokenizer.json model type \"%.48s\" is not supported "
                           "(expected BPE)",
                           type);
        const char *affix[] = {"continuing_subword_prefix", "end_of_word_suffix"};
        for (int i = 0; i < 2; i++) {
            const char *a = json_string_value(json_object_get(model, affix[i]));
            if (a && *a)
                return err_set(err, LLMOPT_ERR_UNSUPPORTED,
                               "tokenizer: tokenizer.json model.%s \"%.32s\" is not supported",
                               affix[i], a);
        }
        if ((st = read_vocab_object(&t, json_object_get(model, "vocab"), what, err)) ||
            (st = read_added_list(&t, json_object_get(s->tokenizer, "added_tokens"),
                                  "tokenizer.json added_tokens", err)))
            goto out;
    } else {
        if ((st = read_vocab_object(&t, s->vocab, what, err))) goto out;
    }
    if (s->config &&
        (st = read_added_decoder(&t, json_object_get(s->config, "added_tokens_decoder"),
                                 "tokenizer_config.json added_tokens_decoder", err)))
        goto out;
    if ((st = tok_vocab_set_pieces(v, t.n, t.pieces, what, err))) goto out;
    memcpy(v->types, t.types, (size_t)t.n);

    if (s->tokenizer) {
        if ((st = merges_from_json(&m, json_object_get(model, "merges"), err))) goto out;
        v->ignore_merges = get_bool(model, "ignore_merges", false);
        if ((st = read_normalizer(v, json_object_get(s->tokenizer, "normalizer"), 0, err)) ||
            (st = read_pre(&pre, json_object_get(s->tokenizer, "pre_tokenizer"), 0, err)))
            goto out;
        if (!pre.byte_level) {
            st = err_set(err, LLMOPT_ERR_UNSUPPORTED,
                         "tokenizer: tokenizer.json: a BPE model without a ByteLevel "
                         "pre-tokenizer (SentencePiece-style) is not supported; use the "
                         "directory's tokenizer.model");
            goto out;
        }
        v->bpe_prefix_space = pre.prefix_space;
        if ((st = tok_pretok_compile(pre.patterns, pre.lens, pre.literal, pre.n,
                                     "tokenizer.json pre_tokenizer", &v->pretok, err)))
            goto out;
        snprintf(v->pre_name, sizeof v->pre_name, "tokenizer.json");
    } else {
        if ((st = merges_from_text(&m, s->merges_txt, s->merges_len, err))) goto out;
        const char *cls = json_string_value(json_object_get(s->config, "tokenizer_class"));
        if (!cls) {
            st = err_set(err, LLMOPT_ERR_UNSUPPORTED,
                         "tokenizer: vocab.json + merges.txt: expected tokenizer_config.json "
                         "with a tokenizer_class to choose the pre-tokenizer, found none");
            goto out;
        }
        bool add_bos_default; /* the class's default is overridden by add_bos_token below */
        if ((st =
                 tok_pretok_by_name(cls, strlen(cls), "tokenizer_config.json tokenizer_class",
                                    &v->pretok, &v->ignore_merges, &add_bos_default, &v->nfc, err)))
            goto out;
        snprintf(v->pre_name, sizeof v->pre_name, "%.60s", cls);
    }
    if ((st = tok_vocab_set_merges(v, m.n, m.lefts, m.rights,
                                   s->tokenizer ? "tokenizer.json model.merges" : "merges.txt",
                                   err)))
        goto out;

    json_t *unk = json_object_get(model, "unk_token");
    if (json_is_string(unk)) v->unk = tok_find(v, json_string_value(unk), json_string_length(unk));
    v->add_bos = false;
    if (s->tokenizer)
        read_post_processor(v, json_object_get(s->tokenizer, "post_processor"), &v->add_bos);
out:
    merge_list_free(&m);
    free(t.pieces);
    free(t.types);
    return st;
}

/* The end-of-generation ids of generation_config.json's eos_token_id. */
static void read_generation_config(struct tok_vocab *v, json_t *gen) {
    json_t *e = json_object_get(gen, "eos_token_id");
    if (json_is_integer(e)) {
        json_int_t id = json_integer_value(e);
        if (id >= 0 && id < v->n_tokens) tok_vocab_add_eog(v, (int32_t)id);
        return;
    }
    size_t i;
    json_t *x;
    json_array_foreach(e, i, x) {
        json_int_t id = json_integer_value(x);
        if (json_is_integer(x) && id >= 0 && id < v->n_tokens) tok_vocab_add_eog(v, (int32_t)id);
    }
}

static enum llmopt_status build(struct tok_vocab **out, struct hf_src *s, struct llmopt_err *err) {
    struct tok_vocab *v = NULL;
    enum llmopt_status st;
    if (!s->tokenizer && s->model) {
        if ((st = tok_vocab_from_spm_model((const uint8_t *)s->model, s->model_len, &v, err))) {
            err_prefix(err, "tokenizer.model");
            return st;
        }
    } else {
        if (!s->tokenizer && (!s->vocab || !s->merges_txt))
            return err_set(err, LLMOPT_ERR_FORMAT,
                           "tokenizer: expected tokenizer.json, tokenizer.model or vocab.json + "
                           "merges.txt, found none");
        v = tok_vocab_new();
        if (!v) return err_set(err, LLMOPT_ERR_NOMEM, "tokenizer: vocab");
        if ((st = build_bpe(v, s, err))) goto fail;
    }
    if ((st = tok_vocab_finish_map(v, err))) goto fail;
    if (s->config) {
        int32_t id;
        if ((id = find_named(v, s->config, "bos_token")) >= 0) v->bos = id;
        if ((id = find_named(v, s->config, "eos_token")) >= 0) v->eos = id;
        if ((id = find_named(v, s->config, "unk_token")) >= 0) v->unk = id;
        if ((id = find_named(v, s->config, "pad_token")) >= 0) v->pad = id;
        v->add_bos = get_bool(s->config, "add_bos_token", v->add_bos);
        v->add_eos = get_bool(s->config, "add_eos_token", v->add_eos);
    }
    if (s->gen) read_generation_config(v, s->gen);
    if ((st = tok_vocab_finish(v, err))) goto fail;
    *out = v;
    return LLMOPT_OK;
fail:
    tok_vocab_free(v);
    return st;
}

/* A tokenizer.json holds a byte-level BPE model (not a SentencePiece-style one, for
 * which tokenizer.model is read instead): a ByteLevel pre-tokenizer somewhere. */
static bool is_byte_level(json_t *pre, int depth) {
    const char *type = json_string_value(json_object_get(pre, "type"));
    if (!type || depth > 8) return false;
    if (!strcmp(type, "ByteLevel")) return true;
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(pre, "pretokenizers"), i,
                       e) if (is_byte_level(e, depth + 1)) return true;
    return false;
}

enum llmopt_status tok_vocab_from_dir(const char *dir, struct tok_vocab **out,
                                      struct llmopt_err *err) {
    if (!dir || !out) return err_set(err, LLMOPT_ERR_INVALID_ARG, "tokenizer: NULL argument");
    struct hf_src s = {0};
    enum llmopt_status st;
    char path[PATH_MAX];
    if ((st = load_json(dir, "tokenizer.json", &s.tokenizer, err)) ||
        (st = load_json(dir, "tokenizer_config.json", &s.config, err)) ||
        (st = load_json(dir, "generation_config.json", &s.gen, err)))
        goto out;
    if (!s.tokenizer || !is_byte_level(json_object_get(s.tokenizer, "pre_tokenizer"), 0)) {
        snprintf(path, sizeof path, "%s/tokenizer.model", dir);
        if ((st = tok_read_file(path, true, &s.model, &s.model_len, err))) goto out;
        if (s.model) {
            json_decref(s.tokenizer);
            s.tokenizer = NULL;
        }
    }
    if (!s.tokenizer && !s.model) {
        if ((st = load_json(dir, "vocab.json", &s.vocab, err))) goto out;
        snprintf(path, sizeof path, "%s/merges.txt", dir);
        if ((st = tok_read_file(path, true, &s.merges_txt, &s.merges_len, err))) goto out;
    }
    st = build(out, &s, err);
    if (st) err_prefix(err, "%s", dir);
out:
    hf_src_free(&s);
    return st;
}

int tok_fuzz_hf_json(const uint8_t *data, size_t size) {
    struct hf_src s = {0};
    struct llmopt_err err;
    if (parse_json((const char *)data, size, "fuzz", &s.tokenizer, &err)) return 0;
    struct tok_vocab *v = NULL;
    if (build(&v, &s, &err) == LLMOPT_OK) {
        static const char text[] = "Hello wörld <|im_start|> 日本 😀\n  1234";
        tok_fuzz_round_trip(v, text, sizeof text - 1);
        tok_vocab_free(v);
    }
    hf_src_free(&s);
    return 0;
}
