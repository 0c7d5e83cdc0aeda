"""Engines: one typed interface, one file per engine.

The names below load on first use (`from kvscope.engines import make_engine` as before), so that
the engines' standard-library-only modules (vllm_ids.py, sglang_ids.py: the prompt-id fields and
reply edits) also load in an app's interpreter without kvscope's dependencies (probe/lite.py).
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvscope.config import EngineConfig
    from kvscope.engines.base import Capabilities, Endpoints, Engine, Launch

__all__ = [
    "ENGINES", "METRIC_FAMILIES", "Capabilities", "Endpoints", "Engine", "Launch", "make_engine",
    "speaking_as",
]  # fmt: skip


def _engines() -> dict[str, "type[Engine]"]:
    from kvscope.engines.attach import AttachEngine
    from kvscope.engines.sglang import SglangEngine
    from kvscope.engines.vllm import VllmEngine

    return {
        VllmEngine.name: VllmEngine,
        SglangEngine.name: SglangEngine,
        AttachEngine.name: AttachEngine,
    }


def __getattr__(name: str) -> Any:
    if name == "ENGINES":
        return _engines()
    if name == "METRIC_FAMILIES":
        # Engines whose /metrics kvscope can read (attach detects which one it is talking to).
        from kvscope.engines.sglang import SglangEngine
        from kvscope.engines.vllm import VllmEngine

        return (VllmEngine, SglangEngine)
    if name in ("Capabilities", "Endpoints", "Engine", "Launch"):
        from kvscope.engines import base

        return getattr(base, name)
    raise AttributeError(f"module 'kvscope.engines' has no attribute {name!r}")


def make_engine(config: "EngineConfig") -> "Engine":
    return _engines()[config.kind](config)


def speaking_as(engine: "Engine", family: str | None) -> "Engine":
    """The engine whose conventions the calls follow (request tags, prompt-id fields, how its
    cache is emptied): `engine` itself, except an attached server whose /metrics named its
    family (Capabilities.family): then that family's, so the attached server's calls carry
    kvscope's request ids (what places a call on its replica) and return their prompt ids as a
    launched one's do. Everything else about it (version, model files) stays unknown."""
    from kvscope.engines.attach import AttachEngine

    engines = _engines()
    if not isinstance(engine, AttachEngine) or family is None or family not in engines:
        return engine
    kind = engines[family]
    if kind is AttachEngine:
        return engine
    return kind(engine.config.model_copy(update={"kind": family}))
