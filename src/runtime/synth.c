/* llmopt synth / llmopt quantize (see synth.h).
 *
 * Nothing here knows an architecture: the table below is data (a program name, an
 * architecture string that only spells metadata keys, a vocabulary file and hparam
 * values); tensors and keys come from the program's graph.json and map.json. */
#include "runtime/synth.h"

#include "base/clock.h"
#include "format/gguf_write.h"
#include "format/graph_file.h"
#include "format/quant_k.h"
#include "ir/import.h"
#include "runtime/model.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define SYNTH_MAX_HP        16
#define SYNTH_NAME_MAX      256
#define SYNTH_CHUNK_BYTES   (8u << 20) /* output bytes converted per parallel step */
#define SYNTH_MAX_THREADS   64
#define SYNTH_WEIGHT_STD    0.02f /* like a trained model's init: activations stay finite */
#define SYNTH_QUANT_VERSION 2u    /* general.quantization_version of ggml's current layouts */

/* ---- the shape table ---- */

struct synth_hp {
    const char *name;
    double value;
    bool is_float; /* metadata f32 (eps, theta); else u32 */
};

struct synth_model {
    const char *like;
    const char *program;    /* directory under programs/ */
    const char *arch;       /* general.architecture: spells the {arch} keys */
    const char *vocab_file; /* in the tokenizers directory */
    bool tied;              /* no output.weight: the map's fallback binds the embedding */
    struct synth_hp hp[SYNTH_MAX_HP];
};

/* clang-format off */
/* Every model below sets the same hparams: HP names them once, in this order. */
#define HP(vocab, d_model, d_ff, n_layers, n_heads, n_kv_heads, head_dim, rms_eps, rope_theta, \
           max_positions)                                                                     \
    {{"vocab", vocab, false},          {"d_model", d_model, false},                           \
     {"d_ff", d_ff, false},            {"n_layers", n_layers, false},                         \
     {"n_heads", n_heads, false},      {"n_kv_heads", n_kv_heads, false},                     \
     {"head_dim", head_dim, false},    {"rms_eps", rms_eps, true},                            \
     {"rope_theta", rope_theta, true}, {"max_positions", max_positions, false}}
/* program, architecture (spells the {arch} keys), vocabulary file */
#define LLAMA3 "llama", "llama", "ggml-vocab-llama-bpe.gguf"
#define QWEN3  "qwen3", "qwen3", "ggml-vocab-qwen2.gguf"

static const struct synth_model synth_models[] = {
    /* small dims (multiples of 256, so K-quants apply), real vocabularies: for tests */
    /* like                  tied       vocab   dim   d_ff lay  nh kv   hd   eps    theta     ctx */
    {"tiny-llama",   LLAMA3, true,  HP(128256,  256,   768,  2,  4, 2,  64, 1e-5,  500000,   2048)},
    {"tiny-qwen3",   QWEN3,  true,  HP(151936,  256,   768,  2,  4, 2, 128, 1e-6, 1000000,   2048)},
    {"llama-3.2-1b", LLAMA3, true,  HP(128256, 2048,  8192, 16, 32, 8,  64, 1e-5,  500000, 131072)},
    {"llama-3.2-3b", LLAMA3, true,  HP(128256, 3072,  8192, 28, 24, 8, 128, 1e-5,  500000, 131072)},
    {"llama-3.1-8b", LLAMA3, false, HP(128256, 4096, 14336, 32, 32, 8, 128, 1e-5,  500000, 131072)},
    {"qwen3-0.6b",   QWEN3,  true,  HP(151936, 1024,  3072, 28, 16, 8, 128, 1e-6, 1000000,  40960)},
    {"qwen3-1.7b",   QWEN3,  true,  HP(151936, 2048,  6144, 28, 16, 8, 128, 1e-6, 1000000,  40960)},
    {"qwen3-4b",     QWEN3,  true,  HP(151936, 2560,  9728, 36, 32, 8, 128, 1e-6, 1000000,  40960)},
    {"qwen3-8b",     QWEN3,  false, HP(151936, 4096, 12288, 36, 32, 8, 128, 1e-6, 1000000,  40960)},
};
/* clang-format on */
#undef HP
#undef LLAMA3
#undef QWEN3

/* Keys llama.cpp reads that a map need not name: written when the hparam is known
 * and the map's rules did not write the key already, so the files load there too. */
static const struct {
    const char *key;
    const char *hparam;
} companion_keys[] = {
    {"{arch}.context_length", "max_positions"},  {"{arch}.vocab_size", "vocab"},
    {"{arch}.attention.key_length", "head_dim"}, {"{arch}.attention.value_length", "head_dim"},
    {"{arch}.rope.dimension_count", "head_dim"},
};

/* ---- target types ---- */

static const struct {
    const char *name;
    enum ggml_type base, more_bits;
    uint32_t file_type; /* llama_ftype */
} qplans[] = {
    {"f32", GGML_TYPE_F32, GGML_TYPE_F32, 0},
    {"f16", GGML_TYPE_F16, GGML_TYPE_F16, 1},
    {"bf16", GGML_TYPE_BF16, GGML_TYPE_BF16, 32},
    {"q8_0", GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, 7},
    {"q4_0", GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 2},
    {"q5_0", GGML_TYPE_Q5_0, GGML_TYPE_Q5_0, 8},
    {"iq4_xs", GGML_TYPE_IQ4_XS, GGML_TYPE_IQ4_XS, 30},
    {"q4_k", GGML_TYPE_Q4_K, GGML_TYPE_Q4_K, 14}, /* all q4_K: filed as Q4_K_S */
    {"q5_k", GGML_TYPE_Q5_K, GGML_TYPE_Q5_K, 16}, /* filed as Q5_K_S */
    {"q6_k", GGML_TYPE_Q6_K, GGML_TYPE_Q6_K, 18},
    {"q4_k_m", GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, 15},
    {"q5_k_m", GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, 17},
};

bool synth_qplan_parse(const char *name, struct synth_qplan *out) {
    for (size_t i = 0; i < LLMOPT_ARRAY_LEN(qplans); i++) {
        if (strcasecmp(name, qplans[i].name)) continue;
        snprintf(out->name, sizeof out->name, "%s", qplans[i].name);
        out->base = qplans[i].base;
        out->more_bits = qplans[i].more_bits;
        out->file_type = qplans[i].file_type;
        return true;
    }
    return false;
}

const char *synth_qplan_names(void) {
    return "f32, f16, bf16, q8_0, q4_0, q5_0, iq4_xs, q4_k, q5_k, q6_k, q4_k_m, q5_k_m";
}

/* "blk.12.ffn_down.weight" -> 12; -1 when the name has no layer. */
static int layer_of(const char *name) {
    if (strncmp(name, "blk.", 4)) return -1;
    char *end;
    long v = strtol(name + 4, &end, 10);
    return end != name + 4 && *end == '.' && v >= 0 && v < INT_MAX ? (int)v : -1;
}

/* llama.cpp's _M mixes spend more bits on the first and last eighth of the layers and
 * on every third layer in between. */
static bool layer_gets_more_bits(int layer, int n_layers) {
    return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

enum ggml_type synth_tensor_type(const struct synth_qplan *plan, const char *name, uint32_t n_dims,
                                 const uint64_t *ne, enum ggml_type keep, int n_layers,
                                 bool has_output) {
    if (n_dims < 2) return keep;
    enum ggml_type type = plan->base;
    if (plan->more_bits != plan->base) {
        bool more =
            !strcmp(name, "output.weight") || (!has_output && !strcmp(name, "token_embd.weight"));
        int layer = layer_of(name);
        if (!more && layer >= 0 && (strstr(name, ".attn_v.") || strstr(name, ".ffn_down")))
            more = layer_gets_more_bits(layer, n_layers);
        if (more) type = plan->more_bits;
    }
    /* Rows that are not a whole number of 256-element super-blocks take a 32-block type
     * of about as many bits (as llama.cpp does), and rows that are not a whole number
     * of those take f16. */
    uint32_t block_elems, block_bytes;
    if (gguf_w_type_block(type, &block_elems, &block_bytes) && ne[0] % block_elems && block_elems > 32)
        type = type == GGML_TYPE_Q6_K ? GGML_TYPE_Q8_0 : GGML_TYPE_Q5_0;
    if (!gguf_w_type_block(type, &block_elems, &block_bytes) || ne[0] % block_elems)
        type = GGML_TYPE_F16;
    return type;
}

/* ---- parallel row conversion ---- */

/* Produces row `row` of a tensor as f32 into out (row_len values). */
typedef void (*row_fill_fn)(const void *ctx, int64_t row, float *out);

struct row_task {
    row_fill_fn fill;
    const void *ctx;
    int64_t row_len;
    enum ggml_type type;
    size_t row_bytes;
    int64_t row0, n_rows; /* this chunk */
    uint8_t *dst;         /* (n_rows * row_bytes) */
    int n_threads;
    float *scratch; /* (n_threads * row_len) */
};

struct row_worker {
    struct row_task *task;
    int index;
};

static void *row_worker_main(void *arg) {
    const struct row_worker *wk = arg;
    const struct row_task *t = wk->task;
    int64_t begin = t->n_rows * wk->index / t->n_threads;
    int64_t end = t->n_rows * (wk->index + 1) / t->n_threads;
    float *row = t->scratch + (size_t)wk->index * (size_t)t->row_len;
    for (int64_t r = begin; r < end; r++) {
        t->fill(t->ctx, t->row0 + r, row);
        gguf_w_encode_row(t->type, row, t->dst + (size_t)r * t->row_bytes, t->row_len);
    }
    return NULL;
}

static int default_threads(int requested) {
    if (requested > 0) return requested < SYNTH_MAX_THREADS ? requested : SYNTH_MAX_THREADS;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > SYNTH_MAX_THREADS ? SYNTH_MAX_THREADS : (int)n;
}

/* Fills, encodes and writes n_rows rows of one tensor, a chunk at a time. */
static enum llmopt_status emit_rows(struct gguf_w *w, row_fill_fn fill, const void *ctx,
                                    int64_t n_rows, int64_t row_len, enum ggml_type type,
                                    int threads, struct llmopt_err *err) {
    size_t row_bytes = gguf_w_row_bytes(type, row_len);
    LLMOPT_ASSERT(row_bytes > 0);
    int64_t chunk_rows = (int64_t)(SYNTH_CHUNK_BYTES / row_bytes);
    if (chunk_rows < 1) chunk_rows = 1;
    if (chunk_rows > n_rows) chunk_rows = n_rows;
    /* small tensors are not worth a thread */
    int n_threads = (double)n_rows * (double)row_len < 65536.0 ? 1 : threads;
    struct row_task task = {.fill = fill,
                            .ctx = ctx,
                            .row_len = row_len,
                            .type = type,
                            .row_bytes = row_bytes,
                            .n_threads = n_threads};
    task.dst = malloc((size_t)chunk_rows * row_bytes);
    task.scratch = malloc((size_t)n_threads * (size_t)row_len * sizeof(float));
    if (!task.dst || !task.scratch) {
        free(task.dst);
        free(task.scratch);
        return err_set(err, LLMOPT_ERR_NOMEM, "synth: out of memory for a chunk of %lld rows",
                       (long long)chunk_rows);
    }
    enum llmopt_status st = LLMOPT_OK;
    struct row_worker workers[SYNTH_MAX_THREADS];
    pthread_t tids[SYNTH_MAX_THREADS];
    bool started[SYNTH_MAX_THREADS];
    for (int64_t row0 = 0; row0 < n_rows && !st; row0 += chunk_rows) {
        task.row0 = row0;
        task.n_rows = n_rows - row0 < chunk_rows ? n_rows - row0 : chunk_rows;
        for (int i = 0; i < n_threads; i++)
            workers[i] = (struct row_worker){.task = &task, .index = i};
        for (int i = 1; i < n_threads; i++)
            started[i] = pthread_create(&tids[i], NULL, row_worker_main, &workers[i]) == 0;
        row_worker_main(&workers[0]);
        for (int i = 1; i < n_threads; i++) {
            if (started[i])
                pthread_join(tids[i], NULL);
            else
                row_worker_main(&workers[i]); /* no thread: do its share here */
        }
        st = gguf_w_write(w, task.dst, (size_t)task.n_rows * row_bytes, err);
    }
    free(task.dst);
    free(task.scratch);
    return st;
}

void synth_report_print(const struct synth_report *rep, const char *path, FILE *out) {
    fprintf(out, "wrote %s: %u tensors, %.3f G parameters, %.1f MiB (", path, rep->n_tensors,
            (double)rep->n_params * 1e-9, (double)rep->file_bytes / (1024.0 * 1024.0));
    bool first = true;
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        if (!rep->type_counts[t]) continue;
        const char *name = gguf_w_type_name((enum ggml_type)t);
        fprintf(out, "%s%u %s", first ? "" : ", ", rep->type_counts[t], name ? name : "?");
        first = false;
    }
    fprintf(out, ") in %.2f s\n", rep->seconds);
}

/* ---- random weights ---- */

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t hash_name(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ull;
    }
    return h;
}

struct synth_tensor {
    char name[GGUF_W_NAME_MAX + 1];
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    enum ggml_type type;
    bool random;    /* else every element is `constant` */
    float constant; /* norm weights 1, other vectors 0 */
    uint64_t seed;  /* from --seed and the name: rows do not depend on threads or order */
};

/* Normal(0, SYNTH_WEIGHT_STD), approximately: the sum of four 16-bit uniforms of one
 * 64-bit draw (Irwin-Hall, variance 4/12), centred and scaled; fast and bounded. */
static void fill_synth_row(const void *ctx, int64_t row, float *out) {
    const struct synth_tensor *t = ctx;
    int64_t n = (int64_t)t->ne[0];
    if (!t->random) {
        for (int64_t i = 0; i < n; i++) out[i] = t->constant;
        return;
    }
    uint64_t state = t->seed ^ ((uint64_t)row * 0xd1b54a32d192ed03ull);
    const float scale = SYNTH_WEIGHT_STD * 1.7320508f / 65536.0f; /* sqrt(3) / 2^16 */
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = splitmix64(&state);
        float sum = (float)(r & 0xffff) + (float)((r >> 16) & 0xffff) +
                    (float)((r >> 32) & 0xffff) + (float)(r >> 48);
        out[i] = (sum - 2.0f * 65535.0f) * scale;
    }
}

/* ---- program files ---- */

static const struct synth_model *find_model(const char *like) {
    for (size_t i = 0; i < LLMOPT_ARRAY_LEN(synth_models); i++)
        if (!strcasecmp(like, synth_models[i].like)) return &synth_models[i];
    return NULL;
}

void synth_list(FILE *out) {
    fprintf(out, "%-14s %-8s %-27s %7s %6s %6s %6s %5s %4s %8s %s\n", "name", "program",
            "vocabulary", "vocab", "d_model", "d_ff", "layers", "heads", "kv", "head_dim",
            "embedding");
    for (size_t i = 0; i < LLMOPT_ARRAY_LEN(synth_models); i++) {
        const struct synth_model *m = &synth_models[i];
        double v[7] = {0};
        static const char *const names[7] = {"vocab",   "d_model",    "d_ff",    "n_layers",
                                             "n_heads", "n_kv_heads", "head_dim"};
        for (int k = 0; k < 7; k++)
            for (int j = 0; j < SYNTH_MAX_HP && m->hp[j].name; j++)
                if (!strcmp(m->hp[j].name, names[k])) v[k] = m->hp[j].value;
        fprintf(out, "%-14s %-8s %-27s %7.0f %7.0f %6.0f %6.0f %5.0f %4.0f %8.0f %s\n", m->like,
                m->program, m->vocab_file, v[0], v[1], v[2], v[3], v[4], v[5], v[6],
                m->tied ? "tied" : "untied");
    }
}

static enum llmopt_status load_json(const char *path, bool graph, json_t **out,
                                    struct llmopt_err *err) {
    enum llmopt_status st = json_load_file_capped(path, GRAPH_FILE_MAX_BYTES, out, err);
    if (st) return st;
    st = graph ? graph_file_check(*out, err) : param_map_check(*out, err);
    if (st) {
        err_prefix(err, "%s", path);
        json_decref(*out);
        *out = NULL;
    }
    return st;
}

/* "{arch}.block_count" -> "llama.block_count" */
static bool spell_key(const char *tmpl, const char *arch, char *out, size_t cap) {
    size_t o = 0;
    for (const char *p = tmpl; *p;) {
        const char *piece = p;
        size_t n = 1;
        if (!strncmp(p, "{arch}", 6)) {
            piece = arch;
            n = strlen(arch);
            p += 6;
        } else {
            p++;
        }
        if (o + n >= cap) return false;
        memcpy(out + o, piece, n);
        o += n;
    }
    out[o] = 0;
    return true;
}

static bool hp_set(struct ir_hparams *hp, const char *name, double value) {
    for (int i = 0; i < hp->n; i++)
        if (!strcmp(hp->names[i], name)) {
            hp->values[i] = value;
            return true;
        }
    if (hp->n >= IR_MAX_HPARAMS) return false;
    hp->names[hp->n] = name;
    hp->values[hp->n++] = value;
    return true;
}

/* Values for every graph hparam: the table's, then the map's defaults (which may
 * refer to each other, so in rounds). */
static enum llmopt_status resolve_hparams(const struct synth_model *sm, int n_layers_override,
                                          const json_t *graph, const json_t *hmap,
                                          struct ir_hparams *hp, struct llmopt_err *err) {
    hp->n = 0;
    for (int i = 0; i < SYNTH_MAX_HP && sm->hp[i].name; i++)
        hp_set(hp, sm->hp[i].name, sm->hp[i].value);
    if (n_layers_override > 0) hp_set(hp, "n_layers", n_layers_override);
    for (size_t round = 0; round <= json_object_size(hmap); round++) {
        const char *name;
        json_t *spec;
        json_object_foreach((json_t *)hmap, name, spec) {
            double v;
            const json_t *dflt = json_object_get(spec, "default");
            struct llmopt_err ignored;
            if (ir_hparams_get(hp, name, &v) || !dflt) continue;
            if (ir_number_from_json(dflt, hp, &v, &ignored) == LLMOPT_OK && !hp_set(hp, name, v))
                return err_set(err, LLMOPT_ERR_LIMIT, "synth: more than %d hparams",
                               IR_MAX_HPARAMS);
        }
    }
    size_t i;
    json_t *h;
    json_array_foreach(json_object_get(graph, "hparams"), i, h) {
        double v;
        const char *name = json_string_value(h);
        if (!name || !ir_hparams_get(hp, name, &v))
            return err_set(
                err, LLMOPT_ERR_INVALID_ARG,
                "synth: --like %s gives no value for hparam '%s' of program '%s' (add it to the "
                "shape table in src/runtime/synth.c)",
                sm->like, name ? name : "?", sm->program);
    }
    return LLMOPT_OK;
}

/* Layer count: the graph's repeat count (as the binder reads it). */
static int graph_layers(const json_t *graph, const struct ir_hparams *hp) {
    size_t i;
    json_t *node;
    double n = 0;
    json_array_foreach(json_object_get(graph, "nodes"), i, node) {
        const json_t *count = json_object_get(node, "count");
        struct llmopt_err ignored;
        if (count && ir_number_from_json(count, hp, &n, &ignored) == LLMOPT_OK) break;
    }
    return n >= 1 && n <= 4096 ? (int)n : 0;
}

/* ---- synth ---- */

struct synth_ctx {
    const struct synth_model *sm;
    struct synth_qplan plan;
    const struct synth_opts *opts;
    json_t *graph, *map;
    struct ir_hparams hp;
    int n_layers;
    struct synth_tensor *tensors; /* (n_tensors) */
    uint32_t n_tensors, cap_tensors;
    struct gguf_file *vocab;
    struct gguf_w *w;
};

static enum llmopt_status push_tensor(struct synth_ctx *c, const char *pname, const char *tname,
                                      const json_t *shape, struct llmopt_err *err) {
    if (c->n_tensors == c->cap_tensors) {
        uint32_t cap = c->cap_tensors ? 2 * c->cap_tensors : 64;
        struct synth_tensor *t = realloc(c->tensors, cap * sizeof *t);
        if (!t) return err_set(err, LLMOPT_ERR_NOMEM, "synth: out of memory");
        c->tensors = t;
        c->cap_tensors = cap;
    }
    struct synth_tensor *t = &c->tensors[c->n_tensors];
    memset(t, 0, sizeof *t);
    if (strlen(tname) > GGUF_W_NAME_MAX)
        return err_set(err, LLMOPT_ERR_FORMAT, "synth: tensor name '%s' is longer than %d bytes",
                       tname, GGUF_W_NAME_MAX);
    snprintf(t->name, sizeof t->name, "%s", tname);
    size_t rank = json_array_size(shape);
    if (rank < 1 || rank > GGUF_MAX_DIMS)
        return err_set(err, LLMOPT_ERR_FORMAT, "synth: param '%s' has rank %zu (expected 1..%d)",
                       pname, rank, GGUF_MAX_DIMS);
    t->n_dims = (uint32_t)rank;
    for (size_t d = 0; d < rank; d++) {
        double v;
        enum llmopt_status st = ir_number_from_json(json_array_get(shape, d), &c->hp, &v, err);
        if (st) {
            err_prefix(err, "synth: param '%s' dim %zu", pname, d);
            return st;
        }
        if (!(v >= 1 && v <= 1e12) || v != floor(v))
            return err_set(err, LLMOPT_ERR_FORMAT, "synth: param '%s' dim %zu evaluates to %g",
                           pname, d, v);
        t->ne[rank - 1 - d] = (uint64_t)v; /* GGUF lists the innermost dimension first */
    }
    for (uint32_t d = t->n_dims; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    t->random = t->n_dims >= 2;
    t->constant = strstr(tname, "norm") ? 1.0f : 0.0f;
    uint64_t s = c->opts->seed ^ hash_name(tname);
    t->seed = splitmix64(&s);
    c->n_tensors++;
    return LLMOPT_OK;
}

/* Adds the tensors of graph params (per_layer: the "{i}" ones, for `layer`). */
static enum llmopt_status collect_params(struct synth_ctx *c, bool per_layer, int layer,
                                         size_t first, size_t last, struct llmopt_err *err) {
    const json_t *pmap = json_object_get(json_object_get(c->map, "gguf"), "params");
    const json_t *params = json_object_get(c->graph, "params");
    for (size_t i = first; i < last; i++) {
        const json_t *p = json_array_get(params, i);
        const char *pname = json_string_value(json_object_get(p, "name"));
        if (!pname) return err_set(err, LLMOPT_ERR_FORMAT, "synth: graph param %zu has no name", i);
        if ((strstr(pname, "{i}") != NULL) != per_layer) continue;
        const json_t *spec = json_object_get(pmap, pname);
        const char *tensor = json_string_value(json_object_get(spec, "tensor"));
        if (!tensor)
            return err_set(err, LLMOPT_ERR_FORMAT,
                           "synth: the map of program '%s' has no gguf tensor for param '%s'",
                           c->sm->program, pname);
        /* tied embeddings: leave the first name out so that the fallback binds */
        if (c->sm->tied && json_string_value(json_object_get(spec, "fallback"))) continue;
        char tname[SYNTH_NAME_MAX];
        if (!ir_substitute_layer(tensor, per_layer ? layer : -1, tname, sizeof tname))
            return err_set(err, LLMOPT_ERR_FORMAT, "synth: bad tensor name '%s' for param '%s'",
                           tensor, pname);
        bool dup = false;
        for (uint32_t k = 0; k < c->n_tensors && !dup; k++)
            dup = !strcmp(c->tensors[k].name, tname);
        if (dup) continue; /* two params bound to one tensor */
        enum llmopt_status st = push_tensor(c, pname, tname, json_object_get(p, "shape"), err);
        if (st) return st;
    }
    return LLMOPT_OK;
}

/* Tensor list in llama.cpp's order: globals before the layers, the layers (all of
 * layer 0, then 1, ...), the globals after them. */
static enum llmopt_status collect_tensors(struct synth_ctx *c, struct llmopt_err *err) {
    const json_t *params = json_object_get(c->graph, "params");
    size_t n = json_array_size(params), first_layer = n;
    for (size_t i = 0; i < n && first_layer == n; i++) {
        const char *pname = json_string_value(json_object_get(json_array_get(params, i), "name"));
        if (pname && strstr(pname, "{i}")) first_layer = i;
    }
    enum llmopt_status st = collect_params(c, false, -1, 0, first_layer, err);
    for (int layer = 0; layer < c->n_layers && !st; layer++)
        st = collect_params(c, true, layer, 0, n, err);
    if (!st) st = collect_params(c, false, -1, first_layer, n, err);
    if (st) return st;
    /* a tied model's skipped first names must have their fallback in the file */
    const json_t *pmap = json_object_get(json_object_get(c->map, "gguf"), "params");
    const char *pname;
    json_t *spec;
    json_object_foreach((json_t *)pmap, pname, spec) {
        const char *fb = json_string_value(json_object_get(spec, "fallback"));
        if (!c->sm->tied || !fb || strstr(fb, "{i}")) continue;
        bool found = false;
        for (uint32_t k = 0; k < c->n_tensors && !found; k++)
            found = !strcmp(c->tensors[k].name, fb);
        if (!found)
            return err_set(err, LLMOPT_ERR_FORMAT,
                           "synth: '%s' is tied but the fallback '%s' of param '%s' is not "
                           "written",
                           c->sm->like, fb, pname);
    }
    return LLMOPT_OK;
}

static bool has_tensor(const struct synth_ctx *c, const char *name) {
    for (uint32_t k = 0; k < c->n_tensors; k++)
        if (!strcmp(c->tensors[k].name, name)) return true;
    return false;
}

static const struct synth_hp *table_hp(const struct synth_model *sm, const char *name) {
    for (int i = 0; i < SYNTH_MAX_HP && sm->hp[i].name; i++)
        if (!strcmp(sm->hp[i].name, name)) return &sm->hp[i];
    return NULL;
}

/* An hparam as metadata: f32 where the table says so or the value is fractional,
 * else u32 (counts and sizes). */
static enum llmopt_status set_hparam_key(struct synth_ctx *c, const char *key, const char *hname,
                                         double v, struct llmopt_err *err) {
    const struct synth_hp *thp = table_hp(c->sm, hname);
    bool is_float = (thp && thp->is_float) || v != floor(v) || v < 0 || v > 4294967295.0;
    return is_float ? gguf_w_set_f32(c->w, key, (float)v, err)
                    : gguf_w_set_u32(c->w, key, (uint32_t)v, err);
}

/* The map's "match" clause (keys that must hold one of the listed values; null: may
 * be absent): the table's architecture must be allowed, and a key that may not be
 * absent and that nothing else wrote gets the first allowed value. */
static enum llmopt_status apply_match(struct synth_ctx *c, struct llmopt_err *err) {
    const json_t *match = json_object_get(json_object_get(c->map, "gguf"), "match");
    const char *tmpl;
    json_t *allowed;
    json_object_foreach((json_t *)match, tmpl, allowed) {
        char key[SYNTH_NAME_MAX];
        if (!json_is_array(allowed) || !spell_key(tmpl, c->sm->arch, key, sizeof key))
            return err_set(err, LLMOPT_ERR_FORMAT, "synth: map match '%s' needs a list of values",
                           tmpl);
        bool null_ok = false, arch_ok = false;
        const json_t *first = NULL;
        size_t i;
        json_t *v;
        json_array_foreach(allowed, i, v) {
            if (json_is_null(v))
                null_ok = true;
            else if (!first)
                first = v;
            if (json_is_string(v) && !strcmp(json_string_value(v), c->sm->arch)) arch_ok = true;
        }
        enum llmopt_status st = LLMOPT_OK;
        if (!strcmp(key, "general.architecture")) {
            if (!arch_ok)
                return err_set(err, LLMOPT_ERR_INVALID_ARG,
                               "synth: program '%s' only binds files whose general.architecture "
                               "its map lists, "
                               "not '%s'",
                               c->sm->program, c->sm->arch);
        } else if (!null_ok && first && !gguf_w_has_kv(c->w, key)) {
            if (json_is_string(first))
                st = gguf_w_set_str(c->w, key, json_string_value(first), err);
            else if (json_is_boolean(first))
                st = gguf_w_set_bool(c->w, key, json_is_true(first), err);
            else if (json_is_integer(first) && json_integer_value(first) >= 0 &&
                     json_integer_value(first) <= 0xffffffff)
                st = gguf_w_set_u32(c->w, key, (uint32_t)json_integer_value(first), err);
            else if (json_is_number(first))
                st = gguf_w_set_f32(c->w, key, (float)json_number_value(first), err);
        }
        if (st) return st;
    }
    return LLMOPT_OK;
}

static enum llmopt_status write_metadata(struct synth_ctx *c, const char *vocab_path,
                                         struct llmopt_err *err) {
    struct gguf_w *w = c->w;
    char name[256];
    snprintf(name, sizeof name, "%s (llmopt synth: random weights, seed %llu)", c->sm->like,
             (unsigned long long)c->opts->seed);
    enum llmopt_status st = gguf_w_set_str(w, "general.architecture", c->sm->arch, err);
    if (!st) st = gguf_w_set_str(w, "general.name", name, err);
    if (!st) st = gguf_w_set_u32(w, "general.file_type", c->plan.file_type, err);
    if (!st && c->plan.base != GGML_TYPE_F32 && c->plan.base != GGML_TYPE_F16 &&
        c->plan.base != GGML_TYPE_BF16)
        st = gguf_w_set_u32(w, "general.quantization_version", SYNTH_QUANT_VERSION, err);
    /* every map rule with a metadata key */
    const json_t *hmap = json_object_get(json_object_get(c->map, "gguf"), "hparams");
    const char *hname;
    json_t *spec;
    json_object_foreach((json_t *)hmap, hname, spec) {
        const char *tmpl = json_string_value(json_object_get(spec, "key"));
        double v;
        if (st || !tmpl || !ir_hparams_get(&c->hp, hname, &v)) continue;
        char key[SYNTH_NAME_MAX];
        if (!spell_key(tmpl, c->sm->arch, key, sizeof key))
            return err_set(err, LLMOPT_ERR_FORMAT, "synth: map key '%s' too long", tmpl);
        st = set_hparam_key(c, key, hname, v, err);
    }
    for (size_t i = 0; i < LLMOPT_ARRAY_LEN(companion_keys) && !st; i++) {
        char key[SYNTH_NAME_MAX];
        double v;
        if (!ir_hparams_get(&c->hp, companion_keys[i].hparam, &v) ||
            !spell_key(companion_keys[i].key, c->sm->arch, key, sizeof key) ||
            gguf_w_has_kv(w, key))
            continue;
        st = set_hparam_key(c, key, companion_keys[i].hparam, v, err);
    }
    if (!st) st = apply_match(c, err);
    if (st) return st;
    /* the tokenizer, as the vocabulary file has it */
    uint64_t n_copied = 0;
    for (uint64_t i = 0; i < c->vocab->n_kv; i++) {
        const struct gguf_kv *kv = &c->vocab->kv[i];
        if (kv->key.len < 10 || memcmp(kv->key.ptr, "tokenizer.", 10)) continue;
        st = gguf_w_copy_kv(w, kv, err);
        if (st) return st;
        n_copied++;
    }
    if (!n_copied)
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "synth: vocabulary file '%s' has no tokenizer.* metadata", vocab_path);
    return LLMOPT_OK;
}

static enum llmopt_status check_vocab(const struct synth_ctx *c, const char *vocab_path,
                                      struct llmopt_err *err) {
    const struct gguf_kv *tokens = gguf_find_kv(c->vocab, "tokenizer.ggml.tokens");
    double vocab = 0;
    if (!tokens || tokens->type != GGUF_TYPE_ARRAY)
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "synth: vocabulary file '%s' has no tokenizer.ggml.tokens array",
                       vocab_path);
    if (ir_hparams_get(&c->hp, "vocab", &vocab) && (double)tokens->array_len > vocab)
        return err_set(err, LLMOPT_ERR_INVALID_ARG,
                       "synth: vocabulary file '%s' has %llu tokens, more than the %.0f embedding "
                       "rows of '%s'",
                       vocab_path, (unsigned long long)tokens->array_len, vocab, c->sm->like);
    return LLMOPT_OK;
}

static void add_to_report(struct synth_report *rep, enum ggml_type type, const uint64_t *ne,
                          uint32_t n_dims) {
    uint64_t n = 1;
    for (uint32_t d = 0; d < n_dims; d++) n *= ne[d];
    rep->n_params += n;
    rep->n_tensors++;
    if ((unsigned)type < GGML_TYPE_COUNT) rep->type_counts[type]++;
}

enum llmopt_status synth_write(const struct synth_opts *opts, struct synth_report *report,
                               struct llmopt_err *err) {
    double t0 = clock_now_s();
    struct synth_report rep = {0};
    struct synth_ctx c = {.opts = opts};
    c.sm = find_model(opts->like);
    if (!c.sm) {
        char names[512] = "";
        for (size_t i = 0; i < LLMOPT_ARRAY_LEN(synth_models); i++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "",
                     synth_models[i].like);
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "synth: unknown --like '%s' (known: %s)",
                       opts->like, names);
    }
    if (!synth_qplan_parse(opts->type, &c.plan))
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "synth: unknown --type '%s' (known: %s)",
                       opts->type, synth_qplan_names());

    /* the stock program */
    struct llmopt_load_opts lo = {.programs_dir = opts->programs_dir};
    char dir_buf[PATH_MAX], path[PATH_MAX + 64];
    const char *programs = model_programs_dir(&lo, dir_buf, sizeof dir_buf);
    snprintf(path, sizeof path, "%s/%s/graph.json", programs, c.sm->program);
    if (access(path, R_OK) != 0)
        return err_set(
            err, LLMOPT_ERR_INVALID_ARG,
            "synth: --like %s needs the stock program '%s', but %s does not exist (the program "
            "has not been captured yet, or --programs points elsewhere)",
            c.sm->like, c.sm->program, path);
    enum llmopt_status st = load_json(path, true, &c.graph, err);
    if (!st) {
        snprintf(path, sizeof path, "%s/%s/map.json", programs, c.sm->program);
        st = load_json(path, false, &c.map, err);
    }
    const json_t *hmap = json_object_get(json_object_get(c.map, "gguf"), "hparams");
    if (!st && !json_is_object(json_object_get(json_object_get(c.map, "gguf"), "params")))
        st = err_set(err, LLMOPT_ERR_FORMAT, "synth: %s has no gguf params section", path);
    if (!st) st = resolve_hparams(c.sm, opts->n_layers, c.graph, hmap, &c.hp, err);
    if (!st) {
        c.n_layers = graph_layers(c.graph, &c.hp);
        if (!c.n_layers)
            st = err_set(err, LLMOPT_ERR_FORMAT,
                         "synth: program '%s' has no repeat with a valid layer count",
                         c.sm->program);
    }

    /* the vocabulary */
    char vocab_buf[PATH_MAX + 64];
    const char *vocab_path = opts->vocab_path;
    if (!vocab_path) {
        const char *dir = getenv("LLMOPT_TOKENIZERS");
        snprintf(vocab_buf, sizeof vocab_buf, "%s/%s",
                 dir && *dir ? dir : LLMOPT_SOURCE_DIR "/../shared/tokenizers", c.sm->vocab_file);
        vocab_path = vocab_buf;
    }
    if (!st) {
        st = gguf_open(vocab_path, &c.vocab, err);
        if (st) err_prefix(err, "synth: vocabulary");
    }
    if (!st) st = check_vocab(&c, vocab_path, err);

    if (!st) st = collect_tensors(&c, err);
    if (!st) st = gguf_w_create(&c.w, err);
    if (!st) st = write_metadata(&c, vocab_path, err);
    bool has_output = has_tensor(&c, "output.weight");
    for (uint32_t i = 0; i < c.n_tensors && !st; i++) {
        struct synth_tensor *t = &c.tensors[i];
        t->type = synth_tensor_type(&c.plan, t->name, t->n_dims, t->ne, GGML_TYPE_F32, c.n_layers,
                                    has_output);
        st = gguf_w_add_tensor(c.w, t->name, t->type, t->n_dims, t->ne, NULL, err);
        if (!st) add_to_report(&rep, t->type, t->ne, t->n_dims);
    }
    if (!st) st = gguf_w_begin(c.w, opts->out_path, err);
    int threads = default_threads(opts->threads);
    for (uint32_t i = 0; i < c.n_tensors && !st; i++) {
        const struct synth_tensor *t = &c.tensors[i];
        int64_t row_len = (int64_t)t->ne[0];
        int64_t n_rows = (int64_t)(t->ne[1] * t->ne[2] * t->ne[3]);
        st = emit_rows(c.w, fill_synth_row, t, n_rows, row_len, t->type, threads, err);
        if (st) err_prefix(err, "tensor '%s'", t->name);
    }
    if (!st) {
        rep.file_bytes = gguf_w_file_bytes(c.w);
        st = gguf_w_finish(c.w, err);
    }
    gguf_w_free(c.w);
    gguf_close(c.vocab);
    json_decref(c.graph);
    json_decref(c.map);
    free(c.tensors);
    rep.seconds = clock_now_s() - t0;
    if (report) *report = rep;
    return st;
}

/* ---- quantize ---- */

struct decode_ctx {
    const uint8_t *data;
    size_t row_bytes;
    enum ggml_type type;
    int64_t row_len;
};

static void fill_decoded_row(const void *ctx, int64_t row, float *out) {
    const struct decode_ctx *d = ctx;
    gguf_w_decode_row(d->type, d->data + (size_t)row * d->row_bytes, out, d->row_len);
}

enum llmopt_status synth_quantize(const struct synth_quantize_opts *opts,
                                  struct synth_report *report, struct llmopt_err *err) {
    double t0 = clock_now_s();
    struct synth_report rep = {0};
    struct synth_qplan plan;
    if (!synth_qplan_parse(opts->type, &plan))
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "quantize: unknown type '%s' (known: %s)",
                       opts->type, synth_qplan_names());
    struct gguf_file *in = NULL;
    struct gguf_w *w = NULL;
    enum ggml_type *types = NULL;
    enum llmopt_status st = gguf_open(opts->in_path, &in, err);
    if (!st) st = gguf_w_create(&w, err);
    if (!st && !(types = malloc((in->n_tensors ? in->n_tensors : 1) * sizeof *types)))
        st = err_set(err, LLMOPT_ERR_NOMEM, "quantize: out of memory");
    /* metadata: all of it, in order; the file type updated in place */
    for (uint64_t i = 0; !st && i < in->n_kv; i++) st = gguf_w_copy_kv(w, &in->kv[i], err);
    if (!st && in->alignment != GGUF_W_DEFAULT_ALIGNMENT)
        st = gguf_w_set_alignment(w, in->alignment, err);
    if (!st) st = gguf_w_set_u32(w, "general.file_type", plan.file_type, err);
    if (!st && plan.base != GGML_TYPE_F32 && plan.base != GGML_TYPE_F16 &&
        plan.base != GGML_TYPE_BF16 && !gguf_w_has_kv(w, "general.quantization_version"))
        st = gguf_w_set_u32(w, "general.quantization_version", SYNTH_QUANT_VERSION, err);

    int n_layers = 0;
    bool has_output = false;
    for (uint64_t i = 0; !st && i < in->n_tensors; i++) {
        char name[SYNTH_NAME_MAX];
        snprintf(name, sizeof name, "%.*s", (int)in->tensors[i].name.len, in->tensors[i].name.ptr);
        int layer = layer_of(name);
        if (layer >= n_layers) n_layers = layer + 1;
        has_output |= !strcmp(name, "output.weight");
    }
    for (uint64_t i = 0; !st && i < in->n_tensors; i++) {
        const struct gguf_tensor *t = &in->tensors[i];
        char name[SYNTH_NAME_MAX];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        types[i] = synth_tensor_type(&plan, name, t->n_dims, t->ne, t->type, n_layers, has_output);
        st = gguf_w_add_tensor(w, name, types[i], t->n_dims, t->ne, NULL, err);
        if (!st) add_to_report(&rep, types[i], t->ne, t->n_dims);
    }
    if (!st) st = gguf_w_begin(w, opts->out_path, err);
    int threads = default_threads(opts->threads);
    for (uint64_t i = 0; !st && i < in->n_tensors; i++) {
        const struct gguf_tensor *t = &in->tensors[i];
        if (types[i] == t->type) {
            st = gguf_w_write(w, t->data, (size_t)t->n_bytes, err);
        } else {
            struct decode_ctx d = {.data = t->data, .type = t->type, .row_len = (int64_t)t->ne[0]};
            d.row_bytes = gguf_w_row_bytes(t->type, d.row_len);
            st = emit_rows(w, fill_decoded_row, &d, (int64_t)(t->ne[1] * t->ne[2] * t->ne[3]),
                           d.row_len, types[i], threads, err);
        }
        if (st) err_prefix(err, "quantize: tensor '%.*s'", (int)t->name.len, t->name.ptr);
    }
    if (!st) {
        rep.file_bytes = gguf_w_file_bytes(w);
        st = gguf_w_finish(w, err);
    }
    gguf_w_free(w);
    gguf_close(in);
    free(types);
    rep.seconds = clock_now_s() - t0;
    if (report) *report = rep;
    return st;
}
