"""Engines: one typed interface, one file per engine."""

from kvscope.config import EngineConfig
from kvscope.engines.attach import AttachEngine
from kvscope.engines.base import Capabilities, Endpoints, Engine, Launch
from kvscope.engines.sglang import SglangEngine
from kvscope.engines.vllm import VllmEngine

ENGINES: dict[str, type[Engine]] = {
    VllmEngine.name: VllmEngine,
    SglangEngine.name: SglangEngine,
    AttachEngine.name: AttachEngine,
}
# Engines whose /metrics kvscope can read (attach detects which one it is talking to).
METRIC_FAMILIES: tuple[type[Engine], ...] = (VllmEngine, SglangEngine)


def make_engine(config: EngineConfig) -> Engine:
    return ENGINES[config.kind](config)


def speaking_as(engine: Engine, family: str | None) -> Engine:
    """The engine whose conventions the calls follow (request tags, prompt-id fields, how its
    cache is emptied): `engine` itself, except an attached server whose /metrics named its
    family (Capabilities.family): then that family's, so the attached server's calls carry
    kvscope's request ids (what places a call on its replica) and return their prompt ids as a
    launched one's do. Everything else about it (version, model files) stays unknown."""
    if not isinstance(engine, AttachEngine) or family is None or family not in ENGINES:
        return engine
    kind = ENGINES[family]
    if kind is AttachEngine:
        return engine
    return kind(engine.config.model_copy(update={"kind": family}))


__all__ = [
    "ENGINES", "Capabilities", "Endpoints", "Engine", "Launch", "make_engine", "speaking_as",
]  # fmt: skip
