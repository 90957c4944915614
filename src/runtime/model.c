/* llmopt_model: open a GGUF, find the stock program that binds to it, load the
 * tokenizer. */
#include "runtime/model.h"
#include "runtime/program.h"

#include <sys/stat.h>

#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#define MODEL_MAX_PROGRAMS 256

static int compare_names(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A Model Program: a .llmopt file, or a directory holding model.llmopt. */
static bool program_path(const char *path, char *buf, size_t cap) {
    struct stat sb;
    if (stat(path, &sb) != 0) return false;
    if (S_ISDIR(sb.st_mode)) {
        snprintf(buf, cap, "%s/model.llmopt", path);
        return stat(buf, &sb) == 0;
    }
    size_t n = strlen(path);
    snprintf(buf, cap, "%s", path);
    return n > 7 && !strcmp(path + n - 7, ".llmopt");
}

enum llmopt_status llmopt_model_load(const char *path, const struct llmopt_load_opts *opts,
                                     struct llmopt_model **out, struct llmopt_err *err) {
    char prog[PATH_MAX + 16];
    if (!(opts && opts->vocab_only) && program_path(path, prog, sizeof prog)) {
        enum llmopt_status pst = program_load(prog, false, out, err);
        if (!pst && opts && opts->verbose)
            fprintf(stderr, "llmopt: loaded the compiled program %s (program '%s', no passes run)\n", prog,
                    (*out)->program_name);
        return pst;
    }
    struct llmopt_model *m = calloc(1, sizeof *m);
    if (!m) return err_set(err, LLMOPT_ERR_NOMEM, "out of memory");
    if (opts && opts->vocab_only) {
        /* the tokenizer alone: a GGUF, a Hugging Face tokenizer directory or a
         * SentencePiece tokenizer.model */
        enum llmopt_status vst = tok_vocab_load(path, &m->vocab, err);
        if (vst) {
            free(m);
            return vst;
        }
        m->n_vocab = tok_n_tokens(m->vocab);
        *out = m;
        return LLMOPT_OK;
    }
    enum llmopt_status st = weights_open(path, &m->weights, err);
    if (st) {
        free(m);
        return st;
    }
    m->gguf = m->weights.gguf;
    char dir_buf[PATH_MAX];
    const char *dir = model_programs_dir(opts, dir_buf, sizeof dir_buf);
    DIR *d = opendir(dir);
    if (!d) {
        llmopt_model_free(m);
        return err_set(err, LLMOPT_ERR_IO, "programs directory '%s' cannot be opened", dir);
    }
    char *names[MODEL_MAX_PROGRAMS];
    int n_names = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n_names < MODEL_MAX_PROGRAMS)
        if (e->d_name[0] != '.') names[n_names++] = strdup(e->d_name);
    closedir(d);
    qsort(names, (size_t)n_names, sizeof *names, compare_names);

    /* Try each program; keep every refusal for the report. */
    char report[sizeof err->msg - 200] = "";
    bool bound = false;
    for (int i = 0; i < n_names && !bound; i++) {
        if (!names[i]) continue;
        char pdir[PATH_MAX + 256];
        snprintf(pdir, sizeof pdir, "%s/%s", dir, names[i]);
        struct llmopt_err why = {0};
        if (model_bind_program(m, pdir, &why) == LLMOPT_OK) {
            bound = true;
        } else {
            /* Keep each refusal short enough that several fit in one message. */
            size_t used = strlen(report);
            snprintf(report + used, sizeof report - used, "\n  %.40s: %.170s", names[i], why.msg);
        }
    }
    for (int i = 0; i < n_names; i++) free(names[i]);
    if (!bound) {
        err_set(err, LLMOPT_ERR_BIND, "no stock program in '%s' binds to '%s':%s", dir, path,
                n_names ? report : " (no programs)");
        llmopt_model_free(m);
        return LLMOPT_ERR_BIND;
    }
    m->passes.nodes_before = m->passes.nodes_after = m->ir.n_nodes;
    m->passes.kernels_before = m->passes.kernels_after = ir_count_kernels(&m->ir);
    /* LLMOPT_PASSES=name,name,... (or "none") picks passes, for bisecting a miscompile. */
    uint32_t enabled = PASSES_ALL;
    const char *env = getenv("LLMOPT_PASSES");
    if (env && *env) {
        enabled = 0;
        for (int p = 0; p < PASS_COUNT; p++)
            if (strstr(env, pass_names[p])) enabled |= 1u << p;
    }
    if (!(opts && opts->no_passes) && enabled && passes_run(&m->ir, enabled, &m->passes, err)) {
        enum llmopt_status pst = err->status;
        llmopt_model_free(m);
        return pst ? pst : LLMOPT_ERR_FORMAT;
    }
    const struct ir_shape *logits = &m->ir.nodes[m->ir.output].shape;
    m->n_vocab = (int32_t)logits->dims[logits->rank - 1].coef;
    double ctx = 0;
    m->ctx_train = ir_hparams_get(&m->hp, "max_positions", &ctx) && ctx >= 1 && ctx < 1e9
                       ? (int32_t)ctx
                       : 2048;
    struct llmopt_err tok_err = {0};
    enum llmopt_status tok_st = m->gguf ? tok_vocab_from_gguf(m->gguf, &m->vocab, &tok_err)
                                        : tok_vocab_from_dir(path, &m->vocab, &tok_err);
    if (tok_st != LLMOPT_OK) {
        m->vocab = NULL;
        if (opts && opts->verbose) fprintf(stderr, "llmopt: no tokenizer: %s\n", tok_err.msg);
    } else if (tok_n_tokens(m->vocab) > m->n_vocab) {
        err_set(err, LLMOPT_ERR_FORMAT, "tokenizer has %d tokens, the model's logits %d",
                tok_n_tokens(m->vocab), m->n_vocab);
        llmopt_model_free(m);
        return LLMOPT_ERR_FORMAT;
    }
    if (opts && opts->verbose) {
        char arch[128] = "?";
        weights_arch(&m->weights, arch, sizeof arch);
        fprintf(stderr,
                "llmopt: program '%s' binds to %s: all %lld tensors matched by name and shape "
                "(architecture string '%s' is provenance only)\n",
                m->program_name, path, (long long)weights_n_tensors(&m->weights), arch);
    }
    *out = m;
    return LLMOPT_OK;
}

void llmopt_model_free(struct llmopt_model *m) {
    if (!m) return;
    if (m->plan) {
        mem_plan_free(m->plan);
        free(m->plan);
    }
    model_unbind(m);
    tok_vocab_free(m->vocab);
    weights_close(&m->weights);
    free(m);
}

const char *llmopt_model_program(const struct llmopt_model *m) { return m->program_name; }
int32_t llmopt_model_n_vocab(const struct llmopt_model *m) { return m->n_vocab; }
int32_t llmopt_model_ctx_train(const struct llmopt_model *m) { return m->ctx_train; }
enum llmopt_status llmopt_inspect_gguf(const char *path, FILE *out, struct llmopt_err *err) {
    struct gguf_file *f;
    enum llmopt_status st = gguf_open(path, &f, err);
    if (st) return st;
    gguf_print(f, out);
    gguf_close(f);
    return LLMOPT_OK;
}

void llmopt_model_compile_stats(const struct llmopt_model *m, struct llmopt_compile_stats *out) {
    *out = (struct llmopt_compile_stats){m->passes.nodes_before, m->passes.nodes_after,
                                         m->passes.kernels_before, m->passes.kernels_after};
}

void llmopt_model_dump_ir(const struct llmopt_model *m, FILE *out) { ir_print(&m->ir, out); }

int32_t llmopt_token_bos(const struct llmopt_model *m) { return m->vocab ? tok_bos(m->vocab) : -1; }
int32_t llmopt_token_eos(const struct llmopt_model *m) { return m->vocab ? tok_eos(m->vocab) : -1; }
bool llmopt_token_is_eog(const struct llmopt_model *m, int32_t id) {
    return m->vocab && tok_is_eog(m->vocab, id);
}
bool llmopt_add_bos_default(const struct llmopt_model *m) { return m->vocab && tok_add_bos(m->vocab); }

enum llmopt_status llmopt_tokenize_ex(const struct llmopt_model *m, const char *text, size_t len,
                                      bool add_bos, bool parse_special, int32_t *ids, size_t cap,
                                      size_t *n_ids, struct llmopt_err *err) {
    if (!m->vocab) return err_set(err, LLMOPT_ERR_UNSUPPORTED, "the model file has no tokenizer");
    return tok_encode(m->vocab, text, len, add_bos, parse_special, ids, cap, n_ids, err);
}

enum llmopt_status llmopt_tokenize(const struct llmopt_model *m, const char *text, size_t len,
                                   bool add_bos, int32_t *ids, size_t cap, size_t *n_ids,
                                   struct llmopt_err *err) {
    return llmopt_tokenize_ex(m, text, len, add_bos, true, ids, cap, n_ids, err);
}

int llmopt_token_eog_ids(const struct llmopt_model *m, const int32_t **ids) {
    *ids = NULL;
    return m->vocab ? tok_eog_ids(m->vocab, ids) : 0;
}

struct llmopt_detok {
    struct tok_stream stream;
    size_t cap;
    char buf[]; /* (cap + 1) */
};

enum llmopt_status llmopt_detok_create(const struct llmopt_model *m, struct llmopt_detok **out,
                                       struct llmopt_err *err) {
    if (!m->vocab) return err_set(err, LLMOPT_ERR_UNSUPPORTED, "the model file has no tokenizer");
    size_t cap = tok_stream_max_out(m->vocab);
    if (cap < 4) cap = 4;
    struct llmopt_detok *d = malloc(sizeof *d + cap + 1);
    if (!d) return err_set(err, LLMOPT_ERR_NOMEM, "out of memory");
    d->cap = cap;
    tok_stream_init(&d->stream, m->vocab);
    *out = d;
    return LLMOPT_OK;
}

const char *llmopt_detok_push(struct llmopt_detok *d, int32_t id) {
    size_t n = tok_stream_push(&d->stream, id, d->buf, d->cap);
    d->buf[n] = 0;
    return d->buf;
}

const char *llmopt_detok_flush(struct llmopt_detok *d) {
    size_t n = tok_stream_flush(&d->stream, d->buf, d->cap);
    d->buf[n] = 0;
    return d->buf;
}

void llmopt_detok_free(struct llmopt_detok *d) { free(d); }
