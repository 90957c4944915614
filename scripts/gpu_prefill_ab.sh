#!/usr/bin/env bash
# Prefill (issue 8) on the GPU machine: test_cuda (quick: attention, decode_fusion,
# linear; full: all groups), stories260K CLI ids, copy bandwidth, the prefill attention
# lab, an 8B-shaped bf16 bench (512-token prompt) by default and under each A/B
# environment given, a prefill profile, and a 0.6B bf16 CPU/CUDA ids check after a
# 100-token prompt. Binaries from $GPU_BIN (default .gpu-pf/bin), libraries and models
# from .gpu/ (docs/cuda.md). Usage: gpu_prefill_ab.sh quick|full ["ENV=V ..." ...]
set -uo pipefail
P=$(cd .gpu && pwd); B=$(cd "${GPU_BIN:-.gpu-pf/bin}" && pwd); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=$P/lib
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [ -e "$d/libcublas.so.13" ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d && break; done
export LLMOPT_PROGRAMS=$PWD/programs LLMOPT_TOKENIZERS=$P/shared/tokenizers LLMOPT_STORIES_DIR=$P/shared/models/stories260K
S=$OUT/summary.txt; log() { echo "$*" | tee -a "$S"; }
T0=$(date +%s); el() { echo "[$(($(date +%s) - T0)) s]"; }
MODE=$1; shift
log "date $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader) mode $MODE"
if [ "$MODE" = quick ]; then
  LLMOPT_CUDA_TEST_ONLY=attention,decode_fusion,linear timeout 90 $B/test_cuda > $OUT/test_cuda.log 2>&1; log "test_cuda (attention, decode_fusion, linear) rc=$? $(el)"
else
  timeout 90 $B/test_cuda > $OUT/test_cuda.log 2>&1; log "test_cuda rc=$? $(el)"
fi
grep -E "FAIL|passed, |tensor cores" $OUT/test_cuda.log | tail -12 >> $S
M=$P/shared/models/stories260K
want=$(python3 -c "import json; print(' '.join(map(str, json.load(open('$M/expected_greedy.json'))['runs']['stories260K-F32.gguf']['ids'])))")
got=$($B/llmopt run $M/stories260K-F32.gguf -n 256 --temp 0 --ids --backend cuda 2>$OUT/cli.err)
[ "$got" = "$want" ] && log "CLI stories260K cuda: 256 greedy ids equal" || log "CLI stories260K cuda: DIFFER $(head -c 300 $OUT/cli.err)"
timeout 30 $B/bench_cuda_kernels --quick > $OUT/kernels.log 2>&1; log "kernels rc=$? $(grep -i copy $OUT/kernels.log | head -1) $(el)"
timeout 60 $B/bench_cuda_kernels --attention > $OUT/attention.log 2>&1; log "attention lab rc=$? $(el)"; grep "prefill attention" $OUT/attention.log | tee -a $S
f=/tmp/m8.gguf
timeout 100 $B/llmopt synth --like qwen3-8b --type bf16 -o $f > /dev/null 2>&1 || log "synth FAIL"
log "synth 8B bf16 $(el)"
i=0
for envs in "" "$@"; do
  i=$((i+1))
  env $envs timeout 40 $B/llmopt bench $f --backend cuda -p 512 -n 128 -r 3 > $OUT/b$i.txt 2>&1
  log "bench [$envs] rc=$? $(grep -E '^(prefill|decode)' $OUT/b$i.txt | tr -s ' ' | tr '\n' ';') $(el)"
done
LLMOPT_CUDA_PROFILE=1 timeout 40 $B/llmopt bench $f --backend cuda -p 512 -n 8 -r 1 > $OUT/prof.txt 2>&1
log "profile rc=$? $(el)"; grep "prefill schedule" $OUT/prof.txt | tee -a $S; sed -n '/prefill (batches/,/decode (batches/p' $OUT/prof.txt | head -16 | tee -a $S
rm -f $f
q=/tmp/q6.gguf; timeout 60 $B/llmopt synth --like qwen3-0.6b --type bf16 -o $q > /dev/null 2>&1
ids=$(python3 -c "import random; random.seed(7); print(','.join(str(random.randrange(1000, 100000)) for _ in range(100)))")
c=$(timeout 60 $B/llmopt run $q --prompt-ids $ids -n 16 --temp 0 --ids 2>/dev/null)
g=$(timeout 60 $B/llmopt run $q --prompt-ids $ids -n 16 --temp 0 --ids --backend cuda 2>/dev/null)
[ -n "$c" ] && [ "$c" = "$g" ] && log "0.6B bf16 100-token prompt, 16 ids cpu==cuda: $g" || log "0.6B bf16 ids cpu: $c | cuda: $g"
log "done $(el)"
