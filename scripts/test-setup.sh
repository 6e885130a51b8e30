#!/usr/bin/env bash
# Idempotent set-up of what only the tests need (scripts/setup.sh, the quick start's, never installs these):
#   mininet, bridge-utils  the Mininet baseline test (tests/test_bench_smoke.py; LinuxBridge runs brctl)
# Fast when done: dpkg status first, apt-get only for what is missing.
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi

PKGS=(mininet bridge-utils)
missing=()
for p in "${PKGS[@]}"; do
    st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    if [ "$st" != "install ok installed" ]; then
        missing+=("$p")
    fi
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "test-setup: installing ${missing[*]}"
    $SUDO apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${missing[@]}" </dev/null
fi
echo "test-setup: ok (${PKGS[*]})"
