/* Prefix reuse in the paged KV cache (kv_cache_prefix_*):
 *   - mechanics on a small synthetic cache: publish full blocks, attach the longest
 *     matching chain (never the block of the last token), reference counts, blocks in
 *     use vs cached, cached blocks surviving release, eviction oldest first when
 *     reserve runs out of free blocks, and a chain through an evicted and reused block
 *     never matching its stale children; every attached row holds what was written for
 *     its token and position;
 *   - a session on stories260K: a 40-token prompt computed once, published and reset;
 *     a second sequence attaches 32 positions, computes the last 8 and gets the same
 *     logits as a sequence that computed all 40 (up to rounding: fewer rows per GEMM). */
#include "backend/kv_cache.h"
#include "llmopt.h"
#include "test.h"

#define BS     16
#define SLOTS  3
#define MAXPOS 64
#define ROW    8

/* The value written at (layer, token, position, column): lets a reader check a row. */
static float row_value(int layer, int32_t token, int32_t pos, int col) {
    return (float)(layer * 100000 + token * 1000 + pos * 10 + col);
}

/* Reserves, writes rows for tokens[0, n) and sets the length, as a forward would. */
static void compute(struct kv_cache *kv, int32_t slot, const int32_t *tokens, int32_t n) {
    struct llmopt_err err = {0};
    CHECK_MSG(kv_cache_reserve(kv, slot, n, &err) == LLMOPT_OK, "%s", err.msg);
    for (int32_t p = kv->slot_len[slot]; p < n; p++)
        for (int l = 0; l < kv->n_layers; l++) {
            float row[ROW];
            for (int c = 0; c < ROW; c++) row[c] = row_value(l, tokens[p], p, c);
            kv_cache_write(kv, kv->k, l, slot, p, 0, row, ROW);
            for (int c = 0; c < ROW; c++) row[c] = -row[c];
            kv_cache_write(kv, kv->v, l, slot, p, 0, row, ROW);
        }
    kv->slot_len[slot] = n;
}

/* Every row of the slot's first n positions holds tokens[p]'s values. */
static bool rows_hold(const struct kv_cache *kv, int32_t slot, const int32_t *tokens, int32_t n) {
    for (int32_t p = 0; p < n; p++)
        for (int l = 0; l < kv->n_layers; l++) {
            float k[ROW], v[ROW];
            kv_cache_read(kv, kv->k, l, slot, p, 0, k, ROW);
            kv_cache_read(kv, kv->v, l, slot, p, 0, v, ROW);
            for (int c = 0; c < ROW; c++)
                if (k[c] != row_value(l, tokens[p], p, c) || v[c] != -row_value(l, tokens[p], p, c)) return false;
        }
    return true;
}

static int32_t table(const struct kv_cache *kv, int32_t slot, int32_t i) {
    return kv->block_table[(int64_t)slot * kv->max_blocks_per_slot + i];
}

static void test_mechanics(void) {
    const int32_t row_elems[2] = {ROW, ROW};
    struct kv_cache *kv = NULL;
    struct llmopt_err err = {0};
    const int32_t n_blocks = SLOTS * (MAXPOS / BS); /* 12: every slot can be full */
    CHECK(kv_cache_create(2, row_elems, KV_DTYPE_F32, SLOTS, MAXPOS, n_blocks, BS, &kv, &err) == LLMOPT_OK);
    if (!kv) return;
    int32_t a[MAXPOS], b[MAXPOS];
    for (int i = 0; i < MAXPOS; i++) a[i] = b[i] = 7 + (i * 37) % 101;
    b[20] = 999; /* b: a's first block, then different */

    CHECK_EQ_INT(kv_cache_prefix_attach(kv, 0, a, 40), 0); /* off: nothing */
    CHECK(kv_cache_prefix_enable(kv, &err) == LLMOPT_OK);
    CHECK_EQ_INT(kv_cache_prefix_attach(kv, 0, a, 40), 0); /* empty cache */
    compute(kv, 0, a, 40);
    kv_cache_prefix_publish(kv, 0, a, 40);
    CHECK_EQ_INT(kv_cache_blocks_cached(kv), 2); /* positions 0..31; 32..39 is not full */
    CHECK_EQ_INT(kv_cache_blocks_in_use(kv), 3);

    CHECK_EQ_INT(kv_cache_prefix_attach(kv, 1, a, 40), 32);
    CHECK_EQ_INT(table(kv, 1, 0), table(kv, 0, 0));
    CHECK_EQ_INT(table(kv, 1, 1), table(kv, 0, 1));
    CHECK_EQ_INT(kv->refs[table(kv, 0, 0)], 2);
    CHECK_EQ_INT(kv_cache_blocks_in_use(kv), 3); /* shared, not copied */
    CHECK(rows_hold(kv, 1, a, 32));
    compute(kv, 1, a, 48); /* goes on in blocks of its own */
    CHECK(table(kv, 1, 2) != table(kv, 0, 2));
    CHECK(rows_hold(kv, 1, a, 48) && rows_hold(kv, 0, a, 40));

    CHECK_EQ_INT(kv_cache_prefix_attach(kv, 2, a, 32), 16); /* the last token is computed */
    kv_cache_release(kv, 2);
    CHECK_EQ_INT(kv_cache_prefix_attach(kv, 2, b, 40), 16); /* b differs in block 1 */
    kv_cache_release(kv, 2);
    int32_t c[MAXPOS];
    memcpy(c, a, sizeof c);
    c[0] = 1000;
    CHECK_EQ_INT(kv_cache_prefix_attach(kv, 2, c, 40), 0);
    kv_cache_release(kv, 2);

    /* Released, the cached blocks stay: none in use, 2 cached, attachable. */
    kv_cache_release(kv, 0);
    kv_cache_release(kv, 1);
    CHECK_EQ_INT(kv_cache_blocks_in_use(kv), 0);
    CHECK_EQ_INT(kv_cache_blocks_cached(kv), 2);
    CHECK_EQ_INT(kv_cache_prefix_attach(kv, 2, a, 40), 32);
    CHECK(rows_hold(kv, 2, a, 32));
    kv_cache_release(kv, 2);

    /* Exhaust the free blocks: the oldest cached block (a's first) is evicted first. */
    int32_t first = -1;
    {
        kv_cache_prefix_attach(kv, 0, a, 40);
        first = table(kv, 0, 0);
        kv_cache_release(kv, 0);
    }
    int32_t z[MAXPOS];
    for (int i = 0; i < MAXPOS; i++) z[i] = 5000 + i;
    compute(kv, 0, z, MAXPOS);      /* 4 blocks */
    compute(kv, 1, z, MAXPOS);      /* 8 */
    compute(kv, 2, z, 48);          /* 11: 12 - 2 cached = 10 free, so one eviction */
    CHECK_EQ_INT(kv_cache_blocks_cached(kv), 1);
    CHECK_EQ_INT(kv_cache_prefix_attach(kv, 2, a, 40), 0); /* slot 2 is not empty anyway */
    CHECK(table(kv, 2, 2) == first || table(kv, 0, 0) == first || table(kv, 1, 0) == first ||
          table(kv, 2, 0) == first || table(kv, 2, 1) == first); /* the evicted id is in use */
    for (int s = 0; s < SLOTS; s++) kv_cache_release(kv, s);
    CHECK_EQ_INT(kv_cache_prefix_attach(kv, 0, a, 40), 0); /* a's chain starts at the evicted block */
    kv_cache_release(kv, 0);

    /* Compute a again: the chain is rebuilt (its first block may reuse the evicted id,
     * whose old child must not match under the new generation) and reads back right. */
    compute(kv, 1, a, 40);
    kv_cache_prefix_publish(kv, 1, a, 40);
    kv_cache_release(kv, 1);
    CHECK_EQ_INT(kv_cache_prefix_attach(kv, 0, a, 40), 32);
    CHECK(rows_hold(kv, 0, a, 32));
    kv_cache_release(kv, 0);
    CHECK_EQ_INT(kv_cache_blocks_in_use(kv), 0);

    /* Two sequences that computed the same prefix: publishing the second keeps the
     * first's blocks and chains its own later blocks on from them. */
    compute(kv, 0, a, 40);
    compute(kv, 1, a, 56);
    kv_cache_prefix_publish(kv, 0, a, 40);
    kv_cache_prefix_publish(kv, 1, a, 56);
    kv_cache_release(kv, 0);
    kv_cache_release(kv, 1);
    CHECK_EQ_INT(kv_cache_prefix_attach(kv, 2, a, 60), 48);
    CHECK(rows_hold(kv, 2, a, 48));
    kv_cache_release(kv, 2);
    kv_cache_free(kv);
}

#define MODEL "../shared/models/stories260K/stories260K-F32.gguf"

/* On each backend there is (cuda: when a device is; its cache lives on the device and
 * follows the host's block tables). */
static void session_on(const struct llmopt_model *m, const char *backend) {
    struct llmopt_err err = {0};
    struct llmopt_session *s = NULL;
    struct llmopt_session_opts so = {.n_ctx = 128, .n_batch = 64, .n_slots = 2, .n_threads = 1,
                                     .backend = backend, .prefix_cache = true};
    enum llmopt_status st = llmopt_session_create(m, &so, &s, &err);
    if (st == LLMOPT_ERR_UNSUPPORTED && !strcmp(backend, "cuda")) {
        fprintf(stderr, "  skipped on cuda: %s\n", err.msg);
        return;
    }
    CHECK_MSG(st == LLMOPT_OK, "%s: %s", backend, err.msg);
    if (!s) return;
    CHECK(llmopt_session_prefix_cache_on(s));
    int32_t n_vocab = llmopt_model_n_vocab(m), tok[40];
    for (int i = 0; i < 40; i++) tok[i] = 1 + (i * 53 + 11) % (n_vocab - 1);
    const float *logits;
    float *ref = malloc((size_t)n_vocab * sizeof *ref);
    CHECK(llmopt_session_append(s, 0, tok, 40, &logits, &err) == LLMOPT_OK);
    memcpy(ref, logits, (size_t)n_vocab * sizeof *ref);
    llmopt_session_prefix_publish(s, 0, tok, 40);
    llmopt_session_reset(s, 0);
    CHECK_EQ_INT(llmopt_session_kv_blocks_in_use(s), 0);
    CHECK_EQ_INT(llmopt_session_kv_blocks_cached(s), 2);

    int32_t got = llmopt_session_prefix_attach(s, 1, tok, 40);
    CHECK_EQ_INT(got, 32);
    CHECK_EQ_INT(llmopt_session_seq_len(s, 1), 32);
    CHECK(llmopt_session_append(s, 1, tok + got, 40 - got, &logits, &err) == LLMOPT_OK);
    float worst = 0, scale = 0;
    int32_t arg_ref = 0, arg = 0;
    for (int32_t v = 0; v < n_vocab; v++) {
        worst = fmaxf(worst, fabsf(logits[v] - ref[v]));
        scale = fmaxf(scale, fabsf(ref[v]));
        if (ref[v] > ref[arg_ref]) arg_ref = v;
        if (logits[v] > logits[arg]) arg = v;
    }
    CHECK_MSG(worst <= 1e-5f * scale, "max |diff| %g of max |logit| %g", worst, scale);
    CHECK_EQ_INT(arg, arg_ref);
    fprintf(stderr, "  %s: attached 32 of 40, logits within %.2g of the full computation (scale %.3g)\n", backend,
            worst, scale);
    /* a greedy append longer than the batch (64): chunks of 64 and 36 (on cuda its first
     * chunk once ran without a logits pointer and crashed), against the logits' argmax */
    llmopt_session_reset(s, 0);
    llmopt_session_reset(s, 1);
    int32_t long_tok[100], id = -1;
    for (int i = 0; i < 100; i++) long_tok[i] = 1 + (i * 31 + 7) % (n_vocab - 1);
    CHECK_MSG(llmopt_session_append_greedy(s, 0, long_tok, 100, &id, &err) == LLMOPT_OK, "%s", err.msg);
    CHECK_MSG(llmopt_session_append(s, 1, long_tok, 100, &logits, &err) == LLMOPT_OK, "%s", err.msg);
    arg = 0;
    for (int32_t v = 1; v < n_vocab; v++)
        if (logits[v] > logits[arg]) arg = v;
    CHECK_EQ_INT(id, arg);
    CHECK_EQ_INT(llmopt_session_seq_len(s, 0), 100);
    /* nowhere to put the result: an error, not a crash */
    CHECK(llmopt_session_append(s, 0, long_tok, 1, NULL, &err) == LLMOPT_ERR_INVALID_ARG);
    CHECK(llmopt_session_append_greedy(s, 0, long_tok, 1, NULL, &err) == LLMOPT_ERR_INVALID_ARG);
    const int32_t pos = 100, slot = 0, row = 0;
    CHECK(llmopt_session_forward(s, 1, long_tok, &pos, &slot, 1, &row, NULL, &err) == LLMOPT_ERR_INVALID_ARG);
    CHECK_EQ_INT(llmopt_session_seq_len(s, 0), 100);
    free(ref);
    llmopt_session_free(s);
}

static void test_session(void) {
    struct llmopt_err err = {0};
    struct llmopt_model *m = NULL;
    CHECK_MSG(llmopt_model_load(MODEL, NULL, &m, &err) == LLMOPT_OK, "%s", err.msg);
    if (!m) return;
    session_on(m, "cpu");
    session_on(m, "cuda");
    llmopt_model_free(m);
}

TEST_MAIN(test_mechanics, test_session)
