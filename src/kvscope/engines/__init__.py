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


__all__ = ["ENGINES", "Capabilities", "Endpoints", "Engine", "Launch", "make_engine"]
