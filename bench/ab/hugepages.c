/* Read bandwidth of one decode-like stream over a weights file, three ways: from its
 * page-cache mapping (4 KiB pages), from an anonymous copy in 4 KiB pages, and from an
 * anonymous copy in transparent huge pages (the question behind the reverted copy of
 * CPU weights into huge pages: bench/results/cpu-hugepages-2026-11-30.md). T threads split the file in
 * contiguous halves and widen its bytes as f16 into f32 sums (the F16 matvec's loads),
 * with software prefetch D bytes ahead (0: none). Best of 5 passes each; GB/s of file.
 *
 *   gcc -O2 -mavx512f -mf16c -pthread bench/ab/hugepages.c -o /tmp/hugepages
 *   /tmp/hugepages FILE [threads 2] [prefetch distances 0,2048,4096] */
#define _GNU_SOURCE
#include <fcntl.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define HUGE ((size_t)2 << 20)
#define MAX_THREADS 16

static const uint8_t *g_base;
static size_t g_len;
static int g_threads, g_pf;
static float g_sink[MAX_THREADS];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Sums this thread's share as f16 (16 values a 32-byte load, 8 loads a 256-byte step). */
static void *stream(void *arg) {
    long id = (long)arg;
    size_t share = g_len / (size_t)g_threads / 256 * 256;
    const uint8_t *p = g_base + (size_t)id * share;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0;
    for (size_t i = 0; i + 256 <= share; i += 256) {
        if (g_pf)
            for (int l = 0; l < 4; l++) _mm_prefetch((const char *)p + i + g_pf + 64 * l, _MM_HINT_T0);
        for (int k = 0; k < 8; k += 2) {
            a0 = _mm512_add_ps(a0, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + i + 32 * k))));
            a1 = _mm512_add_ps(a1, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + i + 32 * k + 32))));
        }
    }
    g_sink[id] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    return NULL;
}

static double best_gbs(const uint8_t *base) {
    g_base = base;
    double best = 0;
    for (int r = 0; r < 5; r++) {
        pthread_t t[MAX_THREADS];
        double t0 = now();
        for (long i = 0; i < g_threads; i++) pthread_create(&t[i], NULL, stream, (void *)i);
        for (int i = 0; i < g_threads; i++) pthread_join(t[i], NULL);
        double gbs = (double)g_len / (now() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    return best;
}

/* An anonymous copy of src at a huge-page-aligned address, with or without THP. */
static uint8_t *anon_copy(const uint8_t *src, size_t len, int huge) {
    uint8_t *raw = mmap(NULL, len + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    uint8_t *at = (uint8_t *)(((uintptr_t)raw + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
    madvise(at, len, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    memcpy(at, src, len);
    return at;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE [threads] [prefetch,distances]\n", argv[0]);
        return 2;
    }
    int fd = open(argv[1], O_RDONLY);
    off_t size = fd < 0 ? -1 : lseek(fd, 0, SEEK_END);
    if (size < (off_t)(1 << 20)) {
        fprintf(stderr, "%s: cannot open, or under 1 MiB\n", argv[1]);
        return 1;
    }
    g_len = (size_t)size / 4096 * 4096;
    g_threads = argc > 2 ? atoi(argv[2]) : 2;
    if (g_threads < 1 || g_threads > MAX_THREADS) g_threads = 2;
    const char *dists = argc > 3 ? argv[3] : "0,2048,4096";
    const uint8_t *mapped = mmap(NULL, g_len, PROT_READ, MAP_PRIVATE, fd, 0);
    uint8_t *small = anon_copy(mapped, g_len, 0), *huge = anon_copy(mapped, g_len, 1);
    if (mapped == MAP_FAILED || !small || !huge) {
        fprintf(stderr, "out of memory for two copies of %zu bytes\n", g_len);
        return 1;
    }
    printf("%s: %.1f MB, %d threads, best of 5 passes (GB/s)\n", argv[1], g_len / 1e6, g_threads);
    printf("%-10s %14s %14s %14s\n", "prefetch", "page cache 4K", "anon 4K", "anon THP");
    char buf[256];
    snprintf(buf, sizeof buf, "%s", dists);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        g_pf = atoi(tok);
        double a = best_gbs(mapped), b = best_gbs(small), c = best_gbs(huge);
        printf("%-10d %14.2f %14.2f %14.2f\n", g_pf, a, b, c);
    }
    float s = 0;
    for (int i = 0; i < g_threads; i++) s += g_sink[i];
    return s == 12345.f; /* keeps the sums live */
}
