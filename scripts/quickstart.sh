#!/usr/bin/env bash
# Set up, then run the default scenario: bash scripts/quickstart.sh [extra `testbed run` options...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
exec .venv/bin/testbed run scenarios/default.yaml "$@"
