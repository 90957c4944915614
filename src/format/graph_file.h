/* Graph files and parameter maps (docs/formats/graph.md): JSON documents loaded with
 * a size cap and checked at the top level; the importer (ir/import.c) walks the nodes. */
#ifndef LLMOPT_FORMAT_GRAPH_FILE_H
#define LLMOPT_FORMAT_GRAPH_FILE_H

#include "base/status.h"

#include <jansson.h>

#define GRAPH_FILE_MAX_BYTES (64u << 20)
#define GRAPH_FILE_VERSION 1

/* Reads path (at most GRAPH_FILE_MAX_BYTES) and parses JSON. */
enum llmopt_status json_load_file_capped(const char *path, size_t max_bytes, json_t **out,
                                         struct llmopt_err *err);

/* Checks format/version and the presence and types of the top-level fields. */
enum llmopt_status graph_file_check(const json_t *root, struct llmopt_err *err);
enum llmopt_status param_map_check(const json_t *root, struct llmopt_err *err);

/* Parses a graph file from memory (fuzz entry point helper). */
enum llmopt_status graph_file_parse(const char *data, size_t len, json_t **out,
                                    struct llmopt_err *err);

#endif
