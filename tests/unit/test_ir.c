/* IR core: expressions, shape inference, the verifier, the memory planner and the
 * KV cache, on small hand-built graphs. */
#include "backend/backend.h"
#include "ir/expr.h"
#include "ir/import.h"
#include "passes/memplan.h"
#include "test.h"

#include <math.h>

static bool lookup(void *ctx, const char *name, size_t len, double *v) {
    (void)ctx;
    static const struct {
        const char *name;
        double value;
    } table[] = {{"n_heads", 8}, {"head_dim", 16}, {"d_model", 128}, {"eps", 1e-5}};
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strlen(table[i].name) == len && !memcmp(table[i].name, name, len)) {
            *v = table[i].value;
            return true;
        }
    return false;
}

static void test_expr(void) {
    struct llmopt_err err = {0};
    struct expr_value v;
    CHECK(expr_eval("n_heads*head_dim", lookup, NULL, &v, &err) == LLMOPT_OK && v.coef == 128 && !v.n_pow);
    CHECK(expr_eval("head_dim/2", lookup, NULL, &v, &err) == LLMOPT_OK && v.coef == 8);
    CHECK(expr_eval("head_dim^-0.5", lookup, NULL, &v, &err) == LLMOPT_OK && fabs(v.coef - 0.25) < 1e-12);
    CHECK(expr_eval("3*N", lookup, NULL, &v, &err) == LLMOPT_OK && v.coef == 3 && v.n_pow == 1);
    CHECK(expr_eval("N*n_heads/n_heads", lookup, NULL, &v, &err) == LLMOPT_OK && v.coef == 1 && v.n_pow == 1);
    CHECK(expr_eval("M", lookup, NULL, &v, &err) == LLMOPT_OK && v.m_pow == 1);
    CHECK(expr_eval("-(2+3)*2 - 1", lookup, NULL, &v, &err) == LLMOPT_OK && v.coef == -11);
    CHECK(expr_eval("1e-5", lookup, NULL, &v, &err) == LLMOPT_OK && v.coef == 1e-5);
    CHECK(expr_eval("2^3^2", lookup, NULL, &v, &err) == LLMOPT_OK && v.coef == 512);
    /* errors name what is wrong */
    CHECK(expr_eval("n_layers", lookup, NULL, &v, &err) == LLMOPT_ERR_FORMAT && strstr(err.msg, "n_layers"));
    CHECK(expr_eval("N+1", lookup, NULL, &v, &err) == LLMOPT_ERR_FORMAT);
    CHECK(expr_eval("1/0", lookup, NULL, &v, &err) == LLMOPT_ERR_FORMAT && strstr(err.msg, "zero"));
    CHECK(expr_eval("(1", lookup, NULL, &v, &err) == LLMOPT_ERR_FORMAT);
    CHECK(expr_eval("1 2", lookup, NULL, &v, &err) == LLMOPT_ERR_FORMAT);
    CHECK(expr_eval("", lookup, NULL, &v, &err) == LLMOPT_ERR_FORMAT);
    CHECK(expr_eval("N^0.5", lookup, NULL, &v, &err) == LLMOPT_ERR_FORMAT);
    char deep[200];
    memset(deep, '(', sizeof deep - 1);
    deep[sizeof deep - 1] = 0;
    CHECK(expr_eval(deep, lookup, NULL, &v, &err) == LLMOPT_ERR_FORMAT); /* depth cap, no stack blowup */
    double d;
    CHECK(expr_eval_number("N", lookup, NULL, &d, &err) == LLMOPT_ERR_FORMAT);
}

/* Builds: x = embedding(table, tokens) [N, 4]; y = x * x; z = reshape(y, [N, 2, 2]);
 * w = add(z, const); out = select_rows(reshape(w,[N,4]), out_rows) -> linear -> [M, 3] */
static float table[5 * 4], head[3 * 4];

static enum llmopt_status build_small(struct ir_graph *g, struct llmopt_err *err) {
    enum llmopt_status st = ir_graph_init(g, err);
    if (st) return st;
    for (int k = 0; k < IR_INPUT_COUNT; k++) {
        int32_t i = ir_add_node(g, IR_OP_INPUT, NULL, 0, err);
        g->nodes[i].dtype = IR_DTYPE_I32;
        g->nodes[i].shape = (struct ir_shape){1, {{1, k == IR_INPUT_OUT_ROWS ? IR_SYM_M : IR_SYM_N}}};
        g->inputs[k] = i;
    }
    int32_t tab = ir_add_node(g, IR_OP_PARAM, NULL, 0, err);
    g->nodes[tab].shape = (struct ir_shape){2, {{5, 0}, {4, 0}}};
    g->nodes[tab].weight = (struct ir_weight){table, IR_DTYPE_F32, sizeof table, "table", NULL};
    int32_t hd = ir_add_node(g, IR_OP_PARAM, NULL, 0, err);
    g->nodes[hd].shape = (struct ir_shape){2, {{3, 0}, {4, 0}}};
    g->nodes[hd].weight = (struct ir_weight){head, IR_DTYPE_F32, sizeof head, "head", NULL};
    int32_t in[3];
    in[0] = tab;
    in[1] = g->inputs[IR_INPUT_TOKENS];
    int32_t x = ir_add_node(g, IR_OP_EMBEDDING, in, 2, err);
    if ((st = ir_infer_node(g, x, err))) return st;
    in[0] = in[1] = x;
    int32_t y = ir_add_node(g, IR_OP_MUL, in, 2, err);
    if ((st = ir_infer_node(g, y, err))) return st;
    in[0] = y;
    int32_t z = ir_add_node(g, IR_OP_RESHAPE, in, 1, err);
    g->nodes[z].attrs.target = (struct ir_shape){3, {{1, IR_SYM_N}, {2, 0}, {2, 0}}};
    if ((st = ir_infer_node(g, z, err))) return st;
    int32_t c = ir_add_node(g, IR_OP_CONST, NULL, 0, err);
    g->nodes[c].attrs.value = 0.5;
    if ((st = ir_infer_node(g, c, err))) return st;
    in[0] = z;
    in[1] = c;
    int32_t w = ir_add_node(g, IR_OP_ADD, in, 2, err);
    if ((st = ir_infer_node(g, w, err))) return st;
    in[0] = w;
    int32_t w2 = ir_add_node(g, IR_OP_RESHAPE, in, 1, err);
    g->nodes[w2].attrs.target = (struct ir_shape){2, {{1, IR_SYM_N}, {4, 0}}};
    if ((st = ir_infer_node(g, w2, err))) return st;
    in[0] = w2;
    in[1] = g->inputs[IR_INPUT_OUT_ROWS];
    int32_t sel = ir_add_node(g, IR_OP_SELECT_ROWS, in, 2, err);
    if ((st = ir_infer_node(g, sel, err))) return st;
    in[0] = sel;
    in[1] = hd;
    int32_t out = ir_add_node(g, IR_OP_LINEAR, in, 2, err);
    if ((st = ir_infer_node(g, out, err))) return st;
    g->output = out;
    ir_count_uses(g);
    return ir_verify(g, err);
}

static void test_shapes_and_verify(void) {
    struct ir_graph g;
    struct llmopt_err err = {0};
    CHECK_MSG(build_small(&g, &err) == LLMOPT_OK, "%s", err.msg);
    char buf[64];
    CHECK(!strcmp(ir_shape_str(&g.nodes[g.output].shape, buf, sizeof buf), "[M, 3]"));
    /* a reshape that changes the element count is rejected with both shapes named */
    int32_t in[1] = {g.output};
    int32_t bad = ir_add_node(&g, IR_OP_RESHAPE, in, 1, &err);
    g.nodes[bad].attrs.target = (struct ir_shape){2, {{1, IR_SYM_M}, {4, 0}}};
    CHECK(ir_infer_node(&g, bad, &err) == LLMOPT_ERR_FORMAT && strstr(err.msg, "[M, 3]") &&
          strstr(err.msg, "[M, 4]"));
    ir_graph_free(&g);
}

static void test_memplan(void) {
    struct ir_graph g;
    struct llmopt_err err = {0};
    CHECK(build_small(&g, &err) == LLMOPT_OK);
    struct mem_plan p;
    CHECK(mem_plan_build(&g, 64, 64, &p, &err) == LLMOPT_OK);
    CHECK(p.arena_bytes <= p.naive_bytes);
    /* Reshapes alias their input. */
    for (int32_t i = 0; i < g.n_nodes; i++)
        if (g.nodes[i].op == IR_OP_RESHAPE) CHECK(p.offset[i] == p.offset[g.nodes[i].in[0]]);
    /* Any two roots whose live ranges overlap must not overlap in memory. */
    for (int32_t i = 0; i < g.n_nodes; i++)
        for (int32_t j = i + 1; j < g.n_nodes; j++) {
            if (p.root[i] != i || p.root[j] != j || p.offset[i] < 0 || p.offset[j] < 0) continue;
            bool live_together = p.last_use[i] >= j;
            size_t si = mem_plan_node_bytes(&g.nodes[i], 64, 64), sj = mem_plan_node_bytes(&g.nodes[j], 64, 64);
            bool disjoint = p.offset[i] + (int64_t)si <= p.offset[j] || p.offset[j] + (int64_t)sj <= p.offset[i];
            if (live_together) CHECK_MSG(disjoint, "nodes %d and %d overlap", i, j);
        }
    mem_plan_free(&p);
    ir_graph_free(&g);
}

static void test_execute_small(void) {
    for (int i = 0; i < 20; i++) table[i] = (float)(i % 7) * 0.25f - 0.6f;
    for (int i = 0; i < 12; i++) head[i] = (float)(i % 5) * 0.3f - 0.5f;
    struct ir_graph g;
    struct llmopt_err err = {0};
    CHECK(build_small(&g, &err) == LLMOPT_OK);
    void *state = NULL;
    CHECK(cpu_backend_ops.prepare(&g, 8, 16, NULL, 0, &state, &err) == LLMOPT_OK);
    int32_t tokens[3] = {4, 0, 2}, pos[3] = {0, 1, 2}, slots[3] = {0, 0, 0}, rows[2] = {2, 0};
    struct exec_batch b = {3, tokens, pos, slots, 2, rows};
    const float *out = NULL;
    CHECK_MSG(cpu_backend_ops.run(state, &b, NULL, &out, &err) == LLMOPT_OK, "%s", err.msg);
    for (int r = 0; r < 2; r++)
        for (int o = 0; o < 3; o++) {
            double want = 0;
            for (int k = 0; k < 4; k++) {
                double x = table[tokens[rows[r]] * 4 + k];
                want += (x * x + 0.5) * head[o * 4 + k];
            }
            CHECK_MSG(fabs(out[r * 3 + o] - want) < 1e-5, "row %d col %d: %g vs %g", r, o, out[r * 3 + o], want);
        }
    /* a token id out of range is an error, not a crash */
    tokens[1] = 5;
    CHECK(cpu_backend_ops.run(state, &b, NULL, &out, &err) == LLMOPT_ERR_INVALID_ARG && strstr(err.msg, "token id 5"));
    cpu_backend_ops.release(state);
    ir_graph_free(&g);
}

static void test_kv_cache(void) {
    struct llmopt_err err = {0};
    struct kv_cache *kv = NULL;
    int32_t rows[2] = {8, 4};
    CHECK(kv_cache_create(2, rows, KV_DTYPE_F32, 3, 40, 6, 16, &kv, &err) == LLMOPT_OK);
    if (!kv) return;
    CHECK(kv_cache_reserve(kv, 0, 40, &err) == LLMOPT_OK); /* 3 blocks */
    CHECK(kv_cache_blocks_in_use(kv) == 3);
    CHECK(kv_cache_reserve(kv, 1, 33, &err) == LLMOPT_OK); /* 3 blocks */
    CHECK(kv_cache_reserve(kv, 2, 1, &err) == LLMOPT_ERR_LIMIT && strstr(err.msg, "free"));
    CHECK(kv_cache_reserve(kv, 0, 41, &err) == LLMOPT_ERR_LIMIT); /* beyond max_positions */
    CHECK(kv_cache_reserve(kv, 3, 1, &err) == LLMOPT_ERR_INVALID_ARG);
    /* rows of different slots and positions never alias */
    uint8_t *a = kv_cache_row(kv, kv->k, 1, 0, 39), *b = kv_cache_row(kv, kv->k, 1, 1, 0);
    CHECK(a != b);
    kv_cache_release(kv, 0);
    CHECK(kv_cache_blocks_in_use(kv) == 3);
    CHECK(kv_cache_reserve(kv, 2, 17, &err) == LLMOPT_OK);
    kv_cache_release(kv, 1);
    kv_cache_release(kv, 2);
    CHECK(kv_cache_blocks_in_use(kv) == 0);
    CHECK(kv_cache_bytes(kv) == 2 * 6 * 16 * (8 + 4) * 4);
    kv_cache_free(kv);
}

/* Each element type: rows hold what was written up to the type's rounding (f16: half
 * an ulp of f16; q8_0: half a quant step, amax / 254 of the block), in the stated
 * bytes; q8_0 refuses rows that are not whole blocks. */
static void test_kv_cache_types(void) {
    struct llmopt_err err = {0};
    struct kv_cache *kv = NULL;
    int32_t rows[2] = {64, 96};
    CHECK(kv_cache_create(2, (int32_t[]){64, 40}, KV_DTYPE_Q8_0, 1, 16, 1, 16, &kv, &err) == LLMOPT_ERR_INVALID_ARG &&
          strstr(err.msg, "multiple of 32"));
    for (int t = 0; t < KV_DTYPE_COUNT; t++) {
        kv = NULL;
        CHECK_MSG(kv_cache_create(2, rows, (enum kv_dtype)t, 2, 32, 4, 16, &kv, &err) == LLMOPT_OK, "%s", err.msg);
        if (!kv) return;
        static const int64_t bytes_per_32[] = {128, 64, 34};
        CHECK(kv->row_bytes[1] == 3 * bytes_per_32[t]);
        CHECK(kv_cache_bytes(kv) == 2 * 4 * 16 * (int64_t)(2 + 3) * bytes_per_32[t]);
        CHECK(kv_cache_reserve(kv, 1, 20, &err) == LLMOPT_OK);
        float src[96], back[96];
        for (int i = 0; i < 96; i++) src[i] = sinf(0.37f * (float)i) * (float)(1 + i % 7);
        kv_cache_write(kv, kv->v, 1, 1, 19, 0, src, 96);
        kv_cache_read(kv, kv->v, 1, 1, 19, 32, back, 64); /* a later head alone */
        for (int i = 0; i < 64; i++) {
            float amax = 0;
            for (int j = (32 + i) / 32 * 32; j < (32 + i) / 32 * 32 + 32; j++) amax = fmaxf(amax, fabsf(src[j]));
            double tol = t == KV_DTYPE_F32 ? 0 : t == KV_DTYPE_F16 ? fabsf(src[32 + i]) * 0x1p-11 : amax * (1.0 / 254.0 + 1.0 / 2048.0);
            CHECK_MSG(fabs(back[i] - src[32 + i]) <= tol, "%s: value %d is %g, wrote %g", kv_dtype_name((enum kv_dtype)t),
                      32 + i, back[i], src[32 + i]);
        }
        kv_cache_free(kv);
    }
}

TEST_MAIN(test_expr, test_shapes_and_verify, test_memplan, test_execute_small, test_kv_cache, test_kv_cache_types)
