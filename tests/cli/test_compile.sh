#!/usr/bin/env bash
# llmopt compile / check / run ENGINE_DIR, and the compile report (issue 4).
set -uo pipefail
LLMOPT=${1:?usage: test_compile.sh path/to/llmopt}
M=../shared/models/stories260K
ENG=$(mktemp -d /tmp/llmopt_engine_XXXXXX)
trap 'rm -rf "$ENG"' EXIT
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }

report=$("$LLMOPT" compile $M/stories260K-F32.gguf -o "$ENG" 2>&1); rc=$?
echo "$report" | sed 's/^/  /'
[ $rc -eq 0 ] && [ -f "$ENG/model.llmopt" ] && ok "compile writes model.llmopt" || bad "compile"
k=$(echo "$report" | sed -n 's/.*kernels per forward \([0-9]*\) -> \([0-9]*\).*/\1 \2/p')
set -- $k
[ -n "${1:-}" ] && [ "$2" -lt "$1" ] && ok "kernels per forward drop ($1 -> $2)" || bad "kernel count report: $k"
grep -q "arena [0-9]* bytes, naive sum of intermediates [0-9]* bytes" <<< "$report" && ok "arena vs naive reported" || bad "arena report"
out=$("$LLMOPT" check "$ENG/model.llmopt" 2>&1) && ok "check passes" || bad "check: $out"
want=$("$LLMOPT" run $M/stories260K-F32.gguf -n 64 --temp 0 --ids 2>/dev/null)
got=$("$LLMOPT" run "$ENG" -n 64 --temp 0 --ids 2>/dev/null)
[ -n "$got" ] && [ "$got" = "$want" ] && ok "run ENGINE_DIR equals run GGUF" || bad "run ENGINE_DIR"
sed 's/"version": 1,/"version": 7,/' "$ENG/model.llmopt" > "$ENG/bad.llmopt"
out=$("$LLMOPT" check "$ENG/bad.llmopt" 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "version" <<< "$out" && ok "check names a bad version" || bad "bad version: $out"
head -c 1000 "$ENG/model.llmopt" > "$ENG/cut.llmopt"
out=$("$LLMOPT" run "$ENG/cut.llmopt" -n 4 2>&1); rc=$?
[ $rc -eq 1 ] && ok "truncated program refused" || bad "truncated program: rc $rc"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
