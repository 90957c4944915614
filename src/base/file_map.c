#include "base/file_map.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

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

    void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
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
