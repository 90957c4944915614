/* mremap and its MREMAP_ flags */
#define _GNU_SOURCE
#include "base/file_map.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Page size of this process (bytes). */
static size_t page_bytes(void) {
    long ps = sysconf(_SC_PAGESIZE);
    return ps > 0 ? (size_t)ps : 4096;
}

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

/* Reserves len bytes of address space at an address aligned to FILE_MAP_HUGE_BYTES
 * (by reserving one alignment more and giving back the ends); MAP_FAILED on failure. */
static uint8_t *reserve_aligned(size_t len, int prot, int flags) {
    size_t span = len + FILE_MAP_HUGE_BYTES;
    uint8_t *raw = mmap(NULL, span, prot, flags | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return MAP_FAILED;
    uint8_t *at = (uint8_t *)(((uintptr_t)raw + FILE_MAP_HUGE_BYTES - 1) & ~(uintptr_t)(FILE_MAP_HUGE_BYTES - 1));
    if (at > raw) munmap(raw, (size_t)(at - raw));
    if (raw + span > at + len) munmap(at + len, (size_t)(raw + span - (at + len)));
    return at;
}

/* Maps size bytes of fd read-only; files of FILE_MAP_HUGE_BYTES and more at an aligned
 * address (see file_map.h). MAP_FAILED on failure, errno set. */
static void *map_file_aligned(int fd, size_t size) {
    if (size < FILE_MAP_HUGE_BYTES) return mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    size_t len = round_up(size, page_bytes());
    uint8_t *at = reserve_aligned(len, PROT_NONE, MAP_NORESERVE);
    if (at == MAP_FAILED) return MAP_FAILED;
    void *p = mmap(at, size, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        munmap(at, len);
        errno = e;
    }
    return p;
}

enum llmopt_status file_map_open(const char *path, struct file_map *out,
                                 struct llmopt_err *err) {
    enum llmopt_status st = LLMOPT_OK;
    *out = (struct file_map){0};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return err_set(err, LLMOPT_ERR_IO, "%s: open failed: %s", path, strerror(errno));

    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = err_set(err, LLMOPT_ERR_IO, "%s: fstat failed: %s", path, strerror(errno));
        goto close_fd;
    }
    if (S_ISDIR(sb.st_mode)) {
        st = err_set(err, LLMOPT_ERR_IO, "%s: is a directory, expected a file", path);
        goto close_fd;
    }
    if (!S_ISREG(sb.st_mode)) {
        /* pipes, sockets and character devices have no size to map */
        st = err_set(err, LLMOPT_ERR_IO, "%s: not a regular file (cannot be mapped)", path);
        goto close_fd;
    }
    if (sb.st_size < 0 || (uint64_t)sb.st_size > (uint64_t)SIZE_MAX) {
        st = err_set(err, LLMOPT_ERR_IO, "%s: size %lld does not fit in memory", path,
                     (long long)sb.st_size);
        goto close_fd;
    }
    if (sb.st_size == 0)
        goto close_fd; /* mmap of zero bytes fails; an empty file is an empty map */

    void *p = map_file_aligned(fd, (size_t)sb.st_size);
    if (p == MAP_FAILED) {
        st = err_set(err, LLMOPT_ERR_IO, "%s: mmap of %lld bytes failed: %s", path,
                     (long long)sb.st_size, strerror(errno));
        goto close_fd;
    }
    out->data = p;
    out->size = (size_t)sb.st_size;

close_fd:
    close(fd); /* the mapping keeps its own reference to the file */
    return st;
}

void file_map_close(struct file_map *m) {
    if (m->data && m->size)
        munmap((void *)m->data, m->size);
    *m = (struct file_map){0};
}

/* Bytes copied between two drops of file pages in file_map_make_resident. */
#define RESIDENT_CHUNK_BYTES ((size_t)64 << 20)

enum llmopt_status file_map_make_resident(const uint8_t *data, size_t size, struct llmopt_err *err) {
    if (!data || !size) return LLMOPT_OK;
    size_t page = page_bytes(), len = round_up(size, page);
    if ((uintptr_t)data % page)
        return err_set(err, LLMOPT_ERR_INVALID_ARG, "make resident: %p is not the start of a mapping",
                       (const void *)data);
    uint8_t *copy = reserve_aligned(len, PROT_READ | PROT_WRITE, 0);
    if (copy == MAP_FAILED)
        return err_set(err, LLMOPT_ERR_NOMEM, "make resident: cannot map %zu anonymous bytes: %s", len,
                       strerror(errno));
    /* A hint: without transparent huge pages (or with none free) the copy still works,
     * in 4 KiB pages */
    (void)madvise(copy, len, MADV_HUGEPAGE);
    for (size_t off = 0; off < size; off += RESIDENT_CHUNK_BYTES) {
        size_t n = size - off < RESIDENT_CHUNK_BYTES ? size - off : RESIDENT_CHUNK_BYTES;
        memcpy(copy + off, data + off, n);
        /* the file pages just read leave this process (the page cache keeps them) */
        (void)madvise((void *)(uintptr_t)(data + off), round_up(n, page), MADV_DONTNEED);
    }
    if (mprotect(copy, len, PROT_READ) != 0) {
        int e = errno;
        munmap(copy, len);
        return err_set(err, LLMOPT_ERR_IO, "make resident: mprotect failed: %s", strerror(e));
    }
    /* one call swaps the pages under the same addresses (page tables move, huge pages
     * whole since both ends are aligned) */
    void *moved = mremap(copy, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)(uintptr_t)data);
    if (moved == MAP_FAILED) {
        int e = errno;
        munmap(copy, len);
        return err_set(err, LLMOPT_ERR_IO, "make resident: mremap of %zu bytes failed: %s", len, strerror(e));
    }
    return LLMOPT_OK;
}
