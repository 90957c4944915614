/* The CUDA backend against the CPU reference (issue 8). Built always; skips with a
 * message (and success) when the build has no CUDA or the machine has no device.
 *
 * 1. Every op: a small graph per op (inputs drawn from random embedding tables, never
 *    zeros), run on cpu_ref_backend_ops and cuda_backend_ops at several batch sizes;
 *    the outputs must agree within max|gpu - cpu| / max|cpu| <= 1e-5 for f32
 *    arithmetic (1e-2 where cuBLAS rounds operands to f16/bf16: prefill products). Linear runs every
 *    weight type through the matvec, tiled and cuBLAS paths; attention runs prefill,
 *    mixed two-sequence batches, decode, GQA, a sliding window and split contexts.
 * 2. stories260K (F32) greedy for 256 tokens equals expected_greedy.json, with and
 *    without CUDA graphs.
 * 3. The torch goldens (tests/golden/<case>/golden.json) within 1e-4 with an f32 KV
 *    cache (the CUDA default) and within 5e-3 with an f16 one, as test_golden.c checks
 *    the CPU.
 * Paths: $LLMOPT_STORIES_DIR (default ../shared/models/stories260K), tests/golden. */
#include "backend/backend.h"
#include "base/fp16.h"
#include "format/quant.h"
#include "format/quant_k.h"
#include "llmopt.h"
#include "runtime/sampler.h"
#include "runtime/sample_exp.h"
#include "golden_row.h"
#include "test.h"

#ifdef LLMOPT_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "format/graph_file.h"

#include <dirent.h>
#include <float.h>

#define TOL_F32 1e-5
#define TOL_HALF 1e-2
/* K-quant products with x rounded to int8 (the CUDA default, as the CPU backend's own
 * K-quant kernels round x to q8_K): each x to 8 bits per group of 32, so outputs that
 * cancel to near zero carry up to ~1.5e-2 of the largest output (seen over the random
 * cases below on the H200); a wrong scale or index is off by far more */
#define TOL_INT8 3e-2
/* iq4_xs weights, uploaded as q8_0 with each 32's scale d * (ls - 32) rounded to f16
 * (the CPU keeps it in f32): at most 2^-12 relative a block, ~2e-4 of the largest
 * output over these random cases; a wrong table index or bit is off by far more */
#define TOL_IQ4 2e-3

/* ---- random inputs ------------------------------------------------------------------- */

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static uint32_t rng_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

/* uniform in [-1, 1), never 0 */
static float rng_f(void) { return ((float)(rng_u32() & 0xffffff) + 0.5f) / 8388608.0f - 1.0f; }

/* ---- graph building ---------------------------------------------------------------- */

#define MAX_BUFS 64

struct gb {
    struct ir_graph g;
    struct llmopt_err err;
    bool ok;
    void *bufs[MAX_BUFS]; /* parameter storage */
    int n_bufs;
    int32_t vocab;        /* rows of every embedding table made by gb_source */
};

static void gb_init(struct gb *b) {
    memset(b, 0, sizeof *b);
    b->ok = ir_graph_init(&b->g, &b->err) == LLMOPT_OK;
    b->vocab = 50;
    for (int k = 0; k < IR_INPUT_COUNT && b->ok; k++) {
        int32_t i = ir_add_node(&b->g, IR_OP_INPUT, NULL, 0, &b->err);
        b->g.nodes[i].dtype = IR_DTYPE_I32;
        b->g.nodes[i].shape = (struct ir_shape){.rank = 1, .dims = {{1, k == IR_INPUT_OUT_ROWS ? IR_SYM_M : IR_SYM_N}}};
        b->g.nodes[i].name = ir_input_names[k];
        b->g.inputs[k] = i;
    }
}

static void gb_free(struct gb *b) {
    ir_graph_free(&b->g);
    for (int k = 0; k < b->n_bufs; k++) free(b->bufs[k]);
}

static int32_t gb_add(struct gb *b, enum ir_op op, const int32_t *in, int n_in) {
    if (!b->ok) return 0;
    int32_t i = ir_add_node(&b->g, op, in, n_in, &b->err);
    if (i == IR_NONE) {
        b->ok = false;
        return 0;
    }
    return i;
}

static int32_t gb_infer(struct gb *b, int32_t i) {
    if (b->ok && ir_infer_node(&b->g, i, &b->err) != LLMOPT_OK) b->ok = false;
    return i;
}

static int32_t gb_op1(struct gb *b, enum ir_op op, int32_t x) { return gb_infer(b, gb_add(b, op, &x, 1)); }
static int32_t gb_op2(struct gb *b, enum ir_op op, int32_t x, int32_t y) {
    int32_t in[2] = {x, y};
    return gb_infer(b, gb_add(b, op, in, 2));
}

/* A parameter [rows, cols] (rows 0: 1-D [cols]) of type t with random values. */
static int32_t gb_param(struct gb *b, enum ir_dtype t, int64_t rows, int64_t cols, float scale) {
    if (!b->ok || b->n_bufs == MAX_BUFS) {
        b->ok = false;
        return 0;
    }
    int64_t r = rows ? rows : 1;
    size_t row_bytes = ir_dtype_row_bytes(t, cols);
    uint8_t *w = malloc(row_bytes * (size_t)r);
    float *tmp = malloc((size_t)cols * sizeof(float));
    for (int64_t j = 0; j < r; j++) {
        for (int64_t i = 0; i < cols; i++) tmp[i] = rng_f() * scale;
        uint8_t *dst = w + row_bytes * (size_t)j;
        switch (t) {
        case IR_DTYPE_F16:
            for (int64_t i = 0; i < cols; i++) {
                uint16_t h = fp16_from_f32(tmp[i]);
                memcpy(dst + 2 * i, &h, 2);
            }
            break;
        case IR_DTYPE_BF16:
            for (int64_t i = 0; i < cols; i++) {
                uint16_t h = bf16_from_f32(tmp[i]);
                memcpy(dst + 2 * i, &h, 2);
            }
            break;
        case IR_DTYPE_Q8_0: quant_quantize_row_q8_0(tmp, dst, cols); break;
        case IR_DTYPE_Q4_0: quant_quantize_row_q4_0(tmp, dst, cols); break;
        case IR_DTYPE_Q5_0:
            quant_quantize_row_q5_0(tmp, dst, cols);
            break;
        case IR_DTYPE_IQ4_XS:
            quant_k_quantize_row_iq4_xs(tmp, dst, cols);
            break;
        case IR_DTYPE_Q4_K: quant_k_quantize_row_q4_K(tmp, dst, cols); break;
        case IR_DTYPE_Q5_K: quant_k_quantize_row_q5_K(tmp, dst, cols); break;
        case IR_DTYPE_Q6_K: quant_k_quantize_row_q6_K(tmp, dst, cols); break;
        default: memcpy(dst, tmp, (size_t)cols * 4); break;
        }
    }
    free(tmp);
    b->bufs[b->n_bufs++] = w;
    int32_t i = gb_add(b, IR_OP_PARAM, NULL, 0);
    if (!b->ok) return 0;
    struct ir_node *n = &b->g.nodes[i];
    n->dtype = t;
    n->shape = rows ? (struct ir_shape){.rank = 2, .dims = {{rows, IR_SYM_NONE}, {cols, IR_SYM_NONE}}}
                    : (struct ir_shape){.rank = 1, .dims = {{cols, IR_SYM_NONE}}};
    n->weight = (struct ir_weight){.data = w, .dtype = t, .n_bytes = row_bytes * (size_t)r, .source = "random"};
    n->name = "param";
    return i;
}

/* Random activations [N, d]: an f32 embedding of the batch's tokens. */
static int32_t gb_source(struct gb *b, int64_t d, float scale) {
    int32_t tab = gb_param(b, IR_DTYPE_F32, b->vocab, d, scale);
    return gb_op2(b, IR_OP_EMBEDDING, tab, b->g.inputs[IR_INPUT_TOKENS]);
}

static int32_t gb_reshape(struct gb *b, int32_t x, struct ir_shape target) {
    int32_t i = gb_add(b, IR_OP_RESHAPE, &x, 1);
    if (b->ok) b->g.nodes[i].attrs.target = target;
    return gb_infer(b, i);
}

/* permute of x by axes (n of them: the output's axis i is x's axis axes[i]) */
static int32_t gb_permute(struct gb *b, int32_t x, int n, const int *axes) {
    int32_t i = gb_add(b, IR_OP_PERMUTE, &x, 1);
    if (b->ok) {
        b->g.nodes[i].attrs.n_axes = n;
        for (int k = 0; k < n; k++) b->g.nodes[i].attrs.axes[k] = axes[k];
    }
    return gb_infer(b, i);
}

#define SHAPE(...) ((struct ir_shape){.rank = (int)(sizeof((struct ir_dim[]){__VA_ARGS__}) / sizeof(struct ir_dim)), .dims = {__VA_ARGS__}})
#define DN(c) ((struct ir_dim){(c), IR_SYM_N})
#define DC(c) ((struct ir_dim){(c), IR_SYM_NONE})

/* ---- running both backends --------------------------------------------------------- */

struct batch_spec {
    int32_t n, m;
    int32_t slots;     /* sequences the batch's tokens are spread over (attention) */
};

static double rel_err(const float *got, const float *want, int64_t n, bool *nan) {
    double max_ref = 0, max_diff = 0;
    *nan = false;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(got[i]) != isnan(want[i])) *nan = true;
        double r = fabs((double)want[i]);
        max_ref = r > max_ref ? r : max_ref;
        double d = fabs((double)got[i] - (double)want[i]);
        max_diff = d > max_diff ? d : max_diff;
    }
    return max_ref > 0 ? max_diff / max_ref : max_diff;
}

struct kv_pair {
    struct kv_cache *cpu, *gpu;
};

static uint64_t last_kernels_run; /* kernels the CUDA backend counted in the last compare_graph */
static enum kv_dtype test_kv = KV_DTYPE_F32; /* the KV caches' element type (both backends) */
/* What compare_graph checks against: the f32 reference, or the CPU's default backend
 * (its q8_0 kernels quantize activations as the CUDA int8 x mode does) */
static const struct backend_ops *ref_backend = &cpu_ref_backend_ops;

/* Runs g on both backends over a sequence of batches (each continues the sequences of
 * the previous ones when kv is used) and compares every output. */
static void compare_graph(const char *what, struct gb *b, int32_t output, const struct batch_spec *steps,
                          int n_steps, int64_t max_ctx, double tol) {
    CHECK_MSG(b->ok, "%s: building: %s", what, b->err.msg);
    if (!b->ok) return;
    b->g.output = output; /* any node: ir_verify would insist on logits [.., M, vocab] */
    ir_count_uses(&b->g);
    struct llmopt_err err = {0};
    int32_t n_max = 1;
    for (int k = 0; k < n_steps; k++) n_max = steps[k].n > n_max ? steps[k].n : n_max;
    void *cpu = NULL, *gpu = NULL;
    struct kv_pair kv = {NULL, NULL};
    CHECK_MSG(ref_backend->prepare(&b->g, n_max, max_ctx, NULL, 1, &cpu, &err) == LLMOPT_OK, "%s: %s", what, err.msg);
    CHECK_MSG(cuda_backend_ops.prepare(&b->g, n_max, max_ctx, NULL, 1, &gpu, &err) == LLMOPT_OK, "%s: %s", what, err.msg);
    int32_t n_slots = 4;
    if (b->g.n_kv_layers) {
        int32_t row_elems[8] = {0};
        for (int32_t i = 0; i < b->g.n_nodes; i++) {
            const struct ir_node *n = &b->g.nodes[i];
            if (n->op != IR_OP_ATTENTION) continue;
            const struct ir_shape *k = &b->g.nodes[n->in[1]].shape;
            row_elems[n->attrs.kv_layer] = (int32_t)(k->dims[1].coef * k->dims[3].coef);
        }
        int32_t blocks = (int32_t)((max_ctx + 15) / 16) * n_slots;
        CHECK(kv_cache_create(b->g.n_kv_layers, row_elems, test_kv, n_slots, (int32_t)max_ctx, blocks, 16, &kv.cpu, &err) == LLMOPT_OK);
        CHECK(kv_cache_create(b->g.n_kv_layers, row_elems, test_kv, n_slots, (int32_t)max_ctx, blocks, 16, &kv.gpu, &err) == LLMOPT_OK);
    }
    if (b->g.n_conv_layers) {
        int32_t rows[8] = {0}, channels[8] = {0};
        for (int32_t i = 0; i < b->g.n_nodes; i++) {
            const struct ir_node *n = &b->g.nodes[i];
            if (n->op != IR_OP_SHORT_CONV) continue;
            const struct ir_shape *w = &b->g.nodes[n->in[1]].shape;
            rows[n->attrs.kv_layer] = (int32_t)(w->dims[w->rank - 1].coef - 1);
            channels[n->attrs.kv_layer] = (int32_t)w->dims[0].coef;
        }
        int32_t none = 0;
        if (!kv.cpu) {
            CHECK(kv_cache_create(0, &none, KV_DTYPE_F32, n_slots, (int32_t)max_ctx, 1, 16, &kv.cpu, &err) == LLMOPT_OK);
            CHECK(kv_cache_create(0, &none, KV_DTYPE_F32, n_slots, (int32_t)max_ctx, 1, 16, &kv.gpu, &err) == LLMOPT_OK);
        }
        CHECK(kv_cache_add_conv_state(kv.cpu, b->g.n_conv_layers, rows, channels, &err) == LLMOPT_OK);
        CHECK(kv_cache_add_conv_state(kv.gpu, b->g.n_conv_layers, rows, channels, &err) == LLMOPT_OK);
    }
    int32_t *tokens = malloc((size_t)n_max * 4), *pos = malloc((size_t)n_max * 4), *slot = malloc((size_t)n_max * 4);
    int32_t *rows = malloc((size_t)n_max * 4);
    int32_t seq_len[4] = {0};
    double worst = 0;
    for (int k = 0; k < n_steps && cpu && gpu; k++) {
        const struct batch_spec *bs = &steps[k];
        int32_t next[4];
        memcpy(next, seq_len, sizeof next);
        for (int32_t t = 0; t < bs->n; t++) {
            tokens[t] = (int32_t)(rng_u32() % (uint32_t)b->vocab);
            slot[t] = bs->slots > 1 ? t % bs->slots : 0;
            pos[t] = next[slot[t]]++;
        }
        for (int32_t j = 0; j < bs->m; j++) rows[j] = bs->m == 1 ? bs->n - 1 : (int32_t)((j * 7 + 3) % bs->n);
        if (kv.cpu && b->g.n_kv_layers) {
            for (int s = 0; s < 4; s++)
                if (next[s] > seq_len[s]) {
                    CHECK(kv_cache_reserve(kv.cpu, s, next[s], &err) == LLMOPT_OK);
                    CHECK(kv_cache_reserve(kv.gpu, s, next[s], &err) == LLMOPT_OK);
                }
        }
        struct exec_batch eb = {bs->n, tokens, pos, slot, bs->m, rows};
        const float *lc = NULL, *lg = NULL;
        if (ref_backend->run(cpu, &eb, kv.cpu, &lc, &err) != LLMOPT_OK) {
            CHECK_MSG(0, "%s step %d cpu: %s", what, k, err.msg);
            break;
        }
        if (cuda_backend_ops.run(gpu, &eb, kv.gpu, &lg, &err) != LLMOPT_OK) {
            CHECK_MSG(0, "%s step %d cuda: %s", what, k, err.msg);
            break;
        }
        for (int s = 0; s < 4 && kv.cpu; s++) kv.cpu->slot_len[s] = kv.gpu->slot_len[s] = next[s];
        memcpy(seq_len, next, sizeof next);
        struct ir_extent e;
        ir_extent_of(&b->g.nodes[output].shape, bs->n, bs->m, &e);
        int64_t numel = ir_extent_numel(&e);
        bool nan;
        double r = rel_err(lg, lc, numel, &nan);
        worst = r > worst ? r : worst;
        CHECK_MSG(!nan && r <= tol, "%s step %d (N=%d M=%d): relative error %.3g (tol %.1g)%s", what, k, bs->n,
                  bs->m, r, tol, nan ? ", NaN mismatch" : "");
    }
    if (gpu) {
        struct backend_stats st;
        cuda_backend_ops.stats(gpu, &st);
        CHECK(st.steps == (uint64_t)n_steps || test_failures_in_current);
        last_kernels_run = st.kernels_run;
    }
    fprintf(stderr, "    %-44s worst %.2e\n", what, worst);
    free(tokens);
    free(pos);
    free(slot);
    free(rows);
    if (cpu) ref_backend->release(cpu);
    if (gpu) cuda_backend_ops.release(gpu);
    kv_cache_free(kv.cpu);
    kv_cache_free(kv.gpu);
}

static const struct batch_spec plain_steps[] = {{1, 1, 1}, {5, 2, 1}, {37, 3, 1}, {2, 2, 1}};
#define N_PLAIN ((int)(sizeof plain_steps / sizeof plain_steps[0]))

/* ---- op tests ------------------------------------------------------------------------ */

static void test_embedding_all_types(void) {
    /* q5_0 and iq4_xs are uploaded as q8_0 (cuda_backend.cu's upload_dtype) */
    enum ir_dtype types[] = {IR_DTYPE_F32,  IR_DTYPE_F16,  IR_DTYPE_BF16, IR_DTYPE_Q8_0, IR_DTYPE_Q4_0,
                             IR_DTYPE_Q5_0, IR_DTYPE_Q4_K, IR_DTYPE_Q5_K, IR_DTYPE_Q6_K, IR_DTYPE_IQ4_XS};
    for (int t = 0; t < (int)(sizeof types / sizeof types[0]); t++) {
        struct gb b;
        gb_init(&b);
        int32_t tab = gb_param(&b, types[t], b.vocab, t < 6 ? 96 : 512, 2.0f);
        int32_t x = gb_op2(&b, IR_OP_EMBEDDING, tab, b.g.inputs[IR_INPUT_TOKENS]);
        char what[64];
        snprintf(what, sizeof what, "embedding %s", ir_dtype_name(types[t]));
        compare_graph(what, &b, x, plain_steps, N_PLAIN, 64, types[t] == IR_DTYPE_IQ4_XS ? TOL_IQ4 : 0.0);
        gb_free(&b);
    }
}

struct linear_case {
    enum ir_dtype wt;
    int64_t k, n_out;
    uint32_t flags;
    enum ir_op act;
};
static double linear_small_tol; /* up to 8 rows, when not 0 (a matvec that rounds x) */
/* kernels_linear.cu (C linkage, cuda_kernels.cuh): the one-row q8_0 matvec's x mode, 1
 * int8 (the default), 0 f32; the exact f32 checks below run q8_0 with 0 */
void cu_matvec_q8_x(int mode);
void cu_matvec_x_regs(int on);
void cu_matvec_mma(int on);
void cu_matvec_mma_stages(int stages);
void cu_matvec_persist(int mode, int max_blocks);

static void run_linear_case(const struct linear_case *lc, bool no_blas) {
    struct gb b;
    gb_init(&b);
    int32_t x = gb_source(&b, lc->k, 1.0f);
    int32_t w = gb_param(&b, lc->wt, lc->n_out, lc->k, 1.0f);
    int32_t in[5] = {x, w};
    int n_in = 2;
    if (lc->flags & IR_LINEAR_BIAS) in[n_in++] = gb_param(&b, IR_DTYPE_F32, 0, lc->n_out, 1.0f);
    if (lc->flags & IR_LINEAR_GATE) in[n_in++] = gb_source(&b, lc->n_out, 1.0f);
    if (lc->flags & IR_LINEAR_RESIDUAL) in[n_in++] = gb_source(&b, lc->n_out, 1.0f);
    int32_t y = gb_add(&b, IR_OP_LINEAR, in, n_in);
    if (b.ok) {
        b.g.nodes[y].attrs.linear_flags = lc->flags;
        b.g.nodes[y].attrs.linear_act = lc->act;
    }
    gb_infer(&b, y);
    /* up to 8 rows: the matvec (f32 arithmetic); more: cuBLAS on f16/bf16 operands (and
     * bf16 dequantized blocks from 64 rows), or the tiled kernel (f32) */
    static const struct batch_spec small[] = {{1, 1, 1}, {3, 1, 1}, {8, 2, 1}};
    static const struct batch_spec big[] = {{20, 1, 1}, {70, 2, 1}, {3, 1, 1}};
    char what[96];
    snprintf(what, sizeof what, "linear %s %lldx%lld fl%u %s%s", ir_dtype_name(lc->wt), (long long)lc->n_out,
             (long long)lc->k, lc->flags, lc->act == IR_OP_INPUT ? "" : ir_op_name(lc->act), no_blas ? " tiled" : "");
    bool half = lc->wt != IR_DTYPE_F32 && !no_blas;
    /* f16/bf16 rows the 16-byte matvec cannot take (K % 8) go to cuBLAS at any batch */
    bool half_small = (lc->wt == IR_DTYPE_F16 || lc->wt == IR_DTYPE_BF16) && !no_blas && lc->k % 8;
    if (no_blas) setenv("LLMOPT_CUDA_NO_BLAS", "1", 1);
    compare_graph(what, &b, y, small, 3, 64, linear_small_tol > 0 ? linear_small_tol : half_small ? TOL_HALF : TOL_F32);
    /* the last step (3 rows) is a matvec again: the small batches' tolerance too */
    double big_tol = half ? TOL_HALF : TOL_F32;
    compare_graph(what, &b, y, big, 3, 64, linear_small_tol > big_tol ? linear_small_tol : big_tol);
    unsetenv("LLMOPT_CUDA_NO_BLAS");
    gb_free(&b);
}

static void test_linear(void) {
    cu_matvec_q8_x(0); /* f32 x: every path within TOL_F32 (test_linear_q8x: int8 x) */
    enum ir_dtype types[] = {IR_DTYPE_F32, IR_DTYPE_F16, IR_DTYPE_BF16, IR_DTYPE_Q8_0, IR_DTYPE_Q4_0};
    for (int t = 0; t < 5; t++) {
        struct linear_case cases[] = {
            {types[t], 256, 48, 0, IR_OP_INPUT},
            {types[t], 512, 37, IR_LINEAR_BIAS | IR_LINEAR_GATE | IR_LINEAR_RESIDUAL, IR_OP_SILU},
            {types[t], 1024, 130, IR_LINEAR_RESIDUAL, IR_OP_INPUT},
            {types[t], 96, 20, IR_LINEAR_BIAS, IR_OP_GELU_TANH},
        };
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            run_linear_case(&cases[c], false);
            if (c == 1) run_linear_case(&cases[c], true);
        }
    }
    /* q5_0 and iq4_xs run as q8_0 (exact for q5_0; iq4_xs within TOL_IQ4) on every path */
    enum ir_dtype as_q8[] = {IR_DTYPE_Q5_0, IR_DTYPE_IQ4_XS};
    for (int t = 0; t < 2; t++) {
        struct linear_case cases[] = {
            {as_q8[t], 256, 48, 0, IR_OP_INPUT},
            {as_q8[t], 512, 37, IR_LINEAR_BIAS | IR_LINEAR_GATE | IR_LINEAR_RESIDUAL, IR_OP_SILU},
            {as_q8[t], 1024, 130, IR_LINEAR_RESIDUAL, IR_OP_INPUT},
        };
        linear_small_tol = as_q8[t] == IR_DTYPE_IQ4_XS ? TOL_IQ4 : 0;
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            run_linear_case(&cases[c], false);
            if (c == 1) run_linear_case(&cases[c], true);
        }
    }
    linear_small_tol = 0;
    /* row lengths the 16-byte matvec cannot take go through the tiled kernel */
    struct linear_case odd[] = {{IR_DTYPE_F32, 70, 9, IR_LINEAR_BIAS, IR_OP_RELU}, {IR_DTYPE_BF16, 36, 11, 0, IR_OP_INPUT}};
    for (int c = 0; c < 2; c++) run_linear_case(&odd[c], false);
    cu_matvec_q8_x(-1);
}

/* kernels_kquant.cu: cu_matvec_kq_multi's output rows a warp and blocks an SM (C linkage) */
void cu_kq_tune(int nr, int prefetch, int blocks_per_sm);
/* kernels_linear.cu: q4_K/q6_K products of 2-8 rows on tensor cores (1, the default) or not */
void cu_matvec_kq_mma_on(int on);
static void mma_rows_check(const struct linear_case *lc, bool norm, bool few);

/* K-quants (rows of 256-element super-blocks), in each x mode ($LLMOPT_CUDA_KQ_X):
 * unset, the default 2: x quantized to int8 per group of 32 and dp4a products (q4_K and
 * q6_K through cu_matvec_kq_multi: 1 or 2 output rows a warp, persistent warps, 1 and 8
 * x rows; q5_K the older kernel, int8 per 16). The reference here is exact f32, so that
 * mode is held to TOL_INT8: x rounded to 8 bits is ~1e-3 relative, the same rounding
 * the CPU backend's own K-quant dot products make (they quantize x to q8_K, per 256
 * rather than this kernel's 32): TOL_INT8. 1: f32 x
 * staged in shared memory, 0: f32 from global memory (also what K = 32768 takes there),
 * every variant of the older kernel (1, 2 and 4 output rows a warp from 2048 / 8192
 * rows, with a tail; split K from 8192 (q4_K/q5_K) or 16384 (q6_K) columns; several x
 * rows), exact to f32 rounding. Then the tiled kernel and bf16 + cuBLAS. */
static void test_linear_kquant(void) {
    enum ir_dtype types[] = {IR_DTYPE_Q4_K, IR_DTYPE_Q5_K, IR_DTYPE_Q6_K};
    static const char *const modes[] = {NULL, "1", "0"};
    /* int8 mode launch shapes: the default; 1 row a warp without the next item's loads
     * in flight; 2 rows a warp with them and one block an SM (each warp takes many row
     * groups) */
    static const int tunes[][3] = {{0, 0, 0}, {1, 2, 0}, {2, 1, 1}};
    for (int m = 0; m < 3; m++)
        for (int tu = 0; tu < (m == 0 ? 3 : 1); tu++) {
            if (modes[m])
                setenv("LLMOPT_CUDA_KQ_X", modes[m], 1);
            else
                unsetenv("LLMOPT_CUDA_KQ_X");
            cu_kq_tune(tunes[tu][0], tunes[tu][1], tunes[tu][2]);
            for (int t = 0; t < 3; t++) {
                struct linear_case cases[] = {
                    {types[t], 256, 48, 0, IR_OP_INPUT},
                    {types[t], 512, 37, IR_LINEAR_BIAS | IR_LINEAR_GATE | IR_LINEAR_RESIDUAL, IR_OP_SILU},
                    {types[t], 1024, 130, IR_LINEAR_RESIDUAL, IR_OP_INPUT},
                    {types[t], 256, 2051, 0, IR_OP_INPUT},
                    {types[t], 256, 8195, IR_LINEAR_BIAS, IR_OP_INPUT},
                    {types[t], t == 2 ? 16384 : 8192, 40, 0, IR_OP_INPUT},
                    {types[t], 32768, 3, 0, IR_OP_INPUT},
                };
                for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
                    if ((m > 0 || tu > 0) && c == 2) continue; /* the other modes: the matvec shapes */
                    /* f32 sums of 32768 products in the reference's order alone differ by
                     * ~1e-5 relative (sqrt(K) * 2^-24): that case gets 5e-5 */
                    linear_small_tol = m == 0 ? TOL_INT8 : cases[c].k > 16384 ? 5e-5 : 0;
                    run_linear_case(&cases[c], false);
                    if (c == 1 && m == 2) run_linear_case(&cases[c], true);
                }
            }
        }
    cu_kq_tune(0, 0, 0);
    unsetenv("LLMOPT_CUDA_KQ_X");
    linear_small_tol = 0;
    /* 2-8 rows (the int8 default): on tensor cores (cu_matvec_kq_mma) and by the dp4a loop
     * (off), plain and after an rms_norm; K of 256 (q4_K), 1024, 2048 and 4096 with partial
     * 16-row tiles; q6_K at K = 768 (not a multiple of 1024: the dp4a loop either way);
     * then 8 staged rows of 12288 and 3 blocks taking many tiles each */
    const struct linear_case rows_cases[] = {
        {IR_DTYPE_Q4_K, 1024, 40, IR_LINEAR_BIAS | IR_LINEAR_GATE | IR_LINEAR_RESIDUAL, IR_OP_SILU},
        {IR_DTYPE_Q6_K, 1024, 40, IR_LINEAR_RESIDUAL, IR_OP_INPUT},
        {IR_DTYPE_Q4_K, 4096, 300, 0, IR_OP_INPUT},
        {IR_DTYPE_Q6_K, 2048, 300, IR_LINEAR_BIAS, IR_OP_INPUT},
        {IR_DTYPE_Q4_K, 256, 33, 0, IR_OP_INPUT},
        {IR_DTYPE_Q6_K, 768, 33, 0, IR_OP_INPUT},
    };
    const int n_rows_cases = (int)(sizeof rows_cases / sizeof rows_cases[0]);
    for (int on = 1; on >= 0; on--) {
        cu_matvec_kq_mma_on(on);
        for (int c = 0; c < 2 * n_rows_cases; c++)
            mma_rows_check(&rows_cases[c % n_rows_cases], c >= n_rows_cases, true);
    }
    cu_matvec_kq_mma_on(1);
    const struct linear_case long_rows[] = {{IR_DTYPE_Q4_K, 12288, 40, IR_LINEAR_RESIDUAL, IR_OP_INPUT},
                                            {IR_DTYPE_Q6_K, 12288, 24, 0, IR_OP_INPUT}};
    for (int c = 0; c < 2; c++) mma_rows_check(&long_rows[c], c == 1, true);
    cu_matvec_persist(-1, 3);
    for (int c = 0; c < 4; c++) mma_rows_check(&rows_cases[c], c == 1, true);
    cu_matvec_persist(-1, 0);
}

static void test_unary(void) {
    enum ir_op ops[] = {IR_OP_NEG, IR_OP_EXP, IR_OP_SQRT, IR_OP_RSQRT, IR_OP_RECIP, IR_OP_SILU, IR_OP_SIGMOID,
                        IR_OP_TANH, IR_OP_RELU, IR_OP_GELU, IR_OP_GELU_TANH, IR_OP_COS, IR_OP_SIN};
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
        struct gb b;
        gb_init(&b);
        int32_t x = gb_source(&b, 33, 3.0f);
        if (ops[k] == IR_OP_SQRT || ops[k] == IR_OP_RSQRT || ops[k] == IR_OP_RECIP) x = gb_op1(&b, IR_OP_EXP, x);
        int32_t y = gb_op1(&b, ops[k], x);
        char what[64];
        snprintf(what, sizeof what, "unary %s", ir_op_name(ops[k]));
        compare_graph(what, &b, y, plain_steps, N_PLAIN, 64, TOL_F32);
        gb_free(&b);
    }
}

static void test_binary_broadcast(void) {
    enum ir_op ops[] = {IR_OP_ADD, IR_OP_SUB, IR_OP_MUL, IR_OP_DIV, IR_OP_POW, IR_OP_MAXIMUM, IR_OP_MINIMUM};
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++)
        for (int form = 0; form < 3; form++) {
            struct gb b;
            gb_init(&b);
            int32_t a = gb_reshape(&b, gb_source(&b, 24, 2.0f), SHAPE(DN(1), DC(4), DC(6)));
            if (ops[k] == IR_OP_POW) a = gb_op1(&b, IR_OP_EXP, a);
            int32_t c;
            if (form == 0) /* same shape */
                c = gb_reshape(&b, gb_source(&b, 24, 2.0f), SHAPE(DN(1), DC(4), DC(6)));
            else if (form == 1) /* a [6] param row */
                c = gb_param(&b, IR_DTYPE_F32, 0, 6, 2.0f);
            else /* [N, 1, 6] against [N, 4, 6], operands swapped */
                c = gb_reshape(&b, gb_source(&b, 6, 2.0f), SHAPE(DN(1), DC(1), DC(6)));
            if (ops[k] == IR_OP_DIV) c = gb_op1(&b, IR_OP_EXP, c);
            int32_t y = form == 2 && ops[k] != IR_OP_POW ? gb_op2(&b, ops[k], c, a) : gb_op2(&b, ops[k], a, c);
            char what[64];
            snprintf(what, sizeof what, "binary %s form %d", ir_op_name(ops[k]), form);
            compare_graph(what, &b, y, plain_steps, N_PLAIN, 64, TOL_F32);
            gb_free(&b);
        }
}

static void test_reductions_softmax(void) {
    enum ir_op ops[] = {IR_OP_MEAN, IR_OP_SUM, IR_OP_MAX};
    struct { int n_axes; int64_t axes[2]; bool keep; } forms[] = {{1, {2}, false}, {1, {2}, true}, {1, {0}, false},
                                                                  {1, {1}, true}, {2, {0, 2}, false}, {2, {1, 2}, false}};
    for (int k = 0; k < 3; k++)
        for (int f = 0; f < 6; f++) {
            struct gb b;
            gb_init(&b);
            int32_t x = gb_reshape(&b, gb_source(&b, 5 * 300, 1.0f), SHAPE(DN(1), DC(5), DC(300)));
            int32_t y = gb_add(&b, ops[k], &x, 1);
            if (b.ok) {
                b.g.nodes[y].attrs.n_axes = forms[f].n_axes;
                memcpy(b.g.nodes[y].attrs.axes, forms[f].axes, sizeof forms[f].axes);
                b.g.nodes[y].attrs.keepdim = forms[f].keep;
            }
            gb_infer(&b, y);
            char what[64];
            snprintf(what, sizeof what, "%s form %d", ir_op_name(ops[k]), f);
            compare_graph(what, &b, y, plain_steps, N_PLAIN, 64, TOL_F32);
            gb_free(&b);
        }
    for (int axis = 0; axis < 3; axis++)
        for (int wide = 0; wide < 2; wide++) {
            struct gb b;
            gb_init(&b);
            int64_t last = wide ? 1500 : 7;
            int32_t x = gb_reshape(&b, gb_source(&b, 3 * last, 4.0f), SHAPE(DN(1), DC(3), DC(last)));
            int32_t y = gb_add(&b, IR_OP_SOFTMAX, &x, 1);
            if (b.ok) b.g.nodes[y].attrs.axis = axis;
            gb_infer(&b, y);
            char what[64];
            snprintf(what, sizeof what, "softmax axis %d len %lld", axis, (long long)last);
            compare_graph(what, &b, y, plain_steps, N_PLAIN, 64, TOL_F32);
            gb_free(&b);
        }
}

static void test_norms_rope(void) {
    int64_t dims[] = {64, 1000, 4096};
    for (int k = 0; k < 3; k++)
        for (int layer = 0; layer < 2; layer++) {
            struct gb b;
            gb_init(&b);
            int32_t x = gb_source(&b, dims[k], 3.0f);
            int32_t in[3] = {x, gb_param(&b, IR_DTYPE_F32, 0, dims[k], 1.0f), 0};
            if (layer) in[2] = gb_param(&b, IR_DTYPE_F32, 0, dims[k], 1.0f);
            int32_t y = gb_add(&b, layer ? IR_OP_LAYER_NORM : IR_OP_RMS_NORM, in, layer ? 3 : 2);
            if (b.ok) b.g.nodes[y].attrs.value = 1e-5;
            gb_infer(&b, y);
            char what[64];
            snprintf(what, sizeof what, "%s d=%lld", layer ? "layer_norm" : "rms_norm", (long long)dims[k]);
            compare_graph(what, &b, y, plain_steps, N_PLAIN, 64, TOL_F32);
            gb_free(&b);
        }
    /* rope on [1, H, N, D] with cos/sin [N, D] (per token), and with [D] (one row) */
    for (int form = 0; form < 2; form++) {
        struct gb b;
        gb_init(&b);
        int64_t h = 3, d = 16;
        int32_t x = gb_source(&b, h * d, 2.0f);
        x = gb_reshape(&b, x, SHAPE(DN(1), DC(h), DC(d)));
        int32_t p = gb_permute(&b, x, 3, (const int[]){1, 0, 2});
        x = gb_reshape(&b, p, SHAPE(DC(1), DC(h), DN(1), DC(d)));
        int32_t c = form ? gb_param(&b, IR_DTYPE_F32, 0, d, 1.0f) : gb_source(&b, d, 1.0f);
        int32_t s = form ? gb_param(&b, IR_DTYPE_F32, 0, d, 1.0f) : gb_source(&b, d, 1.0f);
        int32_t in[3] = {x, c, s};
        int32_t y = gb_infer(&b, gb_add(&b, IR_OP_ROPE, in, 3));
        compare_graph(form ? "rope (shared cos/sin)" : "rope (per-token cos/sin)", &b, y, plain_steps, N_PLAIN, 64, TOL_F32);
        gb_free(&b);
    }
    /* rms_norm feeding only linears (x used again later): up to 8 rows the matvecs
     * compute the norm themselves (the backend skips the norm kernel) */
    static const enum ir_dtype wts[] = {IR_DTYPE_F32, IR_DTYPE_BF16, IR_DTYPE_Q8_0, IR_DTYPE_Q4_0, IR_DTYPE_Q4_K, IR_DTYPE_Q6_K};
    static const struct batch_spec small[] = {{1, 1, 1}, {3, 1, 1}, {8, 2, 1}, {1, 1, 1}};
    setenv("LLMOPT_CUDA_FUSE_NORM", "1", 1); /* opt-in, read at prepare */
    cu_matvec_q8_x(0); /* q8_0 with f32 x: exact (test_linear_q8x: the int8 default) */
    for (int k = 0; k < 6; k++) {
        struct gb b;
        gb_init(&b);
        int64_t d = k == 3 ? 4096 : 512;
        int32_t x = gb_source(&b, d, 3.0f);
        int32_t nin[2] = {x, gb_param(&b, IR_DTYPE_F32, 0, d, 1.0f)};
        int32_t h = gb_add(&b, IR_OP_RMS_NORM, nin, 2);
        if (b.ok) b.g.nodes[h].attrs.value = 1e-6;
        gb_infer(&b, h);
        int32_t l1[2] = {h, gb_param(&b, wts[k], d, d, 1.0f)}, l2[3] = {h, gb_param(&b, IR_DTYPE_F32, d, d, 1.0f), x};
        int32_t y1 = gb_infer(&b, gb_add(&b, IR_OP_LINEAR, l1, 2));
        int32_t y2 = gb_add(&b, IR_OP_LINEAR, l2, 3); /* with a residual epilogue */
        if (b.ok) b.g.nodes[y2].attrs.linear_flags = IR_LINEAR_RESIDUAL;
        gb_infer(&b, y2);
        int32_t y = gb_op2(&b, IR_OP_ADD, gb_op2(&b, IR_OP_ADD, y1, y2), x);
        char what[64];
        snprintf(what, sizeof what, "rms_norm d=%lld into %s matvec", (long long)d, ir_dtype_name(wts[k]));
        compare_graph(what, &b, y, small, 4, 64, k >= 4 ? TOL_INT8 : TOL_F32); /* K-quants: int8 x */
        gb_free(&b);
    }
    cu_matvec_q8_x(-1);
    unsetenv("LLMOPT_CUDA_FUSE_NORM");
}

static void test_layout_ops(void) {
    /* permute [N,4,6] -> [6,N,4]; expand [N,1,6] -> [N,5,6]; slices; concat; cast; select_rows;
     * matmul; const and rope_freqs */
    for (int t = 0; t < 9; t++) {
        struct gb b;
        gb_init(&b);
        int32_t a = gb_reshape(&b, gb_source(&b, 24, 2.0f), SHAPE(DN(1), DC(4), DC(6)));
        int32_t y = 0;
        const char *what = "";
        switch (t) {
        case 0:
            what = "permute (2,0,1)";
            y = gb_permute(&b, a, 3, (const int[]){2, 0, 1});
            break;
        case 1: {
            what = "expand [N,1,6] -> [N,5,6]";
            int32_t c = gb_reshape(&b, gb_source(&b, 6, 1.0f), SHAPE(DN(1), DC(1), DC(6)));
            y = gb_add(&b, IR_OP_EXPAND, &c, 1);
            if (b.ok) b.g.nodes[y].attrs.target = SHAPE(DN(1), DC(5), DC(6));
            gb_infer(&b, y);
            break;
        }
        case 2:
        case 3:
            what = t == 2 ? "slice axis 2 [1:5:2]" : "slice axis 1 [1:]";
            y = gb_add(&b, IR_OP_SLICE, &a, 1);
            if (b.ok) {
                b.g.nodes[y].attrs.axis = t == 2 ? 2 : 1;
                b.g.nodes[y].attrs.start = DC(1);
                b.g.nodes[y].attrs.end = DC(t == 2 ? 5 : 100);
                b.g.nodes[y].attrs.step = t == 2 ? 2 : 1;
            }
            gb_infer(&b, y);
            break;
        case 4:
        case 5: {
            what = t == 4 ? "concat axis 1" : "concat axis 2";
            int32_t c = gb_reshape(&b, gb_source(&b, 24, 1.0f), SHAPE(DN(1), DC(4), DC(6)));
            int32_t in[3] = {a, c, a};
            y = gb_add(&b, IR_OP_CONCAT, in, 3);
            if (b.ok) b.g.nodes[y].attrs.axis = t == 4 ? 1 : 2;
            gb_infer(&b, y);
            break;
        }
        case 6: {
            what = "cast f32 -> i32 -> f32, const";
            int32_t k100 = gb_infer(&b, gb_add(&b, IR_OP_CONST, NULL, 0));
            if (b.ok) b.g.nodes[k100].attrs.value = 100.0;
            gb_infer(&b, k100);
            int32_t sc = gb_op2(&b, IR_OP_MUL, a, k100);
            int32_t ci = gb_add(&b, IR_OP_CAST, &sc, 1);
            if (b.ok) b.g.nodes[ci].attrs.cast_to = IR_DTYPE_I32;
            gb_infer(&b, ci);
            y = gb_add(&b, IR_OP_CAST, &ci, 1);
            if (b.ok) b.g.nodes[y].attrs.cast_to = IR_DTYPE_F32;
            gb_infer(&b, y);
            break;
        }
        case 7: {
            what = "select_rows + matmul [M,4,6]x[6,5]";
            int32_t sel = gb_op2(&b, IR_OP_SELECT_ROWS, gb_reshape(&b, a, SHAPE(DN(1), DC(24))),
                                 b.g.inputs[IR_INPUT_OUT_ROWS]);
            int32_t r = gb_reshape(&b, sel, SHAPE(((struct ir_dim){1, IR_SYM_M}), DC(4), DC(6)));
            y = gb_op2(&b, IR_OP_MATMUL, r, gb_param(&b, IR_DTYPE_F32, 6, 5, 1.0f));
            break;
        }
        case 8: {
            what = "rope_freqs x positions (outer product)";
            int32_t f = gb_add(&b, IR_OP_ROPE_FREQS, NULL, 0);
            if (b.ok) {
                b.g.nodes[f].attrs.axis = 16;
                b.g.nodes[f].attrs.value = 10000.0;
            }
            gb_infer(&b, f);
            int32_t p = gb_add(&b, IR_OP_CAST, &b.g.inputs[IR_INPUT_POSITIONS], 1);
            if (b.ok) b.g.nodes[p].attrs.cast_to = IR_DTYPE_F32;
            gb_infer(&b, p);
            int32_t pc = gb_reshape(&b, p, SHAPE(DN(1), DC(1)));
            int32_t ang = gb_op2(&b, IR_OP_MUL, pc, f);
            y = gb_op1(&b, IR_OP_COS, ang);
            break;
        }
        default: break;
        }
        compare_graph(what, &b, y, plain_steps, N_PLAIN, 64, TOL_F32);
        gb_free(&b);
    }
}

/* The models' rope table (programs/qwen3/graph.json and the others): cast(positions) [1, 1, N], matmul with
 * the [1, half, 1] frequencies, permute to [1, N, half], concat(p, p), cos and sin: the
 * fused steps (<= 8 tokens) compute it in one launch (FUSE_ROPE_TABLE), the 37-token
 * step node by node; both against the reference, and 5 counted kernels fewer a fused
 * step than with LLMOPT_CUDA_FUSE=0. */
static void test_rope_table(void) {
    uint64_t kernels[2] = {0, 0};
    for (int unfused = 0; unfused < 2; unfused++) {
        struct gb b;
        gb_init(&b);
        int32_t f = gb_add(&b, IR_OP_ROPE_FREQS, NULL, 0);
        if (b.ok) {
            b.g.nodes[f].attrs.axis = 24;
            b.g.nodes[f].attrs.value = 10000.0;
        }
        gb_infer(&b, f);
        int32_t fr = gb_reshape(&b, f, SHAPE(DC(1), DC(12), DC(1)));
        int32_t pr = gb_reshape(&b, b.g.inputs[IR_INPUT_POSITIONS], SHAPE(DC(1), DC(1), DN(1)));
        int32_t pc = gb_add(&b, IR_OP_CAST, &pr, 1);
        if (b.ok) b.g.nodes[pc].attrs.cast_to = IR_DTYPE_F32;
        gb_infer(&b, pc);
        int32_t p = gb_permute(&b, gb_op2(&b, IR_OP_MATMUL, fr, pc), 3, (const int[]){0, 2, 1});
        int32_t in[2] = {p, p};
        int32_t cat = gb_add(&b, IR_OP_CONCAT, in, 2);
        if (b.ok) b.g.nodes[cat].attrs.axis = 2;
        gb_infer(&b, cat);
        int32_t cs[2] = {gb_op1(&b, IR_OP_COS, cat), gb_op1(&b, IR_OP_SIN, cat)};
        int32_t y = gb_add(&b, IR_OP_CONCAT, cs, 2); /* cos then sin: a swap would show */
        if (b.ok) b.g.nodes[y].attrs.axis = 2;
        gb_infer(&b, y);
        if (unfused) setenv("LLMOPT_CUDA_FUSE", "0", 1);
        compare_graph(unfused ? "rope table, unfused" : "rope table (one launch a fused step)", &b, y, plain_steps,
                      N_PLAIN, 64, TOL_F32);
        unsetenv("LLMOPT_CUDA_FUSE");
        kernels[unfused] = last_kernels_run;
        gb_free(&b);
    }
    uint64_t fused_steps = 0;
    for (int k = 0; k < N_PLAIN; k++) fused_steps += plain_steps[k].n <= 8;
    CHECK_MSG(kernels[0] + 5 * fused_steps == kernels[1],
              "rope table: %llu kernels fused, %llu unfused (expected %llu fewer)", (unsigned long long)kernels[0],
              (unsigned long long)kernels[1], (unsigned long long)(5 * fused_steps));
}

/* q, k, v from random tables, shaped [1, heads, N, Dh]. */
static int32_t gb_heads(struct gb *b, int64_t heads, int64_t dh) {
    int32_t x = gb_reshape(b, gb_source(b, heads * dh, 1.0f), SHAPE(DN(1), DC(heads), DC(dh)));
    int32_t p = gb_permute(b, x, 3, (const int[]){1, 0, 2});
    return gb_reshape(b, p, SHAPE(DC(1), DC(heads), DN(1), DC(dh)));
}

static void attention_case(const char *what, int64_t h, int64_t hkv, int64_t dh, int64_t window,
                           const struct batch_spec *steps, int n_steps, int64_t max_ctx, double tol) {
    struct gb b;
    gb_init(&b);
    b.vocab = 200;
    int32_t out = 0;
    for (int layer = 0; layer < 2; layer++) { /* two layers: the cache holds each */
        int32_t in[5] = {gb_heads(&b, h, dh), gb_heads(&b, hkv, dh), gb_heads(&b, hkv, dh),
                         b.g.inputs[IR_INPUT_POSITIONS], b.g.inputs[IR_INPUT_SEQ_SLOTS]};
        int32_t a = gb_add(&b, IR_OP_ATTENTION, in, 5);
        if (b.ok) {
            b.g.nodes[a].attrs.value = 1.0 / sqrt((double)dh);
            b.g.nodes[a].attrs.window = window;
            b.g.nodes[a].attrs.kv_layer = layer;
        }
        gb_infer(&b, a);
        b.g.n_kv_layers++;
        out = layer ? gb_op2(&b, IR_OP_ADD, out, a) : a;
    }
    compare_graph(what, &b, out, steps, n_steps, max_ctx, tol);
    gb_free(&b);
}

/* attention_case named "<what> (<kernel> <shape>)": a case run under a forced kernel shape. */
static void attention_case_as(const char *what, const char *kernel, const char *shape, int64_t h, int64_t hkv,
                              int64_t dh, int64_t window, const struct batch_spec *steps, int n_steps, int64_t max_ctx,
                              double tol) {
    char name[160];
    snprintf(name, sizeof name, "%s (%s %s)", what, kernel, shape);
    attention_case(name, h, hkv, dh, window, steps, n_steps, max_ctx, tol);
}

static void test_attention(void) {
    /* the f32 kernels at the f32 bound; the tensor-core prefill kernel below */
    setenv("LLMOPT_CUDA_ATT_MMA", "0", 1);
    static const struct batch_spec mixed[] = {{5, 1, 1}, {1, 1, 1}, {6, 2, 2}, {2, 2, 2}, {2, 2, 2}, {9, 3, 3}, {1, 1, 1}};
    attention_case("attention H4 Hkv2 Dh16 prefill/mixed/decode", 4, 2, 16, 0, mixed, 7, 64, TOL_F32);
    attention_case("attention H8 Hkv8 Dh128", 8, 8, 128, 0, mixed, 7, 64, TOL_F32);
    attention_case("attention H6 Hkv1 Dh64 window 4", 6, 1, 64, 4, mixed, 7, 64, TOL_F32);
    attention_case("attention H2 Hkv1 Dh8 (stories-like)", 2, 1, 8, 0, mixed, 7, 64, TOL_F32);
    /* long context: prefill 300 positions in chunks, then decode (split contexts) */
    static const struct batch_spec longer[] = {{100, 1, 1}, {100, 1, 1}, {100, 1, 1}, {1, 1, 1}, {1, 1, 1}, {3, 3, 3}, {1, 1, 1}};
    attention_case("attention H4 Hkv2 Dh64 300+ positions (splits)", 4, 2, 64, 0, longer, 7, 1024, TOL_F32);
    attention_case("attention H4 Hkv2 Dh64 window 100, 300+ positions", 4, 2, 64, 100, longer, 7, 1024, TOL_F32);
    /* batches above 16 tokens take the tiled kernel (f32; head dims other than 64/96/128,
     * or LLMOPT_CUDA_ATT_MMA=0): sequences interleaved in a tile, partial tiles, windows,
     * head dims not a multiple of 32, then decode after it */
    /* (through the backend, {40, 3, 3} has no sequence of 17 tokens: the per-token
     * kernels, as {64, 4, 4} below) */
    static const struct batch_spec tiled[] = {{40, 3, 3}, {1, 1, 1}, {37, 2, 2}, {100, 1, 1}, {3, 3, 3},
                                              {64, 4, 4}, {17, 1, 1}};
    attention_case("attention H8 Hkv2 Dh128 tiled prefill", 8, 2, 128, 0, tiled, 7, 512, TOL_F32);
    attention_case("attention H4 Hkv4 Dh96 window 7 tiled", 4, 4, 96, 7, tiled, 7, 512, TOL_F32);
    attention_case("attention H2 Hkv1 Dh8 window 50 tiled", 2, 1, 8, 50, tiled, 7, 512, TOL_F32);
    attention_case("attention H4 Hkv2 Dh256 (beyond the tiled kernel)", 4, 2, 256, 0, tiled, 7, 512, TOL_F32);
    unsetenv("LLMOPT_CUDA_ATT_MMA");
    /* head dims 64/96/128 take the tensor-core kernel (bf16 q/k/v/p, f32 sums): query
     * groups of 1 to 64 heads a KV head (3: 63 of a block's 64 rows used), sequences
     * interleaved, windows, 100-token chunks over earlier ones, a 600-position context */
    attention_case("attention H8 Hkv2 Dh128 tensor cores", 8, 2, 128, 0, tiled, 7, 512, TOL_HALF);
    attention_case("attention H4 Hkv4 Dh96 window 7 tensor cores", 4, 4, 96, 7, tiled, 7, 512, TOL_HALF);
    attention_case("attention H6 Hkv2 Dh64 window 50 tensor cores", 6, 2, 64, 50, tiled, 7, 512, TOL_HALF);
    attention_case("attention H32 Hkv8 Dh128 300+ positions tensor cores", 32, 8, 128, 0, longer, 7, 1024, TOL_HALF);
    attention_case("attention H8 Hkv1 Dh64 window 100, 300+ positions tensor cores", 8, 1, 64, 100, longer, 7, 1024,
                   TOL_HALF);
    attention_case("attention H64 Hkv1 Dh64 tensor cores", 64, 1, 64, 0, tiled, 7, 512, TOL_HALF);
    static const struct batch_spec long_ctx[] = {{300, 1, 1}, {300, 1, 1}, {1, 1, 1}, {40, 2, 2}, {1, 1, 1}};
    attention_case("attention H16 Hkv4 Dh128 600+ positions tensor cores", 16, 4, 128, 0, long_ctx, 5, 1024,
                   TOL_HALF);
    setenv("LLMOPT_CUDA_ATT_MMA", "0", 1);
    /* small batches take the warp kernel where the head dim allows (% 4, <= 128); the
     * per-position kernel stays for the rest and behind LLMOPT_CUDA_ATT_WARP=0 */
    attention_case("attention H4 Hkv2 Dh60 window 100 (warp kernel)", 4, 2, 60, 100, longer, 7, 1024, TOL_F32);
    attention_case("attention H4 Hkv2 Dh6 (per-position kernel)", 4, 2, 6, 0, mixed, 7, 64, TOL_F32);
    /* one token, head dims % 8 == 0, LLMOPT_CUDA_ATT_DEC=S,W: the cluster kernel (query
     * heads a block 4, 2 or 1 of a group: 8B-, 0.6B-shaped and odd groups; windows;
     * several rounds a warp at 8 x 1 and 2 x 1; the empty blocks of short contexts) */
    setenv("LLMOPT_CUDA_ATT_DEC", "8,8", 1);
    attention_case("attention H32 Hkv8 Dh128 600+ positions (cluster decode 8,8)", 32, 8, 128, 0, long_ctx, 5, 1024,
                   TOL_F32);
    attention_case("attention H12 Hkv4 Dh64 window 100, 300+ positions (cluster decode 8,8)", 12, 4, 64, 100, longer,
                   7, 1024, TOL_F32);
    static const char *const dec_shapes[] = {"8,8", "8,4", "8,1", "2,1"};
    for (int i = 0; i < 4; i++) {
        const char *k = "cluster decode", *sh = dec_shapes[i];
        setenv("LLMOPT_CUDA_ATT_DEC", sh, 1);
        attention_case_as("attention H16 Hkv8 Dh128 600+ positions", k, sh, 16, 8, 128, 0, long_ctx, 5, 1024, TOL_F32);
        attention_case_as("attention H6 Hkv1 Dh64 window 4", k, sh, 6, 1, 64, 4, mixed, 7, 64, TOL_F32);
    }
    unsetenv("LLMOPT_CUDA_ATT_DEC");
    /* the warp kernel at the 8B / 0.6B shapes over 600+ positions (5 and 9 splits), at 4
     * and 8 warps a block (LLMOPT_CUDA_ATT_WARPS: 16 or 8 positions a warp a round), with
     * head dim 60 (q/k rotated in shared memory) and f16 caches too */
    static const char *const warp_shapes[] = {"4", "8"};
    for (int i = 0; i < 2; i++) {
        const char *k = "warp kernel, warps", *sh = warp_shapes[i];
        setenv("LLMOPT_CUDA_ATT_WARPS", sh, 1);
        attention_case_as("attention H32 Hkv8 Dh128 600+ positions", k, sh, 32, 8, 128, 0, long_ctx, 5, 1024, TOL_F32);
        attention_case_as("attention H16 Hkv8 Dh128 600+ positions", k, sh, 16, 8, 128, 0, long_ctx, 5, 1024, TOL_F32);
        attention_case_as("attention H4 Hkv2 Dh60 window 100", k, sh, 4, 2, 60, 100, longer, 7, 1024, TOL_F32);
        /* f16 rows: 8 warps take the 80-register build for grids of more than 264 blocks
         * (H32 x 9 splits), the 128-register one below (H4) */
        test_kv = KV_DTYPE_F16;
        attention_case_as("f16 KV: attention H32 Hkv8 Dh128 600+ positions", k, sh, 32, 8, 128, 0, long_ctx, 5, 1024,
                          TOL_F32);
        attention_case_as("f16 KV: attention H4 Hkv2 Dh60 window 100", k, sh, 4, 2, 60, 100, longer, 7, 1024, TOL_F32);
        test_kv = KV_DTYPE_F32;
    }
    unsetenv("LLMOPT_CUDA_ATT_WARPS");
    setenv("LLMOPT_CUDA_ATT_WARP", "0", 1);
    attention_case("attention H4 Hkv2 Dh64 300+ positions, per-position", 4, 2, 64, 0, longer, 7, 1024, TOL_F32);
    attention_case("attention H8 Hkv8 Dh128 per-position", 8, 8, 128, 0, mixed, 7, 64, TOL_F32);
    unsetenv("LLMOPT_CUDA_ATT_WARP");
    /* f16 caches on both sides (rows rounded to nearest even on append, the own row
     * too): the same rows, so the f32 bound holds outside the tensor-core kernel */
    test_kv = KV_DTYPE_F16;
    attention_case("f16 KV: attention H4 Hkv2 Dh16 prefill/mixed/decode", 4, 2, 16, 0, mixed, 7, 64, TOL_F32);
    attention_case("f16 KV: attention H4 Hkv2 Dh64 window 100, 300+ positions", 4, 2, 64, 100, longer, 7, 1024, TOL_F32);
    attention_case("f16 KV: attention H4 Hkv4 Dh96 window 7 tiled", 4, 4, 96, 7, tiled, 7, 512, TOL_F32);
    attention_case("f16 KV: attention H2 Hkv1 Dh8 window 50 tiled", 2, 1, 8, 50, tiled, 7, 512, TOL_F32);
    attention_case("f16 KV: attention H4 Hkv2 Dh6 (per-position kernel)", 4, 2, 6, 0, mixed, 7, 64, TOL_F32);
    attention_case("f16 KV: attention H16 Hkv8 Dh128 600+ positions (warp kernel)", 16, 8, 128, 0, long_ctx, 5, 1024,
                   TOL_F32);
    setenv("LLMOPT_CUDA_ATT_DEC", "8,8", 1);
    attention_case("f16 KV: attention H32 Hkv8 Dh128 600+ positions (cluster decode 8,8)", 32, 8, 128, 0, long_ctx, 5,
                   1024, TOL_F32);
    attention_case("f16 KV: attention H16 Hkv8 Dh128 600+ positions (cluster decode 8,8)", 16, 8, 128, 0, long_ctx, 5,
                   1024, TOL_F32);
    unsetenv("LLMOPT_CUDA_ATT_DEC");
    setenv("LLMOPT_CUDA_ATT_WARP", "0", 1);
    attention_case("f16 KV: attention H4 Hkv2 Dh64 300+ positions, per-position", 4, 2, 64, 0, longer, 7, 1024, TOL_F32);
    unsetenv("LLMOPT_CUDA_ATT_WARP");
    unsetenv("LLMOPT_CUDA_ATT_MMA");
    attention_case("f16 KV: attention H8 Hkv2 Dh128 tensor cores", 8, 2, 128, 0, tiled, 7, 512, TOL_HALF);
    attention_case("f16 KV: attention H6 Hkv2 Dh64 window 50 tensor cores", 6, 2, 64, 50, tiled, 7, 512, TOL_HALF);
    attention_case("f16 KV: attention H16 Hkv4 Dh128 600+ positions tensor cores", 16, 4, 128, 0, long_ctx, 5, 1024,
                   TOL_HALF);
    attention_case("f16 KV: attention H4 Hkv4 Dh96 window 7 tensor cores", 4, 4, 96, 7, tiled, 7, 512, TOL_HALF);
    /* q8_0 caches on both sides (each 32 of a row quantized by ggml's rule on append, the
     * own row too, so the same rows): the f32 bound outside the tensor-core kernel; the
     * warp kernel for decode and per-token batches at 4 and 8 warps a block, the tiled
     * kernel for prefill with LLMOPT_CUDA_ATT_MMA=0 and head dim 32, else the tensor-core
     * one (the quants copied, their scales loaded beside the copies, bf16 rows) */
    test_kv = KV_DTYPE_Q8_0;
    setenv("LLMOPT_CUDA_ATT_MMA", "0", 1);
    attention_case("q8_0 KV: attention H8 Hkv8 Dh128 prefill/mixed/decode", 8, 8, 128, 0, mixed, 7, 64, TOL_F32);
    attention_case("q8_0 KV: attention H6 Hkv1 Dh64 window 4", 6, 1, 64, 4, mixed, 7, 64, TOL_F32);
    attention_case("q8_0 KV: attention H8 Hkv2 Dh128 tiled prefill", 8, 2, 128, 0, tiled, 7, 512, TOL_F32);
    attention_case("q8_0 KV: attention H4 Hkv4 Dh96 window 7 tiled", 4, 4, 96, 7, tiled, 7, 512, TOL_F32);
    for (int i = 0; i < 2; i++) {
        const char *k = "warp kernel, warps", *sh = warp_shapes[i];
        setenv("LLMOPT_CUDA_ATT_WARPS", sh, 1);
        attention_case_as("q8_0 KV: attention H32 Hkv8 Dh128 600+ positions", k, sh, 32, 8, 128, 0, long_ctx, 5, 1024,
                          TOL_F32);
        attention_case_as("q8_0 KV: attention H4 Hkv2 Dh64 window 100, 300+ positions", k, sh, 4, 2, 64, 100, longer, 7,
                          1024, TOL_F32);
    }
    unsetenv("LLMOPT_CUDA_ATT_WARPS");
    unsetenv("LLMOPT_CUDA_ATT_MMA");
    attention_case("q8_0 KV: attention H4 Hkv2 Dh32 window 50 tiled (no tensor-core shape)", 4, 2, 32, 50, tiled, 7,
                   512, TOL_F32);
    attention_case("q8_0 KV: attention H8 Hkv2 Dh128 tensor cores", 8, 2, 128, 0, tiled, 7, 512, TOL_HALF);
    attention_case("q8_0 KV: attention H4 Hkv4 Dh96 window 7 tensor cores", 4, 4, 96, 7, tiled, 7, 512, TOL_HALF);
    attention_case("q8_0 KV: attention H6 Hkv2 Dh64 window 50 tensor cores", 6, 2, 64, 50, tiled, 7, 512, TOL_HALF);
    attention_case("q8_0 KV: attention H16 Hkv4 Dh128 600+ positions tensor cores", 16, 4, 128, 0, long_ctx, 5, 1024,
                   TOL_HALF);
    test_kv = KV_DTYPE_F32;
}

/* ---- decode fusion ------------------------------------------------------------------ */

static int32_t gb_norm(struct gb *b, int32_t x, int64_t d) {
    int32_t in[2] = {x, gb_param(b, IR_DTYPE_F32, 0, d, 1.0f)};
    int32_t y = gb_add(b, IR_OP_RMS_NORM, in, 2);
    if (b->ok) b->g.nodes[y].attrs.value = 1e-6;
    return gb_infer(b, y);
}

static int32_t gb_linear(struct gb *b, int32_t x, enum ir_dtype t, int64_t rows, int64_t cols, uint32_t flags,
                         enum ir_op act, int32_t extra) {
    int32_t in[3] = {x, gb_param(b, t, rows, cols, 2.0f / sqrtf((float)cols)), extra};
    int32_t y = gb_add(b, IR_OP_LINEAR, in, extra >= 0 ? 3 : 2);
    if (b->ok) {
        b->g.nodes[y].attrs.linear_flags = flags;
        b->g.nodes[y].attrs.linear_act = act;
    }
    return gb_infer(b, y);
}

/* [N, H*Dh] -> [1, N, H, Dh] -> (qk_norm) -> permute [1, H, N, Dh] (-> rope) */
static int32_t gb_heads_of(struct gb *b, int32_t x, int64_t h, int64_t dh, bool norm, int32_t cs, int32_t sn) {
    int32_t r = gb_reshape(b, x, SHAPE(DC(1), DN(1), DC(h), DC(dh)));
    if (norm) r = gb_norm(b, r, dh);
    int32_t p = gb_permute(b, r, 4, (const int[]){0, 2, 1, 3});
    if (cs < 0) return p;
    int32_t in[3] = {p, cs, sn};
    return gb_infer(b, gb_add(b, IR_OP_ROPE, in, 3));
}

/* Two pre-norm transformer blocks shaped like the models' (Qwen3 with qk_norm, Llama
 * without): q/k/v of one x, [norm ->] permute -> rope, attention, o with a residual,
 * SwiGLU gate/up of one x, down with a residual. Small batches run the fused schedule
 * (one launch for q/k/v with v written head-major, one for both ropes, one for
 * gate/up); the 20-token batch runs unfused in the same session. */
static double fusion_tol; /* when not 0: fusion_case's tolerance (int8 x) */
static bool fusion_long;  /* fusion_case over 600+ positions (split decode attention, several groups a warp) */
static int fusion_tv = -1; /* when >= 0: the type of v and ffn_down (as Q4_K_M files mix q4_K and q6_K) */

static void fusion_case(enum ir_dtype t, int64_t dm, int64_t h, int64_t hkv, int64_t dh, int64_t ff, bool qk_norm,
                        bool v_bias, bool with_prefill, bool norm_prologue) {
    const enum ir_dtype tv = fusion_tv >= 0 ? (enum ir_dtype)fusion_tv : t;
    const bool kq = t == IR_DTYPE_Q4_K || t == IR_DTYPE_Q5_K || t == IR_DTYPE_Q6_K; /* int8 x: TOL_INT8 */
    struct gb b;
    gb_init(&b);
    b.vocab = 200;
    int32_t x = gb_source(&b, dm, 1.0f);
    int32_t cs = gb_reshape(&b, gb_source(&b, dh, 1.0f), SHAPE(DC(1), DC(1), DN(1), DC(dh)));
    int32_t sn = gb_reshape(&b, gb_source(&b, dh, 1.0f), SHAPE(DC(1), DC(1), DN(1), DC(dh)));
    for (int layer = 0; layer < 2; layer++) {
        int32_t hn = gb_norm(&b, x, dm);
        int32_t q = gb_linear(&b, hn, t, h * dh, dm, 0, IR_OP_INPUT, -1);
        int32_t k = gb_linear(&b, hn, t, hkv * dh, dm, 0, IR_OP_INPUT, -1);
        int32_t v = gb_linear(&b, hn, tv, hkv * dh, dm, v_bias ? IR_LINEAR_BIAS : 0, IR_OP_INPUT,
                              v_bias ? gb_param(&b, IR_DTYPE_F32, 0, hkv * dh, 1.0f) : -1);
        int32_t in[5] = {gb_heads_of(&b, q, h, dh, qk_norm, cs, sn), gb_heads_of(&b, k, hkv, dh, qk_norm, cs, sn),
                         gb_heads_of(&b, v, hkv, dh, false, -1, -1), b.g.inputs[IR_INPUT_POSITIONS],
                         b.g.inputs[IR_INPUT_SEQ_SLOTS]};
        int32_t a = gb_add(&b, IR_OP_ATTENTION, in, 5);
        if (b.ok) {
            b.g.nodes[a].attrs.value = 1.0 / sqrt((double)dh);
            b.g.nodes[a].attrs.kv_layer = layer;
        }
        gb_infer(&b, a);
        b.g.n_kv_layers++;
        a = gb_reshape(&b, a, SHAPE(DN(1), DC(h * dh)));
        int32_t o = gb_linear(&b, a, t, dm, h * dh, IR_LINEAR_RESIDUAL, IR_OP_INPUT, x);
        int32_t h2 = gb_norm(&b, o, dm);
        int32_t u = gb_linear(&b, h2, t, ff, dm, 0, IR_OP_INPUT, -1);
        int32_t gt = gb_linear(&b, h2, t, ff, dm, IR_LINEAR_GATE, IR_OP_SILU, u);
        x = gb_linear(&b, gt, tv, dm, ff, IR_LINEAR_RESIDUAL, IR_OP_INPUT, o);
    }
    static const struct batch_spec small[] = {{4, 1, 1}, {1, 1, 1}, {1, 1, 1}, {3, 2, 2}, {8, 2, 2}, {1, 1, 1}, {1, 1, 1}};
    static const struct batch_spec mixed[] = {{4, 1, 1}, {1, 1, 1}, {20, 2, 2}, {1, 1, 1}, {3, 3, 3}, {1, 1, 1}};
    static const struct batch_spec longer[] = {{300, 1, 1}, {300, 1, 1}, {1, 1, 1}, {1, 1, 1}, {3, 1, 1}, {1, 1, 1}};
    const struct batch_spec *steps = fusion_long ? longer : with_prefill ? mixed : small;
    const int n_steps = fusion_long || with_prefill ? 6 : 7;
    char what[96];
    uint64_t kernels[2] = {0, 0};
    /* the 20-token step's f16/bf16 products run through cuBLAS with x rounded to f16/bf16 */
    double tol = fusion_tol > 0                                                   ? fusion_tol
                 : kq                                                          ? TOL_INT8
                 : with_prefill && (t == IR_DTYPE_F16 || t == IR_DTYPE_BF16) ? TOL_HALF
                                                                             : TOL_F32;
    for (int unfused = 0; unfused < 2; unfused++) { /* the fused schedule, then the A/B switch off */
        snprintf(what, sizeof what, "%s %s%s%s H%lld/%lld Dh%lld%s%s%s%s%s", unfused ? "unfused" : "fused",
                 ir_dtype_name(t), tv != t ? "/" : "", tv != t ? ir_dtype_name(tv) : "", (long long)h, (long long)hkv,
                 (long long)dh, qk_norm ? " qk_norm" : "", v_bias ? " v_bias" : "",
                 fusion_long ? " 600+ positions" : with_prefill ? " +20 tokens" : "", norm_prologue ? " norm prologue" : "",
                 test_kv == KV_DTYPE_F16 ? " f16 KV" : "");
        if (unfused) setenv("LLMOPT_CUDA_FUSE", "0", 1);
        setenv("LLMOPT_CUDA_ATT_MMA", "0", 1); /* f32 attention in the 20-token batch: the f32 bound */
        setenv("LLMOPT_CUDA_FUSE_NORM", norm_prologue ? "1" : "0", 1); /* the block norms inside the matvecs, or not */
        compare_graph(what, &b, x, steps, n_steps, fusion_long ? 1024 : 64, tol);
        kernels[unfused] = last_kernels_run;
        unsetenv("LLMOPT_CUDA_FUSE");
        unsetenv("LLMOPT_CUDA_FUSE_NORM");
        unsetenv("LLMOPT_CUDA_ATT_MMA");
    }
    /* per layer and fused step: k and v products, v's permute, the q/k chains (norm,
     * permute, rope twice -> one launch), the up product; and in one-token steps that
     * launch too (inside the attention kernel; head dims here: multiples of 4, <= 128) */
    uint64_t fused_steps = 0, one_token = 0;
    for (int k = 0; k < n_steps; k++) {
        fused_steps += steps[k].n <= 16;
        one_token += steps[k].n == 1;
    }
    uint64_t saved = (uint64_t)(2 * (qk_norm ? 9 : 7)) * fused_steps + 2 * one_token;
    CHECK_MSG(kernels[0] + saved == kernels[1], "%s: %llu kernels fused, %llu unfused (expected %llu fewer)", what,
              (unsigned long long)kernels[0], (unsigned long long)kernels[1], (unsigned long long)saved);
    if (with_prefill) { /* the 20-token step: each layer's q/k chains as one launch each, v's
                         * permute skipped, norms and SwiGLU products writing the next
                         * cuBLAS operand; or none of it */
        setenv("LLMOPT_CUDA_ATT_MMA", "0", 1);
        setenv("LLMOPT_CUDA_PF_FUSE", "0", 1);
        setenv("LLMOPT_CUDA_FUSE_NORM", norm_prologue ? "1" : "0", 1);
        snprintf(what, sizeof what, "fused %s H%lld/%lld Dh%lld%s +20 tokens, prefill chains off", ir_dtype_name(t),
                 (long long)h, (long long)hkv, (long long)dh, qk_norm ? " qk_norm" : "");
        compare_graph(what, &b, x, mixed, 6, 64, tol);
        uint64_t pf_saved = 2u * (qk_norm ? 5u : 3u); /* + v's permute, read by the append */
        CHECK_MSG(kernels[0] + pf_saved == last_kernels_run, "%s: %llu kernels, %llu with the chains (expected %llu fewer)",
                  what, (unsigned long long)last_kernels_run, (unsigned long long)kernels[0],
                  (unsigned long long)pf_saved);
        unsetenv("LLMOPT_CUDA_PF_FUSE");
        unsetenv("LLMOPT_CUDA_FUSE_NORM");
        unsetenv("LLMOPT_CUDA_ATT_MMA");
    }
    gb_free(&b);
}

static void test_decode_fusion(void) {
    cu_matvec_q8_x(0); /* f32 x (test_linear_q8x: int8) */
    fusion_case(IR_DTYPE_F32, 256, 4, 2, 64, 512, true, false, true, false);
    fusion_case(IR_DTYPE_Q8_0, 512, 8, 4, 128, 1024, true, true, false, false);
    fusion_case(IR_DTYPE_BF16, 512, 8, 2, 128, 768, true, false, false, false);
    fusion_case(IR_DTYPE_Q4_0, 256, 4, 4, 64, 512, false, false, false, false);
    fusion_case(IR_DTYPE_F16, 256, 2, 1, 32, 256, false, true, false, false);
    fusion_case(IR_DTYPE_Q8_0, 512, 8, 4, 128, 1024, true, true, false, true);
    fusion_case(IR_DTYPE_F32, 256, 4, 2, 64, 512, false, false, true, true);
    fusion_case(IR_DTYPE_BF16, 512, 8, 2, 128, 768, true, false, true, false);
    fusion_case(IR_DTYPE_F16, 256, 2, 1, 32, 256, false, true, true, false);
    /* head dim 60 (% 8 == 4): the warp kernel rotates q/k in shared memory, not in registers */
    fusion_case(IR_DTYPE_F32, 256, 4, 2, 60, 512, true, false, false, false);
    /* one-token steps at 600+ positions: q/k rotated by the attention kernel (the warp
     * kernel's 9 splits of 2 groups a warp, then the cluster kernel); the 3-token step
     * launches the chains apart */
    fusion_long = true;
    fusion_case(IR_DTYPE_F32, 256, 32, 8, 128, 256, true, false, false, false);
    fusion_case(IR_DTYPE_F32, 256, 16, 8, 64, 256, false, false, false, true);
    setenv("LLMOPT_CUDA_ATT_DEC", "8,8", 1); /* the cluster kernel's norm+rope */
    fusion_case(IR_DTYPE_F32, 256, 32, 8, 128, 256, true, false, false, false);
    fusion_case(IR_DTYPE_F32, 256, 16, 8, 64, 256, false, false, false, true);
    unsetenv("LLMOPT_CUDA_ATT_DEC");
    setenv("LLMOPT_CUDA_ATT_WARPS", "8", 1); /* the warp kernel at 8 warps a block */
    fusion_case(IR_DTYPE_F32, 256, 32, 8, 128, 256, true, false, false, false);
    setenv("LLMOPT_CUDA_ATT_WARPS", "4", 1);
    fusion_case(IR_DTYPE_F32, 256, 32, 8, 128, 256, true, false, false, false);
    unsetenv("LLMOPT_CUDA_ATT_WARPS");
    /* the same through f16 caches: a last-bit f32 difference in layer 0's output can flip
     * an f16 rounding of layer 1's K/V rows (seen: 1.5e-5 in the 300-token step) */
    test_kv = KV_DTYPE_F16;
    fusion_tol = 1e-4;
    fusion_case(IR_DTYPE_F32, 256, 32, 8, 128, 256, true, false, false, false);
    /* and q8_0 caches (the own k row rotated, then quantized, by the attention kernel):
     * such a flip there moves a value by a quant step, amax / 127 of its 32 */
    test_kv = KV_DTYPE_Q8_0;
    fusion_tol = TOL_HALF;
    fusion_case(IR_DTYPE_F32, 256, 32, 8, 128, 256, true, false, false, false);
    fusion_case(IR_DTYPE_F32, 256, 16, 8, 64, 256, false, false, false, true);
    fusion_tol = 0;
    test_kv = KV_DTYPE_F32;
    fusion_long = false;
    /* K-quants (cu_matvec_kq_multi): one type, then q4_K with a q6_K v and ffn_down (a
     * q/k/v launch of mixed segments), with and without the rms_norm prologue, launch
     * shapes (rows a warp, next loads in flight or not, one block an SM) */
    fusion_case(IR_DTYPE_Q4_K, 512, 8, 4, 64, 768, true, false, false, true);
    fusion_case(IR_DTYPE_Q6_K, 512, 4, 2, 128, 512, false, true, true, false);
    fusion_tv = IR_DTYPE_Q6_K;
    fusion_case(IR_DTYPE_Q4_K, 512, 8, 4, 64, 768, true, false, false, true);
    cu_kq_tune(1, 2, 0);
    fusion_case(IR_DTYPE_Q4_K, 1024, 8, 2, 128, 1536, true, false, true, false);
    cu_kq_tune(2, 1, 1);
    fusion_case(IR_DTYPE_Q6_K, 512, 8, 4, 64, 768, true, false, false, true);
    cu_kq_tune(0, 0, 0);
    /* the 3- and 8-token steps on tensor cores (cu_matvec_kq_mma): q4_K q/k with a q6_K v
     * (mixed segments), the q4_K pair, a q6_K ffn_down of K = 2048; then one type, a
     * q6_K pair */
    fusion_case(IR_DTYPE_Q4_K, 1024, 8, 2, 128, 2048, true, false, false, true);
    fusion_case(IR_DTYPE_Q4_K, 1024, 8, 2, 128, 2048, true, false, false, false);
    fusion_tv = -1;
    fusion_case(IR_DTYPE_Q6_K, 1024, 8, 4, 128, 2048, true, false, false, true);
    cu_matvec_q8_x(-1);
}

/* The q8_0 matvec with int8 x (cu_matvec_q8_x: the default takes it for launches with
 * the rms_norm prologue and plain ones with K <= 4096; mode 1 wherever the row fits in
 * shared memory): x rounded to 8 bits per block of 32 (step amax / 127, so the error of
 * an element is at most amax / 254, about 0.4% of the row's rms for uniform or Gaussian
 * x) changes each output by ~4e-3 relative; against the f32 reference the checks take
 * TOL_INT8 as the K-quants' int8 x does (the 37x512 case with gate and residual measured
 * 1.06e-2 once on the H200, over 1e-2), at batches of 1 to 70 rows (more than one row
 * keeps f32 x). Against
 * the CPU's default backend, whose q8_0 kernels quantize activations by the same rule
 * (f32 d = amax / 127, round half to even), one-row steps must agree to f32 summation
 * order (1e-4); after an rms_norm (the prologue in f32 on the GPU, a separate kernel on
 * the CPU: a rare element may round the other way) to 1e-3. The two-layer decode
 * blocks: 2e-2 against the CPU, since their steps of several rows (and the KV cache
 * those fill) have f32 x here and int8 x there: six rounded products a layer, each
 * ~4e-3; measured up to 1.07e-2 on the H200. */
static void q8x_vs_cpu(const struct linear_case *lc, bool norm, int steps) {
    static const struct batch_spec ones[] = {{1, 1, 1}, {1, 1, 1}, {1, 1, 1}};
    ref_backend = &cpu_backend_ops;
    struct gb b;
    gb_init(&b);
    int32_t x = gb_source(&b, lc->k, 1.0f);
    if (norm) x = gb_norm(&b, x, lc->k);
    int32_t y = gb_linear(&b, x, IR_DTYPE_Q8_0, lc->n_out, lc->k, 0, IR_OP_INPUT, -1);
    char what[96];
    snprintf(what, sizeof what, "linear q8_0 %lldx%lld int8 x%s vs cpu", (long long)lc->n_out, (long long)lc->k,
             norm ? " +norm" : "");
    compare_graph(what, &b, y, ones, steps, 64, norm ? 1e-3 : 1e-4);
    gb_free(&b);
    ref_backend = &cpu_ref_backend_ops;
}

/* Products of several rows on int8 tensor cores. q8_0 against the CPU's q8_0 kernels,
 * which round x to int8 per 32 by the same rule: 9-64 rows (cu_linear_q8_mma; partial
 * 16-row tiles, x rows past a multiple of 8, the epilogue pass after it) or 2-8 rows
 * (mv_mma_kernel inside the decode fusion's matvec, with the rms_norm prologue when
 * `norm`: 1e-3 as for one row, the prologue's f32 against the CPU's norm kernel).
 * q4_K/q6_K (lc->wt), 2-8 rows (few): against the f32 reference at TOL_INT8, as every
 * int8-x K-quant product (the CPU's own round x per 256). */
static void mma_rows_check(const struct linear_case *lc, bool norm, bool few) {
    static const struct batch_spec many[] = {{9, 9, 1}, {16, 16, 1}, {33, 33, 1}, {64, 64, 1}, {12, 12, 1}};
    static const struct batch_spec fewer[] = {{2, 2, 1}, {8, 8, 1}, {5, 5, 1}, {3, 3, 1}};
    const bool kq = lc->wt != IR_DTYPE_Q8_0;
    if (!kq) ref_backend = &cpu_backend_ops;
    struct gb b;
    gb_init(&b);
    int32_t x = gb_source(&b, lc->k, 1.0f);
    if (norm) x = gb_norm(&b, x, lc->k);
    int32_t in[5] = {x, gb_param(&b, lc->wt, lc->n_out, lc->k, 1.0f)};
    int n_in = 2;
    if (lc->flags & IR_LINEAR_BIAS) in[n_in++] = gb_param(&b, IR_DTYPE_F32, 0, lc->n_out, 1.0f);
    if (lc->flags & IR_LINEAR_GATE) in[n_in++] = gb_source(&b, lc->n_out, 1.0f);
    if (lc->flags & IR_LINEAR_RESIDUAL) in[n_in++] = gb_source(&b, lc->n_out, 1.0f);
    int32_t y = gb_add(&b, IR_OP_LINEAR, in, n_in);
    if (b.ok) {
        b.g.nodes[y].attrs.linear_flags = lc->flags;
        b.g.nodes[y].attrs.linear_act = lc->act;
    }
    gb_infer(&b, y);
    char what[112];
    snprintf(what, sizeof what, "linear %s %lldx%lld fl%u%s %s rows (mma) vs %s", ir_dtype_name(lc->wt),
             (long long)lc->n_out, (long long)lc->k, lc->flags, norm ? " +norm" : "", few ? "2-8" : "9-64",
             kq ? "f32" : "cpu");
    compare_graph(what, &b, y, few ? fewer : many, few ? 4 : 5, 64, kq ? TOL_INT8 : norm ? 1e-3 : 1e-4);
    gb_free(&b);
    ref_backend = &cpu_ref_backend_ops;
}

static void test_linear_q8x(void) {
    struct linear_case cases[] = {
        {IR_DTYPE_Q8_0, 256, 48, 0, IR_OP_INPUT},
        {IR_DTYPE_Q8_0, 512, 37, IR_LINEAR_BIAS | IR_LINEAR_GATE | IR_LINEAR_RESIDUAL, IR_OP_SILU},
        {IR_DTYPE_Q8_0, 1024, 130, IR_LINEAR_RESIDUAL, IR_OP_INPUT},
        {IR_DTYPE_Q8_0, 4096, 9, 0, IR_OP_INPUT},
        {IR_DTYPE_Q8_0, 256, 4100, IR_LINEAR_BIAS, IR_OP_INPUT},
        {IR_DTYPE_Q8_0, 3072, 1030, IR_LINEAR_RESIDUAL, IR_OP_INPUT},
        {IR_DTYPE_Q8_0, 1024, 16400, 0, IR_OP_INPUT}, /* many short rows (lm_head): 4 rows x 4 loads, a tail */
    };
    const int n_cases = (int)(sizeof cases / sizeof cases[0]);
    for (int m = -1; m <= 1; m += 2) {
        cu_matvec_q8_x(m);
        linear_small_tol = TOL_INT8;
        for (int c = 0; c < n_cases; c++) run_linear_case(&cases[c], false);
        /* a row too long for shared memory keeps f32 x in both modes (f32 sums of 45056
         * products alone differ by ~1e-5) */
        linear_small_tol = 5e-5;
        struct linear_case wide = {IR_DTYPE_Q8_0, 45056, 9, 0, IR_OP_INPUT};
        run_linear_case(&wide, false);
        linear_small_tol = 0;
        for (int c = 0; c < 2 * n_cases; c++) /* each case plain, then after an rms_norm (the prologue) */
            q8x_vs_cpu(&cases[c % n_cases], c >= n_cases, 3);
        const struct linear_case mma[] = {{IR_DTYPE_Q8_0, 32, 16, 0, IR_OP_INPUT},
                                          {IR_DTYPE_Q8_0, 128, 40, IR_LINEAR_BIAS, IR_OP_INPUT},
                                          {IR_DTYPE_Q8_0, 1024, 1000, IR_LINEAR_RESIDUAL, IR_OP_INPUT},
                                          {IR_DTYPE_Q8_0, 4096, 300, 0, IR_OP_INPUT}};
        for (size_t c = 0; c < sizeof mma / sizeof mma[0]; c++) mma_rows_check(&mma[c], false, false);
        /* 2-8 rows: each case plain and after an rms_norm, on tensor cores (the default)
         * and by the dp4a loop (cu_matvec_mma 0); then with 3 blocks, so each block takes
         * many tiles in turn */
        for (int on = 1; on >= 0; on--) {
            cu_matvec_mma(on);
            for (int c = 0; c < 2 * n_cases; c++) mma_rows_check(&cases[c % n_cases], c >= n_cases, true);
        }
        cu_matvec_mma(1);
        /* 8 staged rows of K = 12288 (110.8 KiB of shared memory beside the rings) */
        const struct linear_case long_rows = {IR_DTYPE_Q8_0, 12288, 40, IR_LINEAR_RESIDUAL, IR_OP_INPUT};
        mma_rows_check(&long_rows, false, true);
        /* K = 416, not a multiple of 128: the dp4a loop */
        const struct linear_case odd_k = {IR_DTYPE_Q8_0, 416, 50, IR_LINEAR_BIAS, IR_OP_INPUT};
        mma_rows_check(&odd_k, true, true);
        cu_matvec_persist(-1, 3);
        for (int c = 0; c < 3; c++) mma_rows_check(&cases[c + 1], c == 1, true);
        cu_matvec_persist(-1, 0);
        /* rings of 2 and 3 stages (the default: 4, pairs 3), with the fused blocks' pairs */
        for (int stages = 2; stages <= 3; stages++) {
            cu_matvec_mma_stages(stages);
            for (int c = 0; c < 3; c++) mma_rows_check(&cases[c + 1], c == 1, true);
            ref_backend = &cpu_backend_ops;
            fusion_tol = 2e-2;
            fusion_case(IR_DTYPE_Q8_0, 512, 8, 4, 128, 1024, true, true, false, true);
            fusion_tol = 0;
            ref_backend = &cpu_ref_backend_ops;
        }
        cu_matvec_mma_stages(0);
        ref_backend = &cpu_backend_ops;
        fusion_tol = 2e-2;
        fusion_case(IR_DTYPE_Q8_0, 512, 8, 4, 128, 1024, true, true, false, true);
        fusion_case(IR_DTYPE_Q8_0, 512, 8, 4, 128, 1024, true, true, false, false);
        fusion_tol = 0;
        ref_backend = &cpu_ref_backend_ops;
    }
    /* the rms_norm prologue's older two passes over x (cu_matvec_x_regs 0; K <= 4096 take
     * the register prologue by default): the same rule, so the same bound */
    cu_matvec_x_regs(0);
    for (int c = 0; c < n_cases; c++) q8x_vs_cpu(&cases[c], true, 2);
    cu_matvec_x_regs(1);
    cu_matvec_q8_x(-1);
}

/* kernels_linear.cu: the one-row matvec's launch shape (C linkage, cuda_kernels.cuh) */
void cu_matvec_tune(int nr, int lif, int64_t warps);

/* The one-row matvec checks run at each launch setting below: the linear cases (1 to 70
 * rows) for each of `types`, the fused decode blocks (q/k/v segments, SwiGLU pair,
 * rms_norm prologue; f16 too when asked), and int8 x (one-row steps against the CPU's
 * q8_0 kernels, plain and after a norm, and a fused block). Leaves q8_0 on int8 x. */
static void matvec_setting_checks(const enum ir_dtype *types, size_t n_types, bool f16_block) {
    cu_matvec_q8_x(0);
    for (size_t d = 0; d < n_types; d++) {
        struct linear_case cases[] = {
            {types[d], 512, 37, IR_LINEAR_BIAS | IR_LINEAR_GATE | IR_LINEAR_RESIDUAL, IR_OP_SILU},
            {types[d], 1024, 130, IR_LINEAR_RESIDUAL, IR_OP_INPUT},
            {types[d], 4096, 9, 0, IR_OP_INPUT},
            {types[d], 256, 4100, IR_LINEAR_BIAS, IR_OP_INPUT}, /* the default's 4 rows a warp, a tail */
        };
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) run_linear_case(&cases[c], false);
    }
    fusion_case(IR_DTYPE_BF16, 512, 8, 2, 128, 768, true, false, false, false);
    fusion_case(IR_DTYPE_Q8_0, 512, 8, 4, 128, 1024, true, true, false, true);
    if (f16_block) fusion_case(IR_DTYPE_F16, 256, 2, 1, 32, 256, false, true, true, false);
    struct linear_case q8x[] = {{IR_DTYPE_Q8_0, 1024, 130, 0, IR_OP_INPUT}, {IR_DTYPE_Q8_0, 256, 4100, 0, IR_OP_INPUT}};
    cu_matvec_q8_x(1);
    for (int c = 0; c < 4; c++) q8x_vs_cpu(&q8x[c % 2], c >= 2, 2);
    ref_backend = &cpu_backend_ops;
    fusion_tol = 2e-2;
    fusion_case(IR_DTYPE_Q8_0, 512, 8, 4, 128, 1024, true, true, false, true);
    fusion_tol = 0;
    ref_backend = &cpu_ref_backend_ops;
}

/* The default and every launch shape of the one-row matvec (output rows a warp 1/2/4,
 * loads in flight 4/8/16, split K), bf16 and q8_0 (the types with every shape) and f32 */
static void test_matvec_shapes(void) {
    static const int tunes[][3] = {{0, 0, 0}, {1, 8, 0}, {1, 16, 0}, {2, 4, 0}, {2, 8, 0},
                                   {2, 16, 0}, {4, 4, 0}, {4, 8, 0}, {4, 16, 16384}};
    static const enum ir_dtype types[] = {IR_DTYPE_BF16, IR_DTYPE_Q8_0, IR_DTYPE_F32};
    for (size_t t = 0; t < sizeof tunes / sizeof tunes[0]; t++) {
        cu_matvec_tune(tunes[t][0], tunes[t][1], tunes[t][2]);
        matvec_setting_checks(types, sizeof types / sizeof types[0], false);
    }
    cu_matvec_tune(0, 0, 0);
    cu_matvec_q8_x(-1);
}

/* kernels_linear.cu: persistent matvec launches (C linkage, cuda_kernels.cuh) */
/* Persistent launches on every one-row matvec, on grids capped at 3 and 1 blocks (each
 * block takes many row groups: the prologue's shared memory reused), at 3 blocks with K
 * split for 16384 warps (cu_matvec_tune; the split-K partials reused too), and as large
 * as fits: bf16, q8_0 (f32 and int8 x), f32, f16 and q4_0, fresh random inputs each. */
static void test_matvec_persist(void) {
    static const int caps[][2] = {{3, 0}, {1, 0}, {3, 16384}, {0, 0}}; /* blocks, split-K warps */
    static const enum ir_dtype types[] = {IR_DTYPE_BF16, IR_DTYPE_Q8_0, IR_DTYPE_F32, IR_DTYPE_F16, IR_DTYPE_Q4_0};
    for (size_t c = 0; c < sizeof caps / sizeof caps[0]; c++) {
        cu_matvec_persist(1, caps[c][0]);
        cu_matvec_tune(0, 0, caps[c][1]);
        matvec_setting_checks(types, sizeof types / sizeof types[0], true);
    }
    cu_matvec_persist(-1, 0);
    cu_matvec_tune(0, 0, 0);
    cu_matvec_q8_x(-1);
}

/* kernels_stream.cu: the staged matvec (C linkage, cuda_kernels.cuh) */
void cu_matvec_tma(int mode);
void cu_matvec_tma_tune(int rows_per_tile, int smem_kb, int blocks_per_sm, int evict_first, int max_blocks, int wait,
                        int producers, int row_copies);

/* The staged matvec on q4_K and q6_K launches (int8 x, TOL_INT8 as test_linear_kquant):
 * rows of 2048 and 4096 (one and two passes of a warp's 8 super-blocks; q6_K takes
 * K % 2048 == 0, whole 16-byte runs of its super-block scales), epilogues, a tail of
 * 4100 rows; the two-layer decode blocks at a model width of 2048 (q/k/v in one launch,
 * also q4_K q/k with q6_K v and ffn_down, the SwiGLU pair, the rms_norm prologue). */
static void matvec_tma_kquant_checks(void) {
    struct linear_case cases[] = {
        {IR_DTYPE_Q4_K, 2048, 37, IR_LINEAR_BIAS | IR_LINEAR_GATE | IR_LINEAR_RESIDUAL, IR_OP_SILU},
        {IR_DTYPE_Q4_K, 4096, 130, IR_LINEAR_RESIDUAL, IR_OP_INPUT},
        {IR_DTYPE_Q4_K, 256, 4100, IR_LINEAR_BIAS, IR_OP_INPUT},
        {IR_DTYPE_Q6_K, 2048, 37, IR_LINEAR_BIAS | IR_LINEAR_GATE | IR_LINEAR_RESIDUAL, IR_OP_SILU},
        {IR_DTYPE_Q6_K, 4096, 9, 0, IR_OP_INPUT},
        {IR_DTYPE_Q6_K, 2048, 1030, IR_LINEAR_RESIDUAL, IR_OP_INPUT},
    };
    linear_small_tol = TOL_INT8;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) run_linear_case(&cases[c], false);
    linear_small_tol = 0;
    fusion_case(IR_DTYPE_Q4_K, 2048, 8, 4, 64, 2048, true, false, false, true);
    fusion_case(IR_DTYPE_Q6_K, 2048, 4, 2, 128, 2048, false, true, false, false);
    fusion_tv = IR_DTYPE_Q6_K;
    fusion_case(IR_DTYPE_Q4_K, 2048, 8, 4, 64, 2048, true, false, false, true);
    fusion_tv = -1;
}

/* The staged one-row matvec (weights bulk-copied into a shared-memory ring) on every
 * one-row bf16, q8_0 and q4_K/q6_K launch it takes: the matvec checks, the int8-x group
 * and the K-quant checks at its default shape; at 1 row a tile in a 2-stage ring on 3
 * blocks (each block wraps its ring many times, the L2 hint on, spin waits, 2 producer
 * lanes, a copy a row); 8 rows a tile, two blocks an SM (waits with a suspend hint, 4
 * producers); 2 rows on 1 block (every tile, tails and segment ends, through one ring;
 * 4 producers, a copy a row). Fresh random inputs each. */
static void test_matvec_tma(void) {
    static const int tunes[][8] = {{0, 0, 0, -1, 0, -1, 1, 0}, {1, 24, 0, 1, 3, 1, 2, 1}, {8, 60, 2, 0, 0, 2, 4, 0},
                                   {2, 40, 0, -1, 1, 0, 4, 1}};
    static const enum ir_dtype types[] = {IR_DTYPE_BF16, IR_DTYPE_Q8_0};
    cu_matvec_tma(1);
    for (size_t t = 0; t < sizeof tunes / sizeof tunes[0]; t++) {
        cu_matvec_tma_tune(tunes[t][0], tunes[t][1], tunes[t][2], tunes[t][3], tunes[t][4], tunes[t][5], tunes[t][6],
                           tunes[t][7]);
        matvec_setting_checks(types, sizeof types / sizeof types[0], false);
        test_linear_q8x();
        matvec_tma_kquant_checks();
    }
    cu_matvec_tma_tune(0, 0, 0, -1, 0, -1, 1, 0);
    cu_matvec_tma(-1);
    cu_matvec_q8_x(-1);
}

static void test_short_conv(void) {
    static const struct batch_spec mixed[] = {{5, 1, 1}, {1, 1, 1}, {6, 2, 2}, {2, 2, 2}, {1, 1, 1}, {9, 3, 3}, {1, 1, 1}};
    enum ir_dtype types[] = {IR_DTYPE_F32, IR_DTYPE_BF16, IR_DTYPE_F16};
    int64_t klens[] = {3, 4, 2};
    for (int k = 0; k < 3; k++) {
        struct gb b;
        gb_init(&b);
        int64_t ch = 40;
        int32_t x = gb_reshape(&b, gb_source(&b, ch, 1.0f), SHAPE(DC(1), DN(1), DC(ch)));
        int32_t w = gb_param(&b, types[k], ch, klens[k], 1.0f);
        if (k == 2) w = gb_reshape(&b, w, SHAPE(DC(ch), DC(1), DC(klens[k])));
        int32_t in[4] = {x, w, b.g.inputs[IR_INPUT_POSITIONS], b.g.inputs[IR_INPUT_SEQ_SLOTS]};
        int32_t y = gb_add(&b, IR_OP_SHORT_CONV, in, 4);
        if (b.ok) b.g.nodes[y].attrs.kv_layer = 0;
        gb_infer(&b, y);
        b.g.n_conv_layers = 1;
        char what[64];
        snprintf(what, sizeof what, "short_conv %s L=%lld", ir_dtype_name(types[k]), (long long)klens[k]);
        compare_graph(what, &b, y, mixed, 7, 64, TOL_F32);
        gb_free(&b);
    }
}

/* ---- end to end: stories260K and the torch goldens ---------------------------------- */

static const char *stories_dir(void) {
    const char *d = getenv("LLMOPT_STORIES_DIR");
    return d && *d ? d : "../shared/models/stories260K";
}

/* path = stories260K-F32.gguf's; false (and a skip message) when it is not there. */
static bool stories_f32(char *path, size_t cap) {
    snprintf(path, cap, "%s/stories260K-F32.gguf", stories_dir());
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "  skip: %s not found (set LLMOPT_STORIES_DIR)\n", path);
        return false;
    }
    fclose(f);
    return true;
}

struct ids_out {
    int32_t ids[512];
    int32_t n;
};

static bool collect(void *user, int32_t id) {
    struct ids_out *o = user;
    if (o->n < 512) o->ids[o->n++] = id;
    return true;
}

static void test_stories_greedy(void) {
    char path[600], exp_path[600];
    if (!stories_f32(path, sizeof path)) return;
    snprintf(exp_path, sizeof exp_path, "%s/expected_greedy.json", stories_dir());
    struct llmopt_err err = {0};
    json_t *root = NULL;
    CHECK_MSG(json_load_file_capped(exp_path, 1u << 20, &root, &err) == LLMOPT_OK, "%s", err.msg);
    if (!root) return;
    const json_t *want = json_object_get(json_object_get(json_object_get(root, "runs"), "stories260K-F32.gguf"), "ids");
    struct llmopt_model *m = NULL;
    CHECK_MSG(llmopt_model_load(path, NULL, &m, &err) == LLMOPT_OK, "%s", err.msg);
    for (int graphs = 1; graphs >= 0 && m; graphs--) {
        if (!graphs) setenv("LLMOPT_CUDA_GRAPHS", "0", 1);
        struct llmopt_session *s = NULL;
        struct llmopt_session_opts so = {.backend = "cuda"};
        CHECK_MSG(llmopt_session_create(m, &so, &s, &err) == LLMOPT_OK, "%s", err.msg);
        if (!s) break;
        struct llmopt_sampling sp;
        llmopt_sampling_default(&sp);
        sp.temperature = 0;
        int32_t bos = 1;
        struct ids_out out = {.n = 0};
        struct llmopt_generate_result res;
        CHECK_MSG(llmopt_generate(s, 0, &bos, 1, 256, &sp, collect, &out, &res, &err) == LLMOPT_OK, "%s", err.msg);
        int32_t same = 0;
        while (same < out.n && same < (int32_t)json_array_size(want) &&
               out.ids[same] == json_integer_value(json_array_get(want, (size_t)same)))
            same++;
        CHECK_MSG(out.n == 256 && same == 256, "graphs %s: %d tokens, first %d equal the expected ids",
                  graphs ? "on" : "off", out.n, same);
        fprintf(stderr, "    stories260K F32 greedy on CUDA (graphs %s): %d/256 ids equal, decode %.0f tok/s\n",
                graphs ? "on" : "off", same, res.decode_seconds > 0 ? (res.n_generated - 1) / res.decode_seconds : 0.0);
        llmopt_session_free(s);
    }
    unsetenv("LLMOPT_CUDA_GRAPHS");
    /* the device argmax (append_greedy) against the host argmax of the logits path,
     * after a 40-token prompt in chunks of 32 (the prefill attention kernel) and 8 tokens
     * (a greedy append longer than the batch once crashed: its first chunk ran without a
     * logits pointer) */
    struct llmopt_session *sl = NULL, *sg = NULL;
    struct llmopt_session_opts so = {.backend = "cuda", .n_batch = 32};
    CHECK_MSG(m && llmopt_session_create(m, &so, &sl, &err) == LLMOPT_OK, "%s", err.msg);
    CHECK_MSG(m && llmopt_session_create(m, &so, &sg, &err) == LLMOPT_OK, "%s", err.msg);
    int32_t prompt[40], n_vocab = m ? llmopt_model_n_vocab(m) : 1, agree = 0, steps = 0;
    for (int i = 0; i < 40; i++) prompt[i] = (int32_t)(1 + rng_u32() % (uint32_t)(n_vocab - 1));
    const int32_t *in = prompt;
    int32_t n_in = 40, tok = 0;
    for (; sl && sg && steps < 64; steps++) {
        const float *logits = NULL;
        int32_t dev = -1;
        if (llmopt_session_append(sl, 0, in, n_in, &logits, &err) != LLMOPT_OK ||
            llmopt_session_append_greedy(sg, 0, in, n_in, &dev, &err) != LLMOPT_OK) {
            CHECK_MSG(0, "argmax step %d: %s", steps, err.msg);
            break;
        }
        int32_t best = 0;
        for (int32_t v = 1; v < n_vocab; v++)
            if (logits[v] > logits[best]) best = v;
        agree += best == dev;
        tok = dev;
        in = &tok;
        n_in = 1;
    }
    CHECK_MSG(steps == 64 && agree == 64, "device argmax equals the host argmax in %d of %d steps", agree, steps);
    fprintf(stderr, "    stories260K: device argmax = host argmax of the logits in %d/%d steps\n", agree, steps);
    llmopt_session_free(sl);
    llmopt_session_free(sg);
    llmopt_model_free(m);
    json_decref(root);
}

/* Batched decode as the server runs it: 24 sequences with prompts of 3-7 tokens (one
 * 107-token prefill step), then decode steps of one token each (24 rows: products of
 * more rows than the matvec takes, the per-token attention above 16 tokens) and of two
 * tokens each for 12 of them, against the CPU backend on the same tokens: stories260K
 * F32 (SGEMM, within 1e-4) and Q8_0 (int8 tensor cores at 9-64 rows, W to bf16 +
 * cuBLAS above: x rounded to 8 bits where the CPU rounds it its own way; within 6e-2 of
 * the largest logit, measured 3.9e-2, where a wrong product is off by its whole size;
 * linear_q8x checks the products themselves against the CPU's at 1e-4). */
static void test_batch_decode(void) {
    char path[600];
    if (!stories_f32(path, sizeof path)) return;
    const char *files[] = {"stories260K-F32.gguf", "stories260K-Q8_0.gguf"};
    const double tols[] = {1e-4, 6e-2};
    enum { S = 24, STEPS = 12 };
    for (int f = 0; f < 2; f++) {
        snprintf(path, sizeof path, "%s/%s", stories_dir(), files[f]);
        struct llmopt_err err = {0};
        struct llmopt_model *m = NULL;
        if (llmopt_model_load(path, NULL, &m, &err) != LLMOPT_OK) {
            fprintf(stderr, "  skip: %s: %s\n", path, err.msg);
            continue;
        }
        struct llmopt_session *sc = NULL, *sg = NULL;
        struct llmopt_session_opts so = {.n_ctx = 64, .n_batch = 128, .n_slots = S, .kv_type = LLMOPT_KV_F32};
        CHECK_MSG(llmopt_session_create(m, &so, &sc, &err) == LLMOPT_OK, "%s", err.msg);
        so.backend = "cuda";
        CHECK_MSG(llmopt_session_create(m, &so, &sg, &err) == LLMOPT_OK, "%s", err.msg);
        const int32_t n_vocab = llmopt_model_n_vocab(m);
        int32_t tok[128], pos[128], slot[128], rows[128], len[S] = {0}, last[S], n = 0;
        for (int q = 0; q < S; q++) /* the prompts, one step */
            for (int i = 0; i < 3 + q % 5; i++, n++) {
                tok[n] = i ? (int32_t)(2 + rng_u32() % (uint32_t)(n_vocab - 2)) : 1;
                pos[n] = len[q]++;
                slot[n] = q;
            }
        double worst = 0;
        int steps = 0;
        for (int step = 0; step <= STEPS && sc && sg; step++) {
            if (step) { /* decode: the CPU's greedy ids, one token a sequence, or two for 12 */
                const bool two = step % 4 == 3;
                n = 0;
                for (int q = 0; q < (two ? S / 2 : S); q++)
                    for (int i = 0; i < (two ? 2 : 1); i++, n++) {
                        tok[n] = i ? (int32_t)(2 + rng_u32() % (uint32_t)(n_vocab - 2)) : last[q];
                        pos[n] = len[q]++;
                        slot[n] = q;
                    }
            }
            int32_t m_rows = 0; /* each sequence's last token of the step */
            for (int t = 0; t < n; t++)
                if (t + 1 == n || slot[t + 1] != slot[t]) rows[m_rows++] = t;
            const float *lc = NULL, *lg = NULL;
            if (llmopt_session_forward(sc, n, tok, pos, slot, m_rows, rows, &lc, &err) != LLMOPT_OK ||
                llmopt_session_forward(sg, n, tok, pos, slot, m_rows, rows, &lg, &err) != LLMOPT_OK) {
                CHECK_MSG(0, "%s step %d: %s", files[f], step, err.msg);
                break;
            }
            bool nan;
            const double r = rel_err(lg, lc, (int64_t)m_rows * n_vocab, &nan);
            worst = r > worst ? r : worst;
            CHECK_MSG(!nan && r <= tols[f], "%s step %d (%d tokens, %d rows): relative error %.3g", files[f], step, n,
                      m_rows, r);
            for (int j = 0; j < m_rows; j++) {
                int32_t best = 0;
                for (int32_t v = 1; v < n_vocab; v++)
                    if (lc[(size_t)j * n_vocab + v] > lc[(size_t)j * n_vocab + best]) best = v;
                last[slot[rows[j]]] = best;
            }
            steps++;
        }
        fprintf(stderr, "    %s: %d steps of up to %d sequences on CUDA against the CPU, worst relative error %.2e\n",
                files[f], steps, S, worst);
        llmopt_session_free(sc);
        llmopt_session_free(sg);
        llmopt_model_free(m);
    }
}

static int read_ints(const json_t *arr, int32_t *out, int cap) {
    int n = (int)json_array_size(arr);
    if (n > cap) return -1;
    for (int i = 0; i < n; i++) out[i] = (int32_t)json_integer_value(json_array_get(arr, (size_t)i));
    return n;
}

/* kv F32 (the CUDA default): within 1e-4 of torch and the same argmax; F16: within
 * 5e-3, argmax not required (test_golden.c's bounds) */
static void golden_dir(const char *dir, enum llmopt_kv_type kv, int *n_rows_checked) {
    const double tol = kv == LLMOPT_KV_F32 ? 1e-4 : 5e-3;
    char path[600];
    snprintf(path, sizeof path, "%s/golden.json", dir);
    json_t *root = NULL;
    struct llmopt_err err = {0};
    CHECK_MSG(json_load_file_capped(path, 64u << 20, &root, &err) == LLMOPT_OK, "%s", err.msg);
    if (!root) return;
    snprintf(path, sizeof path, "%s/model.gguf", dir);
    struct llmopt_model *m = NULL;
    CHECK_MSG(llmopt_model_load(path, NULL, &m, &err) == LLMOPT_OK, "%s", err.msg);
    size_t ci;
    json_t *c;
    json_array_foreach(json_object_get(root, "cases"), ci, c) {
        if (!m) break;
        const json_t *steps = json_object_get(c, "steps");
        int max_slot = 0, max_batch = 1;
        size_t si;
        json_t *s;
        static int32_t tokens[4096], pos[4096], slots[4096], rows[4096];
        json_array_foreach(steps, si, s) {
            int n = read_ints(json_object_get(s, "seq_slots"), slots, 4096);
            if (n > max_batch) max_batch = n;
            for (int i = 0; i < n; i++) max_slot = slots[i] > max_slot ? slots[i] : max_slot;
        }
        struct llmopt_session *sess = NULL;
        struct llmopt_session_opts so = {
            .n_ctx = 128, .n_batch = max_batch, .n_slots = max_slot + 1, .backend = "cuda", .kv_type = kv};
        CHECK_MSG(llmopt_session_create(m, &so, &sess, &err) == LLMOPT_OK, "%s", err.msg);
        if (!sess) continue;
        CHECK(llmopt_session_kv_type(sess) == kv);
        int32_t n_vocab = llmopt_model_n_vocab(m);
        double worst = 0;
        json_array_foreach(steps, si, s) {
            int n = read_ints(json_object_get(s, "tokens"), tokens, 4096);
            read_ints(json_object_get(s, "positions"), pos, 4096);
            read_ints(json_object_get(s, "seq_slots"), slots, 4096);
            int m_rows = read_ints(json_object_get(s, "out_rows"), rows, 4096);
            const float *logits = NULL;
            enum llmopt_status st = llmopt_session_forward(sess, n, tokens, pos, slots, m_rows, rows, &logits, &err);
            CHECK_MSG(st == LLMOPT_OK, "%s case %zu step %zu: %s", dir, ci, si, err.msg);
            if (st) break;
            const json_t *want_rows = json_object_get(s, "logits");
            const json_t *argmax = json_object_get(s, "argmax");
            for (int r = 0; r < m_rows && r < (int)json_array_size(want_rows); r++) {
                const json_t *want = json_array_get(want_rows, (size_t)r);
                int best;
                double rel = golden_row_error(logits + r * n_vocab, want, n_vocab, &best);
                worst = rel > worst ? rel : worst;
                CHECK_MSG(rel <= tol, "%s kv %s case %zu step %zu row %d: relative error %.3g", dir,
                          llmopt_kv_type_name(kv), ci, si, r, rel);
                CHECK_MSG(kv != LLMOPT_KV_F32 || best == json_integer_value(json_array_get(argmax, (size_t)r)),
                          "%s case %zu step %zu row %d: argmax %d, torch %lld", dir, ci, si, r, best,
                          (long long)json_integer_value(json_array_get(argmax, (size_t)r)));
                (*n_rows_checked)++;
            }
        }
        fprintf(stderr, "    %s kv %s case '%s' on CUDA: %zu steps, worst relative error %.3g\n", dir,
                llmopt_kv_type_name(kv), json_string_value(json_object_get(c, "name")), json_array_size(steps), worst);
        llmopt_session_free(sess);
    }
    llmopt_model_free(m);
    json_decref(root);
}

static void test_goldens(void) {
    DIR *d = opendir("tests/golden");
    CHECK_MSG(d != NULL, "no tests/golden directory (run from the repository root)");
    if (!d) return;
    int n_dirs = 0, n_rows = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char dir[400], golden[420];
        snprintf(dir, sizeof dir, "tests/golden/%s", e->d_name);
        snprintf(golden, sizeof golden, "%s/golden.json", dir);
        FILE *g = fopen(golden, "rb");
        if (!g) continue;
        fclose(g);
        golden_dir(dir, LLMOPT_KV_F32, &n_rows);
        golden_dir(dir, LLMOPT_KV_F16, &n_rows);
        n_dirs++;
    }
    closedir(d);
    CHECK(n_dirs >= 4);
    fprintf(stderr, "    %d golden models, %d logits rows compared on CUDA\n", n_dirs, n_rows);
}

static void test_errors(void) {
    /* a token id out of range is refused before anything runs, as on the CPU */
    struct gb b;
    gb_init(&b);
    int32_t x = gb_source(&b, 8, 1.0f);
    b.g.output = x;
    ir_count_uses(&b.g);
    void *gpu = NULL;
    struct llmopt_err err = {0};
    CHECK(cuda_backend_ops.prepare(&b.g, 4, 16, NULL, 1, &gpu, &err) == LLMOPT_OK);
    if (gpu) {
        int32_t tok[2] = {3, 999}, pos[2] = {0, 1}, slot[2] = {0, 0}, rows[1] = {1};
        struct exec_batch eb = {2, tok, pos, slot, 1, rows};
        const float *out = NULL;
        CHECK(cuda_backend_ops.run(gpu, &eb, NULL, &out, &err) == LLMOPT_ERR_INVALID_ARG && strstr(err.msg, "999"));
        tok[1] = 4;
        CHECK(cuda_backend_ops.run(gpu, &eb, NULL, &out, &err) == LLMOPT_OK);
        cuda_backend_ops.release(gpu);
    }
    gb_free(&b);
}

/* ---- sampling on the device (run_sample) ----------------------------------------------- */

struct ranked {
    int32_t id;
    float logit;
};

static int ranked_cmp(const void *a, const void *b) {
    const struct ranked *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Output row j's sampling spec for a sampling test's step: n penalty pairs on distinct
 * ids (131 is prime to every V here) with counts 1, 2, 1, ..., penalties (1.2, 0.1,
 * 0.05), the sampler's temperature, min-p and u. */
static struct backend_row_sample draw_row_spec(int64_t V, int32_t token, int n, int32_t *ids, int32_t *counts,
                                               float temperature, float min_p, double u) {
    for (int i = 0; i < n; i++) {
        ids[i] = (int32_t)(((int64_t)token * 13 + 5 + (int64_t)i * 131) % V);
        counts[i] = 1 + i % 2;
    }
    return (struct backend_row_sample){{1.2f, 0.1f, 0.05f, n, ids, counts}, temperature, min_p, u};
}

/* The host's copy of a table row with draw_row_spec's penalties applied. */
static void draw_row_penalized(const float *row, int64_t V, const struct backend_row_sample *spec, float *work) {
    memcpy(work, row, (size_t)V * sizeof *work);
    const struct sampler_params pp = {.repeat_penalty = spec->pen.repeat, .presence_penalty = spec->pen.presence,
                                      .frequency_penalty = spec->pen.frequency};
    for (int i = 0; i < spec->pen.n; i++)
        work[spec->pen.ids[i]] = sampler_penalize(&pp, row[spec->pen.ids[i]], spec->pen.counts[i]);
}

/* run_sample against the host: each row of an embedding table (ties, NaN, +-inf, a row
 * with 3 finite entries) penalized by sampler_penalize, over vocabularies of one level
 * of the device's selection (100, 4096) and of two (5000, 151936; at k 256 the second
 * level's 9728 keys are read from global memory). Top-k: the row ranked, k from 1 to
 * 256, with and without penalties; each case twice (capture, then a CUDA graph replay
 * with other penalties), alternating with plain runs on the same state. Whole-row
 * draws: sampler_sample on the penalized row with the same uniform (temperatures 0.05
 * to 2, min-p), 24 draws a row. */
static void test_sample_device(void) {
    const int64_t vocabs[] = {100, 4096, 5000, 151936};
    const int32_t ks[] = {1, 40, 64, 100, 256};
    for (size_t vi = 0; vi < sizeof vocabs / sizeof vocabs[0]; vi++) {
        const int64_t V = vocabs[vi];
        struct gb b;
        gb_init(&b);
        b.vocab = 8;
        int32_t tab = gb_param(&b, IR_DTYPE_F32, 8, V, 4.0f);
        int32_t out = gb_op2(&b, IR_OP_EMBEDDING, tab, b.g.inputs[IR_INPUT_TOKENS]);
        CHECK_MSG(b.ok, "building: %s", b.err.msg);
        if (!b.ok) {
            gb_free(&b);
            return;
        }
        float *t = b.bufs[0];
        for (int64_t i = 0; i < 8 * V; i += 37) t[i] = t[(i + 1) % (8 * V)]; /* ties */
        for (int r = 0; r < 6; r++) {
            t[r * V + (r * 7) % V] = NAN;
            t[r * V + (r * 11 + 3) % V] = -INFINITY;
            t[r * V + (r * 13 + 5) % V] = r % 2 ? INFINITY : 9.0f;
        }
        for (int64_t i = 0; i < V; i++) t[7 * V + i] = i % 5 ? -INFINITY : NAN;
        t[7 * V + V / 2] = 1.0f;
        t[7 * V + V / 3] = 2.0f;
        t[7 * V + V - 1] = 1.0f;
        b.g.output = out;
        ir_count_uses(&b.g);
        struct llmopt_err err = {0};
        void *gpu = NULL;
        CHECK_MSG(cuda_backend_ops.prepare(&b.g, 4, 16, NULL, 1, &gpu, &err) == LLMOPT_OK, "prepare: %s", err.msg);
        struct backend_cand *cands = malloc(4 * BACKEND_TOP_K_MAX * sizeof *cands);
        struct ranked *all = malloc((size_t)V * sizeof *all);
        int32_t pen_ids[4][40], pen_counts[4][40];
        int bad = 0, cases = 0;
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0] && gpu && !bad; ki++)
            for (int rep = 0; rep < 4 && !bad; rep++) { /* rep 0/1: no penalties, 2/3: penalties */
                const int32_t k = ks[ki];
                int32_t tokens[4] = {rep % 2 ? 7 : 0, 1 + rep, 5, 3}, pos[4] = {0, 1, 2, 3}, slot[4] = {0},
                        rows[4] = {0, 1, 2, 3};
                struct backend_row_sample spec[4];
                for (int j = 0; j < 4; j++) {
                    const int n = rep < 2 ? 0 : 10 + 7 * j + rep;
                    /* distinct ids (131 is prime to every V here), the first the row's +inf / 9 */
                    for (int i = 0; i < n; i++) {
                        pen_ids[j][i] = (int32_t)(((int64_t)tokens[j] * 13 + 5 + (int64_t)i * 131) % V);
                        pen_counts[j][i] = 1 + i % 3;
                    }
                    spec[j] = (struct backend_row_sample){
                        {rep == 2 ? 1.3f : 0.7f, rep == 2 ? 0.25f : -0.5f, 0.125f * j, n, pen_ids[j], pen_counts[j]},
                        1.0f, 0.0f, 0.0};
                }
                struct exec_batch eb = {4, tokens, pos, slot, 4, rows};
                const float *lg = NULL;
                if (cuda_backend_ops.run(gpu, &eb, NULL, &lg, &err) != LLMOPT_OK ||
                    cuda_backend_ops.run_sample(gpu, &eb, NULL, rep < 2 ? NULL : spec, k, cands, NULL, NULL, &err) !=
                        LLMOPT_OK) {
                    CHECK_MSG(0, "V %lld k %d: %s", (long long)V, k, err.msg);
                    bad = 1;
                    break;
                }
                for (int j = 0; j < 4 && !bad; j++) {
                    const float *row = t + (int64_t)tokens[j] * V;
                    for (int64_t i = 0; i < V; i++) all[i] = (struct ranked){(int32_t)i, row[i]};
                    const struct backend_penalty *pen = &spec[j].pen;
                    for (int i = 0; i < pen->n && rep >= 2; i++) {
                        const struct sampler_params sp = {.repeat_penalty = pen->repeat,
                                                          .presence_penalty = pen->presence,
                                                          .frequency_penalty = pen->frequency};
                        all[pen_ids[j][i]].logit = sampler_penalize(&sp, row[pen_ids[j][i]], pen_counts[j][i]);
                    }
                    for (int64_t i = 0; i < V; i++) {
                        if (isnan(all[i].logit)) all[i].logit = -INFINITY;
                        if (all[i].logit == INFINITY) all[i].logit = FLT_MAX;
                    }
                    qsort(all, (size_t)V, sizeof *all, ranked_cmp);
                    for (int32_t i = 0; i < k && !bad; i++) {
                        const struct backend_cand *c = &cands[j * k + i];
                        const struct ranked want = i < V ? all[i] : (struct ranked){-1, -INFINITY};
                        if (c->id != want.id || !(c->logit == want.logit || (isinf(c->logit) && isinf(want.logit)))) {
                            CHECK_MSG(0, "V %lld k %d rep %d row %d (table row %d) rank %d: id %d logit %g, want %d %g",
                                      (long long)V, k, rep, j, tokens[j], i, c->id, (double)c->logit, want.id,
                                      (double)want.logit);
                            bad = 1;
                        }
                    }
                }
                cases++;
            }
        fprintf(stderr, "    top-k, vocab %6lld: %d cases (k 1..256, penalties, graph replays) %s\n", (long long)V,
                cases, bad ? "FAILED" : "equal to the host");
        /* whole-row draws */
        const float temps[] = {1.0f, 0.7f, 2.0f, 0.05f}, min_ps[] = {0.0f, 0.05f, 0.0f, 0.0f};
        float *work = malloc((size_t)V * sizeof *work);
        int draws = 0, agree = 0;
        for (int c = 0; c < 4 && gpu && !bad; c++) {
            struct sampler_params sp;
            sampler_params_default(&sp);
            sp.temperature = temps[c];
            sp.top_k = 0;
            sp.top_p = 1.0f;
            sp.min_p = min_ps[c];
            sp.seed = 31 + (uint64_t)c;
            struct sampler *hs[4] = {NULL};
            for (int j = 0; j < 4; j++) CHECK(sampler_create(&sp, (int32_t)V, &hs[j], &err) == LLMOPT_OK);
            for (int rep = 0; rep < 24 && !bad; rep++) {
                int32_t tokens[4] = {(rep + c) % 8, (rep + 3) % 8, 7, (rep * 5) % 8}, pos[4] = {0, 1, 2, 3},
                        slot[4] = {0}, rows[4] = {0, 1, 2, 3}, got[4];
                struct backend_row_sample spec[4];
                for (int j = 0; j < 4; j++)
                    spec[j] = draw_row_spec(V, tokens[j], rep % 3 ? 6 + j : 0, pen_ids[j], pen_counts[j],
                                            sp.temperature, sp.min_p, sampler_peek_uniform(hs[j]));
                struct exec_batch eb = {4, tokens, pos, slot, 4, rows};
                if (cuda_backend_ops.run_sample(gpu, &eb, NULL, spec, 0, NULL, NULL, got, &err) != LLMOPT_OK) {
                    CHECK_MSG(0, "V %lld draw: %s", (long long)V, err.msg);
                    bad = 1;
                    break;
                }
                for (int j = 0; j < 4; j++) {
                    draw_row_penalized(t + (int64_t)tokens[j] * V, V, &spec[j], work);
                    const int32_t want = sampler_sample(hs[j], work, NULL, 0, NULL); /* takes the uniform */
                    draws++;
                    agree += got[j] == want;
                    if (got[j] != want && !bad) {
                        CHECK_MSG(0, "V %lld draw T %g rep %d row %d: device %d, host %d", (long long)V,
                                  (double)sp.temperature, rep, j, got[j], want);
                        bad = 1;
                    }
                }
            }
            for (int j = 0; j < 4; j++) sampler_free(hs[j]);
        }
        fprintf(stderr, "    whole-row draws, vocab %6lld: %d/%d equal to the host sampler\n", (long long)V, agree,
                draws);
        /* top-p without top-k: the best 256 and z back, the row itself where they are not
         * enough (fetch_logits), against sampler_sample on the penalized row */
        const struct {
            float temperature, top_p, min_p;
        } nuc_cases[] = {{0.05f, 0.9f, 0.0f}, {0.3f, 0.5f, 0.02f}, {1.0f, 0.99f, 0.0f}, {0.2f, 0.95f, 0.3f}};
        int n_direct = 0, n_fetched = 0, n_agree = 0, n_draws = 0, z_equal = 0;
        for (size_t c = 0; c < sizeof nuc_cases / sizeof nuc_cases[0] && gpu && !bad; c++) {
            struct sampler_params sp;
            sampler_params_default(&sp);
            sp.temperature = nuc_cases[c].temperature;
            sp.top_k = 0;
            sp.top_p = nuc_cases[c].top_p;
            sp.min_p = nuc_cases[c].min_p;
            sp.seed = 71 + (uint64_t)c;
            struct sampler *hs[4] = {NULL}, *ds[4] = {NULL};
            for (int j = 0; j < 4; j++)
                CHECK(sampler_create(&sp, (int32_t)V, &hs[j], &err) == LLMOPT_OK &&
                      sampler_create(&sp, (int32_t)V, &ds[j], &err) == LLMOPT_OK);
            for (int rep = 0; rep < 12 && !bad; rep++) {
                int32_t tokens[4] = {(rep + (int)c) % 8, (rep + 3) % 8, 7, (rep * 5) % 8}, pos[4] = {0, 1, 2, 3},
                        slot[4] = {0}, rows[4] = {0, 1, 2, 3};
                struct backend_row_sample spec[4];
                double z[4];
                for (int j = 0; j < 4; j++)
                    spec[j] = draw_row_spec(V, tokens[j], rep % 3 ? 6 + j : 0, pen_ids[j], pen_counts[j],
                                            sp.temperature, sp.min_p, 0.0);
                struct exec_batch eb = {4, tokens, pos, slot, 4, rows};
                if (cuda_backend_ops.run_sample(gpu, &eb, NULL, spec, BACKEND_TOP_K_MAX, cands, z, NULL, &err) !=
                    LLMOPT_OK) {
                    CHECK_MSG(0, "V %lld top-p: %s", (long long)V, err.msg);
                    bad = 1;
                    break;
                }
                const float *back = NULL;
                for (int j = 0; j < 4 && !bad; j++) {
                    draw_row_penalized(t + (int64_t)tokens[j] * V, V, &spec[j], work);
                    /* z on the host: sample_exp.h's blocks over every finite entry */
                    float max = -INFINITY;
                    for (int64_t i = 0; i < V; i++) {
                        const float l = isnan(work[i]) ? -INFINITY : work[i] == INFINITY ? FLT_MAX : work[i];
                        max = l > max ? l : max;
                    }
                    double zh = 0.0;
                    for (int64_t b0 = 0; b0 < V; b0 += SAMPLE_DRAW_BLOCK) {
                        double sb = 0.0;
                        for (int64_t i = b0; i < V && i < b0 + SAMPLE_DRAW_BLOCK; i++) {
                            const float l = isnan(work[i]) ? -INFINITY : work[i] == INFINITY ? FLT_MAX : work[i];
                            if (l != -INFINITY) sb += sample_exp((l - max) / sp.temperature);
                        }
                        zh += sb;
                    }
                    z_equal += z[j] == zh;
                    int32_t cid[BACKEND_TOP_K_MAX];
                    float cl[BACKEND_TOP_K_MAX];
                    for (int i = 0; i < BACKEND_TOP_K_MAX; i++) {
                        cid[i] = cands[j * BACKEND_TOP_K_MAX + i].id;
                        cl[i] = cands[j * BACKEND_TOP_K_MAX + i].logit;
                    }
                    int32_t got = sampler_sample_nucleus(ds[j], cid, cl, BACKEND_TOP_K_MAX, z[j]);
                    if (got < 0) {
                        if (!back && cuda_backend_ops.fetch_logits(gpu, &back, &err) != LLMOPT_OK) {
                            CHECK_MSG(0, "fetch_logits: %s", err.msg);
                            bad = 1;
                            break;
                        }
                        float *mine = malloc((size_t)V * sizeof *mine);
                        memcpy(mine, back + (int64_t)j * V, (size_t)V * sizeof *mine);
                        got = sampler_sample_penalized(ds[j], mine, NULL);
                        free(mine);
                        n_fetched++;
                    } else
                        n_direct++;
                    const int32_t want = sampler_sample(hs[j], work, NULL, 0, NULL);
                    n_draws++;
                    n_agree += got == want;
                    if (got != want && !bad) {
                        CHECK_MSG(0, "V %lld top-p case %zu rep %d row %d: device path %d, host %d", (long long)V, c,
                                  rep, j, got, want);
                        bad = 1;
                    }
                }
            }
            for (int j = 0; j < 4; j++) {
                sampler_free(hs[j]);
                sampler_free(ds[j]);
            }
        }
        fprintf(stderr,
                "    top-p draws, vocab %6lld: %d/%d equal to the host sampler (%d from the candidates, %d from the "
                "fetched row); z bit-equal %d/%d\n",
                (long long)V, n_agree, n_draws, n_direct, n_fetched, z_equal, n_draws);
        CHECK(z_equal == n_draws);
        if (gpu) { /* no place for the answer: an error, not a crash */
            int32_t tokens[1] = {0}, pos[1] = {0}, slot[1] = {0}, rows[1] = {0};
            struct exec_batch eb = {1, tokens, pos, slot, 1, rows};
            const enum llmopt_status bad_arg = LLMOPT_ERR_INVALID_ARG;
            double z1[1];
            CHECK(cuda_backend_ops.run_sample(gpu, &eb, NULL, NULL, 0, NULL, NULL, NULL, &err) == bad_arg);
            CHECK(cuda_backend_ops.run_sample(gpu, &eb, NULL, NULL, 5, NULL, NULL, NULL, &err) == bad_arg);
            CHECK(cuda_backend_ops.run_sample(gpu, &eb, NULL, NULL, 300, cands, NULL, NULL, &err) == bad_arg);
            CHECK(cuda_backend_ops.run_sample(gpu, &eb, NULL, NULL, 256, cands, z1, NULL, &err) == bad_arg);
        }
        free(work);
        free(cands);
        free(all);
        if (gpu) cuda_backend_ops.release(gpu);
        gb_free(&b);
    }
}

/* A session's sampled generation (top-k with penalties, greedy with penalties, top-k
 * 200, the whole vocabulary, top-p without top-k at 0.9 and 0.6) equals the same session settings with the logits copied
 * back ($LLMOPT_DEVICE_SAMPLING=0), and two-sequence steps (the server's) the same. */
static void test_sample_session(void) {
    char path[600];
    if (!stories_f32(path, sizeof path)) return;
    struct llmopt_err err = {0};
    struct llmopt_model *m = NULL;
    CHECK_MSG(llmopt_model_load(path, NULL, &m, &err) == LLMOPT_OK, "%s", err.msg);
    if (!m) return;
    struct llmopt_sampling modes[6];
    llmopt_sampling_default(&modes[0]); /* temperature 0.8, top-k 40, top-p 0.95, min-p 0.05 */
    modes[0].repeat_penalty = 1.1f;
    modes[0].presence_penalty = 0.3f;
    modes[0].seed = 11;
    modes[1] = modes[0];
    modes[1].temperature = 0.0f; /* greedy with penalties */
    modes[1].repeat_penalty = 1.3f;
    modes[2] = modes[0];
    modes[2].top_k = 200;
    modes[2].top_p = 1.0f;
    modes[2].min_p = 0.0f;
    modes[2].repeat_penalty = 1.0f;
    modes[2].presence_penalty = 0.0f;
    modes[3] = modes[0]; /* the whole vocabulary (the OpenAI defaults), with a penalty */
    modes[3].temperature = 1.0f;
    modes[3].top_k = 0;
    modes[3].top_p = 1.0f;
    modes[3].min_p = 0.0f;
    modes[4] = modes[0]; /* top-p without top-k: the best 256 and z, or the row fetched */
    modes[4].temperature = 0.9f;
    modes[4].top_k = 0;
    modes[4].top_p = 0.9f;
    modes[4].min_p = 0.02f;
    modes[5] = modes[4]; /* a small set */
    modes[5].temperature = 0.6f;
    modes[5].top_p = 0.6f;
    modes[5].min_p = 0.0f;
    for (int md = 0; md < 6; md++) {
        struct ids_out got[2];
        double tps[2] = {0, 0};
        for (int dev = 1; dev >= 0; dev--) {
            setenv("LLMOPT_DEVICE_SAMPLING", dev ? "1" : "0", 1); /* 512 ids: off unless forced */
            struct llmopt_session *s = NULL;
            struct llmopt_session_opts so = {.backend = "cuda"};
            CHECK_MSG(llmopt_session_create(m, &so, &s, &err) == LLMOPT_OK, "%s", err.msg);
            unsetenv("LLMOPT_DEVICE_SAMPLING");
            got[dev].n = 0;
            if (!s) continue;
            int32_t bos = 1;
            struct llmopt_generate_result res;
            CHECK_MSG(llmopt_generate(s, 0, &bos, 1, 200, &modes[md], collect, &got[dev], &res, &err) == LLMOPT_OK,
                      "%s", err.msg);
            tps[dev] = res.decode_seconds > 0 ? (res.n_generated - 1) / res.decode_seconds : 0.0;
            llmopt_session_free(s);
        }
        int same = 0;
        while (same < got[0].n && same < got[1].n && got[0].ids[same] == got[1].ids[same]) same++;
        CHECK_MSG(got[1].n > 20 && got[0].n == got[1].n && same == got[0].n,
                  "mode %d: device top-k %d ids, logits %d ids, first %d equal", md, got[1].n, got[0].n, same);
        fprintf(stderr, "    stories260K sampled (mode %d): %d/%d ids equal; decode %.0f tok/s (device top-k) vs %.0f "
                        "(logits back)\n", md, same, got[1].n, tps[1], tps[0]);
    }
    /* two sequences in one step, each with its own sampler: top-k rows, whole-row draws,
     * top-p rows with a greedy one and with another top-p one */
    const int pairs[4][2] = {{0, 2}, {3, 3}, {4, 1}, {5, 4}};
    for (int pr = 0; pr < 4; pr++) {
        int32_t ids[2][2][64];
        for (int dev = 1; dev >= 0; dev--) {
            setenv("LLMOPT_DEVICE_SAMPLING", dev ? "1" : "0", 1);
            struct llmopt_session *s = NULL;
            struct llmopt_session_opts so = {.backend = "cuda", .n_slots = 2};
            CHECK_MSG(llmopt_session_create(m, &so, &s, &err) == LLMOPT_OK, "%s", err.msg);
            unsetenv("LLMOPT_DEVICE_SAMPLING");
            if (!s) continue;
            struct llmopt_sampler *smp[2] = {NULL, NULL};
            for (int q = 0; q < 2; q++)
                CHECK(llmopt_sampler_create(&modes[pairs[pr][q]], llmopt_model_n_vocab(m), &smp[q], &err) ==
                      LLMOPT_OK);
            int32_t hist[2][80] = {{1, 42, 7}, {1, 100}}, n_hist[2] = {3, 2};
            for (int q = 0; q < 2; q++)
                CHECK(llmopt_session_append_sample(s, q, hist[q], n_hist[q], smp[q], hist[q], (size_t)n_hist[q],
                                                   &ids[dev][q][0], &err) == LLMOPT_OK);
            for (int step = 1; step < 64; step++) {
                int32_t tok[2], pos[2], slot[2] = {0, 1}, rows[2] = {0, 1}, next[2];
                const int32_t *h[2];
                size_t nh[2];
                for (int q = 0; q < 2; q++) {
                    tok[q] = hist[q][n_hist[q]] = ids[dev][q][step - 1];
                    pos[q] = n_hist[q]++;
                    h[q] = hist[q];
                    nh[q] = (size_t)n_hist[q];
                }
                if (llmopt_session_forward_sample(s, 2, tok, pos, slot, 2, rows, smp, h, nh, next, &err) !=
                    LLMOPT_OK) {
                    CHECK_MSG(0, "two-row step %d: %s", step, err.msg);
                    break;
                }
                ids[dev][0][step] = next[0];
                ids[dev][1][step] = next[1];
            }
            llmopt_sampler_free(smp[0]);
            llmopt_sampler_free(smp[1]);
            llmopt_session_free(s);
        }
        CHECK_MSG(!memcmp(ids[0], ids[1], sizeof ids[0]), "two-row steps (modes %d, %d): device and logits paths differ",
                  pairs[pr][0], pairs[pr][1]);
        fprintf(stderr, "    stories260K two sequences a step (modes %d, %d): 2 x 64 ids, device sampling %s the logits "
                        "path\n", pairs[pr][0], pairs[pr][1], memcmp(ids[0], ids[1], sizeof ids[0]) ? "differs from" : "equals");
    }
    llmopt_model_free(m);
}

#endif /* LLMOPT_HAVE_CUDA */

int main(void) {
#ifndef LLMOPT_HAVE_CUDA
    printf("skip: built without CUDA (no nvcc at configure time)\n");
    return 0;
#else
    char why[256];
    if (!cuda_device_available(why, sizeof why)) {
        printf("skip: no CUDA device (%s)\n", why);
        return 0;
    }
    char desc[256] = "";
    cuda_device_describe(desc, sizeof desc);
    fprintf(stderr, "device: %s\n", desc);
    const test_fn fns[] = {test_errors, test_embedding_all_types, test_linear, test_linear_kquant, test_unary, test_binary_broadcast,
                           test_reductions_softmax, test_norms_rope, test_layout_ops, test_rope_table, test_attention,
                           test_decode_fusion, test_linear_q8x, test_matvec_shapes, test_matvec_persist, test_matvec_tma, test_short_conv, test_stories_greedy, test_goldens, test_sample_device, test_sample_session, test_batch_decode};
    const char *names[] = {"errors", "embedding_all_types", "linear", "linear_kquant", "unary", "binary_broadcast",
                           "reductions_softmax", "norms_rope", "layout_ops", "rope_table", "attention", "decode_fusion", "linear_q8x", "matvec_shapes", "matvec_persist", "matvec_tma", "short_conv",
                           "stories_greedy",
                           "goldens", "sample_device", "sample_session", "batch_decode"};
    const char *only = getenv("LLMOPT_CUDA_TEST_ONLY");
    int n = (int)(sizeof fns / sizeof fns[0]);
    if (only && *only) {
        test_fn sel_fns[32];
        const char *sel_names[32];
        int k = 0;
        for (int i = 0; i < n; i++)
            if (strstr(only, names[i])) {
                sel_fns[k] = fns[i];
                sel_names[k++] = names[i];
            }
        return test_run_all(sel_names, sel_fns, k);
    }
    return test_run_all(names, fns, n);
#endif
}
