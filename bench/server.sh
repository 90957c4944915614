#!/usr/bin/env bash
# Server throughput benchmark (issue 6): 32 concurrent streaming clients vs one client
# (the same 32 greedy requests one after the other) on stories260K. Prints, per round,
# tokens/s of both, the ratio, the load average, the CPU per token of the server (the
# scheduler thread and the rest) and of the load client, and the scheduler's time per
# phase; exits 1 when a request fails, an output differs from the one-client run or the
# median ratio is under LLMOPT_SERVER_MIN_SPEEDUP (default 4; 0 only measures).
#
#   bench/server.sh [build/llmopt] [--openai | --raw] [options] [-- extra serve args]
#
# Default client: build/bench_loadgen (bench/loadgen.c: C, one thread, poll over N
# keep-alive connections, a few us of CPU per token). --openai: the official openai npm
# client (bench/server_load.mjs), --raw: that script's node:http client; both cost the
# shared cores far more CPU per token than the server does. Options: --clients N
# --tokens T --rounds R --only-many --model FILE (and what bench_loadgen --help lists).
set -euo pipefail
cd "$(dirname "$0")/.."
LLMOPT=build/llmopt
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then LLMOPT=$1; shift; fi
MODE=loadgen CLIENTS=32 MODEL=../shared/models/stories260K/stories260K-F32.gguf
opts=() serve=()
while [ $# -gt 0 ]; do
    case $1 in
    --openai) MODE=openai ;;
    --raw) MODE=raw ;;
    --clients) CLIENTS=$2; opts+=("$1" "$2"); shift ;;
    --model) MODEL=$2; shift ;;
    --) shift; serve=("$@"); break ;;
    *) opts+=("$1") ;;
    esac
    shift
done
MIN=${LLMOPT_SERVER_MIN_SPEEDUP:-4}

if [ "$MODE" != loadgen ]; then
    [ -d tests/server/node_modules/openai ] || { echo "run scripts/setup.sh (npm ci in tests/server)" >&2; exit 1; }
    [ "$MODE" = raw ] && opts+=(--raw)
    exec node bench/server_load.mjs "$LLMOPT" --rounds 3 --min-speedup "$MIN" --model "$MODEL" \
        "${opts[@]}" -- "${serve[@]}"
fi

LOADGEN=$(dirname "$LLMOPT")/bench_loadgen
[ -x "$LOADGEN" ] || { echo "no $LOADGEN: cmake --build $(dirname "$LLMOPT") --target bench_loadgen" >&2; exit 1; }
log=$(mktemp)
"$LLMOPT" serve "$MODEL" --port 0 --parallel "$CLIENTS" --ctx 256 "${serve[@]}" 2>"$log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$log"' EXIT
port=
for _ in $(seq 300); do
    port=$(sed -n 's/.*listening on http:\/\/[^ ]*:\([0-9][0-9]*\).*/\1/p' "$log")
    [ -n "$port" ] && break
    kill -0 $pid 2>/dev/null || { echo "the server exited:" >&2; cat "$log" >&2; exit 1; }
    sleep 0.1
done
[ -n "$port" ] || { echo "the server did not start in 30 s:" >&2; cat "$log" >&2; exit 1; }
"$LOADGEN" --port "$port" --pid "$pid" --rounds 3 --min-speedup "$MIN" "${opts[@]}"
