/* Chat-template interpreter: byte-exact renders against Python's jinja2 (the files
 * scripts/render_templates.py wrote into tests/golden/templates/expected/), plus unit
 * tests of expressions, filters, whitespace control, scoping, errors and limits. Run
 * from the repository root. */
#include "template/template.h"
#include "test.h"

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define GOLDEN "tests/golden/templates"

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) buf[n] = 0;
    if (len) *len = (size_t)n;
    return buf;
}

static bool exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Renders src with the JSON context ctx_json; returns the output (malloc'd) or NULL
 * with err filled. */
static char *render(const char *src, const char *ctx_json, struct llmopt_err *err) {
    struct tpl_template *t = NULL;
    memset(err, 0, sizeof *err);
    if (tpl_parse(src, strlen(src), "t", &t, err)) return NULL;
    json_t *ctx = ctx_json ? json_loads(ctx_json, 0, NULL) : NULL;
    if (ctx_json && !ctx) {
        fprintf(stderr, "  bad test context JSON: %s\n", ctx_json);
        abort();
    }
    char *out = NULL;
    size_t n;
    tpl_render(t, ctx, NULL, &out, &n, err);
    json_decref(ctx);
    tpl_free(t);
    return out;
}

#define CHECK_RENDER(src, ctx, want)                                                       \
    do {                                                                                   \
        struct llmopt_err e_;                                                              \
        char *got_ = render((src), (ctx), &e_);                                            \
        CHECK_MSG(got_ && !strcmp(got_, (want)), "template %s\n    got:  %s\n    want: %s", \
                  (src), got_ ? got_ : e_.msg, (want));                                    \
        free(got_);                                                                        \
    } while (0)

/* The render fails and the message contains every one of the given fragments. */
#define CHECK_ERROR(src, ctx, ...)                                                         \
    do {                                                                                   \
        struct llmopt_err e_;                                                              \
        char *got_ = render((src), (ctx), &e_);                                            \
        CHECK_MSG(!got_, "template %s should fail, rendered %s", (src), got_ ? got_ : ""); \
        const char *frags_[] = {__VA_ARGS__};                                              \
        for (size_t k_ = 0; !got_ && k_ < sizeof frags_ / sizeof frags_[0]; k_++)          \
            CHECK_MSG(strstr(e_.msg, frags_[k_]), "error for %s\n    is:   %s\n    lacks: %s", \
                      (src), e_.msg, frags_[k_]);                                          \
        free(got_);                                                                        \
    } while (0)

/* ---- golden renders ------------------------------------------------------------------ */

static int golden_pass, golden_fail, golden_skipped_templates;

static struct llmopt_chat_template *load_entry(const json_t *entry) {
    struct llmopt_err err = {0};
    struct llmopt_chat_template *t = NULL;
    const char *gguf = json_string_value(json_object_get(entry, "gguf"));
    const char *dir = json_string_value(json_object_get(entry, "dir"));
    const char *file = json_string_value(json_object_get(entry, "file"));
    const char *path = gguf ? gguf : dir ? dir : file;
    if (!exists(path)) {
        fprintf(stderr, "  skip template %s: %s not found\n", json_string_value(json_object_get(entry, "name")), path);
        golden_skipped_templates++;
        return NULL;
    }
    if (gguf || dir) {
        CHECK_MSG(llmopt_chat_template_load(path, &t, &err) == LLMOPT_OK, "load %s: %s", path, err.msg);
        return t;
    }
    size_t len;
    char *text = slurp(file, &len);
    CHECK(text != NULL);
    if (!text) return NULL;
    const char *bos = json_string_value(json_object_get(entry, "bos_token"));
    const char *eos = json_string_value(json_object_get(entry, "eos_token"));
    CHECK_MSG(llmopt_chat_template_from_text(text, len, bos, eos, &t, &err) == LLMOPT_OK, "parse %s: %s", file, err.msg);
    free(text);
    return t;
}

static void render_pair(const char *tname, struct llmopt_chat_template *t, const char *cname, bool gen) {
    char path[512], exp_txt[600], exp_err[600];
    snprintf(path, sizeof path, GOLDEN "/conversations/%s.json", cname);
    snprintf(exp_txt, sizeof exp_txt, GOLDEN "/expected/%s__%s__%s.txt", tname, cname, gen ? "gen" : "nogen");
    snprintf(exp_err, sizeof exp_err, GOLDEN "/expected/%s__%s__%s.err", tname, cname, gen ? "gen" : "nogen");
    json_t *conv = json_load_file(path, 0, NULL);
    CHECK_MSG(conv != NULL, "cannot read %s", path);
    if (!conv) return;
    char *messages = json_dumps(json_object_get(conv, "messages"), JSON_COMPACT);
    json_t *extra = json_deep_copy(json_object_get(conv, "extra"));
    if (!extra) extra = json_object();
    if (json_object_get(conv, "tools")) json_object_set(extra, "tools", json_object_get(conv, "tools"));
    char *extra_s = json_dumps(extra, JSON_COMPACT);
    char *out = NULL;
    size_t out_len = 0;
    struct llmopt_err err = {0};
    enum llmopt_status st = llmopt_chat_template_render(t, messages, strlen(messages), gen, extra_s, &out, &out_len, &err);
    size_t want_len;
    char *want = slurp(exp_txt, &want_len);
    bool ok;
    if (want) {
        ok = st == LLMOPT_OK && out_len == want_len && memcmp(out, want, want_len) == 0;
        if (!ok) {
            fprintf(stderr, "  MISMATCH %s x %s (%s): %s\n", tname, cname, gen ? "gen" : "nogen", st ? err.msg : "");
            if (!st) {
                size_t i = 0;
                while (i < out_len && i < want_len && out[i] == want[i]) i++;
                fprintf(stderr, "    first difference at byte %zu\n    got:  ...%.80s\n    want: ...%.80s\n", i,
                        out + (i > 20 ? i - 20 : 0), want + (i > 20 ? i - 20 : 0));
            }
        }
    } else {
        char *want_err = slurp(exp_err, NULL);
        CHECK_MSG(want_err != NULL, "no expected file %s (run scripts/render_templates.py)", exp_txt);
        ok = want_err && st != LLMOPT_OK;
        /* raise_exception messages must come through verbatim */
        if (ok && !strncmp(want_err, "TemplateError: ", 15)) ok = strstr(err.msg, want_err + 15) != NULL;
        if (!ok)
            fprintf(stderr, "  %s x %s (%s): jinja2 fails with [%s], llmopt %s [%s]\n", tname, cname, gen ? "gen" : "nogen",
                    want_err ? want_err : "?", st ? "fails with" : "renders", st ? err.msg : "");
        free(want_err);
    }
    if (ok) golden_pass++;
    else golden_fail++;
    CHECK(ok);
    free(want);
    free(out);
    free(messages);
    free(extra_s);
    json_decref(extra);
    json_decref(conv);
}

static void test_golden_renders(void) {
    json_error_t jerr;
    json_t *manifest = json_load_file(GOLDEN "/manifest.json", 0, &jerr);
    CHECK_MSG(manifest != NULL, "manifest: %s", jerr.text);
    if (!manifest) return;
    /* every .json file in conversations/ */
    char *convs[64];
    size_t n_convs = 0;
    DIR *d = opendir(GOLDEN "/conversations");
    CHECK(d != NULL);
    for (struct dirent *e; d && (e = readdir(d)) && n_convs < 64;) {
        size_t len = strlen(e->d_name);
        if (len > 5 && !strcmp(e->d_name + len - 5, ".json")) convs[n_convs++] = strndup(e->d_name, len - 5);
    }
    if (d) closedir(d);
    CHECK(n_convs >= 10);
    size_t i;
    json_t *entry;
    json_array_foreach(json_object_get(manifest, "templates"), i, entry) {
        struct llmopt_chat_template *t = load_entry(entry);
        if (!t) continue;
        const char *name = json_string_value(json_object_get(entry, "name"));
        for (size_t c = 0; c < n_convs; c++) {
            render_pair(name, t, convs[c], false);
            render_pair(name, t, convs[c], true);
        }
        llmopt_chat_template_free(t);
    }
    json_decref(manifest);
    for (size_t c = 0; c < n_convs; c++) free(convs[c]);
    fprintf(stderr, "  golden: %d of %d template x conversation renders byte-exact against jinja2%s\n", golden_pass,
            golden_pass + golden_fail, golden_skipped_templates ? " (some templates skipped)" : "");
}

/* ---- expressions, filters, statements -------------------------------------------------- */

static void test_expressions(void) {
    CHECK_RENDER("{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 3 ** 2 }}", NULL,
                 "7 9 3 -4 2 3.5 64");
    CHECK_RENDER("{{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ 1/3 }} {{ 2.0 }} {{ -1.5e-7 }}", NULL,
                 "1e+16 1000000000000000.0 0.0001 1e-05 0.3333333333333333 2.0 -1.5e-07");
    CHECK_RENDER("{{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 2 }} {{ [1] + [2] }} {{ (1,) }} {{ (1, 'x') }}", NULL,
                 "a1NoneTrue abab [1, 2] (1,) (1, 'x')");
    CHECK_RENDER("{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1.0 }} {{ 'b' in 'abc' }} {{ 4 not in [1] }} {{ not 1 }}", NULL,
                 "True False True True True False");
    CHECK_RENDER("{{ x if x else 'no' }}|{{ 'y' if false }}|{{ 0 or 'z' }}|{{ 1 and 2 }}", "{\"x\": \"\"}", "no||z|2");
    CHECK_RENDER("{{ [1, 'a', none, true, 1.5, {'k': (1, 2)}] }}", NULL, "[1, 'a', None, True, 1.5, {'k': (1, 2)}]");
    CHECK_RENDER("{{ \"it's\" }} {{ ['it\\'s', 'a\"b', \"q'\\\"\"] }}", NULL, "it's [\"it's\", 'a\"b', 'q\\'\"']");
    CHECK_RENDER("{{ s|length }} {{ s[1] }} {{ s[::-1] }} {{ s[-2:] }} {{ s.upper() }}", "{\"s\": \"h\\u00e9llo\"}",
                 "5 \xc3\xa9 oll\xc3\xa9h lo H\xc3\x89LLO");
    CHECK_RENDER("{{ d.a }} {{ d['b'] }} {{ d.items is callable }}{{ d['items'] }} {{ d.missing }}|{{ l[5] }}|{{ n.attr }}",
                 "{\"d\": {\"a\": 1, \"b\": 2, \"items\": 3}, \"l\": [1], \"n\": null}", "1 2 True3 ||");
    CHECK_RENDER("{{ 'a' 'b' }} {{ x.0 }} {{ {'a': 1}['a'] }}", "{\"x\": [7]}", "ab 7 1");
    CHECK_RENDER("{{ 'x' | safe + '<' }} {{ '<' ~ ('x' | safe) }} {{ '<&>' | e }}", NULL, "x&lt; <x &lt;&amp;&gt;");
}

static void test_filters(void) {
    CHECK_RENDER("{{ '  a  '|trim }}|{{ 'xxaxx'|trim('x') }}|{{ 'a\nb\n\nc'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}", NULL,
                 "a|a|a\n  b\n\n  c|  a\n  b");
    CHECK_RENDER("{{ {'a':[1,{'b':none}],'\u00e9':'\u00e9\n\"'}|tojson(indent=2) }}", NULL,
                 "{\n  \"a\": [\n    1,\n    {\n      \"b\": null\n    }\n  ],\n  \"\xc3\xa9\": \"\xc3\xa9\\n\\\"\"\n}");
    CHECK_RENDER("{{ [1.0, 1e20, true, '<>']|tojson }} {{ 'x'|tojson(true) }} {{ '\u00e9'|tojson(ensure_ascii=true) }} {{ {}|tojson(indent=2) }}",
                 NULL, "[1.0, 1e+20, true, \"<>\"] \"x\" \"\\u00e9\" {}");
    CHECK_RENDER("{{ {'b': 1, 'a': [2]}|tojson(sort_keys=true, separators=(',', ':')) }}", NULL, "{\"a\":[2],\"b\":1}");
    CHECK_RENDER("{{ [3,1,2]|sort|list }} {{ [3,1,2]|reverse|list }} {{ 'abc'|reverse }} {{ x|join('-') }} {{ x|map('string')|join }}",
                 "{\"x\": [1, 2, 3]}", "[1, 2, 3] [2, 1, 3] cba 1-2-3 123");
    CHECK_RENDER("{{ l|map(attribute='a')|list }} {{ l|selectattr('a', 'equalto', 2)|list }} {{ l|rejectattr('a')|list }}",
                 "{\"l\": [{\"a\": 1}, {\"a\": 2}, {}]}", "[1, 2, Undefined] [{'a': 2}] [{}]");
    CHECK_RENDER("{{ d|items|list }} {{ d|dictsort(reverse=true) }} {{ d|length }} {{ undefined_x|length }} {{ 'h\u00e9'|length }}",
                 "{\"d\": {\"b\": 1, \"a\": 2}}", "[('b', 1), ('a', 2)] [('b', 1), ('a', 2)] 2 0 2");
    CHECK_RENDER("{{ u|default('d') }} {{ ''|default('e', true) }} {{ none|default('n') }} {{ u|d('short') }}", NULL, "d e None short");
    CHECK_RENDER("{{ '42'|int + 1 }} {{ '3.9'|int }} {{ 'x'|int(5) }} {{ '0x1f'|int(base=16) }} {{ '2.5'|float }} {{ 3|float }}", NULL,
                 "43 3 5 31 2.5 3.0");
    CHECK_RENDER("{{ 'hello world'|title }} {{ 'hELLO'|capitalize }} {{ 'AbC'|lower }}{{ 'AbC'|upper }} {{ 'a-b'|replace('-', '+') }}",
                 NULL, "Hello World Hello abcABC a+b");
    CHECK_RENDER("{{ [1, 2, 3]|first }} {{ [1, 2, 3]|last }} {{ 'ab'|first }} {{ [1, 2, 3]|sum }} {{ [2, 7, 1]|max }} {{ [1, 1, 2]|unique|list }}",
                 NULL, "1 3 a 6 7 [1, 2]");
    CHECK_RENDER("{{ 2.5|round }} {{ 3.14159|round(2) }} {{ 2.1|round(method='ceil') }} {{ -3|abs }} {{ 'a b  c'|wordcount }}", NULL,
                 "2.0 3.14 3.0 3 3");
    CHECK_RENDER("{{ '%s=%d'|format('x', 3) }} {{ '%05.1f' % 3.14159 }} {{ '%(a)s' % {'a': 1} }}", NULL, "x=3 003.1 1");
    CHECK_RENDER("{{ [1,2,3,4,5]|batch(2)|list }} {{ [1,2,3]|select('odd')|list }} {{ [0,1,'']|select|list }}", NULL,
                 "[[1, 2], [3, 4], [5]] [1, 3] [1]");
}

static void test_string_methods(void) {
    CHECK_RENDER("{{ s.startswith('He') }} {{ s.endswith(('x', 'd')) }} {{ s.split() }} {{ s.split('l', 1) }} {{ s.rsplit('l', 1) }}",
                 "{\"s\": \"Hello world\"}", "True True ['Hello', 'world'] ['He', 'lo world'] ['Hello wor', 'd']");
    CHECK_RENDER("[{{ s.strip() }}] [{{ s.lstrip() }}] [{{ s.rstrip() }}] [{{ s.strip(' \\n') }}] [{{ 'xxhixx'.strip('x') }}]",
                 "{\"s\": \"  hi \\n\"}", "[hi] [hi \n] [  hi] [hi] [hi]");
    CHECK_RENDER("{{ s.replace('a', 'o') }} {{ s.replace('a', 'o', 1) }} {{ 'ab'.replace('', '-') }} {{ s.find('n') }} {{ s.count('a') }}",
                 "{\"s\": \"banana\"}", "bonono bonana -a-b- 2 3");
    CHECK_RENDER("{{ 'a\\nb\\r\\nc'.splitlines() }} {{ ','.join(['a', 'b']) }} {{ '{} {x}'.format(1, x=2) }} {{ 'aBc'.swapcase() }}",
                 NULL, "['a', 'b', 'c'] a,b 1 2 AbC");
    CHECK_RENDER("{{ 'ab12'.isalnum() }} {{ '12'.isdigit() }} {{ ' '.isspace() }} {{ 'k=v'.partition('=') }} {{ \"they're\".title() }}",
                 NULL, "True True True ('k', '=', 'v') They'Re");
    CHECK_RENDER("{{ '-4'.zfill(5) }} {{ 'x'.center(5, '-') }} {{ 'ab'.rjust(4, '.') }}", NULL, "-0004 --x-- ..ab");
    CHECK_RENDER("{{ d.get('a') }} {{ d.get('z', 0) }} {{ d.keys()|list }} {{ d.values()|list }} {% for k, v in d.items() %}{{ k }}{{ v }}{% endfor %}",
                 "{\"d\": {\"a\": 1, \"b\": 2}}", "1 0 ['a', 'b'] [1, 2] a1b2");
}

static void test_whitespace_control(void) {
    /* transformers: trim_blocks and lstrip_blocks on */
    CHECK_RENDER("a\n  {% if true %}\n  b\n  {% endif %}\nc", NULL, "a\n  b\nc");
    CHECK_RENDER("a\n  {%+ if true %}\n  b\n  {%- endif %}  \nc", NULL, "a\n    b  \nc");
    CHECK_RENDER("a  {# c #}\nb\n  {# c #}  x\n", NULL, "a  b\n  x");
    CHECK_RENDER("{{ 1 }}\n{{ 2 }}  \n{%- if 1 %} y {% endif +%}\nz\n\n", NULL, "1\n2 y \nz\n");
    CHECK_RENDER("a\r\nb\rc{% if 1 %}\r\nd{% endif %}\n", NULL, "a\nb\ncd");
    CHECK_RENDER("  {% raw %}{{ x }}  {% endraw %}\nq", NULL, "{{ x }}  q");
    CHECK_RENDER("x {{- ' y ' -}} z", NULL, "x y z");
    CHECK_RENDER("{%- for i in [1, 2] -%}\n  {{ i }}\n{%- endfor %}", NULL, "12");
}

static void test_scoping(void) {
    CHECK_RENDER("{% set c = 0 %}{% for i in x %}{{ c }}{% set c = c + 1 %}{{ c }}{% endfor %}{{ c }}", "{\"x\": [1, 2, 3]}",
                 "0101010");
    CHECK_RENDER("{% for i in x %}{% if i == 1 %}{% set y = 5 %}{% endif %}{{ y }},{% endfor %}", "{\"x\": [1, 2, 3]}", "5,,,");
    CHECK_RENDER("{% macro m() %}{{ z }}{% endmacro %}{% set z = 1 %}{{ m() }}{% set z = 2 %}{{ m() }}", NULL, "12");
    CHECK_RENDER("{% set ns = namespace(a=1) %}{% for i in x %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }} {{ ns }}",
                 "{\"x\": [1, 2, 3]}", "7 <Namespace {'a': 7}>");
    CHECK_RENDER("{% for i in x %}{{ loop.previtem }}-{{ loop.nextitem }}-{{ loop.revindex }},{% endfor %}", "{\"x\": [1, 2, 3]}",
                 "-2-3,1-3-2,2--1,");
    CHECK_RENDER("{% for i in x if i > 1 %}{{ loop.index }}/{{ loop.length }}{% else %}none{% endfor %}", "{\"x\": [1, 2, 3]}",
                 "1/22/2");
    CHECK_RENDER("{% for i in [] %}x{% else %}{{ i }}none{% endfor %}", NULL, "none");
    /* Jinja quirk: else also renders when no iteration reached the end of the body */
    CHECK_RENDER("{% for i in [1, 2] %}{{ i }}{% break %}{% else %}E{% endfor %}|"
                 "{% for i in [1, 2] %}{{ i }}{% continue %}{% else %}E{% endfor %}|"
                 "{% for i in [1, 2] %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% else %}E{% endfor %}",
                 NULL, "1E|12E|1");
    CHECK_RENDER("{% for i in x %}{% for j in x %}{{ loop.index }}{% endfor %};{% endfor %}", "{\"x\": [1, 2]}", "12;12;");
    CHECK_RENDER("{% set a, b = 1, 2 %}{{ a }}{{ b }} {% set t %}[{{ a }}]{% endset %}{{ t }}", NULL, "12 [1]");
    CHECK_RENDER("{% macro f(a, b='B', c=none) %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ f(1) }} {{ f(1, c=3) }} {{ f(1, 2, 3) }}", NULL,
                 "1BNone 1B3 123");
    CHECK_RENDER("{% macro fact(n) %}{{ 1 if n <= 1 else n * fact(n - 1)|int }}{% endmacro %}{{ fact(5) }}", NULL, "120");
    CHECK_RENDER("{% for i in range(10) %}{% if i is odd %}{% continue %}{% endif %}{% if i > 6 %}{% break %}{% endif %}{{ i }}{% endfor %}",
                 NULL, "0246");
    CHECK_RENDER("{% with a = 1 %}{{ a }}{% endwith %}{{ a is defined }} {% filter upper %}x{{ 'y' }}{% endfilter %}", NULL,
                 "1False XY");
    CHECK_RENDER("{% set messages = messages[1:] %}{{ messages|length }}", "{\"messages\": [1, 2, 3]}", "2");
    CHECK_RENDER("{% generation %}{{ 'g' }}{% endgeneration %}", NULL, "g");
    CHECK_RENDER("{{ strftime_now('%Y')|length }} {{ strftime_now is defined }} {{ raise_exception is callable }}", NULL, "4 True True");
}

static void test_errors(void) {
    CHECK_ERROR("line one\n{{ x | nosuchfilter }}", NULL, "t:2:8:", "unknown filter 'nosuchfilter'");
    CHECK_ERROR("{{ x | groupby('a') }}", NULL, "t:1:8:", "filter 'groupby' is not supported");
    CHECK_ERROR("{% if x is frobbed %}{% endif %}", NULL, "unknown test 'frobbed'");
    CHECK_ERROR("{% for m in messages %}\n{% if m %}x{% endif %}\n", NULL, "t:2:23:", "'for' block opened at 1:4 is never closed",
                "'endfor'");
    CHECK_ERROR("{% if x %}a{% else %}b", NULL, "'if' block opened at 1:4", "'endif'");
    CHECK_ERROR("{{ x }", NULL, "t:1:6:", "unexpected '}'");
    CHECK_ERROR("{{ x ", NULL, "t:1:1:", "never closed");
    CHECK_ERROR("ok\n  {{ undefined_macro('x') }}", NULL, "t:2:6:", "'undefined_macro' is undefined");
    CHECK_ERROR("{{ raise_exception('Conversation roles must alternate') }}", NULL, "t:1:4:",
                "raise_exception: Conversation roles must alternate");
    CHECK_ERROR("{% include 'other.jinja' %}", NULL, "t:1:4:", "'{% include %}' is not supported");
    CHECK_ERROR("{% frob %}", NULL, "unknown tag 'frob'");
    CHECK_ERROR("{% endfor %}", NULL, "unexpected '{% endfor %}'");
    CHECK_ERROR("{% break %}", NULL, "'break' outside a for loop");
    CHECK_ERROR("{{ 1 + }}", NULL, "t:1:8:", "expected an expression");
    CHECK_ERROR("{{ 'abc }}", NULL, "unterminated string");
    CHECK_ERROR("{# never closed", NULL, "comment is never closed");
    CHECK_ERROR("{{ u.attr }}", NULL, "'u' is undefined");
    CHECK_ERROR("{{ d.x.y }}", "{\"d\": {}}", "'dict object' has no attribute 'x'");
    CHECK_ERROR("{{ 1 + 'a' }}", NULL, "unsupported operand type(s) for +: 'int' and 'str'");
    CHECK_ERROR("{{ 1 / 0 }}", NULL, "division by zero");
    CHECK_ERROR("{{ u|tojson }}", NULL, "not JSON serializable");
    CHECK_ERROR("{{ [1].append(2) }}", NULL, "unsafe");
    CHECK_ERROR("{% set x = 1 %}{% set x.a = 2 %}", NULL, "not a namespace");
    CHECK_ERROR("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", NULL, "takes not more than 1 argument");
    CHECK_ERROR("{% for a, b in [1] %}{% endfor %}", NULL, "not iterable");
    CHECK_ERROR("{{ x[::, 1] }}", NULL, "t:1:6:", "slice inside a tuple subscript");
}

static void test_limits(void) {
    struct tpl_template *t = NULL;
    struct llmopt_err err;
    struct tpl_limits lim;
    char *out = NULL;
    size_t n;
    tpl_limits_default(&lim);
    lim.max_output = 1000;
    CHECK(tpl_parse("{% for i in range(1000) %}xx{% endfor %}", 40, "t", &t, &err) == LLMOPT_OK);
    CHECK(tpl_render(t, NULL, &lim, &out, &n, &err) == LLMOPT_ERR_LIMIT && strstr(err.msg, "exceeds 1000 bytes"));
    tpl_free(t);
    tpl_limits_default(&lim);
    lim.max_steps = 10000;
    const char *nested = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
    CHECK(tpl_parse(nested, strlen(nested), "t", &t, &err) == LLMOPT_OK);
    CHECK(tpl_render(t, NULL, &lim, &out, &n, &err) == LLMOPT_ERR_LIMIT && strstr(err.msg, "steps"));
    tpl_free(t);
    CHECK_ERROR("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", NULL, "nested deeper");
    CHECK_ERROR("{{ range(1000000)|length }}", NULL, "range too big");
    CHECK_ERROR("{{ 'x' * 100000000 }}", NULL, "longer than");
    /* deeply nested expressions fail to parse instead of overflowing the stack */
    char deep[4000];
    size_t k = 0;
    k += (size_t)snprintf(deep + k, sizeof deep - k, "{{ ");
    for (int i = 0; i < 1000; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 1000; i++) deep[k++] = ')';
    k += (size_t)snprintf(deep + k, sizeof deep - k, " }}");
    CHECK(tpl_parse(deep, k, "t", &t, &err) != LLMOPT_OK);
    char *big = malloc(TPL_MAX_SOURCE + 2);
    memset(big, 'a', TPL_MAX_SOURCE + 1);
    CHECK(tpl_parse(big, TPL_MAX_SOURCE + 1, "t", &t, &err) == LLMOPT_ERR_LIMIT);
    free(big);
}

static void test_api(void) {
    struct llmopt_err err = {0};
    struct llmopt_chat_template *t = NULL;
    const char *src = "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{{ eos_token }}{% endfor %}"
                      "{% if add_generation_prompt %}<assistant>{% endif %}{{ tools is none }}{{ enable_thinking }}";
    CHECK(llmopt_chat_template_from_text(src, strlen(src), "<s>", "</s>", &t, &err) == LLMOPT_OK);
    const char *msgs = "[{\"role\": \"user\", \"content\": \"hi\"}]";
    char *out = NULL;
    size_t n = 0;
    CHECK(llmopt_chat_template_render(t, msgs, strlen(msgs), true, NULL, &out, &n, &err) == LLMOPT_OK);
    CHECK_MSG(out && !strcmp(out, "<s><user>hi</s><assistant>True") && n == strlen(out), "got %s", out ? out : err.msg);
    free(out);
    CHECK(llmopt_chat_template_render(t, msgs, strlen(msgs), false, "{\"enable_thinking\": false, \"tools\": []}", &out,
                                      &n, &err) == LLMOPT_OK);
    CHECK_MSG(out && !strcmp(out, "<s><user>hi</s>FalseFalse"), "got %s", out ? out : err.msg);
    free(out);
    CHECK(llmopt_chat_template_render(t, "{\"role\": 1}", 11, false, NULL, &out, &n, &err) == LLMOPT_ERR_INVALID_ARG);
    CHECK(llmopt_chat_template_render(t, "[", 1, false, NULL, &out, &n, &err) == LLMOPT_ERR_INVALID_ARG);
    CHECK(llmopt_chat_template_render(t, msgs, strlen(msgs), false, "[1]", &out, &n, &err) == LLMOPT_ERR_INVALID_ARG);
    llmopt_chat_template_free(t);

    /* A directory with tokenizer_config.json (list-of-templates form, {content} tokens). */
    char dir[] = "/tmp/llmopt_tpl_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[256];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs("{\"bos_token\": {\"content\": \"<B>\"}, \"eos_token\": \"<E>\", \"chat_template\": ["
              "{\"name\": \"default\", \"template\": \"D{{ bos_token }}{{ eos_token }}\"},"
              "{\"name\": \"tool_use\", \"template\": \"T{{ tools|length }}\"}]}",
              f);
        fclose(f);
    }
    CHECK(llmopt_chat_template_load(dir, &t, &err) == LLMOPT_OK);
    if (t) {
        CHECK(llmopt_chat_template_render(t, "[]", 2, false, NULL, &out, &n, &err) == LLMOPT_OK);
        CHECK_MSG(out && !strcmp(out, "D<B><E>"), "got %s", out ? out : err.msg);
        free(out);
        CHECK(llmopt_chat_template_render(t, "[]", 2, false, "{\"tools\": [1, 2]}", &out, &n, &err) == LLMOPT_OK);
        CHECK_MSG(out && !strcmp(out, "T2"), "got %s", out ? out : err.msg);
        free(out);
        llmopt_chat_template_free(t);
    }
    CHECK(llmopt_chat_template_load(path, &t, &err) == LLMOPT_OK); /* the json file itself */
    llmopt_chat_template_free(t);
    /* chat_template.jinja next to it wins */
    char jpath[300];
    snprintf(jpath, sizeof jpath, "%s/chat_template.jinja", dir);
    f = fopen(jpath, "w");
    if (f) {
        fputs("J{{ eos_token }}\n", f);
        fclose(f);
    }
    CHECK(llmopt_chat_template_load(dir, &t, &err) == LLMOPT_OK);
    if (t) {
        CHECK(llmopt_chat_template_render(t, "[]", 2, false, NULL, &out, &n, &err) == LLMOPT_OK);
        CHECK_MSG(out && !strcmp(out, "J<E>"), "got %s", out ? out : err.msg);
        free(out);
        llmopt_chat_template_free(t);
    }
    remove(jpath);
    remove(path);
    rmdir(dir);

    /* GGUF without a template: a clear error. */
    const char *stories = "../shared/models/stories260K/stories260K-F32.gguf";
    if (exists(stories))
        CHECK(llmopt_chat_template_load(stories, &t, &err) == LLMOPT_ERR_FORMAT && strstr(err.msg, "no tokenizer.chat_template"));
    CHECK(llmopt_chat_template_load("/nonexistent/model.gguf", &t, &err) == LLMOPT_ERR_IO);
}

static void test_fuzz_inputs(void) {
    /* Malformed templates and odd bytes never crash (the fuzz entry point's contract). */
    const char *cases[] = {
        "{{", "{%", "{#", "}}", "{{ }}", "{% %}", "{% if %}", "{% for %}", "{% for x in %}", "{{ ((((( }}",
        "{{ [1, 2 }}", "{{ {'a' }}", "{{ a.b.c.d[1][2](3)|x }}", "{% set %}", "{% macro %}", "{{ 'a' is }}",
        "{{ x | }}", "{% raw %}", "{{ '\\x' }}", "{{ '\\u12' }}", "\xff\xfe{{ '\xc3' }}", "{{ 1 if }}",
        "{% if 1 %}{% elif %}{% endif %}", "{{ range(-5, 5, -1)|list }}", "{{ 'abc'[::0] }}", "{{ -9223372036854775807 - 2 }}",
        "{{ 9223372036854775807 + 1 }}", "{{ 2 ** 64 }}", "{{ ''.join([1]) }}", "{{ namespace(1) }}", "{{ loop.cycle() }}",
        "{% for x in 'ab' %}{{ loop.cycle() }}{% endfor %}", "{{ 'x'.center(5, '-') }}{{ 'x'.ljust(3, 'ab') }}",
        "{{ x[::, 1] }}", "{{ 'a'.zfill() }}", "{{ '-4'.zfill(5, 'x') }}", "{{ messages[0].content.split('<')[-1][::-1]|tojson(indent='\t') }}",
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char buf[512];
        int n = snprintf(buf, sizeof buf, "\n%s", cases[i]);
        tpl_fuzz_one((const uint8_t *)buf, (size_t)n);
    }
}

TEST_MAIN(test_golden_renders, test_expressions, test_filters, test_string_methods, test_whitespace_control, test_scoping,
          test_errors, test_limits, test_api, test_fuzz_inputs)
