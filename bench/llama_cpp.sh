#!/usr/bin/env bash
# Builds llama.cpp's own llama-bench and llama-perplexity from the source that npm's
# node-llama-cpp package carries (node_modules/node-llama-cpp/llama/gitRelease.bundle),
# outside the repository; nothing of llama.cpp is committed. Prints the bin directory.
#
#   LLMOPT_BENCH_CACHE  npm cache folder (default /tmp/llmopt-bench-npm)
#   LLAMA_CPP_SRC       clone of the bundle (default /tmp/llama-src); its build/ folder is
#                       reused, so a second call (or a build already done) costs nothing
#   JOBS                parallel compile jobs (default 2)
#
# The build: CMake + Ninja, Release, GGML_NATIVE=ON (this CPU's ISA, as llmopt's kernels
# pick theirs at run time), no CURL, no server or tests.
set -euo pipefail
CACHE=${LLMOPT_BENCH_CACHE:-/tmp/llmopt-bench-npm}
SRC=${LLAMA_CPP_SRC:-/tmp/llama-src}
BUILD=$SRC/build
TARGETS=(llama-bench llama-perplexity)
have_all() { for t in "${TARGETS[@]}"; do [ -x "$BUILD/bin/$t" ] || return 1; done; }
if have_all; then echo "$BUILD/bin"; exit 0; fi

BUNDLE=$CACHE/node_modules/node-llama-cpp/llama/gitRelease.bundle
if [ ! -f "$BUNDLE" ]; then
    mkdir -p "$CACHE"
    [ -f "$CACHE/package.json" ] || (cd "$CACHE" && npm init -y >/dev/null)
    # only the package's files are needed (its install script would fetch prebuilt binaries)
    (cd "$CACHE" && npm install --no-audit --no-fund --ignore-scripts node-llama-cpp@3.21.1 >&2)
fi
if [ ! -d "$SRC/.git" ]; then
    git clone --quiet "$BUNDLE" "$SRC" >&2
fi
# One build at a time in one build folder.
exec 9>"$SRC/.llmopt-build.lock"
flock 9
if ! have_all; then
    if [ ! -f "$BUILD/CMakeCache.txt" ]; then
        cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
            -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >&2
    fi
    nice cmake --build "$BUILD" --target "${TARGETS[@]}" -j"${JOBS:-2}" >&2
fi
echo "$BUILD/bin"
