#!/usr/bin/env python3
"""Timeline of one CUDA decode step from a trace build's records.

A diagnostic build (cmake ... -DCMAKE_CUDA_FLAGS=-DLLMOPT_CUDA_TRACE) run with
LLMOPT_CUDA_TRACE_STEP=N LLMOPT_CUDA_TRACE_OUT=FILE writes, for the N-th one-token
step, a line per block: grid id, source line of the kernel's cu_pdl_trigger call,
block, SM, blocks in the grid, and %globaltimer (ns) at the block's start, after its
cu_pdl_wait (0: none) and at its end (0: no CU_TRACE_END; thread 0's end). This prints
one row per launch in start order, in µs from the step's first block:

  line    the trigger's source line (which kernel: grep cu_pdl_trigger in src/backend/cuda)
  start   first and last block start (blocks start early under PDL)
  wait    first and last return from cu_pdl_wait (the kernel before has completed)
  end     first and last block end
  gap     first wait of this launch minus the last end of the launch before: what a
          kernel boundary costs (thread 0 ends; other warps of a block may end later)

usage: cuda_trace.py FILE [FIRST [COUNT]]   (launches FIRST .. FIRST + COUNT - 1)
"""
import collections
import sys


def launches(path):
    grids = collections.OrderedDict()
    with open(path) as f:
        for line in f:
            g, src, blk, sm, nb, t0, tw, te = line.split()
            grids.setdefault(g, []).append((int(src), int(blk), int(sm), int(nb), int(t0), int(tw), int(te)))
    out = []
    for recs in grids.values():
        waits = [r[5] for r in recs if r[5]]
        ends = [r[6] for r in recs if r[6]]
        out.append({
            "line": recs[0][0], "blocks": len(recs), "sms": len({r[2] for r in recs}),
            "s0": min(r[4] for r in recs), "s1": max(r[4] for r in recs),
            "w0": min(waits) if waits else 0, "w1": max(waits) if waits else 0,
            "e0": min(ends) if ends else 0, "e1": max(ends) if ends else 0,
        })
    out.sort(key=lambda d: d["s0"])
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    ls = launches(sys.argv[1])
    first = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    t = ls[0]["s0"]
    us = lambda v: (v - t) / 1000 if v else float("nan")
    print("%5s %6s %4s | %8s %8s | %8s %8s | %8s %8s | %6s" %
          ("line", "blocks", "sms", "start0", "start1", "wait0", "wait1", "end0", "end1", "gap"))
    prev_end = None
    for i, d in enumerate(ls):
        gap = (d["w0"] - prev_end) / 1000 if prev_end and d["w0"] else float("nan")
        if first <= i < first + count:
            print("%5d %6d %4d | %8.2f %8.2f | %8.2f %8.2f | %8.2f %8.2f | %6.2f" %
                  (d["line"], d["blocks"], d["sms"], us(d["s0"]), us(d["s1"]), us(d["w0"]), us(d["w1"]),
                   us(d["e0"]), us(d["e1"]), gap))
        if d["e1"]:
            prev_end = d["e1"]
    span = max(d["e1"] or d["s1"] for d in ls) - t
    print("%d launches, %.1f us from the first block's start to the last end" % (len(ls), span / 1000))


if __name__ == "__main__":
    main()
