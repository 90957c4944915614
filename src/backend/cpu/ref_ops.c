/* Scalar reference kernels for every canonical op, and the executor that runs an IR
 * graph over a planned arena. These are the oracle for every optimized kernel: plain
 * loops, f32 accumulation in the order written, no cleverness.
 *
 * The same executor runs the fast kernels (kernels.h: SIMD chosen at run time, split
 * over a thread pool) for linear, attention, rms_norm and rope when the backend is
 * cpu_backend_ops; cpu_ref_backend_ops (or $LLMOPT_CPU_REF=1) keeps every op on the
 * reference kernels below. The fast path also runs a fused schedule (prepare_schedule:
 * nodes whose work a later node does do not run), which gives the same bits. */
#include "backend/backend.h"
#include "backend/fusion.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/pool.h"
#include "backend/op_math.h"
#include "base/clock.h"
#include "base/fp16.h"
#include "format/quant.h"
#include "passes/memplan.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct cpu_state {
    const struct ir_graph *g;
    struct mem_plan plan;
    uint8_t *arena;           /* (plan.arena_bytes) */
    struct ir_extent *extent; /* (n_nodes) extents of the current step */
    float *row_buf;           /* (max weight row length) dequantized weight row */
    float *score_buf;         /* (max positions seen) attention scores; grown in prepare */
    int64_t score_cap;
    float *kv_row_buf;        /* (max head_dim) one KV head's row widened to f32 */
    int64_t max_row;
    struct backend_stats stats;
    /* Fast path (NULL kern: reference kernels only). */
    const struct cpu_isa_kernels *kern;
    struct cpu_pool *pool;
    void *linear_scratch; /* (linear_scratch_bytes) for the largest linear at n_max */
    size_t linear_scratch_bytes;
    float *att_scratch;  /* (n_threads, att_per_thread) */
    /* GEMM panels of every linear's weight, packed once in prepare when they all fit
     * CPU_PACKED_MAX_BYTES (else NULL: packed on each run that takes the GEMM):
     * packed[i] for the PARAM node i, inside packed_buf. */
    const void **packed;
    uint8_t *packed_buf;
    size_t packed_bytes;
    int64_t att_per_thread;
    double *node_seconds; /* (n_nodes) per-node wall time added by each run, or NULL: off */
    /* The fast path's fused schedule (prepare_schedule; NULL: none). skip[i]: node i
     * does not run, a later node does its work. rope_first[i]: for a rope that runs
     * its [rms_norm ->] permute -> rope chain itself, the chain's first node, else -1. */
    uint8_t *skip;
    int32_t *rope_first;
};

/* A node's f32 data: bound weights for params (the binder gives 1-D params f32), the
 * planned arena slot for everything else. */
static float *node_f32(struct cpu_state *s, int32_t i) {
    const struct ir_node *n = &s->g->nodes[i];
    if (n->op == IR_OP_PARAM) {
        LLMOPT_ASSERT(n->weight.dtype == IR_DTYPE_F32);
        return (float *)n->weight.data;
    }
    return (float *)(s->arena + s->plan.offset[i]);
}
static int32_t *node_i32(struct cpu_state *s, int32_t i) {
    return (int32_t *)(s->arena + s->plan.offset[i]);
}

/* Row r of a bound weight [rows, len] as f32: a pointer into the weight when it is
 * already f32, else dequantized into buf. */
static const float *weight_row(const struct ir_weight *w, int64_t r, int64_t len, float *buf) {
    size_t row_bytes = ir_dtype_row_bytes(w->dtype, len);
    const uint8_t *src = (const uint8_t *)w->data + (size_t)r * row_bytes;
    if (w->dtype == IR_DTYPE_F32) return (const float *)src;
    enum ggml_type type = GGML_TYPE_F32;
    const bool known = quant_ggml_type_of(w->dtype, &type);
    LLMOPT_ASSERT(known); /* bind admits only the types quant.c names */
    quant_dequantize_row(type, src, buf, len);
    return buf;
}

/* Advances a multi-index over `ext`; adds the stride deltas to each offset. */
static void index_step(const struct ir_extent *ext, int64_t *idx, int n_off, int64_t *off,
                       int64_t strides[][IR_MAX_RANK]) {
    for (int d = ext->rank - 1; d >= 0; d--) {
        idx[d]++;
        for (int k = 0; k < n_off; k++) off[k] += strides[k][d];
        if (idx[d] < ext->dims[d]) return;
        for (int k = 0; k < n_off; k++) off[k] -= strides[k][d] * ext->dims[d];
        idx[d] = 0;
    }
}

static void run_binary(struct cpu_state *s, const struct ir_node *n, int32_t i) {
    const struct ir_extent *eo = &s->extent[i];
    const float *a = node_f32(s, n->in[0]), *b = node_f32(s, n->in[1]);
    float *o = node_f32(s, i);
    int64_t numel = ir_extent_numel(eo);
    if (numel == 0) return;
    int64_t strides[2][IR_MAX_RANK];
    ir_extent_broadcast_strides(&s->extent[n->in[0]], eo, strides[0]);
    ir_extent_broadcast_strides(&s->extent[n->in[1]], eo, strides[1]);
    int64_t idx[IR_MAX_RANK] = {0}, off[2] = {0, 0};
    for (int64_t e = 0; e < numel; e++) {
        o[e] = op_binary_apply(n->op, a[off[0]], b[off[1]]);
        index_step(eo, idx, 2, off, strides);
    }
}

/* Copies in (broadcast to out's extent, read through in_strides) into contiguous out. */
static void strided_copy(const float *in, const int64_t *in_strides, const struct ir_extent *eo,
                         float *out) {
    int64_t numel = ir_extent_numel(eo);
    if (numel == 0) return;
    int64_t strides[1][IR_MAX_RANK];
    memcpy(strides[0], in_strides, sizeof strides[0]);
    int64_t idx[IR_MAX_RANK] = {0}, off[1] = {0};
    for (int64_t e = 0; e < numel; e++) {
        out[e] = in[off[0]];
        index_step(eo, idx, 1, off, strides);
    }
}

static void contiguous_strides(const struct ir_extent *e, int64_t *strides) {
    int64_t st = 1;
    for (int i = e->rank - 1; i >= 0; i--) {
        strides[i] = st;
        st *= e->dims[i];
    }
}

/* Element strides of permute node n's source, in the order of n's output axes. */
static void permute_source_strides(const struct cpu_state *s, const struct ir_node *n, int64_t *strides) {
    int64_t in_strides[IR_MAX_RANK];
    contiguous_strides(&s->extent[n->in[0]], in_strides);
    for (int d = 0; d < n->attrs.n_axes; d++) strides[d] = in_strides[n->attrs.axes[d]];
}

static void run_reduce(struct cpu_state *s, const struct ir_node *n, int32_t i) {
    const struct ir_extent *ei = &s->extent[n->in[0]];
    const float *x = node_f32(s, n->in[0]);
    float *o = node_f32(s, i);
    int64_t out_numel = ir_extent_numel(&s->extent[i]);
    bool reduced[IR_MAX_RANK] = {0};
    int64_t count = 1;
    for (int k = 0; k < n->attrs.n_axes; k++) {
        reduced[n->attrs.axes[k]] = true;
        count *= ei->dims[n->attrs.axes[k]];
    }
    /* Output strides over the input's index space: 0 on reduced axes. */
    int64_t strides[1][IR_MAX_RANK];
    int64_t st = 1;
    for (int d = ei->rank - 1; d >= 0; d--) {
        strides[0][d] = reduced[d] ? 0 : st;
        if (!reduced[d]) st *= ei->dims[d];
    }
    for (int64_t e = 0; e < out_numel; e++) o[e] = n->op == IR_OP_MAX ? -INFINITY : 0.0f;
    int64_t numel = ir_extent_numel(ei), idx[IR_MAX_RANK] = {0}, off[1] = {0};
    for (int64_t e = 0; e < numel; e++) {
        if (n->op == IR_OP_MAX)
            o[off[0]] = x[e] > o[off[0]] ? x[e] : o[off[0]];
        else
            o[off[0]] += x[e];
        index_step(ei, idx, 1, off, strides);
    }
    if (n->op == IR_OP_MEAN && count > 0)
        for (int64_t e = 0; e < out_numel; e++) o[e] /= (float)count;
}

static void split_at_axis(const struct ir_extent *e, int64_t axis, int64_t *outer, int64_t *len,
                          int64_t *inner) {
    *outer = 1;
    *inner = 1;
    for (int d = 0; d < axis; d++) *outer *= e->dims[d];
    for (int d = (int)axis + 1; d < e->rank; d++) *inner *= e->dims[d];
    *len = e->dims[axis];
}

static void run_softmax(struct cpu_state *s, const struct ir_node *n, int32_t i) {
    int64_t outer, len, inner;
    split_at_axis(&s->extent[i], n->attrs.axis, &outer, &len, &inner);
    const float *x = node_f32(s, n->in[0]);
    float *o = node_f32(s, i);
    for (int64_t a = 0; a < outer; a++)
        for (int64_t c = 0; c < inner; c++) {
            const float *xr = x + a * len * inner + c;
            float *orow = o + a * len * inner + c;
            float mx = -INFINITY;
            for (int64_t k = 0; k < len; k++) mx = xr[k * inner] > mx ? xr[k * inner] : mx;
            float sum = 0;
            for (int64_t k = 0; k < len; k++) {
                orow[k * inner] = expf(xr[k * inner] - mx);
                sum += orow[k * inner];
            }
            for (int64_t k = 0; k < len; k++) orow[k * inner] /= sum;
        }
}

static void run_norm(struct cpu_state *s, const struct ir_node *n, int32_t i) {
    const struct ir_extent *e = &s->extent[i];
    int64_t d = e->dims[e->rank - 1], rows = d ? ir_extent_numel(e) / d : 0;
    const float *x = node_f32(s, n->in[0]);
    const float *w = node_f32(s, n->in[1]);
    const float *b = n->n_in > 2 ? node_f32(s, n->in[2]) : NULL;
    float *o = node_f32(s, i);
    float eps = (float)n->attrs.value;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d;
        float *orow = o + r * d;
        if (n->op == IR_OP_RMS_NORM) {
            float ss = 0;
            for (int64_t k = 0; k < d; k++) ss += xr[k] * xr[k];
            float scale = 1.0f / sqrtf(ss / (float)d + eps);
            for (int64_t k = 0; k < d; k++) orow[k] = xr[k] * scale * w[k];
        } else {
            float mean = 0, var = 0;
            for (int64_t k = 0; k < d; k++) mean += xr[k];
            mean /= (float)d;
            for (int64_t k = 0; k < d; k++) var += (xr[k] - mean) * (xr[k] - mean);
            float scale = 1.0f / sqrtf(var / (float)d + eps);
            for (int64_t k = 0; k < d; k++) orow[k] = (xr[k] - mean) * scale * w[k] + b[k];
        }
    }
}

/* y = act(x W^T + bias) * gate + residual; the epilogue operands follow x and w in
 * that order when the node's flags say they are present. */
static void run_linear(struct cpu_state *s, const struct ir_node *n, int32_t i) {
    const struct ir_extent *ex = &s->extent[n->in[0]];
    const struct ir_node *wn = &s->g->nodes[n->in[1]];
    int64_t k_len = ex->dims[ex->rank - 1], rows = k_len ? ir_extent_numel(ex) / k_len : 0;
    int64_t n_out = wn->shape.dims[0].coef;
    uint32_t fl = n->attrs.linear_flags;
    int k_op = 2;
    const float *x = node_f32(s, n->in[0]);
    const float *bias = fl & IR_LINEAR_BIAS ? node_f32(s, n->in[k_op++]) : NULL;
    const float *gate = fl & IR_LINEAR_GATE ? node_f32(s, n->in[k_op++]) : NULL;
    const float *residual = fl & IR_LINEAR_RESIDUAL ? node_f32(s, n->in[k_op++]) : NULL;
    enum ir_op act = n->attrs.linear_act;
    float *o = node_f32(s, i);
    for (int64_t j = 0; j < n_out; j++) {
        const float *w = weight_row(&wn->weight, j, k_len, s->row_buf);
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = x + r * k_len;
            float acc = 0;
            for (int64_t k = 0; k < k_len; k++) acc += xr[k] * w[k];
            acc += bias ? bias[j] : 0.0f;
            if (act != IR_OP_INPUT) acc = op_unary_apply(act, acc);
            if (gate) acc *= gate[r * n_out + j];
            if (residual) acc += residual[r * n_out + j];
            o[r * n_out + j] = acc;
        }
    }
}

/* Split-half rotary embedding: out = x*cos + rotate_half(x)*sin, where
 * rotate_half(x) = concat(-x[D/2:], x[:D/2]) over the last dim; cos/sin broadcast. */
static void run_rope(struct cpu_state *s, const struct ir_node *n, int32_t i) {
    const struct ir_extent *eo = &s->extent[i];
    int64_t d = eo->dims[eo->rank - 1], half = d / 2, rows = d ? ir_extent_numel(eo) / d : 0;
    const float *x = node_f32(s, n->in[0]), *c = node_f32(s, n->in[1]), *sn = node_f32(s, n->in[2]);
    float *o = node_f32(s, i);
    /* Offsets of each row's cos/sin: broadcast over every dim but the last. */
    struct ir_extent rows_ext = *eo;
    rows_ext.dims[rows_ext.rank - 1] = 1;
    struct ir_extent cs_ext = s->extent[n->in[1]];
    int64_t strides[1][IR_MAX_RANK];
    ir_extent_broadcast_strides(&cs_ext, eo, strides[0]);
    int64_t idx[IR_MAX_RANK] = {0}, off[1] = {0};
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d, *cr = c + off[0], *sr = sn + off[0];
        float *orow = o + r * d;
        for (int64_t k = 0; k < half; k++) {
            orow[k] = xr[k] * cr[k] - xr[k + half] * sr[k];
            orow[k + half] = xr[k + half] * cr[k + half] + xr[k] * sr[k + half];
        }
        index_step(&rows_ext, idx, 1, off, strides);
    }
}

static void run_matmul(struct cpu_state *s, const struct ir_node *n, int32_t i) {
    const struct ir_extent *ea = &s->extent[n->in[0]], *eb = &s->extent[n->in[1]];
    const struct ir_extent *eo = &s->extent[i];
    int64_t p = ea->dims[ea->rank - 2], kk = ea->dims[ea->rank - 1], q = eb->dims[eb->rank - 1];
    struct ir_extent batch_o = *eo, batch_a = *ea, batch_b = *eb;
    batch_o.rank -= 2;
    batch_a.rank -= 2;
    batch_b.rank -= 2;
    int64_t strides[2][IR_MAX_RANK];
    ir_extent_broadcast_strides(&batch_a, &batch_o, strides[0]);
    ir_extent_broadcast_strides(&batch_b, &batch_o, strides[1]);
    const float *a = node_f32(s, n->in[0]), *b = node_f32(s, n->in[1]);
    float *o = node_f32(s, i);
    int64_t n_batch = ir_extent_numel(&batch_o), idx[IR_MAX_RANK] = {0}, off[2] = {0, 0};
    for (int64_t bt = 0; bt < n_batch; bt++) {
        const float *ab = a + off[0] * p * kk, *bb = b + off[1] * kk * q;
        float *ob = o + bt * p * q;
        for (int64_t r = 0; r < p; r++)
            for (int64_t c = 0; c < q; c++) {
                float acc = 0;
                for (int64_t k = 0; k < kk; k++) acc += ab[r * kk + k] * bb[k * q + c];
                ob[r * q + c] = acc;
            }
        index_step(&batch_o, idx, 2, off, strides);
    }
}

static enum llmopt_status run_attention(struct cpu_state *s, const struct ir_node *n, int32_t i,
                                        struct kv_cache *kv, struct llmopt_err *err) {
    const struct ir_extent *eq = &s->extent[n->in[0]], *ek = &s->extent[n->in[1]];
    int64_t n_heads = eq->dims[1], n_tok = eq->dims[2], head_dim = eq->dims[3];
    int64_t n_kv_heads = ek->dims[1], group = n_heads / n_kv_heads;
    const float *q = node_f32(s, n->in[0]), *k = node_f32(s, n->in[1]), *v = node_f32(s, n->in[2]);
    const int32_t *pos = node_i32(s, n->in[3]), *slot = node_i32(s, n->in[4]);
    float *o = node_f32(s, i);
    int32_t layer = n->attrs.kv_layer;
    float scale = (float)n->attrs.value;
    if (!kv || layer >= kv->n_layers || kv->row_elems[layer] != n_kv_heads * head_dim)
        return err_set(err, LLMOPT_ERR_INVALID_ARG,
                       "attention layer %d: KV cache does not match (Hkv %lld x Dh %lld)", layer,
                       (long long)n_kv_heads, (long long)head_dim);
    if (kv->dtype == KV_DTYPE_Q8_0 && head_dim % KV_Q8_0_BLOCK)
        return err_set(err, LLMOPT_ERR_UNSUPPORTED, "attention layer %d: head size %lld is not a multiple of %d (q8_0 KV)",
                       layer, (long long)head_dim, KV_Q8_0_BLOCK);
    /* 1. Append every token's K and V to its sequence, converted to the cache's type.
     * q/k/v are [1, heads, N, Dh]. */
    if (s->kern && kv->dtype == KV_DTYPE_F16) /* the ISA's f16 conversion: the same values */
        for (int64_t t = 0; t < n_tok; t++) {
            uint8_t *kr = kv_cache_row(kv, kv->k, layer, slot[t], pos[t]);
            uint8_t *vr = kv_cache_row(kv, kv->v, layer, slot[t], pos[t]);
            for (int64_t h = 0; h < n_kv_heads; h++) {
                s->kern->store_f16(k + (h * n_tok + t) * head_dim, kr + 2 * h * head_dim, head_dim);
                s->kern->store_f16(v + (h * n_tok + t) * head_dim, vr + 2 * h * head_dim, head_dim);
            }
        }
    else
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t h = 0; h < n_kv_heads; h++) {
                kv_cache_write(kv, kv->k, layer, slot[t], pos[t], h * head_dim, k + (h * n_tok + t) * head_dim, head_dim);
                kv_cache_write(kv, kv->v, layer, slot[t], pos[t], h * head_dim, v + (h * n_tok + t) * head_dim, head_dim);
            }
    /* 2. Each token attends to positions [first, pos] of its own sequence. */
    if (s->kern) {
        for (int64_t t = 0; t < n_tok; t++)
            if (pos[t] + 1 > s->score_cap)
                return err_set(err, LLMOPT_ERR_LIMIT, "attention: %lld positions exceed the plan's %lld",
                               (long long)pos[t] + 1, (long long)s->score_cap);
        struct cpu_attention a = {
            .q = q, .out = o, .pos = pos, .slot = slot,
            .n_heads = n_heads, .n_kv_heads = n_kv_heads, .n_tok = n_tok, .head_dim = head_dim,
            .scale = scale, .window = n->attrs.window, .layer = layer, .kv = kv,
            .scratch = s->att_scratch, .scratch_per_thread = s->att_per_thread,
        };
        cpu_attention_run(&a, s->kern, s->pool);
        return LLMOPT_OK;
    }
    for (int64_t t = 0; t < n_tok; t++) {
        int32_t p = pos[t];
        int32_t first = cpu_attention_first(n->attrs.window, p);
        int64_t n_ctx = p + 1 - first;
        if (n_ctx > s->score_cap)
            return err_set(err, LLMOPT_ERR_LIMIT, "attention: %lld positions exceed the plan's %lld",
                           (long long)n_ctx, (long long)s->score_cap);
        for (int64_t h = 0; h < n_heads; h++) {
            const float *qv = q + (h * n_tok + t) * head_dim;
            int64_t kvh = h / group;
            float mx = -INFINITY;
            float *kr = s->kv_row_buf;
            for (int32_t j = first; j <= p; j++) {
                kv_cache_read(kv, kv->k, layer, slot[t], j, kvh * head_dim, kr, head_dim);
                float dot = 0;
                for (int64_t d = 0; d < head_dim; d++) dot += qv[d] * kr[d];
                s->score_buf[j - first] = dot * scale;
                mx = s->score_buf[j - first] > mx ? s->score_buf[j - first] : mx;
            }
            float sum = 0;
            for (int64_t j = 0; j < n_ctx; j++) {
                s->score_buf[j] = expf(s->score_buf[j] - mx);
                sum += s->score_buf[j];
            }
            float *ov = o + (t * n_heads + h) * head_dim; /* out [1, N, H, Dh] */
            for (int64_t d = 0; d < head_dim; d++) ov[d] = 0;
            float *vr = s->kv_row_buf;
            for (int32_t j = first; j <= p; j++) {
                kv_cache_read(kv, kv->v, layer, slot[t], j, kvh * head_dim, vr, head_dim);
                float w = s->score_buf[j - first] / sum;
                for (int64_t d = 0; d < head_dim; d++) ov[d] += w * vr[d];
            }
        }
    }
    return LLMOPT_OK;
}

/* ---- fast kernels (kernels.h) ---------------------------------------------------- */

static bool fast_linear_ok(const struct cpu_state *s, const struct ir_node *n) {
    enum ir_dtype t = s->g->nodes[n->in[1]].weight.dtype;
    const struct ir_extent *ex = &s->extent[n->in[0]];
    int64_t k = ex->dims[ex->rank - 1], rows = k ? ir_extent_numel(ex) / k : 0;
    if (!cpu_linear_supports(t, k)) return false;
    return cpu_linear_scratch_bytes(s->kern, t, rows, k, pool_threads(s->pool)) <= s->linear_scratch_bytes;
}

static void run_linear_fast(struct cpu_state *s, const struct ir_node *n, int32_t i) {
    const struct ir_extent *ex = &s->extent[n->in[0]];
    const struct ir_node *wn = &s->g->nodes[n->in[1]];
    uint32_t fl = n->attrs.linear_flags;
    int k_op = 2;
    struct cpu_linear op = {
        .x = node_f32(s, n->in[0]),
        .k = ex->dims[ex->rank - 1],
        .n_out = wn->shape.dims[0].coef,
        .w = wn->weight.data,
        .wtype = wn->weight.dtype,
        .act = n->attrs.linear_act,
        .y = node_f32(s, i),
        .scratch = s->linear_scratch,
        .packed = s->packed ? s->packed[n->in[1]] : NULL,
    };
    op.rows = op.k ? ir_extent_numel(ex) / op.k : 0;
    op.bias = fl & IR_LINEAR_BIAS ? node_f32(s, n->in[k_op++]) : NULL;
    op.gate = fl & IR_LINEAR_GATE ? node_f32(s, n->in[k_op++]) : NULL;
    op.residual = fl & IR_LINEAR_RESIDUAL ? node_f32(s, n->in[k_op++]) : NULL;
    cpu_linear_run(&op, s->kern, s->pool);
}

static void run_rms_norm_fast(struct cpu_state *s, const struct ir_node *n, int32_t i) {
    const struct ir_extent *e = &s->extent[i];
    struct cpu_rms_norm op = {
        .x = node_f32(s, n->in[0]),
        .w = node_f32(s, n->in[1]),
        .o = node_f32(s, i),
        .d = e->dims[e->rank - 1],
        .eps = (float)n->attrs.value,
    };
    op.rows = op.d ? ir_extent_numel(e) / op.d : 0;
    cpu_rms_norm_run(&op, s->kern, s->pool);
}

static void run_rope_fast(struct cpu_state *s, const struct ir_node *n, int32_t i) {
    const struct ir_extent *eo = &s->extent[i];
    int64_t strides[IR_MAX_RANK];
    ir_extent_broadcast_strides(&s->extent[n->in[1]], eo, strides);
    struct cpu_rope op = {
        .x = node_f32(s, n->in[0]),
        .o = node_f32(s, i),
        .cos_t = node_f32(s, n->in[1]),
        .sin_t = node_f32(s, n->in[2]),
        .d = eo->dims[eo->rank - 1],
        .rank = eo->rank - 1, /* rows: every dim but the last */
    };
    op.rows = op.d ? ir_extent_numel(eo) / op.d : 0;
    for (int d = 0; d < op.rank; d++) {
        op.dims[d] = eo->dims[d];
        op.strides[d] = strides[d];
    }
    int32_t first = s->rope_first ? s->rope_first[i] : -1;
    if (first >= 0) { /* the chain's source, through the skipped permute [and rms_norm] */
        const struct ir_node *p = &s->g->nodes[n->in[0]];
        permute_source_strides(s, p, op.x_strides); /* the last axis's stride is unused */
        op.x_permuted = true;
        if (first != n->in[0]) {
            const struct ir_node *r = &s->g->nodes[first];
            op.x = node_f32(s, r->in[0]);
            op.norm_w = node_f32(s, r->in[1]);
            op.eps = (float)r->attrs.value;
        } else {
            op.x = node_f32(s, p->in[0]);
        }
    }
    cpu_rope_run(&op, s->kern, s->pool);
}

/* A permute that keeps the last axis in place moves whole rows: one memcpy per row
 * instead of an index step per element, rows split over the pool. */
static bool run_permute_rows(struct cpu_state *s, const struct ir_node *n, int32_t i) {
    const struct ir_extent *eo = &s->extent[i];
    int rank = eo->rank;
    if (rank < 1 || n->attrs.axes[rank - 1] != rank - 1) return false;
    struct cpu_row_gather op = {.x = node_f32(s, n->in[0]), .o = node_f32(s, i), .d = eo->dims[rank - 1],
                                .rank = rank - 1};
    op.rows = op.d ? ir_extent_numel(eo) / op.d : 0;
    permute_source_strides(s, n, op.x_strides); /* the last axis's stride is unused */
    for (int d = 0; d < op.rank; d++) op.dims[d] = eo->dims[d];
    cpu_row_gather_run(&op, s->pool);
    return true;
}

static enum llmopt_status run_node_kernel(struct cpu_state *s, int32_t i, struct kv_cache *kv,
                                          struct llmopt_err *err) {
    const struct ir_graph *g = s->g;
    const struct ir_node *n = &g->nodes[i];
    const struct ir_extent *eo = &s->extent[i];
    switch (n->op) {
    case IR_OP_INPUT:
    case IR_OP_PARAM:
    case IR_OP_RESHAPE:
    case IR_OP_CONST:
    case IR_OP_ROPE_FREQS: return LLMOPT_OK; /* set up by prepare/run, or a view */
    case IR_OP_EMBEDDING: {
        const struct ir_node *tn = &g->nodes[n->in[0]];
        int64_t vocab = tn->shape.dims[0].coef, d = tn->shape.dims[1].coef;
        const int32_t *ids = node_i32(s, n->in[1]);
        int64_t n_ids = ir_extent_numel(&s->extent[n->in[1]]);
        float *o = node_f32(s, i);
        for (int64_t t = 0; t < n_ids; t++) {
            if (ids[t] < 0 || ids[t] >= vocab)
                return err_set(err, LLMOPT_ERR_INVALID_ARG, "token id %d out of range [0, %lld)",
                               ids[t], (long long)vocab);
            const float *row = weight_row(&tn->weight, ids[t], d, o + t * d);
            if (row != o + t * d) memcpy(o + t * d, row, (size_t)d * sizeof(float));
        }
        return LLMOPT_OK;
    }
    case IR_OP_LINEAR:
        if (s->kern && fast_linear_ok(s, n)) {
            run_linear_fast(s, n, i);
            return LLMOPT_OK;
        }
        run_linear(s, n, i);
        return LLMOPT_OK;
    case IR_OP_ROPE:
        if (s->kern && s->extent[i].dims[s->extent[i].rank - 1] % 2 == 0) {
            run_rope_fast(s, n, i);
            return LLMOPT_OK;
        }
        run_rope(s, n, i);
        return LLMOPT_OK;
    case IR_OP_MATMUL: run_matmul(s, n, i); return LLMOPT_OK;
    case IR_OP_MEAN:
    case IR_OP_SUM:
    case IR_OP_MAX: run_reduce(s, n, i); return LLMOPT_OK;
    case IR_OP_SOFTMAX: run_softmax(s, n, i); return LLMOPT_OK;
    case IR_OP_RMS_NORM:
        if (s->kern) {
            run_rms_norm_fast(s, n, i);
            return LLMOPT_OK;
        }
        run_norm(s, n, i);
        return LLMOPT_OK;
    case IR_OP_LAYER_NORM: run_norm(s, n, i); return LLMOPT_OK;
    case IR_OP_PERMUTE: {
        if (s->kern && run_permute_rows(s, n, i)) return LLMOPT_OK;
        int64_t strides[IR_MAX_RANK];
        permute_source_strides(s, n, strides);
        strided_copy(node_f32(s, n->in[0]), strides, eo, node_f32(s, i));
        return LLMOPT_OK;
    }
    case IR_OP_EXPAND: {
        int64_t strides[IR_MAX_RANK];
        ir_extent_broadcast_strides(&s->extent[n->in[0]], eo, strides);
        strided_copy(node_f32(s, n->in[0]), strides, eo, node_f32(s, i));
        return LLMOPT_OK;
    }
    case IR_OP_SLICE: {
        const struct ir_extent *ei = &s->extent[n->in[0]];
        int64_t strides[IR_MAX_RANK];
        contiguous_strides(ei, strides);
        int64_t base = n->attrs.start.coef * strides[n->attrs.axis];
        strides[n->attrs.axis] *= n->attrs.step;
        strided_copy(node_f32(s, n->in[0]) + base, strides, eo, node_f32(s, i));
        return LLMOPT_OK;
    }
    case IR_OP_CONCAT: {
        int64_t outer, len_out, inner;
        split_at_axis(eo, n->attrs.axis, &outer, &len_out, &inner);
        float *o = node_f32(s, i);
        int64_t at = 0;
        for (int k = 0; k < n->n_in; k++) {
            int64_t len = s->extent[n->in[k]].dims[n->attrs.axis];
            const float *x = node_f32(s, n->in[k]);
            for (int64_t a = 0; a < outer; a++)
                memcpy(o + (a * len_out + at) * inner, x + a * len * inner,
                       (size_t)(len * inner) * sizeof(float));
            at += len;
        }
        return LLMOPT_OK;
    }
    case IR_OP_CAST: {
        int64_t numel = ir_extent_numel(eo);
        const struct ir_node *x = &g->nodes[n->in[0]];
        if (x->dtype == n->dtype) {
            memmove(node_f32(s, i), node_f32(s, n->in[0]), (size_t)numel * 4);
        } else if (n->dtype == IR_DTYPE_F32) {
            const int32_t *src = node_i32(s, n->in[0]);
            float *dst = node_f32(s, i);
            for (int64_t e = 0; e < numel; e++) dst[e] = (float)src[e];
        } else {
            const float *src = node_f32(s, n->in[0]);
            int32_t *dst = node_i32(s, i);
            for (int64_t e = 0; e < numel; e++)
                dst[e] = isfinite(src[e]) && fabsf(src[e]) < 2147483520.0f ? (int32_t)src[e] : 0;
        }
        return LLMOPT_OK;
    }
    case IR_OP_SELECT_ROWS: {
        const struct ir_extent *ei = &s->extent[n->in[0]];
        int64_t d = ei->dims[ei->rank - 1], rows_in = ei->dims[ei->rank - 2];
        int64_t m = eo->dims[eo->rank - 2];
        int64_t outer = rows_in > 0 && d > 0 ? ir_extent_numel(ei) / (rows_in * d) : 0;
        const int32_t *rows = node_i32(s, n->in[1]);
        const float *x = node_f32(s, n->in[0]);
        float *o = node_f32(s, i);
        for (int64_t j = 0; j < m; j++)
            if (rows[j] < 0 || rows[j] >= rows_in)
                return err_set(err, LLMOPT_ERR_INVALID_ARG, "out_rows[%lld] = %d out of range [0, %lld)",
                               (long long)j, rows[j], (long long)rows_in);
        for (int64_t a = 0; a < outer; a++)
            for (int64_t j = 0; j < m; j++)
                memcpy(o + (a * m + j) * d, x + (a * rows_in + rows[j]) * d, (size_t)d * 4);
        return LLMOPT_OK;
    }
    case IR_OP_ATTENTION: return run_attention(s, n, i, kv, err);
    case IR_OP_SHORT_CONV: return ref_short_conv(g, i, s->extent, s->arena, s->plan.offset, kv, err);
    default:
        if (ir_op_is_unary_elementwise(n->op)) {
            const float *x = node_f32(s, n->in[0]);
            float *o = node_f32(s, i);
            int64_t numel = ir_extent_numel(eo);
            for (int64_t e = 0; e < numel; e++) o[e] = op_unary_apply(n->op, x[e]);
            return LLMOPT_OK;
        }
        if (ir_op_is_binary_elementwise(n->op)) {
            run_binary(s, n, i);
            return LLMOPT_OK;
        }
    }
    return err_set(err, LLMOPT_ERR_UNSUPPORTED, "cpu: no kernel for op %s", ir_op_name(n->op));
}

/* Constants (CONST, ROPE_FREQS and every node the folding pass marked constant) are
 * computed once, in prepare, in graph order. */
static enum llmopt_status compute_constants(struct cpu_state *s, struct llmopt_err *err) {
    for (int32_t i = 0; i < s->g->n_nodes; i++) ir_extent_of(&s->g->nodes[i].shape, 1, 1, &s->extent[i]);
    for (int32_t i = 0; i < s->g->n_nodes; i++) {
        const struct ir_node *n = &s->g->nodes[i];
        if (n->constant && n->op != IR_OP_CONST && n->op != IR_OP_ROPE_FREQS) {
            enum llmopt_status st = run_node_kernel(s, i, NULL, err);
            if (st) return st;
        } else if (n->op == IR_OP_CONST) {
            *node_f32(s, i) = (float)n->attrs.value;
        } else if (n->op == IR_OP_ROPE_FREQS) {
            /* theta^(-2j/dim), computed in f32 as PyTorch's rotary embedding does */
            float *o = node_f32(s, i);
            int64_t dim = n->attrs.axis;
            for (int64_t j = 0; j < dim / 2; j++)
                o[j] = 1.0f / powf((float)n->attrs.value, (float)(2 * j) / (float)dim);
        }
    }
    return LLMOPT_OK;
}

static void cpu_release(void *state) {
    struct cpu_state *s = state;
    if (!s) return;
    mem_plan_free(&s->plan);
    free(s->arena);
    free(s->extent);
    free(s->row_buf);
    free(s->score_buf);
    free(s->kv_row_buf);
    free(s->linear_scratch);
    free(s->att_scratch);
    free(s->packed);
    free(s->packed_buf);
    free(s->skip);
    free(s->rope_first);
    pool_free(s->pool);
    free(s);
}

/* Packed weights (GEMM panels) above this many bytes in all stay packed per run: a
 * copy of a large model's weights costs more memory than the packing costs time. */
#define CPU_PACKED_MAX_BYTES ((size_t)64 << 20)

/* Activation rows of linear n at a batch of n_max tokens. */
static int64_t linear_rows(const struct ir_graph *g, const struct ir_node *n, int64_t n_max, int64_t *k) {
    struct ir_extent ex;
    ir_extent_of(&g->nodes[n->in[0]].shape, n_max, n_max, &ex);
    *k = ex.dims[ex.rank - 1];
    return *k ? ir_extent_numel(&ex) / *k : 0;
}

/* Packs the GEMM panels of every linear's weight, once, when all of them fit
 * CPU_PACKED_MAX_BYTES; the linears then take the GEMM at every batch size. */
static enum llmopt_status prepare_packed(struct cpu_state *s, int64_t n_max, struct llmopt_err *err) {
    const struct ir_graph *g = s->g;
    size_t *bytes = calloc((size_t)g->n_nodes, sizeof *bytes), total = 0;
    if (!bytes) return err_set(err, LLMOPT_ERR_NOMEM, "cpu: out of memory");
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const struct ir_node *n = &g->nodes[i];
        if (n->op != IR_OP_LINEAR || bytes[n->in[1]]) continue;
        const struct ir_node *w = &g->nodes[n->in[1]];
        int64_t k;
        linear_rows(g, n, n_max, &k);
        if (w->shape.rank != 2 || w->shape.dims[1].coef != k) continue;
        bytes[n->in[1]] = cpu_linear_packed_bytes(s->kern, w->weight.dtype, k, w->shape.dims[0].coef);
        total += bytes[n->in[1]];
    }
    enum llmopt_status st = LLMOPT_OK;
    if (total && total <= CPU_PACKED_MAX_BYTES) {
        s->packed = calloc((size_t)g->n_nodes, sizeof *s->packed);
        s->packed_buf = aligned_alloc(64, total);
        if (!s->packed || !s->packed_buf) {
            st = err_set(err, LLMOPT_ERR_NOMEM, "cpu: out of memory for %zu bytes of packed weights", total);
        } else {
            size_t at = 0;
            for (int32_t i = 0; i < g->n_nodes; i++) {
                if (!bytes[i]) continue;
                const struct ir_node *w = &g->nodes[i];
                cpu_linear_pack(s->kern, w->weight.dtype, w->weight.data, w->shape.dims[1].coef, w->shape.dims[0].coef,
                                s->packed_buf + at);
                s->packed[i] = s->packed_buf + at;
                at += bytes[i];
            }
            s->packed_bytes = total;
        }
    }
    free(bytes);
    return st;
}

static bool cpu_skipped(const void *ctx, int32_t j) {
    return ((const struct cpu_state *)ctx)->skip[j] != 0;
}

/* The fast path's fused schedule, from the graph's structure and the memory plan
 * (fusion.h); $LLMOPT_CPU_FUSE=0 turns it off (A/B). Each [rms_norm ->] permute ->
 * rope chain (q and k of Qwen3/Llama) runs at its rope, which reads the chain's source
 * through the permutation and normalizes each row itself: one pass over the rows
 * instead of three. The source must stay intact until the rope runs (the plan keeps it
 * only until its own reader) and lie apart from the rope's output. (The v permute's
 * source, read token-major by the attention's append as on CUDA, was overwritten by
 * the q rope in every model's plan tried: not done.) */
static enum llmopt_status prepare_schedule(struct cpu_state *s, struct llmopt_err *err) {
    const char *e = getenv("LLMOPT_CPU_FUSE");
    if (e && !strcmp(e, "0")) return LLMOPT_OK;
    const struct ir_graph *g = s->g;
    int32_t n = g->n_nodes, *uses = malloc((size_t)n * sizeof *uses);
    s->skip = calloc((size_t)n, 1);
    s->rope_first = malloc((size_t)n * sizeof *s->rope_first);
    if (!uses || !s->skip || !s->rope_first) {
        free(uses);
        return err_set(err, LLMOPT_ERR_NOMEM, "cpu: out of memory");
    }
    fusion_count_uses(g, uses);
    for (int32_t i = 0; i < n; i++) {
        s->rope_first[i] = -1;
        int32_t t0 = fusion_norm_rope_chain(g, uses, NULL, i);
        if (t0 < 0) continue;
        const struct ir_node *o = &g->nodes[i];
        int32_t p = o->in[0], src = g->nodes[t0].in[0];
        if (t0 != p) { /* the norm weight is read at the rope: a param or a constant */
            const struct ir_node *w = &g->nodes[g->nodes[t0].in[1]];
            if (w->op != IR_OP_PARAM && !w->constant) continue;
        }
        s->skip[p] = s->skip[t0] = 1;
        if (fusion_source_kept(g, &s->plan, src, t0, i, cpu_skipped, s) &&
            !fusion_storage_overlaps(g, &s->plan, src, i)) {
            s->rope_first[i] = t0;
        } else {
            s->skip[p] = s->skip[t0] = 0;
        }
    }
    free(uses);
    return LLMOPT_OK;
}

/* Scratch of the fast kernels, sized for the largest op at n_max tokens. */
static enum llmopt_status prepare_fast(struct cpu_state *s, int64_t n_max, int32_t n_threads,
                                       struct llmopt_err *err) {
    enum llmopt_status st = pool_create(n_threads, &s->pool, err);
    if (st) return st;
    s->kern = cpu_isa_kernels_get(cpu_isa_best());
    const struct ir_graph *g = s->g;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const struct ir_node *n = &g->nodes[i];
        if (n->op == IR_OP_LINEAR) {
            enum ir_dtype t = g->nodes[n->in[1]].weight.dtype;
            int64_t k, rows = linear_rows(g, n, n_max, &k);
            bool fast = cpu_linear_supports(t, k);
            size_t need = fast ? cpu_linear_scratch_bytes(s->kern, t, rows, k, pool_threads(s->pool)) : 0;
            if (need > s->linear_scratch_bytes) s->linear_scratch_bytes = need;
        } else if (n->op == IR_OP_ATTENTION) {
            const struct ir_shape *q = &g->nodes[n->in[0]].shape, *k = &g->nodes[n->in[1]].shape;
            int64_t need = cpu_attention_scratch_floats(q->dims[1].coef, k->dims[1].coef, q->dims[3].coef);
            if (need > s->att_per_thread) s->att_per_thread = need;
        }
    }
    if (s->linear_scratch_bytes && !(s->linear_scratch = malloc(s->linear_scratch_bytes)))
        return err_set(err, LLMOPT_ERR_NOMEM, "cpu: out of memory for %zu bytes of linear scratch",
                       s->linear_scratch_bytes);
    size_t att_floats = (size_t)(s->att_per_thread * pool_threads(s->pool));
    if (att_floats && !(s->att_scratch = malloc(att_floats * sizeof(float))))
        return err_set(err, LLMOPT_ERR_NOMEM, "cpu: out of memory for attention scratch");
    if ((st = prepare_schedule(s, err))) return st;
    return prepare_packed(s, n_max, err);
}

static enum llmopt_status prepare_common(const struct ir_graph *g, int64_t n_max, int64_t max_ctx,
                                         const struct mem_plan *plan, int32_t n_threads, bool fast,
                                         void **state, struct llmopt_err *err) {
    if (n_max < 1 || max_ctx < 1)
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "cpu: batch size and context must be >= 1");
    struct cpu_state *s = calloc(1, sizeof *s);
    if (!s) return err_set(err, LLMOPT_ERR_NOMEM, "cpu: out of memory");
    s->g = g;
    if (plan && (plan->n_nodes != g->n_nodes || plan->n_max != n_max)) {
        free(s);
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "cpu: the given plan is for another graph or batch size");
    }
    enum llmopt_status st = plan ? mem_plan_copy(plan, &s->plan, err) : mem_plan_build(g, n_max, n_max, &s->plan, err);
    if (st) {
        free(s);
        return st;
    }
    int64_t max_head_dim = 1;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const struct ir_node *n = &g->nodes[i];
        if (n->op == IR_OP_PARAM && n->shape.rank == 2 && n->shape.dims[1].coef > s->max_row)
            s->max_row = n->shape.dims[1].coef;
        if (n->op == IR_OP_ATTENTION && g->nodes[n->in[0]].shape.dims[3].coef > max_head_dim)
            max_head_dim = g->nodes[n->in[0]].shape.dims[3].coef;
    }
    s->score_cap = max_ctx;
    /* aligned_alloc needs a size that is a multiple of the alignment: the plan's is. */
    s->arena = aligned_alloc(MEMPLAN_ALIGN, s->plan.arena_bytes ? s->plan.arena_bytes : MEMPLAN_ALIGN);
    s->extent = calloc((size_t)g->n_nodes, sizeof *s->extent);
    s->row_buf = malloc((size_t)(s->max_row ? s->max_row : 1) * sizeof(float));
    s->score_buf = malloc((size_t)s->score_cap * sizeof(float));
    s->kv_row_buf = malloc((size_t)max_head_dim * sizeof(float));
    if (!s->arena || !s->extent || !s->row_buf || !s->score_buf || !s->kv_row_buf) {
        size_t arena_bytes = s->plan.arena_bytes;
        cpu_release(s);
        return err_set(err, LLMOPT_ERR_NOMEM, "cpu: out of memory for a %zu-byte arena",
                       arena_bytes);
    }
    if (fast && (st = prepare_fast(s, n_max, n_threads, err))) {
        cpu_release(s);
        return st;
    }
    if ((st = compute_constants(s, err))) {
        cpu_release(s);
        return st;
    }
    *state = s;
    return LLMOPT_OK;
}

static enum llmopt_status cpu_prepare(const struct ir_graph *g, int64_t n_max, int64_t max_ctx,
                                      const struct mem_plan *plan, int32_t n_threads, void **state,
                                      struct llmopt_err *err) {
    const char *ref = getenv("LLMOPT_CPU_REF");
    bool fast = !(ref && *ref && strcmp(ref, "0") != 0);
    return prepare_common(g, n_max, max_ctx, plan, n_threads, fast, state, err);
}

static enum llmopt_status cpu_ref_prepare(const struct ir_graph *g, int64_t n_max, int64_t max_ctx,
                                          const struct mem_plan *plan, int32_t n_threads,
                                          void **state, struct llmopt_err *err) {
    (void)n_threads;
    return prepare_common(g, n_max, max_ctx, plan, 0, false, state, err);
}

static enum llmopt_status cpu_run(void *state, const struct exec_batch *b, struct kv_cache *kv,
                                  const float **logits, struct llmopt_err *err) {
    struct cpu_state *s = state;
    const struct ir_graph *g = s->g;
    if (b->n_tokens < 1 || b->n_tokens > s->plan.n_max || b->n_out < 0 || b->n_out > b->n_tokens)
        return err_set(err, LLMOPT_ERR_INVALID_ARG,
                       "cpu: batch of %d tokens / %d outputs outside the plan (1..%lld)",
                       b->n_tokens, b->n_out, (long long)s->plan.n_max);
    for (int32_t i = 0; i < g->n_nodes; i++)
        ir_extent_of(&g->nodes[i].shape, b->n_tokens, b->n_out, &s->extent[i]);
    const int32_t *src[IR_INPUT_COUNT] = {b->tokens, b->positions, b->seq_slots, b->out_rows};
    for (int k = 0; k < IR_INPUT_COUNT; k++) {
        int32_t idx = g->inputs[k];
        memcpy(node_i32(s, idx), src[k], (size_t)ir_extent_numel(&s->extent[idx]) * 4);
    }
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const struct ir_node *n = &g->nodes[i];
        if (n->constant || n->op == IR_OP_INPUT || n->op == IR_OP_PARAM || n->op == IR_OP_RESHAPE ||
            (s->skip && s->skip[i]))
            continue;
        const double t0 = s->node_seconds ? clock_now_s() : 0.0;
        enum llmopt_status st = run_node_kernel(s, i, kv, err);
        if (st) return st;
        if (s->node_seconds) s->node_seconds[i] += clock_now_s() - t0;
        s->stats.kernels_run++;
    }
    s->stats.steps++;
    *logits = node_f32(s, g->output);
    return LLMOPT_OK;
}

static void cpu_stats(void *state, struct backend_stats *out) {
    const struct cpu_state *s = state;
    *out = s->stats;
    out->packed_bytes = s->packed_bytes;
}

static size_t cpu_arena_bytes(void *state) {
    return ((struct cpu_state *)state)->plan.arena_bytes;
}

static void cpu_set_node_timing(void *state, double *node_seconds) {
    ((struct cpu_state *)state)->node_seconds = node_seconds;
}

const struct backend_ops cpu_backend_ops = {
    .name = "cpu",
    .prepare = cpu_prepare,
    .run = cpu_run,
    .stats = cpu_stats,
    .arena_bytes = cpu_arena_bytes,
    .release = cpu_release,
    .set_node_timing = cpu_set_node_timing,
};

const struct backend_ops cpu_ref_backend_ops = {
    .name = "cpu-ref",
    .prepare = cpu_ref_prepare,
    .run = cpu_run,
    .stats = cpu_stats,
    .arena_bytes = cpu_arena_bytes,
    .release = cpu_release,
    .set_node_timing = cpu_set_node_timing,
};
