#!/usr/bin/env bash
# Stock programs by structure (issue 5): every golden model runs from its GGUF and from
# its Hugging Face directory (config.json + safetensors) with identical greedy tokens,
# the right program is chosen, and files no program takes get clear errors.
set -uo pipefail
LLMOPT=${1:?usage: test_programs.sh path/to/llmopt}
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
TMP=$(mktemp -d /tmp/llmopt_programs_XXXXXX)
trap 'rm -rf "$TMP"' EXIT

for d in tests/golden/*_tiny; do
    name=$(basename "$d")
    want_prog=${name%_tiny}
    [ -f "$d/model.gguf" ] && [ -d "$d/hf" ] || continue
    a=$("$LLMOPT" run "$d/model.gguf" --prompt-ids 1,5,9,13 -n 32 --temp 0 --ids -v 2>"$TMP/a.err")
    b=$("$LLMOPT" run "$d/hf" --prompt-ids 1,5,9,13 -n 32 --temp 0 --ids -v 2>"$TMP/b.err")
    [ -n "$a" ] && [ "$a" = "$b" ] && ok "$name: GGUF and HF directory give identical tokens" \
        || { bad "$name: GGUF vs HF"; echo "  gguf: $a"; echo "  hf:   $b"; cat "$TMP/a.err" "$TMP/b.err" | head -5; }
    grep -q "program '$want_prog' binds" "$TMP/a.err" && grep -q "program '$want_prog' binds" "$TMP/b.err" \
        && ok "$name: program '$want_prog' chosen for both" || { bad "$name: program choice"; head -2 "$TMP/a.err"; }
done

# Programs are mutually exclusive: each golden model (and a synthesized untied
# Qwen3-shaped file) binds exactly one stock program, so the choice never depends on the
# order programs are tried in.
"$LLMOPT" synth --like tiny-qwen3 --type q8_0 -o "$TMP/tiny-qwen3.gguf" >/dev/null 2>&1
for f in tests/golden/*_tiny/model.gguf tests/golden/*_tiny/hf "$TMP/tiny-qwen3.gguf"; do
    [ -e "$f" ] || continue
    bound=""
    for p in programs/*/; do
        name=$(basename "$p")
        mkdir -p "$TMP/one_$name" && ln -sfn "$PWD/programs/$name" "$TMP/one_$name/$name"
        if "$LLMOPT" run "$f" --programs "$TMP/one_$name" --prompt-ids 1 -n 1 --ids >/dev/null 2>&1; then
            bound="$bound $name"
        fi
    done
    [ "$(echo $bound | wc -w)" = 1 ] && ok "$f binds exactly one program:$bound" || bad "$f binds:$bound"
done

# A directory whose safetensors header is truncated: a clear error, no crash.
mkdir -p "$TMP/broken"
cp tests/golden/qwen3_tiny/hf/config.json "$TMP/broken/"
head -c 200 tests/golden/qwen3_tiny/hf/model.safetensors > "$TMP/broken/model.safetensors"
out=$("$LLMOPT" run "$TMP/broken" --prompt-ids 1 -n 2 --ids 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "safetensors" <<< "$out" && ok "truncated safetensors: clear error" || bad "truncated safetensors: rc $rc: $out"
# Inconsistent header: a tensor's byte range larger than its shape says.
python3 - "$TMP/broken/model.safetensors" <<'PY'
import json, struct, sys
hdr = json.dumps({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}}).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(hdr)) + hdr + b"\0" * 16)
PY
out=$("$LLMOPT" run "$TMP/broken" --prompt-ids 1 -n 2 --ids 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "data_offsets" <<< "$out" && ok "inconsistent safetensors header: clear error" || bad "inconsistent header: $out"
# A GGUF with extra tensors: no program takes it, and the error lists them.
out=$("$LLMOPT" run ../shared/tokenizers/ggml-vocab-qwen2.gguf --prompt-ids 1 -n 2 --ids 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "qwen3: [0-9]* tensors missing: 'token_embd.weight'" <<< "$out" && ok "vocab-only GGUF: missing tensors listed per program" \
    || bad "no-match error: $out"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
