/* Read-only memory map of a whole file (MAP_PRIVATE, PROT_READ). Parsers borrow
 * pointers into the mapping; it lives until file_map_close. */
#ifndef LLMOPT_BASE_FILE_MAP_H
#define LLMOPT_BASE_FILE_MAP_H

#include "base/status.h"

#include <stddef.h>
#include <stdint.h>

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

#endif
