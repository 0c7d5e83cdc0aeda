"""kvscope: per-agent prefix KV cache profiling for multi-agent LLM workflows."""

from kvscope.probe.labels import agent, annotate

__all__ = ["agent", "annotate"]
__version__ = "0.1.0"
