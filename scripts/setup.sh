#!/usr/bin/env bash
# Installs what llmopt needs to build and test, on Debian 12, as root. Idempotent:
# packages already present are not touched, and nothing is fetched when all are there.
set -euo pipefail

packages=(build-essential cmake ninja-build pkg-config libjansson-dev python3)

missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
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
