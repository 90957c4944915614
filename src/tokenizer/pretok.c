/* Pre-tokenizers: the regexes that split text into words before byte-level BPE,
 * run with PCRE2 (UTF + Unicode properties, JIT when available).
 *
 * A pre-tokenizer is a sequence of split regexes: the first splits the text, each
 * next one splits every piece of the one before, seeing only that piece (lookaheads
 * stop at its end). A piece is each match and each unmatched gap between matches
 * (Hugging Face's "Isolated" split). Invalid UTF-8 never matches
 * (PCRE2_MATCH_INVALID_UTF), so it ends up in gaps and is still encoded byte for
 * byte. The patterns are those of the models' own tokenizer.json files; the table
 * below maps GGUF tokenizer.ggml.pre names and tokenizer classes onto them. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/tok_internal.h"

#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

struct tok_pretok {
    int n;
    pcre2_code *re[TOK_MAX_PRETOK]; /* (n) */
};

/* GPT-2 (ByteLevel with use_regex): contractions, letters, digits, other, spaces. */
const char tok_gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
/* Llama 3: case-insensitive contractions, digits in runs of up to three. */
static const char llama3_pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* Qwen 2 / 3: as Llama 3 but every digit alone. */
static const char qwen2_pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* Digits(individual_digits) before GPT-2's regex (StarCoder and relatives). */
static const char digit_pattern[] = "\\p{N}";

struct pre_family {
    const char *const *names; /* NULL-terminated */
    const char *patterns[2];  /* applied in sequence; NULL-terminated if short */
    bool ignore_merges;       /* tokenizer.json model.ignore_merges */
    bool add_bos;             /* the post-processor prepends BOS */
    bool nfc;                 /* the tokenizer.json normalizer is NFC */
};

static const char *const gpt2_names[] = {
    "gpt2",         "gpt-2",         "default",           "phi-2",      "roberta-bpe", "olmo",
    "mpt",          "jina-es",       "jina-de",           "jina-v1-en", "jina-v2-es",  "jina-v2-de",
    "jina-v2-code", "GPT2Tokenizer", "GPT2TokenizerFast", NULL};
static const char *const llama3_names[] = {"llama3", "llama-v3",  "llama-bpe", "falcon3",
                                           "dbrx",   "smaug-bpe", NULL};
static const char *const qwen2_names[] = {"qwen2",          "deepseek-r1-qwen",   "stablelm2",
                                          "Qwen2Tokenizer", "Qwen2TokenizerFast", NULL};
static const char *const starcoder_names[] = {"starcoder", "refact",    "smollm",
                                              "command-r", "codeshell", NULL};

static const struct pre_family families[] = {
    {gpt2_names, {tok_gpt2_pattern, NULL}, false, false, false},
    {llama3_names, {llama3_pattern, NULL}, true, true, false},
    {qwen2_names, {qwen2_pattern, NULL}, false, false, true},
    {starcoder_names, {digit_pattern, tok_gpt2_pattern}, false, false, false},
};

void tok_pretok_free(struct tok_pretok *p) {
    if (!p) return;
    for (int i = 0; i < p->n; i++) pcre2_code_free(p->re[i]);
    free(p);
}

enum llmopt_status tok_pretok_compile(const char *const *patterns, const size_t *lens,
                                      const bool *literal, int n, const char *what,
                                      struct tok_pretok **out, struct llmopt_err *err) {
    *out = NULL;
    if (n > TOK_MAX_PRETOK)
        return err_set(err, LLMOPT_ERR_LIMIT,
                       "tokenizer: %s: %d split regexes exceed the cap of %d", what, n,
                       TOK_MAX_PRETOK);
    struct tok_pretok *p = calloc(1, sizeof *p);
    if (!p) return err_set(err, LLMOPT_ERR_NOMEM, "tokenizer: pre-tokenizer");
    for (int i = 0; i < n; i++) {
        uint32_t opts = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF;
        opts |= literal && literal[i] ? PCRE2_LITERAL : PCRE2_UCP;
        int code;
        PCRE2_SIZE at;
        size_t len = lens ? lens[i] : strlen(patterns[i]);
        p->re[i] = pcre2_compile((PCRE2_SPTR)patterns[i], len, opts, &code, &at, NULL);
        if (!p->re[i]) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(code, msg, sizeof msg);
            tok_pretok_free(p);
            return err_set(err, LLMOPT_ERR_FORMAT,
                           "tokenizer: %s: split regex %d does not compile at offset %zu: %s "
                           "(pattern \"%.*s\")",
                           what, i, (size_t)at, (const char *)msg, len > 200 ? 200 : (int)len,
                           patterns[i]);
        }
        p->n = i + 1;
        /* JIT is an optimisation: without it (no JIT support) matching still works */
        (void)pcre2_jit_compile(p->re[i], PCRE2_JIT_COMPLETE);
    }
    *out = p;
    return LLMOPT_OK;
}

enum llmopt_status tok_pretok_by_name(const char *name, size_t len, const char *what,
                                      struct tok_pretok **out, bool *ignore_merges,
                                      bool *add_bos_default, bool *nfc, struct llmopt_err *err) {
    for (size_t f = 0; f < LLMOPT_ARRAY_LEN(families); f++) {
        const struct pre_family *fam = &families[f];
        for (const char *const *nm = fam->names; *nm; nm++) {
            if (strlen(*nm) != len || memcmp(*nm, name, len) != 0) continue;
            int n = fam->patterns[1] ? 2 : 1;
            *ignore_merges = fam->ignore_merges;
            *add_bos_default = fam->add_bos;
            *nfc = fam->nfc;
            return tok_pretok_compile(fam->patterns, NULL, NULL, n, what, out, err);
        }
    }
    return err_set(err, LLMOPT_ERR_UNSUPPORTED,
                   "tokenizer: %s: pre-tokenizer \"%.*s\" is not supported (known: gpt2, "
                   "llama-bpe, qwen2, starcoder and their aliases)",
                   what, len > 64 ? 64 : (int)len, name);
}

/* ---- splitting ------------------------------------------------------------------- */

struct split_ctx {
    const struct tok_pretok *p;
    pcre2_match_data *md[TOK_MAX_PRETOK];
    tok_word_fn fn;
    void *ctx;
    struct llmopt_err *err;
};

/* Bytes of the UTF-8 character at s[0] (1 for an invalid lead byte), within n. */
static size_t char_len(const char *s, size_t n) {
    uint8_t c = (uint8_t)s[0];
    size_t k = c < 0xc0 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    return k < n ? k : n;
}

static enum llmopt_status split_level(struct split_ctx *c, int k, const char *s, size_t n) {
    if (n == 0) return LLMOPT_OK;
    if (k == c->p->n) return c->fn(c->ctx, s, n, c->err);
    pcre2_code *re = c->p->re[k];
    pcre2_match_data *md = c->md[k];
    size_t pos = 0, gap = 0; /* next search start; start of the unmatched gap */
    enum llmopt_status st;
    while (pos < n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, 0, md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* the interpreter keeps its frames on the heap */
            rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_JIT, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return err_set(c->err, LLMOPT_ERR_LIMIT,
                           "tokenizer: split regex %d failed at byte %zu of a %zu-byte piece: %s",
                           k, pos, n, (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) { /* an empty match splits nothing: search again one character on */
            if (ms >= n) break;
            pos = ms + char_len(s + ms, n - ms);
            continue;
        }
        if (ms > gap && (st = split_level(c, k + 1, s + gap, ms - gap))) return st;
        if ((st = split_level(c, k + 1, s + ms, me - ms))) return st;
        pos = gap = me;
    }
    return gap < n ? split_level(c, k + 1, s + gap, n - gap) : LLMOPT_OK;
}

enum llmopt_status tok_pretok_split(const struct tok_pretok *p, const char *text, size_t len,
                                    tok_word_fn fn, void *ctx, struct llmopt_err *err) {
    if (!p || p->n == 0) return len ? fn(ctx, text, len, err) : LLMOPT_OK;
    struct split_ctx c = {.p = p, .fn = fn, .ctx = ctx, .err = err};
    enum llmopt_status st = LLMOPT_OK;
    for (int i = 0; i < p->n; i++) {
        c.md[i] = pcre2_match_data_create_from_pattern(p->re[i], NULL);
        if (!c.md[i]) {
            st = err_set(err, LLMOPT_ERR_NOMEM, "tokenizer: regex match data");
            goto out;
        }
    }
    st = split_level(&c, 0, text, len);
out:
    for (int i = 0; i < p->n; i++) pcre2_match_data_free(c.md[i]);
    return st;
}
