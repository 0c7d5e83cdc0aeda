"""JSON as MLflow writes a span's values and as its store keeps a span, made faster for
trace_build.py's bulk traces: the same text as `json.dumps` (tests/unit/test_trace_build.py
checks it against MLflow's own)."""

import json
import math
from collections.abc import Callable
from functools import partial
from typing import Any

encode_str = json.encoder.encode_basestring  # type: ignore[attr-defined]  # ensure_ascii=False


def _dumper(ensure_ascii: bool) -> Callable[[Any], str]:
    """`json.dumps(value, ensure_ascii=ensure_ascii)` for kvscope's values, its C encoder made
    once (json.dumps makes a JSONEncoder and a C encoder per call: a fifth of a trace's build
    went to that), without the check for cycles (the values come from JSON and table rows)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # an interpreter without the C accelerator
        return partial(json.dumps, ensure_ascii=ensure_ascii)
    escape = json.encoder.encode_basestring_ascii if ensure_ascii else encode_str  # type: ignore[attr-defined]
    encode = make(None, json.JSONEncoder().default, escape, None, ": ", ", ", False, False, True)
    return lambda value: "".join(encode(value, 0))


dumps, dumps_ascii = _dumper(False), _dumper(True)


def dump_value(value: Any) -> str:
    """mlflow.tracing.utils.dump_span_attribute_value (JSON, non-ASCII kept) for kvscope's
    values, the common types without json.dumps' per-call cost."""
    kind = type(value)
    if kind is str:
        return encode_str(value)
    if kind is int:
        return int.__repr__(value)
    if kind is float and math.isfinite(value):
        return float.__repr__(value)
    return dumps(value)
