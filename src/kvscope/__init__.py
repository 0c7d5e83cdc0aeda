"""kvscope: per-agent prefix KV cache profiling for multi-agent LLM workflows."""

__version__ = "0.1.0"
