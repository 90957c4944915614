#include "format/graph_file.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

enum llmopt_status json_load_file_capped(const char *path, size_t max_bytes, json_t **out,
                                         struct llmopt_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return err_set(err, LLMOPT_ERR_IO, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    enum llmopt_status st = LLMOPT_OK;
    if (fseek(f, 0, SEEK_END) != 0) {
        st = err_set(err, LLMOPT_ERR_IO, "%s: cannot seek", path);
        goto done;
    }
    long size = ftell(f);
    if (size < 0 || (unsigned long)size > max_bytes) {
        st = err_set(err, LLMOPT_ERR_LIMIT, "%s: %ld bytes, more than the cap of %zu", path,
                     size, max_bytes);
        goto done;
    }
    rewind(f);
    buf = malloc((size_t)size + 1);
    if (!buf) {
        st = err_set(err, LLMOPT_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    if (fread(buf, 1, (size_t)size, f) != (size_t)size) {
        st = err_set(err, LLMOPT_ERR_IO, "%s: short read", path);
        goto done;
    }
    json_error_t jerr;
    *out = json_loadb(buf, (size_t)size, JSON_REJECT_DUPLICATES, &jerr);
    if (!*out)
        st = err_set(err, LLMOPT_ERR_FORMAT, "%s:%d:%d: %s", path, jerr.line, jerr.column,
                     jerr.text);
done:
    free(buf);
    fclose(f);
    return st;
}

enum llmopt_status graph_file_parse(const char *data, size_t len, json_t **out,
                                    struct llmopt_err *err) {
    if (len > GRAPH_FILE_MAX_BYTES)
        return err_set(err, LLMOPT_ERR_LIMIT, "graph: larger than the cap");
    json_error_t jerr;
    *out = json_loadb(data, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!*out)
        return err_set(err, LLMOPT_ERR_FORMAT, "graph:%d:%d: %s", jerr.line, jerr.column,
                       jerr.text);
    return LLMOPT_OK;
}

static enum llmopt_status check_header(const json_t *root, const char *want_format,
                                       struct llmopt_err *err) {
    if (!json_is_object(root))
        return err_set(err, LLMOPT_ERR_FORMAT, "%s: top level is not an object", want_format);
    const char *format = json_string_value(json_object_get(root, "format"));
    if (!format || strcmp(format, want_format))
        return err_set(err, LLMOPT_ERR_FORMAT, "field 'format' is '%s', expected '%s'",
                       format ? format : "(missing)", want_format);
    json_t *version = json_object_get(root, "version");
    if (!json_is_integer(version))
        return err_set(err, LLMOPT_ERR_FORMAT, "%s: field 'version' missing", want_format);
    if (json_integer_value(version) != GRAPH_FILE_VERSION)
        return err_set(err, LLMOPT_ERR_UNSUPPORTED, "%s: version %lld, this build reads %d",
                       want_format, (long long)json_integer_value(version), GRAPH_FILE_VERSION);
    return LLMOPT_OK;
}

enum llmopt_status graph_file_check(const json_t *root, struct llmopt_err *err) {
    enum llmopt_status st = check_header(root, "llmopt-graph", err);
    if (st) return st;
    static const char *const arrays[] = {"hparams", "inputs", "params", "nodes", "outputs"};
    for (size_t i = 0; i < LLMOPT_ARRAY_LEN(arrays); i++)
        if (!json_is_array(json_object_get(root, arrays[i])))
            return err_set(err, LLMOPT_ERR_FORMAT, "graph: field '%s' missing or not an array",
                           arrays[i]);
    if (!json_is_string(json_object_get(root, "name")))
        return err_set(err, LLMOPT_ERR_FORMAT, "graph: field 'name' missing");
    return LLMOPT_OK;
}

enum llmopt_status param_map_check(const json_t *root, struct llmopt_err *err) {
    enum llmopt_status st = check_header(root, "llmopt-param-map", err);
    if (st) return st;
    json_t *gguf = json_object_get(root, "gguf");
    if (!json_is_object(gguf) || !json_is_object(json_object_get(gguf, "hparams")) ||
        !json_is_object(json_object_get(gguf, "params")))
        return err_set(err, LLMOPT_ERR_FORMAT,
                       "param map: 'gguf' with objects 'hparams' and 'params' expected");
    return LLMOPT_OK;
}
