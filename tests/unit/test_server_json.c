/* The server's streaming fast path writes each token's text into a JSON template with
 * srv_buf_json_escaped instead of building a jansson tree: its bytes must be exactly
 * what json_dumps writes, on fresh random UTF-8 (control characters, quotes,
 * backslashes, 2-4 byte sequences), and it must honour the buffer's cap. */
#include "server/srv_buf.h"
#include "server/srv_request.h"
#include "test.h"

#include <jansson.h>
#include <stdint.h>

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)rng_state;
}

/* Appends one random code point as UTF-8; biased to the bytes that need escaping. */
static size_t put_code_point(char *p) {
    static const char special[] = "\"\\/\b\f\n\r\t\x01\x1f\x7f ";
    uint32_t kind = rnd() % 6, cp;
    if (kind == 0) {
        p[0] = special[rnd() % (sizeof special - 1)];
        return 1;
    }
    if (kind == 1) cp = rnd() % 0x20;
    else if (kind == 2) cp = 0x20 + rnd() % 0x60;
    else if (kind == 3) cp = 0x80 + rnd() % 0x780;
    else if (kind == 4) cp = 0x800 + rnd() % 0xf800;
    else cp = 0x10000 + rnd() % 0x100000;
    if (cp >= 0xd800 && cp < 0xe000) cp = 0xe000; /* no surrogates in UTF-8 */
    if (cp < 0x80) {
        p[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        p[0] = (char)(0xc0 | cp >> 6);
        p[1] = (char)(0x80 | (cp & 63));
        return 2;
    }
    if (cp < 0x10000) {
        p[0] = (char)(0xe0 | cp >> 12);
        p[1] = (char)(0x80 | (cp >> 6 & 63));
        p[2] = (char)(0x80 | (cp & 63));
        return 3;
    }
    p[0] = (char)(0xf0 | cp >> 18);
    p[1] = (char)(0x80 | (cp >> 12 & 63));
    p[2] = (char)(0x80 | (cp >> 6 & 63));
    p[3] = (char)(0x80 | (cp & 63));
    return 4;
}

static void test_escape_matches_jansson(void) {
    char text[4 * 64 + 1];
    for (int iter = 0; iter < 20000; iter++) {
        size_t n = 0, count = rnd() % 64;
        for (size_t i = 0; i < count; i++) n += put_code_point(text + n);
        text[n] = 0;
        CHECK(srv_utf8_valid(text, n));
        json_t *j = json_stringn(text, n);
        char *want = j ? json_dumps(j, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
        json_decref(j);
        struct srv_buf b;
        srv_buf_init(&b, 1 << 16);
        CHECK(srv_buf_append(&b, "\"", 1) && srv_buf_json_escaped(&b, text, n) &&
              srv_buf_append(&b, "\"", 1));
        CHECK_MSG(want && b.data && !strcmp(b.data, want), "text of %zu bytes: got %s, want %s",
                  n, b.data ? b.data : "(null)", want ? want : "(null)");
        free(want);
        srv_buf_free(&b);
        if (test_failures_in_current) return;
    }
}

static void test_escape_respects_cap(void) {
    struct srv_buf b;
    srv_buf_init(&b, 8);
    CHECK(srv_buf_json_escaped(&b, "abc", 3));
    CHECK(!srv_buf_json_escaped(&b, "\n\n\n", 3)); /* 6 more bytes pass the cap of 8 */
    CHECK(b.failed);
    srv_buf_free(&b);
    srv_buf_init(&b, 4);
    CHECK(!srv_buf_json_escaped(&b, "abcdef", 6)); /* a plain run past the cap */
    CHECK(b.failed);
    srv_buf_free(&b);
}

/* Request bodies are checked against Unicode's well-formed sequences (Table 3-7): the
 * edges of each lead byte's second-byte range, overlongs, surrogates, past U+10FFFF,
 * bytes that never start a sequence, and sequences cut short. */
static void test_utf8_valid_edges(void) {
    static const struct {
        const char *s;
        bool ok;
    } cases[] = {
        {"plain", true},         {"\xc2\x80", true},          {"\xdf\xbf", true},
        {"\xc1\xbf", false},     {"\xc0\x80", false},         {"\xe0\xa0\x80", true},
        {"\xe0\x9f\xbf", false}, {"\xed\x9f\xbf", true},      {"\xed\xa0\x80", false},
        {"\xef\xbf\xbf", true},  {"\xf0\x90\x80\x80", true}, {"\xf0\x8f\xbf\xbf", false},
        {"\xf4\x8f\xbf\xbf", true}, {"\xf4\x90\x80\x80", false}, {"\xf5\x80\x80\x80", false},
        {"\x80", false},         {"\xe6\x97", false},         {"a\xf0\x9f\x98", false},
        {"\xe6\x97\xa5x", true}, {"\xe6\x41\xa5", false},     {"\xf0\x9f\x98\x80", true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CHECK_MSG(srv_utf8_valid(cases[i].s, strlen(cases[i].s)) == cases[i].ok, "case %zu", i);
}

TEST_MAIN(test_escape_matches_jansson, test_escape_respects_cap, test_utf8_valid_edges)
