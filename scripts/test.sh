#!/usr/bin/env bash
# THE test command: bash scripts/test.sh [pytest args...]. Sets up (idempotent: the quick start's packages and
# venv, then what only the tests need), then runs pytest as root.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
bash scripts/test-setup.sh
exec .venv/bin/pytest -q "$@"
