#!/usr/bin/env bash
# The OpenAI-compatible server (issue 6), end to end: command-line errors, the request
# parser's fuzz entry on mutated inputs, then tests/server/server_test.mjs, which drives
# live servers with the official OpenAI client (chat and completions, streaming, stop
# sequences, seeds, usage, logprobs, auth, bad input, abuse, metrics, disconnects and a
# 32-client load test). Every server is started on 127.0.0.1 with a free port and killed
# at the end.
#   bash tests/cli/test_server.sh path/to/llmopt [--quick]
set -uo pipefail
LLMOPT=$(realpath "${1:?usage: test_server.sh path/to/llmopt [--quick]}")
shift
BUILD=$(dirname "$LLMOPT")
M=../shared/models/stories260K/stories260K-F32.gguf
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# 1. Command-line errors come back at once with a clear message.
out=$(timeout 20 "$LLMOPT" serve 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "missing MODEL" <<< "$out" && ok "serve without a model: usage error" || bad "serve without a model: $rc $out"
out=$(timeout 20 "$LLMOPT" serve $M --port 99999 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "'99999'" <<< "$out" && ok "serve --port out of range" || bad "serve --port out of range: $rc $out"
out=$(timeout 20 "$LLMOPT" serve $M --stream-batch 15 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "stream-batch needs 1..14, got '15'" <<< "$out" && ok "serve --stream-batch out of range" || bad "serve --stream-batch out of range: $rc $out"
out=$(timeout 20 "$LLMOPT" serve /nonexistent.gguf --port 0 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "/nonexistent.gguf" <<< "$out" && ok "serve a missing file" || bad "serve a missing file: $rc $out"
out=$(timeout 20 "$LLMOPT" serve $M --port 0 --chat-template /nonexistent.jinja 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "nonexistent.jinja" <<< "$out" && ok "serve a missing chat template" || bad "serve a missing chat template: $rc $out"
out=$(timeout 20 "$LLMOPT" serve $M --port 0 --backend nosuch 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "unknown backend 'nosuch'" <<< "$out" && ok "serve --backend with an unknown name" || bad "serve --backend nosuch: $rc $out"
out=$(timeout 20 "$LLMOPT" serve $M --port 0 --backend cuda --engines 2 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "2 engines on backend 'cuda'" <<< "$out" && ok "serve refuses several engines on a device" || bad "serve --backend cuda --engines 2: $rc $out"

# 2. The request parser's fuzz entry over the corpus and a few thousand mutations.
if [ -x "$BUILD/fuzz_server_request" ]; then
    python3 - tests/server/corpus "$tmp/mut" <<'PY'
import os, random, sys
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst)
seeds = [open(os.path.join(src, f), "rb").read() for f in sorted(os.listdir(src))]
rnd = random.Random(6)
tokens = [b"{", b"}", b"[", b"]", b'"', b":", b",", b"null", b"true", b"-1", b"1e999", b"\\u0000",
          b"\\ud800", b"\xff", b"\xc0\x80", b'"stop":', b'"messages":', b'"logprobs":', b"[" * 100]
for i in range(3000):
    b = bytearray(rnd.choice(seeds))
    for _ in range(rnd.randint(1, 6)):
        at = rnd.randint(0, len(b))
        op = rnd.randrange(4)
        if op == 0 and b: b[min(at, len(b) - 1)] = rnd.randrange(256)
        elif op == 1: b[at:at] = rnd.choice(tokens)
        elif op == 2: del b[at:at + rnd.randint(1, 10)]
        else: b[at:at] = b[at:at + rnd.randint(1, 40)]
    open(os.path.join(dst, "m%04d" % i), "wb").write(b)
PY
    if find tests/server/corpus "$tmp/mut" -type f -print0 | xargs -0 timeout 300 "$BUILD/fuzz_server_request"; then
        ok "fuzz_server_request: corpus + 3000 mutations"
    else
        bad "fuzz_server_request crashed on one of the inputs"
    fi
else
    echo "skip fuzz_server_request (not built next to $LLMOPT)"
fi

# 3. The live tests with the OpenAI client (installed by scripts/setup.sh).
if ! command -v node >/dev/null 2>&1; then
    bad "node is not installed (run scripts/setup.sh)"
elif [ ! -d tests/server/node_modules/openai ]; then
    bad "the openai npm package is missing: run scripts/setup.sh (npm ci --prefix tests/server)"
else
    timeout 480 node tests/server/server_test.mjs "$LLMOPT" "$@" | tee "$tmp/node.log"
    last=$(tail -n 1 "$tmp/node.log")
    if [[ $last =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
        pass=$((pass + BASH_REMATCH[1]))
        fail=$((fail + BASH_REMATCH[2]))
    else
        bad "server_test.mjs did not finish (timeout or crash)"
    fi
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
