#!/usr/bin/env bash
# Capture every stock program and write every golden, then check them, in one run.
# Needs python3 with torch >= 2.4, transformers and safetensors (the GPU machine has them;
# no GPU is used, nothing is downloaded). Usage:
#   scripts/capture_on_device.sh [DEST]        (default out/capture)
# Outputs under DEST:
#   programs/<arch>/graph.json, map.json        -> programs/<arch>/
#   golden/<arch>_tiny/{model.gguf,golden.json,README.md,hf/}  -> tests/golden/<arch>_tiny/
#   log.txt, debug/export_<arch>.txt, debug/ir_<arch>.txt   (logs)
# and DEST.tar.gz holding all of it (the device returns few files: copy that one back).
# Architectures: every one in python/llmopt/archs.py (ARCHS="llama qwen2" to pick).
set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
cd "$(dirname "$0")/.."
DEST=${1:-$PWD/out/capture}
case "$DEST" in /*) ;; *) DEST=$PWD/$DEST ;; esac
rm -rf "$DEST"
mkdir -p "$DEST/programs" "$DEST/golden" "$DEST/debug"
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
ARCHS=${ARCHS:-$(python3 -c 'import sys; sys.path.insert(0, "python"); from llmopt.archs import ARCHS; print(" ".join(sorted(ARCHS)))')}

{
    python3 -c 'import sys, torch, transformers, safetensors; print(sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__, "safetensors", safetensors.__version__)'
    declare -A rc_cap rc_gold rc_gguf rc_hf
    list=$(echo $ARCHS | tr ' ' ','),  # a trailing comma: always DEST/.../<arch>/
    # one process per step (torch and transformers load once); each architecture's failure
    # is reported and does not stop the others; time limits keep the whole run bounded
    timeout "${CAPTURE_TIMEOUT:-200}" python3 -m llmopt.capture --hf-arch "$list" -o "$DEST/programs" \
        --debug-dir "$DEST/debug" 2>&1 | tee "$DEST/debug/capture.txt"
    timeout "${GOLDEN_TIMEOUT:-120}" python3 -m llmopt.golden --arch "$list" -o "$DEST/golden" 2>&1 \
        | tee "$DEST/debug/golden.txt"
    for a in $ARCHS; do
        grep -q "^capture $a: OK" "$DEST/debug/capture.txt" && rc_cap[$a]=0 || rc_cap[$a]=1
        grep -q "^golden $a: OK" "$DEST/debug/golden.txt" && rc_gold[$a]=0 || rc_gold[$a]=1
    done
    for a in $ARCHS; do
        rc_gguf[$a]=skipped
        rc_hf[$a]=skipped
        [ "${rc_cap[$a]}" = 0 ] && [ "${rc_gold[$a]}" = 0 ] || continue
        p=$DEST/programs/$a g=$DEST/golden/${a}_tiny
        echo "==================== ref_interp $a (gguf) ===================="
        timeout 60 python3 -m llmopt.ref_interp --graph "$p/graph.json" --map "$p/map.json" --gguf "$g/model.gguf" \
            --golden "$g/golden.json"
        rc_gguf[$a]=$?
        echo "==================== ref_interp $a (hf) ===================="
        timeout 60 python3 -m llmopt.ref_interp --graph "$p/graph.json" --map "$p/map.json" --hf "$g/hf" \
            --golden "$g/golden.json"
        rc_hf[$a]=$?
    done
    echo "==================== program selection ===================="
    python3 - "$DEST" <<'PY'
import os, sys
sys.path.insert(0, "python")
from llmopt import ref_interp as RI
from llmopt.gguf_writer import GGUFFile
from llmopt.safetensors_io import HFCheckpoint
dest = sys.argv[1]
progs = os.path.join(dest, "programs")
for d in sorted(os.listdir(os.path.join(dest, "golden"))):
    g = os.path.join(dest, "golden", d)
    for what, load in (("gguf", lambda: GGUFFile(os.path.join(g, "model.gguf"))), ("hf", lambda: HFCheckpoint(os.path.join(g, "hf")))):
        try:
            name, hp, params, refusals = RI.select_program(progs, load())
        except Exception as e:
            print("%-12s %-4s -> error %s" % (d, what, e))
            continue
        print("%-12s %-4s -> %s   (refused: %s)" % (d, what, name, "; ".join("%s: %s" % kv for kv in sorted(refusals.items()))))
PY
    echo "==================== summary ===================="
    ok=1
    for a in $ARCHS; do
        echo "$a: capture rc=${rc_cap[$a]} golden rc=${rc_gold[$a]} ref_interp gguf rc=${rc_gguf[$a]} hf rc=${rc_hf[$a]}"
        [ "${rc_cap[$a]}" = 0 ] && [ "${rc_gold[$a]}" = 0 ] && [ "${rc_gguf[$a]}" = 0 ] && [ "${rc_hf[$a]}" = 0 ] || ok=0
        if [ -f "$DEST/programs/$a/graph.json" ]; then
            python3 - "$DEST/programs/$a/graph.json" <<'PY'
import json, sys
sys.path.insert(0, "python")
from llmopt import ir
g = json.load(open(sys.argv[1]))
print("  graph.json: %d nodes (%d top level), %d params" % (ir.count_nodes(g), len(g["nodes"]), len(g["params"])))
print("  ops:", json.dumps(ir.op_histogram(g)))
PY
        fi
    done
    grep -h -E "^check|max_rel|^golden .*seed|^golden .*bytes|^hf/" "$DEST/log.txt" 2>/dev/null || true
    [ "$ok" = 1 ]
} 2>&1 | tee "$DEST/log.txt"
rc=$?
tar czf "$DEST.tar.gz" -C "$DEST" . && echo "packed $DEST.tar.gz ($(du -h "$DEST.tar.gz" | cut -f1))"
exit $rc
