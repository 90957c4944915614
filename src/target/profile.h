/* The target profile: what `llmopt probe` measured on a machine (dispatch overhead,
 * memory read bandwidth, peak f32 FMA and int8 dot rates) next to what it detected
 * (instruction sets, cores, caches). Compile reads it for kernel, tile and thread
 * choices; reports read it for roofline fractions. The JSON form is documented in
 * docs/formats/target-profile.md. */
#ifndef LLMOPT_TARGET_PROFILE_H
#define LLMOPT_TARGET_PROFILE_H

#include "base/cpu_features.h"
#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define TARGET_PROFILE_FORMAT         "llmopt-target-profile"
#define TARGET_PROFILE_VERSION        1
#define TARGET_PROFILE_MAX_FILE_BYTES (1 << 20)

/* Append-only: names are JSON keys. "1t" runs on one thread; "all" on the profile's
 * `threads` threads (every usable CPU unless the probe was told otherwise). */
enum target_metric {
    TARGET_DISPATCH_SPIN,    /* ns per empty step, workers spinning between steps */
    TARGET_DISPATCH_WAKE,    /* ns per empty step, workers asleep between steps */
    TARGET_READ_BW_PLAIN_1T, /* GB/s (1e9 bytes/s), plain C streaming sum */
    TARGET_READ_BW_PLAIN_ALL,
    TARGET_READ_BW_SIMD_1T, /* GB/s, widest vector loads available */
    TARGET_READ_BW_SIMD_ALL,
    TARGET_F32_FMA_1T, /* GFLOP/s, an FMA counts 2 */
    TARGET_F32_FMA_ALL,
    TARGET_INT8_DOT_1T, /* GOP/s, a u8*s8 multiply-accumulate counts 2 */
    TARGET_INT8_DOT_ALL,
    TARGET_METRIC_COUNT
};

const char *target_metric_name(enum target_metric m); /* "read_bandwidth_simd_all" */
const char *target_metric_unit(enum target_metric m); /* "ns", "GB/s", "GFLOP/s", "GOP/s" */
/* Times are best when lowest, rates when highest. */
bool target_metric_lower_is_better(enum target_metric m);

/* One measurement, repeated: `best` is what compile uses; the others give the spread. */
struct target_measurement {
    double best; /* lowest time / highest rate over the repeats, in the metric's unit */
    double median;
    double worst;
    int repeats; /* timed repeats after a warm-up */
    int threads;
    char kernel[24]; /* the code that ran: "c", "sse2", "avx2", "avx512", "avx_vnni", ... */
};

struct target_profile {
    int version;                    /* TARGET_PROFILE_VERSION */
    char created_utc[32];           /* "2025-01-31T12:00:00Z" */
    char os[128];                   /* "Linux 6.1.0 x86_64" */
    struct cpu_features cpu;        /* of the machine measured */
    int threads;                    /* the "all" thread count */
    bool quick;                     /* measured with the short --quick settings */
    int64_t bandwidth_buffer_bytes; /* bytes streamed per bandwidth pass */
    struct target_measurement m[TARGET_METRIC_COUNT];
};

/* Summaries for compile and reports: the best all-thread read bandwidth (plain or
 * SIMD) in GB/s, and the all-thread f32 FMA peak in GFLOP/s. */
double target_profile_read_bandwidth_gbps(const struct target_profile *p);
double target_profile_peak_gflops(const struct target_profile *p);

/* Writes the profile as JSON (docs/formats/target-profile.md). */
enum llmopt_status target_profile_write_json(const struct target_profile *p, FILE *out,
                                             struct llmopt_err *err);
/* Reads and validates a profile file (at most TARGET_PROFILE_MAX_FILE_BYTES). On error
 * *out is zeroed and err names the file and the field. */
enum llmopt_status target_profile_read_json(const char *path, struct target_profile *out,
                                            struct llmopt_err *err);
/* The same from bytes in memory (fuzzing, tests); err names the field. */
enum llmopt_status target_profile_parse(const char *data, size_t size, struct target_profile *out,
                                        struct llmopt_err *err);
/* Prints the human-readable table `llmopt probe` shows. */
void target_profile_print(const struct target_profile *p, FILE *out);

/* ---- Measuring (probe.c) ------------------------------------------------------------ */

struct target_probe_opts {
    int threads;    /* 0: every usable CPU */
    bool quick;     /* ~2 s instead of ~10 s: fewer repeats, shorter runs */
    FILE *progress; /* a line per step while probing; NULL for silence */
    /* NULL: kernels use every feature of this machine. Otherwise only features also
     * present here (tests run the AVX2 or plain C kernels on an AVX-512 machine). */
    const struct cpu_features *isa;
};

/* Detects this machine and measures it into *out. */
enum llmopt_status target_probe(const struct target_probe_opts *opts, struct target_profile *out,
                                struct llmopt_err *err);

#endif
