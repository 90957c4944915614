/* Target profile: metric tables, JSON writer and validating reader, the printed table. */
#include "target/profile.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    const char *unit;
    bool lower_is_better;
    bool all_threads;
} metric_info[TARGET_METRIC_COUNT] = {
    [TARGET_DISPATCH_SPIN] = {"dispatch_spin", "ns", true, true},
    [TARGET_DISPATCH_WAKE] = {"dispatch_wake", "ns", true, true},
    [TARGET_READ_BW_PLAIN_1T] = {"read_bandwidth_plain_1t", "GB/s", false, false},
    [TARGET_READ_BW_PLAIN_ALL] = {"read_bandwidth_plain_all", "GB/s", false, true},
    [TARGET_READ_BW_SIMD_1T] = {"read_bandwidth_simd_1t", "GB/s", false, false},
    [TARGET_READ_BW_SIMD_ALL] = {"read_bandwidth_simd_all", "GB/s", false, true},
    [TARGET_F32_FMA_1T] = {"f32_fma_1t", "GFLOP/s", false, false},
    [TARGET_F32_FMA_ALL] = {"f32_fma_all", "GFLOP/s", false, true},
    [TARGET_INT8_DOT_1T] = {"int8_dot_1t", "GOP/s", false, false},
    [TARGET_INT8_DOT_ALL] = {"int8_dot_all", "GOP/s", false, true},
};
_Static_assert(LLMOPT_ARRAY_LEN(metric_info) == TARGET_METRIC_COUNT, "metric table out of sync");

const char *target_metric_name(enum target_metric m) {
    return (unsigned)m < TARGET_METRIC_COUNT ? metric_info[m].name : "?";
}

const char *target_metric_unit(enum target_metric m) {
    return (unsigned)m < TARGET_METRIC_COUNT ? metric_info[m].unit : "?";
}

bool target_metric_lower_is_better(enum target_metric m) {
    return (unsigned)m < TARGET_METRIC_COUNT && metric_info[m].lower_is_better;
}

double target_profile_read_bandwidth_gbps(const struct target_profile *p) {
    double a = p->m[TARGET_READ_BW_PLAIN_ALL].best, b = p->m[TARGET_READ_BW_SIMD_ALL].best;
    return a > b ? a : b;
}

double target_profile_peak_gflops(const struct target_profile *p) {
    return p->m[TARGET_F32_FMA_ALL].best;
}

/* ---- Writing ------------------------------------------------------------------------------ */

/* json_object_set_new that remembers an allocation failure instead of leaking. */
static void put(json_t *obj, const char *key, json_t *value, bool *ok) {
    if (!value || json_object_set_new(obj, key, value)) *ok = false;
}

static json_t *machine_to_json(const struct target_profile *p, bool *ok) {
    const struct cpu_features *c = &p->cpu;
    json_t *m = json_object(), *features = json_array(), *caches = json_array();
    if (!m || !features || !caches) {
        *ok = false;
        json_decref(m);
        json_decref(features);
        json_decref(caches);
        return NULL;
    }
    put(m, "os", json_string(p->os), ok);
    put(m, "arch", json_string(c->arch), ok);
    put(m, "vendor", json_string(c->vendor), ok);
    put(m, "cpu_model", json_string(c->model_name), ok);
    put(m, "logical_cpus", json_integer(c->logical_cpus), ok);
    put(m, "usable_cpus", json_integer(c->usable_cpus), ok);
    put(m, "physical_cores", json_integer(c->physical_cores), ok);
    put(m, "os_ymm", json_boolean(c->os_ymm), ok);
    put(m, "os_zmm", json_boolean(c->os_zmm), ok);
    for (int f = 0; f < CPU_FEATURE_COUNT; f++)
        if (c->has[f] && json_array_append_new(features, json_string(cpu_feature_name(f))))
            *ok = false;
    put(m, "features", features, ok);
    for (int i = 0; i < c->n_caches; i++) {
        const struct cpu_cache *k = &c->caches[i];
        json_t *o = json_pack("{s:i, s:s, s:I, s:i, s:i}", "level", k->level, "type",
                              cpu_cache_type_name(k->type), "size_bytes", (json_int_t)k->size_bytes,
                              "line_bytes", k->line_bytes, "shared_by_cpus", k->shared_by_cpus);
        if (!o || json_array_append_new(caches, o)) *ok = false;
    }
    put(m, "caches", caches, ok);
    return m;
}

enum llmopt_status target_profile_write_json(const struct target_profile *p, FILE *out,
                                             struct llmopt_err *err) {
    bool ok = true;
    json_t *root = json_object(), *probe = json_object(), *ms = json_object();
    if (!root || !probe || !ms) {
        json_decref(root);
        json_decref(probe);
        json_decref(ms);
        return err_set(err, LLMOPT_ERR_NOMEM, "target profile: out of memory");
    }
    put(root, "format", json_string(TARGET_PROFILE_FORMAT), &ok);
    put(root, "version", json_integer(p->version), &ok);
    put(root, "created_utc", json_string(p->created_utc), &ok);
    put(root, "machine", machine_to_json(p, &ok), &ok);
    put(probe, "threads", json_integer(p->threads), &ok);
    put(probe, "quick", json_boolean(p->quick), &ok);
    put(probe, "bandwidth_buffer_bytes", json_integer(p->bandwidth_buffer_bytes), &ok);
    put(root, "probe", probe, &ok);
    for (int i = 0; i < TARGET_METRIC_COUNT; i++) {
        const struct target_measurement *m = &p->m[i];
        put(ms, metric_info[i].name,
            json_pack("{s:s, s:i, s:s, s:f, s:f, s:f, s:i}", "unit", metric_info[i].unit, "threads",
                      m->threads, "kernel", m->kernel, "best", m->best, "median", m->median,
                      "worst", m->worst, "repeats", m->repeats),
            &ok);
    }
    put(root, "measurements", ms, &ok);
    if (!ok) {
        json_decref(root);
        return err_set(err, LLMOPT_ERR_NOMEM,
                       "target profile: out of memory (or a string "
                       "that is not UTF-8)");
    }
    int rc = json_dumpf(root, out, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
    json_decref(root);
    if (rc || fputc('\n', out) == EOF || fflush(out))
        return err_set(err, LLMOPT_ERR_IO, "target profile: write failed: %s", strerror(errno));
    return LLMOPT_OK;
}

/* ---- Reading -------------------------------------------------------------------------------
 * Every field is required and checked; unknown keys are rejected (they are typos or a
 * newer format), except unknown feature names, which are skipped so the feature list can
 * grow. Messages name the field as a path: "measurements.f32_fma_1t.best". */

static enum llmopt_status bad(struct llmopt_err *err, const char *path, const char *key,
                              const char *what) {
    return err_set(err, LLMOPT_ERR_FORMAT, "%s%s%s: %s", path, path[0] ? "." : "", key, what);
}

static enum llmopt_status check_keys(json_t *obj, const char *path, const char *const *allowed,
                                     size_t n_allowed, struct llmopt_err *err) {
    const char *key;
    json_t *value;
    json_object_foreach(obj, key, value) {
        bool known = false;
        for (size_t i = 0; i < n_allowed && !known; i++) known = !strcmp(key, allowed[i]);
        if (!known) {
            char what[160];
            snprintf(what, sizeof what, "unknown field (not in version %d of the format)",
                     TARGET_PROFILE_VERSION);
            return bad(err, path, key, what);
        }
    }
    return LLMOPT_OK;
}

static enum llmopt_status get(json_t *obj, const char *path, const char *key, json_t **out,
                              struct llmopt_err *err) {
    *out = json_object_get(obj, key);
    return *out ? LLMOPT_OK : bad(err, path, key, "missing");
}

static enum llmopt_status get_int(json_t *obj, const char *path, const char *key, int64_t lo,
                                  int64_t hi, int64_t *out, struct llmopt_err *err) {
    json_t *v;
    if (get(obj, path, key, &v, err)) return err->status;
    char what[128];
    if (!json_is_integer(v)) {
        snprintf(what, sizeof what, "expected an integer in [%lld, %lld]", (long long)lo,
                 (long long)hi);
        return bad(err, path, key, what);
    }
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi) {
        snprintf(what, sizeof what, "expected an integer in [%lld, %lld], found %lld",
                 (long long)lo, (long long)hi, (long long)x);
        return bad(err, path, key, what);
    }
    *out = x;
    return LLMOPT_OK;
}

static enum llmopt_status get_int32(json_t *obj, const char *path, const char *key, int lo, int hi,
                                    int *out, struct llmopt_err *err) {
    int64_t v;
    if (get_int(obj, path, key, lo, hi, &v, err)) return err->status;
    *out = (int)v;
    return LLMOPT_OK;
}

/* A finite number (integer or real) in [0, 1e15]. */
static enum llmopt_status get_number(json_t *obj, const char *path, const char *key, double *out,
                                     struct llmopt_err *err) {
    json_t *v;
    if (get(obj, path, key, &v, err)) return err->status;
    if (!json_is_number(v)) return bad(err, path, key, "expected a number");
    double x = json_number_value(v);
    if (!isfinite(x) || x < 0 || x > 1e15)
        return bad(err, path, key, "expected a finite number in [0, 1e15]");
    *out = x;
    return LLMOPT_OK;
}

static enum llmopt_status get_bool(json_t *obj, const char *path, const char *key, bool *out,
                                   struct llmopt_err *err) {
    json_t *v;
    if (get(obj, path, key, &v, err)) return err->status;
    if (!json_is_boolean(v)) return bad(err, path, key, "expected true or false");
    *out = json_is_true(v);
    return LLMOPT_OK;
}

/* A string that fits buf (with its NUL) and holds no control characters or NULs. */
static enum llmopt_status get_string(json_t *obj, const char *path, const char *key, char *buf,
                                     size_t cap, struct llmopt_err *err) {
    json_t *v;
    if (get(obj, path, key, &v, err)) return err->status;
    if (!json_is_string(v)) return bad(err, path, key, "expected a string");
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    char what[96];
    if (n >= cap) {
        snprintf(what, sizeof what, "string too long (%zu bytes, at most %zu)", n, cap - 1);
        return bad(err, path, key, what);
    }
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return bad(err, path, key, "control character in string");
    memcpy(buf, s, n + 1);
    return LLMOPT_OK;
}

static enum llmopt_status parse_machine(json_t *m, struct target_profile *p,
                                        struct llmopt_err *err) {
    static const char *const keys[] = {"os",           "arch",        "vendor",         "cpu_model",
                                       "logical_cpus", "usable_cpus", "physical_cores", "os_ymm",
                                       "os_zmm",       "features",    "caches"};
    const char *path = "machine";
    struct cpu_features *c = &p->cpu;
    if (check_keys(m, path, keys, LLMOPT_ARRAY_LEN(keys), err) ||
        get_string(m, path, "os", p->os, sizeof p->os, err) ||
        get_string(m, path, "arch", c->arch, sizeof c->arch, err) ||
        get_string(m, path, "vendor", c->vendor, sizeof c->vendor, err) ||
        get_string(m, path, "cpu_model", c->model_name, sizeof c->model_name, err) ||
        get_int32(m, path, "logical_cpus", 1, 65536, &c->logical_cpus, err) ||
        get_int32(m, path, "usable_cpus", 1, c->logical_cpus, &c->usable_cpus, err) ||
        get_int32(m, path, "physical_cores", 0, c->logical_cpus, &c->physical_cores, err) ||
        get_bool(m, path, "os_ymm", &c->os_ymm, err) ||
        get_bool(m, path, "os_zmm", &c->os_zmm, err))
        return err->status;

    json_t *features, *caches, *v;
    size_t i;
    if (get(m, path, "features", &features, err)) return err->status;
    if (!json_is_array(features)) return bad(err, path, "features", "expected an array of names");
    if (json_array_size(features) > 256) return bad(err, path, "features", "more than 256 entries");
    json_array_foreach(features, i, v) {
        char what[96];
        if (!json_is_string(v)) {
            snprintf(what, sizeof what, "entry %zu: expected a feature name string", i);
            return bad(err, path, "features", what);
        }
        enum cpu_feature f = cpu_feature_from_name(json_string_value(v));
        if (f == CPU_FEATURE_COUNT) continue; /* from a newer llmopt: not ours to use */
        if (c->has[f]) {
            snprintf(what, sizeof what, "entry %zu: '%s' listed twice", i, cpu_feature_name(f));
            return bad(err, path, "features", what);
        }
        c->has[f] = true;
    }

    if (get(m, path, "caches", &caches, err)) return err->status;
    if (!json_is_array(caches)) return bad(err, path, "caches", "expected an array");
    if (json_array_size(caches) > CPU_MAX_CACHES) {
        char what[64];
        snprintf(what, sizeof what, "more than %d entries", CPU_MAX_CACHES);
        return bad(err, path, "caches", what);
    }
    json_array_foreach(caches, i, v) {
        static const char *const cache_keys[] = {"level", "type", "size_bytes", "line_bytes",
                                                 "shared_by_cpus"};
        char sub[48], type[16];
        snprintf(sub, sizeof sub, "machine.caches[%zu]", i);
        struct cpu_cache *k = &c->caches[i];
        if (!json_is_object(v))
            return err_set(err, LLMOPT_ERR_FORMAT, "%s: expected an object", sub);
        if (check_keys(v, sub, cache_keys, LLMOPT_ARRAY_LEN(cache_keys), err) ||
            get_int32(v, sub, "level", 1, 8, &k->level, err) ||
            get_string(v, sub, "type", type, sizeof type, err) ||
            get_int(v, sub, "size_bytes", 1, (int64_t)1 << 40, &k->size_bytes, err) ||
            get_int32(v, sub, "line_bytes", 0, 4096, &k->line_bytes, err) ||
            get_int32(v, sub, "shared_by_cpus", 0, 65536, &k->shared_by_cpus, err))
            return err->status;
        k->type = cpu_cache_type_from_name(type);
        if (k->type == CPU_CACHE_TYPE_COUNT)
            return bad(err, sub, "type", "expected \"data\", \"instruction\" or \"unified\"");
        c->n_caches++;
    }
    return LLMOPT_OK;
}

static enum llmopt_status parse_measurement(json_t *o, enum target_metric metric,
                                            const struct target_profile *p,
                                            struct target_measurement *m, struct llmopt_err *err) {
    static const char *const keys[] = {"unit",   "threads", "kernel", "best",
                                       "median", "worst",   "repeats"};
    char path[96], unit[16];
    snprintf(path, sizeof path, "measurements.%s", metric_info[metric].name);
    if (!json_is_object(o))
        return bad(err, "measurements", metric_info[metric].name, "expected an object");
    if (check_keys(o, path, keys, LLMOPT_ARRAY_LEN(keys), err) ||
        get_string(o, path, "unit", unit, sizeof unit, err))
        return err->status;
    if (strcmp(unit, metric_info[metric].unit)) {
        char what[96];
        snprintf(what, sizeof what, "expected \"%s\", found \"%s\"", metric_info[metric].unit,
                 unit);
        return bad(err, path, "unit", what);
    }
    int want_threads = metric_info[metric].all_threads ? p->threads : 1;
    if (get_int32(o, path, "threads", want_threads, want_threads, &m->threads, err) ||
        get_string(o, path, "kernel", m->kernel, sizeof m->kernel, err) ||
        get_number(o, path, "best", &m->best, err) ||
        get_number(o, path, "median", &m->median, err) ||
        get_number(o, path, "worst", &m->worst, err) ||
        get_int32(o, path, "repeats", 1, 1000, &m->repeats, err))
        return err->status;
    if (!m->kernel[0]) return bad(err, path, "kernel", "empty");
    for (const char *s = m->kernel; *s; s++)
        if (!islower((unsigned char)*s) && !isdigit((unsigned char)*s) && *s != '_')
            return bad(err, path, "kernel", "expected lower-case letters, digits and '_'");
    bool low = metric_info[metric].lower_is_better;
    const char *order = low ? "expected best <= median <= worst (a time: lower is better)"
                            : "expected best >= median >= worst (a rate: higher is better)";
    if (low ? m->median < m->best : m->median > m->best) return bad(err, path, "median", order);
    if (low ? m->worst < m->median : m->worst > m->median) return bad(err, path, "worst", order);
    return LLMOPT_OK;
}

static enum llmopt_status parse_root(json_t *root, struct target_profile *p,
                                     struct llmopt_err *err) {
    static const char *const keys[] = {"format",  "version", "created_utc",
                                       "machine", "probe",   "measurements"};
    char format[64];
    json_t *v;
    if (!json_is_object(root)) return err_set(err, LLMOPT_ERR_FORMAT, "expected a JSON object");
    if (get_string(root, "", "format", format, sizeof format, err)) return err->status;
    if (strcmp(format, TARGET_PROFILE_FORMAT))
        return bad(err, "", "format", "expected \"" TARGET_PROFILE_FORMAT "\"");
    if (get(root, "", "version", &v, err)) return err->status;
    if (!json_is_integer(v)) return bad(err, "", "version", "expected an integer");
    if (json_integer_value(v) != TARGET_PROFILE_VERSION)
        return err_set(err, LLMOPT_ERR_UNSUPPORTED,
                       "version: %lld is not supported (this llmopt reads version %d)",
                       (long long)json_integer_value(v), TARGET_PROFILE_VERSION);
    p->version = TARGET_PROFILE_VERSION;
    if (check_keys(root, "", keys, LLMOPT_ARRAY_LEN(keys), err) ||
        get_string(root, "", "created_utc", p->created_utc, sizeof p->created_utc, err))
        return err->status;
    int y, mo, d, h, mi, s;
    char z;
    if (sscanf(p->created_utc, "%4d-%2d-%2dT%2d:%2d:%2d%c", &y, &mo, &d, &h, &mi, &s, &z) != 7 ||
        z != 'Z' || strlen(p->created_utc) != 20 || y < 1970 || mo < 1 || mo > 12 || d < 1 ||
        d > 31 || h > 23 || mi > 59 || s > 60 || h < 0 || mi < 0 || s < 0)
        return bad(err, "", "created_utc", "expected \"YYYY-MM-DDThh:mm:ssZ\"");

    if (get(root, "", "machine", &v, err)) return err->status;
    if (!json_is_object(v)) return bad(err, "", "machine", "expected an object");
    if (parse_machine(v, p, err)) return err->status;

    static const char *const probe_keys[] = {"threads", "quick", "bandwidth_buffer_bytes"};
    if (get(root, "", "probe", &v, err)) return err->status;
    if (!json_is_object(v)) return bad(err, "", "probe", "expected an object");
    if (check_keys(v, "probe", probe_keys, LLMOPT_ARRAY_LEN(probe_keys), err) ||
        get_int32(v, "probe", "threads", 1, 4096, &p->threads, err) ||
        get_bool(v, "probe", "quick", &p->quick, err) ||
        get_int(v, "probe", "bandwidth_buffer_bytes", 1, (int64_t)1 << 44,
                &p->bandwidth_buffer_bytes, err))
        return err->status;

    json_t *ms;
    if (get(root, "", "measurements", &ms, err)) return err->status;
    if (!json_is_object(ms)) return bad(err, "", "measurements", "expected an object");
    const char *names[TARGET_METRIC_COUNT];
    for (int i = 0; i < TARGET_METRIC_COUNT; i++) names[i] = metric_info[i].name;
    if (check_keys(ms, "measurements", names, TARGET_METRIC_COUNT, err)) return err->status;
    for (int i = 0; i < TARGET_METRIC_COUNT; i++) {
        if (get(ms, "measurements", metric_info[i].name, &v, err)) return err->status;
        if (parse_measurement(v, (enum target_metric)i, p, &p->m[i], err)) return err->status;
    }
    return LLMOPT_OK;
}

enum llmopt_status target_profile_parse(const char *data, size_t size, struct target_profile *out,
                                        struct llmopt_err *err) {
    memset(out, 0, sizeof *out);
    if (size > TARGET_PROFILE_MAX_FILE_BYTES)
        return err_set(err, LLMOPT_ERR_LIMIT, "%zu bytes, more than the %d-byte cap of a profile",
                       size, TARGET_PROFILE_MAX_FILE_BYTES);
    json_error_t jerr;
    json_t *root = json_loadb(data, size, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return err_set(err, LLMOPT_ERR_FORMAT, "invalid JSON at line %d column %d: %s", jerr.line,
                       jerr.column, jerr.text);
    enum llmopt_status st = parse_root(root, out, err);
    json_decref(root);
    if (st) memset(out, 0, sizeof *out);
    return st;
}

enum llmopt_status target_profile_read_json(const char *path, struct target_profile *out,
                                            struct llmopt_err *err) {
    memset(out, 0, sizeof *out);
    FILE *fp = fopen(path, "rb");
    if (!fp) return err_set(err, LLMOPT_ERR_IO, "target profile %s: %s", path, strerror(errno));
    /* Read one byte past the cap so an oversized file is noticed without trusting stat. */
    char *buf = malloc(TARGET_PROFILE_MAX_FILE_BYTES + 1);
    if (!buf) {
        fclose(fp);
        return err_set(err, LLMOPT_ERR_NOMEM, "target profile %s: out of memory", path);
    }
    size_t n = fread(buf, 1, TARGET_PROFILE_MAX_FILE_BYTES + 1, fp);
    bool read_error = ferror(fp);
    fclose(fp);
    enum llmopt_status st;
    if (read_error)
        st = err_set(err, LLMOPT_ERR_IO, "read error");
    else
        st = target_profile_parse(buf, n, out, err);
    free(buf);
    if (st) err_prefix(err, "target profile %s", path);
    return st;
}

/* ---- The table ---------------------------------------------------------------------------- */

static void format_bytes(char *buf, size_t cap, int64_t bytes) {
    if (bytes >= ((int64_t)1 << 30) && bytes % ((int64_t)1 << 30) == 0)
        snprintf(buf, cap, "%lld GiB", (long long)(bytes >> 30));
    else if (bytes >= (1 << 20) && bytes % (1 << 20) == 0)
        snprintf(buf, cap, "%lld MiB", (long long)(bytes >> 20));
    else if (bytes >= 1024 && bytes % 1024 == 0)
        snprintf(buf, cap, "%lld KiB", (long long)(bytes >> 10));
    else
        snprintf(buf, cap, "%lld B", (long long)bytes);
}

void target_profile_print(const struct target_profile *p, FILE *out) {
    const struct cpu_features *c = &p->cpu;
    fprintf(out, "cpu       %s (%s, %s)\n", c->model_name[0] ? c->model_name : "unknown",
            c->vendor[0] ? c->vendor : "unknown vendor", c->arch);
    fprintf(out, "os        %s\n", p->os);
    fprintf(out, "cpus      %d logical, %d usable, ", c->logical_cpus, c->usable_cpus);
    if (c->physical_cores)
        fprintf(out, "%d physical cores\n", c->physical_cores);
    else
        fprintf(out, "physical cores unknown\n");
    fprintf(out, "isa      ");
    int n_isa = 0;
    for (int f = 0; f < CPU_FEATURE_COUNT; f++)
        if (c->has[f]) fprintf(out, " %s", cpu_feature_name(f)), n_isa++;
    fprintf(out, "%s\n", n_isa ? "" : " (none of the tracked extensions)");
    fprintf(out, "caches   ");
    for (int i = 0; i < c->n_caches; i++) {
        const struct cpu_cache *k = &c->caches[i];
        char size[32];
        format_bytes(size, sizeof size, k->size_bytes);
        const char *t = k->type == CPU_CACHE_DATA          ? "d"
                        : k->type == CPU_CACHE_INSTRUCTION ? "i"
                                                           : "";
        fprintf(out, " L%d%s %s", k->level, t, size);
        if (k->shared_by_cpus > 1) fprintf(out, " (shared by %d)", k->shared_by_cpus);
        if (i + 1 < c->n_caches) fputc(',', out);
    }
    fprintf(out, "%s\n", c->n_caches ? "" : " unknown");
    char buf_size[32];
    format_bytes(buf_size, sizeof buf_size, p->bandwidth_buffer_bytes);
    fprintf(out, "probe     %d threads, %s bandwidth buffer, %s, %s\n\n", p->threads, buf_size,
            p->quick ? "quick" : "full", p->created_utc);
    fprintf(out, "%-26s %7s  %-12s %10s %10s %10s  %s\n", "measurement", "threads", "kernel",
            "best", "median", "worst", "unit");
    for (int i = 0; i < TARGET_METRIC_COUNT; i++) {
        const struct target_measurement *m = &p->m[i];
        fprintf(out, "%-26s %7d  %-12s %10.1f %10.1f %10.1f  %s\n", metric_info[i].name, m->threads,
                m->kernel, m->best, m->median, m->worst, metric_info[i].unit);
    }
}
