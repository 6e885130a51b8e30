#!/usr/bin/env bash
# Idempotent set-up of what only the tests need (scripts/setup.sh, the quick start's, never installs these):
#   mininet, bridge-utils  the Mininet baseline test (tests/project/test_bench_smoke.py; LinuxBridge runs brctl)
#   chromium               headless rendering of report.html (tests/report/test_report_html.py)
#   stress-ng              the bounded CPU hog of FTB_STRESS=1 runs of the suite (tests/cpu_guard.py)
#   iptables               the man in the middle of the metrics federation (tests/cluster/test_cluster_e2e.py)
#   openmpi-bin, python3-mpi4py  Open MPI collectives on the fabric (traffic.engine mpi; tests/workloads/test_mpi_e2e.py)
#   iperf3                 iperf3 flows (traffic.engine iperf3; tests/workloads/test_iperf3_e2e.py)
#   docker.io + docker SDK container hosts (tests/fabric/test_docker_e2e.py), through scripts/docker-setup.sh
#   ray, pymetis           the `cluster` extra (pip): the local Ray cluster's tests (tests/cluster/)
#   mkdocs, mkdocs-material the `docs` extra (pip): the documentation site's build (tests/project/test_docs.py)
# Fast when done: dpkg status first, apt-get only for what is missing.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/lib.sh
ensure_packages mininet bridge-utils chromium stress-ng iptables openmpi-bin python3-mpi4py iperf3
bash scripts/docker-setup.sh
VENV="${FTB_VENV:-.venv}"
if ! "$VENV/bin/python" -c 'import ray, pymetis' 2>/dev/null; then
    echo "test-setup: pip install -e '.[cluster]' (Ray, pymetis)"
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore "$VENV/bin/python" -m pip install -q -e '.[cluster]'
fi
if ! "$VENV/bin/python" -c 'import mkdocs, material' 2>/dev/null; then
    echo "test-setup: pip install -e '.[docs]' (mkdocs, mkdocs-material)"
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore "$VENV/bin/python" -m pip install -q -e '.[docs]'
fi
echo "test-setup: ok (mininet, bridge-utils, chromium, stress-ng, iptables, openmpi, mpi4py, iperf3, docker, ray, pymetis, mkdocs)"
