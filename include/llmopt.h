/* llmopt public C API: load a model, tokenize, run sessions, generate.
 * Tools and the server use only this header. */
#ifndef LLMOPT_H
#define LLMOPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

enum llmopt_status {
    LLMOPT_OK = 0,
    LLMOPT_ERR_IO,          /* open/read/mmap failed */
    LLMOPT_ERR_FORMAT,      /* input file or data is malformed */
    LLMOPT_ERR_UNSUPPORTED, /* valid but not supported (type, op, version) */
    LLMOPT_ERR_NOMEM,       /* allocation failed */
    LLMOPT_ERR_INVALID_ARG, /* caller passed a bad argument */
    LLMOPT_ERR_BIND,        /* program parameters do not bind to the weights */
    LLMOPT_ERR_LIMIT,       /* a size cap or capacity was exceeded */
    LLMOPT_STATUS_COUNT
};

/* Error detail: the status and a message naming what was wrong. */
struct llmopt_err {
    enum llmopt_status status;
    char msg[1024];
};

const char *llmopt_status_str(enum llmopt_status status);

/* ---- Models ------------------------------------------------------------------
 * A model is a weights file bound to the stock program whose parameters match its
 * tensors (by names and shapes, never by the architecture string), imported and
 * verified. Loading computes nothing. */
struct llmopt_model;

struct llmopt_load_opts {
    const char *programs_dir; /* NULL: $LLMOPT_PROGRAMS, else the programs/ of this build */
    bool verbose;             /* print which program bound and why to stderr */
    bool vocab_only;          /* load only the tokenizer (works on vocab-only GGUFs) */
    bool no_passes;           /* run the graph as imported: no canonicalization/fusion */
};

/* What the compiler's passes did to the imported graph. */
struct llmopt_compile_stats {
    int32_t nodes_imported, nodes_compiled;
    int32_t kernels_imported, kernels_compiled; /* kernels one forward runs */
};

enum llmopt_status llmopt_model_load(const char *path, const struct llmopt_load_opts *opts,
                                     struct llmopt_model **out, struct llmopt_err *err);
void llmopt_model_free(struct llmopt_model *m);

const char *llmopt_model_program(const struct llmopt_model *m); /* "llama" */
int32_t llmopt_model_n_vocab(const struct llmopt_model *m);
int32_t llmopt_model_ctx_train(const struct llmopt_model *m);   /* positions it was trained for */
/* Threads a CPU session with n_threads 0 runs its kernels on: every CPU this process may
 * use, at most one per 16 MiB of weights read per token (tiny models: 1). */
int32_t llmopt_model_cpu_threads(const struct llmopt_model *m);
/* Prints a GGUF file's metadata and tensor table (llmopt inspect). */
enum llmopt_status llmopt_inspect_gguf(const char *path, FILE *out, struct llmopt_err *err);
void llmopt_model_compile_stats(const struct llmopt_model *m, struct llmopt_compile_stats *out);
/* Prints the imported IR (llmopt compile --dump-ir). */
void llmopt_model_dump_ir(const struct llmopt_model *m, FILE *out);

/* ---- Model Programs ---------------------------------------------------------------
 * `llmopt compile` writes ENGINE_DIR/model.llmopt (docs/formats/model-program.md): the
 * compiled graph with its kernels and memory plan, weights file references with
 * checksums, tokenizer and generation facts, state layout and target. Passing
 * ENGINE_DIR (or the .llmopt file) to llmopt_model_load loads it without passes. */
/* Element type of the KV cache (docs/kv-cache.md). f16 halves the bytes of f32;
 * q8_0 (blocks of 32 int8 with an f16 scale, head size a multiple of 32) takes
 * 34/64 = 0.53x of f32. */
enum llmopt_kv_type {
    LLMOPT_KV_DEFAULT, /* a Model Program's recorded type, else f16 */
    LLMOPT_KV_F32,
    LLMOPT_KV_F16,
    LLMOPT_KV_Q8_0,
    LLMOPT_KV_TYPE_COUNT
};
/* "default", "f32", "f16", "q8_0". */
const char *llmopt_kv_type_name(enum llmopt_kv_type t);
/* The type named s ("f32", "f16" or "q8_0"); false for anything else. */
bool llmopt_kv_type_parse(const char *s, enum llmopt_kv_type *out);

struct llmopt_program_opts {
    int32_t n_batch;          /* tokens per forward the plan is for; 0: 256 */
    const char *profile_path; /* target profile from `llmopt probe`, or NULL */
    enum llmopt_kv_type kv_type; /* recorded in state_layout.kv_dtype; DEFAULT: f16 */
};
/* m must have been loaded from weights_path (a GGUF). */
enum llmopt_status llmopt_program_write(const struct llmopt_model *m, const char *weights_path,
                                        const struct llmopt_program_opts *opts,
                                        const char *out_path, struct llmopt_err *err);
/* Full validation (whole-file weight checksum, plan, state layout, tokenizer ids). */
enum llmopt_status llmopt_program_check(const char *path, struct llmopt_err *err);
/* Weight bytes one decoded token reads (whole matrices, one embedding row). */
uint64_t llmopt_model_weight_bytes_per_token(const struct llmopt_model *m);
/* Bytes of the memory plan (arena) and of all intermediates without reuse. */
void llmopt_model_plan_bytes(const struct llmopt_model *m, int32_t n_batch, size_t *arena,
                             size_t *naive);

/* ---- Tokenizer ------------------------------------------------------------------
 * SentencePiece BPE (Llama 2 family) or byte-level BPE (GPT-2, Llama 3, Qwen), from a
 * GGUF or, with vocab_only, also from a Hugging Face tokenizer directory
 * (tokenizer.json, or vocab.json + merges.txt, + tokenizer_config.json) or a
 * SentencePiece tokenizer.model. */
int32_t llmopt_token_bos(const struct llmopt_model *m); /* -1 when none */
int32_t llmopt_token_eos(const struct llmopt_model *m);
/* End of generation: eos, eot/eom, the eos of HF configs, and control tokens spelled
 * as a well-known end of turn (<|im_end|>, <|eot_id|>, <end_of_turn>, <|endoftext|>,
 * ...; the full rule is in src/tokenizer/tokenizer.h). */
bool llmopt_token_is_eog(const struct llmopt_model *m, int32_t id);
/* All end-of-generation ids, ascending; returns how many (*ids valid with m). */
int llmopt_token_eog_ids(const struct llmopt_model *m, const int32_t **ids);
bool llmopt_add_bos_default(const struct llmopt_model *m);
/* Encodes text. parse_special: control tokens written in the text (<|im_start|>,
 * <s>, <|eot_id|>) become their ids, as a rendered chat template needs; false keeps
 * them plain text (untrusted user content). User-defined added tokens (<think>) are
 * always recognised. LLMOPT_ERR_LIMIT with *n_ids = the count needed when cap is too
 * small. */
enum llmopt_status llmopt_tokenize_ex(const struct llmopt_model *m, const char *text, size_t len,
                                      bool add_bos, bool parse_special, int32_t *ids, size_t cap,
                                      size_t *n_ids, struct llmopt_err *err);
/* llmopt_tokenize_ex with parse_special = true (llama.cpp's default for prompts). */
enum llmopt_status llmopt_tokenize(const struct llmopt_model *m, const char *text, size_t len,
                                   bool add_bos, int32_t *ids, size_t cap, size_t *n_ids,
                                   struct llmopt_err *err);

/* Streaming detokenizer state: emits only whole UTF-8 code points. */
struct llmopt_detok;
enum llmopt_status llmopt_detok_create(const struct llmopt_model *m, struct llmopt_detok **out,
                                       struct llmopt_err *err);
/* Returns a NUL-terminated chunk (possibly empty) valid until the next call. */
const char *llmopt_detok_push(struct llmopt_detok *d, int32_t id);
const char *llmopt_detok_flush(struct llmopt_detok *d);
void llmopt_detok_free(struct llmopt_detok *d);

/* ---- Chat templates ---------------------------------------------------------------
 * The model's own Jinja2 chat template (GGUF `tokenizer.chat_template`, or
 * `chat_template` of a directory's tokenizer_config.json), interpreted in C. */
struct llmopt_chat_template;
/* path: a GGUF file, or a directory holding tokenizer_config.json. */
enum llmopt_status llmopt_chat_template_load(const char *path, struct llmopt_chat_template **out,
                                             struct llmopt_err *err);
/* Template text given directly (e.g. --chat-template FILE); bos/eos may be NULL. */
enum llmopt_status llmopt_chat_template_from_text(const char *text, size_t len,
                                                  const char *bos_token, const char *eos_token,
                                                  struct llmopt_chat_template **out,
                                                  struct llmopt_err *err);
/* Renders messages (a JSON array of {"role", "content", ...} objects, OpenAI style).
 * extra_json: NULL or a JSON object whose members join the template context (e.g.
 * "tools", "enable_thinking"). *out is NUL-terminated; release it with free(). */
enum llmopt_status llmopt_chat_template_render(const struct llmopt_chat_template *t,
                                               const char *messages_json, size_t len,
                                               bool add_generation_prompt,
                                               const char *extra_json, char **out,
                                               size_t *out_len, struct llmopt_err *err);
void llmopt_chat_template_free(struct llmopt_chat_template *t);

/* ---- Sessions ------------------------------------------------------------------
 * A session owns the KV cache (paged, shared by n_slots sequences) and the backend's
 * compiled plan. Every forward is a token batch (DESIGN decision 1). */
struct llmopt_session;

struct llmopt_session_opts {
    int32_t n_ctx;   /* positions per sequence; 0: the model's training context, capped at 4096 */
    int32_t n_batch; /* max tokens per forward (prompt chunk); 0: 256 */
    int32_t n_slots; /* sequences at once; 0: 1 */
    int32_t n_threads; /* CPU threads for kernels; 0: every CPU this process may use, at most
                        * one per 16 MiB of weights read per token (tiny models: 1) */
    const char *backend; /* "cpu" (NULL or "": the default), "cpu-ref" or "cuda" */
    /* KV cache element type (q8_0: head sizes a multiple of 32; on CUDA also at most
     * 128: docs/kv-cache.md). */
    enum llmopt_kv_type kv_type;
    /* Keep the KV blocks of token prefixes that sequences computed, for later sequences
     * that begin the same way (llmopt_session_prefix_attach). Ignored for models with
     * state that is not per position (short_conv layers). */
    bool prefix_cache;
};

enum llmopt_status llmopt_session_create(const struct llmopt_model *m,
                                         const struct llmopt_session_opts *opts,
                                         struct llmopt_session **out, struct llmopt_err *err);
void llmopt_session_free(struct llmopt_session *s);

/* One forward over n tokens. Each token appends to its slot's sequence: positions[t]
 * must continue that sequence (no gaps). Returns logits (n_out, n_vocab) for the rows
 * out_rows, valid until the next call. */
enum llmopt_status llmopt_session_forward(struct llmopt_session *s, int32_t n,
                                          const int32_t *tokens, const int32_t *positions,
                                          const int32_t *slots, int32_t n_out,
                                          const int32_t *out_rows, const float **logits,
                                          struct llmopt_err *err);
/* Appends tokens to one slot's sequence, chunked by n_batch; returns the last token's
 * logits (n_vocab). */
enum llmopt_status llmopt_session_append(struct llmopt_session *s, int32_t slot,
                                         const int32_t *tokens, int32_t n, const float **logits,
                                         struct llmopt_err *err);
/* Like llmopt_session_append, but returns only the greedy next token: the argmax of the
 * last token's logits (NaN counts as -inf, the lowest id wins ties: the greedy
 * sampler's choice without penalties). Backends that can (cuda) pick it on the device
 * and copy back only the id; the others run append and scan the logits. */
enum llmopt_status llmopt_session_append_greedy(struct llmopt_session *s, int32_t slot,
                                                const int32_t *tokens, int32_t n, int32_t *next_id,
                                                struct llmopt_err *err);
/* Sampling where the logits are. Like llmopt_session_forward, but output row j is
 * sampled by samplers[j] with histories[j] (n_history[j] ids: its sequence so far,
 * prompt then generated, for the penalties; may be NULL when 0) and only the ids come
 * back: ids[j] is the id llmopt_sampler_sample would draw from row j's logits, with
 * the same sampler state afterwards. Backends that can (cuda) apply the penalties (at
 * most 512 distinct ids in a row's window) on the device and, when every row is greedy
 * or has 1 <= top_k <= 256, pick the best candidates there and copy back those alone
 * (the draw runs on the host on the same bits; greedy without penalties: the id), or,
 * when every row draws from the whole vocabulary (top-k and top-p off, as the OpenAI
 * API's defaults), draw on the device with the host's arithmetic and copy back the id.
 * Otherwise, and for vocabularies under 16384 ids (where copying the row back is
 * cheaper), the logits come back and each row is sampled whole.
 * $LLMOPT_DEVICE_SAMPLING=0|1 at session creation: never / always on the device. */
struct llmopt_sampler;
enum llmopt_status llmopt_session_forward_sample(struct llmopt_session *s, int32_t n, const int32_t *tokens,
                                                 const int32_t *positions, const int32_t *slots, int32_t n_out,
                                                 const int32_t *out_rows, struct llmopt_sampler *const *samplers,
                                                 const int32_t *const *histories, const size_t *n_history,
                                                 int32_t *ids, struct llmopt_err *err);
/* llmopt_session_append, then the last token's next id drawn by sampler as
 * llmopt_session_forward_sample does (history: the sequence including tokens). */
enum llmopt_status llmopt_session_append_sample(struct llmopt_session *s, int32_t slot, const int32_t *tokens,
                                                int32_t n, struct llmopt_sampler *sampler, const int32_t *history,
                                                size_t n_history, int32_t *next_id, struct llmopt_err *err);
int32_t llmopt_session_seq_len(const struct llmopt_session *s, int32_t slot);
void llmopt_session_reset(struct llmopt_session *s, int32_t slot);
int32_t llmopt_session_kv_blocks_in_use(const struct llmopt_session *s);
/* Prefix reuse (opts.prefix_cache), in whole KV blocks (16 positions each).
 * attach: an empty slot takes the longest run of cached blocks holding a prefix of
 * tokens[0, n - 1) and returns the positions it now holds (0: none; the sequence goes
 * on from there, and its last token is always computed). publish: the full blocks of
 * the slot's first n positions (tokens[0, n) the tokens there, n <= its length) become
 * reusable; they stay cached after reset until their memory is needed. The rows are
 * those the attaching sequence would have computed, up to rounding (a prompt's rows
 * may come from a forward batched differently). */
int32_t llmopt_session_prefix_attach(struct llmopt_session *s, int32_t slot, const int32_t *tokens,
                                     int32_t n);
void llmopt_session_prefix_publish(struct llmopt_session *s, int32_t slot, const int32_t *tokens,
                                   int32_t n);
/* Blocks the prefix cache holds (in use by a slot or not); whether there is one. */
int32_t llmopt_session_kv_blocks_cached(const struct llmopt_session *s);
bool llmopt_session_prefix_cache_on(const struct llmopt_session *s);
/* The KV cache's element type (never DEFAULT) and the bytes of its K and V storage. */
enum llmopt_kv_type llmopt_session_kv_type(const struct llmopt_session *s);
uint64_t llmopt_session_kv_bytes(const struct llmopt_session *s);
uint64_t llmopt_session_kernels_run(const struct llmopt_session *s);
/* Bytes of the backend's planned activation arena. */
size_t llmopt_session_arena_bytes(const struct llmopt_session *s);
/* Bytes of weights the backend repacked once when the session was created (the CPU
 * GEMM's panels, for models whose panels fit 64 MiB; 0 otherwise). */
size_t llmopt_session_packed_bytes(const struct llmopt_session *s);

/* ---- Profiling (llmopt profile) -----------------------------------------------------
 * Per-node wall time of a session's forwards, summed by op family. Families come from
 * the graph's structure, never from a model's name: a linear whose result reaches an
 * attention's q/k/v through non-linear ops (rope, norms, reshapes) is QKV; a linear
 * reading an attention's result is the attention output projection; the linear that
 * produces the logits (through views and elementwise ops with a constant) is lm_head;
 * other linears are MLP (docs/tools.md). */
enum llmopt_op_family {
    LLMOPT_OPS_ATTENTION,
    LLMOPT_OPS_QKV,
    LLMOPT_OPS_ATTN_OUT,
    LLMOPT_OPS_MLP,
    LLMOPT_OPS_LM_HEAD,
    LLMOPT_OPS_NORM,
    LLMOPT_OPS_ROPE,
    LLMOPT_OPS_OTHER,
    LLMOPT_OPS_COUNT
};
const char *llmopt_op_family_name(enum llmopt_op_family f); /* "qkv", "attn_out", ... */

struct llmopt_op_family_stats {
    double seconds;      /* wall time of the family's kernels */
    uint64_t kernels;    /* kernels run */
    uint64_t bytes_read; /* weights + activations (+ KV rows for attention) its kernels read */
};
struct llmopt_profile {
    struct llmopt_op_family_stats family[LLMOPT_OPS_COUNT];
    uint64_t steps, tokens;  /* forwards and tokens since the profile started */
    double forward_seconds;  /* wall time of those forwards (kernels + the loop between) */
};
/* Starts per-node timing from zero (again, if already on); LLMOPT_ERR_UNSUPPORTED when
 * the session's backend cannot time nodes. Off, forwards read no clock. */
enum llmopt_status llmopt_session_profile_start(struct llmopt_session *s, struct llmopt_err *err);
/* Totals since the profile started (all zero when it is off). */
void llmopt_session_profile_read(const struct llmopt_session *s, struct llmopt_profile *out);
void llmopt_session_profile_stop(struct llmopt_session *s);

/* ---- Memory (llmopt mem) -------------------------------------------------------------
 * What a session with the given options needs, computed from the model without
 * allocating it: weights by stored type, the KV cache for n_ctx x n_slots (and conv
 * state), and the planned activation arena for n_batch tokens. */
#define LLMOPT_MEM_MAX_TYPES 16
struct llmopt_memory {
    int32_t n_weight_types;
    struct {
        const char *dtype;  /* "q8_0", "f32", ... */
        int32_t tensors;
        uint64_t bytes;
    } weights[LLMOPT_MEM_MAX_TYPES];
    uint64_t weight_bytes;     /* all of them (each bound tensor once) */
    int32_t n_ctx, n_batch, n_slots; /* the options as a session resolves them */
    int32_t kv_layers;
    const char *kv_type;       /* element type of the KV cache ("f32") */
    uint64_t kv_bytes;         /* K and V of every layer, every block of every slot */
    uint64_t conv_state_bytes; /* short_conv state of every layer and slot */
    uint64_t arena_bytes;      /* the memory plan for n_batch tokens */
    uint64_t total_bytes;      /* weights + kv + conv state + arena */
};
enum llmopt_status llmopt_model_memory(const struct llmopt_model *m, const struct llmopt_session_opts *opts,
                                       struct llmopt_memory *out, struct llmopt_err *err);

/* ---- Sampling and generation ----------------------------------------------------- */
struct llmopt_sampling {
    float temperature;     /* <= 0: greedy */
    int32_t top_k;         /* <= 0: off */
    float top_p;           /* >= 1: off */
    float min_p;           /* <= 0: off */
    float repeat_penalty;  /* 1: off */
    int32_t repeat_last_n;
    float presence_penalty, frequency_penalty;
    uint64_t seed;
};
void llmopt_sampling_default(struct llmopt_sampling *p);

/* A sampler for one sequence (per-request sampling in a server). sample() may modify
 * logits in place and allocates nothing; prob_out (optional) gets the chosen token's
 * probability. */
struct llmopt_sampler;
enum llmopt_status llmopt_sampler_create(const struct llmopt_sampling *p, int32_t n_vocab,
                                         struct llmopt_sampler **out, struct llmopt_err *err);
int32_t llmopt_sampler_sample(struct llmopt_sampler *s, float *logits, const int32_t *history,
                              size_t n_history, float *prob_out);
void llmopt_sampler_free(struct llmopt_sampler *s);

/* Called with each generated token; return false to stop. */
typedef bool (*llmopt_token_cb)(void *user, int32_t id);

struct llmopt_generate_result {
    int32_t n_prompt, n_generated;
    bool stopped_eog;       /* ended on an end-of-generation token (not emitted) */
    double prefill_seconds, decode_seconds;
};

/* Feeds prompt ids to slot (after resetting it) and generates up to max_new tokens. */
enum llmopt_status llmopt_generate(struct llmopt_session *s, int32_t slot, const int32_t *prompt,
                                   int32_t n_prompt, int32_t max_new,
                                   const struct llmopt_sampling *sampling, llmopt_token_cb cb,
                                   void *user, struct llmopt_generate_result *result,
                                   struct llmopt_err *err);

/* ---- Server support --------------------------------------------------------------
 * Small facts the HTTP server (src/server/) needs beyond the API above; implemented
 * in src/runtime/server_support.c. */
/* The text bytes of one token as the detokenizer produces them ("▁" -> ' ', <0xXX> ->
 * that byte, control tokens -> nothing), without the streaming rules. Writes
 * min(length, cap) bytes, no NUL; returns the full length (0 for an id out of range).
 * The bytes need not be valid UTF-8 on their own. */
size_t llmopt_token_piece(const struct llmopt_model *m, int32_t id, char *buf, size_t cap);
/* The token's piece as stored in the vocabulary ("<s>", "▁the"); not NUL-terminated.
 * NULL and *len = 0 for an id out of range. */
const char *llmopt_token_text(const struct llmopt_model *m, int32_t id, size_t *len);
/* Positions per sequence the session was created with (its resolved n_ctx). */
int32_t llmopt_session_n_ctx(const struct llmopt_session *s);
/* Threads the session's CPU kernels run on (its resolved n_threads); 0 on other backends. */
int32_t llmopt_session_n_threads(const struct llmopt_session *s);

#ifdef __cplusplus
}
#endif
#endif
