#!/usr/bin/env bash
# Installs everything, then runs the test suite: unit tests, the embedded vLLM engine's tier
# (tests/integration) and the live SGLang tier (tests/sglang_live: SGLang's CPU engine where
# there is no CUDA GPU, installed once into kvscope's cache, ~3 GB).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/kvscope engine install --engine sglang
exec .venv/bin/python -m pytest "$@"
