#!/usr/bin/env bash
# Installs everything, then runs the demo on the embedded engine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/kvscope engine check "$@"
