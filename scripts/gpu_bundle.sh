#!/usr/bin/env bash
# Binaries built here, packed for the GPU machine (issue 8), and unpacked there.
#
#   scripts/gpu_bundle.sh pack NAME=BUILD_DIR [NAME=BUILD_DIR ...]   (here)
#   scripts/gpu_bundle.sh unpack                                     (on the device)
#
# pack strips llmopt, test_cuda, bench_cuda_kernels, bench_cuda_block, bench_batch_decode and bench_loadgen
# (those that exist) of each build directory into NAME/, and writes into .gpu/ (ignore it
# in .git/info/exclude; pass it to the device's `run` as carry: [".gpu"]):
#   bins.tar.xz  every NAME/ in one xz stream with a 256 MiB dictionary. The binaries
#                share llmopt_core and its CUDA fatbin, so they compress together: 5
#                binaries of two builds took 26-32 MB this way against 14 MB each
#                alone, which keeps a call under the device's 64 MiB of files;
#   aux.tar.xz   lib/ (the shared libraries llmopt links that are not glibc, libstdc++
#                or CUDA's) and shared/ (stories260K and llama-2-tiny-random, which
#                test_cuda and tests/server/gpu_server_check.py read, and the qwen2
#                vocabulary that `llmopt synth --like qwen3-*` reads), from ../shared.
# So `pack bin=BUILD_DIR` and `unpack` give scripts/gpu_tests.sh --prebuilt .gpu its
# layout (.gpu/bin, .gpu/lib, .gpu/shared).
# unpack, on the device, extracts both into .gpu/ and writes .gpu/env.sh, which sets
# LD_LIBRARY_PATH (lib/ and the toolkit's cuBLAS), LLMOPT_PROGRAMS, LLMOPT_TOKENIZERS and
# LLMOPT_STORIES_DIR. A device script then runs, for example:
#   bash scripts/gpu_bundle.sh unpack && . .gpu/env.sh && .gpu/new/test_cuda
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
G=$ROOT/.gpu

pack() {
    [ $# -gt 0 ] || { echo "usage: $0 pack NAME=BUILD_DIR ..." >&2; exit 2; }
    STAGE=$(mktemp -d)
    trap 'rm -rf "$STAGE"' EXIT
    local stage=$STAGE
    local first=""
    for arg in "$@"; do
        local name=${arg%%=*} dir=${arg#*=}
        [ "$name" != "$arg" ] && [ -n "$name" ] && [ -d "$dir" ] || { echo "not NAME=BUILD_DIR: $arg" >&2; exit 2; }
        mkdir -p "$stage/bins/$name"
        local n=0
        for b in llmopt test_cuda bench_cuda_kernels bench_cuda_block bench_batch_decode bench_loadgen; do
            [ -x "$dir/$b" ] && strip -o "$stage/bins/$name/$b" "$dir/$b" && n=$((n + 1))
        done
        [ $n -gt 0 ] || { echo "no binaries in $dir" >&2; exit 1; }
        [ -n "$first" ] || first=$dir
    done
    mkdir -p "$G"
    tar cf - -C "$stage/bins" . | xz -T1 --lzma2=preset=6,dict=256MiB > "$G/bins.tar.xz"
    local shared=$ROOT/../shared
    mkdir -p "$stage/aux/lib" "$stage/aux/shared/tokenizers" "$stage/aux/shared/models"
    ldd "$first/llmopt" | awk '/=> \//{print $3}' |
        grep -v -E 'lib(c|m|dl|rt|pthread|gcc_s|stdc\+\+|cuda|cudart|cublas|cublasLt)\.so|ld-linux' |
        while read -r lib; do cp -L "$lib" "$stage/aux/lib/"; done
    cp "$shared/tokenizers/ggml-vocab-qwen2.gguf" "$stage/aux/shared/tokenizers/"
    cp -r "$shared/models/stories260K" "$shared/models/llama-2-tiny-random" "$stage/aux/shared/models/"
    tar cf - -C "$stage/aux" lib shared | xz -T2 -6 > "$G/aux.tar.xz"
    ls -l "$G/bins.tar.xz" "$G/aux.tar.xz"
    echo "with the tracked files: $(($(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) + $(du -cb "$G" | tail -1 | cut -f1))) bytes (the device takes 67108864)"
}

unpack() {
    cd "$G"
    xz -dc bins.tar.xz | tar xf -
    xz -dc aux.tar.xz | tar xf -
    local ld=$G/lib
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
        [ -e "$d/libcublas.so.13" ] && ld=$ld:$d && break
    done
    cat > "$G/env.sh" << EOF
export LD_LIBRARY_PATH=$ld\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
export LLMOPT_PROGRAMS=$ROOT/programs LLMOPT_TOKENIZERS=$G/shared/tokenizers
export LLMOPT_STORIES_DIR=$G/shared/models/stories260K
EOF
}

case "${1:-}" in
pack) shift; pack "$@" ;;
unpack) unpack ;;
*) echo "usage: $0 pack NAME=BUILD_DIR ... | unpack" >&2; exit 2 ;;
esac
