#!/usr/bin/python3
"""Renders every (chat template x conversation x add_generation_prompt) pair of
tests/golden/templates/ with Python's jinja2, set up the way Hugging Face transformers
renders chat templates, into tests/golden/templates/expected/ (committed). The C
interpreter must reproduce these files byte for byte (tests/unit/test_template.c).

transformers' environment (chat_template_utils._compile_jinja_template):
  ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                extensions=[AssistantTracker, jinja2.ext.loopcontrols])
  filters["tojson"]  = json.dumps(x, ensure_ascii=False, indent=..., separators=..., sort_keys=...)
  globals["raise_exception"], globals["strftime_now"]
and apply_chat_template renders with
  messages=..., tools=<list or None>, documents=None, add_generation_prompt=...,
  plus the tokenizer's special tokens (bos_token, eos_token when it has them) and any
  extra template kwargs.

Each conversation file is {"messages": [...], "tools": [...] (optional),
"extra": {...} (optional)}. Output names: <template>__<conversation>__<gen|nogen>.txt,
or .err holding "<ExceptionType>: <message>" when jinja2 raises.

Usage:
  /usr/bin/python3 scripts/render_templates.py            # (re)write expected/
  /usr/bin/python3 scripts/render_templates.py --check    # compare, exit 1 on drift
  /usr/bin/python3 scripts/render_templates.py --out DIR  # write renders to DIR
  /usr/bin/python3 scripts/render_templates.py --list     # print "template conversation gen" triples
Run from the repository root (paths in the manifest are relative to it). Uses Debian's
python3-jinja2 (scripts/setup.sh installs it): call /usr/bin/python3 explicitly.
"""
import datetime
import json
import os
import struct
import sys

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = "tests/golden/templates"


class GenerationTag(jinja2.ext.Extension):
    """transformers' AssistantTracker, reduced to what rendering needs: the
    {% generation %} block renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def gguf_metadata(path):
    """The string / integer / string-array metadata of a GGUF v2/v3 file."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"GGUF":
        raise ValueError("%s: not a GGUF file" % path)
    pos = 4
    version, = struct.unpack_from("<I", data, pos)
    pos += 4
    n_tensors, n_kv = struct.unpack_from("<QQ", data, pos)
    pos += 16
    scalar = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}

    def read_str(p):
        n, = struct.unpack_from("<Q", data, p)
        return data[p + 8:p + 8 + n].decode("utf-8", "surrogateescape"), p + 8 + n

    def read_value(t, p):
        if t == 8:
            return read_str(p)
        if t == 9:
            et, n = struct.unpack_from("<IQ", data, p)
            p += 12
            out = []
            for _ in range(n):
                v, p = read_value(et, p)
                out.append(v)
            return out, p
        fmt = scalar[t]
        return struct.unpack_from(fmt, data, p)[0], p + struct.calcsize(fmt)

    meta = {}
    for _ in range(n_kv):
        key, pos = read_str(pos)
        t, = struct.unpack_from("<I", data, pos)
        pos += 4
        meta[key], pos = read_value(t, pos)
    return meta


def load_template(entry):
    """(template text, tool_use text or None, special tokens dict) for a manifest entry."""
    tokens = {}
    tool_use = None
    if "gguf" in entry:
        meta = gguf_metadata(entry["gguf"])
        text = meta["tokenizer.chat_template"]
        tool_use = meta.get("tokenizer.chat_template.tool_use")
        vocab = meta.get("tokenizer.ggml.tokens", [])
        for name in ("bos", "eos"):
            tid = meta.get("tokenizer.ggml.%s_token_id" % name)
            if tid is not None and tid < len(vocab):
                tokens["%s_token" % name] = vocab[tid]
    elif "dir" in entry:
        with open(os.path.join(entry["dir"], "tokenizer_config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        jinja_path = os.path.join(entry["dir"], "chat_template.jinja")
        if os.path.exists(jinja_path):
            with open(jinja_path, encoding="utf-8", newline="") as f:
                text = f.read()
        else:
            text = cfg["chat_template"]
            if isinstance(text, list):
                named = {t["name"]: t["template"] for t in text}
                text, tool_use = named["default"], named.get("tool_use")
        for name in ("bos_token", "eos_token"):
            v = cfg.get(name)
            if isinstance(v, dict):
                v = v.get("content")
            if v is not None:
                tokens[name] = v
    else:
        with open(entry["file"], encoding="utf-8", newline="") as f:
            text = f.read()
        for name in ("bos_token", "eos_token"):
            if entry.get(name) is not None:
                tokens[name] = entry[name]
    return text, tool_use, tokens


def available(entry):
    path = entry.get("gguf") or entry.get("dir") or entry.get("file")
    return os.path.exists(path)


def render(env, text, tool_use, tokens, conv, gen):
    tools = conv.get("tools")
    src = tool_use if (tool_use is not None and tools is not None) else text
    ctx = dict(messages=conv["messages"], tools=tools, documents=None, add_generation_prompt=gen)
    ctx.update(tokens)
    ctx.update(conv.get("extra", {}))
    try:
        return "txt", env.from_string(src).render(**ctx)
    except Exception as e:  # the C side must fail too; the message is kept for reference
        return "err", "%s: %s" % (type(e).__name__, e)


def pairs(manifest):
    convs = sorted(f[:-5] for f in os.listdir(os.path.join(ROOT, "conversations")) if f.endswith(".json"))
    for entry in manifest["templates"]:
        if not available(entry):
            print("render_templates: skipping %s (%s missing)" % (entry["name"],
                  entry.get("gguf") or entry.get("dir") or entry.get("file")), file=sys.stderr)
            continue
        for c in convs:
            for gen in (False, True):
                yield entry, c, gen


def main():
    args = sys.argv[1:]
    with open(os.path.join(ROOT, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    out_dir = os.path.join(ROOT, "expected")
    check = "--check" in args
    if "--out" in args:
        out_dir = args[args.index("--out") + 1]
    if "--list" in args:
        for entry, c, gen in pairs(manifest):
            print(entry["name"], c, "gen" if gen else "nogen")
        return 0
    env = make_env()
    cache = {}
    drift = written = 0
    expected_names = set()
    os.makedirs(out_dir, exist_ok=True)
    for entry, c, gen in pairs(manifest):
        if entry["name"] not in cache:
            cache[entry["name"]] = load_template(entry)
        text, tool_use, tokens = cache[entry["name"]]
        with open(os.path.join(ROOT, "conversations", c + ".json"), encoding="utf-8") as f:
            conv = json.load(f)
        kind, result = render(env, text, tool_use, tokens, conv, gen)
        name = "%s__%s__%s.%s" % (entry["name"], c, "gen" if gen else "nogen", kind)
        expected_names.add(name)
        path = os.path.join(out_dir, name)
        data = result.encode("utf-8")
        if check:
            try:
                with open(path, "rb") as f:
                    old = f.read()
            except FileNotFoundError:
                old = None
            if old != data:
                print("drift: %s" % name)
                drift += 1
            continue
        with open(path, "wb") as f:
            f.write(data)
        written += 1
    if not check:
        for stale in os.listdir(out_dir):
            if (stale.endswith(".txt") or stale.endswith(".err")) and stale not in expected_names:
                os.remove(os.path.join(out_dir, stale))
        print("render_templates: wrote %d renders to %s" % (written, out_dir))
        return 0
    print("render_templates: %d of %d renders differ from %s" % (drift, len(expected_names), out_dir))
    return 1 if drift else 0


if __name__ == "__main__":
    sys.exit(main())
