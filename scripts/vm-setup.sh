#!/usr/bin/env bash
# Host tools for the full-kernel VM lane (`testbed vm build|run|test`); not needed by the normal suite.
set -euo pipefail
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v mke2fs >/dev/null || need+=(e2fsprogs)
if [ ${#need[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" </dev/null
fi
echo "vm-setup: ok ($(qemu-system-x86_64 --version | head -1); debootstrap $(dpkg-query -W -f='${Version}' debootstrap))"
