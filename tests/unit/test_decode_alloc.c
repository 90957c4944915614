/* A decode step allocates no heap memory after warm-up (DESIGN decision 5).
 *
 * The test binary is linked with --wrap for malloc/calloc/realloc/aligned_alloc/
 * posix_memalign (see CMakeLists.txt), so every allocation the llmopt library makes is
 * counted. It generates with the real loop (llmopt_generate: forward, sampler,
 * callback) and checks that nothing was allocated between consecutive tokens. */
#include "llmopt.h"
#include "test.h"

#include <stdint.h>

static uint64_t alloc_count;

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
void *__real_aligned_alloc(size_t align, size_t n);
int __real_posix_memalign(void **p, size_t align, size_t n);

void *__wrap_malloc(size_t n) {
    alloc_count++;
    return __real_malloc(n);
}
void *__wrap_calloc(size_t n, size_t size) {
    alloc_count++;
    return __real_calloc(n, size);
}
void *__wrap_realloc(void *p, size_t n) {
    alloc_count++;
    return __real_realloc(p, n);
}
void *__wrap_aligned_alloc(size_t align, size_t n) {
    alloc_count++;
    return __real_aligned_alloc(align, n);
}
int __wrap_posix_memalign(void **p, size_t align, size_t n) {
    alloc_count++;
    return __real_posix_memalign(p, align, n);
}

#define N_STEPS 48

struct recorder {
    int n;
    uint64_t count_at[N_STEPS + 1];
};

static bool record(void *user, int32_t id) {
    struct recorder *r = user;
    (void)id;
    if (r->n <= N_STEPS) r->count_at[r->n] = alloc_count;
    r->n++;
    return true;
}

static void check_model(const char *path, float temperature, enum llmopt_kv_type kv_type) {
    struct llmopt_err err = {0};
    struct llmopt_model *m = NULL;
    struct llmopt_session *s = NULL;
    CHECK_MSG(llmopt_model_load(path, NULL, &m, &err) == LLMOPT_OK, "%s", err.msg);
    if (!m) return;
    struct llmopt_session_opts so = {.n_ctx = 256, .n_batch = 32, .kv_type = kv_type};
    CHECK_MSG(llmopt_session_create(m, &so, &s, &err) == LLMOPT_OK, "%s", err.msg);
    if (s) {
        int32_t prompt[3] = {1, 403, 407};
        struct llmopt_sampling sp;
        llmopt_sampling_default(&sp);
        sp.temperature = temperature;
        sp.seed = 7;
        struct recorder r = {0};
        struct llmopt_generate_result res;
        uint64_t before = alloc_count;
        CHECK_MSG(llmopt_generate(s, 0, prompt, 3, N_STEPS, &sp, record, &r, &res, &err) == LLMOPT_OK,
                  "%s", err.msg);
        CHECK(alloc_count > before); /* the counter works: setup allocates */
        CHECK(r.n >= 8);
        /* Between token 1 and the last one: decode steps only, after warm-up. */
        for (int i = 2; i < r.n && i <= N_STEPS; i++)
            CHECK_MSG(r.count_at[i] == r.count_at[1], "%s: %llu allocations by decode step %d",
                      path, (unsigned long long)(r.count_at[i] - r.count_at[1]), i);
    }
    llmopt_session_free(s);
    llmopt_model_free(m);
}

static void test_decode_step_allocates_nothing_f32(void) {
    check_model("../shared/models/stories260K/stories260K-F32.gguf", 0.0f, LLMOPT_KV_F32);
}

static void test_decode_step_allocates_nothing_q8_0_sampling(void) {
    check_model("../shared/models/stories260K/stories260K-Q8_0.gguf", 0.8f, LLMOPT_KV_DEFAULT); /* f16 KV */
}

TEST_MAIN(test_decode_step_allocates_nothing_f32, test_decode_step_allocates_nothing_q8_0_sampling)
