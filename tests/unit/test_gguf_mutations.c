/* Robustness of the GGUF reader: 1,000 mutated copies of the real model files go
 * through gguf_parse and gguf_fuzz_one; nothing may crash, leak or read out of
 * bounds (this runs under ASan + UBSan in CI), every rejection carries a message.
 *
 * Mutations (deterministic PRNG, fixed seed): bit flips and byte overwrites mostly
 * in the metadata, u64/u32 fields of the real layout (counts, string and array
 * lengths, types, n_dims, ne, offsets) overwritten with extreme values,
 * truncations, insertions and deletions. Each mutant lives in a buffer of exactly
 * its size, so any read past the end is caught. */
#define N_MUTANTS     1000
#define TEST_RNG_SEED 0x6767756675u

#include "rng.h"
#include "test.h"

#include "format/gguf.h"

#include <inttypes.h>
#include <stdint.h>
#include <time.h>

static const char *const files[] = {
    "../shared/models/stories260K/stories260K-F32.gguf",
    "../shared/models/stories260K/stories260K-Q8_0.gguf",
    "../shared/models/stories260K/stories260K-Q4_0.gguf",
    "../shared/models/llama-2-tiny-random/llama-2-tiny-random.gguf",
};
#define N_FILES (sizeof files / sizeof files[0])

/* uniform in [0, n); n > 0 */
static uint64_t rng_below(uint64_t n) { return rng_next() % n; }

/* Offsets of fields in one file, by category, so mutations hit real fields. */
enum field_kind { FIELD_U32, FIELD_U64 };
struct field {
    uint64_t offset;
    enum field_kind kind;
};
struct field_list {
    struct field *items;
    size_t len, cap;
};

enum { CAT_HEADER, CAT_KV, CAT_TENSOR, CAT_ARRAY_ELEM, CAT_COUNT };

struct source {
    uint8_t *data;
    size_t size;
    uint64_t meta_end; /* data_offset: everything the parser interprets lies before */
    struct field_list fields[CAT_COUNT];
};

static void add_field(struct field_list *l, uint64_t offset, enum field_kind kind) {
    if (l->len == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 64;
        l->items = realloc(l->items, l->cap * sizeof *l->items);
        LLMOPT_ASSERT(l->items);
    }
    l->items[l->len++] = (struct field){offset, kind};
}

static bool load_source(const char *path, struct source *src) {
    memset(src, 0, sizeof *src);
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return false;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    src->data = malloc((size_t)n);
    src->size = (size_t)n;
    bool ok = src->data && fread(src->data, 1, src->size, fp) == src->size;
    fclose(fp);
    if (!ok)
        return false;

    struct gguf_file *f;
    struct llmopt_err err;
    if (gguf_parse(src->data, src->size, &f, &err) != LLMOPT_OK) {
        fprintf(stderr, "  %s: %s\n", path, err.msg);
        return false;
    }
    src->meta_end = f->data_offset;
    struct field_list *hdr = &src->fields[CAT_HEADER], *kvs = &src->fields[CAT_KV],
                      *ten = &src->fields[CAT_TENSOR], *elems = &src->fields[CAT_ARRAY_ELEM];
    add_field(hdr, 4, FIELD_U32);  /* version */
    add_field(hdr, 8, FIELD_U64);  /* n_tensors */
    add_field(hdr, 16, FIELD_U64); /* n_kv */
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const struct gguf_kv *kv = &f->kv[i];
        add_field(kvs, (uint64_t)((const uint8_t *)kv->key.ptr - f->base) - 8, FIELD_U64);
        add_field(kvs, kv->offset - 4, FIELD_U32); /* value type */
        if (kv->type == GGUF_TYPE_STRING)
            add_field(kvs, kv->offset, FIELD_U64);
        if (kv->type != GGUF_TYPE_ARRAY)
            continue;
        add_field(kvs, kv->offset, FIELD_U32);     /* element type */
        add_field(kvs, kv->offset + 4, FIELD_U64); /* length */
        struct gguf_str_iter it;
        struct gguf_str s;
        gguf_str_iter_init(&it, kv);
        while (gguf_str_iter_next(&it, &s))
            add_field(elems, (uint64_t)((const uint8_t *)s.ptr - f->base) - 8, FIELD_U64);
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        uint64_t at = (uint64_t)((const uint8_t *)t->name.ptr - f->base);
        add_field(ten, at - 8, FIELD_U64); /* name length */
        at += t->name.len;
        add_field(ten, at, FIELD_U32); /* n_dims */
        at += 4;
        for (uint32_t d = 0; d < t->n_dims; d++, at += 8)
            add_field(ten, at, FIELD_U64); /* ne[d] */
        add_field(ten, at, FIELD_U32);     /* type */
        add_field(ten, at + 4, FIELD_U64); /* offset */
    }
    gguf_close(f);
    return true;
}

static void free_source(struct source *src) {
    for (int c = 0; c < CAT_COUNT; c++)
        free(src->fields[c].items);
    free(src->data);
}

/* A position the parser reads: nine times in ten inside the metadata. */
static uint64_t pick_pos(const struct source *src, size_t size) {
    uint64_t limit = rng_below(10) ? src->meta_end : size;
    if (limit > size)
        limit = size;
    return limit ? rng_below(limit) : 0;
}

static uint64_t extreme_u64(uint64_t old, size_t size) {
    const uint64_t values[] = {0,
                               1,
                               2,
                               31,
                               32,
                               0x7fffffffull,
                               0x80000000ull,
                               0xffffffffull,
                               1ull << 32,
                               1ull << 40,
                               1ull << 60,
                               1ull << 62,
                               1ull << 63,
                               (1ull << 63) - 1,
                               UINT64_MAX,
                               UINT64_MAX - 31,
                               (uint64_t)size,
                               (uint64_t)size - 1,
                               old + 1,
                               old - 1,
                               old * 2,
                               old + 32,
                               old ^ (1ull << 63)};
    size_t n = sizeof values / sizeof values[0];
    uint64_t k = rng_below(n + 2);
    return k < n ? values[k] : rng_next() >> rng_below(64);
}

static uint32_t extreme_u32(uint32_t old) {
    const uint32_t values[] = {0, 1, 2, 3, 4, 5, 8, 9, 12, 13, 30, 39, 40, 0x7fffffffu, 0x80000000u,
                               UINT32_MAX, old + 1, old - 1};
    size_t n = sizeof values / sizeof values[0];
    uint64_t k = rng_below(n + 1);
    return k < n ? values[k] : (uint32_t)rng_next();
}

/* Buffer being mutated: grows for insertions. */
struct mutant {
    uint8_t *p;
    size_t size, cap;
};

enum mutation { MUT_FLIP, MUT_FIELD, MUT_TRUNCATE, MUT_INSERT, MUT_DELETE, MUT_COUNT };
static const char *const mutation_names[MUT_COUNT] = {"byte flips", "field values",
                                                      "truncations", "insertions", "deletions"};

static void mutate(struct mutant *m, const struct source *src, enum mutation kind) {
    switch (kind) {
    case MUT_FLIP: {
        int n = 1 + (int)rng_below(8);
        for (int i = 0; i < n && m->size; i++) {
            uint64_t pos = pick_pos(src, m->size);
            if (rng_below(2))
                m->p[pos] ^= (uint8_t)(1u << rng_below(8));
            else
                m->p[pos] = (uint8_t)rng_next();
        }
        break;
    }
    case MUT_FIELD: {
        const struct field_list *l;
        do
            l = &src->fields[rng_below(CAT_COUNT)];
        while (l->len == 0);
        const struct field *fl = &l->items[rng_below(l->len)];
        if (fl->kind == FIELD_U64 && fl->offset + 8 <= m->size) {
            uint64_t v;
            memcpy(&v, m->p + fl->offset, 8);
            v = extreme_u64(v, m->size);
            memcpy(m->p + fl->offset, &v, 8);
        } else if (fl->kind == FIELD_U32 && fl->offset + 4 <= m->size) {
            uint32_t v;
            memcpy(&v, m->p + fl->offset, 4);
            v = extreme_u32(v);
            memcpy(m->p + fl->offset, &v, 4);
        }
        break;
    }
    case MUT_TRUNCATE:
        m->size = (size_t)(rng_below(4) ? pick_pos(src, m->size) : rng_below(m->size + 1));
        break;
    case MUT_INSERT: {
        size_t n = 1 + (size_t)rng_below(rng_below(4) ? 16 : 4096);
        uint64_t pos = pick_pos(src, m->size);
        if (m->size + n > m->cap) {
            m->cap = m->size + n;
            m->p = realloc(m->p, m->cap);
            LLMOPT_ASSERT(m->p);
        }
        memmove(m->p + pos + n, m->p + pos, m->size - pos);
        for (size_t i = 0; i < n; i++)
            m->p[pos + i] = rng_below(2) ? 0 : (uint8_t)rng_next();
        m->size += n;
        break;
    }
    case MUT_DELETE: {
        uint64_t pos = pick_pos(src, m->size);
        size_t n = 1 + (size_t)rng_below(rng_below(4) ? 16 : 4096);
        if (n > m->size - pos)
            n = m->size - pos;
        memmove(m->p + pos, m->p + pos + n, m->size - pos - n);
        m->size -= n;
        break;
    }
    default:
        break;
    }
}

static void test_mutated_files(void) {
    static struct source srcs[N_FILES];
    for (size_t i = 0; i < N_FILES; i++) {
        bool ok = load_source(files[i], &srcs[i]);
        CHECK_MSG(ok, "cannot load %s", files[i]);
        if (!ok) {
            for (size_t k = 0; k <= i; k++)
                free_source(&srcs[k]);
            return;
        }
    }
    clock_t start = clock();
    int parsed = 0, rejected = 0;
    int by_status[LLMOPT_STATUS_COUNT] = {0};
    int by_mutation_ok[MUT_COUNT] = {0}, by_mutation[MUT_COUNT] = {0};
    for (int i = 0; i < N_MUTANTS; i++) {
        const struct source *src = &srcs[(size_t)i % N_FILES];
        struct mutant m = {malloc(src->size), src->size, src->size};
        LLMOPT_ASSERT(m.p);
        memcpy(m.p, src->data, src->size);
        enum mutation kind = (enum mutation)rng_below(MUT_COUNT);
        mutate(&m, src, kind);
        if (rng_below(4) == 0) /* sometimes a second mutation of any kind */
            mutate(&m, src, (enum mutation)rng_below(MUT_COUNT));

        /* exactly-sized copy: the byte after the end is a redzone */
        uint8_t *exact = malloc(m.size ? m.size : 1);
        LLMOPT_ASSERT(exact);
        if (m.size)
            memcpy(exact, m.p, m.size);
        free(m.p);

        struct gguf_file *f = NULL;
        struct llmopt_err err;
        err.msg[0] = '\0';
        enum llmopt_status st = gguf_parse(exact, m.size, &f, &err);
        by_mutation[kind]++;
        if (st == LLMOPT_OK) {
            parsed++;
            by_mutation_ok[kind]++;
            CHECK(f != NULL && f->size == m.size);
            gguf_close(f);
        } else {
            rejected++;
            CHECK_MSG(strncmp(err.msg, "gguf: ", 6) == 0, "mutant %d: status %d, msg '%s'", i,
                      st, err.msg);
            CHECK(st == LLMOPT_ERR_FORMAT || st == LLMOPT_ERR_UNSUPPORTED ||
                  st == LLMOPT_ERR_LIMIT);
        }
        if ((unsigned)st < LLMOPT_STATUS_COUNT)
            by_status[st]++;
        CHECK_EQ_INT(gguf_fuzz_one(exact, m.size), 0);
        free(exact);
    }
    double secs = (double)(clock() - start) / CLOCKS_PER_SEC;
    printf("gguf mutations: %d mutants, %d parsed ok, %d rejected (format %d, unsupported %d, "
           "limit %d), %.2f s cpu\n",
           N_MUTANTS, parsed, rejected, by_status[LLMOPT_ERR_FORMAT],
           by_status[LLMOPT_ERR_UNSUPPORTED], by_status[LLMOPT_ERR_LIMIT], secs);
    for (int k = 0; k < MUT_COUNT; k++)
        printf("  %-13s %4d mutants, %4d parsed ok\n", mutation_names[k], by_mutation[k],
               by_mutation_ok[k]);
    CHECK_EQ_INT(parsed + rejected, N_MUTANTS);
    CHECK(rejected > N_MUTANTS / 4); /* the mutations do reach the parser's checks */
    for (size_t i = 0; i < N_FILES; i++)
        free_source(&srcs[i]);
}

TEST_MAIN(test_mutated_files)
