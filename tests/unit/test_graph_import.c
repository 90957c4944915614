/* Graph file import: a small graph with a `repeat`, and malformed variants that must
 * each fail with a message naming what is wrong; a hybrid graph whose layers run one of
 * two bodies chosen by a per-layer hparam (with the short_conv state op). Also the
 * prune-rows pass on the small graph, whose layers are all row-wise. */
#include "format/graph_file.h"
#include "ir/import.h"
#include "passes/passes.h"
#include "test.h"

static const char *graph_text =
    "{\"format\": \"llmopt-graph\", \"version\": 1, \"name\": \"toy\","
    " \"hparams\": [\"vocab\", \"d_model\", \"n_layers\"],"
    " \"inputs\": [{\"name\": \"tokens\", \"dtype\": \"i32\", \"shape\": [\"N\"]},"
    "            {\"name\": \"positions\", \"dtype\": \"i32\", \"shape\": [\"N\"]},"
    "            {\"name\": \"seq_slots\", \"dtype\": \"i32\", \"shape\": [\"N\"]},"
    "            {\"name\": \"out_rows\", \"dtype\": \"i32\", \"shape\": [\"M\"]}],"
    " \"params\": [{\"name\": \"emb\", \"dtype\": \"f32\", \"shape\": [\"vocab\", \"d_model\"]},"
    "            {\"name\": \"layers.{i}.w\", \"dtype\": \"f32\", \"shape\": [\"d_model\", \"d_model\"]},"
    "            {\"name\": \"head\", \"dtype\": \"f32\", \"shape\": [\"vocab\", \"d_model\"]}],"
    " \"nodes\": ["
    "  {\"id\": \"x\", \"op\": \"embedding\", \"in\": [\"emb\", \"tokens\"], \"shape\": [\"N\", \"d_model\"]},"
    "  {\"op\": \"repeat\", \"count\": \"n_layers\", \"index\": \"i\", \"carry\": {\"h\": \"x\"},"
    "   \"body\": ["
    "     {\"id\": \"y\", \"op\": \"linear\", \"in\": [\"h\", \"layers.{i}.w\"], \"shape\": [\"N\", \"d_model\"]},"
    "     {\"id\": \"z\", \"op\": \"add\", \"in\": [\"h\", \"y\"], \"shape\": [\"N\", \"d_model\"]}],"
    "   \"yield\": {\"h\": \"z\"}, \"out\": {\"h\": \"hN\"}},"
    "  {\"id\": \"sel\", \"op\": \"select_rows\", \"in\": [\"hN\", \"out_rows\"], \"shape\": [\"M\", \"d_model\"]},"
    "  {\"id\": \"logits\", \"op\": \"linear\", \"in\": [\"sel\", \"head\"], \"shape\": [\"M\", \"vocab\"]}],"
    " \"outputs\": [{\"name\": \"logits\", \"value\": \"logits\"}]}";

static float weights[3][64];
static int n_bound;

static enum llmopt_status toy_bind(void *ctx, const char *tmpl, int layer, const struct ir_shape *shape,
                                   struct ir_weight *out, struct llmopt_err *err) {
    (void)ctx;
    int64_t numel = 1;
    for (int d = 0; d < shape->rank; d++) numel *= shape->dims[d].coef;
    if (shape->rank < 2 || numel > 64)
        return err_set(err, LLMOPT_ERR_BIND, "toy: unexpected shape for %s", tmpl);
    *out = (struct ir_weight){weights[layer < 0 ? 2 : layer], IR_DTYPE_F32, 256, tmpl, NULL};
    n_bound++;
    return LLMOPT_OK;
}

/* Parses and checks a graph.json text, then imports it with hp and toy_bind. */
static enum llmopt_status import_with(const char *text, const struct ir_hparams *hp, struct ir_graph *g,
                                      struct llmopt_err *err) {
    json_t *root = NULL;
    enum llmopt_status st = graph_file_parse(text, strlen(text), &root, err);
    if (st) return st;
    st = graph_file_check(root, err);
    if (!st) st = ir_import(root, hp, toy_bind, NULL, g, err);
    json_decref(root);
    return st;
}

static enum llmopt_status import_text(const char *text, struct ir_graph *g, struct llmopt_err *err) {
    struct ir_hparams hp = {.n = 3, .names = {"vocab", "d_model", "n_layers"}, .values = {8, 4, 3}};
    return import_with(text, &hp, g, err);
}

static void test_import_unrolls_layers(void) {
    struct ir_graph g;
    struct llmopt_err err = {0};
    n_bound = 0;
    CHECK_MSG(import_text(graph_text, &g, &err) == LLMOPT_OK, "%s", err.msg);
    if (err.status) return;
    /* 4 inputs + emb + x + 3 layers x (w, y, z) + sel + head + logits */
    CHECK_EQ_INT(g.n_nodes, 4 + 2 + 9 + 3);
    CHECK_EQ_INT(n_bound, 5);
    int linears = 0;
    for (int32_t i = 0; i < g.n_nodes; i++) linears += g.nodes[i].op == IR_OP_LINEAR;
    CHECK_EQ_INT(linears, 4);
    char buf[64];
    CHECK(!strcmp(ir_shape_str(&g.nodes[g.output].shape, buf, sizeof buf), "[M, 8]"));
    CHECK(!strcmp(g.nodes[g.n_nodes - 4].name, "z@2"));
    ir_graph_free(&g);
}

/* Replaces the first occurrence of `from` with `to` and expects an error mentioning `needle`. */
static void expect_failure(const char *from, const char *to, const char *needle) {
    const char *at = strstr(graph_text, from);
    CHECK_MSG(at != NULL, "pattern %s", from);
    if (!at) return;
    size_t n = strlen(graph_text) + strlen(to) + 1;
    char *text = malloc(n);
    size_t pre = (size_t)(at - graph_text);
    memcpy(text, graph_text, pre);
    strcpy(text + pre, to);
    strcat(text, at + strlen(from));
    struct ir_graph g;
    struct llmopt_err err = {0};
    enum llmopt_status st = import_text(text, &g, &err);
    CHECK_MSG(st != LLMOPT_OK, "'%s' -> '%s' was accepted", from, to);
    if (st == LLMOPT_OK) ir_graph_free(&g);
    else CHECK_MSG(strstr(err.msg, needle) != NULL, "message '%s' lacks '%s'", err.msg, needle);
    free(text);
}

static void test_malformed_graphs(void) {
    expect_failure("\"version\": 1", "\"version\": 2", "version 2");
    expect_failure("\"format\": \"llmopt-graph\"", "\"format\": \"other\"", "format");
    expect_failure("\"op\": \"add\"", "\"op\": \"frobnicate\"", "frobnicate");
    expect_failure("[\"h\", \"y\"]", "[\"h\", \"nope\"]", "nope");
    expect_failure("\"shape\": [\"M\", \"vocab\"]", "\"shape\": [\"M\", \"d_model\"]", "inferred shape");
    expect_failure("\"name\": \"tokens\"", "\"name\": \"ids\"", "tokens");
    expect_failure("\"count\": \"n_layers\"", "\"count\": \"n_layers_x\"", "n_layers_x");
    expect_failure("\"count\": \"n_layers\"", "\"count\": -1", "count");
    expect_failure("\"shape\": [\"d_model\", \"d_model\"]", "\"shape\": [\"N\", \"d_model\"]", "N or M");
    expect_failure("\"value\": \"logits\"", "\"value\": \"missing\"", "missing");
    expect_failure("\"id\": \"sel\"", "\"id\": \"x\"", "defined twice");
    expect_failure("\"yield\": {\"h\": \"z\"}", "\"yield\": {}", "yield");
    expect_failure("{\"format\"", "[{\"format\"", "");
}

static const char *hybrid_text =
    "{\"format\": \"llmopt-graph\", \"version\": 1, \"name\": \"hybrid\","
    " \"hparams\": [\"vocab\", \"d_model\", \"n_layers\", \"conv_L\"], \"layer_hparams\": [\"kind\"],"
    " \"inputs\": [{\"name\": \"tokens\", \"dtype\": \"i32\", \"shape\": [\"N\"]},"
    "            {\"name\": \"positions\", \"dtype\": \"i32\", \"shape\": [\"N\"]},"
    "            {\"name\": \"seq_slots\", \"dtype\": \"i32\", \"shape\": [\"N\"]},"
    "            {\"name\": \"out_rows\", \"dtype\": \"i32\", \"shape\": [\"M\"]}],"
    " \"params\": [{\"name\": \"emb\", \"dtype\": \"f32\", \"shape\": [\"vocab\", \"d_model\"]},"
    "            {\"name\": \"layers.{i}.w\", \"dtype\": \"f32\", \"shape\": [\"d_model\", \"d_model\"]},"
    "            {\"name\": \"layers.{i}.k\", \"dtype\": \"f32\", \"shape\": [\"d_model\", \"1\", \"conv_L\"]},"
    "            {\"name\": \"head\", \"dtype\": \"f32\", \"shape\": [\"vocab\", \"d_model\"]}],"
    " \"nodes\": ["
    "  {\"id\": \"x\", \"op\": \"embedding\", \"in\": [\"emb\", \"tokens\"], \"shape\": [\"N\", \"d_model\"]},"
    "  {\"op\": \"repeat\", \"count\": \"n_layers\", \"index\": \"i\", \"kind\": \"kind\", \"carry\": {\"h\": \"x\"},"
    "   \"bodies\": {"
    "    \"0\": {\"name\": \"conv\", \"body\": ["
    "     {\"id\": \"c\", \"op\": \"short_conv\", \"in\": [\"h\", \"layers.{i}.k\", \"positions\", \"seq_slots\"],"
    "      \"shape\": [\"N\", \"d_model\"]},"
    "     {\"id\": \"z0\", \"op\": \"add\", \"in\": [\"h\", \"c\"], \"shape\": [\"N\", \"d_model\"]}],"
    "     \"yield\": {\"h\": \"z0\"}},"
    "    \"1\": {\"name\": \"mix\", \"body\": ["
    "     {\"id\": \"y\", \"op\": \"linear\", \"in\": [\"h\", \"layers.{i}.w\"], \"shape\": [\"N\", \"d_model\"]},"
    "     {\"id\": \"z1\", \"op\": \"add\", \"in\": [\"h\", \"y\"], \"shape\": [\"N\", \"d_model\"]}],"
    "     \"yield\": {\"h\": \"z1\"}}},"
    "   \"out\": {\"h\": \"hN\"}},"
    "  {\"id\": \"sel\", \"op\": \"select_rows\", \"in\": [\"hN\", \"out_rows\"], \"shape\": [\"M\", \"d_model\"]},"
    "  {\"id\": \"logits\", \"op\": \"linear\", \"in\": [\"sel\", \"head\"], \"shape\": [\"M\", \"vocab\"]}],"
    " \"outputs\": [{\"name\": \"logits\", \"value\": \"logits\"}]}";

static const double hybrid_kinds[3] = {0, 1, 0};

static enum llmopt_status import_hybrid(const char *text, int32_t n_kinds, struct ir_graph *g,
                                        struct llmopt_err *err) {
    struct ir_hparams hp = {.n = 4, .names = {"vocab", "d_model", "n_layers", "conv_L"},
                            .values = {8, 4, 3, 3}, .n_layer = 1, .layer_names = {"kind"},
                            .layer_values = {hybrid_kinds}, .layer_count = {n_kinds}};
    return import_with(text, &hp, g, err);
}

static void test_import_layer_kinds(void) {
    struct ir_graph g;
    struct llmopt_err err = {0};
    n_bound = 0;
    CHECK_MSG(import_hybrid(hybrid_text, 3, &g, &err) == LLMOPT_OK, "%s", err.msg);
    if (err.status) return;
    /* emb, k@0, k@2 (conv layers), w@1 (the other kind), head: nothing else binds */
    CHECK_EQ_INT(n_bound, 5);
    CHECK_EQ_INT(g.n_conv_layers, 2);
    CHECK_EQ_INT(ir_count_conv_layers(&g), 2);
    CHECK_EQ_INT(g.n_kv_layers, 0);
    int convs = 0, linears = 0;
    for (int32_t i = 0; i < g.n_nodes; i++) {
        const struct ir_node *n = &g.nodes[i];
        if (n->op == IR_OP_SHORT_CONV) {
            CHECK_EQ_INT(n->attrs.kv_layer, convs);
            CHECK(!strcmp(n->name, convs ? "c@2" : "c@0"));
            char buf[64];
            CHECK(!strcmp(ir_shape_str(&n->shape, buf, sizeof buf), "[N, 4]"));
            convs++;
        }
        if (n->op == IR_OP_LINEAR) linears++;
        if (n->op == IR_OP_PARAM) CHECK(strcmp(n->name, "layers.0.w") && strcmp(n->name, "layers.1.k"));
    }
    CHECK_EQ_INT(convs, 2);
    CHECK_EQ_INT(linears, 2); /* layer 1 and the head */
    ir_graph_free(&g);
}

static void expect_hybrid_failure(const char *from, const char *to, int32_t n_kinds, const char *needle) {
    const char *at = strstr(hybrid_text, from);
    CHECK_MSG(at != NULL, "pattern %s", from);
    if (!at) return;
    char *text = malloc(strlen(hybrid_text) + strlen(to) + 1);
    size_t pre = (size_t)(at - hybrid_text);
    memcpy(text, hybrid_text, pre);
    strcpy(text + pre, to);
    strcat(text, at + strlen(from));
    struct ir_graph g;
    struct llmopt_err err = {0};
    enum llmopt_status st = import_hybrid(text, n_kinds, &g, &err);
    CHECK_MSG(st != LLMOPT_OK, "'%s' -> '%s' was accepted", from, to);
    if (st == LLMOPT_OK) ir_graph_free(&g);
    else CHECK_MSG(strstr(err.msg, needle) != NULL, "message '%s' lacks '%s'", err.msg, needle);
    free(text);
}

static void test_malformed_hybrid_graphs(void) {
    expect_hybrid_failure("\"1\": {\"name\": \"mix\"", "\"7\": {\"name\": \"mix\"", 3, "no body");
    expect_hybrid_failure("\"kind\": \"kind\"", "\"kind\": \"kindx\"", 3, "kindx");
    expect_hybrid_failure("\"yield\": {\"h\": \"z1\"}", "\"yield\": {}", 3, "yields no 'h'");
    expect_hybrid_failure("\"kind\": \"kind\", ", "", 3, "either 'body'");
    expect_hybrid_failure("\"d_model\", \"1\", \"conv_L\"", "\"vocab\", \"1\", \"conv_L\"", 3, "w [C, L]");
    expect_hybrid_failure("\"positions\", \"seq_slots\"]", "\"positions\", \"h\"]", 3, "");
    expect_hybrid_failure("\"name\": \"hybrid\"", "\"name\": \"hybrid\"", 2, "2 values for 3 layers");
}

/* The small graph's layers (linear, add) compute each token row on its own, so
 * prune-rows moves the select from before the head to the embedding's output: one
 * select_rows, every layer on the M output rows, the graph still valid. */
static void test_prune_rows_toy(void) {
    struct ir_graph g;
    struct llmopt_err err = {0};
    CHECK_MSG(import_text(graph_text, &g, &err) == LLMOPT_OK, "%s", err.msg);
    if (err.status) return;
    ir_count_uses(&g);
    int32_t pruned = pass_prune_rows(&g, &err);
    CHECK_MSG(pruned == 6, "pruned %d nodes (want the 3 layers' linear and add): %s", pruned, err.msg);
    CHECK_MSG(ir_verify(&g, &err) == LLMOPT_OK, "%s", err.msg);
    int selects = 0;
    char buf[64];
    for (int32_t i = 0; i < g.n_nodes; i++) {
        const struct ir_node *n = &g.nodes[i];
        if (n->op == IR_OP_SELECT_ROWS) {
            selects++;
            CHECK(g.nodes[n->in[0]].op == IR_OP_EMBEDDING && n->in[1] == g.inputs[IR_INPUT_OUT_ROWS]);
        }
        if (n->op == IR_OP_LINEAR || n->op == IR_OP_ADD)
            CHECK_MSG(n->shape.dims[0].sym == IR_SYM_M, "node %d (%s) has shape %s", i, n->name ? n->name : "",
                      ir_shape_str(&n->shape, buf, sizeof buf));
    }
    CHECK_EQ_INT(selects, 1);
    CHECK_EQ_INT(pass_prune_rows(&g, &err), 0); /* a fixed point */
    ir_graph_free(&g);
}

TEST_MAIN(test_import_unrolls_layers, test_malformed_graphs, test_import_layer_kinds, test_malformed_hybrid_graphs,
          test_prune_rows_toy)
