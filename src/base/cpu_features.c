/* CPU feature detection: CPUID + XGETBV on x86, sysfs and /proc for topology. */
#define _GNU_SOURCE
#include "base/cpu_features.h"

#include "base/status.h"

#include <ctype.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define CPU_X86 1
#endif

static const char *const feature_names[CPU_FEATURE_COUNT] = {
    [CPU_SSE4_2] = "sse4_2",
    [CPU_AVX] = "avx",
    [CPU_AVX2] = "avx2",
    [CPU_FMA] = "fma",
    [CPU_F16C] = "f16c",
    [CPU_AVX512F] = "avx512f",
    [CPU_AVX512BW] = "avx512bw",
    [CPU_AVX512VL] = "avx512vl",
    [CPU_AVX512_VNNI] = "avx512_vnni",
    [CPU_AVX_VNNI] = "avx_vnni",
    [CPU_AVX512_BF16] = "avx512_bf16",
};
_Static_assert(LLMOPT_ARRAY_LEN(feature_names) == CPU_FEATURE_COUNT,
               "feature name table out of sync");

static const char *const cache_type_names[CPU_CACHE_TYPE_COUNT] = {
    [CPU_CACHE_DATA] = "data",
    [CPU_CACHE_INSTRUCTION] = "instruction",
    [CPU_CACHE_UNIFIED] = "unified",
};
_Static_assert(LLMOPT_ARRAY_LEN(cache_type_names) == CPU_CACHE_TYPE_COUNT,
               "cache type name table out of sync");

const char *cpu_feature_name(enum cpu_feature f) {
    return (unsigned)f < CPU_FEATURE_COUNT ? feature_names[f] : "?";
}

enum cpu_feature cpu_feature_from_name(const char *name) {
    for (int f = 0; f < CPU_FEATURE_COUNT; f++)
        if (!strcmp(name, feature_names[f])) return (enum cpu_feature)f;
    return CPU_FEATURE_COUNT;
}

const char *cpu_cache_type_name(enum cpu_cache_type t) {
    return (unsigned)t < CPU_CACHE_TYPE_COUNT ? cache_type_names[t] : "?";
}

enum cpu_cache_type cpu_cache_type_from_name(const char *name) {
    for (int t = 0; t < CPU_CACHE_TYPE_COUNT; t++)
        if (!strcmp(name, cache_type_names[t])) return (enum cpu_cache_type)t;
    return CPU_CACHE_TYPE_COUNT;
}

/* ---- Instruction sets -------------------------------------------------------------- */

#ifdef CPU_X86
/* The highest CPUID leaf of the range that starts at `base` (0 or 0x80000000). GCC's
 * cpuid.h returns it as unsigned, clang's as int: one type for the comparisons. */
static unsigned cpuid_max(unsigned base) {
    return (unsigned)__get_cpuid_max(base, NULL);
}

static uint64_t read_xcr0(void) {
    uint32_t lo, hi;
    /* xgetbv with ecx = 0 reads XCR0; only valid when CPUID reports OSXSAVE. */
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static void detect_isa(struct cpu_features *f) {
    unsigned a, b, c, d;
    unsigned max_leaf = cpuid_max(0);
    if (max_leaf == 0) return;
    __cpuid(0, a, b, c, d);
    memcpy(f->vendor, &b, 4);
    memcpy(f->vendor + 4, &d, 4);
    memcpy(f->vendor + 8, &c, 4);
    f->vendor[12] = 0;

    __cpuid(1, a, b, c, d);
    bool sse42 = c >> 20 & 1, fma = c >> 12 & 1, osxsave = c >> 27 & 1, avx = c >> 28 & 1,
         f16c = c >> 29 & 1;

    bool avx2 = false, avx512f = false, avx512bw = false, avx512vl = false, avx512vnni = false,
         avxvnni = false, avx512bf16 = false;
    if (max_leaf >= 7) {
        unsigned max_sub;
        __cpuid_count(7, 0, max_sub, b, c, d);
        avx2 = b >> 5 & 1;
        avx512f = b >> 16 & 1;
        avx512bw = b >> 30 & 1;
        avx512vl = b >> 31 & 1;
        avx512vnni = c >> 11 & 1;
        if (max_sub >= 1) {
            __cpuid_count(7, 1, a, b, c, d);
            avxvnni = a >> 4 & 1;
            avx512bf16 = a >> 5 & 1;
        }
    }

    uint64_t xcr0 = osxsave ? read_xcr0() : 0;
    /* bit 1 SSE, bit 2 AVX (upper YMM); bits 5-7 opmask, ZMM0-15 upper half, ZMM16-31 */
    f->os_ymm = (xcr0 & 0x6) == 0x6;
    f->os_zmm = f->os_ymm && (xcr0 & 0xe0) == 0xe0;

    f->has[CPU_SSE4_2] = sse42;
    f->has[CPU_AVX] = avx && f->os_ymm;
    f->has[CPU_AVX2] = avx2 && f->os_ymm;
    f->has[CPU_FMA] = fma && f->os_ymm;
    f->has[CPU_F16C] = f16c && f->os_ymm;
    f->has[CPU_AVX_VNNI] = avxvnni && f->os_ymm;
    f->has[CPU_AVX512F] = avx512f && f->os_zmm;
    f->has[CPU_AVX512BW] = avx512bw && f->os_zmm;
    f->has[CPU_AVX512VL] = avx512vl && f->os_zmm;
    f->has[CPU_AVX512_VNNI] = avx512vnni && f->os_zmm;
    f->has[CPU_AVX512_BF16] = avx512bf16 && f->os_zmm;
}

/* CPUID leaves 0x80000002..4: the 48-byte brand string, padded with spaces. */
static void cpuid_brand(char *out, size_t cap) {
    unsigned regs[12];
    if (cpuid_max(0x80000000) < 0x80000004 || cap < 49) return;
    for (unsigned i = 0; i < 3; i++)
        __cpuid(0x80000002 + i, regs[4 * i], regs[4 * i + 1], regs[4 * i + 2], regs[4 * i + 3]);
    memcpy(out, regs, 48);
    out[48] = 0;
}
#endif

/* ---- Topology from sysfs and /proc ---------------------------------------------------- */

/* Reads a small text file into buf (NUL-terminated, trailing whitespace trimmed). */
static bool read_small_file(const char *path, char *buf, size_t cap) {
    FILE *fp = fopen(path, "r");
    if (!fp) return false;
    size_t n = fread(buf, 1, cap - 1, fp);
    fclose(fp);
    buf[n] = 0;
    while (n > 0 && isspace((unsigned char)buf[n - 1])) buf[--n] = 0;
    return n > 0;
}

/* Parses a kernel CPU list ("0-3,8,10-11") into cpus[] (up to cap); returns the count of
 * CPUs listed (may exceed cap), or -1 when malformed. */
static int parse_cpu_list(const char *s, int *cpus, int cap) {
    int count = 0;
    while (*s) {
        char *end;
        long lo = strtol(s, &end, 10), hi = lo;
        if (end == s || lo < 0) return -1;
        s = end;
        if (*s == '-') {
            hi = strtol(s + 1, &end, 10);
            if (end == s + 1 || hi < lo || hi - lo > 65536) return -1;
            s = end;
        }
        for (long c = lo; c <= hi; c++, count++)
            if (cpus && count < cap) cpus[count] = (int)c;
        if (*s == ',')
            s++;
        else if (*s)
            return -1;
    }
    return count;
}

/* "48K", "2048K", "1M", "32768" -> bytes; 0 when malformed. */
static int64_t parse_cache_size(const char *s) {
    char *end;
    long long v = strtoll(s, &end, 10);
    if (end == s || v <= 0) return 0;
    int64_t mult = 1;
    if (*end == 'K' || *end == 'k')
        mult = 1024, end++;
    else if (*end == 'M' || *end == 'm')
        mult = 1024 * 1024, end++;
    else if (*end == 'G' || *end == 'g')
        mult = 1024 * 1024 * 1024, end++;
    if (*end) return 0;
    return (int64_t)v * mult;
}

#ifdef CPU_X86
/* AMD's older cache leaves, where TOPOEXT is hidden (this project's AMD VM): 0x80000005
 * ECX/EDX L1 data/instruction (KiB in [31:24], line in [7:0]), 0x80000006 ECX L2 (KiB in
 * [31:16]) and EDX L3 (512 KiB units in [31:18]); zero sizes are absent caches. */
static void cpuid_caches_amd_legacy(struct cpu_features *f) {
    unsigned a, b, c5, d5, c6, d6;
    if (cpuid_max(0x80000000) < 0x80000006) return;
    __cpuid(0x80000005, a, b, c5, d5);
    __cpuid(0x80000006, a, b, c6, d6);
    const struct cpu_cache legacy[4] = {{1, CPU_CACHE_DATA, (int64_t)(c5 >> 24) << 10, (int)(c5 & 0xff), 0},
                                        {1, CPU_CACHE_INSTRUCTION, (int64_t)(d5 >> 24) << 10, (int)(d5 & 0xff), 0},
                                        {2, CPU_CACHE_UNIFIED, (int64_t)(c6 >> 16) << 10, (int)(c6 & 0xff), 0},
                                        {3, CPU_CACHE_UNIFIED, (int64_t)(d6 >> 18) << 19, (int)(d6 & 0xff), 0}};
    for (int i = 0; i < 4 && f->n_caches < CPU_MAX_CACHES; i++)
        if (legacy[i].size_bytes > 0) f->caches[f->n_caches++] = legacy[i];
}

/* Where sysfs has no cache directory (some VMs' kernels): the deterministic cache
 * parameters of CPUID, leaf 4 (Intel) or 0x8000001D (AMD, with TOPOEXT; without it the
 * older leaves), one subleaf a cache: type in EAX[4:0] (0: no more), level EAX[7:5];
 * line EBX[11:0] + 1, partitions EBX[21:12] + 1, ways EBX[31:22] + 1, sets ECX + 1. The
 * sharing count there is the hardware's, not this machine's CPUs: left unknown. */
static void cpuid_caches(struct cpu_features *f) {
    unsigned a, b, c, d, leaf = 4;
    if (!strcmp(f->vendor, "AuthenticAMD") || !strcmp(f->vendor, "HygonGenuine")) {
        if (cpuid_max(0x80000000) < 0x80000001) return;
        __cpuid(0x80000001, a, b, c, d);
        if (!(c >> 22 & 1) || cpuid_max(0x80000000) < 0x8000001d) { /* no TOPOEXT */
            cpuid_caches_amd_legacy(f);
            return;
        }
        leaf = 0x8000001d;
    } else if (cpuid_max(0) < 4)
        return;
    for (unsigned i = 0; i < 16 && f->n_caches < CPU_MAX_CACHES; i++) {
        __cpuid_count(leaf, i, a, b, c, d);
        const unsigned type = a & 0x1f;
        if (type == 0) break;
        struct cpu_cache k = {.level = (int)(a >> 5 & 7),
                              .type = type == 1   ? CPU_CACHE_DATA
                                      : type == 2 ? CPU_CACHE_INSTRUCTION
                                                  : CPU_CACHE_UNIFIED,
                              .line_bytes = (int)(b & 0xfff) + 1};
        k.size_bytes = (int64_t)((b >> 22 & 0x3ff) + 1) * ((b >> 12 & 0x3ff) + 1) * k.line_bytes * ((int64_t)c + 1);
        if (type > 3 || k.level < 1 || k.line_bytes > 4096) continue;
        f->caches[f->n_caches++] = k;
    }
}
#endif

static void detect_caches(struct cpu_features *f) {
    char path[128], buf[256];
    for (int i = 0; i < 32 && f->n_caches < CPU_MAX_CACHES; i++) {
        const char *dir = "/sys/devices/system/cpu/cpu0/cache";
        snprintf(path, sizeof path, "%s/index%d/level", dir, i);
        if (!read_small_file(path, buf, sizeof buf)) break;
        struct cpu_cache c = {.level = atoi(buf)};
        snprintf(path, sizeof path, "%s/index%d/type", dir, i);
        if (!read_small_file(path, buf, sizeof buf)) continue;
        if (!strcmp(buf, "Data"))
            c.type = CPU_CACHE_DATA;
        else if (!strcmp(buf, "Instruction"))
            c.type = CPU_CACHE_INSTRUCTION;
        else if (!strcmp(buf, "Unified"))
            c.type = CPU_CACHE_UNIFIED;
        else
            continue;
        snprintf(path, sizeof path, "%s/index%d/size", dir, i);
        if (!read_small_file(path, buf, sizeof buf)) continue;
        c.size_bytes = parse_cache_size(buf);
        snprintf(path, sizeof path, "%s/index%d/coherency_line_size", dir, i);
        if (read_small_file(path, buf, sizeof buf)) c.line_bytes = atoi(buf);
        snprintf(path, sizeof path, "%s/index%d/shared_cpu_list", dir, i);
        if (read_small_file(path, buf, sizeof buf)) {
            int n = parse_cpu_list(buf, NULL, 0);
            c.shared_by_cpus = n > 0 ? n : 0;
        }
        if (c.level < 1 || c.level > 8 || c.size_bytes <= 0) continue;
        if (c.line_bytes < 0 || c.line_bytes > 4096) c.line_bytes = 0;
        f->caches[f->n_caches++] = c;
    }
#ifdef CPU_X86
    if (!f->n_caches) cpuid_caches(f); /* after detect_isa: the vendor */
#endif
    /* sort by (level, type): insertion sort over at most CPU_MAX_CACHES entries */
    for (int i = 1; i < f->n_caches; i++) {
        struct cpu_cache c = f->caches[i];
        int j = i;
        for (; j > 0 && (f->caches[j - 1].level > c.level ||
                         (f->caches[j - 1].level == c.level && f->caches[j - 1].type > c.type));
             j--)
            f->caches[j] = f->caches[j - 1];
        f->caches[j] = c;
    }
}

#define CPU_TOPOLOGY_MAX 4096

static void detect_cores(struct cpu_features *f) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    f->logical_cpus = online > 0 ? (int)online : 1;
    cpu_set_t set;
    CPU_ZERO(&set);
    int usable = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    f->usable_cpus = usable > 0 ? usable : f->logical_cpus;

    /* Physical cores: distinct (package id, core id) pairs over the online CPUs. */
    char buf[4096], path[128];
    if (!read_small_file("/sys/devices/system/cpu/online", buf, sizeof buf)) return;
    int *cpus = malloc(CPU_TOPOLOGY_MAX * sizeof *cpus);
    int64_t *keys = malloc(CPU_TOPOLOGY_MAX * sizeof *keys);
    int n = cpus && keys ? parse_cpu_list(buf, cpus, CPU_TOPOLOGY_MAX) : -1;
    int n_keys = 0;
    for (int i = 0; i < n && n <= CPU_TOPOLOGY_MAX; i++) {
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/physical_package_id",
                 cpus[i]);
        if (!read_small_file(path, buf, sizeof buf)) goto unknown;
        int64_t package = atoll(buf);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/core_id", cpus[i]);
        if (!read_small_file(path, buf, sizeof buf)) goto unknown;
        int64_t key = (int64_t)((uint64_t)package << 32 | ((uint64_t)atoll(buf) & 0xffffffff));
        bool seen = false;
        for (int k = 0; k < n_keys && !seen; k++) seen = keys[k] == key;
        if (!seen) keys[n_keys++] = key;
    }
    f->physical_cores = n_keys;
unknown:
    free(keys);
    free(cpus);
}

static void detect_model_name(struct cpu_features *f) {
    FILE *fp = fopen("/proc/cpuinfo", "r");
    char line[1024];
    while (fp && fgets(line, sizeof line, fp)) {
        if (strncmp(line, "model name", 10)) continue;
        char *colon = strchr(line, ':');
        if (!colon) continue;
        char *s = colon + 1;
        while (*s == ' ' || *s == '\t') s++;
        snprintf(f->model_name, sizeof f->model_name, "%s", s);
        break;
    }
    if (fp) fclose(fp);
#ifdef CPU_X86
    if (!f->model_name[0]) cpuid_brand(f->model_name, sizeof f->model_name);
#endif
    /* trim: the brand string is space-padded, the cpuinfo line ends in a newline */
    char *s = f->model_name;
    size_t lead = strspn(s, " \t");
    memmove(s, s + lead, strlen(s + lead) + 1);
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1])) s[--n] = 0;
}

void cpu_features_detect(struct cpu_features *out) {
    memset(out, 0, sizeof *out);
#ifdef CPU_X86
    detect_isa(out);
#endif
#if defined(__x86_64__)
    snprintf(out->arch, sizeof out->arch, "x86_64");
#elif defined(__i386__)
    snprintf(out->arch, sizeof out->arch, "i386");
#elif defined(__aarch64__)
    snprintf(out->arch, sizeof out->arch, "aarch64");
#else
    snprintf(out->arch, sizeof out->arch, "unknown");
#endif
    detect_cores(out);
    detect_caches(out);
    detect_model_name(out);
}

static struct cpu_features cached_features;
static pthread_once_t cached_once = PTHREAD_ONCE_INIT;

static void detect_cached(void) {
    cpu_features_detect(&cached_features);
}

const struct cpu_features *cpu_features_get(void) {
    pthread_once(&cached_once, detect_cached);
    return &cached_features;
}

int64_t cpu_features_cache_bytes(const struct cpu_features *f, int level) {
    for (int i = 0; i < f->n_caches; i++)
        if (f->caches[i].level == level && f->caches[i].type != CPU_CACHE_INSTRUCTION)
            return f->caches[i].size_bytes;
    return 0;
}

int64_t cpu_features_llc_bytes(const struct cpu_features *f) {
    for (int i = f->n_caches - 1; i >= 0; i--)
        if (f->caches[i].type != CPU_CACHE_INSTRUCTION) return f->caches[i].size_bytes;
    return 0;
}
