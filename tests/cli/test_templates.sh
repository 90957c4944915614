#!/usr/bin/env bash
# Chat templates and chat through the CLI (issue 3):
#  (a) every (template x conversation x add_generation_prompt) pair of
#      tests/golden/templates/ rendered live by Python's jinja2 (the way transformers
#      renders) equals `llmopt template` byte for byte, and the committed expected files
#      still match jinja2, so a drift on either side is caught;
#  (b) `llmopt chat` on stories260K answers messages from a pipe, honours /reset and the
#      template's end-of-turn text, and exits cleanly;
#  (c) template errors are clear and name their position.
# Usage: bash tests/cli/test_templates.sh path/to/llmopt   (cwd: repository root)
set -uo pipefail
LLMOPT=${1:?usage: test_templates.sh path/to/llmopt}
PY=/usr/bin/python3
G=tests/golden/templates
STORIES=../shared/models/stories260K/stories260K-F32.gguf
TMP=$(mktemp -d /tmp/llmopt_templates.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }

# ---- (a) live jinja2 renders vs llmopt template --------------------------------------
if ! $PY -c "import jinja2" 2>/dev/null; then
    bad "python3-jinja2 is not installed for $PY (scripts/setup.sh installs it)"
else
    if $PY scripts/render_templates.py --check >"$TMP/check.log" 2>&1; then
        ok "committed expected renders match jinja2 ($(tail -1 "$TMP/check.log"))"
    else
        bad "committed expected renders drifted from jinja2 (run $PY scripts/render_templates.py)"
        grep drift "$TMP/check.log" | head -5
    fi
    $PY scripts/render_templates.py --out "$TMP/live" >/dev/null 2>&1
    # One line per template: name, then the llmopt arguments that load it.
    $PY - "$G/manifest.json" >"$TMP/templates.txt" <<'PY'
import json, os, sys
for e in json.load(open(sys.argv[1]))["templates"]:
    if "gguf" in e or "dir" in e:
        path = e.get("gguf") or e.get("dir")
        if os.path.exists(path):
            print(e["name"], "model", path)
    else:
        extra = {k: e[k] for k in ("bos_token", "eos_token") if e.get(k) is not None}
        print(e["name"], "file", e["file"], json.dumps(extra))
PY
    n_same=0 n_diff=0
    while read -r name kind path extra; do
        for conv in "$G"/conversations/*.json; do
            c=$(basename "$conv" .json)
            for gen in nogen gen; do
                flag=()
                [ $gen = gen ] && flag=(--add-generation-prompt)
                if [ "$kind" = model ]; then
                    "$LLMOPT" template "$path" --messages "$conv" "${flag[@]}" >"$TMP/out" 2>"$TMP/err"
                else
                    "$LLMOPT" template --chat-template "$path" --extra "$extra" --messages "$conv" "${flag[@]}" \
                        >"$TMP/out" 2>"$TMP/err"
                fi
                rc=$?
                want="$TMP/live/${name}__${c}__${gen}"
                if [ -f "$want.txt" ] && [ $rc -eq 0 ] && cmp -s "$TMP/out" "$want.txt"; then
                    n_same=$((n_same + 1))
                elif [ -f "$want.err" ] && [ $rc -ne 0 ]; then
                    n_same=$((n_same + 1))
                else
                    n_diff=$((n_diff + 1))
                    [ $n_diff -le 5 ] && echo "  differs: $name x $c ($gen) rc=$rc $(head -c 200 "$TMP/err")"
                fi
            done
        done
    done <"$TMP/templates.txt"
    if [ $n_diff -eq 0 ] && [ $n_same -gt 0 ]; then
        ok "llmopt template == live jinja2 on $n_same template x conversation renders"
    else
        bad "llmopt template differs from live jinja2 on $n_diff of $((n_same + n_diff)) renders"
    fi
fi

# --tools FILE and a bare messages array give the same prompt as the conversation file.
if [ -d ../shared/models/qwen3-tokenizer ]; then
    $PY -c "import json,sys; d=json.load(open('$G/conversations/tools.json')); json.dump(d['messages'], open('$TMP/m.json','w')); json.dump(d['tools'], open('$TMP/t.json','w'))"
    a=$("$LLMOPT" template ../shared/models/qwen3-tokenizer --messages "$TMP/m.json" --tools "$TMP/t.json" --add-generation-prompt | od -An -c)
    b=$("$LLMOPT" template ../shared/models/qwen3-tokenizer --messages "$G/conversations/tools.json" --add-generation-prompt | od -An -c)
    [ -n "$a" ] && [ "$a" = "$b" ] && ok "--tools FILE with a messages array" || bad "--tools FILE with a messages array"
    out=$("$LLMOPT" template ../shared/models/qwen3-tokenizer --messages "$G/conversations/basic.json" \
          --add-generation-prompt --extra '{"enable_thinking": false}')
    case "$out" in *"<think>"*"</think>"*) ok "--extra joins the template context";; *) bad "--extra: $out";; esac
fi

# ---- (b) chat on stories260K from a pipe ------------------------------------------------
if [ ! -f "$STORIES" ]; then
    bad "$STORIES not found"
else
    out=$(printf 'Hello there\nTell me about the cat\n/reset\nOnce upon a time\n' |
          timeout 300 "$LLMOPT" chat "$STORIES" --chat-template "$G/chatml.jinja" -n 24 --temp 0 -v 2>"$TMP/chat.err")
    rc=$?
    lines=$(printf '%s\n' "$out" | grep -c .)
    if [ $rc -eq 0 ] && [ "$lines" -ge 3 ] && [ "$(grep -c 'generated' "$TMP/chat.err")" -eq 3 ]; then
        ok "chat answers 3 messages from a pipe and exits ($(printf '%s' "$out" | head -c 60 | tr '\n' ' ')...)"
    else
        bad "chat from a pipe: rc=$rc, $lines lines"; head -5 "$TMP/chat.err"
    fi
    grep -q "reused from the cache" "$TMP/chat.err" && ! grep -q "generated 0," "$TMP/chat.err" \
        && [ "$(grep -c '(0 reused' "$TMP/chat.err")" -eq 2 ] && grep -q "([1-9][0-9]* reused" "$TMP/chat.err" \
        && ok "chat reuses the KV cache on the second turn, resets after /reset" \
        || { bad "chat KV reuse"; cat "$TMP/chat.err"; }
    # No prompts or escape codes on a pipe.
    grep -q $'\033' <<< "$out" && bad "chat wrote ANSI codes to a pipe" || ok "no ANSI codes on a pipe"
    # Same seed, same conversation: same replies.
    out2=$(printf 'Hello there\nTell me about the cat\n/reset\nOnce upon a time\n' |
           "$LLMOPT" chat "$STORIES" --chat-template "$G/chatml.jinja" -n 24 --temp 0 2>/dev/null)
    [ "$out" = "$out2" ] && ok "chat is reproducible at temperature 0" || bad "chat reproducibility"
    # The template's end-of-turn text ends a reply: here "." follows each message.
    printf '%s' '{% for m in messages %}{{ m.role }}: {{ m.content }}.{{ "\n" }}{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}' >"$TMP/dot.jinja"
    out=$(printf 'Once upon a time there was a dog\nThe dog was happy\n' |
          "$LLMOPT" chat "$STORIES" --chat-template "$TMP/dot.jinja" -n 200 --temp 0 -v 2>"$TMP/dot.err")
    rc=$?
    if [ $rc -eq 0 ] && [ "$(grep -c 'stopped: end-of-turn text' "$TMP/dot.err")" -ge 1 ] && ! grep -q '\.' <<< "$out"; then
        ok "a reply stops at the template's end-of-turn text"
    else
        bad "end-of-turn stop: rc=$rc"; cat "$TMP/dot.err"; printf '%s\n' "$out"
    fi
    # /system replaces the system prompt and /exit ends the session early.
    out=$(printf '/system You are a storyteller\nHi\n/exit\nnever sent\n' |
          "$LLMOPT" chat "$STORIES" --chat-template "$G/chatml.jinja" -n 8 --temp 0 -v 2>"$TMP/sys.err")
    rc=$?
    [ $rc -eq 0 ] && [ "$(grep -c 'generated' "$TMP/sys.err")" -eq 1 ] && ok "/system and /exit" || bad "/system and /exit (rc=$rc)"
    out=$("$LLMOPT" chat "$STORIES" </dev/null 2>&1); rc=$?
    [ $rc -eq 1 ] && grep -q "no tokenizer.chat_template" <<< "$out" && grep -q -- "--chat-template" <<< "$out" \
        && ok "chat without a template says how to give one" || bad "chat without a template: $out"
    out=$(echo Hi | "$LLMOPT" chat "$STORIES" --chat-template "$G/chatml.jinja" --backend nosuch 2>&1); rc=$?
    [ $rc -eq 1 ] && grep -q "unknown backend 'nosuch'" <<< "$out" && ok "chat --backend with an unknown name" \
        || bad "chat --backend nosuch: rc=$rc $out"
    out=$(printf 'Hi\n' | "$LLMOPT" chat "$STORIES" --chat-template "$G/chatml.jinja" --backend cpu-ref -n 8 --temp 0 \
          2>/dev/null); rc=$?
    out2=$(printf 'Hi\n' | "$LLMOPT" chat "$STORIES" --chat-template "$G/chatml.jinja" -n 8 --temp 0 2>/dev/null)
    [ $rc -eq 0 ] && [ -n "$out" ] && [ "$out" = "$out2" ] && ok "chat --backend cpu-ref answers as the default backend" \
        || bad "chat --backend cpu-ref: rc=$rc '$out' vs '$out2'"
fi

# ---- (c) errors ----------------------------------------------------------------------------
printf 'line one\n{{ messages | frobnicate }}\n' >"$TMP/badfilter.jinja"
out=$("$LLMOPT" template --chat-template "$TMP/badfilter.jinja" --messages "$G/conversations/basic.json" 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "badfilter.jinja:2:15: unknown filter 'frobnicate'" <<< "$out" && ok "unknown filter: $out" || bad "unknown filter: $out"
printf '{%% for m in messages %%}{{ m.content }}' >"$TMP/unclosed.jinja"
out=$("$LLMOPT" template --chat-template "$TMP/unclosed.jinja" --messages "$G/conversations/basic.json" 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "'for' block opened at 1:4 is never closed" <<< "$out" && ok "unclosed block: $out" || bad "unclosed block: $out"
if [ -f "$G/gemma2.jinja" ]; then
    out=$("$LLMOPT" template --chat-template "$G/gemma2.jinja" --messages "$G/conversations/system_multiturn.json" 2>&1); rc=$?
    [ $rc -eq 1 ] && grep -q "raise_exception: System role not supported" <<< "$out" && ok "raise_exception: $out" \
        || bad "raise_exception: $out"
fi
out=$("$LLMOPT" template --chat-template "$G/chatml.jinja" --messages /nonexistent.json 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "/nonexistent.json" <<< "$out" && ok "missing messages file" || bad "missing messages file: $out"
out=$("$LLMOPT" template --chat-template "$G/chatml.jinja" 2>&1); rc=$?
[ $rc -eq 2 ] && ok "template without --messages is a usage error" || bad "template without --messages: rc=$rc"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
