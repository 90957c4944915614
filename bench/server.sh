#!/usr/bin/env bash
# Server throughput benchmark (issue 6): the server test's load section with the
# 32-clients >= 4x one-client goal asserted. Usage: bench/server.sh [build/llmopt]
set -euo pipefail
cd "$(dirname "$0")/.."
LLMOPT_SERVER_MIN_SPEEDUP=${LLMOPT_SERVER_MIN_SPEEDUP:-4} bash tests/cli/test_server.sh "${1:-build/llmopt}"
