/* Drivers of the fast CPU kernels: instruction-set choice, the (ith, nth) work split
 * and the linear epilogue. The per-ISA inner loops live in isa_*.c. */
#include "backend/cpu/kernels.h"

#include "base/cpu_features.h"
#include "format/quant.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

extern const struct cpu_isa_kernels cpu_isa_kernels_scalar;
#if defined(__x86_64__) || defined(__i386__)
extern const struct cpu_isa_kernels cpu_isa_kernels_avx2;
extern const struct cpu_isa_kernels cpu_isa_kernels_avx512;
#define CPU_KERNELS_X86 1
#endif

static const char *const isa_names[CPU_ISA_COUNT] = {
    [CPU_ISA_SCALAR] = "scalar",
    [CPU_ISA_AVX2] = "avx2",
    [CPU_ISA_AVX512] = "avx512",
};
_Static_assert(LLMOPT_ARRAY_LEN(isa_names) == CPU_ISA_COUNT, "isa name table out of sync");

const char *cpu_isa_name(enum cpu_isa isa) {
    return (unsigned)isa < CPU_ISA_COUNT ? isa_names[isa] : "?";
}

bool cpu_isa_available(enum cpu_isa isa) {
    const struct cpu_features *f = cpu_features_get();
    switch (isa) {
    case CPU_ISA_SCALAR: return true;
#ifdef CPU_KERNELS_X86
    case CPU_ISA_AVX2: return f->has[CPU_AVX2] && f->has[CPU_FMA] && f->has[CPU_F16C];
    case CPU_ISA_AVX512:
        return cpu_isa_available(CPU_ISA_AVX2) && f->has[CPU_AVX512F] && f->has[CPU_AVX512BW] &&
               f->has[CPU_AVX512VL] && f->has[CPU_AVX512_VNNI];
#endif
    default: (void)f; return false;
    }
}

enum cpu_isa cpu_isa_best(void) {
    enum cpu_isa cap = CPU_ISA_COUNT - 1;
    const char *env = getenv("LLMOPT_CPU_ISA");
    if (env)
        for (int i = 0; i < CPU_ISA_COUNT; i++)
            if (!strcmp(env, isa_names[i])) cap = (enum cpu_isa)i;
    for (int i = cap; i > 0; i--)
        if (cpu_isa_available((enum cpu_isa)i)) return (enum cpu_isa)i;
    return CPU_ISA_SCALAR;
}

const struct cpu_isa_kernels *cpu_isa_kernels_get(enum cpu_isa isa) {
    if (!cpu_isa_available(isa)) return NULL;
    switch (isa) {
    case CPU_ISA_SCALAR: return &cpu_isa_kernels_scalar;
#ifdef CPU_KERNELS_X86
    case CPU_ISA_AVX2: return &cpu_isa_kernels_avx2;
    case CPU_ISA_AVX512: return &cpu_isa_kernels_avx512;
#endif
    default: return NULL;
    }
}

/* ---- quantized activations -------------------------------------------------------- */

static size_t align64(size_t n) {
    return (n + 63) & ~(size_t)63;
}

size_t cpu_qact_bytes(int64_t rows, int64_t k) {
    return align64((size_t)(rows * k)) + 2 * align64((size_t)(rows * (k / CPU_QBLOCK)) * 4) +
           align64((size_t)(rows * (k / 4)) * sizeof(int32_t)) + 64;
}

void cpu_qact_bind(struct cpu_qact *qa, void *buf, int64_t rows, int64_t k) {
    uint8_t *p = (uint8_t *)(((uintptr_t)buf + 63) & ~(uintptr_t)63);
    qa->k = k;
    qa->qs = (int8_t *)p;
    p += align64((size_t)(rows * k));
    qa->d = (float *)(void *)p;
    p += align64((size_t)(rows * (k / CPU_QBLOCK)) * sizeof(float));
    qa->corr = (int32_t *)(void *)p;
    p += align64((size_t)(rows * (k / 4)) * sizeof(int32_t));
    qa->bsum = (int32_t *)(void *)p;
}

/* ---- linear ----------------------------------------------------------------------- */

/* Activation rows from which a linear packs weights for the GEMM micro-kernels (when
 * the ISA has them); below it the dot-product tiles read the weights as stored. 0: by
 * weight type, where the kernel lab measured the crossover (AVX-512, k 1024, n 3072:
 * F32/F16 between 16 and 32 rows). Block-quantized weights take the tiles while one or
 * two passes of CPU_TILE_R rows cover the activations (rows <= 8): from memory, a
 * second pass over a tile already in L1 costs less than packing the weights. On the
 * EPYC host (bench_kernels --rows, 2 threads, bench/results/cpu-pack-epyc-2026-11-30.md)
 * the tiles led by 1.3-2.5x at 5-8 rows for Q8_0, Q4_0, Q4_K and Q6_K and the GEMM
 * overtook them between 10 (Q8_0) and 24 (Q6_K) rows; the Xeon host's earlier
 * crossover at 5 was measured with the weights in L2 and the gathering pack. */
int cpu_gemm_min_rows = 0;
bool cpu_linear_one_range = false;

bool cpu_dtype_is_kq(enum ir_dtype t) {
    return t == IR_DTYPE_Q4_K || t == IR_DTYPE_Q5_K || t == IR_DTYPE_Q6_K || t == IR_DTYPE_Q5_0 ||
           t == IR_DTYPE_IQ4_XS;
}

static bool weight_quantized(enum ir_dtype t) {
    return t == IR_DTYPE_Q8_0 || t == IR_DTYPE_Q4_0 || cpu_dtype_is_kq(t);
}

bool cpu_linear_supports(enum ir_dtype t, int64_t k) {
    if (t == IR_DTYPE_F32 || t == IR_DTYPE_F16 || t == IR_DTYPE_BF16) return true;
    return weight_quantized(t) && k % ir_dtype_block_elems(t) == 0;
}

/* The ISA has a GEMM for weights of type t. */
static bool has_gemm(const struct cpu_isa_kernels *kern, enum ir_dtype t) {
    if (cpu_dtype_is_kq(t)) return kern->kq && kern->kq->gemm_tile;
    return kern->gemm_tile && kern->gemm_supports(t);
}

/* Linears over rows activation rows of weights packed per op take the GEMM from
 * min_rows on. With panels packed once (cpu_linear.packed) float weights take it at
 * every row count: a packed panel beats the dot-product tiles even for one row
 * (stories260K F32, bench_batch_decode at batch 1: 22-25 against 37-45 us a token).
 * Block-quantized weights keep min_rows: their GEMM sums the blocks in another order,
 * which flipped a near tie in stories260K-Q8_0's greedy story (tests/cli/
 * test_stories.sh wants its first 100 ids equal to F32's, issue 7). The tiles, one
 * 4-row pass after another over weights still in L1, beat the GEMM and its per-panel
 * unpack through 8 rows for every block type, and through 16 for q4_K and q6_K (2 threads
 * on the EPYC host, bench/results/cpu-kquant-crossover-epyc-2026-12-01.md); q5_K's tiles
 * already lose at 9. */
static bool use_gemm(const struct cpu_isa_kernels *kern, enum ir_dtype t, int64_t rows, bool packed) {
    int min_rows = cpu_gemm_min_rows > 0                     ? cpu_gemm_min_rows
                   : t == IR_DTYPE_Q4_K || t == IR_DTYPE_Q6_K ? 4 * CPU_TILE_R + 1
                   : weight_quantized(t)                     ? 2 * CPU_TILE_R + 1
                   : packed                                  ? 1
                                                             : 24;
    return has_gemm(kern, t) && rows >= min_rows;
}

static size_t gemm_panel_bytes(const struct cpu_isa_kernels *kern, enum ir_dtype t, int64_t k) {
    return cpu_dtype_is_kq(t) ? kern->kq->gemm_panel_bytes(t, k) : kern->gemm_panel_bytes(t, k);
}

size_t cpu_linear_scratch_bytes(const struct cpu_isa_kernels *kern, enum ir_dtype t, int64_t rows,
                                int64_t k, int n_threads) {
    size_t bytes = 0;
    if (weight_quantized(t)) bytes += cpu_qact_bytes(rows, k);
    if (use_gemm(kern, t, rows, false))
        bytes += 64 + (size_t)(n_threads > 0 ? n_threads : 1) * align64(gemm_panel_bytes(kern, t, k));
    return bytes;
}

size_t cpu_linear_packed_bytes(const struct cpu_isa_kernels *kern, enum ir_dtype t, int64_t k, int64_t n_out) {
    if (!cpu_linear_supports(t, k) || !has_gemm(kern, t)) return 0;
    return (size_t)((n_out + CPU_GEMM_NC - 1) / CPU_GEMM_NC) * align64(gemm_panel_bytes(kern, t, k));
}

void cpu_linear_pack(const struct cpu_isa_kernels *kern, enum ir_dtype t, const void *w, int64_t k, int64_t n_out,
                     void *packed) {
    bool kq = cpu_dtype_is_kq(t);
    void (*pack)(enum ir_dtype, const uint8_t *, size_t, int64_t, int, void *) = kq ? kern->kq->gemm_pack
                                                                                   : kern->gemm_pack;
    size_t ldw = ir_dtype_row_bytes(t, k), panel_bytes = align64(gemm_panel_bytes(kern, t, k));
    LLMOPT_ASSERT(((uintptr_t)packed & 63) == 0);
    for (int64_t c0 = 0; c0 < n_out; c0 += CPU_GEMM_NC) {
        int nc = n_out - c0 < CPU_GEMM_NC ? (int)(n_out - c0) : CPU_GEMM_NC;
        pack(t, (const uint8_t *)w + (size_t)c0 * ldw, ldw, k, nc, (uint8_t *)packed + (size_t)(c0 / CPU_GEMM_NC) * panel_bytes);
    }
}

struct linear_ctx {
    const struct cpu_linear *op;
    const struct cpu_isa_kernels *kern;
    struct cpu_pool *pool;
    struct cpu_qact qa;
    size_t ldw; /* bytes per weight row */
    cpu_tile_f_fn tile_f;
    cpu_tile_q_fn tile_q; /* set for block-quantized weights */
    bool gemm;
    /* the GEMM functions for this weight type (the ISA's, or its kq table's) */
    void (*gemm_pack)(enum ir_dtype t, const uint8_t *w, size_t ldw, int64_t k, int nc, void *panel);
    void (*gemm_tile)(enum ir_dtype t, const void *panel, const float *x, const struct cpu_qact *qa,
                      int64_t r0, int64_t k, int nr, float *out);
    int (*gemm_rows)(enum ir_dtype t);
    uint8_t *panels;      /* (threads, panel_bytes) when gemm */
    /* GEMM work items (column groups, the last ones in row halves) are handed out
     * from this counter, so a thread the OS delays (this machine is shared) does less
     * of the op instead of holding up the rest. */
    _Atomic int64_t next_col;
    /* Dot-product path: thread i owns the i-th of n_ranges contiguous column ranges
     * and takes its chunks in order from range_next[i], then helps with the others'
     * ranges the same way. Each thread streams one contiguous region of weights (the
     * tiles prefetch the next one ahead) instead of chunks interleaved with the other
     * threads', and a thread the OS delays still loses its work to the others. */
    int n_ranges;
    _Atomic int64_t range_next[POOL_MAX_THREADS];
    _Atomic int64_t next_row; /* activation rows to quantize */
    size_t panel_bytes;
};

static void linear_epilogue(const struct linear_ctx *ctx, int64_t r0, int nr, int64_t c0, int nc,
                            const float *tile, int ld_tile) {
    const struct cpu_linear *op = ctx->op;
    for (int r = 0; r < nr; r++) {
        int64_t at = (r0 + r) * op->n_out + c0;
        ctx->kern->epilogue_row(tile + r * ld_tile, nc, op->bias ? op->bias + c0 : NULL, op->act,
                                op->gate ? op->gate + at : NULL, op->residual ? op->residual + at : NULL,
                                op->y + at);
    }
}

/* Prefill: a thread packs each CPU_GEMM_NC-column group it takes once into its panel
 * and runs every activation row over it. Groups are taken one at a time from a counter;
 * the last nth groups go as two halves of their rows each (each half packs the panel
 * unless its thread just did), so the threads finish within half a group of each
 * other rather than a whole one. */
static void linear_gemm_columns(struct linear_ctx *ctx, int ith, int nth) {
    const struct cpu_linear *op = ctx->op;
    /* with pre-packed panels there is no scratch (ctx->panels NULL) */
    uint8_t *panel = op->packed ? NULL : ctx->panels + (size_t)ith * ctx->panel_bytes;
    int rstep = ctx->gemm_rows(op->wtype);
    _Alignas(64) float tile[8 * CPU_GEMM_NC];
    LLMOPT_ASSERT(rstep <= 8);
    const int64_t n_groups = (op->n_out + CPU_GEMM_NC - 1) / CPU_GEMM_NC;
    const int64_t rows_half = (op->rows / 2 + rstep - 1) / rstep * rstep;
    const int64_t n_split = nth > 1 && rows_half > 0 && rows_half < op->rows ? (n_groups < nth ? n_groups : nth) : 0;
    const int64_t n_whole = n_groups - n_split;
    int64_t in_panel = -1; /* the group this thread's panel holds */
    for (;;) {
        int64_t it = atomic_fetch_add(&ctx->next_col, 1), g, rb = 0, re = op->rows;
        if (it >= n_whole + 2 * n_split) break;
        if (it < n_whole) {
            g = it;
        } else {
            g = n_whole + (it - n_whole) / 2;
            if ((it - n_whole) % 2) rb = rows_half;
            else re = rows_half;
        }
        int64_t c0 = g * CPU_GEMM_NC;
        int nc = op->n_out - c0 < CPU_GEMM_NC ? (int)(op->n_out - c0) : CPU_GEMM_NC;
        if (op->packed)
            panel = (uint8_t *)op->packed + (size_t)g * ctx->panel_bytes;
        else if (in_panel != g)
            ctx->gemm_pack(op->wtype, (const uint8_t *)op->w + (size_t)c0 * ctx->ldw, ctx->ldw, op->k, nc, panel);
        in_panel = g;
        for (int64_t r0 = rb; r0 < re; r0 += rstep) {
            int nr = re - r0 < rstep ? (int)(re - r0) : rstep;
            ctx->gemm_tile(op->wtype, panel, op->x, &ctx->qa, r0, op->k, nr, tile);
            linear_epilogue(ctx, r0, nr, c0, nc, tile, CPU_GEMM_NC);
        }
    }
}

/* Columns per chunk of the dot-product path (16 tiles); rows per chunk of activation
 * quantization. */
#define LINEAR_CHUNK_COLS 64
#define LINEAR_CHUNK_ROWS 8

/* Rows up to which the dot-product path collects a chunk's outputs before its
 * epilogue (one call per row over 64 columns rather than one per tile of 4). */
#define LINEAR_BUF_ROWS (2 * CPU_TILE_R)

/* Decode and short batches, columns [cb, ce) of one chunk: one tile of CPU_TILE_C
 * weight rows (a few KiB) stays in L1 while every activation row passes over it, so
 * each weight byte comes from memory once per op. */
static void linear_tile_chunk(struct linear_ctx *ctx, int64_t cb, int64_t ce, float *buf) {
    const struct cpu_linear *op = ctx->op;
    float tile[CPU_TILE_R * CPU_TILE_C];
    const bool buffered = op->rows <= LINEAR_BUF_ROWS;
    for (int64_t c0 = cb; c0 < ce; c0 += CPU_TILE_C) {
        int nc = ce - c0 < CPU_TILE_C ? (int)(ce - c0) : CPU_TILE_C;
        const uint8_t *w = (const uint8_t *)op->w + (size_t)c0 * ctx->ldw;
        for (int64_t r0 = 0; r0 < op->rows; r0 += CPU_TILE_R) {
            int nr = op->rows - r0 < CPU_TILE_R ? (int)(op->rows - r0) : CPU_TILE_R;
            if (ctx->tile_q)
                ctx->tile_q(&ctx->qa, r0, w, ctx->ldw, nr, nc, tile);
            else
                ctx->tile_f(op->x + r0 * op->k, op->k, w, ctx->ldw, op->k, nr, nc, tile);
            if (!buffered) {
                linear_epilogue(ctx, r0, nr, c0, nc, tile, CPU_TILE_C);
                continue;
            }
            for (int r = 0; r < nr; r++)
                for (int c = 0; c < nc; c++) buf[(r0 + r) * LINEAR_CHUNK_COLS + (c0 - cb) + c] = tile[r * CPU_TILE_C + c];
        }
    }
    if (buffered) linear_epilogue(ctx, 0, (int)op->rows, cb, (int)(ce - cb), buf, LINEAR_CHUNK_COLS);
}

static void linear_tile_columns(struct linear_ctx *ctx, int ith) {
    const struct cpu_linear *op = ctx->op;
    _Alignas(64) float buf[LINEAR_BUF_ROWS * LINEAR_CHUNK_COLS];
    for (int j = 0; j < ctx->n_ranges; j++) {
        int i = (ith + j) % ctx->n_ranges;
        int64_t begin, end, cb;
        pool_split(op->n_out, LINEAR_CHUNK_COLS, i, ctx->n_ranges, &begin, &end);
        while ((cb = atomic_fetch_add(&ctx->range_next[i], LINEAR_CHUNK_COLS)) < end)
            linear_tile_chunk(ctx, cb, end - cb < LINEAR_CHUNK_COLS ? end : cb + LINEAR_CHUNK_COLS, buf);
    }
}

static void linear_thread(void *arg, int ith, int nth) {
    struct linear_ctx *ctx = arg;
    if (ctx->gemm)
        linear_gemm_columns(ctx, ith, nth);
    else
        linear_tile_columns(ctx, ith);
}

/* Quantizes the activations, rows taken in chunks from a counter. */
static void linear_quantize_thread(void *arg, int ith, int nth) {
    struct linear_ctx *ctx = arg;
    const struct cpu_linear *op = ctx->op;
    int64_t r0;
    (void)ith;
    (void)nth;
    while ((r0 = atomic_fetch_add(&ctx->next_row, LINEAR_CHUNK_ROWS)) < op->rows) {
        int64_t r1 = op->rows - r0 < LINEAR_CHUNK_ROWS ? op->rows : r0 + LINEAR_CHUNK_ROWS;
        for (int64_t r = r0; r < r1; r++) ctx->kern->quantize_row(op->x + r * op->k, &ctx->qa, r);
    }
}

/* Below this many multiply-adds a linear runs on the calling thread: waking the pool
 * costs more than it saves. */
#define LINEAR_MIN_PARALLEL_MACS (1 << 18)

void cpu_linear_run(const struct cpu_linear *op, const struct cpu_isa_kernels *kern,
                    struct cpu_pool *pool) {
    if (op->rows <= 0 || op->n_out <= 0) return;
    struct linear_ctx ctx = {.op = op, .kern = kern, .pool = pool};
    ctx.ldw = ir_dtype_row_bytes(op->wtype, op->k);
    switch (op->wtype) {
    case IR_DTYPE_F32: ctx.tile_f = kern->tile_f32; break;
    case IR_DTYPE_F16: ctx.tile_f = kern->tile_f16; break;
    case IR_DTYPE_BF16: ctx.tile_f = kern->tile_bf16; break;
    case IR_DTYPE_Q8_0: ctx.tile_q = kern->tile_q8_0; break;
    case IR_DTYPE_Q4_0: ctx.tile_q = kern->tile_q4_0; break;
    case IR_DTYPE_Q4_K: ctx.tile_q = kern->kq->tile_q4_k; break;
    case IR_DTYPE_Q5_K: ctx.tile_q = kern->kq->tile_q5_k; break;
    case IR_DTYPE_Q6_K: ctx.tile_q = kern->kq->tile_q6_k; break;
    case IR_DTYPE_Q5_0: ctx.tile_q = kern->kq->tile_q5_0; break;
    case IR_DTYPE_IQ4_XS: ctx.tile_q = kern->kq->tile_iq4_xs; break;
    default: LLMOPT_ASSERT(!"cpu_linear_run: unsupported weight type");
    }
    LLMOPT_ASSERT(cpu_linear_supports(op->wtype, op->k));
    uint8_t *scratch = op->scratch;
    if (ctx.tile_q) {
        LLMOPT_ASSERT(op->k % CPU_QBLOCK == 0 && scratch);
        cpu_qact_bind(&ctx.qa, scratch, op->rows, op->k);
        scratch += cpu_qact_bytes(op->rows, op->k);
    }
    bool single = op->rows * op->n_out * op->k < LINEAR_MIN_PARALLEL_MACS;
    if (use_gemm(kern, op->wtype, op->rows, op->packed)) {
        LLMOPT_ASSERT(op->packed || scratch);
        ctx.gemm = true;
        bool kq = cpu_dtype_is_kq(op->wtype);
        ctx.gemm_pack = kq ? kern->kq->gemm_pack : kern->gemm_pack;
        ctx.gemm_tile = kq ? kern->kq->gemm_tile : kern->gemm_tile;
        ctx.gemm_rows = kq ? kern->kq->gemm_rows : kern->gemm_rows;
        ctx.panel_bytes = align64(gemm_panel_bytes(kern, op->wtype, op->k));
        ctx.panels = (uint8_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    }
    if (ctx.tile_q) { /* the activations, quantized once for every column */
        if (single || op->rows <= CPU_TILE_R)
            for (int64_t r = 0; r < op->rows; r++) kern->quantize_row(op->x + r * op->k, &ctx.qa, r);
        else
            pool_run_shared(pool, linear_quantize_thread, &ctx);
    }
    ctx.n_ranges = single || cpu_linear_one_range ? 1 : pool_threads(pool);
    for (int i = 0; i < ctx.n_ranges; i++) {
        int64_t begin, end;
        pool_split(op->n_out, LINEAR_CHUNK_COLS, i, ctx.n_ranges, &begin, &end);
        atomic_init(&ctx.range_next[i], begin);
    }
    if (single)
        linear_thread(&ctx, 0, 1);
    else
        pool_run_shared(pool, linear_thread, &ctx);
}

/* ---- attention -------------------------------------------------------------------- */

bool cpu_attention_heads = true;

/* Floats of one segment state: acc (n_heads, head_dim), max and sum per head. */
static int64_t attention_seg_floats(int64_t n_heads, int64_t head_dim) {
    return n_heads * (head_dim + 2);
}

/* The top of each thread's attention scratch holds CPU_ATT_SEGS_MAX segment states:
 * segment s's at thread s % nth, slot s / nth. */
static int64_t attention_seg_share(int64_t n_heads, int64_t head_dim) {
    return CPU_ATT_SEGS_MAX * attention_seg_floats(n_heads, head_dim);
}

int64_t cpu_attention_scratch_floats(int64_t n_heads, int64_t n_kv_heads, int64_t head_dim) {
    int64_t group = n_kv_heads > 0 ? n_heads / n_kv_heads : n_heads, nq = CPU_ATT_QBLOCK * group + 4;
    /* the block kernel: acc, max, sum, a chunk of scores per query; one chunk of K and
     * V rows widened */
    int64_t block = nq * (head_dim + 2 + 64 + 16) + 64 + 2 * 64 * head_dim;
    /* the decode kernel: the same per head of a group (chunks of CPU_ATT_DEC_CHUNK
     * positions, 16 lanes of padding) */
    int64_t decode = group * (head_dim + 2 + CPU_ATT_DEC_CHUNK + 16);
    /* the all-heads decode kernel: scaled queries, accumulator, max and sum per head,
     * and a chunk of scores for two heads per query head of a KV head */
    int64_t heads = 4 * n_heads * head_dim + 2 * group * CPU_ATT_DEC_CHUNK;
    /* the prefill kernel: transposed queries and outputs, a chunk of probabilities,
     * max / sum / rescale per query (queries padded), a chunk of K and V rows widened */
    int64_t nq_pad = (CPU_ATT_QBLOCK * group + CPU_ATT_PF_QPAD - 1) / CPU_ATT_PF_QPAD * CPU_ATT_PF_QPAD;
    int64_t prefill = nq_pad * (2 * head_dim + CPU_ATT_PF_CHUNK + 3) + 2 * CPU_ATT_PF_CHUNK * head_dim;
    int64_t most = block > decode ? block : decode;
    most = most > prefill ? most : prefill;
    most = most > heads ? most : heads;
    /* then room for the segment states attention_segments stores here */
    return most + attention_seg_share(n_heads, head_dim);
}

struct attention_ctx {
    const struct cpu_attention *op;
    const struct cpu_isa_kernels *kern;
    bool heads; /* single-token runs go to attention_heads, one item per token */
    bool decode_items; /* a decode batch: one item per (KV head, token) */
    _Atomic int64_t next_item;
};

/* Token t is a run of one within its block of CPU_ATT_QBLOCK: no neighbour in the
 * block continues its sequence. */
static bool attention_single(const struct cpu_attention *op, int64_t t) {
    int64_t b0 = t / CPU_ATT_QBLOCK * CPU_ATT_QBLOCK, b1 = b0 + CPU_ATT_QBLOCK < op->n_tok ? b0 + CPU_ATT_QBLOCK : op->n_tok;
    bool after = t > b0 && op->slot[t - 1] == op->slot[t] && op->pos[t] == op->pos[t - 1] + 1;
    bool before = t + 1 < b1 && op->slot[t + 1] == op->slot[t] && op->pos[t + 1] == op->pos[t] + 1;
    return !after && !before;
}

/* Items are taken one at a time from a counter: prefill items grow with the position,
 * and a thread the OS delays should not hold up the others. The first items are the
 * runs of one token (decode): with ctx->heads one a token, every head in one call; in
 * a batch of nothing but such runs (ctx->decode_items) one a (KV head, token), KV head
 * major, so that threads taking consecutive items read different sequences' rows rather
 * than the same rows a few hundred bytes apart (see kg_attention_decode_seg). Then
 * (block of CPU_ATT_QBLOCK tokens, KV head) items for the rest, whose runs of a sequence
 * share their K/V reads. */
static void attention_thread(void *arg, int ith, int nth) {
    struct attention_ctx *ctx = arg;
    const struct cpu_attention *op = ctx->op;
    float *scratch = op->scratch + ith * op->scratch_per_thread;
    int64_t n_blocks = (op->n_tok + CPU_ATT_QBLOCK - 1) / CPU_ATT_QBLOCK, it;
    int64_t n_single = ctx->heads ? op->n_tok : ctx->decode_items ? op->n_tok * op->n_kv_heads : 0;
    (void)nth;
    while ((it = atomic_fetch_add(&ctx->next_item, 1)) < n_single + n_blocks * op->n_kv_heads) {
        if (it < n_single) {
            int64_t t = it % op->n_tok, kvh = it / op->n_tok;
            if (!ctx->decode_items && !attention_single(op, t)) continue; /* decode_items: all are */
            if (ctx->heads) ctx->kern->attention_heads(op, t, scratch);
            else ctx->kern->attention_block(op, t, t + 1, kvh, scratch);
            continue;
        }
        it -= n_single;
        int64_t b = it / op->n_kv_heads, kvh = it % op->n_kv_heads;
        int64_t end = (b + 1) * CPU_ATT_QBLOCK < op->n_tok ? (b + 1) * CPU_ATT_QBLOCK : op->n_tok;
        for (int64_t t0 = b * CPU_ATT_QBLOCK, t1; t0 < end; t0 = t1) {
            for (t1 = t0 + 1; t1 < end && op->slot[t1] == op->slot[t0] && op->pos[t1] == op->pos[t1 - 1] + 1;)
                t1++;
            if (t1 - t0 > 1 || !n_single) ctx->kern->attention_block(op, t0, t1, kvh, scratch);
        }
    }
}

/* One token's positions [first, first + npos) in n_seg segments; thread ith takes
 * segments [ith * n_seg / nth, (ith + 1) * n_seg / nth), so each streams one stretch of
 * the cache; the last thread to finish merges. */
struct attention_seg_ctx {
    const struct cpu_attention *op;
    const struct cpu_isa_kernels *kern;
    int32_t first, npos;
    int n_seg, nth;
    _Atomic int done;
};

static float *attention_seg_part(const struct attention_seg_ctx *ctx, int s) {
    const struct cpu_attention *op = ctx->op;
    int64_t share = attention_seg_share(op->n_heads, op->head_dim);
    return op->scratch + (s % ctx->nth) * op->scratch_per_thread + op->scratch_per_thread - share +
           (s / ctx->nth) * attention_seg_floats(op->n_heads, op->head_dim);
}

static void attention_seg_thread(void *arg, int ith, int nth) {
    struct attention_seg_ctx *ctx = arg;
    const struct cpu_attention *op = ctx->op;
    float *scratch = op->scratch + ith * op->scratch_per_thread;
    for (int s = ith * ctx->n_seg / nth; s < (ith + 1) * ctx->n_seg / nth; s++) {
        int32_t b = ctx->first + (int32_t)((int64_t)ctx->npos * s / ctx->n_seg);
        int32_t e = ctx->first + (int32_t)((int64_t)ctx->npos * (s + 1) / ctx->n_seg);
        ctx->kern->attention_decode_seg(op, 0, b, e, attention_seg_part(ctx, s), scratch);
    }
    if (atomic_fetch_add_explicit(&ctx->done, 1, memory_order_acq_rel) != nth - 1) return;
    const float *parts[CPU_ATT_SEGS_MAX];
    for (int s = 0; s < ctx->n_seg; s++) parts[s] = attention_seg_part(ctx, s);
    ctx->kern->attention_merge(op, 0, parts, ctx->n_seg);
}

/* The segmented path takes it: one token (any cache type) and at least
 * CPU_ATT_SEG_MIN positions; returns false for the per-head paths. */
static bool attention_segments(const struct cpu_attention *op, const struct cpu_isa_kernels *kern,
                               struct cpu_pool *pool) {
    if (op->n_tok != 1 || !kern->attention_decode_seg) return false;
    int32_t p = op->pos[0];
    int32_t first = cpu_attention_first(op->window, p);
    int32_t npos = p + 1 - first;
    if (npos < CPU_ATT_SEG_MIN) return false;
    struct attention_seg_ctx ctx = {.op = op, .kern = kern, .first = first, .npos = npos,
                                    .n_seg = npos / CPU_ATT_SEG_POS, .nth = pool ? pool_threads(pool) : 1};
    if (ctx.n_seg > CPU_ATT_SEGS_MAX) ctx.n_seg = CPU_ATT_SEGS_MAX;
    if (ctx.nth == 1) attention_seg_thread(&ctx, 0, 1);
    else pool_run(pool, attention_seg_thread, &ctx);
    return true;
}

void cpu_attention_run(const struct cpu_attention *op, const struct cpu_isa_kernels *kern,
                       struct cpu_pool *pool) {
    struct attention_ctx ctx = {.op = op, .kern = kern};
    LLMOPT_ASSERT(op->scratch_per_thread >=
                  cpu_attention_scratch_floats(op->n_heads, op->n_kv_heads, op->head_dim));
    ctx.heads = cpu_attention_heads && kern->attention_heads_ok && kern->attention_heads_ok(op);
    if (!ctx.heads && attention_segments(op, kern, pool)) return;
    ctx.decode_items = !ctx.heads;
    for (int64_t t = 0; t < op->n_tok && ctx.decode_items; t++) ctx.decode_items = attention_single(op, t);
    /* multiply-adds of q.k and p.v over every token's positions */
    int64_t work = 0;
    for (int64_t t = 0; t < op->n_tok; t++) work += 2 * ((int64_t)op->pos[t] + 1) * op->n_heads * op->head_dim;
    if (op->n_tok * op->n_kv_heads == 1 || work < LINEAR_MIN_PARALLEL_MACS)
        attention_thread(&ctx, 0, 1);
    else
        pool_run_shared(pool, attention_thread, &ctx);
}

/* ---- rms_norm, rope --------------------------------------------------------------- */

/* Row-wise ops run on the calling thread below this many values. */
#define ROWS_MIN_PARALLEL (1 << 14)

/* Values per chunk of the row-wise ops (rows of d values: at least one row, at most
 * ROWS_CHUNK_MAX): 32 KiB of f32, so that the shared counter a chunk costs (a cache
 * line the threads pass back and forth) stays small next to the chunk's work; prefill's
 * q/k norms and ropes have rows of 128 values. */
#define ROWS_CHUNK_VALUES 8192
#define ROWS_CHUNK_MAX 64

static int64_t rows_chunk(int64_t d) {
    int64_t c = d > 0 ? ROWS_CHUNK_VALUES / d : 1;
    return c < 1 ? 1 : c > ROWS_CHUNK_MAX ? ROWS_CHUNK_MAX : c;
}

/* Runs a row-wise op's thread function over rows of d values: on the calling thread
 * below ROWS_MIN_PARALLEL values (or one row), else over the pool. */
static void rows_run(struct cpu_pool *pool, int64_t rows, int64_t d, pool_fn fn, void *ctx) {
    if (rows * d < ROWS_MIN_PARALLEL || rows < 2)
        fn(ctx, 0, 1);
    else
        pool_run_shared(pool, fn, ctx);
}

struct rms_norm_ctx {
    const struct cpu_rms_norm *op;
    const struct cpu_isa_kernels *kern;
    _Atomic int64_t next_row;
};

static void rms_norm_thread(void *arg, int ith, int nth) {
    struct rms_norm_ctx *ctx = arg;
    const struct cpu_rms_norm *op = ctx->op;
    const int64_t chunk = nth == 1 ? op->rows : rows_chunk(op->d);
    int64_t r0;
    (void)ith;
    while ((r0 = atomic_fetch_add(&ctx->next_row, chunk)) < op->rows)
        for (int64_t r = r0; r < op->rows && r < r0 + chunk; r++)
            ctx->kern->rms_norm_row(op->x + r * op->d, op->w, op->eps, op->d, op->o + r * op->d);
}

void cpu_rms_norm_run(const struct cpu_rms_norm *op, const struct cpu_isa_kernels *kern,
                      struct cpu_pool *pool) {
    struct rms_norm_ctx ctx = {.op = op, .kern = kern};
    rows_run(pool, op->rows, op->d, rms_norm_thread, &ctx);
}

struct rope_ctx {
    const struct cpu_rope *op;
    const struct cpu_isa_kernels *kern;
    _Atomic int64_t next_row;
};

/* A walk over rows numbered in the mixed radix dims[0..rank) carrying two offsets, each
 * the sum of the row's digits times its own strides: a chunk of rows finds its first
 * row's offsets by division, then steps them row by row. */
struct row_walk {
    int rank;
    const int64_t *dims, *strides[2];
    int64_t idx[IR_MAX_RANK], off[2];
};

static void row_walk_at(struct row_walk *w, int64_t r) {
    w->off[0] = w->off[1] = 0;
    for (int i = w->rank - 1; i >= 0; i--) {
        w->idx[i] = r % w->dims[i];
        w->off[0] += w->idx[i] * w->strides[0][i];
        w->off[1] += w->idx[i] * w->strides[1][i];
        r /= w->dims[i];
    }
}

static void row_walk_next(struct row_walk *w) {
    for (int i = w->rank - 1; i >= 0; i--) {
        w->off[0] += w->strides[0][i];
        w->off[1] += w->strides[1][i];
        if (++w->idx[i] < w->dims[i]) return;
        w->off[0] -= w->idx[i] * w->strides[0][i];
        w->off[1] -= w->idx[i] * w->strides[1][i];
        w->idx[i] = 0;
    }
}

/* Rows are taken in chunks (all of them on one thread), walking the cos/sin offset and
 * (permuted x) the row's source offset. */
static void rope_thread(void *arg, int ith, int nth) {
    struct rope_ctx *ctx = arg;
    const struct cpu_rope *op = ctx->op;
    const int64_t chunk = nth == 1 ? op->rows : rows_chunk(op->d);
    struct row_walk w = {.rank = op->rank, .dims = op->dims, .strides = {op->strides, op->x_strides}};
    int64_t r0;
    (void)ith;
    while ((r0 = atomic_fetch_add(&ctx->next_row, chunk)) < op->rows) {
        row_walk_at(&w, r0);
        for (int64_t r = r0; r < op->rows && r < r0 + chunk; r++, row_walk_next(&w)) {
            const float *x = op->x + (op->x_permuted ? w.off[1] : r * op->d);
            float *o = op->o + r * op->d;
            if (op->norm_w) { /* normalized into o, then rotated in place (rope_row allows it) */
                ctx->kern->rms_norm_row(x, op->norm_w, op->eps, op->d, o);
                x = o;
            }
            ctx->kern->rope_row(x, op->cos_t + w.off[0], op->sin_t + w.off[0], op->d, o);
        }
    }
}

struct row_gather_ctx {
    const struct cpu_row_gather *op;
    _Atomic int64_t next_row;
};

static void row_gather_thread(void *arg, int ith, int nth) {
    struct row_gather_ctx *ctx = arg;
    const struct cpu_row_gather *op = ctx->op;
    const int64_t chunk = nth == 1 ? op->rows : rows_chunk(op->d);
    static const int64_t none[IR_MAX_RANK];
    struct row_walk w = {.rank = op->rank, .dims = op->dims, .strides = {op->x_strides, none}};
    int64_t r0;
    (void)ith;
    while ((r0 = atomic_fetch_add(&ctx->next_row, chunk)) < op->rows) {
        row_walk_at(&w, r0);
        for (int64_t r = r0; r < op->rows && r < r0 + chunk; r++, row_walk_next(&w))
            memcpy(op->o + r * op->d, op->x + w.off[0], (size_t)op->d * sizeof(float));
    }
}

void cpu_row_gather_run(const struct cpu_row_gather *op, struct cpu_pool *pool) {
    struct row_gather_ctx ctx = {.op = op};
    rows_run(pool, op->rows, op->d, row_gather_thread, &ctx);
}

void cpu_rope_run(const struct cpu_rope *op, const struct cpu_isa_kernels *kern,
                  struct cpu_pool *pool) {
    struct rope_ctx ctx = {.op = op, .kern = kern};
    rows_run(pool, op->rows, op->d, rope_thread, &ctx);
}
