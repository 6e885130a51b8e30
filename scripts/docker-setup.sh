#!/usr/bin/env bash
# Idempotent set-up of what container hosts (hosts.docker, `testbed image`) need; not part of the quick start.
# Run by scripts/test-setup.sh and, on first use, by testbed itself (testbed/container/daemon.py):
#   docker.io   Debian's dockerd, containerd, runc (testbed starts `dockerd --iptables=false --bridge=none` when
#               no daemon runs; docs/containers.md)
#   the pip extra .[docker] of pyproject.toml (the docker SDK) in the venv, or in FTB_PY's environment
# Fast when done: dpkg status and an import first.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/lib.sh
ensure_packages docker.io
PY="${FTB_PY:-.venv/bin/python}"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
if ! "$PY" -c 'import docker' 2>/dev/null; then
    mapfile -t reqs < <("$PY" -c 'import tomllib
for r in tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["docker"]: print(r)')
    echo "docker-setup: pip install ${reqs[*]} (the extra .[docker])"
    "$PY" -m pip install -q "${reqs[@]}"
fi
echo "docker-setup: ok (dockerd $(dpkg-query -W -f='${Version}' docker.io), docker SDK $("$PY" -c 'import docker; print(docker.__version__)'))"
