"""SGLang's serving environment, in its own venv under kvscope's cache (like the embedded vLLM).

On a machine with a CUDA GPU: the ordinary `sglang` package with its whole CUDA closure.

On a CPU-only machine (shared/notes/sglang-cpu-live.md): the package index has SGLang's
Python code but its native pieces only as CUDA builds, so the environment is assembled:
- CPU torch (2.13.0: the CPU wheel the index serves; sglang pins 2.14.1, no problem seen);
- `sglang` without its dependencies, then the pure-Python ones a CPU serve imports (its own pins);
- torchvision's CUDA build without its dependencies, importable on CPU torch once its two op
  schemas are declared: `kvscope_torchvision_ops` does that in every process of the venv (a
  `.pth` file), just before torchvision is first imported;
- `sgl_kernel`: a compatibility shim for the native wheel the index lacks
  (engines/sglang_cpu/sgl_kernel): the one op a CPU without AMX calls, in torch; any other op
  raises when called. Not a model and not an engine stand-in: SGLang computes everything else.

Idempotent and version-pinned: the venv's marker holds the whole spec (pins, shim sources), and
an install is redone only when it changed or was left incomplete. About 3 GB, 2-4 minutes.
"""

import hashlib
import json
import shutil
import venv
from pathlib import Path

from kvscope import paths
from kvscope.engines import model
from kvscope.engines.install import (
    MARKER,
    Report,
    installed_spec,
    run_logged,
    venv_python,
)

VERSION = "0.5.23"
PACKAGE = f"sglang=={VERSION}"
CPU_TORCH = "torch==2.13.0"
# What a CPU serve imports, at sglang 0.5.23's own pins where it pins them; python-dateutil:
# something pulls 4.x, sglang needs <3; accelerate + gguf: converting the embedded model.
CPU_DEPENDENCIES = (
    "aiohttp", "anthropic", "apache-tvm-ffi==0.1.11", "blobfile==3.0.0",
    "compressed-tensors==0.18.0", "datasets", "distro", "easydict", "einops", "fastapi",
    "gguf==0.19.0", "accelerate==1.15.0", "interegular", "IPython", "llguidance>=1.7.6,<2",
    "mistral_common>=1.11.5", "modelscope", "msgpack", "msgspec", "numpy", "nvidia-ml-py",
    "openai==2.8.0", "openai-harmony==0.0.4", "orjson", "outlines==0.1.11", "packaging",
    "partial_json_parser", "pillow", "prometheus-client>=0.20.0", "psutil", "pybase64",
    "pydantic", "python-dateutil<3", "python-multipart", "pyzmq>=25.1.2", "regex", "requests",
    "scipy", "sentencepiece==0.2.1", "setproctitle", "soundfile==0.13.1", "tiktoken",
    "tokenizers==0.23.2", "tqdm", "transformers==5.19.0", "triton==3.7.1", "uvicorn>=0.51",
    "uvloop", "watchfiles", "xgrammar==0.2.7", "xxhash", "zstandard",
)  # fmt: skip
CPU_TORCHVISION = "torchvision==0.28.0"
SHIMS = Path(__file__).with_name("sglang_cpu")  # sgl_kernel/ and kvscope_torchvision_ops.py
PTH = "kvscope-torchvision-ops.pth"


def venv_root(cpu: bool) -> Path:
    flavour = "cpu" if cpu else "cuda"
    return paths.cache_dir() / "engines" / f"sglang-{VERSION}-{flavour}"


def _shim_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(SHIMS.rglob("*.py")):
        digest.update(path.relative_to(SHIMS).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def spec(cpu: bool) -> dict[str, object]:
    """What an install of this flavour is made of; equal markers mean nothing to do."""
    if not cpu:
        return {"requirements": [PACKAGE]}
    return {
        "torch": CPU_TORCH,
        "sglang": PACKAGE,
        "dependencies": list(CPU_DEPENDENCIES),
        "torchvision": CPU_TORCHVISION,
        "shims": _shim_digest(),
    }


def complete(cpu: bool) -> bool:
    root = venv_root(cpu)
    return venv_python(root).exists() and installed_spec(root) == spec(cpu)


def install(report: Report, *, cpu: bool) -> tuple[Path, Path]:
    """SGLang's venv (CPU or CUDA flavour) and the embedded model; quick when already done."""
    root = venv_root(cpu)
    if not complete(cpu):
        _build(root, cpu, report)
    python = venv_python(root)
    return python, model.ensure_model(python, report)


def _build(root: Path, cpu: bool, report: Report) -> None:
    log = root.parent / f"{root.name}.install.log"
    (root / MARKER).unlink(missing_ok=True)
    if not venv_python(root).exists():
        report(f"creating {root}")
        venv.EnvBuilder(with_pip=True, clear=True).create(root)
    py = str(venv_python(root))
    pip = [py, "-m", "pip", "--disable-pip-version-check", "install"]
    if not cpu:
        run_logged([*pip, PACKAGE], log, "pip install sglang", report)
    else:
        constraint = root / "kvscope-constraints.txt"
        constraint.write_text(CPU_TORCH + "\n")
        run_logged([*pip, CPU_TORCH], log, "pip install torch (CPU)", report)
        run_logged([*pip, "--no-deps", PACKAGE], log, "pip install sglang", report)
        run_logged(
            [*pip, "-c", str(constraint), *CPU_DEPENDENCIES], log, "pip install deps", report
        )
        run_logged([*pip, "--no-deps", CPU_TORCHVISION], log, "pip install torchvision", report)
        _place_shims(root)
        check = "import sgl_kernel, torchvision, sglang.srt.server_args"
        run_logged([py, "-c", check], log, "import check", report)
    (root / MARKER).write_text(json.dumps(spec(cpu)))


def _place_shims(root: Path) -> None:
    """sgl_kernel and the torchvision op declaration into the venv, loaded by a .pth file."""
    site = next(root.glob("lib/python*/site-packages"))
    target = site / "sgl_kernel"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(SHIMS / "sgl_kernel", target, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(SHIMS / "kvscope_torchvision_ops.py", site / "kvscope_torchvision_ops.py")
    (site / PTH).write_text("import kvscope_torchvision_ops\n")
