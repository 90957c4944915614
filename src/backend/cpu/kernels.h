/* Fast CPU kernels: linear (all weight types, with the IR's epilogue), attention over
 * the paged KV cache, rms_norm and rope, each split over a thread pool as (ith, nth).
 *
 * The instruction set is chosen at run time: every ISA (scalar, AVX2+FMA+F16C,
 * AVX-512 F/BW/VL + VNNI) fills one `struct cpu_isa_kernels` table of per-thread
 * building blocks, compiled in its own file with a target pragma, so the library runs
 * on any x86-64 and uses what the CPU has. The drivers here (kernels.c) do the work
 * split and the epilogues and are the same for every ISA.
 *
 * Weights keep their stored type and are dequantized in registers. For block-quantized
 * weights (Q8_0, Q4_0, and the K-quants etc. of cpu_kq_kernels) the activations are quantized once per op to int8 blocks of 32 (a scale per
 * block) and multiplied with integer dot products. The scalar reference kernels in
 * ref_ops.c are the oracle every kernel here is tested against. */
#ifndef LLMOPT_BACKEND_CPU_KERNELS_H
#define LLMOPT_BACKEND_CPU_KERNELS_H

#include "backend/cpu/pool.h"
#include "backend/kv_cache.h"
#include "ir/ir.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum cpu_isa {
    CPU_ISA_SCALAR,
    CPU_ISA_AVX2,   /* AVX2 + FMA + F16C */
    CPU_ISA_AVX512, /* AVX-512 F/BW/VL + VNNI, and AVX2 + FMA + F16C */
    CPU_ISA_COUNT
};
const char *cpu_isa_name(enum cpu_isa isa);
/* This CPU (and OS) can run kernels of isa. */
bool cpu_isa_available(enum cpu_isa isa);
/* The best available ISA, capped by $LLMOPT_CPU_ISA (scalar, avx2, avx512) if set. */
enum cpu_isa cpu_isa_best(void);

/* A linear's output tile: CPU_TILE_R activation rows x CPU_TILE_C weight rows. */
#define CPU_TILE_R 4
#define CPU_TILE_C 4
/* Activation quantization block (block-quantized weights). */
#define CPU_QBLOCK 32

/* Activations quantized to int8 blocks of CPU_QBLOCK: x[i] ~= qs[i] * d[i / 32], with
 * |qs| <= 127. Integer dot kernels bias the weights to unsigned bytes (w + 128) for
 * vpdpbusd and start their accumulators at -128 * sum(x) to remove the bias exactly:
 * corr holds that for each 4 consecutive quants, bsum for each block. */
struct cpu_qact {
    int64_t k;     /* values per row, a multiple of CPU_QBLOCK */
    int8_t *qs;    /* (rows, k) */
    float *d;      /* (rows, k / 32) */
    int32_t *corr; /* (rows, k / 4) */
    int32_t *bsum; /* (rows, k / 32) */
};
/* Fills row r's block sums from its quad sums (the last step of every quantizer). */
static inline void cpu_qact_sum_blocks(const struct cpu_qact *qa, int64_t r) {
    const int32_t *corr = qa->corr + r * (qa->k / 4);
    int32_t *bsum = qa->bsum + r * (qa->k / CPU_QBLOCK);
    for (int64_t b = 0; b < qa->k / CPU_QBLOCK; b++) {
        int32_t s = 0;
        for (int j = 0; j < CPU_QBLOCK / 4; j++) s += corr[b * (CPU_QBLOCK / 4) + j];
        bsum[b] = s;
    }
}
/* Bytes of scratch cpu_qact_bind needs for rows x k. */
size_t cpu_qact_bytes(int64_t rows, int64_t k);
/* Lays out a cpu_qact for rows x k in buf (64-byte aligned, cpu_qact_bytes long). */
void cpu_qact_bind(struct cpu_qact *qa, void *buf, int64_t rows, int64_t k);

/* y = act(x W^T + bias) * gate + residual (the reference run_linear's epilogue). */
struct cpu_linear {
    const float *x;        /* (rows, k) */
    int64_t rows, k, n_out;
    const void *w;         /* (n_out, k) of wtype */
    enum ir_dtype wtype;   /* any type cpu_linear_supports takes */
    const float *bias;     /* (n_out) or NULL */
    const float *gate;     /* (rows, n_out) or NULL */
    const float *residual; /* (rows, n_out) or NULL; may alias y */
    enum ir_op act;        /* unary op, or IR_OP_INPUT for none */
    float *y;              /* (rows, n_out) */
    void *scratch;         /* cpu_linear_scratch_bytes(...) bytes, or NULL when that is 0 */
    const void *packed;    /* w's GEMM panels from cpu_linear_pack, or NULL: packed per run */
};

/* Attention for a batch: K/V already appended; every token attends to positions
 * [max(0, pos - window + 1), pos] of its sequence (one pass, online softmax). */
struct cpu_attention {
    const float *q;      /* (n_heads, n_tok, head_dim) */
    float *out;          /* (n_tok, n_heads, head_dim) */
    const int32_t *pos;  /* (n_tok) */
    const int32_t *slot; /* (n_tok) */
    int64_t n_heads, n_kv_heads, n_tok, head_dim;
    float scale;
    int64_t window; /* 0: unlimited */
    int32_t layer;
    const struct kv_cache *kv;
    float *scratch; /* cpu_attention_scratch_floats(...) per pool thread */
    int64_t scratch_per_thread;
};
/* The first position a query at position p attends to: p + 1 - window with a window
 * (0: unlimited), never below 0. */
static inline int32_t cpu_attention_first(int64_t window, int32_t p) {
    return window > 0 && p + 1 > window ? p + 1 - (int32_t)window : 0;
}
/* Query tokens one attention work item takes together (their K/V reads are shared). */
#define CPU_ATT_QBLOCK 16
/* Positions per online-softmax step of the single-token (decode) attention kernel. */
#define CPU_ATT_DEC_CHUNK 128
/* A single token with at least CPU_ATT_SEG_MIN positions (heads larger than
 * attention_heads takes) splits them into npos / CPU_ATT_SEG_POS segments,
 * at most CPU_ATT_SEGS_MAX, fixed by npos alone (so the result does not depend on the
 * thread count): threads take consecutive segments, and their states merge in order. */
#define CPU_ATT_SEG_MIN 256
#define CPU_ATT_SEG_POS 128
#define CPU_ATT_SEGS_MAX 16
/* The prefill attention kernel (a block of CPU_ATT_QBLOCK tokens as two small GEMMs):
 * positions per online-softmax step, and the multiple its query count is padded to. */
#define CPU_ATT_PF_CHUNK 32
#define CPU_ATT_PF_QPAD 32
/* Scratch floats one thread needs for attention with these head counts / size. */
int64_t cpu_attention_scratch_floats(int64_t n_heads, int64_t n_kv_heads, int64_t head_dim);

/* Rotary embedding, split halves: o = x * cos + rotate_half(x) * sin per row of d.
 * cos/sin broadcast over every dim but the last: row r (written in the mixed radix
 * dims[0..rank)) reads them at offset sum(digit_i * strides[i]), stride 0 where they
 * broadcast. Optionally (a fused [rms_norm ->] permute -> rope chain) x rows are read
 * through a permutation and rms-normalized first, with the same row kernels and order
 * as cpu_rms_norm_run then a permute then cpu_rope_run, so the same bits. */
struct cpu_rope {
    const float *x;      /* (rows, d), or read through x_strides */
    float *o;            /* (rows, d) */
    const float *cos_t;  /* row r reads (d) values at the offset above */
    const float *sin_t;
    int64_t rows, d;
    int rank;
    int64_t dims[IR_MAX_RANK];
    int64_t strides[IR_MAX_RANK];
    /* x_permuted: row r reads x at sum(digit_i * x_strides[i]) instead of r * d */
    bool x_permuted;
    int64_t x_strides[IR_MAX_RANK];
    const float *norm_w; /* (d): rms_norm each row with it and eps first; NULL: none */
    float eps;
};

/* o = rows of d values gathered from x: row r (written in the mixed radix dims[0..rank))
 * from x + sum(digit_i * x_strides[i]) (a permute that keeps the last axis). */
struct cpu_row_gather {
    const float *x;
    float *o; /* (rows, d) */
    int64_t rows, d;
    int rank;
    int64_t dims[IR_MAX_RANK];
    int64_t x_strides[IR_MAX_RANK];
};

struct cpu_rms_norm {
    const float *x; /* (rows, d) */
    const float *w; /* (d) */
    float *o;       /* (rows, d) */
    int64_t rows, d;
    float eps;
};

/* ---- Per-ISA building blocks (one table per ISA) ---------------------------------- */

/* Prefill GEMM: CPU_GEMM_NC weight rows are packed once per op into a panel laid out
 * for outer-product micro-kernels, then every activation row passes over the panel. */
#define CPU_GEMM_NC 64

/* out[r * CPU_TILE_C + c] = dot(x row r, w row c) for r < nr, c < nc (1..4 each).
 * x rows are ldx floats apart, w rows ldw bytes apart; k values each. */
typedef void (*cpu_tile_f_fn)(const float *x, int64_t ldx, const uint8_t *w, size_t ldw,
                              int64_t k, int nr, int nc, float *out);
/* The same over quantized activation rows r0.. of qa and block-quantized weights. */
typedef void (*cpu_tile_q_fn)(const struct cpu_qact *qa, int64_t r0, const uint8_t *w,
                              size_t ldw, int nr, int nc, float *out);

/* Weight types with llama.cpp's other block layouts, Q4_K, Q5_K, Q6_K (super-blocks
 * of 256 with per-sub-block scales), Q5_0 and IQ4_XS: tiles over the quantized
 * activations and a prefill GEMM, one table per ISA (kquant_*.c, isa_kquant_*.c). */
struct cpu_kq_kernels {
    cpu_tile_q_fn tile_q4_k, tile_q5_k, tile_q6_k, tile_q5_0, tile_iq4_xs;
    /* Prefill GEMM over these types (the contract of cpu_isa_kernels' gemm_* below,
     * activations always from qa); gemm_tile NULL where the ISA has none. */
    size_t (*gemm_panel_bytes)(enum ir_dtype t, int64_t k);
    void (*gemm_pack)(enum ir_dtype t, const uint8_t *w, size_t ldw, int64_t k, int nc, void *panel);
    void (*gemm_tile)(enum ir_dtype t, const void *panel, const float *x, const struct cpu_qact *qa,
                      int64_t r0, int64_t k, int nr, float *out);
    int (*gemm_rows)(enum ir_dtype t);
};
/* t is one of cpu_kq_kernels' types. */
bool cpu_dtype_is_kq(enum ir_dtype t);

struct cpu_isa_kernels {
    enum cpu_isa isa;
    cpu_tile_f_fn tile_f32, tile_f16, tile_bf16;
    cpu_tile_q_fn tile_q8_0, tile_q4_0;
    /* Row r of qa from k floats (k a multiple of 32). Every ISA produces the same
     * quants: scale amax / 127, round to nearest even. */
    void (*quantize_row)(const float *x, const struct cpu_qact *qa, int64_t r);
    void (*rms_norm_row)(const float *x, const float *w, float eps, int64_t d, float *o);
    /* o = x * c + rotate_half(x) * s over one row of d (d even); o may be x (each pair
     * of values is loaded before it is stored). */
    void (*rope_row)(const float *x, const float *c, const float *s, int64_t d, float *o);
    /* Tokens t0..t1-1 (one sequence, consecutive positions, at most
     * CPU_ATT_QBLOCK), KV head kvh: the n_heads / n_kv_heads query heads that read it. */
    void (*attention_block)(const struct cpu_attention *a, int64_t t0, int64_t t1, int64_t kvh,
                            float *scratch);
    /* Token t, a run of one (decode), every head at once: cheaper than attention_block
     * per KV head where heads are one vector or less (stories260K: head_dim 8). Only
     * for the shapes attention_heads_ok accepts. */
    bool (*attention_heads_ok)(const struct cpu_attention *a);
    void (*attention_heads)(const struct cpu_attention *a, int64_t t, float *scratch);
    /* Token t, positions [j_begin, j_end), every head: the
     * unnormalised softmax state (acc (n_heads, head_dim), max (n_heads), sum (n_heads))
     * into part; attention_merge combines such states of consecutive segments, in
     * order, into t's output. For long single-token contexts (cpu_attention_run). */
    void (*attention_decode_seg)(const struct cpu_attention *a, int64_t t, int32_t j_begin, int32_t j_end,
                                 float *part, float *scratch);
    void (*attention_merge)(const struct cpu_attention *a, int64_t t, const float *const *parts, int n);
    /* n f16 values at dst from src, rounded to nearest even (fp16_from_f32's values). */
    void (*store_f16)(const float *src, uint8_t *dst, int64_t n);
    /* dst[i] = exp(src[i]) (the vector exp attention uses). */
    void (*exp_row)(const float *src, float *dst, int64_t n);
    /* y = act(x + bias) * gate + residual over n values (one row of a linear's output
     * tile); bias / gate / residual may be NULL, act IR_OP_INPUT for none. */
    void (*epilogue_row)(const float *x, int64_t n, const float *bias, enum ir_op act,
                         const float *gate, const float *residual, float *y);
    /* Prefill GEMM, NULL where the ISA has none (the tiles above serve all rows then).
     * gemm_pack: nc <= CPU_GEMM_NC weight rows (ldw bytes apart) of type t into panel
     * (gemm_panel_bytes, 64-byte aligned). gemm_tile: out[r * CPU_GEMM_NC + c] = dot of
     * activation row r0 + r with packed column c, r < nr <= gemm_rows(t); the rows come
     * from x (F32/F16/BF16 weights) or qa (Q8_0/Q4_0). */
    size_t (*gemm_panel_bytes)(enum ir_dtype t, int64_t k);
    void (*gemm_pack)(enum ir_dtype t, const uint8_t *w, size_t ldw, int64_t k, int nc, void *panel);
    void (*gemm_tile)(enum ir_dtype t, const void *panel, const float *x, const struct cpu_qact *qa,
                      int64_t r0, int64_t k, int nr, float *out);
    int (*gemm_rows)(enum ir_dtype t);
    bool (*gemm_supports)(enum ir_dtype t);
    const struct cpu_kq_kernels *kq;
};

/* The table for isa, or NULL when this build or CPU lacks it. */
const struct cpu_isa_kernels *cpu_isa_kernels_get(enum cpu_isa isa);

/* ---- Drivers: split over the pool (NULL pool: the calling thread alone) ---------- */

/* Activation rows from which linears use the ISA's packed GEMM; 0 (the default): by
 * weight type. The kernel lab varies it. */
extern int cpu_gemm_min_rows;
/* cpu_linear_run takes weights of type t with rows of k values: F32/F16/BF16 any k,
 * the block types whole blocks (k a multiple of 32 for Q8_0/Q4_0/Q5_0, of 256 for the
 * K types and IQ4_XS). */
bool cpu_linear_supports(enum ir_dtype t, int64_t k);
/* The dot-product path gives each thread a contiguous column range (false, the
 * default) or lets all threads take chunks from one (true; the kernel lab compares). */
extern bool cpu_linear_one_range;
/* Scratch a linear of weight type t over rows x k needs on n_threads threads. */
size_t cpu_linear_scratch_bytes(const struct cpu_isa_kernels *kern, enum ir_dtype t, int64_t rows,
                                int64_t k, int n_threads);

/* Bytes of w's GEMM panels (every CPU_GEMM_NC columns, each 64-byte aligned) where the
 * ISA has a GEMM for t, else 0. Packed once (cpu_linear_pack into 64-byte aligned
 * memory) and passed as cpu_linear.packed, the panels spare every run the packing, and
 * a linear of float weights takes the GEMM at every row count. */
size_t cpu_linear_packed_bytes(const struct cpu_isa_kernels *kern, enum ir_dtype t, int64_t k, int64_t n_out);
void cpu_linear_pack(const struct cpu_isa_kernels *kern, enum ir_dtype t, const void *w, int64_t k, int64_t n_out,
                     void *packed);
void cpu_linear_run(const struct cpu_linear *op, const struct cpu_isa_kernels *kern,
                    struct cpu_pool *pool);
/* Decode tokens (runs of one) take the ISA's all-heads kernel where it has the shape
 * (true, the default); false keeps the per-KV-head kernels (tests and the kernel lab
 * compare). */
extern bool cpu_attention_heads;
void cpu_attention_run(const struct cpu_attention *op, const struct cpu_isa_kernels *kern,
                       struct cpu_pool *pool);
void cpu_rms_norm_run(const struct cpu_rms_norm *op, const struct cpu_isa_kernels *kern,
                      struct cpu_pool *pool);
void cpu_rope_run(const struct cpu_rope *op, const struct cpu_isa_kernels *kern,
                  struct cpu_pool *pool);
void cpu_row_gather_run(const struct cpu_row_gather *op, struct cpu_pool *pool);

#endif
