"""A dataclass record as plain JSON values: standard library only, so that the records a probe
writes in an app's own interpreter (probe/lite.py: tool runs, invocation errors) need nothing of
kvscope's dependencies there. records.base writes and reads the streams with orjson and pyarrow.
"""

from collections.abc import Mapping
from dataclasses import asdict, is_dataclass
from typing import Any


def record_dict(record: Any) -> dict[str, Any]:
    """A dataclass record as plain JSON-ready values (tuples become lists)."""
    assert is_dataclass(record) and not isinstance(record, type)
    return _plain(asdict(record))


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
