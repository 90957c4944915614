#!/usr/bin/env bash
# Server throughput benchmark (issue 6): 32 concurrent streaming clients vs one client
# (the same 32 greedy requests one after the other) on stories260K, driven by the
# official openai client (bench/server_load.mjs). Prints, per round, tokens/s of both,
# the ratio, the load average, the CPU seconds of server and client and the scheduler's
# time per phase; exits 1 when an output differs from the one-client run or the median
# ratio is under LLMOPT_SERVER_MIN_SPEEDUP (default 4; 0 only measures).
#   bench/server.sh [build/llmopt] [more bench/server_load.mjs options]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d tests/server/node_modules/openai ] || { echo "run scripts/setup.sh (npm ci in tests/server)" >&2; exit 1; }
node bench/server_load.mjs "${1:-build/llmopt}" --rounds 3 \
    --min-speedup "${LLMOPT_SERVER_MIN_SPEEDUP:-4}" "${@:2}"
