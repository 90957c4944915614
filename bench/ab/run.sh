#!/bin/sh
# Builds and runs the A/B harnesses of bench/ab against build/libllmopt_core.a (Release).
#   bench/ab/run.sh OLD_COMMIT [ab_linear.c arguments]   old vs this tree's AVX-512 table
#   bench/ab/run.sh prefetch [hot]                       software prefetch variants
#   bench/ab/run.sh OLD_COMMIT attention [depth] [kv]    decode attention, old vs this tree
#   bench/ab/run.sh OLD_COMMIT prefill [gemm|attention|all] [tokens]  Qwen3-0.6B F16 prefill kernels
set -e
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc="gcc -O2 -std=gnu17 -I$root/src -I$root/include"
if [ "$1" = prefetch ]; then
    $cc "$root/bench/ab/prefetch.c" "$root/build/libllmopt_core.a" -lm -lpthread -o "$tmp/prefetch"
    shift
    "$tmp/prefetch" "$@"
    exit 0
fi
old=$1
shift
mkdir -p "$tmp/old/backend/cpu"
git -C "$root" show "$old:src/backend/cpu/isa_avx512.c" > "$tmp/old/isa_avx512.c"
git -C "$root" show "$old:src/backend/cpu/kern_generic.h" > "$tmp/old/backend/cpu/kern_generic.h"
if git -C "$root" cat-file -e "$old:src/backend/cpu/kern_x86.h" 2>/dev/null; then
    git -C "$root" show "$old:src/backend/cpu/kern_x86.h" > "$tmp/old/backend/cpu/kern_x86.h"
fi
# the old file's own headers first (kern_generic.h), this tree's for the rest
$cc -I"$tmp/old" -Dcpu_isa_kernels_avx512=cpu_isa_kernels_avx512_old -c "$tmp/old/isa_avx512.c" -o "$tmp/old.o"
harness=ab_linear.c
if [ "$1" = attention ]; then harness=ab_attention.c; fi
if [ "$1" = prefill ]; then harness=ab_prefill.c; fi
$cc "$root/bench/ab/$harness" "$tmp/old.o" "$root/build/libllmopt_core.a" -lm -lpthread -o "$tmp/ab"
"$tmp/ab" "$@"
