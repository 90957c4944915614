/* llmopt detokenize: print the text of token ids. MODEL is a GGUF, a Hugging Face
 * tokenizer directory or a tokenizer.model. The ids may be separate arguments or
 * one argument separated by spaces or commas (the output of llmopt tokenize); all are
 * checked before anything is printed. The text goes through the streaming
 * detokenizer, as generation prints it: control tokens print nothing, and a newline
 * ends the output. */
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool is_sep(char c) {
    return c == ' ' || c == ',' || c == '\t' || c == '\n';
}

/* Appends the ids of one argument to ids[*n..cap); false (message printed) on a bad
 * one. cap bounds the count: an argument of L bytes holds at most L / 2 + 1 ids. */
static bool parse_ids(const char *arg, int32_t n_vocab, int32_t *ids, size_t *n) {
    for (const char *p = arg;;) {
        while (is_sep(*p)) p++;
        if (!*p) return true;
        char *end;
        errno = 0;
        long long id = strtoll(p, &end, 10);
        if (end == p || errno || id < 0 || id >= n_vocab || (*end && !is_sep(*end))) {
            fprintf(stderr, "llmopt: detokenize: expected token ids in [0, %d), found '%s'\n",
                    (int)n_vocab, arg);
            return false;
        }
        ids[(*n)++] = (int32_t)id;
        p = end;
    }
}

int cmd_detokenize(int argc, char **argv) {
    if (argc < 1) return usage_error("detokenize: %s", "needs MODEL and token ids");
    size_t cap = 0;
    for (int i = 1; i < argc; i++) cap += strlen(argv[i]) / 2 + 1;
    int32_t *ids = malloc((cap ? cap : 1) * sizeof *ids);
    if (!ids) return usage_error("detokenize: %s", "out of memory");
    struct llmopt_err err = {0};
    struct llmopt_model *model = NULL;
    struct llmopt_load_opts lo = {.vocab_only = true};
    if (llmopt_model_load(argv[0], &lo, &model, &err)) {
        free(ids);
        return fail(&err);
    }
    int rc = 0;
    size_t n = 0;
    for (int i = 1; i < argc && !rc; i++)
        if (!parse_ids(argv[i], llmopt_model_n_vocab(model), ids, &n)) rc = 1;
    struct llmopt_detok *d = NULL;
    if (!rc && llmopt_detok_create(model, &d, &err)) rc = fail(&err);
    if (!rc) {
        for (size_t i = 0; i < n; i++) fputs(llmopt_detok_push(d, ids[i]), stdout);
        fputs(llmopt_detok_flush(d), stdout);
        putchar('\n');
    }
    llmopt_detok_free(d);
    llmopt_model_free(model);
    free(ids);
    return rc;
}
