#!/usr/bin/env bash
# Capture the stock Llama program and write the Llama goldens, then check them.
# Needs python3 with torch >= 2.4 and transformers (the GPU machine has both; no GPU is
# used). Outputs go to $OUT (default out/capture):
#   llama/graph.json llama/map.json         -> programs/llama/
#   llama_tiny/model.gguf llama_tiny/golden.json -> tests/golden/llama_tiny/
#   log.txt export_llama.txt ir_llama.txt    (logs)
set -x
set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out/capture}
mkdir -p "$OUT/llama" "$OUT/llama_tiny"
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}

{
    python3 -c 'import sys, torch, transformers; print(sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__)'
    python3 -m unittest discover -s python/tests 2>&1 | tail -3
    python3 -m llmopt.capture --hf-arch llama -o "$OUT/llama" --debug-dir "$OUT"
    rc_capture=$?
    python3 -m llmopt.golden --arch llama -o "$OUT/llama_tiny"
    rc_golden=$?
    rc_interp=skipped
    if [ "$rc_capture" = 0 ] && [ "$rc_golden" = 0 ]; then
        python3 -m llmopt.ref_interp --graph "$OUT/llama/graph.json" --map "$OUT/llama/map.json" \
            --gguf "$OUT/llama_tiny/model.gguf" --golden "$OUT/llama_tiny/golden.json"
        rc_interp=$?
    fi
    set +x
    echo "==================== summary ===================="
    echo "capture rc=$rc_capture golden rc=$rc_golden ref_interp rc=$rc_interp"
    if [ -f "$OUT/llama/graph.json" ]; then
        python3 - "$OUT/llama/graph.json" <<'PY'
import json, sys
sys.path.insert(0, "python")
from llmopt import ir
g = json.load(open(sys.argv[1]))
print("graph.json: %d nodes (%d top level), %d params" % (ir.count_nodes(g), len(g["nodes"]), len(g["params"])))
print("ops:", json.dumps(ir.op_histogram(g)))
PY
    fi
    ls -l "$OUT" "$OUT/llama" "$OUT/llama_tiny"
    grep -h -E "^check|max_rel|^golden" "$OUT/log.txt" 2>/dev/null | grep -v "^+" || true
    [ "$rc_capture" = 0 ] && [ "$rc_golden" = 0 ] && [ "$rc_interp" = 0 ]
} 2>&1 | tee "$OUT/log.txt"
