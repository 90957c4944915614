#!/usr/bin/env bash
# GPU tests and benchmarks of the CUDA backend, in one call on the GPU machine (issue 8).
#
#   scripts/gpu_tests.sh [--prebuilt DIR] [--quick]
#
# Builds with CMake (Ninja) when the build's dependencies are there, or runs binaries
# built elsewhere (--prebuilt DIR: DIR/bin/{llmopt,test_cuda,bench_cuda_kernels},
# DIR/lib/*.so the host libraries they need, DIR/shared/ the models and vocabularies
# that ../shared holds on a developer machine). Then:
#   1. tests/unit/test_cuda.c: every op against the CPU reference, stories260K greedy,
#      the torch goldens, on CUDA;
#   2. the CLI: `llmopt run --backend cuda` on stories260K equals expected_greedy.json;
#      then `llmopt serve --backend cuda` (tests/server/gpu_server_check.py): batched
#      greedy requests equal it too, and device sampling equals host sampling;
#   3. the kernel lab (bench/cuda_kernels.cu): copy bandwidth, matvec GB/s;
#   4. decode tok/s of `llmopt run --backend cuda` on models made here by `llmopt synth`
#      (never committed): Qwen3-0.6B-shaped Q8_0 and BF16 (8B-shaped with GPU_BENCH_8B=1),
#      512-token prompt, 128 generated tokens.
# Logs go to $OUT (default out/gpu: summary, test and bench logs, and logs.tar.gz of
# everything); a summary table is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/out/gpu}
LOGS=$OUT/logs # tarred at the end: the device returns few files
mkdir -p "$LOGS"
PREBUILT="" QUICK=0
while [ $# -gt 0 ]; do
    case "$1" in
    --prebuilt) PREBUILT=$(cd "$2" && pwd); shift 2 ;;
    --quick) QUICK=1; shift ;;
    *) echo "usage: $0 [--prebuilt DIR] [--quick]" >&2; exit 2 ;;
    esac
done
T0=$(date +%s)
SUMMARY=()
add() { SUMMARY+=("$(printf '%-44s %-6s %s' "$1" "$2" "$3")"); }
elapsed() { echo $(($(date +%s) - T0)); }

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem,clocks.max.sm --format=csv 2>&1
    nvcc --version 2>&1 | tail -1
    uname -r
} | tee "$LOGS/env.txt"

# ---- binaries -----------------------------------------------------------------------
SHARED=$ROOT/../shared
if [ -n "$PREBUILT" ]; then
    BIN=$PREBUILT/bin
    [ -d "$PREBUILT/shared" ] && SHARED=$PREBUILT/shared
    export LD_LIBRARY_PATH=$PREBUILT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    add "build" "pre" "binaries from $PREBUILT"
elif command -v nvcc >/dev/null && pkg-config --exists jansson libmicrohttpd libpcre2-8 2>/dev/null; then
    start=$(date +%s)
    if cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release >"$LOGS/build.log" 2>&1 &&
        cmake --build build-gpu -j "$(nproc)" --target llmopt test_cuda bench_cuda_kernels >>"$LOGS/build.log" 2>&1; then
        add "build (cmake)" "ok" "$(($(date +%s) - start)) s"
    else
        tail -30 "$LOGS/build.log"
        add "build (cmake)" "FAIL" "see build.log"
    fi
    BIN=$ROOT/build-gpu
else
    echo "no build dependencies (jansson, libmicrohttpd, pcre2) here and no --prebuilt DIR" >&2
    exit 1
fi
# cuBLAS / cudart of the toolkit on this machine
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib; do
    [ -e "$d/libcublas.so.13" ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d && break
done
if ! grep -q "libcublas.so.13 => /" <<< "$(ldd "$BIN/test_cuda")"; then
    d=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null)
    [ -n "$d" ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d
    d=$(python3 -c 'import nvidia.cuda_runtime, os; print(os.path.join(list(nvidia.cuda_runtime.__path__)[0], "lib"))' 2>/dev/null)
    [ -n "$d" ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d
fi
ldd "$BIN/test_cuda" | grep -E "not found|cublas|cudart" | tee "$LOGS/ldd.txt"
export LLMOPT_PROGRAMS=$ROOT/programs LLMOPT_TOKENIZERS=$SHARED/tokenizers
export LLMOPT_STORIES_DIR=$SHARED/models/stories260K
LLMOPT=$BIN/llmopt

# ---- 1. kernel and model parity ---------------------------------------------------------
start=$(date +%s)
timeout 480 "$BIN/test_cuda" >"$LOGS/test_cuda.log" 2>&1 # (~330 s on the H200 since 2026-12-01)
rc=$?
grep -E "FAIL|CHECK failed|skip|passed|device:" "$LOGS/test_cuda.log" | head -40
add "test_cuda (ops, stories, goldens)" "$([ $rc = 0 ] && echo ok || echo FAIL)" \
    "$(tail -1 "$LOGS/test_cuda.log"), $(($(date +%s) - start)) s"

# ---- 2. the CLI on stories260K ----------------------------------------------------------
M=$SHARED/models/stories260K
want=$(python3 -c "import json; print(' '.join(map(str, json.load(open('$M/expected_greedy.json'))['runs']['stories260K-F32.gguf']['ids'])))")
got=$("$LLMOPT" run "$M/stories260K-F32.gguf" -n 256 --temp 0 --ids --backend cuda 2>"$LOGS/stories_cli.err")
if [ "$got" = "$want" ]; then add "llmopt run --backend cuda stories260K" "ok" "256 greedy ids equal"; else
    add "llmopt run --backend cuda stories260K" "FAIL" "$(head -c 120 "$LOGS/stories_cli.err")"; fi
"$LLMOPT" run "$M/stories260K-F32.gguf" -n 256 --temp 0 --backend cuda >/dev/null 2>"$LOGS/stories_cli_speed.err"
add "  stories260K decode (CLI)" "info" "$(grep -o 'generated.*tok/s)' "$LOGS/stories_cli_speed.err")"

# ---- 2b. the server on CUDA ------------------------------------------------------------------
start=$(date +%s)
timeout 300 python3 tests/server/gpu_server_check.py "$LLMOPT" "$SHARED" >"$LOGS/server_cuda.log" 2>&1
rc=$?
cat "$LOGS/server_cuda.log"
add "llmopt serve --backend cuda" "$([ $rc = 0 ] && echo ok || echo FAIL)" \
    "$(grep -c '^ok' "$LOGS/server_cuda.log") ok, $(grep -c '^FAIL' "$LOGS/server_cuda.log") failed, $(($(date +%s) - start)) s"

# ---- 3. kernel lab ------------------------------------------------------------------------
timeout 180 "$BIN/bench_cuda_kernels" $([ $QUICK = 1 ] && echo --quick) >"$LOGS/bench_kernels.log" 2>&1
rc=$?
cat "$LOGS/bench_kernels.log"
add "bench_cuda_kernels" "$([ $rc = 0 ] && echo ok || echo FAIL)" "$(grep -o 'summary.*' "$LOGS/bench_kernels.log")"

# ---- 4. decode on synthesized models ---------------------------------------------------------
PROMPT=$(python3 -c "print(','.join(str(100 + (i * 7919) % 150000) for i in range(512)))")
bench_model() { # like type [parity: 1 = compare 16 greedy ids with the CPU]
    local like=$1 type=$2 parity=${3:-1} f=/tmp/llmopt_gpu_${1}_${2}.gguf
    local s0=$(date +%s)
    if ! "$LLMOPT" synth --like "$like" --type "$type" -o "$f" >"$LOGS/synth_${like}_${type}.log" 2>&1; then
        add "synth $like $type" "FAIL" "$(tail -1 "$LOGS/synth_${like}_${type}.log")"
        return
    fi
    local s1=$(date +%s)
    timeout 240 "$LLMOPT" run "$f" --backend cuda --prompt-ids "$PROMPT" -n 128 --temp 0 -v \
        >/dev/null 2>"$LOGS/run_${like}_${type}.err"
    local rc=$?
    local line=$(grep -o 'prompt.*tok/s)' "$LOGS/run_${like}_${type}.err" | tail -1)
    add "decode $like $type (cuda)" "$([ $rc = 0 ] && echo ok || echo FAIL)" \
        "${line:-$(tail -1 "$LOGS/run_${like}_${type}.err")}; synth $((s1 - s0)) s, run $(($(date +%s) - s1)) s"
    # parity on a short run: the first greedy ids of CPU and CUDA (quantized: informative)
    [ "$parity" = 1 ] || { rm -f "$f"; return; }
    local a b
    a=$("$LLMOPT" run "$f" --backend cuda --prompt-ids "${PROMPT:0:200}" -n 16 --temp 0 --ids 2>/dev/null)
    b=$(timeout 120 "$LLMOPT" run "$f" --prompt-ids "${PROMPT:0:200}" -n 16 --temp 0 --ids 2>/dev/null)
    add "  cpu vs cuda greedy ids ($like $type)" "info" "$([ "$a" = "$b" ] && echo "16/16 equal" || echo "cuda: ${a:0:60} cpu: ${b:0:60}")"
    rm -f "$f"
}
if command -v "$LLMOPT" >/dev/null; then
    bench_model qwen3-0.6b q8_0
    bench_model qwen3-0.6b q4_k_m
    [ $QUICK = 1 ] || bench_model qwen3-0.6b bf16
    [ $QUICK = 1 ] || bench_model qwen3-0.6b iq4_xs # held as q8_0 on the device
    if [ "${GPU_BENCH_8B:-0}" = 1 ]; then
        bench_model qwen3-8b bf16 0
        bench_model qwen3-8b q8_0 0
        bench_model qwen3-8b q4_k_m 0
    fi
fi

echo
echo "==================== summary ($(elapsed) s) ===================="
printf '%s\n' "${SUMMARY[@]}" | tee "$LOGS/summary.txt"
cp "$LOGS/summary.txt" "$LOGS/test_cuda.log" "$LOGS/bench_kernels.log" "$OUT/" 2>/dev/null
tar czf "$OUT/gpu_logs.tar.gz" -C "$OUT" logs && rm -rf "$LOGS"
