#!/usr/bin/env bash
# llmopt synth / quantize (issue 7): random-weight GGUFs at real shapes with a real
# vocabulary bind to the stock programs and run; quantize keeps the metadata.
set -uo pipefail
LLMOPT=${1:?usage: test_synth.sh path/to/llmopt}
T=$(mktemp -d /tmp/llmopt_synth_XXXXXX)
trap 'rm -rf "$T"' EXIT
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
# type of a tensor in `llmopt inspect` output
tensor_type() { echo "$2" | awk -v n="$1" '$2 == n { print $3; exit }'; }
kv_value() { echo "$2" | awk -v k="$1" '$2 == k { $1 = $2 = $3 = ""; sub(/^ +/, ""); print; exit }'; }

# --- synth: tiny Llama shapes, the Llama 3 vocabulary, q8_0 ---
out=$("$LLMOPT" synth --like tiny-llama --type q8_0 -o "$T/tiny-q8.gguf" --seed 7 2>&1); rc=$?
echo "  $out"
[ $rc -eq 0 ] && [ -f "$T/tiny-q8.gguf" ] && grep -q "15 q8_0" <<< "$out" && ok "synth tiny-llama q8_0" ||
    bad "synth tiny-llama q8_0 (rc $rc)"
ins=$("$LLMOPT" inspect "$T/tiny-q8.gguf" 2>&1)
[ "$(tensor_type blk.0.attn_q.weight "$ins")" = q8_0 ] && [ "$(tensor_type token_embd.weight "$ins")" = q8_0 ] &&
    [ "$(tensor_type blk.1.ffn_norm.weight "$ins")" = f32 ] && ok "inspect: matrices q8_0, norms f32" ||
    bad "inspect types"
[ -z "$(tensor_type output.weight "$ins")" ] && ok "tied: no output.weight" || bad "tied embedding"
[ "$(kv_value general.architecture "$ins")" = '"llama"' ] && [ "$(kv_value llama.block_count "$ins")" = 2 ] &&
    [ "$(kv_value general.file_type "$ins")" = 7 ] && [ "$(kv_value tokenizer.ggml.model "$ins")" = '"gpt2"' ] &&
    grep -q "tokenizer.ggml.tokens *\[string\] *128256 x" <<< "$ins" && ok "metadata and vocabulary" ||
    bad "metadata: $(echo "$ins" | head -30)"
grep -q "llama.rope.freq_base *f32 *500000" <<< "$ins" &&
    grep -q "llama.attention.layer_norm_rms_epsilon *f32" <<< "$ins" && ok "eps/theta are f32" || bad "f32 keys"

ids=$("$LLMOPT" run "$T/tiny-q8.gguf" -n 8 --temp 0 -p hello --ids -v 2>"$T/err"); rc=$?
[ $rc -eq 0 ] && [ "$(echo $ids | wc -w)" -ge 8 ] && ok "run binds and generates 8 tokens" ||
    bad "run q8_0 (rc $rc): $(tail -3 "$T/err")"
grep -q "program 'llama' binds" "$T/err" && ok "the stock llama program binds" || bad "bound: $(grep binds "$T/err")"

# --- determinism ---
"$LLMOPT" synth --like tiny-llama --type q8_0 -o "$T/again.gguf" --seed 7 -t 1 >/dev/null 2>&1
cmp -s "$T/tiny-q8.gguf" "$T/again.gguf" && ok "same seed, same bytes (any thread count)" || bad "determinism"
"$LLMOPT" synth --like tiny-llama --type q8_0 -o "$T/other.gguf" --seed 8 >/dev/null 2>&1
cmp -s "$T/tiny-q8.gguf" "$T/other.gguf" && bad "another seed gives other weights" || ok "another seed, other weights"

# --- quantize to q4_0: every matrix converted, metadata kept, still runs ---
out=$("$LLMOPT" quantize "$T/tiny-q8.gguf" "$T/tiny-q4.gguf" q4_0 2>&1); rc=$?
echo "  $out"
ins4=$("$LLMOPT" inspect "$T/tiny-q4.gguf" 2>&1)
[ $rc -eq 0 ] && [ "$(tensor_type blk.0.ffn_down.weight "$ins4")" = q4_0 ] &&
    [ "$(tensor_type token_embd.weight "$ins4")" = q4_0 ] && [ "$(tensor_type output_norm.weight "$ins4")" = f32 ] &&
    ok "quantize q8_0 -> q4_0" || bad "quantize (rc $rc)"
[ "$(kv_value general.file_type "$ins4")" = 2 ] && [ "$(kv_value general.name "$ins4")" = "$(kv_value general.name "$ins")" ] &&
    [ "$(echo "$ins4" | grep -c tokenizer.)" = "$(echo "$ins" | grep -c tokenizer.)" ] &&
    ok "metadata kept, file_type updated" || bad "quantize metadata"
[ "$(stat -c %s "$T/tiny-q4.gguf")" -lt "$(stat -c %s "$T/tiny-q8.gguf")" ] && ok "q4_0 file is smaller" || bad "q4_0 size"
ids4=$("$LLMOPT" run "$T/tiny-q4.gguf" -n 8 --temp 0 -p hello --ids 2>"$T/err"); rc=$?
[ $rc -eq 0 ] && [ "$(echo $ids4 | wc -w)" -ge 8 ] && ok "quantized file runs" || bad "run q4_0: $(tail -3 "$T/err")"
"$LLMOPT" quantize "$T/tiny-q4.gguf" "$T/tiny-f16.gguf" f16 >/dev/null 2>&1 &&
    [ "$(tensor_type blk.1.attn_v.weight "$("$LLMOPT" inspect "$T/tiny-f16.gguf")")" = f16 ] &&
    "$LLMOPT" run "$T/tiny-f16.gguf" -n 2 --temp 0 -p hi >/dev/null 2>&1 && ok "quantize to f16 and run" ||
    bad "quantize f16"

# --- K-quant mix: q4_K with q6_K for the tied embedding and some attn_v/ffn_down ---
out=$("$LLMOPT" synth --like tiny-llama --type q4_k_m -o "$T/tiny-q4km.gguf" 2>&1); rc=$?
echo "  $out"
[ $rc -eq 0 ] && grep -q "q4_K" <<< "$out" && grep -q "q6_K" <<< "$out" && ok "synth q4_k_m mix" ||
    bad "synth q4_k_m (rc $rc)"

# --- other programs, and the errors a user meets ---
if [ -f programs/qwen3/graph.json ]; then
    "$LLMOPT" synth --like tiny-qwen3 --type q8_0 -o "$T/qwen.gguf" >/dev/null 2>&1
    out=$("$LLMOPT" run "$T/qwen.gguf" -n 4 --temp 0 -p hello -v 2>&1); rc=$?
    [ $rc -eq 0 ] && grep -q "program 'qwen3' binds" <<< "$out" && ok "tiny-qwen3 binds the qwen3 program" ||
        bad "tiny-qwen3 (rc $rc): $(echo "$out" | tail -3)"
fi
mkdir -p "$T/no-programs"
out=$("$LLMOPT" synth --like qwen3-0.6b --type q8_0 -o "$T/x.gguf" --programs "$T/no-programs" 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "stock program 'qwen3'" <<< "$out" && [ ! -e "$T/x.gguf" ] &&
    ok "missing program named" || bad "missing program: $out"
out=$("$LLMOPT" synth --like gpt-9 --type q8_0 -o "$T/x.gguf" 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "llama-3.2-1b" <<< "$out" && ok "unknown --like lists the names" || bad "unknown like: $out"
out=$("$LLMOPT" quantize "$T/tiny-q8.gguf" "$T/x.gguf" q3_k 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "q4_k_m" <<< "$out" && [ ! -e "$T/x.gguf" ] && ok "unknown type lists the types" ||
    bad "unknown type: $out"
out=$("$LLMOPT" synth --like tiny-llama --type q8_0 -o "$T/none/x.gguf" 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "cannot create" <<< "$out" && ok "unwritable output reported" || bad "bad output: $out"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
