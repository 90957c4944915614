/* Every fast CPU kernel against a scalar reference, on fresh random inputs (never
 * zeros), for every ISA this CPU has (the others are skipped with a message), over
 * many shapes and thread counts 1, 2, 3.
 *
 * Errors are measured against what the arithmetic can promise: a dot product computed
 * in f32 is within a small multiple of eps * sum |x_k w_k| of the exact one, so each
 * output is checked against |ours - exact| <= tol * sum |x_k w_k| (exact in double).
 * Kernels on quantized activations are checked twice: tightly against the exact dot
 * of the same quants, and loosely against the f32 product. */
#include "backend/cpu/kernels.h"
#include "backend/cpu/pool.h"
#include "backend/op_math.h"
#include "base/fp16.h"
#include "format/quant.h"
#include "format/quant_k.h"
#include "llmopt.h"
#include "runtime/synth.h"
#include "test.h"

#include <stdatomic.h>
#include <stdint.h>
#include <unistd.h>

/* ---- random inputs ---------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rng_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

/* Uniform in [-1, 1) without zeros. */
static float rng_f(void) {
    float v = ((float)(rng_u32() & 0xffffff) + 0.5f) / 8388608.0f - 1.0f;
    return v;
}

static void fill(float *p, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) p[i] = rng_f() * scale;
}

static enum ggml_type ggml_of(enum ir_dtype t) {
    switch (t) {
    case IR_DTYPE_F16: return GGML_TYPE_F16;
    case IR_DTYPE_BF16: return GGML_TYPE_BF16;
    case IR_DTYPE_Q8_0: return GGML_TYPE_Q8_0;
    case IR_DTYPE_Q4_0: return GGML_TYPE_Q4_0;
    case IR_DTYPE_Q4_K: return GGML_TYPE_Q4_K;
    case IR_DTYPE_Q5_K: return GGML_TYPE_Q5_K;
    case IR_DTYPE_Q6_K: return GGML_TYPE_Q6_K;
    case IR_DTYPE_Q5_0: return GGML_TYPE_Q5_0;
    case IR_DTYPE_IQ4_XS: return GGML_TYPE_IQ4_XS;
    default: return GGML_TYPE_F32;
    }
}

/* A random weight matrix (n_out, k) stored as t. */
static void *make_weights(enum ir_dtype t, int64_t n_out, int64_t k) {
    size_t row = ir_dtype_row_bytes(t, k);
    uint8_t *w = malloc(row * (size_t)n_out + 64);
    float *tmp = malloc((size_t)k * sizeof(float));
    for (int64_t j = 0; j < n_out; j++) {
        fill(tmp, k, 1.0f);
        uint8_t *dst = w + row * (size_t)j;
        switch (t) {
        case IR_DTYPE_F32: memcpy(dst, tmp, (size_t)k * 4); break;
        case IR_DTYPE_F16:
            for (int64_t i = 0; i < k; i++) {
                uint16_t h = fp16_from_f32(tmp[i]);
                memcpy(dst + 2 * i, &h, 2);
            }
            break;
        case IR_DTYPE_BF16:
            for (int64_t i = 0; i < k; i++) {
                uint16_t h = bf16_from_f32(tmp[i]);
                memcpy(dst + 2 * i, &h, 2);
            }
            break;
        case IR_DTYPE_Q8_0: quant_quantize_row_q8_0(tmp, dst, k); break;
        case IR_DTYPE_Q4_0: quant_quantize_row_q4_0(tmp, dst, k); break;
        case IR_DTYPE_Q4_K: quant_k_quantize_row_q4_K(tmp, dst, k); break;
        case IR_DTYPE_Q5_K: quant_k_quantize_row_q5_K(tmp, dst, k); break;
        case IR_DTYPE_Q6_K: quant_k_quantize_row_q6_K(tmp, dst, k); break;
        case IR_DTYPE_Q5_0: quant_quantize_row_q5_0(tmp, dst, k); break;
        case IR_DTYPE_IQ4_XS: quant_k_quantize_row_iq4_xs(tmp, dst, k); break;
        default: break;
        }
    }
    free(tmp);
    return w;
}

static const struct cpu_isa_kernels *isa_or_skip(enum cpu_isa isa) {
    const struct cpu_isa_kernels *k = cpu_isa_kernels_get(isa);
    static bool said[CPU_ISA_COUNT];
    if (!k && !said[isa]) {
        fprintf(stderr, "  skip: this CPU lacks %s\n", cpu_isa_name(isa));
        said[isa] = true;
    }
    return k;
}

/* ---- thread pool ------------------------------------------------------------------ */

struct pool_probe {
    struct cpu_pool *pool;
    _Atomic int calls;
    int seen_nth;
    int hits[8];
    int phase_data[8];
    _Atomic int barrier_errors;
};

static void pool_probe_fn(void *arg, int ith, int nth) {
    struct pool_probe *p = arg;
    atomic_fetch_add(&p->calls, 1);
    if (ith == 0) p->seen_nth = nth;
    p->hits[ith]++;
    /* Each phase: every thread writes its slot, then after the barrier reads all. */
    for (int phase = 1; phase <= 3; phase++) {
        p->phase_data[ith] = phase * 100 + ith;
        pool_barrier(p->pool);
        for (int t = 0; t < nth; t++)
            if (p->phase_data[t] != phase * 100 + t) atomic_fetch_add(&p->barrier_errors, 1);
        pool_barrier(p->pool);
    }
}

struct shared_probe {
    _Atomic int next;
    int n_items;
    _Atomic int done[64];
};

static void shared_probe_fn(void *arg, int ith, int nth) {
    struct shared_probe *sp = arg;
    int i;
    (void)ith;
    (void)nth;
    while ((i = atomic_fetch_add(&sp->next, 1)) < sp->n_items) atomic_fetch_add(&sp->done[i], 1);
}

static void test_pool(void) {
    struct llmopt_err err = {0};
    for (int nt = 1; nt <= 4; nt++) {
        struct pool_probe probe = {0};
        CHECK_MSG(pool_create(nt, &probe.pool, &err) == LLMOPT_OK, "%s", err.msg);
        if (!probe.pool) continue;
        CHECK_EQ_INT(pool_threads(probe.pool), nt);
        for (int run = 0; run < 500; run++) pool_run(probe.pool, pool_probe_fn, &probe);
        CHECK_EQ_INT(atomic_load(&probe.calls), 500 * nt);
        CHECK_EQ_INT(probe.seen_nth, nt);
        for (int t = 0; t < nt; t++) CHECK_EQ_INT(probe.hits[t], 500);
        CHECK_EQ_INT(atomic_load(&probe.barrier_errors), 0);
        pool_free(probe.pool);
    }
    /* Shared runs: items from a counter, each done exactly once, all done when the
     * run returns, whichever threads took part (more threads than CPUs here, so
     * some are skipped). */
    for (int nt = 1; nt <= 6; nt++) {
        struct cpu_pool *pool = NULL;
        CHECK_MSG(pool_create(nt, &pool, &err) == LLMOPT_OK, "%s", err.msg);
        if (!pool) continue;
        struct shared_probe sp = {0};
        int bad = 0;
        for (int run = 0; run < 2000; run++) {
            atomic_store(&sp.next, 0);
            sp.n_items = 1 + run % 37;
            memset(sp.done, 0, sizeof sp.done);
            pool_run_shared(pool, shared_probe_fn, &sp);
            for (int i = 0; i < sp.n_items; i++) bad += atomic_load(&sp.done[i]) != 1;
        }
        CHECK_MSG(bad == 0, "%d threads: %d items not done exactly once", nt, bad);
        pool_free(pool);
    }
    /* pool_split covers [0, n) exactly, in aligned pieces. */
    for (int64_t n = 0; n < 70; n++)
        for (int nth = 1; nth <= 5; nth++) {
            int64_t next = 0;
            for (int ith = 0; ith < nth; ith++) {
                int64_t b, e;
                pool_split(n, 4, ith, nth, &b, &e);
                CHECK(b == next && e >= b && (b % 4 == 0 || b == n));
                next = e;
            }
            CHECK(next == n);
        }
}

/* ---- activation quantization ------------------------------------------------------ */

static void test_quantize_same_on_every_isa(void) {
    const struct cpu_isa_kernels *ref = cpu_isa_kernels_get(CPU_ISA_SCALAR);
    for (int isa = 1; isa < CPU_ISA_COUNT; isa++) {
        const struct cpu_isa_kernels *kern = isa_or_skip((enum cpu_isa)isa);
        if (!kern) continue;
        for (int64_t k = 32; k <= 1024; k += 96) {
            int64_t rows = 3;
            float *x = malloc((size_t)(rows * k) * 4);
            fill(x, rows * k, 3.0f);
            x[5] = 0.5f; /* ties and exact values */
            for (int64_t i = 0; i < 32 && i < k; i++) x[k + i] = (float)(i - 16) * 0.25f;
            void *b1 = malloc(cpu_qact_bytes(rows, k)), *b2 = malloc(cpu_qact_bytes(rows, k));
            struct cpu_qact q1, q2;
            cpu_qact_bind(&q1, b1, rows, k);
            cpu_qact_bind(&q2, b2, rows, k);
            for (int64_t r = 0; r < rows; r++) {
                ref->quantize_row(x + r * k, &q1, r);
                kern->quantize_row(x + r * k, &q2, r);
            }
            CHECK_MSG(!memcmp(q1.qs, q2.qs, (size_t)(rows * k)), "%s k=%lld: quants differ",
                      cpu_isa_name(kern->isa), (long long)k);
            CHECK(!memcmp(q1.d, q2.d, (size_t)(rows * k / 32) * 4));
            CHECK(!memcmp(q1.corr, q2.corr, (size_t)(rows * k / 4) * 4));
            /* the quants reproduce x within half a step */
            for (int64_t r = 0; r < rows; r++)
                for (int64_t i = 0; i < k; i++) {
                    float d = q1.d[r * (k / 32) + i / 32];
                    CHECK(fabsf(q1.qs[r * k + i] * d - x[r * k + i]) <= 0.5001f * d + 1e-7f);
                }
            free(x);
            free(b1);
            free(b2);
        }
    }
}

/* ---- linear ----------------------------------------------------------------------- */

struct linear_case {
    enum ir_dtype wt;
    int64_t rows, k, n_out;
    uint32_t flags; /* IR_LINEAR_* */
    enum ir_op act;
};

static double act_d(enum ir_op op, double x) {
    return (double)op_unary_apply(op, (float)x);
}

/* Runs one case on one ISA and thread count; returns false on a mismatch (reported). */
static bool check_linear(const struct cpu_isa_kernels *kern, struct cpu_pool *pool,
                         const struct linear_case *lc) {
    int64_t rows = lc->rows, k = lc->k, n_out = lc->n_out;
    float *x = malloc((size_t)(rows * k) * 4);
    float *bias = malloc((size_t)n_out * 4);
    float *gate = malloc((size_t)(rows * n_out) * 4);
    float *res = malloc((size_t)(rows * n_out) * 4);
    float *y = malloc((size_t)(rows * n_out) * 4);
    float *wrow = malloc((size_t)k * 4);
    fill(x, rows * k, 2.0f);
    fill(bias, n_out, 0.5f);
    fill(gate, rows * n_out, 1.0f);
    fill(res, rows * n_out, 1.0f);
    void *w = make_weights(lc->wt, n_out, k);
    bool quant = ir_dtype_block_elems(lc->wt) > 1;
    size_t scratch_bytes = cpu_linear_scratch_bytes(kern, lc->wt, rows, k, pool_threads(pool));
    void *scratch = scratch_bytes ? malloc(scratch_bytes) : NULL;
    struct cpu_linear op = {
        .x = x, .rows = rows, .k = k, .n_out = n_out, .w = w, .wtype = lc->wt,
        .bias = lc->flags & IR_LINEAR_BIAS ? bias : NULL,
        .gate = lc->flags & IR_LINEAR_GATE ? gate : NULL,
        .residual = lc->flags & IR_LINEAR_RESIDUAL ? res : NULL,
        .act = lc->act, .y = y, .scratch = scratch,
    };
    cpu_linear_run(&op, kern, pool);
    /* Weights packed once (the backend's prepared panels; float weights then take the
     * GEMM at every row count): y2, checked against the same reference below. */
    float *y2 = NULL;
    size_t packed_bytes = cpu_linear_packed_bytes(kern, lc->wt, k, n_out);
    if (packed_bytes) {
        void *packed = aligned_alloc(64, packed_bytes);
        y2 = malloc((size_t)(rows * n_out) * 4);
        cpu_linear_pack(kern, lc->wt, w, k, n_out, packed);
        struct cpu_linear op2 = op;
        op2.y = y2;
        op2.packed = packed;
        cpu_linear_run(&op2, kern, pool);
        free(packed);
    }

    /* The quants the kernel saw (every ISA's quantizer gives the same; tested above). */
    struct cpu_qact qa = {0};
    void *qbuf = NULL;
    if (quant) {
        qbuf = malloc(cpu_qact_bytes(rows, k));
        cpu_qact_bind(&qa, qbuf, rows, k);
        for (int64_t r = 0; r < rows; r++) cpu_isa_kernels_get(CPU_ISA_SCALAR)->quantize_row(x + r * k, &qa, r);
    }
    /* Tolerances per unit of sum |x w|: f32 accumulation; the activation-quantized
     * paths are checked exactly against their quants and loosely against f32. */
    const double tol = 2e-5 * (1.0 + (double)k / 4096.0), tol_q_f32 = 1.2e-2;
    size_t ldw = ir_dtype_row_bytes(lc->wt, k);
    bool ok = true;
    for (int64_t j = 0; j < n_out && ok; j++) {
        quant_dequantize_row(ggml_of(lc->wt), (const uint8_t *)w + ldw * (size_t)j, wrow, k);
        for (int64_t r = 0; r < rows && ok; r++) {
            const float *xr = x + r * k;
            double dot = 0, bound = 0, qdot = 0, qbound = 0;
            for (int64_t i = 0; i < k; i++) {
                dot += (double)xr[i] * wrow[i];
                bound += fabs((double)xr[i] * wrow[i]);
            }
            if (quant)
                for (int64_t i = 0; i < k; i++) {
                    double xq = (double)qa.qs[r * k + i] * qa.d[r * (k / 32) + i / 32];
                    qdot += xq * wrow[i];
                    qbound += fabs(xq * wrow[i]);
                }
            /* The epilogue in double from each exact dot; its error grows by at most
             * max |act'| (< 1.2 for the activations tested) times |gate| <= 1. */
            double ref[2], err_allow[2];
            for (int v = 0; v < (quant ? 2 : 1); v++) {
                double acc = v == 0 ? (quant ? qdot : dot) : dot;
                double b = v == 0 ? (quant ? qbound : bound) : bound;
                if (op.bias) acc += bias[j];
                if (lc->act != IR_OP_INPUT) acc = act_d(lc->act, acc);
                if (op.gate) acc *= gate[r * n_out + j];
                if (op.residual) acc += res[r * n_out + j];
                ref[v] = acc;
                err_allow[v] = (v == 0 ? tol : tol_q_f32) * 1.2 * (b + 1.0) + 1e-6;
            }
            for (int packed = 0; packed < (y2 ? 2 : 1) && ok; packed++) {
                float got = (packed ? y2 : y)[r * n_out + j];
                for (int v = 0; v < (quant ? 2 : 1); v++)
                    if (!(fabs(got - ref[v]) <= err_allow[v])) {
                        fprintf(stderr,
                                "  %s %s rows=%lld k=%lld n_out=%lld flags=%u act=%s threads=%d%s: "
                                "y[%lld,%lld] = %.7g, %s %.7g (allowed %.3g)\n",
                                cpu_isa_name(kern->isa), ir_dtype_name(lc->wt), (long long)rows,
                                (long long)k, (long long)n_out, lc->flags, ir_op_name(lc->act),
                                pool_threads(pool), packed ? " (packed once)" : "", (long long)r, (long long)j, got,
                                v == 0 ? "expected" : "f32 product", ref[v], err_allow[v]);
                        ok = false;
                    }
            }
        }
    }
    free(x);
    free(bias);
    free(gate);
    free(res);
    free(y);
    free(y2);
    free(wrow);
    free(w);
    free(scratch);
    free(qbuf);
    return ok;
}

static const enum ir_dtype all_wtypes[] = {IR_DTYPE_F32,  IR_DTYPE_F16,  IR_DTYPE_BF16, IR_DTYPE_Q8_0,
                                           IR_DTYPE_Q4_0, IR_DTYPE_Q4_K, IR_DTYPE_Q5_K, IR_DTYPE_Q6_K,
                                           IR_DTYPE_Q5_0, IR_DTYPE_IQ4_XS};
static const enum ir_op acts[] = {IR_OP_INPUT, IR_OP_SILU, IR_OP_GELU_TANH, IR_OP_RELU};

static void run_linear_cases(int n_threads, int n_random) {
    struct llmopt_err err = {0};
    struct cpu_pool *pool = NULL;
    CHECK_MSG(pool_create(n_threads, &pool, &err) == LLMOPT_OK, "%s", err.msg);
    for (int isa = 0; isa < CPU_ISA_COUNT; isa++) {
        const struct cpu_isa_kernels *kern = isa_or_skip((enum cpu_isa)isa);
        if (!kern) continue;
        int failures = 0;
        for (size_t t = 0; t < LLMOPT_ARRAY_LEN(all_wtypes); t++) {
            enum ir_dtype wt = all_wtypes[t];
            /* block types: k a multiple of the block (32, or 256 for K-quants, IQ4_XS) */
            int64_t blk = ir_dtype_block_elems(wt);
            bool quant = blk > 1;
            /* Every row count 1..67 once (under sanitizers: 1..9, then every 7th), with
             * varying K, columns and epilogues. */
            for (int64_t rows = 1; rows <= 67 && failures < 3; rows += test_sanitized() && rows >= 9 ? 7 : 1) {
                struct linear_case lc = {
                    .wt = wt, .rows = rows,
                    .k = quant ? blk * (1 + rng_u32() % (blk > 32 ? 3 : 12)) : 1 + rng_u32() % 300,
                    .n_out = 1 + rng_u32() % 37,
                    .flags = (uint32_t)(rows % 8),
                    .act = acts[rows % LLMOPT_ARRAY_LEN(acts)],
                };
                if (!check_linear(kern, pool, &lc)) failures++;
            }
            /* Random larger shapes, big enough to spread over the threads. */
            for (int i = 0; i < (test_sanitized() ? n_random / 5 + 1 : n_random) && failures < 3; i++) {
                struct linear_case lc = {
                    .wt = wt, .rows = 1 + rng_u32() % (i % 2 ? 20 : 90),
                    .k = quant ? blk * (1 + rng_u32() % (blk > 32 ? 5 : 40)) : 1 + rng_u32() % 1100,
                    .n_out = 1 + rng_u32() % 300,
                    .flags = rng_u32() % 8,
                    .act = acts[rng_u32() % LLMOPT_ARRAY_LEN(acts)],
                };
                if (!check_linear(kern, pool, &lc)) failures++;
            }
            /* Decode-like shapes at real sizes. */
            int64_t ks[] = {256, 1024, quant ? 3072 : 3000};
            for (size_t i = 0; i < (test_sanitized() ? 1 : LLMOPT_ARRAY_LEN(ks)) && failures < 3; i++)
                for (int64_t rows = 1; rows <= 4; rows++) {
                    struct linear_case lc = {.wt = wt, .rows = rows, .k = ks[i], .n_out = 260,
                                             .flags = IR_LINEAR_RESIDUAL, .act = IR_OP_INPUT};
                    if (!check_linear(kern, pool, &lc)) failures++;
                }
        }
        CHECK_MSG(failures == 0, "%s, %d threads: %d linear cases failed", cpu_isa_name(kern->isa),
                  n_threads, failures);
    }
    pool_free(pool);
}

static void test_linear_1_thread(void) {
    run_linear_cases(1, 30);
}
static void test_linear_2_threads(void) {
    run_linear_cases(2, 15);
    if (test_sanitized()) return; /* the split below is the same code under ASan */
    cpu_linear_one_range = true; /* the shared-counter split the kernel lab compares */
    run_linear_cases(2, 5);
    cpu_linear_one_range = false;
}
static void test_linear_3_threads(void) {
    if (test_sanitized()) {
        fprintf(stderr, "  skip under sanitizers: 1 and 2 threads cover the same paths\n");
        return;
    }
    run_linear_cases(3, 15);
}

/* ---- attention -------------------------------------------------------------------- */

/* The kernel reads the cache's stored type (f32, f16 or q8_0) directly; the oracle
 * reads the same stored values through the reference dequantizer (kv_cache_read), so
 * the tolerance is the f32 one for every type. */
static void check_attention(const struct cpu_isa_kernels *kern, struct cpu_pool *pool, enum kv_dtype dtype,
                            int64_t n_heads, int64_t n_kv_heads, int64_t dh, int32_t ctx_before, int32_t n_tok,
                            int64_t window, int32_t n_slots, int32_t block_size, float *keep, int *failures) {
    struct llmopt_err err = {0};
    struct kv_cache *kv = NULL;
    int32_t row_elems[2] = {(int32_t)(n_kv_heads * dh), (int32_t)(n_kv_heads * dh)};
    int32_t max_pos = ctx_before + n_tok + 1;
    CHECK_MSG(kv_cache_create(2, row_elems, dtype, n_slots, max_pos, n_slots * ((max_pos + block_size - 1) / block_size),
                              block_size, &kv,
                              &err) == LLMOPT_OK,
              "%s", err.msg);
    if (!kv) return;
    /* Tokens of n_slots sequences interleaved: token t belongs to slot t % n_slots and
     * continues it, as a mixed batch does. */
    int32_t *pos = malloc((size_t)n_tok * 4), *slot = malloc((size_t)n_tok * 4);
    int32_t next[8] = {0};
    for (int32_t s = 0; s < n_slots; s++) next[s] = ctx_before + s; /* different lengths */
    for (int32_t t = 0; t < n_tok; t++) {
        slot[t] = t % n_slots;
        pos[t] = next[slot[t]]++;
    }
    int layer = 1;
    float *row = malloc((size_t)(n_kv_heads * dh) * 4);
    for (int32_t s = 0; s < n_slots; s++) {
        CHECK(kv_cache_reserve(kv, s, next[s], &err) == LLMOPT_OK);
        for (int32_t p = 0; p < next[s]; p++) {
            fill(row, n_kv_heads * dh, 1.0f);
            kv_cache_write(kv, kv->k, layer, s, p, 0, row, n_kv_heads * dh);
            fill(row, n_kv_heads * dh, 1.0f);
            kv_cache_write(kv, kv->v, layer, s, p, 0, row, n_kv_heads * dh);
        }
    }
    float *q = malloc((size_t)(n_heads * n_tok * dh) * 4);
    float *out = malloc((size_t)(n_heads * n_tok * dh) * 4);
    fill(q, n_heads * n_tok * dh, 2.0f);
    int64_t per_thread = cpu_attention_scratch_floats(n_heads, n_kv_heads, dh);
    float *scratch = malloc((size_t)(per_thread * pool_threads(pool)) * 4);
    struct cpu_attention a = {
        .q = q, .out = out, .pos = pos, .slot = slot, .n_heads = n_heads, .n_kv_heads = n_kv_heads,
        .n_tok = n_tok, .head_dim = dh, .scale = 1.0f / sqrtf((float)dh), .window = window,
        .layer = layer, .kv = kv, .scratch = scratch, .scratch_per_thread = per_thread,
    };
    cpu_attention_run(&a, kern, pool);
    if (keep) memcpy(keep, out, (size_t)(n_heads * n_tok * dh) * sizeof *out);
    int64_t group = n_heads / n_kv_heads;
    double *sc = malloc((size_t)max_pos * sizeof(double)), *expect = malloc((size_t)dh * sizeof(double));
    for (int32_t t = 0; t < n_tok && *failures < 3; t++)
        for (int64_t h = 0; h < n_heads; h++) {
            int32_t p = pos[t];
            int32_t first = window > 0 && p + 1 > window ? p + 1 - (int32_t)window : 0;
            const float *qv = q + (h * n_tok + t) * dh;
            double mx = -INFINITY, sum = 0;
            for (int32_t j = first; j <= p; j++) {
                kv_cache_read(kv, kv->k, layer, slot[t], j, (h / group) * dh, row, dh);
                double dot = 0;
                for (int64_t d = 0; d < dh; d++) dot += (double)qv[d] * row[d];
                sc[j] = dot * a.scale;
                mx = sc[j] > mx ? sc[j] : mx;
            }
            for (int32_t j = first; j <= p; j++) sum += (sc[j] = exp(sc[j] - mx));
            for (int64_t d = 0; d < dh; d++) expect[d] = 0;
            for (int32_t j = first; j <= p; j++) {
                kv_cache_read(kv, kv->v, layer, slot[t], j, (h / group) * dh, row, dh);
                for (int64_t d = 0; d < dh; d++) expect[d] += sc[j] / sum * row[d];
            }
            for (int64_t d = 0; d < dh; d++) {
                double acc = expect[d];
                float got = out[(t * n_heads + h) * dh + d];
                if (!(fabs(got - acc) <= 2e-5 * (1 + fabs(acc)))) {
                    fprintf(stderr,
                            "  %s attention kv %s H=%lld Hkv=%lld Dh=%lld ctx=%d n_tok=%d window=%lld threads=%d: "
                            "out[t=%d,h=%lld,%lld] = %.7g, expected %.7g\n",
                            cpu_isa_name(kern->isa), kv_dtype_name(dtype), (long long)n_heads, (long long)n_kv_heads,
                            (long long)dh, ctx_before, n_tok, (long long)window, pool_threads(pool), t,
                            (long long)h, (long long)d, got, acc);
                    (*failures)++;
                    break;
                }
            }
        }
    free(sc);
    free(expect);
    free(row);
    free(q);
    free(out);
    free(scratch);
    free(pos);
    free(slot);
    kv_cache_free(kv);
}

static void test_attention(void) {
    struct llmopt_err err = {0};
    for (int nt = 1; nt <= 3; nt += test_sanitized() ? 2 : 1) {
        struct cpu_pool *pool = NULL;
        CHECK_MSG(pool_create(nt, &pool, &err) == LLMOPT_OK, "%s", err.msg);
        for (int isa = 0; isa < CPU_ISA_COUNT; isa++) {
            const struct cpu_isa_kernels *kern = isa_or_skip((enum cpu_isa)isa);
            if (!kern) continue;
            int failures = 0;
            /* {8, 2}: group 4; {8, 4} x 8: stories260K; {12, 3}, {4, 4}: group 4 and 1 */
            static const int64_t heads[][2] = {{1, 1}, {4, 2}, {8, 8}, {6, 2}, {16, 8}, {8, 2}, {8, 4}, {12, 3}, {4, 4}};
            static const int64_t dims[] = {8, 16, 33, 64, 128};
            /* heads of one vector or less also through the per-KV-head kernels (the
             * all-heads decode kernel off) */
            for (int mode = 0; mode < 2; mode++)
            for (int dt = 0; dt < KV_DTYPE_COUNT; dt++)
                for (size_t hi = 0; hi < LLMOPT_ARRAY_LEN(heads); hi++)
                    for (size_t di = 0; di < LLMOPT_ARRAY_LEN(dims); di++) {
                        enum kv_dtype t = (enum kv_dtype)dt;
                        int64_t h = heads[hi][0], hkv = heads[hi][1], dh = dims[di];
                        if (t == KV_DTYPE_Q8_0 && dh % KV_Q8_0_BLOCK) continue;
                        if (hi >= 6 && dh > 16) continue; /* the extra head shapes: small heads only */
                        if (mode == 1 && (dh > 16 || t == KV_DTYPE_Q8_0)) continue;
                        cpu_attention_heads = mode == 0;
                        /* decode at several lengths (chunk edges at 64; 300: three of the
                         * decode kernel's chunks), and a prefill chunk */
                        int32_t ctxs[] = {0, 1, 63, 64, 130, 300};
                        for (size_t ci = 0; ci < LLMOPT_ARRAY_LEN(ctxs); ci++)
                            check_attention(kern, pool, t, h, hkv, dh, ctxs[ci], 1, 0, 1, 16, NULL, &failures);
                        check_attention(kern, pool, t, h, hkv, dh, 0, 70, 0, 1, 16, NULL, &failures);
                        check_attention(kern, pool, t, h, hkv, dh, 5, 9, 4, 3, 16, NULL, &failures);
                        check_attention(kern, pool, t, h, hkv, dh, 90, 3, 70, 2, 16, NULL, &failures);
                        /* a prefill chunk continuing a sequence, with a window inside the
                         * query blocks and across position chunks */
                        check_attention(kern, pool, t, h, hkv, dh, 50, 40, 20, 1, 16, NULL, &failures);
                        /* decode batches: one token for each of several sequences (the
                         * decode kernel), contexts across its 128-position chunks, with
                         * and without a window, blocks VLEN does not divide; one thread
                         * count is enough for them (the kernel runs per work item) */
                        if (nt != 1) continue;
                        check_attention(kern, pool, t, h, hkv, dh, 3, 8, 0, 8, 16, NULL, &failures);
                        check_attention(kern, pool, t, h, hkv, dh, 127, 3, 0, 3, 5, NULL, &failures);
                        check_attention(kern, pool, t, h, hkv, dh, 200, 2, 150, 2, 16, NULL, &failures);
                    }
            cpu_attention_heads = true;
            CHECK_MSG(failures == 0, "%s, %d threads: attention failed", cpu_isa_name(kern->isa), nt);
        }
        pool_free(pool);
    }
}

/* One token over a long context takes the segmented kernel (CPU_ATT_SEG_MIN positions
 * or more): against the oracle at segment counts from 2 to the cap,
 * odd ones, with a window, and the same bits at 1, 2 and 3 threads (segments depend on
 * the context alone). */
static void test_attention_segments(void) {
    struct llmopt_err err = {0};
    static const int64_t shapes[][3] = {{16, 8, 128}, {6, 2, 33}, {4, 4, 64}, {8, 8, 8}};
    static const int32_t ctxs[][2] = {{255, 0}, {256, 0}, {900, 0}, {1500, 700}, {2300, 0}};
    for (int isa = 0; isa < CPU_ISA_COUNT; isa++) {
        const struct cpu_isa_kernels *kern = isa_or_skip((enum cpu_isa)isa);
        if (!kern) continue;
        int failures = 0;
        cpu_attention_heads = false; /* stories260K-sized heads through it too */
        for (int dt = 0; dt < KV_DTYPE_COUNT; dt++)
            for (size_t si = 0; si < LLMOPT_ARRAY_LEN(shapes); si++)
                for (size_t ci = 0; ci < LLMOPT_ARRAY_LEN(ctxs); ci++) {
                    enum kv_dtype t = (enum kv_dtype)dt;
                    int64_t h = shapes[si][0], hkv = shapes[si][1], dh = shapes[si][2];
                    if (t == KV_DTYPE_Q8_0 && dh % KV_Q8_0_BLOCK) continue;
                    float *out[3];
                    const uint64_t inputs = rng_state; /* the same cache and query at every thread count */
                    for (int nt = 1; nt <= 3; nt++) {
                        struct cpu_pool *pool = NULL;
                        CHECK_MSG(pool_create(nt, &pool, &err) == LLMOPT_OK, "%s", err.msg);
                        out[nt - 1] = malloc((size_t)(h * dh) * sizeof(float));
                        rng_state = inputs;
                        check_attention(kern, pool, t, h, hkv, dh, ctxs[ci][0], 1, ctxs[ci][1], 1, 16, out[nt - 1],
                                        &failures);
                        pool_free(pool);
                    }
                    CHECK_MSG(!memcmp(out[0], out[1], (size_t)(h * dh) * sizeof(float)) &&
                                  !memcmp(out[0], out[2], (size_t)(h * dh) * sizeof(float)),
                              "%s kv %s H=%lld Hkv=%lld Dh=%lld ctx=%d: output depends on the thread count",
                              cpu_isa_name(kern->isa), kv_dtype_name(t), (long long)h, (long long)hkv, (long long)dh,
                              ctxs[ci][0]);
                    for (int i = 0; i < 3; i++) free(out[i]);
                }
        cpu_attention_heads = true;
        CHECK_MSG(failures == 0, "%s: segmented attention failed", cpu_isa_name(kern->isa));
    }
}

/* ---- rms_norm, rope, exp ---------------------------------------------------------- */

static void test_rms_norm_rope_exp(void) {
    struct llmopt_err err = {0};
    struct cpu_pool *pool = NULL;
    CHECK_MSG(pool_create(3, &pool, &err) == LLMOPT_OK, "%s", err.msg);
    for (int isa = 0; isa < CPU_ISA_COUNT; isa++) {
        const struct cpu_isa_kernels *kern = isa_or_skip((enum cpu_isa)isa);
        if (!kern) continue;
        int64_t ds[] = {1, 8, 31, 64, 100, 1024, 4099};
        for (size_t di = 0; di < LLMOPT_ARRAY_LEN(ds); di++) {
            int64_t d = ds[di], rows = 1 + rng_u32() % 40;
            float *x = malloc((size_t)(rows * d) * 4), *w = malloc((size_t)d * 4), *o = malloc((size_t)(rows * d) * 4);
            fill(x, rows * d, 3.0f);
            fill(w, d, 1.0f);
            struct cpu_rms_norm op = {.x = x, .w = w, .o = o, .rows = rows, .d = d, .eps = 1e-5f};
            cpu_rms_norm_run(&op, kern, pool);
            int bad = 0;
            for (int64_t r = 0; r < rows; r++) {
                double ss = 0;
                for (int64_t i = 0; i < d; i++) ss += (double)x[r * d + i] * x[r * d + i];
                double scale = 1.0 / sqrt(ss / (double)d + 1e-5);
                for (int64_t i = 0; i < d; i++) {
                    double ref = x[r * d + i] * scale * w[i];
                    if (!(fabs(o[r * d + i] - ref) <= 2e-6 * (fabs(ref) + 1e-3))) bad++;
                }
            }
            CHECK_MSG(bad == 0, "%s rms_norm d=%lld rows=%lld: %d values off", cpu_isa_name(kern->isa),
                      (long long)d, (long long)rows, bad);
            free(x);
            free(w);
            free(o);
        }
        /* rope: x [A, B, D] with cos/sin [1, B, D] broadcast over A */
        int64_t dims_d[] = {2, 8, 30, 64, 128};
        for (size_t di = 0; di < LLMOPT_ARRAY_LEN(dims_d); di++) {
            int64_t d = dims_d[di], a_n = 3, b_n = 1 + rng_u32() % 50, rows = a_n * b_n;
            float *x = malloc((size_t)(rows * d) * 4), *o = malloc((size_t)(rows * d) * 4);
            float *c = malloc((size_t)(b_n * d) * 4), *s = malloc((size_t)(b_n * d) * 4);
            fill(x, rows * d, 2.0f);
            fill(c, b_n * d, 1.0f);
            fill(s, b_n * d, 1.0f);
            struct cpu_rope op = {.x = x, .o = o, .cos_t = c, .sin_t = s, .rows = rows, .d = d, .rank = 2,
                                  .dims = {a_n, b_n}, .strides = {0, d}};
            cpu_rope_run(&op, kern, pool);
            int bad = 0;
            int64_t half = d / 2;
            for (int64_t r = 0; r < rows; r++) {
                const float *xr = x + r * d, *cr = c + (r % b_n) * d, *sr = s + (r % b_n) * d;
                for (int64_t i = 0; i < half; i++) {
                    double r0 = (double)xr[i] * cr[i] - (double)xr[i + half] * sr[i];
                    double r1 = (double)xr[i + half] * cr[i + half] + (double)xr[i] * sr[i + half];
                    if (!(fabs(o[r * d + i] - r0) <= 1e-6 * 4)) bad++;
                    if (!(fabs(o[r * d + i + half] - r1) <= 1e-6 * 4)) bad++;
                }
            }
            CHECK_MSG(bad == 0, "%s rope d=%lld: %d values off", cpu_isa_name(kern->isa), (long long)d, bad);
            free(x);
            free(o);
            free(c);
            free(s);
        }
        /* exp over the f32 range */
        enum { N_EXP = 4001 };
        float src[N_EXP], dst[N_EXP];
        for (int i = 0; i < N_EXP; i++) src[i] = -87.0f + 175.0f * (float)i / (N_EXP - 1) + rng_f() * 0.01f;
        src[0] = 0.0f;
        kern->exp_row(src, dst, N_EXP);
        double worst = 0;
        for (int i = 0; i < N_EXP; i++) {
            double ref = exp((double)src[i]), rel = fabs(dst[i] - ref) / ref;
            worst = rel > worst ? rel : worst;
        }
        CHECK_MSG(worst < 4e-7, "%s exp: relative error %.3g", cpu_isa_name(kern->isa), worst);
    }
    pool_free(pool);
}

/* ---- whole models: the fast backend against the reference executor -------------- */

/* Logits of a prompt (prefill in chunks of 7) and 6 greedy decode steps. */
static void model_logits(const char *path, bool reference, int n_threads, float *out, int32_t *n_vocab) {
    struct llmopt_err err = {0};
    struct llmopt_model *m = NULL;
    struct llmopt_session *s = NULL;
    if (reference)
        setenv("LLMOPT_CPU_REF", "1", 1);
    else
        unsetenv("LLMOPT_CPU_REF");
    CHECK_MSG(llmopt_model_load(path, NULL, &m, &err) == LLMOPT_OK, "%s", err.msg);
    if (!m) return;
    struct llmopt_session_opts so = {.n_ctx = 64, .n_batch = 7, .n_threads = n_threads};
    CHECK_MSG(llmopt_session_create(m, &so, &s, &err) == LLMOPT_OK, "%s", err.msg);
    *n_vocab = llmopt_model_n_vocab(m);
    if (s) {
        int32_t prompt[20];
        for (int i = 0; i < 20; i++) prompt[i] = 1 + (int32_t)((i * 37 + 11) % (*n_vocab - 1));
        const float *logits = NULL;
        CHECK_MSG(llmopt_session_append(s, 0, prompt, 20, &logits, &err) == LLMOPT_OK, "%s", err.msg);
        for (int step = 0; step < 7 && logits; step++) {
            if (out) memcpy(out + (size_t)step * (size_t)*n_vocab, logits, (size_t)*n_vocab * 4);
            int32_t best = 0;
            for (int32_t v = 1; v < *n_vocab; v++) best = logits[v] > logits[best] ? v : best;
            if (step < 6) CHECK(llmopt_session_append(s, 0, &best, 1, &logits, &err) == LLMOPT_OK);
        }
    }
    llmopt_session_free(s);
    llmopt_model_free(m);
    unsetenv("LLMOPT_CPU_REF");
}

/* Files of the other block types, written for the test: a tiny-llama-shaped synth
 * (rows of 256 and 768) as q4_k_m (q4_K + q6_K), q5_k and iq4_xs, and stories260K
 * (rows of 64: not whole super-blocks) quantized to q5_0. NULL paths where one
 * cannot be made (reported). */
static void make_kq_models(char paths[4][64]) {
    static const char *const synth_types[] = {"q4_k_m", "q5_k", "iq4_xs"};
    struct llmopt_err err = {0};
    struct synth_report rep;
    for (int i = 0; i < 4; i++) {
        snprintf(paths[i], 64, "/tmp/llmopt_kq_model_%d_%d.gguf", (int)getpid(), i);
        enum llmopt_status st;
        if (i < 3) {
            struct synth_opts so = {.like = "tiny-llama", .type = synth_types[i], .out_path = paths[i],
                                    .seed = 7 + (uint64_t)i, .threads = 1};
            st = synth_write(&so, &rep, &err);
        } else {
            struct synth_quantize_opts qo = {.in_path = "../shared/models/stories260K/stories260K-F32.gguf",
                                             .out_path = paths[i], .type = "q5_0", .threads = 1};
            st = synth_quantize(&qo, &rep, &err);
        }
        if (st) {
            fprintf(stderr, "  skip: %s: %s\n", paths[i], err.msg);
            paths[i][0] = 0;
        }
    }
}

static void test_models_fast_vs_reference(void) {
    char kq[4][64];
    make_kq_models(kq);
    const struct {
        const char *path;
        double tol; /* max |fast - ref| / max |ref| over each logits row */
    } models[] = {
        {"../shared/models/stories260K/stories260K-F32.gguf", 1e-4},
        {"../shared/models/stories260K/stories260K-Q8_0.gguf", 3e-2},
        {"../shared/models/stories260K/stories260K-Q4_0.gguf", 3e-2},
        {"tests/golden/llama_tiny/model.gguf", 1e-4},
        {kq[0], 3e-2},
        {kq[1], 3e-2},
        {kq[2], 3e-2},
        {kq[3], 3e-2},
    };
    for (size_t i = 0; i < LLMOPT_ARRAY_LEN(models); i++) {
        FILE *f = fopen(models[i].path, "rb");
        if (!f) {
            fprintf(stderr, "  skip: %s not found\n", models[i].path);
            continue;
        }
        fclose(f);
        int32_t nv = 0;
        model_logits(models[i].path, true, 1, NULL, &nv);
        if (nv <= 0) continue;
        float *ref = calloc((size_t)nv * 7, 4), *fast = calloc((size_t)nv * 7, 4);
        model_logits(models[i].path, true, 1, ref, &nv);
        for (int nt = 1; nt <= 3; nt += test_sanitized() ? 2 : 1) {
            model_logits(models[i].path, false, nt, fast, &nv);
            for (int step = 0; step < 7; step++) {
                const float *a = ref + (size_t)step * (size_t)nv, *b = fast + (size_t)step * (size_t)nv;
                double mx = 0, diff = 0;
                for (int32_t v = 0; v < nv; v++) {
                    mx = fabs(a[v]) > mx ? fabs(a[v]) : mx;
                    diff = fabs(a[v] - b[v]) > diff ? fabs(a[v] - b[v]) : diff;
                }
                CHECK_MSG(diff <= models[i].tol * mx, "%s threads=%d step %d: max diff %.3g of max %.3g",
                          models[i].path, nt, step, diff, mx);
            }
        }
        free(ref);
        free(fast);
    }
    for (int i = 0; i < 4; i++)
        if (kq[i][0]) unlink(kq[i]);
}

/* Logits of a 40-token prompt in one forward (rows enough for the row-wise ops to split
 * over the pool) and 4 greedy steps, with the fused schedule on or off
 * ($LLMOPT_CPU_FUSE); returns the kernels the session ran. */
static uint64_t fused_logits(const char *path, bool fuse, float *out, int32_t n_vocab) {
    struct llmopt_err err = {0};
    struct llmopt_model *m = NULL;
    struct llmopt_session *s = NULL;
    uint64_t kernels = 0;
    if (fuse)
        unsetenv("LLMOPT_CPU_FUSE");
    else
        setenv("LLMOPT_CPU_FUSE", "0", 1);
    CHECK_MSG(llmopt_model_load(path, NULL, &m, &err) == LLMOPT_OK, "%s", err.msg);
    struct llmopt_session_opts so = {.n_ctx = 64, .n_batch = 48, .n_threads = 2};
    if (m) CHECK_MSG(llmopt_session_create(m, &so, &s, &err) == LLMOPT_OK, "%s", err.msg);
    if (s) {
        int32_t prompt[40];
        for (int i = 0; i < 40; i++) prompt[i] = 1 + (int32_t)((i * 101 + 7) % (n_vocab - 1));
        const float *logits = NULL;
        CHECK_MSG(llmopt_session_append(s, 0, prompt, 40, &logits, &err) == LLMOPT_OK, "%s", err.msg);
        for (int step = 0; step < 5 && logits; step++) {
            memcpy(out + (size_t)step * (size_t)n_vocab, logits, (size_t)n_vocab * 4);
            int32_t best = 0;
            for (int32_t v = 1; v < n_vocab; v++) best = logits[v] > logits[best] ? v : best;
            if (step < 4) CHECK(llmopt_session_append(s, 0, &best, 1, &logits, &err) == LLMOPT_OK);
        }
        kernels = llmopt_session_kernels_run(s);
    }
    llmopt_session_free(s);
    llmopt_model_free(m);
    unsetenv("LLMOPT_CPU_FUSE");
    return kernels;
}

/* The fused schedule's on/off parity: a Qwen3-shaped model (q/k rms_norm -> permute ->
 * rope chains, which it fuses) gives the same bits with it as without, prefill and
 * decode, and runs fewer kernels. */
static void test_fused_schedule_same_bits(void) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/llmopt_fuse_model_%d.gguf", (int)getpid());
    struct llmopt_err err = {0};
    struct synth_report rep;
    struct synth_opts so = {.like = "tiny-qwen3", .type = "f32", .out_path = path, .seed = 11, .threads = 1};
    if (synth_write(&so, &rep, &err)) {
        fprintf(stderr, "  skip: tiny-qwen3: %s\n", err.msg);
        return;
    }
    const int32_t nv = 151936;
    float *on = calloc((size_t)nv * 5, 4), *off = calloc((size_t)nv * 5, 4);
    uint64_t k_on = fused_logits(path, true, on, nv), k_off = fused_logits(path, false, off, nv);
    CHECK_MSG(k_on > 0 && k_on < k_off, "fused schedule ran %llu kernels, unfused %llu", (unsigned long long)k_on,
              (unsigned long long)k_off);
    CHECK_MSG(memcmp(on, off, (size_t)nv * 5 * 4) == 0, "fused schedule changed the logits");
    free(on);
    free(off);
    unlink(path);
}

/* store_f16 (KV cache appends) against fp16_from_f32 on random values, specials
 * (infinities, NaN, overflow, subnormals, ties) and every length 1..40. */
static void test_store_f16(void) {
    float src[40];
    uint8_t got[80];
    static const float specials[] = {INFINITY, -INFINITY, NAN, 65520.0f, -70000.0f, 65519.0f, 1e-8f, -3e-7f, 5.9604645e-8f,
                                     2.9802322e-8f, 1.00048828125f, 0.0f, -0.0f};
    for (int isa = 0; isa < CPU_ISA_COUNT; isa++) {
        const struct cpu_isa_kernels *kern = isa_or_skip((enum cpu_isa)isa);
        if (!kern) continue;
        int failures = 0;
        for (int n = 1; n <= 40; n++)
            for (int rep = 0; rep < 4; rep++) {
                fill(src, n, rep == 3 ? 1e5f : 2.0f);
                for (int i = 0; i < n; i++)
                    if (rng_u32() % 4 == 0) src[i] = specials[rng_u32() % LLMOPT_ARRAY_LEN(specials)];
                kern->store_f16(src, got, n);
                for (int i = 0; i < n && failures < 3; i++) {
                    uint16_t h, want = fp16_from_f32(src[i]);
                    memcpy(&h, got + 2 * i, 2);
                    if (h != want) {
                        fprintf(stderr, "  %s store_f16 n=%d: [%d] %.9g -> %04x, expected %04x\n", cpu_isa_name(kern->isa),
                                n, i, src[i], h, want);
                        failures++;
                    }
                }
            }
        CHECK_MSG(failures == 0, "%s: store_f16 differs from fp16_from_f32", cpu_isa_name(kern->isa));
    }
}

TEST_MAIN(test_pool, test_quantize_same_on_every_isa, test_linear_1_thread, test_linear_2_threads,
          test_linear_3_threads, test_attention, test_attention_segments, test_rms_norm_rope_exp, test_store_f16,
          test_models_fast_vs_reference, test_fused_schedule_same_bits)
