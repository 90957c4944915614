#!/usr/bin/env bash
# Decode A/B on the GPU machine (bench/results/cuda-fusion-2026-11-29.md): test_cuda (and
# the fallbacks if it fails), stories CLI, decode A/B of the switches on 0.6B q8_0 and 8B
# bf16, profiles. Binaries (llmopt,
# test_cuda, stripped) beside this script; .gpu/lib and .gpu/shared as for gpu_tests.sh:
# copy it with the binaries to an ignored folder D, run(command="bash D/gpu_decode_ab.sh",
# carry=[".gpu/lib", ".gpu/shared", "D"]).
set -uo pipefail
C=$(cd "$(dirname "$0")" && pwd); G=$PWD/.gpu; OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=$G/lib
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [ -e "$d/libcublas.so.13" ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d && break; done
export LLMOPT_PROGRAMS=$PWD/programs LLMOPT_TOKENIZERS=$G/shared/tokenizers LLMOPT_STORIES_DIR=$G/shared/models/stories260K
S=$OUT/summary.txt; B=$OUT/bench.log; P=$OUT/prof.log; log() { echo "$*" | tee -a "$S"; }
T0=$(date +%s); el() { echo "[$(($(date +%s) - T0)) s]"; }
log "date $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader)"
timeout 240 $C/test_cuda > $OUT/test.log 2>&1; rc=$?; log "test_cuda rc=$rc $(el)"
grep -E "FAIL|passed|failed" $OUT/test.log | head -20 >> $S
if [ $rc -ne 0 ]; then
  LLMOPT_CUDA_ATT_WARP=0 timeout 200 $C/test_cuda > $OUT/test_nowarp.log 2>&1; log "test_cuda ATT_WARP=0 rc=$?"
  LLMOPT_CUDA_FUSE_NORM=0 timeout 200 $C/test_cuda > $OUT/test_nonorm.log 2>&1; log "test_cuda FUSE_NORM=0 rc=$?"
fi
M=$G/shared/models/stories260K
want=$(python3 -c "import json; print(' '.join(map(str, json.load(open('$M/expected_greedy.json'))['runs']['stories260K-F32.gguf']['ids'])))")
got=$($C/llmopt run $M/stories260K-F32.gguf -n 256 --temp 0 --ids --backend cuda 2>>$B)
[ "$got" = "$want" ] && log "CLI stories260K cuda: 256 greedy ids equal" || log "CLI stories260K cuda: DIFFER"
b1() { local tag=$1 f=$2; shift 2; echo "==== $tag $*" >> $B
  env "$@" timeout 150 $C/llmopt bench $f --backend cuda -p 512 -n 128 -r 3 >> $B 2>&1
  log "$tag rc=$? $(tail -4 $B | grep -E '^(prefill|decode)' | tr -s ' ' | cut -c1-90 | tr '\n' ';') $(el)"; }
pf() { local tag=$1 f=$2 n=$3; shift 3; echo "==== $tag $*" >> $P
  env LLMOPT_CUDA_PROFILE=1 "$@" timeout 100 $C/llmopt bench $f --backend cuda -p 512 -n $n -r 1 >> $P 2>&1; }
f=/tmp/q06.gguf; timeout 100 $C/llmopt synth --like qwen3-0.6b --type q8_0 -o $f > /dev/null 2>&1 || log "synth 0.6b FAIL"
b1 q06_new $f X=1
b1 q06_attold $f LLMOPT_CUDA_ATT_WARP=0
b1 q06_nonorm $f LLMOPT_CUDA_FUSE_NORM=0
b1 q06_nofuse $f LLMOPT_CUDA_FUSE=0 LLMOPT_CUDA_FUSE_NORM=0
b1 q06_new2 $f X=1
pf q06 $f 64 X=1
rm -f $f
f=/tmp/q8b.gguf; s0=$(date +%s); timeout 150 $C/llmopt synth --like qwen3-8b --type bf16 -o $f > /dev/null 2>&1 || log "synth 8b FAIL"
log "synth 8b $(($(date +%s) - s0)) s $(el)"
b1 q8b_new $f X=1
b1 q8b_attold $f LLMOPT_CUDA_ATT_WARP=0
b1 q8b_nofuse $f LLMOPT_CUDA_FUSE=0 LLMOPT_CUDA_FUSE_NORM=0
pf q8b $f 32 X=1
rm -f $f
log "done $(el)"
