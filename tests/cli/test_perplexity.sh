#!/usr/bin/env bash
# llmopt perplexity (issue 7) on the trained stories260K over a fixed TinyStories-like
# text (tests/data/tinystories.txt): F32, Q8_0 and an F16 quantized here agree (Q8_0's
# mean log-prob within 1% of F16's), the result does not depend on the batch size or
# backend, the model beats a uniform guess by far, and bad input gets a clear error.
set -uo pipefail
LLMOPT=${1:?usage: test_perplexity.sh path/to/llmopt}
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
S=../shared/models/stories260K
TEXT=tests/data/tinystories.txt
F16=$(dirname "$LLMOPT")/stories260K-F16-ppl-$$.gguf
trap 'rm -f "$F16"' EXIT

"$LLMOPT" quantize $S/stories260K-F32.gguf "$F16" f16 >/dev/null && ok "quantize F32 -> F16" || bad "quantize F32 -> F16"
ppl() { "$LLMOPT" perplexity "$1" -f $TEXT --ctx 128 -t 1 --json "${@:2}" 2>/dev/null; }
f32=$(ppl $S/stories260K-F32.gguf)
f16=$(ppl "$F16")
q8=$(ppl $S/stories260K-Q8_0.gguf)
f32_b=$(ppl $S/stories260K-F32.gguf --batch 24)
f32_ref=$(ppl $S/stories260K-F32.gguf --backend cpu-ref)
python3 - "$f32" "$f16" "$q8" "$f32_b" "$f32_ref" <<'PY' && ok "perplexity F32 / F16 / Q8_0" || bad "perplexity F32 / F16 / Q8_0"
import json, math, sys
f32, f16, q8, f32_b, f32_ref = (json.loads(a) for a in sys.argv[1:6])
for name, d in (("F32", f32), ("F16", f16), ("Q8_0", q8)):
    print("  %-5s mean log-prob %.6f  perplexity %.4f  (%d tokens, %d scored)"
          % (name, d["mean_logprob"], d["perplexity"], d["tokens"], d["scored"]))
assert f32["chunks"] == f32["tokens"] // 128 and f32["scored"] == f32["chunks"] * 63, f32
assert abs(math.exp(f32["mean_nll"]) - f32["perplexity"]) < 1e-3 * f32["perplexity"]
# trained on TinyStories: far better than a uniform guess over its 512 tokens
assert 1.5 < f32["perplexity"] < 20, f32
assert abs(q8["mean_logprob"] - f16["mean_logprob"]) <= 0.01 * abs(f16["mean_logprob"]), (q8, f16)
assert abs(f16["mean_logprob"] - f32["mean_logprob"]) <= 0.001 * abs(f32["mean_logprob"]), (f16, f32)
# chunking a forward into smaller batches, or the scalar reference kernels, change nothing
assert abs(f32_b["mean_nll"] - f32["mean_nll"]) < 1e-4, (f32_b, f32)
assert abs(f32_ref["mean_nll"] - f32["mean_nll"]) < 1e-3, (f32_ref, f32)
PY

err=$("$LLMOPT" perplexity $S/stories260K-F32.gguf -f $TEXT --ctx 2048 2>&1); rc=$?
[ $rc = 1 ] && [[ "$err" == *"needs at least 4096"* ]] && ok "text too short for the context" || bad "short text: $rc $err"
err=$("$LLMOPT" perplexity $S/stories260K-F32.gguf -f /nonexistent.txt 2>&1); rc=$?
[ $rc = 1 ] && [[ "$err" == *"/nonexistent.txt"* ]] && ok "missing text file named" || bad "missing file: $rc $err"
"$LLMOPT" perplexity $S/stories260K-F32.gguf 2>/dev/null; [ $? = 2 ] && ok "no -f is a usage error" || bad "no -f"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
