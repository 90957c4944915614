/* Benchmark weights: `llmopt synth` writes random-weight GGUFs at the shapes of real
 * models with a real vocabulary; `llmopt quantize` converts a GGUF's matrices to
 * another type. Both stream row by row through format/gguf_write.h, spreading the
 * (de)quantization of each chunk of rows over threads.
 *
 * synth is generic: a small table gives, per model name, the stock program, the
 * architecture string, the vocabulary GGUF and the hyper-parameter values; the tensors
 * come from the program's graph.json params (shapes evaluated over the hparams) mapped
 * to GGUF names through its map.json, and the metadata from the map's hparam keys. */
#ifndef LLMOPT_RUNTIME_SYNTH_H
#define LLMOPT_RUNTIME_SYNTH_H

#include "format/gguf.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* A target type: one ggml type for every matrix, or a llama.cpp-style "_M" mix that
 * gives `more_bits` to the output/tied embedding and to some attn_v / ffn_down layers. */
struct synth_qplan {
    char name[16]; /* as given on the command line, lower-cased */
    enum ggml_type base;
    enum ggml_type more_bits; /* == base for a plain type */
    uint32_t file_type;       /* general.file_type (llama_ftype numbering) */
};

/* "f32", "f16", "bf16", "q8_0", "q4_0", "q5_0", "iq4_xs", "q4_k", "q5_k", "q6_k",
 * "q4_k_m", "q5_k_m"
 * (case-insensitive). False when unknown. */
bool synth_qplan_parse(const char *name, struct synth_qplan *out);
/* Comma-separated list of the names synth_qplan_parse knows (for messages). */
const char *synth_qplan_names(void);

/* Type of a tensor under a plan: 1-D tensors are `keep` (the caller passes f32 or the
 * source type); matrices get the plan's type; when their rows (ne[0]) are not a
 * multiple of its 256-element block, q5_0 (q8_0 for q6_K) instead, and f16 when not a
 * multiple of 32 either. `n_layers` is the model's layer count (for the
 * mixes' layer choice), `has_output` whether the file holds output.weight. */
enum ggml_type synth_tensor_type(const struct synth_qplan *plan, const char *name, uint32_t n_dims,
                                 const uint64_t *ne, enum ggml_type keep, int n_layers,
                                 bool has_output);

struct synth_opts {
    const char *like; /* a name of the shape table */
    const char *type; /* a synth_qplan name */
    const char *out_path;
    uint64_t seed;
    int n_layers;             /* 0: the table's */
    const char *programs_dir; /* NULL: as llmopt run finds them */
    const char *vocab_path;   /* NULL: the table's vocabulary in the tokenizers dir */
    int threads;              /* 0: every online CPU */
};

struct synth_report {
    uint32_t n_tensors;
    uint64_t file_bytes;
    uint64_t n_params;                     /* elements over all tensors */
    uint32_t type_counts[GGML_TYPE_COUNT]; /* tensors per written type */
    double seconds;
};

/* "wrote PATH: 30 tensors, 1.236 G parameters, 1259.9 MiB (13 f32, 17 q8_0) in 4.2 s" */
void synth_report_print(const struct synth_report *report, const char *path, FILE *out);

enum llmopt_status synth_write(const struct synth_opts *opts, struct synth_report *report,
                               struct llmopt_err *err);
/* Prints the shape table (names, programs, sizes). */
void synth_list(FILE *out);

struct synth_quantize_opts {
    const char *in_path;
    const char *out_path;
    const char *type; /* a synth_qplan name */
    int threads;      /* 0: every online CPU */
};

/* Every matrix to the plan's type (1-D tensors and tensors already of their target
 * type are copied as they are); all metadata kept, general.file_type updated. */
enum llmopt_status synth_quantize(const struct synth_quantize_opts *opts,
                                  struct synth_report *report, struct llmopt_err *err);

#endif
