#!/usr/bin/env bash
# Idempotent setup on Debian 12 (run as root; uses sudo otherwise): system packages, then the project venv.
# Fast when everything is already in place: no apt-get at all, no pip unless pyproject.toml changed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
start=$SECONDS

# ---- system packages (Debian's python3-bpfcc provides the `bcc` module; it is not on PyPI)
. scripts/lib.sh
ensure_packages python3-bpfcc bpfcc-tools python3-venv python3-pip linux-libc-dev iputils-ping \
    tshark tcpdump ethtool iproute2

# ---- the venv: Debian's python with system site packages, so `import bcc` works inside it
PY=/usr/bin/python3
VENV="${FTB_VENV:-.venv}"      # the VM image and Vagrant put it outside the (shared) project folder
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
if [ -x "$VENV/bin/python" ] && ! grep -qx 'include-system-site-packages = true' "$VENV/pyvenv.cfg" 2>/dev/null; then
    echo "setup: $VENV was made without --system-site-packages (bcc would not import); recreating it"
    rm -rf "$VENV"
fi
if [ -x "$VENV/bin/python" ] && ! "$VENV/bin/python" -c 'import sys' 2>/dev/null; then
    echo "setup: $VENV is broken; recreating it"
    rm -rf "$VENV"
fi
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv --system-site-packages "$VENV"
fi

stamp="$VENV/.fabric-testbed-setup"
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
have=$(cat "$stamp" 2>/dev/null || true)
check='import bcc, pyroute2, pydantic, click, yaml, pandas, matplotlib, networkx, scapy, rich, pytest, testbed'
if [ "$want" != "$have" ] || ! "$VENV/bin/python" -c "$check" 2>/dev/null \
        || [ ! -x "$VENV/bin/testbed" ]; then
    echo "setup: pip install -e '.[test]'"
    "$VENV/bin/python" -m pip install -q -e '.[test]'
    "$VENV/bin/python" -c "$check"
    echo "$want" > "$stamp"
fi

echo "setup: ok ($("$VENV/bin/python" -V 2>&1) in $VENV, kernel $(uname -r), $((SECONDS - start)) s)"
