"""JSON as the probe reads request bodies and reply events: orjson where the interpreter has it,
the json module where orjson refuses (NaN, Infinity) or is not installed (an app's own
interpreter: probe/lite.py). A ValueError (json.JSONDecodeError) for what neither reads."""

import json
from typing import Any

try:
    import orjson

    def loads(data: bytes | str) -> Any:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            return json.loads(data)

except ImportError:  # pragma: no cover - kvscope's own environment has orjson
    loads = json.loads
