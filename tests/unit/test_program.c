/* Model Programs: compile -> write -> load runs the same as the freshly compiled model,
 * and every kind of corruption `llmopt check` must catch is caught with the field
 * named, without crashing the loader. */
#include "format/graph_file.h"
#include "llmopt.h"
#include "test.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define MODEL "../shared/models/stories260K/stories260K-Q8_0.gguf"

static char dir[256], prog[300];

static int greedy(struct llmopt_model *m, int32_t *ids, int n) {
    struct llmopt_err err = {0};
    struct llmopt_session *s = NULL;
    struct llmopt_session_opts so = {.n_ctx = 128, .n_batch = 64};
    if (llmopt_session_create(m, &so, &s, &err)) return -1;
    int32_t tok = 1;
    const float *logits;
    int got = 0;
    for (; got < n; got++) {
        if (llmopt_session_append(s, 0, &tok, 1, &logits, &err)) break;
        int32_t best = 0;
        for (int32_t v = 1; v < llmopt_model_n_vocab(m); v++)
            if (logits[v] > logits[best]) best = v;
        ids[got] = tok = best;
    }
    llmopt_session_free(s);
    return got;
}

static void setup_program(void) {
    snprintf(dir, sizeof dir, "/tmp/llmopt_test_program_%d", (int)getpid());
    snprintf(prog, sizeof prog, "%s/model.llmopt", dir);
    mkdir(dir, 0755);
    struct llmopt_err err = {0};
    struct llmopt_model *m = NULL;
    CHECK_MSG(llmopt_model_load(MODEL, NULL, &m, &err) == LLMOPT_OK, "%s", err.msg);
    struct llmopt_program_opts po = {.n_batch = 64};
    CHECK_MSG(m && llmopt_program_write(m, MODEL, &po, prog, &err) == LLMOPT_OK, "%s", err.msg);
    llmopt_model_free(m);
}

static void test_roundtrip_runs_identically(void) {
    setup_program();
    struct llmopt_err err = {0};
    struct llmopt_model *direct = NULL, *loaded = NULL;
    CHECK(llmopt_model_load(MODEL, NULL, &direct, &err) == LLMOPT_OK);
    CHECK_MSG(llmopt_model_load(dir, NULL, &loaded, &err) == LLMOPT_OK, "%s", err.msg);
    CHECK_MSG(llmopt_program_check(prog, &err) == LLMOPT_OK, "%s", err.msg);
    if (!direct || !loaded) goto done;
    struct llmopt_compile_stats a, b;
    llmopt_model_compile_stats(direct, &a);
    llmopt_model_compile_stats(loaded, &b);
    CHECK_EQ_INT(a.kernels_compiled, b.kernels_compiled);
    int32_t x[40], y[40];
    CHECK_EQ_INT(greedy(direct, x, 40), 40);
    CHECK_EQ_INT(greedy(loaded, y, 40), 40);
    CHECK(!memcmp(x, y, sizeof x));
    /* the program records the KV type (f16 by default) and its sessions use it; a
     * session option still wins; q8_0 is refused at compile for head size 8 */
    struct llmopt_session *s = NULL;
    struct llmopt_session_opts so = {.n_ctx = 32};
    CHECK_MSG(llmopt_session_create(loaded, &so, &s, &err) == LLMOPT_OK, "%s", err.msg);
    CHECK(s && llmopt_session_kv_type(s) == LLMOPT_KV_F16);
    llmopt_session_free(s);
    so.kv_type = LLMOPT_KV_F32;
    s = NULL;
    CHECK_MSG(llmopt_session_create(loaded, &so, &s, &err) == LLMOPT_OK, "%s", err.msg);
    CHECK(s && llmopt_session_kv_type(s) == LLMOPT_KV_F32);
    llmopt_session_free(s);
    struct llmopt_program_opts po = {.n_batch = 64, .kv_type = LLMOPT_KV_Q8_0};
    char q8[400];
    snprintf(q8, sizeof q8, "%s/q8.llmopt", dir);
    CHECK(llmopt_program_write(direct, MODEL, &po, q8, &err) == LLMOPT_ERR_UNSUPPORTED && strstr(err.msg, "multiple of 32"));
done:
    llmopt_model_free(direct);
    llmopt_model_free(loaded);
}

/* Applies edit() to a copy of the program and expects load/check to fail naming `field`. */
static void expect_rejected(const char *what, void (*edit)(json_t *root), const char *field, bool run_too) {
    json_t *root = NULL;
    struct llmopt_err err = {0};
    CHECK(json_load_file_capped(prog, 1u << 28, &root, &err) == LLMOPT_OK);
    if (!root) return;
    edit(root);
    char bad[400];
    snprintf(bad, sizeof bad, "%s/bad.llmopt", dir);
    json_dump_file(root, bad, JSON_COMPACT);
    json_decref(root);
    enum llmopt_status st = llmopt_program_check(bad, &err);
    CHECK_MSG(st != LLMOPT_OK, "%s: check accepted it", what);
    CHECK_MSG(st == LLMOPT_OK || strstr(err.msg, field), "%s: message '%s' lacks '%s'", what, err.msg, field);
    if (run_too) {
        struct llmopt_model *m = NULL;
        CHECK_MSG(llmopt_model_load(bad, NULL, &m, &err) != LLMOPT_OK, "%s: the loader accepted it", what);
        llmopt_model_free(m);
    }
    unlink(bad);
}

static json_t *node(json_t *root, size_t i) {
    return json_array_get(json_object_get(json_array_get(json_object_get(root, "entrypoints"), 0), "nodes"), i);
}
static json_t *weights0(json_t *root) { return json_array_get(json_object_get(root, "weights"), 0); }

static void e_version(json_t *r) { json_object_set_new(r, "version", json_integer(99)); }
static void e_size(json_t *r) { json_object_set_new(weights0(r), "size", json_integer(12345)); }
static void e_checksum(json_t *r) { json_object_set_new(weights0(r), "checksum", json_string("0000000000000000")); }
static void e_path(json_t *r) { json_object_set_new(weights0(r), "path", json_string("/nonexistent/w.gguf")); }
static void e_operand(json_t *r) {
    json_t *n = node(r, 20);
    json_array_set_new(json_object_get(n, "in"), 0, json_integer(99999));
}
static void e_offset(json_t *r) { json_object_set_new(node(r, 20), "offset", json_integer((json_int_t)1 << 40)); }
static void e_overlap(json_t *r) {
    /* put a live buffer on top of the embedding output while it is still needed */
    json_t *emb = NULL;
    size_t i = 0;
    for (; (emb = node(r, i)); i++)
        if (!strcmp(json_string_value(json_object_get(emb, "op")), "embedding")) break;
    json_int_t off = json_integer_value(json_object_get(emb, "offset"));
    json_t *n = NULL;
    for (; (n = node(r, i)); i++)
        if (!strcmp(json_string_value(json_object_get(n, "op")), "rms_norm")) break; /* reads it */
    json_object_set_new(n, "offset", json_integer(off));
}
static void e_state(json_t *r) {
    json_t *l = json_array_get(json_object_get(json_object_get(r, "state_layout"), "layers"), 1);
    json_object_set_new(l, "kv_heads", json_integer(3));
}
static void e_kv_dtype(json_t *r) {
    json_object_set_new(json_object_get(r, "state_layout"), "kv_dtype", json_string("f8"));
}
static void e_kv_q8_0(json_t *r) { /* stories260K's heads of 8 are not whole q8_0 blocks */
    json_object_set_new(json_object_get(r, "state_layout"), "kv_dtype", json_string("q8_0"));
}
static void e_state_count(json_t *r) {
    json_array_remove(json_object_get(json_object_get(r, "state_layout"), "layers"), 0);
}
static void e_bos(json_t *r) { json_object_set_new(json_object_get(r, "generation"), "bos", json_integer(100000)); }
static void e_stop(json_t *r) {
    json_array_append_new(json_object_get(json_object_get(r, "generation"), "stop_ids"), json_integer(-5));
}
static void e_ntokens(json_t *r) { json_object_set_new(json_object_get(r, "tokenizer"), "n_tokens", json_integer(9999)); }
static void e_shape(json_t *r) {
    json_t *n = NULL;
    for (size_t i = 0; (n = node(r, i)); i++)
        if (!strcmp(json_string_value(json_object_get(n, "op")), "rms_norm")) break;
    json_array_set_new(json_object_get(n, "shape"), 2, json_string("65"));
}
static void e_op(json_t *r) { json_object_set_new(node(r, 20), "op", json_string("frobnicate")); }
static void e_tensor(json_t *r) {
    json_t *n = NULL;
    for (size_t i = 0; (n = node(r, i)); i++)
        if (json_object_get(n, "param")) break;
    json_object_set_new(json_object_get(n, "param"), "tensor", json_string("blk.99.attn_q.weight"));
}

static void test_corruptions_are_named(void) {
    expect_rejected("unknown version", e_version, "version", true);
    expect_rejected("weight file size", e_size, "weights[0].size", true);
    expect_rejected("weight checksum", e_checksum, "weights[0].checksum", false);
    expect_rejected("missing weight file", e_path, "/nonexistent/w.gguf", true);
    expect_rejected("operand to an unknown buffer", e_operand, "unknown buffer", true);
    expect_rejected("offset outside the arena", e_offset, "offset", true);
    expect_rejected("overlapping live buffers", e_overlap, "overlap", true);
    expect_rejected("state layout heads", e_state, "state_layout.layers[1]", true);
    expect_rejected("state layout count", e_state_count, "state_layout.layers", true);
    expect_rejected("unknown KV type", e_kv_dtype, "state_layout.kv_dtype", true);
    expect_rejected("q8_0 KV with heads of 8", e_kv_q8_0, "multiple of 32", true);
    expect_rejected("bos out of range", e_bos, "generation.bos", true);
    expect_rejected("stop id out of range", e_stop, "generation.stop_ids", true);
    expect_rejected("tokenizer size", e_ntokens, "tokenizer.n_tokens", true);
    expect_rejected("stored shape", e_shape, "stored shape", true);
    expect_rejected("unknown op", e_op, "frobnicate", true);
    expect_rejected("unknown tensor", e_tensor, "blk.99.attn_q.weight", true);
}

static void test_truncated_never_crashes(void) {
    FILE *f = fopen(prog, "rb");
    CHECK(f != NULL);
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *buf = malloc((size_t)n);
    CHECK(fread(buf, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    char bad[400];
    snprintf(bad, sizeof bad, "%s/trunc.llmopt", dir);
    for (long cut = 0; cut < n; cut += n / 97 + 1) {
        FILE *o = fopen(bad, "wb");
        fwrite(buf, 1, (size_t)cut, o);
        fclose(o);
        struct llmopt_err err = {0};
        CHECK_MSG(llmopt_program_check(bad, &err) != LLMOPT_OK, "truncated at %ld accepted", cut);
    }
    unlink(bad);
    free(buf);
    unlink(prog);
    rmdir(dir);
}

TEST_MAIN(test_roundtrip_runs_identically, test_corruptions_are_named, test_truncated_never_crashes)
