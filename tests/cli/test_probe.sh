#!/usr/bin/env bash
# `llmopt probe` (issue 4, part 3): a --quick run prints the table and writes a valid
# profile with plausible numbers; --show reads it back; malformed profiles are refused
# naming the field; bad usage exits 2. The bandwidth-versus-independent-read acceptance
# check lives in tests/unit/test_probe.c.
set -uo pipefail
LLMOPT=${1:?usage: test_probe.sh path/to/llmopt}
TMP=$(mktemp -d /tmp/llmopt_probe_test.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }

# 1. A quick probe: table on stdout, progress on stderr, JSON in the file.
if "$LLMOPT" probe --quick -o "$TMP/p.json" > "$TMP/table.txt" 2> "$TMP/err.txt"; then
    ok "probe --quick exits 0"
else
    bad "probe --quick exits 0"; cat "$TMP/err.txt"
fi
grep -q "^read_bandwidth_simd_all " "$TMP/table.txt" && grep -q "^f32_fma_1t " "$TMP/table.txt" \
    && ok "table lists the measurements" || { bad "table lists the measurements"; cat "$TMP/table.txt"; }
grep -q "wrote $TMP/p.json" "$TMP/err.txt" && ok "reports the file written" || bad "reports the file written"

# 2. The profile is valid JSON with plausible numbers.
python3 - "$TMP/p.json" <<'PY' && ok "profile JSON is plausible" || bad "profile JSON is plausible"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["format"] == "llmopt-target-profile" and d["version"] == 1, d.get("format")
m = d["measurements"]
for k in ("read_bandwidth_plain_1t", "read_bandwidth_plain_all", "read_bandwidth_simd_1t",
          "read_bandwidth_simd_all"):
    assert m[k]["unit"] == "GB/s" and 0.1 <= m[k]["best"] <= 1000, (k, m[k])
for k in ("f32_fma_1t", "f32_fma_all", "int8_dot_1t", "int8_dot_all"):
    assert m[k]["best"] > 0, (k, m[k])
assert m["dispatch_spin"]["unit"] == "ns" and m["dispatch_spin"]["best"] > 0
assert d["probe"]["quick"] is True and d["probe"]["threads"] >= 1
assert d["machine"]["logical_cpus"] >= 1 and d["machine"]["caches"] is not None
print("  simd_all %.1f GB/s, fma_all %.1f GFLOP/s, int8_all %.1f GOP/s" % (
    m["read_bandwidth_simd_all"]["best"], m["f32_fma_all"]["best"], m["int8_dot_all"]["best"]))
PY

# 3. --show reads the profile back and prints the same table.
"$LLMOPT" probe --show "$TMP/p.json" > "$TMP/shown.txt" 2>&1 \
    && diff -q "$TMP/table.txt" "$TMP/shown.txt" > /dev/null \
    && ok "--show prints the same table" || { bad "--show prints the same table"; diff "$TMP/table.txt" "$TMP/shown.txt"; }

# 4. -o - writes the JSON to stdout (the table moves to stderr); -t sets the threads.
"$LLMOPT" probe --quick -t 1 -o - > "$TMP/stdout.json" 2> /dev/null
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['probe']['threads']==1 and d['measurements']['f32_fma_all']['threads']==1" \
    "$TMP/stdout.json" && ok "-o - and -t 1" || bad "-o - and -t 1"

# 5. Malformed profiles: refused, exit 1, the message names the field.
reject() { # name, python expression mutating d, expected message fragment
    python3 - "$TMP/p.json" "$TMP/bad.json" "$2" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
exec(sys.argv[3])
json.dump(d, open(sys.argv[2], "w"))
PY
    out=$("$LLMOPT" probe --show "$TMP/bad.json" 2>&1); rc=$?
    if [ $rc -eq 1 ] && [[ "$out" == *"$3"* ]]; then ok "rejects $1"; else bad "rejects $1 (rc $rc): $out"; fi
}
reject "version 2" 'd["version"] = 2' "version: 2 is not supported"
reject "negative bandwidth" 'd["measurements"]["read_bandwidth_simd_all"]["best"] = -3' \
    "measurements.read_bandwidth_simd_all.best"
reject "wrong unit" 'd["measurements"]["f32_fma_1t"]["unit"] = "FLOP/s"' "measurements.f32_fma_1t.unit"
reject "missing cores" 'del d["machine"]["logical_cpus"]' "machine.logical_cpus: missing"
reject "bad cache" 'd["machine"]["caches"] = [{"level": 1, "type": 7, "size_bytes": 32768, "line_bytes": 64, "shared_by_cpus": 1}]' \
    "machine.caches[0].type"
reject "unknown key" 'd["probe"]["turbo"] = True' "probe.turbo: unknown field"
printf '{"format": "llmopt-target-profile", "version": 1,' > "$TMP/trunc.json"
out=$("$LLMOPT" probe --show "$TMP/trunc.json" 2>&1); rc=$?
[ $rc -eq 1 ] && [[ "$out" == *"invalid JSON"* ]] && ok "rejects truncated JSON" || bad "rejects truncated JSON: $out"
head -c 2000000 /dev/zero | tr '\0' ' ' > "$TMP/huge.json"
out=$("$LLMOPT" probe --show "$TMP/huge.json" 2>&1); rc=$?
[ $rc -eq 1 ] && [[ "$out" == *"cap"* ]] && ok "rejects an oversized file" || bad "rejects an oversized file: $out"

# 6. Usage errors exit 2; an unwritable output exits 1.
"$LLMOPT" probe -t 0 > /dev/null 2>&1; [ $? -eq 2 ] && ok "-t 0 is a usage error" || bad "-t 0 is a usage error"
"$LLMOPT" probe --bogus > /dev/null 2>&1; [ $? -eq 2 ] && ok "unknown option is a usage error" || bad "unknown option"
"$LLMOPT" probe -o > /dev/null 2>&1; [ $? -eq 2 ] && ok "-o without a path" || bad "-o without a path"
out=$("$LLMOPT" probe --quick -t 1 -o /nonexistent/dir/p.json 2>&1); rc=$?
[ $rc -eq 1 ] && [[ "$out" == *"/nonexistent/dir/p.json"* ]] && ok "unwritable -o fails naming the path" \
    || bad "unwritable -o (rc $rc): $out"
grep -q "probe" <<< "$("$LLMOPT" --help)" && ok "listed in usage" || bad "listed in usage"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
