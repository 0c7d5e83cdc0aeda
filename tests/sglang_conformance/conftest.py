"""One SGLang process per session (sglang_producer.py), started with kvscope's launch flags.

Skipped where .venv-sglang is absent (scripts/test-sglang.sh creates it), like
test_server_args.py. SGLang's metrics code takes 3-9 s to import: it is imported once.
"""

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import free_port
from sglang_producer import SglangProducer

from kvscope.config import EngineConfig
from kvscope.engines.sglang import SglangEngine

REPO = Path(__file__).resolve().parents[2]
DEFAULT_VENV = REPO / ".venv-sglang"
STAMP = DEFAULT_VENV / ".kvscope-sglang-complete"  # written last by scripts/setup-sglang.sh
SETUP_HINT = "run scripts/test-sglang.sh (or scripts/setup-sglang.sh) to create it"

# ServerArgs.resolve_once() (run by SGLang's publish()) reads the model's config.json only.
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}


@pytest.fixture(scope="session")
def sglang_interpreter() -> Path:
    """The interpreter that has SGLang: $KVSCOPE_SGLANG_PYTHON, else <repo>/.venv-sglang."""
    custom = os.environ.get("KVSCOPE_SGLANG_PYTHON")
    python = Path(custom) if custom else DEFAULT_VENV / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no SGLang interpreter at {python}; {SETUP_HINT}")
    if not custom and not STAMP.exists():
        pytest.skip(f"{DEFAULT_VENV} is incomplete (no {STAMP.name}); {SETUP_HINT}")
    return python


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model folder with only a tiny Llama config.json (no weights)."""
    model = tmp_path_factory.mktemp("tiny-llama")
    (model / "config.json").write_text(json.dumps(TINY_LLAMA))
    return model


@pytest.fixture(scope="session")
def engine(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> SglangEngine:
    """kvscope's SGLang engine as a run would configure it (pressure knobs set)."""
    model = tiny_model
    port = free_port()
    kv_port = free_port(2)
    while port in (kv_port, kv_port + 1):
        kv_port = free_port(2)
    config = EngineConfig(
        kind="sglang",
        model=str(model),
        served_model_name="tiny-chat",
        output_dir=tmp_path_factory.mktemp("sglang-out"),
        port=port,
        kv_events_port=kv_port,
        context_length=4096,
        kv_capacity_tokens=4096,
        page_size=16,
        # No GPU: SGLang's config resolution (inside its publish()) needs the device named.
        extra_args=("--device", "cpu"),
    )
    return SglangEngine(config)


@pytest.fixture(scope="session")
def sglang(
    sglang_interpreter: Path, engine: SglangEngine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SglangProducer]:
    """SGLang's own collectors, exporter and publisher, set up from kvscope's flags."""
    launch = engine.launch()
    assert launch is not None and launch.argv[1:3] == ("-m", "sglang.launch_server")
    log = tmp_path_factory.mktemp("sglang-log") / "produce_with_sglang.log"
    producer = SglangProducer(sglang_interpreter, list(launch.argv[3:]), log)
    try:
        yield producer
    finally:
        producer.close()
