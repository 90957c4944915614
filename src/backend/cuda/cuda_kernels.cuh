/* CUDA kernels of the backend, behind host-side launchers so that the backend and the
 * kernel lab (bench/cuda_kernels.cu) call the same code. Every launcher enqueues on
 * the given stream and returns cudaGetLastError() of its launch.
 *
 * Tensors are the IR's: contiguous row-major f32 (or i32) at device addresses; shapes
 * are passed as small structs by value. Semantics follow src/backend/cpu/ref_ops.c,
 * the oracle every kernel here is tested against (tests/unit/test_cuda.c). */
#ifndef LLMOPT_BACKEND_CUDA_CUDA_KERNELS_CUH
#define LLMOPT_BACKEND_CUDA_CUDA_KERNELS_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#define CU_MAX_RANK 6 /* == IR_MAX_RANK (static_assert in cuda_backend.cu) */

/* Weight dtypes, numbered as enum ir_dtype (checked in cuda_backend.cu). */
enum cu_dtype { CU_F32 = 0, CU_F16 = 1, CU_BF16 = 2, CU_Q8_0 = 3, CU_Q4_0 = 4, CU_Q4_K = 6, CU_Q5_K = 7, CU_Q6_K = 8 };
static inline bool cu_dtype_kquant(int t) { return t == CU_Q4_K || t == CU_Q5_K || t == CU_Q6_K; }
/* Types that are uploaded as blocks (matrices only) */
static inline bool cu_dtype_blocked(int t) { return t == CU_Q8_0 || t == CU_Q4_0 || cu_dtype_kquant(t); }

/* A weight matrix [rows, cols] on the device in its stored type. Block-quantized types
 * are split at upload into a quant array and a scale array (same bytes, GPU-friendly
 * order: every row of quants 16-byte aligned):
 *   q8_0: qs int8 [rows, cols]          scales f16 [rows, cols / 32]
 *   q4_0: qs u8 [rows, cols / 2] where byte (b*16 + i) of a row holds element b*32+i in
 *         its low nibble and b*32+16+i in its high nibble (GGUF's order within a block),
 *         scales f16 [rows, cols / 32]; element = (nibble - 8) * scale.
 * K-quants (format/quant_k.h, super-blocks of 256; every block 16-byte aligned):
 *   q4_k, q5_k: data = the GGUF blocks as stored (144 / 176 bytes), scales NULL;
 *   q6_k: data = 208-byte blocks (GGUF's ql 128, qh 64, scales 16), scales = the f16
 *         super-block scale d of each block [rows, cols / 256]. */
struct cu_weight {
    int dtype;              /* enum cu_dtype */
    int64_t rows, cols;
    const void *data;       /* f32/f16/bf16 elements, or the quants */
    const uint16_t *scales; /* block types: f16 bits (rows, cols / 32); NULL otherwise */
};

/* Byte sizes of the two parts of an uploaded weight. */
size_t cu_weight_data_bytes(int dtype, int64_t rows, int64_t cols);
size_t cu_weight_scale_bytes(int dtype, int64_t rows, int64_t cols);
/* Rearranges `rows` GGUF rows (block layout) into the upload layout: quants to qs
 * (rows * data_bytes/row), scales to sc. */
void cu_weight_repack_rows(int dtype, const void *src, int64_t rows, int64_t cols, void *qs,
                           uint16_t *sc);

/* Epilogue of linear: y = act(x W^T + bias) * gate + residual (each optional). act is
 * an IR unary op code or -1 for none. */
struct cu_epilogue {
    const float *bias;     /* (n_out) */
    const float *gate;     /* (rows, n_out) */
    const float *residual; /* (rows, n_out) */
    int act;               /* enum ir_op, or -1 */
    /* cu_matvec only (a prologue; K <= CU_MATVEC_NORM_MAX_K): when set, each x row is
     * first replaced by rms_norm(x) = x * (1 / sqrt(mean(x^2) + norm_eps)) * norm_w, as
     * cu_norm computes it, so the norm needs no kernel of its own */
    const float *norm_w;   /* (K) */
    float norm_eps;
};

/* q8_0 products of up to CU_MMA_MAX_ROWS rows on int8 tensor cores: x rows quantized
 * to int8 per 32 (the matvec's int8 x rule) into scratch (cu_linear_q8_mma_scratch
 * bytes; x_ready: scratch already holds this x, quantized by the previous call), then
 * y (rows, w->rows) = x W^T with ep applied as cu_linear_epilogue does (ep NULL: none;
 * no prologue). K % 32 == 0. Not supported (cudaErrorNotSupported) while
 * cu_matvec_q8_x forces f32 x, or where the matvec keeps f32 x (int8 x rows over 48 KiB). */
#define CU_MMA_MAX_ROWS 64
size_t cu_linear_q8_mma_scratch(int64_t rows, int64_t K);
cudaError_t cu_linear_q8_mma(cudaStream_t st, const struct cu_weight *w, const float *x, int64_t rows, float *y,
                             void *scratch, bool x_ready, const struct cu_epilogue *ep);

/* Matrix-vector product for few rows (decode): W read once, 16-byte loads, dequantized
 * in registers, two output rows per warp. Needs cu_matvec_ok(). rows <= CU_MATVEC_MAX_ROWS. */
#define CU_MATVEC_MAX_ROWS 8
#define CU_MATVEC_NORM_MAX_K 12288 /* the normalized row in 48 KB of shared memory */
/* Matvec kernels start as programmatic dependents of the kernel before them (their
 * first weight loads overlap its tail) unless $LLMOPT_CUDA_PDL=0. */
bool cu_pdl_enabled(void);
bool cu_matvec_ok(const struct cu_weight *w);
/* Launch shape of later one-row matvecs (f32/f16/bf16/q8_0/q4_0), process-wide, for
 * the kernel lab: output rows a warp nr (1, 2 or 4; a SwiGLU pair at most 2), 16-byte
 * weight loads in flight a lane lif (4, 8 or 16; bf16 and q8_0 only, others 4) and the
 * warps a launch aims at when it splits K (128..2^20). 0 or out of range: the default.
 * Until the first call: $LLMOPT_CUDA_MV_NR, $LLMOPT_CUDA_MV_LIF, $LLMOPT_CUDA_MV_WARPS. */
extern "C" void cu_matvec_tune(int nr, int lif, int64_t warps); /* C: tests/unit/test_cuda.c */
/* How one-row q8_0 matvecs read x, process-wide: 0 f32 (exact f32 arithmetic); 1 int8
 * wherever the row fits (K <= 43680); -1 (or out of range) the default: int8 for the
 * launches with the rms_norm prologue or a SwiGLU pair and for plain ones with K <=
 * 4096 below 16384 rows, f32 for the others (faster there in the kernel lab). int8 x:
 * the block first quantizes the row (after the prologue) into shared memory as q8_0
 * blocks of 32, as the CPU's q8_0 kernels quantize activations (f32 d = amax / 127, q
 * = nearbyint(x / d)), and takes dp4a products: x rounded to 8 bits, ~4e-3 relative;
 * int8 launches have their own default launch shape. Until the first call:
 * $LLMOPT_CUDA_Q8_X. */
extern "C" void cu_matvec_q8_x(int mode); /* C: tests/unit/test_cuda.c */
/* The rms_norm prologue of int8-x launches with K <= 4096 below 4 rows a warp: 1 (the default) the norm
 * weight loaded before the PDL wait and x once into registers, 0 two passes over x
 * (the same bits). Until the first call: $LLMOPT_CUDA_MV_XREGS. */
extern "C" void cu_matvec_x_regs(int on); /* C: tests/unit/test_cuda.c */
/* q8_0 products of 2..8 x rows with int8 x: 1 (the default) on int8 tensor cores
 * (mv_mma_kernel), 0 matvec_kernel's dp4a loop over the staged rows. Until the first
 * call: $LLMOPT_CUDA_Q8_MMA (which also switches cu_linear_q8_mma, 9-64 rows). */
extern "C" void cu_matvec_mma(int on); /* C: tests/unit/test_cuda.c */
/* Ring stages a warp in those tensor-core products: 2..4, 0 the default (4 for plain
 * products, 3 for SwiGLU pairs). Until the first call: $LLMOPT_CUDA_MMA_STAGES. */
extern "C" void cu_matvec_mma_stages(int stages); /* C: tests/unit/test_cuda.c */
/* Persistent one-row matvec launches (f32/f16/bf16/q8_0/q4_0), process-wide: a grid of
 * as many blocks as the device holds at once, each block taking every gridDim-th group
 * of rows, so the per-block prologue (rms_norm, x to int8) runs once a block, and K is
 * split only until the grid's warps have work (not for ~4096 warps). mode 1
 * every launch, 0 none, -1 (or out of range) the default: the launches with a
 * prologue; max_blocks > 0 caps the grid (tests), 0 leaves it at what fits. Until the
 * first call: $LLMOPT_CUDA_MV_PERSIST (the mode). */
extern "C" void cu_matvec_persist(int mode, int max_blocks); /* C: tests/unit/test_cuda.c */
cudaError_t cu_matvec(cudaStream_t st, const struct cu_weight *w, const float *x, int64_t rows,
                      float *y, const struct cu_epilogue *ep);
/* Several products of one x in one launch (decode: q/k/v, or a SwiGLU gate/up pair).
 * Each segment has its own weight (one dtype and K for all), output and epilogue; with
 * head_dim > 0 the output row r is written head-major, element j at
 * ((j / head_dim) * rows + r) * head_dim + j % head_dim: the [N, H, Dh] -> [H, N, Dh]
 * permute that usually follows a q/k/v projection. With `up` (then n_seg == 1) the
 * launch computes y = act(x W0^T + bias) * (x up^T) + residual: segment 0's gate
 * operand is replaced by that second product, streamed beside W0 (x read once). */
#define CU_MV_MAX_SEGS 3
struct cu_mv_seg {
    struct cu_weight w;
    float *y;
    struct cu_epilogue ep; /* norm_w only in segment 0 */
    int64_t head_dim;
};
cudaError_t cu_matvec_multi(cudaStream_t st, const float *x, int64_t rows, const struct cu_mv_seg *segs, int n_seg,
                            const struct cu_weight *up);
/* The staged one-row matvec (kernels_stream.cu): weights copied global -> shared memory
 * by Hopper bulk copies into a ring of stages (no registers hold bytes in flight, and
 * the ring fills before the PDL wait), bf16 (f32 x), q8_0 with int8 x (q8_int8: the x
 * mode allows it) and q4_K/q6_K (int8 x, cu_matvec_kq_multi's arithmetic; segments may
 * mix the two), for the one-row launches of cu_matvec_multi and cu_matvec_kq_multi. It
 * launches where it is chosen (cu_matvec_tma's mode, else $LLMOPT_CUDA_MV_TMA=0|1 read
 * once: 0 never, 1 wherever it applies; by default where it measured faster in the
 * models, kernels_stream.cu names them) and applies; else cudaErrorNotSupported with
 * nothing launched (not chosen, another dtype, K not a multiple of 8 (bf16), 256 (q8_0,
 * q4_K) or 2048 (q6_K), unaligned pointers). */
cudaError_t cu_matvec_stream(cudaStream_t st, const float *x, const struct cu_mv_seg *segs, int n_seg,
                             const struct cu_weight *up, bool q8_int8);
extern "C" void cu_matvec_tma(int mode); /* 0 off, 1 on, else the default; C: tests/unit/test_cuda.c */
/* The staged kernel's launch shape (kernel lab, tests; 0: the default; else, and unless
 * called, $LLMOPT_CUDA_MV_TMA_TUNE=rs,smem_kb,blocks_per_sm,wait,producers,row_copies
 * read once): rows a tile (1, 2, 4, 8; default the most that leave 4 stages), dynamic
 * shared memory a block in KiB (8..227; default 100), blocks an SM (1..4; default 2:
 * the best of the 8B q8_0 model A/B), the L2::evict_first hint on weight copies (1; default off), blocks
 * a launch at most (tests: many tiles a block; 0 no cap), how the ring's barriers are
 * waited on (0 try_wait, 1 test_wait spin, 2 try_wait with a suspend-time hint;
 * default 0), producer lanes (1, 2, 4; default 1), a bulk copy a row instead of one a
 * tile (1; default off). */
extern "C" void cu_matvec_tma_tune(int rows_per_tile, int smem_kb, int blocks_per_sm, int evict_first,
                                   int max_blocks, int wait, int producers, int row_copies);
/* The K-quant matvec behind cu_matvec (kernels_kquant.cu) with its knobs open for the
 * kernel lab: output rows per warp nr (0: the default; int8 mode on q4_K/q6_K: 1 or 2,
 * 4 taken as 2; otherwise 1, 2 or 4) and how x is read, xm: 0 f32 from global memory,
 * 1 f32 staged in shared memory, 2 int8 in shared memory with dp4a products (x rounded
 * to 8 bits per group of 32, q5_K per 16); < 0: the mode of cu_kq_set_x_mode, or 0
 * where x does not fit (64 KiB). q4_K/q6_K in mode 2 go through cu_matvec_kq_multi
 * (every x row, and the rms_norm prologue); elsewhere several x rows are f32 from
 * global memory and ep->norm_w must be NULL. */
cudaError_t cu_matvec_kq(cudaStream_t st, const struct cu_weight *w, const float *x, int64_t rows, float *y,
                         const struct cu_epilogue *ep, int nr, int xm);
/* cu_matvec_multi for q4_K/q6_K segments (the types may differ between segments; a
 * SwiGLU pair's two weights share one): x quantized to int8 per group of 32 in shared
 * memory (after the rms_norm prologue when segs[0].ep.norm_w is set), dp4a products,
 * persistent warps. nr: output rows a warp for one x row (1 or 2; 0: the default). */
cudaError_t cu_matvec_kq_multi(cudaStream_t st, const float *x, int64_t rows, const struct cu_mv_seg *segs, int n_seg,
                               const struct cu_weight *up, int nr);
/* Whether a decode fusion (or the rms_norm prologue) may put this weight into
 * cu_matvec_kq_multi: q4_K or q6_K, x of its K fits shared memory, int8 x mode on. */
bool cu_kq_multi_ok(const struct cu_weight *w);
/* cu_matvec_kq_multi's 2..8-row products on int8 tensor cores (kernels_linear.cu,
 * mv_mma_kernel: q4_K, q6_K, or q4_K and q6_K segments; K % 256, q6_K K % 1024; staged x
 * and rings within shared memory); cudaErrorNotSupported with nothing launched where it
 * does not apply or $LLMOPT_CUDA_KQ_MMA=0 / cu_matvec_kq_mma_on(0) turned it off. */
cudaError_t cu_matvec_kq_mma(cudaStream_t st, const float *x, int64_t rows, const struct cu_mv_seg *segs, int n_seg,
                             const struct cu_weight *up);
extern "C" void cu_matvec_kq_mma_on(int on); /* C: tests/unit/test_cuda.c */
/* Launch shape of later cu_matvec_kq_multi calls, process-wide (kernel lab, tests):
 * output rows a warp for one x row when the call's nr is 0 (1 or 2; else the default,
 * 2), the next item's loads in flight (1) or not (2; else the default: in flight
 * where K > 4096) and blocks an SM at most (1..16; else as many as fit). */
extern "C" void cu_kq_tune(int nr, int prefetch, int blocks_per_sm); /* C: tests/unit/test_cuda.c */
/* The x mode of later K-quant matvecs, process-wide (< 0 or out of range: the default,
 * 2); the backend sets it from $LLMOPT_CUDA_KQ_X when a session is prepared. */
void cu_kq_set_x_mode(int mode);
/* K-quant weight -> bf16 [rows, cols] (cu_weight_to_bf16 for those types). */
cudaError_t cu_kq_to_bf16(cudaStream_t st, const struct cu_weight *w, void *out);
/* GGUF q6_K blocks -> the upload layout: `blocks` 208-byte blocks to qs, their d to d. */
void cu_kq_repack_q6_k(const void *src, int64_t blocks, void *qs, uint16_t *d);
/* Any rows, any dtype: a tiled kernel that dequantizes a tile of W into shared memory. */
cudaError_t cu_linear_tiled(cudaStream_t st, const struct cu_weight *w, const float *x,
                            int64_t rows, float *y, const struct cu_epilogue *ep);
/* Applies the epilogue in place to y (rows, n_out) (after a cuBLAS product). */
cudaError_t cu_linear_epilogue(cudaStream_t st, float *y, int64_t rows, int64_t n_out,
                               const struct cu_epilogue *ep);
/* The epilogue applied to y, the result rounded to bf16 (to_bf16) or f16 into out
 * (any epilogue, none included): the next product's cuBLAS operand. */
cudaError_t cu_linear_epilogue_half(cudaStream_t st, const float *y, void *out, int64_t rows, int64_t n_out,
                                    const struct cu_epilogue *ep, bool to_bf16);
/* W (any dtype) -> bf16 [rows, cols]: block-quantized weights go through cuBLAS for
 * prefill this way (one pass over W, then a tensor-core product). */
cudaError_t cu_weight_to_bf16(cudaStream_t st, const struct cu_weight *w, void *out);
/* x f32 -> f16 (to_bf16 false) or bf16, n elements (cuBLAS operands). */
cudaError_t cu_convert_half(cudaStream_t st, const float *x, void *out, int64_t n, bool to_bf16);

/* out[t, :] = W[ids[t], :] dequantized; ids outside [0, rows) give zeros. */
cudaError_t cu_embedding(cudaStream_t st, const struct cu_weight *w, const int32_t *ids,
                         int64_t n_ids, float *out);

/* ---- elementwise, layout, reductions (kernels_misc.cu) ---- */

/* Output extent plus, for each input, its element strides over that extent (0 where
 * broadcast). */
struct cu_strided {
    int rank;
    int64_t dims[CU_MAX_RANK];
    int64_t sa[CU_MAX_RANK];
    int64_t sb[CU_MAX_RANK];
};
cudaError_t cu_unary(cudaStream_t st, int op, const float *x, float *o, int64_t n);
/* contiguous: both inputs have the output's extent (strides ignored). */
cudaError_t cu_binary(cudaStream_t st, int op, const float *a, const float *b, float *o,
                      const struct cu_strided *s, bool contiguous);
/* o = in[base + sum idx_d * sa[d]] over the output extent (permute, expand, slice). */
cudaError_t cu_strided_copy(cudaStream_t st, const float *in, int64_t base, float *o,
                            const struct cu_strided *s);
/* Concat piece: o[(a*len_out + at)*inner + r] = x[a*len*inner + r]. */
cudaError_t cu_concat_piece(cudaStream_t st, const float *x, float *o, int64_t outer, int64_t len,
                            int64_t len_out, int64_t at, int64_t inner);
/* kind 0: i32 -> f32; 1: f32 -> i32 (non-finite or out of range -> 0). */
cudaError_t cu_cast(cudaStream_t st, const void *x, void *o, int64_t n, int kind);
/* c/s[t, d] = cos/sin(freqs[d % half] * (float)pos[t]) for d < 2 * half: a step's rope
 * table (the models' cast -> matmul -> permute -> concat -> cos, sin) in one launch. */
cudaError_t cu_rope_table(cudaStream_t st, const float *freqs, const int32_t *pos, int64_t n_tok, int64_t half,
                          float *c, float *s);
/* o[a, j, :] = x[a, rows[j], :]; a row index out of [0, rows_in) gives zeros. */
cudaError_t cu_select_rows(cudaStream_t st, const float *x, const int32_t *rows, float *o,
                           int64_t outer, int64_t rows_in, int64_t m, int64_t d);

/* Reduction (op: IR_OP_MEAN/SUM/MAX): kept dims index the output (input strides),
 * reduced dims are walked in row-major order for each output (the reference's order). */
struct cu_reduce {
    int n_kept, n_red;
    int64_t kept_dims[CU_MAX_RANK], kept_strides[CU_MAX_RANK];
    int64_t red_dims[CU_MAX_RANK], red_strides[CU_MAX_RANK];
    int64_t out_numel, count;
    bool trailing; /* reduced dims are the contiguous tail: one block per output */
};
cudaError_t cu_reduce(cudaStream_t st, int op, const float *x, float *o, const struct cu_reduce *r);
cudaError_t cu_softmax(cudaStream_t st, const float *x, float *o, int64_t outer, int64_t len,
                       int64_t inner);
/* rms_norm (b NULL, layer false) or layer_norm over the last dim d. */
cudaError_t cu_norm(cudaStream_t st, const float *x, const float *w, const float *b, float *o,
                    int64_t rows, int64_t d, float eps, bool layer);
/* The same with the result rounded to bf16 (to_bf16) or f16: a cuBLAS operand. */
cudaError_t cu_norm_half(cudaStream_t st, const float *x, const float *w, const float *b, void *o, int64_t rows,
                         int64_t d, float eps, bool layer, bool to_bf16);
/* Split-half rotary embedding; cos/sin row offsets come from `rows` (the output extent
 * without its last dim, with cos/sin strides in sa). */
cudaError_t cu_rope(cudaStream_t st, const float *x, const float *c, const float *s, float *o,
                    int64_t n_rows, int64_t d, const struct cu_strided *rows);
/* Optional rms_norm, a permute that keeps the last axis, and rope, in one launch (a
 * warp per output row of d elements). For each of up to CU_NR_MAX_PARTS parts: output
 * row r (over `rows`, the rope output's extent without its last dim) reads source row
 * offset sb(r) of x (the permute's strides) and cos/sin at offset sa(r); with norm_w
 * the row is first replaced by x * (1 / sqrt(mean(x^2) + eps)) * norm_w, as cu_norm
 * computes it; then the split-half rotation of cu_rope. */
#define CU_NR_MAX_PARTS 3
struct cu_norm_rope_part {
    const float *x, *norm_w, *c, *s;
    float *o;
    float eps;
    int64_t n_rows;
    struct cu_strided rows;
};
cudaError_t cu_norm_rope(cudaStream_t st, const struct cu_norm_rope_part *parts, int n_parts, int64_t d);
/* Batched matmul with broadcast batch dims: batch extent in s (sa/sb in matrices). */
cudaError_t cu_matmul(cudaStream_t st, const float *a, const float *b, float *o, int64_t p,
                      int64_t k, int64_t q, const struct cu_strided *batch);

/* Greedy argmax of each row of x (rows, len): keys[r] = a 64-bit key whose index part
 * cu_argmax_key_index() reads (NaN as -inf, +inf as FLT_MAX, the lowest index wins
 * ties: the sampler's greedy rule). Clears keys first (a memset, then one kernel). */
cudaError_t cu_argmax_rows(cudaStream_t st, const float *x, int64_t rows, int64_t len, unsigned long long *keys);
int32_t cu_argmax_key_index(unsigned long long key);

/* The sampler's penalties of one row (backend_penalty, on the device): n pairs (id,
 * count) at pairs[row * pair_stride ..]. */
struct cu_penalty_row {
    float repeat, presence, frequency;
    int32_t n;
};
/* x (rows, len) in place: x[row][id] = sampler_penalize(x[row][id], count), same bits. */
cudaError_t cu_penalize_rows(cudaStream_t st, float *x, int64_t rows, int64_t len, const struct cu_penalty_row *hdr,
                             const int2 *pairs, int pair_stride);
/* The best k (a power of two, 2..256) entries of each row of x (rows, len) in rank
 * order (larger sanitized logit, then lower index): out[row * k + i] = the i-th's argmax
 * key (0: the row has fewer than i + 1 entries); cu_key_decode reads it. Radix selects
 * in blocks of 4096 entries, then one block a row over their best (scratch: rows *
 * cu_top_k_scratch(len, k) keys; unused for rows of up to 4096). */
int64_t cu_top_k_scratch(int64_t len, int k);
cudaError_t cu_top_k_rows(cudaStream_t st, const float *x, int64_t rows, int64_t len, int k,
                          unsigned long long *scratch, unsigned long long *out);
void cu_key_decode(unsigned long long key, int32_t *id, float *logit);
/* A whole-row draw's parameters (runtime/sampler.h sampler_device_full). */
struct cu_draw_row {
    float temperature, min_p;
    double u;
};
/* ids[row] = the id sampler_sample draws from row of x (rows, len) with top-k and top-p
 * off, params[row]'s temperature, min-p and uniform u, and keys[row] the row's argmax
 * key (cu_argmax_rows); -1 when nothing is finite. sums: rows * cu_draw_scratch(len)
 * doubles. */
int64_t cu_draw_scratch(int64_t len);
cudaError_t cu_draw_rows(cudaStream_t st, const float *x, int64_t rows, int64_t len, const unsigned long long *keys,
                         const struct cu_draw_row *params, double *sums, int32_t *ids);
/* cu_draw_rows' first half alone: sums[row * cu_draw_scratch(len) + b] = block b's kept
 * probabilities (params[row]: its temperature and min-p) summed in id order, the row's
 * largest key being keys[row * key_stride] (cu_argmax_rows' or cu_top_k_rows' first).
 * With min-p 0, the blocks' sums added in order are top-p's z (sampler_sample_nucleus). */
cudaError_t cu_draw_block_sums(cudaStream_t st, const float *x, int64_t rows, int64_t len,
                               const unsigned long long *keys, int key_stride, const struct cu_draw_row *params,
                               double *sums);

/* ---- attention over the paged KV cache (kernels_attention.cu) ---- */

struct cu_attention {
    const float *q, *k, *v; /* q [1, H, N, Dh]; k, v [1, Hkv, N, Dh] */
    float *out;             /* [1, N, H, Dh] */
    const int32_t *pos, *slot; /* (N) */
    const int32_t *block_table; /* (n_slots, max_blocks_per_slot) */
    void *k_cache, *v_cache;    /* this layer: (n_blocks * block_size, Hkv * Dh), f32, f16 or q8_0 */
    bool kv_f16;                /* the cache rows are f16 (rounded to nearest even on append) */
    bool kv_q8;                 /* ... q8_0: int8 values at the element's byte, an f16 scale a 32
                                 * at kv_scale_off bytes on (cu_attention_q8_ok head sizes) */
    int64_t kv_scale_off;
    int n_tok, n_heads, n_kv_heads, head_dim;
    int block_size, max_blocks_per_slot;
    float scale;
    int window;  /* 0: unlimited */
    int splits;  /* context splits per (token, head); > 1 needs part and counters */
    float *part; /* (N * H * splits, Dh + 2) partial results */
    unsigned *counters; /* (CU_ATT_COUNTERS) zeros before the launch, zeros after it */
    bool per_position;  /* batches <= 16 tokens: the block-per-position-chunk kernel even
                         * where the warp kernel applies (head dim % 4 == 0, <= 128) */
    bool tiled_f32;     /* prefill: the f32 tiled kernel even where the tensor-core one
                         * applies (head dim 64/96/128) */
    bool per_token;     /* no sequence has CU_ATT_TILED_MIN_TOKENS tokens in the batch (a
                         * server's decode step of many sequences): the per-token kernels
                         * whatever n_tok, since a tile of queries from many sequences
                         * walks each one's keys (172 us a 0.6B layer at 32 sequences
                         * of one token, against 11 us for 16 per token) */
    bool k_tok_major, v_tok_major; /* k / v given as [1, N, Hkv, Dh] (the source of a
                                    * permute that did not run) */
    /* One token through the warp kernel only (cu_attention_rope_ok): */
    /* pos, slot and the block table are step inputs, written before the step's kernels:
     * the cached K/V rows load before the PDL wait, under the kernel before */
    bool kv_before_wait;
    /* set: q and k are the [rms_norm ->] rope inputs ([H, Dh], [Hkv, Dh]); every block
     * normalizes (with q_norm_w / k_norm_w when set) and rotates its q row and the own
     * k row as cu_norm_rope does, with the position's cos/sin rows rope_c, rope_s (Dh),
     * and appends the rotated k row: the q/k norm+rope needs no launch of its own */
    const float *rope_c, *rope_s, *q_norm_w, *k_norm_w;
    float q_eps, k_eps;
    /* One token, head dim a multiple of 8 and <= 128 (cu_attention_dec_ok): dec_splits
     * > 0 takes the cluster kernel, the context split over that many blocks (2 to
     * CU_ATT_DEC_MAX_SPLITS: a portable cluster) of
     * dec_warps warps (1 to 8) for each (KV head, up to 4 of its query heads); part and
     * counters are not used. 0: the warp kernel with `splits`. */
    int dec_splits, dec_warps;
    /* The warp kernel's warps a block: 4 (16 positions a warp a round) or 8 (8 a warp);
     * 0: 8. The backend sets cu_attention_warps unless $LLMOPT_CUDA_ATT_WARPS says. */
    int warp_warps;
};
/* The cluster decode kernel's largest split (thread-block cluster) count. */
#define CU_ATT_DEC_MAX_SPLITS 8
bool cu_attention_dec_ok(const struct cu_attention *a);
/* Clusters of a's cluster decode launch that fit on the device at once (its launch
 * shape: dec_splits, dec_warps, the query heads a KV head), -1 where the query fails. */
int cu_attention_dec_clusters(const struct cu_attention *a);
/* Split attention launches have N * H < 264 (cu_attention_splits): counters enough. */
#define CU_ATT_COUNTERS 512
/* Splits that keep the device busy for n_tok tokens of n_heads heads over f16 (kv_f16)
 * or f32 cached rows; at most CU_ATT_MAX_SPLITS, and part needs
 * cu_attention_part_floats() floats. */
#define CU_ATT_MAX_SPLITS 32
int cu_attention_splits(int n_tok, int n_heads, int64_t max_ctx, bool kv_f16);
/* q8_0 cache rows are read by the warp, tiled and tensor-core kernels: head sizes a
 * multiple of 32 (whole blocks a head) up to 128. */
bool cu_attention_q8_ok(int head_dim);
/* The decode warp kernel's warps a block (cu_attention.warp_warps) for contexts of up to
 * max_ctx positions in `splits` splits: 4 where every split is at most one chunk of 64
 * positions (a warp's single round: 16 rows a warp, fewer blocks to merge), else 8
 * (more rows in flight a round). With the transposed score sums, at 640 positions the
 * 8B shapes decode faster at 4 (bf16 229.1 / 230.1 -> 230.9 / 231.2 tok/s, q8_0 353.5 ->
 * 357.8, q4_k_m 415.0 -> 422.2; the 0.6B even) and the lab at 4096 positions faster at
 * 8 (f16, 8B shape: 23.3 against 20.1 us): bench/results/cuda-attsum-2026-11-30.md. */
int cu_attention_warps(int64_t max_ctx, int splits);
int64_t cu_attention_part_floats(int n_tok, int n_heads, int head_dim, int splits);
/* Batches of at least this many tokens (head dim <= 128, a multiple of 4; not
 * per_token) take the tiled kernel: K/V chunks in shared memory for 16 queries at a
 * time (prefill). */
#define CU_ATT_TILED_MIN_TOKENS 17
bool cu_attention_tiled_ok(const struct cu_attention *a);
/* Prefill batches (as above) with head dim 64, 96 or 128 and at most 64 query heads a KV
 * head take the tensor-core kernel (bf16 operands, f32 sums) unless tiled_f32. */
bool cu_attention_mma_ok(const struct cu_attention *a);
/* Whether kv_before_wait and rope_c may be set: one token, the warp kernel. */
bool cu_attention_rope_ok(const struct cu_attention *a);
/* Appends K/V of every token to its sequence, then attends causally: for one token
 * (decode, head dim <= 512) a single launch. */
cudaError_t cu_attention(cudaStream_t st, const struct cu_attention *a);

/* short_conv (a depthwise causal convolution over each sequence, LFM2-style):
 * y[t, c] = sum_j w[c, j] * u(pos_t - (L-1) + j)[c], u(q) the sequence's input at q from
 * this batch or the conv state (0 for q < 0); then each sequence's last L-1 inputs go
 * to the state (row q % (L-1)). */
#define CU_SHORT_CONV_MAX_KERNEL 64
struct cu_short_conv {
    const float *x;            /* (N, C) */
    float *y;                  /* (N, C) */
    const int32_t *pos, *slot; /* (N) */
    struct cu_weight w;        /* the kernel flattened: element (c, j) at c * klen + j */
    float *state;              /* this layer: (n_slots, klen - 1, C) */
    int n_tok, channels, klen;
};
cudaError_t cu_short_conv(cudaStream_t st, const struct cu_short_conv *a);

#endif
