/* SentencePiece-style BPE tokenizer: exact ids against sentencepiece / llama.cpp
 * references, a naive O(n^2) merge oracle, round trips, the streaming detokenizer
 * and error paths (including malformed vocabularies built in memory). */
#include "base/utf8.h"
#include "format/gguf.h"
#include "tokenizer/tokenizer.h"

#include "test.h"
#include "tok_test.h"

#include <jansson.h>
#include <stdint.h>
#include <string.h>

#define LLAMA_SPM_VOCAB "../shared/tokenizers/ggml-vocab-llama-spm.gguf"
#define LLAMA_TINY_RANDOM "../shared/models/llama-2-tiny-random/llama-2-tiny-random.gguf"
#define STORIES_F32 "../shared/models/stories260K/stories260K-F32.gguf"
#define QWEN2_VOCAB "../shared/tokenizers/ggml-vocab-qwen2.gguf"
#define LLAMA_REF_JSON "../shared/models/llama2-tokenizer/reference_encodings.json"
#define STORIES_JSON "../shared/models/stories260K/expected_greedy.json"

static struct tok_vocab *load_vocab(const char *path) {
    struct llmopt_err err = {0};
    struct gguf_file *f = NULL;
    if (gguf_open(path, &f, &err) != LLMOPT_OK) {
        fprintf(stderr, "  gguf_open %s: %s\n", path, err.msg);
        return NULL;
    }
    struct tok_vocab *v = NULL;
    if (tok_vocab_from_gguf(f, &v, &err) != LLMOPT_OK)
        fprintf(stderr, "  tok_vocab_from_gguf %s: %s\n", path, err.msg);
    gguf_close(f); /* the vocab owns copies of what it needs */
    return v;
}

/* ---- 1. reference encodings (sentencepiece 0.1.97) ------------------------------- */

static void check_reference_encodings(const char *vocab_path) {
    struct tok_vocab *v = load_vocab(vocab_path);
    CHECK(v);
    if (!v) return;
    CHECK_EQ_INT(tok_n_tokens(v), 32000);
    CHECK_EQ_INT(tok_bos(v), 1);
    CHECK_EQ_INT(tok_eos(v), 2);
    CHECK_EQ_INT(tok_unk(v), 0);
    CHECK(tok_add_bos(v));
    CHECK(!tok_add_eos(v));
    CHECK(tok_is_eog(v, 2));
    CHECK(!tok_is_eog(v, 1));
    CHECK_EQ_INT(tok_vocab_kind(v), TOK_KIND_SPM);

    json_error_t jerr;
    json_t *root = json_load_file(LLAMA_REF_JSON, 0, &jerr);
    CHECK_MSG(root, "%s: %s", LLAMA_REF_JSON, jerr.text);
    json_t *cases = json_object_get(root, "encodings");
    CHECK(json_array_size(cases) >= 10);
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const char *text = json_string_value(json_object_get(c, "text"));
        size_t len = json_string_length(json_object_get(c, "text"));
        json_t *want = json_object_get(c, "ids");
        int32_t *ids = NULL;
        long n = encode_ids(v, text, len, false, false, &ids);
        CHECK_MSG(n == (long)json_array_size(want), "\"%s\": %ld ids, want %zu", text, n,
                  json_array_size(want));
        for (long k = 0; k < n && k < (long)json_array_size(want); k++)
            CHECK_MSG(ids[k] == json_integer_value(json_array_get(want, (size_t)k)),
                      "\"%s\" id %ld: %d, want %lld", text, k, ids[k],
                      json_integer_value(json_array_get(want, (size_t)k)));
        free(ids);

        /* with BOS: the same ids after id 1 */
        n = encode_ids(v, text, len, true, false, &ids);
        CHECK_EQ_INT(n, (long)json_array_size(want) + 1);
        if (n > 0) CHECK_EQ_INT(ids[0], 1);
        free(ids);

        /* and the pieces the reference names are the vocab's spellings */
        json_t *pieces = json_object_get(c, "pieces");
        for (size_t k = 0; k < json_array_size(pieces); k++) {
            const char *p = json_string_value(json_array_get(pieces, k));
            CHECK_EQ_INT(tok_find(v, p, strlen(p)),
                         json_integer_value(json_array_get(want, k)));
        }
    }
    json_decref(root);
    tok_vocab_free(v);
}

static void test_reference_encodings_llama_spm(void) {
    check_reference_encodings(LLAMA_SPM_VOCAB);
}

static void test_reference_encodings_tiny_random(void) {
    check_reference_encodings(LLAMA_TINY_RANDOM);
}

/* ---- naive O(n^2) oracle ---------------------------------------------------------- */

/* Merges by rescanning all pairs each round: best score, ties leftmost. Same rules as
 * the heap, written the obvious way, on the escaped text. */
static size_t naive_encode(const struct tok_vocab *v, const char *text, size_t len,
                           int32_t *out) {
    if (len == 0) return 0;
    char *esc = malloc(3 * len + 3);
    size_t m = 0;
    memcpy(esc, "\xe2\x96\x81", 3);
    m = 3;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(esc + m, "\xe2\x96\x81", 3);
            m += 3;
        } else {
            esc[m++] = text[i];
        }
    }
    size_t *start = malloc((m + 1) * sizeof *start);
    size_t n = 0;
    for (size_t i = 0; i < m;) {
        uint8_t c = (uint8_t)esc[i];
        size_t k = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
        start[n++] = i;
        i += k < m - i ? k : m - i;
    }
    start[n] = m;
    for (;;) {
        long best = -1;
        float best_score = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            int32_t id = tok_find(v, esc + start[i], start[i + 2] - start[i]);
            if (id < 0) continue;
            float s = tok_token_score(v, id);
            if (best < 0 || s > best_score) {
                best = (long)i;
                best_score = s;
            }
        }
        if (best < 0) break;
        memmove(start + best + 1, start + best + 2, (n - (size_t)best - 1) * sizeof *start);
        n--;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        size_t sl = start[i + 1] - start[i];
        int32_t id = tok_find(v, esc + start[i], sl);
        if (id >= 0) {
            out[k++] = id;
            continue;
        }
        for (size_t j = 0; j < sl; j++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", (uint8_t)esc[start[i] + j]);
            out[k++] = tok_find(v, name, 6);
        }
    }
    free(start);
    free(esc);
    return k;
}

static void test_matches_naive_merges(void) {
    struct tok_vocab *v = load_vocab(LLAMA_SPM_VOCAB);
    CHECK(v);
    if (!v) return;
    /* random strings over an alphabet that makes many competing merges */
    static const char *const alphabet[] = {"a", "b", "e", "r", "t", "h", "in", "on", " ",
                                           "  ", "\n", ".", ",", "é", "日", "本", "😀", "1"};
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    char text[512];
    int32_t got[2048], want[2048];
    for (int round = 0; round < 300; round++) {
        size_t len = 0;
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int n_parts = (int)(rng >> 33) % 60;
        for (int p = 0; p < n_parts; p++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            const char *a = alphabet[(rng >> 33) % LLMOPT_ARRAY_LEN(alphabet)];
            memcpy(text + len, a, strlen(a));
            len += strlen(a);
        }
        size_t n = 0;
        struct llmopt_err err = {0};
        CHECK_EQ_INT(tok_encode(v, text, len, false, false, got, 2048, &n, &err), LLMOPT_OK);
        size_t nw = naive_encode(v, text, len, want);
        CHECK_EQ_INT(n, nw);
        bool same = n == nw;
        for (size_t i = 0; same && i < n; i++) same = got[i] == want[i];
        CHECK_MSG(same, "round %d: \"%.*s\"", round, (int)len, text);
    }
    tok_vocab_free(v);
}

/* ---- 2. stories260K -------------------------------------------------------------- */

static void test_stories260k(void) {
    struct tok_vocab *v = load_vocab(STORIES_F32);
    CHECK(v);
    if (!v) return;
    CHECK_EQ_INT(tok_n_tokens(v), 512);
    json_error_t jerr;
    json_t *root = json_load_file(STORIES_JSON, 0, &jerr);
    CHECK_MSG(root, "%s: %s", STORIES_JSON, jerr.text);

    json_t *tc = json_object_get(root, "tokenize_check");
    const char *text = json_string_value(json_object_get(tc, "text"));
    json_t *want = json_object_get(tc, "ids_without_bos");
    CHECK(text && json_array_size(want) > 0);
    int32_t *ids = NULL;
    long n = encode_ids(v, text, strlen(text), false, false, &ids);
    CHECK_EQ_INT(n, (long)json_array_size(want));
    for (long k = 0; k < n && k < (long)json_array_size(want); k++)
        CHECK_EQ_INT(ids[k], json_integer_value(json_array_get(want, (size_t)k)));
    free(ids);

    /* the greedy run, streamed token by token after BOS, is the recorded text */
    json_t *run = json_object_get(json_object_get(root, "runs"), "stories260K-F32.gguf");
    json_t *run_ids = json_object_get(run, "ids");
    const char *run_text = json_string_value(json_object_get(run, "text"));
    CHECK(run_text && json_array_size(run_ids) == 256);
    struct tok_stream s;
    tok_stream_init(&s, v);
    size_t chunk_cap = tok_stream_max_out(v);
    char *chunk = malloc(chunk_cap);
    size_t text_cap = 4 * chunk_cap * (json_array_size(run_ids) + 2), len = 0;
    char *out = malloc(text_cap);
    len += tok_stream_push(&s, tok_bos(v), out + len, text_cap - len);
    CHECK_EQ_INT(len, 0);
    size_t i;
    json_t *id;
    json_array_foreach(run_ids, i, id) {
        size_t k = tok_stream_push(&s, (int32_t)json_integer_value(id), chunk, chunk_cap);
        CHECK(utf8_valid(chunk, k));
        memcpy(out + len, chunk, k);
        len += k;
    }
    len += tok_stream_flush(&s, out + len, text_cap - len);
    CHECK_EQ_INT(s.n_dropped, 0);
    CHECK_EQ_INT(len, strlen(run_text));
    CHECK_MSG(len == strlen(run_text) && memcmp(out, run_text, len) == 0, "got \"%.*s\"",
              (int)len, out);

    /* and the text re-encodes to the run's first sentence ids */
    n = encode_ids(v, run_text, strlen(run_text), true, false, &ids);
    CHECK(n > 20);
    CHECK_EQ_INT(ids[0], 1);
    for (long k = 1; k < 20 && k < n; k++)
        CHECK_EQ_INT(ids[k], json_integer_value(json_array_get(run_ids, (size_t)k - 1)));
    free(ids);
    free(out);
    free(chunk);
    json_decref(root);
    tok_vocab_free(v);
}

/* ---- 3. round trips -------------------------------------------------------------- */

struct text {
    const char *s;
    size_t len; /* 0: strlen */
};

static const struct text round_trip_corpus[] = {
    {"", 0}, {" ", 0}, {"  ", 0}, {"   ", 0}, {"a", 0}, {" a", 0}, {"a ", 0}, {"  a  ", 0},
    {"Hello world", 0}, {" leading", 0}, {"trailing ", 0}, {"trailing   ", 0},
    {"multiple   spaces   inside", 0}, {"\t", 0}, {"tab\tseparated\tvalues", 0},
    {" \t \t", 0}, {"\n", 0}, {"line one\nline two\n\n", 0}, {"\r\n crlf \r\n", 0},
    {"日本語のテキスト", 0}, {"中文 混合 English", 0}, {"emoji 😀👍🏽 🇫🇷", 0},
    {"😀", 0}, {"Ünïcödé àccénts: café, naïve, Åström, œuvre", 0},
    {"<s>", 0}, {"</s> <unk> <0x41>", 0}, {"<s>text</s>", 0}, {" <s> ", 0},
    {"a\0b", 3}, {"\0", 1}, {"math: ∑ x² ≤ ∞", 0}, {"Привет, мир", 0},
    {"mixed\t \n \t\nwhitespace", 0}, {"\x7f\x01\x1b[0m", 0},
};

static void check_round_trips(const char *vocab_path) {
    struct tok_vocab *v = load_vocab(vocab_path);
    CHECK(v);
    if (!v) return;
    for (size_t c = 0; c < LLMOPT_ARRAY_LEN(round_trip_corpus); c++) {
        const char *s = round_trip_corpus[c].s;
        size_t len = round_trip_corpus[c].len ? round_trip_corpus[c].len : strlen(s);
        for (int bos = 0; bos < 2; bos++) {
            int32_t *ids = NULL;
            long n = encode_ids(v, s, len, bos, false, &ids);
            CHECK(n >= 0);
            if (n < 0) continue;
            size_t got_len = 0;
            char *got = decode(v, ids, (size_t)n, &got_len);
            CHECK_MSG(got_len == len && memcmp(got, s, len) == 0,
                      "%s: \"%s\" (bos %d) -> \"%s\"", vocab_path, s, bos, got);
            /* streamed one id at a time, every chunk is whole code points */
            struct tok_stream st;
            tok_stream_init(&st, v);
            char chunk[256];
            for (long k = 0; k < n; k++) {
                size_t m = tok_stream_push(&st, ids[k], chunk, sizeof chunk);
                CHECK(utf8_valid(chunk, m));
            }
            CHECK_EQ_INT(tok_stream_flush(&st, chunk, sizeof chunk), 0);
            free(got);
            free(ids);
        }
    }
    tok_vocab_free(v);
}

static void test_round_trip_llama(void) { check_round_trips(LLAMA_SPM_VOCAB); }
static void test_round_trip_stories260k(void) { check_round_trips(STORIES_F32); }

static uint32_t rng_next(uint64_t *state) {
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*state >> 33);
}

/* Random valid UTF-8 (any code point but surrogates and U+2581, which decodes to a
 * space by design) round-trips; random bytes never give an invalid chunk. */
static void test_random_text(void) {
    struct tok_vocab *v = load_vocab(LLAMA_SPM_VOCAB);
    CHECK(v);
    if (!v) return;
    uint64_t rng = 42;
    char text[1024];
    for (int round = 0; round < 400; round++) {
        size_t len = 0;
        int n_chars = (int)(rng_next(&rng) % 200);
        for (int c = 0; c < n_chars; c++) {
            uint32_t cp, r = rng_next(&rng) % 8;
            if (r < 4) cp = rng_next(&rng) % 0x80;
            else if (r < 5) cp = 0x80 + rng_next(&rng) % (0x800 - 0x80);
            else if (r < 7) cp = 0x800 + rng_next(&rng) % (0x10000 - 0x800);
            else cp = 0x10000 + rng_next(&rng) % (0x110000 - 0x10000);
            if ((cp >= 0xd800 && cp <= 0xdfff) || cp == 0x2581) cp = ' ';
            len += utf8_put(cp, text + len);
        }
        int32_t *ids = NULL;
        long n = encode_ids(v, text, len, round & 1, false, &ids);
        CHECK(n >= 0);
        if (n < 0) continue;
        size_t got_len = 0;
        char *got = decode(v, ids, (size_t)n, &got_len);
        CHECK_MSG(got_len == len && memcmp(got, text, len) == 0, "round %d", round);
        free(got);
        free(ids);

        /* arbitrary bytes */
        len = rng_next(&rng) % 64;
        for (size_t i = 0; i < len; i++) text[i] = (char)rng_next(&rng);
        n = encode_ids(v, text, len, false, false, &ids);
        CHECK(n >= 0);
        if (n < 0) continue;
        struct tok_stream st;
        tok_stream_init(&st, v);
        char chunk[256];
        for (long k = 0; k < n; k++) {
            size_t m = tok_stream_push(&st, ids[k], chunk, sizeof chunk);
            CHECK(utf8_valid(chunk, m));
        }
        size_t m = tok_stream_flush(&st, chunk, sizeof chunk);
        CHECK(utf8_valid(chunk, m));
        free(ids);
    }
    tok_vocab_free(v);
}

static void test_long_text(void) {
    struct tok_vocab *v = load_vocab(LLAMA_SPM_VOCAB);
    CHECK(v);
    if (!v) return;
    /* 1 MiB: must be fast (a heap, not rescans) and still round-trip */
    const char *unit = "Once upon a time, there was a little girl named Lily.  She said: "
                       "\"日本語 😀\"\n\t";
    size_t unit_len = strlen(unit), len = 0, cap = (1u << 20) + unit_len;
    char *text = malloc(cap);
    while (len + unit_len <= (1u << 20)) {
        memcpy(text + len, unit, unit_len);
        len += unit_len;
    }
    int32_t *ids = NULL;
    long n = encode_ids(v, text, len, true, false, &ids);
    CHECK(n > 0);
    size_t got_len = 0;
    char *got = decode(v, ids, (size_t)n, &got_len);
    CHECK(got_len == len && memcmp(got, text, len) == 0);
    free(got);
    free(ids);
    /* a long run of one character merges into long pieces */
    memset(text, ' ', 100000);
    n = encode_ids(v, text, 100000, false, false, &ids);
    CHECK(n > 0 && n < 100000 / 4);
    got = decode(v, ids, (size_t)n, &got_len);
    CHECK_EQ_INT(got_len, 100000);
    free(got);
    free(ids);
    free(text);
    tok_vocab_free(v);
}

/* ---- 4. streaming detokenizer ----------------------------------------------------- */

static int32_t byte_token(const struct tok_vocab *v, uint8_t b) {
    char name[8];
    snprintf(name, sizeof name, "<0x%02X>", b);
    return tok_find(v, name, 6);
}

static void test_stream_byte_tokens(void) {
    struct tok_vocab *v = load_vocab(LLAMA_SPM_VOCAB);
    CHECK(v);
    if (!v) return;
    char chunk[64];
    struct tok_stream s;

    /* "😀" as four byte tokens: nothing until the last, then the whole code point */
    static const uint8_t emoji[4] = {0xf0, 0x9f, 0x98, 0x80};
    tok_stream_init(&s, v);
    for (int i = 0; i < 4; i++) {
        int32_t id = byte_token(v, emoji[i]);
        CHECK(id >= 0);
        size_t n = tok_stream_push(&s, id, chunk, sizeof chunk);
        CHECK(utf8_valid(chunk, n));
        CHECK_EQ_INT(n, i < 3 ? 0 : 4);
        if (i == 3) CHECK(memcmp(chunk, emoji, 4) == 0);
    }
    CHECK_EQ_INT(tok_stream_flush(&s, chunk, sizeof chunk), 0);

    /* the reference "emoji 😀👍🏽" ids, one at a time: chunks are valid, text exact */
    static const int32_t ref[] = {953,   29877, 2397, 29871, 243, 162, 155, 131,
                                  243,   162,   148,  144,   243, 162, 146, 192};
    tok_stream_init(&s, v);
    char text[128];
    size_t len = 0;
    for (size_t i = 0; i < LLMOPT_ARRAY_LEN(ref); i++) {
        size_t n = tok_stream_push(&s, ref[i], chunk, sizeof chunk);
        CHECK(utf8_valid(chunk, n));
        memcpy(text + len, chunk, n);
        len += n;
    }
    CHECK(len == strlen("emoji 😀👍🏽") && memcmp(text, "emoji 😀👍🏽", len) == 0);

    /* a sequence broken by an ASCII token: U+FFFD, then the ASCII */
    tok_stream_init(&s, v);
    CHECK_EQ_INT(tok_stream_push(&s, byte_token(v, 0xf0), chunk, sizeof chunk), 0);
    CHECK_EQ_INT(tok_stream_push(&s, byte_token(v, 0x9f), chunk, sizeof chunk), 0);
    size_t n = tok_stream_push(&s, byte_token(v, 'A'), chunk, sizeof chunk);
    CHECK(n == 4 && memcmp(chunk, "\xef\xbf\xbd" "A", 4) == 0);
    /* a stray continuation byte and an impossible lead byte: one U+FFFD each */
    n = tok_stream_push(&s, byte_token(v, 0x80), chunk, sizeof chunk);
    CHECK(n == 3 && memcmp(chunk, "\xef\xbf\xbd", 3) == 0);
    n = tok_stream_push(&s, byte_token(v, 0xff), chunk, sizeof chunk);
    CHECK(n == 3 && memcmp(chunk, "\xef\xbf\xbd", 3) == 0);
    /* an overlong lead (E0 80) and a surrogate (ED A0) are rejected at the 2nd byte */
    CHECK_EQ_INT(tok_stream_push(&s, byte_token(v, 0xe0), chunk, sizeof chunk), 0);
    n = tok_stream_push(&s, byte_token(v, 0x80), chunk, sizeof chunk);
    CHECK(n == 6 && utf8_valid(chunk, n));
    CHECK_EQ_INT(tok_stream_push(&s, byte_token(v, 0xed), chunk, sizeof chunk), 0);
    n = tok_stream_push(&s, byte_token(v, 0xa0), chunk, sizeof chunk);
    CHECK(n == 6 && utf8_valid(chunk, n));
    /* an unfinished sequence at the end comes out of flush as U+FFFD */
    CHECK_EQ_INT(tok_stream_push(&s, byte_token(v, 0xe6), chunk, sizeof chunk), 0);
    n = tok_stream_flush(&s, chunk, sizeof chunk);
    CHECK(n == 3 && memcmp(chunk, "\xef\xbf\xbd", 3) == 0);
    CHECK_EQ_INT(s.n_dropped, 0);

    /* leading space: dropped at the start and after BOS, kept elsewhere */
    int32_t hello = tok_find(v, "\xe2\x96\x81Hello", 8);
    CHECK(hello >= 0);
    tok_stream_init(&s, v);
    n = tok_stream_push(&s, hello, chunk, sizeof chunk);
    CHECK(n == 5 && memcmp(chunk, "Hello", 5) == 0);
    n = tok_stream_push(&s, hello, chunk, sizeof chunk);
    CHECK(n == 6 && memcmp(chunk, " Hello", 6) == 0);
    CHECK_EQ_INT(tok_stream_push(&s, tok_bos(v), chunk, sizeof chunk), 0);
    CHECK_EQ_INT(tok_stream_push(&s, tok_eos(v), chunk, sizeof chunk), 0);
    n = tok_stream_push(&s, hello, chunk, sizeof chunk);
    CHECK(n == 5 && memcmp(chunk, "Hello", 5) == 0);

    /* a buffer too small keeps the code points that fit and counts the rest */
    tok_stream_init(&s, v);
    n = tok_stream_push(&s, hello, chunk, 3);
    CHECK(n == 3 && memcmp(chunk, "Hel", 3) == 0);
    CHECK_EQ_INT(s.n_dropped, 2);
    n = tok_stream_push(&s, byte_token(v, 0xc3), chunk, sizeof chunk);
    CHECK_EQ_INT(n, 0);
    n = tok_stream_push(&s, byte_token(v, 0xa9), chunk, 1); /* "é" is 2 bytes: dropped whole */
    CHECK_EQ_INT(n, 0);
    CHECK_EQ_INT(s.n_dropped, 4);
    CHECK(tok_stream_max_out(v) >= 3 * 48);

    /* tok_piece: raw token bytes */
    CHECK_EQ_INT(tok_piece(v, hello, chunk, sizeof chunk), 6);
    CHECK(memcmp(chunk, " Hello", 6) == 0);
    CHECK_EQ_INT(tok_piece(v, byte_token(v, 0x0a), chunk, sizeof chunk), 1);
    CHECK_EQ_INT(chunk[0], '\n');
    CHECK_EQ_INT(tok_piece(v, tok_bos(v), chunk, sizeof chunk), 0);
    CHECK_EQ_INT(tok_piece(v, tok_eos(v), chunk, sizeof chunk), 0);
    CHECK_EQ_INT(tok_piece(v, hello, chunk, 2), 6); /* full length, 2 bytes written */
    CHECK_EQ_INT(tok_piece(v, -1, chunk, sizeof chunk), 0);
    CHECK_EQ_INT(tok_piece(v, 32000, chunk, sizeof chunk), 0);
    CHECK_EQ_INT(tok_token_type(v, 1), TOK_TYPE_CONTROL);
    CHECK_EQ_INT(tok_token_type(v, 3), TOK_TYPE_BYTE);
    CHECK(strcmp(tok_type_name(TOK_TYPE_BYTE), "byte") == 0);
    CHECK(strcmp(tok_kind_name(TOK_KIND_SPM), "spm") == 0);
    tok_vocab_free(v);
}

/* ---- 5. error paths ---------------------------------------------------------------- */

/* A "gpt2" vocab is no longer refused: it loads as byte-level BPE (tested in
 * test_tokenizer_bpe.c); other models still are (test_synthetic_vocab). */
static void test_gpt2_model_loads(void) {
    struct llmopt_err err = {0};
    struct gguf_file *f = NULL;
    CHECK_EQ_INT(gguf_open(QWEN2_VOCAB, &f, &err), LLMOPT_OK);
    if (!f) return;
    struct tok_vocab *v = NULL;
    CHECK_EQ_INT(tok_vocab_from_gguf(f, &v, &err), LLMOPT_OK);
    CHECK(v && tok_vocab_kind(v) == TOK_KIND_BPE);
    CHECK(strcmp(tok_kind_name(TOK_KIND_BPE), "bpe") == 0);
    tok_vocab_free(v);
    gguf_close(f);
}

static void test_limits(void) {
    struct tok_vocab *v = load_vocab(LLAMA_SPM_VOCAB);
    CHECK(v);
    if (!v) return;
    struct llmopt_err err = {0};
    int32_t ids[4] = {-7, -7, -7, -7};
    size_t n = 99;
    CHECK_EQ_INT(tok_encode(v, "Hello world", 11, false, false, ids, 1, &n, &err), LLMOPT_ERR_LIMIT);
    CHECK_EQ_INT(n, 2);
    CHECK_EQ_INT(ids[0], 15043); /* the first cap ids are written */
    CHECK_EQ_INT(ids[1], -7);
    CHECK_EQ_INT(tok_encode(v, "Hello world", 11, true, false, ids, 2, &n, &err), LLMOPT_ERR_LIMIT);
    CHECK_EQ_INT(n, 3);
    CHECK_EQ_INT(tok_encode(v, "Hello world", 11, true, false, NULL, 0, &n, &err), LLMOPT_ERR_LIMIT);
    CHECK_EQ_INT(n, 3);
    CHECK_EQ_INT(tok_encode(v, "Hello world", 11, true, false, ids, 3, &n, &err), LLMOPT_OK);
    CHECK_EQ_INT(n, 3);
    CHECK_EQ_INT(tok_encode(v, "", 0, true, false, ids, 4, &n, &err), LLMOPT_OK);
    CHECK_EQ_INT(n, 1);
    CHECK_EQ_INT(tok_encode(v, "", 0, false, false, ids, 4, &n, &err), LLMOPT_OK);
    CHECK_EQ_INT(n, 0);

    /* text over the cap is refused before any work */
    size_t big = (size_t)TOK_MAX_TEXT + 1;
    char *text = malloc(big);
    memset(text, 'a', big);
    CHECK_EQ_INT(tok_encode(v, text, big, false, false, ids, 4, &n, &err), LLMOPT_ERR_LIMIT);
    free(text);

    /* decode into a small buffer: the needed size, and a prefix of whole code points */
    static const int32_t emoji_ids[] = {953, 29877, 2397, 29871, 243, 162, 155, 131};
    char out[16];
    size_t need = 0;
    CHECK_EQ_INT(tok_decode(v, emoji_ids, 8, out, 7, &need, &err), LLMOPT_ERR_LIMIT);
    CHECK_EQ_INT(need, strlen("emoji 😀"));
    CHECK_EQ_INT(tok_decode(v, emoji_ids, 8, out, sizeof out, &need, &err), LLMOPT_OK);
    CHECK(need == strlen("emoji 😀") && memcmp(out, "emoji 😀", need) == 0);
    tok_vocab_free(v);
}

static void kv_u32(struct gguf_builder *b, const char *key, uint32_t val) {
    put_str(b, key);
    put_u32(b, GGUF_TYPE_UINT32);
    put_u32(b, val);
    b->n_kv++;
}
/* An array of n 4-byte elements of GGUF type `type`. */
static void kv_array4(struct gguf_builder *b, const char *key, uint32_t type, const void *xs, size_t n) {
    put_str(b, key);
    put_u32(b, GGUF_TYPE_ARRAY);
    put_u32(b, type);
    put_u64(b, n);
    put(b, xs, 4 * n);
    b->n_kv++;
}
static void kv_i32s(struct gguf_builder *b, const char *key, const int32_t *xs, size_t n) {
    kv_array4(b, key, GGUF_TYPE_INT32, xs, n);
}
static void kv_f32s(struct gguf_builder *b, const char *key, const float *xs, size_t n) {
    kv_array4(b, key, GGUF_TYPE_FLOAT32, xs, n);
}
static const char *const tiny_tokens[] = {"<unk>", "<s>", "</s>", "\xe2\x96\x81", "a", "b",
                                          "ab", ("\xe2\x96\x81" "ab"), "ba"};
static const int32_t tiny_types[] = {2, 3, 3, 1, 1, 1, 1, 1, 1};
static const float tiny_scores[] = {0, 0, 0, -1, -2, -2, -3, -4, -3};

static void tiny_vocab(struct gguf_builder *b, const char *model) {
    builder_start(b);
    kv_str(b, "tokenizer.ggml.model", model);
    kv_strs(b, "tokenizer.ggml.tokens", tiny_tokens, LLMOPT_ARRAY_LEN(tiny_tokens));
    kv_f32s(b, "tokenizer.ggml.scores", tiny_scores, LLMOPT_ARRAY_LEN(tiny_scores));
    kv_i32s(b, "tokenizer.ggml.token_type", tiny_types, LLMOPT_ARRAY_LEN(tiny_types));
}

static void test_synthetic_vocab(void) {
    static struct gguf_builder b;
    struct llmopt_err err = {0};
    struct tok_vocab *v = NULL;

    /* a vocab without byte tokens: unknown characters become unk; ties go leftmost */
    tiny_vocab(&b, "llama");
    kv_u32(&b, "tokenizer.ggml.bos_token_id", 1);
    CHECK_EQ_INT(builder_vocab(&b, &v, &err), LLMOPT_OK);
    if (v) {
        int32_t ids[16];
        size_t n = 0;
        /* "▁abab": "ab" (-3) and "ba" (-3) tie, leftmost "ab" first, then "ab" again;
         * then "▁ab" (-4) */
        CHECK_EQ_INT(tok_encode(v, "abab", 4, false, false, ids, 16, &n, &err), LLMOPT_OK);
        CHECK_EQ_INT(n, 2);
        CHECK_EQ_INT(ids[0], 7);
        CHECK_EQ_INT(ids[1], 6);
        CHECK_EQ_INT(tok_encode(v, "a\xc3\xa9", 3, true, false, ids, 16, &n, &err), LLMOPT_OK);
        CHECK_EQ_INT(n, 4);
        CHECK_EQ_INT(ids[0], 1);
        CHECK_EQ_INT(ids[1], 3);
        CHECK_EQ_INT(ids[2], 4);
        CHECK_EQ_INT(ids[3], 0); /* é: no piece, no byte tokens -> unk */
        CHECK_EQ_INT(tok_eos(v), 2); /* llama.cpp's default for an absent key */
        char out[16];
        CHECK_EQ_INT(tok_piece(v, 0, out, sizeof out), 3); /* unk prints as U+2585 */
        CHECK(memcmp(out, "\xe2\x96\x85", 3) == 0);
        tok_vocab_free(v);
    }

    /* no unk and no byte tokens: an unknown character is an error, not a guess */
    tiny_vocab(&b, "llama");
    kv_u32(&b, "tokenizer.ggml.unknown_token_id", 0xffffffffu); /* not -1: out of range */
    CHECK_EQ_INT(builder_vocab(&b, &v, &err), LLMOPT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "unknown_token_id"), "message: %s", err.msg);

    /* the model string is named in the error */
    tiny_vocab(&b, "bert");
    CHECK_EQ_INT(builder_vocab(&b, &v, &err), LLMOPT_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(err.msg, "\"bert\""), "message: %s", err.msg);

    /* arrays of different lengths */
    builder_start(&b);
    kv_str(&b, "tokenizer.ggml.model", "llama");
    kv_strs(&b, "tokenizer.ggml.tokens", tiny_tokens, LLMOPT_ARRAY_LEN(tiny_tokens));
    kv_f32s(&b, "tokenizer.ggml.scores", tiny_scores, 4);
    CHECK_EQ_INT(builder_vocab(&b, &v, &err), LLMOPT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "scores"), "message: %s", err.msg);

    builder_start(&b);
    kv_str(&b, "tokenizer.ggml.model", "llama");
    kv_strs(&b, "tokenizer.ggml.tokens", tiny_tokens, LLMOPT_ARRAY_LEN(tiny_tokens));
    kv_i32s(&b, "tokenizer.ggml.token_type", tiny_types, 5);
    CHECK_EQ_INT(builder_vocab(&b, &v, &err), LLMOPT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "token_type"), "message: %s", err.msg);

    /* a token type outside the enum */
    static const int32_t bad_types[] = {2, 3, 3, 1, 1, 1, 1, 1, 9};
    builder_start(&b);
    kv_str(&b, "tokenizer.ggml.model", "llama");
    kv_strs(&b, "tokenizer.ggml.tokens", tiny_tokens, LLMOPT_ARRAY_LEN(tiny_tokens));
    kv_i32s(&b, "tokenizer.ggml.token_type", bad_types, LLMOPT_ARRAY_LEN(bad_types));
    CHECK_EQ_INT(builder_vocab(&b, &v, &err), LLMOPT_ERR_FORMAT);

    /* a special id out of range */
    tiny_vocab(&b, "llama");
    kv_u32(&b, "tokenizer.ggml.eos_token_id", 9);
    CHECK_EQ_INT(builder_vocab(&b, &v, &err), LLMOPT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "eos_token_id"), "message: %s", err.msg);

    /* no model key, no tokens, tokens of the wrong type */
    builder_start(&b);
    kv_strs(&b, "tokenizer.ggml.tokens", tiny_tokens, LLMOPT_ARRAY_LEN(tiny_tokens));
    CHECK_EQ_INT(builder_vocab(&b, &v, &err), LLMOPT_ERR_FORMAT);
    builder_start(&b);
    kv_str(&b, "tokenizer.ggml.model", "llama");
    CHECK_EQ_INT(builder_vocab(&b, &v, &err), LLMOPT_ERR_FORMAT);
    builder_start(&b);
    kv_str(&b, "tokenizer.ggml.model", "llama");
    kv_i32s(&b, "tokenizer.ggml.tokens", tiny_types, 3);
    CHECK_EQ_INT(builder_vocab(&b, &v, &err), LLMOPT_ERR_FORMAT);

    /* no BOS in the vocab: add_bos is refused, tok_add_bos says false */
    static const char *const no_specials[] = {"a", "b"};
    builder_start(&b);
    kv_str(&b, "tokenizer.ggml.model", "llama");
    kv_strs(&b, "tokenizer.ggml.tokens", no_specials, 2);
    kv_u32(&b, "tokenizer.ggml.bos_token_id", 0xffffffffu);
    CHECK_EQ_INT(builder_vocab(&b, &v, &err), LLMOPT_ERR_FORMAT);
    builder_start(&b);
    kv_str(&b, "tokenizer.ggml.model", "llama");
    kv_strs(&b, "tokenizer.ggml.tokens", no_specials, 1);
    CHECK_EQ_INT(builder_vocab(&b, &v, &err), LLMOPT_OK);
    if (v) {
        CHECK_EQ_INT(tok_bos(v), -1);
        CHECK_EQ_INT(tok_eos(v), -1);
        CHECK_EQ_INT(tok_unk(v), 0);
        CHECK(!tok_add_bos(v));
        int32_t ids[4];
        size_t n = 0;
        CHECK_EQ_INT(tok_encode(v, "a", 1, true, false, ids, 4, &n, &err), LLMOPT_ERR_INVALID_ARG);
        /* "▁" is not a piece here and there are no byte tokens: unk, then "a" */
        CHECK_EQ_INT(tok_encode(v, "a", 1, false, false, ids, 4, &n, &err), LLMOPT_OK);
        CHECK_EQ_INT(n, 2);
        tok_vocab_free(v);
    }
}

TEST_MAIN(test_reference_encodings_llama_spm, test_reference_encodings_tiny_random,
          test_matches_naive_merges, test_stories260k, test_round_trip_llama,
          test_round_trip_stories260k, test_random_text, test_long_text, test_stream_byte_tokens,
          test_gpt2_model_loads, test_limits, test_synthetic_vocab)
