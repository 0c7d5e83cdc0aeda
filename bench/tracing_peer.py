"""A tracing SDK beside kvscope in bench/load.py: OpenInference's LangChain and OpenAI
instrumentations (what Arize Phoenix installs) on OpenTelemetry's SDK, spans exported by the
BatchSpanProcessor (a queue on the app's thread, export on its own) as JSON lines to a file.

It does the same job on the same app: one span per graph node and per LLM call, with the
messages and the reply (kvscope's rows and payloads). Installed for the bench only:

    .venv/bin/pip install openinference-instrumentation-langchain \
        openinference-instrumentation-openai
"""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

NAME = "OpenInference + OTel batch"


def available() -> str | None:
    """None where the instrumentations import, else the pip line that installs them."""
    try:
        import openinference.instrumentation.langchain
        import openinference.instrumentation.openai  # noqa: F401
    except ImportError:
        return (
            "pip install openinference-instrumentation-langchain "
            "openinference-instrumentation-openai"
        )
    return None


@contextmanager
def traced(out: Path) -> Iterator[None]:
    """The app traced while inside: spans of LangChain runs and OpenAI calls to `out`."""
    from openinference.instrumentation.langchain import LangChainInstrumentor
    from openinference.instrumentation.openai import OpenAIInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    with out.open("w") as file:
        provider = TracerProvider()
        exporter = ConsoleSpanExporter(out=file, formatter=_line)
        provider.add_span_processor(BatchSpanProcessor(exporter))
        instrumentors: list[Any] = [LangChainInstrumentor(), OpenAIInstrumentor()]
        for inst in instrumentors:
            inst.instrument(tracer_provider=provider)
        try:
            yield
        finally:
            for inst in instrumentors:
                inst.uninstrument()
            provider.shutdown()  # exports what is queued


def spans_written(out: Path) -> int:
    with out.open() as file:
        return sum(1 for _ in file)


def _line(span: Any) -> str:
    return span.to_json(indent=None) + "\n"


__all__ = ["available", "spans_written", "traced"]
