/* Byte-level BPE, SentencePiece from tokenizer.model, special tokens, end of
 * generation and the loaders' error paths.
 *
 * The vectors in tests/golden/tokenizers/ come from real implementations run by
 * scripts/tokenizer_vectors.py (Hugging Face tokenizers / transformers for the BPE
 * vocabularies, sentencepiece for Llama 2) on the same files loaded here. */
#include "format/gguf.h"
#include "tokenizer/protobuf.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

#include "test.h"
#include "tok_test.h"

#include <jansson.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SHARED         "../shared/"
#define QWEN3_DIR      SHARED "models/qwen3-tokenizer"
#define LLAMA2_MODEL   SHARED "models/llama2-tokenizer/tokenizer.model"
#define QWEN2_GGUF     SHARED "tokenizers/ggml-vocab-qwen2.gguf"
#define LLAMA_BPE_GGUF SHARED "tokenizers/ggml-vocab-llama-bpe.gguf"
#define LLAMA_SPM_GGUF SHARED "tokenizers/ggml-vocab-llama-spm.gguf"
#define GOLDEN         "tests/golden/tokenizers/"

static struct tok_vocab *load(const char *path) {
    struct llmopt_err err = {0};
    struct tok_vocab *v = NULL;
    if (tok_vocab_load(path, &v, &err) != LLMOPT_OK) {
        fprintf(stderr, "  tok_vocab_load %s: %s\n", path, err.msg);
        return NULL;
    }
    return v;
}

static bool same_ids(const int32_t *got, long n, json_t *want) {
    if (n < 0 || (size_t)n != json_array_size(want)) return false;
    for (long k = 0; k < n; k++)
        if (got[k] != json_integer_value(json_array_get(want, (size_t)k))) return false;
    return true;
}

static void print_ids(const char *label, const int32_t *ids, long n) {
    fprintf(stderr, "    %s:", label);
    for (long k = 0; k < n; k++) fprintf(stderr, " %d", ids[k]);
    fputc('\n', stderr);
}

/* ---- 1. reference vectors ----------------------------------------------------------- */

/* Checks every vector of a golden file, both with and without special-token parsing;
 * returns how many texts were checked. */
static size_t check_vectors(const struct tok_vocab *v, const char *golden) {
    json_error_t jerr;
    json_t *root = json_load_file(golden, 0, &jerr);
    CHECK_MSG(root, "%s: %s", golden, jerr.text);
    if (!root) return 0;
    json_t *vectors = json_object_get(root, "vectors");
    CHECK(json_array_size(vectors) >= 300);
    size_t i, failed = 0;
    json_t *c;
    json_array_foreach(vectors, i, c) {
        json_t *text = json_object_get(c, "text");
        const char *s = json_string_value(text);
        size_t len = json_string_length(text);
        for (int special = 1; special >= 0; special--) {
            json_t *want = json_object_get(c, special ? "ids" : "ids_no_special");
            int32_t *ids = NULL;
            long n = encode_ids(v, s, len, false, special, &ids);
            bool ok = same_ids(ids, n, want);
            CHECK_MSG(ok, "%s: vector %zu (special %d) \"%s\"", golden, i, special, s);
            if (!ok && ++failed <= 3) {
                print_ids("got", ids, n);
                char *w = json_dumps(want, JSON_COMPACT);
                fprintf(stderr, "    want: %s\n", w);
                free(w);
            }
            free(ids);
        }
    }
    size_t n = json_array_size(vectors);
    json_decref(root);
    return n;
}

static void test_vectors_qwen3_dir(void) {
    struct tok_vocab *v = load(QWEN3_DIR);
    CHECK(v);
    if (!v) return;
    CHECK_EQ_INT(tok_vocab_kind(v), TOK_KIND_BPE);
    CHECK_EQ_INT(tok_n_tokens(v), 151669);
    size_t n = check_vectors(v, GOLDEN "qwen3-hf.json");
    fprintf(stderr, "  qwen3 (vocab.json + merges.txt): %zu texts x 2 modes\n", n);
    tok_vocab_free(v);
}

static void test_vectors_qwen2_gguf(void) {
    struct tok_vocab *v = load(QWEN2_GGUF);
    CHECK(v);
    if (!v) return;
    CHECK_EQ_INT(tok_vocab_kind(v), TOK_KIND_BPE);
    CHECK(strcmp(tok_pre_name(v), "qwen2") == 0);
    size_t n = check_vectors(v, GOLDEN "qwen2-gguf.json");
    fprintf(stderr, "  qwen2 GGUF: %zu texts x 2 modes\n", n);
    tok_vocab_free(v);
}

static void test_vectors_llama_bpe_gguf(void) {
    struct tok_vocab *v = load(LLAMA_BPE_GGUF);
    CHECK(v);
    if (!v) return;
    CHECK(strcmp(tok_pre_name(v), "llama-bpe") == 0);
    size_t n = check_vectors(v, GOLDEN "llama-bpe-gguf.json");
    fprintf(stderr, "  llama-bpe GGUF: %zu texts x 2 modes\n", n);
    tok_vocab_free(v);
}

static void test_vectors_llama_spm(void) {
    const char *paths[] = {LLAMA2_MODEL, LLAMA_SPM_GGUF};
    for (int p = 0; p < 2; p++) {
        struct tok_vocab *v = load(paths[p]);
        CHECK(v);
        if (!v) continue;
        CHECK_EQ_INT(tok_vocab_kind(v), TOK_KIND_SPM);
        size_t n = check_vectors(v, GOLDEN "llama-spm.json");
        fprintf(stderr, "  llama-spm %s: %zu texts x 2 modes\n", p ? "GGUF" : "tokenizer.model", n);
        tok_vocab_free(v);
    }
}

/* The reference_encodings.json shipped beside the shared files. */
static void check_shared_reference(const char *vocab_path, const char *json_path) {
    struct tok_vocab *v = load(vocab_path);
    CHECK(v);
    if (!v) return;
    json_error_t jerr;
    json_t *root = json_load_file(json_path, 0, &jerr);
    CHECK_MSG(root, "%s: %s", json_path, jerr.text);
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(root, "encodings"), i, c) {
        json_t *text = json_object_get(c, "text");
        int32_t *ids = NULL;
        long n =
            encode_ids(v, json_string_value(text), json_string_length(text), false, true, &ids);
        CHECK_MSG(same_ids(ids, n, json_object_get(c, "ids")), "%s: \"%s\"", vocab_path,
                  json_string_value(text));
        free(ids);
    }
    json_decref(root);
    tok_vocab_free(v);
}

static void test_shared_reference_encodings(void) {
    check_shared_reference(QWEN3_DIR, QWEN3_DIR "/reference_encodings.json");
    check_shared_reference(LLAMA2_MODEL, SHARED "models/llama2-tokenizer/reference_encodings.json");
    check_shared_reference(LLAMA_SPM_GGUF,
                           SHARED "models/llama2-tokenizer/reference_encodings.json");
}

/* tokenizer.model and the converted GGUF hold the same vocabulary. */
static void test_spm_model_equals_gguf(void) {
    struct tok_vocab *a = load(LLAMA2_MODEL), *b = load(LLAMA_SPM_GGUF);
    CHECK(a && b);
    if (a && b) {
        CHECK_EQ_INT(tok_n_tokens(a), tok_n_tokens(b));
        int diffs = 0;
        for (int32_t id = 0; id < tok_n_tokens(a) && id < tok_n_tokens(b); id++) {
            size_t la, lb;
            const char *pa = tok_token_text(a, id, &la), *pb = tok_token_text(b, id, &lb);
            diffs += la != lb || memcmp(pa, pb, la) != 0 ||
                     tok_token_score(a, id) != tok_token_score(b, id) ||
                     tok_token_type(a, id) != tok_token_type(b, id);
        }
        CHECK_EQ_INT(diffs, 0);
        CHECK_EQ_INT(tok_bos(a), tok_bos(b));
        CHECK_EQ_INT(tok_eos(a), tok_eos(b));
        CHECK_EQ_INT(tok_unk(a), tok_unk(b));
        CHECK_EQ_INT(tok_add_bos(a), tok_add_bos(b));
    }
    tok_vocab_free(a);
    tok_vocab_free(b);
}

/* ---- 2. tokenizer.json ------------------------------------------------------------ */

static char tmp_root[64];

static const char *tmp_dir(void) {
    if (!tmp_root[0]) {
        snprintf(tmp_root, sizeof tmp_root, "/tmp/llmopt_tok_XXXXXX");
        LLMOPT_ASSERT(mkdtemp(tmp_root));
    }
    return tmp_root;
}

static void write_text(const char *dir, const char *name, const char *text) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    LLMOPT_ASSERT(f);
    fputs(text, f);
    fclose(f);
}

static void remove_files(const char *dir) {
    const char *names[] = {"tokenizer.json", "tokenizer_config.json", "vocab.json",
                           "merges.txt",     "tokenizer.model",       "generation_config.json"};
    char path[256];
    for (size_t i = 0; i < LLMOPT_ARRAY_LEN(names); i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
}

/* A tokenizer.json made from the Qwen3 files (the shape Hugging Face writes). */
static json_t *qwen3_tokenizer_json(bool merge_pairs) {
    json_error_t jerr;
    json_t *vocab = json_load_file(QWEN3_DIR "/vocab.json", 0, &jerr);
    json_t *config = json_load_file(QWEN3_DIR "/tokenizer_config.json", 0, &jerr);
    LLMOPT_ASSERT(vocab && config);
    FILE *f = fopen(QWEN3_DIR "/merges.txt", "rb");
    LLMOPT_ASSERT(f);
    json_t *merges = json_array();
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        size_t n = strcspn(line, "\r\n");
        line[n] = 0;
        if (!n || line[0] == '#') continue;
        if (merge_pairs) {
            char *sp = strchr(line + 1, ' ');
            *sp = 0;
            json_array_append_new(merges, json_pack("[ss]", line, sp + 1));
        } else {
            json_array_append_new(merges, json_string(line));
        }
    }
    fclose(f);
    json_t *added = json_array();
    const char *key;
    json_t *tok;
    json_object_foreach(json_object_get(config, "added_tokens_decoder"), key, tok) {
        json_t *a = json_deep_copy(tok);
        json_object_set_new(a, "id", json_integer(atoll(key)));
        json_array_append_new(added, a);
    }
    json_t *root = json_pack(
        "{s:o, s:{s:s}, s:{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]},"
        " s:{s:s, s:b}, s:{s:s, s:o, s:o, s:b}}",
        "added_tokens", added, "normalizer", "type", "NFC", "pre_tokenizer", "type", "Sequence",
        "pretokenizers", "type", "Split", "pattern", "Regex",
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
        "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        "behavior", "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space", 0,
        "trim_offsets", 0, "use_regex", 0, "decoder", "type", "ByteLevel", "add_prefix_space", 0,
        "model", "type", "BPE", "vocab", vocab, "merges", merges, "ignore_merges", 0);
    LLMOPT_ASSERT(root);
    json_decref(config);
    return root;
}

static void test_tokenizer_json(void) {
    const char *dir = tmp_dir();
    char path[256];
    for (int pairs = 0; pairs < 2; pairs++) {
        remove_files(dir);
        json_t *root = qwen3_tokenizer_json(pairs);
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        CHECK_EQ_INT(json_dump_file(root, path, JSON_COMPACT), 0);
        json_decref(root);
        write_text(dir, "tokenizer_config.json", "{\"eos_token\": \"<|im_end|>\"}");
        write_text(dir, "generation_config.json", "{\"eos_token_id\": [151643, 151645]}");
        struct tok_vocab *v = load(dir);
        CHECK(v);
        if (!v) continue;
        CHECK(strcmp(tok_pre_name(v), "tokenizer.json") == 0);
        size_t n = check_vectors(v, GOLDEN "qwen3-hf.json");
        fprintf(stderr, "  qwen3 tokenizer.json (merges as %s): %zu texts x 2 modes\n",
                pairs ? "pairs" : "strings", n);
        CHECK(tok_is_eog(v, 151645) && tok_is_eog(v, 151643) && !tok_is_eog(v, 151644));
        tok_vocab_free(v);
    }
    remove_files(dir);
}

/* ---- 3. round trips and streaming --------------------------------------------------- */

static const char *const corpus[] = {
    "Hello world",
    " leading space and  double  spaces",
    "tabs\tand\nnewlines\n\n",
    "日本語のテキスト",
    "emoji 😀👍🏽 👨‍👩‍👧‍👦 🇫🇷",
    "café naïve résumé Zürich",
    "can't won't I'm",
    "<|im_start|>user\nhi<|im_end|>",
    "<think>x</think>",
    "   \n\n   \t",
    "12345678901234567890",
    "\xf0\x9f\x98",     /* a truncated 4-byte sequence */
    "a\xff\xfe b \xc3", /* invalid bytes */
    "ꙮ 𝕳𝖊𝖑𝖑𝖔 𓀀 ᚠᛇᚻ",    /* rare characters split over several tokens */
};

static void round_trip(const char *path) {
    struct tok_vocab *v = load(path);
    CHECK(v);
    if (!v) return;
    for (size_t i = 0; i < LLMOPT_ARRAY_LEN(corpus); i++) {
        const char *s = corpus[i];
        size_t len = strlen(s);
        int32_t *ids = NULL;
        long n = encode_ids(v, s, len, false, false, &ids);
        CHECK(n >= 0);
        if (n < 0) continue;
        /* the bytes of the pieces give back the text exactly, valid UTF-8 or not */
        size_t total = 0;
        char buf[1024];
        char *bytes = malloc(4 * len + sizeof buf);
        for (long k = 0; k < n; k++) {
            size_t m = tok_piece(v, ids[k], buf, sizeof buf);
            CHECK(m <= sizeof buf);
            memcpy(bytes + total, buf, m);
            total += m;
        }
        CHECK_MSG(total == len && memcmp(bytes, s, len) == 0, "%s: pieces of \"%s\"", path, s);
        free(bytes);

        /* decode == text for valid UTF-8; streaming emits only whole code points */
        size_t dlen = 0;
        char *d = decode(v, ids, (size_t)n, &dlen);
        if (utf8_valid(s, len))
            CHECK_MSG(dlen == len && memcmp(d, s, len) == 0, "%s: decode(\"%s\") = \"%s\"", path, s,
                      d);
        else
            CHECK(utf8_valid(d, dlen)); /* invalid bytes became U+FFFD */
        struct tok_stream st;
        tok_stream_init(&st, v);
        size_t cap = tok_stream_max_out(v);
        char *chunk = malloc(cap), *all = malloc(dlen + 8);
        size_t all_n = 0;
        for (long k = 0; k < n; k++) {
            size_t m = tok_stream_push(&st, ids[k], chunk, cap);
            CHECK_MSG(utf8_valid(chunk, m), "%s: chunk after id %d of \"%s\"", path, ids[k], s);
            memcpy(all + all_n, chunk, m);
            all_n += m;
        }
        size_t m = tok_stream_flush(&st, chunk, cap);
        memcpy(all + all_n, chunk, m);
        all_n += m;
        CHECK_EQ_INT(st.n_dropped, 0);
        CHECK(all_n == dlen && memcmp(all, d, dlen) == 0);
        free(chunk);
        free(all);
        free(d);
        free(ids);
    }
    tok_vocab_free(v);
}

static void test_round_trip(void) {
    round_trip(QWEN3_DIR);
    round_trip(QWEN2_GGUF);
    round_trip(LLAMA_BPE_GGUF);
}

/* Every golden text decodes back (plain mode keeps control tokens as text). */
static void test_round_trip_vectors(void) {
    const char *pairs[][2] = {{QWEN3_DIR, GOLDEN "qwen3-hf.json"},
                              {LLAMA_BPE_GGUF, GOLDEN "llama-bpe-gguf.json"}};
    for (size_t p = 0; p < LLMOPT_ARRAY_LEN(pairs); p++) {
        struct tok_vocab *v = load(pairs[p][0]);
        json_t *root = json_load_file(pairs[p][1], 0, NULL);
        CHECK(v && root);
        if (!v || !root) {
            tok_vocab_free(v);
            json_decref(root);
            continue;
        }
        size_t i, bad = 0;
        json_t *c;
        json_array_foreach(json_object_get(root, "vectors"), i, c) {
            json_t *text = json_object_get(c, "text");
            const char *s = json_string_value(text);
            size_t len = json_string_length(text);
            int32_t *ids = NULL;
            long n = encode_ids(v, s, len, false, false, &ids);
            size_t dlen = 0;
            char *d = decode(v, ids, n > 0 ? (size_t)n : 0, &dlen);
            /* NFC may recompose: compare with the text only where it is unchanged */
            bool nfc_text = strstr(s, "\xcc\x81") || strstr(s, "\xcc\x8a") || strstr(s, "\xe1\x84");
            if (!nfc_text && (dlen != len || memcmp(d, s, len) != 0) && ++bad <= 3)
                CHECK_MSG(false, "%s: round trip of \"%s\" gave \"%s\"", pairs[p][0], s, d);
            free(d);
            free(ids);
        }
        CHECK_EQ_INT(bad, 0);
        json_decref(root);
        tok_vocab_free(v);
    }
}

/* ---- 4. special tokens, eog, bos ------------------------------------------------------ */

static void expect_ids(const struct tok_vocab *v, const char *s, bool special, const int32_t *want,
                       long n_want) {
    int32_t *ids = NULL;
    long n = encode_ids(v, s, strlen(s), false, special, &ids);
    bool ok = n == n_want;
    for (long k = 0; ok && k < n; k++) ok = ids[k] == want[k];
    CHECK_MSG(ok, "\"%s\" (special %d)", s, special);
    if (!ok) print_ids("got", ids, n);
    free(ids);
}

static bool contains(const int32_t *ids, long n, int32_t id) {
    for (long k = 0; k < n; k++)
        if (ids[k] == id) return true;
    return false;
}

static void test_special_tokens(void) {
    struct tok_vocab *v = load(QWEN3_DIR);
    CHECK(v);
    if (v) {
        const int32_t chat[] = {151644, 872, 198, 6023, 151645};
        expect_ids(v, "<|im_start|>user\nhi<|im_end|>", true, chat, 5);
        int32_t *ids = NULL;
        long n = encode_ids(v, "<|im_start|>user\nhi<|im_end|>", 29, false, false, &ids);
        CHECK(n > 5 && !contains(ids, n, 151644) && !contains(ids, n, 151645));
        free(ids);
        /* user-defined added tokens (special: false) split out either way */
        const int32_t think[] = {151667, 87, 151668};
        expect_ids(v, "<think>x</think>", true, think, 3);
        expect_ids(v, "<think>x</think>", false, think, 3);
        /* adjacent, nested in text, partial */
        const int32_t two[] = {151644, 151645};
        expect_ids(v, "<|im_start|><|im_end|>", true, two, 2);
        n = encode_ids(v, "<|im_start", 10, false, true, &ids);
        CHECK(n > 0 && !contains(ids, n, 151644));
        free(ids);
        tok_vocab_free(v);
    }

    /* longest match first: <|reserved_special_token_50|> is not _5|> + "0|>" */
    v = load(LLAMA_BPE_GGUF);
    CHECK(v);
    if (v) {
        int32_t id5 = tok_find(v, "<|reserved_special_token_5|>", 28);
        int32_t id50 = tok_find(v, "<|reserved_special_token_50|>", 29);
        CHECK(id5 >= 0 && id50 >= 0 && id5 != id50);
        expect_ids(v, "<|reserved_special_token_50|>", true, &id50, 1);
        expect_ids(v, "<|reserved_special_token_5|>", true, &id5, 1);
        const int32_t hdr[] = {128006, 882, 128007, 271, 9906, 128009};
        expect_ids(v, "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>", true, hdr, 6);
        tok_vocab_free(v);
    }

    /* SentencePiece: "<s>" is BOS only when parsing specials; each fragment gets the
     * dummy prefix */
    v = load(LLAMA2_MODEL);
    CHECK(v);
    if (v) {
        int32_t *ids = NULL;
        long n = encode_ids(v, "<s>Hi</s>", 9, false, true, &ids);
        CHECK(n >= 3 && ids[0] == 1 && ids[n - 1] == 2);
        free(ids);
        n = encode_ids(v, "<s>Hi</s>", 9, false, false, &ids);
        CHECK(n > 3 && !contains(ids, n, 1) && !contains(ids, n, 2));
        free(ids);
        tok_vocab_free(v);
    }
}

static void test_eog_and_bos(void) {
    struct tok_vocab *v = load(QWEN3_DIR);
    CHECK(v);
    if (v) {
        CHECK_EQ_INT(tok_eos(v), 151645); /* eos_token of tokenizer_config.json */
        CHECK_EQ_INT(tok_bos(v), -1);
        CHECK(!tok_add_bos(v));
        CHECK(tok_is_eog(v, 151645));  /* <|im_end|> */
        CHECK(tok_is_eog(v, 151643));  /* <|endoftext|> */
        CHECK(!tok_is_eog(v, 151644)); /* <|im_start|> */
        CHECK(!tok_is_eog(v, 9707));
        const int32_t *eog;
        CHECK_EQ_INT(tok_eog_ids(v, &eog), 2);
        tok_vocab_free(v);
    }
    v = load(LLAMA_BPE_GGUF);
    CHECK(v);
    if (v) {
        CHECK_EQ_INT(tok_bos(v), 128000);
        CHECK(tok_add_bos(v));        /* the Llama 3 pre-tokenizer family adds BOS */
        CHECK(tok_is_eog(v, 128001)); /* <|end_of_text|> (eos) */
        CHECK(tok_is_eog(v, 128009)); /* <|eot_id|> */
        CHECK(!tok_is_eog(v, 128000));
        int32_t ids[8];
        size_t n = 0;
        struct llmopt_err err;
        CHECK_EQ_INT(tok_encode(v, "Hello world", 11, true, true, ids, 8, &n, &err), LLMOPT_OK);
        CHECK(n == 3 && ids[0] == 128000 && ids[1] == 9906 && ids[2] == 1917);
        tok_vocab_free(v);
    }
    v = load(QWEN2_GGUF);
    CHECK(v);
    if (v) {
        CHECK(!tok_add_bos(v));
        CHECK(tok_is_eog(v, 151643) && tok_is_eog(v, 151645));
        tok_vocab_free(v);
    }
    v = load(LLAMA2_MODEL);
    CHECK(v);
    if (v) {
        CHECK(tok_add_bos(v));
        CHECK(tok_is_eog(v, 2) && !tok_is_eog(v, 1) && !tok_is_eog(v, 0));
        tok_vocab_free(v);
    }
}

/* ---- 5. merging against a naive oracle ----------------------------------------------- */

/* Repeatedly merges the lowest-ranked pair (leftmost on ties) by rescanning. */
static size_t naive_bpe(const struct tok_vocab *v, const uint8_t *w, size_t n, int32_t *out) {
    for (size_t i = 0; i < n; i++) out[i] = v->byte_ids[w[i]];
    for (;;) {
        long best = -1;
        uint32_t best_rank = UINT32_MAX;
        for (size_t i = 0; i + 1 < n; i++) {
            const struct tok_merge *m = tok_merge_find(v, out[i], out[i + 1]);
            if (m && m->rank < best_rank) {
                best = (long)i;
                best_rank = m->rank;
            }
        }
        if (best < 0) return n;
        out[best] = tok_merge_find(v, out[best], out[best + 1])->result;
        memmove(out + best + 1, out + best + 2, (n - (size_t)best - 2) * sizeof *out);
        n--;
    }
}

static void test_matches_naive_merges(void) {
    struct tok_vocab *v = load(QWEN2_GGUF);
    CHECK(v);
    if (!v) return;
    /* words that stay one pre-token: letters only, after an optional space */
    static const char *const parts[] = {"a",   "b", "e", "r",  "t",  "h",  "in", "on", "er",
                                        "the", "é", "ß", "日", "本", "語", "ab", "aa"};
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    char text[256];
    int32_t got[512], want[512];
    for (int round = 0; round < 400; round++) {
        size_t len = 0;
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        if ((rng >> 40) & 1) text[len++] = ' ';
        int n_parts = 1 + (int)((rng >> 33) % 30);
        for (int p = 0; p < n_parts; p++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            const char *a = parts[(rng >> 33) % LLMOPT_ARRAY_LEN(parts)];
            memcpy(text + len, a, strlen(a));
            len += strlen(a);
        }
        size_t n = 0;
        struct llmopt_err err;
        CHECK_EQ_INT(tok_encode(v, text, len, false, false, got, 512, &n, &err), LLMOPT_OK);
        size_t nw = naive_bpe(v, (const uint8_t *)text, len, want);
        bool same = n == nw;
        for (size_t i = 0; same && i < n; i++) same = got[i] == want[i];
        CHECK_MSG(same, "round %d: \"%.*s\"", round, (int)len, text);
    }
    tok_vocab_free(v);
}

/* Cutting SentencePiece text before "▁" (spm_chunks) changes nothing. */
static void test_spm_chunks_change_nothing(void) {
    struct tok_vocab *v = load(LLAMA2_MODEL);
    CHECK(v);
    if (!v) return;
    CHECK(v->spm_chunks);
    static const char *const parts[] = {"a",   "the",  " ",    "  ",   "   ",  "\n", "\xe2\x96\x81",
                                        "x",   "\xf0", "\xe2", "\xff", "日本", "é",  "1",
                                        "<s>", ".",    "in"};
    uint64_t rng = 12345;
    char text[512];
    int32_t a[1024], b[1024];
    for (int round = 0; round < 500; round++) {
        size_t len = 0;
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int n_parts = 1 + (int)((rng >> 33) % 40);
        for (int p = 0; p < n_parts; p++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            const char *s = parts[(rng >> 33) % LLMOPT_ARRAY_LEN(parts)];
            memcpy(text + len, s, strlen(s));
            len += strlen(s);
        }
        size_t na = 0, nb = 0;
        struct llmopt_err err;
        v->spm_chunks = true;
        CHECK_EQ_INT(tok_encode(v, text, len, false, true, a, 1024, &na, &err), LLMOPT_OK);
        v->spm_chunks = false;
        CHECK_EQ_INT(tok_encode(v, text, len, false, true, b, 1024, &nb, &err), LLMOPT_OK);
        bool same = na == nb;
        for (size_t i = 0; same && i < na; i++) same = a[i] == b[i];
        CHECK_MSG(same, "round %d: \"%.*s\"", round, (int)len, text);
    }
    tok_vocab_free(v);
}

static void test_nfc(void) {
    static const char *const cases[][2] = {
        {"cafe\xcc\x81", "caf\xc3\xa9"},                          /* e + acute -> é */
        {"A\xcc\x8a", "\xc3\x85"},                                /* A + ring -> Å */
        {"\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", "\xea\xb0\x81"}, /* jamo -> 각 */
        {"a\xcc\xa3\xcc\x81", "\xe1\xba\xa1\xcc\x81"},            /* dot below sorts first */
        {"a\xcc\x81\xcc\xa3", "\xe1\xba\xa1\xcc\x81"},            /* reordered, then composed */
        {"\xe0\xa5\x98", "\xe0\xa4\x95\xe0\xa4\xbc"},             /* U+0958 is excluded */
        {"x\xff\xcc\x81y", "x\xff\xcc\x81y"},                     /* invalid byte blocks */
        {"\xe2\x84\xab", "\xc3\x85"},                             /* angstrom sign -> Å */
    };
    for (size_t i = 0; i < LLMOPT_ARRAY_LEN(cases); i++) {
        char *out = NULL;
        size_t n = 0;
        struct llmopt_err err;
        CHECK_EQ_INT(tok_nfc(cases[i][0], strlen(cases[i][0]), &out, &n, &err), LLMOPT_OK);
        CHECK_MSG(n == strlen(cases[i][1]) && memcmp(out, cases[i][1], n) == 0, "case %zu", i);
        free(out);
    }
    CHECK(!tok_nfc_needed("plain ascii é ß", 17));
    CHECK(tok_nfc_needed("e\xcc\x81", 3));
}

/* ---- 6. error paths --------------------------------------------------------------- */

/* "a", "b", "ab", "abb" plus the byte-level spellings of ' ' and a few bytes. */
static const char *const bpe_tokens[] = {"a",        "b",        "ab", "abb",
                                         "\xc4\xa0", "\304\240a" /* U+0120 (GPT-2's space) in UTF-8, then "a" */};

static void tiny_bpe(struct gguf_builder *b, const char *pre, const char *const *merges,
                     size_t n_merges) {
    builder_start(b);
    kv_str(b, "tokenizer.ggml.model", "gpt2");
    if (pre) kv_str(b, "tokenizer.ggml.pre", pre);
    kv_strs(b, "tokenizer.ggml.tokens", bpe_tokens, LLMOPT_ARRAY_LEN(bpe_tokens));
    if (merges) kv_strs(b, "tokenizer.ggml.merges", merges, n_merges);
}

static void test_gguf_bpe_errors(void) {
    static struct gguf_builder b;
    struct llmopt_err err = {0};
    struct tok_vocab *v = NULL;
    static const char *const good[] = {"a b", "ab b", "\xc4\xa0 a"};

    tiny_bpe(&b, "gpt2", good, 3);
    CHECK_EQ_INT(builder_vocab(&b, &v, &err), LLMOPT_OK);
    if (v) {
        int32_t ids[8];
        size_t n = 0;
        /* "abb": a+b (rank 0), then ab+b (rank 1). " abb": a+b goes before Ġ+a (rank 2),
         * which is then stale: "Ġ" "abb" */
        CHECK_EQ_INT(tok_encode(v, "abb", 3, false, false, ids, 8, &n, &err), LLMOPT_OK);
        CHECK(n == 1 && ids[0] == 3);
        CHECK_EQ_INT(tok_encode(v, " abb", 4, false, false, ids, 8, &n, &err), LLMOPT_OK);
        CHECK(n == 2 && ids[0] == 4 && ids[1] == 3);
        CHECK_EQ_INT(tok_encode(v, " a", 2, false, false, ids, 8, &n, &err), LLMOPT_OK);
        CHECK(n == 1 && ids[0] == 5);
        /* a byte with no token and no unk: a clear error */
        CHECK_EQ_INT(tok_encode(v, "c", 1, false, false, ids, 8, &n, &err), LLMOPT_ERR_UNSUPPORTED);
        CHECK_MSG(strstr(err.msg, "0x63"), "message: %s", err.msg);
        tok_vocab_free(v);
    }

    /* absent pre: GPT-2's regex */
    tiny_bpe(&b, NULL, good, 3);
    CHECK_EQ_INT(builder_vocab(&b, &v, &err), LLMOPT_OK);
    tok_vocab_free(v);

    tiny_bpe(&b, "no-such-pre", good, 3);
    CHECK_EQ_INT(builder_vocab(&b, &v, &err), LLMOPT_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(err.msg, "\"no-such-pre\"") && strstr(err.msg, "tokenizer.ggml.pre"),
              "message: %s", err.msg);

    static const char *const no_space[] = {"a b", "abb"};
    tiny_bpe(&b, "gpt2", no_space, 2);
    CHECK_EQ_INT(builder_vocab(&b, &v, &err), LLMOPT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "merges[1]") && strstr(err.msg, "\"abb\""), "message: %s", err.msg);

    static const char *const unknown_piece[] = {"a b", "a zz"};
    tiny_bpe(&b, "gpt2", unknown_piece, 2);
    CHECK_EQ_INT(builder_vocab(&b, &v, &err), LLMOPT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "merge 1") && strstr(err.msg, "\"zz\""), "message: %s", err.msg);

    static const char *const no_result[] = {"b a"}; /* "ba" is not a piece */
    tiny_bpe(&b, "gpt2", no_result, 1);
    CHECK_EQ_INT(builder_vocab(&b, &v, &err), LLMOPT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "merged piece"), "message: %s", err.msg);

    tiny_bpe(&b, "gpt2", NULL, 0);
    CHECK_EQ_INT(builder_vocab(&b, &v, &err), LLMOPT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "tokenizer.ggml.merges"), "message: %s", err.msg);
}

/* Protobuf bytes for a ModelProto built by hand. */
struct pb_buf {
    uint8_t b[4096];
    size_t n;
};
static void pb_varint(struct pb_buf *p, uint64_t x) {
    do {
        p->b[p->n++] = (uint8_t)((x & 0x7f) | (x > 0x7f ? 0x80 : 0));
        x >>= 7;
    } while (x);
}
static void pb_key(struct pb_buf *p, uint32_t field, uint32_t wire) {
    pb_varint(p, (uint64_t)field << 3 | wire);
}
static void pb_bytes_field(struct pb_buf *p, uint32_t field, const void *data, size_t n) {
    pb_key(p, field, 2);
    pb_varint(p, n);
    memcpy(p->b + p->n, data, n);
    p->n += n;
}
static void pb_piece(struct pb_buf *p, const char *piece, float score, int type) {
    struct pb_buf m = {.n = 0};
    pb_bytes_field(&m, 1, piece, strlen(piece));
    pb_key(&m, 2, 5);
    memcpy(m.b + m.n, &score, 4);
    m.n += 4;
    pb_key(&m, 3, 0);
    pb_varint(&m, (uint64_t)type);
    pb_bytes_field(p, 1, m.b, m.n);
}
static void pb_trainer(struct pb_buf *p, int model_type, bool byte_fallback) {
    struct pb_buf m = {.n = 0};
    pb_key(&m, 3, 0);
    pb_varint(&m, (uint64_t)model_type);
    pb_key(&m, 35, 0);
    pb_varint(&m, byte_fallback);
    pb_key(&m, 43, 0);
    pb_varint(&m, (uint64_t)(int64_t)-1); /* pad_id -1: a 10-byte varint */
    pb_bytes_field(p, 2, m.b, m.n);
}
static void tiny_model(struct pb_buf *p, int model_type) {
    p->n = 0;
    pb_piece(p, "<unk>", 0, 2);
    pb_piece(p, "<s>", 0, 3);
    pb_piece(p, "</s>", 0, 3);
    pb_piece(p, "\xe2\x96\x81", -1, 1);
    pb_piece(p, "a", -2, 1);
    pb_piece(p,
             "\xe2\x96\x81"
             "a",
             -1.5f, 1);
    pb_trainer(p, model_type, false);
}

static void test_spm_model_errors(void) {
    struct llmopt_err err = {0};
    struct tok_vocab *v = NULL;
    static struct pb_buf p;

    tiny_model(&p, 2);
    CHECK_EQ_INT(tok_vocab_from_spm_model(p.b, p.n, &v, &err), LLMOPT_OK);
    if (v) {
        int32_t ids[8];
        size_t n = 0;
        CHECK_EQ_INT(tok_pad(v), -1);
        CHECK_EQ_INT(tok_encode(v, "a b", 3, true, false, ids, 8, &n, &err), LLMOPT_OK);
        /* <s> "▁a" "▁" <unk>(b: no byte fallback) */
        CHECK(n == 4 && ids[0] == 1 && ids[1] == 5 && ids[2] == 3 && ids[3] == 0);
        tok_vocab_free(v);
    }

    tiny_model(&p, 1);
    CHECK_EQ_INT(tok_vocab_from_spm_model(p.b, p.n, &v, &err), LLMOPT_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(err.msg, "unigram"), "message: %s", err.msg);

    /* truncated anywhere inside: an error, never a crash (sanitizers watch) */
    tiny_model(&p, 2);
    for (size_t cut = 1; cut < p.n; cut++) {
        enum llmopt_status st = tok_vocab_from_spm_model(p.b, cut, &v, &err);
        if (st == LLMOPT_OK) tok_vocab_free(v);
        CHECK_MSG(st != LLMOPT_OK, "cut at %zu of %zu loaded", cut, p.n);
    }
    /* cut inside the first piece's bytes: the length is named */
    CHECK_EQ_INT(tok_vocab_from_spm_model(p.b, 5, &v, &err), LLMOPT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "truncated") && strstr(err.msg, "offset 0"), "message: %s", err.msg);

    /* a varint of 11 bytes, a group wire type, field 0 */
    static const uint8_t long_varint[] = {0x08, 0xff, 0xff, 0xff, 0xff, 0xff,
                                          0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    CHECK_EQ_INT(tok_vocab_from_spm_model(long_varint, sizeof long_varint, &v, &err),
                 LLMOPT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "varint"), "message: %s", err.msg);
    static const uint8_t group[] = {0x0b, 0x0c};
    CHECK_EQ_INT(tok_vocab_from_spm_model(group, sizeof group, &v, &err), LLMOPT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "wire type 3"), "message: %s", err.msg);
    static const uint8_t field0[] = {0x00, 0x00};
    CHECK_EQ_INT(tok_vocab_from_spm_model(field0, sizeof field0, &v, &err), LLMOPT_ERR_FORMAT);
    CHECK_EQ_INT(tok_vocab_from_spm_model(NULL, 0, &v, &err), LLMOPT_ERR_FORMAT);

    /* a piece with a string where a float belongs */
    struct pb_buf bad = {.n = 0}, piece = {.n = 0};
    pb_bytes_field(&piece, 1, "x", 1);
    pb_bytes_field(&piece, 2, "yyyy", 4);
    pb_bytes_field(&bad, 1, piece.b, piece.n);
    CHECK_EQ_INT(tok_vocab_from_spm_model(bad.b, bad.n, &v, &err), LLMOPT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "float"), "message: %s", err.msg);

    /* the real model, truncated at a few places */
    FILE *f = fopen(LLAMA2_MODEL, "rb");
    CHECK(f);
    if (f) {
        static uint8_t data[1 << 20];
        size_t size = fread(data, 1, sizeof data, f);
        fclose(f);
        size_t cuts[] = {1, 2, 3, 100, 4097, size / 2, size - 1};
        for (size_t i = 0; i < LLMOPT_ARRAY_LEN(cuts); i++) {
            enum llmopt_status st = tok_vocab_from_spm_model(data, cuts[i], &v, &err);
            if (st == LLMOPT_OK) tok_vocab_free(v);
            CHECK_MSG(st != LLMOPT_OK, "cut at %zu", cuts[i]);
        }
        for (size_t i = 0; i < 64; i++) tok_fuzz_spm_model(data, size - i * 7);
    }
}

static void test_hf_dir_errors(void) {
    const char *dir = tmp_dir();
    struct tok_vocab *v = NULL;
    struct llmopt_err err = {0};
    static const char vocab[] = "{\"a\": 0, \"b\": 1, \"ab\": 2, \"\\u0120\": 3}";

    remove_files(dir);
    CHECK_EQ_INT(tok_vocab_from_dir(dir, &v, &err), LLMOPT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "tokenizer.json"), "message: %s", err.msg);

    /* vocab.json + merges.txt: the class names the pre-tokenizer */
    write_text(dir, "vocab.json", vocab);
    write_text(dir, "merges.txt", "#version: 0.2\na b\n");
    write_text(dir, "tokenizer_config.json", "{\"tokenizer_class\": \"GPT2Tokenizer\"}");
    CHECK_EQ_INT(tok_vocab_from_dir(dir, &v, &err), LLMOPT_OK);
    if (v) {
        int32_t ids[4];
        size_t n = 0;
        CHECK_EQ_INT(tok_encode(v, "ab", 2, false, true, ids, 4, &n, &err), LLMOPT_OK);
        CHECK(n == 1 && ids[0] == 2);
        tok_vocab_free(v);
    }
    write_text(dir, "tokenizer_config.json", "{\"tokenizer_class\": \"MysteryTokenizer\"}");
    CHECK_EQ_INT(tok_vocab_from_dir(dir, &v, &err), LLMOPT_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(err.msg, "MysteryTokenizer"), "message: %s", err.msg);
    write_text(dir, "tokenizer_config.json", "{\"tokenizer_class\": \"GPT2Tokenizer\"}");
    write_text(dir, "merges.txt", "#version: 0.2\na b\nab\n");
    CHECK_EQ_INT(tok_vocab_from_dir(dir, &v, &err), LLMOPT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "merges.txt") && strstr(err.msg, "\"ab\""), "message: %s", err.msg);
    write_text(dir, "vocab.json", "{\"a\": 0, \"b\": 0}");
    write_text(dir, "merges.txt", "a b\n");
    CHECK_EQ_INT(tok_vocab_from_dir(dir, &v, &err), LLMOPT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "id 0"), "message: %s", err.msg);
    write_text(dir, "vocab.json", "{\"a\": 0, \"b\": ");
    CHECK_EQ_INT(tok_vocab_from_dir(dir, &v, &err), LLMOPT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "vocab.json") && strstr(err.msg, "line"), "message: %s", err.msg);
    remove_files(dir);

    /* tokenizer.json: what is not supported is named */
    static const char *const bad[][2] = {
        {"{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}, \"pre_tokenizer\": "
         "{\"type\": \"ByteLevel\"}}",
         "WordPiece"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
         "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": "
         "\"Whitespace\"}, {\"type\": \"ByteLevel\"}]}}",
         "Whitespace"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
         "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
         "\"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Removed\"}, {\"type\": "
         "\"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]}}",
         "Removed"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
         "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
         "\"pattern\": {\"Regex\": \"(unclosed\"}, \"behavior\": \"Isolated\"}, {\"type\": "
         "\"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]}}",
         "does not compile"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
         "\"normalizer\": {\"type\": \"Lowercase\"}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
         "Lowercase"},
    };
    for (size_t i = 0; i < LLMOPT_ARRAY_LEN(bad); i++) {
        write_text(dir, "tokenizer.json", bad[i][0]);
        enum llmopt_status st = tok_vocab_from_dir(dir, &v, &err);
        CHECK_MSG(st == LLMOPT_ERR_UNSUPPORTED || st == LLMOPT_ERR_FORMAT, "case %zu: %d", i, st);
        if (st == LLMOPT_OK) tok_vocab_free(v);
        CHECK_MSG(strstr(err.msg, bad[i][1]), "case %zu: %s", i, err.msg);
        tok_fuzz_hf_json((const uint8_t *)bad[i][0], strlen(bad[i][0]));
    }
    remove_files(dir);
    rmdir(dir);
}

static void test_limits(void) {
    struct tok_vocab *v = load(QWEN2_GGUF);
    CHECK(v);
    if (!v) return;
    struct llmopt_err err;
    int32_t ids[4];
    size_t n = 0;
    CHECK_EQ_INT(tok_encode(v, "Hello world", 11, false, true, ids, 1, &n, &err), LLMOPT_ERR_LIMIT);
    CHECK_EQ_INT(n, 2);
    CHECK_EQ_INT(ids[0], 9707);
    size_t big = (size_t)TOK_MAX_TEXT + 1;
    char *text = malloc(big);
    memset(text, ' ', big);
    CHECK_EQ_INT(tok_encode(v, text, big, false, true, ids, 4, &n, &err), LLMOPT_ERR_LIMIT);
    /* one long word (a whitespace run, then letters): O(n log n) merging */
    size_t len = 1 << 20, cap = len + 8;
    memset(text, 'a', len / 2);
    int32_t *many = malloc(cap * sizeof *many);
    CHECK_EQ_INT(tok_encode(v, text, len, false, true, many, cap, &n, &err), LLMOPT_OK);
    CHECK(n > 0 && n < len / 4);
    free(many);
    free(text);
    tok_vocab_free(v);
}

/* Not a timed test: prints the encode rate on 1 MB of English prose. */
static void test_throughput(void) {
    static const char para[] =
        "Once upon a time, there was a little girl named Lily. She loved to play outside in "
        "the sunshine. One day, she saw a big, red ball in the park! \"Can I play?\" she "
        "asked. The boy said, \"Yes, let's play together.\" They played until 6:30 pm.\n";
    size_t len = 1 << 20, k = 0;
    char *text = malloc(len);
    while (k < len) {
        size_t m = len - k < sizeof para - 1 ? len - k : sizeof para - 1;
        memcpy(text + k, para, m);
        k += m;
    }
    const char *paths[] = {LLAMA_BPE_GGUF, QWEN3_DIR, LLAMA2_MODEL};
    for (size_t p = 0; p < LLMOPT_ARRAY_LEN(paths); p++) {
        struct tok_vocab *v = load(paths[p]);
        if (!v) continue;
        int32_t *ids = malloc(len * sizeof *ids);
        size_t n = 0;
        struct llmopt_err err;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        CHECK_EQ_INT(tok_encode(v, text, len, false, true, ids, len, &n, &err), LLMOPT_OK);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        fprintf(stderr, "  1 MiB of English -> %zu ids in %.3f s (%s)\n", n, s, paths[p]);
        free(ids);
        tok_vocab_free(v);
    }
    free(text);
}

TEST_MAIN(test_vectors_qwen3_dir, test_vectors_qwen2_gguf, test_vectors_llama_bpe_gguf,
          test_vectors_llama_spm, test_shared_reference_encodings, test_spm_model_equals_gguf,
          test_tokenizer_json, test_round_trip, test_round_trip_vectors, test_special_tokens,
          test_eog_and_bos, test_matches_naive_merges, test_spm_chunks_change_nothing, test_nfc,
          test_gguf_bpe_errors, test_spm_model_errors, test_hf_dir_errors, test_limits,
          test_throughput)
