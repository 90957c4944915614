#!/usr/bin/env bash
# LFM2 only, kept short: capture programs/lfm2 and write tests/golden/lfm2_tiny in one run
# (the two in parallel), plus transformers' LFM2 source for reference. Needs python3 with
# torch >= 2.4, transformers (with LFM2) and safetensors; no GPU is used, nothing is
# downloaded. Usage:
#   scripts/capture_lfm2_on_device.sh [DEST]        (default out/capture_lfm2)
# Outputs under DEST:
#   programs/lfm2/{graph.json,map.json}                 -> programs/lfm2/
#   golden/lfm2_tiny/{model.gguf,golden.json,README.md,hf/} -> tests/golden/lfm2_tiny/
#   log.txt, debug/{capture,golden}.txt, debug/export_lfm2.txt, debug/ir_lfm2.txt,
#   debug/modeling_lfm2.py, debug/configuration_lfm2.py
# The checks that need no torch (ref_interp replaying the golden through the program
# from both files) run anywhere afterwards: python3 -m unittest discover -s python/tests
set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
cd "$(dirname "$0")/.."
DEST=${1:-$PWD/out/capture_lfm2}
case "$DEST" in /*) ;; *) DEST=$PWD/$DEST ;; esac
rm -rf "$DEST"
mkdir -p "$DEST/programs" "$DEST/golden" "$DEST/debug"
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
{
    python3 - "$DEST/debug" <<'PY'
import inspect, os, sys
import torch, transformers
print(sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__)
from transformers.models.lfm2 import modeling_lfm2, configuration_lfm2
for mod in (modeling_lfm2, configuration_lfm2):
    with open(os.path.join(sys.argv[1], mod.__name__.rsplit(".", 1)[1] + ".py"), "w") as f:
        f.write(inspect.getsource(mod))
print("wrote transformers' LFM2 sources")
PY
    timeout "${CAPTURE_TIMEOUT:-180}" python3 -m llmopt.capture --hf-arch lfm2 -o "$DEST/programs/lfm2" \
        --debug-dir "$DEST/debug" >"$DEST/debug/capture.txt" 2>&1 &
    cap=$!
    timeout "${GOLDEN_TIMEOUT:-180}" python3 -m llmopt.golden --arch lfm2 -o "$DEST/golden/lfm2_tiny" \
        >"$DEST/debug/golden.txt" 2>&1 &
    gold=$!
    wait $cap; rc_cap=$?
    wait $gold; rc_gold=$?
    echo "==================== capture (rc $rc_cap) ===================="
    cat "$DEST/debug/capture.txt"
    echo "==================== golden (rc $rc_gold) ===================="
    cat "$DEST/debug/golden.txt"
    echo "summary: capture rc=$rc_cap golden rc=$rc_gold"
    [ $rc_cap = 0 ] && [ $rc_gold = 0 ]
} 2>&1 | tee "$DEST/log.txt"
rc=$?
tar czf "$DEST.tar.gz" -C "$DEST" . && echo "packed $DEST.tar.gz ($(du -h "$DEST.tar.gz" | cut -f1))"
exit $rc
