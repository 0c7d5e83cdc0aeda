#!/usr/bin/env bash
# Installs everything, then runs the test suite (unit tests + the real-engine integration tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
