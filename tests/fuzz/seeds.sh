#!/usr/bin/env bash
# Seed corpora for the libFuzzer entries in tests/fuzz/, one directory an entry:
#
#   tests/fuzz/seeds.sh OUT_DIR        (from anywhere; reads ../shared, tests/golden, programs/)
#
# then, with a libFuzzer build (README, "Tests"):
#   build-fuzz/fuzz_gguf CORPUS/gguf OUT_DIR/gguf -max_total_time=300 -max_len=131072
#
# Each seed is in its entry's input format (tests/fuzz/README.md): most entries take a
# file's bytes as they are, but fuzz_tokenizer_model's first byte picks the loader
# (even: tokenizer.model, odd: tokenizer.json) and is not part of the file, and
# fuzz_template's first line is the JSON render context.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 OUT_DIR" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SHARED=$ROOT/../shared
OUT=$1
mkdir -p "$OUT"
for d in gguf graph profile program safetensors server_request template tokenizer tokenizer_bpe tokenizer_model; do
    mkdir -p "$OUT/$d"
done

# gguf: the first 64 KiB of real files (header, metadata, tensor table; the data is cut
# off, which the offset checks see) and one small file whole
n=0
for f in "$ROOT"/tests/golden/*/model.gguf "$SHARED"/models/*/*.gguf "$SHARED"/tokenizers/*.gguf; do
    [ -f "$f" ] || continue
    head -c 65536 "$f" > "$OUT/gguf/head$n"
    n=$((n + 1))
done
cp "$ROOT/tests/golden/qwen2_tiny/model.gguf" "$OUT/gguf/whole_qwen2_tiny"

# graph: the stock programs' graphs as they are, and rewritten to fuzz_graph's four
# hparams (d_model, n_layers, vocab, head_dim; the others become small numbers), so that
# they import and the passes run on them
for p in "$ROOT"/programs/*/; do cp "$p/graph.json" "$OUT/graph/$(basename "$p").json"; done
python3 - "$ROOT/programs" "$OUT/graph" <<'PY'
import json, os, re, sys
subs = {"d_ff": "16", "n_heads": "2", "n_kv_heads": "1", "conv_L": "3"}
def small(o):
    if isinstance(o, dict): return {k: small(v) for k, v in o.items()}
    if isinstance(o, list): return [small(v) for v in o]
    if isinstance(o, str):
        for k, v in subs.items(): o = re.sub(r"\b%s\b" % k, v, o)
        return {"rms_eps": 1e-6, "rope_theta": 10000.0}.get(o, o)
    return o
for name in sorted(os.listdir(sys.argv[1])):
    g = small(json.load(open(os.path.join(sys.argv[1], name, "graph.json"))))
    g["hparams"] = ["vocab", "d_model", "n_layers", "head_dim"]
    json.dump(g, open(os.path.join(sys.argv[2], name + "_small.json"), "w"))
PY

# profile: a measured target profile
cp "$ROOT"/bench/results/probe-*.json "$OUT/profile/" 2>/dev/null || true

# program: compiled Model Programs (they name their weights file by path)
if [ -x "$ROOT/build/llmopt" ]; then
    # absolute weight paths, so that a fuzzer run from any directory finds them
    for m in "$ROOT/tests/golden/qwen3_tiny/model.gguf" "$SHARED/models/stories260K/stories260K-Q8_0.gguf"; do
        e=$(mktemp -d)
        "$ROOT/build/llmopt" compile "$m" -o "$e" > /dev/null 2>&1 && cp "$e/model.llmopt" "$OUT/program/$(basename "$(dirname "$m")")"
        rm -rf "$e"
    done
else
    echo "seeds.sh: no build/llmopt, so no program seeds" >&2
fi

# safetensors: a real file, and its first 4 KiB (the header)
cp "$ROOT/tests/golden/qwen3_tiny/hf/model.safetensors" "$OUT/safetensors/qwen3_tiny"
head -c 4096 "$ROOT/tests/golden/qwen3_tiny/hf/model.safetensors" > "$OUT/safetensors/head"

# server_request: the server test's corpus
cp "$ROOT"/tests/server/corpus/* "$OUT/server_request/"

# template: a context line, then each template of tests/golden/templates and Qwen3's
for t in "$ROOT"/tests/golden/templates/*.jinja "$SHARED/models/qwen3-tokenizer/chat_template.jinja"; do
    { printf '{"messages":[{"role":"user","content":"hi"}],"add_generation_prompt":true}\n'; cat "$t"; } \
        > "$OUT/template/$(basename "$t")"
done

# tokenizer, tokenizer_bpe: text with special tokens, CJK, emoji and whitespace runs
for d in tokenizer tokenizer_bpe; do
    head -c 4000 "$ROOT/tests/data/tinystories.txt" > "$OUT/$d/story"
    printf 'Hello <s> world </s> <|im_start|>user\n\xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80  \t\n123 4567' > "$OUT/$d/mix"
done

# tokenizer_model: byte 0 selects the loader. Llama-2's tokenizer.model, a small BPE
# tokenizer.model written here (byte pieces, byte_fallback) and a small tokenizer.json.
{ printf '\000'; cat "$SHARED/models/llama2-tokenizer/tokenizer.model"; } > "$OUT/tokenizer_model/spm_llama2"
python3 - "$OUT/tokenizer_model/spm_small" <<'PY'
import struct, sys
def varint(n):
    out = b""
    n &= (1 << 64) - 1
    while True:
        b, n = n & 0x7F, n >> 7
        if not n:
            return out + bytes([b])
        out += bytes([b | 0x80])
def key(num, wire): return varint(num << 3 | wire)
def ld(num, data): return key(num, 2) + varint(len(data)) + data
def vi(num, v): return key(num, 0) + varint(v)
def piece(s, score, kind=1):  # SentencePiece: 1 piece, 2 score, 3 type (1 normal)
    body = ld(1, s.encode()) + key(2, 5) + struct.pack("<f", score)
    return ld(1, body + (vi(3, kind) if kind != 1 else b""))
pieces = [piece("<unk>", 0, 2), piece("<s>", 0, 3), piece("</s>", 0, 3)]
pieces += [piece("<0x%02X>" % b, 0, 6) for b in range(256)]
words = ["\u2581", "e", "t", "a", "o", "n", "\u2581t", "he", "\u2581the", "\u2581a", "in", "on",
         "\u2581Once", "\u2581upon", "\u2581time", "ti", "me", "\u2581ti", "\u2581tim", "up", "pon"]
pieces += [piece(w, -float(i)) for i, w in enumerate(words)]
trainer = vi(3, 2) + vi(35, 1) + vi(40, 0) + vi(41, 1) + vi(42, 2) + vi(43, -1)  # BPE, byte_fallback
normalizer = ld(1, b"identity") + vi(3, 1) + vi(4, 1) + vi(5, 1)
open(sys.argv[1], "wb").write(b"\0" + b"".join(pieces) + ld(2, trainer) + ld(3, normalizer))
PY
{
    printf '\001'
    cat <<'JSON'
{"version":"1.0","added_tokens":[{"id":5,"content":"<|end|>","special":true}],"normalizer":null,"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]},"decoder":{"type":"ByteLevel"},"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2,"Ġ":3,"c":4},"merges":["a b"]}}
JSON
} > "$OUT/tokenizer_model/json_small"
echo "seeds in $OUT: $(find "$OUT" -type f | wc -l) files"
