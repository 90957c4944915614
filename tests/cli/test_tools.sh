#!/usr/bin/env bash
# llmopt profile and mem (issue 7): the op-family profile classifies every golden
# model's nodes by structure (q/k/v projections, attention output projection, lm_head),
# counts every kernel once, and charges each family the bytes it reads; mem's KV and
# weight bytes follow from the shapes, and a loaded session's RSS covers the weights.
set -uo pipefail
LLMOPT=${1:?usage: test_tools.sh path/to/llmopt}
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
S=../shared/models/stories260K

# 1. Profile: structural families on every golden model (llama, qwen2, qwen3, gemma,
#    lfm2 with its short-conv layers) and on stories260K.
for m in tests/golden/*/model.gguf $S/stories260K-Q8_0.gguf; do
    out=$("$LLMOPT" profile "$m" -p 8 -n 4 -r 1 -t 1 --json 2>&1)
    python3 - "$out" <<'PY' && ok "profile families: $m" || { bad "profile families: $m"; echo "  $out" | head -3; }
import json, sys
d = json.loads(sys.argv[1])
f = d["families"]
k = {name: v["kernels_per_step"] for name, v in f.items()}
layers = k["attention"]
assert layers >= 1, k
assert k["qkv"] == 3 * layers, ("q, k and v of every attention", k)
assert k["attn_out"] == layers, ("one output projection per attention", k)
assert k["lm_head"] == 1, k
assert k["mlp"] >= 2 * layers, k
assert k["norm"] >= 2 * layers + 1, k
assert abs(sum(k.values()) - d["kernels_per_token"]) < 1e-9, ("every kernel in one family", k, d["kernels_per_token"])
assert abs(sum(v["bytes_per_step"] for v in f.values()) - d["bytes_per_step"]) < 1, d
for name in ("qkv", "attn_out", "mlp", "lm_head"):
    assert f[name]["bytes_per_step"] > 0 and f[name]["ms_per_step"] > 0, (name, f[name])
assert d["step_ms"] >= d["kernel_ms_per_step"] > 0, d
PY
done

# 1b. Profile --prefill: the prompt's forward, the same families, ms for the whole prompt.
out=$("$LLMOPT" profile $S/stories260K-F32.gguf -p 24 -r 1 -t 1 --prefill --json 2>&1)
python3 - "$out" <<'PY' && ok "profile --prefill" || { bad "profile --prefill"; echo "  $out" | head -3; }
import json, sys
d = json.loads(sys.argv[1])
assert d["phase"] == "prefill" and d["n_prompt"] == 24, d
assert d["steps"] == 1 and d["tokens"] == 24, d
f = d["families"]
assert f["attention"]["kernels_per_step"] == 5 and f["qkv"]["kernels_per_step"] == 15, f
for name in ("attention", "qkv", "attn_out", "mlp", "lm_head"):
    assert f[name]["ms_per_step"] > 0, (name, f[name])
assert d["step_ms"] >= d["kernel_ms_per_step"] > 0, d
PY
out=$("$LLMOPT" profile $S/stories260K-F32.gguf -p 24 -r 1 -t 1 --prefill 2>&1)
echo "$out" | grep -q "^prefill   a 24-token prompt in 1 forward" && ok "profile --prefill text" || { bad "profile --prefill text"; echo "$out" | head -3; }
"$LLMOPT" bench $S/stories260K-F32.gguf --prefill -p 8 > /dev/null 2>&1 && bad "bench refuses --prefill" || ok "bench refuses --prefill"
# 1c. Bench with sampling: decode draws (greedy without a sampling option); bad values refused.
# (here-strings, not pipes: under pipefail a grep -q that exits early can fail the pipe)
out=$("$LLMOPT" bench $S/stories260K-F32.gguf -p 8 -n 8 -r 1 -t 1 --temp 0.7 --top-k 20 --repeat-penalty 1.1 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "^sampling        temperature 0.7, top-k 20, top-p 0.95, min-p 0.05, repeat penalty 1.1, seed 0" <<< "$out" &&
  grep -q "^decode          8 tokens" <<< "$out" && ok "bench with sampling" || { bad "bench with sampling (rc $rc)"; echo "$out"; }
out=$("$LLMOPT" bench $S/stories260K-F32.gguf -p 8 -n 8 -r 1 -t 1 --json 2>&1)
grep -q '"sampling": "greedy"' <<< "$out" && ok "bench greedy by default" || { bad "bench greedy by default"; echo "$out"; }
out=$("$LLMOPT" bench $S/stories260K-F32.gguf -p 8 -n 8 -r 1 --top-p 2 2>&1) && bad "bench refuses top-p 2" ||
  { grep -q "top_p" <<< "$out" && ok "bench refuses top-p 2" || { bad "bench refuses top-p 2 (message)"; echo "$out"; }; }

# 2. Profile bytes: a decode step of stories260K F32 reads every weight once, one
#    embedding row, and K/V rows of every position seen (5 layers, 4 KV heads x 8, at
#    the cache's element size: 2 bytes for f16, 4 for f32).
for kv in f16 f32; do
out=$("$LLMOPT" profile $S/stories260K-F32.gguf -p 16 -n 1 -r 1 -t 1 --kv-type $kv --json)
KV_BYTES=$([ $kv = f16 ] && echo 2 || echo 4) \
python3 - "$out" <<'PY' && ok "profile bytes of a decode step ($kv KV)" || bad "profile bytes of a decode step ($kv KV)"
import json, os, sys
d = json.loads(sys.argv[1]); f = d["families"]
# the 17th position attends to 17 cached rows of K and V per layer
kv = 5 * 2 * 17 * 32 * int(os.environ["KV_BYTES"])
att = f["attention"]["bytes_per_step"]
assert kv < att < kv + 5 * 4 * (64 + 2 * 32 + 2) * 4, (att, kv)
# lm_head reads the (tied) 512 x 64 f32 embedding matrix and one 64-wide row
assert f["lm_head"]["bytes_per_step"] == 512 * 64 * 4 + 64 * 4, f["lm_head"]
PY
done

# 3. A profile file gives the fraction of the measured limit; a bad one is refused.
prof=$(mktemp); echo '{"measurements": {"read_bandwidth_simd_all": {"best": 10.0}}}' > "$prof"
out=$("$LLMOPT" profile $S/stories260K-Q8_0.gguf -p 8 -n 2 -r 1 -t 1 --profile "$prof" --json)
python3 - "$out" <<'PY' && ok "fraction of the profile's bandwidth" || bad "fraction of the profile's bandwidth"
import json, sys
d = json.loads(sys.argv[1])
assert d["read_bandwidth_gbps"] == 10.0
for v in d["families"].values():
    assert abs(v["fraction_of_limit"] - v["gbps"] / 10.0) < 1e-3, v
PY
echo '{}' > "$prof"
err=$("$LLMOPT" profile $S/stories260K-Q8_0.gguf --profile "$prof" 2>&1); rc=$?
[ $rc = 1 ] && [[ "$err" == *"no read bandwidth"* ]] && ok "profile without bandwidth refused" || bad "profile without bandwidth refused: $rc $err"
rm -f "$prof"
err=$("$LLMOPT" profile $S/stories260K-Q8_0.gguf --backend cuda 2>&1); rc=$?
[ $rc = 1 ] && [[ "$err" == *cuda* ]] && ok "profile on cuda says why not" || bad "profile on cuda: $rc $err"

# 4. mem: KV bytes scale with context, slots and the KV type (5 layers x 32 values per
#    position, K and V; f16 by default); weights are the file's tensor bytes; the
#    measured RSS covers the weights.
m1=$("$LLMOPT" mem $S/stories260K-F32.gguf --ctx 512 --no-load --json)
m2=$("$LLMOPT" mem $S/stories260K-F32.gguf --ctx 1024 --parallel 3 --batch 64 --kv-type f32 --json)
python3 - "$m1" "$m2" $S/stories260K-F32.gguf <<'PY' && ok "mem estimate" || bad "mem estimate"
import json, os, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert a["kv_type"] == "f16" and a["kv_bytes"] == 2 * 5 * 512 * 32 * 2, a
assert b["kv_type"] == "f32" and b["kv_bytes"] == 2 * 5 * 1024 * 3 * 32 * 4, b
assert b["n_batch"] == 64 and b["arena_bytes"] < a["arena_bytes"], (a, b)
size = os.path.getsize(sys.argv[3])
assert 0.9 * size < a["weight_bytes"] <= size, (a["weight_bytes"], size)
assert sum(w["bytes"] for w in a["weights"].values()) == a["weight_bytes"]
assert a["total_bytes"] == a["weight_bytes"] + a["kv_bytes"] + a["conv_state_bytes"] + a["arena_bytes"]
assert "peak_rss_bytes" not in a
assert b["peak_rss_bytes"] >= b["rss_at_start_bytes"] + b["weight_bytes"] * 0.5, b
PY
# q8_0 KV (34 bytes per 32 values) on a model whose heads are 32-aligned
Q=$(dirname "$LLMOPT")/tiny-qwen3-mem-$$.gguf
trap 'rm -f "$Q"' EXIT
"$LLMOPT" synth --like tiny-qwen3 --type q4_0 -o "$Q" -t 1 >/dev/null 2>&1
q8=$("$LLMOPT" mem "$Q" --ctx 256 --kv-type q8_0 --no-load --json)
f32=$("$LLMOPT" mem "$Q" --ctx 256 --kv-type f32 --no-load --json)
python3 - "$q8" "$f32" <<'PY' && ok "mem q8_0 KV is 34/128 of f32" || bad "mem q8_0 KV"
import json, sys
q, f = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert q["kv_type"] == "q8_0" and q["kv_bytes"] * 128 == f["kv_bytes"] * 34 and q["kv_bytes"] > 0, (q, f)
PY
err=$("$LLMOPT" mem $S/stories260K-F32.gguf --kv-type q8_0 --no-load 2>&1); rc=$?
[ $rc = 1 ] && [[ "$err" == *"multiple of 32"* ]] && ok "mem: q8_0 KV needs heads of 32" || bad "mem q8_0 on stories260K: $rc $err"
err=$("$LLMOPT" mem $S/stories260K-F32.gguf --kv-type q4_0 --no-load 2>&1); rc=$?
[ $rc = 2 ] && [[ "$err" == *"kv-type"* ]] && ok "mem refuses an unknown KV type" || bad "mem --kv-type: $rc $err"
"$LLMOPT" mem 2>/dev/null; [ $? = 2 ] && ok "mem without MODEL is a usage error" || bad "mem without MODEL"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
