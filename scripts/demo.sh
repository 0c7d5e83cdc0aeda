#!/usr/bin/env bash
# Installs everything, then runs the demo: PEER workflows on the embedded engine, profiled.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/kvscope run "$@"
