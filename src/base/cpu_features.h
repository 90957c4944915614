/* What the CPU this process runs on can do: instruction-set extensions usable right now
 * (the CPU reports them and the OS saves their register state), logical CPUs and
 * physical cores, the cache hierarchy and the model name.
 *
 * Kernels dispatch on `cpu_features_get()->has[CPU_AVX2]` and the like. A target
 * profile (src/target/profile.h) carries the same struct for the machine it describes,
 * which need not be this one. */
#ifndef LLMOPT_BASE_CPU_FEATURES_H
#define LLMOPT_BASE_CPU_FEATURES_H

#include <stdbool.h>
#include <stdint.h>

/* Append-only (feature names appear in target profiles). A feature counts as present
 * only when it is usable: the CPU reports it AND the OS enables its register state
 * (XCR0: YMM for AVX*, opmask + ZMM for AVX-512*). */
enum cpu_feature {
    CPU_SSE4_2,
    CPU_AVX,
    CPU_AVX2,
    CPU_FMA,
    CPU_F16C,
    CPU_AVX512F,
    CPU_AVX512BW,
    CPU_AVX512VL,
    CPU_AVX512_VNNI, /* vpdpbusd on xmm/ymm/zmm (with AVX512VL for the narrow forms) */
    CPU_AVX_VNNI,    /* VEX-encoded vpdpbusd on xmm/ymm (Alder Lake, Sapphire Rapids) */
    CPU_AVX512_BF16,
    CPU_FEATURE_COUNT
};

/* The name Linux prints in /proc/cpuinfo "flags" ("sse4_2", "avx512_vnni", ...). */
const char *cpu_feature_name(enum cpu_feature f);
/* CPU_FEATURE_COUNT when name is not a known feature. */
enum cpu_feature cpu_feature_from_name(const char *name);

enum cpu_cache_type {
    CPU_CACHE_DATA,
    CPU_CACHE_INSTRUCTION,
    CPU_CACHE_UNIFIED,
    CPU_CACHE_TYPE_COUNT
};
/* "data", "instruction", "unified" */
const char *cpu_cache_type_name(enum cpu_cache_type t);
enum cpu_cache_type cpu_cache_type_from_name(const char *name); /* _COUNT when unknown */

#define CPU_MAX_CACHES 8

struct cpu_cache {
    int level; /* 1, 2, 3, ... */
    enum cpu_cache_type type;
    int64_t size_bytes; /* one instance of this cache */
    int line_bytes;     /* 0 when unknown */
    int shared_by_cpus; /* logical CPUs sharing one instance; 0 when unknown */
};

struct cpu_features {
    bool has[CPU_FEATURE_COUNT];
    bool os_ymm;      /* XCR0 enables SSE + AVX state: 256-bit registers survive a context switch */
    bool os_zmm;      /* XCR0 also enables opmask + upper ZMM state (AVX-512) */
    int logical_cpus; /* online (sysconf); >= 1 */
    int usable_cpus;  /* in this process's affinity mask; what a thread pool should use; >= 1 */
    int physical_cores; /* distinct (package, core) among online CPUs; 0 when unknown */
    int n_caches;
    struct cpu_cache caches[CPU_MAX_CACHES]; /* sorted by level, then type */
    char vendor[16];                         /* "GenuineIntel", "AuthenticAMD"; "" when unknown */
    char model_name[128]; /* /proc/cpuinfo "model name", else the CPUID brand string */
    char arch[16];        /* "x86_64", "aarch64", ... (compile-time) */
};

/* Detects once (thread-safe) and returns the same struct on every call. */
const struct cpu_features *cpu_features_get(void);
/* Detects afresh into *out (tests; cpu_features_get caches this). */
void cpu_features_detect(struct cpu_features *out);

/* Size in bytes of one instance of the data or unified cache at `level` (0 when none). */
int64_t cpu_features_cache_bytes(const struct cpu_features *f, int level);
/* Size of one instance of the highest-level data or unified cache (0 when none known). */
int64_t cpu_features_llc_bytes(const struct cpu_features *f);

#endif
