#!/usr/bin/env bash
# llmopt vs llama.cpp on the same GGUF, same threads, in one run, as ratios (issue 7).
# llama.cpp comes from npm's node-llama-cpp (prebuilt CPU build), installed into a cache
# folder outside the repository; nothing of it is committed.
# Usage: bench/compare.sh MODEL.gguf [-p 512] [-n 128] [-t 2] [-r 3]
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:?usage: bench/compare.sh MODEL.gguf [-p P] [-n N] [-t T] [-r R]}; shift
P=512 N=128 T=2 R=3
while [ $# -gt 0 ]; do
    case "$1" in
        -p) P=$2; shift 2 ;; -n) N=$2; shift 2 ;; -t) T=$2; shift 2 ;; -r) R=$2; shift 2 ;;
        *) echo "compare.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
CACHE=${LLMOPT_BENCH_CACHE:-/tmp/llmopt-bench-npm}
if [ ! -d "$CACHE/node_modules/node-llama-cpp" ]; then
    mkdir -p "$CACHE"
    (cd "$CACHE" && npm init -y >/dev/null && npm install --no-audit --no-fund node-llama-cpp@3.21.1 >/dev/null)
fi
cp bench/llamacpp_bench.mjs "$CACHE/"
ours=$(build/llmopt bench "$MODEL" -p "$P" -n "$N" -t "$T" -r "$R" --json ${PROFILE:+--profile "$PROFILE"})
theirs=$(cd "$CACHE" && node llamacpp_bench.mjs "$(realpath "$OLDPWD/$MODEL" 2>/dev/null || realpath "$MODEL")" "$P" "$N" "$T" "$R" 2>/dev/null | tail -1)
python3 - "$ours" "$theirs" "$MODEL" <<'PY'
import json, sys
o, t = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print("model %s, threads %d, prompt %d, generate %d" % (sys.argv[3], o["threads"], o["n_prompt"], o["n_gen"]))
print("%-10s %14s %14s %8s" % ("", "llmopt tok/s", "llama.cpp", "ratio"))
for k, name in (("prefill_tok_s", "prefill"), ("decode_tok_s", "decode")):
    print("%-10s %14.1f %14.1f %7.2fx" % (name, o[k], t[k], o[k] / t[k] if t[k] else 0))
PY
