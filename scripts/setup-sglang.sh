#!/usr/bin/env bash
# Creates .venv-sglang: SGLang 0.5.23's own Python code on CPU torch, for the opt-in conformance
# tests in tests/sglang_conformance (SGLang's real argument parser and resolver on kvscope's
# launch command; its metrics collectors, request-metrics exporter and KV event publisher
# producing what kvscope parses).
# An unsupported combination (sglang 0.5.23 pins torch 2.14.1): fine for tests, never a kvscope
# dependency. Recipe: shared/notes/sglang-telemetry.md, "Using SGLang's own code on a CPU-only
# machine". Idempotent: a stamp in .venv-sglang skips everything once an install is complete
# (rm -rf .venv-sglang to start over). About 2.2 GB; 1-2 minutes with a warm pip cache.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
venv=.venv-sglang
stamp=$venv/.kvscope-sglang-complete

torch_pin=torch==2.13.0 # the local CPU wheel that pip's find-links provides
sglang_pin=sglang==0.5.23
# sglang's runtime deps that import on CPU, installed under a torch==2.13.0 constraint.
full_deps=(
    numpy orjson psutil pybase64 requests packaging pillow starlette msgspec pydantic pyzmq tqdm
    ipython aiohttp dill gguf sentencepiece==0.2.1 partial-json-parser prometheus-client msgpack
    xgrammar==0.2.7 # SGLang's default grammar backend: the routing test compiles its schemas
    openai==2.8.0 transformers==5.19.0 tokenizers==0.23.2 compressed-tensors==0.18.0
    apache-tvm-ffi==0.1.11 triton==3.7.1
    fastapi==0.165.0 # OpenAIServingBase (the x-custom-labels parser) imports it; pure Python
)
# torchvision from PyPI is a CUDA build: installed without its deps, it imports on CPU torch once
# its two op schemas are declared (tests/sglang_conformance/server_args_probe.py does that).
# Transformers
# imports it, so ServerArgs.resolve_once() needs it; the parser alone does not.
torchvision_pin=torchvision==0.28.0
# Fallback when the full list cannot be installed: only what `import sglang.srt.server_args`,
# prepare_server_args() and KVEventsConfig need, i.e. numpy orjson psutil pybase64 requests
# packaging pillow starlette msgspec pydantic pyzmq tqdm ipython aiohttp triton (probed one
# missing module at a time on a bare torch + sglang venv). The resolution test then skips.
server_args_deps=(
    numpy orjson psutil pybase64 requests packaging pillow starlette msgspec pydantic pyzmq tqdm
    ipython aiohttp triton==3.7.1
)

want=$(printf '%s\n' "$torch_pin" "$sglang_pin" "${full_deps[@]}" "$torchvision_pin" | sha256sum)
want=${want%% *}
if [ "$(head -n1 "$stamp" 2>/dev/null)" = "$want" ]; then
    echo "setup-sglang: $venv is complete ($(sed -n 2p "$stamp"))"
    exit 0
fi

echo "setup-sglang: installing SGLang 0.5.23 + torch 2.13.0 (CPU) into $venv"
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
constraints=$(mktemp "${TMPDIR:-/tmp}/kvscope-sglang-constraints.XXXXXX")
trap 'rm -f "$constraints"' EXIT
echo "$torch_pin" >"$constraints"

"${pip[@]}" "$torch_pin"
"${pip[@]}" --no-deps "$sglang_pin"
# Expected noise from here on: pip lists sglang's requirements that are left out on purpose
# (CUDA kernels, torch==2.14.1...) as "sglang 0.5.23 requires ..., which is not installed".
installed="full dependency list"
if "${pip[@]}" -c "$constraints" "${full_deps[@]}"; then
    "${pip[@]}" --no-deps "$torchvision_pin"
else
    echo "setup-sglang: the full dependency list failed; installing the parser's deps only" >&2
    "${pip[@]}" -c "$constraints" "${server_args_deps[@]}"
    installed="server_args deps only"
fi

# Complete only once SGLang's parser runs (the probe declares torchvision's ops before imports).
echo '{"argvs": [["--model-path", "none"]], "resolve": false}' |
    "$venv/bin/python" tests/sglang_conformance/server_args_probe.py >/dev/null
printf '%s\n%s\n' "$want" "$installed" >"$stamp"
echo "setup-sglang: done ($installed)"
