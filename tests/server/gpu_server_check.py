#!/usr/bin/env python3
"""`llmopt serve --backend cuda` end to end, on the GPU machine (issue 8; run by
scripts/gpu_tests.sh). Python's standard library only: the GPU machine has no node.

  python3 tests/server/gpu_server_check.py path/to/llmopt SHARED_DIR [BACKEND]

(BACKEND: cuda by default; cpu runs the same checks here, where they test the script.)

1. stories260K F32 on CUDA, 4 slots: four greedy completions from BOS at once, one of
   them streamed, each reproduce expected_greedy.json's text (the CLI's own check,
   now through the scheduler's batched steps); a seeded sampled request gives the
   same text twice.
2. llama-2-tiny-random (32,000 ids: the session samples on the device from 16,384 ids
   up) on CUDA, once with device sampling and once with LLMOPT_DEVICE_SAMPLING=0 (the
   logits copied back, sampled on the host): seeded requests with top-k and penalties,
   with the API's defaults (a whole-row draw) and greedy with a presence penalty give
   the same text on both servers.
Every server listens on 127.0.0.1 with a free port and is stopped at the end. Prints
`ok`/`FAIL` lines; exit status 1 when a check fails."""
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request

LLMOPT, SHARED = sys.argv[1], sys.argv[2]
BACKEND = sys.argv[3] if len(sys.argv) > 3 else "cuda"
fails = 0


def check(cond, what, detail=""):
    global fails
    print(("ok   " if cond else "FAIL ") + what + ("" if cond else ": " + detail[:400]), flush=True)
    fails += not cond


class Server:
    def __init__(self, model, *args, env=None):
        self.log = open(f"/tmp/llmopt_gpu_serve_{os.getpid()}_{id(self)}.log", "w+")
        e = dict(os.environ, **(env or {}))
        self.p = subprocess.Popen([LLMOPT, "serve", model, "--port", "0", "--backend", BACKEND, *args],
                                  stdout=subprocess.DEVNULL, stderr=self.log, env=e)
        self.port = None
        for _ in range(600):
            self.log.seek(0)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", self.log.read())
            if m:
                self.port = int(m.group(1))
                break
            if self.p.poll() is not None:
                break
            time.sleep(0.1)
        if not self.port:
            self.log.seek(0)
            raise RuntimeError("the server did not start: " + self.log.read()[-800:])

    def complete(self, body, timeout=120):
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            if not body.get("stream"):
                return json.load(r)["choices"][0]["text"]
            text = ""
            for line in r:
                line = line.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                for c in json.loads(line[6:]).get("choices", []):
                    text += c.get("text", "")
            return text

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()
        self.log.seek(0)
        tail = self.log.read()[-300:]
        self.log.close()
        os.unlink(self.log.name)
        return self.p.returncode, tail


def at_once(srv, bodies):
    out = [None] * len(bodies)

    def one(i):
        try:
            out[i] = srv.complete(bodies[i])
        except Exception as e:  # the check below reports it
            out[i] = f"<error {e}>"

    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


# ---- 1. stories260K -------------------------------------------------------------------
stories = os.path.join(SHARED, "models/stories260K")
want = json.load(open(os.path.join(stories, "expected_greedy.json")))["runs"]["stories260K-F32.gguf"]["text"]
srv = Server(os.path.join(stories, "stories260K-F32.gguf"), "--parallel", "4", "--ctx", "512")
try:
    greedy = {"prompt": "", "max_tokens": 200, "temperature": 0}
    got = at_once(srv, [greedy, greedy, greedy, dict(greedy, stream=True)])
    for i, g in enumerate(got):
        check(len(g) > 300 and want.startswith(g), f"stories260K on {BACKEND}, request {i + 1} of 4 at once"
              f"{' (streamed)' if i == 3 else ''}: greedy text equals expected_greedy.json",
              f"got {g[:120]!r}")
    sampled = {"prompt": "Once upon a time", "max_tokens": 64, "temperature": 0.8, "top_k": 40, "seed": 11}
    a, b = srv.complete(sampled), srv.complete(sampled)
    check(a == b and len(a) > 20, f"stories260K on {BACKEND}: a seeded sampled request repeats", f"{a!r} / {b!r}")
finally:
    rc, tail = srv.stop()
    check(rc == 0, "stories260K server stops cleanly on SIGTERM", tail)

# ---- 2. device sampling against host sampling -------------------------------------------
tiny = os.path.join(SHARED, "models/llama-2-tiny-random/llama-2-tiny-random.gguf")
requests = [
    {"prompt": "The cat", "max_tokens": 48, "temperature": 0.9, "top_k": 40, "top_p": 0.95, "min_p": 0.02,
     "repetition_penalty": 1.1, "seed": 5},
    {"prompt": "Hello there", "max_tokens": 48, "seed": 9},  # the API's defaults: a whole-row draw
    {"prompt": "A B C", "max_tokens": 48, "temperature": 0, "presence_penalty": 1.5, "frequency_penalty": 0.5},
]
texts = {}
for mode in ("1", "0"):
    srv = Server(tiny, "--parallel", "2", "--ctx", "256", env={"LLMOPT_DEVICE_SAMPLING": mode})
    try:
        texts[mode] = [srv.complete(r) for r in requests]
    finally:
        srv.stop()
for i, (d, h) in enumerate(zip(texts["1"], texts["0"])):
    check(d == h and len(d) > 0, f"llama-2-tiny-random on {BACKEND}, request {i + 1}: device sampling = host sampling",
          f"device {d[:100]!r} host {h[:100]!r}")

sys.exit(1 if fails else 0)
