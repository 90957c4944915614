#!/usr/bin/env bash
# llmopt vs llama.cpp's own llama-bench on the same GGUF, same threads, same prompt and
# generation lengths, in one run; prints both tools' raw output and the ratios (issue 7).
# llama-bench is built from the llama.cpp source that npm's node-llama-cpp carries, outside
# the repository (bench/llama_cpp.sh; $LLAMA_BENCH overrides the binary).
#
# Usage: bench/compare.sh MODEL.gguf [-p 512] [-n 128] [-t 2] [-r 3] [--rounds 1]
#
# Matching the two tools' definitions:
#   prefill  llmopt: P prompt tokens from an empty cache (median of R);
#            llama-bench: pp P at depth 0 (mean of R).
#   decode   llmopt: N tokens one at a time after the P-token prompt (median of R);
#            llama-bench: tg N at depth P (-d P: also after P tokens of context).
# With --rounds K the tools alternate K times (llmopt, llama-bench, llmopt, ...) and the
# ratios use each tool's best round: on a shared machine the best round is the one least
# disturbed. $PROFILE (a `llmopt probe` profile) adds llmopt's roofline fields.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:?usage: bench/compare.sh MODEL.gguf [-p P] [-n N] [-t T] [-r R] [--rounds K]}; shift
P=512 N=128 T=2 R=3 ROUNDS=1
while [ $# -gt 0 ]; do
    case "$1" in
        -p) P=$2; shift 2 ;; -n) N=$2; shift 2 ;; -t) T=$2; shift 2 ;; -r) R=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        *) echo "compare.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
[ -f "$MODEL" ] || { echo "compare.sh: no such model file: $MODEL" >&2; exit 2; }
[ -x build/llmopt ] || { echo "compare.sh: build llmopt first (build/llmopt)" >&2; exit 2; }
LLAMA_BENCH=${LLAMA_BENCH:-$(bench/llama_cpp.sh | tail -1)/llama-bench}

echo "# machine: $(uname -srm); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(nproc) CPUs"
echo "# date: $(date -u '+%Y-%m-%d %H:%M UTC'); llmopt commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src tools include || echo ' (+ working tree)')"
echo "# llama.cpp: $LLAMA_BENCH (its build_commit is in each JSON line below)"
echo "# model: $MODEL; threads $T; prompt $P; generate $N; repetitions $R; rounds $ROUNDS"
results=$(mktemp)
trap 'rm -f "$results"' EXIT
for k in $(seq 1 "$ROUNDS"); do
    echo "# round $k, load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
    ours=$(build/llmopt bench "$MODEL" -p "$P" -n "$N" -t "$T" -r "$R" --json ${PROFILE:+--profile "$PROFILE"})
    echo "llmopt bench: $ours"
    echo "llmopt $ours" >> "$results"
    for args in "-p $P -n 0" "-p 0 -n $N -d $P"; do
        # shellcheck disable=SC2086
        theirs=$("$LLAMA_BENCH" -m "$MODEL" -t "$T" -r "$R" $args -o jsonl 2>/dev/null)
        echo "llama-bench $args: $theirs"
        echo "llama $theirs" >> "$results"
    done
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$results" "$P" "$N" <<'PY'
import json, sys
P, N = int(sys.argv[2]), int(sys.argv[3])
ours = {"prefill": 0.0, "decode": 0.0}
theirs = {"prefill": 0.0, "decode": 0.0}
for line in open(sys.argv[1]):
    who, js = line.split(" ", 1)
    d = json.loads(js)
    if who == "llmopt":
        ours["prefill"] = max(ours["prefill"], d["prefill_tok_s"])
        ours["decode"] = max(ours["decode"], d["decode_tok_s"])
    elif d["n_prompt"] == P and d["n_gen"] == 0:
        theirs["prefill"] = max(theirs["prefill"], d["avg_ts"])
    elif d["n_gen"] == N and d["n_prompt"] == 0:
        theirs["decode"] = max(theirs["decode"], d["avg_ts"])
print("%-26s %14s %14s %8s" % ("", "llmopt tok/s", "llama.cpp", "ratio"))
for k, name in (("prefill", "prefill (pp%d)" % P), ("decode", "decode (tg%d @ depth %d)" % (N, P))):
    o, t = ours[k], theirs[k]
    print("%-26s %14.2f %14.2f %7.2fx" % (name, o, t, o / t if t else 0))
PY
