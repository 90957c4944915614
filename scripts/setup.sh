#!/usr/bin/env bash
# Installs what llmopt needs to build and test, on Debian 12, as root. Idempotent:
# packages already present are not touched, and nothing is fetched when all are there.
#   build: compiler, CMake, Ninja, pkg-config, jansson (JSON), PCRE2 (pre-tokenizer
#          regexes), libmicrohttpd (HTTP server)
#   tests: python3 (CLI test drivers), python3-jinja2 (oracle for chat templates),
#          Node.js + npm (the official OpenAI client drives the server tests)
set -euo pipefail

packages=(build-essential cmake ninja-build pkg-config libjansson-dev libpcre2-dev
          libmicrohttpd-dev python3 python3-jinja2)
# Node.js may come from another source (a newer nodejs package bundles npm); only ask
# Debian for it when no node/npm is on the PATH.
command -v node >/dev/null 2>&1 || packages+=(nodejs)
command -v npm >/dev/null 2>&1 || packages+=(npm)

missing=()
for p in "${packages[@]}"; do
    if ! grep -q "install ok installed" <<< "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)"; then
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    if [ "$(id -u)" -ne 0 ]; then
        echo "setup: need root to install packages: ${missing[*]}" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The server tests' npm packages (the official `openai` client), pinned by
# tests/server/package-lock.json. Installed only when node_modules is missing or older
# than the lock file; `npm ci` installs exactly what the lock file says.
server_tests="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/server"
if [ -f "$server_tests/package-lock.json" ] && command -v npm >/dev/null 2>&1; then
    stamp="$server_tests/node_modules/.package-lock.json"
    if [ ! -f "$stamp" ] || [ "$server_tests/package-lock.json" -nt "$stamp" ]; then
        echo "setup: installing the server tests' npm packages (tests/server)"
        npm ci --prefix "$server_tests" --no-audit --no-fund --loglevel=error
    fi
fi
