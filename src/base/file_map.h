/* Read-only memory map of a whole file (MAP_PRIVATE, PROT_READ). Parsers borrow
 * pointers into the mapping; it lives until file_map_close.
 *
 * Files of FILE_MAP_HUGE_BYTES and more are mapped at an address aligned to that size,
 * so that file_map_make_resident can later put the same bytes, at the same address,
 * into anonymous memory backed by transparent huge pages (docs/cpu.md, "Weights in
 * memory": decode streams every weight once a token, and from 4 KiB page-cache pages a
 * CPU reads measurably slower than from 2 MiB pages). */
#ifndef LLMOPT_BASE_FILE_MAP_H
#define LLMOPT_BASE_FILE_MAP_H

#include "base/status.h"

#include <stddef.h>
#include <stdint.h>

#define FILE_MAP_HUGE_BYTES ((size_t)2 << 20) /* x86-64's PMD page: 2 MiB */

struct file_map {
    const uint8_t *data; /* (size) bytes; NULL when size == 0 (empty file: nothing mapped) */
    size_t size;         /* bytes */
};

/* Maps path read-only. On failure *out is zeroed and err says which call failed
 * (LLMOPT_ERR_IO). Directories and files that cannot be mapped are errors. */
enum llmopt_status file_map_open(const char *path, struct file_map *out,
                                 struct llmopt_err *err);
/* Unmaps; safe on a zeroed or already-closed map. */
void file_map_close(struct file_map *m);

/* Replaces the file-backed pages of the mapping (data, size) from file_map_open by an
 * anonymous read-only copy at the same address, asking the kernel for transparent huge
 * pages: every pointer into the mapping stays valid and reads the same bytes, which no
 * longer depend on the file (nor on the page cache keeping it). The copy goes a chunk
 * at a time, dropping each copied chunk's file pages from this process, so the extra
 * resident memory while it runs is one chunk. No thread may read the mapping while
 * this runs (the move itself is one mremap). On failure the mapping is left as it was
 * (file-backed) and err says which call failed. */
enum llmopt_status file_map_make_resident(const uint8_t *data, size_t size, struct llmopt_err *err);

#endif
