/* The CUDA backend: runs an IR graph on one device behind struct backend_ops.
 *
 * prepare: plans memory (or takes the program's plan) and allocates the arena on the
 *          device; uploads every weight once in its stored type, straight from the
 *          host pointers (block-quantized types split into quants + scales, see
 *          cu_weight); computes constants on the device.
 * run:     one token batch = copy the inputs (and the block table when it changed),
 *          one kernel per node on one stream, copy back the output rows (the logits
 *          rows the graph selected), one synchronization. Small batches (decode) are
 *          captured once per (N, M) as a CUDA graph and replayed: positions, slots
 *          and block tables are read from device memory, so the same launches serve
 *          every step.
 *
 * The KV cache lives on the device: a mirror of kv_cache.h's layout (per layer
 * (n_blocks * block_size, Hkv * Dh) f32, or f16 for an f16 cache; a q8_0 cache is held
 * as f16 on the device), allocated on the first run that sees a given cache. The session keeps owning block allocation on the host; the device gets a copy
 * of the block table only when it changes. A step ends in one of four tails (struct
 * step_tail): the logits rows copied back; each row's greedy argmax (run_argmax: 8
 * bytes a row back); or the sampler's penalties applied on the device, then each row's
 * best k entries (run_sample, k > 0: 8 bytes a candidate back, from which the
 * session's sampler draws on the host; for top-p also the row's probability sums per
 * block of 512 ids, 8 bytes a block) or its whole-row draw (run_sample, k == 0: the
 * host sampler's arithmetic, 4 bytes a row back). */
extern "C" {
#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/fusion.h"
#include "base/clock.h"
#include "base/fp16.h"
#include "format/quant.h"
#include "format/quant_k.h"
#include "passes/memplan.h"
}

#include "backend/cuda/cuda_kernels.cuh"

#include <cublas_v2.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef LLMOPT_CUDA_TRACE
#include "backend/cuda/cuda_device.cuh"
#include <stdio.h>
/* Diagnostic builds: LLMOPT_CUDA_TRACE_STEP=N writes the per-block records
 * (cuda_device.cuh) of the N-th one-token step to $LLMOPT_CUDA_TRACE_OUT. */
extern "C" void cu_trace_tu_linear(void *, void *);
extern "C" void cu_trace_tu_kquant(void *, void *);
extern "C" void cu_trace_tu_stream(void *, void *);
extern "C" void cu_trace_tu_attention(void *, void *);
extern "C" void cu_trace_tu_misc(void *, void *);
static struct {
    struct cu_trace_rec *buf;
    unsigned *cnt;
    long at, step;
    const char *out;
} g_trace;
static void trace_init(void) {
    const char *e = getenv("LLMOPT_CUDA_TRACE_STEP");
    if (!e || g_trace.buf || g_trace.at < 0) return;
    g_trace.at = atol(e);
    g_trace.out = getenv("LLMOPT_CUDA_TRACE_OUT") ? getenv("LLMOPT_CUDA_TRACE_OUT") : "cuda_trace.txt";
    if (cudaMalloc(&g_trace.buf, CU_TRACE_MAX * sizeof(struct cu_trace_rec)) != cudaSuccess ||
        cudaMalloc(&g_trace.cnt, 4) != cudaSuccess || cudaMemset(g_trace.cnt, 0, 4) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(g_trace.buf);
        g_trace.buf = NULL;
        g_trace.at = -1; /* off: no records are written */
        fprintf(stderr, "cuda trace: no device memory for the records; tracing off\n");
        return;
    }
    void (*tu[])(void *, void *) = {cu_trace_tu_linear, cu_trace_tu_kquant, cu_trace_tu_stream, cu_trace_tu_attention,
                                    cu_trace_tu_misc};
    for (auto f : tu) f(g_trace.buf, g_trace.cnt);
}
static bool trace_before(cudaStream_t st, int n_tokens) {
    if (!g_trace.buf || n_tokens != 1 || ++g_trace.step != g_trace.at) return false;
    cudaMemsetAsync(g_trace.cnt, 0, 4, st);
    return true;
}
static void trace_after(void) {
    unsigned n = 0;
    cudaMemcpy(&n, g_trace.cnt, 4, cudaMemcpyDeviceToHost);
    if (n > CU_TRACE_MAX) n = CU_TRACE_MAX;
    struct cu_trace_rec *h = (struct cu_trace_rec *)malloc((size_t)n * sizeof *h + 1); /* + 1: not malloc(0) */
    if (!h || cudaMemcpy(h, g_trace.buf, (size_t)n * sizeof *h, cudaMemcpyDeviceToHost) != cudaSuccess) {
        free(h);
        fprintf(stderr, "cuda trace: could not read the records back\n");
        return;
    }
    FILE *f = fopen(g_trace.out, "w");
    if (!f) fprintf(stderr, "cuda trace: cannot write %s\n", g_trace.out);
    for (unsigned i = 0; f && i < n; i++)
        fprintf(f, "%llu %u %u %u %u %llu %llu %llu\n", h[i].grid, h[i].line, h[i].block, h[i].smid, h[i].n_blocks,
                h[i].t0, h[i].tw, h[i].te);
    if (f) fclose(f);
    free(h);
    fprintf(stderr, "cuda trace: %u records of step %ld in %s\n", n, g_trace.at, g_trace.out);
}
#endif

static_assert(CU_MAX_RANK == IR_MAX_RANK, "kernel shape structs hold IR ranks");
static_assert((int)IR_DTYPE_F32 == CU_F32 && (int)IR_DTYPE_F16 == CU_F16 &&
                  (int)IR_DTYPE_BF16 == CU_BF16 && (int)IR_DTYPE_Q8_0 == CU_Q8_0 &&
                  (int)IR_DTYPE_Q4_0 == CU_Q4_0 && (int)IR_DTYPE_Q4_K == CU_Q4_K &&
                  (int)IR_DTYPE_Q5_K == CU_Q5_K && (int)IR_DTYPE_Q6_K == CU_Q6_K,
              "cu_dtype numbers enum ir_dtype");

#define CUDA_GRAPH_CACHE 8     /* captured (N, M) shapes kept */
#define CUDA_GRAPH_MAX_N 16    /* batches up to this size are captured (decode buckets) */
#define CUDA_MATVEC_MAX_ROWS CU_MATVEC_MAX_ROWS
#define CUDA_BLAS_WORKSPACE (32u << 20)
#define CUDA_UPLOAD_STAGING (64u << 20)
/* Block-quantized products of more rows than the matvec takes: W to bf16, then cuBLAS
 * (the tiled kernel, f32 FMA on weights decoded one element at a time, took ~210 us a
 * 0.6B product at 16-32 rows: batched decode steps of 42 ms, bench/results/
 * cuda-batch-2026-12-01.md) */
#define CUDA_DEQUANT_MIN_ROWS (CUDA_MATVEC_MAX_ROWS + 1)
#define CUDA_ATT_DEC_WARPS 8 /* the cluster decode kernel's warps a block when $LLMOPT_CUDA_ATT_DEC names none */

/* ---- errors ------------------------------------------------------------------------ */

static enum llmopt_status cuda_status(cudaError_t e) {
    switch (e) {
    case cudaErrorMemoryAllocation: return LLMOPT_ERR_NOMEM;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorNoKernelImageForDevice: return LLMOPT_ERR_UNSUPPORTED;
    default: return LLMOPT_ERR_IO;
    }
}

#define CU_TRY(call)                                                                          \
    do {                                                                                      \
        cudaError_t cu_e_ = (call);                                                           \
        if (cu_e_ != cudaSuccess)                                                             \
            return err_set(err, cuda_status(cu_e_), "cuda: %s: %s (%s:%d)", #call,            \
                           cudaGetErrorString(cu_e_), __FILE__, __LINE__);                    \
    } while (0)

#define BLAS_TRY(call)                                                                        \
    do {                                                                                      \
        cublasStatus_t bl_e_ = (call);                                                        \
        if (bl_e_ != CUBLAS_STATUS_SUCCESS)                                                   \
            return err_set(err, bl_e_ == CUBLAS_STATUS_ALLOC_FAILED ? LLMOPT_ERR_NOMEM          \
                                                                    : LLMOPT_ERR_IO,          \
                           "cuda: %s: %s (%s:%d)", #call, cublasGetStatusString(bl_e_),       \
                           __FILE__, __LINE__);                                               \
    } while (0)

/* ---- state ------------------------------------------------------------------------- */

/* How a step ends, after the last node: */
enum tail_mode {
    TAIL_LOGITS, /* the logits rows copied back */
    TAIL_ARGMAX, /* each output row's greedy argmax key copied back (d_keys) */
    TAIL_TOP_K,  /* [the penalties,] then each row's best kb keys (d_topk; kb 1: d_keys) */
    TAIL_DRAW,   /* [the penalties,] then each row's whole-row draw (d_draw_ids) */
};
struct step_tail {
    enum tail_mode mode;
    int32_t kb;  /* TAIL_TOP_K: keys a row, a bucket of run_sample's k (1, 64, 256) */
    bool pen;    /* TAIL_TOP_K, TAIL_DRAW: the penalties of h_pen_* are applied first */
    bool sums;   /* TAIL_TOP_K: each row's top-p z too, as per-block sums (h_draw_sums) */
};

struct cuda_graph_entry {
    int32_t n, m;
    struct step_tail tail;
    cudaGraphExec_t exec;
    uint64_t last_used;
    int32_t extra_kernels;    /* step_extra_kernels of the captured step */
};

#define CUDA_PROF_ROWS 64
struct cuda_prof_row {
    const char *tag;
    double ms[2];        /* [0] prefill (batches above CUDA_GRAPH_MAX_N), [1] decode */
    uint64_t calls[2];
};

struct cuda_upload {
    const void *host;
    int host_dtype; /* enum ir_dtype as stored (dev.dtype: as uploaded) */
    int64_t rows, cols;
    struct cu_weight dev;
};

/* Decode fusion, decided once from the graph's structure (plan_decode_fusion):
 *   FUSE_MV_MULTI  a linear whose launch also computes later linears of the same x
 *                  (q/k/v), each possibly written head-major into the permute after it
 *   FUSE_MV_PAIR   a SwiGLU linear (act(x Wg^T) * gate) whose gate is a plain linear
 *                  of the same x used only there: both weights streamed in one launch
 *   FUSE_NORM_ROPE the first node of [rms_norm ->] permute -> rope chains: one launch
 *                  computes every part's rope output
 *   FUSE_ATT_ROPE  an attention whose q and k are the two parts of one such launch,
 *                  read by it alone: one-token steps rotate q/k inside the attention
 *                  kernel (cu_attention's rope_c), other steps launch the chains first
 *   FUSE_ROPE_TABLE the cos node of the rope table (cast(positions) -> matmul with the
 *                  frequencies -> permute -> concat(p, p) -> cos, sin): one cu_rope_table
 *                  launch writes cos and sin (sin into storage of its own)
 *   FUSE_SKIP      computed by another node's launch (or not needed at all) */
enum cuda_fuse_kind {
    FUSE_NONE = 0, FUSE_SKIP, FUSE_MV_MULTI, FUSE_MV_PAIR, FUSE_NORM_ROPE, FUSE_ATT_ROPE, FUSE_ROPE_TABLE
};
#define CUDA_FUSE_MAX 3
static_assert(CUDA_FUSE_MAX == CU_MV_MAX_SEGS && CUDA_FUSE_MAX == CU_NR_MAX_PARTS, "one member array");
struct cuda_fuse {
    int8_t kind, n;
    /* MULTI: the linears ([0] this node); PAIR: [0] the gate's linear; NORM_ROPE: the
     * rope nodes; ATT_ROPE: the q and k rope nodes; ROPE_TABLE: the sin, the matmul and
     * the cast */
    int32_t m[CUDA_FUSE_MAX];
    /* MULTI: the node each segment's result is stored as (the linear, or the permute
     * it fills head-major); NORM_ROPE, ATT_ROPE: the rms_norm of the part, or IR_NONE */
    int32_t out[CUDA_FUSE_MAX];
    int64_t head_dim[CUDA_FUSE_MAX]; /* MULTI: > 0 when written head-major */
};

struct cuda_state {
    const struct ir_graph *g;
    struct mem_plan plan;
    int64_t n_max, max_ctx;
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_ws;                /* (CUDA_BLAS_WORKSPACE) cuBLAS workspace: capture-safe */
    bool use_blas, use_graphs;
    uint8_t *arena;               /* device (plan.arena_bytes) */
    struct ir_extent *extent;     /* (n_nodes) extents of the current step */
    struct cu_weight *weight;     /* (n_nodes) PARAM nodes: the uploaded weight */
    struct cuda_upload *uploads;  /* (n_uploads) one per distinct weight */
    int32_t n_uploads;
    int32_t *h_inputs;            /* pinned (IR_INPUT_COUNT, n_max) staged inputs */
    float *h_out;                 /* pinned (output numel at n_max) logits rows */
    unsigned long long *d_keys;   /* device (n_max) argmax keys of the output rows */
    unsigned long long *h_keys;   /* pinned (n_max) their copy */
    /* run_sample's buffers, made on its first call (so graphs captured later hold them) */
    bool sample_ready;
    struct cu_draw_row *h_draw_rows, *d_draw_rows; /* pinned / device (n_max) */
    double *d_draw_sums, *h_draw_sums;   /* device / pinned (n_max, cu_draw_scratch) */
    int32_t *h_draw_ids, *d_draw_ids;    /* pinned / device (n_max) */
    unsigned long long *d_topk, *h_topk; /* device / pinned (n_max, BACKEND_TOP_K_MAX) best keys */
    unsigned long long *d_topk_blocks;   /* device (n_max, cu_top_k_scratch) the blocks' best keys */
    struct cu_penalty_row *h_pen_hdr, *d_pen_hdr; /* pinned / device (n_max) */
    int2 *h_pen_pairs, *d_pen_pairs;     /* pinned / device (n_max, BACKEND_PENALTY_MAX) (id, count) */
    void *xh;                     /* device: f16/bf16 activations for cuBLAS */
    size_t xh_bytes;
    int32_t xh_node;              /* the node whose f16 (xh_bf16: bf16) copy xh holds in this
                                   * step, or -1: q/k/v and gate/up convert their x once */
    bool xh_bf16;
    void *wh;                     /* device: a block-quantized weight as bf16 (prefill), or NULL */
    size_t wh_bytes;
    float *att_part;              /* device: split-attention partials */
    unsigned *att_counters;       /* device (CU_ATT_COUNTERS): split merge counters, zero between launches */
    bool att_per_position;        /* $LLMOPT_CUDA_ATT_WARP=0: decode attention without the warp kernel */
    /* this step: no sequence has CU_ATT_TILED_MIN_TOKENS tokens in the batch (the
     * server's decode steps), so attention takes the per-token kernels whatever the
     * batch's size (check_batch; slot_tokens: its per-slot counts, n_slot_tokens long) */
    bool step_per_token;
    int32_t *slot_tokens, n_slot_tokens;
    /* q8_0 products of 9..CU_MMA_MAX_ROWS rows on int8 tensor cores (cu_linear_q8_mma):
     * its x scratch for up to mma_k columns; off with $LLMOPT_CUDA_Q8_MMA=0 */
    void *mma_scratch;
    int64_t mma_k;
    bool mma_off;
    int32_t mma_x_node; /* the node whose x the scratch holds in this step (-1: none) */
    bool att_late_kv;             /* $LLMOPT_CUDA_ATT_EARLY=0: no K/V loads before the PDL wait */
    int att_dec_splits, att_dec_warps; /* $LLMOPT_CUDA_ATT_DEC: one-token cluster kernel shape (0: the warp kernel) */
    int att_warp_warps;                /* $LLMOPT_CUDA_ATT_WARPS: the warp kernel's warps a block (0: default) */
    int att_splits_forced;             /* $LLMOPT_CUDA_ATT_SPLITS: one-token attention's splits (0: default) */
    bool att_tiled_f32;           /* $LLMOPT_CUDA_ATT_MMA=0: prefill attention without tensor cores */
    int64_t att_part_floats;
    /* KV mirror */
    const struct kv_cache *kv_owner;
    uint8_t *kv_store;            /* device, every layer's K then V */
    void **kv_k, **kv_v;          /* (kv_layers) device pointers into kv_store */
    bool kv_f16;                  /* the rows are f16 */
    bool kv_q8;                   /* ... q8_0 (cu_attention's kv_q8 layout) */
    int64_t kv_scale_off;         /* q8_0: bytes from a layer's K (or V) to its scales */
    int32_t kv_layers;
    float **conv_state;           /* (conv_layers) device (n_slots, rows, C) conv state */
    int32_t conv_layers;
    int32_t *d_block_table;       /* device (bt_elems) */
    int32_t *h_block_table;       /* pinned shadow of what the device holds */
    int64_t bt_elems;
    /* graphs */
    struct cuda_graph_entry graphs[CUDA_GRAPH_CACHE];
    uint64_t graph_clock;
    int32_t kernels_per_step;
    struct backend_stats stats;
    /* rms_norm nodes whose every user is a linear reading them as x through the matvec:
     * with <= CUDA_MATVEC_MAX_ROWS rows the norm runs inside those matvecs (prologue);
     * on unless $LLMOPT_CUDA_FUSE_NORM=0 */
    bool *norm_into_matvec;       /* (n_nodes) */
    /* decode fusion (cuda_fuse_plan), used by steps of at most CUDA_MATVEC_MAX_ROWS
     * tokens (`fused`); off with $LLMOPT_CUDA_FUSE=0 */
    struct cuda_fuse *fuse;       /* (n_nodes) */
    float **priv;                 /* (n_nodes) device storage of results written before
                                   * their own place in the node order, or NULL */
    float *priv_store;
    bool fused;                   /* the current step runs the fused schedule */
    /* prefill chains (plan_prefill_chains), used by the other steps: [rms_norm ->]
     * permute -> rope as one cu_norm_rope launch at the chain's first node, its result in
     * pf_priv storage shared by chains whose lives do not overlap; off with
     * $LLMOPT_CUDA_PF_FUSE=0 */
    struct cuda_fuse *pf_fuse;    /* (n_nodes) FUSE_NORM_ROPE / FUSE_SKIP only */
    float **pf_priv;              /* (n_nodes) */
    float *pf_priv_store;
    /* (n_nodes) 1 / 2: the node's readers are all f16 / bf16 cuBLAS products taking it as
     * x, and no other product comes between: in those steps it is written to xh as f16 /
     * bf16 instead of f32 (norms, the epilogue pass of products), never converted */
    int8_t *half_out;
    /* (n_nodes) attention nodes: bit 0 / 1: its k / v input is a [1, N, H, Dh] ->
     * [1, H, N, Dh] permute that prefill steps skip, the kernels reading its source */
    int8_t *pf_tok_major;
    int32_t kernels_per_step_fused;
    /* launches of the step beyond those counts (chains an ATT_ROPE attention launched
     * apart), as enqueued or as captured into the replayed graph */
    int32_t step_extra_kernels;
    /* LLMOPT_CUDA_PROFILE=1: eager steps with an event after every node, time summed per
     * kind of kernel (prefill and decode apart), printed to stderr at release */
    bool profile;
    cudaEvent_t *prof_ev;         /* (n_nodes + 1) */
    const char **prof_node_tag;   /* (n_nodes) tag of the node recorded at each event */
    int32_t prof_n_ev;
    const char *prof_tag;         /* set by run_linear: which path the product took */
    struct cuda_prof_row prof[CUDA_PROF_ROWS];
    int32_t n_prof;
    uint64_t prof_steps[2], prof_seen[2];
    /* LLMOPT_CUDA_STEP_TIME=1: of replayed steps after the first, the device time from an
     * event before the replay to one after it (input copies, kernels, result copy) and the
     * host time from one step's start to the next's, summed; printed to stderr at
     * release. Their difference is what the host adds to a step. */
    bool step_time;
    cudaEvent_t st_ev[2];
    double st_device_ms, st_period_s, st_last_start; /* st_last_start 0: no period open */
    uint64_t st_steps, st_periods;
};

/* Context splits of an attention launch of n_tok tokens, n_heads heads (the warp kernel's
 * grid; cu_attention_splits unless $LLMOPT_CUDA_ATT_SPLITS forced a one-token count). */
static int att_splits(const struct cuda_state *s, int n_tok, int n_heads, bool kv_f16) {
    if (n_tok == 1 && s->att_splits_forced) return s->att_splits_forced;
    return cu_attention_splits(n_tok, n_heads, s->max_ctx, kv_f16);
}

/* ---- shapes ------------------------------------------------------------------------- */

static void contiguous_strides(const struct ir_extent *e, int64_t *strides) {
    int64_t st = 1;
    for (int i = e->rank - 1; i >= 0; i--) {
        strides[i] = st;
        st *= e->dims[i];
    }
}

static void split_at_axis(const struct ir_extent *e, int64_t axis, int64_t *outer, int64_t *len,
                          int64_t *inner) {
    *outer = 1;
    *inner = 1;
    for (int d = 0; d < axis; d++) *outer *= e->dims[d];
    for (int d = (int)axis + 1; d < e->rank; d++) *inner *= e->dims[d];
    *len = e->dims[axis];
}

static struct cu_strided strided_of(const struct ir_extent *out) {
    struct cu_strided s;
    memset(&s, 0, sizeof s);
    s.rank = out->rank;
    for (int d = 0; d < out->rank; d++) s.dims[d] = out->dims[d];
    return s;
}

static bool extent_eq(const struct ir_extent *a, const struct ir_extent *b) {
    if (a->rank != b->rank) return false;
    for (int d = 0; d < a->rank; d++)
        if (a->dims[d] != b->dims[d]) return false;
    return true;
}

static void *node_ptr(struct cuda_state *s, int32_t i) {
    if (s->g->nodes[i].op == IR_OP_PARAM) return (void *)s->weight[i].data;
    float *const *priv = s->fused ? s->priv : s->pf_priv;
    if (priv && priv[s->plan.root[i]]) return priv[s->plan.root[i]];
    return s->arena + s->plan.offset[i];
}
static float *node_f32(struct cuda_state *s, int32_t i) { return (float *)node_ptr(s, i); }

/* ---- one node ---------------------------------------------------------------------- */

static struct cu_epilogue linear_epilogue(struct cuda_state *s, const struct ir_node *n) {
    uint32_t fl = n->attrs.linear_flags;
    int k_op = 2;
    struct cu_epilogue ep;
    ep.bias = fl & IR_LINEAR_BIAS ? node_f32(s, n->in[k_op++]) : NULL;
    ep.gate = fl & IR_LINEAR_GATE ? node_f32(s, n->in[k_op++]) : NULL;
    ep.residual = fl & IR_LINEAR_RESIDUAL ? node_f32(s, n->in[k_op++]) : NULL;
    ep.act = n->attrs.linear_act == IR_OP_INPUT ? -1 : (int)n->attrs.linear_act;
    ep.norm_w = NULL;
    ep.norm_eps = 0.0f;
    return ep;
}

/* by enum cu_dtype */
static const char *const mv_tag[] = {"linear.matvec f32",  "linear.matvec f16",  "linear.matvec bf16",
                                     "linear.matvec q8_0", "linear.matvec q4_0", "",
                                     "linear.matvec q4_k", "linear.matvec q5_k", "linear.matvec q6_k"};

/* A fused step's MULTI or PAIR linear (rows <= CUDA_MATVEC_MAX_ROWS by the plan). */
static enum llmopt_status run_linear_fused(struct cuda_state *s, const struct ir_node *n, int32_t i,
                                           struct llmopt_err *err) {
    const struct cuda_fuse *f = &s->fuse[i];
    const struct cu_weight *w = &s->weight[n->in[1]];
    int64_t rows = w->cols ? ir_extent_numel(&s->extent[n->in[0]]) / w->cols : 0;
    if (rows <= 0) return LLMOPT_OK;
    struct cu_mv_seg seg[CUDA_FUSE_MAX];
    memset(seg, 0, sizeof seg);
    /* an rms_norm computed in the launch's prologue (norm_into_matvec): x is its input */
    int32_t xi = n->in[0];
    const struct ir_node *norm = s->norm_into_matvec[xi] ? &s->g->nodes[xi] : NULL;
    const float *x = node_f32(s, norm ? norm->in[0] : xi);
    if (f->kind == FUSE_MV_PAIR) {
        static const char *const tag[] = {"linear.matvec pair f32",  "linear.matvec pair f16",  "linear.matvec pair bf16",
                                          "linear.matvec pair q8_0", "linear.matvec pair q4_0", "",
                                          "linear.matvec pair q4_k", "linear.matvec pair q5_k", "linear.matvec pair q6_k"};
        s->prof_tag = tag[w->dtype];
        seg[0].w = *w;
        seg[0].y = node_f32(s, i);
        seg[0].ep = linear_epilogue(s, n);
        seg[0].ep.gate = NULL; /* the up product, computed beside */
        if (norm) {
            seg[0].ep.norm_w = node_f32(s, norm->in[1]);
            seg[0].ep.norm_eps = (float)norm->attrs.value;
        }
        CU_TRY(cu_matvec_multi(s->stream, x, rows, seg, 1, &s->weight[s->g->nodes[f->m[0]].in[1]]));
        return LLMOPT_OK;
    }
    static const char *const tag[] = {"linear.matvec multi f32",  "linear.matvec multi f16",  "linear.matvec multi bf16",
                                      "linear.matvec multi q8_0", "linear.matvec multi q4_0", "",
                                      "linear.matvec multi q4_k", "linear.matvec multi q5_k", "linear.matvec multi q6_k"};
    s->prof_tag = tag[w->dtype];
    for (int k = 0; k < f->n; k++) {
        const struct ir_node *l = &s->g->nodes[f->m[k]];
        seg[k].w = s->weight[l->in[1]];
        seg[k].y = node_f32(s, f->out[k]);
        seg[k].ep = linear_epilogue(s, l);
        seg[k].head_dim = f->head_dim[k];
    }
    if (norm) {
        seg[0].ep.norm_w = node_f32(s, norm->in[1]);
        seg[0].ep.norm_eps = (float)norm->attrs.value;
    }
    CU_TRY(cu_matvec_multi(s->stream, x, rows, seg, f->n, NULL));
    return LLMOPT_OK;
}

/* Part of a cu_norm_rope launch: rope node o_i, its chain's rms_norm (or IR_NONE);
 * returns the rope's last dim. */
static int64_t norm_rope_part(struct cuda_state *s, int32_t o_i, int32_t norm_i, struct cu_norm_rope_part *part) {
    const struct ir_graph *g = s->g;
    const struct ir_node *o = &g->nodes[o_i], *p = &g->nodes[o->in[0]];
    const struct ir_extent *eo = &s->extent[o_i];
    int64_t d = eo->dims[eo->rank - 1];
    memset(part, 0, sizeof *part);
    part->n_rows = d ? ir_extent_numel(eo) / d : 0;
    int32_t pin = p->in[0]; /* the rms_norm (norm_i) or the permuted source */
    part->x = node_f32(s, norm_i != IR_NONE ? g->nodes[pin].in[0] : pin);
    if (norm_i != IR_NONE) {
        const struct ir_node *r = &g->nodes[norm_i];
        part->norm_w = node_f32(s, r->in[1]);
        part->eps = (float)r->attrs.value;
    }
    part->c = node_f32(s, o->in[1]);
    part->s = node_f32(s, o->in[2]);
    part->o = node_f32(s, o_i);
    int64_t cs[IR_MAX_RANK], in_strides[IR_MAX_RANK];
    ir_extent_broadcast_strides(&s->extent[o->in[1]], eo, cs);
    contiguous_strides(&s->extent[pin], in_strides);
    part->rows = strided_of(eo);
    part->rows.rank = eo->rank - 1;
    for (int dd = 0; dd < eo->rank - 1; dd++) {
        part->rows.sa[dd] = cs[dd];
        part->rows.sb[dd] = in_strides[p->attrs.axes[dd]];
    }
    return d;
}

/* A NORM_ROPE node of the fused or prefill schedule (f), or the chains of an ATT_ROPE
 * attention that runs them apart: every part's [rms_norm ->] permute -> rope. */
static enum llmopt_status run_norm_rope(struct cuda_state *s, const struct cuda_fuse *f, struct llmopt_err *err) {
    struct cu_norm_rope_part part[CUDA_FUSE_MAX];
    int64_t d = 0;
    for (int k = 0; k < f->n; k++) d = norm_rope_part(s, f->m[k], f->out[k], &part[k]);
    s->prof_tag = f->out[0] != IR_NONE ? "rms_norm+permute+rope" : "permute+rope";
    CU_TRY(cu_norm_rope(s->stream, part, f->n, d));
    return LLMOPT_OK;
}

/* An ATT_ROPE attention of one token: q and k as the chains' inputs, rotated by the
 * attention kernel, where the parts are one token's [1, H, 1, Dh] rows of head stride
 * Dh and cos/sin rows shared by the heads (and by q and k). */
static bool att_rope_fold(struct cuda_state *s, const struct cuda_fuse *f, struct cu_attention *a) {
    struct cu_norm_rope_part pq, pk;
    if (f->n != 2 || !cu_attention_rope_ok(a) || norm_rope_part(s, f->m[0], f->out[0], &pq) != a->head_dim ||
        norm_rope_part(s, f->m[1], f->out[1], &pk) != a->head_dim || pq.c != pk.c || pq.s != pk.s)
        return false;
    const struct cu_norm_rope_part *pp[2] = {&pq, &pk};
    for (int k = 0; k < 2; k++) { /* rows [1, heads, 1]: the head strides matter where heads > 1 */
        const struct cu_strided *r = &pp[k]->rows;
        if (r->rank != 3 || r->dims[0] != 1 || r->dims[2] != 1 ||
            (r->dims[1] > 1 && (r->sb[1] != a->head_dim || r->sa[1] != 0)))
            return false;
    }
    a->q = pq.x;
    a->k = pk.x;
    a->rope_c = pq.c;
    a->rope_s = pq.s;
    a->q_norm_w = pq.norm_w;
    a->k_norm_w = pk.norm_w;
    a->q_eps = pq.eps;
    a->k_eps = pk.eps;
    return true;
}

/* x (node xi, n floats) to f16/bf16 in s->xh for cuBLAS, unless xh already holds it: a
 * node's value does not change within a step, and the linears of one x (q/k/v, gate/up)
 * usually follow each other. */
static cudaError_t convert_x_half(struct cuda_state *s, int32_t xi, const float *x, int64_t n, bool bf16) {
    if (s->xh_node == xi && s->xh_bf16 == bf16) return cudaSuccess;
    s->xh_node = xi;
    s->xh_bf16 = bf16;
    return cu_convert_half(s->stream, x, s->xh, n, bf16);
}

/* Node i's result goes straight to xh (half_out) in this step: a plain step of more
 * than CUDA_MATVEC_MAX_ROWS rows, whose readers all take the cuBLAS path. */
static bool half_out_now(const struct cuda_state *s, int32_t i, int64_t rows) {
    return s->half_out[i] && !s->fused && rows > CUDA_MATVEC_MAX_ROWS && s->use_blas;
}

/* After a cuBLAS product: the epilogue pass, in place or into xh (half_out). */
static enum llmopt_status linear_finish(struct cuda_state *s, int32_t i, float *y, int64_t rows, int64_t n_out,
                                        const struct cu_epilogue *ep, struct llmopt_err *err) {
    if (half_out_now(s, i, rows)) {
        bool bf = s->half_out[i] == 2;
        CU_TRY(cu_linear_epilogue_half(s->stream, y, s->xh, rows, n_out, ep, bf));
        s->xh_node = i;
        s->xh_bf16 = bf;
        return LLMOPT_OK;
    }
    CU_TRY(cu_linear_epilogue(s->stream, y, rows, n_out, ep));
    return LLMOPT_OK;
}

static enum llmopt_status run_linear(struct cuda_state *s, const struct ir_node *n, int32_t i,
                                     struct llmopt_err *err) {
    const struct ir_extent *ex = &s->extent[n->in[0]];
    const struct cu_weight *w = &s->weight[n->in[1]];
    int64_t k = w->cols, rows = k ? ir_extent_numel(ex) / k : 0;
    if (s->fused && (s->fuse[i].kind == FUSE_MV_MULTI || s->fuse[i].kind == FUSE_MV_PAIR))
        return run_linear_fused(s, n, i, err);
    struct cu_epilogue ep = linear_epilogue(s, n);
    const float *x = node_f32(s, n->in[0]);
    float *y = node_f32(s, i);
    if (rows <= 0) return LLMOPT_OK;
    if (rows <= CUDA_MATVEC_MAX_ROWS && s->norm_into_matvec[n->in[0]]) {
        const struct ir_node *nn = &s->g->nodes[n->in[0]]; /* the rms_norm, not run: x is its input */
        static const char *const nmv_tag[] = {"linear.matvec+rms_norm f32",  "linear.matvec+rms_norm f16",
                                              "linear.matvec+rms_norm bf16", "linear.matvec+rms_norm q8_0",
                                              "linear.matvec+rms_norm q4_0", "",
                                              "linear.matvec+rms_norm q4_k", "linear.matvec+rms_norm q5_k",
                                              "linear.matvec+rms_norm q6_k"};
        ep.norm_w = node_f32(s, nn->in[1]);
        ep.norm_eps = (float)nn->attrs.value;
        s->prof_tag = nmv_tag[w->dtype];
        CU_TRY(cu_matvec(s->stream, w, node_f32(s, nn->in[0]), rows, y, &ep));
        return LLMOPT_OK;
    }
    if (rows <= CUDA_MATVEC_MAX_ROWS && cu_matvec_ok(w)) {
        s->prof_tag = mv_tag[w->dtype];
        CU_TRY(cu_matvec(s->stream, w, x, rows, y, &ep));
        return LLMOPT_OK;
    }
    bool blas_ok = s->use_blas && rows <= INT_MAX && k <= INT_MAX && w->rows <= INT_MAX;
    const float one = 1.0f, zero = 0.0f;
    if (blas_ok && w->dtype == CU_F32) {
        s->prof_tag = "linear.sgemm f32";
        /* column-major view: Y^T (n_out x rows) = W (n_out x K, stored as K x n_out) ^T X^T */
        BLAS_TRY(cublasSgemm(s->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->rows, (int)rows, (int)k, &one,
                             (const float *)w->data, (int)k, x, (int)k, &zero, y, (int)w->rows));
        return linear_finish(s, i, y, rows, w->rows, &ep, err);
    }
    if (blas_ok && (w->dtype == CU_F16 || w->dtype == CU_BF16) &&
        (size_t)(rows * k) * 2 <= s->xh_bytes) {
        bool bf = w->dtype == CU_BF16;
        s->prof_tag = bf ? "linear.gemm bf16 (+cvt, epilogue)" : "linear.gemm f16 (+cvt, epilogue)";
        cudaDataType_t t = bf ? CUDA_R_16BF : CUDA_R_16F;
        CU_TRY(convert_x_half(s, n->in[0], x, rows * k, bf));
        BLAS_TRY(cublasGemmEx(s->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->rows, (int)rows, (int)k, &one,
                              w->data, t, (int)k, s->xh, t, (int)k, &zero, y, CUDA_R_32F, (int)w->rows,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return linear_finish(s, i, y, rows, w->rows, &ep, err);
    }
    if (w->dtype == CU_Q8_0 && rows <= CU_MMA_MAX_ROWS && s->mma_scratch && !s->mma_off && k <= s->mma_k &&
        k % 32 == 0) {
        /* q/k/v and gate/up share x: quantized once; the epilogue in the kernel unless
         * the result goes to xh as f16/bf16 */
        const bool half = half_out_now(s, i, rows);
        const cudaError_t e = cu_linear_q8_mma(s->stream, w, x, rows, y, s->mma_scratch, s->mma_x_node == n->in[0],
                                               half ? NULL : &ep);
        if (e != cudaErrorNotSupported) {
            s->prof_tag = "linear.mma q8_0";
            CU_TRY(e);
            s->mma_x_node = n->in[0];
            return half ? linear_finish(s, i, y, rows, w->rows, &ep, err) : LLMOPT_OK;
        }
    }
    if (blas_ok && cu_dtype_blocked(w->dtype) && rows >= CUDA_DEQUANT_MIN_ROWS && s->wh &&
        (size_t)(w->rows * k) * 2 <= s->wh_bytes && (size_t)(rows * k) * 2 <= s->xh_bytes) {
        /* prefill: W once to bf16, then tensor cores (the tiled kernel is f32 FMA) */
        s->prof_tag = "linear.gemm dequant->bf16 (+cvt, epilogue)";
        CU_TRY(cu_weight_to_bf16(s->stream, w, s->wh));
        CU_TRY(convert_x_half(s, n->in[0], x, rows * k, true));
        BLAS_TRY(cublasGemmEx(s->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->rows, (int)rows, (int)k, &one, s->wh,
                              CUDA_R_16BF, (int)k, s->xh, CUDA_R_16BF, (int)k, &zero, y, CUDA_R_32F, (int)w->rows,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return linear_finish(s, i, y, rows, w->rows, &ep, err);
    }
    s->prof_tag = "linear.tiled";
    CU_TRY(cu_linear_tiled(s->stream, w, x, rows, y, &ep));
    return LLMOPT_OK;
}

static enum llmopt_status run_attention(struct cuda_state *s, const struct ir_node *n, int32_t i,
                                        struct llmopt_err *err) {
    const struct ir_extent *eq = &s->extent[n->in[0]], *ek = &s->extent[n->in[1]];
    struct cu_attention a;
    memset(&a, 0, sizeof a);
    a.q = node_f32(s, n->in[0]);
    a.k = node_f32(s, n->in[1]);
    a.v = node_f32(s, n->in[2]);
    a.pos = (const int32_t *)node_ptr(s, n->in[3]);
    a.slot = (const int32_t *)node_ptr(s, n->in[4]);
    a.out = node_f32(s, i);
    a.n_heads = (int)eq->dims[1];
    a.n_tok = (int)eq->dims[2];
    a.head_dim = (int)eq->dims[3];
    a.n_kv_heads = (int)ek->dims[1];
    a.scale = (float)n->attrs.value;
    a.window = (int)n->attrs.window;
    int32_t layer = n->attrs.kv_layer;
    if (!s->kv_owner || layer >= s->kv_layers)
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "cuda: attention layer %d has no KV cache", layer);
    a.k_cache = s->kv_k[layer];
    a.v_cache = s->kv_v[layer];
    a.kv_f16 = s->kv_f16;
    a.kv_q8 = s->kv_q8;
    a.kv_scale_off = s->kv_scale_off;
    if (a.kv_q8 && !cu_attention_q8_ok(a.head_dim))
        return err_set(err, LLMOPT_ERR_UNSUPPORTED,
                       "cuda: a q8_0 KV cache needs head sizes that are multiples of 32 up to 128 (layer %d: %d); "
                       "use --kv-type f16",
                       layer, a.head_dim);
    a.block_table = s->d_block_table;
    a.block_size = s->kv_owner->block_size;
    a.max_blocks_per_slot = s->kv_owner->max_blocks_per_slot;
    a.splits = att_splits(s, a.n_tok, a.n_heads, s->kv_f16 || s->kv_q8);
    a.part = s->att_part;
    a.counters = s->att_counters;
    a.per_position = s->att_per_position && !a.kv_q8; /* (q8_0 rows: the warp kernel) */
    a.per_token = s->step_per_token;
    a.tiled_f32 = s->att_tiled_f32;
    a.dec_splits = a.kv_q8 ? 0 : s->att_dec_splits;
    a.dec_warps = s->att_dec_warps;
    a.warp_warps = s->att_warp_warps ? s->att_warp_warps : cu_attention_warps(s->max_ctx, a.splits);
    if (!s->fused && s->pf_tok_major[i]) { /* the skipped permutes' sources */
        if (s->pf_tok_major[i] & 1) a.k = node_f32(s, s->g->nodes[n->in[1]].in[0]);
        if (s->pf_tok_major[i] & 2) a.v = node_f32(s, s->g->nodes[n->in[2]].in[0]);
        a.k_tok_major = s->pf_tok_major[i] & 1;
        a.v_tok_major = (s->pf_tok_major[i] & 2) != 0;
    }
    if (cu_attention_part_floats(a.n_tok, a.n_heads, a.head_dim, a.splits) > s->att_part_floats)
        return err_set(err, LLMOPT_ERR_LIMIT, "cuda: attention scratch too small for %d tokens", a.n_tok);
    const struct ir_graph *g = s->g;
    a.kv_before_wait = !s->att_late_kv && cu_attention_rope_ok(&a) && g->nodes[n->in[3]].op == IR_OP_INPUT &&
                       g->nodes[n->in[4]].op == IR_OP_INPUT;
    if (s->fused && s->fuse[i].kind == FUSE_ATT_ROPE) {
        if (att_rope_fold(s, &s->fuse[i], &a)) {
            s->prof_tag = "attention+norm+rope";
        } else { /* the chains' launch (counted here: the step's count has it skipped) */
            enum llmopt_status st = run_norm_rope(s, &s->fuse[i], err);
            if (st) return st;
            s->step_extra_kernels++;
            s->prof_tag = "attention";
        }
    }
    CU_TRY(cu_attention(s->stream, &a));
    return LLMOPT_OK;
}

static enum llmopt_status run_short_conv(struct cuda_state *s, const struct ir_node *n, int32_t i,
                                         struct llmopt_err *err) {
    const struct ir_extent *ex = &s->extent[n->in[0]];
    const struct ir_graph *g = s->g;
    int32_t wi = n->in[1];
    while (g->nodes[wi].op == IR_OP_RESHAPE) wi = g->nodes[wi].in[0]; /* views keep the rows */
    const struct ir_shape *ws = &g->nodes[n->in[1]].shape;          /* [C, L] or [C, 1, L] */
    struct cu_short_conv a;
    memset(&a, 0, sizeof a);
    a.x = node_f32(s, n->in[0]);
    a.y = node_f32(s, i);
    a.pos = (const int32_t *)node_ptr(s, n->in[2]);
    a.slot = (const int32_t *)node_ptr(s, n->in[3]);
    a.n_tok = (int)ex->dims[ex->rank - 2];
    a.channels = (int)ex->dims[ex->rank - 1];
    a.klen = (int)ws->dims[ws->rank - 1].coef;
    if (g->nodes[wi].op == IR_OP_PARAM) {
        a.w = s->weight[wi];
    } else {
        a.w.dtype = CU_F32;
        a.w.data = node_ptr(s, wi);
    }
    if (a.w.dtype != CU_F32 && a.w.dtype != CU_F16 && a.w.dtype != CU_BF16)
        return err_set(err, LLMOPT_ERR_UNSUPPORTED, "short_conv: kernel '%s' is %s (f32, f16, bf16 only)",
                       g->nodes[wi].name ? g->nodes[wi].name : "?", ir_dtype_name((enum ir_dtype)a.w.dtype));
    a.w.rows = 1;
    a.w.cols = (int64_t)a.channels * a.klen;
    a.w.scales = NULL;
    int32_t layer = n->attrs.kv_layer;
    if (a.klen > CU_SHORT_CONV_MAX_KERNEL)
        return err_set(err, LLMOPT_ERR_UNSUPPORTED, "short_conv: kernel size %d above %d", a.klen,
                       CU_SHORT_CONV_MAX_KERNEL);
    if (!s->kv_owner || layer < 0 || layer >= s->conv_layers)
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "short_conv layer %d: no conv state", layer);
    a.state = s->conv_state[layer];
    CU_TRY(cu_short_conv(s->stream, &a));
    return LLMOPT_OK;
}

static enum llmopt_status run_reduce(struct cuda_state *s, const struct ir_node *n, int32_t i,
                                     struct llmopt_err *err) {
    const struct ir_extent *ei = &s->extent[n->in[0]];
    bool reduced[IR_MAX_RANK] = {0};
    for (int k = 0; k < n->attrs.n_axes; k++) reduced[n->attrs.axes[k]] = true;
    int64_t strides[IR_MAX_RANK];
    contiguous_strides(ei, strides);
    struct cu_reduce r;
    memset(&r, 0, sizeof r);
    r.out_numel = 1;
    r.count = 1;
    int first_red = ei->rank;
    for (int d = 0; d < ei->rank; d++) {
        if (reduced[d]) {
            r.red_dims[r.n_red] = ei->dims[d];
            r.red_strides[r.n_red++] = strides[d];
            r.count *= ei->dims[d];
            if (first_red == ei->rank) first_red = d;
        } else {
            r.kept_dims[r.n_kept] = ei->dims[d];
            r.kept_strides[r.n_kept++] = strides[d];
            r.out_numel *= ei->dims[d];
        }
    }
    r.trailing = true;
    for (int d = first_red; d < ei->rank; d++) r.trailing = r.trailing && reduced[d];
    CU_TRY(cu_reduce(s->stream, (int)n->op, node_f32(s, n->in[0]), node_f32(s, i), &r));
    return LLMOPT_OK;
}

/* FUSE_ROPE_TABLE at the cos node i: cos and sin of the step's positions in one launch
 * (the plan checked the chain's ops and ranks; the extents are checked here) */
static enum llmopt_status run_rope_table(struct cuda_state *s, int32_t i, const struct cuda_fuse *f,
                                         struct llmopt_err *err) {
    const struct ir_node *m = &s->g->nodes[f->m[1]], *ca = &s->g->nodes[f->m[2]];
    const struct ir_extent *ea = &s->extent[m->in[0]], *eb = &s->extent[m->in[1]], *eo = &s->extent[i];
    const int64_t half = ea->dims[1], n_tok = eb->dims[2];
    if (ea->dims[0] != 1 || ea->dims[2] != 1 || eb->dims[0] != 1 || eb->dims[1] != 1 || eo->dims[0] != 1 ||
        eo->dims[1] != n_tok || eo->dims[2] != 2 * half || ir_extent_numel(&s->extent[ca->in[0]]) != n_tok)
        return err_set(err, LLMOPT_ERR_UNSUPPORTED,
                       "cuda: rope table at node %d: frequencies [%lld, %lld, %lld] x positions [%lld, %lld, %lld] "
                       "do not give its [1, N, 2 * half] extent",
                       i, (long long)ea->dims[0], (long long)ea->dims[1], (long long)ea->dims[2], (long long)eb->dims[0],
                       (long long)eb->dims[1], (long long)eb->dims[2]);
    s->prof_tag = "rope table (cos+sin)";
    CU_TRY(cu_rope_table(s->stream, node_f32(s, m->in[0]), (const int32_t *)node_ptr(s, ca->in[0]), n_tok, half,
                         node_f32(s, i), node_f32(s, f->m[0])));
    return LLMOPT_OK;
}

static enum llmopt_status run_node(struct cuda_state *s, int32_t i, struct llmopt_err *err) {
    const struct ir_graph *g = s->g;
    const struct ir_node *n = &g->nodes[i];
    const struct ir_extent *eo = &s->extent[i];
    cudaStream_t st = s->stream;
    const struct cuda_fuse *f = s->fused ? &s->fuse[i] : &s->pf_fuse[i];
    if (f->kind == FUSE_NORM_ROPE) return run_norm_rope(s, f, err);
    if (f->kind == FUSE_ROPE_TABLE) return run_rope_table(s, i, f, err);
    switch (n->op) {
    case IR_OP_INPUT:
    case IR_OP_PARAM:
    case IR_OP_RESHAPE:
    case IR_OP_CONST:
    case IR_OP_ROPE_FREQS: return LLMOPT_OK; /* set up by prepare/run, or a view */
    case IR_OP_EMBEDDING:
        CU_TRY(cu_embedding(st, &s->weight[n->in[0]], (const int32_t *)node_ptr(s, n->in[1]),
                            ir_extent_numel(&s->extent[n->in[1]]), node_f32(s, i)));
        return LLMOPT_OK;
    case IR_OP_LINEAR: return run_linear(s, n, i, err);
    case IR_OP_ATTENTION: return run_attention(s, n, i, err);
    case IR_OP_SHORT_CONV: return run_short_conv(s, n, i, err);
    case IR_OP_MEAN:
    case IR_OP_SUM:
    case IR_OP_MAX: return run_reduce(s, n, i, err);
    case IR_OP_RMS_NORM:
    case IR_OP_LAYER_NORM: {
        int64_t d = eo->dims[eo->rank - 1], rows = d ? ir_extent_numel(eo) / d : 0;
        if (rows <= CUDA_MATVEC_MAX_ROWS && s->norm_into_matvec[i]) return LLMOPT_OK; /* in the matvecs */
        if (half_out_now(s, i, rows)) {
            s->xh_node = i;
            s->xh_bf16 = s->half_out[i] == 2;
            CU_TRY(cu_norm_half(st, node_f32(s, n->in[0]), node_f32(s, n->in[1]),
                                n->n_in > 2 ? node_f32(s, n->in[2]) : NULL, s->xh, rows, d, (float)n->attrs.value,
                                n->op == IR_OP_LAYER_NORM, s->xh_bf16));
            return LLMOPT_OK;
        }
        CU_TRY(cu_norm(st, node_f32(s, n->in[0]), node_f32(s, n->in[1]),
                       n->n_in > 2 ? node_f32(s, n->in[2]) : NULL, node_f32(s, i), rows, d,
                       (float)n->attrs.value, n->op == IR_OP_LAYER_NORM));
        return LLMOPT_OK;
    }
    case IR_OP_ROPE: {
        int64_t d = eo->dims[eo->rank - 1], rows = d ? ir_extent_numel(eo) / d : 0;
        int64_t cs[IR_MAX_RANK];
        ir_extent_broadcast_strides(&s->extent[n->in[1]], eo, cs);
        struct cu_strided r = strided_of(eo);
        r.rank = eo->rank - 1;
        for (int k = 0; k < r.rank; k++) r.sa[k] = cs[k];
        CU_TRY(cu_rope(st, node_f32(s, n->in[0]), node_f32(s, n->in[1]), node_f32(s, n->in[2]),
                       node_f32(s, i), rows, d, &r));
        return LLMOPT_OK;
    }
    case IR_OP_MATMUL: {
        const struct ir_extent *ea = &s->extent[n->in[0]], *eb = &s->extent[n->in[1]];
        struct ir_extent bo = *eo, ba = *ea, bb = *eb;
        bo.rank -= 2;
        ba.rank -= 2;
        bb.rank -= 2;
        struct cu_strided b = strided_of(&bo);
        ir_extent_broadcast_strides(&ba, &bo, b.sa);
        ir_extent_broadcast_strides(&bb, &bo, b.sb);
        CU_TRY(cu_matmul(st, node_f32(s, n->in[0]), node_f32(s, n->in[1]), node_f32(s, i),
                         ea->dims[ea->rank - 2], ea->dims[ea->rank - 1], eb->dims[eb->rank - 1], &b));
        return LLMOPT_OK;
    }
    case IR_OP_SOFTMAX: {
        int64_t outer, len, inner;
        split_at_axis(eo, n->attrs.axis, &outer, &len, &inner);
        CU_TRY(cu_softmax(st, node_f32(s, n->in[0]), node_f32(s, i), outer, len, inner));
        return LLMOPT_OK;
    }
    case IR_OP_PERMUTE: {
        int64_t in_strides[IR_MAX_RANK];
        contiguous_strides(&s->extent[n->in[0]], in_strides);
        struct cu_strided c = strided_of(eo);
        for (int d = 0; d < eo->rank; d++) c.sa[d] = in_strides[n->attrs.axes[d]];
        CU_TRY(cu_strided_copy(st, node_f32(s, n->in[0]), 0, node_f32(s, i), &c));
        return LLMOPT_OK;
    }
    case IR_OP_EXPAND: {
        struct cu_strided c = strided_of(eo);
        ir_extent_broadcast_strides(&s->extent[n->in[0]], eo, c.sa);
        CU_TRY(cu_strided_copy(st, node_f32(s, n->in[0]), 0, node_f32(s, i), &c));
        return LLMOPT_OK;
    }
    case IR_OP_SLICE: {
        int64_t strides[IR_MAX_RANK];
        contiguous_strides(&s->extent[n->in[0]], strides);
        int64_t base = n->attrs.start.coef * strides[n->attrs.axis];
        strides[n->attrs.axis] *= n->attrs.step;
        struct cu_strided c = strided_of(eo);
        for (int d = 0; d < eo->rank; d++) c.sa[d] = strides[d];
        CU_TRY(cu_strided_copy(st, node_f32(s, n->in[0]), base, node_f32(s, i), &c));
        return LLMOPT_OK;
    }
    case IR_OP_CONCAT: {
        int64_t outer, len_out, inner, at = 0;
        split_at_axis(eo, n->attrs.axis, &outer, &len_out, &inner);
        for (int k = 0; k < n->n_in; k++) {
            int64_t len = s->extent[n->in[k]].dims[n->attrs.axis];
            CU_TRY(cu_concat_piece(st, node_f32(s, n->in[k]), node_f32(s, i), outer, len, len_out, at, inner));
            at += len;
        }
        return LLMOPT_OK;
    }
    case IR_OP_CAST: {
        int64_t numel = ir_extent_numel(eo);
        const struct ir_node *x = &g->nodes[n->in[0]];
        if (x->dtype == n->dtype) {
            if (numel > 0)
                CU_TRY(cudaMemcpyAsync(node_ptr(s, i), node_ptr(s, n->in[0]), (size_t)numel * 4,
                                       cudaMemcpyDeviceToDevice, st));
        } else {
            CU_TRY(cu_cast(st, node_ptr(s, n->in[0]), node_ptr(s, i), numel, n->dtype == IR_DTYPE_F32 ? 0 : 1));
        }
        return LLMOPT_OK;
    }
    case IR_OP_SELECT_ROWS: {
        const struct ir_extent *ei = &s->extent[n->in[0]];
        int64_t d = ei->dims[ei->rank - 1], rows_in = ei->dims[ei->rank - 2];
        int64_t m = eo->dims[eo->rank - 2];
        int64_t outer = rows_in > 0 && d > 0 ? ir_extent_numel(ei) / (rows_in * d) : 0;
        CU_TRY(cu_select_rows(st, node_f32(s, n->in[0]), (const int32_t *)node_ptr(s, n->in[1]),
                              node_f32(s, i), outer, rows_in, m, d));
        return LLMOPT_OK;
    }
    default:
        if (ir_op_is_unary_elementwise(n->op)) {
            CU_TRY(cu_unary(st, (int)n->op, node_f32(s, n->in[0]), node_f32(s, i), ir_extent_numel(eo)));
            return LLMOPT_OK;
        }
        if (ir_op_is_binary_elementwise(n->op)) {
            const struct ir_extent *ea = &s->extent[n->in[0]], *eb = &s->extent[n->in[1]];
            struct cu_strided c = strided_of(eo);
            ir_extent_broadcast_strides(ea, eo, c.sa);
            ir_extent_broadcast_strides(eb, eo, c.sb);
            CU_TRY(cu_binary(st, (int)n->op, node_f32(s, n->in[0]), node_f32(s, n->in[1]), node_f32(s, i), &c,
                             extent_eq(ea, eo) && extent_eq(eb, eo)));
            return LLMOPT_OK;
        }
    }
    return err_set(err, LLMOPT_ERR_UNSUPPORTED, "cuda: no kernel for op %s (node %d '%s')",
                   ir_op_name(n->op), i, n->name ? n->name : "");
}

/* ---- device helpers ---------------------------------------------------------------- */

extern "C" bool cuda_device_available(char *why, size_t cap) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        if (why && cap) snprintf(why, cap, "cudaGetDeviceCount: %s", cudaGetErrorString(e));
        cudaGetLastError();
        return false;
    }
    if (count < 1) {
        if (why && cap) snprintf(why, cap, "no CUDA device");
        return false;
    }
    return true;
}

extern "C" bool cuda_device_describe(char *buf, size_t cap) {
    if (!cuda_device_available(NULL, 0)) return false;
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return false;
    snprintf(buf, cap, "%s, %d SMs, %.1f GiB, L2 %d MiB, cc %d.%d", p.name, p.multiProcessorCount,
             (double)p.totalGlobalMem / (1u << 30), p.l2CacheSize >> 20, p.major, p.minor);
    return true;
}

/* ---- prepare ----------------------------------------------------------------------- */

static void cuda_release(void *state);

/* The device type a weight stored as host type t (enum ir_dtype) is uploaded as, or -1
 * when none: most types as stored; q5_0 and iq4_xs as q8_0 (repack_rows_as_q8_0), which
 * every kernel reads, at 8.5 bits a weight instead of 5.5 / 4.25. */
static int upload_dtype(int t) {
    if (t == IR_DTYPE_Q5_0 || t == IR_DTYPE_IQ4_XS) return CU_Q8_0;
    return t >= 0 && (t <= CU_Q4_0 || cu_dtype_kquant(t)) ? t : -1;
}

/* `rows` rows of cols values of q5_0 or iq4_xs (GGUF blocks at src) into the q8_0 upload
 * layout (cuda_kernels.cuh: int8 quants to qs, an f16 scale per 32 to sc). q5_0 is
 * exact: (q - 16) * d is int8 (q - 16) with scale d. iq4_xs: d * (ls - 32) * table[q]
 * is int8 table[q] (-127..113) with scale d * (ls - 32) rounded to f16 (a relative
 * error of at most 2^-12 a block; the CPU computes that scale in f32). */
static void repack_rows_as_q8_0(int t, const uint8_t *src, int64_t rows, int64_t cols, int8_t *qs, uint16_t *sc) {
    const int64_t nb = cols / 32;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            int8_t *q = qs + (size_t)(r * cols + b * 32);
            if (t == IR_DTYPE_Q5_0) {
                block_q5_0 blk;
                memcpy(&blk, src + (size_t)(r * nb + b) * sizeof blk, sizeof blk);
                quant_q5_0_ints(&blk, q);
                sc[r * nb + b] = blk.d;
            } else { /* iq4_xs: sub-block b % 8 of super-block b / 8 */
                block_iq4_xs blk;
                memcpy(&blk, src + (size_t)(r * (cols / QK_K) + b / 8) * sizeof blk, sizeof blk);
                const int j = (int)(b % 8);
                quant_iq4_xs_ints(&blk, j, q);
                sc[r * nb + b] = fp16_from_f32(fp16_to_f32(blk.d) * (float)(quant_iq4_xs_scale(&blk, j) - 32));
            }
        }
}

/* Uploads one weight (rows, cols) of a PARAM node, or reuses an earlier upload of the
 * same host tensor (tied embeddings bind one tensor twice). */
static enum llmopt_status upload_weight(struct cuda_state *s, const struct ir_node *n, void *staging,
                                        struct cu_weight *out, struct llmopt_err *err) {
    const int dtype = upload_dtype((int)n->weight.dtype);
    const bool as_q8_0 = dtype != (int)n->weight.dtype;
    /* matrices keep (rows, cols); unblocked tensors of any other rank are one row */
    int64_t rows = n->shape.rank == 2 ? n->shape.dims[0].coef : 1;
    int64_t cols = n->shape.rank == 2 ? n->shape.dims[1].coef : 1;
    if (n->shape.rank != 2)
        for (int d = 0; d < n->shape.rank; d++) cols *= n->shape.dims[d].coef;
    if (dtype < 0 || (n->shape.rank != 2 && cu_dtype_blocked(dtype)))
        return err_set(err, LLMOPT_ERR_UNSUPPORTED, "cuda: parameter '%s' (%s, rank %d) cannot be uploaded",
                       n->name ? n->name : "", ir_dtype_name(n->weight.dtype), n->shape.rank);
    if (cols % ir_dtype_block_elems(n->weight.dtype))
        return err_set(err, LLMOPT_ERR_FORMAT, "cuda: parameter '%s' (%s) has rows of %lld values, not whole blocks",
                       n->name ? n->name : "", ir_dtype_name(n->weight.dtype), (long long)cols);
    if ((uint64_t)ir_dtype_row_bytes(n->weight.dtype, cols) * (uint64_t)rows > n->weight.n_bytes)
        return err_set(err, LLMOPT_ERR_FORMAT, "cuda: parameter '%s' holds %llu bytes, its shape needs more",
                       n->name ? n->name : "", (unsigned long long)n->weight.n_bytes);
    for (int32_t k = 0; k < s->n_uploads; k++) {
        const struct cuda_upload *u = &s->uploads[k];
        if (u->host == n->weight.data && u->host_dtype == (int)n->weight.dtype && u->rows == rows && u->cols == cols) {
            *out = u->dev;
            return LLMOPT_OK;
        }
    }
    size_t data_bytes = cu_weight_data_bytes(dtype, rows, cols);
    size_t scale_bytes = cu_weight_scale_bytes(dtype, rows, cols);
    size_t data_aligned = (data_bytes + 255) & ~(size_t)255;
    void *dev = NULL;
    CU_TRY(cudaMalloc(&dev, data_aligned + scale_bytes + (data_aligned + scale_bytes == 0)));
    struct cuda_upload *u = &s->uploads[s->n_uploads++];
    memset(u, 0, sizeof *u);
    u->host = n->weight.data;
    u->host_dtype = (int)n->weight.dtype;
    u->rows = rows;
    u->cols = cols;
    u->dev.dtype = dtype;
    u->dev.rows = rows;
    u->dev.cols = cols;
    u->dev.data = dev;
    u->dev.scales = scale_bytes ? (const uint16_t *)((uint8_t *)dev + data_aligned) : NULL;
    *out = u->dev;
    if (!scale_bytes) {
        CU_TRY(cudaMemcpy(dev, n->weight.data, data_bytes, cudaMemcpyHostToDevice));
        return LLMOPT_OK;
    }
    /* block types: repack a chunk of rows at a time through the pinned staging buffer */
    size_t per_row = cu_weight_data_bytes(dtype, 1, cols) + cu_weight_scale_bytes(dtype, 1, cols);
    int64_t chunk = (int64_t)(CUDA_UPLOAD_STAGING / per_row);
    if (chunk < 1) return err_set(err, LLMOPT_ERR_LIMIT, "cuda: a row of '%s' exceeds the upload staging",
                                  n->name ? n->name : "");
    size_t src_row = ir_dtype_row_bytes(n->weight.dtype, cols);
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        int64_t nr = rows - r0 < chunk ? rows - r0 : chunk;
        uint8_t *qs = (uint8_t *)staging;
        uint16_t *sc = (uint16_t *)(qs + cu_weight_data_bytes(dtype, nr, cols));
        const uint8_t *src = (const uint8_t *)n->weight.data + (size_t)r0 * src_row;
        if (as_q8_0)
            repack_rows_as_q8_0((int)n->weight.dtype, src, nr, cols, (int8_t *)qs, sc);
        else
            cu_weight_repack_rows(dtype, src, nr, cols, qs, sc);
        CU_TRY(cudaMemcpy((uint8_t *)dev + cu_weight_data_bytes(dtype, r0, cols), qs,
                          cu_weight_data_bytes(dtype, nr, cols), cudaMemcpyHostToDevice));
        CU_TRY(cudaMemcpy((uint8_t *)dev + data_aligned + cu_weight_scale_bytes(dtype, r0, cols), sc,
                          cu_weight_scale_bytes(dtype, nr, cols), cudaMemcpyHostToDevice));
    }
    return LLMOPT_OK;
}

static enum llmopt_status upload_weights(struct cuda_state *s, struct llmopt_err *err) {
    const struct ir_graph *g = s->g;
    /* weights that are not f32 may only feed linear (as W) and embedding (as table) */
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const struct ir_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_in; k++) {
            const struct ir_node *x = &g->nodes[n->in[k]];
            bool weight_slot = (n->op == IR_OP_LINEAR && k == 1) || (n->op == IR_OP_EMBEDDING && k == 0);
            bool stored_ok = weight_slot || (n->op == IR_OP_SHORT_CONV && k == 1) || n->op == IR_OP_RESHAPE;
            if (x->op == IR_OP_PARAM && x->weight.dtype != IR_DTYPE_F32 && !stored_ok)
                return err_set(err, LLMOPT_ERR_UNSUPPORTED, "cuda: %s parameter '%s' feeds %s (only linear and "
                               "embedding (and short_conv) read stored types)", ir_dtype_name(x->weight.dtype),
                               x->name ? x->name : "", ir_op_name(n->op));
            if (weight_slot && x->op != IR_OP_PARAM)
                return err_set(err, LLMOPT_ERR_UNSUPPORTED, "cuda: %s node %d reads a computed weight",
                               ir_op_name(n->op), i);
        }
    }
    void *staging = NULL;
    CU_TRY(cudaMallocHost(&staging, CUDA_UPLOAD_STAGING));
    enum llmopt_status st = LLMOPT_OK;
    for (int32_t i = 0; i < g->n_nodes && !st; i++)
        if (g->nodes[i].op == IR_OP_PARAM) st = upload_weight(s, &g->nodes[i], staging, &s->weight[i], err);
    cudaFreeHost(staging);
    return st;
}

static enum llmopt_status compute_constants(struct cuda_state *s, struct llmopt_err *err) {
    const struct ir_graph *g = s->g;
    for (int32_t i = 0; i < g->n_nodes; i++) ir_extent_of(&g->nodes[i].shape, 1, 1, &s->extent[i]);
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const struct ir_node *n = &g->nodes[i];
        if (n->op == IR_OP_CONST) {
            float v = (float)n->attrs.value;
            CU_TRY(cudaMemcpy(node_ptr(s, i), &v, 4, cudaMemcpyHostToDevice));
        } else if (n->op == IR_OP_ROPE_FREQS) {
            /* theta^(-2j/dim) in f32 on the host, exactly as the reference computes it */
            int64_t dim = n->attrs.axis;
            float *f = (float *)malloc((size_t)(dim / 2 > 0 ? dim / 2 : 1) * sizeof(float));
            if (!f) return err_set(err, LLMOPT_ERR_NOMEM, "cuda: out of memory");
            for (int64_t j = 0; j < dim / 2; j++)
                f[j] = 1.0f / powf((float)n->attrs.value, (float)(2 * j) / (float)dim);
            cudaError_t e = cudaMemcpy(node_ptr(s, i), f, (size_t)(dim / 2) * 4, cudaMemcpyHostToDevice);
            free(f);
            CU_TRY(e);
        } else if (n->constant) {
            enum llmopt_status st = run_node(s, i, err);
            if (st) return st;
        }
    }
    CU_TRY(cudaStreamSynchronize(s->stream));
    return LLMOPT_OK;
}

/* Marks the rms_norm nodes that the matvecs of their users can compute (see
 * norm_into_matvec): f32 weight of the row's length, every user a linear that reads
 * the norm as x only and whose weight the matvec takes. */
static enum llmopt_status plan_norm_fusion(struct cuda_state *s, struct llmopt_err *err) {
    const struct ir_graph *g = s->g;
    s->norm_into_matvec = (bool *)calloc((size_t)g->n_nodes, sizeof(bool));
    if (!s->norm_into_matvec) return err_set(err, LLMOPT_ERR_NOMEM, "cuda: out of memory");
    /* on unless $LLMOPT_CUDA_FUSE_NORM=0: with the normalized row staged in shared
     * memory and the q/k/v and gate/up launches fused, measured faster on the H200
     * (bench/results/cuda-fusion-2026-11-29.md) */
    const char *e = getenv("LLMOPT_CUDA_FUSE_NORM");
    if (e && !strcmp(e, "0")) return LLMOPT_OK;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const struct ir_node *n = &g->nodes[i];
        s->norm_into_matvec[i] = n->op == IR_OP_RMS_NORM && n->n_in == 2 && !n->constant && i != g->output &&
                                 n->shape.rank >= 1 && g->nodes[n->in[1]].dtype == IR_DTYPE_F32 &&
                                 (g->nodes[n->in[1]].op != IR_OP_PARAM || g->nodes[n->in[1]].weight.dtype == IR_DTYPE_F32);
    }
    bool *used = (bool *)calloc((size_t)g->n_nodes, sizeof(bool));
    if (!used) return err_set(err, LLMOPT_ERR_NOMEM, "cuda: out of memory");
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const struct ir_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_in; k++) {
            int32_t src = n->in[k];
            if (!s->norm_into_matvec[src]) continue;
            used[src] = true;
            bool ok = n->op == IR_OP_LINEAR && k == 0 && cu_matvec_ok(&s->weight[n->in[1]]) &&
                      s->weight[n->in[1]].cols <= CU_MATVEC_NORM_MAX_K &&
                      /* K-quants: the prologue of cu_matvec_kq_multi (q4_K/q6_K, int8 x) */
                      (!cu_dtype_kquant(s->weight[n->in[1]].dtype) || cu_kq_multi_ok(&s->weight[n->in[1]])) &&
                      s->weight[n->in[1]].cols == g->nodes[src].shape.dims[g->nodes[src].shape.rank - 1].coef;
            for (int k2 = 1; k2 < n->n_in; k2++) ok = ok && n->in[k2] != src;
            if (!ok) s->norm_into_matvec[src] = false;
        }
    }
    /* the norm's input must stay intact until its last matvec reads it: the memory plan
     * keeps it only as long as some node uses it, so another user must come after */
    int32_t *last_user = (int32_t *)calloc((size_t)g->n_nodes, sizeof(int32_t));
    if (!last_user) {
        free(used);
        return err_set(err, LLMOPT_ERR_NOMEM, "cuda: out of memory");
    }
    for (int32_t i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++) last_user[g->nodes[i].in[k]] = i;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        if (!s->norm_into_matvec[i] || !used[i]) {
            s->norm_into_matvec[i] = false;
            continue;
        }
        const struct ir_node *n = &g->nodes[i], *xn = &g->nodes[n->in[0]];
        bool x_kept = xn->op == IR_OP_PARAM || xn->op == IR_OP_INPUT ||
                      (xn->op != IR_OP_RESHAPE && last_user[n->in[0]] > last_user[i]);
        s->norm_into_matvec[i] = x_kept && g->nodes[n->in[1]].op == IR_OP_PARAM;
    }
    free(last_user);
    free(used);
    return LLMOPT_OK;
}

/* ---- decode fusion plan ------------------------------------------------------------ */

struct fuse_ctx {
    struct cuda_state *s;
    int32_t *uses;  /* (n_nodes) input slots reading the node */
    int32_t *user;  /* (n_nodes) its last user */
    int32_t *eff;   /* (n_nodes) the node position at which the fused schedule computes it */
    bool *claimed;  /* (n_nodes) taken by a pattern */
};

/* Rows of the products of x at every fused batch size (N = M = CUDA_MATVEC_MAX_ROWS
 * bounds them all) fit the matvec. */
static bool fuse_x_ok(const struct fuse_ctx *c, int32_t x, int64_t k) {
    const struct cuda_state *s = c->s;
    struct ir_extent e;
    ir_extent_of(&s->g->nodes[x].shape, CUDA_MATVEC_MAX_ROWS, CUDA_MATVEC_MAX_ROWS, &e);
    return k > 0 && ir_extent_numel(&e) / k <= CUDA_MATVEC_MAX_ROWS;
}

static bool fuse_linear_ok(const struct fuse_ctx *c, int32_t i) {
    const struct ir_node *n = &c->s->g->nodes[i];
    if (n->op != IR_OP_LINEAR || n->n_in < 2 || n->constant || c->claimed[i] || i == c->s->g->output) return false;
    const struct cu_weight *w = &c->s->weight[n->in[1]];
    /* K-quants: q4_K/q6_K through cu_matvec_kq_multi (int8 x), q5_K unfused */
    return cu_matvec_ok(w) && (!cu_dtype_kquant(w->dtype) || cu_kq_multi_ok(w)) && fuse_x_ok(c, n->in[0], w->cols);
}

/* Segments of one launch: one type, or K-quants mixed (cu_matvec_kq_multi: q4_K q/k
 * with a q6_K v, as Q4_K_M files have) */
static bool fuse_types_ok(int a, int b) {
    return a == b || (cu_dtype_kquant(a) && cu_dtype_kquant(b));
}

/* Node x can be read at position t of the fused schedule: computed before t, and its
 * storage still holds it (own storage, never reused, or the plan keeps it to t). */
static bool fuse_ready(const struct fuse_ctx *c, const bool *early, int32_t x, int32_t t) {
    int32_t r = c->s->plan.root[x];
    return c->eff[r] < t && (c->eff[r] < 0 || early[r] || c->s->plan.last_use[r] >= t);
}

/* Every operand of node i past the first `from` can be read at position t. */
static bool fuse_inputs_before(const struct fuse_ctx *c, const bool *early, int32_t i, int from, int32_t t) {
    const struct ir_node *n = &c->s->g->nodes[i];
    for (int k = from; k < n->n_in; k++)
        if (!fuse_ready(c, early, n->in[k], t)) return false;
    return true;
}

/* x [.., N, K] -> linear l -> reshape [1.., N, H, Dh] -> permute to [1.., H, N, Dh], each
 * used once: returns the permute (the linear can write head-major into it), else IR_NONE. */
static int32_t fuse_head_major(const struct fuse_ctx *c, int32_t l, int64_t *head_dim) {
    const struct ir_graph *g = c->s->g;
    const struct ir_node *x = &g->nodes[g->nodes[l].in[0]];
    int32_t v = c->user[l], p = v >= 0 ? c->user[v] : -1;
    if (c->uses[l] != 1 || v < 0 || g->nodes[v].op != IR_OP_RESHAPE || c->uses[v] != 1 || p < 0 ||
        g->nodes[p].op != IR_OP_PERMUTE || c->claimed[p] || p == g->output)
        return IR_NONE;
    for (int d = 0; d < x->shape.rank - 1; d++) /* x rows are the tokens: [1.., N, K] */
        if (x->shape.dims[d].coef != 1 || x->shape.dims[d].sym != (d == x->shape.rank - 2 ? IR_SYM_N : IR_SYM_NONE))
            return IR_NONE;
    const struct ir_shape *vs = &g->nodes[v].shape;
    const struct ir_node *pn = &g->nodes[p];
    int r = vs->rank;
    if (r < 3 || pn->attrs.n_axes != r) return IR_NONE;
    for (int d = 0; d < r; d++) {
        bool n_dim = d == r - 3;
        if ((d < r - 3 || n_dim) && (vs->dims[d].coef != 1 || vs->dims[d].sym != (n_dim ? IR_SYM_N : IR_SYM_NONE)))
            return IR_NONE;
        if (d >= r - 2 && vs->dims[d].sym != IR_SYM_NONE) return IR_NONE;
        int want = d == r - 3 ? r - 2 : d == r - 2 ? r - 3 : d;
        if (pn->attrs.axes[d] != want) return IR_NONE;
    }
    *head_dim = vs->dims[r - 1].coef;
    return *head_dim > 0 ? p : IR_NONE;
}

/* Node i is the rope of a [rms_norm ->] permute (last axis kept) -> rope chain, each
 * link used once (uses) and none claimed (or claimed NULL): returns the chain's first
 * node (the rms_norm, or the permute: also where the norm runs inside the matvecs),
 * else -1 (fusion_norm_rope_chain). */
static int32_t norm_rope_chain(const struct cuda_state *s, const int32_t *uses, const bool *claimed, int32_t i) {
    int32_t t0 = fusion_norm_rope_chain(s->g, uses, claimed, i);
    return t0 >= 0 && s->norm_into_matvec[t0] ? s->g->nodes[i].in[0] : t0;
}

/* Whether cos node i heads the rope table cos(concat(p, p)), sin(concat(p, p)) with
 * p = permute_(0,2,1)(matmul(freqs, cast(positions))), rank 3, every intermediate used
 * only in the chain; *sin_i, *mm, *cast: its other nodes. */
static bool rope_table_chain(const struct cuda_state *s, const int32_t *uses, int32_t i, int32_t *sin_i, int32_t *mm,
                             int32_t *cast) {
    const struct ir_graph *g = s->g;
    const struct ir_node *cn = &g->nodes[i];
    if (cn->op != IR_OP_COS || cn->dtype != IR_DTYPE_F32 || cn->shape.rank != 3 || s->fuse[i].kind != FUSE_NONE)
        return false;
    const int32_t cc = cn->in[0];
    const struct ir_node *cat = &g->nodes[cc];
    if (cat->op != IR_OP_CONCAT || cat->n_in != 2 || cat->in[0] != cat->in[1] || cat->attrs.axis != 2 ||
        uses[cc] != 2 || s->fuse[cc].kind != FUSE_NONE)
        return false;
    *sin_i = -1;
    for (int32_t j = i + 1; j < g->n_nodes && *sin_i < 0; j++)
        if (g->nodes[j].op == IR_OP_SIN && g->nodes[j].in[0] == cc && s->fuse[j].kind == FUSE_NONE) *sin_i = j;
    const int32_t p = cat->in[0];
    const struct ir_node *pn = &g->nodes[p];
    if (*sin_i < 0 || pn->op != IR_OP_PERMUTE || pn->shape.rank != 3 || pn->attrs.axes[0] != 0 ||
        pn->attrs.axes[1] != 2 || pn->attrs.axes[2] != 1 || uses[p] != 2 || s->fuse[p].kind != FUSE_NONE)
        return false;
    *mm = pn->in[0];
    const struct ir_node *mn = &g->nodes[*mm];
    if (mn->op != IR_OP_MATMUL || mn->shape.rank != 3 || uses[*mm] != 1 || s->fuse[*mm].kind != FUSE_NONE) return false;
    const struct ir_node *fr = &g->nodes[s->plan.root[mn->in[0]]];
    *cast = mn->in[1];
    const struct ir_node *ct = &g->nodes[*cast];
    if (g->nodes[mn->in[0]].shape.rank != 3 || g->nodes[mn->in[0]].dtype != IR_DTYPE_F32 ||
        !(fr->op == IR_OP_ROPE_FREQS || fr->op == IR_OP_CONST || fr->op == IR_OP_PARAM || fr->constant) ||
        ct->op != IR_OP_CAST || ct->dtype != IR_DTYPE_F32 || ct->shape.rank != 3 || uses[*cast] != 1 ||
        s->fuse[*cast].kind != FUSE_NONE)
        return false;
    const struct ir_node *pos = &g->nodes[ct->in[0]];
    return pos->dtype == IR_DTYPE_I32 && g->nodes[s->plan.root[ct->in[0]]].op == IR_OP_INPUT;
}

/* Decides the fused schedule of small batches (struct cuda_fuse) from the graph's
 * structure, and gives every result the schedule writes ahead of its own position
 * device storage of its own (priv), sized for CUDA_MATVEC_MAX_ROWS tokens: the memory
 * plan only knows the node order. */
static enum llmopt_status plan_decode_fusion(struct cuda_state *s, struct llmopt_err *err) {
    const struct ir_graph *g = s->g;
    int32_t n = g->n_nodes;
    s->fuse = (struct cuda_fuse *)calloc((size_t)n, sizeof *s->fuse);
    s->priv = (float **)calloc((size_t)n, sizeof *s->priv);
    if (!s->fuse || !s->priv) return err_set(err, LLMOPT_ERR_NOMEM, "cuda: out of memory");
    const char *e = getenv("LLMOPT_CUDA_FUSE");
    if (e && !strcmp(e, "0")) return LLMOPT_OK;
    struct fuse_ctx c = {s, (int32_t *)calloc((size_t)n, 4), (int32_t *)malloc((size_t)n * 4),
                         (int32_t *)malloc((size_t)n * 4), (bool *)calloc((size_t)n, 1)};
    int32_t *chain_t0 = (int32_t *)malloc((size_t)n * 4); /* rope node -> first node of its chain, or -1 */
    bool *early = (bool *)calloc((size_t)n, 1);          /* gets priv storage */
    if (!c.uses || !c.user || !c.eff || !c.claimed || !chain_t0 || !early) {
        free(c.uses);
        free(c.user);
        free(c.eff);
        free(c.claimed);
        free(chain_t0);
        free(early);
        return err_set(err, LLMOPT_ERR_NOMEM, "cuda: out of memory");
    }
    for (int32_t i = 0; i < n; i++) {
        const struct ir_node *ni = &g->nodes[i];
        c.user[i] = -1;
        /* parameters, inputs and constants are there before the step's first kernel */
        c.eff[i] = ni->op == IR_OP_PARAM || ni->op == IR_OP_INPUT || ni->op == IR_OP_CONST || ni->constant ? -1 : i;
        chain_t0[i] = -1;
    }
    for (int32_t i = 0; i < n; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++) {
            c.uses[g->nodes[i].in[k]]++;
            c.user[g->nodes[i].in[k]] = i;
        }
    /* SwiGLU pairs: act(x Wg^T) * u with u = x Wu^T used only there */
    for (int32_t i = 0; i < n; i++) {
        const struct ir_node *gn = &g->nodes[i];
        if (!fuse_linear_ok(&c, i) || !(gn->attrs.linear_flags & IR_LINEAR_GATE)) continue;
        int k_gate = 2 + !!(gn->attrs.linear_flags & IR_LINEAR_BIAS);
        if (gn->n_in <= k_gate) continue;
        int32_t u = gn->in[k_gate];
        if (!fuse_linear_ok(&c, u)) continue;
        const struct ir_node *un = &g->nodes[u];
        const struct cu_weight *wg = &s->weight[gn->in[1]], *wu = &s->weight[un->in[1]];
        if (un->in[0] != gn->in[0] || un->attrs.linear_flags || un->attrs.linear_act != IR_OP_INPUT || c.uses[u] != 1 ||
            wu->dtype != wg->dtype || wu->rows != wg->rows || wu->cols != wg->cols)
            continue;
        s->fuse[i] = (struct cuda_fuse){FUSE_MV_PAIR, 1, {u, 0, 0}, {i, 0, 0}, {0, 0, 0}};
        s->fuse[u].kind = FUSE_SKIP;
        c.claimed[i] = c.claimed[u] = true;
    }
    /* [rms_norm ->] permute (last axis kept) -> rope chains, each link used once */
    for (int32_t i = 0; i < n; i++) {
        chain_t0[i] = norm_rope_chain(s, c.uses, c.claimed, i);
        if (chain_t0[i] < 0) continue;
        c.claimed[i] = c.claimed[g->nodes[i].in[0]] = c.claimed[chain_t0[i]] = true;
    }
    /* products of one x in one launch, each possibly written head-major */
    for (int32_t i = 0; i < n; i++) {
        if (!fuse_linear_ok(&c, i)) continue;
        const struct ir_node *l0 = &g->nodes[i];
        const struct cu_weight *w0 = &s->weight[l0->in[1]];
        struct cuda_fuse f = {FUSE_MV_MULTI, 1, {i, 0, 0}, {i, 0, 0}, {0, 0, 0}};
        for (int32_t j = i + 1; j < n && f.n < CUDA_FUSE_MAX; j++) {
            const struct ir_node *l = &g->nodes[j];
            if (!fuse_linear_ok(&c, j) || l->in[0] != l0->in[0] ||
                !fuse_types_ok(s->weight[l->in[1]].dtype, w0->dtype) ||
                s->weight[l->in[1]].cols != w0->cols || !fuse_inputs_before(&c, early, j, 2, i))
                continue;
            f.m[f.n] = f.out[f.n] = j;
            f.n++;
        }
        bool any_hm = false;
        for (int k = 0; k < f.n; k++) {
            int32_t pm = fuse_head_major(&c, f.m[k], &f.head_dim[k]);
            if (pm == IR_NONE || s->weight[g->nodes[f.m[k]].in[1]].rows % f.head_dim[k]) {
                f.head_dim[k] = 0;
                continue;
            }
            f.out[k] = pm;
            any_hm = true;
        }
        if (f.n < 2 && !any_hm) continue;
        s->fuse[i] = f;
        for (int k = 0; k < f.n; k++) {
            c.claimed[f.m[k]] = true;
            if (k > 0) s->fuse[f.m[k]].kind = FUSE_SKIP;
            if (f.out[k] != f.m[k]) { /* the reshape is a view; the permute is not run */
                c.claimed[f.out[k]] = true;
                s->fuse[f.out[k]].kind = FUSE_SKIP;
            }
            c.eff[f.m[k]] = c.eff[f.out[k]] = i;
            early[f.out[k]] = f.out[k] != i;
        }
    }
    /* chains: one launch at the first chain's first node takes the later chains whose
     * inputs are ready by then */
    for (int32_t i = 0; i < n; i++) {
        if (chain_t0[i] < 0) continue;
        int32_t t0 = chain_t0[i];
        const struct ir_node *o = &g->nodes[i];
        int32_t p = o->in[0];
        bool norm = t0 != p;
        struct cuda_fuse f = {FUSE_NORM_ROPE, 0, {0, 0, 0}, {IR_NONE, IR_NONE, IR_NONE}, {0, 0, 0}};
        for (int32_t j = i; j < n && f.n < CUDA_FUSE_MAX; j++) {
            if (chain_t0[j] < 0) continue;
            const struct ir_node *oj = &g->nodes[j];
            int32_t pj = oj->in[0], rj = g->nodes[pj].in[0];
            bool norm_j = chain_t0[j] != pj;
            int32_t xj = norm_j ? g->nodes[rj].in[0] : rj;
            bool ready = fuse_ready(&c, early, xj, t0) && fuse_ready(&c, early, oj->in[1], t0) &&
                         fuse_ready(&c, early, oj->in[2], t0) && (!norm_j || fuse_ready(&c, early, g->nodes[rj].in[1], t0)) &&
                         oj->shape.dims[oj->shape.rank - 1].coef == o->shape.dims[o->shape.rank - 1].coef;
            if (j == i && !ready) break; /* an input comes later: this chain stays unfused */
            if (!ready) continue;
            f.m[f.n] = j;
            f.out[f.n++] = norm_j ? rj : IR_NONE;
            if (j != i) {
                s->fuse[chain_t0[j]].kind = FUSE_SKIP;
                chain_t0[j] = -1;
            }
            s->fuse[j].kind = FUSE_SKIP;
            if (pj != chain_t0[j] && pj != t0) s->fuse[pj].kind = FUSE_SKIP;
            c.eff[j] = t0;
            early[j] = true;
        }
        if (!f.n) continue;
        if (norm) s->fuse[p].kind = FUSE_SKIP;
        s->fuse[t0] = f;
    }
    /* a launch of exactly an attention's q and k chains, read by it alone, moves to the
     * attention (FUSE_ATT_ROPE): after the chains' inputs, so they are ready there. The
     * memory plan may give those inputs' storage (the q/k products, cos/sin) to a node
     * after the chains, the attention's output among them: computed ones get storage
     * of their own (priv), and step inputs keep the launch where it was. */
    for (int32_t t0 = 0; t0 < n; t0++) {
        struct cuda_fuse *f = &s->fuse[t0];
        if (f->kind != FUSE_NORM_ROPE || f->n != 2 || c.uses[f->m[0]] != 1 || c.uses[f->m[1]] != 1 ||
            c.user[f->m[0]] != c.user[f->m[1]])
            continue;
        int32_t a = c.user[f->m[0]];
        const struct ir_node *an = &g->nodes[a];
        if (an->op != IR_OP_ATTENTION || an->n_in < 5 || s->fuse[a].kind != FUSE_NONE) continue;
        int qk = an->in[0] == f->m[0] && an->in[1] == f->m[1] ? 0 : an->in[0] == f->m[1] && an->in[1] == f->m[0] ? 1 : -1;
        if (qk < 0) continue;
        int32_t src[6];
        bool ok = true;
        for (int k = 0; k < 2; k++) {
            const struct ir_node *o = &g->nodes[f->m[k]];
            int32_t x = g->nodes[o->in[0]].in[0]; /* the permute's source: the norm or the raw rows */
            src[3 * k] = f->out[k] != IR_NONE ? g->nodes[x].in[0] : x;
            src[3 * k + 1] = o->in[1]; /* cos, sin */
            src[3 * k + 2] = o->in[2];
        }
        for (int k = 0; k < 6; k++) {
            src[k] = s->plan.root[src[k]];
            const struct ir_node *r = &g->nodes[src[k]];
            ok = ok && r->op != IR_OP_INPUT;
            if (r->op == IR_OP_PARAM || r->op == IR_OP_CONST || r->op == IR_OP_ROPE_FREQS || r->constant) src[k] = IR_NONE;
        }
        if (!ok) continue;
        for (int k = 0; k < 6; k++)
            if (src[k] != IR_NONE) early[src[k]] = true;
        struct cuda_fuse fa = {FUSE_ATT_ROPE, 2, {an->in[0], an->in[1], 0}, {f->out[qk], f->out[1 - qk], 0}, {0, 0, 0}};
        s->fuse[a] = fa;
        f->kind = FUSE_SKIP;
    }
    /* the rope table: one launch at the cos node (sin written ahead of its place);
     * $LLMOPT_CUDA_ROPE_TABLE=0: node by node (A/B) */
    const char *rt = getenv("LLMOPT_CUDA_ROPE_TABLE");
    for (int32_t i = 0; i < n && !(rt && !strcmp(rt, "0")); i++) {
        int32_t sn, mm, ct;
        if (!rope_table_chain(s, c.uses, i, &sn, &mm, &ct)) continue;
        s->fuse[i] = (struct cuda_fuse){FUSE_ROPE_TABLE, 3, {sn, mm, ct}, {0, 0, 0}, {0, 0, 0}};
        const int32_t cc = g->nodes[i].in[0];
        s->fuse[sn].kind = s->fuse[mm].kind = s->fuse[ct].kind = s->fuse[cc].kind = s->fuse[g->nodes[cc].in[0]].kind =
            FUSE_SKIP;
        early[s->plan.root[sn]] = true;
    }
    size_t total = 0, at = 0;
    int64_t nb = s->n_max < CUDA_MATVEC_MAX_ROWS ? s->n_max : CUDA_MATVEC_MAX_ROWS;
    for (int32_t i = 0; i < n; i++)
        if (early[i]) total += (mem_plan_node_bytes(&g->nodes[i], nb, nb) + 255) & ~(size_t)255;
    free(c.uses);
    free(c.user);
    free(c.eff);
    free(c.claimed);
    free(chain_t0);
    if (total) {
        cudaError_t ce = cudaMalloc((void **)&s->priv_store, total);
        if (ce != cudaSuccess) {
            free(early);
            CU_TRY(ce);
        }
        for (int32_t i = 0; i < n; i++)
            if (early[i]) {
                s->priv[i] = (float *)((uint8_t *)s->priv_store + at);
                at += (mem_plan_node_bytes(&g->nodes[i], nb, nb) + 255) & ~(size_t)255;
            }
    }
    free(early);
    return LLMOPT_OK;
}

/* The schedule of the other steps (prefill): each [rms_norm ->] permute -> rope chain
 * runs as one cu_norm_rope launch at its first node t0 (its rms_norm and permute, and
 * the rope itself, are skipped), where the cos/sin tables and the norm weight are ready
 * (computed before t0). The memory plan keeps the rope's storage only from the rope's
 * own position, so the result goes to device storage of its own, shared by chains
 * whose lives (t0 to the rope's last reader) do not overlap: two buffers for a
 * Llama/Qwen3 layer's q and k, whatever the depth. */
#define CUDA_PF_BUFS 8

static bool skipped_in_prefill(const void *ctx, int32_t j) {
    return ((const struct cuda_state *)ctx)->pf_fuse[j].kind == FUSE_SKIP;
}

/* Node p is a permute [1, N, H, Dh] -> [1, H, N, Dh] read once (by node t), and its
 * source's storage is not overwritten by any node that runs between p and t. */
static bool pf_tok_major_ok(const struct cuda_state *s, const int32_t *uses, int32_t p, int32_t t) {
    return !s->pf_fuse[p].kind && fusion_tok_major_permute(s->g, uses, p) &&
           fusion_source_kept(s->g, &s->plan, s->g->nodes[p].in[0], p, t, skipped_in_prefill, s);
}
static enum llmopt_status plan_prefill_chains(struct cuda_state *s, struct llmopt_err *err) {
    const struct ir_graph *g = s->g;
    int32_t n = g->n_nodes;
    s->pf_fuse = (struct cuda_fuse *)calloc((size_t)n, sizeof *s->pf_fuse);
    s->pf_priv = (float **)calloc((size_t)n, sizeof *s->pf_priv);
    s->pf_tok_major = (int8_t *)calloc((size_t)n, 1);
    int32_t *uses = (int32_t *)calloc((size_t)n, sizeof(int32_t)), *buf_of = (int32_t *)malloc((size_t)n * 4);
    if (!s->pf_fuse || !s->pf_priv || !s->pf_tok_major || !uses || !buf_of) {
        free(uses);
        free(buf_of);
        return err_set(err, LLMOPT_ERR_NOMEM, "cuda: out of memory");
    }
    const char *e = getenv("LLMOPT_CUDA_PF_FUSE");
    bool on = !(e && !strcmp(e, "0"));
    fusion_count_uses(g, uses);
    for (int32_t i = 0; i < n; i++) buf_of[i] = -1;
    size_t buf_bytes[CUDA_PF_BUFS] = {0};
    int32_t busy_until[CUDA_PF_BUFS], n_bufs = 0;
    for (int32_t i = 0; on && i < n; i++) {
        int32_t t0 = norm_rope_chain(s, uses, NULL, i);
        if (t0 < 0) continue;
        const struct ir_node *o = &g->nodes[i];
        bool ready = true; /* cos, sin (views: their root) and the norm weight before t0 */
        for (int k = 1; k < 3; k++) {
            const struct ir_node *src = &g->nodes[s->plan.root[o->in[k]]];
            ready = ready && (s->plan.root[o->in[k]] < t0 || src->constant || src->op == IR_OP_PARAM ||
                              src->op == IR_OP_INPUT);
        }
        if (t0 != o->in[0]) ready = ready && g->nodes[g->nodes[t0].in[1]].op == IR_OP_PARAM;
        int32_t b = 0;
        while (b < n_bufs && busy_until[b] >= t0) b++;
        if (!ready || b == CUDA_PF_BUFS) continue;
        if (b == n_bufs) n_bufs++;
        size_t need = (mem_plan_node_bytes(o, s->n_max, s->n_max) + 255) & ~(size_t)255;
        if (need > buf_bytes[b]) buf_bytes[b] = need;
        busy_until[b] = s->plan.last_use[i] > i ? s->plan.last_use[i] : i;
        buf_of[i] = b;
        s->pf_fuse[t0] =
            (struct cuda_fuse){FUSE_NORM_ROPE, 1, {i, 0, 0}, {t0 != o->in[0] ? t0 : IR_NONE, 0, 0}, {0, 0, 0}};
        s->pf_fuse[i].kind = FUSE_SKIP;
        if (t0 != o->in[0]) s->pf_fuse[o->in[0]].kind = FUSE_SKIP;
    }
    /* k/v permutes [1, N, H, Dh] -> [1, H, N, Dh] read only by an attention: its append
     * reads the source, if nothing that runs in between overwrites that */
    for (int32_t i = 0; on && i < n; i++) {
        const struct ir_node *an = &g->nodes[i];
        if (an->op != IR_OP_ATTENTION || an->n_in < 3) continue;
        for (int k = 1; k < 3; k++) {
            int32_t p = an->in[k];
            if (pf_tok_major_ok(s, uses, p, i) && an->in[3 - k] != p) {
                s->pf_tok_major[i] |= (int8_t)k;
                s->pf_fuse[p].kind = FUSE_SKIP;
            }
        }
    }
    free(uses);
    size_t total = 0, at[CUDA_PF_BUFS];
    for (int32_t b = 0; b < n_bufs; b++) {
        at[b] = total;
        total += buf_bytes[b];
    }
    cudaError_t ce = total ? cudaMalloc((void **)&s->pf_priv_store, total) : cudaSuccess;
    for (int32_t i = 0; ce == cudaSuccess && i < n; i++)
        if (buf_of[i] >= 0) s->pf_priv[i] = (float *)((uint8_t *)s->pf_priv_store + at[buf_of[i]]);
    free(buf_of);
    CU_TRY(ce);
    return LLMOPT_OK;
}

/* half_out (see cuda_state): every reader of node i (a norm or a product) is a linear
 * reading it as x, with f16 weights or with bf16 weights, and no other linear runs
 * between i and its last reader (they share xh). Off with $LLMOPT_CUDA_PF_FUSE=0. */
static enum llmopt_status plan_half_outputs(struct cuda_state *s, struct llmopt_err *err) {
    const struct ir_graph *g = s->g;
    int32_t n = g->n_nodes;
    s->half_out = (int8_t *)calloc((size_t)n, 1);
    int32_t *last = (int32_t *)malloc((size_t)n * 4);
    if (!s->half_out || !last) {
        free(last);
        return err_set(err, LLMOPT_ERR_NOMEM, "cuda: out of memory");
    }
    const char *e = getenv("LLMOPT_CUDA_PF_FUSE");
    bool on = !(e && !strcmp(e, "0"));
    for (int32_t i = 0; i < n; i++) {
        const struct ir_node *ni = &g->nodes[i];
        bool prod = ni->op == IR_OP_RMS_NORM || ni->op == IR_OP_LAYER_NORM || ni->op == IR_OP_LINEAR;
        s->half_out[i] = on && prod && !ni->constant && i != g->output && ni->dtype == IR_DTYPE_F32 ? 3 : 0;
        last[i] = -1; /* 3: no reader seen yet */
    }
    for (int32_t j = 0; j < n; j++) {
        const struct ir_node *nj = &g->nodes[j];
        for (int k = 0; k < nj->n_in; k++) {
            int32_t i = nj->in[k];
            if (!s->half_out[i]) continue;
            int wt = nj->op == IR_OP_LINEAR ? s->weight[nj->in[1]].dtype : -1;
            int8_t want = k == 0 && wt == CU_BF16 ? 2 : k == 0 && wt == CU_F16 ? 1 : 0;
            for (int k2 = 1; k2 < nj->n_in; k2++)
                if (nj->in[k2] == i) want = 0;
            s->half_out[i] = s->half_out[i] == 3 || s->half_out[i] == want ? want : 0;
            last[i] = j;
        }
    }
    for (int32_t i = 0; i < n; i++) {
        if (s->half_out[i] == 3) s->half_out[i] = 0;
        for (int32_t j = i + 1; s->half_out[i] && j < last[i]; j++)
            if (g->nodes[j].op == IR_OP_LINEAR && g->nodes[j].in[0] != i) s->half_out[i] = 0;
    }
    free(last);
    return LLMOPT_OK;
}

/* Scratch sizes over every batch size up to n_max. */
static enum llmopt_status size_scratch(struct cuda_state *s, struct llmopt_err *err) {
    const struct ir_graph *g = s->g;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const struct ir_node *n = &g->nodes[i];
        if (n->op == IR_OP_LINEAR) {
            const struct ir_node *wn = &g->nodes[n->in[1]];
            const int t = upload_dtype((int)wn->weight.dtype);
            bool quant = cu_dtype_blocked(t);
            if (t == CU_Q8_0 && s->n_max > CUDA_MATVEC_MAX_ROWS && wn->shape.dims[1].coef > s->mma_k)
                s->mma_k = wn->shape.dims[1].coef;
            if (t != CU_F16 && t != CU_BF16 && !(quant && s->n_max >= CUDA_DEQUANT_MIN_ROWS)) continue;
            size_t need = mem_plan_node_bytes(&g->nodes[n->in[0]], s->n_max, s->n_max) / 2;
            if (need > s->xh_bytes) s->xh_bytes = need;
            size_t wneed = quant ? (size_t)(wn->shape.dims[0].coef * wn->shape.dims[1].coef) * 2 : 0;
            if (wneed > s->wh_bytes) s->wh_bytes = wneed;
        } else if (n->op == IR_OP_ATTENTION) {
            const struct ir_shape *q = &g->nodes[n->in[0]].shape;
            int heads = (int)q->dims[1].coef, dh = (int)q->dims[3].coef;
            for (int64_t t = 1; t <= s->n_max && t <= 1024; t++) {
                for (int f16 = 0; f16 < 2; f16++) { /* the cache's type is known at the first run */
                    int64_t f = cu_attention_part_floats((int)t, heads, dh, att_splits(s, (int)t, heads, f16));
                    if (f > s->att_part_floats) s->att_part_floats = f;
                }
            }
        }
    }
    if (s->xh_bytes) CU_TRY(cudaMalloc(&s->xh, s->xh_bytes));
    if (s->mma_k)
        CU_TRY(cudaMalloc(&s->mma_scratch,
                          cu_linear_q8_mma_scratch(s->n_max < CU_MMA_MAX_ROWS ? s->n_max : CU_MMA_MAX_ROWS, s->mma_k)));
    if (s->wh_bytes && cudaMalloc(&s->wh, s->wh_bytes) != cudaSuccess) {
        cudaGetLastError(); /* optional: without it quantized prefill takes the tiled kernel */
        s->wh = NULL;
    }
    if (s->att_part_floats) {
        CU_TRY(cudaMalloc((void **)&s->att_part, (size_t)s->att_part_floats * 4));
        CU_TRY(cudaMalloc((void **)&s->att_counters, CU_ATT_COUNTERS * sizeof(unsigned)));
        CU_TRY(cudaMemset(s->att_counters, 0, CU_ATT_COUNTERS * sizeof(unsigned)));
    }
    return LLMOPT_OK;
}

static enum llmopt_status cuda_prepare_state(struct cuda_state *s, const struct ir_graph *g, int64_t n_max,
                                             int64_t max_ctx, const struct mem_plan *plan,
                                             struct llmopt_err *err) {
    char why[256];
    if (!cuda_device_available(why, sizeof why))
        return err_set(err, LLMOPT_ERR_UNSUPPORTED, "cuda: no usable device (%s)", why);
    if (plan && (plan->n_nodes != g->n_nodes || plan->n_max != n_max))
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "cuda: the given plan is for another graph or batch size");
    enum llmopt_status st = plan ? mem_plan_copy(plan, &s->plan, err) : mem_plan_build(g, n_max, n_max, &s->plan, err);
    if (st) return st;
    const char *e = getenv("LLMOPT_CUDA_GRAPHS");
    s->use_graphs = !(e && !strcmp(e, "0"));
    e = getenv("LLMOPT_CUDA_PROFILE");
    if (e && *e && strcmp(e, "0")) {
        s->prof_ev = (cudaEvent_t *)calloc((size_t)g->n_nodes + 1, sizeof *s->prof_ev);
        s->prof_node_tag = (const char **)calloc((size_t)g->n_nodes + 1, sizeof *s->prof_node_tag);
        if (!s->prof_ev || !s->prof_node_tag) return err_set(err, LLMOPT_ERR_NOMEM, "cuda: out of memory");
        for (int32_t k = 0; k <= g->n_nodes; k++) CU_TRY(cudaEventCreate(&s->prof_ev[k]));
        s->profile = true;
        s->use_graphs = false; /* events between the nodes of every step */
    }
    e = getenv("LLMOPT_CUDA_STEP_TIME");
    if (e && *e && strcmp(e, "0") && !s->profile) {
        CU_TRY(cudaEventCreate(&s->st_ev[0]));
        CU_TRY(cudaEventCreate(&s->st_ev[1]));
        s->step_time = true;
    }
    e = getenv("LLMOPT_CUDA_ATT_WARP");
    s->att_per_position = e && !strcmp(e, "0");
    e = getenv("LLMOPT_CUDA_Q8_MMA"); /* A/B: 0 sends q8_0 products of 9-64 rows to W -> bf16 + cuBLAS */
    s->mma_off = e && !strcmp(e, "0");
    e = getenv("LLMOPT_CUDA_ATT_EARLY"); /* A/B: 0 loads the cached K/V rows after the PDL wait */
    s->att_late_kv = e && !strcmp(e, "0");
    /* "S[,W]": the cluster decode kernel (splits, warps a block) instead of the warp kernel */
    s->att_dec_splits = 0; /* off by default: no faster than the warp kernel in the models (docs/cuda.md) */
    s->att_dec_warps = CUDA_ATT_DEC_WARPS;
    e = getenv("LLMOPT_CUDA_ATT_DEC");
    if (e && *e) {
        int sp = 0, w = CUDA_ATT_DEC_WARPS;
        if (sscanf(e, "%d,%d", &sp, &w) < 1 || (sp && (sp < 2 || sp > CU_ATT_DEC_MAX_SPLITS || w < 1 || w > 8)))
            return err_set(err, LLMOPT_ERR_INVALID_ARG,
                           "cuda: LLMOPT_CUDA_ATT_DEC=%s: want 0 or S[,W] with S in 2..%d and W in 1..8", e,
                           CU_ATT_DEC_MAX_SPLITS);
        s->att_dec_splits = sp;
        s->att_dec_warps = w;
    }
    e = getenv("LLMOPT_CUDA_ATT_WARPS");
    if (e && *e) {
        s->att_warp_warps = atoi(e);
        if (s->att_warp_warps != 4 && s->att_warp_warps != 8)
            return err_set(err, LLMOPT_ERR_INVALID_ARG, "cuda: LLMOPT_CUDA_ATT_WARPS=%s: want 4 or 8", e);
    }
    e = getenv("LLMOPT_CUDA_ATT_SPLITS");
    if (e && *e) {
        s->att_splits_forced = atoi(e);
        if (s->att_splits_forced < 1 || s->att_splits_forced > CU_ATT_MAX_SPLITS)
            return err_set(err, LLMOPT_ERR_INVALID_ARG, "cuda: LLMOPT_CUDA_ATT_SPLITS=%s: want 1..%d", e,
                           CU_ATT_MAX_SPLITS);
    }
    e = getenv("LLMOPT_CUDA_ATT_MMA");
    s->att_tiled_f32 = e && !strcmp(e, "0");
    e = getenv("LLMOPT_CUDA_KQ_X"); /* the K-quant matvec's x mode (A/B, tests) */
    cu_kq_set_x_mode(e && *e ? atoi(e) : -1);
    e = getenv("LLMOPT_CUDA_KQ_TUNE"); /* "nr,prefetch,blocks_per_sm" of cu_kq_tune (A/B) */
    if (e && *e) {
        int t[3] = {0, 0, 0};
        if (sscanf(e, "%d,%d,%d", &t[0], &t[1], &t[2]) >= 1) cu_kq_tune(t[0], t[1], t[2]);
    }
    e = getenv("LLMOPT_CUDA_NO_BLAS"); /* tests: send every product through the tiled kernel */
    s->use_blas = !(e && *e && strcmp(e, "0"));
    CU_TRY(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
    BLAS_TRY(cublasCreate(&s->blas));
    BLAS_TRY(cublasSetStream(s->blas, s->stream));
    CU_TRY(cudaMalloc(&s->blas_ws, CUDA_BLAS_WORKSPACE));
    BLAS_TRY(cublasSetWorkspace(s->blas, s->blas_ws, CUDA_BLAS_WORKSPACE));
    CU_TRY(cudaMalloc((void **)&s->arena, s->plan.arena_bytes ? s->plan.arena_bytes : MEMPLAN_ALIGN));
    s->extent = (struct ir_extent *)calloc((size_t)g->n_nodes, sizeof *s->extent);
    s->weight = (struct cu_weight *)calloc((size_t)g->n_nodes, sizeof *s->weight);
    s->uploads = (struct cuda_upload *)calloc((size_t)g->n_nodes, sizeof *s->uploads);
    if (!s->extent || !s->weight || !s->uploads) return err_set(err, LLMOPT_ERR_NOMEM, "cuda: out of memory");
    CU_TRY(cudaMallocHost((void **)&s->h_inputs, (size_t)(IR_INPUT_COUNT * n_max) * sizeof(int32_t)));
    CU_TRY(cudaMallocHost((void **)&s->h_out, mem_plan_node_bytes(&g->nodes[g->output], n_max, n_max) + 4));
    CU_TRY(cudaMalloc((void **)&s->d_keys, (size_t)n_max * sizeof *s->d_keys));
    CU_TRY(cudaMallocHost((void **)&s->h_keys, (size_t)n_max * sizeof *s->h_keys));
    for (int k = 0; k < IR_INPUT_COUNT; k++)
        if (g->inputs[k] == IR_NONE)
            return err_set(err, LLMOPT_ERR_INVALID_ARG, "cuda: the graph lacks input '%s'", ir_input_names[k]);
    if ((st = upload_weights(s, err))) return st;
    if ((st = plan_norm_fusion(s, err))) return st;
    if ((st = plan_decode_fusion(s, err))) return st;
    if ((st = plan_prefill_chains(s, err))) return st;
    if ((st = plan_half_outputs(s, err))) return st;
    if ((st = size_scratch(s, err))) return st;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const struct ir_node *n = &g->nodes[i];
        bool kernel = !(n->constant || n->op == IR_OP_INPUT || n->op == IR_OP_PARAM || n->op == IR_OP_RESHAPE);
        s->kernels_per_step += kernel && s->pf_fuse[i].kind != FUSE_SKIP;
        /* fused steps (<= CUDA_MATVEC_MAX_ROWS tokens) run the prologue norms inside the matvecs */
        s->kernels_per_step_fused += kernel && s->fuse[i].kind != FUSE_SKIP && !s->norm_into_matvec[i];
    }
    return compute_constants(s, err);
}

static enum llmopt_status cuda_prepare(const struct ir_graph *g, int64_t n_max, int64_t max_ctx,
                                       const struct mem_plan *plan, int32_t n_threads, void **state,
                                       struct llmopt_err *err) {
    (void)n_threads;
    if (n_max < 1 || max_ctx < 1)
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "cuda: batch size and context must be >= 1");
    struct cuda_state *s = (struct cuda_state *)calloc(1, sizeof *s);
    if (!s) return err_set(err, LLMOPT_ERR_NOMEM, "cuda: out of memory");
    s->g = g;
    s->n_max = n_max;
    s->max_ctx = max_ctx;
    enum llmopt_status st = cuda_prepare_state(s, g, n_max, max_ctx, plan, err);
    if (st) {
        cuda_release(s);
        return st;
    }
    *state = s;
    return LLMOPT_OK;
}

/* ---- run --------------------------------------------------------------------------- */

static void drop_graphs(struct cuda_state *s) {
    for (int k = 0; k < CUDA_GRAPH_CACHE; k++)
        if (s->graphs[k].exec) {
            cudaGraphExecDestroy(s->graphs[k].exec);
            s->graphs[k].exec = NULL;
        }
}

static void free_kv(struct cuda_state *s) {
    cudaFree(s->kv_store);
    cudaFree(s->d_block_table);
    cudaFreeHost(s->h_block_table);
    for (int32_t l = 0; l < s->conv_layers && s->conv_state; l++) cudaFree(s->conv_state[l]);
    free(s->conv_state);
    s->conv_state = NULL;
    s->conv_layers = 0;
    free(s->kv_k);
    free(s->kv_v);
    s->kv_store = NULL;
    s->d_block_table = s->h_block_table = NULL;
    s->kv_k = s->kv_v = NULL;
    s->kv_owner = NULL;
    s->kv_layers = 0;
}

/* The device mirror of a host KV cache, made on the first run that sees it. */
static enum llmopt_status ensure_kv(struct cuda_state *s, const struct kv_cache *kv, struct llmopt_err *err) {
    if (s->kv_owner == kv) return LLMOPT_OK;
    const struct ir_graph *g = s->g;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const struct ir_node *n = &g->nodes[i];
        if (n->op != IR_OP_ATTENTION) continue;
        const struct ir_shape *k = &g->nodes[n->in[1]].shape;
        int32_t layer = n->attrs.kv_layer;
        if (!kv || layer >= kv->n_layers || kv->row_elems[layer] != k->dims[1].coef * k->dims[3].coef)
            return err_set(err, LLMOPT_ERR_INVALID_ARG,
                           "attention layer %d: KV cache does not match (Hkv %lld x Dh %lld)", layer,
                           (long long)k->dims[1].coef, (long long)k->dims[3].coef);
    }
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const struct ir_node *n = &g->nodes[i];
        if (n->op != IR_OP_SHORT_CONV) continue;
        const struct ir_shape *w = &g->nodes[n->in[1]].shape, *x = &g->nodes[n->in[0]].shape;
        int32_t layer = n->attrs.kv_layer;
        int64_t ch = x->dims[x->rank - 1].coef, klen = w->dims[w->rank - 1].coef;
        if (!kv || layer < 0 || layer >= kv->n_conv_layers || kv->conv_channels[layer] != ch ||
            kv->conv_rows[layer] != klen - 1)
            return err_set(err, LLMOPT_ERR_INVALID_ARG,
                           "short_conv layer %d: conv state does not match (C %lld, kernel %lld)", layer,
                           (long long)ch, (long long)klen);
    }
    if (!kv) return LLMOPT_OK; /* no state ops */
    drop_graphs(s); /* captured launches point at the old mirror */
    free_kv(s);
    if (kv->n_conv_layers > 0) {
        s->conv_state = (float **)calloc((size_t)kv->n_conv_layers, sizeof(float *));
        if (!s->conv_state) return err_set(err, LLMOPT_ERR_NOMEM, "cuda: out of memory");
        s->conv_layers = kv->n_conv_layers;
        for (int32_t l = 0; l < kv->n_conv_layers; l++) {
            size_t bytes = (size_t)kv->n_slots * (size_t)kv->conv_rows[l] * (size_t)kv->conv_channels[l] * 4;
            CU_TRY(cudaMalloc((void **)&s->conv_state[l], bytes ? bytes : 4));
            CU_TRY(cudaMemsetAsync(s->conv_state[l], 0, bytes, s->stream));
        }
    }
    /* the host cache's element type: f32, f16, or q8_0 as an int8 array and, kv_scale_off
     * bytes on, an f16 scale a 32 (cu_attention's kv_q8) */
    s->kv_f16 = kv->dtype == KV_DTYPE_F16;
    s->kv_q8 = kv->dtype == KV_DTYPE_Q8_0;
    const size_t positions = (size_t)kv->n_blocks * (size_t)kv->block_size;
    s->kv_scale_off = 0;
    if (s->kv_q8)
        for (int32_t l = 0; l < kv->n_layers; l++) {
            const int64_t off = (int64_t)((positions * (size_t)kv->row_elems[l] + 255) & ~(size_t)255);
            s->kv_scale_off = off > s->kv_scale_off ? off : s->kv_scale_off;
        }
    /* one layer's K (or V): each 256-byte aligned (the kernels' 16-byte loads) */
    auto layer_bytes = [&](int32_t l) -> size_t {
        const size_t n = positions * (size_t)kv->row_elems[l];
        if (s->kv_q8) return (size_t)s->kv_scale_off + ((n / 32 * 2 + 255) & ~(size_t)255);
        return (n * (s->kv_f16 ? 2 : 4) + 255) & ~(size_t)255;
    };
    size_t bytes = 0;
    for (int32_t l = 0; l < kv->n_layers; l++) bytes += 2 * layer_bytes(l);
    s->kv_k = (void **)calloc((size_t)(kv->n_layers ? kv->n_layers : 1), sizeof(void *));
    s->kv_v = (void **)calloc((size_t)(kv->n_layers ? kv->n_layers : 1), sizeof(void *));
    if (!s->kv_k || !s->kv_v) return err_set(err, LLMOPT_ERR_NOMEM, "cuda: out of memory");
    CU_TRY(cudaMalloc((void **)&s->kv_store, bytes ? bytes : 4));
    CU_TRY(cudaMemsetAsync(s->kv_store, 0, bytes, s->stream));
    uint8_t *p = s->kv_store;
    for (int32_t l = 0; l < kv->n_layers; l++) {
        s->kv_k[l] = p;
        p += layer_bytes(l);
        s->kv_v[l] = p;
        p += layer_bytes(l);
    }
    s->kv_layers = kv->n_layers;
    s->bt_elems = (int64_t)kv->n_slots * kv->max_blocks_per_slot;
    CU_TRY(cudaMalloc((void **)&s->d_block_table, (size_t)s->bt_elems * 4));
    CU_TRY(cudaMallocHost((void **)&s->h_block_table, (size_t)s->bt_elems * 4));
    memcpy(s->h_block_table, kv->block_table, (size_t)s->bt_elems * 4);
    CU_TRY(cudaMemcpyAsync(s->d_block_table, s->h_block_table, (size_t)s->bt_elems * 4,
                           cudaMemcpyHostToDevice, s->stream));
    s->kv_owner = kv;
    return LLMOPT_OK;
}

/* Host-side checks the reference makes inside its kernels (a device kernel cannot
 * return an error): token ids, out_rows, positions and blocks. */
static enum llmopt_status check_batch(struct cuda_state *s, const struct exec_batch *b,
                                      const struct kv_cache *kv, struct llmopt_err *err) {
    const struct ir_graph *g = s->g;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const struct ir_node *n = &g->nodes[i];
        if (n->op == IR_OP_EMBEDDING && n->in[1] == g->inputs[IR_INPUT_TOKENS]) {
            int64_t vocab = g->nodes[n->in[0]].shape.dims[0].coef;
            for (int32_t t = 0; t < b->n_tokens; t++)
                if (b->tokens[t] < 0 || b->tokens[t] >= vocab)
                    return err_set(err, LLMOPT_ERR_INVALID_ARG, "token id %d out of range [0, %lld)",
                                   b->tokens[t], (long long)vocab);
        } else if (n->op == IR_OP_SELECT_ROWS && n->in[1] == g->inputs[IR_INPUT_OUT_ROWS]) {
            const struct ir_extent *ei = &s->extent[n->in[0]];
            int64_t rows_in = ei->dims[ei->rank - 2];
            for (int32_t j = 0; j < b->n_out; j++)
                if (b->out_rows[j] < 0 || b->out_rows[j] >= rows_in)
                    return err_set(err, LLMOPT_ERR_INVALID_ARG, "out_rows[%d] = %d out of range [0, %lld)", j,
                                   b->out_rows[j], (long long)rows_in);
        }
    }
    if (!g->n_kv_layers && !g->n_conv_layers) return LLMOPT_OK;
    if (s->n_slot_tokens < kv->n_slots) {
        free(s->slot_tokens);
        if (!(s->slot_tokens = (int32_t *)calloc((size_t)kv->n_slots, sizeof *s->slot_tokens))) {
            s->n_slot_tokens = 0;
            return err_set(err, LLMOPT_ERR_NOMEM, "cuda: out of memory for %d slots", kv->n_slots);
        }
        s->n_slot_tokens = kv->n_slots;
    }
    int32_t longest = 0; /* tokens of one sequence in the batch */
    for (int32_t t = 0; t < b->n_tokens; t++) {
        const int32_t slot = b->seq_slots[t];
        if (slot >= 0 && slot < kv->n_slots && ++s->slot_tokens[slot] > longest) longest = s->slot_tokens[slot];
    }
    for (int32_t t = 0; t < b->n_tokens; t++)
        if (b->seq_slots[t] >= 0 && b->seq_slots[t] < kv->n_slots) s->slot_tokens[b->seq_slots[t]] = 0;
    s->step_per_token = longest < CU_ATT_TILED_MIN_TOKENS;
    for (int32_t t = 0; t < b->n_tokens; t++) {
        int32_t slot = b->seq_slots[t], pos = b->positions[t];
        if (slot < 0 || slot >= kv->n_slots || pos < 0 ||
            (g->n_kv_layers && (pos >= kv->max_positions ||
                                kv->block_table[(int64_t)slot * kv->max_blocks_per_slot + pos / kv->block_size] < 0)))
            return err_set(err, LLMOPT_ERR_INVALID_ARG, "cuda: token %d (slot %d, position %d) has no KV block",
                           t, slot, pos);
        if (pos + 1 > s->max_ctx)
            return err_set(err, LLMOPT_ERR_LIMIT, "attention: %lld positions exceed the plan's %lld",
                           (long long)pos + 1, (long long)s->max_ctx);
    }
    return LLMOPT_OK;
}

/* Everything one step puts on the stream (eagerly or into a graph). */
static enum llmopt_status enqueue_step(struct cuda_state *s, const struct exec_batch *b, struct step_tail tail,
                                       struct llmopt_err *err) {
    const struct ir_graph *g = s->g;
    for (int k = 0; k < IR_INPUT_COUNT; k++) {
        int32_t idx = g->inputs[k];
        size_t bytes = (size_t)ir_extent_numel(&s->extent[idx]) * 4;
        if (bytes)
            CU_TRY(cudaMemcpyAsync(node_ptr(s, idx), s->h_inputs + (int64_t)k * s->n_max, bytes,
                                   cudaMemcpyHostToDevice, s->stream));
    }
    s->prof_n_ev = 0;
    s->xh_node = -1;
    s->mma_x_node = -1;
    if (s->profile) CU_TRY(cudaEventRecord(s->prof_ev[s->prof_n_ev++], s->stream));
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const struct ir_node *n = &g->nodes[i];
        if (n->constant || n->op == IR_OP_INPUT || n->op == IR_OP_PARAM || n->op == IR_OP_RESHAPE) continue;
        if ((s->fused ? s->fuse : s->pf_fuse)[i].kind == FUSE_SKIP) continue;
        s->prof_tag = NULL;
        enum llmopt_status st = run_node(s, i, err);
        if (st) return st;
        if (s->profile) {
            s->prof_node_tag[s->prof_n_ev - 1] = s->prof_tag ? s->prof_tag : ir_op_name(n->op);
            CU_TRY(cudaEventRecord(s->prof_ev[s->prof_n_ev++], s->stream));
        }
    }
    (void)b;
    const struct ir_extent *eo = &s->extent[g->output];
    size_t out_bytes = (size_t)ir_extent_numel(eo) * 4;
    if (tail.mode != TAIL_LOGITS) {
        int64_t len = eo->dims[eo->rank - 1], rows = len ? ir_extent_numel(eo) / len : 0;
        if (rows > s->n_max) return err_set(err, LLMOPT_ERR_LIMIT, "cuda: %lld output rows", (long long)rows);
        float *lg = node_f32(s, g->output);
        if (tail.pen && rows) {
            CU_TRY(cudaMemcpyAsync(s->d_pen_hdr, s->h_pen_hdr, (size_t)rows * sizeof *s->h_pen_hdr,
                                   cudaMemcpyHostToDevice, s->stream));
            CU_TRY(cudaMemcpyAsync(s->d_pen_pairs, s->h_pen_pairs,
                                   (size_t)rows * BACKEND_PENALTY_MAX * sizeof *s->h_pen_pairs, cudaMemcpyHostToDevice,
                                   s->stream));
            CU_TRY(cu_penalize_rows(s->stream, lg, rows, len, s->d_pen_hdr, s->d_pen_pairs, BACKEND_PENALTY_MAX));
            s->step_extra_kernels++;
        }
        if ((tail.mode == TAIL_DRAW || tail.sums) && rows) /* each row's temperature, min-p and u */
            CU_TRY(cudaMemcpyAsync(s->d_draw_rows, s->h_draw_rows, (size_t)rows * sizeof *s->h_draw_rows,
                                   cudaMemcpyHostToDevice, s->stream));
        if (tail.mode == TAIL_DRAW) {
            CU_TRY(cu_argmax_rows(s->stream, lg, rows, len, s->d_keys));
            CU_TRY(cu_draw_rows(s->stream, lg, rows, len, s->d_keys, s->d_draw_rows, s->d_draw_sums, s->d_draw_ids));
            s->step_extra_kernels += 2;
            if (rows)
                CU_TRY(cudaMemcpyAsync(s->h_draw_ids, s->d_draw_ids, (size_t)rows * sizeof *s->h_draw_ids,
                                       cudaMemcpyDeviceToHost, s->stream));
        } else if (tail.mode == TAIL_ARGMAX || tail.kb == 1) {
            CU_TRY(cu_argmax_rows(s->stream, lg, rows, len, s->d_keys));
            if (rows)
                CU_TRY(cudaMemcpyAsync(s->h_keys, s->d_keys, (size_t)rows * sizeof *s->h_keys,
                                       cudaMemcpyDeviceToHost, s->stream));
        } else {
            CU_TRY(cu_top_k_rows(s->stream, lg, rows, len, tail.kb, s->d_topk_blocks, s->d_topk));
            s->step_extra_kernels += len > 4096 ? 2 : 1;
            if (rows)
                CU_TRY(cudaMemcpyAsync(s->h_topk, s->d_topk, (size_t)rows * tail.kb * sizeof *s->h_topk,
                                       cudaMemcpyDeviceToHost, s->stream));
        }
        if (tail.sums && rows) { /* top-p's z: the draw's block sums with min-p 0 (d_draw_rows) */
            const bool one = tail.mode == TAIL_ARGMAX || tail.kb == 1; /* the best key is each row's first */
            CU_TRY(cu_draw_block_sums(s->stream, lg, rows, len, one ? s->d_keys : s->d_topk, one ? 1 : tail.kb,
                                      s->d_draw_rows, s->d_draw_sums));
            s->step_extra_kernels++;
            CU_TRY(cudaMemcpyAsync(s->h_draw_sums, s->d_draw_sums,
                                   (size_t)(rows * cu_draw_scratch(len)) * sizeof *s->h_draw_sums,
                                   cudaMemcpyDeviceToHost, s->stream));
        }
    } else if (out_bytes)
        CU_TRY(cudaMemcpyAsync(s->h_out, node_ptr(s, g->output), out_bytes, cudaMemcpyDeviceToHost, s->stream));
    return LLMOPT_OK;
}

static enum llmopt_status capture_step(struct cuda_state *s, const struct exec_batch *b, struct step_tail tail,
                                       cudaGraphExec_t *exec, struct llmopt_err *err) {
    CU_TRY(cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeThreadLocal));
    enum llmopt_status st = enqueue_step(s, b, tail, err);
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(s->stream, &graph);
    if (st || e != cudaSuccess) {
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError();
        if (st) return st;
        CU_TRY(e);
    }
    e = cudaGraphInstantiate(exec, graph, 0);
    cudaGraphDestroy(graph);
    CU_TRY(e);
    return LLMOPT_OK;
}

static enum llmopt_status launch_step(struct cuda_state *s, const struct exec_batch *b, struct step_tail tail,
                                      struct llmopt_err *err) {
    s->step_extra_kernels = 0;
    if (!s->use_graphs || b->n_tokens > CUDA_GRAPH_MAX_N) return enqueue_step(s, b, tail, err);
    struct cuda_graph_entry *hit = NULL, *victim = &s->graphs[0];
    for (int k = 0; k < CUDA_GRAPH_CACHE; k++) {
        struct cuda_graph_entry *ge = &s->graphs[k];
        if (ge->exec && ge->n == b->n_tokens && ge->m == b->n_out && ge->tail.mode == tail.mode &&
            ge->tail.kb == tail.kb && ge->tail.pen == tail.pen && ge->tail.sums == tail.sums)
            hit = ge;
        if (!ge->exec || (victim->exec && ge->last_used < victim->last_used)) victim = ge;
    }
    if (!hit) {
        cudaGraphExec_t exec = NULL;
        enum llmopt_status st = capture_step(s, b, tail, &exec, err);
        if (st) return st;
        if (victim->exec) cudaGraphExecDestroy(victim->exec);
        victim->exec = exec;
        victim->n = b->n_tokens;
        victim->m = b->n_out;
        victim->tail = tail;
        victim->extra_kernels = s->step_extra_kernels;
        hit = victim;
    }
    s->step_extra_kernels = hit->extra_kernels;
    hit->last_used = ++s->graph_clock;
    CU_TRY(cudaGraphLaunch(hit->exec, s->stream));
    return LLMOPT_OK;
}

/* Sums the time between consecutive node events of the step just finished. */
static void profile_collect(struct cuda_state *s, int phase) {
    if (!s->prof_seen[phase]++) return; /* the first step of a kind: cuBLAS and module start-up */
    s->prof_steps[phase]++;
    for (int32_t k = 0; k + 1 < s->prof_n_ev; k++) {
        float ms = 0.0f;
        if (cudaEventElapsedTime(&ms, s->prof_ev[k], s->prof_ev[k + 1]) != cudaSuccess) {
            cudaGetLastError();
            continue;
        }
        const char *tag = s->prof_node_tag[k];
        int32_t r = 0;
        while (r < s->n_prof && strcmp(s->prof[r].tag, tag)) r++;
        if (r == s->n_prof) {
            if (r == CUDA_PROF_ROWS) continue;
            s->prof[s->n_prof++].tag = tag;
        }
        s->prof[r].ms[phase] += ms;
        s->prof[r].calls[phase]++;
    }
}

static int prof_cmp_phase; /* qsort's comparator reads which phase to order by */
static int prof_row_cmp(const void *a, const void *b) {
    double x = ((const struct cuda_prof_row *)a)->ms[prof_cmp_phase];
    double y = ((const struct cuda_prof_row *)b)->ms[prof_cmp_phase];
    return (x < y) - (x > y);
}

static void profile_print(struct cuda_state *s) {
    static const char *const phase_name[2] = {"prefill (batches > 16 tokens)", "decode (batches <= 16 tokens)"};
    int32_t chains = 0, halves = 0, perms = 0;
    for (int32_t i = 0; i < s->g->n_nodes; i++) {
        chains += s->pf_fuse[i].kind == FUSE_NORM_ROPE;
        halves += s->half_out[i] != 0;
        perms += (s->pf_tok_major[i] & 1) + (s->pf_tok_major[i] >> 1);
    }
    fprintf(stderr, "cuda prefill schedule: %d norm/rope chains, %d results written as cuBLAS operands, %d k/v permutes "
                    "skipped\n", chains, halves, perms);
    for (int ph = 0; ph < 2; ph++) {
        if (!s->prof_steps[ph]) continue;
        prof_cmp_phase = ph;
        qsort(s->prof, (size_t)s->n_prof, sizeof s->prof[0], prof_row_cmp);
        double total = 0;
        for (int32_t r = 0; r < s->n_prof; r++) total += s->prof[r].ms[ph];
        fprintf(stderr, "cuda profile, %s: %llu steps after the first, %.3f ms a step (eager, event per node)\n", phase_name[ph],
                (unsigned long long)s->prof_steps[ph], total / (double)s->prof_steps[ph]);
        for (int32_t r = 0; r < s->n_prof; r++) {
            const struct cuda_prof_row *p = &s->prof[r];
            if (!p->calls[ph]) continue;
            fprintf(stderr, "  %-44s %9.3f ms/step %5.1f%%  %6.1f calls/step %8.2f us/call\n", p->tag,
                    p->ms[ph] / (double)s->prof_steps[ph], 100.0 * p->ms[ph] / total,
                    (double)p->calls[ph] / (double)s->prof_steps[ph], 1e3 * p->ms[ph] / (double)p->calls[ph]);
        }
    }
}

/* run_sample's buffers, for up to n_max rows of the output's length. */
static enum llmopt_status sample_buffers(struct cuda_state *s, struct llmopt_err *err) {
    if (s->sample_ready) return LLMOPT_OK;
    const struct ir_node *o = &s->g->nodes[s->g->output];
    const struct ir_dim last = o->shape.dims[o->shape.rank - 1];
    const int64_t len = last.sym == IR_SYM_NONE ? last.coef : 0, n = s->n_max;
    if (len < 1) return err_set(err, LLMOPT_ERR_UNSUPPORTED, "cuda: sampling needs a fixed row length");
    CU_TRY(cudaMalloc((void **)&s->d_topk, (size_t)n * BACKEND_TOP_K_MAX * sizeof *s->d_topk));
    CU_TRY(cudaMallocHost((void **)&s->h_topk, (size_t)n * BACKEND_TOP_K_MAX * sizeof *s->h_topk));
    CU_TRY(cudaMalloc((void **)&s->d_topk_blocks,
                      (size_t)(n * cu_top_k_scratch(len, BACKEND_TOP_K_MAX)) * sizeof *s->d_topk_blocks));
    CU_TRY(cudaMalloc((void **)&s->d_pen_hdr, (size_t)n * sizeof *s->d_pen_hdr));
    CU_TRY(cudaMallocHost((void **)&s->h_pen_hdr, (size_t)n * sizeof *s->h_pen_hdr));
    CU_TRY(cudaMalloc((void **)&s->d_pen_pairs, (size_t)n * BACKEND_PENALTY_MAX * sizeof *s->d_pen_pairs));
    CU_TRY(cudaMallocHost((void **)&s->h_pen_pairs, (size_t)n * BACKEND_PENALTY_MAX * sizeof *s->h_pen_pairs));
    CU_TRY(cudaMalloc((void **)&s->d_draw_rows, (size_t)n * sizeof *s->d_draw_rows));
    CU_TRY(cudaMallocHost((void **)&s->h_draw_rows, (size_t)n * sizeof *s->h_draw_rows));
    CU_TRY(cudaMalloc((void **)&s->d_draw_sums, (size_t)(n * cu_draw_scratch(len)) * sizeof *s->d_draw_sums));
    CU_TRY(cudaMallocHost((void **)&s->h_draw_sums, (size_t)(n * cu_draw_scratch(len)) * sizeof *s->h_draw_sums));
    CU_TRY(cudaMalloc((void **)&s->d_draw_ids, (size_t)n * sizeof *s->d_draw_ids));
    CU_TRY(cudaMallocHost((void **)&s->h_draw_ids, (size_t)n * sizeof *s->h_draw_ids));
    s->sample_ready = true;
    return LLMOPT_OK;
}

/* One step, ending as out asks. */
static enum llmopt_status cuda_step(void *state, const struct exec_batch *b, struct kv_cache *kv,
                                    struct backend_out out, struct llmopt_err *err) {
    struct cuda_state *s = (struct cuda_state *)state;
    const struct ir_graph *g = s->g;
    if (b->n_tokens < 1 || b->n_tokens > s->plan.n_max || b->n_out < 0 || b->n_out > b->n_tokens)
        return err_set(err, LLMOPT_ERR_INVALID_ARG,
                       "cuda: batch of %d tokens / %d outputs outside the plan (1..%lld)", b->n_tokens,
                       b->n_out, (long long)s->plan.n_max);
    for (int32_t i = 0; i < g->n_nodes; i++) ir_extent_of(&g->nodes[i].shape, b->n_tokens, b->n_out, &s->extent[i]);
    enum llmopt_status st = LLMOPT_OK;
    if ((g->n_kv_layers || g->n_conv_layers) && (st = ensure_kv(s, kv, err))) return st;
    if ((st = check_batch(s, b, kv, err))) return st;
    struct step_tail tail = {out.argmax ? TAIL_ARGMAX : out.cands ? TAIL_TOP_K : out.draws ? TAIL_DRAW : TAIL_LOGITS, 0,
                             false, out.cands && out.sums};
    if (tail.mode == TAIL_TOP_K || tail.mode == TAIL_DRAW) {
        if (tail.mode == TAIL_TOP_K && (out.k < 1 || out.k > BACKEND_TOP_K_MAX))
            return err_set(err, LLMOPT_ERR_INVALID_ARG, "cuda: top-k of %d (1..%d)", out.k, BACKEND_TOP_K_MAX);
        if ((tail.mode == TAIL_DRAW || tail.sums) && !out.rows)
            return err_set(err, LLMOPT_ERR_INVALID_ARG,
                           "cuda: a whole-row draw or top-p sums need each row's parameters");
        if ((st = sample_buffers(s, err))) return st;
        tail.kb = tail.mode == TAIL_DRAW ? 0 : out.k == 1 ? 1 : out.k <= 64 ? 64 : BACKEND_TOP_K_MAX;
        for (int32_t j = 0; out.rows && j < b->n_out; j++) {
            const struct backend_row_sample *r = &out.rows[j];
            const struct backend_penalty *p = &r->pen;
            if (p->n < 0 || p->n > BACKEND_PENALTY_MAX)
                return err_set(err, LLMOPT_ERR_INVALID_ARG, "cuda: row %d has %d penalty pairs (0..%d)", j, p->n,
                               BACKEND_PENALTY_MAX);
            if (tail.mode == TAIL_DRAW && !(r->temperature > 0.0f && isfinite(r->temperature) && r->u >= 0.0 &&
                                            r->u < 1.0 && r->min_p >= 0.0f && r->min_p <= 1.0f))
                return err_set(err, LLMOPT_ERR_INVALID_ARG,
                               "cuda: row %d draws with temperature %g, min_p %g, u %g (want > 0, [0, 1], [0, 1))", j,
                               (double)r->temperature, (double)r->min_p, r->u);
            if (tail.sums && !(r->temperature >= 0.0f && isfinite(r->temperature)))
                return err_set(err, LLMOPT_ERR_INVALID_ARG, "cuda: row %d sums at temperature %g (want finite, >= 0)",
                               j, (double)r->temperature);
            s->h_pen_hdr[j] = (struct cu_penalty_row){p->repeat, p->presence, p->frequency, p->n};
            for (int32_t i = 0; i < p->n; i++)
                s->h_pen_pairs[(size_t)j * BACKEND_PENALTY_MAX + i] = make_int2(p->ids[i], p->counts[i]);
            /* top-p's z is over every finite entry: min-p 0; a greedy row's (temperature 0)
             * is taken at 1 and read by nobody */
            s->h_draw_rows[j] = tail.sums
                                    ? (struct cu_draw_row){r->temperature > 0.0f ? r->temperature : 1.0f, 0.0f, 0.0}
                                    : (struct cu_draw_row){r->temperature, r->min_p, r->u};
            tail.pen = tail.pen || p->n > 0;
        }
    }
    const int32_t *src[IR_INPUT_COUNT] = {b->tokens, b->positions, b->seq_slots, b->out_rows};
    for (int k = 0; k < IR_INPUT_COUNT; k++)
        memcpy(s->h_inputs + (int64_t)k * s->n_max, src[k],
               (size_t)ir_extent_numel(&s->extent[g->inputs[k]]) * 4);
    if (g->n_kv_layers && memcmp(s->h_block_table, kv->block_table, (size_t)s->bt_elems * 4)) {
        /* the previous step has finished (one sync per step), so the shadow is free */
        memcpy(s->h_block_table, kv->block_table, (size_t)s->bt_elems * 4);
        CU_TRY(cudaMemcpyAsync(s->d_block_table, s->h_block_table, (size_t)s->bt_elems * 4,
                               cudaMemcpyHostToDevice, s->stream));
    }
    s->fused = b->n_tokens <= CUDA_MATVEC_MAX_ROWS;
    const bool timed = s->step_time && s->use_graphs && b->n_tokens <= CUDA_GRAPH_MAX_N;
    if (timed) {
        double now = clock_now_s();
        if (s->st_last_start > 0) {
            s->st_period_s += now - s->st_last_start;
            s->st_periods++;
        }
        s->st_last_start = now;
        CU_TRY(cudaEventRecord(s->st_ev[0], s->stream));
    } else
        s->st_last_start = 0; /* a prefill step between: no period measured across it */
#ifdef LLMOPT_CUDA_TRACE
    trace_init();
    const bool traced = trace_before(s->stream, b->n_tokens);
#endif
    if ((st = launch_step(s, b, tail, err))) {
        cudaStreamSynchronize(s->stream);
        cudaGetLastError();
        return st;
    }
    if (timed) CU_TRY(cudaEventRecord(s->st_ev[1], s->stream));
    CU_TRY(cudaStreamSynchronize(s->stream));
    CU_TRY(cudaGetLastError());
#ifdef LLMOPT_CUDA_TRACE
    if (traced) trace_after();
#endif
    if (timed) {
        float ms = 0.0f;
        CU_TRY(cudaEventElapsedTime(&ms, s->st_ev[0], s->st_ev[1]));
        if (s->st_steps++) s->st_device_ms += ms;
        else s->st_last_start = 0; /* the first step captured the graph: neither counted */
    }
    s->stats.kernels_run += (uint64_t)(s->fused ? s->kernels_per_step_fused : s->kernels_per_step) + s->step_extra_kernels;
    s->stats.steps++;
    if (s->profile) profile_collect(s, b->n_tokens > CUDA_GRAPH_MAX_N ? 0 : 1);
    if (out.argmax)
        for (int32_t j = 0; j < b->n_out; j++) out.argmax[j] = cu_argmax_key_index(s->h_keys[j]);
    else if (out.draws)
        memcpy(out.draws, s->h_draw_ids, (size_t)b->n_out * sizeof *out.draws);
    else if (out.cands)
        for (int32_t j = 0; j < b->n_out; j++) {
            for (int32_t i = 0; i < out.k; i++) {
                struct backend_cand *c = &out.cands[(size_t)j * out.k + i];
                cu_key_decode(tail.kb == 1 ? s->h_keys[j] : s->h_topk[(size_t)j * tail.kb + i], &c->id, &c->logit);
            }
            if (tail.sums) { /* the blocks' sums in order: sampler.c's draw_blocks_sum */
                const struct ir_extent *eo = &s->extent[g->output];
                const int64_t nb = cu_draw_scratch(eo->dims[eo->rank - 1]);
                double z = 0.0;
                for (int64_t q = 0; q < nb; q++) z += s->h_draw_sums[j * nb + q];
                out.sums[j] = z;
            }
        }
    else
        *out.logits = s->h_out;
    return LLMOPT_OK;
}

static enum llmopt_status cuda_run(void *state, const struct exec_batch *b, struct kv_cache *kv,
                                   const float **logits, struct llmopt_err *err) {
    struct backend_out out = {};
    out.logits = logits;
    return cuda_step(state, b, kv, out, err);
}

static enum llmopt_status cuda_run_argmax(void *state, const struct exec_batch *b, struct kv_cache *kv,
                                          int32_t *ids, struct llmopt_err *err) {
    struct backend_out out = {};
    out.argmax = ids;
    return cuda_step(state, b, kv, out, err);
}

static enum llmopt_status cuda_run_sample(void *state, const struct exec_batch *b, struct kv_cache *kv,
                                          const struct backend_row_sample *rows, int32_t k, struct backend_cand *cands,
                                          double *sums, int32_t *draws, struct llmopt_err *err) {
    if (k < 0 || (k && !cands) || (!k && !draws))
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "cuda: run_sample with k %d needs %s", k,
                       k ? "a place for the candidates" : "a place for the drawn ids");
    struct backend_out out = {};
    out.rows = rows;
    out.k = k;
    out.cands = k ? cands : NULL;
    out.sums = k ? sums : NULL;
    out.draws = k ? NULL : draws;
    return cuda_step(state, b, kv, out, err);
}

/* The last step's output rows as its tail left them (penalized), copied back. */
static enum llmopt_status cuda_fetch_logits(void *state, const float **logits, struct llmopt_err *err) {
    struct cuda_state *s = (struct cuda_state *)state;
    const size_t bytes = (size_t)ir_extent_numel(&s->extent[s->g->output]) * 4;
    if (bytes)
        CU_TRY(cudaMemcpyAsync(s->h_out, node_ptr(s, s->g->output), bytes, cudaMemcpyDeviceToHost, s->stream));
    CU_TRY(cudaStreamSynchronize(s->stream));
    *logits = s->h_out;
    return LLMOPT_OK;
}

static void cuda_stats(void *state, struct backend_stats *out) { *out = ((struct cuda_state *)state)->stats; }

static size_t cuda_arena_bytes(void *state) { return ((struct cuda_state *)state)->plan.arena_bytes; }

static void cuda_release(void *state) {
    struct cuda_state *s = (struct cuda_state *)state;
    if (!s) return;
    if (s->stream) cudaStreamSynchronize(s->stream);
    if (s->profile) profile_print(s);
    if (s->step_time) {
        if (s->st_steps > 1 && s->st_periods)
            fprintf(stderr, "cuda step time (replayed steps of <= %d tokens after the first): %llu steps, device "
                            "%.1f us a step; %llu periods between consecutive steps' starts, %.1f us each\n",
                    CUDA_GRAPH_MAX_N, (unsigned long long)s->st_steps - 1,
                    1e3 * s->st_device_ms / (double)(s->st_steps - 1), (unsigned long long)s->st_periods,
                    1e6 * s->st_period_s / (double)s->st_periods);
        cudaEventDestroy(s->st_ev[0]);
        cudaEventDestroy(s->st_ev[1]);
    }
    for (int32_t k = 0; s->prof_ev && k <= s->g->n_nodes; k++)
        if (s->prof_ev[k]) cudaEventDestroy(s->prof_ev[k]);
    free(s->prof_ev);
    free(s->prof_node_tag);
    drop_graphs(s);
    free_kv(s);
    for (int32_t k = 0; k < s->n_uploads; k++) cudaFree((void *)s->uploads[k].dev.data);
    cudaFree(s->arena);
    cudaFree(s->xh);
    cudaFree(s->wh);
    cudaFree(s->mma_scratch);
    cudaFree(s->att_part);
    cudaFree(s->att_counters);
    cudaFreeHost(s->h_inputs);
    cudaFreeHost(s->h_out);
    cudaFree(s->d_keys);
    cudaFreeHost(s->h_keys);
    cudaFree(s->d_topk);
    cudaFreeHost(s->h_topk);
    cudaFree(s->d_topk_blocks);
    cudaFree(s->d_pen_hdr);
    cudaFreeHost(s->h_pen_hdr);
    cudaFree(s->d_pen_pairs);
    cudaFreeHost(s->h_pen_pairs);
    cudaFreeHost(s->h_draw_rows);
    cudaFree(s->d_draw_rows);
    cudaFree(s->d_draw_sums);
    cudaFreeHost(s->h_draw_sums);
    cudaFree(s->d_draw_ids);
    cudaFreeHost(s->h_draw_ids);
    if (s->blas) cublasDestroy(s->blas);
    cudaFree(s->blas_ws);
    if (s->stream) cudaStreamDestroy(s->stream);
    cudaGetLastError();
    free(s->extent);
    free(s->slot_tokens);
    free(s->norm_into_matvec);
    free(s->fuse);
    free(s->priv);
    cudaFree(s->priv_store);
    cudaFree(s->pf_priv_store);
    free(s->pf_fuse);
    free(s->pf_priv);
    free(s->half_out);
    free(s->pf_tok_major);
    free(s->weight);
    free(s->uploads);
    mem_plan_free(&s->plan);
    free(s);
}

extern "C" const struct backend_ops cuda_backend_ops = {
    "cuda", cuda_prepare, cuda_run, cuda_run_argmax, cuda_stats, cuda_arena_bytes, cuda_release,
    NULL, /* set_node_timing: no per-node timing on CUDA yet (llmopt profile says so) */
    cuda_run_sample,
    cuda_fetch_logits,
};
