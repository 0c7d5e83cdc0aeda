#!/usr/bin/env bash
# Opt-in conformance tests of the SGLang adapter against SGLang 0.5.23's own code (CPU only):
# creates .venv-sglang if needed, then runs tests/sglang_conformance with kvscope's test venv.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-sglang.sh
exec .venv/bin/python -m pytest -m sglang tests/sglang_conformance "$@"
